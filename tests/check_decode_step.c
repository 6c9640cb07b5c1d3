/*
 * check_decode_step: a KV cache's decode step in one launch (clattn_kv_cache_decode with an
 * SDPA plan made with kv_step = 1): the fused kernel attends the cache's keys plus the new
 * key and value, read from the step's inputs, and writes them into the cache.
 *
 * Each case fills a cache with a prompt (clattn_kv_cache_append), then runs several steps;
 * each step's output (poisoned with NaN first) is compared with the float64 reference over
 * the cache's keys and the new one, the kernels each step enqueued are counted through
 * clattn's kernel trace (one where the plan runs flash_cpu.cl or flash_gpu.cl, which have the
 * step; two, the append and the attention, on flash.cl), and after the steps the cache holds every
 * appended key and value (bit for bit in F32; as rounded in F16) and its length. Awkward
 * lengths (a first step on an empty cache, 17, 63, 65, 1031 keys), GQA, contiguous and paged
 * (pages of 16 and 64, shuffled by the caller), softcap, a window, sinks. Then the refusals.
 */
#include "problems.h"
#include "reference.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct step_case {
    size_t batch, heads, kv_heads, d, prompt, steps, page_size;
    clattn_dtype dtype;
    float softcap;
    long long window; /* < 0: none */
    int sinks;
} step_case;

static const step_case cases[] = {
    /* an empty cache's first step, then 2 more; contiguous F32 */
    {1, 2, 2, 64, 0, 3, 0, CLATTN_DTYPE_F32, 0.0f, -1, 0},
    /* sinks on a grouped decode without a window (the group's query heads as rows of their
     * k/v head, each its own sink): GQA 8/1 over two sequences, GQA 4/2; with
     * CLATTN_PARAMS=gpu (ctest decode_step_gpu_params) PoCL 3.1 gave every row the first
     * head's sink when flash_gpu.cl's step had its barriers inside a branch */
    {2, 8, 1, 64, 5, 3, 0, CLATTN_DTYPE_F32, 0.0f, -1, 1},
    {1, 4, 2, 64, 0, 2, 0, CLATTN_DTYPE_F32, 0.0f, -1, 1},
    /* GQA 4/2, paged in 16s, 16 + 1 = 17 keys first; softcap */
    {2, 4, 2, 32, 16, 3, 16, CLATTN_DTYPE_F32, 5.0f, -1, 0},
    /* 63, 64, 65 keys; GQA 8/2; F16 cache and inputs; a window; sinks */
    {1, 8, 2, 64, 62, 3, 0, CLATTN_DTYPE_F16, 0.0f, 40, 1},
    /* 1031, 1032 keys, paged in 64s */
    {1, 4, 4, 64, 1030, 2, 64, CLATTN_DTYPE_F32, 0.0f, -1, 0},
    /* pools of at least 2 MiB (8 k/v heads x 1037 x 64 floats, 2.1 MB each): on a CPU device
     * under Linux, host memory on huge pages used in place (host/attn/cache.c huge_pool);
     * contiguous GQA 16/8, and paged in 64s */
    {1, 16, 8, 64, 1030, 2, 0, CLATTN_DTYPE_F32, 0.0f, -1, 1},
    {1, 8, 8, 64, 1029, 3, 64, CLATTN_DTYPE_F32, 0.0f, 300, 0},
};
/* the cases a simulator runs (CLATTN_TEST_SCALE=small): not the last three (1030 keys) */
#define SMALL_CASES 5

/* A context on the shared one's device whose queue profiles (the kernel trace needs it). */
static clattn_ctx *profiling_ctx(cl_command_queue *queue)
{
    clattn_ctx *shared = tu_ctx();
    cl_int err = CL_SUCCESS;
    *queue = clCreateCommandQueue(clattn_ctx_cl_context(shared), clattn_ctx_device(shared),
                                  CL_QUEUE_PROFILING_ENABLE, &err);
    clattn_ctx *ctx = NULL;
    char message[256] = "";
    if (err != CL_SUCCESS ||
        !tu_expect_status(clattn_ctx_create_from_queue(*queue, &ctx, message, sizeof message),
                          CLATTN_SUCCESS, "clattn_ctx_create_from_queue"))
        return NULL;
    return ctx;
}

/* Uploads values (packed float) as dtype. */
static cl_mem upload_as(clattn_ctx *ctx, clattn_dtype dtype, const float *values, size_t count)
{
    const size_t size = clattn_dtype_size(dtype);
    unsigned char *bytes = malloc(count * size);
    for (size_t i = 0; i < count; ++i) {
        if (dtype == CLATTN_DTYPE_F16) {
            const uint16_t h = pb_f16_from_float(values[i]);
            memcpy(bytes + i * size, &h, size);
        } else {
            memcpy(bytes + i * size, &values[i], size);
        }
    }
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(clattn_ctx_cl_context(ctx),
                                CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, count * size, bytes,
                                &err);
    free(bytes);
    return err == CL_SUCCESS ? mem : NULL;
}

/* count values of dtype from mem at element offset into floats. */
static void download_as(clattn_ctx *ctx, clattn_dtype dtype, cl_mem mem, size_t offset,
                        size_t count, float *out)
{
    const size_t size = clattn_dtype_size(dtype);
    unsigned char *bytes = malloc(count * size);
    clEnqueueReadBuffer(clattn_ctx_queue(ctx), mem, CL_TRUE, offset * size, count * size, bytes, 0,
                        NULL, NULL);
    for (size_t i = 0; i < count; ++i) {
        if (dtype == CLATTN_DTYPE_F16) {
            uint16_t h;
            memcpy(&h, bytes + i * size, size);
            out[i] = pb_f16_to_float(h);
        } else {
            memcpy(&out[i], bytes + i * size, size);
        }
    }
    free(bytes);
}

/* The reference of step `step` (keys 0 .. n - 1 of keys/values (B, Hkv, total, d)) into ref. */
static void reference_step(const step_case *c, const float *q_rows, const float *keys,
                           const float *values, size_t total, size_t n, const float *sinks,
                           double *ref)
{
    const size_t kv_count = c->batch * c->kv_heads * n * c->d;
    float *k = tu_floats(kv_count), *v = tu_floats(kv_count);
    for (size_t bh = 0; bh < c->batch * c->kv_heads; ++bh) {
        memcpy(k + bh * n * c->d, keys + bh * total * c->d, n * c->d * sizeof(float));
        memcpy(v + bh * n * c->d, values + bh * total * c->d, n * c->d * sizeof(float));
    }
    ref_sdpa_shape shape = ref_softmax_shape(c->batch, c->heads, 1, n, c->d, c->d);
    shape.kv_heads = c->kv_heads;
    shape.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    shape.softcap = c->softcap;
    shape.sinks = c->sinks ? sinks : NULL;
    if (c->window >= 0) {
        shape.window_align = CLATTN_CAUSAL_BOTTOM_RIGHT;
        shape.window_left = c->window;
        shape.window_right = -1;
    }
    ref_sdpa(&shape, q_rows, k, v, NULL, NULL, ref, NULL, NULL);
    free(k);
    free(v);
}

/* Maps each sequence's blocks to pages in a shuffled order (the caller's pages). */
static void shuffle_pages(clattn_kv_cache *cache, size_t batch, size_t blocks)
{
    const size_t count = batch * blocks;
    int32_t *table = malloc(count * sizeof *table);
    for (size_t i = 0; i < count; ++i)
        table[i] = (int32_t)i;
    for (size_t i = count; i > 1; --i) {
        const size_t j = tu_rand_below(i);
        const int32_t t = table[i - 1];
        table[i - 1] = table[j];
        table[j] = t;
    }
    tu_expect_status(clattn_kv_cache_map_pages(cache, table, 0, NULL, NULL), CLATTN_SUCCESS,
                     "map_pages");
    free(table);
}

/* The cache's stored keys (or values) of every sequence, rows 0 .. total - 1, as floats
 * (B, Hkv, total, d): contiguous, or through the block table. */
static void read_cache(clattn_ctx *ctx, const step_case *c, clattn_kv_cache *cache, int values,
                       size_t total, float *out)
{
    clattn_tensor k, v, table;
    clattn_kv_cache_tensors(cache, &k, &v, NULL);
    clattn_kv_cache_block_table(cache, &table);
    const clattn_tensor *t = values ? &v : &k;
    int32_t *map = NULL;
    if (c->page_size) {
        map = malloc(table.dims[0] * table.dims[1] * sizeof *map);
        clEnqueueReadBuffer(clattn_ctx_queue(ctx), table.mem, CL_TRUE, 0,
                            table.dims[0] * table.dims[1] * sizeof *map, map, 0, NULL, NULL);
    }
    for (size_t b = 0; b < c->batch; ++b)
        for (size_t h = 0; h < c->kv_heads; ++h)
            for (size_t j = 0; j < total; ++j) {
                size_t at;
                if (c->page_size) {
                    const int32_t page = map[b * table.dims[1] + j / c->page_size];
                    at = (size_t)page * t->strides[0] + (j % c->page_size) * t->strides[1] +
                         h * t->strides[2];
                } else {
                    at = b * t->strides[0] + h * t->strides[1] + j * t->strides[2];
                }
                download_as(ctx, c->dtype, t->mem, at, c->d,
                            out + ((b * c->kv_heads + h) * total + j) * c->d);
            }
    free(map);
}

/* The kernels enqueued since the last call (clattn's kernel trace); -1 when unavailable. */
static long traced_launches(clattn_ctx *ctx)
{
    clattn_kernel_time times[16];
    size_t count = 0;
    if (clattn_ctx_kernel_times(ctx, times, 16, &count, NULL) != CLATTN_SUCCESS)
        return -1;
    return (long)count;
}

/* A pool of at least 2 MiB on a CPU device under Linux is host memory aligned to 2 MiB used in
 * place (CL_MEM_USE_HOST_PTR; huge pages where the kernel grants them); smaller pools and
 * other devices: the runtime's own memory. */
static void expect_pool_pages(clattn_ctx *ctx, const clattn_kv_cache *cache)
{
    clattn_tensor k, v;
    clattn_kv_cache_tensors(cache, &k, &v, NULL);
    cl_device_type type = 0;
    clGetDeviceInfo(clattn_ctx_device(ctx), CL_DEVICE_TYPE, sizeof type, &type, NULL);
    const cl_mem mems[2] = {k.mem, v.mem};
    for (int i = 0; i < 2; ++i) {
        size_t size = 0;
        cl_mem_flags flags = 0;
        void *host = NULL;
        clGetMemObjectInfo(mems[i], CL_MEM_SIZE, sizeof size, &size, NULL);
        clGetMemObjectInfo(mems[i], CL_MEM_FLAGS, sizeof flags, &flags, NULL);
        clGetMemObjectInfo(mems[i], CL_MEM_HOST_PTR, sizeof host, &host, NULL);
#if defined(__linux__)
        const int huge = (type & CL_DEVICE_TYPE_CPU) && size >= (2u << 20);
#else
        const int huge = 0;
#endif
        tu_expect(huge ? (flags & CL_MEM_USE_HOST_PTR) && host && (uintptr_t)host % (2u << 20) == 0
                       : !(flags & CL_MEM_USE_HOST_PTR),
                  "pool %d of %zu bytes: flags 0x%llx, host pointer %p (huge pages expected: %d)",
                  i, size, (unsigned long long)flags, host, huge);
    }
}

/* The steps of case i, each against its reference; then the cache's contents. */
static void run_case(clattn_ctx *ctx, const step_case *c, const char *info_out, size_t info_size,
                     long *launches_seen)
{
    const size_t total = c->prompt + c->steps, capacity = total + 5;
    const size_t kv_count = c->batch * c->kv_heads * total * c->d;
    const size_t q_count = c->batch * c->heads * c->steps * c->d;
    float *keys = tu_random_floats(kv_count), *values = tu_random_floats(kv_count);
    float *q = tu_random_floats(q_count);
    float sinks[16];
    for (size_t h = 0; h < c->heads; ++h)
        sinks[h] = 0.25f * (float)h - 1.0f;
    pb_round_array(c->dtype, keys, kv_count);
    pb_round_array(c->dtype, values, kv_count);
    pb_round_array(c->dtype, q, q_count);
    cl_mem k_mem = upload_as(ctx, c->dtype, keys, kv_count);
    cl_mem v_mem = upload_as(ctx, c->dtype, values, kv_count);
    cl_mem q_mem = upload_as(ctx, c->dtype, q, q_count);
    float *poison = tu_nan_floats(q_count);
    cl_mem out_mem = upload_as(ctx, c->dtype, poison, q_count);
    cl_mem sinks_mem = upload_as(ctx, CLATTN_DTYPE_F32, sinks, 16);
    clattn_kv_cache_desc cd;
    clattn_kv_cache_desc_init(&cd);
    cd.batch = c->batch, cd.kv_heads = c->kv_heads, cd.capacity = capacity;
    cd.head_dim_qk = c->d, cd.head_dim_v = c->d, cd.dtype = c->dtype;
    cd.page_size = c->page_size;
    clattn_kv_cache *cache = NULL;
    clattn_plan *plan = NULL;
    const size_t kv_strides[4] = {c->kv_heads * total * c->d, total * c->d, c->d, 1};
    const size_t q_strides[4] = {c->heads * c->steps * c->d, c->steps * c->d, c->d, 1};
    if (!tu_expect_status(clattn_kv_cache_create(ctx, &cd, &cache), CLATTN_SUCCESS, "cache"))
        goto done;
    expect_pool_pages(ctx, cache);
    if (c->page_size)
        shuffle_pages(cache, c->batch, (capacity + c->page_size - 1) / c->page_size);
    if (c->prompt > 0) {
        clattn_tensor pk = clattn_tensor_make(k_mem, 0, c->dtype, 4, c->batch, c->kv_heads,
                                              c->prompt, c->d);
        clattn_tensor pv = pk;
        pv.mem = v_mem;
        memcpy(pk.strides, kv_strides, sizeof kv_strides);
        memcpy(pv.strides, kv_strides, sizeof kv_strides);
        tu_expect_status(clattn_kv_cache_append(cache, &pk, &pv, 0, NULL, NULL), CLATTN_SUCCESS,
                         "prompt");
    }
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    clattn_tensors t = {0};
    CLATTN_BIND_ROLES(desc, t);
    desc.kv_step = 1;
    desc.path = CLATTN_PATH_FUSED;
    desc.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    desc.softcap = c->softcap;
    if (c->window >= 0) {
        desc.window_align = CLATTN_CAUSAL_BOTTOM_RIGHT;
        desc.window_left = c->window;
        desc.window_right = -1;
    }
    t.q = clattn_tensor_make(q_mem, 0, c->dtype, 4, c->batch, c->heads, 1, c->d);
    t.out = clattn_tensor_make(out_mem, 0, c->dtype, 4, c->batch, c->heads, 1, c->d);
    memcpy(t.q.strides, q_strides, sizeof q_strides);
    memcpy(t.out.strides, q_strides, sizeof q_strides);
    clattn_kv_cache_tensors(cache, &t.k, &t.v, &t.kv_seqlen);
    clattn_kv_cache_block_table(cache, &t.block_table);
    if (c->sinks)
        t.sinks = clattn_tensor_make(sinks_mem, 0, CLATTN_DTYPE_F32, 1, c->heads, 0, 0, 0);
    if (!tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS, "plan"))
        goto done;
    snprintf((char *)info_out, info_size, "%s", clattn_plan_info(plan));
    clattn_ctx_trace_kernels(ctx, 1);
    traced_launches(ctx);
    for (size_t s = 0; s < c->steps; ++s) {
        clattn_tensor k_new = clattn_tensor_make(k_mem, (c->prompt + s) * c->d, c->dtype, 4,
                                                 c->batch, c->kv_heads, 1, c->d);
        clattn_tensor v_new = k_new;
        v_new.mem = v_mem;
        memcpy(k_new.strides, kv_strides, sizeof kv_strides);
        memcpy(v_new.strides, kv_strides, sizeof kv_strides);
        clattn_tensors bound = t;
        bound.q.offset = s * c->d;
        bound.out.offset = s * c->d;
        if (!tu_expect_status(clattn_kv_cache_decode(cache, plan, &k_new, &v_new, bound.by_role,
                                                     CLATTN_ROLE_COUNT, NULL, 0, NULL, NULL),
                              CLATTN_SUCCESS, "decode"))
            break;
        clattn_finish(ctx);
        const long launches = traced_launches(ctx);
        if (*launches_seen == 0 || launches > *launches_seen)
            *launches_seen = launches;
    }
    clattn_ctx_trace_kernels(ctx, 0);
    tu_expect(clattn_kv_cache_length(cache) == total, "the cache holds %zu keys, not %zu",
              clattn_kv_cache_length(cache), total);
    /* the outputs, step by step */
    float *got = tu_floats(q_count);
    download_as(ctx, c->dtype, out_mem, 0, q_count, got);
    const size_t rows = c->batch * c->heads;
    float *q_rows = tu_floats(rows * c->d), *got_rows = tu_floats(rows * c->d);
    double *ref = tu_doubles(rows * c->d);
    const double tol = c->dtype == CLATTN_DTYPE_F32 ? TU_TOL : 4e-3;
    for (size_t s = 0; s < c->steps; ++s) {
        for (size_t r = 0; r < rows; ++r) {
            memcpy(q_rows + r * c->d, q + (r * c->steps + s) * c->d, c->d * sizeof(float));
            memcpy(got_rows + r * c->d, got + (r * c->steps + s) * c->d, c->d * sizeof(float));
        }
        reference_step(c, q_rows, keys, values, total, c->prompt + s + 1, sinks, ref);
        char what[48];
        snprintf(what, sizeof what, "step %zu (%zu keys)", s, c->prompt + s + 1);
        tu_expect_close(what, got_rows, ref, rows * c->d, tol);
    }
    /* the cache: every key and value appended, as stored (bit for bit: rounded inputs) */
    float *stored = tu_floats(kv_count);
    for (int which = 0; which < 2; ++which) {
        read_cache(ctx, c, cache, which, total, stored);
        const float *want = which ? values : keys;
        size_t bad = 0;
        for (size_t i = 0; i < kv_count; ++i)
            bad += memcmp(&stored[i], &want[i], sizeof(float)) != 0;
        tu_expect(bad == 0, "the cache's %s: %zu of %zu elements differ from the appended ones",
                  which ? "values" : "keys", bad, kv_count);
    }
    clattn_tensor lengths;
    clattn_kv_cache_tensors(cache, NULL, NULL, &lengths);
    int32_t *counts = malloc(c->batch * sizeof *counts);
    clEnqueueReadBuffer(clattn_ctx_queue(ctx), lengths.mem, CL_TRUE, 0,
                        c->batch * sizeof *counts, counts, 0, NULL, NULL);
    for (size_t b = 0; b < c->batch; ++b)
        tu_expect(counts[b] == (int32_t)total, "kv_seqlen[%zu] = %d on the device, not %zu", b,
                  (int)counts[b], total);
    free(counts);
    free(stored);
    free(ref);
    free(q_rows);
    free(got_rows);
    free(got);
done:
    clattn_plan_release(plan);
    clattn_kv_cache_release(cache);
    const cl_mem mems[5] = {k_mem, v_mem, q_mem, out_mem, sinks_mem};
    for (int i = 0; i < 5; ++i)
        tu_release_mem(mems[i]);
    free(keys);
    free(values);
    free(q);
    free(poison);
}

START_TEST(test_decode_step)
{
    TU_BEGIN_TEST();
    const step_case *c = &cases[_i];
    tu_set_case("B=%zu H=%zu Hkv=%zu d=%zu prompt=%zu steps=%zu page=%zu %s softcap=%g "
                "window=%lld sinks=%d",
                c->batch, c->heads, c->kv_heads, c->d, c->prompt, c->steps, c->page_size,
                c->dtype == CLATTN_DTYPE_F16 ? "f16" : "f32", (double)c->softcap, c->window,
                c->sinks);
    cl_command_queue queue = NULL;
    clattn_ctx *ctx = profiling_ctx(&queue);
    if (ctx != NULL) {
        char info[512] = "";
        long launches = 0;
        run_case(ctx, c, info, sizeof info, &launches);
        /* flash_cpu.cl and flash_gpu.cl take the step: one kernel; flash.cl (the portable
         * kernel) the append and the attention */
        const long want = strstr(info, "flash_cpu") || strstr(info, "flash_gpu") ? 1 : 2;
        tu_expect(launches == want, "a step enqueued %ld kernels, not %ld (plan: %s)", launches,
                  want, info);
        clattn_ctx_release(ctx);
    }
    if (queue)
        clReleaseCommandQueue(queue);
    TU_END_TEST();
}
END_TEST

/* What a step refuses: a plan without kv_step, tensors not the cache's, a full cache, new
 * rows of other dims; and the plans kv_step refuses. */
START_TEST(test_refusals)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    const size_t d = 16, capacity = 2;
    clattn_kv_cache_desc cd;
    clattn_kv_cache_desc_init(&cd);
    cd.batch = 1, cd.kv_heads = 1, cd.capacity = capacity, cd.head_dim_qk = d, cd.head_dim_v = d;
    clattn_kv_cache *cache = NULL;
    tu_expect_status(clattn_kv_cache_create(ctx, &cd, &cache), CLATTN_SUCCESS, "cache");
    float *ones = tu_random_floats(4 * d);
    cl_mem mem = tu_upload_floats(ones, 4 * d), mask_mem = tu_upload_floats(ones, 4 * d);
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    clattn_tensors t = {0};
    CLATTN_BIND_ROLES(desc, t);
    desc.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    t.q = clattn_tensor_make(mem, 0, CLATTN_DTYPE_F32, 4, 1, 1, 1, d);
    t.out = clattn_tensor_make(mem, d, CLATTN_DTYPE_F32, 4, 1, 1, 1, d);
    clattn_kv_cache_tensors(cache, &t.k, &t.v, &t.kv_seqlen);
    /* plans: kv_step with a mask, with seq_q 2, without kv_seqlen, with a value of 2 */
    desc.kv_step = 1;
    t.attn_mask = clattn_tensor_make(mask_mem, 0, CLATTN_DTYPE_F32, 2, 1, capacity, 0, 0);
    TU_EXPECT_REFUSED(clattn_sdpa_plan_create, "sdpa", &desc, CLATTN_ERR_UNSUPPORTED, "attn_mask",
                      "kv_step with attn_mask");
    t.attn_mask = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 0, 0, 0, 0, 0);
    clattn_tensor kv_len = t.kv_seqlen;
    t.kv_seqlen = t.attn_mask;
    TU_EXPECT_REFUSED(clattn_sdpa_plan_create, "sdpa", &desc, CLATTN_ERR_UNSUPPORTED, "kv_seqlen",
                      "kv_step without kv_seqlen");
    t.kv_seqlen = kv_len;
    desc.kv_step = 2;
    TU_EXPECT_REFUSED(clattn_sdpa_plan_create, "sdpa", &desc, CLATTN_ERR_INVALID_ARGUMENT,
                      "kv_step", "kv_step = 2");
    /* steps: a plan made without kv_step; then k not the cache's; new rows of 2 keys */
    desc.kv_step = 0;
    clattn_plan *plain = NULL, *plan = NULL;
    tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plain), CLATTN_SUCCESS, "plain plan");
    desc.kv_step = 1;
    tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS, "step plan");
    clattn_tensor row = clattn_tensor_make(mem, 2 * d, CLATTN_DTYPE_F32, 4, 1, 1, 1, d);
    clattn_status got = clattn_kv_cache_decode(cache, plain, &row, &row, t.by_role,
                                               CLATTN_ROLE_COUNT, NULL, 0, NULL, NULL);
    tu_expect(got == CLATTN_ERR_INVALID_ARGUMENT && strstr(clattn_last_error(ctx), "kv_step"),
              "a plan without kv_step: %d %s", (int)got, clattn_last_error(ctx));
    clattn_tensors other = t;
    other.k = clattn_tensor_make(mem, 0, CLATTN_DTYPE_F32, 4, 1, 1, capacity, d);
    got = clattn_kv_cache_decode(cache, plan, &row, &row, other.by_role, CLATTN_ROLE_COUNT, NULL,
                                 0, NULL, NULL);
    tu_expect(got == CLATTN_ERR_INVALID_ARGUMENT && strstr(clattn_last_error(ctx), "k is not"),
              "k not the cache's: %d %s", (int)got, clattn_last_error(ctx));
    clattn_tensor two = clattn_tensor_make(mem, 0, CLATTN_DTYPE_F32, 4, 1, 1, 2, d);
    got = clattn_kv_cache_decode(cache, plan, &two, &two, t.by_role, CLATTN_ROLE_COUNT, NULL, 0,
                                 NULL, NULL);
    tu_expect(got == CLATTN_ERR_INVALID_SHAPE && strstr(clattn_last_error(ctx), "k_new"),
              "two new keys: %d %s", (int)got, clattn_last_error(ctx));
    /* a full cache: the capacity's steps pass, the next is refused and changes nothing */
    for (size_t s = 0; s < capacity; ++s)
        tu_expect_status(clattn_kv_cache_decode(cache, plan, &row, &row, t.by_role,
                                                CLATTN_ROLE_COUNT, NULL, 0, NULL, NULL),
                         CLATTN_SUCCESS, "step");
    got = clattn_kv_cache_decode(cache, plan, &row, &row, t.by_role, CLATTN_ROLE_COUNT, NULL, 0,
                                 NULL, NULL);
    tu_expect(got == CLATTN_ERR_INVALID_SHAPE && strstr(clattn_last_error(ctx), "full") &&
                  clattn_kv_cache_length(cache) == capacity,
              "a full cache's step: %d %s", (int)got, clattn_last_error(ctx));
    clattn_plan_release(plain);
    clattn_plan_release(plan);
    clattn_kv_cache_release(cache);
    tu_release_mem(mem);
    tu_release_mem(mask_mem);
    free(ones);
    TU_END_TEST();
}
END_TEST

static Suite *decode_step_suite(void)
{
    Suite *suite = suite_create("decode_step");
    TCase *tc = tu_tcase(suite, "decode_step", 300);
    /* (CLATTN_TEST_SCALE=small, for simulators: not the 1031-key case) */
    const int count = (int)(sizeof cases / sizeof cases[0]);
    tcase_add_loop_test(tc, test_decode_step, 0, tu_small() ? SMALL_CASES : count);
    tcase_add_test(tc, test_refusals);
    return suite;
}

int main(void)
{
    return tu_main("check_decode_step", decode_step_suite);
}
