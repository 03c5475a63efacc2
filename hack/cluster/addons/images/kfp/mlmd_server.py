"""ML Metadata's gRPC service (ml_metadata.MetadataStoreService) over PyPI's ml-metadata wheel.

KFP 2.17's driver and launcher call MLMD's gRPC service; upstream serves it with a C++ binary
(`metadata_store_server`) that no registry here ships. The `ml-metadata` wheel carries the same
store as a Python extension whose functions take a request's serialized bytes and return the
response's, so this server hands each gRPC call's bytes to the extension method of the same name
and its bytes back: no message is parsed here, and every method of the service is served.

It takes the upstream binary's flags (the ones KFP's manifests pass), so the image replaces
upstream's in KFP's own Deployment unchanged:
  --grpc_port, --mysql_config_{host,port,database,user,password}, --enable_database_upgrade,
  --grpc_channel_arguments (name=value,... ints); --metadata_store_server_config_file (a
  MetadataStoreServerConfig text proto: its connection_config and migration_options, in place
  of the --mysql_config_* flags and --enable_database_upgrade, as upstream reads it: how
  manifests/kfp keeps the password off the command line); and --sqlite_filename_uri for a local
  store.
Three methods the wheel lacks answer UNIMPLEMENTED (see `unimplemented`).
Calls are made one at a time (a lock): the extension's store object holds one database
connection, which is not safe to share between threads.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from concurrent import futures

import grpc
from ml_metadata.metadata_store.pywrap.metadata_store_extension import (
    metadata_store as serialized,
)
from ml_metadata.proto import metadata_store_pb2, metadata_store_service_pb2

SERVICE = "ml_metadata.MetadataStoreService"
LOG = logging.getLogger("mlmd-server")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grpc_port", type=int, default=8080)
    p.add_argument("--grpc_host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--mysql_config_host", default="")
    p.add_argument("--mysql_config_port", type=int, default=3306)
    p.add_argument("--mysql_config_database", default="")
    p.add_argument("--mysql_config_user", default="")
    p.add_argument("--mysql_config_password", default="")
    p.add_argument("--sqlite_filename_uri", default="")
    p.add_argument("--metadata_store_server_config_file", default="")
    p.add_argument("--enable_database_upgrade", default="false")
    p.add_argument("--grpc_channel_arguments", default="")
    args = p.parse_args(argv)
    sources = [args.mysql_config_host, args.sqlite_filename_uri]
    if not args.metadata_store_server_config_file and sum(map(bool, sources)) != 1:
        p.error(
            "give --metadata_store_server_config_file, or exactly one of --mysql_config_host "
            "and --sqlite_filename_uri"
        )
    return args


def server_config(path: str) -> metadata_store_pb2.MetadataStoreServerConfig:
    """The MetadataStoreServerConfig text proto at ``path`` (upstream's
    --metadata_store_server_config_file: it overrides the --mysql_config_* flags)."""
    from google.protobuf import text_format

    with open(path, encoding="utf-8") as f:
        return text_format.Parse(f.read(), metadata_store_pb2.MetadataStoreServerConfig())


def connection_config(args: argparse.Namespace) -> metadata_store_pb2.ConnectionConfig:
    if args.metadata_store_server_config_file:
        return server_config(args.metadata_store_server_config_file).connection_config
    cfg = metadata_store_pb2.ConnectionConfig()
    if args.sqlite_filename_uri:
        cfg.sqlite.filename_uri = args.sqlite_filename_uri
        cfg.sqlite.connection_mode = (
            metadata_store_pb2.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
        )
    else:
        cfg.mysql.host = args.mysql_config_host
        cfg.mysql.port = args.mysql_config_port
        cfg.mysql.database = args.mysql_config_database
        cfg.mysql.user = args.mysql_config_user
        cfg.mysql.password = args.mysql_config_password
    return cfg


def channel_options(spec: str) -> list[tuple[str, int | str]]:
    """`grpc.max_metadata_size=16384,...` as gRPC server options."""
    out: list[tuple[str, int | str]] = []
    for item in filter(None, spec.split(",")):
        name, _, value = item.partition("=")
        out.append((name.strip(), int(value) if value.strip().isdigit() else value.strip()))
    return out


class Store:
    """The extension's store, opened once; every call under one lock."""

    def __init__(self, cfg: metadata_store_pb2.ConnectionConfig, upgrade: bool) -> None:
        migration = metadata_store_pb2.MigrationOptions(enable_upgrade_migration=upgrade)
        self._store = serialized.CreateMetadataStore(
            cfg.SerializeToString(), migration.SerializeToString()
        )
        self._lock = threading.Lock()

    def handler(self, method: str):
        fn = getattr(serialized, method)

        def call(request: bytes, context: grpc.ServicerContext) -> bytes:
            with self._lock:
                response, message, code = fn(self._store, request)
            if code != 0:
                text = message.decode("utf-8", "replace")
                LOG.info("%s: status %d: %s", method, code, text)
                context.abort(grpc.StatusCode(_STATUS[code]), text)
            return response

        return grpc.unary_unary_rpc_method_handler(call)


def unimplemented(method: str):
    """A method the wheel's extension lacks (1.17.1: GetLineageGraph and the plural parent and
    child context look-ups, none of which KFP's driver or launcher calls): UNIMPLEMENTED, named."""

    def call(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(
            grpc.StatusCode.UNIMPLEMENTED, f"{method}: not in the ml-metadata wheel's store"
        )

    return grpc.unary_unary_rpc_method_handler(call)


# absl status codes are gRPC's numbering; grpc.StatusCode's values are (number, name) tuples.
_STATUS = {code.value[0]: code.value for code in grpc.StatusCode}


def serve(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    upgrade = args.enable_database_upgrade.lower() in ("true", "1")
    if args.metadata_store_server_config_file:
        config = server_config(args.metadata_store_server_config_file)
        upgrade = config.migration_options.enable_upgrade_migration
    store = Store(connection_config(args), upgrade)
    methods = metadata_store_service_pb2.DESCRIPTOR.services_by_name["MetadataStoreService"].methods
    handlers = {
        m.name: store.handler(m.name) if hasattr(serialized, m.name) else unimplemented(m.name)
        for m in methods
    }
    served = sum(hasattr(serialized, m.name) for m in methods)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=channel_options(args.grpc_channel_arguments),
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    address = f"{args.grpc_host}:{args.grpc_port}"
    if server.add_insecure_port(address) == 0:
        LOG.error("cannot listen on %s", address)
        return 1
    server.start()
    LOG.info("serving %s (%d of %d methods) on %s", SERVICE, served, len(handlers), address)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=5).wait()
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
