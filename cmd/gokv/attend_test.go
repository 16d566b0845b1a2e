package main

import (
	"encoding/binary"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/gokv"
)

// ---- an independent float64 model of what `gokv attend` computes (docs/architecture.md §4, §5) ----

// refQuantGroup applies §4's rule to a group as the C core does: s and b rounded to fp16 first, then
// q = clamp(floor((x - b) / s + 1/2), 0, 2^bits - 1) in float32, x̂ = q·s + b (s == 0 reads back b).
func refQuantGroup(x []float32, bits int) []float64 {
	lo, hi := x[0], x[0]
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
	}
	qmax := float32(int(1)<<bits - 1)
	s, b := roundHalf((hi-lo)/qmax), roundHalf(lo)
	out := make([]float64, len(x))
	for i, v := range x {
		code := float32(0)
		if s > 0 {
			code = float32(math.Floor(float64((v-b)/s + 0.5)))
			code = min(max(code, 0), qmax)
		}
		out[i] = float64(code)*float64(s) + float64(b)
	}
	return out
}

// refStore returns what the cache holds of x [S, H, d] for format f: keys (isKey) or values. KIVI keeps
// the newest tokens (from n_quant on) in fp16, and quantizes the older ones from their fp16 copies, keys
// per channel over g tokens and values per token.
func refStore(f gokv.Format, x []float32, S, H, d int, isKey bool) []float64 {
	out := make([]float64, len(x))
	switch f.Kind {
	case gokv.F32:
		for i, v := range x {
			out[i] = float64(v)
		}
		return out
	case gokv.F16:
		for i, v := range x {
			out[i] = float64(roundHalf(v))
		}
		return out
	}
	g, bits := f.Group, f.Kind.Bits()
	nq := f.QuantizedTokens(S)
	src := x
	if f.Kind.IsKIVI() {
		src = make([]float32, len(x))
		for i, v := range x {
			src[i] = roundHalf(v)
		}
		for i := nq * H * d; i < len(x); i++ {
			out[i] = float64(src[i])
		}
	}
	if f.Kind.IsKIVI() && isKey {
		col := make([]float32, g)
		for t0 := 0; t0 < nq; t0 += g {
			for h := 0; h < H; h++ {
				for c := 0; c < d; c++ {
					for t := range col {
						col[t] = src[((t0+t)*H+h)*d+c]
					}
					for t, v := range refQuantGroup(col, bits) {
						out[((t0+t)*H+h)*d+c] = v
					}
				}
			}
		}
		return out
	}
	for t := 0; t < nq; t++ {
		for h := 0; h < H; h++ {
			for j := 0; j < d; j += g {
				off := (t*H+h)*d + j
				copy(out[off:off+g], refQuantGroup(src[off:off+g], bits))
			}
		}
	}
	return out
}

// refAttend is §5 in float64: q [T, Hq, dk] at positions S-T.., k [S, Hkv, dk], v [S, Hkv, dv] (for MLA
// pass v = nil: the first dv dims of k), optional sinks [Hq]. Returns [T, Hq, dv].
func refAttend(q []float32, k, v []float64, sinks []float32, T, S, Hq, Hkv, dk, dv int, scale float32, window, nSink int) []float64 {
	out := make([]float64, T*Hq*dv)
	for r := 0; r < T; r++ {
		p := S - T + r
		for h := 0; h < Hq; h++ {
			kh := h / (Hq / Hkv)
			var ts []int
			var ss []float64
			m := math.Inf(-1)
			for t := 0; t <= p; t++ {
				if window > 0 && t <= p-window && t >= nSink {
					continue
				}
				dot := 0.0
				for c := 0; c < dk; c++ {
					dot += float64(q[(r*Hq+h)*dk+c]) * k[(t*Hkv+kh)*dk+c]
				}
				s := float64(scale) * dot
				ts, ss = append(ts, t), append(ss, s)
				m = max(m, s)
			}
			if len(ts) == 0 {
				continue
			}
			if sinks != nil {
				m = max(m, float64(sinks[h]))
			}
			den := 0.0
			o := out[(r*Hq+h)*dv : (r*Hq+h+1)*dv]
			for i, t := range ts {
				e := math.Exp(ss[i] - m)
				den += e
				for c := 0; c < dv; c++ {
					if v == nil {
						o[c] += e * k[(t*Hkv+kh)*dk+c]
					} else {
						o[c] += e * v[(t*Hkv+kh)*dv+c]
					}
				}
			}
			if sinks != nil {
				den += math.Exp(float64(sinks[h]) - m)
			}
			for c := range o {
				o[c] /= den
			}
		}
	}
	return out
}

// ---- test data ----

func randTensor(rng *rand.Rand, n int, sd float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * sd)
	}
	return x
}

// writeTyped writes x as a .npy of dtype "<f2", "<f4" or "<f8", and returns x as the file holds it.
func writeTyped(t *testing.T, path, dtype string, shape []int, x []float32) []float32 {
	t.Helper()
	held := make([]float32, len(x))
	var payload []byte
	switch dtype {
	case "<f4":
		require.NoError(t, writeNPY(path, tensor{Shape: shape, Data: x}))
		copy(held, x)
		return held
	case "<f8":
		payload = make([]byte, 8*len(x))
		for i, v := range x {
			binary.LittleEndian.PutUint64(payload[8*i:], math.Float64bits(float64(v)))
			held[i] = v
		}
	case "<f2":
		payload = make([]byte, 2*len(x))
		for i, v := range x {
			h := floatToHalfBits(v)
			binary.LittleEndian.PutUint16(payload[2*i:], h)
			held[i] = halfToFloat(h)
		}
	}
	require.NoError(t, writeNPYRaw(path, dtype, shape, payload))
	return held
}

// floatToHalfBits encodes a float32 exactly representable after roundHalf (normal range) as binary16.
func floatToHalfBits(x float32) uint16 {
	r := roundHalf(x)
	if r == 0 {
		return 0
	}
	b := math.Float32bits(r)
	sign := uint16(b>>31) << 15
	exp := int(b>>23&0xff) - 127 + 15
	if exp <= 0 { // subnormal: multiples of 2^-24
		return sign | uint16(math.Abs(float64(r))*(1<<24))
	}
	return sign | uint16(exp)<<10 | uint16(b>>13&0x3ff)
}

type attendCase struct {
	name          string
	format        string
	dtype         string // of the input files
	T, S, Hq, Hkv int
	dk, dv        int
	mla, decode   bool
	window, nSink int
	sinks         bool
	scale         float64
}

// attendCases is the table `gokv attend` is checked on, for every backend compiled in.
var attendCases = []attendCase{
	{name: "f32 decode gqa f8 input", format: "f32", dtype: "<f8", T: 1, S: 300, Hq: 8, Hkv: 2, dk: 64, dv: 64, decode: true},
	{name: "f16 prefill window sinks", format: "f16", dtype: "<f4", T: 7, S: 200, Hq: 4, Hkv: 4, dk: 32, dv: 32,
		window: 50, nSink: 4, sinks: true},
	{name: "f16 decode f2 input", format: "f16", dtype: "<f2", T: 1, S: 130, Hq: 4, Hkv: 1, dk: 64, dv: 32, decode: true},
	{name: "q8 decode", format: "q8:32", dtype: "<f4", T: 1, S: 257, Hq: 8, Hkv: 2, dk: 64, dv: 64, decode: true},
	{name: "q4 prefill window", format: "q4:32", dtype: "<f4", T: 16, S: 333, Hq: 4, Hkv: 2, dk: 64, dv: 64,
		window: 64, nSink: 2, scale: 0.3},
	{name: "q4:64 decode sinks", format: "q4:64", dtype: "<f8", T: 1, S: 100, Hq: 6, Hkv: 3, dk: 128, dv: 64,
		decode: true, sinks: true},
	{name: "kivi2 decode", format: "kivi2:32:64", dtype: "<f4", T: 1, S: 300, Hq: 8, Hkv: 2, dk: 64, dv: 64, decode: true},
	{name: "kivi4 prefill", format: "kivi4:32:32", dtype: "<f4", T: 9, S: 250, Hq: 4, Hkv: 2, dk: 32, dv: 64},
	{name: "kivi2 mla decode", format: "kivi2:32:32", dtype: "<f4", T: 1, S: 190, Hq: 8, Hkv: 1, dk: 96, dv: 64,
		mla: true, decode: true},
	{name: "q4 mla prefill", format: "q4:32", dtype: "<f4", T: 4, S: 100, Hq: 4, Hkv: 1, dk: 96, dv: 64, mla: true},
}

func TestAttendMatchesFloat64Reference(t *testing.T) {
	for i, c := range attendCases {
		t.Run(c.name, func(t *testing.T) { runAttendCase(t, i, c, "cpu") })
	}
}

// runAttendCase writes case c's inputs as .npy files, runs `gokv attend --backend backend` on them and
// checks the output against an independent float64 computation within 1e-4; it returns the output.
func runAttendCase(t *testing.T, i int, c attendCase, backend string) []float32 {
	t.Helper()
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(i), 42))
	qShape := []int{c.T, c.Hq, c.dk}
	if c.decode {
		qShape = qShape[1:]
	}
	o := &attendOpts{q: filepath.Join(dir, "q.npy"), k: filepath.Join(dir, "k.npy"), out: filepath.Join(dir, "out.npy"),
		format: c.format, backend: backend, window: c.window, sinkTokens: c.nSink, scale: c.scale, mla: c.mla}
	q := writeTyped(t, o.q, c.dtype, qShape, randTensor(rng, c.T*c.Hq*c.dk, 1))
	kIn := randTensor(rng, c.S*c.Hkv*c.dk, 1)
	for j := range kIn { // outlier channels, as real keys have
		if (j%c.dk)%16 == 0 {
			kIn[j] *= 4
		}
	}
	k := writeTyped(t, o.k, c.dtype, []int{c.S, c.Hkv, c.dk}, kIn)
	var v []float32
	if c.mla {
		o.mlaDV = c.dv
	} else {
		o.v = filepath.Join(dir, "v.npy")
		v = writeTyped(t, o.v, c.dtype, []int{c.S, c.Hkv, c.dv}, randTensor(rng, c.S*c.Hkv*c.dv, 1))
	}
	var sinks []float32
	if c.sinks {
		o.sinks = filepath.Join(dir, "sinks.npy")
		sinks = writeTyped(t, o.sinks, c.dtype, []int{c.Hq}, randTensor(rng, c.Hq, 2))
	}
	require.NoError(t, runAttend(io.Discard, o))

	f := gokv.MustParseFormat(c.format)
	kHat := refStore(f, k, c.S, c.Hkv, c.dk, true)
	var vHat []float64
	if !c.mla {
		vHat = refStore(f, v, c.S, c.Hkv, c.dv, false)
	}
	scale := float32(c.scale)
	if c.scale == 0 {
		scale = float32(1 / math.Sqrt(float64(c.dk)))
	}
	want := refAttend(q, kHat, vHat, sinks, c.T, c.S, c.Hq, c.Hkv, c.dk, c.dv, scale, c.window, c.nSink)

	out, err := readNPY(o.out)
	require.NoError(t, err)
	wantShape := []int{c.T, c.Hq, c.dv}
	if c.decode {
		wantShape = wantShape[1:]
	}
	assert.Equal(t, wantShape, out.Shape)
	got := out.Data
	require.Len(t, got, len(want))
	rms := 0.0
	for _, x := range want {
		rms += x * x
	}
	rms = math.Sqrt(rms / float64(len(want)))
	bad := 0
	for j := range want {
		if math.Abs(float64(got[j])-want[j]) > 1e-4*max(math.Abs(want[j]), rms) {
			if bad < 5 {
				t.Errorf("out[%d] = %.7g, want %.7g (float64 reference)", j, got[j], want[j])
			}
			bad++
		}
	}
	assert.Zero(t, bad, "elements outside 1e-4 relative")
	return got
}

func TestAttendErrorsNameFileAndDims(t *testing.T) {
	dir := t.TempDir()
	path := func(n string) string { return filepath.Join(dir, n) }
	rng := rand.New(rand.NewPCG(7, 7))
	require.NoError(t, writeNPY(path("q.npy"), tensor{Shape: []int{4, 64}, Data: randTensor(rng, 256, 1)}))
	require.NoError(t, writeNPY(path("q3.npy"), tensor{Shape: []int{2, 2, 2, 2}, Data: randTensor(rng, 16, 1)}))
	require.NoError(t, writeNPY(path("qbad.npy"), tensor{Shape: []int{4, 32}, Data: randTensor(rng, 128, 1)}))
	require.NoError(t, writeNPY(path("k.npy"), tensor{Shape: []int{10, 2, 64}, Data: randTensor(rng, 1280, 1)}))
	require.NoError(t, writeNPY(path("k2.npy"), tensor{Shape: []int{10, 128}, Data: randTensor(rng, 1280, 1)}))
	require.NoError(t, writeNPY(path("v.npy"), tensor{Shape: []int{9, 2, 64}, Data: randTensor(rng, 1152, 1)}))
	require.NoError(t, writeNPY(path("vok.npy"), tensor{Shape: []int{10, 2, 64}, Data: randTensor(rng, 1280, 1)}))
	require.NoError(t, writeNPY(path("sinks.npy"), tensor{Shape: []int{3}, Data: []float32{1, 2, 3}}))
	require.NoError(t, writeNPYRaw(path("int.npy"), "<i4", []int{4}, make([]byte, 16)))
	require.NoError(t, os.WriteFile(path("junk.npy"), []byte("not numpy"), 0o644))
	require.NoError(t, os.WriteFile(path("short.npy"), []byte{}, 0o644))
	require.NoError(t, writeNPYRaw(path("trunc.npy"), "<f4", []int{10, 2, 64}, make([]byte, 100)))

	cases := []struct {
		name     string
		o        attendOpts
		contains []string
	}{
		{"k not 3-d", attendOpts{q: "q.npy", k: "k2.npy", v: "vok.npy"}, []string{"k2.npy", "(10, 128)", "[S, Hkv, d_qk]"}},
		{"q 4-d", attendOpts{q: "q3.npy", k: "k.npy", v: "vok.npy"}, []string{"q3.npy", "(2, 2, 2, 2)"}},
		{"q d_qk mismatch", attendOpts{q: "qbad.npy", k: "k.npy", v: "vok.npy"}, []string{"qbad.npy", "d_qk = 32", "d_qk = 64"}},
		{"v tokens mismatch", attendOpts{q: "q.npy", k: "k.npy", v: "v.npy"}, []string{"v.npy", "(9, 2, 64)", "S = 10"}},
		{"sinks wrong length", attendOpts{q: "q.npy", k: "k.npy", v: "vok.npy", sinks: "sinks.npy"}, []string{"sinks.npy", "(3,)", "(4,)"}},
		{"int dtype", attendOpts{q: "int.npy", k: "k.npy", v: "vok.npy"}, []string{"int.npy", "<i4"}},
		{"junk", attendOpts{q: "q.npy", k: "junk.npy", v: "vok.npy"}, []string{"junk.npy", "not a readable .npy"}},
		{"empty", attendOpts{q: "q.npy", k: "short.npy", v: "vok.npy"}, []string{"short.npy"}},
		{"truncated", attendOpts{q: "q.npy", k: "trunc.npy", v: "vok.npy"}, []string{"trunc.npy", "(10, 2, 64)"}},
		{"missing", attendOpts{q: "q.npy", k: "nope.npy", v: "vok.npy"}, []string{"nope.npy"}},
		{"no v", attendOpts{q: "q.npy", k: "k.npy"}, []string{"--v is required"}},
		{"mla dv too big", attendOpts{q: "q.npy", k: "k.npy", mla: true, mlaDV: 65}, []string{"--mla-dv 65", "k.npy"}},
		{"group does not divide", attendOpts{q: "q.npy", k: "k.npy", v: "vok.npy", format: "q4:128"}, []string{"q4:128", "64"}},
		{"bad format", attendOpts{q: "q.npy", k: "k.npy", v: "vok.npy", format: "q5"}, []string{"--format", "q5"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := c.o
			for _, p := range []*string{&o.q, &o.k, &o.v, &o.sinks} {
				if *p != "" {
					*p = path(*p)
				}
			}
			if o.format == "" {
				o.format = "f32"
			}
			o.backend, o.out = "cpu", path("out.npy")
			err := runAttend(io.Discard, &o)
			require.Error(t, err)
			for _, s := range c.contains {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
}

func TestHalfConversions(t *testing.T) {
	for _, c := range []struct {
		h uint16
		f float32
	}{{0x3c00, 1}, {0xc000, -2}, {0x7bff, 65504}, {0x0001, 1.0 / (1 << 24)}, {0x0400, 6.103515625e-05}, {0x3555, 0.33325195}} {
		assert.Equal(t, c.f, halfToFloat(c.h), "half %#04x", c.h)
		assert.Equal(t, c.h, floatToHalfBits(c.f), "float %g", c.f)
	}
	assert.Equal(t, float32(1), roundHalf(1.0002))         // below half an ulp (2^-11)
	assert.Equal(t, float32(1.0009766), roundHalf(1.0006)) // above
	assert.True(t, math.IsInf(float64(roundHalf(70000)), 1))
}
