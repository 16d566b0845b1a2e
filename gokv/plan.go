package gokv

import (
	"fmt"
	"math"
	"sort"
)

// planMaxContext is the largest context the planner considers: positions cross the C ABI as int32.
const planMaxContext = math.MaxInt32

// planMaxHeadsKV is the C core's limit on kv heads per pool (bridge/gokv_validate.c); it also keeps
// PageBytes far from overflowing.
const planMaxHeadsKV = 1024

// SaturatedBytes is the byte count Plan reports for a figure too large for an int64 (more than 8 EiB,
// e.g. 2^31 tokens x 2^20 sequences): products and sums saturate at it instead of wrapping around.
// Every real allocation is a multiple of 64 bytes, so SaturatedBytes is never an exact count.
const SaturatedBytes int64 = math.MaxInt64

// PlanOptions configures Plan. The zero value plans f32 storage at context 0 with no memory budget.
// Plan only reads it (LayerFormats included). All byte counts are in bytes.
type PlanOptions struct {
	// Format is the storage format of every layer without an entry in LayerFormats. The zero value
	// is f32; most callers want F16 or a quantized format.
	Format Format
	// LayerFormats overrides Format per layer (key: layer index), e.g. q8 for the first and last layers
	// and q4 for the rest. Keys must be valid layer indices.
	LayerFormats map[int]Format
	// Context is the number of tokens per sequence to size the cache for (>= 0).
	Context int
	// Sequences is the number of concurrent sequences of Context tokens each; 0 means 1.
	Sequences int
	// PageSize is P, tokens per page: a multiple of 8 in [8, 1024] and of the group size of every KIVI
	// format in use; 0 means 64 (docs/architecture.md §6).
	PageSize int
	// MemoryBytes is the memory the KV cache shares with the weights and the runtime (e.g. a GPU's
	// memory or a Mac's unified memory); 0 means no budget (MaxContext is not computed).
	MemoryBytes int64
	// WeightsBytes is the memory the model's weights take; 0 means spec.WeightsBytes.
	WeightsBytes int64
	// OverheadBytes is everything else that must fit (activations, runtime, OS share).
	OverheadBytes int64
	// Eviction is the cache's policy (CacheOptions.Eviction), nil for Full. It sets what a decode step
	// reads (LayerPlan.DecodeReadBytes), and Quest adds its key bounds to the memory of the full-attention
	// layers (LayerPlan.PageBoundsBytes). The memory of the other policies is planned as Full's: what a
	// cache must be able to hold before the policy releases anything.
	Eviction EvictionPolicy
}

// LayerPlan is the planner's account of one layer, for one sequence unless stated otherwise.
type LayerPlan struct {
	Index  int       // layer number
	Layer  LayerSpec // its geometry
	Format Format    // its storage format (the default or its override)
	// BytesPerToken is the steady-state bytes one token costs in this layer (codes plus amortized fp16
	// scales and biases, Format.BytesPerToken), before page rounding and without KIVI's residual.
	BytesPerToken float64
	// HeldTokens is how many tokens of a Context-long sequence the layer keeps: Context, or for a
	// sliding-window layer min(Context, Window + SinkTokens).
	HeldTokens int
	// PagedTokens is how many of the held tokens are quantized into pages: HeldTokens, except for KIVI,
	// whose newest tokens (between R and R + G - 1) are in the fp16 residual ring instead.
	PagedTokens int
	// Pages is ceil(HeldTokens / PageSize): a sequence's page table covers every held token, KIVI's ring
	// tokens included (their page is reserved and filled when they are quantized), as the cache allocates.
	Pages     int
	PageBytes int64 // bytes of one page (Format.Layout: the C layout including section alignment)
	// PageCodeBytes and PageMetaBytes are the parts of PageBytes that hold the stored elements or codes and
	// the fp16 scales and biases (the rest is alignment and q4 key-tile padding).
	PageCodeBytes, PageMetaBytes int64
	// ResidualBytes is the KIVI fp16 residual ring of one sequence (Format.ResidualSlotBytes; 0 for
	// other formats), counted separately from the pages.
	ResidualBytes int64
	// PageBoundsBytes is the key bounds kept beside each page when Quest governs the layer
	// (Format.Layout's PageBoundsBytes), else 0.
	PageBoundsBytes int64
	// KVBytes is this layer's total over all sequences: Sequences * (Pages*(PageBytes+PageBoundsBytes) +
	// ResidualBytes), or SaturatedBytes when that is more than 8 EiB.
	KVBytes int64
	// DecodeReadTokens is how many tokens per kv head a decode step of one Context-long sequence reads in
	// this layer under the policy: Full: Context; a window (sliding layer or SinkWindow): min(Context,
	// window + sinks); H2O and SnapKV: min(Context, Budget) (SnapKV: right after the prefill, before the
	// generated tokens add to it); Quest: the tokens of the pages it reads, min(Pages + sink and recent
	// pages, all pages) whole pages.
	DecodeReadTokens int
	// DecodeReadBytes is what that decode step reads in this layer, for one sequence: DecodeReadTokens x
	// the page bytes per token (codes, scales and alignment of every kv head), and for Quest the read
	// pages' bytes plus the key bounds of every page (it scores them all).
	DecodeReadBytes int64
}

// PlanResult is the outcome of Plan. All byte counts are exact integers of the allocation gokv makes
// (pages of the C layout), not estimates, except the float per-token rates.
type PlanResult struct {
	Model     string // spec.Name
	Context   int    // tokens per sequence planned for
	Sequences int    // concurrent sequences (>= 1)
	PageSize  int    // P used
	Layers    []LayerPlan
	// KVBytes is the whole KV cache at Context for all sequences: the sum of Layers[i].KVBytes, or
	// SaturatedBytes when that is more than 8 EiB (Fits is then false).
	KVBytes int64
	// BytesPerToken is the sum of the layers' steady-state BytesPerToken: what one token costs in every
	// layer that holds it (eq. 1 of Open-TQ-Metal divided by the context for uniform models).
	BytesPerToken float64
	// MarginalBytesPerToken is the same sum over the full-attention layers only: what one more token
	// of one sequence costs once the sliding windows are full.
	MarginalBytesPerToken float64
	// DecodeReadBytes is the sum of the layers' DecodeReadBytes: the K/V bytes one sequence's decode step
	// reads at Context under the policy (Sequences times it for a batch).
	DecodeReadBytes int64
	// BoundsBytes is the part of KVBytes that is Quest's key bounds (0 without Quest).
	BoundsBytes int64

	MemoryBytes, WeightsBytes, OverheadBytes int64 // the budget's inputs (WeightsBytes after defaulting)
	// BudgetBytes is MemoryBytes - WeightsBytes - OverheadBytes, the memory left for the KV cache
	// (0 when no budget was given).
	BudgetBytes int64
	// Fits reports KVBytes <= BudgetBytes (false when no budget was given).
	Fits bool
	// MaxContext is the largest context per sequence (all Sequences of it) whose KV cache fits in
	// BudgetBytes; 0 when no budget was given or not even one token per sequence fits. Pages are whole, so
	// without KIVI it is a multiple of PageSize.
	MaxContext int
	// MaxContextUnbounded reports that the cache at 2^31-1 tokens (the ABI's position limit) still fits:
	// memory does not limit the context (every layer windowed, or a very large budget). MaxContext is
	// then 2^31-1.
	MaxContextUnbounded bool
}

// Plan computes the KV cache memory of spec at opts.Context tokens per sequence, layer by layer, and the
// largest context that fits the memory budget (docs/architecture.md §6). For every layer it counts whole
// pages of the C layout (so the figures are what gokv allocates), the KIVI residual ring separately, and for
// sliding-window layers only min(Context, Window + SinkTokens) tokens: it assumes the cache frees pages that
// fall out of the window and compacts holes, so a windowed layer needs ceil(held / P) pages.
//
// It reproduces Open-TQ-Metal's figures for Llama-3.1-70B at 131072 tokens: f16 = 42,949,672,960 bytes
// (40 GiB, eq. 1) and q4:32 = 13,421,772,800 bytes (12.5 GiB). Plan is a pure function, safe for
// concurrent use.
func Plan(spec ModelSpec, opts PlanOptions) (PlanResult, error) {
	if err := spec.Validate(); err != nil {
		return PlanResult{}, err
	}
	res := PlanResult{Model: spec.Name, Context: opts.Context, Sequences: opts.Sequences, PageSize: opts.PageSize,
		MemoryBytes: opts.MemoryBytes, WeightsBytes: opts.WeightsBytes, OverheadBytes: opts.OverheadBytes}
	if res.Sequences == 0 {
		res.Sequences = 1
	}
	if res.PageSize == 0 {
		res.PageSize = 64
	}
	if res.WeightsBytes == 0 {
		res.WeightsBytes = spec.WeightsBytes
	}
	switch {
	case opts.Context < 0 || opts.Context > planMaxContext:
		return PlanResult{}, fmt.Errorf("gokv: plan: Context %d is outside [0, %d]", opts.Context, planMaxContext)
	case res.Sequences < 1 || res.Sequences > 1<<20:
		return PlanResult{}, fmt.Errorf("gokv: plan: Sequences %d is outside [1, %d]", opts.Sequences, 1<<20)
	case res.PageSize < 8 || res.PageSize > 1024 || res.PageSize%8 != 0:
		return PlanResult{}, fmt.Errorf("gokv: plan: PageSize %d must be a multiple of 8 in [8, 1024]", res.PageSize)
	case res.MemoryBytes < 0 || res.WeightsBytes < 0 || res.OverheadBytes < 0:
		return PlanResult{}, fmt.Errorf("gokv: plan: memory %d, weights %d and overhead %d bytes must be >= 0",
			res.MemoryBytes, res.WeightsBytes, res.OverheadBytes)
	}
	if err := planCheckOverrides(spec, opts.LayerFormats); err != nil {
		return PlanResult{}, err
	}
	rule, err := resolveEviction(opts.Eviction)
	if err != nil {
		return PlanResult{}, fmt.Errorf("gokv: plan: %w", err)
	}
	if rule.tokens != nil {
		if err := rule.tokens.check(spec.SinkTokens); err != nil {
			return PlanResult{}, fmt.Errorf("gokv: plan: %w", err)
		}
	}

	res.Layers = make([]LayerPlan, len(spec.Layers))
	for i, l := range spec.Layers {
		f := opts.Format
		if o, ok := opts.LayerFormats[i]; ok {
			f = o
		}
		if err := f.Validate(l.HeadDimK, l.HeadDimV); err != nil {
			return PlanResult{}, fmt.Errorf("gokv: plan: layer %d (%s): %w", i, l, err)
		}
		if l.HeadsKV > planMaxHeadsKV {
			return PlanResult{}, fmt.Errorf("gokv: plan: layer %d (%s): HeadsKV %d is more than the %d kv heads a pool accepts",
				i, l, l.HeadsKV, planMaxHeadsKV)
		}
		if f.Kind.IsKIVI() && res.PageSize%f.Group != 0 {
			return PlanResult{}, fmt.Errorf("gokv: plan: layer %d: PageSize %d is not a multiple of the group size of %s (KIVI quantizes keys %d tokens at a time)",
				i, res.PageSize, f, f.Group)
		}
		layout, err := f.Layout(l.HeadsKV, l.HeadDimK, l.HeadDimV, res.PageSize, l.VIsKPrefix())
		if err != nil {
			return PlanResult{}, fmt.Errorf("gokv: plan: layer %d (%s): %w", i, l, err)
		}
		lp := LayerPlan{Index: i, Layer: l, Format: f,
			BytesPerToken: f.BytesPerToken(l.HeadsKV, l.HeadDimK, l.HeadDimV, l.VIsKPrefix()),
			PageBytes:     layout.PageBytes, PageCodeBytes: layout.PageCodeBytes, PageMetaBytes: layout.PageMetaBytes,
			ResidualBytes: layout.ResidualSlotBytes,
		}
		if rule.quest != nil && !l.Windowed() {
			lp.PageBoundsBytes = layout.PageBoundsBytes
		}
		res.BytesPerToken += lp.BytesPerToken
		if !l.Windowed() {
			res.MarginalBytesPerToken += lp.BytesPerToken
		}
		res.Layers[i] = lp
	}
	res.KVBytes = planFill(res.Layers, spec.SinkTokens, res.PageSize, res.Sequences, res.Context)
	for i := range res.Layers {
		lp := &res.Layers[i]
		planRead(lp, spec, rule, res.PageSize, res.Context)
		res.DecodeReadBytes = planAddSat(res.DecodeReadBytes, lp.DecodeReadBytes)
		res.BoundsBytes = planAddSat(res.BoundsBytes, planMulSat(int64(res.Sequences), planMulSat(int64(lp.Pages), lp.PageBoundsBytes)))
	}

	if res.MemoryBytes == 0 {
		return res, nil
	}
	// Compared before subtracting: memory - weights - overhead can wrap past -2^63 for huge inputs.
	if planAddSat(res.WeightsBytes, res.OverheadBytes) > res.MemoryBytes {
		return PlanResult{}, fmt.Errorf("gokv: plan: weights %d B + overhead %d B exceed the memory %d B",
			res.WeightsBytes, res.OverheadBytes, res.MemoryBytes)
	}
	res.BudgetBytes = res.MemoryBytes - res.WeightsBytes - res.OverheadBytes
	res.Fits = res.KVBytes <= res.BudgetBytes
	res.MaxContext, res.MaxContextUnbounded = planMaxFit(res.Layers, spec.SinkTokens, res.PageSize, res.Sequences, res.BudgetBytes)
	return res, nil
}

// planCheckOverrides rejects per-layer formats for layers the model does not have.
func planCheckOverrides(spec ModelSpec, overrides map[int]Format) error {
	bad := []int{}
	for i := range overrides {
		if i < 0 || i >= len(spec.Layers) {
			bad = append(bad, i)
		}
	}
	if len(bad) > 0 {
		sort.Ints(bad)
		return fmt.Errorf("gokv: plan: LayerFormats has layer %d but the model has layers 0..%d", bad[0], len(spec.Layers)-1)
	}
	return nil
}

// planFill sets the token and page counts of every layer for a context of n tokens per sequence and
// returns the total KV bytes. It is non-decreasing in n, which planMaxFit's binary search relies on.
func planFill(layers []LayerPlan, sinkTokens, pageSize, sequences, n int) int64 {
	var total int64
	for i := range layers {
		lp := &layers[i]
		held := n
		if w := lp.Layer.Window; w > 0 && int64(w)+int64(sinkTokens) < int64(held) {
			held = w + sinkTokens
		}
		lp.HeldTokens = held
		lp.PagedTokens = lp.Format.QuantizedTokens(held)
		lp.Pages = int((int64(held) + int64(pageSize) - 1) / int64(pageSize))
		lp.KVBytes = planMulSat(int64(sequences), planAddSat(planMulSat(int64(lp.Pages), planAddSat(lp.PageBytes, lp.PageBoundsBytes)), lp.ResidualBytes))
		total = planAddSat(total, lp.KVBytes)
	}
	return total
}

// planRead sets what a decode step of one n-token sequence reads in layer lp under the eviction rule.
func planRead(lp *LayerPlan, spec ModelSpec, rule evictionRule, pageSize, n int) {
	perToken := float64(lp.PageBytes) / float64(pageSize)
	tokens := n
	l := lp.Layer
	switch r := layerRule(spec, l, rule.window); {
	case r.window > 0:
		tokens = int(min(int64(n), int64(r.window)+int64(r.sinks)))
	case rule.tokens != nil:
		tokens = min(n, rule.tokens.budget)
	case rule.quest != nil:
		pages := ceilDiv(n, pageSize)
		read := min(pages, rule.quest.Pages+questForcedCount(n, spec.SinkTokens, rule.quest.Recent, pageSize))
		lp.DecodeReadTokens = min(n, read*pageSize)
		lp.DecodeReadBytes = planAddSat(planMulSat(int64(read), lp.PageBytes), planMulSat(int64(pages), lp.PageBoundsBytes))
		return
	}
	lp.DecodeReadTokens = tokens
	lp.DecodeReadBytes = int64(float64(tokens)*perToken + 0.5)
}

// planMulSat and planAddSat are a*b and a+b for non-negative operands, saturating at SaturatedBytes so
// that absurd plans compare as "does not fit" instead of wrapping around.
func planMulSat(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

func planAddSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// planMaxFit returns the largest context whose KV fits in budget, by binary search over planFill on a
// scratch copy of the layers (exact, including page and KIVI rounding).
func planMaxFit(layers []LayerPlan, sinkTokens, pageSize, sequences int, budget int64) (int, bool) {
	scratch := append([]LayerPlan(nil), layers...)
	fits := func(n int) bool { return planFill(scratch, sinkTokens, pageSize, sequences, n) <= budget }
	if fits(planMaxContext) {
		return planMaxContext, true
	}
	if !fits(0) {
		return 0, false
	}
	lo, hi := 0, planMaxContext // fits(lo), !fits(hi)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, false
}
