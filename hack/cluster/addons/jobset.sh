#!/usr/bin/env bash
# JobSet (jobset.x-k8s.io/v1alpha2) in the test cluster, built here: every Kubeflow Trainer v2
# TrainJob runs as a JobSet (hack/cluster/addons/trainer.sh), and JobSet's mutating webhook sets
# the defaults the TrainJob relies on (Indexed completion, DNS hostnames for the pods).
#   image    the manager from its Go module (main package at the module root), FROM scratch
#   install  upstream's default overlay from the same module download (CRD, RBAC, the manager
#            with its internal certificate management, both webhooks, in `jobset-system`), copied
#            into the state folder under a kustomize overlay that names the local image and asks
#            less CPU of this 2-core node; waits until both webhooks judge a JobSet
#   verify   a real 2-pod JobSet (busybox containers): the first pod reaches the second by the
#            DNS hostname JobSet's defaults give it, the JobSet completes; deleted after
#   images   the tags it needs
# The version is JOBSET_VERSION (versions.env), the one Kubeflow Trainer's manager overlay at
# TRAINER_VERSION installs (manifests/trainer/manager, the user path): install refuses a drift.
set -euo pipefail
# shellcheck source=hack/cluster/addons/common.sh
source "$(dirname "$0")/common.sh"

PIECE="jobset"
V="${JOBSET_VERSION}"
MODULE="sigs.k8s.io/jobset"
IMAGE="gpupipe.local/jobset:v${V}"
# The name upstream's config/components/manager gives the image (its release manifest renames it
# to registry.k8s.io/jobset/jobset).
UPSTREAM_IMAGE="us-central1-docker.pkg.dev/k8s-staging-images/jobset/jobset"
NS=jobset-system

# Trainer's manager overlay (the user path) installs JobSet from its release URL: the same version.
check_user_path() {
  local k
  k="$(go_module_dir "$PIECE" "github.com/kubeflow/trainer/v2@v${TRAINER_VERSION}")/manifests/third-party/jobset/kustomization.yaml"
  grep -q "/jobset/releases/download/v${V}/manifests.yaml\$" "$k" ||
    die "${PIECE}: Kubeflow Trainer v${TRAINER_VERSION} installs another JobSet than v${V} (${k}): make JOBSET_VERSION agree"
}

addon_images() { echo "$IMAGE"; }

addon_image() {
  need_docker "$PIECE"
  local df="${ADDONS_HACK}/images/jobset/Dockerfile" recipe
  recipe="$(RECIPE_EXTRA="$V" recipe_of "$df")"
  image_is_built "$IMAGE" "$recipe" && return 0
  go_build_in_module "$PIECE" jobset "$V" "${MODULE}@v${V}" . manager
  build_context "$PIECE" "$IMAGE" "$recipe" "$(image_context "${BIN_DIR}/jobset-${V}/manager" "$df")"
}

# The overlay in the state folder: upstream's config folder (a copy: the module cache is read-only
# and kustomize wants the files under its root) plus our image and a smaller CPU request.
write_overlay() {
  local dir="$1"
  upstream_copy "$PIECE" "$dir" "${MODULE}@v${V}" config
  cat >"${dir}/kustomization.yaml" <<YAML
# Written by hack/cluster/addons/jobset.sh: JobSet v${V}, upstream's default overlay (from the Go
# module download in ./upstream: the one its release manifest is built from) with the local image.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - upstream/default
images:
$(image_map "$UPSTREAM_IMAGE" "$IMAGE")
patches:
  # Upstream asks 500m CPU; the whole node has 2 cores, and a 2-node training job needs most.
  - target: {group: apps, version: v1, kind: Deployment, name: jobset-controller-manager}
    patch: |-
      - op: replace
        path: /spec/template/spec/containers/0/resources/requests/cpu
        value: 50m
YAML
}

# A JobSet of COUNT busybox pods, NAME; OPTS (a YAML fragment) go under spec.
jobset() {
  local name="$1" spec_extra="${2:-}"
  cat <<YAML
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: ${name}
  namespace: ${NS}
  labels: {app.kubernetes.io/part-of: gpupipe}
spec:
  ${spec_extra}
  replicatedJobs:
    - name: node
      replicas: 1
      template:
        spec:
          parallelism: 2
          completions: 2
          backoffLimit: 0
          template:
            spec:
              restartPolicy: Never
              containers:
                - name: node
                  image: ${BUSYBOX_IMAGE}
                  command:
                    - sh
                    - -c
                    - |
                      if [ "\$JOB_COMPLETION_INDEX" = 0 ]; then
                        for i in \$(seq 60); do
                          echo ping | nc -w 2 ${name}-node-0-1.${name} 7000 && exit 0; sleep 2
                        done; exit 1
                      else
                        timeout 120 nc -l -p 7000
                      fi
YAML
}

# Both webhooks answer: the mutating one fills JobSet's defaults into a dry-run object (network
# and startup policy), and the validating one refuses a JobSet whose pod names would pass 63
# characters (<jobset>-node-0-1 plus the pod's 5-character suffix: only the webhook checks this,
# not the CRD's rules). Both fail closed, so an answer means they were asked.
webhook_judges() {
  local out refusal long=gpupipe-webhook-probe-of-a-name-fifty-characters-x
  out="$(jobset gpupipe-webhook-probe | kubectl_ create --dry-run=server -o json -f - 2>/dev/null)" || return 1
  grep -q '"enableDNSHostnames": true' <<<"$out" || return 1
  grep -q '"startupPolicyOrder": "AnyOrder"' <<<"$out" || return 1
  refusal="$(jobset "$long" | kubectl_ create --dry-run=server -f - 2>&1)" && return 1
  grep -q 'pod names generated for this JobSet will exceed 63 characters' <<<"$refusal"
}

addon_install() {
  check_user_path
  need_cluster "$PIECE"
  apply_overlay "$PIECE"
  crds_established "$PIECE" jobsets.jobset.x-k8s.io
  rollout "$PIECE" "$NS" jobset-controller-manager 180
  # (The CA also goes into the CRD's conversion webhook.)
  webhooks_judge "$PIECE" JobSet "$NS" jobset-controller-manager
  say "the JobSet webhooks fill in defaults and refuse a name too long for its pods"
}

addon_verify() {
  need_cluster "$PIECE"
  local js=gpupipe-verify-jobset
  check_object "$PIECE" "$NS" jobset "$js" Completed 180 jobset "jobset.sigs.k8s.io/jobset-name=${js}" ||
    die "${PIECE}: JobSet ${NS}/${js} did not complete within 180 s"
  say "JobSet ${NS}/${js} completed: its pod 0 reached pod 1 by its DNS hostname"
  kubectl_ -n "$NS" delete jobset "$js" --wait >/dev/null
}

case "${1:-}" in
verify) addon_verify ;;
*) addon_main "$PIECE" "$@" ;;
esac
