package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/gokv"
	"github.com/gokv/gokv/internal/llama"
)

var (
	tinyLlama = filepath.Join("..", "..", "models", "tiny-llama")
	tinySinks = filepath.Join("..", "..", "models", "tiny-sinks")
	heldout   = filepath.Join("..", "..", "models", "heldout", "kjv-heldout.txt")
)

// evalJSON runs gokv eval --json with args and decodes its rows.
func evalJSON(t *testing.T, args ...string) []evalRow {
	t.Helper()
	out, msg := runCLI(t, append([]string{"eval", "-q", "--json", "--backend", "cpu", "--text", heldout}, args...)...)
	require.Empty(t, msg)
	var rows []evalRow
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r evalRow
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		rows = append(rows, r)
	}
	return rows
}

// TestEvalRows: one row per model x format x eviction with the documented keys; the f32 full-cache row is
// the reference (top1 1, KL 0, every greedy token), and compressed formats hold fewer bytes.
func TestEvalRows(t *testing.T) {
	const n, k, greedy = 48, 2, 8
	rows := evalJSON(t, "--model", tinyLlama+","+tinySinks, "--context", "48", "--prefill", "16", "--sequences", "2",
		"--greedy-tokens", "8", "--formats", "f32,q8,kivi2:32:32", "--eviction", "none,sinkwindow:4:16")
	require.Len(t, rows, 2*3*2)
	byKey := map[string]evalRow{}
	for _, r := range rows {
		byKey[r.Model+" "+r.Format+" "+r.Eviction] = r
		assert.Equal(t, "cpu", r.Backend)
		assert.Equal(t, n, r.Context)
		assert.Equal(t, k*(n-1), r.Tokens, "every byte scored")
		assert.Equal(t, greedy, r.GreedyTokens)
		assert.Greater(t, r.BitsPerByte, 0.0)
		assert.Less(t, r.BitsPerByte, 20.0)
		assert.InDelta(t, 0.5, r.Top1Agree, 0.5)
		assert.GreaterOrEqual(t, r.KLP99, 0.0)
		assert.Positive(t, r.KVBytes)
		assert.Positive(t, r.AttnMsPerToken)
		assert.Greater(t, r.MsPerToken, r.AttnMsPerToken, "the whole step includes its attention")
	}
	for _, model := range []string{"tiny-llama", "tiny-sinks"} {
		ref := byKey[model+" f32 none"]
		assert.Equal(t, 1.0, ref.Top1Agree, model)
		assert.Zero(t, ref.KLMean, model)
		assert.Equal(t, greedy, ref.GreedyMatch, model)
		q8 := byKey[model+" q8:32 none"]
		assert.Less(t, q8.KVBytes, ref.KVBytes, model)
		assert.Less(t, q8.KLMean, 1e-2, model)
		assert.Less(t, math.Abs(q8.BitsPerByte-ref.BitsPerByte), 0.05, model)
		// KIVI with R 32 over 48 tokens: at most a residual ring in full precision, the rest 2-bit.
		assert.Positive(t, byKey[model+" kivi2:32:32 none"].KLMean, model)
	}
	// The header of the eval help: the f32 full-cache row is only printed when asked for.
	rows = evalJSON(t, "--model", tinyLlama, "--context", "24", "--prefill", "8", "--sequences", "1", "--greedy-tokens", "0",
		"--formats", "q4")
	require.Len(t, rows, 1)
	assert.Equal(t, "q4:32", rows[0].Format)
	assert.Zero(t, rows[0].GreedyMatch)
}

// TestEvalBitsMatchDirectScoring: eval's f32 bits per byte, from a short prefill and teacher-forced
// decode, equal scoring the same sequences (BOS + consecutive chunks of N-1 bytes) in one prefill each.
func TestEvalBitsMatchDirectScoring(t *testing.T) {
	const n, k = 40, 3
	rows := evalJSON(t, "--model", tinySinks, "--context", "40", "--prefill", "5", "--sequences", "3", "--greedy-tokens", "0",
		"--formats", "f32")
	require.Len(t, rows, 1)

	m, err := llama.Load(tinySinks)
	require.NoError(t, err)
	text, err := os.ReadFile(heldout)
	require.NoError(t, err)
	eng, err := gokv.Open(gokv.WithBackend("cpu"))
	require.NoError(t, err)
	defer eng.Close()
	cache, err := m.NewCache(eng, gokv.CacheOptions{Format: gokv.Format{Kind: gokv.F32}, MaxTokens: 1024})
	require.NoError(t, err)
	defer cache.Close()
	r := m.NewRunner(cache)
	bits := 0.0
	lp := make([]float32, m.Config.VocabSize)
	for s := 0; s < k; s++ {
		ids := []int{m.Config.BOS}
		for _, b := range text[s*(n-1) : (s+1)*(n-1)] {
			ids = append(ids, int(b))
		}
		seq, err := cache.NewSequence()
		require.NoError(t, err)
		out, err := r.Step(llama.Entry{Seq: seq, Tokens: ids, AllLogits: true})
		require.NoError(t, err)
		V := m.Config.VocabSize
		for p := 0; p+1 < n; p++ {
			logSoftmax(lp, out.Logits[0][p*V:(p+1)*V])
			bits -= float64(lp[ids[p+1]]) / math.Ln2
		}
	}
	want := bits / float64(k*(n-1))
	assert.InEpsilon(t, want, rows[0].BitsPerByte, 1e-5)
}

func TestEvalTextAndPlot(t *testing.T) {
	plotPath := filepath.Join(t.TempDir(), "eval.png")
	out, msg := runCLI(t, "eval", "-q", "--backend", "cpu", "--model", tinyLlama, "--text", heldout, "--context", "32",
		"--prefill", "8", "--sequences", "1", "--greedy-tokens", "4", "--formats", "f32,q4", "--plot", plotPath)
	require.Empty(t, msg)
	assert.Contains(t, out, "1 sequences x 32 tokens (BOS + 31 bytes of")
	assert.Contains(t, out, "bits/byte")
	assert.Contains(t, out, "attn ms/tok")
	assert.Contains(t, out, "tiny-llama   q4:32")
	assert.Contains(t, out, "4/4")
	assert.Contains(t, out, "plot: "+plotPath)
	f, err := os.Open(plotPath)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	assert.Greater(t, img.Bounds().Dx(), 300)
}

func TestEvalErrors(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short.txt")
	require.NoError(t, os.WriteFile(short, []byte("In the beginning"), 0o644))
	base := []string{"eval", "-q", "--backend", "cpu"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--text", heldout}, "--model is required"},
		{[]string{"--model", filepath.Join(dir, "none"), "--text", heldout}, "config.json"},
		{[]string{"--model", tinyLlama}, "--text is required"},
		{[]string{"--model", tinyLlama, "--text", filepath.Join(dir, "none.txt")}, "--text: open"},
		{[]string{"--model", tinyLlama, "--text", short, "--context", "16", "--prefill", "8", "--sequences", "2"},
			"has 16 bytes, fewer than --sequences 2 x (--context 16 - 1) = 30"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--formats", "q5"}, "--formats"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--eviction", "window:4"}, `--eviction "window:4"`},
		{[]string{"--model", tinyLlama, "--text", heldout, "--eviction", "sinkwindow:4:0"}, "window W >= 1"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--eviction", "h2o:1/0:4"}, "a fraction in (0, 1]"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--eviction", "h2o:3/2:4"}, "a fraction in (0, 1]"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--eviction", "h2o:x:4"}, "a token count or a fraction"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--eviction", "snapkv:64:0"}, "WINDOW must be >= 1"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--eviction", "quest"}, "want quest:PAGES[:RECENT]"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--eviction", "quest:1:2:3"}, "want quest:PAGES[:RECENT]"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--eviction", "quest:0"}, "PAGES must be an integer >= 1"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--eviction", "quest:x:4"}, "PAGES must be an integer >= 1"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--eviction", "quest:2:-1"}, "RECENT must be an integer >= 0"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--context", "32", "--prefill", "8", "--eviction", "h2o:1/8:4"},
			"Eviction H2O{Budget: 4, Recent: 4}: Budget must be > Recent"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--score", "some"}, `--score "some"`},
		{[]string{"--model", tinyLlama, "--text", heldout, "--context", "600"},
			"--context: 600 positions pass the model's max_position_embeddings 512"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--context", "600", "--eviction", "sinkwindow:4:600"}, "sinkwindow:4:600 is not"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--context", "1"}, "--context 1 must be >= 2"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--context", "32", "--prefill", "8", "--greedy-tokens", "500"},
			"--greedy-tokens: 564 positions pass the model's max_position_embeddings 512"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--context", "32", "--prefill", "32"}, "--prefill 32 must be in [1, 31]"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--sequences", "0"}, "--sequences 0"},
		{[]string{"--model", tinyLlama, "--text", heldout, "--plot", filepath.Join(dir, "missing", "p.png")}, "does not exist"},
	} {
		_, msg := runCLI(t, append(base, tc.args...)...)
		assert.Contains(t, msg, tc.want, "%v", tc.args)
	}
}

// TestEvalTokenPolicies: h2o and snapkv rows, budgets as fractions of the context; scored over the
// decode positions, a budget below the context changes the output and reads fewer bytes, and SnapKV with
// a budget of the whole prompt keeps everything.
func TestEvalTokenPolicies(t *testing.T) {
	const n, p, k = 96, 48, 2
	rows := evalJSON(t, "--model", tinyLlama+","+tinySinks, "--context", "96", "--prefill", "48", "--sequences", "2",
		"--greedy-tokens", "4", "--formats", "f32", "--score", "decode",
		"--eviction", "none,h2o:1/4:8,h2o:40:8,snapkv:1/4:8,snapkv:1/2:8")
	require.Len(t, rows, 2*5)
	byKey := map[string]evalRow{}
	for _, r := range rows {
		byKey[r.Model+" "+r.Eviction] = r
		assert.Equal(t, k*(n-1-p), r.Tokens, "decode positions scored")
		assert.Equal(t, "decode", r.Score)
		assert.Positive(t, r.KVReadBytes)
	}
	for _, model := range []string{"tiny-llama", "tiny-sinks"} {
		ref := byKey[model+" none"]
		assert.Equal(t, 1.0, ref.Top1Agree)
		perTok := float64(ref.KVReadBytes) / float64(n-1) // f32, every token visible
		for _, ev := range []string{"h2o:1/4:8", "snapkv:1/4:8"} {
			r := byKey[model+" "+ev]
			assert.Equal(t, 24, r.Budget, ev)
			assert.Positive(t, r.KLMean, "%s %s: evicting changes the output", model, ev)
			assert.Less(t, r.KVReadBytes, ref.KVReadBytes, "%s %s", model, ev)
		}
		assert.Equal(t, 40, byKey[model+" h2o:40:8"].Budget)
		assert.InDelta(t, 24*perTok, float64(byKey[model+" h2o:1/4:8"].KVReadBytes), perTok/2, "%s: H2O reads its budget", model)
		// SnapKV compresses the prompt only: 24 of its 48 tokens, plus the 47 decoded ones.
		assert.InDelta(t, (24+47)*perTok, float64(byKey[model+" snapkv:1/4:8"].KVReadBytes), perTok/2, model)
		whole := byKey[model+" snapkv:1/2:8"]
		assert.Zero(t, whole.KLMean, "%s: a budget of the whole prompt keeps everything", model)
		assert.Equal(t, ref.KVReadBytes, whole.KVReadBytes)
	}
}

// TestParseQuestEviction: quest:PAGES[:RECENT] entries, RECENT 1 when left out.
func TestParseQuestEviction(t *testing.T) {
	evs, err := parseEvictions("full,quest:4,quest:2:16")
	require.NoError(t, err)
	require.Len(t, evs, 3)
	assert.False(t, evs[0].evicts())
	assert.Equal(t, "quest:4:1", evs[1].name)
	p, budget := evs[2].policy(512)
	assert.Equal(t, &gokv.Quest{Pages: 2, Recent: 16}, p)
	assert.Zero(t, budget)
	assert.Equal(t, 2, questPages(p))
}

// TestEvalQuest: quest rows where the device has Quest kernels (else the cache refuses, naming the
// capability); reading more pages than the sequences have equals full attention.
func TestEvalQuest(t *testing.T) {
	eng, err := gokv.Open(gokv.WithBackend("cpu"), gokv.WithThreads(1))
	require.NoError(t, err)
	info, err := eng.Info()
	require.NoError(t, err)
	require.NoError(t, eng.Close())
	// 320 tokens: 5 pages of 64; quest:1:8 reads the sink page, the last page and one more.
	args := []string{"eval", "-q", "--json", "--backend", "cpu", "--model", tinyLlama, "--text", heldout, "--context", "320",
		"--prefill", "32", "--sequences", "1", "--greedy-tokens", "0", "--formats", "f32", "--score", "decode",
		"--eviction", "none,quest:1:8,quest:64:8"}
	if !info.Caps.Quest {
		_, msg := runCLI(t, args...)
		assert.Contains(t, msg, "Quest")
		return
	}
	rows := evalJSON(t, args[5:]...)
	require.Len(t, rows, 3)
	ref, one, all := rows[0], rows[1], rows[2]
	assert.Equal(t, 1, one.QuestPages)
	assert.Positive(t, one.KVReadBytes)
	assert.Less(t, one.KVReadBytes, ref.KVReadBytes*3/4, "3 of 5 pages and the bounds")
	assert.Positive(t, one.KLMean, "reading fewer pages changes the output")
	assert.InDelta(t, 0, all.KLMean, 1e-9, "every page read: full attention")
	assert.Greater(t, one.KVBytes, ref.KVBytes, "the key bounds take memory")
}

// TestEvalContextBeyondTrainedWithWindow: a context past max_position_embeddings runs when the eviction
// keeps the window inside it, with a warning on stderr.
func TestEvalContextBeyondTrainedWithWindow(t *testing.T) {
	var out, errOut bytes.Buffer
	root := newRootCmd(&out, &errOut)
	root.SetArgs([]string{"eval", "-q", "--json", "--backend", "cpu", "--model", tinySinks, "--text", heldout,
		"--context", "520", "--prefill", "500", "--sequences", "1", "--greedy-tokens", "0", "--formats", "q4",
		"--eviction", "sinkwindow:0:64"})
	require.NoError(t, root.Execute())
	var r evalRow
	require.NoError(t, json.Unmarshal(out.Bytes(), &r))
	assert.Equal(t, 519, r.Tokens)
	assert.Contains(t, errOut.String(), "520 positions pass the trained 512")
}
