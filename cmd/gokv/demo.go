package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gokv/gokv/gokv"
)

type demoOpts struct {
	model, formats, backend string
	context, layers         int
	steps, chunk, threads   int
	plot                    string
	noPlot, json, quiet     bool
	seed                    uint64

	realModel, realText                    string
	realModelSet, realTextSet, noRealModel bool // Set: given on the command line, not searched for
	realContext, realSequences, realTokens int
}

func newDemoCmd(g *globalOpts) *cobra.Command {
	o := &demoOpts{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Long-context decode on a model's shape through the cache API: f16 vs q4 vs kivi2",
		Long: `demo runs the decode loop of a long-context model through gokv's cache API (Engine, Cache, Sequence,
Step) on the first --layers layers of a model's attention geometry, with synthetic data: keys N(0,1)
with 8 of every 128 channels x4 (the outlier channels real keys have), values and queries N(0,1).

The same tokens go, in lock-step, into one cache per format plus an f32 reference cache and, per format,
a cache under the StreamingLLM policy SinkWindow{Sinks: 4, Window: 1024}. The context is prefilled in
chunks; at 1/8, 1/4, 1/2 and all of it, --steps decode steps are timed. It reports, per format: the
memory in use (measured), what it means for the whole model at 128K tokens (gokv plan), ms per decode
step (attention of the layers run: median and p10-p90 of the steps), accuracy vs f32 (cosine and max abs
error of the attention outputs), and the memory SinkWindow saves. When p90/p10 of the steps timed at one
context passes 1.5 (over steps of 1 ms or more), the output says the machine was noisy.

Synthetic tensors have no language in them, so quality is measured on a real model instead: the
real-model part runs a tiny byte-level Llama (--real-model, by default the repository's
models/tiny-llama: 2.9M parameters, trained on the KJV Bible, context 512) over held-out text
(--real-text) as gokv eval does, per format against the f32 full cache: bits per byte, top-1
agreement, and a greedy continuation of a prompt from the text as gokv generate makes it; and what a
decode step of the whole model costs (ms per token, tokens per second) beside its attention. A missing
model directory or text file skips the part with a line that says so; --no-real-model skips it.

It writes a PNG (--plot): latency and memory against the context, and the real model's top-1 agreement
and bits per byte per format.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.quiet = g.quiet
			o.realModelSet, o.realTextSet = cmd.Flags().Changed("real-model"), cmd.Flags().Changed("real-text")
			return runDemo(cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.model, "model", "llama-3.1-8b", "model preset or HuggingFace config.json whose shape to use")
	f.IntVar(&o.layers, "layers", 4, "layers to run (the first N of the model)")
	f.IntVar(&o.context, "context", 32768, "tokens to prefill before the last decode steps")
	f.StringVar(&o.formats, "formats", "f16,q4,kivi2", "formats, comma-separated")
	f.IntVar(&o.steps, "steps", 16, "decode steps timed at each checkpoint (median and p10-p90 reported)")
	f.IntVar(&o.chunk, "chunk", 2048, "prefill chunk in tokens")
	f.StringVar(&o.backend, "backend", "auto", "backend: cpu, vulkan, metal, sycl or auto")
	f.IntVar(&o.threads, "threads", 0, "CPU worker threads (0: all online CPUs)")
	f.StringVar(&o.plot, "plot", "gokv-demo.png", "PNG plot of latency and memory vs context")
	f.BoolVar(&o.noPlot, "no-plot", false, "write no plot")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the synthetic data")
	f.BoolVar(&o.json, "json", false, "print the results as one JSON object")
	f.StringVar(&o.realModel, "real-model", demoRealModelDir, "byte-level Llama directory of the real-model part (a relative default is searched for up the tree)")
	f.StringVar(&o.realText, "real-text", demoRealTextFile, "held-out text of the real-model part")
	f.BoolVar(&o.noRealModel, "no-real-model", false, "skip the real-model part")
	f.IntVar(&o.realContext, "real-context", 0, "tokens per scored sequence, BOS included (0: the model's max_position_embeddings)")
	f.IntVar(&o.realSequences, "real-sequences", 4, "sequences scored by the real-model part, decoded as one batch")
	f.IntVar(&o.realTokens, "real-tokens", 60, "bytes of the real model's greedy continuation (0: none)")
	return cmd
}

// demoSinkWindow is the eviction policy whose savings the demo measures (StreamingLLM's defaults).
var demoSinkWindow = gokv.SinkWindow{Sinks: gokv.DefaultSinkTokens, Window: 1024}

// demoRun is one cache fed the demo's tokens.
type demoRun struct {
	format gokv.Format
	role   string // "format", "ref" (f32 reference), "window" (SinkWindow)
	cache  *gokv.Cache
	seq    *gokv.Sequence
	points []demoPoint
	final  []float32 // attention outputs of the last checkpoint's decode steps, all layers
}

type demoPoint struct {
	Context int     `json:"context"`
	Ms      float64 `json:"ms"` // median decode step, attention of the layers run
	MsP10   float64 `json:"ms_p10"`
	MsP90   float64 `json:"ms_p90"`
	Bytes   uint64  `json:"bytes"` // cache bytes in use
}

// demoFormat is one format's results.
type demoFormat struct {
	Format             string      `json:"format"`
	BytesUsed          uint64      `json:"bytes_used"`            // at the demo context, layers run
	BytesPerTokenLayer float64     `json:"bytes_per_token_layer"` // measured, page rounding and KIVI ring included
	FullModelAt128K    int64       `json:"full_model_bytes_128k"` // gokv.Plan for every layer of the model at 131072
	DecodeMs           float64     `json:"decode_ms"`             // median at the demo context
	DecodeMsP10        float64     `json:"decode_ms_p10"`
	DecodeMsP90        float64     `json:"decode_ms_p90"`
	CosVsF32           float64     `json:"cos_vs_f32"`
	MaxAbsErr          float64     `json:"max_abs_err"`
	SinkWindowBytes    uint64      `json:"sinkwindow_bytes"`
	SinkWindowSaved    uint64      `json:"sinkwindow_saved_bytes"`
	Points             []demoPoint `json:"points"`
}

type demoReport struct {
	Model      string       `json:"model"`
	Backend    string       `json:"backend"`
	Device     string       `json:"device"`
	Threads    int          `json:"threads"`
	LayersRun  int          `json:"layers_run"`
	Layers     int          `json:"layers"`
	Context    int          `json:"context"`
	SinkWindow string       `json:"sinkwindow"`
	Formats    []demoFormat `json:"formats"`
	Plot       string       `json:"plot,omitempty"`
	NotRun     string       `json:"not_run"`
	Prefill    string       `json:"prefill"` // how the context was filled
	Steps      int          `json:"steps"`   // decode steps timed per checkpoint
	// Spread is the largest p90/p10 of the steps timed at one context, over the formats and checkpoints;
	// Noisy is set above demoNoisySpread.
	Spread      float64 `json:"spread"`
	Noisy       bool    `json:"noisy"`
	LoadAverage float64 `json:"load_average,omitempty"` // 1-minute, at the end (Linux)
	CPUs        int     `json:"cpus"`
	// RealModel holds the real-model part's figures; RealModelSkipped says why it was not run.
	RealModel        *demoRealModel `json:"real_model,omitempty"`
	RealModelSkipped string         `json:"real_model_skipped,omitempty"`
	Seconds          float64        `json:"seconds"`
}

const demoNotRun = "perplexity and token match on the synthetic tensors, which have no language in them"

// demoNoisySpread is the p90/p10 of the decode steps at one context above which the demo calls the
// machine noisy. Those steps do the same work on the same amount of data, so their spread is the
// machine's, not the cache's; 1.5 is a judgement: with two other jobs on two cores, every run reached
// 1.5-3.5x at some checkpoint.
const demoNoisySpread = 1.5

// demoNoiseMinMs is the shortest median step whose spread counts: on a quiet machine steps of a few
// dozen microseconds still spread 2x (timer ticks, interrupts), while the millisecond steps stay within
// 1.2x.
const demoNoiseMinMs = 1.0

func runDemo(stdout, stderr io.Writer, o *demoOpts) error {
	start := time.Now()
	if !o.noPlot {
		if err := checkOutputPath("--plot", o.plot); err != nil {
			return err
		}
	}
	full, err := loadModel(o.model)
	if err != nil {
		return err
	}
	if o.layers < 1 || o.layers > len(full.Layers) {
		return fmt.Errorf("--layers %d must be in [1, %d] (the layers of %s)", o.layers, len(full.Layers), o.model)
	}
	if o.steps < 1 || o.chunk < 1 {
		return fmt.Errorf("--steps %d and --chunk %d must be >= 1", o.steps, o.chunk)
	}
	if o.context < 1 {
		return fmt.Errorf("--context %d must be >= 1", o.context)
	}
	formats, err := parseFormats(o.formats)
	if err != nil {
		return fmt.Errorf("--formats: %w", err)
	}
	realPart, err := prepareDemoReal(o, formats)
	if err != nil {
		return err
	}

	eng, info, err := openEngine(o.backend, o.threads)
	if err != nil {
		return err
	}
	defer eng.Close()
	rep := demoReport{Model: full.Name, Backend: info.Backend, Device: info.Name, Threads: info.Threads, LayersRun: o.layers,
		Layers: len(full.Layers), SinkWindow: fmt.Sprintf("SinkWindow{Sinks: %d, Window: %d}", demoSinkWindow.Sinks,
			demoSinkWindow.Window), NotRun: demoNotRun, Steps: o.steps, CPUs: runtime.NumCPU(), RealModelSkipped: realPart.skipped}
	if rep.Model == "" {
		rep.Model = o.model
	}
	if err := runDemoSynthetic(eng, full, formats, o, stderr, &rep); err != nil {
		return err
	}
	if realPart.plan != nil {
		if rep.RealModel, err = realPart.run(eng, info.Backend, stderr, o.quiet); err != nil {
			return fmt.Errorf("real-model part: %w", err)
		}
		rep.NotRun += "; the real-model part measures bits per byte and top-1 instead"
	}
	rep.LoadAverage = demoLoadAverage()
	if !o.noPlot && o.plot != "" {
		if err := writeDemoPlot(o.plot, rep); err != nil {
			return err
		}
		rep.Plot = o.plot
	}
	rep.Seconds = time.Since(start).Seconds()
	if o.json {
		return writeJSON(stdout, rep)
	}
	printDemo(stdout, rep)
	return nil
}

// runDemoSynthetic runs the synthetic part on the first o.layers layers of full: every cache prefilled
// in lock-step, decode timed at each checkpoint; it fills rep's context, prefill, formats and spread. Its
// caches are closed on return, before the real-model part runs.
func runDemoSynthetic(eng *gokv.Engine, full gokv.ModelSpec, formats []gokv.Format, o *demoOpts, stderr io.Writer, rep *demoReport) error {
	spec := full.Clone()
	spec.Layers = spec.Layers[:o.layers]
	writeOnly, err := probeWriteOnly(eng)
	if err != nil {
		return err
	}
	rep.Prefill = "chunks stored without attention (Step.Layer with q and out nil)"
	context := o.context
	if !writeOnly {
		// Without write-only steps every prefill chunk pays causal attention over all cached tokens:
		// O(context^2), minutes at 32K. Keep the demo short rather than faithful.
		rep.Prefill = "chunks with causal attention (this gokv has no write-only step)"
		if context > 2048 {
			logger.Warn().Int("context", context).Msg("this gokv cannot store K/V without attending; prefill attention is quadratic, so the demo context is capped at 2048")
			context = 2048
		}
	}
	checkpoints := demoCheckpoints(context)

	runs, err := newDemoRuns(eng, spec, formats, context+len(checkpoints)*o.steps+o.chunk, o.chunk)
	if err != nil {
		return err
	}
	defer func() {
		for _, r := range runs {
			r.cache.Close()
		}
	}()

	totalWork := len(checkpoints) * o.steps
	for pos, ci := 0, 0; ci < len(checkpoints); ci++ {
		totalWork += (checkpoints[ci] - pos + o.chunk - 1) / o.chunk
		pos = checkpoints[ci]
	}
	bar := newProgress(stderr, o.quiet, totalWork, "demo")
	gen := newDemoData(spec, o.seed)
	pos := 0
	for ci, cp := range checkpoints {
		last := ci == len(checkpoints)-1
		for pos < cp {
			n := min(o.chunk, cp-pos)
			kv := gen.tokens(n, !writeOnly)
			for _, r := range runs {
				if err := r.step(kv, n, !writeOnly, nil); err != nil {
					return fmt.Errorf("prefill of %s at position %d: %w", r.name(), pos, err)
				}
			}
			pos += n
			bar.Add(1)
		}
		times := make(map[*demoRun][]float64)
		for s := 0; s < o.steps; s++ {
			kv := gen.tokens(1, true)
			for _, r := range runs {
				attend := r.role == "format" || (r.role == "ref" && last) || !writeOnly
				var out []float32
				t0 := time.Now()
				if err := r.step(kv, 1, attend, &out); err != nil {
					return fmt.Errorf("decode of %s at position %d: %w", r.name(), pos, err)
				}
				times[r] = append(times[r], time.Since(t0).Seconds()*1e3)
				if last {
					r.final = append(r.final, out...)
				}
			}
			pos++
			bar.Add(1)
		}
		for _, r := range runs {
			sp := newSpread(times[r])
			r.points = append(r.points, demoPoint{Context: pos, Ms: sp.median, MsP10: sp.p10, MsP90: sp.p90,
				Bytes: r.cache.Stats().BytesUsed})
		}
	}
	bar.Finish()

	rep.Context = pos
	ref := runs[0]
	var allSpread, longSpread float64
	haveLong := false
	for _, r := range runs {
		if r.role != "format" {
			continue
		}
		last := r.points[len(r.points)-1]
		df := demoFormat{Format: r.format.String(), BytesUsed: last.Bytes, DecodeMs: last.Ms, DecodeMsP10: last.MsP10,
			DecodeMsP90: last.MsP90, Points: r.points, BytesPerTokenLayer: float64(last.Bytes) / float64(last.Context) / float64(o.layers),
			CosVsF32: cosine(r.final, ref.final), MaxAbsErr: maxAbsDiff(r.final, ref.final)}
		plan, err := gokv.Plan(full, gokv.PlanOptions{Format: r.format, Context: 131072})
		if err != nil {
			return err
		}
		df.FullModelAt128K = plan.KVBytes
		for _, w := range runs {
			if w.role == "window" && w.format == r.format {
				df.SinkWindowBytes = w.points[len(w.points)-1].Bytes
				df.SinkWindowSaved = last.Bytes - min(last.Bytes, df.SinkWindowBytes)
			}
		}
		for _, p := range r.points {
			spread := p.MsP90 / math.Max(p.MsP10, 1e-9)
			allSpread = max(allSpread, spread)
			if p.Ms >= demoNoiseMinMs { // a step of a few dozen µs varies with any interrupt
				longSpread, haveLong = max(longSpread, spread), true
			}
		}
		rep.Formats = append(rep.Formats, df)
	}
	rep.Spread, rep.Noisy = allSpread, false
	if haveLong {
		rep.Spread, rep.Noisy = longSpread, longSpread > demoNoisySpread
	}
	return nil
}

// demoCheckpoints returns the contexts at which decode is timed: 1/8, 1/4, 1/2 and all of the context
// (fewer for tiny contexts, never 0).
func demoCheckpoints(context int) []int {
	var cps []int
	for _, div := range []int{8, 4, 2, 1} {
		if c := context / div; c > 0 && !slices.Contains(cps, c) {
			cps = append(cps, c)
		}
	}
	return cps
}

// probeWriteOnly reports whether this gokv stores a step's keys and values without attending when
// Step.Layer gets nil q and out (how the demo prefills a long context in seconds).
func probeWriteOnly(eng *gokv.Engine) (bool, error) {
	spec := gokv.ModelSpec{Name: "probe", Layers: []gokv.LayerSpec{gokv.AttentionLayer(1, 1, 4)}}
	c, err := eng.NewCache(spec, gokv.CacheOptions{Format: gokv.Format{Kind: gokv.F32}, MaxTokens: 64, MaxSequences: 1})
	if err != nil {
		return false, err
	}
	defer c.Close()
	s, err := c.NewSequence()
	if err != nil {
		return false, err
	}
	st, err := c.Begin(gokv.StepEntry{Seq: s, NewTokens: 1})
	if err != nil {
		return false, err
	}
	defer st.Abort()
	return st.Layer(0, nil, make([]float32, 4), make([]float32, 4), nil) == nil, nil
}

// newDemoRuns creates the f32 reference, one cache per format, and one SinkWindow cache per format.
func newDemoRuns(eng *gokv.Engine, spec gokv.ModelSpec, formats []gokv.Format, maxTokens, chunk int) ([]*demoRun, error) {
	runs := []*demoRun{{format: gokv.Format{Kind: gokv.F32}, role: "ref"}}
	for _, f := range formats {
		runs = append(runs, &demoRun{format: f, role: "format"})
	}
	for _, f := range formats {
		runs = append(runs, &demoRun{format: f, role: "window"})
	}
	for _, r := range runs {
		opts := gokv.CacheOptions{Format: r.format, MaxTokens: maxTokens, MaxSequences: 1,
			MaxStepTokens: max(chunk, gokv.DefaultMaxStepTokens)}
		if r.role == "window" {
			ev := demoSinkWindow
			opts.Eviction = &ev
		}
		var err error
		if r.cache, err = eng.NewCache(spec, opts); err != nil {
			for _, done := range runs {
				if done.cache != nil {
					done.cache.Close()
				}
			}
			return nil, fmt.Errorf("%s cache: %w", r.name(), err)
		}
		for li, l := range spec.Layers {
			if l.LearnedSinks {
				sinks := make([]float32, l.HeadsQ)
				for h := range sinks {
					sinks[h] = float32(h%5) - 2 // fixed logits in [-2, 2]
				}
				if err := r.cache.SetSinkLogits(li, sinks); err != nil {
					return nil, err
				}
			}
		}
		if r.seq, err = r.cache.NewSequence(); err != nil {
			return nil, err
		}
	}
	return runs, nil
}

func (r *demoRun) name() string {
	switch r.role {
	case "ref":
		return "f32 reference"
	case "window":
		return r.format.String() + " SinkWindow"
	}
	return r.format.String()
}

// step appends n tokens to the run's sequence: every layer stores kv's keys and values and, when attend
// is set, computes attention for kv's queries (appending the outputs to *out when out is not nil).
func (r *demoRun) step(kv demoTokens, n int, attend bool, out *[]float32) error {
	st, err := r.cache.Begin(gokv.StepEntry{Seq: r.seq, NewTokens: n})
	if err != nil {
		return err
	}
	for li, l := range kv.spec.Layers {
		var q, o []float32
		if attend {
			q, o = kv.q[li], make([]float32, n*l.HeadsQ*l.HeadDimV)
		}
		if err := st.Layer(li, q, kv.k[li], kv.v[li], o); err != nil {
			return errors.Join(err, st.Abort())
		}
		if out != nil {
			*out = append(*out, o...)
		}
	}
	return st.Commit()
}

// demoData generates the demo's synthetic tokens deterministically, the same for every cache.
type demoData struct {
	spec gokv.ModelSpec
	rng  *rand.Rand
}

type demoTokens struct {
	spec    gokv.ModelSpec
	q, k, v [][]float32 // per layer: [n, HeadsQ, d_k], [n, HeadsKV, d_k], [n, HeadsKV, d_v] (v nil for MLA)
}

func newDemoData(spec gokv.ModelSpec, seed uint64) *demoData {
	return &demoData{spec: spec, rng: rand.New(rand.NewPCG(seed, 0x6b76))}
}

// tokens draws n tokens for every layer: keys with outlier channels, values, and (withQ) queries.
func (g *demoData) tokens(n int, withQ bool) demoTokens {
	t := demoTokens{spec: g.spec}
	for _, l := range g.spec.Layers {
		k := make([]float32, n*l.HeadsKV*l.HeadDimK)
		var v []float32
		if !l.VIsKPrefix() {
			v = make([]float32, n*l.HeadsKV*l.HeadDimV)
		}
		synthKV(g.rng, k, v, l.HeadDimK)
		var q []float32
		if withQ {
			q = make([]float32, n*l.HeadsQ*l.HeadDimK)
			fillNormal(g.rng, q)
		}
		t.q, t.k, t.v = append(t.q, q), append(t.k, k), append(t.v, v)
	}
	return t
}

func printDemo(w io.Writer, rep demoReport) {
	fmt.Fprintf(w, "gokv demo: %s shape, %d of %d layers, %d-token context, %s on %s (%d threads)\n",
		rep.Model, rep.LayersRun, rep.Layers, rep.Context, rep.Backend, rep.Device, rep.Threads)
	fmt.Fprintf(w, "synthetic data: keys N(0,1) with 8/128 outlier channels x4, values and queries N(0,1); prefill: %s\n\n", rep.Prefill)
	fmt.Fprintf(w, "%-14s %12s %11s %16s %24s %10s %11s\n", "format", "KV in use", "B/tok/layer", "full model @128K",
		"decode ms [p10-p90]", "cos f32", "max |err|")
	for _, f := range rep.Formats {
		fmt.Fprintf(w, "%-14s %12s %11.1f %16s %24s %10.6f %11.3g\n", f.Format, formatSize(int64(f.BytesUsed)),
			f.BytesPerTokenLayer, formatSize(f.FullModelAt128K), spreadText(f.DecodeMs, f.DecodeMsP10, f.DecodeMsP90),
			f.CosVsF32, f.MaxAbsErr)
	}
	fmt.Fprintf(w, "\nKV in use is measured (Cache.Stats) for the %d layers run; \"full model @128K\" is gokv plan for all %d layers.\n",
		rep.LayersRun, rep.Layers)
	fmt.Fprintf(w, "decode ms: one decode step, store + attention over the %d layers run: median [p10-p90] of %d steps.\n",
		rep.LayersRun, rep.Steps)
	if len(rep.Formats) > 0 {
		base := rep.Formats[0]
		for _, f := range rep.Formats[1:] {
			fmt.Fprintf(w, "  %s vs %s: %.2fx less memory, %.2fx the decode speed\n", f.Format, base.Format,
				float64(base.BytesUsed)/float64(max(f.BytesUsed, 1)), base.DecodeMs/math.Max(f.DecodeMs, 1e-9))
		}
	}
	fmt.Fprintf(w, "\n%s at %d tokens (attention sees the first %d and the last %d positions):\n", rep.SinkWindow, rep.Context,
		demoSinkWindow.Sinks, demoSinkWindow.Window)
	for _, f := range rep.Formats {
		fmt.Fprintf(w, "  %-14s keeps %10s of %10s, saves %10s (%.1f%%)\n", f.Format, formatSize(int64(f.SinkWindowBytes)),
			formatSize(int64(f.BytesUsed)), formatSize(int64(f.SinkWindowSaved)),
			100*float64(f.SinkWindowSaved)/float64(max(f.BytesUsed, 1)))
	}
	fmt.Fprintln(w)
	if rep.RealModel != nil {
		printDemoReal(w, rep.RealModel)
	} else {
		fmt.Fprintf(w, "real model: %s\n", rep.RealModelSkipped)
	}
	fmt.Fprintf(w, "\n%s\n", demoSpreadLine(rep))
	fmt.Fprintf(w, "\nnot run: %s.\n", strings.TrimSuffix(rep.NotRun, "."))
	if rep.Plot != "" {
		fmt.Fprintf(w, "plot: %s\n", rep.Plot)
	}
	if rep.RealModel != nil {
		fmt.Fprintf(w, "done in %.1f s, of which the real-model part %.1f s\n", rep.Seconds, rep.RealModel.Seconds)
	} else {
		fmt.Fprintf(w, "done in %.1f s\n", rep.Seconds)
	}
}

// demoSpreadLine says how much the timed steps varied at one context and, past demoNoisySpread, that
// the machine was noisy, so a reader weighs the figures accordingly.
func demoSpreadLine(rep demoReport) string {
	load := ""
	if rep.LoadAverage > 0 {
		load = fmt.Sprintf(", load average %.1f on %d CPUs", rep.LoadAverage, rep.CPUs)
	}
	if rep.Noisy {
		return fmt.Sprintf("noisy: other load on the machine (p90/p10 of the steps at one context up to %.2fx%s); compare the medians, and rerun on a quiet machine for absolute figures.",
			rep.Spread, load)
	}
	return fmt.Sprintf("spread: p90/p10 of the steps at one context at most %.2fx%s.", rep.Spread, load)
}
