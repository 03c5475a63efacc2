#!/usr/bin/env bash
# Katib (Experiment kubeflow.org/v1beta1) in the test cluster, built here:
#   image    the Go services from Katib's Go module (controller with its webhooks, DB manager, the
#            goptuna suggestion service) FROM scratch, the file metrics collector over the
#            Debian base (it needs pgrep); the Python
#            services the tune step needs (the medianstop early-stopping service and the optuna
#            suggestion service) from upstream's Dockerfiles over the local Debian Python base,
#            their requirements from PyPI; the database: Debian's MariaDB (see
#            images/mariadb/Dockerfile, shared with the KFP add-on)
#   install  the Secret katib-mysql-secrets generated for this cluster (hack/credentials.sh: the
#            DB manager's account `katib` limited to database katib, root from inside the
#            database's pod only; upstream's password is "test"), then upstream's standalone
#            install from the same module download (CRDs, RBAC, the controller and its webhooks,
#            DB manager, database, in `kubeflow`) without its UI (a web front end built with npm:
#            nothing here needs it), with the user path's patches (manifests/katib: no upstream
#            Secret, the database accounts from the generated one), under a kustomize overlay in
#            the state folder that names the local images, with a `katib-config` whose
#            suggestions and collectors are the images built here (SUGGESTIONS below)
#   verify   the Secret holds generated values; an Experiment of two trials (busybox Jobs printing
#            `loss=<x>`, goptuna's sobol search, the StdOut collector injected): it succeeds with a
#            best trial (its observations pass through the DB manager's account); deleted after
#   images   the tags it needs
# The version is KATIB_VERSION (versions.env); the user path (manifests/katib) must pin the same
# tag, or this refuses to run.
set -euo pipefail
# shellcheck source=hack/cluster/addons/common.sh
source "$(dirname "$0")/common.sh"

PIECE="katib"
V="${KATIB_VERSION}"
MODULE="github.com/kubeflow/katib"
NS=kubeflow
DF_DIR="${ADDONS_HACK}/images/katib"

# The Go services: image name, folder and binary name as upstream's image has them, package.
GO_SERVICES=(
  "katib-controller /app katib-controller ./cmd/katib-controller/v1beta1"
  "katib-db-manager /app katib-db-manager ./cmd/db-manager/v1beta1"
  "suggestion-goptuna /opt/katib goptuna-suggestion ./cmd/suggestion/goptuna/v1beta1"
)
# The metrics collector: the same, over the Debian base with procps (images/katib/
# Dockerfile.collector says why).
COLLECTOR="file-metrics-collector file-metricscollector ./cmd/metricscollector/v1beta1/file-metricscollector"
# The Python services: image name, upstream's folder of main.py and requirements.txt.
PY_SERVICES=(
  "earlystopping-medianstop cmd/earlystopping/medianstop/v1beta1"
  "suggestion-optuna cmd/suggestion/optuna/v1beta1"
)
# Which image serves which algorithm on this cluster (katib-config). Katib's optuna service (Python)
# serves random, tpe, cmaes, grid and multivariate-tpe with the distribution each parameter asks for
# and the same settings as the tune step's local engine (random_state, n_startup_trials,
# n_ei_candidates, sigma, restart_strategy); goptuna (Go) serves sobol, as upstream maps it. goptuna
# also accepts random, tpe and cmaes, but samples every double uniformly (it ignores
# `distribution`: a logUniform learning rate in [1e-4, 0.03] rarely went below 3e-3), so it serves
# none of them here. bayesianoptimization (scikit-optimize, which upstream pins to numpy 1.23 and
# scikit-learn <= 1.3) and hyperband (scikit-learn, scipy, forestci) are not built: the tune step
# refuses them on a cluster, naming the algorithms it can use there (trainer/tune/space.py
# CLUSTER_ALGORITHMS, which must list the algorithms below but sobol).
SUGGESTIONS=(
  "random suggestion-optuna"
  "tpe suggestion-optuna"
  "cmaes suggestion-optuna"
  "grid suggestion-optuna"
  "multivariate-tpe suggestion-optuna"
  "sobol suggestion-goptuna"
)

image_of() { printf 'gpupipe.local/katib-%s:v%s' "${1#katib-}" "$V"; }

check_user_path() {
  local k="${REPO_ROOT}/manifests/katib/kustomization.yaml"
  grep -q "?ref=${KATIB_COMMIT}\$" "$k" || die "${PIECE}: ${k} does not pin v${V}'s commit ${KATIB_COMMIT} (versions.env): make them agree"
}

addon_images() {
  local s
  for s in "${GO_SERVICES[@]}" "$COLLECTOR" "${PY_SERVICES[@]}"; do image_of "${s%% *}"; echo; done
  echo "$MARIADB_IMAGE"
  echo "$BUSYBOX_IMAGE"
}

go_image() {
  local name dir bin pkg tag recipe ctx
  read -r name dir bin pkg <<<"$1"
  tag="$(image_of "$name")"
  recipe="$(RECIPE_EXTRA="$V $name $dir $bin $pkg entrypoint" recipe_of "${DF_DIR}/Dockerfile.go")"
  image_is_built "$tag" "$recipe" && return 0
  go_build_in_module "$PIECE" katib "$V" "${MODULE}@v${V}" "$pkg" "$bin"
  ctx="$(image_context "${BIN_DIR}/katib-${V}/${bin}")"
  cp "${DF_DIR}/Dockerfile.go" "${ctx}/Dockerfile"
  printf 'ENTRYPOINT ["./%s"]\n' "$bin" >>"${ctx}/Dockerfile"
  build_context "$PIECE" "$tag" "$recipe" "$ctx" --build-arg "DIR=${dir}" --build-arg "BIN=${bin}"
}

collector_image() {
  local name bin pkg tag recipe ctx base
  read -r name bin pkg <<<"$COLLECTOR"
  tag="$(image_of "$name")"
  base="$("${REPO_ROOT}/hack/base-image.sh")"
  recipe="$(RECIPE_EXTRA="$V $name $bin $pkg $base" recipe_of "${DF_DIR}/Dockerfile.collector")"
  image_is_built "$tag" "$recipe" && return 0
  go_build_in_module "$PIECE" katib "$V" "${MODULE}@v${V}" "$pkg" "$bin"
  ctx="$(mktemp -d)"
  cp "${BIN_DIR}/katib-${V}/${bin}" "$ctx/"
  cp "${DF_DIR}/Dockerfile.collector" "${ctx}/Dockerfile"
  docker_build "$PIECE" "$tag" "$recipe" "$ctx" --build-arg "BASE=${base}"
  rm -rf "$ctx"
}

py_image() {
  local name svc tag recipe ctx src base pins
  read -r name svc <<<"$1"
  tag="$(image_of "$name")"
  src="$(go_module_dir "$PIECE" "${MODULE}@v${V}")"
  base="$("${REPO_ROOT}/hack/base-image.sh")"
  pins="${DF_DIR}/requirements-${name}.lock"
  [[ -f "$pins" ]] || die "${PIECE}: ${pins} is missing: every package of an image is pinned and hashed (make lock)"
  recipe="$(RECIPE_EXTRA="$V $name $svc $base" recipe_of "${DF_DIR}/Dockerfile.python" "${src}/${svc}/requirements.txt" "$pins")"
  image_is_built "$tag" "$recipe" && return 0
  ctx="$(mktemp -d)"
  # Upstream's pkg/ tree, its Python files only (the Go code beside them is not needed).
  (cd "$src" && find pkg -name '*.py' -print0 | xargs -0 cp --parents -t "$ctx")
  mkdir "${ctx}/service"
  cp "${src}/${svc}/main.py" "${src}/${svc}/requirements.txt" "${ctx}/service/"
  cp "${DF_DIR}/Dockerfile.python" "${ctx}/Dockerfile"
  cp "$pins" "${ctx}/requirements.lock"
  chmod -R u+w "$ctx"
  docker_build "$PIECE" "$tag" "$recipe" "$ctx" --build-arg "BASE=${base}" --build-arg "SERVICE_DIR=${svc}"
  rm -rf "$ctx"
}

addon_image() {
  check_user_path
  need_docker "$PIECE"
  need_busybox_image "$PIECE"
  local s
  for s in "${GO_SERVICES[@]}"; do go_image "$s"; done
  collector_image
  for s in "${PY_SERVICES[@]}"; do py_image "$s"; done
  mariadb_image "$PIECE"
}

# A container securityContext that restricted Pod Security admits (suggestion containers).
RESTRICTED_YAML='{allowPrivilegeEscalation: false, runAsNonRoot: true, capabilities: {drop: [ALL]}, seccompProfile: {type: RuntimeDefault}}'

# katib-config: upstream's standalone one with the images built here, the suggestions that run
# here (SUGGESTIONS), and the primary container's securityContext copied into the injected
# metrics collector (injectSecurityContext), so that trial pods pass restricted Pod Security.
write_config() {
  local out="$1" s algo name
  {
    cat <<YAML
# Written by hack/cluster/addons/katib.sh: Katib v${V}'s KatibConfig for the test cluster.
apiVersion: config.kubeflow.org/v1beta1
kind: KatibConfig
init:
  certGenerator:
    enable: true
  controller:
    webhookPort: 8443
    injectSecurityContext: true
    trialResources:
      - Job.v1.batch
      - PyTorchJob.v1.kubeflow.org
      - TrainJob.v1alpha1.trainer.kubeflow.org
runtime:
  metricsCollectors:
    - kind: StdOut
      image: $(image_of file-metrics-collector)
      imagePullPolicy: IfNotPresent
    - kind: File
      image: $(image_of file-metrics-collector)
      imagePullPolicy: IfNotPresent
  suggestions:
YAML
    for s in "${SUGGESTIONS[@]}"; do
      read -r algo name <<<"$s"
      cat <<YAML
    - algorithmName: ${algo}
      image: $(image_of "$name")
      imagePullPolicy: IfNotPresent
      securityContext: ${RESTRICTED_YAML}
      resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {cpu: 500m, memory: 512Mi}}
YAML
    done
    cat <<YAML
  earlyStoppings:
    - algorithmName: medianstop
      image: $(image_of earlystopping-medianstop)
      imagePullPolicy: IfNotPresent
      resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {cpu: 500m, memory: 512Mi}}
YAML
  } >"$out"
}

# A short hash of the ids of the images the Deployments run.
image_ids() {
  local t
  for t in "$(image_of katib-controller)" "$(image_of katib-db-manager)" "$MARIADB_IMAGE"; do
    docker image inspect --format '{{.Id}}' "$t"
  done | sha256sum | cut -c1-16
}

# The user path's patches (manifests/katib/kustomization.yaml from its `patches:` line, its last
# section, to the end): the database's accounts from the generated Secret. One copy of them, so
# the two paths cannot drift (tests/cluster/test_addon_manifests.py compares the renderings).
user_path_patches() {
  local k="${REPO_ROOT}/manifests/katib/kustomization.yaml" out
  out="$(sed -n '/^patches:$/,$p' "$k" | tail -n +2)"
  grep -q 'name: katib-mysql-secrets' <<<"$out" ||
    die "${PIECE}: ${k} has no patches for the Secret katib-mysql-secrets after its 'patches:' line"
  printf '%s\n' "$out"
}

# The user path's own files (manifests/katib/*.yaml beside its kustomization: the database's
# NetworkPolicy), copied into DIR/user; their `resources:` lines for the overlay.
user_path_resources() {
  local dir="$1" name names
  rm -rf "${dir}/user"
  names="$(user_files "${REPO_ROOT}/manifests/katib" "${dir}/user")"
  for name in $names; do
    grep -q "^  - ${name}\$" "${REPO_ROOT}/manifests/katib/kustomization.yaml" ||
      die "${PIECE}: manifests/katib/${name} is not in its kustomization's resources"
    printf '  - user/%s\n' "$name"
  done
}

# The overlay in the state folder: upstream's v1beta1 manifests (a copy: the module cache is
# read-only and kustomize wants the files under its root) as katib-standalone composes them,
# without the UI, with the local images, our katib-config and the user path's own files and
# patches.
write_overlay() {
  local dir="$1"
  upstream_copy "$PIECE" "$dir" "${MODULE}@v${V}" manifests/v1beta1
  write_config "${dir}/katib-config.yaml"
  local c own
  own="$(user_path_resources "$dir")" || exit 1
  cat >"${dir}/kustomization.yaml" <<YAML
# Written by hack/cluster/addons/katib.sh: Katib v${V}, upstream's katib-standalone (from the Go
# module download in ./upstream) without the UI, with the locally built images.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: ${NS}
resources:
$(for c in namespace controller crd db-manager mysql webhook; do echo "  - upstream/components/${c}"; done)
${own}
images:
$(image_map ghcr.io/kubeflow/katib/katib-controller "$(image_of katib-controller)")
$(image_map ghcr.io/kubeflow/katib/katib-db-manager "$(image_of katib-db-manager)")
$(image_map mysql "$MARIADB_IMAGE")
configMapGenerator:
  - name: katib-config
    behavior: create
    files:
      - katib-config.yaml
    options:
      disableNameSuffixHash: true
secretGenerator:
  - name: katib-webhook-cert
    options:
      disableNameSuffixHash: true
patches:
$(roll_on_images '{kind: Deployment}')
$(user_path_patches)
YAML
  grep -q 'name: mutator.pod.katib.kubeflow.org' "${dir}/upstream/components/webhook/webhooks.yaml" ||
    die "${PIECE}: upstream's webhooks.yaml has no pod mutator (its layout changed?)"
}

# An Experiment NAME in NS of busybox Job trials printing `loss=<x>` (x from one double
# parameter), TRIALS trials, goptuna's sobol search (the tune step's tests use the optuna service).
experiment() {
  local name="$1" trials="${2:-2}"
  cat <<YAML
apiVersion: kubeflow.org/v1beta1
kind: Experiment
metadata:
  name: ${name}
  namespace: ${NS}
  labels: {app.kubernetes.io/part-of: gpupipe}
spec:
  objective: {type: minimize, objectiveMetricName: loss}
  algorithm: {algorithmName: sobol}
  parallelTrialCount: ${trials}
  maxTrialCount: ${trials}
  maxFailedTrialCount: 1
  parameters:
    - name: x
      parameterType: double
      feasibleSpace: {min: "0.1", max: "0.9"}
  trialTemplate:
    primaryContainerName: main
    trialParameters:
      - {name: x, reference: x}
    trialSpec:
      apiVersion: batch/v1
      kind: Job
      spec:
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            containers:
              - name: main
                image: ${BUSYBOX_IMAGE}
                # Alive for a few seconds: the collector must find the main process (a trial
                # that is done before it looks fails with "unable to find main pid").
                command: [sh, -c, 'sleep 3; echo loss=\${trialParameters.x}']
YAML
}

# The Experiment webhooks answer: the validator refuses a search with no parameters, and the
# defaulter fills in the resume policy. Both fail closed: an answer means they were asked.
webhook_judges() {
  local out refusal
  out="$(experiment gpupipe-webhook-probe | kubectl_ create --dry-run=server -o json -f - 2>/dev/null)" || return 1
  grep -q '"resumePolicy": "Never"' <<<"$out" || return 1
  refusal="$(experiment gpupipe-webhook-probe | sed 's/maxFailedTrialCount: 1/maxFailedTrialCount: -1/' |
    kubectl_ create --dry-run=server -f - 2>&1)" && return 1
  grep -q 'admission webhook "validator.experiment.katib.kubeflow.org" denied' <<<"$refusal"
}

addon_install() {
  check_user_path
  need_cluster "$PIECE"
  local d
  ensure_namespace "$NS"
  ensure_credentials "$PIECE" katib-db
  hostpath_pv "$PIECE" "$NS" katib-mysql 10Gi 999:999
  apply_overlay "$PIECE"
  crds_established "$PIECE" {experiments,suggestions,trials}.kubeflow.org
  for d in katib-mysql katib-db-manager katib-controller; do rollout "$PIECE" "$NS" "$d" 300; done
  webhooks_judge "$PIECE" Experiment "$NS" katib-controller
  say "the Experiment webhooks default a resume policy and refuse a negative failure budget"
}

addon_verify() {
  need_cluster "$PIECE"
  check_credentials "$PIECE" katib-db
  local exp=gpupipe-verify-katib out
  if ! check_object "$PIECE" "$NS" experiment "$exp" Succeeded 240 experiment; then
    kubectl_ -n "$NS" get experiment,suggestion,trial,pods -o wide >&2 || true
    kubectl_ -n "$NS" get trials -l "katib.kubeflow.org/experiment=${exp}" \
      -o jsonpath='{range .items[*]}{.metadata.name}: {.status.conditions[-1:].message}{"\n"}{end}' >&2 || true
    die "${PIECE}: Experiment ${NS}/${exp} did not succeed within 240 s"
  fi
  out="$(kubectl_ -n "$NS" get experiment "$exp" -o jsonpath='{.status.currentOptimalTrial.bestTrialName} {.status.currentOptimalTrial.observation.metrics[0].latest}')"
  [[ "$out" =~ ^${exp}-[a-z0-9]+\ 0\.[0-9]+$ ]] ||
    die "${PIECE}: Experiment ${NS}/${exp} succeeded without a best trial and its loss (got '${out}')"
  say "Experiment ${NS}/${exp} succeeded; best trial and loss: ${out}"
  kubectl_ -n "$NS" delete experiment "$exp" --wait >/dev/null
}

case "${1:-}" in
verify) addon_verify ;;
*) addon_main "$PIECE" "$@" ;;
esac
