"""trainer.base.storage against a real S3-compatible server (moto on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow.parquet as pq
import pytest

from trainer.base import outputs, storage
from trainer.base.errors import InputError
from trainer.base.outputs import OUTPUT_MARKER

pytestmark = pytest.mark.integration


@pytest.fixture(params=["s3", "minio"], ids=["s3", "minio"])
def root(request: pytest.FixtureRequest, s3_bucket: str) -> str:
    """A prefix in the test bucket, reached as s3:// or as KFP's minio:// (same server)."""
    return f"{request.param}://{s3_bucket}/run-1"


def _keys(s3_client: Any, bucket: str) -> list[str]:
    """The object keys in ``bucket``, without directory markers (keys ending in "/").

    pyarrow re-creates an empty marker for the parent "directory" after every delete, so that
    the parent keeps existing; such markers are not output.
    """
    contents = s3_client.list_objects_v2(Bucket=bucket).get("Contents", [])
    return sorted(o["Key"] for o in contents if not o["Key"].endswith("/"))


def test_bytes_and_json_round_trip(root: str, s3_client: Any, s3_bucket: str) -> None:
    storage.write_bytes(storage.join(root, "a", "b.bin"), b"\x00payload")
    storage.write_json(storage.join(root, "meta.json"), {"loss": 0.5, "epoch": 3})

    assert storage.read_bytes(storage.join(root, "a", "b.bin")) == b"\x00payload"
    assert storage.read_json(storage.join(root, "meta.json")) == {"epoch": 3, "loss": 0.5}
    raw = s3_client.get_object(Bucket=s3_bucket, Key="run-1/meta.json")["Body"].read()
    assert raw == b'{\n  "epoch": 3,\n  "loss": 0.5\n}\n'
    with storage.open_input(storage.join(root, "a", "b.bin")) as f:
        f.seek(1)
        assert f.read() == b"payload"


def test_exists_is_dir_list_dir(root: str) -> None:
    storage.write_text(storage.join(root, "d", "x.txt"), "x")
    storage.write_text(storage.join(root, "y.txt"), "y")

    assert storage.exists(root) and storage.is_dir(root)
    assert storage.exists(storage.join(root, "d")) and storage.is_dir(storage.join(root, "d"))
    assert storage.exists(storage.join(root, "y.txt"))
    assert not storage.is_dir(storage.join(root, "y.txt"))
    assert not storage.exists(storage.join(root, "nope"))
    assert storage.list_dir(root) == ["d", "y.txt"]
    assert storage.list_dir(storage.join(root, "nope")) == []


def test_open_output_publishes_only_on_success(root: str, s3_client: Any, s3_bucket: str) -> None:
    target = storage.join(root, "data.parquet")
    with pytest.raises(RuntimeError, match="crash"), storage.open_output(target) as f:
        f.write(b"partial")
        raise RuntimeError("crash")
    assert _keys(s3_client, s3_bucket) == []
    with storage.open_output(target) as f:
        f.write(b"whole")
    assert storage.read_bytes(target) == b"whole"


def _objects(s3_client: Any, bucket: str) -> dict[str, bytes]:
    """Every object (not directory markers) with its content."""
    return {
        k: s3_client.get_object(Bucket=bucket, Key=k)["Body"].read()
        for k in _keys(s3_client, bucket)
    }


def test_atomic_dir(root: str, s3_client: Any, s3_bucket: str) -> None:
    model = storage.join(root, "model")
    with pytest.raises(ValueError, match="bad"), outputs.atomic_dir(model, step="train") as tmp:
        storage.write_bytes(storage.join(tmp, "model.safetensors"), b"half")
        raise ValueError("bad")
    assert _keys(s3_client, s3_bucket) == []

    # An interrupted earlier attempt of the same step (its marker landed first) is replaced.
    storage.write_json(outputs.marker_uri(model), outputs.marker("train"))
    storage.write_text(storage.join(model, "stale.txt"), "from an interrupted attempt")
    with outputs.atomic_dir(model, step="train") as tmp:
        assert tmp.startswith(model + ".tmp-")
        storage.write_bytes(storage.join(tmp, "model.safetensors"), b"weights")
        storage.write_json(storage.join(tmp, "meta", "model.json"), {"arch": "mlp"})
        assert not storage.exists(storage.join(model, "model.safetensors"))
    assert storage.list_dir(model) == [OUTPUT_MARKER, "meta", "model.safetensors"]
    assert storage.read_bytes(storage.join(model, "model.safetensors")) == b"weights"
    assert outputs.read_marker(model)["step"] == "train"  # type: ignore[index]
    assert storage.list_dir(root) == ["model"]


@pytest.mark.parametrize(
    ("foreign", "fragment"),
    [
        ({"model/notes.txt": b"mine"}, "has no gpupipe marker"),
        ({"model/a/b.bin": b"mine", "model/.gpupipe-output.json": b"not json"}, "no gpupipe"),
        (
            {"model/.gpupipe-output.json": b'{"created_by": "gpupipe", "step": "preprocess"}'},
            "holds the output of the preprocess step",
        ),
        ({"model": b"a file"}, "is an existing file"),
    ],
    ids=["foreign-objects", "garbled-marker", "another-steps-output", "an-object"],
)
def test_atomic_dir_refuses_a_prefix_it_did_not_create(
    root: str, s3_client: Any, s3_bucket: str, foreign: dict[str, bytes], fragment: str
) -> None:
    for key, body in foreign.items():
        s3_client.put_object(Bucket=s3_bucket, Key=f"run-1/{key}", Body=body)
    before = _objects(s3_client, s3_bucket)
    model = storage.join(root, "model")

    with (
        pytest.raises(InputError, match=fragment) as info,
        outputs.atomic_dir(model, step="train") as tmp,
    ):
        storage.write_bytes(storage.join(tmp, "model.safetensors"), b"weights")

    assert info.value.code == "E_OUTPUT" and info.value.where == model
    assert _objects(s3_client, s3_bucket) == before


def test_preprocess_to_an_object_store(
    root: str, s3_client: Any, s3_bucket: str, tmp_path: Path
) -> None:
    """The step refuses a prefix holding someone's objects, writes a new one, replaces its own."""
    from trainer.steps.preprocess import PreprocessConfig, make_demo_table, preprocess

    pq.write_table(make_demo_table(300, seed=1), tmp_path / "d.parquet")
    cfg = PreprocessConfig(target="churned")
    s3_client.put_object(Bucket=s3_bucket, Key="run-1/theirs/keep.csv", Body=b"a,b\n1,2\n")
    before = _objects(s3_client, s3_bucket)

    with pytest.raises(InputError, match="has no gpupipe marker"):
        preprocess(
            cfg, data_uri=str(tmp_path / "d.parquet"), output_uri=storage.join(root, "theirs")
        )
    assert _objects(s3_client, s3_bucket) == before

    out = storage.join(root, "dataset")
    preprocess(cfg, data_uri=str(tmp_path / "d.parquet"), output_uri=out)
    first = _objects(s3_client, s3_bucket)
    storage.write_text(storage.join(out, "stale.txt"), "left by an interrupted attempt")
    preprocess(cfg, data_uri=str(tmp_path / "d.parquet"), output_uri=out)
    assert storage.list_dir(out) == sorted(
        [OUTPUT_MARKER, "schema.json", "stats.json", "test.parquet", "train.parquet", "val.parquet"]
    )
    again = _objects(s3_client, s3_bucket)
    marker_key = f"run-1/dataset/{OUTPUT_MARKER}"
    assert {k: v for k, v in again.items() if k != marker_key} == {
        k: v for k, v in first.items() if k != marker_key
    }  # the same bytes (deterministic), the stale object gone, theirs untouched


def test_copy_tree_local_to_s3_and_back(root: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub" / "deeper").mkdir(parents=True)
    (src / "a.txt").write_text("a")
    (src / "sub" / "deeper" / "b.bin").write_bytes(b"b" * 100_000)

    storage.copy_tree(str(src), storage.join(root, "tree"))
    assert storage.list_dir(storage.join(root, "tree")) == ["a.txt", "sub"]
    assert (
        storage.read_bytes(storage.join(root, "tree", "sub", "deeper", "b.bin")) == b"b" * 100_000
    )

    storage.copy_tree(storage.join(root, "tree"), str(tmp_path / "back"))
    assert (tmp_path / "back" / "a.txt").read_text() == "a"
    assert (tmp_path / "back" / "sub" / "deeper" / "b.bin").read_bytes() == b"b" * 100_000

    storage.copy_tree(storage.join(root, "tree", "a.txt"), storage.join(root, "single.txt"))
    assert storage.read_text(storage.join(root, "single.txt")) == "a"


def test_copy_tree_to_a_new_local_folder_from_a_store_without_folder_markers(
    root: str, tmp_path: Path, s3_client: Any, s3_bucket: str
) -> None:
    """A store that lists no folder markers (SeaweedFS, behind KFP 2.17) shows files only: the
    copy must make the local folders itself (a real KFP run failed here: the train step copies
    the job's model into the output path KFP then uploads)."""
    model = storage.join(root, "run", "train", "salt", "model")
    storage.write_bytes(storage.join(model, "model.safetensors"), b"w" * 1000)
    storage.write_text(storage.join(model, "history.jsonl"), "{}\n")
    listed = s3_client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])
    for marker in [o["Key"] for o in listed if o["Key"].endswith("/")]:
        s3_client.delete_object(Bucket=s3_bucket, Key=marker)
    dst = tmp_path / "minio" / "bucket" / "run" / "train" / "salt" / "model"
    storage.copy_tree(model, str(dst))
    assert (dst / "model.safetensors").read_bytes() == b"w" * 1000
    assert (dst / "history.jsonl").read_text() == "{}\n"


def test_rename_and_delete(root: str) -> None:
    storage.write_text(storage.join(root, "d", "x.txt"), "x")
    storage.write_text(storage.join(root, "d", "s", "y.txt"), "y")
    storage.write_text(storage.join(root, "f.txt"), "f")

    storage.rename(storage.join(root, "d"), storage.join(root, "e"))
    storage.rename(storage.join(root, "f.txt"), storage.join(root, "g.txt"))
    assert storage.read_text(storage.join(root, "e", "s", "y.txt")) == "y"
    assert storage.read_text(storage.join(root, "g.txt")) == "f"
    assert not storage.exists(storage.join(root, "d"))
    assert not storage.exists(storage.join(root, "f.txt"))

    storage.write_text(storage.join(root, "h", "z.txt"), "z")
    with pytest.raises(FileExistsError, match="non-empty directory"):
        storage.rename(storage.join(root, "h"), storage.join(root, "e"))

    storage.delete(storage.join(root, "e"))
    storage.delete(storage.join(root, "g.txt"))
    storage.delete(storage.join(root, "never-there"))
    assert not storage.exists(storage.join(root, "e"))
    assert storage.list_dir(root) == ["h"]


def test_rename_across_filesystems(root: str, tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "w.bin").write_bytes(b"w")
    storage.rename(str(tmp_path / "ckpt"), storage.join(root, "ckpt"))
    assert not (tmp_path / "ckpt").exists()
    assert storage.read_bytes(storage.join(root, "ckpt", "w.bin")) == b"w"


def test_delete_refuses_bucket(s3_bucket: str) -> None:
    with pytest.raises(ValueError, match="refusing to delete a whole bucket"):
        storage.delete(f"s3://{s3_bucket}")


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (storage.read_bytes, FileNotFoundError, "reading s3://{b}/no/such/key: no such file"),
        (storage.read_json, FileNotFoundError, "reading s3://{b}/no/such/key: no such file"),
        (storage.copy_tree, FileNotFoundError, "copying s3://{b}/no/such/key to"),
    ],
    ids=["read_bytes", "read_json", "copy_tree"],
)
def test_missing_key(call: Any, error: type[Exception], message: str, s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/no/such/key"
    args = (uri, uri + "-copy") if call is storage.copy_tree else (uri,)
    with pytest.raises(error, match=message.format(b=s3_bucket)):
        call(*args)


def test_missing_bucket(s3_server: str) -> None:
    with pytest.raises(FileNotFoundError, match="reading s3://absent/k: bucket 'absent' does not"):
        storage.read_bytes("s3://absent/k")
    with pytest.raises(RuntimeError, match=r"writing s3://absent/k: .*bucket does not exist"):
        storage.write_bytes("s3://absent/k", b"x")
    with (
        pytest.raises(RuntimeError, match=r"writing minio://absent/k: .*bucket does not exist"),
        storage.open_output("minio://absent/k") as f,
    ):
        f.write(b"x")
    assert not storage.exists("s3://absent/k")
    assert storage.list_dir("s3://absent") == []


def test_unreachable_endpoint(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")
    with pytest.raises(RuntimeError, match=r"s3://b/k: .*(connect|NETWORK)"):
        storage.exists("s3://b/k")


@contextmanager
def _refused_then_forwarded(refused_s: float, to: str) -> Iterator[str]:
    """An endpoint on 127.0.0.1 whose port refuses connections for ``refused_s`` seconds (no
    listener yet, as a NetworkPolicy agent refuses a new pod's first connections), then forwards
    each connection to the server at ``to``; yields its ``http://host:port``."""
    target = urlsplit(to)
    with socket.socket() as probe:  # a free port, listened on only after the refusal
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    stop = threading.Event()

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def serve() -> None:
        if stop.wait(refused_s):
            return
        with socket.create_server(("127.0.0.1", port)) as server:
            server.settimeout(0.2)
            while not stop.is_set():
                try:
                    client, _ = server.accept()
                except TimeoutError:
                    continue
                upstream = socket.create_connection((target.hostname, target.port))
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(timeout=5)


def test_a_store_that_refuses_connections_for_a_few_seconds_is_read_once_it_answers(
    s3_client: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new pod's first reads under an enforcing NetworkPolicy agent (kube-router) were refused
    for a moment, and the step failed (E_EXTERNAL ... curlCode: 7): in a pod each request is now
    tried S3_REQUEST_ATTEMPTS_IN_POD times (10 to 20 s), where the SDK's default 3 gave up within
    2.5 s."""
    s3_client.put_object(Bucket=s3_bucket, Key="config.json", Body=b'{"epochs": 2}')
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.127.0.1")  # as the kubelet sets it in a pod
    assert storage.s3_request_attempts() == storage.S3_REQUEST_ATTEMPTS_IN_POD
    with _refused_then_forwarded(4.0, s3_client.meta.endpoint_url) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
        assert storage.read_json(f"s3://{s3_bucket}/config.json") == {"epochs": 2}


# --- issue 39, item 4: a publish on an object store is never half-done ---------------------


def _earlier_output(model: str) -> None:
    """An earlier output of the train step under ``model``: a.bin, b.bin and stale.txt."""
    with outputs.atomic_dir(model, step="train") as tmp:
        for name in ("a.bin", "b.bin", "stale.txt"):
            storage.write_bytes(storage.join(tmp, name), b"old " + name.encode())


def _under(s3_client: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    return {
        k[len(prefix) :]: v for k, v in _objects(s3_client, bucket).items() if k.startswith(prefix)
    }


def test_a_reader_sees_every_file_old_or_new_while_a_publish_replaces_them(
    root: str, s3_client: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = storage.join(root, "model")
    _earlier_output(model)
    prefix = model.split(f"{s3_bucket}/", 1)[1] + "/"
    seen: list[dict[str, bytes]] = []

    def watched(real: Any) -> Any:
        def call(*args: Any) -> Any:
            out = real(*args)
            seen.append(_under(s3_client, s3_bucket, prefix))  # what a reader sees now
            return out

        return call

    monkeypatch.setattr(storage, "copy_tree", watched(storage.copy_tree))
    monkeypatch.setattr(storage, "delete", watched(storage.delete))
    with outputs.atomic_dir(model, step="train") as tmp:
        for name in ("a.bin", "b.bin", "c.bin"):
            storage.write_bytes(storage.join(tmp, name), b"new " + name.encode())
    assert seen
    for view in seen:  # at every moment both files are there, each whole: old or new
        for name in ("a.bin", "b.bin"):
            assert view.get(name) in (b"old " + name.encode(), b"new " + name.encode()), view
    after = _under(s3_client, s3_bucket, prefix)
    assert {k: v for k, v in after.items() if k != OUTPUT_MARKER} == {
        n: b"new " + n.encode() for n in ("a.bin", "b.bin", "c.bin")
    }
    assert storage.list_dir(root) == ["model"]


def test_a_publish_that_fails_midway_leaves_the_earlier_output_as_it_was(
    root: str, s3_client: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = storage.join(root, "model")
    _earlier_output(model)
    before = _objects(s3_client, s3_bucket)
    real, copies = storage.copy_tree, []

    def failing(src: str, dst: str) -> None:
        if ".tmp-" in src:  # a file of the new output
            copies.append(src)
            if len(copies) == 2:
                raise RuntimeError("object store went away")
        real(src, dst)

    monkeypatch.setattr(storage, "copy_tree", failing)
    with (
        pytest.raises(RuntimeError, match="went away"),
        outputs.atomic_dir(model, step="train") as tmp,
    ):
        for name in ("a.bin", "b.bin", "c.bin"):
            storage.write_bytes(storage.join(tmp, name), b"new " + name.encode())
    after = _objects(s3_client, s3_bucket)
    assert {k: v for k, v in after.items() if not k.endswith(OUTPUT_MARKER)} == {
        k: v for k, v in before.items() if not k.endswith(OUTPUT_MARKER)
    }
    assert storage.list_dir(root) == ["model"]
