package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/spf13/cobra"

	"github.com/gokv/gokv/gokv"
)

type attendOpts struct {
	q, k, v, sinks, out string
	format, backend     string
	window, sinkTokens  int
	scale               float64
	mla                 bool
	mlaDV               int
	threads, chunk      int
	json                bool
}

func newAttendCmd(g *globalOpts) *cobra.Command {
	o := &attendOpts{}
	cmd := &cobra.Command{
		Use:   "attend",
		Short: "Attention over K/V read from .npy files, stored through a chosen format",
		Long: `attend stores K and V through a format into a fresh page pool (one sequence, quantized on write as
gokv does) and runs the fused attention kernel on it, writing the output as a float32 .npy file.

Shapes (C order; float16, float32 or float64):
  --q      [Hq, d_qk]     one decode query at position S-1, or
           [T, Hq, d_qk]  prefill: the last T positions S-T .. S-1, causal
  --k      [S, Hkv, d_qk]
  --v      [S, Hkv, d_v]  (omit with --mla: V is the first --mla-dv dims of K)
  --sinks  [Hq]           learned sink logits (gpt-oss), optional
  --out    [Hq, d_v] or [T, Hq, d_v]

Query head h reads kv head h / (Hq / Hkv). With --window W a query at position p sees positions > p-W
plus the first --sink-tokens positions. The scale defaults to 1/sqrt(d_qk).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAttend(cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.q, "q", "", "queries .npy: [Hq, d_qk] (decode) or [T, Hq, d_qk] (prefill)")
	f.StringVar(&o.k, "k", "", "keys .npy: [S, Hkv, d_qk]")
	f.StringVar(&o.v, "v", "", "values .npy: [S, Hkv, d_v] (not with --mla)")
	f.StringVar(&o.sinks, "sinks", "", "learned sink logits .npy: [Hq] (optional)")
	f.StringVar(&o.out, "out", "", "output .npy (float32)")
	f.StringVar(&o.format, "format", "f32", "storage format: f32, f16, q8:G, q4:G, kivi2:G:R, kivi4:G:R")
	f.IntVar(&o.window, "window", 0, "sliding window W (0: none)")
	f.IntVar(&o.sinkTokens, "sink-tokens", 0, "first positions always visible under --window (StreamingLLM uses 4)")
	f.Float64Var(&o.scale, "scale", 0, "softmax scale α (0: 1/sqrt(d_qk))")
	f.BoolVar(&o.mla, "mla", false, "MLA absorbed form: V is the first --mla-dv dims of K")
	f.IntVar(&o.mlaDV, "mla-dv", 0, "with --mla: d_v, the value dims (DeepSeek: 512 of 576)")
	f.StringVar(&o.backend, "backend", "auto", "backend: cpu, vulkan, metal, sycl or auto")
	f.IntVar(&o.threads, "threads", 0, "CPU worker threads (0: all online CPUs)")
	f.IntVar(&o.chunk, "chunk", 0, "split-K chunk in tokens (0: backend default)")
	f.BoolVar(&o.json, "json", false, "print a JSON summary")
	for _, req := range []string{"q", "k", "out"} {
		_ = cmd.MarkFlagRequired(req)
	}
	return cmd
}

// attendInputs are the validated tensors of an attend call.
type attendInputs struct {
	q, k, v, sinks []float32
	T, S, Hq, Hkv  int
	dk, dv         int
	decode         bool // q was [Hq, d_qk]
}

// loadAttendInputs reads the .npy files and checks every dimension, naming the file and dims at fault.
func loadAttendInputs(o *attendOpts) (attendInputs, error) {
	var in attendInputs
	kt, err := readNPY(o.k)
	if err != nil {
		return in, err
	}
	if len(kt.Shape) != 3 {
		return in, fmt.Errorf("%s: keys have shape %s, want 3 dims [S, Hkv, d_qk]", o.k, shapeString(kt.Shape))
	}
	in.S, in.Hkv, in.dk, in.k = kt.Shape[0], kt.Shape[1], kt.Shape[2], kt.Data
	if in.S < 1 || in.Hkv < 1 || in.dk < 1 {
		return in, fmt.Errorf("%s: keys have shape %s, want every dim >= 1", o.k, shapeString(kt.Shape))
	}

	qt, err := readNPY(o.q)
	if err != nil {
		return in, err
	}
	switch len(qt.Shape) {
	case 2:
		in.T, in.Hq, in.decode = 1, qt.Shape[0], true
	case 3:
		in.T, in.Hq = qt.Shape[0], qt.Shape[1]
	default:
		return in, fmt.Errorf("%s: queries have shape %s, want [Hq, d_qk] (decode) or [T, Hq, d_qk] (prefill)", o.q, shapeString(qt.Shape))
	}
	in.q = qt.Data
	if qdk := qt.Shape[len(qt.Shape)-1]; qdk != in.dk {
		return in, fmt.Errorf("%s: queries have d_qk = %d (shape %s) but %s has d_qk = %d (shape %s)", o.q, qdk,
			shapeString(qt.Shape), o.k, in.dk, shapeString(kt.Shape))
	}
	if in.T < 1 || in.T > in.S {
		return in, fmt.Errorf("%s: %d query rows (shape %s), want 1..S = %d (the keys' positions, %s)", o.q, in.T,
			shapeString(qt.Shape), in.S, o.k)
	}
	if in.Hq < 1 || in.Hq%in.Hkv != 0 {
		return in, fmt.Errorf("%s: Hq = %d query heads is not a multiple of Hkv = %d kv heads of %s", o.q, in.Hq, in.Hkv, o.k)
	}

	if o.mla {
		if o.v != "" {
			return in, errors.New("--mla takes no --v: the values are the first --mla-dv dims of the keys")
		}
		if o.mlaDV < 1 || o.mlaDV > in.dk {
			return in, fmt.Errorf("--mla-dv %d must be in [1, d_qk = %d] (the keys' last dim, %s)", o.mlaDV, in.dk, o.k)
		}
		in.dv = o.mlaDV
	} else {
		if o.v == "" {
			return in, errors.New("--v is required (or --mla with --mla-dv)")
		}
		vt, err := readNPY(o.v)
		if err != nil {
			return in, err
		}
		if len(vt.Shape) != 3 || vt.Shape[0] != in.S || vt.Shape[1] != in.Hkv || vt.Shape[2] < 1 {
			return in, fmt.Errorf("%s: values have shape %s, want [S, Hkv, d_v] with S = %d and Hkv = %d from %s %s",
				o.v, shapeString(vt.Shape), in.S, in.Hkv, o.k, shapeString(kt.Shape))
		}
		in.dv, in.v = vt.Shape[2], vt.Data
	}

	if o.sinks != "" {
		st, err := readNPY(o.sinks)
		if err != nil {
			return in, err
		}
		if len(st.Shape) != 1 || st.Shape[0] != in.Hq {
			return in, fmt.Errorf("%s: sink logits have shape %s, want [Hq] = (%d,)", o.sinks, shapeString(st.Shape), in.Hq)
		}
		in.sinks = st.Data
	}
	return in, nil
}

// seqLayout is the page tables of n sequences of equal length in one pool: sequence i owns pages
// i*pagesPerSeq .. (i+1)*pagesPerSeq-1 and, for KIVI, residual slot i.
type seqLayout struct {
	pageSize, pagesPerSeq, seqs int
	pageIndptr, pageIDs         []int32
	residualSlot                []int32 // nil unless KIVI
}

func newSeqLayout(f gokv.Format, seqs, tokens int) seqLayout {
	l := seqLayout{pageSize: pageSizeFor(f), seqs: seqs}
	l.pagesPerSeq = max(1, (tokens+l.pageSize-1)/l.pageSize)
	l.pageIndptr = make([]int32, seqs+1)
	l.pageIDs = make([]int32, seqs*l.pagesPerSeq)
	for i := range l.pageIDs {
		l.pageIDs[i] = int32(i)
	}
	for i := range l.pageIndptr {
		l.pageIndptr[i] = int32(i * l.pagesPerSeq)
	}
	if f.Kind.IsKIVI() {
		l.residualSlot = make([]int32, seqs)
		for i := range l.residualSlot {
			l.residualSlot[i] = int32(i)
		}
	}
	return l
}

// newLayoutPool creates a pool holding the layout's sequences.
func newLayoutPool(eng *gokv.Engine, f gokv.Format, l seqLayout, hkv, dk, dv int, mla bool) (*gokv.PagedPool, error) {
	o := gokv.PagedPoolOptions{Format: f, KVHeads: hkv, HeadDimK: dk, HeadDimV: dv, VIsKPrefix: mla,
		PageSize: l.pageSize, Pages: len(l.pageIDs)}
	if f.Kind.IsKIVI() {
		o.ResidualSlots = l.seqs
	}
	return eng.NewPagedPool(o)
}

// writeSeq appends k [n, hkv, dk] and v [n, hkv, dv] (nil for MLA) to sequence seq, which holds start tokens.
func (l seqLayout) writeSeq(pool *gokv.PagedPool, seq, start int, k, v []float32, n int) error {
	w := gokv.PagedWrite{
		TokIndptr:  []int32{0, int32(n)},
		PageIndptr: []int32{0, int32(l.pagesPerSeq)},
		PageIDs:    l.pageIDs[seq*l.pagesPerSeq : (seq+1)*l.pagesPerSeq],
		StartPos:   []int32{int32(start)},
		K:          k, V: v,
	}
	if l.residualSlot != nil {
		w.ResidualSlot = l.residualSlot[seq : seq+1]
	}
	return pool.Write(w)
}

type attendSummary struct {
	Out     string  `json:"out"`
	Shape   []int   `json:"shape"`
	Format  string  `json:"format"`
	Backend string  `json:"backend"`
	Tokens  int     `json:"tokens"`
	Queries int     `json:"queries"`
	Scale   float64 `json:"scale"`
	Ms      float64 `json:"ms"` // the attention call only
}

func runAttend(w io.Writer, o *attendOpts) error {
	if err := checkOutputPath("--out", o.out); err != nil {
		return err
	}
	format, err := gokv.ParseFormat(o.format)
	if err != nil {
		return fmt.Errorf("--format: %w", err)
	}
	if o.window < 0 || o.sinkTokens < 0 {
		return fmt.Errorf("--window %d and --sink-tokens %d must be >= 0", o.window, o.sinkTokens)
	}
	in, err := loadAttendInputs(o)
	if err != nil {
		return err
	}
	if err := format.Validate(in.dk, in.dv); err != nil {
		return fmt.Errorf("--format %s with d_qk %d (%s) and d_v %d: %w", format, in.dk, o.k, in.dv, err)
	}
	scale := o.scale
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(in.dk))
	}
	if !(scale > 0) || math.IsInf(scale, 0) {
		return fmt.Errorf("--scale %g must be positive and finite", o.scale)
	}
	out, ms, backend, err := attendOnce(o, format, in, float32(scale))
	if err != nil {
		return err
	}
	shape := []int{in.T, in.Hq, in.dv}
	if in.decode {
		shape = shape[1:]
	}
	if err := writeNPY(o.out, tensor{Shape: shape, Data: out}); err != nil {
		return err
	}
	sum := attendSummary{Out: o.out, Shape: shape, Format: format.String(), Backend: backend, Tokens: in.S,
		Queries: in.T, Scale: scale, Ms: ms}
	if o.json {
		return writeJSON(w, sum)
	}
	fmt.Fprintf(w, "wrote %s %s: %d quer%s over %d tokens stored as %s on %s, %.3f ms\n", o.out, shapeString(shape),
		in.T, map[bool]string{true: "y", false: "ies"}[in.T == 1], in.S, format, backend, ms)
	return nil
}

// attendOnce stores the inputs' K/V in a fresh pool through format and attends the queries.
func attendOnce(o *attendOpts, format gokv.Format, in attendInputs, scale float32) ([]float32, float64, string, error) {
	eng, info, err := openEngine(o.backend, o.threads)
	if err != nil {
		return nil, 0, "", err
	}
	defer eng.Close()
	lay := newSeqLayout(format, 1, in.S)
	pool, err := newLayoutPool(eng, format, lay, in.Hkv, in.dk, in.dv, o.mla)
	if err != nil {
		return nil, 0, "", err
	}
	defer pool.Close()
	if err := lay.writeSeq(pool, 0, 0, in.k, in.v, in.S); err != nil {
		return nil, 0, "", err
	}
	out := make([]float32, in.T*in.Hq*in.dv)
	a := gokv.PagedAttend{
		QIndptr: []int32{0, int32(in.T)}, PageIndptr: lay.pageIndptr, PageIDs: lay.pageIDs,
		KVLen: []int32{int32(in.S)}, QPos: []int32{int32(in.S - in.T)}, ResidualSlot: lay.residualSlot,
		HeadsQ: in.Hq, Q: in.q, Out: out, Scale: scale, SinkLogits: in.sinks, SinkTokens: o.sinkTokens,
		Window: o.window, ChunkSize: o.chunk,
	}
	t0 := time.Now()
	if err := pool.Attend(a); err != nil {
		return nil, 0, "", err
	}
	return out, float64(time.Since(t0).Microseconds()) / 1e3, info.Backend, nil
}
