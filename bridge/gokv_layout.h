/*
 * gokv_layout.h: the byte layout of one page and one KIVI residual slot (docs/architecture.md §4). Shared by the
 * core, every backend and the tests, so that "what is stored" has one definition.
 *
 * A page holds P tokens of every kv head. Heads follow each other, and one head's block holds its sections
 * end to end, each starting on a 64-byte boundary (so a page is read front to back when its heads are
 * walked in order, which the hardware prefetchers stream well):
 *
 *   page = [Hkv] head blocks; a head block is
 *   per-token formats (f32, f16, q8, q4; and KIVI values):
 *     k_codes  [P][row bytes]      f32/f16 elements, or packed codes (4-bit: byte = q0 | q1<<4)
 *     k_scale  [P][d/g]  fp16      (quantized formats only)
 *     k_bias   [P][d/g]  fp16
 *   KIVI keys (per channel, g consecutive tokens of one channel packed together, as the kernel reads them):
 *     k_codes  [P/g][d_k][g*bits/8]  2-bit: byte = t0 | t1<<2 | t2<<4 | t3<<6 (t = token in group)
 *     k_scale  [P/g][d_k] fp16
 *     k_bias   [P/g][d_k] fp16
 *   then v_codes, v_scale, v_bias laid out per token like the first case (absent with v_is_k_prefix).
 *
 * q4 keys (k_tiled: format q4 without v_is_k_prefix, whose values read the key rows) keep that packing, but
 * their k_codes are stored in tiles of GOKV_KEY_TILE = 16 tokens, dword-column-major:
 *     k_codes  [ceil(P/16)][d_k/8][16] uint32   dword j of slot t's row (dims 8j..8j+7, byte = q0 | q1<<4)
 *              at tile t/16, column j, lane t%16
 * so that the 16 tokens of one dword column are one 64-byte line: what a SIMD kernel that keeps tokens in
 * lanes consumes (the CPU's VNNI and AVX2 kernels, a GPU subgroup), with no transpose at every read. A page
 * whose P is not a multiple of 16 pads its last tile. gokv_k_code_byte gives where a row's byte lives.
 *
 * Head h's section X starts at X + h * X_head (X_head is the head block's size for every section).
 *
 * Quantization is asymmetric affine per group: s = (max - min) / (2^bits - 1), b = min (both stored as
 * fp16, and q is computed against the fp16-rounded s and b), q = clamp(round((x - b) / s), 0, 2^bits - 1),
 * x̂ = q·s + b. A constant group stores s = 0 and reconstructs b exactly when b is representable in fp16.
 *
 * A KIVI residual slot is a ring of R + g rows; position t of a sequence lives in row t % (R + g):
 *     ring_k [R+g][Hkv][d_k] fp16, then ring_v [R+g][Hkv][d_v] fp16 (absent with v_is_k_prefix).
 *
 * Key bounds (pools with key_bounds, for Quest) live beside the pages, not in them, so a page's bytes do not
 * depend on them: per page, bounds [Hkv][2][d_k] fp16, the per-channel min (row 0) and max (row 1) of the
 * page's keys as stored (the dequantized values attention reads), min rounded toward -inf and max toward
 * +inf so that they bound the float keys. A write that stores slot 0 of a page starts its bounds afresh;
 * later writes widen them; KIVI keys count once flushed from the ring into their page. A page with no key
 * yet holds min = +inf, max = -inf. gokv_pool_copy copies a page's bounds with it.
 */
#ifndef GOKV_LAYOUT_H
#define GOKV_LAYOUT_H

#include "gokv.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gokv_layout {
    int32_t format;
    int32_t bits;          /* 32, 16, 8, 4, 2 */
    int32_t group;         /* g (0 for f32/f16) */
    int32_t page_size;     /* P */
    int32_t n_kv_heads;
    int32_t d_k, d_v;
    int32_t v_is_k_prefix;
    int32_t kivi;          /* 1 for KIVI formats (keys per channel) */
    int32_t k_tiled;       /* 1: k_codes in tiles of GOKV_KEY_TILE tokens (q4 keys, above) */
    int32_t residual;      /* R */
    int32_t ring_rows;     /* R + g for KIVI, else 0 */
    /* per-token sections: bytes per row, groups per row */
    uint64_t k_row_bytes, v_row_bytes; /* per token (per channel-group for KIVI keys: d_k*g*bits/8 per token group) */
    int32_t k_groups, v_groups;        /* scale/bias entries per row (KIVI keys: d_k per token group) */
    /* byte offsets of the sections inside a page */
    uint64_t k_codes, k_scale, k_bias, v_codes, v_scale, v_bias;
    /* stride between kv heads in each section: the size of one head block (v_*: 0 with v_is_k_prefix) */
    uint64_t k_codes_head, k_sb_head, v_codes_head, v_sb_head;
    uint64_t page_bytes;
    /* residual ring */
    uint64_t ring_k, ring_v, ring_bytes;
    /* key bounds beside each page: [Hkv][2][d_k] fp16 when key_bounds, else 0 */
    int32_t key_bounds;
    uint64_t bounds_bytes;
} gokv_layout;

/* Fills L from a validated pool description (page_size already defaulted). */
void gokv_layout_init(gokv_layout *L, const gokv_pool_desc *d);

enum { GOKV_KEY_TILE = 16 };

/* Offset of byte b of slot's key row inside a head's k_codes section (per-token keys). */
static inline uint64_t gokv_k_code_byte(const gokv_layout *L, int32_t slot, uint64_t b) {
    if (!L->k_tiled) return (uint64_t)slot * L->k_row_bytes + b;
    return (uint64_t)(slot / GOKV_KEY_TILE) * GOKV_KEY_TILE * L->k_row_bytes + (b / 4u) * (4u * GOKV_KEY_TILE) +
           (uint64_t)(slot % GOKV_KEY_TILE) * 4u + b % 4u;
}

static inline int32_t gokv_format_bits(int32_t format) {
    switch (format) {
    case GOKV_FORMAT_F32: return 32;
    case GOKV_FORMAT_F16: return 16;
    case GOKV_FORMAT_Q8: return 8;
    case GOKV_FORMAT_Q4: return 4;
    case GOKV_FORMAT_KIVI2: return 2;
    case GOKV_FORMAT_KIVI4: return 4;
    default: return 0;
    }
}
static inline int gokv_format_quantized(int32_t format) { return format >= GOKV_FORMAT_Q8 && format < GOKV_FORMAT_COUNT_; }
static inline int gokv_format_is_kivi(int32_t format) { return format == GOKV_FORMAT_KIVI2 || format == GOKV_FORMAT_KIVI4; }

#ifdef __cplusplus
}
#endif
#endif
