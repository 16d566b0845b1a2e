package llama

import (
	"errors"
	"fmt"
	"time"

	"github.com/gokv/gokv/gokv"
)

// Entry is one sequence of a batched step and the tokens it appends at positions Seq.Len(), Seq.Len()+1,
// ...: a whole prompt (prefill) or one token (decode); entries of both kinds may share a step.
type Entry struct {
	Seq    *gokv.Sequence
	Tokens []int
	// AllLogits asks for the logits of every new token (scoring a prefilled text); otherwise only the
	// last token's, which is all that decoding needs.
	AllLogits bool
}

// Output is one step's result.
type Output struct {
	// Logits has one slice per entry: [n][VocabSize] row-major, n = len(Tokens) with AllLogits, else 1.
	// Row j predicts the token after Tokens[j]. The slices are the caller's.
	Logits [][]float32
	Timing Timing
}

// Timing splits a step's wall time, so a caller can report attention against the whole step.
type Timing struct {
	Total     time.Duration // Step from start to return: embeddings, every layer, Begin and Commit, logits
	Attention time.Duration // inside Step.Layer: storing the new keys and values and the attention
	Rows      int           // new tokens in the step
}

// Runner runs batched forward steps of one model over one cache. It keeps scratch buffers between steps,
// so a Runner is for one goroutine at a time; use one Runner per goroutine (they may share the Model and
// the cache, on different sequences).
type Runner struct {
	m    *Model
	attn attention
	buf  scratch
}

// NewRunner returns a Runner whose attention goes through cache, which must have been made for m.Spec()
// with the model's sink logits (Model.NewCache does both).
func (m *Model) NewRunner(cache *gokv.Cache) *Runner {
	return &Runner{m: m, attn: cacheAttention{cache}}
}

// attention is where a step's attention runs: a gokv cache in every real use; the package's tests plug in
// a plain no-cache attention to check the cache against it.
type attention interface {
	// begin starts a step over entries and returns each entry's first position.
	begin(entries []Entry) (attentionStep, []int, error)
}

// attentionStep is one begun step: Layer per layer, then commit (or abort on an error).
type attentionStep interface {
	layer(l int, q, k, v, out []float32) error
	commit() error
	abort() error
}

// cacheAttention runs attention through gokv's Cache.Begin, Step.Layer and Step.Commit.
type cacheAttention struct{ c *gokv.Cache }

func (a cacheAttention) begin(entries []Entry) (attentionStep, []int, error) {
	se := make([]gokv.StepEntry, len(entries))
	for i, e := range entries {
		ids := make([]int32, len(e.Tokens)) // the cache names the pages they fill, for prefix reuse
		for j, t := range e.Tokens {
			ids[j] = int32(t)
		}
		se[i] = gokv.StepEntry{Seq: e.Seq, NewTokens: len(e.Tokens), Tokens: ids}
	}
	st, err := a.c.Begin(se...)
	if err != nil {
		return nil, nil, err
	}
	pos := make([]int, len(entries))
	for i := range pos {
		pos[i] = st.StartPos(i)
	}
	return cacheStep{st}, pos, nil
}

type cacheStep struct{ st *gokv.Step }

func (s cacheStep) layer(l int, q, k, v, out []float32) error { return s.st.Layer(l, q, k, v, out) }
func (s cacheStep) commit() error                             { return s.st.Commit() }
func (s cacheStep) abort() error                              { return s.st.Abort() }

// scratch holds a step's activations, grown to the largest step seen.
type scratch struct {
	x, h, q, k, v, attn, proj, gate, up []float32
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// Step appends each entry's tokens to its sequence and returns the logits: one gokv step (Begin, one
// Layer call per layer with the batch's q, k, v after RoPE, Commit) inside the model's forward pass.
// A failed step is aborted, so the sequences keep their lengths and the step can be retried. Errors name
// the entry, token or layer at fault.
func (r *Runner) Step(entries ...Entry) (Output, error) {
	t0 := time.Now()
	c := r.m.Config
	if len(entries) == 0 {
		return Output{}, errors.New("llama: Step: no entries")
	}
	rows := 0
	for i, e := range entries {
		if len(e.Tokens) == 0 {
			return Output{}, fmt.Errorf("llama: Step: entry %d has no tokens", i)
		}
		for j, t := range e.Tokens {
			if t < 0 || t >= c.VocabSize {
				return Output{}, fmt.Errorf("llama: Step: entry %d token %d is %d, outside the vocabulary [0, %d)", i, j, t, c.VocabSize)
			}
		}
		rows += len(e.Tokens)
	}
	st, start, err := r.attn.begin(entries)
	if err != nil {
		return Output{}, fmt.Errorf("llama: Step: %w", err)
	}
	timing := Timing{Rows: rows}
	if err := r.layers(st, entries, start, rows, &timing); err != nil {
		return Output{}, errors.Join(err, st.abort())
	}
	if err := st.commit(); err != nil {
		return Output{}, errors.Join(fmt.Errorf("llama: Step: %w", err), st.abort())
	}
	out := Output{Logits: r.logits(entries, rows)}
	timing.Total = time.Since(t0)
	out.Timing = timing
	return out, nil
}

// layers runs the decoder layers over the step's rows, leaving the residual stream in r.buf.x.
func (r *Runner) layers(st attentionStep, entries []Entry, start []int, rows int, timing *Timing) error {
	c := r.m.Config
	H, qDim, kvDim := c.HiddenSize, c.HeadsQ*c.HeadDim, c.HeadsKV*c.HeadDim
	b := &r.buf
	b.x, b.h = grow(b.x, rows*H), grow(b.h, rows*H)
	b.q, b.attn = grow(b.q, rows*qDim), grow(b.attn, rows*qDim)
	b.k, b.v = grow(b.k, rows*kvDim), grow(b.v, rows*kvDim)
	b.proj = grow(b.proj, rows*H)
	b.gate, b.up = grow(b.gate, rows*c.IntermediateSize), grow(b.up, rows*c.IntermediateSize)

	row := 0
	for _, e := range entries {
		for _, t := range e.Tokens {
			copy(b.x[row*H:(row+1)*H], r.m.w.embed.Data[t*H:(t+1)*H])
			row++
		}
	}
	half := c.HeadDim / 2
	cosBuf, sinBuf := make([]float32, half), make([]float32, half)
	for l := range r.m.w.layers {
		w := &r.m.w.layers[l]
		rmsNorm(b.h, b.x, w.inputNorm, c.RMSNormEps)
		linear(b.q, b.h, w.q)
		linear(b.k, b.h, w.k)
		linear(b.v, b.h, w.v)
		row := 0
		for i, e := range entries {
			for j := range e.Tokens {
				cos, sin := r.m.ropeAt(start[i]+j, cosBuf, sinBuf)
				rope(b.q[row*qDim:(row+1)*qDim], c.HeadDim, cos, sin)
				rope(b.k[row*kvDim:(row+1)*kvDim], c.HeadDim, cos, sin)
				row++
			}
		}
		ta := time.Now()
		err := st.layer(l, b.q, b.k, b.v, b.attn)
		timing.Attention += time.Since(ta)
		if err != nil {
			return fmt.Errorf("llama: Step: layer %d attention: %w", l, err)
		}
		linear(b.proj, b.attn, w.o)
		addInPlace(b.x, b.proj)
		rmsNorm(b.h, b.x, w.postNorm, c.RMSNormEps)
		linear(b.gate, b.h, w.gate)
		linear(b.up, b.h, w.up)
		swiGLU(b.gate, b.up)
		linear(b.proj, b.gate, w.down)
		addInPlace(b.x, b.proj)
	}
	return nil
}

// ropeAt returns cos and sin for position p: the table's rows within the trained context, else computed
// into the buffers.
func (m *Model) ropeAt(p int, cosBuf, sinBuf []float32) (cos, sin []float32) {
	half := m.Config.HeadDim / 2
	if p < m.Config.MaxPositions {
		return m.ropeCos[p*half : (p+1)*half], m.ropeSin[p*half : (p+1)*half]
	}
	ropeAngles(m.Config, p, cosBuf, sinBuf)
	return cosBuf, sinBuf
}

// logits applies the final norm and lm_head to the rows the entries ask for.
func (r *Runner) logits(entries []Entry, rows int) [][]float32 {
	c := r.m.Config
	H := c.HiddenSize
	var picked []int
	row := 0
	for _, e := range entries {
		n := len(e.Tokens)
		if e.AllLogits {
			for j := 0; j < n; j++ {
				picked = append(picked, row+j)
			}
		} else {
			picked = append(picked, row+n-1)
		}
		row += n
	}
	h := make([]float32, len(picked)*H)
	for i, p := range picked {
		rmsNorm(h[i*H:(i+1)*H], r.buf.x[p*H:(p+1)*H], r.m.w.norm, c.RMSNormEps)
	}
	all := make([]float32, len(picked)*c.VocabSize)
	linear(all, h, r.m.w.lmHead)
	out := make([][]float32, len(entries))
	at := 0
	for i, e := range entries {
		n := 1
		if e.AllLogits {
			n = len(e.Tokens)
		}
		out[i] = all[at*c.VocabSize : (at+n)*c.VocabSize : (at+n)*c.VocabSize]
		at += n
	}
	return out
}
