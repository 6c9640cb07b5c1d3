/* KV caches for decoding: device buffers of a fixed capacity, appended to on the device, with
 * their fill level as a kv_seqlen tensor so that one SDPA plan serves every step. */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

struct clattn_kv_cache {
    clattn_ctx *ctx;
    clattn_kv_cache_desc desc;
    cl_mem k, v, lengths; /* (B, Hkv, capacity, d) twice, (B) int32 */
    size_t length;
};

void clattn_kv_cache_desc_init(clattn_kv_cache_desc *desc)
{
    clattn__desc_reset(desc, sizeof *desc);
}

static void kv_cache_defaults(void *desc)
{
    clattn_kv_cache_desc_init(desc);
}
/* Every version had struct_size and the sizes (batch .. head_dim_v). */
static const clattn__desc_type kv_cache_desc = {"clattn_kv_cache_desc", sizeof(clattn_kv_cache_desc),
                                                offsetof(clattn_kv_cache_desc, dtype),
                                                kv_cache_defaults};

void clattn_kv_cache_release(clattn_kv_cache *cache)
{
    if (cache == NULL)
        return;
    if (cache->k)
        clReleaseMemObject(cache->k);
    if (cache->v)
        clReleaseMemObject(cache->v);
    if (cache->lengths)
        clReleaseMemObject(cache->lengths);
    free(cache);
}

static clattn_status new_buffer(clattn_ctx *ctx, const char *op, const char *what, size_t bytes,
                                cl_mem *out)
{
    if (bytes > ctx->info.max_alloc_size)
        return clattn__fail(ctx, CLATTN_ERR_TOO_LARGE,
                            "%s: %s needs %zu bytes, more than the device's largest allocation "
                            "(CL_DEVICE_MAX_MEM_ALLOC_SIZE = %llu)",
                            op, what, bytes, (unsigned long long)ctx->info.max_alloc_size);
    cl_int err = CL_SUCCESS;
    *out = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS || *out == NULL) {
        *out = NULL;
        return clattn__fail(ctx, err != CL_SUCCESS ? (clattn_status)err : CLATTN_ERR_TOO_LARGE,
                            "%s: clCreateBuffer(%s, %zu bytes): %s (%d)", op, what, bytes,
                            clattn__cl_error_name(err), (int)err);
    }
    return CLATTN_SUCCESS;
}

clattn_status clattn_kv_cache_create(clattn_ctx *ctx, const clattn_kv_cache_desc *desc,
                                     clattn_kv_cache **out)
{
    static const char op[] = "kv_cache_create";
    if (out)
        *out = NULL;
    clattn_kv_cache_desc full;
    clattn_status status = clattn__create_entry(ctx, op, desc, out != NULL, &kv_cache_desc, &full);
    desc = &full;
    if (status != CLATTN_SUCCESS)
        return status;
    if (desc->dtype != CLATTN_DTYPE_F32 && desc->dtype != CLATTN_DTYPE_F16 &&
        desc->dtype != CLATTN_DTYPE_BF16)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: dtype=%d: the cache stores F32, F16 or BF16", op,
                            (int)desc->dtype);
    const size_t dims[5] = {desc->batch, desc->kv_heads, desc->capacity, desc->head_dim_qk,
                            desc->head_dim_v};
    static const char *const names[5] = {"batch", "kv_heads", "capacity", "head_dim_qk",
                                         "head_dim_v"};
    if ((status = clattn__check_dims(ctx, op, dims, names, 5, false)) ||
        (status = clattn__check_dims(ctx, op, dims, names, 5, true)))
        return status;
    const size_t elem = clattn_dtype_size(desc->dtype);
    size_t k_bytes = 0, v_bytes = 0, n_bytes = 0;
    if (!clattn__product(&k_bytes, 5, desc->batch, desc->kv_heads, desc->capacity,
                         desc->head_dim_qk, elem) ||
        !clattn__product(&v_bytes, 5, desc->batch, desc->kv_heads, desc->capacity, desc->head_dim_v,
                         elem) ||
        !clattn__mul(desc->batch, sizeof(cl_int), &n_bytes))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                            "%s: (batch, kv_heads, capacity, head_dim) = (%zu, %zu, %zu, %zu) "
                            "overflows size_t in bytes",
                            op, desc->batch, desc->kv_heads, desc->capacity, desc->head_dim_qk);
    clattn_kv_cache *cache = calloc(1, sizeof *cache);
    if (cache == NULL)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", op);
    cache->ctx = ctx;
    cache->desc = *desc;
    if ((status = new_buffer(ctx, op, "the keys", k_bytes, &cache->k)) ||
        (status = new_buffer(ctx, op, "the values", v_bytes, &cache->v)) ||
        (status = new_buffer(ctx, op, "the lengths", n_bytes, &cache->lengths))) {
        clattn_kv_cache_release(cache);
        return status;
    }
    /* Zeros everywhere: the unfused path multiplies the values past the length by zero
     * weights, which must then be finite (the fused path never reads them). */
    const cl_uchar zero = 0;
    cl_int err =
        clEnqueueFillBuffer(ctx->queue, cache->lengths, &zero, 1, 0, n_bytes, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = clEnqueueFillBuffer(ctx->queue, cache->k, &zero, 1, 0, k_bytes, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = clEnqueueFillBuffer(ctx->queue, cache->v, &zero, 1, 0, v_bytes, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = clFinish(ctx->queue);
    if (err != CL_SUCCESS) {
        clattn_kv_cache_release(cache);
        return clattn__fail(ctx, (clattn_status)err, "%s: clEnqueueFillBuffer (zeros): %s (%d)", op,
                            clattn__cl_error_name(err), (int)err);
    }
    *out = cache;
    return CLATTN_SUCCESS;
}

size_t clattn_kv_cache_length(const clattn_kv_cache *cache)
{
    return cache ? cache->length : 0;
}

static clattn_tensor cache_tensor(const clattn_kv_cache *cache, cl_mem mem, size_t head_dim)
{
    const clattn_kv_cache_desc *d = &cache->desc;
    return clattn_tensor_make(mem, 0, d->dtype, 4, d->batch, d->kv_heads, d->capacity, head_dim);
}

void clattn_kv_cache_tensors(const clattn_kv_cache *cache, clattn_tensor *k, clattn_tensor *v,
                             clattn_tensor *kv_seqlen)
{
    if (cache == NULL)
        return;
    if (k)
        *k = cache_tensor(cache, cache->k, cache->desc.head_dim_qk);
    if (v)
        *v = cache_tensor(cache, cache->v, cache->desc.head_dim_v);
    if (kv_seqlen)
        *kv_seqlen =
            clattn_tensor_make(cache->lengths, 0, CLATTN_DTYPE_I32, 1, cache->desc.batch, 0, 0, 0);
}

/* The lengths buffer := n for every batch, after the chain's last step. */
static clattn_status write_lengths(clattn_kv_cache *cache, size_t n, clattn_chain *chain)
{
    clattn_ctx *ctx = cache->ctx;
    const cl_int value = (cl_int)n;
    cl_event step = NULL;
    cl_int err = clEnqueueFillBuffer(chain->queue, cache->lengths, &value, sizeof value, 0,
                                     cache->desc.batch * sizeof value, chain->num_wait,
                                     chain->wait, &step);
    if (err != CL_SUCCESS)
        return clattn__fail(ctx, (clattn_status)err, "clEnqueueFillBuffer(lengths): %s (%d)",
                            clattn__cl_error_name(err), (int)err);
    clattn__chain_push(chain, step);
    return CLATTN_SUCCESS;
}

/* The entry checks of a call on the cache, then the launch context on the context's queue. */
static clattn_status cache_begin(clattn_kv_cache *cache, const char *op, clattn_chain *chain,
                                 cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    if (cache == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    clattn_status status = clattn__entry(cache->ctx, op, cache, num_wait, wait, event);
    return status ? status : clattn__begin(cache->ctx, op, chain, NULL, false, num_wait, wait);
}

clattn_status clattn_kv_cache_reset(clattn_kv_cache *cache, cl_uint num_wait, const cl_event *wait,
                                    cl_event *event)
{
    static const char op[] = "kv_cache_reset";
    clattn_chain chain;
    clattn_status status = cache_begin(cache, op, &chain, num_wait, wait, event);
    if (status != CLATTN_SUCCESS)
        return status;
    status = write_lengths(cache, 0, &chain);
    if (status == CLATTN_SUCCESS)
        cache->length = 0;
    return clattn__end(op, &chain, status, event);
}

/* Validates a new block of keys or values: (batch, kv_heads, n, head_dim), a float dtype,
 * a buffer that holds it; its view into *view. */
static clattn_status new_block(clattn_kv_cache *cache, const char *op, const char *name,
                               const clattn_tensor *t, size_t head_dim, size_t n,
                               clattn__view *view)
{
    clattn_ctx *ctx = cache->ctx;
    clattn__layout layout;
    clattn_status status = clattn__layout_from(ctx, op, name, t, CLATTN__FLOATS, false, &layout);
    if (status != CLATTN_SUCCESS)
        return status;
    if (!layout.present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is required", op, name);
    const size_t dims[4] = {cache->desc.batch, cache->desc.kv_heads, n, head_dim};
    if ((status = clattn__layout_expect(ctx, op, name, &layout, 4, dims,
                                        "(batch, kv_heads, new keys, head_dim) of the cache")))
        return status;
    cl_mem mem = NULL;
    size_t offset = 0;
    if ((status = clattn__bind(ctx, op, name, &layout, t, &mem, &offset)))
        return status;
    clattn__view_of(&layout, view);
    view->mem = mem;
    view->offset = offset;
    return CLATTN_SUCCESS;
}

clattn_status clattn_kv_cache_append(clattn_kv_cache *cache, const clattn_tensor *k,
                                     const clattn_tensor *v, cl_uint num_wait, const cl_event *wait,
                                     cl_event *event)
{
    static const char op[] = "kv_cache_append";
    if (cache == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    clattn_ctx *ctx = cache->ctx;
    clattn_status status = clattn__entry(ctx, op, cache, num_wait, wait, event);
    if (status == CLATTN_SUCCESS && (k == NULL || v == NULL))
        status = clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, k ? "v" : "k");
    if (status != CLATTN_SUCCESS)
        return status;
    const clattn_kv_cache_desc *d = &cache->desc;
    const size_t n = k->rank == 4 ? k->dims[2] : 0;
    if (n == 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: k has %s; expected (%zu, %zu, n >= 1, %zu) with n new keys", op,
                            k->rank == 4 ? "0 keys (dims[2] = 0)" : "rank != 4", d->batch,
                            d->kv_heads, d->head_dim_qk);
    const size_t room = d->capacity - cache->length;
    if (n > room) {
        /* Numbers a user can act on: what fits now, and the capacity this append needs. */
        if (room == 0)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                "%s: the cache is full (%zu of %zu keys), k brings %zu more: "
                                "reset it (clattn_kv_cache_reset), or create one with capacity "
                                ">= %zu",
                                op, cache->length, d->capacity, n, cache->length + n);
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: k brings %zu keys but only %zu more fit (the cache holds %zu of "
                            "its capacity %zu): append at most %zu, reset it, or create one with "
                            "capacity >= %zu",
                            op, n, room, cache->length, d->capacity, room, cache->length + n);
    }
    clattn__view k_view, v_view;
    if ((status = new_block(cache, op, "k", k, d->head_dim_qk, n, &k_view)) ||
        (status = new_block(cache, op, "v", v, d->head_dim_v, n, &v_view)))
        return status;
    clattn_chain chain;
    status = clattn__begin(ctx, op, &chain, NULL, false, num_wait, wait);
    clattn__view dst[2];
    const cl_mem dst_mem[2] = {cache->k, cache->v};
    const size_t head_dim[2] = {d->head_dim_qk, d->head_dim_v};
    for (int i = 0; i < 2; ++i) {
        /* The cache's packed (B, Hkv, capacity, d) buffer from key `length` on. */
        const size_t hd = head_dim[i], cap = d->capacity;
        dst[i] = (clattn__view){dst_mem[i],
                                (cl_ulong)cache->length * hd,
                                d->dtype,
                                {d->batch, d->kv_heads, n, hd},
                                {d->kv_heads * cap * hd, cap * hd, hd, 1}};
    }
    /* Keys, values and the key counts in one launch (kv_append). */
    clattn__append_plan append;
    if (status == CLATTN_SUCCESS)
        status =
            clattn__append_prepare(ctx, d->batch, d->kv_heads, n, d->head_dim_qk, d->head_dim_v,
                                   k_view.dtype, v_view.dtype, d->dtype, &append);
    if (status == CLATTN_SUCCESS)
        status = clattn__append_enqueue(&chain, &append, &k_view, &v_view, &dst[0], &dst[1],
                                        cache->lengths, cache->length + n);
    if (status == CLATTN_SUCCESS)
        cache->length += n;
    return clattn__end(op, &chain, status, event);
}
