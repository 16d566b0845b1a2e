package main

// Helpers shared by the subcommands: float16, model lookup, output, statistics, synthetic data.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/schollz/progressbar/v3"

	"github.com/gokv/gokv/gokv"
)

// halfToFloat converts an IEEE 754 binary16 value to float32 (exact).
func halfToFloat(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf, nan
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: mant * 2^-24
		v := float32(mant) * float32(1.0/(1<<24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}

// roundHalf rounds a float32 to the nearest binary16 value (round half to even), returned as float32:
// what an f16 store keeps of x. Values beyond the half range become ±Inf.
func roundHalf(x float32) float32 {
	if x != x || math.IsInf(float64(x), 0) {
		return x
	}
	a := math.Abs(float64(x))
	if a >= 65520 { // rounds past the largest half, 65504
		return float32(math.Copysign(math.Inf(1), float64(x)))
	}
	if a < 6.103515625e-05 { // subnormal halves are multiples of 2^-24
		return float32(math.RoundToEven(float64(x)*(1<<24)) / (1 << 24))
	}
	_, e := math.Frexp(a) // a = m * 2^e, m in [0.5, 1)
	step := math.Ldexp(1, e-11)
	return float32(math.Copysign(math.RoundToEven(a/step)*step, float64(x)))
}

// ---- models ----

// loadModel resolves --model: a preset name, or a HuggingFace config.json (or a directory holding one).
func loadModel(name string) (gokv.ModelSpec, error) {
	if name == "" {
		return gokv.ModelSpec{}, errors.New("--model is required: a preset (" + strings.Join(gokv.Presets(), ", ") +
			") or a config.json")
	}
	if spec, err := gokv.Preset(name); err == nil {
		return spec, nil
	}
	if _, statErr := os.Stat(name); statErr == nil || strings.HasSuffix(name, ".json") || strings.ContainsRune(name, os.PathSeparator) {
		return gokv.LoadHFConfig(name)
	}
	return gokv.ModelSpec{}, fmt.Errorf("--model %q is neither a preset (%s) nor a config.json file", name,
		strings.Join(gokv.Presets(), ", "))
}

// parseFormats parses a comma-separated list of formats ("f16,q4,kivi2").
func parseFormats(list string) ([]gokv.Format, error) {
	var out []gokv.Format
	for _, s := range strings.Split(list, ",") {
		if strings.TrimSpace(s) == "" {
			continue
		}
		f, err := gokv.ParseFormat(s)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no format in %q", list)
	}
	return out, nil
}

// parseInts parses a comma-separated list of positive integers; a K suffix multiplies by 1024
// ("4K,32K,128K" = 4096, 32768, 131072).
func parseInts(flag, list string) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		mult := 1
		if strings.HasSuffix(s, "K") || strings.HasSuffix(s, "k") {
			mult, s = 1024, s[:len(s)-1]
		}
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 || v > math.MaxInt32/mult {
			return nil, fmt.Errorf("--%s: %q is not a positive integer", flag, s)
		}
		out = append(out, v*mult)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--%s: empty list", flag)
	}
	return out, nil
}

// pageSizeFor returns the page size the CLI uses for a format: 64 tokens (docs/architecture.md §6), or the group
// when a KIVI group is larger (KIVI pages hold whole key groups).
func pageSizeFor(f gokv.Format) int {
	if f.Kind.IsKIVI() && f.Group > 64 {
		return f.Group
	}
	return 64
}

// ---- output ----

// writeJSON writes v as one line of JSON.
func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// humanCount renders a token count compactly: 131072 -> "128K", 75038 -> "73.3K", 512 -> "512".
func humanCount(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.Itoa(n>>20) + "M"
	case n >= 1024 && n%1024 == 0:
		return strconv.Itoa(n>>10) + "K"
	case n >= 1024:
		return strconv.FormatFloat(float64(n)/1024, 'f', 1, 64) + "K"
	}
	return strconv.Itoa(n)
}

// newProgress returns a progress bar on stderr (a no-op writer when quiet), counting total steps.
func newProgress(stderr io.Writer, quiet bool, total int, what string) *progressbar.ProgressBar {
	if quiet {
		stderr = io.Discard
	}
	return progressbar.NewOptions(total,
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100e6),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetPredictTime(true),
	)
}

// ---- statistics ----

// cosine returns the cosine similarity of a and b in float64 (1 when both are zero).
func cosine(a, b []float32) float64 {
	var ab, aa, bb float64
	for i := range a {
		x, y := float64(a[i]), float64(b[i])
		ab += x * y
		aa += x * x
		bb += y * y
	}
	if aa == 0 && bb == 0 {
		return 1
	}
	if aa == 0 || bb == 0 {
		return 0
	}
	return ab / math.Sqrt(aa*bb)
}

// maxAbsDiff returns max_i |a_i - b_i|.
func maxAbsDiff(a, b []float32) float64 {
	m := 0.0
	for i := range a {
		m = max(m, math.Abs(float64(a[i])-float64(b[i])))
	}
	return m
}

// median returns the median of xs (which it sorts); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

// percentile returns the q-quantile (0 <= q <= 1) of xs by nearest rank: the smallest x with at least a
// fraction q of xs at or below it; 0 for none. It sorts xs, as median does.
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(0, min(i, len(xs)-1))]
}

// ---- synthetic data ----

// outlierChannels is how many of every 128 key channels get outlier magnitudes in synthetic keys, and
// outlierScale how large: real keys have a few such channels (KIVI §3), which is what per-channel key
// quantization is for.
const (
	outlierChannels = 8
	outlierScale    = 4
)

// synthKV fills k [n, heads, dk] with N(0,1) keys whose every (128/outlierChannels)-th channel (8 of
// 128) is scaled by outlierScale, and v [n, heads, dv] with N(0,1) values. Deterministic in rng.
func synthKV(rng *rand.Rand, k, v []float32, dk int) {
	const stride = 128 / outlierChannels
	for i := range k {
		x := float32(rng.NormFloat64())
		if (i%dk)%stride == 0 {
			x *= outlierScale
		}
		k[i] = x
	}
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
}

// fillNormal fills x with N(0,1) samples.
func fillNormal(rng *rand.Rand, x []float32) {
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
}
