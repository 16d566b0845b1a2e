package bridge

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// geometries used by the end-to-end tests: GQA with two kv heads, and MLA (V is a prefix of K, d_v < d_qk).
var testGeometries = []struct {
	name  string
	desc  PoolDesc
	lens  []int
	heads int // query heads
}{
	{"gqa", PoolDesc{KVHeads: 2, HeadDimK: 64, HeadDimV: 64, PageSize: 32}, []int{1, 45, 150}, 8},
	{"mla", PoolDesc{KVHeads: 1, HeadDimK: 96, HeadDimV: 64, VIsKPrefix: true, PageSize: 32}, []int{33, 100}, 4},
}

// withFormat fills the format fields of a geometry: groups of 32, and a KIVI residual of one group.
func withFormat(d PoolDesc, f Format) PoolDesc {
	d.Format = f
	if f.Quantized() {
		d.GroupSize = 32
	}
	if f.KIVI() {
		d.Residual = 32
	}
	return d
}

func TestBackendsAndVersion(t *testing.T) {
	assert.Equal(t, ABIHeaderVersion, ABIVersion())
	b := Backends()
	require.NotEmpty(t, b)
	assert.Equal(t, "cpu", b[0])
	for _, f := range Formats {
		assert.NotContains(t, f.String(), "format(", "format %d has no ABI name", int(f))
	}
	assert.Equal(t, "format(99)", Format(99).String())
	assert.Equal(t, 96, KIVIQuantizedLen(150, 32, 32))
	assert.Equal(t, 0, KIVIQuantizedLen(20, 32, 32))
}

func TestDeviceInfo(t *testing.T) {
	dev := openCPU(t)
	info, err := dev.Info()
	require.NoError(t, err)
	assert.Equal(t, "cpu", info.Backend)
	assert.NotEmpty(t, info.Name)
	assert.Positive(t, info.Threads)
	assert.Positive(t, info.SubgroupSize)
	assert.Positive(t, info.MemoryBytes)
	assert.True(t, info.Caps.Has(CapDecode), "caps %#x", info.Caps)
	for _, f := range Formats {
		assert.True(t, info.SupportsFormat(f), "the CPU backend must store %v", f)
	}
	t.Logf("cpu device: %q features %q, %d threads, caps %#x", info.Name, info.Features, info.Threads, info.Caps)
}

// TestRoundTrip writes random K/V in every format and checks each dequantized element against the
// bound of its format (docs/architecture.md §4), fp16 rounding of scale and bias included.
func TestRoundTrip(t *testing.T) {
	dev := openCPU(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, g := range testGeometries {
		for _, f := range Formats {
			t.Run(g.name+"/"+f.String(), func(t *testing.T) {
				c := newCache(t, dev, withFormat(g.desc, f), g.lens, rng)
				k, v := c.read(t)
				for i, l := range c.lens {
					checkRoundTrip(t, c.desc, fmt.Sprintf("seq %d K", i), c.k[i], k[i], l, c.desc.HeadDimK, true)
					if !c.desc.VIsKPrefix {
						checkRoundTrip(t, c.desc, fmt.Sprintf("seq %d V", i), c.v[i], v[i], l, c.desc.HeadDimV, false)
					}
				}
			})
		}
	}
}

// TestConstantGroup checks the known value of docs/architecture.md §4: a constant group stores s = 0 and
// reconstructs exactly (never NaN).
func TestConstantGroup(t *testing.T) {
	dev := openCPU(t)
	for _, f := range []Format{FormatQ8, FormatQ4, FormatKIVI2, FormatKIVI4} {
		t.Run(f.String(), func(t *testing.T) {
			desc := withFormat(PoolDesc{KVHeads: 1, HeadDimK: 32, HeadDimV: 32, PageSize: 32}, f)
			desc.Residual = 0
			c := newCacheWith(t, dev, desc, []int{64}, rand.New(rand.NewPCG(3, 4)), func(c *cache) {
				for i := range c.k[0] {
					c.k[0][i], c.v[0][i] = 0.5, -1.25
				}
			})
			k, v := c.read(t)
			for i := range k[0] {
				require.Equal(t, float32(0.5), k[0][i], "K element %d", i)
				require.Equal(t, float32(-1.25), v[0][i], "V element %d", i)
			}
		})
	}
}

// checkRoundTrip compares one sequence's original rows x with what Read returned, element by element.
func checkRoundTrip(t *testing.T, d PoolDesc, what string, x, got []float32, n, dim int, isK bool) {
	t.Helper()
	require.Len(t, got, len(x), what)
	H := d.KVHeads
	nq := 0 // tokens quantized into pages (KIVI); the rest are f16 in the residual ring
	if d.Format.KIVI() {
		nq = KIVIQuantizedLen(n, d.GroupSize, d.Residual)
	}
	at := func(t, h, c int) int { return (t*H+h)*dim + c }
	bad, worstRatio := 0, 0.0
	for tok := 0; tok < n; tok++ {
		for h := 0; h < H; h++ {
			for c := 0; c < dim; c++ {
				xv, gv := float64(x[at(tok, h, c)]), float64(got[at(tok, h, c)])
				var bound, step float64
				switch {
				case d.Format == FormatF32:
					bound = 0
				case d.Format == FormatF16, d.Format.KIVI() && tok >= nq:
					bound = math.Abs(xv)*0x1p-11 + 0x1p-25
				case d.Format.KIVI() && isK: // per channel over g consecutive tokens
					t0 := tok / d.GroupSize * d.GroupSize
					vals := make([]float32, d.GroupSize)
					for j := range vals {
						vals[j] = x[at(t0+j, h, c)]
					}
					bound, step = quantBound(vals, d.Format.Bits())
				default: // per token, g consecutive channels
					c0 := c / d.GroupSize * d.GroupSize
					bound, step = quantBound(x[at(tok, h, c0):at(tok, h, c0)+d.GroupSize], d.Format.Bits())
				}
				err := math.Abs(gv - xv)
				if !(err <= bound) {
					if bad < 5 {
						t.Errorf("%s: token %d head %d channel %d: got %g, want %g ± %g", what, tok, h, c, gv, xv, bound)
					}
					bad++
				}
				if step > 0 {
					worstRatio = max(worstRatio, err/(step/2))
				}
			}
		}
	}
	assert.Zero(t, bad, "%s: elements outside the %v bound", what, d.Format)
	if d.Format.Quantized() && (!d.Format.KIVI() || nq > 0) && n*dim >= 256 {
		// The bound is not vacuous: the worst error reaches a good part of the half step of the claimed bits.
		assert.Greater(t, worstRatio, 0.5, "%s: worst error / half step; data stored finer than %d bits?", what,
			d.Format.Bits())
	}
}

// quantBound is the worst reconstruction error of one affine group (docs/architecture.md §4) with fp16 s and b:
// half a step, plus what the fp16 rounding of s (times the top code) and of b can add, plus f32 slack.
// It also returns the step s.
func quantBound(vals []float32, bits int) (bound, step float64) {
	mn, mx := math.Inf(1), math.Inf(-1)
	for _, v := range vals {
		mn, mx = min(mn, float64(v)), max(mx, float64(v))
	}
	levels := float64(int(1)<<bits - 1)
	s := (mx - mn) / levels
	mag := max(math.Abs(mn), math.Abs(mx))
	return s*(0.5+1e-3) + levels*s*0x1p-11 + math.Abs(mn)*0x1p-11 + mag*0x1p-20 + 1e-7, s
}
