package gokv

import (
	"fmt"
	"hash/crc32"
	"io"

	"github.com/nlpodyssey/safetensors"
)

// SavedCache describes a file written by Cache.Save, as InspectSavedCache finds it.
type SavedCache struct {
	Version     int
	Model       ModelSpec
	Formats     []Format       // per layer
	PageSize    int            // tokens per page
	Eviction    EvictionPolicy // nil: Full
	Policy      string         // the policy as Go writes it: "Full", "H2O{Budget: 64, Recent: 8}", ...
	Groups      []SavedGroup
	Sequences   []SavedSequence
	Tensors     []SavedTensor // in file order
	HeaderBytes int64         // the JSON header (the data starts 8 bytes later)
	FileBytes   int64
}

// SavedGroup is one layer group of a saved cache.
type SavedGroup struct {
	Layers []int
	Window int // attention window (0: full attention)
	Sinks  int // sink positions kept under the window
	Pages  int // pages saved, each once however many sequences hold it
}

// SavedSequence is one saved sequence.
type SavedSequence struct {
	Length   int   // tokens (its next position)
	Pages    []int // per layer group: pages its table holds
	Released []int // per layer group: page-table entries released by eviction
	Shift    []int // per layer group: positions compaction removed (0: not compacted)
	Hidden   []int // per layer: tokens hidden from its kv heads, summed over them (token rules; 0 elsewhere)
}

// SavedTensor is one tensor of a saved cache's file.
type SavedTensor struct {
	Name     string // e.g. "layer.3.pages"
	DType    string // U8, U32, F32
	Shape    []int64
	Bytes    int64
	Checksum string // CRC-32C the file gives, 8 hex digits
	Verified bool   // the tensor's bytes have that checksum
}

// InspectSavedCache reads the file at path and checks it as Cache.Load does short of a cache: its size
// and structure, the state's consistency and checksum, and every tensor's checksum, reading one tensor at
// a time (memory stays small whatever the file's size). It needs no device. It returns the description
// and nil when everything checks; when a tensor's checksum fails, the description (with Verified false
// for the tensors at fault) and an ErrInvalid error; when the header cannot be read, nil and the error
// (ErrVersion for another format version).
func InspectSavedCache(path string) (*SavedCache, error) {
	const op = "InspectSavedCache"
	fh, size, err := openSaved(op, path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	f, err := readSavedHeader(fh, size)
	if err != nil {
		return nil, loadErr(op, path, err)
	}
	out := describeSaved(f)
	out.FileBytes = size

	var first error
	base := int64(8 + f.headerLen)
	for i := range f.tensors {
		t := &f.tensors[i]
		h := crc32.New(castagnoli)
		var w io.Writer = h
		var keep []byte
		if t.dtype == safetensors.U32 { // the hidden bitsets: checked against the state once verified
			keep = make([]byte, 0, t.size)
			w = io.MultiWriter(h, &sliceWriter{&keep})
		}
		if _, err := io.Copy(w, io.NewSectionReader(fh, base+int64(t.begin), int64(t.size))); err != nil {
			return nil, loadErr(op, path, err)
		}
		t.data = keep
		if got := fmt.Sprintf("%08x", h.Sum32()); got == f.state.Tensors[t.name] {
			out.Tensors[i].Verified = true
		} else if first == nil {
			first = fmt.Errorf("tensor %s: checksum %s, the state says %s: the file is corrupted", t.name, got, f.state.Tensors[t.name])
		}
	}
	if first == nil {
		first = f.checkBitsets()
	}
	if first != nil {
		return out, loadErr(op, path, first)
	}
	return out, nil
}

type sliceWriter struct{ b *[]byte }

func (w *sliceWriter) Write(p []byte) (int, error) {
	*w.b = append(*w.b, p...)
	return len(p), nil
}

// describeSaved turns a checked header into its description (tensors not yet verified).
func describeSaved(f *savedFile) *SavedCache {
	st := &f.state
	out := &SavedCache{Version: savedVersion, Model: f.spec.Clone(), Formats: append([]Format(nil), f.formats...),
		PageSize: st.PageSize, Eviction: f.policy, Policy: st.Policy.String(), HeaderBytes: int64(f.headerLen)}
	for _, g := range st.Groups {
		out.Groups = append(out.Groups, SavedGroup{Layers: append([]int(nil), g.Layers...), Window: g.Window, Sinks: g.Sinks, Pages: g.Pages})
	}
	for _, s := range st.Sequences {
		d := SavedSequence{Length: s.Length, Hidden: make([]int, len(f.spec.Layers))}
		for _, g := range s.Groups {
			held, released := 0, 0
			for _, id := range g.Table {
				if id < 0 {
					released++
				} else {
					held++
				}
			}
			d.Pages, d.Released, d.Shift = append(d.Pages, held), append(d.Released, released), append(d.Shift, g.Shift)
		}
		for l, hs := range s.Heads {
			for _, h := range hs {
				d.Hidden[l] += h.Hidden
			}
		}
		out.Sequences = append(out.Sequences, d)
	}
	for _, t := range f.tensors {
		shape := make([]int64, len(t.shape))
		for i, x := range t.shape {
			shape[i] = int64(x)
		}
		out.Tensors = append(out.Tensors, SavedTensor{Name: t.name, DType: t.dtype.String(), Shape: shape, Bytes: int64(t.size),
			Checksum: st.Tensors[t.name]})
	}
	return out
}
