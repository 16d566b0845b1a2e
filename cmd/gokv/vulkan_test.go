//go:build vulkan

package main

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// `gokv attend --backend vulkan` must agree with `--backend cpu` on the same files, and each
// must match the float64 model on its own.
func TestAttendVulkanAgreesWithCPU(t *testing.T) {
	for i, c := range attendCases {
		t.Run(c.name, func(t *testing.T) {
			cpu := runAttendCase(t, i, c, "cpu")
			vk := runAttendCase(t, i, c, "vulkan")
			require.Len(t, vk, len(cpu))
			worst, scale := 0.0, 0.0
			for j := range cpu {
				worst = max(worst, math.Abs(float64(vk[j])-float64(cpu[j])))
				scale = max(scale, math.Abs(float64(cpu[j])))
			}
			assert.LessOrEqual(t, worst, 1e-4*max(scale, 1e-30), "max |vulkan - cpu| relative to max |cpu|")
		})
	}
}

func TestBenchVulkanJSON(t *testing.T) {
	var out bytes.Buffer
	root := newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs([]string{"bench", "--json", "-q", "--backend", "vulkan", "--formats", "f16,q4,kivi2:32:32",
		"--contexts", "96,200", "--batch", "1,2", "--min-time", "1ms", "--read-mib", "8"})
	require.NoError(t, root.Execute())
	lines := bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n"))
	require.Len(t, lines, 12)
	for _, l := range lines {
		var row map[string]any
		require.NoError(t, json.Unmarshal(l, &row))
		assert.Equal(t, "vulkan", row["backend"])
		assert.Greater(t, row["ms"], 0.0)
		assert.Greater(t, row["floor_ms"], 0.0, "the floor comes from the device's copy bandwidth")
		assert.NotNil(t, row["baseline_ms"], "the Vulkan backend has the dequantize baseline")
		assert.Greater(t, row["cos_vs_f32"], 0.7)
	}
}
