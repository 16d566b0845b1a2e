package gokv

import (
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// saveProcessChild names the saved file a child process of TestSavedConversationInANewProcess loads;
// saveProcessOut, where it writes its outputs.
const (
	saveProcessChild = "GOKV_TEST_LOAD_CHILD"
	saveProcessOut   = "GOKV_TEST_LOAD_OUT"
)

// conversationCache is the cache both processes open: same model, format and options.
func conversationCache(t *testing.T, f Format) *Cache {
	t.Helper()
	e := openTestEngine(t)
	c, err := e.NewCache(smallSpec(2, 32), CacheOptions{Format: f, PageSize: 32, MaxTokens: 2048, MaxSequences: 4})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// continueConversation is what both processes run after the save: a sequence reusing the saved one's
// prefix, the saved sequence's next turn and two decode steps, then (released) its cached pages and ring
// reused by another sequence; every output in order, and the tokens each reuse took.
func continueConversation(t *testing.T, c *Cache, s *Sequence, prompt []int32) []float32 {
	t.Helper()
	var out []float32
	add := func(outs [][]float32) {
		for _, o := range outs {
			out = append(out, o...)
		}
	}
	next := append(append([]int32(nil), prompt...), 77, 78)
	r, reused, err := c.NewSequenceFrom(next)
	require.NoError(t, err)
	out = append(out, float32(reused))
	add(promptStep(t, c, r, next[reused:]))
	conv := append(append([]int32(nil), prompt...), tokenRange(3000, 12)...)
	add(promptStep(t, c, s, conv[len(prompt):]))
	for i := range 2 {
		conv = append(conv, int32(4000+i))
		add(promptStep(t, c, s, conv[len(conv)-1:]))
	}
	require.NoError(t, s.Release())
	u, reused, err := c.NewSequenceFrom(append(conv, 5, 6, 7))
	require.NoError(t, err)
	require.Positive(t, reused, "the released conversation's pages (and KIVI ring) are reused")
	out = append(out, float32(reused))
	add(promptStep(t, c, u, append(conv, 5, 6, 7)[reused:]))
	return out
}

// TestSavedConversationInANewProcess: a conversation saved by this process and loaded by another one
// (the test binary again) continues there with outputs equal bit for bit to this process's own
// continuation, in q4 and in KIVI (pages and the fp16 ring).
func TestSavedConversationInANewProcess(t *testing.T) {
	if path := os.Getenv(saveProcessChild); path != "" {
		f := MustParseFormat(os.Getenv(saveProcessChild + "_FORMAT"))
		c := conversationCache(t, f)
		seqs, err := c.Load(path)
		require.NoError(t, err)
		require.Len(t, seqs, 1)
		prompt := tokenRange(1, 90)
		out := continueConversation(t, c, seqs[0], prompt)
		buf := make([]byte, 4*len(out))
		for i, x := range out {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
		}
		require.NoError(t, os.WriteFile(os.Getenv(saveProcessOut), buf, 0o600))
		return
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	for _, name := range []string{"q4:32", "kivi2:32:32"} {
		t.Run(name, func(t *testing.T) {
			c := conversationCache(t, MustParseFormat(name))
			s, err := c.NewSequence()
			require.NoError(t, err)
			prompt := tokenRange(1, 90)
			promptStep(t, c, s, prompt[:80])
			for _, tok := range prompt[80:] {
				promptStep(t, c, s, []int32{tok})
			}
			dir := t.TempDir()
			path, outPath := filepath.Join(dir, "conversation.gokv"), filepath.Join(dir, "out")
			require.NoError(t, c.Save(path, s))
			want := continueConversation(t, c, s, prompt)

			cmd := exec.Command(exe, "-test.run=^TestSavedConversationInANewProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), saveProcessChild+"="+path, saveProcessChild+"_FORMAT="+name, saveProcessOut+"="+outPath)
			msg, err := cmd.CombinedOutput()
			require.NoError(t, err, "the child process: %s", msg)
			buf, err := os.ReadFile(outPath)
			require.NoError(t, err)
			require.Len(t, buf, 4*len(want))
			got := make([]float32, len(want))
			for i := range got {
				got[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
			}
			requireSameFloats(t, want, got, "the new process's continuation")
		})
	}
}
