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

// TestLayoutMirrorMatchesC: the Go mirror of the page layout (what a build without cgo answers) equals
// the C core's (gokv_layout_sizes_get) for every format, every valid page size and several geometries.
func TestLayoutMirrorMatchesC(t *testing.T) {
	needNative(t)
	formats := []string{"f32", "f16", "q8:32", "q8:64", "q8:128", "q4:32", "q4:64", "q4:128"}
	for _, k := range []string{"kivi2", "kivi4"} {
		for _, g := range []int{32, 64, 128} {
			for _, r := range []int{0, g, 128, 256} {
				if r%g == 0 {
					formats = append(formats, fmt.Sprintf("%s:%d:%d", k, g, r))
				}
			}
		}
	}
	geoms := []struct {
		heads, dk, dv int
		mla           bool
	}{{1, 128, 128, false}, {8, 128, 128, false}, {2, 64, 32, false}, {3, 256, 128, false}, {4, 128, 64, true},
		{1, 576, 512, true}, {16, 4, 8, false}, {1, 1024, 1024, false}}
	checked := 0
	for _, name := range formats {
		f := MustParseFormat(name)
		for _, g := range geoms {
			if f.Validate(g.dk, g.dv) != nil {
				continue
			}
			for p := 8; p <= 1024; p += 8 {
				if f.Kind.IsKIVI() && p%f.Group != 0 {
					continue
				}
				c, err := f.Layout(g.heads, g.dk, g.dv, p, g.mla)
				require.NoError(t, err)
				goL := f.layoutGo(g.heads, g.dk, g.dv, p, g.mla)
				if c != goL {
					t.Fatalf("%s %d heads d %d/%d mla %v P %d: C %+v, Go %+v", name, g.heads, g.dk, g.dv, g.mla, p, c, goL)
				}
				checked++
			}
		}
	}
	assert.Greater(t, checked, 5000)
}

// TestLayoutRefusesInvalid: Layout refuses a geometry no pool can have, with and without cgo alike.
func TestLayoutRefusesInvalid(t *testing.T) {
	for _, tc := range []struct {
		format              string
		heads, dk, dv, page int
		mla                 bool
	}{
		{"f16", 0, 128, 128, 64, false}, {"f16", 1025, 128, 128, 64, false}, {"f16", 1, 128, 128, 0, false},
		{"f16", 1, 128, 128, 12, false}, {"f16", 1, 128, 128, 1032, false}, {"kivi2:64:64", 1, 128, 128, 32, false},
		{"q4:64", 1, 32, 32, 64, false}, {"f16", 1, 64, 128, 64, true}, {"f16", 1, 6, 8, 64, false},
	} {
		_, err := MustParseFormat(tc.format).Layout(tc.heads, tc.dk, tc.dv, tc.page, tc.mla)
		assert.ErrorIs(t, err, ErrInvalid, "%+v", tc)
	}
}
