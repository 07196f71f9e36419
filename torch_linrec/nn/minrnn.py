"""minGRU and minLSTM (Feng et al. 2024, "Were RNNs All We Needed?"): gated RNNs whose gates read
only the input, so training runs as one scan and decoding as a constant-memory recurrence.

Both are ``h[t] = a[t] * h[t-1] + (1 - a[t]) * v[t]`` with ``a = sigmoid(-s)``, ``1 - a = sigmoid(s)``
for a per-step logit ``s``: minGRU's update gate logit ``s = k`` (``z = sigmoid(k)``); minLSTM's
normalized gates ``f' = f / (f + i)``, ``i' = i / (f + i)`` give ``s = softplus(-k_f) - softplus(-k_i)``
(so ``f' = sigmoid(-s)``, ``i' = sigmoid(s)``, without the paper's epsilon). Two modes:

* ``"linear"``: ``v = Linear_h(x)`` and :func:`torch_linrec.scan` (signed states).
* ``"log"``: the paper's log-space form for long sequences, ``v = g(Linear_h(x))`` with
  ``g(u) = u + 0.5 (u >= 0), sigmoid(u) (u < 0)`` so that states stay positive, and
  :func:`torch_linrec.log_scan` on ``log a = -softplus(s)``, ``log (1 - a) + log v``.

``step`` runs the same recurrence on one token in linear space (the log mode's states are
positive), so a sequence decoded token by token equals the parallel forward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..api import scan
from ..logscan import log_scan

__all__ = ["MinGRU", "MinLSTM"]

MODES = ("linear", "log")


def g(u: torch.Tensor) -> torch.Tensor:
    """The positive candidate activation of the log-space mode: ``u + 0.5`` for ``u >= 0``, else ``sigmoid(u)``."""
    return torch.where(u >= 0, u.clamp_min(0) + 0.5, torch.sigmoid(u.clamp_max(0)))


def log_g(u: torch.Tensor) -> torch.Tensor:
    """``log g(u)``, computed without forming ``g`` (``-softplus(-u)`` for ``u < 0``)."""
    return torch.where(u >= 0, torch.log(u.clamp_min(0) + 0.5), -F.softplus(-u.clamp_max(0)))


class _MinimalRNN(nn.Module):
    """Shared body of :class:`MinGRU` and :class:`MinLSTM` (module docs); subclasses define the logit."""

    n_proj: int = 2

    def __init__(self, d_model: int, d_hidden: int | None = None, mode: str = "linear", bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"{type(self).__name__}: mode must be one of {MODES}, got {mode!r}")
        if d_model < 1 or (d_hidden is not None and d_hidden < 1):
            raise ValueError(f"{type(self).__name__}: d_model and d_hidden must be positive, got {d_model}, {d_hidden}")
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.d_hidden, self.mode = d_model, d_hidden or d_model, mode
        self.in_proj = nn.Linear(d_model, self.n_proj * self.d_hidden, bias=bias, **kw)
        self.out_proj = nn.Linear(self.d_hidden, d_model, bias=False, **kw)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_hidden={self.d_hidden}, mode={self.mode!r}"

    def _logit(self, parts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        raise NotImplementedError

    def _gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(s, u)``: the gate logit and the candidate pre-activation, each ``(..., d_hidden)``."""
        parts = self.in_proj(x).chunk(self.n_proj, dim=-1)
        return self._logit(parts[:-1]), parts[-1]

    def allocate_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        """A zero state ``(batch, d_hidden)`` (on the parameters' device and dtype by default)."""
        w = self.in_proj.weight
        return torch.zeros(batch, self.d_hidden, device=device or w.device, dtype=dtype or w.dtype)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, return_state: bool = False):
        """The layer on a whole sequence, by one scan.

        Args:
            x: ``(B, L, d_model)``.
            state: ``(B, d_hidden)`` state before the first step (a previous call's final state
                continues the sequence); None: zero. In ``"log"`` mode it must be >= 0.
            return_state: also return the final state.

        Returns:
            ``y`` ``(B, L, d_model)``, or ``(y, state)`` with the state after the last step
            ``(B, d_hidden)``.
        """
        s, u = self._gates(x)
        if self.mode == "linear":
            h = scan(torch.sigmoid(s) * u, torch.sigmoid(-s), state, dim=1)
        else:
            ct = torch.float64 if x.dtype == torch.float64 else torch.float32
            s, u = s.to(ct), u.to(ct)
            log_h0 = None if state is None else torch.log(state.to(ct))
            h = torch.exp(log_scan(log_g(u) - F.softplus(-s), -F.softplus(s), log_h0, dim=1)).to(x.dtype)
        y = self.out_proj(h)
        if not return_state:
            return y
        if h.shape[1] == 0:
            return y, state if state is not None else self.allocate_state(x.shape[0], x.device, x.dtype)
        return y, h[:, -1]

    def step(self, x_t: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One token: ``x_t`` ``(B, d_model)``, ``state`` ``(B, d_hidden)`` -> ``(y_t, new_state)``."""
        s, u = self._gates(x_t)
        v = g(u) if self.mode == "log" else u
        h = torch.sigmoid(-s) * state + torch.sigmoid(s) * v
        return self.out_proj(h), h


class MinGRU(_MinimalRNN):
    """minGRU (Feng et al. 2024, "Were RNNs All We Needed?", Section 3.1):
    ``z = sigmoid(Linear_z(x))``, ``h[t] = (1 - z[t]) h[t-1] + z[t] h~[t]``, ``h~ = Linear_h(x)``
    (``g(Linear_h(x))`` in ``"log"`` mode), ``y = Linear_out(h)``.

    Args:
        d_model: width of the input and output ``(B, L, d_model)``.
        d_hidden: width of the state (cuRNN's demo: 512 -> 768); default ``d_model``.
        mode: ``"linear"`` (:func:`torch_linrec.scan`) or ``"log"`` (:func:`torch_linrec.log_scan`
            with the positive candidate ``g``); see :mod:`torch_linrec.nn.minrnn`.
        bias: bias of the input projection. device, dtype: of the parameters.

    Parameters: ``in_proj`` ``(2 d_hidden, d_model)`` (gate logit, candidate), ``out_proj``
    ``(d_model, d_hidden)``. State: ``(B, d_hidden)``.
    """

    n_proj = 2

    def _logit(self, parts):
        return parts[0]


class MinLSTM(_MinimalRNN):
    """minLSTM (Feng et al. 2024, "Were RNNs All We Needed?", Section 3.2):
    ``f = sigmoid(Linear_f(x))``, ``i = sigmoid(Linear_i(x))``, ``h[t] = f'[t] h[t-1] + i'[t] h~[t]``
    with the length-independent normalization ``f' = f / (f + i)``, ``i' = i / (f + i)``.

    Args:
        d_model, d_hidden, mode, bias, device, dtype: as :class:`MinGRU`.

    Parameters: ``in_proj`` ``(3 d_hidden, d_model)`` (forget logit, input logit, candidate),
    ``out_proj``. State: ``(B, d_hidden)``.
    """

    n_proj = 3

    def _logit(self, parts):
        k_f, k_i = parts
        return F.softplus(-k_f) - F.softplus(-k_i)
