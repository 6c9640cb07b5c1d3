/*
 * check_additive: additive (Bahdanau) attention plans (clattn_additive_plan_create) against
 * the float64 reference on fresh random inputs: one and several heads, W1/W2 as (d, H*da) or
 * (H, d, da), with and without biases, w as (H*da) (strided) or (H, da), Lq != Lk, sizes 1 to
 * 129, float and boolean masks, key padding, rows with every key masked, causal (both
 * alignments), softmax and relu, F16/BF16 inputs, rank-2 inputs, padded layouts, the weights
 * output; each on the fused path (flash.cl's ADDITIVE variant) and the unfused one
 * (additive.cl's score tiles). Outputs are poisoned first; stray writes are counted. Then every
 * refusal.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problems.h"
#include "reference.h"
#include "testutil.h"

#define F32 CLATTN_DTYPE_F32
#define F16 CLATTN_DTYPE_F16
#define BF16 CLATTN_DTYPE_BF16
#define TL CLATTN_CAUSAL_TOP_LEFT
#define BR CLATTN_CAUSAL_BOTTOM_RIGHT
#define SOFTMAX CLATTN_NORM_SOFTMAX
#define RELU CLATTN_NORM_RELU

enum { NO_MASK = 0, FLOAT_MASK = 1, BOOL_MASK = 2 };

typedef struct additive_case {
    size_t batch, heads, seq_q, seq_k, dq, dk, dv, da;
    int split_w; /* W1, W2 as (H, d, da), w as (H, da); else (d, H*da), (H*da) stride 2 */
    int bias;    /* b1 and b2 */
    clattn_causal causal;
    int mask;    /* NO_MASK, FLOAT_MASK ((Lq, Lk)), BOOL_MASK ((B, 1, Lq, Lk) U8) */
    int padding; /* key_padding_mask */
    int fully;   /* the mask drops every key of query 0 */
    clattn_norm norm;
    int weights; /* the weights output (unfused path only) */
    clattn_dtype in_dtype;
    int rank2;        /* q, k, v, out as (seq, features) (batch 1) */
    pb_layout layout; /* q, k, v, out */
    /* 1: pre-activations past the fused kernel's exp range (|P| > 40, see flash.cl) that
     * cancel: every 5th query row and the keys of every other 32-key block scaled by 60, the
     * first unit of each head offset by +35 in b1 and -35 in b2 (needs bias), so that a big
     * P1 meets a P2 of about -35 in tiles without big keys, and the reverse */
    int big;
} additive_case;

/* clang-format off */
static const additive_case cases[] = {
    /* B  H   Lq   Lk  dq  dk  dv   da split bias causal       mask    pad full norm  wts in   r2 layout */
    {1, 1,   1,   1,  3,  3,  2,   1, 0, 0, CLATTN_CAUSAL_NONE, NO_MASK,    0, 0, SOFTMAX, 0, F32, 0, PB_PACKED, 0},
    {2, 1,  17,  17,  5,  5,  7,   3, 0, 1, CLATTN_CAUSAL_NONE, NO_MASK,    0, 0, SOFTMAX, 0, F32, 0, PB_PACKED, 0},
    {1, 2,  63,  65,  8,  6, 10,  17, 1, 1, CLATTN_CAUSAL_NONE, FLOAT_MASK, 0, 0, SOFTMAX, 0, F32, 0, PB_PADDED, 0},
    {3, 3,  65,  31, 16, 16, 12,  64, 0, 0, TL,                 FLOAT_MASK, 0, 1, RELU,    0, F32, 0, PB_PACKED, 0},
    {2, 1, 127, 129, 32, 24, 16,  48, 1, 1, CLATTN_CAUSAL_NONE, BOOL_MASK,  1, 1, SOFTMAX, 1, F32, 0, PB_PACKED, 0},
    {1, 4, 129,   3,  7,  9,  8,   5, 0, 1, BR,                 NO_MASK,    1, 0, SOFTMAX, 0, F16, 0, PB_PADDED, 0},
    {1, 1,  13,  29,  4,  4,  4,   8, 1, 0, TL,                 BOOL_MASK,  0, 0, RELU,    1, BF16, 1, PB_PACKED, 0},
    {2, 2,  37,  11, 12, 20,  6, 128, 1, 1, BR,                 FLOAT_MASK, 1, 1, SOFTMAX, 0, F32, 0, PB_PACKED, 0},
    {1, 1,   5,   7,  3,  2,  4, 300, 0, 1, CLATTN_CAUSAL_NONE, NO_MASK,    0, 0, SOFTMAX, 0, F32, 0, PB_PACKED, 0},
    {2, 2,  70,  67,  6,  5,  8,  16, 0, 1, CLATTN_CAUSAL_NONE, NO_MASK,    0, 0, SOFTMAX, 0, F32, 0, PB_PACKED, 1},
    {1, 1,  33, 100,  4,  4,  4,   8, 1, 1, TL,                 FLOAT_MASK, 1, 0, SOFTMAX, 0, F32, 0, PB_PACKED, 1},
};
/* clang-format on */
#define CASES ((int)(sizeof cases / sizeof cases[0]))

/* W (H, d, da) logical (the reference's) -> the stored (d, H*da) matrix. */
static void heads_to_columns(const float *w, size_t heads, size_t d, size_t da, float *stored)
{
    for (size_t h = 0; h < heads; ++h)
        for (size_t r = 0; r < d; ++r)
            for (size_t c = 0; c < da; ++c)
                stored[r * heads * da + h * da + c] = w[(h * d + r) * da + c];
}

/* Runs case c on `path` (0 fused, 1 unfused). */
static void run_case(const additive_case *c, clattn_path path)
{
    const size_t B = c->batch, H = c->heads, Lq = c->seq_q, Lk = c->seq_k, da = c->da;
    tu_set_case("additive B=%zu H=%zu Lq=%zu Lk=%zu dq=%zu dk=%zu dv=%zu da=%zu split=%d bias=%d "
                "causal=%d mask=%d pad=%d fully=%d norm=%d weights=%d in=%s rank2=%d layout=%s "
                "big=%d path=%s",
                B, H, Lq, Lk, c->dq, c->dk, c->dv, da, c->split_w, c->bias, (int)c->causal, c->mask,
                c->padding, c->fully, (int)c->norm, c->weights, pb_dtype_name(c->in_dtype),
                c->rank2, pb_layout_name(c->layout), c->big,
                path == CLATTN_PATH_FUSED ? "fused" : "unfused");
    const size_t nq = B * Lq * c->dq, nk = B * Lk * c->dk, nv = B * Lk * c->dv;
    const size_t nout = B * Lq * c->dv, nw = B * H * Lq * Lk;
    float *q = tu_random_floats(nq), *k = tu_random_floats(nk), *v = tu_random_floats(nv);
    pb_round_array(c->in_dtype, q, nq);
    pb_round_array(c->in_dtype, k, nk);
    pb_round_array(c->in_dtype, v, nv);
    /* Weights scaled so that the tanh arguments spread over its curve, not its flat ends. */
    float *w1 = tu_floats(H * c->dq * da), *w2 = tu_floats(H * c->dk * da);
    tu_fill_uniform(w1, H * c->dq * da, -1.5f / sqrtf((float)c->dq), 1.5f / sqrtf((float)c->dq));
    tu_fill_uniform(w2, H * c->dk * da, -1.5f / sqrtf((float)c->dk), 1.5f / sqrtf((float)c->dk));
    float *b1 = c->bias ? tu_random_floats(H * da) : NULL;
    float *b2 = c->bias ? tu_random_floats(H * da) : NULL;
    float *w = tu_floats(H * da);
    tu_fill_uniform(w, H * da, -3.0f / sqrtf((float)da), 3.0f / sqrtf((float)da));
    if (c->big) {
        for (size_t r = 0; r < B * Lq; r += 5)
            for (size_t x = 0; x < c->dq; ++x)
                q[r * c->dq + x] *= 60.0f;
        for (size_t r = 0; r < B * Lk; ++r)
            for (size_t x = 0; (r % Lk) / 32 % 2 == 1 && x < c->dk; ++x)
                k[r * c->dk + x] *= 60.0f;
        for (size_t h = 0; b1 && h < H; ++h) {
            b1[h * da] += 35.0f;
            b2[h * da] -= 35.0f;
        }
    }

    /* Masks: the stored ones and the expanded (B, H, Lq, Lk) additive one for the reference. */
    float *mask = NULL, *expanded = NULL;
    uint8_t *padding = NULL;
    size_t mask_count = 0;
    if (c->mask != NO_MASK) {
        mask_count = c->mask == FLOAT_MASK ? Lq * Lk : B * Lq * Lk;
        mask = tu_floats(mask_count);
        for (size_t e = 0; e < mask_count; ++e) {
            const bool drop = tu_rand_below(4) == 0 || (c->fully && (e / Lk) % Lq == 0);
            mask[e] = c->mask == FLOAT_MASK
                          ? (drop ? -INFINITY : (float)(2.0 * tu_rand_unit() - 1.0))
                          : (drop ? 0.0f : 1.0f);
        }
        expanded = tu_floats(nw);
        for (size_t b = 0; b < B; ++b)
            for (size_t h = 0; h < H; ++h)
                for (size_t e = 0; e < Lq * Lk; ++e) {
                    const float m = c->mask == FLOAT_MASK ? mask[e] : mask[b * Lq * Lk + e];
                    expanded[(b * H + h) * Lq * Lk + e] =
                        c->mask == FLOAT_MASK ? m : (m != 0.0f ? 0.0f : -INFINITY);
                }
    }
    if (c->padding) {
        padding = tu_bytes(B * Lk);
        for (size_t e = 0; e < B * Lk; ++e)
            padding[e] = tu_rand_below(10) < 3;
    }
    const ref_additive_shape shape = {.batch = B,
                                      .heads = H,
                                      .seq_q = Lq,
                                      .seq_k = Lk,
                                      .dq = c->dq,
                                      .dk = c->dk,
                                      .dv = c->dv,
                                      .da = da,
                                      .norm = c->norm,
                                      .causal = c->causal};
    double *want = tu_doubles(nout), *want_w = tu_doubles(nw);

    clattn_additive_desc desc;
    clattn_additive_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.num_heads = H;
    desc.causal = c->causal;
    desc.norm = c->norm;
    desc.path = path;
    clattn_tensors *t = &desc_tensors;
    const int rank = c->rank2 ? 2 : 3;
    const size_t q_dims[3] = {B, Lq, c->dq}, k_dims[3] = {B, Lk, c->dk};
    const size_t v_dims[3] = {B, Lk, c->dv}, o_dims[3] = {B, Lq, c->dv};
    const int skip = c->rank2; /* rank 2: the dims without the batch of 1 */
    pb_make_layout(&t->q, c->in_dtype, rank, q_dims + skip, c->layout);
    pb_make_layout(&t->k, c->in_dtype, rank, k_dims + skip, c->layout);
    pb_make_layout(&t->v, c->in_dtype, rank, v_dims + skip, c->layout);
    pb_make_layout(&t->out, F32, rank, o_dims + skip, c->layout);
    float *w1_stored = w1, *w2_stored = w2, *w_stored = w;
    if (c->split_w) {
        const size_t w1_dims[3] = {H, c->dq, da}, w2_dims[3] = {H, c->dk, da};
        const size_t w_dims[2] = {H, da};
        pb_make_layout(&t->q_weight, c->in_dtype, 3, w1_dims, PB_PADDED);
        pb_make_layout(&t->k_weight, c->in_dtype, 3, w2_dims, PB_PACKED);
        pb_make_layout(&t->score_weight, F32, 2, w_dims, PB_PADDED);
    } else {
        w1_stored = tu_floats(H * c->dq * da);
        w2_stored = tu_floats(H * c->dk * da);
        heads_to_columns(w1, H, c->dq, da, w1_stored);
        heads_to_columns(w2, H, c->dk, da, w2_stored);
        const size_t w1_dims[2] = {c->dq, H * da}, w2_dims[2] = {c->dk, H * da};
        const size_t w_dims[1] = {H * da};
        pb_make_layout(&t->q_weight, c->in_dtype, 2, w1_dims, PB_PACKED);
        pb_make_layout(&t->k_weight, c->in_dtype, 2, w2_dims, PB_PADDED);
        pb_make_layout(&t->score_weight, F32, 1, w_dims, PB_STRIDED_LAST);
    }
    /* W1 and W2 are stored in the inputs' dtype: the reference sees them rounded too. */
    pb_round_array(c->in_dtype, w1, H * c->dq * da);
    pb_round_array(c->in_dtype, w2, H * c->dk * da);
    if (!c->split_w) {
        pb_round_array(c->in_dtype, w1_stored, H * c->dq * da);
        pb_round_array(c->in_dtype, w2_stored, H * c->dk * da);
    }
    ref_additive(&shape, q, k, v, w1, b1, w2, b2, w, expanded, padding, want, want_w);
    if (c->bias) {
        const size_t b_dims[2] = {H, da}, b_flat[1] = {H * da};
        pb_make_layout(&t->q_bias, F32, c->split_w ? 2 : 1, c->split_w ? b_dims : b_flat,
                       PB_PACKED);
        pb_make_layout(&t->k_bias, F32, 1, b_flat, PB_PACKED);
    }
    if (c->mask == FLOAT_MASK) {
        const size_t m_dims[2] = {Lq, Lk};
        pb_make_layout(&t->attn_mask, F32, 2, m_dims, PB_PACKED);
    } else if (c->mask == BOOL_MASK) {
        const size_t m_dims[4] = {B, 1, Lq, Lk};
        pb_make_layout(&t->attn_mask, CLATTN_DTYPE_U8, 4, m_dims, PB_PACKED);
    }
    if (c->padding) {
        const size_t p_dims[2] = {B, Lk};
        pb_make_layout(&t->key_padding_mask, CLATTN_DTYPE_U8, 2, p_dims, PB_PACKED);
    }
    if (c->weights) {
        const size_t w_dims[4] = {B, H, Lq, Lk};
        pb_make_layout(&t->weights, F32, 4, w_dims, PB_PADDED);
    }

    clattn_plan *plan = NULL;
    if (tu_expect_status(clattn_additive_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                         "clattn_additive_plan_create")) {
        tu_expect(clattn_plan_is_fused(plan) == (path == CLATTN_PATH_FUSED), "the plan is %sfused",
                  clattn_plan_is_fused(plan) ? "" : "not ");
        clattn_tensors bound = desc_tensors;
        float *pad_f = NULL;
        if (padding) {
            pad_f = tu_floats(B * Lk);
            for (size_t e = 0; e < B * Lk; ++e)
                pad_f[e] = padding[e];
        }
        cl_int err = pb_upload(tu_ctx(), &bound.q, tu_rand_below(5), q);
        if (err == CL_SUCCESS)
            err = pb_upload(tu_ctx(), &bound.k, tu_rand_below(5), k);
        if (err == CL_SUCCESS)
            err = pb_upload(tu_ctx(), &bound.v, tu_rand_below(5), v);
        if (err == CL_SUCCESS)
            err = pb_upload(tu_ctx(), &bound.out, tu_rand_below(5), NULL);
        if (err == CL_SUCCESS)
            err = pb_upload(tu_ctx(), &bound.q_weight, 1, w1_stored);
        if (err == CL_SUCCESS)
            err = pb_upload(tu_ctx(), &bound.k_weight, 2, w2_stored);
        if (err == CL_SUCCESS)
            err = pb_upload(tu_ctx(), &bound.score_weight, 3, w_stored);
        if (err == CL_SUCCESS && c->bias)
            err = pb_upload(tu_ctx(), &bound.q_bias, 0, b1);
        if (err == CL_SUCCESS && c->bias)
            err = pb_upload(tu_ctx(), &bound.k_bias, 4, b2);
        if (err == CL_SUCCESS && mask)
            err = pb_upload(tu_ctx(), &bound.attn_mask, 1, mask);
        if (err == CL_SUCCESS && padding)
            err = pb_upload(tu_ctx(), &bound.key_padding_mask, 2, pad_f);
        if (err == CL_SUCCESS && c->weights)
            err = pb_upload(tu_ctx(), &bound.weights, 3, NULL);
        if (tu_expect(err == CL_SUCCESS, "uploads failed (%d)", (int)err) &&
            tu_expect_status(clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                                 0, NULL, NULL),
                             CLATTN_SUCCESS, "clattn_plan_execute")) {
            float *got = tu_nan_floats(nout);
            size_t stray = 0;
            if (pb_download(tu_ctx(), NULL, &bound.out, got, &stray) == CL_SUCCESS) {
                /* F16/BF16 inputs: the reference saw the same rounded values; the error is
                 * float32 arithmetic over da tanh terms and Lk weights. */
                tu_expect_close("out", got, want, nout, 2e-5);
                tu_expect(stray == 0, "%zu elements written outside out", stray);
            }
            if (c->weights) {
                float *got_w = tu_nan_floats(nw);
                if (pb_download(tu_ctx(), NULL, &bound.weights, got_w, &stray) == CL_SUCCESS) {
                    tu_expect_close("weights", got_w, want_w, nw, 2e-5);
                    tu_expect(stray == 0, "%zu elements written outside weights", stray);
                }
                free(got_w);
            }
            if (c->fully && c->mask != NO_MASK) { /* query 0 of every batch: all keys masked */
                for (size_t b = 0; b < B; ++b)
                    for (size_t x = 0; x < c->dv; ++x)
                        tu_expect(got[b * Lq * c->dv + x] == 0.0f,
                                  "a fully masked row gave %g, not 0",
                                  (double)got[b * Lq * c->dv + x]);
            }
            free(got);
        }
        pb_release_tensors(&bound);
        free(pad_f);
    }
    clattn_plan_release(plan);
    if (!c->split_w) {
        free(w1_stored);
        free(w2_stored);
    }
    free(want_w);
    free(want);
    free(padding);
    free(expanded);
    free(mask);
    free(w);
    free(b2);
    free(b1);
    free(w2);
    free(w1);
    free(v);
    free(k);
    free(q);
}

/* _i = 2 * case + path; the fused path where the case allows it (no weights, da <= 256). */
START_TEST(test_additive_cases)
{
    TU_BEGIN_TEST();
    const additive_case *c = &cases[_i / 2];
    const bool fused = _i % 2 == 0;
    if (fused && (c->weights || c->da > 256)) {
        tu_set_case("additive case %d: fused path not applicable (weights or da > 256)", _i / 2);
    } else {
        run_case(c, fused ? CLATTN_PATH_FUSED : CLATTN_PATH_UNFUSED);
    }
    TU_END_TEST();
}
END_TEST

#define expect_refused(desc, want, needle, call)                                                   \
    TU_EXPECT_REFUSED(clattn_additive_plan_create, "additive", desc, want, needle, call)

START_TEST(test_additive_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("additive plan refusals");
    const size_t q_dims[3] = {2, 5, 4}, k_dims[3] = {2, 7, 3}, v_dims[3] = {2, 7, 6};
    const size_t o_dims[3] = {2, 5, 6}, w1_dims[2] = {4, 8}, w2_dims[2] = {3, 8};
    const size_t w_dims[1] = {8};
    clattn_additive_desc good;
    clattn_additive_desc_init(&good);
    clattn_tensors good_tensors = {0};
    CLATTN_BIND_ROLES(good, good_tensors);
    good.num_heads = 2; /* da = 4 */
    clattn_tensors *t = &good_tensors;
    pb_make_layout(&t->q, F32, 3, q_dims, PB_PACKED);
    pb_make_layout(&t->k, F32, 3, k_dims, PB_PACKED);
    pb_make_layout(&t->v, F32, 3, v_dims, PB_PACKED);
    pb_make_layout(&t->out, F32, 3, o_dims, PB_PACKED);
    pb_make_layout(&t->q_weight, F32, 2, w1_dims, PB_PACKED);
    pb_make_layout(&t->k_weight, F32, 2, w2_dims, PB_PACKED);
    pb_make_layout(&t->score_weight, F32, 1, w_dims, PB_PACKED);
    TU_EXPECT_PLAN_BASICS(clattn_additive_plan_create, good);
    clattn_plan *plan = NULL;
    clattn_tensors d_tensors = good_tensors;
    clattn_additive_desc d = good;
    CLATTN_BIND_ROLES(d, d_tensors);
    d.struct_size = 8;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "struct_size", "struct_size");
    RESET(d, good), memset(&d_tensors.score_weight, 0, sizeof d_tensors.score_weight);
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "score_weight", "w absent");
    RESET(d, good), memset(&d_tensors.k_weight, 0, sizeof d_tensors.k_weight);
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "k_weight", "W2 absent");
    RESET(d, good), d.num_heads = 0; /* one head before 0.7; 1 (the default) now */
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "num_heads=0", "num_heads 0");
    RESET(d, good), d.num_heads = 3; /* 8 columns of W1 do not split into 3 heads */
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "heads=3", "v's 6 over 3 heads fine, W1 not");
    RESET(d, good), d.num_heads = 4; /* v's 6 columns do not split into 4 heads */
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "num_heads", "v over 4 heads");
    const size_t bad_w2[2] = {3, 6};
    RESET(d, good), pb_make_layout(&d_tensors.k_weight, F32, 2, bad_w2, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "k_weight", "W2 of another da");
    const size_t bad_k[3] = {2, 7, 5};
    RESET(d, good), pb_make_layout(&d_tensors.k, F32, 3, bad_k, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "k_weight", "k of another width than W2");
    const size_t bad_v[3] = {2, 6, 6};
    RESET(d, good), pb_make_layout(&d_tensors.v, F32, 3, bad_v, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "v", "v of another seq_k");
    const size_t bad_out[3] = {2, 5, 4};
    RESET(d, good), pb_make_layout(&d_tensors.out, F32, 3, bad_out, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "out", "out of another width");
    const size_t bad_w[1] = {7};
    RESET(d, good), pb_make_layout(&d_tensors.score_weight, F32, 1, bad_w, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "score_weight", "w of another size");
    RESET(d, good), pb_make_layout(&d_tensors.score_weight, F16, 1, w_dims, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "score_weight", "w in F16");
    RESET(d, good), pb_make_layout(&d_tensors.q_bias, F32, 1, w_dims, PB_STRIDED_LAST);
    expect_refused(&d, CLATTN_ERR_UNSUPPORTED, "q_bias", "a strided b1");
    const size_t k2[2] = {7, 3};
    RESET(d, good), pb_make_layout(&d_tensors.k, F32, 2, k2, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "k", "k of rank 2 with q of rank 3");
    RESET(d, good), pb_make_layout(&d_tensors.past_k, F32, 3, k_dims, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "past_k", "an SDPA tensor");
    RESET(d, good), d.causal = CLATTN_CAUSAL_ONNX;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "causal", "ONNX alignment");
    RESET(d, good), d.norm = (clattn_norm)7;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "norm", "norm 7");
    const size_t wt_dims[4] = {2, 2, 5, 7};
    RESET(d, good), d.path = CLATTN_PATH_FUSED,
                    pb_make_layout(&d_tensors.weights, F32, 4, wt_dims, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "weights", "weights on the fused path");
    const size_t wt_bad[4] = {2, 1, 5, 7};
    RESET(d, good), pb_make_layout(&d_tensors.weights, F32, 4, wt_bad, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "weights", "weights for 1 head of 2");
    const size_t mask_bad[2] = {5, 6};
    RESET(d, good), pb_make_layout(&d_tensors.attn_mask, F32, 2, mask_bad, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "attn_mask", "a mask for 6 keys of 7");
    /* Another plan kind's refusal of score_weight. */
    clattn_sdpa_desc s;
    clattn_sdpa_desc_init(&s);
    clattn_tensors s_tensors = {0};
    CLATTN_BIND_ROLES(s, s_tensors);
    const size_t sq[4] = {1, 1, 3, 4};
    pb_make_layout(&s_tensors.q, F32, 4, sq, PB_PACKED);
    s_tensors.k = s_tensors.v = s_tensors.out = s_tensors.q;
    s_tensors.score_weight = t->score_weight;
    tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &s, &plan), CLATTN_ERR_INVALID_ARGUMENT,
                     "sdpa with score_weight");
    tu_expect(strstr(clattn_last_error(tu_ctx()), "score_weight") != NULL,
              "sdpa's refusal does not name score_weight: %s", clattn_last_error(tu_ctx()));
    TU_END_TEST();
}
END_TEST

static Suite *additive_suite(void)
{
    Suite *suite = suite_create("additive");
    TCase *tc = tu_tcase(suite, "additive", 600);
    tcase_add_loop_test(tc, test_additive_cases, 0, 2 * CASES);
    tcase_add_test(tc, test_additive_errors);
    return suite;
}

int main(void)
{
    return tu_main("check_additive", additive_suite);
}
