"""End to end in a real headless Chromium (Debian's, never a downloaded one): start the server,
upload a real trace through the file input, wait for the summary, take a screenshot."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.processes import wait_gone

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests" / "data" / "traces" / "tracelens_h100_bert_small.json.gz"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run"]

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serve(data_dir: Path):
    """A fresh streamlit server on a free port (data under `data_dir`); yields its URL."""
    port = _free_port()
    env = dict(os.environ, FUSIONLENS_DATA_DIR=str(data_dir))
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--server.headless", "true"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).read() == b"ok":
                break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("streamlit did not become healthy: " + proc.stdout.read().decode()[-2000:])
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def shoot(page, path: Path) -> None:
    """Full-page screenshot of a Streamlit page. Streamlit scrolls inside its main section, so
    full_page alone stops at the viewport: grow the viewport to the content's height first."""
    js = ("Math.max(...[...document.querySelectorAll('[data-testid=stMain], [data-testid=stMainBlockContainer]')]"
          ".map(e => e.scrollHeight))")
    for _ in range(4):  # late-drawn tables grow the page: repeat until the height holds
        height = min(max(int(page.evaluate(js)) + 80, 1000), 6000)
        if height == page.viewport_size["height"]:
            break
        page.set_viewport_size({"width": page.viewport_size["width"], "height": height})
        page.wait_for_timeout(700)
    path.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(path), full_page=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with _serve(tmp_path_factory.mktemp("data")) as url:
        yield url


def test_upload_shows_summary(server, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(server)
        page.get_by_text("Load a trace").first.wait_for(timeout=60_000)
        page.locator("input[type=file]").set_input_files(str(TRACE))
        page.get_by_text("Top kernels by total time").wait_for(timeout=90_000)
        # an upload reruns the script; wait for the settled page rather than counting mid-rerun
        page.get_by_text("Kernel time", exact=True).first.wait_for(timeout=30_000)
        values = page.locator('[data-testid="stMetricValue"]')
        values.first.wait_for(timeout=30_000)
        assert "60" in values.all_inner_texts()  # the trace's 60 kernels (raw JSON: 60 `kernel` events)
        assert page.locator("text=Traceback").count() == 0 and page.get_by_test_id("stException").count() == 0
        shoot(page, ROOT / "tests" / "app" / "screenshots" / "load.png")
        browser.close()


@pytest.mark.parametrize("packed", [False, True], ids=["two_files", "one_tgz"])
def test_two_files_upload_as_two_ranks(server, tmp_path, packed):
    """Several files in one upload (or one .tgz of them) become one Trace with a rank each; these two
    come from different runs (A100 rank 0, V100 rank 1, unrelated clocks), so the page warns and
    tabulates the ranks."""
    import tarfile

    from playwright.sync_api import sync_playwright

    pair = [TRACE.parent / "hta_a100_rank0of2_nccl_data.json.gz", TRACE.parent / "hta_v100_rank1of2_trace_diff_test.json.gz"]
    if packed:
        with tarfile.open(tmp_path / "run.tgz", "w:gz") as tf:
            for rank, path in enumerate(pair):
                tf.add(path, arcname=f"run/rank{rank}.json.gz")
        pair = [tmp_path / "run.tgz"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(server)
        page.get_by_text("Load a trace").first.wait_for(timeout=60_000)
        page.locator("input[type=file]").set_input_files([str(p) for p in pair])
        page.get_by_text("never overlap in time").first.wait_for(timeout=120_000)
        page.get_by_text("Top kernels by total time").wait_for(timeout=60_000)
        page.wait_for_timeout(300)  # read the settled page, not one mid-rerun
        page.get_by_test_id("stStatusWidget").wait_for(state="hidden", timeout=60_000)
        labels = page.locator('[data-testid="stMetricLabel"]').all_inner_texts()
        values = page.locator('[data-testid="stMetricValue"]').all_inner_texts()
        metrics = dict(zip((label.strip() for label in labels), values))
        assert metrics.get("Ranks") == "2", (labels, values)
        assert metrics["Kernels"] == "12,576"  # 2,700 + 9,876 `kernel` events in the two raw files (README table)
        assert page.get_by_test_id("stException").count() == 0
        shoot(page, ROOT / "tests" / "app" / "screenshots" / f"load_two_ranks{'_tgz' if packed else ''}.png")
        browser.close()


def _profile_page(browser, server: str, height: int):
    """A new page on the Profile page, entered through the router as a user does (a deep link into
    a fresh server runs the pages/ folder's scripts Streamlit's MPA-v1 way until app.py's
    st.navigation has run once), once its Sources table is drawn."""
    page = browser.new_page(viewport={"width": 1400, "height": height})
    page.goto(server)
    page.get_by_test_id("stSidebarNav").get_by_text("Profile a model").click()
    page.get_by_text("Sources", exact=True).first.wait_for(timeout=60_000)
    return page


def test_profile_page_runs_a_tiny_zoo_model(server):
    import re

    from playwright.sync_api import expect, sync_playwright

    def settle() -> None:  # a widget change reruns the script: wait until it has finished
        page.wait_for_timeout(300)
        page.get_by_test_id("stStatusWidget").wait_for(state="hidden", timeout=60_000)

    def pick(label: str, option: str) -> None:
        box = page.get_by_role("combobox", name=label)
        box.click()
        page.get_by_role("option", name=re.compile("^" + re.escape(option))).first.click()
        expect(box).to_have_value(re.compile("^" + re.escape(option)), timeout=30_000)
        settle()

    def number(label: str, value: int) -> None:
        box = page.get_by_label(label)
        box.fill(str(value))
        box.press("Enter")
        expect(box).to_have_value(str(value), timeout=30_000)
        settle()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = _profile_page(browser, server, height=2600)
        page.get_by_text("device is cpu (NVML samples NVIDIA GPUs only)").first.wait_for(timeout=60_000)  # Sources
        settle()
        pick("Zoo model", "mlp")
        pick("Size", "tiny")
        pick("Roofline ceilings", "quick")
        number("Wait steps (unprofiled)", 0)
        number("Active steps (kept)", 1)
        page.get_by_role("button", name="Profile", exact=True).click()
        page.get_by_text("Roofline: top 15 op types by headroom").wait_for(timeout=120_000)
        page.get_by_text("captured: mlp (tiny), cpu/float32, train, 1 active step(s)").wait_for(timeout=30_000)
        page.get_by_test_id("stMetricLabel").filter(has_text="Profiled steps").wait_for(timeout=30_000)
        settle()
        labels = page.locator('[data-testid="stMetricLabel"]').all_inner_texts()
        values = page.locator('[data-testid="stMetricValue"]').all_inner_texts()
        metrics = dict(zip(labels, values))
        assert metrics.get("Profiled steps") == "1", metrics
        assert re.fullmatch(r"[\d.,]+ ms", metrics["Median step time"])
        assert int(metrics["CPU ops"].replace(",", "")) > 0
        assert metrics["FLOPs pass joined"] == "100.0%", metrics
        assert re.fullmatch(r"[\d.]+ s", metrics["Capture time"]), metrics  # all nine drawn
        assert page.locator("text=Traceback").count() == 0
        shoot(page, ROOT / "tests" / "app" / "screenshots" / "profile.png")
        browser.close()


def test_stop_ends_a_hanging_capture_and_the_next_one_runs(server, tmp_path):
    """A local spec whose build() never returns: the status widget's Stop ends the run within a
    couple of seconds, the capture's process is gone, and the next capture is not refused as
    "another capture is running" (the heartbeat of profiler/capture/isolated.py)."""
    import re

    from playwright.sync_api import sync_playwright

    pid_file = tmp_path / "pid"
    spec = tmp_path / "hangs.py"
    spec.write_text("import os, time\n\ndef build():\n"
                    f"    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n    time.sleep(600)\n")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = _profile_page(browser, server, height=1600)
        page.get_by_text("Local spec").click()
        page.get_by_test_id("stStatusWidget").wait_for(state="hidden", timeout=60_000)
        box = page.get_by_role("textbox", name="Model spec")
        box.fill(f"{spec}:build")
        box.press("Enter")
        page.wait_for_timeout(300)
        page.get_by_test_id("stStatusWidget").wait_for(state="hidden", timeout=60_000)
        page.get_by_role("button", name="Profile", exact=True).click()
        deadline = time.time() + 60
        while not pid_file.exists() and time.time() < deadline:
            time.sleep(0.2)
        pid = int(pid_file.read_text())
        page.get_by_test_id("stStatusWidget").get_by_role("button", name="Stop").click()
        page.get_by_test_id("stStatusWidget").wait_for(state="hidden", timeout=30_000)
        assert wait_gone(pid, 10)
        page.get_by_text("Built-in zoo model").click()
        page.get_by_test_id("stStatusWidget").wait_for(state="hidden", timeout=60_000)
        page.get_by_role("button", name="Profile", exact=True).click()
        page.get_by_text(re.compile(r"^captured: bert \(small\)")).wait_for(timeout=120_000)  # the first zoo model
        assert page.locator("text=another capture is running").count() == 0
        browser.close()


def test_deep_link_on_a_fresh_server_goes_through_the_router(tmp_path):
    """Streamlit serves a first deep link the MPA-v1 way (pages/ exists): the page must still get
    app.py's navigation (only the registered pages, never pages/state.py) and page config."""
    from playwright.sync_api import sync_playwright

    with _serve(tmp_path) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url + "/profile")
        page.get_by_text("Sources", exact=True).first.wait_for(timeout=60_000)
        nav = page.get_by_test_id("stSidebarNav").inner_text().split("\n")
        assert [line for line in nav if line.strip()] == ["📂", "Load", "🧪", "Profile a model"]
        assert page.url.endswith("/profile") and page.title() == "FusionLens"
        browser.close()
