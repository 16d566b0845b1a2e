package gokv

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Fuzz targets for the parsers that user input reaches: config.json files (plan, demo, bench --model),
// --memory style sizes and --format names. Run one with, e.g.
//
//	go test -run='^$' -fuzz='^FuzzFromHFConfig$' -fuzztime=10m -fuzzminimizetime=5s -parallel=1 ./gokv
//
// -fuzzminimizetime matters on small machines: Go's minimizer tries every subset of an interesting
// input's bytes (quadratic), so with the default 60 s per input a worker spends most of a run
// minimizing kilobyte inputs instead of fuzzing. Plain `go test` runs the seeds and the crashers kept
// under testdata/fuzz.

// FuzzFromHFConfig: any bytes give either an error or a spec that validates and stays within the
// documented limits, and nothing from the file reaches the name or an error message unprintable.
func FuzzFromHFConfig(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "hf", "*.json"))
	require.NoError(f, err)
	require.NotEmpty(f, files)
	for _, name := range files {
		data, err := os.ReadFile(name)
		require.NoError(f, err)
		f.Add(data)
	}
	const base = `"num_attention_heads":32,"num_key_value_heads":8,"hidden_size":4096`
	for _, seed := range []string{
		`{"num_hidden_layers":2147483647,` + base + `}`,
		`{"num_hidden_layers":4097,` + base + `}`,
		`{"num_hidden_layers":1e308,` + base + `}`,
		`{"num_hidden_layers":-1,` + base + `}`,
		`{"num_hidden_layers":"32",` + base + `}`,
		`{"num_hidden_layers":32.5,` + base + `}`,
		`{"num_hidden_layers":1e-400,` + base + `}`,
		`{"num_hidden_layers":2,` + base + `,"sliding_window":-5,"max_position_embeddings":-1}`,
		`{"num_hidden_layers":2,` + base + `,"sliding_window":4096,"sliding_window_pattern":-3}`,
		`{"num_hidden_layers":2,` + base + `,"sliding_window":4096,"use_sliding_window":true,"max_window_layers":1}`,
		`{"num_hidden_layers":2,"num_attention_heads":2048,"head_dim":128}`,
		`{"num_hidden_layers":2,"num_attention_heads":16384,"num_key_value_heads":1024,"head_dim":1024}`,
		`{"num_hidden_layers":2,"num_attention_heads":16,"kv_lora_rank":512,"qk_rope_head_dim":64}`,
		`{"num_hidden_layers":2,"num_attention_heads":16,"kv_lora_rank":2147483647,"qk_rope_head_dim":2147483647}`,
		`{"n_layer":2,"n_head":71,"n_embd":4544,"multi_query":true,"new_decoder_architecture":false}`,
		`{"model_type":"gemma3","text_config":{"num_hidden_layers":6,"num_attention_heads":8,"num_key_value_heads":4}}`,
		`{"model_type":"gpt_oss","num_hidden_layers":2,` + base + `,"sliding_window":128,"layer_types":["sliding_attention","full_attention"]}`,
		`{"num_hidden_layers":3,` + base + `,"sliding_window":8,"layer_types":["sliding_attention"]}`,
		`{"num_hidden_layers":4096,` + base + `,"sliding_window":8,"layer_types":[` +
			strings.TrimSuffix(strings.Repeat(`"sliding_attention",`, 4096), ",") + `]}`,
		`{"num_hidden_layers":2,` + base + `,"layer_types":[` + strings.TrimSuffix(strings.Repeat(`0,`, 100000), ",") + `]}`,
		`{"num_hidden_layers":2,` + base + `,"_name_or_path":"\u001b]0;title\u0007\u001b[2J\u009b31m\u202e\ud800"}`,
		`{"num_hidden_layers":2,` + base + `,"model_type":"\u001b[31m` + "\xff\xfe" + `"}`,
		strings.Repeat("[", 12000) + strings.Repeat("]", 12000),
		`{"a":` + strings.Repeat(`{"a":`, 5000) + `1` + strings.Repeat("}", 5001),
		`[1,2,3]`,
		`{"num_hidden_layers": 32,`,
		"\x00\xff garbage",
		``,
	} {
		f.Add([]byte(seed))
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := FromHFConfig(bytes.NewReader(data))
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "gokv: config.json") {
				t.Fatalf("error without the config.json prefix: %q", msg)
			}
			fuzzRequirePrintable(t, "error", msg)
			return
		}
		if len(data) > hfMaxConfigBytes {
			t.Fatalf("a %d-byte config loaded", len(data))
		}
		require.NoError(t, spec.Validate())
		if n := len(spec.Layers); n < 1 || n > hfMaxLayers {
			t.Fatalf("%d layers", n)
		}
		for i, l := range spec.Layers {
			if l.HeadsQ > hfMaxHeadsQ || l.HeadsKV > hfMaxHeadsKV || l.HeadDimK > hfMaxHeadDim || l.HeadDimV > hfMaxHeadDim ||
				l.Window < 0 || l.Window > hfMaxPositions {
				t.Fatalf("layer %d beyond the limits: %+v", i, l)
			}
		}
		if spec.MaxPositions < 0 || spec.MaxPositions > hfMaxPositions || spec.SinkTokens < 0 {
			t.Fatalf("MaxPositions %d, SinkTokens %d", spec.MaxPositions, spec.SinkTokens)
		}
		fuzzRequirePrintable(t, "name", spec.Name)
		if n := utf8.RuneCountInString(spec.Name); n > hfMaxNameRunes+3 {
			t.Fatalf("name of %d runes", n)
		}
		// What plan does next with a loaded config: any outcome but a panic or a negative figure.
		if res, err := Plan(spec, PlanOptions{Format: Format{Kind: F16}, Context: 4096}); err == nil && res.KVBytes < 0 {
			t.Fatalf("KVBytes %d", res.KVBytes)
		}
	})
}

// FuzzParseFormat: no panic; a success is a valid format whose String parses back to it.
func FuzzParseFormat(f *testing.F) {
	for _, seed := range []string{
		"f32", "f16", "F16", " q8 ", "q8:64", "q4", "q4:32", "q4:128", "kivi2", "kivi2:32:128", "kivi2:64",
		"kivi4:64:256", "KIVI4:32:0", "", "q3", "bf16", "f16:32", "q4:48", "q4:abc", "q4:32:128", "q8:0",
		"kivi2:32:100", "kivi2:32:-32", "kivi2:32:128:1", "kivi4:16", "q4:+32", "q4:032", "kivi2:32:65536",
		"kivi2:32:65568", "q4:99999999999999999999", ":", "q4:", "\u212aivi2", "q4\x00", "\xff",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		format, err := ParseFormat(s)
		if err != nil {
			fuzzRequireQuotedError(t, s, err)
			return
		}
		require.NoError(t, format.validateParams(), "ParseFormat(%q) = %+v", s, format)
		back, err := ParseFormat(format.String())
		require.NoError(t, err, "ParseFormat(%q).String() = %q", s, format.String())
		assert.Equal(t, format, back, "ParseFormat(%q)", s)
		text, err := format.MarshalText()
		require.NoError(t, err)
		assert.Equal(t, format.String(), string(text))
	})
}

// fuzzRequirePrintable fails when s holds a rune a terminal could act on, or invalid UTF-8.
func fuzzRequirePrintable(t *testing.T, what, s string) {
	t.Helper()
	if !utf8.ValidString(s) {
		t.Fatalf("%s is not valid UTF-8: %q", what, s)
	}
	for i, r := range s {
		if !unicode.IsPrint(r) {
			t.Fatalf("%s has %U at byte %d: %q", what, r, i, s)
		}
	}
}

// fuzzRequireQuotedError checks a parser's error: it quotes the input it refused and prints safely.
func fuzzRequireQuotedError(t *testing.T, input string, err error) {
	t.Helper()
	msg := err.Error()
	if !strings.Contains(msg, strconv.Quote(input)) {
		t.Fatalf("error does not quote the input %q: %s", input, msg)
	}
	fuzzRequirePrintable(t, "error", msg)
}
