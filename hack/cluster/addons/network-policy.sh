#!/usr/bin/env bash
# NetworkPolicy in the test cluster: kube-router's network policy controller and nothing else of
# it (no pod networking, no service proxy), beside the CNI bridge plugin that gives pods their
# addresses, the flags of upstream's kube-router-firewall-daemonset.yaml. A host process, as
# kube-proxy and the kubelet are here (upstream runs the same binary in a privileged hostNetwork
# pod): it keeps the node's iptables filter table and ipsets in step with the cluster's
# NetworkPolicies, so manifests/mlflow's policy and KFP's SeaweedFS policy hold.
#   image    kube-router v${KUBE_ROUTER_VERSION} from its Go module through hack/cluster/gomod/kube-router
#            (dependencies raised past what govulncheck flags, built with Go ${KUBE_ROUTER_GOTOOLCHAIN}),
#            and Debian's ipset tool, which it runs; no container image
#   install  a ClusterRole that reads what it watches (pods, namespaces, policies, and the nodes,
#            services and endpoints its informers list), bound to its client certificate's user
#            (hack/cluster/pki.sh), then the process (log: logs/kube-router.log, restarted when its
#            flags change); waits for its first full sync (its explicit-accept rule in
#            KUBE-ROUTER-FORWARD)
#   verify   from pods of two namespaces of its own: in a plain one, which no policy admits, a
#            pod is refused by MLflow and by SeaweedFS, with KFP's run label or without; in one
#            labelled as Kubeflow's profile controller labels a pipeline namespace, a pod with the
#            label reaches both (the positive control: the refusals are the policy's, not a dead
#            service)
#   images   none
#   flags    print the command line it runs, one argument a line
# No listening port: the health port is off (upstream's binds every interface), metrics are off.
# cluster-down stops it and removes its iptables chains (KUBE-ROUTER-*, KUBE-POD-FW-*,
# KUBE-NWPLCY-*) and ipsets (KUBE-SRC-*, KUBE-DST-*) when this cluster ran it.
set -euo pipefail
# shellcheck source=hack/cluster/addons/common.sh
source "$(dirname "$0")/common.sh"
# shellcheck source=hack/cluster/procs.sh
source "${CLUSTER_HACK}/procs.sh"

PIECE="network-policy"
V="${KUBE_ROUTER_VERSION}"
MODULE="github.com/cloudnativelabs/kube-router/v2"
GOMOD="${CLUSTER_HACK}/gomod/kube-router"
USER_NAME="gpupipe:kube-router"
VERIFY_NS=gpupipe-verify-netpol
VERIFY_PROFILE_NS=gpupipe-verify-netpol-profile

# The binary's version folder: the release and a hash of the wrapper module and the Go release, so
# that a raised dependency or a newer Go builds it again.
build_version() {
  printf '%s-%s' "$V" \
    "$(RECIPE_EXTRA="${KUBE_ROUTER_GOTOOLCHAIN}" recipe_of "${GOMOD}/go.mod" "${GOMOD}/go.sum" | cut -c1-8)"
}
BIN="${BIN_DIR}/kube-router-$(build_version)/kube-router"

# The wrapper module must name the version in versions.env.
check_versions() {
  grep -q "^require ${MODULE} v${V}\$" "${GOMOD}/go.mod" ||
    die "${PIECE}: hack/cluster/gomod/kube-router/go.mod does not require ${MODULE} v${V} (versions.env)"
}

# kube-router's policy controller runs `ipset` (Debian's package): installed as cluster-up's
# preflight installs the node's other tools.
need_ipset() {
  command -v ipset >/dev/null 2>&1 && return 0
  say "apt-get install ipset"
  "${CLUSTER_HACK}/../apt-install.sh" ipset ||
    cannot "${PIECE}: could not install ipset with apt-get (kube-router's policy controller runs it)"
}

addon_images() { :; }

addon_image() {
  check_versions
  need_ipset
  GOTOOLCHAIN="${KUBE_ROUTER_GOTOOLCHAIN}" go_build_wrapper "$PIECE" kube-router "$(build_version)" \
    kube-router "${MODULE}/cmd/kube-router" kube-router "-X ${MODULE}/pkg/version.Version=v${V}"
}

# flags [K]: node K's kube-router command line, one argument a line (node 1 by default): it runs in
# the node's network namespace (hack/cluster/nodes.sh), whose iptables it keeps. The firewall alone; the node's name and
# the service network as the cluster's other pieces have them. It syncs on every pod, namespace and
# policy change and every 5 minutes (its default): each sync rewrites the whole filter table
# (iptables-restore without --noflush), so no shorter period.
flags() {
  local k="${1:-1}"
  # shellcheck disable=SC2046  # node_exec's words are separate arguments
  printf '%s\n' $(node_exec "$k") "$BIN" \
    --kubeconfig "${PKI}/kube-router.kubeconfig" \
    --hostname-override "$(node_name "$k")" \
    --run-firewall=true --run-router=false --run-service-proxy=false --run-loadbalancer=false \
    --enable-cni=false --enable-ipv4=true --enable-ipv6=false \
    --service-cluster-ip-range "${SERVICE_CIDR}" \
    --health-port 0 --metrics-port 0 \
    --v 0
}

rbac() {
  cat <<YAML
# Written by hack/cluster/addons/network-policy.sh: what kube-router's informers list and watch
# (upstream's ClusterRole, less what its router and load-balancer controllers write).
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: gpupipe:kube-router
  labels: {app.kubernetes.io/part-of: gpupipe, app.kubernetes.io/component: cluster-addons}
rules:
  - apiGroups: [""]
    resources: [namespaces, pods, services, nodes, endpoints]
    verbs: [get, list, watch]
  - apiGroups: [networking.k8s.io]
    resources: [networkpolicies]
    verbs: [get, list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: gpupipe:kube-router
  labels: {app.kubernetes.io/part-of: gpupipe, app.kubernetes.io/component: cluster-addons}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: gpupipe:kube-router}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: ${USER_NAME}}
YAML
}

# synced K: node K's first full sync is done (it appends the explicit-accept rule to its chains last).
synced() {
  on_node "$1" iptables -t filter -S KUBE-ROUTER-FORWARD 2>/dev/null | grep -q 'rule to explicitly ACCEPT traffic'
}

addon_install() {
  check_versions
  need_cluster "$PIECE"
  need_ipset
  [[ -x "$BIN" ]] || die "${PIECE}: ${BIN} is not built (hack/cluster/addons/network-policy.sh image)"
  [[ -f "${PKI}/kube-router.kubeconfig" ]] ||
    die "${PIECE}: ${PKI}/kube-router.kubeconfig is missing (hack/cluster/pki.sh makes it; run hack/cluster-up.sh)"
  local dir args=()
  dir="$(addon_state "$PIECE")"
  mkdir -p "$dir"
  rbac >"${dir}/rbac.yaml"
  printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [rbac.yaml]\n' \
    >"${dir}/kustomization.yaml"
  apply_k "$PIECE" "$dir"
  local k proc flags_file
  for ((k = 1; k <= $(cluster_nodes); k++)); do
    proc="$(node_proc kube-router "$k")" flags_file="${dir}/$(node_proc flags "$k")"
    # New flags (or a new binary) take effect: it starts again below.
    if flags "$k" | put "$flags_file"; then stop "$proc"; fi
    mapfile -t args <"$flags_file"
    start "$proc" "${args[@]}"
    must_run "$proc" 120 synced "$k"
    say "kube-router's network policy controller runs on $(node_name "$k") (log: ${LOG_DIR}/${proc}.log)"
  done
}

# probe_script EXPECT HOST:PORT...: a pod's shell script that connects to each address with wget
# (under `timeout`: this busybox's `wget -T` crashes on an error) and exits 0 only when each was
# EXPECT (reached: an HTTP answer of any status; refused: none). kube-router adds a new pod's
# address to the policies' ipsets on its next sync, a moment after the pod starts: an address to
# be reached is tried for up to 20 s; one to be refused must be refused on each of 3 tries.
probe_script() {
  local expect="$1"
  shift
  cat <<SH
try() {
  out="\$(timeout 10 wget -q -O /dev/null "http://\$1/" 2>&1)" && got=reached || got=refused
  case "\$out" in *HTTP/*) got=reached ;; esac
}
fail=0
for target in $*; do
  i=0
  while :; do
    try "\$target"
    i=\$((i + 1))
    if [ "${expect}" = reached ]; then [ "\$got" = reached ] || [ \$i -ge 20 ] && break
    else [ "\$got" = reached ] || [ \$i -ge 3 ] && break; fi
    sleep 1
  done
  echo "\${target}: \${got} after \${i} tries (\${out:-200 OK})"
  [ "\$got" = "${expect}" ] || fail=1
done
exit \$fail
SH
}

# probe NS POD LABELS EXPECT HOST:PORT...: run probe_script in a restricted busybox pod of NS.
probe() {
  local ns="$1" pod="$2" labels="$3" expect="$4" overrides
  shift 4
  overrides="$(printf '{"metadata":{"labels":{%s}},"spec":{%s,"containers":[{"name":"%s","image":"%s","command":["sh","-c",%s],%s}]}}' \
    "$labels" "$RESTRICTED_POD" "$pod" "$BUSYBOX_IMAGE" "$(probe_script "$expect" "$@" | json_string)" "$RESTRICTED_CONTAINER")"
  run_pod "$ns" "$pod" "$BUSYBOX_IMAGE" "$overrides" 120
}

addon_verify() {
  need_cluster "$PIECE"
  local k
  for ((k = 1; k <= $(cluster_nodes); k++)); do
    running "$(node_proc kube-router "$k")" ||
      die "${PIECE}: kube-router does not run on $(node_name "$k") (log: ${LOG_DIR}/$(node_proc kube-router "$k").log)"
  done
  ensure_namespace "$VERIFY_NS"
  ensure_namespace "$VERIFY_PROFILE_NS"
  kubectl_ label --overwrite namespace "$VERIFY_PROFILE_NS" app.kubernetes.io/part-of=kubeflow-profile >/dev/null ||
    die "${PIECE}: cannot label namespace ${VERIFY_PROFILE_NS}"
  local out kfp='"pipelines.kubeflow.org/v2_component":"true"'
  out="$(probe "$VERIFY_NS" gpupipe-verify-netpol-out '"app":"gpupipe-verify"' refused mlflow.kubeflow:5000 seaweedfs.kubeflow:9000)" ||
    die "${PIECE}: a pod outside both policies was not refused: ${out}"
  say "$out"
  out="$(probe "$VERIFY_NS" gpupipe-verify-netpol-kfp-out "$kfp" refused mlflow.kubeflow:5000 seaweedfs.kubeflow:9000)" ||
    die "${PIECE}: a pod with KFP's label outside the pipeline namespaces was not refused: ${out}"
  say "$out"
  out="$(probe "$VERIFY_PROFILE_NS" gpupipe-verify-netpol-kfp "$kfp" reached mlflow.kubeflow:5000 seaweedfs.kubeflow:9000)" ||
    die "${PIECE}: a pod with KFP's label in a pipeline namespace did not reach MLflow and SeaweedFS (the positive control): ${out}"
  say "$out"
  kubectl_ delete namespace "$VERIFY_NS" "$VERIFY_PROFILE_NS" --wait=false >/dev/null 2>&1 || true
  say "outside the pipeline namespaces a pod is refused by MLflow and SeaweedFS, KFP's label or not; in one, a pod with the label reaches both"
}

case "${1:-}" in
verify) addon_verify ;;
flags) flags ;;
*) addon_main "$PIECE" "$@" ;;
esac
