/* User score and mask functions (clattn_flex_desc: FlexAttention on OpenCL), in numbers:
 *   1. score_mod (a per-head relative-position bias table) and mask_mod (document masking from
 *      two id tensors) with auxiliary tensors, forward on the fused and unfused paths, against
 *      a float64 reference, at awkward sizes (Lq != Lk, 1, 17, 63, 65, 127, 129), outputs and
 *      lse poisoned with NaN first;
 *   2. each built-in written as a user function gives the built-in's bits: soft-capping, ALiBi,
 *      causal, a sliding window, key padding, a bool mask and a float mask (fused and unfused);
 *   3. the backward with score_mod_grad against a float64 reference (dQ, dK, dV), and its
 *      refusal without score_mod_grad;
 *   4. a block mask made on the device from a mask_mod (clattn_flex_block_mask) against the
 *      host's, the block-masked run bit for bit the run without it, and the tiles the fused
 *      kernel visits (the counter) exactly the non-empty ones of its tile geometry;
 *   5. a source that does not compile: CLATTN_ERR_BUILD naming the user's line; the same
 *      source text at another address makes a plan again (that it builds nothing is counted in
 *      check_fault, with the fault library's hook); bad names and shapes refused with messages
 *      naming them;
 *   6. T5's relative-position buckets (t5_bias, a built-in made of score functions) bit for
 *      bit the same bias as a user score_mod over host-made bucket indices, forward and
 *      backward, and against float64.
 * On a CPU the fused kernel is flash_cpu.cl; flex_gpu_params (CLATTN_PARAMS=gpu, the Oclgrind
 * lane) runs flash_gpu.cl and the generic backward. */
#include "problems.h"
#include "testutil.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct flex_sizes {
    size_t batch, heads, seq_q, seq_k, dim;
} flex_sizes;

static const flex_sizes sizes[] = {
    {1, 1, 1, 3, 16}, {2, 3, 17, 65, 16}, {1, 2, 129, 127, 32}, {1, 1, 63, 64, 64},
    {2, 1, 65, 17, 16},
};
enum { SIZES = sizeof sizes / sizeof sizes[0] };

/* A rank-4 F32 tensor of `values` (NULL: poison, an output). */
static clattn_tensor f32_4(size_t d0, size_t d1, size_t d2, size_t d3, const float *values)
{
    clattn_tensor t;
    const size_t dims[4] = {d0, d1, d2, d3};
    pb_make_layout(&t, CLATTN_DTYPE_F32, 4, dims, PB_PACKED);
    pb_upload(tu_ctx(), &t, 0, values);
    return t;
}

static clattn_tensor vec(clattn_dtype dtype, int rank, const size_t *dims, const float *values)
{
    clattn_tensor t;
    pb_make_layout(&t, dtype, rank, dims, PB_PACKED);
    pb_upload(tu_ctx(), &t, 0, values);
    return t;
}

/* q, k, v (packed F32 from the host arrays) and a poisoned out of the sizes s; the rest absent. */
static clattn_tensors qkv_tensors(const flex_sizes *s, const float *q, const float *k,
                                  const float *v)
{
    clattn_tensors t;
    memset(&t, 0, sizeof t);
    t.q = f32_4(s->batch, s->heads, s->seq_q, s->dim, q);
    t.k = f32_4(s->batch, s->heads, s->seq_k, s->dim, k);
    t.v = f32_4(s->batch, s->heads, s->seq_k, s->dim, v);
    t.out = f32_4(s->batch, s->heads, s->seq_q, s->dim, NULL);
    return t;
}

/* The problem of test 1: document ids of queries and keys, a (heads, seq_q + seq_k) bias. */
typedef struct problem {
    flex_sizes s;
    float *q, *k, *v, *qdoc, *kdoc, *bias;
    clattn_tensors t;
} problem;

static void problem_make(problem *p, const flex_sizes *s)
{
    memset(p, 0, sizeof *p);
    p->s = *s;
    const size_t nq = s->batch * s->heads * s->seq_q * s->dim;
    const size_t nk = s->batch * s->heads * s->seq_k * s->dim;
    p->q = tu_random_floats(nq);
    p->k = tu_random_floats(nk);
    p->v = tu_random_floats(nk);
    p->qdoc = tu_floats(s->seq_q);
    p->kdoc = tu_floats(s->seq_k);
    const size_t docs = 1 + tu_rand_below(4);
    for (size_t i = 0; i < s->seq_q; ++i)
        p->qdoc[i] = (float)(i * docs / s->seq_q);
    for (size_t j = 0; j < s->seq_k; ++j)
        p->kdoc[j] = (float)(j * docs / s->seq_k);
    p->bias = tu_floats(s->heads * (s->seq_q + s->seq_k));
    tu_fill_uniform(p->bias, s->heads * (s->seq_q + s->seq_k), -2.0f, 2.0f);
    p->t = qkv_tensors(s, p->q, p->k, p->v);
    const size_t lq[1] = {s->seq_q}, lk[1] = {s->seq_k};
    const size_t bd[2] = {s->heads, s->seq_q + s->seq_k};
    p->t.flex_aux0 = vec(CLATTN_DTYPE_I32, 1, lq, p->qdoc);
    p->t.flex_aux1 = vec(CLATTN_DTYPE_I32, 1, lk, p->kdoc);
    p->t.flex_aux2 = vec(CLATTN_DTYPE_F32, 2, bd, p->bias);
}

static void problem_free(problem *p)
{
    pb_release_tensors(&p->t);
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->qdoc);
    free(p->kdoc);
    free(p->bias);
}

static char source1[1024];
/* score + bias[h, q - k + seq_k - 1]; kept: the same document, or key 0 (so no row is empty) */
static const char *source_for(const flex_sizes *s)
{
    snprintf(source1, sizeof source1,
             "float score_mod(float score, int b, int h, int q_idx, int kv_idx)\n"
             "{\n"
             "    return score + bias[h * %zu + q_idx - kv_idx + %zu];\n"
             "}\n"
             "int mask_mod(int b, int h, int q_idx, int kv_idx)\n"
             "{\n"
             "    return qdoc[q_idx] == kdoc[kv_idx] || kv_idx == 0;\n"
             "}\n"
             "float score_mod_grad(float score, int b, int h, int q_idx, int kv_idx)\n"
             "{\n"
             "    return 1.0f;\n"
             "}\n",
             s->seq_q + s->seq_k, s->seq_k - 1);
    return source1;
}

static void flex_of(clattn_flex_desc *flex, const char *source, unsigned functions)
{
    memset(flex, 0, sizeof *flex);
    flex->source = source;
    flex->functions = functions;
    flex->aux_names[0] = "qdoc";
    flex->aux_names[1] = "kdoc";
    flex->aux_names[2] = "bias";
}

/* float64 reference of test 1: out (B, H, Lq, d) and lse (B, H, Lq); P (B, H, Lq, Lk). */
static void reference(const problem *p, double *out, double *lse, double *weights)
{
    const flex_sizes *s = &p->s;
    const double scale = 1.0 / sqrt((double)s->dim);
    double *row = tu_doubles(s->seq_k);
    for (size_t bh = 0; bh < s->batch * s->heads; ++bh) {
        const size_t h = bh % s->heads;
        for (size_t i = 0; i < s->seq_q; ++i) {
            double m = -INFINITY;
            for (size_t j = 0; j < s->seq_k; ++j) {
                const bool keep = p->qdoc[i] == p->kdoc[j] || j == 0;
                double dot = 0.0;
                for (size_t c = 0; c < s->dim; ++c)
                    dot += (double)p->q[(bh * s->seq_q + i) * s->dim + c] *
                           p->k[(bh * s->seq_k + j) * s->dim + c];
                row[j] = keep ? dot * scale +
                                    p->bias[h * (s->seq_q + s->seq_k) + i - j + s->seq_k - 1]
                              : -INFINITY;
                m = fmax(m, row[j]);
            }
            double total = 0.0;
            for (size_t j = 0; j < s->seq_k; ++j)
                total += row[j] == -INFINITY ? 0.0 : exp(row[j] - m);
            lse[bh * s->seq_q + i] = m + log(total);
            for (size_t c = 0; c < s->dim; ++c)
                out[(bh * s->seq_q + i) * s->dim + c] = 0.0;
            for (size_t j = 0; j < s->seq_k; ++j) {
                const double w = row[j] == -INFINITY ? 0.0 : exp(row[j] - m) / total;
                if (weights)
                    weights[(bh * s->seq_q + i) * s->seq_k + j] = w;
                for (size_t c = 0; c < s->dim; ++c)
                    out[(bh * s->seq_q + i) * s->dim + c] +=
                        w * p->v[(bh * s->seq_k + j) * s->dim + c];
            }
        }
    }
    free(row);
}

static float *run_plan(clattn_plan *plan, clattn_tensors *t, const clattn_tensor *out)
{
    pb_rewrite(tu_ctx(), NULL, out, NULL);
    if (t->lse.rank)
        pb_rewrite(tu_ctx(), NULL, &t->lse, NULL);
    tu_expect_status(clattn_plan_execute(plan, t->by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                         NULL, NULL),
                     CLATTN_SUCCESS, "clattn_plan_execute");
    float *got = tu_floats(pb_tensor_count(out));
    size_t stray = 0;
    pb_download(tu_ctx(), NULL, out, got, &stray);
    tu_expect(stray == 0, "%zu elements outside the output were written", stray);
    return got;
}

START_TEST(test_flex_forward)
{
    TU_BEGIN_TEST();
    const flex_sizes *s = &sizes[_i];
    problem p;
    problem_make(&p, s);
    const size_t lse_dims[3] = {s->batch, s->heads, s->seq_q};
    double *want = tu_doubles(s->batch * s->heads * s->seq_q * s->dim);
    double *want_lse = tu_doubles(s->batch * s->heads * s->seq_q);
    reference(&p, want, want_lse, NULL);
    for (int path = CLATTN_PATH_FUSED; path <= CLATTN_PATH_UNFUSED; ++path) {
        tu_set_case("B=%zu H=%zu Lq=%zu Lk=%zu d=%zu, %s", s->batch, s->heads, s->seq_q,
                    s->seq_k, s->dim, path == CLATTN_PATH_FUSED ? "fused" : "unfused");
        if (path == CLATTN_PATH_FUSED)
            p.t.lse = vec(CLATTN_DTYPE_F32, 3, lse_dims, NULL);
        clattn_sdpa_desc desc;
        clattn_sdpa_desc_init(&desc);
        CLATTN_BIND_ROLES(desc, p.t);
        desc.path = (clattn_path)path;
        flex_of(&desc.flex, source_for(s), CLATTN_FLEX_SCORE_MOD | CLATTN_FLEX_MASK_MOD);
        clattn_plan *plan = NULL;
        if (tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                             "clattn_sdpa_plan_create")) {
            float *got = run_plan(plan, &p.t, &p.t.out);
            tu_expect_close("out", got, want, pb_tensor_count(&p.t.out), TU_TOL);
            free(got);
            if (path == CLATTN_PATH_FUSED) {
                float *lse = tu_floats(pb_tensor_count(&p.t.lse));
                pb_download(tu_ctx(), NULL, &p.t.lse, lse, NULL);
                tu_expect_close("lse", lse, want_lse, pb_tensor_count(&p.t.lse), TU_TOL);
                free(lse);
            }
        }
        clattn_plan_release(plan);
        if (p.t.lse.rank) {
            tu_release_mem(p.t.lse.mem);
            memset(&p.t.lse, 0, sizeof p.t.lse);
        }
    }
    free(want);
    free(want_lse);
    problem_free(&p);
    TU_END_TEST();
}
END_TEST

/* --- 2. built-ins as user functions ----------------------------------------------------- */

enum { B_SOFTCAP, B_ALIBI, B_CAUSAL, B_WINDOW, B_KPAD, B_BOOL, B_FLOAT, BUILTINS };
static const char *const builtin_names[BUILTINS] = {"softcap", "alibi", "causal", "window",
                                                    "key padding", "bool mask", "float mask"};

START_TEST(test_builtin_as_user_function)
{
    TU_BEGIN_TEST();
    const int which = _i;
    const flex_sizes s = {2, 2, 37, 67, 16};
    const size_t nq = s.batch * s.heads * s.seq_q * s.dim, nk = s.batch * s.heads * s.seq_k * s.dim;
    float *q = tu_random_floats(nq), *k = tu_random_floats(nk), *v = tu_random_floats(nk);
    for (size_t i = 0; i < nq; ++i)
        q[i] *= 8.0f; /* scores large enough for the cap to bite */
    const size_t mask_n = s.batch * s.heads * s.seq_q * s.seq_k;
    float *mask = tu_floats(mask_n), *pad = tu_floats(s.batch * s.seq_k);
    float slopes[2] = {0.5f, 0.125f};
    for (size_t i = 0; i < mask_n; ++i)
        mask[i] = which == B_BOOL ? (float)(tu_rand_below(4) != 0) : (float)tu_rand_unit() - 0.5f;
    for (size_t i = 0; i < s.batch * s.seq_k; ++i)
        pad[i] = (float)(tu_rand_below(5) == 0);
    char source[1024];
    unsigned functions = CLATTN_FLEX_MASK_MOD;
    const long long apos = (long long)s.seq_k - (long long)s.seq_q;
    switch (which) {
    case B_SOFTCAP:
        snprintf(source, sizeof source, "float score_mod(float score, int b, int h, int q, int k)"
                                        " { return 20.0f * tanh(score / 20.0f); }");
        functions = CLATTN_FLEX_SCORE_MOD;
        break;
    case B_ALIBI:
        snprintf(source, sizeof source,
                 "float score_mod(float score, int b, int h, int q, int k)"
                 " { return score + -slopes[h] * fabs((float)((long)q + %lld - (long)k)); }",
                 apos);
        functions = CLATTN_FLEX_SCORE_MOD;
        break;
    case B_CAUSAL:
        snprintf(source, sizeof source, "int mask_mod(int b, int h, int q, int k) "
                                        "{ return k <= q + %lld; }", apos);
        break;
    case B_WINDOW:
        snprintf(source, sizeof source, "int mask_mod(int b, int h, int q, int k) "
                                        "{ return k <= q + 3 && k >= q - 5; }");
        break;
    case B_KPAD:
        snprintf(source, sizeof source, "int mask_mod(int b, int h, int q, int k) "
                                        "{ return pad[b * %zu + k] == 0; }", s.seq_k);
        break;
    case B_BOOL:
        snprintf(source, sizeof source, "int mask_mod(int b, int h, int q, int k) "
                                        "{ return m[((b * %zu + h) * %zu + q) * %zu + k] != 0; }",
                 s.heads, s.seq_q, s.seq_k);
        break;
    default:
        snprintf(source, sizeof source, "float score_mod(float score, int b, int h, int q, int k)"
                                        " { return score + m[((b * %zu + h) * %zu + q) * %zu + k];"
                                        " }",
                 s.heads, s.seq_q, s.seq_k);
        functions = CLATTN_FLEX_SCORE_MOD;
        break;
    }
    /* (The unfused softmax rows stop at a built-in band's end, so they sum in another order
     * than a row that mask_mod cuts: causal and windows are bit-identical on the fused path
     * only; there the unfused path is within rounding, as test 1 checks.) */
    const int last_path = which == B_CAUSAL || which == B_WINDOW ? CLATTN_PATH_FUSED
                                                                 : CLATTN_PATH_UNFUSED;
    for (int path = CLATTN_PATH_FUSED; path <= last_path; ++path) {
        tu_set_case("%s, %s", builtin_names[which], path == CLATTN_PATH_FUSED ? "fused" : "unfused");
        float *outs[2] = {NULL, NULL};
        for (int user = 0; user < 2; ++user) {
            clattn_tensors t = qkv_tensors(&s, q, k, v);
            clattn_sdpa_desc desc;
            clattn_sdpa_desc_init(&desc);
            desc.path = (clattn_path)path;
            const size_t mdims[4] = {s.batch, s.heads, s.seq_q, s.seq_k};
            const size_t pdims[2] = {s.batch, s.seq_k}, hdims[1] = {s.heads};
            clattn_tensor *aux = user ? &t.flex_aux0 : NULL;
            if (user) {
                desc.flex.source = source;
                desc.flex.functions = functions;
            }
            switch (which) {
            case B_SOFTCAP:
                if (!user)
                    desc.softcap = 20.0f;
                break;
            case B_ALIBI:
                *(user ? aux : &t.alibi_slopes) = vec(CLATTN_DTYPE_F32, 1, hdims, slopes);
                desc.flex.aux_names[0] = "slopes";
                break;
            case B_CAUSAL:
                if (!user)
                    desc.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
                break;
            case B_WINDOW:
                if (!user) {
                    desc.window_align = CLATTN_CAUSAL_TOP_LEFT;
                    desc.window_left = 5;
                    desc.window_right = 3;
                }
                break;
            case B_KPAD:
                *(user ? aux : &t.key_padding_mask) = vec(CLATTN_DTYPE_U8, 2, pdims, pad);
                desc.flex.aux_names[0] = "pad";
                break;
            case B_BOOL:
                *(user ? aux : &t.attn_mask) = vec(CLATTN_DTYPE_U8, 4, mdims, mask);
                desc.flex.aux_names[0] = "m";
                break;
            default:
                *(user ? aux : &t.attn_mask) = vec(CLATTN_DTYPE_F32, 4, mdims, mask);
                desc.flex.aux_names[0] = "m";
                break;
            }
            if (!user)
                memset(desc.flex.aux_names, 0, sizeof desc.flex.aux_names);
            CLATTN_BIND_ROLES(desc, t);
            clattn_plan *plan = NULL;
            if (tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                                 "clattn_sdpa_plan_create"))
                outs[user] = run_plan(plan, &t, &t.out);
            clattn_plan_release(plan);
            pb_release_tensors(&t);
        }
        if (outs[0] && outs[1]) {
            size_t differ = 0, first = 0;
            for (size_t i = 0; i < nq; ++i)
                if (memcmp(&outs[0][i], &outs[1][i], sizeof(float)) != 0 && differ++ == 0)
                    first = i;
            tu_expect(differ == 0,
                      "%zu of %zu outputs differ from the built-in's bits (first at %zu: %.9g "
                      "built-in, %.9g user)",
                      differ, nq, first, (double)outs[0][first], (double)outs[1][first]);
        }
        free(outs[0]);
        free(outs[1]);
    }
    free(q);
    free(k);
    free(v);
    free(mask);
    free(pad);
    TU_END_TEST();
}
END_TEST

/* --- 3. the backward ---------------------------------------------------------------------- */

START_TEST(test_flex_backward)
{
    TU_BEGIN_TEST();
    const flex_sizes *s = &sizes[_i];
    problem p;
    problem_make(&p, s);
    /* score_mod: 4 tanh((score + bias) / 4), its gradient 1 - tanh^2 */
    char source[1024];
    snprintf(source, sizeof source,
             "float score_mod(float score, int b, int h, int q_idx, int kv_idx)\n"
             "{ return 4.0f * tanh((score + bias[h * %zu + q_idx - kv_idx + %zu]) / 4.0f); }\n"
             "int mask_mod(int b, int h, int q_idx, int kv_idx)\n"
             "{ return qdoc[q_idx] == kdoc[kv_idx] || kv_idx == 0; }\n"
             "float score_mod_grad(float score, int b, int h, int q_idx, int kv_idx)\n"
             "{ const float t = tanh((score + bias[h * %zu + q_idx - kv_idx + %zu]) / 4.0f);\n"
             "  return 1.0f - t * t; }\n",
             s->seq_q + s->seq_k, s->seq_k - 1, s->seq_q + s->seq_k, s->seq_k - 1);
    const size_t nq = s->batch * s->heads * s->seq_q * s->dim;
    const size_t nk = s->batch * s->heads * s->seq_k * s->dim;
    float *go = tu_random_floats(nq);
    /* float64 forward and backward */
    const double scale = 1.0 / sqrt((double)s->dim);
    double *dq = tu_doubles(nq), *dk = tu_doubles(nk), *dv = tu_doubles(nk);
    double *x = tu_doubles(s->seq_k), *w = tu_doubles(s->seq_k), *g = tu_doubles(s->seq_k);
    for (size_t bh = 0; bh < s->batch * s->heads; ++bh) {
        const size_t h = bh % s->heads;
        const float *qb = p.q + bh * s->seq_q * s->dim, *kb = p.k + bh * s->seq_k * s->dim;
        const float *vb = p.v + bh * s->seq_k * s->dim, *gob = go + bh * s->seq_q * s->dim;
        for (size_t i = 0; i < s->seq_q; ++i) {
            double m = -INFINITY;
            for (size_t j = 0; j < s->seq_k; ++j) {
                double dot = 0.0;
                for (size_t c = 0; c < s->dim; ++c)
                    dot += (double)qb[i * s->dim + c] * kb[j * s->dim + c];
                const double t = tanh((dot * scale +
                                       p.bias[h * (s->seq_q + s->seq_k) + i - j + s->seq_k - 1]) /
                                      4.0);
                const bool keep = p.qdoc[i] == p.kdoc[j] || j == 0;
                x[j] = keep ? 4.0 * t : -INFINITY;
                g[j] = 1.0 - t * t;
                m = fmax(m, x[j]);
            }
            double total = 0.0;
            for (size_t j = 0; j < s->seq_k; ++j)
                total += x[j] == -INFINITY ? 0.0 : exp(x[j] - m);
            double delta = 0.0;
            for (size_t j = 0; j < s->seq_k; ++j) {
                w[j] = x[j] == -INFINITY ? 0.0 : exp(x[j] - m) / total;
                double dp = 0.0;
                for (size_t c = 0; c < s->dim; ++c)
                    dp += (double)gob[i * s->dim + c] * vb[j * s->dim + c];
                delta += w[j] * dp;
                x[j] = dp; /* (reuse: dp) */
            }
            for (size_t j = 0; j < s->seq_k; ++j) {
                const double ds = w[j] * (x[j] - delta) * g[j] * scale;
                for (size_t c = 0; c < s->dim; ++c) {
                    dq[(bh * s->seq_q + i) * s->dim + c] += ds * kb[j * s->dim + c];
                    dk[(bh * s->seq_k + j) * s->dim + c] += ds * qb[i * s->dim + c];
                    dv[(bh * s->seq_k + j) * s->dim + c] += w[j] * gob[i * s->dim + c];
                }
            }
        }
    }
    for (int path = CLATTN_PATH_FUSED; path <= CLATTN_PATH_UNFUSED; ++path) {
        tu_set_case("B=%zu H=%zu Lq=%zu Lk=%zu d=%zu, %s backward", s->batch, s->heads, s->seq_q,
                    s->seq_k, s->dim, path == CLATTN_PATH_FUSED ? "fused" : "unfused");
        const size_t lse_dims[3] = {s->batch, s->heads, s->seq_q};
        clattn_tensors t = p.t;
        t.lse = vec(CLATTN_DTYPE_F32, 3, lse_dims, NULL);
        clattn_sdpa_desc desc;
        clattn_sdpa_desc_init(&desc);
        CLATTN_BIND_ROLES(desc, t);
        flex_of(&desc.flex, source, CLATTN_FLEX_SCORE_MOD | CLATTN_FLEX_MASK_MOD);
        clattn_plan *forward = NULL, *backward = NULL;
        tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &forward), CLATTN_SUCCESS,
                         "forward plan");
        float *out = forward ? run_plan(forward, &t, &t.out) : NULL;
        free(out);
        t.grad_out = f32_4(s->batch, s->heads, s->seq_q, s->dim, go);
        t.grad_q = f32_4(s->batch, s->heads, s->seq_q, s->dim, NULL);
        t.grad_k = f32_4(s->batch, s->heads, s->seq_k, s->dim, NULL);
        t.grad_v = f32_4(s->batch, s->heads, s->seq_k, s->dim, NULL);
        CLATTN_BIND_ROLES(desc, t);
        desc.path = (clattn_path)path;
        /* without score_mod_grad: refused, naming it */
        clattn_status status = clattn_sdpa_backward_plan_create(tu_ctx(), &desc, &backward);
        tu_expect(status == CLATTN_ERR_UNSUPPORTED &&
                      strstr(clattn_last_error(tu_ctx()), "score_mod_grad") != NULL,
                  "a backward without score_mod_grad: %s (%s)", clattn_status_string(status),
                  clattn_last_error(tu_ctx()));
        clattn_plan_release(backward);
        backward = NULL;
        desc.flex.functions |= CLATTN_FLEX_SCORE_MOD_GRAD;
        if (tu_expect_status(clattn_sdpa_backward_plan_create(tu_ctx(), &desc, &backward),
                             CLATTN_SUCCESS, "backward plan")) {
            pb_rewrite(tu_ctx(), NULL, &t.grad_q, NULL);
            pb_rewrite(tu_ctx(), NULL, &t.grad_k, NULL);
            pb_rewrite(tu_ctx(), NULL, &t.grad_v, NULL);
            tu_expect_status(clattn_plan_execute(backward, t.by_role, CLATTN_ROLE_COUNT, NULL,
                                                 NULL, 0, NULL, NULL),
                             CLATTN_SUCCESS, "backward execute");
            float *got = tu_floats(nq > nk ? nq : nk);
            pb_download(tu_ctx(), NULL, &t.grad_q, got, NULL);
            tu_expect_close("dq", got, dq, nq, 3 * TU_TOL);
            pb_download(tu_ctx(), NULL, &t.grad_k, got, NULL);
            tu_expect_close("dk", got, dk, nk, 3 * TU_TOL);
            pb_download(tu_ctx(), NULL, &t.grad_v, got, NULL);
            tu_expect_close("dv", got, dv, nk, 3 * TU_TOL);
            free(got);
        }
        clattn_plan_release(forward);
        clattn_plan_release(backward);
        tu_release_mem(t.lse.mem);
        tu_release_mem(t.grad_out.mem);
        tu_release_mem(t.grad_q.mem);
        tu_release_mem(t.grad_k.mem);
        tu_release_mem(t.grad_v.mem);
    }
    free(go);
    free(dq);
    free(dk);
    free(dv);
    free(x);
    free(w);
    free(g);
    problem_free(&p);
    TU_END_TEST();
}
END_TEST

/* --- 4. block masks ------------------------------------------------------------------------- */

START_TEST(test_block_mask)
{
    TU_BEGIN_TEST();
    const flex_sizes s = _i == 0 ? (flex_sizes){2, 2, 130, 200, 16} : (flex_sizes){1, 3, 257, 129, 32};
    const size_t bq = _i == 0 ? 32 : 64, bk = _i == 0 ? 64 : 32;
    problem p;
    problem_make(&p, &s);
    const char *source = source_for(&s);
    const size_t nqb = (s.seq_q + bq - 1) / bq, nkb = (s.seq_k + bk - 1) / bk;
    /* the host's block mask: per (qb, kb) of mask_mod (the same for every b, h) */
    uint8_t *want = tu_bytes(nqb * nkb);
    for (size_t qb = 0; qb < nqb; ++qb)
        for (size_t kb = 0; kb < nkb; ++kb) {
            bool any = false, all = true;
            for (size_t i = qb * bq; i < s.seq_q && i < (qb + 1) * bq; ++i)
                for (size_t j = kb * bk; j < s.seq_k && j < (kb + 1) * bk; ++j) {
                    const bool keep = p.qdoc[i] == p.kdoc[j] || j == 0;
                    any = any || keep;
                    all = all && keep;
                }
            want[qb * nkb + kb] = !any ? 0 : all ? 2 : 1;
        }
    clattn_block_mask_desc bdesc;
    clattn_block_mask_desc_init(&bdesc);
    flex_of(&bdesc.flex, source, CLATTN_FLEX_MASK_MOD);
    bdesc.flex.block_q = bq;
    bdesc.flex.block_k = bk;
    bdesc.aux = &p.t.flex_aux0;
    bdesc.batch = s.batch;
    bdesc.heads = s.heads;
    bdesc.seq_q = s.seq_q;
    bdesc.seq_k = s.seq_k;
    const size_t bm_dims[4] = {s.batch, s.heads, nqb, nkb};
    const size_t bm_n = s.batch * s.heads * nqb * nkb;
    bdesc.out = vec(CLATTN_DTYPE_U8, 4, bm_dims, NULL);
    tu_set_case("B=%zu H=%zu Lq=%zu Lk=%zu, blocks %zu x %zu", s.batch, s.heads, s.seq_q,
                s.seq_k, bq, bk);
    tu_expect_status(clattn_flex_block_mask(tu_ctx(), &bdesc, 0, NULL, NULL), CLATTN_SUCCESS,
                     "clattn_flex_block_mask");
    float *got_bm = tu_floats(bm_n);
    size_t stray = 0;
    pb_download(tu_ctx(), NULL, &bdesc.out, got_bm, &stray);
    size_t wrong = 0, empty = 0;
    for (size_t i = 0; i < bm_n; ++i) {
        wrong += got_bm[i] != (float)want[i % (nqb * nkb)];
        empty += want[i % (nqb * nkb)] == 0;
    }
    tu_expect(wrong == 0 && stray == 0, "block mask: %zu of %zu blocks wrong, %zu stray", wrong,
              bm_n, stray);
    tu_expect(empty > 0, "the problem has no empty block (the test would prove nothing)");
    /* the run with and without the block mask: the same bits; the tiles visited */
    float *outs[2] = {NULL, NULL};
    unsigned long long tiles = 0;
    size_t tile_rows = 0, tile_keys = 0;
    for (int blocks = 0; blocks < 2; ++blocks) {
        clattn_sdpa_desc desc;
        clattn_sdpa_desc_init(&desc);
        clattn_tensors t = p.t;
        if (blocks)
            t.block_mask = bdesc.out;
        CLATTN_BIND_ROLES(desc, t);
        desc.path = CLATTN_PATH_FUSED;
        flex_of(&desc.flex, source, CLATTN_FLEX_SCORE_MOD | CLATTN_FLEX_MASK_MOD);
        desc.flex.block_q = bq;
        desc.flex.block_k = bk;
        desc.flex.count_tiles = 1;
        clattn_plan *plan = NULL;
        if (tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                             "clattn_sdpa_plan_create")) {
            outs[blocks] = run_plan(plan, &t, &t.out);
            if (blocks)
                tu_expect_status(
                    clattn_plan_tiles_visited(plan, NULL, &tiles, &tile_rows, &tile_keys),
                    CLATTN_SUCCESS, "clattn_plan_tiles_visited");
        }
        clattn_plan_release(plan);
    }
    const size_t n = pb_tensor_count(&p.t.out);
    if (outs[0] && outs[1])
        tu_expect(memcmp(outs[0], outs[1], n * sizeof(float)) == 0,
                  "the block-masked run's bits differ from the run without the block mask");
    /* the non-empty tiles of the kernel's geometry */
    unsigned long long expected = 0, dense = 0;
    for (size_t r0 = 0; tile_rows && r0 < s.seq_q; r0 += tile_rows)
        for (size_t k0 = 0; tile_keys && k0 < s.seq_k; k0 += tile_keys) {
            const size_t r1 = (r0 + tile_rows < s.seq_q ? r0 + tile_rows : s.seq_q) - 1;
            const size_t k1 = (k0 + tile_keys < s.seq_k ? k0 + tile_keys : s.seq_k) - 1;
            bool any = false;
            for (size_t qb = r0 / bq; qb <= r1 / bq; ++qb)
                for (size_t kb = k0 / bk; kb <= k1 / bk; ++kb)
                    any = any || want[qb * nkb + kb] != 0;
            expected += any;
            ++dense;
        }
    expected *= s.batch * s.heads;
    dense *= s.batch * s.heads;
    tu_expect(tiles == expected && expected < dense,
              "tiles visited %llu, expected %llu of %llu (tiles of %zu rows x %zu keys)", tiles,
              expected, dense, tile_rows, tile_keys);
    free(outs[0]);
    free(outs[1]);
    free(got_bm);
    free(want);
    tu_release_mem(bdesc.out.mem);
    problem_free(&p);
    TU_END_TEST();
}
END_TEST

/* --- 6. T5's relative-position buckets: a built-in made of score functions ------------------ */

/* HF's T5Attention._relative_position_bucket in float32, as the kernels compute it. */
static int t5_bucket(long rel, int buckets, int max_distance, int bidirectional)
{
    int n = buckets, bucket = 0;
    if (bidirectional) {
        n /= 2;
        bucket = rel > 0 ? n : 0;
        rel = labs(rel);
    } else {
        rel = rel < 0 ? -rel : 0;
    }
    const int exact = n / 2;
    if (rel < exact)
        return bucket + (int)rel;
    const float scaled =
        logf((float)rel / (float)exact) / logf((float)max_distance / (float)exact) * (float)(n - exact);
    const int large = exact + (int)scaled;
    return bucket + (large < n - 1 ? large : n - 1);
}

/* The built-in (t5_bias) against the same bias as a user score_mod that reads a host-made
 * (Lq, Lk) table of bucket indices: the same float added, so the same bits, forward (fused and
 * unfused) and backward; and against a float64 reference. */
START_TEST(test_t5_buckets)
{
    TU_BEGIN_TEST();
    const int bidirectional = _i == 0;
    const flex_sizes s = {2, 3, 37, 211, 16};
    const size_t buckets = bidirectional ? 32 : 16, max_distance = 64;
    const size_t nq = s.batch * s.heads * s.seq_q * s.dim, nk = s.batch * s.heads * s.seq_k * s.dim;
    float *q = tu_random_floats(nq), *k = tu_random_floats(nk), *v = tu_random_floats(nk);
    float *go = tu_random_floats(nq);
    float *table = tu_random_floats(buckets * s.heads);
    float *index = tu_floats(s.seq_q * s.seq_k);
    for (size_t i = 0; i < s.seq_q; ++i)
        for (size_t j = 0; j < s.seq_k; ++j)
            index[i * s.seq_k + j] = (float)t5_bucket(
                (long)j - (long)(i + s.seq_k - s.seq_q), (int)buckets, (int)max_distance,
                bidirectional);
    char source[512];
    snprintf(source, sizeof source,
             "float score_mod(float score, int b, int h, int q, int k)\n"
             "{ return score + tab[bucket[q * %zu + k] * %zu + h]; }\n"
             "float score_mod_grad(float score, int b, int h, int q, int k) { return 1.0f; }\n",
             s.seq_k, s.heads);
    const size_t tdims[2] = {buckets, s.heads}, idims[2] = {s.seq_q, s.seq_k};
    const size_t lse_dims[3] = {s.batch, s.heads, s.seq_q};
    float *got[2][2] = {{NULL, NULL}, {NULL, NULL}}; /* [builtin or user][out or dq] */
    for (int path = CLATTN_PATH_FUSED; path <= CLATTN_PATH_UNFUSED; ++path) {
        tu_set_case("T5 buckets, %s, %s", bidirectional ? "bidirectional" : "causal side",
                    path == CLATTN_PATH_FUSED ? "fused" : "unfused");
        for (int user = 0; user < 2; ++user) {
            clattn_tensors t = qkv_tensors(&s, q, k, v);
            if (path == CLATTN_PATH_FUSED) /* (the backward's; only the fused path gives it) */
                t.lse = vec(CLATTN_DTYPE_F32, 3, lse_dims, NULL);
            clattn_sdpa_desc desc;
            clattn_sdpa_desc_init(&desc);
            desc.path = (clattn_path)path;
            desc.scale = 1.0f;
            if (user) {
                t.flex_aux0 = vec(CLATTN_DTYPE_F32, 2, tdims, table);
                t.flex_aux1 = vec(CLATTN_DTYPE_I32, 2, idims, index);
                desc.flex.source = source;
                desc.flex.functions = CLATTN_FLEX_SCORE_MOD | CLATTN_FLEX_SCORE_MOD_GRAD;
                desc.flex.aux_names[0] = "tab";
                desc.flex.aux_names[1] = "bucket";
            } else {
                t.t5_bias = vec(CLATTN_DTYPE_F32, 2, tdims, table);
                desc.t5_num_buckets = buckets;
                desc.t5_max_distance = max_distance;
                desc.t5_bidirectional = bidirectional;
            }
            CLATTN_BIND_ROLES(desc, t);
            clattn_plan *plan = NULL, *backward = NULL;
            if (tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                                 user ? "the user's plan" : "the T5 plan"))
                got[user][0] = run_plan(plan, &t, &t.out);
            if (path == CLATTN_PATH_FUSED && plan) {
                t.grad_out = f32_4(s.batch, s.heads, s.seq_q, s.dim, go);
                t.grad_q = f32_4(s.batch, s.heads, s.seq_q, s.dim, NULL);
                t.grad_k = f32_4(s.batch, s.heads, s.seq_k, s.dim, NULL);
                t.grad_v = f32_4(s.batch, s.heads, s.seq_k, s.dim, NULL);
                CLATTN_BIND_ROLES(desc, t);
                if (tu_expect_status(clattn_sdpa_backward_plan_create(tu_ctx(), &desc, &backward),
                                     CLATTN_SUCCESS, "backward")) {
                    tu_expect_status(clattn_plan_execute(backward, t.by_role, CLATTN_ROLE_COUNT,
                                                         NULL, NULL, 0, NULL, NULL),
                                     CLATTN_SUCCESS, "backward execute");
                    got[user][1] = tu_floats(nq);
                    pb_download(tu_ctx(), NULL, &t.grad_q, got[user][1], NULL);
                }
            }
            clattn_plan_release(plan);
            clattn_plan_release(backward);
            pb_release_tensors(&t);
        }
        for (int which = 0; which < 2; ++which)
            if (got[0][which] && got[1][which])
                tu_expect(memcmp(got[0][which], got[1][which], nq * sizeof(float)) == 0,
                          "t5_bias's %s differs from the same bias as a user score_mod",
                          which ? "dq" : "out");
        /* the float64 reference of the forward */
        if (got[0][0]) {
            double *want = tu_doubles(nq), *row = tu_doubles(s.seq_k);
            for (size_t bh = 0; bh < s.batch * s.heads; ++bh) {
                const size_t h = bh % s.heads;
                for (size_t i = 0; i < s.seq_q; ++i) {
                    double m = -INFINITY, total = 0.0;
                    for (size_t j = 0; j < s.seq_k; ++j) {
                        double dot = 0.0;
                        for (size_t c = 0; c < s.dim; ++c)
                            dot += (double)q[(bh * s.seq_q + i) * s.dim + c] *
                                   k[(bh * s.seq_k + j) * s.dim + c];
                        row[j] = dot + table[(size_t)index[i * s.seq_k + j] * s.heads + h];
                        m = fmax(m, row[j]);
                    }
                    for (size_t j = 0; j < s.seq_k; ++j)
                        total += exp(row[j] - m);
                    for (size_t j = 0; j < s.seq_k; ++j)
                        for (size_t c = 0; c < s.dim; ++c)
                            want[(bh * s.seq_q + i) * s.dim + c] +=
                                exp(row[j] - m) / total * v[(bh * s.seq_k + j) * s.dim + c];
                }
            }
            tu_expect_close("out", got[0][0], want, nq, TU_TOL);
            free(want);
            free(row);
        }
        for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b) {
                free(got[a][b]);
                got[a][b] = NULL;
            }
    }
    free(q);
    free(k);
    free(v);
    free(go);
    free(table);
    free(index);
    TU_END_TEST();
}
END_TEST

/* --- 5. build errors, the program cache, refusals ---------------------------------------- */

START_TEST(test_flex_errors)
{
    TU_BEGIN_TEST();
    const flex_sizes s = {1, 2, 17, 19, 16};
    problem p;
    problem_make(&p, &s);
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    CLATTN_BIND_ROLES(desc, p.t);
    clattn_plan *plan = NULL;
    /* a compile error on the source's line 2 */
    tu_set_case("a source that does not compile");
    flex_of(&desc.flex,
            "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
            "    return score + undefined_name;\n}\n",
            CLATTN_FLEX_SCORE_MOD);
    clattn_status status = clattn_sdpa_plan_create(tu_ctx(), &desc, &plan);
    tu_expect(status == CLATTN_ERR_BUILD && plan == NULL &&
                  strstr(clattn_last_error(tu_ctx()), "score_mod:2") != NULL,
              "a bad source: %s, message: %.300s", clattn_status_string(status),
              clattn_last_error(tu_ctx()));
    /* the same source and names twice: built once */
    tu_set_case("the program cache");
    flex_of(&desc.flex, source_for(&s), CLATTN_FLEX_SCORE_MOD | CLATTN_FLEX_MASK_MOD);
    clattn_plan *first = NULL, *second = NULL;
    tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &first), CLATTN_SUCCESS, "first");
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", source_for(&s)); /* equal text, another pointer */
    desc.flex.source = copy;
    tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &second), CLATTN_SUCCESS, "second");
    /* (That the second builds nothing: check_fault's test_flex_source_built_once counts the
     * builds with the fault library's hook.) */
    clattn_plan_release(first);
    clattn_plan_release(second);
    /* refusals, each naming what is wrong */
    struct {
        const char *what, *word;
        void (*edit)(clattn_sdpa_desc *d, clattn_tensors *t);
    } cases[] = {{"a name that is not an identifier", "aux_names[1]", NULL},
                 {"functions 0", "functions", NULL},
                 {"an aux name without its tensor", "flex_aux3", NULL}};
    for (int c = 0; c < 3; ++c) {
        tu_set_case("%s", cases[c].what);
        flex_of(&desc.flex, source_for(&s), CLATTN_FLEX_SCORE_MOD | CLATTN_FLEX_MASK_MOD);
        if (c == 0)
            desc.flex.aux_names[1] = "k doc";
        if (c == 1)
            desc.flex.functions = 0;
        if (c == 2)
            desc.flex.aux_names[3] = "extra";
        plan = NULL;
        status = clattn_sdpa_plan_create(tu_ctx(), &desc, &plan);
        tu_expect(status != CLATTN_SUCCESS && plan == NULL &&
                      strstr(clattn_last_error(tu_ctx()), cases[c].word) != NULL,
                  "%s: %s (%s)", cases[c].what, clattn_status_string(status),
                  clattn_last_error(tu_ctx()));
        clattn_plan_release(plan);
    }
    problem_free(&p);
    TU_END_TEST();
}
END_TEST

int main(void)
{
    tu_suite_begin("flex");
    Suite *suite = suite_create("flex");
    /* CLATTN_TEST_SCALE=small (the variant entries, Oclgrind): the two smallest sizes. The
     * Oclgrind lane runs the "numbers" case (CK_RUN_CASE=numbers): its API check reports the
     * build error that "errors" provokes on purpose. */
    const int sizes_run = tu_small() ? 2 : SIZES;
    TCase *numbers = tu_tcase(suite, "numbers", 900);
    tcase_add_loop_test(numbers, test_flex_forward, 0, sizes_run);
    tcase_add_loop_test(numbers, test_flex_backward, 0, sizes_run);
    tcase_add_loop_test(numbers, test_block_mask, 0, tu_small() ? 1 : 2);
    TCase *builtins = tu_tcase(suite, "builtins", 900);
    tcase_add_loop_test(builtins, test_builtin_as_user_function, 0, BUILTINS);
    tcase_add_loop_test(builtins, test_t5_buckets, 0, 2);
    TCase *errors = tu_tcase(suite, "errors", 900);
    tcase_add_loop_test(errors, test_flex_errors, 0, 1);
    return tu_run_suite(suite);
}
