/* The attention backward's unfused reference path (path UNFUSED, softmax_f64, head sizes past
 * the fused kernels'): the textbook's steps over whole score matrices in the workspace,
 *
 *   x = Q K^T   P = the forward's softmax rows of x (ops/softmax.c, undropped)   dp = dO V^T
 *   bwd_unfused_rows (flash_bwd.cl): D, P Z (dropout), dX = dS scale cap'(x), dS
 *   dV = (P Z)^T dO   dK = dX^T Q   dQ = dX K
 *
 * with our matmuls (ops/matmul.c) into float32 sums, then the fused path's reductions
 * (bwd_sum_parts: grouped-query heads' dK, dV parts and the outputs' dtypes and strides;
 * bwd_mask_reduce; bwd_sinks). It recomputes the weights with the forward's own softmax
 * kernel rather than from lse, so it needs no lse (but for the sinks' gradient) and checks
 * the fused path's recomputation against an independent one. Memory: three (B, H, Lq, Lk)
 * float matrices. */
#include "plan.h"

#include <stdio.h>
#include <string.h>

#define MAX_BH_PER_LAUNCH 65535u

/* A packed F32 (d0, d1, d2, d3) view of the workspace from float `at` on. */
static clattn__view packed_view(cl_mem workspace, size_t at, size_t d0, size_t d1, size_t d2,
                                size_t d3)
{
    const clattn__view v = {.mem = workspace,
                            .offset = at,
                            .dtype = CLATTN_DTYPE_F32,
                            .dims = {d0, d1, d2, d3},
                            .strides = {d1 * d2 * d3, d2 * d3, d3, 1}};
    return v;
}

/* Group member t's slice of a (batch, heads, rows, cols) view: (batch, heads / group, rows,
 * cols), heads t, t + group, ... */
static clattn__view member(clattn__view v, size_t t, size_t group)
{
    v.offset += t * v.strides[1];
    v.dims[1] /= group;
    v.strides[1] *= group;
    return v;
}

static size_t rounded(size_t n, size_t local)
{
    return (n + local - 1) / local * local;
}

/* flash_bwd.cl's reductions into a gradient of `dtype` (ops/flash_bwd.c's family). */
static clattn_status reduction(clattn_ctx *ctx, const char *name, clattn_dtype dtype,
                               cl_kernel *kernel)
{
    return clattn__flash_bwd_out_kernel(ctx, name, dtype, kernel);
}

clattn_status clattn__unfused_bwd_prepare(clattn_plan *plan, const clattn__score_shape *score,
                                          size_t head_dim_qk, size_t head_dim_v, bool want_dmask,
                                          bool want_dsinks, size_t *workspace_floats)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    clattn__unfused_bwd *u = &plan->backward.unfused;
    memset(u, 0, sizeof *u);
    u->on = true;
    u->score = *score;
    u->head_dim_qk = head_dim_qk;
    u->head_dim_v = head_dim_v;
    u->want_dmask = want_dmask;
    u->want_dsinks = want_dsinks;
    static const struct {
        clattn__role role;
        const char *name;
    } rows_read[] = {{R_Q, "q"}, {R_K, "k"}, {R_V, "v"}, {R_GRAD_OUT, "grad_out"}};
    for (size_t i = 0; i < sizeof rows_read / sizeof rows_read[0]; ++i)
        if (l[rows_read[i].role].strides[3] != 1)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: %s has stride %zu along head_dim; the backward's unfused "
                                "path needs stride 1 there (the fused path takes any)",
                                op, rows_read[i].name, l[rows_read[i].role].strides[3]);
    if (want_dsinks && !l[R_LSE].present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: grad_sinks on the unfused path needs lse, the forward's F32 "
                            "(batch, heads, seq_q) log-sum-exp (the sinks' weights are "
                            "exp(sink - lse))",
                            op);
    const size_t batch = score->batch, heads = score->heads;
    const size_t seq_q = score->seq_q, seq_k = score->seq_k;
    const size_t group = score->kv_group > 1 ? score->kv_group : 1, kv_heads = heads / group;
    const clattn__matmul_shape qk = {.m = seq_q, .n = seq_k, .k = head_dim_qk,
                                     .batch = {batch, heads}, .trans_b = true, .b_group = group,
                                     .a_dtype = l[R_Q].dtype, .b_dtype = l[R_K].dtype,
                                     .c_dtype = CLATTN_DTYPE_F32};
    const clattn__matmul_shape dov = {.m = seq_q, .n = seq_k, .k = head_dim_v,
                                      .batch = {batch, heads}, .trans_b = true, .b_group = group,
                                      .a_dtype = l[R_GRAD_OUT].dtype, .b_dtype = l[R_V].dtype,
                                      .c_dtype = CLATTN_DTYPE_F32};
    const clattn__matmul_shape dq = {.m = seq_q, .n = head_dim_qk, .k = seq_k,
                                     .batch = {batch, heads}, .b_group = group,
                                     .a_dtype = CLATTN_DTYPE_F32, .b_dtype = l[R_K].dtype,
                                     .c_dtype = CLATTN_DTYPE_F32};
    const clattn__matmul_shape dk = {.m = seq_k, .n = head_dim_qk, .k = seq_q,
                                     .batch = {batch, kv_heads}, .trans_a = true,
                                     .a_dtype = CLATTN_DTYPE_F32, .b_dtype = l[R_Q].dtype,
                                     .c_dtype = CLATTN_DTYPE_F32};
    const clattn__matmul_shape dv = {.m = seq_k, .n = head_dim_v, .k = seq_q,
                                     .batch = {batch, kv_heads}, .trans_a = true,
                                     .a_dtype = CLATTN_DTYPE_F32, .b_dtype = l[R_GRAD_OUT].dtype,
                                     .c_dtype = CLATTN_DTYPE_F32};
    /* the forward's weights, undropped: the rows step applies dropout where P meets V */
    clattn__score_shape weights = *score;
    weights.dropout = false;
    clattn_status status;
    if ((status = clattn__matmul_prepare(ctx, &qk, &u->qk)) ||
        (status = clattn__matmul_prepare(ctx, &dov, &u->dov)) ||
        (status = clattn__matmul_prepare(ctx, &dq, &u->dq)) ||
        (status = clattn__matmul_prepare(ctx, &dk, &u->dk)) ||
        (status = clattn__matmul_prepare(ctx, &dv, &u->dv)) ||
        (status = clattn__softmax_prepare(ctx, &weights, &u->softmax)) ||
        (status = clattn__flash_bwd_plain_kernel(ctx, "bwd_unfused_rows", score, &u->rows)) ||
        (status = reduction(ctx, "bwd_sum_parts", l[R_GRAD_Q].dtype, &u->sum_q)) ||
        (status = reduction(ctx, "bwd_sum_parts", l[R_GRAD_K].dtype, &u->sum_k)) ||
        (status = reduction(ctx, "bwd_sum_parts", l[R_GRAD_V].dtype, &u->sum_v)) ||
        (want_dmask &&
         (status = reduction(ctx, "bwd_mask_reduce", l[R_GRAD_MASK].dtype, &u->mask_reduce))) ||
        (want_dsinks &&
         (status = clattn__flash_bwd_plain_kernel(ctx, "bwd_sinks", NULL, &u->sinks))))
        return status;
    u->local_rows = (ctx->info.type & CL_DEVICE_TYPE_GPU) ? 64 : 16;
    if (u->local_rows > ctx->info.max_work_group_size)
        u->local_rows = ctx->info.max_work_group_size;
    size_t kernel_max = 0;
    if (clGetKernelWorkGroupInfo(u->rows, ctx->device, CL_KERNEL_WORK_GROUP_SIZE,
                                 sizeof kernel_max, &kernel_max, NULL) == CL_SUCCESS &&
        kernel_max > 0)
        while (u->local_rows > kernel_max)
            u->local_rows /= 2;

    /* The workspace: x, P, dp (B, H, Lq, Lk); delta; dQ; dK's and dV's group parts; the
     * matmuls' scratch (the largest). */
    size_t matrix = 0, rows = 0, dq_floats = 0, dk_all = 0, dv_all = 0;
    size_t mm = u->qk.scratch_floats;
    const clattn__matmul_plan *mms[4] = {&u->dov, &u->dq, &u->dk, &u->dv};
    for (int i = 0; i < 4; ++i)
        mm = mms[i]->scratch_floats > mm ? mms[i]->scratch_floats : mm;
    size_t cursor = *workspace_floats;
    if (!clattn__product(&matrix, 4, batch, heads, seq_q, seq_k) ||
        !clattn__product(&rows, 3, batch, heads, seq_q) ||
        !clattn__product(&dq_floats, 4, batch, heads, seq_q, head_dim_qk) ||
        !clattn__product(&u->dk_part, 4, batch, kv_heads, seq_k, head_dim_qk) ||
        !clattn__product(&u->dv_part, 4, batch, kv_heads, seq_k, head_dim_v) ||
        !clattn__mul(u->dk_part, group, &dk_all) || !clattn__mul(u->dv_part, group, &dv_all))
        goto overflow;
    const size_t sizes[8] = {matrix, matrix, matrix, rows, dq_floats, dk_all, dv_all, mm};
    size_t *ats[8] = {&u->raw_at, &u->p_at, &u->dp_at, &u->delta_at,
                      &u->dq_at,  &u->dk_at, &u->dv_at, &u->mm_at};
    for (int i = 0; i < 8; ++i) {
        *ats[i] = cursor;
        if (!clattn__add(cursor, sizes[i], &cursor))
            goto overflow;
    }
    *workspace_floats = cursor;
    return CLATTN_SUCCESS;
overflow:
    return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                        "%s: the unfused backward's workspace (three (batch, heads, seq_q, "
                        "seq_k) matrices and the gradients' sums) overflows size_t",
                        op);
}

/* bwd_unfused_rows over every query row, in launches of at most MAX_BH_PER_LAUNCH (b, h). */
static clattn_status rows_step(clattn_chain *chain, const clattn__unfused_bwd *u,
                               const clattn__flash_bwd_io *io, cl_mem workspace)
{
    const clattn__score_shape *score = &u->score;
    clattn_flash_bwd_params params;
    memset(&params, 0, sizeof params);
    clattn__score_buffers buffers;
    clattn__score_params(score, &io->masks, workspace, &params.score, &buffers);
    params.delta_at = u->delta_at;
    params.dmask_at = u->raw_at;
    params.p_at = u->p_at;
    params.dp_at = u->dp_at;
    params.kv_group = (cl_uint)(score->kv_group > 1 ? score->kv_group : 1);
    const size_t bh = score->batch * score->heads;
    clattn_status status = CLATTN_SUCCESS;
    for (size_t first = 0; first < bh && status == CLATTN_SUCCESS; first += MAX_BH_PER_LAUNCH) {
        params.bh_base = first;
        const clattn_arg args[] = {CLATTN_ARG(workspace),        CLATTN_ARG(buffers.mask),
                                   CLATTN_ARG(buffers.key_padding), CLATTN_ARG(buffers.kv_len),
                                   CLATTN_ARG(buffers.alibi),     CLATTN_ARG(buffers.sinks),
                                   CLATTN_ARG(params)};
        const size_t global[2] = {rounded(score->seq_q, u->local_rows),
                                  bh - first < MAX_BH_PER_LAUNCH ? bh - first
                                                                 : MAX_BH_PER_LAUNCH};
        const size_t local[2] = {u->local_rows, 1};
        status = clattn__launch_kernel(chain, u->rows, "bwd_unfused_rows", args, 7, 2, global,
                                       local);
    }
    return status;
}

clattn_status clattn__unfused_bwd_enqueue(const clattn_plan *plan, const clattn__flash_bwd_io *io,
                                          cl_mem workspace, clattn_chain *chain)
{
    const clattn__unfused_bwd *u = &plan->backward.unfused;
    const clattn__score_shape *s = &u->score;
    const size_t batch = s->batch, heads = s->heads, seq_q = s->seq_q, seq_k = s->seq_k;
    const size_t group = s->kv_group > 1 ? s->kv_group : 1, kv_heads = heads / group;
    const size_t dk = u->head_dim_qk, dv = u->head_dim_v;
    const clattn__scratch mm = {workspace, u->mm_at};
    const clattn__view none = {0};
    const clattn__view raw = packed_view(workspace, u->raw_at, batch, heads, seq_q, seq_k);
    const clattn__view p = packed_view(workspace, u->p_at, batch, heads, seq_q, seq_k);
    const clattn__view dp = packed_view(workspace, u->dp_at, batch, heads, seq_q, seq_k);
    const clattn__view dq = packed_view(workspace, u->dq_at, batch, heads, seq_q, dk);
    clattn_status status;
    if ((status = clattn__matmul_enqueue(chain, &u->qk, &io->q, &io->k, &none, &raw, 1.0f, 0.0f,
                                         mm)) ||
        (status = clattn__softmax_enqueue(chain, &u->softmax, &raw, &p, &io->masks)) ||
        (status = clattn__matmul_enqueue(chain, &u->dov, &io->grad_out, &io->v, &none, &dp, 1.0f,
                                         0.0f, mm)) ||
        (status = rows_step(chain, u, io, workspace)) ||
        (status = clattn__matmul_enqueue(chain, &u->dq, &dp, &io->k, &none, &dq, 1.0f, 0.0f, mm)))
        return status;
    /* dK, dV: one part per member t of each group (query heads t, t + group, ...) */
    for (size_t t = 0; t < group; ++t) {
        const clattn__view dk_part =
            packed_view(workspace, u->dk_at + t * u->dk_part, batch, kv_heads, seq_k, dk);
        const clattn__view dv_part =
            packed_view(workspace, u->dv_at + t * u->dv_part, batch, kv_heads, seq_k, dv);
        const clattn__view dx_t = member(dp, t, group), pz_t = member(p, t, group);
        const clattn__view q_t = member(io->q, t, group), go_t = member(io->grad_out, t, group);
        if ((status = clattn__matmul_enqueue(chain, &u->dk, &dx_t, &q_t, &none, &dk_part, 1.0f,
                                             0.0f, mm)) ||
            (status = clattn__matmul_enqueue(chain, &u->dv, &pz_t, &go_t, &none, &dv_part, 1.0f,
                                             0.0f, mm)))
            return status;
    }
    const clattn__scratch sums = {workspace, 0};
    if ((status = clattn__bwd_sum_parts(chain, u->sum_q, sums, u->dq_at, 0, 1, &io->dq)) ||
        (status = clattn__bwd_sum_parts(chain, u->sum_k, sums, u->dk_at, u->dk_part, group,
                                        &io->dk)) ||
        (status = clattn__bwd_sum_parts(chain, u->sum_v, sums, u->dv_at, u->dv_part, group,
                                        &io->dv)) ||
        (u->want_dmask && (status = clattn__bwd_mask_reduce(chain, u->mask_reduce, sums,
                                                            u->raw_at, s, &io->dmask))) ||
        (u->want_dsinks && (status = clattn__bwd_sinks(chain, u->sinks, sums, u->delta_at, s, io))))
        return status;
    return CLATTN_SUCCESS;
}
