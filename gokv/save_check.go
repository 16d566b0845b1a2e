package gokv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sort"

	"github.com/nlpodyssey/safetensors"
)

// Saved caches: what a file's state must satisfy (save_format.go has the format). The checks need no
// cache: Load compares the result with its cache afterwards (Cache.compatible), and Save runs them on
// what it is about to write.

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
func (f *savedFile) tokenLayer(l int) bool {
	return f.state.Policy.tokens() && !f.spec.Layers[l].Windowed()
}

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
				return fmt.Errorf("%s, layer group %d: page table of %d entries; %d slots in pages of %d need %d",
					at, gi, len(g.Table), s.Length-g.Shift, P, want)
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
				return fmt.Errorf("%s: quest_read has %d layers under policy %s (want %d under Quest, none otherwise)",
					at, len(s.QuestRead), st.Policy, L)
			}
			for l, r := range s.QuestRead {
				if r == nil {
					continue
				}
				if !f.questLayer(l) || len(r) != f.spec.Layers[l].HeadsKV {
					return fmt.Errorf("%s, layer %d: quest_read of %d kv heads (want %d in a Quest layer, none otherwise)",
						at, l, len(r), f.spec.Layers[l].HeadsKV)
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
				return fmt.Errorf("%s, layer %d, kv head %d: %d bitset words, %d hidden, %d scores for %d slots",
					at, l, h, x.Words, x.Hidden, x.Scores, slots)
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
