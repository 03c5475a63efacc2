"""Cost arithmetic, exactly: the price of a GPU-hour, the estimate before launch, the actual."""

from __future__ import annotations

from typing import Any

import pytest

from trainer.base import cost
from trainer.base.errors import InputError
from trainer.steps.train.cost import WatchConfig, cost_metrics


@pytest.mark.parametrize(
    ("gpu_type", "hourly", "prices", "expected"),
    [
        ("nvidia.com/gpu", 0.0, {}, None),
        ("nvidia.com/gpu", 2.5, {}, 2.5),
        ("nvidia.com/gpu", 2.5, {"nvidia.com/gpu": 4.0}, 4.0),
        ("nvidia.com/mig-1g.18gb", 2.5, {"nvidia.com/gpu": 4.0}, 2.5),
        ("nvidia.com/gpu", 0.0, {"nvidia.com/gpu": 0}, 0.0),
    ],
    ids=["no-price", "one-price", "table-wins", "table-lacks-falls-back", "free"],
)
def test_the_price_of_a_gpu_hour(
    gpu_type: str, hourly: float, prices: dict[str, Any], expected: float | None
) -> None:
    assert cost.resolve_price(gpu_type, hourly, prices) == expected


@pytest.mark.parametrize(
    ("hourly", "prices", "named"),
    [
        (-1.0, {}, "gpu_hour_usd"),
        (float("nan"), {}, "gpu_hour_usd"),
        (0.0, {"nvidia.com/gpu": -2}, "gpu_prices"),
        (0.0, {"nvidia.com/gpu": "cheap"}, "gpu_prices"),
        (0.0, {"amd.com/gpu": 3.0}, "gpu_prices"),
    ],
    ids=["negative", "nan", "negative-in-table", "text-in-table", "table-without-the-type"],
)
def test_a_bad_price_is_one_line_naming_the_parameter(
    hourly: float, prices: dict[str, Any], named: str
) -> None:
    with pytest.raises(InputError) as err:
        cost.resolve_price("nvidia.com/gpu", hourly, prices)
    assert err.value.where == named and "\n" not in str(err.value)


def test_the_estimate_is_rows_times_epochs_over_throughput() -> None:
    est = cost.estimate(
        rows=36_000, epochs=10, max_steps=None, global_batch_size=256, samples_per_s=100.0,
        throughput_source="recorded", nnodes=2, gpus_per_node=4, gpu_hour_usd=3.0,
    )  # fmt: skip
    assert est.samples == 360_000
    assert est.estimated_duration_hours == 1.0  # 360,000 / 100 / 3600
    assert est.gpus == 8
    assert est.hourly_cost_usd == 24.0
    assert est.total_cost_usd == 24.0
    figures = est.to_dict()
    assert figures["throughput_source"] == "recorded"
    assert {"hourly_cost_usd", "estimated_duration_hours", "total_cost_usd"} <= set(figures)
    assert any("recorded" in a for a in est.assumptions)
    assert any("$3 per GPU-hour" in a for a in est.assumptions)


def test_max_steps_caps_the_estimate_and_no_price_means_no_cost() -> None:
    est = cost.estimate(
        rows=10_000, epochs=50, max_steps=100, global_batch_size=64, samples_per_s=640.0,
        throughput_source="measured", nnodes=1, gpus_per_node=0, gpu_hour_usd=None,
    )  # fmt: skip
    assert est.samples == 6400
    assert est.estimated_duration_hours == pytest.approx(10 / 3600)
    assert est.gpus == 0  # a node without GPUs holds none: no GPU-hours
    assert est.hourly_cost_usd is None and est.total_cost_usd is None
    assert any("no GPU-hour price" in a for a in est.assumptions)


def test_the_actual_is_gpu_hours_times_price() -> None:
    assert cost.actual(1800.0, 4, 2.5) == {"duration_s": 1800.0, "gpu_hours": 2.0, "cost_usd": 5.0}
    assert cost.actual(1800.0, 4, None)["cost_usd"] is None


@pytest.mark.parametrize(
    ("held", "device", "processes", "used"),
    [(4, "cuda", 4, 4), (0, "cuda", 2, 2), (1, "cpu", 1, 0), (8, "cpu", 2, 0)],
    ids=["gpus-held", "one-per-process", "cpu-though-asked", "cpu-8-asked"],
)
def test_only_gpus_really_driven_count(held: int, device: str, processes: int, used: int) -> None:
    # A run --local on a laptop (gpus_per_node 1 by default) trained on the CPU but its model
    # said "gpus": 1 and counted GPU-hours: what ran is what is recorded.
    assert cost.gpus_used(held, device, processes) == used
    assert cost.actual(3600.0, used, 2.0)["gpu_hours"] == used


def test_the_summary_says_where_the_run_ran() -> None:
    cpu = {"duration_s": 5.0, "cost_usd": 0.0, "gpu_hours": 0.0, "device": "cpu", "gpus": 0}
    (line,) = cost.summary_lines(None, cpu)
    assert "0.000000 GPU-hours, on the CPU" in line
    gpu = {**cpu, "device": "cuda", "gpus": 2, "gpu_hours": 0.5}
    assert "GPU-hours, on 2 GPUs" in cost.summary_lines(None, gpu)[0]


def test_a_throughput_must_be_positive() -> None:
    with pytest.raises(ValueError, match="throughput must be > 0"):
        cost.estimate(
            rows=10, epochs=1, max_steps=None, global_batch_size=1, samples_per_s=0.0,
            throughput_source="measured", nnodes=1, gpus_per_node=1, gpu_hour_usd=1.0,
        )  # fmt: skip


def test_summary_lines_show_the_estimate_beside_the_actual() -> None:
    est = cost.estimate(
        rows=3600, epochs=1, max_steps=None, global_batch_size=36, samples_per_s=1.0,
        throughput_source="recorded", nnodes=1, gpus_per_node=2, gpu_hour_usd=1.5,
    ).to_dict()  # fmt: skip
    act = cost.actual(7200.0, 2, 1.5)
    estimate_line, actual_line = cost.summary_lines(est, act)
    assert estimate_line.startswith("estimate 3600.0 s, $3.0000 (1.0 samples/s, recorded")
    assert actual_line == "actual   7200.0 s, $6.0000 (4.000000 GPU-hours)"
    metrics = cost_metrics({"estimate": est, "actual": act})
    assert metrics["estimated_cost_usd"] == 3.0 and metrics["cost_usd"] == 6.0


@pytest.mark.parametrize(
    ("port", "cluster", "expected"),
    [(None, True, 9464), (None, False, None), (0, True, None), (9100, False, 9100)],
    ids=["cluster-default", "local-default-off", "off", "chosen"],
)
def test_the_jobs_metrics_port(port: int | None, cluster: bool, expected: int | None) -> None:
    assert WatchConfig(metrics_port=port).port_for(cluster) == expected


def test_a_bad_watch_setting_names_its_field() -> None:
    with pytest.raises(InputError, match=r"watch\.metrics_port"):
        WatchConfig(metrics_port=70000)
    with pytest.raises(InputError, match=r"watch\.samples_per_s"):
        WatchConfig(samples_per_s=0)


def test_the_registered_model_is_tagged_with_its_cost(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from trainer.steps.register import _cost_tags

    est = cost.estimate(
        rows=3600, epochs=1, max_steps=None, global_batch_size=36, samples_per_s=1.0,
        throughput_source="recorded", nnodes=1, gpus_per_node=2, gpu_hour_usd=1.5,
    ).to_dict()  # fmt: skip
    (tmp_path / "cost.json").write_text(json.dumps({"estimate": est, "actual": cost.actual(
        7200.0, 2, 1.5)}))  # fmt: skip
    tags = _cost_tags(str(tmp_path))
    assert tags["gpupipe.cost_usd"] == "6" and tags["gpupipe.estimated_cost_usd"] == "3"
    assert tags["gpupipe.gpu_hours"] == "4"
    assert _cost_tags(str(tmp_path / "absent")) == {}


@pytest.mark.parametrize(
    ("nnodes", "gpus_per_node", "line"),
    [
        (1, 0, "no GPU (gpus_per_node 0 or none found): 1 CPU process, no GPU-hours"),
        (2, 0, "no GPU (gpus_per_node 0 or none found): 2 CPU processes, no GPU-hours"),
        (1, 1, "1 GPU held (1 node x 1 per node)"),
        (2, 8, "16 GPUs held (2 nodes x 8 per node)"),
    ],
)
def test_the_estimate_says_what_the_job_holds_in_plain_words(
    nnodes: int, gpus_per_node: int, line: str
) -> None:
    # The KFP UI showed "1 GPUs held (1 nodes x 1 per node)" for a CPU run.
    est = cost.estimate(
        rows=100, epochs=1, max_steps=None, global_batch_size=10, samples_per_s=10.0,
        throughput_source="measured", nnodes=nnodes, gpus_per_node=gpus_per_node,
        gpu_hour_usd=None,
    )  # fmt: skip
    assert line in est.assumptions
