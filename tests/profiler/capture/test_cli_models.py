"""`python -m profiler models`: the zoo and hf: names capture accepts, in text and JSON, from the
same registries capture reads; without transformers the hf section says why it is off."""
import json

from profiler.capture import hf
from profiler.capture.spec import load_spec
from profiler.capture.zoo import zoo_models
from profiler.cli import main
from profiler.cli.models import catalog, render


def test_models_lists_the_registries(tmp_path, capsys):
    out = tmp_path / "models.json"
    assert main(["models", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    cat = json.loads(out.read_text())
    assert [m["name"] for m in cat["zoo"]] == sorted(zoo_models())
    assert all(m["sizes"] == list(zoo_models()[m["name"]].presets) for m in cat["zoo"])
    assert [m["name"] for m in cat["hf"]] == [f"hf:{n}" for n in sorted(hf.HF_MODELS)]
    assert [m["name"] for m in cat["hf_auto"]] == [f"hf:{n}" for n in hf.auto_model_types()]
    assert cat["hf_sizes"] == list(hf.HF_PRESETS) and cat["transformers"] is None
    for m in cat["zoo"] + cat["hf"] + cat["hf_auto"][:20]:
        assert m["name"] in text
    assert f"and {len(cat['hf_auto'])} more text LM model types" in text
    assert max(len(line) for line in text.splitlines()) <= 130
    # a listed auto name is a spec capture accepts
    assert type(load_spec(cat["hf_auto"][0]["name"], size="tiny").model).__name__


def test_models_json_to_stdout_and_without_transformers(monkeypatch, capsys):
    assert main(["models", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["zoo"]
    monkeypatch.setattr(hf.importlib.util, "find_spec", lambda name: None)
    cat = catalog()
    assert "optional package 'transformers' is not installed" in cat["transformers"]
    text = render(cat)
    assert "off: the optional package 'transformers'" in text and "more text LM model types" not in text
