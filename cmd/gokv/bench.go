package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gokv/gokv/gokv"
)

type benchOpts struct {
	backend, formats, contexts, batches string
	evictions                           string
	headsQ, headsKV, headDim, threads   int
	prefill                             bool
	prefillTokens                       int
	minTime                             time.Duration // time budget of one measurement after warm-up
	readBytes                           int64         // buffer of the bandwidth measurement
	json, quiet                         bool
	seed                                uint64
	memBudget                           int64 // bytes the pools, the f32 reference and the baseline's copy may hold
	parsedEvictions                     []evalEviction
}

func newBenchCmd(g *globalOpts) *cobra.Command {
	o := &benchOpts{}
	var readMiB int
	var memBudget string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Decode (and prefill) attention speed per format and context, against the machine's floor",
		Long: `bench times fused attention on compressed K/V for every format x context x batch on synthetic data
(keys N(0,1) with 8 of 128 channels x4, values N(0,1)), and reports per row:

  ms                   median of several runs after a warm-up (runs chosen by time, --min-time each)
  ms_p10, ms_p90       the 10th and 90th percentiles of the same runs: their spread shows how noisy the
                       machine was (a shared or virtual machine's other load lands on some runs only)
  gbps                 compressed bytes touched / time
  gflops               2*Hq*S*(dk+dv)*batch / time (prefill: summed over the causal rows)
  floor_ms, floor_frac the machine's floor max(bytes / read bandwidth, flops / peak), both measured by
                       bench itself at start, and floor_ms / ms (1 = at the roofline)
  baseline_ms          the dequantize-then-attend baseline (materializes f32 K/V first), fewer runs; null
                       ("-") where that f32 copy would not fit --mem-budget beside the pools (a warning says so)
  speedup_vs_baseline  baseline_ms / ms
  cos_vs_f32           cosine of the output vs the same attention with f32 storage (full attention)
  bytes_read           the K/V bytes one call reads (all sequences), what gbps and the floor count

--eviction times decode under each policy, every token stored (--batch sequences of --contexts tokens):
  full                 every token (the default)
  quest:K[:R]          Quest: per kv head the K pages with the highest key bound plus the pages of the 4
                       sink tokens and of the R newest tokens (R = 1 when left out); the pool keeps key
                       bounds and the scoring of every page is part of the timed call; bytes_read counts
                       the read pages and every page's bounds
  h2o:BUDGET:RECENT    emulated: per sequence and kv head a validity mask keeping BUDGET tokens (the 4
  snapkv:BUDGET:WINDOW sinks, the RECENT / WINDOW newest, the rest drawn uniformly at random from the older
                       tokens, as heavy hitters); bytes_read counts the kept tokens (BUDGET: tokens or a
                       fraction of the context, e.g. 1/8). f32, f16, q8 and q4 caches compact the kept
                       rows into fresh pages once that frees a quarter of a sequence's pages, so a decode
                       sees at most 4/3 BUDGET slots: the row times that worst case (the kept tokens among
                       the first 4/3 BUDGET slots). KIVI keeps its holes: the row attends all the context's
                       pages with the masks, the pages no kv head sees released
  sinkwindow:S:W       the attention window: the S first and W last tokens
Only full rows get the dequantize baseline and prefill rows.

--mem-budget bounds the memory bench holds at once (default auto: 60% of MemAvailable in /proc/meminfo,
8 GiB where there is none; or a byte count such as 12G, 12GB, 512MiB): the pools of a context x batch, the
one-sequence f32 pool of the reference, and the baseline's f32 copy (kept by the device at its largest until
bench reopens it). Formats whose pools do not fit together run in passes, each regenerating the same data;
a format whose pool alone does not fit is an error.

--json prints one JSON object per row and line.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.quiet = g.quiet
			if readMiB < 1 || readMiB > 1<<16 {
				return fmt.Errorf("--read-mib %d must be in [1, 65536] (MiB of the read-bandwidth buffer)", readMiB)
			}
			o.readBytes = int64(readMiB) << 20
			var err error
			if o.memBudget, err = parseMemBudget(memBudget); err != nil {
				return err
			}
			return runBench(cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.backend, "backend", "auto", "backend: cpu, vulkan, metal, sycl or auto")
	f.StringVar(&o.formats, "formats", "f16,q4,kivi2", "formats, comma-separated")
	f.StringVar(&o.contexts, "contexts", "4096,32768,131072", "context lengths S, comma-separated (K suffix = 1024)")
	f.StringVar(&o.batches, "batch", "1", "sequences per call, comma-separated")
	f.StringVar(&o.evictions, "eviction", "full", "decode under each policy, comma-separated: full, quest:K[:R], h2o:BUDGET:RECENT, snapkv:BUDGET:WINDOW, sinkwindow:S:W")
	f.IntVar(&o.headsQ, "heads-q", 32, "query heads")
	f.IntVar(&o.headsKV, "heads-kv", 8, "kv heads")
	f.IntVar(&o.headDim, "head-dim", 128, "head dimension (d_qk = d_v)")
	f.IntVar(&o.threads, "threads", 0, "CPU worker threads (0: all online CPUs)")
	f.BoolVar(&o.prefill, "prefill", false, "also time prefill: --prefill-tokens causal query rows at the end of the context")
	f.IntVar(&o.prefillTokens, "prefill-tokens", 512, "query rows of a prefill row")
	f.DurationVar(&o.minTime, "min-time", 400*time.Millisecond, "time budget of each measurement after its warm-up")
	f.IntVar(&readMiB, "read-mib", 512, "buffer of the read-bandwidth measurement in MiB (many times the last-level cache)")
	f.StringVar(&memBudget, "mem-budget", "auto", "bytes the pools may hold at once (K/M/G suffix = KiB/MiB/GiB, or 12GB, 8GiB); auto: 60% of MemAvailable")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the synthetic data")
	f.BoolVar(&o.json, "json", false, "print one JSON object per row")
	return cmd
}

// benchRow is one result; the JSON keys of a decode row are exactly these.
type benchRow struct {
	Backend           string   `json:"backend"`
	Format            string   `json:"format"`
	Eviction          string   `json:"eviction"`
	Context           int      `json:"context"`
	Batch             int      `json:"batch"`
	HeadsQ            int      `json:"heads_q"`
	HeadsKV           int      `json:"heads_kv"`
	HeadDim           int      `json:"head_dim"`
	Threads           int      `json:"threads"`
	Ms                float64  `json:"ms"`
	MsP10             float64  `json:"ms_p10"`
	MsP90             float64  `json:"ms_p90"`
	GBps              float64  `json:"gbps"`
	GFLOPs            float64  `json:"gflops"`
	FloorMs           float64  `json:"floor_ms"`
	FloorFrac         float64  `json:"floor_frac"`
	BaselineMs        *float64 `json:"baseline_ms"`         // null when the backend has no baseline
	SpeedupVsBaseline *float64 `json:"speedup_vs_baseline"` // null likewise
	CosVsF32          float64  `json:"cos_vs_f32"`
	BytesRead         float64  `json:"bytes_read"` // K/V bytes one call reads, all sequences
}

// prefillRow is a prefill result: a decode row's keys plus what distinguishes it.
type prefillRow struct {
	benchRow
	Mode          string `json:"mode"` // "prefill"
	PrefillTokens int    `json:"prefill_tokens"`
}

func runBench(stdout, stderr io.Writer, o *benchOpts) error {
	formats, err := parseFormats(o.formats)
	if err != nil {
		return fmt.Errorf("--formats: %w", err)
	}
	contexts, err := parseInts("contexts", o.contexts)
	if err != nil {
		return err
	}
	batches, err := parseInts("batch", o.batches)
	if err != nil {
		return err
	}
	if o.headsQ < 1 || o.headsKV < 1 || o.headsQ%o.headsKV != 0 {
		return fmt.Errorf("--heads-q %d must be a positive multiple of --heads-kv %d", o.headsQ, o.headsKV)
	}
	for _, f := range formats {
		if err := f.Validate(o.headDim, o.headDim); err != nil {
			return fmt.Errorf("--formats %s with --head-dim %d: %w", f, o.headDim, err)
		}
	}
	if o.prefill && o.prefillTokens < 1 {
		return fmt.Errorf("--prefill-tokens %d must be >= 1", o.prefillTokens)
	}
	evs, err := parseEvictions(o.evictions)
	if err != nil {
		return err
	}
	eng, info, err := openEngine(o.backend, o.threads)
	if err != nil {
		return err
	}
	engs := &benchEngines{eng: eng, refEng: eng, backend: o.backend, threads: o.threads}
	defer engs.Close()
	for _, ev := range evs {
		switch {
		case ev.kind == "quest" && !info.Caps.Quest:
			return fmt.Errorf("--eviction %s: the %s backend has no Quest kernels (no quest capability)", ev.name, info.Backend)
		case (ev.kind == "h2o" || ev.kind == "snapkv") && !info.Caps.KVHeadMasks:
			return fmt.Errorf("--eviction %s: the %s backend has no per-kv-head masks", ev.name, info.Backend)
		case ev.sw != nil && !info.Caps.Window:
			return fmt.Errorf("--eviction %s: the %s backend has no attention window", ev.name, info.Backend)
		}
	}
	o.parsedEvictions = evs
	logger.Info().Str("device", info.Name).Str("features", info.Features).Int("threads", info.Threads).Msg("bench device")
	// The f32 reference of cos_vs_f32 runs on the CPU backend: the numerical reference, and a GPU's
	// storage-buffer limit then bounds only the formats under test.
	if info.Backend != "cpu" {
		if engs.refEng, _, err = openEngine("cpu", o.threads); err != nil {
			engs.refEng = eng
			return fmt.Errorf("opening the cpu device for the f32 reference: %w", err)
		}
	}

	readBytes := o.readBytes
	if readBytes <= 0 {
		readBytes = 512 << 20
	}
	m, err := eng.Measure(readBytes)
	if err != nil {
		return fmt.Errorf("measuring the %s device's floor: %w", info.Backend, err)
	}
	ceil := ceilings{ReadGBps: m.ReadGBps, PeakGFLOPs: m.PeakGFLOPs, Source: m.Method}
	if !o.json {
		fmt.Fprintf(stdout, "%s: %s, %d threads, %s\n", info.Backend, info.Name, info.Threads, info.Features)
		peak := "not measured"
		if ceil.PeakGFLOPs > 0 {
			peak = fmt.Sprintf("%.1f GFLOP/s", ceil.PeakGFLOPs)
		}
		fmt.Fprintf(stdout, "measured ceilings: read %.1f GB/s, peak %s (%s)\n", ceil.ReadGBps, peak, ceil.Source)
		fmt.Fprintf(stdout, "shape: %d query heads, %d kv heads, head dim %d\n", o.headsQ, o.headsKV, o.headDim)
		fmt.Fprintf(stdout, "memory budget: %s (--mem-budget): formats whose pools do not fit together run in passes; "+
			"baseline \"-\" where its f32 copy of K/V would not fit beside the pools\n", formatSize(o.memBudget))
		for _, line := range benchEvictionNotes(evs) {
			fmt.Fprintf(stdout, "%s\n", line)
		}
		fmt.Fprintln(stdout)
		fmt.Fprintf(stdout, "%-11s %-14s %-18s %7s %5s %9s %15s %10s %8s %8s %9s %6s %11s %8s %9s\n", "mode", "format", "eviction", "context", "batch",
			"ms", "p10-p90 ms", "MB read", "GB/s", "GFLOP/s", "floor ms", "floor", "baseline ms", "speedup", "cos f32")
	}
	modes := []bool{false}
	if o.prefill {
		modes = append(modes, true)
	}
	bar := newProgress(stderr, o.quiet, len(contexts)*len(batches)*len(formats)*(len(modes)+len(evs)-1), "bench")
	defer bar.Finish()
	for _, S := range contexts {
		for _, B := range batches {
			rows, err := benchCase(engs, info, ceil, formats, S, B, modes, o, func() { bar.Add(1) })
			if err != nil {
				return err
			}
			bar.Clear() // the rows and the bar may share a terminal
			for _, r := range rows {
				if err := printBenchRow(stdout, o.json, r); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func printBenchRow(w io.Writer, asJSON bool, r any) error {
	if asJSON {
		return writeJSON(w, r)
	}
	mode, row := "decode", benchRow{}
	switch v := r.(type) {
	case benchRow:
		row = v
	case prefillRow:
		mode, row = fmt.Sprintf("prefill%d", v.PrefillTokens), v.benchRow
	}
	base, speed := "-", "-"
	if row.BaselineMs != nil {
		base, speed = fmt.Sprintf("%.3f", *row.BaselineMs), fmt.Sprintf("%.1fx", *row.SpeedupVsBaseline)
	}
	spread := fmt.Sprintf("%.3f-%.3f", row.MsP10, row.MsP90)
	_, err := fmt.Fprintf(w, "%-11s %-14s %-18s %7s %5d %9.3f %15s %10.2f %8.1f %8.1f %9.3f %5.0f%% %11s %8s %9.6f\n", mode, row.Format,
		row.Eviction, humanCount(row.Context), row.Batch, row.Ms, spread, row.BytesRead/1e6, row.GBps, row.GFLOPs, row.FloorMs,
		100*row.FloorFrac, base, speed, row.CosVsF32)
	return err
}

// benchEngines are the engines a bench run times and references on, and what the timed one holds.
type benchEngines struct {
	eng, refEng *gokv.Engine // refEng is eng on the CPU backend
	backend     string
	threads     int
	// held is the bytes of the dequantize baseline's f32 copy of K/V that eng keeps between calls: the largest
	// copy so far, since the device only ever grows it and nothing in the API frees it short of closing
	// the engine (dropBaselineCopy).
	held int64
}

func (e *benchEngines) Close() {
	if e.refEng != e.eng {
		e.refEng.Close()
	}
	e.eng.Close()
}

// dropBaselineCopy frees the baseline's copy the only way there is: a fresh engine (no pools are open then).
func (e *benchEngines) dropBaselineCopy() error {
	same := e.refEng == e.eng
	e.eng.Close()
	eng, _, err := openEngine(e.backend, e.threads)
	if err != nil {
		return fmt.Errorf("reopening the %s device to free the baseline's f32 copy: %w", e.backend, err)
	}
	e.eng, e.held = eng, 0
	if same {
		e.refEng = eng
	}
	return nil
}

// benchQuery is one mode's query rows (T per sequence) and their f32 reference output.
type benchQuery struct {
	prefill              bool
	T                    int
	q, ref               []float32
	qIndptr, kvLen, qPos []int32
}

// benchCase times every format on B sequences of S synthetic tokens. The format pools whose bytes fit
// --mem-budget together form one pass (formats in order, so rows keep their order); each pass
// regenerates the same data (the RNG is seeded per sequence and context) into its pools. The f32
// reference of cos_vs_f32 is computed in the first pass, one sequence at a time in a one-sequence pool
// on refEng, so that it never holds B sequences of f32.
func benchCase(engs *benchEngines, info gokv.DeviceInfo, ceil ceilings, formats []gokv.Format, S, B int,
	modes []bool, o *benchOpts, tick func()) ([]any, error) {
	H, Hq, d := o.headsKV, o.headsQ, o.headDim
	keyBounds := benchKeyBounds(o)
	f32 := gokv.Format{Kind: gokv.F32}
	refLay := newSeqLayout(f32, 1, S)
	refBytes, err := benchPoolBytes(f32, refLay, H, d, false)
	if err != nil {
		return nil, fmt.Errorf("f32 reference at context %d: %w", S, err)
	}
	lays := make([]seqLayout, len(formats))
	need := make([]int64, len(formats))
	var total int64
	for i, f := range formats {
		lays[i] = newSeqLayout(f, B, S)
		if need[i], err = benchPoolBytes(f, lays[i], H, d, keyBounds); err != nil {
			return nil, fmt.Errorf("format %s at context %d, batch %d: %w", f, S, B, err)
		}
		total += need[i]
	}
	if engs.held > 0 && engs.held+refBytes+total > o.memBudget {
		if err := engs.dropBaselineCopy(); err != nil {
			return nil, err
		}
	}
	for i, f := range formats {
		if need[i]+refBytes+engs.held > o.memBudget {
			return nil, fmt.Errorf("format %s at context %d, batch %d needs %s for its pool (plus %s for the one-sequence "+
				"f32 reference), more than the memory budget of %s: raise --mem-budget or lower --contexts / --batch",
				f, S, B, formatSize(need[i]), formatSize(refBytes), formatSize(o.memBudget))
		}
	}
	passes := benchPasses(need, o.memBudget-engs.held-refBytes)
	if len(passes) > 1 {
		logger.Info().Int("context", S).Int("batch", B).Int("passes", len(passes)).Str("budget", formatSize(o.memBudget)).
			Msg("the format pools do not fit the memory budget together: one pass of generated data per group")
	}

	queries := make([]*benchQuery, len(modes))
	for m, prefill := range modes {
		T := 1
		if prefill {
			T = min(o.prefillTokens, S)
		}
		rng := rand.New(rand.NewPCG(o.seed^0x9e3779b9, uint64(S)))
		bq := &benchQuery{prefill: prefill, T: T, q: make([]float32, B*T*Hq*d), ref: make([]float32, B*T*Hq*d),
			qIndptr: make([]int32, B+1), kvLen: make([]int32, B), qPos: make([]int32, B)}
		fillNormal(rng, bq.q)
		for s := 0; s < B; s++ {
			bq.qIndptr[s+1] = int32((s + 1) * T)
			bq.kvLen[s], bq.qPos[s] = int32(S), int32(S-T)
		}
		queries[m] = bq
	}
	// rows[m][i]: mode m's rows of format i, gathered over the passes and printed in the order of one pass.
	rows := make([][][]any, len(modes))
	for m := range rows {
		rows[m] = make([][]any, len(formats))
	}
	for p, pass := range passes {
		if err := benchPass(engs, info, ceil, formats, lays, pass, need, p == 0, refLay, queries, S, B, o, rows, tick); err != nil {
			return nil, err
		}
	}
	var out []any
	for m := range rows {
		for i := range rows[m] {
			out = append(out, rows[m][i]...)
		}
	}
	return out, nil
}

// benchKeyBounds says whether the format pools keep Quest's key bounds (the f32 reference's never does).
func benchKeyBounds(o *benchOpts) bool {
	for _, ev := range o.parsedEvictions {
		if ev.kind == "quest" {
			return true
		}
	}
	return false
}

// benchPasses groups consecutive formats whose pools (need bytes each, each at most avail) fit avail
// together. Consecutive keeps each pass's rows in --formats order at the price of a pass more than a
// best packing might need.
func benchPasses(need []int64, avail int64) [][]int {
	var passes [][]int
	var used int64
	for i, n := range need {
		if len(passes) == 0 || used+n > avail {
			passes, used = append(passes, nil), 0
		}
		passes[len(passes)-1] = append(passes[len(passes)-1], i)
		used += n
	}
	return passes
}

// benchPoolBytes is what newBenchPool allocates for layout l, from the C core's layout sizes: its pages
// (with Quest's key bounds when keyBounds) and, for KIVI, one fp16 residual ring per sequence.
func benchPoolBytes(f gokv.Format, l seqLayout, hkv, d int, keyBounds bool) (int64, error) {
	L, err := f.Layout(hkv, d, d, l.pageSize, false)
	if err != nil {
		return 0, err
	}
	page := L.PageBytes
	if keyBounds {
		page += L.PageBoundsBytes
	}
	bytes := int64(len(l.pageIDs)) * page
	if f.Kind.IsKIVI() {
		bytes += int64(l.seqs) * L.ResidualSlotBytes
	}
	return bytes, nil
}

// benchPass writes the case's synthetic data to the pools of the formats in pass (and, in the first pass,
// computes the f32 reference of every query), then times those formats into rows.
func benchPass(engs *benchEngines, info gokv.DeviceInfo, ceil ceilings, formats []gokv.Format, lays []seqLayout,
	pass []int, need []int64, first bool, refLay seqLayout, queries []*benchQuery, S, B int, o *benchOpts,
	rows [][][]any, tick func()) error {
	H, Hq, d := o.headsKV, o.headsQ, o.headDim
	keyBounds := benchKeyBounds(o)
	pools := make([]*gokv.PagedPool, len(formats))
	defer func() {
		for _, p := range pools {
			p.Close()
		}
	}()
	var passBytes int64
	for _, i := range pass {
		var err error
		if pools[i], err = newBenchPool(engs.eng, formats[i], lays[i], H, d, keyBounds); err != nil {
			return fmt.Errorf("format %s at context %d, batch %d: %w", formats[i], S, B, err)
		}
		passBytes += need[i]
	}
	var refPool *gokv.PagedPool
	if first {
		var err error
		if refPool, err = newBenchPool(engs.refEng, gokv.Format{Kind: gokv.F32}, refLay, H, d, false); err != nil {
			return fmt.Errorf("f32 reference at context %d: %w", S, err)
		}
		defer refPool.Close()
	}
	scale := float32(1 / math.Sqrt(float64(d)))
	var refIndptr, refIDs []int32
	var refOut []float32
	if refPool != nil {
		refIndptr, refIDs = make([]int32, B+1), make([]int32, B*refLay.pagesPerSeq)
		for s := range refIndptr {
			refIndptr[s] = int32(s * refLay.pagesPerSeq)
		}
		for _, bq := range queries {
			refOut = make([]float32, max(len(refOut), len(bq.ref)))
		}
	}
	const chunk = 4096
	kbuf, vbuf := make([]float32, chunk*H*d), make([]float32, chunk*H*d)
	for s := 0; s < B; s++ {
		rng := rand.New(rand.NewPCG(o.seed, uint64(S)<<20|uint64(s)))
		for start := 0; start < S; start += chunk {
			n := min(chunk, S-start)
			synthKV(rng, kbuf[:n*H*d], vbuf[:n*H*d], d)
			for _, i := range pass {
				if err := lays[i].writeSeq(pools[i], s, start, kbuf[:n*H*d], vbuf[:n*H*d], n); err != nil {
					return fmt.Errorf("writing format %s: %w", formats[i], err)
				}
			}
			if refPool != nil { // sequence s over the previous one: the pool's sequence 0 restarts at 0
				if err := refLay.writeSeq(refPool, 0, start, kbuf[:n*H*d], vbuf[:n*H*d], n); err != nil {
					return fmt.Errorf("writing the f32 reference: %w", err)
				}
			}
		}
		if refPool == nil {
			continue
		}
		// The call keeps the whole batch's shape, the other sequences' pages released: the CPU kernel cuts
		// its split-K chunks by the tokens of all the sequences, so a one-sequence call would sum in other
		// chunks and move cos_vs_f32 in its 9th digit. Released pages cost the kernel nothing.
		for i := range refIDs {
			refIDs[i] = -1
		}
		copy(refIDs[s*refLay.pagesPerSeq:], refLay.pageIDs)
		for _, bq := range queries {
			per := bq.T * Hq * d // output floats of one sequence
			a := gokv.PagedAttend{QIndptr: bq.qIndptr, PageIndptr: refIndptr, PageIDs: refIDs, KVLen: bq.kvLen,
				QPos: bq.qPos, HeadsQ: Hq, Q: bq.q, Out: refOut[:B*per], Scale: scale}
			if err := refPool.Attend(a); err != nil {
				return fmt.Errorf("f32 reference at context %d: %w", S, err)
			}
			copy(bq.ref[s*per:(s+1)*per], refOut[s*per:(s+1)*per])
		}
	}
	if refPool != nil { // computed: its memory goes back before the timing
		refPool.Close()
	}

	f32PageBytes := func(pageSize int) int64 { return gokv.Format{Kind: gokv.F32}.PageBytes(H, d, d, pageSize, false) }
	for m, bq := range queries {
		prefill, T := bq.prefill, bq.T
		batch := func(i int, out []float32, baseline bool) gokv.PagedAttend {
			return gokv.PagedAttend{QIndptr: bq.qIndptr, PageIndptr: lays[i].pageIndptr,
				PageIDs: lays[i].pageIDs, KVLen: bq.kvLen, QPos: bq.qPos, ResidualSlot: lays[i].residualSlot, HeadsQ: Hq,
				Q: bq.q, Out: out, Scale: scale, Baseline: baseline}
		}
		// Causal rows: row j (0-based) of T sees S-T+j+1 tokens.
		visible := float64(T)*float64(S-T) + float64(T)*float64(T+1)/2
		flops := 2 * float64(Hq) * visible * float64(2*d) * float64(B)
		for _, i := range pass {
			f := formats[i]
			evs := o.parsedEvictions
			if prefill || len(evs) == 0 {
				evs = []evalEviction{{name: "full"}}
			}
			for _, ev := range evs {
				pol, err := benchPolicyFor(ev, lays[i], pools[i], f, S, B, H, o.seed)
				if err != nil {
					return err
				}
				attend := func(out []float32, baseline bool) gokv.PagedAttend {
					a := batch(i, out, baseline)
					if pol.apply != nil {
						pol.apply(&a)
					}
					return a
				}
				out := make([]float32, B*T*Hq*d)
				// Up to 1000 runs: a 4K decode takes about 0.2 ms on two cores, and 50 runs (10 ms) let one
				// burst of a noisy machine move its median by a third.
				tm, err := timeIt(o.minTime, 3, 1000, func() error { return pools[i].Attend(attend(out, false)) })
				if err != nil {
					return fmt.Errorf("format %s, eviction %s at context %d: %w", f, ev.name, S, err)
				}
				bytes := pol.bytes
				fl := flops
				if !prefill {
					fl = 2 * float64(Hq) * pol.visible * float64(2*d) * float64(B)
				}
				floor, ms := ceil.floorMs(bytes, fl), tm.median
				row := benchRow{Backend: info.Backend, Format: f.String(), Eviction: pol.name, Context: S, Batch: B, HeadsQ: Hq,
					HeadsKV: H, HeadDim: d, Threads: info.Threads, Ms: ms, MsP10: tm.p10, MsP90: tm.p90,
					GBps: bytes / (ms * 1e-3) / 1e9, GFLOPs: fl / (ms * 1e-3) / 1e9, FloorMs: floor, FloorFrac: floor / ms,
					CosVsF32: cosine(out, bq.ref), BytesRead: bytes}
				// The baseline expands every page of the table to f32 (baseline.c), into a copy the device
				// keeps at its largest: it runs when that copy already exists or fits beside the pass's pools.
				copyBytes := int64(len(lays[i].pageIDs)) * f32PageBytes(lays[i].pageSize)
				fits := copyBytes <= engs.held || passBytes+copyBytes <= o.memBudget
				if info.Caps.Baseline && pol.apply == nil && !fits {
					logger.Warn().Str("format", f.String()).Int("context", S).Int("batch", B).
						Str("needs", formatSize(copyBytes)).Str("pools", formatSize(passBytes)).Str("budget", formatSize(o.memBudget)).
						Msg("the baseline's f32 copy of K/V does not fit --mem-budget beside the pools; baseline_ms is null")
				}
				if info.Caps.Baseline && pol.apply == nil && fits {
					// The baseline materializes f32 K/V for every call: give it a smaller budget and fewer runs.
					baseOut := make([]float32, len(out))
					baseline := func() error { return pools[i].Attend(attend(baseOut, true)) }
					// One call first, untimed: the first call at a new largest context grows the device's f32
					// copy (page faults of up to gigabytes), and timeIt would count a warm-up that long as a run.
					var btm timing
					err := baseline()
					if err == nil {
						engs.held = max(engs.held, copyBytes)
						btm, err = timeIt(o.minTime/2, 1, 10, baseline)
					}
					switch {
					case errors.Is(err, gokv.ErrOutOfMemory):
						// The baseline's f32 copy of K/V can outgrow a GPU's storage buffers where the fused
						// path still fits: the row says so (null baseline) instead of failing the run.
						logger.Warn().Err(err).Str("format", f.String()).Int("context", S).
							Msg("baseline does not fit this device; baseline_ms is null")
					case err != nil:
						return fmt.Errorf("baseline %s at context %d: %w", f, S, err)
					default:
						bms, speedup := btm.median, btm.median/ms
						row.BaselineMs, row.SpeedupVsBaseline = &bms, &speedup
					}
				}
				if prefill {
					rows[m][i] = append(rows[m][i], prefillRow{benchRow: row, Mode: "prefill", PrefillTokens: T})
				} else {
					rows[m][i] = append(rows[m][i], row)
				}
				tick()
			}
		}
	}
	return nil
}

// benchEvictionNotes says how each kind of --eviction policy is timed, for the text header.
func benchEvictionNotes(evs []evalEviction) []string {
	var out []string
	seen := map[string]bool{}
	for _, ev := range evs {
		kind := ev.kind
		if ev.sw != nil {
			kind = "sinkwindow"
		}
		if kind == "" || seen[kind] {
			continue
		}
		seen[kind] = true
		switch kind {
		case "quest":
			out = append(out, "quest: the kernels score every page's key bounds and read the chosen pages plus the 4 sink tokens' and the recent tokens' pages, in the timed call; MB read = read pages + every page's bounds")
		case "h2o", "snapkv":
			out = append(out, kind+": emulated with per-kv-head masks keeping BUDGET tokens (4 sinks, the newest RECENT/WINDOW, the rest drawn at random); f32/f16/q8/q4 over 4/3 BUDGET compacted slots (the most a decode sees between compactions), KIVI over the whole context with the pages no kv head sees released; MB read = kept tokens x bytes per token")
		case "sinkwindow":
			out = append(out, "sinkwindow: the attention window (S sinks + the last W tokens); MB read = those tokens x bytes per token")
		}
	}
	return out
}

// newBenchPool creates a pool holding the layout's sequences, with Quest's key bounds when keyBounds.
func newBenchPool(eng *gokv.Engine, f gokv.Format, l seqLayout, hkv, d int, keyBounds bool) (*gokv.PagedPool, error) {
	o := gokv.PagedPoolOptions{Format: f, KVHeads: hkv, HeadDimK: d, HeadDimV: d, PageSize: l.pageSize, Pages: len(l.pageIDs),
		KeyBounds: keyBounds}
	if f.Kind.IsKIVI() {
		o.ResidualSlots = l.seqs
	}
	return eng.NewPagedPool(o)
}

// benchPolicy is one --eviction policy made concrete for a pool: what it changes in the decode call,
// the bytes one call reads (all sequences) and the tokens each query head attends to per sequence.
type benchPolicy struct {
	name    string
	apply   func(a *gokv.PagedAttend) // nil: full attention
	bytes   float64
	visible float64
}

// benchPolicyFor builds ev's decode call for B sequences of S tokens in pool (layout lay, H kv heads).
func benchPolicyFor(ev evalEviction, lay seqLayout, pool *gokv.PagedPool, f gokv.Format, S, B, H int, seed uint64) (benchPolicy, error) {
	P := lay.pageSize
	L := pool.Layout()
	perToken := float64(L.PageBytes) / float64(P)
	full, err := bytesTouched(pool, f, S, H, pool.Options().HeadDimK)
	if err != nil {
		return benchPolicy{}, err
	}
	ring := full - float64((f.QuantizedTokens(S)+P-1)/P)*float64(L.PageBytes) // KIVI: the fp16 ring, read by every policy
	pol := benchPolicy{name: ev.name, bytes: full * float64(B), visible: float64(S)}
	if ev.name == "none" {
		pol.name = "full"
	}
	sinks := gokv.DefaultSinkTokens
	switch {
	case ev.kind == "quest":
		pages := (S + P - 1) / P
		read := min(pages, ev.num+len(gokv.QuestForcedPages(S, sinks, ev.second, P)))
		pol.apply = func(a *gokv.PagedAttend) { a.QuestPages, a.QuestRecent, a.SinkTokens = ev.num, ev.second, sinks }
		pol.bytes = float64(B) * (float64(read)*float64(L.PageBytes) + float64(pages)*float64(L.PageBoundsBytes) + ring)
		pol.visible = float64(min(S, read*P))
	case ev.sw != nil:
		kept := min(S, ev.sw.Sinks+ev.sw.Window)
		pol.apply = func(a *gokv.PagedAttend) { a.Window, a.SinkTokens = ev.sw.Window, ev.sw.Sinks }
		pol.bytes = float64(B) * float64(kept) * perToken
		pol.visible = float64(kept)
	case ev.kind == "h2o" || ev.kind == "snapkv":
		_, budget := ev.policy(S)
		budget = min(budget, S)
		protect := min(ev.second, S)
		kept := min(S, max(budget, min(sinks, S)+protect))
		full := S // the slots a decode sees: every token, or the compacted worst case (gokv/compact.go)
		if !f.Kind.IsKIVI() {
			S = min(S, (4*kept+2)/3)
		}
		words := (S + 31) / 32
		mask := make([]uint32, B*H*words)
		indptr := make([]int32, B+1)
		ids := slices.Clone(lay.pageIDs)
		rng := rand.New(rand.NewPCG(seed^0x5eed, uint64(S)))
		var cand []int
		for s := 0; s < B; s++ {
			indptr[s+1] = int32((s + 1) * H * words)
			seen := make([]bool, lay.pagesPerSeq)
			for h := 0; h < H; h++ {
				m := mask[(s*H+h)*words : (s*H+h+1)*words]
				keep := func(t int) { m[t/32] |= 1 << (t % 32); seen[t/P] = true }
				lo, hi := min(sinks, S), max(S-protect, min(sinks, S))
				for t := 0; t < lo; t++ {
					keep(t)
				}
				for t := hi; t < S; t++ {
					keep(t)
				}
				cand = cand[:0]
				for t := lo; t < hi; t++ {
					cand = append(cand, t)
				}
				extra := min(len(cand), max(0, budget-lo-(S-hi)))
				for j := 0; j < extra; j++ { // a partial Fisher-Yates draw: `extra` distinct heavy hitters
					r := j + rng.IntN(len(cand)-j)
					cand[j], cand[r] = cand[r], cand[j]
					keep(cand[j])
				}
			}
			// Release the pages no kv head sees (KIVI: only those already quantized out of the ring).
			for j, ok := range seen {
				if !ok && (j+1)*P <= f.QuantizedTokens(S) {
					ids[s*lay.pagesPerSeq+j] = -1
				}
			}
		}
		if S == full {
			pol.apply = func(a *gokv.PagedAttend) {
				a.ValidMask, a.ValidIndptr, a.MaskPerKVHead, a.PageIDs = mask, indptr, true, ids
			}
		} else { // compacted: each sequence's first ceil(S/P) pages hold its S slots
			n := (S + P - 1) / P
			var cids []int32
			pindptr, kvLen, qPos := make([]int32, B+1), make([]int32, B), make([]int32, B)
			for s := 0; s < B; s++ {
				cids = append(cids, ids[s*lay.pagesPerSeq:s*lay.pagesPerSeq+n]...)
				pindptr[s+1], kvLen[s], qPos[s] = int32(len(cids)), int32(S), int32(S-1)
			}
			pol.apply = func(a *gokv.PagedAttend) {
				a.ValidMask, a.ValidIndptr, a.MaskPerKVHead = mask, indptr, true
				a.PageIndptr, a.PageIDs, a.KVLen, a.QPos = pindptr, cids, kvLen, qPos
			}
		}
		pol.bytes = float64(B) * float64(kept) * perToken
		pol.visible = float64(kept)
	}
	return pol, nil
}

// bytesTouched is the compressed bytes one sequence of S tokens makes attention read: its pages (whole
// pages, as stored) and, for KIVI, the fp16 rows in its residual ring.
func bytesTouched(pool *gokv.PagedPool, f gokv.Format, S, H, d int) (float64, error) {
	nq := f.QuantizedTokens(S)
	P := pool.Options().PageSize
	bytes := float64((nq+P-1)/P) * float64(pool.Layout().PageBytes)
	bytes += float64(S-nq) * float64(H) * float64(2*d) * 2
	return bytes, nil
}

// timing is what timeIt measured: the median run and the 10th and 90th percentiles, in ms.
type timing struct{ median, p10, p90 float64 }

// timeIt runs fn once as a warm-up, then as many times as fit in budget (at least minRuns, at most
// maxRuns) and returns the runs' median and spread in ms. A warm-up longer than the budget makes the
// warm-up run count as one of minRuns, so a slow case costs about minRuns runs.
func timeIt(budget time.Duration, minRuns, maxRuns int, fn func() error) (timing, error) {
	t0 := time.Now()
	if err := fn(); err != nil {
		return timing{}, err
	}
	warm := time.Since(t0)
	var times []float64
	runs := maxRuns
	if warm > 0 {
		runs = int(budget / warm)
	}
	if warm > budget {
		times = append(times, warm.Seconds()*1e3)
		minRuns--
	}
	runs = max(minRuns, min(runs, maxRuns))
	for r := 0; r < runs; r++ {
		t := time.Now()
		if err := fn(); err != nil {
			return timing{}, err
		}
		times = append(times, time.Since(t).Seconds()*1e3)
	}
	return timing{median(times), percentile(times, 0.1), percentile(times, 0.9)}, nil
}

// benchDefaultBudgetFrac is the share of the memory available that --mem-budget auto takes: room for the
// Go heap, the page cache and whatever else runs beside the benchmark.
const benchDefaultBudgetFrac = 0.6

// benchFallbackBudget is --mem-budget auto where /proc/meminfo cannot say what is available.
const benchFallbackBudget = 8 << 30

// parseMemBudget reads --mem-budget: "auto", or a byte count as parseSize takes it with K, M and G
// (and T) also meaning KiB, MiB and GiB, as --contexts' K does.
func parseMemBudget(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if strings.EqualFold(t, "auto") {
		if avail, ok := memAvailable(); ok {
			return int64(benchDefaultBudgetFrac * float64(avail)), nil
		}
		return benchFallbackBudget, nil
	}
	if t != "" && strings.ContainsRune("kKmMgGtT", rune(t[len(t)-1])) {
		t += "iB"
	}
	n, err := parseSize(t)
	if err != nil {
		return 0, fmt.Errorf("--mem-budget: %w", err)
	}
	if n <= 0 {
		return 0, fmt.Errorf("--mem-budget %q must be more than 0 bytes", s)
	}
	return n, nil
}

// memAvailable is Linux's estimate of the memory a new workload can take without swapping or the OOM
// killer (MemAvailable in /proc/meminfo); ok is false where there is no such file.
func memAvailable() (int64, bool) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(data), "\n") {
		rest, found := strings.CutPrefix(line, "MemAvailable:")
		if !found {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 2 && fields[1] == "kB" {
			if kb, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
				return kb << 10, true
			}
		}
	}
	return 0, false
}
