package gokv

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/bridge"
)

// TestPageBytesMatchNativeLayout: Format.PageBytes and ResidualSlotBytes (what Plan counts) equal the
// bytes the C core's layout gives a pool (gokv_pool_sizes), for every format, page sizes that are and are
// not multiples of q4's 16-token key tiles, GQA and MLA geometries.
func TestPageBytesMatchNativeLayout(t *testing.T) {
	e := openTestEngine(t)
	geoms := []struct {
		heads, dk, dv int
		mla           bool
	}{{8, 128, 128, false}, {1, 32, 32, false}, {2, 64, 32, false}, {1, 576, 512, true}}
	for _, name := range []string{"f32", "f16", "q8:32", "q8:64", "q4:32", "q4:64", "q4:128", "kivi2:32:32",
		"kivi4:32:128", "kivi2:64:128", "kivi4:128:128"} {
		f := MustParseFormat(name)
		for _, g := range geoms {
			if f.Validate(g.dk, g.dv) != nil {
				continue
			}
			for _, p := range []int{8, 16, 24, 32, 40, 64, 96, 128, 256} {
				if f.Kind.IsKIVI() && p%f.Group != 0 {
					continue
				}
				desc := bridge.PoolDesc{Format: bridge.Format(f.Kind), GroupSize: f.Group, Residual: f.Residual,
					KVHeads: g.heads, HeadDimK: g.dk, HeadDimV: g.dv, VIsKPrefix: g.mla, PageSize: p, Pages: 1}
				if f.Kind.IsKIVI() {
					desc.ResidualSlots = 1
				}
				pool, err := bridge.NewPool(e.dev, desc)
				require.NoError(t, err)
				page, slot, err := pool.Sizes()
				require.NoError(t, err)
				require.NoError(t, pool.Close())
				what := fmt.Sprintf("%s %d heads d %d/%d mla %v P %d", name, g.heads, g.dk, g.dv, g.mla, p)
				assert.Equal(t, int64(page), f.PageBytes(g.heads, g.dk, g.dv, p, g.mla), what)
				assert.Equal(t, int64(slot), f.ResidualSlotBytes(g.heads, g.dk, g.dv, g.mla), what)
			}
		}
	}
}

// TestPlanEqualsStats: the planner's KV bytes for n tokens equal what a cache holding those tokens
// reports in use (Cache.Stats), for every format and page sizes with and without partial q4 key tiles.
func TestPlanEqualsStats(t *testing.T) {
	e := openTestEngine(t)
	spec := smallSpec(2, 32)
	for _, name := range []string{"f32", "f16", "q8", "q4", "kivi2:32:32", "kivi4:32:64"} {
		f := MustParseFormat(name)
		for _, p := range []int{8, 24, 32, 64} {
			if f.Kind.IsKIVI() && p%f.Group != 0 {
				continue
			}
			for _, n := range []int{1, 70, 200} {
				c, err := e.NewCache(spec, CacheOptions{Format: f, PageSize: p, MaxTokens: 256, MaxSequences: 1})
				require.NoError(t, err)
				s := mustSeq(t, c)
				st, err := c.Begin(prefill(s, n))
				require.NoError(t, err)
				rng := newRand(uint64(n))
				for l := range spec.Layers {
					require.NoError(t, st.Layer(l, nil, randVec(rng, n*2*32, 1), randVec(rng, n*2*32, 1), nil))
				}
				require.NoError(t, st.Commit())
				plan, err := Plan(spec, PlanOptions{Format: f, Context: n, Sequences: 1, PageSize: p})
				require.NoError(t, err)
				assert.Equal(t, uint64(plan.KVBytes), c.Stats().BytesUsed, "%s P %d, %d tokens", name, p, n)
				require.NoError(t, c.Close())
			}
		}
	}
}
