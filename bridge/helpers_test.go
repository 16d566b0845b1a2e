package bridge

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// openCPU opens the CPU backend with two worker threads and closes it when the test ends.
func openCPU(t testing.TB) *Device {
	t.Helper()
	dev, err := OpenDevice("cpu", -1, 2)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, dev.Close()) })
	return dev
}

// cache is a pool with a few sequences written into it, and the original float32 K/V of each sequence.
type cache struct {
	pool  *Pool
	desc  PoolDesc
	lens  []int
	pages [][]int32   // page table of each sequence (distinct pages, shuffled)
	slots []int32     // residual slot of each sequence (KIVI), else nil
	k, v  [][]float32 // original rows of each sequence: [len, KVHeads, HeadDimK/V]
}

// newCache creates a pool for desc sized for lens and writes random K (with outlier channels, as real keys
// have) and V into it: most tokens in one batched prefill call, the last few in batched decode calls, so
// that KIVI residual rings flush into pages across calls.
func newCache(t testing.TB, dev *Device, desc PoolDesc, lens []int, rng *rand.Rand) *cache {
	t.Helper()
	return newCacheWith(t, dev, desc, lens, rng, nil)
}

// newCacheWith is newCache with a hook that may change the generated rows before they are written.
func newCacheWith(t testing.TB, dev *Device, desc PoolDesc, lens []int, rng *rand.Rand, fill func(c *cache)) *cache {
	t.Helper()
	c := makeCache(t, dev, desc, lens, rng)
	if fill != nil {
		fill(c)
	}
	c.writeAll(t)
	return c
}

// makeCache creates the pool and the rows of every sequence, without writing anything.
func makeCache(t testing.TB, dev *Device, desc PoolDesc, lens []int, rng *rand.Rand) *cache {
	t.Helper()
	P := desc.PageSize
	if P == 0 {
		P = DefaultPageSize
	}
	total := 0
	for _, l := range lens {
		total += (l + P - 1) / P
	}
	desc.Pages = total + 2
	if desc.Format.KIVI() {
		desc.ResidualSlots = len(lens)
	}
	pool, err := NewPool(dev, desc)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pool.Close()) })

	c := &cache{pool: pool, desc: pool.Desc(), lens: lens}
	perm := rng.Perm(desc.Pages)
	next := 0
	for i, l := range lens {
		n := (l + P - 1) / P
		table := make([]int32, n)
		for j := range table {
			table[j] = int32(perm[next])
			next++
		}
		c.pages = append(c.pages, table)
		if desc.Format.KIVI() {
			c.slots = append(c.slots, int32(len(lens)-1-i))
		}
		c.k = append(c.k, randKeys(rng, l, desc.KVHeads, desc.HeadDimK))
		if !desc.VIsKPrefix {
			c.v = append(c.v, randVec(rng, l*desc.KVHeads*desc.HeadDimV, 1))
		}
	}
	return c
}

// writeAll writes every sequence: most tokens in one batched prefill call, the last (up to) 3 in batched
// decode calls, so that KIVI residual rings flush into pages across calls.
func (c *cache) writeAll(t testing.TB) {
	t.Helper()
	lens := c.lens
	// Prefill all but the last (up to) 3 tokens of each sequence, then decode them one call per step.
	written := make([]int, len(lens))
	prefill := make([]int, len(lens))
	for i, l := range lens {
		prefill[i] = max(1, l-3)
	}
	c.write(t, written, prefill)
	for step := 0; step < 3; step++ {
		upto := make([]int, len(lens))
		for i, l := range lens {
			upto[i] = min(l, written[i]+1)
		}
		c.write(t, written, upto)
	}
	for i, l := range lens {
		require.Equal(t, l, written[i])
	}
}

// write appends tokens [written[i], upto[i]) of every sequence that has some, in one call.
func (c *cache) write(t testing.TB, written, upto []int) {
	t.Helper()
	if b, ok := c.writeBatch(written, upto); ok {
		require.NoError(t, c.pool.Write(b))
	}
}

// writeBatch builds the batch that appends tokens [written[i], upto[i]) and advances written; ok is false
// when no sequence has tokens to write.
func (c *cache) writeBatch(written, upto []int) (b WriteBatch, ok bool) {
	kvh, dk, dv := c.desc.KVHeads, c.desc.HeadDimK, c.desc.HeadDimV
	b = WriteBatch{TokIndptr: []int32{0}, PageIndptr: []int32{0}}
	if !c.desc.VIsKPrefix {
		b.V = []float32{}
	}
	for i := range c.lens {
		n := upto[i] - written[i]
		if n <= 0 {
			continue
		}
		b.TokIndptr = append(b.TokIndptr, b.TokIndptr[len(b.TokIndptr)-1]+int32(n))
		b.PageIDs = append(b.PageIDs, c.pages[i]...)
		b.PageIndptr = append(b.PageIndptr, int32(len(b.PageIDs)))
		b.StartPos = append(b.StartPos, int32(written[i]))
		if c.slots != nil {
			b.ResidualSlot = append(b.ResidualSlot, c.slots[i])
		}
		b.K = append(b.K, c.k[i][written[i]*kvh*dk:upto[i]*kvh*dk]...)
		if !c.desc.VIsKPrefix {
			b.V = append(b.V, c.v[i][written[i]*kvh*dv:upto[i]*kvh*dv]...)
		}
		written[i] = upto[i]
	}
	return b, len(b.TokIndptr) > 1
}

// view is the cache as it stands when sequence i holds lens[i] tokens.
func (c *cache) view(lens []int) *cache {
	v := *c
	v.lens = append([]int(nil), lens...)
	return &v
}

// read dequantizes every sequence in one call: what the attention kernels see.
func (c *cache) read(t testing.TB) (k, v [][]float32) {
	t.Helper()
	kvh, dk, dv := c.desc.KVHeads, c.desc.HeadDimK, c.desc.HeadDimV
	b := ReadBatch{TokIndptr: []int32{0}, PageIndptr: []int32{0}, ResidualSlot: c.slots}
	for i, l := range c.lens {
		b.TokIndptr = append(b.TokIndptr, b.TokIndptr[i]+int32(l))
		b.PageIDs = append(b.PageIDs, c.pages[i]...)
		b.PageIndptr = append(b.PageIndptr, int32(len(b.PageIDs)))
		b.KVLen = append(b.KVLen, int32(l))
		b.StartPos = append(b.StartPos, 0)
	}
	rows := int(b.TokIndptr[len(c.lens)])
	b.K = poisoned(rows * kvh * dk)
	if !c.desc.VIsKPrefix {
		b.V = poisoned(rows * kvh * dv)
	}
	require.NoError(t, c.pool.Read(b))
	requireWritten(t, b.K, "read K")
	requireWritten(t, b.V, "read V")
	off := 0
	for _, l := range c.lens {
		k = append(k, b.K[off*kvh*dk:(off+l)*kvh*dk])
		if b.V != nil {
			v = append(v, b.V[off*kvh*dv:(off+l)*kvh*dv])
		}
		off += l
	}
	return k, v
}

// randKeys draws keys ~ N(0, 1) with two outlier channels per head scaled by 8, as real keys have.
func randKeys(rng *rand.Rand, rows, heads, dim int) []float32 {
	x := randVec(rng, rows*heads*dim, 1)
	out1, out2 := dim/3, dim-1
	for r := 0; r < rows*heads; r++ {
		x[r*dim+out1] *= 8
		x[r*dim+out2] *= 8
	}
	return x
}

func randVec(rng *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * scale)
	}
	return x
}

// poisoned returns a buffer of NaNs, so a test can check that a call wrote every element.
func poisoned(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(math.NaN())
	}
	return x
}

func requireWritten(t testing.TB, x []float32, what string) {
	t.Helper()
	for i, v := range x {
		if math.IsNaN(float64(v)) {
			require.Failf(t, "element not written", "%s: element %d of %d is still the NaN poison", what, i, len(x))
		}
	}
}
