package main

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// npyFile builds a .npy file as numpy.save does: magic, version, header length (2 bytes for 1.0, 4 for
// 2.0 and 3.0), the dict padded with spaces and ended by '\n' to a multiple of 64 bytes, then payload.
func npyFile(major byte, dict string, payload []byte) []byte {
	prefix := 10
	if major > 1 {
		prefix = 12
	}
	total := (prefix + len(dict) + 1 + 63) / 64 * 64
	return npyFileRaw(major, dict+strings.Repeat(" ", total-prefix-len(dict)-1)+"\n", payload)
}

// npyFileRaw builds a .npy file with header taken as is, so tests can break its layout.
func npyFileRaw(major byte, header string, payload []byte) []byte {
	var b bytes.Buffer
	b.WriteString(npyMagic)
	b.Write([]byte{major, 0})
	if major == 1 {
		binary.Write(&b, binary.LittleEndian, uint16(len(header)))
	} else {
		binary.Write(&b, binary.LittleEndian, uint32(len(header)))
	}
	b.WriteString(header)
	b.Write(payload)
	return b.Bytes()
}

// npyDict is the header dict numpy.save writes.
func npyDict(descr string, shape string) string {
	return "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }"
}

// encodeFloats encodes xs as descr's item type and byte order.
func encodeFloats(t testing.TB, descr string, xs []float32) []byte {
	order, size, ok := npyFloatType(descr)
	require.True(t, ok, descr)
	out := make([]byte, size*len(xs))
	for i, x := range xs {
		switch size {
		case 2:
			h := map[float32]uint16{0: 0, 1: 0x3c00, -2: 0xc000, 0.5: 0x3800, 65504: 0x7bff, 1.5: 0x3e00}[x]
			require.Equal(t, x, halfToFloat(h), "test value %g has no half encoding here", x)
			order.PutUint16(out[2*i:], h)
		case 4:
			order.PutUint32(out[4*i:], math.Float32bits(x))
		case 8:
			order.PutUint64(out[8*i:], math.Float64bits(float64(x)))
		}
	}
	return out
}

func writeTemp(t testing.TB, name string, data []byte) string {
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, data, 0o644))
	return path
}

func TestReadNPYValid(t *testing.T) {
	six := []float32{0, 1, -2, 0.5, 65504, 1.5}
	cases := []struct {
		name  string
		file  []byte
		shape []int
		data  []float32
	}{
		{"v1 <f4", npyFile(1, npyDict("<f4", "(2, 3)"), encodeFloats(t, "<f4", six)), []int{2, 3}, six},
		{"v2 <f4", npyFile(2, npyDict("<f4", "(2, 3)"), encodeFloats(t, "<f4", six)), []int{2, 3}, six},
		{"v3 <f4", npyFile(3, npyDict("<f4", "(2, 3)"), encodeFloats(t, "<f4", six)), []int{2, 3}, six},
		{"v1 >f4", npyFile(1, npyDict(">f4", "(6,)"), encodeFloats(t, ">f4", six)), []int{6}, six},
		{"v1 <f2", npyFile(1, npyDict("<f2", "(3, 2)"), encodeFloats(t, "<f2", six)), []int{3, 2}, six},
		{"v1 >f2", npyFile(1, npyDict(">f2", "(3, 2)"), encodeFloats(t, ">f2", six)), []int{3, 2}, six},
		{"v2 <f8", npyFile(2, npyDict("<f8", "(1, 6)"), encodeFloats(t, "<f8", six)), []int{1, 6}, six},
		{"v3 >f8", npyFile(3, npyDict(">f8", "(6, 1)"), encodeFloats(t, ">f8", six)), []int{6, 1}, six},
		{"native =f4", npyFile(1, npyDict("=f4", "(6,)"), encodeFloats(t, "=f4", six)), []int{6}, six},
		{"native |f8", npyFile(1, npyDict("|f8", "(6,)"), encodeFloats(t, "|f8", six)), []int{6}, six},
		{"scalar", npyFile(1, npyDict("<f4", "()"), encodeFloats(t, "<f4", six[2:3])), []int{}, six[2:3]},
		{"empty dim", npyFile(1, npyDict("<f4", "(0, 3)"), nil), []int{0, 3}, []float32{}},
		{"zero dim beside a huge one", npyFile(1, npyDict("<f8", "(0, 9223372036854775807, 3)"), nil),
			[]int{0, math.MaxInt, 3}, []float32{}},
		{"compact", npyFile(1, "{'descr':'<f4','fortran_order':False,'shape':(2,3)}", encodeFloats(t, "<f4", six)),
			[]int{2, 3}, six},
		{"keys reordered", npyFile(1, "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
			encodeFloats(t, "<f4", six)), []int{2, 3}, six},
		{"double quotes and newlines", npyFile(1, "{\n\"descr\": \"<f4\",\n\"fortran_order\": False,\n\"shape\": (2, 3,),\n}",
			encodeFloats(t, "<f4", six)), []int{2, 3}, six},
		{"header without its newline", npyFileRaw(1, npyDict("<f4", "(6,)"), encodeFloats(t, "<f4", six)), []int{6}, six},
		{"fortran order 1-d", npyFile(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (6,), }",
			encodeFloats(t, "<f4", six)), []int{6}, six},
		{"trailing bytes after the data", npyFile(1, npyDict("<f4", "(2,)"), encodeFloats(t, "<f4", six)),
			[]int{2}, six[:2]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := readNPY(writeTemp(t, "a.npy", c.file))
			require.NoError(t, err)
			assert.Equal(t, c.shape, got.Shape)
			assert.Equal(t, c.data, got.Data)
		})
	}
}

// badNPYFiles are malformed files and the reason readNPY must give for each, after
// "<path>: not a readable .npy file: ".
var badNPYFiles = []struct {
	name string
	file []byte
	why  string
}{
	{"empty", nil, "the file is empty"},
	{"junk", []byte("not numpy"), "it does not start with the .npy magic"},
	{"magic cut", []byte("\x93NUM"), "the file ends before the format version"},
	{"version 4", npyFile(4, npyDict("<f4", "(2,)"), make([]byte, 8)), "version 4.0 is not supported"},
	{"version 1.1", append([]byte(npyMagic), 1, 1, 10, 0), "version 1.1 is not supported"},
	{"header length cut", append([]byte(npyMagic), 2, 0, 10, 0), "the file ends inside the header length"},
	{"cut inside the header", npyFile(1, npyDict("<f4", "(2,)"), nil)[:40], "the file ends inside the header"},
	{"v2 header length 0xFFFFFFF0", append([]byte(npyMagic), 2, 0, 0xf0, 0xff, 0xff, 0xff, '{'),
		"the header claims 4294967280 bytes, more than numpy's limit of 10000"},
	{"header longer than the file", append([]byte(npyMagic), 1, 0, 0x00, 0x10, '{'),
		"the file ends inside the header: it claims 4096 bytes, the file holds 1 after the 10-byte prefix"},
	{"empty header", npyFileRaw(1, "", nil), "the header is empty"},
	{"no closing brace", npyFileRaw(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), \n", nil),
		"the header has no closing '}'"},
	{"header ends in a string", npyFileRaw(1, "{'descr': '<f4", nil), "the header has no closing '}'"},
	{"header ends in the shape", npyFileRaw(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3", nil),
		"the header has no closing '}'"},
	{"not a dict", npyFile(1, "['descr', '<f4']", nil), `the header does not start with '{' but "['descr', '<f4']"`},
	{"unknown key", npyFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'foo': 1}", nil),
		"unknown key 'foo'"},
	{"missing key", npyFile(1, "{'descr': '<f4', 'shape': (2,)}", nil), "the header has no 'fortran_order' key"},
	{"duplicate key", npyFile(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", nil),
		"key 'descr' appears twice"},
	{"unquoted key", npyFile(1, "{descr: '<f4'}", nil), `expected a quoted key at byte 1 of the header, found "descr: '<f4'}"`},
	{"missing colon", npyFile(1, "{'descr' '<f4'}", nil), "expected ':' after key 'descr'"},
	{"missing comma", npyFile(1, "{'descr': '<f4' 'shape': (2,)}", nil), "expected ',' or '}' after the value of 'descr'"},
	{"fortran_order not a bool", npyFile(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", nil),
		"expected True or False for 'fortran_order'"},
	{"structured descr", npyFile(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", nil),
		"expected a quoted dtype for 'descr'"},
	{"shape not a tuple", npyFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", nil),
		"expected a tuple for 'shape'"},
	{"shape an int in parentheses", npyFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (5)}", nil),
		"'shape' is (5), an int rather than a tuple; a 1-d shape is written (5,)"},
	{"shape with a float", npyFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,)}", nil),
		"expected ',' or ')' in 'shape'"},
	{"shape with a hex dim", npyFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0x10,)}", nil),
		"expected an integer dimension in 'shape'"},
	{"dim beyond int", npyFile(1, npyDict("<f4", "(99999999999999999999,)"), nil),
		"dimension 99999999999999999999 in 'shape' is too large"},
	{"text after the dict", npyFile(1, npyDict("<f4", "(2,)")+" x", nil), `the header has "x" after its closing '}'`},
	{"string across lines", npyFile(1, "{'descr': '<f4\n', 'fortran_order': False, 'shape': (2,)}", nil),
		"the string at byte 10 of the header is not closed on its line"},
	{"v3 header not utf-8", npyFile(3, "{'descr': '<f4\xff', 'fortran_order': False, 'shape': (2,)}", nil),
		"the version 3.0 header is not valid utf-8"},
	{"negative dim", npyFile(1, npyDict("<f4", "(-64, 2, 64)"), nil), "shape (-64, 2, 64) has a negative dimension"},
	{"shape bigger than the file", npyFile(1, npyDict("<f8", "(65535, 128, 256)"), make([]byte, 48)),
		"shape (65535, 128, 256) of <f8 needs 17179607040 data bytes, the file holds 48"},
	{"shape overflowing 64 bits", npyFile(1, npyDict("<f4", "(4294967296, 4294967296)"), nil),
		"shape (4294967296, 4294967296) of <f4 needs more than 2^64 data bytes, the file holds 0"},
	{"bytes overflowing 64 bits", npyFile(1, npyDict("<f8", "(4611686018427387904,)"), nil),
		"shape (4611686018427387904,) of <f8 needs more than 2^64 data bytes, the file holds 0"},
	{"truncated data", npyFile(1, npyDict("<f4", "(10, 2, 64)"), make([]byte, 100)),
		"shape (10, 2, 64) of <f4 needs 5120 data bytes, the file holds 100"},
}

func TestReadNPYMalformed(t *testing.T) {
	for _, c := range badNPYFiles {
		t.Run(c.name, func(t *testing.T) {
			path := writeTemp(t, "bad.npy", c.file)
			_, err := readNPY(path)
			require.Error(t, err)
			assert.Contains(t, err.Error(), path+": not a readable .npy file: "+c.why)
		})
	}
}

// TestReadNPYUnsupported covers well-formed files gokv attend cannot use: their errors name the file
// and say what to change.
func TestReadNPYUnsupported(t *testing.T) {
	cases := []struct {
		name string
		file []byte
		want string
	}{
		{"int dtype", npyFile(1, npyDict("<i4", "(4,)"), make([]byte, 16)),
			`dtype "<i4" is not supported (want float16, float32 or float64)`},
		{"two byte-order marks", npyFile(1, npyDict("<<f4", "(4,)"), make([]byte, 16)), `dtype "<<f4" is not supported`},
		{"fortran order", npyFile(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", make([]byte, 16)),
			"array is in Fortran order; write it in C order (numpy.ascontiguousarray)"},
		{"directory", nil, "not a readable .npy file: it is not a regular file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := t.TempDir()
			if c.file != nil {
				path = writeTemp(t, "a.npy", c.file)
			}
			_, err := readNPY(path)
			require.Error(t, err)
			assert.Contains(t, err.Error(), path+": "+c.want)
		})
	}
	_, err := readNPY(filepath.Join(t.TempDir(), "nope.npy"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// TestReadNPYAllocatesByFileSize checks that a header's claims do not turn into allocations: each file
// here is tiny and claims gigabytes.
func TestReadNPYAllocatesByFileSize(t *testing.T) {
	for _, name := range []string{"shape bigger than the file", "v2 header length 0xFFFFFFF0", "header longer than the file"} {
		for _, c := range badNPYFiles {
			if c.name == name {
				path := writeTemp(t, "big.npy", c.file)
				allocated := bytesAllocated(func() { readNPY(path) })
				assert.Less(t, allocated, uint64(64<<10), "%s: allocated %d bytes", name, allocated)
			}
		}
	}
}

// bytesAllocated is how much the heap grew over f, counting what was freed again.
func bytesAllocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestWriteNPYRoundTrip(t *testing.T) {
	for _, shape := range [][]int{{}, {5}, {2, 3}, {2, 0, 4}, {3, 2, 4}} {
		n := 1
		for _, d := range shape {
			n *= d
		}
		want := tensor{Shape: shape, Data: make([]float32, n)}
		for i := range want.Data {
			want.Data[i] = float32(i)*0.37 - 1
		}
		path := filepath.Join(t.TempDir(), "rt.npy")
		require.NoError(t, writeNPY(path, want))
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Zero(t, (len(raw)-4*n)%64, "header is padded to 64 bytes as numpy does")
		assert.Contains(t, string(raw), "{'descr': '<f4', 'fortran_order': False, 'shape': "+shapeString(shape)+", }")
		got, err := readNPY(path)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	err := writeNPY(filepath.Join(t.TempDir(), "short.npy"), tensor{Shape: []int{2, 3}, Data: make([]float32, 5)})
	assert.ErrorContains(t, err, "5 values do not fill shape (2, 3)")
}

// npyErrorForms are how every readNPY error on an existing file goes on after its path.
var npyErrorForms = []string{
	": not a readable .npy file: ",
	": array is in Fortran order",
	": dtype ",
	": shape ", // has more elements than gokv reads
}

func FuzzReadNPY(f *testing.F) {
	six := []float32{0, 1, -2, 0.5, 65504, 1.5}
	for _, major := range []byte{1, 2, 3} {
		for _, descr := range []string{"<f2", ">f2", "<f4", ">f4", "<f8", ">f8", "=f4", "|f8"} {
			f.Add(npyFile(major, npyDict(descr, "(2, 3)"), encodeFloats(f, descr, six)))
		}
		f.Add(npyFile(major, npyDict("<f4", "()"), encodeFloats(f, "<f4", six[:1])))
		f.Add(npyFile(major, npyDict("<f4", "(0, 3)"), nil))
		f.Add(npyFile(major, "{'descr':'<f4','fortran_order':False,'shape':(2,3)}", encodeFloats(f, "<f4", six)))
		f.Add(npyFile(major, "{'shape': (6,), 'fortran_order': True, 'descr': '>f8'}", encodeFloats(f, ">f8", six)))
	}
	for _, c := range badNPYFiles {
		f.Add(c.file)
	}
	// One path for every input: a fuzz worker runs its inputs one at a time.
	path := filepath.Join(f.TempDir(), "f.npy")
	f.Fuzz(func(t *testing.T, file []byte) {
		require.NoError(t, os.WriteFile(path, file, 0o644))
		var got tensor
		var err error
		allocated := bytesAllocated(func() { got, err = readNPY(path) })
		// float16 data doubles as float32; the rest is the 64 KiB chunk, the header and small change.
		assert.LessOrEqual(t, allocated, uint64(4*len(file)+256<<10), "allocated %d bytes for a %d-byte file", allocated, len(file))
		if err != nil {
			msg := err.Error()
			require.True(t, strings.HasPrefix(msg, path), "error does not name the file: %s", msg)
			for _, form := range npyErrorForms {
				if strings.HasPrefix(msg[len(path):], form) {
					return
				}
			}
			t.Fatalf("error in no documented form: %s", msg)
		}
		n := 1
		for _, d := range got.Shape {
			require.GreaterOrEqual(t, d, 0)
			n *= d
		}
		require.Len(t, got.Data, n)
	})
}
