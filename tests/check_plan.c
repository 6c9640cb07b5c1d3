/*
 * check_plan: SDPA and MHA plans on what the typed strided tensors allow, against the float64
 * reference of the (rounded) inputs: strided views of q, k, v and out (a (B, L, H*d) buffer
 * read as heads, padded strides, offsets), F16 and BF16 storage on both paths, every mask
 * broadcast shape (float and bool) on both paths, both causal alignments with seq_q != seq_k,
 * plan reuse over many executions, a second queue (in order, and out of order where the device
 * has one), a caller's workspace, the lse output, descriptors with a wrong struct_size, the
 * bindings checked at execution, the tuning table's CLATTN_TUNING file, and MHA plans on
 * strided and F16 activations; feature interactions (issue 24): sliding windows with causal
 * masking, the grouped one-row decode with windows and per-head masks, stride-0 broadcast
 * views, and the KV cache object's life cycle, at every scale. Problems come from
 * tests/problems.c; outputs are NaN-poisoned and every element of every buffer outside a
 * tensor must stay poison.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problems.h"
#include "reference.h"
#include "testutil.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

static void run_sdpa(const pb_sdpa_spec *spec, const pb_run_options *options)
{
    pb_sdpa_problem p;
    pb_sdpa_make(&p, spec);
    tu_set_case("%s", p.label);
    clattn_status status = pb_sdpa_run(tu_ctx(), &p, options);
    tu_expect_status(status, CLATTN_SUCCESS, "pb_sdpa_run");
    pb_sdpa_free(&p);
}

static pb_sdpa_spec base_spec(size_t batch, size_t heads, size_t seq_q, size_t seq_k, size_t dk,
                              size_t dv)
{
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = batch;
    spec.heads = heads;
    spec.seq_q = seq_q;
    spec.seq_k = seq_k;
    spec.dk = dk;
    spec.dv = dv;
    return spec;
}

/* --- issue 28: attention sinks and a paged KV cache ----------------------------------------- */

/* A paged cache (block_table) runs on every page size with grouped heads, causal bottom-right,
 * sinks and a window; a block index outside the pool ends its sequence's keys there (the
 * kernel reads no page outside the pool); then the refusals, each naming its argument. */
START_TEST(test_paged_and_sinks)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    static const size_t page_sizes[] = {1, 3, 16, 64, 256};
    for (size_t i = 0; i < sizeof page_sizes / sizeof page_sizes[0]; ++i) {
        pb_sdpa_spec spec = base_spec(2, 4, i % 2 ? 1 : 5, 0, 16, 8);
        spec.page_size = page_sizes[i];
        spec.seq_k = page_sizes[i] * (i == 4 ? 1 : 3 + i);
        spec.kv_heads = 2;
        spec.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        spec.sinks = i % 2 == 0;
        if (i == 2) {
            spec.window_align = CLATTN_CAUSAL_BOTTOM_RIGHT;
            spec.window_left = 5;
            spec.window_right = -1;
        }
        run_sdpa(&spec, NULL);
    }

    /* Batch 0's first block outside the pool: its keys end at key 0 (zeros, lse -inf), however
     * many its count says; batch 1 unchanged. */
    pb_sdpa_spec spec = base_spec(2, 2, 3, 12, 8, 8);
    spec.page_size = 4;
    spec.want_lse = 1;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    p.kv_len[0] = 9;
    p.kv_len[1] = 12;
    for (size_t blk = 0; blk < p.blocks; ++blk) /* the pages for every key */
        p.block_table[blk] = (int32_t)blk, p.block_table[p.blocks + blk] = (int32_t)(p.blocks + blk);
    tu_set_case("a block index outside the pool: %s", p.label);
    clattn_tensors bound;
    clattn_plan *plan = NULL;
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    if (tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS, "create") &&
        tu_expect(pb_sdpa_upload(ctx, &p, &bound) == CL_SUCCESS, "upload")) {
        float table[6];
        for (size_t e = 0; e < 2 * p.blocks; ++e)
            table[e] = (float)p.block_table[e];
        table[0] = (float)(p.num_pages + 7); /* batch 0, block 0 */
        tu_expect(pb_rewrite(ctx, NULL, &bound.block_table, table) == CL_SUCCESS, "rewrite");
        p.kv_len[0] = 0; /* what the reference then sees */
        pb_sdpa_reference(&p);
        if (tu_expect_status(clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                                 0, NULL, NULL),
                             CLATTN_SUCCESS, "execute"))
            pb_sdpa_check(ctx, NULL, &p, &bound);
        pb_release_tensors(&bound);
    }
    clattn_plan_release(plan);

    /* Refusals on the same problem's layouts. */
    static const struct {
        int what;
        clattn_status status;
        const char *message;
    } refusals[] = {
        {0, CLATTN_ERR_INVALID_SHAPE, "block_table must be (batch, blocks)"},
        {1, CLATTN_ERR_INVALID_ARGUMENT, "block_table needs kv_seqlen"},
        {2, CLATTN_ERR_INVALID_SHAPE, "v has"},
        {3, CLATTN_ERR_UNSUPPORTED, "fused path only"},
        {4, CLATTN_ERR_UNSUPPORTED, "fused path only"},
        {5, CLATTN_ERR_UNSUPPORTED, "sinks with norm=CLATTN_NORM_RELU"},
        {6, CLATTN_ERR_INVALID_SHAPE, "sinks"},
        {7, CLATTN_ERR_INVALID_ARGUMENT, "block_table"},
    };
    for (int r = 0; r < COUNT_OF(refusals); ++r) {
        clattn_sdpa_desc bad;
        pb_sdpa_desc(&p, &bad);
        clattn_tensors t = p.layouts;
        CLATTN_BIND_ROLES(bad, t);
        switch (refusals[r].what) {
        case 0:
            t.block_table = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 1, 2 * p.blocks, 0, 0, 0);
            break;
        case 1:
            memset(&t.kv_seqlen, 0, sizeof t.kv_seqlen);
            break;
        case 2:
            t.v.dims[0] += 1;
            break;
        case 3:
            bad.path = CLATTN_PATH_UNFUSED;
            memset(&t.lse, 0, sizeof t.lse);
            break;
        case 4:
            t.weights = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, 2, 2, 3, 12);
            memset(&t.lse, 0, sizeof t.lse);
            break;
        case 5:
            t.sinks = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, 2, 0, 0, 0);
            bad.norm = CLATTN_NORM_RELU;
            break;
        case 6:
            t.sinks = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, 3, 0, 0, 0);
            break;
        default:
            t.block_table.dtype = CLATTN_DTYPE_F32;
            break;
        }
        plan = NULL;
        const clattn_status status = clattn_sdpa_plan_create(ctx, &bad, &plan);
        tu_expect(status == refusals[r].status && plan == NULL &&
                      strstr(clattn_last_error(ctx), refusals[r].message),
                  "refusal %d: status %d, '%s' (want %d, '%s')", r, (int)status,
                  clattn_last_error(ctx), (int)refusals[r].status, refusals[r].message);
        clattn_plan_release(plan);
    }
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* --- issue 28: packed variable-length batches (cu_seqlens) ---------------------------------- */

/* Packed sequences of drawn lengths (empty ones and the maxima now and then) on every causal
 * form, windows, GQA, the one-row decode, ALiBi per (batch, head), sinks, softcap, relu, 16-bit
 * and quantized storage and strided layouts: each sequence equals itself run alone (the float64
 * reference per sequence), nothing written outside out and lse. */
static const struct varlen_case {
    size_t batch, heads, kv_heads, max_q, max_k, dk, dv;
    clattn_causal causal, window;
    long long left, right, diag;
    int alibi, sinks, relu, lse;
    float softcap;
    clattn_dtype q_dtype, kv_dtype;
    pb_layout layout;
} varlen_cases[] = {
    {3, 4, 2, 17, 33, 16, 8, CLATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0},
    {4, 2, 1, 1, 65, 8, 8, CLATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 2, 0, 0, 1, 0,
     CLATTN_DTYPE_F16, 0, PB_SEQ_MAJOR},
    {2, 3, 3, 63, 63, 17, 3, CLATTN_CAUSAL_TOP_LEFT, CLATTN_CAUSAL_TOP_LEFT, 5, -1, 0, 0, 1, 0,
     0, 2.5f, 0, 0, PB_PADDED},
    {5, 1, 1, 129, 127, 64, 64, CLATTN_CAUSAL_NONE, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0,
     CLATTN_DTYPE_BF16, PB_STRIDED_LAST},
    {1, 2, 2, 3, 17, 3, 1, CLATTN_CAUSAL_ONNX, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0},
    {3, 2, 1, 13, 29, 8, 16, CLATTN_CAUSAL_OFFSET, CLATTN_CAUSAL_OFFSET, 3, 1, -2, 2, 0, 0, 1,
     0, 0, 0, PB_SEQ_MAJOR_PADDED},
    {3, 4, 2, 7, 67, 32, 64, CLATTN_CAUSAL_BOTTOM_RIGHT, CLATTN_CAUSAL_BOTTOM_RIGHT, 11, -1, 0,
     1, 1, 0, 1, 0, 0, CLATTN_DTYPE_Q8_0, 0},
    {2, 2, 2, 5, 40, 32, 32, CLATTN_CAUSAL_NONE, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, CLATTN_DTYPE_Q4_0,
     0},
};

START_TEST(test_varlen)
{
    TU_BEGIN_TEST();
    const struct varlen_case *c = &varlen_cases[_i % COUNT_OF(varlen_cases)];
    /* each case three times: fresh lengths each draw */
    pb_sdpa_spec spec = base_spec(c->batch, c->heads, c->max_q, c->max_k, c->dk, c->dv);
    spec.varlen = 1;
    spec.kv_heads = c->kv_heads;
    spec.causal = c->causal;
    spec.window_align = c->window;
    spec.window_left = c->left;
    spec.window_right = c->right;
    spec.diag_offset = c->diag;
    spec.alibi = c->alibi;
    spec.sinks = c->sinks;
    spec.norm = c->relu ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX;
    spec.want_lse = c->lse;
    spec.softcap = c->softcap;
    spec.q_dtype = spec.out_dtype = c->q_dtype;
    spec.k_dtype = spec.v_dtype = c->kv_dtype;
    spec.q_layout = spec.out_layout = c->layout;
    spec.k_layout = spec.v_layout = c->kv_dtype == CLATTN_DTYPE_Q8_0 ? PB_PACKED : c->layout;
    spec.path = _i % 2 ? CLATTN_PATH_FUSED : CLATTN_PATH_AUTO;
    run_sdpa(&spec, NULL);
    TU_END_TEST();
}
END_TEST

/* Offsets that decrease or pass the totals are clamped on the device: the plan runs, reads and
 * writes nothing outside its tensors (no stray write; the Oclgrind lane checks the reads), and
 * a sequence whose keys clamp to none gives zero rows. Then the refusals, each naming its
 * argument. */
START_TEST(test_varlen_offsets_and_refusals)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    pb_sdpa_spec spec = base_spec(3, 2, 4, 6, 8, 8);
    spec.varlen = 1;
    spec.want_lse = 1;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("clamped offsets: %s", p.label);
    clattn_tensors bound;
    clattn_plan *plan = NULL;
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    if (tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS, "create") &&
        tu_expect(pb_sdpa_upload(ctx, &p, &bound) == CL_SUCCESS, "upload")) {
        /* q: sequence 1 runs from row min(1, total) to the total (cut to max_seqlen_q), 2 is
         * empty; k: sequence 0 from -5 (0) to past the total, 1 from the total to 3 (empty) */
        const float tq = (float)p.total_q, tk = (float)p.total_k;
        const float cu_q[4] = {0.0f, 1.0f, tq + 100.0f, tq - 1.0f};
        const float cu_k[4] = {-5.0f, tk + 50.0f, 3.0f, tk};
        tu_expect(pb_rewrite(ctx, NULL, &bound.cu_seqlens_q, cu_q) == CL_SUCCESS &&
                      pb_rewrite(ctx, NULL, &bound.cu_seqlens_k, cu_k) == CL_SUCCESS,
                  "rewrite");
        if (tu_expect_status(clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                                 0, NULL, NULL),
                             CLATTN_SUCCESS, "execute")) {
            const size_t rows = p.total_q * spec.heads;
            float *out = pb_nan_floats(p.out_count), *lse = pb_nan_floats(rows);
            size_t stray = 0, lse_stray = 0;
            tu_expect(pb_download(ctx, NULL, &bound.out, out, &stray) == CL_SUCCESS &&
                          pb_download(ctx, NULL, &bound.lse, lse, &lse_stray) == CL_SUCCESS,
                      "download");
            tu_expect(stray == 0 && lse_stray == 0, "%zu + %zu stray writes", stray, lse_stray);
            /* sequence 1 (rows 1 .. min(total, 1 + max_q) - 1) has no key: zeros, lse -inf */
            const size_t end = p.total_q < 1 + desc.max_seqlen_q ? p.total_q : 1 + desc.max_seqlen_q;
            for (size_t t = 1; t < end; ++t)
                for (size_t h = 0; h < spec.heads; ++h) {
                    tu_expect(lse[h * p.total_q + t] == -INFINITY, "lse[%zu, %zu] = %g", h, t,
                              (double)lse[h * p.total_q + t]);
                    for (size_t d = 0; d < spec.dv; ++d)
                        tu_expect(out[(t * spec.heads + h) * spec.dv + d] == 0.0f,
                                  "out[%zu, %zu, %zu] = %g", t, h, d,
                                  (double)out[(t * spec.heads + h) * spec.dv + d]);
                }
            free(out);
            free(lse);
        }
        pb_release_tensors(&bound);
    }
    clattn_plan_release(plan);

    static const struct {
        int what;
        clattn_status status;
        const char *message;
    } refusals[] = {
        {0, CLATTN_ERR_INVALID_ARGUMENT, "cu_seqlens_q and cu_seqlens_k go together"},
        {1, CLATTN_ERR_INVALID_SHAPE, "cu_seqlens_k has dims"},
        {2, CLATTN_ERR_UNSUPPORTED, "with attn_mask: not supported"},
        {3, CLATTN_ERR_UNSUPPORTED, "with kv_seqlen: not supported"},
        {4, CLATTN_ERR_UNSUPPORTED, "with weights: not supported"},
        {5, CLATTN_ERR_UNSUPPORTED, "with path UNFUSED: not supported"},
        {6, CLATTN_ERR_INVALID_SHAPE, "q must be a packed rank-3 tensor (total_q, heads"},
        {7, CLATTN_ERR_INVALID_SHAPE, "lse has dims"},
        {8, CLATTN_ERR_INVALID_ARGUMENT, "max_seqlen_q="},
        {9, CLATTN_ERR_INVALID_SHAPE, "out has dims"},
        {10, CLATTN_ERR_UNSUPPORTED, "with rope: not supported"},
        {11, CLATTN_ERR_INVALID_ARGUMENT, "cu_seqlens_q"},
        {12, CLATTN_ERR_UNSUPPORTED, "with block_table: not supported"},
    };
    for (int r = 0; r < COUNT_OF(refusals); ++r) {
        clattn_sdpa_desc bad;
        pb_sdpa_desc(&p, &bad);
        clattn_tensors t = p.layouts;
        CLATTN_BIND_ROLES(bad, t);
        switch (refusals[r].what) {
        case 0:
            memset(&t.cu_seqlens_k, 0, sizeof t.cu_seqlens_k);
            break;
        case 1:
            t.cu_seqlens_k.dims[0] += 1;
            break;
        case 2:
            t.attn_mask = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, p.total_q, p.total_k, 0, 0);
            break;
        case 3:
            t.kv_seqlen = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 1, 3, 0, 0, 0);
            break;
        case 4:
            t.weights = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, 3, 2, 4, 6);
            break;
        case 5:
            bad.path = CLATTN_PATH_UNFUSED;
            break;
        case 6:
            t.q = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, 1, p.total_q, 2, 8);
            break;
        case 7:
            t.lse = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, p.total_q, 2, 0, 0);
            break;
        case 8:
            bad.max_seqlen_q = p.total_q + 1;
            break;
        case 9:
            t.out.dims[2] += 1;
            break;
        case 10:
            bad.rope = 1;
            break;
        case 11:
            t.cu_seqlens_q.dtype = CLATTN_DTYPE_F32;
            break;
        default:
            t.block_table = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 2, 3, 1, 0, 0);
            break;
        }
        plan = NULL;
        const clattn_status status = clattn_sdpa_plan_create(ctx, &bad, &plan);
        tu_expect(status == refusals[r].status && plan == NULL &&
                      strstr(clattn_last_error(ctx), refusals[r].message),
                  "refusal %d: status %d, '%s' (want %d, '%s')", r, (int)status,
                  clattn_last_error(ctx), (int)refusals[r].status, refusals[r].message);
        clattn_plan_release(plan);
    }
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* --- host conversions ------------------------------------------------------------------------ */

/* float -> F16 / BF16 round to nearest even, and back: the conversions every typed upload and
 * download in these suites relies on. */
START_TEST(test_dtype_conversions)
{
    TU_BEGIN_TEST();
    tu_set_case("F16 and BF16 conversions");
    static const struct {
        float value;
        uint16_t f16, bf16;
    } known[] = {
        {0.0f, 0x0000, 0x0000},
        {-0.0f, 0x8000, 0x8000},
        {1.0f, 0x3c00, 0x3f80},
        {-2.0f, 0xc000, 0xc000},
        {65504.0f, 0x7bff, 0x4780},
        {65520.0f, 0x7c00, 0x4780}, /* halfway to 65536: ties to even, infinity */
        {65519.0f, 0x7bff, 0x4780},
        {0x1.0p-24f, 0x0001, 0x3380},            /* smallest F16 subnormal */
        {0x1.8p-25f, 0x0001, 0x3340},            /* 0.75 units: rounds up */
        {0x1.0p-25f, 0x0000, 0x3300},            /* half a unit: ties to even (0) */
        {0x1.8p-24f, 0x0002, 0x33c0},            /* 1.5 units: ties to even (2) */
        {0x1.ff8p-15f, 0x03ff, 0x3880},          /* largest subnormal: 1023 units */
        {0x1.ffcp-15f, 0x0400, 0x3880},          /* 1023.5 units: ties to even (1024) */
        {0x1.0p-14f, 0x0400, 0x3880},            /* smallest normal */
        {1.0f + 0x1.0p-11f, 0x3c00, 0x3f80},     /* half an F16 ulp above 1: to even (down) */
        {1.0f + 0x1.8p-10f, 0x3c02, 0x3f80},     /* 1.5 ulp: to even (up) */
        {1.0f + 0x1.0p-8f, 0x3c04, 0x3f80},      /* half a BF16 ulp: to even (down) */
        {1.0f + 0x1.8p-7f, 0x3c0c, 0x3f82},      /* 1.5 BF16 ulp: to even (up) */
        {INFINITY, 0x7c00, 0x7f80},
        {-INFINITY, 0xfc00, 0xff80},
        {3.0e38f, 0x7c00, 0x7f62},
    };
    for (int i = 0; i < COUNT_OF(known); ++i) {
        const uint16_t f16 = pb_f16_from_float(known[i].value);
        const uint16_t bf16 = pb_bf16_from_float(known[i].value);
        tu_expect(f16 == known[i].f16, "F16(%a) = 0x%04x, want 0x%04x", (double)known[i].value,
                  f16, known[i].f16);
        tu_expect(bf16 == known[i].bf16, "BF16(%a) = 0x%04x, want 0x%04x",
                  (double)known[i].value, bf16, known[i].bf16);
    }
    tu_expect(isnan(pb_f16_to_float(pb_f16_from_float(NAN))) &&
                  isnan(pb_bf16_to_float(pb_bf16_from_float(NAN))),
              "NaN did not survive a round trip");
    /* Every F16 and BF16 value converts to float and back unchanged (NaN payloads aside). */
    for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
        const float f16 = pb_f16_to_float((uint16_t)bits);
        const float bf16 = pb_bf16_to_float((uint16_t)bits);
        if (!isnan(f16) && !tu_expect(pb_f16_from_float(f16) == bits,
                                      "F16 0x%04x -> %a -> 0x%04x", (unsigned)bits, (double)f16,
                                      pb_f16_from_float(f16)))
            break;
        if (!isnan(bf16) && !tu_expect(pb_bf16_from_float(bf16) == bits,
                                       "BF16 0x%04x -> %a -> 0x%04x", (unsigned)bits,
                                       (double)bf16, pb_bf16_from_float(bf16)))
            break;
    }
    /* Random values: the result is one of the two neighbours and the nearer one. */
    for (int i = 0; i < 100000; ++i) {
        const float value = (float)((tu_rand_unit() - 0.5) * pow(2.0, (double)tu_rand_below(35) -
                                                                          20.0));
        const float rounded = pb_round(CLATTN_DTYPE_F16, value);
        const double ulp = fabs(value) < 0x1.0p-14 ? 0x1.0p-24
                                                   : pow(2.0, floor(log2(fabs(value)))) * 0x1.0p-10;
        if (!tu_expect(fabs((double)rounded - value) <= ulp / 2, "F16 rounding of %a gave %a",
                       (double)value, (double)rounded))
            break;
    }
    TU_END_TEST();
}
END_TEST

#define F32 CLATTN_DTYPE_F32
#define F16 CLATTN_DTYPE_F16
#define BF16 CLATTN_DTYPE_BF16

/* --- strided views ---------------------------------------------------------------------------- */

static const pb_layout view_layouts[] = {PB_PACKED_STRIDES, PB_SEQ_MAJOR, PB_SEQ_MAJOR_PADDED,
                                         PB_PADDED, PB_STRIDED_LAST};
static const char *const role_names[] = {"q", "k", "v", "out"};

static void set_layout(pb_sdpa_spec *spec, int role, pb_layout layout)
{
    pb_layout *layouts[4] = {&spec->q_layout, &spec->k_layout, &spec->v_layout,
                             &spec->out_layout};
    *layouts[role] = layout;
}

/* One of q, k, v, out as a strided view (i / 5: the role, i % 5: the layout), then all four
 * at once as views of (B, L, H*d) buffers and as padded views; each on both paths. A view
 * with stride 2 along head_dim runs fused; the unfused path refuses it, naming the stride. */
START_TEST(test_views)
{
    TU_BEGIN_TEST();
    const int all = _i >= 20;
    const int role = _i / 5;
    const pb_layout layout = all ? (_i == 20 ? PB_SEQ_MAJOR : PB_PADDED) : view_layouts[_i % 5];
    const clattn_path paths[2] = {CLATTN_PATH_FUSED, CLATTN_PATH_UNFUSED};
    for (int path = 0; path < 2; ++path) {
        pb_sdpa_spec spec = base_spec(2, 3, 17, 33, 12, 7);
        spec.causal = CLATTN_CAUSAL_TOP_LEFT;
        spec.padding = 1;
        spec.path = paths[path];
        spec.want_weights = path == 1;
        spec.want_lse = path == 0;
        for (int r = 0; r < 4; ++r)
            if (all || r == role)
                set_layout(&spec, r, layout);
        if (layout == PB_STRIDED_LAST && path == 1) {
            pb_sdpa_problem p;
            pb_sdpa_make(&p, &spec);
            tu_set_case("%s (%s with stride 2 along head_dim, UNFUSED: refused)", p.label,
                        role_names[role]);
            clattn_sdpa_desc desc;
            pb_sdpa_desc(&p, &desc);
            clattn_plan *plan = NULL;
            clattn_status status = clattn_sdpa_plan_create(tu_ctx(), &desc, &plan);
            tu_expect_status(status, CLATTN_ERR_UNSUPPORTED, "UNFUSED with a head_dim stride 2");
            tu_expect(strstr(clattn_last_error(tu_ctx()), role_names[role]) != NULL &&
                          strstr(clattn_last_error(tu_ctx()), "stride") != NULL,
                      "message '%s' does not name %s and its stride",
                      clattn_last_error(tu_ctx()), role_names[role]);
            clattn_plan_release(plan);
            pb_sdpa_free(&p);
            continue;
        }
        run_sdpa(&spec, NULL);
    }
    TU_END_TEST();
}
END_TEST

/* q, k and v as views of one (B, L, 3·H·d) buffer, as a packed projection writes them (the
 * former split of a packed qkv projection): offsets 0, H·d and 2·H·d, row stride 3·H·d; out a
 * (B, L, H·d) view (the former concat of heads). Both paths. */
START_TEST(test_packed_qkv_views)
{
    TU_BEGIN_TEST();
    static const size_t shapes[][4] = {{2, 17, 4, 3}, {1, 65, 2, 16}, {3, 5, 16, 1}};
    const size_t batch = shapes[_i][0], seq = shapes[_i][1], heads = shapes[_i][2];
    const size_t head_dim = shapes[_i][3], embed = heads * head_dim;
    clattn_ctx *ctx = tu_ctx();
    for (int path = 0; path < 2; ++path) {
        pb_sdpa_spec spec = base_spec(batch, heads, seq, seq, head_dim, head_dim);
        spec.path = path ? CLATTN_PATH_UNFUSED : CLATTN_PATH_FUSED;
        spec.causal = CLATTN_CAUSAL_TOP_LEFT;
        spec.out_layout = PB_SEQ_MAJOR;
        pb_sdpa_problem p;
        pb_sdpa_make(&p, &spec);
        clattn_tensor *qkv[3] = {&p.layouts.q, &p.layouts.k, &p.layouts.v};
        const float *values[3] = {p.q, p.k, p.v};
        const size_t total = batch * seq * 3 * embed;
        float *staging = tu_nan_floats(total);
        for (int part = 0; part < 3; ++part) {
            const size_t strides[4] = {seq * 3 * embed, head_dim, 3 * embed, 1};
            memcpy(qkv[part]->strides, strides, sizeof strides);
            for (size_t i = 0; i < p.q_count; ++i) {
                const size_t x = i % head_dim, pos = (i / head_dim) % seq;
                const size_t h = (i / head_dim / seq) % heads, b = i / head_dim / seq / heads;
                staging[part * embed + b * strides[0] + h * strides[1] + pos * strides[2] + x] =
                    values[part][i];
            }
        }
        tu_set_case("%s, q/k/v in one (B, L, 3E) buffer", p.label);
        clattn_sdpa_desc desc;
        pb_sdpa_desc(&p, &desc);
        clattn_plan *plan = NULL;
        clattn_tensors bound;
        memset(&bound, 0, sizeof bound);
        clattn_status status = clattn_sdpa_plan_create(ctx, &desc, &plan);
        bound.out = p.layouts.out;
        if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_sdpa_plan_create") &&
            pb_upload(ctx, &bound.out, 2, NULL) == CL_SUCCESS) {
            cl_mem packed = tu_upload_floats(staging, total);
            for (int part = 0; part < 3; ++part) {
                clattn_tensor *t = part == 0 ? &bound.q : part == 1 ? &bound.k : &bound.v;
                *t = *qkv[part];
                t->mem = packed;
                t->offset = (size_t)part * embed;
            }
            status = clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                         NULL, NULL);
            if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_plan_execute"))
                pb_sdpa_check(ctx, NULL, &p, &bound);
            /* the inputs' buffer is read only: unchanged */
            float *after = tu_floats(total);
            tu_read_floats(packed, 0, total, after);
            size_t changed = 0;
            for (size_t i = 0; i < total; ++i)
                changed += !(after[i] == staging[i] || (isnan(after[i]) && isnan(staging[i])));
            tu_expect(changed == 0, "%zu elements of the packed q/k/v buffer changed", changed);
            free(after);
        }
        pb_release_tensors(&bound);
        clattn_plan_release(plan);
        free(staging);
        pb_sdpa_free(&p);
    }
    TU_END_TEST();
}
END_TEST

/* k and v shared by every head (stride 0 along heads, as multi-query attention stores them)
 * and by every batch entry: a stride of 0 repeats an input. */
START_TEST(test_broadcast_inputs)
{
    TU_BEGIN_TEST();
    const clattn_path paths[2] = {CLATTN_PATH_FUSED, CLATTN_PATH_UNFUSED};
    for (int path = 0; path < 2; ++path) {
        pb_sdpa_spec spec = base_spec(3, 4, 9, 21, 8, 5);
        spec.path = paths[path];
        spec.mask = PB_MASK_FLOAT;
        pb_sdpa_problem p;
        pb_sdpa_make(&p, &spec);
        const size_t k_head = spec.seq_k * spec.dk, v_head = spec.seq_k * spec.dv;
        const size_t heads_total = spec.batch * spec.heads;
        for (size_t bh = 1; bh < heads_total; ++bh) {
            /* _i 0: shared over heads (per batch entry); 1: one k and v for everything */
            const size_t source = _i == 0 ? (bh / spec.heads) * spec.heads : 0;
            memcpy(p.k + bh * k_head, p.k + source * k_head, k_head * sizeof(float));
            memcpy(p.v + bh * v_head, p.v + source * v_head, v_head * sizeof(float));
        }
        clattn_tensor *kv[2] = {&p.layouts.k, &p.layouts.v};
        for (int t = 0; t < 2; ++t) {
            const size_t d = kv[t]->dims[3];
            kv[t]->strides[3] = 1;
            kv[t]->strides[2] = d;
            kv[t]->strides[1] = 0;
            kv[t]->strides[0] = _i == 0 ? spec.seq_k * d + 3 : 0;
        }
        pb_sdpa_reference(&p);
        tu_set_case("%s, k and v with stride 0 along heads%s", p.label,
                    _i == 0 ? "" : " and batch");
        tu_expect_status(pb_sdpa_run(tu_ctx(), &p, NULL), CLATTN_SUCCESS, "pb_sdpa_run");
        pb_sdpa_free(&p);
    }
    TU_END_TEST();
}
END_TEST

/* --- storage dtypes ------------------------------------------------------------------------- */

/* F16 and BF16 storage of q, k, v and out (each combination on both paths) against the
 * reference of the rounded inputs; outputs within the tolerance of their storage. */
START_TEST(test_dtypes)
{
    TU_BEGIN_TEST();
    static const clattn_dtype combos[][4] = {
        {F16, F16, F16, F16},  {BF16, BF16, BF16, BF16}, {F16, BF16, F32, F16},
        {F32, F32, F32, BF16}, {BF16, F16, F16, F32},    {F32, F16, BF16, F16},
    };
    static const size_t shapes[][6] = {{2, 3, 17, 33, 16, 16}, {1, 2, 65, 63, 64, 32},
                                       {3, 1, 1, 129, 8, 17},  {2, 2, 33, 7, 128, 64},
                                       {1, 4, 63, 65, 7, 9},   {2, 1, 129, 127, 32, 32}};
    const clattn_path paths[2] = {CLATTN_PATH_FUSED, CLATTN_PATH_UNFUSED};
    for (int path = 0; path < 2; ++path) {
        const size_t *s = shapes[_i];
        pb_sdpa_spec spec = base_spec(s[0], s[1], s[2], s[3], s[4], s[5]);
        spec.q_dtype = combos[_i][0];
        spec.k_dtype = combos[_i][1];
        spec.v_dtype = combos[_i][2];
        spec.out_dtype = combos[_i][3];
        spec.path = paths[path];
        spec.causal = _i % 2 ? CLATTN_CAUSAL_BOTTOM_RIGHT : CLATTN_CAUSAL_NONE;
        spec.mask = _i % 3 == 0 ? PB_MASK_FLOAT : _i % 3 == 1 ? PB_MASK_BOOL : PB_MASK_NONE;
        spec.mask_dtype = combos[_i][0];
        spec.padding = _i % 2 == 0;
        spec.want_weights = path == 1 && _i % 2 == 0;
        spec.want_lse = path == 0;
        spec.q_layout = _i % 2 ? PB_SEQ_MAJOR : PB_PACKED;
        spec.out_layout = _i % 3 == 2 ? PB_PADDED : PB_PACKED;
        run_sdpa(&spec, NULL);
    }
    TU_END_TEST();
}
END_TEST

/* --- masks ------------------------------------------------------------------------------------ */

/* The mask shapes: rank 4 with any dims 1 (16), rank 3 (H, Lq, Lk) (8), rank 2 (Lq, Lk) (4),
 * rank 1 (Lk) (2). */
static void mask_shape_of(int index, int *rank, unsigned *ones)
{
    if (index < 16) {
        *rank = 4, *ones = (unsigned)index;
    } else if (index < 24) {
        *rank = 3, *ones = (unsigned)(index - 16) << 1;
    } else if (index < 28) {
        *rank = 2, *ones = (unsigned)(index - 24) << 2;
    } else {
        *rank = 1, *ones = (unsigned)(index - 28) << 3;
    }
}
#define MASK_SHAPES 30

/* Every broadcast shape of the attn_mask, float (F32, F16 or BF16) and bool, on both paths;
 * rank-4 masks also with stride-0 dims instead of dims of 1. */
START_TEST(test_mask_shapes)
{
    TU_BEGIN_TEST();
    int rank = 0;
    unsigned ones = 0;
    mask_shape_of(_i, &rank, &ones);
    static const clattn_dtype float_dtypes[3] = {CLATTN_DTYPE_F32, CLATTN_DTYPE_F16,
                                                 CLATTN_DTYPE_BF16};
    for (int kind = 0; kind < 2; ++kind) {
        for (int path = 0; path < 2; ++path) {
            pb_sdpa_spec spec = base_spec(2, 3, 5, 17, 8, 6);
            spec.mask = kind ? PB_MASK_BOOL : PB_MASK_FLOAT;
            spec.mask_dtype = kind ? CLATTN_DTYPE_U8 : float_dtypes[_i % 3];
            spec.mask_rank = rank;
            spec.mask_ones = ones;
            spec.mask_zero_strides = rank == 4 && ones != 0 && (_i + kind) % 2 == 1;
            spec.mask_layout = (_i + path) % 3 == 0 ? PB_PADDED : PB_PACKED;
            spec.path = path ? CLATTN_PATH_UNFUSED : CLATTN_PATH_FUSED;
            spec.want_weights = path == 1;
            spec.want_lse = path == 0;
            spec.padding = _i % 4 == 1;
            spec.causal = _i % 5 == 2 ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
            spec.norm = _i % 7 == 3 ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX;
            run_sdpa(&spec, NULL);
        }
    }
    TU_END_TEST();
}
END_TEST

/* A mask whose dims do not broadcast to (B, H, Lq, Lk) is refused at plan creation. */
START_TEST(test_mask_shape_errors)
{
    TU_BEGIN_TEST();
    pb_sdpa_spec spec = base_spec(2, 3, 5, 17, 8, 6);
    spec.mask = PB_MASK_FLOAT;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    static const size_t bad[][4] = {{5, 16, 0, 0}, {3, 5, 17, 0}, {2, 2, 5, 17}, {4, 3, 5, 17}};
    static const int ranks[] = {2, 3, 4, 4};
    for (int i = 0; i < 4; ++i) {
        tu_set_case("attn_mask rank %d dims (%zu, %zu, %zu, %zu) on (2, 3, 5, 17)", ranks[i],
                    bad[i][0], bad[i][1], bad[i][2], bad[i][3]);
        clattn_sdpa_desc desc;
        pb_sdpa_desc(&p, &desc);
        clattn_tensors desc_tensors = p.layouts;
        CLATTN_BIND_ROLES(desc, desc_tensors);
        pb_make_layout(&desc_tensors.attn_mask, CLATTN_DTYPE_F32, ranks[i], bad[i], PB_PACKED);
        if (i == 1) /* (3, 5, 17) is (H, Lq, Lk): fine; make H wrong instead */
            desc_tensors.attn_mask.dims[0] = 2;
        clattn_plan *plan = NULL;
        clattn_status status = clattn_sdpa_plan_create(tu_ctx(), &desc, &plan);
        tu_expect(status == CLATTN_ERR_INVALID_SHAPE, "got %s: %s", clattn_status_string(status),
                  clattn_last_error(tu_ctx()));
        tu_expect(tu_mentions_word(clattn_last_error(tu_ctx()), "attn_mask"),
                  "message '%s' does not name attn_mask", clattn_last_error(tu_ctx()));
        clattn_plan_release(plan);
    }
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* --- causal alignments ---------------------------------------------------------------------- */

/* TOP_LEFT and BOTTOM_RIGHT with seq_q < seq_k, seq_q > seq_k (BOTTOM_RIGHT: the first rows
 * see no key at all) and seq_q == seq_k, on both paths, with lse (fused) and weights
 * (unfused). */
START_TEST(test_causal_alignments)
{
    TU_BEGIN_TEST();
    static const size_t seqs[3][2] = {{17, 65}, {65, 17}, {33, 33}};
    const clattn_causal causal = _i < 3 ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_BOTTOM_RIGHT;
    const size_t *seq = seqs[_i % 3];
    const clattn_path paths[2] = {CLATTN_PATH_FUSED, CLATTN_PATH_UNFUSED};
    for (int path = 0; path < 2; ++path) {
        for (int masks = 0; masks < 2; ++masks) {
            pb_sdpa_spec spec = base_spec(2, 2, seq[0], seq[1], 16, 24);
            spec.causal = causal;
            spec.path = paths[path];
            spec.want_lse = path == 0;
            spec.want_weights = path == 1;
            spec.mask = masks ? PB_MASK_BOOL : PB_MASK_NONE;
            spec.padding = masks;
            spec.norm = masks && _i % 2 ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX;
            run_sdpa(&spec, NULL);
        }
    }
    TU_END_TEST();
}
END_TEST

/* The log-sum-exp output of the fused path against the reference: softmax and relu, masks,
 * both causal alignments, fully masked rows (-inf), F16 inputs. */
START_TEST(test_lse)
{
    TU_BEGIN_TEST();
    static const size_t seq_q[] = {1, 17, 65, 129, 33, 7, 64, 100};
    static const size_t seq_k[] = {1, 63, 17, 129, 300, 65, 64, 1};
    pb_sdpa_spec spec = base_spec(1 + (size_t)_i % 3, 1 + (size_t)_i % 4, seq_q[_i], seq_k[_i],
                                  _i % 2 ? 64 : 17, _i % 3 ? 32 : 8);
    spec.path = _i % 2 ? CLATTN_PATH_FUSED : CLATTN_PATH_AUTO;
    spec.want_lse = 1;
    spec.norm = _i % 4 == 3 ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX;
    spec.causal = (clattn_causal)(_i % 3);
    spec.mask = (pb_mask_kind)(_i % 3);
    spec.padding = _i % 2 == 0;
    spec.fully_masked = _i % 4 == 2 ? 1 : _i == 5 ? 2 : 0;
    spec.q_dtype = spec.k_dtype = _i == 6 ? CLATTN_DTYPE_F16 : CLATTN_DTYPE_F32;
    spec.scale = _i == 7 ? 0.0f : NAN;
    spec.q_gain = 4.0f;
    run_sdpa(&spec, NULL);
    TU_END_TEST();
}
END_TEST

/* --- plan reuse, queues, workspace -------------------------------------------------------- */

/* One plan, many executions on fresh buffers at new offsets each time, both paths. */
START_TEST(test_plan_reuse)
{
    TU_BEGIN_TEST();
    pb_sdpa_spec spec = base_spec(2, 3, 17, 31, 16, 16);
    spec.path = _i ? CLATTN_PATH_UNFUSED : CLATTN_PATH_FUSED;
    spec.mask = PB_MASK_FLOAT;
    spec.mask_rank = 4;
    spec.mask_ones = PB_MASK_ONES_H;
    spec.padding = 1;
    spec.want_weights = _i;
    spec.want_lse = !_i;
    spec.q_layout = PB_SEQ_MAJOR;
    spec.out_dtype = CLATTN_DTYPE_F16;
    const pb_run_options options = {.executions = tu_small() ? 3 : 7};
    run_sdpa(&spec, &options);
    TU_END_TEST();
}
END_TEST

/* Executions on a second queue of the context's cl_context and device (in order, and out of
 * order where the device has it), with and without a caller's workspace. */
START_TEST(test_second_queue)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    const cl_command_queue_properties supported = tu_device_ulong(CL_DEVICE_QUEUE_PROPERTIES);
    const int out_of_order = _i == 1;
    if (out_of_order && !(supported & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)) {
        printf("check_plan: the device has no out-of-order queues: test_second_queue 1 checks "
               "an in-order queue again\n");
    }
    const cl_command_queue_properties props =
        out_of_order ? (supported & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) : 0;
    cl_int err = CL_SUCCESS;
    cl_command_queue queue =
        clCreateCommandQueue(clattn_ctx_cl_context(ctx), clattn_ctx_device(ctx), props, &err);
    if (tu_expect(err == CL_SUCCESS && queue != NULL, "clCreateCommandQueue: %d", err)) {
        for (int path = 0; path < 2; ++path) {
            pb_sdpa_spec spec = base_spec(2, 2, 33, 65, 32, 16);
            spec.path = path ? CLATTN_PATH_UNFUSED : CLATTN_PATH_FUSED;
            spec.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
            spec.mask = PB_MASK_BOOL;
            spec.want_weights = path;
            spec.want_lse = !path;
            const pb_run_options options = {
                .queue = queue, .executions = tu_small() ? 1 : 3, .caller_workspace = _i};
            run_sdpa(&spec, &options);
        }
        clReleaseCommandQueue(queue);
    }
    TU_END_TEST();
}
END_TEST

/* A caller's workspace of clattn_plan_workspace_size bytes (the fused path needs none), and
 * one a byte short, refused at execution. */
START_TEST(test_caller_workspace)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    pb_sdpa_spec spec = base_spec(2, 3, 17, 33, 8, 8);
    spec.path = _i ? CLATTN_PATH_UNFUSED : CLATTN_PATH_FUSED;
    spec.want_weights = 0;
    spec.mask = PB_MASK_FLOAT;
    const pb_run_options options = {.caller_workspace = 1, .executions = 2};
    run_sdpa(&spec, &options);

    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("%s: workspace size and a workspace one byte short", p.label);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_plan *plan = NULL;
    clattn_tensors bound;
    memset(&bound, 0, sizeof bound);
    clattn_status status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_sdpa_plan_create")) {
        const size_t bytes = clattn_plan_workspace_size(plan);
        const size_t scores = spec.batch * spec.heads * spec.seq_q * spec.seq_k * sizeof(float);
        if (_i) {
            tu_expect(bytes >= scores, "unfused workspace %zu bytes < the scores' %zu", bytes,
                      scores);
        } else {
            tu_expect(bytes == 0, "the fused plan needs %zu bytes of workspace", bytes);
        }
        cl_int err = CL_SUCCESS;
        cl_mem short_ws = bytes > 1 ? clCreateBuffer(clattn_ctx_cl_context(ctx),
                                                     CL_MEM_READ_WRITE, bytes - 1, NULL, &err)
                                    : NULL;
        if (short_ws != NULL && pb_sdpa_upload(ctx, &p, &bound) == CL_SUCCESS) {
            status = clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, short_ws, 0,
                                         NULL, NULL);
            tu_expect(status == CLATTN_ERR_BUFFER_TOO_SMALL &&
                          tu_mentions_word(clattn_last_error(ctx), "workspace"),
                      "a workspace one byte short: %s: %s", clattn_status_string(status),
                      clattn_last_error(ctx));
            float *out = tu_floats(p.out_count);
            size_t stray = 0;
            pb_download(ctx, NULL, &bound.out, out, &stray);
            size_t written = 0;
            for (size_t i = 0; i < p.out_count; ++i)
                written += !isnan(out[i]);
            tu_expect(written == 0 && stray == 0, "a refused execution wrote %zu elements",
                      written + stray);
            free(out);
        }
        if (short_ws != NULL)
            clReleaseMemObject(short_ws);
    }
    pb_release_tensors(&bound);
    clattn_plan_release(plan);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* --- descriptors and bindings ----------------------------------------------------------------- */

static void expect_struct_size_error(clattn_status status, const char *call, size_t given)
{
    tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT && strstr(clattn_last_error(tu_ctx()),
                                                              "struct_size") != NULL,
              "%s with struct_size %zu: %s: '%s' (want CLATTN_ERR_INVALID_ARGUMENT naming "
              "struct_size)",
              call, given, clattn_status_string(status), clattn_last_error(tu_ctx()));
}

/* Every descriptor with a struct_size no version has (sizeof - 4: not a whole number of
 * 8-byte units), from a newer header (sizeof + 8) or 0 is refused, naming struct_size;
 * nothing runs. (An earlier version's smaller struct is taken: test_struct_size_older.) */
START_TEST(test_struct_size)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    pb_sdpa_spec spec = base_spec(1, 2, 3, 5, 4, 4);
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    pb_mha_spec mspec;
    pb_mha_spec_init(&mspec);
    mspec.batch = 1, mspec.seq_q = 3, mspec.embed_dim = 8, mspec.num_heads = 2;
    mspec.form = PB_PACKED_SELF;
    pb_mha_problem mp;
    pb_mha_make(&mp, &mspec);
    float out[64];
    for (int wrong = 0; wrong < 3; ++wrong) {
        tu_set_case("struct_size: %s", wrong == 0 ? "sizeof - 4" : wrong == 1 ? "sizeof + 8" : "0");
#define WRONG_SIZE(type) (wrong == 0 ? sizeof(type) - 4 : wrong == 1 ? sizeof(type) + 8 : 0)
        clattn_plan *plan = NULL;
        clattn_sdpa_desc sdpa;
        pb_sdpa_desc(&p, &sdpa);
        sdpa.struct_size = WRONG_SIZE(clattn_sdpa_desc);
        expect_struct_size_error(clattn_sdpa_plan_create(ctx, &sdpa, &plan),
                                 "clattn_sdpa_plan_create", sdpa.struct_size);
        tu_expect(plan == NULL, "clattn_sdpa_plan_create returned a plan");
        clattn_plan_release(plan);
        plan = NULL;

        clattn_mha_desc mha;
        pb_mha_desc(&mp, &mha);
        mha.struct_size = WRONG_SIZE(clattn_mha_desc);
        expect_struct_size_error(clattn_mha_plan_create(ctx, &mha, &plan),
                                 "clattn_mha_plan_create", mha.struct_size);
        tu_expect(plan == NULL, "clattn_mha_plan_create returned a plan");
        clattn_plan_release(plan);

        clattn_attention_host_desc host;
        clattn_attention_host_desc_init(&host);
        host.batch = 1, host.heads = 2, host.seq_q = 3, host.seq_k = 5;
        host.head_dim_qk = host.head_dim_v = 4;
        host.struct_size = WRONG_SIZE(clattn_attention_host_desc);
        expect_struct_size_error(clattn_attention_host(ctx, &host, p.q, p.k, p.v, NULL, out, NULL),
                                 "clattn_attention_host", host.struct_size);

        clattn_mha_host_desc mha_host = mp.desc;
        mha_host.struct_size = WRONG_SIZE(clattn_mha_host_desc);
        expect_struct_size_error(clattn_mha_forward_host(ctx, &mha_host, &mp.weights, mp.query,
                                                         NULL, NULL, NULL, out, NULL),
                                 "clattn_mha_forward_host", mha_host.struct_size);

        clattn_tensors bound;
        if (pb_sdpa_upload(ctx, &p, &bound) == CL_SUCCESS) {
            /* q (1, 2, 3, 4) times k (1, 2, 5, 4)ᵀ into a (1, 2, 3, 5) buffer */
            cl_int err = CL_SUCCESS;
            cl_mem c_mem = clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_WRITE,
                                          30 * sizeof(float), NULL, &err);
            const clattn_tensor c = clattn_tensor_make(c_mem, 0, CLATTN_DTYPE_F32, 4, 1, 2, 3, 5);
            clattn_matmul_desc matmul = {WRONG_SIZE(clattn_matmul_desc), 0, 1, 1.0f, 0.0f};
            expect_struct_size_error(
                clattn_matmul(ctx, &matmul, &bound.q, &bound.k, NULL, &c, 0, NULL, NULL),
                "clattn_matmul", matmul.struct_size);
            if (c_mem != NULL)
                clReleaseMemObject(c_mem);
            pb_release_tensors(&bound);
        }
#undef WRONG_SIZE
    }
    pb_mha_free(&mp);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* A descriptor as an earlier version built it: clattn_sdpa_desc of 0.5 ended before diag_offset
 * (added in 0.6), so struct_size = offsetof(clattn_sdpa_desc, diag_offset), in a buffer of
 * exactly that size (ASan sees a read past it). The missing field takes its default (0): with
 * CLATTN_CAUSAL_OFFSET that is the top-left diagonal, checked against the float64 reference of
 * a top-left causal problem. The same for clattn_attention_host_desc cut before softcap (the
 * cap and the window then off) and clattn_kv_cache_desc cut before dtype (its default F32). */
START_TEST(test_struct_size_older)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    pb_sdpa_spec spec = base_spec(2, 3, 17, 29, 8, 5);
    spec.causal = CLATTN_CAUSAL_TOP_LEFT;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    desc.causal = CLATTN_CAUSAL_OFFSET;
    desc.diag_offset = 7; /* beyond the old struct: must not be read */
    const size_t old_size = offsetof(clattn_sdpa_desc, diag_offset);
    desc.struct_size = old_size;
    void *old = malloc(old_size);
    memcpy(old, &desc, old_size);
    clattn_plan *plan = NULL;
    clattn_status status = clattn_sdpa_plan_create(ctx, (const clattn_sdpa_desc *)old, &plan);
    free(old);
    clattn_tensors bound;
    if (tu_expect(status == CLATTN_SUCCESS,
                  "create from a desc cut before diag_offset (%zu of %zu bytes): %s", old_size,
                  sizeof desc, clattn_last_error(ctx)) &&
        tu_expect(pb_sdpa_upload(ctx, &p, &bound) == CL_SUCCESS, "upload failed")) {
        status =
            clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL);
        if (tu_expect(status == CLATTN_SUCCESS, "execute: %s", clattn_last_error(ctx)))
            pb_sdpa_check(ctx, NULL, &p, &bound);
        pb_release_tensors(&bound);
    }
    clattn_plan_release(plan);

    /* The smallest descriptor any 0.7+ caller can pass: struct_size, by_role and num_roles
     * only; every other field takes its default (scale 1/sqrt(d), no mask rule, softmax). */
    tu_set_case("clattn_sdpa_desc cut after num_roles");
    pb_sdpa_spec plain = base_spec(1, 2, 13, 31, 8, 3);
    pb_sdpa_problem q;
    pb_sdpa_make(&q, &plain);
    clattn_sdpa_desc head;
    pb_sdpa_desc(&q, &head);
    head.causal = CLATTN_CAUSAL_TOP_LEFT, head.scale = 5.0f; /* past the cut: not read */
    head.struct_size = offsetof(clattn_sdpa_desc, num_roles) + sizeof head.num_roles;
    void *cut = malloc(head.struct_size);
    memcpy(cut, &head, head.struct_size);
    plan = NULL;
    status = clattn_sdpa_plan_create(ctx, (const clattn_sdpa_desc *)cut, &plan);
    free(cut);
    if (tu_expect(status == CLATTN_SUCCESS, "create from a %zu-byte desc: %s", head.struct_size,
                  clattn_last_error(ctx)) &&
        tu_expect(pb_sdpa_upload(ctx, &q, &bound) == CL_SUCCESS, "upload failed")) {
        status = clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL,
                                     NULL);
        if (tu_expect(status == CLATTN_SUCCESS, "execute: %s", clattn_last_error(ctx)))
            pb_sdpa_check(ctx, NULL, &q, &bound);
        pb_release_tensors(&bound);
    }
    clattn_plan_release(plan);
    pb_sdpa_free(&q);

    /* Host attention as 0.3 had it, before softcap and the window: they default (off). */
    tu_set_case("clattn_attention_host_desc without softcap and the window");
    clattn_attention_host_desc host;
    clattn_attention_host_desc_init(&host);
    host.batch = spec.batch, host.heads = spec.heads, host.seq_q = spec.seq_q;
    host.seq_k = spec.seq_k, host.head_dim_qk = spec.dk, host.head_dim_v = spec.dv;
    host.causal = CLATTN_CAUSAL_TOP_LEFT;
    host.softcap = 3.0f; /* beyond the old struct: must not be read */
    host.window_align = CLATTN_CAUSAL_TOP_LEFT, host.window_left = 1, host.window_right = 0;
    host.struct_size = offsetof(clattn_attention_host_desc, softcap);
    float *out = tu_floats(p.out_count);
    for (size_t i = 0; i < p.out_count; ++i)
        out[i] = NAN; /* poison: an unwritten element fails */
    void *host_copy = malloc(host.struct_size);
    memcpy(host_copy, &host, host.struct_size);
    status = clattn_attention_host(ctx, (const clattn_attention_host_desc *)host_copy, p.q, p.k,
                                   p.v, NULL, out, NULL);
    free(host_copy);
    if (tu_expect(status == CLATTN_SUCCESS, "attention_host from a %zu-byte desc: %s",
                  host.struct_size, clattn_last_error(ctx)))
        tu_expect(tu_rel_error(out, p.out_ref, p.out_count) < 1e-4,
                  "attention_host from an older desc: max relative error %g",
                  tu_rel_error(out, p.out_ref, p.out_count));
    free(out);

    /* The KV cache's desc cut before dtype: F32 (the default) is what it then holds. */
    tu_set_case("clattn_kv_cache_desc without dtype");
    clattn_kv_cache_desc kv;
    clattn_kv_cache_desc_init(&kv);
    kv.batch = 1, kv.kv_heads = 2, kv.capacity = 9, kv.head_dim_qk = 4, kv.head_dim_v = 4;
    kv.dtype = CLATTN_DTYPE_BF16; /* beyond the old struct: must not be read */
    kv.struct_size = offsetof(clattn_kv_cache_desc, dtype);
    void *kv_copy = malloc(kv.struct_size);
    memcpy(kv_copy, &kv, kv.struct_size);
    clattn_kv_cache *cache = NULL;
    status = clattn_kv_cache_create(ctx, (const clattn_kv_cache_desc *)kv_copy, &cache);
    free(kv_copy);
    if (tu_expect(status == CLATTN_SUCCESS, "kv cache from an older desc: %s",
                  clattn_last_error(ctx))) {
        clattn_tensor keys;
        clattn_kv_cache_tensors(cache, &keys, NULL, NULL);
        tu_expect(keys.dtype == CLATTN_DTYPE_F32, "the cache's dtype: %d, want F32 (the default)",
                  (int)keys.dtype);
    }
    clattn_kv_cache_release(cache);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* Executes plan on `tensors` and expects `want` with a message naming `name`; the outputs
 * (poisoned) must stay untouched when the binding is refused. */
static void expect_binding_error(clattn_plan *plan, const pb_sdpa_problem *p,
                                 const clattn_tensors *tensors, const clattn_tensors *bound,
                                 clattn_status want, const char *name, const char *what)
{
    clattn_ctx *ctx = tu_ctx();
    clattn_status status =
        clattn_plan_execute(plan, tensors->by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL);
    tu_expect(status == want && tu_mentions_word(clattn_last_error(ctx), name),
              "%s: %s: '%s' (want %s naming %s)", what, clattn_status_string(status),
              clattn_last_error(ctx), clattn_status_string(want), name);
    float *out = tu_floats(p->out_count);
    size_t stray = 0, written = 0;
    pb_download(ctx, NULL, &bound->out, out, &stray);
    for (size_t i = 0; i < p->out_count; ++i)
        written += !isnan(out[i]);
    tu_expect(written == 0 && stray == 0, "%s: a refused execution wrote %zu elements", what,
              written + stray);
    free(out);
}


/* Tensors bound by role through an array with a count (clattn_sdpa_desc.by_role and
 * clattn_plan_execute's by_role and num_roles), checked against the float64 reference: every
 * role (a padding mask, causal), only q, k, v and out (num_roles 4), and a caller that knows
 * more roles than this version (the extra entries absent). Then the refusals: a role this
 * version does not know, both `tensors` and by_role, by_role NULL with a count. */
START_TEST(test_by_role)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    static const size_t counts[3] = {CLATTN_ROLE_COUNT, CLATTN_ROLE_OUT + 1,
                                     CLATTN_ROLE_COUNT + 3};
    pb_sdpa_spec spec = base_spec(2, 3, 17, 63, 8, 5);
    if (_i == 0) {
        spec.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        spec.padding = 1;
    }
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("by_role, num_roles %zu: %s", counts[_i], p.label);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_tensor roles[CLATTN_ROLE_COUNT + 3];
    memset(roles, 0, sizeof roles);
    memcpy(roles, p.layouts.by_role, sizeof p.layouts.by_role);
    desc.by_role = roles;
    desc.num_roles = counts[_i];
    clattn_plan *plan = NULL;
    clattn_tensors bound;
    clattn_tensor bound_roles[CLATTN_ROLE_COUNT + 3];
    if (tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS, "create") &&
        tu_expect(pb_sdpa_upload(ctx, &p, &bound) == CL_SUCCESS, "upload failed")) {
        memset(bound_roles, 0, sizeof bound_roles);
        memcpy(bound_roles, &bound, sizeof bound);
        clattn_status status =
            clattn_plan_execute(plan, bound_roles, counts[_i], NULL, NULL, 0, NULL, NULL);
        if (tu_expect_status(status, CLATTN_SUCCESS, "execute by role"))
            pb_sdpa_check(ctx, NULL, &p, &bound);
        if (_i == 2) {
            bound_roles[CLATTN_ROLE_COUNT + 1] = bound.q; /* a role this version lacks */
            status = clattn_plan_execute(plan, bound_roles, counts[_i], NULL, NULL, 0, NULL, NULL);
            char want[64];
            snprintf(want, sizeof want, "by_role[%d] is set", (int)CLATTN_ROLE_COUNT + 1);
            tu_expect(status == CLATTN_ERR_UNSUPPORTED && strstr(clattn_last_error(ctx), want),
                      "execute with an unknown role: %s (want '%s')", clattn_last_error(ctx), want);
        }
        pb_release_tensors(&bound);
    }
    clattn_plan_release(plan);
    if (_i == 2) {
        static const struct {
            int what;
            clattn_status status;
            const char *message;
        } refusals[3] = {
            {0, CLATTN_ERR_UNSUPPORTED, "by_role[COUNT] is set"},
            {1, CLATTN_ERR_INVALID_ARGUMENT, "out"},
            {2, CLATTN_ERR_INVALID_ARGUMENT, "by_role is NULL but num_roles is 3"},
        };
        for (int i = 0; i < 3; ++i) {
            clattn_sdpa_desc bad = desc;
            clattn_tensor extra[CLATTN_ROLE_COUNT + 3];
            memcpy(extra, roles, sizeof extra);
            if (refusals[i].what == 0)
                extra[CLATTN_ROLE_COUNT] = roles[CLATTN_ROLE_Q], bad.by_role = extra;
            else if (refusals[i].what == 1)
                bad.num_roles = CLATTN_ROLE_OUT; /* q, k and v: out left absent */
            else
                bad.by_role = NULL, bad.num_roles = 3;
            plan = NULL;
            const clattn_status status = clattn_sdpa_plan_create(ctx, &bad, &plan);
            char message[64];
            snprintf(message, sizeof message, "by_role[%d] is set", (int)CLATTN_ROLE_COUNT);
            if (i != 0) /* the first names the count this version knows */
                snprintf(message, sizeof message, "%s", refusals[i].message);
            tu_expect(status == refusals[i].status && plan == NULL &&
                          strstr(clattn_last_error(ctx), message),
                      "refusal %d: status %d, '%s' (want '%s')", i, (int)status,
                      clattn_last_error(ctx), message);
            clattn_plan_release(plan);
        }
    }
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* The bindings checked at execution: dtype, dims and strides against the plan, buffers too
 * small through the strides or the offset, a buffer of another cl_context, a tensor the plan
 * has left absent, a tensor the plan lacks bound; an equivalent layout (packed spelled out)
 * is accepted. */
START_TEST(test_bindings)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    pb_sdpa_spec spec = base_spec(2, 3, 9, 17, 8, 6);
    spec.path = _i ? CLATTN_PATH_UNFUSED : CLATTN_PATH_FUSED;
    spec.mask = PB_MASK_FLOAT;
    spec.padding = 1;
    spec.want_weights = _i;
    spec.want_lse = !_i;
    spec.out_layout = PB_PADDED;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("bindings: %s", p.label);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_plan *plan = NULL;
    clattn_tensors bound;
    memset(&bound, 0, sizeof bound);
    clattn_status status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    if (!tu_expect_status(status, CLATTN_SUCCESS, "clattn_sdpa_plan_create") ||
        pb_sdpa_upload(ctx, &p, &bound) != CL_SUCCESS) {
        clattn_plan_release(plan);
        pb_sdpa_free(&p);
        TU_END_TEST();
        return;
    }
    clattn_tensors t;
    cl_int err = CL_SUCCESS;

    t = bound;
    t.q.dtype = CLATTN_DTYPE_F16;
    expect_binding_error(plan, &p, &t, &bound, CLATTN_ERR_INVALID_ARGUMENT, "q", "q as F16");
    t = bound;
    t.k.dims[2] = 16;
    expect_binding_error(plan, &p, &t, &bound, CLATTN_ERR_INVALID_ARGUMENT, "k", "k dims");
    t = bound;
    t.v.rank = 3;
    expect_binding_error(plan, &p, &t, &bound, CLATTN_ERR_INVALID_ARGUMENT, "v", "v rank 3");
    t = bound;
    pb_tensor_strides(&bound.v, t.v.strides);
    t.v.strides[2] += 1; /* a row gap the plan does not have */
    expect_binding_error(plan, &p, &t, &bound, CLATTN_ERR_INVALID_ARGUMENT, "v", "v strides");
    t = bound;
    t.attn_mask.dtype = CLATTN_DTYPE_U8;
    expect_binding_error(plan, &p, &t, &bound, CLATTN_ERR_INVALID_ARGUMENT, "attn_mask",
                         "attn_mask as U8");

    /* out is padded: a buffer with room for its elements packed, not for its strides */
    const size_t out_extent = pb_tensor_extent(&bound.out);
    cl_mem packed_size = clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_WRITE,
                                        p.out_count * sizeof(float), NULL, &err);
    t = bound;
    t.out.mem = packed_size;
    t.out.offset = 0;
    tu_expect(out_extent > p.out_count, "out is not padded (extent %zu)", out_extent);
    expect_binding_error(plan, &p, &t, &bound, CLATTN_ERR_BUFFER_TOO_SMALL, "out",
                         "out too small through its strides");
    t = bound;
    t.out.offset += 4; /* the buffer has 3 elements after the tensor */
    expect_binding_error(plan, &p, &t, &bound, CLATTN_ERR_BUFFER_TOO_SMALL, "out",
                         "out's offset past the buffer");
    t = bound;
    t.key_padding_mask.offset += 4;
    expect_binding_error(plan, &p, &t, &bound, CLATTN_ERR_BUFFER_TOO_SMALL, "key_padding_mask",
                         "key_padding_mask's offset past the buffer");
    if (packed_size != NULL)
        clReleaseMemObject(packed_size);

    /* absent where the plan has it; bound where the plan lacks it */
    t = bound;
    memset(&t.key_padding_mask, 0, sizeof t.key_padding_mask);
    expect_binding_error(plan, &p, &t, &bound, CLATTN_ERR_INVALID_ARGUMENT, "key_padding_mask",
                         "key_padding_mask absent");
    t = bound;
    t.attn_mask.mem = NULL;
    expect_binding_error(plan, &p, &t, &bound, CLATTN_ERR_INVALID_ARGUMENT, "attn_mask",
                         "attn_mask without a buffer");
    t = bound;
    if (_i) {
        t.lse = clattn_tensor_make(bound.q.mem, 0, CLATTN_DTYPE_F32, 3, 2, 3, 9, 0);
        expect_binding_error(plan, &p, &t, &bound, CLATTN_ERR_INVALID_ARGUMENT, "lse",
                             "lse bound, the plan has none");
    } else {
        t.weights = clattn_tensor_make(bound.q.mem, 0, CLATTN_DTYPE_F32, 4, 2, 3, 9, 17);
        expect_binding_error(plan, &p, &t, &bound, CLATTN_ERR_INVALID_ARGUMENT, "weights",
                             "weights bound, the plan has none");
    }

    /* a buffer of another cl_context */
    char message[256];
    clattn_ctx *other = NULL;
    if (clattn_ctx_create(NULL, &other, message, sizeof message) == CLATTN_SUCCESS) {
        clattn_tensor foreign = bound.k;
        if (pb_upload(other, &foreign, bound.k.offset, p.k) == CL_SUCCESS) {
            t = bound;
            t.k = foreign;
            expect_binding_error(plan, &p, &t, &bound, CLATTN_ERR_INVALID_ARGUMENT, "k",
                                 "k from another cl_context");
            clReleaseMemObject(foreign.mem);
        }
        clattn_ctx_release(other);
    }

    /* the same layout with its packed strides spelled out: accepted, right numbers */
    t = bound;
    pb_tensor_strides(&bound.q, t.q.strides);
    status = clattn_plan_execute(plan, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL);
    if (tu_expect_status(status, CLATTN_SUCCESS, "q with its packed strides spelled out"))
        pb_sdpa_check(ctx, NULL, &p, &bound);

    /* NULL arguments */
    tu_expect_status(
        clattn_plan_execute(NULL, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL),
        CLATTN_ERR_INVALID_ARGUMENT, "clattn_plan_execute(NULL plan)");
    tu_expect_status(clattn_plan_execute(plan, NULL, 0, NULL, NULL, 0, NULL, NULL),
                     CLATTN_ERR_INVALID_ARGUMENT, "clattn_plan_execute(NULL tensors)");
    tu_expect(clattn_plan_workspace_size(NULL) == 0 && clattn_plan_is_fused(NULL) == 0,
              "NULL plan queries");
    clattn_plan_release(NULL);

    pb_release_tensors(&bound);
    clattn_plan_release(plan);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* --- the tuning table --------------------------------------------------------------------- */

/* Runs p on ctx (any context) and returns out (logical packed) in got. */
static clattn_status run_on(clattn_ctx *ctx, const pb_sdpa_problem *p, float *got)
{
    clattn_sdpa_desc desc;
    pb_sdpa_desc(p, &desc);
    clattn_plan *plan = NULL;
    clattn_tensors bound;
    clattn_status status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    if (status == CLATTN_SUCCESS && pb_sdpa_upload(ctx, p, &bound) == CL_SUCCESS) {
        status =
            clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL);
        if (status == CLATTN_SUCCESS) {
            pb_sdpa_check(ctx, NULL, p, &bound);
            pb_download(ctx, NULL, &bound.out, got, NULL);
        }
        pb_release_tensors(&bound);
    }
    if (status != CLATTN_SUCCESS)
        tu_expect(0, "%s: %s: %s", p->label, clattn_status_string(status),
                  clattn_last_error(ctx));
    clattn_plan_release(plan);
    return status;
}

/* Creates a context with CLATTN_TUNING naming a file holding `rows` (NULL: a file that does
 * not exist); returns its status and message. */
static clattn_status ctx_with_tuning(const char *rows, clattn_ctx **ctx, char *message,
                                     size_t size)
{
    char path[] = "/tmp/check_plan_tuning_XXXXXX";
    const int fd = mkstemp(path);
    FILE *file = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (file == NULL) {
        tu_expect(0, "cannot create a temporary tuning file");
        *ctx = NULL;
        return CLATTN_ERR_HOST_MEMORY;
    }
    fputs(rows ? rows : "", file);
    fclose(file);
    const char *before = getenv("CLATTN_TUNING");
    char *saved = before ? strdup(before) : NULL;
    setenv("CLATTN_TUNING", rows ? path : "/nonexistent/clattn_tuning", 1);
    clattn_status status = clattn_ctx_create(NULL, ctx, message, size);
    if (saved) {
        setenv("CLATTN_TUNING", saved, 1);
        free(saved);
    } else {
        unsetenv("CLATTN_TUNING");
    }
    remove(path);
    return status;
}

/* CLATTN_TUNING=FILE: a row that matches no device changes nothing (bit for bit), a valid row
 * that changes parameters still gives the reference's numbers; malformed files fail context
 * creation with a message naming the file's line and what is wrong. */
START_TEST(test_tuning_file)
{
    TU_BEGIN_TEST();
    pb_sdpa_spec spec = base_spec(2, 3, 33, 65, 16, 16);
    spec.mask = PB_MASK_FLOAT;
    spec.causal = CLATTN_CAUSAL_TOP_LEFT;
    for (int path = 0; path < (tu_small() ? 1 : 2); ++path) {
        spec.path = path ? CLATTN_PATH_UNFUSED : CLATTN_PATH_FUSED;
        spec.want_weights = path;
        pb_sdpa_problem p;
        pb_sdpa_make(&p, &spec);
        tu_set_case("tuning rows: %s", p.label);
        float *plain = tu_nan_floats(p.out_count), *tuned = tu_nan_floats(p.out_count);
        char message[1024] = "";
        clattn_ctx *ctx = NULL;
        /* the baseline: the built-in rows and an empty file (the suite may run with
         * CLATTN_TUNING=default, which drops the built-in rows) */
        clattn_status status = ctx_with_tuning("", &ctx, message, sizeof message);
        if (tu_expect(status == CLATTN_SUCCESS, "an empty tuning file: %s", message))
            run_on(ctx, &p, plain);
        clattn_ctx_release(ctx);
        status = ctx_with_tuning("# rows for no device\n"
                                               "gpu | NoSuchVendor | * | softmax_wg=1\n"
                                               "cpu | * | NoSuchDevice | flash_rows=1\n",
                                               &ctx, message, sizeof message);
        if (tu_expect(status == CLATTN_SUCCESS, "unmatched rows: %s", message) &&
            run_on(ctx, &p, tuned) == CLATTN_SUCCESS)
            tu_expect(memcmp(plain, tuned, p.out_count * sizeof(float)) == 0,
                      "rows matching no device changed the results");
        clattn_ctx_release(ctx);
        status = ctx_with_tuning("any | * | * | softmax_wg=16 flash_rows=32 # applies\n", &ctx,
                                 message, sizeof message);
        if (tu_expect(status == CLATTN_SUCCESS, "a valid row: %s", message))
            run_on(ctx, &p, tuned);
        clattn_ctx_release(ctx);
        free(tuned);
        free(plain);
        pb_sdpa_free(&p);
    }

    /* given: the tuning rows */
    static const tu_refusal malformed[] = {
        {"any | * | * | softmax_wg=abc\n", "line 1", CLATTN_ERR_INVALID_ARGUMENT},
        {"# comment\n\nany | * | * | no_such_key=4\n", "line 3", CLATTN_ERR_INVALID_ARGUMENT},
        {"just some words\n", "class | vendor | name", CLATTN_ERR_INVALID_ARGUMENT},
        {"tpu | * | * | softmax_wg=4\n", "tpu", CLATTN_ERR_INVALID_ARGUMENT},
        {"any | * | * | softmax_wg=3\n", "tuning", CLATTN_ERR_UNSUPPORTED},
        {NULL, "cannot open", CLATTN_ERR_INVALID_ARGUMENT},
    };
    for (int i = 0; i < COUNT_OF(malformed); ++i) {
        tu_set_case("malformed tuning file %d: '%s'", i,
                    malformed[i].given ? malformed[i].given : "(missing file)");
        char message[1024] = "";
        clattn_ctx *ctx = NULL;
        clattn_status status = ctx_with_tuning(malformed[i].given, &ctx, message, sizeof message);
        tu_expect(status == malformed[i].want && ctx == NULL &&
                      strstr(message, malformed[i].needle) != NULL,
                  "got %s, ctx %p, message '%s' (want %s mentioning '%s')",
                  clattn_status_string(status), (void *)ctx, message,
                  clattn_status_string(malformed[i].want), malformed[i].needle);
        clattn_ctx_release(ctx);
    }
    TU_END_TEST();
}
END_TEST

/* --- MHA plans on strided and typed activations --------------------------------------------- */

/* MHA plans whose query, key, value and out are views with row strides above their widths,
 * F16 and BF16 storage, on both paths (the unfused one with the attention weights). */
START_TEST(test_mha_views)
{
    TU_BEGIN_TEST();
    pb_mha_spec spec;
    pb_mha_spec_init(&spec);
    switch (_i) {
    case 0: /* PyTorch packed self-attention, query rows of E + 5 */
        spec.batch = 2, spec.seq_q = 17, spec.embed_dim = 32, spec.num_heads = 4;
        spec.form = PB_PACKED_SELF;
        spec.in_biases = spec.out_proj = spec.out_bias = 1;
        spec.query_row_gap = 5;
        spec.causal = CLATTN_CAUSAL_TOP_LEFT;
        break;
    case 1: /* separate weights, kdim/vdim != E, every activation typed and padded */
        spec.batch = 3, spec.seq_q = 9, spec.seq_k = 13, spec.embed_dim = 24;
        spec.num_heads = 3, spec.kdim = 20, spec.vdim = 12;
        spec.layout = CLATTN_LAYOUT_XW;
        spec.form = PB_SEPARATE_CROSS;
        spec.in_biases = spec.out_proj = 1;
        spec.query_dtype = F16, spec.key_dtype = BF16, spec.value_dtype = F32;
        spec.out_dtype = F16;
        spec.query_row_gap = 3, spec.key_row_gap = 1, spec.out_row_gap = 7;
        spec.mask = PB_MASK_FLOAT;
        spec.padding = 1;
        break;
    case 2: /* packed cross-attention, F16 query and out, bottom-right causal, bool mask */
        spec.batch = 2, spec.seq_q = 7, spec.seq_k = 19, spec.embed_dim = 16;
        spec.num_heads = 2;
        spec.form = PB_PACKED_CROSS;
        spec.in_biases = spec.out_proj = spec.out_bias = 1;
        spec.query_dtype = F16, spec.out_dtype = F16;
        spec.query_row_gap = 16, spec.out_row_gap = 2;
        spec.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        spec.mask = PB_MASK_BOOL;
        break;
    default: /* separate self-attention, BF16 query (one buffer for q, k, v), no out proj */
        spec.batch = 1, spec.seq_q = 33, spec.embed_dim = 20, spec.num_heads = 5;
        spec.qk_dim = 10, spec.v_dim = 15;
        spec.form = PB_SEPARATE_SELF;
        spec.query_dtype = BF16, spec.out_dtype = BF16;
        spec.query_row_gap = 4, spec.out_row_gap = 1;
        spec.padding = 1;
        spec.norm = CLATTN_NORM_RELU;
        break;
    }
    for (int path = 0; path < 2; ++path) {
        spec.path = path ? CLATTN_PATH_UNFUSED : CLATTN_PATH_FUSED;
        spec.need_weights = path == 0 ? CLATTN_WEIGHTS_NONE
                            : _i % 2  ? CLATTN_WEIGHTS_AVERAGED
                                      : CLATTN_WEIGHTS_PER_HEAD;
        pb_mha_problem p;
        pb_mha_make(&p, &spec);
        tu_set_case("%s", p.label);
        tu_expect_status(pb_mha_run(tu_ctx(), &p, NULL), CLATTN_SUCCESS, "pb_mha_run");
        pb_mha_free(&p);
    }
    TU_END_TEST();
}
END_TEST

/* --- random problems ------------------------------------------------------------------------ */

/* Random problems over every option the plans take: shapes, dtypes, layouts, masks. */
START_TEST(test_random_problems)
{
    TU_BEGIN_TEST();
    pb_sdpa_spec spec;
    pb_sdpa_random_spec(&spec, PB_RANDOM_ALL | (tu_small() ? PB_RANDOM_SMALL : 0));
    run_sdpa(&spec, NULL);
    TU_END_TEST();
}
END_TEST

/* --- feature interactions (issue 24) -------------------------------------------------------- */

#define TL CLATTN_CAUSAL_TOP_LEFT
#define BR CLATTN_CAUSAL_BOTTOM_RIGHT
#define ONNX CLATTN_CAUSAL_ONNX
#define NONE CLATTN_CAUSAL_NONE

/* Runs one spec on the fused path (with the lse) and the unfused path (with the weights)
 * through pb_sdpa_run (the float64 reference, NaN poison, stray writes); `adjust` (may be
 * NULL) edits the drawn problem first. */
static void run_both_paths(pb_sdpa_spec spec, void (*adjust)(pb_sdpa_problem *, int), int arg)
{
    const clattn_path paths[2] = {CLATTN_PATH_FUSED, CLATTN_PATH_UNFUSED};
    for (int path = 0; path < 2; ++path) {
        spec.path = paths[path];
        spec.want_lse = path == 0;
        spec.want_weights = path == 1;
        pb_sdpa_problem p;
        pb_sdpa_make(&p, &spec);
        if (adjust)
            adjust(&p, arg);
        tu_set_case("%s", p.label);
        tu_expect_status(pb_sdpa_run(tu_ctx(), &p, NULL), CLATTN_SUCCESS, "pb_sdpa_run");
        pb_sdpa_free(&p);
    }
}

/* Per-batch key counts of a kv_len problem: an empty batch, a full one, a part between. */
static void spread_kv_len(pb_sdpa_problem *p, int unused)
{
    (void)unused;
    if (p->kv_len == NULL)
        return;
    const size_t batch = p->spec.batch, seq_k = p->spec.seq_k;
    p->kv_len[0] = batch > 1 ? 0 : (int32_t)(seq_k / 2);
    p->kv_len[batch - 1] = (int32_t)seq_k;
    if (batch > 2)
        p->kv_len[1] = (int32_t)(seq_k / 2 + 1);
    pb_sdpa_reference(p);
}

/* A sliding window with causal masking: query i sees keys j <= p + 0 (causal) and
 * p - left <= j <= p + right (window), p = i + the alignment's offset, so a window's right
 * edge past the diagonal must not loosen the causal bound; left and right sizes of 0, a
 * right edge past every key, Lq < Lk and Lq > Lk (bottom-right: the first rows see no key),
 * per-batch key counts (ONNX, bottom-right by the count), grouped heads, window sizes with
 * window_align NONE (ignored) and the window alone. Both paths; the _gpu_params entry runs
 * them with GPU-class kernels. */
typedef struct band_case {
    size_t heads, kv_heads, seq_q, seq_k;
    clattn_causal causal, window_align;
    long long left, right;
    int kv_len;
} band_case;

/* clang-format off */
static const band_case band_cases[] = {
    /* H Hkv  Lq  Lk causal window left right kv_len */
    {2, 0, 13, 29, TL,   TL,    5,  3, 0},
    {2, 0, 29, 13, BR,   BR,    4,  7, 0},
    {4, 2,  9, 31, ONNX, ONNX, -1,  2, 1},
    {2, 0, 17, 23, BR,   BR,    0,  0, 1},
    {2, 0, 13, 29, TL,   NONE,  3,  5, 0},
    {2, 0, 13, 29, NONE, BR,    6,  2, 0},
    {2, 1, 29, 13, TL,   TL,    2, 40, 0},
    {3, 0, 21, 21, BR,   BR,   -1,  1, 1},
};
/* clang-format on */

START_TEST(test_window_with_causal)
{
    TU_BEGIN_TEST();
    const band_case *c = &band_cases[_i];
    pb_sdpa_spec spec = base_spec(c->kv_len ? 3 : 2, c->heads, c->seq_q, c->seq_k, 16, 8);
    spec.kv_heads = c->kv_heads;
    spec.causal = c->causal;
    spec.window_align = c->window_align;
    spec.window_left = c->left;
    spec.window_right = c->right;
    spec.kv_len = c->kv_len;
    spec.q_gain = 3.0f;
    run_both_paths(spec, spread_kv_len, 0);
    TU_END_TEST();
}
END_TEST

/* Causal masking and a window must use one alignment: mixed top-left, bottom-right, ONNX and
 * offset alignments are refused at plan creation (CLATTN_ERR_INVALID_ARGUMENT, a message
 * naming both), even where they would coincide (Lq == Lk), never run with one of the two. */
START_TEST(test_mixed_alignments_refused)
{
    TU_BEGIN_TEST();
    const clattn_causal offset = CLATTN_CAUSAL_OFFSET;
    const clattn_causal pairs[][2] = {{TL, BR},   {BR, TL},     {TL, ONNX},
                                      {ONNX, BR}, {offset, TL}, {BR, offset}};
    for (int square = 0; square < 2; ++square) {
        pb_sdpa_spec spec = base_spec(2, 2, 7, square ? 7 : 19, 8, 8);
        pb_sdpa_problem p;
        pb_sdpa_make(&p, &spec);
        for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; ++i) {
            tu_set_case("causal=%d window_align=%d window 3, 2 on Lq=7 Lk=%d", (int)pairs[i][0],
                        (int)pairs[i][1], square ? 7 : 19);
            clattn_sdpa_desc desc;
            pb_sdpa_desc(&p, &desc);
            desc.causal = pairs[i][0];
            desc.window_align = pairs[i][1];
            desc.window_left = 3;
            desc.window_right = 2;
            clattn_plan *plan = NULL;
            const clattn_status status = clattn_sdpa_plan_create(tu_ctx(), &desc, &plan);
            const char *message = clattn_last_error(tu_ctx());
            tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT && plan == NULL,
                      "mixed alignments gave %s: %s", clattn_status_string(status), message);
            tu_expect(strstr(message, "causal") && strstr(message, "window_align") &&
                          strstr(message, "same alignment"),
                      "the message does not name the rule: %s", message);
            clattn_plan_release(plan);
        }
        pb_sdpa_free(&p);
    }
    TU_END_TEST();
}
END_TEST

/* The one-row decode with grouped heads (host/attn/sdpa.c: with causal bottom-right or ONNX
 * and no window, a group's query heads run as the rows of their k/v head on the fused path):
 * every problem here has one query row and a group of 2 to 8 heads, on both paths (the
 * unfused path is ungrouped). A sliding window (left) is not grouped (each head's row would
 * sit at another position), and must be right per head; a right-only window that ends at the
 * key count is grouped. Masks whose rows differ between the heads of a group (float, bool,
 * F16), a mask with stride 0 over heads (one row per batch), padding and per-batch key
 * counts, a past. A wrong per-head window or mask stride fails here. */
typedef struct decode_group_case {
    size_t batch, heads, kv_heads, seq_k;
    clattn_causal causal, window_align;
    long long left, right;
    int kv_len;
    size_t past;
    pb_mask_kind mask;
    clattn_dtype mask_dtype;
    unsigned mask_ones;
    int zero_strides, padding;
} decode_group_case;

/* clang-format off */
static const decode_group_case decode_group_cases[] = {
    /* B H Hkv Lk causal window left right kv_len past mask         dtype ones zero pad */
    {2, 8, 2, 37, BR,   BR,    5, -1, 0,  0, PB_MASK_NONE,  F32, 0, 0, 0},
    {3, 8, 2, 37, BR,   BR,    3, -1, 1,  0, PB_MASK_NONE,  F32, 0, 0, 0},
    {2, 8, 2, 37, BR,   NONE, -1, -1, 0,  0, PB_MASK_FLOAT, F32, 0, 0, 0},
    {3, 6, 3, 40, ONNX, NONE, -1, -1, 1,  0, PB_MASK_BOOL,  F32, 0, 0, 1},
    {2, 8, 1, 33, NONE, BR,   -1,  0, 0,  0, PB_MASK_FLOAT, F16, PB_MASK_ONES_B, 0, 0},
    {2, 4, 2, 30, ONNX, ONNX,  6, -1, 0, 17, PB_MASK_FLOAT, F32, 0, 0, 0},
    {2, 8, 2, 29, BR,   NONE, -1, -1, 0,  0, PB_MASK_FLOAT, F32, PB_MASK_ONES_H, 1, 1},
};
/* clang-format on */

START_TEST(test_grouped_decode)
{
    TU_BEGIN_TEST();
    const decode_group_case *c = &decode_group_cases[_i];
    pb_sdpa_spec spec = base_spec(c->batch, c->heads, 1, c->seq_k, 16, 16);
    spec.kv_heads = c->kv_heads;
    spec.causal = c->causal;
    spec.window_align = c->window_align;
    spec.window_left = c->left;
    spec.window_right = c->right;
    spec.kv_len = c->kv_len;
    spec.past = c->past;
    spec.mask = c->mask;
    spec.mask_dtype = c->mask_dtype;
    spec.mask_rank = c->mask != PB_MASK_NONE ? 4 : 0;
    spec.mask_ones = c->mask_ones;
    spec.mask_zero_strides = c->zero_strides;
    spec.padding = c->padding;
    spec.q_gain = 3.0f;
    run_both_paths(spec, spread_kv_len, 0);
    TU_END_TEST();
}
END_TEST

/* Broadcast views: a tensor with a stride of 0 in one dimension is a broadcast, never a
 * packed (all strides 0) tensor nor a unit stride: masks with stride 0 over heads (different
 * values per batch), over batch (different per head), over the query rows, over the keys
 * (the kernels' unit-stride row loads must not take it); q with stride 0 over heads, k/v
 * with stride 0 over batch; key padding with stride 0 over the keys (a batch entry whose
 * keys are all ignored: zeros) and over batch. Both paths, against the reference of the
 * repeated values. */
static void broadcast_qkv(pb_sdpa_problem *p, int which)
{
    const pb_sdpa_spec *s = &p->spec;
    const size_t kv_heads = s->kv_heads ? s->kv_heads : s->heads;
    if (which == 3) { /* q: one query block per batch entry, shared by its heads */
        const size_t head = s->seq_q * s->dk;
        for (size_t b = 0; b < s->batch; ++b)
            for (size_t h = 1; h < s->heads; ++h)
                memcpy(p->q + (b * s->heads + h) * head, p->q + b * s->heads * head,
                       head * sizeof(float));
        p->layouts.q.strides[3] = 1;
        p->layouts.q.strides[2] = s->dk;
        p->layouts.q.strides[1] = 0;
        p->layouts.q.strides[0] = head + 5;
    } else if (which == 4) { /* k and v: one set of keys for every batch entry */
        float *kv[2] = {p->k, p->v};
        clattn_tensor *t[2] = {&p->layouts.k, &p->layouts.v};
        const size_t d[2] = {s->dk, s->dv};
        for (int i = 0; i < 2; ++i) {
            const size_t entry = kv_heads * s->seq_k * d[i];
            for (size_t b = 1; b < s->batch; ++b)
                memcpy(kv[i] + b * entry, kv[i], entry * sizeof(float));
            t[i]->strides[3] = 1;
            t[i]->strides[2] = d[i];
            t[i]->strides[1] = s->seq_k * d[i];
            t[i]->strides[0] = 0;
        }
    } else if (which == 5 || which == 6) { /* key padding: stride 0 over keys, over batch */
        clattn_tensor *t = &p->layouts.key_padding_mask;
        for (size_t b = 0; b < s->batch; ++b)
            for (size_t j = 0; j < s->seq_k; ++j)
                p->padding[b * s->seq_k + j] =
                    which == 5 ? (uint8_t)(b == 1) : p->padding[j]; /* batch 1: no key */
        t->strides[0] = which == 5 ? s->seq_k + 2 : 0;
        t->strides[1] = which == 5 ? 0 : 1;
    }
    pb_sdpa_reference(p);
}

START_TEST(test_zero_stride_views)
{
    TU_BEGIN_TEST();
    /* _i 0-2: masks with stride 0 over H, B, (H and Lq); 3: q over H; 4: k, v over B;
     * 5, 6: key padding over keys, over batch, with masks of stride 0 over keys */
    static const unsigned ones[7] = {PB_MASK_ONES_H, PB_MASK_ONES_B,
                                     PB_MASK_ONES_H | PB_MASK_ONES_LQ, PB_MASK_ONES_H, 0,
                                     PB_MASK_ONES_LK, PB_MASK_ONES_LK | PB_MASK_ONES_B};
    pb_sdpa_spec spec = base_spec(3, 4, 11, 19, 8, 8);
    spec.kv_heads = _i == 4 ? 2 : 0;
    spec.mask = _i == 1 || _i == 6 ? PB_MASK_BOOL : PB_MASK_FLOAT;
    spec.mask_dtype = _i == 2 ? BF16 : F32;
    spec.mask_rank = 4;
    spec.mask_ones = ones[_i];
    spec.mask_zero_strides = ones[_i] != 0;
    spec.causal = _i == 2 ? BR : NONE;
    spec.padding = _i == 3 || _i == 5 || _i == 6;
    spec.q_gain = 3.0f;
    run_both_paths(spec, broadcast_qkv, _i);
    TU_END_TEST();
}
END_TEST

#undef TL
#undef BR
#undef ONNX
#undef NONE

/* --- the KV cache's life cycle ------------------------------------------------------------- */

enum { KV_B = 2, KV_HQ = 4, KV_HKV = 2, KV_CAP = 11, KV_DK = 8, KV_DV = 12, KV_ROWS = 3 };

/* A cache under test and what it should hold: host copies (B, Hkv, capacity, d), rounded as
 * the cache stores them, filled up to `length`. */
typedef struct kv_model {
    clattn_kv_cache *cache;
    clattn_dtype dtype;
    size_t page_size; /* 0: contiguous */
    float k[KV_B * KV_HKV * KV_CAP * KV_DK], v[KV_B * KV_HKV * KV_CAP * KV_DV];
    size_t length;
} kv_model;

/* Appends n fresh random keys and values (packed F32 blocks); expects refusal when they do
 * not fit (CLATTN_ERR_INVALID_SHAPE naming the capacity, the length unchanged). */
static void kv_append(kv_model *m, size_t n)
{
    clattn_ctx *ctx = tu_ctx();
    const int fits = m->length + n <= KV_CAP;
    float *k_new = tu_random_floats(KV_B * KV_HKV * n * KV_DK);
    float *v_new = tu_random_floats(KV_B * KV_HKV * n * KV_DV);
    cl_mem k_mem = tu_upload_floats(k_new, KV_B * KV_HKV * n * KV_DK);
    cl_mem v_mem = tu_upload_floats(v_new, KV_B * KV_HKV * n * KV_DV);
    const clattn_tensor k = clattn_tensor_make(k_mem, 0, F32, 4, KV_B, KV_HKV, n, KV_DK);
    const clattn_tensor v = clattn_tensor_make(v_mem, 0, F32, 4, KV_B, KV_HKV, n, KV_DV);
    const clattn_status status = clattn_kv_cache_append(m->cache, &k, &v, 0, NULL, NULL);
    if (fits) {
        if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_kv_cache_append")) {
            for (size_t bh = 0; bh < KV_B * KV_HKV; ++bh) {
                memcpy(m->k + (bh * KV_CAP + m->length) * KV_DK, k_new + bh * n * KV_DK,
                       n * KV_DK * sizeof(float));
                memcpy(m->v + (bh * KV_CAP + m->length) * KV_DV, v_new + bh * n * KV_DV,
                       n * KV_DV * sizeof(float));
            }
            pb_round_array(m->dtype, m->k, sizeof m->k / sizeof m->k[0]);
            pb_round_array(m->dtype, m->v, sizeof m->v / sizeof m->v[0]);
            m->length += n;
        }
    } else {
        /* The message gives numbers to act on: what still fits and the capacity needed. */
        char needs[64], fits_now[64];
        snprintf(needs, sizeof needs, "capacity >= %zu", m->length + n);
        if (m->length == (size_t)KV_CAP)
            snprintf(fits_now, sizeof fits_now, "full (%zu of %d keys)", m->length, (int)KV_CAP);
        else
            snprintf(fits_now, sizeof fits_now, "only %zu more fit", (size_t)KV_CAP - m->length);
        tu_expect(status == CLATTN_ERR_INVALID_SHAPE && strstr(clattn_last_error(ctx), needs) &&
                      strstr(clattn_last_error(ctx), fits_now),
                  "%zu keys more at length %zu of %d: %s (%d): %s (want '%s' and '%s')", n,
                  m->length, (int)KV_CAP, clattn_status_string(status), (int)status,
                  clattn_last_error(ctx), needs, fits_now);
    }
    clattn_finish(ctx);
    tu_release_mem(k_mem);
    tu_release_mem(v_mem);
    free(v_new);
    free(k_new);
}

/* The cache's length on the host and on the device (its kv_seqlen, every batch entry). */
static void kv_expect_length(const kv_model *m)
{
    tu_expect(clattn_kv_cache_length(m->cache) == m->length, "clattn_kv_cache_length %zu, not %zu",
              clattn_kv_cache_length(m->cache), m->length);
    clattn_tensor n;
    clattn_kv_cache_tensors(m->cache, NULL, NULL, &n);
    int32_t lengths[KV_B] = {-1, -1};
    clattn_finish(tu_ctx());
    tu_expect(clEnqueueReadBuffer(clattn_ctx_queue(tu_ctx()), n.mem, CL_TRUE, 0, sizeof lengths,
                                  lengths, 0, NULL, NULL) == CL_SUCCESS,
              "reading kv_seqlen");
    for (int b = 0; b < KV_B; ++b)
        tu_expect(lengths[b] == (int32_t)m->length, "kv_seqlen[%d] = %d on the device, not %zu", b,
                  (int)lengths[b], m->length);
}

/* Attends with `plan` (q (B, Hq, rows, dk), causal bottom-right, on the cache's tensors) to
 * fresh queries, output NaN-poisoned first, against the float64 reference of the keys the
 * cache should hold (rows with no key: zeros). */
static void kv_attend(const kv_model *m, clattn_plan *plan, size_t rows, const char *what)
{
    const size_t q_count = KV_B * KV_HQ * rows * KV_DK, out_count = KV_B * KV_HQ * rows * KV_DV;
    float *q = tu_random_floats(q_count), *out = tu_nan_floats(out_count);
    for (size_t i = 0; i < q_count; ++i)
        q[i] *= 3.0f;
    clattn_tensors t;
    memset(&t, 0, sizeof t);
    t.q = clattn_tensor_make(tu_upload_floats(q, q_count), 0, F32, 4, KV_B, KV_HQ, rows, KV_DK);
    t.out = clattn_tensor_make(tu_nan_buffer(out_count), 0, F32, 4, KV_B, KV_HQ, rows, KV_DV);
    clattn_kv_cache_tensors(m->cache, &t.k, &t.v, &t.kv_seqlen);
    clattn_kv_cache_block_table(m->cache, &t.block_table);
    if (tu_expect_status(
            clattn_plan_execute(plan, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL),
            CLATTN_SUCCESS, what)) {
        tu_read_floats(t.out.mem, 0, out_count, out);
        const int32_t kv_len[KV_B] = {(int32_t)m->length, (int32_t)m->length};
        ref_sdpa_shape shape = ref_softmax_shape(KV_B, KV_HQ, rows, KV_CAP, KV_DK, KV_DV);
        shape.causal = CLATTN_CAUSAL_BOTTOM_RIGHT, shape.kv_heads = KV_HKV, shape.kv_len = kv_len;
        double *ref = tu_doubles(out_count);
        ref_sdpa(&shape, q, m->k, m->v, NULL, NULL, ref, NULL, NULL);
        char label[160];
        snprintf(label, sizeof label, "%s at length %zu", what, m->length);
        tu_expect_finite(label, out, out_count);
        tu_expect_close(label, out, ref, out_count, TU_TOL);
        free(ref);
    }
    tu_release_mem(t.q.mem);
    tu_release_mem(t.out.mem);
    free(out);
    free(q);
}

/* Paged caches: the caller's pages for sequence 1 (case 3): a reversed run from the pool's
 * top, so that the two sequences' pages interleave in no order; and the refusals of
 * clattn_kv_cache_map_pages (naming the entry; the cache unchanged). */
static void kv_map_caller_pages(kv_model *m, size_t blocks, size_t pages)
{
    clattn_ctx *ctx = tu_ctx();
    int32_t *table = malloc(KV_B * blocks * sizeof *table);
    for (size_t i = 0; i < KV_B * blocks; ++i)
        table[i] = i >= blocks ? (int32_t)(pages - 1 - 2 * (i - blocks)) : -1;
    static const struct {
        size_t entry;
        int32_t value;
        const char *want;
    } bad[] = {{1, -2, "table[0, 1] = -2: expected a page 0 .."},
               {0, 99, "table[0, 0] = 99: expected a page 0 .."},
               {0, 0, "table[1, 10] = 0: page 0 would also hold block [0, 0]"}};
    for (size_t i = 0; i < COUNT_OF(bad); ++i) {
        const int32_t keep = table[bad[i].entry];
        table[bad[i].entry] = bad[i].value;
        if (bad[i].value == 0) /* page 0 twice: sequence 1's last block gets it too */
            table[2 * blocks - 1] = 0;
        const clattn_status status = clattn_kv_cache_map_pages(m->cache, table, 0, NULL, NULL);
        tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT &&
                      strstr(clattn_last_error(ctx), bad[i].want) != NULL,
                  "map_pages with table[%zu] = %d: %s (%d) '%s', want '%s'", bad[i].entry,
                  (int)bad[i].value, clattn_status_string(status), (int)status,
                  clattn_last_error(ctx), bad[i].want);
        table[bad[i].entry] = keep;
        if (bad[i].value == 0)
            table[2 * blocks - 1] = (int32_t)(pages - 1 - 2 * (blocks - 1));
    }
    tu_expect_status(clattn_kv_cache_map_pages(m->cache, table, 0, NULL, NULL), CLATTN_SUCCESS,
                     "clattn_kv_cache_map_pages");
    free(table);
}

/* A causal bottom-right plan on the cache's tensors for (B, Hq, rows, dk) queries. */
static bool kv_plan(const kv_model *m, size_t rows, bool fused, const char *name,
                    clattn_plan **plan)
{
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc_tensors.q = clattn_tensor_make(NULL, 0, F32, 4, KV_B, KV_HQ, rows, KV_DK);
    desc_tensors.out = clattn_tensor_make(NULL, 0, F32, 4, KV_B, KV_HQ, rows, KV_DV);
    clattn_kv_cache_tensors(m->cache, &desc_tensors.k, &desc_tensors.v, &desc_tensors.kv_seqlen);
    clattn_kv_cache_block_table(m->cache, &desc_tensors.block_table);
    desc.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    desc.path = fused ? CLATTN_PATH_FUSED : CLATTN_PATH_UNFUSED;
    return tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, plan), CLATTN_SUCCESS, name);
}

/* The KV cache object's life cycle, in every tier (the generation test of check_flash is
 * left out at small scale): appends of 3, 1 and 5 keys (the lengths after each, on the host
 * and in kv_seqlen on the device), 3 more refused at 9 of 11, 2 that fill the cache exactly,
 * one key more refused (CLATTN_ERR_INVALID_SHAPE naming the capacity; length and keys
 * unchanged), reset (length 0: rows see no key and give zeros), then reuse with new keys up
 * to the capacity again. After each step two plans made once on the cache's tensors attend:
 * a one-row decode with 2 query heads per k/v head on the fused path (grouped decode) and a
 * 3-row causal block on the unfused path, against the float64 reference. Case 1 stores the
 * cache in F16 (the reference reads the rounded keys). Cases 2 and 3 are paged (the 3-row
 * block then runs fused: paged plans are): case 2 with pages of 4 keys from the built-in
 * allocator (pages handed out as the keys reach them), case 3 in BF16 with pages of 1 key
 * in a pool of 2 * 11 + 5 pages, sequence 1's pages the caller's (mapped after the reset,
 * between the refusals of bad tables). The reference reads the keys as one contiguous cache:
 * paged equals contiguous. Case 3 also fills the pool: 5 spare pages, so an append past them
 * is refused before the capacity (no free page), the cache unchanged. */
START_TEST(test_kv_cache_life_cycle)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    kv_model *m = calloc(1, sizeof *m);
    m->dtype = _i == 1 ? F16 : _i == 3 ? BF16 : F32;
    m->page_size = _i == 2 ? 4 : _i == 3 ? 1 : 0;
    tu_set_case("KV cache B=%d Hq=%d Hkv=%d capacity=%d dk=%d dv=%d %s page_size %zu", (int)KV_B,
                (int)KV_HQ, (int)KV_HKV, (int)KV_CAP, (int)KV_DK, (int)KV_DV,
                pb_dtype_name(m->dtype), m->page_size);
    clattn_kv_cache_desc cd;
    clattn_kv_cache_desc_init(&cd);
    cd.batch = KV_B, cd.kv_heads = KV_HKV, cd.capacity = KV_CAP;
    cd.head_dim_qk = KV_DK, cd.head_dim_v = KV_DV, cd.dtype = m->dtype;
    cd.page_size = m->page_size;
    cd.num_pages = _i == 3 ? 2 * KV_CAP + 5 : 0;
    clattn_plan *plans[2] = {NULL, NULL};
    const size_t rows[2] = {1, KV_ROWS};
    const char *names[2] = {"one-row grouped decode (fused)",
                            m->page_size ? "3-row block (fused, paged)" : "3-row block (unfused)"};
    if (!tu_expect_status(clattn_kv_cache_create(ctx, &cd, &m->cache), CLATTN_SUCCESS,
                          "clattn_kv_cache_create"))
        goto done;
    if (m->page_size) {
        clattn_tensor table;
        clattn_kv_cache_block_table(m->cache, &table);
        const size_t blocks = (KV_CAP + m->page_size - 1) / m->page_size;
        tu_expect(table.rank == 2 && table.dims[0] == KV_B && table.dims[1] == blocks &&
                      table.dtype == CLATTN_DTYPE_I32 && table.mem != NULL,
                  "block table: rank %d (%zu, %zu), not (%d, %zu) I32", table.rank, table.dims[0],
                  table.dims[1], (int)KV_B, blocks);
    }
    for (int i = 0; i < 2; ++i)
        if (!kv_plan(m, rows[i], i == 0 || m->page_size, names[i], &plans[i]))
            goto done;
    /* lengths: 0, 3, 4, 9, (9: 3 refused), 11 (exactly full), (11: 1 refused), reset 0, 4, 11 */
    static const int steps[] = {0, 3, 1, 5, 3, 2, 1, -1, 4, 7};
    for (size_t s = 0; s < sizeof steps / sizeof steps[0] && !tu_failed(); ++s) {
        if (steps[s] < 0) {
            tu_expect_status(clattn_kv_cache_reset(m->cache, 0, NULL, NULL), CLATTN_SUCCESS,
                             "clattn_kv_cache_reset");
            m->length = 0;
            if (_i == 3)
                kv_map_caller_pages(m, KV_CAP, 2 * KV_CAP + 5);
        } else if (steps[s] > 0) {
            kv_append(m, (size_t)steps[s]);
        }
        kv_expect_length(m);
        for (int i = 0; i < 2; ++i)
            kv_attend(m, plans[i], rows[i], names[i]);
    }
    tu_expect(m->length == KV_CAP, "the steps ended at length %zu", m->length);
    if (_i == 3 && !tu_failed()) {
        /* An empty pool: 13 pages of 1 key for 2 sequences hold 6 keys each; the 7th needs 2
         * pages, 1 is free: refused, the page it took given back, the keys unchanged. */
        clattn_kv_cache *small = NULL;
        clattn_plan *small_plan = NULL;
        cd.num_pages = 13;
        kv_model *keep = malloc(sizeof *keep);
        *keep = *m;
        m->length = 0;
        if (tu_expect_status(clattn_kv_cache_create(ctx, &cd, &small), CLATTN_SUCCESS,
                             "a 13-page cache") &&
            (m->cache = small, kv_plan(m, 1, true, "decode on 13 pages", &small_plan))) {
            for (int step = 0; step < 6; ++step)
                kv_append(m, 1);
            float *k_new = tu_random_floats(KV_B * KV_HKV * KV_DV);
            cl_mem k_mem = tu_upload_floats(k_new, KV_B * KV_HKV * KV_DV); /* k and v both */
            const clattn_tensor k = clattn_tensor_make(k_mem, 0, F32, 4, KV_B, KV_HKV, 1, KV_DK);
            const clattn_tensor v = clattn_tensor_make(k_mem, 0, F32, 4, KV_B, KV_HKV, 1, KV_DV);
            const clattn_status status = clattn_kv_cache_append(small, &k, &v, 0, NULL, NULL);
            tu_expect(status == CLATTN_ERR_INVALID_SHAPE &&
                          strstr(clattn_last_error(ctx), "no free page for keys 6 .. 6") &&
                          strstr(clattn_last_error(ctx), "they need 2 new pages, 1 free"),
                      "a 7th key in a 13-page pool: %s (%d) '%s'", clattn_status_string(status),
                      (int)status, clattn_last_error(ctx));
            kv_expect_length(m);
            kv_attend(m, small_plan, 1, "the full pool, decode");
            clattn_finish(ctx);
            tu_release_mem(k_mem);
            free(k_new);
        }
        clattn_plan_release(small_plan);
        clattn_kv_cache_release(small);
        m->cache = keep->cache;
        free(keep);
    }
done:
    clattn_plan_release(plans[0]);
    clattn_plan_release(plans[1]);
    clattn_kv_cache_release(m->cache);
    free(m);
    TU_END_TEST();
}
END_TEST

/* --- quantized keys and values (Q8_0, Q4_0) ------------------------------------------------ */

/* The quantized cases: sizes with Lq != Lk, one key, head sizes 32 .. 96 (dv != dk), grouped
 * heads (one-row grouped decode), causal bottom-right with per-batch key counts, rows padded
 * by a block (strided k/v), a long decode step (splits where the device would idle), and the
 * score rule's other features with them: attention sinks, soft-capping, a sliding window,
 * ALiBi. */
static const struct quant_case {
    size_t batch, heads, kv_heads, seq_q, seq_k, dk, dv, pad;
    int causal, kv_len, sinks, softcap, window, alibi;
} quant_cases[] = {
    {1, 1, 1, 1, 1, 32, 32, 0, 0, 0, 0, 0, 0, 0},     {2, 4, 2, 3, 17, 64, 32, 0, 1, 0, 1, 0, 0, 0},
    {1, 2, 2, 17, 65, 96, 64, 32, 0, 1, 0, 1, 0, 1},  {2, 4, 1, 1, 129, 32, 96, 0, 1, 1, 1, 1, 0, 0},
    {1, 8, 2, 1, 1031, 64, 64, 32, 1, 0, 0, 0, 1, 0}, {1, 3, 3, 63, 127, 32, 32, 0, 1, 0, 1, 0, 1, 1},
};

/* SDPA over Q8_0 / Q4_0 k and v written by clattn_quantize on the device (case 0's values
 * 2e-4 at most: subnormal fp16 scales, in the quantizer and in every load): the blocks equal
 * llama.cpp's reference quantizer's byte for byte (the destination padded by a block per row
 * in some cases: strided blocks), and attention over them (fused; output NaN-poisoned) equals
 * the float64 reference over the dequantized values. The error against attention over the
 * unquantized values is printed (Q8_0 ~1e-3, Q4_0 ~1e-2 relative at these sizes). */
START_TEST(test_quantized_kv)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    const struct quant_case *c = &quant_cases[_i / 2];
    const clattn_dtype qt = _i % 2 ? CLATTN_DTYPE_Q4_0 : CLATTN_DTYPE_Q8_0;
    tu_set_case("%s B=%zu H=%zu Hkv=%zu Lq=%zu Lk=%zu dk=%zu dv=%zu pad=%zu causal=%d kv_len=%d "
                "sinks=%d softcap=%d window=%d alibi=%d",
                qt == CLATTN_DTYPE_Q8_0 ? "Q8_0" : "Q4_0", c->batch, c->heads, c->kv_heads,
                c->seq_q, c->seq_k, c->dk, c->dv, c->pad, c->causal, c->kv_len, c->sinks,
                c->softcap, c->window, c->alibi);
    const size_t rows = c->batch * c->kv_heads * c->seq_k;
    const size_t q_count = c->batch * c->heads * c->seq_q * c->dk;
    const size_t o_count = c->batch * c->heads * c->seq_q * c->dv;
    const size_t dims[2] = {c->dk, c->dv};
    float *x[2], *deq[2];
    cl_mem src[2], blocks[2];
    clattn_tensor qkv[2];
    for (int t = 0; t < 2; ++t) {
        /* floats (rows, d), quantized on the device into rows of d + pad elements */
        const size_t d = dims[t], row = d + c->pad, count = rows * d;
        x[t] = tu_random_floats(count);
        /* case 0's values are tiny: their blocks' fp16 scales are subnormal (2^-24 steps) */
        const float gain = t == 0 ? 3.0f : c == &quant_cases[0] ? 2e-4f : 2.0f;
        for (size_t i = 0; i < count; ++i)
            x[t][i] *= gain;
        if (t == 1 && rows >= 2) {
            /* exact rounding ties in v's first two rows (scale 1): Q4_0's (int)(x + 8.5) and
             * Q8_0's round half away from zero, not to even */
            for (size_t j = 0; j < 32; ++j) {
                x[t][j] = j == 0 ? -8.0f : (float)(j % 16) - 7.5f; /* Q4_0: d = -8 / -8 = 1 */
                x[t][d + j] = j == 0 ? 127.0f : (float)j - 16.5f; /* Q8_0: d = 127 / 127 */
            }
        }
        src[t] = tu_upload_floats(x[t], count);
        uint8_t *want = malloc(ref_quantized_bytes(qt, count));
        uint8_t *got = malloc(ref_quantized_bytes(qt, rows * row));
        memset(got, 0xff, ref_quantized_bytes(qt, rows * row)); /* poison: NaN scales */
        blocks[t] = tu_upload_bytes(got, ref_quantized_bytes(qt, rows * row));
        ref_quantize(qt, x[t], count, want);
        const clattn_tensor from =
            clattn_tensor_make(src[t], 0, F32, 4, c->batch, c->kv_heads, c->seq_k, d);
        qkv[t] = clattn_tensor_make(blocks[t], 0, qt, 4, c->batch, c->kv_heads, c->seq_k, d);
        const size_t strides[4] = {c->kv_heads * c->seq_k * row, c->seq_k * row, row, 1};
        memcpy(qkv[t].strides, strides, sizeof strides);
        tu_expect_status(clattn_quantize(ctx, &from, &qkv[t], 0, NULL, NULL), CLATTN_SUCCESS,
                         "clattn_quantize");
        clattn_finish(ctx);
        clEnqueueReadBuffer(clattn_ctx_queue(ctx), blocks[t], CL_TRUE, 0,
                            ref_quantized_bytes(qt, rows * row), got, 0, NULL, NULL);
        /* row r's blocks sit at r * row elements; the pad block is left as it was */
        size_t wrong = 0, first = 0;
        const size_t row_bytes = ref_quantized_bytes(qt, d);
        for (size_t r = 0; r < rows; ++r)
            if (memcmp(got + r * ref_quantized_bytes(qt, row), want + r * row_bytes, row_bytes) &&
                wrong++ == 0)
                first = r;
        tu_expect(wrong == 0, "%s: %zu of %zu rows' blocks differ from the reference's (first: "
                              "row %zu)", t ? "v" : "k", wrong, rows, first);
        deq[t] = malloc(count * sizeof(float));
        ref_dequantize(qt, want, count, deq[t]);
        free(got);
        free(want);
    }
    float *q = tu_random_floats(q_count), *out = tu_nan_floats(o_count);
    for (size_t i = 0; i < q_count; ++i)
        q[i] *= 2.0f;
    int32_t kv_len[2] = {(int32_t)c->seq_k, (int32_t)(c->seq_k > 5 ? c->seq_k - 5 : 1)};
    cl_mem len_mem = tu_upload_bytes(kv_len, sizeof kv_len);
    float sinks[8], slopes[8]; /* per query head (heads <= 8) */
    for (size_t h = 0; h < c->heads; ++h) {
        sinks[h] = h == 1 ? -INFINITY : (float)(4.0 * tu_rand_unit() - 1.0);
        slopes[h] = (float)(0.05 + 0.5 * tu_rand_unit());
    }
    cl_mem sinks_mem = tu_upload_floats(sinks, c->heads);
    cl_mem slopes_mem = tu_upload_floats(slopes, c->heads);
    clattn_tensors t = {0};
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    CLATTN_BIND_ROLES(desc, t);
    t.q = clattn_tensor_make(tu_upload_floats(q, q_count), 0, F32, 4, c->batch, c->heads, c->seq_q,
                             c->dk);
    t.k = qkv[0], t.v = qkv[1];
    t.out = clattn_tensor_make(tu_nan_buffer(o_count), 0, F32, 4, c->batch, c->heads, c->seq_q,
                               c->dv);
    if (c->kv_len)
        t.kv_seqlen = clattn_tensor_make(len_mem, 0, CLATTN_DTYPE_I32, 1, c->batch, 0, 0, 0);
    desc.causal = c->causal ? CLATTN_CAUSAL_BOTTOM_RIGHT : CLATTN_CAUSAL_NONE;
    desc.path = _i % 3 == 0 ? CLATTN_PATH_FUSED : CLATTN_PATH_AUTO;
    if (c->sinks)
        t.sinks = clattn_tensor_make(sinks_mem, 0, F32, 1, c->heads, 0, 0, 0);
    if (c->alibi)
        t.alibi_slopes = clattn_tensor_make(slopes_mem, 0, F32, 1, c->heads, 0, 0, 0);
    desc.softcap = c->softcap ? 2.5f : 0.0f;
    if (c->window) {
        desc.window_align = CLATTN_CAUSAL_BOTTOM_RIGHT;
        desc.window_left = 40, desc.window_right = -1;
    }
    clattn_plan *plan = NULL;
    if (tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS, "plan") &&
        tu_expect_status(clattn_plan_execute(plan, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                             NULL, NULL),
                         CLATTN_SUCCESS, "execute")) {
        tu_read_floats(t.out.mem, 0, o_count, out);
        ref_sdpa_shape shape =
            ref_softmax_shape(c->batch, c->heads, c->seq_q, c->seq_k, c->dk, c->dv);
        shape.causal = desc.causal, shape.kv_heads = c->kv_heads;
        shape.kv_len = c->kv_len ? kv_len : NULL, shape.softcap = desc.softcap;
        shape.window_align = desc.window_align, shape.window_left = 40, shape.window_right = -1;
        shape.alibi = c->alibi ? slopes : NULL, shape.sinks = c->sinks ? sinks : NULL;
        double *ref = tu_doubles(o_count), *exact = tu_doubles(o_count);
        ref_sdpa(&shape, q, deq[0], deq[1], NULL, NULL, ref, NULL, NULL);
        ref_sdpa(&shape, q, x[0], x[1], NULL, NULL, exact, NULL, NULL);
        tu_expect_finite("quantized k/v", out, o_count);
        tu_expect_close("quantized k/v (the dequantized values' reference)", out, ref, o_count,
                        TU_TOL);
        printf("check_plan: %s Lq=%zu Lk=%zu dk=%zu dv=%zu: relative error %.2g against "
               "unquantized attention\n",
               qt == CLATTN_DTYPE_Q8_0 ? "Q8_0" : "Q4_0", c->seq_q, c->seq_k, c->dk, c->dv,
               tu_rel_error(out, exact, o_count));
        free(exact);
        free(ref);
    }
    clattn_plan_release(plan);
    tu_release_mem(t.q.mem);
    tu_release_mem(t.out.mem);
    tu_release_mem(len_mem);
    tu_release_mem(sinks_mem);
    tu_release_mem(slopes_mem);
    for (int i = 0; i < 2; ++i) {
        tu_release_mem(src[i]);
        tu_release_mem(blocks[i]);
        free(x[i]);
        free(deq[i]);
    }
    free(q);
    free(out);
    TU_END_TEST();
}
END_TEST

/* What quantized k/v refuse, each naming the argument: a head size not a multiple of 32 (the
 * quantizer, plans and caches), strides that split blocks, the unfused path, past/present. */
START_TEST(test_quantized_refusals)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    cl_mem buf = tu_nan_buffer(4096);
    const clattn_tensor f48 = clattn_tensor_make(buf, 0, F32, 4, 1, 1, 4, 48);
    const clattn_tensor q48 = clattn_tensor_make(buf, 0, CLATTN_DTYPE_Q8_0, 4, 1, 1, 4, 48);
    clattn_status status = clattn_quantize(ctx, &f48, &q48, 0, NULL, NULL);
    tu_expect(status == CLATTN_ERR_UNSUPPORTED &&
                  strstr(clattn_last_error(ctx), "dst is Q8_0 with dims[3] = 48 (the head size): "
                                                 "a block type needs a multiple of 32"),
              "quantize d=48: %s '%s'", clattn_status_string(status), clattn_last_error(ctx));
    clattn_tensor q64 = clattn_tensor_make(buf, 0, CLATTN_DTYPE_Q4_0, 4, 1, 1, 4, 64);
    q64.strides[2] = 80;
    const clattn_tensor f64t = clattn_tensor_make(buf, 0, F32, 4, 1, 1, 4, 64);
    status = clattn_quantize(ctx, &f64t, &q64, 0, NULL, NULL);
    tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT &&
                  strstr(clattn_last_error(ctx), "strides[2] = 80: strides must be whole blocks"),
              "quantize stride 80: %s '%s'", clattn_status_string(status), clattn_last_error(ctx));
    /* the unfused path, and past/present */
    for (int which = 0; which < 2; ++which) {
        clattn_tensors t = {0};
        clattn_sdpa_desc desc;
        clattn_sdpa_desc_init(&desc);
        CLATTN_BIND_ROLES(desc, t);
        t.q = clattn_tensor_make(NULL, 0, F32, 4, 1, 2, 3, 32);
        t.k = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_Q8_0, 4, 1, 2, 5, 32);
        t.v = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_Q4_0, 4, 1, 2, 5, 32);
        t.out = clattn_tensor_make(NULL, 0, F32, 4, 1, 2, 3, 32);
        if (which == 0) {
            desc.path = CLATTN_PATH_UNFUSED;
        } else {
            t.past_k = clattn_tensor_make(NULL, 0, F32, 4, 1, 2, 2, 32);
            t.past_v = t.past_k;
            t.present_k = clattn_tensor_make(NULL, 0, F32, 4, 1, 2, 7, 32);
            t.present_v = t.present_k;
        }
        clattn_plan *plan = NULL;
        status = clattn_sdpa_plan_create(ctx, &desc, &plan);
        const char *want = which == 0 ? "quantized k/v (Q8_0, Q4_0) run on the fused path only"
                                      : "quantized k/v (Q8_0, Q4_0) with past/present";
        tu_expect(status == CLATTN_ERR_UNSUPPORTED && strstr(clattn_last_error(ctx), want),
                  "%s: %s '%s'", want, clattn_status_string(status), clattn_last_error(ctx));
        clattn_plan_release(plan);
    }
    clattn_kv_cache_desc cd;
    clattn_kv_cache_desc_init(&cd);
    cd.batch = 1, cd.kv_heads = 1, cd.capacity = 8, cd.head_dim_qk = 64, cd.head_dim_v = 40;
    cd.dtype = CLATTN_DTYPE_Q4_0;
    clattn_kv_cache *cache = NULL;
    status = clattn_kv_cache_create(ctx, &cd, &cache);
    tu_expect(status == CLATTN_ERR_UNSUPPORTED &&
                  strstr(clattn_last_error(ctx), "head_dim_v=40: a Q4_0 cache needs head sizes "
                                                 "that are multiples of 32"),
              "cache dv=40: %s '%s'", clattn_status_string(status), clattn_last_error(ctx));
    clattn_kv_cache_release(cache);
    tu_release_mem(buf);
    TU_END_TEST();
}
END_TEST

/* A quantized KV cache (Q8_0 contiguous, Q4_0 paged in pages of 3 keys): a prompt of 5 keys
 * then 4 single steps of F32 keys quantized by the append on the device, each step's one-row
 * grouped decode against the float64 reference over the keys quantized on the host. */
START_TEST(test_quantized_cache)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    enum { B = 2, HQ = 4, HKV = 2, D = 64, CAP = 16, PROMPT = 5, STEPS = 4 };
    const clattn_dtype qt = _i ? CLATTN_DTYPE_Q4_0 : CLATTN_DTYPE_Q8_0;
    tu_set_case("%s cache, page size %d", _i ? "Q4_0" : "Q8_0", _i ? 3 : 0);
    clattn_kv_cache_desc cd;
    clattn_kv_cache_desc_init(&cd);
    cd.batch = B, cd.kv_heads = HKV, cd.capacity = CAP, cd.head_dim_qk = cd.head_dim_v = D;
    cd.dtype = qt;
    cd.page_size = _i ? 3 : 0;
    clattn_kv_cache *cache = NULL;
    clattn_plan *plan = NULL;
    float *keys = tu_random_floats(B * HKV * CAP * D), *values = tu_random_floats(B * HKV * CAP * D);
    float *kq = calloc(B * HKV * CAP * D, sizeof(float)), *vq = calloc(B * HKV * CAP * D, sizeof(float));
    uint8_t *scratch = malloc(ref_quantized_bytes(qt, D));
    clattn_tensors t = {0};
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    CLATTN_BIND_ROLES(desc, t);
    if (!tu_expect_status(clattn_kv_cache_create(ctx, &cd, &cache), CLATTN_SUCCESS, "cache"))
        goto done;
    t.q = clattn_tensor_make(NULL, 0, F32, 4, B, HQ, 1, D);
    t.out = clattn_tensor_make(NULL, 0, F32, 4, B, HQ, 1, D);
    clattn_kv_cache_tensors(cache, &t.k, &t.v, &t.kv_seqlen);
    clattn_kv_cache_block_table(cache, &t.block_table);
    desc.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    if (!tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS, "plan"))
        goto done;
    for (size_t length = 0; length < PROMPT + STEPS && !tu_failed();) {
        const size_t n = length == 0 ? PROMPT : 1;
        /* the new keys (B, HKV, n, D) from the (B, HKV, CAP, D) arrays, packed */
        float *kn = malloc(B * HKV * n * D * sizeof(float)), *vn = malloc(B * HKV * n * D * sizeof(float));
        for (size_t bh = 0; bh < B * HKV; ++bh)
            for (size_t j = 0; j < n; ++j) {
                const size_t at = (bh * CAP + length + j) * D;
                memcpy(kn + (bh * n + j) * D, keys + at, D * sizeof(float));
                memcpy(vn + (bh * n + j) * D, values + at, D * sizeof(float));
                ref_quantize(qt, keys + at, D, scratch);
                ref_dequantize(qt, scratch, D, kq + at);
                ref_quantize(qt, values + at, D, scratch);
                ref_dequantize(qt, scratch, D, vq + at);
            }
        cl_mem km = tu_upload_floats(kn, B * HKV * n * D), vm = tu_upload_floats(vn, B * HKV * n * D);
        const clattn_tensor kt = clattn_tensor_make(km, 0, F32, 4, B, HKV, n, D);
        const clattn_tensor vt = clattn_tensor_make(vm, 0, F32, 4, B, HKV, n, D);
        tu_expect_status(clattn_kv_cache_append(cache, &kt, &vt, 0, NULL, NULL), CLATTN_SUCCESS,
                         "append");
        length += n;
        float *q = tu_random_floats(B * HQ * D), *out = tu_nan_floats(B * HQ * D);
        clattn_tensors run = t;
        run.q.mem = tu_upload_floats(q, B * HQ * D);
        run.out.mem = tu_nan_buffer(B * HQ * D);
        if (tu_expect_status(clattn_plan_execute(plan, run.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                                 0, NULL, NULL),
                             CLATTN_SUCCESS, "decode")) {
            tu_read_floats(run.out.mem, 0, B * HQ * D, out);
            const int32_t kv_len[B] = {(int32_t)length, (int32_t)length};
            ref_sdpa_shape shape = ref_softmax_shape(B, HQ, 1, CAP, D, D);
            shape.causal = CLATTN_CAUSAL_BOTTOM_RIGHT, shape.kv_heads = HKV,
            shape.kv_len = kv_len;
            double *ref = tu_doubles(B * HQ * D);
            ref_sdpa(&shape, q, kq, vq, NULL, NULL, ref, NULL, NULL);
            tu_expect_close("quantized cache decode", out, ref, B * HQ * D, TU_TOL);
            free(ref);
        }
        clattn_finish(ctx);
        tu_release_mem(run.q.mem);
        tu_release_mem(run.out.mem);
        tu_release_mem(km);
        tu_release_mem(vm);
        free(q);
        free(out);
        free(kn);
        free(vn);
    }
done:
    clattn_plan_release(plan);
    clattn_kv_cache_release(cache);
    free(scratch);
    free(keys);
    free(values);
    free(kq);
    free(vq);
    TU_END_TEST();
}
END_TEST

/* Registers `test` for the loop indices in `keep` only (a reduced run's subset). */
static void add_loop_only(TCase *tcase, const TTest *test, const int *keep, int count)
{
    for (int i = 0; i < count; ++i)
        tcase_add_loop_test(tcase, test, keep[i], keep[i] + 1);
}

int main(void)
{
    tu_suite_begin("check_plan");
    Suite *suite = suite_create("plan");
    /* A reduced run (CLATTN_TEST_SCALE=small, for Oclgrind: 8 s per plan problem there) keeps
     * a subset of each table: every role, layout, dtype, mask rank and causal alignment still
     * runs, in fewer combinations. */
    const int small = tu_small();
    static const int views_small[] = {0, 4, 6, 12, 18, 20, 21};
    static const int dtypes_small[] = {0, 1, 5};
    static const int masks_small[] = {0, 3, 6, 9, 12, 15, 17, 22, 25, 29};
    static const int causal_small[] = {1, 3, 4};
    static const int lse_small[] = {0, 1, 2, 4, 5, 6};
    if (small)
        tu_not_run("test_views 1-3, 5, 7-11, 13-17, 19; test_broadcast_inputs 1; test_dtypes "
                   "2-4; test_packed_qkv_views 1-2; test_mask_shapes 1, 2, 4, 5, 7, 8, 10, 11, 13, 14, 16, 18-21, 23, 24, "
                   "26-28; test_causal_alignments 0, 2, 5; test_lse 3, 7; fewer executions in "
                   "test_plan_reuse and test_second_queue, one path in test_tuning_file, "
                   "test_quantized_kv 4-5, 8-11 (Lq 17 x Lk 65 at d 96, Lk 1031, Lq 63 x Lk 127), "
                   "smaller random problems: 8 s per plan problem on Oclgrind");

    TCase *host = tcase_create("host");
    tcase_add_test(host, test_dtype_conversions);
    suite_add_tcase(suite, host);

    TCase *layouts = tu_tcase(suite, "layouts", 900);
    if (small) {
        add_loop_only(layouts, test_views, views_small, COUNT_OF(views_small));
        tcase_add_loop_test(layouts, test_broadcast_inputs, 0, 1);
        add_loop_only(layouts, test_dtypes, dtypes_small, COUNT_OF(dtypes_small));
    } else {
        tcase_add_loop_test(layouts, test_views, 0, 22);
        tcase_add_loop_test(layouts, test_broadcast_inputs, 0, 2);
        tcase_add_loop_test(layouts, test_dtypes, 0, 6);
    }
    tcase_add_loop_test(layouts, test_packed_qkv_views, 0, small ? 1 : 3);
    tcase_add_loop_test(layouts, test_mha_views, 0, 4);

    TCase *masks = tu_tcase(suite, "masks", 900);
    if (small) {
        add_loop_only(masks, test_mask_shapes, masks_small, COUNT_OF(masks_small));
        add_loop_only(masks, test_causal_alignments, causal_small, COUNT_OF(causal_small));
        add_loop_only(masks, test_lse, lse_small, COUNT_OF(lse_small));
    } else {
        tcase_add_loop_test(masks, test_mask_shapes, 0, MASK_SHAPES);
        tcase_add_loop_test(masks, test_causal_alignments, 0, 6);
        tcase_add_loop_test(masks, test_lse, 0, 8);
    }
    tcase_add_test(masks, test_mask_shape_errors);

    TCase *execution = tu_tcase(suite, "execution", 900);
    tcase_add_loop_test(execution, test_plan_reuse, 0, 2);
    tcase_add_loop_test(execution, test_second_queue, 0, 2);
    tcase_add_loop_test(execution, test_caller_workspace, 0, 2);
    tcase_add_test(execution, test_struct_size);
    tcase_add_test(execution, test_struct_size_older);
    tcase_add_loop_test(execution, test_by_role, 0, 3);
    tcase_add_loop_test(execution, test_bindings, 0, 2);
    tcase_add_test(execution, test_tuning_file);

    /* Feature interactions (issue 24), at every scale: each test kills a class of one-line
     * bugs that passed the suites before (tests/mutants/mutants.txt, "issue 24"). */
    TCase *interactions = tu_tcase(suite, "interactions", 900);
    tcase_add_loop_test(interactions, test_window_with_causal, 0, COUNT_OF(band_cases));
    tcase_add_test(interactions, test_mixed_alignments_refused);
    tcase_add_loop_test(interactions, test_grouped_decode, 0, COUNT_OF(decode_group_cases));
    tcase_add_loop_test(interactions, test_zero_stride_views, 0, 7);
    tcase_add_loop_test(interactions, test_kv_cache_life_cycle, 0, 4);
    static const int quant_small[] = {0, 1, 2, 3, 6, 7}; /* Oclgrind: the small cases */
    if (small)
        add_loop_only(interactions, test_quantized_kv, quant_small, COUNT_OF(quant_small));
    else
        tcase_add_loop_test(interactions, test_quantized_kv, 0, 2 * (int)COUNT_OF(quant_cases));
    tcase_add_test(interactions, test_quantized_refusals);
    tcase_add_loop_test(interactions, test_quantized_cache, 0, 2);
    tcase_add_test(interactions, test_paged_and_sinks);
    tcase_add_loop_test(interactions, test_varlen, 0, 3 * COUNT_OF(varlen_cases));
    tcase_add_test(interactions, test_varlen_offsets_and_refusals);

    TCase *problems = tu_tcase(suite, "problems", 900);
    tcase_add_loop_test(problems, test_random_problems, 0, small ? 8 : 32);
    return tu_run_suite(suite);
}
