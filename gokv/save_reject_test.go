package gokv

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nlpodyssey/safetensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// saveFixture is a small saved cache with every kind of tensor: a KIVI layer (rings), a sliding layer (a
// second layer group), H2O state (hidden bitsets and scores), and forks sharing pages.
type saveFixture struct {
	spec ModelSpec
	opts CacheOptions
	file []byte
}

func newSaveFixture(t testing.TB, e *Engine) saveFixture {
	t.Helper()
	spec := smallSpec(3, 32)
	spec.Name = "fixture"
	spec.Layers[1].Window = 16
	opts := CacheOptions{Format: MustParseFormat("f16"), LayerFormats: map[int]Format{0: MustParseFormat("kivi4:32:32")},
		PageSize: 32, MaxTokens: 1024, MaxSequences: 8, Eviction: H2O{Budget: 40, Recent: 8}}
	c, err := e.NewCache(spec, opts)
	require.NoError(t, err)
	defer c.Close()
	seqs := forkedHistory(66, 4)(saveRun{t: t, c: c, rng: newRand(3)})
	path := filepath.Join(t.TempDir(), "fixture.safetensors")
	require.NoError(t, c.Save(path, seqs[:2]...))
	file, err := os.ReadFile(path)
	require.NoError(t, err)
	return saveFixture{spec: spec, opts: opts, file: file}
}

// loadBytes loads data into c and requires, on failure, that the cache is as it was.
func loadBytes(t testing.TB, c *Cache, data []byte) ([]*Sequence, error) {
	t.Helper()
	before := c.Stats()
	seqs, err := c.load("Cache.Load", "test.safetensors", bytes.NewReader(data), int64(len(data)))
	if err != nil {
		require.Nil(t, seqs)
		require.Equal(t, before, c.Stats(), "a failed Load changed the cache (%v)", err)
	}
	return seqs, err
}

// splitSaved takes a valid file apart: its state and tensors (with their bytes).
func splitSaved(t testing.TB, data []byte) (savedState, map[string]savedTensor) {
	t.Helper()
	f, err := readSavedHeader(bytes.NewReader(data), int64(len(data)))
	require.NoError(t, err)
	_, err = f.readData(bytes.NewReader(data))
	require.NoError(t, err)
	tensors := map[string]savedTensor{}
	for _, x := range f.tensors {
		x.data = slices.Clone(x.data)
		tensors[x.name] = x.savedTensor
	}
	return f.state, tensors
}

// joinSaved writes a file of st and tensors, with the tensors' checksums recomputed when fix is set (and
// the state's always), so that only what the caller changed is wrong.
func joinSaved(t testing.TB, st savedState, tensors map[string]savedTensor, fix bool) []byte {
	t.Helper()
	js, err := json.Marshal(st)
	require.NoError(t, err)
	return joinSavedRaw(t, string(js), st, tensors, fix)
}

func joinSavedRaw(t testing.TB, state string, st savedState, tensors map[string]savedTensor, fix bool) []byte {
	t.Helper()
	if fix {
		sums := map[string]string{}
		for name, x := range tensors {
			sums[name] = checksum(x.data)
		}
		if st.Tensors != nil {
			var again savedState
			require.NoError(t, json.Unmarshal([]byte(state), &again))
			again.Tensors = sums
			js, err := json.Marshal(again)
			require.NoError(t, err)
			state = string(js)
		}
	}
	meta := map[string]string{"format": savedFormatName, "version": "1", "state": state, "state_crc32c": checksum([]byte(state))}
	var buf bytes.Buffer
	require.NoError(t, safetensors.SerializeToWriter(tensors, meta, &buf))
	return buf.Bytes()
}

// TestLoadRejectsOtherCaches: a file loads only into a cache of its model, formats, page size and policy;
// the error names what differs, and the cache is unchanged.
func TestLoadRejectsOtherCaches(t *testing.T) {
	e := openTestEngine(t)
	fx := newSaveFixture(t, e)
	withSpec := func(m func(s *ModelSpec)) ModelSpec {
		s := fx.spec.Clone()
		m(&s)
		return s
	}
	withOpts := func(m func(o *CacheOptions)) CacheOptions {
		o := fx.opts
		o.LayerFormats = map[int]Format{0: fx.opts.LayerFormats[0]}
		m(&o)
		return o
	}
	for _, tc := range []struct {
		name string
		spec ModelSpec
		opts CacheOptions
		want string
	}{
		{"model name", withSpec(func(s *ModelSpec) { s.Name = "other" }), fx.opts, `model: file has "fixture", cache has "other"`},
		{"layers", withSpec(func(s *ModelSpec) { s.Layers = s.Layers[:2] }), fx.opts, "model: file has 3 layers, cache has 2"},
		{"sinks", withSpec(func(s *ModelSpec) { s.SinkTokens = 2 }), fx.opts, "model: file has 4 sink tokens, cache has 2"},
		{"heads", withSpec(func(s *ModelSpec) { s.Layers[2] = AttentionLayer(4, 4, 32) }), fx.opts, "layer 2: file has GQA 4q/2kv d32, cache has MHA 4q/4kv d32"},
		{"window", withSpec(func(s *ModelSpec) { s.Layers[1].Window = 24 }), fx.opts, "layer 1: file has GQA 4q/2kv d32 window 16, cache has GQA 4q/2kv d32 window 24"},
		{"format", fx.spec, withOpts(func(o *CacheOptions) { o.LayerFormats[2] = MustParseFormat("q8:32") }), "layer 2: file has f16, cache has q8:32"},
		{"kivi residual", fx.spec, withOpts(func(o *CacheOptions) { o.LayerFormats[0] = MustParseFormat("kivi4:32:64") }), "layer 0: file has kivi4:32:32, cache has kivi4:32:64"},
		{"page size", fx.spec, withOpts(func(o *CacheOptions) { o.PageSize = 64 }), "page size: file has 32, cache has 64"},
		{"policy", fx.spec, withOpts(func(o *CacheOptions) { o.Eviction = nil }), "eviction policy: file has H2O{Budget: 40, Recent: 8}, cache has Full"},
		{"budget", fx.spec, withOpts(func(o *CacheOptions) { o.Eviction = H2O{Budget: 48, Recent: 8} }), "eviction policy: file has H2O{Budget: 40, Recent: 8}, cache has H2O{Budget: 48, Recent: 8}"},
		{"snapkv", fx.spec, withOpts(func(o *CacheOptions) { o.Eviction = SnapKV{Budget: 40, Window: 8} }), "cache has SnapKV{Budget: 40, Window: 8, Kernel: 7, AvgPool: false}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := e.NewCache(tc.spec, tc.opts)
			require.NoError(t, err)
			defer c.Close()
			_, err = loadBytes(t, c, fx.file)
			require.ErrorIs(t, err, ErrInvalid)
			assert.ErrorContains(t, err, tc.want)
		})
	}

	// The same cache but smaller capacities loads it; one short of pages or slots refuses with ErrCapacity.
	small := withOpts(func(o *CacheOptions) { o.MaxTokens, o.MaxSequences = 4*32, 2 })
	c, err := e.NewCache(fx.spec, small)
	require.NoError(t, err)
	defer c.Close()
	seqs, err := loadBytes(t, c, fx.file)
	require.NoError(t, err)
	require.Len(t, seqs, 2)
	_, err = loadBytes(t, c, fx.file)
	require.ErrorIs(t, err, ErrCapacity)
	var ce *CapacityError
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), "loading test.safetensors")
	require.NoError(t, seqs[1].Release())
	_, err = loadBytes(t, c, fx.file) // one slot free: pages are short first
	require.ErrorIs(t, err, ErrCapacity)
}

// TestLoadRejectsCorruptFiles: truncated files, any flipped bit, wrong checksums, other versions, and
// states that are inconsistent or claim huge counts are all refused with an error saying what is wrong,
// leaving the cache unchanged.
func TestLoadRejectsCorruptFiles(t *testing.T) {
	e := openTestEngine(t)
	fx := newSaveFixture(t, e)
	c, err := e.NewCache(fx.spec, fx.opts)
	require.NoError(t, err)
	defer c.Close()
	seqs, err := loadBytes(t, c, fx.file)
	require.NoError(t, err)
	for _, s := range seqs {
		require.NoError(t, s.Release())
	}
	file := fx.file
	headerEnd := 8 + int(binary.LittleEndian.Uint64(file))

	t.Run("truncated", func(t *testing.T) {
		for _, n := range []int{0, 1, 7, 8, 9, headerEnd / 2, headerEnd - 1, headerEnd, headerEnd + 1, (headerEnd + len(file)) / 2, len(file) - 1} {
			_, err := loadBytes(t, c, file[:n])
			require.ErrorIs(t, err, ErrInvalid, "%d bytes", n)
			assert.Contains(t, err.Error(), "truncated", "%d bytes", n)
		}
		_, err := loadBytes(t, c, append(slices.Clone(file), 0))
		assert.ErrorContains(t, err, "bytes after the last tensor")
	})

	t.Run("flipped bits", func(t *testing.T) {
		// Every byte of the header, and bytes spread over every tensor.
		var at []int
		for i := 0; i < headerEnd; i++ {
			at = append(at, i)
		}
		for i := headerEnd; i < len(file); i += 97 {
			at = append(at, i)
		}
		at = append(at, len(file)-1)
		buf := slices.Clone(file)
		for _, i := range at {
			bit := byte(1) << (i % 8)
			buf[i] ^= bit
			_, err := loadBytes(t, c, buf)
			buf[i] ^= bit
			require.Error(t, err, "bit %d of byte %d (header ends at %d) went unnoticed", i%8, i, headerEnd)
		}
	})

	st, tensors := splitSaved(t, file)
	require.Equal(t, file, joinSaved(t, st, tensors, true), "joinSaved does not write what Save wrote")
	// mutate returns the file with m applied; with fix, the tensors' checksums are recomputed, so that only
	// the change itself is wrong.
	mutateAnd := func(fix bool, m func(st *savedState, tensors map[string]savedTensor)) []byte {
		st, tensors := splitSaved(t, file)
		m(&st, tensors)
		return joinSaved(t, st, tensors, fix)
	}
	mutate := func(m func(st *savedState, tensors map[string]savedTensor)) []byte { return mutateAnd(false, m) }

	t.Run("checksums", func(t *testing.T) {
		bad := mutate(func(st *savedState, _ map[string]savedTensor) { st.Tensors["layer.2.pages"] = "01234567" })
		_, err := loadBytes(t, c, bad)
		assert.ErrorContains(t, err, "tensor layer.2.pages: checksum")
		assert.ErrorContains(t, err, "the file is corrupted")
		bad = mutate(func(_ *savedState, ts map[string]savedTensor) { ts["layer.0.rings"].data[100] ^= 4 })
		_, err = loadBytes(t, c, bad)
		assert.ErrorContains(t, err, "tensor layer.0.rings: checksum")
		bad = slices.Clone(file)
		i := bytes.Index(bad, []byte(`"state_crc32c":"`)) + len(`"state_crc32c":"`)
		bad[i] = map[bool]byte{true: '1', false: '0'}[bad[i] == '0']
		_, err = loadBytes(t, c, bad)
		assert.ErrorContains(t, err, "the state's checksum is")
	})

	t.Run("version", func(t *testing.T) {
		js, _ := json.Marshal(st)
		meta := map[string]string{"format": savedFormatName, "version": "2", "state": string(js), "state_crc32c": checksum(js)}
		var buf bytes.Buffer
		require.NoError(t, safetensors.SerializeToWriter(tensors, meta, &buf))
		_, err := loadBytes(t, c, buf.Bytes())
		require.ErrorIs(t, err, ErrVersion)
		assert.ErrorContains(t, err, `file format version "2"; this gokv reads version 1`)
		meta["format"] = "something-else"
		buf.Reset()
		require.NoError(t, safetensors.SerializeToWriter(tensors, meta, &buf))
		_, err = loadBytes(t, c, buf.Bytes())
		assert.ErrorContains(t, err, "not a saved gokv cache")
	})

	t.Run("huge counts", func(t *testing.T) {
		bad := slices.Clone(file)
		binary.LittleEndian.PutUint64(bad, 1<<62)
		_, err := loadBytes(t, c, bad)
		assert.ErrorContains(t, err, "runs past the end of the")
		for _, tc := range []struct {
			name string
			m    func(st *savedState, ts map[string]savedTensor)
			want string
		}{
			{"length", func(st *savedState, _ map[string]savedTensor) { st.Sequences[0].Length = 1 << 40 }, "length 1099511627776 is outside [0, 2^31-1]"},
			{"pages", func(st *savedState, ts map[string]savedTensor) {
				st.Groups[0].Pages = 1 << 40
			}, "pages saved but the tables name at most"},
			{"table", func(st *savedState, _ map[string]savedTensor) { st.Sequences[1].Groups[0].Table[1] = 1 << 30 }, "page table entry 1 = 1073741824 is outside"},
			{"table length", func(st *savedState, _ map[string]savedTensor) {
				st.Sequences[1].Groups[1].Table = append(st.Sequences[1].Groups[1].Table, -1)
			}, "page table of 4 entries"},
			{"words", func(st *savedState, _ map[string]savedTensor) { st.Sequences[0].Heads[0][1].Words = 1 << 40 }, "1099511627776 bitset words"},
			{"scores", func(st *savedState, _ map[string]savedTensor) { st.Sequences[0].Heads[2][0].Scores = 1 << 40 }, "1099511627776 scores"},
			{"shape", func(_ *savedState, ts map[string]savedTensor) {
				x := ts["layer.1.pages"]
				x.shape = []uint64{1 << 60, x.shape[1]}
				ts["layer.1.pages"] = x
			}, "tensor layer.1.pages is U8 [1152921504606846976 8192], the state needs U8"},
			{"page bytes", func(st *savedState, _ map[string]savedTensor) { st.Layers[2].PageBytes = 1 << 50 }, "layer 2 (GQA 4q/2kv d32, f16): geometry page_bytes 1125899906842624"},
			{"shift", func(st *savedState, _ map[string]savedTensor) { st.Sequences[0].Groups[0].Shift = 1000 }, "shift 1000 and compacted 0 must be in [0, length"},
			{"hidden", func(st *savedState, _ map[string]savedTensor) { st.Sequences[0].Heads[0][0].Hidden++ }, "hidden bits set, the state says"},
			{"evicted", func(st *savedState, _ map[string]savedTensor) { st.Sequences[0].Groups[1].Evicted = 99 }, "evicted 99 is outside"},
			{"quest", func(st *savedState, _ map[string]savedTensor) { st.Sequences[0].QuestRead = [][]int{{1}} }, "quest_read has 1 layers under policy H2O"},
			{"missing tensor", func(_ *savedState, ts map[string]savedTensor) { delete(ts, "layer.0.rings") }, "header: 8 tensors, the state needs 9"},
			{"extra tensor", func(_ *savedState, ts map[string]savedTensor) {
				ts["layer.9.pages"] = savedTensor{dtype: safetensors.U8, shape: []uint64{1}, data: []byte{1}, size: 1}
			}, "header: 10 tensors, the state needs 9"},
			{"policy", func(st *savedState, _ map[string]savedTensor) { st.Policy.Kind = "lru" }, `policy kind "lru"`},
			{"format", func(st *savedState, _ map[string]savedTensor) { st.Formats[1] = "q3" }, `layer 1: format "q3" is not a canonical format name`},
			{"groups", func(st *savedState, _ map[string]savedTensor) { st.Layers[1].Group = 0 }, "layer 1: group 0, but it belongs to layer group 1"},
		} {
			bad := mutate(tc.m)
			_, err := loadBytes(t, c, bad)
			require.ErrorIs(t, err, ErrInvalid, tc.name)
			assert.ErrorContains(t, err, tc.want, tc.name)
		}
		// A state with a field this gokv does not know.
		js, _ := json.Marshal(st)
		raw := strings.Replace(string(js), `"page_size":`, `"pages_size":1,"page_size":`, 1)
		_, err = loadBytes(t, c, joinSavedRaw(t, raw, savedState{}, tensors, false))
		assert.ErrorContains(t, err, `json: unknown field "pages_size"`)
	})

	t.Run("native check midway", func(t *testing.T) {
		// A NaN in the last page of the last layer passes every Go check (its checksum fits) and fails
		// in the backend after the other pages were written: Load gives everything back.
		bad := mutateAnd(true, func(st *savedState, ts map[string]savedTensor) {
			x := ts["layer.2.pages"]
			binary.LittleEndian.PutUint16(x.data[len(x.data)-int(st.Layers[2].PageBytes):], 0x7e00) // NaN
		})
		_, err := loadBytes(t, c, bad)
		require.ErrorIs(t, err, ErrInvalid)
		assert.ErrorContains(t, err, "layer 2, saved page")
		assert.ErrorContains(t, err, "k_codes[0] is not finite")
		bad = mutateAnd(true, func(st *savedState, ts map[string]savedTensor) {
			x := ts["layer.0.rings"]
			binary.LittleEndian.PutUint16(x.data[len(x.data)-int(st.Layers[0].RingBytes):], 0x7c00) // +Inf
		})
		_, err = loadBytes(t, c, bad)
		require.ErrorIs(t, err, ErrInvalid)
		assert.ErrorContains(t, err, "layer 0, residual ring of saved sequence 1")
		// And the cache still loads the good file.
		seqs, err := loadBytes(t, c, file)
		require.NoError(t, err)
		assert.Len(t, seqs, 2)
	})
}

// TestSaveRefuses: Save refuses sequences it cannot save as they are, and a failed Save leaves the file
// that was there.
func TestSaveRefuses(t *testing.T) {
	e := openTestEngine(t)
	spec := smallSpec(1, 32)
	opts := CacheOptions{Format: MustParseFormat("kivi2:32:32"), PageSize: 32, MaxTokens: 1024, MaxSequences: 4}
	c, err := e.NewCache(spec, opts)
	require.NoError(t, err)
	defer c.Close()
	other, err := e.NewCache(spec, opts)
	require.NoError(t, err)
	defer other.Close()
	r := saveRun{t: t, c: c, rng: newRand(5)}
	a, err := c.NewSequence()
	require.NoError(t, err)
	r.step(StepEntry{Seq: a, NewTokens: 40})
	path := filepath.Join(t.TempDir(), "a.safetensors")
	require.NoError(t, c.Save(path, a))
	good, err := os.ReadFile(path)
	require.NoError(t, err)

	x, err := other.NewSequence()
	require.NoError(t, err)
	st, err := c.Begin(StepEntry{Seq: a, NewTokens: 1})
	require.NoError(t, err)
	for _, tc := range []struct {
		seqs []*Sequence
		want string
		code error
	}{
		{[]*Sequence{a}, "sequence 0 is in an open step; Commit or Abort it first", ErrInvalid},
		{[]*Sequence{nil}, "seqs[0] is nil", ErrInvalid},
		{[]*Sequence{{}}, "seqs[0] was not created", ErrInvalid},
		{[]*Sequence{x}, "seqs[0] (sequence 0) belongs to another cache", ErrInvalid},
	} {
		err := c.Save(path, tc.seqs...)
		require.ErrorIs(t, err, tc.code)
		assert.ErrorContains(t, err, tc.want)
	}
	require.NoError(t, st.Abort())
	err = c.Save(path, a, a)
	assert.ErrorContains(t, err, "seqs[0] and seqs[1] are both sequence 0")

	// A step of more tokens than the ring's free rows, aborted after it ran, leaves a unusable.
	st, err = c.Begin(StepEntry{Seq: a, NewTokens: 70})
	require.NoError(t, err)
	in := genSaveInputs(spec, newRand(6), 70)
	require.NoError(t, st.Layer(0, in.q[0], in.k[0], in.v[0], make([]float32, 70*4*32)))
	require.ErrorIs(t, st.Abort(), ErrNotSupported)
	err = c.Save(path, a)
	require.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, "is unusable")
	require.NoError(t, a.Release())
	err = c.Save(path, a)
	require.ErrorIs(t, err, ErrClosed)
	assert.ErrorContains(t, err, "sequence 0 was released")

	// Every refusal left the good file; no temporary file stayed behind.
	now, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, good, now)
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, entries, 1)

	// File system errors keep their cause.
	err = c.Save(filepath.Join(t.TempDir(), "no", "such", "dir", "x"))
	require.ErrorIs(t, err, fs.ErrNotExist)
	_, err = c.Load(filepath.Join(t.TempDir(), "missing"))
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.True(t, errors.Is(err, ErrInvalid))

	require.NoError(t, c.Close())
	_, err = c.Load(path)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, c.Save(path), ErrClosed)
}
