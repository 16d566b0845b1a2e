/*
 * mtl_variants.h: how the Metal module turns a pipeline request of the shared plan (a kernel name and its
 * GPU_SPEC_* words, native/gpu/gpu_plan.h) into one compiled instance of a Metal kernel and the
 * threadgroup memory it needs. Portable C: the macOS host and the emulated backend both use it.
 *
 * Each kernel family has a header of static inline functions beside this one:
 *     mtl_attend_variants.h   attend, baseline_attend, reduce, reduce_mass, mass, mass_keys, baseline_dequant
 *     mtl_store_variants.h    store_rows, store_kivi_keys, store_ring, store_read, store_bounds, quest_score,
 *                             quest_select
 * and each defines
 *     int mtl_variant_<family>(const char *name, const uint32_t spec[GPU_SPEC_COUNT], uint32_t targs[MTL_MAX_TARGS],
 *                              uint32_t *tg_words);
 * returning -1 when name is not one of its kernels, else the number of template arguments it wrote to
 * targs (the instance is "<name>_<targs[0]>_<targs[1]>..." as listed in the kernel file's
 * MTL_INSTANCES_*), and the threadgroup memory the instance needs for this spec in 32-bit words. A spec
 * value that only bounds a capacity (queries per item, say) may be rounded up to the nearest instance.
 */
#ifndef GOKV_MTL_VARIANTS_H
#define GOKV_MTL_VARIANTS_H

#include <stdint.h>

#define MTL_MAX_TARGS 4
#define MTL_MAX_NAME 64

#endif
