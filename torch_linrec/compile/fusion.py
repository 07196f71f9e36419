"""Rewrites Mamba's unfused selective scan, written with plain torch and ``torch_linrec.scan``, into
``torch.ops.linrec.selective_scan``: the pass of :func:`torch_linrec.compile.enable_selective_scan_fusion`.

Matched, with ``b, d, l, n`` (batch, channel, step, state) the axes of the scanned 4-D tensor in any
order, ``(B, D, L, N)`` and ``(B, L, D, N)`` included, and ``l`` the scan's ``dim``::

    h = torch_linrec.scan(dt (x) u (x) B, exp(dt (x) A), initial, dim=l)     (reverse=False)
    y = sum_n h (x) C            ((h * C).sum(n), or an einsum such as 'bdln,bnl->bdl')
    y = y + D (x) u              (optional)
    y = y * silu(z)              (optional)

``(x)``: a broadcast product, ``*`` / ``torch.mul`` / ``Tensor.mul`` through ``unsqueeze``, ``[:, None]``,
``transpose``, ``permute``, ``expand``, ``contiguous``, or an einsum that sums over nothing, grouped
any way. ``dt`` ``(b, d, l)``: ``softplus(delta + delta_bias)`` (default softplus), ``softplus(delta)``,
``delta + delta_bias`` or any other tensor. ``A`` ``(d, n)``; ``u``, ``z`` ``(b, d, l)``; ``D`` ``(d,)``;
``initial`` None or a full ``(b, d, n)``; ``B``, ``C`` time-invariant ``(d, n)``, input-dependent
``(b, n, l)`` or per-channel ``(b, d, n, l)`` (passed as grouped, G = D). ``D`` and ``z`` are taken in
where the result before them has no other user, else left outside the op. Float16/bfloat16 patterns
run in float32 inside the op (A, D, delta_bias and initial are cast, as the op requires).

Left unchanged: ``reverse=True``; a scan output or ``h * C`` with another user (the unfused scan
would stay); coeffs not ``exp`` of a two-factor product; scaled or negated factors (``exp(-dt * A)``);
a sum over another axis or with ``keepdim``; ``matmul`` contractions; a broadcast ``initial``; mixed
dtypes or devices; a grad-mode or autocast switch inside the pattern; an operand written in place.

Why a hand-written walk over the pre-grad FX graph rather than ``torch._inductor.pattern_matcher``:
the same math is written in dozens of ways (axis arrangement, where ``unsqueeze`` goes, how products
are grouped, ``*`` or ``einsum``), each a pattern of its own there. The walk tracks instead, for each
tensor it visits, which axis of the scanned tensor each of its axes runs along (from the nodes'
``example_value`` fake tensors and the broadcasting rules), so a variant matches exactly when it
computes the same products over the same axes. The walk only reads the graph; anything it does not
recognize ends it, and the graph is changed only once the whole pattern has matched.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from . import _inductor

__all__ = ["SCANS", "Match", "NoMatch"]

SCANS = ("linrec::scan", "linrec::scan_triton")  # the ops whose calls start a match
_MUL, _ADD, _EXP, _SUM = {operator.mul, torch.mul}, {operator.add, torch.add}, {torch.exp}, {torch.sum}
_SOFTPLUS, _SILU = {F.softplus}, {F.silu} | _inductor.SILU_KERNELS
_FULL = (0, 1, 2, 3)


class NoMatch(Exception):
    """Raised by :class:`Match`: the scan at hand is not the selective-scan pattern (the message says why)."""


@dataclass(frozen=True)
class _Term:
    """A tensor of the pattern and, for each of its axes, the axis of the scanned tensor it runs
    along (0 to 3), or None for a size-1 axis that broadcasts."""
    node: fx.Node
    axes: tuple

    def labels(self) -> frozenset:
        return frozenset(a for a in self.axes if a is not None)


def _shape(node: Any) -> tuple:
    value = _inductor.example_value(node)
    if not isinstance(value, torch.Tensor):
        raise NoMatch(f"{node} is not a tensor of known shape")
    return tuple(value.shape)


def _same_shape(a: fx.Node, b: fx.Node) -> bool:
    sa, sb = _shape(a), _shape(b)
    return len(sa) == len(sb) and all(_inductor.known_equal(x, y) for x, y in zip(sa, sb))


def _is(node: Any, functions: set, methods: tuple = ()) -> bool:
    return isinstance(node, fx.Node) and (node.op == "call_function" and node.target in functions
                                          or node.op == "call_method" and node.target in methods)


def _arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def _binary(node: Any, functions: set, method: str) -> bool:
    """Whether ``node`` is ``functions``/``Tensor.method`` of two tensors, without keywords."""
    return (_is(node, functions, (method,)) and len(node.args) == 2 and not node.kwargs
            and all(isinstance(a, fx.Node) for a in node.args))


def _other(node: fx.Node, operand: fx.Node) -> fx.Node:
    return node.args[1] if node.args[0] is operand else node.args[0]


def _single_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _align(operand: Any, out_shape: tuple, out_axes: tuple) -> tuple:
    """Axes of ``operand`` broadcast (aligned right) against an output whose axes are ``out_axes``."""
    shape = _shape(operand)
    if len(shape) > len(out_shape):
        raise NoMatch(f"{operand} has more dims than its result")
    axes, offset = [], len(out_shape) - len(shape)
    for size, out_size, axis in zip(shape, out_shape[offset:], out_axes[offset:]):
        if not (_inductor.known_equal(size, out_size) or isinstance(size, int) and size == 1):
            raise NoMatch(f"{operand} does not broadcast")
        axes.append(axis if _inductor.known_equal(size, out_size) else None)
    return tuple(axes)


def _view_input(node: fx.Node, axes: tuple) -> tuple | None:
    """``(input, its axes)`` when ``node`` only inserts, moves or broadcasts the axes of one tensor."""
    rank, args = len(axes), node.args
    if _is(node, {torch.unsqueeze}, ("unsqueeze",)):
        k = _arg(node, 1, "dim") % rank
        return args[0], axes[:k] + axes[k + 1:]
    dims = None
    if _is(node, {torch.permute}, ("permute",)):
        dims = [d % rank for d in (args[1] if len(args) == 2 and isinstance(args[1], (tuple, list)) else args[1:])]
    elif _is(node, {torch.transpose, torch.swapaxes, torch.swapdims}, ("transpose", "swapaxes", "swapdims")) and len(
            args) == 3:
        dims = list(range(rank))
        dims[args[1] % rank], dims[args[2] % rank] = args[2] % rank, args[1] % rank
    if dims is not None:  # output axis j is input axis dims[j]
        return (args[0], tuple(axes[dims.index(i)] for i in range(rank))) if sorted(dims) == list(range(rank)) else None
    if _is(node, set(), ("expand", "expand_as")):
        return args[0], _align(args[0], _shape(node), axes)
    if _is(node, set(), ("contiguous",)) and len(args) == 1 and not node.kwargs:
        return args[0], axes
    if not (_is(node, {operator.getitem}) and isinstance(_inductor.example_value(args[0]), torch.Tensor)):
        return None
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    full = sum(isinstance(i, slice) and i == slice(None) for i in index)
    if full + sum(i is None or i is Ellipsis for i in index) != len(index) or index.count(Ellipsis) > 1:
        return None
    inputs, position, spanned = [], 0, len(_shape(args[0])) - full
    for i in index:
        count = spanned if i is Ellipsis else 1
        inputs.extend(axes[position:position + count] if i is not None else ())
        position += count
    return args[0], tuple(inputs) + axes[position:]


def _einsum(node: Any) -> tuple | None:
    """``(operands, their subscripts, output subscripts)`` of an einsum without ``...`` or repeated letters."""
    if not _is(node, {torch.einsum}) or node.kwargs or not isinstance(node.args[0], str):
        return None
    operands, equation = node.args[1:], node.args[0].replace(" ", "")
    operands = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
    if "->" not in equation or "." in equation:
        return None
    inputs, output = equation.split("->")
    subscripts = inputs.split(",")
    if len(subscripts) != len(operands) or any(len(set(s)) != len(s) for s in subscripts + [output]):
        return None
    return operands, subscripts, output


def _product_operands(node: fx.Node, axes: tuple) -> list | None:
    """``[(operand, its axes), ...]`` when ``node`` is a broadcast elementwise product."""
    if _binary(node, _MUL, "mul"):
        return [(a, _align(a, _shape(node), axes)) for a in node.args]
    einsum = _einsum(node)
    if einsum is None or set("".join(einsum[1])) - set(einsum[2]):
        return None
    operands, subscripts, output = einsum
    shape = _shape(node)
    return [(op, _align(op, tuple(shape[output.index(c)] for c in s), tuple(axes[output.index(c)] for c in s)))
            for op, s in zip(operands, subscripts)]


class Match:
    """The pattern around one call of a scan op: the constructor, which only reads the graph, raises
    NoMatch where there is none; :meth:`rewrite` applies it."""

    def __init__(self, graph: fx.Graph, scan: fx.Node):
        self.graph, self.scan, self.internal = graph, scan, [scan]
        bound = _inductor.bind(scan)
        x, coeffs, initial, dim = bound["x"], bound["coeffs"], bound["initial"], bound["dim"]
        if bound["reverse"] is not False or not isinstance(dim, int) or len(_shape(scan)) != 4:
            raise NoMatch("not a forward scan of a 4-D tensor")
        if not (_same_shape(x, scan) and _same_shape(coeffs, scan)):
            raise NoMatch("x or coeffs broadcast")
        self.l = dim % 4
        self.dt, self.A = self._coeffs(coeffs)
        self.u, self.B = self._input(x)
        self.C, self.final, self.final_axes = self._contraction()
        self.delta, self.bias, self.softplus = self._split_dt()
        self.D, self.z = self._epilogue()
        self.initial = None
        if initial is not None:
            batch = tuple(a for a in _FULL if a != self.l)
            self.initial = self._peel(initial, _align(initial, tuple(_shape(scan)[a] for a in batch), batch))
            if self.initial.labels() != frozenset(batch):
                raise NoMatch("initial is not a full (b, d, n) tensor")
        self._check_safe()

    def _roles(self, names: str) -> tuple:
        return tuple(getattr(self, name) for name in names)

    def _peel(self, node: Any, axes: tuple) -> _Term:
        """The tensor under ``node``'s chain of view ops (these become internal)."""
        while isinstance(node, fx.Node) and (step := _view_input(node, axes)) is not None:
            self.internal.append(node)
            node, axes = step
        if not isinstance(node, fx.Node):
            raise NoMatch(f"{node!r} is not a tensor")
        return _Term(node, tuple(axes))

    def _operands(self, node: Any, axes: tuple) -> list:
        """The two factors of the product ``node`` (which becomes internal)."""
        term = self._peel(node, axes)
        operands = _product_operands(term.node, term.axes)
        if operands is None or len(operands) != 2:
            raise NoMatch(f"{term.node} is not a product of two tensors")
        self.internal.append(term.node)
        return [self._peel(*operand) for operand in operands]

    def _coeffs(self, coeffs: fx.Node) -> tuple:
        """``(dt, A)`` of ``coeffs = exp(dt (x) A)``, whose axes also say which axis is b, d and n."""
        if not (_is(coeffs, _EXP, ("exp",)) and len(coeffs.args) == 1 and not coeffs.kwargs):
            raise NoMatch("coeffs is not exp(...)")
        self.internal.append(coeffs)
        first, second = self._operands(coeffs.args[0], _FULL)
        dt, A = (first, second) if len(first.labels()) == 3 else (second, first)
        common = dt.labels() & A.labels()
        if (len(dt.labels()) != 3 or len(A.labels()) != 2 or self.l not in dt.labels() - A.labels()
                or len(common) != 1 or len(dt.labels() | A.labels()) != 4):
            raise NoMatch("coeffs is not exp of a (b, d, l) by (d, n) product")
        (self.d,) = common
        (self.n,), (self.b,) = A.labels() - common, dt.labels() - common - {self.l}
        return dt, A

    def _bc_layout(self, term: _Term) -> tuple:
        for layout in (self._roles("dn"), self._roles("bnl"), self._roles("bdnl")):
            if term.labels() == frozenset(layout):
                return layout
        raise NoMatch(f"{term.node} is not (d, n), (b, n, l) or (b, d, n, l)")

    def _has_dt(self, node: fx.Node) -> bool:
        if node is self.dt.node or not isinstance(_inductor.example_value(node), torch.Tensor):
            return node is self.dt.node
        axes = (None,) * len(_shape(node))
        walk = _view_input(node, axes) is not None or _product_operands(node, axes) is not None
        return walk and any(self._has_dt(a) for a in node.all_input_nodes)

    def _factors(self, node: Any, axes: tuple) -> list:
        """The factors of the product tree ``node``, down to ``dt`` and to dt-free tensors of one role."""
        term = self._peel(node, axes)
        operands = None if term == self.dt else _product_operands(term.node, term.axes)
        units = {frozenset(self._roles(names)) for names in ("bdl", "dn", "bnl")}
        if operands is None or not self._has_dt(term.node) and term.labels() in units:
            return [term]
        self.internal.append(term.node)
        return [factor for operand in operands for factor in self._factors(*operand)]

    def _input(self, x: fx.Node) -> tuple:
        """``(u, B)`` of ``x = dt (x) u (x) B``."""
        factors = self._factors(x, _FULL)
        if self.dt not in factors or len(factors) != 3:
            raise NoMatch("x is not a product of dt, u and B")
        factors.remove(self.dt)
        bdl = frozenset(self._roles("bdl"))
        u, B = factors if factors[0].labels() == bdl else factors[::-1]
        if u.labels() != bdl:
            raise NoMatch("x has no (b, d, l) factor u")
        self._bc_layout(B)
        return u, B

    def _contraction(self) -> tuple:
        """``(C, y, y's axes)`` of ``y = sum_n h (x) C``."""
        use = _single_user(self.scan)
        einsum = _einsum(use)
        if einsum is not None and len(einsum[0]) == 2 and einsum[0].count(self.scan) == 1:
            operands, subscripts, output = einsum
            h = subscripts[operands.index(self.scan)]
            (other, letters), = [(o, s) for o, s in zip(operands, subscripts) if o is not self.scan]
            if set(h) - set(output) != {h[self.n]} or set(letters) - set(h) or len(output) != 3:
                raise NoMatch("the scan's einsum does not sum over n alone")
            axes = tuple(h.index(c) for c in letters)
            C = self._peel(other, _align(other, tuple(_shape(self.scan)[a] for a in axes), axes))
            final, final_axes = use, tuple(h.index(c) for c in output)
        elif _binary(use, _MUL, "mul") and _same_shape(use, self.scan) and self.scan in use.args:
            self.internal.append(use)
            other = _other(use, self.scan)
            C, final = self._peel(other, _align(other, _shape(use), _FULL)), _single_user(use)
            dims = _arg(final, 1, "dim") if final is not None else None
            dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
            if not (_is(final, _SUM, ("sum",)) and len(final.args) <= 2 and set(final.kwargs) <= {"dim"}
                    and all(isinstance(k, int) for k in dims) and {k % 4 for k in dims} == {self.n}):
                raise NoMatch("h * C is not summed over n alone")
            final_axes = tuple(a for a in _FULL if a != self.n)
        else:
            raise NoMatch("the scan's output is not only contracted with C")
        if C.node is self.scan:
            raise NoMatch("C is the scan's output")
        self._bc_layout(C)
        self.internal.append(final)
        return C, final, final_axes

    def _split_dt(self) -> tuple:
        """``(delta, delta_bias, softplus)`` of ``dt``."""
        node, inner, softplus = self.dt.node, self.dt, False
        if _is(node, _SOFTPLUS) and _arg(node, 1, "beta", 1) == 1 and _arg(node, 2, "threshold", 20) == 20:
            inner, softplus = self._peel(node.args[0], self.dt.axes), True
            self.internal.append(node)
        if _binary(inner.node, _ADD, "add"):
            terms = [self._peel(a, _align(a, _shape(inner.node), inner.axes)) for a in inner.node.args]
            for delta, bias in (terms, terms[::-1]):
                if delta.labels() == self.dt.labels() and bias.labels() == {self.d}:
                    self.internal.append(inner.node)
                    return delta, bias, softplus
        return inner, None, softplus

    def _epilogue(self) -> tuple:
        """``(D, z)`` of ``+ D (x) u`` and ``* silu(z)`` after the contraction, where they follow it."""
        D = z = None
        use, mark = _single_user(self.final), len(self.internal)
        if _binary(use, _ADD, "add") and _same_shape(use, self.final) and self.final in use.args:
            other = _other(use, self.final)
            try:
                terms = self._operands(other, _align(other, _shape(use), self.final_axes))
            except NoMatch:
                terms = None
            pairs = () if terms is None else (terms, terms[::-1])
            D = next((d for u, d in pairs if u == self.u and d.labels() == {self.d}), None)
            if D is None:
                del self.internal[mark:]
            else:
                self.final = use
                self.internal.append(use)
                use = _single_user(use)
        if _binary(use, _MUL, "mul") and _same_shape(use, self.final) and self.final in use.args:
            gate = _other(use, self.final)
            if (_is(gate, _SILU) and not _arg(gate, 1, "inplace", False) and isinstance(gate.args[0], fx.Node)
                    and _same_shape(gate, use)):
                z, self.final = _Term(gate.args[0], self.final_axes), use
                self.internal += [gate, use]
        return D, z

    def _check_safe(self) -> None:
        """One floating dtype and device throughout, no in-place writes, no grad-mode or autocast switch."""
        leaves = [t.node for t in (self.u, self.delta, self.A, self.B, self.C, self.D, self.z, self.bias,
                                   self.initial) if t is not None]
        reference = _inductor.example_value(self.scan)
        if reference.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise NoMatch("not a floating dtype")
        for value in map(_inductor.example_value, leaves + [self.final]):
            if (value.dtype, value.device) != (reference.dtype, reference.device):
                raise NoMatch("the pattern mixes dtypes or devices")
        problem = _inductor.side_effect(self.graph, self.internal, leaves, self.final)
        if problem:
            raise NoMatch(problem)

    def _layout(self, term: _Term | None, layout: tuple, dtype: torch.dtype | None = None,
                any_strides: bool = False) -> fx.Node | None:
        """``term``'s tensor with the axes ``layout`` (squeezed, permuted) and ``dtype``, if given; made
        contiguous when permuted, unless the op takes ``any_strides`` for it (only u, delta and z)."""
        if term is None:
            return None
        node, kept = term.node, [a for a in term.axes if a is not None]
        if len(kept) < len(term.axes):
            node = self._insert("call_method", "squeeze", 
                                (node, tuple(i for i, a in enumerate(term.axes) if a is None)))
        order = tuple(kept.index(a) for a in layout)
        if order != tuple(range(len(order))):
            node = self._insert("call_method", "permute", (node, order))
            node = node if any_strides else self._insert("call_method", "contiguous", (node,))
        if dtype is not None and _inductor.example_value(term.node).dtype != dtype:
            node = self._insert("call_method", "to", (node, dtype))
        return node

    def _insert(self, op: str, target: Any, args: tuple) -> fx.Node:
        node = self.graph.create_node(op, target, args)
        _inductor.set_meta(node, self.final)
        return node

    def _target(self):
        """``linrec::_selective_scan_train`` where the graph runs with gradients (its CUDA kernel saves
        the chunk states the backward would otherwise recompute), else ``linrec::selective_scan``."""
        train = getattr(torch.ops.linrec, "_selective_scan_train", None)
        inputs = (self.u, self.delta, self.A, self.B, self.C, self.D, self.z, self.bias, self.initial)
        needs_grad = torch.is_grad_enabled() and any(
            term is not None and getattr(_inductor.example_value(term.node), "requires_grad", False) for term in inputs)
        return train if train is not None and needs_grad else torch.ops.linrec.selective_scan

    def rewrite(self) -> None:
        """Replaces the pattern's result with the fused op's and erases what no longer has users."""
        bdl, d = self._roles("bdl"), (self.d,)
        compute = torch.float64 if _inductor.example_value(self.scan).dtype == torch.float64 else torch.float32
        with self.graph.inserting_before(self.final):
            args = (self._layout(self.u, bdl, any_strides=True), self._layout(self.delta, bdl, any_strides=True),
                    self._layout(self.A, self._roles("dn"), compute),
                    self._layout(self.B, self._bc_layout(self.B)), self._layout(self.C, self._bc_layout(self.C)),
                    self._layout(self.D, d, compute), self._layout(self.z, bdl, any_strides=True),
                    self._layout(self.bias, d, compute), self.softplus,
                    self._layout(self.initial, self._roles("bdn"), compute))
            out = self._insert("call_function", operator.getitem, (self._insert("call_function", self._target(), args), 0))
            order = tuple(bdl.index(a) for a in self.final_axes)
            if order != (0, 1, 2):
                out = self._insert("call_method", "permute", (out, order))
        self.final.replace_all_uses_with(out)
        internal = set(self.internal)
        for node in reversed(list(self.graph.nodes)):
            if node in internal and not node.users:
                self.graph.erase_node(node)
