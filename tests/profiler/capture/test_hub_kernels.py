"""Hugging Face's `kernels` distribution installed beside FusionLens's own `kernels` package:
transformers models still build (the hub integration is turned off, as when it is absent)."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[3]


def _python(code: str, site: Path) -> subprocess.CompletedProcess:
    """Run `code` with FusionLens first on the path and `site` (fake dist-info) after it."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}:{site}", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.fixture
def hub_kernels_installed(tmp_path):
    """A folder holding only the metadata of the hub `kernels` version transformers supports:
    what `pip install kernels` leaves that transformers looks at (its files are never reached,
    FusionLens's package comes first on the path)."""
    from transformers.utils.import_utils import KERNELS_MIN_VERSION

    info = tmp_path / f"kernels-{KERNELS_MIN_VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: kernels\nVersion: {KERNELS_MIN_VERSION}\n")
    (info / "RECORD").write_text("")
    return tmp_path, KERNELS_MIN_VERSION


def test_the_clash_is_real_without_the_guard(hub_kernels_installed):
    site, _ = hub_kernels_installed
    proc = _python("import transformers.models.llama.modeling_llama", site)
    assert proc.returncode != 0 and "from 'kernels'" in proc.stderr, proc.stderr[-1500:]


def test_hf_and_file_specs_build_beside_hub_kernels(hub_kernels_installed, tmp_path):
    site, version = hub_kernels_installed
    spec = tmp_path / "my_llama.py"
    spec.write_text(textwrap.dedent("""
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        def build():
            cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1)
            ids = torch.randint(0, 64, (2, 8))
            return LlamaForCausalLM(cfg), {"input_ids": ids, "labels": ids}
        """))
    proc = _python(f"""
        from profiler.capture.hub_kernels import shadowed_hub_kernels
        from profiler.capture.spec import load_spec
        assert shadowed_hub_kernels() == {version!r}, shadowed_hub_kernels()
        for spec in ("hf:llama", "hf:mistral", {str(spec) + ':build'!r}):
            loaded = load_spec(spec, size="tiny")
            out = loaded.model(**loaded.inputs)
            assert out.loss.isfinite(), spec
        import kernels
        assert hasattr(kernels, "rms_norm")  # FusionLens's package is still the one imported
        import transformers.modeling_utils as mu
        assert mu.is_kernels_available() is False  # the copy a model module imported by name too
        print("built")
        """, site)
    assert proc.returncode == 0 and "built" in proc.stdout, proc.stderr[-2000:]


def test_nothing_changes_without_a_clash():
    from profiler.capture.hub_kernels import keep_transformers_off_our_kernels, shadowed_hub_kernels

    assert shadowed_hub_kernels() is None
    import transformers.utils.import_utils as import_utils

    before = import_utils.is_kernels_available
    assert keep_transformers_off_our_kernels() is None
    assert import_utils.is_kernels_available is before
