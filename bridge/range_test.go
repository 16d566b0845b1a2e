package bridge

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestScoreOverflowIsRejected: finite inputs whose scores (scale·q·k) or value sums leave float32's
// range used to come back as all zeros on every path. They are refused, naming the query row and head
// (or the sequence), before anything is stored; huge inputs that stay in range still give the softmax.
func TestScoreOverflowIsRejected(t *testing.T) {
	dev := openCPU(t)
	flags := []AttendFlags{0, AttendForceScalar, AttendDequantBaseline}
	for _, f := range []Format{FormatF32, FormatF16, FormatQ4, FormatKIVI2} {
		t.Run(f.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(f)))
			c := newCache(t, dev, withFormat(testGeometries[0].desc, f), []int{40, 70}, rng)
			for _, fl := range flags {
				in := buildAttend(c, attendCase{flags: fl}, 8, rng)
				in.batch.Scale = 5e37
				err := Attend(dev, in.batch)
				assert.ErrorIs(t, err, ErrInvalid, "flags %v", fl)
				assert.ErrorContains(t, err, "query row")
				assert.ErrorContains(t, err, "head")
				assert.ErrorContains(t, err, "beyond float32's range")
				requireUntouched(t, in.batch.Out)
			}
		})
	}

	// f32 keys and queries of 1e19: q·k ~ 1e38·d overflows although each input is finite.
	rng := rand.New(rand.NewPCG(8, 9))
	desc := withFormat(testGeometries[0].desc, FormatF32)
	huge := newCacheWith(t, dev, desc, []int{30}, rng, func(c *cache) {
		for i := range c.k[0] {
			c.k[0][i] = 1e19
		}
	})
	for _, fl := range flags {
		in := buildAttend(huge, attendCase{flags: fl}, 8, rng)
		for i := range in.batch.Q {
			in.batch.Q[i] = 1e19
		}
		err := Attend(dev, in.batch)
		assert.ErrorIs(t, err, ErrInvalid)
		assert.ErrorContains(t, err, "query row 0, head 0")
	}

	// The same call through append-attend stores nothing: the new key alone would overflow the scores.
	small := newCache(t, dev, desc, []int{30}, rng)
	in := buildAttend(small, attendCase{}, 8, rng)
	in.batch.KVLen[0]++
	in.batch.QPos[0]++
	k, v := make([]float32, desc.KVHeads*desc.HeadDimK), make([]float32, desc.KVHeads*desc.HeadDimV)
	for i := range k {
		k[i] = 3e38
	}
	for i := range in.batch.Q {
		in.batch.Q[i] = 1
	}
	before, _ := small.read(t)
	w := WriteBatch{TokIndptr: []int32{0, 1}, PageIndptr: in.batch.PageIndptr, PageIDs: in.batch.PageIDs,
		StartPos: []int32{30}, K: k, V: v}
	err := AppendAttend(dev, &w, in.batch)
	assert.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, "largest stored |k|")
	after, _ := small.read(t)
	assert.Equal(t, before, after)

	// Values of 1e37 over 30 tokens: the unnormalized sum can overflow.
	bigV := newCacheWith(t, dev, desc, []int{30}, rng, func(c *cache) {
		for i := range c.v[0] {
			c.v[0][i] = 1e37
		}
	})
	err = Attend(dev, buildAttend(bigV, attendCase{}, 8, rng).batch)
	assert.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, "sequence 0: 30 tokens of values")

	// Large but representable: keys of 1e15, queries of 1e15, scale 1e-3: scores ~1e27 are finite, the
	// softmax is one-hot on the largest score, and the output is that token's value.
	peaked := newCacheWith(t, dev, desc, []int{30}, rng, func(c *cache) {
		row := desc.KVHeads * desc.HeadDimK
		for i := range c.k[0] {
			c.k[0][i] = 1e15 * float32(i/row) / 30
		}
	})
	for _, fl := range flags {
		in := buildAttend(peaked, attendCase{flags: fl}, 8, rng)
		in.batch.Scale = 1e-3
		for i := range in.batch.Q {
			in.batch.Q[i] = 1e15
		}
		require.NoError(t, Attend(dev, in.batch))
		dv := desc.HeadDimV
		for h := 0; h < 8; h++ {
			kvh := h / (8 / desc.KVHeads)
			for c := 0; c < dv; c++ {
				want := peaked.v[0][(29*desc.KVHeads+kvh)*dv+c]
				assert.InDelta(t, want, in.batch.Out[h*dv+c], 1e-6, "flags %v head %d channel %d", fl, h, c)
			}
		}
	}
}

func requireUntouched(t *testing.T, out []float32) {
	t.Helper()
	for i, x := range out {
		require.True(t, math.IsNaN(float64(x)), "out[%d] = %g was written by a rejected call", i, x)
	}
}
