"""A lost peer is retryable: kill -9 one rank (or its whole node) and the survivor exits 200.

Two ``python -m trainer.launch`` wrappers with the environment the Training Operator gives the
two pods of a PyTorchJob (``PET_NNODES=2``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` on 127.0.0.1:
torchrun's static rendezvous), and one wrapper with two local ranks; gloo on CPU. Under
``restartPolicy: ExitCode`` 200 is retried, and the rerun resumes from the newest checkpoint to
the weights of an uninterrupted run. A bug in user code on one rank stays exit 1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import IO, Any

import pytest
import torch

from tests.helpers import (
    ROOT,
    descendants,
    env,
    history,
    launch_cmd,
    make_config,
    mapping_lines,
    run,
    wait_for_step,
    weights,
    write_data,
)
from trainer.base.errors import EXIT_PEER_LOST
from trainer.checkpoint.manager import CheckpointManager
from trainer.launch.jobspec import WORKER_COMMAND

pytestmark = pytest.mark.integration

KILL_AT = 40  # forward call of the SIGKILL; checkpoints every 16 steps, so the newest is 32
RETRYABLE = f"-> {EXIT_PEER_LOST} (retryable)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """One PyTorchJob pod: the replica's container command with the operator's environment."""

    def __init__(self, cfg: Path, node: int, port: int, logs: Path) -> None:
        e = env()
        e.update(
            {
                "PET_NNODES": "2",
                "PET_NPROC_PER_NODE": "1",
                "PET_NODE_RANK": str(node),
                "PET_MASTER_ADDR": "127.0.0.1",
                "PET_MASTER_PORT": str(port),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "WORLD_SIZE": "2",
                "RANK": str(node),  # the node index, as the operator sets it; torchrun overrides
            }
        )
        self.err_path = logs / f"node{node}.stderr"
        self._err: IO[str] = self.err_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, *WORKER_COMMAND[1:], str(cfg)],
            env=e,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            cwd=ROOT,
        )

    def wait(self, timeout: float = 240) -> int:
        try:
            self.proc.communicate(timeout=timeout)
        finally:
            self._err.close()
        return self.proc.returncode

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def kill_everything(self) -> None:
        """SIGKILL the wrapper, torchrun and the worker at once, as a node that dies.

        All are stopped first, so that none of them reacts to another's death (torchrun to the
        wrapper's, say) before it dies itself.
        """
        pids = descendants(self.proc.pid)
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                os.kill(pid, sig)

    def wait_for_step(self, step: int, timeout: float = 120) -> None:
        """Read rank 0's JSON log lines until training has passed ``step``."""
        try:
            wait_for_step(self.proc, step, timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}:\n{self.stderr[-3000:]}") from None


def two_nodes(cfg: Path, logs: Path) -> tuple[Node, Node]:
    port = free_port()
    return Node(cfg, 0, port, logs), Node(cfg, 1, port, logs)


def kill_fault(marker: Path, rank: int) -> dict[str, Any]:
    """The model plugin that SIGKILLs rank ``rank``'s worker at forward call KILL_AT, once."""
    options = {"at": KILL_AT, "rank": rank, "marker": str(marker)}
    return {"name": "tests.plugins.faults:kill", "options": options}


def newest_checkpoint(cfg: Path) -> int:
    steps = CheckpointManager(str(cfg.parent / "ckpt"), keep_last=2).steps()
    assert steps, f"no complete checkpoint under {cfg.parent / 'ckpt'}"
    return steps[-1]


def assert_resumed_to_reference(cfg: Path, step: int, reference: dict[str, torch.Tensor]) -> None:
    restore = [r for r in history(cfg) if r["event"] == "restore"]
    assert restore and restore[0]["step"] == step, restore
    got = weights(cfg)
    assert got.keys() == reference.keys()
    for k in reference:
        assert torch.equal(got[k], reference[k]), k


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return write_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory, data: tuple[str, str]
) -> dict[str, torch.Tensor]:
    """Weights of an uninterrupted 2-rank run (the kill plugin disarmed by its marker)."""
    tmp = tmp_path_factory.mktemp("reference")
    marker = tmp / "never-fire"
    marker.write_text("disarmed\n")
    cfg = make_config(tmp, "ref", data=data, model=kill_fault(marker, rank=1))
    proc = run(launch_cmd(cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return weights(cfg)


def test_kill_9_of_one_node_is_retryable_on_both_and_the_rerun_resumes(
    tmp_path: Path, data: tuple[str, str], reference: dict[str, torch.Tensor]
) -> None:
    marker = tmp_path / "killed"
    cfg = make_config(tmp_path, "run", data=data, model=kill_fault(marker, rank=1))
    master, worker = two_nodes(cfg, tmp_path)
    master_code, worker_code = master.wait(), worker.wait()
    assert marker.exists(), worker.stderr[-3000:]
    # Without the mapping both would be 1: the operator would fail the job instead of retrying.
    assert master_code == EXIT_PEER_LOST, master.stderr[-3000:]
    assert worker_code == EXIT_PEER_LOST, worker.stderr[-3000:]
    assert "lost a peer of this job" in master.stderr
    (line,) = mapping_lines(master.stderr)
    assert line == f"gpupipe launch: worker exit codes {{0: {EXIT_PEER_LOST}}} {RETRYABLE}"
    (line,) = mapping_lines(worker.stderr)  # its worker was killed before it could say anything
    assert line.startswith("gpupipe launch: worker exit codes {}, 1 died without one (pid ")
    assert line.endswith(RETRYABLE)
    assert not (cfg.parent / "model").exists()
    assert newest_checkpoint(cfg) == 32

    master, worker = two_nodes(cfg, tmp_path)  # the operator restarts both pods
    assert master.wait() == 0, master.stderr[-3000:]
    assert worker.wait() == 0, worker.stderr[-3000:]
    assert_resumed_to_reference(cfg, 32, reference)


def test_master_node_dying_with_its_store_is_retryable_for_the_survivor(
    tmp_path: Path, data: tuple[str, str], reference: dict[str, torch.Tensor]
) -> None:
    marker = tmp_path / "never-fire"
    marker.write_text("disarmed\n")
    cfg = make_config(tmp_path, "run", data=data, model=kill_fault(marker, rank=1))
    master, worker = two_nodes(cfg, tmp_path)
    master.wait_for_step(24)  # past the first checkpoint (16), well before the end (96)
    master.kill_everything()  # wrapper, torchrun (the rendezvous store) and rank 0
    assert master.wait() == -signal.SIGKILL
    assert worker.wait() == EXIT_PEER_LOST, worker.stderr[-3000:]
    (line,) = mapping_lines(worker.stderr)
    assert line.endswith(RETRYABLE), line
    assert not (cfg.parent / "model").exists()
    step = newest_checkpoint(cfg)

    master, worker = two_nodes(cfg, tmp_path)
    assert master.wait() == 0, master.stderr[-3000:]
    assert worker.wait() == 0, worker.stderr[-3000:]
    assert_resumed_to_reference(cfg, step, reference)


def test_kill_9_of_one_local_rank_is_retryable_and_the_rerun_resumes(
    tmp_path: Path, data: tuple[str, str], reference: dict[str, torch.Tensor]
) -> None:
    marker = tmp_path / "killed"
    cfg = make_config(tmp_path, "run", data=data, model=kill_fault(marker, rank=1))
    first = run(launch_cmd(cfg))
    assert marker.exists(), first.stderr[-3000:]
    assert first.returncode == EXIT_PEER_LOST, first.stderr[-3000:]
    (line,) = mapping_lines(first.stderr)
    # Rank 0 either lost its peer (200) or was stopped by torchrun first (143): both retryable.
    assert " 1 died without one (pid " in line and line.endswith(RETRYABLE), line
    assert newest_checkpoint(cfg) == 32

    second = run(launch_cmd(cfg))
    assert second.returncode == 0, second.stderr[-3000:]
    assert_resumed_to_reference(cfg, 32, reference)


BUGGY_PLUGIN = """
    import dataclasses
    import os

    import torch

    from trainer.models import build_model


    class Buggy(torch.nn.Module):
        def __init__(self, cfg, spec):
            super().__init__()
            self.inner = build_model(dataclasses.replace(cfg, name="mlp", options={}), spec)
            self.calls = 0

        def forward(self, x):
            self.calls += self.training
            if self.training and self.calls == 20 and os.environ["RANK"] == "1":
                return self.inner(x) + undefined_name  # a bug in the user's model
            return self.inner(x)


    def build(cfg, spec):
        return Buggy(cfg, spec)
"""


def test_a_bug_on_one_rank_stays_permanent_though_its_peer_loses_it(
    tmp_path: Path, data: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "buggy_model.py").write_text(textwrap.dedent(BUGGY_PLUGIN))
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(plugins), path]))
    cfg = make_config(tmp_path, "bug", data=data, model={"name": "buggy_model:build"})
    proc = run(launch_cmd(cfg))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "NameError: name 'undefined_name' is not defined" in proc.stderr
    # Rank 1 recorded its 1, which wins over what rank 0 saw next (a lost peer, or torchrun's
    # SIGTERM): torchrun's own 1 stands, so there is nothing to map.
    assert not mapping_lines(proc.stderr), proc.stderr[-3000:]
