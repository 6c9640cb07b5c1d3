/* Host-pointer API: stages float arrays in the context's workspace, runs the device path,
 * reads the results back. Synchronous. */
#include "plan.h"

#include <math.h>
#include <stdlib.h>

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

/* Stages the host masks (NULL: none) into their slots and fills the mask tensors. */
static clattn_status stage_masks(clattn_ctx *ctx, const char *op, const clattn_host_masks *hm,
                                 size_t batch, size_t heads, size_t seq_q, size_t seq_k,
                                 bool per_head, clattn_tensors *t)
{
    clattn_status status = CLATTN_SUCCESS;
    if (hm == NULL)
        return CLATTN_SUCCESS;
    size_t mask_elems = 0, padding_elems = 0;
    if (!clattn__mul(seq_q, seq_k, &mask_elems) || !clattn__mul(batch, seq_k, &padding_elems) ||
        (per_head && (!clattn__mul(mask_elems, batch, &mask_elems) ||
                      !clattn__mul(mask_elems, heads, &mask_elems))))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: mask sizes overflow size_t", op);
    clattn_tensor staged;
    if (hm->attn_mask) {
        if ((status = reserve(ctx, op, CLATTN_WS_HOST_MASK, mask_elems, sizeof(float))) ||
            (status = upload(ctx, op, CLATTN_WS_HOST_MASK, 0, hm->attn_mask, mask_elems,
                             sizeof(float), &staged)))
            return status;
        t->attn_mask = per_head ? clattn_tensor_make(staged.mem, 0, CLATTN_DTYPE_F32, 4, batch,
                                                     heads, seq_q, seq_k)
                                : clattn_tensor_make(staged.mem, 0, CLATTN_DTYPE_F32, 2, seq_q,
                                                     seq_k, 0, 0);
    }
    if (hm->alibi_slopes) {
        if ((status = reserve(ctx, op, CLATTN_WS_HOST_ALIBI, heads, sizeof(float))) ||
            (status = upload(ctx, op, CLATTN_WS_HOST_ALIBI, 0, hm->alibi_slopes, heads,
                             sizeof(float), &staged)))
            return status;
        t->alibi_slopes = clattn_tensor_make(staged.mem, 0, CLATTN_DTYPE_F32, 1, heads, 0, 0, 0);
    }
    if (hm->key_padding_mask) {
        if ((status = reserve(ctx, op, CLATTN_WS_HOST_KPM, padding_elems, 1)) ||
            (status = upload(ctx, op, CLATTN_WS_HOST_KPM, 0, hm->key_padding_mask, padding_elems,
                             1, &staged)))
            return status;
        t->key_padding_mask =
            clattn_tensor_make(staged.mem, 0, CLATTN_DTYPE_U8, 2, batch, seq_k, 0, 0);
    }
    return CLATTN_SUCCESS;
}

/* Mask layouts for plan creation (buffers are staged after the plan validated the shapes). */
static void mask_layouts(const clattn_host_masks *hm, size_t batch, size_t heads, size_t seq_q,
                         size_t seq_k, bool per_head, clattn_tensors *t)
{
    if (hm && hm->alibi_slopes)
        t->alibi_slopes = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, heads, 0, 0, 0);
    if (hm && hm->attn_mask)
        t->attn_mask =
            per_head ? clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, batch, heads, seq_q, seq_k)
                     : clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, seq_q, seq_k, 0, 0);
    if (hm && hm->key_padding_mask)
        t->key_padding_mask = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_U8, 2, batch, seq_k, 0, 0);
}

static clattn_status check_dims(clattn_ctx *ctx, const char *op, const size_t *dims,
                                const char *const *names, int count)
{
    for (int i = 0; i < count; ++i)
        if (dims[i] == 0)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                "%s: %s=0: every dimension must be at least 1", op, names[i]);
    return CLATTN_SUCCESS;
}

/* Elements of a tensor layout (packed). */
static size_t elems_of(const clattn_tensor *t)
{
    size_t n = 1;
    for (int d = 0; d < t->rank; ++d)
        n *= t->dims[d]; /* the plan checked that this does not overflow */
    return n;
}

static void attention_host_defaults(void *desc);
static void mha_host_defaults(void *desc);
/* Every version had struct_size and the sizes. */
static const clattn__desc_type attention_host_desc = {
    "clattn_attention_host_desc", sizeof(clattn_attention_host_desc),
    offsetof(clattn_attention_host_desc, causal), attention_host_defaults};
static const clattn__desc_type mha_host_desc = {"clattn_mha_host_desc",
                                                sizeof(clattn_mha_host_desc),
                                                offsetof(clattn_mha_host_desc, embed_dim),
                                                mha_host_defaults};

CLATTN__DESC_INIT_SCALED(clattn_attention_host_desc, )
CLATTN__DESC_INIT_SCALED(clattn_mha_host_desc, CLATTN__HEADS_DEFAULTS)

static void attention_host_defaults(void *desc)
{
    clattn_attention_host_desc_init(desc);
}

static void mha_host_defaults(void *desc)
{
    clattn_mha_host_desc_init(desc);
}

/* The tensor's elements in workspace slot `slot` (its mem), uploaded from data (NULL: an
 * output, nothing to upload). */
static clattn_status stage(clattn_ctx *ctx, const char *op, clattn_ws_slot slot, const float *data,
                           clattn_tensor *tensor)
{
    const size_t n = elems_of(tensor);
    clattn_tensor staged;
    clattn_status status = reserve(ctx, op, slot, n, sizeof(float));
    if (status == CLATTN_SUCCESS && data)
        status = upload(ctx, op, slot, 0, data, n, sizeof(float), &staged);
    if (status == CLATTN_SUCCESS)
        tensor->mem = ctx->workspace[slot];
    return status;
}

/* Stages the outputs (out, and weights when asked for) and the masks, runs plan on the staged
 * tensors and reads out (and weights) back. */
static clattn_status run_and_read(clattn_ctx *ctx, const char *op, clattn_plan *plan,
                                  const clattn_host_masks *masks, const size_t bhqk[4],
                                  bool mask_per_head, clattn_tensors *t, float *out,
                                  float *weights)
{
    const size_t b = bhqk[0], h = bhqk[1], lq = bhqk[2], lk = bhqk[3];
    clattn_status status = stage(ctx, op, CLATTN_WS_HOST_OUT, NULL, &t->out);
    if (status == CLATTN_SUCCESS && t->weights.rank)
        status = stage(ctx, op, CLATTN_WS_HOST_ATTN, NULL, &t->weights);
    if (status == CLATTN_SUCCESS)
        status = stage_masks(ctx, op, masks, b, h, lq, lk, mask_per_head, t);
    if (status != CLATTN_SUCCESS)
        return status;
    cl_event done_event = NULL;
    status =
        clattn_plan_execute(plan, t->by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, &done_event);
    if (status == CLATTN_SUCCESS)
        status = download(ctx, op, t->out, out, elems_of(&t->out), done_event);
    if (status == CLATTN_SUCCESS && weights && t->weights.mem)
        status = download(ctx, op, t->weights, weights, elems_of(&t->weights), done_event);
    if (done_event)
        clReleaseEvent(done_event);
    return status;
}

clattn_status clattn_attention_host(clattn_ctx *ctx, const clattn_attention_host_desc *desc,
                                    const float *q, const float *k, const float *v,
                                    const clattn_host_masks *masks, float *out, float *weights)
{
    static const char op[] = "attention";
    clattn_attention_host_desc full;
    clattn_status status = clattn__create_entry(ctx, op, desc, true, &attention_host_desc, &full);
    desc = &full;
    if (status != CLATTN_SUCCESS)
        return status;
    const char *missing = !q ? "q" : !k ? "k" : !v ? "v" : !out ? "out" : NULL;
    if (missing)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, missing);
    static const char *const names[6] = {"batch", "heads", "seq_q", "seq_k", "head_dim_qk",
                                         "head_dim_v"};
    const size_t dims[6] = {desc->batch, desc->heads,       desc->seq_q,
                            desc->seq_k, desc->head_dim_qk, desc->head_dim_v};
    if ((status = check_dims(ctx, op, dims, names, 6)))
        return status;
    if (desc->causal == CLATTN_CAUSAL_OFFSET || desc->window_align == CLATTN_CAUSAL_OFFSET)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: causal=%d, window_align=%d: CLATTN_CAUSAL_OFFSET needs a "
                            "diagonal: use an SDPA plan (clattn_sdpa_desc.diag_offset)",
                            op, (int)desc->causal, (int)desc->window_align);
    const size_t b = desc->batch, h = desc->heads, lq = desc->seq_q, lk = desc->seq_k;
    clattn_sdpa_desc sd;
    clattn_sdpa_desc_init(&sd);
    clattn_tensors tensors = {0};
    clattn_tensors *t = &tensors;
    CLATTN_BIND_ROLES(sd, tensors);
    t->q = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, b, h, lq, desc->head_dim_qk);
    t->k = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, b, h, lk, desc->head_dim_qk);
    t->v = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, b, h, lk, desc->head_dim_v);
    t->out = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, b, h, lq, desc->head_dim_v);
    if (weights)
        t->weights = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, b, h, lq, lk);
    mask_layouts(masks, b, h, lq, lk, false, t);
#define COPY(field) sd.field = desc->field;
    CLATTN__SCORE_FIELDS(COPY)
#undef COPY
    clattn_plan *plan = NULL;
    if ((status = clattn_sdpa_plan_create(ctx, &sd, &plan)))
        return clattn__end_message(ctx, op, status);
    const size_t bhqk[4] = {b, h, lq, lk};
    const float *data[3] = {q, k, v};
    clattn_tensor *staged[3] = {&t->q, &t->k, &t->v};
    for (int i = 0; i < 3 && status == CLATTN_SUCCESS; ++i)
        status = stage(ctx, op, (clattn_ws_slot)(CLATTN_WS_HOST_IN0 + i), data[i], staged[i]);
    if (status == CLATTN_SUCCESS)
        status = run_and_read(ctx, op, plan, masks, bhqk, false, t, out, weights);
    clattn_plan_release(plan);
    return clattn__end_message(ctx, op, status);
}

/* An MHA host call's sizes, the descriptor's zeros resolved (kdim, vdim, qk_dim, v_dim:
 * embed_dim) and grouped-query heads' widths (kv_qk, kv_vd). */
typedef struct mha_host_dims {
    size_t b, lq, lk, e, h, kdim, vdim, qk, vd, out_dim, kv_qk, kv_vd;
} mha_host_dims;

/* One weight or bias of an MHA host call: its data (NULL: not given), the plan's tensor and its
 * (d_in, d_out) (d_in 0: a bias of d_out). */
typedef struct host_param {
    const float *data;
    clattn_tensor *tensor;
    size_t d_in, d_out;
} host_param;
#define MHA_HOST_PARAMS 10

/* Validates an MHA host call's pointers and sizes into *d; key and value default to query and
 * key (self-attention). */
static clattn_status check_mha_host(clattn_ctx *ctx, const char *op,
                                    const clattn_mha_host_desc *desc,
                                    const clattn_mha_host_weights *weights, const float *query,
                                    const float **key, const float **value, const float *out,
                                    const float *attn_weights, mha_host_dims *d)
{
    if (weights == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: weights is NULL", op);
    const char *missing = !query ? "query" : !out ? "out" : NULL;
    if (missing)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, missing);
    if (desc->need_weights != CLATTN_WEIGHTS_NONE && attn_weights == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: attn_weights is NULL but need_weights=%d asks for them", op,
                            (int)desc->need_weights);
    static const char *const names[5] = {"batch", "seq_q", "seq_k", "embed_dim", "num_heads"};
    const size_t dims[5] = {desc->batch, desc->seq_q, desc->seq_k, desc->embed_dim,
                            desc->num_heads};
    clattn_status status = check_dims(ctx, op, dims, names, 5);
    if (status != CLATTN_SUCCESS)
        return status;
    const size_t e = desc->embed_dim;
    d->e = e, d->b = desc->batch, d->lq = desc->seq_q, d->lk = desc->seq_k;
    d->kdim = desc->kdim ? desc->kdim : e, d->vdim = desc->vdim ? desc->vdim : e;
    d->qk = desc->qk_dim ? desc->qk_dim : e, d->vd = desc->v_dim ? desc->v_dim : e;
    d->out_dim = weights->out_weight ? e : d->vd;
    /* Grouped-query projections: k and v project to num_kv_heads heads of the query side's
     * head sizes (the plan reports a num_kv_heads that does not divide num_heads). */
    const size_t h = desc->num_heads;
    const size_t kv = desc->num_kv_heads == CLATTN_KV_HEADS_ALL ? h : desc->num_kv_heads;
    const bool grouped = kv != 0 && kv != h && h % kv == 0 && d->qk % h == 0 && d->vd % h == 0;
    d->h = h;
    d->kv_qk = grouped ? d->qk / h * kv : d->qk, d->kv_vd = grouped ? d->vd / h * kv : d->vd;
    if (*key == NULL)
        *key = query;
    if (*value == NULL)
        *value = *key;
    if ((*key == query && d->kdim != e) || (*value == *key && d->vdim != d->kdim))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: key/value omitted (self-attention) but kdim/vdim differ from "
                            "embed_dim",
                            op);
    if ((*key == query || *value == query) && d->lk != d->lq)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: key or value is the query but seq_k=%zu != seq_q=%zu", op, d->lk,
                            d->lq);
    if (desc->layout != CLATTN_LAYOUT_XW && desc->layout != CLATTN_LAYOUT_TORCH)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: layout=%d is not a clattn_weight_layout", op,
                            (int)desc->layout);
    return CLATTN_SUCCESS;
}

/* The MHA plan's descriptor and tensor layouts for the host call (buffers are staged after
 * the plan validated them); params lists the weights and biases with their tensors. */
static void mha_host_plan(const clattn_mha_host_desc *desc,
                          const clattn_mha_host_weights *weights, const clattn_host_masks *masks,
                          const mha_host_dims *d, clattn_mha_desc *md, clattn_tensors *t,
                          host_param params[MHA_HOST_PARAMS])
{
    const size_t e = d->e, b = d->b, lq = d->lq, lk = d->lk;
    clattn_mha_desc_init(md);
    CLATTN_BIND_ROLES(*md, *t);
    t->q = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, b, lq, e, 0);
    t->k = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, b, lk, d->kdim, 0);
    t->v = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, b, lk, d->vdim, 0);
    t->out = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, b, lq, d->out_dim, 0);
    if (desc->need_weights == CLATTN_WEIGHTS_PER_HEAD)
        t->weights = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, b, desc->num_heads, lq, lk);
    else if (desc->need_weights == CLATTN_WEIGHTS_AVERAGED)
        t->weights = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, b, lq, lk, 0);
    /* Parameters: (d_in, d_out) for XW, (d_out, d_in) for TORCH. */
    const host_param table[MHA_HOST_PARAMS] = {
        {weights->in_proj_weight, &t->in_proj_weight, e, 3 * e},
        {weights->in_proj_bias, &t->in_proj_bias, 0, 3 * e},
        {weights->q_weight, &t->q_weight, e, d->qk},
        {weights->k_weight, &t->k_weight, d->kdim, d->kv_qk},
        {weights->v_weight, &t->v_weight, d->vdim, d->kv_vd},
        {weights->q_bias, &t->q_bias, 0, d->qk},
        {weights->k_bias, &t->k_bias, 0, d->kv_qk},
        {weights->v_bias, &t->v_bias, 0, d->kv_vd},
        {weights->out_weight, &t->out_weight, d->vd, e},
        {weights->out_bias, &t->out_bias, 0, e},
    };
    const bool torch = desc->layout == CLATTN_LAYOUT_TORCH;
    for (size_t i = 0; i < MHA_HOST_PARAMS; ++i) {
        const host_param *p = &params[i];
        params[i] = table[i];
        if (p->data == NULL)
            continue;
        if (p->d_in == 0)
            *p->tensor = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, p->d_out, 0, 0, 0);
        else if (torch || p->tensor == &t->in_proj_weight)
            *p->tensor = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, p->d_out, p->d_in, 0, 0);
        else
            *p->tensor = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, p->d_in, p->d_out, 0, 0);
    }
    mask_layouts(masks, b, d->h, lq, lk, desc->attn_mask_per_head != 0, t);
    md->num_heads = desc->num_heads;
    md->num_kv_heads = desc->num_kv_heads;
    md->layout = desc->layout;
    md->need_weights = desc->need_weights;
#define COPY(field) md->field = desc->field;
    CLATTN__SCORE_FIELDS(COPY)
#undef COPY
    md->rope = desc->rope;
    md->rope_style = desc->rope_style;
    md->rope_dims = desc->rope_dims;
    md->rope_base = desc->rope_base;
    md->rope_start = desc->rope_start;
}

/* Every given parameter into one staging buffer, one after another: packed on the host, then
 * one transfer; each tensor then points into it. */
static clattn_status stage_params(clattn_ctx *ctx, const char *op,
                                  const host_param params[MHA_HOST_PARAMS])
{
    size_t offsets[MHA_HOST_PARAMS] = {0}, total = 0, total_bytes = 0;
    bool overflow = false;
    for (size_t i = 0; i < MHA_HOST_PARAMS; ++i) {
        offsets[i] = total;
        /* Each size was checked by the plan; their sum was not. */
        if (params[i].data && !clattn__add(total, elems_of(params[i].tensor), &total))
            overflow = true;
    }
    if (overflow || !clattn__mul(total, sizeof(float), &total_bytes))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                            "%s: the weights and biases to stage overflow size_t together", op);
    clattn_tensor staged;
    float *packed = malloc((total ? total : 1) * sizeof(float));
    if (packed == NULL)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", op);
    for (size_t i = 0; i < MHA_HOST_PARAMS; ++i)
        if (params[i].data)
            memcpy(packed + offsets[i], params[i].data,
                   elems_of(params[i].tensor) * sizeof(float));
    clattn_status status = reserve(ctx, op, CLATTN_WS_HOST_W, total, sizeof(float));
    if (status == CLATTN_SUCCESS && total > 0)
        status = upload(ctx, op, CLATTN_WS_HOST_W, 0, packed, total, sizeof(float), &staged);
    free(packed);
    for (size_t i = 0; i < MHA_HOST_PARAMS && status == CLATTN_SUCCESS; ++i)
        if (params[i].data) {
            params[i].tensor->mem = ctx->workspace[CLATTN_WS_HOST_W];
            params[i].tensor->offset = offsets[i];
        }
    return status;
}

/* The inputs: self-attention uploads once, so that the plan can project q, k, v together. */
static clattn_status stage_inputs(clattn_ctx *ctx, const char *op, const float *query,
                                  const float *key, const float *value, clattn_tensors *t)
{
    clattn_status status = stage(ctx, op, CLATTN_WS_HOST_IN0, query, &t->q);
    if (status == CLATTN_SUCCESS && key == query)
        t->k.mem = t->q.mem;
    else if (status == CLATTN_SUCCESS)
        status = stage(ctx, op, CLATTN_WS_HOST_IN1, key, &t->k);
    if (status == CLATTN_SUCCESS && (value == query || value == key))
        t->v.mem = value == query ? t->q.mem : t->k.mem;
    else if (status == CLATTN_SUCCESS)
        status = stage(ctx, op, CLATTN_WS_HOST_IN2, value, &t->v);
    return status;
}

clattn_status clattn_mha_forward_host(clattn_ctx *ctx, const clattn_mha_host_desc *desc,
                                      const clattn_mha_host_weights *weights, const float *query,
                                      const float *key, const float *value,
                                      const clattn_host_masks *masks, float *out,
                                      float *attn_weights)
{
    static const char op[] = "mha_forward";
    clattn_mha_host_desc full;
    clattn_status status = clattn__create_entry(ctx, op, desc, true, &mha_host_desc, &full);
    mha_host_dims d;
    memset(&d, 0, sizeof d);
    if (status == CLATTN_SUCCESS)
        status = check_mha_host(ctx, op, &full, weights, query, &key, &value, out, attn_weights,
                                &d);
    if (status != CLATTN_SUCCESS)
        return status;
    clattn_mha_desc md;
    clattn_tensors tensors = {0};
    host_param params[MHA_HOST_PARAMS];
    mha_host_plan(&full, weights, masks, &d, &md, &tensors, params);
    clattn_plan *plan = NULL;
    if ((status = clattn_mha_plan_create(ctx, &md, &plan)))
        return clattn__end_message(ctx, op, status);
    if ((status = stage_params(ctx, op, params)) == CLATTN_SUCCESS &&
        (status = stage_inputs(ctx, op, query, key, value, &tensors)) == CLATTN_SUCCESS) {
        const size_t bhqk[4] = {d.b, d.h, d.lq, d.lk};
        status = run_and_read(ctx, op, plan, masks, bhqk, full.attn_mask_per_head != 0, &tensors,
                              out, attn_weights);
    }
    clattn_plan_release(plan);
    return clattn__end_message(ctx, op, status);
}
