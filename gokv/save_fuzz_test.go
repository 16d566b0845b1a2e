package gokv

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzLoad: whatever the bytes, Load never panics, never allocates beyond what the input justifies, and
// either loads sequences (which release cleanly) or fails leaving the cache exactly as it was. The seed
// corpus (run by every `go test`) holds valid files of two caches, truncations, flipped bits and a
// changed version; `go test -run '^$' -fuzz FuzzLoad ./gokv` explores from there.
func FuzzLoad(f *testing.F) {
	e := openTestEngine(f)
	fx := smallFuzzFixture(f, e)
	c, err := e.NewCache(fx.spec, fx.opts)
	require.NoError(f, err)
	f.Cleanup(func() { _ = c.Close() })
	file := fx.file
	f.Add(file)
	headerEnd := 8 + int(binary.LittleEndian.Uint64(file))
	for _, n := range []int{0, 8, headerEnd - 1, headerEnd, len(file) - 1} {
		f.Add(slices.Clone(file[:n]))
	}
	for _, i := range []int{0, 5, 30, headerEnd / 2, headerEnd - 1, headerEnd, len(file) - 1} {
		b := slices.Clone(file)
		b[i] ^= 0x10
		f.Add(b)
	}
	f.Add(bytes.Replace(file, []byte(`"version":"1"`), []byte(`"version":"9"`), 1))
	// A file whose checksums all fit but whose state is not one Save writes: the checks past the
	// checksums get explored too.
	st, tensors := splitSaved(f, file)
	st.Sequences[0].Groups[0].Table[0] = -1
	f.Add(joinSaved(f, st, tensors, true))
	f.Fuzz(func(t *testing.T, data []byte) {
		before := c.Stats()
		seqs, err := loadBytes(t, c, data)
		if err != nil {
			return
		}
		for _, s := range seqs {
			require.NoError(t, s.Release())
		}
		// Released pages stay cached under their names (prefix reuse); nothing else remains.
		after := c.Stats()
		require.Equal(t, before.PagesUsed, after.PagesUsed, "releasing what Load loaded left pages in use")
		require.Equal(t, before.BytesUsed, after.BytesUsed)
		require.Zero(t, after.Sequences)
	})
}

// smallFuzzFixture is a small saved cache for fast fuzzing: q4 pages of one kv head, a full and a sliding
// layer (two layer groups), H2O state, and a fork sharing pages.
func smallFuzzFixture(t testing.TB, e *Engine) saveFixture {
	t.Helper()
	spec := ModelSpec{Name: "fuzz", SinkTokens: 2, Layers: []LayerSpec{AttentionLayer(2, 1, 32), AttentionLayer(2, 1, 32)}}
	spec.Layers[1].Window = 8
	opts := CacheOptions{Format: MustParseFormat("q4:32"), PageSize: 8, MaxTokens: 256, MaxSequences: 4,
		Eviction: H2O{Budget: 10, Recent: 2}}
	c, err := e.NewCache(spec, opts)
	require.NoError(t, err)
	defer c.Close()
	seqs := forkedHistory(12, 3)(saveRun{t: t, c: c, rng: newRand(11)})
	path := filepath.Join(t.TempDir(), "small.safetensors")
	require.NoError(t, c.Save(path, seqs[0], seqs[1]))
	return saveFixture{spec: spec, opts: opts, file: mustRead(t, path)}
}

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}
