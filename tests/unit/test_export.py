"""Tests for the model artifact: save, load, predict, safety and atomicity."""

from __future__ import annotations

import datetime as dt
import importlib
import json
import os
import pickle
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.distributed as torch_dist
from torch import nn

from trainer.base import storage
from trainer.base.errors import InputError
from trainer.base.outputs import OUTPUT_MARKER
from trainer.base.typedconfig import to_dict
from trainer.base.version import __version__
from trainer.config import ModelConfig
from trainer.models import ModelSpec, build_model
from trainer.models.export import FORMAT, load_model, predict, save_model

GPT_CFG = ModelConfig(name="gpt", vocab_size=32, n_layer=2, n_head=2, d_model=16)
GPT_SPEC = ModelSpec(task="lm", seq_len=8)
MLP_CFG = ModelConfig(name="mlp", hidden_dim=8, num_layers=2)
CLS_SPEC = ModelSpec(task="classification", in_features=4, num_classes=3)
REG_SPEC = ModelSpec(task="regression", in_features=4)
FEATURES = ["a", "b", "c", "d"]


def trained(cfg: ModelConfig, spec: ModelSpec, seed: int = 0) -> nn.Module:
    """A model whose weights differ from a fresh build with the default seed."""
    torch.manual_seed(seed + 100)
    model = build_model(cfg, spec)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return model.eval()


def inputs(spec: ModelSpec, n: int = 10) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    if spec.task == "lm":
        return torch.randint(0, 32, (n, 8), generator=gen)
    return torch.randn(n, 4, generator=gen)


def save(uri: str, model: nn.Module, cfg: ModelConfig, spec: ModelSpec, **kw) -> None:
    tabular = spec.task != "lm"
    defaults = {
        "features": FEATURES if tabular else None,
        "target": "label" if tabular else None,
        "schema": {"columns": {"a": {"mean": 0.5}}} if tabular else None,
        "metrics": {"val_loss": 0.25},
    }
    save_model(uri, model, model_cfg=cfg, spec=spec, **{**defaults, **kw})


@pytest.mark.parametrize(
    ("cfg", "spec"),
    [
        (MLP_CFG, CLS_SPEC),
        (MLP_CFG, REG_SPEC),
        (ModelConfig(name="mlp", hidden_dim=8, ensemble=4), CLS_SPEC),
        (GPT_CFG, GPT_SPEC),
    ],
    ids=["mlp-classification", "mlp-regression", "mlp-ensemble", "gpt"],
)
def test_round_trip_gives_identical_predictions(tmp_path: Path, cfg, spec) -> None:
    model = trained(cfg, spec)
    uri = str(tmp_path / "model")
    save(uri, model, cfg, spec)
    loaded = load_model(uri)
    x = inputs(spec)
    with torch.no_grad():
        expected = model(x)
    if spec.task == "regression":
        expected = expected.squeeze(-1)
    got = predict(loaded, x)  # one batch: BLAS results may differ in the last bit across sizes
    assert got.shape == expected.shape
    assert torch.equal(got, expected)
    assert not loaded.module.training
    assert sorted(os.listdir(uri)) == [
        OUTPUT_MARKER,
        "metrics.json",
        "model.json",
        "model.safetensors",
    ]


def test_gpt_tied_weights_are_stored_once_and_tied_again_on_load(tmp_path: Path) -> None:
    uri = str(tmp_path / "gpt")
    save(uri, trained(GPT_CFG, GPT_SPEC), GPT_CFG, GPT_SPEC)
    stored = safetensors.torch.load((tmp_path / "gpt" / "model.safetensors").read_bytes())
    assert "wte.weight" in stored and "lm_head.weight" not in stored
    module = load_model(uri).module
    assert module.lm_head.weight is module.wte.weight


def test_metadata_records_architecture_data_and_version(tmp_path: Path) -> None:
    uri = str(tmp_path / "m")
    schema = {"columns": {"a": {"mean": 0.5, "std": 2.0}}}
    save(uri, trained(MLP_CFG, CLS_SPEC), MLP_CFG, CLS_SPEC, schema=schema, extra={"run": "r1"})
    loaded = load_model(uri)
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    assert loaded.meta == meta
    assert meta["format"] == FORMAT == "gpupipe.model/v1"
    assert meta["trainer_version"] == __version__
    assert meta["model"] == to_dict(MLP_CFG)
    assert meta["spec"] == CLS_SPEC.to_dict()
    assert (meta["features"], meta["target"], meta["schema"]) == (FEATURES, "label", schema)
    assert meta["extra"] == {"run": "r1"}
    created = dt.datetime.fromisoformat(meta["created"])
    assert abs(dt.datetime.now(dt.UTC) - created) < dt.timedelta(minutes=5)
    assert loaded.metrics == {"val_loss": 0.25}
    assert (loaded.spec, loaded.model_cfg) == (CLS_SPEC, MLP_CFG)


@pytest.mark.parametrize(
    "allowed",
    [["tests.plugins.tiny:build"], ["tests.plugins.tiny"], ["tests.plugins"], ["tests"]],
    ids=["factory", "module", "package", "top-package"],
)
def test_allowed_installed_plugin_model_round_trips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, allowed: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the plugin comes from the environment, not the working dir
    cfg = ModelConfig(name="tests.plugins.tiny:build")
    model = trained(cfg, CLS_SPEC)
    save(str(tmp_path / "p"), model, cfg, CLS_SPEC)
    x = inputs(CLS_SPEC)
    with torch.no_grad():
        loaded = load_model(str(tmp_path / "p"), allowed_plugins=allowed)
        assert torch.equal(predict(loaded, x), model(x))


def evil_model(model_dir: Path, module_dir: Path, marker: Path) -> str:
    """A real model whose model.json names ``<module>:build``, a module placed in ``module_dir``
    that writes ``marker`` as soon as it is imported. Returns the module name (unique per test,
    so no earlier import is cached)."""
    module = f"evil_{model_dir.parent.name.replace('-', '_')}"
    save(str(model_dir), trained(MLP_CFG, CLS_SPEC), MLP_CFG, CLS_SPEC)
    meta = json.loads((model_dir / "model.json").read_text())
    meta["model"]["name"] = f"{module}:build"
    (model_dir / "model.json").write_text(json.dumps(meta))
    module_dir.mkdir(parents=True, exist_ok=True)
    (module_dir / f"{module}.py").write_text(
        f"open({str(marker)!r}, 'w').write('code from the artifact ran')\n"
        "from trainer.models import build_model\n"
        "def build(cfg, spec):\n"
        "    return build_model(type(cfg)(name='mlp', hidden_dim=8, num_layers=2), spec)\n"
    )
    return module


@pytest.mark.parametrize(
    "allowed", [[], ["other.plugin"], ["evil"]], ids=["none", "other", "name-prefix"]
)
def test_plugin_not_allowed_is_refused_before_any_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, allowed: list[str]
) -> None:
    model_dir, marker = tmp_path / "model", tmp_path / "MARKER"
    module = evil_model(model_dir, model_dir, marker)
    monkeypatch.chdir(model_dir)  # as ``python -m`` run inside the folder: it is on sys.path
    monkeypatch.syspath_prepend(str(model_dir))
    with pytest.raises(InputError) as info:
        load_model(str(model_dir), allowed_plugins=allowed)
    assert info.value.code == "E_MODEL"
    assert info.value.where == str(model_dir / "model.json")
    assert f"would import module {module!r}, which is not allowed" in info.value.message
    assert not marker.exists()
    assert module not in sys.modules


@pytest.mark.parametrize("where", ["artifact-folder", "cwd-empty-entry", "cwd-absolute-entry"])
def test_allowed_plugin_is_never_imported_from_the_artifact_or_the_working_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    model_dir, marker = tmp_path / "model", tmp_path / "MARKER"
    module_dir = model_dir if where == "artifact-folder" else tmp_path / "cwd"
    module = evil_model(model_dir, module_dir, marker)
    monkeypatch.chdir(module_dir)
    monkeypatch.syspath_prepend("" if where == "cwd-empty-entry" else str(module_dir))
    with pytest.raises(ValueError, match=f"cannot import {module}") as info:
        load_model(str(model_dir), allowed_plugins=[module])
    assert "installed environment" in str(info.value)
    assert not marker.exists()
    assert module not in sys.modules


def test_plugin_imported_earlier_from_the_working_dir_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir, marker = tmp_path / "model", tmp_path / "MARKER"
    cwd = tmp_path / "cwd"
    module = evil_model(model_dir, cwd, marker)
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))
    importlib.import_module(module)  # something else imported it first, from the working dir
    try:
        with pytest.raises(ValueError, match="plugins load only from the installed environment"):
            load_model(str(model_dir), allowed_plugins=[module])
    finally:
        sys.modules.pop(module, None)


def test_compiled_model_is_saved_under_plain_names(tmp_path: Path) -> None:
    model = trained(MLP_CFG, CLS_SPEC)
    save(str(tmp_path / "c"), torch.compile(model, backend="eager"), MLP_CFG, CLS_SPEC)
    stored = safetensors.torch.load((tmp_path / "c" / "model.safetensors").read_bytes())
    assert set(stored) == set(model.state_dict())


def test_ddp_model_is_saved_under_plain_names(tmp_path: Path) -> None:
    model = trained(MLP_CFG, CLS_SPEC)
    torch_dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1
    )
    try:
        ddp = nn.parallel.DistributedDataParallel(model)
        save(str(tmp_path / "d"), ddp, MLP_CFG, CLS_SPEC)
    finally:
        torch_dist.destroy_process_group()
    stored = safetensors.torch.load((tmp_path / "d" / "model.safetensors").read_bytes())
    assert set(stored) == set(model.state_dict())


def test_loading_never_unpickles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "gpt")
    save(uri, trained(GPT_CFG, GPT_SPEC), GPT_CFG, GPT_SPEC)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("load_model must not unpickle")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    assert load_model(uri).module.lm_head.weight is not None


def test_loading_leaves_the_global_random_stream_alone(tmp_path: Path) -> None:
    uri = str(tmp_path / "gpt")
    save(uri, trained(GPT_CFG, GPT_SPEC), GPT_CFG, GPT_SPEC)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    load_model(uri)
    assert torch.equal(torch.rand(3), expected)


def _break(model_dir: Path, how: str) -> None:
    meta = model_dir / "model.json"
    weights = model_dir / "model.safetensors"
    if how == "missing-json":
        meta.unlink()
    elif how == "garbled-json":
        meta.write_bytes(b"\xff\xfe{not json")
    elif how == "truncated-json":
        meta.write_text(meta.read_text()[:40])
    elif how == "unknown-format":
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "format": "other/v9"}))
    elif how == "not-an-object":
        meta.write_text("[1, 2]")
    elif how == "bad-model-section":
        data = json.loads(meta.read_text())
        data["model"]["n_layers"] = 3
        meta.write_text(json.dumps(data))
    elif how == "truncated-weights":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif how == "missing-weights":
        weights.unlink()
    elif how == "wrong-weights":
        weights.write_bytes(safetensors.torch.save({"x": torch.zeros(2)}))


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("missing-json", "missing model.json"),
        ("garbled-json", "model.json is not valid JSON"),
        ("truncated-json", "model.json is not valid JSON"),
        ("unknown-format", "model.json has format 'other/v9', expected 'gpupipe.model/v1'"),
        ("not-an-object", "model.json has format 'list'"),
        ("bad-model-section", "model.json describes an invalid model: unknown config key n_layers"),
        ("truncated-weights", "model.safetensors is unreadable"),
        ("missing-weights", "missing model.safetensors"),
        ("wrong-weights", "weights do not match the architecture"),
    ],
    ids=[
        "missing-json",
        "garbled-json",
        "truncated-json",
        "unknown-format",
        "not-an-object",
        "bad-model-section",
        "truncated-weights",
        "missing-weights",
        "wrong-weights",
    ],
)
def test_broken_artifacts_raise_value_error_naming_the_uri(tmp_path, how, message) -> None:
    uri = str(tmp_path / "broken")
    save(uri, trained(GPT_CFG, GPT_SPEC), GPT_CFG, GPT_SPEC)
    _break(tmp_path / "broken", how)
    with pytest.raises(ValueError, match=f"^model {uri}: {message}"):
        load_model(uri)


def test_failed_save_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = storage.write_bytes

    def fail_on_metadata(uri: str, data: bytes) -> None:
        if uri.endswith("model.json"):  # the weights are already written by then
            raise OSError("disk full")
        real_write(uri, data)

    monkeypatch.setattr(storage, "write_bytes", fail_on_metadata)
    with pytest.raises(OSError, match="disk full"):
        save(str(tmp_path / "model"), trained(MLP_CFG, CLS_SPEC), MLP_CFG, CLS_SPEC)
    assert os.listdir(tmp_path) == []


def test_unserialisable_metadata_fails_before_writing(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        save(str(tmp_path / "m"), trained(MLP_CFG, CLS_SPEC), MLP_CFG, CLS_SPEC, extra={"x": {1j}})
    assert os.listdir(tmp_path) == []


def test_save_replaces_an_earlier_model(tmp_path: Path) -> None:
    uri = str(tmp_path / "m")
    save(uri, trained(MLP_CFG, CLS_SPEC, seed=1), MLP_CFG, CLS_SPEC)
    newer = trained(MLP_CFG, CLS_SPEC, seed=2)
    save(uri, newer, MLP_CFG, CLS_SPEC, metrics={"val_loss": 0.1})
    loaded = load_model(uri)
    x = inputs(CLS_SPEC)
    with torch.no_grad():
        assert torch.equal(predict(loaded, x), newer(x))
    assert loaded.metrics == {"val_loss": 0.1}
    assert os.listdir(tmp_path) == ["m"]


def test_predict_batches_float64_and_empty_input(tmp_path: Path) -> None:
    uri = str(tmp_path / "m")
    model = trained(MLP_CFG, CLS_SPEC)
    save(uri, model, MLP_CFG, CLS_SPEC)
    loaded = load_model(uri)
    x = inputs(CLS_SPEC, n=25)
    whole = predict(loaded, x, batch_size=8192)
    torch.testing.assert_close(predict(loaded, x, batch_size=4), whole)
    torch.testing.assert_close(predict(loaded, x.double(), batch_size=4), whole)
    assert predict(loaded, x[:0]).shape == (0, 3)
    with pytest.raises(ValueError, match="batch_size must be > 0, got 0"):
        predict(loaded, x, batch_size=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_load_onto_gpu_and_predict(tmp_path: Path) -> None:
    uri = str(tmp_path / "gpt")
    model = trained(GPT_CFG, GPT_SPEC)
    save(uri, model, GPT_CFG, GPT_SPEC)
    loaded = load_model(uri, device="cuda")
    assert (
        loaded.module.wte.weight.is_cuda
        and loaded.module.lm_head.weight is loaded.module.wte.weight
    )
    x = inputs(GPT_SPEC)
    with torch.no_grad():
        torch.testing.assert_close(predict(loaded, x), model(x), atol=1e-4, rtol=1e-4)


def test_allowed_package_never_reaches_into_the_working_dir_for_a_submodule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed package whose ``__path__`` took in ``<cwd>/<package>`` (pkgutil.extend_path
    while the working dir was on sys.path): its submodules there are refused, unimported."""
    package = f"pkg_{tmp_path.name}"
    site, cwd, marker = tmp_path / "site", tmp_path / "cwd", tmp_path / "MARKER"
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text(
        "from pkgutil import extend_path\n__path__ = extend_path(__path__, __name__)\n"
    )
    model_dir = tmp_path / "model"
    module = evil_model(model_dir, cwd / package, marker)
    meta = json.loads((model_dir / "model.json").read_text())
    meta["model"]["name"] = f"{package}.{module}:build"
    (model_dir / "model.json").write_text(json.dumps(meta))
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(cwd))
    importlib.import_module(package)  # imported earlier, with the working dir searched
    try:
        assert str(cwd / package) in list(sys.modules[package].__path__)
        with pytest.raises(ValueError, match="plugins load only from the installed environment"):
            load_model(str(model_dir), allowed_plugins=[package])
        assert not marker.exists()
    finally:
        sys.modules.pop(package, None)
        sys.modules.pop(f"{package}.{module}", None)


def test_a_model_saved_before_the_embedding_option_loads_as_a_plain_mlp(tmp_path: Path) -> None:
    cfg = ModelConfig(name="mlp", hidden_dim=8, num_layers=2, linear="none", embedding="none")
    model = trained(cfg, CLS_SPEC)
    uri = str(tmp_path / "model")
    save(uri, model, cfg, CLS_SPEC)
    meta_path = tmp_path / "model" / "model.json"
    meta = json.loads(meta_path.read_text())
    del meta["model"]["embedding"], meta["model"]["linear"]  # as written before either existed
    meta_path.write_text(json.dumps(meta))
    loaded = load_model(uri)
    assert loaded.model_cfg.embedding == "none"
    x = inputs(CLS_SPEC)
    with torch.no_grad():
        assert torch.equal(predict(loaded, x), model(x))
