/*
 * check_matmul: the public clattn_matmul on strided, typed tensors against the float64
 * reference.
 *
 * Every operand lives in a buffer of exactly offset + extent (+ 3) elements with poison (NaN)
 * in every element that is not part of the tensor (before the offset, between rows when the
 * row stride exceeds the columns, between batch entries), so a read outside the described
 * tensors turns the result into NaN, and a write outside C shows up as a non-poison element.
 * Operands are drawn as an image of their buffer, so that elements which share an address
 * (a batch dim of stride 0, overlapping head views) hold the same value in the logical arrays
 * the reference reads. F16 and BF16 operands hold values rounded to their dtype; the reference
 * sees the rounded values, and C stored in 16 bits is judged at pb_tolerance(dtype).
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problems.h"
#include "reference.h"
#include "testutil.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

/* A batch stride for dims of size 1: any value works there (it is never multiplied by more
 * than 0), so a wild one checks that it is ignored. */
#define IGNORED_STRIDE 1000003u

/* One operand of a case: its matrix as stored (rows x cols), up to two batch dims, and how it
 * is laid out. */
typedef struct operand_spec {
    size_t batch[2];      /* 1 (broadcast) or C's; only the last rank - 2 of them are used */
    int rank;             /* 2 to 4 (0: C's rank) */
    unsigned zero_stride; /* bit d: batch dim d keeps its size with stride 0 (broadcast) */
    size_t row_gap;       /* the row stride exceeds cols by this much */
    size_t batch_gap;     /* extra elements between batch entries */
    size_t offset;
    clattn_dtype dtype;
    /* A (B, L, H*d) buffer read as the (B, H, L, d) heads: rank 4, batch = (B, H), the matrix
     * (L, d); strides (L*H*d + gap, d, H*d + row_gap, 1). */
    int heads_view;
    /* Every stride 0: the API's "packed" default (no gaps, no broadcast, no heads view). */
    int packed_default;
} operand_spec;

typedef struct matmul_case {
    size_t m, n, k;
    int trans_a, trans_b;
    int rank;        /* C's rank: 2 (no batch), 3 (batch[1]) or 4 (batch[0], batch[1]) */
    size_t batch[2]; /* C's batch dims (unused ones 1) */
    operand_spec a, b, c;
    float alpha, beta;
    int use_bias;
    size_t bias_offset;
} matmul_case;

static matmul_case plain_case(size_t m, size_t n, size_t k, int trans_a, int trans_b)
{
    matmul_case mc;
    memset(&mc, 0, sizeof mc);
    mc.m = m, mc.n = n, mc.k = k;
    mc.trans_a = trans_a, mc.trans_b = trans_b;
    mc.rank = 2;
    mc.batch[0] = mc.batch[1] = 1;
    mc.a.batch[0] = mc.a.batch[1] = mc.b.batch[0] = mc.b.batch[1] = 1;
    mc.c.batch[0] = mc.c.batch[1] = 1;
    mc.alpha = 1.0f;
    return mc;
}

/* Batched over C's dims `b0` x `b1` (rank 4; b0 == 0: rank 3 over b1), A and B not broadcast. */
static void set_batch(matmul_case *mc, size_t b0, size_t b1)
{
    mc->rank = b0 ? 4 : 3;
    mc->batch[0] = b0 ? b0 : 1, mc->batch[1] = b1;
    operand_spec *ops[3] = {&mc->a, &mc->b, &mc->c};
    for (int i = 0; i < 3; ++i) {
        ops[i]->batch[0] = mc->batch[0];
        ops[i]->batch[1] = mc->batch[1];
    }
}

static void describe(const matmul_case *mc)
{
    const operand_spec *a = &mc->a, *b = &mc->b, *c = &mc->c;
    tu_set_case("m=%zu n=%zu k=%zu trans_a=%d trans_b=%d rank=%d batch=(%zu,%zu) "
                "A{batch=(%zu,%zu) rank=%d zero=%u gaps=%zu,%zu off=%zu %s%s} "
                "B{batch=(%zu,%zu) rank=%d zero=%u gaps=%zu,%zu off=%zu %s%s} "
                "C{gaps=%zu,%zu off=%zu %s%s} alpha=%g beta=%g bias=%d@%zu",
                mc->m, mc->n, mc->k, mc->trans_a, mc->trans_b, mc->rank, mc->batch[0], mc->batch[1],
                a->batch[0], a->batch[1], a->rank, a->zero_stride, a->row_gap, a->batch_gap,
                a->offset, pb_dtype_name(a->dtype), a->heads_view ? " heads" : "", b->batch[0],
                b->batch[1], b->rank, b->zero_stride, b->row_gap, b->batch_gap, b->offset,
                pb_dtype_name(b->dtype), b->heads_view ? " heads" : "", c->row_gap, c->batch_gap,
                c->offset, pb_dtype_name(c->dtype), c->heads_view ? " heads" : "",
                (double)mc->alpha, (double)mc->beta, mc->use_bias, mc->bias_offset);
}

/* The tensor layout of an operand with a rows x cols matrix (mem NULL). */
static clattn_tensor operand_layout(const operand_spec *spec, int c_rank, size_t rows, size_t cols)
{
    clattn_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = spec->dtype;
    if (spec->heads_view) {
        const size_t heads = spec->batch[1], seq = rows, width = heads * cols + spec->row_gap;
        t.rank = 4;
        t.dims[0] = spec->batch[0], t.dims[1] = heads, t.dims[2] = seq, t.dims[3] = cols;
        t.strides[0] = seq * width + spec->batch_gap;
        t.strides[1] = cols, t.strides[2] = width, t.strides[3] = 1;
        return t;
    }
    const int rank = spec->rank ? spec->rank : c_rank;
    t.rank = rank;
    const size_t ld = cols + spec->row_gap;
    t.dims[rank - 2] = rows, t.dims[rank - 1] = cols;
    t.strides[rank - 2] = ld, t.strides[rank - 1] = 1;
    size_t inner = rows * ld + spec->batch_gap; /* elements one entry of the inner dim spans */
    for (int d = rank - 3, batch_dim = 1; d >= 0; --d, --batch_dim) {
        const size_t size = spec->batch[batch_dim];
        t.dims[d] = size;
        if (spec->zero_stride & (1u << batch_dim)) {
            t.strides[d] = 0;
        } else if (size == 1) {
            t.strides[d] = IGNORED_STRIDE;
        } else {
            t.strides[d] = inner;
            inner = size * inner + spec->batch_gap;
        }
    }
    if (spec->packed_default) {
        for (int d = 0; d < rank; ++d)
            t.strides[d] = 0;
    }
    return t;
}

/* Random values for every element t reaches, rounded to its dtype and gathered into logical
 * packed order (aliased elements hold the same value). */
static float *draw_logical(const clattn_tensor *t)
{
    const size_t extent = pb_tensor_extent(t), count = pb_tensor_count(t);
    float *image = tu_floats(extent), *logical = tu_floats(count);
    tu_fill_uniform(image, extent, -1.0f, 1.0f);
    pb_round_array(t->dtype, image, extent);
    size_t strides[CLATTN_MAX_RANK];
    pb_tensor_strides(t, strides);
    for (size_t i = 0; i < count; ++i) {
        size_t rest = i, at = 0;
        for (int d = t->rank - 1; d >= 0; --d) {
            at += (rest % t->dims[d]) * strides[d];
            rest /= t->dims[d];
        }
        logical[i] = image[at];
    }
    free(image);
    return logical;
}

/* The batch dims of a layout as the reference takes them (right-aligned, 1 where absent). */
static void ref_batch(const clattn_tensor *t, size_t out[2])
{
    out[0] = t->rank >= 4 ? t->dims[t->rank - 4] : 1;
    out[1] = t->rank >= 3 ? t->dims[t->rank - 3] : 1;
}

/* The scale a float32 result of this product is judged at. A dot product of k random terms is
 * about sqrt(k) terms in size; when cancellation makes one much smaller (a 1 x 1 x 5000 product
 * that lands near 0), its rounding error still follows the terms, so the error is measured
 * against max(max |C|, max (|alpha| |A| |B| + |beta| |C| + |bias|) / sqrt(k)), both from the
 * float64 reference. */
static double typical_magnitude(const ref_matmul_shape *shape, const float *a, size_t a_count,
                                const float *b, size_t b_count, const float *bias, const float *c,
                                size_t c_count)
{
    float *abs_a = tu_floats(a_count), *abs_b = tu_floats(b_count);
    float *abs_bias = bias ? tu_floats(shape->n) : NULL;
    double *abs_c = tu_doubles(c_count);
    for (size_t i = 0; i < a_count; ++i)
        abs_a[i] = fabsf(a[i]);
    for (size_t i = 0; i < b_count; ++i)
        abs_b[i] = fabsf(b[i]);
    for (size_t i = 0; bias && i < shape->n; ++i)
        abs_bias[i] = fabsf(bias[i]);
    for (size_t i = 0; c != NULL && i < c_count; ++i)
        abs_c[i] = fabs((double)c[i]);
    ref_matmul_shape abs_shape = *shape;
    abs_shape.alpha = fabsf(shape->alpha);
    abs_shape.beta = fabsf(shape->beta);
    ref_matmul(&abs_shape, abs_a, abs_b, abs_bias, abs_c);
    double largest = 0.0;
    for (size_t i = 0; i < c_count; ++i)
        if (abs_c[i] > largest)
            largest = abs_c[i];
    free(abs_a);
    free(abs_b);
    free(abs_bias);
    free(abs_c);
    return largest / sqrt((double)shape->k);
}

static void expect_close_to_magnitude(const float *got, const double *ref, size_t count,
                                      double magnitude, double tol)
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
    tu_expect(err <= tol,
              "C: relative error %.3g > %.1e (worst at [%zu]: got %.9g, want %.9g; scale %.3g)",
              err, tol, worst, count ? (double)got[worst] : 0.0, count ? ref[worst] : 0.0, scale);
}

/* Runs one case on ctx (NULL: the shared context) and checks C against the reference. */
static void run_case_on(clattn_ctx *ctx, const matmul_case *mc)
{
    ctx = ctx ? ctx : tu_ctx();
    describe(mc);
    const size_t a_rows = mc->trans_a ? mc->k : mc->m, a_cols = mc->trans_a ? mc->m : mc->k;
    const size_t b_rows = mc->trans_b ? mc->n : mc->k, b_cols = mc->trans_b ? mc->k : mc->n;
    clattn_tensor a = operand_layout(&mc->a, mc->rank, a_rows, a_cols);
    clattn_tensor b = operand_layout(&mc->b, mc->rank, b_rows, b_cols);
    operand_spec c_spec = mc->c;
    c_spec.batch[0] = mc->batch[0], c_spec.batch[1] = mc->batch[1], c_spec.zero_stride = 0;
    c_spec.rank = 0;
    clattn_tensor c = operand_layout(&c_spec, mc->rank, mc->m, mc->n);
    clattn_tensor bias = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, mc->n, 0, 0, 0);
    const size_t a_count = pb_tensor_count(&a), b_count = pb_tensor_count(&b);
    const size_t c_count = pb_tensor_count(&c);

    float *a_values = draw_logical(&a), *b_values = draw_logical(&b);
    float *c_values = mc->beta != 0.0f ? draw_logical(&c) : NULL;
    float *bias_values = mc->use_bias ? tu_random_floats(mc->n) : NULL;

    ref_matmul_shape shape = {
        .batch = {mc->batch[0], mc->batch[1]},
        .m = mc->m,
        .n = mc->n,
        .k = mc->k,
        .trans_a = mc->trans_a,
        .trans_b = mc->trans_b,
        .alpha = mc->alpha,
        .beta = mc->beta,
    };
    ref_batch(&a, shape.a_batch);
    ref_batch(&b, shape.b_batch);
    double *c_ref = tu_doubles(c_count);
    if (c_values != NULL)
        tu_floats_to_doubles(c_values, c_count, c_ref);
    ref_matmul(&shape, a_values, b_values, bias_values, c_ref);
    const double magnitude = typical_magnitude(&shape, a_values, a_count, b_values, b_count,
                                               bias_values, c_values, c_count);

    cl_int err = pb_upload(ctx, &a, mc->a.offset, a_values);
    if (err == CL_SUCCESS)
        err = pb_upload(ctx, &b, mc->b.offset, b_values);
    if (err == CL_SUCCESS)
        err = pb_upload(ctx, &c, mc->c.offset, c_values);
    if (err == CL_SUCCESS && mc->use_bias)
        err = pb_upload(ctx, &bias, mc->bias_offset, bias_values);
    if (err == CL_SUCCESS) {
        const clattn_matmul_desc desc = {.struct_size = sizeof desc,
                                         .trans_a = mc->trans_a,
                                         .trans_b = mc->trans_b,
                                         .alpha = mc->alpha,
                                         .beta = mc->beta};
        clattn_status status =
            clattn_matmul(ctx, &desc, &a, &b, mc->use_bias ? &bias : NULL, &c, 0, NULL, NULL);
        if (status != CLATTN_SUCCESS) {
            tu_expect(0, "clattn_matmul returned %s: %s", clattn_status_string(status),
                      clattn_last_error(ctx));
        } else {
            float *c_got = tu_floats(c_count);
            size_t stray = 0;
            if (pb_download(ctx, NULL, &c, c_got, &stray) == CL_SUCCESS) {
                tu_expect(stray == 0, "%zu elements of C's buffer outside C were written", stray);
                expect_close_to_magnitude(c_got, c_ref, c_count, magnitude,
                                          pb_tolerance(mc->c.dtype));
            }
            free(c_got);
        }
    }
    tu_release_mem(bias.mem);
    tu_release_mem(c.mem);
    tu_release_mem(b.mem);
    tu_release_mem(a.mem);
    free(c_ref);
    free(bias_values);
    free(c_values);
    free(b_values);
    free(a_values);
}

static void run_matmul_case(const matmul_case *mc)
{
    run_case_on(NULL, mc);
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

/* Long K (blocked on CPUs; split into several launches under CLATTN_LOOP_TRIP_LIMIT, the
 * matmul_split ctest entry), wide N or tall M beyond any tile, and a larger cube. K = 70000
 * passes llvmpipe's 65535 loop iterations per work-item (K split there, see tuning/table.h). */
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
        mc.beta = trans == 3 ? 0.5f : 0.0f;
        mc.use_bias = trans == 2;
        run_matmul_case(&mc);
    }
    TU_END_TEST();
}
END_TEST

/* More batch entries than one launch's grid dimension takes on some devices (65535): the
 * library must split the batch and advance the offsets of each part, broadcast included, over
 * one batch dim and over two (the split falls inside the outer dim). */
START_TEST(test_matmul_many_batches)
{
    TU_BEGIN_TEST();
    /* Q·Kᵀ-like with B broadcast by rank, over 66000 entries. */
    matmul_case mc = plain_case(2, 3, 5, 0, 1);
    set_batch(&mc, 0, 66000);
    mc.b.rank = 2;
    mc.a.batch_gap = 1, mc.a.offset = 3, mc.b.offset = 1, mc.c.offset = 2;
    run_matmul_case(&mc);
    /* Aᵀ·B over (3, 22001) with A broadcast along dim 0 (size 1) and B along dim 1 (stride 0),
     * bias and beta. */
    mc = plain_case(2, 3, 5, 1, 0);
    set_batch(&mc, 3, 22001);
    mc.a.batch[0] = 1;
    mc.b.zero_stride = 2;
    mc.c.batch_gap = 1, mc.a.offset = 3, mc.c.offset = 2;
    mc.use_bias = 1, mc.beta = -0.5f;
    run_matmul_case(&mc);
    TU_END_TEST();
}
END_TEST

/* alpha != 1; beta == 0 with NaN in C (must not be read); beta != 0 with random C. */
START_TEST(test_matmul_alpha_beta)
{
    TU_BEGIN_TEST();
    static const float alphas[] = {-0.75f, 2.5f, 1.0f, 0.0f};
    static const float betas[] = {0.0f, 0.5f, 1.0f, -1.25f};
    static const mnk sizes[] = {{17, 65, 63}, {3, 1, 129}, {65, 127, 17}};
    for (int a = 0; a < COUNT_OF(alphas); ++a) {
        for (int b = 0; b < COUNT_OF(betas); ++b) {
            const mnk size = sizes[(size_t)(a + b) % 3];
            matmul_case mc = plain_case(size.m, size.n, size.k, b & 1, a & 1);
            mc.alpha = alphas[a];
            mc.beta = betas[b];
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
            mc.alpha = trans == 3 ? 0.5f : 1.0f;
            mc.beta = trans == 2 ? 0.75f : 0.0f;
            run_matmul_case(&mc);
        }
    }
    TU_END_TEST();
}
END_TEST

/* One batch dim with packed strides and with gaps between entries. */
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
            set_batch(&mc, 0, batches[s]);
            mc.a.batch_gap = gap, mc.b.batch_gap = 2 * gap, mc.c.batch_gap = 3 * gap;
            run_matmul_case(&mc);
        }
    }
    TU_END_TEST();
}
END_TEST

/* Operands with every stride 0 (packed, the API's default), non-square so that a row stride
 * taken from the wrong dim shows, with and without a batch dim. */
START_TEST(test_matmul_packed_default)
{
    TU_BEGIN_TEST();
    static const mnk sizes[] = {{17, 63, 65}, {3, 1, 17}, {65, 3, 127}};
    for (int s = 0; s < COUNT_OF(sizes); ++s) {
        for (int trans = 0; trans < 4; ++trans) {
            matmul_case mc =
                plain_case(sizes[s].m, sizes[s].n, sizes[s].k, trans & 1, (trans >> 1) & 1);
            if (s == 1)
                set_batch(&mc, 0, 3);
            mc.a.packed_default = mc.b.packed_default = mc.c.packed_default = 1;
            run_matmul_case(&mc);
        }
    }
    TU_END_TEST();
}
END_TEST

/* One matrix for every batch entry: a batch dim of 1, a batch dim of C's size with stride 0,
 * or a lower rank (B as in x·W over a batch; also A). */
START_TEST(test_matmul_broadcast)
{
    TU_BEGIN_TEST();
    static const mnk sizes[] = {{17, 65, 63}, {1, 3, 129}, {63, 17, 3}};
    for (int s = 0; s < COUNT_OF(sizes); ++s) {
        for (int trans = 0; trans < 4; ++trans) {
            matmul_case mc =
                plain_case(sizes[s].m, sizes[s].n, sizes[s].k, trans & 1, (trans >> 1) & 1);
            set_batch(&mc, 0, 3);
            operand_spec *broadcast = s == 2 ? &mc.a : &mc.b;
            if (trans == 0)
                broadcast->batch[1] = 1; /* dim of size 1 */
            else if (trans == 1)
                broadcast->zero_stride = 2; /* dim of 3 with stride 0 */
            else if (trans == 2)
                broadcast->rank = 2; /* no batch dim at all */
            else
                broadcast->batch[1] = 1, broadcast->rank = 4, broadcast->batch[0] = 1;
            mc.use_bias = trans == 1;
            run_matmul_case(&mc);
        }
    }
    TU_END_TEST();
}
END_TEST

/* Two batch dims (rank 4): each of A and B broadcast along none, one or both of them, by a dim
 * of 1 or by stride 0, with gaps between entries. */
START_TEST(test_matmul_two_batch_dims)
{
    TU_BEGIN_TEST();
    static const mnk sizes[] = {{17, 9, 33}, {5, 63, 2}, {65, 3, 17}, {1, 1, 7}};
    const mnk size = sizes[_i % COUNT_OF(sizes)];
    for (int variant = 0; variant < 9; ++variant) {
        matmul_case mc = plain_case(size.m, size.n, size.k, variant & 1, (variant >> 1) & 1);
        set_batch(&mc, 2 + (size_t)_i % 2, 3);
        /* A: variant % 3 picks none, dim 0 of size 1, dim 1 by stride 0; B: variant / 3. */
        if (variant % 3 == 1)
            mc.a.batch[0] = 1;
        else if (variant % 3 == 2)
            mc.a.zero_stride = 2;
        if (variant / 3 == 1)
            mc.b.batch[1] = 1;
        else if (variant / 3 == 2)
            mc.b.zero_stride = 1, mc.b.batch[1] = 1;
        mc.a.batch_gap = (size_t)variant % 3;
        mc.b.batch_gap = (size_t)variant % 2;
        mc.c.batch_gap = (size_t)variant % 4;
        mc.c.row_gap = (size_t)variant % 3;
        mc.use_bias = variant % 4 == 3;
        mc.beta = variant % 3 == 1 ? 0.5f : 0.0f;
        run_matmul_case(&mc);
    }
    TU_END_TEST();
}
END_TEST

/* Row strides larger than the columns (the old lda, ldb, ldc) and nonzero element offsets. */
START_TEST(test_matmul_leading_dims_and_offsets)
{
    TU_BEGIN_TEST();
    static const mnk sizes[] = {{17, 63, 65}, {1, 1, 1}, {129, 3, 17}, {3, 127, 63}};
    for (int s = 0; s < COUNT_OF(sizes); ++s) {
        for (int trans = 0; trans < 4; ++trans) {
            int trans_a = trans & 1, trans_b = (trans >> 1) & 1;
            matmul_case mc = plain_case(sizes[s].m, sizes[s].n, sizes[s].k, trans_a, trans_b);
            mc.a.row_gap = 1 + (size_t)s;
            mc.b.row_gap = 7;
            mc.c.row_gap = 3 * (size_t)trans;
            mc.a.offset = 1 + tu_rand_below(40);
            mc.b.offset = 3 + tu_rand_below(40);
            mc.c.offset = 5 + tu_rand_below(40);
            mc.beta = trans == 1 ? 0.5f : 0.0f;
            run_matmul_case(&mc);
        }
    }
    TU_END_TEST();
}
END_TEST

/* A, B and C each F32, F16 or BF16 (27 combinations, each its own kernel variant), every
 * transpose combination, with beta (C read in its dtype) and bias. */
START_TEST(test_matmul_dtypes)
{
    TU_BEGIN_TEST();
    static const clattn_dtype dtypes[3] = {CLATTN_DTYPE_F32, CLATTN_DTYPE_F16, CLATTN_DTYPE_BF16};
    static const mnk sizes[] = {{17, 65, 63}, {1, 3, 129}, {65, 17, 5}, {33, 129, 17}};
    const clattn_dtype a_dtype = dtypes[_i % 3], b_dtype = dtypes[(_i / 3) % 3];
    const clattn_dtype c_dtype = dtypes[_i / 9];
    for (int trans = 0; trans < 4; ++trans) {
        const mnk size = sizes[(size_t)(trans + _i) % COUNT_OF(sizes)];
        matmul_case mc = plain_case(size.m, size.n, size.k, trans & 1, (trans >> 1) & 1);
        mc.a.dtype = a_dtype, mc.b.dtype = b_dtype, mc.c.dtype = c_dtype;
        if (trans >= 2)
            set_batch(&mc, 0, 2);
        if (trans == 3)
            mc.b.zero_stride = 2;
        mc.beta = trans == 1 || trans == 3 ? -0.75f : 0.0f;
        mc.use_bias = trans >= 2;
        mc.alpha = trans == 2 ? 0.5f : 1.0f;
        mc.a.offset = (size_t)trans, mc.b.offset = 2 * (size_t)trans;
        mc.c.offset = 1, mc.c.row_gap = (size_t)trans % 2;
        run_matmul_case(&mc);
    }
    TU_END_TEST();
}
END_TEST

/* Attention's products on head views of (batch, seq, heads * head_dim) buffers, no copies:
 * Q·Kᵀ with both read as (B, H, L, d) heads (the scores), P·V with V a heads view and C
 * written into a heads view of a (B, L, H*dv) output, and Aᵀ·B with A a heads view. */
START_TEST(test_matmul_head_views)
{
    TU_BEGIN_TEST();
    static const struct {
        size_t batch, heads, seq_q, seq_k, d, dv;
    } shapes[] = {{2, 3, 17, 9, 8, 5}, {1, 4, 33, 65, 16, 16}, {3, 2, 1, 7, 3, 64}};
    for (int s = 0; s < COUNT_OF(shapes); ++s) {
        const size_t b = shapes[s].batch, h = shapes[s].heads;
        /* scores = Q·Kᵀ, both heads views (rows padded in the second shape). */
        matmul_case mc = plain_case(shapes[s].seq_q, shapes[s].seq_k, shapes[s].d, 0, 1);
        set_batch(&mc, b, h);
        mc.a.heads_view = mc.b.heads_view = 1;
        mc.a.row_gap = s == 1 ? 3 : 0, mc.b.batch_gap = (size_t)s;
        mc.a.dtype = s == 2 ? CLATTN_DTYPE_F16 : CLATTN_DTYPE_F32;
        mc.alpha = 1.0f / sqrtf((float)shapes[s].d);
        run_matmul_case(&mc);
        /* out = P·V into a heads view of (B, Lq, H*dv). */
        mc = plain_case(shapes[s].seq_q, shapes[s].dv, shapes[s].seq_k, 0, 0);
        set_batch(&mc, b, h);
        mc.b.heads_view = mc.c.heads_view = 1;
        mc.c.row_gap = (size_t)s, mc.c.offset = 4;
        mc.c.dtype = s == 1 ? CLATTN_DTYPE_BF16 : CLATTN_DTYPE_F32;
        run_matmul_case(&mc);
        /* Aᵀ·B with A = a heads view (d x Lq as op(A) is the transposed head). */
        mc = plain_case(shapes[s].d, shapes[s].dv, shapes[s].seq_q, 1, 0);
        set_batch(&mc, b, h);
        mc.a.heads_view = 1;
        mc.b.batch[0] = 1, mc.b.rank = 4;
        mc.use_bias = 1, mc.beta = 0.25f;
        run_matmul_case(&mc);
    }
    TU_END_TEST();
}
END_TEST

/* Every option at once, drawn at random: rank, batch dims and broadcasts, gaps, offsets,
 * trans, dtypes, alpha, beta, bias. */
START_TEST(test_matmul_random_combinations)
{
    TU_BEGIN_TEST();
    static const size_t dims[] = {1, 3, 17, 31, 63, 65, 97, 127, 129};
    static const clattn_dtype dtypes[3] = {CLATTN_DTYPE_F32, CLATTN_DTYPE_F16, CLATTN_DTYPE_BF16};
    for (int round = 0; round < 6; ++round) {
        matmul_case mc =
            plain_case(dims[tu_rand_below(9)], dims[tu_rand_below(9)], dims[tu_rand_below(9)],
                       (int)tu_rand_below(2), (int)tu_rand_below(2));
        const int rank = 2 + (int)tu_rand_below(3);
        if (rank > 2)
            set_batch(&mc, rank == 4 ? 1 + tu_rand_below(3) : 0, 1 + tu_rand_below(4));
        operand_spec *ops[3] = {&mc.a, &mc.b, &mc.c};
        for (int i = 0; i < 3; ++i) {
            operand_spec *op = ops[i];
            op->row_gap = tu_rand_below(3);
            op->batch_gap = tu_rand_below(4);
            op->offset = tu_rand_below(20);
            op->dtype = tu_rand_below(3) == 0 ? dtypes[1 + tu_rand_below(2)] : CLATTN_DTYPE_F32;
            if (i < 2) {
                for (int d = 0; d < 2; ++d) {
                    const size_t pick = tu_rand_below(4);
                    if (pick == 0)
                        op->batch[d] = 1;
                    else if (pick == 1)
                        op->zero_stride |= 1u << d;
                }
            }
        }
        mc.alpha = (float)(tu_rand_unit() * 3.0 - 1.5);
        mc.beta = tu_rand_below(2) ? (float)(tu_rand_unit() * 2.0 - 1.0) : 0.0f;
        mc.use_bias = (int)tu_rand_below(2);
        mc.bias_offset = tu_rand_below(20);
        run_matmul_case(&mc);
    }
    TU_END_TEST();
}
END_TEST

/* Batch dims of 1 ignore their strides (a wild stride there is never used); rank 2 operands
 * with a rank 4 C. */
START_TEST(test_matmul_batch_dims_of_one)
{
    TU_BEGIN_TEST();
    matmul_case mc = plain_case(17, 65, 3, 0, 1);
    set_batch(&mc, 1, 1); /* rank 4, every batch dim 1: strides IGNORED_STRIDE */
    run_matmul_case(&mc);
    mc = plain_case(63, 3, 17, 1, 0);
    set_batch(&mc, 0, 1);
    mc.c.batch_gap = 5;
    run_matmul_case(&mc);
    mc = plain_case(9, 5, 7, 1, 1);
    set_batch(&mc, 2, 3);
    mc.a.rank = 2, mc.b.rank = 3, mc.b.batch[1] = 1;
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
    clattn_ctx *ctx = tu_ctx();
    float *a_host = tu_random_floats(m * k);
    float *b_host = tu_random_floats(k * n);
    cl_mem a_mem = tu_upload_floats(a_host, m * k);
    cl_mem b_mem = tu_upload_floats(b_host, k * n);
    cl_mem c1_mem = tu_nan_buffer(m * n);
    cl_mem c2_mem = tu_nan_buffer(m * k);
    const clattn_tensor a = clattn_tensor_make(a_mem, 0, CLATTN_DTYPE_F32, 2, m, k, 0, 0);
    const clattn_tensor b = clattn_tensor_make(b_mem, 0, CLATTN_DTYPE_F32, 2, k, n, 0, 0);
    const clattn_tensor c1 = clattn_tensor_make(c1_mem, 0, CLATTN_DTYPE_F32, 2, m, n, 0, 0);
    const clattn_tensor c2 = clattn_tensor_make(c2_mem, 0, CLATTN_DTYPE_F32, 2, m, k, 0, 0);

    const clattn_matmul_desc first = {.struct_size = sizeof first, .alpha = 1.0f};
    const clattn_matmul_desc second = {.struct_size = sizeof second, .trans_b = 1, .alpha = 1.0f};
    cl_event first_done = NULL, second_done = NULL;
    clattn_status status = clattn_matmul(ctx, &first, &a, &b, NULL, &c1, 0, NULL, &first_done);
    tu_expect_status(status, CLATTN_SUCCESS, "clattn_matmul (first)");
    tu_expect(status != CLATTN_SUCCESS || first_done != NULL, "no event returned");
    if (first_done != NULL) {
        status = clattn_matmul(ctx, &second, &c1, &b, NULL, &c2, 1, &first_done, &second_done);
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
        const ref_matmul_shape first_shape = {.m = m, .n = n, .k = k, .alpha = 1.0f};
        const ref_matmul_shape second_shape = {.m = m, .n = k, .k = n, .trans_b = 1, .alpha = 1.0f};
        ref_matmul(&first_shape, a_host, b_host, NULL, c1_ref);
        /* The second product's reference starts from the float C1 the device produced. */
        ref_matmul(&second_shape, c1_got, b_host, NULL, c2_ref);
        tu_expect_close("C1", c1_got, c1_ref, m * n, TU_TOL);
        tu_expect_close("C2", c2_got, c2_ref, m * k, TU_TOL);
        /* Again, on the same buffers: the same bits. */
        status = clattn_matmul(ctx, &first, &a, &b, NULL, &c1, 0, NULL, NULL);
        tu_expect_status(status, CLATTN_SUCCESS, "clattn_matmul (first, again)");
        float *again = tu_floats(m * n);
        tu_read_floats(c1_mem, 0, m * n, again);
        tu_expect(memcmp(again, c1_got, m * n * sizeof(float)) == 0,
                  "the same product twice gave different bits");
        free(again);
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

/* A C whose batch dim of 2 or 3 has stride 0 would write every batch entry to one matrix:
 * refused before anything is enqueued (C keeps its poison), with a message naming c. The same
 * product with a real stride, and a batch dim of 1 with stride 0, compute the reference. */
START_TEST(test_matmul_stride_c_zero)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    const size_t m = 17, n = 9, k = 5;
    for (size_t batch = 2; batch <= 3; ++batch) {
        tu_set_case("batch=%zu m=%zu n=%zu k=%zu, C batch stride 0", batch, m, n, k);
        const clattn_matmul_desc desc = {.struct_size = sizeof desc, .alpha = 1.0f};
        float *a_host = tu_random_floats(batch * m * k), *b_host = tu_random_floats(batch * k * n);
        cl_mem a_mem = tu_upload_floats(a_host, batch * m * k);
        cl_mem b_mem = tu_upload_floats(b_host, batch * k * n);
        cl_mem c_mem = tu_nan_buffer(batch * m * n);
        const clattn_tensor a = clattn_tensor_make(a_mem, 0, CLATTN_DTYPE_F32, 3, batch, m, k, 0);
        const clattn_tensor b = clattn_tensor_make(b_mem, 0, CLATTN_DTYPE_F32, 3, batch, k, n, 0);
        clattn_tensor c = clattn_tensor_make(c_mem, 0, CLATTN_DTYPE_F32, 3, batch, m, n, 0);
        c.strides[0] = 0, c.strides[1] = n, c.strides[2] = 1;
        clattn_status status = clattn_matmul(ctx, &desc, &a, &b, NULL, &c, 0, NULL, NULL);
        if (tu_expect_status(status, CLATTN_ERR_INVALID_SHAPE, "matmul(C batch stride 0)")) {
            const char *message = clattn_last_error(ctx);
            tu_expect(tu_starts_with(message, "matmul:") && tu_mentions_word(message, "c") &&
                          strstr(message, "stride 0") != NULL,
                      "message '%s' does not start with 'matmul:' and name c's stride 0", message);
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
        set_batch(&mc, 0, batch);
        run_matmul_case(&mc);
    }
    matmul_case single = plain_case(m, n, k, 1, 1);
    set_batch(&single, 1, 1);
    single.a.zero_stride = single.b.zero_stride = 3;
    run_matmul_case(&single);
    TU_END_TEST();
}
END_TEST

/* K in several launches on a private context with a small loop-trip limit (CLATTN_LOOP_TRIP_LIMIT
 * = 256: K parts of 64), accumulated onto C: the first part with the caller's beta and bias,
 * the others with beta 1; C of every dtype (16-bit C holds the partial sums between parts). */
START_TEST(test_matmul_k_split_private_context)
{
    TU_BEGIN_TEST();
    tu_set_case("CLATTN_LOOP_TRIP_LIMIT=256 context");
    const char *saved = getenv("CLATTN_LOOP_TRIP_LIMIT");
    char *saved_copy = saved ? strdup(saved) : NULL;
    setenv("CLATTN_LOOP_TRIP_LIMIT", "256", 1);
    clattn_ctx *ctx = NULL;
    char message[512] = "";
    clattn_status status = clattn_ctx_create(NULL, &ctx, message, sizeof message);
    if (saved_copy) {
        setenv("CLATTN_LOOP_TRIP_LIMIT", saved_copy, 1);
    } else {
        unsetenv("CLATTN_LOOP_TRIP_LIMIT");
    }
    free(saved_copy);
    if (tu_expect(status == CLATTN_SUCCESS, "clattn_ctx_create: %s: %s",
                  clattn_status_string(status), message)) {
        static const mnk sizes[] = {{17, 9, 65}, {3, 65, 129}, {33, 5, 300}, {1, 1, 1000}};
        static const clattn_dtype dtypes[3] = {CLATTN_DTYPE_F32, CLATTN_DTYPE_F16,
                                               CLATTN_DTYPE_BF16};
        for (int s = 0; s < COUNT_OF(sizes); ++s) {
            for (int trans = 0; trans < 4; ++trans) {
                matmul_case mc =
                    plain_case(sizes[s].m, sizes[s].n, sizes[s].k, trans & 1, (trans >> 1) & 1);
                mc.c.dtype = dtypes[(size_t)(s + trans) % 3];
                mc.beta = trans % 2 ? 0.5f : 0.0f;
                mc.use_bias = trans >= 2;
                if (s == 2)
                    set_batch(&mc, 0, 2);
                run_case_on(ctx, &mc);
            }
        }
    }
    clattn_ctx_release(ctx);
    TU_END_TEST();
}
END_TEST

/* The CPU kernel's blocks at their edges (with the table's CPU row: work-items of 4 tiles of
 * 6 rows, panels of 64 columns, K blocks of 256): M, N, K each one below, at and one above a
 * block, B read in place (F32 K x N, N a multiple of the panel, short rows) and packed, batches
 * with broadcast B and gaps, alpha, beta, bias, 16-bit operands. On other devices these are
 * more awkward sizes. */
/* CLATTN_TEST_SCALE=small (Oclgrind) runs test_matmul_cpu_blocks' sizes up to this many
 * multiply-adds only (still across a K block and a partial tile). */
#define SMALL_BLOCK_MACS 500000u

START_TEST(test_matmul_cpu_blocks)
{
    TU_BEGIN_TEST();
    /* clang-format off */
    static const mnk sizes[] = {
        {23, 64, 255}, {24, 128, 256}, {25, 64, 257}, {47, 128, 512}, {49, 192, 513},
        {6, 63, 1},    {7, 65, 2},     {145, 64, 33}, {5, 127, 300},  {73, 129, 17},
    };
    /* clang-format on */
    static const clattn_dtype dtypes[3] = {CLATTN_DTYPE_F32, CLATTN_DTYPE_F16, CLATTN_DTYPE_BF16};
    for (int s = 0; s < COUNT_OF(sizes); ++s) {
        if (tu_small() && sizes[s].m * sizes[s].n * sizes[s].k > SMALL_BLOCK_MACS)
            continue; /* named in the NOT RUN line */
        for (int trans = 0; trans < 4; ++trans) {
            matmul_case mc =
                plain_case(sizes[s].m, sizes[s].n, sizes[s].k, trans & 1, (trans >> 1) & 1);
            if (s % 3 == 1) {
                set_batch(&mc, 0, 3);
                mc.b.zero_stride = (unsigned)(trans & 1) << 1; /* B broadcast by stride 0 */
                mc.a.batch_gap = 2, mc.c.batch_gap = 5;
            }
            if (s % 4 == 2)
                mc.b.row_gap = (size_t)trans; /* in place with a longer row, or packed */
            mc.alpha = s % 2 ? 0.5f : 1.0f;
            mc.beta = trans == 1 ? -0.75f : 0.0f;
            mc.use_bias = (s + trans) % 3 == 0;
            if (s >= 8)
                mc.a.dtype = dtypes[trans % 3], mc.b.dtype = dtypes[(trans + 1) % 3],
                mc.c.dtype = dtypes[(trans + 2) % 3];
            run_matmul_case(&mc);
        }
    }
    TU_END_TEST();
}
END_TEST

/* A C of 16 MiB, which the CPU row writes with streaming stores, aligned (offset 0, the row
 * stride a multiple of the vector) and not (offset 3, stored as usual), with beta and bias. */
START_TEST(test_matmul_cpu_stream)
{
    TU_BEGIN_TEST();
    for (int variant = 0; variant < 2; ++variant) {
        matmul_case mc = plain_case(2048, 2048, 3, variant, 0);
        mc.c.offset = variant ? 3 : 0;
        mc.beta = variant ? 0.5f : 0.0f;
        mc.use_bias = variant;
        run_matmul_case(&mc);
    }
    TU_END_TEST();
}
END_TEST

/* The CPU kernel with other parameters, on a private context whose tuning file selects it on
 * any device: vector widths 4, 8, 16 with 1 to 3 vectors a row, tiles of 1 to 7 rows, K blocks
 * of 7 to 1000, several work-items a group, streaming stores from 1 KiB of C. */
START_TEST(test_matmul_vec_parameters)
{
    TU_BEGIN_TEST();
    static const char *const rows[] = {
        "any | * | * | matmul_vec=1 vec_width=8 vec_nv=2 vec_rm=5 vec_rb=3 vec_kc=7 vec_stream=1",
        "any | * | * | matmul_vec=1 vec_width=4 vec_nv=3 vec_rm=1 vec_rb=1 vec_kc=64 vec_wg=4",
        "any | * | * | matmul_vec=1 vec_width=16 vec_nv=1 vec_rm=7 vec_rb=2 vec_kc=1000 "
        "vec_stream=1",
    };
    /* clang-format off */
    static const mnk sizes[] = {
        {1, 1, 1}, {23, 16, 257}, {50, 32, 30}, {7, 12, 100}, {65, 129, 17}, {31, 48, 64},
    };
    /* clang-format on */
    const char *row = rows[_i];
    tu_set_case("tuning row '%s'", row);
    char path[] = "/tmp/check_matmul_rowXXXXXX";
    const int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!tu_expect(f != NULL, "cannot write a tuning file in /tmp")) {
        TU_END_TEST();
        return;
    }
    fprintf(f, "%s\n", row);
    fclose(f);
    const char *saved = getenv("CLATTN_TUNING");
    char *saved_copy = saved ? strdup(saved) : NULL;
    setenv("CLATTN_TUNING", path, 1);
    clattn_ctx *ctx = NULL;
    char message[512] = "";
    clattn_status status = clattn_ctx_create(NULL, &ctx, message, sizeof message);
    if (saved_copy)
        setenv("CLATTN_TUNING", saved_copy, 1);
    else
        unsetenv("CLATTN_TUNING");
    free(saved_copy);
    remove(path);
    static const clattn_dtype dtypes[3] = {CLATTN_DTYPE_F32, CLATTN_DTYPE_F16, CLATTN_DTYPE_BF16};
    if (tu_expect(status == CLATTN_SUCCESS, "clattn_ctx_create: %s: %s",
                  clattn_status_string(status), message)) {
        for (int s = 0; s < COUNT_OF(sizes); ++s) {
            for (int trans = 0; trans < 4; ++trans) {
                matmul_case mc =
                    plain_case(sizes[s].m, sizes[s].n, sizes[s].k, trans & 1, (trans >> 1) & 1);
                if (s % 2) {
                    set_batch(&mc, 0, 2);
                    mc.b.zero_stride = (unsigned)(trans & 1) << 1;
                }
                mc.alpha = trans == 2 ? -1.5f : 1.0f;
                mc.beta = trans == 3 ? 0.25f : 0.0f;
                mc.use_bias = (s + trans) % 2;
                if (s == 4)
                    mc.a.dtype = dtypes[trans % 3], mc.b.dtype = dtypes[(trans + 2) % 3],
                    mc.c.dtype = dtypes[(trans + 1) % 3];
                run_case_on(ctx, &mc);
            }
        }
    }
    clattn_ctx_release(ctx);
    TU_END_TEST();
}
END_TEST

/* A reduced run (CLATTN_TEST_SCALE=small, for Oclgrind) leaves out the products of more than
 * this many multiply-adds or with a longer K (minutes each there with GPU tiles: 256 x 192 x
 * 320, 300^3, K = 4099, 5000, 70000), naming them in not_run_. */
#define SMALL_MAX_MACS 4000000u
#define SMALL_MAX_K 2048u
/* ... and runs every SMALL_GRID_STRIDE-th product of the full grid (prime to 7: every m, n, k),
 * three dtype combinations that put every dtype in every role ((A, B, C) = (F16, BF16, F32),
 * (BF16, F32, F16), (F32, F16, BF16): test_matmul_dtypes' index a + 3 b + 9 c), and one of the
 * two-batch-dims loops. */
#define SMALL_GRID_STRIDE 16
static const int small_dtype_cases[3] = {7, 11, 21};
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
    TCase *sizes = tu_tcase(suite, "sizes", 600);
    tcase_add_loop_test(sizes, test_matmul_awkward_sizes, 0, COUNT_OF(awkward_sizes));
    add_size_loop(sizes, test_matmul_primes_and_large, "test_matmul_primes_and_large",
                  prime_and_large_sizes, COUNT_OF(prime_and_large_sizes));
    const int small = tu_small();
    for (int i = 0; i < GRID_SIDE * GRID_SIDE * GRID_SIDE; i += small ? SMALL_GRID_STRIDE : 1)
        tcase_add_loop_test(sizes, test_matmul_full_grid, i, i + 1);
    add_size_loop(sizes, test_matmul_extremes, "test_matmul_extremes", extreme_sizes,
                  COUNT_OF(extreme_sizes));
    if (small)
        tu_not_run("%s; test_matmul_full_grid but every %dth product; test_matmul_dtypes but "
                   "3 of 27 combinations (each dtype in each role); test_matmul_two_batch_dims "
                   "1-3; test_matmul_many_batches (66000 batch entries); "
                   "test_matmul_random_combinations 2-3; test_matmul_k_split_private_context: "
                   "minutes on Oclgrind; every tile edge and kernel path is in the other cases",
                   not_run_, SMALL_GRID_STRIDE);
    else
        tcase_add_test(sizes, test_matmul_many_batches);

    TCase *options = tu_tcase(suite, "options", 600);
    tcase_add_test(options, test_matmul_alpha_beta);
    tcase_add_test(options, test_matmul_bias);
    tcase_add_test(options, test_matmul_batched_strides);
    tcase_add_test(options, test_matmul_packed_default);
    tcase_add_test(options, test_matmul_broadcast);
    tcase_add_loop_test(options, test_matmul_two_batch_dims, 0, small ? 1 : 4);
    tcase_add_test(options, test_matmul_leading_dims_and_offsets);
    for (int i = 0; i < (small ? 3 : 27); ++i) {
        const int combination = small ? small_dtype_cases[i] : i;
        tcase_add_loop_test(options, test_matmul_dtypes, combination, combination + 1);
    }
    tcase_add_test(options, test_matmul_head_views);
    tcase_add_loop_test(options, test_matmul_random_combinations, 0, small ? 2 : 4);
    tcase_add_test(options, test_matmul_batch_dims_of_one);
    tcase_add_test(options, test_matmul_event_chain);
    tcase_add_test(options, test_matmul_stride_c_zero);
    if (!small)
        tcase_add_test(options, test_matmul_k_split_private_context);
    tcase_add_test(options, test_matmul_cpu_blocks);
    tcase_add_loop_test(options, test_matmul_vec_parameters, 0, 3);
    if (small)
        tu_not_run("test_matmul_cpu_stream (a 2048 x 2048 C); test_matmul_cpu_blocks' sizes "
                   "of more than %u multiply-adds",
                   SMALL_BLOCK_MACS);
    else
        tcase_add_test(options, test_matmul_cpu_stream);
    return suite;
}

int main(void)
{
    return tu_main("check_matmul", matmul_suite);
}
