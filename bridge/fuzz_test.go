package bridge

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzAttendValidation feeds random descriptor fields to Attend over small written pools and asserts it
// never crashes and returns either success (with finite outputs) or an *Error with a known code.
// Plain `go test` runs the seed corpus; `go test -fuzz=FuzzAttendValidation ./bridge` explores.
func FuzzAttendValidation(f *testing.F) {
	dev, err := OpenDevice("cpu", -1, 2)
	require.NoError(f, err)
	f.Cleanup(func() { _ = dev.Close() })
	rng := rand.New(rand.NewPCG(13, 14))
	pools := []*cache{
		newCache(f, dev, PoolDesc{Format: FormatF16, KVHeads: 2, HeadDimK: 32, HeadDimV: 32, PageSize: 16}, []int{20, 40}, rng),
		newCache(f, dev, PoolDesc{Format: FormatKIVI2, GroupSize: 32, Residual: 32, KVHeads: 1, HeadDimK: 64,
			HeadDimV: 32, VIsKPrefix: true, PageSize: 32}, []int{20, 90}, rng),
	}

	f.Add(uint8(0), uint8(2), int32(20), int32(19), int32(0), float32(0.2), int32(0), int32(0), int32(0), uint32(0), int8(0), uint32(0), float32(0))
	f.Add(uint8(1), uint8(2), int32(90), int32(85), int32(1), float32(0.1), int32(8), int32(4), int32(16), uint32(2), int8(0), uint32(0xffff), float32(1))
	f.Add(uint8(2), uint8(4), int32(40), int32(0), int32(-1), float32(1), int32(3), int32(2), int32(1), uint32(1), int8(1), uint32(5), float32(-3))
	f.Add(uint8(3), uint8(3), int32(-5), int32(-1), int32(99), float32(-1), int32(-2), int32(-3), int32(-4), uint32(8), int8(-1), uint32(0), float32(0))
	f.Add(uint8(32+2), uint8(4), int32(40), int32(39), int32(0), float32(0.3), int32(0), int32(0), int32(3), uint32(4), int8(0), uint32(0x1fffffff), float32(0))
	f.Add(uint8(32+16+1), uint8(2), int32(90), int32(88), int32(1), float32(0.3), int32(0), int32(0), int32(0), uint32(0), int8(1), uint32(0), float32(0))
	f.Add(uint8(4), uint8(0), int32(1<<30), int32(1<<30), int32(1<<30), float32(math.Inf(1)), int32(1<<30), int32(1<<30), int32(1<<30), uint32(3), int8(2), uint32(7), float32(math.NaN()))

	f.Fuzz(func(t *testing.T, sel, heads uint8, kvLen, qPos, pageID int32, scale float32, window, sinkTokens,
		chunk int32, flags uint32, delta int8, mask uint32, sink float32) {
		c := pools[int(sel)%len(pools)]
		n := 1 + int(sel/2)%3 // 1..3 sequences, the last ones reusing the first's pages
		b := AttendBatch{Pool: c.pool, HeadsQ: int(heads % 9), Scale: scale, Window: int(window),
			SinkTokens: int(sinkTokens), ChunkSize: int(chunk % 4096), Flags: AttendFlags(flags % 16)}
		b.QIndptr, b.PageIndptr = []int32{0}, []int32{0}
		for i := 0; i < n; i++ {
			src := i % len(c.lens)
			rows := int32(1 + (int(sel)>>4+i)%3)
			b.QIndptr = append(b.QIndptr, b.QIndptr[i]+rows)
			table := append([]int32(nil), c.pages[src]...)
			if i == 0 && len(table) > 0 {
				table[0] = pageID
			}
			b.PageIDs = append(b.PageIDs, table...)
			b.PageIndptr = append(b.PageIndptr, int32(len(b.PageIDs)))
			l := int32(c.lens[src])
			if i == 0 {
				l = kvLen
			}
			b.KVLen = append(b.KVLen, l)
			b.QPos = append(b.QPos, qPos+int32(i))
			if c.slots != nil {
				b.ResidualSlot = append(b.ResidualSlot, c.slots[src])
			}
		}
		if mask != 0 {
			b.ValidIndptr = []int32{0}
			for i := 0; i < n; i++ {
				for w := 0; w < int(mask>>28)%5; w++ {
					b.ValidMask = append(b.ValidMask, mask)
				}
				b.ValidIndptr = append(b.ValidIndptr, int32(len(b.ValidMask)))
			}
		}
		if sel&8 != 0 {
			b.SinkLogits = make([]float32, b.HeadsQ)
			for i := range b.SinkLogits {
				b.SinkLogits[i] = sink
			}
		}
		if sel&32 != 0 { // attention mass, its length off by delta%2 when sel&16
			want := 0
			for _, l := range b.KVLen {
				want += c.desc.KVHeads * max(int(l), 0)
			}
			if want > 1<<20 {
				want = 16 // a length the call must refuse, not a 4 GiB buffer
			}
			if sel&16 != 0 {
				want = max(0, want+int(delta)%2)
			}
			b.Mass = make([]float32, want)
			b.MassRows = int(chunk%7) - 1
		}
		if sel&64 != 0 { // Quest: counts from -1 up, outputs of the right length or off by delta%2
			b.QuestPages = int(chunk%5) - 1
			b.QuestRecent = int(delta)%9 - 1
			if mask&1 != 0 {
				b.QuestBounds = make([]float32, max(0, int(b.PageIndptr[n])*c.desc.KVHeads+int(delta)%2))
			}
			if mask&2 != 0 {
				b.QuestSelected = make([]int32, max(0, n*c.desc.KVHeads*max(b.QuestPages, 0)+int(delta)%2))
			}
		}
		rows := int(b.QIndptr[n])
		b.Q = make([]float32, max(0, rows*b.HeadsQ*c.desc.HeadDimK+int(delta)))
		for i := range b.Q {
			b.Q[i] = float32(math.Sin(float64(i)))
		}
		b.Out = make([]float32, rows*b.HeadsQ*c.desc.HeadDimV)

		err := Attend(dev, b)
		if err == nil {
			for i, x := range b.Out {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					t.Fatalf("out[%d] = %g after a successful call", i, x)
				}
			}
			for i, x := range b.Mass {
				if !(x >= 0) || math.IsInf(float64(x), 0) {
					t.Fatalf("mass[%d] = %g after a successful call", i, x)
				}
			}
			return
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("error %v (%T) is not *Error", err, err)
		}
		assert.True(t, e.Code > codeOK && e.Code <= codeInternal, "code %d", e.Code)
		assert.NotEmpty(t, e.Msg)
	})
}
