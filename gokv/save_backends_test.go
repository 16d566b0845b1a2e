package gokv

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSaveLoadBackends: on every backend compiled in, a saved cache loads back into a cache of the same
// backend and continues bit for bit; and files are portable: a file saved on the backend loads into a CPU
// cache, and one saved on the CPU into a cache of the backend, and saving the loaded sequences again
// writes the same bytes (the pages and rings are stored identically everywhere).
func TestSaveLoadBackends(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		dev, cpu := openBackendPair(t, backend)
		spec := smallSpec(2, 64)
		for _, tc := range []struct {
			name string
			opts CacheOptions
		}{
			{"q4", CacheOptions{Format: MustParseFormat("q4:32"), PageSize: 32}},
			{"kivi2-f16", CacheOptions{Format: MustParseFormat("kivi2:32:32"), LayerFormats: map[int]Format{1: MustParseFormat("f16")}, PageSize: 32}},
			{"h2o-q8", CacheOptions{Format: MustParseFormat("q8:32"), PageSize: 8, Eviction: H2O{Budget: 24, Recent: 4}}},
			{"quest-q4", CacheOptions{Format: MustParseFormat("q4:32"), PageSize: 8, Eviction: Quest{Pages: 2, Recent: 8}}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				opts := tc.opts
				opts.MaxTokens, opts.MaxSequences = 2048, 8
				newCache := func(e *Engine) *Cache {
					c, err := e.NewCache(spec, opts)
					require.NoError(t, err)
					t.Cleanup(func() { _ = c.Close() })
					return c
				}
				a := newCache(dev)
				seqs := forkedHistory(70, 6)(saveRun{t: t, c: a, rng: newRand(31)})
				dir := t.TempDir()
				path := filepath.Join(dir, "dev.safetensors")
				require.NoError(t, a.Save(path, seqs...))

				// The same backend: bit for bit.
				b := newCache(dev)
				loaded, err := b.Load(path)
				require.NoError(t, err)
				requireSameState(t, a, seqs, b, loaded)
				rng := newRand(32)
				for step := 0; step < 3; step++ {
					twinStep(t, rng, a, seqs, b, loaded)
				}
				twinStep(t, rng, a, seqs, b, loaded, 3, 1, 7, 1)
				requireSameState(t, a, seqs, b, loaded)

				// Portable: backend -> CPU -> file, and CPU -> backend -> file, byte for byte.
				c := newCache(cpu)
				onCPU, err := c.Load(path)
				require.NoError(t, err)
				again := filepath.Join(dir, "cpu.safetensors")
				require.NoError(t, c.Save(again, onCPU...))
				assert.Equal(t, mustRead(t, path), mustRead(t, again), "the CPU stores another backend's file differently")
				d := newCache(dev)
				back, err := d.Load(again)
				require.NoError(t, err)
				third := filepath.Join(dir, "back.safetensors")
				require.NoError(t, d.Save(third, back...))
				assert.Equal(t, mustRead(t, path), mustRead(t, third), "the backend stores the CPU's file differently")
			})
		}
	})
}
