#!/usr/bin/env bash
# Build the cluster's binaries from the Go module proxy, each into the cache folder named by its
# version (hack/cluster/versions.env); a binary already there is not built again.
#   Kubernetes: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl
#   etcd (server and etcdctl), CoreDNS (the plugins a cluster's Corefile uses)
# Usage: hack/cluster/build.sh [kubernetes|etcd|coredns ...]   (default: all of them)
set -euo pipefail
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

command -v go >/dev/null 2>&1 || cannot "Go is not installed: the cluster is built from Go modules"

# go_build NAME VERSION MODULE_DIR PACKAGE OUTPUT [LDFLAGS]; CGO_ENABLED=0 in the environment
# makes a static binary (for FROM-scratch images).
go_build() {
  local name="$1" version="$2" moddir="$3" pkg="$4" out="$5" ldflags="${6:-}"
  local dir="${BIN_DIR}/${name}-${version}"
  [[ -x "${dir}/${out}" ]] && return 0
  mkdir -p "$dir"
  say "go build ${pkg} -> ${dir}/${out}"
  (cd "${CLUSTER_HACK}/gomod/${moddir}" &&
    go_ build -o "${dir}/${out}.tmp" -ldflags "-s -w ${ldflags}" "$pkg") ||
    cannot "building ${name} ${version} from the Go module proxy failed (is the proxy reachable? go env GOPROXY)"
  mv "${dir}/${out}.tmp" "${dir}/${out}"
}

build_kubernetes() {
  local v="${K8S_VERSION}" minor cmd
  minor="$(cut -d. -f2 <<<"$v")"
  # Without the stamp the binaries say v0.0.0 and kubectl warns about version skew.
  local ld="-X k8s.io/component-base/version.gitVersion=v${v}"
  ld+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
  ld+=" -X k8s.io/client-go/pkg/version.gitVersion=v${v}"
  ld+=" -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=${minor}"
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
    go_build kubernetes "$v" kubernetes "k8s.io/kubernetes/cmd/${cmd}" "$cmd" "$ld"
  done
}

build_etcd() {
  go_build etcd "${ETCD_VERSION}" etcd go.etcd.io/etcd/server/v3 etcd
  go_build etcd "${ETCD_VERSION}" etcd go.etcd.io/etcd/etcdctl/v3 etcdctl
}

build_coredns() {
  # Runs in the cluster from a FROM-scratch image: static.
  CGO_ENABLED=0 go_build coredns "${COREDNS_VERSION}" coredns . coredns
}

targets=("$@")
((${#targets[@]})) || targets=(kubernetes etcd coredns)
for t in "${targets[@]}"; do
  case "$t" in
  kubernetes | etcd | coredns) "build_${t}" ;;
  *) die "unknown build target '${t}' (kubernetes, etcd, coredns)" ;;
  esac
done
