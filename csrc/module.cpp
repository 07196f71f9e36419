// Schemas of every linrec op, and the Python module that loads them.
#include <Python.h>
#include <torch/library.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "common/host_pool.h"
#include "linrec/cuda/configs.h"
#include "linrec/tuned.h"

namespace {

// _C.scan_cuda_configs(elem_size) -> list[str]: the names of every compiled CUDA scan config
// for elements of that size (4 or 2 bytes), in table order. Torch-free, so it answers on CPU-only
// builds too; which of them apply to a problem on a device is the planner's call (plan.h).
PyObject* scan_cuda_configs(PyObject*, PyObject* arg) {
  const long elem_size = PyLong_AsLong(arg);
  if (elem_size == -1 && PyErr_Occurred()) return nullptr;
  if (elem_size != 2 && elem_size != 4) {
    PyErr_SetString(PyExc_ValueError, "scan_cuda_configs: elem_size must be 2 or 4");
    return nullptr;
  }
  using linrec::ScanKind;
  PyObject* out = PyList_New(0);
  if (!out) return nullptr;
  for (ScanKind kind : linrec::kAllKinds)
    for (int i = 0; i < linrec::num_configs(kind); ++i) {
      PyObject* name = PyUnicode_FromString(linrec::config_name(kind, static_cast<int>(elem_size), i));
      if (!name || PyList_Append(out, name) != 0) {
        Py_XDECREF(name);
        Py_DECREF(out);
        return nullptr;
      }
      Py_DECREF(name);
    }
  return out;
}

// Reads a sequence of ints (limited API only, as the module is built for it).
bool int_list(PyObject* seq, std::vector<int64_t>* out) {
  const Py_ssize_t n = PySequence_Size(seq);
  if (n < 0) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_GetItem(seq, i);
    if (!item) return false;
    const long long v = PyLong_AsLongLong(item);
    Py_DECREF(item);
    if (v == -1 && PyErr_Occurred()) return false;
    out->push_back(v);
  }
  return true;
}

bool utf8(PyObject* str, std::string* out) {
  PyObject* bytes = PyUnicode_AsUTF8String(str);
  if (!bytes) return false;
  out->assign(PyBytes_AsString(bytes));
  Py_DECREF(bytes);
  return true;
}

// _C.scan_bucket_key(op, direction, dtype, layout, length, rows) -> str (tuned.h).
PyObject* scan_bucket_key(PyObject*, PyObject* args) {
  const char *op, *direction, *dtype, *layout;
  long long length, rows;
  if (!PyArg_ParseTuple(args, "ssssLL", &op, &direction, &dtype, &layout, &length, &rows)) return nullptr;
  return PyUnicode_FromString(linrec::bucket_key(op, direction, dtype, layout, length, rows).c_str());
}

// _C.scan_layout_class(sizes, strides, dim, bcast_coeffs) -> str (tuned.h).
PyObject* scan_layout_class(PyObject*, PyObject* args) {
  PyObject *sizes_obj, *strides_obj;
  long long dim;
  int bcast;
  if (!PyArg_ParseTuple(args, "OOLp", &sizes_obj, &strides_obj, &dim, &bcast)) return nullptr;
  std::vector<int64_t> sizes, strides;
  if (!int_list(sizes_obj, &sizes) || !int_list(strides_obj, &strides)) return nullptr;
  if (sizes.size() != strides.size() || dim < 0 || dim >= static_cast<long long>(sizes.size())) {
    PyErr_SetString(PyExc_ValueError, "scan_layout_class: sizes and strides must have one entry per dim, dim in range");
    return nullptr;
  }
  return PyUnicode_FromString(linrec::scan_layout_class(sizes, strides, dim, bcast != 0).c_str());
}

// _C.scan_tuned_config(device, key, length, reverse, initial=False) -> str or None: what config
// "auto" runs (tuned.h).
PyObject* scan_tuned_config(PyObject*, PyObject* args) {
  int device;
  const char* key;
  long long length;
  int reverse, initial = 0;
  if (!PyArg_ParseTuple(args, "isLp|p", &device, &key, &length, &reverse, &initial)) return nullptr;
  const auto name = linrec::tuned_config(device, key, length, reverse != 0, initial != 0);
  if (!name) Py_RETURN_NONE;
  return PyUnicode_FromString(name->c_str());
}

// _C.set_scan_tuned(device, {bucket key: config name}): the table config "auto" reads on that device.
PyObject* set_scan_tuned(PyObject*, PyObject* args) {
  int device;
  PyObject* dict;
  if (!PyArg_ParseTuple(args, "iO!", &device, &PyDict_Type, &dict)) return nullptr;
  std::unordered_map<std::string, std::string> entries;
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(dict, &pos, &key, &value)) {
    std::string k, v;
    if (!utf8(key, &k) || !utf8(value, &v)) return nullptr;
    entries.emplace(std::move(k), std::move(v));
  }
  linrec::set_tuned_configs(device, std::move(entries));
  Py_RETURN_NONE;
}

PyObject* clear_scan_tuned(PyObject*, PyObject*) {
  linrec::clear_tuned_configs();
  Py_RETURN_NONE;
}

// _C.host_pool_stats() -> (hits, misses, idle_bytes, limit_bytes) (common/host_pool.h).
PyObject* host_pool_stats(PyObject*, PyObject*) {
  const linrec::HostPoolStats s = linrec::host_pool_stats();
  return Py_BuildValue("(LLLL)", static_cast<long long>(s.hits), static_cast<long long>(s.misses),
                       static_cast<long long>(s.idle_bytes), static_cast<long long>(s.limit_bytes));
}

// _C.set_host_pool_limit(bytes): the most idle bytes the host pool keeps (0: none).
PyObject* set_host_pool_limit(PyObject*, PyObject* arg) {
  const long long bytes = PyLong_AsLongLong(arg);
  if (bytes == -1 && PyErr_Occurred()) return nullptr;
  if (bytes < 0) {
    PyErr_SetString(PyExc_ValueError, "set_host_pool_limit: bytes must be >= 0");
    return nullptr;
  }
  linrec::set_host_pool_limit(bytes);
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"scan_cuda_configs", scan_cuda_configs, METH_O, "Names of the compiled CUDA scan configs for an element size."},
    {"scan_bucket_key", scan_bucket_key, METH_VARARGS, "The tuned cache's key of a scan problem."},
    {"scan_layout_class", scan_layout_class, METH_VARARGS, "The layout class of a scan problem."},
    {"scan_tuned_config", scan_tuned_config, METH_VARARGS, "The config \"auto\" runs for a bucket key, length and direction."},
    {"set_scan_tuned", set_scan_tuned, METH_VARARGS, "Sets the tuned configs that config 'auto' reads on a device."},
    {"clear_scan_tuned", clear_scan_tuned, METH_NOARGS, "Forgets every device's tuned configs."},
    {"host_pool_stats", host_pool_stats, METH_NOARGS, "Counts of the host pool of the CPU backward's outputs."},
    {"set_host_pool_limit", set_host_pool_limit, METH_O, "Sets the most idle bytes the host pool keeps."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

extern "C" {
// `import torch_linrec._C` loads this library and so registers the ops.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(linrec, m) {
  // y[l] = coeffs[l] * y[l-1] + x[l] along `dim`, with y[-1] = initial (zero when None);
  // reverse=True runs from the end towards the start. coeffs broadcasts against x, initial
  // against x's shape without `dim`. `config` names the kernel config (None: the device's
  // default; "auto": the tuned cache's choice on the device, csrc/linrec/tuned.h); `backward_config`
  // is the config autograd passes to the backward op (a "triton." name runs
  // linrec::scan_backward_triton).
  m.def(
      "scan(Tensor x, Tensor coeffs, Tensor? initial=None, int dim=-1, bool reverse=False, str? config=None, "
      "str? backward_config=None) -> Tensor");
  // Vector-Jacobian product of scan: (grad_x, grad_coeffs, grad_initial), grad_coeffs reduced
  // to the shape of coeffs, grad_initial of x's shape without `dim`.
  m.def(
      "scan_backward(Tensor grad_y, Tensor coeffs, Tensor y, Tensor? initial, int dim, bool reverse, "
      "str? config=None) -> (Tensor, Tensor, Tensor)");

  // Mamba's selective scan (torch_linrec/selective/reference.py has the math): u, delta, z
  // (B, D, L); A (D, N); B, C (D, N), (B, N, L) or (B, G, N, L); D, delta_bias (D,);
  // initial_state (B, D, N). Returns (out (B, D, L) in u's dtype, last_state (B, D, N) float32).
  m.def(
      "selective_scan(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D=None, Tensor? z=None, "
      "Tensor? delta_bias=None, bool delta_softplus=False, Tensor? initial_state=None) -> (Tensor, Tensor)");
  // Vector-Jacobian product of selective_scan: (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias,
  // dinitial_state), each of its input's shape; the gradient of an absent optional input is an
  // empty tensor.
  // checkpoints: the states _selective_scan_train saved (None: the backward recomputes them).
  m.def(
      "selective_scan_backward(Tensor grad_out, Tensor? grad_last_state, Tensor u, Tensor delta, Tensor A, "
      "Tensor B, Tensor C, Tensor? D, Tensor? z, Tensor? delta_bias, bool delta_softplus, Tensor? initial_state, "
      "Tensor? checkpoints=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  // selective_scan as training runs it (torch_linrec.selective_scan when a gradient is needed): the
  // same (out, last_state), and the states the CUDA kernel saves at chunk boundaries for the
  // backward (float32, flat; empty where another implementation runs).
  m.def(
      "_selective_scan_train(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D=None, Tensor? z=None, "
      "Tensor? delta_bias=None, bool delta_softplus=False, Tensor? initial_state=None) -> (Tensor, Tensor, Tensor)");
  // The kernels behind them (csrc/selective/cpu, csrc/selective/cuda), called by the ops' C++ host
  // path (csrc/selective/ops.cpp) after its argument test, with A, D, delta_bias, initial_state
  // contiguous in the compute dtype. CPU: B, C (D, N) or
  // (B, G, N, L) in u's dtype; CUDA: (B, G, N, L) in u's dtype or float32. states_per_thread is a
  // launch hint of the CUDA forward kernel (0: its default; 4, 8 or 16), ignored on CPU and by the
  // backward (its checkpoint pass takes the default). save_checkpoints: the CUDA forward also returns
  // the states after every chunk but the last, (B, D, chunks, N_pad) float32 flattened, which
  // _selective_scan_bwd takes as `checkpoints` instead of recomputing them; empty elsewhere.
  m.def(
      "_selective_scan_fwd(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, "
      "Tensor? delta_bias, bool delta_softplus, Tensor? initial_state, int states_per_thread=0, "
      "bool save_checkpoints=False) -> (Tensor, Tensor, Tensor)");
  m.def(
      "_selective_scan_bwd(Tensor grad_out, Tensor? grad_last_state, Tensor u, Tensor delta, Tensor A, "
      "Tensor B, Tensor C, Tensor? D, Tensor? z, Tensor? delta_bias, bool delta_softplus, Tensor? initial_state, "
      "int states_per_thread=0, Tensor? checkpoints=None) -> Tensor[]");

  // The ops' Python implementation (torch_linrec/selective/ops.py), for the calls the C++ host path
  // does not take: the argument checks with their ValueErrors, and the Triton kernels.
  m.def(
      "_selective_scan_python(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, "
      "Tensor? delta_bias, bool delta_softplus, Tensor? initial_state, bool save_checkpoints) -> "
      "(Tensor, Tensor, Tensor)");
  m.def(
      "_selective_scan_backward_python(Tensor grad_out, Tensor? grad_last_state, Tensor u, Tensor delta, Tensor A, "
      "Tensor B, Tensor C, Tensor? D, Tensor? z, Tensor? delta_bias, bool delta_softplus, Tensor? initial_state, "
      "Tensor? checkpoints) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");

  // ---- Log-space scan (csrc/logscan, torch_linrec/logscan) ----
  // log_h[l] = logaddexp(log_coeffs[l] + log_h[l-1], log_x[l]) along `dim`, log_h[-1] = initial (a log
  // state; -inf when None); reverse=True runs from the end. log_coeffs broadcasts against log_x,
  // initial against log_x's shape without `dim`; -inf (log 0) is exact. Its autograd composes
  // linrec::scan (torch_linrec/logscan/ops.py), so it needs no backward op.
  m.def("log_scan(Tensor log_x, Tensor log_coeffs, Tensor? initial=None, int dim=-1, bool reverse=False) -> Tensor");
}
