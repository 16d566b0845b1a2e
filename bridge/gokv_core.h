/* gokv_core.h: the handles and the validation entry points of the C core (internal). */
#ifndef GOKV_CORE_H
#define GOKV_CORE_H

#include "gokv_backend.h"

struct gokv_device {
    const gokv_backend *be;
    void *impl;
};

struct gokv_pool {
    gokv_device *dev;
    gokv_pool_desc desc; /* validated, page_size defaulted */
    gokv_layout layout;
    void *impl;
    /* The largest |k| and |v| ever written (float bits, raised with __atomic: writes to one pool may run
     * concurrently). Never lowered, so they bound what the pages hold; gokv_check_score_range uses them. */
    uint32_t max_abs_k_bits, max_abs_v_bits;
};

/* The magnitudes of a validated array of rows x heads x dim: the largest |x|, and the largest sum of |x|
 * over one (row, head) with where it is. */
typedef struct gokv_value_range {
    float max_abs;
    double max_l1;
    int64_t l1_row;
    int32_t l1_head;
} gokv_value_range;

/* Copies a caller descriptor of src_size bytes into dst (dst_size bytes), rejecting NULL and descriptors
 * older than this build knows (GOKV_EVERSION). Newer, larger descriptors keep their known prefix. */
gokv_status gokv_take_desc(const char *op, const char *what, void *dst, size_t dst_size, const void *src,
                           uint32_t src_size);

/* Each checks every field of a caller's descriptor, fills the validated copy, and returns a status with
 * a message naming the argument at fault. Nothing is touched before these succeed. */
gokv_status gokv_validate_pool_desc(gokv_pool_desc *d);
/* gokv_validate_write also fills the magnitudes of the keys and values to be written (with
 * v_is_k_prefix, the values' are the keys'); either may be NULL. */
gokv_status gokv_validate_write(const char *op, gokv_pool *pool, const gokv_write_desc *in, gokv_write_desc *d,
                                gokv_value_range *k_range, gokv_value_range *v_range);
gokv_status gokv_validate_read(const char *op, gokv_pool *pool, const gokv_read_desc *in, gokv_read_desc *d);
gokv_status gokv_validate_copy(const char *op, gokv_pool *pool, const gokv_copy_desc *in, gokv_copy_desc *d);
gokv_status gokv_validate_attend(const char *op, gokv_device *dev, const gokv_attend_desc *in, gokv_attend_desc *d,
                                 gokv_value_range *q_range);

/* Rejects an attention whose scores or value sums could leave float32's range although every input is
 * finite (the kernels would return zeros or NaN), naming the query row and head. new_k_abs and new_v_abs
 * are the largest magnitudes about to be written in the same call (0 without a write). */
gokv_status gokv_check_score_range(const char *op, const gokv_pool *pool, const gokv_attend_desc *d,
                                   const gokv_value_range *q_range, float new_k_abs, float new_v_abs);

/* Raises the pool's recorded largest |k| and |v| to include a validated write's. */
void gokv_pool_note_range(gokv_pool *pool, const gokv_value_range *k_range, const gokv_value_range *v_range);

#endif
