"""Tests for preprocess by several processes (the merges it rests on, and the whole run with its
ranks as threads): the result equals one process's bit for bit, and one rank's bad input ends
every rank. The real torchrun runs are in tests/integration/test_preprocess_wide.py."""

from __future__ import annotations

import json
import pickle
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import assert_valid_job, demo_parts, needs_crd
from tests.unit.specs import BASE, job_spec
from trainer.base.errors import InputError
from trainer.base.typedconfig import from_dict
from trainer.launch import TrainingRun
from trainer.launch.jobspec import WORKER_COMMAND, ClusterConfig, JobSpec
from trainer.launch.pytorchjob import build_pytorchjob
from trainer.steps.preprocess import (
    PreprocessConfig,
    preprocess,
    stream_stats,
    wide,
)
from trainer.steps.preprocess.peers import file_groups, first_error
from trainer.steps.preprocess.published import PreprocessResult
from trainer.steps.preprocess.quantile import MedianSelect, order_keys
from trainer.steps.preprocess.stream import preprocess_streaming
from trainer.steps.preprocess.stream_stats import CatStats, Moments, MomentStream, fold
from trainer.steps.preprocess.wide import (
    PodsJob,
    cluster_run,
    for_pods,
    pods_for,
    run_on_cluster,
    workers_for,
)

T = TypeVar("T")
SPLITS = ("train", "val", "test")


@pytest.mark.parametrize(
    ("sizes", "world", "want"),
    [
        ([10, 10, 10, 10, 10, 10], 3, [(0, 2), (2, 4), (4, 6)]),
        ([100, 1, 1, 1], 2, [(0, 1), (1, 4)]),
        ([5, 5], 3, [(0, 1), (1, 1), (1, 2)]),
        ([7], 3, [(0, 0), (0, 1), (1, 1)]),
        ([0, 0, 0, 0], 2, [(0, 2), (2, 4)]),
        ([1, 1, 1, 1, 1, 1, 1, 50], 4, [(0, 7), (7, 7), (7, 8), (8, 8)]),
    ],
    ids=["even", "one-heavy-first", "fewer-files", "one-file", "empty-files", "heavy-last"],
)
def test_file_groups_are_contiguous_and_balanced_by_bytes(
    sizes: list[int], world: int, want: list[tuple[int, int]]
) -> None:
    groups = file_groups(sizes, world)
    assert [(g.start, g.stop) for g in groups] == want
    assert [i for g in groups for i in g] == list(range(len(sizes)))


@pytest.mark.parametrize("cuts", [[5], [1, 16384, 3], [20000], [16383, 1, 16384, 7]])
def test_moment_stream_does_not_depend_on_the_batches(cuts: list[int]) -> None:
    """A file's moments are the same bits however its values come in batches."""
    x = np.random.default_rng(0).lognormal(3, 2, 40001)
    whole = MomentStream()
    whole.add(x)
    want = whole.finish()
    stream = MomentStream()
    at = 0
    for i in range(10**6):
        if at >= x.size:
            break
        step = cuts[i % len(cuts)]
        stream.add(x[at : at + step])
        at += step
    assert stream.finish() == want
    assert want.n == x.size
    assert want.mean == pytest.approx(x.mean(), rel=1e-12)
    assert np.sqrt(want.m2 / want.n) == pytest.approx(x.std(), rel=1e-10)


def test_moments_merge_into_nothing_copies() -> None:
    a = Moments.of(np.array([1.0, 2.0, 4.0]))
    m = Moments()
    m.merge(a)
    assert m == a
    assert fold([Moments(), a, Moments()]) == a


@pytest.mark.parametrize("cap", [50, 100_000], ids=["refines", "collects"])
@pytest.mark.parametrize("parts", [1, 3, 5])
def test_median_merged_over_ranks_is_numpys(cap: int, parts: int) -> None:
    """Ranks that each see some of the values, exchanging each pass's state, reach np.median."""
    x = np.round(np.random.default_rng(2).normal(0, 5, 20001), 2)
    pieces = np.array_split(x, parts)
    if parts > 1:
        pieces[1] = pieces[1][:0]  # a rank with nothing to feed
    ranks = [MedianSelect(cap=cap) for _ in range(parts)]
    for _ in range(10):
        for sel, piece in zip(ranks, pieces, strict=True):
            sel.feed(order_keys(piece))
        states = [sel.pass_state() for sel in ranks]
        for sel in ranks:
            sel.merge_pass(states)
        done = [sel.end_pass() for sel in ranks]
        assert len(set(done)) == 1
        if done[0]:
            break
    assert all(sel.value == np.median(np.concatenate(pieces)) for sel in ranks)


def test_category_counts_merge_exactly() -> None:
    rng = np.random.default_rng(3)
    values = [f"v{i}" for i in range(40)]
    codes = rng.integers(-1, 40, 9000)
    train = rng.random(9000) < 0.7
    one = CatStats()
    stream_stats.count_categories(one, codes, values, train)
    merged = CatStats()
    for part in np.array_split(np.arange(9000), 3):
        st = CatStats()
        stream_stats.count_categories(st, codes[part], values, train[part])
        merged.merge(st)
    assert merged == one and not merged.approximate


def test_auto_workers(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"p{i}.csv").write_text("a,b\n1,2\n")
    cfg = from_dict(PreprocessConfig, {"target": "b"})
    assert workers_for(cfg, str(tmp_path), 8 << 30) == 1  # a few bytes: one process
    explicit = from_dict(PreprocessConfig, {"target": "b", "workers": 5})
    assert workers_for(explicit, str(tmp_path), 8 << 30) == 5
    with pytest.raises(ValueError, match="workers"):
        from_dict(PreprocessConfig, {"target": "b", "workers": -1})


# The whole run, its ranks as threads of this process (the torchrun runs are integration tests).


class _Board:
    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=120)
        self.slots: list[Any] = [None] * world

    def exchange(self, rank: int, value: Any) -> list[Any]:
        self.slots[rank] = pickle.loads(pickle.dumps(value))  # as gloo's object collectives
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


class ThreadPeers:
    """:class:`~trainer.steps.preprocess.peers.Peers` over threads (what wide.Group does over
    gloo, without pickling)."""

    def __init__(self, board: _Board, rank: int, world: int) -> None:
        self.board, self.rank, self.world = board, rank, world

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _try(self, work: Callable[[], Any]) -> tuple[bool, Any]:
        try:
            return True, work()
        except ValueError as e:
            return False, e

    def all(self, work: Callable[[], T]) -> list[T]:
        got = self.board.exchange(self.rank, self._try(work))
        first_error(got)
        return [v for _, v in got]

    def gather(self, work: Callable[[], T]) -> list[T] | None:
        values = self.all(work)
        return values if self.is_main else None

    def main(self, work: Callable[[], T]) -> T:
        got = self.board.exchange(self.rank, self._try(work) if self.is_main else None)
        first_error(got[:1])
        return got[0][1]  # type: ignore[no-any-return]

    def scatter(self, work: Callable[[], list[T]]) -> T:
        parts = self.main(work)
        return parts[self.rank]


def run_threads(
    world: int, cfg: PreprocessConfig, data: Path, out: Path, budget: int = 16 << 20
) -> list[Any]:
    """Every rank's result or exception."""
    board = _Board(world)
    results: list[Any] = [None] * world

    def rank_main(rank: int) -> None:
        try:
            results[rank] = preprocess_streaming(
                cfg, data_uri=str(data), output_uri=str(out), fingerprint="fp",
                budget=budget, peers=ThreadPeers(board, rank, world), plan_budget=64 << 20,
            )  # fmt: skip
        except BaseException as e:  # handed to the test
            results[rank] = e

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return results


def one_process(cfg: PreprocessConfig, data: Path, out: Path) -> Any:
    return preprocess_streaming(
        cfg, data_uri=str(data), output_uri=str(out), fingerprint="fp", budget=64 << 20
    )


def assert_identical(a: Path, b: Path) -> None:
    """Same splits row for row and features bit for bit (tables read back), same documents."""
    for split in SPLITS:
        ta, tb = pq.read_table(a / f"{split}.parquet"), pq.read_table(b / f"{split}.parquet")
        assert ta.num_rows > 0
        assert ta.equals(tb), split
    for doc in ("schema.json", "stats.json"):
        assert json.loads((a / doc).read_text()) == json.loads((b / doc).read_text()), doc


def dataset(root: Path, fmt: str, task: str, sizes: list[int]) -> Path:
    """A folder of files with the demo table's rows cut at ``sizes`` (some text and gaps)."""
    return demo_parts(root, fmt, task, sizes, seed=4, row_group_size=500)


@pytest.mark.parametrize(
    ("fmt", "task", "sizes", "world"),
    [
        ("parquet", "classification", [1500, 700, 2600, 900, 1300], 3),
        ("csv", "regression", [1200, 1800, 800, 2200], 3),
        ("parquet", "regression", [3000, 2500], 3),
        ("csv", "classification", [5000], 2),
    ],
    ids=["parquet-3", "csv-3", "fewer-files-than-ranks", "one-file"],
)
def test_ranks_as_threads_equal_one_process(
    tmp_path: Path, fmt: str, task: str, sizes: list[int], world: int
) -> None:
    data = dataset(tmp_path / "data", fmt, task, sizes)
    cfg = from_dict(
        PreprocessConfig, {"target": "churned" if task == "classification" else "spend"}
    )
    want = one_process(cfg, data, tmp_path / "one")
    results = run_threads(world, cfg, data, tmp_path / "wide")
    assert results[0] == want
    assert not any(isinstance(r, BaseException) for r in results), results
    assert_identical(tmp_path / "one", tmp_path / "wide")
    cols = json.loads((tmp_path / "one" / "schema.json").read_text())["columns"]
    assert any(c["kind"] == "numeric" and c["train_missing"] for c in cols)  # medians imputed


def test_bad_value_in_the_last_ranks_file_ends_every_rank(tmp_path: Path) -> None:
    data = dataset(tmp_path / "data", "parquet", "classification", [1000, 1000, 1000])
    bad = pq.read_table(data / "part-02.parquet").to_pylist()
    bad[17]["churned"] = None
    pq.write_table(pa.Table.from_pylist(bad), data / "part-02.parquet")
    cfg = from_dict(PreprocessConfig, {"target": "churned"})
    results = run_threads(3, cfg, data, tmp_path / "wide")
    assert all(isinstance(r, InputError) for r in results), results
    assert len({str(r) for r in results}) == 1
    assert "part-02.parquet" in str(results[0]) and "row 18" in str(results[0]), results[0]
    assert not (tmp_path / "wide").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["data"]  # no temporary folder left


# The cluster side: the job of N preprocess pods, as the launchers build it.


@needs_crd
def test_cluster_run_is_a_pytorchjob_of_preprocess_pods(tmp_path: Path) -> None:
    cfg = from_dict(PreprocessConfig, {"target": "churned", "seed": 3})
    run = cluster_run(
        cfg, workers=3, data_uri="s3://bucket/data/", output_uri="s3://bucket/out/dataset",
        fingerprint="abc", work_uri=str(tmp_path), job_name="gpupipe-preprocess-r1-0123456789",
    )  # fmt: skip
    assert json.loads((tmp_path / "preprocess-config.json").read_text())["seed"] == 3
    spec = JobSpec(
        namespace="team-a",
        run=run,
        cluster=ClusterConfig(
            image="ghcr.io/gpupipe/trainer-cpu:0.1.0",
            memory_request="4Gi",
            memory_limit="8Gi",
            shm_size="1Gi",
        ),
    )
    job = build_pytorchjob(spec)
    assert_valid_job(job)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    assert job["spec"]["nprocPerNode"] == "1"  # one process a pod, no GPU asked for
    (c,) = replicas["Worker"]["template"]["spec"]["containers"]
    assert c["command"] == [
        "python", "-m", "trainer.launch", "-m", "trainer.steps.preprocess.wide",
        "--config", str(tmp_path / "preprocess-config.json"),
        "--data", "s3://bucket/data/", "--output", "s3://bucket/out/dataset",
        "--fingerprint", "abc", "--result", str(tmp_path / "preprocess-result.json"),
    ]  # fmt: skip
    assert "nvidia.com/gpu" not in json.dumps(c["resources"])
    # The training job's command is unchanged.
    train = build_pytorchjob(job_spec())
    (t,) = train["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    assert t["command"] == [*WORKER_COMMAND, BASE["config_uri"]]


def test_run_on_cluster_launches_the_run_and_returns_mains_result(tmp_path: Path) -> None:
    cfg = from_dict(PreprocessConfig, {"target": "churned"})
    run = cluster_run(
        cfg, workers=3, data_uri="s3://b/d/", output_uri="s3://b/o", fingerprint="f",
        work_uri=str(tmp_path), job_name="gpupipe-preprocess-r1-0123456789",
    )  # fmt: skip
    done = PreprocessResult(7, 2, 1, ["a"], "classification", ["no", "yes"], "h", ["NOTE x"])
    launched: list[TrainingRun] = []

    class Main:
        """What the job's main leaves behind (``--result``)."""

        def launch(self, run: TrainingRun) -> None:
            launched.append(run)
            result = run.args[run.args.index("--result") + 1]
            Path(result).write_text(json.dumps(done.to_dict()))

    assert run_on_cluster(Main(), run, str(tmp_path)) == done
    assert launched == [run] and run.step == "preprocess" and run.nnodes == 3


# launcher: pytorchjob, as the component and `python -m trainer preprocess` set it up.


def test_the_component_fills_the_pods_image_and_secrets_from_the_pipeline() -> None:
    cfg = from_dict(PreprocessConfig, {"target": "churned", "launcher": "pytorchjob"})
    out, job = for_pods(
        cfg, data_uri="minio://b/data/", output_uri="minio://b/run/dataset", run_id="run-1",
        task_name="preprocess", image="reg/trainer-cpu@sha256:ab", object_store_secret="store",
        image_pull_secrets=["pull"],
    )  # fmt: skip
    assert (out.cluster.image, out.cluster.object_store_secret) == (
        "reg/trainer-cpu@sha256:ab",
        "store",
    )
    assert out.cluster.image_pull_secrets == ["pull"]
    assert (out.cluster.cpu_request, out.cluster.memory_limit, out.cluster.shm_size) == (
        "500m", "4Gi", "64Mi",
    )  # fmt: skip
    assert job is not None and job.name.startswith("gpupipe-preprocess-run-1")
    assert (job.data_uri, job.output_uri, job.work_uri) == (
        "minio://b/data/", "minio://b/run/dataset", "minio://b/run/dataset-work",
    )  # fmt: skip
    # The step's own settings win over the pipeline's.
    own = from_dict(
        PreprocessConfig,
        {"target": "churned", "launcher": "pytorchjob", "cluster": {"image": "mine:1"}},
    )
    where = {"data_uri": "s3://b/d", "output_uri": "s3://b/o", "run_id": "r", "task_name": "p"}
    mine, _ = for_pods(own, **where, image="their:2", object_store_secret="", image_pull_secrets=[])
    assert mine.cluster.image == "mine:1"
    local = from_dict(PreprocessConfig, {"target": "churned"})
    kept = for_pods(local, **where, image="i", object_store_secret="s", image_pull_secrets=[])
    assert kept == (local, None)


@pytest.mark.parametrize(
    ("over", "where"),
    [
        ({"launcher": "kubernetes"}, "launcher"),
        ({"cluster": {"cpu_request": "lots"}}, "cluster.cpu_request"),
        ({"cluster": {"memory_limit": "512Mi"}}, "cluster.memory_request"),
        ({"cluster": {"shm_size": "8Gi"}}, "cluster.shm_size"),
    ],
)
def test_a_bad_pods_setting_is_named_in_one_line(over: dict[str, Any], where: str) -> None:
    with pytest.raises(InputError) as e:
        from_dict(PreprocessConfig, {"target": "churned", **over})
    assert e.value.code == "E_CONFIG" and where in str(e.value) and "\n" not in str(e.value)


def test_pods_are_chosen_from_the_files_sizes_not_this_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(12):
        (data / f"part-{i:02}.parquet").write_bytes(b"x" * 100)
    cfg = from_dict(PreprocessConfig, {"target": "y", "launcher": "pytorchjob"})
    monkeypatch.setattr(wide, "BYTES_PER_WORKER", 250)
    monkeypatch.setattr(wide.os, "sched_getaffinity", lambda _pid: {0}, raising=False)
    assert pods_for(cfg, str(data)) == 5  # 1200 bytes / 250, though this machine has one CPU
    monkeypatch.setattr(wide, "BYTES_PER_WORKER", 1)
    assert pods_for(cfg, str(data)) == wide.MAX_WORKERS
    assert pods_for(from_dict(PreprocessConfig, {"target": "y", "workers": 3}), str(data)) == 3


def test_more_than_one_pod_needs_store_locations(tmp_path: Path) -> None:
    data = dataset(tmp_path / "data", "parquet", "classification", [300, 300, 300])
    cfg = from_dict(PreprocessConfig, {"target": "churned", "launcher": "pytorchjob", "workers": 3})
    with pytest.raises(InputError, match="no store location") as e:
        preprocess(cfg, data_uri=str(data), output_uri=str(tmp_path / "out"))
    assert e.value.code == "E_CONFIG"
    job = PodsJob("gpupipe-preprocess-x", str(data), str(tmp_path / "out"), "s3://b/work")
    with pytest.raises(InputError, match="cannot reach a local path") as e:
        preprocess(cfg, data_uri=str(data), output_uri=str(tmp_path / "out"), pods=job)
    assert str(data) in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # nothing written


def test_the_pods_config_is_json_and_runs_the_local_streaming_path(tmp_path: Path) -> None:
    cfg = from_dict(
        PreprocessConfig,
        {"target": "churned", "launcher": "pytorchjob", "cluster": {"cpu_limit": "3"}},
    )
    cluster_run(
        cfg, workers=3, data_uri="s3://b/d/", output_uri="s3://b/o", fingerprint="f",
        work_uri=str(tmp_path), job_name="gpupipe-preprocess-r1-0123456789",
    )  # fmt: skip
    sent = json.loads((tmp_path / "preprocess-config.json").read_text())
    pod = from_dict(PreprocessConfig, sent)
    assert (pod.launcher, pod.workers, pod.cluster.cpu_limit) == ("local", 1, "3")
