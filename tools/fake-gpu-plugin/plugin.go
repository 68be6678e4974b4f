package main

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// plugin is the DevicePlugin service for a fixed set of fake devices. Nothing is mutated after newPlugin,
// so the gRPC handlers share it without locks.
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	known   map[string]bool
}

// deviceIDs are fake-gpu-<node>-0 .. fake-gpu-<node>-<count-1>: stable across restarts of the plugin and of the
// kubelet, so the kubelet's checkpoint of allocated devices (kubelet_internal_checkpoint) stays valid.
func deviceIDs(node string, count int) []string {
	ids := make([]string, count)
	for i := range ids {
		ids[i] = fmt.Sprintf("fake-gpu-%s-%d", node, i)
	}
	return ids
}

// newPlugin advertises count devices of node, those in unhealthy as Unhealthy (the kubelet then leaves them out
// of the node's allocatable). An unhealthy ID that is not one of the devices is an error.
func newPlugin(node string, count int, unhealthy []string) (*plugin, error) {
	p := &plugin{known: map[string]bool{}}
	for _, id := range deviceIDs(node, count) {
		p.known[id] = true
	}
	bad := map[string]bool{}
	for _, id := range unhealthy {
		if !p.known[id] {
			return nil, fmt.Errorf("--fail-health %s: not one of the %d devices of node %s", id, count, node)
		}
		bad[id] = true
	}
	for _, id := range deviceIDs(node, count) {
		health := pluginapi.Healthy
		if bad[id] {
			health = pluginapi.Unhealthy
		}
		p.devices = append(p.devices, &pluginapi.Device{ID: id, Health: health})
	}
	return p, nil
}

// GetDevicePluginOptions: no PreStartContainer and no GetPreferredAllocation, so the kubelet never calls them.
func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the device list once and keeps the stream open: the kubelet takes a closed stream for a
// plugin that is gone and marks its devices unhealthy. The stream ends when the kubelet hangs up or the server
// stops (grpc.Server.Stop cancels the stream's context).
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// Allocate gives each container the environment the NVIDIA device plugin sets (NVIDIA_VISIBLE_DEVICES, the
// comma-separated device IDs) and BATCHFILL_FAKE_GPU=1, and no device nodes or mounts: there is no GPU.
func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		for _, id := range c.DevicesIds {
			if !p.known[id] {
				return nil, status.Errorf(codes.InvalidArgument, "unknown device %q", id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{
				"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ","),
				"BATCHFILL_FAKE_GPU":     "1",
			},
		})
	}
	return resp, nil
}
