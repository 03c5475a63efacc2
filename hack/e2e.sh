#!/usr/bin/env bash
# End-to-end run on the kind cluster from hack/kind-up.sh: compile the training pipeline, put a
# demo table into KFP's artifact store, run the pipeline through the KFP API with the pytorchjob
# launcher on CPU (gloo, 2 nodes, 0 GPUs), wait for it, and check that the model was registered
# in the cluster's MLflow server under this run's id.
# Needs: kubectl (context kind-<cluster>), .venv from `make setup`.
# Environment: GPUPIPE_KIND_CLUSTER (default gpupipe), GPUPIPE_E2E_TIMEOUT (seconds, default
#   2400), GPUPIPE_E2E_ARGS (JSON object of extra pipeline arguments, default {}),
#   KFP_PORT / S3_PORT / MLFLOW_PORT (local ports for the port-forwards: 8888 / 9000 / 5000).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

cluster="${GPUPIPE_KIND_CLUSTER:-gpupipe}"
python="${PYTHON:-.venv/bin/python}"
kfp_port="${KFP_PORT:-8888}"
s3_port="${S3_PORT:-9000}"
mlflow_port="${MLFLOW_PORT:-5000}"
export GPUPIPE_E2E_TIMEOUT="${GPUPIPE_E2E_TIMEOUT:-2400}"

step() { printf '\n==> %s\n' "$*"; }

if [[ ! -x "$python" ]]; then
  echo "error: ${python} not found: run 'make setup' first" >&2
  exit 1
fi
kubectl config use-context "kind-${cluster}" >/dev/null

work="$(mktemp -d)"
forwards=()
cleanup() {
  local pid
  for pid in ${forwards[@]+"${forwards[@]}"}; do
    kill "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

# port_forward <service> <local port> <service port>: background kubectl port-forward, waits for it.
port_forward() {
  local service="$1" local_port="$2" remote_port="$3"
  step "port-forward kubeflow/${service} -> 127.0.0.1:${local_port}"
  kubectl -n kubeflow port-forward "svc/${service}" "${local_port}:${remote_port}" \
    >"${work}/pf-${service}.log" 2>&1 &
  forwards+=("$!")
  local _
  for _ in $(seq 1 30); do
    if grep -q "Forwarding from" "${work}/pf-${service}.log"; then
      return 0
    fi
    sleep 1
  done
  echo "error: port-forward to ${service} did not start:" >&2
  cat "${work}/pf-${service}.log" >&2
  return 1
}

step "compiling the pipelines into ${work}/compiled"
"$python" -m pipelines.cli compile --out "${work}/compiled" --components-dir "${work}/components"

step "writing a demo table"
"$python" -m pipelines.cli demo-data --out "${work}/churn.parquet" --rows 4000

port_forward ml-pipeline "$kfp_port" 8888
port_forward seaweedfs "$s3_port" 9000
port_forward mlflow "$mlflow_port" 5000

GPUPIPE_E2E_S3_ACCESS="$(kubectl -n kubeflow get secret mlpipeline-minio-artifact \
  -o jsonpath='{.data.accesskey}' | base64 --decode)"
GPUPIPE_E2E_S3_SECRET="$(kubectl -n kubeflow get secret mlpipeline-minio-artifact \
  -o jsonpath='{.data.secretkey}' | base64 --decode)"
export GPUPIPE_E2E_S3_ACCESS GPUPIPE_E2E_S3_SECRET
# MLflow asks who is calling (manifests/mlflow): the account the pipeline's steps use too.
MLFLOW_TRACKING_USERNAME="$(kubectl -n kubeflow get secret mlflow-auth -o jsonpath='{.data.username}' | base64 --decode)"
MLFLOW_TRACKING_PASSWORD="$(kubectl -n kubeflow get secret mlflow-auth -o jsonpath='{.data.password}' | base64 --decode)"
export MLFLOW_TRACKING_USERNAME MLFLOW_TRACKING_PASSWORD
export GPUPIPE_E2E_WORK="$work"
export GPUPIPE_E2E_KFP="http://127.0.0.1:${kfp_port}"
export GPUPIPE_E2E_S3="http://127.0.0.1:${s3_port}"
export GPUPIPE_E2E_MLFLOW="http://127.0.0.1:${mlflow_port}"

step "uploading the table, running the pipeline (pytorchjob launcher, gloo, 2 nodes), waiting"
"$python" - <<'PY'
import json
import os
import sys
import time

import boto3
import kfp

from trainer.registry import find_version_by_pipeline_run

env = os.environ
work = env["GPUPIPE_E2E_WORK"]
stamp = time.strftime("%Y%m%d-%H%M%S")
key = f"gpupipe-e2e/{stamp}/churn.parquet"
s3 = boto3.client(
    "s3",
    endpoint_url=env["GPUPIPE_E2E_S3"],
    aws_access_key_id=env["GPUPIPE_E2E_S3_ACCESS"],
    aws_secret_access_key=env["GPUPIPE_E2E_S3_SECRET"],
    region_name="us-east-1",
)
s3.upload_file(f"{work}/churn.parquet", "mlpipeline", key)
print(f"uploaded s3://mlpipeline/{key}", flush=True)

model_name = f"gpupipe-e2e-{stamp}"
arguments = {
    "data_uri": f"minio://mlpipeline/{key}",
    "target": "churned",
    "epochs": 2,
    "launcher": "pytorchjob",
    "nodes": 2,
    "gpus_per_node": 0,
    "registry_uri": "http://mlflow.kubeflow:5000",
    "registered_model_name": model_name,
    **json.loads(env.get("GPUPIPE_E2E_ARGS") or "{}"),
}
client = kfp.Client(host=env["GPUPIPE_E2E_KFP"])
run = client.create_run_from_pipeline_package(
    f"{work}/compiled/gpupipe-training.yaml",
    arguments=arguments,
    run_name=f"gpupipe-e2e-{stamp}",
    experiment_name="gpupipe-e2e",
    enable_caching=False,
)
print(f"run {run.run_id}: {env['GPUPIPE_E2E_KFP']}/#/runs/details/{run.run_id}", flush=True)
result = client.wait_for_run_completion(run.run_id, timeout=int(env["GPUPIPE_E2E_TIMEOUT"]))
state = result.state
print(f"run {run.run_id} finished: {state}", flush=True)
if state != "SUCCEEDED":
    sys.exit(f"e2e: run {run.run_id} ended {state}, not SUCCEEDED")

version = find_version_by_pipeline_run(env["GPUPIPE_E2E_MLFLOW"], model_name, run.run_id)
if version is None:
    sys.exit(f"e2e: no version of {model_name!r} tagged with run {run.run_id} in MLflow")
print(f"e2e ok: registered model {model_name} version {version} (run {run.run_id})")
PY
