// The tuned config cache on the C++ side: the table of one device that config "auto" reads.
//
// torch_linrec/configs reads the per-GPU JSON files and hands each device's entries to
// set_tuned_configs (through _C.set_scan_tuned); the ops resolve "auto" here at run time, so a
// call pays no Python for the lookup and compiled graphs (which hold "auto", not a size-dependent
// choice) follow the cache too. The bucket key is defined here once; Python reads it through
// _C.scan_bucket_key / _C.scan_layout_class (the tuner writes the keys this code looks up).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace linrec {

// The config name that asks for the tuned cache's choice (the backend's default where none).
constexpr const char* kAutoConfig = "auto";

// "innermost" (the scanned dim has the smallest stride among dims of size > 1, or there are no
// others) or "strided" (e.g. (B, L, D) with dim=1), with "-bcast" when coeffs broadcast.
std::string scan_layout_class(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, int64_t dim,
                              bool bcast_coeffs);

// "<op>/<direction>/<dtype>/<layout>/L<=2^a/R<=2^b": length and rows (number of sequences)
// rounded up to even powers of two, the length bucket at least 2^8.
std::string bucket_key(const std::string& op, const std::string& direction, const std::string& dtype,
                       const std::string& layout, int64_t length, int64_t rows);

// The table key of the CPU (CUDA devices are keyed by their index). No CPU file is shipped: the
// CPU has one kernel; tests use the table to reach the Triton ops through "auto".
constexpr int kCpuTable = -1;

// Replaces the table of CUDA device `device` (kCpuTable: the CPU) (bucket key -> config name); thread-safe.
void set_tuned_configs(int device, std::unordered_map<std::string, std::string> entries);
// Forgets every device's table.
void clear_tuned_configs();
// A Triton choice applies only to lengths that are multiples of this: the buckets are tuned at
// power-of-two lengths, and off them the Triton kernels lose their vector accesses and pad whole
// tiles (H100: 100000 x 1000 backward 0.68 of torch.add vs 0.98 native, 3 x 2049 x 3072 0.40 vs
// 0.67; bench/NOTES.md item 28).
constexpr int64_t kTritonLengthMultiple = 16;

// A CUDA device's tuned choices do not apply to innermost rows of at most this many steps without
// `initial`: the native default runs them as sequences of several rows (cuda/plan_segments.h
// segment_rows), ahead of the picks the tuner made on the longer rows of their buckets (H200
// forward: float32 131072 x 512 0.99 of torch.add against triton.t2048's 0.92, bf16 262144 x 384
// 0.94 against triton.t1024's 0.77; item 78).
constexpr int64_t kSegmentedRowMax = 512;

// The config for `key` on `device` (-1: the CPU's table) for a call of this scan length and
// direction, with or without `initial`, or nullopt (no table, no entry, or an entry that does not
// apply to the call). A Triton choice applies to reverse=False calls only: the tuner times those,
// and Triton's speed depends on the walk's direction (tl.associative_scan with reverse=True; H200
// 131072 x 1024 float32, reverse=True: triton.t2048 0.75 of torch.add forward against 0.99 native,
// bench/NOTES.md item 78), where the native kernels address either direction alike.
std::optional<std::string> tuned_config(int device, const std::string& key, int64_t length, bool reverse,
                                        bool initial = false);

}  // namespace linrec
