//go:build cgo

package bridge

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestConstantsMatchHeader: the constants, status names and format names that types.go and errors.go
// spell in plain Go (so that they build without cgo) equal gokv.h's.
func TestConstantsMatchHeader(t *testing.T) {
	for name, v := range headerConstants() {
		assert.Equal(t, v[1], v[0], name)
	}
	for code := -1; code <= 12; code++ {
		status, message, format := headerNames(code)
		assert.Equal(t, status, statusName(code), "status %d", code)
		assert.Equal(t, message, statusMessage(code), "status %d", code)
		want := format
		if want == "" {
			want = "format(" + strconv.Itoa(code) + ")"
		}
		assert.Equal(t, want, Format(code).String(), "format %d", code)
	}
	for _, n := range []int{-1, 0, 1, 31, 32, 33, 63, 64, 200, 1 << 20} {
		for _, g := range []int{0, 32, 64} {
			for _, r := range []int{-1, 0, 32, 128} {
				assert.Equal(t, KIVIQuantizedLen(n, g, r), kiviQuantizedLenGo(n, g, r), "n %d g %d r %d", n, g, r)
			}
		}
	}
}
