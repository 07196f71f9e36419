"""The linear recurrence op family: ``linrec::scan`` and ``linrec::scan_backward`` (C++, csrc/linrec),
their Triton twins, and what sits between them and the public :func:`torch_linrec.scan`.

Modules, kernel side first: :mod:`.triton` (Triton kernels and ops), :mod:`.layout` (strided
layouts), :mod:`.checks` (argument checks and their messages), :mod:`.ops` (fake kernels and
autograd), :mod:`.configs` (config names of every backend), :mod:`.reference` (float64 references).
"""
