package gokv

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"

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

		// Counts that would size allocations or overflow the C core's limits.
		{"2^31-1 layers", `{"num_hidden_layers":2147483647,"num_attention_heads":32,"hidden_size":4096}`, "num_hidden_layers 2147483647 is more than the 4096 layers gokv supports"},
		{"4097 layers", `{"n_layer":4097,"num_attention_heads":32,"hidden_size":4096}`, "n_layer 4097 is more than the 4096 layers"},
		{"1e30 layers", `{"num_hidden_layers":1e30,"num_attention_heads":32,"hidden_size":4096}`, "num_hidden_layers 1e30 is more than the 4096 layers"},
		{"2^64 layers", `{"num_hidden_layers":18446744073709551616,"num_attention_heads":32,"hidden_size":4096}`, "num_hidden_layers 18446744073709551616 is more than"},
		{"negative layers", `{"num_hidden_layers":-1,"num_attention_heads":32,"hidden_size":4096}`, "num_hidden_layers -1 must be >= 1"},
		{"query heads", `{"num_hidden_layers":2,"num_attention_heads":32768,"num_key_value_heads":8,"head_dim":128}`, "num_attention_heads 32768 is more than the 16384 query heads"},
		{"kv heads", `{"num_hidden_layers":2,"num_attention_heads":4096,"num_key_value_heads":2048,"head_dim":128}`, "num_key_value_heads 2048 is more than the 1024 kv heads"},
		{"zero kv heads", `{"num_hidden_layers":2,"num_attention_heads":32,"num_key_value_heads":0,"head_dim":128}`, "num_key_value_heads 0 must be >= 1"},
		{"falcon kv heads", `{"num_hidden_layers":2,"num_attention_heads":4096,"num_kv_heads":4096,"new_decoder_architecture":true,"head_dim":64}`, "num_kv_heads 4096 is more than the 1024 kv heads"},
		{"MHA beyond the kv limit", `{"num_hidden_layers":2,"num_attention_heads":2048,"head_dim":64}`, "num_attention_heads 2048 with no num_key_value_heads means as many kv heads (MHA), more than the 1024"},
		{"head_dim", `{"num_hidden_layers":2,"num_attention_heads":8,"head_dim":2048}`, "head_dim 2048 is more than the 1024 dims"},
		{"negative head_dim", `{"num_hidden_layers":2,"num_attention_heads":8,"head_dim":-128}`, "head_dim -128 must be >= 1"},
		{"hidden_size / heads", `{"num_hidden_layers":2,"num_attention_heads":2,"hidden_size":1000000}`, "hidden_size 1000000 / num_attention_heads 2 is a head dim of 500000, more than the 1024 dims"},
		{"negative hidden_size", `{"num_hidden_layers":2,"num_attention_heads":32,"hidden_size":-4096}`, "hidden_size -4096 must be >= 1"},
		{"kv_lora_rank", `{"num_hidden_layers":2,"num_attention_heads":16,"kv_lora_rank":4096,"qk_rope_head_dim":64}`, "kv_lora_rank 4096 is more than the 1024 dims"},
		{"negative rope", `{"num_hidden_layers":2,"num_attention_heads":16,"kv_lora_rank":512,"qk_rope_head_dim":-64}`, "qk_rope_head_dim -64 must be >= 0"},
		{"latent", `{"num_hidden_layers":2,"num_attention_heads":16,"kv_lora_rank":1000,"qk_rope_head_dim":64}`, "kv_lora_rank 1000 + qk_rope_head_dim 64 is more than the 1024 dims"},
		{"window beyond int32", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"sliding_window":1e12}`, "sliding_window 1e12 is more than the 2147483647 positions"},
		{"positions beyond int32", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"max_position_embeddings":3000000000}`, "max_position_embeddings 3000000000 is more than the 2147483647 positions"},
		{"pattern", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"sliding_window":8,"sliding_window_pattern":1000000}`, "sliding_window_pattern 1000000 is more than the 4096 layers"},
		{"max_window_layers", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"sliding_window":8,"use_sliding_window":true,"max_window_layers":-1}`, "max_window_layers -1 must be >= 0"},
		{"layer_types longer than the layers", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"sliding_window":8,"layer_types":["full_attention","full_attention","full_attention"]}`, "layer_types must be a list of 2 strings (one per layer), got 3 entries"},
		{"layer_types not a list", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"layer_types":"full_attention"}`, `layer_types must be a list of 2 strings (one per layer), got "full_attention"`},

		// Negative values are errors, not "absent".
		{"negative sliding_window", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"sliding_window":-5}`, "sliding_window -5 must be >= 0 (0 or null: no sliding window)"},
		{"negative max_position_embeddings", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"max_position_embeddings":-1}`, "max_position_embeddings -1 must be >= 0 (0 or null: unknown)"},
		{"negative n_positions", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"n_positions":-2048}`, "n_positions -2048 must be >= 0"},
		{"negative window with layer_types", `{"num_hidden_layers":1,"num_attention_heads":4,"hidden_size":256,"sliding_window":-1,"layer_types":["full_attention"]}`, "sliding_window -1 must be >= 0"},

		// Values that are not integers, whatever their size.
		{"tiny fraction", `{"num_hidden_layers":1e-400,"num_attention_heads":4,"hidden_size":256}`, "num_hidden_layers is 1e-400, want an integer"},
		{"huge fraction", `{"num_hidden_layers":2.5e0,"num_attention_heads":4,"hidden_size":256}`, "num_hidden_layers is 2.5e0, want an integer"},
		{"list", `{"num_hidden_layers":[32],"num_attention_heads":4,"hidden_size":256}`, "num_hidden_layers is [32], want an integer"},
		{"object", `{"num_hidden_layers":{"n":32},"num_attention_heads":4,"hidden_size":256}`, `num_hidden_layers is {"n":32}, want an integer`},
		{"bool", `{"num_hidden_layers":true,"num_attention_heads":4,"hidden_size":256}`, "num_hidden_layers is true, want an integer"},
		{"deep nesting", strings.Repeat("[", 20000) + strings.Repeat("]", 20000), "invalid JSON"},
		{"not JSON", "\x00\xff\xfe garbage", "invalid JSON"},
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

// 0 and null keep their documented meanings: no sliding window, unknown max positions.
func TestFromHFConfigZeroAndNull(t *testing.T) {
	tests := []struct {
		name         string
		json         string
		window       int
		maxPositions int
	}{
		{"absent", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256}`, 0, 0},
		{"null", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"sliding_window":null,"max_position_embeddings":null}`, 0, 0},
		{"zero", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"sliding_window":0,"max_position_embeddings":0}`, 0, 0},
		{"set", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"sliding_window":512,"n_positions":2048}`, 512, 2048},
		{"at the limits", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"sliding_window":2147483647,"max_position_embeddings":2147483647.0}`, 2147483647, 2147483647},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := FromHFConfig(strings.NewReader(tt.json))
			require.NoError(t, err)
			assert.Equal(t, tt.window, spec.Layers[0].Window)
			assert.Equal(t, tt.maxPositions, spec.MaxPositions)
		})
	}
}

// The largest geometry the limits allow still loads: they bound, they do not cut real models.
func TestFromHFConfigAtTheLimits(t *testing.T) {
	spec, err := FromHFConfig(strings.NewReader(`{"num_hidden_layers":4096,"num_attention_heads":16384,"num_key_value_heads":1024,"head_dim":1024}`))
	require.NoError(t, err)
	assert.Len(t, spec.Layers, 4096)
	assert.Equal(t, AttentionLayer(16384, 1024, 1024), spec.Layers[0])

	spec, err = FromHFConfig(strings.NewReader(`{"num_hidden_layers":1,"num_attention_heads":128,"kv_lora_rank":960,"qk_rope_head_dim":64}`))
	require.NoError(t, err)
	assert.Equal(t, MLALayer(128, 960, 64), spec.Layers[0])
}

// zeros is an endless reader, like /dev/zero.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestFromHFConfigSizeLimit(t *testing.T) {
	valid := `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256}`
	tests := []struct {
		name    string
		r       io.Reader
		mention string // "" when it must load
	}{
		{"1 MiB with padding", strings.NewReader(valid + strings.Repeat(" ", 1<<20-len(valid))), ""},
		{"one byte more", strings.NewReader(valid + strings.Repeat(" ", 1<<20-len(valid)+1)), "config.json is larger than 1 MiB"},
		{"endless", zeros{}, "config.json is larger than 1 MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			spec, err := FromHFConfig(tt.r)
			if tt.mention == "" {
				require.NoError(t, err)
				assert.Len(t, spec.Layers, 2)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.mention)
			assert.Less(t, time.Since(start), 10*time.Second, "fails fast")
		})
	}
	if _, err := os.Stat("/dev/zero"); err == nil {
		_, err := LoadHFConfig("/dev/zero")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "larger than 1 MiB")
		assert.Contains(t, err.Error(), "/dev/zero")
	}
}

// A name from the file is printed by the CLI: nothing in it may drive the terminal.
func TestFromHFConfigNameIsPrintable(t *testing.T) {
	tests := []struct {
		name string
		json string // the _name_or_path / model_type fields
		want string
	}{
		{"plain", `"_name_or_path":"meta-llama/Llama-3.1-8B"`, "meta-llama/Llama-3.1-8B"},
		{"unicode letters stay", `"_name_or_path":"modèle/日本語"`, "modèle/日本語"},
		{"ANSI colour", `"_name_or_path":"\u001b[31mred\u001b[0m"`, "?[31mred?[0m"},
		{"OSC title and bell", `"_name_or_path":"\u001b]0;pwned\u0007"`, "?]0;pwned?"},
		{"C1 CSI, DEL, newline", `"_name_or_path":"a\u009b2Jb\u007fc\nd\re"`, "a?2Jb?c?d?e"},
		{"bidi override", `"_name_or_path":"abc\u202edef"`, "abc?def"},
		{"invalid UTF-8", "\"_name_or_path\":\"a\xffb\"", "a?b"},
		{"from model_type", `"model_type":"x\u001b[2Jy"`, "x?[2Jy"},
		{"long", `"_name_or_path":"` + strings.Repeat("n", 1000) + `"`, strings.Repeat("n", 256) + "..."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := FromHFConfig(strings.NewReader(`{"num_hidden_layers":1,"num_attention_heads":4,"hidden_size":256,` + tt.json + `}`))
			require.NoError(t, err)
			assert.Equal(t, tt.want, spec.Name)
			for _, r := range spec.Name {
				assert.True(t, unicode.IsPrint(r), "rune %U", r)
			}
		})
	}
}

// Error messages quote values from the file; they must not carry control characters either.
func TestFromHFConfigErrorsArePrintable(t *testing.T) {
	for _, value := range []string{`"\u001b[2J"`, `"\u009b31m"`, `"\u007f"`, `"\u202e"`, `"` + strings.Repeat("é", 100) + `"`} {
		_, err := FromHFConfig(strings.NewReader(`{"num_hidden_layers":` + value + `}`))
		require.Error(t, err)
		for _, r := range err.Error() {
			assert.True(t, unicode.IsPrint(r), "rune %U in %q", r, err.Error())
		}
		assert.Contains(t, err.Error(), "num_hidden_layers is")
	}
}
