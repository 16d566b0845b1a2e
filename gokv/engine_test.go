package gokv

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/bridge"
)

func TestOpenAndInfo(t *testing.T) {
	needNative(t)
	assert.Equal(t, "cpu", Backends()[0])
	var buf bytes.Buffer
	e, err := Open(WithBackend("cpu"), WithThreads(2), WithDevice(-1), WithLogger(zerolog.New(&buf).Level(zerolog.DebugLevel)))
	require.NoError(t, err)
	info, err := e.Info()
	require.NoError(t, err)
	assert.Equal(t, "cpu", info.Backend)
	assert.Equal(t, 2, info.Threads)
	assert.NotZero(t, info.MemoryBytes)
	assert.Positive(t, info.SubgroupSize)
	c, err := e.NewCache(smallSpec(1, 32), CacheOptions{MaxTokens: 64})
	require.NoError(t, err)
	assert.Contains(t, buf.String(), `"backend":"cpu"`)
	assert.Contains(t, buf.String(), `"op":"NewCache"`)

	require.NoError(t, e.Close())
	require.NoError(t, e.Close(), "Close twice")
	require.NoError(t, c.Close(), "the engine closed its caches")
	_, err = e.Info()
	assert.ErrorIs(t, err, ErrClosed)
	_, err = e.NewCache(smallSpec(1, 32), CacheOptions{MaxTokens: 64})
	assert.ErrorIs(t, err, ErrClosed)
	var nilEngine *Engine
	assert.NoError(t, nilEngine.Close())
}

// TestOpenWithoutCgo: a build without cgo has no backend, and Open says why.
func TestOpenWithoutCgo(t *testing.T) {
	if bridge.CgoEnabled {
		t.Skip("built with cgo")
	}
	assert.Empty(t, Backends())
	e, err := Open(WithBackend("cpu"))
	assert.Nil(t, e)
	assert.ErrorIs(t, err, ErrNoDevice)
	assert.ErrorIs(t, err, ErrNoCgo)
	assert.Contains(t, err.Error(), "CGO_ENABLED=0")
}

func TestOpenErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		want error
	}{
		{"unknown backend", []Option{WithBackend("nosuch")}, ErrNoDevice},
		{"empty backend", []Option{WithBackend("")}, ErrInvalid},
		{"threads", []Option{WithBackend("cpu"), WithThreads(-1)}, ErrInvalid},
		{"device", []Option{WithBackend("cpu"), WithDevice(-2)}, ErrInvalid},
	} {
		e, err := Open(tc.opts...)
		assert.Nil(t, e, tc.name)
		assert.ErrorIs(t, err, tc.want, tc.name)
		var ge *Error
		assert.True(t, errors.As(err, &ge), tc.name)
	}
}

// TestNewCacheErrors: bad specs and options name the layer and field; unsupported combinations are
// ErrNotSupported or ErrInvalid before any native pool exists.
func TestNewCacheErrors(t *testing.T) {
	e := openTestEngine(t)
	kivi := MustParseFormat("kivi2:64:64")
	for _, tc := range []struct {
		name string
		spec ModelSpec
		opts CacheOptions
		want error
		msg  string
	}{
		{"no layers", ModelSpec{Name: "x"}, CacheOptions{MaxTokens: 64}, ErrInvalid, "no layers"},
		{"max tokens", smallSpec(1, 32), CacheOptions{}, ErrInvalid, "MaxTokens 0"},
		{"page size", smallSpec(1, 32), CacheOptions{MaxTokens: 64, PageSize: 12}, ErrInvalid, "PageSize 12"},
		{"format dims", smallSpec(1, 32), CacheOptions{MaxTokens: 64, Format: MustParseFormat("q4:64")}, ErrInvalid, "layer 0"},
		{"kivi page", smallSpec(1, 64), CacheOptions{MaxTokens: 64, PageSize: 32, Format: kivi}, ErrInvalid, "PageSize 32"},
		{"layer format key", smallSpec(2, 32), CacheOptions{MaxTokens: 64, LayerFormats: map[int]Format{5: {}}}, ErrInvalid, "layer 5"},
		{"bad layer format", smallSpec(2, 32), CacheOptions{MaxTokens: 64, LayerFormats: map[int]Format{1: {Kind: Q4, Group: 48}}}, ErrInvalid, "layer 1"},
		{"eviction", smallSpec(1, 32), CacheOptions{MaxTokens: 64, Eviction: &SinkWindow{Sinks: 4}}, ErrInvalid, "Window must be"},
		{"scale", smallSpec(1, 32), CacheOptions{MaxTokens: 64, Scale: -1}, ErrInvalid, "Scale"},
		{"too big", ModelSpec{Layers: []LayerSpec{AttentionLayer(64, 64, 1024)}}, CacheOptions{MaxTokens: 1<<31 - 1, PageSize: 1024}, ErrOutOfMemory, "layer 0"},
	} {
		c, err := e.NewCache(tc.spec, tc.opts)
		if c != nil {
			_ = c.Close()
		}
		assert.ErrorIs(t, err, tc.want, tc.name)
		assert.ErrorContains(t, err, tc.msg, tc.name)
	}
}

// TestErrorMapping: bridge errors keep their code, and the gokv-only codes work with errors.Is/As.
func TestErrorMapping(t *testing.T) {
	for _, m := range bridgeCodes {
		err := wrapErr("Op", "layer 1", fmt.Errorf("wrapped: %w", &bridge.Error{Op: "gokv_attend", Code: m.b.Code, Name: m.b.Name, Msg: "gokv_attend: bad"}))
		assert.ErrorIs(t, err, &Error{Code: m.c}, m.c.String())
		assert.Contains(t, err.Error(), "gokv: Op: layer 1: gokv_attend: bad")
	}
	assert.Nil(t, wrapErr("Op", "", nil))
	assert.ErrorIs(t, wrapErr("Op", "", errors.New("plain")), ErrInternal)
	ce := &CapacityError{Op: "Cache.Begin", Group: 1, Layers: []int{0, 2}, Needed: 5, Free: 3, Total: 40}
	assert.Same(t, error(ce), wrapErr("Other", "", ce))
	assert.ErrorIs(t, ce, ErrCapacity)
	assert.NotErrorIs(t, ce, ErrInvalid)
	assert.Equal(t, "gokv: Cache.Begin: layer group 1 (layers 0,2): needs 5 pages, 3 of 40 free; nothing was changed", ce.Error())
	assert.Equal(t, "gokv: Step.Layer: bad", (&Error{Op: "Step.Layer", Code: ErrorInvalid, Msg: "bad"}).Error())
	assert.Equal(t, "gokv: closed", ErrClosed.Error())
}

// TestCloseTwice: Close is idempotent and everything afterwards fails with ErrClosed (Release and Abort
// are no-ops).
func TestCloseTwice(t *testing.T) {
	e := openTestEngine(t)
	c, err := e.NewCache(smallSpec(1, 32), CacheOptions{MaxTokens: 64})
	require.NoError(t, err)
	s, err := c.NewSequence()
	require.NoError(t, err)
	st, err := c.Begin(decode(s))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.NoError(t, c.Close())
	var nilCache *Cache
	assert.NoError(t, nilCache.Close())

	_, err = c.NewSequence()
	assert.ErrorIs(t, err, ErrClosed)
	_, err = c.Begin(decode(s))
	assert.ErrorIs(t, err, ErrClosed)
	_, err = s.Fork()
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, s.Truncate(0), ErrClosed)
	assert.NoError(t, s.Release())
	q := make([]float32, 4*32)
	assert.ErrorIs(t, st.Layer(0, q, q[:64], q[:64], q), ErrClosed)
	assert.NoError(t, st.Abort())
	assert.ErrorIs(t, c.SetSinkLogits(0, nil), ErrInvalid)
	assert.Equal(t, CacheStats{}, c.Stats())
}

// TestConcurrentSequences runs goroutines that each create, step, fork, truncate and release their own
// sequences on one cache (run with -race), while checking every output against the reference.
func TestConcurrentSequences(t *testing.T) {
	e := openTestEngine(t)
	f := MustParseFormat("q4")
	c, err := e.NewCache(smallSpec(2, 32), CacheOptions{Format: f, PageSize: 16, MaxTokens: 4096, MaxSequences: 16})
	require.NoError(t, err)
	defer c.Close()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each goroutine has its own harness view of the shared cache (its own sequences and RNG).
			h := &tcache{t: t, c: c, spec: c.Spec(), rng: newRand(uint64(700 + g)), hist: map[*Sequence]*thist{}}
			h.vis = func(l, p, tok int) bool { return true }
			tl := uniform(tolFor(f))
			for range 3 {
				s := h.newSeq()
				h.run(tl, prefill(s, 20+g))
				h.run(tl, decode(s))
				child := h.fork(s)
				h.run(tl, decode(s), prefill(child, 3))
				h.truncate(child, 21)
				h.run(tl, decode(child))
				assert.NoError(t, child.Release())
				assert.NoError(t, s.Release())
				_ = c.Stats()
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 0, c.Stats().PagesUsed)
	assert.Equal(t, 0, c.Stats().Sequences)
}

// TestDeviceInfoCapabilities: the CPU device says what it can do, so an engine can ask before NewCache.
func TestDeviceInfoCapabilities(t *testing.T) {
	e := openTestEngine(t)
	info, err := e.Info()
	require.NoError(t, err)
	assert.Equal(t, []FormatKind{F32, F16, Q8, Q4, KIVI2, KIVI4}, info.Formats)
	assert.True(t, info.Supports(KIVI2))
	// The CPU backend has every capability.
	assert.Equal(t, DeviceCaps{Decode: true, Prefill: true, LearnedSinks: true, Window: true, MLA: true, Holes: true, Baseline: true,
		Mass: true, KVHeadMasks: true, Quest: true}, info.Caps)
	assert.False(t, DeviceInfo{Formats: []FormatKind{F16}}.Supports(Q4))
}
