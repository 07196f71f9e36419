"""The Mamba-1 mixer (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State
Spaces", Section 3.4 and Figure 3) on the fused :func:`torch_linrec.selective_scan`.

Parameter names, shapes and initialization are mamba_ssm's ``mamba_ssm.modules.mamba_simple.Mamba``
(``in_proj``, ``conv1d``, ``x_proj``, ``dt_proj``, ``A_log``, ``D``, ``out_proj``), so a state dict
of that module loads here. The state of a sequence is ``(conv_state, ssm_state)``: the last
``d_conv`` inputs of the convolution ``(B, d_inner, d_conv)`` and the SSM state
``(B, d_inner, d_state)`` (float32; float64 for a float64 layer), mamba_ssm's inference cache.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from ..selective import selective_scan, selective_state_update

__all__ = ["Mamba"]


class Mamba(nn.Module):
    """The Mamba-1 block's mixer: in-projection to ``x, z``; causal depthwise convolution and SiLU on
    ``x``; input-dependent ``dt, B, C`` from ``x_proj``/``dt_proj``; the selective scan with skip
    ``D`` and gate ``silu(z)``; out-projection.

    Args (mamba_ssm's; the same defaults):
        d_model: width of the input and output ``(B, L, d_model)``.
        d_state: SSM state size N per channel. Default 16.
        d_conv: width of the causal depthwise convolution. Default 4.
        expand: ``d_inner = expand * d_model``. Default 2.
        dt_rank: rank of the ``dt`` projection; ``"auto"``: ``ceil(d_model / 16)``.
        dt_min, dt_max: range of the initial ``dt`` (log-uniform). Defaults 0.001, 0.1.
        dt_init: ``"random"`` (uniform) or ``"constant"`` initialization of ``dt_proj.weight``,
            scaled by ``dt_scale * dt_rank ** -0.5``. dt_init_floor: lower clamp of the initial dt.
        conv_bias: bias of the convolution (default True). bias: of in_proj and out_proj (False).
        use_fast_path, layer_idx: accepted for signature compatibility (the fused scan is always used).
        device, dtype: of the parameters (``A_log`` and ``D`` are created float32, as in mamba_ssm).

    Raises:
        ValueError: for an unknown ``dt_init``.
    """

    def __init__(self, d_model: int, d_state: int = 16, d_conv: int = 4, expand: int = 2, dt_rank="auto",
                 dt_min: float = 0.001, dt_max: float = 0.1, dt_init: str = "random", dt_scale: float = 1.0,
                 dt_init_floor: float = 1e-4, conv_bias: bool = True, bias: bool = False, use_fast_path: bool = True,
                 layer_idx=None, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.d_inner = int(expand * d_model)
        self.dt_rank = math.ceil(d_model / 16) if dt_rank == "auto" else dt_rank
        self.use_fast_path, self.layer_idx = use_fast_path, layer_idx
        self.in_proj = nn.Linear(d_model, self.d_inner * 2, bias=bias, **kw)
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, kernel_size=d_conv, groups=self.d_inner,
                                padding=d_conv - 1, bias=conv_bias, **kw)
        self.act = nn.SiLU()
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False, **kw)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True, **kw)
        std = self.dt_rank ** -0.5 * dt_scale
        if dt_init == "constant":
            nn.init.constant_(self.dt_proj.weight, std)
        elif dt_init == "random":
            nn.init.uniform_(self.dt_proj.weight, -std, std)
        else:
            raise ValueError(f"Mamba: dt_init must be 'random' or 'constant', got {dt_init!r}")
        dt = torch.exp(torch.rand(self.d_inner, **kw) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        with torch.no_grad():  # the inverse of softplus, so that softplus(bias) = dt
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.dt_proj.bias._no_reinit = True
        A = repeat(torch.arange(1, d_state + 1, dtype=torch.float32, device=device), "n -> d n", d=self.d_inner)
        self.A_log = nn.Parameter(torch.log(A).contiguous())
        self.A_log._no_weight_decay = True
        self.D = nn.Parameter(torch.ones(self.d_inner, device=device))
        self.D._no_weight_decay = True
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias, **kw)
        # The selective scan of forward (torch_linrec.nn.reference.plain_mamba swaps in a plain one).
        self.scan_impl = selective_scan

    def _compute_dtype(self) -> torch.dtype:
        return torch.float64 if self.A_log.dtype == torch.float64 else torch.float32

    def allocate_state(self, batch: int, device=None, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero ``(conv_state (batch, d_inner, d_conv), ssm_state (batch, d_inner, d_state))``;
        ``dtype`` is the conv state's (default the weights'), the SSM state is float32 (float64)."""
        w = self.conv1d.weight
        device = device or w.device
        conv = torch.zeros(batch, self.d_inner, self.d_conv, device=device, dtype=dtype or w.dtype)
        ssm = torch.zeros(batch, self.d_inner, self.d_state, device=device, dtype=self._compute_dtype())
        return conv, ssm

    def _ssm_params(self, x_dbl: torch.Tensor):
        dt, B, C = torch.split(x_dbl, [self.dt_rank, self.d_state, self.d_state], dim=-1)
        ct = self._compute_dtype()
        return (F.linear(dt, self.dt_proj.weight), B, C, -torch.exp(self.A_log.to(ct)), self.D.to(ct),
                self.dt_proj.bias.to(ct))

    def forward(self, hidden_states: torch.Tensor, state=None, return_state: bool = False):
        """The mixer on a whole sequence.

        Args:
            hidden_states: ``(B, L, d_model)``.
            state: ``(conv_state, ssm_state)`` before the first step (e.g. a previous call's final
                state: chunked processing continues the sequence); None: zero.
            return_state: also return the final state.

        Returns:
            ``y`` ``(B, L, d_model)``, or ``(y, (conv_state, ssm_state))``.
        """
        batch = hidden_states.shape[0]
        if state is None:
            state = self.allocate_state(batch, hidden_states.device, hidden_states.dtype)
        if hidden_states.shape[1] == 0:
            out = self.out_proj(hidden_states.new_zeros(batch, 0, self.d_inner))
            return (out, state) if return_state else out
        conv_state, ssm_state = state
        x, z = rearrange(self.in_proj(hidden_states), "b l d -> b d l").chunk(2, dim=1)
        xc = torch.cat([conv_state.to(x.dtype), x], dim=-1)  # (b, d_inner, d_conv + L)
        x = self.act(F.conv1d(xc[..., 1:], self.conv1d.weight, self.conv1d.bias, groups=self.d_inner))
        dt, B, C, A, D, dt_bias = self._ssm_params(self.x_proj(rearrange(x, "b d l -> b l d")))
        y, last = self.scan_impl(x, rearrange(dt, "b l d -> b d l"), A, rearrange(B, "b l n -> b n l"),
                                 rearrange(C, "b l n -> b n l"), D, z, dt_bias, True, ssm_state, True)
        out = self.out_proj(rearrange(y, "b d l -> b l d"))
        return (out, (xc[..., -self.d_conv:], last)) if return_state else out

    def step(self, x_t: torch.Tensor, state):
        """One token (recurrent decoding): ``x_t`` ``(B, d_model)``, ``state`` as :meth:`forward`'s ->
        ``(y_t (B, d_model), new_state)``. Functional (the state is not modified in place)."""
        conv_state, ssm_state = state
        x, z = self.in_proj(x_t).chunk(2, dim=-1)
        conv_state = torch.cat([conv_state[..., 1:], x.unsqueeze(-1).to(conv_state.dtype)], dim=-1)
        x = (conv_state * rearrange(self.conv1d.weight, "d 1 w -> d w")).sum(-1).to(x.dtype)
        if self.conv1d.bias is not None:
            x = x + self.conv1d.bias
        x = self.act(x)
        dt, B, C, A, D, dt_bias = self._ssm_params(self.x_proj(x))
        y, ssm_state = selective_state_update(ssm_state, x, dt, A, B, C, D, z, dt_bias, True, inplace=False)
        return self.out_proj(y), (conv_state, ssm_state)
