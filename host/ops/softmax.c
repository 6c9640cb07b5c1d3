/* The score rule and normalisation over rows of raw scores: variant and launch for
 * kernels/softmax.cl. */
#include "ops.h"

#include <stdio.h>
#include <string.h>

/* score_copy (the scores output) from the program of `extra`. */
static clattn_status prepare_copy(clattn_ctx *ctx, const clattn__score_shape *score,
                                  clattn__softmax_plan *plan, const char *extra)
{
    static const char op[] = "score_copy";
    /* score_copy: the same program; groups of up to 64 work-items. */
    size_t elements = 0;
    if (!clattn__mul(plan->rows, score->seq_k, &elements))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: the scores overflow size_t", op);
    plan->copy_local = ctx->info.max_work_group_size < 64 ? ctx->info.max_work_group_size : 64;
    if (!clattn__round_up(elements, plan->copy_local, &plan->copy_global))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: the scores overflow size_t", op);
    return clattn__variant_kernel(ctx, CLATTN_SRC_SOFTMAX, "score_copy", extra, &plan->copy);
}

clattn_status clattn__softmax_prepare(clattn_ctx *ctx, const clattn__score_shape *score,
                                      clattn__softmax_plan *plan)
{
    static const char op[] = "softmax_rows";
    memset(plan, 0, sizeof *plan);
    plan->score = *score;
    if (!clattn__product(&plan->rows, 3, score->batch, score->heads, score->seq_q))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: %zu x %zu x %zu rows overflow size_t",
                            op, score->batch, score->heads, score->seq_q);
    if (score->has_mask && (unsigned)score->mask_dtype > CLATTN_DTYPE_U8)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: mask dtype %d is unknown", op,
                            (int)score->mask_dtype);
    const int mask_dtype = score->has_mask ? (int)score->mask_dtype : 0;
    /* One variant per mask dtype (none shares F32's); the rest are kernel arguments. */
    char extra[96];
    if (score->softmax_f64) {
        if (!ctx->info.has_fp64)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: softmax_f64: the device has no double precision "
                                "(cl_khr_fp64); normalise in float instead",
                                op);
        /* A work-item per row (softmax.cl says why), groups of up to 64. */
        plan->local = ctx->info.max_work_group_size < 64 ? ctx->info.max_work_group_size : 64;
        if (!clattn__round_up(plan->rows, plan->local, &plan->global))
            return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: %zu rows overflow size_t", op,
                                plan->rows);
        snprintf(extra, sizeof extra, "-DSOFTMAX_WG=%u -DMASK_DTYPE=%d -DSOFTMAX_F64=1",
                 ctx->tuning.softmax_wg, mask_dtype);
        clattn_status status = clattn__variant_kernel(ctx, CLATTN_SRC_SOFTMAX, "softmax_rows_f64",
                                                      extra, &plan->kernel);
        if (status != CLATTN_SUCCESS || !score->want_scores)
            return status;
        return prepare_copy(ctx, score, plan, extra);
    }
    if (ctx->tuning.softmax_rows > 0) {
        /* A work-item per row: smaller groups while there are too few of them to keep two
         * threads per compute unit busy (each group size is its own build). */
        size_t local = ctx->tuning.softmax_rows;
        while (local > 1 && plan->rows / local < 2 * (size_t)ctx->info.compute_units)
            local /= 2;
        plan->local = local;
        plan->global = (plan->rows + local - 1) / local * local;
        if (plan->global < plan->rows)
            return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: %zu rows overflow size_t", op,
                                plan->rows);
        snprintf(extra, sizeof extra, "-DSOFTMAX_VEC=1 -DSOFTMAX_ROWS=%zu -DMASK_DTYPE=%d", local,
                 mask_dtype);
    } else {
        plan->local = ctx->tuning.softmax_wg;
        if (!clattn__mul(plan->rows, plan->local, &plan->global))
            return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                                "%s: %zu x %zu x %zu rows overflow size_t", op, score->batch,
                                score->heads, score->seq_q);
        snprintf(extra, sizeof extra, "-DSOFTMAX_WG=%u -DMASK_DTYPE=%d", ctx->tuning.softmax_wg,
                 mask_dtype);
    }
    clattn_status status =
        clattn__variant_kernel(ctx, CLATTN_SRC_SOFTMAX, op, extra, &plan->kernel);
    if (status != CLATTN_SUCCESS || !score->want_scores)
        return status;
    return prepare_copy(ctx, score, plan, extra);
}

clattn_status clattn__score_copy_enqueue(clattn_ctx *ctx, const clattn__softmax_plan *plan,
                                         const clattn__view *raw, const clattn__view *dst,
                                         const clattn__score_masks *masks, cl_uint num_wait,
                                         const cl_event *wait, cl_event *event)
{
    const clattn__score_shape *score = &plan->score;
    const cl_int has_mask = score->has_mask, has_key_padding = score->has_key_padding;
    const clattn__view *mask = has_mask ? &masks->mask : raw;
    const clattn__view *padding = has_key_padding ? &masks->key_padding : raw;
    const cl_ulong raw_s[3] = {raw->strides[0], raw->strides[1], raw->strides[2]};
    const cl_ulong dst_s[4] = {dst->strides[0], dst->strides[1], dst->strides[2], dst->strides[3]};
    const cl_ulong mask_s[4] = {has_mask ? mask->strides[0] : 0, has_mask ? mask->strides[1] : 0,
                                has_mask ? mask->strides[2] : 0, has_mask ? mask->strides[3] : 0};
    const cl_ulong padding_s[2] = {has_key_padding ? padding->strides[2] : 0,
                                   has_key_padding ? padding->strides[3] : 0};
    const cl_uint heads = (cl_uint)score->heads, seq_q = (cl_uint)score->seq_q;
    const cl_uint seq_k = (cl_uint)score->seq_k;
    const cl_float scale = score->scale, softcap = score->softcap;
    const cl_int mode = score->scores_mode;
    const cl_ulong total = (cl_ulong)plan->rows * score->seq_k;
    clattn__band_args band;
    clattn__band_fill(score, masks, raw->mem, &band);
    clattn_arg args[48] = {
        CLATTN_ARG(raw->mem),
        CLATTN_ARG(raw->offset),
        CLATTN_ARG(raw_s[0]),
        CLATTN_ARG(raw_s[1]),
        CLATTN_ARG(raw_s[2]),
        CLATTN_ARG(dst->mem),
        CLATTN_ARG(dst->offset),
        CLATTN_ARG(dst_s[0]),
        CLATTN_ARG(dst_s[1]),
        CLATTN_ARG(dst_s[2]),
        CLATTN_ARG(dst_s[3]),
        CLATTN_ARG(mask->mem),
        CLATTN_ARG(mask->offset),
        CLATTN_ARG(mask_s[0]),
        CLATTN_ARG(mask_s[1]),
        CLATTN_ARG(mask_s[2]),
        CLATTN_ARG(mask_s[3]),
        CLATTN_ARG(has_mask),
        CLATTN_ARG(padding->mem),
        CLATTN_ARG(padding->offset),
        CLATTN_ARG(padding_s[0]),
        CLATTN_ARG(padding_s[1]),
        CLATTN_ARG(has_key_padding),
        CLATTN_ARG(heads),
        CLATTN_ARG(seq_q),
        CLATTN_ARG(seq_k),
        CLATTN_ARG(scale),
        CLATTN_ARG(softcap),
        CLATTN_ARG(mode),
        CLATTN_ARG(total),
    };
    cl_uint n = 30;
    clattn__band_add(&band, args, &n);
    return clattn__launch_kernel(ctx, plan->copy, "score_copy", args, n, 1, &plan->copy_global,
                                 &plan->copy_local, num_wait, wait, event);
}

clattn_status clattn__softmax_enqueue(clattn_ctx *ctx, const clattn__softmax_plan *plan,
                                      const clattn__view *raw, const clattn__view *out,
                                      const clattn__score_masks *masks, cl_uint num_wait,
                                      const cl_event *wait, cl_event *event)
{
    const clattn__score_shape *score = &plan->score;
    const cl_int has_mask = score->has_mask, has_key_padding = score->has_key_padding;
    /* Absent masks still need a valid buffer argument; the kernel never reads it. */
    const clattn__view *mask = has_mask ? &masks->mask : raw;
    const clattn__view *padding = has_key_padding ? &masks->key_padding : raw;
    const cl_ulong raw_s[3] = {raw->strides[0], raw->strides[1], raw->strides[2]};
    const cl_ulong out_s[3] = {out->strides[0], out->strides[1], out->strides[2]};
    const cl_ulong mask_s[4] = {has_mask ? mask->strides[0] : 0, has_mask ? mask->strides[1] : 0,
                                has_mask ? mask->strides[2] : 0, has_mask ? mask->strides[3] : 0};
    const cl_ulong padding_s[2] = {has_key_padding ? padding->strides[2] : 0,
                                   has_key_padding ? padding->strides[3] : 0};
    const cl_uint heads = (cl_uint)score->heads, seq_q = (cl_uint)score->seq_q;
    const cl_uint seq_k = (cl_uint)score->seq_k;
    const cl_float scale = score->scale, softcap = score->softcap;
    const cl_int norm_relu = score->norm == CLATTN_NORM_RELU;
    const cl_ulong rows = plan->rows;
    clattn__band_args band;
    clattn__band_fill(score, masks, raw->mem, &band);
    clattn_arg args[48] = {
        CLATTN_ARG(raw->mem),        CLATTN_ARG(raw->offset),
        CLATTN_ARG(raw_s[0]),        CLATTN_ARG(raw_s[1]),
        CLATTN_ARG(raw_s[2]),        CLATTN_ARG(out->mem),
        CLATTN_ARG(out->offset),     CLATTN_ARG(out_s[0]),
        CLATTN_ARG(out_s[1]),        CLATTN_ARG(out_s[2]),
        CLATTN_ARG(mask->mem),       CLATTN_ARG(mask->offset),
        CLATTN_ARG(mask_s[0]),       CLATTN_ARG(mask_s[1]),
        CLATTN_ARG(mask_s[2]),       CLATTN_ARG(mask_s[3]),
        CLATTN_ARG(has_mask),        CLATTN_ARG(padding->mem),
        CLATTN_ARG(padding->offset), CLATTN_ARG(padding_s[0]),
        CLATTN_ARG(padding_s[1]),    CLATTN_ARG(has_key_padding),
        CLATTN_ARG(heads),           CLATTN_ARG(seq_q),
        CLATTN_ARG(seq_k),           CLATTN_ARG(scale),
        CLATTN_ARG(norm_relu),       CLATTN_ARG(rows),
        CLATTN_ARG(softcap),
    };
    cl_uint n = 29;
    clattn__band_add(&band, args, &n);
    return clattn__launch_kernel(ctx, plan->kernel, "softmax_rows", args, n, 1, &plan->global,
                                 &plan->local, num_wait, wait, event);
}
