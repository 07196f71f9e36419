// CUDA registration of linrec::scan and linrec::scan_backward: resolves the config name, plans the
// launch from the device's properties, takes the look-back workspace (kept per stream, or fresh from
// PyTorch's caching allocator) and calls the kernels on the current stream.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "../../common/errors.h"
#include "../ops.h"
#include "launch.h"
#include "plan_segments.h"

namespace linrec {
namespace {

template <bool kBackward>
cudaError_t launch_dtype(at::ScalarType dtype, const ScanParams& p, const ScanPlan& plan, const LookbackWorkspace& ws,
                         cudaStream_t stream) {
  switch (dtype) {
    case at::kFloat:
      return launch_scan<ScanDType::kFloat32, kBackward>(p, plan, ws, stream);
    case at::kHalf:
      return launch_scan<ScanDType::kFloat16, kBackward>(p, plan, ws, stream);
    case at::kBFloat16:
      return launch_scan<ScanDType::kBFloat16, kBackward>(p, plan, ws, stream);
    default:
      TORCH_CHECK_VALUE(false, "linrec.scan: the CUDA kernels take float32, float16 or bfloat16, got ", dt(dtype));
  }
}

// Peak DRAM bandwidth per SM in GB/s (0: unknown), queried once per device (the memory clock is
// not in cudaDeviceProp since CUDA 13).
float dram_gbps_per_sm(c10::DeviceIndex index, int num_sms) {
  static std::array<std::atomic<float>, 256> known{};  // -1: queried, unknown
  if (index < 0 || index >= static_cast<int>(known.size()) || num_sms <= 0) return 0.f;
  float v = known[index].load(std::memory_order_relaxed);
  if (v == 0.f) {
    int khz = 0, bits = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, index) == cudaSuccess &&
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, index) == cudaSuccess && khz > 0 && bits > 0) {
      v = static_cast<float>(2.0 * khz * 1e3 * (bits / 8) / 1e9 / num_sms);  // double data rate
    } else {
      (void)cudaGetLastError();
      v = -1.f;
    }
    known[index].store(v, std::memory_order_relaxed);
  }
  return v > 0.f ? v : 0.f;
}

DeviceInfo device_info(c10::DeviceIndex index) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(index);  // cached by torch per device
  return DeviceInfo{prop->multiProcessorCount, prop->major, prop->sharedMemPerBlockOptin,
                    dram_gbps_per_sm(index, prop->multiProcessorCount)};
}

std::string all_config_names(int elem_size) {
  std::string out;
  for (ScanKind kind : kAllKinds)
    for (int i = 0; i < num_configs(kind); ++i) out += (out.empty() ? "" : ", ") + std::string(config_name(kind, elem_size, i));
  return out;
}

// The request a config name makes (index -1 for None); ValueError for a name not in the tables.
ConfigRequest parse_config(const OptConfig& config, int elem_size) {
  ConfigRequest req;
  if (!config.has_value()) return req;
  const std::string name = strip_prefer(*config, &req.prefer, &req.tuned);
  if (name == kNativeDefault) return ConfigRequest{};
  for (ScanKind kind : kAllKinds)
    for (int i = 0; i < num_configs(kind); ++i)
      if (name == config_name(kind, elem_size, i)) {
        req.kind = kind;
        req.index = i;
        return req;
      }
  TORCH_CHECK_VALUE(req.prefer, "linrec.scan: unknown CUDA config '", name, "' for ", num(elem_size),
                    "-byte elements; valid: ", kNativeDefault, " (the default), ", all_config_names(elem_size));
  return ConfigRequest{};
}

// Look-back workspaces kept between calls, one per (device, stream). A small call's host time
// went mostly to allocating and zeroing its workspace (bench/NOTES.md item 42), and a large one's
// device time pays the zeroing kernel and its launch gap. A kept buffer has two halves: launches on
// one stream run in order, so each takes the half its predecessor left zero and its kernel zeroes
// the other (launch.h). A half starts at kMinKeptBytes and grows (to the next power of two, as a
// fresh zeroed buffer) up to kMaxKeptBytes. Larger workspaces, launches captured into a CUDA graph
// (whose replays would find their half used), the per-thread default stream (one handle for another
// stream in each host thread: one key for launches in no order) and (device, stream) pairs past the
// first kMaxKeptStreams take a fresh workspace each call, zeroed before the launch.
constexpr size_t kMinKeptBytes = size_t{1} << 19;  // 32767 look-back entries
constexpr size_t kMaxKeptBytes = size_t{1} << 21;  // 131071 entries, e.g. 511 rows of 2^20 float32 ring tiles
constexpr size_t kMaxKeptStreams = 64;

struct KeptWorkspace {
  std::mutex mutex;  // held from taking a half to the launch
  at::Tensor memory;  // 2 x half_bytes
  size_t half_bytes = 0;
  int zero_half = 0;  // the half that is all zero
  size_t dirty_bytes = 0;  // of the other half, from its offset 0
};

KeptWorkspace* kept_workspace(const ScanPlan& plan, const c10::cuda::CUDAStream& stream) {
  if (plan.workspace_bytes > kMaxKeptBytes || stream.stream() == cudaStreamPerThread) return nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream.stream(), &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone)
    return nullptr;
  static std::mutex map_mutex;
  // Never destroyed: their CUDA memory must not be freed after the runtime shuts down at exit.
  static auto* kept = new std::map<std::pair<int, c10::StreamId>, std::unique_ptr<KeptWorkspace>>();
  const std::lock_guard<std::mutex> lock(map_mutex);
  const auto key = std::make_pair(static_cast<int>(stream.device_index()), stream.id());
  auto it = kept->find(key);
  if (it == kept->end()) {
    if (kept->size() >= kMaxKeptStreams) return nullptr;
    it = kept->emplace(key, std::make_unique<KeptWorkspace>()).first;
  }
  return it->second.get();
}

void launch_cuda(const ScanParams& p, at::ScalarType dtype, const at::Device& device, const OptConfig& config) {
  const c10::cuda::CUDAGuard guard(device);
  const int elem_size = static_cast<int>(c10::elementSize(dtype));
  const DeviceInfo dev = device_info(device.index());
  const ConfigRequest req = parse_config(config, elem_size);
  bool inapplicable = false;
  // Many short rows run as sequences of several rows each (plan_segments.h segment_rows), unless a
  // config is named (the tuned cache names none for them, tuned.h).
  const int64_t group = req.index < 0 ? segment_rows(p, elem_size, dev) : 1;
  const ScanParams q = group > 1 ? segment_params(p, group, elem_size) : p;
  const ScanPlan plan = group > 1 ? plan_segments(q, elem_size, dev) : plan_scan(p, elem_size, dev, req, &inapplicable);
  TORCH_CHECK_VALUE(!inapplicable, "linrec.scan: config '", config_name(req.kind, elem_size, req.index),
                    "' does not apply to this ", p.backward ? "backward" : "forward", " problem (",
                    num(p.num_seq), " sequences of length ", num(p.len), ", ",
                    is_channel_layout(p) ? "scanned dim not innermost" : "scanned dim innermost",
                    ") on this device; valid here: ", applicable_config_names(p, elem_size, dev));
  TORCH_CHECK_VALUE(plan.grid <= std::numeric_limits<int32_t>::max(), "linrec.scan: ", num(p.num_seq),
                    " sequences of length ", num(p.len), " need ", num(plan.grid), " blocks, more than a CUDA grid holds");
  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  const auto launch = [&](const LookbackWorkspace& ws) {
    return q.backward ? launch_dtype<true>(dtype, q, plan, ws, stream) : launch_dtype<false>(dtype, q, plan, ws, stream);
  };
  cudaError_t err;
  if (plan.workspace_bytes == 0 || plan.grid == 0) {
    err = launch(LookbackWorkspace{});
  } else if (KeptWorkspace* kept = kept_workspace(plan, stream)) {
    const std::lock_guard<std::mutex> lock(kept->mutex);
    if (!kept->memory.defined() || kept->half_bytes < plan.workspace_bytes) {
      // The old buffer, if any, goes back to the caching allocator in this stream's order.
      size_t half = kMinKeptBytes;
      while (half < plan.workspace_bytes) half *= 2;
      kept->memory = at::zeros({2 * static_cast<int64_t>(half)}, at::TensorOptions().dtype(at::kByte).device(device));
      kept->half_bytes = half;
      kept->zero_half = 0;
      kept->dirty_bytes = 0;
    }
    char* const halves = static_cast<char*>(kept->memory.data_ptr());
    const size_t half = kept->half_bytes;
    const int use = kept->zero_half;
    err = launch(LookbackWorkspace{halves + use * half, false, halves + (1 - use) * half, kept->dirty_bytes});
    kept->zero_half = 1 - use;
    kept->dirty_bytes = plan.workspace_bytes;
    if (err != cudaSuccess) kept->memory = at::Tensor();  // which parts are zero is unknown
  } else {
    const at::Tensor workspace =
        at::empty({static_cast<int64_t>(plan.workspace_bytes)}, at::TensorOptions().dtype(at::kByte).device(device));
    err = launch(LookbackWorkspace{workspace.data_ptr(), true});
  }
  TORCH_CHECK(err == cudaSuccess, "linrec.scan: CUDA launch failed: ", cudaGetErrorString(err));
}

}  // namespace

TORCH_LIBRARY_IMPL(linrec, CUDA, m) { impl_scan_ops<launch_cuda>(m); }

}  // namespace linrec
