#!/usr/bin/env bash
# Create a kind cluster for the end-to-end run and install everything the pipeline needs:
# KFP 2.17.0 (standalone), a training operator (the Training Operator v1.9.2 for
# launcher=pytorchjob, Kubeflow Trainer v2.3.0 for launcher=trainjob, or both), Katib v0.19.0,
# gpupipe's RBAC and an MLflow server, then build the CPU image and load it into the nodes.
# Needs: docker, kind (>= v0.29.0, for the pinned node image), kubectl (with kustomize), git, and
# network access to GitHub and the image registries. Safe to rerun: it reuses the cluster and
# re-applies the manifests.
# Environment: GPUPIPE_KIND_CLUSTER (default gpupipe), GPUPIPE_KIND_WAIT (default 900s),
# OPERATOR: training-operator (default; PyTorchJob, also what Katib trials run), trainer
# (Kubeflow Trainer v2: TrainJob) or both.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

cluster="${GPUPIPE_KIND_CLUSTER:-gpupipe}"
wait_timeout="${GPUPIPE_KIND_WAIT:-900s}"
context="kind-${cluster}"
operator="${OPERATOR:-training-operator}"
case "$operator" in
  training-operator | trainer | both) ;;
  *)
    echo "error: OPERATOR must be training-operator, trainer or both, got '${operator}'" >&2
    exit 2
    ;;
esac

step() { printf '\n==> %s\n' "$*"; }

for tool in docker kind kubectl git; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "error: ${tool} is not on PATH (see manifests/README.md)" >&2
    exit 1
  fi
done

step "kind $(kind version)"
if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  step "kind cluster '${cluster}' exists: reusing it"
else
  step "creating kind cluster '${cluster}' from manifests/kind/kind-config.yaml"
  kind create cluster --name "$cluster" --config manifests/kind/kind-config.yaml --wait 180s
fi
kubectl config use-context "$context"

step "installing Kubeflow Pipelines 2.17.0: cluster-scoped resources"
kubectl apply -k manifests/kfp/cluster-scoped-resources
kubectl wait --for condition=established --timeout=120s crd --all
# Upstream's object-store keys (minio/minio123) and database passwords (KFP's empty root
# password, Katib's "test") are left out of manifests/: this cluster's are generated here, once,
# before anything that reads them (hack/credentials.sh; a rerun keeps them).
step "generating this cluster's object-store keys and database accounts (kept when there)"
hack/credentials.sh ensure object-store kfp-db katib-db
step "installing Kubeflow Pipelines 2.17.0: standalone (platform-agnostic)"
kubectl apply -k manifests/kfp/platform-agnostic

if [[ "$operator" != trainer ]]; then
  step "installing the Training Operator v1.9.2 (server-side: its CRDs are large)"
  kubectl apply --server-side --force-conflicts -k manifests/training-operator
fi

if [[ "$operator" != training-operator ]]; then
  step "installing Kubeflow Trainer v2.3.0 and JobSet (server-side: its CRDs are large)"
  kubectl apply --server-side --force-conflicts -k manifests/trainer/manager
  step "waiting up to ${wait_timeout} for the Trainer controller and its webhook"
  kubectl -n kubeflow-system wait --for condition=Available deployment --all --timeout "$wait_timeout"
  step "installing Kubeflow Trainer v2.3.0's training runtimes (torch-distributed, ...)"
  kubectl apply --server-side --force-conflicts -k manifests/trainer/runtimes
fi

step "installing Katib v0.19.0"
kubectl apply --server-side --force-conflicts -k manifests/katib

step "applying gpupipe RBAC for kubeflow/pipeline-runner, and Pod Security on kubeflow"
kubectl apply -k manifests/rbac
kubectl apply --server-side -k manifests/pod-security

step "deploying the MLflow tracking server (kubeflow/mlflow), its two accounts generated once"
kubectl -n kubeflow get secret mlflow-admin >/dev/null 2>&1 ||
  hack/mlflow-account.sh admin | kubectl -n kubeflow create secret generic mlflow-admin --from-env-file=/dev/stdin
kubectl -n kubeflow get secret mlflow-auth >/dev/null 2>&1 ||
  hack/mlflow-account.sh pipeline | kubectl -n kubeflow create secret generic mlflow-auth --from-env-file=/dev/stdin
kubectl apply -k manifests/mlflow

step "waiting up to ${wait_timeout} for every deployment in kubeflow to be available"
kubectl -n kubeflow wait --for condition=Available deployment --all --timeout "$wait_timeout"

step "building the CPU image"
hack/build-images.sh cpu
cpu_image="$(hack/build-images.sh --print cpu)"
cuda_image="$(hack/build-images.sh --print cuda)"
# kind has no GPUs: the CPU image stands in under the CUDA image's name, which the compiled
# pipeline gives the train step (and its PyTorchJob). Only inside this cluster.
step "tagging ${cpu_image} as ${cuda_image} (kind only: no GPUs here)"
docker tag "$cpu_image" "$cuda_image"

step "loading the images into kind"
kind load docker-image --name "$cluster" "$cpu_image" "$cuda_image"

step "ready: kubectl context ${context} (operator: ${operator}); run hack/e2e.sh (make e2e)"
