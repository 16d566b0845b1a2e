package main

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gokv/gokv/gokv"
	"github.com/gokv/gokv/internal/llama"
)

type generateOpts struct {
	model, prompt, format, eviction, backend string
	tokens, threads                          int
	seed                                     uint64
	temperature                              float64
	json                                     bool
}

func newGenerateCmd(g *globalOpts) *cobra.Command {
	o := &generateOpts{}
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Continue a prompt with a byte-level Llama model, its attention through a gokv cache",
		Long: `generate feeds BOS and the prompt's bytes to a byte-level Llama model (a directory with config.json
and model.safetensors) in one prefill step, then generates --tokens bytes one step at a time, every
attention through a gokv cache in --format under --eviction.

Output: the continuation on stdout as it is generated: bytes as text, with newline and tab kept, a
backslash written \\ and every other byte outside printable ASCII written \xNN; then a newline. The
last line, on stderr, gives the decode speed (generated tokens per second of decode steps, the prefill
not counted) and the KV cache bytes in use at the end (Cache.Stats().BytesUsed). With --json, stdout is
one JSON object with all of it instead.

--temperature 0 (the default) is greedy; above 0 the next byte is sampled from softmax(logits / T) with
a generator seeded by --seed. Only bytes are chosen, never BOS. The prompt plus --tokens must fit the
model's max_position_embeddings unless --eviction is sinkwindow:S:W with S + W within it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runGenerate(cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.model, "model", "", "model directory (config.json + model.safetensors)")
	f.StringVar(&o.prompt, "prompt", "", "prompt text (its bytes follow BOS)")
	f.StringVar(&o.format, "format", "f16", "KV format")
	f.StringVar(&o.eviction, "eviction", "none", "eviction policy: none, sinkwindow:S:W, h2o:BUDGET:RECENT, snapkv:BUDGET:WINDOW or quest:PAGES[:RECENT] (BUDGET: tokens or a fraction of the prompt plus --tokens)")
	f.IntVar(&o.tokens, "tokens", 128, "bytes to generate")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the sampler (with --temperature > 0)")
	f.Float64Var(&o.temperature, "temperature", 0, "sampling temperature; 0 is greedy")
	f.StringVar(&o.backend, "backend", "auto", "backend: cpu, vulkan, metal, sycl or auto")
	f.IntVar(&o.threads, "threads", 0, "CPU worker threads (0: all online CPUs)")
	f.BoolVar(&o.json, "json", false, "print one JSON object instead of the text and the stats line")
	return cmd
}

// generateReport is --json's object.
type generateReport struct {
	Model           string  `json:"model"`
	Format          string  `json:"format"`
	Eviction        string  `json:"eviction"`
	Backend         string  `json:"backend"`
	PromptTokens    int     `json:"prompt_tokens"` // BOS included
	Tokens          int     `json:"tokens"`
	Continuation    string  `json:"continuation"` // the bytes, as a JSON string (invalid UTF-8 replaced)
	TokensPerSecond float64 `json:"tokens_per_second"`
	KVBytes         uint64  `json:"kv_bytes"`
}

func runGenerate(stdout, stderr io.Writer, o *generateOpts) error {
	f, err := gokv.ParseFormat(o.format)
	if err != nil {
		return fmt.Errorf("--format: %w", err)
	}
	ev, err := parseEviction(strings.TrimSpace(o.eviction))
	if err != nil {
		return err
	}
	switch {
	case o.tokens < 1 || o.tokens > 1<<20:
		return fmt.Errorf("--tokens %d must be in [1, 1048576]", o.tokens)
	case o.temperature < 0 || math.IsNaN(o.temperature) || math.IsInf(o.temperature, 0):
		return fmt.Errorf("--temperature %g must be a finite number >= 0", o.temperature)
	}
	m, err := loadByteModel(o.model)
	if err != nil {
		return err
	}
	prompt := []int{m.Config.BOS}
	for _, b := range []byte(o.prompt) {
		prompt = append(prompt, int(b))
	}
	total := len(prompt) + o.tokens - 1 // the last token is generated, never fed
	warn, err := checkPositions("--prompt plus --tokens", total, m.Config.MaxPositions, []evalEviction{ev})
	if err != nil {
		return err
	}
	if warn != "" {
		logger.Warn().Msg(warn)
	}

	eng, info, err := openEngine(o.backend, o.threads)
	if err != nil {
		return err
	}
	defer eng.Close()
	policy, _ := ev.policy(total)
	cache, err := openModelCache(eng, m, f, policy, 1, total, len(prompt))
	if err != nil {
		return err
	}
	defer cache.Close()
	seq, err := cache.NewSequence()
	if err != nil {
		return err
	}
	r := m.NewRunner(cache)
	rng := rand.New(rand.NewPCG(o.seed, 0x67656e))
	probs := make([]float64, 256)
	var text strings.Builder
	var decode time.Duration
	in := prompt
	for i := 0; i < o.tokens; i++ {
		out, err := r.Step(llama.Entry{Seq: seq, Tokens: in})
		if err != nil {
			return fmt.Errorf("step %d (position %d): %w", i, seq.Len(), err)
		}
		if i > 0 {
			decode += out.Timing.Total
		}
		next := pickByte(out.Logits[0][:256], o.temperature, rng, probs)
		piece := escapeByte(byte(next))
		text.WriteString(piece)
		if !o.json {
			if _, err := io.WriteString(stdout, piece); err != nil {
				return err
			}
		}
		in = []int{next}
	}
	rep := generateReport{Model: m.Name, Format: f.String(), Eviction: ev.name, Backend: info.Backend,
		PromptTokens: len(prompt), Tokens: o.tokens, Continuation: text.String(), KVBytes: cache.Stats().BytesUsed}
	if o.tokens > 1 {
		rep.TokensPerSecond = float64(o.tokens-1) / decode.Seconds()
	}
	if o.json {
		return writeJSON(stdout, rep)
	}
	fmt.Fprintln(stdout)
	fmt.Fprintf(stderr, "gokv generate: %d tokens, %.1f tokens/s decoding, KV cache %s in use (%s, %s, %s backend)\n",
		rep.Tokens, rep.TokensPerSecond, formatSize(int64(rep.KVBytes)), rep.Format, rep.Eviction, rep.Backend)
	return nil
}

// pickByte chooses the next byte from the byte logits: their argmax at temperature 0, else a sample of
// softmax(logits / temperature). probs is scratch of len(logits).
func pickByte(logits []float32, temperature float64, rng *rand.Rand, probs []float64) int {
	if temperature == 0 {
		return argmax(logits)
	}
	mx := math.Inf(-1)
	for _, z := range logits {
		mx = max(mx, float64(z))
	}
	sum := 0.0
	for i, z := range logits {
		probs[i] = math.Exp((float64(z) - mx) / temperature)
		sum += probs[i]
	}
	u := rng.Float64() * sum
	for i, p := range probs {
		if u < p {
			return i
		}
		u -= p
	}
	return argmax(logits) // u landed past the last bucket by rounding
}

// escapeByte renders one generated byte as text: printable ASCII, newline and tab as themselves, a
// backslash doubled, anything else as \xNN.
func escapeByte(b byte) string {
	switch {
	case b == '\\':
		return `\\`
	case b == '\n' || b == '\t' || (b >= 0x20 && b < 0x7f):
		return string(rune(b))
	}
	return fmt.Sprintf(`\x%02x`, b)
}

// escapeLine renders byte tokens on one line: as escapeByte, but newline and tab written \n and \t, so
// a continuation fits a row of a table.
func escapeLine(toks []int) string {
	var b strings.Builder
	for _, t := range toks {
		switch t {
		case '\n':
			b.WriteString(`\n`)
		case '\t':
			b.WriteString(`\t`)
		default:
			b.WriteString(escapeByte(byte(t)))
		}
	}
	return b.String()
}
