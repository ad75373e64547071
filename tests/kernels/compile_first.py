"""Run each kernel family under torch.compile(fullgraph=True) as the first call of a fresh process.

`python -m tests.kernels.compile_first [--provider triton] [case ...]` prints one JSON object:
per case, whether it compiled without a graph break (and once only, over three calls), the
fusionlens ops in its forward and backward graphs, and the largest difference of its loss and
gradients against the eager reference composition. Run by
tests/kernels/test_compile.py in a subprocess: provider probes, the C++ extension's loading and
every cache must start empty, which a pytest process that has called the kernels before cannot
give.
"""
from __future__ import annotations

import json
import sys
from typing import Callable

import torch
from torch._dynamo.backends.common import aot_autograd

import kernels


def _cases(device: str = "cpu") -> tuple[dict[str, Callable[..., torch.Tensor]], list[torch.Tensor]]:
    """{name: fn(x, provider)}, and the parameters the cases share (their grads are compared too)."""
    g = torch.Generator().manual_seed(0)

    def leaf(t: torch.Tensor) -> torch.Tensor:
        return t.to(device).requires_grad_()

    w, b = leaf(torch.rand(64, generator=g) + 0.5), leaf(torch.randn(64, generator=g))
    cos, sin = torch.randn(8, 64, generator=g).to(device), torch.randn(8, 64, generator=g).to(device)
    target = torch.randint(0, 50, (32,), generator=g)
    target[3] = -100  # an ignored row
    target = target.to(device)
    vocab = leaf(torch.randn(50, 64, generator=g).div(8))  # [V, H]
    return {
        "layer_norm": lambda x, p=None: kernels.layer_norm(x, w, b, 1e-5, provider=p),
        "rms_norm": lambda x, p=None: kernels.rms_norm(x, w, 1e-6, offset=1.0, provider=p),
        "add_layer_norm": lambda x, p=None: kernels.add_layer_norm(x, x.cos(), w, b, 1e-5, provider=p)[1],
        "add_rms_norm": lambda x, p=None: kernels.add_rms_norm(x, x.cos(), w, 1e-5, provider=p)[1],
        "gelu": lambda x, p=None: kernels.gelu(x, approximate="tanh", provider=p),
        "bias_gelu": lambda x, p=None: kernels.bias_gelu(x, b, provider=p),
        "swiglu": lambda x, p=None: kernels.swiglu(x, x.cos(), provider=p),
        "geglu": lambda x, p=None: kernels.geglu(x, x.cos(), provider=p),
        "softmax": lambda x, p=None: kernels.softmax(x, scale=0.5, causal=True, provider=p),
        "rope": lambda x, p=None: kernels.rope(x.view(4, 1, 8, 64), x.cos().view(4, 1, 8, 64), cos, sin, provider=p)[0],
        "cross_entropy": lambda x, p=None: kernels.cross_entropy(x.reshape(32, 64)[:, :50], target, provider=p),
        "fused_linear_cross_entropy": lambda x, p=None: kernels.fused_linear_cross_entropy(
            x.reshape(32, 64), vocab, target, chunk_size=8, provider=p),
    }, [w, b, vocab]


def _fusionlens_ops(gm: torch.fx.GraphModule) -> list[str]:
    """Names of the fusionlens ops a graph calls, also through auto_functionalized wrappers."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        targets = [node.target, *(a for a in node.args if isinstance(a, torch._ops.OpOverload))]
        found += [t._schema.name.split("::")[1] for t in targets
                  if isinstance(t, torch._ops.OpOverload) and t.namespace == "fusionlens"]
    return found


def _grads(loss: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor | None]:
    return list(torch.autograd.grad(loss, inputs, allow_unused=True))


def run_case(fn: Callable[..., torch.Tensor], params: list[torch.Tensor], provider: str | None = None,
             device: str = "cpu", fullgraph: bool = True) -> dict:
    """Compile fn(x, provider) (+ a sin and a sum, so every output element matters) and compare
    loss and grads with fn(x, "reference") run eagerly."""
    graphs: dict[str, list[str]] = {"forward": [], "backward": []}
    compiles = {"forward": 0, "backward": 0}

    def keep(kind: str):
        def compiler(gm: torch.fx.GraphModule, _inputs) -> Callable:
            compiles[kind] += 1
            if compiles[kind] == 1:
                graphs[kind] += _fusionlens_ops(gm)
            return gm.forward
        return compiler

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))
    x = torch.randn(4, 8, 64, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_()
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: fn(t, provider).float().sin().sum(), fullgraph=fullgraph, backend=backend)
    try:
        loss = compiled(x)
        grads = _grads(loss, [x, *params])
        for _ in range(2):  # the same call again: nothing the first one left behind may recompile
            _grads(compiled(x), [x, *params])
    except Exception as exc:  # noqa: BLE001 (reported; a graph break raises under fullgraph=True)
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"}
    x_ref = x.detach().clone().requires_grad_()
    want = fn(x_ref, "reference").float().sin().sum()
    wants = _grads(want, [x_ref, *params])
    if [g is None for g in grads] != [g is None for g in wants]:
        return {"ok": False, "error": "compiled and eager differ in which inputs get a gradient"}
    diffs = [(g - e).abs().max().item() for g, e in zip(grads, wants) if g is not None]
    return {"ok": True, "ops": graphs, "compiles": compiles, "loss_diff": abs(loss.item() - want.item()),
            "loss": want.item(), "grad_diff": max(diffs), "grads": len(diffs)}


def main(argv: list[str]) -> None:
    """Args: [--provider NAME] [case ...]; the provider is the order's choice unless named."""
    provider = None
    if argv[:1] == ["--provider"]:
        provider, argv = argv[1], argv[2:]
    cases, params = _cases()
    print(json.dumps({name: run_case(cases[name], params, provider) for name in argv or cases}))


if __name__ == "__main__":
    main(sys.argv[1:])
