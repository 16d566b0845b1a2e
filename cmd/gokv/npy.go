package main

// .npy files: reading the float arrays gokv attend takes, and writing its outputs.
//
// The header is parsed here rather than through a library: the npyio releases panic on truncated or
// reordered headers and reject version 3.0 and compact dicts that numpy itself reads.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
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

const (
	npyMagic = "\x93NUMPY"
	// npyMaxHeaderLen is the header size numpy.load refuses beyond; a float array's header is ~128 bytes.
	npyMaxHeaderLen = 10000
	// npyMaxElements bounds what one file may hand gokv attend (8 GiB of float32).
	npyMaxElements = math.MaxInt32
	// npyChunkBytes is how much data is read and converted at a time, so that a file never costs more
	// memory than its float32 values.
	npyChunkBytes = 64 << 10
)

// npyHeader is what a .npy header says about the array that follows it.
type npyHeader struct {
	descr        string
	fortranOrder bool
	shape        []int
}

// malformedNPY is the error for a file whose bytes are not a .npy layout gokv can read.
func malformedNPY(path, format string, args ...any) error {
	return fmt.Errorf("%s: not a readable .npy file: %s", path, fmt.Sprintf(format, args...))
}

// readNPY reads a float16, float32 or float64 .npy file in C order into float32. Errors name the file
// and say what is wrong; a malformed file always reads "<path>: not a readable .npy file: <why>".
//
// Every size the file claims (header length, shape × item size) is checked against the file's real size
// before anything is allocated, so a corrupt or hostile header cannot make it allocate more than the
// file's data as float32 plus the header and a 64 KiB read buffer.
func readNPY(path string) (tensor, error) {
	f, err := os.Open(path)
	if err != nil {
		return tensor{}, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return tensor{}, err
	}
	if !info.Mode().IsRegular() {
		// Pipes and devices have no size to check claims against.
		return tensor{}, malformedNPY(path, "it is not a regular file")
	}
	fileSize := info.Size()

	h, dataOffset, err := readNPYHeader(f, fileSize)
	if err != nil {
		return tensor{}, malformedNPY(path, "%s", err)
	}
	shape := h.shape
	for _, d := range shape {
		if d < 0 {
			return tensor{}, malformedNPY(path, "shape %s has a negative dimension", shapeString(shape))
		}
	}
	if h.fortranOrder && len(shape) > 1 {
		return tensor{}, fmt.Errorf("%s: array is in Fortran order; write it in C order (numpy.ascontiguousarray)", path)
	}
	order, itemSize, ok := npyFloatType(h.descr)
	if !ok {
		return tensor{}, fmt.Errorf("%s: dtype %q is not supported (want float16, float32 or float64)", path, clip(h.descr))
	}

	// Elements and bytes in uint64 with overflow caught: a shape's product can exceed any integer.
	dataHeld := uint64(fileSize - dataOffset)
	elements, overflow := uint64(1), false
	for _, d := range shape {
		hi, lo := bits.Mul64(elements, uint64(d))
		elements, overflow = lo, overflow || hi != 0
	}
	hi, dataBytes := bits.Mul64(elements, uint64(itemSize))
	overflow = overflow || hi != 0
	if slices.Contains(shape, 0) {
		// A zero dimension empties the array whatever the others claim.
		elements, dataBytes, overflow = 0, 0, false
	}
	if overflow {
		return tensor{}, malformedNPY(path, "shape %s of %s needs more than 2^64 data bytes, the file holds %d",
			shapeString(shape), h.descr, dataHeld)
	}
	if dataBytes > dataHeld {
		return tensor{}, malformedNPY(path, "shape %s of %s needs %d data bytes, the file holds %d",
			shapeString(shape), h.descr, dataBytes, dataHeld)
	}
	if elements > npyMaxElements {
		return tensor{}, fmt.Errorf("%s: shape %s has %d elements, more than the %d gokv reads from one file",
			path, shapeString(shape), elements, npyMaxElements)
	}

	out := tensor{Shape: shape, Data: make([]float32, elements)}
	chunk := make([]byte, min(npyChunkBytes, dataBytes))
	for done := 0; done < len(out.Data); {
		n := min(len(chunk)/itemSize, len(out.Data)-done)
		if _, err := io.ReadFull(f, chunk[:n*itemSize]); err != nil {
			// Only if the file shrank after the size checks.
			return tensor{}, malformedNPY(path, "reading the data: %s", err)
		}
		dst := out.Data[done : done+n]
		switch itemSize {
		case 2:
			for i := range dst {
				dst[i] = halfToFloat(order.Uint16(chunk[2*i:]))
			}
		case 4:
			for i := range dst {
				dst[i] = math.Float32frombits(order.Uint32(chunk[4*i:]))
			}
		case 8:
			for i := range dst {
				dst[i] = float32(math.Float64frombits(order.Uint64(chunk[8*i:])))
			}
		}
		done += n
	}
	return out, nil
}

// npyFloatType gives the byte order and item size of a float descr as numpy writes it: an optional
// byte-order mark ('<', '>', or '|' / '=' for native) and f2, f4 or f8.
func npyFloatType(descr string) (binary.ByteOrder, int, bool) {
	var order binary.ByteOrder = binary.NativeEndian
	kind := descr
	if len(descr) == 3 {
		switch descr[0] {
		case '<':
			order = binary.LittleEndian
		case '>':
			order = binary.BigEndian
		case '|', '=':
		default:
			return nil, 0, false
		}
		kind = descr[1:]
	}
	size := map[string]int{"f2": 2, "f4": 4, "f8": 8}[kind]
	return order, size, size != 0
}

// readNPYHeader reads the magic, version, header length and header of a .npy file of fileSize bytes from
// r, and returns the header and the offset its data starts at. numpy writes versions 1.0 (2-byte header
// length), 2.0 (4-byte length) and 3.0 (4-byte length, utf-8 header).
func readNPYHeader(r io.Reader, fileSize int64) (npyHeader, int64, error) {
	if fileSize == 0 {
		return npyHeader{}, 0, errors.New("the file is empty")
	}
	var prefix [len(npyMagic) + 2 + 4]byte // magic, version, and a header length of 2 or 4 bytes
	got, _ := io.ReadFull(r, prefix[:min(8, fileSize)])
	if !strings.HasPrefix(npyMagic, string(prefix[:min(got, len(npyMagic))])) {
		return npyHeader{}, 0, fmt.Errorf("it does not start with the .npy magic %q", npyMagic)
	}
	if got < 8 {
		return npyHeader{}, 0, errors.New("the file ends before the format version")
	}
	major, minor := prefix[6], prefix[7]
	if major < 1 || major > 3 || minor != 0 {
		return npyHeader{}, 0, fmt.Errorf("version %d.%d is not supported (numpy writes 1.0, 2.0 and 3.0)", major, minor)
	}
	prefixLen := int64(8 + 2)
	if major > 1 {
		prefixLen = 8 + 4
	}
	if fileSize < prefixLen {
		return npyHeader{}, 0, errors.New("the file ends inside the header length")
	}
	if _, err := io.ReadFull(r, prefix[8:prefixLen]); err != nil {
		return npyHeader{}, 0, fmt.Errorf("reading the header length: %w", err)
	}
	var headerLen int64
	if major == 1 {
		headerLen = int64(binary.LittleEndian.Uint16(prefix[8:]))
	} else {
		headerLen = int64(binary.LittleEndian.Uint32(prefix[8:]))
	}
	if headerLen > npyMaxHeaderLen {
		return npyHeader{}, 0, fmt.Errorf("the header claims %d bytes, more than numpy's limit of %d", headerLen, npyMaxHeaderLen)
	}
	if held := fileSize - prefixLen; headerLen > held {
		return npyHeader{}, 0, fmt.Errorf("the file ends inside the header: it claims %d bytes, the file holds %d after the %d-byte prefix",
			headerLen, held, prefixLen)
	}
	header := make([]byte, headerLen)
	if _, err := io.ReadFull(r, header); err != nil {
		return npyHeader{}, 0, fmt.Errorf("reading the header: %w", err)
	}
	if major == 3 && !utf8.Valid(header) {
		return npyHeader{}, 0, errors.New("the version 3.0 header is not valid utf-8")
	}
	h, err := parseNPYHeader(string(header))
	return h, prefixLen + headerLen, err
}

// parseNPYHeader parses a .npy header: a Python dict literal with exactly the keys 'descr' (a string),
// 'fortran_order' (True or False) and 'shape' (a tuple of ints), in any order, with any spacing and
// optional trailing commas, followed by whitespace. That is everything numpy.save writes and what
// numpy.load accepts for a plain array; anything else is rejected with the reason.
func parseNPYHeader(header string) (npyHeader, error) {
	p := npyHeaderParser{s: header}
	var h npyHeader
	p.skipSpace()
	if p.eof() {
		return h, errors.New("the header is empty")
	}
	if p.s[p.pos] != '{' {
		return h, fmt.Errorf("the header does not start with '{' but %q", clip(p.s[p.pos:]))
	}
	p.pos++
	seen := map[string]bool{}
	for {
		p.skipSpace()
		if p.eof() {
			return h, errNoClosingBrace
		}
		if p.s[p.pos] == '}' {
			p.pos++
			break
		}
		key, err := p.quoted("a quoted key")
		if err != nil {
			return h, err
		}
		if seen[key] {
			return h, fmt.Errorf("key %s appears twice", pyQuote(key))
		}
		seen[key] = true
		p.skipSpace()
		if err := p.expect(':', "':' after key "+pyQuote(key)); err != nil {
			return h, err
		}
		p.skipSpace()
		switch key {
		case "descr":
			h.descr, err = p.quoted("a quoted dtype for 'descr' (structured dtypes are not supported)")
		case "fortran_order":
			h.fortranOrder, err = p.boolean("True or False for 'fortran_order'")
		case "shape":
			h.shape, err = p.intTuple()
		default:
			err = fmt.Errorf("unknown key %s (a .npy header has 'descr', 'fortran_order' and 'shape')", pyQuote(key))
		}
		if err != nil {
			return h, err
		}
		p.skipSpace()
		if p.eof() {
			return h, errNoClosingBrace
		}
		if p.s[p.pos] == ',' {
			p.pos++
			continue
		}
		if err := p.expect('}', "',' or '}' after the value of "+pyQuote(key)); err != nil {
			return h, err
		}
		break
	}
	p.skipSpace()
	if !p.eof() {
		return h, fmt.Errorf("the header has %q after its closing '}'", clip(p.s[p.pos:]))
	}
	for _, key := range []string{"descr", "fortran_order", "shape"} {
		if !seen[key] {
			return h, fmt.Errorf("the header has no %s key", pyQuote(key))
		}
	}
	return h, nil
}

var errNoClosingBrace = errors.New("the header has no closing '}'")

// npyHeaderParser walks a header string; every method stops at its end rather than indexing past it.
type npyHeaderParser struct {
	s   string
	pos int
}

func (p *npyHeaderParser) eof() bool { return p.pos >= len(p.s) }

// skipSpace skips what Python's tokenizer takes as whitespace between tokens; numpy pads with spaces
// and ends the header with '\n'.
func (p *npyHeaderParser) skipSpace() {
	for !p.eof() && strings.IndexByte(" \t\n\r\f", p.s[p.pos]) >= 0 {
		p.pos++
	}
}

// unexpected says what was found where want was expected.
func (p *npyHeaderParser) unexpected(want string) error {
	if p.eof() {
		return errNoClosingBrace
	}
	return fmt.Errorf("expected %s at byte %d of the header, found %q", want, p.pos, clip(p.s[p.pos:]))
}

func (p *npyHeaderParser) expect(c byte, want string) error {
	if p.eof() || p.s[p.pos] != c {
		return p.unexpected(want)
	}
	p.pos++
	return nil
}

// quoted reads a '...' or "..." string. Escapes are kept as written: no key or float dtype has one.
func (p *npyHeaderParser) quoted(want string) (string, error) {
	if p.eof() || (p.s[p.pos] != '\'' && p.s[p.pos] != '"') {
		return "", p.unexpected(want)
	}
	quote, start := p.s[p.pos], p.pos+1
	for i := start; i < len(p.s); i++ {
		switch p.s[i] {
		case quote:
			p.pos = i + 1
			return p.s[start:i], nil
		case '\\':
			i++
		case '\n':
			return "", fmt.Errorf("the string at byte %d of the header is not closed on its line", start-1)
		}
	}
	return "", errNoClosingBrace
}

func (p *npyHeaderParser) boolean(want string) (bool, error) {
	for _, word := range []string{"True", "False"} {
		if strings.HasPrefix(p.s[p.pos:], word) && !p.identifierAt(p.pos+len(word)) {
			p.pos += len(word)
			return word == "True", nil
		}
	}
	return false, p.unexpected(want)
}

func (p *npyHeaderParser) identifierAt(i int) bool {
	if i >= len(p.s) {
		return false
	}
	c := p.s[i]
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

// intTuple reads a shape: (), (5,), (2, 3) or (2, 3,). A bare (5) is an int in Python, not a tuple.
func (p *npyHeaderParser) intTuple() ([]int, error) {
	if err := p.expect('(', "a tuple for 'shape'"); err != nil {
		return nil, err
	}
	shape := []int{}
	for {
		p.skipSpace()
		if p.eof() {
			return nil, errNoClosingBrace
		}
		if p.s[p.pos] == ')' {
			p.pos++
			return shape, nil
		}
		d, err := p.integer()
		if err != nil {
			return nil, err
		}
		shape = append(shape, d)
		p.skipSpace()
		if p.eof() {
			return nil, errNoClosingBrace
		}
		if p.s[p.pos] == ',' {
			p.pos++
			continue
		}
		if err := p.expect(')', "',' or ')' in 'shape'"); err != nil {
			return nil, err
		}
		if len(shape) == 1 {
			return nil, fmt.Errorf("'shape' is (%d), an int rather than a tuple; a 1-d shape is written (%d,)", d, d)
		}
		return shape, nil
	}
}

// integer reads a decimal int with an optional '-': negative dims are reported by the caller, which
// knows the whole shape.
func (p *npyHeaderParser) integer() (int, error) {
	start := p.pos
	if !p.eof() && p.s[p.pos] == '-' {
		p.pos++
	}
	digits := p.pos
	for !p.eof() && p.s[p.pos] >= '0' && p.s[p.pos] <= '9' {
		p.pos++
	}
	if p.pos == digits || p.identifierAt(p.pos) {
		p.pos = start
		return 0, p.unexpected("an integer dimension in 'shape'")
	}
	d, err := strconv.Atoi(p.s[start:p.pos])
	if err != nil {
		return 0, fmt.Errorf("dimension %s in 'shape' is too large", clip(p.s[start:p.pos]))
	}
	return d, nil
}

// pyQuote quotes text from a header as Python would, escaping what is not printable.
func pyQuote(s string) string {
	q := strconv.Quote(s)
	return "'" + strings.ReplaceAll(strings.ReplaceAll(q[1:len(q)-1], `\"`, `"`), "'", `\'`) + "'"
}

// clip shortens text quoted from a header in an error to a readable length, dropping the padding.
func clip(s string) string {
	const max = 20
	s = strings.TrimRight(s, " \t\n\r\f")
	if len(s) > max {
		s = s[:max] + "..."
	}
	return s
}

// writeNPY writes t as a little-endian float32 .npy file.
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
	buf.WriteString(npyMagic)
	buf.Write([]byte{1, 0})
	binary.Write(&buf, binary.LittleEndian, uint16(len(header)))
	buf.WriteString(header)
	buf.Write(payload)
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
