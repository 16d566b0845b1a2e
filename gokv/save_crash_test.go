package gokv

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// saveCrashChild names the environment variable that makes the test binary a saving child: it saves two
// caches alternately to the path the variable gives, until it is killed.
const saveCrashChild = "GOKV_TEST_SAVE_CRASH_PATH"

// crashCaches builds the two caches the crash test alternates between, deterministically (the parent
// and every child build the same bytes): q4 pages of a few megabytes, stored without attention.
func crashCaches(t testing.TB, e *Engine) (a, b *Cache, as, bs []*Sequence) {
	t.Helper()
	spec := smallSpec(2, 128)
	opts := CacheOptions{Format: MustParseFormat("q4:32"), PageSize: 64, MaxTokens: 8192, MaxSequences: 4}
	build := func(seed uint64, tokens ...int) (*Cache, []*Sequence) {
		c, err := e.NewCache(spec, opts)
		require.NoError(t, err)
		rng := newRand(seed)
		var seqs []*Sequence
		for _, n := range tokens {
			s, err := c.NewSequence()
			require.NoError(t, err)
			st, err := c.Begin(StepEntry{Seq: s, NewTokens: n})
			require.NoError(t, err)
			in := genSaveInputs(spec, rng, n)
			for l := range spec.Layers {
				require.NoError(t, st.Layer(l, nil, in.k[l], in.v[l], nil))
			}
			require.NoError(t, st.Commit())
			seqs = append(seqs, s)
		}
		return c, seqs
	}
	a, as = build(21, 3000, 1000)
	b, bs = build(22, 2500, 2000)
	return a, b, as, bs
}

// TestSaveCrashLeavesOldOrNew: a process saving to one path again and again, killed with SIGKILL at random
// points, always leaves a file that loads as one of the two caches it saves, byte for byte.
func TestSaveCrashLeavesOldOrNew(t *testing.T) {
	if path := os.Getenv(saveCrashChild); path != "" {
		runSaveCrashChild(t, path)
		return
	}
	if testing.Short() {
		t.Skip("starts 30 processes")
	}
	e := openTestEngine(t)
	a, b, as, bs := crashCaches(t, e)
	defer a.Close()
	defer b.Close()
	dir := t.TempDir()
	pa, pb, path := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "cache.safetensors")
	start := time.Now()
	require.NoError(t, a.Save(pa, as...))
	saveTime := time.Since(start)
	require.NoError(t, b.Save(pb, bs...))
	fileA, fileB := mustRead(t, pa), mustRead(t, pb)
	require.NoError(t, a.Save(path, as...))
	target, err := e.NewCache(a.spec, a.opts)
	require.NoError(t, err)
	defer target.Close()

	exe, err := os.Executable()
	require.NoError(t, err)
	rng := newRand(23)
	seen := map[string]int{}
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; i < 30 && time.Now().Before(deadline); i++ {
		cmd := exec.Command(exe, "-test.run=^TestSaveCrashLeavesOldOrNew$", "-test.count=1")
		cmd.Env = append(os.Environ(), saveCrashChild+"="+path)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		ready := make(chan bool, 1)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if sc.Text() == "saving" {
					ready <- true
					break
				}
			}
			close(ready)
		}()
		select {
		case ok := <-ready:
			require.True(t, ok, "the child ended before it started saving")
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			require.Fail(t, "the child did not start saving")
		}
		// Kill it somewhere within its first few saves.
		time.Sleep(time.Duration(rng.Int64N(int64(4*saveTime) + 1)))
		require.NoError(t, cmd.Process.Kill())
		_ = cmd.Wait()

		data := mustRead(t, path)
		switch {
		case string(data) == string(fileA):
			seen["a"]++
		case string(data) == string(fileB):
			seen["b"]++
		default:
			require.Failf(t, "a killed Save left another file", "iteration %d: %d bytes, neither cache's file (%d or %d bytes)",
				i, len(data), len(fileA), len(fileB))
		}
		seqs, err := target.Load(path)
		require.NoError(t, err, "iteration %d", i)
		for _, s := range seqs {
			require.NoError(t, s.Release())
		}
	}
	t.Logf("after each kill the file was: %v (a save takes about %v)", seen, saveTime)
	assert.Positive(t, seen["b"], "no kill came after a save finished: the test proves little")
}

// runSaveCrashChild saves cache b then cache a to path, again and again, until the parent kills it.
func runSaveCrashChild(t *testing.T, path string) {
	e := openTestEngine(t)
	a, b, as, bs := crashCaches(t, e)
	os.Stdout.WriteString("saving\n")
	for {
		require.NoError(t, b.Save(path, bs...))
		require.NoError(t, a.Save(path, as...))
	}
}
