package gokv

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClassifyHeads(t *testing.T) {
	tests := []struct {
		q, kv int
		want  AttentionKind
	}{
		{32, 32, MHA}, {1, 1, MHA}, {32, 8, GQA}, {64, 8, GQA}, {71, 1, MQA}, {2, 1, MQA},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, ClassifyHeads(tt.q, tt.kv), "%d/%d", tt.q, tt.kv)
	}
	assert.Equal(t, "GQA", GQA.String())
	assert.Equal(t, "attention(7)", AttentionKind(7).String())
}

func TestLayerHelpers(t *testing.T) {
	gqa := AttentionLayer(32, 8, 128)
	assert.Equal(t, LayerSpec{Kind: GQA, HeadsQ: 32, HeadsKV: 8, HeadDimK: 128, HeadDimV: 128}, gqa)
	assert.Equal(t, 4, gqa.QueriesPerKVHead())
	assert.False(t, gqa.VIsKPrefix())
	assert.False(t, gqa.Windowed())
	assert.Equal(t, "GQA 32q/8kv d128", gqa.String())

	mla := MLALayer(16, 512, 64)
	assert.Equal(t, LayerSpec{Kind: MLA, HeadsQ: 16, HeadsKV: 1, HeadDimK: 576, HeadDimV: 512, KVLoraRank: 512, RopeDim: 64}, mla)
	assert.True(t, mla.VIsKPrefix())
	assert.Equal(t, 16, mla.QueriesPerKVHead())
	assert.Equal(t, "MLA 16q latent 512+64", mla.String())

	oss := AttentionLayer(64, 8, 64)
	oss.Window, oss.LearnedSinks = 128, true
	assert.True(t, oss.Windowed())
	assert.Equal(t, "GQA 64q/8kv d64 window 128 learned-sinks", oss.String())
	assert.Equal(t, 0, LayerSpec{}.QueriesPerKVHead())
}

func TestLayerValidate(t *testing.T) {
	mutate := func(base LayerSpec, f func(*LayerSpec)) LayerSpec { f(&base); return base }
	gqa := AttentionLayer(32, 8, 128)
	mla := MLALayer(16, 512, 64)
	tests := []struct {
		name    string
		layer   LayerSpec
		mention string // "" = valid
	}{
		{"gqa", gqa, ""},
		{"mla", mla, ""},
		{"mqa", AttentionLayer(71, 1, 64), ""},
		{"windowed", mutate(gqa, func(l *LayerSpec) { l.Window = 4096 }), ""},
		{"no q heads", mutate(gqa, func(l *LayerSpec) { l.HeadsQ = 0 }), "HeadsQ 0"},
		{"no kv heads", mutate(gqa, func(l *LayerSpec) { l.HeadsKV = 0 }), "HeadsKV 0"},
		{"kv does not divide q", mutate(gqa, func(l *LayerSpec) { l.HeadsKV = 7; l.Kind = GQA }), "HeadsKV 7 does not divide HeadsQ 32"},
		{"kind mismatch", mutate(gqa, func(l *LayerSpec) { l.Kind = MHA }), "Kind MHA does not match HeadsQ 32 / HeadsKV 8 (that is GQA)"},
		{"bad kind", mutate(gqa, func(l *LayerSpec) { l.Kind = 9 }), "Kind 9"},
		{"dim k", mutate(gqa, func(l *LayerSpec) { l.HeadDimK = 0 }), "HeadDimK 0"},
		{"dim v", mutate(gqa, func(l *LayerSpec) { l.HeadDimV = -1 }), "HeadDimV -1"},
		{"negative window", mutate(gqa, func(l *LayerSpec) { l.Window = -1 }), "Window -1"},
		{"mla fields on gqa", mutate(gqa, func(l *LayerSpec) { l.KVLoraRank = 512 }), "KVLoraRank 512 and RopeDim 0 are for MLA layers only"},
		{"mla kv heads", mutate(mla, func(l *LayerSpec) { l.HeadsKV = 16 }), "HeadsKV 16 must be 1 for MLA"},
		{"mla dim k", mutate(mla, func(l *LayerSpec) { l.HeadDimK = 512 }), "HeadDimK 512 must be KVLoraRank + RopeDim = 576"},
		{"mla dim v", mutate(mla, func(l *LayerSpec) { l.HeadDimV = 128 }), "HeadDimV 128 must be KVLoraRank 512"},
		{"mla rank", mutate(mla, func(l *LayerSpec) { l.KVLoraRank = 0 }), "KVLoraRank 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.layer.Validate()
			if tt.mention == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.mention)
			assert.Contains(t, err.Error(), "gokv: layer")
		})
	}
}

func TestModelValidate(t *testing.T) {
	good, err := Preset("llama-3.1-8b")
	require.NoError(t, err)
	require.NoError(t, good.Validate())

	bad := good.Clone()
	bad.Name = "broken"
	bad.Layers[3].HeadsKV = 7
	err = bad.Validate()
	require.Error(t, err)
	assert.Equal(t, `gokv: model "broken": layer 3: HeadsKV 7 does not divide HeadsQ 32`, err.Error())
	assert.Equal(t, 8, good.Layers[3].HeadsKV, "Clone must not share Layers")

	tests := []struct {
		name    string
		spec    ModelSpec
		mention string
	}{
		{"no layers", ModelSpec{Name: "empty"}, `model "empty": no layers`},
		{"sinks", ModelSpec{Layers: good.Layers, SinkTokens: -1}, "SinkTokens -1"},
		{"positions", ModelSpec{Layers: good.Layers, MaxPositions: -1}, "MaxPositions -1"},
		{"weights", ModelSpec{Layers: good.Layers, WeightsBytes: -1}, "WeightsBytes -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.ErrorContains(t, tt.spec.Validate(), tt.mention)
		})
	}
}

func TestModelHybrid(t *testing.T) {
	llama, err := Preset("llama-3.1-8b")
	require.NoError(t, err)
	assert.False(t, llama.Hybrid())
	oss, err := Preset("gpt-oss-20b")
	require.NoError(t, err)
	assert.True(t, oss.Hybrid())
}
