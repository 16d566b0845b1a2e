//go:build vulkan

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

// The Vulkan backend through the bridge (docs/architecture.md §8, cross-backend): the same inputs on "vulkan"
// and "cpu", every format, GQA and MLA, sinks, windows, holes, decode and prefill. Run with
// GOKV_VULKAN_VALIDATION=1 (as CI does, on lavapipe) so that the Khronos validation layer checks every call;
// any validation message fails the test that caused it.
//
// Tolerances: each backend against the float64 reference over its own Read output as in attend_test.go
// (1e-3 per element, relative to 1 + |reference|); Vulkan against the CPU twice that (each is within
// 1e-3 of the same reference). Reads must be bit-identical but for rare quantization codes one step
// apart (at most 1 in 1000 elements; the native suite checks the step size).

// vulkanRNGSeed is the seed every paired cache and batch is drawn from, so the two backends get the same
// pages, data, masks and queries.
const vulkanRNGSeed = 77

// watchVulkanValidation fails t if Vulkan validation messages arrive while it runs (including its
// cleanups registered later: device and pool closes), and prints the native log of that time.
func watchVulkanValidation(t *testing.T) {
	t.Helper()
	if v := os.Getenv("GOKV_VULKAN_VALIDATION"); v == "" || v == "0" {
		t.Log("GOKV_VULKAN_VALIDATION is not set: the Khronos validation layer is off for this run")
	}
	start := VulkanValidationMessages()
	var mu sync.Mutex
	var logs []string
	require.NoError(t, SetLogFunc(func(level int, backend, op, msg string) {
		mu.Lock()
		logs = append(logs, fmt.Sprintf("level %d %s %s: %s", level, backend, op, msg))
		mu.Unlock()
	}, LogWarn))
	t.Cleanup(func() {
		_ = SetLogFunc(nil, 0)
		if n := VulkanValidationMessages() - start; n != 0 {
			mu.Lock()
			defer mu.Unlock()
			t.Errorf("%d Vulkan validation message(s) during the test; native log (warnings and errors):\n%s", n,
				strings.Join(logs, "\n"))
		}
	})
}

// openVulkan opens the Vulkan backend's default device and closes it when the test ends.
func openVulkan(t testing.TB) *Device {
	t.Helper()
	dev, err := OpenDevice("vulkan", -1, 2)
	require.NoError(t, err, "the vulkan build tag links the Vulkan module; is a Vulkan device (lavapipe) installed?")
	t.Cleanup(func() { require.NoError(t, dev.Close()) })
	return dev
}

// pairedCaches builds the same cache on both devices from the same seed.
func pairedCaches(t *testing.T, vk, cpu *Device, desc PoolDesc, lens []int, seed uint64) (cv, cc *cache) {
	t.Helper()
	cv = newCache(t, vk, desc, lens, rand.New(rand.NewPCG(seed, vulkanRNGSeed)))
	cc = newCache(t, cpu, desc, lens, rand.New(rand.NewPCG(seed, vulkanRNGSeed)))
	require.Equal(t, cc.pages, cv.pages)
	return cv, cc
}

// assertReadsMatch compares the Vulkan read-back with the CPU's: bit for bit but for rare codes one step
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
					first = fmt.Sprintf("sequence %d element %d: vulkan %g, cpu %g", i, j, vk[i][j], cpu[i][j])
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

// TestVulkanDeviceInfo: the device describes itself as the shaders need it.
func TestVulkanDeviceInfo(t *testing.T) {
	watchVulkanValidation(t)
	assert.Contains(t, Backends(), "vulkan")
	info, err := openVulkan(t).Info()
	require.NoError(t, err)
	assert.Equal(t, "vulkan", info.Backend)
	assert.NotEmpty(t, info.Name)
	assert.Positive(t, info.MemoryBytes)
	assert.Contains(t, []int{4, 8, 16, 32, 64, 128}, info.SubgroupSize)
	for _, f := range Formats {
		assert.True(t, info.SupportsFormat(f), "format %s", f)
	}
	assert.True(t, info.Caps.Has(CapDecode|CapPrefill|CapLearnedSinks|CapWindow|CapMLA|CapHoles), "caps %#x", info.Caps)
	t.Logf("vulkan device: %s, subgroup %d, %d MiB", info.Name, info.SubgroupSize, info.MemoryBytes>>20)
}

// TestVulkanAttendMatchesCPU: every format, GQA and MLA, every attention variant of attend_test.go
// (decode, chunks, learned sinks, window, window below the sinks, holes and a released page, prefill with
// window and sinks) on both backends with the same inputs.
func TestVulkanAttendMatchesCPU(t *testing.T) {
	watchVulkanValidation(t)
	vk, cpu := openVulkan(t), openCPU(t)
	info, err := vk.Info()
	require.NoError(t, err)
	for gi, g := range testGeometries {
		for _, f := range Formats {
			t.Run(g.name+"/"+f.String(), func(t *testing.T) {
				cv, cc := pairedCaches(t, vk, cpu, withFormat(g.desc, f), g.lens, uint64(gi*10+int(f)))
				kv, vv := cv.read(t)
				kc, vc := cc.read(t)
				assertReadsMatch(t, kv, kc, "K")
				assertReadsMatch(t, vv, vc, "V")
				for ci, tc := range attendCases {
					seed := uint64(100*gi + 10*int(f) + ci)
					iv := buildAttend(cv, tc, g.heads, rand.New(rand.NewPCG(seed, vulkanRNGSeed)))
					ic := buildAttend(cc, tc, g.heads, rand.New(rand.NewPCG(seed, vulkanRNGSeed)))
					err := Attend(vk, iv.batch)
					if !info.Caps.Has(tc.needs) {
						assert.ErrorIs(t, err, ErrNotSupported, "%s: caps %#x lack %#x", tc.name, info.Caps, tc.needs)
						continue
					}
					require.NoError(t, err, tc.name)
					require.NoError(t, Attend(cpu, ic.batch), tc.name)
					requireWritten(t, iv.batch.Out, tc.name+": vulkan out")
					assertClose(t, referenceAttend(cv, iv, kv, vv), iv.batch.Out, 1e-3, tc.name+": vulkan vs reference")
					assertCloseF32(t, ic.batch.Out, iv.batch.Out, 2e-3, tc.name+": vulkan vs cpu")
				}
			})
		}
	}
}

// TestVulkanNothingVisible: rows whose tokens are all masked output exact zeros, with or without sinks.
func TestVulkanNothingVisible(t *testing.T) {
	watchVulkanValidation(t)
	vk := openVulkan(t)
	rng := rand.New(rand.NewPCG(7, 8))
	for _, f := range []Format{FormatF32, FormatQ4, FormatKIVI2} {
		c := newCache(t, vk, withFormat(testGeometries[0].desc, f), []int{40, 70}, rng)
		for _, sinks := range []bool{false, true} {
			in := buildAttend(c, attendCase{holes: true, sinks: sinks}, 8, rng)
			for i := range in.batch.ValidMask {
				in.batch.ValidMask[i] = 0
			}
			require.NoError(t, Attend(vk, in.batch))
			for i, x := range in.batch.Out {
				require.Zero(t, x, "%s sinks=%v: out[%d]", f, sinks, i)
			}
		}
	}
}

// TestVulkanDecodeLoopMatchesCPU runs decode steps as an engine does (AppendAttend: one cgo call per
// step, two sequences whose KIVI rings flush along the way) on both backends.
func TestVulkanDecodeLoopMatchesCPU(t *testing.T) {
	watchVulkanValidation(t)
	vk, cpu := openVulkan(t), openCPU(t)
	for fi, f := range Formats {
		t.Run(f.String(), func(t *testing.T) {
			final := []int{40, 75}
			mk := func(dev *Device) *cache {
				return makeCache(t, dev, withFormat(testGeometries[0].desc, f), final, rand.New(rand.NewPCG(uint64(fi), 3)))
			}
			cv, cc := mk(vk), mk(cpu)
			writtenV, writtenC := []int{final[0] - 12, final[1] - 12}, []int{final[0] - 12, final[1] - 12}
			cv.write(t, []int{0, 0}, writtenV)
			cc.write(t, []int{0, 0}, writtenC)
			for step := 0; step < 12; step++ {
				upto := []int{writtenV[0] + 1, writtenV[1] + 1}
				tc := attendCase{chunk: 16, window: 24, sinkTokens: 4, sinks: step%2 == 1}
				iv := buildAttend(cv.view(upto), tc, 8, rand.New(rand.NewPCG(uint64(step), 4)))
				ic := buildAttend(cc.view(upto), tc, 8, rand.New(rand.NewPCG(uint64(step), 4)))
				wv, _ := cv.writeBatch(writtenV, upto)
				wc, _ := cc.writeBatch(writtenC, upto)
				require.NoError(t, AppendAttend(vk, &wv, iv.batch), "step %d", step)
				require.NoError(t, AppendAttend(cpu, &wc, ic.batch), "step %d", step)
				kv, vv := cv.view(upto).read(t)
				kc, vc := cc.view(upto).read(t)
				assertReadsMatch(t, kv, kc, fmt.Sprintf("step %d K", step))
				assertReadsMatch(t, vv, vc, fmt.Sprintf("step %d V", step))
				assertClose(t, referenceAttend(cv.view(upto), iv, kv, vv), iv.batch.Out, 1e-3, fmt.Sprintf("step %d vs reference", step))
				assertCloseF32(t, ic.batch.Out, iv.batch.Out, 2e-3, fmt.Sprintf("step %d vulkan vs cpu", step))
			}
		})
	}
}

// TestVulkanCopyForksPages: a copy-on-write fork of pages and residual slot reads like the original.
func TestVulkanCopyForksPages(t *testing.T) {
	watchVulkanValidation(t)
	vk := openVulkan(t)
	for _, f := range []Format{FormatF16, FormatQ8, FormatKIVI4} {
		t.Run(f.String(), func(t *testing.T) {
			const n = 100
			desc := withFormat(testGeometries[0].desc, f)
			c := makeCache(t, vk, desc, []int{n}, rand.New(rand.NewPCG(11, 12)))
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
}

// TestVulkanErrors: a pool far larger than the device is ErrNoMem; an injected allocation failure is
// ErrNoMem and the device keeps working; an injected device loss is ErrDevice for that call and every
// later one on the device, and closing it is clean.
func TestVulkanErrors(t *testing.T) {
	watchVulkanValidation(t)
	vk := openVulkan(t)
	info, err := vk.Info()
	require.NoError(t, err)
	huge := PoolDesc{Format: FormatF32, KVHeads: 8, HeadDimK: 1024, HeadDimV: 1024, PageSize: 1024}
	pageBytes := uint64(1024 * 8 * 2048 * 4)
	huge.Pages = int(min(4*info.MemoryBytes/pageBytes+1, math.MaxInt32))
	_, err = NewPool(vk, huge)
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrNoMem, "%v", err)

	small := withFormat(testGeometries[0].desc, FormatQ4)
	small.Pages = 4
	mustInject(t, FaultAlloc, -2) // VK_ERROR_OUT_OF_DEVICE_MEMORY at the next allocation
	_, err = NewPool(vk, small)
	mustInject(t, FaultAlloc, 0)
	assert.ErrorIs(t, err, ErrNoMem, "%v", err)
	p, err := NewPool(vk, small)
	require.NoError(t, err, "after an injected allocation failure")
	require.NoError(t, p.Close())

	lost := openVulkan(t)
	c := newCache(t, lost, small, []int{50}, rand.New(rand.NewPCG(1, 2)))
	in := buildAttend(c, attendCase{}, 8, rand.New(rand.NewPCG(3, 4)))
	mustInject(t, FaultSubmit, -4) // VK_ERROR_DEVICE_LOST at the next submit
	err = Attend(lost, in.batch)
	mustInject(t, FaultSubmit, 0)
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
	c2 := newCache(t, vk, small, []int{50}, rand.New(rand.NewPCG(1, 2)))
	in2 := buildAttend(c2, attendCase{}, 8, rand.New(rand.NewPCG(3, 4)))
	require.NoError(t, Attend(vk, in2.batch))
}

func mustInject(t *testing.T, site, code int) {
	t.Helper()
	if err := InjectFault("vulkan", site, code); err != nil {
		t.Fatal(err)
	}
}
