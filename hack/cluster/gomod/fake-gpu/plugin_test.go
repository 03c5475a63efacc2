package main

// The plugin through the kubelet API's own generated gRPC clients, on real unix sockets under a
// temporary kubelet root folder. A fake kubelet does what the kubelet's plugin watcher and device
// manager do with a socket in <root>/plugins_registry: GetInfo, dial the Endpoint it names,
// GetDevicePluginOptions, ListAndWatch (the stream held open), NotifyRegistrationStatus; a
// kubelet that stops closes its connections, one that starts again scans the folder again. Run
// from tests/unit/test_cluster_gpu.py (go test ./...).

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// TestMain runs main() itself when the test binary is started as the plugin (the SIGTERM test).
func TestMain(m *testing.M) {
	if os.Getenv("FAKE_GPU_RUN_MAIN") == "1" {
		os.Args = append([]string{"fake-gpu"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// syncBuffer is a log sink the test reads while the plugin writes.
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

// eventually waits (10 s at most) until check passes; the plugin's log on failure.
func eventually(t *testing.T, logs *syncBuffer, what string, check func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !check(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s; the plugin's log:\n%s", what, logs)
		}
	}
}

func logSays(t *testing.T, logs *syncBuffer, check func(string) bool) {
	t.Helper()
	eventually(t, logs, "the log", func() bool { return check(logs.String()) })
}

// rootDir is a short temporary kubelet root folder (a unix socket's path has at most 107 bytes).
func rootDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fake-gpu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func testConfig(root string) config {
	return config{rootDir: root, count: 3, resource: "nvidia.com/gpu", product: "test-gpu", node: "node-a"}
}

// longGrace: the plugin never makes its registration socket anew during the test.
var longGrace = timing{poll: 20 * time.Millisecond, grace: time.Hour}

// startPlugin runs the plugin until the test ends; its log and the channel run's result lands on.
func startPlugin(t *testing.T, cfg config, tm timing) (context.CancelFunc, *syncBuffer, chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, log.New(logs, "", 0), tm) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return cancel, logs, done
}

func dial(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// registered is a fake kubelet's hold on the plugin: what GetInfo said, the device-plugin
// client, the devices of the first ListAndWatch response, the stream held open.
type registered struct {
	info    *registration.PluginInfo
	client  api.DevicePluginClient
	stream  api.DevicePlugin_ListAndWatchClient
	devices []*api.Device
	stop    func() // the kubelet stops: its connections close
}

// register is what the kubelet does with the plugin's socket in <root>/plugins_registry
// (pkg/kubelet/pluginmanager/operationexecutor: GetInfo, the device manager's handler dials the
// Endpoint as given, GetDevicePluginOptions, ListAndWatch, then NotifyRegistrationStatus). The
// registry must hold one socket, the plugin's.
func register(t *testing.T, root string, logs *syncBuffer) *registered {
	t.Helper()
	sock := filepath.Join(root, RegistryDir, RegistrationSocketName)
	eventually(t, logs, "the registration socket", func() bool { _, ok := idOf(sock); return ok })
	entries, err := os.ReadDir(filepath.Join(root, RegistryDir))
	if err != nil || len(entries) != 1 || entries[0].Name() != RegistrationSocketName {
		t.Fatalf("plugins_registry holds %v (%v), want only %s", entries, err, RegistrationSocketName)
	}
	regConn := dial(t, sock)
	defer regConn.Close() // the kubelet's operation generator closes it when registered
	reg := registration.NewRegistrationClient(regConn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Waiting for the socket to answer, as the kubelet's blocking dial does (10 s): the path may
	// still hold a killed plugin's stale socket that the plugin is about to replace.
	info, err := reg.GetInfo(ctx, &registration.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	devConn := dial(t, info.Endpoint)
	client := api.NewDevicePluginClient(devConn)
	if _, err := client.GetDevicePluginOptions(ctx, &api.Empty{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("GetDevicePluginOptions at %s: %v", info.Endpoint, err)
	}
	streamCtx, stopStream := context.WithCancel(context.Background())
	stream, err := client.ListAndWatch(streamCtx, &api.Empty{})
	if err != nil {
		t.Fatalf("ListAndWatch: %v", err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("ListAndWatch's first response: %v", err)
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registration.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatalf("NotifyRegistrationStatus: %v", err)
	}
	r := &registered{info: info, client: client, stream: stream, devices: resp.Devices}
	var once sync.Once
	r.stop = func() { once.Do(func() { stopStream(); devConn.Close() }) }
	t.Cleanup(r.stop)
	return r
}

var idShape = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func TestDeviceIDsAreUUIDShapedStablePerNodeAndIndexAndDistinct(t *testing.T) {
	seen := map[string]bool{}
	for _, node := range []string{"gpupipe-node", "gpupipe-node-2"} {
		for i := 0; i < 8; i++ {
			id := deviceID(node, i)
			if !idShape.MatchString(id) || id != deviceID(node, i) || seen[id] {
				t.Fatalf("device %d of %s: %q (shape, stable, distinct)", i, node, id)
			}
			seen[id] = true
		}
	}
	// The recipe docs and tests/cluster/test_gpu_nodes.py recompute.
	if got := deviceID("gpupipe-node-3", 0); got != "GPU-7da6ef9f-94d1-f9dc-7320-976927d47559" {
		t.Fatalf("deviceID(gpupipe-node-3, 0) = %s", got)
	}
}

func TestRegistersThroughThePluginWatcherServesTheDevicesAndAllocatesAsNvidiasPluginDoes(t *testing.T) {
	root := rootDir(t)
	_, logs, _ := startPlugin(t, testConfig(root), longGrace)
	r := register(t, root, logs)

	info := r.info
	endpoint := filepath.Join(root, "plugins", "gpupipe-fake-gpu", "dp.sock")
	if info.Type != registration.DevicePlugin || info.Name != "nvidia.com/gpu" || info.Endpoint != endpoint ||
		len(info.SupportedVersions) != 1 || info.SupportedVersions[0] != "v1beta1" {
		t.Fatalf("GetInfo: %v; want DevicePlugin nvidia.com/gpu at %s, versions [v1beta1]", info, endpoint)
	}
	// Only the plugin watcher's path: nothing in a device-plugins folder, no kubelet.sock dialled.
	if _, err := os.Stat(filepath.Join(root, "device-plugins")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a device-plugins folder under the root: %v", err)
	}
	logSays(t, logs, func(l string) bool {
		return strings.Contains(l, "the kubelet registered nvidia.com/gpu (it dials "+endpoint+")")
	})

	client := r.client
	ctx := context.Background()
	opts, err := client.GetDevicePluginOptions(ctx, &api.Empty{})
	if err != nil || opts.PreStartRequired || opts.GetPreferredAllocationAvailable {
		t.Fatalf("GetDevicePluginOptions: %v, %v (neither PreStartContainer nor GetPreferredAllocation)", opts, err)
	}
	devices := r.devices
	if len(devices) != 3 {
		t.Fatalf("ListAndWatch: %d devices, want 3", len(devices))
	}
	for i, d := range devices {
		if d.ID != deviceID("node-a", i) || d.Health != api.Healthy {
			t.Fatalf("device %d: %v", i, d)
		}
	}

	resp, err := client.Allocate(ctx, &api.AllocateRequest{ContainerRequests: []*api.ContainerAllocateRequest{
		{DevicesIds: []string{devices[1].ID}},
		{DevicesIds: []string{devices[0].ID, devices[2].ID}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{devices[1].ID, devices[0].ID + "," + devices[2].ID}
	if len(resp.ContainerResponses) != 2 {
		t.Fatalf("%d container responses, want 2", len(resp.ContainerResponses))
	}
	for i, c := range resp.ContainerResponses {
		if c.Envs[EnvVisibleDevices] != want[i] || c.Envs[EnvFake] != "1" || len(c.Envs) != 2 {
			t.Fatalf("container %d: env %v, want %s=%s and %s=1", i, c.Envs, EnvVisibleDevices, want[i], EnvFake)
		}
		if len(c.Devices) != 0 || len(c.Mounts) != 0 || len(c.CdiDevices) != 0 || len(c.Annotations) != 0 {
			t.Fatalf("container %d: no device nodes, mounts, CDI devices or annotations, got %v", i, c)
		}
	}

	_, err = client.Allocate(ctx, &api.AllocateRequest{ContainerRequests: []*api.ContainerAllocateRequest{
		{DevicesIds: []string{"GPU-not-ours"}},
	}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "GPU-not-ours") {
		t.Fatalf("Allocate of an unknown device: %v", err)
	}
	if _, err := client.PreStartContainer(ctx, &api.PreStartContainerRequest{}); err != nil {
		t.Fatalf("PreStartContainer: %v", err)
	}
	_, err = client.GetPreferredAllocation(ctx, &api.PreferredAllocationRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("GetPreferredAllocation: %v, want Unimplemented", err)
	}
}

func TestAKubeletThatStartsAgainFindsThePluginWhereItWas(t *testing.T) {
	root := rootDir(t)
	_, logs, _ := startPlugin(t, testConfig(root), longGrace)
	sock := filepath.Join(root, RegistryDir, RegistrationSocketName)
	first := register(t, root, logs)
	before, _ := idOf(sock)

	for i := 0; i < 3; i++ {
		// The kubelet stops (or is killed): its connections close, its stream ends.
		first.stop()
		logSays(t, logs, func(l string) bool { return strings.Count(l, "the kubelet ended the stream") == i+1 })
		// It starts again: its watcher scans plugins_registry and registers what it finds there.
		again := register(t, root, logs)
		if again.info.Endpoint != first.info.Endpoint || len(again.devices) != 3 || again.devices[2].ID != first.devices[2].ID {
			t.Fatalf("after the restart: %v %v; before: %v %v (the same IDs: the kubelet's checkpoint stays true)",
				again.info, again.devices, first.info, first.devices)
		}
		resp, err := again.client.Allocate(context.Background(), &api.AllocateRequest{
			ContainerRequests: []*api.ContainerAllocateRequest{{DevicesIds: []string{again.devices[0].ID}}},
		})
		if err != nil || resp.ContainerResponses[0].Envs[EnvVisibleDevices] != again.devices[0].ID {
			t.Fatalf("Allocate after the restart: %v, %v", resp, err)
		}
		first = again
	}
	// The socket stayed put: the plugin had nothing to do.
	if after, ok := idOf(sock); !ok || after != before {
		t.Fatalf("the registration socket was made anew (%v -> %v): it should stay put", before, after)
	}
	if strings.Contains(logs.String(), "anew") {
		t.Fatalf("log:\n%s", logs)
	}
}

func TestMakesItsRegistrationSocketAnewWhileNoKubeletListsTheDevices(t *testing.T) {
	root := rootDir(t)
	grace := 150 * time.Millisecond
	_, logs, _ := startPlugin(t, testConfig(root), timing{poll: 10 * time.Millisecond, grace: grace})
	sock := filepath.Join(root, RegistryDir, RegistrationSocketName)
	logSays(t, logs, func(l string) bool { return strings.Contains(l, "announced at "+sock) })
	made, _ := idOf(sock)

	// No kubelet: made anew every grace, said once.
	for i := 0; i < 2; i++ {
		eventually(t, logs, "a new registration socket", func() bool { id, ok := idOf(sock); return ok && id != made })
		made, _ = idOf(sock)
	}
	if n := strings.Count(logs.String(), "no kubelet has listed the devices"); n != 1 {
		t.Fatalf("%d lines about it, want 1:\n%s", n, logs)
	}

	// A kubelet lists the devices: the socket stays put while the stream is open.
	r := register(t, root, logs)
	kept, _ := idOf(sock)
	time.Sleep(4 * grace)
	if now, _ := idOf(sock); now != kept {
		t.Fatal("the registration socket was made anew while a kubelet held a ListAndWatch stream")
	}

	// The kubelet goes and does not come back: anew again, and said again (once).
	r.stop()
	eventually(t, logs, "a new registration socket", func() bool { id, ok := idOf(sock); return ok && id != kept })
	logSays(t, logs, func(l string) bool { return strings.Count(l, "no kubelet has listed the devices") == 2 })

	// A kubelet that refuses the plugin (as its device manager does when it cannot dial the
	// endpoint): said in the log, and the socket made anew after grace, so that it tries again.
	conn := dial(t, sock)
	defer conn.Close()
	refused, _ := idOf(sock)
	if _, err := registration.NewRegistrationClient(conn).NotifyRegistrationStatus(context.Background(),
		&registration.RegistrationStatus{PluginRegistered: false, Error: "RegisterPlugin error -- dial failed"}); err != nil {
		t.Fatal(err)
	}
	logSays(t, logs, func(l string) bool {
		return strings.Contains(l, "the kubelet refused the registration of nvidia.com/gpu: RegisterPlugin error -- dial failed")
	})
	eventually(t, logs, "a new registration socket", func() bool { id, ok := idOf(sock); return ok && id != refused })
	register(t, root, logs)
}

func TestASocketRemovedOrReplacedIsServedAnew(t *testing.T) {
	root := rootDir(t)
	cfg := testConfig(root)
	_, logs, _ := startPlugin(t, cfg, longGrace)
	first := register(t, root, logs)
	for i, path := range []string{cfg.deviceSocket(), cfg.registrationSocket()} {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		logSays(t, logs, func(l string) bool { return strings.Count(l, "was removed or replaced: serving anew") == i+1 })
		// The old server's stream ended; the kubelet registers the new socket.
		if _, err := first.stream.Recv(); err == nil {
			t.Fatal("the old ListAndWatch stream is still open")
		}
		first.stop()
		first = register(t, root, logs)
	}
	// Something else at the device socket's path (not a socket): served anew too.
	if err := os.Remove(cfg.deviceSocket()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.deviceSocket(), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	logSays(t, logs, func(l string) bool { return strings.Count(l, "serving anew") == 3 })
	first.stop()
	register(t, root, logs)
}

func TestStaleSocketsOfAKilledPluginAreServedAnew(t *testing.T) {
	root := rootDir(t)
	cfg := testConfig(root)
	for _, path := range []string{cfg.registrationSocket(), cfg.deviceSocket()} {
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
	}
	_, logs, _ := startPlugin(t, cfg, longGrace)
	if r := register(t, root, logs); len(r.devices) != 3 {
		t.Fatalf("%d devices", len(r.devices))
	}
}

func TestStopsOnSigtermAndRemovesItsSockets(t *testing.T) {
	root := rootDir(t)
	cmd := exec.Command(os.Args[0], "-kubelet-root-dir", root, "-count", "2", "-node", "node-b")
	cmd.Env = append(os.Environ(), "FAKE_GPU_RUN_MAIN=1")
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := register(t, root, &out)
	if len(r.devices) != 2 {
		t.Fatalf("%d devices, want 2", len(r.devices))
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, out.String())
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("still running 10 s after SIGTERM:\n%s", out.String())
	}
	// The kubelet's stream ended; the sockets and the plugin's folder are gone, the kubelet's
	// folders stay.
	if _, err := r.stream.Recv(); err == nil {
		t.Fatal("the ListAndWatch stream is still open after SIGTERM")
	}
	for _, gone := range []string{
		filepath.Join(root, RegistryDir, RegistrationSocketName),
		filepath.Join(root, PluginsDir, PluginName, DeviceSocketName),
		filepath.Join(root, PluginsDir, PluginName),
	} {
		if _, err := os.Lstat(gone); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after SIGTERM: %v", gone, err)
		}
	}
	for _, kept := range []string{RegistryDir, PluginsDir} {
		if info, err := os.Stat(filepath.Join(root, kept)); err != nil || !info.IsDir() {
			t.Errorf("the kubelet's %s after SIGTERM: %v", kept, err)
		}
	}
	if !strings.Contains(out.String(), "terminated: stopping") || !strings.Contains(out.String(), "stopped; removed "+filepath.Join(root, RegistryDir, RegistrationSocketName)) {
		t.Fatalf("log:\n%s", out.String())
	}
}

func TestBadFlagsAreOneLineNamingTheFlag(t *testing.T) {
	root := rootDir(t)
	for args, says := range map[string]string{
		"-count 0":                    "-count must be from 1 to 64, got 0",
		"-count 65":                   "-count must be from 1 to 64",
		"-resource gpu":               "-resource must be an extended resource",
		"-resource kubernetes.io/gpu": "-resource must be an extended resource",
		"-product H100/80GB":          "-product must be a label value",
		"-node ":                      "-node must name the node",
		"extra":                       `unexpected argument "extra"`,
		"-device-plugins-dir /tmp":    "flag provided but not defined: -device-plugins-dir",
	} {
		_, err := parseConfig(append(strings.Fields(args), "-kubelet-root-dir", root), io.Discard)
		if args == "-node " {
			_, err = parseConfig([]string{"-kubelet-root-dir", root, "-node", ""}, io.Discard)
		}
		if err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v, want %q", args, err, says)
		}
	}
	long := filepath.Join(root, strings.Repeat("x", 80))
	if err := os.Mkdir(long, 0o700); err != nil {
		t.Fatal(err)
	}
	for d, says := range map[string]string{
		"":                                  "must be an absolute path",
		"relative/dir":                      "must be an absolute path",
		root + "/":                          "in canonical form",
		root + "/../" + filepath.Base(root): "in canonical form",
		filepath.Join(root, "missing"):      "is not a folder",
		long:                                "is too long",
	} {
		if _, err := parseConfig([]string{"-kubelet-root-dir", d}, io.Discard); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("-kubelet-root-dir %q: %v, want %q", d, err, says)
		}
	}
	cfg, err := parseConfig([]string{"-kubelet-root-dir", root}, io.Discard)
	if err != nil || cfg.count != 2 || cfg.resource != "nvidia.com/gpu" {
		t.Errorf("defaults: %+v, %v (2 devices of nvidia.com/gpu)", cfg, err)
	}
	if cfg.registrationSocket() != root+"/plugins_registry/gpupipe-fake-gpu-reg.sock" ||
		cfg.deviceSocket() != root+"/plugins/gpupipe-fake-gpu/dp.sock" {
		t.Errorf("sockets: %s, %s", cfg.registrationSocket(), cfg.deviceSocket())
	}
	// -print-ids needs no kubelet.
	if _, err := parseConfig([]string{"-print-ids", "-node", "n"}, io.Discard); err != nil {
		t.Errorf("-print-ids: %v", err)
	}
}
