/* Fused scale + mask + softmax/relu over score rows: checks and launch for kernels/softmax.cl. */
#include "internal.h"

clattn_status clattn__softmax_enqueue(clattn_ctx *ctx, const clattn_softmax_desc *desc,
                                      clattn_tensor scores, clattn_tensor out, cl_uint num_wait,
                                      const cl_event *wait, cl_event *event)
{
    const clattn_masks *masks = &desc->masks;
    const size_t rows = desc->batch * desc->heads * desc->seq_q; /* checked by the caller */
    const size_t local = ctx->tuning.softmax_wg;
    const size_t global = rows * local;
    const cl_ulong scores_offset = scores.offset, out_offset = out.offset;
    const cl_uint heads = (cl_uint)desc->heads, seq_q = (cl_uint)desc->seq_q;
    const cl_uint seq_k = (cl_uint)desc->seq_k;
    const cl_float scale = desc->scale != 0.0f ? desc->scale : 1.0f;
    const cl_int norm_relu = desc->norm == CLATTN_NORM_RELU;
    const cl_int causal = masks->causal != 0;
    const cl_int has_mask = masks->attn_mask.mem != NULL;
    const cl_int has_key_padding = masks->key_padding_mask.mem != NULL;
    /* Absent masks still need a valid buffer argument; the kernel never reads it. */
    cl_mem mask_mem = has_mask ? masks->attn_mask.mem : scores.mem;
    cl_mem key_padding_mem = has_key_padding ? masks->key_padding_mask.mem : scores.mem;
    const cl_ulong mask_offset = masks->attn_mask.offset;
    const cl_ulong key_padding_offset = masks->key_padding_mask.offset;
    const clattn_arg args[] = {
        CLATTN_ARG(scores.mem),      CLATTN_ARG(scores_offset),   CLATTN_ARG(out.mem),
        CLATTN_ARG(out_offset),      CLATTN_ARG(heads),           CLATTN_ARG(seq_q),
        CLATTN_ARG(seq_k),           CLATTN_ARG(scale),           CLATTN_ARG(norm_relu),
        CLATTN_ARG(causal),          CLATTN_ARG(mask_mem),        CLATTN_ARG(mask_offset),
        CLATTN_ARG(has_mask),        CLATTN_ARG(key_padding_mem), CLATTN_ARG(key_padding_offset),
        CLATTN_ARG(has_key_padding),
    };
    return clattn__launch(ctx, CLATTN_K_SOFTMAX_ROWS, "softmax_rows", args,
                          sizeof args / sizeof args[0], 1, &global, &local, num_wait, wait, event);
}

clattn_status clattn__check_masks(clattn_ctx *ctx, const char *op, const clattn_masks *masks,
                                  size_t batch, size_t seq_q, size_t seq_k)
{
    size_t mask_elems = 0, padding_elems = 0;
    if (!clattn__mul(seq_q, seq_k, &mask_elems) || !clattn__mul(batch, seq_k, &padding_elems))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: mask sizes overflow size_t", op);
    clattn_status status = clattn__check_tensor(ctx, op, "attn_mask", masks->attn_mask, mask_elems,
                                                sizeof(float), false);
    if (status == CLATTN_SUCCESS)
        status = clattn__check_tensor(ctx, op, "key_padding_mask", masks->key_padding_mask,
                                      padding_elems, sizeof(cl_uchar), false);
    return status;
}

clattn_status clattn_softmax_rows(clattn_ctx *ctx, const clattn_softmax_desc *desc,
                                  clattn_tensor scores, clattn_tensor out, cl_uint num_wait,
                                  const cl_event *wait, cl_event *event)
{
    static const char op[] = "softmax_rows";
    clattn_status status = clattn__entry(ctx, op, desc, num_wait, wait, event);
    if (status == CLATTN_SUCCESS)
        status = clattn__check_norm(ctx, op, desc->norm);
    if (status != CLATTN_SUCCESS)
        return status;
    const size_t dims[4] = {desc->batch, desc->heads, desc->seq_q, desc->seq_k};
    static const char *const names[4] = {"batch", "heads", "seq_q", "seq_k"};
    status = clattn__check_dims(ctx, op, dims, names, 4, false);
    if (status != CLATTN_SUCCESS)
        return status;
    size_t elems = 0, rows = 0, global = 0;
    if (!clattn__product(&rows, 3, desc->batch, desc->heads, desc->seq_q) ||
        !clattn__mul(rows, desc->seq_k, &elems) ||
        !clattn__mul(rows, ctx->tuning.softmax_wg, &global))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                            "%s: %zu x %zu x %zu x %zu scores overflow size_t", op, desc->batch,
                            desc->heads, desc->seq_q, desc->seq_k);
    if ((status = clattn__check_dims(ctx, op, dims, names, 4, true)) ||
        (status = clattn__check_tensor(ctx, op, "scores", scores, elems, sizeof(float), true)) ||
        (status = clattn__check_tensor(ctx, op, "out", out, elems, sizeof(float), true)) ||
        (status =
             clattn__check_masks(ctx, op, &desc->masks, desc->batch, desc->seq_q, desc->seq_k)))
        return status;
    clattn_chain chain;
    cl_event step = NULL;
    status = clattn__begin(ctx, op, &chain, num_wait, wait);
    if (status == CLATTN_SUCCESS)
        status = clattn__step(
            &chain, clattn__softmax_enqueue(ctx, desc, scores, out, CHAIN_WAIT(&chain), &step),
            &step);
    return clattn__end(ctx, op, &chain, status, event);
}
