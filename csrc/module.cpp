// Schemas of every linrec op, and the Python module that loads them.
#include <Python.h>
#include <torch/library.h>

extern "C" {
// `import torch_linrec._C` loads this library and so registers the ops; the module is empty.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(linrec, m) {
  // y[l] = coeffs[l] * y[l-1] + x[l] along `dim`, with y[-1] = initial (zero when None);
  // reverse=True runs from the end towards the start. coeffs broadcasts against x,
  // initial against x's shape without `dim`.
  m.def("scan(Tensor x, Tensor coeffs, Tensor? initial=None, int dim=-1, bool reverse=False) -> Tensor");
  // Vector-Jacobian product of scan: (grad_x, grad_coeffs, grad_initial), grad_coeffs reduced
  // to the shape of coeffs, grad_initial of x's shape without `dim`.
  m.def(
      "scan_backward(Tensor grad_y, Tensor coeffs, Tensor y, Tensor? initial, int dim, bool reverse)"
      " -> (Tensor, Tensor, Tensor)");
}
