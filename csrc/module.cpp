// Schemas of every linrec op, and the Python module that loads them.
#include <Python.h>
#include <torch/library.h>

#include "linrec/cuda/configs.h"

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
  for (ScanKind kind : {ScanKind::kTile, ScanKind::kStream, ScanKind::kChannel})
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

PyMethodDef methods[] = {
    {"scan_cuda_configs", scan_cuda_configs, METH_O, "Names of the compiled CUDA scan configs for an element size."},
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
  // default); `backward_config` is the config autograd passes to the backward op (a "triton."
  // name runs linrec::scan_backward_triton).
  m.def(
      "scan(Tensor x, Tensor coeffs, Tensor? initial=None, int dim=-1, bool reverse=False, str? config=None, "
      "str? backward_config=None) -> Tensor");
  // Vector-Jacobian product of scan: (grad_x, grad_coeffs, grad_initial), grad_coeffs reduced
  // to the shape of coeffs, grad_initial of x's shape without `dim`.
  m.def(
      "scan_backward(Tensor grad_y, Tensor coeffs, Tensor y, Tensor? initial, int dim, bool reverse, "
      "str? config=None) -> (Tensor, Tensor, Tensor)");
}
