// Package kubeletcheck runs the fake GPU plugin's binary against the kubelet's own device-manager
// code (k8s.io/kubernetes v1.34.4, pkg/kubelet/cm/devicemanager): the registration server a
// kubelet serves on kubelet.sock, the client it dials a registered plugin with (ListAndWatch,
// Allocate), and the cleanup of the device-plugins folder it does at start. What stands in for
// the rest of the kubelet is a handler that records what the device manager would be told.
package kubeletcheck

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	dp "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
)

// handler is the device manager's side: the cleanup is the real ManagerImpl's.
type handler struct {
	mu        sync.Mutex
	connected []dp.DevicePlugin
	lists     []*api.ListAndWatchResponse
}

func (h *handler) CleanupPluginDirectory(dir string) error {
	return (&devicemanager.ManagerImpl{}).CleanupPluginDirectory(dir)
}

func (h *handler) PluginConnected(_ string, p dp.DevicePlugin) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.connected = append(h.connected, p)
	return nil
}

func (h *handler) PluginDisconnected(string) {}

func (h *handler) PluginListAndWatchReceiver(_ string, r *api.ListAndWatchResponse) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lists = append(h.lists, r)
}

// syncBuffer is the plugin's log, written by exec's copier while the test may read it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitLists waits until the kubelet side has had n device lists; the newest, and the plugin it
// came through.
func (h *handler) waitLists(t *testing.T, n int, log *syncBuffer) (*api.ListAndWatchResponse, dp.DevicePlugin) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		h.mu.Lock()
		if len(h.lists) >= n {
			defer h.mu.Unlock()
			return h.lists[len(h.lists)-1], h.connected[len(h.connected)-1]
		}
		h.mu.Unlock()
	}
	t.Fatalf("the kubelet side had no %d device lists within 20 s; the plugin's log:\n%s", n, log)
	return nil, nil
}

// kubelet starts a registration server on <dir>/kubelet.sock as a starting kubelet does
// (Start: the folder's sockets removed, then kubelet.sock made).
func kubelet(t *testing.T, dir string, h *handler) dp.Server {
	t.Helper()
	srv, err := dp.NewServer(filepath.Join(dir, "kubelet.sock"), h, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	return srv
}

var idShape = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func allocate(t *testing.T, p dp.DevicePlugin, id string) map[string]string {
	t.Helper()
	resp, err := p.API().Allocate(context.Background(), &api.AllocateRequest{
		ContainerRequests: []*api.ContainerAllocateRequest{{DevicesIds: []string{id}}},
	})
	if err != nil {
		t.Fatalf("Allocate(%s): %v", id, err)
	}
	return resp.ContainerResponses[0].Envs
}

func TestThePluginWithTheKubeletsOwnDeviceManager(t *testing.T) {
	work := t.TempDir()
	bin := filepath.Join(work, "fake-gpu")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of the plugin: %v\n%s", err, out)
	}
	dir, err := os.MkdirTemp("", "fake-gpu") // short: a socket's path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	h := &handler{}
	srv := kubelet(t, dir, h)

	var log syncBuffer
	plugin := exec.Command(bin, "--device-plugins-dir", dir, "--count", "2", "--node", "gpupipe-node-2")
	plugin.Stdout, plugin.Stderr = &log, &log
	if err := plugin.Start(); err != nil {
		t.Fatal(err)
	}
	defer plugin.Process.Kill()

	list, p := h.waitLists(t, 1, &log)
	if len(list.Devices) != 2 {
		t.Fatalf("the kubelet got %d devices, want 2", len(list.Devices))
	}
	for _, d := range list.Devices {
		if !idShape.MatchString(d.ID) || d.Health != api.Healthy {
			t.Fatalf("device %v: a GPU-<uuid> ID, Healthy", d)
		}
	}
	id := list.Devices[1].ID
	env := allocate(t, p, id)
	if env["NVIDIA_VISIBLE_DEVICES"] != id || env["GPUPIPE_FAKE_GPU"] != "1" {
		t.Fatalf("Allocate's env: %v", env)
	}

	// The kubelet stops and starts again (hack/cluster-node.sh, a changed kubelet config): its
	// start removes the plugin's socket and makes a new kubelet.sock.
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	srv = kubelet(t, dir, h)
	list, p = h.waitLists(t, 2, &log)
	if list.Devices[1].ID != id || allocate(t, p, id)["NVIDIA_VISIBLE_DEVICES"] != id {
		t.Fatalf("after the kubelet's restart: %v (the same devices, allocatable)", list.Devices)
	}

	// A kubelet killed (its registration server never stopped) and started again.
	killed := srv
	srv = kubelet(t, dir, h)
	list, p = h.waitLists(t, 3, &log)
	if allocate(t, p, id)["GPUPIPE_FAKE_GPU"] != "1" || len(list.Devices) != 2 {
		t.Fatalf("after a killed kubelet's restart: %v", list.Devices)
	}
	_ = killed.Stop()

	if err := plugin.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := plugin.Wait(); err != nil {
		t.Fatalf("the plugin's exit after SIGTERM: %v\n%s", err, &log)
	}
	if _, err := os.Stat(filepath.Join(dir, "gpupipe-fake-gpu.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("its socket after SIGTERM: %v", err)
	}
	if n := strings.Count(log.String(), "registered nvidia.com/gpu"); n != 3 {
		t.Fatalf("%d registrations, want 3 (one per kubelet start):\n%s", n, &log)
	}
	_ = srv.Stop()
}
