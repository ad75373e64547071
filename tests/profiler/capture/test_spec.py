"""Model specs: every kind of bad spec is one line naming the spec and the cause."""
import textwrap

import pytest
import torch

from profiler.capture import hf
from profiler.capture.backends import CaptureError, CapturePlan
from profiler.capture.runner import capture, loss_of, prepare
from profiler.capture.spec import SpecError, load_spec, setting_item, setting_value
from profiler.errors import FusionLensError


def write(tmp_path, body, name="model_spec.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def one_line_error(spec, match, **kw):
    with pytest.raises(SpecError) as info:
        load_spec(spec, **kw)
    msg = str(info.value)
    assert "\n" not in msg and spec in msg, msg
    assert match in msg, msg
    return msg


def test_missing_file(tmp_path):
    one_line_error(f"{tmp_path}/nope.py:build", "file not found")


def test_a_spec_under_home_takes_the_tilde(tmp_path, monkeypatch):
    """"~/model.py:build" (typed in the Profile page's field, or quoted on a command line) is the
    home folder's file, as a shell would read it; it was "file not found"."""
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path, """
        import torch
        def build():
            return torch.nn.Linear(3, 2), (torch.randn(4, 3),)
    """, name="home_model.py")
    assert load_spec("~/home_model.py:build").inputs[0].shape == (4, 3)
    one_line_error("~/nope.py:build", "file not found")


def test_import_error_and_syntax_error(tmp_path):
    bad = write(tmp_path, "import not_a_module_anywhere_xyz\n")
    one_line_error(f"{bad}:build", "ModuleNotFoundError")
    syntax = write(tmp_path, "def build(:\n", "broken.py")
    one_line_error(f"{syntax}:build", "SyntaxError")


def test_missing_function_and_wrong_returns(tmp_path):
    path = write(tmp_path, """
        import torch
        def build(): return torch.nn.Linear(2, 2)
        def not_module(): return 3, (torch.randn(2),)
        def no_tensor(): return torch.nn.Linear(2, 2), ("x",)
        def bad_inputs(): return torch.nn.Linear(2, 2), 5
    """)
    one_line_error(f"{path}:missing", "has no function 'missing'")
    one_line_error(f"{path}:build", "must return (model, inputs)")
    one_line_error(f"{path}:not_module", "expected torch.nn.Module")
    one_line_error(f"{path}:no_tensor", "no tensor")
    one_line_error(f"{path}:bad_inputs", "tuple of tensors or a dict")


def test_raising_build_and_oom(tmp_path):
    path = write(tmp_path, """
        def build(): raise ValueError("bad config\\nsecond line")
        def huge(): raise MemoryError("cannot allocate 1 TB")
    """)
    one_line_error(f"{path}:build", "ValueError: bad config second line")
    one_line_error(f"{path}:huge", "ran out of memory")


def test_step_failure_is_one_line(tmp_path):
    path = write(tmp_path, """
        import torch
        class Bad(torch.nn.Module):
            def __init__(self):
                super().__init__(); self.lin = torch.nn.Linear(4, 4)
            def forward(self, x): return self.lin(x) @ torch.randn(5, 5)
        def build(): return Bad(), (torch.randn(2, 4),)
    """)
    with pytest.raises(SpecError, match=r"the first \(unprofiled\) step raised RuntimeError") as info:
        capture(f"{path}:build", CapturePlan(wait=0, warmup=0, active=1), tmp_path / "out")
    assert "\n" not in str(info.value)


def test_dict_inputs_batch_and_module_spec(tmp_path, monkeypatch):
    path = write(tmp_path, """
        import torch
        class KW(torch.nn.Module):
            def __init__(self):
                super().__init__(); self.lin = torch.nn.Linear(3, 2)
            def forward(self, *, x, scale): return self.lin(x) * scale
        def build(batch=5):
            return KW(), {"x": torch.randn(batch, 3), "scale": torch.tensor(2.0)}
    """, "kwmodel.py")
    lm = load_spec(f"{path}:build", batch=7)
    assert lm.kind == "file" and lm.inputs["x"].shape == (7, 3)
    assert lm.call().shape == (7, 2)
    monkeypatch.syspath_prepend(str(tmp_path))
    lm = load_spec("kwmodel:build")
    assert lm.kind == "module" and lm.inputs["x"].shape == (5, 3)


def test_batch_and_settings_build_cannot_take_are_refused(tmp_path):
    """--batch / --set for a build() without such a parameter: one line, not silently ignored."""
    path = write(tmp_path, """
        import torch
        def build(): return torch.nn.Linear(2, 2), (torch.randn(3, 2),)
        def sized(batch=2, width=2): return torch.nn.Linear(width, 2), (torch.randn(batch, width),)
        def open_ended(**kw): return torch.nn.Linear(2, 2), (torch.randn(kw.get("batch", 1), 2),)
    """)
    one_line_error(f"{path}:build", "does not take 'batch' (its parameters: none)", batch=4)
    one_line_error(f"{path}:sized", "does not take 'depth' (its parameters: batch, width)", overrides={"depth": 3})
    assert load_spec(f"{path}:sized", batch=5, overrides={"width": 7}).inputs[0].shape == (5, 7)
    assert load_spec(f"{path}:open_ended", batch=6).inputs[0].shape == (6, 2)
    assert load_spec(f"{path}:build").inputs[0].shape == (3, 2)  # nothing asked, nothing refused


def test_batch_as_a_setting_is_the_batch(tmp_path):
    """`--set batch=3` (or batch=3 in the Profile page's settings) is the batch, as `--batch 3` is, for
    every kind of spec; both given and different is one line. (A zoo spec raised build_zoo()'s
    TypeError "got multiple values for keyword argument 'batch'".)"""
    path = write(tmp_path, """
        import torch
        def sized(batch=2): return torch.nn.Linear(4, 2), (torch.randn(batch, 4),)
    """)
    for spec, batch_of in [("mlp", lambda lm: lm.inputs[0].shape[0]),
                           (f"{path}:sized", lambda lm: lm.inputs[0].shape[0])]:
        assert batch_of(load_spec(spec, size="tiny", overrides={"batch": 3})) == 3
        assert batch_of(load_spec(spec, size="tiny", batch=3, overrides={"batch": 3})) == 3
        one_line_error(spec, "batch given twice, 2 and batch=3 in the settings; give one", size="tiny", batch=2,
                       overrides={"batch": 3})
    if hf.transformers_unavailable_reason() is None:
        one_line_error("hf:gpt2", "batch given twice", size="tiny", batch=2, overrides={"batch": 3})
        assert load_spec("hf:gpt2", size="tiny", overrides={"batch": 3}).inputs["input_ids"].shape[0] == 3


def test_nested_inputs_are_inputs(tmp_path):
    """A positional list of tensors (or a dict of them) is a model input, as HF's past_key_values are."""
    path = write(tmp_path, """
        import torch
        class Sum(torch.nn.Module):
            def __init__(self):
                super().__init__(); self.lin = torch.nn.Linear(4, 4)
            def forward(self, xs, extra): return sum(self.lin(x) for x in xs) + extra["b"]
        def build(): return Sum(), ([torch.randn(3, 4), torch.randn(3, 4)], {"b": torch.randn(4)})
        def only_lists(): return Sum(), ([1, 2], {"b": 3.0})
    """)
    lm = load_spec(f"{path}:build")
    assert lm.call().shape == (3, 4)
    result = capture(lm, CapturePlan(wait=0, warmup=0, active=1, dtype="float64"), tmp_path / "out")
    assert result.trace.events["name"].str.contains("addmm").any()
    one_line_error(f"{path}:only_lists", "no tensor")


def test_module_spec_errors():
    one_line_error("no_such_pkg_xyz.mod:build", "no module named")
    one_line_error("json:loads", "build() raised TypeError")


def test_unknown_zoo_and_settings():
    one_line_error("resnet9000", "not a zoo model")
    one_line_error("gpt2", "no setting wings", overrides={"wings": 2})
    one_line_error("gpt2", "no size", size="enormous")
    one_line_error("cnn", "no setting patch", overrides={"patch": 2})  # a ViT setting: the CNN has no patches
    assert load_spec("vit", size="tiny", overrides={"patch": 2}).model.embed.kernel_size == (2, 2)


def test_zoo_setting_of_the_wrong_type_names_the_setting():
    """`--set layers=abc` / `layers=2.5` used to fail inside the builder ("'float' object cannot be
    interpreted as an integer"); the config's field types are checked first."""
    one_line_error("gpt2", "setting layers must be an integer, got 'abc'", overrides={"layers": "abc"})
    one_line_error("gpt2", "setting layers must be an integer, got 2.5", overrides={"layers": 2.5})
    one_line_error("mlp", "setting hidden must be an integer, got True", overrides={"hidden": True})


def test_setting_values_typed_from_text():
    assert [setting_value(t) for t in ("4", " 0.5", "1e-3", "True", "false", "sdpa", "-2")] == \
        [4, 0.5, 1e-3, True, False, "sdpa", -2]


def test_cuda_requested_without_gpu_is_refused():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    lm = load_spec("mlp", size="tiny")
    with pytest.raises(CaptureError, match="no CUDA device") as info:
        prepare(lm, CapturePlan(device="cuda"))
    assert "\n" not in str(info.value)


def test_model_is_moved_to_the_requested_dtype():
    lm = prepare(load_spec("gpt2", size="tiny"), CapturePlan(dtype="float64"))
    assert {p.dtype for p in lm.model.parameters()} == {torch.float64}
    assert lm.inputs[0].dtype == torch.int64  # token ids keep their integer dtype


def test_loss_rules():
    class Out:
        loss = torch.tensor(3.0)

    assert loss_of(Out()).item() == 3.0
    assert loss_of(torch.tensor(2.0)).item() == 2.0
    assert loss_of((torch.tensor([1.0, 3.0]), torch.tensor(9.0))).item() == 2.0
    assert loss_of({"logits": torch.tensor([[4.0, 6.0]])}).item() == 5.0
    # a plain dict's "loss" is the loss, wherever it stands (not the mean of the logits before it)
    assert loss_of({"logits": torch.tensor([[4.0, 6.0]]), "loss": torch.tensor(0.5)}).item() == 0.5
    # a per-sample loss (reduction="none") trains its mean; backward() needs a scalar
    per_sample = torch.tensor([1.0, 2.0, 6.0], requires_grad=True)
    loss = loss_of({"loss": per_sample})
    assert loss.dim() == 0 and loss.item() == 3.0
    loss.backward()
    assert torch.equal(per_sample.grad, torch.full((3,), 1 / 3))
    assert loss_of(type("O", (), {"loss": torch.tensor([2.0, 4.0])})()).item() == 3.0
    with pytest.raises(TypeError, match=r"no floating-point tensor to train on \(only int64 tensors\)"):
        loss_of((torch.tensor([1, 2]),))
    with pytest.raises(TypeError, match=r"\(a str without tensors\)"):
        loss_of("text")


def test_hf_without_transformers_says_so(monkeypatch):
    monkeypatch.setattr(hf.importlib.util, "find_spec", lambda name: None)
    msg = one_line_error("hf:gpt2", "'transformers' is not installed")
    assert isinstance(SpecError(msg), FusionLensError)
    one_line_error("hf:nonexistent", "'nonexistent' is not one of bert, gpt2, llama, and other model types need transformers")


def test_hf_model_from_config_when_installed():
    pytest.importorskip("transformers")
    lm = load_spec("hf:llama", size="tiny")
    assert type(lm.model).__name__ == "LlamaForCausalLM"
    assert loss_of(lm.call()).dim() == 0
    # the loss type is the config's, so transformers does not warn "loss_type=None" on every step
    assert getattr(lm.model, "loss_type", "ForCausalLM") == "ForCausalLM"


def test_out_of_memory_in_a_step_is_one_line(tmp_path):
    path = write(tmp_path, """
        import torch
        class Greedy(torch.nn.Module):
            def __init__(self):
                super().__init__(); self.lin = torch.nn.Linear(2, 2)
            def forward(self, x):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        def build(): return Greedy(), (torch.randn(1, 2),)
    """, "greedy.py")
    with pytest.raises(SpecError, match="ran out of memory") as info:
        capture(f"{path}:build", CapturePlan(mode="infer", wait=0, warmup=0, active=1), tmp_path / "out")
    assert "\n" not in str(info.value) and "greedy.py:build" in str(info.value)


def test_setting_item_is_the_one_parser_of_the_cli_and_the_page():
    """`--set` and the Profile page's settings field parse each KEY=VALUE item the same way."""
    from pages.profile_view import ProfileInputError, parse_settings as page_settings
    from profiler.cli.capture import UsageError, parse_settings as cli_settings

    assert setting_item(" layers = 2 ") == ("layers", 2)
    assert setting_item("tie=False") == ("tie", False) and setting_item("act=gelu") == ("act", "gelu")
    items = ["layers=2", "lr=0.5", "name=x"]
    assert cli_settings(items) == page_settings(", ".join(items)) == {"layers": 2, "lr": 0.5, "name": "x"}
    for bad in ("layers", "=3", "2x=1", "a=", "a= "):
        with pytest.raises(ValueError, match="expected KEY=VALUE"):
            setting_item(bad)
        with pytest.raises(UsageError, match=r"^--set: expected KEY=VALUE"):
            cli_settings(["layers=2", bad])
        with pytest.raises(ProfileInputError, match=r"^settings: expected KEY=VALUE"):
            page_settings(f"layers=2, {bad}")
