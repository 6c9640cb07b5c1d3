/* Host-pointer API: stages float arrays in the context's workspace, runs the device path,
 * reads the results back. Synchronous. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

/* Uploads `elems` elements of `elem_size` bytes from `src` into workspace `slot` at element
 * offset `offset` (the slot must already be large enough) and returns the tensor. */
static clattn_status upload(clattn_ctx *ctx, const char *op, clattn_ws_slot slot, size_t offset,
                            const void *src, size_t elems, size_t elem_size, clattn_tensor *out)
{
    clattn_status status = CLATTN_SUCCESS;
    out->mem = ctx->workspace[slot];
    out->offset = offset;
    char what[64];
    snprintf(what, sizeof what, "%s: clEnqueueWriteBuffer", op);
    CL_CHECK(ctx,
             clattn__fault(CLATTN_FAULT_ENQUEUE)
                 ? CL_OUT_OF_RESOURCES
                 : clEnqueueWriteBuffer(ctx->queue, out->mem, CL_TRUE, offset * elem_size,
                                        elems * elem_size, src, 0, NULL, NULL),
             what);
done:
    return status;
}

static clattn_status download(clattn_ctx *ctx, const char *op, clattn_tensor src, void *dst,
                              size_t elems, cl_event after)
{
    clattn_status status = CLATTN_SUCCESS;
    char what[64];
    snprintf(what, sizeof what, "%s: clEnqueueReadBuffer", op);
    CL_CHECK(ctx,
             clattn__fault(CLATTN_FAULT_ENQUEUE)
                 ? CL_OUT_OF_RESOURCES
                 : clEnqueueReadBuffer(ctx->queue, src.mem, CL_TRUE, src.offset * sizeof(float),
                                       elems * sizeof(float), dst, after ? 1 : 0,
                                       after ? &after : NULL, NULL),
             what);
done:
    return status;
}

/* Ensures slot holds `elems` elements of `elem_size` bytes. */
static clattn_status reserve(clattn_ctx *ctx, const char *op, clattn_ws_slot slot, size_t elems,
                             size_t elem_size)
{
    size_t bytes = 0;
    cl_mem unused = NULL;
    if (!clattn__mul(elems, elem_size, &bytes))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: staging size overflows size_t", op);
    return clattn__workspace(ctx, op, slot, bytes, &unused);
}

static clattn_status stage_masks(clattn_ctx *ctx, const char *op, const clattn_host_masks *hm,
                                 size_t mask_elems, size_t padding_elems, clattn_masks *masks)
{
    clattn_status status = CLATTN_SUCCESS;
    const int causal = masks->causal; /* from the desc: either place may ask for it */
    memset(masks, 0, sizeof *masks);
    masks->causal = causal;
    if (hm == NULL)
        return CLATTN_SUCCESS;
    masks->causal = causal || hm->causal;
    if (hm->attn_mask &&
        ((status = reserve(ctx, op, CLATTN_WS_HOST_MASK, mask_elems, sizeof(float))) ||
         (status = upload(ctx, op, CLATTN_WS_HOST_MASK, 0, hm->attn_mask, mask_elems, sizeof(float),
                          &masks->attn_mask))))
        return status;
    if (hm->key_padding_mask &&
        ((status = reserve(ctx, op, CLATTN_WS_HOST_KPM, padding_elems, 1)) ||
         (status = upload(ctx, op, CLATTN_WS_HOST_KPM, 0, hm->key_padding_mask, padding_elems, 1,
                          &masks->key_padding_mask))))
        return status;
    return CLATTN_SUCCESS;
}

clattn_status clattn_attention_host(clattn_ctx *ctx, const clattn_attention_desc *desc,
                                    const float *q, const float *k, const float *v,
                                    const clattn_host_masks *masks, float *out, float *weights)
{
    static const char op[] = "attention";
    if (ctx == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    clattn__clear_error(ctx);
    if (desc == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: desc is NULL", op);
    const char *missing = !q ? "q" : !k ? "k" : !v ? "v" : !out ? "out" : NULL;
    if (missing)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, missing);
    clattn_attention_sizes sizes;
    clattn_status status = clattn__attention_shapes(ctx, desc, &sizes);
    if (status != CLATTN_SUCCESS)
        return status;

    clattn_attention_desc device_desc = *desc;
    clattn_tensor tq, tk, tv, tout = {0}, tweights = {0};
    cl_event done_event = NULL;
    if ((status = reserve(ctx, op, CLATTN_WS_HOST_IN0, sizes.q, sizeof(float))) ||
        (status = reserve(ctx, op, CLATTN_WS_HOST_IN1, sizes.k, sizeof(float))) ||
        (status = reserve(ctx, op, CLATTN_WS_HOST_IN2, sizes.v, sizeof(float))) ||
        (status = reserve(ctx, op, CLATTN_WS_HOST_OUT, sizes.out, sizeof(float))) ||
        (weights &&
         (status = reserve(ctx, op, CLATTN_WS_HOST_ATTN, sizes.scores, sizeof(float)))) ||
        (status = upload(ctx, op, CLATTN_WS_HOST_IN0, 0, q, sizes.q, sizeof(float), &tq)) ||
        (status = upload(ctx, op, CLATTN_WS_HOST_IN1, 0, k, sizes.k, sizeof(float), &tk)) ||
        (status = upload(ctx, op, CLATTN_WS_HOST_IN2, 0, v, sizes.v, sizeof(float), &tv)) ||
        (status =
             stage_masks(ctx, op, masks, sizes.attn_mask, sizes.key_padding, &device_desc.masks)))
        return status;
    tout.mem = ctx->workspace[CLATTN_WS_HOST_OUT];
    if (weights)
        tweights.mem = ctx->workspace[CLATTN_WS_HOST_ATTN];
    status = clattn_attention(ctx, &device_desc, tq, tk, tv, tout, tweights, 0, NULL, &done_event);
    if (status == CLATTN_SUCCESS)
        status = download(ctx, op, tout, out, sizes.out, done_event);
    if (status == CLATTN_SUCCESS && weights)
        status = download(ctx, op, tweights, weights, sizes.scores, done_event);
    if (done_event)
        clReleaseEvent(done_event);
    return status;
}

/* The parameters the host passed, in the order they are packed into CLATTN_WS_HOST_W. */
enum { P_IN_PROJ, P_IN_BIAS, P_Q, P_K, P_V, P_QB, P_KB, P_VB, P_OUT, P_OUT_BIAS, P_COUNT };

clattn_status clattn_mha_forward_host(clattn_ctx *ctx, const clattn_mha_desc *desc,
                                      const clattn_mha_host_weights *weights, const float *query,
                                      const float *key, const float *value,
                                      const clattn_host_masks *masks, float *out,
                                      float *attn_weights)
{
    static const char op[] = "mha_forward";
    if (ctx == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    clattn__clear_error(ctx);
    if (desc == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: desc is NULL", op);
    if (weights == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: weights is NULL", op);
    const char *missing = !query ? "query" : !out ? "out" : NULL;
    if (missing)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, missing);
    if (desc->need_weights != CLATTN_WEIGHTS_NONE && attn_weights == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: attn_weights is NULL but need_weights=%d asks for them", op,
                            (int)desc->need_weights);
    clattn_mha_sizes s;
    clattn_status status = clattn__mha_shapes(ctx, desc, weights->in_proj_weight != NULL,
                                              weights->out_weight != NULL, &s);
    if (status != CLATTN_SUCCESS)
        return status;
    if (key == NULL)
        key = query;
    if (value == NULL)
        value = key;
    if ((key == query && s.kdim != desc->embed_dim) || (value == key && s.vdim != s.kdim))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: key/value omitted (self-attention) but kdim/vdim differ from "
                            "embed_dim",
                            op);
    if ((key == query || value == query) && desc->seq_k != desc->seq_q)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: key or value is the query but seq_k=%zu != seq_q=%zu", op,
                            desc->seq_k, desc->seq_q);

    /* Pack every given parameter into one staging buffer. */
    const float *params[P_COUNT] = {
        weights->in_proj_weight, weights->in_proj_bias, weights->q_weight, weights->k_weight,
        weights->v_weight,       weights->q_bias,       weights->k_bias,   weights->v_bias,
        weights->out_weight,     weights->out_bias,
    };
    const size_t counts[P_COUNT] = {
        s.in_proj, 3 * desc->embed_dim, s.wq, s.wk, s.wv, s.qk_dim, s.qk_dim, s.v_dim,
        s.wo,      desc->embed_dim};
    size_t offsets[P_COUNT] = {0}, total = 0;
    for (int i = 0; i < P_COUNT; ++i) {
        offsets[i] = total;
        if (params[i] && !clattn__add(total, counts[i], &total))
            return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: weights overflow size_t", op);
    }
    clattn_mha_weights dw;
    memset(&dw, 0, sizeof dw);
    clattn_tensor *slots[P_COUNT] = {
        &dw.in_proj_weight, &dw.in_proj_bias, &dw.q_weight, &dw.k_weight,   &dw.v_weight,
        &dw.q_bias,         &dw.k_bias,       &dw.v_bias,   &dw.out_weight, &dw.out_bias};
    if ((status = reserve(ctx, op, CLATTN_WS_HOST_W, total, sizeof(float))))
        return status;
    for (int i = 0; i < P_COUNT; ++i)
        if (params[i] && (status = upload(ctx, op, CLATTN_WS_HOST_W, offsets[i], params[i],
                                          counts[i], sizeof(float), slots[i])))
            return status;

    /* Inputs: self-attention uploads once so the device path can fuse the projections. */
    clattn_tensor tq, tk, tv, tout = {0}, tweights = {0};
    if ((status = reserve(ctx, op, CLATTN_WS_HOST_IN0, s.query, sizeof(float))) ||
        (status = upload(ctx, op, CLATTN_WS_HOST_IN0, 0, query, s.query, sizeof(float), &tq)))
        return status;
    tk = tq;
    if (key != query &&
        ((status = reserve(ctx, op, CLATTN_WS_HOST_IN1, s.key, sizeof(float))) ||
         (status = upload(ctx, op, CLATTN_WS_HOST_IN1, 0, key, s.key, sizeof(float), &tk))))
        return status;
    tv = value == query ? tq : tk;
    if (value != query && value != key &&
        ((status = reserve(ctx, op, CLATTN_WS_HOST_IN2, s.value, sizeof(float))) ||
         (status = upload(ctx, op, CLATTN_WS_HOST_IN2, 0, value, s.value, sizeof(float), &tv))))
        return status;

    clattn_mha_desc device_desc = *desc;
    if ((status = stage_masks(ctx, op, masks, s.attn_mask, s.key_padding, &device_desc.masks)) ||
        (status = reserve(ctx, op, CLATTN_WS_HOST_OUT, s.out, sizeof(float))) ||
        (s.weights && (status = reserve(ctx, op, CLATTN_WS_HOST_ATTN, s.weights, sizeof(float)))))
        return status;
    tout.mem = ctx->workspace[CLATTN_WS_HOST_OUT];
    if (s.weights)
        tweights.mem = ctx->workspace[CLATTN_WS_HOST_ATTN];

    cl_event done_event = NULL;
    status = clattn_mha_forward(ctx, &device_desc, &dw, tq, tk, tv, tout, tweights, 0, NULL,
                                &done_event);
    if (status == CLATTN_SUCCESS)
        status = download(ctx, op, tout, out, s.out, done_event);
    if (status == CLATTN_SUCCESS && s.weights)
        status = download(ctx, op, tweights, attn_weights, s.weights, done_event);
    if (done_event)
        clReleaseEvent(done_event);
    return status;
}
