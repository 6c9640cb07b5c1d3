/*
 * check_flash: the fused (flash) attention kernel. SDPA plans with path FUSED (with the
 * log-sum-exp output), UNFUSED and AUTO, and MHA plans and the MHA host API on both paths,
 * against the float64 reference and against each other, on fresh random inputs at awkward
 * sizes, every mask kind, causal with seq_q != seq_k, head sizes 1 .. 256 (d_k != d_v), batch
 * and heads, relu, fully masked rows; outputs poisoned with NaN first. A long sequence that
 * the unfused path cannot run under a workspace cap is checked on sampled rows. CPUs run
 * kernels/flash_cpu.cl (flash_gpu_params and flash_default_tuning run flash.cl there);
 * test_flash_cpu_variants runs each of its compile-time variants at sizes around its block
 * and tile edges, with every dtype, strided layouts and mask broadcasts.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problems.h"
#include "reference.h"
#include "testutil.h"

typedef struct flash_case {
    size_t batch, heads, seq_q, seq_k, dk, dv;
    int causal, mask, padding, relu;
    int fully_masked; /* 1: padding masks every key of batch 0; 2: the mask kills row 0 */
    float scale;      /* NAN: the default */
    size_t kv_heads;  /* heads of k and v (0: heads): grouped-query attention */
    float softcap;    /* 0: off; else softcap * tanh(s / softcap) before the masks */
} flash_case;

/* clang-format off */
static const flash_case cases[] = {
    /* batch heads  Lq   Lk   dk   dv  causal mask pad relu full scale kv_heads softcap */
    {1, 1,   1,   1,   1,   1, 0, 0, 0, 0, 0, NAN, 0, 0},
    {1, 1,   3,  17,   7,   7, 0, 0, 0, 0, 0, NAN, 0, 0},
    {2, 3,  17,  63,  64,  64, 0, 1, 0, 0, 0, NAN, 0, 0},
    {1, 2,  65,  65,  64,  64, 1, 0, 0, 0, 0, NAN, 0, 0},
    {2, 2, 127,  17,  64, 100, 1, 0, 1, 0, 0, 0.3f, 0, 0},
    {1, 4,  17, 129, 100,  64, 1, 1, 1, 0, 0, NAN, 0, 0},
    {2, 1, 129, 127, 128, 128, 0, 1, 1, 0, 0, NAN, 0, 0},
    {1, 2,  63,  65, 256, 256, 1, 0, 0, 0, 0, NAN, 0, 0},
    {1, 1,  33,  40, 256, 128, 0, 1, 0, 0, 0, NAN, 0, 0},
    {3, 2,  31,  37,   7,   1, 0, 0, 1, 0, 1, NAN, 0, 0},
    {1, 3,  29,  29,  64,  64, 0, 1, 0, 0, 2, NAN, 0, 0},
    {2, 2,  65,  33,  64,  64, 1, 1, 1, 1, 0, NAN, 0, 0},
    {1, 16, 40,  40,  16,  16, 0, 0, 0, 1, 2, 0.5f, 0, 0},
    {2, 8, 100, 300,  64,  64, 1, 1, 1, 0, 0, NAN, 0, 0},
    /* grouped-query attention (last column: k/v heads): groups of 4, 8 (multi-query), 2, 2 */
    {2, 8,  17,  63,  64,  64, 1, 1, 1, 0, 0, NAN, 2, 0},
    {1, 8,  65,  33,   3,   5, 0, 0, 0, 0, 0, NAN, 1, 0},
    {3, 6,   1, 129, 128,  64, 0, 0, 1, 0, 0, NAN, 3, 0},
    {1, 4,  63,  65,   1,   1, 1, 0, 0, 1, 0, NAN, 2, 0},
    /* soft-capping (last column): with a mask, causal and padding under grouped heads, relu,
     * a fully masked row, a cap far above the scores (nearly a no-op) and a 0.2 cap
     * that flattens them */
    {2, 3,  17,  63,  64,  64, 0, 1, 0, 0, 0, NAN, 0, 2.0f},
    {1, 8,  65,  33,   3,   5, 1, 0, 1, 0, 0, NAN, 2, 0.7f},
    {1, 2,  33,  70, 128,  64, 0, 0, 0, 1, 0, NAN, 0, 1.5f},
    {2, 4,   1,  65,  64,  64, 0, 1, 1, 0, 1, NAN, 0, 50.0f},
    {1, 1, 129, 127,  16,  16, 1, 1, 1, 0, 2, 0.3f, 0, 0.2f},
};
/* clang-format on */

static void describe_case(const char *what, const flash_case *c)
{
    tu_set_case("%sB=%zu H=%zu Hkv=%zu Lq=%zu Lk=%zu dk=%zu dv=%zu causal=%d mask=%d pad=%d "
                "relu=%d fully_masked=%d scale=%g softcap=%g",
                what, c->batch, c->heads, c->kv_heads ? c->kv_heads : c->heads, c->seq_q,
                c->seq_k, c->dk, c->dv, c->causal, c->mask, c->padding, c->relu, c->fully_masked,
                (double)c->scale, (double)c->softcap);
}

/* The problem of a case: q spread to [-3, 3) so that the softmax is not flat. */
static void make_problem(pb_sdpa_problem *p, const flash_case *c, int skip_reference)
{
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = c->batch;
    spec.heads = c->heads;
    spec.kv_heads = c->kv_heads;
    spec.softcap = c->softcap;
    spec.seq_q = c->seq_q;
    spec.seq_k = c->seq_k;
    spec.dk = c->dk;
    spec.dv = c->dv;
    spec.scale = c->scale;
    spec.norm = c->relu ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX;
    spec.causal = c->causal ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
    spec.path = CLATTN_PATH_FUSED;
    spec.want_lse = 1;
    spec.mask = c->mask ? PB_MASK_FLOAT : PB_MASK_NONE;
    spec.padding = c->padding;
    spec.fully_masked = c->fully_masked;
    spec.q_gain = 3.0f;
    spec.skip_reference = skip_reference;
    pb_sdpa_make(p, &spec);
}

/* Runs p's inputs through a plan of `path` (lse when asked), checks the outputs against the
 * reference (pb_sdpa_check) and returns out in `got` (logical packed). p is viewed through a
 * shallow copy with the path changed. */
static clattn_status run_path_on(clattn_ctx *ctx, const pb_sdpa_problem *p, clattn_path path,
                                 int with_lse, float *got)
{
    pb_sdpa_problem view = *p;
    view.spec.path = path;
    view.spec.want_lse = with_lse;
    if (!with_lse)
        memset(&view.layouts.lse, 0, sizeof view.layouts.lse);
    snprintf(view.label, sizeof view.label, "%.300s [run with path=%s lse=%d]", p->label,
             path == CLATTN_PATH_FUSED ? "FUSED" : path == CLATTN_PATH_UNFUSED ? "UNFUSED" : "AUTO",
             with_lse);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&view, &desc);
    clattn_plan *plan = NULL;
    clattn_tensors bound;
    memset(&bound, 0, sizeof bound);
    clattn_status status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    if (!tu_expect_status(status, CLATTN_SUCCESS, view.label))
        return status;
    tu_expect(!clattn_plan_is_fused(plan) == !pb_sdpa_expect_fused(&view.spec),
              "%s: the plan's path is %s", view.label,
              clattn_plan_is_fused(plan) ? "fused" : "unfused");
    if (pb_sdpa_upload(ctx, &view, &bound) != CL_SUCCESS) {
        clattn_plan_release(plan);
        return CLATTN_ERR_HOST_MEMORY;
    }
    status = clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_plan_execute")) {
        pb_sdpa_check(ctx, NULL, &view, &bound);
        pb_download(ctx, NULL, &bound.out, got, NULL);
    }
    pb_release_tensors(&bound);
    clattn_plan_release(plan);
    return status;
}

static clattn_status run_path(const pb_sdpa_problem *p, clattn_path path, int with_lse,
                              float *got)
{
    return run_path_on(tu_ctx(), p, path, with_lse, got);
}

/* A second context on the suite's queue with the tuning row `row` on top (its plans run on
 * the suite's buffers); NULL after a failure, which is recorded. */
static clattn_ctx *ctx_with_row(const char *row)
{
    clattn_ctx_desc desc;
    clattn_ctx_desc_init(&desc);
    desc.queue = clattn_ctx_queue(tu_ctx());
    desc.tuning_rows = row;
    clattn_ctx *ctx = NULL;
    char message[512] = "";
    if (!tu_expect_status(clattn_ctx_create_desc(&desc, &ctx, message, sizeof message),
                          CLATTN_SUCCESS, row))
        return NULL;
    return ctx;
}

/* pb_sdpa_execute_twice, its failures recorded. */
static void execute_twice_checked(clattn_ctx *ctx, clattn_plan *plan, const pb_sdpa_problem *p)
{
    tu_expect_status(pb_sdpa_execute_twice(ctx, plan, p), CLATTN_SUCCESS, "execute twice");
}

/* AUTO's plan for p without executing it: it must take the fused path, as
 * pb_sdpa_expect_fused says. */
static void check_auto_is_fused(const pb_sdpa_problem *p)
{
    pb_sdpa_problem view = *p;
    view.spec.path = CLATTN_PATH_AUTO;
    view.spec.want_lse = 0;
    memset(&view.layouts.lse, 0, sizeof view.layouts.lse);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&view, &desc);
    clattn_plan *plan = NULL;
    if (tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                         "AUTO plan"))
        tu_expect(!clattn_plan_is_fused(plan) == !pb_sdpa_expect_fused(&view.spec),
                  "%s: the AUTO plan's path is %s", p->label,
                  clattn_plan_is_fused(plan) ? "fused" : "unfused");
    clattn_plan_release(plan);
}

/* FUSED (with the log-sum-exp), UNFUSED and AUTO on one problem, against the float64
 * reference and each other: AUTO without weights is the fused kernel, bit for bit. A reduced
 * run (CLATTN_TEST_SCALE=small: Oclgrind, the sanitizers, rusticl) only plans AUTO: its
 * execution is the FUSED launch again, the same kernel and arguments less the lse store;
 * the full scale runs it. with_unfused = 0 leaves the UNFUSED run (and the comparison with it)
 * out. */
static void check_fused_case_paths(const pb_sdpa_problem *p, int with_unfused)
{
    float *fused = tu_nan_floats(p->out_count), *unfused = tu_nan_floats(p->out_count);
    float *automatic = tu_nan_floats(p->out_count);
    const clattn_status fused_status = run_path(p, CLATTN_PATH_FUSED, 1, fused);
    const clattn_status unfused_status =
        with_unfused ? run_path(p, CLATTN_PATH_UNFUSED, 0, unfused) : CLATTN_SUCCESS;
    clattn_status auto_status = CLATTN_SUCCESS;
    if (tu_small())
        check_auto_is_fused(p);
    else
        auto_status = run_path(p, CLATTN_PATH_AUTO, 0, automatic);
    if (with_unfused && fused_status == CLATTN_SUCCESS && unfused_status == CLATTN_SUCCESS &&
        auto_status == CLATTN_SUCCESS) {
        double *unfused_ref = tu_doubles(p->out_count);
        tu_floats_to_doubles(unfused, p->out_count, unfused_ref);
        tu_expect_close("fused vs unfused", fused, unfused_ref, p->out_count, TU_TOL);
        free(unfused_ref);
        tu_expect(tu_small() || memcmp(fused, automatic, p->out_count * sizeof(float)) == 0,
                  "AUTO without weights did not run the fused kernel bit for bit");
    }
    if (!with_unfused && fused_status == CLATTN_SUCCESS && auto_status == CLATTN_SUCCESS)
        tu_expect(tu_small() || memcmp(fused, automatic, p->out_count * sizeof(float)) == 0,
                  "AUTO without weights did not run the fused kernel bit for bit");
    free(automatic);
    free(unfused);
    free(fused);
}

static void check_fused_case(const pb_sdpa_problem *p)
{
    check_fused_case_paths(p, 1);
}

START_TEST(test_flash_vs_reference_and_unfused)
{
    TU_BEGIN_TEST();
    const flash_case *c = &cases[_i];
    describe_case("", c);
    pb_sdpa_problem p;
    make_problem(&p, c, 0);
    /* Small scale: the UNFUSED run on the even cases only. Under Oclgrind it is most of a
     * case (the GPU path's 64 x 64 matmul tiles, mostly padding at these sizes) and this
     * test was 310 s of the flash suite's 600; the unfused kernels run under Oclgrind in the
     * attention and mha suites and on both paths in test_key_rules here. */
    check_fused_case_paths(&p, !tu_small() || _i % 2 == 0);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* ONNX Attention's key rules on both paths: per-batch key counts (kv_seqlen, with the count
 * of batch 0 set to 0 and of the last to seq_k), ONNX's causal offset (the past length, or
 * kv_seqlen[b] - Lq), bottom-right by the batch's count, sliding windows (one side, both, the
 * diagonal alone) and a KV cache's past (present = past + new, written by the plan), with
 * grouped heads, masks, padding, soft-capping, relu and ALiBi slopes (per head, or per batch
 * and head) mixed in. */
typedef struct rule_case {
    size_t batch, heads, kv_heads, seq_q, seq_k, dk, dv;
    clattn_causal causal;
    int kv_len;
    size_t past;
    clattn_causal window_align;
    long long left, right;
    int mask, padding, relu;
    float softcap;
    int alibi; /* pb_sdpa_spec.alibi */
} rule_case;

#define TL CLATTN_CAUSAL_TOP_LEFT
#define BR CLATTN_CAUSAL_BOTTOM_RIGHT
#define ONNX CLATTN_CAUSAL_ONNX
#define NONE CLATTN_CAUSAL_NONE
/* clang-format off */
static const rule_case rule_cases[] = {
    /* B  H Hkv  Lq   Lk   dk   dv causal kv_len past window left right mask pad relu cap alibi */
    {2, 3, 0,  17,  63,  64,  64, BR,   1,   0, NONE, 0, 0,   0, 0, 0, 0, 0},
    {3, 2, 0,   4, 129,  16,  16, ONNX, 1,   0, NONE, 0, 0,   1, 0, 0, 0, 0},
    {2, 8, 2,   1, 127,  64,  64, ONNX, 1,   0, NONE, 0, 0,   0, 0, 0, 2.0f, 0},
    {1, 2, 0,  65,  65,  64,  64, TL,   0,   0, TL,  17, -1,  0, 0, 0, 0, 0},
    {1, 1, 0,   5,   5,   1,   1, NONE, 0,   0, TL,   1, 2,   0, 0, 0, 0, 0},
    {2, 3, 0,  17, 129,  17,  33, ONNX, 0, 100, ONNX, 3, -1,  0, 0, 0, 0, 0},
    {2, 4, 2,  63, 129, 128,  64, BR,   0,  66, NONE, 0, 0,   1, 1, 0, 0, 0},
    {1, 2, 0, 129,  65,  64,  64, NONE, 1,   0, BR,   0, 0,   0, 0, 0, 0, 0},
    {2, 2, 0, 127, 127, 256, 256, TL,   0,   0, TL,  63, -1,  0, 1, 0, 0, 0},
    {3, 1, 0, 200, 300,   8,   8, ONNX, 1,   0, ONNX, 70, -1, 1, 0, 1, 0, 0},
    {2, 6, 3,   3,  70,   3,   5, ONNX, 0,  67, ONNX, -1, 1,  0, 0, 0, 0.5f, 0},
    {1, 3, 1,  40,  90,  64,  64, NONE, 0,  50, ONNX, 5,  5,  1, 0, 0, 0, 0},
    {3, 4, 0,  17,  63,  64,  64, NONE, 1,   0, NONE, 0, 0,   1, 0, 0, 0,    1},
    {2, 8, 2,   1, 127,  64,  64, BR,   0, 100, NONE, 0, 0,   0, 0, 0, 2.0f, 2},
    {1, 3, 0,  65, 129,  17,  33, NONE, 0,   0, BR,  17, 3,   0, 1, 0, 0,    1},
    {2, 2, 0, 129,  65,  64,  64, TL,   0,   0, NONE, 0, 0,   1, 0, 1, 0,    2},
};
/* clang-format on */
#undef TL
#undef BR
#undef ONNX
#undef NONE

START_TEST(test_key_rules)
{
    TU_BEGIN_TEST();
    const rule_case *c = &rule_cases[_i];
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = c->batch;
    spec.heads = c->heads;
    spec.kv_heads = c->kv_heads;
    spec.seq_q = c->seq_q;
    spec.seq_k = c->seq_k;
    spec.dk = c->dk;
    spec.dv = c->dv;
    spec.causal = c->causal;
    spec.kv_len = c->kv_len;
    spec.past = c->past;
    spec.window_align = c->window_align;
    spec.window_left = c->left;
    spec.window_right = c->right;
    spec.mask = c->mask ? PB_MASK_FLOAT : PB_MASK_NONE;
    spec.padding = c->padding;
    spec.norm = c->relu ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX;
    spec.softcap = c->softcap;
    spec.alibi = c->alibi;
    spec.q_gain = 3.0f;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    if (c->kv_len && c->batch > 1) { /* an empty batch, a full one, and a part between */
        p.kv_len[0] = 0;
        p.kv_len[c->batch - 1] = (int32_t)c->seq_k;
        if (c->batch > 2) /* (ALiBi's distance from the count shows where keys lie both sides) */
            p.kv_len[1] = (int32_t)(c->seq_k / 2 + 1);
        pb_sdpa_reference(&p);
    }
    tu_set_case("%s", p.label);
    check_fused_case(&p);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* CLATTN_CAUSAL_OFFSET: any diagonal (ring attention's blocks at arbitrary global positions)
 * on both paths against the float64 reference: positive, negative and zero offsets, offsets
 * past every key either side (every row all keys, or none: zeros and lse -inf), the extremes
 * of long long, with a sliding window aligned the same way (or the window alone), grouped
 * heads (one-row decode grouping included), padding, masks and relu. */
typedef struct offset_case {
    size_t batch, heads, kv_heads, seq_q, seq_k, dk, dv;
    int causal; /* 1: causal OFFSET */
    int window; /* 1: window_align OFFSET with left, right */
    long long left, right, diag;
    int mask, padding, relu;
} offset_case;

/* clang-format off */
static const offset_case offset_cases[] = {
    /* B  H Hkv  Lq   Lk  dk  dv causal window left right diag         mask pad relu */
    {2, 3, 0,  17,  63, 64, 64, 1, 0,  0,  0,  20,                        0, 0, 0},
    {1, 2, 0,  33,  40, 16, 16, 1, 0,  0,  0, -10,                        0, 0, 0},
    {1, 2, 0,  65,  65, 64, 64, 1, 0,  0,  0,   0,                        0, 1, 0},
    {2, 2, 0,  31,  29, 17, 33, 1, 0,  0,  0,  1000000000000000LL,        0, 0, 0},
    {2, 2, 0,  31,  29, 17, 33, 1, 0,  0,  0, -1000000000000000LL,        0, 0, 0},
    {1, 3, 0,   7,  13,  8,  8, 1, 0,  0,  0,  LLONG_MAX,                 0, 0, 0},
    {1, 3, 0,   7,  13,  8,  8, 1, 0,  0,  0,  LLONG_MIN,                 0, 0, 0},
    {1, 2, 0,  40, 100, 64, 64, 1, 1,  7, -1,  50,                        1, 0, 0},
    {2, 2, 0,  23,  37, 32, 32, 0, 1,  3,  5,  -4,                        0, 1, 0},
    {2, 4, 2,  45,  70, 64, 64, 1, 0,  0,  0,  13,                        0, 1, 0},
    {1, 8, 2,   1, 127, 64, 64, 1, 0,  0,  0,  60,                        0, 0, 0},
    {1, 8, 2,   1, 127, 64, 64, 1, 0,  0,  0, 126,                        0, 0, 0},
    {2, 3, 1, 100, 300, 32, 48, 1, 1, 70, -1, 150,                        1, 1, 1},
    {1, 1, 0, 129, 129, 64, 64, 1, 1,  1000000000000LL, 3, -64,           0, 0, 0},
    /* huge window sizes against a huge diagonal: the edges are their sums (found by the
     * sweep: a right size past 2^34 was taken as unbounded before it was added) */
    {1, 2, 0,   1,   5,  8,  8, 0, 1, -1, 1LL << 40, -(1LL << 40),       0, 0, 0},
    {1, 2, 0,   9,  13,  8,  8, 1, 1,  1LL << 40, 3, 1LL << 40,           0, 0, 0},
    {2, 2, 0,   6,  11,  8,  8, 0, 1, 1LL << 40, 1LL << 40, -(1LL << 40) + 2, 1, 0, 0},
};
/* clang-format on */

START_TEST(test_diag_offset)
{
    TU_BEGIN_TEST();
    const offset_case *c = &offset_cases[_i];
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = c->batch;
    spec.heads = c->heads;
    spec.kv_heads = c->kv_heads;
    spec.seq_q = c->seq_q;
    spec.seq_k = c->seq_k;
    spec.dk = c->dk;
    spec.dv = c->dv;
    spec.causal = c->causal ? CLATTN_CAUSAL_OFFSET : CLATTN_CAUSAL_NONE;
    spec.window_align = c->window ? CLATTN_CAUSAL_OFFSET : CLATTN_CAUSAL_NONE;
    spec.window_left = c->left;
    spec.window_right = c->right;
    spec.diag_offset = c->diag;
    spec.mask = c->mask ? PB_MASK_FLOAT : PB_MASK_NONE;
    spec.padding = c->padding;
    spec.norm = c->relu ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX;
    spec.q_gain = 3.0f;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("%s", p.label);
    check_fused_case(&p);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* The scores output (ONNX's qk_matmul_output modes 0 to 2) on the unfused path, against the
 * float64 scores of the same rule, on the key-rule cases (masks, padding, windows, key counts,
 * a past): every element, -inf exactly where a key is dropped (mode 2). */
START_TEST(test_scores_output)
{
    TU_BEGIN_TEST();
    const rule_case *c = &rule_cases[_i / 3];
    const int mode = _i % 3;
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = c->batch, spec.heads = c->heads, spec.kv_heads = c->kv_heads;
    spec.seq_q = c->seq_q, spec.seq_k = c->seq_k, spec.dk = c->dk, spec.dv = c->dv;
    spec.causal = c->causal, spec.kv_len = c->kv_len, spec.past = c->past;
    spec.window_align = c->window_align, spec.window_left = c->left, spec.window_right = c->right;
    spec.mask = c->mask ? PB_MASK_FLOAT : PB_MASK_NONE;
    spec.padding = c->padding;
    spec.softcap = c->softcap > 0.0f ? c->softcap : 1.5f; /* modes 0 and 1 then differ */
    spec.alibi = c->alibi;
    spec.path = CLATTN_PATH_UNFUSED;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("scores mode %d: %s", mode, p.label);
    const size_t count = p.weights_count;
    const size_t dims[4] = {spec.batch, spec.heads, spec.seq_q, spec.seq_k};
    pb_make_layout(&p.layouts.scores, CLATTN_DTYPE_F32, 4, dims, _i % 2 ? PB_PADDED : PB_PACKED);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    desc.scores_mode = (clattn_scores)mode;
    clattn_plan *plan = NULL;
    clattn_tensors bound;
    memset(&bound, 0, sizeof bound);
    if (tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                         "create") &&
        pb_sdpa_upload(tu_ctx(), &p, &bound) == CL_SUCCESS) {
        bound.scores = p.layouts.scores;
        if (pb_upload(tu_ctx(), &bound.scores, 3, NULL) == CL_SUCCESS &&
            tu_expect_status(clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                                 0, NULL, NULL),
                             CLATTN_SUCCESS, "execute")) {
            pb_sdpa_check(tu_ctx(), NULL, &p, &bound); /* out, present: as ever */
            float *got = tu_nan_floats(count);
            size_t stray = 0;
            double *want = tu_doubles(count);
            ref_sdpa_shape shape = pb_sdpa_ref_shape(&spec);
            shape.kv_len = p.kv_len;
            float *alibi = NULL;
            if (p.alibi != NULL) { /* (B, H) */
                alibi = tu_floats(spec.batch * spec.heads);
                for (size_t e = 0; e < spec.batch * spec.heads; ++e)
                    alibi[e] = p.alibi[spec.alibi == 1 ? e % spec.heads : e];
            }
            shape.alibi = alibi;
            float *mask = pb_expand_mask(&p);
            ref_sdpa_scores(&shape, p.q, p.k, mask, p.padding, mode, want);
            free(alibi);
            free(mask);
            if (pb_download(tu_ctx(), NULL, &bound.scores, got, &stray) == CL_SUCCESS) {
                size_t wrong = 0, first = count;
                for (size_t e = 0; e < count; ++e) {
                    const int dropped = isinf(want[e]) && want[e] < 0;
                    const int ok =
                        dropped ? (isinf(got[e]) && got[e] < 0)
                                : fabs((double)got[e] - want[e]) <= 1e-4 * (1.0 + fabs(want[e]));
                    if (!ok && wrong++ == 0)
                        first = e;
                }
                tu_expect(wrong == 0, "%zu of %zu scores wrong; the first, %zu: got %.9g want %.9g",
                          wrong, count, first, first < count ? (double)got[first] : 0.0,
                          first < count ? want[first] : 0.0);
                tu_expect(stray == 0, "%zu elements written outside the scores", stray);
            }
            free(want);
            free(got);
        }
    }
    pb_release_tensors(&bound);
    clattn_plan_release(plan);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* The normalisation in double (softmax_f64, ONNX's softmax_precision = DOUBLE) on the key-rule
 * cases: AUTO takes the unfused path; out, weights and present against the float64 reference.
 * Devices without doubles refuse it (CLATTN_ERR_UNSUPPORTED), which is checked instead. */
START_TEST(test_softmax_f64)
{
    TU_BEGIN_TEST();
    const rule_case *c = &rule_cases[_i];
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = c->batch, spec.heads = c->heads, spec.kv_heads = c->kv_heads;
    spec.seq_q = c->seq_q, spec.seq_k = c->seq_k, spec.dk = c->dk, spec.dv = c->dv;
    spec.causal = c->causal, spec.kv_len = c->kv_len, spec.past = c->past;
    spec.window_align = c->window_align, spec.window_left = c->left, spec.window_right = c->right;
    spec.mask = c->mask ? PB_MASK_FLOAT : PB_MASK_NONE;
    spec.padding = c->padding;
    spec.norm = c->relu ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX;
    spec.softcap = c->softcap;
    spec.alibi = c->alibi;
    spec.softmax_f64 = 1;
    spec.want_weights = _i % 2;
    spec.q_gain = 3.0f;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("softmax_f64: %s", p.label);
    const int has_fp64 = tu_device_has_fp64();
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_tensors desc_tensors = p.layouts;
    CLATTN_BIND_ROLES(desc, desc_tensors);
    clattn_plan *plan = NULL;
    const clattn_status status = clattn_sdpa_plan_create(tu_ctx(), &desc, &plan);
    if (!has_fp64) {
        tu_expect_status(status, CLATTN_ERR_UNSUPPORTED, "softmax_f64 without cl_khr_fp64");
    } else if (tu_expect_status(status, CLATTN_SUCCESS, "create")) {
        tu_expect(!clattn_plan_is_fused(plan), "AUTO with softmax_f64 is fused");
        clattn_tensors bound;
        if (pb_sdpa_upload(tu_ctx(), &p, &bound) == CL_SUCCESS) {
            if (tu_expect_status(clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL,
                                                     NULL, 0, NULL, NULL),
                                 CLATTN_SUCCESS, "execute"))
                pb_sdpa_check(tu_ctx(), NULL, &p, &bound);
            pb_release_tensors(&bound);
        }
    }
    clattn_plan_release(plan);
    desc.path = CLATTN_PATH_FUSED;
    desc_tensors.weights.rank = 0;
    plan = NULL;
    tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &plan),
                     has_fp64 ? CLATTN_ERR_INVALID_ARGUMENT : CLATTN_ERR_INVALID_ARGUMENT,
                     "FUSED with softmax_f64");
    clattn_plan_release(plan);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* Decode splits: a few query rows against many keys, on a context whose tuning row splits at
 * 16 keys (decode_keys=16), so the fused kernel's work-groups each take a slice of the keys
 * and flash_merge combines them by log-sum-exp; against the float64 reference, with the
 * key rules, masks, relu, a 16-bit output, the lse and attention sinks (the splits leave
 * them out; a sink folded per split counts once per split). The plan's workspace (the partial
 * results) shows that it split. */
typedef struct decode_case {
    size_t batch, heads, kv_heads, seq_q, seq_k, dk, dv;
    clattn_causal causal;
    int kv_len, mask, relu, lse;
    clattn_causal window_align;
    long long left, right;
    clattn_dtype out_dtype;
    int sinks; /* attention sinks (softmax cases): folded in once, by flash_merge */
} decode_case;

static const decode_case decode_cases[] = {
    {1, 1, 0, 1, 1000, 64, 64, CLATTN_CAUSAL_NONE, 0, 0, 0, 1, CLATTN_CAUSAL_NONE, 0, 0, 0, 1},
    {1, 1, 0, 3, 129, 17, 5, CLATTN_CAUSAL_BOTTOM_RIGHT, 0, 1, 0, 1, CLATTN_CAUSAL_BOTTOM_RIGHT, 40,
     -1, CLATTN_DTYPE_F16, 0},
    {1, 2, 1, 1, 517, 128, 128, CLATTN_CAUSAL_ONNX, 1, 0, 0, 0, CLATTN_CAUSAL_NONE, 0, 0, 0, 1},
    {1, 1, 0, 2, 300, 8, 8, CLATTN_CAUSAL_NONE, 0, 1, 1, 1, CLATTN_CAUSAL_TOP_LEFT, 3, 250,
     CLATTN_DTYPE_BF16, 0},
    {2, 1, 0, 1, 200, 3, 3, CLATTN_CAUSAL_BOTTOM_RIGHT, 1, 0, 0, 1, CLATTN_CAUSAL_NONE, 0, 0, 0, 1},
};

static clattn_ctx *decode_ctx;

/* Decode read in place (flash_cpu.cl's FC_DIRECT: up to 8 query rows, head sizes multiples
 * of 16; tiles inside the key count with unit-stride K and V rows are not packed): one row, a
 * decode group's rows, up to 8 rows, against the float64 reference with every score rule (float
 * and bool masks, padding, soft-capping, ALiBi, windows, relu, key counts), 16-bit K and V,
 * whole tiles and edge tiles, and layouts that keep it (padded rows, sequence-major) or not
 * (a strided V: every tile packed). On a device that runs flash_cpu.cl the plan must say it
 * reads in place. */
typedef struct in_place_case {
    size_t batch, heads, kv_heads, seq_q, seq_k, dk, dv;
    clattn_causal causal;
    int mask, padding, alibi, relu, kv_len;
    float softcap;
    clattn_causal window_align;
    long long left, right;
    clattn_dtype kv_dtype;
    pb_layout k_layout, v_layout;
} in_place_case;

/* clang-format off */
static const in_place_case in_place_cases[] = {
    /* B H Hkv Lq  Lk   dk  dv  causal                  mask pad alibi relu kvlen softcap */
    {1, 1, 0, 1,   1,  16, 16, CLATTN_CAUSAL_NONE,         0, 0, 0, 0, 0, 0.0f,
     CLATTN_CAUSAL_NONE, 0, 0, CLATTN_DTYPE_F32, PB_PACKED, PB_PACKED},
    {1, 8, 0, 1, 257,  64, 64, CLATTN_CAUSAL_NONE,         0, 0, 0, 0, 0, 0.0f,
     CLATTN_CAUSAL_NONE, 0, 0, CLATTN_DTYPE_F32, PB_PACKED, PB_PACKED},
    {2, 8, 2, 1, 200, 128, 128, CLATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 1, 0.0f,
     CLATTN_CAUSAL_NONE, 0, 0, CLATTN_DTYPE_F32, PB_PADDED, PB_PADDED},
    {1, 3, 0, 3, 129,  32, 48, CLATTN_CAUSAL_NONE,         1, 1, 0, 0, 0, 0.0f,
     CLATTN_CAUSAL_NONE, 0, 0, CLATTN_DTYPE_F32, PB_SEQ_MAJOR, PB_PACKED},
    {1, 2, 0, 8, 190,  64, 32, CLATTN_CAUSAL_BOTTOM_RIGHT, 2, 0, 0, 0, 0, 2.5f,
     CLATTN_CAUSAL_NONE, 0, 0, CLATTN_DTYPE_F16, PB_PACKED, PB_PACKED},
    {2, 4, 0, 5, 300,  48, 64, CLATTN_CAUSAL_NONE,         0, 1, 1, 0, 0, 0.0f,
     CLATTN_CAUSAL_BOTTOM_RIGHT, 100, 0, CLATTN_DTYPE_F32, PB_PACKED, PB_PADDED},
    {1, 4, 0, 1, 128,  64, 64, CLATTN_CAUSAL_NONE,         0, 0, 0, 1, 0, 0.0f,
     CLATTN_CAUSAL_NONE, 0, 0, CLATTN_DTYPE_F16, PB_PACKED, PB_PACKED},
    {1, 4, 1, 1, 1000, 96, 96, CLATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 1, 0.0f,
     CLATTN_CAUSAL_NONE, 0, 0, CLATTN_DTYPE_BF16, PB_PADDED, PB_STRIDED_LAST},
    {2, 2, 0, 7,  65,  16, 16, CLATTN_CAUSAL_TOP_LEFT,     1, 0, 0, 0, 0, 0.0f,
     CLATTN_CAUSAL_NONE, 0, 0, CLATTN_DTYPE_F32, PB_PADDED, PB_SEQ_MAJOR_PADDED},
    {1, 6, 3, 1,  64,  64, 64, CLATTN_CAUSAL_NONE,         0, 1, 0, 0, 1, 0.0f,
     CLATTN_CAUSAL_BOTTOM_RIGHT, 20, 0, CLATTN_DTYPE_F32, PB_SEQ_MAJOR, PB_SEQ_MAJOR},
};
/* clang-format on */

START_TEST(test_decode_in_place)
{
    TU_BEGIN_TEST();
    const in_place_case *c = &in_place_cases[_i];
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = c->batch, spec.heads = c->heads, spec.kv_heads = c->kv_heads;
    spec.seq_q = c->seq_q, spec.seq_k = c->seq_k, spec.dk = c->dk, spec.dv = c->dv;
    spec.causal = c->causal;
    spec.mask = c->mask == 1 ? PB_MASK_FLOAT : c->mask == 2 ? PB_MASK_BOOL : PB_MASK_NONE;
    spec.padding = c->padding;
    spec.alibi = c->alibi;
    spec.norm = c->relu ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX;
    spec.kv_len = c->kv_len;
    spec.softcap = c->softcap;
    spec.window_align = c->window_align, spec.window_left = c->left;
    spec.window_right = c->right;
    spec.k_dtype = c->kv_dtype, spec.v_dtype = c->kv_dtype;
    spec.out_dtype = c->kv_dtype;
    spec.k_layout = c->k_layout, spec.v_layout = c->v_layout;
    spec.q_gain = 3.0f;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    if (p.kv_len != NULL) {
        /* Keys past a batch's count hold NaN (a cache's unwritten slots may): a kernel that
         * reads one (the in-place edge tile's scores or P.V) turns the row into NaN. */
        const size_t kv_heads = c->kv_heads ? c->kv_heads : c->heads;
        for (size_t b = 0; b < c->batch; ++b) {
            for (size_t i = b * kv_heads * c->seq_k; i < (b + 1) * kv_heads * c->seq_k; ++i) {
                if (i % c->seq_k >= (size_t)p.kv_len[b]) {
                    for (size_t x = 0; x < c->dk; ++x)
                        p.k[i * c->dk + x] = NAN;
                    for (size_t x = 0; x < c->dv; ++x)
                        p.v[i * c->dv + x] = NAN;
                }
            }
        }
        pb_sdpa_reference(&p);
    }
    tu_set_case("decode in place: %s", p.label);
    check_fused_case_paths(&p, 0);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    desc.path = CLATTN_PATH_FUSED;
    clattn_plan *plan = NULL;
    if (tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                         "fused plan")) {
        /* (not under a loop limit: its parts count the pack's trips) */
        const char *info = clattn_plan_info(plan);
        const char *limit = strstr(clattn_ctx_tuning(tu_ctx()), "loop_trip_limit=");
        tu_expect(strstr(info, "flash_cpu.cl") == NULL || (limit && atol(limit + 16) != 0) ||
                      strstr(info, "read in place") != NULL,
                  "the plan does not read the keys in place: %s", info);
    }
    clattn_plan_release(plan);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

static void release_decode_ctx(void)
{
    clattn_ctx_release(decode_ctx);
    decode_ctx = NULL;
}

START_TEST(test_decode_splits)
{
    TU_BEGIN_TEST();
    const decode_case *c = &decode_cases[_i];
    if (decode_ctx == NULL)
        decode_ctx = ctx_with_row("any | * | * | decode_keys=16");
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = c->batch, spec.heads = c->heads, spec.kv_heads = c->kv_heads;
    spec.seq_q = c->seq_q, spec.seq_k = c->seq_k, spec.dk = c->dk, spec.dv = c->dv;
    spec.causal = c->causal, spec.kv_len = c->kv_len;
    spec.window_align = c->window_align, spec.window_left = c->left, spec.window_right = c->right;
    spec.mask = c->mask ? PB_MASK_FLOAT : PB_MASK_NONE;
    spec.norm = c->relu ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX;
    spec.out_dtype = c->out_dtype;
    spec.want_lse = c->lse;
    spec.sinks = c->sinks;
    spec.path = CLATTN_PATH_FUSED;
    spec.q_gain = 3.0f;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("decode splits: %s", p.label);
    if (decode_ctx != NULL) {
        clattn_sdpa_desc desc;
        pb_sdpa_desc(&p, &desc);
        clattn_plan *plan = NULL;
        if (tu_expect_status(clattn_sdpa_plan_create(decode_ctx, &desc, &plan), CLATTN_SUCCESS,
                             "create")) {
            /* It splits where the row blocks (one here: Lq <= 3) times the heads are under
             * twice the compute units (Oclgrind has one: B * H = 2 does not split there). */
            cl_uint units = 0;
            clGetDeviceInfo(clattn_ctx_device(decode_ctx), CL_DEVICE_MAX_COMPUTE_UNITS,
                            sizeof units, &units, NULL);
            /* Under a loop-trip limit (flash_split, flash_cpu_split, rusticl) keys may run in
             * sequential parts instead, which the plan prefers: no expectation there. */
            const char *limit = strstr(clattn_ctx_tuning(decode_ctx), "loop_trip_limit=");
            const int limited = limit != NULL && strtoul(limit + 16, NULL, 10) != 0;
            const int splits = c->batch * c->heads < 2 * (size_t)units;
            tu_expect(clattn_plan_is_fused(plan) &&
                          (limited || (clattn_plan_workspace_size(plan) > 0) == splits),
                      "the decode plan %s its keys (workspace %zu bytes, %u compute units)",
                      splits ? "did not split" : "split", clattn_plan_workspace_size(plan), units);
            execute_twice_checked(decode_ctx, plan, &p);
        }
        clattn_plan_release(plan);
    }
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* Attention sinks in a grouped one-row decode whose keys are split (issue 48): the group's
 * query heads run as the rows of their k/v head (host/attn/sdpa.c's decode_group, the sinks
 * viewed through heads_as_rows), the splits leave the sinks out, and flash_merge must fold each
 * row's own query head's sink, not the group's first row's nor the k/v head's index. The sinks
 * differ per head (one -inf) and are large beside the scores (q_gain 1), so a row given a
 * neighbour's sink is off by percents. One batch entry and one k/v head are one work-group,
 * fewer than twice any device's compute units: the decode context (decode_keys=16) splits
 * the keys there on every device; case 2's two k/v heads (where the k/v head's index and the
 * group's first row differ) split on devices with 2 or more units (PoCL; not Oclgrind's 1).
 * Against the float64 reference (lse too), on NaN-poisoned outputs, twice. */
typedef struct group_sink_case {
    size_t heads, kv_heads, seq_k, dk;
    int kv_len; /* a key count inside the keys (0: all seq_k) */
    int lse;
    clattn_dtype out_dtype;
    pb_layout sinks_layout;
} group_sink_case;

static const group_sink_case group_sink_cases[] = {
    {4, 1, 200, 64, 0, 1, CLATTN_DTYPE_F32, PB_PACKED},
    {8, 1, 200, 16, 177, 0, CLATTN_DTYPE_F16, PB_PADDED},
    {8, 2, 150, 32, 0, 1, CLATTN_DTYPE_F32, PB_PADDED},
};

START_TEST(test_decode_split_group_sinks)
{
    TU_BEGIN_TEST();
    const group_sink_case *c = &group_sink_cases[_i];
    /* one per query head, each unlike its group's first and its k/v head's index */
    static const float sinks[8] = {3.0f, -1.0f, 5.5f, -INFINITY, 1.5f, 4.5f, -2.5f, 6.0f};
    if (decode_ctx == NULL)
        decode_ctx = ctx_with_row("any | * | * | decode_keys=16");
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = 1, spec.heads = c->heads, spec.kv_heads = c->kv_heads;
    spec.seq_q = 1, spec.seq_k = c->seq_k, spec.dk = spec.dv = c->dk;
    spec.kv_len = c->kv_len != 0;
    spec.out_dtype = c->out_dtype;
    spec.want_lse = c->lse;
    spec.sinks = 1;
    spec.sinks_layout = c->sinks_layout;
    spec.path = CLATTN_PATH_FUSED;
    spec.q_gain = 1.0f;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    for (size_t h = 0; h < c->heads; ++h)
        p.sinks[h] = sinks[h];
    if (c->kv_len)
        p.kv_len[0] = c->kv_len;
    pb_sdpa_reference(&p);
    tu_set_case("grouped decode splits with per-head sinks: %s", p.label);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_plan *plan = NULL;
    if (decode_ctx != NULL && tu_expect_status(clattn_sdpa_plan_create(decode_ctx, &desc, &plan),
                                               CLATTN_SUCCESS, "create")) {
        cl_uint units = 0;
        clGetDeviceInfo(clattn_ctx_device(decode_ctx), CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units,
                        &units, NULL);
        /* (under a loop-trip limit the keys may run in sequential parts instead) */
        const char *limit = strstr(clattn_ctx_tuning(decode_ctx), "loop_trip_limit=");
        const int limited = limit != NULL && strtoul(limit + 16, NULL, 10) != 0;
        const char *info = clattn_plan_info(plan);
        tu_expect(limited || c->kv_heads >= 2 * (size_t)units ||
                      strstr(info, "in decode splits") != NULL,
                  "the grouped decode did not split its keys (%u compute units): %s", units, info);
        execute_twice_checked(decode_ctx, plan, &p);
    }
    clattn_plan_release(plan);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* A paged KV cache whose sequences end inside a block (issue 48): kv_seqlen not a multiple of
 * the page size, so each sequence's last block is partial and its index must be read and
 * used (ceil(count / page_size) blocks hold keys), and its keys must end at the count inside
 * it. The table's entries past a sequence's used blocks are garbage that must never be read:
 * the first one past them is num_pages, a page just past the pool, the others INT32_MAX, -1 or
 * INT32_MIN. The pools are (num_pages, page_size, Hkv, d) with two pages of NaN after them in
 * the buffer (so a read one block too far, or of a block outside the pool, turns a row into
 * NaN on any device; under Oclgrind the wilder indices are out-of-bounds reads it reports),
 * and NaN in every slot no sequence's count reaches. `cut` marks sequences whose partial last
 * block holds an index outside the pool (num_pages + 1): their keys end where that block
 * begins (clattn.h: at the first index outside the pool), however many kv_seqlen says.
 * Grouped heads, page sizes 3, 5, 7, 9 and 16 across the kernels' key tiles, one query row (the
 * grouped decode; on the decode-split context too) and several, causal bottom-right, lse;
 * against the float64 reference on NaN-poisoned outputs, twice. */
typedef struct partial_case {
    size_t page_size, blocks, seq_q;
    clattn_causal causal;
    int kv_len[3];
    unsigned cut; /* bit b: sequence b's partial last block lies outside the pool */
} partial_case;

static const partial_case partial_cases[] = {
    {3, 4, 2, CLATTN_CAUSAL_BOTTOM_RIGHT, {7, 12, 1}, 0},
    /* the longest sequence's partial block is the table's last column */
    {5, 3, 1, CLATTN_CAUSAL_NONE, {11, 5, 14}, 0},
    {16, 2, 3, CLATTN_CAUSAL_NONE, {17, 31, 3}, 2u},
    /* sequence 2's only block is partial and outside: no keys (zeros, lse -inf) */
    {7, 3, 1, CLATTN_CAUSAL_NONE, {10, 20, 6}, 5u},
    /* past flash_cpu.cl's first 64-key tile, which ends inside a page */
    {9, 12, 1, CLATTN_CAUSAL_NONE, {100, 67, 108}, 0},
};

/* Pools (num_pages + 2 pages: the last two NaN) of p's logical keys or values (x 0: k, 1: v)
 * in the pages `table` names for each sequence's first `counts[b]` keys, NaN elsewhere; a
 * packed (num_pages, page_size, Hkv, d) buffer at offset 0. */
static cl_mem paged_pool(const pb_sdpa_problem *p, int x, const int32_t *table, const int *counts)
{
    const pb_sdpa_spec *s = &p->spec;
    const size_t ps = s->page_size, hkv = s->kv_heads, d = x ? s->dv : s->dk;
    const size_t count = (p->num_pages + 2) * ps * hkv * d;
    float *pool = tu_nan_floats(count);
    const float *logical = x ? p->v : p->k;
    for (size_t b = 0; b < s->batch; ++b)
        for (size_t j = 0; j < (size_t)counts[b]; ++j)
            for (size_t h = 0; h < hkv; ++h)
                memcpy(pool + (((size_t)table[b * p->blocks + j / ps] * ps + j % ps) * hkv + h) * d,
                       logical + ((b * hkv + h) * s->seq_k + j) * d, d * sizeof(float));
    cl_mem mem = tu_upload_floats(pool, count);
    free(pool);
    return mem;
}

START_TEST(test_paged_partial_blocks)
{
    TU_BEGIN_TEST();
    const partial_case *c = &partial_cases[_i];
    enum { B = 3 };
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = B, spec.heads = 4, spec.kv_heads = 2;
    spec.seq_q = c->seq_q, spec.seq_k = c->page_size * c->blocks, spec.dk = spec.dv = 16;
    spec.page_size = c->page_size;
    spec.causal = c->causal;
    spec.want_lse = 1;
    spec.path = CLATTN_PATH_FUSED;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    /* The pages each sequence's blocks use, in a drawn order; garbage past them. */
    const size_t ps = c->page_size, blocks = p.blocks, pages = p.num_pages;
    size_t *order = calloc(pages, sizeof *order);
    for (size_t i = 0; i < pages; ++i)
        order[i] = i;
    for (size_t i = pages; i > 1; --i) {
        const size_t j = tu_rand_below(i), swap = order[i - 1];
        order[i - 1] = order[j];
        order[j] = swap;
    }
    static const int32_t garbage[3] = {INT32_MAX, -1, INT32_MIN};
    int32_t *table = calloc(B * blocks, sizeof *table);
    int kept[B]; /* the keys each sequence attends: its count, or up to its cut block */
    for (size_t b = 0; b < B; ++b) {
        const size_t count = (size_t)c->kv_len[b], used = (count + ps - 1) / ps;
        const int cut = (c->cut >> b) & 1u;
        kept[b] = cut ? (int)((used - 1) * ps) : (int)count;
        for (size_t blk = 0; blk < blocks; ++blk)
            table[b * blocks + blk] = blk < used    ? (int32_t)order[b * blocks + blk]
                                      : blk == used ? (int32_t)pages
                                                    : garbage[(b + blk) % 3];
        if (cut)
            table[b * blocks + used - 1] = (int32_t)pages + 1;
    }
    free(order);
    /* the reference: each sequence's kept keys; pb_sdpa_upload's pools are replaced below */
    for (size_t b = 0; b < B; ++b) {
        p.kv_len[b] = kept[b];
        for (size_t blk = 0; blk < blocks; ++blk)
            p.block_table[b * blocks + blk] =
                blk * ps < (size_t)kept[b] ? table[b * blocks + blk] : -1;
    }
    pb_sdpa_reference(&p);
    tu_set_case("paged, partial last blocks: kv_seqlen %d %d %d, cut %u: %s", c->kv_len[0],
                c->kv_len[1], c->kv_len[2], c->cut, p.label);
    clattn_ctx *ctxs[2] = {tu_ctx(), NULL};
    if (c->seq_q == 1) { /* the grouped decode over split keys too */
        if (decode_ctx == NULL)
            decode_ctx = ctx_with_row("any | * | * | decode_keys=16");
        ctxs[1] = decode_ctx;
    }
    for (int which = 0; which < 2; ++which) {
        clattn_ctx *ctx = ctxs[which];
        if (ctx == NULL)
            continue;
        clattn_sdpa_desc desc;
        pb_sdpa_desc(&p, &desc);
        clattn_plan *plan = NULL;
        clattn_tensors bound;
        if (!tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS,
                              "create") ||
            pb_sdpa_upload(ctx, &p, &bound) != CL_SUCCESS) {
            clattn_plan_release(plan);
            continue;
        }
        /* the pools with their NaN pages after, the counts as given, the table with garbage */
        clReleaseMemObject(bound.k.mem);
        clReleaseMemObject(bound.v.mem);
        bound.k.mem = paged_pool(&p, 0, table, kept);
        bound.v.mem = paged_pool(&p, 1, table, kept);
        bound.k.offset = bound.v.offset = 0;
        float counts[B];
        for (size_t b = 0; b < B; ++b)
            counts[b] = (float)c->kv_len[b];
        cl_int err = pb_rewrite(ctx, NULL, &bound.kv_seqlen, counts);
        if (err == CL_SUCCESS)
            err = clEnqueueWriteBuffer(clattn_ctx_queue(ctx), bound.block_table.mem, CL_TRUE,
                                       bound.block_table.offset * sizeof(int32_t),
                                       B * blocks * sizeof(int32_t), table, 0, NULL, NULL);
        if (tu_expect(err == CL_SUCCESS, "writing the counts and the table: %d", (int)err)) {
            for (int run = 0; run < 2; ++run) { /* twice: the scratch is reused */
                if (run == 1)
                    pb_sdpa_poison(ctx, NULL, &bound);
                if (tu_expect_status(clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT,
                                                         NULL, NULL, 0, NULL, NULL),
                                     CLATTN_SUCCESS, which ? "execute (decode splits)" : "execute"))
                    pb_sdpa_check(ctx, NULL, &p, &bound);
            }
        }
        pb_release_tensors(&bound);
        clattn_plan_release(plan);
    }
    free(table);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* Generation with a KV cache: 64 steps of one token each (grouped heads, causal, soft-capping,
 * a sliding window of 16 keys, smaller than the cache), through one SDPA plan made once from
 * the cache's tensors (capacity, kv_seqlen), must match the full causal forward of the same
 * sequence and the float64 reference; the cache then refuses a 65th key. Case 1 runs on the
 * context that splits keys from 16 (decode_keys=16), one head: the decode splits where the
 * kernel's key tiles are under the cache's 64 keys (GPU parameters; flash_cpu.cl's 64-key
 * tiles take the cache whole, so test_decode_splits runs sinks through the splits there).
 * Case 2 keeps the cache in F16 (compared with the F16-rounded reference). Case 3 has no
 * window: each step's 4 query heads per k/v head run as the rows of that head. Cases 1 and
 * 3 add attention sinks (one head's -inf): joined in flash_merge after any decode splits, and
 * per row of a grouped step. */
START_TEST(test_generation)
{
    TU_BEGIN_TEST();
    enum { STEPS = 64, D = 64 };
    /* case 3: no window, so a step's query heads of a group run as rows of their k/v head */
    const long long WINDOW = _i == 3 ? -1 : 16;
    const size_t batch = _i == 1 ? 1 : 2, heads = _i == 1 ? 1 : 8, kv_heads = _i == 1 ? 1 : 2;
    const clattn_dtype cache_dtype = _i == 2 ? CLATTN_DTYPE_F16 : CLATTN_DTYPE_F32;
    const float softcap = 3.0f;
    const int with_sinks = _i % 2 == 1;
    tu_set_case("generation: B=%zu Hq=%zu Hkv=%zu steps=%d d=%d window=%lld softcap=%g cache=%s "
                "sinks=%d",
                batch, heads, kv_heads, STEPS, D, WINDOW, (double)softcap,
                cache_dtype == CLATTN_DTYPE_F16 ? "F16" : "F32", with_sinks);
    if (_i == 1 && decode_ctx == NULL)
        decode_ctx = ctx_with_row("any | * | * | decode_keys=16");
    clattn_ctx *ctx = _i == 1 ? decode_ctx : tu_ctx();
    if (ctx == NULL) {
        TU_END_TEST();
        return;
    }
    const size_t q_count = batch * heads * STEPS * D, kv_count = batch * kv_heads * STEPS * D;
    float *q = tu_random_floats(q_count), *k = tu_random_floats(kv_count);
    float *v = tu_random_floats(kv_count);
    for (size_t i = 0; i < q_count; ++i)
        q[i] *= 3.0f;
    cl_int err = CL_SUCCESS;
    cl_context cl = clattn_ctx_cl_context(ctx);
    cl_mem q_mem = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                  q_count * sizeof(float), q, &err);
    cl_mem k_mem = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                  kv_count * sizeof(float), k, &err);
    cl_mem v_mem = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                  kv_count * sizeof(float), v, &err);
    float sinks[8];
    for (size_t h = 0; h < heads; ++h)
        sinks[h] = (float)(-1.0 + 4.0 * tu_rand_unit());
    if (heads > 1)
        sinks[heads - 1] = -INFINITY; /* no sink for the last head */
    cl_mem sinks_mem = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                      heads * sizeof(float), sinks, &err);
    float *nan = tu_nan_floats(q_count);
    cl_mem full_mem = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                     q_count * sizeof(float), nan, &err);
    cl_mem step_mem = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                     q_count * sizeof(float), nan, &err);
    tu_expect(err == CL_SUCCESS, "clCreateBuffer: %d", (int)err);

    /* The full forward: every position at once, causal (square: any alignment), the window. */
    clattn_sdpa_desc full;
    clattn_sdpa_desc_init(&full);
    clattn_tensors full_tensors = {0};
    CLATTN_BIND_ROLES(full, full_tensors);
    full_tensors.q = clattn_tensor_make(q_mem, 0, CLATTN_DTYPE_F32, 4, batch, heads, STEPS, D);
    full_tensors.k = clattn_tensor_make(k_mem, 0, CLATTN_DTYPE_F32, 4, batch, kv_heads, STEPS, D);
    full_tensors.v = clattn_tensor_make(v_mem, 0, CLATTN_DTYPE_F32, 4, batch, kv_heads, STEPS, D);
    full_tensors.out = clattn_tensor_make(full_mem, 0, CLATTN_DTYPE_F32, 4, batch, heads, STEPS, D);
    full.causal = CLATTN_CAUSAL_TOP_LEFT;
    full.window_align = CLATTN_CAUSAL_TOP_LEFT;
    full.window_left = WINDOW;
    full.window_right = -1;
    full.softcap = softcap;
    if (with_sinks)
        full_tensors.sinks = clattn_tensor_make(sinks_mem, 0, CLATTN_DTYPE_F32, 1, heads, 0, 0, 0);
    clattn_plan *plan = NULL;
    if (tu_expect_status(clattn_sdpa_plan_create(ctx, &full, &plan), CLATTN_SUCCESS, "full"))
        tu_expect_status(clattn_plan_execute(plan, full_tensors.by_role, CLATTN_ROLE_COUNT, NULL,
                                             NULL, 0, NULL, NULL),
                         CLATTN_SUCCESS, "full forward");
    clattn_plan_release(plan);
    plan = NULL;

    /* Decoding: one plan for one query row against the cache's capacity. */
    clattn_kv_cache_desc cd;
    clattn_kv_cache_desc_init(&cd);
    cd.batch = batch, cd.kv_heads = kv_heads, cd.capacity = STEPS;
    cd.head_dim_qk = D, cd.head_dim_v = D, cd.dtype = cache_dtype;
    clattn_kv_cache *cache = NULL;
    tu_expect_status(clattn_kv_cache_create(ctx, &cd, &cache), CLATTN_SUCCESS, "cache");
    clattn_sdpa_desc dec;
    clattn_sdpa_desc_init(&dec);
    clattn_tensors dec_tensors = {0};
    CLATTN_BIND_ROLES(dec, dec_tensors);
    clattn_tensors *t = &dec_tensors;
    /* row `step` of q and of the output: views of the (B, H, STEPS, D) buffers */
    t->q = clattn_tensor_make(q_mem, 0, CLATTN_DTYPE_F32, 4, batch, heads, 1, D);
    t->out = clattn_tensor_make(step_mem, 0, CLATTN_DTYPE_F32, 4, batch, heads, 1, D);
    const size_t row_strides[4] = {heads * STEPS * D, STEPS * D, D, 1};
    memcpy(t->q.strides, row_strides, sizeof row_strides);
    memcpy(t->out.strides, row_strides, sizeof row_strides);
    clattn_kv_cache_tensors(cache, &t->k, &t->v, &t->kv_seqlen);
    dec.causal = CLATTN_CAUSAL_BOTTOM_RIGHT; /* the new row is the last of the cache */
    dec.window_align = CLATTN_CAUSAL_BOTTOM_RIGHT;
    dec.window_left = WINDOW;
    dec.window_right = -1;
    dec.softcap = softcap;
    if (with_sinks)
        t->sinks = full_tensors.sinks;
    if (cache != NULL &&
        tu_expect_status(clattn_sdpa_plan_create(ctx, &dec, &plan), CLATTN_SUCCESS, "decode")) {
        const size_t kv_strides[4] = {kv_heads * STEPS * D, STEPS * D, D, 1};
        for (size_t step = 0; step < STEPS; ++step) {
            clattn_tensor k_new =
                clattn_tensor_make(k_mem, step * D, CLATTN_DTYPE_F32, 4, batch, kv_heads, 1, D);
            clattn_tensor v_new =
                clattn_tensor_make(v_mem, step * D, CLATTN_DTYPE_F32, 4, batch, kv_heads, 1, D);
            memcpy(k_new.strides, kv_strides, sizeof kv_strides);
            memcpy(v_new.strides, kv_strides, sizeof kv_strides);
            if (!tu_expect_status(clattn_kv_cache_append(cache, &k_new, &v_new, 0, NULL, NULL),
                                  CLATTN_SUCCESS, "append"))
                break;
            clattn_tensors bound = dec_tensors;
            bound.q.offset = step * D;
            bound.out.offset = step * D;
            if (!tu_expect_status(clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL,
                                                      NULL, 0, NULL, NULL),
                                  CLATTN_SUCCESS, "decode step"))
                break;
        }
        tu_expect(clattn_kv_cache_length(cache) == STEPS, "the cache holds %zu keys, not %d",
                  clattn_kv_cache_length(cache), STEPS);
        /* Full: a 65th key is refused and changes nothing. */
        clattn_tensor one =
            clattn_tensor_make(k_mem, 0, CLATTN_DTYPE_F32, 4, batch, kv_heads, 1, D);
        memcpy(one.strides, kv_strides, sizeof kv_strides);
        const clattn_status over = clattn_kv_cache_append(cache, &one, &one, 0, NULL, NULL);
        tu_expect(over == CLATTN_ERR_INVALID_SHAPE && strstr(clattn_last_error(ctx), "capacity") &&
                      clattn_kv_cache_length(cache) == STEPS,
                  "append past the capacity: %s (%d): %s", clattn_status_string(over), (int)over,
                  clattn_last_error(ctx));
    }
    clattn_plan_release(plan);
    clattn_finish(ctx);
    float *full_out = tu_nan_floats(q_count), *step_out = tu_nan_floats(q_count);
    clEnqueueReadBuffer(clattn_ctx_queue(ctx), full_mem, CL_TRUE, 0, q_count * sizeof(float),
                        full_out, 0, NULL, NULL);
    clEnqueueReadBuffer(clattn_ctx_queue(ctx), step_mem, CL_TRUE, 0, q_count * sizeof(float),
                        step_out, 0, NULL, NULL);
    /* The reference: the full causal forward (k and v rounded as the cache stores them for
     * the steps; the full forward read them unrounded). */
    ref_sdpa_shape shape = ref_softmax_shape(batch, heads, STEPS, STEPS, D, D);
    shape.causal = CLATTN_CAUSAL_TOP_LEFT, shape.kv_heads = kv_heads, shape.softcap = softcap;
    shape.window_align = CLATTN_CAUSAL_TOP_LEFT, shape.window_left = WINDOW;
    shape.window_right = -1, shape.sinks = with_sinks ? sinks : NULL;
    double *ref = tu_doubles(q_count);
    ref_sdpa(&shape, q, k, v, NULL, NULL, ref, NULL, NULL);
    tu_expect_close("full forward", full_out, ref, q_count, TU_TOL);
    if (cache_dtype == CLATTN_DTYPE_F16) {
        pb_round_array(CLATTN_DTYPE_F16, k, kv_count);
        pb_round_array(CLATTN_DTYPE_F16, v, kv_count);
        ref_sdpa(&shape, q, k, v, NULL, NULL, ref, NULL, NULL);
    }
    tu_expect_close("64 decode steps", step_out, ref, q_count, TU_TOL);
    if (cache_dtype == CLATTN_DTYPE_F32) {
        double *full64 = tu_doubles(q_count);
        tu_floats_to_doubles(full_out, q_count, full64);
        tu_expect_close("decode steps vs the full forward", step_out, full64, q_count, TU_TOL);
        free(full64);
    }
    free(ref);
    free(step_out);
    free(full_out);
    clattn_kv_cache_release(cache);
    tu_release_mem(q_mem), tu_release_mem(k_mem), tu_release_mem(v_mem);
    tu_release_mem(full_mem), tu_release_mem(step_mem), tu_release_mem(sinks_mem);
    free(nan), free(v), free(k), free(q);
    TU_END_TEST();
}
END_TEST

/* Sizes for the CPU kernel (flash_cpu.cl: 6-row blocks, 8 blocks a group, 64-key tiles, V
 * rows padded to 16 floats), run with the default tuning rows: rows and keys 1 short of, at
 * and 1 past the block and tile edges, Lq != Lk both ways, head sizes that are not multiples
 * of 16 (d_k != d_v). */
typedef struct cpu_size {
    size_t seq_q, seq_k, dk, dv;
} cpu_size;

/* clang-format off */
static const cpu_size cpu_sizes[] = {
    /*  Lq   Lk   dk   dv */
    {   1,   1,   1,   1},
    {   3,   3,   3,  17},
    {  17,  17,  17,   3},
    {  63,  65,  64,  64},
    {  65,  63,  80,  80},
    { 127, 129, 128, 128},
    { 129, 127,  64,  80},
    {   1, 129, 256, 256},
    { 129,   1,  17,  64},
    {  49, 200,  64,  17},
    {   3,  64, 256,  64},
    {  64,   3,  80, 256},
};
/* clang-format on */
#define CPU_SIZES (sizeof cpu_sizes / sizeof cpu_sizes[0])

/* The contexts of test_flash_cpu_variants (flash_cpu_kv = 1, 2, 4), made on first use and
 * released after the test case (they use the suite's queue). */
static clattn_ctx *kv_ctxs[3];
static size_t kv_ctx_checked[3]; /* entries of each one's validation log checked so far */

static void release_kv_ctxs(void)
{
    for (size_t i = 0; i < 3; ++i) {
        clattn_ctx_release(kv_ctxs[i]);
        kv_ctxs[i] = NULL;
        kv_ctx_checked[i] = 0;
    }
}

/* Every variant switch of the CPU kernel (causal alignment, mask dtype and broadcast, key
 * padding, relu, fully masked rows, dtypes, strided layouts, lse) on every size: case
 * _i = variant * CPU_SIZES + size, the variant's switches fixed, the size's awkward. The
 * reference alone (no unfused run: strided layouts are fused-only). Each case also takes one
 * of the register-block widths (flash_cpu_kv = 1, 2, 4: AVX2's, between, AVX-512's) by
 * (variant / 3 + size / 3) % 3, so every variant and every size meets all three, in the CI
 * tier's third of the cases as well (see main); the width 2 with a tile's blocks taken one
 * after the other (flash_cpu_tp=0), the others in two passes (the default). */
START_TEST(test_flash_cpu_variants)
{
    TU_BEGIN_TEST();
    const cpu_size *z = &cpu_sizes[(size_t)_i % CPU_SIZES];
    const int variant = _i / (int)CPU_SIZES;
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = 1 + (size_t)(_i % 2);
    spec.heads = 1 + (size_t)(_i % 3);
    spec.seq_q = z->seq_q;
    spec.seq_k = z->seq_k;
    spec.dk = z->dk;
    spec.dv = z->dv;
    spec.path = CLATTN_PATH_FUSED;
    spec.want_lse = variant != 0;
    spec.q_gain = 3.0f;
    switch (variant) {
    case 0: /* plain */
        break;
    case 1: /* causal top-left, F16 storage, strided last dims */
        spec.causal = CLATTN_CAUSAL_TOP_LEFT;
        spec.q_dtype = spec.k_dtype = spec.v_dtype = spec.out_dtype = CLATTN_DTYPE_F16;
        spec.q_layout = spec.v_layout = PB_STRIDED_LAST;
        spec.k_layout = PB_SEQ_MAJOR_PADDED;
        break;
    case 2: /* causal bottom-right with key padding, BF16 k and out, soft-capping, ALiBi */
        spec.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        spec.alibi = 2;
        spec.softcap = 1.5f;
        spec.padding = 1;
        spec.k_dtype = spec.out_dtype = CLATTN_DTYPE_BF16;
        spec.out_layout = PB_STRIDED_LAST;
        break;
    case 3: /* key padding, every key of batch 0 padded */
        spec.padding = 1;
        spec.fully_masked = 1;
        spec.k_layout = PB_STRIDED_LAST;
        break;
    case 4: /* float mask (F16) broadcast over batch and heads, row 0 fully masked, capped */
        spec.softcap = 0.8f;
        spec.mask = PB_MASK_FLOAT;
        spec.mask_dtype = CLATTN_DTYPE_F16;
        spec.mask_rank = 4;
        spec.mask_ones = PB_MASK_ONES_B | PB_MASK_ONES_H;
        spec.fully_masked = 2;
        break;
    case 5: /* bool mask of zero strides, causal top-left, padding, ALiBi per head */
        spec.alibi = 1;
        spec.mask = PB_MASK_BOOL;
        spec.mask_rank = 4;
        spec.mask_ones = PB_MASK_ONES_H;
        spec.mask_zero_strides = 1;
        spec.causal = CLATTN_CAUSAL_TOP_LEFT;
        spec.padding = 1;
        break;
    case 6: /* BF16 mask broadcast along the rows, bottom-right causal */
        spec.mask = PB_MASK_FLOAT;
        spec.mask_dtype = CLATTN_DTYPE_BF16;
        spec.mask_rank = 1;
        spec.mask_layout = PB_PADDED;
        spec.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        break;
    case 7: /* relu */
        spec.norm = CLATTN_NORM_RELU;
        spec.scale = 0.5f;
        break;
    default: /* relu with causal, padding and an F32 mask, capped */
        spec.norm = CLATTN_NORM_RELU;
        spec.softcap = 2.5f;
        spec.causal = CLATTN_CAUSAL_TOP_LEFT;
        spec.padding = 1;
        spec.mask = PB_MASK_FLOAT;
        break;
    }
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    const size_t which = ((size_t)variant / 3 + (size_t)_i % CPU_SIZES / 3) % 3;
    const unsigned kv = 1u << which; /* 1, 2, 4 */
    /* Only where the device runs flash_cpu.cl: elsewhere (GPU parameters, the default row,
     * llvmpipe's quirk) the key changes nothing, and each extra context would compile every
     * variant again (Mesa's compiler: minutes). */
    const int cpu_kernel = strstr(clattn_ctx_tuning(tu_ctx()), " flash_cpu=1") != NULL;
    tu_set_case("CPU variant %d, flash_cpu_kv=%u: %s", variant, cpu_kernel ? kv : 0u, p.label);
    if (!cpu_kernel) {
        float *got = tu_nan_floats(p.out_count);
        run_path(&p, CLATTN_PATH_FUSED, spec.want_lse, got);
        free(got);
        pb_sdpa_free(&p);
        TU_END_TEST();
        return;
    }
    if (kv_ctxs[which] == NULL) {
        char row[64]; /* (flash_cpu_kv=2's context takes its tiles block by block) */
        snprintf(row, sizeof row, "any | * | * | flash_cpu_kv=%u flash_cpu_tp=%u", kv,
                 which == 1 ? 0u : 1u);
        kv_ctxs[which] = ctx_with_row(row);
    }
    float *got = tu_nan_floats(p.out_count);
    if (kv_ctxs[which] != NULL) {
        run_path_on(kv_ctxs[which], &p, CLATTN_PATH_FUSED, spec.want_lse, got);
        /* the numbers must be flash_cpu's own: a variant that self-validation turned down
         * (its probe failed, flash.cl ran instead) fails the case */
        tu_expect_trusted(kv_ctxs[which], &kv_ctx_checked[which]);
    }
    free(got);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST
#define CPU_VARIANTS 9

/* Tuning records (rows with @selectors, host/core/tuning.c): a context whose rows send head
 * size 24 to flash.cl with 4-row groups, and its one-row (decode) problems also to scalar
 * lanes; other head sizes keep the context's row. Each plan says which records chose its
 * kernel (clattn_plan_info) and its output is checked against the float64 reference. */
static const char records_rows[] =
    "any | * | * | @head_dim=24 flash_cpu=0 flash_gpu=0 flash_rows=4 flash_vw=8\n"
    "any | * | * | @head_dim=24 @phase=decode flash_vw=1\n"
    "any | * | * | @dtype=bf16 @phase=decode @head_dim=24 flash_rows=2\n";
static const struct {
    size_t seq_q, seq_k, dk;
    const char *want[3]; /* in clattn_plan_info; NULL: none */
    const char *refuse;  /* not in it */
} record_cases[] = {
    {17, 33, 24, {"flash.cl (4 rows", "8-float vectors", "prefill phase"}, "line 2"},
    {1, 65, 24, {"flash.cl (4 rows", "1-float vectors", "line 1 (@head_dim=24); tuning_rows line 2"}, "line 3"},
    {3, 29, 16, {"tuning records: none", NULL, NULL}, "tuning_rows"},
    {1, 29, 16, {"decode phase", "tuning records: none", NULL}, "tuning_rows"},
};

static clattn_ctx *records_ctx; /* one context for the cases (each compiles its variants) */

static void release_records_ctx(void)
{
    clattn_ctx_release(records_ctx);
    records_ctx = NULL;
}

START_TEST(test_tuning_records)
{
    TU_BEGIN_TEST();
    if (records_ctx == NULL)
        records_ctx = ctx_with_row(records_rows);
    clattn_ctx *ctx = records_ctx;
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = 2, spec.heads = 3, spec.kv_heads = 3;
    spec.seq_q = record_cases[_i].seq_q, spec.seq_k = record_cases[_i].seq_k;
    spec.dk = spec.dv = record_cases[_i].dk;
    spec.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    spec.path = CLATTN_PATH_FUSED;
    spec.q_gain = 3.0f;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("tuning records: %s", p.label);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_plan *plan = NULL;
    if (ctx != NULL && tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan),
                                        CLATTN_SUCCESS, "create")) {
        const char *info = clattn_plan_info(plan);
        for (int i = 0; i < 3; ++i)
            tu_expect(record_cases[_i].want[i] == NULL || strstr(info, record_cases[_i].want[i]),
                      "plan info lacks '%s': %s", record_cases[_i].want[i], info);
        tu_expect(strstr(info, record_cases[_i].refuse) == NULL, "plan info has '%s': %s",
                  record_cases[_i].refuse, info);
        float *got = tu_nan_floats(p.out_count);
        run_path_on(ctx, &p, CLATTN_PATH_FUSED, 0, got);
        free(got);
    }
    clattn_plan_release(plan);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* Rows with selectors that the parser refuses, each naming its line and what is wrong. */
START_TEST(test_tuning_record_errors)
{
    TU_BEGIN_TEST();
    /* given: the tuning row */
    static const tu_needle bad_rows[] = {
        {"any | * | * | @head_dim=64 tile_m=32", "tile_m is one value per context"},
        {"any | * | * | @head_dim=0 flash_rows=4", "'@head_dim=0' is not a selector"},
        {"any | * | * | @dtype=f64 flash_rows=4", "'@dtype=f64' is not a selector"},
        {"any | * | * | @phase=later flash_rows=4", "'@phase=later' is not a selector"},
        {"any | * | * | @batch=2 flash_rows=4", "'@batch=2' is not a selector"},
        {"any | * | * | @head_dim=8 flash_cpu_rb=9", "flash_cpu_rb=9, outside the kernels' 1 .. 8"},
    };
    for (size_t i = 0; i < sizeof bad_rows / sizeof bad_rows[0]; ++i) {
        tu_set_case("record row '%s'", bad_rows[i].given);
        clattn_ctx_desc desc;
        clattn_ctx_desc_init(&desc);
        desc.queue = clattn_ctx_queue(tu_ctx());
        desc.tuning_rows = bad_rows[i].given;
        clattn_ctx *ctx = NULL;
        char message[512] = "";
        const clattn_status status = clattn_ctx_create_desc(&desc, &ctx, message, sizeof message);
        tu_expect(status != CLATTN_SUCCESS && ctx == NULL, "accepted: %s", bad_rows[i].given);
        tu_expect(strstr(message, bad_rows[i].needle) && strstr(message, "tuning_rows line 1"),
                  "message '%s' lacks '%s' or the line", message, bad_rows[i].needle);
        clattn_ctx_release(ctx);
    }
    TU_END_TEST();
}
END_TEST

/* clang-format off */
static const flash_case large_cases[] = {
    /* batch heads  Lq   Lk   dk   dv  causal mask pad relu full scale kv_heads softcap */
    {1, 2,  70, 200,  64,  64, 0, 0, 0, 0, 0, 4.0f, 0, 0},
    {2, 1, 129,  97,  64,  32, 1, 0, 1, 0, 0, 4.0f, 0, 0},
    {1, 1,  17, 300,   7,   5, 0, 1, 0, 0, 0, 8.0f, 0, 0},
    {1, 3,  65,  65,  16,  16, 1, 1, 0, 0, 0, 2.0f, 0, 0},
};
/* clang-format on */

/* Scores of several hundred, far past float's exp overflow (88.7), rising and falling from
 * key tile to key tile: the online softmax must subtract its running max and rescale when it
 * grows. Small-integer inputs and a power-of-two scale make every score exact in float32, so
 * the float64 reference stays within the usual tolerance. */
START_TEST(test_flash_large_scores)
{
    TU_BEGIN_TEST();
    const flash_case *c = &large_cases[_i];
    describe_case("large scores: ", c);
    pb_sdpa_problem p;
    make_problem(&p, c, 1);
    for (size_t i = 0; i < p.q_count; ++i)
        p.q[i] = (float)((int)tu_rand_below(7) - 3);
    for (size_t i = 0; i < p.k_count; ++i)
        p.k[i] = (float)((int)tu_rand_below(7) - 3);
    /* A few keys per row far above the rest, at random places, so the running max jumps. */
    for (size_t i = 0; i < p.k_count / c->dk; i += 1 + tu_rand_below(40))
        for (size_t x = 0; x < c->dk; ++x)
            p.k[i * c->dk + x] *= 4.0f;
    pb_sdpa_reference(&p);
    check_fused_case(&p);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* flash_gpu.cl's matrix-engine variant (FG_DPAS: cl_intel_subgroup_matrix_multiply_accumulate's
 * layouts) through its emulation in plain OpenCL C (fg_dpas=2), on a context that sends
 * every problem to flash_gpu: sub-groups of 8 and 16, f16 and bf16 q/k/v, awkward row and key
 * counts (Lq != Lk), head sizes 16-128 (d_v not a multiple of the sub-group), GQA, causal,
 * a float mask, key padding, sinks, the lse; each checked against the float64 reference
 * (the weights' rounding to 16 bits is inside the 16-bit output's tolerance), the output
 * poisoned before the second run. The plan must say it runs the emulated matrix engine, and
 * where the variant does not apply (d_k not a multiple of 16, f32 inputs) that it does not. */
typedef struct dpas_case {
    unsigned sg;
    clattn_dtype dtype;
    size_t batch, heads, kv_heads, seq_q, seq_k, dk, dv;
    clattn_causal causal;
    int mask, padding, sinks, lse;
    int applies; /* 0: the plan must not take the matrix engine */
} dpas_case;

static const dpas_case dpas_cases[] = {
    {8, CLATTN_DTYPE_F16, 1, 2, 0, 17, 17, 64, 64, CLATTN_CAUSAL_NONE, 0, 0, 0, 1, 1},
    {16, CLATTN_DTYPE_F16, 1, 4, 2, 63, 129, 64, 64, CLATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 1, 1},
    {8, CLATTN_DTYPE_BF16, 2, 1, 0, 65, 3, 128, 128, CLATTN_CAUSAL_NONE, 0, 1, 0, 0, 1},
    {16, CLATTN_DTYPE_BF16, 1, 2, 0, 1, 127, 32, 48, CLATTN_CAUSAL_NONE, 1, 0, 1, 1, 1},
    {8, CLATTN_DTYPE_F16, 1, 3, 0, 129, 65, 16, 8, CLATTN_CAUSAL_TOP_LEFT, 0, 0, 0, 0, 1},
    {16, CLATTN_DTYPE_F16, 1, 1, 0, 3, 31, 80, 24, CLATTN_CAUSAL_NONE, 1, 1, 0, 1, 1},
    {8, CLATTN_DTYPE_F16, 1, 1, 0, 9, 33, 24, 24, CLATTN_CAUSAL_NONE, 0, 0, 0, 0, 0},
    {8, CLATTN_DTYPE_F32, 1, 1, 0, 9, 33, 64, 64, CLATTN_CAUSAL_NONE, 0, 0, 0, 0, 0},
};

static clattn_ctx *dpas_ctx[2]; /* sub-groups of 8, of 16 */

static void release_dpas_ctxs(void)
{
    for (int i = 0; i < 2; ++i) {
        clattn_ctx_release(dpas_ctx[i]);
        dpas_ctx[i] = NULL;
    }
}

START_TEST(test_flash_dpas_emulated)
{
    TU_BEGIN_TEST();
    const dpas_case *c = &dpas_cases[_i];
    const int which = c->sg == 16;
    if (dpas_ctx[which] == NULL)
        dpas_ctx[which] = ctx_with_row(which ? "any | * | * | flash_cpu=0 flash_gpu=1 fg_dpas=2 "
                                               "fg_dpas_sg=16"
                                             : "any | * | * | flash_cpu=0 flash_gpu=1 fg_dpas=2 "
                                               "fg_dpas_sg=8");
    clattn_ctx *ctx = dpas_ctx[which];
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = c->batch, spec.heads = c->heads, spec.kv_heads = c->kv_heads;
    spec.seq_q = c->seq_q, spec.seq_k = c->seq_k, spec.dk = c->dk, spec.dv = c->dv;
    spec.q_dtype = spec.k_dtype = spec.v_dtype = spec.out_dtype = c->dtype;
    spec.causal = c->causal;
    spec.mask = c->mask ? PB_MASK_FLOAT : PB_MASK_NONE;
    spec.padding = c->padding;
    spec.sinks = c->sinks;
    spec.want_lse = c->lse;
    spec.path = CLATTN_PATH_FUSED;
    spec.q_gain = 2.0f;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("matrix engine emulated, sub-groups of %u: %s", c->sg, p.label);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_plan *plan = NULL;
    if (ctx != NULL && tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan),
                                        CLATTN_SUCCESS, "create")) {
        const char *info = clattn_plan_info(plan);
        const int dpas = strstr(info, "matrix engine emulated (DPAS)") != NULL;
        tu_expect(dpas == c->applies, "the plan %s the emulated matrix engine: %s",
                  dpas ? "takes" : "does not take", info);
        execute_twice_checked(ctx, plan, &p);
    }
    clattn_plan_release(plan);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* A NaN in a key reaches exactly the rows that see that key, as in PyTorch: its score is NaN,
 * so are those rows' weights and outputs, while a row that masks the key writes -inf over the
 * NaN score and comes out as without it. Guards the softmax's max and exp (flash_cpu.cl takes
 * a row's max with a compare that may drop a NaN; exp16_nonpositive carries NaN through) and
 * the row's close (a NaN sum: NaN lse and output, which a split's resume and flash_merge pass
 * on). Key 37 of head 1 (element 5), causal, 70 rows (two 64-key tiles), both paths; head 0
 * and the rows before 37 must match the run without the NaN, checked against float64. Cases
 * 4 and 5: one row over the 70 keys on the decode-split context (decode_keys=16), the NaN in
 * head 1's query (every split's part NaN), where the splits meet in flash_merge (it splits
 * where B * H = 2 is under twice the compute units: not on Oclgrind, which runs case 0). */
START_TEST(test_flash_nan_key)
{
    TU_BEGIN_TEST();
    enum { H = 2, L = 70, NAN_KEY = 37 };
    const size_t d = _i % 2 ? 128 : 64;
    const clattn_path path = _i < 2 || _i >= 4 ? CLATTN_PATH_FUSED : CLATTN_PATH_UNFUSED;
    /* cases 4, 5: one query row over all L keys on the context that splits keys from 16, so
     * each split's close and flash_merge's max must keep the NaN */
    const int decode = _i >= 4;
    const size_t lq = decode ? 1 : L, n = H * L * d, n_out = H * lq * d;
    if (decode && decode_ctx == NULL)
        decode_ctx = ctx_with_row("any | * | * | decode_keys=16");
    clattn_ctx *ctx = decode ? decode_ctx : tu_ctx();
    float *q = malloc(n * sizeof *q), *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
    float *clean = malloc(n * sizeof *clean), *out = malloc(n * sizeof *out);
    double *ref = malloc(n * sizeof *ref);
    ck_assert(q && k && v && clean && out && ref);
    for (size_t i = 0; i < n; ++i) {
        q[i] = (float)(2.0 * tu_rand_unit() - 1.0);
        k[i] = (float)(2.0 * tu_rand_unit() - 1.0);
        v[i] = (float)(2.0 * tu_rand_unit() - 1.0);
    }
    tu_set_case("NaN in %s of head 1: H=%d Lq=%zu Lk=%d d=%zu %s, %s path",
                decode ? "the query" : "key 37", H, lq, L, d,
                decode ? "no mask, keys split" : "causal",
                path == CLATTN_PATH_FUSED ? "fused" : "unfused");
    clattn_attention_host_desc desc;
    clattn_attention_host_desc_init(&desc);
    desc.batch = 1, desc.heads = H, desc.seq_q = lq, desc.seq_k = L;
    desc.head_dim_qk = desc.head_dim_v = d;
    desc.causal = decode ? CLATTN_CAUSAL_NONE : CLATTN_CAUSAL_TOP_LEFT;
    desc.path = path;
    for (size_t i = 0; i < n; ++i)
        clean[i] = out[i] = NAN;
    if (ctx != NULL &&
        tu_expect_status(clattn_attention_host(ctx, &desc, q, k, v, NULL, clean, NULL),
                         CLATTN_SUCCESS, "clean run")) {
        /* the clean run against float64 (softmax(q k^T / sqrt(d)) v per head; row i sees
         * keys 0 .. i when causal, all L in the one-row cases) */
        double worst = 0.0;
        for (size_t h = 0; h < H; ++h) {
            for (size_t i = 0; i < lq; ++i) {
                double w[L], mx = -INFINITY, sum = 0.0;
                const size_t last = decode ? L - 1 : i;
                for (size_t j = 0; j <= last; ++j) {
                    double dot = 0.0;
                    for (size_t x = 0; x < d; ++x)
                        dot += (double)q[(h * lq + i) * d + x] * k[(h * L + j) * d + x];
                    w[j] = dot / sqrt((double)d);
                    mx = w[j] > mx ? w[j] : mx;
                }
                for (size_t j = 0; j <= last; ++j)
                    sum += (w[j] = exp(w[j] - mx));
                for (size_t x = 0; x < d; ++x) {
                    double o = 0.0;
                    for (size_t j = 0; j <= last; ++j)
                        o += w[j] / sum * v[(h * L + j) * d + x];
                    const size_t at = (h * lq + i) * d + x;
                    ref[at] = o;
                    const double err = fabs(clean[at] - o) / (1e-3 + fabs(o));
                    if (!(err <= worst)) /* (NaN included) */
                        worst = isnan(err) ? INFINITY : err;
                }
            }
        }
        tu_track_error(worst);
        tu_expect(worst < 1e-4, "clean run: worst relative error %g against float64", worst);
        if (decode) /* every split's row NaN: flash_merge's max must not skip them all */
            q[lq * d + 5] = NAN;
        else
            k[(L + NAN_KEY) * d + 5] = NAN;
        if (tu_expect_status(clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL),
                             CLATTN_SUCCESS, "run with a NaN key")) {
            size_t wrong = 0, first = n_out;
            for (size_t i = 0; i < n_out; ++i) {
                const size_t h = i / (lq * d), row = i / d % lq;
                const int want_nan = h == 1 && (decode || row >= NAN_KEY);
                const int ok = want_nan ? isnan(out[i]) : out[i] == clean[i];
                if (!ok && wrong++ == 0)
                    first = i;
            }
            tu_expect(wrong == 0,
                      "%zu outputs wrong (first: head %zu row %zu col %zu = %g, want %s)", wrong,
                      first / (lq * d), first / d % lq, first % d, (double)out[first % n_out],
                      first / (lq * d) == 1 && (decode || first / d % lq >= NAN_KEY)
                          ? "NaN"
                          : "the clean run's");
        }
    }
    free(q), free(k), free(v), free(clean), free(out), free(ref);
    TU_END_TEST();
}
END_TEST

/* batch * heads above 65535: the fused kernel is launched in slices of at most 65535 (a GPU
 * grid limit), each with its own base; every slice must land on its own (batch, head). */
START_TEST(test_flash_many_heads_split)
{
    TU_BEGIN_TEST();
    const flash_case c = {2, 32771, 3, 5, 2, 3, _i, 0, _i, 0, 0, NAN, 0, 0};
    describe_case("launch split: ", &c);
    pb_sdpa_problem p;
    make_problem(&p, &c, 0);
    check_fused_case(&p);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* Creates an SDPA plan from desc and expects `want`, and a message containing `needle`. */
static void expect_plan_error(clattn_ctx *ctx, const clattn_sdpa_desc *desc, clattn_status want,
                              const char *needle, const char *what)
{
    clattn_plan *plan = NULL;
    clattn_status status = clattn_sdpa_plan_create(ctx, desc, &plan);
    tu_expect_status(status, want, what);
    tu_expect(plan == NULL, "%s: a plan was returned with an error", what);
    tu_expect(needle == NULL || strstr(clattn_last_error(ctx), needle) != NULL,
              "%s: message '%s' does not mention '%s'", what, clattn_last_error(ctx), needle);
    clattn_plan_release(plan);
}

/* Path choices that cannot be honoured are refused with a message. */
START_TEST(test_path_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("FUSED with weights, FUSED with head size 600, lse unfused, AUTO with 600");
    clattn_ctx *ctx = tu_ctx();
    const flash_case c = {1, 1, 3, 5, 600, 8, 0, 0, 0, 0, 0, NAN, 0, 0};
    pb_sdpa_problem p;
    make_problem(&p, &c, 0);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_tensors desc_tensors = p.layouts;
    CLATTN_BIND_ROLES(desc, desc_tensors);
    memset(&desc_tensors.lse, 0, sizeof desc_tensors.lse);
    const size_t w_dims[4] = {1, 1, 3, 5};
    pb_make_layout(&desc_tensors.weights, CLATTN_DTYPE_F32, 4, w_dims, PB_PACKED);
    desc.path = CLATTN_PATH_FUSED;
    expect_plan_error(ctx, &desc, CLATTN_ERR_INVALID_ARGUMENT, "path=FUSED", "FUSED with weights");
    memset(&desc_tensors.weights, 0, sizeof desc_tensors.weights);
    expect_plan_error(ctx, &desc, CLATTN_ERR_UNSUPPORTED, "576", "FUSED with head size 600");
    desc_tensors.lse = p.layouts.lse;
    desc.path = CLATTN_PATH_AUTO;
    expect_plan_error(ctx, &desc, CLATTN_ERR_UNSUPPORTED, "lse", "lse, head size 600 (AUTO)");
    desc.path = CLATTN_PATH_UNFUSED;
    expect_plan_error(ctx, &desc, CLATTN_ERR_UNSUPPORTED, "lse", "lse with path UNFUSED");
    desc.path = (clattn_path)7;
    memset(&desc_tensors.lse, 0, sizeof desc_tensors.lse);
    expect_plan_error(ctx, &desc, CLATTN_ERR_INVALID_ARGUMENT, "path", "path=7");
    clattn_plan *plan = NULL;
    tu_expect_status(clattn_sdpa_plan_create(ctx, NULL, &plan), CLATTN_ERR_INVALID_ARGUMENT,
                     "clattn_sdpa_plan_create(desc NULL)");
    tu_expect(clattn_ctx_set_workspace_limit(NULL, 1) == CLATTN_ERR_INVALID_ARGUMENT &&
                  clattn_ctx_workspace_bytes(NULL) == 0,
              "NULL context accepted by the workspace calls");

    /* AUTO falls back to the unfused path, and matches the reference */
    pb_sdpa_problem unfused = p;
    unfused.spec.path = CLATTN_PATH_AUTO;
    unfused.spec.want_lse = 0;
    memset(&unfused.layouts.lse, 0, sizeof unfused.layouts.lse);
    tu_expect_status(pb_sdpa_run(ctx, &unfused, NULL), CLATTN_SUCCESS, "AUTO with head size 600");

    /* lse too small: the plan is made for 3 rows (B*H*Lq), the buffer holds 2 */
    const flash_case small_case = {1, 1, 3, 5, 8, 8, 0, 0, 0, 0, 0, NAN, 0, 0};
    pb_sdpa_problem small;
    make_problem(&small, &small_case, 0);
    pb_sdpa_desc(&small, &desc);
    clattn_status status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    clattn_tensors bound;
    if (tu_expect_status(status, CLATTN_SUCCESS, "plan with lse") &&
        pb_sdpa_upload(ctx, &small, &bound) == CL_SUCCESS) {
        cl_int err = CL_SUCCESS;
        cl_mem tiny = clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_WRITE,
                                     2 * sizeof(float), NULL, &err);
        clattn_tensors with_tiny = bound;
        with_tiny.lse.mem = tiny;
        with_tiny.lse.offset = 0;
        status = clattn_plan_execute(plan, with_tiny.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                     NULL, NULL);
        tu_expect(status == CLATTN_ERR_BUFFER_TOO_SMALL &&
                      strncmp(clattn_last_error(ctx), "sdpa: lse", 9) == 0,
                  "lse too small: %s: %s", clattn_status_string(status), clattn_last_error(ctx));
        if (tiny != NULL)
            clReleaseMemObject(tiny);
        pb_release_tensors(&bound);
    }
    clattn_plan_release(plan);
    pb_sdpa_free(&small);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* A cross-attention MHA problem with PyTorch's packed weights. */
static void make_mha_problem(pb_mha_problem *p, size_t batch, size_t seq_q, size_t seq_k,
                             size_t embed, size_t heads, int causal, clattn_path path)
{
    pb_mha_spec spec;
    pb_mha_spec_init(&spec);
    spec.batch = batch;
    spec.seq_q = seq_q;
    spec.seq_k = seq_k;
    spec.embed_dim = embed;
    spec.num_heads = heads;
    spec.form = PB_PACKED_CROSS;
    spec.in_biases = spec.out_proj = spec.out_bias = 1;
    spec.causal = causal ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
    spec.path = path;
    pb_mha_make(p, &spec);
}

/* MHA forward, fused and unfused, against the reference (host API and plans). */
START_TEST(test_mha_paths)
{
    TU_BEGIN_TEST();
    const int causal = _i;
    tu_set_case("MHA B=2 L=37 S=53 E=48 H=4 causal=%d, FUSED vs UNFUSED vs reference", causal);
    const clattn_path paths[2] = {CLATTN_PATH_FUSED, CLATTN_PATH_UNFUSED};
    for (int path = 0; path < 2; ++path) {
        pb_mha_problem mp;
        make_mha_problem(&mp, 2, 37, 53, 48, 4, causal, paths[path]);
        float *got = tu_nan_floats(mp.out_count);
        clattn_status status = clattn_mha_forward_host(tu_ctx(), &mp.desc, &mp.weights, mp.query,
                                                       mp.key, mp.value, &mp.masks, got, NULL);
        tu_expect_status(status, CLATTN_SUCCESS, path ? "mha UNFUSED" : "mha FUSED");
        if (status == CLATTN_SUCCESS)
            tu_expect_close(path ? "mha UNFUSED" : "mha FUSED", got, mp.out_ref, mp.out_count,
                            TU_TOL);
        if (!tu_small()) /* the plan API as well (a minute more on Oclgrind) */
            tu_expect_status(pb_mha_run(tu_ctx(), &mp, NULL), CLATTN_SUCCESS, "pb_mha_run");
        if (path == 0) {
            clattn_mha_host_desc desc = mp.desc;
            desc.need_weights = CLATTN_WEIGHTS_AVERAGED;
            float *weights = tu_nan_floats(2 * 37 * 53);
            status = clattn_mha_forward_host(tu_ctx(), &desc, &mp.weights, mp.query, mp.key,
                                             mp.value, &mp.masks, got, weights);
            tu_expect_status(status, CLATTN_ERR_INVALID_ARGUMENT, "mha FUSED with need_weights");
            free(weights);
        }
        free(got);
        pb_mha_free(&mp);
    }
    TU_END_TEST();
}
END_TEST

/* MHA with path AUTO and no weights asked for must take the fused path: on a context whose
 * workspace cap is one byte short of the score matrix, UNFUSED is refused naming the scores
 * and AUTO runs, matching the reference. _i: the plan API (0) or the host API (1). */
START_TEST(test_mha_auto_is_fused)
{
    TU_BEGIN_TEST();
    const size_t batch = 2, seq_q = 61, seq_k = 97, e = 32, heads = 4;
    const size_t scores_bytes = batch * heads * seq_q * seq_k * sizeof(float);
    tu_set_case("MHA B=2 Lq=61 Lk=97 E=32 H=4, cap %zu bytes, %s API", scores_bytes - 1,
                _i ? "host" : "plan");
    pb_mha_problem mp;
    make_mha_problem(&mp, batch, seq_q, seq_k, e, heads, 1, CLATTN_PATH_UNFUSED);
    char message[512];
    clattn_ctx *ctx = NULL;
    clattn_status status = clattn_ctx_create(NULL, &ctx, message, sizeof message);
    tu_expect(status == CLATTN_SUCCESS, "context: %s", message);
    float *got = tu_nan_floats(mp.out_count);
    if (ctx) {
        clattn_ctx_set_workspace_limit(ctx, scores_bytes - 1);
        const clattn_path paths[2] = {CLATTN_PATH_UNFUSED, CLATTN_PATH_AUTO};
        for (int p = 0; p < 2; ++p) {
            mp.spec.path = mp.desc.path = paths[p];
            if (_i) {
                status = clattn_mha_forward_host(ctx, &mp.desc, &mp.weights, mp.query, mp.key,
                                                 mp.value, &mp.masks, got, NULL);
            } else if (p == 0) {
                clattn_mha_desc desc;
                pb_mha_desc(&mp, &desc);
                clattn_plan *plan = NULL;
                status = clattn_mha_plan_create(ctx, &desc, &plan);
                clattn_plan_release(plan);
            } else {
                status = pb_mha_run(ctx, &mp, NULL);
            }
            if (p == 0)
                tu_expect(status == CLATTN_ERR_TOO_LARGE && strstr(clattn_last_error(ctx), "scores"),
                          "UNFUSED under the cap: %s: %s", clattn_status_string(status),
                          clattn_last_error(ctx));
            else if (tu_expect(status == CLATTN_SUCCESS, "AUTO under the cap (must be fused): %s: %s",
                               clattn_status_string(status), clattn_last_error(ctx)) && _i)
                tu_expect_close("mha AUTO", got, mp.out_ref, mp.out_count, TU_TOL);
        }
        clattn_ctx_release(ctx);
    }
    free(got);
    pb_mha_free(&mp);
    TU_END_TEST();
}
END_TEST

/* B=1, H=2, L=8192, d=64 under a 64 MiB workspace cap: the unfused path needs 512 MiB of
 * scores and is refused; the fused path runs and is checked on sampled rows. */
START_TEST(test_long_sequence_under_cap)
{
    TU_BEGIN_TEST();
    const size_t seq = 8192, dim = 64, heads = 2, cap = (size_t)64 << 20;
    tu_set_case("B=1 H=2 L=%zu d=%zu causal=%d, workspace cap %zu MiB", seq, dim, _i, cap >> 20);
    const flash_case c = {1, heads, seq, seq, dim, dim, _i, 0, 0, 0, 0, NAN, 0, 0};
    pb_sdpa_problem p;
    make_problem(&p, &c, 1);
    p.spec.want_lse = 0;
    memset(&p.layouts.lse, 0, sizeof p.layouts.lse);
    char message[512];
    clattn_ctx *ctx = NULL;
    clattn_status status = clattn_ctx_create(NULL, &ctx, message, sizeof message);
    tu_expect(status == CLATTN_SUCCESS, "context: %s", message);
    clattn_tensors bound;
    if (ctx && pb_sdpa_upload(ctx, &p, &bound) == CL_SUCCESS) {
        clattn_ctx_set_workspace_limit(ctx, cap);
        clattn_sdpa_desc desc;
        pb_sdpa_desc(&p, &desc);
        desc.path = CLATTN_PATH_UNFUSED;
        clattn_plan *plan = NULL;
        status = clattn_sdpa_plan_create(ctx, &desc, &plan);
        tu_expect(status == CLATTN_ERR_TOO_LARGE && strstr(clattn_last_error(ctx), "scores"),
                  "unfused under the cap: %s: %s", clattn_status_string(status),
                  clattn_last_error(ctx));
        clattn_plan_release(plan);
        plan = NULL;
        desc.path = CLATTN_PATH_AUTO;
        status = clattn_sdpa_plan_create(ctx, &desc, &plan);
        if (status == CLATTN_SUCCESS)
            status = clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                         NULL, NULL);
        tu_expect(status == CLATTN_SUCCESS, "fused under the cap: %s: %s",
                  clattn_status_string(status), clattn_last_error(ctx));
        float *got = tu_floats(p.out_count);
        if (status == CLATTN_SUCCESS && pb_download(ctx, NULL, &bound.out, got, NULL) == CL_SUCCESS) {
            /* 24 sampled rows per head, first and last included, against float64. */
            float *row_mask = tu_floats(seq);
            for (size_t bh = 0; bh < heads; ++bh)
                for (size_t s = 0; s < 24; ++s) {
                    const size_t row = s == 0 ? 0 : s == 23 ? seq - 1 : tu_rand_below(seq);
                    /* One query row; causal as an additive mask on keys past `row`. */
                    ref_sdpa_shape one = ref_softmax_shape(1, 1, 1, seq, dim, dim);
                    for (size_t j = 0; j < seq; ++j)
                        row_mask[j] = c.causal && j > row ? -INFINITY : 0.0f;
                    double want[64];
                    ref_sdpa(&one, p.q + (bh * seq + row) * dim, p.k + bh * seq * dim,
                             p.v + bh * seq * dim, row_mask, NULL, want, NULL, NULL);
                    tu_expect_close("sampled row", got + (bh * seq + row) * dim, want, dim,
                                    TU_TOL);
                }
            free(row_mask);
        }
        free(got);
        clattn_plan_release(plan);
        pb_release_tensors(&bound);
    }
    clattn_ctx_release(ctx);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

int main(void)
{
    tu_suite_begin("check_flash");
    Suite *suite = suite_create("flash");
    TCase *tc = tu_tcase(suite, "fused attention", 900);
    /* A reduced run (CLATTN_TEST_SCALE=small, for Oclgrind) leaves out the cases that take
     * minutes there with GPU parameters; their variants run in the other cases (BLOCK_K=16 of
     * case 6 in case 8; several row blocks and key tiles with every mask in cases 4, 5, 11).
     * Case 16 (one query row of 18 heads at d = 128) took a third of the suite's time there:
     * its unfused path runs the tiled matmul on 1-row products, 63 of each tile's 64 rows
     * padding; the grouped one-row decode runs in test_key_rules case 2 and the 1-row
     * products in cases 0 and 21. */
    static const int heavy_cases[] = {6, 13, 16};
    const int small = tu_small();
    if (small)
        tu_not_run("test_flash_vs_reference_and_unfused cases 6, 13 and 16 (129 x 127 keys at "
                   "d=128, B=2 H=8 Lq=100 Lk=300, 1 x 129 keys at d=128 over 18 heads), "
                   "test_flash_large_scores 0-1 (70 x 200, "
                   "129 x 97), test_flash_many_heads_split (65542 heads: the fused kernel's "
                   "launches past the first 65535 heads do not run), "
                   "test_long_sequence_under_cap (L=8192): minutes to days each on Oclgrind; "
                   "test_mha_paths but the causal case, and through the host API only; the "
                   "UNFUSED run of "
                   "test_flash_vs_reference_and_unfused's odd cases");
    tu_add_loop_except(tc, test_flash_vs_reference_and_unfused, 0,
                       (int)(sizeof cases / sizeof cases[0]), heavy_cases, small ? 3 : 0);
    tcase_add_loop_test(tc, test_flash_large_scores, small ? 2 : 0,
                        (int)(sizeof large_cases / sizeof large_cases[0]));
    tcase_add_loop_test(tc, test_flash_nan_key, 0, small ? 1 : 6);
    {
        /* Small scale (Oclgrind): the sub-group of 8 f16 case, the 16 bf16 one with a mask and
         * sinks, and a case it must not take. */
        static const int dpas_heavy[] = {1, 2, 4, 5, 7};
        const int dpas_count = (int)(sizeof dpas_cases / sizeof dpas_cases[0]);
        if (small)
            tu_not_run("test_flash_dpas_emulated 1, 2, 4, 5, 7 (minutes on Oclgrind)");
        TCase *dpas = tu_tcase(suite, "matrix engine", 900);
        tu_add_loop_except(dpas, test_flash_dpas_emulated, 0, dpas_count, dpas_heavy,
                           small ? (int)(sizeof dpas_heavy / sizeof dpas_heavy[0]) : 0);
        tcase_add_unchecked_fixture(dpas, NULL, release_dpas_ctxs);
    }
    if (!small)
        tcase_add_loop_test(tc, test_flash_many_heads_split, 0, 2);
    /* Each CPU-kernel case is a PoCL compilation of its own (variant switches, head sizes and
     * flash_cpu_kv are -D defines), about 2.8 s each on the 2-core CI machine: the 108 took
     * 305 of this suite's 509 s with a cold kernel cache, and 161 s again in flash_cpu_split
     * (other defines). The CI tier (scale unset) runs the third where variant + size is a
     * multiple of 3: each variant at 4 sizes, each size with 3 variants, and each variant and
     * each size with every flash_cpu_kv; CLATTN_TEST_SCALE=full runs all 108. */
    if (!small) {
        static int cpu_sampled_out[CPU_VARIANTS * CPU_SIZES];
        int sampled_out = 0;
        if (!tu_full()) {
            for (int i = 0; i < (int)(CPU_VARIANTS * CPU_SIZES); ++i)
                if ((i / (int)CPU_SIZES + i % (int)CPU_SIZES) % 3 != 0)
                    cpu_sampled_out[sampled_out++] = i;
            tu_not_run("test_flash_cpu_variants where variant + size is not a multiple of 3 "
                       "(%d of %d: one PoCL compilation each; every variant, size and "
                       "flash_cpu_kv still runs)",
                       sampled_out, (int)(CPU_VARIANTS * CPU_SIZES));
        }
        tu_add_loop_except(tc, test_flash_cpu_variants, 0, (int)(CPU_VARIANTS * CPU_SIZES),
                           cpu_sampled_out, sampled_out);
        tcase_add_unchecked_fixture(tc, NULL, release_kv_ctxs);
    }
    /* Small scale (Oclgrind, rusticl): 3 of the 12 key-rule cases (a one-row grouped decode
     * with ONNX's offset, a past with a window, the diagonal alone over key counts), one of
     * them in double and with the scores, 3 of the 5 decode-split cases, no generation: every
     * rule and kernel (copy4d, score_copy, flash_merge, softmax_rows_f64) still runs there; the
     * pocl lane runs them all (measured: the larger set took 12 minutes of Oclgrind). */
    /* The ALiBi rule cases (12-15) came after these lists were written and all ran at small
     * scale, 150 s of the Oclgrind lane: 12 (per-head slopes) and 13 (per-batch slopes on a
     * one-row decode, which must not take the grouped path) stay. */
    static const int heavy_rules[] = {0, 1, 3, 4, 6, 8, 9, 10, 11, 14, 15};
    static const int heavy_f64[] = {0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    static const int heavy_generations[] = {0, 1, 2, 3}, heavy_decode[] = {0, 2};
    if (small)
        tu_not_run("test_key_rules but cases 2, 5, 7, 12, 13; test_softmax_f64 but case 5; "
                   "test_scores_output but case 5; test_decode_splits 0, 2; test_generation "
                   "(minutes each on Oclgrind; PoCL runs them)");
    const int rules = (int)(sizeof rule_cases / sizeof rule_cases[0]);
    tu_add_loop_except(tc, test_key_rules, 0, rules, heavy_rules, small ? 11 : 0);
    /* Small scale (Oclgrind): the offset cases with many rows at head size 64 left out (and
     * the second decode row); the other 7 still take positive, negative, huge and extreme
     * offsets, the window alone and a one-row decode grouping through both paths. */
    static const int heavy_offsets[] = {0, 2, 7, 9, 11, 12, 13};
    if (small)
        tu_not_run("test_diag_offset cases 0, 2, 7, 9, 11-13 (17 to 129 rows at head size 64, "
                   "up to 300 keys): the other 7 cover every offset rule");
    tu_add_loop_except(tc, test_diag_offset, 0, (int)(sizeof offset_cases / sizeof offset_cases[0]),
                       heavy_offsets, small ? 7 : 0);
    tu_add_loop_except(tc, test_decode_splits, 0,
                       (int)(sizeof decode_cases / sizeof decode_cases[0]), heavy_decode,
                       small ? 2 : 0);
    tu_add_loop_except(tc, test_generation, 0, 4, heavy_generations, small ? 4 : 0);
    /* Small scale: the in-place read is flash_cpu's (PoCL's full-scale lane); the reduced
     * lanes keep 3 cheap cases (1 key, 3 rows with a mask and padding, 7 rows strided) for
     * the paths a GPU or a loop-limited device takes on these shapes. */
    static const int heavy_in_place[] = {1, 2, 4, 5, 6, 7, 9};
    if (small)
        tu_not_run("test_decode_in_place cases 1, 2, 4-7, 9 (FC_DIRECT is flash_cpu's: the "
                   "pocl lane runs all 10)");
    tu_add_loop_except(tc, test_decode_in_place, 0,
                       (int)(sizeof in_place_cases / sizeof in_place_cases[0]), heavy_in_place,
                       small ? 7 : 0);
    tcase_add_unchecked_fixture(tc, NULL, release_decode_ctx);
    tu_add_loop_except(tc, test_softmax_f64, 0, rules, heavy_f64, small ? 15 : 0);
    tcase_add_loop_test(tc, test_scores_output, small ? 15 : 0, small ? 18 : 3 * rules);
    tcase_add_test(tc, test_path_errors);
    tcase_add_loop_test(tc, test_tuning_records, 0,
                        (int)(sizeof record_cases / sizeof record_cases[0]));
    tcase_add_unchecked_fixture(tc, NULL, release_records_ctx);
    tcase_add_test(tc, test_tuning_record_errors);
    tcase_add_loop_test(tc, test_mha_paths, small ? 1 : 0, 2);
    tcase_add_loop_test(tc, test_mha_auto_is_fused, 0, 2);
    if (!small)
        tcase_add_loop_test(tc, test_long_sequence_under_cap, 0, 2);
    /* Issue 48's blind spots, a case of their own (CK_RUN_CASE="decode edges" runs them
     * alone): a few rows over at most 200 keys, under a second each on PoCL. Small scale
     * (Oclgrind: 15 s for all of them) leaves out the two cases whose point is another
     * device's: two k/v heads split on 2+ compute units only (Oclgrind has 1), and the
     * 108-key pages cross flash_cpu.cl's 64-key tile (the pocl lane's kernel). */
    static const int heavy_group_sinks[] = {2}, heavy_partial[] = {4};
    if (small)
        tu_not_run("test_decode_split_group_sinks case 2 (two k/v heads), "
                   "test_paged_partial_blocks case 4 (past flash_cpu.cl's first key tile)");
    TCase *edges = tu_tcase(suite, "decode edges", 900);
    tu_add_loop_except(edges, test_decode_split_group_sinks, 0,
                       (int)(sizeof group_sink_cases / sizeof group_sink_cases[0]),
                       heavy_group_sinks, small ? 1 : 0);
    tu_add_loop_except(edges, test_paged_partial_blocks, 0,
                       (int)(sizeof partial_cases / sizeof partial_cases[0]), heavy_partial,
                       small ? 1 : 0);
    tcase_add_unchecked_fixture(edges, NULL, release_decode_ctx);
    return tu_run_suite(suite);
}
