// Package llama is a float32 forward pass of HuggingFace Llama models (optionally with gpt-oss learned
// attention sinks) that does every attention through gokv's public Cache and Step API, the way an
// inference engine would: it is how gokv is measured on a real model (gokv eval, gokv generate).
//
// Math, as HF's LlamaForCausalLM: RMSNorm x·rsqrt(mean(x²)+eps)·w in float32; RoPE rotate-half
// (pairs (i, i+d/2) of a head, inv_freq = θ^(-2i/d)); attention scale 1/sqrt(d) with GQA; SwiGLU MLP
// down(silu(gate x)·up x); pre-norm residual blocks, final norm, lm_head. The keys reach the cache
// after RoPE, so a cached token keeps the position it was computed at, also after eviction.
//
// Use:
//
//	m, err := llama.Load("models/tiny-llama")
//	cache, err := m.NewCache(eng, gokv.CacheOptions{Format: f, MaxTokens: n})
//	r := m.NewRunner(cache)
//	seq, _ := cache.NewSequence()
//	out, err := r.Step(llama.Entry{Seq: seq, Tokens: prompt, AllLogits: true}) // prefill
//	out, err = r.Step(llama.Entry{Seq: seq, Tokens: []int{next}})             // decode
//
// Files: config.go (config.json), weights.go (model.safetensors), model.go (Load), forward.go (Runner),
// ops.go (the row-wise math and the matmul).
package llama

import (
	"fmt"
	"math"
	"path/filepath"

	"github.com/gokv/gokv/gokv"
)

// Model is a loaded model: its config and float32 weights, read-only after Load, so one Model may serve
// many Runners on different goroutines.
type Model struct {
	Config Config
	Name   string // the directory's base name
	Dir    string
	w      *weights
	// ropeCos and ropeSin hold cos and sin of position·inv_freq for every trained position,
	// [MaxPositions][HeadDim/2]; later positions are computed on the fly.
	ropeCos, ropeSin []float32
}

// Load reads dir/config.json and dir/model.safetensors. Errors name the file, and the key or tensor at
// fault (a missing tensor, a shape that disagrees with the config, a truncated file).
func Load(dir string) (*Model, error) {
	cfg, err := LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	w, err := loadWeights(filepath.Join(dir, "model.safetensors"), cfg)
	if err != nil {
		return nil, err
	}
	m := &Model{Config: cfg, Name: filepath.Base(filepath.Clean(dir)), Dir: dir, w: w}
	half := cfg.HeadDim / 2
	m.ropeCos = make([]float32, cfg.MaxPositions*half)
	m.ropeSin = make([]float32, cfg.MaxPositions*half)
	for p := 0; p < cfg.MaxPositions; p++ {
		ropeAngles(cfg, p, m.ropeCos[p*half:(p+1)*half], m.ropeSin[p*half:(p+1)*half])
	}
	return m, nil
}

// ropeAngles writes cos and sin of p·inv_freq_i, inv_freq_i = θ^(-2i/d), for i < d/2. HF computes the
// angle in float32 (inv_freq and the product); float64 here differs from it by ~1e-5 rad at position 511,
// far inside the logits' tolerance.
func ropeAngles(c Config, p int, cos, sin []float32) {
	d := float64(c.HeadDim)
	for i := range cos {
		invFreq := math.Pow(c.RopeTheta, -2*float64(i)/d)
		a := float64(p) * invFreq
		cos[i], sin[i] = float32(math.Cos(a)), float32(math.Sin(a))
	}
}

// Spec returns the model's attention geometry for gokv.NewCache (see Config.Spec).
func (m *Model) Spec() gokv.ModelSpec { return m.Config.Spec(m.Name) }

// SinkLogits returns layer's learned sink logits [HeadsQ] (a copy), or nil for a model without them.
func (m *Model) SinkLogits(layer int) []float32 {
	if layer < 0 || layer >= len(m.w.layers) || m.w.layers[layer].sinks == nil {
		return nil
	}
	return append([]float32(nil), m.w.layers[layer].sinks...)
}

// NewCache creates a cache for the model on eng (opts as for Engine.NewCache), with the learned sink
// logits of every layer when the model has them (CacheOptions.SinkLogits). The caller closes it.
func (m *Model) NewCache(eng *gokv.Engine, opts gokv.CacheOptions) (*gokv.Cache, error) {
	if m.Config.LearnedSinks {
		opts.SinkLogits = make(map[int][]float32, len(m.w.layers))
		for l := range m.w.layers {
			opts.SinkLogits[l] = m.w.layers[l].sinks
		}
	}
	c, err := eng.NewCache(m.Spec(), opts)
	if err != nil {
		return nil, fmt.Errorf("llama: %s: %w", m.Name, err)
	}
	return c, nil
}
