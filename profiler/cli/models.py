"""`python -m profiler models [--json OUT|-]`: the model specs `capture` accepts by name.

The zoo (name, presets, what it is), the written-out `hf:` entries, and every other text LM
model_type transformers knows as `hf:TYPE` with the Auto class it gets (none without
transformers, and the reason). Local specs (`file.py:build`, `package.module:build`) are not
listed: they are whatever the user writes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from profiler.cli import register_command


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="OUT", help="also write the list as JSON to OUT ('-' for stdout only)")


def catalog() -> dict[str, Any]:
    """{"zoo": [...], "hf": [...], "hf_auto": [...], "hf_sizes": [...], "transformers": reason or None}."""
    from profiler.capture.hf import HF_MODELS, HF_PRESETS, auto_model_types, transformers_unavailable_reason
    from profiler.capture.zoo import zoo_models

    return {
        "zoo": [{"name": name, "sizes": list(entry.presets), "doc": entry.doc}
                for name, entry in sorted(zoo_models().items())],
        "hf": [{"name": f"hf:{name}", "doc": entry.doc} for name, entry in sorted(HF_MODELS.items())],
        "hf_auto": [{"name": f"hf:{name}", "head": head} for name, head in auto_model_types().items()],
        "hf_sizes": list(HF_PRESETS),
        "transformers": transformers_unavailable_reason(),
    }


def render(cat: dict[str, Any]) -> str:
    """The plain-text list `python -m profiler models` prints."""
    width = max(len(m["name"]) for m in cat["zoo"] + cat["hf"])
    lines = ["Zoo (written with plain PyTorch; --size picks a preset):"]
    lines += [f"  {m['name']:<{width}}  {'/'.join(m['sizes']):<18} {m['doc']}" for m in cat["zoo"]]
    lines += ["", f"Hugging Face transformers, random weights from a config (sizes {'/'.join(cat['hf_sizes'])}):"]
    if cat["transformers"]:
        lines.append(f"  off: {cat['transformers']}")
        return "\n".join(lines)
    lines += [f"  {m['name']:<{width}}  {m['doc']}" for m in cat["hf"]]
    auto = [m["name"] for m in cat["hf_auto"]]
    lines += ["", f"  and {len(auto)} more text LM model types, each from its default config shrunk to",
              "  the preset (most build and train; docs/capture.md has the last sweep):"]
    col = max(len(n) for n in auto) + 2 if auto else 1
    per_line = max(1, 100 // col)
    for i in range(0, len(auto), per_line):
        lines.append("  " + "".join(f"{n:<{col}}" for n in auto[i:i + per_line]).rstrip())
    return "\n".join(lines)


@register_command("models", "List the zoo and hf: model names capture accepts", _add_arguments)
def run(args: argparse.Namespace) -> int:
    cat = catalog()
    if args.json == "-":
        sys.stdout.write(json.dumps(cat, indent=2) + "\n")
        return 0
    print(render(cat))
    if args.json:
        Path(args.json).write_text(json.dumps(cat, indent=2))  # OSError: one line from the CLI's main
    return 0
