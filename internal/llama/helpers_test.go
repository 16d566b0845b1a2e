package llama

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/gokv"
)

// The committed test models: HF Llama layout, byte vocabulary (ids 0-255 bytes, 256 BOS).
var testModels = []string{"tiny-llama", "tiny-sinks"}

func modelDir(name string) string { return filepath.Join("..", "..", "models", name) }

// reference is a model's reference.json, written by models/train.py from the torch model.
type reference struct {
	InputIDs      []int       `json:"input_ids"`
	Logits        [][]float32 `json:"logits"`
	LongInputIDs  []int       `json:"long_input_ids"`
	LongPositions []int       `json:"long_positions"`
	LongLogits    [][]float32 `json:"long_logits"`
}

func loadReference(t *testing.T, name string) reference {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(modelDir(name), "reference.json"))
	require.NoError(t, err)
	var ref reference
	require.NoError(t, json.Unmarshal(data, &ref))
	require.Len(t, ref.Logits, len(ref.InputIDs))
	require.Len(t, ref.LongLogits, len(ref.LongPositions))
	return ref
}

// relErr is the agreement measure of every logit test: max_i |a_i - b_i| / max_i |b_i| over one row of
// logits, b the reference. Per row, because a row's scale is what its softmax sees.
func relErr(a, b []float32) float64 {
	var diff, scale float64
	for i := range b {
		diff = max(diff, math.Abs(float64(a[i])-float64(b[i])))
		scale = max(scale, math.Abs(float64(b[i])))
	}
	if scale == 0 {
		return diff
	}
	return diff / scale
}

// openCPU opens the CPU backend (named, so that a vulkan build tag does not move these tests to a GPU).
func openCPU(t *testing.T) *gokv.Engine {
	t.Helper()
	if len(gokv.Backends()) == 0 {
		t.Skip("no native backend: built without cgo")
	}
	eng, err := gokv.Open(gokv.WithBackend("cpu"))
	require.NoError(t, err)
	t.Cleanup(func() { eng.Close() })
	return eng
}

// newTestCache makes a cache for m in format f holding maxTokens tokens.
func newTestCache(t *testing.T, eng *gokv.Engine, m *Model, f string, maxTokens int) *gokv.Cache {
	t.Helper()
	c, err := m.NewCache(eng, gokv.CacheOptions{Format: gokv.MustParseFormat(f), MaxTokens: maxTokens, MaxSequences: 8})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// rows splits flat logits into rows of vocab.
func rows(flat []float32, vocab int) [][]float32 {
	var out [][]float32
	for i := 0; i+vocab <= len(flat); i += vocab {
		out = append(out, flat[i:i+vocab])
	}
	return out
}
