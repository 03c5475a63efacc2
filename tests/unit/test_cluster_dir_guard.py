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
        "GPUPIPE_CLUSTER_CACHE": str(tmp_path / "cache"),  # `cannot` keeps its line there
    }
    out = subprocess.run(
        [str(ROOT / "hack" / "cluster-up.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 3, out.stdout + out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert f"GiB free under {state}: the test cluster needs 999999999 GiB" in last, last
    assert "GPUPIPE_MIN_FREE_GIB" in last
    assert not state.exists() and not state.parent.exists()
    assert (tmp_path / "cache" / "cluster.unavailable").read_text().strip() in last
    assert (tmp_path / "cache").stat().st_mode & 0o077 == 0  # owner-only, never in /tmp


@pytest.mark.parametrize(
    ("made", "layout"),
    [
        (["cpu/", "memory/", "pids/", "cpuset/"], "v1"),
        (["cgroup.controllers", "cgroup.subtree_control"], "v2"),
        (["cgroup.controllers", "cpu/", "memory/", "pids/"], "v2"),
        (["cpu/", "memory/"], "none"),
    ],
    ids=["v1", "v2", "v2-hybrid-names", "no-pids"],
)
def test_the_cgroup_layout_is_told_apart(tmp_path: Path, made: list[str], layout: str) -> None:
    for name in made:
        path = tmp_path / name
        path.mkdir() if name.endswith("/") else path.write_text("")
    lib = ROOT / "hack" / "cluster" / "lib.sh"
    out = subprocess.run(
        ["bash", "-c", f'source "{lib}"; cgroup_layout "{tmp_path}"'],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == layout, out.stdout + out.stderr


def test_cluster_up_refuses_cgroup_v2_in_one_line(tmp_path: Path) -> None:
    """Issue 60, item 11: the preflight accepted cgroup v2, where cluster-up and cluster-down only
    handle v1 paths."""
    fs = tmp_path / "cgroup"
    fs.mkdir()
    (fs / "cgroup.controllers").write_text("cpu memory pids\n")
    env = {
        **os.environ,
        "GPUPIPE_CLUSTER_DIR": str(tmp_path / "state"),
        "GPUPIPE_CLUSTER_CACHE": str(tmp_path / "cache"),
        "GPUPIPE_CGROUP_FS": str(fs),
        # Past the cgroup check, the disk check stops it: a regression never builds a cluster.
        "GPUPIPE_MIN_FREE_GIB": "999999999",
    }
    out = subprocess.run(
        [str(ROOT / "hack" / "cluster-up.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 3, out.stdout + out.stderr
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("error: ")]
    assert "cgroup v2 (the unified hierarchy at " in line and "cgroup v1 only" in line, line
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("script", ["cluster-down.sh", "cluster-up.sh"])
def test_a_cache_without_the_clusters_marker_is_refused_and_kept(
    script: str, tmp_path: Path
) -> None:
    """Issue 60, item 10: cluster-down unmounted what lay under the cache's image store and
    removed containers there, unguarded: GPUPIPE_CLUSTER_CACHE=/var/lib reached the system
    containerd's. The cache is refused like the state folder."""
    theirs = tmp_path / "var-lib"
    (theirs / "containerd").mkdir(parents=True)
    (theirs / "containerd" / "theirs.db").write_text("x")
    state = tmp_path / "state"
    state.mkdir()
    (state / ".gpupipe-test-cluster").write_text("ours\n")
    env = {**os.environ, "GPUPIPE_CLUSTER_DIR": str(state), "GPUPIPE_CLUSTER_CACHE": str(theirs)}
    out = subprocess.run(
        [str(ROOT / "hack" / script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stdout + out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: cluster: {theirs} is not a test cluster's cache"), last
    assert sorted(p.name for p in theirs.rglob("*")) == ["containerd", "theirs.db"]
