package gokv

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/bridge"
)

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed+1)) }

// needNative skips a test that needs a device in a build without cgo (CGO_ENABLED=0).
func needNative(t testing.TB) {
	t.Helper()
	if !bridge.CgoEnabled {
		t.Skip("needs the native backend: built without cgo")
	}
}

// openTestEngine opens the CPU backend with two worker threads and closes it when the test ends.
func openTestEngine(t testing.TB) *Engine {
	t.Helper()
	needNative(t)
	e, err := Open(WithBackend("cpu"), WithThreads(2))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	return e
}

// smallSpec is a small GQA model: layers layers of 4 query heads over 2 kv heads of dimension d.
func smallSpec(layers, d int) ModelSpec {
	spec := ModelSpec{Name: "small", SinkTokens: DefaultSinkTokens}
	for range layers {
		spec.Layers = append(spec.Layers, AttentionLayer(4, 2, d))
	}
	return spec
}

// tcache is a cache under test with the original K/V of every sequence, for the references.
type tcache struct {
	t    *testing.T
	c    *Cache
	spec ModelSpec
	rng  *rand.Rand
	// vis reports whether a query at position p of layer l sees token t (the expected visibility rule,
	// written independently of the cache's own rules).
	vis  func(l, p, t int) bool
	hist map[*Sequence]*thist
}

// thist holds a sequence's original rows: per layer, per position, keys [HeadsKV*dk] and values [HeadsKV*dv];
// and for compaction (compact_test.go) where each (layer, kv head)'s compacted slots came from and the
// rows as first read at each position.
type thist struct {
	k, v    [][][]float32
	slotPos map[[2]int][]int
	rows    map[[2]int]map[int][]float32
}

func newTCache(t *testing.T, e *Engine, spec ModelSpec, opts CacheOptions, seed uint64) *tcache {
	t.Helper()
	c, err := e.NewCache(spec, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	h := &tcache{t: t, c: c, spec: spec, rng: rand.New(rand.NewPCG(seed, seed+1)), hist: map[*Sequence]*thist{}}
	c.onCompact = h.compacted
	h.vis = func(l, p, tok int) bool {
		ls := spec.Layers[l]
		w, sinks := ls.Window, 0
		if w > 0 && !ls.LearnedSinks {
			sinks = spec.SinkTokens
		}
		if ev, _ := opts.Eviction.(*SinkWindow); ev != nil && (w == 0 || ev.Window < w) {
			w, sinks = ev.Window, max(sinks, ev.Sinks)
		}
		return w == 0 || tok > p-w || tok < sinks
	}
	for l, ls := range spec.Layers {
		if ls.LearnedSinks {
			logits := make([]float32, ls.HeadsQ)
			for i := range logits {
				logits[i] = float32(h.rng.NormFloat64())
			}
			require.NoError(t, c.SetSinkLogits(l, logits))
		}
	}
	return h
}

func (h *tcache) newSeq() *Sequence {
	h.t.Helper()
	s, err := h.c.NewSequence()
	require.NoError(h.t, err)
	h.hist[s] = &thist{k: make([][][]float32, len(h.spec.Layers)), v: make([][][]float32, len(h.spec.Layers))}
	return s
}

func (h *tcache) fork(s *Sequence) *Sequence {
	h.t.Helper()
	child, err := s.Fork()
	require.NoError(h.t, err)
	src := h.hist[s]
	dst := &thist{k: make([][][]float32, len(h.spec.Layers)), v: make([][][]float32, len(h.spec.Layers))}
	for l := range h.spec.Layers {
		dst.k[l] = append([][]float32(nil), src.k[l]...)
		dst.v[l] = append([][]float32(nil), src.v[l]...)
	}
	dst.slotPos, dst.rows = maps.Clone(src.slotPos), map[[2]int]map[int][]float32{}
	for key, m := range src.rows {
		dst.rows[key] = maps.Clone(m)
	}
	h.hist[child] = dst
	return child
}

func (h *tcache) truncate(s *Sequence, n int) {
	h.t.Helper()
	require.NoError(h.t, s.Truncate(n))
	for l := range h.spec.Layers {
		h.hist[s].k[l] = h.hist[s].k[l][:n]
		h.hist[s].v[l] = h.hist[s].v[l][:n]
	}
	for _, m := range h.hist[s].rows {
		maps.DeleteFunc(m, func(p int, _ []float32) bool { return p >= n })
	}
}

// stepData is one step's inputs and outputs per layer.
type stepData struct {
	q, k, v, out [][]float32
}

// gen draws the inputs of a step of rows tokens: keys with outlier channels, as real keys have.
func (h *tcache) gen(rows int) stepData {
	var d stepData
	for _, l := range h.spec.Layers {
		d.q = append(d.q, randVec(h.rng, rows*l.HeadsQ*l.HeadDimK, 1))
		k := randVec(h.rng, rows*l.HeadsKV*l.HeadDimK, 1)
		for r := 0; r < rows*l.HeadsKV; r++ {
			k[r*l.HeadDimK+l.HeadDimK/3] *= 6
		}
		d.k = append(d.k, k)
		if l.VIsKPrefix() {
			d.v = append(d.v, nil)
		} else {
			d.v = append(d.v, randVec(h.rng, rows*l.HeadsKV*l.HeadDimV, 1))
		}
		d.out = append(d.out, poisoned(rows*l.HeadsQ*l.HeadDimV))
	}
	return d
}

// tol is how close a step's output must be to the references.
type tol struct {
	deq  float64 // relative, vs the float64 reference over the dequantized cache (what the kernels see)
	orig float64 // relative, vs the reference over the original K/V; 0: check cosine instead
	cos  float64 // minimum cosine similarity per output row vs the original reference
}

func tolFor(f Format) tol {
	switch f.Kind {
	case F32:
		return tol{deq: 1e-3, orig: 1e-3}
	case F16:
		return tol{deq: 1e-3, orig: 5e-3}
	case Q8:
		return tol{deq: 1e-3, cos: 0.999}
	case Q4, KIVI4:
		return tol{deq: 1e-3, cos: 0.9}
	}
	return tol{deq: 1e-3, cos: 0.7}
}

// run runs one step over entries with fresh random data, checks every layer's output against both
// references with tolerance tl(layer), and commits it.
func (h *tcache) run(tl func(l int) tol, entries ...StepEntry) stepData {
	h.t.Helper()
	st, err := h.c.Begin(entries...)
	require.NoError(h.t, err)
	d := h.gen(st.Rows())
	for l := range h.spec.Layers {
		require.NoError(h.t, st.Layer(l, d.q[l], d.k[l], d.v[l], d.out[l]), "layer %d", l)
		requireWritten(h.t, d.out[l], "out")
	}
	// Record the new tokens' original rows, then compare before Commit evicts anything.
	row := 0
	for _, e := range entries {
		for j := 0; j < e.NewTokens; j++ {
			for l, ls := range h.spec.Layers {
				kr, vr := ls.HeadsKV*ls.HeadDimK, ls.HeadsKV*ls.HeadDimV
				h.hist[e.Seq].k[l] = append(h.hist[e.Seq].k[l], d.k[l][(row+j)*kr:(row+j+1)*kr])
				if ls.VIsKPrefix() {
					h.hist[e.Seq].v[l] = append(h.hist[e.Seq].v[l], nil)
				} else {
					h.hist[e.Seq].v[l] = append(h.hist[e.Seq].v[l], d.v[l][(row+j)*vr:(row+j+1)*vr])
				}
			}
		}
		row += e.NewTokens
	}
	for l := range h.spec.Layers {
		h.check(st, l, d, tl(l))
	}
	require.NoError(h.t, st.Commit())
	return d
}

// check compares layer l's outputs of st with the float64 references.
func (h *tcache) check(st *Step, l int, d stepData, tl tol) {
	h.t.Helper()
	ls := h.spec.Layers[l]
	cl := h.c.layers[l]
	row := 0
	var origAll []float64
	var gotAll []float32
	for i, s := range st.seqs {
		n, start := int(st.kvLen[i]), int(st.startPos[i])
		dk, dv := h.deqRead(st, l, i)
		hist := h.hist[s]
		ok, ov := flatten(hist.k[l][:n]), flatten(hist.v[l][:n])
		if ls.VIsKPrefix() {
			ov = nil
		}
		for j := 0; j < st.newTokens[i]; j++ {
			p := start + j
			q := d.q[l][(row+j)*ls.HeadsQ*ls.HeadDimK : (row+j+1)*ls.HeadsQ*ls.HeadDimK]
			got := d.out[l][(row+j)*ls.HeadsQ*ls.HeadDimV : (row+j+1)*ls.HeadsQ*ls.HeadDimV]
			vis := func(tok int) bool { return tok <= p && h.vis(l, p, tok) }
			want := refAttend(ls, q, dk, dv, p, vis, float64(cl.scale), cl.sinks)
			assertClose(h.t, want, got, tl.deq, "layer %d seq %d pos %d vs dequantized", l, s.ID(), p)
			orig := refAttend(ls, q, ok, ov, p, vis, float64(cl.scale), cl.sinks)
			if tl.orig > 0 {
				assertClose(h.t, orig, got, tl.orig, "layer %d seq %d pos %d vs original", l, s.ID(), p)
			}
			origAll, gotAll = append(origAll, orig...), append(gotAll, got...)
		}
		row += st.newTokens[i]
	}
	if tl.orig == 0 {
		// Quantization error per row is noisy with few visible tokens; check the step as a whole.
		c, _ := cosine(origAll, gotAll)
		assert.GreaterOrEqual(h.t, c, tl.cos, "layer %d (%s): cosine of the step's outputs vs the original K/V", l, cl.format)
	}
}

// deqRead reads what the kernels see for entry i of st in layer l: every position of its post-step
// length, through the step's page tables (released pages read as zeros).
func (h *tcache) deqRead(st *Step, l, i int) (k, v []float32) {
	h.t.Helper()
	cl := h.c.layers[l]
	sg := st.groups[cl.group.index]
	n := int(sg.kvLen[i]) // slots (compact.go)
	b := bridge.ReadBatch{TokIndptr: []int32{0, int32(n)}, PageIndptr: []int32{0, sg.pageIndptr[i+1] - sg.pageIndptr[i]},
		PageIDs: sg.pageIDs[sg.pageIndptr[i]:sg.pageIndptr[i+1]], KVLen: []int32{int32(n)}, StartPos: []int32{0},
		K: make([]float32, n*cl.spec.HeadsKV*cl.spec.HeadDimK)}
	if cl.format.Kind.IsKIVI() {
		b.ResidualSlot = []int32{st.slots[i]}
	}
	if !cl.spec.VIsKPrefix() {
		b.V = make([]float32, n*cl.spec.HeadsKV*cl.spec.HeadDimV)
	}
	require.NoError(h.t, cl.pool.Read(b))
	return b.K, b.V
}

// refAttend is docs/architecture.md §5 in float64 for one query row q [HeadsQ, dk] at position p over the
// tokens t with vis(t): keys k [t, HeadsKV, dk], values v [t, HeadsKV, dv] (nil for MLA: the first dv dims of
// k).
func refAttend(l LayerSpec, q, k, v []float32, p int, vis func(int) bool, scale float64, sinks []float32) []float64 {
	dk, dv, hkv := l.HeadDimK, l.HeadDimV, l.HeadsKV
	out := make([]float64, l.HeadsQ*dv)
	for h := 0; h < l.HeadsQ; h++ {
		kh := h / (l.HeadsQ / hkv)
		qh := q[h*dk : (h+1)*dk]
		var ts []int
		var ss []float64
		m := math.Inf(-1)
		for t := 0; t <= p && (t+1)*hkv*dk <= len(k); t++ {
			if !vis(t) {
				continue
			}
			kt := k[(t*hkv+kh)*dk : (t*hkv+kh+1)*dk]
			s := 0.0
			for c := range qh {
				s += float64(qh[c]) * float64(kt[c])
			}
			s *= scale
			ts, ss = append(ts, t), append(ss, s)
			m = math.Max(m, s)
		}
		if len(ts) == 0 {
			continue
		}
		if sinks != nil {
			m = math.Max(m, float64(sinks[h]))
		}
		den := 0.0
		o := out[h*dv : (h+1)*dv]
		for i, t := range ts {
			w := math.Exp(ss[i] - m)
			den += w
			var vt []float32
			if v == nil {
				vt = k[(t*hkv+kh)*dk : (t*hkv+kh)*dk+dv]
			} else {
				vt = v[(t*hkv+kh)*dv : (t*hkv+kh+1)*dv]
			}
			for c := range o {
				o[c] += w * float64(vt[c])
			}
		}
		if sinks != nil {
			den += math.Exp(float64(sinks[h]) - m)
		}
		for c := range o {
			o[c] /= den
		}
	}
	return out
}

func flatten(rows [][]float32) []float32 {
	var out []float32
	for _, r := range rows {
		out = append(out, r...)
	}
	return out
}

func cosine(a []float64, b []float32) (float64, bool) {
	var ab, aa, bb float64
	for i := range a {
		ab += a[i] * float64(b[i])
		aa += a[i] * a[i]
		bb += float64(b[i]) * float64(b[i])
	}
	if aa < 1e-12 || bb < 1e-12 {
		return 0, false
	}
	return ab / math.Sqrt(aa*bb), true
}

func assertClose(t *testing.T, want []float64, got []float32, tol float64, format string, args ...any) {
	t.Helper()
	require.Len(t, got, len(want))
	bad, first := 0, -1
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); !(d <= tol*(1+math.Abs(want[i]))) {
			if first < 0 {
				first = i
			}
			bad++
		}
	}
	if bad > 0 {
		assert.Failf(t, "output off the reference", "%s: %d of %d elements, first out[%d] = %g, want %g",
			sprintf(format, args...), bad, len(want), first, got[first], want[first])
	}
}

func randVec(rng *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * scale)
	}
	return x
}

func poisoned(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(math.NaN())
	}
	return x
}

func requireWritten(t testing.TB, x []float32, what string) {
	t.Helper()
	for i, v := range x {
		if math.IsNaN(float64(v)) {
			require.Failf(t, "element not written", "%s: element %d of %d is still the NaN poison", what, i, len(x))
		}
	}
}

// decode and prefill build step entries.
func decode(s *Sequence) StepEntry              { return StepEntry{Seq: s, NewTokens: 1} }
func prefill(s *Sequence, n int) StepEntry      { return StepEntry{Seq: s, NewTokens: n} }
func uniform(t tol) func(int) tol               { return func(int) tol { return t } }
func pagesUsed(c *Cache, group int) int         { return c.Stats().Groups[group].PagesUsed }
func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

// storedCosine returns, over the visible (not evicted) tokens of s in layer l, the smallest cosine
// between a stored (dequantized) key row and the original one: near 1 for a faithful cache, near 0 where
// a token holds another sequence's data.
func (h *tcache) storedCosine(s *Sequence, l int) float64 {
	h.t.Helper()
	c := h.c
	cl := c.layers[l]
	c.mu.Lock()
	n, table := s.length, append([]int32(nil), s.tables[cl.group.index]...)
	c.mu.Unlock()
	width := cl.spec.HeadsKV * cl.spec.HeadDimK
	b := bridge.ReadBatch{TokIndptr: []int32{0, int32(n)}, PageIndptr: []int32{0, int32(len(table))}, PageIDs: table,
		KVLen: []int32{int32(n)}, StartPos: []int32{0}, K: make([]float32, n*width)}
	if cl.format.Kind.IsKIVI() {
		b.ResidualSlot = []int32{s.slot}
	}
	require.NoError(h.t, cl.pool.Read(b))
	worst := 1.0
	for t := 0; t < n; t++ {
		if table[t/c.pageSize] < 0 {
			continue
		}
		orig := make([]float64, width)
		for i, x := range h.hist[s].k[l][t] {
			orig[i] = float64(x)
		}
		if cs, ok := cosine(orig, b.K[t*width:(t+1)*width]); ok {
			worst = min(worst, cs)
		}
	}
	return worst
}
