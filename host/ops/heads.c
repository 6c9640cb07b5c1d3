/* Attention weights averaged over heads: variant and launch for kernels/heads.cl. */
#include "ops.h"

#include <stdio.h>
#include <string.h>

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
    char extra[32];
    snprintf(extra, sizeof extra, "-DHEADS_WG=%u", ctx->tuning.heads_wg);
    const clattn_status status =
        clattn__variant_kernel(ctx, CLATTN_SRC_HEADS, op, extra, &plan->kernel);
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
                                          clattn_source source, const char *name,
                                          const char *extra, clattn__elementwise_plan *plan)
{
    size_t total = 0;
    memset(plan, 0, sizeof *plan);
    memcpy(plan->dims, dims, sizeof plan->dims);
    plan->local = ctx->tuning.heads_wg;
    if (!clattn__product(&total, 4, dims[0], dims[1], dims[2], dims[3]) ||
        !clattn__round_up(total, plan->local, &plan->global))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: %zu x %zu x %zu x %zu overflow size_t",
                            name, dims[0], dims[1], dims[2], dims[3]);
    return clattn__variant_kernel(ctx, source, name, extra, &plan->kernel);
}

clattn_status clattn__copy_prepare(clattn_ctx *ctx, const size_t dims[4], clattn_dtype src_dtype,
                                   clattn_dtype dst_dtype, clattn__copy_plan *plan)
{
    char extra[64];
    snprintf(extra, sizeof extra, "-DHEADS_WG=%u -DSRC_DTYPE=%d -DDST_DTYPE=%d",
             ctx->tuning.heads_wg, (int)src_dtype, (int)dst_dtype);
    /* A block destination: one work-item per block of the last dimension. */
    size_t block = 1, bytes = 0;
    clattn__dtype_blocks(dst_dtype, &block, &bytes);
    const size_t box[4] = {dims[0], dims[1], dims[2], dims[3] / block};
    const clattn_status status =
        clattn__elementwise_prepare(ctx, box, CLATTN_SRC_HEADS, "copy4d", extra, plan);
    /* self-validation (core/validate.h; ops/probe.c) */
    return status != CLATTN_SUCCESS ? status : clattn__copy_trust(ctx, plan, src_dtype, dst_dtype);
}

clattn_status clattn__copy_enqueue(clattn_chain *chain, const clattn__copy_plan *plan,
                                   const clattn__view *src, const clattn__view *dst)
{
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
    return clattn__launch_kernel(chain, plan->kernel, "copy4d", args, sizeof args / sizeof args[0], 1,
                                 &plan->global, &plan->local);
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
    char extra[128];
    snprintf(extra, sizeof extra,
             "-DHEADS_WG=%u -DK_SRC_DTYPE=%d -DV_SRC_DTYPE=%d -DDST_DTYPE=%d%s",
             ctx->tuning.heads_wg, (int)k_dtype, (int)v_dtype, (int)cache_dtype,
             page_size > 0 ? " -DAPPEND_PAGED=1" : "");
    return clattn__variant_kernel(ctx, CLATTN_SRC_HEADS, op, extra, &plan->kernel);
}

clattn_status clattn__append_enqueue(clattn_chain *chain, const clattn__append_plan *plan,
                                     const clattn__view *k, const clattn__view *v,
                                     const clattn__view *k_dst, const clattn__view *v_dst,
                                     cl_mem lengths, size_t length,
                                     const clattn__append_pages *pages)
{
    clattn_append_params params = {0};
    clattn__view_fields(k, &params.ks_offset, &params.ks_s0, &params.ks_s1, &params.ks_s2,
                        &params.ks_s3);
    clattn__view_fields(v, &params.vs_offset, &params.vs_s0, &params.vs_s1, &params.vs_s2,
                        &params.vs_s3);
    clattn__view_fields(k_dst, &params.kd_offset, &params.kd_s0, &params.kd_s1, &params.kd_s2,
                        &params.kd_s3);
    clattn__view_fields(v_dst, &params.vd_offset, &params.vd_s0, &params.vd_s1, &params.vd_s2,
                        &params.vd_s3);
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
    const size_t local[2] = {plan->local, 1};
    const clattn_arg args[] = {CLATTN_ARG(k->mem),     CLATTN_ARG(v->mem),    CLATTN_ARG(k_dst->mem),
                               CLATTN_ARG(v_dst->mem), CLATTN_ARG(lengths),   CLATTN_ARG(table),
                               CLATTN_ARG(params)};
    return clattn__launch_kernel(chain, plan->kernel, "kv_append", args,
                                 sizeof args / sizeof args[0], 2, plan->global, local);
}
