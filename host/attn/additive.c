/* Additive (Bahdanau) attention plans: the projections P1 = q W1 + b1 and P2 = k W2 + b2 once
 * (the matmul), then the attention steps with the additive score on head views of them
 * (kernels/additive.cl's tiles on the unfused path, flash.cl's ADDITIVE variant fused). */
#include "plan.h"

#include <string.h>

void clattn_additive_desc_init(clattn_additive_desc *desc)
{
    if (clattn__desc_reset(desc, sizeof *desc))
        desc->num_heads = 1;
}

/* q, k, v or out as (batch, seq, features): rank 3, or rank 2 (seq, features) as batch 1. */
static clattn__layout as_rank3(const clattn__layout *l)
{
    clattn__layout r = *l;
    if (l->rank == 2) {
        r.rank = 3;
        r.dims[0] = 1, r.dims[1] = l->dims[0], r.dims[2] = l->dims[1];
        r.strides[0] = l->dims[0] * l->strides[0];
        r.strides[1] = l->strides[0], r.strides[2] = l->strides[1];
    }
    return r;
}

static clattn_status check_rows(clattn_plan *plan, int role, const char *name, int rank,
                                size_t batch, size_t seq, size_t features, const char *what)
{
    const clattn__layout *l = &plan->layouts[role];
    if (!l->present)
        return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is required", plan->op,
                            name);
    const size_t dims3[3] = {batch, seq, features}, dims2[2] = {seq, features};
    clattn_status status =
        clattn__layout_expect(plan->ctx, plan->op, name, l, rank, rank == 3 ? dims3 : dims2, what);
    return status ? status : clattn__expect_unit_stride(plan, name, l, "features");
}

/* W1 or W2: (d, H * da) or (H, d, da), stride 1 along da. Sets *per_head for rank 3. */
static clattn_status check_weight(clattn_plan *plan, int role, const char *name, size_t d_in,
                                  size_t heads, size_t da, bool *per_head)
{
    const clattn__layout *l = &plan->layouts[role];
    const size_t flat[2] = {d_in, heads * da}, split[3] = {heads, d_in, da};
    *per_head = l->rank == 3;
    clattn_status status =
        clattn__layout_expect(plan->ctx, plan->op, name, l, *per_head ? 3 : 2,
                              *per_head ? split : flat, "(d, heads * da) or (heads, d, da)");
    return status ? status : clattn__expect_unit_stride(plan, name, l, "last dim");
}

/* b1, b2 (packed F32 (H * da) or (H, da)) and w (F32, any strides). */
static clattn_status check_vector(clattn_plan *plan, int role, const char *name, size_t heads,
                                  size_t da, bool packed)
{
    const clattn__layout *l = &plan->layouts[role];
    if (!l->present)
        return CLATTN_SUCCESS;
    const size_t flat[1] = {heads * da}, split[2] = {heads, da};
    const bool rank2 = l->rank == 2;
    clattn_status status =
        clattn__layout_expect(plan->ctx, plan->op, name, l, rank2 ? 2 : 1, rank2 ? split : flat,
                              "(heads * da) or (heads, da)");
    if (status != CLATTN_SUCCESS)
        return status;
    const bool is_packed = l->strides[l->rank - 1] == 1 && (!rank2 || l->strides[0] == da);
    if (l->dtype != CLATTN_DTYPE_F32 || (packed && !is_packed))
        return clattn__fail(plan->ctx, CLATTN_ERR_UNSUPPORTED, "%s: %s must be %sF32 (got %s)",
                            plan->op, name, packed ? "packed " : "", clattn__dtype_name(l->dtype));
    return CLATTN_SUCCESS;
}

static clattn_status prepare_projection(clattn_plan *plan, const clattn__layout *input,
                                        const clattn__layout *weight, size_t seq, size_t n,
                                        bool has_bias, bool flat, clattn__matmul_plan *mm)
{
    return clattn__projection_prepare(plan->ctx, input, weight, plan->additive.batch, seq, n,
                                      false, has_bias, CLATTN_DTYPE_F32, flat, mm);
}

/* q, k, v and out: (batch, seq, features) all, or (seq, features) all; sets the plan's batch,
 * seq_q and seq_k and returns the feature widths dq, dk, dv. */
static clattn_status check_inputs(clattn_plan *plan, size_t *dq, size_t *dk, size_t *dv)
{
    const clattn__layout *l = plan->layouts;
    clattn__additive *a = &plan->additive;
    if (!l[R_Q].present || (l[R_Q].rank != 2 && l[R_Q].rank != 3))
        return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: q must be (batch, seq_q, dq) or (seq_q, dq), got rank %d",
                            plan->op, l[R_Q].rank);
    const int rank = l[R_Q].rank;
    const clattn__layout q = as_rank3(&l[R_Q]);
    a->batch = q.dims[0], a->seq_q = q.dims[1];
    *dq = q.dims[2];
    const bool k_ok = l[R_K].present && l[R_K].rank == rank;
    const bool v_ok = l[R_V].present && l[R_V].rank == rank;
    a->seq_k = k_ok ? l[R_K].dims[rank - 2] : 0;
    *dk = k_ok ? l[R_K].dims[rank - 1] : 0;
    *dv = v_ok ? l[R_V].dims[rank - 1] : 0;
    const char *kdims = rank == 3 ? "(batch, seq_k, dk), the rank of q" : "(seq_k, dk)";
    const char *vdims = rank == 3 ? "(batch, seq_k, dv), the rank of q" : "(seq_k, dv)";
    const char *odims = rank == 3 ? "(batch, seq_q, dv)" : "(seq_q, dv)";
    clattn_status status;
    if ((status = check_rows(plan, R_K, "k", rank, a->batch, a->seq_k, *dk, kdims)) ||
        (status = check_rows(plan, R_V, "v", rank, a->batch, a->seq_k, *dv, vdims)))
        return status;
    return check_rows(plan, R_OUT, "out", rank, a->batch, a->seq_q, *dv, odims);
}

static clattn_status create(clattn_plan *plan, const void *any)
{
    const clattn_additive_desc *desc = any;
    clattn__additive *a = &plan->additive;
    size_t dq = 0, dk = 0, dv = 0;
    clattn_status status = check_inputs(plan, &dq, &dk, &dv);
    if (status != CLATTN_SUCCESS)
        return status;
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    a->heads = desc->num_heads;
    if (a->heads == 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: num_heads=0: give at least 1 head (clattn_additive_desc_init "
                            "sets 1)",
                            op);
    if (dv % a->heads != 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: v's %zu columns must be divisible by num_heads=%zu (head h "
                            "takes columns h * dv / num_heads ..)",
                            op, dv, a->heads);
    a->head_dim_v = dv / a->heads;
    if (!l[R_QW].present || !l[R_KW].present || !l[R_SCORE_W].present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: q_weight (W1), k_weight (W2) and score_weight (w) are required",
                            op);
    /* da from W1: (dq, H * da) or (H, dq, da). */
    const clattn__layout *w1 = &l[R_QW];
    a->da = w1->rank == 3 ? w1->dims[2] : w1->rank == 2 ? w1->dims[1] / a->heads : 0;
    if (a->da == 0 || (w1->rank == 2 && w1->dims[1] % a->heads != 0))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: q_weight (W1) must be (dq, heads * da) or (heads, dq, da) with "
                            "heads=%zu",
                            op, a->heads);
    if ((status =
             check_weight(plan, R_QW, "q_weight (W1)", dq, a->heads, a->da, &a->per_head_w1)) ||
        (status =
             check_weight(plan, R_KW, "k_weight (W2)", dk, a->heads, a->da, &a->per_head_w2)) ||
        (status = check_vector(plan, R_QB, "q_bias (b1)", a->heads, a->da, true)) ||
        (status = check_vector(plan, R_KB, "k_bias (b2)", a->heads, a->da, true)) ||
        (status = check_vector(plan, R_SCORE_W, "score_weight (w)", a->heads, a->da, false)))
        return status;
    const bool want_weights = l[R_WEIGHTS].present;
    if (want_weights) {
        const size_t dims[4] = {a->batch, a->heads, a->seq_q, a->seq_k};
        if ((status = clattn__layout_expect(ctx, op, "weights", &l[R_WEIGHTS], 4, dims,
                                            "(batch, heads, seq_q, seq_k)")))
            return status;
        if (l[R_WEIGHTS].strides[3] != 1)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: weights must have stride 1 along seq_k", op);
    }

    /* Workspace: P1 (batch, seq_q, H * da), P2 (batch, seq_k, H * da), the attention's, then the
     * projections' matmul scratch. */
    size_t width = 0, p1 = 0, p2 = 0, cursor = 0;
    if (!clattn__mul(a->heads, a->da, &width) ||
        !clattn__product(&p1, 3, a->batch, a->seq_q, width) ||
        !clattn__product(&p2, 3, a->batch, a->seq_k, width) || !clattn__add(p1, p2, &cursor))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                            "%s: the projections (batch, seq, heads * da) overflow size_t", op);
    a->p1_at = 0, a->p2_at = p1;
    const clattn__layout q = as_rank3(&l[R_Q]), k = as_rank3(&l[R_K]);
    a->flat_q = clattn__rows_flatten(&q), a->flat_k = clattn__rows_flatten(&k);
    if ((status = prepare_projection(plan, &q, w1, a->seq_q, a->per_head_w1 ? a->da : width,
                                     l[R_QB].present, a->flat_q, &a->p1_proj)) ||
        (status = prepare_projection(plan, &k, &l[R_KW], a->seq_k, a->per_head_w2 ? a->da : width,
                                     l[R_KB].present, a->flat_k, &a->p2_proj)))
        return status;

    clattn__score_shape score;
    memset(&score, 0, sizeof score);
    if ((status = clattn__plan_score(plan, 1.0f, desc->norm, a->da, &score)) ||
        (status = clattn__plan_masks(plan, a->batch, a->heads, a->seq_q, a->seq_k, &score)) ||
        (status = clattn__plan_band(plan, desc->causal, CLATTN_CAUSAL_NONE, -1, -1, -1, 0, &score)))
        return status;
    score.additive = true;
    score.kv_group = 1;
    if ((status = clattn__attention_prepare(plan, &score, a->da, a->head_dim_v, CLATTN_DTYPE_F32,
                                            CLATTN_DTYPE_F32, l[R_V].dtype, l[R_OUT].dtype,
                                            want_weights, false, desc->path, &cursor)))
        return status;
    const size_t scratch = a->p1_proj.scratch_floats > a->p2_proj.scratch_floats
                               ? a->p1_proj.scratch_floats
                               : a->p2_proj.scratch_floats;
    return clattn__finish_projections(plan, cursor, scratch, &a->scratch_at);
}

/* ---------------------------------------------------------------------------------------------
 * Execution
 * ------------------------------------------------------------------------------------------- */

/* A projection's output columns first .. first + cols of the packed (batch, seq, width)
 * workspace region at `at`, shaped like rows_view. */
static clattn__view out_view(cl_mem workspace, size_t at, size_t batch, size_t seq, size_t width,
                             size_t first, size_t cols, bool flat)
{
    clattn__view v = {.mem = workspace, .offset = at + first, .dtype = CLATTN_DTYPE_F32};
    v.dims[0] = 1, v.strides[0] = 0;
    v.dims[1] = flat ? 1 : batch;
    v.strides[1] = flat ? 0 : seq * width;
    v.dims[2] = flat ? batch * seq : seq;
    v.strides[2] = width;
    v.dims[3] = cols, v.strides[3] = 1;
    return v;
}

/* (batch, H, seq, head) view of a (batch, seq, H * head) tensor. */
static clattn__view heads_view(const clattn__layout *l, cl_mem mem, size_t offset, size_t heads,
                               size_t head)
{
    clattn__view v = {.mem = mem, .offset = offset, .dtype = l->dtype};
    v.dims[0] = l->dims[0], v.strides[0] = l->strides[0];
    v.dims[1] = heads, v.strides[1] = head * l->strides[2];
    v.dims[2] = l->dims[1], v.strides[2] = l->strides[1];
    v.dims[3] = head, v.strides[3] = l->strides[2];
    return v;
}

/* P = x W + b for every head, into the workspace at `at`. */
static clattn_status project(clattn_plan *plan, const clattn__matmul_plan *mm, int x_role,
                             int w_role, int b_role, bool per_head, bool flat, size_t seq,
                             size_t at, const cl_mem *mems, const size_t *offsets, cl_mem workspace,
                             clattn_chain *chain)
{
    const clattn__additive *a = &plan->additive;
    const clattn__layout *l = plan->layouts;
    const clattn__layout x_layout = as_rank3(&l[x_role]);
    const clattn__layout *w = &l[w_role];
    const clattn__view x = clattn__rows_view(&x_layout, mems[x_role], offsets[x_role], flat);
    const clattn__scratch scratch = {workspace, a->scratch_at};
    const size_t width = a->heads * a->da, cols = per_head ? a->da : width;
    clattn_status status = CLATTN_SUCCESS;
    for (size_t h = 0; h < (per_head ? a->heads : 1) && status == CLATTN_SUCCESS; ++h) {
        const size_t first = h * a->da; /* column of P (and of b) where head h starts */
        clattn__view wv = {.mem = mems[w_role], .dtype = w->dtype};
        wv.offset = offsets[w_role] + (per_head ? h * w->strides[0] : 0);
        wv.dims[0] = wv.dims[1] = 1;
        wv.dims[2] = w->dims[w->rank - 2], wv.strides[2] = w->strides[w->rank - 2];
        wv.dims[3] = cols, wv.strides[3] = 1;
        clattn__view bias = {0};
        if (l[b_role].present) {
            bias = (clattn__view){.mem = mems[b_role],
                                  .offset = offsets[b_role] + (per_head ? first : 0),
                                  .dtype = CLATTN_DTYPE_F32};
            bias.dims[0] = bias.dims[1] = bias.dims[2] = 1;
            bias.dims[3] = cols, bias.strides[2] = cols, bias.strides[3] = 1;
        }
        const clattn__view y =
            out_view(workspace, at, a->batch, seq, width, per_head ? first : 0, cols, flat);
        status = clattn__matmul_enqueue(chain, mm, &x, &wv, &bias, &y, 1.0f, 0.0f,
                                                     scratch);
    }
    return status;
}

static clattn_status additive_execute(clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                                      cl_mem workspace, clattn_chain *chain)
{
    const clattn__layout *l = plan->layouts;
    const clattn__additive *a = &plan->additive;
    clattn_status status;
    if ((status = project(plan, &a->p1_proj, R_Q, R_QW, R_QB, a->per_head_w1, a->flat_q, a->seq_q,
                          a->p1_at, mems, offsets, workspace, chain)) ||
        (status = project(plan, &a->p2_proj, R_K, R_KW, R_KB, a->per_head_w2, a->flat_k, a->seq_k,
                          a->p2_at, mems, offsets, workspace, chain)))
        return status;
    const size_t width = a->heads * a->da;
    const clattn__layout p1 = {.present = true,
                               .dtype = CLATTN_DTYPE_F32,
                               .rank = 3,
                               .dims = {a->batch, a->seq_q, width},
                               .strides = {a->seq_q * width, width, 1}};
    const clattn__layout p2 = {.present = true,
                               .dtype = CLATTN_DTYPE_F32,
                               .rank = 3,
                               .dims = {a->batch, a->seq_k, width},
                               .strides = {a->seq_k * width, width, 1}};
    const clattn__layout v = as_rank3(&l[R_V]), out = as_rank3(&l[R_OUT]);
    clattn__attention_io io = {
        .q = heads_view(&p1, workspace, a->p1_at, a->heads, a->da),
        .k = heads_view(&p2, workspace, a->p2_at, a->heads, a->da),
        .v = heads_view(&v, mems[R_V], offsets[R_V], a->heads, a->head_dim_v),
        .out = heads_view(&out, mems[R_OUT], offsets[R_OUT], a->heads, a->head_dim_v),
        .masks = clattn__bound_masks(plan, mems, offsets),
    };
    /* w as (1, 1, heads, da): rank 1 (H * da) or rank 2 (H, da), any strides. */
    const clattn__layout *w = &l[R_SCORE_W];
    const size_t w_step = w->strides[w->rank - 1];
    io.masks.additive_w = (clattn__view){
        .mem = mems[R_SCORE_W],
        .offset = offsets[R_SCORE_W],
        .dtype = CLATTN_DTYPE_F32,
        .dims = {1, 1, a->heads, a->da},
        .strides = {0, 0, w->rank == 2 ? w->strides[0] : a->da * w_step, w_step},
    };
    if (l[R_WEIGHTS].present) {
        clattn__view_of(&l[R_WEIGHTS], &io.weights);
        io.weights.mem = mems[R_WEIGHTS];
        io.weights.offset = offsets[R_WEIGHTS];
    }
    return clattn__attention_enqueue(plan, &io, workspace, chain);
}

/* q, k, v, out, W1 (q_weight), W2 (k_weight), b1, b2 (q_bias, k_bias), w (score_weight), the
 * masks and weights. */
#define ADDITIVE_ROLES                                                                             \
    (CLATTN__ROLE(R_Q) | CLATTN__ROLE(R_K) | CLATTN__ROLE(R_V) | CLATTN__ROLE(R_OUT) |             \
     CLATTN__ROLE(R_MASK) | CLATTN__ROLE(R_KPM) | CLATTN__ROLE(R_WEIGHTS) | CLATTN__ROLE(R_QW) |   \
     CLATTN__ROLE(R_KW) | CLATTN__ROLE(R_QB) | CLATTN__ROLE(R_KB) | CLATTN__ROLE(R_SCORE_W))

CLATTN__PLAN_KIND(additive, CLATTN__ADDITIVE, clattn_additive_desc, create, additive_execute,
                  clattn_additive_plan_create, "additive", clattn__sdpa_role_names,
                  ADDITIVE_ROLES)
