// Command fake-gpu is the test cluster's device plugin for GPUs that are not there
// (hack/cluster/addons/gpu.sh, docs/test-cluster.md "GPU nodes without GPUs"). It speaks the
// kubelet's device-plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1) to one node's
// kubelet: it serves N healthy devices of an extended resource (nvidia.com/gpu) on a socket in
// that kubelet's device-plugins folder, registers them over the kubelet's kubelet.sock there, and
// on Allocate sets what NVIDIA's plugin sets in a container's environment
// (NVIDIA_VISIBLE_DEVICES), plus GPUPIPE_FAKE_GPU=1. The scheduler, the kubelet's admission and
// the pod's environment are real; CUDA is not.
//
// A kubelet that starts removes every socket in its device-plugins folder and makes a new
// kubelet.sock (hack/cluster-node.sh start, a changed kubelet config): the plugin looks at both
// files every second and, when its socket is gone or kubelet.sock is a new file, serves again and
// registers again. SIGTERM or SIGINT: it stops serving, removes its socket and exits 0. One log
// line per event.
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
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// SocketName is the plugin's socket in the device-plugins folder (the Endpoint it registers).
const SocketName = "gpupipe-fake-gpu.sock"

// MaxDevices bounds -count: a node of this test cluster is a share of one machine.
const MaxDevices = 64

type config struct {
	dir      string // the kubelet's device-plugins folder (<kubelet root-dir>/device-plugins)
	count    int
	resource string
	product  string
	node     string
	printIDs bool
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
	fs.StringVar(&cfg.dir, "device-plugins-dir", "", "the kubelet's device-plugins folder: <its --root-dir>/device-plugins (required)")
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
	case cfg.dir == "" || !filepath.IsAbs(cfg.dir):
		return cfg, fmt.Errorf("-device-plugins-dir must be an absolute path, got %q", cfg.dir)
	}
	if info, err := os.Stat(cfg.dir); err != nil || !info.IsDir() {
		return cfg, fmt.Errorf("-device-plugins-dir %s is not a folder (is the node's kubelet running?)", cfg.dir)
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
	if err := run(ctx, cfg, logger, time.Second); err != nil {
		logger.Printf("error: %v", err)
		os.Exit(1)
	}
}

// fileID tells one file at a path from the next one made there (a kubelet that starts again
// makes a new kubelet.sock; its inode number may be reused, its modification time is not).
type fileID struct {
	ino   uint64
	mtime int64
}

func idOf(path string) (fileID, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileID{}, false
	}
	return fileID{ino: st.Ino, mtime: st.Mtim.Nano()}, true
}

// server is the plugin's gRPC server on its socket.
type server struct {
	grpc   *grpc.Server
	plugin *plugin
}

// serve listens on the plugin's socket (a stale one left by a killed plugin is removed first).
func serve(cfg config, logger *log.Logger) (*server, error) {
	sock := filepath.Join(cfg.dir, SocketName)
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing the stale socket %s: %w", sock, err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", sock, err)
	}
	s := &server{grpc: grpc.NewServer(), plugin: newPlugin(cfg, logger)}
	api.RegisterDevicePluginServer(s.grpc, s.plugin)
	go func() { _ = s.grpc.Serve(ln) }()
	logger.Printf("serving %d %s devices (%s) of node %s on %s", cfg.count, cfg.resource, cfg.product, cfg.node, sock)
	return s, nil
}

// close ends the streams and the server; the listener's close unlinks the socket path, so a
// new server listens there only after the old one is closed.
func (s *server) close() {
	close(s.plugin.stop)
	s.grpc.Stop()
}

// register announces the plugin to the kubelet listening on kubelet.sock in cfg.dir.
func register(ctx context.Context, cfg config) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(cfg.dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = api.NewRegistrationClient(conn).Register(ctx, &api.RegisterRequest{
		Version:      api.Version,
		Endpoint:     SocketName,
		ResourceName: cfg.resource,
		Options:      options(),
	})
	return err
}

// run serves and registers until ctx ends, every poll looking at the plugin's socket and at
// kubelet.sock: a socket the kubelet removed is served again, a kubelet.sock not registered with
// yet (the first, or a new kubelet's) is registered with. At the end the socket is removed.
func run(ctx context.Context, cfg config, logger *log.Logger, poll time.Duration) error {
	sock := filepath.Join(cfg.dir, SocketName)
	kubeletSock := filepath.Join(cfg.dir, "kubelet.sock")
	var (
		srv        *server
		registered fileID // the kubelet.sock registered with (zero: none)
		lastErr    string
	)
	defer func() {
		if srv != nil {
			srv.close()
		}
		_ = os.Remove(sock)
		logger.Printf("stopped; removed %s", sock)
	}()
	ticker := time.NewTicker(poll)
	defer ticker.Stop()
	for {
		if _, ok := idOf(sock); srv == nil || !ok {
			if srv != nil {
				logger.Printf("%s was removed (the kubelet started again?): serving anew", sock)
				srv.close()
			}
			var err error
			if srv, err = serve(cfg, logger); err != nil {
				srv = nil
				return err
			}
			registered = fileID{}
		}
		if kubelet, ok := idOf(kubeletSock); ok && kubelet != registered {
			if registered != (fileID{}) {
				logger.Printf("%s is a new file (the kubelet started again): registering again", kubeletSock)
			}
			if err := register(ctx, cfg); err != nil {
				if msg := err.Error(); msg != lastErr && ctx.Err() == nil {
					logger.Printf("registering with %s failed (trying again every %s): %v", kubeletSock, poll, err)
					lastErr = msg
				}
			} else {
				registered, lastErr = kubelet, ""
				logger.Printf("registered %s with the kubelet at %s", cfg.resource, kubeletSock)
			}
		}
		select {
		case <-ctx.Done():
			logger.Printf("%v: stopping", context.Cause(ctx))
			return nil
		case <-ticker.C:
		}
	}
}
