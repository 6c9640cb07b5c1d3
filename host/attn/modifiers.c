/* The score modifiers of SDPA plans and their backward, as one table: each row is one modifier
 * of score.cl's rule (its descriptor fields and roles, its validation and refusals, what it
 * sets in the score shape). The kernel side of a row is score.cl's function behind the hooks
 * and, when compiled in, its switch in host/ops/score.c's table; the operands reach the
 * kernels through clattn__score_params (ops/score.c). A built-in written as score functions
 * (T5's relative-position buckets below) is a row that adds a part to the plan's score
 * functions (flex.c): OpenCL C behind score.cl's flex hooks, so it needs no kernel change.
 *
 * Adding a built-in: a row here (its step), its descriptor fields (include/clattn.h) and, if it
 * reads a tensor, a role (clattn.h and CLATTN__ROLES in plan.h: roles after flex_aux0 are
 * validated by their modifier's step, so plan.c needs nothing). */
#include "plan.h"

#include <float.h>
#include <stdio.h>
#include <string.h>

/* What the modifiers read: the plan's descriptor and the problem's shape. */
typedef struct score_args {
    const clattn_sdpa_desc *desc;
    size_t batch, heads, seq_q, seq_k, head_dim_qk;
    long long past_len; /* -1: no past tensors */
    bool backward;
} score_args;

typedef clattn_status (*modifier_step)(clattn_plan *plan, const score_args *a,
                                       clattn__score_shape *score, clattn__flex_parts *parts);

static clattn_status step_rule(clattn_plan *plan, const score_args *a, clattn__score_shape *score,
                               clattn__flex_parts *parts)
{
    (void)parts;
    return clattn__plan_score(plan, a->desc->scale, a->desc->norm, a->head_dim_qk, score);
}

static clattn_status step_masks(clattn_plan *plan, const score_args *a, clattn__score_shape *score,
                                clattn__flex_parts *parts)
{
    (void)parts;
    return clattn__plan_masks(plan, a->batch, a->heads, a->seq_q, a->seq_k, score);
}

static clattn_status step_softcap(clattn_plan *plan, const score_args *a,
                                  clattn__score_shape *score, clattn__flex_parts *parts)
{
    (void)parts;
    const float softcap = a->desc->softcap;
    if (!(softcap >= 0.0f && softcap <= FLT_MAX))
        return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: softcap=%g: must be 0 (off) or a finite positive cap", plan->op,
                            (double)softcap);
    score->softcap = softcap;
    return CLATTN_SUCCESS;
}

static clattn_status step_alibi(clattn_plan *plan, const score_args *a, clattn__score_shape *score,
                                clattn__flex_parts *parts)
{
    (void)a, (void)parts;
    return clattn__plan_alibi(plan, score);
}

static clattn_status step_sinks(clattn_plan *plan, const score_args *a, clattn__score_shape *score,
                                clattn__flex_parts *parts)
{
    (void)a, (void)parts;
    return clattn__plan_sinks(plan, score);
}

static clattn_status step_dropout(clattn_plan *plan, const score_args *a,
                                  clattn__score_shape *score, clattn__flex_parts *parts)
{
    (void)parts;
    return clattn__plan_dropout(plan, a->desc->dropout_p, a->desc->dropout_seed,
                                a->desc->dropout_offset, score);
}

static clattn_status step_band(clattn_plan *plan, const score_args *a, clattn__score_shape *score,
                               clattn__flex_parts *parts)
{
    (void)parts;
    const clattn_sdpa_desc *d = a->desc;
    return clattn__plan_band(plan, d->causal, d->window_align, d->window_left, d->window_right,
                             a->past_len, d->diag_offset, score);
}

/* T5's relative-position buckets (Raffel et al.; HF's T5Attention._relative_position_bucket):
 * score + t5_bias[bucket(kv_idx - q_pos), h], q_pos = q_idx + seq_k - seq_q (the query's
 * position among the keys, as a decode step's). Its gradient by the score is 1. */
static const char t5_source[] =
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx)\n"
    "{\n"
    "    int rel = kv_idx - (q_idx + T5_QPOS);\n"
    "    int n = T5_BUCKETS, bucket = 0;\n"
    "    if (T5_BIDIRECTIONAL) {\n"
    "        n /= 2;\n"
    "        bucket = rel > 0 ? n : 0;\n"
    "        rel = abs(rel);\n"
    "    } else {\n"
    "        rel = -min(rel, 0);\n"
    "    }\n"
    "    const int exact = n / 2;\n"
    "    if (rel < exact) {\n"
    "        bucket += rel;\n"
    "    } else {\n"
    "        const float scaled = log((float)rel / (float)exact) /\n"
    "                             log((float)T5_MAX_DISTANCE / (float)exact) * (float)(n - exact);\n"
    "        bucket += min(exact + (int)scaled, n - 1);\n"
    "    }\n"
    "    return score + t5_bias[bucket * T5_HEADS + h];\n"
    "}\n"
    "float score_mod_grad(float score, int b, int h, int q_idx, int kv_idx)\n"
    "{\n"
    "    return 1.0f;\n"
    "}\n";

static clattn_status step_t5(clattn_plan *plan, const score_args *a, clattn__score_shape *score,
                             clattn__flex_parts *parts)
{
    (void)score;
    const clattn__layout *bias = &plan->layouts[R_T5_BIAS];
    if (!bias->present)
        return CLATTN_SUCCESS;
    const clattn_sdpa_desc *d = a->desc;
    if (d->t5_num_buckets < 2 || d->t5_num_buckets > 4096 || d->t5_max_distance < 1 ||
        d->t5_max_distance > (1u << 24) || (d->t5_bidirectional != 0 && d->t5_bidirectional != 1))
        return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: t5_bias needs t5_num_buckets (2 to 4096; got %zu), "
                            "t5_max_distance (1 to 2^24; got %zu) and t5_bidirectional (0 or 1; "
                            "got %d)",
                            plan->op, d->t5_num_buckets, d->t5_max_distance, d->t5_bidirectional);
    if ((size_t)d->t5_bidirectional + 2 > d->t5_num_buckets / (d->t5_bidirectional ? 2 : 1) ||
        d->t5_max_distance <= d->t5_num_buckets / (d->t5_bidirectional ? 4 : 2))
        return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: t5_num_buckets=%zu, t5_max_distance=%zu: the exact buckets "
                            "(half of each side's) must be at least 1 and below max_distance",
                            plan->op, d->t5_num_buckets, d->t5_max_distance);
    const size_t want[2] = {d->t5_num_buckets, a->heads};
    clattn_status status = clattn__layout_expect(plan->ctx, plan->op, "t5_bias", bias, 2, want,
                                                 "(t5_num_buckets, heads) F32, T5's "
                                                 "relative_attention_bias weight");
    if (status == CLATTN_SUCCESS && bias->dtype != CLATTN_DTYPE_F32)
        status = clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: t5_bias must be F32",
                              plan->op);
    if (status == CLATTN_SUCCESS && plan->varlen.on)
        status = clattn__fail(plan->ctx, CLATTN_ERR_UNSUPPORTED,
                              "%s: t5_bias with packed sequences (cu_seqlens): not supported",
                              plan->op);
    if (status != CLATTN_SUCCESS)
        return status;
    /* the source with its constants: a new size is a new program, built once */
    char *text = plan->t5_source;
    snprintf(text, sizeof plan->t5_source,
             "#define T5_BUCKETS %zu\n#define T5_MAX_DISTANCE %zu\n#define T5_BIDIRECTIONAL %d\n"
             "#define T5_HEADS %zu\n#define T5_QPOS %lld\n%s"
             "#undef T5_BUCKETS\n#undef T5_MAX_DISTANCE\n#undef T5_BIDIRECTIONAL\n"
             "#undef T5_HEADS\n#undef T5_QPOS\n",
             d->t5_num_buckets, d->t5_max_distance, d->t5_bidirectional, a->heads,
             (long long)a->seq_k - (long long)a->seq_q, t5_source);
    clattn__flex_part *part = &parts->part[parts->count++];
    memset(part, 0, sizeof *part);
    part->file = "t5_buckets";
    part->source = text;
    part->functions = CLATTN_FLEX_SCORE_MOD | CLATTN_FLEX_SCORE_MOD_GRAD;
    part->num_aux = 1;
    part->names[0] = "t5_bias";
    part->roles[0] = R_T5_BIAS;
    return CLATTN_SUCCESS;
}

/* The built-ins' parts and the user's (desc.flex): last, once every part is known. */
static clattn_status step_flex(clattn_plan *plan, const score_args *a, clattn__score_shape *score,
                               clattn__flex_parts *parts)
{
    return clattn__plan_flex(plan, parts, &a->desc->flex, a->batch, a->heads, a->seq_q, a->seq_k,
                             a->backward, score);
}

/* The table: (name, step), in the order the steps run (the rule and the masks first: they set
 * the shape's sizes; the score functions last: they gather the built-ins' parts). */
#define CLATTN__MODIFIERS(X)                                                                       \
    X("scale and norm", step_rule)                                                                 \
    X("attn_mask, key_padding_mask", step_masks)                                                   \
    X("softcap", step_softcap)                                                                     \
    X("alibi_slopes", step_alibi)                                                                  \
    X("sinks", step_sinks)                                                                         \
    X("dropout", step_dropout)                                                                     \
    X("causal, window", step_band)                                                                 \
    X("t5_bias", step_t5)                                                                          \
    X("flex", step_flex)

static const struct {
    const char *name;
    modifier_step step;
} modifiers[] = {
#define CLATTN__MODIFIER_ROW(name, step) {name, step},
    CLATTN__MODIFIERS(CLATTN__MODIFIER_ROW)
#undef CLATTN__MODIFIER_ROW
};

clattn_status clattn__plan_modifiers(clattn_plan *plan, const clattn_sdpa_desc *desc,
                                     size_t batch, size_t heads, size_t seq_q, size_t seq_k,
                                     size_t head_dim_qk, long long past_len, bool backward,
                                     clattn__score_shape *score)
{
    const score_args args = {desc, batch, heads, seq_q, seq_k, head_dim_qk, past_len, backward};
    clattn__flex_parts parts;
    memset(&parts, 0, sizeof parts);
    clattn_status status = CLATTN_SUCCESS;
    for (size_t i = 0; i < sizeof modifiers / sizeof modifiers[0] && status == CLATTN_SUCCESS;
         ++i)
        status = modifiers[i].step(plan, &args, score, &parts);
    return status;
}
