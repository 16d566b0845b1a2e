package gokv

import (
	"fmt"
	"strings"
)

// Preset returns the ModelSpec of a well-known model by its lowercase name (see Presets), with a
// fresh Layers slice the caller may modify. The geometry comes from each model's published
// config.json on HuggingFace (the source of each entry is noted beside it); WeightsBytes is left 0
// because it depends on how the weights are quantized. Safe for concurrent use.
func Preset(name string) (ModelSpec, error) {
	key := strings.ToLower(strings.TrimSpace(name))
	for _, p := range presetTable {
		if p.name == key {
			spec := p.build()
			spec.Name = p.name
			return spec, nil
		}
	}
	return ModelSpec{}, fmt.Errorf("gokv: unknown model preset %q (known: %s)", name, strings.Join(Presets(), ", "))
}

// Presets returns the names Preset accepts, in a stable order (families together, small first).
func Presets() []string {
	names := make([]string, len(presetTable))
	for i, p := range presetTable {
		names[i] = p.name
	}
	return names
}

type presetEntry struct {
	name  string
	build func() ModelSpec
}

// presetTable lists the presets. Each comment names the HuggingFace config.json the values come from.
var presetTable = []presetEntry{
	// meta-llama/Llama-3.1-8B: num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8,
	// hidden_size 4096 (head_dim 128), max_position_embeddings 131072.
	{"llama-3.1-8b", func() ModelSpec { return presetUniform(32, AttentionLayer(32, 8, 128), 131072) }},
	// meta-llama/Llama-3.1-70B: 80 layers, 64 heads, 8 kv heads, hidden_size 8192 (head_dim 128).
	// Open-TQ-Metal's planning example (docs/architecture.md §6).
	{"llama-3.1-70b", func() ModelSpec { return presetUniform(80, AttentionLayer(64, 8, 128), 131072) }},
	// mistralai/Mistral-7B-v0.3: 32 layers, 32 heads, 8 kv heads, head_dim 128, "sliding_window": null
	// (full attention on every layer), max_position_embeddings 32768.
	{"mistral-7b", func() ModelSpec { return presetUniform(32, AttentionLayer(32, 8, 128), 32768) }},
	// mistralai/Mistral-7B-v0.1: the same geometry with "sliding_window": 4096 on every layer.
	{"mistral-7b-v0.1", func() ModelSpec {
		l := AttentionLayer(32, 8, 128)
		l.Window = 4096
		return presetUniform(32, l, 32768)
	}},
	// openai/gpt-oss-20b: 24 layers, 64 heads, 8 kv heads, head_dim 64, layer_types alternating
	// sliding_attention (window 128) and full_attention starting with sliding; learned sinks on every
	// layer, so no StreamingLLM sink tokens. max_position_embeddings 131072.
	{"gpt-oss-20b", func() ModelSpec { return presetGPTOSS(24) }},
	// openai/gpt-oss-120b: 36 layers, same attention geometry as gpt-oss-20b.
	{"gpt-oss-120b", func() ModelSpec { return presetGPTOSS(36) }},
	// deepseek-ai/DeepSeek-V2-Lite: 27 layers, 16 heads, kv_lora_rank 512, qk_rope_head_dim 64
	// (v_head_dim 128 is the per-head value size after up-projection; the absorbed cache holds one
	// 576-dim latent per token and attends with d_v = 512). max_position_embeddings 163840.
	{"deepseek-v2-lite", func() ModelSpec { return presetUniform(27, MLALayer(16, 512, 64), 163840) }},
	// deepseek-ai/DeepSeek-V3: 61 layers, 128 heads, kv_lora_rank 512, qk_rope_head_dim 64.
	{"deepseek-v3", func() ModelSpec { return presetUniform(61, MLALayer(128, 512, 64), 163840) }},
	// tiiuae/falcon-7b: num_hidden_layers 32, num_attention_heads 71, multi_query true (1 kv head),
	// hidden_size 4544 (head_dim 64). The config has no max_position_embeddings; the model card gives a
	// 2048-token training context.
	{"falcon-7b", func() ModelSpec { return presetUniform(32, AttentionLayer(71, 1, 64), 2048) }},
	// google/gemma-2-9b: 42 layers, 16 heads, 8 kv heads, head_dim 256, sliding_window 4096 on the even
	// layers (transformers' Gemma2: is_sliding = not layer_idx % 2), max_position_embeddings 8192.
	{"gemma-2-9b", func() ModelSpec {
		return presetPattern(42, AttentionLayer(16, 8, 256), 4096, func(i int) bool { return i%2 == 0 }, 8192)
	}},
	// google/gemma-3-12b-it (text_config): 48 layers, 16 heads, 8 kv heads, head_dim 256, sliding_window
	// 1024, sliding_window_pattern 6: five sliding layers then one full ((i+1) % 6 == 0), 131072 positions.
	{"gemma-3-12b", func() ModelSpec {
		return presetPattern(48, AttentionLayer(16, 8, 256), 1024, func(i int) bool { return (i+1)%6 != 0 }, 131072)
	}},
}

// presetUniform builds a model of n identical layers with StreamingLLM's default sink tokens.
func presetUniform(n int, layer LayerSpec, maxPositions int) ModelSpec {
	layers := make([]LayerSpec, n)
	for i := range layers {
		layers[i] = layer
	}
	return ModelSpec{Layers: layers, SinkTokens: DefaultSinkTokens, MaxPositions: maxPositions}
}

// presetPattern builds a hybrid model: layer i gets the given window when sliding(i), else full attention.
func presetPattern(n int, layer LayerSpec, window int, sliding func(int) bool, maxPositions int) ModelSpec {
	spec := presetUniform(n, layer, maxPositions)
	for i := range spec.Layers {
		if sliding(i) {
			spec.Layers[i].Window = window
		}
	}
	return spec
}

// presetGPTOSS builds gpt-oss with n layers: alternating sliding (128) / full, learned sinks everywhere.
func presetGPTOSS(n int) ModelSpec {
	spec := presetPattern(n, AttentionLayer(64, 8, 64), 128, func(i int) bool { return i%2 == 0 }, 131072)
	for i := range spec.Layers {
		spec.Layers[i].LearnedSinks = true
	}
	spec.SinkTokens = 0
	return spec
}
