"""Multi-tensor optimizers: `AdamW` (torch.optim.AdamW semantics) and `LAMB` (apex FusedLAMB).

Each is a `torch.optim.Optimizer` whose step hands every parameter of one dtype and device to a
single provider call (C++ on CPU, Triton on CUDA); see `kernels.optim_adamw` and
`kernels.optim_lamb` for the semantics, the registered `adamw_step` / `lamb_step` kernels and
their providers.
"""
from __future__ import annotations

from kernels.optim_adamw import AdamW
from kernels.optim_common import OptimizerError
from kernels.optim_lamb import LAMB, global_grad_norm

__all__ = ["AdamW", "LAMB", "OptimizerError", "global_grad_norm"]
