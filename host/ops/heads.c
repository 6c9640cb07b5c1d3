/* kernels/heads.cl's element-wise kernels: attention weights averaged over heads, strided 4-d
 * copies (head split and merge, dtype conversion) and the KV cache's append. */
#include "ops.h"
#include "probe.h" /* self-validation (core/validate.h) */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The families (core/family.h); HEADS_WG: work-items per group (tuning key heads_wg). */
#define MEAN_HEADS_SWITCHES(X) X(HEADS_WG, 0, NULL)
CLATTN_FAMILY(mean_heads, MEAN_HEADS_SWITCHES, .sources = {"heads.cl"}, .tuning_keys = "heads_wg");
/* clang-format off */
#define COPY_SWITCHES(X)                                                                           \
    X(HEADS_WG, 0, NULL) X(SRC_DTYPE, 0, NULL) X(DST_DTYPE, 0, NULL)
/* clang-format on */
CLATTN_FAMILY(copy, COPY_SWITCHES, .sources = {"heads.cl"}, .tuning_keys = "heads_wg");
/* clang-format off */
#define APPEND_SWITCHES(X)                                                                         \
    X(HEADS_WG, 0, NULL) X(K_SRC_DTYPE, 0, NULL) X(V_SRC_DTYPE, 0, NULL) X(DST_DTYPE, 0, NULL)     \
    X(APPEND_PAGED, CLATTN_SWITCH_OPTIONAL, NULL)
/* clang-format on */
CLATTN_FAMILY(append, APPEND_SWITCHES, .sources = {"heads.cl"}, .tuning_keys = "heads_wg");

clattn_status clattn__mean_heads_prepare(clattn_ctx *ctx, size_t batch, size_t heads, size_t seq_q,
                                         size_t seq_k, clattn__mean_heads_plan *plan)
{
    static const char op[] = "mean_heads";
    memset(plan, 0, sizeof *plan);
    plan->batch = batch;
    plan->heads = heads;
    plan->seq_q = seq_q;
    plan->seq_k = seq_k;
    plan->local = ctx->tuning.heads_wg;
    size_t total = 0;
    if (!clattn__product(&total, 3, batch, seq_q, seq_k) ||
        !clattn__round_up(total, plan->local, &plan->global))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: %zu x %zu x %zu weights overflow size_t",
                            op, batch, seq_q, seq_k);
    const mean_heads_switches sw = {.HEADS_WG = ctx->tuning.heads_wg};
    const clattn_status status =
        clattn__family_kernel(ctx, &mean_heads_family, op, &sw, NULL, 0, &plan->kernel);
    /* self-validation (core/validate.h; ops/probe.c) */
    return status != CLATTN_SUCCESS ? status : clattn__mean_heads_trust(ctx, plan);
}

clattn_status clattn__mean_heads_enqueue(clattn_chain *chain, const clattn__mean_heads_plan *plan,
                                         const clattn__view *src, const clattn__view *dst)
{
    const cl_ulong total = (cl_ulong)plan->batch * plan->seq_q * plan->seq_k;
    const cl_ulong src_s[4] = {src->strides[0], src->strides[1], src->strides[2], src->strides[3]};
    const cl_ulong dst_s[3] = {dst->strides[1], dst->strides[2], dst->strides[3]};
    const cl_uint heads = (cl_uint)plan->heads, seq_q = (cl_uint)plan->seq_q;
    const cl_uint seq_k = (cl_uint)plan->seq_k;
    const clattn_arg args[] = {
        CLATTN_ARG(src->mem), CLATTN_ARG(src->offset), CLATTN_ARG(src_s[0]),
        CLATTN_ARG(src_s[1]), CLATTN_ARG(src_s[2]),    CLATTN_ARG(src_s[3]),
        CLATTN_ARG(dst->mem), CLATTN_ARG(dst->offset), CLATTN_ARG(dst_s[0]),
        CLATTN_ARG(dst_s[1]), CLATTN_ARG(dst_s[2]),    CLATTN_ARG(total),
        CLATTN_ARG(heads),    CLATTN_ARG(seq_q),       CLATTN_ARG(seq_k),
    };
    return clattn__launch_kernel(chain, plan->kernel, "mean_heads", args,
                                 sizeof args / sizeof args[0], 1, &plan->global, &plan->local);
}

clattn_status clattn__elementwise_prepare(clattn_ctx *ctx, const size_t dims[4],
                                          const clattn_family *family, const char *name,
                                          const void *values, clattn__elementwise_plan *plan)
{
    size_t total = 0;
    memset(plan, 0, sizeof *plan);
    memcpy(plan->dims, dims, sizeof plan->dims);
    plan->local = ctx->tuning.heads_wg;
    if (!clattn__product(&total, 4, dims[0], dims[1], dims[2], dims[3]) ||
        !clattn__round_up(total, plan->local, &plan->global))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: %zu x %zu x %zu x %zu overflow size_t",
                            name, dims[0], dims[1], dims[2], dims[3]);
    return clattn__family_kernel(ctx, family, name, values, NULL, 0, &plan->kernel);
}

/* copy4d_vec4 where it applies (F32 to F32, rows of whole float4s), its probe passed: a
 * variant that fails its probe is passed over for copy4d (ctx's log names it). */
static clattn_status prepare_vec4(clattn_ctx *ctx, const size_t dims[4], clattn_dtype src_dtype,
                                  clattn_dtype dst_dtype, clattn__copy_plan *plan)
{
    plan->vec4 = NULL;
    if (src_dtype != CLATTN_DTYPE_F32 || dst_dtype != CLATTN_DTYPE_F32 || dims[3] % 4 != 0)
        return CLATTN_SUCCESS;
    /* a work-item per float4: the box's elements (checked by copy4d's prepare) over 4 */
    const size_t quads = dims[0] * dims[1] * dims[2] * (dims[3] / 4);
    if (!clattn__round_up(quads, plan->local, &plan->vec4_global))
        return CLATTN_SUCCESS; /* (copy4d takes it) */
    const copy_switches sw = {
        .HEADS_WG = ctx->tuning.heads_wg, .SRC_DTYPE = src_dtype, .DST_DTYPE = dst_dtype};
    cl_kernel kernel = NULL;
    clattn_status status =
        clattn__family_kernel(ctx, &copy_family, "copy4d_vec4", &sw, NULL, 0, &kernel);
    if (status != CLATTN_SUCCESS)
        return status;
    plan->vec4 = kernel;
    char message[sizeof ctx->message];
    memcpy(message, ctx->message, sizeof message);
    status = clattn__copy_trust(ctx, plan, src_dtype, dst_dtype);
    if (status == CLATTN_ERR_UNTRUSTED) {
        plan->vec4 = NULL;
        memcpy(ctx->message, message, sizeof message);
        return CLATTN_SUCCESS;
    }
    return status;
}

clattn_status clattn__copy_prepare(clattn_ctx *ctx, const size_t dims[4], clattn_dtype src_dtype,
                                   clattn_dtype dst_dtype, clattn__copy_plan *plan)
{
    const copy_switches sw = {
        .HEADS_WG = ctx->tuning.heads_wg, .SRC_DTYPE = src_dtype, .DST_DTYPE = dst_dtype};
    /* A block destination: one work-item per block of the last dimension. */
    size_t block = 1, bytes = 0;
    clattn__dtype_blocks(dst_dtype, &block, &bytes);
    const size_t box[4] = {dims[0], dims[1], dims[2], dims[3] / block};
    clattn_status status = clattn__elementwise_prepare(ctx, box, &copy_family, "copy4d", &sw, plan);
    /* self-validation (core/validate.h; ops/probe.c) */
    if (status == CLATTN_SUCCESS)
        status = clattn__copy_trust(ctx, plan, src_dtype, dst_dtype);
    return status != CLATTN_SUCCESS ? status : prepare_vec4(ctx, dims, src_dtype, dst_dtype, plan);
}

static clattn_status copy_vec4(clattn_chain *chain, const clattn__copy_plan *plan,
                               const clattn__view *src, const clattn__view *dst)
{
    const cl_ulong total =
        (cl_ulong)plan->dims[0] * plan->dims[1] * plan->dims[2] * plan->dims[3] / 4;
    const cl_ulong src_s[3] = {src->strides[0], src->strides[1], src->strides[2]};
    const cl_ulong dst_s[3] = {dst->strides[0], dst->strides[1], dst->strides[2]};
    const cl_uint d1 = (cl_uint)plan->dims[1], d2 = (cl_uint)plan->dims[2];
    const cl_uint d3 = (cl_uint)plan->dims[3] / 4;
    const clattn_arg args[] = {
        CLATTN_ARG(src->mem),    CLATTN_ARG(src->offset), CLATTN_ARG(src_s[0]),
        CLATTN_ARG(src_s[1]),    CLATTN_ARG(src_s[2]),    CLATTN_ARG(dst->mem),
        CLATTN_ARG(dst->offset), CLATTN_ARG(dst_s[0]),    CLATTN_ARG(dst_s[1]),
        CLATTN_ARG(dst_s[2]),    CLATTN_ARG(total),       CLATTN_ARG(d1),
        CLATTN_ARG(d2),          CLATTN_ARG(d3),
    };
    return clattn__launch_kernel(chain, plan->vec4, "copy4d_vec4", args,
                                 sizeof args / sizeof args[0], 1, &plan->vec4_global, &plan->local);
}

/* copy4d into FP8 (heads.cl's struct variant): dst = encode(src * inv_scale). */
clattn_status clattn__copy_enqueue_fp8(clattn_chain *chain, const clattn__copy_plan *plan,
                                       const clattn__view *src, const clattn__view *dst,
                                       float inv_scale)
{
    clattn_copy_fp8_params params = {0};
    CLATTN__VIEW_FIELDS(src, params, src);
    CLATTN__VIEW_FIELDS(dst, params, dst);
    params.total = (cl_ulong)plan->dims[0] * plan->dims[1] * plan->dims[2] * plan->dims[3];
    params.d1 = (cl_uint)plan->dims[1];
    params.d2 = (cl_uint)plan->dims[2];
    params.d3 = (cl_uint)plan->dims[3];
    params.inv_scale = inv_scale;
    const clattn_arg args[] = {CLATTN_ARG(src->mem), CLATTN_ARG(dst->mem), CLATTN_ARG(params)};
    return clattn__launch_kernel(chain, plan->kernel, "copy4d", args, sizeof args / sizeof args[0],
                                 1, &plan->global, &plan->local);
}

clattn_status clattn__copy_enqueue(clattn_chain *chain, const clattn__copy_plan *plan,
                                   const clattn__view *src, const clattn__view *dst)
{
    if ((1u << dst->dtype) & CLATTN__FP8)
        return clattn__copy_enqueue_fp8(chain, plan, src, dst, 1.0f);
    if (plan->vec4 && src->strides[3] == 1 && dst->strides[3] == 1)
        return copy_vec4(chain, plan, src, dst);
    const cl_ulong total = (cl_ulong)plan->dims[0] * plan->dims[1] * plan->dims[2] * plan->dims[3];
    const cl_ulong src_s[4] = {src->strides[0], src->strides[1], src->strides[2], src->strides[3]};
    const cl_ulong dst_s[4] = {dst->strides[0], dst->strides[1], dst->strides[2], dst->strides[3]};
    const cl_uint d1 = (cl_uint)plan->dims[1], d2 = (cl_uint)plan->dims[2];
    const cl_uint d3 = (cl_uint)plan->dims[3];
    const clattn_arg args[] = {
        CLATTN_ARG(src->mem), CLATTN_ARG(src->offset), CLATTN_ARG(src_s[0]),
        CLATTN_ARG(src_s[1]), CLATTN_ARG(src_s[2]),    CLATTN_ARG(src_s[3]),
        CLATTN_ARG(dst->mem), CLATTN_ARG(dst->offset), CLATTN_ARG(dst_s[0]),
        CLATTN_ARG(dst_s[1]), CLATTN_ARG(dst_s[2]),    CLATTN_ARG(dst_s[3]),
        CLATTN_ARG(total),    CLATTN_ARG(d1),          CLATTN_ARG(d2),
        CLATTN_ARG(d3),
    };
    return clattn__launch_kernel(chain, plan->kernel, "copy4d", args, sizeof args / sizeof args[0],
                                 1, &plan->global, &plan->local);
}

clattn_status clattn__append_prepare(clattn_ctx *ctx, size_t batch, size_t kv_heads, size_t n,
                                     size_t dk, size_t dv, clattn_dtype k_dtype,
                                     clattn_dtype v_dtype, clattn_dtype cache_dtype,
                                     size_t page_size, clattn__append_plan *plan)
{
    static const char op[] = "kv_append";
    memset(plan, 0, sizeof *plan);
    /* A block cache: one work-item per block of a row. */
    size_t block = 1, bytes = 0;
    clattn__dtype_blocks(cache_dtype, &block, &bytes);
    dk /= block, dv /= block;
    plan->batch = batch, plan->kv_heads = kv_heads, plan->n = n, plan->dk = dk, plan->dv = dv;
    plan->local = ctx->tuning.heads_wg;
    size_t most = 0;
    if (!clattn__product(&most, 4, batch, kv_heads, n, dk > dv ? dk : dv) ||
        !clattn__round_up(most > batch ? most : batch, plan->local, &plan->global[0]))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: %zu x %zu x %zu x %zu overflow size_t",
                            op, batch, kv_heads, n, dk > dv ? dk : dv);
    plan->global[1] = 2;
    const append_switches sw = {.HEADS_WG = ctx->tuning.heads_wg,
                                .K_SRC_DTYPE = k_dtype,
                                .V_SRC_DTYPE = v_dtype,
                                .DST_DTYPE = cache_dtype,
                                .APPEND_PAGED = page_size > 0};
    return clattn__family_kernel(ctx, &append_family, op, &sw, NULL, 0, &plan->kernel);
}

clattn_status clattn__append_enqueue(clattn_chain *chain, const clattn__append_plan *plan,
                                     const clattn__view *k, const clattn__view *v,
                                     const clattn__view *k_dst, const clattn__view *v_dst,
                                     cl_mem lengths, size_t length,
                                     const clattn__append_pages *pages)
{
    clattn_append_params params = {0};
    CLATTN__VIEW_FIELDS(k, params, ks);
    CLATTN__VIEW_FIELDS(v, params, vs);
    CLATTN__VIEW_FIELDS(k_dst, params, kd);
    CLATTN__VIEW_FIELDS(v_dst, params, vd);
    params.d0 = (cl_uint)plan->batch;
    params.d1 = (cl_uint)plan->kv_heads;
    params.d2 = (cl_uint)plan->n;
    params.k_d3 = (cl_uint)plan->dk;
    params.v_d3 = (cl_uint)plan->dv;
    params.length = (cl_int)length;
    /* Paged: the table's row stride, the page size and count, the first new key. */
    cl_mem table = pages->table ? pages->table : lengths; /* not read when contiguous */
    params.bt_s0 = pages->blocks;
    params.page_size = (cl_uint)pages->page_size;
    params.num_pages = (cl_uint)pages->num_pages;
    params.start = (cl_uint)pages->start;
    params.k_inv_scale = plan->k_scale > 0.0f ? 1.0f / plan->k_scale : 1.0f; /* FP8 caches */
    params.v_inv_scale = plan->v_scale > 0.0f ? 1.0f / plan->v_scale : 1.0f;
    const size_t local[2] = {plan->local, 1};
    const clattn_arg args[] = {CLATTN_ARG(k->mem),     CLATTN_ARG(v->mem),  CLATTN_ARG(k_dst->mem),
                               CLATTN_ARG(v_dst->mem), CLATTN_ARG(lengths), CLATTN_ARG(table),
                               CLATTN_ARG(params)};
    return clattn__launch_kernel(chain, plan->kernel, "kv_append", args,
                                 sizeof args / sizeof args[0], 2, plan->global, local);
}

/* ---- strided copies and the mean over heads (heads.cl) ------------------------------------- */

/* copy4d over a (2, 3, 5, 7) box (block destinations: unprobed) from a packed source into a
 * destination with a row gap, converting dtypes; copy4d_vec4 (the unit's plan has it) over
 * (2, 3, 5, 8). */
static clattn_status copy_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const struct copy_unit {
        clattn__copy_plan *plan;
        clattn_dtype src, dst;
    } *u = unit;
    size_t block = 1, bytes = 0, src_block = 1;
    clattn__dtype_blocks(u->src, &src_block, &bytes);
    const bool fp8 = ((1u << u->dst) | (1u << u->src)) & CLATTN__FP8; /* tests/check_fp8.c */
    if ((clattn__dtype_blocks(u->dst, &block, &bytes) && block > 1) || src_block > 1 || fp8) {
        r->checked = false;
        snprintf(r->why, sizeof r->why, "blocks or FP8 (a quantizing or dequantizing copy)");
        return CLATTN_SUCCESS;
    }
    const size_t cols = u->plan->vec4 ? 8 : 7, gap = 3;
    const size_t dims[4] = {2, 3, 5, cols}, n = 2 * 3 * 5 * cols;
    clattn__copy_plan run;
    clattn_status status = clattn__copy_prepare(ctx, dims, u->src, u->dst, &run);
    if (status != CLATTN_SUCCESS)
        return status;
    run.kernel = u->plan->kernel;
    run.vec4 = u->plan->vec4;
    clattn__probe_rng rng = {0xc0ffeeULL};
    clattn__probe_mem pm = {.count = 0};
    const size_t padded = 2 * 3 * 5 * (cols + gap);
    double *x = clattn__probe_alloc(&pm, padded * sizeof(double)),
           *want = clattn__probe_alloc(&pm, padded * sizeof(double));
    unsigned char *host = clattn__probe_alloc(&pm, 4 * padded + 8);
    cl_mem src = NULL, dst = NULL;
    if (!x || !want || !host) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    for (size_t i = 0; i < n; ++i)
        x[i] = clattn__probe_grid(&rng, u->src);
    clattn__probe_encode(u->src, x, n, host);
    if ((status = clattn__probe_upload(ctx, &pm, host, clattn__probe_bytes(u->src, n), &src)) ||
        (status = clattn__probe_upload(ctx, &pm, NULL, clattn__probe_bytes(u->dst, padded), &dst)))
        goto done;
    const clattn__view vs = clattn__probe_view(src, u->src, 2, 3, 5, cols);
    clattn__view vd = clattn__probe_view(dst, u->dst, 2, 3, 5, cols + gap);
    vd.dims[3] = cols;
    clattn_chain chain = clattn__probe_chain(ctx);
    status = clattn__copy_enqueue(&chain, &run, &vs, &vd);
    if (status == CLATTN_SUCCESS)
        status = clattn__probe_download(&chain, dst, clattn__probe_bytes(u->dst, padded), host);
    clattn__chain_push(&chain, NULL);
    if (status == CLATTN_SUCCESS) {
        size_t worst = 0;
        r->tolerance = clattn__probe_tolerance(u->dst);
        r->max_error = 0.0;
        for (size_t row = 0; row < 30; ++row)
            for (size_t c = 0; c < cols; ++c) {
                const double g = clattn__probe_decode(u->dst, host, row * (cols + gap) + c);
                const double e = isnan(g) ? INFINITY : fabs(g - x[row * cols + c]);
                if (e > r->max_error) {
                    r->max_error = e;
                    worst = row * cols + c;
                }
            }
        snprintf(r->why, sizeof r->why, "element %zu of (2, 3, 5, %zu)", worst, cols);
    }
done:
    clattn__probe_release(&pm);
    return status;
}

clattn_status clattn__copy_trust(clattn_ctx *ctx, clattn__copy_plan *plan, clattn_dtype src,
                                 clattn_dtype dst)
{
    struct copy_unit {
        clattn__copy_plan *plan;
        clattn_dtype src, dst;
    } unit = {plan, src, dst};
    return clattn__trust_one(ctx, "strided copy", plan->vec4 ? &plan->vec4 : &plan->kernel,
                             copy_probe, &unit);
}

/* mean_heads over (2, 3, 7, 11) weights into (1, 2, 7, 11). */
static clattn_status mean_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const clattn__mean_heads_plan *prepared = unit;
    clattn__mean_heads_plan run;
    clattn_status status = clattn__mean_heads_prepare(ctx, 2, 3, 7, 11, &run);
    if (status != CLATTN_SUCCESS)
        return status;
    run.kernel = prepared->kernel;
    const size_t n = 2 * 3 * 7 * 11, m = 2 * 7 * 11;
    clattn__probe_rng rng = {0x3ea11ULL};
    clattn__probe_mem pm = {.count = 0};
    float *x = clattn__probe_alloc(&pm, n * sizeof(float)),
          *got = clattn__probe_alloc(&pm, m * sizeof(float));
    double *want = clattn__probe_alloc(&pm, m * sizeof(double));
    cl_mem src = NULL, dst = NULL;
    if (!x || !got || !want) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    for (size_t i = 0; i < n; ++i)
        x[i] = (float)clattn__probe_grid(&rng, CLATTN_DTYPE_F32);
    for (size_t b = 0; b < 2; ++b)
        for (size_t h = 0; h < 3; ++h)
            for (size_t e = 0; e < 77; ++e)
                want[b * 77 + e] += x[(b * 3 + h) * 77 + e] / 3.0;
    if ((status = clattn__probe_upload(ctx, &pm, x, n * sizeof(float), &src)) ||
        (status = clattn__probe_upload(ctx, &pm, NULL, m * sizeof(float), &dst)))
        goto done;
    const clattn__view vs = clattn__probe_view(src, CLATTN_DTYPE_F32, 2, 3, 7, 11);
    const clattn__view vd = clattn__probe_view(dst, CLATTN_DTYPE_F32, 1, 2, 7, 11);
    clattn_chain chain = clattn__probe_chain(ctx);
    status = clattn__mean_heads_enqueue(&chain, &run, &vs, &vd);
    if (status == CLATTN_SUCCESS)
        status = clattn__probe_download(&chain, dst, m * sizeof(float), got);
    clattn__chain_push(&chain, NULL);
    if (status == CLATTN_SUCCESS) {
        size_t where = 0;
        r->tolerance = 1e-6;
        r->max_error =
            clattn__probe_max_error(CLATTN_DTYPE_F32, (const unsigned char *)got, want, m, &where);
        snprintf(r->why, sizeof r->why, "mean %zu of (1, 2, 7, 11)", where);
    }
done:
    clattn__probe_release(&pm);
    return status;
}

clattn_status clattn__mean_heads_trust(clattn_ctx *ctx, clattn__mean_heads_plan *plan)
{
    return clattn__trust_one(ctx, "mean over heads", &plan->kernel, mean_probe, plan);
}
