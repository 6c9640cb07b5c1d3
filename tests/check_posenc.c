/*
 * check_posenc: positional-encoding plans (clattn_posenc_plan_create), against the float64
 * reference on fresh random inputs: the sinusoidal table (even and odd dims, a start
 * position, other bases, the table alone or added to x of rank 2 to 4, any float dtype, padded
 * and strided layouts, in place) and a learned table (any dtype, strided, rows from a start);
 * the sinusoid's accuracy over positions 0 .. 65535 and just below 2^24; every refusal.
 * Outputs are poisoned first, and writes outside them are counted.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problems.h"
#include "reference.h"
#include "testutil.h"

/* Largest error allowed for an output of `dtype` holding values up to `magnitude`: the
 * kernel's 2e-6 (see kernels/posenc.cl) plus the output's rounding. */
static double tolerance(clattn_dtype dtype, double magnitude)
{
    const double unit = dtype == CLATTN_DTYPE_F16    ? ldexp(1.0, -11)
                        : dtype == CLATTN_DTYPE_BF16 ? ldexp(1.0, -8)
                                                     : ldexp(1.0, -24);
    return 2e-6 + unit * magnitude;
}

typedef struct posenc_case {
    int rank;                /* of x / out */
    size_t d0, d1, seq, dim; /* d0, d1: leading dims (rank 4: both; rank 3: d1) */
    size_t start;
    double base;         /* 0: the default */
    int with_x, inplace; /* inplace: out is x's tensor */
    clattn_dtype x_dtype, out_dtype, table_dtype;
    pb_layout layout;       /* of x and out */
    int table;              /* 0: SINUSOIDAL; else TABLE with this many spare rows */
    pb_layout table_layout; /* TABLE */
} posenc_case;

#define F32 CLATTN_DTYPE_F32
#define F16 CLATTN_DTYPE_F16
#define BF16 CLATTN_DTYPE_BF16
/* clang-format off */
static const posenc_case cases[] = {
    /* rank d0 d1 seq dim start base  x inpl  x    out   table layout          table tlayout */
    {2, 1, 1,   1,   1,     0, 0,     1, 0, F32, F32, F32, PB_PACKED,        0, PB_PACKED},
    {2, 1, 1,  17,  64,     0, 0,     1, 0, F32, F32, F32, PB_PACKED,        0, PB_PACKED},
    {3, 1, 3,  63,  17,     5, 0,     1, 0, F32, F32, F32, PB_PADDED,        0, PB_PACKED},
    {3, 1, 2, 129, 128, 1000, 0,     1, 1, F32, F32, F32, PB_PACKED,        0, PB_PACKED},
    {4, 2, 3,  65,   3,     0, 500,  1, 0, F16, F16, F32, PB_STRIDED_LAST,  0, PB_PACKED},
    {3, 1, 2,  31,  33,     7, 0,     1, 0, BF16, F32, F32, PB_PACKED,       0, PB_PACKED},
    {2, 1, 1, 127,  65,     0, 0,     0, 0, F32, F32, F32, PB_PACKED,        0, PB_PACKED},
    {3, 1, 4,   3,   8, 4095, 2.5,   0, 0, F32, BF16, F32, PB_PADDED,        0, PB_PACKED},
    {3, 1, 2,  17,  64,     0, 0,     1, 0, F32, F32, F32, PB_PACKED,        3, PB_PACKED},
    {3, 1, 3,  63,  17,    40, 0,     1, 1, F16, F16, BF16, PB_PADDED,       0, PB_PADDED},
    {4, 2, 2,  65,   1,     0, 0,     1, 0, F32, F16, F16, PB_STRIDED_LAST,  1, PB_STRIDED_LAST},
    {2, 1, 1, 129, 100,    20, 0,     0, 0, F32, F32, F32, PB_PACKED,        9, PB_PADDED},
    {3, 1, 2,  17,   5,     3, 0,     1, 0, F32, F32, F32, PB_PACKED,        2, PB_STRIDED_LAST},
};
/* clang-format on */

/* dims of x / out for a case, right-aligned to its rank. */
static void case_dims(const posenc_case *c, size_t dims[4])
{
    const size_t all[4] = {c->d0, c->d1, c->seq, c->dim};
    for (int d = 0; d < c->rank; ++d)
        dims[d] = all[4 - c->rank + d];
}

START_TEST(test_posenc_cases)
{
    TU_BEGIN_TEST();
    const posenc_case *c = &cases[_i];
    const size_t rows_total = c->start + c->seq + (size_t)c->table;
    tu_set_case("posenc %s rank=%d (%zu, %zu, %zu, %zu) start=%zu base=%g x=%d inplace=%d "
                "x=%s out=%s table=%s layout=%s table_layout=%s",
                c->table ? "table" : "sinusoid", c->rank, c->d0, c->d1, c->seq, c->dim, c->start,
                c->base, c->with_x, c->inplace, pb_dtype_name(c->x_dtype),
                pb_dtype_name(c->out_dtype), pb_dtype_name(c->table_dtype),
                pb_layout_name(c->layout), pb_layout_name(c->table_layout));
    size_t dims[4];
    case_dims(c, dims);
    const size_t count = c->d0 * c->d1 * c->seq * c->dim;
    /* x (rounded to its dtype), the table and the reference PE rows. */
    float *x = tu_random_floats(count);
    pb_round_array(c->x_dtype, x, count);
    double *pe = tu_doubles(c->seq * c->dim);
    float *table = NULL;
    if (c->table) {
        table = tu_random_floats(rows_total * c->dim);
        pb_round_array(c->table_dtype, table, rows_total * c->dim);
        for (size_t e = 0; e < c->seq * c->dim; ++e)
            pe[e] = table[c->start * c->dim + e];
    } else {
        ref_posenc_sinusoid(c->start, c->seq, c->dim, c->base == 0.0 ? 10000.0 : c->base, pe);
    }
    double *want = tu_doubles(count);
    for (size_t e = 0; e < count; ++e)
        want[e] = (c->with_x ? x[e] : 0.0) + pe[e % (c->seq * c->dim)];

    clattn_posenc_desc desc;
    clattn_posenc_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.kind = c->table ? CLATTN_POSENC_TABLE : CLATTN_POSENC_SINUSOIDAL;
    desc.start = c->start;
    desc.base = PB_OR(c->base, CLATTN_ROPE_BASE_DEFAULT);
    clattn_tensors *t = &desc_tensors;
    if (c->with_x)
        pb_make_layout(&t->q, c->x_dtype, c->rank, dims, c->layout);
    if (c->inplace)
        t->out = t->q;
    else
        pb_make_layout(&t->out, c->out_dtype, c->rank, dims, c->layout);
    const size_t table_dims[2] = {rows_total, c->dim};
    if (c->table)
        pb_make_layout(&t->pos_table, c->table_dtype, 2, table_dims, c->table_layout);

    clattn_plan *plan = NULL;
    clattn_tensors bound = desc_tensors;
    cl_int err = CL_SUCCESS;
    if (tu_expect_status(clattn_posenc_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                         "clattn_posenc_plan_create")) {
        if (c->with_x)
            err = pb_upload(tu_ctx(), &bound.q, tu_rand_below(5), x);
        if (err == CL_SUCCESS && c->inplace)
            bound.out = bound.q;
        else if (err == CL_SUCCESS)
            err = pb_upload(tu_ctx(), &bound.out, tu_rand_below(5), NULL);
        if (err == CL_SUCCESS && c->table)
            err = pb_upload(tu_ctx(), &bound.pos_table, tu_rand_below(5), table);
        if (tu_expect(err == CL_SUCCESS, "uploads failed (%d)", (int)err) &&
            tu_expect_status(clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                                 0, NULL, NULL),
                             CLATTN_SUCCESS, "clattn_plan_execute")) {
            float *got = tu_nan_floats(count);
            size_t stray = 0;
            if (pb_download(tu_ctx(), NULL, &bound.out, got, &stray) == CL_SUCCESS) {
                const clattn_dtype out_dtype = c->inplace ? c->x_dtype : c->out_dtype;
                size_t wrong = 0, first = count;
                double worst = 0.0;
                for (size_t e = 0; e < count; ++e) {
                    const double err_e = fabs((double)got[e] - want[e]);
                    if (!(err_e <= tolerance(out_dtype, fabs(want[e]))) && wrong++ == 0)
                        first = e;
                    if (err_e > worst || isnan(got[e]))
                        worst = isnan(got[e]) ? INFINITY : err_e;
                }
                tu_expect(wrong == 0,
                          "%zu of %zu values wrong; the first, %zu: got %.9g want %.9g (worst "
                          "error %.3g)",
                          wrong, count, first, first < count ? (double)got[first] : 0.0,
                          first < count ? want[first] : 0.0, worst);
                tu_expect(stray == 0, "%zu elements written outside out", stray);
                if (out_dtype == F32)
                    tu_track_error(worst);
            }
            free(got);
        }
        if (c->inplace)
            bound.out.mem = NULL; /* released once, as q */
        pb_release_tensors(&bound);
    }
    clattn_plan_release(plan);
    free(want);
    free(table);
    free(pe);
    free(x);
    TU_END_TEST();
}
END_TEST

/* The sinusoid alone over positions start .. start + seq - 1 against the float64 formula:
 * within 2e-6 everywhere. _i 0: positions 0 .. 65535 (dim 64); 1: the last 300 positions
 * below 2^24 (dim 16), where pos * w in float would be off by up to 1 radian. */
START_TEST(test_posenc_long)
{
    TU_BEGIN_TEST();
    const size_t start = _i == 0 ? 0 : ((size_t)1 << 24) - 300;
    const size_t seq = _i == 0 ? 65536 : 300, dim = _i == 0 ? 64 : 16;
    tu_set_case("sinusoid positions %zu .. %zu, dim %zu", start, start + seq - 1, dim);
    const size_t count = seq * dim;
    clattn_posenc_desc desc;
    clattn_posenc_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.start = start;
    const size_t dims[2] = {seq, dim};
    pb_make_layout(&desc_tensors.out, F32, 2, dims, PB_PACKED);
    clattn_plan *plan = NULL;
    if (tu_expect_status(clattn_posenc_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                         "clattn_posenc_plan_create")) {
        clattn_tensors bound = desc_tensors;
        double *want = tu_doubles(count);
        float *got = tu_nan_floats(count);
        ref_posenc_sinusoid(start, seq, dim, 10000.0, want);
        if (pb_upload(tu_ctx(), &bound.out, 0, NULL) == CL_SUCCESS &&
            tu_expect_status(clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                                 0, NULL, NULL),
                             CLATTN_SUCCESS, "clattn_plan_execute") &&
            pb_download(tu_ctx(), NULL, &bound.out, got, NULL) == CL_SUCCESS) {
            double worst = 0.0;
            size_t at = 0;
            for (size_t e = 0; e < count; ++e) {
                const double err = isnan(got[e]) ? INFINITY : fabs((double)got[e] - want[e]);
                if (err > worst)
                    worst = err, at = e;
            }
            tu_expect(worst <= 2e-6,
                      "largest error %.3g at position %zu, column %zu (got %.9g, "
                      "want %.9g)",
                      worst, start + at / dim, at % dim, (double)got[at], want[at]);
            tu_track_error(worst);
            printf("check_posenc: sinusoid positions %zu .. %zu, dim %zu: largest error %.3g\n",
                   start, start + seq - 1, dim, worst);
        }
        pb_release_tensors(&bound);
        free(got);
        free(want);
    }
    clattn_plan_release(plan);
    TU_END_TEST();
}
END_TEST

/* Every refusal: status, and a message naming what is wrong. */
#define expect_refused(desc, want, needle, call)                                                   \
    TU_EXPECT_REFUSED(clattn_posenc_plan_create, "posenc", desc, want, needle, call)

START_TEST(test_posenc_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("posenc plan refusals");
    const size_t dims3[3] = {2, 5, 8}, other[3] = {2, 5, 7}, table_dims[2] = {6, 8};
    clattn_posenc_desc good;
    clattn_posenc_desc_init(&good);
    clattn_tensors good_tensors = {0};
    CLATTN_BIND_ROLES(good, good_tensors);
    pb_make_layout(&good_tensors.q, F32, 3, dims3, PB_PACKED);
    pb_make_layout(&good_tensors.out, F32, 3, dims3, PB_PACKED);
    TU_EXPECT_PLAN_BASICS(clattn_posenc_plan_create, good);
    clattn_plan *plan = NULL;
    tu_expect_status(clattn_posenc_plan_create(tu_ctx(), &good, NULL), CLATTN_ERR_INVALID_ARGUMENT,
                     "NULL out");

    clattn_tensors d_tensors = good_tensors;
    clattn_posenc_desc d = good;
    CLATTN_BIND_ROLES(d, d_tensors);
    d.struct_size = sizeof d + 8; /* a newer header's (an older, smaller one is taken) */
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "struct_size", "struct_size");
    RESET(d, good), d.kind = (clattn_posenc_kind)7;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "kind", "kind 7");
    RESET(d, good), memset(&d_tensors.out, 0, sizeof d_tensors.out);
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "out", "out absent");
    RESET(d, good), pb_make_layout(&d_tensors.out, F32, 3, other, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "out", "out of other dims");
    RESET(d, good), memset(&d_tensors.q, 0, sizeof d_tensors.q);
    pb_make_layout(&d_tensors.out, F32, 1, dims3 + 2, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "rank", "out of rank 1");
    RESET(d, good), d_tensors.k = d_tensors.q;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT,
                   "k was given, but this plan takes only x, out, pos_table", "k set");
    RESET(d, good), d_tensors.out.dtype = CLATTN_DTYPE_U8;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "out", "out U8");
    RESET(d, good), d.start = ((size_t)1 << 24) - 4;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "2^24", "positions past 2^24");
    RESET(d, good), d.start = SIZE_MAX - 2;
    expect_refused(&d, CLATTN_ERR_OVERFLOW, "start", "start + seq overflows");
    static const double bad_bases[] = {-1.0, NAN, INFINITY, 0.0}; /* 0: 10000 before 0.7 */
    for (size_t i = 0; i < sizeof bad_bases / sizeof bad_bases[0]; ++i) {
        RESET(d, good), d.base = bad_bases[i];
        expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "base", "bad base");
    }
    RESET(d, good), pb_make_layout(&d_tensors.pos_table, F32, 2, table_dims, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "pos_table", "a table for the sinusoid");
    RESET(d, good), d.kind = CLATTN_POSENC_TABLE;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "pos_table", "TABLE without a table");
    pb_make_layout(&d_tensors.pos_table, F32, 2, (const size_t[]){6, 7}, PB_PACKED);
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "dim = 8", "table of 7 columns");
    pb_make_layout(&d_tensors.pos_table, F32, 2, table_dims, PB_PACKED);
    d.start = 2; /* rows 2 .. 6 of a 6-row table */
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "max_len", "table too short");
    d.start = 1;
    tu_expect_status(clattn_posenc_plan_create(tu_ctx(), &d, &plan), CLATTN_SUCCESS,
                     "rows 1 .. 5 of a 6-row table");
    clattn_plan_release(plan);
    /* An SDPA plan refuses a pos_table. */
    clattn_sdpa_desc sdpa;
    clattn_sdpa_desc_init(&sdpa);
    clattn_tensors sdpa_tensors = {0};
    CLATTN_BIND_ROLES(sdpa, sdpa_tensors);
    sdpa_tensors.pos_table = d_tensors.pos_table;
    plan = NULL;
    tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &sdpa, &plan), CLATTN_ERR_INVALID_ARGUMENT,
                     "sdpa with a pos_table");
    tu_expect(strstr(clattn_last_error(tu_ctx()), "pos_table") != NULL, "sdpa: message '%s'",
              clattn_last_error(tu_ctx()));
    TU_END_TEST();
}
END_TEST

static Suite *posenc_suite(void)
{
    Suite *suite = suite_create("posenc");
    TCase *tc = tu_tcase(suite, "posenc", 600);
    tcase_add_loop_test(tc, test_posenc_cases, 0, (int)(sizeof cases / sizeof cases[0]));
    if (tu_small())
        tu_not_run("test_posenc_long 0 (65536 x 64 values): the last 300 positions below 2^24 "
                   "still run");
    tcase_add_loop_test(tc, test_posenc_long, tu_small() ? 1 : 0, 2);
    tcase_add_test(tc, test_posenc_errors);
    return suite;
}

int main(void)
{
    return tu_main("check_posenc", posenc_suite);
}
