package llama

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseWeights: no safetensors bytes make the loader panic or allocate past the input; it returns
// weights or an error.
func FuzzParseWeights(f *testing.F) {
	good := safetensorsBytes(f, tinyTensors(false))
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add(good[:9])
	f.Add(binary.LittleEndian.AppendUint64(nil, 2))
	f.Add(append(binary.LittleEndian.AppendUint64(nil, 2), "{}"...))
	f.Add(append(binary.LittleEndian.AppendUint64(nil, 72),
		`{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}`...))
	cfg, err := parseConfig(mustJSON(tinyConfig()))
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := parseWeights("fuzz.safetensors", data, cfg)
		if err == nil && len(w.embed.Data) != cfg.VocabSize*cfg.HiddenSize {
			t.Fatalf("embeddings have %d values", len(w.embed.Data))
		}
	})
}
