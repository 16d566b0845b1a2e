/*
 * gpu_slots.c: the backend-table slots every GPU module fills with the plan (gpu_plan.h, GPU_PLAN_SLOTS).
 * A module's device and pool structs start with gpu_device and gpu_pool, so the table's opaque pointers are
 * the plan's; the layout argument is ignored (the pool keeps its own copy). The core validated the
 * arguments before any of these runs.
 */
#include "gpu_plan.h"

gokv_status gpu_slot_pool_write(void *dev, void *pool, const gokv_layout *L, const gokv_write_desc *desc) {
    (void)L;
    return gpu_pool_write(dev, pool, desc);
}

gokv_status gpu_slot_pool_read(void *dev, void *pool, const gokv_layout *L, const gokv_read_desc *desc) {
    (void)L;
    return gpu_pool_read(dev, pool, desc);
}

gokv_status gpu_slot_pool_copy(void *dev, void *pool, const gokv_layout *L, const gokv_copy_desc *desc) {
    (void)L;
    return gpu_pool_copy(dev, pool, desc);
}

gokv_status gpu_slot_attend(void *dev, void *pool, const gokv_layout *L, const gokv_attend_desc *desc) {
    (void)L;
    return gpu_attend(dev, pool, desc);
}

gokv_status gpu_slot_page_bytes(void *dev, void *pool, const gokv_layout *L, int32_t page, void *out) {
    (void)L;
    return gpu_page_bytes(dev, pool, page, out);
}

gokv_status gpu_slot_slot_bytes(void *dev, void *pool, const gokv_layout *L, int32_t slot, void *out) {
    (void)L;
    return gpu_slot_bytes(dev, pool, slot, out);
}

gokv_status gpu_slot_set_page_bytes(void *dev, void *pool, const gokv_layout *L, int32_t page, const void *bytes,
                                    int32_t n_tokens) {
    (void)L;
    return gpu_set_page_bytes(dev, pool, page, bytes, n_tokens);
}

gokv_status gpu_slot_set_slot_bytes(void *dev, void *pool, const gokv_layout *L, int32_t slot, const void *bytes) {
    (void)L;
    return gpu_set_slot_bytes(dev, pool, slot, bytes);
}
