package gokv

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strconv"

	"github.com/nlpodyssey/safetensors"
)

// Saved caches: the file format (docs/architecture.md §6). A saved cache is a safetensors file, so common
// tools open it: an 8-byte little-endian header length, a JSON header giving each tensor's dtype, shape and
// data offsets and a "__metadata__" map of strings, then the tensors' bytes. The tensors:
//
//	layer.<l>.pages   U8  [pages of l's group, page bytes]  pages as stored (Pool.PageBytes), each page once
//	layer.<l>.rings   U8  [sequences, ring bytes]           KIVI layers: every sequence's residual ring
//	layer.<l>.hidden  U32 [words]                           token rules: the hidden bitsets, per sequence and kv head
//	layer.<l>.scores  F32 [scores]                          token rules: the scores, per sequence and kv head
//	tokens            I32 [tokens]                          prefix reuse: the token ids of the sequences that have them
//
// __metadata__ holds "format" ("gokv-cache"), "version" ("1"), "state" (savedState as JSON: the model,
// formats, page size, policy, per-layer geometry, the layer groups, every sequence's state, and each
// tensor's CRC-32C) and "state_crc32c". The layers of a group share its page numbering: page i of
// layer.<l>.pages is page i of every layer of l's group, as in the cache.
//
// Integrity: the state and every tensor carry a CRC-32C (Castagnoli), which catches every flip of up to 32
// bits in a row. The rest of the header (tensor names, dtypes, shapes, offsets, padding) is checked by
// writing it again from what was parsed: the result must be the same bytes, so a changed byte anywhere in
// the file fails the load. A reader never allocates from a size the file claims beyond the file's size.

const (
	savedFormatName = "gokv-cache"
	savedVersion    = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func checksum(b []byte) string { return fmt.Sprintf("%08x", crc32.Checksum(b, castagnoli)) }

// savedState is the JSON of __metadata__["state"].
type savedState struct {
	Model     savedModel        `json:"model"`
	Formats   []string          `json:"formats"` // per layer, canonical names
	PageSize  int               `json:"page_size"`
	Policy    savedPolicy       `json:"policy"`
	Layers    []savedLayer      `json:"layers"`
	Groups    []savedGroup      `json:"groups"`
	Sequences []savedSequence   `json:"sequences"`
	Tensors   map[string]string `json:"tensors"` // name -> CRC-32C, hex
}

type savedModel struct {
	Name       string           `json:"name"`
	SinkTokens int              `json:"sink_tokens"`
	Layers     []savedLayerSpec `json:"layers"`
}

type savedLayerSpec struct {
	Kind         string `json:"kind"`
	HeadsQ       int    `json:"heads_q"`
	HeadsKV      int    `json:"heads_kv"`
	HeadDimK     int    `json:"head_dim_k"`
	HeadDimV     int    `json:"head_dim_v"`
	Window       int    `json:"window,omitempty"`
	LearnedSinks bool   `json:"learned_sinks,omitempty"`
	KVLoraRank   int    `json:"kv_lora_rank,omitempty"`
	RopeDim      int    `json:"rope_dim,omitempty"`
}

// savedPolicy is a resolved eviction policy (SnapKV's Kernel defaulted).
type savedPolicy struct {
	Kind    string `json:"kind"` // full, sink-window, h2o, snapkv, quest
	Sinks   int    `json:"sinks,omitempty"`
	Window  int    `json:"window,omitempty"`
	Budget  int    `json:"budget,omitempty"`
	Recent  int    `json:"recent,omitempty"`
	Kernel  int    `json:"kernel,omitempty"`
	AvgPool bool   `json:"avg_pool,omitempty"`
	Pages   int    `json:"pages,omitempty"`
}

// savedLayer is one layer's storage geometry, as the pools have it.
type savedLayer struct {
	Group     int    `json:"group"`
	PageBytes uint64 `json:"page_bytes"`
	RingBytes uint64 `json:"ring_bytes,omitempty"` // KIVI
	KeyBounds bool   `json:"key_bounds,omitempty"` // Quest
}

type savedGroup struct {
	Layers []int `json:"layers"`
	Window int   `json:"window,omitempty"`
	Sinks  int   `json:"sinks,omitempty"`
	Pages  int   `json:"pages"` // pages saved
}

type savedSequence struct {
	Length int             `json:"length"`
	Groups []savedSeqGroup `json:"groups"`
	// Heads: token rules, per layer (null for layers they do not govern), per kv head
	Heads    [][]savedHead `json:"heads,omitempty"`
	SnapDone bool          `json:"snap_done,omitempty"`
	// QuestRead: Quest, per layer (null for layers it does not govern), per kv head; absent before a decode
	QuestRead [][]int `json:"quest_read,omitempty"`
	// Untracked: the cache does not know the sequence's token ids (some step did not give them); else its
	// Length ids are next in the tokens tensor
	Untracked bool `json:"untracked,omitempty"`
}

type savedSeqGroup struct {
	Table     []int32 `json:"table"` // indices into the group's saved pages, -1 = released
	Shift     int     `json:"shift,omitempty"`
	Compacted int     `json:"compacted,omitempty"`
	Evicted   int     `json:"evicted,omitempty"`
}

// savedHead locates one (sequence, layer, kv head)'s token-rule state in the layer's hidden and scores
// tensors, which hold them end to end in sequence and kv head order.
type savedHead struct {
	Words  int `json:"words"`  // bitset words
	Hidden int `json:"hidden"` // bits set
	Scores int `json:"scores"` // scores; -1 = none
}

// savedTensor is a tensor to write, or (data nil) one whose header is written again to check a file.
type savedTensor struct {
	dtype safetensors.DType
	shape []uint64
	data  []byte
	size  uint64
}

func (t savedTensor) DType() safetensors.DType { return t.dtype }
func (t savedTensor) Shape() []uint64          { return t.shape }
func (t savedTensor) Data() []byte             { return t.data }
func (t savedTensor) DataLen() uint64          { return t.size }

func pagesName(l int) string  { return "layer." + strconv.Itoa(l) + ".pages" }
func ringsName(l int) string  { return "layer." + strconv.Itoa(l) + ".rings" }
func hiddenName(l int) string { return "layer." + strconv.Itoa(l) + ".hidden" }
func scoresName(l int) string { return "layer." + strconv.Itoa(l) + ".scores" }

const tokensName = "tokens"

// ---- policies and specs ----

// policyOf describes a cache's (defaulted) eviction policy.
func policyOf(p EvictionPolicy) savedPolicy {
	switch v := p.(type) {
	case *SinkWindow:
		if v != nil {
			return savedPolicy{Kind: "sink-window", Sinks: v.Sinks, Window: v.Window}
		}
	case SinkWindow:
		return savedPolicy{Kind: "sink-window", Sinks: v.Sinks, Window: v.Window}
	case *H2O:
		if v != nil {
			return savedPolicy{Kind: "h2o", Budget: v.Budget, Recent: v.Recent}
		}
	case H2O:
		return savedPolicy{Kind: "h2o", Budget: v.Budget, Recent: v.Recent}
	case *SnapKV:
		if v != nil {
			return snapPolicy(*v)
		}
	case SnapKV:
		return snapPolicy(v)
	case *Quest:
		if v != nil {
			return savedPolicy{Kind: "quest", Pages: v.Pages, Recent: v.Recent}
		}
	case Quest:
		return savedPolicy{Kind: "quest", Pages: v.Pages, Recent: v.Recent}
	}
	return savedPolicy{Kind: "full"}
}

func snapPolicy(v SnapKV) savedPolicy {
	k := v.Kernel
	if k == 0 {
		k = DefaultSnapKVKernel
	}
	return savedPolicy{Kind: "snapkv", Budget: v.Budget, Window: v.Window, Kernel: k, AvgPool: v.AvgPool}
}

// policy returns the EvictionPolicy p describes (nil for Full), checked as NewCache checks it.
func (p savedPolicy) policy() (EvictionPolicy, error) {
	var ev EvictionPolicy
	want := p
	switch p.Kind {
	case "full":
		want = savedPolicy{Kind: "full"}
	case "sink-window":
		ev, want = &SinkWindow{Sinks: p.Sinks, Window: p.Window}, savedPolicy{Kind: p.Kind, Sinks: p.Sinks, Window: p.Window}
	case "h2o":
		ev, want = &H2O{Budget: p.Budget, Recent: p.Recent}, savedPolicy{Kind: p.Kind, Budget: p.Budget, Recent: p.Recent}
	case "snapkv":
		ev = &SnapKV{Budget: p.Budget, Window: p.Window, Kernel: p.Kernel, AvgPool: p.AvgPool}
		want = snapPolicy(*ev.(*SnapKV))
	case "quest":
		ev, want = &Quest{Pages: p.Pages, Recent: p.Recent}, savedPolicy{Kind: p.Kind, Pages: p.Pages, Recent: p.Recent}
	default:
		return nil, fmt.Errorf("policy kind %q is not full, sink-window, h2o, snapkv or quest", p.Kind)
	}
	if p != want {
		return nil, fmt.Errorf("policy %s has fields its kind does not use", p)
	}
	if ev != nil {
		if _, err := ev.evictionRule(); err != nil {
			return nil, err
		}
	}
	return ev, nil
}

// String describes the policy as Go would write it: "Full", "H2O{Budget: 64, Recent: 8}", ...
func (p savedPolicy) String() string {
	switch p.Kind {
	case "full":
		return "Full"
	case "sink-window":
		return fmt.Sprintf("SinkWindow{Sinks: %d, Window: %d}", p.Sinks, p.Window)
	case "h2o":
		return fmt.Sprintf("H2O{Budget: %d, Recent: %d}", p.Budget, p.Recent)
	case "snapkv":
		return fmt.Sprintf("SnapKV{Budget: %d, Window: %d, Kernel: %d, AvgPool: %t}", p.Budget, p.Window, p.Kernel, p.AvgPool)
	case "quest":
		return fmt.Sprintf("Quest{Pages: %d, Recent: %d}", p.Pages, p.Recent)
	}
	return fmt.Sprintf("policy %q", p.Kind)
}

func (p savedPolicy) tokens() bool { return p.Kind == "h2o" || p.Kind == "snapkv" }

func modelOf(spec ModelSpec) savedModel {
	m := savedModel{Name: spec.Name, SinkTokens: spec.SinkTokens}
	for _, l := range spec.Layers {
		m.Layers = append(m.Layers, savedLayerSpec{Kind: l.Kind.String(), HeadsQ: l.HeadsQ, HeadsKV: l.HeadsKV,
			HeadDimK: l.HeadDimK, HeadDimV: l.HeadDimV, Window: l.Window, LearnedSinks: l.LearnedSinks,
			KVLoraRank: l.KVLoraRank, RopeDim: l.RopeDim})
	}
	return m
}

// spec returns the ModelSpec m describes, validated.
func (m savedModel) spec() (ModelSpec, error) {
	spec := ModelSpec{Name: m.Name, SinkTokens: m.SinkTokens}
	for i, l := range m.Layers {
		kind := AttentionKind(-1)
		for k, name := range attentionKindNames {
			if l.Kind == name {
				kind = AttentionKind(k)
			}
		}
		if kind < 0 {
			return ModelSpec{}, fmt.Errorf("model layer %d: kind %q is not MHA, GQA, MQA or MLA", i, l.Kind)
		}
		spec.Layers = append(spec.Layers, LayerSpec{Kind: kind, HeadsQ: l.HeadsQ, HeadsKV: l.HeadsKV, HeadDimK: l.HeadDimK,
			HeadDimV: l.HeadDimV, Window: l.Window, LearnedSinks: l.LearnedSinks, KVLoraRank: l.KVLoraRank, RopeDim: l.RopeDim})
	}
	if err := spec.Validate(); err != nil {
		return ModelSpec{}, errors.New(trimGokv(err.Error()))
	}
	return spec, nil
}

func trimGokv(s string) string {
	for len(s) > 6 && s[:6] == "gokv: " {
		s = s[6:]
	}
	return s
}

// ---- writing ----

// metadata returns __metadata__ for the state.
func (st *savedState) metadata() (map[string]string, error) {
	js, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	return map[string]string{"format": savedFormatName, "version": strconv.Itoa(savedVersion), "state": string(js),
		"state_crc32c": checksum(js)}, nil
}

// write writes the file: the header, then the tensors' bytes.
func (f *savedFile) write(w io.Writer) error {
	meta, err := f.state.metadata()
	if err != nil {
		return err
	}
	views := make(map[string]savedTensor, len(f.tensors))
	for _, t := range f.tensors {
		views[t.name] = t.savedTensor
	}
	return safetensors.SerializeToWriter(views, meta, w)
}

// ---- reading ----

// errHeaderDone stops the header's rewrite once the header is written.
var errHeaderDone = errors.New("header written")

// headerWriter keeps the first len(buf) bytes written to it.
type headerWriter struct {
	buf []byte
	n   int
}

func (w *headerWriter) Write(p []byte) (int, error) {
	if w.n >= len(w.buf) {
		return 0, errHeaderDone
	}
	c := copy(w.buf[w.n:], p)
	w.n += c
	return len(p), nil
}

// readSavedHeader reads and checks a saved cache's header from r (size bytes): everything but the tensors'
// bytes. Errors describe what is wrong with the file.
func readSavedHeader(r io.ReaderAt, size int64) (*savedFile, error) {
	var lenBuf [8]byte
	if size < 8 {
		return nil, fmt.Errorf("%d bytes: truncated (a saved cache starts with an 8-byte header length)", size)
	}
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > uint64(size-8) {
		return nil, fmt.Errorf("the header length %d runs past the end of the %d-byte file (truncated, or not a saved cache)", n, size)
	}
	header := make([]byte, n)
	if _, err := r.ReadAt(header, 8); err != nil {
		return nil, err
	}
	var md safetensors.Metadata
	if err := md.UnmarshalJSON(header); err != nil {
		return nil, fmt.Errorf("header: not a safetensors header: %v", err)
	}
	meta := md.Metadata()
	switch {
	case meta["format"] != savedFormatName:
		return nil, fmt.Errorf("header: __metadata__ format is %q, not %q: not a saved gokv cache", meta["format"], savedFormatName)
	case meta["version"] != strconv.Itoa(savedVersion):
		return nil, &versionError{got: meta["version"]}
	case len(meta) != 4 || meta["state"] == "" || meta["state_crc32c"] == "":
		return nil, errors.New("header: __metadata__ must hold exactly format, version, state and state_crc32c")
	}
	state := []byte(meta["state"])
	if got := checksum(state); got != meta["state_crc32c"] {
		return nil, fmt.Errorf("header: the state's checksum is %s, the file says %s: the file is corrupted", got, meta["state_crc32c"])
	}
	f := &savedFile{headerLen: n}
	dec := json.NewDecoder(bytes.NewReader(state))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f.state); err != nil {
		return nil, fmt.Errorf("state: %v", err)
	}
	if dec.More() {
		return nil, errors.New("state: data after the JSON object")
	}
	if err := f.check(); err != nil {
		return nil, fmt.Errorf("state: %v", err)
	}
	// The tensors: exactly the state's, at the offsets safetensors gives them.
	infos := md.Tensors()
	if len(infos) != len(f.tensors) {
		return nil, fmt.Errorf("header: %d tensors, the state needs %d", len(infos), len(f.tensors))
	}
	for _, t := range f.tensors {
		info, ok := infos[t.name]
		switch {
		case !ok:
			return nil, fmt.Errorf("header: no tensor %s", t.name)
		case info.DType != t.dtype || !slices.Equal(info.Shape, t.shape):
			return nil, fmt.Errorf("header: tensor %s is %s %v, the state needs %s %v", t.name, info.DType, info.Shape, t.dtype, t.shape)
		case info.DataOffsets != [2]uint64{t.begin, t.begin + t.size}:
			return nil, fmt.Errorf("header: tensor %s lies at bytes %v of the data, not [%d, %d]", t.name, info.DataOffsets, t.begin, t.begin+t.size)
		}
	}
	end := uint64(0)
	if k := len(f.tensors); k > 0 {
		end = f.tensors[k-1].begin + f.tensors[k-1].size
	}
	if data := uint64(size) - 8 - n; data != end {
		what := "truncated, or a corrupted header length"
		if data > end {
			what = "bytes after the last tensor"
		}
		return nil, fmt.Errorf("the tensors need %d bytes after the %d-byte header, the file has %d: %s", end, n, data, what)
	}
	// Everything parsed: the header must be exactly what writing it again gives.
	views := make(map[string]savedTensor, len(f.tensors))
	for _, t := range f.tensors {
		views[t.name] = savedTensor{dtype: t.dtype, shape: t.shape, size: t.size}
	}
	hw := &headerWriter{buf: make([]byte, 8+n)}
	if err := safetensors.SerializeToWriter(views, meta, hw); err != nil && !errors.Is(err, errHeaderDone) {
		return nil, fmt.Errorf("header: %v", err)
	}
	if hw.n != len(hw.buf) || !bytes.Equal(hw.buf[:8], lenBuf[:]) || !bytes.Equal(hw.buf[8:], header) {
		return nil, errors.New("header: not as gokv writes it (a byte outside the state was changed): the file is corrupted")
	}
	return f, nil
}

// readData reads the tensors' bytes of a checked header and verifies their checksums (the first
// mismatch is the error; verified reports each tensor in file order).
func (f *savedFile) readData(r io.ReaderAt) (verified []bool, err error) {
	base := int64(8 + f.headerLen)
	end := uint64(0)
	if k := len(f.tensors); k > 0 {
		end = f.tensors[k-1].begin + f.tensors[k-1].size
	}
	data := make([]byte, end) // == the file's size less the header, checked by readSavedHeader
	if _, err := r.ReadAt(data, base); err != nil && !(errors.Is(err, io.EOF) && len(data) == 0) {
		return nil, err
	}
	verified = make([]bool, len(f.tensors))
	for i := range f.tensors {
		t := &f.tensors[i]
		t.data = data[t.begin : t.begin+t.size : t.begin+t.size]
		if got, want := checksum(t.data), f.state.Tensors[t.name]; got != want {
			if err == nil {
				err = fmt.Errorf("tensor %s: checksum %s, the state says %s: the file is corrupted", t.name, got, want)
			}
			continue
		}
		verified[i] = true
	}
	if err != nil {
		return verified, err
	}
	return verified, f.checkBitsets()
}

// versionError is a file of another format version.
type versionError struct{ got string }

func (e *versionError) Error() string {
	return fmt.Sprintf("file format version %q; this gokv reads version %d", e.got, savedVersion)
}
