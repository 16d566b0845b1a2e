package main

// gokv turns: a multi-turn chat on a real byte-level model, cold against reusing the conversation's
// cached prefix (Cache.NewSequenceFrom), with the outputs of both held to each other.

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gokv/gokv/gokv"
	"github.com/gokv/gokv/internal/llama"
)

type turnsOpts struct {
	models, text, formats, backend string
	turns, context, generate       int
	growth                         float64
	threads                        int
	restart                        bool
	json, quiet                    bool
}

func newTurnsCmd(g *globalOpts) *cobra.Command {
	o := &turnsOpts{}
	cmd := &cobra.Command{
		Use:   "turns",
		Short: "A multi-turn chat on a real model: cold prefill against prefix reuse, per turn",
		Long: `turns runs a conversation on a byte-level Llama model (eval's models and text) and times each turn
twice, in caches of each format:

  cold     every turn starts a new sequence and prefills its whole prompt, as an engine without prefix
           reuse does
  reuse    every turn starts with Cache.NewSequenceFrom(prompt): the pages the previous turn left cached
           (and, for KIVI, its residual ring) give the prompt's longest cached prefix, and only the rest
           is prefilled
  restart  (--restart) like reuse, but after each turn the conversation's sequence is saved
           (Cache.Save), and the next turn runs in a new engine and cache that load the file first

Turn 1's prompt is BOS and the first --context - 1 bytes of --text; each turn greedily generates
--generate bytes, and the next prompt is the whole conversation so far plus the text's next bytes,
--growth of its length. A turn's time is its prefill plus its decode steps. Per turn: the tokens the
reuse run took from the cache, both times and their ratio, and whether its greedy bytes equal the cold
run's (and the largest difference of the last prompt row's logits).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.quiet = g.quiet
			return runTurns(cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.models, "model", demoRealModelDir, "model directory; several, comma-separated")
	f.StringVar(&o.text, "text", demoRealTextFile, "text file (bytes) the conversation is cut from")
	f.StringVar(&o.formats, "formats", "f16,q4:32,kivi2", "KV formats, comma-separated")
	f.IntVar(&o.turns, "turns", 3, "turns of the conversation, >= 2")
	f.IntVar(&o.context, "context", 2048, "turn 1's prompt in tokens, BOS included")
	f.Float64Var(&o.growth, "growth", 0.10, "each later prompt adds this fraction of the conversation's length in new text")
	f.IntVar(&o.generate, "generate", 16, "bytes generated greedily per turn")
	f.BoolVar(&o.restart, "restart", false, "also run the conversation saving and loading the cache between turns")
	f.StringVar(&o.backend, "backend", "auto", "backend: cpu, vulkan, metal, sycl or auto")
	f.IntVar(&o.threads, "threads", 0, "CPU worker threads (0: all online CPUs)")
	f.BoolVar(&o.json, "json", false, "one JSON object per row")
	return cmd
}

// turnRow is one (model, format, turn) result.
type turnRow struct {
	Model        string  `json:"model"`
	Format       string  `json:"format"`
	Backend      string  `json:"backend"`
	Turn         int     `json:"turn"`
	Prompt       int     `json:"prompt_tokens"`
	Reused       int     `json:"reused_tokens"`
	ColdMs       float64 `json:"cold_ms"`
	ReuseMs      float64 `json:"reuse_ms"`
	Speedup      float64 `json:"speedup"`
	Same         bool    `json:"same_greedy"`    // the reuse run generated the cold run's bytes
	MaxLogitDiff float64 `json:"max_logit_diff"` // last prompt row, reuse vs cold
	RestartMs    float64 `json:"restart_ms,omitempty"`
	RestartSame  bool    `json:"restart_same,omitempty"`
	SaveMs       float64 `json:"save_ms,omitempty"`
	LoadMs       float64 `json:"load_ms,omitempty"`
	FileBytes    int64   `json:"file_bytes,omitempty"`
	CacheBytes   uint64  `json:"cache_bytes,omitempty"` // the saved sequence's share of the cache: its pages and ring
}

// turnResult is one turn of one run.
type turnResult struct {
	dur    time.Duration
	reused int
	greedy []int
	last   []float32 // logits of the prompt's last row
	save   time.Duration
	load   time.Duration
	file   int64
	bytes  uint64
}

func runTurns(stdout, stderr io.Writer, o *turnsOpts) error {
	formats, err := parseFormats(o.formats)
	if err != nil {
		return fmt.Errorf("--formats: %w", err)
	}
	switch {
	case o.turns < 2 || o.turns > 64:
		return fmt.Errorf("--turns %d must be in [2, 64]", o.turns)
	case o.context < 2 || o.context > 1<<20:
		return fmt.Errorf("--context %d must be in [2, 1048576]", o.context)
	case o.generate < 1 || o.generate > 4096:
		return fmt.Errorf("--generate %d must be in [1, 4096]", o.generate)
	case !(o.growth > 0 && o.growth <= 4):
		return fmt.Errorf("--growth %g must be in (0, 4]", o.growth)
	}
	textPath, ok := findInRepo(o.text, o.text == demoRealTextFile)
	if !ok {
		return fmt.Errorf("--text %s: not found", o.text)
	}
	// The conversation's prompts: what each turn adds is fixed by the lengths alone (the generated bytes
	// are counted, not known, until run), so the text needed is known up front.
	need := o.context
	conv := o.context
	for t := 1; t < o.turns; t++ {
		conv += o.generate
		add := max(1, int(math.Round(o.growth*float64(conv))))
		need += add
		conv += add
	}
	text, err := readPrefix(textPath, int64(need))
	if err != nil {
		return fmt.Errorf("--text %s: %w", textPath, err)
	}
	if len(text) < need-1 {
		return fmt.Errorf("--text %s holds %d bytes; %d turns from a %d-token prompt growing by %g need %d", textPath, len(text), o.turns, o.context, o.growth, need-1)
	}
	eng, info, err := openEngine(o.backend, o.threads)
	if err != nil {
		return err
	}
	defer eng.Close()
	var rows []turnRow
	for _, dir := range strings.Split(o.models, ",") {
		if dir = strings.TrimSpace(dir); dir == "" {
			continue
		}
		path, _ := findInRepo(dir, dir == demoRealModelDir || strings.HasPrefix(dir, "models/"))
		m, err := loadByteModel(path)
		if err != nil {
			return err
		}
		if conv > m.Config.MaxPositions {
			fmt.Fprintf(stderr, "gokv turns: %s: the conversation reaches %d positions, past the %d the model was trained on (its outputs are no longer meaningful text; what is measured is the same either way)\n",
				filepath.Base(path), conv, m.Config.MaxPositions)
		}
		for _, f := range formats {
			r, err := runConversation(eng, m, f, o, text, conv)
			if err != nil {
				return fmt.Errorf("model %s, format %s: %w", filepath.Base(path), f, err)
			}
			for i := range r {
				r[i].Model, r[i].Backend = filepath.Base(path), info.Backend
			}
			rows = append(rows, r...)
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
	fmt.Fprintf(stdout, "%s: %s\n", info.Backend, info.Name)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "model\tformat\tturn\tprompt\treused\tcold ms\treuse ms\tspeedup\tsame bytes\tmax |Δlogit|\t"
	if o.restart {
		head += "restart ms\tsame\tsave ms\tload ms\tfile MiB\tcache MiB\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		line := fmt.Sprintf("%s\t%s\t%d\t%d\t%d\t%.1f\t%.1f\t%.2fx\t%v\t%.2g\t", r.Model, r.Format, r.Turn, r.Prompt, r.Reused,
			r.ColdMs, r.ReuseMs, r.Speedup, r.Same, r.MaxLogitDiff)
		if o.restart {
			line += fmt.Sprintf("%.1f\t%v\t%.1f\t%.1f\t%.2f\t%.2f\t", r.RestartMs, r.RestartSame, r.SaveMs, r.LoadMs,
				float64(r.FileBytes)/(1<<20), float64(r.CacheBytes)/(1<<20))
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

// runConversation runs the conversation cold, reusing, and (with --restart) through saved files.
func runConversation(eng *gokv.Engine, m *llama.Model, f gokv.Format, o *turnsOpts, text []byte, conv int) ([]turnRow, error) {
	cold, err := conversation(eng, m, f, o, text, conv, "cold")
	if err != nil {
		return nil, fmt.Errorf("cold: %w", err)
	}
	reuse, err := conversation(eng, m, f, o, text, conv, "reuse")
	if err != nil {
		return nil, fmt.Errorf("reuse: %w", err)
	}
	var restart []turnResult
	if o.restart {
		if restart, err = conversation(eng, m, f, o, text, conv, "restart"); err != nil {
			return nil, fmt.Errorf("restart: %w", err)
		}
	}
	rows := make([]turnRow, o.turns)
	prompt := o.context
	for t := range rows {
		c, r := cold[t], reuse[t]
		rows[t] = turnRow{Format: f.String(), Turn: t + 1, Prompt: prompt, Reused: r.reused,
			ColdMs: ms(c.dur), ReuseMs: ms(r.dur), Speedup: ms(c.dur) / ms(r.dur), Same: equalInts(c.greedy, r.greedy),
			MaxLogitDiff: maxAbsDiff(c.last, r.last)}
		if restart != nil {
			x := restart[t]
			rows[t].RestartMs, rows[t].RestartSame = ms(x.dur), equalInts(c.greedy, x.greedy)
			rows[t].SaveMs, rows[t].LoadMs, rows[t].FileBytes, rows[t].CacheBytes = ms(x.save), ms(x.load), x.file, x.bytes
		}
		conv := prompt + o.generate
		prompt = conv + max(1, int(math.Round(o.growth*float64(conv))))
	}
	return rows, nil
}

// conversation runs every turn in one mode and returns what each turn did.
func conversation(eng *gokv.Engine, m *llama.Model, f gokv.Format, o *turnsOpts, text []byte, conv int, mode string) ([]turnResult, error) {
	open := func() (*gokv.Cache, error) {
		return openModelCache(eng, m, f, nil, 4, conv+o.generate, conv)
	}
	cache, err := open()
	if err != nil {
		return nil, err
	}
	defer func() { cache.Close() }()
	var file string
	if mode == "restart" {
		dir, err := os.MkdirTemp("", "gokv-turns-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		file = filepath.Join(dir, "conversation.gokv")
	}
	toks := []int{m.Config.BOS}
	for _, b := range text[:o.context-1] {
		toks = append(toks, int(b))
	}
	used := o.context - 1
	var out []turnResult
	for t := 0; t < o.turns; t++ {
		if t > 0 {
			add := max(1, int(math.Round(o.growth*float64(len(toks)))))
			for _, b := range text[used : used+add] {
				toks = append(toks, int(b))
			}
			used += add
		}
		var res turnResult
		if mode == "restart" && t > 0 {
			// A new process would start here: a fresh cache, the saved conversation loaded into it.
			cache.Close()
			if cache, err = open(); err != nil {
				return nil, err
			}
			t0 := time.Now()
			seqs, err := cache.Load(file)
			if err != nil {
				return nil, fmt.Errorf("turn %d: %w", t+1, err)
			}
			res.load = time.Since(t0)
			for _, s := range seqs {
				if err := s.Release(); err != nil { // its pages stay cached, named, for the turn's reuse
					return nil, err
				}
			}
		}
		r := m.NewRunner(cache)
		t0 := time.Now()
		var seq *gokv.Sequence
		start := 0
		if mode == "cold" {
			seq, err = cache.NewSequence()
		} else {
			seq, start, err = cache.NewSequenceFrom(int32s(toks))
		}
		if err != nil {
			return nil, fmt.Errorf("turn %d: %w", t+1, err)
		}
		res.reused = start
		outp, err := r.Step(llama.Entry{Seq: seq, Tokens: toks[start:]})
		if err != nil {
			return nil, fmt.Errorf("turn %d: prefill: %w", t+1, err)
		}
		res.last = append([]float32(nil), outp.Logits[0]...)
		next := argmax(outp.Logits[0][:256])
		for len(res.greedy) < o.generate {
			res.greedy = append(res.greedy, next)
			toks = append(toks, next)
			if len(res.greedy) == o.generate {
				break // the last generated byte is the next turn's first new token
			}
			outp, err = r.Step(llama.Entry{Seq: seq, Tokens: []int{next}})
			if err != nil {
				return nil, fmt.Errorf("turn %d: decode: %w", t+1, err)
			}
			next = argmax(outp.Logits[0][:256])
		}
		res.dur = time.Since(t0)
		if mode == "restart" {
			before := cache.Stats().BytesUsed
			t1 := time.Now()
			if err := cache.Save(file, seq); err != nil {
				return nil, fmt.Errorf("turn %d: %w", t+1, err)
			}
			res.save = time.Since(t1)
			if st, err := os.Stat(file); err == nil {
				res.file = st.Size()
			}
			res.bytes = before
		}
		if err := seq.Release(); err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}

func int32s(xs []int) []int32 {
	out := make([]int32, len(xs))
	for i, x := range xs {
		out[i] = int32(x)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
