#!/usr/bin/env bash
# The S3-compatible artifact store Kubeflow Pipelines 2.17 standalone installs (SeaweedFS behind
# `seaweedfs.kubeflow:9000`, credentials in the `mlpipeline-minio-artifact` Secret, bucket
# `mlpipeline`), in the test cluster before the add-ons that use it (MLflow, Katib, KFP):
#   image    `weed` from the SeaweedFS Go module through hack/cluster/gomod/seaweedfs (its go.mod
#            has a replace line), with upstream's entrypoint and filer.toml from the same module
#            download, over the local busybox image
#   install  the Secret `mlpipeline-minio-artifact` with keys generated for this cluster
#            (hack/credentials.sh: upstream's minio/minio123 never reaches it), then KFP's own
#            third-party/seaweedfs base from its source tarball (kfp_source in common.sh), without
#            that upstream Secret, labelled as KFP's platform-agnostic install labels it, under an
#            overlay in the state folder that swaps in the local image: the same objects the KFP
#            add-on applies later (tests/cluster/test_kfp_manifests.py checks it); its PVC gets a
#            hostPath PersistentVolume; waits for the pod, the bucket and the admin identity (with
#            the Secret's key, and no other: a key left from an earlier Secret is removed)
#   verify   from a pod (the MLflow image: Python with boto3), with the Secret's keys: an unsigned
#            request and upstream's default keys (minio/minio123) are refused, a signed put and get
#            of an object in `mlpipeline` round-trips
#   images   the tag it needs
set -euo pipefail
# shellcheck source=hack/cluster/addons/common.sh
source "$(dirname "$0")/common.sh"

PIECE="object-store"
V="${SEAWEEDFS_VERSION}"
MODULE="github.com/seaweedfs/seaweedfs"
MODVER="${SEAWEEDFS_MODULE_VERSION}"
IMAGE="$SEAWEEDFS_IMAGE"
UPSTREAM_IMAGE="ghcr.io/chrislusf/seaweedfs"
NS=kubeflow
BUCKET=mlpipeline
POLICY=seaweedfs-networkpolicy.yaml

addon_images() { echo "$IMAGE"; }

# The wrapper module must name the version in versions.env.
check_versions() {
  grep -q "^require ${MODULE} ${MODVER}\$" "${CLUSTER_HACK}/gomod/seaweedfs/go.mod" ||
    die "${PIECE}: hack/cluster/gomod/seaweedfs/go.mod does not require ${MODULE} ${MODVER} (versions.env)"
}

addon_image() {
  check_versions
  need_docker "$PIECE"
  need_busybox_image "$PIECE"
  local df="${ADDONS_HACK}/images/seaweedfs/Dockerfile" recipe bb_id
  bb_id="$(docker image inspect --format '{{.Id}}' "$BUSYBOX_IMAGE")"
  recipe="$(RECIPE_EXTRA="$V $MODVER $bb_id" recipe_of "$df")"
  image_is_built "$IMAGE" "$recipe" && return 0
  local commit="${MODVER##*-}"
  go_build_wrapper "$PIECE" seaweedfs "$V" seaweedfs "${MODULE}/weed" weed \
    "-X ${MODULE}/weed/util/version.COMMIT=${commit:0:9}"
  local src ctx
  src="$(go_module_dir "$PIECE" "${MODULE}@${MODVER}")"
  ctx="$(mktemp -d)"
  cp "${BIN_DIR}/seaweedfs-${V}/weed" "$df" "${ctx}/"
  cp "${src}/docker/entrypoint.sh" "${src}/docker/filer.toml" "${ctx}/"
  chmod 0755 "${ctx}/entrypoint.sh"
  chmod 0644 "${ctx}/filer.toml"
  docker_build "$PIECE" "$IMAGE" "$recipe" "$ctx" --build-arg "BUSYBOX=${BUSYBOX_IMAGE}"
  rm -rf "$ctx"
}

# KFP's SeaweedFS base from the extracted tarball, with the namespace and the labels KFP's
# platform-agnostic install gives it (selectors too: a Deployment's selector cannot change later,
# when the KFP add-on applies the same objects), and the local image; without upstream's Secret
# (its keys are minio/minio123), as manifests/kfp/platform-agnostic leaves it out:
# hack/credentials.sh makes it. Over it, as manifests/kfp/platform-agnostic has it, the store's
# NetworkPolicy of the pipeline's pods in place of upstream's (the same file, outside the labels
# that upstream's objects get).
write_overlay() {
  local dir="$1" base
  mkdir -p "${dir}/upstream"
  base="$(realpath --relative-to "${dir}/upstream" "${KFP_SRC}/manifests/kustomize/third-party/seaweedfs/base")"
  cat >"${dir}/upstream/kustomization.yaml" <<YAML
# Written by hack/cluster/addons/object-store.sh: KFP ${KFP_VERSION}'s SeaweedFS store with the local image.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: ${NS}
resources:
  - ${base}
labels:
  - includeSelectors: true
    pairs:
      application-crd-id: kubeflow-pipelines
images:
  - name: ${UPSTREAM_IMAGE}
    newName: ${IMAGE%:*}
    newTag: "${IMAGE##*:}"
patches:
  - patch: |-
      \$patch: delete
      apiVersion: v1
      kind: Secret
      metadata: {name: mlpipeline-minio-artifact}
YAML
  cp "${REPO_ROOT}/manifests/kfp/platform-agnostic/${POLICY}" "${dir}/${POLICY}"
  cat >"${dir}/kustomization.yaml" <<YAML
# Written by hack/cluster/addons/object-store.sh: the store (upstream/) with manifests/kfp's policy.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - upstream
  - ${POLICY}
patches:
  - patch: |-
      \$patch: delete
      apiVersion: networking.k8s.io/v1
      kind: NetworkPolicy
      metadata: {name: seaweedfs}
YAML
}

weed_shell() {
  kubectl_ -n "$NS" exec deploy/seaweedfs -c seaweedfs -- sh -c "echo '$1' | /usr/bin/weed shell" 2>/dev/null
}

store_key() {
  kubectl_ -n "$NS" get secret mlpipeline-minio-artifact -o jsonpath='{.data.accesskey}' | base64 -d
}

# The access keys SeaweedFS's S3 identities hold (`s3.configure` prints them as JSON).
store_keys() {
  weed_shell "s3.configure" | sed -n 's/.*"accessKey": *"\([^"]*\)".*/\1/p'
}

# The start-up hook has run: the bucket exists and the admin identity has the Secret's key.
store_configured() {
  local key
  key="$(store_key)"
  weed_shell "s3.bucket.list" | grep -q "^  ${BUCKET}" &&
    store_keys | grep -qxF "$key"
}

# Upstream's start-up hook adds the Secret's key to its admin identity and removes none: a store
# that ran with an earlier Secret (upstream's minio/minio123, before hack/credentials.sh replaced
# it) would still take the old key. Every other key of that identity is removed.
drop_stale_keys() {
  local key old
  key="$(store_key)"
  for old in $(store_keys); do
    [[ "$old" == "$key" ]] && continue
    weed_shell "s3.configure -user kubeflow-admin -access_key ${old} -delete -apply" >/dev/null ||
      die "${PIECE}: cannot remove an earlier access key from SeaweedFS's kubeflow-admin identity"
    say "removed an earlier access key from SeaweedFS's kubeflow-admin identity"
  done
}

addon_install() {
  check_versions
  need_cluster "$PIECE"
  import_image "$IMAGE"
  kfp_source "$PIECE"
  ensure_namespace "$NS"
  ensure_credentials "$PIECE" object-store
  hostpath_pv "$PIECE" "$NS" seaweedfs-pvc 20Gi 1000:1000
  local dir
  dir="$(addon_state "$PIECE")"
  write_overlay "$dir"
  apply_k "$PIECE" "$dir"
  rollout "$PIECE" "$NS" seaweedfs 300
  wait_for 120 store_configured ||
    die "${PIECE}: bucket ${BUCKET} or the admin identity missing 120 s after start (kubectl -n ${NS} describe pod -l app=seaweedfs)"
  drop_stale_keys
  say "bucket ${BUCKET} and the admin identity (the Secret's generated key only) are there; S3 at seaweedfs.${NS}:9000"
}

# What a pipeline step does: boto3 with the Secret's keys against seaweedfs.kubeflow:9000.
verify_script() {
  cat <<'PY'
import os, socket, time, uuid
import boto3, botocore
from botocore.config import Config

endpoint = "http://seaweedfs.kubeflow:9000"
# The store's NetworkPolicy admits this pod once kube-router has synced its address, a moment
# after it starts (the network-policy add-on): wait for a connection first, at most 20 s.
for _ in range(40):
    try:
        socket.create_connection(("seaweedfs.kubeflow", 9000), timeout=5).close()
        break
    except OSError:
        time.sleep(0.5)
key = f"gpupipe-verify/{uuid.uuid4().hex}.txt"
body = b"hello from a pod\n"
anon = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                    config=Config(signature_version=botocore.UNSIGNED))
try:
    anon.put_object(Bucket="mlpipeline", Key=key, Body=body)
    raise SystemExit("an unsigned put was accepted: the store has no identity configured")
except botocore.exceptions.ClientError as e:
    print("unsigned put refused:", e.response["Error"]["Code"])
if os.environ["secretkey"] in ("minio123", "minioadmin") or os.environ["accesskey"] == "minio":
    raise SystemExit("the Secret holds upstream's default keys, not keys generated for this cluster")
default = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id="minio", aws_secret_access_key="minio123")
try:
    default.put_object(Bucket="mlpipeline", Key=key, Body=body)
    raise SystemExit("upstream's default keys minio/minio123 were accepted")
except botocore.exceptions.ClientError as e:
    print("upstream's default keys refused:", e.response["Error"]["Code"])
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id=os.environ["accesskey"],
                  aws_secret_access_key=os.environ["secretkey"])
s3.put_object(Bucket="mlpipeline", Key=key, Body=body)
got = s3.get_object(Bucket="mlpipeline", Key=key)["Body"].read()
assert got == body, got
print("put and got", key, len(got), "bytes")
s3.delete_object(Bucket="mlpipeline", Key=key)
PY
}

addon_verify() {
  need_cluster "$PIECE"
  check_credentials "$PIECE" object-store
  local client="gpupipe.local/mlflow:v${MLFLOW_VERSION}" pod=gpupipe-verify-s3 overrides out
  # Its client is the MLflow image (Python with boto3), imported by hack/cluster/addons/mlflow.sh.
  import_image "$client"
  # Labelled as KFP labels a run's pods: the store's NetworkPolicy admits the pipeline's pods.
  overrides="$(printf '{"metadata":{"labels":{"pipelines.kubeflow.org/v2_component":"true"}},"spec":{%s,"containers":[{"name":"%s","image":"%s","command":["python3","-c",%s],"envFrom":[{"secretRef":{"name":"mlpipeline-minio-artifact"}}],%s}]}}' \
    "$RESTRICTED_POD" "$pod" "$client" "$(verify_script | json_string)" "$RESTRICTED_CONTAINER")"
  out="$(run_pod "$NS" "$pod" "$client" "$overrides" 300)" ||
    die "${PIECE}: the S3 round trip from a pod failed: ${out}"
  printf '%s\n' "$out" | sed 's/^/      /'
  say "a pod put and got an object in s3://${BUCKET} at seaweedfs.${NS}:9000 with the Secret's generated keys; minio/minio123 refused"
}

case "${1:-}" in
verify) addon_verify ;;
*) addon_main "$PIECE" "$@" ;;
esac
