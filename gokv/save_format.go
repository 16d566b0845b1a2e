package gokv

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"math/bits"
	"slices"
	"sort"
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

// ---- the checked contents of a file ----

// savedFile is a saved cache as read (or about to be written): its state, checked, and what follows from it.
type savedFile struct {
	state   savedState
	spec    ModelSpec
	formats []Format
	policy  EvictionPolicy
	// tensors: every tensor the state implies, in file order (offsets), with its bytes once read
	tensors []savedNamed
	// headerLen: the JSON header's length; the data starts at 8 + headerLen
	headerLen uint64
	// offsets of each (sequence, kv head) in each token layer's hidden and scores tensors, [layer][seq][head]
	wordAt, scoreAt [][][]int
	// tokenAt: offset of each sequence's token ids in the tokens tensor (untracked: -1)
	tokenAt []int
}

type savedNamed struct {
	name string
	savedTensor
	begin uint64 // offset in the data section
}

func (f *savedFile) tensor(name string) []byte {
	for i := range f.tensors {
		if f.tensors[i].name == name {
			return f.tensors[i].data
		}
	}
	return nil
}

// tokenLayer and questLayer say which layers the file's policy governs (as Cache.tokenLayer, questLayer).
func (f *savedFile) tokenLayer(l int) bool { return f.state.Policy.tokens() && !f.spec.Layers[l].Windowed() }
func (f *savedFile) questLayer(l int) bool {
	return f.state.Policy.Kind == "quest" && !f.spec.Layers[l].Windowed()
}

// check validates the state on its own (no cache): the model, formats, page size and policy are ones a
// cache can have; the geometry is the layout's; every sequence's tables, compaction and token-rule state
// are consistent with its length; and the tensors the state implies have sizes that fit. It fills spec,
// formats, policy, the offsets and the expected tensors (without data).
func (f *savedFile) check() error {
	st := &f.state
	spec, err := st.Model.spec()
	if err != nil {
		return err
	}
	f.spec = spec
	L := len(spec.Layers)
	if len(st.Formats) != L || len(st.Layers) != L {
		return fmt.Errorf("the model has %d layers but the state lists %d formats and %d layer geometries", L, len(st.Formats), len(st.Layers))
	}
	P := st.PageSize
	if P < 8 || P > formatMaxPageSize || P%8 != 0 {
		return fmt.Errorf("page size %d is not a multiple of 8 in [8, %d]", P, formatMaxPageSize)
	}
	if f.policy, err = st.Policy.policy(); err != nil {
		return err
	}
	if rule, _ := resolveEviction(f.policy); rule.tokens != nil {
		if err := rule.tokens.check(spec.SinkTokens); err != nil {
			return err
		}
	}
	f.formats = make([]Format, L)
	for l, name := range st.Formats {
		ft, err := ParseFormat(name)
		if err != nil || ft.String() != name {
			return fmt.Errorf("layer %d: format %q is not a canonical format name", l, name)
		}
		ls := spec.Layers[l]
		lay, err := ft.Layout(ls.HeadsKV, ls.HeadDimK, ls.HeadDimV, P, ls.VIsKPrefix())
		if err != nil {
			return fmt.Errorf("layer %d (%s, %s, page size %d): %s", l, ls, ft, P, trimGokv(err.Error()))
		}
		f.formats[l] = ft
		g := st.Layers[l]
		ring := uint64(lay.ResidualSlotBytes)
		if !ft.Kind.IsKIVI() {
			ring = 0
		}
		if g.PageBytes != uint64(lay.PageBytes) || g.RingBytes != ring || g.KeyBounds != f.questLayer(l) {
			return fmt.Errorf("layer %d (%s, %s): geometry page_bytes %d, ring_bytes %d, key_bounds %t; the layout has %d, %d, %t",
				l, ls, ft, g.PageBytes, g.RingBytes, g.KeyBounds, lay.PageBytes, ring, f.questLayer(l))
		}
	}
	if err := f.checkGroups(); err != nil {
		return err
	}
	if err := f.checkSequences(); err != nil {
		return err
	}
	return f.planTensors()
}

// checkGroups: the groups are the ones NewCache forms for this model and policy.
func (f *savedFile) checkGroups() error {
	st := &f.state
	var sw *SinkWindow
	if v, ok := f.policy.(*SinkWindow); ok {
		sw = v
	}
	var want []savedGroup
	wantOf := make([]int, len(f.spec.Layers))
	for l, ls := range f.spec.Layers {
		r := layerRule(f.spec, ls, sw)
		gi := -1
		for i, g := range want {
			if g.Window == r.window && g.Sinks == r.sinks {
				gi = i
			}
		}
		if gi < 0 {
			gi = len(want)
			want = append(want, savedGroup{Window: r.window, Sinks: r.sinks})
		}
		want[gi].Layers = append(want[gi].Layers, l)
		wantOf[l] = gi
	}
	if len(st.Groups) != len(want) {
		return fmt.Errorf("the state has %d layer groups; the model and policy make %d", len(st.Groups), len(want))
	}
	for gi, g := range st.Groups {
		w := want[gi]
		if !slices.Equal(g.Layers, w.Layers) || g.Window != w.Window || g.Sinks != w.Sinks {
			return fmt.Errorf("layer group %d: layers %s, window %d, sinks %d; the model and policy make layers %s, window %d, sinks %d",
				gi, joinInts(g.Layers), g.Window, g.Sinks, joinInts(w.Layers), w.Window, w.Sinks)
		}
		if g.Pages < 0 {
			return fmt.Errorf("layer group %d: %d pages", gi, g.Pages)
		}
	}
	for l, g := range st.Layers {
		if g.Group != wantOf[l] {
			return fmt.Errorf("layer %d: group %d, but it belongs to layer group %d", l, g.Group, wantOf[l])
		}
	}
	return nil
}

// checkSequences: every sequence's state is consistent with its length, and every saved page is in use.
func (f *savedFile) checkSequences() error {
	st := &f.state
	P := st.PageSize
	used := make([][]bool, len(st.Groups))
	for gi, g := range st.Groups {
		// A page is saved only when some table names it, so the tables bound the count (and the
		// allocation) before the tensors are looked at.
		refs := 0
		for _, s := range st.Sequences {
			if gi < len(s.Groups) {
				refs += len(s.Groups[gi].Table)
			}
		}
		if g.Pages > refs {
			return fmt.Errorf("layer group %d: %d pages saved but the tables name at most %d", gi, g.Pages, refs)
		}
		used[gi] = make([]bool, g.Pages)
	}
	L := len(f.spec.Layers)
	for si, s := range st.Sequences {
		at := fmt.Sprintf("sequence %d", si)
		if s.Length < 0 || s.Length > math.MaxInt32 {
			return fmt.Errorf("%s: length %d is outside [0, 2^31-1]", at, s.Length)
		}
		if len(s.Groups) != len(st.Groups) {
			return fmt.Errorf("%s: %d group states for %d layer groups", at, len(s.Groups), len(st.Groups))
		}
		for gi, g := range s.Groups {
			if g.Shift < 0 || g.Shift > s.Length || g.Compacted < 0 || g.Compacted > s.Length {
				return fmt.Errorf("%s, layer group %d: shift %d and compacted %d must be in [0, length %d]", at, gi, g.Shift, g.Compacted, s.Length)
			}
			if g.Shift > 0 && (st.Groups[gi].Window != 0 || !st.Policy.tokens()) {
				return fmt.Errorf("%s, layer group %d: shift %d, but only full-attention groups under H2O or SnapKV are compacted", at, gi, g.Shift)
			}
			if want := ceilDiv(s.Length-g.Shift, P); len(g.Table) != want {
				return fmt.Errorf("%s, layer group %d: page table of %d entries; %d slots in pages of %d need %d", at, gi, len(g.Table), s.Length-g.Shift, P, want)
			}
			if g.Evicted < 0 || g.Evicted > len(g.Table) {
				return fmt.Errorf("%s, layer group %d: evicted %d is outside [0, %d]", at, gi, g.Evicted, len(g.Table))
			}
			for j, id := range g.Table {
				if id < -1 || int(id) >= st.Groups[gi].Pages {
					return fmt.Errorf("%s, layer group %d: page table entry %d = %d is outside [-1, %d)", at, gi, j, id, st.Groups[gi].Pages)
				}
				if id >= 0 {
					used[gi][id] = true
				}
			}
		}
		if s.SnapDone && st.Policy.Kind != "snapkv" {
			return fmt.Errorf("%s: snap_done under policy %s", at, st.Policy)
		}
		if err := f.checkHeads(at, s); err != nil {
			return err
		}
		if s.QuestRead != nil {
			if st.Policy.Kind != "quest" || len(s.QuestRead) != L {
				return fmt.Errorf("%s: quest_read has %d layers under policy %s (want %d under Quest, none otherwise)", at, len(s.QuestRead), st.Policy, L)
			}
			for l, r := range s.QuestRead {
				if r == nil {
					continue
				}
				if !f.questLayer(l) || len(r) != f.spec.Layers[l].HeadsKV {
					return fmt.Errorf("%s, layer %d: quest_read of %d kv heads (want %d in a Quest layer, none otherwise)", at, l, len(r), f.spec.Layers[l].HeadsKV)
				}
				tbl := len(s.Groups[st.Layers[l].Group].Table)
				for h, n := range r {
					if n < 0 || n > tbl {
						return fmt.Errorf("%s, layer %d, kv head %d: quest_read %d is outside [0, %d]", at, l, h, n, tbl)
					}
				}
			}
		}
	}
	for gi, u := range used {
		if i := slices.Index(u, false); i >= 0 {
			return fmt.Errorf("layer group %d: saved page %d is in no sequence's page table", gi, i)
		}
	}
	return nil
}

// checkHeads checks a sequence's token-rule state: its shape, and that each bitset lies within the slots.
func (f *savedFile) checkHeads(at string, s savedSequence) error {
	if !f.state.Policy.tokens() {
		if s.Heads != nil {
			return fmt.Errorf("%s: token-rule state under policy %s", at, f.state.Policy)
		}
		return nil
	}
	if len(s.Heads) != len(f.spec.Layers) {
		return fmt.Errorf("%s: token-rule state for %d layers, want %d", at, len(s.Heads), len(f.spec.Layers))
	}
	for l, hs := range s.Heads {
		if !f.tokenLayer(l) {
			if hs != nil {
				return fmt.Errorf("%s, layer %d: token-rule state in a layer the policy does not govern", at, l)
			}
			continue
		}
		if len(hs) != f.spec.Layers[l].HeadsKV {
			return fmt.Errorf("%s, layer %d: token-rule state for %d kv heads, want %d", at, l, len(hs), f.spec.Layers[l].HeadsKV)
		}
		slots := s.Length - s.Groups[f.state.Layers[l].Group].Shift
		for h, x := range hs {
			if x.Words < 0 || x.Words > ceilDiv(slots, 32) || x.Hidden < 0 || x.Hidden > slots || x.Scores < -1 || x.Scores > slots {
				return fmt.Errorf("%s, layer %d, kv head %d: %d bitset words, %d hidden, %d scores for %d slots", at, l, h, x.Words, x.Hidden, x.Scores, slots)
			}
		}
	}
	return nil
}

// planTensors lists the tensors the state implies, with their shapes, and the token-rule offsets.
func (f *savedFile) planTensors() error {
	st := &f.state
	n := uint64(len(st.Sequences))
	L := len(f.spec.Layers)
	f.tensors = nil
	f.wordAt, f.scoreAt = make([][][]int, L), make([][][]int, L)
	add := func(name string, dt safetensors.DType, shape ...uint64) error {
		size := dt.Size()
		for _, d := range shape {
			hi, lo := bits.Mul64(size, d)
			if hi != 0 || lo > math.MaxInt64 {
				return fmt.Errorf("tensor %s: shape %v is too large", name, shape)
			}
			size = lo
		}
		f.tensors = append(f.tensors, savedNamed{name: name, savedTensor: savedTensor{dtype: dt, shape: shape, size: size}})
		return nil
	}
	for l := range f.spec.Layers {
		g := st.Layers[l]
		if err := add(pagesName(l), safetensors.U8, uint64(st.Groups[g.Group].Pages), g.PageBytes); err != nil {
			return err
		}
		if g.RingBytes > 0 {
			if err := add(ringsName(l), safetensors.U8, n, g.RingBytes); err != nil {
				return err
			}
		}
		if !f.tokenLayer(l) {
			continue
		}
		words, scores := 0, 0
		f.wordAt[l], f.scoreAt[l] = make([][]int, n), make([][]int, n)
		for si, s := range st.Sequences {
			f.wordAt[l][si], f.scoreAt[l][si] = make([]int, len(s.Heads[l])), make([]int, len(s.Heads[l]))
			for h, x := range s.Heads[l] {
				f.wordAt[l][si][h], f.scoreAt[l][si][h] = words, scores
				words += x.Words
				scores += max(x.Scores, 0)
			}
		}
		if err := add(hiddenName(l), safetensors.U32, uint64(words)); err != nil {
			return err
		}
		if err := add(scoresName(l), safetensors.F32, uint64(scores)); err != nil {
			return err
		}
	}
	f.tokenAt = make([]int, n)
	tokens := 0
	for si, s := range st.Sequences {
		f.tokenAt[si] = -1
		if !s.Untracked {
			f.tokenAt[si] = tokens
			tokens += s.Length
		}
	}
	if err := add(tokensName, safetensors.I32, uint64(tokens)); err != nil {
		return err
	}
	// The file's order: safetensors writes by descending dtype, then by name.
	sort.Slice(f.tensors, func(i, j int) bool {
		a, b := &f.tensors[i], &f.tensors[j]
		return a.dtype > b.dtype || (a.dtype == b.dtype && a.name < b.name)
	})
	var at uint64
	for i := range f.tensors {
		f.tensors[i].begin = at
		if at+f.tensors[i].size < at {
			return errors.New("the tensors' sizes overflow")
		}
		at += f.tensors[i].size
	}
	if len(st.Tensors) != len(f.tensors) {
		return fmt.Errorf("the state has checksums of %d tensors, the file needs %d", len(st.Tensors), len(f.tensors))
	}
	for _, t := range f.tensors {
		if _, ok := st.Tensors[t.name]; !ok {
			return fmt.Errorf("the state has no checksum of tensor %s", t.name)
		}
	}
	return nil
}

// checkBitsets checks, once the hidden tensors are read, that each bitset has its count of bits set and
// none at or past the sequence's slots.
func (f *savedFile) checkBitsets() error {
	for l := range f.spec.Layers {
		if !f.tokenLayer(l) {
			continue
		}
		words := f.tensor(hiddenName(l))
		for si, s := range f.state.Sequences {
			slots := s.Length - s.Groups[f.state.Layers[l].Group].Shift
			for h, x := range s.Heads[l] {
				n := 0
				for w := 0; w < x.Words; w++ {
					v := binary.LittleEndian.Uint32(words[(f.wordAt[l][si][h]+w)*4:])
					if w == x.Words-1 && slots < (w+1)*32 {
						if v>>(uint(slots)&31) != 0 {
							return fmt.Errorf("sequence %d, layer %d, kv head %d: a hidden bit at or past the sequence's %d slots", si, l, h, slots)
						}
					}
					n += bits.OnesCount32(v)
				}
				if n != x.Hidden {
					return fmt.Errorf("sequence %d, layer %d, kv head %d: %d hidden bits set, the state says %d", si, l, h, n, x.Hidden)
				}
			}
		}
	}
	return nil
}

// pageTokens returns, per saved page of layer l's group, how many leading slots hold tokens in layer l
// (stored in the page itself; KIVI: quantized out of the ring), the most over the sequences holding it:
// Pool.SetPageBytes's n_tokens.
func (f *savedFile) pageTokens(l int) []int {
	st := &f.state
	gi, P, ft := st.Layers[l].Group, st.PageSize, f.formats[l]
	out := make([]int, st.Groups[gi].Pages)
	for _, s := range st.Sequences {
		g := s.Groups[gi]
		limit := ft.QuantizedTokens(s.Length - g.Shift)
		for j, id := range g.Table {
			if id >= 0 {
				out[id] = max(out[id], min(max(limit-j*P, 0), P))
			}
		}
	}
	return out
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

// readSavedData reads the tensors' bytes of a checked header and verifies their checksums (the first
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
