/* Tensor descriptors: validation of layouts at plan creation and of bindings at execution. */
#include "tensor.h"

#include <string.h>

size_t clattn_dtype_size(clattn_dtype dtype)
{
    switch (dtype) {
    case CLATTN_DTYPE_F32:
        return 4;
    case CLATTN_DTYPE_F16:
    case CLATTN_DTYPE_BF16:
        return 2;
    case CLATTN_DTYPE_U8:
    case CLATTN_DTYPE_FP8_E4M3:
    case CLATTN_DTYPE_FP8_E5M2:
        return 1;
    case CLATTN_DTYPE_I32:
        return 4;
    case CLATTN_DTYPE_Q8_0:
    case CLATTN_DTYPE_Q4_0:
        return 0;
    }
    return 0;
}

bool clattn__dtype_blocks(clattn_dtype dtype, size_t *elems, size_t *bytes)
{
    *elems = dtype == CLATTN_DTYPE_Q8_0 || dtype == CLATTN_DTYPE_Q4_0 ? CLATTN__QBLOCK : 1;
    *bytes = dtype == CLATTN_DTYPE_Q8_0   ? 34
             : dtype == CLATTN_DTYPE_Q4_0 ? 18
                                          : clattn_dtype_size(dtype);
    return *bytes != 0;
}

const char *clattn__dtype_name(clattn_dtype dtype)
{
    switch (dtype) {
    case CLATTN_DTYPE_F32:
        return "F32";
    case CLATTN_DTYPE_F16:
        return "F16";
    case CLATTN_DTYPE_BF16:
        return "BF16";
    case CLATTN_DTYPE_U8:
        return "U8";
    case CLATTN_DTYPE_I32:
        return "I32";
    case CLATTN_DTYPE_Q8_0:
        return "Q8_0";
    case CLATTN_DTYPE_Q4_0:
        return "Q4_0";
    case CLATTN_DTYPE_FP8_E4M3:
        return "FP8_E4M3";
    case CLATTN_DTYPE_FP8_E5M2:
        return "FP8_E5M2";
    }
    return "?";
}

void clattn__format_dims(char *out, size_t size, int rank, const size_t *dims)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < rank && used + 1 < size; ++i) {
        int n = snprintf(out + used, size - used, "%s%zu", i ? ", " : "(", dims[i]);
        if (n < 0)
            return;
        used += (size_t)n;
    }
    if (used + 1 < size)
        snprintf(out + used, size - used, "%s", rank ? ")" : "()");
}

clattn_status clattn__layout_from(clattn_ctx *ctx, const char *op, const char *name,
                                  const clattn_tensor *t, unsigned dtypes, bool output,
                                  clattn__layout *out)
{
    memset(out, 0, sizeof *out);
    if (t->rank == 0)
        return CLATTN_SUCCESS;
    if (t->rank < 0 || t->rank > CLATTN_MAX_RANK)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: %s has rank %d; tensors have rank 1 to %d", op, name, t->rank,
                            CLATTN_MAX_RANK);
    size_t block = 1, elem = 0;
    if (!clattn__dtype_blocks(t->dtype, &block, &elem))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: %s has dtype %d, which is not a clattn_dtype", op, name,
                            (int)t->dtype);
    if (!(dtypes & (1u << t->dtype)))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: %s cannot be %s (allowed:%s%s%s%s%s%s%s%s)", op, name,
                            clattn__dtype_name(t->dtype), dtypes & 1 ? " F32" : "",
                            dtypes & 2 ? " F16" : "", dtypes & 4 ? " BF16" : "",
                            dtypes & 8 ? " U8" : "", dtypes & 16 ? " I32" : "",
                            dtypes & 32 ? " Q8_0" : "", dtypes & 64 ? " Q4_0" : "",
                            dtypes & CLATTN__FP8 ? " FP8_E4M3 FP8_E5M2" : "");
    if (block > 1) {
        /* Whole blocks: rows of 32k elements along the last dimension, packed. */
        const int last = t->rank - 1;
        if (t->dims[last] % block != 0)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: %s is %s with dims[%d] = %zu (the head size): a block type "
                                "needs a multiple of %zu",
                                op, name, clattn__dtype_name(t->dtype), last, t->dims[last],
                                block);
        for (int d = 0; d < t->rank; ++d)
            if (d == last ? t->strides[d] != 1 : t->strides[d] % block != 0)
                return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                    "%s: %s is %s with strides[%d] = %zu: %s", op, name,
                                    clattn__dtype_name(t->dtype), d, t->strides[d],
                                    d == last ? "the last stride must be 1 (blocks are packed)"
                                              : "strides must be whole blocks (multiples of 32)");
    }
    bool zero_strides = true, one_element = true;
    for (int d = 0; d < t->rank; ++d) {
        if (t->dims[d] == 0)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                "%s: %s has dims[%d] = 0: every dimension must be at least 1", op,
                                name, d);
        if (t->dims[d] > CL_UINT_MAX)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: %s has dims[%d] = %zu, over the kernels' 32-bit limit", op,
                                name, d, t->dims[d]);
        zero_strides = zero_strides && t->strides[d] == 0;
        one_element = one_element && t->dims[d] == 1;
    }
    if (zero_strides && !one_element) {
        char dims[128];
        clattn__format_dims(dims, sizeof dims, t->rank, t->dims);
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: %s has dims %s and strides all 0: give its strides "
                            "(clattn_tensor_make gives packed ones; all-zero strides meant "
                            "packed before 0.7)",
                            op, name, dims);
    }
    out->present = true;
    out->dtype = t->dtype;
    out->rank = t->rank;
    size_t extent = 1; /* 1 + the highest element offset reached */
    for (int d = t->rank - 1; d >= 0; --d) {
        out->dims[d] = t->dims[d];
        out->strides[d] = t->strides[d];
        if (output && out->dims[d] > 1 && out->strides[d] == 0)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                "%s: %s (an output) has stride 0 along dims[%d] = %zu: its "
                                "elements would overlap",
                                op, name, d, out->dims[d]);
        size_t reach = 0;
        if (!clattn__mul(out->dims[d] - 1, out->strides[d], &reach) ||
            !clattn__add(extent, reach, &extent))
            return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                                "%s: the elements %s spans overflow size_t", op, name);
    }
    size_t bytes = 0;
    if (block > 1)
        extent = (extent + block - 1) / block * block; /* the last block is whole */
    if (!clattn__mul(extent / block, elem, &bytes))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: the bytes %s spans overflow size_t",
                            op, name);
    out->extent = extent;
    return CLATTN_SUCCESS;
}

clattn_status clattn__layout_expect(clattn_ctx *ctx, const char *op, const char *name,
                                    const clattn__layout *l, int rank, const size_t *dims,
                                    const char *what)
{
    bool ok = l->rank == rank;
    for (int d = 0; ok && d < rank; ++d)
        ok = l->dims[d] == dims[d];
    if (ok)
        return CLATTN_SUCCESS;
    char want[128], got[128];
    clattn__format_dims(want, sizeof want, rank, dims);
    clattn__format_dims(got, sizeof got, l->rank, l->dims);
    return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE, "%s: %s has dims %s, expected %s %s", op,
                        name, got, want, what);
}

void clattn__view_of(const clattn__layout *l, clattn__view *v)
{
    memset(v, 0, sizeof *v);
    v->dtype = l->dtype;
    const int shift = 4 - l->rank;
    for (int d = 0; d < 4; ++d) {
        v->dims[d] = d < shift ? 1 : l->dims[d - shift];
        v->strides[d] = d < shift ? 0 : l->strides[d - shift];
    }
}

static bool same_layout(const clattn__layout *l, const clattn__layout *m)
{
    if (l->dtype != m->dtype || l->rank != m->rank)
        return false;
    for (int d = 0; d < l->rank; ++d)
        if (l->dims[d] != m->dims[d] || (l->dims[d] > 1 && l->strides[d] != m->strides[d]))
            return false;
    return true;
}

clattn_status clattn__bind(clattn_ctx *ctx, const char *op, const char *name,
                           const clattn__layout *planned, const clattn_tensor *t, cl_mem *mem,
                           size_t *offset)
{
    *mem = NULL;
    *offset = 0;
    if (!planned->present) {
        if (t->rank != 0 || t->mem != NULL)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: %s is bound but the plan was created without it", op, name);
        return CLATTN_SUCCESS;
    }
    if (t->mem == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s has no buffer (mem is NULL)",
                            op, name);
    clattn__layout given;
    clattn_status status = clattn__layout_from(ctx, op, name, t, 0x7fu | CLATTN__FP8, false, &given);
    if (status != CLATTN_SUCCESS)
        return status;
    if (!same_layout(planned, &given)) {
        char want[128], got[128];
        clattn__format_dims(want, sizeof want, planned->rank, planned->dims);
        clattn__format_dims(got, sizeof got, given.rank, given.dims);
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: %s is %s %s here but the plan was created for %s %s (with its "
                            "strides)",
                            op, name, clattn__dtype_name(given.dtype), got,
                            clattn__dtype_name(planned->dtype), want);
    }
    size_t block = 1, elem = 0;
    clattn__dtype_blocks(planned->dtype, &block, &elem);
    if (t->offset % block != 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: %s is %s at offset %zu: offsets must be whole blocks (multiples "
                            "of %zu elements)",
                            op, name, clattn__dtype_name(planned->dtype), t->offset, block);
    clattn_tensor blocks = *t; /* the block types: counted in blocks of `elem` bytes */
    blocks.offset = t->offset / block;
    status = clattn__check_tensor(ctx, op, name, blocks, planned->extent / block, elem, true);
    if (status != CLATTN_SUCCESS)
        return status;
    *mem = t->mem;
    *offset = t->offset;
    return CLATTN_SUCCESS;
}

bool clattn__desc_reset(void *desc, size_t size)
{
    if (desc == NULL)
        return false;
    memset(desc, 0, size);
    memcpy(desc, &size, sizeof size); /* struct_size, the first field of every descriptor */
    return true;
}

clattn_status clattn__create_entry(clattn_ctx *ctx, const char *op, const void *desc, bool has_out,
                                  const clattn__desc_type *type, void *full)
{
    if (ctx == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    clattn__clear_error(ctx);
    if (desc == NULL || !has_out)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op,
                            desc ? "out" : "desc");
    size_t given; /* every descriptor starts with its struct_size */
    memcpy(&given, desc, sizeof given);
    if (given < type->min_size || given > type->size || given % sizeof(size_t) != 0)
        return clattn__fail(
            ctx, CLATTN_ERR_INVALID_ARGUMENT,
            "%s: struct_size=%zu but sizeof(%s) is %zu in clattn %s (an earlier version's "
            "smaller struct, a multiple of 8 of at least %zu bytes, is taken too): set "
            "struct_size = sizeof(%s) (or use the _init function)",
            op, given, type->name, type->size, CLATTN_VERSION_STRING, type->min_size, type->name);
    /* The caller's fields over the defaults: an older caller's struct lacks the fields
     * appended since, and they keep their defaults. */
    type->defaults(full);
    memcpy(full, desc, given);
    memcpy(full, &type->size, sizeof type->size);
    return CLATTN_SUCCESS;
}
