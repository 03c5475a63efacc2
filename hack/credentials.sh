#!/usr/bin/env bash
# The object store's keys and the databases' accounts of a cluster, generated on this machine once
# per cluster, into the Secrets that upstream's own Deployments read (no value is written down
# anywhere: upstream ships accesskey minio / secretkey minio123, an empty MySQL root password and
# Katib's "test"):
#   object-store  kubeflow/mlpipeline-minio-artifact  accesskey, secretkey: SeaweedFS's S3
#                 identity (its start-up hook configures it from them), KFP's API server, UI and
#                 Argo's artifact repository, and the pipeline's steps (object_store_secret)
#   kfp-db        kubeflow/mysql-secret               username (kfp), password: KFP's API server
#                 and ML Metadata, limited to their databases (mlpipeline, metadb);
#                 root-password: root, reachable from inside the database's pod only
#   katib-db      kubeflow/katib-mysql-secrets        DB_USER (katib), DB_PASSWORD: Katib's DB
#                 manager, limited to database katib; MYSQL_ROOT_PASSWORD: root, inside the pod
#                 only (upstream's probes log in as root)
# Usage:
#   hack/credentials.sh new KIND              print a new set as env-file lines
#   hack/credentials.sh ensure KIND...        make each Secret unless it holds generated values
#                                             (one holding an upstream default, or missing a key, is
#                                             replaced, and the Deployments that read it restarted)
#   hack/credentials.sh check KIND...         succeed only when each Secret holds generated values
#                                             (the add-ons' verify), naming the first that does not
# `ensure` runs ${KUBECTL:-kubectl} (KUBECONFIG as kubectl reads it); the values reach kubectl on
# stdin, never as arguments that `ps` shows. hack/kind-up.sh and the test cluster's add-ons
# (hack/cluster/addons/{object-store,kfp,katib}.sh) call `ensure` before applying what reads them.
set -euo pipefail

NS="${GPUPIPE_CREDENTIALS_NAMESPACE:-kubeflow}"
KUBECTL="${KUBECTL:-kubectl}"

usage() {
  echo "usage: hack/credentials.sh new KIND | ensure KIND... | check KIND... (KIND: object-store, kfp-db, katib-db)" >&2
  exit 2
}

# secret_of KIND: the Secret's name.
secret_of() {
  case "$1" in
  object-store) echo mlpipeline-minio-artifact ;;
  kfp-db) echo mysql-secret ;;
  katib-db) echo katib-mysql-secrets ;;
  *) usage ;;
  esac
}

# readers_of KIND: the Deployments that read the Secret at start (restarted when it is replaced).
readers_of() {
  case "$1" in
  object-store) echo seaweedfs ml-pipeline ml-pipeline-ui ;;
  kfp-db) echo mysql ml-pipeline metadata-grpc-deployment ;;
  katib-db) echo katib-mysql katib-db-manager ;;
  esac
}

# The values are generated and judged by one Python program: `new KIND` prints env-file lines;
# `generated KIND` reads the Secret's JSON on stdin and succeeds only when every key is there and
# none holds an upstream default (or a value too short to have been generated).
credentials_py() {
  # The program as an argument: stdin is the Secret's JSON.
  python3 -c "$(credentials_program)" "$@"
}

credentials_program() {
  cat <<'PY'
import base64, json, secrets, sys

KEYS = {
    "object-store": {"accesskey": None, "secretkey": None},
    "kfp-db": {"username": "kfp", "password": None, "root-password": None},
    "katib-db": {"DB_USER": "katib", "DB_PASSWORD": None, "MYSQL_ROOT_PASSWORD": None},
}
# Upstream's values (KFP 2.17's mlpipeline-minio-artifact and mysql-secret, Katib v0.19's
# katib-mysql-secrets) and the usual ones: a Secret holding one is not ours.
DEFAULTS = {"", "minio", "minio123", "minioadmin", "test", "root", "password"}
MIN_SECRET = 32  # hex characters (128 bits); what `new` makes is longer

mode, kind = sys.argv[1], sys.argv[2]
keys = KEYS[kind]
if mode == "new":
    for key, fixed in keys.items():
        if fixed is not None:
            value = fixed
        elif key == "accesskey":
            value = "gpupipe" + secrets.token_hex(10)
        else:
            value = secrets.token_hex(24)
        print(f"{key}={value}")
    sys.exit(0)
data = (json.load(sys.stdin).get("data") or {})
for key, fixed in keys.items():
    if key not in data:
        sys.exit(1)
    value = base64.b64decode(data[key]).decode()
    if fixed is not None:
        if value != fixed:
            sys.exit(1)
    elif value in DEFAULTS or len(value) < (16 if key == "accesskey" else MIN_SECRET):
        sys.exit(1)
PY
}

ensure() {
  local kind="$1" name json d restart=()
  name="$(secret_of "$kind")"
  if json="$("$KUBECTL" -n "$NS" get secret "$name" -o json 2>/dev/null)"; then
    if credentials_py generated "$kind" <<<"$json"; then
      echo "    Secret ${NS}/${name} is there (generated for this cluster): kept"
      return 0
    fi
    echo "    Secret ${NS}/${name} holds an upstream default or misses a key: replacing it"
    "$KUBECTL" -n "$NS" delete secret "$name" >/dev/null
    for d in $(readers_of "$kind"); do
      "$KUBECTL" -n "$NS" get deployment "$d" >/dev/null 2>&1 && restart+=("$d")
    done
  fi
  credentials_py new "$kind" |
    "$KUBECTL" -n "$NS" create secret generic "$name" --from-env-file=/dev/stdin >/dev/null || {
    echo "error: cannot create Secret ${NS}/${name}" >&2
    exit 1
  }
  "$KUBECTL" -n "$NS" label secret "$name" app.kubernetes.io/part-of=gpupipe \
    app.kubernetes.io/component=credentials >/dev/null
  echo "    made Secret ${NS}/${name} (${kind}: generated here)"
  for d in "${restart[@]}"; do
    "$KUBECTL" -n "$NS" rollout restart "deployment/${d}" >/dev/null
    echo "    restarted ${NS}/${d}: it reads Secret ${name} at start"
  done
  if ((${#restart[@]})) && [[ "$kind" == *-db ]]; then
    # The test cluster's database image makes the accounts at every start; upstream's mysql
    # images make them on the first start only (an empty data folder).
    echo "    note: a database made before with upstream's image keeps its old accounts: make the account of Secret ${name} in it, or empty its volume"
  fi
}

check() {
  local kind="$1" name json
  name="$(secret_of "$kind")"
  json="$("$KUBECTL" -n "$NS" get secret "$name" -o json)" || {
    echo "Secret ${NS}/${name} is missing (hack/credentials.sh ensure ${kind} makes it)" >&2
    exit 1
  }
  credentials_py generated "$kind" <<<"$json" || {
    echo "Secret ${NS}/${name} holds an upstream default or misses a key (hack/credentials.sh ensure ${kind} replaces it)" >&2
    exit 1
  }
}

case "${1:-}" in
new)
  (($# == 2)) || usage
  secret_of "$2" >/dev/null
  credentials_py new "$2"
  ;;
ensure)
  (($# >= 2)) || usage
  shift
  for kind in "$@"; do secret_of "$kind" >/dev/null; done
  for kind in "$@"; do ensure "$kind"; done
  ;;
check)
  (($# >= 2)) || usage
  shift
  for kind in "$@"; do check "$kind"; done
  names=()
  for kind in "$@"; do names+=("${NS}/$(secret_of "$kind")"); done
  echo "Secrets ${names[*]} hold values generated for this cluster (no upstream default)"
  ;;
*) usage ;;
esac
