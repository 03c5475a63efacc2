// Package kubeletcheck runs the fake GPU plugin's binary against the kubelet's own code of the
// cluster's release (k8s.io/kubernetes v1.34.4), wired as a kubelet wires it: its plugin manager
// (pkg/kubelet/pluginmanager: the watcher of <root-dir>/plugins_registry, the reconciler, the
// operation generator that calls GetInfo and NotifyRegistrationStatus) with the device manager's
// plugin handler for the type DevicePlugin (pkg/kubelet/cm/devicemanager/plugin/v1beta1's server:
// ManagerImpl.GetWatcherHandler returns it), which validates the plugin, dials its Endpoint and
// runs ListAndWatch; Allocate goes through the client it dialled.
//
// What stands in for the rest of the kubelet is the handler below, the device manager's side
// (ManagerImpl's PluginConnected, PluginListAndWatchReceiver, PluginDisconnected): it counts the
// healthy devices, what the node's allocatable would show. Not the real ManagerImpl: its only
// constructor, NewManagerImpl, hard-codes /var/lib/kubelet/device-plugins (its kubelet.sock and
// its checkpoint), the folder the running test cluster's kubelets share on this host, and its
// Start removes every socket there; a test must not touch it. The device manager's old
// registration server is started too, on a temporary stand-in for that folder, as a kubelet
// starts it: the plugin must put nothing there.
package kubeletcheck

import (
	"bytes"
	"context"
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
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	dp "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

const resource = "nvidia.com/gpu"

// handler is the device manager's side of one kubelet's life.
type handler struct {
	mu        sync.Mutex
	plugin    dp.DevicePlugin // the one connected last
	healthy   int             // the allocatable nvidia.com/gpu
	lists     int
	connected int
}

// CleanupPluginDirectory: the real ManagerImpl's (the stand-in device-plugins folder's sockets).
func (h *handler) CleanupPluginDirectory(dir string) error {
	return (&devicemanager.ManagerImpl{}).CleanupPluginDirectory(dir)
}

// PluginConnected asks the plugin's options, as ManagerImpl.PluginConnected does.
func (h *handler) PluginConnected(name string, p dp.DevicePlugin) error {
	if _, err := p.API().GetDevicePluginOptions(context.Background(), &api.Empty{}); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.plugin = p
	h.connected++
	return nil
}

// PluginDisconnected: the resource's devices go unhealthy (ManagerImpl.markResourceUnhealthy).
func (h *handler) PluginDisconnected(string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.healthy = 0
}

func (h *handler) PluginListAndWatchReceiver(_ string, r *api.ListAndWatchResponse) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lists++
	h.healthy = 0
	for _, d := range r.Devices {
		if d.Health == api.Healthy {
			h.healthy++
		}
	}
}

func (h *handler) allocatable() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.healthy
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

// kubelet is one life of a node's kubelet: its device manager's registration server (on the
// stand-in folder) and its plugin manager on <root>/plugins_registry.
type kubelet struct {
	h    *handler
	srv  dp.Server
	stop chan struct{}
}

func startKubelet(t *testing.T, root, devicePlugins string) *kubelet {
	t.Helper()
	k := &kubelet{h: &handler{}, stop: make(chan struct{})}
	var err error
	if k.srv, err = dp.NewServer(filepath.Join(devicePlugins, "kubelet.sock"), k.h, k.h); err != nil {
		t.Fatal(err)
	}
	if err := k.srv.Start(); err != nil {
		t.Fatal(err)
	}
	pm := pluginmanager.NewPluginManager(filepath.Join(root, "plugins_registry"), nil)
	pm.AddHandler(registration.DevicePlugin, k.srv)
	go pm.Run(nil, k.stop)
	return k
}

// shutdown: the plugin manager stops and the device manager's connections close, as when the
// kubelet's process ends.
func (k *kubelet) shutdown(t *testing.T) {
	t.Helper()
	close(k.stop)
	if err := k.srv.Stop(); err != nil {
		t.Fatal(err)
	}
}

// waitAllocatable waits until the kubelet has n healthy devices; how long it took.
func (k *kubelet) waitAllocatable(t *testing.T, n int, within time.Duration, log *syncBuffer) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		if k.h.allocatable() == n {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the kubelet's allocatable %s is %d, not %d, after %s; the plugin's log:\n%s", resource, k.h.allocatable(), n, within, log)
	return 0
}

// settle waits until the kubelet has had n healthy devices for 3 s on end (a registration
// undone and done again after the first n, a flap to 0, is seen); how long until that streak
// began.
func (k *kubelet) settle(t *testing.T, n int, within time.Duration, log *syncBuffer) time.Duration {
	t.Helper()
	start := time.Now()
	var since time.Time
	for now := start; now.Sub(start) < within; now = time.Now() {
		switch {
		case k.h.allocatable() != n:
			since = time.Time{}
		case since.IsZero():
			since = now
		case now.Sub(since) >= 3*time.Second:
			return since.Sub(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the kubelet's allocatable %s was not %d for 3 s on end within %s (now %d); the plugin's log:\n%s", resource, n, within, k.h.allocatable(), log)
	return 0
}

// connected is the plugin the device manager connected last.
func (k *kubelet) connected() dp.DevicePlugin {
	k.h.mu.Lock()
	defer k.h.mu.Unlock()
	return k.h.plugin
}

var idShape = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// allocate asks the plugin the kubelet connected last for one device, as the device manager
// does on admitting a pod.
func (k *kubelet) allocate(t *testing.T, id string) map[string]string {
	t.Helper()
	resp, err := k.connected().API().Allocate(context.Background(), &api.AllocateRequest{
		ContainerRequests: []*api.ContainerAllocateRequest{{DevicesIds: []string{id}}},
	})
	if err != nil {
		t.Fatalf("Allocate(%s): %v", id, err)
	}
	return resp.ContainerResponses[0].Envs
}

func startPlugin(t *testing.T, bin, root string, log *syncBuffer) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, "--kubelet-root-dir", root, "--count", "2", "--node", "gpupipe-node-2")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	return cmd
}

func TestThePluginWithTheKubeletsOwnPluginManagerAndDeviceManager(t *testing.T) {
	work := t.TempDir()
	bin := filepath.Join(work, "fake-gpu")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of the plugin: %v\n%s", err, out)
	}
	tmp, err := os.MkdirTemp("", "fake-gpu") // short: a socket's path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "kubelet")                 // the node's --root-dir
	devicePlugins := filepath.Join(tmp, "device-plugins") // stands in for /var/lib/kubelet/device-plugins
	if err := os.MkdirAll(root, 0o750); err != nil {
		t.Fatal(err)
	}
	endpoint := filepath.Join(root, "plugins", "gpupipe-fake-gpu", "dp.sock")
	regSock := filepath.Join(root, "plugins_registry", "gpupipe-fake-gpu-reg.sock")

	k := startKubelet(t, root, devicePlugins)
	var log syncBuffer
	plugin := startPlugin(t, bin, root, &log)
	k.settle(t, 2, 30*time.Second, &log)
	if got := k.connected().SocketPath(); got != endpoint {
		t.Fatalf("the device manager dialled %s, want %s", got, endpoint)
	}
	// The IDs the plugin listed (--print-ids): one of them allocated, NVIDIA's variable and ours.
	out, err := exec.Command(bin, "--print-ids", "--count", "2", "--node", "gpupipe-node-2").Output()
	ids := strings.Fields(string(out))
	if err != nil || len(ids) != 2 || !idShape.MatchString(ids[1]) {
		t.Fatalf("--print-ids: %q, %v", out, err)
	}
	id := ids[1]
	if env := k.allocate(t, id); env["NVIDIA_VISIBLE_DEVICES"] != id || env["GPUPIPE_FAKE_GPU"] != "1" {
		t.Fatalf("Allocate's env: %v", env)
	}
	if !strings.Contains(log.String(), "the kubelet registered nvidia.com/gpu (it dials "+endpoint+")") {
		t.Fatalf("no NotifyRegistrationStatus(registered) in the log:\n%s", &log)
	}

	// The kubelet stops and starts again (hack/cluster-node.sh, a changed kubelet config): the
	// plugin's sockets stay put and the new kubelet's watcher finds them. Twice at once, then
	// once after 17 s away, past the plugin's 15 s without a ListAndWatch stream: it makes its
	// registration socket anew meanwhile, which the new kubelet finds as well.
	for i, away := range []time.Duration{0, 0, 17 * time.Second} {
		k.shutdown(t)
		k.waitAllocatable(t, 0, 10*time.Second, &log)
		time.Sleep(away)
		k = startKubelet(t, root, devicePlugins)
		took := k.settle(t, 2, 30*time.Second, &log)
		t.Logf("kubelet restart %d (%s away): 2 allocatable again after %s, and for 3 s on end", i+1, away, took.Round(time.Millisecond))
		if env := k.allocate(t, id); env["NVIDIA_VISIBLE_DEVICES"] != id {
			t.Fatalf("Allocate after the kubelet's restart: %v", env)
		}
		if anew := strings.Count(log.String(), "anew"); (away == 0) != (anew == 0) {
			t.Fatalf("after %s away, the plugin said 'anew' %d times:\n%s", away, anew, &log)
		}
	}

	// The plugin killed (SIGKILL: its sockets stay, stale) while the kubelet runs, then started
	// again: the kubelet deregisters the old socket and registers the new one at the same path.
	_ = plugin.Process.Kill()
	_, _ = plugin.Process.Wait()
	k.waitAllocatable(t, 0, 10*time.Second, &log)
	plugin = startPlugin(t, bin, root, &log)
	took := k.settle(t, 2, 60*time.Second, &log)
	t.Logf("plugin killed and started again: allocatable again after %s", took.Round(time.Millisecond))
	if env := k.allocate(t, id); env["GPUPIPE_FAKE_GPU"] != "1" {
		t.Fatalf("Allocate after the plugin's restart: %v", env)
	}

	// A node's power lost and back (hack/cluster-node.sh stop, start): kubelet and plugin killed,
	// the kubelet starts first and finds the plugin's stale socket (its registration fails and
	// is retried with a back-off), then gpu.sh install starts the plugin.
	_ = plugin.Process.Kill()
	_, _ = plugin.Process.Wait()
	k.shutdown(t)
	k = startKubelet(t, root, devicePlugins)
	time.Sleep(3 * time.Second)
	plugin = startPlugin(t, bin, root, &log)
	took = k.settle(t, 2, 90*time.Second, &log)
	t.Logf("kubelet started before the plugin (a stale socket): allocatable after %s", took.Round(time.Millisecond))

	// SIGTERM: the plugin removes its registration socket (the kubelet's watcher deregisters it),
	// stops, removes its device socket, and exits 0.
	if err := plugin.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := plugin.Wait(); err != nil {
		t.Fatalf("the plugin's exit after SIGTERM: %v\n%s", err, &log)
	}
	k.waitAllocatable(t, 0, 10*time.Second, &log)
	for _, gone := range []string{regSock, endpoint, filepath.Dir(endpoint)} {
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Errorf("%s after SIGTERM: %v", gone, err)
		}
	}
	// The device manager's old folder holds only its own kubelet.sock: the plugin used none of it.
	entries, err := os.ReadDir(devicePlugins)
	if err != nil || len(entries) != 1 || entries[0].Name() != "kubelet.sock" {
		t.Fatalf("the stand-in device-plugins folder holds %v (%v), want only kubelet.sock", entries, err)
	}
	k.shutdown(t)
}
