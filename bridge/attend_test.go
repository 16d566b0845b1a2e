package bridge

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// attendCase is one variant of the attention call (docs/architecture.md §5).
type attendCase struct {
	name        string
	prefillRows int // query rows per sequence ending at kv_len-1; 0 = decode (one row)
	sinks       bool
	window      int
	sinkTokens  int
	chunk       int
	release     bool // page 1 of every sequence that has one is released (-1)
	holes       bool // validity masks with ~1/4 of the tokens cleared
	flags       AttendFlags
	needs       Caps
}

var attendCases = []attendCase{
	{name: "decode", needs: CapDecode},
	{name: "decode-chunk16", chunk: 16, needs: CapDecode},
	{name: "decode-scalar", flags: AttendForceScalar, needs: CapDecode},
	{name: "decode-learned-sinks", sinks: true, chunk: 32, needs: CapDecode | CapLearnedSinks},
	{name: "decode-window", window: 24, sinkTokens: 4, chunk: 16, needs: CapDecode | CapWindow},
	{name: "decode-window-below-sinks", window: 2, sinkTokens: 8, needs: CapDecode | CapWindow},
	{name: "decode-holes", release: true, holes: true, chunk: 16, needs: CapDecode | CapHoles},
	{name: "prefill", prefillRows: 5, needs: CapPrefill},
	{name: "prefill-window-sinks", prefillRows: 7, window: 16, sinkTokens: 4, sinks: true,
		needs: CapPrefill | CapWindow | CapLearnedSinks},
}

// attendInput is a built batch plus what the reference needs.
type attendInput struct {
	batch AttendBatch
	rows  []int // query rows of each sequence
}

func buildAttend(c *cache, tc attendCase, headsQ int, rng *rand.Rand) attendInput {
	n := len(c.lens)
	in := attendInput{batch: AttendBatch{
		Pool: c.pool, QIndptr: []int32{0}, PageIndptr: []int32{0}, ResidualSlot: c.slots, HeadsQ: headsQ,
		Scale: float32(1 / math.Sqrt(float64(c.desc.HeadDimK))), SinkTokens: tc.sinkTokens, Window: tc.window,
		ChunkSize: tc.chunk, Flags: tc.flags,
	}}
	b := &in.batch
	for i, l := range c.lens {
		r := 1
		if tc.prefillRows > 0 {
			r = min(tc.prefillRows, l)
		}
		in.rows = append(in.rows, r)
		b.QIndptr = append(b.QIndptr, b.QIndptr[i]+int32(r))
		table := append([]int32(nil), c.pages[i]...)
		// Release page 1; for KIVI, some of its tokens may still be in the residual ring: they are hidden too.
		if tc.release && len(table) > 1 {
			table[1] = -1
		}
		b.PageIDs = append(b.PageIDs, table...)
		b.PageIndptr = append(b.PageIndptr, int32(len(b.PageIDs)))
		b.KVLen = append(b.KVLen, int32(l))
		b.QPos = append(b.QPos, int32(l-r))
	}
	if tc.holes {
		b.ValidIndptr = []int32{0}
		for i, l := range c.lens {
			words := (l+31)/32 + i%2 // some sequences with a spare word
			for w := 0; w < words; w++ {
				b.ValidMask = append(b.ValidMask, rng.Uint32()|rng.Uint32()|rng.Uint32()) // ~7/8 set
			}
			b.ValidIndptr = append(b.ValidIndptr, int32(len(b.ValidMask)))
		}
	}
	rows := int(b.QIndptr[n])
	b.Q = randVec(rng, rows*headsQ*c.desc.HeadDimK, 1)
	b.Out = poisoned(rows * headsQ * c.desc.HeadDimV)
	if tc.sinks {
		b.SinkLogits = randVec(rng, headsQ, 2)
	}
	return in
}

// referenceAttend is docs/architecture.md §5 in float64 over the dequantized K/V that Read returned:
// s_t = α q·k_t, m = max(max_t s_t, σ), out = Σ e^(s_t-m) v_t / (Σ e^(s_t-m) + e^(σ-m)), zeros if nothing is visible.
func referenceAttend(c *cache, in attendInput, k, v [][]float32) []float64 {
	b := &in.batch
	d := c.desc
	H, Hkv, dk, dv := b.HeadsQ, d.KVHeads, d.HeadDimK, d.HeadDimV
	out := make([]float64, len(b.Out))
	for i, l := range c.lens {
		table := b.PageIDs[b.PageIndptr[i]:b.PageIndptr[i+1]]
		visible := func(t, p int) bool {
			if t >= l || t > p || table[t/d.PageSize] < 0 {
				return false
			}
			if b.ValidMask != nil && b.ValidMask[int(b.ValidIndptr[i])+t/32]&(1<<(t%32)) == 0 {
				return false
			}
			return b.Window == 0 || t > p-b.Window || t < b.SinkTokens
		}
		for r := 0; r < in.rows[i]; r++ {
			row := int(b.QIndptr[i]) + r
			p := int(b.QPos[i]) + r
			for h := 0; h < H; h++ {
				kvh := h / (H / Hkv)
				q := b.Q[(row*H+h)*dk : (row*H+h+1)*dk]
				scores := make([]float64, l)
				m := math.Inf(-1)
				any := false
				for t := 0; t < l; t++ {
					if !visible(t, p) {
						continue
					}
					any = true
					kt := k[i][(t*Hkv+kvh)*dk : (t*Hkv+kvh+1)*dk]
					dot := 0.0
					for c := range q {
						dot += float64(q[c]) * float64(kt[c])
					}
					scores[t] = float64(b.Scale) * dot
					m = max(m, scores[t])
				}
				o := out[(row*H+h)*dv : (row*H+h+1)*dv]
				if !any {
					continue // a query that sees nothing outputs zeros
				}
				sigma := math.Inf(-1)
				if b.SinkLogits != nil {
					sigma = float64(b.SinkLogits[h])
					m = max(m, sigma)
				}
				den := math.Exp(sigma - m)
				for t := 0; t < l; t++ {
					if !visible(t, p) {
						continue
					}
					w := math.Exp(scores[t] - m)
					den += w
					var vt []float32
					if d.VIsKPrefix {
						vt = k[i][(t*Hkv+kvh)*dk : (t*Hkv+kvh)*dk+dv]
					} else {
						vt = v[i][(t*Hkv+kvh)*dv : (t*Hkv+kvh+1)*dv]
					}
					for c := range o {
						o[c] += w * float64(vt[c])
					}
				}
				for c := range o {
					o[c] /= den
				}
			}
		}
	}
	return out
}

// TestAttendMatchesReference runs every format, geometry and attention variant on the CPU backend and
// compares it with the float64 reference over the dequantized cache.
func TestAttendMatchesReference(t *testing.T) {
	dev := openCPU(t)
	info, err := dev.Info()
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, g := range testGeometries {
		for _, f := range Formats {
			t.Run(g.name+"/"+f.String(), func(t *testing.T) {
				c := newCache(t, dev, withFormat(g.desc, f), g.lens, rng)
				k, v := c.read(t)
				for _, tc := range attendCases {
					in := buildAttend(c, tc, g.heads, rng)
					err := Attend(dev, in.batch)
					if !info.Caps.Has(tc.needs) {
						assert.ErrorIs(t, err, ErrNotSupported, "%s: caps %#x lack %#x", tc.name, info.Caps, tc.needs)
						continue
					}
					require.NoError(t, err, tc.name)
					requireWritten(t, in.batch.Out, tc.name+": out")
					assertClose(t, referenceAttend(c, in, k, v), in.batch.Out, 1e-3, tc.name)
				}
			})
		}
	}
}

// TestAttendNothingVisible: a query whose tokens are all masked outputs zeros, with or without a sink logit.
func TestAttendNothingVisible(t *testing.T) {
	dev := openCPU(t)
	rng := rand.New(rand.NewPCG(7, 8))
	c := newCache(t, dev, withFormat(testGeometries[0].desc, FormatQ4), []int{40}, rng)
	for _, sinks := range []bool{false, true} {
		in := buildAttend(c, attendCase{holes: true, sinks: sinks}, 8, rng)
		for i := range in.batch.ValidMask {
			in.batch.ValidMask[i] = 0
		}
		require.NoError(t, Attend(dev, in.batch))
		for i, x := range in.batch.Out {
			require.Zero(t, x, "sinks=%v: out[%d]", sinks, i)
		}
	}
}

func assertClose(t *testing.T, want []float64, got []float32, tol float64, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	bad := 0
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); !(d <= tol*(1+math.Abs(want[i]))) {
			if bad < 5 {
				t.Errorf("%s: out[%d] = %g, reference %g (diff %g)", what, i, got[i], want[i], d)
			}
			bad++
		}
	}
	assert.Zero(t, bad, "%s: elements off the reference", what)
}

// TestAttendConcurrent calls Attend from several goroutines on one device and pool (run with -race),
// alongside reads and Info calls, and checks every result equals a serial run.
func TestAttendConcurrent(t *testing.T) {
	dev := openCPU(t)
	rng := rand.New(rand.NewPCG(9, 10))
	c := newCache(t, dev, withFormat(testGeometries[0].desc, FormatQ4), []int{70, 130}, rng)
	base := buildAttend(c, attendCase{chunk: 32}, 8, rng)
	require.NoError(t, Attend(dev, base.batch))
	want := append([]float32(nil), base.batch.Out...)

	const goroutines, iters = 6, 8
	var wg sync.WaitGroup
	for gi := 0; gi < goroutines; gi++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := base.batch
			b.Out = make([]float32, len(want))
			for it := 0; it < iters; it++ {
				if !assert.NoError(t, Attend(dev, b)) {
					return
				}
				assert.InDeltaSlice(t, want, b.Out, 1e-6, "goroutine %d iteration %d", gi, it)
				if it%4 == 0 {
					_, err := dev.Info()
					assert.NoError(t, err)
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // reads of the same pages while attention runs: both only read
		defer wg.Done()
		for it := 0; it < iters; it++ {
			k, _ := c.read(t)
			assert.Len(t, k, len(c.lens))
		}
	}()
	wg.Wait()
}

// TestCopyForksPages copies a sequence's first pages into free ones (a copy-on-write fork) and checks
// that the fork's table reads the same tokens as the original.
func TestCopyForksPages(t *testing.T) {
	dev := openCPU(t)
	for _, f := range []Format{FormatF16, FormatQ4, FormatKIVI2} {
		t.Run(f.String(), func(t *testing.T) {
			const n = 100
			c := newCache(t, dev, withFormat(testGeometries[0].desc, f), []int{n}, rand.New(rand.NewPCG(11, 12)))
			used := map[int32]bool{}
			for _, p := range c.pages[0] {
				used[p] = true
			}
			var free []int32
			for p := int32(0); p < int32(c.desc.Pages); p++ {
				if !used[p] {
					free = append(free, p)
				}
			}
			require.NotEmpty(t, free)
			forked := min(len(free), len(c.pages[0]))
			require.NoError(t, c.pool.Copy(CopyBatch{SrcPages: c.pages[0][:forked], DstPages: free[:forked]}))
			fork := append(append([]int32(nil), free[:forked]...), c.pages[0][forked:]...)
			// Compare the tokens held in the copied pages (KIVI: only those quantized into pages).
			upto := forked * c.desc.PageSize
			if f.KIVI() {
				upto = min(upto, KIVIQuantizedLen(n, c.desc.GroupSize, c.desc.Residual))
			}
			readTable := func(table []int32) ([]float32, []float32) {
				kvh := c.desc.KVHeads
				b := ReadBatch{TokIndptr: []int32{0, int32(upto)}, PageIndptr: []int32{0, int32(len(table))},
					PageIDs: table, KVLen: []int32{n}, StartPos: []int32{0}, ResidualSlot: c.slots,
					K: poisoned(upto * kvh * c.desc.HeadDimK), V: poisoned(upto * kvh * c.desc.HeadDimV)}
				require.NoError(t, c.pool.Read(b))
				requireWritten(t, b.K, "K")
				requireWritten(t, b.V, "V")
				return b.K, b.V
			}
			ko, vo := readTable(c.pages[0])
			kf, vf := readTable(fork)
			assert.Equal(t, ko, kf)
			assert.Equal(t, vo, vf)
		})
	}
}

// TestAttendBadPoolDevice: a pool is only usable on its own device.
func TestAttendBadPoolDevice(t *testing.T) {
	dev1, dev2 := openCPU(t), openCPU(t)
	c := newCache(t, dev1, withFormat(testGeometries[0].desc, FormatF32), []int{10}, rand.New(rand.NewPCG(1, 1)))
	in := buildAttend(c, attendCase{}, 8, rand.New(rand.NewPCG(1, 1)))
	err := Attend(dev2, in.batch)
	require.Error(t, err)
	var e *Error
	require.True(t, errors.As(err, &e))
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, e.Msg, "another device")
}

// TestAppendAttendDecodeLoop runs decode steps the way an engine does, one cgo call per step (append the
// new token of every sequence, then attend), and checks each step against the reference; a rejected
// step leaves the cache as it was.
func TestAppendAttendDecodeLoop(t *testing.T) {
	dev := openCPU(t)
	for _, f := range []Format{FormatF16, FormatQ4, FormatKIVI2} {
		t.Run(f.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(15, 16))
			final := []int{40, 75}
			c := makeCache(t, dev, withFormat(testGeometries[0].desc, f), final, rng)
			written := []int{final[0] - 8, final[1] - 8}
			c.write(t, []int{0, 0}, written)
			for step := 0; step < 8; step++ {
				upto := []int{written[0] + 1, written[1] + 1}
				view := c.view(upto)
				in := buildAttend(view, attendCase{chunk: 16}, 8, rng)

				if step == 3 { // a rejected step writes nothing
					before, _ := c.view(written).read(t)
					w, _ := c.writeBatch(append([]int(nil), written...), upto)
					bad := in.batch
					bad.Scale = float32(math.Inf(1))
					require.ErrorIs(t, AppendAttend(dev, &w, bad), ErrInvalid)
					after, _ := c.view(written).read(t)
					require.Equal(t, before, after, "a rejected step changed the cache")
				}

				w, ok := c.writeBatch(written, upto)
				require.True(t, ok)
				require.NoError(t, AppendAttend(dev, &w, in.batch), "step %d", step)
				k, v := view.read(t)
				assertClose(t, referenceAttend(view, in, k, v), in.batch.Out, 1e-3, fmt.Sprintf("step %d", step))
			}
		})
	}
}

// TestAttendMassAndKVHeadMaskChecks: Mass must hold KVHeads*KVLen elements per sequence, MassRows must
// not be negative, and AttendMaskPerKVHead needs a mask: a wrong batch is an *Error naming the field,
// never a native call that writes past a slice.
func TestAttendMassAndKVHeadMaskChecks(t *testing.T) {
	dev := openCPU(t)
	rng := rand.New(rand.NewPCG(21, 22))
	c := newCache(t, dev, withFormat(testGeometries[0].desc, FormatF32), []int{10, 37}, rng)
	hkv := c.desc.KVHeads
	cases := []struct {
		name string
		edit func(b *AttendBatch)
		want string
	}{
		{"mass short", func(b *AttendBatch) { b.Mass = make([]float32, hkv*47-1) }, "len(Mass)"},
		{"mass long", func(b *AttendBatch) { b.Mass = make([]float32, hkv*47+1) }, "len(Mass)"},
		{"mass rows negative", func(b *AttendBatch) { b.Mass = make([]float32, hkv*47); b.MassRows = -1 }, "MassRows"},
		{"mass with baseline", func(b *AttendBatch) { b.Mass = make([]float32, hkv*47); b.Flags |= AttendDequantBaseline }, "baseline"},
		{"per-kv-head flag without mask", func(b *AttendBatch) { b.Flags |= AttendMaskPerKVHead }, "ValidMask is nil"},
		{"per-kv-head mask too short", func(b *AttendBatch) {
			b.Flags |= AttendMaskPerKVHead
			b.ValidMask = make([]uint32, 2+2) // one mask per sequence, not one per kv head
			b.ValidIndptr = []int32{0, 1, 4}
			if hkv == 1 {
				b.ValidMask, b.ValidIndptr = make([]uint32, 1), []int32{0, 0, 1}
			}
		}, "valid_mask"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := buildAttend(c, attendCase{}, 2*hkv, rng)
			tc.edit(&in.batch)
			err := Attend(dev, in.batch)
			var e *Error
			require.True(t, errors.As(err, &e), "%v", err)
			assert.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, e.Msg, tc.want)
		})
	}
	info, err := dev.Info()
	require.NoError(t, err)
	if !info.Caps.Has(CapMass) {
		in := buildAttend(c, attendCase{}, 2*hkv, rng)
		in.batch.Mass = make([]float32, hkv*47)
		assert.ErrorIs(t, Attend(dev, in.batch), ErrNotSupported, "a backend without CapMass refuses Mass")
	}
}

// TestAttendQuestChecks: the Quest outputs must be exactly as long as C writes them and come only with
// QuestPages, and the counts must not be negative: a wrong batch is an *Error naming the field, never a
// native call that writes past a slice. A backend without CapQuest refuses pools with KeyBounds.
func TestAttendQuestChecks(t *testing.T) {
	dev := openCPU(t)
	rng := rand.New(rand.NewPCG(23, 24))
	c := newCache(t, dev, withFormat(testGeometries[0].desc, FormatF32), []int{10, 37}, rng)
	hkv := c.desc.KVHeads
	in0 := buildAttend(c, attendCase{}, 2*hkv, rng)
	pages := len(in0.batch.PageIDs)
	cases := []struct {
		name string
		edit func(b *AttendBatch)
		want string
	}{
		{"pages negative", func(b *AttendBatch) { b.QuestPages = -1 }, "QuestPages"},
		{"recent negative", func(b *AttendBatch) { b.QuestPages = 1; b.QuestRecent = -1 }, "QuestRecent"},
		{"bounds without pages", func(b *AttendBatch) { b.QuestBounds = make([]float32, pages*hkv) }, "without QuestPages"},
		{"selected without pages", func(b *AttendBatch) { b.QuestSelected = make([]int32, 2*hkv) }, "without QuestPages"},
		{"bounds short", func(b *AttendBatch) { b.QuestPages = 2; b.QuestBounds = make([]float32, pages*hkv-1) }, "len(QuestBounds)"},
		{"bounds long", func(b *AttendBatch) { b.QuestPages = 2; b.QuestBounds = make([]float32, pages*hkv+1) }, "len(QuestBounds)"},
		{"selected short", func(b *AttendBatch) { b.QuestPages = 2; b.QuestSelected = make([]int32, 2*hkv*2-1) }, "len(QuestSelected)"},
		{"selected long", func(b *AttendBatch) { b.QuestPages = 2; b.QuestSelected = make([]int32, 2*hkv*2+1) }, "len(QuestSelected)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := buildAttend(c, attendCase{}, 2*hkv, rng)
			tc.edit(&in.batch)
			err := Attend(dev, in.batch)
			var e *Error
			require.True(t, errors.As(err, &e), "%v", err)
			assert.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, e.Msg, tc.want)
		})
	}
	// Right lengths on a pool without key bounds reach the C core, which names what is missing.
	in := buildAttend(c, attendCase{}, 2*hkv, rng)
	in.batch.QuestPages, in.batch.QuestBounds, in.batch.QuestSelected = 1, make([]float32, pages*hkv), make([]int32, 2*hkv)
	err := Attend(dev, in.batch)
	assert.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, "key_bounds")

	info, err := dev.Info()
	require.NoError(t, err)
	desc := withFormat(testGeometries[0].desc, FormatQ4)
	desc.Pages, desc.KeyBounds = 4, true
	sizes, err := SizesOf(desc)
	require.NoError(t, err)
	assert.Equal(t, uint64(desc.KVHeads*2*desc.HeadDimK*2), sizes.PageBoundsBytes, "bounds: [Hkv][2][d_k] fp16")
	desc.KeyBounds = false
	plain, err := SizesOf(desc)
	require.NoError(t, err)
	assert.Zero(t, plain.PageBoundsBytes)
	assert.Equal(t, plain.PageBytes, sizes.PageBytes, "the bounds live beside the page")
	desc.KeyBounds = true
	p, err := NewPool(dev, desc)
	if !info.Caps.Has(CapQuest) {
		assert.ErrorIs(t, err, ErrNotSupported, "a backend without CapQuest refuses key bounds")
		return
	}
	require.NoError(t, err)
	require.NoError(t, p.Close())
}
