/*
 * check_attention: scaled dot-product attention through SDPA plans (device buffers at random
 * offsets, path AUTO) and clattn_attention_host against the float64 reference, and the
 * textbook example of issue 2 checked value by value (MHA host API, op by op with
 * clattn_matmul and an SDPA plan, and the attention host API).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problems.h"
#include "reference.h"
#include "testutil.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

typedef struct attention_case {
    size_t batch, heads, seq_q, seq_k, head_dim_qk, head_dim_v;
    float scale; /* as clattn takes it: NAN is the default 1/sqrt(head_dim_qk) */
    clattn_norm norm;
    int causal, use_attn_mask, use_padding, want_weights;
} attention_case;

/* clang-format off */
static const attention_case attention_cases[] = {
    {1, 1, 1, 1, 1, 1, NAN, CLATTN_NORM_SOFTMAX, 0, 0, 0, 1},
    {1, 1, 3, 3, 4, 4, 0.5f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 1},
    {2, 3, 5, 17, 8, 3, NAN, CLATTN_NORM_SOFTMAX, 0, 0, 0, 0},
    {3, 2, 17, 5, 3, 8, 0.3f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 1},
    {2, 4, 63, 65, 16, 16, NAN, CLATTN_NORM_SOFTMAX, 0, 1, 0, 1},
    {1, 8, 65, 63, 32, 17, NAN, CLATTN_NORM_SOFTMAX, 0, 0, 1, 0},
    {2, 16, 9, 129, 4, 6, 0.25f, CLATTN_NORM_SOFTMAX, 1, 1, 1, 1},
    {1, 2, 127, 127, 64, 64, NAN, CLATTN_NORM_SOFTMAX, 1, 0, 0, 0},
    {2, 1, 129, 1, 5, 7, 1.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 1},
    {3, 5, 1, 33, 65, 1, NAN, CLATTN_NORM_SOFTMAX, 0, 1, 1, 1},
    {2, 3, 7, 19, 8, 4, NAN, CLATTN_NORM_RELU, 0, 0, 0, 1},
    {1, 4, 17, 17, 12, 20, 0.4f, CLATTN_NORM_RELU, 1, 0, 1, 0},
    {2, 2, 33, 65, 9, 9, NAN, CLATTN_NORM_RELU, 0, 1, 0, 1},
    {2, 6, 3, 1000, 16, 8, NAN, CLATTN_NORM_SOFTMAX, 0, 1, 1, 1},
    /* long keys, wide heads */
    {1, 2, 5, 4097, 8, 8, NAN, CLATTN_NORM_SOFTMAX, 1, 0, 1, 1},
    {2, 2, 17, 9, 256, 300, NAN, CLATTN_NORM_SOFTMAX, 0, 1, 0, 1},
};
/* clang-format on */

static void describe(const char *api, const attention_case *ac)
{
    tu_set_case("%s batch=%zu heads=%zu seq_q=%zu seq_k=%zu head_dim_qk=%zu head_dim_v=%zu "
                "scale=%g norm=%s causal=%d attn_mask=%d padding=%d weights=%d",
                api, ac->batch, ac->heads, ac->seq_q, ac->seq_k, ac->head_dim_qk, ac->head_dim_v,
                (double)ac->scale, ac->norm == CLATTN_NORM_RELU ? "relu" : "softmax", ac->causal,
                ac->use_attn_mask, ac->use_padding, ac->want_weights);
}

/* Inputs, masks and the float64 reference of one case: the attn_mask (seq_q, seq_k) masks
 * every key of query 0 (its output and weights are zeros); the key padding masks every key of
 * batch entry 1. */
static void make_problem(pb_sdpa_problem *p, const attention_case *ac)
{
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = ac->batch;
    spec.heads = ac->heads;
    spec.seq_q = ac->seq_q;
    spec.seq_k = ac->seq_k;
    spec.dk = ac->head_dim_qk;
    spec.dv = ac->head_dim_v;
    spec.scale = ac->scale;
    spec.norm = ac->norm;
    spec.causal = ac->causal ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
    spec.want_weights = ac->want_weights;
    spec.mask = ac->use_attn_mask ? PB_MASK_FLOAT : PB_MASK_NONE;
    spec.fully_masked = ac->use_attn_mask ? 2 : 0;
    spec.padding = ac->use_padding;
    /* Scores grow with head_dim; q in [-2, 2) keeps them O(1..10) so softmax is neither flat
     * nor one-hot (pb_sdpa_spec_init's q_gain). */
    pb_sdpa_make(p, &spec);
    if (ac->use_padding && ac->batch > 1) {
        memset(p->padding + ac->seq_k, 1, ac->seq_k); /* batch entry 1: every key */
        pb_sdpa_reference(p);
    }
}

/* The plan (path AUTO) on buffers at random offsets with NaN around every tensor. */
static void run_device(const attention_case *ac, const pb_sdpa_problem *p)
{
    describe("device", ac);
    clattn_status status = pb_sdpa_run(tu_ctx(), p, NULL);
    tu_expect_status(status, CLATTN_SUCCESS, "pb_sdpa_run");
}

/* variant 0: path AUTO; 1: the other path (UNFUSED when AUTO fuses, and the reverse where the
 * fused kernel can run). */
static void run_host(const attention_case *ac, const pb_sdpa_problem *p, int variant)
{
    describe(variant ? "host, the other path" : "host", ac);
    clattn_attention_host_desc desc;
    clattn_attention_host_desc_init(&desc);
    desc.batch = ac->batch;
    desc.heads = ac->heads;
    desc.seq_q = ac->seq_q;
    desc.seq_k = ac->seq_k;
    desc.head_dim_qk = ac->head_dim_qk;
    desc.head_dim_v = ac->head_dim_v;
    desc.causal = p->spec.causal;
    desc.scale = ac->scale;
    desc.norm = ac->norm;
    if (variant) {
        const int fusable =
            !ac->want_weights && ac->head_dim_qk <= 256 && ac->head_dim_v <= 256;
        desc.path = pb_sdpa_expect_fused(&p->spec) ? CLATTN_PATH_UNFUSED
                    : fusable                      ? CLATTN_PATH_FUSED
                                                   : CLATTN_PATH_AUTO;
    }
    const clattn_host_masks masks = {p->mask, p->padding, NULL};
    const int host_masks = p->mask != NULL || p->padding != NULL;
    float *out = tu_nan_floats(p->out_count);
    float *weights = ac->want_weights ? tu_nan_floats(p->weights_count) : NULL;
    clattn_status status = clattn_attention_host(tu_ctx(), &desc, p->q, p->k, p->v,
                                                 host_masks ? &masks : NULL, out, weights);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_attention_host")) {
        tu_expect_finite("out", out, p->out_count);
        tu_expect_close("out", out, p->out_ref, p->out_count, TU_TOL);
        if (weights != NULL) {
            tu_expect_close("weights", weights, p->weights_ref, p->weights_count, TU_TOL);
        }
    }
    free(weights);
    free(out);
}

START_TEST(test_attention_cases)
{
    TU_BEGIN_TEST();
    const attention_case *ac = &attention_cases[_i];
    pb_sdpa_problem p;
    make_problem(&p, ac);
    run_device(ac, &p);
    run_host(ac, &p, 0);
    if (ac->causal)
        run_host(ac, &p, 1);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* More (batch, head) pairs than one grid dimension holds on some devices (65535): the batched
 * products must be split. Device API only: the host API runs the same plan, and the GPU-style
 * tiled matmul needs seconds for 66000 tiny work-groups on a CPU. */
START_TEST(test_attention_many_heads)
{
    TU_BEGIN_TEST();
    /* clang-format off */
    attention_case ac = {33, 2000, 2, 3, 2, 3, NAN, CLATTN_NORM_SOFTMAX, 1, 1, 1, 1};
    /* clang-format on */
    pb_sdpa_problem p;
    make_problem(&p, &ac);
    run_device(&ac, &p);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* heads 1..16, cycling through the mask kinds and normalisations. */
START_TEST(test_attention_heads)
{
    TU_BEGIN_TEST();
    size_t heads = (size_t)_i + 1;
    /* clang-format off */
    attention_case ac = {2, heads, 7, 13, 8, 5, (_i % 3) ? NAN : 0.6f,
                         _i % 5 == 4 ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX,
                         _i % 2, _i % 3 == 1, _i % 4 == 2, _i % 2 == 0};
    /* clang-format on */
    pb_sdpa_problem p;
    make_problem(&p, &ac);
    run_device(&ac, &p);
    run_host(&ac, &p, 0);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* Random configurations over every option; sizes drawn from the awkward values. */
START_TEST(test_attention_random)
{
    TU_BEGIN_TEST();
    static const size_t seqs[] = {1, 3, 17, 63, 65, 127, 129};
    static const size_t dims[] = {1, 3, 8, 16, 17, 64};
    attention_case ac = {
        .batch = 1 + tu_rand_below(3),
        .heads = 1 + tu_rand_below(16),
        .seq_q = seqs[tu_rand_below(7)],
        .seq_k = seqs[tu_rand_below(7)],
        .head_dim_qk = dims[tu_rand_below(6)],
        .head_dim_v = dims[tu_rand_below(6)],
        .scale = tu_rand_below(2) ? NAN : (float)(0.05 + tu_rand_unit()),
        .norm = tu_rand_below(4) == 0 ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX,
        .causal = (int)tu_rand_below(2),
        .use_attn_mask = (int)tu_rand_below(2),
        .use_padding = (int)tu_rand_below(2),
        .want_weights = (int)tu_rand_below(2),
    };
    pb_sdpa_problem p;
    make_problem(&p, &ac);
    run_device(&ac, &p);
    run_host(&ac, &p, _i % 2);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* scale NAN means 1/sqrt(head_dim_qk): it gives the same result as that scale passed
 * explicitly. And scale 0 means 0 (it was "the default" before plans): every kept key gets
 * the same weight. */
START_TEST(test_attention_default_scale)
{
    TU_BEGIN_TEST();
    /* clang-format off */
    attention_case ac = {2, 3, 9, 11, 16, 7, NAN, CLATTN_NORM_SOFTMAX, 0, 0, 0, 1};
    /* clang-format on */
    pb_sdpa_problem p;
    make_problem(&p, &ac);
    attention_case explicit_case = ac;
    explicit_case.scale = 0.25f;
    run_host(&explicit_case, &p, 0); /* the reference of NAN is the target of both */
    run_host(&ac, &p, 0);
    run_device(&ac, &p);
    pb_sdpa_free(&p);

    attention_case zero_case = ac;
    zero_case.scale = 0.0f;
    zero_case.use_padding = 1;
    make_problem(&p, &zero_case);
    run_device(&zero_case, &p);
    run_host(&zero_case, &p, 0);
    /* uniform weights over the kept keys: check the reference itself once */
    size_t kept = 0;
    for (size_t key = 0; key < zero_case.seq_k; ++key)
        kept += p.padding[key] == 0;
    tu_expect(kept == 0 || fabs(p.weights_ref[0] - (p.padding[0] ? 0.0 : 1.0 / (double)kept)) <
                               1e-12,
              "reference of scale 0: weight %g, want 1/%zu", p.weights_ref[0], kept);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* --- the textbook example ----------------------------------------------------------------- */

static const float textbook_x[3 * 4] = {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 1, 1};
static const float textbook_wq[4 * 4] = {1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0};
static const float textbook_wk[4 * 4] = {0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1};
static const float textbook_wv[4 * 4] = {1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 1, 1, 0, 0};
static const double textbook_scores[3 * 3] = {2, 6, 8, 6, 2, 8, 8, 8, 16};
/* Row 0 as the issue gives it; rows 1 and 2 are exp-normalised [3,1,4] and [4,4,8]. */
static const double textbook_weights[3 * 3] = {
    0.035119, 0.259496, 0.705385, 0.259496, 0.035119, 0.705385, 0.017668, 0.017668, 0.964663,
};
static const double textbook_z[3 * 4] = {
    1.705385, 1.929762, 1.481007, 1.705385, 1.705385, 1.481007,
    1.929762, 1.705385, 1.964663, 1.964663, 1.964663, 1.964663,
};

#define TEXTBOOK_TOL 1e-5

static void expect_textbook(const char *what, const float *got, const double *want, size_t count)
{
    double err = tu_abs_error(got, want, count);
    tu_track_error(tu_rel_error(got, want, count));
    if (!(err <= TEXTBOOK_TOL)) {
        char text[512];
        size_t used = 0;
        for (size_t i = 0; i < count && used < sizeof text; ++i) {
            used += (size_t)snprintf(text + used, sizeof text - used, "%s%.6f", i ? " " : "",
                                     (double)got[i]);
        }
        tu_expect(0, "%s: max abs error %.3g > %.0e; got %s", what, err, TEXTBOOK_TOL, text);
    }
}

/* Through clattn_mha_forward_host: one head, d_model 4, d_k = d_v = 4, XW layout, no output
 * projection, scale 1/2. Self-attention (key = value = NULL) and explicit key/value pointers. */
START_TEST(test_textbook_mha_host)
{
    TU_BEGIN_TEST();
    for (int variant = 0; variant < 3; ++variant) {
        tu_set_case("textbook mha host variant=%d (0 self, 1 explicit k/v, 2 averaged)", variant);
        clattn_mha_host_desc desc;
        clattn_mha_host_desc_init(&desc);
        desc.batch = 1;
        desc.seq_q = 3;
        desc.seq_k = 3;
        desc.embed_dim = 4;
        desc.num_heads = 1;
        desc.qk_dim = 4;
        desc.v_dim = 4;
        desc.layout = CLATTN_LAYOUT_XW;
        desc.scale = 0.5f;
        desc.need_weights = variant == 2 ? CLATTN_WEIGHTS_AVERAGED : CLATTN_WEIGHTS_PER_HEAD;
        clattn_mha_host_weights weights = {0};
        weights.q_weight = textbook_wq;
        weights.k_weight = textbook_wk;
        weights.v_weight = textbook_wv;
        float *z = tu_nan_floats(3 * 4);
        float *attn = tu_nan_floats(3 * 3);
        const float *key = variant == 1 ? textbook_x : NULL;
        clattn_status status =
            clattn_mha_forward_host(tu_ctx(), &desc, &weights, textbook_x, key, key, NULL, z, attn);
        if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_mha_forward_host")) {
            expect_textbook("Z", z, textbook_z, 3 * 4);
            expect_textbook("weights", attn, textbook_weights, 3 * 3);
            tu_expect(fabs(attn[0] - 0.035119) <= TEXTBOOK_TOL &&
                          fabs(attn[1] - 0.259496) <= TEXTBOOK_TOL &&
                          fabs(attn[2] - 0.705385) <= TEXTBOOK_TOL,
                      "weights row 0 = [%.6f, %.6f, %.6f], want [0.035119, 0.259496, 0.705385]",
                      (double)attn[0], (double)attn[1], (double)attn[2]);
        }
        free(attn);
        free(z);
    }
    TU_END_TEST();
}
END_TEST

/* The same example op by op on the device: Q = X·Wq, K = X·Wk, V = X·Wv (clattn_matmul),
 * scores = Q·Kᵀ (checked against [[2,6,8],[6,2,8],[8,8,16]]), weights and Z from an unfused
 * SDPA plan with scale 1/2, and Z again as weights·V (clattn_matmul). */
START_TEST(test_textbook_ops)
{
    TU_BEGIN_TEST();
    tu_set_case("textbook op by op");
    clattn_ctx *ctx = tu_ctx();
    cl_mem x_mem = tu_upload_floats(textbook_x, 12);
    cl_mem wq_mem = tu_upload_floats(textbook_wq, 16);
    cl_mem wk_mem = tu_upload_floats(textbook_wk, 16);
    cl_mem wv_mem = tu_upload_floats(textbook_wv, 16);
    cl_mem q_mem = tu_nan_buffer(12), k_mem = tu_nan_buffer(12), v_mem = tu_nan_buffer(12);
    cl_mem scores_mem = tu_nan_buffer(9), weights_mem = tu_nan_buffer(9);
    cl_mem z_mem = tu_nan_buffer(12), z2_mem = tu_nan_buffer(12);
    const clattn_dtype f32 = CLATTN_DTYPE_F32;
    const clattn_tensor x = clattn_tensor_make(x_mem, 0, f32, 2, 3, 4, 0, 0);
    const clattn_tensor wq = clattn_tensor_make(wq_mem, 0, f32, 2, 4, 4, 0, 0);
    const clattn_tensor wk = clattn_tensor_make(wk_mem, 0, f32, 2, 4, 4, 0, 0);
    const clattn_tensor wv = clattn_tensor_make(wv_mem, 0, f32, 2, 4, 4, 0, 0);
    const clattn_tensor q = clattn_tensor_make(q_mem, 0, f32, 2, 3, 4, 0, 0);
    const clattn_tensor k = clattn_tensor_make(k_mem, 0, f32, 2, 3, 4, 0, 0);
    const clattn_tensor v = clattn_tensor_make(v_mem, 0, f32, 2, 3, 4, 0, 0);
    const clattn_tensor scores = clattn_tensor_make(scores_mem, 0, f32, 2, 3, 3, 0, 0);
    const clattn_tensor weights_2d = clattn_tensor_make(weights_mem, 0, f32, 2, 3, 3, 0, 0);
    const clattn_tensor z2 = clattn_tensor_make(z2_mem, 0, f32, 2, 3, 4, 0, 0);

    const clattn_matmul_desc project = {sizeof(clattn_matmul_desc), 0, 0, 1.0f, 0.0f};
    const clattn_matmul_desc qk = {sizeof(clattn_matmul_desc), 0, 1, 1.0f, 0.0f};
    clattn_status status = clattn_matmul(ctx, &project, &x, &wq, NULL, &q, 0, NULL, NULL);
    tu_expect_status(status, CLATTN_SUCCESS, "clattn_matmul (Q)");
    status = clattn_matmul(ctx, &project, &x, &wk, NULL, &k, 0, NULL, NULL);
    tu_expect_status(status, CLATTN_SUCCESS, "clattn_matmul (K)");
    status = clattn_matmul(ctx, &project, &x, &wv, NULL, &v, 0, NULL, NULL);
    tu_expect_status(status, CLATTN_SUCCESS, "clattn_matmul (V)");
    status = clattn_matmul(ctx, &qk, &q, &k, NULL, &scores, 0, NULL, NULL);
    tu_expect_status(status, CLATTN_SUCCESS, "clattn_matmul (scores)");

    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc_tensors.q = clattn_tensor_make(q_mem, 0, f32, 4, 1, 1, 3, 4);
    desc_tensors.k = clattn_tensor_make(k_mem, 0, f32, 4, 1, 1, 3, 4);
    desc_tensors.v = clattn_tensor_make(v_mem, 0, f32, 4, 1, 1, 3, 4);
    desc_tensors.out = clattn_tensor_make(z_mem, 0, f32, 4, 1, 1, 3, 4);
    desc_tensors.weights = clattn_tensor_make(weights_mem, 0, f32, 4, 1, 1, 3, 3);
    desc.scale = 0.5f;
    desc.path = CLATTN_PATH_UNFUSED;
    clattn_plan *plan = NULL;
    status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_sdpa_plan_create")) {
        status = clattn_plan_execute(plan, desc_tensors.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                     NULL, NULL);
        tu_expect_status(status, CLATTN_SUCCESS, "clattn_plan_execute");
    }
    clattn_plan_release(plan);
    status = clattn_matmul(ctx, &project, &weights_2d, &v, NULL, &z2, 0, NULL, NULL);
    tu_expect_status(status, CLATTN_SUCCESS, "clattn_matmul (Z)");

    if (!tu_failed()) {
        float scores_got[9], weights[9], z[12];
        tu_read_floats(scores_mem, 0, 9, scores_got);
        tu_read_floats(weights_mem, 0, 9, weights);
        expect_textbook("scores", scores_got, textbook_scores, 9);
        expect_textbook("weights", weights, textbook_weights, 9);
        tu_read_floats(z_mem, 0, 12, z);
        expect_textbook("Z (plan)", z, textbook_z, 12);
        tu_read_floats(z2_mem, 0, 12, z);
        expect_textbook("Z (weights·V)", z, textbook_z, 12);
    }
    tu_release_mem(z2_mem);
    tu_release_mem(z_mem);
    tu_release_mem(weights_mem);
    tu_release_mem(scores_mem);
    tu_release_mem(v_mem);
    tu_release_mem(k_mem);
    tu_release_mem(q_mem);
    tu_release_mem(wv_mem);
    tu_release_mem(wk_mem);
    tu_release_mem(wq_mem);
    tu_release_mem(x_mem);
    TU_END_TEST();
}
END_TEST

/* And through clattn_attention_host on the projected Q, K, V the host computes, both paths
 * (the fused one cannot return the weights). */
START_TEST(test_textbook_attention_host)
{
    TU_BEGIN_TEST();
    float q[12], k[12], v[12];
    for (size_t row = 0; row < 3; ++row) {
        for (size_t col = 0; col < 4; ++col) {
            float q_sum = 0.0f, k_sum = 0.0f, v_sum = 0.0f;
            for (size_t i = 0; i < 4; ++i) {
                q_sum += textbook_x[row * 4 + i] * textbook_wq[i * 4 + col];
                k_sum += textbook_x[row * 4 + i] * textbook_wk[i * 4 + col];
                v_sum += textbook_x[row * 4 + i] * textbook_wv[i * 4 + col];
            }
            q[row * 4 + col] = q_sum;
            k[row * 4 + col] = k_sum;
            v[row * 4 + col] = v_sum;
        }
    }
    for (int fused = 0; fused < 2; ++fused) {
        tu_set_case("textbook clattn_attention_host path=%s", fused ? "FUSED" : "AUTO");
        clattn_attention_host_desc desc;
        clattn_attention_host_desc_init(&desc);
        desc.batch = desc.heads = 1;
        desc.seq_q = desc.seq_k = 3;
        desc.head_dim_qk = desc.head_dim_v = 4;
        desc.scale = 0.5f;
        desc.path = fused ? CLATTN_PATH_FUSED : CLATTN_PATH_AUTO;
        float z[12], weights[9];
        tu_fill_nan(z, 12);
        tu_fill_nan(weights, 9);
        clattn_status status = clattn_attention_host(tu_ctx(), &desc, q, k, v, NULL, z,
                                                     fused ? NULL : weights);
        if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_attention_host")) {
            if (!fused)
                expect_textbook("weights", weights, textbook_weights, 9);
            expect_textbook("Z", z, textbook_z, 12);
        }
    }
    TU_END_TEST();
}
END_TEST

static Suite *attention_suite(void)
{
    Suite *suite = suite_create("attention");
    TCase *textbook = tu_tcase(suite, "textbook", 600);
    tcase_add_test(textbook, test_textbook_mha_host);
    tcase_add_test(textbook, test_textbook_ops);
    tcase_add_test(textbook, test_textbook_attention_host);

    TCase *shapes = tu_tcase(suite, "shapes", 600);
    /* A reduced run (CLATTN_TEST_SCALE=small, for Oclgrind) leaves out the cases that take
     * minutes there with GPU parameters; their kernel variants run in the other cases. */
    /* Case 7 (127 x 127 keys at d=64, causal: 25 s of Oclgrind) too: causal rows run in
     * cases 3 and 11, several 64-row tiles in case 5 and several 64-key tiles in case 4. */
    static const int heavy_cases[] = {6, 7, 13, 14};
    const int small = tu_small();
    if (small)
        tu_not_run("test_attention_cases 6, 7, 13, 14 (weights over 129, 1000 and 4097 keys; "
                   "127 x 127 keys at d=64), "
                   "test_attention_heads 8-15 (9..16 heads), test_attention_random 1-23, "
                   "test_attention_many_heads (66000 heads): minutes each on Oclgrind");
    tu_add_loop_except(shapes, test_attention_cases, 0, COUNT_OF(attention_cases), heavy_cases,
                       small ? COUNT_OF(heavy_cases) : 0);
    tcase_add_loop_test(shapes, test_attention_heads, 0, small ? 8 : 16);
    tcase_add_test(shapes, test_attention_default_scale);
    /* (small: one random draw; the second took 57 of the suite's 300 s under Oclgrind) */
    tcase_add_loop_test(shapes, test_attention_random, 0, small ? 1 : 24);
    if (!small)
        tcase_add_test(shapes, test_attention_many_heads);
    return suite;
}

int main(void)
{
    return tu_main("check_attention", attention_suite);
}
