package llama

import (
	"encoding/binary"
	"os"
	"path/filepath"
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

// FuzzParseConfig: no config.json bytes make the parser panic; what it accepts is within its limits.
func FuzzParseConfig(f *testing.F) {
	for _, name := range []string{"tiny-llama", "tiny-sinks"} {
		data, err := os.ReadFile(filepath.Join(modelDir(name), "config.json"))
		require.NoError(f, err)
		f.Add(data)
	}
	f.Add(mustJSON(tinyConfig()))
	for _, bad := range []string{``, `{`, `[]`, `null`, `{"model_type":"llama"}`,
		`{"model_type":"llama","hidden_size":-1,"num_hidden_layers":2147483647}`,
		`{"model_type":"llama","hidden_size":1e300}`, `{"model_type":"llama","attention_sinks":"maybe"}`} {
		f.Add([]byte(bad))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseConfig(data)
		if err != nil {
			return
		}
		if c.Layers < 1 || c.Layers > maxLayers || c.HiddenSize < 1 || c.HiddenSize > maxDim || c.HeadsQ < 1 {
			t.Fatalf("accepted a config outside the limits: %+v", c)
		}
	})
}
