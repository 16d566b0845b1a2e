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
};

/* Copies a caller descriptor of src_size bytes into dst (dst_size bytes), rejecting NULL and descriptors
 * older than this build knows (GOKV_EVERSION). Newer, larger descriptors keep their known prefix. */
gokv_status gokv_take_desc(const char *op, const char *what, void *dst, size_t dst_size, const void *src,
                           uint32_t src_size);

/* Each checks every field of a caller's descriptor, fills the validated copy, and returns a status with
 * a message naming the argument at fault. Nothing is touched before these succeed. */
gokv_status gokv_validate_pool_desc(gokv_pool_desc *d);
gokv_status gokv_validate_write(const char *op, gokv_pool *pool, const gokv_write_desc *in, gokv_write_desc *d);
gokv_status gokv_validate_read(const char *op, gokv_pool *pool, const gokv_read_desc *in, gokv_read_desc *d);
gokv_status gokv_validate_copy(const char *op, gokv_pool *pool, const gokv_copy_desc *in, gokv_copy_desc *d);
gokv_status gokv_validate_attend(const char *op, gokv_device *dev, const gokv_attend_desc *in, gokv_attend_desc *d);

#endif
