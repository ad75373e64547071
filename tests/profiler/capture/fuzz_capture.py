"""Random small models through a real capture: is every op counted and joined?

`python -m tests.profiler.capture.fuzz_capture --seconds 300` (`make fuzz-capture`; not part of
`make test`, whose test_fuzz_capture_smoke.py runs a fixed stretch of seeds) draws a model per
seed from a grammar of layers (images: convolutions, transposed and grouped ones, norms,
activations in and out of place, pooling, upsampling, padding, pixel shuffles, squeeze-excitation,
residual adds; sequences: linear layers, norms, LSTM/GRU/RNN layers, attention, transformer layers,
1-D convolutions, GLU; one of a dozen losses), a mode (train or infer), and captures one step as
`python -m profiler capture` does (Kineto plus the untimed FLOPs pass), checking:

1. the capture works (nothing raises) for every drawn model that runs by itself (one that fails
   eagerly, e.g. an in-place activation on an RNN output autograd saved, is passed over);
2. every recorded op has a FLOP rule (`capture.costs.unknown_flop_ops` empty, no rule failing);
3. the join matches every recorded op to a profiled one (`capture.join.match_rate` 1.0);
4. FLOPs and bytes of the profiled ops are finite and non-negative.

A failure prints one line with the seed that reproduces it and what the model was:
`python -m tests.profiler.capture.fuzz_capture --seed S --cases 1`.
"""
from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
import warnings
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

Layer = tuple[str, Callable[[random.Random, int], nn.Module]]


class Lambda(nn.Module):
    """A function as a layer (its parameters, if any, registered by the caller)."""

    def __init__(self, fn: Callable[..., torch.Tensor], **modules: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        self.parts = nn.ModuleDict(modules)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, self.parts)


def _act(rng: random.Random) -> nn.Module:
    inplace = rng.random() < 0.5
    return rng.choice([lambda: nn.ReLU(inplace), lambda: nn.ReLU6(inplace), lambda: nn.Hardswish(inplace),
                       lambda: nn.SiLU(inplace), lambda: nn.LeakyReLU(0.1, inplace), lambda: nn.ELU(inplace=inplace),
                       lambda: nn.GELU(rng.choice(["none", "tanh"])), lambda: nn.Mish(inplace), nn.PReLU,
                       nn.Sigmoid, nn.Tanh, nn.Softplus, nn.Hardsigmoid, nn.SELU, nn.CELU, nn.Softsign])()


# image layers: C channels in and out, spatial size kept
IMAGE: list[Layer] = [
    ("conv", lambda r, c: nn.Conv2d(c, c, r.choice([1, 3, 5]), padding="same", groups=r.choice([1, c]),
                                    dilation=r.choice([1, 1, 2]), bias=r.random() < 0.5)),
    ("conv_t", lambda r, c: nn.ConvTranspose2d(c, c, 3, padding=1)),
    ("batch_norm", lambda r, c: nn.BatchNorm2d(c)),
    ("group_norm", lambda r, c: nn.GroupNorm(r.choice([1, c // 2 or 1, c]), c)),
    ("instance_norm", lambda r, c: nn.InstanceNorm2d(c, affine=r.random() < 0.5)),
    ("act", lambda r, c: _act(r)),
    ("pool_up", lambda r, c: Lambda(lambda x, p, m=r.choice(["nearest", "bilinear", "bicubic"]), k=r.choice(["max", "avg"]):
                                    F.interpolate((F.max_pool2d if k == "max" else F.avg_pool2d)(x, 2),
                                                  size=x.shape[-2:], mode=m))),
    ("pad_crop", lambda r, c: Lambda(lambda x, p, m=r.choice(["reflect", "replicate", "circular", "constant"]):
                                     F.pad(x, (1, 1, 1, 1), mode=m)[..., 1:-1, 1:-1])),
    ("pixel_shuffle", lambda r, c: Lambda(lambda x, p: F.pixel_shuffle(F.pixel_unshuffle(x, 2), 2))),
    ("squeeze_excite", lambda r, c: Lambda(lambda x, p: x * torch.sigmoid(p["fc"](F.adaptive_avg_pool2d(x, 1).flatten(1)))[:, :, None, None],
                                           fc=nn.Linear(c, c))),
    ("residual", lambda r, c: Lambda(lambda x, p: x + p["conv"](x), conv=nn.Conv2d(c, c, 3, padding=1))),
    ("dropout", lambda r, c: nn.Dropout2d(0.1)),
    ("adaptive_max", lambda r, c: Lambda(lambda x, p: x + F.adaptive_max_pool2d(x, 3).mean((2, 3), keepdim=True))),
    ("antialias", lambda r, c: Lambda(lambda x, p, m=r.choice(["bilinear", "bicubic"]): F.interpolate(
        F.interpolate(x, scale_factor=0.5, mode=m, antialias=True), size=x.shape[-2:], mode="nearest"))),
    ("grid_sample", lambda r, c: Lambda(lambda x, p, m=r.choice(["bilinear", "nearest", "bicubic"]): F.grid_sample(
        x, F.affine_grid(torch.eye(2, 3).expand(x.shape[0], 2, 3) * 0.9, list(x.shape), align_corners=False),
        mode=m, align_corners=False))),
    ("strided", lambda r, c: Lambda(lambda x, p: F.interpolate(p["conv"](x), size=x.shape[-2:], mode="bilinear"),
                                    conv=nn.Conv2d(c, c, 3, stride=2, padding=1))),
    ("unpool", lambda r, c: Lambda(lambda x, p: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2,
                                                               output_size=x.shape[-2:]))),
    ("lp_pool", lambda r, c: Lambda(lambda x, p: x + F.lp_pool2d(x.abs() + 0.1, 2, 2).mean((2, 3), keepdim=True))),
]


class Recurrent(nn.Module):
    def __init__(self, r: random.Random, d: int) -> None:
        super().__init__()
        cls = r.choice([nn.LSTM, nn.GRU, nn.RNN])
        self.bidirectional = r.random() < 0.4
        self.rnn = cls(d, d // 2 if self.bidirectional else d, num_layers=r.choice([1, 2]), batch_first=True,
                       bidirectional=self.bidirectional)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


class Attention(nn.Module):
    def __init__(self, r: random.Random, d: int) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(d, r.choice([1, 2, 4]), batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mha(x, x, x, need_weights=False)[0]


# sequence layers: [B, T, D] in and out
SEQUENCE: list[Layer] = [
    ("linear", lambda r, d: nn.Linear(d, d, bias=r.random() < 0.7)),
    ("layer_norm", lambda r, d: nn.LayerNorm(d)),
    ("rms_norm", lambda r, d: nn.RMSNorm(d)),
    ("act", lambda r, d: _act(r)),
    ("recurrent", Recurrent),
    ("attention", Attention),
    ("transformer", lambda r, d: nn.TransformerEncoderLayer(d, r.choice([1, 2, 4]), 2 * d, dropout=0.0,
                                                            batch_first=True, norm_first=r.random() < 0.5,
                                                            activation=r.choice(["relu", "gelu"]))),
    ("conv1d", lambda r, d: Lambda(lambda x, p: p["conv"](x.transpose(1, 2)).transpose(1, 2),
                                   conv=nn.Conv1d(d, d, r.choice([1, 3]), padding="same"))),
    ("glu", lambda r, d: Lambda(lambda x, p: F.glu(p["up"](x)), up=nn.Linear(d, 2 * d))),
    ("softmax_mix", lambda r, d: Lambda(lambda x, p: torch.softmax(x @ x.transpose(1, 2) / math.sqrt(d), -1) @ x)),
    ("cumsum", lambda r, d: Lambda(lambda x, p: torch.cumsum(x, 1) / (1 + torch.arange(x.shape[1])[None, :, None]))),
    ("dropout", lambda r, d: nn.Dropout(0.1)),
    ("cell_loop", lambda r, d: Lambda(lambda x, p: torch.stack(_cells(p["cell"], x), 1),
                                      cell=r.choice([nn.GRUCell, nn.RNNCell])(d, d))),
    ("topk_mix", lambda r, d: Lambda(lambda x, p: x + torch.topk(x, 2, dim=-1).values.mean(-1, keepdim=True)
                                     + torch.sort(x, dim=1).values * 0.1)),
]


def _cells(cell: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """A recurrent cell stepped over the sequence in Python (decoders written by hand)."""
    h, out = torch.zeros(x.shape[0], x.shape[2]), []
    for t in range(x.shape[1]):
        h = cell(x[:, t], h)
        out.append(h)
    return out

LOSSES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "cross_entropy": lambda y: F.cross_entropy(y, torch.zeros(y.shape[0], dtype=torch.long)),
    "mse": lambda y: F.mse_loss(y, torch.zeros_like(y)),
    "smooth_l1": lambda y: F.smooth_l1_loss(y, torch.full_like(y, 0.5)),
    "huber": lambda y: F.huber_loss(y, torch.full_like(y, 0.5)),
    "bce_logits": lambda y: F.binary_cross_entropy_with_logits(y, torch.full_like(y, 0.3)),
    "bce": lambda y: F.binary_cross_entropy(torch.sigmoid(y), torch.full_like(y, 0.3)),
    "kl_div": lambda y: F.kl_div(F.log_softmax(y, -1), torch.full_like(y, 1 / y.shape[-1]), reduction="batchmean"),
    "nll": lambda y: F.nll_loss(F.log_softmax(y, -1), torch.ones(y.shape[0], dtype=torch.long)),
    "l1": lambda y: F.l1_loss(y, torch.zeros_like(y)),
    "soft_margin": lambda y: F.soft_margin_loss(y, torch.ones_like(y)),
    "label_smoothing": lambda y: F.cross_entropy(y, torch.zeros(y.shape[0], dtype=torch.long), label_smoothing=0.1),
    "where": lambda y: torch.where(y > 0, y, 0.0).square().mean(),
}


class Drawn(nn.Module):
    """image layers -> pooled to a sequence -> sequence layers -> head [B, 4] -> loss."""

    def __init__(self, image: list[nn.Module], sequence: list[nn.Module], channels: int, dim: int, loss: str) -> None:
        super().__init__()
        self.image = nn.Sequential(*image)
        self.to_seq = nn.Linear(channels, dim)
        self.sequence = nn.Sequential(*sequence)
        self.head = nn.Linear(dim, 4)
        self.loss = loss

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.image(x)                                   # [B, C, H, W]
        y = self.to_seq(y.flatten(2).transpose(1, 2))       # [B, H*W, D]
        y = self.sequence(y).mean(1)                        # [B, D]
        return LOSSES[self.loss](self.head(y))


class Case:
    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.seed = seed
        self.channels, self.dim = rng.choice([4, 8]), rng.choice([8, 16])
        self.image = [rng.choice(IMAGE) for _ in range(rng.randint(0, 4))]
        self.sequence = [rng.choice(SEQUENCE) for _ in range(rng.randint(0, 4))]
        self.loss = rng.choice(sorted(LOSSES))
        self.mode = rng.choice(["train", "infer"])
        self.side = rng.choice([4, 6])

    def build(self) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(self.seed)
        rng = random.Random(self.seed + 1)
        model = Drawn([make(rng, self.channels) for _, make in self.image],
                      [make(rng, self.dim) for _, make in self.sequence], self.channels, self.dim, self.loss)
        return model, (torch.randn(2, self.channels, self.side, self.side),)

    def describe(self) -> str:
        return (f"seed {self.seed}: {self.mode}, image [{', '.join(n for n, _ in self.image)}], "
                f"sequence [{', '.join(n for n, _ in self.sequence)}], loss {self.loss}")


def runs_eagerly(case: Case) -> bool:
    """Whether the drawn model itself works outside any capture (a step of its mode): an in-place
    activation on a tensor autograd saved (after an RNN) is the draw's bug, not a finding."""
    model, inputs = case.build()
    try:
        if case.mode == "train":
            model(*inputs).backward()
        else:
            with torch.inference_mode():
                model.eval()(*inputs)
    except RuntimeError:
        return False
    return True


def check(case: Case) -> Optional[str]:
    """One line saying what broke, or None (also for a drawn model that fails by itself)."""
    from profiler.capture.backends import CapturePlan
    from profiler.capture.runner import capture
    from profiler.capture.spec import LoadedModel

    if not runs_eagerly(case):
        return None
    model, inputs = case.build()
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            res = capture(LoadedModel(f"fuzz:{case.seed}", "file", model, inputs),
                          CapturePlan(mode=case.mode, wait=0, warmup=1, active=1), out)
        except Exception as exc:  # noqa: BLE001 (any failure is the finding)
            return f"capture raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    meta = res.trace.meta["capture"]
    problems = []
    if meta["costs"]["unknown_flop_ops"]:
        problems.append(f"no FLOP rule for {meta['costs']['unknown_flop_ops']}")
    join = meta["join"]
    if join["match_rate"] != 1.0:
        problems.append(f"joined {join['match_rate']:.4f}, unmatched {join['unmatched_names']}")
    ops = res.trace.events[res.trace.events["kind"] == "cpu_op"]
    for col in ("flops", "bytes_moved"):
        values = ops[col].dropna()
        if not (values.map(math.isfinite).all() and (values >= 0).all()):
            problems.append(f"{col} not finite and non-negative")
    return "; ".join(problems) or None


def run(seed: int, cases: Optional[int], seconds: float, log: Callable[[str], None] = print) -> dict[str, Any]:
    start = time.perf_counter()
    failures, n = [], 0
    while (cases is None or n < cases) and time.perf_counter() - start < seconds:
        case = Case(seed + n)
        n += 1
        problem = check(case)
        if problem:
            failures.append((case, problem))
            log(f"FAIL {case.describe()}: {problem}")
    return {"cases": n, "failures": failures, "seconds": time.perf_counter() - start}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=None, help="first case's seed (default: from the clock)")
    ap.add_argument("--cases", type=int, default=None, help="stop after this many cases")
    ap.add_argument("--seconds", type=float, default=300.0, help="stop after this long (default 300)")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) * 1000
    print(f"fuzz_capture: seed {seed}", flush=True)
    out = run(seed, args.cases, args.seconds, log=lambda s: print(s, flush=True))
    print(f"fuzz_capture: {out['cases']} cases in {out['seconds']:.0f} s; {len(out['failures'])} failed")
    return 1 if out["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
