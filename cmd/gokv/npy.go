package main

// .npy files: reading the float arrays gokv attend takes, and writing its outputs.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/sbinet/npyio/npy"
)

// ---- .npy files ----

// tensor is a C-ordered float32 array read from or written to a .npy file.
type tensor struct {
	Shape []int
	Data  []float32
}

// shapeString renders a shape as numpy does: (2, 3), (5,).
func shapeString(shape []int) string {
	parts := make([]string, len(shape))
	for i, d := range shape {
		parts[i] = strconv.Itoa(d)
	}
	if len(parts) == 1 {
		return "(" + parts[0] + ",)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// readNPY reads a float16, float32 or float64 .npy file in C order into float32. Errors name the file
// and, for layout problems, its dtype and shape.
//
// npyio parses the header; the data is read here with one io.ReadFull, because npyio's element reader
// ignores short reads (a truncated file would come back padded with garbage) and has no float16.
func readNPY(path string) (tensor, error) {
	f, err := os.Open(path)
	if err != nil {
		return tensor{}, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	r, err := npy.NewReader(br)
	if err != nil {
		return tensor{}, fmt.Errorf("%s: not a readable .npy file: %w", path, err)
	}
	h := r.Header.Descr
	shape := slices.Clone(h.Shape)
	n := 1
	for _, d := range shape {
		if d < 0 || (d > 0 && n > math.MaxInt32/d) {
			return tensor{}, fmt.Errorf("%s: shape %s is too large", path, shapeString(shape))
		}
		n *= d
	}
	if h.Fortran && len(shape) > 1 {
		return tensor{}, fmt.Errorf("%s: array is in Fortran order; write it in C order (numpy.ascontiguousarray)", path)
	}
	var order binary.ByteOrder = binary.LittleEndian
	if strings.HasPrefix(h.Type, ">") {
		order = binary.BigEndian
	}
	size := map[string]int{"f2": 2, "f4": 4, "f8": 8}[strings.TrimLeft(h.Type, "<>|=")]
	if size == 0 {
		return tensor{}, fmt.Errorf("%s: dtype %q is not supported (want float16, float32 or float64)", path, h.Type)
	}
	raw := make([]byte, size*n)
	if got, err := io.ReadFull(br, raw); err != nil {
		return tensor{}, fmt.Errorf("%s: shape %s of %s needs %d data bytes, the file has %d: %w", path,
			shapeString(shape), h.Type, len(raw), got, err)
	}
	out := tensor{Shape: shape, Data: make([]float32, n)}
	for i := range out.Data {
		switch size {
		case 2:
			out.Data[i] = halfToFloat(order.Uint16(raw[2*i:]))
		case 4:
			out.Data[i] = math.Float32frombits(order.Uint32(raw[4*i:]))
		case 8:
			out.Data[i] = float32(math.Float64frombits(order.Uint64(raw[8*i:])))
		}
	}
	return out, nil
}

// writeNPY writes t as a little-endian float32 .npy file. npyio's writer infers shapes from Go array types
// only, so an N-d shape known at run time is written here; tests read the files back with npyio.
func writeNPY(path string, t tensor) error {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	if n != len(t.Data) {
		return fmt.Errorf("%s: %d values do not fill shape %s", path, len(t.Data), shapeString(t.Shape))
	}
	payload := make([]byte, 4*len(t.Data))
	for i, x := range t.Data {
		binary.LittleEndian.PutUint32(payload[4*i:], math.Float32bits(x))
	}
	return writeNPYRaw(path, "<f4", t.Shape, payload)
}

// writeNPYRaw writes a .npy file (format 1.0, header padded to 64 bytes as numpy does) of dtype descr
// holding payload, the C-ordered little-endian data.
func writeNPYRaw(path, descr string, shape []int, payload []byte) error {
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shapeString(shape))
	const prefix = 10 // magic (6) + version (2) + header length (2)
	total := (prefix + len(dict) + 1 + 63) / 64 * 64
	header := dict + strings.Repeat(" ", total-prefix-len(dict)-1) + "\n"
	var buf bytes.Buffer
	buf.Write(npy.Magic[:])
	buf.Write([]byte{1, 0})
	binary.Write(&buf, binary.LittleEndian, uint16(len(header)))
	buf.WriteString(header)
	buf.Write(payload)
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
