"""Sequence layers built on torch_linrec's scans, each with a parallel ``forward(x, state=None,
return_state=False)`` on ``(B, L, D)``, a recurrent ``step(x_t, state)`` for decoding and
``allocate_state(batch)``: :class:`MinGRU`, :class:`MinLSTM` (linear or log-space), :class:`Mamba`
(mamba_ssm's parameters, on the fused selective scan), :class:`GatedSSM` (quick_ssm's model).
:mod:`.reference` holds their plain-PyTorch counterparts (for tests and the benchmark)."""
from .gated_ssm import GatedSSM
from .mamba import Mamba
from .minrnn import MinGRU, MinLSTM

__all__ = ["MinGRU", "MinLSTM", "Mamba", "GatedSSM", "LAYERS"]

LAYERS = {"mingru": MinGRU, "minlstm": MinLSTM, "mamba": Mamba, "gatedssm": GatedSSM}
