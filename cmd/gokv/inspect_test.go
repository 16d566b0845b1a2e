package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/gokv"
)

// savedCacheFile saves a small H2O cache with a KIVI layer and a fork, and returns its path.
func savedCacheFile(t *testing.T) string {
	t.Helper()
	eng, err := gokv.Open(gokv.WithBackend("cpu"), gokv.WithThreads(1))
	if err != nil {
		t.Skipf("no CPU backend: %v", err)
	}
	defer eng.Close()
	spec := gokv.ModelSpec{Name: "tiny", SinkTokens: 4, Layers: []gokv.LayerSpec{gokv.AttentionLayer(4, 2, 32), gokv.AttentionLayer(4, 2, 32)}}
	c, err := eng.NewCache(spec, gokv.CacheOptions{Format: gokv.MustParseFormat("q4:32"),
		LayerFormats: map[int]gokv.Format{1: gokv.MustParseFormat("kivi2:32:32")}, PageSize: 32, MaxTokens: 1024,
		MaxSequences: 4, Eviction: gokv.H2O{Budget: 40, Recent: 8}})
	require.NoError(t, err)
	defer c.Close()
	s, err := c.NewSequence()
	require.NoError(t, err)
	step := func(seq *gokv.Sequence, n int) {
		st, err := c.Begin(gokv.StepEntry{Seq: seq, NewTokens: n})
		require.NoError(t, err)
		for l := range spec.Layers {
			q, k, v, out := make([]float32, n*4*32), make([]float32, n*2*32), make([]float32, n*2*32), make([]float32, n*4*32)
			for i := range q {
				q[i] = float32(i%7) * 0.1
			}
			for i := range k {
				k[i], v[i] = float32(i%11)*0.05, float32(i%5)*0.2
			}
			require.NoError(t, st.Layer(l, q, k, v, out))
		}
		require.NoError(t, st.Commit())
	}
	step(s, 70)
	f, err := s.Fork()
	require.NoError(t, err)
	step(f, 1)
	path := filepath.Join(t.TempDir(), "cache.safetensors")
	require.NoError(t, c.Save(path, s, f))
	return path
}

// TestInspect: inspect describes a saved cache without a device, in text and JSON, and reports a
// corrupted tensor after describing the rest.
func TestInspect(t *testing.T) {
	path := savedCacheFile(t)
	out, msg := runCLI(t, "inspect", path)
	require.Empty(t, msg)
	for _, want := range []string{
		"gokv saved cache, format version 1",
		`model "tiny": 2 layers, 4 sink tokens; page size 32; policy H2O{Budget: 40, Recent: 8}`,
		"kivi2:32:32",
		"2 sequences",
		"layer.1.rings",
		"checksums: the state and all 8 tensors verified",
	} {
		assert.Contains(t, out, want)
	}

	out, msg = runCLI(t, "inspect", "--json", path)
	require.Empty(t, msg)
	var rep inspectReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.True(t, rep.Verified)
	assert.Equal(t, "tiny", rep.Model)
	require.Len(t, rep.Sequences, 2)
	assert.Equal(t, 70, rep.Sequences[0].Length)
	assert.Equal(t, 71, rep.Sequences[1].Length)
	assert.Equal(t, []int{3}, rep.Sequences[1].Pages, "the fork holds the shared pages and its own copy")
	assert.Equal(t, 4, rep.Groups[0].Pages, "three shared or private pages of the parent, one copy of the fork's")

	// Flip a bit in the last tensor: everything is still described, and the command fails naming it.
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	data[len(data)-1] ^= 1
	bad := filepath.Join(t.TempDir(), "bad.safetensors")
	require.NoError(t, os.WriteFile(bad, data, 0o644))
	out, msg = runCLI(t, "inspect", bad)
	assert.Contains(t, out, "MISMATCH")
	assert.Contains(t, out, "1 of 8 tensors do not match")
	assert.True(t, strings.HasPrefix(msg, "gokv: InspectSavedCache: "), msg)
	assert.Contains(t, msg, "checksum")

	// A file that is not a saved cache at all.
	_, msg = runCLI(t, "inspect", filepath.Join(t.TempDir(), "missing"))
	assert.Contains(t, msg, "no such file")
	require.NoError(t, os.WriteFile(bad, []byte("not a cache"), 0o644))
	_, msg = runCLI(t, "inspect", bad)
	assert.Contains(t, msg, "runs past the end")
}
