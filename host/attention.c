/* Scaled dot-product attention and multi-head attention: the only place that knows what
 * attention is. Plans the steps on top of the ops and owns their workspace. */
#include "internal.h"

#include <math.h>

/* ---------------------------------------------------------------------------------------------
 * Shared checks
 * ------------------------------------------------------------------------------------------- */

static clattn_status overflow(clattn_ctx *ctx, const char *op, const char *what)
{
    return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: the size of %s overflows size_t", op, what);
}

/* Elements times sizeof(float) must fit too, or no buffer could be described. */
static bool tensor_elems(size_t *out, size_t a, size_t b, size_t c, size_t d)
{
    size_t bytes;
    return clattn__product(out, 4, a, b, c, d) && clattn__mul(*out, sizeof(float), &bytes);
}

/* Whether to run the fused kernel; fails when the path asked for cannot be honoured. */
static clattn_status choose_fused(clattn_ctx *ctx, const char *op, clattn_path path,
                                  bool want_weights, size_t dk, size_t dv, bool *fused)
{
    const bool supported = clattn__flash_supports(dk, dv);
    switch (path) {
    case CLATTN_PATH_AUTO:
        *fused = !want_weights && supported;
        return CLATTN_SUCCESS;
    case CLATTN_PATH_UNFUSED:
        *fused = false;
        return CLATTN_SUCCESS;
    case CLATTN_PATH_FUSED:
        if (want_weights)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: path=FUSED cannot return the attention weights (the fused "
                                "kernel never forms them): use AUTO or UNFUSED",
                                op);
        if (!supported)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: path=FUSED takes head sizes up to 256 (got %zu, %zu)", op, dk,
                                dv);
        *fused = true;
        return CLATTN_SUCCESS;
    }
    return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: path=%d is not a clattn_path", op,
                        (int)path);
}

/* ---------------------------------------------------------------------------------------------
 * Scaled dot-product attention
 * ------------------------------------------------------------------------------------------- */

clattn_status clattn__attention_shapes(clattn_ctx *ctx, const clattn_attention_desc *desc,
                                       clattn_attention_sizes *sizes)
{
    static const char op[] = "attention";
    static const char *const names[6] = {"batch", "heads",       "seq_q",
                                         "seq_k", "head_dim_qk", "head_dim_v"};
    const size_t dims[6] = {desc->batch, desc->heads,       desc->seq_q,
                            desc->seq_k, desc->head_dim_qk, desc->head_dim_v};
    clattn_status status = clattn__check_dims(ctx, op, dims, names, 6, false);
    if (status != CLATTN_SUCCESS)
        return status;
    const size_t b = desc->batch, h = desc->heads;
    if (!tensor_elems(&sizes->q, b, h, desc->seq_q, desc->head_dim_qk))
        return overflow(ctx, op, "q (batch, heads, seq_q, head_dim_qk)");
    if (!tensor_elems(&sizes->k, b, h, desc->seq_k, desc->head_dim_qk))
        return overflow(ctx, op, "k (batch, heads, seq_k, head_dim_qk)");
    if (!tensor_elems(&sizes->v, b, h, desc->seq_k, desc->head_dim_v))
        return overflow(ctx, op, "v (batch, heads, seq_k, head_dim_v)");
    if (!tensor_elems(&sizes->out, b, h, desc->seq_q, desc->head_dim_v))
        return overflow(ctx, op, "out (batch, heads, seq_q, head_dim_v)");
    if (!tensor_elems(&sizes->scores, b, h, desc->seq_q, desc->seq_k))
        return overflow(ctx, op, "the scores (batch, heads, seq_q, seq_k)");
    if (!tensor_elems(&sizes->attn_mask, 1, 1, desc->seq_q, desc->seq_k) ||
        !tensor_elems(&sizes->key_padding, 1, 1, b, desc->seq_k))
        return overflow(ctx, op, "the masks");
    return clattn__check_dims(ctx, op, dims, names, 6, true);
}

/* Enqueues S = Q Kᵀ, P = normalise(scale S + masks) into `scores`, O = P V. */
static clattn_status attention_enqueue(clattn_ctx *ctx, const clattn_attention_desc *desc,
                                       clattn_tensor q, clattn_tensor k, clattn_tensor v,
                                       clattn_tensor out, clattn_tensor scores, clattn_chain *chain)
{
    const size_t bh = desc->batch * desc->heads;
    const size_t lq = desc->seq_q, lk = desc->seq_k;
    const size_t dk = desc->head_dim_qk, dv = desc->head_dim_v;
    const clattn_matmul_desc qk = {
        .batch = bh,
        .m = lq,
        .n = lk,
        .k = dk,
        .trans_b = 1,
        .stride_a = lq * dk,
        .stride_b = lk * dk,
        .stride_c = lq * lk,
        .alpha = 1.0f,
        .beta = 0.0f,
    };
    const clattn_softmax_desc norm = {
        .batch = desc->batch,
        .heads = desc->heads,
        .seq_q = lq,
        .seq_k = lk,
        .scale = desc->scale != 0.0f ? desc->scale : (float)(1.0 / sqrt((double)dk)),
        .norm = desc->norm,
        .masks = desc->masks,
    };
    const clattn_matmul_desc pv = {
        .batch = bh,
        .m = lq,
        .n = dv,
        .k = lk,
        .stride_a = lq * lk,
        .stride_b = lk * dv,
        .stride_c = lq * dv,
        .alpha = 1.0f,
        .beta = 0.0f,
    };
    const clattn_tensor none = {0};
    cl_event step = NULL;
    clattn_status status;
    if ((status = clattn__step(
             chain, clattn__matmul_enqueue(ctx, &qk, q, k, none, scores, CHAIN_WAIT(chain), &step),
             &step)) ||
        (status = clattn__step(
             chain, clattn__softmax_enqueue(ctx, &norm, scores, scores, CHAIN_WAIT(chain), &step),
             &step)))
        return status;
    return clattn__step(
        chain, clattn__matmul_enqueue(ctx, &pv, scores, v, none, out, CHAIN_WAIT(chain), &step),
        &step);
}

clattn_status clattn_attention(clattn_ctx *ctx, const clattn_attention_desc *desc, clattn_tensor q,
                               clattn_tensor k, clattn_tensor v, clattn_tensor out,
                               clattn_tensor weights, cl_uint num_wait, const cl_event *wait,
                               cl_event *event)
{
    static const char op[] = "attention";
    clattn_status status = clattn__entry(ctx, op, desc, num_wait, wait, event);
    if (status == CLATTN_SUCCESS)
        status = clattn__check_norm(ctx, op, desc->norm);
    if (status != CLATTN_SUCCESS)
        return status;
    clattn_attention_sizes sizes;
    if ((status = clattn__attention_shapes(ctx, desc, &sizes)) ||
        (status = clattn__check_tensor(ctx, op, "q", q, sizes.q, sizeof(float), true)) ||
        (status = clattn__check_tensor(ctx, op, "k", k, sizes.k, sizeof(float), true)) ||
        (status = clattn__check_tensor(ctx, op, "v", v, sizes.v, sizeof(float), true)) ||
        (status = clattn__check_tensor(ctx, op, "out", out, sizes.out, sizeof(float), true)) ||
        (status = clattn__check_tensor(ctx, op, "weights", weights, sizes.scores, sizeof(float),
                                       false)) ||
        (status =
             clattn__check_masks(ctx, op, &desc->masks, desc->batch, desc->seq_q, desc->seq_k)))
        return status;

    bool fused = false;
    if ((status = choose_fused(ctx, op, desc->path, weights.mem != NULL, desc->head_dim_qk,
                               desc->head_dim_v, &fused)))
        return status;
    clattn_chain chain;
    if (fused) {
        cl_event step = NULL;
        status = clattn__begin(ctx, op, &chain, num_wait, wait);
        if (status == CLATTN_SUCCESS)
            status = clattn__step(&chain,
                                  clattn__flash_enqueue(ctx, desc, q, k, v, out, (clattn_tensor){0},
                                                        CHAIN_WAIT(&chain), &step),
                                  &step);
        return clattn__end(ctx, op, &chain, status, event);
    }
    clattn_tensor scores = weights;
    if (scores.mem == NULL) {
        scores.offset = 0;
        status =
            clattn__workspace(ctx, op, CLATTN_WS_SCORES, sizes.scores * sizeof(float), &scores.mem);
        if (status != CLATTN_SUCCESS)
            return status;
    }
    status = clattn__begin(ctx, op, &chain, num_wait, wait);
    if (status == CLATTN_SUCCESS)
        status = attention_enqueue(ctx, desc, q, k, v, out, scores, &chain);
    return clattn__end(ctx, op, &chain, status, event);
}

/* ---------------------------------------------------------------------------------------------
 * Multi-head attention
 * ------------------------------------------------------------------------------------------- */

clattn_status clattn__mha_shapes(clattn_ctx *ctx, const clattn_mha_desc *desc, bool has_in_proj,
                                 bool has_out_weight, clattn_mha_sizes *s)
{
    static const char op[] = "mha_forward";
    static const char *const names[5] = {"batch", "seq_q", "seq_k", "embed_dim", "num_heads"};
    const size_t dims[5] = {desc->batch, desc->seq_q, desc->seq_k, desc->embed_dim,
                            desc->num_heads};
    clattn_status status = clattn__check_dims(ctx, op, dims, names, 5, false);
    if (status != CLATTN_SUCCESS)
        return status;
    if (desc->layout != CLATTN_LAYOUT_XW && desc->layout != CLATTN_LAYOUT_TORCH)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: layout=%d is not a clattn_weight_layout", op, (int)desc->layout);
    if (desc->need_weights != CLATTN_WEIGHTS_NONE &&
        desc->need_weights != CLATTN_WEIGHTS_PER_HEAD &&
        desc->need_weights != CLATTN_WEIGHTS_AVERAGED)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: need_weights=%d is not a clattn_need_weights", op,
                            (int)desc->need_weights);
    const size_t e = desc->embed_dim, h = desc->num_heads;
    s->kdim = desc->kdim ? desc->kdim : e;
    s->vdim = desc->vdim ? desc->vdim : e;
    s->qk_dim = desc->qk_dim ? desc->qk_dim : e;
    s->v_dim = desc->v_dim ? desc->v_dim : e;
    s->out_dim = has_out_weight ? e : s->v_dim;
    const size_t more[4] = {s->kdim, s->vdim, s->qk_dim, s->v_dim};
    static const char *const more_names[4] = {"kdim", "vdim", "qk_dim", "v_dim"};
    if ((status = clattn__check_dims(ctx, op, more, more_names, 4, false)) != CLATTN_SUCCESS)
        return status;
    if (s->qk_dim % h != 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: %s=%zu is not divisible by num_heads=%zu", op,
                            desc->qk_dim ? "qk_dim" : "embed_dim", s->qk_dim, h);
    if (s->v_dim % h != 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: %s=%zu is not divisible by num_heads=%zu", op,
                            desc->v_dim ? "v_dim" : "embed_dim", s->v_dim, h);
    if (has_in_proj) {
        if (desc->layout != CLATTN_LAYOUT_TORCH)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: in_proj_weight is PyTorch's packed layout: set layout to "
                                "CLATTN_LAYOUT_TORCH",
                                op);
        if (s->kdim != e || s->vdim != e || s->qk_dim != e || s->v_dim != e)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                "%s: in_proj_weight needs kdim = vdim = qk_dim = v_dim = "
                                "embed_dim=%zu (got %zu, %zu, %zu, %zu): pass q/k/v_weight",
                                op, e, s->kdim, s->vdim, s->qk_dim, s->v_dim);
    }
    const size_t b = desc->batch, lq = desc->seq_q, lk = desc->seq_k;
    if (!tensor_elems(&s->query, b, lq, e, 1))
        return overflow(ctx, op, "query (batch, seq_q, embed_dim)");
    if (!tensor_elems(&s->key, b, lk, s->kdim, 1))
        return overflow(ctx, op, "key (batch, seq_k, kdim)");
    if (!tensor_elems(&s->value, b, lk, s->vdim, 1))
        return overflow(ctx, op, "value (batch, seq_k, vdim)");
    if (!tensor_elems(&s->out, b, lq, s->out_dim, 1))
        return overflow(ctx, op, "out (batch, seq_q, out features)");
    if (!tensor_elems(&s->wq, e, s->qk_dim, 1, 1) ||
        !tensor_elems(&s->wk, s->kdim, s->qk_dim, 1, 1) ||
        !tensor_elems(&s->wv, s->vdim, s->v_dim, 1, 1) ||
        !tensor_elems(&s->wo, s->v_dim, e, 1, 1) || !tensor_elems(&s->in_proj, 3, e, e, 1))
        return overflow(ctx, op, "the weights");
    size_t scores = 0;
    if (!tensor_elems(&scores, b, h, lq, lk))
        return overflow(ctx, op, "the weights (batch, heads, seq_q, seq_k)");
    s->weights = desc->need_weights == CLATTN_WEIGHTS_PER_HEAD   ? scores
                 : desc->need_weights == CLATTN_WEIGHTS_AVERAGED ? b * lq * lk
                                                                 : 0;
    if (!tensor_elems(&s->attn_mask, 1, 1, lq, lk) || !tensor_elems(&s->key_padding, 1, 1, b, lk))
        return overflow(ctx, op, "the masks");
    /* The head-major copies and the projections must fit too. */
    size_t ws = 0;
    if (!tensor_elems(&ws, b, lq > lk ? lq : lk, s->qk_dim > s->v_dim ? s->qk_dim : s->v_dim, 3))
        return overflow(ctx, op, "the projections");
    if ((status = clattn__check_dims(ctx, op, dims, names, 5, true)) != CLATTN_SUCCESS)
        return status;
    return clattn__check_dims(ctx, op, more, more_names, 4, true);
}

/* Where a projection reads its weight and bias, and how. */
typedef struct projection {
    clattn_tensor weight, bias;
    size_t in_features, out_features;
} projection;

/* dst (rows x out_features, row stride ldc) = src (rows x in_features) · W + bias. */
static clattn_status project(clattn_ctx *ctx, const clattn_mha_desc *desc, const projection *p,
                             size_t rows, clattn_tensor src, clattn_tensor dst, size_t ldc,
                             clattn_chain *chain)
{
    const clattn_matmul_desc mm = {
        .batch = 1,
        .m = rows,
        .n = p->out_features,
        .k = p->in_features,
        .trans_b = desc->layout == CLATTN_LAYOUT_TORCH,
        .ldc = ldc,
        .alpha = 1.0f,
        .beta = 0.0f,
    };
    cl_event step = NULL;
    return clattn__step(
        chain,
        clattn__matmul_enqueue(ctx, &mm, src, p->weight, p->bias, dst, CHAIN_WAIT(chain), &step),
        &step);
}

/* Splits (to_head_major) or concatenates heads as one step of the chain. */
static clattn_status move_heads(clattn_ctx *ctx, int to_head_major, size_t batch, size_t seq,
                                size_t heads, size_t head_dim, size_t row_stride, clattn_tensor src,
                                clattn_tensor dst, clattn_chain *chain)
{
    const clattn_heads_desc hd = {
        .batch = batch, .seq = seq, .heads = heads, .head_dim = head_dim, .row_stride = row_stride};
    cl_event step = NULL;
    return clattn__step(
        chain,
        clattn__move_heads_enqueue(ctx, &hd, to_head_major, src, dst, CHAIN_WAIT(chain), &step),
        &step);
}

static clattn_status check_mha_tensors(clattn_ctx *ctx, const clattn_mha_desc *desc,
                                       const clattn_mha_weights *w, const clattn_mha_sizes *s,
                                       clattn_tensor query, clattn_tensor key, clattn_tensor value,
                                       clattn_tensor out, clattn_tensor attn_weights)
{
    static const char op[] = "mha_forward";
    const bool packed = w->in_proj_weight.mem != NULL;
    if (packed && (w->q_weight.mem || w->k_weight.mem || w->v_weight.mem))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: give either in_proj_weight or q/k/v_weight, not both", op);
    if (packed && (w->q_bias.mem || w->k_bias.mem || w->v_bias.mem))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: with in_proj_weight the biases go in in_proj_bias", op);
    if (!packed && w->in_proj_bias.mem)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: in_proj_bias given without in_proj_weight", op);
    if (w->out_bias.mem && !w->out_weight.mem)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: out_bias given without out_weight", op);
    const size_t e = desc->embed_dim;
    clattn_status status;
    if ((status = clattn__check_tensor(ctx, op, "query", query, s->query, 4, true)) ||
        (status = clattn__check_tensor(ctx, op, "key", key, s->key, 4, true)) ||
        (status = clattn__check_tensor(ctx, op, "value", value, s->value, 4, true)) ||
        (status = clattn__check_tensor(ctx, op, "out", out, s->out, 4, true)) ||
        (status = clattn__check_tensor(ctx, op, "attn_weights", attn_weights, s->weights, 4,
                                       desc->need_weights != CLATTN_WEIGHTS_NONE)) ||
        (status = clattn__check_tensor(ctx, op, "out_weight", w->out_weight, s->wo, 4, false)) ||
        (status = clattn__check_tensor(ctx, op, "out_bias", w->out_bias, e, 4, false)) ||
        (status =
             clattn__check_masks(ctx, op, &desc->masks, desc->batch, desc->seq_q, desc->seq_k)))
        return status;
    if (packed)
        return (status = clattn__check_tensor(ctx, op, "in_proj_weight", w->in_proj_weight,
                                              s->in_proj, 4, true))
                   ? status
                   : clattn__check_tensor(ctx, op, "in_proj_bias", w->in_proj_bias, 3 * e, 4,
                                          false);
    if ((status = clattn__check_tensor(ctx, op, "q_weight", w->q_weight, s->wq, 4, true)) ||
        (status = clattn__check_tensor(ctx, op, "k_weight", w->k_weight, s->wk, 4, true)) ||
        (status = clattn__check_tensor(ctx, op, "v_weight", w->v_weight, s->wv, 4, true)) ||
        (status = clattn__check_tensor(ctx, op, "q_bias", w->q_bias, s->qk_dim, 4, false)) ||
        (status = clattn__check_tensor(ctx, op, "k_bias", w->k_bias, s->qk_dim, 4, false)))
        return status;
    return clattn__check_tensor(ctx, op, "v_bias", w->v_bias, s->v_dim, 4, false);
}

static bool same_tensor(clattn_tensor a, clattn_tensor b)
{
    return a.mem == b.mem && a.offset == b.offset;
}

static clattn_tensor at(clattn_tensor t, size_t elems)
{
    if (t.mem)
        t.offset += elems;
    return t;
}

static clattn_status mha_enqueue(clattn_ctx *ctx, const clattn_mha_desc *desc,
                                 const clattn_mha_weights *w, const clattn_mha_sizes *s,
                                 clattn_tensor query, clattn_tensor key, clattn_tensor value,
                                 clattn_tensor out, clattn_tensor attn_weights, bool flash,
                                 clattn_chain *chain)
{
    static const char op[] = "mha_forward";
    const size_t b = desc->batch, lq = desc->seq_q, lk = desc->seq_k, h = desc->num_heads;
    const size_t e = desc->embed_dim, dk = s->qk_dim / h, dv = s->v_dim / h;
    const bool packed = w->in_proj_weight.mem != NULL;
    /* Self-attention with PyTorch's packed weights: one (B*L, 3E) projection for q, k and v. */
    const bool packed_qkv =
        packed && lq == lk && same_tensor(query, key) && same_tensor(key, value);
    const size_t f = sizeof(float);
    clattn_status status;
    cl_mem ws[CLATTN_WS_COUNT] = {0};

    /* Workspace sizes: projections, head-major copies, scores, output heads, concat. */
    const size_t q_proj = packed_qkv ? b * lq * 3 * e : b * lq * s->qk_dim;
    const struct {
        clattn_ws_slot slot;
        size_t elems;
    } need[] = {
        {CLATTN_WS_Q_PROJ, q_proj},
        {CLATTN_WS_K_PROJ, packed_qkv ? 0 : b * lk * s->qk_dim},
        {CLATTN_WS_V_PROJ, packed_qkv ? 0 : b * lk * s->v_dim},
        {CLATTN_WS_Q_HEADS, b * lq * s->qk_dim},
        {CLATTN_WS_K_HEADS, b * lk * s->qk_dim},
        {CLATTN_WS_V_HEADS, b * lk * s->v_dim},
        {CLATTN_WS_SCORES,
         flash || desc->need_weights == CLATTN_WEIGHTS_PER_HEAD ? 0 : b * h * lq * lk},
        {CLATTN_WS_O_HEADS, b * lq * s->v_dim},
        {CLATTN_WS_CONCAT, w->out_weight.mem ? b * lq * s->v_dim : 0},
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; ++i) {
        if (need[i].elems == 0)
            continue;
        status = clattn__workspace(ctx, op, need[i].slot, need[i].elems * f, &ws[need[i].slot]);
        if (status != CLATTN_SUCCESS)
            return status;
    }
#define WS(slot) ((clattn_tensor){ws[slot], 0})

    /* 1. Input projections, then 2. split into heads. */
    if (packed_qkv) {
        const projection qkv = {w->in_proj_weight, w->in_proj_bias, e, 3 * e};
        if ((status = project(ctx, desc, &qkv, b * lq, query, WS(CLATTN_WS_Q_PROJ), 0, chain)))
            return status;
        for (int part = 0; part < 3; ++part) {
            const clattn_ws_slot dst = part == 0   ? CLATTN_WS_Q_HEADS
                                       : part == 1 ? CLATTN_WS_K_HEADS
                                                   : CLATTN_WS_V_HEADS;
            status = move_heads(ctx, 1, b, lq, h, dk, 3 * e, at(WS(CLATTN_WS_Q_PROJ), part * e),
                                WS(dst), chain);
            if (status != CLATTN_SUCCESS)
                return status;
        }
    } else {
        const projection pq = {packed ? w->in_proj_weight : w->q_weight,
                               packed ? w->in_proj_bias : w->q_bias, e, s->qk_dim};
        const projection pk = {packed ? at(w->in_proj_weight, e * e) : w->k_weight,
                               packed ? at(w->in_proj_bias, e) : w->k_bias, s->kdim, s->qk_dim};
        const projection pv = {packed ? at(w->in_proj_weight, 2 * e * e) : w->v_weight,
                               packed ? at(w->in_proj_bias, 2 * e) : w->v_bias, s->vdim, s->v_dim};
        if ((status = project(ctx, desc, &pq, b * lq, query, WS(CLATTN_WS_Q_PROJ), 0, chain)) ||
            (status = project(ctx, desc, &pk, b * lk, key, WS(CLATTN_WS_K_PROJ), 0, chain)) ||
            (status = project(ctx, desc, &pv, b * lk, value, WS(CLATTN_WS_V_PROJ), 0, chain)) ||
            (status = move_heads(ctx, 1, b, lq, h, dk, 0, WS(CLATTN_WS_Q_PROJ),
                                 WS(CLATTN_WS_Q_HEADS), chain)) ||
            (status = move_heads(ctx, 1, b, lk, h, dk, 0, WS(CLATTN_WS_K_PROJ),
                                 WS(CLATTN_WS_K_HEADS), chain)) ||
            (status = move_heads(ctx, 1, b, lk, h, dv, 0, WS(CLATTN_WS_V_PROJ),
                                 WS(CLATTN_WS_V_HEADS), chain)))
            return status;
    }

    /* 3. Attention per head. */
    const clattn_attention_desc attn = {
        .batch = b,
        .heads = h,
        .seq_q = lq,
        .seq_k = lk,
        .head_dim_qk = dk,
        .head_dim_v = dv,
        .scale = desc->scale,
        .norm = desc->norm,
        .masks = desc->masks,
    };
    const clattn_tensor scores =
        desc->need_weights == CLATTN_WEIGHTS_PER_HEAD ? attn_weights : WS(CLATTN_WS_SCORES);
    cl_event step = NULL;
    if (flash)
        status = clattn__step(chain,
                              clattn__flash_enqueue(ctx, &attn, WS(CLATTN_WS_Q_HEADS),
                                                    WS(CLATTN_WS_K_HEADS), WS(CLATTN_WS_V_HEADS),
                                                    WS(CLATTN_WS_O_HEADS), (clattn_tensor){0},
                                                    CHAIN_WAIT(chain), &step),
                              &step);
    else
        status = attention_enqueue(ctx, &attn, WS(CLATTN_WS_Q_HEADS), WS(CLATTN_WS_K_HEADS),
                                   WS(CLATTN_WS_V_HEADS), WS(CLATTN_WS_O_HEADS), scores, chain);
    if (status != CLATTN_SUCCESS)
        return status;
    if (desc->need_weights == CLATTN_WEIGHTS_AVERAGED &&
        (status = clattn__step(chain,
                               clattn__mean_heads_enqueue(ctx, b, h, lq * lk, scores, attn_weights,
                                                          CHAIN_WAIT(chain), &step),
                               &step)))
        return status;

    /* 4. Concat heads, 5. output projection. */
    const clattn_tensor concat_dst = w->out_weight.mem ? WS(CLATTN_WS_CONCAT) : out;
    status = move_heads(ctx, 0, b, lq, h, dv, 0, WS(CLATTN_WS_O_HEADS), concat_dst, chain);
    if (status != CLATTN_SUCCESS)
        return status;
    if (w->out_weight.mem) {
        const projection po = {w->out_weight, w->out_bias, s->v_dim, e};
        status = project(ctx, desc, &po, b * lq, WS(CLATTN_WS_CONCAT), out, 0, chain);
    }
#undef WS
    return status;
}

clattn_status clattn_mha_forward(clattn_ctx *ctx, const clattn_mha_desc *desc,
                                 const clattn_mha_weights *weights, clattn_tensor query,
                                 clattn_tensor key, clattn_tensor value, clattn_tensor out,
                                 clattn_tensor attn_weights, cl_uint num_wait, const cl_event *wait,
                                 cl_event *event)
{
    static const char op[] = "mha_forward";
    clattn_status status = clattn__entry(ctx, op, desc, num_wait, wait, event);
    if (status == CLATTN_SUCCESS)
        status = clattn__check_norm(ctx, op, desc->norm);
    if (status != CLATTN_SUCCESS)
        return status;
    if (weights == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: weights is NULL", op);
    clattn_mha_sizes sizes;
    status = clattn__mha_shapes(ctx, desc, weights->in_proj_weight.mem != NULL,
                                weights->out_weight.mem != NULL, &sizes);
    if (status == CLATTN_SUCCESS)
        status =
            check_mha_tensors(ctx, desc, weights, &sizes, query, key, value, out, attn_weights);
    bool flash = false;
    if (status == CLATTN_SUCCESS)
        status =
            choose_fused(ctx, op, desc->path, desc->need_weights != CLATTN_WEIGHTS_NONE,
                         sizes.qk_dim / desc->num_heads, sizes.v_dim / desc->num_heads, &flash);
    if (status != CLATTN_SUCCESS)
        return status;
    clattn_chain chain;
    status = clattn__begin(ctx, op, &chain, num_wait, wait);
    if (status == CLATTN_SUCCESS)
        status = mha_enqueue(ctx, desc, weights, &sizes, query, key, value, out, attn_weights,
                             flash, &chain);
    return clattn__end(ctx, op, &chain, status, event);
}
