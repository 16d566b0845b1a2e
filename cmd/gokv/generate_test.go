package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// generate runs gokv generate and returns stdout and stderr.
func generate(t *testing.T, args ...string) (string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := newRootCmd(&out, &errOut)
	root.SetArgs(append([]string{"generate", "--backend", "cpu"}, args...))
	require.NoError(t, root.Execute())
	return out.String(), errOut.String()
}

// unescapedLen counts the bytes of generate's escaped text.
func unescapedLen(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			if s[i+1] == 'x' {
				i += 3
			} else {
				i++
			}
		}
		n++
	}
	return n
}

func TestGenerateGreedy(t *testing.T) {
	out, stats := generate(t, "--model", tinyLlama, "--prompt", "In the beginning", "--tokens", "12", "--format", "q8")
	require.True(t, strings.HasSuffix(out, "\n"))
	assert.Equal(t, 12, unescapedLen(strings.TrimSuffix(out, "\n")), "%q", out)
	assert.Contains(t, stats, "gokv generate: 12 tokens")
	assert.Contains(t, stats, "tokens/s decoding")
	assert.Contains(t, stats, "KV cache")
	assert.Contains(t, stats, "q8:32, none, cpu backend")
	again, _ := generate(t, "--model", tinyLlama, "--prompt", "In the beginning", "--tokens", "12", "--format", "q8")
	assert.Equal(t, out, again, "greedy is deterministic")
}

func TestGenerateJSONAndSampling(t *testing.T) {
	run := func(seed string) generateReport {
		out, stats := generate(t, "--model", tinySinks, "--prompt", "And", "--tokens", "16", "--temperature", "1",
			"--seed", seed, "--json", "--eviction", "sinkwindow:4:8")
		assert.Empty(t, stats, "--json puts everything on stdout")
		var rep generateReport
		require.NoError(t, json.Unmarshal([]byte(out), &rep))
		return rep
	}
	a, b, c := run("7"), run("7"), run("8")
	assert.Equal(t, a.Continuation, b.Continuation, "same seed, same sample")
	assert.Equal(t, "tiny-sinks", a.Model)
	assert.Equal(t, "sinkwindow:4:8", a.Eviction)
	assert.Equal(t, 4, a.PromptTokens)
	assert.Equal(t, 16, a.Tokens)
	assert.Equal(t, 16, unescapedLen(a.Continuation))
	assert.Positive(t, a.TokensPerSecond)
	assert.Positive(t, a.KVBytes)
	assert.NotEqual(t, a.Continuation, c.Continuation, "another seed, another sample")
}

func TestEscapeByte(t *testing.T) {
	for _, tc := range []struct {
		b    byte
		want string
	}{
		{'a', "a"}, {' ', " "}, {'~', "~"}, {'\n', "\n"}, {'\t', "\t"}, {'\\', `\\`}, {0, `\x00`}, {'\r', `\x0d`},
		{0x7f, `\x7f`}, {0xff, `\xff`},
	} {
		assert.Equal(t, tc.want, escapeByte(tc.b), "byte %#x", tc.b)
	}
}

func TestGenerateErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--prompt", "x"}, "--model is required"},
		{[]string{"--model", tinyLlama, "--tokens", "0"}, "--tokens 0"},
		{[]string{"--model", tinyLlama, "--temperature", "-1"}, "--temperature -1"},
		{[]string{"--model", tinyLlama, "--format", "q3"}, "--format"},
		{[]string{"--model", tinyLlama, "--eviction", "all"}, `--eviction "all"`},
		{[]string{"--model", tinyLlama, "--tokens", "600"}, "--prompt plus --tokens: 600 positions pass the model's max_position_embeddings 512"},
	} {
		_, msg := runCLI(t, append([]string{"generate", "--backend", "cpu"}, tc.args...)...)
		assert.Contains(t, msg, tc.want, "%v", tc.args)
	}
}

func TestEscapeLine(t *testing.T) {
	for _, tc := range []struct {
		toks []int
		want string
	}{
		{nil, ""},
		{[]int{'I', 'n', ' ', 'a'}, "In a"},
		{[]int{'a', '\n', 'b', '\t', 'c'}, `a\nb\tc`},
		{[]int{'\\', 0xab, '\r'}, `\\\xab\x0d`},
	} {
		assert.Equal(t, tc.want, escapeLine(tc.toks), "%v", tc.toks)
	}
}
