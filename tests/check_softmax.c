/*
 * check_softmax: the normalisation of score rows (the softmax_rows kernel) through SDPA plans
 * with path UNFUSED and the weights output (the normalised scores), against the float64
 * reference: scale, causal, additive and key-padding masks, fully masked rows, relu
 * normalisation, large scores, packed and strided weights, awkward row lengths; and the edges of
 * the per-row vector kernel (CPU parameters): row lengths around 16, every mask dtype, masks
 * and key padding read through key strides 0 and 2, both causal alignments.
 *
 * The scores are chosen exactly: up to 129 keys, q holds the scores and k is the identity
 * (dk = seq_k, one identity matrix shared by every (batch, head) through stride-0 dims), so
 * q kᵀ is the score matrix bit for bit; longer rows (and every row in a reduced run, where the
 * products around the softmax would dominate the simulator's time) use dk = 4 dyadic values,
 * whose dot products are exact in float32 too. The softmax sees what the reference sees.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problems.h"
#include "reference.h"
#include "testutil.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

/* Rows up to this many keys get their scores through an identity k. */
#define IDENTITY_MAX_KEYS 129

enum fully_masked_kind {
    FULLY_MASKED_NONE = 0,
    FULLY_MASKED_BY_PADDING = 1,   /* every key of batch entry 0 is padding */
    FULLY_MASKED_BY_ATTN_MASK = 2, /* attn_mask row 0 is all -inf */
    FULLY_MASKED_BY_CAUSAL = 3     /* causal plus padding of key 0: query 0 keeps nothing */
};

typedef struct softmax_case {
    size_t batch, heads, seq_q, seq_k;
    float scale; /* 0: 1 (the old softmax_rows default); NAN: 1/sqrt(dk) */
    clattn_norm norm;
    int causal, use_attn_mask, use_padding;
    int strided_weights; /* weights written through a padded view (was: in place) */
    float magnitude;     /* scores are uniform in [-magnitude, magnitude) */
    enum fully_masked_kind fully_masked;
} softmax_case;

static void describe(const softmax_case *sc)
{
    tu_set_case("batch=%zu heads=%zu seq_q=%zu seq_k=%zu scale=%g norm=%s causal=%d attn_mask=%d "
                "padding=%d strided_weights=%d magnitude=%g fully_masked=%d",
                sc->batch, sc->heads, sc->seq_q, sc->seq_k, (double)sc->scale,
                sc->norm == CLATTN_NORM_RELU ? "relu" : "softmax", sc->causal, sc->use_attn_mask,
                sc->use_padding, sc->strided_weights, (double)sc->magnitude,
                (int)sc->fully_masked);
}

/* The largest power of two not above x (x > 0). */
static float pow2_floor(float x)
{
    return ldexpf(1.0f, (int)floorf(log2f(x)));
}

/* Exact scores: identity k (rows <= IDENTITY_MAX_KEYS) with q = the score rows, or dk = 4
 * dyadic q and k. Relu cases give query 1 of every head only negative scores (a zero row). */
static void set_scores(pb_sdpa_problem *p, const softmax_case *sc, int identity)
{
    const pb_sdpa_spec *s = &p->spec;
    const size_t heads_total = s->batch * s->heads, seq_k = s->seq_k;
    const int relu_zero_row = sc->norm == CLATTN_NORM_RELU && sc->seq_q > 1;
    if (identity) {
        tu_fill_uniform(p->q, p->q_count, -sc->magnitude, sc->magnitude);
        for (size_t i = 0; i < p->k_count; ++i) {
            p->k[i] = (i / seq_k) % seq_k == i % seq_k ? 1.0f : 0.0f;
        }
        /* one identity for every (batch, head): strides (0, 0, seq_k, 1) */
        p->layouts.k.strides[0] = p->layouts.k.strides[1] = 0;
        p->layouts.k.strides[2] = seq_k;
        p->layouts.k.strides[3] = 1;
        if (relu_zero_row) {
            for (size_t r = 1; r < heads_total * s->seq_q; r += s->seq_q) {
                for (size_t key = 0; key < seq_k; ++key) {
                    p->q[r * seq_k + key] = -fabsf(p->q[r * seq_k + key]) - 0.01f;
                }
            }
        }
        return;
    }
    /* q: multiples of magnitude/4 / 64, k: {-1, -1/2, 0, 1/2, 1}, k's first column > 0. */
    const float unit = pow2_floor(sc->magnitude / 4.0f) / 64.0f;
    for (size_t i = 0; i < p->q_count; ++i) {
        p->q[i] = unit * (float)((int)tu_rand_below(129) - 64);
    }
    for (size_t i = 0; i < p->k_count; ++i) {
        p->k[i] = 0.5f * (float)((int)tu_rand_below(5) - 2);
        if (i % 4 == 0) {
            p->k[i] = 0.5f * (float)(1 + tu_rand_below(2));
        }
    }
    if (relu_zero_row) {
        for (size_t r = 1; r < heads_total * s->seq_q; r += s->seq_q) {
            p->q[r * 4] = -64.0f * unit;
            p->q[r * 4 + 1] = p->q[r * 4 + 2] = p->q[r * 4 + 3] = 0.0f;
        }
    }
}

/* Whether the case's scores come through an identity k (else dk = 4 dyadic values). */
static int identity_scores(const softmax_case *sc)
{
    return sc->seq_k <= IDENTITY_MAX_KEYS && !tu_small();
}

/* What the per-row CPU kernel (tuning softmax_rows > 0) switches on beyond a softmax_case:
 * mask dtype, a mask broadcast along the keys (key stride 0), masks and key padding read with
 * key stride 2 (its gather path), the causal alignment. */
typedef struct softmax_switches {
    pb_mask_kind mask; /* PB_MASK_NONE: as the case says */
    clattn_dtype mask_dtype;
    unsigned mask_ones;      /* PB_MASK_ONES_*: broadcast dims of a rank-4 mask */
    int strided_masks;       /* attn_mask and key padding with key stride 2 */
    clattn_causal causal;    /* NONE: as the case says */
} softmax_switches;

static void make_problem_with(pb_sdpa_problem *p, const softmax_case *sc, int force_identity,
                              const softmax_switches *sw)
{
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = sc->batch;
    spec.heads = sc->heads;
    spec.seq_q = sc->seq_q;
    spec.seq_k = sc->seq_k;
    const int identity = force_identity || identity_scores(sc);
    spec.dk = identity ? sc->seq_k : 4;
    spec.dv = 3;
    spec.scale = sc->scale == 0.0f ? 1.0f : sc->scale;
    spec.norm = sc->norm;
    spec.path = CLATTN_PATH_UNFUSED;
    spec.want_weights = 1;
    spec.causal = sc->causal || sc->fully_masked == FULLY_MASKED_BY_CAUSAL
                      ? CLATTN_CAUSAL_TOP_LEFT
                      : CLATTN_CAUSAL_NONE;
    spec.mask = sc->use_attn_mask ? PB_MASK_FLOAT : PB_MASK_NONE;
    spec.padding = sc->use_padding || sc->fully_masked == FULLY_MASKED_BY_CAUSAL;
    spec.fully_masked = sc->fully_masked == FULLY_MASKED_BY_PADDING     ? 1
                        : sc->fully_masked == FULLY_MASKED_BY_ATTN_MASK ? 2
                                                                        : 0;
    if (sw != NULL && sw->mask != PB_MASK_NONE) {
        spec.mask = sw->mask;
        spec.mask_dtype = sw->mask_dtype;
        spec.mask_rank = 4;
        spec.mask_ones = sw->mask_ones;
    }
    if (sw != NULL && sw->causal != CLATTN_CAUSAL_NONE) {
        spec.causal = sw->causal;
    }
    pb_sdpa_make(p, &spec);
    if (sw != NULL && sw->strided_masks) {
        if (p->mask != NULL) {
            pb_make_layout(&p->layouts.attn_mask, p->spec.mask_dtype, p->mask_rank, p->mask_dims,
                           PB_STRIDED_LAST);
        }
        if (p->padding != NULL) {
            const size_t dims[2] = {sc->batch, sc->seq_k};
            pb_make_layout(&p->layouts.key_padding_mask, CLATTN_DTYPE_U8, 2, dims,
                           PB_STRIDED_LAST);
        }
    }
    set_scores(p, sc, identity);
    if (sc->fully_masked == FULLY_MASKED_BY_CAUSAL) {
        for (size_t b = 0; b < sc->batch; ++b) {
            p->padding[b * sc->seq_k] = 1;
        }
    }
    if (sc->strided_weights) {
        const size_t dims[4] = {sc->batch, sc->heads, sc->seq_q, sc->seq_k};
        pb_make_layout(&p->layouts.weights, CLATTN_DTYPE_F32, 4, dims, PB_PADDED);
    }
    pb_sdpa_reference(p);
}

static void make_problem(pb_sdpa_problem *p, const softmax_case *sc, int force_identity)
{
    make_problem_with(p, sc, force_identity, NULL);
}

static void run_softmax_case_with(const softmax_case *sc, const softmax_switches *sw)
{
    describe(sc);
    pb_sdpa_problem p;
    make_problem_with(&p, sc, 0, sw);
    clattn_status status = pb_sdpa_run(tu_ctx(), &p, NULL);
    tu_expect_status(status, CLATTN_SUCCESS, "pb_sdpa_run (UNFUSED, weights)");
    pb_sdpa_free(&p);
}

static void run_softmax_case(const softmax_case *sc)
{
    run_softmax_case_with(sc, NULL);
}

/* --- tables ------------------------------------------------------------------------------- */

/* Every awkward row length, with the options rotating over the table. */
/* clang-format off */
static const softmax_case awkward_cases[] = {
    {1, 1, 1, 1, 0.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 0, 1.0f, FULLY_MASKED_NONE},
    {2, 3, 4, 1, 0.5f, CLATTN_NORM_SOFTMAX, 0, 1, 0, 1, 3.0f, FULLY_MASKED_NONE},
    {1, 2, 3, 3, 0.0f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 0, 4.0f, FULLY_MASKED_NONE},
    {3, 2, 5, 17, 0.125f, CLATTN_NORM_SOFTMAX, 0, 0, 1, 1, 8.0f, FULLY_MASKED_NONE},
    {2, 4, 7, 63, 1.7f, CLATTN_NORM_SOFTMAX, 1, 1, 1, 0, 2.0f, FULLY_MASKED_NONE},
    {1, 3, 65, 65, 0.3f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 1, 5.0f, FULLY_MASKED_NONE},
    {2, 2, 9, 127, NAN, CLATTN_NORM_SOFTMAX, 0, 1, 0, 0, 10.0f, FULLY_MASKED_NONE},
    {1, 2, 129, 129, 0.7f, CLATTN_NORM_SOFTMAX, 1, 1, 1, 1, 3.0f, FULLY_MASKED_NONE},
    {2, 3, 5, 1000, 0.25f, CLATTN_NORM_SOFTMAX, 0, 1, 1, 0, 6.0f, FULLY_MASKED_NONE},
    {1, 1, 3, 1000, 0.0f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 1, 20.0f, FULLY_MASKED_NONE},
    {2, 2, 3, 17, 0.9f, CLATTN_NORM_RELU, 0, 0, 0, 0, 1.0f, FULLY_MASKED_NONE},
    {1, 3, 6, 65, NAN, CLATTN_NORM_RELU, 1, 1, 0, 1, 2.0f, FULLY_MASKED_NONE},
    {3, 1, 4, 129, 2.0f, CLATTN_NORM_RELU, 0, 1, 1, 0, 1.0f, FULLY_MASKED_NONE},
    {2, 2, 5, 1000, 0.5f, CLATTN_NORM_RELU, 1, 0, 1, 1, 1.0f, FULLY_MASKED_NONE},
    {1, 4, 2, 3, 0.0f, CLATTN_NORM_RELU, 0, 0, 0, 1, 1.0f, FULLY_MASKED_NONE},
    {2, 2, 63, 63, 0.0f, CLATTN_NORM_RELU, 1, 0, 0, 0, 1.0f, FULLY_MASKED_NONE},
};
/* clang-format on */

/* Causal masks with seq_q == seq_k, seq_q < seq_k and seq_q > seq_k (top-left aligned; the
 * bottom-right alignment is in check_plan and check_flash). */
/* clang-format off */
static const softmax_case causal_cases[] = {
    {2, 3, 17, 17, 0.5f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 0, 4.0f, FULLY_MASKED_NONE},
    {1, 2, 5, 63, 0.0f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 0, 4.0f, FULLY_MASKED_NONE},
    {2, 1, 65, 17, 1.0f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 1, 4.0f, FULLY_MASKED_NONE},
    {1, 2, 129, 3, 0.0f, CLATTN_NORM_SOFTMAX, 1, 1, 0, 0, 4.0f, FULLY_MASKED_NONE},
    {2, 2, 3, 129, 0.8f, CLATTN_NORM_RELU, 1, 0, 0, 0, 1.0f, FULLY_MASKED_NONE},
    {1, 1, 65, 65, 0.0f, CLATTN_NORM_RELU, 1, 0, 1, 1, 1.0f, FULLY_MASKED_NONE},
};
/* clang-format on */

/* Rows with every key masked: exact zeros, never NaN, for both normalisations. */
/* clang-format off */
static const softmax_case fully_masked_cases[] = {
    {2, 3, 4, 17, 0.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 0, 3.0f, FULLY_MASKED_BY_PADDING},
    {2, 2, 5, 3, 0.5f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 1, 3.0f, FULLY_MASKED_BY_ATTN_MASK},
    {3, 2, 7, 65, 0.0f, CLATTN_NORM_SOFTMAX, 0, 1, 0, 0, 3.0f, FULLY_MASKED_BY_CAUSAL},
    {1, 1, 1, 1, 0.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 0, 3.0f, FULLY_MASKED_BY_PADDING},
    {2, 2, 3, 129, 0.0f, CLATTN_NORM_SOFTMAX, 1, 1, 1, 1, 3.0f, FULLY_MASKED_BY_ATTN_MASK},
    {2, 3, 4, 17, 0.0f, CLATTN_NORM_RELU, 0, 0, 0, 0, 1.0f, FULLY_MASKED_BY_PADDING},
    {2, 2, 5, 63, 1.5f, CLATTN_NORM_RELU, 0, 0, 0, 1, 1.0f, FULLY_MASKED_BY_ATTN_MASK},
    {2, 1, 6, 1000, 0.0f, CLATTN_NORM_RELU, 0, 0, 0, 0, 1.0f, FULLY_MASKED_BY_CAUSAL},
};
/* clang-format on */

/* Scores of magnitude 1e4: no overflow and no NaN. The scales are powers of two so that the
 * float32 product scale * score is exact and the float64 reference is a fair target. */
/* clang-format off */
static const softmax_case large_score_cases[] = {
    {2, 2, 3, 3, 1.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 0, 1e4f, FULLY_MASKED_NONE},
    {1, 2, 5, 65, 0.5f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 1, 1e4f, FULLY_MASKED_NONE},
    {2, 1, 4, 1000, 0.0f, CLATTN_NORM_SOFTMAX, 1, 0, 1, 0, 1e4f, FULLY_MASKED_NONE},
    {1, 1, 7, 129, 2.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 0, 3e4f, FULLY_MASKED_NONE},
    {1, 2, 4, 63, 0.25f, CLATTN_NORM_RELU, 0, 0, 0, 0, 1e4f, FULLY_MASKED_NONE},
    /* rows longer than 256 keys without masks: the max is wherever it falls, so a reduction
     * that misses lanes of a 256-wide group (GPU parameters) overflows */
    {1, 2, 5, 257, 1.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 0, 1e4f, FULLY_MASKED_NONE},
};
/* clang-format on */

START_TEST(test_softmax_awkward)
{
    TU_BEGIN_TEST();
    run_softmax_case(&awkward_cases[_i]);
    TU_END_TEST();
}
END_TEST

START_TEST(test_softmax_causal)
{
    TU_BEGIN_TEST();
    run_softmax_case(&causal_cases[_i]);
    TU_END_TEST();
}
END_TEST

START_TEST(test_softmax_fully_masked)
{
    TU_BEGIN_TEST();
    run_softmax_case(&fully_masked_cases[_i]);
    TU_END_TEST();
}
END_TEST

START_TEST(test_softmax_large_scores)
{
    TU_BEGIN_TEST();
    run_softmax_case(&large_score_cases[_i]);
    TU_END_TEST();
}
END_TEST

/* Every row length from the awkward list, packed and strided weights, all masks at once. */
START_TEST(test_softmax_all_masks_both_placements)
{
    TU_BEGIN_TEST();
    static const size_t lengths[] = {1, 3, 17, 63, 65, 127, 129, 1000};
    /* clang-format off */
    softmax_case sc = {2, 3, 3, lengths[_i], 0.37f, CLATTN_NORM_SOFTMAX, 1, 1, 1, 0, 4.0f,
                       FULLY_MASKED_NONE};
    /* clang-format on */
    run_softmax_case(&sc);
    sc.strided_weights = 1;
    run_softmax_case(&sc);
    TU_END_TEST();
}
END_TEST

/* The per-row vector kernel's edges: row lengths around its 16-key vectors (whole vectors, a
 * tail, a tail only), 1 and 7 rows per (batch, head), under each switch it has: mask dtypes,
 * a key-broadcast mask (stride 0) and masks read with key stride 2 (gathered), key padding,
 * both causal alignments (BOTTOM_RIGHT with seq_q > seq_k leaves rows empty), relu, fully
 * masked rows, in place and strided weights. (On GPU parameters they run the group kernel.) */
static const size_t vec_lengths[] = {1, 3, 15, 16, 17, 63, 65, 127, 129, 1031};
#define VEC_CONFIGS 8

START_TEST(test_softmax_vec_edges)
{
    TU_BEGIN_TEST();
    const size_t seq_k = vec_lengths[_i / VEC_CONFIGS];
    const int config = _i % VEC_CONFIGS;
    /* clang-format off */
    static const softmax_case base[VEC_CONFIGS] = {
        {2, 1, 7, 0, 0.5f, CLATTN_NORM_SOFTMAX, 0, 0, 1, 0, 6.0f, FULLY_MASKED_NONE},
        {1, 1, 1, 0, 0.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 1, 4.0f, FULLY_MASKED_NONE},
        {1, 2, 7, 0, NAN, CLATTN_NORM_SOFTMAX, 0, 0, 1, 0, 8.0f, FULLY_MASKED_NONE},
        {2, 1, 7, 0, 0.7f, CLATTN_NORM_RELU, 0, 0, 0, 1, 1.0f, FULLY_MASKED_NONE},
        {1, 3, 1, 0, 1.0f, CLATTN_NORM_SOFTMAX, 0, 0, 1, 0, 20.0f, FULLY_MASKED_NONE},
        {1, 1, 7, 0, 0.3f, CLATTN_NORM_RELU, 0, 0, 0, 1, 1.0f, FULLY_MASKED_NONE},
        {2, 1, 7, 0, 0.0f, CLATTN_NORM_SOFTMAX, 0, 0, 1, 0, 3.0f, FULLY_MASKED_BY_ATTN_MASK},
        {2, 2, 1, 0, 2.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 1, 1e4f, FULLY_MASKED_BY_PADDING},
    };
    static const softmax_switches switches[VEC_CONFIGS] = {
        {PB_MASK_FLOAT, CLATTN_DTYPE_F32, 0, 0, CLATTN_CAUSAL_NONE},
        {PB_MASK_FLOAT, CLATTN_DTYPE_F16, PB_MASK_ONES_LK, 0, CLATTN_CAUSAL_TOP_LEFT},
        {PB_MASK_FLOAT, CLATTN_DTYPE_BF16, 0, 1, CLATTN_CAUSAL_BOTTOM_RIGHT},
        {PB_MASK_BOOL, CLATTN_DTYPE_U8, PB_MASK_ONES_B, 0, CLATTN_CAUSAL_NONE},
        {PB_MASK_BOOL, CLATTN_DTYPE_U8, PB_MASK_ONES_H, 1, CLATTN_CAUSAL_NONE},
        {PB_MASK_NONE, CLATTN_DTYPE_F32, 0, 0, CLATTN_CAUSAL_BOTTOM_RIGHT},
        {PB_MASK_FLOAT, CLATTN_DTYPE_F32, PB_MASK_ONES_H, 1, CLATTN_CAUSAL_NONE},
        {PB_MASK_FLOAT, CLATTN_DTYPE_F16, PB_MASK_ONES_LQ, 0, CLATTN_CAUSAL_TOP_LEFT},
    };
    /* clang-format on */
    softmax_case sc = base[config];
    sc.seq_k = seq_k;
    run_softmax_case_with(&sc, &switches[config]);
    TU_END_TEST();
}
END_TEST

/* Very long rows, and more rows than one grid dimension holds on some devices (65535): 69300
 * rows of 33 (batch, head) pairs and 70000 rows of 10 (thousands of queries each, so that the
 * batched products around the softmax stay few; many pairs are check_attention's). */
/* clang-format off */
static const softmax_case long_cases[] = {
    {1, 1, 2, 20000, 0.0f, CLATTN_NORM_SOFTMAX, 0, 1, 1, 0, 8.0f, FULLY_MASKED_NONE},
    {2, 1, 3, 4097, 0.5f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 1, 8.0f, FULLY_MASKED_NONE},
    {1, 1, 2, 20000, 0.0f, CLATTN_NORM_RELU, 0, 0, 1, 0, 1.0f, FULLY_MASKED_NONE},
    {3, 11, 2100, 3, 0.0f, CLATTN_NORM_SOFTMAX, 1, 1, 1, 0, 4.0f, FULLY_MASKED_NONE},
    {2, 5, 7000, 2, 1.0f, CLATTN_NORM_SOFTMAX, 0, 0, 1, 1, 4.0f, FULLY_MASKED_BY_PADDING},
};
/* clang-format on */

START_TEST(test_softmax_long)
{
    TU_BEGIN_TEST();
    run_softmax_case(&long_cases[_i]);
    TU_END_TEST();
}
END_TEST

/* Random configurations over every option. */
START_TEST(test_softmax_random)
{
    TU_BEGIN_TEST();
    static const size_t lengths[] = {1, 3, 17, 63, 65, 127, 129, 1000};
    const size_t draw_scale = tu_rand_below(4);
    const int small = tu_small(); /* rows up to 65 queries and 129 keys, 1 or 2 heads */
    softmax_case sc = {
        .batch = 1 + tu_rand_below(3),
        .heads = 1 + tu_rand_below(small ? 2 : 4),
        .seq_q = lengths[tu_rand_below(small ? 5 : 7)],
        .seq_k = lengths[tu_rand_below(small ? 7 : 8)],
        .scale = draw_scale == 0   ? 0.0f
                 : draw_scale == 1 ? NAN
                                   : (float)(0.1 + 2.0 * tu_rand_unit()),
        .norm = tu_rand_below(3) == 0 ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX,
        .causal = (int)tu_rand_below(2),
        .use_attn_mask = (int)tu_rand_below(2),
        .use_padding = (int)tu_rand_below(2),
        .strided_weights = (int)tu_rand_below(2),
        .magnitude = (float)(1.0 + 9.0 * tu_rand_unit()),
        .fully_masked = (enum fully_masked_kind)tu_rand_below(4),
    };
    run_softmax_case(&sc);
    TU_END_TEST();
}
END_TEST

/* Row max far from zero and a single dominant key: the result is one-hot, no NaN. */
START_TEST(test_softmax_extreme_rows)
{
    TU_BEGIN_TEST();
    const size_t seq_k = 65, rows = 4;
    softmax_case sc = {1, 1, rows, seq_k, 1.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 0, 1.0f,
                       FULLY_MASKED_NONE};
    describe(&sc);
    tu_set_case("extreme rows seq_k=%zu", seq_k);
    pb_sdpa_problem p;
    make_problem(&p, &sc, 1);
    for (size_t key = 0; key < seq_k; ++key) {
        p.q[0 * seq_k + key] = key == 7 ? 3e4f : -3e4f; /* one-hot at key 7 */
        p.q[1 * seq_k + key] = -1e30f;                  /* all equal, huge negative */
        p.q[2 * seq_k + key] = 1e30f;                   /* all equal, huge positive */
        p.q[3 * seq_k + key] = key == seq_k - 1 ? 0.0f : -FLT_MAX;
    }
    pb_sdpa_reference(&p);
    clattn_status status = pb_sdpa_run(tu_ctx(), &p, NULL);
    tu_expect_status(status, CLATTN_SUCCESS, "pb_sdpa_run");
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* The returned event completes the work, and a wait list is honoured: the scores are written
 * by a non-blocking write whose event the execution waits for. */
START_TEST(test_softmax_events)
{
    TU_BEGIN_TEST();
    softmax_case sc = {2, 3, 1, 33, 2.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 0, 1.0f,
                       FULLY_MASKED_NONE};
    describe(&sc);
    clattn_ctx *ctx = tu_ctx();
    pb_sdpa_problem p;
    make_problem(&p, &sc, 0);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_plan *plan = NULL;
    clattn_tensors bound;
    memset(&bound, 0, sizeof bound);
    cl_event written = NULL, done = NULL;
    float *staging = NULL;
    clattn_status status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_sdpa_plan_create") &&
        pb_sdpa_upload(ctx, &p, &bound) == CL_SUCCESS) {
        /* q is packed F32 here: overwrite it with NaN, then write the scores asynchronously
         * (the whole buffer from offset 0, NaN around the tensor) */
        tu_expect(pb_rewrite(ctx, NULL, &bound.q, NULL) == CL_SUCCESS, "poisoning q failed");
        const size_t total = bound.q.offset + p.q_count + 3; /* pb_upload's buffer size */
        staging = tu_nan_floats(total);
        memcpy(staging + bound.q.offset, p.q, p.q_count * sizeof(float));
        cl_int err = clEnqueueWriteBuffer(clattn_ctx_queue(ctx), bound.q.mem, CL_FALSE, 0,
                                          total * sizeof(float), staging, 0, NULL, &written);
        tu_expect(err == CL_SUCCESS, "clEnqueueWriteBuffer: %d", err);
        status = clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 1,
                                     &written, &done);
        if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_plan_execute") &&
            tu_expect(done != NULL, "no event returned")) {
            tu_expect(clWaitForEvents(1, &done) == CL_SUCCESS, "clWaitForEvents failed");
            cl_int state = 0;
            clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state, NULL);
            tu_expect(state == CL_COMPLETE, "event status %d after wait", state);
            pb_sdpa_check(ctx, NULL, &p, &bound);
        }
    }
    if (done != NULL) {
        clReleaseEvent(done);
    }
    if (written != NULL) {
        clWaitForEvents(1, &written);
        clReleaseEvent(written);
    }
    clattn_finish(ctx);
    free(staging);
    pb_release_tensors(&bound);
    clattn_plan_release(plan);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

static Suite *softmax_suite(void)
{
    Suite *suite = suite_create("softmax");
    /* A reduced run (CLATTN_TEST_SCALE=small, for Oclgrind) leaves out the rows of 1000 keys
     * and more (the batched products around the softmax take minutes there) and the long
     * cases; every kernel variant still runs on the shorter rows. */
    const int small = tu_small();
    static const int awkward_heavy[] = {8, 9, 13};
    static const int fully_masked_heavy[] = {7};
    static const int large_heavy[] = {2};
    
    if (small)
        tu_not_run("test_softmax_awkward 8, 9, 13, test_softmax_all_masks_both_placements 7, "
                   "test_softmax_fully_masked 7, test_softmax_large_scores 2 (1000 keys), "
                   "test_softmax_long (4097 and 20000 keys, 69300 and 70000 rows), "
                   "test_softmax_random with 1000 keys, 129 queries or more than 2 heads, "
                   "test_softmax_vec_edges with 1031 keys: "
                   "minutes each on Oclgrind");
    TCase *shapes = tu_tcase(suite, "shapes", 600);
    tu_add_loop_except(shapes, test_softmax_awkward, 0, COUNT_OF(awkward_cases), awkward_heavy,
                       small ? COUNT_OF(awkward_heavy) : 0);
    tcase_add_loop_test(shapes, test_softmax_all_masks_both_placements, 0, small ? 7 : 8);
    tcase_add_loop_test(shapes, test_softmax_random, 0, 24);
    /* the 1031-key rows (the last VEC_CONFIGS) are left out of reduced runs */
    tcase_add_loop_test(shapes, test_softmax_vec_edges, 0,
                        (COUNT_OF(vec_lengths) - (small ? 1 : 0)) * VEC_CONFIGS);
    if (!small)
        tcase_add_loop_test(shapes, test_softmax_long, 0, COUNT_OF(long_cases));

    /* "masks" is the case tests/oclgrind_lane.sh's canary runs (CK_RUN_CASE=masks). */
    TCase *masks = tu_tcase(suite, "masks", 600);
    tcase_add_loop_test(masks, test_softmax_causal, 0, COUNT_OF(causal_cases));
    tu_add_loop_except(masks, test_softmax_fully_masked, 0, COUNT_OF(fully_masked_cases),
                       fully_masked_heavy, small ? COUNT_OF(fully_masked_heavy) : 0);

    TCase *numerics = tu_tcase(suite, "numerics", 600);
    tu_add_loop_except(numerics, test_softmax_large_scores, 0, COUNT_OF(large_score_cases),
                       large_heavy, small ? COUNT_OF(large_heavy) : 0);
    tcase_add_test(numerics, test_softmax_extreme_rows);
    tcase_add_test(numerics, test_softmax_events);
    return suite;
}

int main(void)
{
    return tu_main("check_softmax", softmax_suite);
}
