"""Per-call cost of the public kernels at decode sizes, where the Python around a kernel is the cost.

Usage (from the repo root):
    .venv/bin/python benchmarks/bench_dispatch.py [--hidden 768,4096] [--rows 1] [--threads 1]
        [--rounds 7] [--inner 2000] [--device cpu|cuda] [--csv PATH] [--generate 48]

One decode step of a transformer calls each norm, activation and RoPE once per layer on one row
(batch 1, one new token): the kernels themselves take 1-12 us there, so the provider choice, the
argument checks and the autograd wrapper decide the speed. Per kernel, forward under no_grad,
interleaved rounds (`benchmarks.harness`; CPU time on CPU, on CUDA wall time with a synchronize
after each variant's calls: the launch rate a decode loop gets), three variants:
- `eager`: what the user would run without FusionLens (ATen's op, or Hugging Face's composition
  where ATen has none: LlamaRMSNorm, silu(gate) * up, rotate-half RoPE);
- `ours`: the public function with the automatic provider choice, as shipped (a repeated call is
  answered by `kernels/choice_memo.py`);
- `ours_no_memo`: the same with the memo switched off (`choice_memo.ENABLED`): a stored decision reused the full way
  (key, store lookup, support checks): what every call cost before the memo.
End to end (--generate N, needs transformers): greedy generation of N tokens by a small Llama
(random weights: hidden 512, 4 layers, 8 heads, GQA 4) as transformers builds it, against a copy
with our RMSNorm modules, SwiGLU in each MLP and our RoPE swapped in, with and without the memo;
the copies must produce the same tokens. Rows go to `benchmarks/results/dispatch.csv`, or --csv
(microseconds per call or milliseconds per token, p20/p50/p80 over rounds).
"""
from __future__ import annotations

import argparse
import copy
import functools
import sys
import types
from contextlib import contextmanager, nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernels  # noqa: E402
from benchmarks.harness import append_rows, interleave, percentiles, print_table, timing_rows  # noqa: E402
from kernels import choice_memo, provider_choice  # noqa: E402
from kernels.rope import rotate_half  # noqa: E402  (the reference's own, as transformers writes it)

CSV = "dispatch.csv"
HEAD_DIM = 128


def _hf_rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward."""
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def cases(rows: int, hidden: int, device: str) -> dict[str, tuple]:
    """kernel -> (eager call, args, kwargs of `kernels.<kernel>`); fp32, one decode step."""
    def t(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device)

    x, r, g, w, b = t(1, rows, hidden), t(1, rows, hidden), t(1, rows, hidden), t(hidden), t(hidden)
    heads = max(1, hidden // HEAD_DIM)
    q, k, cos, sin = t(1, heads, rows, HEAD_DIM), t(1, heads, rows, HEAD_DIM), t(rows, HEAD_DIM), t(rows, HEAD_DIM)
    scores = t(1, heads, rows, 512)  # attention row over a 512-token cache
    return {
        "rms_norm": (lambda: _hf_rms(x, w), (x, w, 1e-6), {}),
        "add_rms_norm": (lambda: (lambda s: (s, _hf_rms(s, w)))(x + r), (x, r, w, 1e-6), {}),
        "layer_norm": (lambda: F.layer_norm(x, (hidden,), w, b, 1e-5), (x, w, b, 1e-5), {}),
        "gelu": (lambda: F.gelu(x, approximate="tanh"), (x, "tanh"), {}),
        "swiglu": (lambda: F.silu(x) * g, (x, g), {}),
        "softmax": (lambda: F.softmax(scores * 0.0884, dim=-1), (scores,), {"scale": 0.0884}),
        "rope": (lambda: (q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin), (q, k, cos, sin), {}),
    }


def memo_off(call):
    """`call` the full way (what a reused decision cost before `choice_memo`)."""
    def run() -> None:
        choice_memo.ENABLED = False
        try:
            call()
        finally:
            choice_memo.ENABLED = True
    return run


def llama_pair(device: str):
    """(transformers' model, our copy, its modeling module): a small random-weight Llama, and the
    same weights with kernels.RMSNorm for every LlamaRMSNorm and kernels.swiglu in every MLP."""
    import transformers
    from transformers.models.llama import modeling_llama

    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval().to(device)
    ours = copy.deepcopy(hf)

    def mlp_forward(self, x):
        return self.down_proj(kernels.swiglu(self.gate_proj(x), self.up_proj(x)))

    for parent in list(ours.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, modeling_llama.LlamaRMSNorm):
                norm = kernels.RMSNorm(child.weight.shape[0], eps=child.variance_epsilon, device=device)
                norm.load_state_dict(child.state_dict())
                setattr(parent, name, norm)
            elif isinstance(child, modeling_llama.LlamaMLP):
                child.forward = types.MethodType(mlp_forward, child)
    return hf, ours, modeling_llama


@contextmanager
def our_rope(modeling):
    """transformers' apply_rotary_pos_emb replaced by kernels.rope (its default unsqueeze_dim=1)."""
    real = modeling.apply_rotary_pos_emb
    modeling.apply_rotary_pos_emb = lambda q, k, cos, sin, unsqueeze_dim=1: kernels.rope(q, k, cos, sin)
    try:
        yield
    finally:
        modeling.apply_rotary_pos_emb = real


def generation(tokens: int, device: str, rounds: int, metric: str) -> tuple[list, list]:
    """Table rows and CSV rows of the end-to-end greedy generation (ms per new token)."""
    hf, ours, modeling = llama_pair(device)
    prompt = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(0)).to(device)

    def run(model, rope: bool):
        def go():
            with torch.no_grad(), (our_rope(modeling) if rope else nullcontext()):
                return model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                                      pad_token_id=0)
        return go

    same = torch.equal(run(hf, False)(), run(ours, True)())
    sync = torch.cuda.synchronize if device == "cuda" else None
    t = interleave({"hf": run(hf, False), "ours": run(ours, True), "ours_no_memo": memo_off(run(ours, True))},
                   rounds=rounds, inner=1, warmup=1, sync=sync)
    ms = {v: percentiles(x * 1e3 / tokens for x in xs) for v, xs in getattr(t, metric).items()}
    speed, saved = t.ratio("hf", "ours", metric), t.ratio("ours_no_memo", "ours", metric)
    table = [[f"llama 512x4, {tokens} tokens", f"{ms['hf'][1]:.2f}", f"{ms['ours'][1]:.2f}",
              f"{ms['ours_no_memo'][1]:.2f}", f"{speed[1]:.3f} ({speed[0]:.3f}-{speed[2]:.3f})",
              f"{saved[1]:.3f} ({saved[0]:.3f}-{saved[2]:.3f})", "yes" if same else "NO"]]
    rows = timing_rows("dispatch_generate_llama", f"1x16+{tokens}", t, unit_scale=1e3 / tokens, unit="ms/token",
                       notes=f"{device}; threads={torch.get_num_threads()}; greedy; same_tokens={same}")
    return table, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", default="768,4096")
    ap.add_argument("--rows", default="1")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--inner", type=int, default=2000)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--csv", default=CSV, help="results file (a name under benchmarks/results/ or a path)")
    ap.add_argument("--generate", type=int, default=48, help="new tokens of the end-to-end run (0: skip it)")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("bench_dispatch: --device cuda but torch sees no CUDA GPU")
    metric = "wall_s" if cuda else "cpu_s"
    table: list[list] = []
    path = None
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for rows in (int(v) for v in args.rows.split(",")):
            for hidden in (int(v) for v in args.hidden.split(",")):
                for name, (eager, call, kw) in cases(rows, hidden, args.device).items():
                    ours = functools.partial(getattr(kernels, name), *call, **kw)
                    with torch.no_grad():
                        picked = provider_choice(name, *call, **kw).provider  # decided before timing
                        t = interleave({"eager": eager, "ours": ours, "ours_no_memo": memo_off(ours)},
                                       rounds=args.rounds, inner=args.inner, warmup=50,
                                       sync=torch.cuda.synchronize if cuda else None)
                    shape = f"{rows}x{hidden}"
                    us = {v: percentiles(s * 1e6 for s in xs) for v, xs in getattr(t, metric).items()}
                    speed = t.ratio("eager", "ours", metric)
                    saved = t.ratio("ours_no_memo", "ours", metric)
                    table.append([name, shape, threads, picked, f"{us['eager'][1]:.1f}", f"{us['ours'][1]:.1f}",
                                  f"{us['ours_no_memo'][1]:.1f}", f"{speed[1]:.2f} ({speed[0]:.2f}-{speed[2]:.2f})",
                                  f"{saved[1]:.2f} ({saved[0]:.2f}-{saved[2]:.2f})"])
                    path = append_rows(args.csv, timing_rows(  # per case: a timeout keeps what was measured
                        f"dispatch_{name}", shape, t, unit_scale=1e6, unit="us",
                        notes=f"{args.device}; threads={threads}; fwd no_grad; picked={picked}"))
    print_table(f"decode-size calls on {args.device}, us per call ({'wall' if cuda else 'CPU'} time, median of rounds)",
                ["kernel", "rows x hidden", "threads", "provider", "eager", "ours", "ours no memo",
                 "eager/ours", "no memo/ours"], table)
    if args.generate:
        try:
            import transformers  # noqa: F401  (optional extra)
        except ImportError:
            print("end to end: skipped (transformers is not installed)")
        else:
            torch.set_num_threads(int(args.threads.split(",")[0]))
            gen_table, gen_rows = generation(args.generate, args.device, args.rounds, metric)
            path = append_rows(args.csv, gen_rows)
            print_table("greedy generation, ms per new token (median of rounds)",
                        ["model", "transformers", "ours", "ours no memo", "hf/ours", "no memo/ours", "same tokens"],
                        gen_table)
    print(f"rows appended to {path}")


if __name__ == "__main__":
    main()
