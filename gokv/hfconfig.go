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
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on what a config.json may ask for. A few hundred bytes of JSON must not make FromHFConfig
// allocate gigabytes or hand the C core a geometry it rejects later, so every count is bounded here
// with an error naming the key. The bounds are far above any published model.
const (
	hfMaxConfigBytes = 1 << 20 // config.json files are a few KiB; 1 MiB bounds reading /dev/zero or a stray blob
	hfMaxLayers      = 4096    // layers (and the layer_types list, sliding_window_pattern, max_window_layers)
	hfMaxHeadsKV     = 1024    // kv heads: the C core's n_kv_heads limit (bridge/gokv_validate.c)
	hfMaxHeadsQ      = 16384   // query heads: the C core's n_heads_q limit, 16 per kv head at most
	hfMaxHeadDim     = formatMaxHeadDim
	hfMaxPositions   = math.MaxInt32 // windows and max_position_embeddings: positions cross the ABI as int32
	hfMaxNameRunes   = 256           // _name_or_path / model_type as the model's name
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

// FromHFConfig detects a model's attention geometry from a HuggingFace config.json (the auto-detection of
// kvcached's multi-attention-type RFC, extended to hybrid models). Rules, in order:
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
//     makes layers >= M sliding (Qwen2); otherwise every layer is sliding (Mistral v0.1). A
//     sliding_window of 0 or null means no window.
//   - Learned sinks on every layer for model_type gpt_oss (SinkTokens 0); other models get
//     DefaultSinkTokens.
//   - Name: _name_or_path, else model_type, with control and other non-printable characters replaced
//     by '?' (the name is printed) and cut to 256 characters. MaxPositions: max_position_embeddings
//     (n_positions); 0 or null means unknown.
//
// Limits: the file is at most 1 MiB; at most 4096 layers, 16384 query heads and 1024 kv heads; head
// dims (and MLA's kv_lora_rank + qk_rope_head_dim) at most 1024; windows and max_position_embeddings
// at most 2^31-1; negative values are errors. The spec is validated before it is returned. Errors name
// the offending field and value. Chunked or linear attention layer types are rejected rather than
// guessed. FromHFConfig reads r up to EOF or the size limit and keeps no state: it is safe for
// concurrent use on different readers.
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

	nLayers, err := cfg.required(hfLayers, "num_hidden_layers", "n_layer", "num_layers")
	if err != nil {
		return ModelSpec{}, err
	}
	headsQ, err := cfg.required(hfHeadsQ, "num_attention_heads", "n_head")
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
	spec.Name = hfPrintable(spec.Name)
	if spec.MaxPositions, _, err = cfg.int(hfPositions, "max_position_embeddings", "n_positions"); err != nil {
		return ModelSpec{}, err
	}
	if err := spec.Validate(); err != nil {
		return ModelSpec{}, fmt.Errorf("gokv: config.json: %w", err)
	}
	return spec, nil
}

// hfRange bounds one integer field; unit names what it counts in the "more than" error.
type hfRange struct {
	min, max int
	unit     string
	zero     string // what 0 means when min is 0, for the "must be >= 0" error ("" when 0 means nothing special)
}

var (
	hfLayers    = hfRange{min: 1, max: hfMaxLayers, unit: "layers"}
	hfHeadsQ    = hfRange{min: 1, max: hfMaxHeadsQ, unit: "query heads"}
	hfHeadsKV   = hfRange{min: 1, max: hfMaxHeadsKV, unit: "kv heads"}
	hfDim       = hfRange{min: 1, max: hfMaxHeadDim, unit: "dims"}
	hfRopeDim   = hfRange{min: 0, max: hfMaxHeadDim, unit: "dims"}
	hfHidden    = hfRange{min: 1, max: math.MaxInt32, unit: "dims"}
	hfWindow    = hfRange{min: 0, max: hfMaxPositions, unit: "positions", zero: "0 or null: no sliding window"}
	hfPositions = hfRange{min: 0, max: hfMaxPositions, unit: "positions", zero: "0 or null: unknown"}
	hfPattern   = hfRange{min: 1, max: hfMaxLayers, unit: "layers"}
	hfLayerIdx  = hfRange{min: 0, max: hfMaxLayers, unit: "layers"}
)

// hfLayer detects the geometry shared by all layers (everything but the window).
func hfLayer(cfg hfConfig, headsQ int) (LayerSpec, error) {
	rank, hasRank, err := cfg.int(hfDim, "kv_lora_rank")
	if err != nil {
		return LayerSpec{}, err
	}
	if hasRank {
		rope, hasRope, err := cfg.int(hfRopeDim, "qk_rope_head_dim")
		switch {
		case err != nil:
			return LayerSpec{}, err
		case !hasRope:
			return LayerSpec{}, errors.New("gokv: config.json: kv_lora_rank is set (MLA) but qk_rope_head_dim is missing")
		case rank+rope > hfMaxHeadDim:
			return LayerSpec{}, fmt.Errorf("gokv: config.json: kv_lora_rank %d + qk_rope_head_dim %d is more than the %d dims gokv supports",
				rank, rope, hfMaxHeadDim)
		}
		return MLALayer(headsQ, rank, rope), nil
	}

	headsKV, err := hfKVHeads(cfg, headsQ)
	if err != nil {
		return LayerSpec{}, err
	}
	headDim, hasHeadDim, err := cfg.int(hfDim, "head_dim")
	switch {
	case err != nil:
		return LayerSpec{}, err
	case hasHeadDim:
		return AttentionLayer(headsQ, headsKV, headDim), nil
	}
	hidden, hasHidden, err := cfg.int(hfHidden, "hidden_size", "n_embd")
	switch {
	case err != nil:
		return LayerSpec{}, err
	case !hasHidden:
		return LayerSpec{}, errors.New("gokv: config.json: neither head_dim nor hidden_size is set")
	case hidden%headsQ != 0:
		return LayerSpec{}, fmt.Errorf("gokv: config.json: hidden_size %d is not a multiple of num_attention_heads %d (and head_dim is not set)", hidden, headsQ)
	case hidden/headsQ > hfMaxHeadDim:
		return LayerSpec{}, fmt.Errorf("gokv: config.json: hidden_size %d / num_attention_heads %d is a head dim of %d, more than the %d dims gokv supports (and head_dim is not set)",
			hidden, headsQ, hidden/headsQ, hfMaxHeadDim)
	}
	return AttentionLayer(headsQ, headsKV, hidden/headsQ), nil
}

// hfKVHeads applies the kv-head rules of FromHFConfig (Llama-style, then Falcon's variants).
func hfKVHeads(cfg hfConfig, headsQ int) (int, error) {
	if v, ok, err := cfg.int(hfHeadsKV, "num_key_value_heads"); err != nil || ok {
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
	falconKV, hasFalconKV, err := cfg.int(hfHeadsKV, "num_kv_heads", "n_head_kv")
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
	case headsQ > hfMaxHeadsKV:
		return 0, fmt.Errorf("gokv: config.json: num_attention_heads %d with no num_key_value_heads means as many kv heads (MHA), more than the %d kv heads gokv supports",
			headsQ, hfMaxHeadsKV)
	}
	return headsQ, nil
}

// hfWindows sets each layer's Window from the config (see FromHFConfig for the rules).
func hfWindows(cfg hfConfig, modelType string, layers []LayerSpec) error {
	window, hasWindow, err := cfg.int(hfWindow, "sliding_window")
	if err != nil {
		return err
	}
	if types, ok := cfg["layer_types"]; ok && types != nil {
		list, isList := types.([]any)
		if !isList || len(list) != len(layers) {
			got := hfShow(types)
			if isList {
				got = fmt.Sprintf("%d entries", len(list))
			}
			return fmt.Errorf("gokv: config.json: layer_types must be a list of %d strings (one per layer), got %s",
				len(layers), got)
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
	pattern, hasPattern, err := cfg.int(hfPattern, "sliding_window_pattern")
	if err != nil {
		return err
	}
	maxWindowLayers, hasMaxWindowLayers, err := cfg.int(hfLayerIdx, "max_window_layers")
	if err != nil {
		return err
	}
	switch {
	case hasPattern:
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

// hfDecode reads at most hfMaxConfigBytes, parses one JSON object and merges its text_config over the
// top level. encoding/json bounds the nesting depth, and the size bound bounds everything else.
func hfDecode(r io.Reader) (hfConfig, error) {
	data, err := io.ReadAll(io.LimitReader(r, hfMaxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("gokv: config.json: %w", err)
	}
	if len(data) > hfMaxConfigBytes {
		return nil, errors.New("gokv: config.json is larger than 1 MiB (published configs are a few KiB)")
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

// int returns the first of keys that is present and not null, as an integer within r. A number with
// a zero fraction (128.0) counts as an integer; anything else, and any integer outside r, is an error
// naming the key and the value.
func (c hfConfig) int(r hfRange, keys ...string) (value int, present bool, err error) {
	for _, k := range keys {
		v, ok := c[k]
		if !ok || v == nil {
			continue
		}
		n, isInt := hfInteger(v)
		switch {
		case !isInt:
			return 0, false, fmt.Errorf("gokv: config.json: %s is %s, want an integer", k, hfShow(v))
		case n < int64(r.min) && r.zero != "":
			return 0, false, fmt.Errorf("gokv: config.json: %s %s must be >= %d (%s)", k, hfShow(v), r.min, r.zero)
		case n < int64(r.min):
			return 0, false, fmt.Errorf("gokv: config.json: %s %s must be >= %d", k, hfShow(v), r.min)
		case n > int64(r.max):
			return 0, false, fmt.Errorf("gokv: config.json: %s %s is more than the %d %s gokv supports", k, hfShow(v), r.max, r.unit)
		}
		return int(n), true, nil
	}
	return 0, false, nil
}

// hfInteger converts a decoded JSON number with no fraction to an int64, saturating integers beyond
// its range (1e30) so that range checks reject them; ok is false for non-numbers and fractions.
func hfInteger(v any) (n int64, ok bool) {
	num, isNum := v.(json.Number)
	if !isNum {
		return 0, false
	}
	if i, err := num.Int64(); err == nil {
		return i, true
	}
	f, err := strconv.ParseFloat(string(num), 64)
	if err != nil && !(errors.Is(err, strconv.ErrRange) && math.IsInf(f, 0)) {
		return 0, false
	}
	mantissa, _, _ := strings.Cut(strings.ToLower(string(num)), "e")
	switch {
	case f != math.Trunc(f):
		return 0, false
	case f == 0 && strings.Trim(mantissa, "-0.") != "":
		return 0, false // 1e-400 underflows to 0 but is no integer
	case f >= math.MaxInt64:
		return math.MaxInt64, true
	case f <= math.MinInt64:
		return math.MinInt64, true
	}
	return int64(f), true
}

// required is int for a field that must be present; the error names every alias.
func (c hfConfig) required(r hfRange, keys ...string) (int, error) {
	v, ok, err := c.int(r, keys...)
	switch {
	case err != nil:
		return 0, err
	case !ok:
		return 0, fmt.Errorf("gokv: config.json: %s is missing", strings.Join(keys, " / "))
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

// hfPrintable makes a string from the file safe to print as a name: every rune that is not printable
// (control characters such as ESC, which would let the file drive the terminal, bidi overrides, invalid
// UTF-8) becomes '?', and the result is cut to hfMaxNameRunes runes.
func hfPrintable(s string) string {
	var b strings.Builder
	runes := 0
	for _, r := range s {
		if runes == hfMaxNameRunes {
			b.WriteString("...")
			break
		}
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			r = '?'
		}
		b.WriteRune(r)
		runes++
	}
	return b.String()
}

// hfShow renders a decoded JSON value for an error message, shortened to about 60 bytes. JSON escapes
// the C0 controls; the other non-printable runes (DEL, C1 controls, bidi overrides) are escaped here
// so that an error message cannot drive the terminal either.
func hfShow(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		data = []byte(fmt.Sprint(v))
	}
	var b strings.Builder
	for _, r := range string(data) {
		if b.Len() >= 57 {
			b.WriteString("...")
			break
		}
		switch {
		case r == utf8.RuneError:
			b.WriteString(`\ufffd`)
		case !unicode.IsPrint(r) && r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		case !unicode.IsPrint(r):
			fmt.Fprintf(&b, `\U%08x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
