package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Env names what Allocate puts in a container's environment. NVIDIA's device plugin (its default
// "envvar" strategy) sets NVIDIA_VISIBLE_DEVICES to the allocated GPUs' UUIDs, and the NVIDIA
// container runtime reads it; here no runtime reads it, and GPUPIPE_FAKE_GPU says so to whoever
// looks (the trainer, a test).
const (
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	EnvFake           = "GPUPIPE_FAKE_GPU"
)

// deviceID is the ID of device i of node: "GPU-" and a UUID-shaped hex string, as NVIDIA's
// plugin names a GPU by its UUID. It is derived from the node's name and the index alone, so a
// restarted plugin advertises the same IDs and the kubelet's checkpoint of what it allocated
// stays true. A test may recompute it: the first 16 bytes of
// sha256("gpupipe-fake-gpu/<node>/<index>") in 8-4-4-4-12 groups.
func deviceID(node string, i int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("gpupipe-fake-gpu/%s/%d", node, i)))
	h := hex.EncodeToString(sum[:16])
	return fmt.Sprintf("GPU-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}

// plugin serves the kubelet's DevicePlugin API for count healthy devices that do not exist.
type plugin struct {
	api.UnimplementedDevicePluginServer // GetPreferredAllocation: options say it is not offered

	devices []*api.Device
	known   map[string]bool
	log     *log.Logger
	watch   *streams      // the kubelets' open ListAndWatch streams
	stop    chan struct{} // closed when the server stops: ListAndWatch streams end
}

func newPlugin(cfg config, logger *log.Logger, watch *streams) *plugin {
	p := &plugin{known: map[string]bool{}, log: logger, watch: watch, stop: make(chan struct{})}
	for i := 0; i < cfg.count; i++ {
		id := deviceID(cfg.node, i)
		p.devices = append(p.devices, &api.Device{ID: id, Health: api.Healthy})
		p.known[id] = true
	}
	return p
}

// options: no PreStartContainer call, no preferred allocation (any free devices will do).
func options() *api.DevicePluginOptions {
	return &api.DevicePluginOptions{PreStartRequired: false, GetPreferredAllocationAvailable: false}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return options(), nil
}

// ListAndWatch sends the devices once (they never change health) and holds the stream open
// until the kubelet ends it or the plugin stops.
func (p *plugin) ListAndWatch(_ *api.Empty, stream api.DevicePlugin_ListAndWatchServer) error {
	p.watch.opened()
	defer p.watch.closed()
	if err := stream.Send(&api.ListAndWatchResponse{Devices: p.devices}); err != nil {
		p.log.Printf("ListAndWatch: sending the devices failed: %v", err)
		return err
	}
	p.log.Printf("ListAndWatch: the kubelet has the %d devices, all healthy", len(p.devices))
	select {
	case <-stream.Context().Done():
		p.log.Printf("ListAndWatch: the kubelet ended the stream (it stopped, or deregistered the plugin)")
	case <-p.stop:
	}
	return nil
}

// Allocate gives each container the environment NVIDIA's plugin gives it, and nothing else: no
// device nodes, no mounts, no annotations.
func (p *plugin) Allocate(_ context.Context, req *api.AllocateRequest) (*api.AllocateResponse, error) {
	resp := &api.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		for _, id := range c.DevicesIds {
			if !p.known[id] {
				return nil, status.Errorf(codes.InvalidArgument, "unknown device %q (this plugin has %d)", id, len(p.devices))
			}
		}
		ids := strings.Join(c.DevicesIds, ",")
		p.log.Printf("Allocate: %s", ids)
		resp.ContainerResponses = append(resp.ContainerResponses, &api.ContainerAllocateResponse{
			Envs: map[string]string{EnvVisibleDevices: ids, EnvFake: "1"},
		})
	}
	return resp, nil
}

// PreStartContainer is never called (options say PreStartRequired: false); empty if it is.
func (p *plugin) PreStartContainer(context.Context, *api.PreStartContainerRequest) (*api.PreStartContainerResponse, error) {
	return &api.PreStartContainerResponse{}, nil
}
