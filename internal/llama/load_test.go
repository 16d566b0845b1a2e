package llama

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/gokv"
)

// A synthetic model small enough to write in a test: hidden 8, 2 query heads and 1 kv head of dim 4,
// one layer, vocabulary 10.
func tinyConfig() map[string]any {
	return map[string]any{
		"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
		"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "max_position_embeddings": 16,
		"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": 10, "bos_token_id": 9,
		"tie_word_embeddings": false, "torch_dtype": "float32", "hidden_act": "silu",
	}
}

// tensorSpec is one tensor of a synthetic safetensors file.
type tensorSpec struct {
	dtype string
	shape []int
}

// tinyTensors lists the tensors tinyConfig implies (sinks adds the learned sink logits).
func tinyTensors(sinks bool) map[string]tensorSpec {
	f32 := func(shape ...int) tensorSpec { return tensorSpec{"F32", shape} }
	t := map[string]tensorSpec{
		"model.embed_tokens.weight": f32(10, 8), "model.norm.weight": f32(8), "lm_head.weight": f32(10, 8),
		"model.layers.0.input_layernorm.weight": f32(8), "model.layers.0.post_attention_layernorm.weight": f32(8),
		"model.layers.0.self_attn.q_proj.weight": f32(8, 8), "model.layers.0.self_attn.k_proj.weight": f32(4, 8),
		"model.layers.0.self_attn.v_proj.weight": f32(4, 8), "model.layers.0.self_attn.o_proj.weight": f32(8, 8),
		"model.layers.0.mlp.gate_proj.weight": f32(16, 8), "model.layers.0.mlp.up_proj.weight": f32(16, 8),
		"model.layers.0.mlp.down_proj.weight": f32(8, 16),
	}
	if sinks {
		t["model.layers.0.self_attn.sinks"] = f32(2)
	}
	return t
}

// safetensorsBytes serializes tensors (filled with small deterministic values) in the safetensors layout:
// an 8-byte little-endian header length, the JSON header, the data in header order.
func safetensorsBytes(t testing.TB, tensors map[string]tensorSpec) []byte {
	t.Helper()
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	header := map[string]any{}
	var body []byte
	for i, n := range names {
		ts := tensors[n]
		size := map[string]int{"F32": 4, "F16": 2}[ts.dtype]
		count := 1
		for _, d := range ts.shape {
			count *= d
		}
		start := len(body)
		for j := 0; j < count; j++ {
			v := float32(math.Sin(float64(i*1000+j))) * 0.3
			if size == 4 {
				body = binary.LittleEndian.AppendUint32(body, math.Float32bits(v))
			} else {
				body = append(body, 0, 0)
			}
		}
		header[n] = map[string]any{"dtype": ts.dtype, "shape": ts.shape, "data_offsets": []int{start, len(body)}}
	}
	h, err := json.Marshal(header)
	require.NoError(t, err)
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	return append(append(out, h...), body...)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// writeModel writes a model directory; nil config or weights leave that file out.
func writeModel(t *testing.T, config map[string]any, weights []byte) string {
	t.Helper()
	dir := t.TempDir()
	if config != nil {
		b, err := json.Marshal(config)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644))
	}
	if weights != nil {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "model.safetensors"), weights, 0o644))
	}
	return dir
}

func TestLoadSyntheticModelRuns(t *testing.T) {
	for _, sinks := range []bool{false, true} {
		cfg := tinyConfig()
		if sinks {
			cfg["attention_sinks"] = "learned"
		}
		m, err := Load(writeModel(t, cfg, safetensorsBytes(t, tinyTensors(sinks))))
		require.NoError(t, err)
		spec := m.Spec()
		require.Len(t, spec.Layers, 1)
		assert.Equal(t, sinks, spec.Layers[0].LearnedSinks)
		assert.Equal(t, map[bool]int{false: 4, true: 0}[sinks], spec.SinkTokens)
		assert.Equal(t, 16, spec.MaxPositions)

		eng := openCPU(t)
		cache := newTestCache(t, eng, m, "f16", 64)
		seq, err := cache.NewSequence()
		require.NoError(t, err)
		out, err := m.NewRunner(cache).Step(Entry{Seq: seq, Tokens: []int{9, 1, 2}, AllLogits: true})
		require.NoError(t, err)
		require.Len(t, out.Logits, 1)
		assert.Len(t, out.Logits[0], 3*10)
		assert.Equal(t, 3, out.Timing.Rows)
		assert.Greater(t, out.Timing.Total, out.Timing.Attention)
		assert.Positive(t, out.Timing.Attention)
	}
}

// TestLoadErrors: every bad file gives an error naming the file and what is wrong in it.
func TestLoadErrors(t *testing.T) {
	good := safetensorsBytes(t, tinyTensors(false))
	without := func(name string) []byte {
		ts := tinyTensors(false)
		delete(ts, name)
		return safetensorsBytes(t, ts)
	}
	with := func(name string, spec tensorSpec) []byte {
		ts := tinyTensors(false)
		ts[name] = spec
		return safetensorsBytes(t, ts)
	}
	config := func(key string, value any) map[string]any {
		c := tinyConfig()
		if value == nil {
			delete(c, key)
		} else {
			c[key] = value
		}
		return c
	}
	hugeHeader := append(binary.LittleEndian.AppendUint64(nil, 1<<40), good[8:]...)
	for _, tc := range []struct {
		name    string
		config  map[string]any
		weights []byte
		want    []string
	}{
		{"no config", nil, good, []string{"config.json", "no such file"}},
		{"no weights", tinyConfig(), nil, []string{"model.safetensors", "no such file"}},
		{"missing tensor", tinyConfig(), without("model.layers.0.mlp.up_proj.weight"),
			[]string{"model.safetensors", "tensor model.layers.0.mlp.up_proj.weight is missing"}},
		{"missing lm_head", tinyConfig(), without("lm_head.weight"), []string{"tensor lm_head.weight is missing"}},
		{"wrong shape", tinyConfig(), with("model.layers.0.self_attn.k_proj.weight", tensorSpec{"F32", []int{8, 8}}),
			[]string{"tensor model.layers.0.self_attn.k_proj.weight has shape [8 8], want [4 8]"}},
		{"wrong rank", tinyConfig(), with("model.norm.weight", tensorSpec{"F32", []int{1, 8}}),
			[]string{"tensor model.norm.weight has shape [1 8], want [8]"}},
		{"wrong dtype", tinyConfig(), with("model.norm.weight", tensorSpec{"F16", []int{8}}),
			[]string{"tensor model.norm.weight is F16, want F32"}},
		{"truncated data", tinyConfig(), good[:len(good)-100], []string{"model.safetensors", "truncated"}},
		{"truncated header", tinyConfig(), good[:40], []string{"model.safetensors", "header length", "runs past the end"}},
		{"shorter than the header length", tinyConfig(), good[:5], []string{"model.safetensors", "5 bytes: truncated"}},
		{"header length past the file", tinyConfig(), hugeHeader, []string{"header length 1099511627776 runs past the end"}},
		{"header not JSON", tinyConfig(), append(binary.LittleEndian.AppendUint64(nil, 4), "{{{{"...),
			[]string{"model.safetensors", "not a valid safetensors file", "invalid header"}},
		{"extra data", tinyConfig(), append(append([]byte(nil), good...), 1, 2, 3, 4), []string{"model.safetensors", "not a valid safetensors file (corrupt"}},
		{"sinks without config", tinyConfig(), safetensorsBytes(t, tinyTensors(true)),
			[]string{"model.layers.0.self_attn.sinks", `"attention_sinks": "learned"`}},
		{"config sinks, no tensor", config("attention_sinks", "learned"), good, []string{"tensor model.layers.0.self_attn.sinks is missing"}},
		{"config: bad sinks", config("attention_sinks", "yes"), good, []string{"config.json", `attention_sinks "yes"`}},
		{"config: no hidden_size", config("hidden_size", nil), good, []string{"config.json", "hidden_size is missing"}},
		{"config: heads", config("num_key_value_heads", 3), good, []string{"num_key_value_heads 3 must divide num_attention_heads 2"}},
		{"config: odd head_dim", config("head_dim", 3), good, []string{"head_dim 3 must be even"}},
		{"config: huge vocab", config("vocab_size", 1<<40), good, []string{"vocab_size 1099511627776 is outside"}},
		{"config: negative layers", config("num_hidden_layers", -1), good, []string{"num_hidden_layers -1 is outside"}},
		{"config: bos", config("bos_token_id", 10), good, []string{"bos_token_id 10 is not below vocab_size 10"}},
		{"config: model type", config("model_type", "gpt2"), good, []string{`model_type "gpt2"`}},
		{"config: act", config("hidden_act", "gelu"), good, []string{`hidden_act "gelu"`}},
		{"config: dtype", config("torch_dtype", "bfloat16"), good, []string{`torch_dtype "bfloat16"`}},
		{"config: rope scaling", config("rope_scaling", map[string]any{"type": "linear"}), good, []string{"rope_scaling"}},
		{"config: string count", config("hidden_size", "8"), good, []string{"config.json", "not valid JSON"}},
		{"config: eps", config("rms_norm_eps", -1.0), good, []string{"rms_norm_eps -1 must be in (0, 1)"}},
		// A config whose geometry disagrees with the file: every tensor is checked against it.
		{"config: wider than the file", config("hidden_size", 16), good,
			[]string{"tensor model.embed_tokens.weight has shape [10 8], want [10 16] (from config.json)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeModel(t, tc.config, tc.weights))
			require.Error(t, err)
			t.Log(err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.True(t, strings.HasPrefix(err.Error(), "llama: "), err.Error())
		})
	}
}

// TestStepErrors: bad entries are refused before anything is stored, naming the entry.
func TestStepErrors(t *testing.T) {
	m, err := Load(writeModel(t, tinyConfig(), safetensorsBytes(t, tinyTensors(false))))
	require.NoError(t, err)
	cache := newTestCache(t, openCPU(t), m, "f32", 64)
	seq, err := cache.NewSequence()
	require.NoError(t, err)
	r := m.NewRunner(cache)
	for _, tc := range []struct {
		entries []Entry
		want    string
	}{
		{nil, "no entries"},
		{[]Entry{{Seq: seq}}, "entry 0 has no tokens"},
		{[]Entry{{Seq: seq, Tokens: []int{9, 10}}}, "entry 0 token 1 is 10, outside the vocabulary [0, 10)"},
		{[]Entry{{Seq: seq, Tokens: []int{-1}}}, "token 0 is -1"},
		{[]Entry{{Seq: nil, Tokens: []int{1}}}, "Seq is nil"},
		{[]Entry{{Seq: seq, Tokens: []int{1}}, {Seq: seq, Tokens: []int{2}}}, "both sequence"},
	} {
		_, err := r.Step(tc.entries...)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
	assert.Equal(t, 0, seq.Len(), "a refused step stores nothing")
	out, err := r.Step(Entry{Seq: seq, Tokens: []int{9}})
	require.NoError(t, err)
	assert.Len(t, out.Logits[0], 10)
	assert.Equal(t, 1, seq.Len())
}

// TestSpecAgreesWithGokvConfigParser: the geometry built here is gokv's own reading of config.json, but
// for the learned sinks, which gokv.FromHFConfig only knows for model_type gpt_oss.
func TestSpecAgreesWithGokvConfigParser(t *testing.T) {
	for _, name := range testModels {
		m, err := Load(modelDir(name))
		require.NoError(t, err)
		theirs, err := gokv.LoadHFConfig(modelDir(name))
		require.NoError(t, err)
		ours := m.Spec()
		assert.Equal(t, theirs.MaxPositions, ours.MaxPositions, name)
		require.Len(t, ours.Layers, len(theirs.Layers), name)
		for i, l := range ours.Layers {
			want := theirs.Layers[i]
			want.LearnedSinks = m.Config.LearnedSinks
			assert.Equal(t, want, l, "%s layer %d", name, i)
		}
		if m.Config.LearnedSinks {
			assert.Zero(t, ours.SinkTokens, name)
			assert.NotNil(t, m.SinkLogits(0))
		} else {
			assert.Equal(t, theirs.SinkTokens, ours.SinkTokens, name)
			assert.Nil(t, m.SinkLogits(0))
		}
	}
}
