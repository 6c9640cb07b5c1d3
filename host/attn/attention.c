/* The attention steps SDPA, MHA and additive attention share: the score rule's settings,
 * masks, ALiBi and key band from the plan's tensors (plan time), the choice between the fused
 * kernel and the unfused matmul + softmax + matmul steps with their workspace (plan time), and
 * their launch (execution). Called by the kinds' files; it calls only ops/ and core/. */
#include "plan.h"
#include "core/tuning.h"
#include "core/validate.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

clattn_status clattn_alibi_slopes(size_t heads, float max_bias, float *slopes)
{
    if (heads == 0 || slopes == NULL || !(max_bias > 0.0f && max_bias <= FLT_MAX))
        return CLATTN_ERR_INVALID_ARGUMENT;
    size_t n = 1;
    while (n <= heads / 2)
        n *= 2;
    for (size_t h = 0; h < heads; ++h)
        slopes[h] =
            h < n ? (float)exp2(-(double)max_bias * (double)(h + 1) / (double)n)
                  : (float)exp2(-(double)max_bias * (double)(2 * (h - n) + 1) / (double)(2 * n));
    return CLATTN_SUCCESS;
}

/* A per-head F32 table (ALiBi's slopes, the sinks) in `role`: *given says whether it is, its
 * view *v is zeroed, and a given one is checked to be (rank, dims) (`what` describes them). */
static clattn_status check_table(clattn_plan *plan, clattn__role role, const char *name, int rank,
                                 const size_t *dims, const char *what, bool *given,
                                 clattn__view *v)
{
    const clattn__layout *l = &plan->layouts[role];
    *given = l->present;
    memset(v, 0, sizeof *v);
    return l->present ? clattn__layout_expect(plan->ctx, plan->op, name, l, rank, dims, what)
                      : CLATTN_SUCCESS;
}

/* The table as the (1, 1, rows, cols) view v the score step reads; a stride 0 broadcasts (mem
 * bound at execution). */
static void table_view(size_t rows, size_t row_stride, size_t cols, size_t col_stride,
                       clattn__view *v)
{
    v->dtype = CLATTN_DTYPE_F32;
    v->dims[0] = v->dims[1] = 1;
    v->dims[2] = rows;
    v->strides[2] = row_stride;
    v->dims[3] = cols;
    v->strides[3] = col_stride;
}

clattn_status clattn__plan_alibi(clattn_plan *plan, clattn__score_shape *score)
{
    const clattn__layout *alibi = &plan->layouts[R_ALIBI];
    const size_t per_head[1] = {score->heads};
    const size_t per_batch[2] = {score->batch, score->heads};
    const bool rank1 = alibi->rank == 1;
    const clattn_status status = check_table(
        plan, R_ALIBI, "alibi_slopes", rank1 ? 1 : 2, rank1 ? per_head : per_batch,
        "(heads) or (batch, heads) of F32 slopes (ALiBi)", &score->has_alibi, &plan->views.alibi);
    if (status == CLATTN_SUCCESS && alibi->present)
        table_view(score->batch, rank1 ? 0 : alibi->strides[0], score->heads,
                   alibi->strides[rank1 ? 0 : 1], &plan->views.alibi);
    return status;
}

clattn_status clattn__plan_sinks(clattn_plan *plan, clattn__score_shape *score)
{
    const clattn__layout *sinks = &plan->layouts[R_SINKS];
    if (sinks->present && score->norm != CLATTN_NORM_SOFTMAX)
        return clattn__fail(plan->ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: sinks with norm=CLATTN_NORM_RELU: attention sinks join a "
                            "softmax's denominator (use CLATTN_NORM_SOFTMAX)",
                            plan->op);
    const size_t per_head[1] = {score->heads};
    const clattn_status status =
        check_table(plan, R_SINKS, "sinks", 1, per_head, "(heads) of F32 logits (attention sinks)",
                    &score->has_sinks, &plan->views.sinks);
    if (status == CLATTN_SUCCESS && sinks->present)
        table_view(score->heads, sinks->strides[0], score->seq_q, 0, &plan->views.sinks);
    return status;
}

clattn_status clattn__plan_dropout(clattn_plan *plan, double p, unsigned long long seed,
                                   unsigned long long offset, clattn__score_shape *score)
{
    score->dropout = false;
    if (!(p >= 0.0 && p <= 1.0))
        return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: dropout_p=%g: a probability from 0 (off) to 1", plan->op, p);
    if (p == 0.0)
        return CLATTN_SUCCESS;
    const clattn__layout *l = plan->layouts;
    const char *refused = l[R_CU_Q].present || l[R_CU_K].present ? "packed sequences (cu_seqlens)"
                          : l[R_BLOCK_TABLE].present             ? "a paged cache (block_table)"
                          : (((1u << l[R_K].dtype) | (1u << l[R_V].dtype)) & CLATTN__QUANT)
                              ? "quantized k/v"
                              : NULL;
    if (refused != NULL)
        return clattn__fail(plan->ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: dropout_p=%g with %s: not supported (dropout is for training "
                            "on dense batches)",
                            plan->op, p, refused);
    score->dropout = true;
    score->dropout_seed = seed;
    score->dropout_offset = offset;
    clattn__dropout_fields(p, &score->dropout_threshold, &score->dropout_scale);
    return CLATTN_SUCCESS;
}

clattn_status clattn__plan_score(clattn_plan *plan, float scale, clattn_norm norm,
                                 size_t head_dim_qk, clattn__score_shape *score)
{
    clattn_ctx *ctx = plan->ctx;
    if (norm != CLATTN_NORM_SOFTMAX && norm != CLATTN_NORM_RELU)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: norm=%d is not a clattn_norm",
                            plan->op, (int)norm);
    if (isinf(scale))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: scale=%g: give a finite scale, or NAN for 1/sqrt(head size)",
                            plan->op, (double)scale);
    score->norm = norm;
    score->scale = isnan(scale) ? (float)(1.0 / sqrt((double)head_dim_qk)) : scale;
    return CLATTN_SUCCESS;
}

clattn_status clattn__plan_masks(clattn_plan *plan, size_t batch, size_t heads, size_t seq_q,
                                 size_t seq_k, clattn__score_shape *score)
{
    clattn_ctx *ctx = plan->ctx;
    const size_t target[4] = {batch, heads, seq_q, seq_k};
    score->batch = batch, score->heads = heads, score->seq_q = seq_q, score->seq_k = seq_k;
    /* packed sequences (clattn__pack_varlen): seq_q and seq_k are then the longest */
    score->varlen = plan->varlen.on;
    score->total_q = plan->varlen.on ? plan->varlen.total_q : 0;
    score->total_k = plan->varlen.on ? plan->varlen.total_k : 0;
    const clattn__layout *mask = &plan->layouts[R_MASK];
    score->has_mask = mask->present;
    memset(&plan->views.mask, 0, sizeof plan->views.mask);
    memset(&plan->views.key_padding, 0, sizeof plan->views.key_padding);
    if (mask->present) {
        clattn__view_of(mask, &plan->views.mask);
        score->mask_dtype = mask->dtype;
        for (int d = 0; d < 4; ++d) {
            if (plan->views.mask.dims[d] == target[d])
                continue;
            if (plan->views.mask.dims[d] != 1) {
                char got[128], want[128];
                clattn__format_dims(got, sizeof got, mask->rank, mask->dims);
                clattn__format_dims(want, sizeof want, 4, target);
                return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                    "%s: attn_mask has dims %s, which do not broadcast to "
                                    "(batch, heads, seq_q, seq_k) = %s",
                                    plan->op, got, want);
            }
            plan->views.mask.dims[d] = target[d];
            plan->views.mask.strides[d] = 0;
        }
    }
    const clattn__layout *kpm = &plan->layouts[R_KPM];
    score->has_key_padding = kpm->present;
    if (kpm->present) {
        const size_t want[2] = {batch, seq_k};
        clattn_status status = clattn__layout_expect(ctx, plan->op, "key_padding_mask", kpm, 2,
                                                     want, "(batch, seq_k)");
        if (status != CLATTN_SUCCESS)
            return status;
        clattn__view_of(kpm, &plan->views.key_padding);
    }
    return CLATTN_SUCCESS;
}

/* A window size as the band's bound: -1 for none; sizes past any key position reachable
 * (positions lie within +-2^33) are unbounded too, which keeps the kernels' sums in range. */
static long long band_bound(long long size)
{
    return size < 0 || size > (1LL << 34) ? -1 : size;
}

/* a + b, each first held to +-2^61 so that the sum cannot overflow: far past any position. */
static long long add_held(long long a, long long b)
{
    const long long cap = 1LL << 61;
    a = a > cap ? cap : a < -cap ? -cap : a;
    b = b > cap ? cap : b < -cap ? -cap : b;
    return a + b;
}

/* CLATTN_CAUSAL_OFFSET's band: query i sees keys up to i + diag (causal) and from
 * i + diag - left to i + diag + right (window). The diagonal may be huge, so a huge window size
 * is not "unbounded" by itself (a diagonal of -2^40 and a right size of 2^40 end the band at
 * the row): each edge is summed first, then an edge past any key reachable (keys and rows lie
 * below 2^32) becomes unbounded on its open side and is held to +-2^34 on the other, and the
 * band is written as (diag = the upper edge, upper 0, lower = upper - lower edge). */
static void offset_band(bool causal, bool window, long long window_left, long long window_right,
                        long long diag_offset, clattn__score_shape *score)
{
    const long long reach = 1LL << 34;
    bool has_upper = causal, has_lower = false;
    long long upper = diag_offset, lower = 0;
    if (window && window_right >= 0) {
        const long long edge = add_held(diag_offset, window_right);
        upper = has_upper && upper < edge ? upper : edge;
        has_upper = true;
    }
    if (window && window_left >= 0) {
        lower = add_held(diag_offset, -window_left);
        has_lower = true;
    }
    if (has_upper && upper > reach)
        has_upper = false; /* past every key: no upper bound */
    if (has_lower && lower < -reach)
        has_lower = false; /* before every key: no lower bound */
    upper = upper < -reach ? -reach : upper; /* before every key: nothing kept */
    lower = lower > reach ? reach : lower;   /* past every key: nothing kept */
    score->band_diag = has_upper ? upper : has_lower ? lower : 0;
    score->band_upper = has_upper ? 0 : -1;
    score->band_lower = !has_lower ? -1 : score->band_diag - lower > 0 ? score->band_diag - lower : 0;
}

clattn_status clattn__plan_band(clattn_plan *plan, clattn_causal causal, clattn_causal window_align,
                                long long window_left, long long window_right, long long past_len,
                                long long diag_offset, clattn__score_shape *score)
{
    clattn_ctx *ctx = plan->ctx;
    const bool sdpa = plan->ops->kind == CLATTN__SDPA || plan->ops->kind == CLATTN__SDPA_BACKWARD;
    const clattn_causal last = sdpa ? CLATTN_CAUSAL_OFFSET : CLATTN_CAUSAL_BOTTOM_RIGHT;
    if ((unsigned)causal > (unsigned)last)
        return clattn__fail(
            ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: causal=%d is not a clattn_causal%s", plan->op,
            (int)causal, sdpa ? "" : " of MHA and additive plans (NONE, TOP_LEFT, BOTTOM_RIGHT)");
    if ((unsigned)window_align > (unsigned)last)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: window_align=%d is not a clattn_causal", plan->op,
                            (int)window_align);
    if (causal != CLATTN_CAUSAL_NONE && window_align != CLATTN_CAUSAL_NONE &&
        causal != window_align)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: causal=%d and window_align=%d: the causal bound and the "
                            "sliding window must use the same alignment",
                            plan->op, (int)causal, (int)window_align);
    const clattn__layout *kv_len = &plan->layouts[R_KVLEN];
    score->has_kv_len = kv_len->present;
    memset(&plan->views.kv_len, 0, sizeof plan->views.kv_len);
    if (kv_len->present) {
        const size_t want[1] = {score->batch};
        clattn_status status = clattn__layout_expect(ctx, plan->op, "kv_seqlen", kv_len, 1, want,
                                                     "(batch) of I32 key counts");
        if (status != CLATTN_SUCCESS)
            return status;
        clattn__view_of(kv_len, &plan->views.kv_len);
    }
    const clattn_causal align = causal != CLATTN_CAUSAL_NONE ? causal : window_align;
    const long long seq_q = (long long)score->seq_q, seq_k = (long long)score->seq_k;
    score->band_diag = 0;
    score->band_diag_kv = false;
    /* per-batch key counts: kv_seqlen's, or packed sequences' own (score.cl's span_band) */
    const bool counts = kv_len->present || score->varlen;
    if (align == CLATTN_CAUSAL_BOTTOM_RIGHT ||
        (align == CLATTN_CAUSAL_ONNX && past_len < 0 && counts)) {
        score->band_diag_kv = counts; /* the batch's key count - seq_q */
        score->band_diag = counts ? -seq_q : seq_k - seq_q;
    } else if (align == CLATTN_CAUSAL_ONNX && past_len >= 0) {
        score->band_diag = past_len; /* ONNX: the keys before this block */
    } else if (align == CLATTN_CAUSAL_OFFSET) {
        offset_band(causal != CLATTN_CAUSAL_NONE, window_align != CLATTN_CAUSAL_NONE,
                    window_left, window_right, diag_offset, score);
        return CLATTN_SUCCESS;
    }
    score->band_upper = causal != CLATTN_CAUSAL_NONE ? 0 : -1;
    score->band_lower = -1;
    if (window_align != CLATTN_CAUSAL_NONE) {
        const long long right = band_bound(window_right);
        if (right >= 0 && (score->band_upper < 0 || right < score->band_upper))
            score->band_upper = right;
        score->band_lower = band_bound(window_left);
    }
    return CLATTN_SUCCESS;
}

static bool reserve(size_t *cursor, size_t floats, size_t *at)
{
    *at = *cursor;
    return clattn__add(*cursor, floats, cursor);
}

bool clattn__auto_fuses(const clattn__score_shape *score, size_t head_dim_qk, size_t head_dim_v,
                        bool want_weights)
{
    return !want_weights && !score->want_scores && !score->softmax_f64 &&
           clattn__flash_supports(head_dim_qk, head_dim_v);
}

clattn_status clattn__attention_prepare(clattn_plan *plan, const clattn__score_shape *score,
                                        size_t head_dim_qk, size_t head_dim_v,
                                        clattn_dtype q_dtype, clattn_dtype k_dtype,
                                        clattn_dtype v_dtype, clattn_dtype out_dtype,
                                        bool want_weights, bool want_lse, clattn_path path,
                                        size_t *workspace_floats)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    clattn__attention *a = &plan->attention;
    a->score = *score;
    a->head_dim_qk = head_dim_qk;
    a->head_dim_v = head_dim_v;
    const bool supported = clattn__flash_supports(head_dim_qk, head_dim_v);
    switch (path) {
    case CLATTN_PATH_AUTO:
        a->fused = clattn__auto_fuses(score, head_dim_qk, head_dim_v, want_weights);
        break;
    case CLATTN_PATH_UNFUSED:
        a->fused = false;
        break;
    case CLATTN_PATH_FUSED:
        if (want_weights)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: path=FUSED cannot return the attention weights (the fused "
                                "kernel never forms them): use AUTO or UNFUSED",
                                op);
        if (score->want_scores)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: path=FUSED cannot return the scores (the fused kernel never "
                                "stores them): use AUTO or UNFUSED",
                                op);
        if (score->softmax_f64)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: path=FUSED normalises in float; softmax_f64 runs on the "
                                "unfused path: use AUTO or UNFUSED",
                                op);
        if (!supported)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: path=FUSED takes head sizes up to %d (got %zu, %zu)", op,
                                CLATTN__FLASH_MAX_HEAD_DIM, head_dim_qk, head_dim_v);
        a->fused = true;
        break;
    default:
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: path=%d is not a clattn_path",
                            op, (int)path);
    }
    if (want_lse && !a->fused)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: lse comes from the fused kernel only: head sizes up to %d, "
                            "path AUTO or FUSED, no weights",
                            op, CLATTN__FLASH_MAX_HEAD_DIM);
    /* The problem's tuning: one query row per head (a decode group's rows are heads) is the
     * decode phase. */
    const bool decode = score->seq_q == 1 || plan->attention.decode_group > 1;
    clattn__tuning_for(ctx, head_dim_qk, q_dtype, decode, &a->tuning, a->tuning_records,
                       sizeof a->tuning_records);
    if (a->fused) {
        const clattn__flash_shape shape = {
            .score = *score,
            .head_dim_qk = head_dim_qk,
            .head_dim_v = head_dim_v,
            .q_dtype = q_dtype,
            .k_dtype = k_dtype,
            .v_dtype = v_dtype,
            .out_dtype = out_dtype,
            .has_lse = want_lse,
            .tuning = &a->tuning,
        };
        clattn_status status = clattn__flash_prepare(ctx, &shape, &a->flash);
        /* No fused variant survived validation (core/validate.h): AUTO goes unfused where
         * that path can run the problem. */
        const bool quantized = ((1u << k_dtype) | (1u << v_dtype)) & CLATTN__QUANT;
        if (status != CLATTN_SUCCESS && path == CLATTN_PATH_AUTO &&
            clattn__variant_fallible(status) && !want_lse && !score->varlen &&
            !score->kv_paged && !score->flex_blocks && !score->flex_count && !quantized) {
            snprintf(a->fallback, sizeof a->fallback, "%.150s", ctx->message);
            a->fused = false;
        } else if (status != CLATTN_SUCCESS) {
            return status;
        }
    }
    if (a->fused) {
        snprintf(plan->info, sizeof plan->info,
                 "%s: fused, %s%s%s%s; %s phase, tuning records: %s", op, a->flash.variant,
                 a->flash.splits > 1 ? " in decode splits" : "",
                 a->flash.passed[0] ? "; passed over: " : "", a->flash.passed,
                 decode ? "decode" : "prefill",
                 a->tuning_records[0] ? a->tuning_records : "none");
        if (!reserve(workspace_floats, a->flash.scratch_floats, &a->scratch_at))
            return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: the workspace overflows size_t",
                                op);
        return CLATTN_SUCCESS;
    }
    const clattn__matmul_shape qk = {
        .m = score->seq_q,
        .n = score->seq_k,
        .k = head_dim_qk,
        .batch = {score->batch, score->heads},
        .trans_b = true,
        .b_group = score->kv_group, /* grouped-query: k's heads are shared */
        .a_dtype = q_dtype,
        .b_dtype = k_dtype,
        .c_dtype = CLATTN_DTYPE_F32,
    };
    const clattn__matmul_shape pv = {
        .m = score->seq_q,
        .n = head_dim_v,
        .k = score->seq_k,
        .batch = {score->batch, score->heads},
        .b_group = score->kv_group,
        .a_dtype = CLATTN_DTYPE_F32,
        .b_dtype = v_dtype,
        .c_dtype = out_dtype,
    };
    clattn_status status;
    if ((status = score->additive
                      ? clattn__additive_prepare(ctx, score->batch, score->heads, score->seq_q,
                                                 score->seq_k, head_dim_qk, &a->additive)
                      : clattn__matmul_prepare(ctx, &qk, &a->qk)) ||
        (status = clattn__softmax_prepare(ctx, score, &a->softmax)) ||
        (status = clattn__matmul_prepare(ctx, &pv, &a->pv)))
        return status;
    size_t scores = 0;
    if (!clattn__product(&scores, 4, score->batch, score->heads, score->seq_q, score->seq_k))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                            "%s: the scores (batch, heads, seq_q, seq_k) overflow size_t", op);
    a->own_scores = !want_weights;
    snprintf(plan->info, sizeof plan->info, "%s: unfused, %s, softmax rows, matmul (P V)%s%s%s",
             op, score->additive ? "additive scores" : "matmul (Q K^T)",
             want_weights ? ", the weights returned" : "",
             a->fallback[0] ? "; the fused path failed validation: " : "", a->fallback);
    const size_t scratch = a->qk.scratch_floats > a->pv.scratch_floats ? a->qk.scratch_floats
                                                                       : a->pv.scratch_floats;
    if ((a->own_scores && !reserve(workspace_floats, scores, &a->scores_at)) ||
        !reserve(workspace_floats, scratch, &a->scratch_at))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: the workspace overflows size_t", op);
    return CLATTN_SUCCESS;
}

clattn_status clattn__attention_enqueue(clattn_plan *plan, const clattn__attention_io *io,
                                        cl_mem workspace, clattn_chain *chain)
{
    const clattn__attention *a = &plan->attention;
    const clattn__scratch scratch = {workspace, a->scratch_at};
    if (a->fused)
        return clattn__flash_enqueue(chain, &a->flash, &io->q, &io->k, &io->v, &io->out,
                                                  &io->lse, &io->masks, scratch);
    clattn__view scores = io->weights;
    if (a->own_scores) {
        const clattn__score_shape *s = &a->score;
        scores = (clattn__view){
            .mem = workspace,
            .offset = a->scores_at,
            .dtype = CLATTN_DTYPE_F32,
            .dims = {s->batch, s->heads, s->seq_q, s->seq_k},
            .strides = {s->heads * s->seq_q * s->seq_k, s->seq_q * s->seq_k, s->seq_k, 1},
        };
    }
    const clattn__view none = {0};
    clattn_status status;
    if ((status = a->score.additive
                                   ? clattn__additive_enqueue(chain, &a->additive, &io->q, &io->k,
                                                              &io->masks.additive_w, &scores)
                                   : clattn__matmul_enqueue(chain, &a->qk, &io->q, &io->k, &none,
                                                            &scores, 1.0f, 0.0f, scratch)) ||
        (a->score.want_scores &&
         (status = clattn__score_copy_enqueue(chain, &a->softmax, &scores, &io->scores,
                                                           &io->masks))) ||
        (status = clattn__softmax_enqueue(chain, &a->softmax, &scores, &scores,
                                                       &io->masks)))
        return status;
    return clattn__matmul_enqueue(chain, &a->pv, &scores, &io->v, &none, &io->out, 1.0f,
                                               0.0f, scratch);
}

/* A (batch, seq, features) layout as a matmul operand: (1, 1, batch*seq, f) when flat, else
 * (1, batch, seq, f). */
clattn__view clattn__rows_view(const clattn__layout *l, cl_mem mem, size_t offset, bool flat)
{
    clattn__view v = {.mem = mem, .offset = offset, .dtype = l->dtype};
    v.dims[0] = 1, v.strides[0] = 0;
    v.dims[1] = flat ? 1 : l->dims[0];
    v.strides[1] = flat ? 0 : l->strides[0];
    v.dims[2] = flat ? l->dims[0] * l->dims[1] : l->dims[1];
    v.strides[2] = l->strides[1];
    v.dims[3] = l->dims[2];
    v.strides[3] = l->strides[2];
    return v;
}

bool clattn__rows_flatten(const clattn__layout *l)
{
    return l->dims[0] == 1 || l->strides[0] == l->dims[1] * l->strides[1];
}

clattn_status clattn__projection_prepare(clattn_ctx *ctx, const clattn__layout *input,
                                         const clattn__layout *weight, size_t batch, size_t rows,
                                         size_t n, bool trans_w, bool has_bias,
                                         clattn_dtype out_dtype, bool flat, clattn__matmul_plan *mm)
{
    const clattn__matmul_shape shape = {
        .m = flat ? batch * rows : rows,
        .n = n,
        .k = input->dims[2],
        .batch = {1, flat ? 1 : batch},
        .trans_b = trans_w,
        .a_dtype = input->dtype,
        .b_dtype = weight->dtype,
        .c_dtype = out_dtype,
        .has_bias = has_bias,
    };
    return clattn__matmul_prepare(ctx, &shape, mm);
}

clattn_status clattn__expect_unit_stride(const clattn_plan *plan, const char *name,
                                         const clattn__layout *l, const char *along)
{
    if (l->strides[l->rank - 1] == 1)
        return CLATTN_SUCCESS;
    return clattn__fail(plan->ctx, CLATTN_ERR_UNSUPPORTED,
                        "%s: %s must have stride 1 along its %s (got %zu)", plan->op, name, along,
                        l->strides[l->rank - 1]);
}

clattn_status clattn__finish_projections(clattn_plan *plan, size_t cursor, size_t scratch,
                                         size_t *scratch_at)
{
    *scratch_at = cursor;
    if (!clattn__add(cursor, scratch, &cursor))
        return clattn__fail(plan->ctx, CLATTN_ERR_OVERFLOW, "%s: the workspace overflows size_t",
                            plan->op);
    plan->workspace_floats = cursor;
    return clattn__plan_finish(plan, plan->attention.fused
                                         ? "the projections"
                                         : "the projections and the scores (batch, heads, "
                                           "seq_q, seq_k)");
}
