"""Benchmark: trial-epochs to a near-best model, TPE + median stopping vs plain random search.

The task is real training on a small tabular problem (``trainer.demo.make_table``: Gaussian
features, a non-linear 3-class target with noise, written as Parquet), through the local tune
engine (``trainer.tune.local.run_study``) and the real training loop
(``InProcessTrialRunner`` -> ``trainer.training.loop.train``, one CPU process).

- **Search space** (where hyperparameters matter): ``optim.lr`` log-uniform 1e-5..0.3,
  ``model.hidden_dim`` 8..256 (log), ``optim.weight_decay`` 0..0.3; objective: ``val_loss``.
- **tpe+median**: TPE (5 random start-up trials) and Katib's median stopping
  (``min_trials_required`` 3, ``start_step`` 2). **random**: random search, no early stopping.
- **Equal budgets**: the same number of trials (``--trials``, 20), each of at most
  ``--epochs`` (8) epochs; per seed both strategies see the same data and sampler seed.
- **Cost** is trial-epochs: each evaluation (one per epoch) costs one; a pruned trial stops
  paying when it is stopped. Every evaluation a trial reports (pruned or not) counts as found.
- **Reference** per seed: the best validation loss found by *either* strategy on that seed.
  A strategy's score on a seed is the trial-epochs it spent until its best-so-far came within
  1% of the reference (``<= 1.01 * reference``); a strategy that never gets there is charged
  its whole budget (and the table says how often that happened).
- Headline: median over seeds of random's epochs / median of tpe+median's. Goal >= 3.

Run from the repo root: ``.venv/bin/python benchmarks/tune_efficiency.py [--seeds 10]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.base.typedconfig import apply_overrides, from_dict
from trainer.config import WorkerConfig
from trainer.demo import make_table
from trainer.tune.local import InProcessTrialRunner, StudyResult, run_study
from trainer.tune.space import load_space

REPO = Path(__file__).resolve().parents[1]
PARAMETERS = [
    {
        "name": "optim.lr",
        "parameterType": "double",
        "feasibleSpace": {"min": "1e-5", "max": "0.3", "distribution": "logUniform"},
    },
    {
        "name": "model.hidden_dim",
        "parameterType": "int",
        "feasibleSpace": {"min": "8", "max": "256", "distribution": "logUniform"},
    },
    {
        "name": "optim.weight_decay",
        "parameterType": "double",
        "feasibleSpace": {"min": "0.0", "max": "0.3"},
    },
]
STRATEGIES: dict[str, dict[str, Any]] = {
    "tpe+median": {
        "algorithm": {
            "algorithmName": "tpe",
            "algorithmSettings": [{"name": "n_startup_trials", "value": "5"}],
        },
        "earlyStopping": {
            "algorithmName": "medianstop",
            "algorithmSettings": [
                {"name": "min_trials_required", "value": "3"},
                {"name": "start_step", "value": "2"},
            ],
        },
    },
    "random": {"algorithm": {"algorithmName": "random"}, "earlyStopping": None},
}


@dataclass
class Curve:
    """Best-so-far validation loss after each trial-epoch of one study."""

    best: list[float]

    def epochs_to(self, target: float) -> int | None:
        for i, v in enumerate(self.best):
            if v <= target:
                return i + 1
        return None


def curve(result: StudyResult) -> Curve:
    best, out = float("inf"), []
    for t in sorted(result.trials, key=lambda t: t.number):
        for _, value in t.intermediate:
            best = min(best, value)
            out.append(best)
    return Curve(out)


def write_data(root: Path, rows: int, seed: int) -> dict[str, str]:
    table = make_table(rows + rows // 4, features=8, classes=3, seed=seed)
    pq.write_table(table.slice(0, rows), root / "train.parquet")
    pq.write_table(table.slice(rows), root / "val.parquet")
    return {"train_uri": str(root / "train.parquet"), "val_uri": str(root / "val.parquet")}


def strategies(start_step: int, startup_trials: int) -> dict[str, dict[str, Any]]:
    """The two contenders' algorithm and early-stopping sections."""
    out = json.loads(json.dumps(STRATEGIES))
    tpe = out["tpe+median"]
    tpe["algorithm"]["algorithmSettings"][0]["value"] = str(startup_trials)
    tpe["earlyStopping"]["algorithmSettings"][1]["value"] = str(start_step)
    return out


def run_strategy(
    name: str,
    seed: int,
    *,
    data: dict[str, str],
    trials: int,
    epochs: int,
    work: Path,
    setup: dict[str, dict[str, Any]],
) -> StudyResult:
    space = load_space(
        {
            "parameters": PARAMETERS,
            "objective": {"type": "minimize", "objectiveMetricName": "val_loss"},
            **setup[name],
            "maxTrialCount": trials,
            "parallelTrialCount": 1,
            "maxFailedTrialCount": trials,
        }
    )
    base = {
        "data": data,
        "model": {"num_layers": 2},
        "train": {"epochs": epochs, "global_batch_size": 128, "log_every_steps": 10_000},
    }

    def trial_config(number: int, assignment: dict[str, Any], trial_uri: str) -> WorkerConfig:
        over = {**assignment, "output.model_uri": f"{trial_uri}/model", "train.seed": seed}
        return from_dict(WorkerConfig, apply_overrides(base, over))

    return run_study(
        space,
        trial_config,
        runner=InProcessTrialRunner(),
        work_uri=str(work / f"{name}-{seed}"),
        study_name=f"{name}-{seed}",
        seed=seed,
    )


def save_plot(curves: dict[str, list[Curve]], refs: list[float], budget: int, path: Path) -> None:
    import numpy as np
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.2), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    colors = {"tpe+median": "#1a7f37", "random": "#0969da"}
    for name, cs in curves.items():
        # Relative gap to the seed's reference, padded to the budget with the final value.
        gaps = np.full((len(cs), budget), np.nan)
        for i, (c, ref) in enumerate(zip(cs, refs, strict=True)):
            vals = np.array(c.best + [c.best[-1]] * (budget - len(c.best))) / ref - 1
            gaps[i] = vals[:budget]
        x = np.arange(1, budget + 1)
        med = np.nanmedian(gaps, axis=0)
        lo, hi = np.nanpercentile(gaps, 25, axis=0), np.nanpercentile(gaps, 75, axis=0)
        ax.plot(x, med, color=colors[name], label=f"{name} (median over seeds)")
        ax.fill_between(x, lo, hi, color=colors[name], alpha=0.2)
    ax.axhline(0.01, color="#cf222e", linestyle="--", label="within 1% of the best found")
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("cumulative trial-epochs")
    ax.set_ylabel("best val_loss so far / best found - 1")
    ax.set_title("Anytime performance (band: 25-75% of seeds)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument(
        "--start-step", type=int, default=2, help="medianstop start_step of tpe+median"
    )
    parser.add_argument(
        "--startup-trials", type=int, default=5, help="TPE n_startup_trials of tpe+median"
    )
    parser.add_argument("--plot", default=str(REPO / ".runs" / "bench" / "tune_anytime.png"))
    args = parser.parse_args(argv)
    logging.getLogger("trainer").setLevel(logging.WARNING)
    budget = args.trials * args.epochs
    curves: dict[str, list[Curve]] = {name: [] for name in STRATEGIES}
    refs: list[float] = []
    setup = strategies(args.start_step, args.startup_trials)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tune-bench-") as tmp:
        work = Path(tmp)
        for seed in range(args.seeds):
            root = work / f"data-{seed}"
            root.mkdir()
            data = write_data(root, args.rows, seed)
            for name in STRATEGIES:
                result = run_strategy(
                    name,
                    seed,
                    data=data,
                    trials=args.trials,
                    epochs=args.epochs,
                    work=work,
                    setup=setup,
                )
                curves[name].append(curve(result))
            refs.append(min(cs[-1].best[-1] for cs in curves.values()))
    elapsed = time.perf_counter() - t0

    print(
        f"tune efficiency: {args.seeds} seeds, {args.trials} trials x <= {args.epochs} epochs "
        f"({args.rows} training rows), target = within 1% of the best val_loss either found "
        f"on that seed; tpe+median: n_startup_trials {args.startup_trials}, medianstop "
        f"min_trials_required 3, start_step {args.start_step}; {elapsed:.0f} s"
    )
    print(f"{'strategy':<12} {'median epochs':>14} {'mean epochs':>12} {'spent':>7} {'missed':>7}")
    medians: dict[str, float] = {}
    for name, cs in curves.items():
        needed, missed = [], 0
        for c, ref in zip(cs, refs, strict=True):
            n = c.epochs_to(ref * 1.01)
            if n is None:
                missed += 1
                n = len(c.best)  # never got there: charged everything it spent
            needed.append(n)
        medians[name] = statistics.median(needed)
        spent = statistics.mean(len(c.best) for c in cs)
        print(
            f"{name:<12} {medians[name]:>14.1f} {statistics.mean(needed):>12.1f} "
            f"{spent:>7.1f} {missed:>4}/{len(cs)}"
        )
    per_seed = " ".join(
        f"{(r.epochs_to(ref * 1.01) or len(r.best))}/{(t.epochs_to(ref * 1.01) or len(t.best))}"
        for r, t, ref in zip(curves["random"], curves["tpe+median"], refs, strict=True)
    )
    print(f"per seed (random/tpe+median epochs): {per_seed}")
    plot = Path(args.plot)
    save_plot(curves, refs, budget, plot)
    print(f"anytime curves: {plot}")
    ratio = medians["random"] / max(medians["tpe+median"], 1e-9)
    print(f"tune_efficiency ratio: {ratio:.2f} (goal >= 3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
