#!/usr/bin/env bash
# Prints a new account for manifests/mlflow's server as the lines of an env file (username,
# password, flask-secret-key; the values generated here), for
#   hack/mlflow-account.sh | kubectl -n kubeflow create secret generic mlflow-auth --from-env-file=/dev/stdin
# (hack/kind-up.sh and the test cluster's add-on, hack/cluster/addons/mlflow.sh, do so): the
# values go to kubectl on stdin, never as arguments that `ps` shows.
set -euo pipefail
python3 -c 'import secrets
print("username=gpupipe")
print("password=" + secrets.token_hex(24))
print("flask-secret-key=" + secrets.token_hex(32))'
