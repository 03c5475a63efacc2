#!/usr/bin/env bash
# Kubeflow Pipelines 2.17.0's backend in the test cluster, built here from its source tarball
# (../shared/src: the Go module proxy refuses github.com/kubeflow/pipelines at any version):
#   image    the API server, persistence agent, ScheduledWorkflow controller, v2 driver and
#            launcher from the tarball's Go module (extracted into the build cache, with its one
#            `go mod edit`; never into the tree); Argo Workflows' workflow controller and argoexec
#            from Argo's own Go module; each FROM the node's busybox. ML Metadata's gRPC service
#            over PyPI's ml-metadata wheel (images/kfp/mlmd_server.py: upstream's server is C++
#            with no package here); the init containers' `nc -z` (upstream: alpine) from Debian's
#            netcat-openbsd; the database is the shared MariaDB image (images/mariadb)
#   install  the Secrets mlpipeline-minio-artifact (kept when the object-store add-on made it) and
#            mysql-secret generated for this cluster (hack/credentials.sh: the database account
#            `kfp` limited to KFP's two databases, root from inside its pod only), then
#            the user path (manifests/kfp: upstream's manifests/kustomize, v2 parts) rendered with
#            its upstream base from the extracted tarball and the local images, nothing else
#            changed (tests/cluster/test_kfp_manifests.py holds the two renderings side by side)
#            but the Deployments of the UI and of its grpc-web proxy in front of ML Metadata
#            (KFP_UI_DEPLOYMENTS), which hack/cluster/addons/kfp-ui.sh applies from the same
#            rendering with its own images; waits for every Deployment and for the API server to
#            answer through its Service
#   verify   the Secrets hold generated values (no upstream default); ML Metadata's service
#            checked from a pod (images/kfp/mlmd_check.py: a put and a get of each kind of call the
#            driver makes), and the API server's healthz and pipeline list through the Service
#            `ml-pipeline.kubeflow:8888`, as a user's client reaches it (both log in to the database
#            with mysql-secret's account)
#   images   the tags it needs
# The versions are KFP_VERSION and ARGO_VERSION (versions.env); the user path (manifests/kfp)
# must pin the same tag, or this refuses to run.
set -euo pipefail
# shellcheck source=hack/cluster/addons/common.sh
source "$(dirname "$0")/common.sh"

PIECE="kfp"
V="${KFP_VERSION}"
AV="${ARGO_VERSION}"
NS=kubeflow
DF_DIR="${ADDONS_HACK}/images/kfp"
SRC="$KFP_SRC"
ARGO_SRC="${CACHE}/src/argo-workflows-${AV}"

# The Go services: local image name, binary, package in KFP's module, the image's start command
# (upstream's Dockerfile's CMD or ENTRYPOINT) and the upstream image it stands in for.
KFP_SERVICES=(
  "kfp-api-server apiserver ./backend/src/apiserver ghcr.io/kubeflow/kfp-api-server"
  "kfp-persistence-agent persistence_agent ./backend/src/agent/persistence ghcr.io/kubeflow/kfp-persistence-agent"
  "kfp-scheduled-workflow-controller controller ./backend/src/crd/controller/scheduledworkflow ghcr.io/kubeflow/kfp-scheduled-workflow-controller"
  "kfp-driver driver ./backend/src/v2/cmd/driver ghcr.io/kubeflow/kfp-driver"
  "kfp-launcher launcher-v2 ./backend/src/v2/cmd/launcher-v2 ghcr.io/kubeflow/kfp-launcher"
)
# Upstream's start commands (backend/Dockerfile*), by binary: the variables expand in the
# container's shell, not here.
# shellcheck disable=SC2016
start_command() {
  case "$1" in
  apiserver) echo 'CMD ["/bin/sh", "-c", "/bin/apiserver --config=/config -logtostderr=true --logLevel=${LOG_LEVEL}"]' ;;
  persistence_agent) echo 'CMD ["/bin/sh", "-c", "persistence_agent --logtostderr=true --namespace=${NAMESPACE} --ttlSecondsAfterWorkflowFinish=${TTL_SECONDS_AFTER_WORKFLOW_FINISH} --numWorker ${NUM_WORKERS} --executionType ${EXECUTIONTYPE} --logLevel=${LOG_LEVEL}"]' ;;
  controller) echo 'CMD ["/bin/sh", "-c", "/bin/controller --logtostderr=true --namespace=${NAMESPACE} --logLevel=${LOG_LEVEL} --clientQPS=${CLIENT_QPS:-5} --clientBurst=${CLIENT_BURST:-10} --recurringRunResyncIntervalSeconds=${RESYNC_INTERVAL_SECONDS:-30} --metricsPort=${METRICS_PORT:-9090} --userIdentityHeader=\"${USER_IDENTITY_HEADER:-}\" --userIdentityValue=\"${USER_IDENTITY_VALUE:-}\""]' ;;
  *) printf 'ENTRYPOINT ["/bin/%s"]\n' "$1" ;;
  esac
}
ARGO_SERVICES=(
  "argo-workflow-controller workflow-controller ./cmd/workflow-controller quay.io/argoproj/workflow-controller"
  "argo-argoexec argoexec ./cmd/argoexec quay.io/argoproj/argoexec"
)
MLMD_IMAGE="gpupipe.local/kfp-metadata-grpc:${V}"
MLMD_UPSTREAM="gcr.io/tfx-oss-public/ml_metadata_store_server"
WAIT_IMAGE="gpupipe.local/kfp-wait:bookworm"
WAIT_UPSTREAM="docker.io/alpine"

image_of() {
  case "$1" in
  argo-*) printf 'gpupipe.local/%s:v%s' "$1" "$AV" ;;
  *) printf 'gpupipe.local/%s:%s' "$1" "$V" ;;
  esac
}

check_user_path() {
  local k
  for k in "${REPO_ROOT}/manifests/kfp/cluster-scoped-resources/kustomization.yaml" \
    "${REPO_ROOT}/manifests/kfp/platform-agnostic/kustomization.yaml"; do
    grep -q "?ref=${KFP_COMMIT}\$" "$k" ||
      die "${PIECE}: ${k} does not pin ${V}'s commit ${KFP_COMMIT} (versions.env): make them agree"
  done
}

addon_images() {
  local s
  for s in "${KFP_SERVICES[@]}" "${ARGO_SERVICES[@]}"; do image_of "${s%% *}"; echo; done
  echo "$MLMD_IMAGE"
  echo "$WAIT_IMAGE"
  echo "$MARIADB_IMAGE"
  echo "$BUSYBOX_IMAGE"
}

# KFP's five binaries: the four pure-Go ones in one `go build` (they share most of their
# packages); the API server with cgo (its storage package uses go-sqlite3's error types), linked
# statically (netgo, osusergo: no NSS at run time) so that it runs on busybox like the others.
build_kfp() {
  local dir="${BIN_DIR}/kfp-${V}" s name bin pkg missing=() pkgs=() start=$SECONDS
  for s in "${KFP_SERVICES[@]}"; do
    read -r name bin pkg _ <<<"$s"
    [[ -x "${dir}/${bin}" ]] || missing+=("$bin")
    [[ "$bin" == apiserver ]] || pkgs+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  kfp_source "$PIECE"
  command -v gcc >/dev/null 2>&1 || cannot "${PIECE}: gcc is not installed (the API server links sqlite with cgo)"
  rm -rf "${dir}.tmp"
  mkdir -p "${dir}.tmp"
  say "go build ${pkgs[*]} ./backend/src/apiserver (KFP ${V}) -> ${dir}"
  (cd "$SRC" && CGO_ENABLED=0 go_ build -trimpath -ldflags "-s -w" -o "${dir}.tmp/" "${pkgs[@]}" &&
    CGO_ENABLED=1 go_ build -trimpath -tags netgo,osusergo -ldflags '-s -w -extldflags "-static"' \
      -o "${dir}.tmp/" ./backend/src/apiserver) ||
    cannot "${PIECE}: building KFP ${V} from ${SRC} failed (is the Go module proxy reachable? go env GOPROXY)"
  # go build names each binary after its package folder; the images use upstream's names.
  mv "${dir}.tmp/persistence" "${dir}.tmp/persistence_agent"
  mv "${dir}.tmp/scheduledworkflow" "${dir}.tmp/controller"
  mkdir -p "$dir"
  mv "${dir}.tmp"/* "$dir/"
  rmdir "${dir}.tmp"
  say "built KFP's binaries in $((SECONDS - start)) s"
}

# Argo's two binaries inside a writable copy of its module download: upstream keeps
# workflow/executor/osspecific/signal_linux.go as a symlink to signal_darwin.go, and module zips
# drop symlinks (../shared/CLUSTER.md), so the copy gets the file the link names.
build_argo() {
  local dir="${BIN_DIR}/argo-${AV}" s name bin pkg start=$SECONDS src ldflags
  [[ -x "${dir}/workflow-controller" && -x "${dir}/argoexec" ]] && return 0
  command -v go >/dev/null 2>&1 || cannot "${PIECE}: Go is not installed (Argo is built from its Go module)"
  if [[ ! -f "${ARGO_SRC}/go.mod" ]]; then
    src="$(go_module_dir "$PIECE" "${ARGO_MODULE}@v${AV}")"
    rm -rf "$ARGO_SRC" "${ARGO_SRC}.tmp"
    cp -r "$src" "${ARGO_SRC}.tmp"
    chmod -R u+w "${ARGO_SRC}.tmp"
    local osdir="${ARGO_SRC}.tmp/workflow/executor/osspecific"
    [[ -e "${osdir}/signal_linux.go" ]] || cp "${osdir}/signal_darwin.go" "${osdir}/signal_linux.go"
    mv "${ARGO_SRC}.tmp" "$ARGO_SRC"
  fi
  ldflags="-s -w -X ${ARGO_MODULE}.version=v${AV} -X ${ARGO_MODULE}.gitTag=v${AV} -X ${ARGO_MODULE}.gitTreeState=clean"
  mkdir -p "$dir"
  for s in "${ARGO_SERVICES[@]}"; do
    read -r name bin pkg _ <<<"$s"
    [[ -x "${dir}/${bin}" ]] && continue
    say "go build ${pkg} (Argo v${AV}) -> ${dir}/${bin}"
    (cd "$ARGO_SRC" && CGO_ENABLED=0 go_ build -trimpath -ldflags "$ldflags" -o "${dir}/${bin}.tmp" "$pkg") ||
      cannot "${PIECE}: building Argo ${AV}'s ${bin} failed (is the Go module proxy reachable? go env GOPROXY)"
    mv "${dir}/${bin}.tmp" "${dir}/${bin}"
  done
  say "built Argo's binaries in $((SECONDS - start)) s"
}

# go_image NAME BINARY BINDIR: the binary in /bin over the node's busybox (upstream's images have a
# shell: the start commands and the init containers' scripts use it), with upstream's start
# command; the API server gets its config folder, the controller the time zone database.
go_image() {
  local name="$1" bin="$2" bindir="$3" tag recipe ctx bb_id stamp=()
  tag="$(image_of "$name")"
  bb_id="$(docker image inspect --format '{{.Id}}' "$BUSYBOX_IMAGE")"
  recipe="$(RECIPE_EXTRA="$V $AV $name $bin $bb_id $(start_command "$bin")" recipe_of "${DF_DIR}/Dockerfile.go")"
  image_is_built "$tag" "$recipe" && return 0
  # shellcheck disable=SC2119  # no files: the folders below are filled one by one
  ctx="$(image_context)"
  mkdir -p "${ctx}/bin" "${ctx}/config" "${ctx}/zoneinfo"
  cp "${bindir}/${bin}" "${ctx}/bin/"
  case "$bin" in
  apiserver)
    cp "${SRC}/backend/src/apiserver/config/config.json" "${ctx}/config/"
    stamp=(--build-arg "TAG_NAME=${V}" --build-arg "COMMIT_SHA=${KFP_COMMIT}")
    ;;
  controller) cp -r /usr/share/zoneinfo/. "${ctx}/zoneinfo/" ;;
  esac
  cp "${DF_DIR}/Dockerfile.go" "${ctx}/Dockerfile"
  start_command "$bin" >>"${ctx}/Dockerfile"
  build_context "$PIECE" "$tag" "$recipe" "$ctx" --build-arg "BUSYBOX=${BUSYBOX_IMAGE}" "${stamp[@]}"
}

python_image() {
  local tag="$1" df="$2" base recipe ctx
  shift 2
  base="$("${REPO_ROOT}/hack/base-image.sh")"
  recipe="$(RECIPE_EXTRA="$base" recipe_of "$df" "$@")"
  image_is_built "$tag" "$recipe" && return 0
  ctx="$(mktemp -d)"
  cp "$df" "${ctx}/Dockerfile"
  (($#)) && cp "$@" "$ctx/"
  docker_build "$PIECE" "$tag" "$recipe" "$ctx" --build-arg "BASE=${base}"
  rm -rf "$ctx"
}

addon_image() {
  check_user_path
  need_docker "$PIECE"
  need_busybox_image "$PIECE"
  kfp_source "$PIECE"
  build_kfp
  build_argo
  local s name bin
  for s in "${KFP_SERVICES[@]}"; do
    read -r name bin _ <<<"$s"
    go_image "$name" "$bin" "${BIN_DIR}/kfp-${V}"
  done
  for s in "${ARGO_SERVICES[@]}"; do
    read -r name bin _ <<<"$s"
    go_image "$name" "$bin" "${BIN_DIR}/argo-${AV}"
  done
  python_image "$MLMD_IMAGE" "${DF_DIR}/Dockerfile.mlmd" "${DF_DIR}/requirements-mlmd.lock" \
    "${DF_DIR}/mlmd_server.py" "${DF_DIR}/mlmd_check.py"
  python_image "$WAIT_IMAGE" "${DF_DIR}/Dockerfile.wait"
  mariadb_image "$PIECE"
}

# The images: block mapping each upstream image to its local build.
images_yaml() {
  local s name up tag
  for s in "${KFP_SERVICES[@]}" "${ARGO_SERVICES[@]}"; do
    read -r name _ _ up <<<"$s"
    image_map "$up" "$(image_of "$name")"
  done
  image_map "$MLMD_UPSTREAM" "$MLMD_IMAGE"
  image_map "$WAIT_UPSTREAM" "$WAIT_IMAGE"
  image_map mysql "$MARIADB_IMAGE"
  image_map ghcr.io/chrislusf/seaweedfs "$SEAWEEDFS_IMAGE"
}

# A short hash of the ids of the images the Deployments run: an image rebuilt under the same tag
# rolls its Deployment (the node holds images by tag; a running pod keeps the old one). Not on
# SeaweedFS's, which the object-store add-on applies first and this must not change.
image_ids() {
  local t
  for t in $(addon_images); do docker image inspect --format '{{.Id}}' "$t"; done | sha256sum | cut -c1-16
}

# The user path (manifests/kfp/PART: its kustomization and the files it lists) copied into the
# state folder with its remote base pointing at the extracted tarball: the only change to it.
localize_user_path() {
  local part="$1" dir="$2" up
  user_files "${REPO_ROOT}/manifests/kfp/${part}" "${dir}/${part}" >/dev/null
  up="$(realpath --relative-to "${dir}/${part}" "${SRC}/manifests/kustomize")"
  sed -E "s#github.com/kubeflow/pipelines/manifests/kustomize/([^?]*)\?ref=${KFP_COMMIT}#${up}/\1#" \
    "${REPO_ROOT}/manifests/kfp/${part}/kustomization.yaml" >"${dir}/${part}/kustomization.yaml"
  ! grep -q "github.com/" "${dir}/${part}/kustomization.yaml" ||
    die "${PIECE}: manifests/kfp/${part} names a remote base other than KFP ${V}'s manifests/kustomize"
}

# The test cluster's overlays: the user path with the local base, the local images (also where
# upstream names them in env and arguments: the driver and launcher images, Argo's executor),
# without the UI's Deployments (KFP_UI_DEPLOYMENTS: the kfp-ui add-on's).
write_overlay() {
  local dir="$1" name
  localize_user_path cluster-scoped-resources "$dir"
  localize_user_path platform-agnostic "$dir"
  mkdir -p "${dir}/install"
  {
    cat <<YAML
# Written by hack/cluster/addons/kfp.sh: manifests/kfp/platform-agnostic (KFP ${V}) from the
# extracted tarball, with the locally built images.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../platform-agnostic
images:
$(images_yaml)
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: ml-pipeline}
      spec:
        template:
          spec:
            containers:
              - name: ml-pipeline-api-server
                env:
                  - {name: V2_DRIVER_IMAGE, value: "$(image_of kfp-driver)"}
                  - {name: V2_LAUNCHER_IMAGE, value: "$(image_of kfp-launcher)"}
  - target: {kind: Deployment, name: workflow-controller}
    patch: |-
      - {op: test, path: /spec/template/spec/containers/0/args/2, value: --executor-image}
      - {op: replace, path: /spec/template/spec/containers/0/args/3, value: "$(image_of argo-argoexec)"}
$(roll_on_images '{kind: Deployment, labelSelector: "app!=seaweedfs"}')
YAML
    for name in "${KFP_UI_DEPLOYMENTS[@]}"; do
      # shellcheck disable=SC2016  # `$patch` is kustomize's word, not a variable
      printf '  - patch: |-\n      $patch: delete\n      apiVersion: apps/v1\n      kind: Deployment\n      metadata: {name: %s}\n' "$name"
    done
  } >"${dir}/install/kustomization.yaml"
}

# api_get PATH: GET the API server's PATH through a port-forward of Service ml-pipeline
# (common.sh's forward_start), as the README and KFP's SDK client reach it. Not the Kubernetes
# API server's service proxy: that connects from the control plane's node, and upstream's
# NetworkPolicy on ml-pipeline admits KFP's own pods and run pods only: with the pod on another
# node it was refused (seen on three nodes; a node's own traffic to its own pods is exempt).
api_get() {
  local out rc=0
  forward_start "$NS" ml-pipeline 8888 2>/dev/null || return 1
  out="$(curl -fsS --max-time 20 "${FORWARD_URL}$1")" || rc=$?
  forward_stop
  ((rc == 0)) && printf '%s\n' "$out"
  return "$rc"
}

# The API server answers through its Service.
api_answers() {
  api_get /apis/v2beta1/healthz | grep -q '"multi_user":false'
}

# The persistence agent and the ScheduledWorkflow controller dial the API server's gRPC port once,
# at start. One that started before the API server's current pod was Ready (its pod restarted,
# or was replaced by a changed image) reported to nothing: every run stayed PENDING (seen here).
# Such a one is restarted.
reconnect_reporters() {
  local ready d started
  ready="$(kubectl_ -n "$NS" get pods -l app=ml-pipeline \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].lastTransitionTime}{"\n"}{end}' |
    sort | tail -n 1)"
  for d in ml-pipeline-persistenceagent ml-pipeline-scheduledworkflow; do
    started="$(kubectl_ -n "$NS" get pods -l "app=${d}" -o jsonpath='{.items[0].status.startTime}')"
    if [[ -n "$ready" && "$started" < "$ready" ]]; then
      say "${d} started before the API server was Ready: restarting it"
      kubectl_ -n "$NS" rollout restart "deployment/${d}" >/dev/null
      rollout "$PIECE" "$NS" "$d" 180
    fi
  done
}

addon_install() {
  check_user_path
  need_cluster "$PIECE"
  kfp_source "$PIECE"
  local tag dir d
  for tag in $(addon_images); do import_image "$tag"; done
  dir="$(addon_state "$PIECE")"
  write_overlay "$dir"
  hostpath_pv "$PIECE" "$NS" mysql-pv-claim 20Gi 999:999
  hostpath_pv "$PIECE" "$NS" seaweedfs-pvc 20Gi 1000:1000
  apply_k "$PIECE" "${dir}/cluster-scoped-resources"
  # The user path leaves both Secrets out (upstream's hold minio/minio123 and root with no
  # password): they are made before anything that reads them.
  ensure_credentials "$PIECE" object-store kfp-db
  crds_established "$PIECE" {workflows,workflowtaskresults,workflowartifactgctasks}.argoproj.io \
    scheduledworkflows.kubeflow.org
  apply_k "$PIECE" "${dir}/install"
  for d in mysql seaweedfs metadata-grpc-deployment ml-pipeline ml-pipeline-persistenceagent \
    ml-pipeline-scheduledworkflow workflow-controller; do
    rollout "$PIECE" "$NS" "$d" 420
  done
  wait_for 120 api_answers ||
    die "${PIECE}: the API server does not answer through Service ${NS}/ml-pipeline within 120 s (kubectl -n ${NS} logs deploy/ml-pipeline)"
  reconnect_reporters
  say "KFP ${V}'s API server answers at ml-pipeline.${NS}:8888 (HTTP) and :8887 (gRPC)"
}

addon_verify() {
  need_cluster "$PIECE"
  check_credentials "$PIECE" object-store kfp-db
  local pod=gpupipe-verify-mlmd out overrides
  # Labelled as KFP labels a run's pods: ML Metadata's NetworkPolicy admits those and KFP's own
  # servers only (manifests/kfp/platform-agnostic/kfp-networkpolicy.yaml).
  overrides="$(printf '{"metadata":{"labels":{"pipelines.kubeflow.org/v2_component":"true"}},"spec":{%s,"containers":[{"name":"%s","image":"%s","command":["python","/opt/mlmd/mlmd_check.py","metadata-grpc-service.%s","8080"],%s}]}}' \
    "$RESTRICTED_POD" "$pod" "$MLMD_IMAGE" "$NS" "$RESTRICTED_CONTAINER")"
  out="$(run_pod "$NS" "$pod" "$MLMD_IMAGE" "$overrides" 300)" ||
    die "${PIECE}: ML Metadata's check from a pod failed: ${out}"
  printf '%s\n' "$out" | sed 's/^/      /'
  grep -q "^mlmd-check: all [0-9]* checks passed" <<<"$out" || die "${PIECE}: ML Metadata's check did not finish"
  out="$(api_get /apis/v2beta1/pipelines)" ||
    die "${PIECE}: listing pipelines through Service ${NS}/ml-pipeline failed"
  say "ML Metadata's service passed its check; the API server lists pipelines: ${out:0:80}"
}

case "${1:-}" in
verify) addon_verify ;;
*) addon_main "$PIECE" "$@" ;;
esac
