package gokv

import (
	"bytes"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One table of cross-backend tests of the engine (docs/architecture.md §8): the same Cache/Step flows as
// step_test.go on every backend compiled into this build (Backends(): "cpu" always, "vulkan" under the
// vulkan build tag, any later module the same way) and on the CPU, on identical inputs (the harness draws
// every input from its seed). Each step is checked against the float64 references (tolFor, as on the
// CPU), and the two backends' outputs against each other (2e-3 per element relative to 1 + |cpu|: each is
// within 1e-3 of the same reference). The backend's engine logs to the test: any warning or error it logs
// fails the test (with GOKV_VULKAN_VALIDATION=1, as CI runs it, that includes every Vulkan validation
// message).

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

// forEachBackend runs fn as a subtest on every backend compiled in.
func forEachBackend(t *testing.T, fn func(t *testing.T, backend string)) {
	needNative(t)
	for _, b := range Backends() {
		t.Run(b, func(t *testing.T) { fn(t, b) })
	}
}

// openBackendPair opens an engine on backend (openWatched) and a CPU engine.
func openBackendPair(t *testing.T, backend string) (dev, cpu *Engine) {
	t.Helper()
	return openWatched(t, backend), openTestEngine(t)
}

// openWatched opens an engine on backend, logging warnings and errors to the test, and closes it when
// the test ends; the test fails if the engine logs anything at warn level or above before then.
func openWatched(t *testing.T, backend string) *Engine {
	t.Helper()
	var log syncBuffer
	t.Cleanup(func() {
		if s := log.String(); s != "" {
			t.Errorf("backend %s logged warnings or errors during the test:\n%s", backend, s)
		}
	})
	e, err := Open(WithBackend(backend), WithThreads(2), WithLogger(zerolog.New(&log).Level(zerolog.WarnLevel)))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	info, err := e.Info()
	require.NoError(t, err)
	require.Equal(t, backend, info.Backend)
	return e
}

// pair runs the same flow on both engines.
type pair struct {
	t       *testing.T
	dev, cc *tcache
}

func newPair(t *testing.T, dev, cpu *Engine, spec ModelSpec, opts CacheOptions, seed uint64) *pair {
	return &pair{t: t, dev: newTCache(t, dev, spec, opts, seed), cc: newTCache(t, cpu, spec, opts, seed)}
}

// seqs creates one sequence in each cache.
func (p *pair) seq() [2]*Sequence { return [2]*Sequence{p.dev.newSeq(), p.cc.newSeq()} }

// step runs one step with entries (sequence pair, new tokens) on both caches and compares the outputs.
func (p *pair) step(tl func(int) tol, entries ...pairEntry) {
	p.t.Helper()
	var ev, ec []StepEntry
	for _, e := range entries {
		ev = append(ev, StepEntry{Seq: e.s[0], NewTokens: e.n})
		ec = append(ec, StepEntry{Seq: e.s[1], NewTokens: e.n})
	}
	dv := p.dev.run(tl, ev...)
	dc := p.cc.run(tl, ec...)
	for l := range dv.out {
		want := make([]float64, len(dc.out[l]))
		for i, x := range dc.out[l] {
			want[i] = float64(x)
		}
		assertClose(p.t, want, dv.out[l], 2e-3, "layer %d: backend vs cpu", l)
	}
}

type pairEntry struct {
	s [2]*Sequence
	n int
}

func (p *pair) fork(s [2]*Sequence) [2]*Sequence {
	return [2]*Sequence{p.dev.fork(s[0]), p.cc.fork(s[1])}
}

// TestBackendStepMatchesCPU: batched prefill, decode, mixed steps, a fork (copy-on-write pages and KIVI
// rings) in every format.
func TestBackendStepMatchesCPU(t *testing.T) {
	forEachBackend(t, testStepMatchesCPU)
}

func testStepMatchesCPU(t *testing.T, backend string) {
	dev, cpu := openBackendPair(t, backend)
	for i, name := range []string{"f32", "f16", "q8", "q4:64", "kivi2:32:32", "kivi4:32:64"} {
		t.Run(name, func(t *testing.T) {
			f := MustParseFormat(name)
			p := newPair(t, dev, cpu, smallSpec(2, 64), CacheOptions{Format: f, PageSize: 64, MaxTokens: 2048, MaxSequences: 4}, uint64(i))
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

// TestBackendMLAAndWindows: absorbed MLA layers, and a gpt-oss-like model (sliding window + learned sinks)
// with eviction of the window's old pages, on each backend and on the CPU.
func TestBackendMLAAndWindows(t *testing.T) {
	forEachBackend(t, testMLAAndWindows)
}

func testMLAAndWindows(t *testing.T, backend string) {
	dev, cpu := openBackendPair(t, backend)
	t.Run("mla", func(t *testing.T) {
		spec := ModelSpec{Name: "mla", SinkTokens: DefaultSinkTokens, Layers: []LayerSpec{MLALayer(8, 64, 32), MLALayer(8, 64, 32)}}
		for i, name := range []string{"f16", "q4", "kivi2:32:32"} {
			f := MustParseFormat(name)
			p := newPair(t, dev, cpu, spec, CacheOptions{Format: f, PageSize: 32, MaxTokens: 512, MaxSequences: 2, Scale: 0.07}, uint64(10+i))
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
		p := newPair(t, dev, cpu, spec, CacheOptions{Format: f, PageSize: 8, MaxTokens: 512, MaxSequences: 2, MaxStepTokens: 64}, 30)
		s := p.seq()
		p.step(uniform(tolFor(f)), pairEntry{s, 40})
		for range 20 {
			p.step(uniform(tolFor(f)), pairEntry{s, 1})
		}
		p.step(uniform(tolFor(f)), pairEntry{s, 50})
		assert.Equal(t, pagesUsed(p.cc.c, 0), pagesUsed(p.dev.c, 0))
	})
	t.Run("sink-window-eviction", func(t *testing.T) {
		f := MustParseFormat("kivi4:32:32")
		opts := CacheOptions{Format: f, PageSize: 32, MaxTokens: 1024, MaxSequences: 2, Eviction: &SinkWindow{Sinks: 4, Window: 64}}
		p := newPair(t, dev, cpu, smallSpec(2, 64), opts, 40)
		s := p.seq()
		p.step(uniform(tolFor(f)), pairEntry{s, 150})
		for range 10 {
			p.step(uniform(tolFor(f)), pairEntry{s, 1})
		}
		p.step(uniform(tolFor(f)), pairEntry{s, 70})
	})
}
