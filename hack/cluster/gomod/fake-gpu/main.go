// Command fake-gpu is the test cluster's device plugin for GPUs that are not there
// (hack/cluster/addons/gpu.sh, docs/test-cluster.md "GPU nodes without GPUs"). It speaks the
// kubelet's device-plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1) to one node's
// kubelet: it serves N healthy devices of an extended resource (nvidia.com/gpu) and on Allocate
// sets what NVIDIA's plugin sets in a container's environment (NVIDIA_VISIBLE_DEVICES), plus
// GPUPIPE_FAKE_GPU=1. The scheduler, the kubelet's admission and the pod's environment are real;
// CUDA is not.
//
// How the kubelet finds it: through the kubelet's plugin watcher, the one registration path that
// follows the kubelet's --root-dir. The plugin serves the pluginregistration API
// (k8s.io/kubelet/pkg/apis/pluginregistration/v1) on <root-dir>/plugins_registry/
// gpupipe-fake-gpu-reg.sock; the kubelet's watcher sees the socket, calls GetInfo (Type
// DevicePlugin, Name the resource, Endpoint the absolute path of the device-plugin socket,
// <root-dir>/plugins/gpupipe-fake-gpu/dp.sock, versions [v1beta1]), hands it to its device
// manager, which dials Endpoint as it is (pkg/kubelet/cm/devicemanager/plugin/v1beta1 handler.go:
// no folder is joined to it) for GetDevicePluginOptions, ListAndWatch and Allocate, and then
// tells the plugin the outcome (NotifyRegistrationStatus). A socket removed from plugins_registry
// is a plugin deregistered (DeRegisterPlugin: its devices go unhealthy).
//
// Not the older path, Register over the kubelet's kubelet.sock: the kubelet makes that socket at
// a path compiled in, /var/lib/kubelet/device-plugins/kubelet.sock (pluginapi.KubeletSocket),
// whatever its --root-dir, and removes every socket in that folder when it starts. With several
// kubelets on one host (the test cluster's nodes) they all share that one folder: each start
// removes the others' kubelet.sock, and a plugin there cannot tell which node it registers with.
//
// The kubelet's plugin watcher scans plugins_registry when it starts and leaves the sockets
// there, so a kubelet that starts again finds the plugin where it was. Besides, every second the
// plugin looks at its two sockets: one removed or replaced is served anew (both, the registration
// socket last). And when no kubelet has had a ListAndWatch stream open for a while (15 s: a
// kubelet that refused the registration, or one that started again and did not come back), it
// makes its registration socket anew, which the kubelet's watcher takes for a new plugin.
// SIGTERM or SIGINT: it removes the registration socket (the kubelet deregisters it), stops
// serving, removes the device-plugin socket and its folder, and exits 0. One log line per event.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const (
	// PluginName names the plugin's registration socket and its folder under <root-dir>/plugins.
	PluginName = "gpupipe-fake-gpu"
	// RegistryDir is the kubelet's plugin-watcher folder under its --root-dir
	// (config.DefaultKubeletPluginsRegistrationDirName).
	RegistryDir = "plugins_registry"
	// PluginsDir is the kubelet's folder for its plugins' data under its --root-dir
	// (config.DefaultKubeletPluginsDirName); the device-plugin socket is in <PluginsDir>/<PluginName>.
	PluginsDir = "plugins"
	// RegistrationSocketName is the socket in the registry folder (it must not start with '.').
	RegistrationSocketName = PluginName + "-reg.sock"
	// DeviceSocketName is the device-plugin socket, the Endpoint GetInfo names.
	DeviceSocketName = "dp.sock"
)

// MaxDevices bounds -count: a node of this test cluster is a share of one machine.
const MaxDevices = 64

// maxSocketPath: a unix socket's path has at most 107 bytes (sun_path, 108 with its NUL).
const maxSocketPath = 107

type config struct {
	rootDir  string // the kubelet's --root-dir
	count    int
	resource string
	product  string
	node     string
	printIDs bool
}

// registrationSocket is where the kubelet's plugin watcher finds the plugin.
func (c config) registrationSocket() string {
	return filepath.Join(c.rootDir, RegistryDir, RegistrationSocketName)
}

// deviceSocket is the device-plugin API's socket: an absolute path, as the kubelet dials it.
func (c config) deviceSocket() string {
	return filepath.Join(c.rootDir, PluginsDir, PluginName, DeviceSocketName)
}

var (
	// An extended resource: a domain that is not kubernetes.io's, a slash, a name.
	resourceName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	// A label value (the product goes into the node's nvidia.com/gpu.product label).
	labelValue = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
)

// parseConfig reads the flags; a bad one is an error that names it and its value.
func parseConfig(args []string, stderr io.Writer) (config, error) {
	var cfg config
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("fake-gpu", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.rootDir, "kubelet-root-dir", "", "the node's kubelet's --root-dir: the plugin registers in its "+RegistryDir+" folder (required)")
	fs.IntVar(&cfg.count, "count", 2, "how many devices to advertise")
	fs.StringVar(&cfg.resource, "resource", "nvidia.com/gpu", "the extended resource the devices count")
	fs.StringVar(&cfg.product, "product", "gpupipe-fake-gpu", "the product name (logged; the add-on puts it in the node's nvidia.com/gpu.product label)")
	fs.StringVar(&cfg.node, "node", host, "the node's name: the device IDs are derived from it")
	fs.BoolVar(&cfg.printIDs, "print-ids", false, "print the device IDs, one a line, and exit")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	switch {
	case fs.NArg() > 0:
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case cfg.count < 1 || cfg.count > MaxDevices:
		return cfg, fmt.Errorf("-count must be from 1 to %d, got %d", MaxDevices, cfg.count)
	case !resourceName.MatchString(cfg.resource) || strings.HasSuffix(strings.SplitN(cfg.resource, "/", 2)[0], "kubernetes.io"):
		return cfg, fmt.Errorf("-resource must be an extended resource like nvidia.com/gpu, got %q", cfg.resource)
	case !labelValue.MatchString(cfg.product):
		return cfg, fmt.Errorf("-product must be a label value (letters, digits, '-', '_', '.'; at most 63), got %q", cfg.product)
	case cfg.node == "":
		return cfg, errors.New("-node must name the node")
	case cfg.printIDs:
		return cfg, nil
	case cfg.rootDir == "" || !filepath.IsAbs(cfg.rootDir) || filepath.Clean(cfg.rootDir) != cfg.rootDir:
		return cfg, fmt.Errorf("-kubelet-root-dir must be an absolute path in canonical form, as the kubelet's --root-dir is, got %q", cfg.rootDir)
	}
	if info, err := os.Stat(cfg.rootDir); err != nil || !info.IsDir() {
		return cfg, fmt.Errorf("-kubelet-root-dir %s is not a folder (has the node's kubelet started?)", cfg.rootDir)
	}
	for _, sock := range []string{cfg.registrationSocket(), cfg.deviceSocket()} {
		if len(sock) > maxSocketPath {
			return cfg, fmt.Errorf("-kubelet-root-dir %s is too long: the socket %s would have more than %d bytes", cfg.rootDir, sock, maxSocketPath)
		}
	}
	return cfg, nil
}

func main() {
	cfg, err := parseConfig(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: fake-gpu: %v\n", err)
		os.Exit(2)
	}
	if cfg.printIDs {
		for i := 0; i < cfg.count; i++ {
			fmt.Println(deviceID(cfg.node, i))
		}
		return
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() { cancel(fmt.Errorf("%v", <-signals)) }()
	logger := log.New(os.Stderr, "fake-gpu: ", log.LstdFlags)
	if err := run(ctx, cfg, logger, timing{poll: time.Second, grace: 15 * time.Second}); err != nil {
		logger.Printf("error: %v", err)
		os.Exit(1)
	}
}

// timing: how often the plugin looks at its sockets, and how long it waits without a kubelet's
// ListAndWatch stream before it makes its registration socket anew.
type timing struct {
	poll  time.Duration
	grace time.Duration
}

// fileID tells one file at a path from the next one made there (an inode number may be reused,
// the modification time is not).
type fileID struct {
	ino   uint64
	mtime int64
}

func idOf(path string) (fileID, bool) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
		return fileID{}, false
	}
	return fileID{ino: st.Ino, mtime: st.Mtim.Nano()}, true
}

// listener is a gRPC server on a unix socket the plugin made: on close it removes the socket
// only while it is still the one it made (not one put there since by someone else).
type listener struct {
	path string
	id   fileID
	grpc *grpc.Server
}

// listen serves the services register adds on a socket at path (a stale socket there, a killed
// plugin's, removed first).
func listen(path string, register func(*grpc.Server)) (*listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing the stale socket %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	id, ok := idOf(path)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("%s is gone right after listening there", path)
	}
	l := &listener{path: path, id: id, grpc: grpc.NewServer()}
	register(l.grpc)
	go func() { _ = l.grpc.Serve(ln) }()
	return l, nil
}

func (l *listener) intact() bool {
	id, ok := idOf(l.path)
	return ok && id == l.id
}

// close removes the socket first (for the registration socket: the kubelet deregisters the
// plugin on seeing it go), then ends the server and its streams.
func (l *listener) close() {
	if l.intact() {
		_ = os.Remove(l.path)
	}
	l.grpc.Stop()
}

// streams counts the kubelets' open ListAndWatch streams, and since when none has been open.
type streams struct {
	mu        sync.Mutex
	open      int
	idleSince time.Time
}

func (s *streams) opened() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open++
}

func (s *streams) closed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open--
	if s.open == 0 {
		s.idleSince = time.Now()
	}
}

// idle: how long no stream has been open (0 while one is).
func (s *streams) idle(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open > 0 {
		return 0
	}
	return now.Sub(s.idleSince)
}

// registrar is the pluginregistration API the kubelet's plugin watcher calls.
type registrar struct {
	registration.UnimplementedRegistrationServer

	cfg config
	log *log.Logger
}

func (r *registrar) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	return &registration.PluginInfo{
		Type:              registration.DevicePlugin,
		Name:              r.cfg.resource,
		Endpoint:          r.cfg.deviceSocket(),
		SupportedVersions: []string{api.Version},
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registration.RegistrationStatus) (*registration.RegistrationStatusResponse, error) {
	if s.PluginRegistered {
		r.log.Printf("the kubelet registered %s (it dials %s)", r.cfg.resource, r.cfg.deviceSocket())
	} else {
		r.log.Printf("the kubelet refused the registration of %s: %s", r.cfg.resource, s.Error)
	}
	return &registration.RegistrationStatusResponse{}, nil
}

// servers are the plugin's two: the device plugin's and the registration's.
type servers struct {
	device    *listener
	reg       *listener
	plugin    *plugin
	announced time.Time // when the registration socket was made
}

// serve serves the devices, then announces them: the device socket listens before the kubelet
// can learn its path.
func serve(cfg config, logger *log.Logger, watch *streams) (*servers, error) {
	s := &servers{plugin: newPlugin(cfg, logger, watch)}
	var err error
	if s.device, err = listen(cfg.deviceSocket(), func(g *grpc.Server) { api.RegisterDevicePluginServer(g, s.plugin) }); err != nil {
		return nil, err
	}
	if err := s.announce(cfg, logger); err != nil {
		s.close()
		return nil, err
	}
	logger.Printf("serving %d %s devices (%s) of node %s on %s, announced at %s",
		cfg.count, cfg.resource, cfg.product, cfg.node, cfg.deviceSocket(), cfg.registrationSocket())
	return s, nil
}

// announce makes the registration socket (anew: the kubelet's watcher takes a new socket for a
// new plugin and registers it again).
func (s *servers) announce(cfg config, logger *log.Logger) error {
	if s.reg != nil {
		s.reg.close()
		s.reg = nil
	}
	reg, err := listen(cfg.registrationSocket(), func(g *grpc.Server) {
		registration.RegisterRegistrationServer(g, &registrar{cfg: cfg, log: logger})
	})
	if err != nil {
		return err
	}
	s.reg, s.announced = reg, time.Now()
	return nil
}

func (s *servers) intact() bool {
	return s.device.intact() && s.reg != nil && s.reg.intact()
}

// close: the registration socket first, so that the kubelet deregisters the plugin before its
// streams end.
func (s *servers) close() {
	if s.reg != nil {
		s.reg.close()
	}
	close(s.plugin.stop)
	s.device.close()
}

// run serves until ctx ends, every poll looking at the two sockets (one removed or replaced:
// both served anew) and at the kubelets' streams (none open for grace since the registration
// socket was made: it is made anew). At the end the sockets and the plugin's folder are removed.
func run(ctx context.Context, cfg config, logger *log.Logger, t timing) error {
	for _, dir := range []string{filepath.Dir(cfg.registrationSocket()), filepath.Dir(cfg.deviceSocket())} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	watch := &streams{idleSince: time.Now()}
	var (
		srv   *servers
		quiet bool // the re-announcement was logged; not again until a kubelet lists the devices
	)
	defer func() {
		if srv != nil {
			srv.close()
		}
		_ = os.Remove(filepath.Dir(cfg.deviceSocket())) // only when empty
		logger.Printf("stopped; removed %s and %s", cfg.registrationSocket(), cfg.deviceSocket())
	}()
	ticker := time.NewTicker(t.poll)
	defer ticker.Stop()
	for {
		now := time.Now()
		switch {
		case srv == nil || !srv.intact():
			if srv != nil {
				logger.Printf("%s or %s was removed or replaced: serving anew", cfg.registrationSocket(), cfg.deviceSocket())
				srv.close()
				srv = nil
			}
			var err error
			if srv, err = serve(cfg, logger, watch); err != nil {
				return err
			}
		case watch.idle(now) >= t.grace && now.Sub(srv.announced) >= t.grace:
			if !quiet {
				logger.Printf("no kubelet has listed the devices for %s: making %s anew (every %s until one does; said once)",
					t.grace, cfg.registrationSocket(), t.grace)
				quiet = true
			}
			if err := srv.announce(cfg, logger); err != nil {
				return err
			}
		case watch.idle(now) == 0:
			quiet = false
		}
		select {
		case <-ctx.Done():
			logger.Printf("%v: stopping", context.Cause(ctx))
			return nil
		case <-ticker.C:
		}
	}
}
