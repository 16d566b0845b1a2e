package main

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gokv/gokv/gokv"
)

type planOpts struct {
	model, format             string
	context, sequences, page  int
	memory, weights, overhead string
	evictions                 string
	json                      bool
}

func newPlanCmd(g *globalOpts) *cobra.Command {
	o := &planOpts{}
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "KV cache memory of a model at a context, and the largest context a memory budget allows",
		Long: `plan computes the KV cache a model needs at a context, per layer kind, exactly as gokv allocates it
(whole pages, KIVI's fp16 residual counted), and with --memory the largest context that fits once the
weights and overhead are subtracted.

Sizes are bytes with an optional unit: 12345, 39.1GB (10^9), 64GiB (2^30), likewise KB/KiB, MB/MiB, TB/TiB.

Example (Open-TQ-Metal's Llama 3.1 70B on a 64 GiB Mac):
  gokv plan --model llama-3.1-70b --format q4 --context 131072 --memory 64GiB --weights 39.1GiB --overhead 2GiB`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runPlan(cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.model, "model", "", "model preset ("+strings.Join(gokv.Presets(), ", ")+") or HuggingFace config.json")
	f.StringVar(&o.format, "format", "f16", "storage format: f32, f16, q8[:G], q4[:G], kivi2[:G[:R]], kivi4[:G[:R]]")
	f.IntVar(&o.context, "context", 0, "tokens per sequence (0: the model's max_position_embeddings, else 131072)")
	f.IntVar(&o.sequences, "sequences", 1, "concurrent sequences of --context tokens each")
	f.IntVar(&o.page, "page-size", 0, "tokens per page (0: 64)")
	f.StringVar(&o.memory, "memory", "", "memory shared by weights, overhead and the KV cache (e.g. 64GiB)")
	f.StringVar(&o.weights, "weights", "", "memory of the model's weights (e.g. 39.1GiB)")
	f.StringVar(&o.overhead, "overhead", "", "memory for everything else: activations, runtime (e.g. 2GiB)")
	f.StringVar(&o.evictions, "eviction", "", "also report, per eviction policy, the KV bytes a decode step reads: full, sinkwindow:S:W, h2o:BUDGET:RECENT, snapkv:BUDGET:WINDOW, quest:PAGES[:RECENT], comma-separated (BUDGET: tokens or a fraction of --context)")
	f.BoolVar(&o.json, "json", false, "print JSON")
	return cmd
}

// planKind is one group of layers sharing geometry and format. A byte figure too large for an int64
// is gokv.SaturatedBytes with its *_saturated flag set: a lower bound, never a wrapped number.
type planKind struct {
	Layer               string  `json:"layer"`  // e.g. "GQA 64q/8kv d128"
	Format              string  `json:"format"` // canonical, e.g. "q4:32"
	Count               int     `json:"count"`  // layers of this kind
	HeldTokens          int     `json:"held_tokens"`
	BytesPerToken       float64 `json:"bytes_per_token"` // per layer
	PageBytes           int64   `json:"page_bytes"`      // one page of one layer, as allocated
	PageMetaBytes       int64   `json:"page_meta_bytes"` // of which fp16 scales and biases
	LayerBytes          int64   `json:"layer_bytes"`     // one layer at the context, all sequences
	LayerBytesSaturated bool    `json:"layer_bytes_saturated,omitempty"`
	Bytes               int64   `json:"bytes"` // all layers of this kind
	BytesSaturated      bool    `json:"bytes_saturated,omitempty"`
}

// planReport is what `gokv plan --json` prints.
type planReport struct {
	Model                 string     `json:"model"`
	Format                string     `json:"format"`
	Context               int        `json:"context"`
	Sequences             int        `json:"sequences"`
	PageSize              int        `json:"page_size"`
	Layers                int        `json:"layers"`
	Bytes                 int64      `json:"bytes"`                     // total KV bytes at context
	BytesSaturated        bool       `json:"bytes_saturated,omitempty"` // Bytes is more than 8 EiB
	BytesPerToken         float64    `json:"bytes_per_token"`
	MarginalBytesPerToken float64    `json:"marginal_bytes_per_token"`
	Kinds                 []planKind `json:"kinds"`
	MemoryBytes           int64      `json:"memory_bytes,omitempty"`
	WeightsBytes          int64      `json:"weights_bytes,omitempty"`
	OverheadBytes         int64      `json:"overhead_bytes,omitempty"`
	BudgetBytes           int64      `json:"budget_bytes,omitempty"`
	Fits                  *bool      `json:"fits,omitempty"`
	MaxContext            *int       `json:"max_context,omitempty"` // absent without --memory
	MaxContextUnbounded   bool       `json:"max_context_unbounded,omitempty"`
	// DecodeReadBytes is what one sequence's decode step reads at the context with every token kept.
	DecodeReadBytes int64          `json:"decode_read_bytes"`
	Evictions       []planEviction `json:"evictions,omitempty"` // --eviction
}

// planEviction is one --eviction policy's account: what a decode step reads, and the memory it adds.
type planEviction struct {
	Eviction        string  `json:"eviction"`
	DecodeReadBytes int64   `json:"decode_read_bytes"` // one sequence's decode step at the context, all layers
	ReadFraction    float64 `json:"read_fraction"`     // of the full cache's decode read
	BoundsBytes     int64   `json:"bounds_bytes"`      // Quest's key bounds (all sequences), part of Bytes
	Bytes           int64   `json:"bytes"`             // the KV cache's memory at the context under the policy
}

// buildPlan resolves the flags and runs gokv.Plan.
func buildPlan(o *planOpts) (planReport, gokv.PlanResult, error) {
	spec, err := loadModel(o.model)
	if err != nil {
		return planReport{}, gokv.PlanResult{}, err
	}
	format, err := gokv.ParseFormat(o.format)
	if err != nil {
		return planReport{}, gokv.PlanResult{}, fmt.Errorf("--format: %w", err)
	}
	switch {
	case o.context < 0 || o.context > math.MaxInt32:
		return planReport{}, gokv.PlanResult{}, fmt.Errorf("--context %d must be in [0, 2^31-1] (0: the model's max_position_embeddings, else 131072)", o.context)
	case o.sequences < 1 || o.sequences > 1<<20:
		return planReport{}, gokv.PlanResult{}, fmt.Errorf("--sequences %d must be in [1, 1048576]", o.sequences)
	case o.page < 0:
		return planReport{}, gokv.PlanResult{}, fmt.Errorf("--page-size %d must be a multiple of 8 in [8, 1024] (0: 64)", o.page)
	}
	opts := gokv.PlanOptions{Format: format, Context: o.context, Sequences: o.sequences, PageSize: o.page}
	if opts.Context == 0 {
		opts.Context = spec.MaxPositions
		if opts.Context == 0 {
			opts.Context = 131072
		}
	}
	for _, s := range []struct {
		flag, text string
		dst        *int64
	}{{"memory", o.memory, &opts.MemoryBytes}, {"weights", o.weights, &opts.WeightsBytes}, {"overhead", o.overhead, &opts.OverheadBytes}} {
		if s.text == "" {
			continue
		}
		if *s.dst, err = parseSize(s.text); err != nil {
			return planReport{}, gokv.PlanResult{}, fmt.Errorf("--%s: %w", s.flag, err)
		}
		// A size that rounds to 0 bytes would silently mean "not given" below. Only digits 1-9 make a
		// size non-zero (no unit has a digit), so they tell a rounded-away size from a typed 0.
		if *s.dst == 0 && strings.ContainsAny(s.text, "123456789") {
			return planReport{}, gokv.PlanResult{}, fmt.Errorf("--%s %s is less than one byte", s.flag, s.text)
		}
	}
	if o.memory != "" && opts.MemoryBytes == 0 {
		return planReport{}, gokv.PlanResult{}, fmt.Errorf("--memory %s must be at least one byte (leave it out for no budget)", o.memory)
	}
	if opts.MemoryBytes == 0 && (opts.WeightsBytes != 0 || opts.OverheadBytes != 0) {
		return planReport{}, gokv.PlanResult{}, fmt.Errorf("--weights and --overhead need --memory")
	}
	var evs []evalEviction
	if strings.TrimSpace(o.evictions) != "" {
		if evs, err = parseEvictions(o.evictions); err != nil {
			return planReport{}, gokv.PlanResult{}, err
		}
	}
	res, err := gokv.Plan(spec, opts)
	if err != nil {
		return planReport{}, gokv.PlanResult{}, err
	}
	var planEvs []planEviction
	for _, ev := range evs {
		eo := opts
		eo.Eviction, _ = ev.policy(opts.Context)
		r, err := gokv.Plan(spec, eo)
		if err != nil {
			return planReport{}, gokv.PlanResult{}, fmt.Errorf("--eviction %s: %w", ev.name, err)
		}
		pe := planEviction{Eviction: ev.name, DecodeReadBytes: r.DecodeReadBytes, BoundsBytes: r.BoundsBytes, Bytes: r.KVBytes}
		if res.DecodeReadBytes > 0 {
			pe.ReadFraction = float64(r.DecodeReadBytes) / float64(res.DecodeReadBytes)
		}
		planEvs = append(planEvs, pe)
	}
	rep := planReport{
		Model: res.Model, Format: format.String(), Context: res.Context, Sequences: res.Sequences,
		PageSize: res.PageSize, Layers: len(res.Layers), Bytes: res.KVBytes, BytesSaturated: res.KVBytes == gokv.SaturatedBytes,
		BytesPerToken: res.BytesPerToken, MarginalBytesPerToken: res.MarginalBytesPerToken,
		DecodeReadBytes: res.DecodeReadBytes, Evictions: planEvs,
	}
	if rep.Model == "" {
		rep.Model = o.model
	}
	index := map[string]int{}
	for _, lp := range res.Layers {
		key := lp.Layer.String() + "|" + lp.Format.String()
		i, ok := index[key]
		if !ok {
			i = len(rep.Kinds)
			index[key] = i
			rep.Kinds = append(rep.Kinds, planKind{Layer: lp.Layer.String(), Format: lp.Format.String(),
				HeldTokens: lp.HeldTokens, BytesPerToken: lp.BytesPerToken, PageBytes: lp.PageBytes,
				PageMetaBytes: lp.PageMetaBytes, LayerBytes: lp.KVBytes, LayerBytesSaturated: lp.KVBytes == gokv.SaturatedBytes})
		}
		k := &rep.Kinds[i]
		k.Count++
		k.Bytes = planAddSaturating(k.Bytes, lp.KVBytes)
		k.BytesSaturated = k.Bytes == gokv.SaturatedBytes
	}
	if opts.MemoryBytes > 0 {
		rep.MemoryBytes, rep.WeightsBytes, rep.OverheadBytes = res.MemoryBytes, res.WeightsBytes, res.OverheadBytes
		rep.BudgetBytes = res.BudgetBytes
		fits := res.Fits
		rep.Fits = &fits
		maxContext := res.MaxContext
		rep.MaxContext = &maxContext
		rep.MaxContextUnbounded = res.MaxContextUnbounded
	}
	return rep, res, nil
}

// planAddSaturating is a+b for non-negative byte counts, stopping at gokv.SaturatedBytes as gokv.Plan's
// own sums do, so a kind's total never wraps negative.
func planAddSaturating(a, b int64) int64 {
	if a > gokv.SaturatedBytes-b {
		return gokv.SaturatedBytes
	}
	return a + b
}

// planSize renders a byte count of the report: formatSize, or "more than 8 EiB" when saturated.
func planSize(n int64) string {
	if n == gokv.SaturatedBytes {
		return "more than 8 EiB"
	}
	return formatSize(n)
}

func runPlan(w io.Writer, o *planOpts) error {
	rep, _, err := buildPlan(o)
	if err != nil {
		return err
	}
	if o.json {
		return writeJSON(w, rep)
	}
	seqs := ""
	if rep.Sequences > 1 {
		seqs = fmt.Sprintf(" x %d sequences", rep.Sequences)
	}
	fmt.Fprintf(w, "model %s, %d layers, format %s, page %d tokens\n\n", rep.Model, rep.Layers, rep.Format, rep.PageSize)
	width := len("layer kind")
	for _, k := range rep.Kinds {
		width = max(width, len(k.Layer)+1+len(k.Format))
	}
	fmt.Fprintf(w, "  %-*s %6s %17s %12s %12s\n", width, "layer kind", "layers", "bytes/token/layer", "held tokens", "KV bytes")
	for _, k := range rep.Kinds {
		fmt.Fprintf(w, "  %-*s %6d %17.0f %12d %12s\n", width, k.Layer+" "+k.Format, k.Count, k.BytesPerToken, k.HeldTokens,
			planSize(k.Bytes))
	}
	fmt.Fprintf(w, "\n  bytes per token (all layers): %.0f (%s)\n", rep.BytesPerToken, formatSize(int64(rep.BytesPerToken+0.5)))
	if rep.MarginalBytesPerToken != rep.BytesPerToken {
		fmt.Fprintf(w, "  marginal bytes per token once windows are full: %.0f\n", rep.MarginalBytesPerToken)
	}
	if rep.BytesSaturated {
		fmt.Fprintf(w, "  KV cache at %d tokens%s: more than %d bytes (8 EiB)\n", rep.Context, seqs, rep.Bytes)
	} else {
		fmt.Fprintf(w, "  KV cache at %d tokens%s: %d bytes (%s)\n", rep.Context, seqs, rep.Bytes, formatSize(rep.Bytes))
	}
	if len(rep.Evictions) > 0 {
		fmt.Fprintf(w, "\n  per eviction policy, at %d tokens: the K/V one sequence's decode step reads (all layers), and the memory\n", rep.Context)
		fmt.Fprintf(w, "  %-22s %14s %9s %14s %14s\n", "eviction", "decode reads", "of full", "KV bytes", "of which bounds")
		for _, e := range rep.Evictions {
			fmt.Fprintf(w, "  %-22s %14s %8.1f%% %14s %14s\n", e.Eviction, formatSize(e.DecodeReadBytes), 100*e.ReadFraction,
				planSize(e.Bytes), formatSize(e.BoundsBytes))
		}
		fmt.Fprintf(w, "  (h2o and snapkv read their budget per kv head, sinkwindow its sinks and window; quest PAGES pages plus the\n")
		fmt.Fprintf(w, "  sink and recent pages, and the key bounds of every page; memory is planned for every token held)\n")
	}
	if rep.Fits == nil {
		return nil
	}
	fmt.Fprintf(w, "\n  memory %s - weights %s - overhead %s = %s for the KV cache\n", formatSize(rep.MemoryBytes),
		formatSize(rep.WeightsBytes), formatSize(rep.OverheadBytes), formatSize(rep.BudgetBytes))
	verdict := "does not fit"
	if *rep.Fits {
		verdict = "fits"
	}
	fmt.Fprintf(w, "  %d tokens%s %s\n", rep.Context, seqs, verdict)
	switch {
	case rep.MaxContextUnbounded:
		fmt.Fprintf(w, "  max context: unbounded by memory (every layer is windowed, or the budget is huge)\n")
	case *rep.MaxContext == 0:
		fmt.Fprintf(w, "  max context: 0 (not even one token per sequence fits)\n")
	default:
		fmt.Fprintf(w, "  max context: %d tokens (%s)%s\n", *rep.MaxContext, humanCount(*rep.MaxContext), seqs)
	}
	return nil
}
