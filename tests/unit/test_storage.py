"""trainer.base.storage on the local filesystem (object stores: the integration tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from trainer.base import storage
from trainer.base.errors import InputError


def _uri(kind: str, path: Path) -> str:
    """Spell local ``path`` as a plain absolute path, a relative path or a file:// URI."""
    if kind == "absolute":
        return str(path)
    if kind == "relative":
        return os.path.relpath(path)
    return f"file://{path}"


LOCAL_KINDS = pytest.mark.parametrize("kind", ["absolute", "relative", "file"])


def _s3_options(fs: pafs.FileSystem) -> dict[str, object]:
    """The options an S3FileSystem was built with (pyarrow exposes them only for pickling)."""
    return fs.__reduce__()[1][0]


@pytest.fixture(autouse=True)
def _cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in tmp_path so relative URIs stay inside it."""
    monkeypatch.chdir(tmp_path)


# ------------------------------------------------------------------------------------------------
# resolve, join, local_path
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected_type", "expected_path"),
    [
        ("s3://bucket/a/b.txt", "s3", "bucket/a/b.txt"),
        ("s3://bucket", "s3", "bucket"),
        ("s3://bucket/dir/", "s3", "bucket/dir"),
        ("minio://mlpipeline/artifacts/x", "s3", "mlpipeline/artifacts/x"),
        ("gs://bucket/obj", "gcs", "bucket/obj"),
        ("S3://bucket/k", "s3", "bucket/k"),
    ],
    ids=["s3-key", "s3-bucket", "s3-trailing-slash", "minio", "gs", "upper-case-scheme"],
)
def test_resolve_object_stores(
    uri: str, expected_type: str, expected_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPIPE_GCS_ANONYMOUS", "1")
    fs, path = storage.resolve(uri)
    assert fs.type_name == expected_type
    assert path == expected_path
    assert storage.local_path(uri) is None


@LOCAL_KINDS
def test_resolve_local(kind: str, tmp_path: Path) -> None:
    fs, path = storage.resolve(_uri(kind, tmp_path / "a.txt"))
    assert isinstance(fs, pafs.LocalFileSystem)
    assert path == str(tmp_path / "a.txt")
    assert storage.local_path(_uri(kind, tmp_path / "a.txt")) == str(tmp_path / "a.txt")


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("hdfs://nn/data", "unsupported URI scheme 'hdfs' in 'hdfs://nn/data'"),
        ("http://example.com/x", "unsupported URI scheme 'http'"),
        ("s3://", "must name a bucket"),
        ("s3:///key", "must name a bucket"),
        ("gs://", "must name a bucket"),
        ("file://otherhost/x", "no host"),
        ("", "must not be empty"),
    ],
    ids=["hdfs", "http", "s3-empty", "s3-no-bucket", "gs-empty", "file-host", "empty"],
)
def test_resolve_rejects_bad_uris(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        storage.resolve(uri)


def test_unsupported_scheme_fails_every_operation() -> None:
    with pytest.raises(ValueError, match="hdfs://nn/x"):
        storage.read_bytes("hdfs://nn/x")
    with pytest.raises(ValueError, match="hdfs://nn/x"):
        storage.local_path("hdfs://nn/x")


def test_s3_endpoint_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9999")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    fs, _ = storage.resolve("s3://b/k")
    options = _s3_options(fs)
    assert (options["scheme"], options["endpoint_override"]) == ("http", "127.0.0.1:9999")
    assert (options["access_key"], options["secret_key"], fs.region) == ("k", "s", "eu-west-1")
    assert storage.resolve("s3://b/other")[0] is fs  # cached per configuration
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9998")
    assert storage.resolve("s3://b/k")[0] is not fs


@pytest.mark.parametrize(
    ("minio_endpoint", "expected"),
    [(None, "seaweedfs.kubeflow:9000"), ("http://minio.local:9000", "minio.local:9000")],
    ids=["default", "env"],
)
def test_minio_endpoint(
    minio_endpoint: str | None, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if minio_endpoint is None:
        monkeypatch.delenv("MINIO_ENDPOINT", raising=False)
    else:
        monkeypatch.setenv("MINIO_ENDPOINT", minio_endpoint)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    fs, path = storage.resolve("minio://mlpipeline/v2/artifacts")
    options = _s3_options(fs)
    assert (options["scheme"], options["endpoint_override"]) == ("http", expected)
    assert options["force_virtual_addressing"] is False
    assert fs.region == "us-east-1"
    assert path == "mlpipeline/v2/artifacts"


@pytest.mark.parametrize(
    ("minio_key", "expected"), [("mk", "mk"), (None, "aws-k")], ids=["minio-creds", "aws-fallback"]
)
def test_minio_credentials(
    minio_key: str | None, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "aws-k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-s")
    if minio_key is None:
        monkeypatch.delenv("MINIO_ACCESS_KEY", raising=False)
        monkeypatch.delenv("MINIO_SECRET_KEY", raising=False)
    else:
        monkeypatch.setenv("MINIO_ACCESS_KEY", minio_key)
        monkeypatch.setenv("MINIO_SECRET_KEY", "ms")
    assert _s3_options(storage.resolve("minio://b/k")[0])["access_key"] == expected


def test_bad_endpoint_is_a_value_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "ftp://host:21")
    with pytest.raises(ValueError, match="ftp://host:21"):
        storage.resolve("s3://b/k")


@pytest.mark.parametrize(
    ("base", "parts", "expected"),
    [
        ("s3://b/x", ("y",), "s3://b/x/y"),
        ("s3://b/x/", ("y", "z.json"), "s3://b/x/y/z.json"),
        ("s3://b", ("/y/",), "s3://b/y"),
        ("gs://b/x", ("y",), "gs://b/x/y"),
        ("minio://mlpipeline/a", ("b", "c"), "minio://mlpipeline/a/b/c"),
        ("file:///tmp/a", ("b",), "file:///tmp/a/b"),
        ("/tmp/a", ("b", "c"), "/tmp/a/b/c"),
        ("rel/a", ("/b",), "rel/a/b"),
        ("s3://b/x", (), "s3://b/x"),
    ],
    ids=["s3", "s3-slash", "s3-bucket-abs-part", "gs", "minio", "file", "abs", "rel", "no-parts"],
)
def test_join(base: str, parts: tuple[str, ...], expected: str) -> None:
    assert storage.join(base, *parts) == expected


# ------------------------------------------------------------------------------------------------
# reading and writing
# ------------------------------------------------------------------------------------------------


@LOCAL_KINDS
def test_round_trips(kind: str, tmp_path: Path) -> None:
    base = _uri(kind, tmp_path / "out")
    storage.write_bytes(storage.join(base, "deep", "a.bin"), b"\x00\x01")
    storage.write_text(storage.join(base, "t.txt"), "héllo")
    storage.write_json(storage.join(base, "m.json"), {"b": 1, "a": [1.5, None]})

    assert storage.read_bytes(storage.join(base, "deep", "a.bin")) == b"\x00\x01"
    assert storage.read_text(storage.join(base, "t.txt")) == "héllo"
    assert storage.read_json(storage.join(base, "m.json")) == {"a": [1.5, None], "b": 1}
    raw = (tmp_path / "out" / "m.json").read_text()
    assert raw == '{\n  "a": [\n    1.5,\n    null\n  ],\n  "b": 1\n}\n'
    assert storage.exists(base) and storage.is_dir(base)
    assert storage.exists(storage.join(base, "t.txt")) and not storage.is_dir(
        storage.join(base, "t.txt")
    )
    assert storage.list_dir(base) == ["deep", "m.json", "t.txt"]
    with storage.open_input(storage.join(base, "t.txt")) as f:
        assert f.read() == "héllo".encode()


def test_write_leaves_no_temp_file(tmp_path: Path) -> None:
    storage.write_bytes(str(tmp_path / "a.bin"), b"one")
    storage.write_bytes(str(tmp_path / "a.bin"), b"two")
    assert sorted(os.listdir(tmp_path)) == ["a.bin"]
    assert (tmp_path / "a.bin").read_bytes() == b"two"


@pytest.mark.parametrize("failing", ["fsync", "replace"], ids=["fsync-fails", "rename-fails"])
def test_failed_write_keeps_old_content(
    failing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "model.json"
    storage.write_json(str(target), {"v": 1})

    def boom(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, boom)
    with pytest.raises(OSError, match="No space left"):
        storage.write_json(str(target), {"v": 2})
    monkeypatch.undo()
    assert storage.read_json(str(target)) == {"v": 1}
    assert sorted(os.listdir(tmp_path)) == ["model.json"]


def test_unserialisable_json_touches_nothing(tmp_path: Path) -> None:
    target = str(tmp_path / "m.json")
    storage.write_json(target, {"v": 1})
    with pytest.raises(TypeError):
        storage.write_json(target, {"v": object()})
    assert storage.read_json(target) == {"v": 1}


def test_open_output_publishes_only_on_success(tmp_path: Path) -> None:
    target = tmp_path / "data.parquet"
    with pytest.raises(RuntimeError, match="crash"), storage.open_output(str(target)) as f:
        f.write(b"partial")
        raise RuntimeError("crash")
    assert os.listdir(tmp_path) == []
    with storage.open_output(str(target)) as f:
        f.write(b"whole")
    assert target.read_bytes() == b"whole"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda u: storage.read_bytes(u), "reading .*missing.bin: no such file"),
        (lambda u: storage.read_json(u), "reading .*missing.bin: no such file"),
        (lambda u: storage.open_input(u).__enter__(), "opening .*missing.bin: no such file"),
        (lambda u: storage.copy_tree(u, u + ".copy"), "copying .*missing.bin to"),
        (lambda u: storage.rename(u, u + ".new"), "renaming .*missing.bin to"),
    ],
    ids=["read_bytes", "read_json", "open_input", "copy_tree", "rename"],
)
def test_missing_file_errors_name_the_uri(call, message: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FileNotFoundError, match=message):
        call(str(tmp_path / "missing.bin"))


def test_invalid_json_names_the_uri(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ValueError, match=r"invalid JSON in .*bad\.json"):
        storage.read_json(str(tmp_path / "bad.json"))


# ------------------------------------------------------------------------------------------------
# tree operations
# ------------------------------------------------------------------------------------------------


def _make_tree(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")


def test_list_dir(tmp_path: Path) -> None:
    _make_tree(tmp_path / "t")
    assert storage.list_dir(str(tmp_path / "t")) == ["a.txt", "sub"]
    assert storage.list_dir(str(tmp_path / "nope")) == []
    with pytest.raises(NotADirectoryError, match=r"a\.txt"):
        storage.list_dir(str(tmp_path / "t" / "a.txt"))


@LOCAL_KINDS
def test_delete(kind: str, tmp_path: Path) -> None:
    _make_tree(tmp_path / "t")
    storage.delete(_uri(kind, tmp_path / "t" / "a.txt"))
    assert not (tmp_path / "t" / "a.txt").exists()
    storage.delete(_uri(kind, tmp_path / "t"))
    assert not (tmp_path / "t").exists()
    storage.delete(_uri(kind, tmp_path / "t"))  # missing is fine


def test_makedirs_and_fsync_dir(tmp_path: Path) -> None:
    storage.makedirs(str(tmp_path / "x" / "y"))
    storage.makedirs(str(tmp_path / "x" / "y"))
    assert (tmp_path / "x" / "y").is_dir()
    storage.fsync_dir(str(tmp_path / "x"))
    storage.makedirs("s3://bucket/prefix")  # no-op, no network
    storage.fsync_dir("s3://bucket/prefix")


@pytest.mark.parametrize("what", ["file", "dir"], ids=["file", "dir"])
def test_rename(what: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    if what == "dir":
        _make_tree(src)
    else:
        src.write_text("x")
    storage.rename(str(src), str(tmp_path / "new" / "dst"))
    assert not src.exists()
    dst = tmp_path / "new" / "dst"
    assert dst.is_dir() if what == "dir" else dst.read_text() == "x"


def test_rename_refuses_non_empty_directory(tmp_path: Path) -> None:
    _make_tree(tmp_path / "src")
    _make_tree(tmp_path / "dst")
    with pytest.raises(FileExistsError, match="dst: target is a non-empty directory"):
        storage.rename(str(tmp_path / "src"), str(tmp_path / "dst"))
    assert (tmp_path / "src" / "a.txt").exists()


def test_rename_replaces_file(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("new")
    (tmp_path / "b").write_text("old")
    storage.rename(str(tmp_path / "a"), f"file://{tmp_path / 'b'}")
    assert (tmp_path / "b").read_text() == "new"
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("what", ["file", "dir"], ids=["file", "dir"])
def test_copy_tree(what: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    if what == "dir":
        _make_tree(src)
    else:
        src.write_text("x")
    storage.copy_tree(str(src), str(tmp_path / "a" / "b" / "dst"))
    dst = tmp_path / "a" / "b" / "dst"
    if what == "dir":
        assert (dst / "sub" / "b.txt").read_text() == "b"
        assert storage.list_dir(str(dst)) == ["a.txt", "sub"]
    else:
        assert dst.read_text() == "x"
    assert src.exists()


@pytest.mark.parametrize(
    "uri",
    ["s3://bucket/runs/../other/model", "minio://bucket/a/./b", "gs://bucket/x/..", "s3://b/a/../"],
    ids=["s3-dotdot", "minio-dot", "gs-trailing-dotdot", "s3-dotdot-slash"],
)
def test_object_keys_with_dot_segments_are_refused_naming_the_key(uri: str) -> None:
    # An object store takes "a/../b" literally; a person and every local tool read it as "b".
    with pytest.raises(InputError) as info:
        storage.resolve(uri)
    assert info.value.code == "E_URI" and info.value.where == uri
    assert "'..'" in info.value.message and "\n" not in str(info.value)
