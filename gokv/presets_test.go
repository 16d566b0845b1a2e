package gokv

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPresetGeometry(t *testing.T) {
	tests := []struct {
		name                    string
		layers                  int
		kind                    AttentionKind
		headsQ, headsKV, dk, dv int
		// window of layer i: sliding(i) ? window : 0
		window       int
		sliding      func(i int) bool
		learnedSinks bool
		sinkTokens   int
		maxPositions int
	}{
		{"llama-3.1-8b", 32, GQA, 32, 8, 128, 128, 0, nil, false, 4, 131072},
		{"llama-3.1-70b", 80, GQA, 64, 8, 128, 128, 0, nil, false, 4, 131072},
		{"mistral-7b", 32, GQA, 32, 8, 128, 128, 0, nil, false, 4, 32768},
		{"mistral-7b-v0.1", 32, GQA, 32, 8, 128, 128, 4096, func(int) bool { return true }, false, 4, 32768},
		{"gpt-oss-20b", 24, GQA, 64, 8, 64, 64, 128, func(i int) bool { return i%2 == 0 }, true, 0, 131072},
		{"gpt-oss-120b", 36, GQA, 64, 8, 64, 64, 128, func(i int) bool { return i%2 == 0 }, true, 0, 131072},
		{"deepseek-v2-lite", 27, MLA, 16, 1, 576, 512, 0, nil, false, 4, 163840},
		{"deepseek-v3", 61, MLA, 128, 1, 576, 512, 0, nil, false, 4, 163840},
		{"falcon-7b", 32, MQA, 71, 1, 64, 64, 0, nil, false, 4, 2048},
		{"gemma-2-9b", 42, GQA, 16, 8, 256, 256, 4096, func(i int) bool { return i%2 == 0 }, false, 4, 8192},
		{"gemma-3-12b", 48, GQA, 16, 8, 256, 256, 1024, func(i int) bool { return i%6 != 5 }, false, 4, 131072},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := Preset(tt.name)
			require.NoError(t, err)
			require.NoError(t, spec.Validate())
			assert.Equal(t, tt.name, spec.Name)
			require.Len(t, spec.Layers, tt.layers)
			assert.Equal(t, tt.sinkTokens, spec.SinkTokens)
			assert.Equal(t, tt.maxPositions, spec.MaxPositions)
			assert.Zero(t, spec.WeightsBytes)
			for i, l := range spec.Layers {
				assert.Equal(t, tt.kind, l.Kind, "layer %d", i)
				assert.Equal(t, tt.headsQ, l.HeadsQ, "layer %d", i)
				assert.Equal(t, tt.headsKV, l.HeadsKV, "layer %d", i)
				assert.Equal(t, tt.dk, l.HeadDimK, "layer %d", i)
				assert.Equal(t, tt.dv, l.HeadDimV, "layer %d", i)
				assert.Equal(t, tt.learnedSinks, l.LearnedSinks, "layer %d", i)
				wantWindow := 0
				if tt.sliding != nil && tt.sliding(i) {
					wantWindow = tt.window
				}
				assert.Equal(t, wantWindow, l.Window, "layer %d", i)
			}
		})
	}
}

func TestPresetSpecifics(t *testing.T) {
	// gpt-oss starts with a sliding layer; Gemma 3's first full layer is layer 5.
	oss, err := Preset("gpt-oss-20b")
	require.NoError(t, err)
	assert.Equal(t, 128, oss.Layers[0].Window)
	assert.Equal(t, 0, oss.Layers[1].Window)
	g3, err := Preset("gemma-3-12b")
	require.NoError(t, err)
	full := []int{}
	for i, l := range g3.Layers {
		if !l.Windowed() {
			full = append(full, i)
		}
	}
	assert.Equal(t, []int{5, 11, 17, 23, 29, 35, 41, 47}, full)
	// DeepSeek's absorbed MLA: V is the first 512 dims of the 576-dim latent.
	ds, err := Preset("deepseek-v2-lite")
	require.NoError(t, err)
	assert.True(t, ds.Layers[0].VIsKPrefix())
	assert.Equal(t, 512, ds.Layers[0].KVLoraRank)
	assert.Equal(t, 64, ds.Layers[0].RopeDim)
}

func TestPresetsList(t *testing.T) {
	names := Presets()
	for _, want := range []string{"llama-3.1-8b", "llama-3.1-70b", "mistral-7b", "mistral-7b-v0.1", "gpt-oss-20b",
		"gpt-oss-120b", "deepseek-v2-lite", "falcon-7b", "gemma-2-9b", "gemma-3-12b"} {
		assert.Contains(t, names, want)
	}
	seen := map[string]bool{}
	for _, n := range names {
		assert.False(t, seen[n], "duplicate preset %s", n)
		seen[n] = true
		_, err := Preset(n)
		assert.NoError(t, err, n)
	}
}

func TestPresetLookup(t *testing.T) {
	a, err := Preset(" Llama-3.1-8B ")
	require.NoError(t, err)
	assert.Equal(t, "llama-3.1-8b", a.Name)

	// Each call returns its own Layers.
	a.Layers[0].HeadsKV = 1
	b, err := Preset("llama-3.1-8b")
	require.NoError(t, err)
	assert.Equal(t, 8, b.Layers[0].HeadsKV)

	_, err = Preset("llama-9")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"llama-9"`)
	assert.Contains(t, err.Error(), "llama-3.1-8b", "the error lists the known presets")
}
