package gokv

import (
	"math"
	"math/bits"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// weirdMass draws n attention masses as a policy may be fed them: mostly in [0, 1], some zero, huge,
// negative, infinite or NaN.
func weirdMass(rng interface {
	IntN(int) int
	Float64() float64
}, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch rng.IntN(12) {
		case 0:
			x[i] = 0
		case 1:
			x[i] = float32(math.NaN())
		case 2:
			x[i] = float32(math.Inf(1))
		case 3:
			x[i] = float32(math.Inf(-1))
		case 4:
			x[i] = -float32(rng.Float64())
		case 5:
			x[i] = 1e30
		default:
			x[i] = float32(rng.Float64())
		}
	}
	return x
}

func popcount(b tokenBits) int {
	n := 0
	for _, w := range b {
		n += bits.OnesCount32(w)
	}
	return n
}

// TestTokenRulesNeverHideSinksOrRecent is the property test of the sink rule: whatever mass H2O or SnapKV
// is fed (NaN, infinities, negatives, ties), the cache's decide never hides a sink token or one of the
// protected newest tokens, never unhides a token, keeps its hidden count exact, and holds every
// (sequence, layer, kv head) to its budget.
func TestTokenRulesNeverHideSinksOrRecent(t *testing.T) {
	rng := newRand(71)
	for iter := 0; iter < 3000; iter++ {
		sinks := rng.IntN(6)
		protect := rng.IntN(20)
		var policy EvictionPolicy
		budget := protect + sinks + 1 + rng.IntN(24)
		if rng.IntN(2) == 0 {
			policy = H2O{Budget: budget, Recent: protect}
		} else {
			policy = SnapKV{Budget: budget, Window: max(protect, 1), Kernel: 1 + 2*rng.IntN(5), AvgPool: rng.IntN(2) == 0}
			protect = max(protect, 1)
			budget = max(budget, protect+sinks+1)
			policy = SnapKV{Budget: budget, Window: protect, Kernel: policy.(SnapKV).Kernel, AvgPool: policy.(SnapKV).AvgPool}
		}
		rule, err := policy.evictionRule()
		require.NoError(t, err, "%#v", policy)
		require.NoError(t, rule.tokens.check(sinks))
		var hs headState
		n := 0
		for step := 0; step < 25; step++ {
			n += 1 + rng.IntN(9)
			before := append(tokenBits(nil), hs.hidden...)
			hid := rule.tokens.decide(&hs, n, sinks, weirdMass(rng, n+rng.IntN(3)-1))
			for _, tok := range hid {
				require.GreaterOrEqual(t, tok, sinks, "%#v hid sink token %d", policy, tok)
				require.Less(t, tok, n-protect, "%#v hid token %d of the %d newest of %d", policy, tok, protect, n)
				require.False(t, before.has(tok), "hid token %d twice", tok)
			}
			for tok := 0; tok < n; tok++ {
				if before.has(tok) {
					require.True(t, hs.hidden.has(tok), "token %d came back", tok)
				}
				if tok < sinks || tok >= n-protect {
					require.False(t, hs.hidden.has(tok), "%#v: token %d of %d is hidden (sinks %d)", policy, tok, n, sinks)
				}
			}
			require.Equal(t, popcount(hs.hidden), hs.nHidden)
			require.LessOrEqual(t, hs.visible(n), budget, "%#v: %d of %d tokens visible", policy, hs.visible(n), n)
			require.Equal(t, min(n, budget), hs.visible(n), "%#v hid more than the budget needs", policy)
		}
	}
}

// TestH2OHidesTheLightest: H2O hides the candidates with the least accumulated mass, the older first on
// ties, and never the sinks or recent tokens however light.
func TestH2OHidesTheLightest(t *testing.T) {
	rule, err := H2O{Budget: 6, Recent: 2}.evictionRule()
	require.NoError(t, err)
	var hs headState
	//                 sinks   candidates 2..7          recent
	scores := []float32{0, 0, 5, 1, 0.5, 3, 1, 2, 0, 0}
	hid := rule.tokens.decide(&hs, 10, 2, scores)
	assert.Equal(t, []int{3, 4, 6, 7}, hid) // keep 2 (5) and 5 (3); 3 and 6 tie at 1: both go (4 to drop)
	assert.Equal(t, 6, hs.visible(10))
	// One to drop (a decode step) scans instead of sorting, with the same order: NaN and -Inf lowest,
	// ties to the older.
	nan, inf := float32(math.NaN()), float32(math.Inf(-1))
	assert.Equal(t, []int{1}, rule.tokens.choose([]float32{3, nan, 1, inf}, 1))
	assert.Equal(t, []int{1, 3}, rule.tokens.choose([]float32{3, nan, 1, inf}, 2))
	assert.Equal(t, []int{2}, rule.tokens.choose([]float32{3, 2, 1, 1}, 1))
}

// TestSnapKVPools: SnapKV ranks by pooled mass, so the neighbours of a heavy token are kept with it (max
// pooling), and average pooling divides by the kernel with zero padding.
func TestSnapKVPools(t *testing.T) {
	assert.Equal(t, []float32{1, 9, 9, 9, 3, 3}, pool1D([]float32{1, 0, 9, 0, 0, 3}, 3, false))
	assert.Equal(t, []float32{1.0 / 3, 10.0 / 3, 3, 3, 1, 1}, pool1D([]float32{1, 0, 9, 0, 0, 3}, 3, true))
	rule, err := SnapKV{Budget: 5, Window: 2, Kernel: 3}.evictionRule()
	require.NoError(t, err)
	var hs headState
	// prompt of 12: sink 0, candidates 1..9, window 10..11; one heavy token at 5: pooled, 4, 5 and 6 tie
	// at 8 and the older, 4, goes first.
	scores := []float32{9, 0.1, 0.2, 0, 0, 8, 0, 0, 0.3, 0, 9, 9}
	rule.tokens.decide(&hs, 12, 1, scores)
	for tok := 0; tok < 12; tok++ {
		assert.Equal(t, !(tok == 0 || tok == 5 || tok == 6 || tok == 10 || tok == 11), hs.hidden.has(tok), "token %d", tok)
	}
}

// TestTokenPolicyValidation: errors name the policy and the field.
func TestTokenPolicyValidation(t *testing.T) {
	for _, tc := range []struct {
		p    EvictionPolicy
		want string
	}{
		{H2O{Budget: 0, Recent: 0}, "Budget must be >= 1"},
		{H2O{Budget: 8, Recent: -1}, "Recent must be >= 0"},
		{H2O{Budget: 8, Recent: 8}, "Budget must be > Recent"},
		{SnapKV{Budget: 8, Window: 0}, "Window must be >= 1"},
		{SnapKV{Budget: 8, Window: 8}, "Budget must be > Window"},
		{SnapKV{Budget: 8, Window: 2, Kernel: 4}, "Kernel must be odd"},
		{&SnapKV{Budget: -1, Window: 2}, "Budget must be >= 1"},
	} {
		_, err := resolveEviction(tc.p)
		assert.ErrorContains(t, err, tc.want, "%#v", tc.p)
		assert.ErrorContains(t, err, "Eviction ", "%#v", tc.p)
	}
	rule, err := resolveEviction(SnapKV{Budget: 16, Window: 8})
	require.NoError(t, err)
	assert.Equal(t, DefaultSnapKVKernel, rule.tokens.kernel)
	assert.ErrorContains(t, rule.tokens.check(9), "Budget 16 must be >= Window 8 + the model's 9 sink tokens")
	for _, p := range []EvictionPolicy{(*H2O)(nil), (*SnapKV)(nil)} {
		rule, err := resolveEviction(p)
		require.NoError(t, err)
		assert.Nil(t, rule.tokens)
	}
}

// TestTokenBits: the bitset behind per-kv-head visibility.
func TestTokenBits(t *testing.T) {
	var b tokenBits
	for _, x := range []int{0, 5, 31, 32, 33, 64, 100} {
		b.set(x)
	}
	assert.True(t, b.has(33))
	assert.False(t, b.has(34))
	assert.False(t, b.has(1000))
	assert.False(t, b.has(-1))
	for x := 0; x < 128; x++ {
		b.set(x)
	}
	assert.True(t, b.all(0, 128))
	assert.True(t, b.all(7, 70))
	assert.False(t, b.all(0, 129))
	mask := make([]uint32, 5)
	b.maskWords(mask)
	assert.Equal(t, []uint32{0, 0, 0, 0, ^uint32(0)}, mask)
	assert.Equal(t, 128-70, b.clearFrom(70))
	assert.Equal(t, 70, popcount(b))
	assert.Len(t, b, 3)
}
