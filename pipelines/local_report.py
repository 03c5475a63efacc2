"""What a ``kfp.local`` run said and left: its output forwarded with credentials masked and
scanned for each step's error line, the failed step named, its run folder summarized."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

from trainer.base.errors import NOT_INPUT_CODES, parse_error_line
from trainer.base.redact import redact as _redact

EXTERNAL_CODES = NOT_INPUT_CODES
"""Codes of failures that are not the user's input (a registry or object store, a training run
that cannot go on, a full disk): the run then exits 1, not 2."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_KFP_FAILURE = re.compile(r"finished with status FAILURE\. Inner task failed: (?P<chain>.*)\.$")
_EXCEPTION_LINE = re.compile(
    r"^\s*(?:[\w.]+\.)?(?P<type>[A-Z]\w*(?:Error|Exception|Interrupt))(?::|$)"
)


class StepLog(io.TextIOBase):
    """Forwards kfp.local's output line by line with credentials masked (to the run's log and
    progress lines, :class:`pipelines.local_progress.Progress`), and remembers each step's error
    line and last exception.

    kfp.local prints every task's executor input, parameters included, so a registry URI with
    ``user:password@`` in it would otherwise reach the log and the terminal.
    """

    def __init__(self, out: Any) -> None:
        super().__init__()
        self._out = out
        self._partial = ""
        self.error_lines: list[tuple[str, str]] = []
        """``(step, line)`` of every ``ERROR [step] E_...`` line, in order."""
        self.exceptions: list[str] = []
        """The last line of each traceback printed by a step (``RuntimeError: ...``)."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            line = _redact(line)
            self._out.write(line + "\n")
            self._scan(_ANSI.sub("", line))
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def close_line(self) -> None:
        """Forward a last line that had no newline."""
        if self._partial:
            self.write("\n")
        self.flush()

    def _scan(self, line: str) -> None:
        stripped = line.strip()
        m = re.search(r"ERROR \[(?P<step>[\w -]+)\] (?P<code>E_[A-Z_]+): ", stripped)
        if m is not None:
            self.error_lines.append((m.group("step"), stripped[m.start() :]))
        elif _EXCEPTION_LINE.match(stripped) and not stripped.startswith("Traceback"):
            self.exceptions.append(stripped)


def failed_task(message: str) -> tuple[str, list[str]] | None:
    """The innermost failed task and the chain, from kfp.local's failure message."""
    m = _KFP_FAILURE.search(_ANSI.sub("", message).strip())
    if m is None:
        return None
    chain = re.findall(r"'([^']+)'", m.group("chain"))
    return (chain[0] if chain else "", chain)


def failure_details(
    failure: tuple[str, list[str]], step_log: StepLog, *, log: Path | None = None
) -> dict[str, Any]:
    """``state``, ``failed_step``, ``error`` and ``exit_code`` of a failed run (``log``: the
    run's log file, named when the step printed no error line)."""
    step, chain = failure
    lines = [line for s, line in step_log.error_lines if s == step] or [
        line for _, line in step_log.error_lines
    ]
    if lines:
        error = lines[-1]
        parsed = parse_error_line(error, error[error.index("[") + 1 : error.index("]")])
        code = parsed.code if parsed is not None else "E_FAILED"
    else:
        where = f"see the step's log in {log}" if log else "see the step's log above"
        last = step_log.exceptions[-1] if step_log.exceptions else where
        code = "E_FAILED"
        error = f"ERROR [{step}] E_FAILED: the step failed: {' '.join(last.split())}"
    return {
        "state": "FAILED",
        "failed_step": step,
        "failed_chain": chain,
        "error": _redact(error),
        "exit_code": 1 if code in EXTERNAL_CODES else 2,
    }


def _executor_output(task_dir: Path) -> dict[str, Any]:
    path = task_dir / "executor_output.json"
    return json.loads(path.read_text()) if path.exists() else {}


def summarize(run_dir: Path) -> dict[str, Any]:
    """Read a kfp.local run folder: each task's ``executor_output.json`` and artifacts."""
    out: dict[str, Any] = {"run_dir": str(run_dir)}
    pre = _executor_output(run_dir / "preprocess")
    for artifact in pre.get("artifacts", {}).get("dataset", {}).get("artifacts", []):
        warnings = artifact.get("metadata", {}).get("warnings")
        if warnings:
            out["data_warnings"] = list(warnings)
    ev = _executor_output(run_dir / "evaluate")
    params = ev.get("parameterValues", {})
    if "Output" in params:
        out["gate_passed"] = bool(params["Output"])
    for artifact in ev.get("artifacts", {}).get("report", {}).get("artifacts", []):
        out["gate_reason"] = artifact.get("metadata", {}).get("gate_reason", "")
    for artifact in ev.get("artifacts", {}).get("metrics", {}).get("artifacts", []):
        out["metrics"] = {
            k: v
            for k, v in artifact.get("metadata", {}).items()
            if k != "gate_passed" and isinstance(v, int | float)
        }
    # The baselines' scores are evaluate's own artifact; the summary lists them with the
    # model's, as baseline_<baseline>_<metric> (one "vs" line a baseline).
    for artifact in ev.get("artifacts", {}).get("baselines", {}).get("artifacts", []):
        out.setdefault("metrics", {}).update(
            {
                f"baseline_{k}": v
                for k, v in artifact.get("metadata", {}).items()
                if isinstance(v, int | float)
            }
        )
    report = run_dir / "evaluate" / "report"
    if report.exists():
        out["report"] = str(report)
    model = run_dir / "train" / "model"
    if (model / "model.json").exists():
        out["model_uri"] = str(model)
    if (model / "cost.json").exists():  # the estimate before launch and the actual
        out["cost"] = json.loads((model / "cost.json").read_text())
    tuned = _executor_output(run_dir / "tune").get("parameterValues", {})
    if tuned.get("best_hyperparams"):
        out["tuned_hyperparams"] = tuned["best_hyperparams"]
    reg = _executor_output(run_dir / "register").get("parameterValues", {})
    if reg:
        out["registered_version"] = reg.get("version")
        out["registered_model_uri"] = reg.get("model_uri")
        out["champion"] = reg.get("champion")
    return out
