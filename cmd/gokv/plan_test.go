package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Open-TQ-Metal figures of docs/architecture.md §6 for Llama 3.1 70B.
func TestPlanLlama70B(t *testing.T) {
	cases := []struct {
		format          string
		bytes           int64
		bytesPerToken   float64
		maxLo, maxHi    int
		wantFormatCanon string
	}{
		{"f16", 42949672960, 327680, 74000, 76000, "f16"},    // 40 GiB; ~75K tokens
		{"q4", 13421772800, 102400, 238000, 242000, "q4:32"}, // 12.5 GiB; ~240K tokens
	}
	for _, c := range cases {
		t.Run(c.format, func(t *testing.T) {
			var out bytes.Buffer
			root := newRootCmd(&out, &bytes.Buffer{})
			root.SetArgs([]string{"plan", "--model", "llama-3.1-70b", "--format", c.format, "--context", "131072", "--json"})
			require.NoError(t, root.Execute())
			var rep map[string]any
			require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
			assert.EqualValues(t, c.bytes, rep["bytes"])
			assert.EqualValues(t, c.bytesPerToken, rep["bytes_per_token"])
			assert.EqualValues(t, 131072, rep["context"])
			assert.Equal(t, "llama-3.1-70b", rep["model"])
			assert.Equal(t, c.wantFormatCanon, rep["format"])
			assert.NotContains(t, rep, "max_context", "no --memory: no max context, not 0")

			out.Reset()
			root = newRootCmd(&out, &bytes.Buffer{})
			root.SetArgs([]string{"plan", "--model", "llama-3.1-70b", "--format", c.format, "--context", "131072",
				"--memory", "64GiB", "--weights", "39.1GiB", "--overhead", "2GiB", "--json"})
			require.NoError(t, root.Execute())
			rep = nil
			require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
			assert.EqualValues(t, c.bytes, rep["bytes"])
			maxCtx := int(rep["max_context"].(float64))
			assert.GreaterOrEqual(t, maxCtx, c.maxLo)
			assert.LessOrEqual(t, maxCtx, c.maxHi)
			assert.Equal(t, c.format == "q4", rep["fits"])
		})
	}
}

func TestPlanHumanOutput(t *testing.T) {
	var out bytes.Buffer
	root := newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs([]string{"plan", "--model", "llama-3.1-70b", "--format", "f16", "--context", "131072",
		"--memory", "64GiB", "--weights", "39.1GiB", "--overhead", "2GiB"})
	require.NoError(t, root.Execute())
	s := out.String()
	assert.Contains(t, s, "42949672960 bytes (40 GiB)")
	assert.Contains(t, s, "max context: 75008 tokens")
	assert.Contains(t, s, "GQA 64q/8kv d128 f16")
}

func TestPlanHybridAndConfigFile(t *testing.T) {
	var out bytes.Buffer
	root := newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs([]string{"plan", "--model", "../../gokv/testdata/hf/gemma-3-12b-it.json", "--format", "kivi2", "--context", "32768", "--json"})
	require.NoError(t, root.Execute())
	var rep planReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	require.Len(t, rep.Kinds, 2, "sliding and full layers")
	var sum int64
	for _, k := range rep.Kinds {
		sum += k.Bytes
	}
	assert.Equal(t, rep.Bytes, sum)
	assert.Equal(t, 48, rep.Kinds[0].Count+rep.Kinds[1].Count)
	for _, k := range rep.Kinds {
		assert.Positive(t, k.PageMetaBytes, "%s %s: a quantized page holds scales and biases", k.Layer, k.Format)
		assert.Less(t, k.PageMetaBytes, k.PageBytes)
	}
}

// TestPlanEvictions: --eviction reports the bytes a decode step reads under each policy, and the memory
// Quest's key bounds add.
func TestPlanEvictions(t *testing.T) {
	var out bytes.Buffer
	root := newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs([]string{"plan", "--json", "--model", "llama-3.1-8b", "--format", "q4", "--context", "131072",
		"--eviction", "full,quest:16:64,h2o:1/8:64,snapkv:4096:32,sinkwindow:4:4092"})
	require.NoError(t, root.Execute())
	var rep planReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	require.Len(t, rep.Evictions, 5)
	full, quest, h2o, snap, sw := rep.Evictions[0], rep.Evictions[1], rep.Evictions[2], rep.Evictions[3], rep.Evictions[4]
	assert.Equal(t, rep.DecodeReadBytes, full.DecodeReadBytes)
	assert.Equal(t, 1.0, full.ReadFraction)
	assert.Equal(t, rep.Bytes, full.Bytes)
	assert.Zero(t, full.BoundsBytes)
	// 8B: 32 layers x 8 kv heads x d 128; q4:32 pages of 64 tokens = 81920 B, bounds 8 x 2 x 128 x 2 = 4096 B.
	pages := int64(131072 / 64)
	assert.Equal(t, 32*pages*4096, quest.BoundsBytes)
	assert.Equal(t, rep.Bytes+quest.BoundsBytes, quest.Bytes)
	assert.Equal(t, 32*(18*81920+pages*4096), quest.DecodeReadBytes, "16 pages + the sink page + the recent page, and every page's bounds")
	assert.InDelta(t, 1.0/8, h2o.ReadFraction, 1e-9)
	assert.InDelta(t, 4096.0/131072, snap.ReadFraction, 1e-9)
	assert.InDelta(t, 4096.0/131072, sw.ReadFraction, 1e-9)

	out.Reset()
	root = newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs([]string{"plan", "--model", "llama-3.1-8b", "--format", "q4", "--context", "131072", "--eviction", "quest:16"})
	require.NoError(t, root.Execute())
	assert.Contains(t, out.String(), "quest:16:1")
	assert.Contains(t, out.String(), "of which bounds")
}

func TestPlanErrors(t *testing.T) {
	for _, c := range []struct {
		args     []string
		contains string
	}{
		{[]string{"plan", "--format", "q4"}, "--model is required"},
		{[]string{"plan", "--model", "nope", "--format", "q4"}, "nope"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--format", "q3"}, "--format"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--memory", "64XB"}, "--memory"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--weights", "10GB"}, "need --memory"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--memory", "8GB", "--weights", "10GB"}, "exceed"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--memory", "0.0000001"}, "--memory 0.0000001 is less than one byte"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--memory", "0.4B"}, "--memory 0.4B is less than one byte"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--memory", "0"}, "--memory 0 must be at least one byte"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--memory", "8GB", "--weights", "0.0000001"}, "--weights 0.0000001 is less than one byte"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--memory", "8GB", "--overhead", "0.1 B"}, "--overhead 0.1 B is less than one byte"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--memory", "-8GB"}, `size "-8GB" is negative`},
		{[]string{"plan", "--model", "llama-3.1-8b", "--memory", "NaN"}, "not a finite number"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--memory", "1e9"}, "exponents are not supported"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--memory", "99999999999999999999"}, "too large"},
		// 7 EiB + 7 EiB wraps an int64: the check must not subtract its way to a positive budget.
		{[]string{"plan", "--model", "llama-3.1-8b", "--memory", "1", "--weights", "7EiB", "--overhead", "7EiB"}, "exceed the memory 1 B"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--sequences", "0"}, "--sequences 0 must be in [1, 1048576]"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--sequences", "-3"}, "--sequences -3 must be in [1, 1048576]"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--sequences", "1048577"}, "--sequences 1048577 must be in [1, 1048576]"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--context", "-5"}, "--context -5 must be in [0, 2^31-1]"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--context", "2147483648"}, "--context 2147483648 must be in [0, 2^31-1]"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--page-size", "-8"}, "--page-size -8 must be a multiple of 8"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--eviction", "quest:0"}, "PAGES must be an integer >= 1"},
		{[]string{"plan", "--model", "llama-3.1-8b", "--eviction", "lru"}, `--eviction "lru"`},
		{[]string{"plan", "--model", "llama-3.1-8b", "--eviction", "h2o:8:64"}, "Budget must be > Recent"},
	} {
		root := newRootCmd(&bytes.Buffer{}, &bytes.Buffer{})
		root.SetArgs(c.args)
		err := root.Execute()
		require.Error(t, err, "%v", c.args)
		assert.Contains(t, err.Error(), c.contains)
	}
}

// Figures beyond an int64 saturate and say so; no byte count may wrap negative, in text or JSON.
func TestPlanSaturatedBytes(t *testing.T) {
	args := []string{"plan", "--model", "llama-3.1-70b", "--context", "2147483647", "--sequences", "1048576", "--memory", "64GiB"}

	var out bytes.Buffer
	root := newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs(append(args, "--json"))
	require.NoError(t, root.Execute())
	var rep planReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	assert.Equal(t, int64(math.MaxInt64), rep.Bytes)
	assert.True(t, rep.BytesSaturated)
	require.Len(t, rep.Kinds, 1)
	assert.Equal(t, int64(math.MaxInt64), rep.Kinds[0].Bytes)
	assert.True(t, rep.Kinds[0].BytesSaturated)
	assert.True(t, rep.Kinds[0].LayerBytesSaturated)
	require.NotNil(t, rep.Fits)
	assert.False(t, *rep.Fits)
	require.NotNil(t, rep.MaxContext)
	assert.Zero(t, *rep.MaxContext, "one page per layer of 2^20 sequences is 20 TiB")

	out.Reset()
	root = newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs(args)
	require.NoError(t, root.Execute())
	text := out.String()
	assert.Contains(t, text, "more than 8 EiB")
	assert.Contains(t, text, "more than 9223372036854775807 bytes (8 EiB)")
	assert.NotContains(t, text, "-80")
	assert.Contains(t, text, "max context: 0 (not even one token per sequence fits)")

	// Far-but-representable figures stay exact: 2 sequences x 32 layers x 2^25 pages x 256 KiB = 512 TiB.
	out.Reset()
	root = newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs([]string{"plan", "--model", "llama-3.1-8b", "--context", "2147483647", "--sequences", "2", "--json"})
	require.NoError(t, root.Execute())
	rep = planReport{}
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	assert.False(t, rep.BytesSaturated)
	assert.Equal(t, int64(2*32*(1<<25)*(256<<10)), rep.Bytes)
}

// A name from a config.json cannot drive the terminal: escapes and control characters print as '?'.
func TestPlanConfigNameIsSanitized(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	config := `{"model_type":"llama","num_hidden_layers":2,"num_attention_heads":8,"hidden_size":1024,` +
		`"_name_or_path":"\u001b]0;pwned\u0007\u001b[2J\u009b31mred\u202e"}`
	require.NoError(t, os.WriteFile(path, []byte(config), 0o600))
	for _, asJSON := range []bool{false, true} {
		var out bytes.Buffer
		root := newRootCmd(&out, &bytes.Buffer{})
		args := []string{"plan", "--model", path, "--context", "1024"}
		if asJSON {
			args = append(args, "--json")
		}
		root.SetArgs(args)
		require.NoError(t, root.Execute())
		assert.NotContains(t, out.String(), "\x1b")
		assert.NotContains(t, out.String(), "\u009b")
		assert.NotContains(t, out.String(), "\u202e")
		assert.NotContains(t, out.String(), "\a")
		assert.Contains(t, out.String(), "?]0;pwned??[2J?31mred?")
	}
}

// A file that never ends (/dev/zero) fails at the size limit instead of reading forever.
func TestPlanModelDevZero(t *testing.T) {
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip("no /dev/zero")
	}
	root := newRootCmd(&bytes.Buffer{}, &bytes.Buffer{})
	root.SetArgs([]string{"plan", "--model", "/dev/zero"})
	err := root.Execute()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "larger than 1 MiB")
	assert.Contains(t, err.Error(), "/dev/zero")
}
