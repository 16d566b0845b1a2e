package main

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// The byte counts of the command line: --memory 64GiB in, "40 GiB" out.

// parseSizeUnits maps the suffixes parseSize accepts (lowercase) to their multipliers.
var parseSizeUnits = map[string]int64{
	"": 1, "b": 1,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15, "eb": 1e18,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "pib": 1 << 50, "eib": 1 << 60,
}

// parseSizeMaxDigits bounds the number's length: 8 EiB has 19 digits, so anything longer is either
// too large or padded with zeros nobody types, and big.Rat's cost grows with the length.
const parseSizeMaxDigits = 64

// parseSize parses a byte count: a non-negative decimal number with an optional unit, case-insensitive,
// spaces allowed between them: "12345", "512B", "39.1GB" (GB = 10^9 bytes), "64GiB" (GiB = 2^30), and
// likewise KB/KiB, MB/MiB, TB/TiB, PB/PiB, EB/EiB (so formatSize's output parses back). Fractional
// results are rounded to the nearest byte; results above 2^63-1 bytes are errors, as are negative
// numbers, exponents, NaN and Inf. Note that Apple and the Open-TQ-Metal paper write "GB" for what is
// 2^30 bytes (its 40 GB is eq. 1's 2^30-based figure); pass GiB to mean that.
func parseSize(s string) (int64, error) {
	const units = "B, KB, KiB, MB, MiB, GB, GiB, TB, TiB, PB, PiB, EB or EiB"
	text := strings.TrimSpace(s)
	end := 0
	dots := 0
	for end < len(text) && (text[end] >= '0' && text[end] <= '9' || text[end] == '.') {
		if text[end] == '.' {
			dots++
		}
		end++
	}
	number, unit := text[:end], strings.ToLower(strings.TrimSpace(text[end:]))
	signless := strings.ToLower(strings.TrimLeft(text, "+"))
	switch {
	case text == "":
		return 0, fmt.Errorf("size %q is empty: want a number with an optional unit (%s)", s, units)
	case text[0] == '-':
		return 0, fmt.Errorf("size %q is negative", s)
	case number == "" && (strings.HasPrefix(signless, "nan") || strings.HasPrefix(signless, "inf")):
		return 0, fmt.Errorf("size %q is not a finite number", s)
	case number == "" || number == "." || dots > 1:
		return 0, fmt.Errorf("size %q: want a non-negative decimal number with an optional unit (%s)", s, units)
	case len(number) > parseSizeMaxDigits:
		return 0, fmt.Errorf("size %q: the number has more than %d characters", s, parseSizeMaxDigits)
	}
	mult, ok := parseSizeUnits[unit]
	if !ok && len(unit) > 1 && unit[0] == 'e' && strings.ContainsAny(unit[1:2], "+-0123456789") {
		return 0, fmt.Errorf("size %q: exponents are not supported (write the digits, or a unit such as GB or GiB)", s)
	}
	if !ok {
		return 0, fmt.Errorf("size %q: unknown unit %q (want %s)", s, strings.TrimSpace(text[end:]), units)
	}
	r, ok := new(big.Rat).SetString(number)
	if !ok {
		return 0, fmt.Errorf("size %q: %q is not a number", s, number)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	// round half up: floor(r + 1/2)
	r.Add(r, big.NewRat(1, 2))
	q := new(big.Int).Quo(r.Num(), r.Denom())
	if !q.IsInt64() {
		return 0, fmt.Errorf("size %q is too large: the most is %d bytes (8 EiB)", s, int64(math.MaxInt64))
	}
	return q.Int64(), nil
}

// formatSize renders a byte count in binary units with up to two decimals: 42949672960 -> "40 GiB",
// 13421772800 -> "12.5 GiB", 512 -> "512 B". Negative counts get a leading "-".
func formatSize(n int64) string {
	if n < 0 {
		if n == math.MinInt64 {
			return "-8 EiB"
		}
		return "-" + formatSize(-n)
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v, u := float64(n), 0
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	if u == 0 {
		return strconv.FormatInt(n, 10) + " B"
	}
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) + " " + units[u]
}
