package llama

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// referenceTolerance is the largest relErr accepted against torch's logits: float32 sums in another
// order differ by ~1e-6 relative; 1e-3 is what models/*/README.md calls ample.
const referenceTolerance = 1e-3

// TestLogitsMatchTorch prefills reference.json's 65 ids and its 512 long ids as two entries of one batched
// step through an f32 cache, and compares every logit row with torch's: all 65 rows, and the long
// sequence at its 7 positions (0 to 511, the whole trained context).
func TestLogitsMatchTorch(t *testing.T) {
	eng := openCPU(t)
	for _, name := range testModels {
		t.Run(name, func(t *testing.T) {
			m, err := Load(modelDir(name))
			require.NoError(t, err)
			ref := loadReference(t, name)
			cache := newTestCache(t, eng, m, "f32", 1024)
			short, err := cache.NewSequence()
			require.NoError(t, err)
			long, err := cache.NewSequence()
			require.NoError(t, err)
			out, err := m.NewRunner(cache).Step(Entry{Seq: short, Tokens: ref.InputIDs, AllLogits: true},
				Entry{Seq: long, Tokens: ref.LongInputIDs, AllLogits: true})
			require.NoError(t, err)
			V := m.Config.VocabSize
			worst := 0.0
			got := rows(out.Logits[0], V)
			require.Len(t, got, len(ref.Logits))
			for p := range ref.Logits {
				e := relErr(got[p], ref.Logits[p])
				worst = max(worst, e)
				assert.Less(t, e, referenceTolerance, "position %d", p)
			}
			gotLong := rows(out.Logits[1], V)
			require.Len(t, gotLong, len(ref.LongInputIDs))
			for i, p := range ref.LongPositions {
				e := relErr(gotLong[p], ref.LongLogits[i])
				worst = max(worst, e)
				assert.Less(t, e, referenceTolerance, "long position %d", p)
			}
			t.Logf("%s: max relative logit error vs torch %.2e (65 + %d positions)", name, worst, len(ref.LongPositions))
		})
	}
}
