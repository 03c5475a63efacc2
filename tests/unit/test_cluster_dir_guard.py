"""`make cluster-down` and `cluster-up` refuse a folder that is not a test cluster's (issue 39).

Tried as a user who mistyped it: `GPUPIPE_CLUSTER_DIR=<a folder of theirs> make cluster-down`
deleted their folder and its file. Both scripts now refuse, in one line naming the folder, with
exit 2, before anything else (no root, Docker or cluster needed to check it), and touch nothing.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", ["cluster-down.sh", "cluster-up.sh"])
def test_a_folder_without_the_clusters_marker_is_refused_and_kept(
    script: str, tmp_path: Path
) -> None:
    theirs = tmp_path / "my-experiments"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine\n")
    env = {**os.environ, "GPUPIPE_CLUSTER_DIR": str(theirs)}
    out = subprocess.run(
        [str(ROOT / "hack" / script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: cluster: {theirs} is not a test cluster's folder"), lines
    assert "refusing to touch it" in lines[-1]
    assert sorted(p.name for p in theirs.iterdir()) == ["notes.txt"]
    assert (theirs / "notes.txt").read_text() == "mine\n"


def test_an_absent_folder_is_nothing_to_take_down(tmp_path: Path) -> None:
    env = {**os.environ, "GPUPIPE_CLUSTER_DIR": str(tmp_path / "none")}
    out = subprocess.run(
        [str(ROOT / "hack" / "cluster-down.sh")], env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 0 and "nothing to do" in out.stdout, out.stdout + out.stderr
    assert not (tmp_path / "none").exists()


def test_cluster_up_refuses_a_disk_too_full_for_its_object_store(tmp_path: Path) -> None:
    """SeaweedFS sizes its volumes by the free space and stops taking writes when it runs short:
    cluster-up says so first (exit 3, which the cluster tests turn into a skip with the line)."""
    state = tmp_path / "state" / "not-yet"
    env = {
        **os.environ,
        "GPUPIPE_CLUSTER_DIR": str(state),
        "GPUPIPE_MIN_FREE_GIB": "999999999",
        "TMPDIR": str(tmp_path),  # where `cannot` keeps its line: not the real cluster's
    }
    out = subprocess.run(
        [str(ROOT / "hack" / "cluster-up.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 3, out.stdout + out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert f"GiB free under {state}: the test cluster needs 999999999 GiB" in last, last
    assert "GPUPIPE_MIN_FREE_GIB" in last
    assert not state.exists() and not state.parent.exists()
    assert (tmp_path / "gpupipe-cluster.unavailable").read_text().strip() in last
