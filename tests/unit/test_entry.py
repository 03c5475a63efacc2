"""``run_guarded``: each expected failure of a step is one ``ERROR [<step>] E_...`` line and the
exit code DESIGN.md promises; anything else keeps its traceback."""

from __future__ import annotations

import errno

import pytest

from trainer.base.errors import InputError
from trainer.entry import run_guarded


@pytest.mark.parametrize(
    ("exc", "code", "line"),
    [
        (InputError("E_CONFIG", "optim.lr must be > 0, got -1", "optim.lr"), 2, "E_CONFIG: "),
        (ValueError("bad value"), 2, "E_INVALID: bad value"),
        (FileNotFoundError("no table at /x.csv"), 2, "E_INVALID: no table at /x.csv"),
        # OSErrors that are a remote system's failure, not the input's: a deadline (a
        # launcher's TimeoutError printed a traceback before), a refused connection.
        (TimeoutError("Katib Experiment ns/e did not finish within 60 s"), 1, "E_EXTERNAL: Katib"),
        (ConnectionError("connection refused"), 1, "E_EXTERNAL: connection refused"),
        (RuntimeError("the job failed"), 1, "E_EXTERNAL: the job failed"),
        (OSError(errno.ENOSPC, "No space left on device"), 1, "E_DISK_FULL: "),
    ],
    ids=["input", "value", "missing-file", "deadline", "connection", "runtime", "disk-full"],
)
def test_an_expected_failure_is_one_line_and_its_exit_code(
    exc: BaseException, code: int, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail() -> None:
        raise exc

    with pytest.raises(SystemExit) as info:
        run_guarded("tune", fail)
    assert info.value.code == code
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"ERROR [tune] {line}"), err


@pytest.mark.parametrize("exc", [OSError(errno.EACCES, "Permission denied"), KeyError("bug")])
def test_anything_else_keeps_its_traceback(exc: BaseException) -> None:
    def fail() -> None:
        raise exc

    with pytest.raises(type(exc)):
        run_guarded("tune", fail)


def test_the_step_errors_cross_a_process_boundary_as_themselves() -> None:
    """A worker process's error reaches its parent as itself (pickled as ``cls(*args)`` these
    could not be rebuilt: the parent saw ``BrokenProcessPool`` instead, 2026-12-01)."""
    import pickle

    from trainer.base.errors import StepFailure
    from trainer.launch.kube import KubeApiError
    from trainer.launch.watch import LaunchCancelled

    errors: list[BaseException] = [
        InputError("E_REGISTRY", "not an MLflow database", "/x/app.db"),
        StepFailure("E_EXTERNAL", "the registry answered 503"),
        LaunchCancelled("stopped while the PyTorchJob ran"),
        KubeApiError("get pytorchjobs default/j: 403", status=403),
    ]
    for error in errors:
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and back.args == error.args
        assert vars(back) == vars(error) and str(back) == str(error)
