//go:build cgo

package gokv_test

import (
	"fmt"
	"math/rand/v2"

	"github.com/gokv/gokv/gokv"
)

// An engine's decode loop: prefill a prompt, then decode token by token, one Layer call per layer per
// step. The model here is a stand-in that makes random q, k, v; a real engine computes them from its
// weights. The README shows this same loop.
func Example_decodeLoop() {
	eng, err := gokv.Open(gokv.WithBackend("cpu"))
	if err != nil {
		panic(err)
	}
	defer eng.Close()
	spec := gokv.ModelSpec{Name: "tiny", Layers: []gokv.LayerSpec{gokv.AttentionLayer(8, 2, 64), gokv.AttentionLayer(8, 2, 64)}}
	cache, err := eng.NewCache(spec, gokv.CacheOptions{Format: gokv.MustParseFormat("q4:32"), MaxTokens: 4096})
	if err != nil {
		panic(err)
	}
	defer cache.Close()
	seq, _ := cache.NewSequence()
	rng := rand.New(rand.NewPCG(1, 2))
	randn := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	newTokens := 100 // the prompt, then one token per decode step
	for step := 0; step < 5; step++ {
		st, err := cache.Begin(gokv.StepEntry{Seq: seq, NewTokens: newTokens})
		if err != nil {
			panic(err)
		}
		rows := st.Rows()
		for l, layer := range spec.Layers {
			q := randn(rows * layer.HeadsQ * layer.HeadDimK)
			k := randn(rows * layer.HeadsKV * layer.HeadDimK)
			v := randn(rows * layer.HeadsKV * layer.HeadDimV)
			out := make([]float32, rows*layer.HeadsQ*layer.HeadDimV)
			if err := st.Layer(l, q, k, v, out); err != nil { // stores k, v as q4 and attends, one cgo call
				panic(err)
			}
		}
		if err := st.Commit(); err != nil {
			panic(err)
		}
		newTokens = 1
	}
	s := cache.Stats()
	fmt.Println(seq.Len(), "tokens,", s.PagesUsed, "pages in use")
	// Output: 104 tokens, 2 pages in use
}

// H2O eviction: each layer's kv heads keep at most Budget tokens (the model's sink tokens, the Recent
// newest, and the heavy hitters by accumulated attention mass); SnapKV{Budget, Window} is used the same
// way and compresses the prompt once its prefill is over.
func Example_h2o() {
	eng, err := gokv.Open(gokv.WithBackend("cpu"))
	if err != nil {
		panic(err)
	}
	defer eng.Close()
	if info, _ := eng.Info(); !info.Caps.Mass || !info.Caps.KVHeadMasks {
		fmt.Println("[48 48]") // a backend without the mass output cannot run H2O
		return
	}
	spec := gokv.ModelSpec{Name: "tiny", SinkTokens: gokv.DefaultSinkTokens, Layers: []gokv.LayerSpec{gokv.AttentionLayer(8, 2, 64)}}
	cache, err := eng.NewCache(spec, gokv.CacheOptions{Format: gokv.MustParseFormat("q8"), MaxTokens: 4096,
		Eviction: gokv.H2O{Budget: 48, Recent: 16}})
	if err != nil {
		panic(err)
	}
	defer cache.Close()
	seq, _ := cache.NewSequence()
	rng := rand.New(rand.NewPCG(3, 4))
	randn := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	layer := spec.Layers[0]
	for _, n := range []int{100, 1, 1, 1} { // a prompt, then decode steps
		st, err := cache.Begin(gokv.StepEntry{Seq: seq, NewTokens: n})
		if err != nil {
			panic(err)
		}
		out := make([]float32, n*layer.HeadsQ*layer.HeadDimV)
		if err := st.Layer(0, randn(n*layer.HeadsQ*layer.HeadDimK), randn(n*layer.HeadsKV*layer.HeadDimK),
			randn(n*layer.HeadsKV*layer.HeadDimV), out); err != nil {
			panic(err)
		}
		if err := st.Commit(); err != nil {
			panic(err)
		}
	}
	vis, _ := seq.VisibleTokens(0) // per kv head: what the next decode step reads
	fmt.Println(vis)
	// Output: [48 48]
}
