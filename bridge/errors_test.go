package bridge

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestErrors checks that failures carry the right code and a message naming the argument at fault,
// whether the C core or this package's own length checks found them.
func TestErrors(t *testing.T) {
	dev := openCPU(t)
	c := newCache(t, dev, withFormat(testGeometries[0].desc, FormatQ4), []int{40}, rand.New(rand.NewPCG(1, 3)))
	good := func() AttendBatch { return buildAttend(c, attendCase{}, 8, rand.New(rand.NewPCG(2, 3))).batch }

	tests := []struct {
		name string
		call func() error
		want error
		msg  string // substring of the message
	}{
		{"unknown backend", func() error { _, err := OpenDevice("nope", -1, 0); return err }, ErrNoDevice, `"nope"`},
		{"negative threads", func() error { _, err := OpenDevice("cpu", -1, -3); return err }, ErrInvalid, "n_threads"},
		{"bad group", func() error {
			_, err := NewPool(dev, PoolDesc{Format: FormatQ4, GroupSize: 33, KVHeads: 1, HeadDimK: 64, HeadDimV: 64, Pages: 1})
			return err
		}, ErrInvalid, "group_size"},
		{"unknown format", func() error {
			_, err := NewPool(dev, PoolDesc{Format: 42, KVHeads: 1, HeadDimK: 64, HeadDimV: 64, Pages: 1})
			return err
		}, ErrInvalid, "format"},
		{"zero pages", func() error {
			_, err := NewPool(dev, PoolDesc{Format: FormatF16, KVHeads: 1, HeadDimK: 64, HeadDimV: 64})
			return err
		}, ErrInvalid, "n_pages"},
		{"write page out of range", func() error {
			k := make([]float32, 2*64)
			return c.pool.Write(WriteBatch{TokIndptr: []int32{0, 1}, PageIndptr: []int32{0, 1}, PageIDs: []int32{99},
				StartPos: []int32{0}, K: k, V: k})
		}, ErrRange, "page_ids"},
		{"write NaN", func() error {
			k := make([]float32, 2*64)
			k[5] = float32(math.NaN())
			return c.pool.Write(WriteBatch{TokIndptr: []int32{0, 1}, PageIndptr: []int32{0, 1}, PageIDs: []int32{0},
				StartPos: []int32{0}, K: k, V: k})
		}, ErrInvalid, "not finite"},
		{"write short K (Go check)", func() error {
			return c.pool.Write(WriteBatch{TokIndptr: []int32{0, 1}, PageIndptr: []int32{0, 1}, PageIDs: []int32{0},
				StartPos: []int32{0}, K: make([]float32, 3), V: make([]float32, 2*64)})
		}, ErrInvalid, "len(K)"},
		{"read beyond length", func() error {
			return c.pool.Read(ReadBatch{TokIndptr: []int32{0, 2}, PageIndptr: []int32{0, 1}, PageIDs: c.pages[0][:1],
				KVLen: []int32{1}, StartPos: []int32{0}, K: make([]float32, 2*2*64)})
		}, ErrInvalid, "positions"},
		{"attend NaN scale", func() error { b := good(); b.Scale = float32(math.NaN()); return Attend(dev, b) }, ErrInvalid, "scale"},
		{"attend heads", func() error {
			b := good()
			b.HeadsQ = 3
			b.Q, b.Out = make([]float32, 3*64), make([]float32, 3*64)
			return Attend(dev, b)
		}, ErrInvalid, "n_heads_q"},
		{"attend table too short", func() error { b := good(); b.KVLen[0] = 1000; return Attend(dev, b) }, ErrInvalid, "page table"},
		{"attend page out of range", func() error { b := good(); b.PageIDs[0] = 1 << 20; return Attend(dev, b) }, ErrRange, "page_ids"},
		{"attend unknown flag", func() error { b := good(); b.Flags = 1 << 7; return Attend(dev, b) }, ErrInvalid, "flags"},
		{"attend short Q (Go check)", func() error { b := good(); b.Q = b.Q[:10]; return Attend(dev, b) }, ErrInvalid, "len(Q)"},
		{"attend short Out (Go check)", func() error { b := good(); b.Out = b.Out[1:]; return Attend(dev, b) }, ErrInvalid, "len(Out)"},
		{"attend PageIDs vs indptr (Go check)", func() error { b := good(); b.PageIDs = append(b.PageIDs, 0); return Attend(dev, b) }, ErrInvalid, "PageIDs"},
		{"attend mask without indptr (Go check)", func() error { b := good(); b.ValidMask = []uint32{1, 2}; return Attend(dev, b) }, ErrInvalid, "ValidIndptr"},
		{"attend empty indptr (Go check)", func() error { b := good(); b.QIndptr = nil; return Attend(dev, b) }, ErrInvalid, "QIndptr"},
		{"attend nil pool (Go check)", func() error { b := good(); b.Pool = nil; return Attend(dev, b) }, ErrInvalid, "Pool"},
		{"copy to a source", func() error {
			return c.pool.Copy(CopyBatch{SrcPages: []int32{0, 1}, DstPages: []int32{1, 2}})
		}, ErrInvalid, "src_pages"},
		{"log level", func() error { return SetLogFunc(func(int, string, string, string) {}, 9) }, ErrInvalid, "minLevel"},
	}
	sentinels := []error{ErrInvalid, ErrRange, ErrNoMem, ErrNotSupported, ErrNoDevice, ErrVersion, ErrDevice, ErrInternal}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			require.Error(t, err)
			var e *Error
			require.True(t, errors.As(err, &e), "%T is not *Error", err)
			assert.ErrorIs(t, err, tt.want)
			for _, s := range sentinels {
				if s != tt.want {
					assert.NotErrorIs(t, err, s)
				}
			}
			assert.Equal(t, tt.want.(*Error).Code, e.Code)
			assert.Equal(t, tt.want.(*Error).Name, e.Name)
			assert.True(t, strings.HasPrefix(e.Name, "GOKV_E"), e.Name)
			assert.Contains(t, e.Msg, tt.msg)
			assert.Contains(t, err.Error(), e.Name)
			assert.NotEmpty(t, e.Op)
		})
	}
}

func TestSentinels(t *testing.T) {
	assert.Equal(t, "GOKV_EINVAL", ErrInvalid.Name)
	assert.Equal(t, "GOKV_EINTERNAL", ErrInternal.Name)
	assert.NotErrorIs(t, ErrInvalid, ErrRange)
	assert.ErrorIs(t, &Error{Code: ErrNoMem.Code}, ErrNoMem)
	assert.Equal(t, "gokv: gokv_attend: scale bad (GOKV_EINVAL)",
		(&Error{Op: "gokv_attend", Code: ErrInvalid.Code, Name: "GOKV_EINVAL", Msg: "gokv_attend: scale bad"}).Error())
	assert.Equal(t, "gokv: gokv_attend: scale bad (GOKV_EINVAL)",
		(&Error{Op: "gokv_attend", Code: ErrInvalid.Code, Name: "GOKV_EINVAL", Msg: "scale bad"}).Error())
}

// TestClose: Close is idempotent and nil-safe, closing a device closes its pools, and calls on closed
// handles fail with ErrInvalid instead of touching freed memory.
func TestClose(t *testing.T) {
	var nilDev *Device
	var nilPool *Pool
	assert.NoError(t, nilDev.Close())
	assert.NoError(t, nilPool.Close())
	_, err := nilDev.Info()
	assert.ErrorIs(t, err, ErrInvalid)

	dev, err := OpenDevice("cpu", -1, 1)
	require.NoError(t, err)
	p1, err := NewPool(dev, PoolDesc{Format: FormatF16, KVHeads: 1, HeadDimK: 32, HeadDimV: 32, Pages: 2})
	require.NoError(t, err)
	p2, err := NewPool(dev, PoolDesc{Format: FormatQ8, GroupSize: 32, KVHeads: 1, HeadDimK: 32, HeadDimV: 32, Pages: 2})
	require.NoError(t, err)
	pb, rb, err := p2.Sizes()
	require.NoError(t, err)
	assert.Positive(t, pb)
	assert.Zero(t, rb)
	assert.Equal(t, DefaultPageSize, p2.Desc().PageSize)

	require.NoError(t, p1.Close())
	require.NoError(t, p1.Close())
	_, _, err = p1.Sizes()
	assert.ErrorIs(t, err, ErrInvalid)

	var wg sync.WaitGroup // concurrent closes are safe too
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); assert.NoError(t, dev.Close()) }()
	}
	wg.Wait()
	_, _, err = p2.Sizes() // closed with its device
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "closed")
	_, err = dev.Info()
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = NewPool(dev, PoolDesc{Format: FormatF32, KVHeads: 1, HeadDimK: 32, HeadDimV: 32, Pages: 1})
	assert.ErrorIs(t, err, ErrInvalid)
	assert.NoError(t, p2.Close())
}

// TestLogCallback: native log messages reach the Go function with their backend and op, and nil
// restores silence.
func TestLogCallback(t *testing.T) {
	type entry struct {
		level          int
		backend, op, m string
	}
	var mu sync.Mutex
	var got []entry
	require.NoError(t, SetLogFunc(func(level int, backend, op, msg string) {
		mu.Lock()
		got = append(got, entry{level, backend, op, msg})
		mu.Unlock()
	}, LogDebug))
	t.Cleanup(func() { require.NoError(t, SetLogFunc(nil, 0)) })

	dev, err := OpenDevice("cpu", -1, 1)
	require.NoError(t, err)
	require.NoError(t, dev.Close())

	mu.Lock()
	seen := append([]entry(nil), got...)
	mu.Unlock()
	require.NotEmpty(t, seen, "no log message while opening a device at debug level")
	found := false
	for _, e := range seen {
		assert.GreaterOrEqual(t, e.level, LogDebug)
		assert.LessOrEqual(t, e.level, LogError)
		if e.op == "gokv_device_open" && e.backend == "cpu" {
			found = true
		}
	}
	assert.True(t, found, "no message from gokv_device_open/cpu in %v", seen)

	require.NoError(t, SetLogFunc(nil, 0))
	mu.Lock()
	n := len(got)
	mu.Unlock()
	dev, err = OpenDevice("cpu", -1, 1)
	require.NoError(t, err)
	require.NoError(t, dev.Close())
	mu.Lock()
	assert.Equal(t, n, len(got), "messages after the callback was removed")
	mu.Unlock()
}
