package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
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
	parsedEvictions                     []evalEviction
}

func newBenchCmd(g *globalOpts) *cobra.Command {
	o := &benchOpts{}
	var readMiB int
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
  baseline_ms          the dequantize-then-attend baseline (materializes f32 K/V first), fewer runs
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

--json prints one JSON object per row and line.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.quiet = g.quiet
			if readMiB < 1 || readMiB > 1<<16 {
				return fmt.Errorf("--read-mib %d must be in [1, 65536] (MiB of the read-bandwidth buffer)", readMiB)
			}
			o.readBytes = int64(readMiB) << 20
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
	defer eng.Close()
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
	refEng := eng
	if info.Backend != "cpu" {
		if refEng, _, err = openEngine("cpu", o.threads); err != nil {
			return fmt.Errorf("opening the cpu device for the f32 reference: %w", err)
		}
		defer refEng.Close()
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
			rows, err := benchCase(eng, refEng, info, ceil, formats, S, B, modes, o, func() { bar.Add(1) })
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

// benchCase builds one pool per format (plus an f32 reference on refDev) holding B sequences of S synthetic
// tokens, generated once and written to every pool chunk by chunk, then times each format.
func benchCase(eng, refEng *gokv.Engine, info gokv.DeviceInfo, ceil ceilings, formats []gokv.Format, S, B int,
	modes []bool, o *benchOpts, tick func()) ([]any, error) {
	H, Hq, d := o.headsKV, o.headsQ, o.headDim
	all := append([]gokv.Format{{Kind: gokv.F32}}, formats...)
	keyBounds := false // Quest's pools keep key bounds (the f32 reference's does not)
	for _, ev := range o.parsedEvictions {
		keyBounds = keyBounds || ev.kind == "quest"
	}
	pools := make([]*gokv.PagedPool, len(all))
	lays := make([]seqLayout, len(all))
	defer func() {
		for _, p := range pools {
			p.Close()
		}
	}()
	for i, f := range all {
		lays[i] = newSeqLayout(f, B, S)
		var err error
		on := eng
		if i == 0 {
			on = refEng
		}
		if pools[i], err = newBenchPool(on, f, lays[i], H, d, i > 0 && keyBounds); err != nil {
			return nil, fmt.Errorf("format %s at context %d, batch %d: %w", f, S, B, err)
		}
	}
	const chunk = 4096
	kbuf, vbuf := make([]float32, chunk*H*d), make([]float32, chunk*H*d)
	for s := 0; s < B; s++ {
		rng := rand.New(rand.NewPCG(o.seed, uint64(S)<<20|uint64(s)))
		for start := 0; start < S; start += chunk {
			n := min(chunk, S-start)
			synthKV(rng, kbuf[:n*H*d], vbuf[:n*H*d], d)
			for i := range all {
				if err := lays[i].writeSeq(pools[i], s, start, kbuf[:n*H*d], vbuf[:n*H*d], n); err != nil {
					return nil, fmt.Errorf("writing format %s: %w", all[i], err)
				}
			}
		}
	}

	var rows []any
	for _, prefill := range modes {
		T := 1
		if prefill {
			T = min(o.prefillTokens, S)
		}
		rng := rand.New(rand.NewPCG(o.seed^0x9e3779b9, uint64(S)))
		q := make([]float32, B*T*Hq*d)
		fillNormal(rng, q)
		qIndptr, kvLen, qPos := make([]int32, B+1), make([]int32, B), make([]int32, B)
		for s := 0; s < B; s++ {
			qIndptr[s+1] = int32((s + 1) * T)
			kvLen[s], qPos[s] = int32(S), int32(S-T)
		}
		batch := func(i int, out []float32, baseline bool) gokv.PagedAttend {
			return gokv.PagedAttend{QIndptr: qIndptr, PageIndptr: lays[i].pageIndptr,
				PageIDs: lays[i].pageIDs, KVLen: kvLen, QPos: qPos, ResidualSlot: lays[i].residualSlot, HeadsQ: Hq,
				Q: q, Out: out, Scale: float32(1 / math.Sqrt(float64(d))), Baseline: baseline}
		}
		ref := make([]float32, B*T*Hq*d)
		if err := pools[0].Attend(batch(0, ref, false)); err != nil {
			return nil, fmt.Errorf("f32 reference at context %d: %w", S, err)
		}
		// Causal rows: row j (0-based) of T sees S-T+j+1 tokens.
		visible := float64(T)*float64(S-T) + float64(T)*float64(T+1)/2
		flops := 2 * float64(Hq) * visible * float64(2*d) * float64(B)
		for fi, f := range formats {
			i := fi + 1
			evs := o.parsedEvictions
			if prefill || len(evs) == 0 {
				evs = []evalEviction{{name: "full"}}
			}
			for _, ev := range evs {
				pol, err := benchPolicyFor(ev, lays[i], pools[i], f, S, B, H, o.seed)
				if err != nil {
					return nil, err
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
					return nil, fmt.Errorf("format %s, eviction %s at context %d: %w", f, ev.name, S, err)
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
					CosVsF32: cosine(out, ref), BytesRead: bytes}
				if info.Caps.Baseline && pol.apply == nil {
					// The baseline materializes f32 K/V for every call: give it a smaller budget and fewer runs.
					baseOut := make([]float32, len(out))
					baseline := func() error { return pools[i].Attend(attend(baseOut, true)) }
					// One call first, untimed: the first call at a new largest context grows the device's f32
					// copy (page faults of up to gigabytes), and timeIt would count a warm-up that long as a run.
					var btm timing
					err := baseline()
					if err == nil {
						btm, err = timeIt(o.minTime/2, 1, 10, baseline)
					}
					switch {
					case errors.Is(err, gokv.ErrOutOfMemory):
						// The baseline's f32 copy of K/V can outgrow a GPU's storage buffers where the fused
						// path still fits: the row says so (null baseline) instead of failing the run.
						logger.Warn().Err(err).Str("format", f.String()).Int("context", S).
							Msg("baseline does not fit this device; baseline_ms is null")
					case err != nil:
						return nil, fmt.Errorf("baseline %s at context %d: %w", f, S, err)
					default:
						bms, speedup := btm.median, btm.median/ms
						row.BaselineMs, row.SpeedupVsBaseline = &bms, &speedup
					}
				}
				if prefill {
					rows = append(rows, prefillRow{benchRow: row, Mode: "prefill", PrefillTokens: T})
				} else {
					rows = append(rows, row)
				}
				tick()
			}
		}
	}
	return rows, nil
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
