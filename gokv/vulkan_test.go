//go:build vulkan

package gokv

import (
	"bytes"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/bridge"
)

// The engine on the Vulkan backend (docs/architecture.md §8): the same Cache/Step flows as step_test.go, run
// with WithBackend("vulkan") and WithBackend("cpu") on identical inputs (the harness draws every input from
// its seed). Each step is checked against the float64 references (tolFor, as on the CPU), and the two
// backends' outputs against each other (2e-3 per element relative to 1 + |cpu|: each is within 1e-3 of the
// same reference). Run with GOKV_VULKAN_VALIDATION=1: any Vulkan validation message fails the test.

// syncBuffer is a log sink that native callbacks may write from any thread.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// openVulkanPair opens a Vulkan engine (logging warnings to a buffer) and a CPU engine, and fails the
// test if Vulkan validation messages arrive before both are closed.
func openVulkanPair(t *testing.T) (vk, cpu *Engine) {
	t.Helper()
	start := bridge.VulkanValidationMessages()
	var log syncBuffer
	t.Cleanup(func() {
		if n := bridge.VulkanValidationMessages() - start; n != 0 {
			t.Errorf("%d Vulkan validation message(s) during the test; engine log:\n%s", n, log.String())
		}
	})
	vk, err := Open(WithBackend("vulkan"), WithThreads(2), WithLogger(zerolog.New(&log).Level(zerolog.WarnLevel)))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, vk.Close()) })
	info, err := vk.Info()
	require.NoError(t, err)
	require.Equal(t, "vulkan", info.Backend)
	return vk, openTestEngine(t)
}

// pair runs the same flow on both engines.
type pair struct {
	t      *testing.T
	vk, cc *tcache
}

func newPair(t *testing.T, vk, cpu *Engine, spec ModelSpec, opts CacheOptions, seed uint64) *pair {
	return &pair{t: t, vk: newTCache(t, vk, spec, opts, seed), cc: newTCache(t, cpu, spec, opts, seed)}
}

// seqs creates one sequence in each cache.
func (p *pair) seq() [2]*Sequence { return [2]*Sequence{p.vk.newSeq(), p.cc.newSeq()} }

// step runs one step with entries (sequence pair, new tokens) on both caches and compares the outputs.
func (p *pair) step(tl func(int) tol, entries ...pairEntry) {
	p.t.Helper()
	var ev, ec []StepEntry
	for _, e := range entries {
		ev = append(ev, StepEntry{Seq: e.s[0], NewTokens: e.n})
		ec = append(ec, StepEntry{Seq: e.s[1], NewTokens: e.n})
	}
	dv := p.vk.run(tl, ev...)
	dc := p.cc.run(tl, ec...)
	for l := range dv.out {
		want := make([]float64, len(dc.out[l]))
		for i, x := range dc.out[l] {
			want[i] = float64(x)
		}
		assertClose(p.t, want, dv.out[l], 2e-3, "layer %d: vulkan vs cpu", l)
	}
}

type pairEntry struct {
	s [2]*Sequence
	n int
}

func (p *pair) fork(s [2]*Sequence) [2]*Sequence {
	return [2]*Sequence{p.vk.fork(s[0]), p.cc.fork(s[1])}
}

// TestVulkanStepMatchesCPU: batched prefill, decode, mixed steps, a fork (copy-on-write pages and KIVI
// rings) in every format.
func TestVulkanStepMatchesCPU(t *testing.T) {
	vk, cpu := openVulkanPair(t)
	for i, name := range []string{"f32", "f16", "q8", "q4:64", "kivi2:32:32", "kivi4:32:64"} {
		t.Run(name, func(t *testing.T) {
			f := MustParseFormat(name)
			p := newPair(t, vk, cpu, smallSpec(2, 64), CacheOptions{Format: f, PageSize: 64, MaxTokens: 2048, MaxSequences: 4}, uint64(i))
			tl := uniform(tolFor(f))
			a, b := p.seq(), p.seq()
			p.step(tl, pairEntry{a, 50}, pairEntry{b, 70})
			for range 3 {
				p.step(tl, pairEntry{a, 1}, pairEntry{b, 1})
			}
			p.step(tl, pairEntry{a, 1}, pairEntry{b, 37})
			c := p.fork(a)
			p.step(tl, pairEntry{a, 90}, pairEntry{c, 5})
			p.step(tl, pairEntry{c, 1}, pairEntry{b, 1}, pairEntry{a, 1})
		})
	}
}

// TestVulkanMLAAndWindows: absorbed MLA layers, and a gpt-oss-like model (sliding window + learned sinks)
// with eviction of the window's old pages, on both backends.
func TestVulkanMLAAndWindows(t *testing.T) {
	vk, cpu := openVulkanPair(t)
	t.Run("mla", func(t *testing.T) {
		spec := ModelSpec{Name: "mla", SinkTokens: DefaultSinkTokens, Layers: []LayerSpec{MLALayer(8, 64, 32), MLALayer(8, 64, 32)}}
		for i, name := range []string{"f16", "q4", "kivi2:32:32"} {
			f := MustParseFormat(name)
			p := newPair(t, vk, cpu, spec, CacheOptions{Format: f, PageSize: 32, MaxTokens: 512, MaxSequences: 2, Scale: 0.07}, uint64(10+i))
			s := p.seq()
			p.step(uniform(tolFor(f)), pairEntry{s, 45})
			p.step(uniform(tolFor(f)), pairEntry{s, 1})
			p.step(uniform(tolFor(f)), pairEntry{s, 20})
		}
	})
	t.Run("sliding-window-learned-sinks", func(t *testing.T) {
		spec := ModelSpec{Name: "oss-like"}
		for i := range 4 {
			l := AttentionLayer(8, 2, 64)
			l.LearnedSinks = true
			if i%2 == 0 {
				l.Window = 24
			}
			spec.Layers = append(spec.Layers, l)
		}
		f := MustParseFormat("q4:32")
		p := newPair(t, vk, cpu, spec, CacheOptions{Format: f, PageSize: 8, MaxTokens: 512, MaxSequences: 2, MaxStepTokens: 64}, 30)
		s := p.seq()
		p.step(uniform(tolFor(f)), pairEntry{s, 40})
		for range 20 {
			p.step(uniform(tolFor(f)), pairEntry{s, 1})
		}
		p.step(uniform(tolFor(f)), pairEntry{s, 50})
		assert.Equal(t, pagesUsed(p.cc.c, 0), pagesUsed(p.vk.c, 0))
	})
	t.Run("sink-window-eviction", func(t *testing.T) {
		f := MustParseFormat("kivi4:32:32")
		opts := CacheOptions{Format: f, PageSize: 32, MaxTokens: 1024, MaxSequences: 2, Eviction: &SinkWindow{Sinks: 4, Window: 64}}
		p := newPair(t, vk, cpu, smallSpec(2, 64), opts, 40)
		s := p.seq()
		p.step(uniform(tolFor(f)), pairEntry{s, 150})
		for range 10 {
			p.step(uniform(tolFor(f)), pairEntry{s, 1})
		}
		p.step(uniform(tolFor(f)), pairEntry{s, 70})
	})
}
