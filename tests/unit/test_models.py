"""Tests for the model registry, the MLP, the GPT, losses and FLOP accounting."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainer.base.errors import InputError
from trainer.config import ModelConfig
from trainer.models import (
    GPT,
    ModelSpec,
    TabularMLP,
    build_model,
    compute_loss,
    computes_loss,
    count_params,
    flops_per_token,
    forward_loss,
    plugin_allowed,
    unwrap_model,
    validate_plugin_entries,
)

TINY_GPT = {"name": "gpt", "vocab_size": 32, "n_layer": 2, "n_head": 2, "d_model": 16}
LM_SPEC = ModelSpec(task="lm", seq_len=8)
CLS_SPEC = ModelSpec(task="classification", in_features=5, num_classes=3)
REG_SPEC = ModelSpec(task="regression", in_features=5)


def tiny_gpt(**overrides: object) -> GPT:
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{**TINY_GPT, **overrides}), LM_SPEC)  # type: ignore[arg-type]
    assert isinstance(model, GPT)
    return model


# ----------------------------------------------------------------------------------------------
# ModelSpec
# ----------------------------------------------------------------------------------------------


def test_spec_round_trips() -> None:
    for spec in (CLS_SPEC, REG_SPEC, LM_SPEC):
        assert ModelSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"task": "ranking"}, "spec.task must be one of"),
        ({"task": "classification", "in_features": 4}, "spec.num_classes must be >= 2"),
        ({"task": "regression"}, "spec.in_features must be set"),
        ({"task": "lm"}, "spec.seq_len must be set"),
        ({"task": "lm", "seq_len": 0}, "spec.seq_len must be a positive integer"),
        ({"task": "lm", "seq_len": 8, "colour": 1}, "unknown spec key 'colour'"),
        ({"seq_len": 8}, "missing spec key 'task'"),
    ],
    ids=[
        "bad-task",
        "no-classes",
        "no-features",
        "no-seq-len",
        "zero-seq-len",
        "unknown",
        "no-task",
    ],
)
def test_spec_rejects_bad_input(data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_dict(data)


# ----------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------


def test_registry_builds_builtins() -> None:
    assert isinstance(build_model(ModelConfig(name="mlp"), CLS_SPEC), TabularMLP)
    assert isinstance(build_model(ModelConfig(**TINY_GPT), LM_SPEC), GPT)  # type: ignore[arg-type]


def test_registry_builds_plugin_with_options() -> None:
    cfg = ModelConfig(name="tests.plugins.tiny:build", options={"bias": False})
    model = build_model(cfg, CLS_SPEC)
    assert isinstance(model, nn.Linear)
    assert model.in_features == 5 and model.out_features == 3 and model.bias is None


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "no_such_pkg.models:build",
            r"model.name 'no_such_pkg.models:build': cannot import no_such_pkg.models "
            r"\(No module named 'no_such_pkg'\)",
        ),
        (
            "tests.plugins.tiny:nope",
            r"model.name 'tests.plugins.tiny:nope': module tests.plugins.tiny has no attribute "
            r"'nope'",
        ),
        (
            "tests.plugins.tiny:not_a_module",
            r"model.name 'tests.plugins.tiny:not_a_module': tests.plugins.tiny.not_a_module\(cfg, "
            r"spec\) must return a torch.nn.Module, got int",
        ),
        (
            "tests.plugins.tiny:NOT_CALLABLE",
            r"model.name 'tests.plugins.tiny:NOT_CALLABLE': tests.plugins.tiny.NOT_CALLABLE is not "
            r"callable",
        ),
    ],
    ids=["unimportable", "missing-attr", "not-a-module", "not-callable"],
)
def test_registry_rejects_bad_plugins(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(ModelConfig(name=name), CLS_SPEC)


@pytest.mark.parametrize(
    ("name", "allowed", "ok"),
    [
        ("mlp", [], True),
        ("gpt", [], True),
        ("pkg.mod:build", [], False),
        ("pkg.mod:build", ["pkg.mod:build"], True),
        ("pkg.mod:build", ["pkg.mod:other"], False),
        ("pkg.mod:build", ["pkg.mod"], True),
        ("pkg.mod:build", ["pkg"], True),
        ("pkg.mod:build", ["pk"], False),
        ("pkgx.mod:build", ["pkg"], False),
        ("pkg:build", ["pkg.mod"], False),
    ],
    ids=[
        "builtin-mlp",
        "builtin-gpt",
        "plugin-none-allowed",
        "exact-factory",
        "other-factory",
        "module",
        "parent-package",
        "name-prefix-is-not-a-package",
        "sibling-package",
        "submodule-does-not-allow-parent",
    ],
)
def test_plugin_allow_list(name: str, allowed: list[str], ok: bool) -> None:
    assert plugin_allowed(name, allowed) is ok


@pytest.mark.parametrize(
    "entries",
    ["pkg.mod", ["./evil"], ["pkg.mod:"], ["pkg..mod"], ["a:b:c"], [3]],
    ids=["string-not-list", "path", "empty-attr", "empty-part", "two-colons", "not-a-string"],
)
def test_plugin_allow_list_entries_are_checked(entries: object) -> None:
    with pytest.raises(ValueError, match="plugins"):
        validate_plugin_entries(entries, "evaluate.model_plugins")  # type: ignore[arg-type]


def test_training_builds_a_plugin_its_own_config_names_from_the_working_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training imports as Python does: the person's own config chose the module."""
    (tmp_path / "my_local_model.py").write_text(
        "from torch import nn\ndef build(cfg, spec):\n    return nn.Linear(5, 3)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        model = build_model(ModelConfig(name="my_local_model:build"), CLS_SPEC)
        assert isinstance(model, nn.Linear)
        with pytest.raises(ValueError, match="plugins load only from the installed environment"):
            build_model(ModelConfig(name="my_local_model:build"), CLS_SPEC, untrusted_dirs=[])
    finally:
        sys.modules.pop("my_local_model", None)


@pytest.mark.parametrize(
    ("name", "spec", "message"),
    [
        ("mlp", LM_SPEC, "model.name 'mlp' needs a tabular task .* got task 'lm'"),
        ("gpt", CLS_SPEC, "model.name 'gpt' needs task 'lm' .* got task 'classification'"),
    ],
    ids=["mlp-on-tokens", "gpt-on-tabular"],
)
def test_registry_rejects_task_mismatch(name: str, spec: ModelSpec, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(ModelConfig(name=name), spec)


# ----------------------------------------------------------------------------------------------
# MLP
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "num_layers", "shape"),
    [
        (CLS_SPEC, 2, (4, 3)),
        (REG_SPEC, 2, (4, 1)),
        (CLS_SPEC, 0, (4, 3)),
    ],
    ids=["classification", "regression", "linear"],
)
def test_mlp_output_shapes(spec: ModelSpec, num_layers: int, shape: tuple[int, int]) -> None:
    model = build_model(ModelConfig(name="mlp", hidden_dim=8, num_layers=num_layers), spec)
    assert model(torch.randn(4, 5)).shape == shape


def test_linear_mlp_is_one_linear_layer() -> None:
    model = build_model(ModelConfig(name="mlp", num_layers=0), REG_SPEC)
    assert [type(m) for m in model.modules() if not isinstance(m, TabularMLP | nn.Sequential)] == [
        nn.Linear
    ]


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_same_seed_same_weights(name: str) -> None:
    cfg = ModelConfig(**TINY_GPT) if name == "gpt" else ModelConfig(name="mlp")  # type: ignore[arg-type]
    spec = LM_SPEC if name == "gpt" else CLS_SPEC
    states = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        states.append(build_model(cfg, spec).state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert not all(torch.equal(states[0][k], states[2][k]) for k in states[0])


# ----------------------------------------------------------------------------------------------
# GPT
# ----------------------------------------------------------------------------------------------


def test_gpt_logits_shape_and_too_long_input() -> None:
    model = tiny_gpt()
    assert model(torch.randint(0, 32, (3, 8))).shape == (3, 8, 32)
    assert model(torch.randint(0, 32, (3, 5))).shape == (3, 5, 32)
    with pytest.raises(ValueError, match="sequence length 9 exceeds the model's block size 8"):
        model(torch.randint(0, 32, (1, 9)))


def test_gpt_is_causal() -> None:
    model = tiny_gpt().eval()
    idx = torch.randint(0, 32, (2, 8))
    changed = idx.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 32
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_gpt_ties_head_to_token_embedding_and_uses_no_bias() -> None:
    model = tiny_gpt()
    assert model.lm_head.weight is model.wte.weight
    assert all(m.bias is None for m in model.modules() if isinstance(m, nn.Linear | nn.LayerNorm))


def test_gpt_residual_projections_use_scaled_init() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(name="gpt", vocab_size=64, n_layer=8, n_head=4, d_model=256)
    model = build_model(cfg, LM_SPEC)
    assert isinstance(model, GPT)
    proj_std = torch.cat([b.mlp.proj.weight.flatten() for b in model.blocks]).std().item()
    fc_std = torch.cat([b.mlp.fc.weight.flatten() for b in model.blocks]).std().item()
    assert fc_std == pytest.approx(0.02, rel=0.05)
    assert proj_std == pytest.approx(0.02 / 4, rel=0.05)  # sqrt(2 * 8) = 4


def test_activation_checkpointing_gives_same_loss_and_grads() -> None:
    idx = torch.randint(0, 32, (2, 8))
    results = []
    for ckpt in (False, True):
        model = tiny_gpt(activation_checkpointing=ckpt, dropout=0.1).train()
        torch.manual_seed(1)  # same dropout masks in both runs
        loss = compute_loss("lm", model(idx[:, :-1]), idx[:, 1:])
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], msg=name)


def test_gpt_compiles_to_one_graph() -> None:
    """No graph breaks: the forward has no data-dependent Python control flow."""
    model = tiny_gpt(activation_checkpointing=True).train()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    idx = torch.randint(0, 32, (2, 8))
    loss = compute_loss("lm", compiled(idx), idx)
    loss.backward()
    assert unwrap_model(compiled) is model
    assert model.wte.weight.grad is not None


def test_gpt_learns_a_repeated_sequence() -> None:
    model = tiny_gpt().train()
    seq = torch.arange(9).repeat(4, 1) % 32  # the same sequence, four times
    x, y = seq[:, :-1], seq[:, 1:]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(20):
        loss = compute_loss("lm", model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_gpt_chunked_loss_matches_the_loss_from_logits_with_all_gradients() -> None:
    model = tiny_gpt(loss_chunk=5).train()  # 16 tokens: chunks of 5, 5, 5, 1
    idx = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(3))
    target = torch.roll(idx, -1, dims=1)
    target[:, -1] = -100  # ignored, like a sequence's last position without a next token
    plain = compute_loss("lm", model(idx), target)
    plain.backward()
    want = _grads(model)
    model.zero_grad(set_to_none=True)
    chunked = model(idx, targets=target)
    chunked.backward()
    got = _grads(model)
    torch.testing.assert_close(chunked, plain)
    assert got.keys() == want.keys() and "wte.weight" in got  # the tied head/embedding
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize(("loss_chunk", "head_called"), [(0, True), (4, False)], ids=["old", "new"])
def test_forward_loss_skips_the_full_logits_when_the_model_computes_its_loss(
    loss_chunk: int, head_called: bool
) -> None:
    model = tiny_gpt(loss_chunk=loss_chunk).train()
    calls: list[tuple[int, ...]] = []
    model.lm_head.register_forward_hook(lambda m, i, out: calls.append(tuple(out.shape)))
    idx = torch.randint(0, 32, (2, 8))
    wrapped = torch.compile(model, backend="eager")  # forward_loss looks through wrappers
    assert computes_loss(wrapped) is (not head_called)
    loss = forward_loss(wrapped, "lm", idx, idx, torch.no_grad)
    assert loss.shape == () and loss.dtype == torch.float32
    assert calls == ([(2, 8, 32)] if head_called else [])
    torch.testing.assert_close(loss, compute_loss("lm", model(idx), idx).detach())


def test_gpt_loss_paths_give_the_same_training_curve() -> None:
    """20 AdamW steps with the old (full logits) and new (chunked) loss: same losses."""
    curves = []
    for loss_chunk in (0, 6):
        model = tiny_gpt(loss_chunk=loss_chunk).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(0)
        losses = []
        for _ in range(20):
            seq = torch.randint(0, 8, (4, 9), generator=g) * 3 % 32
            loss = forward_loss(model, "lm", seq[:, :-1], seq[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(losses)
    assert curves[0][-1] < 0.8 * curves[0][0]  # it trains
    assert curves[1] == pytest.approx(curves[0], rel=1e-4, abs=1e-5)


def test_gpt_with_chunked_loss_compiles_to_one_graph() -> None:
    model = tiny_gpt(loss_chunk=4).train()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    idx = torch.randint(0, 32, (2, 8))
    loss = compiled(idx, targets=idx)
    loss.backward()
    torch.testing.assert_close(loss, compute_loss("lm", model(idx), idx))
    assert model.wte.weight.grad is not None


def test_loss_chunk_must_not_be_negative() -> None:
    with pytest.raises(InputError, match=r"model\.loss_chunk must be >= 0, got -1"):
        ModelConfig(name="gpt", loss_chunk=-1)
    with pytest.raises(ValueError, match="loss_chunk must be >= 0"):
        GPT(vocab_size=8, block_size=4, n_layer=1, n_head=1, d_model=4, loss_chunk=-1)


# ----------------------------------------------------------------------------------------------
# Loss, parameter count, FLOPs
# ----------------------------------------------------------------------------------------------


def test_classification_loss_matches_torch() -> None:
    logits = torch.randn(6, 3, dtype=torch.bfloat16)
    target = torch.randint(0, 3, (6,))
    loss = compute_loss("classification", logits, target)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, F.cross_entropy(logits.float(), target))


@pytest.mark.parametrize("shape", [(6, 1), (6,)], ids=["column", "flat"])
def test_regression_loss_matches_torch(shape: tuple[int, ...]) -> None:
    pred = torch.randn(*shape)
    target = torch.randn(6, dtype=torch.float64)
    loss = compute_loss("regression", pred, target)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, F.mse_loss(pred.reshape(6), target.float()))


def test_lm_loss_matches_torch() -> None:
    logits = torch.randn(2, 4, 7)
    target = torch.randint(0, 7, (2, 4))
    expected = torch.stack(
        [
            F.cross_entropy(logits[b, t : t + 1], target[b, t : t + 1])
            for b in range(2)
            for t in range(4)
        ]
    ).mean()
    torch.testing.assert_close(compute_loss("lm", logits, target), expected)


def test_unknown_task_loss_is_rejected() -> None:
    with pytest.raises(ValueError, match="task must be one of"):
        compute_loss("ranking", torch.zeros(1), torch.zeros(1))


def test_count_params_counts_tied_weight_once_and_excludes_position_embedding() -> None:
    model = tiny_gpt()
    v, t, d, n_layer = 32, 8, 16, 2
    per_block = 2 * d + 3 * d * d + d * d + 4 * d * d + 4 * d * d  # 2 LNs, qkv, proj, fc, proj
    total = v * d + t * d + n_layer * per_block + d  # wte (= lm_head), wpe, blocks, ln_f
    assert count_params(model) == total
    assert count_params(model, exclude_embeddings=True) == total - t * d
    assert count_params(torch.compile(model, backend="eager")) == total


@pytest.mark.parametrize(
    ("linear", "embedding", "ensemble", "extra"),
    [
        ("fit", "none", 1, 5 * 3 + 3),
        ("none", "none", 1, 0),
        # 5 columns x (16 frequencies + 16 phases + 16 x 3 + 3); the first layer reads 5 x 4
        ("none", "periodic", 1, 5 * (16 + 16 + 48 + 3) + 5 * 3 * 8),
        # 4 sign vectors over the 5 inputs, 3 more heads
        ("none", "none", 4, 4 * 5 + 3 * (8 * 3 + 3)),
    ],
    ids=["linear-path", "plain", "periodic", "ensemble"],
)
def test_count_params_of_mlp(linear: str, embedding: str, ensemble: int, extra: int) -> None:
    cfg = ModelConfig(
        name="mlp",
        hidden_dim=8,
        num_layers=1,
        linear=linear,  # type: ignore[arg-type]
        embedding=embedding,  # type: ignore[arg-type]
        ensemble=ensemble,
    )
    model = build_model(cfg, CLS_SPEC)
    hidden_and_head = 5 * 8 + 8 + 8 * 3 + 3
    assert count_params(model) == count_params(model, exclude_embeddings=True)
    assert count_params(model) == hidden_and_head + extra


def test_flops_per_token_gpt_by_hand() -> None:
    cfg = ModelConfig(name="gpt", vocab_size=50304, n_layer=12, n_head=12, d_model=768)
    spec = ModelSpec(task="lm", seq_len=1024)
    n = 124_000_000
    # 6N + 12 * L * H * Q * T with Q = 768 / 12 = 64
    assert flops_per_token(cfg, spec, n) == 6 * n + 12 * 12 * 12 * 64 * 1024


def test_flops_per_token_tabular_is_6n() -> None:
    assert flops_per_token(ModelConfig(name="mlp"), CLS_SPEC, 1000) == 6000


def test_gpt_under_cpu_bf16_autocast_gives_float32_loss() -> None:
    model = tiny_gpt().train()
    idx = torch.randint(0, 32, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx)
        loss = compute_loss("lm", logits, idx)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    assert model.wte.weight.grad is not None and model.wte.weight.grad.dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpt_trains_compiled_in_bf16_with_flash_attention_on_cuda() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    cfg = ModelConfig(name="gpt", vocab_size=128, n_layer=2, n_head=2, d_model=64)
    model = build_model(cfg, ModelSpec(task="lm", seq_len=64)).cuda().train()
    compiled = torch.compile(model, fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    seq = (torch.arange(65, device="cuda") % 16).repeat(8, 1)
    losses = []
    # Only the flash kernel allowed: fails loudly if the model's attention cannot use it.
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for _ in range(30):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = compute_loss("lm", compiled(seq[:, :-1]), seq[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_periodic_embedding_keeps_each_column_beside_its_periodic_features() -> None:
    from trainer.models.embeddings import DIM, PeriodicEmbedding, soft_clip

    torch.manual_seed(0)
    embed = PeriodicEmbedding(5)
    x = torch.randn(7, 5) * 4
    out = embed(x)
    assert out.shape == (7, 5 * DIM)
    assert torch.equal(out.view(7, 5, DIM)[..., 0], soft_clip(x))  # the "densenet" part
    assert soft_clip(torch.tensor([1e6])).item() == pytest.approx(3.0)  # outliers bounded


def test_an_unknown_embedding_is_refused_in_one_line() -> None:
    from trainer.base.typedconfig import from_dict

    with pytest.raises(InputError, match=r"embedding must be one of \['periodic', 'periodic\+ple'"):
        from_dict(ModelConfig, {"name": "mlp", "embedding": "ple"})
    with pytest.raises(ValueError, match=r"model\.embedding must be one of \['none', 'periodic'"):
        TabularMLP(5, 3, embedding="ple")


def test_piecewise_bins_are_cut_at_training_quantiles_and_make_steps() -> None:
    from trainer.models.embeddings import BINS, PiecewiseLinearEncoding

    encode = PiecewiseLinearEncoding(2)
    x = torch.stack([torch.linspace(0.0, 16.0, 161), (torch.arange(161) % 4).float()], dim=1)
    encode.fit_edges(x)
    assert encode.edges[0].tolist() == pytest.approx(list(range(BINS + 1)), abs=1e-4)
    out = encode(torch.tensor([[2.5, 1.0], [2.5, 2.0]])).view(2, 2, BINS + 1)
    # column 0: bins 0 and 1 passed, half of bin 2, none of the rest
    assert out[0, 0, 1:4].tolist() == pytest.approx([1.0, 1.0, 0.5])
    assert out[0, 0, 4:].abs().sum() == 0
    # column 1 takes four values: from 1 to 2 a bin flips from 0 to 1 (a step, not a ramp)
    assert (out[1, 1, 1:] - out[0, 1, 1:]).max() == pytest.approx(1.0)


def test_periodic_ple_embedding_fits_its_bins_and_round_trips_the_state() -> None:
    torch.manual_seed(0)
    model = TabularMLP(3, 2, hidden_dim=8, embedding="periodic+ple", ensemble=2)
    x = torch.randn(50, 3) * 3 + 1
    assert model.fit_embedding(x)
    edges = model.state_dict()["embed.piecewise.edges"]
    assert edges[:, 0].tolist() == pytest.approx(x.min(0).values.tolist())
    copy = TabularMLP(3, 2, hidden_dim=8, embedding="periodic+ple", ensemble=2)
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(copy.eval()(x), model.eval()(x))
    assert not TabularMLP(3, 2, embedding="periodic").fit_embedding(x)


@pytest.mark.parametrize("spec", [CLS_SPEC, REG_SPEC], ids=["classification", "regression"])
def test_an_ensemble_trains_each_member_on_its_loss_and_predicts_their_mean(
    spec: ModelSpec,
) -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="mlp", hidden_dim=8, ensemble=4), spec)
    x = torch.randn(6, 5)
    members = model.members(x)
    assert members.shape == (6, 4, spec.num_classes or 1)
    assert not torch.allclose(members[:, 0], members[:, 1])  # the members differ
    if spec.task == "classification":
        y = torch.randint(0, 3, (6,))
        expected = torch.stack([F.cross_entropy(members[:, i], y) for i in range(4)]).mean()
        assert torch.allclose(model(x).softmax(-1), members.softmax(-1).mean(1), atol=1e-6)
    else:
        y = torch.randn(6)
        expected = torch.stack([F.mse_loss(members[:, i, 0], y) for i in range(4)]).mean()
        assert torch.allclose(model(x), members.mean(1))
    assert computes_loss(model)
    assert torch.allclose(forward_loss(model, spec.task, x, y), expected)


def test_an_ensemble_with_a_linear_path_starts_as_the_linear_fit() -> None:
    from trainer.models.linear_fit import LinearFit

    model = build_model(ModelConfig(name="mlp", hidden_dim=8, ensemble=3), REG_SPEC)
    fit = LinearFit(weight=torch.ones(1, 5, dtype=torch.float64), bias=torch.zeros(1), rows=10)
    model.start_from_linear(fit)
    x = torch.randn(4, 5)
    assert torch.allclose(model.members(x), x.sum(-1).view(4, 1, 1).expand(4, 3, 1), atol=1e-6)
