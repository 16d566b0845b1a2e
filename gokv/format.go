package gokv

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gokv/gokv/bridge"
)

// FormatKind names a KV storage format (docs/architecture.md §4). The values equal the C ABI's GOKV_FORMAT_*
// enum in bridge/gokv.h, so a FormatKind crosses the ABI as an int32 unchanged.
type FormatKind int32

// The storage formats. Their numeric values are part of the C ABI and never change.
const (
	F32   FormatKind = 0 // 32-bit floats, no grouping
	F16   FormatKind = 1 // IEEE half floats, no grouping
	Q8    FormatKind = 2 // 8-bit asymmetric, per token, groups of Group along head_dim
	Q4    FormatKind = 3 // 4-bit asymmetric, per token, groups of Group along head_dim
	KIVI2 FormatKind = 4 // KIVI 2-bit: keys per channel over Group tokens, values per token; newest Residual tokens in f16
	KIVI4 FormatKind = 5 // KIVI 4-bit: as KIVI2 with 4-bit codes
)

// Limits shared with the C ABI's pool validation (bridge/gokv_validate.c).
const (
	formatMaxHeadDim  = 1024  // largest d_k or d_v a pool accepts
	formatMaxResidual = 65536 // largest KIVI residual R
	formatDefaultG    = 32    // default group size of the quantized formats
	formatDefaultR    = 128   // default KIVI residual
	formatMaxKVHeads  = 1024  // most kv heads of a pool
	formatMaxPageSize = 1024  // largest page size P
)

var formatKindNames = [...]string{F32: "f32", F16: "f16", Q8: "q8", Q4: "q4", KIVI2: "kivi2", KIVI4: "kivi4"}

// String returns the kind's lowercase name ("f32", "q4", "kivi2", ...), or "format(N)" for a value that
// is not a known kind.
func (k FormatKind) String() string {
	if k >= 0 && int(k) < len(formatKindNames) {
		return formatKindNames[k]
	}
	return "format(" + strconv.Itoa(int(k)) + ")"
}

// Bits returns the width of one stored code: 32, 16, 8, 4 or 2, and 0 for an unknown kind.
func (k FormatKind) Bits() int {
	switch k {
	case F32:
		return 32
	case F16:
		return 16
	case Q8:
		return 8
	case Q4, KIVI4:
		return 4
	case KIVI2:
		return 2
	}
	return 0
}

// Quantized reports whether the kind stores affine codes with an fp16 scale and bias per group.
func (k FormatKind) Quantized() bool { return k >= Q8 && k <= KIVI4 }

// IsKIVI reports whether the kind quantizes keys per channel and keeps a full-precision residual.
func (k FormatKind) IsKIVI() bool { return k == KIVI2 || k == KIVI4 }

// Format is the storage format of one layer's keys and values (docs/architecture.md §4).
//
// Group is the quantization group g (32, 64 or 128) for the quantized kinds and 0 for f32/f16: along
// head_dim for q8/q4 and for KIVI values, along consecutive tokens for KIVI keys. Residual is KIVI's R,
// the newest tokens of every sequence kept in fp16 (a multiple of Group, 0 allowed); it is 0 for the
// other kinds. The zero value is f32. Format is a small value type, safe to copy and to share between
// goroutines.
type Format struct {
	Kind     FormatKind
	Group    int
	Residual int
}

// ParseFormat parses a format name, case-insensitively:
//
//	f32, f16
//	q8, q8:G          (G = 32, 64 or 128; default 32)
//	q4, q4:G
//	kivi2, kivi2:G, kivi2:G:R   (default G 32, R 128; R a multiple of G)
//	kivi4, kivi4:G, kivi4:G:R
//
// The result's String is the canonical form ("q4:32", "kivi2:32:128"). Errors quote the text at fault.
func ParseFormat(s string) (Format, error) {
	text := strings.ToLower(strings.TrimSpace(s))
	parts := strings.Split(text, ":")
	kind := FormatKind(-1)
	for i, name := range formatKindNames {
		if parts[0] == name {
			kind = FormatKind(i)
		}
	}
	if kind < 0 {
		return Format{}, fmt.Errorf("gokv: format %q: unknown kind %q (want f32, f16, q8, q4, kivi2 or kivi4)", s, parts[0])
	}
	maxParts := 1
	switch {
	case kind.IsKIVI():
		maxParts = 3
	case kind.Quantized():
		maxParts = 2
	}
	if len(parts) > maxParts {
		want := map[int]string{1: "no parameters", 2: "at most a group size (" + kind.String() + ":G)",
			3: "at most a group size and a residual (" + kind.String() + ":G:R)"}[maxParts]
		return Format{}, fmt.Errorf("gokv: format %q: %s takes %s", s, kind, want)
	}
	f := Format{Kind: kind}
	if kind.Quantized() {
		f.Group = formatDefaultG
	}
	if kind.IsKIVI() {
		f.Residual = formatDefaultR
	}
	for i, field := range []*int{&f.Group, &f.Residual}[:len(parts)-1] {
		v, err := strconv.Atoi(parts[i+1])
		if err != nil {
			name := [...]string{"group size", "residual"}[i]
			return Format{}, fmt.Errorf("gokv: format %q: %s %q is not an integer", s, name, parts[i+1])
		}
		*field = v
	}
	if err := f.validateParams(); err != nil {
		return Format{}, fmt.Errorf("gokv: format %q: %s", s, err)
	}
	return f, nil
}

// MustParseFormat is ParseFormat for constant names known to be valid; it panics on an error, so use
// it only for literals (tables, tests), never for user input.
func MustParseFormat(s string) Format {
	f, err := ParseFormat(s)
	if err != nil {
		panic(err)
	}
	return f
}

// String returns the canonical name: "f32", "f16", "q8:32", "q4:64", "kivi2:32:128". ParseFormat of the
// result gives the format back.
func (f Format) String() string {
	switch {
	case f.Kind.IsKIVI():
		return fmt.Sprintf("%s:%d:%d", f.Kind, f.Group, f.Residual)
	case f.Kind.Quantized():
		return fmt.Sprintf("%s:%d", f.Kind, f.Group)
	}
	return f.Kind.String()
}

// MarshalText implements encoding.TextMarshaler with the canonical name, so a Format reads and writes as
// a string in JSON and works with flag.TextVar.
func (f Format) MarshalText() ([]byte, error) {
	if err := f.validateParams(); err != nil {
		return nil, fmt.Errorf("gokv: format %s: %s", f, err)
	}
	return []byte(f.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseFormat.
func (f *Format) UnmarshalText(text []byte) error {
	parsed, err := ParseFormat(string(text))
	if err != nil {
		return err
	}
	*f = parsed
	return nil
}

// validateParams checks the kind, group and residual on their own (no head dimensions).
func (f Format) validateParams() error {
	k := f.Kind
	switch {
	case k.Bits() == 0:
		return fmt.Errorf("unknown kind %d", int32(k))
	case !k.Quantized():
		if f.Group != 0 || f.Residual != 0 {
			return fmt.Errorf("%s takes no group or residual (got group %d, residual %d)", k, f.Group, f.Residual)
		}
		return nil
	case f.Group != 32 && f.Group != 64 && f.Group != 128:
		return fmt.Errorf("group size %d must be 32, 64 or 128", f.Group)
	case !k.IsKIVI() && f.Residual != 0:
		return fmt.Errorf("%s takes no residual (got %d)", k, f.Residual)
	case f.Residual < 0 || f.Residual > formatMaxResidual || f.Residual%f.Group != 0:
		return fmt.Errorf("residual %d must be a multiple of the group size %d in [0, %d]", f.Residual, f.Group, formatMaxResidual)
	}
	return nil
}

// Validate checks the format and that it can store heads of dimension headDimK (keys, d_qk) and headDimV
// (values, d_v): each in [1, 1024], a multiple of 4 and, for the quantized kinds, of Group. These are the
// rules the C ABI applies when it creates a pool, checked here first so errors name the layer early.
func (f Format) Validate(headDimK, headDimV int) error {
	if err := f.validateParams(); err != nil {
		return fmt.Errorf("gokv: format %s: %s", f, err)
	}
	for _, d := range [...]struct {
		name string
		v    int
	}{{"head_dim_k", headDimK}, {"head_dim_v", headDimV}} {
		switch {
		case d.v < 1 || d.v > formatMaxHeadDim:
			return fmt.Errorf("gokv: format %s: %s %d is outside [1, %d]", f, d.name, d.v, formatMaxHeadDim)
		case d.v%4 != 0:
			return fmt.Errorf("gokv: format %s: %s %d is not a multiple of 4", f, d.name, d.v)
		case f.Kind.Quantized() && d.v%f.Group != 0:
			return fmt.Errorf("gokv: format %s: %s %d is not a multiple of the group size %d", f, d.name, d.v, f.Group)
		}
	}
	return nil
}

// BitsPerElement returns the average storage bits of one quantized element, codes plus the amortized
// fp16 scale and bias of its group: bits + 32/Group. f32 = 32, f16 = 16, q8:32 = 9, q4:32 = 5 (3.2x
// smaller than f16), kivi2:32 = 3, kivi4:32 = 5. For KIVI it covers the quantized part only; the
// residual's Residual tokens are fp16 (see ResidualSlotBytes).
func (f Format) BitsPerElement() float64 {
	bits := float64(f.Kind.Bits())
	if f.Kind.Quantized() && f.Group > 0 {
		bits += 32 / float64(f.Group)
	}
	return bits
}

// BytesPerToken returns the steady-state bytes one token costs in one layer: kvHeads heads of a dk-wide
// key and a dv-wide value (no value storage when vIsKPrefix, the MLA absorbed form) at BitsPerElement.
// It ignores page rounding, section alignment and KIVI's fp16 residual; PageBytes and ResidualSlotBytes
// give the exact allocation. Llama-3.1-70B (8 kv heads, d 128) per layer: f16 4096, q4:32 1280.
func (f Format) BytesPerToken(kvHeads, dk, dv int, vIsKPrefix bool) float64 {
	if vIsKPrefix {
		dv = 0
	}
	return float64(kvHeads) * float64(dk+dv) * f.BitsPerElement() / 8
}

// PageLayout is what a pool of one format and geometry allocates, in the C core's page layout
// (docs/architecture.md §4): one page of PageSize tokens of every kv head, its head blocks' sections
// each starting on a 64-byte boundary, and one sequence's KIVI residual ring.
type PageLayout struct {
	PageBytes         int64 // one page, as allocated
	PageCodeBytes     int64 // of which the stored elements or codes
	PageMetaBytes     int64 // of which the fp16 scales and biases (the rest is alignment and q4 key-tile padding)
	ResidualSlotBytes int64 // one sequence's KIVI residual ring (Residual + Group fp16 rows); 0 for the other kinds
	// PageBoundsBytes is what a pool with key bounds (the layers Quest governs) keeps beside each page:
	// per kv head the per-channel min and max of the keys, fp16, [KVHeads][2][dk]. Not part of PageBytes;
	// a layer under Quest allocates PageBytes + PageBoundsBytes per page.
	PageBoundsBytes int64
}

// Layout returns the page layout of a pool of this format for kvHeads heads of key width dk and value
// width dv (no value sections when vIsKPrefix, the MLA absorbed form) and pages of pageSize tokens. It is
// the C core's answer (gokv_layout_sizes_get), the one every backend allocates by, so a plan and a cache
// never disagree; in a build without cgo a Go mirror of the same formula answers. It fails with
// ErrInvalid for a geometry a pool cannot have (NewCache's rules: Validate, kvHeads in [1, 1024],
// pageSize a multiple of 8 in [8, 1024] and, for KIVI, of Group; dv <= dk when vIsKPrefix).
func (f Format) Layout(kvHeads, dk, dv, pageSize int, vIsKPrefix bool) (PageLayout, error) {
	const op = "Format.Layout"
	if bridge.CgoEnabled {
		desc := bridge.PoolDesc{Format: bridge.Format(f.Kind), GroupSize: f.Group, Residual: f.Residual,
			KVHeads: kvHeads, HeadDimK: dk, HeadDimV: dv, VIsKPrefix: vIsKPrefix, PageSize: pageSize, Pages: 1,
			KeyBounds: true}
		if f.Kind.IsKIVI() {
			desc.ResidualSlots = 1
		}
		if pageSize == 0 { // the ABI would default it; Layout wants an explicit size
			return PageLayout{}, newErr(op, ErrorInvalid, "format %s: pageSize 0 must be a multiple of 8 in [8, %d]", f, formatMaxPageSize)
		}
		s, err := bridge.SizesOf(desc)
		if err != nil {
			return PageLayout{}, wrapErr(op, "format "+f.String(), err)
		}
		return PageLayout{PageBytes: int64(s.PageBytes), PageCodeBytes: int64(s.PageCodeBytes),
			PageMetaBytes: int64(s.PageMetaBytes), ResidualSlotBytes: int64(s.ResidualSlotBytes),
			PageBoundsBytes: int64(s.PageBoundsBytes)}, nil
	}
	if err := f.checkGeometry(kvHeads, dk, dv, pageSize, vIsKPrefix); err != nil {
		return PageLayout{}, &Error{Op: op, Code: ErrorInvalid, Msg: strings.TrimPrefix(err.Error(), "gokv: ")}
	}
	return f.layoutGo(kvHeads, dk, dv, pageSize, vIsKPrefix), nil
}

// checkGeometry applies the C core's pool rules that Layout's mirror needs (bridge/gokv_validate.c).
func (f Format) checkGeometry(kvHeads, dk, dv, pageSize int, vIsKPrefix bool) error {
	if err := f.Validate(dk, dv); err != nil {
		return err
	}
	switch {
	case kvHeads < 1 || kvHeads > formatMaxKVHeads:
		return fmt.Errorf("gokv: format %s: kvHeads %d is outside [1, %d]", f, kvHeads, formatMaxKVHeads)
	case pageSize < 8 || pageSize > formatMaxPageSize || pageSize%8 != 0:
		return fmt.Errorf("gokv: format %s: pageSize %d must be a multiple of 8 in [8, %d]", f, pageSize, formatMaxPageSize)
	case f.Kind.IsKIVI() && pageSize%f.Group != 0:
		return fmt.Errorf("gokv: format %s: pageSize %d is not a multiple of the group size %d", f, pageSize, f.Group)
	case vIsKPrefix && dv > dk:
		return fmt.Errorf("gokv: format %s: with V a prefix of K, d_v %d must be <= d_k %d", f, dv, dk)
	}
	return nil
}

// formatAlign64 rounds a byte count up to the 64-byte boundary every page section starts on.
func formatAlign64(x int64) int64 { return (x + 63) &^ 63 }

// formatKeyTile is GOKV_KEY_TILE of bridge/gokv_layout.h: q4 keys are stored 16 tokens to a tile.
const formatKeyTile = 16

// layoutGo mirrors gokv_layout_init and gokv_layout_sizes_get (bridge/gokv_layout.c, gokv_core.c) for
// builds without cgo; TestLayoutMirrorMatchesC holds it to C. One block per kv head, each holding the
// head's key codes, key scales, key biases, then value codes, scales and biases (absent when vIsKPrefix),
// each section 64-byte aligned; KIVI keys packed per channel over groups of Group tokens; q4 keys (without
// vIsKPrefix) in 16-token tiles, the last one padded. The arguments are assumed valid (checkGeometry).
func (f Format) layoutGo(kvHeads, dk, dv, pageSize int, vIsKPrefix bool) PageLayout {
	H, P, bits := int64(kvHeads), int64(pageSize), int64(f.Kind.Bits())
	g := int64(f.Group)
	var kCodesHead, kScaleHead, kCodes int64
	switch {
	case f.Kind.IsKIVI():
		kCodes = int64(dk) * g * bits / 8 * (P / g)
		kCodesHead = kCodes
		kScaleHead = int64(dk) * (P / g) * 2
	case f.Kind.Quantized():
		slots := P
		if f.Kind == Q4 && !vIsKPrefix { // q4 keys sit in 16-token tiles; the last one is padded (k_tiled)
			slots = (P + formatKeyTile - 1) / formatKeyTile * formatKeyTile
		}
		kCodes = int64(dk) * bits / 8 * P
		kCodesHead = int64(dk) * bits / 8 * slots
		kScaleHead = int64(dk) / g * P * 2
	default:
		kCodes = int64(dk) * bits / 8 * P
		kCodesHead = kCodes
	}
	head := formatAlign64(kCodesHead) + 2*formatAlign64(kScaleHead)
	codes, meta := kCodes, 2*kScaleHead
	if !vIsKPrefix {
		vCodesHead := int64(dv) * bits / 8 * P
		var vScaleHead int64
		if f.Kind.Quantized() {
			vScaleHead = int64(dv) / g * P * 2
		}
		head += formatAlign64(vCodesHead) + 2*formatAlign64(vScaleHead)
		codes += vCodesHead
		meta += 2 * vScaleHead
	}
	l := PageLayout{PageBytes: head * H, PageCodeBytes: codes * H, PageMetaBytes: meta * H, PageBoundsBytes: H * 2 * int64(dk) * 2}
	if f.Kind.IsKIVI() {
		rows := int64(f.Residual + f.Group)
		l.ResidualSlotBytes = formatAlign64(rows * H * int64(dk) * 2)
		if !vIsKPrefix {
			l.ResidualSlotBytes += formatAlign64(rows * H * int64(dv) * 2)
		}
	}
	return l
}

// PageBytes returns the bytes of one page of pageSize tokens for kvHeads heads, exactly as a cache
// allocates it: Layout's PageBytes. For a geometry a pool cannot have (where Layout fails) it returns the
// layout formula's figure all the same.
func (f Format) PageBytes(kvHeads, dk, dv, pageSize int, vIsKPrefix bool) int64 {
	if l, err := f.Layout(kvHeads, dk, dv, pageSize, vIsKPrefix); err == nil {
		return l.PageBytes
	}
	return f.layoutGo(kvHeads, dk, dv, pageSize, vIsKPrefix).PageBytes
}

// ResidualSlotBytes returns the bytes of one sequence's KIVI residual ring in one layer, as the C core
// allocates it: Residual + Group rows of fp16 keys and (unless vIsKPrefix) values, each part 64-byte
// aligned. A sequence of n tokens holds its newest n - n_quant tokens there, between R and R + G - 1 once
// n >= R (n_quant = max(0, floor((n - R) / G) * G)). Returns 0 for the non-KIVI kinds. The ring does not
// depend on the page size; it is Layout's ResidualSlotBytes.
func (f Format) ResidualSlotBytes(kvHeads, dk, dv int, vIsKPrefix bool) int64 {
	if !f.Kind.IsKIVI() {
		return 0
	}
	pageSize := max(f.Group, 8)
	if l, err := f.Layout(kvHeads, dk, dv, pageSize, vIsKPrefix); err == nil {
		return l.ResidualSlotBytes
	}
	return f.layoutGo(kvHeads, dk, dv, pageSize, vIsKPrefix).ResidualSlotBytes
}

// QuantizedTokens returns how many of a sequence's n tokens are quantized into pages: n for the
// non-KIVI kinds, and for KIVI max(0, floor((n - Residual) / Group) * Group), the rest being in the
// sequence's fp16 residual ring (the C ABI's gokv_kivi_quantized_len).
func (f Format) QuantizedTokens(n int) int {
	if !f.Kind.IsKIVI() {
		return n
	}
	if n <= f.Residual || f.Group <= 0 {
		return 0
	}
	return (n - f.Residual) / f.Group * f.Group
}
