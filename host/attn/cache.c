/* KV caches for decoding: device buffers of a fixed capacity, appended to on the device, with
 * their fill level as a kv_seqlen tensor so that one SDPA plan serves every step. Paged mode:
 * pools of pages and a block table (B, blocks), kept on the host too (`map`), filled by a
 * lowest-free-page allocator (`used`: which pages the table holds) or by the caller. */
#define _DEFAULT_SOURCE /* posix_memalign, madvise (the pools' huge pages on CPU devices) */
#include "plan.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

struct clattn_kv_cache {
    clattn_ctx *ctx;
    clattn_kv_cache_desc desc;
    cl_mem k, v, lengths; /* (B, Hkv, capacity, d) twice, (B) int32 */
    size_t length;
    /* paged mode (desc.page_size > 0): k, v are (num_pages, page_size, Hkv, d) pools */
    cl_mem table;          /* (B, blocks) int32 on the device */
    cl_int *map;           /* its host copy; -1: no page */
    unsigned char *used;   /* num_pages flags: a block of `map` holds the page */
    size_t blocks;         /* ceil(capacity / page_size) */
    bool dirty;            /* map changed since the last write of the table */
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
    const cl_mem mems[4] = {cache->k, cache->v, cache->lengths, cache->table};
    for (int i = 0; i < 4; ++i)
        if (mems[i])
            clReleaseMemObject(mems[i]);
    free(cache->map);
    free(cache->used);
    free(cache);
}

#if defined(__linux__) && defined(MADV_HUGEPAGE)
enum { HUGE_PAGE = 2u << 20 }; /* x86-64's and AArch64's (4 KiB pages) transparent huge page */

static void CL_CALLBACK free_pool_memory(cl_mem mem, void *memory)
{
    (void)mem;
    free(memory);
}

/* A pool of at least a huge page on a CPU device: host memory aligned to huge pages and
 * marked for them (madvise(MADV_HUGEPAGE): transparent huge pages in Linux's default
 * `madvise` mode), used in place (CL_MEM_USE_HOST_PTR: a CPU device's buffer is host
 * memory), freed when the runtime destroys the buffer. A long cache's decode streams its
 * keys and values once a step: with 4 KiB pages every 4 KiB costs a TLB walk, and on a 2-vCPU
 * Intel Xeon the step at 16k-32k keys ran 1.13-1.47x faster on huge pages (BENCHMARKS.md).
 * NULL where any step fails (the caller then allocates as usual). */
static cl_mem huge_pool(clattn_ctx *ctx, size_t bytes)
{
    if (!(ctx->info.type & CL_DEVICE_TYPE_CPU) || bytes < HUGE_PAGE ||
        bytes > SIZE_MAX - HUGE_PAGE || clattn__fault(CLATTN_FAULT_ALLOC))
        return NULL;
    const size_t rounded = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    void *memory = NULL;
    if (posix_memalign(&memory, HUGE_PAGE, rounded) != 0)
        return NULL;
    (void)madvise(memory, rounded, MADV_HUGEPAGE); /* (a hint: 4 KiB pages if refused) */
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, bytes,
                                memory, &err);
    if (err != CL_SUCCESS || mem == NULL) {
        free(memory);
        return NULL;
    }
    if (clSetMemObjectDestructorCallback(mem, free_pool_memory, memory) != CL_SUCCESS) {
        clReleaseMemObject(mem); /* (no command used it: the runtime holds no reference) */
        free(memory);
        return NULL;
    }
    return mem;
}
#else
static cl_mem huge_pool(clattn_ctx *ctx, size_t bytes)
{
    (void)ctx, (void)bytes;
    return NULL;
}
#endif

/* pool: the keys' or values' pool (huge pages on CPU devices, huge_pool). */
static clattn_status new_buffer(clattn_ctx *ctx, const char *op, const char *what, size_t bytes,
                                bool pool, cl_mem *out)
{
    if (bytes > ctx->info.max_alloc_size)
        return clattn__fail(ctx, CLATTN_ERR_TOO_LARGE,
                            "%s: %s needs %zu bytes, more than the device's largest allocation "
                            "(CL_DEVICE_MAX_MEM_ALLOC_SIZE = %llu)",
                            op, what, bytes, (unsigned long long)ctx->info.max_alloc_size);
    if (pool && (*out = huge_pool(ctx, bytes)) != NULL)
        return CLATTN_SUCCESS;
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

/* An FP8 per-tensor scale (clattn_quantize_scaled's, clattn_kv_cache_desc's): 0 means 1; else
 * a finite float > 0, and only for an FP8 dtype. */
static clattn_status fp8_scale(clattn_ctx *ctx, const char *op, const char *name, double scale,
                               clattn_dtype dtype, float *out)
{
    *out = 1.0f;
    if (scale == 0.0)
        return CLATTN_SUCCESS;
    if (!(scale >= FLT_MIN && scale <= FLT_MAX))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: %s=%g: a finite float > 0 (0 means 1)", op, name, scale);
    if (!((1u << dtype) & CLATTN__FP8) && scale != 1.0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: %s=%g with dtype %s: a per-tensor scale is FP8's (Q8_0 and Q4_0 "
                            "scale each block)",
                            op, name, scale, clattn__dtype_name(dtype));
    *out = (float)scale;
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
    if ((unsigned)desc->dtype > 31u || !((1u << desc->dtype) & (CLATTN__FLOATS | CLATTN__QUANT)))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: dtype=%d: the cache stores F32, F16, BF16, Q8_0, Q4_0, "
                            "FP8_E4M3 or FP8_E5M2",
                            op, (int)desc->dtype);
    float scales[2];
    if ((status = fp8_scale(ctx, op, "k_scale", desc->k_scale, desc->dtype, &scales[0])) ||
        (status = fp8_scale(ctx, op, "v_scale", desc->v_scale, desc->dtype, &scales[1])))
        return status;
    size_t block = 1, elem = 0;
    clattn__dtype_blocks(desc->dtype, &block, &elem);
    if (desc->head_dim_qk % block != 0 || desc->head_dim_v % block != 0)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: head_dim_qk=%zu, head_dim_v=%zu: a %s cache needs head sizes "
                            "that are multiples of %zu (its blocks)",
                            op, desc->head_dim_qk, desc->head_dim_v,
                            clattn__dtype_name(desc->dtype), block);
    const size_t dims[5] = {desc->batch, desc->kv_heads, desc->capacity, desc->head_dim_qk,
                            desc->head_dim_v};
    static const char *const names[5] = {"batch", "kv_heads", "capacity", "head_dim_qk",
                                         "head_dim_v"};
    if ((status = clattn__check_dims(ctx, op, dims, names, 5, false)) ||
        (status = clattn__check_dims(ctx, op, dims, names, 5, true)))
        return status;
    /* Paged: the pool's pages stand for (batch, capacity) in the sizes. */
    size_t blocks = 0, pages = desc->num_pages, rows = 0, seqs = desc->batch;
    if (desc->page_size > 0) {
        blocks = desc->capacity / desc->page_size + (desc->capacity % desc->page_size != 0);
        if (pages == 0 && !clattn__mul(desc->batch, blocks, &pages))
            return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                                "%s: batch * ceil(capacity / page_size) = %zu * %zu pages "
                                "overflows size_t",
                                op, desc->batch, blocks);
        const size_t paged[2] = {desc->page_size, pages};
        static const char *const paged_names[2] = {"page_size", "num_pages"};
        if ((status = clattn__check_dims(ctx, op, paged, paged_names, 2, true)))
            return status;
        if (pages > (size_t)INT32_MAX)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: num_pages=%zu: the block table's int32 entries address at "
                                "most %d pages",
                                op, pages, (int)INT32_MAX);
        seqs = pages;
    }
    const size_t seq_len = desc->page_size > 0 ? desc->page_size : desc->capacity;
    size_t k_bytes = 0, v_bytes = 0, n_bytes = 0, t_bytes = 0;
    if (!clattn__product(&k_bytes, 5, seqs, desc->kv_heads, seq_len, desc->head_dim_qk / block,
                         elem) ||
        !clattn__product(&v_bytes, 5, seqs, desc->kv_heads, seq_len, desc->head_dim_v / block,
                         elem) ||
        !clattn__mul(desc->batch, sizeof(cl_int), &n_bytes) ||
        !clattn__product(&t_bytes, 3, desc->batch, blocks, sizeof(cl_int)) ||
        !clattn__mul(desc->batch, blocks, &rows))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                            "%s: (%s, kv_heads, %s, head_dim) = (%zu, %zu, %zu, %zu) "
                            "overflows size_t in bytes",
                            op, desc->page_size ? "num_pages" : "batch",
                            desc->page_size ? "page_size" : "capacity", seqs, desc->kv_heads,
                            seq_len, desc->head_dim_qk);
    clattn_kv_cache *cache = calloc(1, sizeof *cache);
    if (cache == NULL)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", op);
    cache->ctx = ctx;
    cache->desc = *desc;
    cache->desc.num_pages = desc->page_size > 0 ? pages : 0;
    cache->blocks = blocks;
    if (desc->page_size > 0 &&
        ((cache->map = malloc(t_bytes)) == NULL || (cache->used = calloc(pages, 1)) == NULL)) {
        clattn_kv_cache_release(cache);
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", op);
    }
    for (size_t i = 0; i < rows; ++i)
        cache->map[i] = -1;
    if ((status = new_buffer(ctx, op, "the keys", k_bytes, true, &cache->k)) ||
        (status = new_buffer(ctx, op, "the values", v_bytes, true, &cache->v)) ||
        (status = new_buffer(ctx, op, "the lengths", n_bytes, false, &cache->lengths)) ||
        (desc->page_size > 0 &&
         (status = new_buffer(ctx, op, "the block table", t_bytes, false, &cache->table)))) {
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
    if (err == CL_SUCCESS && cache->table)
        err = clEnqueueWriteBuffer(ctx->queue, cache->table, CL_FALSE, 0, t_bytes, cache->map, 0,
                                   NULL, NULL);
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
    if (d->page_size > 0) {
        /* (num_pages, page_size, kv_heads, d) as plans take pools, stored head-major within a
         * page, (num_pages, kv_heads, page_size, d) (FlashInfer's HND): a head's keys of a
         * page are one run of memory, as in a contiguous cache */
        clattn_tensor t = clattn_tensor_make(mem, 0, d->dtype, 4, d->num_pages, d->page_size,
                                             d->kv_heads, head_dim);
        t.strides[1] = head_dim;
        t.strides[2] = d->page_size * head_dim;
        return t;
    }
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

void clattn_kv_cache_block_table(const clattn_kv_cache *cache, clattn_tensor *table)
{
    if (table == NULL)
        return;
    if (cache == NULL || cache->table == NULL)
        *table = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 0, 0, 0, 0, 0);
    else
        *table = clattn_tensor_make(cache->table, 0, CLATTN_DTYPE_I32, 2, cache->desc.batch,
                                    cache->blocks, 0, 0);
}

/* The host's block table to the device (blocking: the host copy may change at the next call),
 * after the chain's last step. */
static clattn_status write_table(clattn_kv_cache *cache, clattn_chain *chain)
{
    clattn_ctx *ctx = cache->ctx;
    cl_event step = NULL;
    cl_int err = clEnqueueWriteBuffer(chain->queue, cache->table, CL_TRUE, 0,
                                      cache->desc.batch * cache->blocks * sizeof(cl_int),
                                      cache->map, chain->num_wait, chain->wait, &step);
    if (err != CL_SUCCESS)
        return clattn__fail(ctx, (clattn_status)err, "clEnqueueWriteBuffer(block table): %s (%d)",
                            clattn__cl_error_name(err), (int)err);
    clattn__chain_push(chain, step);
    cache->dirty = false;
    return CLATTN_SUCCESS;
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
    if (status == CLATTN_SUCCESS && cache->table) {
        for (size_t i = 0; i < cache->desc.batch * cache->blocks; ++i)
            cache->map[i] = -1;
        memset(cache->used, 0, cache->desc.num_pages);
        cache->dirty = true;
        status = write_table(cache, &chain);
    }
    if (status == CLATTN_SUCCESS)
        cache->length = 0;
    return clattn__end(op, &chain, status, event);
}

clattn_status clattn_kv_cache_map_pages(clattn_kv_cache *cache, const int32_t *table,
                                        cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    static const char op[] = "kv_cache_map_pages";
    if (cache == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    clattn_ctx *ctx = cache->ctx;
    clattn_status status = clattn__entry(ctx, op, cache, num_wait, wait, event);
    if (status != CLATTN_SUCCESS)
        return status;
    if (cache->table == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: the cache is contiguous (page_size = 0): it has no pages", op);
    if (table == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: table is NULL", op);
    const size_t batch = cache->desc.batch, blocks = cache->blocks, pages = cache->desc.num_pages;
    const size_t filled = cache->length / cache->desc.page_size +
                          (cache->length % cache->desc.page_size != 0);
    /* owner[p]: 1 + the entry that would hold page p (0: none), to name both of a pair. */
    size_t *owner = calloc(pages, sizeof *owner);
    if (owner == NULL)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", op);
    for (size_t i = 0; i < batch * blocks && status == CLATTN_SUCCESS; ++i) {
        const size_t b = i / blocks, j = i % blocks;
        const int32_t given = table[i];
        if (given < -1 || (given >= 0 && (size_t)given >= pages)) {
            status = clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                  "%s: table[%zu, %zu] = %d: expected a page 0 .. %zu of the pool, "
                                  "or -1 to leave the block as it is",
                                  op, b, j, (int)given, pages - 1);
            break;
        }
        if (given >= 0 && j < filled && cache->map[i] != given) {
            status = clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                  "%s: table[%zu, %zu] = %d: that block holds keys already (the "
                                  "cache's length is %zu) in page %d; reset the cache to remap it",
                                  op, b, j, (int)given, cache->length, (int)cache->map[i]);
            break;
        }
        const int32_t page = given >= 0 ? given : cache->map[i];
        if (page < 0)
            continue;
        if (owner[page] != 0) {
            const size_t other = owner[page] - 1;
            status = clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                  "%s: table[%zu, %zu] = %d: page %d would also hold block "
                                  "[%zu, %zu]: a page holds one block",
                                  op, b, j, (int)page, (int)page, other / blocks, other % blocks);
            break;
        }
        owner[page] = i + 1;
    }
    clattn_chain chain;
    if (status == CLATTN_SUCCESS)
        status = clattn__begin(ctx, op, &chain, NULL, false, num_wait, wait);
    else {
        free(owner);
        return status;
    }
    int32_t *saved = malloc(batch * blocks * sizeof *saved);
    if (saved == NULL)
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", op);
    if (status == CLATTN_SUCCESS) {
        memcpy(saved, cache->map, batch * blocks * sizeof *saved);
        for (size_t i = 0; i < batch * blocks; ++i)
            if (table[i] >= 0)
                cache->map[i] = table[i];
        cache->dirty = true;
        status = write_table(cache, &chain);
        if (status != CLATTN_SUCCESS) /* nothing changed (the device's copy is rewritten next) */
            memcpy(cache->map, saved, batch * blocks * sizeof *saved);
    }
    if (status == CLATTN_SUCCESS)
        for (size_t p = 0; p < pages; ++p)
            cache->used[p] = owner[p] != 0;
    free(saved);
    free(owner);
    return clattn__end(op, &chain, status, event);
}

/* Paged append of keys length .. length + n - 1: maps every block they reach that has no
 * page to the lowest free one (dirty when any was). No free page: the map unchanged and a
 * message with the pages needed. */
static clattn_status map_blocks(clattn_kv_cache *cache, const char *op, size_t n)
{
    const clattn_kv_cache_desc *d = &cache->desc;
    const size_t first = cache->length / d->page_size;
    const size_t last = (cache->length + n - 1) / d->page_size;
    size_t next = 0, taken = 0;
    for (size_t b = 0; b < d->batch; ++b)
        for (size_t j = first; j <= last; ++j) {
            cl_int *entry = &cache->map[b * cache->blocks + j];
            if (*entry >= 0)
                continue;
            while (next < d->num_pages && cache->used[next])
                ++next;
            if (next == d->num_pages) {
                /* Undo this call's pages (marked 2), then say what the append needs. */
                size_t needed = 0;
                for (size_t i = 0; i < d->batch * cache->blocks; ++i) {
                    const size_t jj = i % cache->blocks;
                    if (jj < first || jj > last)
                        continue;
                    if (cache->map[i] >= 0 && cache->used[cache->map[i]] == 2) {
                        cache->used[cache->map[i]] = 0;
                        cache->map[i] = -1;
                    }
                    needed += cache->map[i] < 0;
                }
                return clattn__fail(cache->ctx, CLATTN_ERR_INVALID_SHAPE,
                                    "%s: the pool has no free page for keys %zu .. %zu: they "
                                    "need %zu new pages, %zu free (%zu in the pool): reset "
                                    "the cache or create it with more num_pages",
                                    op, cache->length, cache->length + n - 1, needed, taken,
                                    d->num_pages);
            }
            cache->used[next] = 2; /* taken by this call */
            *entry = (cl_int)next;
            ++taken;
            cache->dirty = true;
        }
    for (size_t p = 0; p < d->num_pages; ++p)
        if (cache->used[p] == 2)
            cache->used[p] = 1;
    return CLATTN_SUCCESS;
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

/* The entry checks of an append or a step (a NULL cache: CLATTN_ERR_INVALID_ARGUMENT, with no
 * context to hold a message). */
static clattn_status cache_entry(clattn_kv_cache *cache, const char *op, cl_uint num_wait,
                                 const cl_event *wait, cl_event *event)
{
    return cache == NULL ? CLATTN_ERR_INVALID_ARGUMENT
                         : clattn__entry(cache->ctx, op, cache, num_wait, wait, event);
}

clattn_status clattn_kv_cache_append(clattn_kv_cache *cache, const clattn_tensor *k,
                                     const clattn_tensor *v, cl_uint num_wait, const cl_event *wait,
                                     cl_event *event)
{
    static const char op[] = "kv_cache_append";
    clattn_status status = cache_entry(cache, op, num_wait, wait, event);
    if (status != CLATTN_SUCCESS)
        return status;
    clattn_ctx *ctx = cache->ctx;
    if (k == NULL || v == NULL)
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
    if (status == CLATTN_SUCCESS && cache->table &&
        (status = map_blocks(cache, op, n)) == CLATTN_SUCCESS && cache->dirty)
        status = write_table(cache, &chain);
    clattn__view dst[2];
    const cl_mem dst_mem[2] = {cache->k, cache->v};
    const size_t head_dim[2] = {d->head_dim_qk, d->head_dim_v};
    for (int i = 0; i < 2; ++i) {
        /* Contiguous: the packed (B, Hkv, capacity, d) buffer from key `length` on. Paged:
         * the pool, stored (pages, Hkv, page_size, d), with strides (page, head, slot, 1);
         * kv_append finds each key's page in the table. */
        const size_t hd = head_dim[i], cap = d->capacity;
        if (cache->table)
            dst[i] = (clattn__view){dst_mem[i],
                                    0,
                                    d->dtype,
                                    {d->batch, d->kv_heads, n, hd},
                                    {d->page_size * d->kv_heads * hd, d->page_size * hd, hd, 1}};
        else
            dst[i] = (clattn__view){dst_mem[i],
                                    (cl_ulong)cache->length * hd,
                                    d->dtype,
                                    {d->batch, d->kv_heads, n, hd},
                                    {d->kv_heads * cap * hd, cap * hd, hd, 1}};
    }
    /* Keys, values and the key counts in one launch (kv_append). */
    clattn__append_plan append;
    if (status == CLATTN_SUCCESS)
        status = clattn__append_prepare(ctx, d->batch, d->kv_heads, n, d->head_dim_qk,
                                        d->head_dim_v, k_view.dtype, v_view.dtype, d->dtype,
                                        d->page_size, &append);
    append.k_scale = (float)d->k_scale; /* an FP8 cache's (validated at creation; 0: 1) */
    append.v_scale = (float)d->v_scale;
    const clattn__append_pages pages = {cache->table, cache->blocks, d->page_size, d->num_pages,
                                        cache->length};
    if (status == CLATTN_SUCCESS)
        status = clattn__append_enqueue(&chain, &append, &k_view, &v_view, &dst[0], &dst[1],
                                        cache->lengths, cache->length + n, &pages);
    if (status == CLATTN_SUCCESS)
        cache->length += n;
    return clattn__end(op, &chain, status, event);
}

/* Whether by_role binds the cache's own buffers as the plan's k, v, kv_seqlen (and block
 * table): the fused step writes the new row where the plan reads its keys. */
static const char *not_the_cache(const clattn_kv_cache *cache, const clattn_tensor *by_role,
                                 size_t num_roles)
{
    static const struct {
        clattn_role role;
        const char *name;
    } roles[4] = {{CLATTN_ROLE_K, "k"},
                  {CLATTN_ROLE_V, "v"},
                  {CLATTN_ROLE_KV_SEQLEN, "kv_seqlen"},
                  {CLATTN_ROLE_BLOCK_TABLE, "block_table"}};
    const cl_mem mems[4] = {cache->k, cache->v, cache->lengths, cache->table};
    for (int i = 0; i < (cache->table ? 4 : 3); ++i)
        if ((size_t)roles[i].role >= num_roles || by_role[roles[i].role].mem != mems[i] ||
            by_role[roles[i].role].offset != 0)
            return roles[i].name;
    return NULL;
}

/* The new row, then the plan in a second launch (a plan whose kernel takes no step). */
static clattn_status decode_in_two(clattn_kv_cache *cache, clattn_plan *plan,
                                   const clattn_tensor *k_new, const clattn_tensor *v_new,
                                   const clattn_tensor *by_role, size_t num_roles,
                                   cl_mem workspace, cl_uint num_wait, const cl_event *wait,
                                   cl_event *event)
{
    cl_event appended = NULL;
    clattn_status status =
        clattn_kv_cache_append(cache, k_new, v_new, num_wait, wait, &appended);
    if (status == CLATTN_SUCCESS)
        status = clattn_plan_execute(plan, by_role, num_roles, NULL, workspace, 1, &appended,
                                     event);
    if (appended)
        clReleaseEvent(appended);
    return status;
}

clattn_status clattn_kv_cache_decode(clattn_kv_cache *cache, clattn_plan *plan,
                                     const clattn_tensor *k_new, const clattn_tensor *v_new,
                                     const clattn_tensor *by_role, size_t num_roles,
                                     cl_mem workspace, cl_uint num_wait, const cl_event *wait,
                                     cl_event *event)
{
    static const char op[] = "kv_cache_decode";
    clattn_status status = cache_entry(cache, op, num_wait, wait, event);
    if (status != CLATTN_SUCCESS)
        return status;
    clattn_ctx *ctx = cache->ctx;
    const char *null = plan == NULL ? "plan" : k_new == NULL ? "k_new" : v_new == NULL ? "v_new"
                       : by_role == NULL                  ? "by_role"
                                                          : NULL;
    if (null)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, null);
    if (plan->ctx != ctx || plan->ops->kind != CLATTN__SDPA || !plan->sdpa.kv_step)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: plan is not an SDPA plan made with kv_step = 1 on this cache's "
                            "context (clattn_sdpa_desc.kv_step)",
                            op);
    const char *other = not_the_cache(cache, by_role, num_roles);
    if (other)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: by_role's %s is not this cache's (bind clattn_kv_cache_tensors "
                            "and clattn_kv_cache_block_table's tensors)",
                            op, other);
    const clattn_kv_cache_desc *d = &cache->desc;
    if (cache->length >= d->capacity)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: the cache is full (%zu of %zu keys): reset it "
                            "(clattn_kv_cache_reset), or create one with capacity >= %zu",
                            op, cache->length, d->capacity, cache->length + 1);
    clattn__kv_step step = {.on = true, .lengths = cache->lengths, .keys = cache->length};
    if ((status = new_block(cache, op, "k_new", k_new, d->head_dim_qk, 1, &step.k_new)) ||
        (status = new_block(cache, op, "v_new", v_new, d->head_dim_v, 1, &step.v_new)))
        return status;
    const clattn_dtype q_dtype = plan->layouts[R_Q].dtype;
    if (!plan->attention.fused || !plan->attention.flash.kv_step ||
        step.k_new.dtype != q_dtype || step.v_new.dtype != q_dtype)
        return decode_in_two(cache, plan, k_new, v_new, by_role, num_roles, workspace, num_wait,
                             wait, event);
    /* Paged: the new key's block mapped first (the table written, blocking, once a page). */
    cl_event mapped = NULL;
    if (cache->table && (status = map_blocks(cache, op, 1)) == CLATTN_SUCCESS && cache->dirty) {
        const cl_int err = clEnqueueWriteBuffer(ctx->queue, cache->table, CL_TRUE, 0,
                                                d->batch * cache->blocks * sizeof(cl_int),
                                                cache->map, num_wait, wait, &mapped);
        if (err != CL_SUCCESS)
            return clattn__fail(ctx, (clattn_status)err,
                                "%s: clEnqueueWriteBuffer(block table): %s (%d)", op,
                                clattn__cl_error_name(err), (int)err);
        cache->dirty = false;
    }
    if (status != CLATTN_SUCCESS)
        return status;
    plan->sdpa.step = &step;
    status = clattn_plan_execute(plan, by_role, num_roles, NULL, workspace,
                                 mapped ? 1 : num_wait, mapped ? &mapped : wait, event);
    plan->sdpa.step = NULL;
    if (mapped)
        clReleaseEvent(mapped);
    if (status == CLATTN_SUCCESS)
        cache->length += 1;
    return status;
}

clattn_status clattn_quantize(clattn_ctx *ctx, const clattn_tensor *src, const clattn_tensor *dst,
                              cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    return clattn_quantize_scaled(ctx, src, dst, 0.0f, num_wait, wait, event);
}

clattn_status clattn_quantize_scaled(clattn_ctx *ctx, const clattn_tensor *src,
                                     const clattn_tensor *dst, float scale, cl_uint num_wait,
                                     const cl_event *wait, cl_event *event)
{
    static const char op[] = "quantize";
    clattn_status status = clattn__entry(ctx, op, ctx, num_wait, wait, event);
    if (status != CLATTN_SUCCESS)
        return status;
    if (src == NULL || dst == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op,
                            src ? "dst" : "src");
    clattn__layout from, to;
    if ((status = clattn__layout_from(ctx, op, "src", src, CLATTN__FLOATS, false, &from)) ||
        (status = clattn__layout_from(ctx, op, "dst", dst, CLATTN__QUANT, true, &to)))
        return status;
    if (!from.present || !to.present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is absent (rank 0)", op,
                            from.present ? "dst" : "src");
    float dst_scale = 1.0f;
    if ((status = clattn__layout_expect(ctx, op, "dst", &to, from.rank, from.dims,
                                        "(src's dims)")) ||
        (status = fp8_scale(ctx, op, "scale", scale, to.dtype, &dst_scale)))
        return status;
    clattn__view views[2];
    const clattn__layout *layouts[2] = {&from, &to};
    const clattn_tensor *tensors[2] = {src, dst};
    static const char *const names[2] = {"src", "dst"};
    for (int i = 0; i < 2; ++i) {
        cl_mem mem = NULL;
        size_t offset = 0;
        if ((status = clattn__bind(ctx, op, names[i], layouts[i], tensors[i], &mem, &offset)))
            return status;
        clattn__view_of(layouts[i], &views[i]);
        views[i].mem = mem;
        views[i].offset = offset;
    }
    clattn__copy_plan copy;
    if ((status = clattn__copy_prepare(ctx, views[1].dims, from.dtype, to.dtype, &copy)))
        return status;
    clattn_chain chain;
    status = clattn__begin(ctx, op, &chain, NULL, false, num_wait, wait);
    if (status == CLATTN_SUCCESS)
        status = (1u << to.dtype) & CLATTN__FP8
                     ? clattn__copy_enqueue_fp8(&chain, &copy, &views[0], &views[1],
                                                1.0f / dst_scale)
                     : clattn__copy_enqueue(&chain, &copy, &views[0], &views[1]);
    return clattn__end(op, &chain, status, event);
}
