package llama

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/nlpodyssey/safetensors"
)

// matrix is a linear layer's weight, row-major [Out, In]: y = W x.
type matrix struct {
	Out, In int
	Data    []float32
}

// layerWeights are one decoder layer's tensors.
type layerWeights struct {
	inputNorm, postNorm []float32 // [hidden]
	q, k, v, o          matrix
	gate, up, down      matrix
	sinks               []float32 // [HeadsQ], learned sink logits; nil without them
}

// weights are the whole model's tensors.
type weights struct {
	embed  matrix // [vocab, hidden]
	layers []layerWeights
	norm   []float32
	lmHead matrix // [vocab, hidden]; embed itself when tied
}

// maxWeightsBytes bounds the safetensors file read into memory: the forward pass keeps float32 weights in
// RAM, so a file past this is not a model this package can run.
const maxWeightsBytes = 16 << 30

// loadWeights reads a safetensors file and takes every tensor the config implies, checking its dtype and
// shape. The whole file is read (its size from the file system, bounded above), and the library checks the
// header against that size: every offset inside the file, every tensor's bytes matching its shape, the
// tensors tiling the data exactly. Nothing is allocated from a size the header claims.
func loadWeights(path string, c Config) (*weights, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	if st.Size() > maxWeightsBytes {
		return nil, fmt.Errorf("llama: %s: %d bytes, more than the %d this package loads", path, st.Size(), int64(maxWeightsBytes))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	return parseWeights(path, data, c)
}

// parseWeights takes the tensors out of a safetensors file's bytes; path is for the errors.
func parseWeights(path string, data []byte, c Config) (*weights, error) {
	if len(data) < 8 {
		return nil, fmt.Errorf("llama: %s: %d bytes: truncated (a safetensors file starts with an 8-byte header length)", path, len(data))
	}
	if n := binary.LittleEndian.Uint64(data); n > uint64(len(data)-8) {
		return nil, fmt.Errorf("llama: %s: header length %d runs past the end of the %d-byte file (truncated or not safetensors)", path, n, len(data))
	}
	file, err := safetensors.Deserialize(data)
	if err != nil {
		if have, claimed, ok := dataSizes(data); ok && claimed > have {
			return nil, fmt.Errorf("llama: %s: truncated: the header places tensor data up to byte %d after it, the file has %d", path, claimed, have)
		}
		return nil, fmt.Errorf("llama: %s: not a valid safetensors file (corrupt header or data): %w", path, err)
	}
	r := tensorReader{path: path, file: file}
	w := &weights{}
	h, v := c.HiddenSize, c.VocabSize
	kvDim := c.HeadsKV * c.HeadDim
	qDim := c.HeadsQ * c.HeadDim
	w.embed = r.matrix("model.embed_tokens.weight", v, h)
	w.norm = r.vector("model.norm.weight", h)
	if c.TiedEmbeddings {
		w.lmHead = w.embed
	} else {
		w.lmHead = r.matrix("lm_head.weight", v, h)
	}
	w.layers = make([]layerWeights, c.Layers)
	for i := range w.layers {
		p := "model.layers." + strconv.Itoa(i) + "."
		l := &w.layers[i]
		l.inputNorm = r.vector(p+"input_layernorm.weight", h)
		l.q = r.matrix(p+"self_attn.q_proj.weight", qDim, h)
		l.k = r.matrix(p+"self_attn.k_proj.weight", kvDim, h)
		l.v = r.matrix(p+"self_attn.v_proj.weight", kvDim, h)
		l.o = r.matrix(p+"self_attn.o_proj.weight", h, qDim)
		l.postNorm = r.vector(p+"post_attention_layernorm.weight", h)
		l.gate = r.matrix(p+"mlp.gate_proj.weight", c.IntermediateSize, h)
		l.up = r.matrix(p+"mlp.up_proj.weight", c.IntermediateSize, h)
		l.down = r.matrix(p+"mlp.down_proj.weight", h, c.IntermediateSize)
		if c.LearnedSinks {
			l.sinks = r.vector(p+"self_attn.sinks", c.HeadsQ)
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	if !c.LearnedSinks {
		for _, name := range file.Names() {
			if strings.HasSuffix(name, ".self_attn.sinks") {
				return nil, fmt.Errorf(`llama: %s: has tensor %s but config.json does not set "attention_sinks": "learned"`, path, name)
			}
		}
	}
	return w, nil
}

// tensorReader takes tensors out of one file, keeping the first error so the loader reads straight.
type tensorReader struct {
	path string
	file safetensors.SafeTensors
	err  error
}

func (r *tensorReader) matrix(name string, out, in int) matrix {
	return matrix{Out: out, In: in, Data: r.tensor(name, out, in)}
}

func (r *tensorReader) vector(name string, n int) []float32 { return r.tensor(name, n) }

// tensor returns a copy of the named float32 tensor after checking its dtype and shape.
func (r *tensorReader) tensor(name string, shape ...int) []float32 {
	if r.err != nil {
		return nil
	}
	t, ok := r.file.Tensor(name)
	if !ok {
		r.err = fmt.Errorf("llama: %s: tensor %s is missing", r.path, name)
		return nil
	}
	if t.DType() != safetensors.F32 {
		r.err = fmt.Errorf("llama: %s: tensor %s is %s, want F32", r.path, name, t.DType())
		return nil
	}
	got := t.Shape()
	want := make([]uint64, len(shape))
	for i, d := range shape {
		want[i] = uint64(d)
	}
	if !slices.Equal(got, want) {
		r.err = fmt.Errorf("llama: %s: tensor %s has shape %v, want %v (from config.json)", r.path, name, got, want)
		return nil
	}
	raw := t.Data()
	n := len(raw) / 4
	if n*4 != len(raw) || n != product(shape) {
		// The library checks this already; a mismatch here is a bug there, not bad input.
		r.err = errors.New("llama: " + r.path + ": tensor " + name + ": data length does not match its shape")
		return nil
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out
}

// dataSizes returns the bytes of tensor data after a safetensors header and the largest end offset the
// header claims, to tell a truncated file from a corrupt one; ok is false when the header does not parse.
// The caller has checked that the header lies within data.
func dataSizes(data []byte) (have, claimed uint64, ok bool) {
	n := binary.LittleEndian.Uint64(data)
	var header map[string]struct {
		DataOffsets [2]uint64 `json:"data_offsets"`
	}
	if json.Unmarshal(data[8:8+n], &header) != nil {
		return 0, 0, false
	}
	for _, t := range header {
		claimed = max(claimed, t.DataOffsets[1])
	}
	return uint64(len(data)) - 8 - n, claimed, true
}

func product(xs []int) int {
	p := 1
	for _, x := range xs {
		p *= x
	}
	return p
}
