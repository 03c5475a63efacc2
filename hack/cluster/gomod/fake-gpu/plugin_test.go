package main

// The plugin through the kubelet's own generated gRPC client, on real unix sockets in a
// temporary device-plugins folder; a fake kubelet's Registration server records each Register
// call and, as a starting kubelet does, a "restart" removes every socket in the folder and makes
// a new kubelet.sock. Run from tests/unit/test_cluster_gpu.py (go test ./...).

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

// fakeKubelet is the kubelet's Registration service on <dir>/kubelet.sock.
type fakeKubelet struct {
	api.UnimplementedRegistrationServer
	srv      *grpc.Server
	requests chan *api.RegisterRequest
}

func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{srv: grpc.NewServer(), requests: make(chan *api.RegisterRequest, 10)}
	api.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(ln) }()
	t.Cleanup(k.srv.Stop)
	return k
}

func (k *fakeKubelet) Register(_ context.Context, r *api.RegisterRequest) (*api.Empty, error) {
	k.requests <- r
	return &api.Empty{}, nil
}

func (k *fakeKubelet) next(t *testing.T) *api.RegisterRequest {
	t.Helper()
	select {
	case r := <-k.requests:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no Register call within 10 s")
		return nil
	}
}

// restart is what a kubelet that stops and starts again does to the folder: its old server gone,
// every socket in it removed (CleanupPluginDirectory), a new kubelet.sock.
func (k *fakeKubelet) restart(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	k.srv.Stop()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type()&os.ModeSocket != 0 {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
	}
	return startKubelet(t, dir)
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

// logSays waits (10 s at most) until the log passes check: the plugin logs a registration
// after the fake kubelet has recorded it.
func logSays(t *testing.T, logs *syncBuffer, check func(string) bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !check(logs.String()); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("log:\n%s", logs)
		}
	}
}

// folder is a short temporary device-plugins folder (a unix socket's path has at most 107 bytes).
func folder(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fake-gpu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func testConfig(dir string) config {
	return config{dir: dir, count: 3, resource: "nvidia.com/gpu", product: "test-gpu", node: "node-a"}
}

// startPlugin runs the plugin until the test ends; its log and the channel run's result lands on.
func startPlugin(t *testing.T, cfg config) (context.CancelFunc, *syncBuffer, chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, log.New(logs, "", 0), 20*time.Millisecond) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return cancel, logs, done
}

func dialPlugin(t *testing.T, dir, endpoint string) api.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, endpoint),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return api.NewDevicePluginClient(conn)
}

func listed(t *testing.T, client api.DevicePluginClient) []*api.Device {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := client.ListAndWatch(ctx, &api.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return resp.Devices
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

func TestRegistersServesTheDevicesAndAllocatesAsNvidiasPluginDoes(t *testing.T) {
	dir := folder(t)
	kubelet := startKubelet(t, dir)
	cfg := testConfig(dir)
	startPlugin(t, cfg)

	req := kubelet.next(t)
	if req.Version != api.Version || req.ResourceName != "nvidia.com/gpu" || req.Endpoint != SocketName {
		t.Fatalf("Register(%v)", req)
	}
	if req.Options.PreStartRequired || req.Options.GetPreferredAllocationAvailable {
		t.Fatalf("options %v: neither PreStartContainer nor GetPreferredAllocation is offered", req.Options)
	}
	client := dialPlugin(t, dir, req.Endpoint)
	ctx := context.Background()

	opts, err := client.GetDevicePluginOptions(ctx, &api.Empty{})
	if err != nil || opts.PreStartRequired || opts.GetPreferredAllocationAvailable {
		t.Fatalf("GetDevicePluginOptions: %v, %v", opts, err)
	}
	devices := listed(t, client)
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
	for i, c := range resp.ContainerResponses {
		if c.Envs[EnvVisibleDevices] != want[i] || c.Envs[EnvFake] != "1" || len(c.Envs) != 2 {
			t.Fatalf("container %d: env %v, want %s=%s and %s=1", i, c.Envs, EnvVisibleDevices, want[i], EnvFake)
		}
		if len(c.Devices) != 0 || len(c.Mounts) != 0 || len(c.CdiDevices) != 0 || len(c.Annotations) != 0 {
			t.Fatalf("container %d: no device nodes, mounts, CDI devices or annotations, got %v", i, c)
		}
	}
	if len(resp.ContainerResponses) != 2 {
		t.Fatalf("%d container responses, want 2", len(resp.ContainerResponses))
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

func TestRegistersAgainWhenTheKubeletStartsAgain(t *testing.T) {
	dir := folder(t)
	kubelet := startKubelet(t, dir)
	_, logs, _ := startPlugin(t, testConfig(dir))
	first := kubelet.next(t)
	before := listed(t, dialPlugin(t, dir, first.Endpoint))
	logSays(t, logs, func(l string) bool { return strings.Contains(l, "registered nvidia.com/gpu") })

	kubelet = kubelet.restart(t, dir)
	again := kubelet.next(t)
	if again.Endpoint != first.Endpoint || again.ResourceName != first.ResourceName {
		t.Fatalf("second Register(%v), first was %v", again, first)
	}
	after := listed(t, dialPlugin(t, dir, again.Endpoint))
	if len(after) != len(before) || after[0].ID != before[0].ID {
		t.Fatalf("after the restart: %v, before: %v (the same IDs: the kubelet's checkpoint stays true)", after, before)
	}
	logSays(t, logs, func(l string) bool {
		return strings.Contains(l, "was removed") && strings.Count(l, "registered nvidia.com/gpu") == 2
	})

	// A kubelet that made a new kubelet.sock but left the plugin's socket: registered again too.
	kubelet.srv.Stop()
	if err := os.Remove(filepath.Join(dir, "kubelet.sock")); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	kubelet = startKubelet(t, dir)
	kubelet.next(t)
	logSays(t, logs, func(l string) bool {
		return strings.Contains(l, "is a new file (the kubelet started again): registering again") &&
			strings.Count(l, "registered nvidia.com/gpu") == 3
	})
}

func TestWaitsForAKubeletThatIsNotThereYetAndSaysSoOnce(t *testing.T) {
	dir := folder(t)
	// A kubelet.sock no one listens on (a killed kubelet's).
	ln, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	_, logs, _ := startPlugin(t, testConfig(dir))
	logSays(t, logs, func(l string) bool { return strings.Contains(l, "registering with") })
	time.Sleep(300 * time.Millisecond) // 15 more tries
	if n := strings.Count(logs.String(), "registering with"); n != 1 {
		t.Fatalf("%d lines about the failed registration (want 1, not one a try):\n%s", n, logs)
	}
	os.Remove(filepath.Join(dir, "kubelet.sock"))
	startKubelet(t, dir).next(t)
}

func TestAStaleSocketOfAKilledPluginIsServedAnew(t *testing.T) {
	dir := folder(t)
	ln, err := net.Listen("unix", filepath.Join(dir, SocketName))
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	kubelet := startKubelet(t, dir)
	startPlugin(t, testConfig(dir))
	r := kubelet.next(t)
	if len(listed(t, dialPlugin(t, dir, r.Endpoint))) != 3 {
		t.Fatal("the plugin does not serve on its socket")
	}
}

func TestStopsOnSigtermAndRemovesItsSocket(t *testing.T) {
	dir := folder(t)
	kubelet := startKubelet(t, dir)
	cmd := exec.Command(os.Args[0], "-device-plugins-dir", dir, "-count", "2", "-node", "node-b")
	cmd.Env = append(os.Environ(), "FAKE_GPU_RUN_MAIN=1")
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	kubelet.next(t)
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
	if _, err := os.Stat(filepath.Join(dir, SocketName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the socket is still there after SIGTERM (%v)", err)
	}
	if !strings.Contains(out.String(), "terminated: stopping") || !strings.Contains(out.String(), "removed "+filepath.Join(dir, SocketName)) {
		t.Fatalf("log:\n%s", out.String())
	}
}

func TestBadFlagsAreOneLineNamingTheFlag(t *testing.T) {
	dir := folder(t)
	for args, says := range map[string]string{
		"-count 0":                    "-count must be from 1 to 64, got 0",
		"-count 65":                   "-count must be from 1 to 64",
		"-resource gpu":               "-resource must be an extended resource",
		"-resource kubernetes.io/gpu": "-resource must be an extended resource",
		"-product H100/80GB":          "-product must be a label value",
		"-node ":                      "-node must name the node",
		"extra":                       `unexpected argument "extra"`,
	} {
		_, err := parseConfig(append(strings.Fields(args), "-device-plugins-dir", dir), io.Discard)
		if args == "-node " {
			_, err = parseConfig([]string{"-device-plugins-dir", dir, "-node", ""}, io.Discard)
		}
		if err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v, want %q", args, err, says)
		}
	}
	for _, d := range []string{"", "relative/dir", filepath.Join(dir, "missing")} {
		if _, err := parseConfig([]string{"-device-plugins-dir", d}, io.Discard); err == nil {
			t.Errorf("-device-plugins-dir %q was taken", d)
		}
	}
	if cfg, err := parseConfig([]string{"-device-plugins-dir", dir}, io.Discard); err != nil || cfg.count != 2 || cfg.resource != "nvidia.com/gpu" {
		t.Errorf("defaults: %+v, %v (2 devices of nvidia.com/gpu)", cfg, err)
	}
}
