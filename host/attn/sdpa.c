/* Scaled dot-product attention plans over (batch, heads, seq, head_dim) tensors. */
#include "plan.h"

#include <float.h>
#include <string.h>

/* A paged cache's operands: block_table (batch, blocks) I32, k and v of rank 4 (their pools'
 * page count and size into plan->num_pages, page_size), kv_seqlen required; no past, present
 * or rope. *seq_k: the keys a sequence can hold, blocks * page_size. */
static clattn_status check_paged(clattn_plan *plan, size_t batch, size_t *seq_k)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    const clattn__layout *table = &l[R_BLOCK_TABLE];
    if (table->rank != 2 || table->dims[0] != batch)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: block_table must be (batch, blocks) = (%zu, blocks) of I32 page "
                            "indices, got rank %d with dim 0 %zu",
                            op, batch, table->rank, table->rank ? table->dims[0] : 0);
    if (!l[R_KVLEN].present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: block_table needs kv_seqlen (I32 (batch): each sequence's key "
                            "count in its pages)",
                            op);
    if (l[R_PAST_K].present || l[R_PRESENT_K].present || l[R_PAST_V].present ||
        l[R_PRESENT_V].present)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: block_table with past_k/present_k: a paged cache is appended to "
                            "by its owner, not through the plan",
                            op);
    plan->num_pages = l[R_K].dims[0];
    plan->page_size = l[R_K].dims[1];
    if (plan->num_pages > INT32_MAX)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: k holds %zu pages; block_table's I32 indices reach 2^31 - 1",
                            op, plan->num_pages);
    if (!clattn__product(seq_k, 2, table->dims[1], plan->page_size) || *seq_k > UINT32_MAX)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: block_table's %zu blocks of %zu keys exceed 2^32 - 1 keys", op,
                            table->dims[1], plan->page_size);
    return CLATTN_SUCCESS;
}

/* Quantized k/v (block types) on the unfused path: refused (its matmuls read floats). */
static clattn_status unfused_quantized(clattn_plan *plan)
{
    const clattn__layout *l = plan->layouts;
    return clattn__fail(plan->ctx, CLATTN_ERR_UNSUPPORTED,
                        "%s: quantized k/v (%s, %s) run on the fused path only (head sizes up "
                        "to 256; no weights, scores or softmax_f64)",
                        plan->op, clattn__dtype_name(l[R_K].dtype),
                        clattn__dtype_name(l[R_V].dtype));
}

static clattn_status create(clattn_plan *plan, const void *any)
{
    const clattn_sdpa_desc *desc = any;
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    clattn_status status = CLATTN_SUCCESS;
    const clattn__layout *l = plan->layouts;
    /* the score shape's packed-sequence fields, set by clattn__pack_varlen before the rest */
    clattn__score_shape varlen_score;
    memset(&varlen_score, 0, sizeof varlen_score);
    if ((l[R_CU_Q].present || l[R_CU_K].present) &&
        (status = clattn__pack_varlen(plan, desc, &varlen_score)))
        goto done;
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
    const size_t dk = l[R_Q].dims[3], dv = l[R_V].dims[3];
    /* A paged cache: k and v are (num_pages, page_size, kv_heads, d) pools, and the keys of a
     * sequence are its blocks' pages in the block table's order. */
    const bool paged = l[R_BLOCK_TABLE].present;
    size_t seq_k = l[R_K].dims[2];
    if (paged && (status = check_paged(plan, batch, &seq_k)))
        goto done;
    /* Grouped-query (and multi-query) attention: k and v may have fewer heads than q, a divisor
     * of q's; query head h then reads k/v head h / (heads / kv_heads). */
    const size_t kv_heads = l[R_K].dims[paged ? 2 : 1];
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
    const size_t pool_k[4] = {plan->num_pages, plan->page_size, kv_heads, dk};
    const size_t pool_v[4] = {plan->num_pages, plan->page_size, kv_heads, dv};
    if ((!paged &&
         ((status = clattn__layout_expect(ctx, op, "k", &l[R_K], 4, k_dims,
                                          "(batch, kv_heads, seq_k, head_dim_qk) from q")) ||
          (status = clattn__layout_expect(ctx, op, "v", &l[R_V], 4, v_dims,
                                          "(batch, kv_heads, seq_k, head_dim_v) from q and "
                                          "k")))) ||
        (paged && ((status = clattn__layout_expect(
                        ctx, op, "k", &l[R_K], 4, pool_k,
                        "(num_pages, page_size, kv_heads, head_dim_qk) pages from q")) ||
                   (status = clattn__layout_expect(ctx, op, "v", &l[R_V], 4, pool_v,
                                                   "(num_pages, page_size, kv_heads, "
                                                   "head_dim_v) pages from k")))) ||
        (status = clattn__layout_expect(ctx, op, "out", &l[R_OUT], 4, o_dims,
                                        "(batch, heads, seq_q, head_dim_v)")))
        goto done;
    /* Quantized keys or values (Q8_0, Q4_0 blocks): the fused kernels dequantize as they
     * load; what would copy, rotate or multiply them as floats refuses. */
    const bool quantized = ((1u << l[R_K].dtype) | (1u << l[R_V].dtype)) & CLATTN__QUANT;
    if (quantized && (l[R_PAST_K].present || l[R_PRESENT_K].present || l[R_PAST_V].present ||
                      l[R_PRESENT_V].present || desc->rope != 0)) {
        status = clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                              "%s: quantized k/v (%s, %s) with %s: not supported (a KV cache of "
                              "blocks is clattn_kv_cache with dtype Q8_0 or Q4_0)",
                              op, clattn__dtype_name(l[R_K].dtype), clattn__dtype_name(l[R_V].dtype),
                              desc->rope != 0 ? "rope" : "past/present");
        goto done;
    }
    /* The KV cache: attention runs over past + new keys, written into present. */
    clattn__sdpa_cache *cache = &plan->cache;
    cache->has_past = l[R_PAST_K].present || l[R_PAST_V].present;
    cache->has_present = l[R_PRESENT_K].present || l[R_PRESENT_V].present;
    if (cache->has_past && !(l[R_PAST_K].present && l[R_PAST_V].present)) {
        status = clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                              "%s: past_k and past_v go together (%s is absent)", op,
                              l[R_PAST_K].present ? "past_v" : "past_k");
        goto done;
    }
    if (cache->has_present && !(l[R_PRESENT_K].present && l[R_PRESENT_V].present)) {
        status = clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                              "%s: present_k and present_v go together (%s is absent)", op,
                              l[R_PRESENT_K].present ? "present_v" : "present_k");
        goto done;
    }
    if (cache->has_past && !cache->has_present) {
        status = clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                              "%s: past_k/past_v need present_k/present_v: the keys attended "
                              "(past then new) are written there",
                              op);
        goto done;
    }
    if (cache->has_past && l[R_KVLEN].present) {
        status = clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                              "%s: kv_seqlen cannot be combined with past_k/past_v (ONNX's "
                              "rule: a static cache gives its fill as kv_seqlen, a growing one "
                              "as past)",
                              op);
        goto done;
    }
    /* Rotary embeddings: q and the new keys rotated into F32 copies at the workspace's start,
     * which attention (and present_k's copy) then reads; past keys are rotated already. */
    clattn__sdpa_rope *rope = &plan->sdpa_rope;
    if (desc->rope == 1 && l[R_KVLEN].present) {
        status = clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                              "%s: rope=1 with kv_seqlen: k is then the whole cache, and the "
                              "queries' positions follow its fill level on the device; rotate the "
                              "keys as they are appended and q before each step with a rotary "
                              "plan (clattn_rope_plan_create), or use past_k/past_v",
                              op);
        goto done;
    }
    const clattn__rope_fields rope_fields = {desc->rope, desc->rope_style, desc->rope_dims,
                                             desc->rope_base, desc->rope_start};
    clattn__rope_shape rope_shape;
    if ((status = clattn__rope_fields_prepare(plan, &rope_fields, dk, seq_q > seq_k ? seq_q : seq_k,
                                              &rope->on, &rope_shape)))
        goto done;
    if (rope->on) {
        size_t q_floats = 0, k_floats = 0;
        if (!clattn__product(&q_floats, 4, batch, heads, seq_q, dk) ||
            !clattn__product(&k_floats, 4, batch, kv_heads, seq_k, dk) ||
            !clattn__add(q_floats, k_floats, &plan->workspace_floats)) {
            status = clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                                  "%s: the rotated copies of q and k overflow size_t", op);
            goto done;
        }
        rope->q_at = 0;
        rope->k_at = q_floats;
        rope_shape.batch = batch;
        rope_shape.heads = heads;
        rope_shape.seq = seq_q;
        if ((status = clattn__rope_prepare(ctx, &rope_shape, l[R_Q].dtype, CLATTN_DTYPE_F32,
                                           CLATTN_DTYPE_F32, &rope->q)))
            goto done;
        rope_shape.heads = kv_heads;
        rope_shape.seq = seq_k;
        if ((status = clattn__rope_prepare(ctx, &rope_shape, l[R_K].dtype, CLATTN_DTYPE_F32,
                                           CLATTN_DTYPE_F32, &rope->k)))
            goto done;
    }
    /* What attention and present_k's copy read: the copies when rotated. */
    const clattn_dtype q_dtype = rope->on ? CLATTN_DTYPE_F32 : l[R_Q].dtype;
    const clattn_dtype new_k_dtype = rope->on ? CLATTN_DTYPE_F32 : l[R_K].dtype;
    cache->new_len = seq_k;
    cache->past_len = cache->has_past ? l[R_PAST_K].dims[2] : 0;
    size_t total_k = seq_k;
    if (cache->has_past) {
        const size_t pk_dims[4] = {batch, kv_heads, l[R_PAST_K].dims[2], dk};
        const size_t pv_dims[4] = {batch, kv_heads, l[R_PAST_K].dims[2], dv};
        if ((status = clattn__layout_expect(ctx, op, "past_k", &l[R_PAST_K], 4, pk_dims,
                                            "(batch, kv_heads, past, head_dim_qk) from q and k")) ||
            (status = clattn__layout_expect(ctx, op, "past_v", &l[R_PAST_V], 4, pv_dims,
                                            "(batch, kv_heads, past, head_dim_v), past from "
                                            "past_k")))
            goto done;
        if (!clattn__add(cache->past_len, seq_k, &total_k) || total_k > UINT32_MAX) {
            status = clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                  "%s: past (%zu) + seq_k (%zu) keys exceed 2^32 - 1", op,
                                  cache->past_len, seq_k);
            goto done;
        }
    }
    if (cache->has_present) {
        const size_t pk_dims[4] = {batch, kv_heads, total_k, dk};
        const size_t pv_dims[4] = {batch, kv_heads, total_k, dv};
        if ((status = clattn__layout_expect(ctx, op, "present_k", &l[R_PRESENT_K], 4, pk_dims,
                                            "(batch, kv_heads, past + seq_k, head_dim_qk)")) ||
            (status = clattn__layout_expect(ctx, op, "present_v", &l[R_PRESENT_V], 4, pv_dims,
                                            "(batch, kv_heads, past + seq_k, head_dim_v)")))
            goto done;
        const size_t new_k[4] = {batch, kv_heads, seq_k, dk},
                     new_v[4] = {batch, kv_heads, seq_k, dv};
        if ((status = clattn__copy_prepare(ctx, new_k, new_k_dtype, l[R_PRESENT_K].dtype,
                                           &cache->new_k)) ||
            (status = clattn__copy_prepare(ctx, new_v, l[R_V].dtype, l[R_PRESENT_V].dtype,
                                           &cache->new_v)))
            goto done;
        if (cache->has_past &&
            ((status = clattn__copy_prepare(ctx, l[R_PAST_K].dims, l[R_PAST_K].dtype,
                                            l[R_PRESENT_K].dtype, &cache->past_k)) ||
             (status = clattn__copy_prepare(ctx, l[R_PAST_V].dims, l[R_PAST_V].dtype,
                                            l[R_PRESENT_V].dtype, &cache->past_v))))
            goto done;
    }
    const size_t w_dims[4] = {batch, heads, seq_q, total_k};
    if ((l[R_WEIGHTS].present &&
         (status = clattn__layout_expect(ctx, op, "weights", &l[R_WEIGHTS], 4, w_dims,
                                         "(batch, heads, seq_q, past + seq_k)"))) ||
        (l[R_LSE].present && (status = clattn__layout_expect(ctx, op, "lse", &l[R_LSE], 3, w_dims,
                                                             "(batch, heads, seq_q)"))))
        goto done;
    if (l[R_WEIGHTS].present && l[R_WEIGHTS].strides[3] != 1) {
        status = clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                              "%s: weights must have stride 1 along seq_k (got %zu)", op,
                              l[R_WEIGHTS].strides[3]);
        goto done;
    }
    clattn__score_shape score = varlen_score;
    if (l[R_SCORES].present) {
        if ((unsigned)desc->scores_mode > CLATTN_SCORES_MASKED) {
            status = clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                  "%s: scores_mode=%d is not a clattn_scores (the probabilities "
                                  "are the weights output)",
                                  op, (int)desc->scores_mode);
            goto done;
        }
        if ((status = clattn__layout_expect(ctx, op, "scores", &l[R_SCORES], 4, w_dims,
                                            "(batch, heads, seq_q, past + seq_k)")))
            goto done;
        score.want_scores = true;
        score.scores_mode = (int)desc->scores_mode;
    }
    if (desc->softmax_f64 != 0 && desc->softmax_f64 != 1) {
        status = clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                              "%s: softmax_f64=%d: 0 (float) or 1 (double)", op, desc->softmax_f64);
        goto done;
    }
    score.softmax_f64 = desc->softmax_f64 == 1;
    if ((status = clattn__plan_modifiers(plan, desc, batch, heads, seq_q, total_k, dk,
                                         cache->has_past ? (long long)cache->past_len : -1,
                                         false, &score)))
        goto done;
    score.kv_group = heads / kv_heads;
    score.kv_paged = paged;
    /* Decoding with grouped heads: one query row per head, and every row's band ends at the
     * batch's key count (causal bottom-right or ONNX, or none; no window). The fused kernel
     * then takes the group's query heads as the rows of one k/v head (q viewed as (batch,
     * kv_heads, group, d)): each key tile is read once per k/v head instead of once per query
     * head. (Not with ALiBi: its slope is the query head's; nor with dropout: its mask is the
     * query head's. With rope, q is rotated as
     * (batch, heads, 1, d) first, so every row keeps its head's position.) */
    const bool fused_likely =
        desc->path == CLATTN_PATH_FUSED ||
        (desc->path == CLATTN_PATH_AUTO &&
         clattn__auto_fuses(&score, dk, dv, l[R_WEIGHTS].present));
    const bool ends_at_count =
        score.band_upper < 0 ||
        (score.band_upper == 0 &&
         (score.band_diag_kv ? score.band_diag == -1 : score.band_diag + 1 >= (long long)total_k));
    if (plan->varlen && desc->path == CLATTN_PATH_UNFUSED) { /* (after the band's checks) */
        status = clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                              "%s: cu_seqlens_q/cu_seqlens_k with path UNFUSED: not supported "
                              "(packed sequences run on the fused path only)",
                              op);
        goto done;
    }
    plan->decode_group = 1;
    if (fused_likely && seq_q == 1 && !plan->varlen && score.kv_group > 1 &&
        score.band_lower < 0 && ends_at_count && !score.has_alibi && !score.dropout &&
        !score.flex_id) {
        plan->decode_group = score.kv_group;
        score.heads = kv_heads;
        score.seq_q = score.kv_group;
        score.kv_group = 1;
        score.band_upper = -1; /* the count alone: the same for every query head */
    }
    if (quantized && !fused_likely) {
        status = unfused_quantized(plan);
        goto done;
    }
    /* With a cache, the keys and values attended are present's. */
    const int key_role = cache->has_present ? R_PRESENT_K : R_K;
    const int value_role = cache->has_present ? R_PRESENT_V : R_V;
    const clattn_dtype key_dtype = cache->has_present ? l[R_PRESENT_K].dtype : new_k_dtype;
    status = clattn__attention_prepare(plan, &score, dk, dv, q_dtype, key_dtype,
                                       l[value_role].dtype, l[R_OUT].dtype, l[R_WEIGHTS].present,
                                       l[R_LSE].present, desc->path, &plan->workspace_floats);
    if (status == CLATTN_SUCCESS && quantized && !plan->attention.fused)
        status = unfused_quantized(plan);
    if (status == CLATTN_SUCCESS && plan->varlen && !plan->attention.fused)
        status = clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                              "%s: packed sequences (cu_seqlens) run on the fused path only "
                              "(head sizes up to 256; got %zu, %zu)",
                              op, dk, dv);
    if (status == CLATTN_SUCCESS && paged && !plan->attention.fused)
        status = clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                              "%s: a paged cache (block_table) runs on the fused path only "
                              "(head sizes up to 256; no weights, scores or softmax_f64)",
                              op);
    if (status == CLATTN_SUCCESS && !plan->attention.fused) {
        /* The matmuls read and write rows: head_dim must be contiguous on the unfused path
         * (the rotated copies are packed). */
        const int roles[4] = {R_Q, key_role, value_role, R_OUT};
        const char *const names[4] = {"q", cache->has_present ? "present_k" : "k",
                                      cache->has_present ? "present_v" : "v", "out"};
        const bool copied[4] = {rope->on, rope->on && !cache->has_present, false, false};
        for (int i = 0; i < 4 && status == CLATTN_SUCCESS; ++i)
            if (!copied[i] && l[roles[i]].strides[3] != 1)
                status = clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                      "%s: %s has stride %zu along head_dim; the unfused path "
                                      "needs stride 1 there (the fused path takes any)",
                                      op, names[i], l[roles[i]].strides[3]);
    }
    if (status == CLATTN_SUCCESS && plan->flex.blocks && !plan->attention.fused)
        status = clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                              "%s: a block_mask runs on the fused path only (the unfused path "
                              "calls mask_mod on every score: drop the block mask there)",
                              op);
    if (status == CLATTN_SUCCESS && plan->flex.count && !plan->attention.fused)
        status = clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                              "%s: flex.count_tiles counts the fused kernels' tiles: not on the "
                              "unfused path",
                              op);
    clattn__flex_reserve(plan);
    if (status == CLATTN_SUCCESS)
        status = clattn__plan_finish(plan, rope->on ? "the rotated q and k, and the scores"
                                                    : "the scores (batch, heads, seq_q, seq_k)");
done:
    if (plan->varlen)
        clattn__unpack_varlen(plan);
    return status;
}

static bool same_view(const clattn__view *a, const clattn__view *b)
{
    return a->mem == b->mem && a->offset == b->offset && a->dtype == b->dtype &&
           memcmp(a->strides, b->strides, sizeof a->strides) == 0;
}

/* present[:, :, at .. at + src's keys) = src, unless that is src itself (an in-place cache). */
static clattn_status copy_into(const clattn__copy_plan *copy, const clattn__view *src,
                               const clattn__view *present, size_t at, clattn_chain *chain)
{
    clattn__view dst = *present;
    dst.offset += (cl_ulong)at * present->strides[2];
    if (same_view(src, &dst))
        return CLATTN_SUCCESS;
    return clattn__copy_enqueue(chain, copy, src, &dst);
}

/* q and the new keys rotated into their packed F32 copies in the workspace; *q and *k then
 * view the copies. */
static clattn_status rotate(clattn_plan *plan, cl_mem workspace, clattn__view *q, clattn__view *k,
                            clattn_chain *chain)
{
    const clattn__sdpa_rope *rope = &plan->sdpa_rope;
    clattn__view *views[2] = {q, k};
    const clattn__rope_plan *ops[2] = {&rope->q, &rope->k};
    const size_t at[2] = {rope->q_at, rope->k_at};
    for (int i = 0; i < 2; ++i) {
        const clattn__rope_shape *s = &ops[i]->shape;
        clattn__rope_io io = {
            .x = *views[i],
            .out = {.mem = workspace,
                    .offset = at[i],
                    .dtype = CLATTN_DTYPE_F32,
                    .dims = {s->batch, s->heads, s->seq, s->dim},
                    .strides = {s->heads * s->seq * s->dim, s->seq * s->dim, s->dim, 1}},
            .freq = plan->posenc.freq,
        };
        if (plan->posenc.angles)
            clattn__angle_views(plan, &io.cos, &io.sin);
        const clattn_status status = clattn__rope_enqueue(chain, ops[i], &io);
        if (status != CLATTN_SUCCESS)
            return status;
        *views[i] = io.out;
    }
    return CLATTN_SUCCESS;
}

/* Axis `axis` of heads (batch, heads, ..) split into (heads / group, group): a decode group's
 * query heads as rows of their k/v head. */
static void heads_as_rows(clattn__view *view, int axis, size_t group)
{
    view->dims[axis] /= group;
    view->dims[axis + 1] = group;
    view->strides[axis + 1] = view->strides[axis];
    view->strides[axis] *= group;
}

/* A role's view at execution: packed sequences' q, k, v, out and lse as the kernels' views. */
static clattn__view sdpa_view(const clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                              clattn__role role)
{
    return clattn__kernel_view(plan, mems, offsets, role);
}

static clattn_status sdpa_execute(clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                                  cl_mem workspace, clattn_chain *chain)
{
    const clattn__sdpa_cache *cache = &plan->cache;
    clattn__view q = sdpa_view(plan, mems, offsets, R_Q);
    clattn__view k = sdpa_view(plan, mems, offsets, R_K);
    clattn__view v = sdpa_view(plan, mems, offsets, R_V);
    if (plan->sdpa_rope.on) {
        const clattn_status status = rotate(plan, workspace, &q, &k, chain);
        if (status != CLATTN_SUCCESS)
            return status;
    }
    if (cache->has_present) {
        const clattn__view present_k = clattn__role_view(plan, mems, offsets, R_PRESENT_K);
        const clattn__view present_v = clattn__role_view(plan, mems, offsets, R_PRESENT_V);
        clattn_status status;
        if (cache->has_past) {
            const clattn__view past_k = clattn__role_view(plan, mems, offsets, R_PAST_K);
            const clattn__view past_v = clattn__role_view(plan, mems, offsets, R_PAST_V);
            if ((status = copy_into(&cache->past_k, &past_k, &present_k, 0, chain)) ||
                (status = copy_into(&cache->past_v, &past_v, &present_v, 0, chain)))
                return status;
        }
        if ((status = copy_into(&cache->new_k, &k, &present_k, cache->past_len, chain)) ||
            (status = copy_into(&cache->new_v, &v, &present_v, cache->past_len, chain)))
            return status;
        k = present_k;
        v = present_v;
    }
    clattn__score_masks masks = clattn__bound_masks(plan, mems, offsets); /* (and cu_seqlens) */
    {
        const clattn_status status = clattn__flex_stage(plan, mems, offsets, workspace, chain,
                                                        &masks);
        if (status != CLATTN_SUCCESS)
            return status;
    }
    if (plan->attention.score.kv_paged) {
        /* the pools (pages, slot, head, d) as (batch, head, key, d) views with batch stride 0
         * and the slot stride per key; the page strides apart (score.cl's paged keys) */
        clattn__view *kv[2] = {&k, &v};
        size_t *page[2] = {&masks.paging.k_page, &masks.paging.v_page};
        for (int i = 0; i < 2; ++i) {
            clattn__view *x = kv[i];
            const size_t pages = x->strides[0], slot = x->strides[1];
            *page[i] = pages;
            x->dims[0] = plan->layouts[R_BLOCK_TABLE].dims[0];
            x->dims[1] = plan->layouts[R_K].dims[2];
            x->dims[2] = plan->layouts[R_BLOCK_TABLE].dims[1] * plan->page_size;
            x->strides[0] = 0;
            x->strides[1] = x->strides[2];
            x->strides[2] = slot;
        }
        masks.paging.block_table = clattn__role_view(plan, mems, offsets, R_BLOCK_TABLE);
        masks.paging.page_size = plan->page_size;
        masks.paging.num_pages = plan->num_pages;
    }
    clattn__attention_io io = {
        .q = q,
        .k = k,
        .v = v,
        .out = sdpa_view(plan, mems, offsets, R_OUT),
        .weights = clattn__role_view(plan, mems, offsets, R_WEIGHTS),
        /* (batch, heads, seq_q) as the 4-d view (1, batch, heads, seq_q) */
        .lse = sdpa_view(plan, mems, offsets, R_LSE),
        .scores = clattn__role_view(plan, mems, offsets, R_SCORES),
        .masks = masks,
    };
    const size_t group = plan->decode_group;
    if (group > 1) {
        /* One query row per head: the group's heads become the rows of their k/v head (with
         * rope, q was rotated per head before, each row at rope_start). */
        heads_as_rows(&io.q, 1, group);
        heads_as_rows(&io.out, 1, group);
        if (io.lse.mem)
            heads_as_rows(&io.lse, 2, group);
        if (plan->attention.score.has_mask)
            heads_as_rows(&io.masks.mask, 1, group);
        if (plan->attention.score.has_sinks) /* each row its query head's sink */
            heads_as_rows(&io.masks.sinks, 2, group);
    }
    return clattn__attention_enqueue(plan, &io, workspace, chain);
}

/* The inputs, out, the masks, the outputs, kv_seqlen, the KV cache's, ALiBi's slopes, the
 * attention sinks, a paged cache's block table and packed sequences' offsets. */
#define SDPA_ROLES                                                                                 \
    (CLATTN__ROLE(R_Q) | CLATTN__ROLE(R_K) | CLATTN__ROLE(R_V) | CLATTN__ROLE(R_OUT) |             \
     CLATTN__ROLE(R_MASK) | CLATTN__ROLE(R_KPM) | CLATTN__ROLE(R_WEIGHTS) | CLATTN__ROLE(R_LSE) |  \
     CLATTN__ROLE(R_KVLEN) | CLATTN__ROLE(R_PAST_K) | CLATTN__ROLE(R_PAST_V) |                     \
     CLATTN__ROLE(R_PRESENT_K) | CLATTN__ROLE(R_PRESENT_V) | CLATTN__ROLE(R_SCORES) |              \
     CLATTN__ROLE(R_ALIBI) | CLATTN__ROLE(R_SINKS) | CLATTN__ROLE(R_BLOCK_TABLE) |                \
     CLATTN__ROLE(R_CU_Q) | CLATTN__ROLE(R_CU_K) | CLATTN__FLEX_ROLES)

CLATTN__PLAN_KIND(sdpa, CLATTN__SDPA, clattn_sdpa_desc, create, sdpa_execute,
                  clattn_sdpa_plan_create, "sdpa", clattn__sdpa_role_names, SDPA_ROLES)
