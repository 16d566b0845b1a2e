package gokv

import (
	"flag"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/bridge"
)

var updateSaved = flag.Bool("update-saved", false, "rewrite testdata/saved/v1.safetensors (a new format version needs a new file)")

// goldenSaved is a version-1 file kept in the repository: every later gokv must read it.
const goldenSaved = "testdata/saved/v1.safetensors"

// TestSavedFormatGolden: the checked-in version-1 file is described without a device, loads into a cache
// of its kind, and saving what was loaded writes it again byte for byte (the format has not drifted).
func TestSavedFormatGolden(t *testing.T) {
	if *updateSaved {
		e := openTestEngine(t)
		fx := smallFuzzFixture(t, e)
		require.NoError(t, os.MkdirAll(filepath.Dir(goldenSaved), 0o755))
		require.NoError(t, os.WriteFile(goldenSaved, fx.file, 0o644))
	}
	sc, err := InspectSavedCache(goldenSaved)
	require.NoError(t, err)
	assert.Equal(t, 1, sc.Version)
	assert.Equal(t, "fuzz", sc.Model.Name)
	assert.Equal(t, "H2O{Budget: 10, Recent: 2}", sc.Policy)
	assert.Equal(t, []Format{MustParseFormat("q4:32"), MustParseFormat("q4:32")}, sc.Formats)
	require.Len(t, sc.Sequences, 2)
	assert.Equal(t, 16, sc.Sequences[0].Length)
	assert.Equal(t, 15, sc.Sequences[1].Length)
	for _, x := range sc.Tensors {
		assert.True(t, x.Verified, x.Name)
	}
	if !bridge.CgoEnabled {
		return
	}
	e := openTestEngine(t)
	fx := smallFuzzFixture(t, e) // for its spec and options
	c, err := e.NewCache(fx.spec, fx.opts)
	require.NoError(t, err)
	defer c.Close()
	seqs, err := c.Load(goldenSaved)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "again.safetensors")
	require.NoError(t, c.Save(path, seqs...))
	assert.Equal(t, mustRead(t, goldenSaved), mustRead(t, path))
}

// TestSaveLoadConcurrent: saves and loads run while other sequences step (run with -race).
func TestSaveLoadConcurrent(t *testing.T) {
	e := openTestEngine(t)
	spec := smallSpec(2, 32)
	c, err := e.NewCache(spec, CacheOptions{Format: MustParseFormat("q4:32"), PageSize: 16, MaxTokens: 8192, MaxSequences: 16,
		Eviction: H2O{Budget: 48, Recent: 8}})
	require.NoError(t, err)
	defer c.Close()
	r := saveRun{t: t, c: c, rng: newRand(41)}
	a, err := c.NewSequence()
	require.NoError(t, err)
	r.step(StepEntry{Seq: a, NewTokens: 60})
	path := filepath.Join(t.TempDir(), "a.safetensors")
	require.NoError(t, c.Save(path, a))

	var wg sync.WaitGroup
	// stepper decodes a sequence of its own; it reports failures with assert (it is not the test's
	// goroutine) and stops at the first.
	stepper := func(seed uint64) {
		defer wg.Done()
		s, err := c.NewSequence()
		if !assert.NoError(t, err) {
			return
		}
		rng := newRand(seed)
		for i := 0; i < 30; i++ {
			n := 1
			if i == 0 {
				n = 40
			}
			st, err := c.Begin(StepEntry{Seq: s, NewTokens: n})
			if !assert.NoError(t, err) {
				return
			}
			in := genSaveInputs(spec, rng, n)
			for l := range spec.Layers {
				if !assert.NoError(t, st.Layer(l, in.q[l], in.k[l], in.v[l], make([]float32, n*4*32))) {
					_ = st.Abort()
					return
				}
			}
			if !assert.NoError(t, st.Commit()) {
				return
			}
		}
	}
	wg.Add(2)
	go stepper(42)
	go stepper(43)
	for i := 0; i < 10; i++ {
		p := filepath.Join(t.TempDir(), "x.safetensors")
		require.NoError(t, c.Save(p, a))
		assert.Equal(t, mustRead(t, path), mustRead(t, p), "a's file changed while other sequences stepped")
		seqs, err := c.Load(path)
		require.NoError(t, err)
		for _, s := range seqs {
			require.NoError(t, s.Release())
		}
	}
	wg.Wait()
}
