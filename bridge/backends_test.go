package bridge

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One table of cross-backend tests (docs/architecture.md §8): each case runs on every backend compiled
// into this build (Backends(): "cpu" always, "vulkan" under the vulkan build tag, any later module the
// same way), on the same inputs as the CPU backend, every format, GQA and MLA, sinks, windows, holes,
// decode and prefill. A backend needs no Go test file of its own.
//
// Tolerances: each backend against the float64 reference over its own Read output as in attend_test.go
// (1e-3 per element, relative to 1 + |reference|); against the CPU twice that (each is within 1e-3 of the
// same reference). Reads must be bit-identical but for rare quantization codes one step apart (at most 1
// in 1000 elements; the native suite checks the step size).
//
// The backend's log is watched: a warning or error it logs fails the test (with GOKV_VULKAN_VALIDATION=1,
// as CI runs it on lavapipe, the Khronos validation layer's messages arrive that way), except in a test
// that injects faults, whose failures are logged on purpose.

// backendRNGSeed is the seed every paired cache and batch is drawn from, so the two backends get the same
// pages, data, masks and queries.
const backendRNGSeed = 77

// logWatch collects the warnings and errors a backend logs during a test.
type logWatch struct {
	mu     sync.Mutex
	logs   []string
	faults bool
}

// expectFaults says that the test injects failures, so errors in the log are expected.
func (w *logWatch) expectFaults() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.faults = true
}

// forEachBackend runs fn as a subtest on every backend compiled in, watching the backend's log.
func forEachBackend(t *testing.T, fn func(t *testing.T, backend string, log *logWatch)) {
	backends := Backends()
	require.NotEmpty(t, backends)
	require.Equal(t, "cpu", backends[0])
	for _, b := range backends {
		t.Run(b, func(t *testing.T) { fn(t, b, watchBackendLog(t, b)) })
	}
}

// watchBackendLog fails t if the backend logs a warning or an error while t runs (its cleanups registered
// later, device and pool closes, included), unless the test expects faults; it prints what was logged.
func watchBackendLog(t *testing.T, backend string) *logWatch {
	t.Helper()
	if v := os.Getenv("GOKV_VULKAN_VALIDATION"); backend == "vulkan" && (v == "" || v == "0") {
		t.Log("GOKV_VULKAN_VALIDATION is not set: the Khronos validation layer is off for this run")
	}
	w := &logWatch{}
	require.NoError(t, SetLogFunc(func(level int, from, op, msg string) {
		if from != "" && from != backend {
			return
		}
		w.mu.Lock()
		w.logs = append(w.logs, fmt.Sprintf("level %d %s %s: %s", level, from, op, msg))
		w.mu.Unlock()
	}, LogWarn))
	t.Cleanup(func() {
		_ = SetLogFunc(nil, 0)
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.logs) > 0 && !w.faults {
			t.Errorf("backend %s logged %d warning(s) or error(s) during the test:\n%s", backend, len(w.logs),
				strings.Join(w.logs, "\n"))
		}
	})
	return w
}

// openBackend opens the backend's default device and closes it when the test ends.
func openBackend(t testing.TB, backend string) *Device {
	t.Helper()
	dev, err := OpenDevice(backend, -1, 2)
	require.NoError(t, err, "backend %s is compiled in; does this machine have its device (Vulkan: lavapipe)?", backend)
	t.Cleanup(func() { require.NoError(t, dev.Close()) })
	return dev
}

// pairedCaches builds the same cache on both devices from the same seed.
func pairedCaches(t *testing.T, dev, cpu *Device, desc PoolDesc, lens []int, seed uint64) (cd, cc *cache) {
	t.Helper()
	cd = newCache(t, dev, desc, lens, rand.New(rand.NewPCG(seed, backendRNGSeed)))
	cc = newCache(t, cpu, desc, lens, rand.New(rand.NewPCG(seed, backendRNGSeed)))
	require.Equal(t, cc.pages, cd.pages)
	return cd, cc
}

// assertReadsMatch compares a backend's read-back with the CPU's: bit for bit but for rare codes one step
// apart.
func assertReadsMatch(t *testing.T, vk, cpu [][]float32, what string) {
	t.Helper()
	require.Len(t, vk, len(cpu), what)
	n, diff, first := 0, 0, ""
	for i := range cpu {
		require.Len(t, vk[i], len(cpu[i]), what)
		for j := range cpu[i] {
			n++
			if math.Float32bits(vk[i][j]) != math.Float32bits(cpu[i][j]) {
				if diff == 0 {
					first = fmt.Sprintf("sequence %d element %d: backend %g, cpu %g", i, j, vk[i][j], cpu[i][j])
				}
				diff++
			}
		}
	}
	assert.LessOrEqual(t, diff, max(1, n/1000), "%s: %d of %d read-back elements differ from the CPU's; first: %s",
		what, diff, n, first)
}

// assertCloseF32 is assertClose for two float32 outputs.
func assertCloseF32(t *testing.T, want, got []float32, tol float64, what string) {
	t.Helper()
	w := make([]float64, len(want))
	for i, x := range want {
		w[i] = float64(x)
	}
	assertClose(t, w, got, tol, what)
}

// TestBackendDeviceInfo: each device describes itself as the kernels need it.
func TestBackendDeviceInfo(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string, _ *logWatch) {
		info, err := openBackend(t, backend).Info()
		require.NoError(t, err)
		assert.Equal(t, backend, info.Backend)
		assert.NotEmpty(t, info.Name)
		assert.Positive(t, info.MemoryBytes)
		assert.Positive(t, info.Threads)
		assert.Contains(t, []int{1, 4, 8, 16, 32, 64, 128}, info.SubgroupSize)
		for _, f := range Formats {
			assert.True(t, info.SupportsFormat(f), "format %s", f)
		}
		assert.True(t, info.Caps.Has(CapDecode|CapPrefill|CapLearnedSinks|CapWindow|CapMLA|CapHoles), "caps %#x", info.Caps)
		t.Logf("%s device: %s, subgroup %d, %d MiB", backend, info.Name, info.SubgroupSize, info.MemoryBytes>>20)
	})
}

// TestBackendAttendMatchesCPU: every format, GQA and MLA, every attention variant of attend_test.go
// (decode, chunks, learned sinks, window, window below the sinks, holes and a released page, prefill with
// window and sinks), on each backend and on the CPU with the same inputs.
func TestBackendAttendMatchesCPU(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string, _ *logWatch) {
		dev, cpu := openBackend(t, backend), openCPU(t)
		info, err := dev.Info()
		require.NoError(t, err)
		for gi, g := range testGeometries {
			for _, f := range Formats {
				t.Run(g.name+"/"+f.String(), func(t *testing.T) {
					cd, cc := pairedCaches(t, dev, cpu, withFormat(g.desc, f), g.lens, uint64(gi*10+int(f)))
					kd, vd := cd.read(t)
					kc, vc := cc.read(t)
					assertReadsMatch(t, kd, kc, "K")
					assertReadsMatch(t, vd, vc, "V")
					for ci, tc := range attendCases {
						seed := uint64(100*gi + 10*int(f) + ci)
						id := buildAttend(cd, tc, g.heads, rand.New(rand.NewPCG(seed, backendRNGSeed)))
						ic := buildAttend(cc, tc, g.heads, rand.New(rand.NewPCG(seed, backendRNGSeed)))
						err := Attend(dev, id.batch)
						if !info.Caps.Has(tc.needs) {
							assert.ErrorIs(t, err, ErrNotSupported, "%s: caps %#x lack %#x", tc.name, info.Caps, tc.needs)
							continue
						}
						require.NoError(t, err, tc.name)
						require.NoError(t, Attend(cpu, ic.batch), tc.name)
						requireWritten(t, id.batch.Out, tc.name+": out")
						assertClose(t, referenceAttend(cd, id, kd, vd), id.batch.Out, 1e-3, tc.name+": vs reference")
						assertCloseF32(t, ic.batch.Out, id.batch.Out, 2e-3, tc.name+": vs cpu")
					}
				})
			}
		}
	})
}

// TestBackendNothingVisible: rows whose tokens are all masked output exact zeros, with or without sinks.
func TestBackendNothingVisible(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string, _ *logWatch) {
		dev := openBackend(t, backend)
		rng := rand.New(rand.NewPCG(7, 8))
		for _, f := range []Format{FormatF32, FormatQ4, FormatKIVI2} {
			c := newCache(t, dev, withFormat(testGeometries[0].desc, f), []int{40, 70}, rng)
			for _, sinks := range []bool{false, true} {
				in := buildAttend(c, attendCase{holes: true, sinks: sinks}, 8, rng)
				for i := range in.batch.ValidMask {
					in.batch.ValidMask[i] = 0
				}
				require.NoError(t, Attend(dev, in.batch))
				for i, x := range in.batch.Out {
					require.Zero(t, x, "%s sinks=%v: out[%d]", f, sinks, i)
				}
			}
		}
	})
}

// TestBackendDecodeLoopMatchesCPU runs decode steps as an engine does (AppendAttend: one cgo call per
// step, two sequences whose KIVI rings flush along the way) on each backend and on the CPU.
func TestBackendDecodeLoopMatchesCPU(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string, _ *logWatch) {
		dev, cpu := openBackend(t, backend), openCPU(t)
		for fi, f := range Formats {
			t.Run(f.String(), func(t *testing.T) {
				final := []int{40, 75}
				mk := func(d *Device) *cache {
					return makeCache(t, d, withFormat(testGeometries[0].desc, f), final, rand.New(rand.NewPCG(uint64(fi), 3)))
				}
				cd, cc := mk(dev), mk(cpu)
				writtenD, writtenC := []int{final[0] - 12, final[1] - 12}, []int{final[0] - 12, final[1] - 12}
				cd.write(t, []int{0, 0}, writtenD)
				cc.write(t, []int{0, 0}, writtenC)
				for step := 0; step < 12; step++ {
					upto := []int{writtenD[0] + 1, writtenD[1] + 1}
					tc := attendCase{chunk: 16, window: 24, sinkTokens: 4, sinks: step%2 == 1}
					id := buildAttend(cd.view(upto), tc, 8, rand.New(rand.NewPCG(uint64(step), 4)))
					ic := buildAttend(cc.view(upto), tc, 8, rand.New(rand.NewPCG(uint64(step), 4)))
					wd, _ := cd.writeBatch(writtenD, upto)
					wc, _ := cc.writeBatch(writtenC, upto)
					require.NoError(t, AppendAttend(dev, &wd, id.batch), "step %d", step)
					require.NoError(t, AppendAttend(cpu, &wc, ic.batch), "step %d", step)
					kd, vd := cd.view(upto).read(t)
					kc, vc := cc.view(upto).read(t)
					assertReadsMatch(t, kd, kc, fmt.Sprintf("step %d K", step))
					assertReadsMatch(t, vd, vc, fmt.Sprintf("step %d V", step))
					assertClose(t, referenceAttend(cd.view(upto), id, kd, vd), id.batch.Out, 1e-3, fmt.Sprintf("step %d vs reference", step))
					assertCloseF32(t, ic.batch.Out, id.batch.Out, 2e-3, fmt.Sprintf("step %d vs cpu", step))
				}
			})
		}
	})
}

// TestBackendCopyForksPages: a copy-on-write fork of pages and residual slot reads like the original.
func TestBackendCopyForksPages(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string, _ *logWatch) {
		dev := openBackend(t, backend)
		for _, f := range []Format{FormatF16, FormatQ8, FormatKIVI4} {
			t.Run(f.String(), func(t *testing.T) {
				const n = 100
				desc := withFormat(testGeometries[0].desc, f)
				c := makeCache(t, dev, desc, []int{n}, rand.New(rand.NewPCG(11, 12)))
				c.writeAll(t)
				used := map[int32]bool{}
				for _, p := range c.pages[0] {
					used[p] = true
				}
				var free []int32
				for p := int32(0); p < int32(c.desc.Pages) && len(free) < len(c.pages[0]); p++ {
					if !used[p] {
						free = append(free, p)
					}
				}
				b := CopyBatch{SrcPages: c.pages[0][:len(free)], DstPages: free}
				require.NoError(t, c.pool.Copy(b))
				fork := append(append([]int32(nil), free...), c.pages[0][len(free):]...)
				ko, vo := c.read(t)
				forked := *c
				forked.pages = [][]int32{fork}
				kf, vf := forked.read(t)
				assert.Equal(t, ko, kf)
				assert.Equal(t, vo, vf)
			})
		}
	})
}

// TestBackendErrors: a pool far larger than the device is ErrNoMem; where the backend can inject faults,
// an injected allocation failure is ErrNoMem and the device keeps working, and an injected device loss is
// ErrDevice for that call and every later one on the device, closing it is clean, and another device of
// the backend is unaffected.
func TestBackendErrors(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string, log *logWatch) {
		log.expectFaults()
		dev := openBackend(t, backend)
		info, err := dev.Info()
		require.NoError(t, err)
		huge := PoolDesc{Format: FormatF32, KVHeads: 8, HeadDimK: 1024, HeadDimV: 1024, PageSize: 1024}
		pageBytes := uint64(1024 * 8 * 2048 * 4)
		huge.Pages = int(min(4*info.MemoryBytes/pageBytes+1, math.MaxInt32))
		_, err = NewPool(dev, huge)
		require.Error(t, err)
		assert.ErrorIs(t, err, ErrNoMem, "%v", err)

		small := withFormat(testGeometries[0].desc, FormatQ4)
		small.Pages = 4
		if err := InjectFault(backend, FaultAlloc, 0); errors.Is(err, ErrNotSupported) {
			t.Skipf("backend %s cannot inject faults: %v", backend, err)
		}
		mustInject(t, backend, FaultAlloc, -2) // Vulkan: VK_ERROR_OUT_OF_DEVICE_MEMORY at the next allocation
		_, err = NewPool(dev, small)
		mustInject(t, backend, FaultAlloc, 0)
		assert.ErrorIs(t, err, ErrNoMem, "%v", err)
		p, err := NewPool(dev, small)
		require.NoError(t, err, "after an injected allocation failure")
		require.NoError(t, p.Close())

		lost := openBackend(t, backend)
		c := newCache(t, lost, small, []int{50}, rand.New(rand.NewPCG(1, 2)))
		in := buildAttend(c, attendCase{}, 8, rand.New(rand.NewPCG(3, 4)))
		mustInject(t, backend, FaultSubmit, -4) // Vulkan: VK_ERROR_DEVICE_LOST at the next submit
		err = Attend(lost, in.batch)
		mustInject(t, backend, FaultSubmit, 0)
		require.Error(t, err)
		assert.ErrorIs(t, err, ErrDevice, "%v", err)
		var e *Error
		require.True(t, errors.As(err, &e))
		assert.NotEmpty(t, e.Msg)
		assert.ErrorIs(t, Attend(lost, in.batch), ErrDevice, "a later call on the lost device")
		_, err = NewPool(lost, small)
		assert.ErrorIs(t, err, ErrDevice, "a pool on the lost device")
		require.NoError(t, c.pool.Close())
		require.NoError(t, lost.Close())

		// the other device is unaffected
		c2 := newCache(t, dev, small, []int{50}, rand.New(rand.NewPCG(1, 2)))
		in2 := buildAttend(c2, attendCase{}, 8, rand.New(rand.NewPCG(3, 4)))
		require.NoError(t, Attend(dev, in2.batch))
	})
}

func mustInject(t *testing.T, backend string, site, code int) {
	t.Helper()
	if err := InjectFault(backend, site, code); err != nil {
		t.Fatal(err)
	}
}
