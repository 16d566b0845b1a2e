package gokv

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFormatKindMatchesCABI(t *testing.T) {
	// bridge/gokv.h: GOKV_FORMAT_F32 = 0 ... GOKV_FORMAT_KIVI4 = 5.
	for want, k := range []FormatKind{F32, F16, Q8, Q4, KIVI2, KIVI4} {
		assert.Equal(t, int32(want), int32(k), "kind %s", k)
	}
	assert.Equal(t, "format(9)", FormatKind(9).String())
}

func TestParseFormat(t *testing.T) {
	tests := []struct {
		in        string
		want      Format
		canonical string
	}{
		{"f32", Format{Kind: F32}, "f32"},
		{"f16", Format{Kind: F16}, "f16"},
		{"F16", Format{Kind: F16}, "f16"},
		{" q8 ", Format{Kind: Q8, Group: 32}, "q8:32"},
		{"q8:64", Format{Kind: Q8, Group: 64}, "q8:64"},
		{"q4", Format{Kind: Q4, Group: 32}, "q4:32"},
		{"q4:32", Format{Kind: Q4, Group: 32}, "q4:32"},
		{"q4:64", Format{Kind: Q4, Group: 64}, "q4:64"},
		{"q4:128", Format{Kind: Q4, Group: 128}, "q4:128"},
		{"kivi2", Format{Kind: KIVI2, Group: 32, Residual: 128}, "kivi2:32:128"},
		{"kivi2:32:128", Format{Kind: KIVI2, Group: 32, Residual: 128}, "kivi2:32:128"},
		{"kivi2:64", Format{Kind: KIVI2, Group: 64, Residual: 128}, "kivi2:64:128"},
		{"kivi4:64:256", Format{Kind: KIVI4, Group: 64, Residual: 256}, "kivi4:64:256"},
		{"KIVI4:32:0", Format{Kind: KIVI4, Group: 32, Residual: 0}, "kivi4:32:0"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseFormat(tt.in)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.canonical, got.String())
			back, err := ParseFormat(got.String())
			require.NoError(t, err)
			assert.Equal(t, got, back, "String must round-trip")
		})
	}
}

func TestParseFormatErrors(t *testing.T) {
	tests := []struct {
		in      string
		mention string // the error must name the offending text
	}{
		{"", `""`},
		{"q3", `"q3"`},
		{"bf16", `"bf16"`},
		{"f16:32", "f16 takes no parameters"},
		{"q4:48", "group size 48"},
		{"q4:abc", `"abc"`},
		{"q4:32:128", "q4 takes at most a group size"},
		{"q8:0", "group size 0"},
		{"kivi2:32:100", "residual 100"},
		{"kivi2:32:-32", "residual -32"},
		{"kivi2:32:128:1", "kivi2 takes at most a group size and a residual"},
		{"kivi4:16", "group size 16"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			_, err := ParseFormat(tt.in)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.mention)
			assert.Contains(t, err.Error(), `"`+tt.in+`"`, "the error quotes the input")
		})
	}
}

func TestFormatTextMarshaling(t *testing.T) {
	type cfg struct {
		Format Format `json:"format"`
	}
	var c cfg
	require.NoError(t, json.Unmarshal([]byte(`{"format":"kivi2"}`), &c))
	assert.Equal(t, Format{Kind: KIVI2, Group: 32, Residual: 128}, c.Format)
	out, err := json.Marshal(cfg{Format: MustParseFormat("q4:64")})
	require.NoError(t, err)
	assert.JSONEq(t, `{"format":"q4:64"}`, string(out))

	assert.Error(t, json.Unmarshal([]byte(`{"format":"q5"}`), &c))
	_, err = json.Marshal(cfg{Format: Format{Kind: Q4, Group: 7}})
	assert.Error(t, err)
	assert.Panics(t, func() { MustParseFormat("nope") })
}

func TestFormatValidate(t *testing.T) {
	tests := []struct {
		format  string
		dk, dv  int
		mention string // "" = valid
	}{
		{"f16", 128, 128, ""},
		{"q4:32", 128, 128, ""},
		{"q4:128", 128, 128, ""},
		{"q4:128", 576, 512, "head_dim_k 576 is not a multiple of the group size 128"},
		{"q4:64", 576, 512, ""}, // DeepSeek MLA latent
		{"kivi2:32:128", 64, 64, ""},
		{"q4:64", 64, 96, "head_dim_v 96 is not a multiple of the group size 64"},
		{"f16", 2, 2, "head_dim_k 2 is not a multiple of 4"},
		{"f32", 0, 128, "head_dim_k 0 is outside [1, 1024]"},
		{"f32", 128, 2048, "head_dim_v 2048 is outside [1, 1024]"},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			err := MustParseFormat(tt.format).Validate(tt.dk, tt.dv)
			if tt.mention == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.mention)
		})
	}
	// Formats built by hand are checked too.
	assert.ErrorContains(t, Format{Kind: F16, Group: 32}.Validate(128, 128), "f16 takes no group")
	assert.ErrorContains(t, Format{Kind: Q4, Group: 32, Residual: 32}.Validate(128, 128), "q4 takes no residual")
	assert.ErrorContains(t, Format{Kind: 42}.Validate(128, 128), "unknown kind 42")
}

func TestFormatBits(t *testing.T) {
	tests := []struct {
		format      string
		bitsPerElem float64
		llamaLayer  float64 // BytesPerToken for 8 kv heads, d 128 (Llama-3.1-70B), one layer
	}{
		{"f32", 32, 8192},
		{"f16", 16, 4096},
		{"q8", 9, 2304},
		{"q8:64", 8.5, 2176},
		{"q4", 5, 1280}, // 4 bits + fp16 scale + fp16 bias per 32 elements
		{"q4:64", 4.5, 1152},
		{"q4:128", 4.25, 1088},
		{"kivi2", 3, 768},
		{"kivi4:64:128", 4.5, 1152},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			f := MustParseFormat(tt.format)
			assert.InDelta(t, tt.bitsPerElem, f.BitsPerElement(), 1e-12)
			assert.InDelta(t, tt.llamaLayer, f.BytesPerToken(8, 128, 128, false), 1e-9)
		})
	}
	// MLA stores the 576-dim latent once: no separate values.
	f16 := MustParseFormat("f16")
	assert.InDelta(t, 1152.0, f16.BytesPerToken(1, 576, 512, true), 1e-9)
	assert.InDelta(t, 2176.0, f16.BytesPerToken(1, 576, 512, false), 1e-9)
}

func TestFormatPageBytes(t *testing.T) {
	tests := []struct {
		format             string
		kvHeads, dk, dv, p int
		vIsKPrefix         bool
		wantPage, wantSlot int64
		steadyStateIsExact bool // page/P == BytesPerToken when no section needs alignment padding
	}{
		// Llama-3.1-70B layer: 8 heads x 64 tokens x 128 dims.
		{"f16", 8, 128, 128, 64, false, 2 * 8 * 64 * 128 * 2, 0, true},
		{"f32", 8, 128, 128, 64, false, 2 * 8 * 64 * 128 * 4, 0, true},
		// q4:32: codes 8*64*64 = 32768, scales and biases 8*64*4*2 = 4096 each, for K and for V.
		{"q4:32", 8, 128, 128, 64, false, 2 * (32768 + 2*4096), 0, true},
		{"q8:32", 8, 128, 128, 64, false, 2 * (65536 + 2*4096), 0, true},
		// KIVI-2 g32: keys 8 heads x 2 token groups x 128 channels x 8 bytes = 16384, scales per
		// (group, channel) 8*2*128*2 = 4096; values per token: 8*64*32 = 16384 + 2 * 8*64*4*2.
		// Ring: (128+32) rows x 8 heads x 128 dims x 2 bytes, for K and V.
		{"kivi2:32:128", 8, 128, 128, 64, false, 16384 + 2*4096 + 16384 + 2*4096, 2 * 160 * 8 * 128 * 2, true},
		// MLA latent, f16: 1 head x 64 tokens x 576 dims x 2 bytes, no V sections.
		{"f16", 1, 576, 512, 64, true, 64 * 576 * 2, 0, true},
		// A tiny f16 page: 1 head x 8 tokens x 4 dims x 2 bytes = 64 (already aligned) for K and for V.
		{"f16", 1, 4, 4, 8, false, 128, 0, true},
		// q4:32 on a tiny page: value codes 8 x 16 = 128 bytes, key codes a whole 16-token tile (256),
		// and each scale (and bias) section is 1 head x 8 tokens x 1 group x 2 bytes = 16, padded to 64.
		{"q4:32", 1, 32, 32, 8, false, 256 + 128 + 4*64, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			f := MustParseFormat(tt.format)
			require.NoError(t, f.Validate(tt.dk, tt.dv))
			page := f.PageBytes(tt.kvHeads, tt.dk, tt.dv, tt.p, tt.vIsKPrefix)
			assert.Equal(t, tt.wantPage, page)
			assert.Equal(t, tt.wantSlot, f.ResidualSlotBytes(tt.kvHeads, tt.dk, tt.dv, tt.vIsKPrefix))
			perToken := float64(page) / float64(tt.p)
			steady := f.BytesPerToken(tt.kvHeads, tt.dk, tt.dv, tt.vIsKPrefix)
			if tt.steadyStateIsExact {
				assert.InDelta(t, steady, perToken, 1e-9)
			} else {
				assert.Greater(t, perToken, steady, "alignment padding only adds bytes")
			}
		})
	}
}

func TestFormatQuantizedTokens(t *testing.T) {
	kivi := MustParseFormat("kivi2:32:128")
	tests := []struct{ n, want int }{
		{0, 0}, {100, 0}, {128, 0}, {159, 0}, {160, 32}, {191, 32}, {192, 64}, {1000, 864},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, kivi.QuantizedTokens(tt.n), "n=%d", tt.n)
		// Invariant (docs/architecture.md §4): the newest R tokens are never quantized, and fewer than R+G stay fp16.
		if tt.n >= 128 {
			fp16 := tt.n - kivi.QuantizedTokens(tt.n)
			assert.GreaterOrEqual(t, fp16, 128)
			assert.Less(t, fp16, 160)
		}
	}
	assert.Equal(t, 1000, MustParseFormat("q4").QuantizedTokens(1000))
}
