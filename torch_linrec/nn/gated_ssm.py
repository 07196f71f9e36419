"""The gated SSM of quick_ssm (the Birdie baseline: Blouir et al. 2024, "Birdie: Advancing State
Space Models with Reward-Driven Objectives and Curricula"): input-dependent gates around a diagonal
linear recurrence,

    a = sigmoid(W_a x + b_a),  b = sigmoid(W_b x),  c = sigmoid(W_c x),  v = W_v x
    h[t] = a[t] * h[t-1] + b[t] * v[t],   y[t] = W_o (c[t] * h[t]).

quick_ssm's layer adds a pre-RMSNorm and a residual around this mixer; here the model does (as the
example language model's blocks do for every layer type).
"""
from __future__ import annotations

import torch
from torch import nn

from ..api import scan

__all__ = ["GatedSSM"]


class GatedSSM(nn.Module):
    """Gated diagonal SSM mixer (module docs), trained by one :func:`torch_linrec.scan`.

    Args:
        d_model: width of the input and output ``(B, L, d_model)``.
        d_state: width of the state; default ``d_model`` (quick_ssm's ``hidden_size * state_size_mult``).
        device, dtype: of the parameters.

    Parameters: ``in_proj`` ``(4 d_state, d_model)`` with bias (the logits of ``a``, ``b``, ``c``
    and the value ``v``), ``out_proj`` ``(d_model, d_state)``. State: ``(B, d_state)``.
    """

    def __init__(self, d_model: int, d_state: int | None = None, device=None, dtype=None):
        super().__init__()
        self.d_model, self.d_state = d_model, d_state or d_model
        self.in_proj = nn.Linear(d_model, 4 * self.d_state, bias=True, device=device, dtype=dtype)
        self.out_proj = nn.Linear(self.d_state, d_model, bias=False, device=device, dtype=dtype)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_state={self.d_state}"

    def _gates(self, x: torch.Tensor):
        a, b, c, v = self.in_proj(x).chunk(4, dim=-1)
        return torch.sigmoid(a), torch.sigmoid(b) * v, torch.sigmoid(c)

    def allocate_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        """A zero state ``(batch, d_state)`` (on the parameters' device and dtype by default)."""
        w = self.in_proj.weight
        return torch.zeros(batch, self.d_state, device=device or w.device, dtype=dtype or w.dtype)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, return_state: bool = False):
        """The mixer on a whole sequence: ``x`` ``(B, L, d_model)``, ``state`` ``(B, d_state)`` or None
        (zero) -> ``y`` ``(B, L, d_model)``, or ``(y, final_state)`` with ``return_state``."""
        a, bv, c = self._gates(x)
        h = scan(bv, a, state, dim=1)
        y = self.out_proj(c * h)
        if not return_state:
            return y
        if h.shape[1] == 0:
            return y, state if state is not None else self.allocate_state(x.shape[0], x.device, x.dtype)
        return y, h[:, -1]

    def step(self, x_t: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One token: ``x_t`` ``(B, d_model)``, ``state`` ``(B, d_state)`` -> ``(y_t, new_state)``."""
        a, bv, c = self._gates(x_t)
        h = a * state + bv
        return self.out_proj(c * h), h
