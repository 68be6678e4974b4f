// Command batchfill-fake-gpu is a kubelet device plugin that advertises fake GPUs (nvidia.com/gpu by default) on
// a node without any, so that the kubelet itself accounts for them: a pod asking for more GPUs than are free
// stays Pending with the scheduler's real reason, and an admitted container gets NVIDIA_VISIBLE_DEVICES as from
// the NVIDIA plugin. It speaks the kubelet's device-plugin API v1beta1
// (https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/).
//
//	batchfill-fake-gpu --plugin-dir /var/lib/kubelet/device-plugins --node n1 --count 4
//
// It serves on <plugin-dir>/<socket-name>, registers with <plugin-dir>/kubelet.sock, and serves and registers
// again whenever the kubelet restarts (it deletes the plugin sockets and recreates kubelet.sock). Exit codes:
// 0 on SIGTERM or SIGINT (its socket removed); 1 when it cannot serve; 2 on a bad flag.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// pollInterval is how often the kubelet's and our own socket are checked; a restarted kubelet sees the devices
// again within about this long (the NVIDIA plugin reacts at once through inotify; a second is enough here).
const pollInterval = time.Second

type config struct {
	pluginDir, resource, node, socketName string
	count                                 int
	failHealth                            []string
}

func parseFlags(args []string) (config, error) {
	var c config
	fl := flag.NewFlagSet("batchfill-fake-gpu", flag.ContinueOnError)
	fl.StringVar(&c.pluginDir, "plugin-dir", pluginapi.DevicePluginPath, "the kubelet's <root-dir>/device-plugins/")
	fl.StringVar(&c.resource, "resource", "nvidia.com/gpu", "extended resource name to advertise")
	fl.IntVar(&c.count, "count", 1, "number of devices")
	fl.StringVar(&c.node, "node", "", "node name, part of the device IDs fake-gpu-<node>-<i> (default: hostname)")
	fl.StringVar(&c.socketName, "socket-name", "batchfill-fake-gpu.sock", "socket file name in --plugin-dir")
	failHealth := fl.String("fail-health", "", "comma-separated device IDs to advertise as Unhealthy")
	if err := fl.Parse(args); err != nil {
		return c, err
	}
	if fl.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %v", fl.Args())
	}
	if c.node == "" {
		h, err := os.Hostname()
		if err != nil {
			return c, fmt.Errorf("--node not given and no hostname: %w", err)
		}
		c.node = h
	}
	if *failHealth != "" {
		c.failHealth = strings.Split(*failHealth, ",")
	}
	switch {
	case c.count < 1:
		return c, fmt.Errorf("--count must be >= 1, got %d", c.count)
	case c.socketName == "" || strings.ContainsRune(c.socketName, '/') || c.socketName == "kubelet.sock":
		// The kubelet resolves the endpoint relative to its plugin dir.
		return c, fmt.Errorf("--socket-name must be a file name other than kubelet.sock, got %q", c.socketName)
	case !strings.Contains(c.resource, "/"):
		return c, fmt.Errorf("--resource must be an extended resource name <domain>/<name>, got %q", c.resource)
	}
	abs, err := filepath.Abs(c.pluginDir)
	c.pluginDir = abs
	return c, err
}

func main() {
	log.SetPrefix("batchfill-fake-gpu: ")
	log.SetFlags(log.LstdFlags | log.Lmicroseconds | log.LUTC)
	c, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		log.Print(err)
		os.Exit(2)
	}
	p, err := newPlugin(c.node, c.count, c.failHealth)
	if err != nil {
		log.Print(err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, c, p); err != nil {
		log.Print(err)
		os.Exit(1)
	}
	log.Print("stopped")
}

// run serves and registers, and again after each kubelet restart, until ctx is done.
func run(ctx context.Context, c config, p *plugin) error {
	socket := filepath.Join(c.pluginDir, c.socketName)
	kubeletSock := filepath.Join(c.pluginDir, "kubelet.sock")
	for {
		kubelet, err := waitForFile(ctx, kubeletSock)
		if err != nil {
			return nil // ctx done
		}
		srv, err := serve(p, socket)
		if err != nil {
			return err
		}
		if err := register(ctx, kubeletSock, c.socketName, c.resource); err != nil {
			log.Printf("register with %s: %v; retrying", kubeletSock, err)
			shutdown(srv, socket)
			if sleep(ctx, pollInterval) {
				continue
			}
			return nil
		}
		log.Printf("registered %d %s (%s-0..%d) on %s", c.count, c.resource, "fake-gpu-"+c.node, c.count-1, socket)
		reason := awaitKubeletRestart(ctx, socket, kubeletSock, kubelet)
		shutdown(srv, socket)
		if reason == "" {
			return nil
		}
		log.Printf("%s: serving and registering again", reason)
	}
}

// serve starts the DevicePlugin service on socket, replacing a stale socket of an earlier run.
func serve(p *plugin, socket string) (*grpc.Server, error) {
	if err := os.Remove(socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	l, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() {
		if err := srv.Serve(l); err != nil { // nil after Stop
			log.Printf("serve %s: %v", socket, err)
		}
	}()
	return srv, nil
}

// shutdown stops the server, which ends the kubelet's ListAndWatch stream, and removes the socket.
func shutdown(srv *grpc.Server, socket string) {
	srv.Stop()
	if err := os.Remove(socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		log.Printf("remove %s: %v", socket, err)
	}
}

func register(ctx context.Context, kubeletSock, endpoint, resource string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     endpoint, // relative to the kubelet's plugin dir
		ResourceName: resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	return err
}

// waitForFile returns path's FileInfo once it exists; an error only when ctx is done first.
func waitForFile(ctx context.Context, path string) (os.FileInfo, error) {
	for logged := false; ; logged = true {
		if fi, err := os.Stat(path); err == nil {
			return fi, nil
		}
		if !logged {
			log.Printf("waiting for %s", path)
		}
		if !sleep(ctx, pollInterval) {
			return nil, ctx.Err()
		}
	}
}

// awaitKubeletRestart polls until the kubelet has restarted and says how it showed: our socket is gone (the
// kubelet's device manager empties the plugin dir when it starts) or kubelet.sock is another file than the one
// registered with. A kubelet that is merely down (no kubelet.sock) is waited for. "" when ctx is done.
func awaitKubeletRestart(ctx context.Context, socket, kubeletSock string, registered os.FileInfo) string {
	for sleep(ctx, pollInterval) {
		if _, err := os.Stat(socket); err != nil {
			return socket + " removed"
		}
		// An inode number can be reused at once for the new socket; its change time then differs.
		if fi, err := os.Stat(kubeletSock); err == nil && !(os.SameFile(fi, registered) && sameCtime(fi, registered)) {
			return kubeletSock + " recreated"
		}
	}
	return ""
}

func sameCtime(a, b os.FileInfo) bool {
	sa, okA := a.Sys().(*syscall.Stat_t)
	sb, okB := b.Sys().(*syscall.Stat_t)
	return okA && okB && sa.Ctim == sb.Ctim
}

// sleep waits d; false when ctx is done first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
