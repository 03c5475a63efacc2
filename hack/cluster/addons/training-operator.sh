#!/usr/bin/env bash
# Kubeflow Training Operator v1 (PyTorchJob kubeflow.org/v1) in the test cluster, built here:
#   image    the manager from its Go module (cmd/training-operator.v1), FROM scratch
#   install  upstream's standalone overlay from the same module download (CRDs, RBAC, webhook,
#            Deployment in `kubeflow`), copied into the state folder under a kustomize overlay
#            that names the local image and gives PyTorchJob init containers the node's busybox
#            (they wait with nslookup for the master's name; see init_container_template); then the user path's RBAC (manifests/rbac, as
#            users apply it) and the `pipeline-runner` ServiceAccount it binds (KFP makes it on
#            a full install). Waits for the operator and for its webhook to judge a PyTorchJob.
#   verify   a real 2-node PyTorchJob (busybox containers): the webhook admits it, the worker's
#            init container finds the master, both pods succeed; the job is deleted after.
#   images   the tags it needs
# The version is TRAINING_OPERATOR_VERSION (versions.env); the user path (manifests/
# training-operator) must pin the same tag, or this refuses to run.
set -euo pipefail
# shellcheck source=hack/cluster/addons/common.sh
source "$(dirname "$0")/common.sh"

PIECE="training-operator"
V="${TRAINING_OPERATOR_VERSION}"
MODULE="github.com/kubeflow/training-operator"
IMAGE="gpupipe.local/training-operator:v${V}"
UPSTREAM_IMAGE="ghcr.io/kubeflow/training-v1/training-operator"
NS=kubeflow

# The user path applies the same release: a drift between the two is a bug.
check_user_path() {
  local k="${REPO_ROOT}/manifests/training-operator/kustomization.yaml"
  grep -q "?ref=${TRAINING_OPERATOR_COMMIT}\$" "$k" ||
    die "${PIECE}: ${k} does not pin v${V}'s commit ${TRAINING_OPERATOR_COMMIT} (versions.env): make them agree"
}

addon_images() {
  echo "$IMAGE"
  echo "$BUSYBOX_IMAGE"
}

addon_image() {
  check_user_path
  need_docker "$PIECE"
  need_busybox_image "$PIECE"
  local df="${ADDONS_HACK}/images/training-operator/Dockerfile" recipe
  recipe="$(RECIPE_EXTRA="$V" recipe_of "$df")"
  image_is_built "$IMAGE" "$recipe" && return 0
  go_install "$PIECE" training-operator "$V" "${MODULE}/cmd/training-operator.v1@v${V}" manager
  build_context "$PIECE" "$IMAGE" "$recipe" "$(image_context "${BIN_DIR}/training-operator-${V}/manager" "$df")"
}

# The overlay in the state folder: upstream's manifests (a copy: the module cache is read-only and
# kustomize wants the files under its root) plus our image, init-container image and account.
write_overlay() {
  local dir="$1"
  upstream_copy "$PIECE" "$dir" "${MODULE}@v${V}" manifests
  cat >"${dir}/kustomization.yaml" <<YAML
# Written by hack/cluster/addons/training-operator.sh: Kubeflow Training Operator v${V}, upstream's
# standalone overlay (from the Go module download in ./upstream) with the locally built images.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - upstream/overlays/standalone
images:
$(image_map "$UPSTREAM_IMAGE" "$IMAGE")
configMapGenerator:
  - name: training-operator-pytorch-init
    namespace: ${NS}
    files: [init-container.yaml]
patches:
  - target: {group: apps, version: v1, kind: Deployment, name: training-operator}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/args
        value:
          - --pytorch-init-container-image=${BUSYBOX_IMAGE}
          - --pytorch-init-container-template-file=/etc/training-operator/init-container.yaml
      - op: add
        path: /spec/template/spec/volumes/-
        value: {name: pytorch-init, configMap: {name: training-operator-pytorch-init}}
      - op: add
        path: /spec/template/spec/containers/0/volumeMounts/-
        value: {name: pytorch-init, mountPath: /etc/training-operator, readOnly: true}
YAML
  init_container_template >"${dir}/init-container.yaml"
}

# Upstream's init container (pkg/controller.v1/pytorch/initcontainer.go) with one change: it waits
# until `nslookup <master>` prints an answer instead of until it exits 0. Upstream's alpine:3.10
# image exits 0 once the name resolves; Debian's busybox 1.35 (the node's image) exits 1 whenever
# any search domain answers NXDOMAIN, which a short name in a pod always meets (checked in the
# cluster: nslookup kubernetes.default exits 1), so the worker would wait forever.
init_container_template() {
  cat <<'YAML'
- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: IfNotPresent
  resources:
    limits:
      cpu: 100m
      memory: 20Mi
    requests:
      cpu: 50m
      memory: 10Mi
  command: ['sh', '-c', 'err=1;for i in $(seq {{.MaxTries}}); do if nslookup {{.MasterAddr}} 2>/dev/null | grep -q "^Name:"; then err=0 && break; fi;echo waiting for master; sleep 2; done; exit $err']
  # Upstream's template has no securityContext, so a namespace that enforces restricted Pod
  # Security refuses every worker pod (found on this cluster: FailedCreatePod, "allowPrivilege-
  # Escalation != false (container init-pytorch)"). These are the restricted profile's fields.
  securityContext:
    allowPrivilegeEscalation: false
    capabilities:
      drop: ["ALL"]
    runAsNonRoot: true
    runAsUser: 65534
    runAsGroup: 65534
    seccompProfile:
      type: RuntimeDefault
YAML
}

# A 2-node PyTorchJob of busybox containers, NAME: like a torch rendezvous, the master waits on
# MASTER_PORT until the worker (whose init container waited for the master's DNS name) connects
# with the environment the operator gave it.
pytorchjob() {
  cat <<YAML
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: $1
  namespace: ${NS}
  labels: {app.kubernetes.io/part-of: gpupipe}
spec:
  runPolicy: {cleanPodPolicy: None, backoffLimit: 0}
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: Never
      template:
        spec:
          containers:
            - name: pytorch
              image: ${BUSYBOX_IMAGE}
              command: ["sh", "-c", "echo master \$RANK of \$WORLD_SIZE; timeout 120 nc -l -p \$MASTER_PORT"]
    Worker:
      replicas: 1
      restartPolicy: Never
      template:
        spec:
          containers:
            - name: pytorch
              image: ${BUSYBOX_IMAGE}
              command: ["sh", "-c", "echo worker \$RANK of \$WORLD_SIZE at \$MASTER_ADDR:\$MASTER_PORT | nc -w 10 \$MASTER_ADDR \$MASTER_PORT"]
YAML
}

# The validating webhook answers: a valid PyTorchJob passes a server-side dry run (the webhook
# fails closed, so a pass means it was asked) and an invalid name is refused by it.
webhook_judges() {
  local refusal
  pytorchjob gpupipe-webhook-probe | kubectl_ create --dry-run=server -f - >/dev/null 2>&1 || return 1
  # (the refusal is kubectl's failure: not in a pipeline, where pipefail would report it)
  refusal="$(pytorchjob 1-not-a-dns-1035-label | kubectl_ create --dry-run=server -f - 2>&1)" && return 1
  grep -q 'admission webhook "validator.pytorchjob.training-operator.kubeflow.org" denied' <<<"$refusal"
}

addon_install() {
  check_user_path
  need_cluster "$PIECE"
  apply_overlay "$PIECE"
  crds_established "$PIECE" pytorchjobs.kubeflow.org
  runner_account "$PIECE"
  apply_k "$PIECE" "${REPO_ROOT}/manifests/pod-security"
  rollout "$PIECE" "$NS" training-operator 180
  webhooks_judge "$PIECE" PyTorchJob "$NS" training-operator
  say "the PyTorchJob webhook admits a valid job and refuses an invalid name"
}

addon_verify() {
  need_cluster "$PIECE"
  local job=gpupipe-verify-pytorchjob
  check_object "$PIECE" "$NS" pytorchjob "$job" Succeeded 180 pytorchjob "training.kubeflow.org/job-name=${job}" ||
    die "${PIECE}: PyTorchJob ${NS}/${job} did not succeed within 180 s"
  kubectl_ -n "$NS" wait --for jsonpath='{.status.phase}'=Succeeded --timeout 60s "pod/${job}-worker-0" >/dev/null ||
    die "${PIECE}: the worker pod of PyTorchJob ${NS}/${job} did not succeed"
  say "PyTorchJob ${NS}/${job} succeeded; the master heard from the worker:"
  kubectl_ -n "$NS" logs "${job}-master-0" | sed 's/^/      /'
  kubectl_ -n "$NS" delete pytorchjob "$job" --wait >/dev/null
}

case "${1:-}" in
verify) addon_verify ;;
*) addon_main "$PIECE" "$@" ;;
esac
