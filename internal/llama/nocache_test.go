package llama

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/gokv"
)

// noCacheAttention is plain causal attention over every key and value a sequence has had, kept in Go
// slices per sequence and layer, in float64: what an f32 cache must reproduce. Sequences are only
// identities here; their lengths are this type's own.
type noCacheAttention struct {
	m    *Model
	hist map[*gokv.Sequence]*noCacheHistory
	// window > 0 masks as gokv.SinkWindow{Sinks: sinks, Window: window}: a query at p sees t < sinks and
	// t > p - window.
	window, sinks int
}

type noCacheHistory struct {
	n    int
	k, v [][]float32 // per layer: [n, HeadsKV, HeadDim]
}

func (a *noCacheAttention) begin(entries []Entry) (attentionStep, []int, error) {
	start := make([]int, len(entries))
	for i, e := range entries {
		h := a.hist[e.Seq]
		if h == nil {
			h = &noCacheHistory{k: make([][]float32, a.m.Config.Layers), v: make([][]float32, a.m.Config.Layers)}
			a.hist[e.Seq] = h
		}
		start[i] = h.n
	}
	return &noCacheStep{a: a, entries: entries}, start, nil
}

type noCacheStep struct {
	a       *noCacheAttention
	entries []Entry
}

func (s *noCacheStep) layer(l int, q, k, v, out []float32) error {
	c := s.a.m.Config
	d, Hq, Hkv := c.HeadDim, c.HeadsQ, c.HeadsKV
	scale := 1 / math.Sqrt(float64(d))
	row := 0
	for _, e := range s.entries {
		h := s.a.hist[e.Seq]
		n := len(e.Tokens)
		// The step's keys and values join the history now; commit advances the length.
		keys := append(h.k[l][:h.n*Hkv*d:h.n*Hkv*d], k[row*Hkv*d:(row+n)*Hkv*d]...)
		vals := append(h.v[l][:h.n*Hkv*d:h.n*Hkv*d], v[row*Hkv*d:(row+n)*Hkv*d]...)
		h.k[l], h.v[l] = keys, vals
		for j := 0; j < n; j++ {
			p := h.n + j
			for head := 0; head < Hq; head++ {
				kvh := head / (Hq / Hkv)
				qr := q[((row+j)*Hq+head)*d : ((row+j)*Hq+head+1)*d]
				scores := make([]float64, p+1)
				m := math.Inf(-1)
				visible := func(t int) bool { return s.a.window == 0 || t < s.a.sinks || t > p-s.a.window }
				for t := 0; t <= p; t++ {
					if !visible(t) {
						continue
					}
					kt := keys[(t*Hkv+kvh)*d : (t*Hkv+kvh+1)*d]
					dot := 0.0
					for i := range qr {
						dot += float64(qr[i]) * float64(kt[i])
					}
					scores[t] = dot * scale
					m = max(m, scores[t])
				}
				sink := math.Inf(-1)
				if c.LearnedSinks {
					sink = float64(s.a.m.w.layers[l].sinks[head])
					m = max(m, sink)
				}
				den := math.Exp(sink - m)
				acc := make([]float64, d)
				for t := 0; t <= p; t++ {
					if !visible(t) {
						continue
					}
					w := math.Exp(scores[t] - m)
					den += w
					vt := vals[(t*Hkv+kvh)*d : (t*Hkv+kvh+1)*d]
					for i := range acc {
						acc[i] += w * float64(vt[i])
					}
				}
				o := out[((row+j)*Hq+head)*d : ((row+j)*Hq+head+1)*d]
				for i := range o {
					o[i] = float32(acc[i] / den)
				}
			}
		}
		row += n
	}
	return nil
}

func (s *noCacheStep) commit() error {
	for _, e := range s.entries {
		s.a.hist[e.Seq].n += len(e.Tokens)
	}
	return nil
}

func (s *noCacheStep) abort() error { return nil }

// heldout returns the first n bytes of the held-out text as token ids.
func heldout(t *testing.T, n int) []int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "models", "heldout", "kjv-heldout.txt"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(data), n)
	ids := make([]int, n)
	for i := range ids {
		ids[i] = int(data[i])
	}
	return ids
}

// TestCacheMatchesNoCache runs the same forward pass twice, once with its attention through an f32 gokv
// cache and once through noCacheAttention, over a batch of three sequences of different lengths: one
// prefill step, then token-by-token decode steps of all three. Every logit row must agree to 1e-4 (relErr).
// Under SinkWindow the cache releases pages (16 tokens each) as the sequences grow past the window, and
// the reference masks the same positions.
func TestCacheMatchesNoCache(t *testing.T) {
	const tolerance = 1e-4
	eng := openCPU(t)
	text := heldout(t, 1000)
	for _, tc := range []struct {
		name     string
		eviction *gokv.SinkWindow
		decode   int
	}{
		{"full", nil, 10},
		{"sinkwindow", &gokv.SinkWindow{Sinks: 4, Window: 24}, 40},
	} {
		for _, name := range testModels {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				m, err := Load(modelDir(name))
				require.NoError(t, err)
				bos := m.Config.BOS
				cache, err := m.NewCache(eng, gokv.CacheOptions{Format: gokv.Format{Kind: gokv.F32}, MaxTokens: 512,
					MaxSequences: 4, PageSize: 16, Eviction: tc.eviction})
				require.NoError(t, err)
				defer cache.Close()
				withCache := m.NewRunner(cache)
				ref := &noCacheAttention{m: m, hist: map[*gokv.Sequence]*noCacheHistory{}}
				if tc.eviction != nil {
					ref.window, ref.sinks = tc.eviction.Window, tc.eviction.Sinks
				}
				noCache := &Runner{m: m, attn: ref}

				// Three sequences: BOS + a piece of text each, prompts of 3, 20 and 45 tokens.
				prompts := [][]int{{bos}, {bos}, {bos}}
				prompts[0] = append(prompts[0], text[0:2]...)
				prompts[1] = append(prompts[1], text[100:119]...)
				prompts[2] = append(prompts[2], text[300:344]...)
				next := []int{2, 119, 344} // where each sequence's decoded bytes come from
				entries := make([]Entry, len(prompts))
				for i, p := range prompts {
					seq, err := cache.NewSequence()
					require.NoError(t, err)
					entries[i] = Entry{Seq: seq, Tokens: p, AllLogits: true}
				}
				worst := 0.0
				compare := func(step string, a, b Output) {
					for i := range a.Logits {
						ra, rb := rows(a.Logits[i], m.Config.VocabSize), rows(b.Logits[i], m.Config.VocabSize)
						require.Len(t, ra, len(rb))
						for j := range ra {
							e := relErr(ra[j], rb[j])
							worst = max(worst, e)
							assert.Less(t, e, tolerance, "%s, sequence %d, row %d", step, i, j)
						}
					}
				}
				a, err := withCache.Step(entries...)
				require.NoError(t, err)
				b, err := noCache.Step(entries...)
				require.NoError(t, err)
				compare("prefill", a, b)
				for s := 0; s < tc.decode; s++ {
					for i := range entries {
						entries[i].Tokens = []int{text[next[i]+s]}
						entries[i].AllLogits = false
					}
					a, err := withCache.Step(entries...)
					require.NoError(t, err)
					b, err := noCache.Step(entries...)
					require.NoError(t, err)
					compare(fmt.Sprintf("decode step %d", s), a, b)
				}
				for i, e := range entries {
					assert.Equal(t, len(prompts[i])+tc.decode, e.Seq.Len(), "sequence %d length", i)
				}
				st := cache.Stats()
				if tc.eviction != nil {
					// 85 tokens in 16-token pages: the sink page, the window's pages and the partial last one.
					assert.Less(t, st.PagesUsed, 3*6, "pages were released")
				}
				t.Logf("%s %s: max relative logit error, f32 cache vs no cache: %.2e (%d pages in use)", name, tc.name, worst, st.PagesUsed)
			})
		}
	}
}
