/* Scaled dot-product attention plans over (batch, heads, seq, head_dim) tensors. */
#include "plan.h"

#include <float.h>
#include <string.h>

clattn_status clattn_sdpa_plan_create(clattn_ctx *ctx, const clattn_sdpa_desc *desc,
                                      clattn_plan **out)
{
    static const char op[] = "sdpa";
    if (out)
        *out = NULL;
    if (ctx == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    clattn__clear_error(ctx);
    if (desc == NULL || out == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op,
                            desc ? "out" : "desc");
    clattn_status status =
        clattn__check_struct_size(ctx, op, "clattn_sdpa_desc", desc->struct_size, sizeof *desc);
    if (status != CLATTN_SUCCESS)
        return status;
    const clattn_tensors *t = &desc->tensors;
    static const char *const used[] = {"in_proj_weight", "in_proj_bias", "q_weight", "k_weight",
                                       "v_weight",       "q_bias",       "k_bias",   "v_bias",
                                       "out_weight",     "out_bias"};
    for (int role = R_IN_W; role < R_COUNT; ++role)
        if (clattn__tensor_of(t, (clattn__role)role)->rank != 0)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: %s belongs to MHA plans; SDPA takes q, k, v, out, masks, "
                                "weights and lse",
                                op, used[role - R_IN_W]);
    clattn_plan *plan = NULL;
    if ((status = clattn__plan_new(ctx, CLATTN__SDPA, op, t, &plan)))
        return status;
    const clattn__layout *l = plan->layouts;
    static const char *const required[4] = {"q", "k", "v", "out"};
    for (int role = R_Q; role <= R_OUT && status == CLATTN_SUCCESS; ++role)
        if (!l[role].present || l[role].rank != 4)
            status = clattn__fail(ctx, l[role].present ? CLATTN_ERR_INVALID_SHAPE
                                                       : CLATTN_ERR_INVALID_ARGUMENT,
                                  "%s: %s must be a rank-4 tensor (batch, heads, seq, head_dim), "
                                  "got rank %d",
                                  op, required[role], l[role].rank);
    if (status != CLATTN_SUCCESS)
        goto done;
    const size_t batch = l[R_Q].dims[0], heads = l[R_Q].dims[1], seq_q = l[R_Q].dims[2];
    const size_t dk = l[R_Q].dims[3], seq_k = l[R_K].dims[2], dv = l[R_V].dims[3];
    /* Grouped-query (and multi-query) attention: k and v may have fewer heads than q, a divisor
     * of q's; query head h then reads k/v head h / (heads / kv_heads). */
    const size_t kv_heads = l[R_K].dims[1];
    if (kv_heads == 0 || heads % kv_heads != 0) {
        status = clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                              "%s: k has %zu heads (dim 1), which must divide q's %zu heads "
                              "(grouped-query attention: query head h reads k/v head "
                              "h / (q heads / k heads))",
                              op, kv_heads, heads);
        goto done;
    }
    const size_t k_dims[4] = {batch, kv_heads, seq_k, dk};
    const size_t v_dims[4] = {batch, kv_heads, seq_k, dv};
    const size_t o_dims[4] = {batch, heads, seq_q, dv};
    const size_t w_dims[4] = {batch, heads, seq_q, seq_k};
    if ((status = clattn__layout_expect(ctx, op, "k", &l[R_K], 4, k_dims,
                                        "(batch, kv_heads, seq_k, head_dim_qk) from q")) ||
        (status = clattn__layout_expect(ctx, op, "v", &l[R_V], 4, v_dims,
                                        "(batch, kv_heads, seq_k, head_dim_v) from q and k")) ||
        (status = clattn__layout_expect(ctx, op, "out", &l[R_OUT], 4, o_dims,
                                        "(batch, heads, seq_q, head_dim_v)")) ||
        (l[R_WEIGHTS].present &&
         (status = clattn__layout_expect(ctx, op, "weights", &l[R_WEIGHTS], 4, w_dims,
                                         "(batch, heads, seq_q, seq_k)"))) ||
        (l[R_LSE].present && (status = clattn__layout_expect(ctx, op, "lse", &l[R_LSE], 3, w_dims,
                                                             "(batch, heads, seq_q)"))))
        goto done;
    if (l[R_WEIGHTS].present && l[R_WEIGHTS].strides[3] != 1) {
        status = clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                              "%s: weights must have stride 1 along seq_k (got %zu)", op,
                              l[R_WEIGHTS].strides[3]);
        goto done;
    }
    clattn__score_shape score;
    memset(&score, 0, sizeof score);
    if ((status = clattn__plan_score(plan, desc->causal, desc->scale, desc->norm, dk, &score)) ||
        (status = clattn__plan_masks(plan, batch, heads, seq_q, seq_k, &score)))
        goto done;
    score.kv_group = heads / kv_heads;
    if (!(desc->softcap >= 0.0f && desc->softcap <= FLT_MAX)) {
        status = clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                              "%s: softcap=%g: must be 0 (off) or a finite positive cap", op,
                              (double)desc->softcap);
        goto done;
    }
    score.softcap = desc->softcap;
    status = clattn__attention_prepare(plan, &score, dk, dv, l[R_Q].dtype, l[R_K].dtype,
                                       l[R_V].dtype, l[R_OUT].dtype, l[R_WEIGHTS].present,
                                       l[R_LSE].present, desc->path, &plan->workspace_floats);
    if (status == CLATTN_SUCCESS && !plan->attention.fused) {
        /* The matmuls read and write rows: head_dim must be contiguous on the unfused path. */
        for (int role = R_Q; role <= R_OUT && status == CLATTN_SUCCESS; ++role)
            if (l[role].strides[3] != 1)
                status = clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                      "%s: %s has stride %zu along head_dim; the unfused path "
                                      "needs stride 1 there (the fused path takes any)",
                                      op, required[role], l[role].strides[3]);
    }
    if (status == CLATTN_SUCCESS)
        status = clattn__plan_finish(plan, "the scores (batch, heads, seq_q, seq_k)");
done:
    if (status != CLATTN_SUCCESS) {
        clattn_plan_release(plan);
        return clattn__end_message(ctx, op, status); /* the message names the call */
    }
    *out = plan;
    return CLATTN_SUCCESS;
}

static clattn__view bound(const clattn__layout *l, cl_mem mem, size_t offset)
{
    clattn__view v;
    clattn__view_of(l, &v);
    v.mem = mem;
    v.offset = offset;
    return v;
}

clattn_status clattn__sdpa_execute(clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                                   cl_mem workspace, clattn_chain *chain)
{
    const clattn__layout *l = plan->layouts;
    clattn__attention_io io = {
        .q = bound(&l[R_Q], mems[R_Q], offsets[R_Q]),
        .k = bound(&l[R_K], mems[R_K], offsets[R_K]),
        .v = bound(&l[R_V], mems[R_V], offsets[R_V]),
        .out = bound(&l[R_OUT], mems[R_OUT], offsets[R_OUT]),
        .weights = bound(&l[R_WEIGHTS], mems[R_WEIGHTS], offsets[R_WEIGHTS]),
        .masks = {plan->mask_view, plan->kpm_view},
    };
    if (l[R_LSE].present) {
        /* (batch, heads, seq_q) as the 4-d view (1, batch, heads, seq_q). */
        io.lse = bound(&l[R_LSE], mems[R_LSE], offsets[R_LSE]);
    }
    io.masks.mask.mem = mems[R_MASK];
    io.masks.mask.offset = offsets[R_MASK];
    io.masks.key_padding.mem = mems[R_KPM];
    io.masks.key_padding.offset = offsets[R_KPM];
    return clattn__attention_enqueue(plan, &io, workspace, chain);
}
