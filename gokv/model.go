package gokv

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// AttentionKind is how a layer's query heads share its cached keys and values (docs/architecture.md §5).
type AttentionKind int

// The attention kinds.
const (
	// MHA: every query head has its own kv head (HeadsKV == HeadsQ).
	MHA AttentionKind = iota
	// GQA: groups of HeadsQ/HeadsKV query heads share one kv head (1 < HeadsKV < HeadsQ).
	GQA
	// MQA: all query heads share a single kv head (HeadsKV == 1 < HeadsQ).
	MQA
	// MLA: DeepSeek's multi-head latent attention in its absorbed form: one latent vector of
	// KVLoraRank + RopeDim per token, shared by all query heads; the keys are the whole vector and the
	// values are its first KVLoraRank dims (V is a prefix of K, stored once).
	MLA
)

var attentionKindNames = [...]string{MHA: "MHA", GQA: "GQA", MQA: "MQA", MLA: "MLA"}

// String returns "MHA", "GQA", "MQA" or "MLA" ("attention(N)" for an unknown value).
func (k AttentionKind) String() string {
	if k >= 0 && int(k) < len(attentionKindNames) {
		return attentionKindNames[k]
	}
	return "attention(" + strconv.Itoa(int(k)) + ")"
}

// ClassifyHeads returns the kind implied by a head count pair: MHA when headsKV == headsQ, MQA when
// headsKV == 1 < headsQ, else GQA. It does not check that headsKV divides headsQ (LayerSpec.Validate does).
func ClassifyHeads(headsQ, headsKV int) AttentionKind {
	switch {
	case headsKV == headsQ:
		return MHA
	case headsKV == 1:
		return MQA
	}
	return GQA
}

// DefaultSinkTokens is StreamingLLM's number of attention-sink positions (the first tokens of a sequence)
// that a cache keeps visible and never evicts, for models without learned sinks (docs/architecture.md §5).
const DefaultSinkTokens = 4

// LayerSpec is the attention geometry of one layer: what its KV cache stores per token and which tokens
// a query sees. Shapes per token: keys [HeadsKV][HeadDimK], values [HeadsKV][HeadDimV] (MLA: one latent
// [HeadDimK] whose first HeadDimV dims are the values). A plain value type, safe to copy and share.
type LayerSpec struct {
	Kind     AttentionKind
	HeadsQ   int // query heads
	HeadsKV  int // cached kv heads (MLA: 1)
	HeadDimK int // d_qk, the key (and query) head dimension (MLA: KVLoraRank + RopeDim)
	HeadDimV int // d_v, the value head dimension (MLA: KVLoraRank)
	// Window is the sliding-window width W in tokens: a query at position p sees positions > p - W
	// (plus the sink positions). 0 means full attention.
	Window int
	// LearnedSinks marks layers with a learned per-head sink logit σ_h in the softmax denominator
	// (gpt-oss); such models need no StreamingLLM sink tokens.
	LearnedSinks bool
	KVLoraRank   int // MLA only: the latent rank (DeepSeek's kv_lora_rank), 0 otherwise
	RopeDim      int // MLA only: the decoupled RoPE key dims (qk_rope_head_dim), 0 otherwise
}

// AttentionLayer returns a full-attention layer with headsQ query heads sharing headsKV kv heads of
// dimension headDim, its Kind from ClassifyHeads. Set Window or LearnedSinks on the result as needed.
func AttentionLayer(headsQ, headsKV, headDim int) LayerSpec {
	return LayerSpec{Kind: ClassifyHeads(headsQ, headsKV), HeadsQ: headsQ, HeadsKV: headsKV, HeadDimK: headDim, HeadDimV: headDim}
}

// MLALayer returns an MLA layer in the absorbed form: headsQ query heads over one cached latent of
// kvLoraRank + ropeDim dims per token, whose first kvLoraRank dims are the values (DeepSeek-V2: 512 + 64).
func MLALayer(headsQ, kvLoraRank, ropeDim int) LayerSpec {
	return LayerSpec{Kind: MLA, HeadsQ: headsQ, HeadsKV: 1, HeadDimK: kvLoraRank + ropeDim, HeadDimV: kvLoraRank,
		KVLoraRank: kvLoraRank, RopeDim: ropeDim}
}

// VIsKPrefix reports whether the values are a prefix view of the keys (MLA), so a cache stores no
// separate values (the C ABI's v_is_k_prefix).
func (l LayerSpec) VIsKPrefix() bool { return l.Kind == MLA }

// Windowed reports whether the layer uses sliding-window attention (Window > 0).
func (l LayerSpec) Windowed() bool { return l.Window > 0 }

// QueriesPerKVHead returns HeadsQ / HeadsKV, the query heads that read each kv head (the GQA group).
func (l LayerSpec) QueriesPerKVHead() int {
	if l.HeadsKV <= 0 {
		return 0
	}
	return l.HeadsQ / l.HeadsKV
}

// String describes the layer, e.g. "GQA 32q/8kv d128", "GQA 64q/8kv d64 window 128 learned-sinks",
// "MLA 16q latent 512+64".
func (l LayerSpec) String() string {
	var b strings.Builder
	if l.Kind == MLA {
		fmt.Fprintf(&b, "MLA %dq latent %d+%d", l.HeadsQ, l.KVLoraRank, l.RopeDim)
	} else {
		fmt.Fprintf(&b, "%s %dq/%dkv d%d", l.Kind, l.HeadsQ, l.HeadsKV, l.HeadDimK)
		if l.HeadDimV != l.HeadDimK {
			fmt.Fprintf(&b, "/%d", l.HeadDimV)
		}
	}
	if l.Window > 0 {
		fmt.Fprintf(&b, " window %d", l.Window)
	}
	if l.LearnedSinks {
		b.WriteString(" learned-sinks")
	}
	return b.String()
}

// Validate checks the layer on its own: positive heads and dims, HeadsKV dividing HeadsQ, a Kind that
// matches the head counts, and for MLA the latent geometry (HeadsKV 1, HeadDimK = KVLoraRank + RopeDim,
// HeadDimV = KVLoraRank). The error names the field at fault. Format-specific limits (head dims that are
// multiples of the group size) are Format.Validate's.
func (l LayerSpec) Validate() error {
	if err := l.check(); err != nil {
		return fmt.Errorf("gokv: layer %s: %w", l, err)
	}
	return nil
}

// check is Validate without the "gokv: layer" prefix, for callers that add their own context.
func (l LayerSpec) check() error {
	switch {
	case l.Kind < MHA || l.Kind > MLA:
		return fmt.Errorf("Kind %d is not MHA, GQA, MQA or MLA", int(l.Kind))
	case l.HeadsQ < 1:
		return fmt.Errorf("HeadsQ %d must be >= 1", l.HeadsQ)
	case l.HeadsKV < 1:
		return fmt.Errorf("HeadsKV %d must be >= 1", l.HeadsKV)
	case l.HeadsQ%l.HeadsKV != 0:
		return fmt.Errorf("HeadsKV %d does not divide HeadsQ %d", l.HeadsKV, l.HeadsQ)
	case l.HeadDimK < 1:
		return fmt.Errorf("HeadDimK %d must be >= 1", l.HeadDimK)
	case l.HeadDimV < 1:
		return fmt.Errorf("HeadDimV %d must be >= 1", l.HeadDimV)
	case l.Window < 0:
		return fmt.Errorf("Window %d must be >= 0 (0 = full attention)", l.Window)
	}
	if l.Kind == MLA {
		switch {
		case l.HeadsKV != 1:
			return fmt.Errorf("HeadsKV %d must be 1 for MLA (one shared latent per token)", l.HeadsKV)
		case l.KVLoraRank < 1:
			return fmt.Errorf("KVLoraRank %d must be >= 1 for MLA", l.KVLoraRank)
		case l.RopeDim < 0:
			return fmt.Errorf("RopeDim %d must be >= 0", l.RopeDim)
		case l.HeadDimK != l.KVLoraRank+l.RopeDim:
			return fmt.Errorf("HeadDimK %d must be KVLoraRank + RopeDim = %d for MLA", l.HeadDimK, l.KVLoraRank+l.RopeDim)
		case l.HeadDimV != l.KVLoraRank:
			return fmt.Errorf("HeadDimV %d must be KVLoraRank %d for MLA (V is a prefix of K)", l.HeadDimV, l.KVLoraRank)
		}
		return nil
	}
	if l.KVLoraRank != 0 || l.RopeDim != 0 {
		return fmt.Errorf("KVLoraRank %d and RopeDim %d are for MLA layers only (Kind %s)", l.KVLoraRank, l.RopeDim, l.Kind)
	}
	if want := ClassifyHeads(l.HeadsQ, l.HeadsKV); l.Kind != want {
		return fmt.Errorf("Kind %s does not match HeadsQ %d / HeadsKV %d (that is %s)", l.Kind, l.HeadsQ, l.HeadsKV, want)
	}
	return nil
}

// ModelSpec is the attention geometry of a whole model: one LayerSpec per layer (hybrid models mix
// windowed and full layers), the sink positions a cache keeps, and optional planning figures. Build one
// by hand, from Preset, or from a HuggingFace config.json (FromHFConfig). A ModelSpec is read-only to
// gokv: functions taking one never modify it, so it may be shared between goroutines as long as the
// caller does not mutate Layers concurrently.
type ModelSpec struct {
	Name   string      // free-form, e.g. "llama-3.1-8b"
	Layers []LayerSpec // index = layer number, >= 1 layer
	// SinkTokens is the number of first positions a cache keeps visible and never evicts (StreamingLLM),
	// also in windowed layers: DefaultSinkTokens (4) for models without learned sinks, 0 for models whose
	// layers have LearnedSinks. Taken as given (0 means none).
	SinkTokens int
	// MaxPositions is the model's trained context length (max_position_embeddings), 0 if unknown.
	// Informational: the planner does not cap contexts at it.
	MaxPositions int
	// WeightsBytes is the size of the model's weights in memory, 0 if unknown; Plan uses it when
	// PlanOptions.WeightsBytes is 0. It depends on the weights' quantization, so presets leave it 0.
	WeightsBytes int64
}

// Hybrid reports whether the layers do not all share one LayerSpec (e.g. sliding + full layers).
func (m ModelSpec) Hybrid() bool {
	for _, l := range m.Layers {
		if l != m.Layers[0] {
			return true
		}
	}
	return false
}

// Validate checks every layer and the model-level fields. The error names the model, the layer index
// and the field, e.g. `gokv: model "x": layer 3: HeadsKV 7 does not divide HeadsQ 32`.
func (m ModelSpec) Validate() error {
	prefix := fmt.Sprintf("gokv: model %q", m.Name)
	switch {
	case len(m.Layers) == 0:
		return errors.New(prefix + ": no layers")
	case m.SinkTokens < 0:
		return fmt.Errorf("%s: SinkTokens %d must be >= 0", prefix, m.SinkTokens)
	case m.MaxPositions < 0:
		return fmt.Errorf("%s: MaxPositions %d must be >= 0", prefix, m.MaxPositions)
	case m.WeightsBytes < 0:
		return fmt.Errorf("%s: WeightsBytes %d must be >= 0", prefix, m.WeightsBytes)
	}
	for i, l := range m.Layers {
		if err := l.check(); err != nil {
			return fmt.Errorf("%s: layer %d: %w", prefix, i, err)
		}
	}
	return nil
}

// Clone returns a copy whose Layers slice is not shared with m.
func (m ModelSpec) Clone() ModelSpec {
	m.Layers = append([]LayerSpec(nil), m.Layers...)
	return m
}
