package llama

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/gokv/gokv/gokv"
)

// Config is the part of a HuggingFace Llama config.json that the forward pass needs.
type Config struct {
	HiddenSize       int     // d_model
	IntermediateSize int     // SwiGLU width
	Layers           int     // num_hidden_layers
	HeadsQ           int     // num_attention_heads
	HeadsKV          int     // num_key_value_heads
	HeadDim          int     // head_dim (hidden_size / num_attention_heads when absent)
	MaxPositions     int     // max_position_embeddings: the trained context
	RMSNormEps       float64 // rms_norm_eps
	RopeTheta        float64 // rope_theta
	VocabSize        int     // vocab_size
	BOS              int     // bos_token_id: every sequence starts with it
	TiedEmbeddings   bool    // tie_word_embeddings: lm_head is embed_tokens
	// LearnedSinks is set by "attention_sinks": "learned": each layer has a gpt-oss sink logit per query
	// head (tensor model.layers.N.self_attn.sinks).
	LearnedSinks bool
}

// Bounds on what a config.json may ask for. They keep a hostile or mistyped file from asking for
// gigabytes before the weights file is even opened; all are far above what this package is for.
const (
	maxConfigBytes = 1 << 20
	maxDim         = 1 << 16 // hidden_size, intermediate_size, vocab_size
	maxLayers      = 1024
	maxHeads       = 1024
	maxHeadDim     = 1024 // gokv's limit on head dims
	maxPositions   = 1 << 24
)

// rawConfig mirrors config.json; pointers tell a missing key from a zero.
type rawConfig struct {
	ModelType        string   `json:"model_type"`
	HiddenSize       *int     `json:"hidden_size"`
	IntermediateSize *int     `json:"intermediate_size"`
	Layers           *int     `json:"num_hidden_layers"`
	HeadsQ           *int     `json:"num_attention_heads"`
	HeadsKV          *int     `json:"num_key_value_heads"`
	HeadDim          *int     `json:"head_dim"`
	MaxPositions     *int     `json:"max_position_embeddings"`
	RMSNormEps       *float64 `json:"rms_norm_eps"`
	RopeTheta        *float64 `json:"rope_theta"`
	VocabSize        *int     `json:"vocab_size"`
	BOS              *int     `json:"bos_token_id"`
	TieEmbeddings    bool     `json:"tie_word_embeddings"`
	HiddenAct        string   `json:"hidden_act"`
	TorchDtype       string   `json:"torch_dtype"`
	AttentionBias    bool     `json:"attention_bias"`
	MLPBias          bool     `json:"mlp_bias"`
	RopeScaling      any      `json:"rope_scaling"`
	AttentionSinks   string   `json:"attention_sinks"`
}

// LoadConfig reads and checks a Llama config.json. Errors name the file and the key at fault.
func LoadConfig(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, fmt.Errorf("llama: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return Config{}, fmt.Errorf("llama: %s: %w", path, err)
	}
	if len(data) > maxConfigBytes {
		return Config{}, fmt.Errorf("llama: %s: larger than %d bytes, not a config.json", path, maxConfigBytes)
	}
	cfg, err := parseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("llama: %s: %w", path, err)
	}
	return cfg, nil
}

// parseConfig decodes and validates config.json's bytes; errors name the key.
func parseConfig(data []byte) (Config, error) {
	var raw rawConfig
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil {
		return Config{}, fmt.Errorf("not valid JSON for a Llama config: %w", err)
	}
	if raw.ModelType != "llama" {
		return Config{}, fmt.Errorf(`model_type %q: want "llama"`, raw.ModelType)
	}
	if raw.HiddenAct != "" && raw.HiddenAct != "silu" {
		return Config{}, fmt.Errorf(`hidden_act %q: only "silu" (SwiGLU) is implemented`, raw.HiddenAct)
	}
	if raw.TorchDtype != "" && raw.TorchDtype != "float32" {
		return Config{}, fmt.Errorf(`torch_dtype %q: only float32 weights are read`, raw.TorchDtype)
	}
	if raw.AttentionBias || raw.MLPBias {
		return Config{}, errors.New("attention_bias and mlp_bias must be false: biases are not implemented")
	}
	if raw.RopeScaling != nil {
		return Config{}, fmt.Errorf("rope_scaling %v: only plain RoPE (rope_scaling null) is implemented", raw.RopeScaling)
	}
	var c Config
	switch raw.AttentionSinks {
	case "":
	case "learned":
		c.LearnedSinks = true
	default:
		return Config{}, fmt.Errorf(`attention_sinks %q: want "learned" or no key`, raw.AttentionSinks)
	}
	ints := []struct {
		key      string
		v        *int
		dst      *int
		min, max int
	}{
		{"hidden_size", raw.HiddenSize, &c.HiddenSize, 1, maxDim},
		{"intermediate_size", raw.IntermediateSize, &c.IntermediateSize, 1, maxDim},
		{"num_hidden_layers", raw.Layers, &c.Layers, 1, maxLayers},
		{"num_attention_heads", raw.HeadsQ, &c.HeadsQ, 1, maxHeads},
		{"max_position_embeddings", raw.MaxPositions, &c.MaxPositions, 1, maxPositions},
		{"vocab_size", raw.VocabSize, &c.VocabSize, 1, maxDim},
		{"bos_token_id", raw.BOS, &c.BOS, 0, maxDim},
	}
	for _, f := range ints {
		if f.v == nil {
			return Config{}, fmt.Errorf("%s is missing", f.key)
		}
		if *f.v < f.min || *f.v > f.max {
			return Config{}, fmt.Errorf("%s %d is outside [%d, %d]", f.key, *f.v, f.min, f.max)
		}
		*f.dst = *f.v
	}
	c.HeadsKV = c.HeadsQ
	if raw.HeadsKV != nil {
		c.HeadsKV = *raw.HeadsKV
	}
	if c.HeadsKV < 1 || c.HeadsKV > c.HeadsQ || c.HeadsQ%c.HeadsKV != 0 {
		return Config{}, fmt.Errorf("num_key_value_heads %d must divide num_attention_heads %d", c.HeadsKV, c.HeadsQ)
	}
	c.HeadDim = c.HiddenSize / c.HeadsQ
	if raw.HeadDim != nil {
		c.HeadDim = *raw.HeadDim
	}
	if c.HeadDim < 2 || c.HeadDim > maxHeadDim || c.HeadDim%2 != 0 {
		return Config{}, fmt.Errorf("head_dim %d must be even and in [2, %d] (RoPE rotates pairs)", c.HeadDim, maxHeadDim)
	}
	if c.BOS >= c.VocabSize {
		return Config{}, fmt.Errorf("bos_token_id %d is not below vocab_size %d", c.BOS, c.VocabSize)
	}
	c.RMSNormEps, c.RopeTheta = 1e-6, 10000 // HF LlamaConfig's defaults
	if raw.RMSNormEps != nil {
		c.RMSNormEps = *raw.RMSNormEps
	}
	if raw.RopeTheta != nil {
		c.RopeTheta = *raw.RopeTheta
	}
	if !(c.RMSNormEps > 0 && c.RMSNormEps < 1) {
		return Config{}, fmt.Errorf("rms_norm_eps %g must be in (0, 1)", c.RMSNormEps)
	}
	if !(c.RopeTheta > 1) || math.IsInf(c.RopeTheta, 0) {
		return Config{}, fmt.Errorf("rope_theta %g must be a finite number > 1", c.RopeTheta)
	}
	c.TiedEmbeddings = raw.TieEmbeddings
	return c, nil
}

// Spec returns the model's attention geometry for gokv: one full-attention layer per decoder layer,
// learned sinks when the config has them (then no StreamingLLM sink tokens, as for gpt-oss).
func (c Config) Spec(name string) gokv.ModelSpec {
	spec := gokv.ModelSpec{Name: name, Layers: make([]gokv.LayerSpec, c.Layers), SinkTokens: gokv.DefaultSinkTokens,
		MaxPositions: c.MaxPositions}
	for i := range spec.Layers {
		l := gokv.AttentionLayer(c.HeadsQ, c.HeadsKV, c.HeadDim)
		l.LearnedSinks = c.LearnedSinks
		spec.Layers[i] = l
	}
	if c.LearnedSinks {
		spec.SinkTokens = 0
	}
	return spec
}
