"""`python -m kernels`: the fused kernels, which providers can run them on this machine, and why not.

    python -m kernels [list] [--json OUT|-] [--no-build]
    python -m kernels decisions [--json OUT|-]
    python -m kernels forget

`list` (the default) lists every provider (available, or the reason it is off: no compiler, no
Triton, no GPU, ...) and every registered kernel (its providers, dtypes, devices). Probing the
`cpu` provider builds the C++ extension the first time (about 45 s on 2 cores, with a progress
line on stderr); `--no-build` skips that probe. `decisions` shows the measured provider choices
stored for this machine and build (kernel, threads, pass, shape class, the pick and each
provider's time); `forget` drops them, so the next calls measure anew. Exit status 0, or 2 on
bad arguments or an unwritable --json file.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

import kernels  # noqa: F401  (registers every kernel family)
from kernels import tuning, tuning_store
from kernels.registry import KERNELS, PROVIDER_ORDER, provider_unavailable_reason

NOT_PROBED = "not probed (--no-build)"
DISPLAY_ORDER = ("cpu", "triton", "aten", "reference")


def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def inventory(build: bool = True) -> dict[str, Any]:
    """{"providers": {name: {"available", "reason"}}, "kernels": [...]}: the JSON of `list`."""
    providers: dict[str, dict[str, Any]] = {}
    known = {p for order in PROVIDER_ORDER.values() for p in order}
    names = [p for p in DISPLAY_ORDER if p in known] + sorted(known - set(DISPLAY_ORDER))
    for name in names:
        reason = NOT_PROBED if (name == "cpu" and not build) else provider_unavailable_reason(name)
        providers[name] = {"available": reason is None, "reason": reason}
    rows = []
    for name, spec in sorted(KERNELS.items()):
        rows.append({"name": name, "providers": [p for p in names if p in spec.providers or p == "reference"],
                     "dtypes": [_dtype_name(d) for d in spec.supports.dtypes],
                     "devices": list(spec.supports.devices), "description": spec.description})
    return {"providers": providers, "kernels": rows, "allocation": allocation()}


def allocation() -> dict[str, Any]:
    """How large CPU kernel outputs are allocated here: the output pool and huge-page advice."""
    from kernels import _alloc

    pool, huge = _alloc.pool_status(), _alloc.hugepage_status()
    return {"output_pool": {"on": pool is None, "reason": pool, "cap_bytes": _alloc.pool_cap_bytes(),
                            "min_bytes": _alloc.POOL_MIN_BYTES},
            "hugepages": {"on": huge is None, "reason": huge}}


def render(inv: dict[str, Any]) -> str:
    """The plain-text tables `python -m kernels` prints."""
    lines = ["Providers on this machine:"]
    for name, p in inv["providers"].items():
        lines.append(f"  {name:<10} {'available' if p['available'] else 'off: ' + p['reason']}")
    usable = {n for n, p in inv["providers"].items() if p["available"]}
    lines += ["", f"Kernels ({len(inv['kernels'])}); a provider in [brackets] is off here:"]
    width = max(len(k["name"]) for k in inv["kernels"])
    for k in inv["kernels"]:
        provs = ", ".join(p if p in usable else f"[{p}]" for p in k["providers"])
        lines.append(f"  {k['name']:<{width}}  {provs:<34} {'/'.join(k['devices']):<9} {', '.join(k['dtypes'])}")
        if k["description"]:
            lines.append(f"  {'':<{width}}  {k['description']}")
    alloc = inv.get("allocation")
    if alloc:
        pool, huge = alloc["output_pool"], alloc["hugepages"]
        lines += ["", f"CPU outputs of {pool['min_bytes'] >> 20} MiB or more: output pool "
                  + (f"on (keeps up to {pool['cap_bytes'] / 2**20:.0f} MiB idle)" if pool["on"] else f"off: {pool['reason']}")
                  + "; huge-page advice " + ("on" if huge["on"] else f"off: {huge['reason']}")]
    return "\n".join(lines)


def _devices() -> list[torch.device]:
    """The device types decisions are kept for here: the CPU, and the GPU when there is one."""
    return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


def decisions() -> dict[str, Any]:
    """{"file", "decisions": [...]}: the measured choices stored for this machine and build."""
    rows = []
    for device in _devices():
        for key, rec in tuning.stored_decisions(device).items():
            kernel, dev, threads, mode, inputs = (key.split("|", 4) + [""] * 5)[:5]
            rows.append({"kernel": kernel, "device": dev, "threads": threads, "pass": mode, "inputs": inputs,
                         "provider": rec["provider"], "times_us": rec["times_us"],
                         "decided_at": rec.get("decided_at", ""), "note": rec.get("note", ""), "key": key})
    return {"file": str(tuning_store.store_path()), "decisions": rows}


def render_decisions(dec: dict[str, Any]) -> str:
    """The plain-text table `python -m kernels decisions` prints."""
    rows = dec["decisions"]
    if not rows:
        return (f"No measured provider choices stored for this machine and build ({dec['file']}): "
                f"the first call of a kernel for a shape class measures one.")
    lines = [f"Measured provider choices for this machine and build ({len(rows)}, {dec['file']}):"]
    width = max(len(r["kernel"]) for r in rows)
    for r in rows:
        times = "  ".join(f"{p} {t / 1e3:.3g} ms" for p, t in sorted(r["times_us"].items(), key=lambda kv: kv[1]))
        lines.append(f"  {r['kernel']:<{width}}  {r['device']} {r['threads']:<3} {r['pass']:<7} -> {r['provider']:<9}"
                     f"  {times}  ({r['decided_at']})")
        lines.append(f"  {'':<{width}}  {r['inputs']}" + (f"; {r['note']}" if r["note"] else ""))
    return "\n".join(lines)


def _emit(payload: dict[str, Any], text: str, out: str | None) -> int:
    """Print `text` (or only the JSON for --json -), and write the JSON to `out` if given."""
    if out == "-":
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return 0
    print(text)
    if out:
        try:
            Path(out).write_text(json.dumps(payload, indent=2))
        except OSError as exc:
            print(f"python -m kernels: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels", description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs="?", default="list", choices=["list", "decisions", "forget"])
    ap.add_argument("--json", metavar="OUT", help="also write the result as JSON to OUT ('-' for stdout only)")
    ap.add_argument("--no-build", action="store_true", help="do not probe the cpu provider (no C++ build)")
    args = ap.parse_args(argv)
    if args.command == "decisions":
        dec = decisions()
        return _emit(dec, render_decisions(dec), args.json)
    if args.command == "forget":
        dropped = sum(tuning.drop_stored_decisions(device) for device in _devices())
        print(f"forgot {dropped} measured provider choice(s) of this machine and build "
              f"({tuning_store.store_path()}); the next calls measure anew")
        return 0
    inv = inventory(build=not args.no_build)
    return _emit(inv, render(inv), args.json)


if __name__ == "__main__":
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `python -m kernels | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)
