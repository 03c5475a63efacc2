"""Benchmark: the demo pipeline's train step (the default tabular model) on CUDA against the CPU.

**Question:** what does a GPU buy the default TabM-mini ensemble on the demo table that ``make
run`` trains? **Goal:** none fixed; the issue asks for the figure (train step seconds, GPU vs CPU).

The real steps, in this process, as ``make run`` takes them: the demo table (4,000 rows,
``write_demo_data``), ``preprocess`` with the pipeline's defaults, the train step's settings at
the pipeline's defaults (``train_settings`` then ``plan_worker_config``) and the training loop
(``trainer.training.loop.train``). Each timed block trains the same model from the same seed,
on the CPU and then on CUDA, alternating (``--repeats`` pairs); the first pair is a warm-up
(CUDA's context and kernels, the allocator). Both models are evaluated on the same test split so
a speed-up that changed the model shows. Off CUDA it prints ``cuda: skipped`` and a CPU figure.

Run from the repo root: ``python benchmarks/tabular_device.py [--rows 4000] [--repeats 2]``; on a
machine without ``kfp`` (the GPU machines), first ``--write-settings FILE`` where it is installed,
then ``--settings FILE`` there.
The last line is ``tabular_device cpu_over_gpu: <CPU s / GPU s>``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.base.typedconfig import from_dict
from trainer.distributed import dist
from trainer.steps.evaluate import EvaluateConfig, evaluate
from trainer.steps.preprocess import PreprocessConfig, preprocess, write_demo_data
from trainer.steps.train import TrainStepConfig, plan_worker_config
from trainer.training import loop


def context(device: torch.device) -> dist.DistContext:
    """One process on ``device`` (what ``dist.init`` makes for a single process)."""
    return dist.DistContext(
        rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
        device=device, backend=None,
    )  # fmt: skip


def pipeline_defaults() -> dict[str, Any]:
    """The preprocess and train steps' settings at the pipeline's defaults, as its components
    make them (needs ``kfp``: the defaults are read off the pipeline's signature)."""
    import dataclasses

    from pipelines.params import preprocess_config, train_settings, with_defaults

    pre = preprocess_config(with_defaults({"data_uri": "demo"}))
    return {"preprocess": dataclasses.asdict(pre), "train": train_settings({})}


def train_once(
    ds: str, root: Path, device: torch.device, settings: dict[str, Any]
) -> dict[str, Any]:
    """Train the default model on ``device`` into ``root``; seconds, steps and test metrics."""
    step = from_dict(TrainStepConfig, settings)
    worker, _ = plan_worker_config(
        step, dataset_uri=ds, model_uri=str(root / "model"), work_uri=str(root / "work")
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the trainer's JSON log lines
        trained = loop.train(worker, context(device))
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    metrics = evaluate(
        EvaluateConfig(baselines=False), model_uri=str(root / "model"), dataset_uri=ds,
        report_uri=str(root / "report.html"),
    ).metrics  # fmt: skip
    return {"s": seconds, "steps": trained.steps, "metrics": metrics}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4000, help="rows of the demo table")
    parser.add_argument("--repeats", type=int, default=2, help="timed CPU/CUDA pairs")
    parser.add_argument(
        "--settings",
        type=Path,
        help="read the steps' default settings from this JSON file (where kfp is missing, as on "
        "the GPU machines) instead of the pipeline",
    )
    parser.add_argument(
        "--write-settings", type=Path, help="write the pipeline's default settings here and stop"
    )
    args = parser.parse_args(argv)
    if args.write_settings:
        args.write_settings.write_text(json.dumps(pipeline_defaults(), indent=2) + "\n")
        return 0
    defaults = json.loads(args.settings.read_text()) if args.settings else pipeline_defaults()
    if args.rows < 1 or args.repeats < 1:
        parser.error("--rows and --repeats must be >= 1")
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.append(torch.device("cuda", 0))
        print(f"cuda: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    else:
        print("cuda: skipped: no CUDA device")
    print(f"cpu: {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory(prefix="tabular-device-") as tmp:
        root = Path(tmp)
        data = write_demo_data(
            str(root / "churn.parquet"), rows=args.rows, task="classification", seed=0
        )
        ds = str(root / "dataset")
        pre = from_dict(PreprocessConfig, defaults["preprocess"])
        preprocess(pre, data_uri=data, output_uri=ds)
        seconds: dict[str, list[float]] = {d.type: [] for d in devices}
        for pair in range(args.repeats + 1):  # pair 0 warms up
            for device in devices:
                got = train_once(ds, root / f"{device.type}-{pair}", device, defaults["train"])
                label = "warm-up" if pair == 0 else f"pair {pair}"
                scores = sorted((k, v) for k, v in got["metrics"].items() if isinstance(v, float))
                print(
                    f"{label:8} {device.type:4} {got['s']:7.2f} s  {got['steps']} steps  "
                    + "  ".join(f"{k} {v:.4f}" for k, v in scores)
                )
                if pair:
                    seconds[device.type].append(got["s"])
    cpu = statistics.median(seconds["cpu"])
    if "cuda" not in seconds:
        print(f"tabular_device cpu_seconds: {cpu:.2f} (no CUDA device: no ratio)")
        return 0
    gpu = statistics.median(seconds["cuda"])
    print(f"median train step: cpu {cpu:.2f} s, cuda {gpu:.2f} s")
    print(f"tabular_device cpu_over_gpu: {cpu / gpu:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
