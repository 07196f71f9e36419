"""Every private torch API that :mod:`torch_linrec.compile` uses, in one module.

The hook: ``torch._inductor.config.pre_grad_custom_pass``. Inductor runs it on the Dynamo graph
(torch-level IR: ``operator.mul``, ``torch.einsum``, ``Tensor.sum``, with ``example_value`` fake
tensors on the nodes) before AOT autograd traces the joint forward/backward graph, so a rewrite made
there is differentiated by the new op's own autograd formula. The joint-graph and post-grad hooks
run after autograd (they would fuse the forward only and keep the unfused backward), and
``torch.library`` has no graph-rewrite hook, so this is the one hook that fits. It is the same on
torch 2.11 and 2.13, with two differences handled here:

* torch 2.11 takes one callable, torch 2.13 also a list (:func:`install` chains passes on 2.11);
* torch 2.13 runs a pass that has a ``uuid()`` after the AOT autograd cache lookup ("late"), so a
  warm cache skips the pass (its result is in the cached artifact); torch 2.11 runs it before.

The tangent strides: ``torch._functorch.config.guess_tangent_strides_as_outputs``. AOT autograd
traces the backward for incoming gradients of the forward outputs' strides when it is on (torch
2.13's default), else for contiguous ones (torch 2.11's), and copies every gradient that differs.
The fused op returns ``out`` in its input's layout; for Mamba's ``(B, L, D)`` views that copy, a
transpose of ``out``'s gradient, made the rewritten graph's backward 18% slower than the fused op's
on the H100. :func:`match_tangent_strides` turns it on while the fusion is enabled.

:func:`check_hooks` fails loudly (RuntimeError) if a torch upgrade moves any of these.
"""
from __future__ import annotations

import hashlib
import inspect
import operator
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["HOOK", "TANGENT_STRIDES", "check_hooks", "match_tangent_strides", "make_pass", "install", "uninstall", "is_installed", "record", "known_equal",
           "example_value", "op_name", "bind", "side_effect", "set_meta", "SILU_KERNELS"]

HOOK = "torch._inductor.config.pre_grad_custom_pass"
TANGENT_STRIDES = "torch._functorch.config.guess_tangent_strides_as_outputs"

try:
    from torch._inductor import config as _config
    from torch._inductor import custom_graph_pass as _custom_graph_pass
    from torch._inductor.fx_passes import pre_grad as _pre_grad
    from torch._functorch import config as _aot_config
    _IMPORT_ERROR: ImportError | None = None
except ImportError as error:  # a torch that moved the modules: check_hooks reports it
    _config = _custom_graph_pass = _pre_grad = _aot_config = None
    _IMPORT_ERROR = error

from torch.fx.experimental.symbolic_shapes import statically_known_true  # noqa: E402

# How the Dynamo graph spells silu when not as F.silu; the calls that switch grad mode or autocast,
# and the in-place operators, of the pre-grad graph (which is not functional).
SILU_KERNELS = {torch._C._nn.silu}
_MODE_SWITCHES = {torch._C._set_grad_enabled} | {getattr(torch.amp.autocast_mode, name, None)
                                                for name in ("_enter_autocast", "_exit_autocast")} - {None}
_IN_PLACE = {operator.setitem, operator.iadd, operator.imul, operator.isub, operator.itruediv}


def check_hooks() -> None:
    """Checks that the private torch APIs this package uses are where it expects them.

    Raises:
        RuntimeError: naming the API that moved, and the torch version.
    """
    where = f"(torch {torch.__version__}); torch_linrec.compile needs an update for this torch"
    if _IMPORT_ERROR is not None:
        raise RuntimeError(f"Inductor's custom pass modules moved: {_IMPORT_ERROR} {where}")
    if not hasattr(_config, "pre_grad_custom_pass"):
        raise RuntimeError(f"{HOOK} no longer exists {where}")
    if not isinstance(getattr(_aot_config, "guess_tangent_strides_as_outputs", None), bool):
        raise RuntimeError(f"{TANGENT_STRIDES} no longer exists {where}")
    if not hasattr(_custom_graph_pass, "CustomGraphPass"):
        raise RuntimeError(f"torch._inductor.custom_graph_pass.CustomGraphPass no longer exists {where}")
    runner = getattr(_pre_grad, "pre_grad_passes", None)
    if runner is None:
        raise RuntimeError(f"torch._inductor.fx_passes.pre_grad.pre_grad_passes no longer exists {where}")
    try:
        source = inspect.getsource(runner)
    except (OSError, TypeError):  # no sources shipped: the end-to-end tests still check the hook
        return
    if "pre_grad_custom_pass" not in source:
        raise RuntimeError(f"Inductor's pre-grad passes no longer run {HOOK} {where}")


class GraphPass(_custom_graph_pass.CustomGraphPass):
    """A pre-grad Inductor pass that calls ``function(graph)``; a module-level class so Inductor can
    pickle it into its cache keys (``function`` and ``state`` must be module-level functions).

    Its ``uuid()``, which keys Inductor's and AOT autograd's caches, hashes the source ``files`` and
    ``state()`` (what else decides the rewrite).
    """

    def __init__(self, function: Callable[[torch.fx.Graph], Any], files: tuple[str, ...],
                 state: Callable[[], str]):
        self.function, self.files, self.state = function, files, state

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.function(graph)

    def uuid(self) -> str:
        digest = hashlib.sha256(self.state().encode())
        for path in self.files:
            with open(path, "rb") as f:
                digest.update(f.read())
        return digest.hexdigest()


def make_pass(function: Callable[[torch.fx.Graph], Any], files: tuple[str, ...],
              state: Callable[[], str]) -> GraphPass:
    """The :class:`GraphPass` of ``function``, after checking that Inductor still runs the hook.

    Raises:
        RuntimeError: the hook moved (see :func:`check_hooks`).
    """
    check_hooks()
    return GraphPass(function, files, state)


class _Chain:
    """Several passes as one callable, for a torch whose hook takes one (2.11)."""

    def __init__(self, passes: list):
        self.passes = passes

    def __call__(self, graph: torch.fx.Graph) -> None:
        for custom_pass in self.passes:
            custom_pass(graph)

    def uuid(self) -> str | None:
        uuids = [getattr(p, "uuid", lambda: None)() for p in self.passes]
        return None if None in uuids else repr(uuids)


def _passes() -> list:
    current = _config.pre_grad_custom_pass
    if current is None:
        return []
    if isinstance(current, _Chain):
        return list(current.passes)
    return list(current) if isinstance(current, (list, tuple)) else [current]


def _set_passes(passes: list) -> None:
    takes_lists = hasattr(_custom_graph_pass, "get_custom_graph_passes")
    if not passes:
        _config.pre_grad_custom_pass = None
    elif len(passes) == 1:
        _config.pre_grad_custom_pass = passes[0]
    else:
        _config.pre_grad_custom_pass = passes if takes_lists else _Chain(passes)


def is_installed(custom_pass: Callable) -> bool:
    """Whether ``custom_pass`` is among Inductor's pre-grad custom passes."""
    return _IMPORT_ERROR is None and any(p is custom_pass for p in _passes())


def install(custom_pass: Callable) -> None:
    """Adds ``custom_pass`` after any pre-grad custom pass already set (no-op if already there).

    Raises:
        RuntimeError: the hook moved (see :func:`check_hooks`).
    """
    check_hooks()
    if not is_installed(custom_pass):
        _set_passes(_passes() + [custom_pass])


def uninstall(custom_pass: Callable) -> None:
    """Removes ``custom_pass`` from the pre-grad custom passes, keeping the others."""
    if is_installed(custom_pass):
        _set_passes([p for p in _passes() if p is not custom_pass])


def match_tangent_strides(enabled: bool) -> bool:
    """Sets :data:`TANGENT_STRIDES` (see the module's docstring); returns its previous value.

    Raises:
        RuntimeError: the setting moved (see :func:`check_hooks`).
    """
    check_hooks()
    before = _aot_config.guess_tangent_strides_as_outputs
    _aot_config.guess_tangent_strides_as_outputs = enabled
    return before


def record(name: str, count: int) -> None:
    """Adds ``count`` to ``torch._dynamo.utils.counters["torch_linrec"][name]``."""
    from torch._dynamo.utils import counters
    counters["torch_linrec"][name] += count


def known_equal(a: Any, b: Any) -> bool:
    """Whether two sizes (ints or SymInts) are equal without adding a guard."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return bool(statically_known_true(a == b))


def example_value(node: Any) -> Any:
    """The fake value Dynamo records on a graph node (None for anything else)."""
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


def op_name(target: Any) -> str | None:
    """``"namespace::name"`` of an op overload or packet, None for any other call target."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name
    return target._qualified_op_name if isinstance(target, torch._ops.OpOverloadPacket) else None


def bind(node: torch.fx.Node) -> dict[str, Any]:
    """The arguments of an op call node by name, defaults included."""
    target = node.target if isinstance(node.target, torch._ops.OpOverload) else node.target.default
    arguments = target._schema.arguments
    bound = {a.name: a.default_value if a.has_default_value() else None for a in arguments}
    bound.update(zip([a.name for a in arguments], node.args), **node.kwargs)
    return bound


def side_effect(graph: torch.fx.Graph, internal: list, leaves: list, final: torch.fx.Node) -> str | None:
    """What makes replacing the nodes ``internal`` (ending at ``final``, computed from ``leaves``) by
    one op unsafe in a pre-grad graph: an in-place write to any of them, or a grad-mode or autocast
    switch among them; None if nothing does."""
    for user in {user for node in internal + leaves for user in node.users}:
        name = user.target if isinstance(user.target, str) else getattr(user.target, "__name__", "")
        if (user.target in _IN_PLACE or name.endswith("_") and not name.endswith("__") or user.kwargs.get("inplace")
                or isinstance(user.target, torch._ops.OpOverload) and user.target._schema.is_mutable):
            return f"{user} writes in place into the pattern"
    order = {node: i for i, node in enumerate(graph.nodes)}
    start = min(order[n] for n in internal)
    if any(start < order[n] < order[final] for n in graph.nodes if n.target in _MODE_SWITCHES):
        return "the pattern spans a grad-mode or autocast switch"
    return None


def set_meta(node: torch.fx.Node, like: torch.fx.Node) -> None:
    """Gives a new node the source location of ``like`` and, where it can be computed from its
    inputs' example values, its own example value (metadata for later passes)."""
    node.meta.update({k: v for k, v in like.meta.items() if k in ("stack_trace", "nn_module_stack")})
    values = [example_value(a) if isinstance(a, torch.fx.Node) else a for a in node.args]
    try:  # best effort: a later pass that needs a missing value computes it
        function = getattr(values[0], node.target) if node.op == "call_method" else node.target
        node.meta["example_value"] = function(*values[1:]) if node.op == "call_method" else function(*values)
    except Exception:  # noqa: BLE001
        pass
