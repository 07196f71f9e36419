"""``linrec::scan_triton`` and ``linrec::scan_backward_triton``: the Triton twins of the C++ ops.

Both are :func:`torch.library.triton_op` s, so ``torch.compile`` sees their kernels; they share
the fakes' allocation rules and the autograd of ``linrec::scan`` (torch_linrec/linrec/ops.py).

Layout: every operand is read in place as a strided ``(outer, L, inner)`` view. The batch dims
(all but ``dim``) are ordered innermost-first by the output's strides and merged where every
operand allows it, as csrc/scan_ops.cpp does; ``(N, L)``, ``(B, L, D)``, ``(B, H, L, D)``,
transposed, sliced and broadcast (stride-0) operands all fit in two batch axes. Layouts that need
three or more are run on contiguous copies (the one case that copies).
"""
import contextlib
import functools
import importlib
import math
import os
from typing import Optional

import torch
import triton
from triton.runtime.jit import JITFunction

from ..._library import document_op
from .. import ops as _ops
from ..checks import batch_shape, check_scan_args, check_scan_backward_args
from ..functorch import register_functorch
from ..layout import coalesce_batch_dims
from . import kernels
from .kernels import (linrec_bwd_chan_kernel, linrec_bwd_seq_kernel, linrec_bwd_seq_lb_kernel, linrec_fwd_chan_kernel,
                      linrec_fwd_seq_kernel, linrec_fwd_seq_lb_kernel)

__all__ = ["scan_triton", "scan_backward_triton", "CONFIGS", "DEFAULT_CONFIG", "config_names"]

# Launch heuristic (cf. flash-attention's tile_size.h), measured on an H100 with CUDA graphs over
# (N, L) and (B, L, D) shapes in float32 and bfloat16. Each loop iteration of a program moves one
# tile per operand; a config names that tile's size (TILE elements: 2048 = 8 KiB of fp32 at 4 warps
# keeps 16 elements per thread and operand and the backward's five streams spill-free).
#   sequence kernel: BLOCK_L = next_pow2(L) capped at TILE; short rows stack BLOCK_N = TILE // BLOCK_L
#     sequences per program. With fewer sequences than SMs, each program is a long serial walk
#     whose speed is the bytes it has in flight: BLOCK_L = LONG_TILE (1.7x faster there at 4096);
#     rows longer than LONG_TILE are cut into LONG_TILE tiles, one program each, chained by a
#     look-back (`_look_back`; H200 float32 16 x 2^22: 0.11 of torch.add walking; bench/NOTES.md
#     item 87).
#   channel kernel: BLOCK_D channels, the largest of 128, 64, 32 that still gives >= 4 programs
#     per SM (32 channels of fp32 = one 128-byte line per row); 16 when even 32 leaves SMs idle
#     (few channels, long L). BLOCK_T = TILE // BLOCK_D time steps, capped at next_pow2(L).
#   num_warps: one warp per 512 tile elements, within [1, 8].
# t8192 holds a whole 2-byte row of up to 8192 steps per program (8 warps, 32 elements per thread
# and operand): mid-length rows at a few per SM, where the one-program-per-row walk of 4096-step
# tiles had too few bytes in flight (bf16 600 x 8000 on the H200: 0.80 of torch.add against the
# native default's 0.65; bench/NOTES.md item 75).
# t4096.lookback: the sequence layout's rows always cut into tiles of up to 4096 steps, one program
# per tile, the tiles of a row chained by a decoupled look-back (kernels.py `_chain`), whatever the
# number of rows; the channel layout as t4096.
CONFIGS = {  # name -> (TILE, LONG_TILE[, LOOK_BACK]); the first is the default
    "triton.t2048": (2048, 4096),
    "triton.t1024": (1024, 2048),
    "triton.t4096": (4096, 4096),
    "triton.t8192": (8192, 8192),
    "triton.t4096.lookback": (4096, 4096, True),
}
DEFAULT_CONFIG = "triton.t2048"


def config_names() -> list[str]:
    """The named configs of the Triton scan ops, the default first."""
    return list(CONFIGS)


def _resolve_config(op: str, config: Optional[str]) -> tuple[int, int]:
    """``(TILE, LONG_TILE)`` of ``config`` (None or a "prefer:" name that is not a Triton config: the default).

    Raises:
        ValueError: for a name that is not one of :data:`CONFIGS`.
    """
    name = None if config is None else config.removeprefix(_ops.PREFER_PREFIX)
    if name is None or name == _ops.TRITON:
        return CONFIGS[DEFAULT_CONFIG]
    if name in CONFIGS:
        return CONFIGS[name]
    if config.startswith(_ops.PREFER_PREFIX):
        return CONFIGS[DEFAULT_CONFIG]
    raise ValueError(f"{op}: unknown Triton config {config!r}; valid: {', '.join(CONFIGS)}")


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    """SMs of a CUDA device (read once per device); 1 for the CPU interpreter."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _num_warps(tile: int) -> int:
    return max(1, min(8, tile // 512))


def _block_len(cap: int, length: int) -> int:
    """Steps per tile: the power of two covering ``length``, between 16 and ``cap``."""
    return max(16, min(cap, _next_pow2(length)))


def _seq_meta(n: int, length: int, tiles: tuple[int, int], num_sms: int) -> dict:
    """Meta-parameters of the sequence kernels for ``n`` sequences of length ``length``."""
    tile, long_tile = tiles[:2]
    cap = tile if n >= num_sms else long_tile
    block_l = _block_len(cap, length)
    block_n = max(1, min(_next_pow2(n), tile // block_l))
    return {"BLOCK_N": block_n, "BLOCK_L": block_l, "num_warps": _num_warps(block_n * block_l)}


def _chan_meta(n_outer: int, n_inner: int, length: int, tiles: tuple[int, int], num_sms: int) -> dict:
    """Meta-parameters of the channel kernels for ``n_outer`` x ``n_inner`` channels."""
    tile = tiles[0]
    block_d = max(32, min(128, _next_pow2(n_inner)))
    while block_d > 32 and n_outer * math.ceil(n_inner / block_d) < 4 * num_sms:
        block_d //= 2
    if n_outer * math.ceil(n_inner / block_d) < num_sms:
        block_d = 16
    block_t = _block_len(tile // block_d, length)
    return {"BLOCK_T": block_t, "BLOCK_D": block_d, "num_warps": _num_warps(block_t * block_d)}


def _look_back(tiles: tuple, n: int, length: int, num_sms: int) -> bool:
    """Whether ``n`` sequence-layout rows of ``length`` steps are cut into tiles chained by look-back:
    always for a config whose third field is True (``t4096.lookback``); by default, rows longer than
    one LONG_TILE when there are fewer rows than SMs (one program per row would leave SMs idle).
    Never under deterministic algorithms: the look-back's association order follows the timing of
    the tiles (as the native op's look-back plans, which deterministic mode also avoids)."""
    if torch.are_deterministic_algorithms_enabled():
        return False
    if len(tiles) > 2:
        return bool(tiles[2])
    return n < num_sms and length > tiles[1]


_LOOK_BACK_HOPS = 4  # predecessors read one word at a time before windows of 32 (kernels.py `_chain`; item 87)


def _look_back_launch(n: int, length: int, tiles: tuple, device: torch.device):
    """Grid, meta-parameters and zeroed workspace ``(status, counter)`` of the look-back kernels."""
    block_l = _block_len(tiles[1], length)
    entries = n * _cdiv(length, block_l)
    ws = torch.zeros(2 * entries + 1, dtype=torch.int64, device=device)  # two status words per entry, counter
    meta = {"BLOCK_L": block_l, "HOPS": _LOOK_BACK_HOPS, "num_warps": _num_warps(block_l)}
    return (entries,), meta, (ws[:2 * entries], ws[2 * entries:])


def _interpret_requested() -> bool:
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes", "y")


def _sync_interpret_mode() -> None:
    """Re-decorates the kernels when ``TRITON_INTERPRET`` changed since they were defined.

    ``triton.jit`` reads the flag when it decorates (at import), not at launch; this makes the flag
    in force at call time decide, whatever the import order (tests/conftest.py imports torch_linrec
    before tests/test_triton.py sets the flag).
    """
    global kernels, linrec_fwd_seq_kernel, linrec_fwd_chan_kernel, linrec_bwd_seq_kernel, linrec_bwd_chan_kernel
    global linrec_fwd_seq_lb_kernel, linrec_bwd_seq_lb_kernel
    interpreted = not isinstance(linrec_fwd_seq_kernel, JITFunction)
    if interpreted == _interpret_requested():
        return
    kernels = importlib.reload(kernels)
    linrec_fwd_seq_kernel, linrec_fwd_chan_kernel = kernels.linrec_fwd_seq_kernel, kernels.linrec_fwd_chan_kernel
    linrec_bwd_seq_kernel, linrec_bwd_chan_kernel = kernels.linrec_bwd_seq_kernel, kernels.linrec_bwd_chan_kernel
    linrec_fwd_seq_lb_kernel = kernels.linrec_fwd_seq_lb_kernel
    linrec_bwd_seq_lb_kernel = kernels.linrec_bwd_seq_lb_kernel


class _InterpretedLaunch:
    """``kernel[grid](*args)`` for an interpreted kernel, skipped when any argument is a fake tensor."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if torch._guards.detect_fake_mode([a for a in args if isinstance(a, torch.Tensor)]) is None:
                self.kernel[grid](*args, **kwargs)

        return launch


def wrap_triton(kernel):
    """``torch.library.wrap_triton`` for compiled kernels; a fake-aware launcher for interpreted ones.

    Interpreted kernels (``TRITON_INTERPRET=1``) cannot be traced: their launch is skipped when the
    op runs as its own fake kernel (fake outputs need no values), and the ops stay opaque under
    functionalization (:func:`_opaque_when_interpreted`). Named like torch's so that ``triton_op``
    finds the kernels in the op's source (it hashes them into compile cache keys).
    """
    if isinstance(kernel, JITFunction):
        return torch.library.wrap_triton(kernel)
    return _InterpretedLaunch(kernel)


def _layout(ref: torch.Tensor, dim: int, scan_ts: list, batch_ts: list):
    """Strides of every operand as an ``(outer, L, inner)`` view, or None if that needs a copy.

    Returns:
        ``(n_outer, n_inner, strides)``, ``strides`` holding ``(s_outer, s_L, s_inner)`` per scan
        tensor then ``(s_outer, s_inner)`` per batch tensor; None when the batch dims do not merge
        into two axes (see :func:`~torch_linrec.linrec.layout.coalesce_batch_dims`).
    """
    groups = coalesce_batch_dims(ref, dim, scan_ts, batch_ts)
    if len(groups) > 2:
        return None
    while len(groups) < 2:
        groups.append([1, [0] * (len(scan_ts) + len(batch_ts))])
    (n_inner, s_in), (n_outer, s_out) = groups
    strides = [(s_out[k], t.stride(dim), s_in[k]) for k, t in enumerate(scan_ts)]
    strides += [(s_out[k], s_in[k]) for k in range(len(scan_ts), len(s_in))]
    return n_outer, n_inner, strides


def _cdiv(a, b):
    return (a + b - 1) // b


def _launch_forward(y: torch.Tensor, x: torch.Tensor, c: torch.Tensor, h0, d: int, reverse: bool,
                    tiles: tuple[int, int]) -> bool:
    """Runs the forward kernel into ``y`` (c expanded to x's shape, h0 to its batch shape or None).

    Returns False, launching nothing, when the layout needs contiguous copies.
    """
    plan = _layout(y, d, [x, c, y], [] if h0 is None else [h0])
    if plan is None:
        return False
    n_outer, n_inner, strides = plan
    sx, sc, sy = strides[:3]
    sh = strides[3] if h0 is not None else (0, 0)
    length = x.shape[d]
    ptrs = (x, c, x if h0 is None else h0, y)
    flags = {"HAS_INIT": h0 is not None, "WALK_BACK": reverse}
    if n_inner > 1 and abs(sy[2]) < abs(sy[1]):
        meta = _chan_meta(n_outer, n_inner, length, tiles, _num_sms(y.device))
        grid = (n_outer * _cdiv(n_inner, meta["BLOCK_D"]),)
        wrap_triton(linrec_fwd_chan_kernel)[grid](*ptrs, n_outer, length, n_inner, *sx, *sc, *sh, *sy,
                                                   **flags, **meta)
    elif _look_back(tiles, n_outer * n_inner, length, _num_sms(y.device)):
        grid, meta, ws = _look_back_launch(n_outer * n_inner, length, tiles, y.device)
        wrap_triton(linrec_fwd_seq_lb_kernel)[grid](*ptrs, *ws, n_outer * n_inner, length, n_inner, *sx, *sc, *sh,
                                                     *sy, **flags, **meta)
    else:
        meta = _seq_meta(n_outer * n_inner, length, tiles, _num_sms(y.device))
        grid = (_cdiv(n_outer * n_inner, meta["BLOCK_N"]),)
        wrap_triton(linrec_fwd_seq_kernel)[grid](*ptrs, n_outer * n_inner, length, n_inner, *sx, *sc, *sh, *sy,
                                                  **flags, **meta)
    return True


def _launch_backward(outs: tuple, dy: torch.Tensor, c: torch.Tensor, y: torch.Tensor, h0, d: int,
                     reverse: bool, tiles: tuple[int, int]) -> bool:
    """Runs the fused backward kernel into ``outs = (dx, dc, dh0)``; False when copies are needed."""
    dx, dc, dh0 = outs
    batch = [dh0] if h0 is None else [dh0, h0]
    plan = _layout(dx, d, [dy, c, y, dx, dc], batch)
    if plan is None:
        return False
    n_outer, n_inner, strides = plan
    sdy, sc, sy, sdx, sdc, sdh = strides[:6]
    sh = strides[6] if h0 is not None else (0, 0)
    length = y.shape[d]
    ptrs = (dy, c, y, y if h0 is None else h0, dx, dc, dh0)
    st = (*sdy, *sc, *sy, *sh, *sdx, *sdc, *sdh)
    flags = {"HAS_INIT": h0 is not None, "WALK_BACK": not reverse}  # the VJP runs against the scan
    if n_inner > 1 and abs(sdx[2]) < abs(sdx[1]):
        meta = _chan_meta(n_outer, n_inner, length, tiles, _num_sms(y.device))
        grid = (n_outer * _cdiv(n_inner, meta["BLOCK_D"]),)
        wrap_triton(linrec_bwd_chan_kernel)[grid](*ptrs, n_outer, length, n_inner, *st, **flags, **meta)
    elif _look_back(tiles, n_outer * n_inner, length, _num_sms(y.device)):
        grid, meta, ws = _look_back_launch(n_outer * n_inner, length, tiles, y.device)
        wrap_triton(linrec_bwd_seq_lb_kernel)[grid](*ptrs, *ws, n_outer * n_inner, length, n_inner, *st, **flags,
                                                     **meta)
    else:
        meta = _seq_meta(n_outer * n_inner, length, tiles, _num_sms(y.device))
        grid = (_cdiv(n_outer * n_inner, meta["BLOCK_N"]),)
        wrap_triton(linrec_bwd_seq_kernel)[grid](*ptrs, n_outer * n_inner, length, n_inner, *st, **flags, **meta)
    return True


_DOCS: dict[str, str] = {}


def _documented(fn):
    """Keeps ``fn``'s docstring for its op's ``__doc__`` (``triton_op`` returns an object without it)."""
    _DOCS[fn.__name__] = fn.__doc__
    return fn


@torch.library.triton_op("linrec::scan_triton", mutates_args=())
@_documented
def scan_triton(x: torch.Tensor, coeffs: torch.Tensor, initial: Optional[torch.Tensor] = None, dim: int = -1,
                reverse: bool = False, config: Optional[str] = None,
                backward_config: Optional[str] = None) -> torch.Tensor:
    """Triton ``linrec::scan``: ``y[l] = coeffs[l] * y[l-1] + x[l]`` along ``dim``, ``y[-1] = initial``.

    Args:
        x: float32, float16 or bfloat16, at least one dim, any strides; on CUDA (on CPU under
            ``TRITON_INTERPRET=1``).
        coeffs: x's dtype and device, broadcastable to x (read in place, stride 0 where broadcast).
        initial: x's shape without ``dim``, or broadcastable to it; None (default): zero.
        dim: the scanned dim, negative allowed (default -1).
        reverse: scan from the end towards the start (default False).
        config: one of :data:`CONFIGS` (None or ``"triton"``: the default, ``"triton.t2048"``).
        backward_config: the config autograd passes to the backward: a Triton name (or None) runs
            ``linrec::scan_backward_triton``, a native name ``linrec::scan_backward``.

    Returns:
        ``y``, allocated as ``torch.empty_like(x)``, computed in float32 and stored in x's dtype.

    Raises:
        ValueError: float64 or another unsupported dtype, mismatched dtype or device, ``dim`` out of
            range, coeffs or initial not broadcastable, an unknown config.
    """
    d = check_scan_args("linrec.scan_triton", x, coeffs, initial, dim, float64_ok=False)
    return _forward(x, coeffs, initial, d, reverse, _resolve_config("linrec.scan_triton", config))


def _forward(x: torch.Tensor, coeffs: torch.Tensor, initial: Optional[torch.Tensor], d: int, reverse: bool,
             tiles: tuple[int, int]) -> torch.Tensor:
    """:func:`scan_triton` on checked arguments (``d`` wrapped)."""
    y = torch.empty_like(x)
    if y.numel() == 0:
        return y
    _sync_interpret_mode()
    c = coeffs.expand(x.shape)
    h0 = None if initial is None else initial.expand(batch_shape(x, d))
    if not _launch_forward(y, x, c, h0, d, reverse, tiles):
        tmp = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _launch_forward(tmp, x.contiguous(), c.contiguous(), None if h0 is None else h0.contiguous(), d, reverse,
                        tiles)
        y.copy_(tmp)
    return y


@torch.library.triton_op("linrec::scan_backward_triton", mutates_args=())
@_documented
def scan_backward_triton(grad_y: torch.Tensor, coeffs: torch.Tensor, y: torch.Tensor,
                         initial: Optional[torch.Tensor], dim: int, reverse: bool,
                         config: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton ``linrec::scan_backward``: the vector-Jacobian product of :func:`scan_triton`.

    Args:
        grad_y: gradient of ``y``, y's shape, dtype and device, any strides (stride 0 too).
        coeffs, initial, dim, reverse: as passed to the forward. y: the forward's output.
        config: one of :data:`CONFIGS` (None: the default).

    Returns:
        ``(grad_x, grad_coeffs, grad_initial)``: ``grad_x`` as ``torch.empty_like(y)``;
        ``grad_coeffs`` as ``torch.empty_like(y)`` summed to coeffs' shape when that differs;
        ``grad_initial`` of y's shape without ``dim`` (zeros when that dim has length 0).

    Raises:
        ValueError: as :func:`scan_triton`, or grad_y of another shape than y.
    """
    d = check_scan_backward_args("linrec.scan_backward_triton", grad_y, coeffs, y, initial, dim, float64_ok=False)
    return _backward(grad_y, coeffs, y, initial, d, reverse, _resolve_config("linrec.scan_backward_triton", config))


def _backward(grad_y: torch.Tensor, coeffs: torch.Tensor, y: torch.Tensor, initial: Optional[torch.Tensor], d: int,
              reverse: bool, tiles: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`scan_backward_triton` on checked arguments (``d`` wrapped)."""
    grad_x = torch.empty_like(y)
    grad_c = torch.empty_like(y)
    grad_h0 = y.new_empty(batch_shape(y, d))
    if y.shape[d] == 0:
        grad_h0.zero_()
    elif y.numel() > 0:
        _sync_interpret_mode()
        c = coeffs.expand(y.shape)
        h0 = None if initial is None else initial.expand(batch_shape(y, d))
        if not _launch_backward((grad_x, grad_c, grad_h0), grad_y, c, y, h0, d, reverse, tiles):
            tmp_x, tmp_c = (torch.empty(y.shape, dtype=y.dtype, device=y.device) for _ in range(2))
            _launch_backward((tmp_x, tmp_c, grad_h0), grad_y.contiguous(), c.contiguous(), y.contiguous(),
                             None if h0 is None else h0.contiguous(), d, reverse, tiles)
            grad_x.copy_(tmp_x)
            grad_c.copy_(tmp_c)
    if coeffs.shape != y.shape:
        grad_c = grad_c.sum_to_size(coeffs.shape)
    return grad_x, grad_c, grad_h0


def _opaque_when_interpreted(op_def) -> None:
    """Keeps ``op_def`` opaque under functionalization (AOTAutograd) while the kernels are interpreted.

    ``triton_op`` inlines its body when ``torch.compile`` traces it, so compiled graphs launch the
    kernels themselves; interpreted kernels cannot be traced that way, so the op stays a graph node
    then and runs eagerly. Compiled (CUDA) kernels keep torch's rule.
    """
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    decompose = getattr(op_def, "_torch_dispatch_fns", {}).get(FunctionalTensorMode)
    if decompose is None:
        return

    def rule(mode, op, types, args, kwargs):
        _sync_interpret_mode()
        if isinstance(linrec_fwd_seq_kernel, JITFunction):
            return decompose(mode, op, types, args, kwargs)
        return mode.__torch_dispatch__(op, types, args, kwargs)

    op_def.register_torch_dispatch(FunctionalTensorMode, rule)


_opaque_when_interpreted(scan_triton)
_opaque_when_interpreted(scan_backward_triton)

# The kernels as the native ops' kernels call them for a tuned "auto" entry naming a Triton config
# (csrc/linrec/ops.cpp). Those calls come below autograd with arguments the native op has checked, so
# these ops are plain Library kernels that go straight to the launch, without triton_op's custom-op
# layers and its wrap_triton HOP (bench/NOTES.md item 73). Compiled graphs hold the native op with
# "auto", so these are not traced; their fakes allocate as the public ops do.
_EAGER_LIB = torch.library.Library("linrec", "FRAGMENT")
_EAGER_LIB.define("_scan_triton_eager(Tensor x, Tensor coeffs, Tensor? initial, int dim, bool reverse, "
                  "str? config, str? backward_config) -> Tensor")
_EAGER_LIB.define("_scan_backward_triton_eager(Tensor grad_y, Tensor coeffs, Tensor y, Tensor? initial, int dim, "
                  "bool reverse, str? config) -> (Tensor, Tensor, Tensor)")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _direct_launches():
    """A context in which wrap_triton launches the kernels directly, as triton_op's eager path has it."""
    no_hop = getattr(torch._library.triton, "set_wrap_triton_enabled", None)
    return no_hop(False) if no_hop is not None else contextlib.nullcontext()


@_documented
def _scan_triton_eager(x, coeffs, initial, dim, reverse, config, backward_config=None):
    """Private: :func:`scan_triton`'s kernels as ``linrec::scan`` calls them for a tuned ``"auto"``
    entry naming a Triton config (below autograd, arguments checked by the native op; no autograd
    of its own). Arguments and result as :func:`scan_triton` (``backward_config`` is ignored).

    Raises:
        ValueError: an unknown config; float64 or another dtype the Triton kernels do not take.
    """
    if x.dtype not in _DTYPES:  # the native op's checks allow float64
        check_scan_args("linrec.scan_triton", x, coeffs, initial, dim, float64_ok=False)
    tiles = _resolve_config("linrec.scan_triton", config)
    with _direct_launches():
        return _forward(x, coeffs, initial, dim % x.dim(), reverse, tiles)


@_documented
def _scan_backward_triton_eager(grad_y, coeffs, y, initial, dim, reverse, config):
    """Private: :func:`scan_backward_triton`'s kernels as ``linrec::scan_backward`` calls them for a
    tuned ``"auto"`` entry naming a Triton config (arguments checked by the native op). Arguments
    and results as :func:`scan_backward_triton`.

    Raises:
        ValueError: an unknown config; float64 or another dtype the Triton kernels do not take.
    """
    if y.dtype not in _DTYPES:
        check_scan_backward_args("linrec.scan_backward_triton", grad_y, coeffs, y, initial, dim, float64_ok=False)
    tiles = _resolve_config("linrec.scan_backward_triton", config)
    with _direct_launches():
        return _backward(grad_y, coeffs, y, initial, dim % y.dim(), reverse, tiles)


@torch.library.register_fake("linrec::_scan_triton_eager", lib=_EAGER_LIB)
def _scan_triton_eager_fake(x, coeffs, initial, dim, reverse, config, backward_config=None):
    return _forward(x, coeffs, initial, dim % x.dim(), reverse, _resolve_config("linrec.scan_triton", config))


@torch.library.register_fake("linrec::_scan_backward_triton_eager", lib=_EAGER_LIB)
def _scan_backward_triton_eager_fake(grad_y, coeffs, y, initial, dim, reverse, config):
    tiles = _resolve_config("linrec.scan_backward_triton", config)
    return _backward(grad_y, coeffs, y, initial, dim % y.dim(), reverse, tiles)


_EAGER_LIB.impl("_scan_triton_eager", _scan_triton_eager, "CompositeExplicitAutograd")
_EAGER_LIB.impl("_scan_backward_triton_eager", _scan_backward_triton_eager, "CompositeExplicitAutograd")
_ops.register_scan_autograd("linrec::scan_triton")
register_functorch("scan_triton", torch.ops.linrec.scan_triton)
for _name, _doc in _DOCS.items():
    document_op(_name, _doc)
