package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/internal/llama"
)

// demoTinyReal sizes the real-model part for the race detector: one sequence of 32 tokens and an 8-byte
// greedy continuation.
var demoTinyReal = []string{"--real-context", "32", "--real-sequences", "1", "--real-tokens", "8"}

// runDemoCLI runs gokv demo with args and returns stdout; the demo must succeed.
func runDemoCLI(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	root := newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs(append([]string{"demo", "-q", "--backend", "cpu"}, args...))
	require.NoError(t, root.Execute())
	return out.String()
}

func TestDemoTinyWritesPlotAndReport(t *testing.T) {
	plotPath := filepath.Join(t.TempDir(), "demo.png")
	out := runDemoCLI(t, append([]string{"--json", "--context", "256", "--layers", "2", "--steps", "3", "--chunk", "64",
		"--plot", plotPath, "--real-model", tinyLlama, "--real-text", heldout}, demoTinyReal...)...)
	var rep demoReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Equal(t, "llama-3.1-8b", rep.Model)
	assert.Equal(t, 2, rep.LayersRun)
	assert.Equal(t, 32, rep.Layers)
	assert.Equal(t, 256+3, rep.Context, "the context plus the last checkpoint's decode steps")
	assert.Equal(t, 3, rep.Steps)
	assert.Positive(t, rep.CPUs)
	assert.GreaterOrEqual(t, rep.Spread, 1.0)
	if rep.Noisy { // tiny steps never call the machine noisy: only steps of a millisecond or more judge
		assert.Greater(t, rep.Spread, demoNoisySpread)
	}
	assert.Contains(t, rep.NotRun, "perplexity")
	require.Len(t, rep.Formats, 3)
	byFormat := map[string]demoFormat{}
	for _, f := range rep.Formats {
		byFormat[f.Format] = f
		assert.Len(t, f.Points, 4)
		assert.Greater(t, f.DecodeMs, 0.0)
		assert.True(t, f.DecodeMsP10 <= f.DecodeMs && f.DecodeMs <= f.DecodeMsP90, "%s: p10 %g, median %g, p90 %g", f.Format,
			f.DecodeMsP10, f.DecodeMs, f.DecodeMsP90)
		for _, p := range f.Points {
			assert.True(t, p.MsP10 <= p.Ms && p.Ms <= p.MsP90, "%s at %d", f.Format, p.Context)
		}
		assert.Greater(t, f.BytesUsed, uint64(0))
		assert.Greater(t, f.CosVsF32, 0.5)
		assert.LessOrEqual(t, f.SinkWindowBytes, f.BytesUsed)
	}
	assert.Greater(t, byFormat["f16"].CosVsF32, 0.99999)
	assert.Greater(t, byFormat["f16"].BytesUsed, byFormat["q4:32"].BytesUsed)
	assert.EqualValues(t, int64(32*131072*4096), byFormat["f16"].FullModelAt128K, "gokv plan: 32 layers x 4 KiB/token")

	rm := rep.RealModel
	require.NotNil(t, rm)
	assert.Empty(t, rep.RealModelSkipped)
	assert.Equal(t, "tiny-llama", rm.Model)
	assert.EqualValues(t, 2902784, rm.Parameters)
	assert.Equal(t, 512, rm.MaxContext)
	assert.Equal(t, 1, rm.Sequences)
	assert.Equal(t, 32, rm.Context)
	assert.Equal(t, 7, rm.Prefill, "a quarter of the 31 predicted positions")
	assert.Equal(t, 31-7, rm.DecodeSteps)
	assert.Equal(t, 31, rm.Scored)
	assert.Contains(t, rm.About, "not production quality")
	assert.NotContains(t, rm.About, "KJV", "a model named by --real-model is not described as the repository's")
	assert.Equal(t, "2Cor1:1 Paul, an apostle of Jesus Christ by the will of God, and", rm.Prompt)
	assert.Equal(t, "f32", rm.Reference.Format)
	assert.Equal(t, 1.0, rm.Reference.Top1Agree)
	assert.Equal(t, 8, rm.Reference.GreedyMatch)
	require.Len(t, rm.Formats, 3)
	for _, f := range append([]demoRealFormat{rm.Reference}, rm.Formats...) {
		assert.Greater(t, f.BitsPerByte, 0.0, f.Format)
		assert.InDelta(t, 0.5, f.Top1Agree, 0.5, f.Format)
		assert.Equal(t, 8, f.GreedyTokens, f.Format)
		assert.Equal(t, 8, unescapedLen(f.Continuation), "%s: %q", f.Format, f.Continuation)
		assert.Positive(t, f.KVBytes, f.Format)
		assert.True(t, f.MsPerTokenP10 <= f.MsPerToken && f.MsPerToken <= f.MsPerTokenP90, f.Format)
		assert.True(t, f.AttnMsPerTokenP10 <= f.AttnMsPerToken && f.AttnMsPerToken <= f.AttnMsPerTokenP90, f.Format)
		assert.InDelta(t, 1e3/f.MsPerToken, f.TokensPerSecond, 1e-6, f.Format)
		assert.True(t, f.AttnShare > 0 && f.AttnShare < 1, "%s: attention is part of the step, %g", f.Format, f.AttnShare)
	}

	// The documented keys, as a reader of the JSON sees them.
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &raw))
	for _, k := range []string{"steps", "spread", "noisy", "cpus", "real_model"} {
		assert.Contains(t, raw, k)
	}
	point := raw["formats"].([]any)[0].(map[string]any)["points"].([]any)[0].(map[string]any)
	for _, k := range []string{"ms", "ms_p10", "ms_p90"} {
		assert.Contains(t, point, k)
	}
	real := raw["real_model"].(map[string]any)
	for _, k := range []string{"model", "parameters", "about", "sequences", "context", "decode_steps", "prompt", "reference", "formats"} {
		assert.Contains(t, real, k)
	}
	for _, k := range []string{"format", "bits_per_byte", "top1_agree", "greedy_match", "continuation", "ms_per_token",
		"ms_per_token_p10", "ms_per_token_p90", "tokens_per_second", "attn_ms_per_token", "attn_ms_per_token_p10",
		"attn_ms_per_token_p90", "attn_share"} {
		assert.Contains(t, real["formats"].([]any)[0], k)
	}

	f, err := os.Open(plotPath)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	assert.Equal(t, 3*5*96, img.Bounds().Dx(), "three panels of 5 inches at 96 dpi: latency, memory, quality")
}

func TestDemoHumanOutputAndNoPlot(t *testing.T) {
	dir := t.TempDir()
	wd, err := os.Getwd()
	require.NoError(t, err)
	require.NoError(t, os.Chdir(dir))
	defer os.Chdir(wd)
	s := runDemoCLI(t, "--context", "128", "--layers", "1", "--steps", "1", "--formats", "q4,kivi2:32:32", "--no-plot",
		"--no-real-model")
	assert.Contains(t, s, "q4:32")
	assert.Contains(t, s, "kivi2:32:32")
	assert.Contains(t, s, "decode ms [p10-p90]")
	assert.Contains(t, s, "median [p10-p90] of 1 steps")
	assert.Regexp(t, `(?m)^(spread|noisy): .*p90/p10 of the steps at one context`, s)
	assert.Contains(t, s, "SinkWindow{Sinks: 4, Window: 1024}")
	assert.Contains(t, s, "real model: not run (--no-real-model)")
	assert.Contains(t, s, "not run: perplexity")
	_, err = os.Stat(filepath.Join(dir, "gokv-demo.png"))
	assert.True(t, os.IsNotExist(err), "--no-plot writes no file")
}

// TestDemoRealModelText: the real-model part's table, its caveat and the greedy lines, in the text output;
// the model and text are the repository's, found from this package's directory.
func TestDemoRealModelText(t *testing.T) {
	s := runDemoCLI(t, append([]string{"--context", "16", "--layers", "1", "--steps", "2", "--chunk", "16", "--formats", "q8",
		"--no-plot"}, demoTinyReal...)...)
	for _, want := range []string{
		"real model: tiny-llama (",
		"a tiny byte-level Llama (2.9M parameters, 4 layers, context 512) trained on the KJV Bible",
		"not production quality",
		"1 sequences x 32 tokens of ",
		filepath.Join("models", "heldout", "kjv-heldout.txt") + " (BOS + 31 bytes each), every byte scored: a prefill step of 7 tokens,",
		"then 24 decode steps of one token per sequence",
		"ms/token [p10-p90]",
		"attn ms/token [p10-p90]",
		"f32 (ref)",
		"q8:32",
		"8/8",
		`greedy, 8 bytes after BOS + "2Cor1:1 Paul, an apostle`,
		"the real-model part measures bits per byte and top-1 instead",
	} {
		assert.Contains(t, s, want)
	}
}

// TestDemoRealModelMissingSkips: a missing model directory or text skips the part with one line and the
// rest of the demo runs; --json says why under real_model_skipped.
func TestDemoRealModelMissingSkips(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-model")
	synth := []string{"--context", "16", "--layers", "1", "--steps", "1", "--chunk", "16", "--formats", "q4", "--no-plot"}
	for _, tc := range []struct {
		name  string
		args  []string
		chdir bool // run from an empty directory, where the default is not found
		want  string
	}{
		{"model", []string{"--real-model", missing}, false, "real model: not run: no model directory " + missing},
		{"text", []string{"--real-model", tinyLlama, "--real-text", missing}, false, "real model: not run: no text file " + missing},
		{"default", nil, true, "real model: not run: no model directory models/tiny-llama in the working directory, the executable's, " +
			"or their parents (--real-model DIR names one)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.chdir {
				wd, err := os.Getwd()
				require.NoError(t, err)
				require.NoError(t, os.Chdir(t.TempDir()))
				defer os.Chdir(wd)
			}
			s := runDemoCLI(t, append(synth, tc.args...)...)
			assert.Contains(t, s, tc.want+"\n")
			assert.Contains(t, s, "done in")

			var rep map[string]any
			require.NoError(t, json.Unmarshal([]byte(runDemoCLI(t, append(append(synth, "--json"), tc.args...)...)), &rep))
			assert.NotContains(t, rep, "real_model")
			assert.Contains(t, rep["real_model_skipped"], "not run: no ")
		})
	}
}

// TestFindInRepo: a default relative path is found in a parent of the working directory; one given on
// the command line is taken as it is.
func TestFindInRepo(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "models", "m"), 0o755))
	deep := filepath.Join(root, "a", "b")
	require.NoError(t, os.MkdirAll(deep, 0o755))
	wd, err := os.Getwd()
	require.NoError(t, err)
	require.NoError(t, os.Chdir(deep))
	defer os.Chdir(wd)
	for _, tc := range []struct {
		path   string
		search bool
		want   string
		found  bool
	}{
		{"models/m", true, filepath.Join(root, "models", "m"), true},
		{"models/m", false, "models/m", false},
		{"models/none", true, "models/none", false},
		{filepath.Join(root, "models", "m"), false, filepath.Join(root, "models", "m"), true},
	} {
		got, ok := findInRepo(tc.path, tc.search)
		assert.Equal(t, tc.found, ok, "%s search %v", tc.path, tc.search)
		if ok {
			gotAbs, err := filepath.EvalSymlinks(got)
			require.NoError(t, err)
			wantAbs, err := filepath.EvalSymlinks(tc.want)
			require.NoError(t, err)
			assert.Equal(t, wantAbs, gotAbs)
		} else {
			assert.Equal(t, tc.want, got)
		}
	}
}

func TestModelParameters(t *testing.T) {
	for _, tc := range []struct {
		dir  string
		want int64
	}{
		{tinyLlama, 2902784}, // models/tiny-llama/README.md
		{tinySinks, 2902784 + 4*4},
	} {
		c, err := llama.LoadConfig(filepath.Join(tc.dir, "config.json"))
		require.NoError(t, err)
		assert.Equal(t, tc.want, modelParameters(c), tc.dir)
	}
}

func TestNewSpread(t *testing.T) {
	for _, tc := range []struct {
		xs            []float64
		med, p10, p90 float64
	}{
		{nil, 0, 0, 0},
		{[]float64{5}, 5, 5, 5},
		{[]float64{3, 1, 2}, 2, 1, 3},
		// 20 steps, one slow: nearest rank puts p10 at the 2nd and p90 at the 18th.
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 100}, 10.5, 2, 18},
	} {
		xs := append([]float64(nil), tc.xs...)
		s := newSpread(xs)
		assert.Equal(t, spread{median: tc.med, p10: tc.p10, p90: tc.p90}, s, "%v", tc.xs)
		assert.Equal(t, tc.xs, xs, "the sample is left as it was")
	}
}

func TestDemoErrors(t *testing.T) {
	short := filepath.Join(t.TempDir(), "short.txt")
	require.NoError(t, os.WriteFile(short, []byte("In the beginning"), 0o644))
	for _, c := range []struct {
		args     []string
		contains string
	}{
		{[]string{"demo", "--layers", "99"}, "--layers 99"},
		{[]string{"demo", "--formats", "q9"}, "--formats"},
		{[]string{"demo", "--model", "nope"}, "nope"},
		{[]string{"demo", "--context", "0"}, "--context 0 must be >= 1"},
		{[]string{"demo", "--real-model", tinyLlama, "--real-context", "600"}, "--real-context 600 must be in [2, 512]"},
		{[]string{"demo", "--real-model", tinyLlama, "--real-sequences", "0"}, "--real-sequences 0 must be in [1, 64]"},
		{[]string{"demo", "--real-model", tinyLlama, "--real-tokens", "500"}, "--real-tokens 500 must be in [0, 448]"},
		{[]string{"demo", "--real-model", tinyLlama, "--real-text", short, "--real-context", "16"},
			"--real-text " + short + " has 16 bytes, fewer than the 64"},
		{[]string{"demo", "--real-model", heldout}, "--real-model " + heldout},
	} {
		root := newRootCmd(&bytes.Buffer{}, &bytes.Buffer{})
		root.SetArgs(append(c.args, "-q", "--no-plot"))
		err := root.Execute()
		require.Error(t, err, "%v", c.args)
		assert.Contains(t, err.Error(), c.contains)
	}
}
