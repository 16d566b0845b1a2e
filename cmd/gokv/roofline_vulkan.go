//go:build vulkan

package main

import (
	"fmt"

	"github.com/gokv/gokv/bridge"
)

// deviceCeilings measures the floor of a GPU backend: for Vulkan, the device's copy bandwidth (read +
// write, GPU timestamps). Attention reads its bytes once, so a kernel at that bandwidth is at the floor.
// Compute peak is not measured (decode attention on compressed K/V is memory-bound on GPUs).
func deviceCeilings(dev *bridge.Device, info bridge.DeviceInfo, readBytes int64) (ceilings, error) {
	if info.Backend != "vulkan" {
		return ceilings{}, fmt.Errorf("no floor measurement for backend %q", info.Backend)
	}
	g, err := bridge.VulkanCopyGBps(dev, uint64(readBytes))
	if err != nil {
		return ceilings{}, err
	}
	return ceilings{ReadGBps: g, Source: "gokv_vulkan_measure_copy_gbps: buffer copy, read + write"}, nil
}
