"""What every command that talks to a KFP cluster shares: the ``--host`` flags, the client they
make, and the ``--param`` values, typed and checked before any request."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from trainer.base.errors import InputError

if TYPE_CHECKING:
    from pipelines.cluster import KfpCluster


def connect(args: argparse.Namespace) -> KfpCluster:
    """The KFP client for ``--host``, ``--token`` or ``--token-file``, ``--ca-cert``,
    ``--namespace`` and ``--insecure``."""
    from pipelines.cluster import KfpCluster
    from pipelines.cluster_auth import resolve_auth

    return KfpCluster(
        args.host,
        auth=resolve_auth(args.token, token_file=args.token_file),
        namespace=args.namespace,
        insecure=bool(args.insecure),
        ca_cert=args.ca_cert,
    )


def default_pipeline() -> str:
    """The training pipeline's name, what ``--pipeline`` defaults to."""
    from pipelines.training import PIPELINE_NAME

    return PIPELINE_NAME


def cluster_params(args: argparse.Namespace) -> dict[str, Any]:
    """``--param`` (plus ``--data``/``--target``), typed and checked before any API call."""
    from pipelines.params import check_cluster_parameters, check_parameters, typed_parameters

    pairs = list(args.param)
    if getattr(args, "data", None):
        pairs.append(f"data_uri={args.data}")
    if getattr(args, "target", None):
        pairs.append(f"target={args.target}")
    params = typed_parameters(pairs)
    # Every step's config, and what KFP must not store, before any request is sent.
    check_cluster_parameters(check_parameters(params))
    return params


def refuse_unnamed_registry(params: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Refuse a cluster run with no model registry: in a pod an empty ``registry_uri`` would be
    a SQLite file in the register step's container, gone with the pod, and the run would report
    a model registered that nobody can find.

    Args:
        params: the run's ``--param`` values.
        defaults: the defaults of the version it runs (``--set`` at upload).

    Raises:
        InputError: ``E_PARAM`` naming ``registry_uri``, before any run is created.
    """
    if str(params.get("registry_uri") or defaults.get("registry_uri") or "").strip():
        return
    raise InputError(
        "E_PARAM",
        "registry_uri is empty (no --param registry_uri, no default in the pipeline version): "
        "on a cluster the model would be registered into a file that dies with the step's pod; "
        "pass --param registry_uri=http://mlflow.kubeflow:5000 (the cluster's MLflow) or upload "
        "the version with --set registry_uri=...",
        "registry_uri",
    )


def add_cluster_args(p: argparse.ArgumentParser, *, required: bool) -> None:
    """The flags that say which KFP to talk to, and how; ``--host`` ``required`` or not."""
    p.add_argument(
        "--host",
        required=required,
        help="KFP endpoint, e.g. http://localhost:8080 (a port-forward of svc/ml-pipeline-ui)",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="file holding the bearer token, re-read on every request; '-': read it from "
        "standard input (default: $KF_PIPELINES_SA_TOKEN_PATH, then the in-cluster token)",
    )
    p.add_argument(
        "--token",
        help="bearer token (visible in ps and shell history: prefer --token-file)",
    )
    p.add_argument(
        "--ca-cert",
        metavar="FILE",
        help="PEM file of the CA that signed an https:// host's certificate (a private CA)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow sending the token over plain http:// to a host other than localhost "
        "(refused otherwise)",
    )
    p.add_argument("--namespace", help="profile namespace (multi-user KFP)")
    p.add_argument("--pipeline", help="pipeline name (default: gpupipe-training)")
