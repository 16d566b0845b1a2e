package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/gokv/gokv/gokv"
	"github.com/gokv/gokv/internal/llama"
)

type evalOpts struct {
	models, text, formats, evictions, backend, plot, score string
	context, prefill, sequences, greedyTokens              int
	threads                                                int
	json, quiet                                            bool
}

func newEvalCmd(g *globalOpts) *cobra.Command {
	o := &evalOpts{}
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Quality and speed of each KV format on a real byte-level Llama model and held-out text",
		Long: `eval runs a byte-level Llama model (a directory with config.json and model.safetensors; ids 0-255
are bytes, bos_token_id starts every sequence) over held-out text, with every attention through a gokv
cache in each format and eviction policy, and compares it with the f32 full-cache run.

Text: --sequences K sequences of --context N tokens each. Sequence i is BOS followed by bytes
[i(N-1), (i+1)(N-1)) of --text: the file's first K consecutive chunks of N-1 bytes, so the file needs at
least K(N-1) bytes. Each sequence's first --prefill P tokens go in one prefill step (with attention, and
its logits scored too), the rest one token a step, teacher-forced; the K sequences share every step.
Every byte is scored: K(N-1) positions per run; --score decode scores only the positions the decode steps
predict (K(N-1-P)), where the eviction policies differ (a prefill attends to its whole prompt).

Columns, per (model, format, eviction):
  bits/byte    mean -log2 p(next byte) over the scored positions
  top1         fraction of positions whose argmax equals the f32 full-cache run's
  KL mean/p99  KL(f32 full || this) per position in nats: mean and 99th percentile (nearest rank)
  greedy       greedy continuation of BOS + the text's first 64 bytes: the number of generated tokens
               equal to the f32 full-cache continuation's, counted up to the first mismatch, out of
               --greedy-tokens (bytes only: BOS is never chosen)
  KV bytes     Cache.Stats().BytesUsed after the last decode step: all K sequences, every layer
  KV read/seq  the K/V bytes a decode step reads per sequence at the end: the tokens each layer's kv heads
               still see (Sequence.VisibleTokens) times the format's bytes per token (page bytes / P)
  ms/token     decode steps' wall time per decoded token (K tokens a step): the whole model
  attn ms/tok  of which inside Step.Layer (storing K/V and attention, all layers)

The f32 full-cache run is always made first, as the reference; it gets a row when f32 and none are
listed. --context defaults to the model's max_position_embeddings; a longer context is refused unless
every --eviction is a sinkwindow whose sinks plus window fit in it (a warning says that positions then
pass the trained range: RoPE scores depend on the distance between tokens, which the window bounds, but
the sink tokens are seen from further away than in training).

Evictions: none; sinkwindow:S:W (keep the first S and the last W positions, StreamingLLM);
h2o:BUDGET:RECENT (H2O: per layer and kv head, the sinks, the RECENT newest tokens and the heavy hitters
by accumulated attention mass, BUDGET tokens in all); snapkv:BUDGET:WINDOW (SnapKV: at the end of the
prefill, keep per layer and kv head the sinks, the prompt's WINDOW newest tokens and its top tokens by the
window's pooled attention, BUDGET tokens of the prompt in all); quest:PAGES[:RECENT] (Quest: every token
is kept, and each decode step reads per layer and kv head only the PAGES pages with the highest key
bound, plus the pages of the sink tokens and of the RECENT newest tokens, 1 when left out: the page the
step decodes in). BUDGET is a token count or a fraction of --context, e.g. h2o:1/8:32. Under Quest, KV
read/seq is the pages each kv head read in the last decode step times a page's bytes per kv head, plus
the key bounds of every page (the step scores them all); KV bytes include the bounds.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.quiet = g.quiet
			return runEval(cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.models, "model", "", "model directory (config.json + model.safetensors); several, comma-separated")
	f.StringVar(&o.text, "text", "", "held-out text file (bytes)")
	f.StringVar(&o.formats, "formats", "f32,f16,q8,q4:32,kivi4,kivi2", "KV formats, comma-separated")
	f.StringVar(&o.evictions, "eviction", "none", "eviction policies, comma-separated: none, sinkwindow:S:W, h2o:BUDGET:RECENT, snapkv:BUDGET:WINDOW, quest:PAGES[:RECENT] (BUDGET: tokens or a fraction of --context, e.g. 1/8)")
	f.StringVar(&o.score, "score", "all", "positions scored: all, or decode (only those the decode steps predict)")
	f.IntVar(&o.context, "context", 0, "tokens per sequence, BOS included (0: the model's max_position_embeddings)")
	f.IntVar(&o.prefill, "prefill", 64, "tokens of each sequence prefilled in one step, in [1, context-1]")
	f.IntVar(&o.sequences, "sequences", 4, "sequences, decoded as one batch")
	f.IntVar(&o.greedyTokens, "greedy-tokens", 64, "tokens of the greedy continuation compared with f32's (0: none)")
	f.StringVar(&o.backend, "backend", "auto", "backend: cpu, vulkan, metal, sycl or auto")
	f.IntVar(&o.threads, "threads", 0, "CPU worker threads (0: all online CPUs)")
	f.BoolVar(&o.json, "json", false, "one JSON object per row")
	f.StringVar(&o.plot, "plot", "", "PNG plot of bits per byte against position, one line per run")
	return cmd
}

// evalGreedyPrompt is how many bytes of the text follow BOS in the greedy continuation's prompt.
const evalGreedyPrompt = 64

// evalMaxBaselineBytes bounds the reference run's kept log-probabilities (K·(N-1)·vocab float32).
const evalMaxBaselineBytes = 4 << 30

// evalRow is one (model, format, eviction) result.
type evalRow struct {
	Model          string  `json:"model"`
	Format         string  `json:"format"`
	Eviction       string  `json:"eviction"`
	Backend        string  `json:"backend"`
	Context        int     `json:"context"`
	Sequences      int     `json:"sequences"`
	Prefill        int     `json:"prefill"`
	Tokens         int     `json:"tokens"` // scored positions
	BitsPerByte    float64 `json:"bits_per_byte"`
	Top1Agree      float64 `json:"top1_agree"`
	KLMean         float64 `json:"kl_mean"`
	KLP99          float64 `json:"kl_p99"`
	GreedyMatch    int     `json:"greedy_match"`
	GreedyTokens   int     `json:"greedy_tokens"`
	KVBytes        uint64  `json:"kv_bytes"`
	KVReadBytes    uint64  `json:"kv_read_bytes"`         // per sequence, what a decode step reads at the end
	Budget         int     `json:"budget,omitempty"`      // h2o and snapkv: the budget in tokens
	QuestPages     int     `json:"quest_pages,omitempty"` // quest: pages read by bound per layer and kv head
	Score          string  `json:"score"`                 // "all" or "decode"
	MsPerToken     float64 `json:"ms_per_token"`
	AttnMsPerToken float64 `json:"attn_ms_per_token"`

	curve []float64 // bits at each predicted position 1..N-1, mean over the sequences (the plot)
	// decodeMs and attnMs are each decode step's wall time, whole model and inside Step.Layer, in ms per
	// decoded token (the step's time over the K sequences it decodes): the spread the means hide.
	decodeMs, attnMs []float64
	greedy           []int // the greedy continuation's tokens
}

// evalEviction is one --eviction entry.
type evalEviction struct {
	name string
	sw   *gokv.SinkWindow // sinkwindow:S:W
	// h2o and snapkv: the budget, num/den of the context (den 0: num tokens), and RECENT or WINDOW
	kind     string
	num, den int
	second   int
}

// policy returns the entry's eviction policy for sequences of context tokens (nil: keep everything) and
// its budget in tokens (0 for none and sinkwindow).
func (ev evalEviction) policy(context int) (gokv.EvictionPolicy, int) {
	b := ev.num
	if ev.den > 0 {
		b = context * ev.num / ev.den
	}
	switch ev.kind {
	case "h2o":
		return &gokv.H2O{Budget: b, Recent: ev.second}, b
	case "snapkv":
		return &gokv.SnapKV{Budget: b, Window: ev.second}, b
	case "quest":
		return &gokv.Quest{Pages: ev.num, Recent: ev.second}, 0
	}
	if ev.sw != nil {
		return ev.sw, 0
	}
	return nil, 0
}

// evicts reports whether the entry is a policy (not none).
func (ev evalEviction) evicts() bool { return ev.sw != nil || ev.kind != "" }

// parseEvictions parses "none", "sinkwindow:S:W", "h2o:BUDGET:RECENT", "snapkv:BUDGET:WINDOW" and
// "quest:PAGES[:RECENT]" entries, comma-separated.
func parseEvictions(list string) ([]evalEviction, error) {
	var out []evalEviction
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		ev, err := parseEviction(s)
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--eviction: no policy in %q", list)
	}
	return out, nil
}

func parseEviction(s string) (evalEviction, error) {
	if strings.EqualFold(s, "none") || strings.EqualFold(s, "full") {
		return evalEviction{name: strings.ToLower(s)}, nil
	}
	parts := strings.Split(s, ":")
	kind := strings.ToLower(parts[0])
	if kind == "quest" {
		return parseQuest(s, parts)
	}
	if len(parts) != 3 || (kind != "sinkwindow" && kind != "h2o" && kind != "snapkv") {
		return evalEviction{}, fmt.Errorf("--eviction %q: want none, sinkwindow:S:W, h2o:BUDGET:RECENT, snapkv:BUDGET:WINDOW or quest:PAGES[:RECENT]", s)
	}
	if kind == "h2o" || kind == "snapkv" {
		num, den, err := parseBudget(parts[1])
		second, err2 := strconv.Atoi(parts[2])
		what := "RECENT must be >= 0"
		if kind == "snapkv" {
			what = "WINDOW must be >= 1"
		}
		switch {
		case err != nil:
			return evalEviction{}, fmt.Errorf("--eviction %q: BUDGET %q: %v", s, parts[1], err)
		case err2 != nil || second < 0 || (kind == "snapkv" && second < 1) || second > math.MaxInt32:
			return evalEviction{}, fmt.Errorf("--eviction %q: %s (an integer)", s, what)
		}
		return evalEviction{name: fmt.Sprintf("%s:%s:%d", kind, parts[1], second), kind: kind, num: num, den: den, second: second}, nil
	}
	sinks, err1 := strconv.Atoi(parts[1])
	window, err2 := strconv.Atoi(parts[2])
	if err1 != nil || err2 != nil || sinks < 0 || window < 1 || sinks > math.MaxInt32 || window > math.MaxInt32 {
		return evalEviction{}, fmt.Errorf("--eviction %q: sinks S must be >= 0 and window W >= 1 (integers)", s)
	}
	return evalEviction{name: fmt.Sprintf("sinkwindow:%d:%d", sinks, window), sw: &gokv.SinkWindow{Sinks: sinks, Window: window}}, nil
}

// questDefaultRecent is quest's RECENT when left out: the page of the newest token is always read.
const questDefaultRecent = 1

// parseQuest parses "quest:PAGES[:RECENT]".
func parseQuest(s string, parts []string) (evalEviction, error) {
	if len(parts) < 2 || len(parts) > 3 {
		return evalEviction{}, fmt.Errorf("--eviction %q: want quest:PAGES[:RECENT]", s)
	}
	pages, err := strconv.Atoi(parts[1])
	if err != nil || pages < 1 || pages > math.MaxInt32 {
		return evalEviction{}, fmt.Errorf("--eviction %q: PAGES must be an integer >= 1 (pages read by bound per layer and kv head)", s)
	}
	recent := questDefaultRecent
	if len(parts) == 3 {
		if recent, err = strconv.Atoi(parts[2]); err != nil || recent < 0 || recent > math.MaxInt32 {
			return evalEviction{}, fmt.Errorf("--eviction %q: RECENT must be an integer >= 0 (the newest tokens whose pages are always read)", s)
		}
	}
	return evalEviction{name: fmt.Sprintf("quest:%d:%d", pages, recent), kind: "quest", num: pages, second: recent}, nil
}

// parseBudget parses a token count ("64": num 64, den 0) or a fraction of the context ("1/8").
func parseBudget(s string) (num, den int, err error) {
	a, b, frac := strings.Cut(s, "/")
	num, err = strconv.Atoi(a)
	if err == nil && frac {
		den, err = strconv.Atoi(b)
	}
	switch {
	case err != nil:
		return 0, 0, errors.New("want a token count or a fraction of --context such as 1/8")
	case num < 1 || num > 1<<24 || den > 1<<24 || (frac && (den < 1 || num > den)):
		return 0, 0, errors.New("want a count >= 1 or a fraction in (0, 1]")
	}
	return num, den, nil
}

// checkPositions applies the context rule of eval and generate: n positions fit the model's trained
// context, or every eviction keeps sinks + window inside it (then it returns a warning to log).
func checkPositions(flag string, n, maxPos int, evs []evalEviction) (warning string, err error) {
	if n <= maxPos {
		return "", nil
	}
	for _, ev := range evs {
		if ev.sw == nil || ev.sw.Sinks+ev.sw.Window > maxPos {
			return "", fmt.Errorf("%s: %d positions pass the model's max_position_embeddings %d; allowed only when every --eviction is a sinkwindow:S:W with S + W <= %d (%s is not)",
				flag, n, maxPos, maxPos, ev.name)
		}
	}
	return fmt.Sprintf("%d positions pass the trained %d: the window keeps token distances within it, but the sink tokens are seen from further than in training", n, maxPos), nil
}

// loadByteModel loads a model directory for eval and generate, which feed bytes as ids 0-255.
func loadByteModel(dir string) (*llama.Model, error) {
	if dir == "" {
		return nil, errors.New("--model is required: a directory with config.json and model.safetensors")
	}
	m, err := llama.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("--model %s: %w", dir, err)
	}
	if c := m.Config; c.VocabSize < 256 || c.BOS < 256 {
		return nil, fmt.Errorf("--model %s: vocab_size %d with bos_token_id %d is not a byte vocabulary (ids 0-255 bytes, BOS above them)",
			dir, c.VocabSize, c.BOS)
	}
	return m, nil
}

// openModelCache makes a cache in format f under eviction ev (nil: none) for maxSeqs sequences of up to
// seqTokens tokens, each step appending up to stepTokens tokens to one sequence.
func openModelCache(eng *gokv.Engine, m *llama.Model, f gokv.Format, ev gokv.EvictionPolicy, maxSeqs, seqTokens, stepTokens int) (*gokv.Cache, error) {
	page := pageSizeFor(f)
	perSeq := (seqTokens + page - 1) / page * page
	return m.NewCache(eng, gokv.CacheOptions{Format: f, Eviction: ev, PageSize: page, MaxSequences: maxSeqs,
		MaxTokens: maxSeqs*perSeq + page, MaxStepTokens: max(stepTokens*maxSeqs, gokv.DefaultMaxStepTokens)})
}

// evalRun is what one (format, eviction) run keeps beyond its row: the reference run's log-probs and
// argmaxes, and the greedy continuation.
type evalRun struct {
	row     evalRow
	logp    [][]float32 // reference only: [sequence][(N-1)·V] log-probabilities
	argmax  [][]int     // [sequence][N-1]
	kl      []float64
	greedy  []int
	attnDur time.Duration
	stepDur time.Duration
	decoded int
	// decodeMs and attnMs: per decode step, ms per decoded token (evalRow's fields of the same names)
	decodeMs, attnMs []float64
}

func runEval(stdout, stderr io.Writer, o *evalOpts) error {
	if o.plot != "" {
		if err := checkOutputPath("--plot", o.plot); err != nil {
			return err
		}
	}
	formats, err := parseFormats(o.formats)
	if err != nil {
		return fmt.Errorf("--formats: %w", err)
	}
	evictions, err := parseEvictions(o.evictions)
	if err != nil {
		return err
	}
	switch {
	case o.sequences < 1 || o.sequences > 1024:
		return fmt.Errorf("--sequences %d must be in [1, 1024]", o.sequences)
	case o.greedyTokens < 0 || o.greedyTokens > 1<<16:
		return fmt.Errorf("--greedy-tokens %d must be in [0, 65536]", o.greedyTokens)
	case o.context < 0 || o.context > 1<<24:
		return fmt.Errorf("--context %d must be in [2, 16777216], or 0 for the model's max_position_embeddings", o.context)
	case o.text == "":
		return errors.New("--text is required: a held-out text file")
	case o.score != "all" && o.score != "decode":
		return fmt.Errorf("--score %q: want all or decode", o.score)
	}
	var models []*llama.Model
	for _, dir := range strings.Split(o.models, ",") {
		if dir = strings.TrimSpace(dir); dir == "" {
			continue
		}
		m, err := loadByteModel(dir)
		if err != nil {
			return err
		}
		models = append(models, m)
	}
	if len(models) == 0 {
		_, err := loadByteModel("")
		return err
	}
	var plans []*evalPlan
	need := int64(0)
	for _, m := range models {
		plan, err := newEvalPlan(o, m, formats, evictions)
		if err != nil {
			return err
		}
		plans = append(plans, plan)
		need = max(need, plan.textBytes())
	}
	// Only the bytes the sequences use are read: --text may be a whole corpus.
	text, err := readPrefix(o.text, need)
	if err != nil {
		return fmt.Errorf("--text: %w", err)
	}
	for _, plan := range plans {
		if err := plan.setText(o.text, text); err != nil {
			return err
		}
	}
	eng, info, err := openEngine(o.backend, o.threads)
	if err != nil {
		return err
	}
	defer eng.Close()

	var rows []evalRow
	for _, plan := range plans {
		bar := newProgress(stderr, o.quiet, plan.work(), "eval "+plan.m.Name)
		_, got, err := plan.run(eng, info.Backend, bar)
		bar.Finish()
		if err != nil {
			return err
		}
		rows = append(rows, got...)
	}
	if o.plot != "" {
		if err := writeEvalPlot(o.plot, rows); err != nil {
			return err
		}
	}
	if o.json {
		for _, r := range rows {
			if err := writeJSON(stdout, r); err != nil {
				return err
			}
		}
		return nil
	}
	printEval(stdout, o, rows)
	if o.plot != "" {
		fmt.Fprintf(stdout, "plot: %s\n", o.plot)
	}
	return nil
}

// readPrefix returns the first n bytes of a file, or all of it when it is shorter.
func readPrefix(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}

// evalPlan is one model's eval: its sequences, the runs to make, and the reference.
type evalPlan struct {
	m         *llama.Model
	n, p, k   int
	seqs      [][]int // [K][N] token ids
	prompt    []int   // the greedy prompt
	greedy    int
	decode    bool // score only the positions the decode steps predict
	formats   []gokv.Format
	evictions []evalEviction
}

func newEvalPlan(o *evalOpts, m *llama.Model, formats []gokv.Format, evictions []evalEviction) (*evalPlan, error) {
	c := m.Config
	n := o.context
	if n == 0 {
		n = c.MaxPositions
	}
	if n < 2 {
		return nil, fmt.Errorf("--context %d must be >= 2 (BOS and one byte to score)", n)
	}
	warn, err := checkPositions("--context", n, c.MaxPositions, evictions)
	if err != nil {
		return nil, fmt.Errorf("--model %s: %w", m.Dir, err)
	}
	if warn != "" {
		logger.Warn().Str("model", m.Name).Msg(warn)
	}
	if o.prefill < 1 || o.prefill > n-1 {
		return nil, fmt.Errorf("--prefill %d must be in [1, %d] (--context %d minus 1: the last token is only predicted)", o.prefill, n-1, n)
	}
	k := o.sequences
	if b := int64(k) * int64(n-1) * int64(c.VocabSize) * 4; b > evalMaxBaselineBytes {
		return nil, fmt.Errorf("--sequences %d x --context %d keep %s of reference log-probabilities, more than %s: lower one of them",
			k, n, formatSize(b), formatSize(evalMaxBaselineBytes))
	}
	if o.greedyTokens > 0 {
		// The continuation's last token is chosen, never fed: BOS + the prompt bytes + all but one.
		if _, err := checkPositions("--greedy-tokens", evalGreedyPrompt+o.greedyTokens, c.MaxPositions, evictions); err != nil {
			return nil, fmt.Errorf("--model %s: %w", m.Dir, err)
		}
	}
	return &evalPlan{m: m, n: n, p: o.prefill, k: k, greedy: o.greedyTokens, decode: o.score == "decode", formats: formats,
		evictions: evictions}, nil
}

// textBytes is how many bytes of --text the plan reads.
func (p *evalPlan) textBytes() int64 {
	need := int64(p.k) * int64(p.n-1)
	if p.greedy > 0 {
		need = max(need, evalGreedyPrompt)
	}
	return need
}

// setText cuts the plan's sequences and greedy prompt out of the text (the first textBytes of --text).
func (p *evalPlan) setText(path string, text []byte) error {
	if int64(len(text)) < int64(p.k)*int64(p.n-1) {
		return fmt.Errorf("--text %s has %d bytes, fewer than --sequences %d x (--context %d - 1) = %d", path, len(text), p.k, p.n,
			int64(p.k)*int64(p.n-1))
	}
	if p.greedy > 0 && len(text) < evalGreedyPrompt {
		return fmt.Errorf("--text %s has %d bytes, fewer than the greedy prompt's %d", path, len(text), evalGreedyPrompt)
	}
	bos := p.m.Config.BOS
	for s := 0; s < p.k; s++ {
		ids := make([]int, p.n)
		ids[0] = bos
		for i, b := range text[s*(p.n-1) : (s+1)*(p.n-1)] {
			ids[i+1] = int(b)
		}
		p.seqs = append(p.seqs, ids)
	}
	p.prompt = []int{bos}
	for _, b := range text[:min(evalGreedyPrompt, len(text))] {
		p.prompt = append(p.prompt, int(b))
	}
	return nil
}

// work is the progress bar's total: steps of every run, the reference included.
func (p *evalPlan) work() int {
	return (len(p.formats)*len(p.evictions) + 1) * p.stepsPerRun()
}

func (p *evalPlan) stepsPerRun() int {
	steps := 1 + (p.n - 1 - p.p) // prefill, then decode positions P..N-2
	if p.greedy > 0 {
		steps += p.greedy
	}
	return steps
}

// run makes the f32 full-cache reference run, then one run per (format, eviction). It returns the
// reference's row (which gokv demo prints beside its formats) and the rows asked for; an f32 row with no
// eviction is the reference's.
func (p *evalPlan) run(eng *gokv.Engine, backend string, bar *progressbar.ProgressBar) (evalRow, []evalRow, error) {
	f32 := gokv.Format{Kind: gokv.F32}
	ref, err := p.runOne(eng, f32, evalEviction{name: "none"}, nil, bar)
	if err != nil {
		return evalRow{}, nil, fmt.Errorf("%s f32 reference: %w", p.m.Name, err)
	}
	ref.row.Backend = backend
	var rows []evalRow
	for _, f := range p.formats {
		for _, ev := range p.evictions {
			r := ref
			if f != f32 || ev.evicts() {
				if r, err = p.runOne(eng, f, ev, ref, bar); err != nil {
					return evalRow{}, nil, fmt.Errorf("%s %s %s: %w", p.m.Name, f, ev.name, err)
				}
			} else {
				bar.Add(p.stepsPerRun()) // the reference itself
			}
			r.row.Backend = backend
			rows = append(rows, r.row)
		}
	}
	return ref.row, rows, nil
}

// runOne scores the plan's sequences and makes the greedy continuation in one format and eviction; ref
// is the f32 full-cache run to compare with (nil when this is it).
func (p *evalPlan) runOne(eng *gokv.Engine, f gokv.Format, ev evalEviction, ref *evalRun, bar *progressbar.ProgressBar) (*evalRun, error) {
	m, V := p.m, p.m.Config.VocabSize
	greedyLen := len(p.prompt) + p.greedy
	policy, budget := ev.policy(p.n)
	cache, err := openModelCache(eng, m, f, policy, p.k, max(p.n, greedyLen), max(p.p, len(p.prompt)))
	if err != nil {
		return nil, err
	}
	defer cache.Close()
	run := &evalRun{argmax: make([][]int, p.k)}
	if ref == nil {
		run.logp = make([][]float32, p.k)
		for s := range run.logp {
			run.logp[s] = make([]float32, (p.n-1)*V)
		}
	}
	bits := make([]float64, p.n-1) // summed over sequences, per predicted position
	lp := make([]float32, V)
	score := func(s, pos int, logits []float32) {
		if p.decode && pos < p.p {
			return // predicted by the prefill
		}
		logSoftmax(lp, logits)
		next := p.seqs[s][pos+1]
		bits[pos] -= float64(lp[next]) / math.Ln2
		am := argmax(lp)
		run.argmax[s] = append(run.argmax[s], am)
		if ref == nil {
			copy(run.logp[s][pos*V:(pos+1)*V], lp)
			return
		}
		run.kl = append(run.kl, klDivergence(ref.logp[s][pos*V:(pos+1)*V], lp))
	}

	r := m.NewRunner(cache)
	entries := make([]llama.Entry, p.k)
	for s := range entries {
		seq, err := cache.NewSequence()
		if err != nil {
			return nil, err
		}
		entries[s] = llama.Entry{Seq: seq, Tokens: p.seqs[s][:p.p], AllLogits: true}
	}
	out, err := r.Step(entries...)
	if err != nil {
		return nil, fmt.Errorf("prefill: %w", err)
	}
	for s := range entries {
		for pos := 0; pos < p.p; pos++ {
			score(s, pos, out.Logits[s][pos*V:(pos+1)*V])
		}
	}
	bar.Add(1)
	for pos := p.p; pos < p.n-1; pos++ {
		for s := range entries {
			entries[s] = llama.Entry{Seq: entries[s].Seq, Tokens: p.seqs[s][pos : pos+1]}
		}
		out, err := r.Step(entries...)
		if err != nil {
			return nil, fmt.Errorf("decode at position %d: %w", pos, err)
		}
		for s := range entries {
			score(s, pos, out.Logits[s])
		}
		run.stepDur += out.Timing.Total
		run.attnDur += out.Timing.Attention
		run.decoded += p.k
		run.decodeMs = append(run.decodeMs, out.Timing.Total.Seconds()*1e3/float64(p.k))
		run.attnMs = append(run.attnMs, out.Timing.Attention.Seconds()*1e3/float64(p.k))
		bar.Add(1)
	}
	kvBytes := cache.Stats().BytesUsed
	kvRead, err := decodeReadBytes(m, f, entries)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if err := e.Seq.Release(); err != nil {
			return nil, err
		}
	}
	if p.greedy > 0 {
		if run.greedy, err = greedyContinuation(r, cache, p.prompt, p.greedy, func() { bar.Add(1) }); err != nil {
			return nil, fmt.Errorf("greedy continuation: %w", err)
		}
	}

	scored, scoreName := p.k*(p.n-1), "all"
	if p.decode {
		scored, scoreName = p.k*(p.n-1-p.p), "decode"
	}
	row := evalRow{Model: m.Name, Format: f.String(), Eviction: ev.name, Context: p.n, Sequences: p.k, Prefill: p.p,
		Tokens: scored, GreedyTokens: p.greedy, KVBytes: kvBytes, KVReadBytes: kvRead, Budget: budget, Score: scoreName,
		QuestPages: questPages(policy),
		curve:      make([]float64, p.n-1),
		decodeMs:   run.decodeMs, attnMs: run.attnMs, greedy: run.greedy}
	total := 0.0
	for pos, b := range bits {
		total += b
		row.curve[pos] = b / float64(p.k)
	}
	row.BitsPerByte = total / float64(max(scored, 1))
	if run.decoded > 0 {
		row.MsPerToken = run.stepDur.Seconds() * 1e3 / float64(run.decoded)
		row.AttnMsPerToken = run.attnDur.Seconds() * 1e3 / float64(run.decoded)
	}
	if ref == nil {
		ref = run // KL 0, top1 1 and every greedy token: the reference against itself
	} else {
		sum := 0.0
		for _, x := range run.kl {
			sum += x
		}
		row.KLMean = sum / float64(max(len(run.kl), 1))
		row.KLP99 = percentile(run.kl, 0.99)
	}
	agree := 0
	for s := range run.argmax {
		for i, a := range run.argmax[s] {
			if a == ref.argmax[s][i] {
				agree++
			}
		}
	}
	row.Top1Agree = float64(agree) / float64(max(scored, 1))
	for i := range run.greedy {
		if run.greedy[i] != ref.greedy[i] {
			break
		}
		row.GreedyMatch++
	}
	run.row = row
	return run, nil
}

// questPages is a Quest policy's Pages, else 0.
func questPages(p gokv.EvictionPolicy) int {
	if q, ok := p.(*gokv.Quest); ok {
		return q.Pages
	}
	return 0
}

// decodeReadBytes is what a decode step reads per sequence at the end of a run, averaged over the
// entries' sequences: over every layer and kv head, the tokens it still sees times the format's bytes per
// token and kv head (a page's bytes over its tokens and kv heads, scales and alignment included). In a
// layer under Quest: the pages each kv head read in the last decode step times a page's bytes per kv
// head, plus the key bounds of every page of the sequence.
func decodeReadBytes(m *llama.Model, f gokv.Format, entries []llama.Entry) (uint64, error) {
	spec := m.Spec()
	page := pageSizeFor(f)
	total := 0.0
	for _, e := range entries {
		for l, ls := range spec.Layers {
			lay, err := f.Layout(ls.HeadsKV, ls.HeadDimK, ls.HeadDimV, page, ls.VIsKPrefix())
			if err != nil {
				return 0, err
			}
			read, err := e.Seq.QuestPagesRead(l)
			if err != nil {
				return 0, err
			}
			if read != nil {
				for _, n := range read {
					total += float64(n) * float64(lay.PageBytes) / float64(ls.HeadsKV)
				}
				total += float64((e.Seq.Len()+page-1)/page) * float64(lay.PageBoundsBytes)
				continue
			}
			vis, err := e.Seq.VisibleTokens(l)
			if err != nil {
				return 0, err
			}
			for _, n := range vis {
				total += float64(n) * float64(lay.PageBytes) / float64(page*ls.HeadsKV)
			}
		}
	}
	return uint64(total/float64(max(len(entries), 1)) + 0.5), nil
}

// greedyContinuation prefills prompt in a new sequence of cache and returns n greedily chosen byte
// tokens; the sequence is released after. tick is called once per generated token.
func greedyContinuation(r *llama.Runner, cache *gokv.Cache, prompt []int, n int, tick func()) ([]int, error) {
	seq, err := cache.NewSequence()
	if err != nil {
		return nil, err
	}
	defer seq.Release()
	var toks []int
	in := prompt
	for len(toks) < n {
		out, err := r.Step(llama.Entry{Seq: seq, Tokens: in})
		if err != nil {
			return nil, err
		}
		next := argmax(out.Logits[0][:256])
		toks = append(toks, next)
		in = []int{next}
		tick()
	}
	return toks, nil
}

// logSoftmax writes log softmax(logits) into dst, in float64 internally.
func logSoftmax(dst, logits []float32) {
	mx := math.Inf(-1)
	for _, z := range logits {
		mx = max(mx, float64(z))
	}
	sum := 0.0
	for _, z := range logits {
		sum += math.Exp(float64(z) - mx)
	}
	lse := mx + math.Log(sum)
	for i, z := range logits {
		dst[i] = float32(float64(z) - lse)
	}
}

// argmax returns the index of the largest value (the first of ties).
func argmax(xs []float32) int {
	best := 0
	for i, x := range xs {
		if x > xs[best] {
			best = i
		}
	}
	return best
}

// klDivergence returns KL(p || q) in nats from log-probabilities, Σ p (log p - log q); never negative
// (float rounding of near-equal distributions is clamped to 0).
func klDivergence(logp, logq []float32) float64 {
	kl := 0.0
	for i, lp := range logp {
		kl += math.Exp(float64(lp)) * (float64(lp) - float64(logq[i]))
	}
	return max(kl, 0)
}

func printEval(w io.Writer, o *evalOpts, rows []evalRow) {
	if len(rows) == 0 {
		return
	}
	r0 := rows[0]
	fmt.Fprintf(w, "gokv eval: %d sequences x %d tokens (BOS + %d bytes of %s each), prefill %d, then decode; %s backend\n\n",
		r0.Sequences, r0.Context, r0.Context-1, o.text, r0.Prefill, r0.Backend)
	fmt.Fprintf(w, "%-12s %-14s %-18s %9s %7s %9s %9s %8s %10s %11s %9s %11s\n", "model", "format", "eviction", "bits/byte",
		"top1", "KL mean", "KL p99", "greedy", "KV bytes", "KV read/seq", "ms/token", "attn ms/tok")
	for _, r := range rows {
		fmt.Fprintf(w, "%-12s %-14s %-18s %9.4f %7.4f %9.2e %9.2e %8s %10s %11s %9.3f %11.3f\n", r.Model, r.Format, r.Eviction,
			r.BitsPerByte, r.Top1Agree, r.KLMean, r.KLP99, fmt.Sprintf("%d/%d", r.GreedyMatch, r.GreedyTokens),
			formatSize(int64(r.KVBytes)), formatSize(int64(r.KVReadBytes)), r.MsPerToken, r.AttnMsPerToken)
	}
	fmt.Fprintf(w, "\ntop1, KL (nats) and greedy are against the f32 full-cache run; greedy counts matching tokens up to the first mismatch.\n")
	if r0.Score == "decode" {
		fmt.Fprintf(w, "bits/byte, top1 and KL over the %d positions the decode steps predict.\n", r0.Tokens)
	}
	fmt.Fprintf(w, "KV bytes: Cache.Stats().BytesUsed with all %d sequences at the end; KV read/seq: the K/V a decode step reads per sequence then\n", r0.Sequences)
	fmt.Fprintf(w, "(visible tokens of every layer and kv head x bytes per token). ms/token: decode steps per decoded token, whole model;\n")
	fmt.Fprintf(w, "attn ms/tok: the part inside Step.Layer (K/V store + attention).\n")
}
