/*
 * check_merge: attention states merged by their log-sum-exp (clattn_merge_states) and cascade
 * decoding (clattn_cascade_*), against float64 references on fresh seeded inputs with
 * NaN-poisoned outputs: merges of ranks 2 to 4, mixed dtypes, padded and seq-major strides,
 * in place; an empty side (lse = -inf, its o NaN) copied bit for bit, both empty giving zeros
 * and -inf; associativity of merges of three SDPA states against attention over the union;
 * cascades (shared prefix + padded or paged suffixes, GQA, empty suffixes) against attention
 * over prefix + suffix per request; the refusals.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problems.h"
#include "reference.h"
#include "testutil.h"

#define F32 CLATTN_DTYPE_F32
#define F16 CLATTN_DTYPE_F16
#define BF16 CLATTN_DTYPE_BF16

typedef struct merge_case {
    int rank;
    size_t dims[4]; /* the first `rank` are o's */
    clattn_dtype a, b, o;
    pb_layout layout;
    int inplace; /* 1: o is o_a (and lse lse_a); 2: o is o_b (lse lse_b) */
} merge_case;

/* clang-format off */
static const merge_case merge_cases[] = {
    {2, {1, 1},          F32,  F32,  F32,  PB_PACKED,       0},
    {3, {17, 3, 64},     F32,  F32,  F32,  PB_PACKED,       0},
    {3, {63, 5, 65},     F16,  BF16, F32,  PB_PADDED,       0},
    {4, {2, 3, 17, 33},  F32,  F32,  F32,  PB_SEQ_MAJOR,    1},
    {2, {127, 7},        F16,  F16,  F16,  PB_STRIDED_LAST, 2},
    {3, {65, 1, 128},    BF16, F32,  BF16, PB_PADDED,       0},
};
/* clang-format on */

static size_t count_of(int rank, const size_t *dims)
{
    size_t n = 1;
    for (int d = 0; d < rank; ++d)
        n *= dims[d];
    return n;
}

/* Row lse values in [-4, 4], about a fifth of them -inf on each side (some rows both). */
static void draw_lse(float *lse, size_t rows)
{
    for (size_t r = 0; r < rows; ++r)
        lse[r] = tu_rand_below(5) == 0 ? -INFINITY : (float)(8.0 * tu_rand_unit() - 4.0);
}

/* The float64 merge of one row's stored values. */
static void ref_merge_row(const float *oa, float la, const float *ob, float lb, size_t dv,
                          double *o, double *lse)
{
    const double m = fmax(la, lb);
    if (m == -INFINITY) {
        for (size_t c = 0; c < dv; ++c)
            o[c] = 0.0;
        *lse = -INFINITY;
        return;
    }
    const double wa = la == -INFINITY ? 0.0 : exp(la - m), wb = lb == -INFINITY ? 0.0 : exp(lb - m);
    for (size_t c = 0; c < dv; ++c)
        o[c] = ((wa > 0 ? wa * oa[c] : 0.0) + (wb > 0 ? wb * ob[c] : 0.0)) / (wa + wb);
    *lse = m + log(wa + wb);
}

/* Bit for bit: an empty side's rows take the other side's values and lse as they are. */
static void expect_copied_rows(const merge_case *c, size_t rows, size_t dv, const float *oa,
                               const float *la, const float *ob, const float *lb,
                               const float *got, const float *got_lse)
{
    for (size_t r = 0; r < rows; ++r) {
        const float *src = lb[r] == -INFINITY ? oa : la[r] == -INFINITY ? ob : NULL;
        if (src == NULL)
            continue;
        const int none = la[r] == -INFINITY && lb[r] == -INFINITY;
        const float want_lse = none ? -INFINITY : lb[r] == -INFINITY ? la[r] : lb[r];
        if (memcmp(&got_lse[r], &want_lse, sizeof want_lse) != 0)
            tu_expect(0, "row %zu: lse %a, expected %a exactly (an empty side)", r,
                      (double)got_lse[r], (double)want_lse);
        for (size_t col = 0; col < dv; ++col) {
            const float want = none ? 0.0f : pb_round(c->o, src[r * dv + col]);
            if (memcmp(&got[r * dv + col], &want, sizeof want) != 0) {
                tu_expect(0, "row %zu col %zu: %a, expected %a exactly (an empty side)", r, col,
                          (double)got[r * dv + col], (double)want);
                return;
            }
        }
    }
}

START_TEST(test_merge_cases)
{
    TU_BEGIN_TEST();
    const merge_case *c = &merge_cases[_i];
    tu_set_case("merge rank=%d dims=(%zu, %zu, %zu, %zu) a=%s b=%s o=%s layout=%s inplace=%d",
                c->rank, c->dims[0], c->dims[1], c->dims[2], c->dims[3], pb_dtype_name(c->a),
                pb_dtype_name(c->b), pb_dtype_name(c->o), pb_layout_name(c->layout), c->inplace);
    clattn_ctx *ctx = tu_ctx();
    const size_t dv = c->dims[c->rank - 1], count = count_of(c->rank, c->dims), rows = count / dv;
    float *oa = tu_random_floats(count), *ob = tu_random_floats(count);
    float *la = tu_floats(rows), *lb = tu_floats(rows);
    draw_lse(la, rows);
    draw_lse(lb, rows);
    for (size_t r = 0; r < rows; ++r) /* an empty side's o is never read: poison it */
        for (size_t col = 0; col < dv; ++col) {
            if (la[r] == -INFINITY)
                oa[r * dv + col] = NAN;
            if (lb[r] == -INFINITY)
                ob[r * dv + col] = NAN;
        }
    pb_round_array(c->a, oa, count);
    pb_round_array(c->b, ob, count);
    clattn_tensor to_a, to_b, tla, tlb, to, tl;
    pb_make_layout(&to_a, c->a, c->rank, c->dims, c->layout);
    pb_make_layout(&to_b, c->b, c->rank, c->dims, c->layout);
    pb_make_layout(&to, c->o, c->rank, c->dims, c->layout);
    pb_make_layout(&tla, F32, c->rank - 1, c->dims, c->layout == PB_SEQ_MAJOR ? PB_PACKED : c->layout);
    pb_make_layout(&tlb, F32, c->rank - 1, c->dims, PB_PACKED);
    pb_make_layout(&tl, F32, c->rank - 1, c->dims, PB_PADDED);
    pb_upload(ctx, &to_a, 3, oa);
    pb_upload(ctx, &to_b, 0, ob);
    pb_upload(ctx, &tla, 1, la);
    pb_upload(ctx, &tlb, 0, lb);
    if (c->inplace) {
        to = c->inplace == 1 ? to_a : to_b;
        tl = c->inplace == 1 ? tla : tlb;
    } else {
        pb_upload(ctx, &to, 5, NULL);
        pb_upload(ctx, &tl, 2, NULL);
    }
    tu_expect_status(clattn_merge_states(ctx, &to_a, &tla, &to_b, &tlb, &to, &tl, 0, NULL, NULL),
                     CLATTN_SUCCESS, "clattn_merge_states");
    float *got = tu_nan_floats(count), *got_lse = tu_nan_floats(rows);
    size_t stray = 0, stray_lse = 0;
    pb_download(ctx, NULL, &to, got, &stray);
    pb_download(ctx, NULL, &tl, got_lse, &stray_lse);
    tu_expect(c->inplace || (stray == 0 && stray_lse == 0), "%zu + %zu stray writes", stray,
              stray_lse);
    double *ref = tu_doubles(count), *ref_lse = tu_doubles(rows);
    for (size_t r = 0; r < rows; ++r)
        ref_merge_row(oa + r * dv, la[r], ob + r * dv, lb[r], dv, ref + r * dv, &ref_lse[r]);
    tu_expect_close("o", got, ref, count, pb_tolerance(c->o) + 1e-6);
    for (size_t r = 0; r < rows; ++r)
        if (!(ref_lse[r] == -INFINITY ? got_lse[r] == -INFINITY
                                      : fabs(got_lse[r] - ref_lse[r]) <= 1e-6 * (1 + fabs(ref_lse[r]))))
            tu_expect(0, "lse row %zu: %g, expected %g", r, (double)got_lse[r], ref_lse[r]);
    expect_copied_rows(c, rows, dv, oa, la, ob, lb, got, got_lse);
    clattn_tensor *all[6] = {&to_a, &to_b, &tla, &tlb, &to, &tl};
    for (int i = 0; i < (c->inplace ? 4 : 6); ++i)
        tu_release_mem(all[i]->mem);
    free(oa), free(ob), free(la), free(lb), free(got), free(got_lse), free(ref), free(ref_lse);
    TU_END_TEST();
}
END_TEST

/* One SDPA state (out, lse) of q against keys [k0, k1) of k, v ((B, H, L, d) packed). */
static void sdpa_state(const float *q, const float *k, const float *v, size_t B, size_t H,
                       size_t Lq, size_t Lk, size_t k0, size_t k1, size_t d, clattn_tensor *out,
                       clattn_tensor *lse)
{
    clattn_ctx *ctx = tu_ctx();
    const size_t n = k1 - k0;
    clattn_tensors t;
    memset(&t, 0, sizeof t);
    t.q = clattn_tensor_make(NULL, 0, F32, 4, B, H, Lq, d);
    t.k = clattn_tensor_make(NULL, 0, F32, 4, B, H, n, d);
    t.k.strides[1] = Lk * d; /* the chunk of the whole (B, H, Lk, d) keys */
    t.k.strides[0] = H * Lk * d;
    t.v = t.k;
    t.out = clattn_tensor_make(NULL, 0, F32, 4, B, H, Lq, d);
    t.lse = clattn_tensor_make(NULL, 0, F32, 3, B, H, Lq, 0);
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    CLATTN_BIND_ROLES(desc, t);
    clattn_plan *plan = NULL;
    tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS, "sdpa chunk");
    t.q.mem = tu_upload_floats(q, B * H * Lq * d);
    t.k.mem = tu_upload_floats(k, B * H * Lk * d);
    t.v.mem = tu_upload_floats(v, B * H * Lk * d);
    t.k.offset = t.v.offset = k0 * d;
    t.out.mem = tu_nan_buffer(B * H * Lq * d);
    t.lse.mem = tu_nan_buffer(B * H * Lq);
    tu_expect_status(clattn_plan_execute(plan, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL,
                                         NULL),
                     CLATTN_SUCCESS, "sdpa chunk execute");
    clattn_plan_release(plan);
    tu_release_mem(t.q.mem), tu_release_mem(t.k.mem), tu_release_mem(t.v.mem);
    *out = t.out;
    *lse = t.lse;
}

/* merge(merge(a, b), c) and merge(a, merge(b, c)) of three SDPA states over disjoint key chunks
 * agree to 1e-6 and equal attention over the union (float64). */
START_TEST(test_merge_associative)
{
    TU_BEGIN_TEST();
    const size_t B = 2, H = 3, Lq = 5, Lk = 67, d = 17, cuts[4] = {0, 23, 24, 67};
    tu_set_case("associativity B=%zu H=%zu Lq=%zu Lk=%zu d=%zu chunks 23 + 1 + 43", B, H, Lq, Lk,
                d);
    clattn_ctx *ctx = tu_ctx();
    const size_t nq = B * H * Lq * d, nk = B * H * Lk * d, rows = B * H * Lq;
    float *q = tu_random_floats(nq), *k = tu_random_floats(nk), *v = tu_random_floats(nk);
    for (size_t i = 0; i < nq; ++i)
        q[i] *= 3.0f; /* peaked rows: the chunks' lse differ widely */
    clattn_tensor o[3], l[3];
    for (int i = 0; i < 3; ++i)
        sdpa_state(q, k, v, B, H, Lq, Lk, cuts[i], cuts[i + 1], d, &o[i], &l[i]);
    clattn_tensor ab = o[0], abl = l[0], left = o[0], leftl = l[0];
    clattn_tensor bc = o[1], bcl = l[1], right = o[0], rightl = l[0];
    ab.mem = tu_nan_buffer(nq), abl.mem = tu_nan_buffer(rows);
    left.mem = tu_nan_buffer(nq), leftl.mem = tu_nan_buffer(rows);
    bc.mem = tu_nan_buffer(nq), bcl.mem = tu_nan_buffer(rows);
    right.mem = tu_nan_buffer(nq), rightl.mem = tu_nan_buffer(rows);
    tu_expect_status(clattn_merge_states(ctx, &o[0], &l[0], &o[1], &l[1], &ab, &abl, 0, NULL, NULL),
                     CLATTN_SUCCESS, "a + b");
    tu_expect_status(clattn_merge_states(ctx, &ab, &abl, &o[2], &l[2], &left, &leftl, 0, NULL, NULL),
                     CLATTN_SUCCESS, "(a + b) + c");
    tu_expect_status(clattn_merge_states(ctx, &o[1], &l[1], &o[2], &l[2], &bc, &bcl, 0, NULL, NULL),
                     CLATTN_SUCCESS, "b + c");
    tu_expect_status(clattn_merge_states(ctx, &o[0], &l[0], &bc, &bcl, &right, &rightl, 0, NULL,
                                         NULL),
                     CLATTN_SUCCESS, "a + (b + c)");
    float *gl = tu_floats(nq), *gr = tu_floats(nq), *gll = tu_floats(rows), *grl = tu_floats(rows);
    tu_read_floats(left.mem, 0, nq, gl);
    tu_read_floats(right.mem, 0, nq, gr);
    tu_read_floats(leftl.mem, 0, rows, gll);
    tu_read_floats(rightl.mem, 0, rows, grl);
    double *lefts = tu_doubles(nq), *leftls = tu_doubles(rows);
    tu_floats_to_doubles(gl, nq, lefts);
    tu_floats_to_doubles(gll, rows, leftls);
    tu_expect_close("(a + b) + c vs a + (b + c)", gr, lefts, nq, 1e-6);
    tu_expect_close("lse: (a + b) + c vs a + (b + c)", grl, leftls, rows, 1e-6);
    const ref_sdpa_shape shape = ref_softmax_shape(B, H, Lq, Lk, d, d);
    double *ref = tu_doubles(nq), *ref_lse = tu_doubles(rows);
    ref_sdpa(&shape, q, k, v, NULL, NULL, ref, NULL, ref_lse);
    tu_expect_close("merged vs attention over the union", gl, ref, nq, 1e-5);
    tu_expect_close("merged lse vs the union's", gll, ref_lse, rows, 1e-5);
    const cl_mem mems[] = {o[0].mem, o[1].mem, o[2].mem, l[0].mem, l[1].mem, l[2].mem, ab.mem,
                           abl.mem, left.mem, leftl.mem, bc.mem, bcl.mem, right.mem, rightl.mem};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; ++i)
        tu_release_mem(mems[i]);
    free(q), free(k), free(v), free(gl), free(gr), free(gll), free(grl);
    free(lefts), free(leftls), free(ref), free(ref_lse);
    TU_END_TEST();
}
END_TEST

typedef struct cascade_case {
    size_t batch, heads, kv_heads, prefix, suffix, dk, dv;
    size_t page_size; /* 0: padded (B, Hkv, suffix, d) with kv_seqlen */
    clattn_dtype out_dtype;
    clattn_dtype q_dtype;
    pb_layout q_layout;
} cascade_case;

/* clang-format off */
static const cascade_case cascade_cases[] = {
    /* B  H  Hkv prefix suffix dk  dv  page  out   q     q layout */
    {1, 1, 1,    1,     1,     16, 16, 0,    F32,  F32,  PB_PACKED},
    {3, 4, 2,   67,    17,     64, 64, 0,    F32,  F16,  PB_PADDED},
    {5, 6, 3,  129,    33,     33, 17, 16,   F32,  F32,  PB_SEQ_MAJOR},
    {8, 8, 8,  255,    40,     64, 64, 7,    F16,  BF16, PB_PADDED},
    {2, 8, 1,   63,     5,    128, 128, 0,   BF16, F32,  PB_PACKED},
};
/* clang-format on */

typedef struct cascade_problem {
    const cascade_case *c;
    float *q, *pk, *pv, *sk, *sv; /* sk, sv: (B, Hkv, suffix, d) logical suffixes */
    int32_t *lens, *table;
    size_t blocks, pages;
} cascade_problem;

static void cascade_draw(cascade_problem *p, const cascade_case *c)
{
    memset(p, 0, sizeof *p);
    p->c = c;
    const size_t B = c->batch, Hkv = c->kv_heads;
    p->q = tu_random_floats(B * c->heads * c->dk);
    pb_round_array(c->q_dtype, p->q, B * c->heads * c->dk);
    p->pk = tu_random_floats(Hkv * c->prefix * c->dk);
    p->pv = tu_random_floats(Hkv * c->prefix * c->dv);
    p->sk = tu_random_floats(B * Hkv * c->suffix * c->dk);
    p->sv = tu_random_floats(B * Hkv * c->suffix * c->dv);
    p->lens = calloc(B, sizeof *p->lens);
    for (size_t b = 0; b < B; ++b) /* request 1 has no suffix key at all, the last a full one */
        p->lens[b] = b == 1 ? 0 : b + 1 == B ? (int32_t)c->suffix
                                             : (int32_t)tu_rand_below(c->suffix + 1);
    if (c->page_size) {
        p->blocks = (c->suffix + c->page_size - 1) / c->page_size;
        p->pages = B * p->blocks + 2;
        p->table = calloc(B * p->blocks, sizeof *p->table);
        for (size_t i = 0; i < B * p->blocks; ++i) /* shuffled pages, page 0 left unused */
            p->table[i] = (int32_t)(1 + (i * 7 + 3) % (B * p->blocks));
    }
}

static void cascade_free(cascade_problem *p)
{
    free(p->q), free(p->pk), free(p->pv), free(p->sk), free(p->sv), free(p->lens), free(p->table);
}

/* The paged pool (pages, page_size, Hkv, d) holding the logical suffixes x (B, Hkv, S, d). */
static float *pool_of(const cascade_problem *p, const float *x, size_t d)
{
    const cascade_case *c = p->c;
    const size_t ps = c->page_size, Hkv = c->kv_heads;
    float *pool = tu_random_floats(p->pages * ps * Hkv * d);
    for (size_t b = 0; b < c->batch; ++b)
        for (size_t j = 0; j < c->suffix; ++j) {
            const size_t page = (size_t)p->table[b * p->blocks + j / ps], slot = j % ps;
            for (size_t h = 0; h < Hkv; ++h)
                memcpy(pool + ((page * ps + slot) * Hkv + h) * d,
                       x + ((b * Hkv + h) * c->suffix + j) * d, d * sizeof *x);
        }
    return pool;
}

/* Attention of each request's row over its prefix + suffix keys, in float64. */
static void cascade_reference(const cascade_problem *p, double *out, double *lse)
{
    const cascade_case *c = p->c;
    const size_t Hkv = c->kv_heads, P = c->prefix;
    for (size_t b = 0; b < c->batch; ++b) {
        const size_t n = P + (size_t)p->lens[b];
        float *k = tu_floats(Hkv * n * c->dk), *v = tu_floats(Hkv * n * c->dv);
        for (size_t h = 0; h < Hkv; ++h) {
            memcpy(k + h * n * c->dk, p->pk + h * P * c->dk, P * c->dk * sizeof *k);
            memcpy(v + h * n * c->dv, p->pv + h * P * c->dv, P * c->dv * sizeof *v);
            memcpy(k + (h * n + P) * c->dk, p->sk + (b * Hkv + h) * c->suffix * c->dk,
                   (n - P) * c->dk * sizeof *k);
            memcpy(v + (h * n + P) * c->dv, p->sv + (b * Hkv + h) * c->suffix * c->dv,
                   (n - P) * c->dv * sizeof *v);
        }
        ref_sdpa_shape shape = ref_softmax_shape(1, c->heads, 1, n, c->dk, c->dv);
        shape.kv_heads = Hkv;
        ref_sdpa(&shape, p->q + b * c->heads * c->dk, k, v, NULL, NULL,
                 out + b * c->heads * c->dv, NULL, lse + b * c->heads);
        free(k), free(v);
    }
}

/* The cascade's layouts (padded gaps drawn). */
static void cascade_layouts(const cascade_problem *p, clattn_cascade_desc *d)
{
    const cascade_case *c = p->c;
    const size_t B = c->batch, H = c->heads, Hkv = c->kv_heads;
    clattn_cascade_desc_init(d);
    pb_make_layout(&d->q, c->q_dtype, 4, (size_t[]){B, H, 1, c->dk}, c->q_layout);
    d->prefix_k = clattn_tensor_make(NULL, 0, F32, 4, 1, Hkv, c->prefix, c->dk);
    d->prefix_v = clattn_tensor_make(NULL, 0, F32, 4, 1, Hkv, c->prefix, c->dv);
    d->kv_seqlen = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 1, B, 0, 0, 0);
    if (c->page_size) {
        d->k = clattn_tensor_make(NULL, 0, F32, 4, p->pages, c->page_size, Hkv, c->dk);
        d->v = clattn_tensor_make(NULL, 0, F32, 4, p->pages, c->page_size, Hkv, c->dv);
        d->block_table = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 2, B, p->blocks, 0, 0);
    } else {
        d->k = clattn_tensor_make(NULL, 0, F32, 4, B, Hkv, c->suffix, c->dk);
        d->v = clattn_tensor_make(NULL, 0, F32, 4, B, Hkv, c->suffix, c->dv);
    }
    pb_make_layout(&d->out, c->out_dtype, 4, (size_t[]){B, H, 1, c->dv}, PB_SEQ_MAJOR);
    d->lse = clattn_tensor_make(NULL, 0, F32, 3, B, H, 1, 0);
}

/* Buffers holding the problem for the layouts *d holds (outputs poisoned). */
static void cascade_upload(const cascade_problem *p, clattn_cascade_desc *d)
{
    const cascade_case *c = p->c;
    const size_t B = c->batch, H = c->heads, Hkv = c->kv_heads;
    pb_upload(tu_ctx(), &d->q, 2, p->q);
    d->prefix_k.mem = tu_upload_floats(p->pk, Hkv * c->prefix * c->dk);
    d->prefix_v.mem = tu_upload_floats(p->pv, Hkv * c->prefix * c->dv);
    d->kv_seqlen.mem = tu_upload_bytes(p->lens, B * sizeof *p->lens);
    if (c->page_size) {
        float *kp = pool_of(p, p->sk, c->dk), *vp = pool_of(p, p->sv, c->dv);
        d->k.mem = tu_upload_floats(kp, p->pages * c->page_size * Hkv * c->dk);
        d->v.mem = tu_upload_floats(vp, p->pages * c->page_size * Hkv * c->dv);
        d->block_table.mem = tu_upload_bytes(p->table, B * p->blocks * sizeof *p->table);
        free(kp), free(vp);
    } else {
        d->k.mem = tu_upload_floats(p->sk, B * Hkv * c->suffix * c->dk);
        d->v.mem = tu_upload_floats(p->sv, B * Hkv * c->suffix * c->dv);
    }
    pb_upload(tu_ctx(), &d->out, 1, NULL);
    d->lse.mem = tu_nan_buffer(B * H);
}

START_TEST(test_cascade_cases)
{
    TU_BEGIN_TEST();
    const cascade_case *c = &cascade_cases[_i];
    tu_set_case("cascade B=%zu H=%zu Hkv=%zu prefix=%zu suffix=%zu dk=%zu dv=%zu page=%zu out=%s "
                "q=%s %s",
                c->batch, c->heads, c->kv_heads, c->prefix, c->suffix, c->dk, c->dv, c->page_size,
                pb_dtype_name(c->out_dtype), pb_dtype_name(c->q_dtype),
                pb_layout_name(c->q_layout));
    clattn_ctx *ctx = tu_ctx();
    cascade_problem p;
    cascade_draw(&p, c);
    clattn_cascade_desc layouts, bound;
    cascade_layouts(&p, &layouts);
    clattn_cascade *cascade = NULL;
    tu_expect_status(clattn_cascade_create(ctx, &layouts, &cascade), CLATTN_SUCCESS,
                     "clattn_cascade_create");
    bound = layouts;
    cascade_upload(&p, &bound);
    const size_t rows = c->batch * c->heads, count = rows * c->dv;
    double *ref = tu_doubles(count), *ref_lse = tu_doubles(rows);
    cascade_reference(&p, ref, ref_lse);
    for (int step = 0; step < 2 && cascade; ++step) { /* twice: the scratch is reused */
        pb_rewrite(ctx, NULL, &bound.out, NULL);
        tu_write_floats(bound.lse.mem, 0, (float[1]){NAN}, 1);
        tu_expect_status(clattn_cascade_execute(cascade, &bound, 0, NULL, NULL), CLATTN_SUCCESS,
                         "clattn_cascade_execute");
        float *got = tu_nan_floats(count), *got_lse = tu_nan_floats(rows);
        size_t stray = 0;
        pb_download(ctx, NULL, &bound.out, got, &stray);
        tu_read_floats(bound.lse.mem, 0, rows, got_lse);
        tu_expect(stray == 0, "out: %zu stray writes", stray);
        tu_expect_close("out", got, ref, count, pb_tolerance(c->out_dtype) + 2e-6);
        tu_expect_close("lse", got_lse, ref_lse, rows, 2e-6);
        free(got), free(got_lse);
    }
    clattn_cascade_release(cascade);
    const cl_mem mems[] = {bound.q.mem, bound.prefix_k.mem, bound.prefix_v.mem, bound.k.mem,
                           bound.v.mem, bound.kv_seqlen.mem, bound.block_table.mem,
                           bound.out.mem, bound.lse.mem};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; ++i)
        tu_release_mem(mems[i]);
    free(ref), free(ref_lse);
    cascade_free(&p);
    TU_END_TEST();
}
END_TEST

static void expect_failure(clattn_status got, clattn_status want, const char *needle,
                           const char *call)
{
    tu_expect_status(got, want, call);
    tu_expect(strstr(clattn_last_error(tu_ctx()), needle) != NULL, "%s: message '%s' lacks '%s'",
              call, clattn_last_error(tu_ctx()), needle);
}

START_TEST(test_refusals)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    cl_mem buf = tu_nan_buffer(4096);
    clattn_tensor o = clattn_tensor_make(buf, 0, F32, 3, 4, 2, 8, 0);
    clattn_tensor l = clattn_tensor_make(buf, 1024, F32, 2, 4, 2, 0, 0);
    clattn_tensor bad_l = clattn_tensor_make(buf, 1024, F32, 2, 4, 3, 0, 0);
    clattn_tensor o1 = clattn_tensor_make(buf, 0, F32, 1, 8, 0, 0, 0);
    clattn_tensor l16 = clattn_tensor_make(buf, 1024, F16, 2, 4, 2, 0, 0);
    clattn_tensor small = clattn_tensor_make(buf, 4090, F32, 3, 4, 2, 8, 0);
    clattn_tensor o_out = clattn_tensor_make(buf, 2048, F32, 3, 4, 2, 8, 0);
    tu_expect_status(clattn_merge_states(NULL, &o, &l, &o, &l, &o, &l, 0, NULL, NULL),
                     CLATTN_ERR_INVALID_ARGUMENT, "NULL ctx");
    expect_failure(clattn_merge_states(ctx, &o, &l, NULL, &l, &o_out, NULL, 0, NULL, NULL),
                   CLATTN_ERR_INVALID_ARGUMENT, "o_b", "NULL o_b");
    expect_failure(clattn_merge_states(ctx, &o, &l, &o, &bad_l, &o_out, NULL, 0, NULL, NULL),
                   CLATTN_ERR_INVALID_SHAPE, "lse_b", "lse_b (4, 3)");
    expect_failure(clattn_merge_states(ctx, &o1, &l, &o1, &l, &o1, NULL, 0, NULL, NULL),
                   CLATTN_ERR_INVALID_SHAPE, "rank", "o_a rank 1");
    expect_failure(clattn_merge_states(ctx, &o, &l16, &o, &l, &o_out, NULL, 0, NULL, NULL),
                   CLATTN_ERR_INVALID_ARGUMENT, "lse_a", "lse_a F16");
    expect_failure(clattn_merge_states(ctx, &o, &l, &o, &l, &small, NULL, 0, NULL, NULL),
                   CLATTN_ERR_BUFFER_TOO_SMALL, "o", "o past the buffer");
    /* cascades: two rows per request, a prefix of batch 2 */
    cascade_problem p;
    cascade_draw(&p, &cascade_cases[1]);
    clattn_cascade_desc d;
    cascade_layouts(&p, &d);
    clattn_cascade *cascade = (clattn_cascade *)&d;
    d.q.dims[2] = 2;
    expect_failure(clattn_cascade_create(ctx, &d, &cascade), CLATTN_ERR_INVALID_SHAPE,
                   "one decoding row", "q with 2 rows");
    tu_expect(cascade == NULL, "a refused create leaves *out NULL");
    cascade_layouts(&p, &d);
    d.prefix_k.dims[0] = 2;
    expect_failure(clattn_cascade_create(ctx, &d, &cascade), CLATTN_ERR_INVALID_SHAPE,
                   "prefix_k", "prefix of batch 2");
    cascade_layouts(&p, &d);
    d.prefix_k.dims[1] = 3; /* 3 kv heads do not divide 4 */
    d.prefix_v.dims[1] = 3;
    expect_failure(clattn_cascade_create(ctx, &d, &cascade), CLATTN_ERR_INVALID_SHAPE,
                   "divides", "prefix kv_heads 3 of 4 heads");
    tu_expect_status(clattn_cascade_create(ctx, NULL, &cascade), CLATTN_ERR_INVALID_ARGUMENT,
                     "NULL desc");
    tu_expect_status(clattn_cascade_execute(NULL, &d, 0, NULL, NULL), CLATTN_ERR_INVALID_ARGUMENT,
                     "NULL cascade");
    clattn_cascade_release(NULL);
    cascade_free(&p);
    tu_release_mem(buf);
    TU_END_TEST();
}
END_TEST

static Suite *merge_suite(void)
{
    Suite *suite = suite_create("merge");
    TCase *tc = tu_tcase(suite, "merge", 600);
    tcase_add_loop_test(tc, test_merge_cases, 0, (int)(sizeof merge_cases / sizeof merge_cases[0]));
    tcase_add_test(tc, test_merge_associative);
    tcase_add_loop_test(tc, test_cascade_cases, 0,
                        (int)(sizeof cascade_cases / sizeof cascade_cases[0]));
    tcase_add_test(tc, test_refusals);
    return suite;
}

int main(void)
{
    return tu_main("check_merge", merge_suite);
}
