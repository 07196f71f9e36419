#include "tuned.h"

#include "ops.h"  // is_triton_config

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>

namespace linrec {
namespace {

using Table = std::unordered_map<std::string, std::string>;

std::mutex& tables_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<int, std::shared_ptr<const Table>>& tables() {
  static std::unordered_map<int, std::shared_ptr<const Table>> t;
  return t;
}

// The even exponent k >= floor with 2^(k-2) < n <= 2^k.
int pow4_bucket(int64_t n, int floor) {
  uint64_t m = static_cast<uint64_t>(std::max<int64_t>(n, 1) - 1);
  int k = 0;
  while (m > 0) {
    ++k;
    m >>= 1;
  }
  k = std::max(k, floor);
  return k + (k % 2);
}

}  // namespace

std::string scan_layout_class(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, int64_t dim,
                              bool bcast_coeffs) {
  bool any = false;
  int64_t min_other = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (static_cast<int64_t>(i) == dim || sizes[i] == 1) continue;
    const int64_t s = std::llabs(strides[i]);
    min_other = any ? std::min(min_other, s) : s;
    any = true;
  }
  const bool strided = any && std::llabs(strides[dim]) > min_other;
  return std::string(strided ? "strided" : "innermost") + (bcast_coeffs ? "-bcast" : "");
}

std::string bucket_key(const std::string& op, const std::string& direction, const std::string& dtype,
                       const std::string& layout, int64_t length, int64_t rows) {
  return op + "/" + direction + "/" + dtype + "/" + layout + "/L<=2^" + std::to_string(pow4_bucket(length, 8)) +
         "/R<=2^" + std::to_string(pow4_bucket(rows, 0));
}

void set_tuned_configs(int device, Table entries) {
  auto table = std::make_shared<const Table>(std::move(entries));
  const std::lock_guard<std::mutex> lock(tables_mutex());
  tables()[device] = std::move(table);
}

void clear_tuned_configs() {
  const std::lock_guard<std::mutex> lock(tables_mutex());
  tables().clear();
}

std::optional<std::string> tuned_config(int device, const std::string& key, int64_t length, bool reverse,
                                        bool initial) {
  std::shared_ptr<const Table> table;
  {
    const std::lock_guard<std::mutex> lock(tables_mutex());
    const auto it = tables().find(device);
    if (it == tables().end()) return std::nullopt;
    table = it->second;
  }
  const auto hit = table->find(key);
  if (hit == table->end()) return std::nullopt;
  const bool segmented =
      device >= 0 && length <= kSegmentedRowMax && !initial && key.find("/innermost/") != std::string::npos;
  if (segmented) return std::nullopt;
  if (is_triton_config(hit->second) && (reverse || length % kTritonLengthMultiple != 0)) return std::nullopt;
  return hit->second;
}

}  // namespace linrec
