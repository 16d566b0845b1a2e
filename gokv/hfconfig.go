package gokv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// LoadHFConfig reads a HuggingFace config.json (or a model directory containing one) and returns its
// ModelSpec; see FromHFConfig. Errors name the file.
func LoadHFConfig(path string) (ModelSpec, error) {
	if info, err := os.Stat(path); err == nil && info.IsDir() {
		path = filepath.Join(path, "config.json")
	}
	f, err := os.Open(path)
	if err != nil {
		return ModelSpec{}, fmt.Errorf("gokv: %w", err)
	}
	defer f.Close()
	spec, err := FromHFConfig(f)
	if err != nil {
		return ModelSpec{}, fmt.Errorf("%w (in %s)", err, path)
	}
	return spec, nil
}

// FromHFConfig detects a model's attention geometry from a HuggingFace config.json (seed 001's
// auto-detection, extended to hybrid models). Rules, in order:
//
//   - Multimodal wrappers: the fields of "text_config" override the top level (Gemma 3, Llama 4 style).
//   - Layers: num_hidden_layers (aliases n_layer, num_layers). Query heads: num_attention_heads (n_head).
//   - MLA (DeepSeek-V2/V3): kv_lora_rank present and not null; the cache holds one latent of
//     kv_lora_rank + qk_rope_head_dim per token, values its first kv_lora_rank dims.
//   - Otherwise kv heads: num_key_value_heads; else Falcon's num_kv_heads / n_head_kv when
//     new_decoder_architecture is true; else 1 when multi_query is true; else num_kv_heads / n_head_kv;
//     else as many as query heads (MHA). The kind (MHA/GQA/MQA) follows from the two counts.
//   - Head dim: head_dim, else hidden_size (n_embd) / num_attention_heads; Gemma 2/3 default to 256.
//   - Windows: layer_types ("sliding_attention" / "full_attention") when present; else none when
//     use_sliding_window is false (Qwen2); else, when sliding_window is set and not null:
//     sliding_window_pattern N (Gemma 3, default 6) makes every layer sliding except (i+1) % N == 0;
//     model_type gemma2 makes the even layers sliding; use_sliding_window true with max_window_layers M
//     makes layers >= M sliding (Qwen2); otherwise every layer is sliding (Mistral v0.1).
//   - Learned sinks on every layer for model_type gpt_oss (SinkTokens 0); other models get
//     DefaultSinkTokens.
//   - Name: _name_or_path, else model_type. MaxPositions: max_position_embeddings (n_positions).
//
// The spec is validated before it is returned. Errors name the offending field and value. Chunked or
// linear attention layer types are rejected rather than guessed. FromHFConfig reads r to EOF and keeps
// no state: it is safe for concurrent use on different readers.
func FromHFConfig(r io.Reader) (ModelSpec, error) {
	cfg, err := hfDecode(r)
	if err != nil {
		return ModelSpec{}, err
	}
	modelType, err := cfg.str("model_type")
	if err != nil {
		return ModelSpec{}, err
	}
	hfApplyDefaults(cfg, modelType)

	nLayers, err := cfg.requiredPositive("num_hidden_layers", "n_layer", "num_layers")
	if err != nil {
		return ModelSpec{}, err
	}
	headsQ, err := cfg.requiredPositive("num_attention_heads", "n_head")
	if err != nil {
		return ModelSpec{}, err
	}
	layer, err := hfLayer(cfg, headsQ)
	if err != nil {
		return ModelSpec{}, err
	}
	spec := ModelSpec{Layers: make([]LayerSpec, nLayers), SinkTokens: DefaultSinkTokens}
	for i := range spec.Layers {
		spec.Layers[i] = layer
	}
	if err := hfWindows(cfg, modelType, spec.Layers); err != nil {
		return ModelSpec{}, err
	}
	if modelType == "gpt_oss" {
		for i := range spec.Layers {
			spec.Layers[i].LearnedSinks = true
		}
		spec.SinkTokens = 0
	}
	if spec.Name, err = cfg.str("_name_or_path"); err != nil {
		return ModelSpec{}, err
	}
	if spec.Name == "" {
		spec.Name = modelType
	}
	if v, _, err := cfg.int("max_position_embeddings", "n_positions"); err != nil {
		return ModelSpec{}, err
	} else if v > 0 {
		spec.MaxPositions = v
	}
	if err := spec.Validate(); err != nil {
		return ModelSpec{}, fmt.Errorf("gokv: config.json: %w", err)
	}
	return spec, nil
}

// hfLayer detects the geometry shared by all layers (everything but the window).
func hfLayer(cfg hfConfig, headsQ int) (LayerSpec, error) {
	rank, hasRank, err := cfg.int("kv_lora_rank")
	if err != nil {
		return LayerSpec{}, err
	}
	if hasRank {
		if rank < 1 {
			return LayerSpec{}, fmt.Errorf("gokv: config.json: kv_lora_rank %d must be >= 1", rank)
		}
		rope, hasRope, err := cfg.int("qk_rope_head_dim")
		switch {
		case err != nil:
			return LayerSpec{}, err
		case !hasRope:
			return LayerSpec{}, errors.New("gokv: config.json: kv_lora_rank is set (MLA) but qk_rope_head_dim is missing")
		case rope < 0:
			return LayerSpec{}, fmt.Errorf("gokv: config.json: qk_rope_head_dim %d must be >= 0", rope)
		}
		return MLALayer(headsQ, rank, rope), nil
	}

	headsKV, err := hfKVHeads(cfg, headsQ)
	if err != nil {
		return LayerSpec{}, err
	}
	headDim, hasHeadDim, err := cfg.int("head_dim")
	if err != nil {
		return LayerSpec{}, err
	}
	if !hasHeadDim {
		hidden, hasHidden, err := cfg.int("hidden_size", "n_embd")
		switch {
		case err != nil:
			return LayerSpec{}, err
		case !hasHidden:
			return LayerSpec{}, errors.New("gokv: config.json: neither head_dim nor hidden_size is set")
		case hidden%headsQ != 0:
			return LayerSpec{}, fmt.Errorf("gokv: config.json: hidden_size %d is not a multiple of num_attention_heads %d (and head_dim is not set)", hidden, headsQ)
		}
		headDim = hidden / headsQ
	}
	if headDim < 1 {
		return LayerSpec{}, fmt.Errorf("gokv: config.json: head_dim %d must be >= 1", headDim)
	}
	return AttentionLayer(headsQ, headsKV, headDim), nil
}

// hfKVHeads applies the kv-head rules of FromHFConfig (Llama-style, then Falcon's variants).
func hfKVHeads(cfg hfConfig, headsQ int) (int, error) {
	if v, ok, err := cfg.int("num_key_value_heads"); err != nil || ok {
		return v, err
	}
	newArch, _, err := cfg.bool("new_decoder_architecture")
	if err != nil {
		return 0, err
	}
	multiQuery, _, err := cfg.bool("multi_query")
	if err != nil {
		return 0, err
	}
	falconKV, hasFalconKV, err := cfg.int("num_kv_heads", "n_head_kv")
	switch {
	case err != nil:
		return 0, err
	case newArch && !hasFalconKV:
		return 0, errors.New("gokv: config.json: new_decoder_architecture is true but num_kv_heads is missing")
	case newArch:
		return falconKV, nil
	case multiQuery:
		return 1, nil
	case hasFalconKV:
		return falconKV, nil
	}
	return headsQ, nil
}

// hfWindows sets each layer's Window from the config (see FromHFConfig for the rules).
func hfWindows(cfg hfConfig, modelType string, layers []LayerSpec) error {
	window, hasWindow, err := cfg.int("sliding_window")
	if err != nil {
		return err
	}
	if types, ok := cfg["layer_types"]; ok && types != nil {
		list, isList := types.([]any)
		if !isList || len(list) != len(layers) {
			return fmt.Errorf("gokv: config.json: layer_types must be a list of %d strings (one per layer), got %s",
				len(layers), hfShow(types))
		}
		for i, t := range list {
			switch t {
			case "full_attention":
			case "sliding_attention":
				if !hasWindow || window < 1 {
					return fmt.Errorf("gokv: config.json: layer_types[%d] is sliding_attention but sliding_window is %s",
						i, hfShow(cfg["sliding_window"]))
				}
				layers[i].Window = window
			default:
				return fmt.Errorf("gokv: config.json: layer_types[%d] %s is not supported (want sliding_attention or full_attention)",
					i, hfShow(t))
			}
		}
		return nil
	}
	useSliding, hasUseSliding, err := cfg.bool("use_sliding_window")
	if err != nil {
		return err
	}
	if !hasWindow || window < 1 || (hasUseSliding && !useSliding) {
		return nil
	}
	sliding := func(int) bool { return true } // Mistral v0.1: every layer
	pattern, hasPattern, err := cfg.int("sliding_window_pattern")
	if err != nil {
		return err
	}
	maxWindowLayers, hasMaxWindowLayers, err := cfg.int("max_window_layers")
	if err != nil {
		return err
	}
	switch {
	case hasPattern:
		if pattern < 1 {
			return fmt.Errorf("gokv: config.json: sliding_window_pattern %d must be >= 1", pattern)
		}
		sliding = func(i int) bool { return (i+1)%pattern != 0 }
	case modelType == "gemma2":
		sliding = func(i int) bool { return i%2 == 0 }
	case hasUseSliding && hasMaxWindowLayers:
		sliding = func(i int) bool { return i >= maxWindowLayers }
	}
	for i := range layers {
		if sliding(i) {
			layers[i].Window = window
		}
	}
	return nil
}

// hfApplyDefaults fills fields that some model types' published configs omit because transformers'
// config classes default them (google/gemma-3-*-it's text_config has no head_dim and no
// sliding_window_pattern: Gemma3TextConfig defaults them to 256 and 6).
func hfApplyDefaults(cfg hfConfig, modelType string) {
	var defaults map[string]any
	switch modelType {
	case "gemma2":
		defaults = map[string]any{"head_dim": json.Number("256"), "sliding_window": json.Number("4096")}
	case "gemma3", "gemma3_text":
		defaults = map[string]any{"head_dim": json.Number("256"), "sliding_window": json.Number("4096"),
			"sliding_window_pattern": json.Number("6")}
	}
	for k, v := range defaults {
		if _, ok := cfg[k]; !ok {
			cfg[k] = v
		}
	}
}

// hfConfig is a decoded config.json object (numbers kept as json.Number).
type hfConfig map[string]any

// hfDecode parses one JSON object and merges its text_config over the top level.
func hfDecode(r io.Reader) (hfConfig, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("gokv: config.json: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var top any
	if err := dec.Decode(&top); err != nil {
		return nil, fmt.Errorf("gokv: config.json: invalid JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("gokv: config.json: invalid JSON: extra data after the top-level object")
	}
	obj, ok := top.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("gokv: config.json: the top level is %s, not a JSON object", hfShow(top))
	}
	cfg := hfConfig(obj)
	if text, ok := obj["text_config"].(map[string]any); ok {
		merged := hfConfig{}
		for k, v := range obj {
			merged[k] = v
		}
		for k, v := range text {
			merged[k] = v
		}
		cfg = merged
	}
	return cfg, nil
}

// int returns the first of keys that is present and not null, as an integer. A number with a zero
// fraction (128.0) counts as an integer; anything else is an error naming the key and the value.
func (c hfConfig) int(keys ...string) (value int, present bool, err error) {
	for _, k := range keys {
		v, ok := c[k]
		if !ok || v == nil {
			continue
		}
		if n, isNum := v.(json.Number); isNum {
			if i, err := n.Int64(); err == nil && i >= math.MinInt32 && i <= math.MaxInt32 {
				return int(i), true, nil
			}
			if f, err := n.Float64(); err == nil && f == math.Trunc(f) && math.Abs(f) <= math.MaxInt32 {
				return int(f), true, nil
			}
		}
		return 0, false, fmt.Errorf("gokv: config.json: %s is %s, want an integer", k, hfShow(v))
	}
	return 0, false, nil
}

// requiredPositive is int for a field that must be present and >= 1; the error names the first key.
func (c hfConfig) requiredPositive(keys ...string) (int, error) {
	v, ok, err := c.int(keys...)
	switch {
	case err != nil:
		return 0, err
	case !ok:
		return 0, fmt.Errorf("gokv: config.json: %s is missing", strings.Join(keys, " / "))
	case v < 1:
		return 0, fmt.Errorf("gokv: config.json: %s %d must be >= 1", keys[0], v)
	}
	return v, nil
}

// bool returns a boolean field (absent or null: false, not present).
func (c hfConfig) bool(key string) (value, present bool, err error) {
	v, ok := c[key]
	if !ok || v == nil {
		return false, false, nil
	}
	b, isBool := v.(bool)
	if !isBool {
		return false, false, fmt.Errorf("gokv: config.json: %s is %s, want true or false", key, hfShow(v))
	}
	return b, true, nil
}

// str returns a string field ("" when absent or null).
func (c hfConfig) str(key string) (string, error) {
	v, ok := c[key]
	if !ok || v == nil {
		return "", nil
	}
	s, isStr := v.(string)
	if !isStr {
		return "", fmt.Errorf("gokv: config.json: %s is %s, want a string", key, hfShow(v))
	}
	return s, nil
}

// hfShow renders a decoded JSON value for an error message, shortened to 60 bytes.
func hfShow(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(b) > 60 {
		return string(b[:57]) + "..."
	}
	return string(b)
}
