// gpu_push.h: the push constants of every GPU kernel, declared once for the host code (native/gpu, C), the
// Vulkan shaders (GLSL), the Metal kernels (MSL) and the emulator (C++): /* */ comments inside the lists,
// nothing language-specific outside the branches at the end.
//
// Each block is a field list GOKV_PUSH_<OP>(X): X(type, name) per field, in order, type one of PUSH_UINT,
// PUSH_INT, PUSH_FLOAT. Only 4-byte scalars, so the block's std430 layout (push constants) and the C
// struct's agree: field i at byte 4 i, no padding; GPU_PUSH_STRUCT (gpu_internal.h) checks each struct's
// size. A GLSL shader declares its block with PUSH_BLOCK(GOKV_PUSH_<OP>) (named Push, instance pc); a Metal
// kernel declares struct <op>_push { GOKV_PUSH_<OP>(PUSH_FIELD) }; and reads it from buffer 5.
// Word offsets (*_w) are in 4-byte words of the buffer named in the comment.
#ifndef GOKV_GPU_PUSH_H
#define GOKV_GPU_PUSH_H

// attend.comp, baseline_attend.comp (attend_common.glsl)
#define GOKV_PUSH_ATTEND(X)                                                                                  \
    X(PUSH_UINT, n_items)                                                                                    \
    X(PUSH_UINT, item_w)    /* item table in the inputs (ITEM_WORDS each) */                                 \
    X(PUSH_UINT, seq_w)     /* sequence table in the inputs (SEQ_WORDS each) */                              \
    X(PUSH_UINT, q_w)       /* queries [rows][n_heads_q][D_K] in the inputs */                               \
    X(PUSH_UINT, sink_w)    /* learned sink logits [n_heads_q] in the inputs, or NONE */                     \
    X(PUSH_UINT, part_w)    /* first word of the split-K partials in scratch */                              \
    X(PUSH_UINT, n_heads_q)                                                                                  \
    X(PUSH_INT, window)                                                                                      \
    X(PUSH_INT, n_sink_tokens)                                                                               \
    X(PUSH_FLOAT, scale)                                                                                     \
    X(PUSH_UINT, in_base)   /* staged inputs in scratch (attend_inputs.glsl) */                              \
    X(PUSH_UINT, stats_w)   /* MASS: softmax factors [rows][n_heads_q][2] in scratch */

// reduce.comp
#define GOKV_PUSH_REDUCE(X)                                                                                  \
    X(PUSH_UINT, n_entries)                                                                                  \
    X(PUSH_UINT, entry_w)   /* entry table in the inputs */                                                  \
    X(PUSH_UINT, part_w)    /* partials in scratch */                                                        \
    X(PUSH_UINT, sink_w)    /* learned sink logits in the inputs, or NONE */                                 \
    X(PUSH_UINT, in_base)   /* staged inputs in scratch (attend_inputs.glsl) */                              \
    X(PUSH_UINT, stats_w)   /* MASS: softmax factors [rows][n_heads_q][2] in scratch */

// mass.comp
#define GOKV_PUSH_MASS(X)                                                                                    \
    X(PUSH_UINT, n_items)                                                                                    \
    X(PUSH_UINT, item_w)    /* mass item table in the inputs (MASS_ITEM_WORDS each) */                       \
    X(PUSH_UINT, seq_w)     /* sequence table in the inputs (SEQ_WORDS each) */                              \
    X(PUSH_UINT, stats_w)   /* softmax factors [rows][n_heads_q][2] in scratch */                            \
    X(PUSH_UINT, n_heads_q)                                                                                  \
    X(PUSH_INT, window)                                                                                      \
    X(PUSH_INT, n_sink_tokens)                                                                               \
    X(PUSH_UINT, span)      /* tokens per item */                                                            \
    X(PUSH_UINT, in_base)   /* staged inputs in scratch (attend_inputs.glsl) */

// baseline_dequant.comp
#define GOKV_PUSH_DEQUANT(X)                                                                                 \
    X(PUSH_UINT, n_pages)   /* temporary pages */                                                            \
    X(PUSH_UINT, entry_w)   /* entry table in the inputs */                                                  \
    X(PUSH_UINT, f_page_w)  /* words of one f32 page */                                                      \
    X(PUSH_UINT, f_v_w)     /* word offset of the f32 page's V section inside a head block */                \
    X(PUSH_UINT, f_head_w)  /* words of one f32 head block (gokv_layout.h) */                                \
    X(PUSH_UINT, in_base)   /* staged inputs in scratch (attend_inputs.glsl) */

// store_rows.comp
#define GOKV_PUSH_STORE_ROWS(X)                                                                              \
    X(PUSH_UINT, k_w)       /* word offsets in up */                                                         \
    X(PUSH_UINT, v_w)                                                                                        \
    X(PUSH_UINT, meta_w)                                                                                     \
    X(PUSH_UINT, n_items)   /* rows * (K_UNITS + V_UNITS) */

// store_kivi_keys.comp
#define GOKV_PUSH_STORE_KIVI_KEYS(X)                                                                         \
    X(PUSH_UINT, k_w)       /* word offsets in up */                                                         \
    X(PUSH_UINT, meta_w)                                                                                     \
    X(PUSH_UINT, n_items)   /* groups * N_KV_HEADS * D_K */

// store_ring.comp
#define GOKV_PUSH_STORE_RING(X)                                                                              \
    X(PUSH_UINT, k_w)       /* word offsets in up */                                                         \
    X(PUSH_UINT, v_w)                                                                                        \
    X(PUSH_UINT, meta_w)                                                                                     \
    X(PUSH_UINT, n_items)   /* tokens * (K_WORDS + V_WORDS) */

// store_read.comp
#define GOKV_PUSH_STORE_READ(X)                                                                              \
    X(PUSH_UINT, meta_w)    /* word offset in up */                                                          \
    X(PUSH_UINT, k_out_w)   /* word offsets in down */                                                       \
    X(PUSH_UINT, v_out_w)                                                                                    \
    X(PUSH_UINT, n_k_items) /* rows * N_KV_HEADS * D_K */                                                    \
    X(PUSH_UINT, n_items)   /* n_k_items + (v_out ? rows * N_KV_HEADS * D_V : 0) */

// store_bounds.comp
#define GOKV_PUSH_STORE_BOUNDS(X)                                                                            \
    X(PUSH_UINT, meta_w)    /* word offset in up: 3 words per record (page, first slot, end slot) */         \
    X(PUSH_UINT, bounds_w)  /* first word of the key bounds in pages (after the pool's pages) */             \
    X(PUSH_UINT, all_pages) /* 1: record r is page r, reset to "no key" (pool creation), up is not read */   \
    X(PUSH_UINT, n_items)   /* records * N_KV_HEADS * D_K / 2 */

// quest_score.comp
#define GOKV_PUSH_QUEST_SCORE(X)                                                                             \
    X(PUSH_UINT, n_items)   /* entries * N_KV_HEADS */                                                       \
    X(PUSH_UINT, entry_w)   /* 2 words per page-table entry in the inputs: page (NONE: -inf), query word */  \
    X(PUSH_UINT, out_w)     /* B [entries][N_KV_HEADS] in scratch */                                         \
    X(PUSH_UINT, bounds_w)  /* first word of the key bounds in pages */                                      \
    X(PUSH_UINT, group)     /* query heads per kv head */                                                    \
    X(PUSH_UINT, in_base)   /* staged inputs in scratch (attend_inputs.glsl) */

// quest_select.comp
#define GOKV_PUSH_QUEST_SELECT(X)                                                                            \
    X(PUSH_UINT, n_items)   /* n_seqs * N_KV_HEADS */                                                        \
    X(PUSH_UINT, qseq_w)    /* Quest's sequence table in the inputs (QSEQ_WORDS each) */                     \
    X(PUSH_UINT, b_w)       /* B [entries][N_KV_HEADS] in scratch (quest_score.comp) */                      \
    X(PUSH_UINT, bounds_out_w) /* quest_bounds: a copy of B in down, or NONE */                              \
    X(PUSH_UINT, sel_out_w) /* quest_selected [n_seqs][N_KV_HEADS][k] in down, or NONE */                    \
    X(PUSH_UINT, k)         /* quest_pages */                                                                \
    X(PUSH_UINT, n_sink_tokens)                                                                              \
    X(PUSH_UINT, recent)    /* quest_recent */                                                               \
    X(PUSH_UINT, in_base)   /* staged inputs in scratch (attend_inputs.glsl); the masks are written there */

#if defined(__METAL_VERSION__)
// Metal Shading Language
#define PUSH_UINT uint
#define PUSH_INT int
#define PUSH_FLOAT float
#define PUSH_FIELD(type, name) type name;
#elif defined(__STDC_VERSION__) || defined(__cplusplus)
// C, and C++ (the Metal emulator compiles kernels as C++: PUSH_FIELD for their structs)
#include <stdint.h>
#define PUSH_UINT uint32_t
#define PUSH_INT int32_t
#define PUSH_FLOAT float
#define PUSH_FIELD(type, name) type name;
#else
// GLSL
#define PUSH_UINT uint
#define PUSH_INT int
#define PUSH_FLOAT float
#define PUSH_FIELD(type, name) type name;
#define PUSH_BLOCK(LIST) layout(push_constant) uniform Push { LIST(PUSH_FIELD) } pc
#endif

#endif
