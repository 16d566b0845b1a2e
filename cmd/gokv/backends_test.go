package main

import (
	"bytes"
	"encoding/json"
	"math"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/gokv"
)

// One table of cross-backend tests of the command line: each case runs on every backend compiled into
// this build (gokv.Backends(): "cpu" always, "vulkan" under the vulkan build tag, any later module the
// same way), compared with the CPU where that is the check. A warning or error logged while a case runs
// fails it (with GOKV_VULKAN_VALIDATION=1 that includes every Vulkan validation message).

// lockedBuffer is a log sink that native callbacks may write from any thread.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// forEachBackend runs fn as a subtest on every backend compiled in, with the CLI's logger at warn level
// into a buffer that must stay empty.
func forEachBackend(t *testing.T, fn func(t *testing.T, backend string)) {
	backends := gokv.Backends()
	if len(backends) == 0 {
		t.Skip("no native backend: built without cgo")
	}
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			var log lockedBuffer
			saved := logger
			logger = zerolog.New(&log).Level(zerolog.WarnLevel)
			t.Cleanup(func() {
				logger = saved
				if s := log.String(); s != "" {
					t.Errorf("backend %s logged warnings or errors:\n%s", b, s)
				}
			})
			fn(t, b)
		})
	}
}

// `gokv attend --backend X` must agree with `--backend cpu` on the same files, and each must match the
// float64 model on its own (runAttendCase checks that).
func TestAttendBackendsAgreeWithCPU(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		for i, c := range attendCases {
			t.Run(c.name, func(t *testing.T) {
				cpu := runAttendCase(t, i, c, "cpu")
				got := runAttendCase(t, i, c, backend)
				require.Len(t, got, len(cpu))
				worst, scale := 0.0, 0.0
				for j := range cpu {
					worst = max(worst, math.Abs(float64(got[j])-float64(cpu[j])))
					scale = max(scale, math.Abs(float64(cpu[j])))
				}
				assert.LessOrEqual(t, worst, 1e-4*max(scale, 1e-30), "max |%s - cpu| relative to max |cpu|", backend)
			})
		}
	})
}

// `gokv bench --json` on each backend: every row has a time, a floor from the device's measured
// ceilings, the dequantize-then-attend baseline where the device has one, and an output close to f32's.
func TestBenchJSONOnEveryBackend(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		var out, stderr bytes.Buffer
		root := newRootCmd(&out, &stderr)
		root.SetArgs([]string{"bench", "--json", "-q", "--backend", backend, "--formats", "f16,q4,kivi2:32:32",
			"--contexts", "96,200", "--batch", "1,2", "--min-time", "1ms", "--read-mib", "8"})
		require.NoError(t, root.Execute())
		assert.Empty(t, stderr.String(), "warnings or errors logged")
		eng, err := gokv.Open(gokv.WithBackend(backend))
		require.NoError(t, err)
		info, err := eng.Info()
		require.NoError(t, err)
		require.NoError(t, eng.Close())
		lines := bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n"))
		require.Len(t, lines, 12)
		for _, l := range lines {
			var row map[string]any
			require.NoError(t, json.Unmarshal(l, &row))
			assert.Equal(t, backend, row["backend"])
			assert.Greater(t, row["ms"], 0.0)
			assert.Greater(t, row["floor_ms"], 0.0, "the floor comes from the device's measured ceilings")
			if info.Caps.Baseline {
				assert.NotNil(t, row["baseline_ms"], "the device has the dequantize baseline")
			}
			assert.Greater(t, row["cos_vs_f32"], 0.7)
		}
	})
}
