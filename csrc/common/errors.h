// Pieces of error messages, formatted without std::ostream's numeric facets: on the H100 image
// (torch 2.11 wheel, extension built by gcc 13) streaming an integer into TORCH_CHECK's message
// crashed the process, while strings streamed fine. User errors use TORCH_CHECK_VALUE, which
// Python sees as ValueError, like the Python-side checks.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

namespace linrec {

inline std::string num(int64_t v) { return std::to_string(v); }
inline std::string shape(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}
inline std::string dev(const at::Device& d) { return d.str(); }
inline const char* dt(at::ScalarType t) { return c10::toString(t); }

}  // namespace linrec
