/* The score rule and normalisation over rows of raw scores: variant and launch for
 * kernels/softmax.cl. */
#include "ops.h"
#include "probe.h" /* self-validation (core/validate.h) */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The family (core/family.h): a work-group per row (SOFTMAX_WG), a work-item per row
 * (SOFTMAX_VEC, SOFTMAX_ROWS per group) or a work-item per row in double (SOFTMAX_F64). */
/* clang-format off */
#define SOFTMAX_SWITCHES(X)                                                                        \
    X(SOFTMAX_VEC, CLATTN_SWITCH_OPTIONAL, NULL) X(SOFTMAX_ROWS, CLATTN_SWITCH_OPTIONAL, NULL)     \
    X(SOFTMAX_WG, CLATTN_SWITCH_OPTIONAL, NULL) X(SOFTMAX_F64, CLATTN_SWITCH_OPTIONAL, NULL)
/* clang-format on */
CLATTN_FAMILY(softmax, SOFTMAX_SWITCHES, .sources = {"softmax.cl"},
              .score_family = CLATTN__FAMILY_SOFTMAX, .tuning_keys = "softmax_rows softmax_wg");

/* Kernel `name` of the softmax program for `sw` and the score's switches. */
static clattn_status softmax_kernel(clattn_ctx *ctx, const clattn__score_shape *score,
                                    const char *name, const softmax_switches *sw, cl_kernel *out)
{
    clattn_define defines[CLATTN_DEFINES_MAX];
    const size_t count = clattn__score_defines(score, softmax_family.score_family, defines);
    return clattn__family_kernel(ctx, &softmax_family, name, sw, defines, count, out);
}

/* score_copy (the scores output) from the program of `sw`. */
static clattn_status prepare_copy(clattn_ctx *ctx, const clattn__score_shape *score,
                                  clattn__softmax_plan *plan, const softmax_switches *sw)
{
    static const char op[] = "score_copy";
    /* score_copy: the same program; groups of up to 64 work-items. */
    size_t elements = 0;
    if (!clattn__mul(plan->rows, score->seq_k, &elements))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: the scores overflow size_t", op);
    plan->copy_local = ctx->info.max_work_group_size < 64 ? ctx->info.max_work_group_size : 64;
    if (!clattn__round_up(elements, plan->copy_local, &plan->copy_global))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: the scores overflow size_t", op);
    return softmax_kernel(ctx, score, "score_copy", sw, &plan->copy);
}

static clattn_status prepare_variant(clattn_ctx *ctx, const clattn__score_shape *score,
                                     unsigned rows_vec, clattn__softmax_plan *plan)
{
    static const char op[] = "softmax_rows";
    memset(plan, 0, sizeof *plan);
    plan->score = *score;
    if (!clattn__product(&plan->rows, 3, score->batch, score->heads, score->seq_q))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: %zu x %zu x %zu rows overflow size_t",
                            op, score->batch, score->heads, score->seq_q);
    if (score->has_mask && (unsigned)score->mask_dtype > CLATTN_DTYPE_U8)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: mask dtype %d is unknown", op,
                            (int)score->mask_dtype);
    /* One variant per mask dtype (none shares F32's); the rest are kernel arguments. */
    softmax_switches sw = {0};
    if (score->softmax_f64) {
        if (!ctx->info.has_fp64)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: softmax_f64: the device has no double precision "
                                "(cl_khr_fp64); normalise in float instead",
                                op);
        /* A work-item per row (softmax.cl says why), groups of up to 64. */
        plan->local = ctx->info.max_work_group_size < 64 ? ctx->info.max_work_group_size : 64;
        if (!clattn__round_up(plan->rows, plan->local, &plan->global))
            return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: %zu rows overflow size_t", op,
                                plan->rows);
        sw.SOFTMAX_WG = ctx->tuning.softmax_wg, sw.SOFTMAX_F64 = 1;
        clattn_status status = softmax_kernel(ctx, score, "softmax_rows_f64", &sw, &plan->kernel);
        if (status != CLATTN_SUCCESS || !score->want_scores)
            return status;
        return prepare_copy(ctx, score, plan, &sw);
    }
    if (rows_vec > 0) {
        /* A work-item per row: smaller groups while there are too few of them to keep two
         * threads per compute unit busy (each group size is its own build). */
        size_t local = rows_vec;
        while (local > 1 && plan->rows / local < 2 * (size_t)ctx->info.compute_units)
            local /= 2;
        plan->local = local;
        plan->global = (plan->rows + local - 1) / local * local;
        if (plan->global < plan->rows)
            return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: %zu rows overflow size_t", op,
                                plan->rows);
        sw.SOFTMAX_VEC = 1, sw.SOFTMAX_ROWS = (long)local;
    } else {
        plan->local = ctx->tuning.softmax_wg;
        if (!clattn__mul(plan->rows, plan->local, &plan->global))
            return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                                "%s: %zu x %zu x %zu rows overflow size_t", op, score->batch,
                                score->heads, score->seq_q);
        sw.SOFTMAX_WG = ctx->tuning.softmax_wg;
    }
    clattn_status status = softmax_kernel(ctx, score, op, &sw, &plan->kernel);
    if (status != CLATTN_SUCCESS || !score->want_scores)
        return status;
    return prepare_copy(ctx, score, plan, &sw);
}

clattn_status clattn__softmax_prepare(clattn_ctx *ctx, const clattn__score_shape *score,
                                      clattn__softmax_plan *plan)
{
    /* Self-validation's ladder (core/validate.h): a work-item per row where the tuning asks
     * for it, else (or when it fails on this device) a work-group per row. */
    unsigned rows_vec = ctx->tuning.softmax_rows;
    for (;;) {
        clattn_status status = prepare_variant(ctx, score, rows_vec, plan);
        if (status == CLATTN_SUCCESS)
            status = clattn__softmax_trust(ctx, plan);
        if (status == CLATTN_SUCCESS || rows_vec == 0 || score->softmax_f64 ||
            !clattn__variant_fallible(status))
            return status;
        rows_vec = 0;
    }
}

/* Launches one of softmax.cl's kernels (each takes raw, out, the score buffers and the
 * family's struct) over the (batch, heads, seq_q) rows of raw into out. */
static clattn_status launch_rows(clattn_chain *chain, const clattn__softmax_plan *plan,
                                 cl_kernel kernel, const char *name, const size_t *global,
                                 const size_t *local, const clattn__view *raw,
                                 const clattn__view *out, const clattn__score_masks *masks)
{
    const clattn__score_shape *score = &plan->score;
    clattn_softmax_params params;
    clattn__score_buffers buffers;
    clattn__score_params(score, masks, raw->mem, &params.score, &buffers);
    params.raw_offset = raw->offset;
    params.raw_s0 = raw->strides[0];
    params.raw_s1 = raw->strides[1];
    params.raw_s2 = raw->strides[2];
    params.out_offset = out->offset;
    params.out_s0 = out->strides[0];
    params.out_s1 = out->strides[1];
    params.out_s2 = out->strides[2];
    params.out_s3 = out->strides[3];
    params.rows = plan->rows;
    params.elements = (cl_ulong)plan->rows * score->seq_k;
    params.mode = score->scores_mode;
    params.softmax_pad_ = 0;
    const clattn_arg args[] = {CLATTN_ARG(raw->mem),       CLATTN_ARG(out->mem),
                               CLATTN_ARG(buffers.mask),   CLATTN_ARG(buffers.key_padding),
                               CLATTN_ARG(buffers.kv_len), CLATTN_ARG(buffers.alibi),
                               CLATTN_ARG(buffers.sinks),  CLATTN_ARG(buffers.flex),
                               CLATTN_ARG(params)};
    return clattn__launch_kernel(chain, kernel, name, args, sizeof args / sizeof args[0], 1, global,
                                 local);
}

clattn_status clattn__score_copy_enqueue(clattn_chain *chain, const clattn__softmax_plan *plan,
                                         const clattn__view *raw, const clattn__view *dst,
                                         const clattn__score_masks *masks)
{
    return launch_rows(chain, plan, plan->copy, "score_copy", &plan->copy_global, &plan->copy_local,
                       raw, dst, masks);
}

clattn_status clattn__softmax_enqueue(clattn_chain *chain, const clattn__softmax_plan *plan,
                                      const clattn__view *raw, const clattn__view *out,
                                      const clattn__score_masks *masks)
{
    return launch_rows(chain, plan, plan->kernel, "softmax_rows", &plan->global, &plan->local, raw,
                       out, masks);
}

/* ---- softmax rows -------------------------------------------------------------------------- */

static clattn_status softmax_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const clattn__softmax_plan *prepared = unit;
    if (prepared->score.flex_id || prepared->score.dropout) {
        r->checked = false;
        snprintf(r->why, sizeof r->why, "%s",
                 prepared->score.flex_id ? "user score functions (flex)" : "dropout");
        return CLATTN_SUCCESS;
    }
    clattn__softmax_plan run = *prepared;
    clattn__score_shape *s = &run.score;
    s->batch = clattn__probe_at_most(s->batch, 2);
    s->heads = clattn__probe_at_most(s->heads, 2);
    s->seq_q = clattn__probe_at_most(s->seq_q, 19);
    s->seq_k = clattn__probe_at_most(s->seq_k, 77);
    s->kv_group = 1;
    run.rows = s->batch * s->heads * s->seq_q;
    /* a work-group per row, or a work-item per row in groups of `local` (a build option) */
    run.global = prepared->global == prepared->rows * prepared->local
                     ? run.rows * run.local
                     : (run.rows + run.local - 1) / run.local * run.local;
    const size_t count = run.rows * s->seq_k;
    clattn__probe_rng rng = {0xab5eedULL + count};
    clattn__probe_mem pm = {.count = 0};
    clattn__probe_inputs in;
    clattn__score_masks masks;
    double *raw = clattn__probe_alloc(&pm, count * sizeof(double)),
           *want = clattn__probe_alloc(&pm, count * sizeof(double));
    float *host = clattn__probe_alloc(&pm, count * sizeof(float) + 4);
    clattn_status status = CLATTN_SUCCESS;
    memset(&in, 0, sizeof in);
    if (!raw || !want || !host) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    for (size_t i = 0; i < count; ++i)
        host[i] = (float)(raw[i] = 4.0 * clattn__probe_grid(&rng, CLATTN_DTYPE_F32));
    cl_mem in_mem = NULL, out_mem = NULL;
    if ((status = clattn__probe_draw_modifiers(ctx, &rng, s, &pm, &in, &masks)) ||
        (status = clattn__probe_upload(ctx, &pm, host, count * sizeof(float), &in_mem)) ||
        (status = clattn__probe_upload(ctx, &pm, NULL, count * sizeof(float), &out_mem)))
        goto done;
    const clattn__view raw_view =
        clattn__probe_view(in_mem, CLATTN_DTYPE_F32, s->batch, s->heads, s->seq_q, s->seq_k);
    const clattn__view out_view =
        clattn__probe_view(out_mem, CLATTN_DTYPE_F32, s->batch, s->heads, s->seq_q, s->seq_k);
    clattn_chain chain = clattn__probe_chain(ctx);
    status = clattn__softmax_enqueue(&chain, &run, &raw_view, &out_view, &masks);
    if (status == CLATTN_SUCCESS)
        status = clattn__probe_download(&chain, out_mem, count * sizeof(float), host);
    clattn__chain_push(&chain, NULL);
    for (size_t row = 0; row < run.rows; ++row) {
        double lse;
        const size_t b = row / (s->heads * s->seq_q), h = row / s->seq_q % s->heads;
        clattn__probe_reference_row(&in.scores, b, h, row % s->seq_q, raw + row * s->seq_k,
                                    want + row * s->seq_k, &lse, NULL);
    }
    if (status == CLATTN_SUCCESS) {
        size_t where = 0;
        r->tolerance = 2e-5;
        r->max_error = clattn__probe_max_error(CLATTN_DTYPE_F32, (const unsigned char *)host, want,
                                               count, &where);
        snprintf(r->why, sizeof r->why, "weight %zu of (%zu, %zu, %zu, %zu)", where, s->batch,
                 s->heads, s->seq_q, s->seq_k);
    }
done:
    clattn__probe_release(&pm);
    clattn__probe_free_inputs(&in);
    return status;
}

clattn_status clattn__softmax_trust(clattn_ctx *ctx, clattn__softmax_plan *plan)
{
    return clattn__trust_one(ctx, "softmax rows", &plan->kernel, softmax_probe, plan);
}
