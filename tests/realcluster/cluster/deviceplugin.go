package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeGPUs is a device plugin advertising GPUs that do not exist, so nvidia.com/gpu is a real extended
// resource of the node: the kubelet counts, allocates and frees the devices exactly as it would real ones,
// and a container that gets some sees them in NVIDIA_VISIBLE_DEVICES as with NVIDIA's plugin.
type fakeGPUs struct {
	pluginapi.UnimplementedDevicePluginServer
	ids []string
	// healthyFile, when set, holds how many of the GPUs are healthy (the first N); the rest are reported
	// Unhealthy, as NVIDIA's plugin reports a GPU after an Xid error. The kubelet's allocatable counts only
	// healthy devices, so a test sets a node's usable GPUs to its seeded donor's without restarting anything.
	healthyFile string
}

func (f *fakeGPUs) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (f *fakeGPUs) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	sent := -1
	for {
		if healthy := f.healthy(); healthy != sent {
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: f.devices(healthy)}); err != nil {
				return err
			}
			sent = healthy
		}
		select {
		case <-stream.Context().Done(): // the kubelet closed the stream
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// healthy is the number of healthy GPUs: the count in healthyFile, else all of them.
func (f *fakeGPUs) healthy() int {
	if f.healthyFile == "" {
		return len(f.ids)
	}
	data, err := os.ReadFile(f.healthyFile)
	if err != nil {
		return len(f.ids)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || n < 0 || n > len(f.ids) {
		fmt.Fprintf(os.Stderr, "gpu-device-plugin: %s should hold a count from 0 to %d; ignored\n", f.healthyFile, len(f.ids))
		return len(f.ids)
	}
	return n
}

func (f *fakeGPUs) devices(healthy int) []*pluginapi.Device {
	devices := make([]*pluginapi.Device, 0, len(f.ids))
	for i, id := range f.ids {
		health := pluginapi.Healthy
		if i >= healthy {
			health = pluginapi.Unhealthy
		}
		devices = append(devices, &pluginapi.Device{ID: id, Health: health})
	}
	return devices
}

func (f *fakeGPUs) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func (f *fakeGPUs) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (f *fakeGPUs) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// runDevicePlugin serves the plugin on a socket in the kubelet's device-plugin directory and registers it;
// when the kubelet restarts (its socket is re-created) the plugin registers again, as real plugins must.
func runDevicePlugin(args []string) int {
	flags := flag.NewFlagSet("gpu-device-plugin", flag.ExitOnError)
	dir := flags.String("plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory")
	count := flags.Int("count", 4, "number of fake GPUs")
	resource := flags.String("resource", "nvidia.com/gpu", "extended resource name")
	healthyFile := flags.String("healthy-file", "", "a file holding how many GPUs are healthy (default: all)")
	_ = flags.Parse(args)
	if *count < 1 {
		fmt.Fprintln(os.Stderr, "gpu-device-plugin: --count must be at least 1")
		return 2
	}
	plugin := &fakeGPUs{healthyFile: *healthyFile}
	for i := 0; i < *count; i++ {
		plugin.ids = append(plugin.ids, fmt.Sprintf("fake-gpu-%d", i))
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	for {
		done, err := serveOnce(plugin, *dir, *resource)
		if err != nil {
			fmt.Fprintf(os.Stderr, "gpu-device-plugin: %v; retrying in 2 s\n", err)
			select {
			case <-stop:
				return 0
			case <-time.After(2 * time.Second):
			}
			continue
		}
		select {
		case <-stop:
			return 0
		case <-done: // the kubelet restarted: register again
		}
	}
}

// serveOnce serves and registers, returning a channel closed when the kubelet's socket is re-created.
func serveOnce(plugin *fakeGPUs, dir, resource string) (<-chan struct{}, error) {
	endpoint := "gpu-offload-fake-gpu.sock"
	path := filepath.Join(dir, endpoint)
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, plugin)
	go func() { _ = server.Serve(listener) }()
	kubeletSocket := filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket))
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		server.Stop()
		return nil, fmt.Errorf("dial kubelet at %s: %w", kubeletSocket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource,
	})
	if err != nil {
		server.Stop()
		return nil, fmt.Errorf("register with kubelet at %s: %w", kubeletSocket, err)
	}
	fmt.Fprintf(os.Stderr, "gpu-device-plugin: registered %d x %s\n", len(plugin.ids), resource)
	done := make(chan struct{})
	go watchKubelet(kubeletSocket, server, done)
	return done, nil
}

// watchKubelet stops the server once the kubelet's socket disappears or is replaced (a kubelet restart
// forgets every plugin, so the plugin must register anew).
func watchKubelet(socket string, server *grpc.Server, done chan<- struct{}) {
	first, _ := os.Stat(socket)
	for {
		time.Sleep(2 * time.Second)
		now, err := os.Stat(socket)
		if err != nil || first == nil || !os.SameFile(first, now) || !now.ModTime().Equal(first.ModTime()) {
			server.Stop()
			close(done)
			return
		}
	}
}
