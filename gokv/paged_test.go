package gokv

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPagedPool: on every backend, a pool with caller-owned page tables stores and attends as the float64
// reference says, the dequantize-then-attend baseline agrees with the fused path, and misuse is an *Error.
func TestPagedPool(t *testing.T) {
	forEachBackend(t, testPagedPool)
}

func testPagedPool(t *testing.T, backend string) {
	e := openWatched(t, backend)
	const hkv, hq, d, n, P = 2, 4, 32, 40, 32
	// kivi2:32:32 keeps all 40 tokens in its fp16 ring (n_quant = 0): near exact.
	for name, tolerance := range map[string]float64{"f32": 1e-3, "q8": 3e-2, "kivi2:32:32": 5e-3} {
		f := MustParseFormat(name)
		o := PagedPoolOptions{Format: f, KVHeads: hkv, HeadDimK: d, HeadDimV: d, PageSize: P, Pages: 4}
		if f.Kind.IsKIVI() {
			o.ResidualSlots = 1
		}
		pool, err := e.NewPagedPool(o)
		require.NoError(t, err, name)
		l, err := f.Layout(hkv, d, d, P, false)
		require.NoError(t, err)
		assert.Equal(t, l, pool.Layout(), name)
		rng := newRand(5)
		k, v, q := randVec(rng, n*hkv*d, 1), randVec(rng, n*hkv*d, 1), randVec(rng, hq*d, 1)
		pages := []int32{3, 1}
		var slot []int32
		if f.Kind.IsKIVI() {
			slot = []int32{0}
		}
		require.NoError(t, pool.Write(PagedWrite{TokIndptr: []int32{0, n}, PageIndptr: []int32{0, 2}, PageIDs: pages,
			StartPos: []int32{0}, ResidualSlot: slot, K: k, V: v}), name)
		a := PagedAttend{QIndptr: []int32{0, 1}, PageIndptr: []int32{0, 2}, PageIDs: pages, KVLen: []int32{n},
			QPos: []int32{n - 1}, ResidualSlot: slot, HeadsQ: hq, Q: q, Out: make([]float32, hq*d),
			Scale: float32(1 / math.Sqrt(d))}
		require.NoError(t, pool.Attend(a), name)
		want := make([]float64, hq*d) // float64 attention over the original K/V
		for h := range hq {
			kh := h / (hq / hkv)
			s := make([]float64, n)
			m := math.Inf(-1)
			for tok := range n {
				for c := range d {
					s[tok] += float64(q[h*d+c]) * float64(k[(tok*hkv+kh)*d+c])
				}
				s[tok] /= math.Sqrt(d)
				m = max(m, s[tok])
			}
			sum := 0.0
			for tok := range n {
				s[tok] = math.Exp(s[tok] - m)
				sum += s[tok]
			}
			for tok := range n {
				for c := range d {
					want[h*d+c] += s[tok] / sum * float64(v[(tok*hkv+kh)*d+c])
				}
			}
		}
		assertClose(t, want, a.Out, tolerance, "%s vs float64", name)
		base := a
		base.Out, base.Baseline = make([]float32, hq*d), true
		require.NoError(t, pool.Attend(base), name)
		for i := range base.Out {
			assert.InDelta(t, a.Out[i], base.Out[i], 1e-3*(1+math.Abs(float64(a.Out[i]))), "%s baseline out[%d]", name, i)
		}
		bad := a
		bad.HeadsQ = 3
		assert.ErrorIs(t, pool.Attend(bad), ErrInvalid, name)
		require.NoError(t, pool.Close())
		require.NoError(t, pool.Close(), "Close twice")
	}
	_, err := e.NewPagedPool(PagedPoolOptions{Format: MustParseFormat("q4:64"), KVHeads: 1, HeadDimK: 32, HeadDimV: 32, Pages: 1})
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = e.NewPagedPool(PagedPoolOptions{Format: MustParseFormat("f16"), KVHeads: 1, HeadDimK: 32, HeadDimV: 32})
	assert.ErrorIs(t, err, ErrInvalid, "no pages")
	pool, err := e.NewPagedPool(PagedPoolOptions{Format: MustParseFormat("f16"), KVHeads: 1, HeadDimK: 32, HeadDimV: 32, Pages: 1})
	require.NoError(t, err)
	assert.Equal(t, DefaultPageSize, pool.Options().PageSize)
	require.NoError(t, e.Close())
	assert.ErrorIs(t, pool.Attend(PagedAttend{}), ErrClosed, "after the engine closed")
	_, err = e.NewPagedPool(PagedPoolOptions{})
	assert.ErrorIs(t, err, ErrClosed)
}

// TestEngineMeasure: every backend measures a positive read bandwidth.
func TestEngineMeasure(t *testing.T) {
	forEachBackend(t, testEngineMeasure)
}

func testEngineMeasure(t *testing.T, backend string) {
	e := openWatched(t, backend)
	c, err := e.Measure(4 << 20)
	require.NoError(t, err)
	assert.Positive(t, c.ReadGBps)
	assert.NotEmpty(t, c.Method)
	_, err = e.Measure(-1)
	assert.ErrorIs(t, err, ErrInvalid)
}
