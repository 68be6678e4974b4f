package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The test binary runs main() when started with this variable set, so the test drives the real program (flags,
// signals, exit code) without building it separately.
const runMainEnv = "BATCHFILL_FAKE_GPU_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeKubelet is the kubelet's side of registration: a Registration server on <dir>/kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir  string
	srv  *grpc.Server
	regs chan registration
}

// registration is a Register request and whether its endpoint answered while the kubelet handled it.
type registration struct {
	req *pluginapi.RegisterRequest
	err error
}

func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{dir: dir, srv: grpc.NewServer(), regs: make(chan registration, 4)}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(l) }()
	t.Cleanup(k.srv.Stop)
	return k
}

// Register does what the kubelet's device manager does before it answers (connectClient in
// k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1): dial the endpoint, relative to the plugin dir,
// and ask for the plugin's options; a plugin that does not answer yet is refused.
func (k *fakeKubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, r.Endpoint),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err == nil {
		defer conn.Close()
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err = pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	}
	k.regs <- registration{r, err}
	return &pluginapi.Empty{}, err
}

// awaitRegister returns the next Register request, checked against what the kubelet requires.
func (k *fakeKubelet) awaitRegister(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case reg := <-k.regs:
		r := reg.req
		if r.Version != pluginapi.Version || r.ResourceName != "nvidia.com/gpu" || r.Endpoint != "fake.sock" {
			t.Fatalf("Register(version %q, resource %q, endpoint %q), want (v1beta1, nvidia.com/gpu, fake.sock)",
				r.Version, r.ResourceName, r.Endpoint)
		}
		if reg.err != nil {
			t.Fatalf("the registered endpoint does not answer during Register: %v", reg.err)
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no Register request within 10 s")
		return nil
	}
}

// syncBuffer collects the plugin's stderr, written by exec's copying goroutine and read by the test.
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

func dialPlugin(t *testing.T, dir string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "fake.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func TestAgainstFakeKubelet(t *testing.T) {
	// Not t.TempDir(): a unix socket path is limited to 108 bytes, and t.TempDir() embeds the test's name.
	dir, err := os.MkdirTemp("", "fgpu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	kubelet := startKubelet(t, dir)

	cmd := exec.Command(os.Args[0], "--plugin-dir", dir, "--resource", "nvidia.com/gpu", "--count", "3",
		"--node", "n1", "--socket-name", "fake.sock")
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		t.Logf("plugin stderr:\n%s", stderr)
	})

	kubelet.awaitRegister(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := dialPlugin(t, dir)

	opts, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || opts.PreStartRequired || opts.GetPreferredAllocationAvailable {
		t.Fatalf("GetDevicePluginOptions = %v, %v; want empty options", opts, err)
	}

	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"fake-gpu-n1-0", "fake-gpu-n1-1", "fake-gpu-n1-2"}
	if len(resp.Devices) != len(want) {
		t.Fatalf("ListAndWatch sent %d devices, want %d", len(resp.Devices), len(want))
	}
	for i, d := range resp.Devices {
		if d.ID != want[i] || d.Health != pluginapi.Healthy {
			t.Errorf("device %d = (%q, %q), want (%q, Healthy)", i, d.ID, d.Health, want[i])
		}
	}
	// The stream stays open: the next Recv only returns when the plugin's server stops (kubelet restart below).
	streamEnded := make(chan error, 1)
	go func() {
		_, err := stream.Recv()
		streamEnded <- err
	}()
	select {
	case err := <-streamEnded:
		t.Fatalf("ListAndWatch ended after the first list: %v", err)
	case <-time.After(1500 * time.Millisecond):
	}

	alloc, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"fake-gpu-n1-0", "fake-gpu-n1-2"}},
		{DevicesIds: []string{"fake-gpu-n1-1"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	wantEnv := []string{"fake-gpu-n1-0,fake-gpu-n1-2", "fake-gpu-n1-1"}
	if len(alloc.ContainerResponses) != 2 {
		t.Fatalf("Allocate returned %d container responses, want 2", len(alloc.ContainerResponses))
	}
	for i, c := range alloc.ContainerResponses {
		if c.Envs["NVIDIA_VISIBLE_DEVICES"] != wantEnv[i] || c.Envs["BATCHFILL_FAKE_GPU"] != "1" || len(c.Envs) != 2 {
			t.Errorf("container %d envs = %v, want NVIDIA_VISIBLE_DEVICES=%s BATCHFILL_FAKE_GPU=1", i, c.Envs, wantEnv[i])
		}
		if len(c.Devices) != 0 || len(c.Mounts) != 0 {
			t.Errorf("container %d gets devices %v, mounts %v; want none", i, c.Devices, c.Mounts)
		}
	}
	_, err = client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"fake-gpu-n2-0"}},
	}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("Allocate of an unknown device: %v, want InvalidArgument", err)
	}

	// A kubelet restart as the plugin sees it when only kubelet.sock is replaced: stopping the server unlinks it.
	kubelet.srv.Stop()
	kubelet = startKubelet(t, dir)
	kubelet.awaitRegister(t)
	select {
	case <-streamEnded:
	case <-time.After(5 * time.Second):
		t.Error("the old ListAndWatch stream is still open after re-registering")
	}
	// A restart as the kubelet's device manager does it: it removes every socket in the plugin dir.
	if err := os.Remove(filepath.Join(dir, "fake.sock")); err != nil {
		t.Fatal(err)
	}
	kubelet.awaitRegister(t)
	if _, err := dialPlugin(t, dir).GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		t.Fatalf("the recreated socket does not serve: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("still running 5 s after SIGTERM")
	}
	if _, err := os.Stat(filepath.Join(dir, "fake.sock")); !os.IsNotExist(err) {
		t.Errorf("socket still there after SIGTERM (stat: %v)", err)
	}
}

func TestFailHealth(t *testing.T) {
	p, err := newPlugin("n1", 2, []string{"fake-gpu-n1-1"})
	if err != nil {
		t.Fatal(err)
	}
	if p.devices[0].Health != pluginapi.Healthy || p.devices[1].Health != pluginapi.Unhealthy {
		t.Errorf("health = %s, %s; want Healthy, Unhealthy", p.devices[0].Health, p.devices[1].Health)
	}
	if _, err := newPlugin("n1", 2, []string{"fake-gpu-n1-2"}); err == nil {
		t.Error("--fail-health of a device that does not exist was accepted")
	}
}

func TestParseFlags(t *testing.T) {
	c, err := parseFlags([]string{"--plugin-dir", "rel", "--node", "n", "--count", "2"})
	if err != nil || !filepath.IsAbs(c.pluginDir) || c.resource != "nvidia.com/gpu" || c.count != 2 {
		t.Errorf("parseFlags = %+v, %v", c, err)
	}
	for _, bad := range [][]string{
		{"--count", "0"}, {"--socket-name", "a/b"}, {"--socket-name", "kubelet.sock"}, {"--resource", "gpu"}, {"x"},
	} {
		if _, err := parseFlags(append([]string{"--node", "n"}, bad...)); err == nil {
			t.Errorf("parseFlags(%v) accepted", bad)
		}
	}
}
