package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/gokv"
)

var benchKeys = []string{"backend", "format", "context", "batch", "heads_q", "heads_kv", "head_dim", "threads", "ms",
	"ms_p10", "ms_p90", "gbps", "gflops", "floor_ms", "floor_frac", "baseline_ms", "speedup_vs_baseline", "cos_vs_f32", "eviction", "bytes_read"}

func TestBenchJSONKeys(t *testing.T) {
	var out bytes.Buffer
	root := newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs([]string{"bench", "--json", "-q", "--backend", "cpu", "--formats", "f16,q4,kivi2:32:32", "--contexts", "96,200",
		"--batch", "1,2", "--heads-q", "4", "--heads-kv", "2", "--head-dim", "32", "--min-time", "1ms", "--read-mib", "8"})
	require.NoError(t, root.Execute())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 3*2*2, "one line per format x context x batch")
	for _, line := range lines {
		var row map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &row), line)
		keys := make([]string, 0, len(row))
		for k := range row {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		want := slices.Clone(benchKeys)
		slices.Sort(want)
		assert.Equal(t, want, keys)
		assert.Equal(t, "cpu", row["backend"])
		assert.Greater(t, row["ms"], 0.0)
		assert.LessOrEqual(t, row["ms_p10"], row["ms"], "the 10th percentile is at most the median")
		assert.LessOrEqual(t, row["ms"], row["ms_p90"], "the median is at most the 90th percentile")
		assert.Greater(t, row["floor_ms"], 0.0)
		assert.Greater(t, row["cos_vs_f32"], 0.5)
		assert.LessOrEqual(t, row["cos_vs_f32"], 1.0+1e-9)
		assert.NotNil(t, row["baseline_ms"], "the CPU backend has the dequantize baseline")
		if row["format"] == "f16" {
			assert.Greater(t, row["cos_vs_f32"], 0.99999)
		}
	}
}

func TestBenchPrefillRows(t *testing.T) {
	var out bytes.Buffer
	root := newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs([]string{"bench", "--json", "-q", "--backend", "cpu", "--formats", "q4", "--contexts", "128",
		"--heads-q", "2", "--heads-kv", "1", "--head-dim", "32", "--min-time", "1ms", "--read-mib", "8", "--prefill", "--prefill-tokens", "16"})
	require.NoError(t, root.Execute())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2)
	var decode, prefill map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &decode))
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &prefill))
	assert.NotContains(t, decode, "mode")
	assert.Equal(t, "prefill", prefill["mode"])
	assert.EqualValues(t, 16, prefill["prefill_tokens"])
	assert.Greater(t, prefill["gflops"], 0.0)
}

func TestBenchErrors(t *testing.T) {
	for _, c := range []struct {
		args     []string
		contains string
	}{
		{[]string{"bench", "--formats", "q4:128", "--head-dim", "64"}, "q4:128"},
		{[]string{"bench", "--heads-q", "6", "--heads-kv", "4"}, "--heads-q"},
		{[]string{"bench", "--contexts", "4K,x"}, "--contexts"},
		{[]string{"bench", "--backend", "nope"}, "--backend nope"},
		{[]string{"bench", "--eviction", "quest:0"}, "PAGES must be an integer >= 1"},
		{[]string{"bench", "--eviction", "h2o:x:4"}, "a token count or a fraction"},
		{[]string{"bench", "--eviction", "lru"}, `--eviction "lru"`},
	} {
		root := newRootCmd(&bytes.Buffer{}, &bytes.Buffer{})
		root.SetArgs(append(c.args, "-q"))
		err := root.Execute()
		require.Error(t, err, "%v", c.args)
		assert.Contains(t, err.Error(), c.contains)
	}
}

func TestBenchTextRows(t *testing.T) {
	var out bytes.Buffer
	root := newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs([]string{"bench", "-q", "--backend", "cpu", "--formats", "q4", "--contexts", "128", "--heads-q", "2",
		"--heads-kv", "1", "--head-dim", "32", "--min-time", "1ms", "--read-mib", "8"})
	require.NoError(t, root.Execute())
	text := out.String()
	assert.Contains(t, text, "p10-p90 ms")
	assert.Regexp(t, `(?m)^decode\s+q4:32\s+full\s+128\s+1\s+\d+\.\d{3}\s+\d+\.\d{3}-\d+\.\d{3}\s`, text, "a decode row with its spread")
}

// TestBenchEvictionRows: one decode row per format and policy; the policies read fewer bytes than full,
// the baseline only for full; Quest rows where the device has Quest kernels, else a clear refusal.
func TestBenchEvictionRows(t *testing.T) {
	var out bytes.Buffer
	root := newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs([]string{"bench", "--json", "-q", "--backend", "cpu", "--formats", "q4,kivi2:32:32", "--contexts", "1024",
		"--heads-q", "4", "--heads-kv", "2", "--head-dim", "32", "--min-time", "1ms", "--read-mib", "8",
		"--eviction", "full,h2o:1/8:16,snapkv:128:16,sinkwindow:4:60"})
	require.NoError(t, root.Execute())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2*4)
	full := map[string]float64{}
	for _, line := range lines {
		var row map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &row), line)
		f, ev, b := row["format"].(string), row["eviction"].(string), row["bytes_read"].(float64)
		assert.Positive(t, b, line)
		if ev == "full" {
			full[f] = b
			assert.NotNil(t, row["baseline_ms"])
			continue
		}
		assert.Nil(t, row["baseline_ms"], "no baseline for %s", ev)
		assert.Less(t, b, full[f]/4, "%s %s reads less", f, ev)
	}

	var text bytes.Buffer
	root = newRootCmd(&text, &bytes.Buffer{})
	root.SetArgs([]string{"bench", "-q", "--backend", "cpu", "--formats", "q4", "--contexts", "512", "--heads-q", "2",
		"--heads-kv", "1", "--head-dim", "32", "--min-time", "1ms", "--read-mib", "8", "--eviction", "quest:2:8"})
	err := root.Execute()
	eng, oerr := gokv.Open(gokv.WithBackend("cpu"), gokv.WithThreads(1))
	require.NoError(t, oerr)
	info, ierr := eng.Info()
	require.NoError(t, ierr)
	require.NoError(t, eng.Close())
	if !info.Caps.Quest {
		require.Error(t, err)
		assert.Contains(t, err.Error(), "no Quest kernels")
		return
	}
	require.NoError(t, err)
	assert.Contains(t, text.String(), "quest: the kernels score every page's key bounds")
	assert.Regexp(t, `(?m)^decode\s+q4:32\s+quest:2:8\s+512\s+1\s+`, text.String())
}

func TestPercentileNearestRank(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	assert.Equal(t, 1.0, percentile(xs, 0))
	assert.Equal(t, 1.0, percentile(xs, 0.1))
	assert.Equal(t, 5.0, percentile(xs, 0.5))
	assert.Equal(t, 9.0, percentile(xs, 0.9))
	assert.Equal(t, 10.0, percentile(xs, 1))
	assert.Equal(t, 7.0, percentile([]float64{7}, 0.9))
	assert.Equal(t, 0.0, percentile(nil, 0.5))
}

func TestTimeItRunsWithinBounds(t *testing.T) {
	calls := 0
	tm, err := timeIt(0, 3, 5, func() error { calls++; return nil })
	require.NoError(t, err)
	assert.GreaterOrEqual(t, tm.p10, 0.0)
	assert.LessOrEqual(t, tm.p10, tm.median)
	assert.LessOrEqual(t, tm.median, tm.p90)
	assert.GreaterOrEqual(t, calls, 3)
	assert.LessOrEqual(t, calls, 6)
}

// benchSmallArgs is a small bench case (three formats, two batches, decode and prefill) for the budget tests.
func benchSmallArgs(budget string) []string {
	return []string{"bench", "--json", "-q", "--backend", "cpu", "--formats", "f16,q4,kivi2:32:32", "--contexts", "256",
		"--batch", "1,3", "--heads-q", "4", "--heads-kv", "2", "--head-dim", "32", "--min-time", "1ms", "--read-mib", "8",
		"--prefill", "--prefill-tokens", "8", "--mem-budget", budget}
}

// benchSmallBytes is what benchSmallArgs' batch of 3 holds: the one-sequence f32 reference, the largest
// format pool, all the pools, and f16's baseline copy.
func benchSmallBytes(t *testing.T) (ref, largest, total, f16Copy int64) {
	t.Helper()
	formats, err := parseFormats("f16,q4,kivi2:32:32")
	require.NoError(t, err)
	f32 := gokv.Format{Kind: gokv.F32}
	ref, err = benchPoolBytes(f32, newSeqLayout(f32, 1, 256), 2, 32, false)
	require.NoError(t, err)
	var need []int64
	for _, f := range formats {
		n, err := benchPoolBytes(f, newSeqLayout(f, 3, 256), 2, 32, false)
		require.NoError(t, err)
		need, largest, total = append(need, n), max(largest, n), total+n
	}
	require.Greater(t, len(benchPasses(need, largest)), 1, "a budget of the largest pool takes passes")
	l := newSeqLayout(formats[0], 3, 256)
	f16Copy = int64(len(l.pageIDs)) * f32.PageBytes(2, 32, 32, l.pageSize, false)
	return ref, largest, total, f16Copy
}

func benchJSONRows(t *testing.T, out string) []map[string]any {
	t.Helper()
	var rows []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var row map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &row), line)
		rows = append(rows, row)
	}
	return rows
}

// TestBenchMemBudgetPasses: a budget that fits one pool at a time gives the rows of a budget that fits
// them all, in the same order, with the same data (cos_vs_f32 to the last bit) and bytes.
func TestBenchMemBudgetPasses(t *testing.T) {
	ref, largest, _, _ := benchSmallBytes(t)
	one, msg := runCLI(t, benchSmallArgs("1G")...)
	require.Empty(t, msg)
	many, msg := runCLI(t, benchSmallArgs(strconv.FormatInt(ref+largest, 10))...)
	require.Empty(t, msg)
	a, b := benchJSONRows(t, one), benchJSONRows(t, many)
	require.Len(t, a, 3*2*2, "format x batch x (decode, prefill)")
	require.Len(t, b, len(a))
	for i := range a {
		for _, k := range []string{"format", "batch", "mode", "cos_vs_f32", "bytes_read"} {
			assert.Equal(t, a[i][k], b[i][k], "row %d %s", i, k)
		}
	}
}

// TestBenchMemBudgetTooSmall: a pool that alone exceeds the budget is an error naming it and the flag.
func TestBenchMemBudgetTooSmall(t *testing.T) {
	ref, largest, _, _ := benchSmallBytes(t)
	_, msg := runCLI(t, benchSmallArgs(strconv.FormatInt(ref+largest-1, 10))...)
	assert.Contains(t, msg, "format f16 at context 256, batch 3")
	assert.Contains(t, msg, "more than the memory budget")
	assert.Contains(t, msg, "--mem-budget")
	_, msg = runCLI(t, benchSmallArgs("0")...)
	assert.Contains(t, msg, "--mem-budget")
}

// TestBenchBaselineSkipped: where the baseline's f32 copy does not fit beside the pools, the row has a
// null baseline ("-" in the table) and the rest of the row as usual.
func TestBenchBaselineSkipped(t *testing.T) {
	ref, _, total, f16Copy := benchSmallBytes(t)
	budget := ref + total
	require.Greater(t, total+f16Copy, budget)
	out, msg := runCLI(t, append(benchSmallArgs(strconv.FormatInt(budget, 10)), "--batch", "3")...)
	require.Empty(t, msg)
	for _, row := range benchJSONRows(t, out) {
		if row["format"] == "f16" {
			assert.Nil(t, row["baseline_ms"], "f16 at batch 3")
			assert.Nil(t, row["speedup_vs_baseline"])
			assert.Greater(t, row["ms"], 0.0)
			assert.Greater(t, row["cos_vs_f32"], 0.99999)
		}
	}
	args := slices.DeleteFunc(append(benchSmallArgs(strconv.FormatInt(budget, 10)), "--batch", "3"),
		func(s string) bool { return s == "--json" })
	text, msg := runCLI(t, args...)
	require.Empty(t, msg)
	assert.Contains(t, text, "memory budget:")
	assert.Regexp(t, `(?m)^decode\s+f16\s+full\s+256\s+3\s.*\s-\s+-\s+[01]\.\d{6}$`, text)
}

func TestBenchMemBudgetParse(t *testing.T) {
	for in, want := range map[string]int64{"8G": 8 << 30, "512m": 512 << 20, "12GB": 12e9, "4096": 4096, "1.5GiB": 3 << 29} {
		got, err := parseMemBudget(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	auto, err := parseMemBudget("auto")
	require.NoError(t, err)
	assert.Positive(t, auto)
	for _, in := range []string{"0", "-1G", "x", ""} {
		_, err := parseMemBudget(in)
		assert.Error(t, err, in)
	}
}
