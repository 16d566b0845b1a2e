package gokv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The fixtures in testdata/hf are the published config.json files of each model (HuggingFace model
// cards), kept verbatim in their attention-relevant fields.
func TestFromHFConfigFixtures(t *testing.T) {
	tests := []struct {
		file, preset            string
		kind                    AttentionKind
		headsQ, headsKV, dk, dv int
		windows                 map[int]int // layer -> window for the layers checked (others must agree with the preset)
		learnedSinks            bool
		sinkTokens              int
		maxPositions            int
	}{
		{"llama-3.1-8b.json", "llama-3.1-8b", GQA, 32, 8, 128, 128, map[int]int{0: 0, 31: 0}, false, 4, 131072},
		{"llama-3.1-70b.json", "llama-3.1-70b", GQA, 64, 8, 128, 128, map[int]int{0: 0, 79: 0}, false, 4, 131072},
		{"mistral-7b-v0.3.json", "mistral-7b", GQA, 32, 8, 128, 128, map[int]int{0: 0, 31: 0}, false, 4, 32768},
		{"mistral-7b-v0.1.json", "mistral-7b-v0.1", GQA, 32, 8, 128, 128, map[int]int{0: 4096, 31: 4096}, false, 4, 32768},
		{"gpt-oss-20b.json", "gpt-oss-20b", GQA, 64, 8, 64, 64, map[int]int{0: 128, 1: 0, 22: 128, 23: 0}, true, 0, 131072},
		{"deepseek-v2-lite.json", "deepseek-v2-lite", MLA, 16, 1, 576, 512, map[int]int{0: 0}, false, 4, 163840},
		{"falcon-7b.json", "falcon-7b", MQA, 71, 1, 64, 64, map[int]int{0: 0}, false, 4, 0},
		{"gemma-2-9b.json", "gemma-2-9b", GQA, 16, 8, 256, 256, map[int]int{0: 4096, 1: 0, 40: 4096, 41: 0}, false, 4, 8192},
		// gemma-3-12b-it nests the text model in text_config and omits head_dim and
		// sliding_window_pattern (transformers defaults them to 256 and 6).
		{"gemma-3-12b-it.json", "gemma-3-12b", GQA, 16, 8, 256, 256, map[int]int{0: 1024, 4: 1024, 5: 0, 47: 0}, false, 4, 0},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			spec, err := LoadHFConfig(filepath.Join("testdata", "hf", tt.file))
			require.NoError(t, err)
			preset, err := Preset(tt.preset)
			require.NoError(t, err)

			for i, l := range spec.Layers {
				assert.Equal(t, tt.kind, l.Kind, "layer %d", i)
				assert.Equal(t, tt.headsQ, l.HeadsQ, "layer %d", i)
				assert.Equal(t, tt.headsKV, l.HeadsKV, "layer %d", i)
				assert.Equal(t, tt.dk, l.HeadDimK, "layer %d", i)
				assert.Equal(t, tt.dv, l.HeadDimV, "layer %d", i)
				assert.Equal(t, tt.learnedSinks, l.LearnedSinks, "layer %d", i)
			}
			for i, w := range tt.windows {
				assert.Equal(t, w, spec.Layers[i].Window, "window of layer %d", i)
			}
			assert.Equal(t, tt.sinkTokens, spec.SinkTokens)
			assert.Equal(t, tt.maxPositions, spec.MaxPositions)

			// The config and the preset describe the same model.
			assert.Equal(t, preset.Layers, spec.Layers)
			assert.Equal(t, preset.SinkTokens, spec.SinkTokens)
			if spec.MaxPositions != 0 {
				assert.Equal(t, preset.MaxPositions, spec.MaxPositions)
			}
		})
	}
}

func TestFromHFConfigVariants(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		layers  int
		layer0  LayerSpec
		windows []int // windows of all layers (nil: all 0)
		sinks   int
		title   string
	}{
		{
			name:   "MHA when num_key_value_heads is absent",
			json:   `{"model_type":"llama","num_hidden_layers":2,"num_attention_heads":32,"hidden_size":4096}`,
			layers: 2, layer0: AttentionLayer(32, 32, 128), sinks: 4, title: "llama",
		},
		{
			name:   "RefinedWebModel aliases with multi_query",
			json:   `{"model_type":"RefinedWebModel","n_layer":3,"n_head":71,"hidden_size":4544,"multi_query":true,"_name_or_path":"tiiuae/falcon-7b"}`,
			layers: 3, layer0: AttentionLayer(71, 1, 64), sinks: 4, title: "tiiuae/falcon-7b",
		},
		{
			name:   "Falcon-40B new decoder architecture",
			json:   `{"model_type":"falcon","num_hidden_layers":2,"num_attention_heads":128,"num_kv_heads":8,"hidden_size":8192,"new_decoder_architecture":true,"multi_query":true}`,
			layers: 2, layer0: AttentionLayer(128, 8, 64), sinks: 4, title: "falcon",
		},
		{
			name:   "RefinedWeb n_head_kv",
			json:   `{"model_type":"RefinedWeb","n_layer":2,"n_head":128,"n_head_kv":8,"n_embd":8192}`,
			layers: 2, layer0: AttentionLayer(128, 8, 64), sinks: 4, title: "RefinedWeb",
		},
		{
			name:   "Falcon MHA without multi_query",
			json:   `{"model_type":"falcon","num_hidden_layers":1,"num_attention_heads":16,"hidden_size":1024,"multi_query":false}`,
			layers: 1, layer0: AttentionLayer(16, 16, 64), sinks: 4, title: "falcon",
		},
		{
			name:   "Qwen2 use_sliding_window false ignores sliding_window",
			json:   `{"model_type":"qwen2","num_hidden_layers":2,"num_attention_heads":28,"num_key_value_heads":4,"hidden_size":3584,"sliding_window":131072,"use_sliding_window":false,"max_window_layers":28}`,
			layers: 2, layer0: AttentionLayer(28, 4, 128), sinks: 4, title: "qwen2",
		},
		{
			name:   "Qwen2 use_sliding_window true with max_window_layers",
			json:   `{"model_type":"qwen2","num_hidden_layers":4,"num_attention_heads":28,"num_key_value_heads":4,"hidden_size":3584,"sliding_window":4096,"use_sliding_window":true,"max_window_layers":2}`,
			layers: 4, layer0: AttentionLayer(28, 4, 128), windows: []int{0, 0, 4096, 4096}, sinks: 4, title: "qwen2",
		},
		{
			name:   "layer_types win over sliding_window_pattern",
			json:   `{"model_type":"gemma3_text","num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":1,"head_dim":256,"sliding_window":512,"sliding_window_pattern":6,"layer_types":["full_attention","sliding_attention","full_attention"]}`,
			layers: 3, layer0: AttentionLayer(4, 1, 256), windows: []int{0, 512, 0}, sinks: 4, title: "gemma3_text",
		},
		{
			name:   "Cohere2-style sliding_window_pattern 4",
			json:   `{"model_type":"cohere2","num_hidden_layers":8,"num_attention_heads":32,"num_key_value_heads":8,"hidden_size":4096,"sliding_window":4096,"sliding_window_pattern":4}`,
			layers: 8, layer0: func() LayerSpec { l := AttentionLayer(32, 8, 128); l.Window = 4096; return l }(),
			windows: []int{4096, 4096, 4096, 0, 4096, 4096, 4096, 0}, sinks: 4, title: "cohere2",
		},
		{
			name:   "integral floats and null head_dim",
			json:   `{"num_hidden_layers":2.0,"num_attention_heads":8,"num_key_value_heads":2,"hidden_size":1024,"head_dim":null}`,
			layers: 2, layer0: AttentionLayer(8, 2, 128), sinks: 4, title: "",
		},
		{
			name:   "DeepSeek-V3 MLA",
			json:   `{"model_type":"deepseek_v3","num_hidden_layers":61,"num_attention_heads":128,"num_key_value_heads":128,"kv_lora_rank":512,"qk_rope_head_dim":64,"qk_nope_head_dim":128,"v_head_dim":128,"hidden_size":7168}`,
			layers: 61, layer0: MLALayer(128, 512, 64), sinks: 4, title: "deepseek_v3",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := FromHFConfig(strings.NewReader(tt.json))
			require.NoError(t, err)
			require.Len(t, spec.Layers, tt.layers)
			assert.Equal(t, tt.layer0, spec.Layers[0])
			assert.Equal(t, tt.sinks, spec.SinkTokens)
			assert.Equal(t, tt.title, spec.Name)
			for i, l := range spec.Layers {
				want := 0
				if tt.windows != nil {
					want = tt.windows[i]
				}
				assert.Equal(t, want, l.Window, "window of layer %d", i)
			}
		})
	}
}

func TestFromHFConfigErrors(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		mention string
	}{
		{"empty", ``, "invalid JSON"},
		{"truncated", `{"num_hidden_layers": 32,`, "invalid JSON"},
		{"trailing data", `{"num_hidden_layers": 32} {}`, "extra data"},
		{"not an object", `[1,2,3]`, "not a JSON object"},
		{"no layers", `{"num_attention_heads":32,"hidden_size":4096}`, "num_hidden_layers / n_layer / num_layers is missing"},
		{"no heads", `{"num_hidden_layers":32,"hidden_size":4096}`, "num_attention_heads / n_head is missing"},
		{"zero layers", `{"num_hidden_layers":0,"num_attention_heads":32,"hidden_size":4096}`, "num_hidden_layers 0 must be >= 1"},
		{"string heads", `{"num_hidden_layers":32,"num_attention_heads":"32","hidden_size":4096}`, `num_attention_heads is "32", want an integer`},
		{"fractional dim", `{"num_hidden_layers":2,"num_attention_heads":4,"head_dim":64.5}`, "head_dim is 64.5, want an integer"},
		{"no head dim", `{"num_hidden_layers":32,"num_attention_heads":32}`, "neither head_dim nor hidden_size"},
		{"indivisible hidden", `{"num_hidden_layers":2,"num_attention_heads":3,"hidden_size":1000}`, "hidden_size 1000 is not a multiple of num_attention_heads 3"},
		{"kv heads do not divide", `{"num_hidden_layers":2,"num_attention_heads":32,"num_key_value_heads":5,"hidden_size":4096}`, "layer 0: HeadsKV 5 does not divide HeadsQ 32"},
		{"mla without rope", `{"num_hidden_layers":2,"num_attention_heads":16,"kv_lora_rank":512}`, "qk_rope_head_dim is missing"},
		{"mla zero rank", `{"num_hidden_layers":2,"num_attention_heads":16,"kv_lora_rank":0,"qk_rope_head_dim":64}`, "kv_lora_rank 0"},
		{"falcon new arch without kv", `{"num_hidden_layers":2,"num_attention_heads":16,"hidden_size":1024,"new_decoder_architecture":true}`, "num_kv_heads is missing"},
		{"bool as string", `{"num_hidden_layers":2,"num_attention_heads":16,"hidden_size":1024,"multi_query":"yes"}`, `multi_query is "yes", want true or false`},
		{"model_type number", `{"model_type":7,"num_hidden_layers":2,"num_attention_heads":16,"hidden_size":1024}`, "model_type is 7, want a string"},
		{"layer_types length", `{"num_hidden_layers":3,"num_attention_heads":4,"hidden_size":256,"sliding_window":8,"layer_types":["full_attention"]}`, "layer_types must be a list of 3 strings"},
		{"layer_types unknown", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"sliding_window":8,"layer_types":["full_attention","linear_attention"]}`, `layer_types[1] "linear_attention" is not supported`},
		{"sliding without window", `{"num_hidden_layers":1,"num_attention_heads":4,"hidden_size":256,"layer_types":["sliding_attention"]}`, "layer_types[0] is sliding_attention but sliding_window is null"},
		{"bad pattern", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"sliding_window":8,"sliding_window_pattern":0}`, "sliding_window_pattern 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := FromHFConfig(strings.NewReader(tt.json))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.mention)
			assert.True(t, strings.HasPrefix(err.Error(), "gokv: config.json"), err.Error())
		})
	}
}

func TestLoadHFConfigPaths(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join("testdata", "hf", "llama-3.1-8b.json"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600))

	spec, err := LoadHFConfig(dir) // a model directory
	require.NoError(t, err)
	assert.Len(t, spec.Layers, 32)

	_, err = LoadHFConfig(filepath.Join(dir, "missing.json"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "missing.json")

	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"num_hidden_layers": 1}`), 0o600))
	_, err = LoadHFConfig(bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "num_attention_heads")
	assert.Contains(t, err.Error(), bad, "the error names the file")
}
