#!/usr/bin/env bash
# Certificates and kubeconfigs of the test cluster, made once per cluster with openssl:
# a CA; etcd's serving and the API server's client certificate; the API server's serving
# certificate (the node address, the service IP, the kubernetes.default names); client
# certificates for the admin (system:masters), the controller manager, the scheduler, the node
# (system:node:<name>, as the Node authorizer expects), kube-proxy, kube-router and the API
# server's calls to the kubelet; the kubelet's serving certificate; the service-account signing
# key pair.
# Usage: hack/cluster/pki.sh NODE_NAME NODE_IP (node 1; nodes 2..N as hack/cluster/nodes.sh names them)
set -euo pipefail
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

node_name="$1"
node_ip="$2"
api_ip="$(python3 -c "import ipaddress,sys; print(next(ipaddress.ip_network(sys.argv[1]).hosts()))" "${SERVICE_CIDR}")"

mkdir -p "$PKI"
umask 077
cd "$PKI"

if [[ ! -f ca.crt ]]; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
    -subj "/CN=gpupipe-cluster-ca" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
fi

# cert NAME SUBJECT USAGE [SAN]: a key and a certificate signed by the CA, unless both exist.
cert() {
  local name="$1" subject="$2" usage="$3" san="${4:-}" ext
  [[ -f "${name}.crt" && -f "${name}.key" ]] && return 0
  ext="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=${usage}"
  [[ -n "$san" ]] && ext+="
subjectAltName=${san}"
  openssl req -newkey rsa:2048 -nodes -keyout "${name}.key" -out "${name}.csr" -subj "$subject" 2>/dev/null
  openssl x509 -req -in "${name}.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile <(printf '%s\n' "$ext") -out "${name}.crt" 2>/dev/null
  rm -f "${name}.csr"
}

cert etcd "/CN=etcd" serverAuth,clientAuth "IP:127.0.0.1,DNS:localhost"
cert apiserver-etcd-client "/CN=kube-apiserver-etcd-client" clientAuth
cert apiserver "/CN=kube-apiserver" serverAuth \
  "IP:127.0.0.1,IP:${node_ip},IP:${api_ip},DNS:localhost,DNS:${node_name},DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
cert admin "/O=system:masters/CN=gpupipe-admin" clientAuth
cert controller-manager "/CN=system:kube-controller-manager" clientAuth
cert scheduler "/CN=system:kube-scheduler" clientAuth
cert kube-proxy "/CN=system:kube-proxy" clientAuth
# kube-router's policy controller (hack/cluster/addons/network-policy.sh binds its ClusterRole).
cert kube-router "/CN=gpupipe:kube-router" clientAuth
cert node "/O=system:nodes/CN=system:node:${node_name}" clientAuth
cert kubelet "/CN=${node_name}" serverAuth "IP:${node_ip},IP:127.0.0.1,DNS:${node_name}"
[[ -f sa.key ]] || openssl genrsa -out sa.key 2048 2>/dev/null
[[ -f sa.pub ]] || openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null

# kubeconfig NAME USER_CERT: a kubeconfig for the API server on the node's address.
kubeconfig() {
  local file="$1" user="$2"
  [[ -f "$file" ]] && return 0
  cat >"$file" <<KC
apiVersion: v1
kind: Config
clusters:
  - name: gpupipe
    cluster:
      server: https://${node_ip}:6443
      certificate-authority: ${PKI}/ca.crt
users:
  - name: ${user}
    user:
      client-certificate: ${PKI}/${user}.crt
      client-key: ${PKI}/${user}.key
contexts:
  - name: gpupipe
    context: {cluster: gpupipe, user: ${user}}
current-context: gpupipe
KC
}
kubeconfig "${KUBECONFIG_ADMIN}" admin
for who in controller-manager scheduler kube-proxy kube-router node; do
  kubeconfig "${PKI}/${who}.kubeconfig" "$who"
done
# Nodes 2..N (hack/cluster/nodes.sh): each its own node identity and kubelet serving certificate.
for ((k = 2; k <= $(cluster_nodes); k++)); do
  name="$(node_name "$k")" addr="$(node_addr "$k")"
  cert "node-${k}" "/O=system:nodes/CN=system:node:${name}" clientAuth
  cert "kubelet-${k}" "/CN=${name}" serverAuth "IP:${addr},IP:127.0.0.1,DNS:${name}"
  kubeconfig "${PKI}/node-${k}.kubeconfig" "node-${k}"
done
