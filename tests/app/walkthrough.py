"""Look at the Load page as a user would: upload every bundled trace and some bad files in a real
headless Chromium, and write one full-page screenshot plus the page's text per upload.

Not a test (it asserts nothing); a helper for looking. Run from the repo root:

    .venv/bin/python -m tests.app.walkthrough OUT_DIR [NAME_SUBSTRING ...]          # Load page
    .venv/bin/python -m tests.app.walkthrough profile OUT_DIR [NAME_SUBSTRING ...]  # Profile page

The server and the browser are started here and stopped on exit (one of each at a time).
"""
from __future__ import annotations

import gzip
import json
import re
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from tests.app.test_browser import CHROMIUM, FLAGS, ROOT, _serve, shoot

TRACES = ROOT / "tests" / "data" / "traces"


def bad_inputs(folder: Path) -> list[tuple[str, list[Path]]]:
    """(label, files) for the bad uploads: empty, truncated gzip, JSON that is not a trace."""
    empty = folder / "empty.json"
    empty.write_bytes(b"")
    raw = (TRACES / "tracelens_h100_bert_small.json.gz").read_bytes()
    truncated = folder / "truncated.json.gz"
    truncated.write_bytes(raw[: len(raw) // 2])
    not_trace = folder / "not_a_trace.json"
    not_trace.write_text(json.dumps({"hello": [1, 2, 3]}))
    garbage = folder / "garbage.json.gz"
    garbage.write_bytes(gzip.compress(b"this is not json at all"))
    good_zip = folder / "bert_small.zip"
    with zipfile.ZipFile(good_zip, "w") as z:
        z.writestr("bert_small.json", gzip.decompress(raw))
    slip = folder / "slip.zip"
    with zipfile.ZipFile(slip, "w") as z:
        z.writestr("../../evil.json", gzip.decompress(raw))
    pair_tgz = folder / "pair.tgz"  # two ranks in one .tgz, as a run's folder is often shared
    with tarfile.open(pair_tgz, "w:gz") as tf:
        for rank, name in enumerate(("hta_a100_rank0of2_nccl_data", "hta_v100_rank1of2_trace_diff_test")):
            tf.add(TRACES / f"{name}.json.gz", arcname=f"run/rank{rank}.json.gz")
    other_tool = folder / "jax.trace.json"  # a Chrome trace of another tool: no Kineto category
    other_tool.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "pid": 1, "tid": 1, "name": "fusion.12", "ts": 1000.5, "dur": 12.25},
        {"ph": "X", "pid": 2, "tid": 7, "cat": "XLA Ops", "name": "PjitFunction(step)", "ts": 990, "dur": 100}]}))
    doc = json.loads(gzip.decompress(raw))  # a Kineto trace holding events of kinds no column models
    doc["traceEvents"] += [{"ph": "X", "cat": "xpu_runtime", "name": "zeLaunch", "pid": 1, "tid": 1,
                            "ts": doc["traceEvents"][5]["ts"], "dur": 2}] * 3 + [{"ph": "B", "name": "b", "pid": 1,
                                                                              "tid": 1, "ts": 1}]
    unread = folder / "bert_with_unread.json"
    unread.write_text(json.dumps(doc))
    return [("empty", [empty]), ("truncated", [truncated]), ("not_a_trace", [not_trace]),
            ("garbage_gz", [garbage]), ("zip_one_trace", [good_zip]), ("zip_slip", [slip]),
            ("tgz_two_ranks", [pair_tgz]), ("other_tool_trace", [other_tool]), ("unread_kinds", [unread])]


def cases(folder: Path) -> list[tuple[str, list[Path]]]:
    """Every bundled trace alone, the 2-rank pair together, then the bad inputs."""
    out = [(p.name.split(".json")[0], [p]) for p in sorted(TRACES.glob("*.json.gz"))]
    pair = [TRACES / "hta_a100_rank0of2_nccl_data.json.gz", TRACES / "hta_v100_rank1of2_trace_diff_test.json.gz"]
    out.append(("pair_rank0_rank1", pair))
    return out + bad_inputs(folder)


def walk(out_dir: Path, only: list[str]) -> None:
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, _serve(Path(tmp)) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        for label, files in cases(Path(tmp)):
            if only and not any(s in label for s in only):
                continue
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.get_by_text("Load a trace").first.wait_for(timeout=60_000)
            page.locator("input[type=file]").set_input_files([str(f) for f in files])
            page.wait_for_timeout(1500)
            page.get_by_test_id("stStatusWidget").wait_for(state="hidden", timeout=180_000)
            page.wait_for_timeout(1000)
            shoot(page, out_dir / f"{label}.png")
            (out_dir / f"{label}.txt").write_text(page.get_by_test_id("stMain").inner_text())
            print(label, "done", flush=True)
            page.close()
        browser.close()


def _settle(page) -> None:
    page.wait_for_timeout(400)
    page.get_by_test_id("stStatusWidget").wait_for(state="hidden", timeout=180_000)


def _pick(page, label: str, option: str) -> None:
    page.get_by_role("combobox", name=label).click()
    page.keyboard.type(option)  # filters long lists (the hf: models), whose options render lazily
    page.get_by_role("option", name=re.compile("^" + re.escape(option))).first.click()
    _settle(page)


def _number(page, label: str, value: int) -> None:
    box = page.get_by_label(label, exact=True).and_(page.get_by_test_id("stNumberInputField"))
    box.fill(str(value))
    box.press("Enter")
    _settle(page)


def profile_walk(out_dir: Path, only: list[str]) -> None:
    """Profile page: zoo captures in infer and train (a shot while running), then bad local specs."""
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, _serve(Path(tmp)) as url, sync_playwright() as pw:
        raising = Path(tmp) / "raises.py"
        raising.write_text("def build():\n    raise ValueError('bad config 42')\n")
        compiled = Path(tmp) / "compiled.py"  # the profile shows the compiled graph, the join is partial
        compiled.write_text("import torch\n\ndef build():\n    m = torch.nn.Sequential(torch.nn.Linear(64, 256), "
                            "torch.nn.GELU(), torch.nn.Linear(256, 64), torch.nn.LayerNorm(64))\n"
                            "    return torch.compile(m), (torch.randn(32, 64),)\n")
        noop = Path(tmp) / "noop.py"  # runs no tensor op: the roofline says so instead of a chart
        noop.write_text("import torch\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return 3\n\n"
                        "def build():\n    return M(), (torch.zeros(2),)\n")
        nan = Path(tmp) / "nan.py"  # a NaN weight: the capture works and says its steps ran on NaN
        nan.write_text("import torch\n\ndef build():\n    m = torch.nn.Linear(64, 64)\n    with torch.no_grad():\n"
                       "        m.weight[0, 0] = float('nan')\n    return m, (torch.randn(32, 64),)\n")
        hog = Path(tmp) / "hog.py"  # fills the machine's memory until the kernel's OOM killer ends the capture
        hog.write_text("import torch\n\ndef build():\n    held = []\n    while True:\n"
                       "        held.append(torch.ones(2**28))  # 1 GiB, touched\n")
        runs = [("zoo_infer", "gpt2-naive", "infer", None), ("zoo_train", "gpt2-naive", "train", None),
                ("zoo_medium_train", "gpt2-naive:medium", "train", None),  # long enough to see the progress bar
                ("zoo_amp_fp16_train", "gpt2-naive:tiny", "train", None),  # autocast fp16 + GradScaler, fp32 weights
                ("ddp_train", "mlp:tiny", "train", None),  # Ranks 2: a real gloo DDP run from the server
                ("hf_auto_train", "hf:mistral:tiny", "train", None),  # a model_type beyond the written-out three
                ("hf_blt_train", "hf:blt", "train", None),  # four models in one (byte encoder, global, decoder, patcher)
                ("hf_musicgen_infer", "hf:musicgen:tiny", "infer", None),  # a decoder over 4 codebooks, in inference
                ("hf_git_train", "hf:git:tiny", "train", None),  # an image captioner: pixels beside the tokens
                ("missing_spec", None, "infer", "no/such/file.py:build"),
                ("raising_spec", None, "infer", f"{raising}:build"),
                ("out_of_memory_spec", None, "infer", f"{hog}:build"),  # the server lives on: the next cases run
                ("compiled_spec", None, "train", f"{compiled}:build"),
                ("noop_model", None, "infer", f"{noop}:build"),
                ("nan_weights", None, "train", f"{nan}:build")]
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        for label, zoo, mode, spec in runs:
            if only and not any(s in label for s in only):
                continue
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.get_by_test_id("stSidebarNav").get_by_text("Profile a model").click()
            page.get_by_text("Sources", exact=True).first.wait_for(timeout=60_000)
            _settle(page)
            if zoo and zoo.startswith("hf:"):
                name, _, size = zoo.removeprefix("hf:").partition(":")
                page.get_by_text("Hugging Face config").click()
                _settle(page)
                _pick(page, "hf: model", name)
                _pick(page, "Size", size or "small")
            elif zoo:
                name, _, size = zoo.partition(":")
                _pick(page, "Zoo model", name)
                _pick(page, "Size", size or "small")
            else:
                page.get_by_text("Local spec").click()
                _settle(page)
                box = page.get_by_role("textbox", name="Model spec")
                box.fill(spec)
                box.press("Enter")
                _settle(page)
            page.get_by_text(mode, exact=False).filter(has_text=re.compile("^" + mode)).first.click()
            _settle(page)
            _pick(page, "Roofline ceilings", "quick")
            if "medium" in label:
                _number(page, "Active steps (kept)", 10)
            if label.startswith("ddp"):
                _number(page, "Ranks (DDP)", 2)
            if "amp_fp16" in label:
                _pick(page, "autocast (AMP)", "float16")
            page.get_by_role("button", name="Profile", exact=True).click()
            try:  # catch the progress bar while the capture runs (a tiny one may finish first)
                page.get_by_test_id("stProgress").wait_for(timeout=5_000)
                page.wait_for_timeout(700)
            except Exception:  # noqa: BLE001 - playwright's TimeoutError; the shot is taken either way
                pass
            shoot(page, out_dir / f"{label}_running.png")
            _settle(page)
            if "spec" not in label or label == "compiled_spec":  # a capture that should succeed
                page.get_by_text("Profiled steps").first.wait_for(timeout=300_000)
            else:  # its error line (the out-of-memory case takes ~30 s to fill the machine)
                page.get_by_test_id("stAlertContentError").first.wait_for(timeout=300_000)
            page.wait_for_timeout(500)
            shoot(page, out_dir / f"{label}.png")
            (out_dir / f"{label}.txt").write_text(page.get_by_test_id("stMain").inner_text())
            if zoo and not label.startswith("ddp"):
                _roofline_hover(page, out_dir / f"{label}_roofline_hover.png")
            print(label, "done", flush=True)
            page.close()
        browser.close()


def _roofline_hover(page, path: Path) -> None:
    """Shot of the roofline chart with the hover label of its largest compute-bound op type open."""
    chart = page.locator(".js-plotly-plot").first
    chart.scroll_into_view_if_needed()
    points = chart.locator(".scatterlayer .trace").last.locator("path.point")
    sizes = [float(box["width"]) if (box := points.nth(i).bounding_box()) else 0.0 for i in range(points.count())]
    if sizes:
        points.nth(sizes.index(max(sizes))).hover(force=True)
        page.wait_for_timeout(500)
    chart.screenshot(path=str(path))


if __name__ == "__main__":
    if sys.argv[1] == "profile":
        profile_walk(Path(sys.argv[2]), sys.argv[3:])
    else:
        walk(Path(sys.argv[1]), sys.argv[2:])
