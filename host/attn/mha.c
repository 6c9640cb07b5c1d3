/* Multi-head attention plans: projections into the workspace, attention on head views of the
 * projections (no split or concat copies), the output projection from the heads' view. */
#include "plan.h"

#include <float.h>
#include <math.h>
#include <string.h>

typedef struct mha_dims {
    size_t batch, seq_q, seq_k, embed, kdim, vdim, qk_dim, v_dim, out_dim, heads;
    size_t kv_heads, kv_qk_dim, kv_v_dim; /* k/v heads and the k, v projections' widths */
} mha_dims;

/* A weight matrix's (d_in, d_out) as the caller stores it in `layout`. */
static void weight_dims(bool trans, size_t d_in, size_t d_out, size_t *dims)
{
    dims[0] = trans ? d_out : d_in;
    dims[1] = trans ? d_in : d_out;
}

static clattn_status check_weight(clattn_plan *plan, int role, const char *name, bool trans,
                                  size_t d_in, size_t d_out, bool required)
{
    clattn_ctx *ctx = plan->ctx;
    const clattn__layout *l = &plan->layouts[role];
    if (!l->present)
        return required ? clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                       "%s: %s is required (rank 0 given)", plan->op, name)
                        : CLATTN_SUCCESS;
    size_t dims[2];
    weight_dims(trans, d_in, d_out, dims);
    clattn_status status =
        clattn__layout_expect(ctx, plan->op, name, l, 2, dims,
                              trans ? "(d_out, d_in) for layout TORCH" : "(d_in, d_out) for layout XW");
    return status ? status : clattn__expect_unit_stride(plan, name, l, "last dim");
}

static clattn_status check_bias(clattn_plan *plan, int role, const char *name, size_t n)
{
    clattn_ctx *ctx = plan->ctx;
    const clattn__layout *l = &plan->layouts[role];
    if (!l->present)
        return CLATTN_SUCCESS;
    clattn_status status = clattn__layout_expect(ctx, plan->op, name, l, 1, &n, "");
    if (status == CLATTN_SUCCESS && (l->dtype != CLATTN_DTYPE_F32 || l->strides[0] != 1))
        status = clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                              "%s: %s must be packed F32 (got %s, stride %zu)", plan->op, name,
                              clattn__dtype_name(l->dtype), l->strides[0]);
    return status;
}

static clattn_status prepare_projection(clattn_plan *plan, const clattn__layout *input,
                                        const clattn__layout *weight, size_t rows_per_batch,
                                        size_t n, bool has_bias, clattn_dtype out_dtype,
                                        bool input_flat, clattn__matmul_plan *mm)
{
    return clattn__projection_prepare(plan->ctx, input, weight, plan->mha.batch, rows_per_batch, n,
                                      plan->mha.trans_w, has_bias, out_dtype, input_flat, mm);
}

static clattn_status check_input(clattn_plan *plan, int role, const char *what, size_t batch,
                                 size_t seq)
{
    const clattn__layout *l = &plan->layouts[role];
    static const char *const names[4] = {"query", "key", "value", "out"};
    if (!l->present || l->rank != 3)
        return clattn__fail(plan->ctx, l->present ? CLATTN_ERR_INVALID_SHAPE
                                                  : CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: %s must be a rank-3 tensor %s, got rank %d", plan->op,
                            names[role], what, l->rank);
    if (l->dims[0] != batch || l->dims[1] != seq) {
        char got[96];
        clattn__format_dims(got, sizeof got, l->rank, l->dims);
        return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: %s has dims %s, expected %s with batch=%zu, seq=%zu", plan->op,
                            names[role], got, what, batch, seq);
    }
    return clattn__expect_unit_stride(plan, names[role], l, "features");
}

static clattn_status prepare_rope(clattn_plan *plan, const clattn_mha_desc *desc);

/* The layout and need_weights fields, then query, key and value (rank 3, one batch, unit
 * feature stride) and the head counts into *d. */
static clattn_status check_inputs(clattn_plan *plan, const clattn_mha_desc *desc, mha_dims *d)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    if (desc->layout != CLATTN_LAYOUT_XW && desc->layout != CLATTN_LAYOUT_TORCH)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: layout=%d is not a clattn_weight_layout", op, (int)desc->layout);
    if (desc->need_weights != CLATTN_WEIGHTS_NONE && desc->need_weights != CLATTN_WEIGHTS_PER_HEAD &&
        desc->need_weights != CLATTN_WEIGHTS_AVERAGED)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: need_weights=%d is not a clattn_need_weights", op,
                            (int)desc->need_weights);
    plan->mha.trans_w = desc->layout == CLATTN_LAYOUT_TORCH;
    plan->mha.need_weights = desc->need_weights;
    if (!l[R_Q].present || l[R_Q].rank != 3)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: query must be a rank-3 tensor (batch, seq_q, embed_dim), got "
                            "rank %d",
                            op, l[R_Q].rank);
    d->batch = l[R_Q].dims[0], d->seq_q = l[R_Q].dims[1], d->embed = l[R_Q].dims[2];
    d->seq_k = l[R_K].present && l[R_K].rank == 3 ? l[R_K].dims[1] : 0;
    d->kdim = l[R_K].present && l[R_K].rank == 3 ? l[R_K].dims[2] : 0;
    d->vdim = l[R_V].present && l[R_V].rank == 3 ? l[R_V].dims[2] : 0;
    clattn_status status;
    if ((status = check_input(plan, R_Q, "(batch, seq_q, embed_dim)", d->batch, d->seq_q)) ||
        (status = check_input(plan, R_K, "(batch, seq_k, kdim)", d->batch, d->seq_k)) ||
        (status = check_input(plan, R_V, "(batch, seq_k, vdim)", d->batch, d->seq_k)))
        return status;
    d->heads = desc->num_heads;
    if (d->heads == 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: num_heads=0: every dimension must be at least 1", op);
    d->kv_heads = desc->num_kv_heads == CLATTN_KV_HEADS_ALL ? d->heads : desc->num_kv_heads;
    if (d->kv_heads == 0 || d->heads % d->kv_heads != 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: num_kv_heads=%zu must divide num_heads=%zu (grouped-query "
                            "attention: query head h attends with k/v head "
                            "h / (num_heads / num_kv_heads))",
                            op, d->kv_heads, d->heads);
    return CLATTN_SUCCESS;
}

/* PyTorch's packed in_proj_weight (3E, E) and in_proj_bias: the projected widths are E. */
static clattn_status check_packed_weights(clattn_plan *plan, mha_dims *d)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    if (d->kv_heads != d->heads)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: num_kv_heads=%zu with in_proj_weight: grouped-query projections "
                            "need separate q/k/v weights (in_proj_weight packs three E x E "
                            "matrices)",
                            op, d->kv_heads);
    if (!plan->mha.trans_w)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: in_proj_weight is PyTorch's packed (3E, E) matrix: it needs "
                            "layout TORCH",
                            op);
    for (int role = R_QW; role <= R_VB; ++role)
        if (l[role].present)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: give in_proj_weight/in_proj_bias or the separate q/k/v "
                                "weights and biases, not both",
                                op);
    if (d->kdim != d->embed || d->vdim != d->embed)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: in_proj_weight needs kdim = vdim = embed_dim = %zu (got "
                            "kdim=%zu, vdim=%zu)",
                            op, d->embed, d->kdim, d->vdim);
    d->qk_dim = d->v_dim = d->kv_qk_dim = d->kv_v_dim = d->embed;
    const size_t in_dims[2] = {3 * d->embed, d->embed}, bias_dim = 3 * d->embed;
    clattn_status status;
    if ((status = clattn__layout_expect(ctx, op, "in_proj_weight", &l[R_IN_W], 2, in_dims,
                                        "(3 * embed_dim, embed_dim)")) ||
        (status = check_bias(plan, R_IN_B, "in_proj_bias", bias_dim)))
        return status;
    return clattn__expect_unit_stride(plan, "in_proj_weight", &l[R_IN_W], "last dim");
}

/* The separate q_weight, k_weight, v_weight and their biases: the projected widths come from
 * the weights' output dims (q_weight's is qk_dim, v_weight's the k/v heads' width). */
static clattn_status check_separate_weights(clattn_plan *plan, mha_dims *d)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    const bool trans = plan->mha.trans_w;
    if (l[R_IN_B].present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: in_proj_bias goes with in_proj_weight", op);
    if (!l[R_QW].present || !l[R_KW].present || !l[R_VW].present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: q_weight, k_weight and v_weight are required (or "
                            "in_proj_weight)",
                            op);
    const int out_axis = trans ? 0 : 1;
    d->qk_dim = l[R_QW].rank == 2 ? l[R_QW].dims[out_axis] : 0;
    d->kv_v_dim = l[R_VW].rank == 2 ? l[R_VW].dims[out_axis] : 0;
    if (d->kv_heads != d->heads && (d->qk_dim % d->heads != 0 || d->kv_v_dim % d->kv_heads != 0))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: q_weight's %zu outputs must be divisible by num_heads=%zu "
                            "and v_weight's %zu by num_kv_heads=%zu",
                            op, d->qk_dim, d->heads, d->kv_v_dim, d->kv_heads);
    d->kv_qk_dim = d->qk_dim / d->heads * d->kv_heads;
    d->v_dim = d->kv_v_dim / d->kv_heads * d->heads;
    if (d->kv_heads == d->heads)
        d->kv_qk_dim = d->qk_dim, d->v_dim = d->kv_v_dim;
    clattn_status status;
    if ((status = check_weight(plan, R_QW, "q_weight", trans, d->embed, d->qk_dim, true)) ||
        (status = check_weight(plan, R_KW, "k_weight", trans, d->kdim, d->kv_qk_dim, true)) ||
        (status = check_weight(plan, R_VW, "v_weight", trans, d->vdim, d->kv_v_dim, true)) ||
        (status = check_bias(plan, R_QB, "q_bias", d->qk_dim)) ||
        (status = check_bias(plan, R_KB, "k_bias", d->kv_qk_dim)))
        return status;
    return check_bias(plan, R_VB, "v_bias", d->kv_v_dim);
}

/* The heads' widths, the output projection, out and the weights asked for. */
static clattn_status check_outputs(clattn_plan *plan, const clattn_mha_desc *desc, mha_dims *d)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    clattn__mha *m = &plan->mha;
    clattn_status status;
    if (d->qk_dim % d->heads != 0 || d->v_dim % d->heads != 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: qk_dim=%zu and v_dim=%zu must be divisible by num_heads=%zu", op,
                            d->qk_dim, d->v_dim, d->heads);
    m->has_out_proj = l[R_OW].present;
    d->out_dim = d->v_dim;
    if (m->has_out_proj) {
        d->out_dim = l[R_OW].rank == 2 ? l[R_OW].dims[m->trans_w ? 0 : 1] : 0;
        if ((status = check_weight(plan, R_OW, "out_weight", m->trans_w, d->v_dim, d->out_dim,
                                   true)) ||
            (status = check_bias(plan, R_OB, "out_bias", d->out_dim)))
            return status;
    } else if (l[R_OB].present) {
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: out_bias goes with out_weight",
                            op);
    }
    if (!l[R_OUT].present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: out is required", op);
    const size_t out_dims[3] = {d->batch, d->seq_q, d->out_dim};
    if ((status = clattn__layout_expect(ctx, op, "out", &l[R_OUT], 3, out_dims,
                                        "(batch, seq_q, out_dim)")))
        return status;
    const bool want_weights = desc->need_weights != CLATTN_WEIGHTS_NONE;
    if (want_weights != l[R_WEIGHTS].present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: weights is %s but need_weights=%d", op,
                            l[R_WEIGHTS].present ? "given" : "absent", (int)desc->need_weights);
    if (!want_weights)
        return CLATTN_SUCCESS;
    const size_t per_head[4] = {d->batch, d->heads, d->seq_q, d->seq_k};
    const size_t averaged[3] = {d->batch, d->seq_q, d->seq_k};
    status = desc->need_weights == CLATTN_WEIGHTS_AVERAGED
                 ? clattn__layout_expect(ctx, op, "weights", &l[R_WEIGHTS], 3, averaged,
                                         "(batch, seq_q, seq_k)")
                 : clattn__layout_expect(ctx, op, "weights", &l[R_WEIGHTS], 4, per_head,
                                         "(batch, num_heads, seq_q, seq_k)");
    if (status == CLATTN_SUCCESS && l[R_WEIGHTS].strides[l[R_WEIGHTS].rank - 1] != 1)
        status = clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                              "%s: weights must have stride 1 along seq_k", op);
    return status;
}

/* Workspace: the projections q | k | v one after another (so that a packed self-attention
 * projection (B*L, 3E) is the same region), the concatenated heads, per-head weights; *cursor
 * is then the end. */
static clattn_status plan_workspace(clattn_plan *plan, const mha_dims *d, size_t *cursor)
{
    clattn__mha *m = &plan->mha;
    size_t q_size, k_size, v_size, concat = 0, scores = 0;
    if (!clattn__product(&q_size, 3, d->batch, d->seq_q, d->qk_dim) ||
        !clattn__product(&k_size, 3, d->batch, d->seq_k, d->kv_qk_dim) ||
        !clattn__product(&v_size, 3, d->batch, d->seq_k, d->kv_v_dim) ||
        (m->has_out_proj && !clattn__product(&concat, 3, d->batch, d->seq_q, d->v_dim)) ||
        (m->need_weights == CLATTN_WEIGHTS_AVERAGED &&
         !clattn__product(&scores, 4, d->batch, d->heads, d->seq_q, d->seq_k)))
        return clattn__fail(plan->ctx, CLATTN_ERR_OVERFLOW,
                            "%s: the projections' sizes overflow size_t", plan->op);
    m->q_at = 0;
    m->k_at = q_size;
    m->v_at = q_size + k_size;
    if (!clattn__add(m->v_at, v_size, cursor))
        return clattn__fail(plan->ctx, CLATTN_ERR_OVERFLOW, "%s: the workspace overflows size_t",
                            plan->op);
    m->concat_at = *cursor;
    m->weights_at = *cursor + concat;
    if (!clattn__add(*cursor, concat, cursor) || !clattn__add(*cursor, scores, cursor))
        return clattn__fail(plan->ctx, CLATTN_ERR_OVERFLOW, "%s: the workspace overflows size_t",
                            plan->op);
    return CLATTN_SUCCESS;
}

/* The input projections (and PyTorch's packed self-attention one) and the output's. */
static clattn_status prepare_projections(clattn_plan *plan, const mha_dims *d)
{
    const clattn__layout *l = plan->layouts;
    clattn__mha *m = &plan->mha;
    const bool flat_q = clattn__rows_flatten(&l[R_Q]), flat_k = clattn__rows_flatten(&l[R_K]);
    const bool flat_v = clattn__rows_flatten(&l[R_V]);
    const clattn__layout *wq = m->packed_in_proj ? &l[R_IN_W] : &l[R_QW];
    const clattn__layout *wk = m->packed_in_proj ? &l[R_IN_W] : &l[R_KW];
    const clattn__layout *wv = m->packed_in_proj ? &l[R_IN_W] : &l[R_VW];
    const bool bias_q = m->packed_in_proj ? l[R_IN_B].present : l[R_QB].present;
    const bool bias_k = m->packed_in_proj ? l[R_IN_B].present : l[R_KB].present;
    const bool bias_v = m->packed_in_proj ? l[R_IN_B].present : l[R_VB].present;
    clattn_status status;
    if ((status = prepare_projection(plan, &l[R_Q], wq, d->seq_q, d->qk_dim, bias_q,
                                     CLATTN_DTYPE_F32, flat_q, &m->q_proj)) ||
        (status = prepare_projection(plan, &l[R_K], wk, d->seq_k, d->kv_qk_dim, bias_k,
                                     CLATTN_DTYPE_F32, flat_k, &m->k_proj)) ||
        (status = prepare_projection(plan, &l[R_V], wv, d->seq_k, d->kv_v_dim, bias_v,
                                     CLATTN_DTYPE_F32, flat_v, &m->v_proj)))
        return status;
    if (m->packed_in_proj && d->seq_q == d->seq_k &&
        (status = prepare_projection(plan, &l[R_Q], &l[R_IN_W], d->seq_q, 3 * d->embed, bias_q,
                                     CLATTN_DTYPE_F32, flat_q, &m->qkv_proj)))
        return status;
    if (!m->has_out_proj)
        return CLATTN_SUCCESS;
    clattn__layout concat_layout = {
        .present = true,
        .dtype = CLATTN_DTYPE_F32,
        .rank = 3,
        .dims = {d->batch, d->seq_q, d->v_dim},
        .strides = {d->seq_q * d->v_dim, d->v_dim, 1},
    };
    const bool flat_out = clattn__rows_flatten(&l[R_OUT]);
    return prepare_projection(plan, &concat_layout, &l[R_OW], d->seq_q, d->out_dim,
                              l[R_OB].present, l[R_OUT].dtype, flat_out, &m->out_proj);
}

/* The score rule and the attention steps on the heads (and the weights' mean over heads),
 * reserving workspace from *cursor on. */
static clattn_status prepare_attention(clattn_plan *plan, const clattn_mha_desc *desc,
                                       const mha_dims *d, size_t *cursor)
{
    clattn__mha *m = &plan->mha;
    clattn__score_shape score;
    memset(&score, 0, sizeof score);
    clattn_status status;
    if ((status = clattn__plan_score(plan, desc->scale, desc->norm, m->head_dim_qk, &score)) ||
        (status = clattn__plan_masks(plan, d->batch, d->heads, d->seq_q, d->seq_k, &score)) ||
        (status = clattn__plan_alibi(plan, &score)) ||
        (status = clattn__plan_sinks(plan, &score)) ||
        (status = clattn__plan_band(plan, desc->causal, desc->window_align, desc->window_left,
                                    desc->window_right, -1, 0, &score)))
        return status;
    if (!(desc->softcap >= 0.0f && desc->softcap <= FLT_MAX))
        return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: softcap=%g: must be 0 (off) or a finite positive cap", plan->op,
                            (double)desc->softcap);
    score.softcap = desc->softcap;
    score.kv_group = d->heads / d->kv_heads;
    const clattn_dtype heads_out =
        m->has_out_proj ? CLATTN_DTYPE_F32 : plan->layouts[R_OUT].dtype;
    if ((status = clattn__attention_prepare(
             plan, &score, m->head_dim_qk, m->head_dim_v, CLATTN_DTYPE_F32, CLATTN_DTYPE_F32,
             CLATTN_DTYPE_F32, heads_out, m->need_weights != CLATTN_WEIGHTS_NONE, false,
             desc->path, cursor)))
        return status;
    if (m->need_weights == CLATTN_WEIGHTS_AVERAGED)
        return clattn__mean_heads_prepare(plan->ctx, d->batch, d->heads, d->seq_q, d->seq_k,
                                          &m->mean);
    return CLATTN_SUCCESS;
}

static clattn_status create(clattn_plan *plan, const void *any)
{
    const clattn_mha_desc *desc = any;
    clattn__mha *m = &plan->mha;
    mha_dims d;
    memset(&d, 0, sizeof d);
    size_t cursor = 0;
    clattn_status status;
    m->packed_in_proj = plan->layouts[R_IN_W].present;
    if ((status = check_inputs(plan, desc, &d)) ||
        (status = m->packed_in_proj ? check_packed_weights(plan, &d)
                                    : check_separate_weights(plan, &d)) ||
        (status = check_outputs(plan, desc, &d)))
        return status;
    m->batch = d.batch, m->seq_q = d.seq_q, m->seq_k = d.seq_k, m->heads = d.heads;
    m->qk_dim = d.qk_dim, m->v_dim = d.v_dim;
    m->head_dim_qk = d.qk_dim / d.heads, m->head_dim_v = d.v_dim / d.heads;
    m->kv_heads = d.kv_heads, m->kv_qk_dim = d.kv_qk_dim, m->kv_v_dim = d.kv_v_dim;
    if ((status = plan_workspace(plan, &d, &cursor)) ||
        (status = prepare_projections(plan, &d)) ||
        (status = prepare_attention(plan, desc, &d, &cursor)) ||
        (status = prepare_rope(plan, desc)))
        return status;
    /* The projections' matmul scratch (a transposed weight on CPUs) after everything else. */
    size_t scratch = 0;
    const clattn__matmul_plan *mms[5] = {&m->q_proj, &m->k_proj, &m->v_proj, &m->qkv_proj,
                                         &m->out_proj};
    for (int i = 0; i < 5; ++i)
        if (mms[i]->scratch_floats > scratch)
            scratch = mms[i]->scratch_floats;
    return clattn__finish_projections(plan, cursor, scratch, &m->scratch_at);
}

/* Rotary embeddings on the projected q and k (desc->rope): validated, angles made, the two
 * in-place rotations prepared. */
static clattn_status prepare_rope(clattn_plan *plan, const clattn_mha_desc *desc)
{
    clattn__mha *m = &plan->mha;
    const clattn__rope_fields fields = {desc->rope, desc->rope_style, desc->rope_dims,
                                        desc->rope_base, desc->rope_start};
    const size_t longest = m->seq_q > m->seq_k ? m->seq_q : m->seq_k;
    clattn__rope_shape shape;
    clattn_status status =
        clattn__rope_fields_prepare(plan, &fields, m->head_dim_qk, longest, &m->rope, &shape);
    if (status != CLATTN_SUCCESS || !m->rope)
        return status;
    shape.batch = m->batch;
    shape.heads = m->heads;
    shape.seq = m->seq_q;
    if ((status = clattn__rope_prepare(plan->ctx, &shape, CLATTN_DTYPE_F32, CLATTN_DTYPE_F32,
                                       CLATTN_DTYPE_F32, &m->rope_q)))
        return status;
    shape.heads = m->kv_heads;
    shape.seq = m->seq_k;
    return clattn__rope_prepare(plan->ctx, &shape, CLATTN_DTYPE_F32, CLATTN_DTYPE_F32,
                                CLATTN_DTYPE_F32, &m->rope_k);
}

/* ---------------------------------------------------------------------------------------------
 * Execution
 * ------------------------------------------------------------------------------------------- */

/* A matrix (rows, cols) with row stride ld at offset, broadcast over batches. */
static clattn__view matrix_view(cl_mem mem, size_t offset, clattn_dtype dtype, size_t rows,
                                size_t cols, size_t ld)
{
    clattn__view v = {.mem = mem, .offset = offset, .dtype = dtype};
    v.dims[0] = v.dims[1] = 1;
    v.dims[2] = rows, v.strides[2] = ld;
    v.dims[3] = cols, v.strides[3] = 1;
    return v;
}

/* Heads of a (batch, seq, heads * head_dim) region with row stride `ld`: the (batch, heads,
 * seq, head_dim) view, no copy. */
static clattn__view heads_view(cl_mem mem, size_t offset, clattn_dtype dtype, size_t batch,
                               size_t heads, size_t seq, size_t head_dim, size_t batch_stride,
                               size_t ld, size_t col_stride)
{
    clattn__view v = {.mem = mem, .offset = offset, .dtype = dtype};
    v.dims[0] = batch, v.strides[0] = batch_stride;
    v.dims[1] = heads, v.strides[1] = head_dim * col_stride;
    v.dims[2] = seq, v.strides[2] = ld;
    v.dims[3] = head_dim, v.strides[3] = col_stride;
    return v;
}

/* A packed (1, batch, seq, width) region of the workspace. */
static clattn__view batch_rows(cl_mem mem, size_t offset, size_t batch, size_t seq, size_t width)
{
    clattn__view v = {.mem = mem, .offset = offset, .dtype = CLATTN_DTYPE_F32};
    v.dims[0] = 1;
    v.dims[1] = batch, v.strides[1] = seq * width;
    v.dims[2] = seq, v.strides[2] = width;
    v.dims[3] = width, v.strides[3] = 1;
    return v;
}

/* A stored weight matrix, or `rows` of its rows from `first_row` on (rows 0: all). */
static clattn__view bound_matrix(const clattn__layout *l, cl_mem mem, size_t offset,
                                 size_t first_row, size_t rows)
{
    return matrix_view(mem, offset + first_row * l->strides[0], l->dtype,
                       rows ? rows : l->dims[0], l->dims[1], l->strides[0]);
}

static clattn__view bias_view(cl_mem mem, size_t offset, size_t n)
{
    return matrix_view(mem, offset, CLATTN_DTYPE_F32, 1, n, n);
}

static clattn_status mha_execute(clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                                 cl_mem workspace, clattn_chain *chain)
{
    const clattn__layout *l = plan->layouts;
    const clattn__mha *m = &plan->mha;
    const clattn__scratch scratch = {workspace, m->scratch_at};
    const size_t b = m->batch, lq = m->seq_q, lk = m->seq_k, h = m->heads;
    const size_t dk = m->head_dim_qk, dv = m->head_dim_v, e = m->qk_dim;
    const clattn__view none = {0};
    clattn_status status = CLATTN_SUCCESS;

    /* Self-attention with PyTorch's packed weights: one (B*L, 3E) projection. */
    const bool self_packed = m->packed_in_proj && lq == lk && mems[R_Q] == mems[R_K] &&
                             mems[R_Q] == mems[R_V] && offsets[R_Q] == offsets[R_K] &&
                             offsets[R_Q] == offsets[R_V] &&
                             memcmp(&l[R_Q], &l[R_K], sizeof l[R_Q]) == 0 &&
                             memcmp(&l[R_Q], &l[R_V], sizeof l[R_Q]) == 0;
    const bool flat_q = clattn__rows_flatten(&l[R_Q]), flat_k = clattn__rows_flatten(&l[R_K]);
    const bool flat_v = clattn__rows_flatten(&l[R_V]);
    size_t q_at = m->q_at, k_at = m->k_at, v_at = m->v_at, q_ld = e, kv_ld = m->kv_qk_dim;
    size_t v_ld = m->kv_v_dim;
    if (self_packed) {
        const clattn__view x = clattn__rows_view(&l[R_Q], mems[R_Q], offsets[R_Q], flat_q);
        const clattn__view w = bound_matrix(&l[R_IN_W], mems[R_IN_W], offsets[R_IN_W], 0, 3 * e);
        const clattn__view bias =
            l[R_IN_B].present ? bias_view(mems[R_IN_B], offsets[R_IN_B], 3 * e) : none;
        const clattn__view y =
            flat_q ? matrix_view(workspace, m->q_at, CLATTN_DTYPE_F32, b * lq, 3 * e, 3 * e)
                   : batch_rows(workspace, m->q_at, b, lq, 3 * e);
        status = clattn__matmul_enqueue(chain, &m->qkv_proj, &x, &w, &bias, &y, 1.0f,
                                                     0.0f, scratch);
        q_at = m->q_at, k_at = m->q_at + e, v_at = m->q_at + 2 * e;
        q_ld = kv_ld = v_ld = 3 * e;
    } else {
        const int roles[3] = {R_Q, R_K, R_V};
        const int weights[3] = {R_QW, R_KW, R_VW}, biases[3] = {R_QB, R_KB, R_VB};
        const size_t seqs[3] = {lq, lk, lk}, widths[3] = {e, m->kv_qk_dim, m->kv_v_dim};
        const size_t at[3] = {m->q_at, m->k_at, m->v_at};
        const bool flat[3] = {flat_q, flat_k, flat_v};
        const clattn__matmul_plan *mms[3] = {&m->q_proj, &m->k_proj, &m->v_proj};
        for (int i = 0; i < 3 && status == CLATTN_SUCCESS; ++i) {
            const int r = roles[i];
            const clattn__view x = clattn__rows_view(&l[r], mems[r], offsets[r], flat[i]);
            clattn__view w, bias = none;
            if (m->packed_in_proj) {
                w = bound_matrix(&l[R_IN_W], mems[R_IN_W], offsets[R_IN_W], (size_t)i * e, e);
                if (l[R_IN_B].present)
                    bias = bias_view(mems[R_IN_B], offsets[R_IN_B] + (size_t)i * e, e);
            } else {
                w = bound_matrix(&l[weights[i]], mems[weights[i]], offsets[weights[i]], 0,
                                 0);
                if (l[biases[i]].present)
                    bias = bias_view(mems[biases[i]], offsets[biases[i]], widths[i]);
            }
            const clattn__view y =
                flat[i] ? matrix_view(workspace, at[i], CLATTN_DTYPE_F32, b * seqs[i], widths[i],
                                      widths[i])
                        : batch_rows(workspace, at[i], b, seqs[i], widths[i]);
            status = clattn__matmul_enqueue(chain, mms[i], &x, &w, &bias, &y, 1.0f,
                                                         0.0f, scratch);
        }
    }
    if (status != CLATTN_SUCCESS)
        return status;

    /* Attention on head views of the projections; it writes the heads where the output
     * projection reads them (or straight into out). */
    clattn__attention_io io = {
        .q = heads_view(workspace, q_at, CLATTN_DTYPE_F32, b, h, lq, dk, lq * q_ld, q_ld, 1),
        .k = heads_view(workspace, k_at, CLATTN_DTYPE_F32, b, m->kv_heads, lk, dk, lk * kv_ld,
                        kv_ld, 1),
        .v = heads_view(workspace, v_at, CLATTN_DTYPE_F32, b, m->kv_heads, lk, dv, lk * v_ld, v_ld,
                        1),
        .masks = clattn__bound_masks(plan, mems, offsets),
    };
    if (m->rope) { /* rotate the projected q and k heads in place */
        clattn__rope_io rope = {.x = io.q, .out = io.q, .freq = plan->angles.freq};
        if (plan->angles.table)
            clattn__angle_views(plan, &rope.cos, &rope.sin);
        if ((status = clattn__rope_enqueue(chain, &m->rope_q, &rope)))
            return status;
        rope.x = rope.out = io.k;
        if ((status = clattn__rope_enqueue(chain, &m->rope_k, &rope)))
            return status;
    }
    if (m->has_out_proj)
        io.out = heads_view(workspace, m->concat_at, CLATTN_DTYPE_F32, b, h, lq, dv,
                            lq * m->v_dim, m->v_dim, 1);
    else
        io.out = heads_view(mems[R_OUT], offsets[R_OUT], l[R_OUT].dtype, b, h, lq, dv,
                            l[R_OUT].strides[0], l[R_OUT].strides[1], l[R_OUT].strides[2]);
    if (m->need_weights == CLATTN_WEIGHTS_PER_HEAD) {
        clattn__view_of(&l[R_WEIGHTS], &io.weights);
        io.weights.mem = mems[R_WEIGHTS];
        io.weights.offset = offsets[R_WEIGHTS];
    } else if (m->need_weights == CLATTN_WEIGHTS_AVERAGED) {
        io.weights = (clattn__view){
            .mem = workspace,
            .offset = m->weights_at,
            .dtype = CLATTN_DTYPE_F32,
            .dims = {b, h, lq, lk},
            .strides = {h * lq * lk, lq * lk, lk, 1},
        };
    }
    if ((status = clattn__attention_enqueue(plan, &io, workspace, chain)))
        return status;
    if (m->need_weights == CLATTN_WEIGHTS_AVERAGED) {
        clattn__view dst;
        clattn__view_of(&l[R_WEIGHTS], &dst);
        dst.mem = mems[R_WEIGHTS];
        dst.offset = offsets[R_WEIGHTS];
        if ((status = clattn__mean_heads_enqueue(chain, &m->mean, &io.weights, &dst)))
            return status;
    }
    if (!m->has_out_proj)
        return CLATTN_SUCCESS;
    const bool flat_out = clattn__rows_flatten(&l[R_OUT]);
    const clattn__view concat =
        flat_out ? matrix_view(workspace, m->concat_at, CLATTN_DTYPE_F32, b * lq, m->v_dim, m->v_dim)
                 : batch_rows(workspace, m->concat_at, b, lq, m->v_dim);
    const clattn__view w = bound_matrix(&l[R_OW], mems[R_OW], offsets[R_OW], 0, 0);
    const clattn__view bias =
        l[R_OB].present ? bias_view(mems[R_OB], offsets[R_OB], l[R_OB].dims[0]) : none;
    const clattn__view y = clattn__rows_view(&l[R_OUT], mems[R_OUT], offsets[R_OUT], flat_out);
    return clattn__matmul_enqueue(chain, &m->out_proj, &concat, &w, &bias, &y, 1.0f,
                                               0.0f, scratch);
}

/* The inputs, out, the masks, weights, the projections and ALiBi's slopes. */
#define MHA_ROLES                                                                                  \
    (CLATTN__ROLE(R_Q) | CLATTN__ROLE(R_K) | CLATTN__ROLE(R_V) | CLATTN__ROLE(R_OUT) |             \
     CLATTN__ROLE(R_MASK) | CLATTN__ROLE(R_KPM) | CLATTN__ROLE(R_WEIGHTS) | CLATTN__ROLE(R_IN_W) | \
     CLATTN__ROLE(R_IN_B) | CLATTN__ROLE(R_QW) | CLATTN__ROLE(R_KW) | CLATTN__ROLE(R_VW) |         \
     CLATTN__ROLE(R_QB) | CLATTN__ROLE(R_KB) | CLATTN__ROLE(R_VB) | CLATTN__ROLE(R_OW) |           \
     CLATTN__ROLE(R_OB) | CLATTN__ROLE(R_ALIBI) | CLATTN__ROLE(R_SINKS))

CLATTN__PLAN_KIND(mha, CLATTN__MHA, clattn_mha_desc, create, mha_execute,
                  clattn_mha_plan_create, "mha", clattn__mha_role_names, MHA_ROLES)
