#!/usr/bin/env bash
# Shared helpers of the cluster add-ons (hack/cluster/addons/*.sh; sourced, never run). Each add-on
# script takes one subcommand:
#   image    build the docker image(s) it needs, locally and cached (a tag that exists with the
#            same recipe label is kept)
#   install  with the cluster up: import its images, apply its manifests, wait until Ready;
#            idempotent (a second run changes nothing)
#   images   print the image tags it needs, one a line (hack/cluster-up.sh imports them)
#   verify   (each script's own) exercise the installed piece from inside the cluster, as a
#            pipeline step would: a PyTorchJob, an S3 round trip, an MLflow API call
# Each add-on keeps what it applies under ${STATE}/addons/<name>/ (kustomize overlays over the
# upstream manifests), so `kubectl diff -k` there shows what a change would do.
# shellcheck disable=SC2034  # variables here are used by the scripts that source this file

# shellcheck source=hack/cluster/lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/lib.sh"

ADDONS_HACK="${CLUSTER_HACK}/addons"
# Debian's busybox-static with its applet links, FROM scratch: hack/cluster/node-images.sh builds
# it for the node (init containers). The add-ons use it too: the PyTorchJob init container
# (nslookup), and as the base of the SeaweedFS image (its postStart hook needs sh, wget, seq).
BUSYBOX_IMAGE="${BUSYBOX_IMAGE:-gpupipe.local/busybox:1.35.0}"

# The MySQL-compatible database of Katib and KFP (images/mariadb/Dockerfile).
MARIADB_IMAGE="gpupipe.local/mariadb:10.11-bookworm"

# The object store's image (hack/cluster/addons/object-store.sh; KFP's manifests name it too).
SEAWEEDFS_IMAGE="gpupipe.local/seaweedfs:${SEAWEEDFS_VERSION}"

# KFP's backend source (../shared/src), extracted into the build cache by kfp_source: its Go code
# (hack/cluster/addons/kfp.sh) and its manifests (kfp.sh, object-store.sh).
KFP_TARBALL="${GPUPIPE_KFP_SRC:-${REPO_ROOT}/../shared/src}/kubeflow-pipelines-${KFP_VERSION}-backend.tar.gz"
KFP_SRC="${CACHE}/src/kubeflow-pipelines-${KFP_VERSION}"
ARGO_MODULE="github.com/argoproj/argo-workflows/v4"
# The Deployments of KFP's install that its backend add-on (kfp.sh) leaves out and the UI's add-on
# (kfp-ui.sh) applies with images of its own: the UI, and the grpc-web proxy in front of ML
# Metadata that only the UI calls.
KFP_UI_DEPLOYMENTS=(ml-pipeline-ui metadata-envoy-deployment)

# kfp_source PIECE: the tarball extracted into KFP_SRC (its sha256 checked against versions.env),
# with the one edit its README names (go.mod: third_party/ml-metadata from its own folder), and its
# manifests' remote Argo bases pointed at Argo's module download of the same release (a copy in
# KFP_SRC/argo-manifests): where the upstream base comes from is all that changes. Done once.
kfp_source() {
  local piece="$1" have argo f rel
  [[ "$(cat "${KFP_SRC}/.gpupipe-prepared" 2>/dev/null)" == "$KFP_SRC_SHA256" ]] && return 0
  [[ -f "$KFP_TARBALL" ]] ||
    cannot "${piece}: ${KFP_TARBALL} is missing (KFP ${KFP_VERSION}'s backend source; GPUPIPE_KFP_SRC names its folder)"
  have="$(sha256sum "$KFP_TARBALL" | cut -d' ' -f1)"
  [[ "$have" == "$KFP_SRC_SHA256" ]] ||
    die "${piece}: ${KFP_TARBALL} has sha256 ${have}, not KFP ${KFP_VERSION}'s ${KFP_SRC_SHA256} (versions.env)"
  command -v go >/dev/null 2>&1 || cannot "${piece}: Go is not installed (KFP's source is prepared with it)"
  say "extracting ${KFP_TARBALL##*/} into ${KFP_SRC}"
  rm -rf "$KFP_SRC" "${KFP_SRC}.tmp"
  mkdir -p "${KFP_SRC}.tmp"
  tar -xzf "$KFP_TARBALL" -C "${KFP_SRC}.tmp"
  (cd "${KFP_SRC}.tmp/kubeflow-pipelines-${KFP_VERSION}" && go mod edit -replace \
    github.com/kubeflow/pipelines/third_party/ml-metadata=./third_party/ml-metadata)
  argo="$(go_module_dir "$piece" "${ARGO_MODULE}@v${ARGO_VERSION}")"
  cp -r "${argo}/manifests" "${KFP_SRC}.tmp/kubeflow-pipelines-${KFP_VERSION}/argo-manifests"
  chmod -R u+w "${KFP_SRC}.tmp"
  mv "${KFP_SRC}.tmp/kubeflow-pipelines-${KFP_VERSION}" "$KFP_SRC"
  rmdir "${KFP_SRC}.tmp"
  grep -rl "https://github.com/argoproj/argo-workflows/manifests/" --include=kustomization.yaml \
    "${KFP_SRC}/manifests/kustomize" | while read -r f; do
    rel="$(realpath --relative-to "$(dirname "$f")" "${KFP_SRC}/argo-manifests")"
    sed -i -E "s#https://github.com/argoproj/argo-workflows/manifests/([^?]*)\?ref=v${ARGO_VERSION}(&timeout=[0-9]+s)?#${rel}/\1#" "$f"
  done
  if grep -rq "https://github.com/" --include=kustomization.yaml "${KFP_SRC}/manifests/kustomize/env/platform-agnostic" \
    "${KFP_SRC}/manifests/kustomize/third-party/argo" "${KFP_SRC}/manifests/kustomize/cluster-scoped-resources"; then
    die "${piece}: a remote base is left in ${KFP_SRC}/manifests/kustomize (Argo ${ARGO_VERSION}'s layout changed?)"
  fi
  printf '%s' "$KFP_SRC_SHA256" >"${KFP_SRC}/.gpupipe-prepared"
}

# The label that records what an image was built from (its recipe: versions, Dockerfile, inputs).
RECIPE_LABEL=org.gpupipe.recipe

addon_state() { printf '%s/addons/%s' "$STATE" "$1"; }

# True when TAG exists locally and was built from RECIPE (a hash of the inputs).
image_current() {
  local tag="$1" recipe="$2" have
  have="$(docker image inspect --format "{{ index .Config.Labels \"${RECIPE_LABEL}\" }}" "$tag" 2>/dev/null)" ||
    return 1
  [[ "$have" == "$recipe" ]]
}

# recipe_of FILE... : a short hash of the files and of the extra words in RECIPE_EXTRA.
recipe_of() {
  { cat "$@"; printf '%s\n' "${RECIPE_EXTRA:-}"; } | sha256sum | cut -c1-16
}

need_docker() {
  if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
    cannot "$1: no Docker engine answers (hack/docker-up.sh starts one): its image is built with it"
  fi
}

# docker_build PIECE TAG RECIPE CONTEXT [build args...]: the legacy builder (no buildx here), the
# recipe stamped as a label; the last lines of the build log on failure.
docker_build() {
  local piece="$1" tag="$2" recipe="$3" ctx="$4" log start=$SECONDS
  shift 4
  log="$(mktemp)"
  say "docker build ${tag}"
  if ! DOCKER_BUILDKIT=0 docker build --label "${RECIPE_LABEL}=${recipe}" -t "$tag" "$@" "$ctx" >"$log" 2>&1; then
    tail -n 15 "$log" >&2
    rm -f "$log"
    die "${piece}: docker build of ${tag} failed (log above)"
  fi
  rm -f "$log"
  say "built ${tag} in $((SECONDS - start)) s ($(image_size "$tag"))"
}

# image_is_built TAG RECIPE: the image is there, built from this recipe (says so).
image_is_built() {
  image_current "$1" "$2" || return 1
  say "$1 is built"
}

# image_context FILE...: a fresh build context (printed) holding the FILEs and tmp.tar, a
# world-writable /tmp owned by root for the FROM-busybox and FROM-scratch images to ADD.
image_context() {
  local ctx
  ctx="$(mktemp -d)"
  (($# == 0)) || cp -r "$@" "${ctx}/"
  mkdir -m 1777 "${ctx}/tmp"
  tar --numeric-owner --owner 0 --group 0 -C "$ctx" -cf "${ctx}/tmp.tar" tmp
  printf '%s' "$ctx"
}

# build_context PIECE TAG RECIPE CONTEXT [build args...]: docker_build, then the context removed.
build_context() {
  docker_build "$@"
  rm -rf "$4"
}

image_size() {
  docker image inspect --format '{{.Size}}' "$1" | awk '{printf "%.1f MB", $1/1e6}'
}

# The busybox image (built by hack/cluster/node-images.sh for the node; built here with it when
# missing, e.g. `image` before the first cluster-up).
need_busybox_image() {
  docker image inspect "$BUSYBOX_IMAGE" >/dev/null 2>&1 && return 0
  [[ -x "${CLUSTER_HACK}/node-images.sh" ]] ||
    cannot "$1: ${BUSYBOX_IMAGE} is missing and hack/cluster/node-images.sh, which builds it, is not here"
  "${CLUSTER_HACK}/node-images.sh" build
  docker image inspect "$BUSYBOX_IMAGE" >/dev/null 2>&1 ||
    die "$1: hack/cluster/node-images.sh did not build ${BUSYBOX_IMAGE}"
}

# mariadb_image PIECE: build MARIADB_IMAGE when its recipe changed.
mariadb_image() {
  local dir="${ADDONS_HACK}/images/mariadb" recipe ctx base
  base="$("${REPO_ROOT}/hack/base-image.sh")"
  recipe="$(RECIPE_EXTRA="$base" recipe_of "${dir}/Dockerfile" "${dir}/entrypoint.sh")"
  image_is_built "$MARIADB_IMAGE" "$recipe" && return 0
  ctx="$(mktemp -d)"
  cp "${dir}/Dockerfile" "${dir}/entrypoint.sh" "$ctx/"
  docker_build "$1" "$MARIADB_IMAGE" "$recipe" "$ctx" --build-arg "BASE=${base}"
  rm -rf "$ctx"
}

# go_install PIECE NAME VERSION PACKAGE@VERSION OUT [LDFLAGS]: a static binary from the Go module
# proxy into ${BIN_DIR}/NAME-VERSION/OUT (kept: a second call builds nothing).
go_install() {
  local piece="$1" name="$2" version="$3" pkg="$4" out="$5" ldflags="${6:-}"
  local dir="${BIN_DIR}/${name}-${version}" tmp start=$SECONDS
  [[ -x "${dir}/${out}" ]] && return 0
  command -v go >/dev/null 2>&1 || cannot "${piece}: Go is not installed (it is built from its Go module)"
  mkdir -p "$dir"
  tmp="$(mktemp -d)"
  say "go install ${pkg} -> ${dir}/${out}"
  GOBIN="$tmp" CGO_ENABLED=0 go_ install -trimpath -ldflags "-s -w ${ldflags}" "$pkg" ||
    cannot "${piece}: building ${pkg} from the Go module proxy failed (is the proxy reachable? go env GOPROXY)"
  mv "$tmp"/* "${dir}/${out}"
  rm -rf "$tmp"
  say "built ${out} in $((SECONDS - start)) s"
}

# go_build_wrapper PIECE NAME VERSION MODDIR PACKAGE OUT [LDFLAGS]: the same through a wrapper module
# under hack/cluster/gomod/MODDIR (for modules whose go.mod has replace lines).
go_build_wrapper() {
  local piece="$1" name="$2" version="$3" moddir="$4" pkg="$5" out="$6" ldflags="${7:-}"
  local dir="${BIN_DIR}/${name}-${version}" start=$SECONDS
  [[ -x "${dir}/${out}" ]] && return 0
  command -v go >/dev/null 2>&1 || cannot "${piece}: Go is not installed (it is built from its Go module)"
  mkdir -p "$dir"
  say "go build ${pkg} (hack/cluster/gomod/${moddir}) -> ${dir}/${out}"
  (cd "${CLUSTER_HACK}/gomod/${moddir}" &&
    CGO_ENABLED=0 go_ build -trimpath -o "${dir}/${out}.tmp" -ldflags "-s -w ${ldflags}" "$pkg") ||
    cannot "${piece}: building ${pkg} from the Go module proxy failed (is the proxy reachable? go env GOPROXY)"
  mv "${dir}/${out}.tmp" "${dir}/${out}"
  say "built ${out} in $((SECONDS - start)) s"
}

# go_build_in_module PIECE NAME VERSION MODULE@VERSION PACKAGE OUT: the same, built inside the
# module's own download (its go.mod and go.sum, as its release is built). For modules that
# `go install pkg@version` refuses here: it also reads the module's version list (@v/list) for a
# deprecation notice, and the proxy answers 403 for some (sigs.k8s.io/jobset) while it serves the
# version itself.
go_build_in_module() {
  local piece="$1" name="$2" version="$3" modver="$4" pkg="$5" out="$6"
  local dir="${BIN_DIR}/${name}-${version}" src start=$SECONDS
  [[ -x "${dir}/${out}" ]] && return 0
  command -v go >/dev/null 2>&1 || cannot "${piece}: Go is not installed (it is built from its Go module)"
  src="$(go_module_dir "$piece" "$modver")"
  mkdir -p "$dir"
  say "go build ${pkg} (in ${modver}) -> ${dir}/${out}"
  (cd "$src" && CGO_ENABLED=0 go_ build -trimpath -o "${dir}/${out}.tmp" -ldflags "-s -w" "$pkg") ||
    cannot "${piece}: building ${pkg} from the Go module proxy failed (is the proxy reachable? go env GOPROXY)"
  mv "${dir}/${out}.tmp" "${dir}/${out}"
  say "built ${out} in $((SECONDS - start)) s"
}

# The folder of MODULE@VERSION in Go's module cache (downloaded when missing).
go_module_dir() {
  local piece="$1" modver="$2" dir
  dir="$(cd /tmp && go mod download -json "$modver" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  [[ -n "$dir" && -d "$dir" ]] || cannot "${piece}: go mod download ${modver} failed (the Go module proxy refuses it?)"
  printf '%s' "$dir"
}

# user_files FOLDER DEST: the user path's own files (FOLDER/*.yaml beside its kustomization, which
# it lists as resources) copied into DEST; their names, one a line.
user_files() {
  local f
  mkdir -p "$2"
  for f in "$1"/*.yaml; do
    [[ "${f##*/}" == kustomization.yaml ]] && continue
    cp "$f" "$2/"
    printf '%s\n' "${f##*/}"
  done
}

# upstream_copy PIECE DIR MODULE@VERSION FOLDER [FIXUP]: the module's FOLDER copied to
# DIR/upstream for a kustomize overlay (the module cache is read-only, and kustomize wants the
# files under its root), once per module version; FIXUP, a function, edits the copy first.
upstream_copy() {
  local piece="$1" dir="$2" modver="$3" folder="$4" fixup="${5:-}" src
  # upstream.version holds the version alone (tests/cluster/test_addon_manifests.py reads it).
  [[ "$(cat "${dir}/upstream.version" 2>/dev/null)" == "${modver##*@v}" ]] && return 0
  src="$(go_module_dir "$piece" "$modver")"
  rm -rf "${dir}/upstream" "${dir}/upstream.version"
  mkdir -p "$dir"
  cp -r "${src}/${folder}" "${dir}/upstream"
  chmod -R u+w "${dir}/upstream"
  [[ -z "$fixup" ]] || "$fixup" "${dir}/upstream"
  printf '%s' "${modver##*@v}" >"${dir}/upstream.version"
}

# image_map UPSTREAM LOCAL_TAG: a kustomization `images:` entry (under `images:`).
image_map() {
  printf '  - name: %s\n    newName: %s\n    newTag: "%s"\n' "$1" "${2%:*}" "${2##*:}"
}

# The cluster must be up (hack/cluster-up.sh): its API server answers with the admin kubeconfig.
need_cluster() {
  [[ -f "$KUBECONFIG_ADMIN" ]] || cannot "$1: no cluster here (${KUBECONFIG_ADMIN} is missing: hack/cluster-up.sh)"
  kubectl_ get --raw /readyz >/dev/null 2>&1 ||
    cannot "$1: the cluster's API server does not answer (${KUBECONFIG_ADMIN})"
}

# apply_k PIECE DIR: server-side apply of a kustomization (field managers keep what controllers
# add, such as webhook CA bundles and generated certificates; an unchanged apply changes nothing).
# One field manager per add-on: two add-ons that apply the same object (Katib and KFP both apply
# Namespace `kubeflow`, Katib with its metrics-collector label) each keep their own fields; under
# one shared manager the later apply removed the label the earlier one set.
apply_k() {
  local piece="$1" dir="$2" out
  claims_first "$piece" "$dir"
  out="$(kubectl_ apply --server-side --force-conflicts --field-manager "gpupipe-${piece}" -k "$dir" 2>&1)" || {
    printf '%s\n' "$out" | tail -n 10 >&2
    die "${piece}: kubectl apply -k ${dir} failed (above)"
  }
  say "applied ${dir} ($(printf '%s\n' "$out" | wc -l) objects)"
}

# claims_first PIECE DIR: the overlay's PersistentVolumeClaims applied alone, and Bound, before
# anything that mounts them. Applied with their pod's Deployment, a claim was not yet in the
# scheduler's cache when it first tried the pod ("pod has unbound immediate
# PersistentVolumeClaims. not found"), and Kubernetes 1.34's scheduler did not try the pod again
# when the claim was bound: the object store waited its 5-minute backoff and cluster-up gave up
# (CI, 2026-12-07). Each claim here is bound to a volume hostpath_pv made for it.
claims_first() {
  local piece="$1" dir="$2" docs claims name
  # The claims' documents picked out as text: a client dry run of the whole overlay would need
  # the REST mapping of kinds whose CRDs it brings.
  docs="$(kubectl_ kustomize "$dir")" || die "${piece}: cannot render ${dir} (kubectl kustomize)"
  docs="$(awk 'BEGIN { RS = "\n---\n" } /(^|\n)kind: PersistentVolumeClaim(\n|$)/ { printf "---\n%s\n", $0 }' <<<"$docs")"
  [[ -n "$docs" ]] || return 0
  claims="$(kubectl_ apply --server-side --force-conflicts --field-manager "gpupipe-${piece}" \
    -o go-template='{{range .items}}{{.metadata.namespace}}/{{.metadata.name}} {{end}}{{with .metadata}}{{.namespace}}/{{.name}}{{end}}' \
    -f - <<<"$docs")" || die "${piece}: cannot apply the PersistentVolumeClaims of ${dir}"
  for name in $claims; do
    wait_for 60 claim_bound "${name%%/*}" "${name#*/}" ||
      die "${piece}: PersistentVolumeClaim ${name} not Bound within 60 s (kubectl -n ${name%%/*} describe pvc ${name#*/})"
  done
}

claim_bound() {
  [[ "$(kubectl_ -n "$1" get pvc "$2" -o jsonpath='{.status.phase}')" == Bound ]]
}

# A namespace, created when missing (server-side apply: idempotent).
ensure_namespace() {
  printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n' "$1" |
    kubectl_ apply --server-side --field-manager gpupipe-addons -f - >/dev/null ||
    die "cannot create namespace $1"
}

# ensure_credentials PIECE KIND...: the Secrets of hack/credentials.sh (the object store's keys,
# a database's accounts) in `kubeflow`, generated here once per cluster, before the Deployments
# that read them are applied; a Secret that holds an upstream default is replaced.
ensure_credentials() {
  local piece="$1"
  shift
  ensure_namespace kubeflow
  KUBECTL="${BIN_DIR}/kubernetes-${K8S_VERSION}/kubectl" KUBECONFIG="$KUBECONFIG_ADMIN" \
    "${REPO_ROOT}/hack/credentials.sh" ensure "$@" ||
    die "${piece}: cannot make its Secrets (hack/credentials.sh ensure $*)"
}

# check_credentials PIECE KIND...: a verify step: each Secret holds generated values.
check_credentials() {
  local piece="$1" out
  shift
  out="$(KUBECTL="${BIN_DIR}/kubernetes-${K8S_VERSION}/kubectl" KUBECONFIG="$KUBECONFIG_ADMIN" \
    "${REPO_ROOT}/hack/credentials.sh" check "$@" 2>&1)" || die "${piece}: ${out}"
  say "$out"
}

# hostpath_pv PIECE NAMESPACE PVC SIZE UID:GID: the cluster has no StorageClass and no provisioner,
# so each add-on's PersistentVolumeClaim gets a PersistentVolume made here: a folder on the node
# under ${STATE}/volumes/, pre-bound to that claim by claimRef. The folder is owned by the uid and
# gid the claiming pod runs as (its manifest's securityContext: runAsUser, runAsGroup; a hostPath
# volume gets no fsGroup) and is theirs alone (0700): the databases, models and objects in it are
# no other local user's to read or change (it was 0777 without the sticky bit, issue 60 item 10).
# tests/unit/test_cluster_volumes.py holds each call to its pod's manifest.
# `make cluster-down` removes the state folder, and the data with it.
hostpath_pv() {
  local piece="$1" ns="$2" pvc="$3" size="$4" owner="${5:-}" dir
  [[ "$owner" =~ ^[0-9]+:[0-9]+$ ]] ||
    die "${piece}: the volume of ${ns}/${pvc} needs its pod's UID:GID (got '${owner}')"
  dir="${STATE}/volumes/${ns}-${pvc}"
  install -d -m 0700 "${STATE}/volumes"
  mkdir -p "$dir"
  chown "$owner" "$dir"
  chmod 0700 "$dir"
  # Made once: the PV controller completes claimRef (uid) when it binds, and claimRef is atomic,
  # so a second apply would fight it over the whole field.
  kubectl_ get pv "gpupipe-${ns}-${pvc}" >/dev/null 2>&1 && return 0
  kubectl_ apply --server-side --field-manager gpupipe-addons -f - >/dev/null <<YAML || die "${piece}: cannot create the PersistentVolume for ${ns}/${pvc}"
apiVersion: v1
kind: PersistentVolume
metadata:
  name: gpupipe-${ns}-${pvc}
  labels:
    app.kubernetes.io/part-of: gpupipe
    app.kubernetes.io/component: cluster-addons
spec:
  capacity:
    storage: ${size}
  accessModes: ["ReadWriteOnce"]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  claimRef:
    namespace: ${ns}
    name: ${pvc}
  hostPath:
    path: ${dir}
    type: Directory
  # The folder is node 1's (the host's): its pod is placed there, as on a cluster whose local
  # volumes are a node's own. Several nodes share this machine's disk, but a database that moved
  # with a lost node would not on real machines.
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - {key: kubernetes.io/hostname, operator: In, values: ["${NODE_NAME}"]}
YAML
}

# roll_on_images TARGET: an overlay `patches:` entry stamping the add-on's image_ids on the pod
# templates of TARGET's Deployments: an image rebuilt under the same tag rolls its Deployment (the
# node holds images by tag; a running pod keeps the old one).
roll_on_images() {
  printf '  - target: %s\n    patch: |-\n      apiVersion: apps/v1\n      kind: Deployment\n      metadata: {name: any}\n      spec: {template: {metadata: {annotations: {gpupipe.dev/images: "%s"}}}}\n' \
    "$1" "$(image_ids)"
}

# apply_overlay PIECE: the add-on's images (addon_images) imported into the node, and its
# kustomize overlay (write_overlay DIR) written into its state folder and applied.
apply_overlay() {
  local piece="$1" tag dir
  for tag in $(addon_images); do import_image "$tag"; done
  dir="$(addon_state "$piece")"
  write_overlay "$dir"
  apply_k "$piece" "$dir"
}

# runner_account PIECE: the account KFP's steps run as (KFP's own manifests make it too) in
# `kubeflow`, and the user path's RBAC that binds it (idempotent).
runner_account() {
  ensure_namespace kubeflow
  kubectl_ -n kubeflow create serviceaccount pipeline-runner --dry-run=client -o yaml |
    kubectl_ apply --server-side --field-manager gpupipe-addons -f - >/dev/null ||
    die "$1: cannot create ServiceAccount kubeflow/pipeline-runner"
  apply_k "$1" "${REPO_ROOT}/manifests/rbac"
}

# crds_established PIECE CRD...: each CRD established within 60 s.
crds_established() {
  local piece="$1" crd
  shift
  for crd in "$@"; do
    kubectl_ wait --for condition=established --timeout 60s "crd/${crd}" >/dev/null ||
      die "${piece}: the ${crd} CRD was not established within 60 s"
  done
}

# webhooks_judge PIECE KIND NAMESPACE DEPLOYMENT: the add-on's function webhook_judges (a dry-run
# object admitted with its defaults, a bad one refused) passes within 180 s. The manager writes
# its serving certificate into its Secret and the CA into the webhook configurations; the kubelet
# refreshes the mounted Secret within about a minute.
webhooks_judge() {
  local piece="$1" kind="$2" ns="$3" deploy="$4"
  wait_for 180 webhook_judges ||
    die "${piece}: the ${kind} webhooks did not judge a dry-run ${kind} within 180 s (kubectl -n ${ns} logs deploy/${deploy})"
}

# check_object PIECE NAMESPACE KIND NAME CONDITION SECONDS MAKER [SELECTOR]: a verify step. The
# object `MAKER NAME` prints is created afresh and must reach CONDITION within SECONDS; on a
# timeout, the pods of SELECTOR (default: none) and one line. The object stays for the caller.
check_object() {
  local piece="$1" ns="$2" kind="$3" name="$4" condition="$5" limit="$6" maker="$7" selector="${8:-}"
  kubectl_ -n "$ns" delete "$kind" "$name" --ignore-not-found --wait >/dev/null
  "$maker" "$name" | kubectl_ create -f - >/dev/null || die "${piece}: the webhook refused ${kind} ${ns}/${name}"
  if ! kubectl_ -n "$ns" wait --for "condition=${condition}" --timeout "${limit}s" "${kind}/${name}" >/dev/null 2>&1; then
    [[ -z "$selector" ]] || kubectl_ -n "$ns" get pods -l "$selector" -o wide >&2 || true
    return 1
  fi
}

# rollout PIECE NAMESPACE DEPLOYMENT SECONDS: wait until the deployment's pods are Ready; on a
# timeout, one line naming the piece and the pod's state.
rollout() {
  local piece="$1" ns="$2" deploy="$3" limit="$4"
  if ! kubectl_ -n "$ns" rollout status "deployment/${deploy}" --timeout "${limit}s" >/dev/null 2>&1; then
    kubectl_ -n "$ns" get pods -o wide >&2 || true
    die "${piece}: deployment ${ns}/${deploy} not Ready after ${limit} s (kubectl -n ${ns} describe deployment ${deploy})"
  fi
  say "${ns}/${deploy} is Ready"
}

# json_string: stdin as one JSON string (for a command inside a pod's --overrides).
json_string() { python3 -c 'import json, sys; print(json.dumps(sys.stdin.read()))'; }

# A check pod's securityContext fields for --overrides (Pod Security "restricted", which the
# kubeflow namespace warns about): the pod's, then its container's.
RESTRICTED_POD='"securityContext":{"runAsNonRoot":true,"runAsUser":1000,"seccompProfile":{"type":"RuntimeDefault"}}'
RESTRICTED_CONTAINER='"securityContext":{"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]}}'

# forward_start NS SERVICE PORT: a background `kubectl port-forward` of the Service's PORT to a
# free local port, as the README reaches KFP: sets FORWARD_URL (http://127.0.0.1:<port>) and
# FORWARD_PID; forward_stop ends it. The host reaches a Service through the kubelet this way, not
# through kube-proxy or the API server's service proxy, whose connections come from the host and
# meet the pod's NetworkPolicy when the pod runs on another node (docs/test-cluster.md).
forward_start() {
  local ns="$1" svc="$2" port="$3" log local_port=""
  log="$(mktemp)"
  kubectl_ -n "$ns" port-forward "svc/${svc}" ":${port}" >"$log" 2>&1 &
  FORWARD_PID=$!
  for _ in $(seq 100); do
    local_port="$(sed -n 's/^Forwarding from 127.0.0.1:\([0-9]*\) .*/\1/p' "$log" | head -n1)"
    [[ -n "$local_port" ]] && break
    kill -0 "$FORWARD_PID" 2>/dev/null || break
    sleep 0.2
  done
  if [[ -z "$local_port" ]]; then
    printf 'port-forward to %s/%s:%s did not start: %s\n' "$ns" "$svc" "$port" "$(tail -n 3 "$log")" >&2
    rm -f "$log"
    forward_stop
    return 1
  fi
  rm -f "$log"
  FORWARD_URL="http://127.0.0.1:${local_port}"
}

forward_stop() {
  [[ -n "${FORWARD_PID:-}" ]] || return 0
  kill "$FORWARD_PID" 2>/dev/null || true
  wait "$FORWARD_PID" 2>/dev/null || true
  FORWARD_PID=""
}

# run_pod NAMESPACE POD IMAGE OVERRIDES SECONDS: run one pod to its end, print its log, remove it;
# succeeds only when the pod Succeeded. Made, waited on and read in three steps: `kubectl run -i
# --rm` attaches after the container starts and can miss all of a short container's output (it
# printed nothing, and the check failed, in a CI run whose pod had passed).
run_pod() {
  local ns="$1" pod="$2" image="$3" overrides="$4" limit="$5" phase="" start=$SECONDS
  kubectl_ -n "$ns" delete pod "$pod" --ignore-not-found --wait >/dev/null 2>&1
  kubectl_ -n "$ns" run "$pod" --image "$image" --restart Never --overrides "$overrides" >/dev/null || return 1
  while ((SECONDS - start < limit)); do
    phase="$(kubectl_ -n "$ns" get pod "$pod" -o jsonpath='{.status.phase}' 2>/dev/null)" || phase=""
    [[ "$phase" == Succeeded || "$phase" == Failed ]] && break
    sleep 1
  done
  if [[ "$phase" == Succeeded || "$phase" == Failed ]]; then
    kubectl_ -n "$ns" logs "$pod" 2>&1
  else
    printf 'pod %s/%s did not end within %s s (phase %s):\n' "$ns" "$pod" "$limit" "${phase:-unknown}"
    kubectl_ -n "$ns" describe pod "$pod" 2>&1 | tail -n 15
  fi
  kubectl_ -n "$ns" delete pod "$pod" --ignore-not-found --wait=false >/dev/null 2>&1
  [[ "$phase" == Succeeded ]]
}

# addon_main PIECE "$@": run the subcommand (functions addon_image, addon_install, addon_images).
addon_main() {
  local piece="$1"
  shift
  case "${1:-}" in
  image) addon_image ;;
  install) addon_install ;;
  images) addon_images ;;
  *) die "${piece}: usage: $0 image|install|images" ;;
  esac
}
