/*
 * check_matmul: clattn_matmul against the float64 reference.
 *
 * Every case builds its buffers at exactly offset + extent elements, with NaN in every element
 * that is not part of a matrix (before the offset, between rows when ld > cols, between batch
 * entries), so a read outside the described matrices turns the result into NaN, and a write
 * outside them shows up as a non-NaN element where NaN was left.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "testutil.h"

typedef struct matmul_case {
    clattn_matmul_desc desc;
    size_t a_offset, b_offset, bias_offset, c_offset;
    int use_bias;
} matmul_case;

/* Writes random values into the matrix elements of a NaN-filled buffer and, when inside is not
 * NULL, marks them. */
static void fill_matrices(float *buffer, uint8_t *inside, size_t batch, size_t stride, size_t rows,
                          size_t cols, size_t ld)
{
    for (size_t entry = 0; entry < batch; ++entry) {
        for (size_t row = 0; row < rows; ++row) {
            for (size_t col = 0; col < cols; ++col) {
                size_t index = (batch > 1 ? entry * stride : 0) + row * ld + col;
                buffer[index] = (float)(2.0 * tu_rand_unit() - 1.0);
                if (inside != NULL) {
                    inside[index] = 1;
                }
            }
        }
    }
}

static void describe(const matmul_case *mc)
{
    const clattn_matmul_desc *d = &mc->desc;
    tu_set_case("batch=%zu m=%zu n=%zu k=%zu trans_a=%d trans_b=%d lda=%zu ldb=%zu ldc=%zu "
                "stride_a=%zu stride_b=%zu stride_c=%zu alpha=%g beta=%g bias=%d "
                "offsets a=%zu b=%zu bias=%zu c=%zu",
                d->batch, d->m, d->n, d->k, d->trans_a, d->trans_b, d->lda, d->ldb, d->ldc,
                d->stride_a, d->stride_b, d->stride_c, (double)d->alpha, (double)d->beta,
                mc->use_bias, mc->a_offset, mc->b_offset, mc->bias_offset, mc->c_offset);
}


/* The scale a float32 result of this product is judged at. A dot product of k random terms is
 * about sqrt(k) terms in size; when cancellation makes one much smaller (a 1 x 1 x 5000 product
 * that lands near 0), its rounding error still follows the terms, so the error is measured
 * against max(max |C|, max (|alpha| |A| |B| + |beta| |C| + |bias|) / sqrt(k)), both from the
 * float64 reference. */
static double typical_magnitude(const clattn_matmul_desc *desc, const matmul_case *mc,
                                const float *a, size_t a_total, const float *b, size_t b_total,
                                const float *bias, size_t bias_total, const float *c,
                                size_t c_total)
{
    float *abs_a = tu_floats(a_total), *abs_b = tu_floats(b_total);
    float *abs_bias = tu_floats(bias_total);
    double *abs_c = tu_doubles(c_total);
    for (size_t i = 0; i < a_total; ++i)
        abs_a[i] = fabsf(a[i]);
    for (size_t i = 0; i < b_total; ++i)
        abs_b[i] = fabsf(b[i]);
    for (size_t i = 0; i < bias_total; ++i)
        abs_bias[i] = fabsf(bias[i]);
    for (size_t i = 0; i < c_total; ++i)
        abs_c[i] = isnan(c[i]) ? 0.0 : fabs((double)c[i]);
    clattn_matmul_desc abs_desc = *desc;
    abs_desc.alpha = fabsf(desc->alpha);
    abs_desc.beta = fabsf(desc->beta);
    ref_matmul(&abs_desc, abs_a + mc->a_offset, abs_b + mc->b_offset,
               mc->use_bias ? abs_bias + mc->bias_offset : NULL, abs_c + mc->c_offset);
    double largest = 0.0;
    for (size_t i = 0; i < c_total; ++i)
        if (!isnan(abs_c[i]) && abs_c[i] > largest)
            largest = abs_c[i];
    free(abs_a);
    free(abs_b);
    free(abs_bias);
    free(abs_c);
    return largest / sqrt((double)desc->k);
}

static void expect_close_to_magnitude(const float *got, const double *ref, size_t count,
                                      double magnitude)
{
    double largest_ref = 0.0, largest_diff = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < count; ++i) {
        const double diff = isfinite(got[i]) ? fabs(got[i] - ref[i]) : INFINITY;
        if (fabs(ref[i]) > largest_ref)
            largest_ref = fabs(ref[i]);
        if (diff > largest_diff || (isinf(diff) && !isinf(largest_diff))) {
            largest_diff = diff;
            worst = i;
        }
    }
    const double scale = largest_ref > magnitude ? largest_ref : magnitude;
    const double err = largest_diff / (scale > 1e-30 ? scale : 1e-30);
    tu_track_error(err);
    tu_expect(err <= TU_TOL,
              "C: relative error %.3g > %.0e (worst at [%zu]: got %.9g, want %.9g; scale %.3g)",
              err, TU_TOL, worst, count ? (double)got[worst] : 0.0, count ? ref[worst] : 0.0,
              scale);
}

static void run_matmul_case(const matmul_case *mc)
{
    const clattn_matmul_desc *desc = &mc->desc;
    size_t batch = desc->batch ? desc->batch : 1;
    describe(mc);

    size_t a_total = mc->a_offset + ref_matmul_extent_a(desc);
    size_t b_total = mc->b_offset + ref_matmul_extent_b(desc);
    size_t c_total = mc->c_offset + ref_matmul_extent_c(desc);
    size_t bias_total = mc->bias_offset + desc->n;

    float *a_host = tu_nan_floats(a_total);
    float *b_host = tu_nan_floats(b_total);
    float *c_host = tu_nan_floats(c_total);
    float *bias_host = tu_nan_floats(bias_total);
    uint8_t *c_inside = tu_bytes(c_total);

    fill_matrices(a_host + mc->a_offset, NULL, batch, desc->stride_a,
                  desc->trans_a ? desc->k : desc->m, desc->trans_a ? desc->m : desc->k,
                  ref_matmul_lda(desc));
    fill_matrices(b_host + mc->b_offset, NULL, batch, desc->stride_b,
                  desc->trans_b ? desc->n : desc->k, desc->trans_b ? desc->k : desc->n,
                  ref_matmul_ldb(desc));
    /* C's matrix elements are marked in every case but hold random values only when beta != 0:
     * with beta == 0 the library must not read C, so it stays NaN. */
    fill_matrices(c_host + mc->c_offset, c_inside + mc->c_offset, batch, desc->stride_c, desc->m,
                  desc->n, ref_matmul_ldc(desc));
    if (desc->beta == 0.0f) {
        tu_fill_nan(c_host, c_total);
    }
    tu_fill_uniform(bias_host + mc->bias_offset, desc->n, -1.0f, 1.0f);

    double *c_ref = tu_doubles(c_total);
    tu_floats_to_doubles(c_host, c_total, c_ref);
    ref_matmul(desc, a_host + mc->a_offset, b_host + mc->b_offset,
               mc->use_bias ? bias_host + mc->bias_offset : NULL, c_ref + mc->c_offset);
    const double magnitude = typical_magnitude(desc, mc, a_host, a_total, b_host, b_total,
                                               bias_host, bias_total, c_host, c_total);

    cl_mem a_mem = tu_upload_floats(a_host, a_total);
    cl_mem b_mem = tu_upload_floats(b_host, b_total);
    cl_mem c_mem = tu_upload_floats(c_host, c_total);
    cl_mem bias_mem = mc->use_bias ? tu_upload_floats(bias_host, bias_total) : NULL;

    clattn_status status = clattn_matmul(tu_ctx(), desc, tu_tensor(a_mem, mc->a_offset),
                                         tu_tensor(b_mem, mc->b_offset),
                                         tu_tensor(bias_mem, mc->use_bias ? mc->bias_offset : 0),
                                         tu_tensor(c_mem, mc->c_offset), 0, NULL, NULL);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_matmul")) {
        float *c_got = tu_floats(c_total);
        tu_read_floats(c_mem, 0, c_total, c_got);

        /* Compare the matrix elements; everything else must still be NaN. */
        size_t inside_count = 0;
        for (size_t i = 0; i < c_total; ++i) {
            inside_count += c_inside[i];
        }
        float *got_inside = tu_floats(inside_count);
        double *ref_inside = tu_doubles(inside_count);
        size_t next = 0;
        int stray_write = 0;
        for (size_t i = 0; i < c_total; ++i) {
            if (c_inside[i]) {
                got_inside[next] = c_got[i];
                ref_inside[next] = c_ref[i];
                ++next;
            } else if (!isnan(c_got[i]) && !stray_write) {
                stray_write = 1;
                tu_expect(0, "C element %zu is outside every matrix but was written (%g)", i,
                          (double)c_got[i]);
            }
        }
        expect_close_to_magnitude(got_inside, ref_inside, inside_count, magnitude);
        free(ref_inside);
        free(got_inside);
        free(c_got);
    }

    tu_release_mem(bias_mem);
    tu_release_mem(c_mem);
    tu_release_mem(b_mem);
    tu_release_mem(a_mem);
    free(c_ref);
    free(c_inside);
    free(bias_host);
    free(c_host);
    free(b_host);
    free(a_host);
}

static matmul_case plain_case(size_t m, size_t n, size_t k, int trans_a, int trans_b)
{
    matmul_case mc = {
        .desc = {.batch = 1,
                 .m = m,
                 .n = n,
                 .k = k,
                 .trans_a = trans_a,
                 .trans_b = trans_b,
                 .alpha = 1.0f,
                 .beta = 0.0f},
    };
    return mc;
}

/* --- size tables -------------------------------------------------------------------------- */

typedef struct mnk {
    size_t m, n, k;
} mnk;

/* The awkward sizes mixed so that each of m, n, k meets each value, plus cubes at the ends. */
/* clang-format off */
static const mnk awkward_sizes[] = {
    {1, 1, 1},      {1, 3, 17},    {3, 1, 63},     {17, 63, 1},   {63, 65, 3},
    {65, 17, 127},  {127, 129, 65}, {129, 127, 17}, {3, 129, 129}, {129, 1, 65},
    {65, 65, 65},   {63, 63, 63},  {127, 3, 1},    {17, 17, 17},  {1, 129, 127},
    {129, 129, 3},  {64, 64, 64},  {128, 1, 128},
};
/* clang-format on */

/* clang-format off */
static const mnk prime_and_large_sizes[] = {
    {31, 97, 251}, {97, 251, 31}, {251, 31, 97}, {97, 97, 97}, {256, 192, 320}, {192, 320, 256},
};
/* clang-format on */

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

START_TEST(test_matmul_awkward_sizes)
{
    TU_BEGIN_TEST();
    const mnk size = awkward_sizes[_i];
    for (int trans = 0; trans < 4; ++trans) {
        matmul_case mc = plain_case(size.m, size.n, size.k, trans & 1, (trans >> 1) & 1);
        run_matmul_case(&mc);
    }
    TU_END_TEST();
}
END_TEST

START_TEST(test_matmul_primes_and_large)
{
    TU_BEGIN_TEST();
    const mnk size = prime_and_large_sizes[_i];
    for (int trans = 0; trans < 4; ++trans) {
        matmul_case mc = plain_case(size.m, size.n, size.k, trans & 1, (trans >> 1) & 1);
        run_matmul_case(&mc);
    }
    TU_END_TEST();
}
END_TEST

/* Every (m, n, k) in {1, 3, 17, 63, 65, 127, 129}^3, the transpose flags cycling with the
 * index: 343 products, cheap on any device. */
#define GRID_SIDE 7
START_TEST(test_matmul_full_grid)
{
    TU_BEGIN_TEST();
    static const size_t dims[GRID_SIDE] = {1, 3, 17, 63, 65, 127, 129};
    size_t m = dims[_i % GRID_SIDE], n = dims[(_i / GRID_SIDE) % GRID_SIDE];
    size_t k = dims[_i / (GRID_SIDE * GRID_SIDE)];
    int trans = (_i + _i / GRID_SIDE) % 4;
    matmul_case mc = plain_case(m, n, k, trans & 1, (trans >> 1) & 1);
    run_matmul_case(&mc);
    TU_END_TEST();
}
END_TEST

/* Long K (blocked on CPUs), wide N or tall M beyond any tile, and a larger cube. K = 70000
 * passes llvmpipe's 65535 loop iterations per work-item (K split there, see runtime.c). */
/* clang-format off */
static const mnk extreme_sizes[] = {
    {1, 1, 5000}, {5, 7, 4099}, {2, 1025, 3}, {1025, 2, 3}, {33, 2049, 17}, {300, 300, 300},
    {3, 17, 70000},
};
/* clang-format on */

START_TEST(test_matmul_extremes)
{
    TU_BEGIN_TEST();
    const mnk size = extreme_sizes[_i];
    for (int trans = 0; trans < 4; ++trans) {
        matmul_case mc = plain_case(size.m, size.n, size.k, trans & 1, (trans >> 1) & 1);
        mc.desc.beta = trans == 3 ? 0.5f : 0.0f;
        mc.use_bias = trans == 2;
        run_matmul_case(&mc);
    }
    TU_END_TEST();
}
END_TEST

/* More batch entries than one launch's grid dimension takes on some devices (65535): the
 * library must split the batch and advance the offsets of each part, broadcast included. */
START_TEST(test_matmul_many_batches)
{
    TU_BEGIN_TEST();
    /* Q·Kᵀ-like with B broadcast, then Aᵀ·B with A broadcast, bias and beta. */
    for (int variant = 0; variant < 2; ++variant) {
        matmul_case mc = plain_case(2, 3, 5, variant, !variant);
        mc.desc.batch = 66000 + (size_t)variant;
        mc.desc.stride_a = variant ? 0 : 2 * 5 + 1;
        mc.desc.stride_b = variant ? 5 * 3 : 0;
        mc.desc.stride_c = 2 * 3 + (size_t)variant;
        mc.a_offset = 3;
        mc.b_offset = 1;
        mc.c_offset = 2;
        mc.use_bias = variant;
        mc.desc.beta = variant ? -0.5f : 0.0f;
        run_matmul_case(&mc);
    }
    TU_END_TEST();
}
END_TEST

/* alpha != 1; beta == 0 with NaN in C (must not be read); beta != 0 with random C. */
START_TEST(test_matmul_alpha_beta)
{
    TU_BEGIN_TEST();
    static const float alphas[] = {-0.75f, 2.5f, 1.0f};
    static const float betas[] = {0.0f, 0.5f, 1.0f, -1.25f};
    static const mnk sizes[] = {{17, 65, 63}, {3, 1, 129}, {65, 127, 17}};
    for (int a = 0; a < COUNT_OF(alphas); ++a) {
        for (int b = 0; b < COUNT_OF(betas); ++b) {
            const mnk size = sizes[(size_t)(a + b) % 3];
            matmul_case mc = plain_case(size.m, size.n, size.k, b & 1, a & 1);
            mc.desc.alpha = alphas[a];
            mc.desc.beta = betas[b];
            run_matmul_case(&mc);
        }
    }
    TU_END_TEST();
}
END_TEST

START_TEST(test_matmul_bias)
{
    TU_BEGIN_TEST();
    static const mnk sizes[] = {{1, 1, 1}, {17, 63, 3}, {65, 129, 65}, {127, 17, 1}};
    for (int s = 0; s < COUNT_OF(sizes); ++s) {
        for (int trans = 0; trans < 4; ++trans) {
            matmul_case mc =
                plain_case(sizes[s].m, sizes[s].n, sizes[s].k, trans & 1, (trans >> 1) & 1);
            mc.use_bias = 1;
            mc.bias_offset = (size_t)(s * 5);
            mc.desc.alpha = trans == 3 ? 0.5f : 1.0f;
            mc.desc.beta = trans == 2 ? 0.75f : 0.0f;
            run_matmul_case(&mc);
        }
    }
    TU_END_TEST();
}
END_TEST

/* batch > 1 with packed strides and strides with gaps between entries. */
START_TEST(test_matmul_batched_strides)
{
    TU_BEGIN_TEST();
    static const mnk sizes[] = {{17, 63, 65}, {3, 1, 17}, {65, 3, 127}};
    static const size_t batches[] = {2, 3, 7};
    for (int s = 0; s < COUNT_OF(sizes); ++s) {
        for (int trans = 0; trans < 4; ++trans) {
            matmul_case mc =
                plain_case(sizes[s].m, sizes[s].n, sizes[s].k, trans & 1, (trans >> 1) & 1);
            size_t gap = (trans & 1) ? 5 : 0;
            mc.desc.batch = batches[s];
            mc.desc.stride_a = mc.desc.m * mc.desc.k + gap;
            mc.desc.stride_b = mc.desc.k * mc.desc.n + 2 * gap;
            mc.desc.stride_c = mc.desc.m * mc.desc.n + 3 * gap;
            run_matmul_case(&mc);
        }
    }
    TU_END_TEST();
}
END_TEST

/* stride 0: one matrix for every batch entry (B broadcast, as in x·W over a batch; also A). */
START_TEST(test_matmul_broadcast)
{
    TU_BEGIN_TEST();
    static const mnk sizes[] = {{17, 65, 63}, {1, 3, 129}, {63, 17, 3}};
    for (int s = 0; s < COUNT_OF(sizes); ++s) {
        for (int trans = 0; trans < 4; ++trans) {
            matmul_case mc =
                plain_case(sizes[s].m, sizes[s].n, sizes[s].k, trans & 1, (trans >> 1) & 1);
            mc.desc.batch = 3;
            mc.desc.stride_a = mc.desc.m * mc.desc.k;
            mc.desc.stride_b = 0;
            mc.desc.stride_c = mc.desc.m * mc.desc.n;
            if (s == 2) {
                mc.desc.stride_a = 0;
                mc.desc.stride_b = mc.desc.k * mc.desc.n;
            }
            mc.use_bias = trans == 1;
            run_matmul_case(&mc);
        }
    }
    TU_END_TEST();
}
END_TEST

/* Leading dimensions larger than packed and nonzero element offsets. */
START_TEST(test_matmul_leading_dims_and_offsets)
{
    TU_BEGIN_TEST();
    static const mnk sizes[] = {{17, 63, 65}, {1, 1, 1}, {129, 3, 17}, {3, 127, 63}};
    for (int s = 0; s < COUNT_OF(sizes); ++s) {
        for (int trans = 0; trans < 4; ++trans) {
            int trans_a = trans & 1, trans_b = (trans >> 1) & 1;
            matmul_case mc = plain_case(sizes[s].m, sizes[s].n, sizes[s].k, trans_a, trans_b);
            mc.desc.lda = (trans_a ? mc.desc.m : mc.desc.k) + 1 + (size_t)s;
            mc.desc.ldb = (trans_b ? mc.desc.k : mc.desc.n) + 7;
            mc.desc.ldc = mc.desc.n + 3 * (size_t)trans;
            mc.a_offset = 1 + tu_rand_below(40);
            mc.b_offset = 3 + tu_rand_below(40);
            mc.c_offset = 5 + tu_rand_below(40);
            mc.desc.beta = trans == 1 ? 0.5f : 0.0f;
            run_matmul_case(&mc);
        }
    }
    TU_END_TEST();
}
END_TEST

/* Every option at once, drawn at random: batch, strides with gaps, ld, offsets, trans, alpha,
 * beta, bias. */
START_TEST(test_matmul_random_combinations)
{
    TU_BEGIN_TEST();
    static const size_t dims[] = {1, 3, 17, 31, 63, 65, 97, 127, 129};
    for (int round = 0; round < 6; ++round) {
        matmul_case mc =
            plain_case(dims[tu_rand_below(9)], dims[tu_rand_below(9)], dims[tu_rand_below(9)],
                       (int)tu_rand_below(2), (int)tu_rand_below(2));
        clattn_matmul_desc *d = &mc.desc;
        d->batch = 1 + tu_rand_below(4);
        d->lda = (d->trans_a ? d->m : d->k) + tu_rand_below(3);
        d->ldb = (d->trans_b ? d->k : d->n) + tu_rand_below(3);
        d->ldc = d->n + tu_rand_below(3);
        d->stride_a = tu_rand_below(4) == 0 ? 0 : (d->trans_a ? d->k : d->m) * d->lda + 2;
        d->stride_b = tu_rand_below(3) == 0 ? 0 : (d->trans_b ? d->n : d->k) * d->ldb + 1;
        d->stride_c = d->m * d->ldc + tu_rand_below(4);
        d->alpha = (float)(tu_rand_unit() * 3.0 - 1.5);
        d->beta = tu_rand_below(2) ? (float)(tu_rand_unit() * 2.0 - 1.0) : 0.0f;
        mc.use_bias = (int)tu_rand_below(2);
        mc.a_offset = tu_rand_below(20);
        mc.b_offset = tu_rand_below(20);
        mc.c_offset = tu_rand_below(20);
        mc.bias_offset = tu_rand_below(20);
        run_matmul_case(&mc);
    }
    TU_END_TEST();
}
END_TEST

/* batch 0 is treated as 1; batch 1 ignores the strides. */
START_TEST(test_matmul_batch_zero_and_one)
{
    TU_BEGIN_TEST();
    matmul_case mc = plain_case(17, 65, 3, 0, 1);
    mc.desc.batch = 0;
    run_matmul_case(&mc);
    mc = plain_case(63, 3, 17, 1, 0);
    mc.desc.stride_a = 1000000;
    mc.desc.stride_b = 1000000;
    mc.desc.stride_c = 1000000;
    run_matmul_case(&mc);
    TU_END_TEST();
}
END_TEST

/* The same call issued twice on the same buffers gives the same (deterministic) result, and a
 * chain C1 = A·B, C2 = C1·Bᵀ with an event dependency works. */
START_TEST(test_matmul_event_chain)
{
    TU_BEGIN_TEST();
    const size_t m = 33, k = 65, n = 17;
    tu_set_case("chain m=%zu k=%zu n=%zu", m, k, n);
    float *a_host = tu_random_floats(m * k);
    float *b_host = tu_random_floats(k * n);
    cl_mem a_mem = tu_upload_floats(a_host, m * k);
    cl_mem b_mem = tu_upload_floats(b_host, k * n);
    cl_mem c1_mem = tu_nan_buffer(m * n);
    cl_mem c2_mem = tu_nan_buffer(m * k);
    clattn_tensor none = {NULL, 0};

    clattn_matmul_desc first = {.m = m, .n = n, .k = k, .alpha = 1.0f};
    clattn_matmul_desc second = {.m = m, .n = k, .k = n, .trans_b = 1, .alpha = 1.0f};
    cl_event first_done = NULL, second_done = NULL;
    clattn_status status = clattn_matmul(tu_ctx(), &first, tu_tensor(a_mem, 0), tu_tensor(b_mem, 0),
                                         none, tu_tensor(c1_mem, 0), 0, NULL, &first_done);
    tu_expect_status(status, CLATTN_SUCCESS, "clattn_matmul (first)");
    tu_expect(status != CLATTN_SUCCESS || first_done != NULL, "no event returned");
    if (first_done != NULL) {
        status = clattn_matmul(tu_ctx(), &second, tu_tensor(c1_mem, 0), tu_tensor(b_mem, 0), none,
                               tu_tensor(c2_mem, 0), 1, &first_done, &second_done);
        tu_expect_status(status, CLATTN_SUCCESS, "clattn_matmul (second)");
    }
    if (second_done != NULL) {
        tu_expect(clWaitForEvents(1, &second_done) == CL_SUCCESS, "clWaitForEvents failed");
        float *c1_got = tu_floats(m * n);
        float *c2_got = tu_floats(m * k);
        tu_read_floats(c1_mem, 0, m * n, c1_got);
        tu_read_floats(c2_mem, 0, m * k, c2_got);
        double *c1_ref = tu_doubles(m * n);
        double *c2_ref = tu_doubles(m * k);
        ref_matmul(&first, a_host, b_host, NULL, c1_ref);
        /* The second product's reference starts from the float C1 the device produced. */
        ref_matmul(&second, c1_got, b_host, NULL, c2_ref);
        tu_expect_close("C1", c1_got, c1_ref, m * n, TU_TOL);
        tu_expect_close("C2", c2_got, c2_ref, m * k, TU_TOL);
        free(c2_ref);
        free(c1_ref);
        free(c2_got);
        free(c1_got);
    }
    if (first_done != NULL) {
        clReleaseEvent(first_done);
    }
    if (second_done != NULL) {
        clReleaseEvent(second_done);
    }
    tu_release_mem(c2_mem);
    tu_release_mem(c1_mem);
    tu_release_mem(b_mem);
    tu_release_mem(a_mem);
    free(b_host);
    free(a_host);
    TU_END_TEST();
}
END_TEST

/* stride_c = 0 with batch > 1 would write every batch entry to one C: refused before anything
 * is enqueued (C keeps its NaN), with a message naming stride_c. The same call with a real
 * stride, and batch 1 with stride_c = 0 (the stride is ignored), compute the reference. */
START_TEST(test_matmul_stride_c_zero)
{
    TU_BEGIN_TEST();
    const size_t m = 17, n = 9, k = 5;
    for (size_t batch = 2; batch <= 3; ++batch) {
        tu_set_case("batch=%zu m=%zu n=%zu k=%zu stride_c=0", batch, m, n, k);
        const clattn_matmul_desc desc = {.batch = batch,
                                         .m = m,
                                         .n = n,
                                         .k = k,
                                         .stride_a = m * k,
                                         .stride_b = k * n,
                                         .stride_c = 0,
                                         .alpha = 1.0f};
        float *a_host = tu_random_floats(batch * m * k), *b_host = tu_random_floats(batch * k * n);
        cl_mem a_mem = tu_upload_floats(a_host, batch * m * k);
        cl_mem b_mem = tu_upload_floats(b_host, batch * k * n);
        cl_mem c_mem = tu_nan_buffer(batch * m * n);
        clattn_status status =
            clattn_matmul(tu_ctx(), &desc, tu_tensor(a_mem, 0), tu_tensor(b_mem, 0),
                          tu_tensor(NULL, 0), tu_tensor(c_mem, 0), 0, NULL, NULL);
        if (tu_expect_status(status, CLATTN_ERR_INVALID_SHAPE, "matmul(stride_c = 0)")) {
            const char *message = clattn_last_error(tu_ctx());
            tu_expect(tu_starts_with(message, "matmul:") && tu_mentions_word(message, "stride_c"),
                      "message '%s' does not start with 'matmul:' and name stride_c", message);
        }
        float *c_got = tu_floats(batch * m * n);
        tu_read_floats(c_mem, 0, batch * m * n, c_got);
        tu_expect_nan_outside("C after the refused call", c_got, batch * m * n, 0, 0);
        free(c_got);
        tu_release_mem(c_mem);
        tu_release_mem(b_mem);
        tu_release_mem(a_mem);
        free(b_host);
        free(a_host);

        matmul_case mc = plain_case(m, n, k, 0, 0);
        mc.desc.batch = batch;
        mc.desc.stride_a = m * k;
        mc.desc.stride_b = k * n;
        mc.desc.stride_c = m * n;
        run_matmul_case(&mc);
    }
    matmul_case single = plain_case(m, n, k, 1, 1);
    single.desc.stride_a = 0;
    single.desc.stride_b = 0;
    single.desc.stride_c = 0;
    run_matmul_case(&single);
    TU_END_TEST();
}
END_TEST

/* A reduced run (CLATTN_TEST_SCALE=small, for Oclgrind) leaves out the products of more than
 * this many multiply-adds or with a longer K (minutes each there with GPU tiles: 256 x 192 x
 * 320, 300^3, K = 4099, 5000, 70000), naming them in not_run_. */
#define SMALL_MAX_MACS 4000000u
#define SMALL_MAX_K 2048u
/* ... and runs every SMALL_GRID_STRIDE-th product of the full grid (prime to 7: every m, n, k). */
#define SMALL_GRID_STRIDE 16
static char not_run_[512];

static void add_size_loop(TCase *tcase, const TTest *test, const char *name, const mnk *sizes,
                          int count)
{
    for (int i = 0; i < count; ++i) {
        if (tu_small() &&
            (sizes[i].m * sizes[i].n * sizes[i].k > SMALL_MAX_MACS || sizes[i].k > SMALL_MAX_K)) {
            size_t used = strlen(not_run_);
            snprintf(not_run_ + used, sizeof not_run_ - used, "%s%s case %d (%zux%zux%zu)",
                     used ? ", " : "", name, i, sizes[i].m, sizes[i].n, sizes[i].k);
            continue;
        }
        tcase_add_loop_test(tcase, test, i, i + 1);
    }
}

static Suite *matmul_suite(void)
{
    Suite *suite = suite_create("matmul");
    TCase *sizes = tcase_create("sizes");
    tcase_set_timeout(sizes, 600);
    tcase_add_loop_test(sizes, test_matmul_awkward_sizes, 0, COUNT_OF(awkward_sizes));
    add_size_loop(sizes, test_matmul_primes_and_large, "test_matmul_primes_and_large",
                  prime_and_large_sizes, COUNT_OF(prime_and_large_sizes));
    const int small = tu_small();
    for (int i = 0; i < GRID_SIDE * GRID_SIDE * GRID_SIDE; i += small ? SMALL_GRID_STRIDE : 1)
        tcase_add_loop_test(sizes, test_matmul_full_grid, i, i + 1);
    add_size_loop(sizes, test_matmul_extremes, "test_matmul_extremes", extreme_sizes,
                  COUNT_OF(extreme_sizes));
    if (small)
        tu_not_run("%s; test_matmul_full_grid but every %dth product; test_matmul_many_batches "
                   "(66000 batch entries); test_matmul_random_combinations 2-3: minutes on "
                   "Oclgrind; every tile edge is in the other sizes",
                   not_run_, SMALL_GRID_STRIDE);
    else
        tcase_add_test(sizes, test_matmul_many_batches);
    suite_add_tcase(suite, sizes);

    TCase *options = tcase_create("options");
    tcase_set_timeout(options, 600);
    tcase_add_test(options, test_matmul_alpha_beta);
    tcase_add_test(options, test_matmul_bias);
    tcase_add_test(options, test_matmul_batched_strides);
    tcase_add_test(options, test_matmul_broadcast);
    tcase_add_test(options, test_matmul_leading_dims_and_offsets);
    tcase_add_loop_test(options, test_matmul_random_combinations, 0, small ? 2 : 4);
    tcase_add_test(options, test_matmul_batch_zero_and_one);
    tcase_add_test(options, test_matmul_event_chain);
    tcase_add_test(options, test_matmul_stride_c_zero);
    suite_add_tcase(suite, options);
    return suite;
}

int main(void)
{
    tu_suite_begin("check_matmul");
    return tu_run_suite(matmul_suite());
}
