package gokv

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"syscall"
)

// Saved caches (docs/architecture.md §6; the file format is in save_format.go). Save writes sequences as
// they are stored, Load brings them back into a cache of the same model, formats, page size and policy:
// the pages go back byte for byte (Pool.SetPageBytes, no requantization) and every piece of per-sequence
// state goes back as it was, so the loaded sequences attend exactly as the saved ones did and continue
// exactly as they would have.

// Save writes seqs to the file at path in their compressed form, for Load: per layer, the pages the
// sequences hold, exactly as stored (a page several of them share, forks for instance, is written once),
// and each sequence's KIVI residual rings; per sequence, its length, its page table in each layer group,
// its compaction state, its token-rule state (H2O, SnapKV: the hidden tokens and scores of every kv head),
// Quest's pages read, and its token ids when the cache knows them (prefix reuse). The file is a
// safetensors file with the state as JSON in its metadata and a checksum for the state and every tensor
// (`gokv inspect FILE` shows it); with no sequences it holds just the cache's description.
//
// Safety: the file is written beside path under a temporary name, synced, renamed over path, and the
// directory is synced, so path holds the old file or the new one, never a part of either, whenever the
// process dies. Save holds the cache's lock while it copies the pages out (memory speed; steps on other
// sequences wait for it) and writes the file after.
//
// Errors: ErrInvalid for a nil or foreign sequence, one listed twice, one in an open step (Commit or Abort
// it first) or one an aborted step left unusable; ErrClosed for a released sequence or a closed cache;
// ErrNotSupported when the backend cannot read pages as stored; for a file that cannot be written, an
// ErrInvalid that wraps the os error (errors.Is(err, fs.ErrPermission) works). A failed Save leaves path
// as it was.
func (c *Cache) Save(path string, seqs ...*Sequence) error {
	const op = "Cache.Save"
	if err := c.made(op); err != nil {
		return err
	}
	f, err := c.snapshot(op, seqs)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(path, f.write); err != nil {
		return &Error{Op: op, Code: ErrorInvalid, Msg: err.Error(), cause: err}
	}
	return nil
}

// Load reads a file written by Save and adds its sequences to the cache, returned in the order they were
// saved (with new IDs). The cache must have the file's model spec (name, layers, sink tokens), format per
// layer, page size and eviction policy; its capacities may differ. Each loaded sequence attends as the
// saved one did, bit for bit, and continues (steps, forks, truncation, eviction) as it would have. Pages
// that saved sequences shared are shared again. The token ids of sequences the cache tracked travel with
// them, so their pages get their prefix-reuse names back (NewSequenceFrom finds them); pages the saved
// sequences had already released are not in the file. Learned sink logits and the attention scale are
// the cache's, not the file's.
//
// Quest caches: each page's key bounds are recomputed from the tokens it holds. They equal the saved ones
// except in a page a sequence was truncated inside after filling it further (the original bounds still
// cover the dropped tokens); there the first decode steps may choose other pages than the original would.
//
// Load checks the whole file before it changes anything: its size and structure, every checksum, the
// format version (ErrVersion), that it was saved from a cache like this one (ErrInvalid naming what
// differs, e.g. "layer 3: file has q4:32, cache has q8:32"), and that every sequence's state is
// consistent. Then it needs enough free pages in every layer group and free sequence slots (a
// *CapacityError, ErrCapacity, otherwise), and writes the pages and rings; the backend checks the stored
// bytes again (finite scales, biases and elements). If a write fails, everything Load took is given back:
// a failed Load leaves the cache as it was, but for cached prefix pages and rings (which a shortage of
// free ones lets any allocation take) it may have taken and freed. It holds the cache's lock only to
// reserve pages and to install the sequences, not during the writes.
//
// Errors: ErrInvalid for a file that is not a saved cache of this cache's kind, is truncated or corrupted
// (wrapping the os error when it cannot be read), ErrVersion, ErrCapacity, ErrClosed, and the backend's
// errors of the writes (ErrNotSupported where it cannot write pages as stored).
func (c *Cache) Load(path string) ([]*Sequence, error) {
	const op = "Cache.Load"
	if err := c.made(op); err != nil {
		return nil, err
	}
	fh, size, err := openSaved(op, path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	return c.load(op, path, fh, size)
}

// load is Load from r, a file of size bytes named name (for the errors).
func (c *Cache) load(op, name string, r io.ReaderAt, size int64) ([]*Sequence, error) {
	f, err := readSavedHeader(r, size)
	if err != nil {
		return nil, loadErr(op, name, err)
	}
	if err := c.compatible(f); err != nil {
		return nil, newErr(op, ErrorInvalid, "%s: saved from another kind of cache: %v", name, err)
	}
	// Room first, so that a file too large for the cache is not read (install checks again).
	c.mu.Lock()
	err = c.roomLocked(op, name, f)
	if c.closed {
		err = newErr(op, ErrorClosed, "cache is closed")
	}
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if _, err := f.readData(r); err != nil {
		return nil, loadErr(op, name, err)
	}
	return c.install(op, name, f)
}

// loadErr turns a problem with a file into Load's error.
func loadErr(op, name string, err error) error {
	var ve *versionError
	var pe *fs.PathError
	switch {
	case errors.As(err, &ve):
		return newErr(op, ErrorVersion, "%s: %v", name, err)
	case errors.As(err, &pe):
		return &Error{Op: op, Code: ErrorInvalid, Msg: err.Error(), cause: err}
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return newErr(op, ErrorInvalid, "%s: the file ended early (it changed while being read?)", name)
	}
	return newErr(op, ErrorInvalid, "%s: %v", name, err)
}

// ---- Save ----

// snapshot copies out the state and the bytes of seqs (c.mu held meanwhile) and builds the file.
func (c *Cache) snapshot(op string, seqs []*Sequence) (*savedFile, error) {
	seen := make(map[*Sequence]int, len(seqs))
	for i, s := range seqs {
		switch {
		case s == nil:
			return nil, newErr(op, ErrorInvalid, "seqs[%d] is nil", i)
		case s.c == nil:
			return nil, newErr(op, ErrorInvalid, "seqs[%d] was not created (a zero Sequence; create one with Cache.NewSequence or Fork)", i)
		case s.c != c:
			return nil, newErr(op, ErrorInvalid, "seqs[%d] (sequence %d) belongs to another cache", i, s.id)
		}
		if j, dup := seen[s]; dup {
			return nil, newErr(op, ErrorInvalid, "seqs[%d] and seqs[%d] are both sequence %d", j, i, s.id)
		}
		seen[s] = i
	}
	f, data, err := c.snapshotLocked(op, seqs)
	if err != nil {
		return nil, err
	}
	// Outside the lock: the checksums, and the checks a reader will make, against a bug writing a file
	// that cannot be loaded.
	f.state.Tensors = make(map[string]string, len(data))
	for name, b := range data {
		f.state.Tensors[name] = checksum(b)
	}
	if err := f.check(); err != nil {
		return nil, newErr(op, ErrorInternal, "the sequences' state fails the saved-cache checks: %v", err)
	}
	for i := range f.tensors {
		t := &f.tensors[i]
		t.data = data[t.name]
		if uint64(len(t.data)) != t.size {
			return nil, newErr(op, ErrorInternal, "tensor %s has %d bytes, its shape needs %d", t.name, len(t.data), t.size)
		}
	}
	if err := f.checkBitsets(); err != nil {
		return nil, newErr(op, ErrorInternal, "the sequences' state fails the saved-cache checks: %v", err)
	}
	return f, nil
}

// snapshotLocked takes the cache's locks and copies the sequences' state and stored bytes: the file's
// state (without checksums) and every tensor's bytes by name.
func (c *Cache) snapshotLocked(op string, seqs []*Sequence) (*savedFile, map[string][]byte, error) {
	c.life.RLock()
	defer c.life.RUnlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, newErr(op, ErrorClosed, "cache is closed")
	}
	for _, s := range seqs {
		if err := s.usable(op); err != nil {
			return nil, nil, err
		}
	}
	f := &savedFile{}
	st := &f.state
	st.Model, st.PageSize, st.Policy = modelOf(c.spec), c.pageSize, policyOf(c.opts.Eviction)
	for _, cl := range c.layers {
		st.Formats = append(st.Formats, cl.format.String())
		st.Layers = append(st.Layers, savedLayer{Group: cl.group.index, PageBytes: cl.pageBytes, RingBytes: cl.slotBytes,
			KeyBounds: c.questLayer(cl.index)})
	}
	// Each group's pages in order of first use; tables name them by that order.
	ids := make([][]int32, len(c.groups))
	index := make([]map[int32]int32, len(c.groups))
	for gi := range index {
		index[gi] = map[int32]int32{}
	}
	for _, s := range seqs {
		ss := savedSequence{Length: s.length, SnapDone: s.snapDone, Untracked: !s.tokenKnown()}
		for gi := range c.groups {
			table := make([]int32, len(s.tables[gi]))
			for j, id := range s.tables[gi] {
				if id < 0 {
					table[j] = -1
					continue
				}
				k, ok := index[gi][id]
				if !ok {
					k = int32(len(ids[gi]))
					index[gi][id] = k
					ids[gi] = append(ids[gi], id)
				}
				table[j] = k
			}
			ss.Groups = append(ss.Groups, savedSeqGroup{Table: table, Shift: s.shift[gi], Compacted: s.compacted[gi], Evicted: s.evicted[gi]})
		}
		if c.tokens != nil {
			ss.Heads = make([][]savedHead, len(c.layers))
			for l := range c.layers {
				if !c.tokenLayer(l) {
					continue
				}
				for _, hs := range s.heads[l] {
					n := -1
					if hs.score != nil {
						n = len(hs.score)
					}
					ss.Heads[l] = append(ss.Heads[l], savedHead{Words: len(hs.hidden), Hidden: hs.nHidden, Scores: n})
				}
			}
		}
		if s.questRead != nil {
			ss.QuestRead = make([][]int, len(s.questRead))
			for l, r := range s.questRead {
				ss.QuestRead[l] = slices.Clone(r)
			}
		}
		st.Sequences = append(st.Sequences, ss)
	}
	for gi, g := range c.groups {
		st.Groups = append(st.Groups, savedGroup{Layers: slices.Clone(g.layers), Window: g.rule.window, Sinks: g.rule.sinks,
			Pages: len(ids[gi])})
	}

	data := make(map[string][]byte)
	var tokens []byte
	for _, s := range seqs {
		if s.tokenKnown() {
			for _, id := range s.tokens {
				tokens = binary.LittleEndian.AppendUint32(tokens, uint32(id))
			}
		}
	}
	data[tokensName] = tokens
	for l, cl := range c.layers {
		pages := make([]byte, 0, uint64(len(ids[cl.group.index]))*cl.pageBytes)
		for _, id := range ids[cl.group.index] {
			b, err := cl.pool.PageBytes(int(id))
			if err != nil {
				return nil, nil, wrapErr(op, fmt.Sprintf("layer %d: reading page %d", l, id), err)
			}
			pages = append(pages, b...)
		}
		data[pagesName(l)] = pages
		if cl.slotBytes > 0 {
			rings := make([]byte, 0, uint64(len(seqs))*cl.slotBytes)
			for _, s := range seqs {
				b, err := cl.pool.SlotBytes(int(s.slot))
				if err != nil {
					return nil, nil, wrapErr(op, fmt.Sprintf("layer %d: reading the residual ring of sequence %d", l, s.id), err)
				}
				rings = append(rings, b...)
			}
			data[ringsName(l)] = rings
		}
		if c.tokenLayer(l) {
			var words, scores []byte
			for _, s := range seqs {
				for _, hs := range s.heads[l] {
					for _, w := range hs.hidden {
						words = binary.LittleEndian.AppendUint32(words, w)
					}
					for _, x := range hs.score {
						scores = binary.LittleEndian.AppendUint32(scores, math.Float32bits(x))
					}
				}
			}
			data[hiddenName(l)], data[scoresName(l)] = words, scores
		}
	}
	return f, data, nil
}

// writeFileAtomic writes path through write so that path is never left part-written: a temporary file in
// the same directory, synced, renamed over path, then the directory synced. A failure removes the
// temporary file and leaves path as it was. A new file gets mode 0644; an existing one keeps its mode.
func writeFileAtomic(path string, write func(io.Writer) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	mode := fs.FileMode(0o644)
	if info, err := os.Stat(path); err == nil {
		if !info.Mode().IsRegular() {
			return fmt.Errorf("%s: not a regular file", path)
		}
		mode = info.Mode().Perm()
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if err := write(bw); err != nil {
		return fmt.Errorf("%s: %w", tmp.Name(), err)
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

// syncDir makes a rename in dir durable. File systems that cannot sync a directory (EINVAL) are let be.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	return nil
}

// ---- Load ----

// compatible reports how the file's cache differs from c, or nil when Load may bring it in.
func (c *Cache) compatible(f *savedFile) error {
	spec, st := f.spec, &f.state
	switch {
	case spec.Name != c.spec.Name:
		return fmt.Errorf("model: file has %q, cache has %q", spec.Name, c.spec.Name)
	case len(spec.Layers) != len(c.layers):
		return fmt.Errorf("model: file has %d layers, cache has %d", len(spec.Layers), len(c.layers))
	case spec.SinkTokens != c.spec.SinkTokens:
		return fmt.Errorf("model: file has %d sink tokens, cache has %d", spec.SinkTokens, c.spec.SinkTokens)
	}
	for l, cl := range c.layers {
		if fl := spec.Layers[l]; fl != cl.spec {
			a, b := fl.String(), cl.spec.String()
			if a == b {
				a, b = fmt.Sprintf("%+v", fl), fmt.Sprintf("%+v", cl.spec)
			}
			return fmt.Errorf("layer %d: file has %s, cache has %s", l, a, b)
		}
	}
	for l, cl := range c.layers {
		if f.formats[l] != cl.format {
			return fmt.Errorf("layer %d: file has %s, cache has %s", l, f.formats[l], cl.format)
		}
	}
	if st.PageSize != c.pageSize {
		return fmt.Errorf("page size: file has %d, cache has %d", st.PageSize, c.pageSize)
	}
	if p := policyOf(c.opts.Eviction); st.Policy != p {
		return fmt.Errorf("eviction policy: file has %s, cache has %s", st.Policy, p)
	}
	for l, cl := range c.layers {
		g := st.Layers[l]
		if g.PageBytes != cl.pageBytes || g.RingBytes != cl.slotBytes || g.KeyBounds != c.questLayer(l) {
			return fmt.Errorf("layer %d: file has pages of %d bytes (ring %d, key bounds %t), cache has %d (ring %d, key bounds %t)",
				l, g.PageBytes, g.RingBytes, g.KeyBounds, cl.pageBytes, cl.slotBytes, c.questLayer(l))
		}
	}
	for gi, g := range c.groups {
		fg := st.Groups[gi] // the file's groups are NewCache's for its spec and policy (checked), so they line up
		if !slices.Equal(fg.Layers, g.layers) || fg.Window != g.rule.window || fg.Sinks != g.rule.sinks {
			return fmt.Errorf("layer group %d: file has layers %s (window %d, sinks %d), cache has layers %s (window %d, sinks %d)",
				gi, joinInts(fg.Layers), fg.Window, fg.Sinks, joinInts(g.layers), g.rule.window, g.rule.sinks)
		}
	}
	return nil
}

// roomLocked fails with a *CapacityError when c lacks the free pages or sequence slots f needs (c.mu held).
func (c *Cache) roomLocked(op, name string, f *savedFile) error {
	for gi, g := range c.groups {
		if need, free := f.state.Groups[gi].Pages, g.available(); need > free {
			return &CapacityError{Op: op, Group: gi, Layers: slices.Clone(g.layers), Needed: need, Free: free, Total: g.pages,
				Detail: "; loading " + name}
		}
	}
	if need, free := len(f.state.Sequences), c.slotsAvailable(); need > free {
		return &CapacityError{Op: op, Group: -1, Needed: need, Free: free, Total: c.opts.MaxSequences, Detail: "loading " + name}
	}
	return nil
}

// install reserves the pages and sequences f needs, writes the stored bytes (without the cache's lock:
// nothing else can reach what it reserved) and installs the sequences' state; a failed write gives back
// everything it reserved.
func (c *Cache) install(op, name string, f *savedFile) ([]*Sequence, error) {
	c.life.RLock()
	defer c.life.RUnlock()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, newErr(op, ErrorClosed, "cache is closed")
	}
	if err := c.roomLocked(op, name, f); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	ids := make([][]int32, len(c.groups))
	for gi, g := range c.groups {
		ids[gi] = make([]int32, f.state.Groups[gi].Pages)
		for i := range ids[gi] {
			ids[gi][i] = g.alloc()
		}
	}
	seqs := make([]*Sequence, len(f.state.Sequences))
	for i := range seqs {
		seqs[i] = c.newSequenceLocked()
		seqs[i].broken = "it is being loaded"
	}
	c.mu.Unlock()

	err := c.writeSaved(op, name, f, ids, seqs)

	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		for gi, g := range c.groups {
			for _, id := range ids[gi] {
				g.unref(id)
			}
		}
		for _, s := range seqs {
			delete(c.seqs, s.id)
			c.slots = append(c.slots, s.slot)
			s.released = true
		}
		return nil, err
	}
	for gi, g := range c.groups {
		for _, id := range ids[gi] {
			g.refs[id] = 0
		}
	}
	for k, s := range seqs {
		c.installSequenceLocked(f, k, s, ids)
	}
	return seqs, nil
}

// writeSaved writes f's pages into the pages ids and its rings into the sequences' slots.
func (c *Cache) writeSaved(op, name string, f *savedFile, ids [][]int32, seqs []*Sequence) error {
	for l, cl := range c.layers {
		gi := cl.group.index
		pages, pb := f.tensor(pagesName(l)), cl.pageBytes
		fill := f.pageTokens(l)
		for i, id := range ids[gi] {
			if err := cl.pool.SetPageBytes(int(id), pages[uint64(i)*pb:uint64(i+1)*pb], fill[i]); err != nil {
				return wrapErr(op, fmt.Sprintf("%s: layer %d, saved page %d", name, l, i), err)
			}
		}
		if cl.slotBytes == 0 {
			continue
		}
		rings, rb := f.tensor(ringsName(l)), cl.slotBytes
		for k, s := range seqs {
			if err := cl.pool.SetSlotBytes(int(s.slot), rings[uint64(k)*rb:uint64(k+1)*rb]); err != nil {
				return wrapErr(op, fmt.Sprintf("%s: layer %d, residual ring of saved sequence %d", name, l, k), err)
			}
		}
	}
	return nil
}

// installSequenceLocked gives s the state of the file's sequence k, its pages being ids (c.mu held).
func (c *Cache) installSequenceLocked(f *savedFile, k int, s *Sequence, ids [][]int32) {
	ss := &f.state.Sequences[k]
	s.length = ss.Length
	for gi, g := range c.groups {
		sg := ss.Groups[gi]
		table := make([]int32, len(sg.Table))
		for j, x := range sg.Table {
			table[j] = -1
			if x >= 0 {
				table[j] = ids[gi][x]
				g.refs[table[j]]++
			}
		}
		s.tables[gi] = table
		s.shift[gi], s.compacted[gi], s.evicted[gi] = sg.Shift, sg.Compacted, sg.Evicted
	}
	if c.tokens != nil {
		for l := range c.layers {
			if !c.tokenLayer(l) {
				continue
			}
			words, scores := f.tensor(hiddenName(l)), f.tensor(scoresName(l))
			for h, x := range ss.Heads[l] {
				hs := &s.heads[l][h]
				*hs = headState{nHidden: x.Hidden}
				if x.Words > 0 {
					hs.hidden = make(tokenBits, x.Words)
					at := f.wordAt[l][k][h] * 4
					for w := range hs.hidden {
						hs.hidden[w] = binary.LittleEndian.Uint32(words[at+4*w:])
					}
				}
				if x.Scores >= 0 {
					hs.score = make([]float32, x.Scores)
					at := f.scoreAt[l][k][h] * 4
					for t := range hs.score {
						hs.score[t] = math.Float32frombits(binary.LittleEndian.Uint32(scores[at+4*t:]))
					}
				}
			}
		}
	}
	s.snapDone = ss.SnapDone
	s.untracked = ss.Untracked
	if !ss.Untracked && ss.Length > 0 {
		ids := f.tensor(tokensName)[f.tokenAt[k]*4:]
		s.tokens = make([]int32, ss.Length)
		for i := range s.tokens {
			s.tokens[i] = int32(binary.LittleEndian.Uint32(ids[4*i:]))
		}
		// The pages are the bytes the tokens stored: they get their names back, for prefix reuse.
		c.nameStepPagesLocked(s, 0)
	}
	if ss.QuestRead != nil {
		s.questRead = make([][]int, len(ss.QuestRead))
		for l, r := range ss.QuestRead {
			s.questRead[l] = slices.Clone(r)
		}
	}
	s.broken = ""
}

// openSaved opens a saved cache for reading and returns its size.
func openSaved(op, path string) (*os.File, int64, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, 0, &Error{Op: op, Code: ErrorInvalid, Msg: err.Error(), cause: err}
	}
	info, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, 0, &Error{Op: op, Code: ErrorInvalid, Msg: err.Error(), cause: err}
	}
	return fh, info.Size(), nil
}
