/*
 * check_rope: rotary plans (clattn_rope_plan_create) against the float64 reference on fresh
 * random inputs: both pair conventions, partial rotary dims, computed angles (from a start
 * position or I32 position ids) and ONNX's cos/sin caches (by position, with ids clamped at
 * both ends; by row), every float dtype, packed, (B, S, H*d) and strided layouts, in place; a
 * decode step at offset P equal bit for bit to rows P.. of the whole sequence; computed angles
 * near position 2^24, from the host's table and from the device (a sequence too long for the
 * table); every refusal. Rotary embeddings inside SDPA plans (clattn_sdpa_desc.rope): both
 * paths and styles, partial rotary dims, grouped heads, Lq != Lk, a start position, positions
 * near 2^24, a KV cache (present_k = past + the rotated new keys), q and k left untouched; a
 * decode step at P equal to row P of the whole sequence; the refusals. Outputs are poisoned
 * first; stray writes are counted.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problems.h"
#include "reference.h"
#include "testutil.h"

#define F32 CLATTN_DTYPE_F32
#define F16 CLATTN_DTYPE_F16
#define BF16 CLATTN_DTYPE_BF16
#define HALVES CLATTN_ROPE_HALVES
#define PAIRS CLATTN_ROPE_PAIRS

enum { COMPUTED = 0, BY_POSITION = 1, BY_ROW = 2 };

typedef struct rope_case {
    size_t batch, heads, seq, dim, rot; /* rot 0: dim */
    clattn_rope_style style;
    int angles;   /* COMPUTED, BY_POSITION (caches + ids), BY_ROW (caches) */
    int ids;      /* COMPUTED: position ids instead of start */
    size_t start; /* COMPUTED without ids */
    double base;  /* COMPUTED: 0 = 10000 */
    int inplace;  /* out is x */
    clattn_dtype x_dtype, out_dtype, cache_dtype;
    pb_layout layout; /* of x and out */
} rope_case;

/* clang-format off */
static const rope_case cases[] = {
    /* B  H   S   d  rot  style  angles      ids start base inpl x     out   cache layout */
    {1, 1,   1,  2,  0, HALVES, COMPUTED,    0,  0,   0,   0, F32,  F32,  F32, PB_PACKED},
    {2, 4,   3,  8,  0, HALVES, BY_POSITION, 1,  0,   0,   0, F32,  F32,  F32, PB_PACKED},
    {2, 4,   3,  8,  0, PAIRS,  BY_POSITION, 1,  0,   0,   0, F32,  F32,  F32, PB_SEQ_MAJOR},
    {2, 4,   3,  8,  4, HALVES, BY_ROW,      0,  0,   0,   0, F32,  F32,  F32, PB_PACKED},
    {2, 4,   3,  8,  4, PAIRS,  BY_ROW,      0,  0,   0,   1, F32,  F32,  F32, PB_PADDED},
    {3, 2,  17, 64,  0, HALVES, COMPUTED,    0,  5,   0,   0, F32,  F32,  F32, PB_SEQ_MAJOR},
    {1, 3,  63, 17, 16, PAIRS,  COMPUTED,    1,  0, 500,   1, F16,  F16,  F32, PB_STRIDED_LAST},
    {2, 5, 129,128, 64, HALVES, COMPUTED,    0, 1000, 0,   0, BF16, F32,  F32, PB_SEQ_MAJOR_PADDED},
    {1, 2,  65,  3,  2, PAIRS,  BY_POSITION, 1,  0,   0,   0, F32,  BF16, F16, PB_PACKED},
    {2, 1,  31, 32, 32, HALVES, BY_ROW,      0,  0,   0,   1, F16,  F16,  BF16, PB_PADDED},
};
/* clang-format on */

/* The case's position of row (b, s): its id, clamped to [0, rows - 1] with a cache by
 * position, or start + s. */
static size_t position(const rope_case *c, const int32_t *ids, size_t rows, size_t b, size_t s)
{
    if (!ids)
        return c->start + s;
    const int32_t id = ids[b * c->seq + s];
    size_t pos = id < 0 ? 0 : (size_t)id;
    if (c->angles == BY_POSITION && pos >= rows)
        pos = rows - 1;
    return pos;
}

START_TEST(test_rope_cases)
{
    TU_BEGIN_TEST();
    const rope_case *c = &cases[_i];
    const size_t rot = c->rot ? c->rot : c->dim, half = rot / 2;
    const size_t rows = 23; /* a cache by position: ids drawn in [-2, rows + 2) */
    tu_set_case("rope B=%zu H=%zu S=%zu d=%zu rot=%zu %s angles=%d ids=%d start=%zu base=%g "
                "inplace=%d x=%s out=%s cache=%s layout=%s",
                c->batch, c->heads, c->seq, c->dim, rot, c->style == PAIRS ? "pairs" : "halves",
                c->angles, c->ids, c->start, c->base, c->inplace, pb_dtype_name(c->x_dtype),
                pb_dtype_name(c->out_dtype), pb_dtype_name(c->cache_dtype),
                pb_layout_name(c->layout));
    const size_t count = c->batch * c->heads * c->seq * c->dim;
    float *x = tu_random_floats(count);
    pb_round_array(c->x_dtype, x, count);
    int32_t *ids = NULL;
    const int with_ids = c->angles == BY_POSITION || c->ids;
    if (with_ids) {
        ids = calloc(c->batch * c->seq, sizeof *ids);
        for (size_t e = 0; e < c->batch * c->seq; ++e)
            ids[e] = c->angles == BY_POSITION ? (int32_t)tu_rand_below(rows + 4) - 2
                                              : (int32_t)tu_rand_below(5000);
    }
    /* The caches (as uploaded: rounded to their dtype) and the angles per (b, s, j). */
    const size_t cache_count = c->angles == BY_POSITION ? rows * half : c->batch * c->seq * half;
    float *cos_cache = NULL, *sin_cache = NULL;
    if (c->angles != COMPUTED) {
        cos_cache = tu_floats(cache_count);
        sin_cache = tu_floats(cache_count);
        for (size_t e = 0; e < cache_count; ++e) {
            const double t = 10.0 * tu_rand_unit();
            cos_cache[e] = (float)cos(t);
            sin_cache[e] = (float)sin(t);
        }
        pb_round_array(c->cache_dtype, cos_cache, cache_count);
        pb_round_array(c->cache_dtype, sin_cache, cache_count);
    }
    double *cosv = tu_doubles(c->batch * c->seq * half),
           *sinv = tu_doubles(c->batch * c->seq * half);
    const double base = c->base == 0.0 ? 10000.0 : c->base;
    for (size_t b = 0; b < c->batch; ++b) {
        for (size_t s = 0; s < c->seq; ++s) {
            const size_t pos = position(c, ids, rows, b, s);
            for (size_t j = 0; j < half; ++j) {
                const size_t at = (b * c->seq + s) * half + j;
                if (c->angles == COMPUTED) {
                    const double t = (double)pos * pow(base, -2.0 * (double)j / (double)rot);
                    cosv[at] = cos(t), sinv[at] = sin(t);
                } else {
                    const size_t from = c->angles == BY_POSITION ? pos * half + j : at;
                    cosv[at] = cos_cache[from], sinv[at] = sin_cache[from];
                }
            }
        }
    }
    double *want = tu_doubles(count);
    ref_rope(c->batch, c->heads, c->seq, c->dim, rot, c->style == PAIRS, x, cosv, sinv, want);

    clattn_rope_desc desc;
    clattn_rope_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.style = c->style;
    desc.rotary_dim = PB_OR(c->rot, CLATTN_ROPE_WHOLE_HEAD);
    desc.base = PB_OR(c->base, CLATTN_ROPE_BASE_DEFAULT);
    desc.start = c->start;
    clattn_tensors *t = &desc_tensors;
    const size_t dims[4] = {c->batch, c->heads, c->seq, c->dim};
    pb_make_layout(&t->q, c->x_dtype, 4, dims, c->layout);
    if (c->inplace)
        t->out = t->q;
    else
        pb_make_layout(&t->out, c->out_dtype, 4, dims, c->layout);
    const size_t by_position[2] = {rows, half}, by_row[3] = {c->batch, c->seq, half};
    if (c->angles != COMPUTED) {
        pb_make_layout(&t->rope_cos, c->cache_dtype, c->angles == BY_POSITION ? 2 : 3,
                       c->angles == BY_POSITION ? by_position : by_row, PB_PACKED);
        t->rope_sin = t->rope_cos;
    }
    const size_t id_dims[2] = {c->batch, c->seq};
    if (with_ids)
        pb_make_layout(&t->position_ids, CLATTN_DTYPE_I32, 2, id_dims, PB_PACKED);

    clattn_plan *plan = NULL;
    if (tu_expect_status(clattn_rope_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                         "clattn_rope_plan_create")) {
        clattn_tensors bound = desc_tensors;
        float *ids_f = NULL;
        if (with_ids) {
            ids_f = tu_floats(c->batch * c->seq);
            for (size_t e = 0; e < c->batch * c->seq; ++e)
                ids_f[e] = (float)ids[e];
        }
        cl_int err = pb_upload(tu_ctx(), &bound.q, tu_rand_below(5), x);
        if (err == CL_SUCCESS && c->inplace)
            bound.out = bound.q;
        else if (err == CL_SUCCESS)
            err = pb_upload(tu_ctx(), &bound.out, tu_rand_below(5), NULL);
        if (err == CL_SUCCESS && c->angles != COMPUTED)
            err = pb_upload(tu_ctx(), &bound.rope_cos, 0, cos_cache);
        if (err == CL_SUCCESS && c->angles != COMPUTED)
            err = pb_upload(tu_ctx(), &bound.rope_sin, 2, sin_cache);
        if (err == CL_SUCCESS && with_ids)
            err = pb_upload(tu_ctx(), &bound.position_ids, 1, ids_f);
        if (tu_expect(err == CL_SUCCESS, "uploads failed (%d)", (int)err) &&
            tu_expect_status(clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                                 0, NULL, NULL),
                             CLATTN_SUCCESS, "clattn_plan_execute")) {
            float *got = tu_nan_floats(count);
            size_t stray = 0;
            if (pb_download(tu_ctx(), NULL, &bound.out, got, &stray) == CL_SUCCESS) {
                const clattn_dtype out_dtype = c->inplace ? c->x_dtype : c->out_dtype;
                const double unit = out_dtype == F16    ? ldexp(1.0, -11)
                                    : out_dtype == BF16 ? ldexp(1.0, -8)
                                                        : ldexp(1.0, -23);
                size_t wrong = 0, first = count;
                for (size_t e = 0; e < count; ++e) {
                    const double err_e = fabs((double)got[e] - want[e]);
                    /* |x1| + |x2| <= 2: the angle's 2e-6, the products' and the output's
                     * rounding */
                    if (!(err_e <= 4e-6 + 2.0 * unit * (1.0 + fabs(want[e]))) && wrong++ == 0)
                        first = e;
                }
                tu_expect(wrong == 0, "%zu of %zu values wrong; the first, %zu: got %.9g want %.9g",
                          wrong, count, first, first < count ? (double)got[first] : 0.0,
                          first < count ? want[first] : 0.0);
                tu_expect(stray == 0, "%zu elements written outside out", stray);
                if (out_dtype == F32)
                    tu_track_error(tu_abs_error(got, want, count));
            }
            free(got);
        }
        pb_release_tensors(&bound);
        free(ids_f);
    }
    clattn_plan_release(plan);
    free(want);
    free(sinv);
    free(cosv);
    free(sin_cache);
    free(cos_cache);
    free(ids);
    free(x);
    TU_END_TEST();
}
END_TEST

/* Runs a computed-angle plan on packed F32 x (b, h, s, d) from `start`; returns out. */
static float *run_computed(const float *x, const size_t dims[4], size_t start,
                           clattn_rope_style style)
{
    clattn_rope_desc desc;
    clattn_rope_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.style = style;
    desc.start = start;
    pb_make_layout(&desc_tensors.q, F32, 4, dims, PB_PACKED);
    pb_make_layout(&desc_tensors.out, F32, 4, dims, PB_PACKED);
    const size_t count = dims[0] * dims[1] * dims[2] * dims[3];
    float *got = tu_nan_floats(count);
    clattn_plan *plan = NULL;
    if (tu_expect_status(clattn_rope_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                         "clattn_rope_plan_create")) {
        clattn_tensors bound = desc_tensors;
        if (pb_upload(tu_ctx(), &bound.q, 0, x) == CL_SUCCESS &&
            pb_upload(tu_ctx(), &bound.out, 0, NULL) == CL_SUCCESS &&
            tu_expect_status(clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                                 0, NULL, NULL),
                             CLATTN_SUCCESS, "clattn_plan_execute"))
            pb_download(tu_ctx(), NULL, &bound.out, got, NULL);
        pb_release_tensors(&bound);
    }
    clattn_plan_release(plan);
    return got;
}

/* A decode step at offset P (one row, start = P) equals row P of the whole sequence (start 0)
 * bit for bit, for each P; _i: the style. */
START_TEST(test_rope_decode_offset)
{
    TU_BEGIN_TEST();
    const clattn_rope_style style = _i ? PAIRS : HALVES;
    enum { B = 2, H = 3, S = 40, D = 16 };
    tu_set_case("rope decode steps against the whole sequence, %s", _i ? "pairs" : "halves");
    const size_t dims[4] = {B, H, S, D}, one[4] = {B, H, 1, D};
    float *x = tu_random_floats((size_t)B * H * S * D);
    float *whole = run_computed(x, dims, 0, style);
    float *row = tu_floats((size_t)B * H * D);
    size_t mismatched = 0;
    for (size_t p = 0; p < S; p += 13) {
        for (size_t bh = 0; bh < B * H; ++bh)
            memcpy(row + bh * D, x + (bh * S + p) * D, D * sizeof(float));
        float *step = run_computed(row, one, p, style);
        for (size_t bh = 0; bh < B * H; ++bh)
            if (memcmp(step + bh * D, whole + (bh * S + p) * D, D * sizeof(float)) != 0)
                ++mismatched;
        free(step);
    }
    tu_expect(mismatched == 0, "%zu decode-step rows differ from the whole sequence's", mismatched);
    free(row);
    free(whole);
    free(x);
    TU_END_TEST();
}
END_TEST

/* The device's rope of x (one head: S rows of D, positions start ..; `pairs` as
 * ref_rope takes it) against float64 angles base 10000: the largest absolute error, which must
 * be within 5e-6. */
static double expect_float64_angles(const float *x, const float *got, size_t S, size_t D,
                                    size_t start, int pairs)
{
    double *cosv = tu_doubles(S * D / 2), *sinv = tu_doubles(S * D / 2);
    for (size_t s = 0; s < S; ++s)
        for (size_t j = 0; j < D / 2; ++j) {
            const double t = (double)(start + s) * pow(10000.0, -2.0 * (double)j / D);
            cosv[s * D / 2 + j] = cos(t), sinv[s * D / 2 + j] = sin(t);
        }
    double *want = tu_doubles(S * D);
    ref_rope(1, 1, S, D, D, pairs, x, cosv, sinv, want);
    const double err = tu_abs_error(got, want, S * D);
    tu_expect(err <= 5e-6, "largest error %.3g", err);
    free(want);
    free(sinv);
    free(cosv);
    return err;
}

/* Computed angles at the last positions below 2^24 (x = 1 in every column: each output is
 * cos t - sin t or sin t + cos t) within 5e-6 of float64. */
START_TEST(test_rope_far_positions)
{
    TU_BEGIN_TEST();
    enum { S = 50, D = 32 };
    const size_t start = ((size_t)1 << 24) - S;
    tu_set_case("rope positions %zu .. %zu", start, start + S - 1);
    const size_t dims[4] = {1, 1, S, D};
    float *x = tu_floats((size_t)S * D);
    for (size_t e = 0; e < (size_t)S * D; ++e)
        x[e] = 1.0f;
    float *got = run_computed(x, dims, start, HALVES);
    const double err = expect_float64_angles(x, got, S, D, start, 0);
    printf("check_rope: positions %zu .. %zu: largest error %.3g\n", start, start + S - 1, err);
    free(got);
    free(x);
    TU_END_TEST();
}
END_TEST

/* Computed angles on the device: positions known at creation make a table of at most 2^22
 * angles (in double on the host); past that the kernel computes them (position_angle). 33000
 * rows of 128 pairs (4224000 angles) from position 100, against float64. */
START_TEST(test_rope_untabled)
{
    TU_BEGIN_TEST();
    enum { S = 33000, D = 256 };
    tu_set_case("rope computed on the device: %d rows of %d columns from position 100", S, D);
    const size_t dims[4] = {1, 1, S, D}, count = (size_t)S * D;
    float *x = tu_random_floats(count);
    float *got = run_computed(x, dims, 100, PAIRS);
    const double err = expect_float64_angles(x, got, S, D, 100, 1);
    printf("check_rope: %d rows computed on the device: largest error %.3g\n", S, err);
    free(got);
    free(x);
    TU_END_TEST();
}
END_TEST

#define expect_refused(desc, want, needle, call)                                                   \
    TU_EXPECT_REFUSED(clattn_rope_plan_create, "rope", desc, want, needle, call)

START_TEST(test_rope_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("rope plan refusals");
    const size_t dims[4] = {2, 3, 5, 8}, ids[2] = {2, 5}, cache[2] = {9, 4};
    clattn_rope_desc good;
    clattn_rope_desc_init(&good);
    clattn_tensors good_tensors = {0};
    CLATTN_BIND_ROLES(good, good_tensors);
    pb_make_layout(&good_tensors.q, F32, 4, dims, PB_PACKED);
    pb_make_layout(&good_tensors.out, F32, 4, dims, PB_PACKED);
    TU_EXPECT_PLAN_BASICS(clattn_rope_plan_create, good);
    clattn_plan *plan = NULL;
    clattn_tensors d_tensors = good_tensors;
    clattn_rope_desc d = good;
    CLATTN_BIND_ROLES(d, d_tensors);
    d.struct_size = 8;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "struct_size", "struct_size");
    RESET(d, good), d.style = (clattn_rope_style)2;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "style", "style 2");
    RESET(d, good), memset(&d_tensors.out, 0, sizeof d_tensors.out);
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "out", "out absent");
    RESET(d, good), pb_make_layout(&d_tensors.q, F32, 3, dims + 1, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "rank", "x of rank 3");
    RESET(d, good), d.rotary_dim = 5;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "rotary_dim", "odd rotary_dim");
    RESET(d, good), d.rotary_dim = 10;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "rotary_dim", "rotary_dim past head_dim");
    RESET(d, good), d.rotary_dim = 0; /* 0 meant "all" before 0.7: CLATTN_ROPE_WHOLE_HEAD now */
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "CLATTN_ROPE_WHOLE_HEAD", "rotary_dim 0");
    RESET(d, good), d.base = -3.0;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "base", "negative base");
    RESET(d, good), d.base = 0.0; /* 0 meant 10000 before 0.7: CLATTN_ROPE_BASE_DEFAULT now */
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "CLATTN_ROPE_BASE_DEFAULT", "base 0");
    RESET(d, good), d.start = ((size_t)1 << 24);
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "2^24", "positions past 2^24");
    RESET(d, good), d_tensors.k = d_tensors.q;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT,
                   "k was given, but this plan takes only x, out, rope_cos, rope_sin, "
                   "position_ids",
                   "k set");
    RESET(d, good), pb_make_layout(&d_tensors.position_ids, F32, 2, ids, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "position_ids", "F32 position ids");
    RESET(d, good), pb_make_layout(&d_tensors.position_ids, CLATTN_DTYPE_I32, 2, cache, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "position_ids", "ids of another shape");
    RESET(d, good), pb_make_layout(&d_tensors.rope_cos, F32, 2, cache, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "together", "cos without sin");
    d_tensors.rope_sin = d_tensors.rope_cos;
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "rope_cos", "a (rows, r/2) cache without ids");
    pb_make_layout(&d_tensors.position_ids, CLATTN_DTYPE_I32, 2, ids, PB_PACKED);
    tu_expect_status(clattn_rope_plan_create(tu_ctx(), &d, &plan), CLATTN_SUCCESS,
                     "caches by position with ids");
    clattn_plan_release(plan);
    d_tensors.rope_sin.dtype = F16;
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "same", "cos F32, sin F16");
    d_tensors.rope_sin = d_tensors.rope_cos;
    d.rotary_dim = 4; /* the cache is (9, 4): r / 2 must be 4 */
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "rotary_dim / 2", "a cache for another rot");
    TU_END_TEST();
}
END_TEST

/* --- rotary embeddings inside SDPA plans (clattn_sdpa_desc.rope) ---------------------------- */

typedef struct sdpa_rope_case {
    size_t batch, heads, kv_heads, seq_q, seq_k, past, dk, dv; /* seq_k: past + new keys */
    size_t rot;                                                /* rope_dims (0: dk) */
    clattn_rope_style style;
    size_t start;
    double base; /* 0: 10000 */
    clattn_path path;
    clattn_causal causal;
    clattn_dtype q_dtype, k_dtype;
    pb_layout qk_layout; /* of q and k (and past_k, present_k) */
    int want_weights;
} sdpa_rope_case;

#define FUSED CLATTN_PATH_FUSED
#define UNFUSED CLATTN_PATH_UNFUSED
#define AUTO CLATTN_PATH_AUTO
#define NONE CLATTN_CAUSAL_NONE
#define TOP_LEFT CLATTN_CAUSAL_TOP_LEFT
#define BOTTOM_RIGHT CLATTN_CAUSAL_BOTTOM_RIGHT
#define ONNX CLATTN_CAUSAL_ONNX
#define FAR (((size_t)1 << 24) - 64)

/* clang-format off */
static const sdpa_rope_case sdpa_rope_cases[] = {
    /* B H Hkv Lq Lk past dk dv rot style start base path causal q k layout weights */
    {2, 4, 2, 7, 13, 0, 16, 8, 0, HALVES, 0, 0, FUSED, NONE, F32, F32, PB_PACKED, 0},
    {2, 4, 2, 7, 13, 0, 16, 8, 6, PAIRS, 5, 0, UNFUSED, NONE, F32, F32, PB_SEQ_MAJOR, 1},
    {1, 3, 1, 17, 5, 0, 24, 24, 10, PAIRS, 100, 500, AUTO, BOTTOM_RIGHT, F16, BF16, PB_PADDED, 0},
    {3, 2, 2, 9, 33, 0, 17, 5, 16, HALVES, 7, 0, UNFUSED, TOP_LEFT, F32, F32, PB_STRIDED_LAST, 0},
    {2, 6, 3, 3, 12, 9, 32, 16, 16, HALVES, 9, 0, FUSED, ONNX, F32, F32, PB_PACKED, 0},
    {1, 4, 2, 5, 29, 24, 8, 8, 0, PAIRS, 24, 0, UNFUSED, ONNX, BF16, F32, PB_SEQ_MAJOR, 1},
    {2, 8, 2, 1, 21, 20, 16, 16, 0, HALVES, 20, 0, FUSED, BOTTOM_RIGHT, F32, F32, PB_PADDED, 0},
    {1, 2, 1, 40, 64, 0, 32, 32, 0, PAIRS, FAR, 0, AUTO, NONE, F32, F32, PB_PACKED, 0},
};
/* clang-format on */

/* SDPA with rope against the float64 reference (q and the new keys turned in double, then
 * attention), present_k against past + the rotated new keys, through pb_sdpa_run (outputs
 * poisoned, stray writes counted, fused or not as the path says). */
START_TEST(test_sdpa_rope_cases)
{
    TU_BEGIN_TEST();
    const sdpa_rope_case *c = &sdpa_rope_cases[_i];
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = c->batch, spec.heads = c->heads, spec.kv_heads = c->kv_heads;
    spec.seq_q = c->seq_q, spec.seq_k = c->seq_k, spec.past = c->past;
    spec.dk = c->dk, spec.dv = c->dv;
    spec.path = c->path, spec.causal = c->causal;
    spec.q_dtype = c->q_dtype, spec.k_dtype = c->k_dtype;
    spec.q_layout = spec.k_layout = c->qk_layout;
    spec.want_weights = c->want_weights;
    spec.rope = 1, spec.rope_style = c->style, spec.rope_dims = c->rot;
    spec.rope_start = c->start, spec.rope_base = c->base;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("%s", p.label);
    tu_expect_status(pb_sdpa_run(tu_ctx(), &p, NULL), CLATTN_SUCCESS, "pb_sdpa_run");
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* Packed F32 (batch, heads, seq, dim) rows [from, from + count) of x (seq rows per head). */
static float *rows_of(const float *x, size_t heads, size_t seq, size_t dim, size_t from,
                      size_t count)
{
    float *rows = tu_floats(heads * count * dim + 1);
    for (size_t h = 0; h < heads; ++h)
        memcpy(rows + h * count * dim, x + (h * seq + from) * dim, count * dim * sizeof(float));
    return rows;
}

/* Runs an SDPA plan of desc (packed F32 layouts set) on the host arrays: q, k, v and, when
 * desc has them, past_k and past_v; downloads out and present_k (when desc has it). Checks
 * that q and k are left as they were (the plan rotates copies). */
static void run_sdpa_rope(const clattn_sdpa_desc *desc, const float *q, const float *k,
                          const float *v, const float *past_k, const float *past_v, float *out,
                          float *present_k)
{
    clattn_plan *plan = NULL;
    if (!tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), desc, &plan), CLATTN_SUCCESS,
                          "clattn_sdpa_plan_create"))
        return;
    clattn_tensors bound = {0};
    for (size_t r = 0; r < desc->num_roles && r < CLATTN_ROLE_COUNT; ++r)
        bound.by_role[r] = desc->by_role[r];
    const bool past = bound.past_k.rank != 0, present = bound.present_k.rank != 0;
    cl_int err = pb_upload(tu_ctx(), &bound.q, tu_rand_below(5), q);
    if (err == CL_SUCCESS)
        err = pb_upload(tu_ctx(), &bound.k, tu_rand_below(5), k);
    if (err == CL_SUCCESS)
        err = pb_upload(tu_ctx(), &bound.v, tu_rand_below(5), v);
    if (err == CL_SUCCESS && past)
        err = pb_upload(tu_ctx(), &bound.past_k, 1, past_k);
    if (err == CL_SUCCESS && past)
        err = pb_upload(tu_ctx(), &bound.past_v, 2, past_v);
    if (err == CL_SUCCESS && present)
        err = pb_upload(tu_ctx(), &bound.present_k, 3, NULL);
    if (err == CL_SUCCESS && present)
        err = pb_upload(tu_ctx(), &bound.present_v, 0, NULL);
    if (err == CL_SUCCESS)
        err = pb_upload(tu_ctx(), &bound.out, tu_rand_below(5), NULL);
    if (tu_expect(err == CL_SUCCESS, "uploads failed (%d)", (int)err) &&
        tu_expect_status(
            clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL),
            CLATTN_SUCCESS, "clattn_plan_execute")) {
        size_t stray = 0;
        pb_download(tu_ctx(), NULL, &bound.out, out, &stray);
        tu_expect(stray == 0, "%zu elements written outside out", stray);
        if (present)
            pb_download(tu_ctx(), NULL, &bound.present_k, present_k, NULL);
        const clattn_tensor *inputs[2] = {&bound.q, &bound.k};
        const float *given[2] = {q, k};
        for (int i = 0; i < 2; ++i) {
            const size_t count = pb_tensor_count(inputs[i]);
            float *after = tu_nan_floats(count);
            pb_download(tu_ctx(), NULL, inputs[i], after, NULL);
            tu_expect(memcmp(after, given[i], count * sizeof(float)) == 0,
                      "the plan changed its input %s", i ? "k" : "q");
            free(after);
        }
    }
    pb_release_tensors(&bound);
    clattn_plan_release(plan);
}

/* A decode step at offset P (one query row, rope_start = P, past = the first P keys as the
 * whole-sequence plan wrote them to present_k, i.e. rotated) equals row P of the whole
 * sequence's forward (causal, rope from 0), to 1e-5; its present_k is the past then the same
 * rotated key. Grouped heads, so the fused steps pack the group's query heads as rows (one
 * row per head, each rotated at P). _i: the path, style and rotary dims. */
START_TEST(test_sdpa_rope_decode)
{
    TU_BEGIN_TEST();
    enum { B = 2, H = 6, G = 2, S = 37, D = 16, DV = 8 };
    static const struct {
        clattn_path path;
        clattn_rope_style style;
        size_t rot;
    } variants[] = {{FUSED, HALVES, 0}, {UNFUSED, PAIRS, 0}, {FUSED, PAIRS, 6}};
    const clattn_path path = variants[_i].path;
    tu_set_case("sdpa rope decode steps against the whole sequence: %s %s rot=%zu",
                path == FUSED ? "fused" : "unfused",
                variants[_i].style == PAIRS ? "pairs" : "halves", variants[_i].rot);
    float *q = tu_random_floats((size_t)B * H * S * D),
          *k = tu_random_floats((size_t)B * G * S * D);
    float *v = tu_random_floats((size_t)B * G * S * DV);
    clattn_sdpa_desc whole;
    clattn_sdpa_desc_init(&whole);
    clattn_tensors whole_tensors = {0};
    CLATTN_BIND_ROLES(whole, whole_tensors);
    whole.path = path;
    whole.causal = TOP_LEFT;
    whole.rope = 1, whole.rope_style = variants[_i].style, whole.rope_dims = PB_OR(variants[_i].rot, CLATTN_ROPE_WHOLE_HEAD);
    clattn_tensors *t = &whole_tensors;
    pb_make_layout(&t->q, F32, 4, (const size_t[]){B, H, S, D}, PB_PACKED);
    pb_make_layout(&t->k, F32, 4, (const size_t[]){B, G, S, D}, PB_PACKED);
    pb_make_layout(&t->v, F32, 4, (const size_t[]){B, G, S, DV}, PB_PACKED);
    pb_make_layout(&t->out, F32, 4, (const size_t[]){B, H, S, DV}, PB_PACKED);
    t->present_k = t->k, t->present_v = t->v;
    float *out = tu_nan_floats((size_t)B * H * S * DV),
          *keys = tu_nan_floats((size_t)B * G * S * D);
    run_sdpa_rope(&whole, q, k, v, NULL, NULL, out, keys);
    static const size_t steps[] = {1, 18, S - 1};
    for (size_t n = 0; n < sizeof steps / sizeof steps[0] && !tu_failed(); ++n) {
        const size_t pos = steps[n];
        float *q_row = rows_of(q, B * H, S, D, pos, 1), *k_row = rows_of(k, B * G, S, D, pos, 1);
        float *v_row = rows_of(v, B * G, S, DV, pos, 1);
        float *past_k = rows_of(keys, B * G, S, D, 0, pos),
              *past_v = rows_of(v, B * G, S, DV, 0, pos);
        clattn_tensors step_tensors = whole_tensors;
        clattn_sdpa_desc step = whole;
        CLATTN_BIND_ROLES(step, step_tensors);
        step.causal = n % 2 ? ONNX : BOTTOM_RIGHT;
        step.rope_start = pos;
        t = &step_tensors;
        pb_make_layout(&t->q, F32, 4, (const size_t[]){B, H, 1, D}, PB_PACKED);
        pb_make_layout(&t->k, F32, 4, (const size_t[]){B, G, 1, D}, PB_PACKED);
        pb_make_layout(&t->v, F32, 4, (const size_t[]){B, G, 1, DV}, PB_PACKED);
        pb_make_layout(&t->out, F32, 4, (const size_t[]){B, H, 1, DV}, PB_PACKED);
        pb_make_layout(&t->past_k, F32, 4, (const size_t[]){B, G, pos, D}, PB_PACKED);
        pb_make_layout(&t->past_v, F32, 4, (const size_t[]){B, G, pos, DV}, PB_PACKED);
        pb_make_layout(&t->present_k, F32, 4, (const size_t[]){B, G, pos + 1, D}, PB_PACKED);
        pb_make_layout(&t->present_v, F32, 4, (const size_t[]){B, G, pos + 1, DV}, PB_PACKED);
        float *got = tu_nan_floats((size_t)B * H * DV);
        float *present = tu_nan_floats((size_t)B * G * (pos + 1) * D);
        run_sdpa_rope(&step, q_row, k_row, v_row, past_k, past_v, got, present);
        double worst = 0.0, worst_key = 0.0;
        size_t past_wrong = 0;
        for (size_t bh = 0; bh < B * H; ++bh)
            for (size_t x = 0; x < DV; ++x)
                worst = fmax(worst, fabs((double)got[bh * DV + x] - out[(bh * S + pos) * DV + x]));
        for (size_t bg = 0; bg < B * G; ++bg)
            for (size_t r = 0; r <= pos; ++r)
                for (size_t x = 0; x < D; ++x) {
                    const float value = present[(bg * (pos + 1) + r) * D + x];
                    const float want = keys[(bg * S + r) * D + x];
                    if (r < pos)
                        past_wrong += !(value == want);
                    else
                        worst_key = fmax(worst_key, fabs((double)value - want));
                }
        tu_expect(worst <= 1e-5, "step at P=%zu: out differs from the whole sequence's row by %.3g",
                  pos, worst);
        tu_expect(worst_key <= 1e-6, "step at P=%zu: the rotated key differs by %.3g", pos,
                  worst_key);
        tu_expect(past_wrong == 0, "step at P=%zu: %zu past values changed in present_k", pos,
                  past_wrong);
        free(present);
        free(got);
        free(past_v);
        free(past_k);
        free(v_row);
        free(k_row);
        free(q_row);
    }
    free(keys);
    free(out);
    free(v);
    free(k);
    free(q);
    TU_END_TEST();
}
END_TEST

#define expect_sdpa_refused(desc, want, needle, call)                                              \
    TU_EXPECT_REFUSED(clattn_sdpa_plan_create, "sdpa", desc, want, needle, call)

START_TEST(test_sdpa_rope_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("sdpa rope refusals");
    enum { B = 2, H = 4, G = 2, L = 5, D = 8 };
    clattn_sdpa_desc good;
    clattn_sdpa_desc_init(&good);
    clattn_tensors good_tensors = {0};
    CLATTN_BIND_ROLES(good, good_tensors);
    good.rope = 1;
    clattn_tensors *t = &good_tensors;
    pb_make_layout(&t->q, F32, 4, (const size_t[]){B, H, L, D}, PB_PACKED);
    pb_make_layout(&t->k, F32, 4, (const size_t[]){B, G, L, D}, PB_PACKED);
    t->v = t->k;
    pb_make_layout(&t->out, F32, 4, (const size_t[]){B, H, L, D}, PB_PACKED);
    clattn_plan *plan = NULL;
    if (tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &good, &plan), CLATTN_SUCCESS, "good"))
        tu_expect(clattn_plan_workspace_size(plan) >= (size_t)(B * H + B * G) * L * D * 4,
                  "rope: workspace %zu bytes, less than the rotated copies",
                  clattn_plan_workspace_size(plan));
    clattn_plan_release(plan);
    clattn_tensors d_tensors = good_tensors;
    clattn_sdpa_desc d = good;
    CLATTN_BIND_ROLES(d, d_tensors);
    d.rope = 2;
    expect_sdpa_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "rope=2", "rope 2");
    RESET(d, good), d.rope_style = (clattn_rope_style)7;
    expect_sdpa_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "rope_style", "rope_style 7");
    RESET(d, good), d.rope_dims = 5;
    expect_sdpa_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "rope_dims=5", "odd rope_dims");
    RESET(d, good), d.rope_dims = 10;
    expect_sdpa_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "head size 8", "rope_dims past d");
    RESET(d, good), d.rope_base = -1.0;
    expect_sdpa_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "rope_base", "negative base");
    RESET(d, good), d.rope_base = NAN;
    expect_sdpa_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "rope_base", "NaN base");
    RESET(d, good), d.rope_base = 0.0;
    expect_sdpa_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "rope_base", "base 0");
    RESET(d, good), d.rope_dims = 0;
    expect_sdpa_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "CLATTN_ROPE_WHOLE_HEAD", "rope_dims 0");
    RESET(d, good), d.rope_start = ((size_t)1 << 24) - L + 1;
    expect_sdpa_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "2^24", "positions reaching 2^24");
    RESET(d, good), d.rope_start = SIZE_MAX;
    expect_sdpa_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "rope_start", "rope_start overflowing");
    RESET(d, good), d.rope_start = ((size_t)1 << 24) - L;
    tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &d, &plan), CLATTN_SUCCESS,
                     "the last positions below 2^24");
    clattn_plan_release(plan);
    RESET(d, good);
    pb_make_layout(&d_tensors.kv_seqlen, CLATTN_DTYPE_I32, 1, (const size_t[]){B}, PB_PACKED);
    expect_sdpa_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "kv_seqlen", "rope with kv_seqlen");
    d.rope = 0, d.rope_dims = 5; /* off: the other fields are not read */
    tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &d, &plan), CLATTN_SUCCESS,
                     "rope 0 with kv_seqlen and an odd rope_dims");
    clattn_plan_release(plan);
    TU_END_TEST();
}
END_TEST

static Suite *rope_suite(void)
{
    Suite *suite = suite_create("rope");
    TCase *tc = tu_tcase(suite, "rope", 600);
    tcase_add_loop_test(tc, test_rope_cases, 0, (int)(sizeof cases / sizeof cases[0]));
    tcase_add_loop_test(tc, test_rope_decode_offset, 0, 2);
    tcase_add_test(tc, test_rope_far_positions);
    if (tu_small())
        tu_not_run("test_rope_untabled (8.4 million values): the device's angles still run in "
                   "the cases with position ids");
    else
        tcase_add_test(tc, test_rope_untabled);
    tcase_add_test(tc, test_rope_errors);
    TCase *sdpa = tu_tcase(suite, "sdpa_rope", 600);
    tcase_add_loop_test(sdpa, test_sdpa_rope_cases, 0,
                        (int)(sizeof sdpa_rope_cases / sizeof sdpa_rope_cases[0]));
    tcase_add_loop_test(sdpa, test_sdpa_rope_decode, 0, 3);
    tcase_add_test(sdpa, test_sdpa_rope_errors);
    return suite;
}

int main(void)
{
    return tu_main("check_rope", rope_suite);
}
