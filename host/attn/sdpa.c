/* Scaled dot-product attention plans over (batch, heads, seq, head_dim) tensors. */
#include "plan.h"

#include <float.h>
#include <string.h>

/* A paged cache's operands: block_table (batch, blocks) I32, k and v of rank 4 (their pools'
 * page count and size into plan->sdpa.num_pages, page_size), kv_seqlen required; no past, present
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
    plan->sdpa.num_pages = l[R_K].dims[0];
    plan->sdpa.page_size = l[R_K].dims[1];
    if (plan->sdpa.num_pages > INT32_MAX)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: k holds %zu pages; block_table's I32 indices reach 2^31 - 1",
                            op, plan->sdpa.num_pages);
    if (!clattn__product(seq_k, 2, table->dims[1], plan->sdpa.page_size) || *seq_k > UINT32_MAX)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: block_table's %zu blocks of %zu keys exceed 2^32 - 1 keys", op,
                            table->dims[1], plan->sdpa.page_size);
    return CLATTN_SUCCESS;
}

/* Quantized k/v (block types) on the unfused path: refused (its matmuls read floats). */
static clattn_status unfused_quantized(clattn_plan *plan)
{
    const clattn__layout *l = plan->layouts;
    return clattn__fail(plan->ctx, CLATTN_ERR_UNSUPPORTED,
                        "%s: quantized k/v (%s, %s) run on the fused path only (head sizes up "
                        "to %d; no weights, scores or softmax_f64)",
                        plan->op, clattn__dtype_name(l[R_K].dtype),
                        clattn__dtype_name(l[R_V].dtype), CLATTN__FLASH_MAX_HEAD_DIM);
}

/* An SDPA problem's sizes, from q, k and v (a paged cache's pools, a KV cache's past). */
typedef struct sdpa_dims {
    size_t batch, heads, kv_heads, seq_q, seq_k, dk, dv;
    size_t total_k; /* the keys attended: past + seq_k */
    bool paged;     /* k and v are (num_pages, page_size, kv_heads, d) pools */
    bool quantized; /* k or v in blocks (Q8_0, Q4_0): the fused kernels dequantize as they load */
} sdpa_dims;

/* Validates q, k, v and out (rank 4; k and v as pools of pages with a block table) and reads
 * the problem's sizes into *d. */
static clattn_status check_operands(clattn_plan *plan, sdpa_dims *d)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    clattn_status status = clattn__expect_operands(plan, 4, false, NULL);
    if (status != CLATTN_SUCCESS)
        return status;
    d->batch = l[R_Q].dims[0], d->heads = l[R_Q].dims[1], d->seq_q = l[R_Q].dims[2];
    d->dk = l[R_Q].dims[3], d->dv = l[R_V].dims[3];
    /* A paged cache: k and v are (num_pages, page_size, kv_heads, d) pools, and the keys of a
     * sequence are its blocks' pages in the block table's order. */
    d->paged = l[R_BLOCK_TABLE].present;
    d->seq_k = l[R_K].dims[2];
    if (d->paged && (status = check_paged(plan, d->batch, &d->seq_k)))
        return status;
    d->kv_heads = l[R_K].dims[d->paged ? 2 : 1];
    if ((status = clattn__check_kv_heads(plan, d->heads, d->kv_heads)))
        return status;
    d->total_k = d->seq_k;
    d->quantized = ((1u << l[R_K].dtype) | (1u << l[R_V].dtype)) & CLATTN__QUANT;
    const size_t k_dims[4] = {d->batch, d->kv_heads, d->seq_k, d->dk};
    const size_t v_dims[4] = {d->batch, d->kv_heads, d->seq_k, d->dv};
    const size_t o_dims[4] = {d->batch, d->heads, d->seq_q, d->dv};
    const size_t pool_k[4] = {plan->sdpa.num_pages, plan->sdpa.page_size, d->kv_heads, d->dk};
    const size_t pool_v[4] = {plan->sdpa.num_pages, plan->sdpa.page_size, d->kv_heads, d->dv};
    if ((!d->paged &&
         ((status = clattn__layout_expect(ctx, op, "k", &l[R_K], 4, k_dims,
                                          "(batch, kv_heads, seq_k, head_dim_qk) from q")) ||
          (status = clattn__layout_expect(ctx, op, "v", &l[R_V], 4, v_dims,
                                          "(batch, kv_heads, seq_k, head_dim_v) from q and "
                                          "k")))) ||
        (d->paged && ((status = clattn__layout_expect(
                           ctx, op, "k", &l[R_K], 4, pool_k,
                           "(num_pages, page_size, kv_heads, head_dim_qk) pages from q")) ||
                      (status = clattn__layout_expect(ctx, op, "v", &l[R_V], 4, pool_v,
                                                      "(num_pages, page_size, kv_heads, "
                                                      "head_dim_v) pages from k")))))
        return status;
    return clattn__layout_expect(ctx, op, "out", &l[R_OUT], 4, o_dims,
                                 "(batch, heads, seq_q, head_dim_v)");
}

/* Refuses what quantized k/v, the KV cache's roles (past_k/past_v, present_k/present_v) and
 * rope do not take together; sets which cache roles are given. */
static clattn_status check_cache_roles(clattn_plan *plan, const clattn_sdpa_desc *desc,
                                       const sdpa_dims *d)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    /* Quantized keys or values: what would copy, rotate or multiply them as floats refuses. */
    if (d->quantized && (l[R_PAST_K].present || l[R_PRESENT_K].present || l[R_PAST_V].present ||
                         l[R_PRESENT_V].present || desc->rope != 0))
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: quantized k/v (%s, %s) with %s: not supported (a KV cache of "
                            "blocks is clattn_kv_cache with dtype Q8_0 or Q4_0)",
                            op, clattn__dtype_name(l[R_K].dtype), clattn__dtype_name(l[R_V].dtype),
                            desc->rope != 0 ? "rope" : "past/present");
    /* The KV cache: attention runs over past + new keys, written into present. */
    clattn__sdpa_cache *cache = &plan->sdpa.cache;
    cache->has_past = l[R_PAST_K].present || l[R_PAST_V].present;
    cache->has_present = l[R_PRESENT_K].present || l[R_PRESENT_V].present;
    if (cache->has_past && !(l[R_PAST_K].present && l[R_PAST_V].present))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: past_k and past_v go together (%s is absent)", op,
                            l[R_PAST_K].present ? "past_v" : "past_k");
    if (cache->has_present && !(l[R_PRESENT_K].present && l[R_PRESENT_V].present))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: present_k and present_v go together (%s is absent)", op,
                            l[R_PRESENT_K].present ? "present_v" : "present_k");
    if (cache->has_past && !cache->has_present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: past_k/past_v need present_k/present_v: the keys attended "
                            "(past then new) are written there",
                            op);
    if (cache->has_past && l[R_KVLEN].present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: kv_seqlen cannot be combined with past_k/past_v (ONNX's "
                            "rule: a static cache gives its fill as kv_seqlen, a growing one "
                            "as past)",
                            op);
    if (desc->rope == 1 && l[R_KVLEN].present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: rope=1 with kv_seqlen: k is then the whole cache, and the "
                            "queries' positions follow its fill level on the device; rotate the "
                            "keys as they are appended and q before each step with a rotary "
                            "plan (clattn_rope_plan_create), or use past_k/past_v",
                            op);
    return CLATTN_SUCCESS;
}

/* Rotary embeddings: q and the new keys rotated into F32 copies at the workspace's start,
 * which attention (and present_k's copy) then reads; past keys are rotated already. */
static clattn_status prepare_rope(clattn_plan *plan, const clattn_sdpa_desc *desc,
                                  const sdpa_dims *d)
{
    clattn_ctx *ctx = plan->ctx;
    const clattn__layout *l = plan->layouts;
    clattn__sdpa_rope *rope = &plan->sdpa.rope;
    const clattn__rope_fields fields = {desc->rope, desc->rope_style, desc->rope_dims,
                                        desc->rope_base, desc->rope_start};
    clattn__rope_shape shape;
    clattn_status status = clattn__rope_fields_prepare(
        plan, &fields, d->dk, d->seq_q > d->seq_k ? d->seq_q : d->seq_k, &rope->on, &shape);
    if (status != CLATTN_SUCCESS || !rope->on)
        return status;
    size_t q_floats = 0, k_floats = 0;
    if (!clattn__product(&q_floats, 4, d->batch, d->heads, d->seq_q, d->dk) ||
        !clattn__product(&k_floats, 4, d->batch, d->kv_heads, d->seq_k, d->dk) ||
        !clattn__add(q_floats, k_floats, &plan->workspace_floats))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                            "%s: the rotated copies of q and k overflow size_t", plan->op);
    rope->q_at = 0;
    rope->k_at = q_floats;
    shape.batch = d->batch;
    shape.heads = d->heads;
    shape.seq = d->seq_q;
    if ((status = clattn__rope_prepare(ctx, &shape, l[R_Q].dtype, CLATTN_DTYPE_F32,
                                       CLATTN_DTYPE_F32, &rope->q)))
        return status;
    shape.heads = d->kv_heads;
    shape.seq = d->seq_k;
    return clattn__rope_prepare(ctx, &shape, l[R_K].dtype, CLATTN_DTYPE_F32, CLATTN_DTYPE_F32,
                                &rope->k);
}

/* The KV cache's geometry: past's and present's layouts, the keys attended (d->total_k) and
 * the copies into present (of the new keys as attention reads them: new_k_dtype). */
static clattn_status prepare_cache(clattn_plan *plan, clattn_dtype new_k_dtype, sdpa_dims *d)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    clattn__sdpa_cache *cache = &plan->sdpa.cache;
    const size_t batch = d->batch, kv_heads = d->kv_heads, dk = d->dk, dv = d->dv;
    clattn_status status;
    cache->new_len = d->seq_k;
    cache->past_len = cache->has_past ? l[R_PAST_K].dims[2] : 0;
    if (cache->has_past) {
        const size_t pk_dims[4] = {batch, kv_heads, l[R_PAST_K].dims[2], dk};
        const size_t pv_dims[4] = {batch, kv_heads, l[R_PAST_K].dims[2], dv};
        if ((status = clattn__layout_expect(ctx, op, "past_k", &l[R_PAST_K], 4, pk_dims,
                                            "(batch, kv_heads, past, head_dim_qk) from q and k")) ||
            (status = clattn__layout_expect(ctx, op, "past_v", &l[R_PAST_V], 4, pv_dims,
                                            "(batch, kv_heads, past, head_dim_v), past from "
                                            "past_k")))
            return status;
        if (!clattn__add(cache->past_len, d->seq_k, &d->total_k) || d->total_k > UINT32_MAX)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: past (%zu) + seq_k (%zu) keys exceed 2^32 - 1", op,
                                cache->past_len, d->seq_k);
    }
    if (!cache->has_present)
        return CLATTN_SUCCESS;
    const size_t pk_dims[4] = {batch, kv_heads, d->total_k, dk};
    const size_t pv_dims[4] = {batch, kv_heads, d->total_k, dv};
    if ((status = clattn__layout_expect(ctx, op, "present_k", &l[R_PRESENT_K], 4, pk_dims,
                                        "(batch, kv_heads, past + seq_k, head_dim_qk)")) ||
        (status = clattn__layout_expect(ctx, op, "present_v", &l[R_PRESENT_V], 4, pv_dims,
                                        "(batch, kv_heads, past + seq_k, head_dim_v)")))
        return status;
    const size_t new_k[4] = {batch, kv_heads, d->seq_k, dk},
                 new_v[4] = {batch, kv_heads, d->seq_k, dv};
    if ((status = clattn__copy_prepare(ctx, new_k, new_k_dtype, l[R_PRESENT_K].dtype,
                                       &cache->new_k)) ||
        (status = clattn__copy_prepare(ctx, new_v, l[R_V].dtype, l[R_PRESENT_V].dtype,
                                       &cache->new_v)))
        return status;
    if (cache->has_past &&
        ((status = clattn__copy_prepare(ctx, l[R_PAST_K].dims, l[R_PAST_K].dtype,
                                        l[R_PRESENT_K].dtype, &cache->past_k)) ||
         (status = clattn__copy_prepare(ctx, l[R_PAST_V].dims, l[R_PAST_V].dtype,
                                        l[R_PRESENT_V].dtype, &cache->past_v))))
        return status;
    return CLATTN_SUCCESS;
}

/* The outputs beside out: weights and lse against the keys attended, the scores (and their
 * mode) and softmax_f64 into the score shape. */
static clattn_status check_outputs(clattn_plan *plan, const clattn_sdpa_desc *desc,
                                   const sdpa_dims *d, clattn__score_shape *score)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    const size_t w_dims[4] = {d->batch, d->heads, d->seq_q, d->total_k};
    clattn_status status;
    if ((l[R_WEIGHTS].present &&
         (status = clattn__layout_expect(ctx, op, "weights", &l[R_WEIGHTS], 4, w_dims,
                                         "(batch, heads, seq_q, past + seq_k)"))) ||
        (l[R_LSE].present && (status = clattn__layout_expect(ctx, op, "lse", &l[R_LSE], 3, w_dims,
                                                             "(batch, heads, seq_q)"))))
        return status;
    if (l[R_WEIGHTS].present && l[R_WEIGHTS].strides[3] != 1)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: weights must have stride 1 along seq_k (got %zu)", op,
                            l[R_WEIGHTS].strides[3]);
    if (l[R_SCORES].present) {
        if ((unsigned)desc->scores_mode > CLATTN_SCORES_MASKED)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: scores_mode=%d is not a clattn_scores (the probabilities "
                                "are the weights output)",
                                op, (int)desc->scores_mode);
        if ((status = clattn__layout_expect(ctx, op, "scores", &l[R_SCORES], 4, w_dims,
                                            "(batch, heads, seq_q, past + seq_k)")))
            return status;
        score->want_scores = true;
        score->scores_mode = (int)desc->scores_mode;
    }
    if (desc->softmax_f64 != 0 && desc->softmax_f64 != 1)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: softmax_f64=%d: 0 (float) or 1 (double)", op, desc->softmax_f64);
    score->softmax_f64 = desc->softmax_f64 == 1;
    return CLATTN_SUCCESS;
}

/* The path as far as it is known before the attention steps are prepared: packed sequences
 * and quantized k/v refuse the unfused path, and a grouped decode likely to run fused takes its
 * group's query heads as rows (plan->attention.decode_group; the score shape then says so). */
static clattn_status choose_path(clattn_plan *plan, const clattn_sdpa_desc *desc,
                                 const sdpa_dims *d, clattn__score_shape *score)
{
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
         clattn__auto_fuses(score, d->dk, d->dv, plan->layouts[R_WEIGHTS].present));
    const bool ends_at_count =
        score->band_upper < 0 ||
        (score->band_upper == 0 && (score->band_diag_kv
                                        ? score->band_diag == -1
                                        : score->band_diag + 1 >= (long long)d->total_k));
    if (plan->varlen.on && desc->path == CLATTN_PATH_UNFUSED) /* (after the band's checks) */
        return clattn__fail(plan->ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: cu_seqlens_q/cu_seqlens_k with path UNFUSED: not supported "
                            "(packed sequences run on the fused path only)",
                            plan->op);
    plan->attention.decode_group = 1;
    if (fused_likely && d->seq_q == 1 && !plan->varlen.on && score->kv_group > 1 &&
        score->band_lower < 0 && ends_at_count && !score->has_alibi && !score->dropout &&
        !score->flex_id) {
        plan->attention.decode_group = score->kv_group;
        score->heads = d->kv_heads;
        score->seq_q = score->kv_group;
        score->kv_group = 1;
        score->band_upper = -1; /* the count alone: the same for every query head */
    }
    if (d->quantized && !fused_likely)
        return unfused_quantized(plan);
    return CLATTN_SUCCESS;
}

/* A plan for a KV cache's decode steps in one launch (desc->kv_step; clattn_kv_cache_decode):
 * refuses what the step's new key cannot take (a mask's column or dropout's stream for it, user
 * functions, rope, past/present, packed batches, the unfused path, more than one new row),
 * then asks the fused kernel for the step (score->kv_step; float caches: a block cache's
 * steps append and attend in two launches). */
static clattn_status check_kv_step(clattn_plan *plan, const clattn_sdpa_desc *desc,
                                   const sdpa_dims *d, clattn__score_shape *score)
{
    const clattn__layout *l = plan->layouts;
    if (desc->kv_step == 0)
        return CLATTN_SUCCESS;
    const char *why = desc->kv_step != 1                    ? "is 0 (off) or 1"
                      : !l[R_KVLEN].present                 ? "needs kv_seqlen (a KV cache's "
                                                              "tensors: clattn_kv_cache_tensors)"
                      : d->seq_q != 1                       ? "takes one query row (seq_q = 1)"
                      : desc->path == CLATTN_PATH_UNFUSED   ? "runs on the fused path"
                      : score->has_mask || score->has_key_padding
                          ? "takes no attn_mask or key_padding_mask (the new key has no column)"
                      : score->dropout                      ? "takes no dropout"
                      : score->flex_id                      ? "takes no user score functions"
                      : plan->sdpa.rope.on                  ? "takes no rope (rotate the new key "
                                                              "before the step)"
                      : plan->sdpa.cache.has_present        ? "takes no past/present"
                      : plan->layouts[R_WEIGHTS].present    ? "returns no weights"
                                                            : NULL;
    if (why != NULL)
        return clattn__fail(plan->ctx,
                            desc->kv_step != 1 ? CLATTN_ERR_INVALID_ARGUMENT
                                               : CLATTN_ERR_UNSUPPORTED,
                            "%s: kv_step=%d: a decode step in one launch %s", plan->op,
                            desc->kv_step, why);
    score->kv_step = !d->quantized;
    plan->sdpa.kv_step = true;
    return CLATTN_SUCCESS;
}

/* Refuses on the unfused path what only the fused kernels run: quantized k/v, packed
 * sequences, a paged cache, strided head_dim, block masks, tile counts. */
static clattn_status check_unfused(clattn_plan *plan, const sdpa_dims *d)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    const clattn__sdpa_cache *cache = &plan->sdpa.cache;
    if (d->quantized)
        return unfused_quantized(plan);
    if (plan->varlen.on)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: packed sequences (cu_seqlens) run on the fused path only "
                            "(head sizes up to %d; got %zu, %zu)",
                            op, CLATTN__FLASH_MAX_HEAD_DIM, d->dk, d->dv);
    if (d->paged)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: a paged cache (block_table) runs on the fused path only "
                            "(head sizes up to %d; no weights, scores or softmax_f64)",
                            op, CLATTN__FLASH_MAX_HEAD_DIM);
    /* The matmuls read and write rows: head_dim must be contiguous on the unfused path (the
     * rotated copies are packed). */
    const bool rotated = plan->sdpa.rope.on;
    const int roles[4] = {R_Q, cache->has_present ? R_PRESENT_K : R_K,
                          cache->has_present ? R_PRESENT_V : R_V, R_OUT};
    const char *const names[4] = {"q", cache->has_present ? "present_k" : "k",
                                  cache->has_present ? "present_v" : "v", "out"};
    const bool copied[4] = {rotated, rotated && !cache->has_present, false, false};
    for (int i = 0; i < 4; ++i)
        if (!copied[i] && l[roles[i]].strides[3] != 1)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: %s has stride %zu along head_dim; the unfused path "
                                "needs stride 1 there (the fused path takes any)",
                                op, names[i], l[roles[i]].strides[3]);
    if (plan->flex.blocks)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: a block_mask runs on the fused path only (the unfused path "
                            "calls mask_mod on every score: drop the block mask there)",
                            op);
    if (plan->flex.count)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: flex.count_tiles counts the fused kernels' tiles: not on the "
                            "unfused path",
                            op);
    return CLATTN_SUCCESS;
}

/* The attention steps on the keys and values attended (present's with a cache; the rotated
 * copies of q and the new keys with rope). */
static clattn_status prepare_attention(clattn_plan *plan, const clattn_sdpa_desc *desc,
                                       const sdpa_dims *d, const clattn__score_shape *score)
{
    const clattn__layout *l = plan->layouts;
    const bool present = plan->sdpa.cache.has_present, rotated = plan->sdpa.rope.on;
    const clattn_dtype q_dtype = rotated ? CLATTN_DTYPE_F32 : l[R_Q].dtype;
    const clattn_dtype key_dtype = present ? l[R_PRESENT_K].dtype
                                   : rotated ? CLATTN_DTYPE_F32
                                             : l[R_K].dtype;
    const clattn_dtype value_dtype = l[present ? R_PRESENT_V : R_V].dtype;
    clattn_status status = clattn__attention_prepare(
        plan, score, d->dk, d->dv, q_dtype, key_dtype, value_dtype, l[R_OUT].dtype,
        l[R_WEIGHTS].present, l[R_LSE].present, desc->path, &plan->workspace_floats);
    if (status == CLATTN_SUCCESS && !plan->attention.fused)
        status = check_unfused(plan, d);
    return status;
}

/* FP8 k and v's per-tensor scales (desc->k_scale, v_scale; 0 means 1): k_scale folds into the
 * score scale (s = scale * q . (k_scale * decode(k))), v_scale into the fused kernels' output
 * normalisation (score->v_scale). */
static clattn_status fp8_scales(clattn_plan *plan, const clattn_sdpa_desc *desc,
                                clattn__score_shape *score)
{
    const clattn__layout *l = plan->layouts;
    const double given[2] = {desc->k_scale, desc->v_scale};
    const clattn_dtype dtypes[2] = {l[R_K].dtype, l[R_V].dtype};
    static const char *const names[2] = {"k_scale", "v_scale"}, *const operands[2] = {"k", "v"};
    float scales[2] = {1.0f, 1.0f};
    for (int i = 0; i < 2; ++i) {
        if (given[i] == 0.0)
            continue;
        if (!(given[i] >= FLT_MIN && given[i] <= FLT_MAX))
            return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: %s=%g: a finite float > 0 (0 means 1)", plan->op, names[i],
                                given[i]);
        if (!((1u << dtypes[i]) & CLATTN__FP8) && given[i] != 1.0)
            return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: %s=%g but %s is %s: the scale is an FP8 %s's (leave it 0)",
                                plan->op, names[i], given[i], operands[i],
                                clattn__dtype_name(dtypes[i]), operands[i]);
        scales[i] = (float)given[i];
    }
    score->scale *= scales[0];
    score->v_scale = scales[1];
    return CLATTN_SUCCESS;
}

static clattn_status create(clattn_plan *plan, const void *any)
{
    const clattn_sdpa_desc *desc = any;
    clattn_status status = CLATTN_SUCCESS;
    /* the score shape's packed-sequence fields, set by clattn__pack_varlen before the rest */
    clattn__score_shape score;
    memset(&score, 0, sizeof score);
    sdpa_dims d;
    memset(&d, 0, sizeof d);
    if ((plan->layouts[R_CU_Q].present || plan->layouts[R_CU_K].present) &&
        (status = clattn__pack_varlen(plan, desc, &score)))
        goto done;
    /* validate, then the geometry of the copies (rope, the KV cache) */
    if ((status = check_operands(plan, &d)) || (status = check_cache_roles(plan, desc, &d)) ||
        (status = prepare_rope(plan, desc, &d)) ||
        (status = prepare_cache(plan, plan->sdpa.rope.on ? CLATTN_DTYPE_F32
                                                         : plan->layouts[R_K].dtype, &d)) ||
        (status = check_outputs(plan, desc, &d, &score)) ||
        (status = clattn__plan_modifiers(plan, desc, d.batch, d.heads, d.seq_q, d.total_k, d.dk,
                                         plan->sdpa.cache.has_past
                                             ? (long long)plan->sdpa.cache.past_len
                                             : -1,
                                         false, &score)))
        goto done;
    score.kv_group = d.heads / d.kv_heads;
    score.kv_paged = d.paged;
    if ((status = fp8_scales(plan, desc, &score)))
        goto done;
    /* the path, then the attention steps bound to it */
    if ((status = choose_path(plan, desc, &d, &score)) ||
        (status = check_kv_step(plan, desc, &d, &score)))
        goto done;
    status = prepare_attention(plan, desc, &d, &score);
    clattn__flex_reserve(plan);
    if (status == CLATTN_SUCCESS)
        status = clattn__plan_finish(plan, plan->sdpa.rope.on
                                               ? "the rotated q and k, and the scores"
                                               : "the scores (batch, heads, seq_q, seq_k)");
done:
    if (plan->varlen.on)
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
    const clattn__sdpa_rope *rope = &plan->sdpa.rope;
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
            .freq = plan->angles.freq,
        };
        if (plan->angles.table)
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
    const clattn__sdpa_cache *cache = &plan->sdpa.cache;
    clattn__view q = sdpa_view(plan, mems, offsets, R_Q);
    clattn__view k = sdpa_view(plan, mems, offsets, R_K);
    clattn__view v = sdpa_view(plan, mems, offsets, R_V);
    if (plan->sdpa.rope.on) {
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
    if (plan->sdpa.step != NULL) /* clattn_kv_cache_decode's step */
        masks.step = *plan->sdpa.step;
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
            x->dims[2] = plan->layouts[R_BLOCK_TABLE].dims[1] * plan->sdpa.page_size;
            x->strides[0] = 0;
            x->strides[1] = x->strides[2];
            x->strides[2] = slot;
        }
        masks.paging.block_table = clattn__role_view(plan, mems, offsets, R_BLOCK_TABLE);
        masks.paging.page_size = plan->sdpa.page_size;
        masks.paging.num_pages = plan->sdpa.num_pages;
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
    const size_t group = plan->attention.decode_group;
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

/* The rule's roles, and the outputs weights and scores, the KV cache's and a paged cache's block
 * table. */
#define SDPA_ROLES                                                                                 \
    (CLATTN__SDPA_RULE_ROLES | CLATTN__ROLE(R_WEIGHTS) | CLATTN__ROLE(R_SCORES) |                 \
     CLATTN__ROLE(R_PAST_K) | CLATTN__ROLE(R_PAST_V) | CLATTN__ROLE(R_PRESENT_K) |                 \
     CLATTN__ROLE(R_PRESENT_V) | CLATTN__ROLE(R_BLOCK_TABLE))

CLATTN__PLAN_KIND(sdpa, CLATTN__SDPA, clattn_sdpa_desc, create, sdpa_execute,
                  clattn_sdpa_plan_create, "sdpa", clattn__sdpa_role_names, SDPA_ROLES)
