/*
 * gpu_spec.h: the specialization constant ids of every GPU kernel (native/gpu/gpu_plan.h), apart so that
 * every language the kernels are written in can read them: C (the plan, the hosts), C++ (the emulators) and
 * Metal include this file; GLSL names them as constant_id literals (native/vulkan/shaders/common.glsl).
 * A plain enum and nothing else.
 */
#ifndef GOKV_GPU_SPEC_H
#define GOKV_GPU_SPEC_H

/* Vulkan: constant_id = the value; Metal: the index into the spec words of buffer 6. */
enum {
    GPU_SPEC_FORMAT = 0,     /* GOKV_FORMAT_* */
    GPU_SPEC_BITS = 1,       /* 32, 16, 8, 4, 2 */
    GPU_SPEC_GROUP = 2,      /* g (0 for f32/f16) */
    GPU_SPEC_PAGE_SIZE = 3,  /* P */
    GPU_SPEC_N_KV_HEADS = 4,
    GPU_SPEC_D_K = 5,
    GPU_SPEC_D_V = 6,
    GPU_SPEC_V_IS_K_PREFIX = 7,
    GPU_SPEC_KIVI = 8,
    GPU_SPEC_RING_ROWS = 9,        /* R + g (KIVI) */
    GPU_SPEC_PAGE_WORDS = 10,      /* page_bytes / 4 */
    GPU_SPEC_K_CODES_W = 11,       /* section offsets inside a page: codes in words, scale/bias in halves */
    GPU_SPEC_K_SCALE_H = 12,
    GPU_SPEC_K_BIAS_H = 13,
    GPU_SPEC_V_CODES_W = 14,
    GPU_SPEC_V_SCALE_H = 15,
    GPU_SPEC_V_BIAS_H = 16,
    GPU_SPEC_K_CODES_HEAD_W = 17,  /* one kv head's share of each section */
    GPU_SPEC_K_SB_HEAD_H = 18,
    GPU_SPEC_V_CODES_HEAD_W = 19,
    GPU_SPEC_V_SB_HEAD_H = 20,
    GPU_SPEC_K_ROW_W = 21,         /* words per token row (KIVI keys: per token group of g) */
    GPU_SPEC_V_ROW_W = 22,
    GPU_SPEC_K_GROUPS = 23,        /* scale/bias entries per row (KIVI keys: d_k per token group) */
    GPU_SPEC_V_GROUPS = 24,
    GPU_SPEC_RING_K_H = 25,        /* ring sections inside a slot, in halves */
    GPU_SPEC_RING_V_H = 26,
    GPU_SPEC_RING_HALVES = 27,     /* ring_bytes / 2 per slot */
    GPU_SPEC_WG_SIZE = 28,         /* threads per workgroup (Vulkan: local_size_x_id = 28) */
    GPU_SPEC_SUBGROUP_SIZE = 29,   /* the simdgroup size requested for the pipeline, or the device's default */
    GPU_SPEC_OP0 = 30,             /* free for the op's own constants (e.g. query vectors per item) */
    GPU_SPEC_OP1 = 31,
    GPU_SPEC_OP2 = 32,
    GPU_SPEC_OP3 = 33,
    GPU_SPEC_K_TILED = 34,         /* L.k_tiled: key codes in tiles of GOKV_KEY_TILE tokens (q4 keys) */
    GPU_SPEC_OP4 = 35,             /* a fifth op constant (attend, reduce: MASS) */
    GPU_SPEC_COUNT = 36
};

#endif
