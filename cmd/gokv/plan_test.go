package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Open-TQ-Metal figures of DESIGN.md §6 for Llama 3.1 70B.
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
			assert.Contains(t, rep, "max_context")

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
	} {
		root := newRootCmd(&bytes.Buffer{}, &bytes.Buffer{})
		root.SetArgs(c.args)
		err := root.Execute()
		require.Error(t, err, "%v", c.args)
		assert.Contains(t, err.Error(), c.contains)
	}
}
