package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/gokv"
)

// runCLI runs the command line with args and returns stdout and the error line main would print.
func runCLI(t *testing.T, args ...string) (string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := newRootCmd(&out, &errOut)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		return out.String(), errorLine(err)
	}
	return out.String(), ""
}

// TestErrorLineHasOnePrefix: the library's "gokv: " prefix, wrapped by a flag's message, is printed once.
func TestErrorLineHasOnePrefix(t *testing.T) {
	_, err := gokv.ParseFormat("q5")
	require.Error(t, err)
	line := errorLine(fmt.Errorf("--format: %w", err))
	assert.Equal(t, 1, strings.Count(line, "gokv:"), line)
	assert.True(t, strings.HasPrefix(line, "gokv: --format: "), line)
	assert.Equal(t, "gokv: plain", errorLine(errors.New("plain")))

	_, msg := runCLI(t, "attend", "--q", "x.npy", "--k", "y.npy", "--out", filepath.Join(t.TempDir(), "o.npy"), "--format", "q5")
	assert.Equal(t, 1, strings.Count(msg, "gokv:"), msg)
}

// TestOutputPathCheckedFirst: an empty --out, a missing or unwritable directory, or a directory in the
// file's place is reported before any input is read or computed (the inputs here do not even exist).
func TestOutputPathCheckedFirst(t *testing.T) {
	dir := t.TempDir()
	locked := filepath.Join(dir, "locked")
	require.NoError(t, os.Mkdir(locked, 0o500))
	for _, tc := range []struct {
		out, msg string
	}{
		{"", "--out is empty"},
		{filepath.Join(dir, "missing", "o.npy"), "does not exist"},
		{dir, "is a directory"},
		{filepath.Join(dir, "o.npy", "x"), ""}, // parent is not a directory: filled in below
	} {
		if tc.msg == "" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "o.npy"), nil, 0o644))
			tc.msg = "not a directory"
		}
		_, msg := runCLI(t, "attend", "--q", "no-such-q.npy", "--k", "no-such-k.npy", "--v", "no-such-v.npy", "--out", tc.out)
		assert.Contains(t, msg, tc.msg, "--out %q", tc.out)
		assert.NotContains(t, msg, "no-such", "--out %q: checked before the inputs", tc.out)
	}
	if os.Geteuid() != 0 { // root writes anywhere
		_, msg := runCLI(t, "attend", "--q", "no-such-q.npy", "--k", "no-such-k.npy", "--out", filepath.Join(locked, "o.npy"))
		assert.Contains(t, msg, "cannot write in directory")
	}
	_, msg := runCLI(t, "demo", "--model", "llama-3.1-8b", "--plot", filepath.Join(dir, "missing", "p.png"))
	assert.Contains(t, msg, "--plot")
	assert.Contains(t, msg, "does not exist")
}

// TestBenchReadMiBBounds: the bandwidth buffer must be at least 1 MiB.
func TestBenchReadMiBBounds(t *testing.T) {
	for _, v := range []string{"-1", "0", "70000"} {
		_, msg := runCLI(t, "bench", "-q", "--backend", "cpu", "--read-mib", v)
		assert.Contains(t, msg, "--read-mib "+v, v)
	}
}

// TestInfoCPUHasNoSubgroup: the CPU reports the SIMD width of its kernels, not a GPU subgroup size.
func TestInfoCPUHasNoSubgroup(t *testing.T) {
	out, msg := runCLI(t, "info")
	require.Empty(t, msg)
	cpu := out[strings.Index(out, "[cpu]"):]
	if i := strings.Index(cpu[1:], "\n["); i >= 0 {
		cpu = cpu[:i+1]
	}
	assert.Contains(t, cpu, "SIMD width:")
	assert.NotContains(t, cpu, "subgroup")
	out, _ = runCLI(t, "info", "--json")
	assert.Contains(t, out, `"simd_width"`)
}
