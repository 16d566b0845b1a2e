//go:build !vulkan

package main

import (
	"fmt"

	"github.com/gokv/gokv/bridge"
)

// deviceCeilings: without a GPU module compiled in, only the CPU backend exists (measured by
// measureCeilings).
func deviceCeilings(_ *bridge.Device, info bridge.DeviceInfo, _ int64) (ceilings, error) {
	return ceilings{}, fmt.Errorf("no floor measurement for backend %q in this build", info.Backend)
}
