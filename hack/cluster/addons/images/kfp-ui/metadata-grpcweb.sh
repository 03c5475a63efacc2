#!/bin/sh
# ML Metadata's grpc-web proxy in the test cluster (hack/cluster/addons/kfp-ui.sh), in Envoy's place
# in upstream's metadata-envoy-deployment, which starts its image with one argument: the Envoy
# config of ConfigMap metadata-envoy-configmap. That config stays the one source of the addresses:
# this reads its listener's port and its `metadata-cluster` endpoint (upstream's layout of it:
# a flow-style socket_address on the listener, a block one on the cluster) and starts
# improbable-eng's grpcwebproxy there, in plain HTTP as Envoy serves it (grpc-web, grpc-web-text
# and CORS from any origin, as the config's cors policy allows).
set -eu
config="${1:-}"
[ -r "$config" ] || { echo "metadata-grpcweb: usage: metadata-grpcweb ENVOY_CONFIG (cannot read '${config}')" >&2; exit 2; }
# shellcheck disable=SC2046  # three words: port, host, port
set -- $(awk '
  function num(s) { sub(/.*port_value: */, "", s); sub(/[^0-9].*/, "", s); return s }
  /- name: listener_0/ { listener = 1 }
  listener && !listen && /port_value:/ { listen = num($0) }
  /- name: metadata-cluster/ { cluster = 1 }
  cluster && /socket_address:/ { socket = 1; next }
  socket && !host && /^ *address: *[^ ]/ { host = $0; sub(/^ *address: */, "", host) }
  socket && !port && /port_value:/ { port = num($0) }
  END { print listen, host, port }' "$config")
if [ $# -ne 3 ]; then
  echo "metadata-grpcweb: ${config} names no listener_0 port or no metadata-cluster address and port" >&2
  exit 2
fi
echo "metadata-grpcweb: grpc-web on :$1 -> gRPC $2:$3 (from ${config})"
exec grpcwebproxy --run_tls_server=false --server_http_debug_port="$1" \
  --backend_addr="$2:$3" --backend_tls=false --allow_all_origins
