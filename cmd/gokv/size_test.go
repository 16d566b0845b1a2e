package main

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"12345", 12345},
		{"0", 0},
		{"512B", 512},
		{"1KB", 1000},
		{"1kib", 1024},
		{"1.5 MiB", 1572864},
		{"2MB", 2_000_000},
		{"64GiB", 64 << 30},
		{"64gib", 64 << 30},
		{"39.1GB", 39_100_000_000},
		{"39.1GiB", 41_983_305_318}, // 39.1 * 2^30 = 41983305318.4, rounded
		{" 2 GiB ", 2 << 30},
		{"1TB", 1e12},
		{"1TiB", 1 << 40},
		{".5KiB", 512},
		{"0.1GB", 100_000_000},
		{"1PB", 1e15},
		{"1 PiB", 1 << 50},
		{"7EiB", 7 << 60},
		{"7.99EiB", 9_211_842_821_808_707_338}, // 7.99 * 2^60 = ...338.24, rounded
		{"9223372036854775807", math.MaxInt64},
		{"0.4", 0},
		{"0.5", 1},
		{"000000000000000000000000000000000001", 1},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseSize(tt.in)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
	bad := []struct{ in, mention string }{
		{"", "is empty"},
		{"   ", "is empty"},
		{"GB", "want a non-negative decimal number"},
		{"-1GB", "is negative"},
		{"-0", "is negative"},
		{"+1GB", "want a non-negative decimal number"},
		{"1.2.3", "want a non-negative decimal number"},
		{".", "want a non-negative decimal number"},
		{"NaN", "not a finite number"},
		{"inf", "not a finite number"},
		{"+Inf", "not a finite number"},
		{"Infinity GB", "not a finite number"},
		{"1e9", "exponents are not supported"},
		{"1E+400", "exponents are not supported"},
		{"12 parsecs", `unknown unit "parsecs"`},
		{"1K", `unknown unit "K"`},
		{"9999999TiB", "too large"},
		{"8EiB", "too large"},
		{"9223372036854775808", "too large"},
		{"1" + strings.Repeat("0", 1000), "more than 64 characters"},
		{"0." + strings.Repeat("0", 1000) + "1", "more than 64 characters"},
		{"1\x1b[2J", `unknown unit "\x1b[2J"`},
	}
	for _, tt := range bad {
		name := tt.in
		if len(name) > 24 {
			name = name[:24] + "..."
		}
		t.Run("bad "+name, func(t *testing.T) {
			_, err := parseSize(tt.in)
			require.Error(t, err)
			assert.Contains(t, err.Error(), strconv.Quote(tt.in), "the error quotes the input")
			assert.Contains(t, err.Error(), tt.mention)
		})
	}
}

func TestFormatSize(t *testing.T) {
	tests := []struct {
		in   int64
		want string
	}{
		{0, "0 B"}, {512, "512 B"}, {1024, "1 KiB"}, {1536, "1.5 KiB"},
		{42_949_672_960, "40 GiB"}, {13_421_772_800, "12.5 GiB"}, {41_983_305_318, "39.1 GiB"},
		{-2048, "-2 KiB"}, {math.MaxInt64, "8 EiB"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, formatSize(tt.in), "%d", tt.in)
	}
}

// FuzzParseSize: no panic; a success is a non-negative count that reads back from its digits exactly
// and from formatSize's rounded rendering within formatSize's 0.5% rounding.
func FuzzParseSize(f *testing.F) {
	for _, seed := range []string{
		"12345", "0", "512B", "1KB", "1kib", "1.5 MiB", "64GiB", "39.1GB", " 2 GiB ", "1TiB", ".5KiB", "7.99EiB",
		"9223372036854775807", "9223372036854775808", "8EiB", "0.0000001", "0.5", "-1GB", "+1", "NaN", "Inf",
		"1e9", "1E+400", "", ".", "1.2.3", "12 parsecs", "1K", "1\x1b[2J", "\xff", strings.Repeat("9", 70),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err != nil {
			fuzzRequireQuotedError(t, s, err)
			return
		}
		if n < 0 {
			t.Fatalf("parseSize(%q) = %d", s, n)
		}
		back, err := parseSize(strconv.FormatInt(n, 10))
		require.NoError(t, err)
		assert.Equal(t, n, back, "digits of parseSize(%q)", s)

		rendered := formatSize(n)
		approx, err := parseSize(rendered)
		if err != nil {
			// Only the top of the range renders as "8 EiB", one past the largest count.
			assert.Equal(t, "8 EiB", rendered, "parseSize(%q) = %d renders as %q: %v", s, n, rendered, err)
			return
		}
		if diff := math.Abs(float64(approx) - float64(n)); diff > float64(n)/200+1 {
			t.Fatalf("parseSize(%q) = %d renders as %q, which reads back as %d", s, n, rendered, approx)
		}
	})
}

// fuzzRequireQuotedError checks a parser's error: it quotes the input it refused and prints safely.
func fuzzRequireQuotedError(t *testing.T, input string, err error) {
	t.Helper()
	msg := err.Error()
	if !strings.Contains(msg, strconv.Quote(input)) {
		t.Fatalf("error does not quote the input %q: %s", input, msg)
	}
	if !utf8.ValidString(msg) {
		t.Fatalf("error is not valid UTF-8: %q", msg)
	}
	for i, r := range msg {
		if !unicode.IsPrint(r) {
			t.Fatalf("error has %U at byte %d: %q", r, i, msg)
		}
	}
}
