/* SDPA's backward plans (clattn_sdpa_backward_plan_create): the gradients of q, k, v (and of a
 * float mask and the sinks) from dO, the forward's inputs, out and lse (ops/flash_bwd.c). */
#include "plan.h"
#include "core/tuning.h"
#include "core/validate.h"

#include <float.h>
#include <stdio.h>
#include <string.h>

/* Head sizes the backward's kernels keep in registers (rows of floats per work-item). */
#define BACKWARD_MAX_HEAD_DIM 256

/* The path: fused (flash_bwd.cl, from lse) unless asked otherwise, normalising in double,
 * without lse, or past the fused kernels' head sizes (the unfused path takes any). */
static clattn_status choose_path(clattn_plan *plan, const clattn_sdpa_desc *desc, bool *unfused)
{
    const clattn__layout *l = plan->layouts;
    const bool big = l[R_Q].dims[3] > BACKWARD_MAX_HEAD_DIM ||
                     l[R_V].dims[3] > BACKWARD_MAX_HEAD_DIM;
    *unfused = false;
    switch (desc->path) {
    case CLATTN_PATH_AUTO:
        *unfused = desc->softmax_f64 != 0 || !l[R_LSE].present || big;
        return CLATTN_SUCCESS;
    case CLATTN_PATH_UNFUSED:
        *unfused = true;
        return CLATTN_SUCCESS;
    case CLATTN_PATH_FUSED:
        if (desc->softmax_f64 != 0)
            return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: path=FUSED recomputes the weights in float; softmax_f64 "
                                "runs on the unfused path: use AUTO or UNFUSED",
                                plan->op);
        if (big)
            return clattn__fail(plan->ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: path=FUSED takes head sizes up to %d (got %zu, %zu): use "
                                "AUTO or UNFUSED",
                                plan->op, BACKWARD_MAX_HEAD_DIM, l[R_Q].dims[3], l[R_V].dims[3]);
        return CLATTN_SUCCESS;
    default:
        return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: path=%d is not a clattn_path", plan->op, (int)desc->path);
    }
}

/* The roles the path needs (lse on the fused one; dO and the three gradients), rope refused,
 * then every operand against q's (batch, heads, seq_q, head_dim_qk), k's seq_k and v's
 * head_dim_v, and those sizes' limits. */
static clattn_status check_operands(clattn_plan *plan, const clattn_sdpa_desc *desc,
                                    bool unfused)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    static const struct {
        clattn__role role;
        const char *why;
    } needed[] = {
        {R_LSE, "the forward's log-sum-exp (its lse output), F32 (batch, heads, seq_q)"},
        {R_GRAD_OUT, "dO, the loss's gradient by out"},
        {R_GRAD_Q, "where dQ goes"},
        {R_GRAD_K, "where dK goes"},
        {R_GRAD_V, "where dV goes"},
    };
    for (size_t i = unfused ? 1 : 0; i < sizeof needed / sizeof needed[0]; ++i)
        if (!l[needed[i].role].present)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is required (%s)", op,
                                clattn__sdpa_role_names[needed[i].role], needed[i].why);
    if (desc->rope != 0)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: rope=1: not supported by the backward (rotate q and k with a "
                            "rotary plan before the forward, give the rotated ones to both, and "
                            "carry the gradient back through the rotation yourself)",
                            op);
    const size_t batch = l[R_Q].dims[0], heads = l[R_Q].dims[1], seq_q = l[R_Q].dims[2];
    const size_t dk = l[R_Q].dims[3], dv = l[R_V].dims[3], seq_k = l[R_K].dims[2];
    const size_t kv_heads = l[R_K].dims[1];
    const size_t k_dims[4] = {batch, kv_heads, seq_k, dk};
    const size_t v_dims[4] = {batch, kv_heads, seq_k, dv};
    const size_t o_dims[4] = {batch, heads, seq_q, dv};
    clattn_status status;
    if ((status = clattn__check_kv_heads(plan, heads, kv_heads)) ||
        (status = clattn__layout_expect(ctx, op, "k", &l[R_K], 4, k_dims,
                                        "(batch, kv_heads, seq_k, head_dim_qk) from q")) ||
        (status = clattn__layout_expect(ctx, op, "v", &l[R_V], 4, v_dims,
                                        "(batch, kv_heads, seq_k, head_dim_v) from q and k")) ||
        (status = clattn__layout_expect(ctx, op, "out", &l[R_OUT], 4, o_dims,
                                        "(batch, heads, seq_q, head_dim_v)")) ||
        (status = clattn__layout_expect(ctx, op, "grad_out", &l[R_GRAD_OUT], 4, o_dims,
                                        "out's (batch, heads, seq_q, head_dim_v)")) ||
        (status = clattn__layout_expect(ctx, op, "grad_q", &l[R_GRAD_Q], 4, l[R_Q].dims,
                                        "q's (batch, heads, seq_q, head_dim_qk)")) ||
        (status = clattn__layout_expect(ctx, op, "grad_k", &l[R_GRAD_K], 4, k_dims,
                                        "k's (batch, kv_heads, seq_k, head_dim_qk)")) ||
        (status = clattn__layout_expect(ctx, op, "grad_v", &l[R_GRAD_V], 4, v_dims,
                                        "v's (batch, kv_heads, seq_k, head_dim_v)")) ||
        (l[R_LSE].present &&
         (status = clattn__layout_expect(ctx, op, "lse", &l[R_LSE], 3, o_dims,
                                         "the forward's (batch, heads, seq_q)"))))
        return status;
    const size_t dims[6] = {batch, heads, seq_q, seq_k, dk, dv};
    static const char *const dim_names[6] = {"batch", "heads", "seq_q", "seq_k", "head_dim_qk",
                                             "head_dim_v"};
    if ((status = clattn__check_dims(ctx, op, dims, dim_names, 6, false)))
        return status;
    return clattn__check_dims(ctx, op, dims, dim_names, 6, true);
}

/* The optional gradients: a float mask's (the mask's own dims, summed over the broadcast
 * ones) and the sinks'; shape's want_dmask, dmask_dtype and want_dsinks. */
static clattn_status check_optional_gradients(clattn_plan *plan, clattn__flash_bwd_shape *shape)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    clattn_status status;
    if (l[R_GRAD_MASK].present) {
        const clattn__layout *mask = &l[R_MASK];
        if (!mask->present || mask->dtype == CLATTN_DTYPE_U8)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: grad_attn_mask needs a float attn_mask (%s)", op,
                                mask->present ? "a U8 mask has no gradient" : "none is given");
        if ((status = clattn__layout_expect(ctx, op, "grad_attn_mask", &l[R_GRAD_MASK],
                                            mask->rank, mask->dims, "attn_mask's dims")))
            return status;
        clattn__view_of(&l[R_GRAD_MASK], &plan->backward.grad_mask_view);
        shape->want_dmask = true;
        shape->dmask_dtype = l[R_GRAD_MASK].dtype;
    }
    if (l[R_GRAD_SINKS].present) {
        const size_t sink_dims[1] = {l[R_Q].dims[1]};
        if (!l[R_SINKS].present)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: grad_sinks needs sinks (none is given)", op);
        if ((status = clattn__layout_expect(ctx, op, "grad_sinks", &l[R_GRAD_SINKS], 1, sink_dims,
                                            "(heads), as sinks")))
            return status;
        shape->want_dsinks = true;
    }
    return CLATTN_SUCCESS;
}

/* The operands' head sizes and dtypes into the fused passes' shape. */
static void bind_dtypes(const clattn_plan *plan, clattn__flash_bwd_shape *shape)
{
    const clattn__layout *l = plan->layouts;
    shape->head_dim_qk = l[R_Q].dims[3];
    shape->head_dim_v = l[R_V].dims[3];
    shape->q_dtype = l[R_Q].dtype;
    shape->k_dtype = l[R_K].dtype;
    shape->v_dtype = l[R_V].dtype;
    shape->o_dtype = l[R_OUT].dtype;
    shape->go_dtype = l[R_GRAD_OUT].dtype;
    shape->dq_dtype = l[R_GRAD_Q].dtype;
    shape->dk_dtype = l[R_GRAD_K].dtype;
    shape->dv_dtype = l[R_GRAD_V].dtype;
}

/* The unfused reference path on the plan's score shape; fallback says why the fused one was
 * passed over ("" when it was not tried). */
static clattn_status prepare_unfused(clattn_plan *plan, const clattn_sdpa_desc *desc,
                                     clattn__flash_bwd_shape *shape, const char *fallback)
{
    clattn__score_shape *score = &shape->score;
    score->softmax_f64 = desc->softmax_f64 != 0;
    plan->attention.score = *score;
    plan->backward.flash.shape = *shape; /* want_dmask: the execution binds grad_attn_mask */
    clattn_status status = clattn__unfused_bwd_prepare(
        plan, score, shape->head_dim_qk, shape->head_dim_v, shape->want_dmask,
        shape->want_dsinks, &plan->workspace_floats);
    if (status != CLATTN_SUCCESS)
        return status;
    snprintf(plan->info, sizeof plan->info,
             "%s: unfused reference backward: matmuls (Q K^T, dO V^T), the forward's "
             "softmax rows%s, bwd_unfused_rows (dS), matmuls (dQ, dK, dV)%s%s%s, "
             "deterministic%s",
             plan->op, desc->softmax_f64 != 0 ? " in double" : "",
             score->dropout ? ", dropout" : "", shape->want_dmask ? ", the mask's gradient" : "",
             shape->want_dsinks ? ", the sinks' gradient" : "", fallback);
    clattn__flex_reserve(plan);
    return clattn__plan_finish(plan, "three (batch, heads, seq_q, seq_k) score matrices");
}

/* The fused passes as prepared (plan->backward.flash) for shape: their workspace and
 * plan_info. */
static clattn_status finish_fused(clattn_plan *plan, const clattn__flash_bwd_shape *shape)
{
    const clattn__flash_bwd_plan *bwd = &plan->backward.flash;
    plan->attention.fused = true;
    plan->workspace_floats = bwd->scratch_floats;
    clattn__flex_reserve(plan);
    char cpu_geometry[160] = "dK/dV per key, dQ per row";
    if (bwd->cpu)
        snprintf(cpu_geometry, sizeof cpu_geometry,
                 "CPU variant: dK/dV per %u keys, %u rows a step, dQ per %u rows, float16 "
                 "lanes",
                 16 * bwd->cpu_nv, bwd->cpu_rb, bwd->cpu_rows);
    else if (bwd->gpu)
        snprintf(cpu_geometry, sizeof cpu_geometry,
                 "GPU variant: flash_bwd_gpu.cl dK/dV per %u keys in %u-row tiles, %s, "
                 "%zu items",
                 bwd->gpu_keys, bwd->gpu_rows,
                 bwd->gpu_dq ? "dQ per block of rows in key tiles" : "dQ per row",
                 bwd->local_dkdv);
    snprintf(plan->info, sizeof plan->info,
             "%s: fused backward, flash_bwd.cl (%s; %zu row part%s, %zu key part%s)%s%s, "
             "deterministic",
             plan->op, cpu_geometry, bwd->row_parts, bwd->row_parts > 1 ? "s" : "",
             bwd->key_parts, bwd->key_parts > 1 ? "s" : "",
             shape->want_dmask ? ", the mask's gradient" : "",
             shape->want_dsinks ? ", the sinks' gradient" : "");
    return clattn__plan_finish(plan, shape->want_dmask
                                         ? "the scores' gradient (batch, heads, seq_q, seq_k)"
                                         : "delta (batch, heads, seq_q)");
}

static clattn_status create(clattn_plan *plan, const void *any)
{
    const clattn_sdpa_desc *desc = any;
    clattn_ctx *ctx = plan->ctx;
    const clattn__layout *l = plan->layouts;
    bool unfused = false;
    clattn_status status;
    if ((status = clattn__expect_operands(plan, 4, false, NULL)) ||
        (status = choose_path(plan, desc, &unfused)) ||
        (status = check_operands(plan, desc, unfused)))
        return status;
    clattn__flash_bwd_shape shape;
    memset(&shape, 0, sizeof shape);
    const size_t heads = l[R_Q].dims[1];
    if ((status = clattn__plan_modifiers(plan, desc, l[R_Q].dims[0], heads, l[R_Q].dims[2],
                                         l[R_K].dims[2], l[R_Q].dims[3], -1, true,
                                         &shape.score)))
        return status;
    shape.score.kv_group = heads / l[R_K].dims[1];
    if ((status = check_optional_gradients(plan, &shape)))
        return status;
    plan->attention.score = shape.score;
    bind_dtypes(plan, &shape);
    /* the problem's tuning (records by head size and dtype: flash_bwd_nv) */
    clattn__tuning_for(ctx, l[R_Q].dims[3], shape.q_dtype, false, &plan->attention.tuning,
                       plan->attention.tuning_records, sizeof plan->attention.tuning_records);
    shape.tuning = &plan->attention.tuning;
    if (unfused)
        return prepare_unfused(plan, desc, &shape, "");
    if ((status = clattn__flash_bwd_prepare(ctx, &shape, &plan->backward.flash)) == CLATTN_SUCCESS)
        return finish_fused(plan, &shape);
    /* No fused variant survived validation (core/validate.h): AUTO goes unfused, where that
     * path runs the problem (not packed sequences). */
    if (desc->path != CLATTN_PATH_AUTO || !clattn__variant_fallible(status) || plan->varlen.on)
        return status;
    char fallback[160];
    snprintf(fallback, sizeof fallback, "; the fused backward failed validation: %.100s",
             ctx->message);
    return prepare_unfused(plan, desc, &shape, fallback);
}

static clattn_status backward_execute(clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                                      cl_mem workspace, clattn_chain *chain)
{
    clattn__flash_bwd_io io;
    memset(&io, 0, sizeof io);
    static const clattn__role roles[10] = {R_Q,   R_K,        R_V,      R_OUT,    R_GRAD_OUT,
                                           R_LSE, R_GRAD_Q,   R_GRAD_K, R_GRAD_V, R_GRAD_SINKS};
    clattn__view *const views[10] = {&io.q,   &io.k,  &io.v,  &io.out, &io.grad_out,
                                     &io.lse, &io.dq, &io.dk, &io.dv,  &io.dsinks};
    clattn__bind_views(plan, mems, offsets, 10, roles, views);
    if (plan->backward.flash.shape.want_dmask) {
        io.dmask = plan->backward.grad_mask_view;
        io.dmask.mem = mems[R_GRAD_MASK];
        io.dmask.offset = offsets[R_GRAD_MASK];
    }
    io.masks = clattn__bound_masks(plan, mems, offsets);
    const clattn_status status =
        clattn__flex_stage(plan, mems, offsets, workspace, chain, &io.masks);
    if (status != CLATTN_SUCCESS)
        return status;
    if (plan->backward.unfused.on)
        return clattn__unfused_bwd_enqueue(plan, &io, workspace, chain);
    const clattn__scratch scratch = {workspace, 0};
    return clattn__flash_bwd_enqueue(chain, &plan->backward.flash, &io, scratch);
}

/* Packed variable-length batches (cu_seqlens_q/_k): create runs on the (batch, heads,
 * max_seqlen, d) views of the packed tensors (clattn__pack_varlen: its checks and refusals
 * first), the caller's packed layouts back after (execution binds them; backward_execute's
 * kernel views are the packed ones). The fused path only (flash_bwd.cl's VARLEN: each
 * sequence's span), so lse is required. */
static clattn_status create_any(clattn_plan *plan, const void *any)
{
    const clattn_sdpa_desc *desc = any;
    const clattn__layout *l = plan->layouts;
    if (!l[R_CU_Q].present && !l[R_CU_K].present)
        return create(plan, any);
    clattn__score_shape packed; /* (plan_masks copies the fields to create's score) */
    memset(&packed, 0, sizeof packed);
    clattn_status status = clattn__pack_varlen(plan, desc, &packed);
    if (status == CLATTN_SUCCESS && desc->path == CLATTN_PATH_UNFUSED)
        status = clattn__fail(plan->ctx, CLATTN_ERR_UNSUPPORTED,
                              "%s: cu_seqlens_q/cu_seqlens_k with path UNFUSED: not supported "
                              "(packed sequences run on the fused path only)",
                              plan->op);
    if (status == CLATTN_SUCCESS && !l[R_LSE].present)
        status = clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT,
                              "%s: lse is required with packed sequences (the forward's F32 "
                              "(heads, total_q) log-sum-exp: the fused backward's input)",
                              plan->op);
    if (status == CLATTN_SUCCESS)
        status = create(plan, any);
    if (status == CLATTN_SUCCESS && !plan->attention.fused)
        status = clattn__fail(plan->ctx, CLATTN_ERR_UNSUPPORTED,
                              "%s: packed sequences (cu_seqlens) run on the fused backward only "
                              "(head sizes up to %d; got %zu, %zu)",
                              plan->op, BACKWARD_MAX_HEAD_DIM, l[R_Q].dims[3], l[R_V].dims[3]);
    if (status == CLATTN_SUCCESS) {
        const size_t used = strlen(plan->info);
        snprintf(plan->info + used, sizeof plan->info - used,
                 ", %zu packed sequences (total_q %zu, total_k %zu)", l[R_Q].dims[0],
                 plan->varlen.total_q, plan->varlen.total_k);
    }
    if (plan->varlen.on)
        clattn__unpack_varlen(plan);
    return status;
}

/* The forward's rule's roles (its inputs, out and lse), dO and the gradients. */
#define BACKWARD_ROLES                                                                             \
    (CLATTN__SDPA_RULE_ROLES | CLATTN__ROLE(R_GRAD_OUT) | CLATTN__ROLE(R_GRAD_Q) |                 \
     CLATTN__ROLE(R_GRAD_K) | CLATTN__ROLE(R_GRAD_V) | CLATTN__ROLE(R_GRAD_MASK) |                 \
     CLATTN__ROLE(R_GRAD_SINKS))

CLATTN__PLAN_KIND(sdpa_backward, CLATTN__SDPA_BACKWARD, clattn_sdpa_desc, create_any,
                  backward_execute, clattn_sdpa_backward_plan_create, "sdpa_backward",
                  clattn__sdpa_role_names, BACKWARD_ROLES)
