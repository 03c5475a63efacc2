// The test cluster's device plugin for GPUs that are not there (main.go; hack/cluster/addons/gpu.sh
// builds it). k8s.io/kubelet is the release of the cluster's Kubernetes (versions.env's
// K8S_VERSION 1.34.4 -> v0.34.4; tests/unit/test_cluster_gpu.py holds them together). gRPC,
// protobuf and golang.org/x/net, x/sys, x/text are at the releases kube-router's wrapper module
// raises them to (hack/cluster/gomod/kube-router: past what govulncheck flagged there), not at
// the older ones kubelet v0.34.4 requires. Regenerate: go get k8s.io/kubelet@v0.34.4 and those
// releases, then go mod tidy.
module gpupipe.local/cluster/fake-gpu

go 1.26.0

require (
	google.golang.org/grpc v1.85.0
	k8s.io/kubelet v0.34.4
)

require (
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.44.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
