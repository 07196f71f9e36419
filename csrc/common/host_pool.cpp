// Host pool: recycled host memory for the outputs of the CPU kernels (linrec::scan's y,
// linrec::scan_backward's grad_x and grad_coeffs, linrec::log_scan's output).
//
// Why: glibc malloc serves blocks of up to 32 MiB (its largest dynamic mmap threshold) from its heap
// and gives the top of the heap back to the system whenever the free space there exceeds its trim
// threshold (twice the largest block it has mapped and unmapped). A forward+backward call frees
// three blocks of x's size (y and the two gradients) where torch.add frees one, so after some calls,
// depending on the heap's history, a free trims the heap and the next calls page-fault their
// outputs back in: 2-3 us per 4 KiB page on the project's 2-core CPU machine, as long as the
// backward's kernel itself, on a third to all of the calls (bench/NOTES.md item 22); the forward's
// y the same: 1 x 2^22 float32 rows of 16-64 steps, one thread, 8-11 ms per call in some processes
// and 2-3 ms in others, 2.0-2.8 ms in every process with y pooled (item 78). A process-wide fix
// (mallopt, jemalloc) is the user's choice to make, not a library's; the pool keeps the ops' own
// blocks out of glibc instead: a freed output's block waits here, idle, for the next output of
// about its size (a training step needs the sizes of the previous step's).
//
// Bounds: at most `limit` idle bytes, the least recently freed released first; blocks of more than
// half the limit and of less than 128 KiB (glibc's default mmap threshold: they come and go in its
// bins) are released when freed. Default 256 MiB, so that a forward+backward's three outputs (y and
// the two gradients) stay pooled up to ~85 MiB each: with 64 MiB (the most glibc's own trim
// threshold lets its heap keep) blocks of 22-32 MiB missed the pool on some calls and blocks above
// 32 MiB on every call, which glibc maps anew (torch.add's output too), and an eager
// forward+backward of 32-64 MiB tensors ran 2.5-5x slower on the 2-core CPU machine (bench/NOTES.md
// item 83). The pool is a c10::Allocator, so a pooled tensor's storage is resizable like any CPU
// tensor's.
#include "host_pool.h"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/native/TensorFactories.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace linrec {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kMinBlock = size_t{128} << 10;
constexpr int64_t kDefaultLimit = int64_t{256} << 20;

void delete_block(void* data);

class HostPool final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* data = take((std::max<size_t>(n, 1) + kPage - 1) / kPage * kPage);
    return {data, data, &delete_block, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_block; }
  void copy_data(void* dest, const void* src, size_t count) const override { default_copy_data(dest, src, count); }

  // Whether a block of `bytes` would be kept when freed.
  bool keeps(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    return keeps_locked(bytes);
  }

  void give_back(void* data) {
    std::vector<void*> release;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = live_.find(data);
      TORCH_INTERNAL_ASSERT(it != live_.end(), "linrec host pool: freeing a block it did not allocate");
      const size_t bytes = it->second;
      live_.erase(it);
      if (keeps_locked(bytes)) {
        idle_.push_front({data, bytes});
        idle_bytes_ += bytes;
        evict_locked(&release);
      } else {
        release.push_back(data);
      }
    }
    for (void* p : release) c10::free_cpu(p);
  }

  HostPoolStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {hits_, misses_, static_cast<int64_t>(idle_bytes_), limit_};
  }

  void set_limit(int64_t bytes) {
    TORCH_CHECK_VALUE(bytes >= 0, "linrec host pool: the limit must be >= 0 bytes, got ", bytes);
    std::vector<void*> release;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limit_ = bytes;
      hits_ = misses_ = 0;
      evict_locked(&release);
    }
    for (void* p : release) c10::free_cpu(p);
  }

 private:
  struct Block {
    void* data;
    size_t bytes;
  };

  bool keeps_locked(size_t bytes) const { return bytes >= kMinBlock && bytes <= static_cast<size_t>(limit_) / 2; }

  // The smallest idle block that fits `bytes` and wastes at most an eighth of it, else a new one.
  void* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto best = idle_.end();
      for (auto it = idle_.begin(); it != idle_.end(); ++it)
        if (it->bytes >= bytes && it->bytes <= bytes + bytes / 8 && (best == idle_.end() || it->bytes < best->bytes))
          best = it;
      if (best != idle_.end()) {
        void* data = best->data;
        idle_bytes_ -= best->bytes;
        live_.emplace(data, best->bytes);
        idle_.erase(best);
        ++hits_;
        return data;
      }
      if (keeps_locked(bytes)) ++misses_;
    }
    void* data = c10::alloc_cpu(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    live_.emplace(data, bytes);
    return data;
  }

  // Moves the least recently freed idle blocks beyond the limit (and any the limit no longer keeps)
  // to `release`.
  void evict_locked(std::vector<void*>* release) {
    for (auto it = idle_.begin(); it != idle_.end();) {
      if (keeps_locked(it->bytes)) {
        ++it;
        continue;
      }
      idle_bytes_ -= it->bytes;
      release->push_back(it->data);
      it = idle_.erase(it);
    }
    while (idle_bytes_ > static_cast<size_t>(limit_)) {
      idle_bytes_ -= idle_.back().bytes;
      release->push_back(idle_.back().data);
      idle_.pop_back();
    }
  }

  std::mutex mutex_;
  std::unordered_map<void*, size_t> live_;  // the blocks in use, with their sizes
  std::list<Block> idle_;                   // most recently freed first
  size_t idle_bytes_ = 0;
  int64_t limit_ = kDefaultLimit;
  int64_t hits_ = 0, misses_ = 0;
};

// Never destroyed: a pooled tensor may be freed during the process's exit, after static destructors.
HostPool& pool() {
  static HostPool* const instance = new HostPool();
  return *instance;
}

void delete_block(void* data) { pool().give_back(data); }

}  // namespace

at::Tensor empty_like_pooled(const at::Tensor& like) {
  if (!like.is_cpu() || !like.is_non_overlapping_and_dense() ||
      !pool().keeps(static_cast<size_t>(like.numel()) * like.itemsize()))
    return at::empty_like(like);
  at::Tensor out = at::detail::empty_strided_generic(like.sizes(), like.strides(), &pool(),
                                                     c10::DispatchKeySet(c10::DispatchKey::CPU), like.scalar_type());
  if (at::globalContext().deterministicAlgorithms() && at::globalContext().deterministicFillUninitializedMemory())
    at::native::fill_empty_deterministic_(out);
  return out;
}

HostPoolStats host_pool_stats() { return pool().stats(); }

void set_host_pool_limit(int64_t bytes) { pool().set_limit(bytes); }

}  // namespace linrec
