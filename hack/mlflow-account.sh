#!/usr/bin/env bash
# Prints a new account for manifests/mlflow's server as the lines of an env file (the values
# generated here): `admin` (username, password, flask-secret-key: the Secret mlflow-admin, which
# only MLflow's pod reads) or `pipeline` (username, password: the Secret mlflow-auth, which the
# evaluate and register steps read; the server makes it, not an admin, before it starts):
#   hack/mlflow-account.sh admin | kubectl -n kubeflow create secret generic mlflow-admin --from-env-file=/dev/stdin
#   hack/mlflow-account.sh pipeline | kubectl -n kubeflow create secret generic mlflow-auth --from-env-file=/dev/stdin
# (hack/kind-up.sh and the test cluster's add-on, hack/cluster/addons/mlflow.sh, do so): the
# values go to kubectl on stdin, never as arguments that `ps` shows.
set -euo pipefail
case "${1:-}" in
  admin) user=gpupipe-admin ;;
  pipeline) user=gpupipe-pipeline ;;
  *)
    echo "usage: hack/mlflow-account.sh admin|pipeline" >&2
    exit 2
    ;;
esac
USER_NAME="$user" KIND="$1" python3 -c 'import os, secrets
print("username=" + os.environ["USER_NAME"])
print("password=" + secrets.token_hex(24))
if os.environ["KIND"] == "admin":
    print("flask-secret-key=" + secrets.token_hex(32))'
