"""``python -m trainer <step> --config cfg.json [--set key=value] --<input> URI``, in the image.

The same step functions the KFP components call, without KFP: what a PyTorchJob pod, a Katib
trial or a person at a shell runs. Bad input prints ``ERROR [<step>] E_<CODE>: ...`` and exits 2.
Outputs (``--output``, train's ``--model`` and ``--work``, ``--report``) go only where nothing
but the same step's earlier output would be replaced (see :mod:`trainer.base.outputs`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from trainer.base import storage
from trainer.base.typedconfig import apply_overrides, from_dict
from trainer.entry import run_guarded

_FOLDER_HELP = (
    "output folder: new, empty, or this step's own earlier output (replaced); anything else"
    " is refused (E_OUTPUT)"
)
_FILE_HELP = "output file: new, or this step's own earlier output (replaced); else E_OUTPUT"


def _config(args: argparse.Namespace, cls: type) -> Any:
    data = storage.read_json(args.config) if args.config else {}
    return from_dict(cls, apply_overrides(data, args.overrides))


def _preprocess(args: argparse.Namespace) -> dict[str, Any]:
    from trainer.steps.preprocess import PreprocessConfig, preprocess

    cfg = _config(args, PreprocessConfig)
    pods = None
    if cfg.launcher == "pytorchjob":  # the job's pods read and write the store directly
        from trainer.steps.preprocess import PodsJob

        work = args.work or args.output.rstrip("/") + "-work"
        pods = PodsJob(args.job_name, args.data, args.output, work)
    return preprocess(cfg, data_uri=args.data, output_uri=args.output, pods=pods).to_dict()


def _train(args: argparse.Namespace) -> dict[str, Any]:
    from trainer.steps.train import TrainStepConfig, record_fixed, train_step

    data = storage.read_json(args.config) if args.config else {}
    cfg = from_dict(TrainStepConfig, record_fixed(apply_overrides(data, args.overrides)))
    return train_step(
        cfg,
        dataset_uri=args.dataset,
        model_uri=args.model,
        work_uri=args.work or args.model.rstrip("/") + "-work",
        job_name=args.job_name,
    ).to_dict()


def _evaluate(args: argparse.Namespace) -> dict[str, Any]:
    from trainer.steps.evaluate import EvaluateConfig, evaluate

    cfg = _config(args, EvaluateConfig)
    return evaluate(
        cfg,
        model_uri=args.model,
        dataset_uri=args.dataset,
        report_uri=args.report,
        champion_model_uri=args.champion,
    ).to_dict()


def _tune(args: argparse.Namespace) -> dict[str, Any]:
    from trainer.steps.tune import TuneConfig, tune

    cfg = _config(args, TuneConfig)
    return tune(
        cfg,
        dataset_uri=args.dataset,
        work_uri=args.work,
        output_uri=args.output,
        report_uri=args.report,
        metrics_uri=args.metrics,
        run_id=args.run_id,
        task_name=args.task_name,
    ).to_dict()


def _register(args: argparse.Namespace) -> dict[str, Any]:
    from trainer.steps.register import RegisterConfig, register

    cfg = _config(args, RegisterConfig)
    metrics = storage.read_json(storage.join(args.model, "metrics.json"))
    return register(
        cfg,
        model_uri=args.model,
        pipeline_run_id=args.run_id,
        data_hash=args.data_hash,
        params={},
        metrics=metrics,
        gate_passed=args.gate_passed,
    ).to_dict()


STEPS: dict[str, tuple[Callable[[argparse.Namespace], dict[str, Any]], list[tuple[str, bool]]]] = {
    "preprocess": (
        _preprocess,
        [("--data", True), ("--output", True), ("--work", False), ("--job-name", False)],
    ),
    "train": (
        _train,
        [("--dataset", True), ("--model", True), ("--work", False), ("--job-name", False)],
    ),
    "evaluate": (
        _evaluate,
        [("--model", True), ("--dataset", True), ("--report", True), ("--champion", False)],
    ),
    "tune": (
        _tune,
        [
            ("--dataset", True),
            ("--work", True),
            ("--output", True),
            ("--report", True),
            ("--metrics", False),
            ("--run-id", False),
            ("--task-name", False),
        ],
    ),
    "register": (_register, [("--model", True), ("--run-id", True), ("--data-hash", True)]),
}

OUTPUT_FLAGS: dict[str, dict[str, str]] = {
    "preprocess": {"--output": _FOLDER_HELP, "--work": _FOLDER_HELP},
    "train": {"--model": _FOLDER_HELP, "--work": _FOLDER_HELP},
    "evaluate": {"--report": _FILE_HELP},
    "tune": {
        "--work": _FOLDER_HELP,
        "--output": _FILE_HELP,
        "--report": _FILE_HELP,
        "--metrics": _FILE_HELP,
    },
}
"""The flags of each step that name an output location, with their help."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__)
    sub = parser.add_subparsers(dest="step", required=True)
    for name, (_, flags) in STEPS.items():
        p = sub.add_parser(name)
        p.add_argument("--config", help="step config JSON (any URI); defaults when omitted")
        p.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config field",
        )
        for flag, required in flags:
            help_text = OUTPUT_FLAGS.get(name, {}).get(flag)
            p.add_argument(flag, required=required, metavar="URI", help=help_text)
        if name == "register":
            p.add_argument(
                "--gate-passed",
                action="store_true",
                help="the evaluation gate passed: move the champion alias",
            )
        if name in ("train", "preprocess"):
            p.set_defaults(job_name=f"gpupipe-{name}")
        if name == "tune":
            # A Katib Experiment is named after the run and the task: the same pair re-attaches.
            p.set_defaults(run_id="local", task_name="tune")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one step; print its result as one JSON line on stdout."""
    args = build_parser().parse_args(argv)
    # tune's progress (the Experiment's or the study's trials, as they end) on stderr, as KFP
    # shows a component's log; an embedding program's own logging setup is kept. (The other
    # steps print what they have to say themselves: bad input stays one line.)
    if args.step == "tune" and not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO,
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    fn = STEPS[args.step][0]
    result = run_guarded(args.step, lambda: fn(args))
    print(json.dumps(result, sort_keys=True, default=str))
    return 0


def _exit_now(code: int) -> None:
    """Flush and leave without running C++ static destructors.

    After a step fails, interpreter shutdown can race pyarrow's native thread pools and abort
    ("terminate called without an active exception", exit -6) once in a few hundred runs on a
    busy machine. The step's exit code is its contract (2 is permanent under the operator's
    ExitCode policy, SIGABRT would be retried), so it is delivered directly.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        status = main()
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if status == 0:
            raise
        _exit_now(status)
    sys.exit(status)
