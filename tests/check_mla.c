/*
 * Multi-head latent attention (DeepSeek V2/V3's MLA) in its absorbed form through clattn's SDPA
 * plans (since 0.12): d_qk = 576 (512 latent + 64 rotary columns), d_v = 512, one latent KV
 * head for all the query heads, V a view of K's storage (the first 512 columns of each
 * 576-wide cache row: the same buffer and strides), contiguous or paged, in F32, F16 or Q8_0.
 *
 * The float64 reference is the NON-absorbed form, from explicit matrices: per query head h,
 * W_UK[h] (512 x 128) and W_UV[h] (512 x 128); latent rows c (keys x 512), rotary keys
 * k_rope (keys x 64); queries q_nope (128) and q_rope (64) per head and row. Head h attends
 * with k_h = [c W_UK[h], k_rope] and v_h = c W_UV[h], scale 1/sqrt(128 + 64). The absorbed
 * form that clattn runs: q_abs = [q_nope W_UK[h]^T, q_rope] (576) over K = [c, k_rope] and
 * V = c, the same scale passed explicitly, then out_h = o_latent W_UV[h]. Both are equal in
 * exact arithmetic; float32 within 1e-5 (relative to the largest output), Q8_0 within 1e-5
 * of the reference on the latent the blocks stand for and within its quantization bound of
 * the reference on the exact latent.
 */
#include "problems.h"
#include "reference.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MLA_LATENT 512
#define MLA_ROPE 64
#define MLA_DQK (MLA_LATENT + MLA_ROPE)
#define MLA_NOPE 128 /* the non-absorbed heads' key part (d_nope) */
#define MLA_DV 128   /* and value size (d_v per head) */

/* Which kernel runs: the context's tuning, or rows that force flash_gpu.cl or flash.cl. */
enum { KERNEL_TUNED = 0, KERNEL_GPU = 1, KERNEL_PORTABLE = 2 };

/* The scales a case runs at: small (CLATTN_TEST_SCALE=small: Oclgrind, the sanitizers),
 * the default CI tier, full. */
enum { TIER_SMALL = 0, TIER_DEFAULT = 1, TIER_FULL = 2 };

typedef struct mla_case {
    size_t batch, heads, seq_q, keys; /* keys: batch 0's; batch 1 has keys - keys / 3 */
    clattn_dtype cache;
    size_t page_size; /* 0: contiguous (batch, 1, keys, 576) */
    int kernel;
    int tier;
} mla_case;

#define F32 CLATTN_DTYPE_F32
#define F16 CLATTN_DTYPE_F16
#define Q8 CLATTN_DTYPE_Q8_0
/* clang-format off */
static const mla_case cases[] = {
    /* small: decode (one query row) and a few rows with causal bottom-right, a paged cache of
     * shuffled pages, F16 and Q8_0, each kernel */
    {1,  16, 1,    1, F32,  0, KERNEL_TUNED,    TIER_SMALL},
    {1,  16, 1,   17, F32,  0, KERNEL_TUNED,    TIER_SMALL},
    {2,  16, 3,   17, F32,  8, KERNEL_TUNED,    TIER_SMALL},
    {1,  16, 2,   17, Q8,   0, KERNEL_TUNED,    TIER_SMALL},
    {1,  16, 1,   17, F16, 16, KERNEL_GPU,      TIER_SMALL},
    {1,  16, 2,    9, F32,  0, KERNEL_PORTABLE, TIER_SMALL},
    /* the CI tier: 128 heads, longer caches, each kernel on a paged or Q8_0 cache */
    {1, 128, 1,   65, F16,  0, KERNEL_TUNED,    TIER_DEFAULT},
    {1,  16, 1, 1031, F32, 16, KERNEL_TUNED,    TIER_DEFAULT},
    {2,  16, 3,   65, F32, 16, KERNEL_TUNED,    TIER_DEFAULT},
    {2,  16, 1,   65, Q8,  16, KERNEL_TUNED,    TIER_DEFAULT},
    {2,  16, 1,   65, F32, 16, KERNEL_GPU,      TIER_DEFAULT},
    {1,  16, 3,   17, Q8,   0, KERNEL_GPU,      TIER_DEFAULT},
    {1,  16, 2,   33, F16,  0, KERNEL_PORTABLE, TIER_DEFAULT},
    /* full: 128 heads over 1031 keys */
    {1, 128, 1, 1031, Q8,  64, KERNEL_TUNED,    TIER_FULL},
    {1, 128, 5, 1031, F32, 64, KERNEL_TUNED,    TIER_FULL},
    {2, 128, 1, 1031, F16,  0, KERNEL_GPU,      TIER_FULL},
};
/* clang-format on */
#undef F32
#undef F16
#undef Q8

static const char *kernel_name(int kernel)
{
    return kernel == KERNEL_GPU ? "flash_gpu" : kernel == KERNEL_PORTABLE ? "flash" : "tuned";
}

/* One problem's host data: the model's matrices and the inputs, drawn, and what is uploaded. */
typedef struct mla_host {
    size_t heads, rows, keys_max, kv_len[2];
    float *c, *k_rope, *w_uk, *w_uv, *q_nope, *q_rope; /* drawn */
    float *latent;   /* c as the cache stores it (F16 rounded, Q8_0 dequantized) */
    float *k_rope_s; /* k_rope likewise */
    float *q_abs;    /* (batch, heads, seq_q, 576) */
} mla_host;

/* The non-absorbed attention of head h of batch b, all its query rows, in float64: k_h =
 * [c W_UK[h], k_rope] (keys x 192) and v_h = c W_UV[h] (keys x 128) built once from the latent
 * `c` (keys_max x 512 per batch) and `k_rope`, then softmax(q k_h^T scale) v_h per row with
 * causal bottom-right; out: seq_q rows of 128. */
static void reference_head(const mla_case *mc, const mla_host *m, const float *c,
                           const float *k_rope, size_t b, size_t h, double *out)
{
    const size_t n = m->kv_len[b], dk = MLA_NOPE + MLA_ROPE;
    const float *wuk = m->w_uk + h * MLA_LATENT * MLA_NOPE,
                *wuv = m->w_uv + h * MLA_LATENT * MLA_DV;
    double *kh = tu_doubles(n * dk + 1), *vh = tu_doubles(n * MLA_DV + 1);
    double *scores = tu_doubles(n + 1);
    for (size_t j = 0; j < n; ++j) {
        const float *cj = c + (b * m->keys_max + j) * MLA_LATENT;
        for (size_t l = 0; l < MLA_LATENT; ++l) { /* kh[j][e] += c[l] W_UK[l][e], likewise v */
            const double cl = cj[l];
            for (size_t e = 0; e < MLA_NOPE; ++e)
                kh[j * dk + e] += cl * wuk[l * MLA_NOPE + e];
            for (size_t e = 0; e < MLA_DV; ++e)
                vh[j * MLA_DV + e] += cl * wuv[l * MLA_DV + e];
        }
        for (size_t e = 0; e < MLA_ROPE; ++e)
            kh[j * dk + MLA_NOPE + e] = k_rope[(b * m->keys_max + j) * MLA_ROPE + e];
    }
    for (size_t i = 0; i < mc->seq_q; ++i) {
        const size_t row = (b * m->heads + h) * mc->seq_q + i;
        /* causal bottom-right: row i sees keys j <= i + n - seq_q */
        const long long last = (long long)i + (long long)n - (long long)mc->seq_q;
        double max = -INFINITY, total = 0.0;
        for (size_t j = 0; j < n; ++j) {
            double dot = 0.0;
            for (size_t e = 0; e < MLA_NOPE; ++e)
                dot += (double)m->q_nope[row * MLA_NOPE + e] * kh[j * dk + e];
            for (size_t e = 0; e < MLA_ROPE; ++e)
                dot += (double)m->q_rope[row * MLA_ROPE + e] * kh[j * dk + MLA_NOPE + e];
            scores[j] = (long long)j > last ? -INFINITY : dot / sqrt((double)dk);
            max = scores[j] > max ? scores[j] : max;
        }
        for (size_t j = 0; j < n; ++j)
            total += scores[j] = isfinite(scores[j]) ? exp(scores[j] - max) : 0.0;
        for (size_t e = 0; e < MLA_DV; ++e) {
            double acc = 0.0;
            for (size_t j = 0; j < n; ++j)
                acc += scores[j] * vh[j * MLA_DV + e];
            out[row * MLA_DV + e] = acc / total;
        }
    }
    free(kh), free(vh), free(scores);
}

/* Draws the problem; q_abs from it in float64, rounded to float. */
static void draw(const mla_case *mc, mla_host *m)
{
    memset(m, 0, sizeof *m);
    m->heads = mc->heads;
    m->rows = mc->batch * mc->heads * mc->seq_q;
    m->keys_max = mc->keys;
    m->kv_len[0] = mc->keys;
    m->kv_len[1] = mc->keys - mc->keys / 3;
    const size_t kc = mc->batch * mc->keys;
    m->c = tu_random_floats(kc * MLA_LATENT);
    m->k_rope = tu_random_floats(kc * MLA_ROPE);
    /* W scaled so that the scores spread over a few units: softmax neither flat nor one-hot */
    m->w_uk = tu_floats(mc->heads * MLA_LATENT * MLA_NOPE);
    m->w_uv = tu_floats(mc->heads * MLA_LATENT * MLA_DV);
    tu_fill_uniform(m->w_uk, mc->heads * MLA_LATENT * MLA_NOPE, -0.15f, 0.15f);
    tu_fill_uniform(m->w_uv, mc->heads * MLA_LATENT * MLA_DV, -0.1f, 0.1f);
    m->q_nope = tu_random_floats(m->rows * MLA_NOPE);
    m->q_rope = tu_random_floats(m->rows * MLA_ROPE);
    m->q_abs = tu_floats(m->rows * MLA_DQK);
    for (size_t r = 0; r < m->rows; ++r) {
        const size_t h = r / mc->seq_q % mc->heads;
        const float *wuk = m->w_uk + h * MLA_LATENT * MLA_NOPE;
        for (size_t l = 0; l < MLA_LATENT; ++l) {
            double acc = 0.0; /* (q_nope W_UK[h]^T)[l] */
            for (size_t e = 0; e < MLA_NOPE; ++e)
                acc += (double)m->q_nope[r * MLA_NOPE + e] * wuk[l * MLA_NOPE + e];
            m->q_abs[r * MLA_DQK + l] = (float)acc;
        }
        memcpy(m->q_abs + r * MLA_DQK + MLA_LATENT, m->q_rope + r * MLA_ROPE,
               MLA_ROPE * sizeof(float));
    }
}

static void free_host(mla_host *m)
{
    free(m->c), free(m->k_rope), free(m->w_uk), free(m->w_uv), free(m->q_nope);
    free(m->q_rope), free(m->latent), free(m->k_rope_s), free(m->q_abs);
}

/* The cache's rows (576 wide: [c, k_rope]) laid out contiguously (batch, 1, keys, 576) or in
 * shuffled pages (pages, page_size, 1, 576), unused slots and pages poisoned (NaN; Q8_0: 1e4,
 * as NaN has no int8); stored as the cache's dtype into *bytes; m->latent and m->k_rope_s get
 * the values it stands for. table (batch x blocks) receives the pages. Returns the elements. */
static size_t lay_cache(const mla_case *mc, mla_host *m, int *table, size_t blocks,
                        size_t num_pages, uint8_t **bytes, size_t *byte_count)
{
    const size_t slots = mc->page_size ? num_pages * mc->page_size : mc->batch * mc->keys;
    const size_t count = slots * MLA_DQK;
    float *rows = tu_floats(count);
    const float poison = mc->cache == CLATTN_DTYPE_Q8_0 ? 1e4f : NAN;
    for (size_t e = 0; e < count; ++e)
        rows[e] = poison;
    size_t *slot_of = calloc(mc->batch * mc->keys + 1, sizeof(size_t));
    if (mc->page_size) { /* a random permutation of the pages, the last ones unused */
        int *perm = calloc(num_pages, sizeof(int));
        for (size_t p = 0; p < num_pages; ++p)
            perm[p] = (int)p;
        for (size_t p = num_pages - 1; p > 0; --p) {
            const size_t s = tu_rand_below(p + 1);
            const int t = perm[p];
            perm[p] = perm[s], perm[s] = t;
        }
        for (size_t b = 0; b < mc->batch; ++b)
            for (size_t blk = 0; blk < blocks; ++blk)
                table[b * blocks + blk] = perm[b * blocks + blk];
        free(perm);
    }
    for (size_t b = 0; b < mc->batch; ++b)
        for (size_t j = 0; j < m->kv_len[b]; ++j) {
            const size_t slot =
                mc->page_size ? (size_t)table[b * blocks + j / mc->page_size] * mc->page_size +
                                    j % mc->page_size
                              : b * mc->keys + j;
            slot_of[b * mc->keys + j] = slot;
            memcpy(rows + slot * MLA_DQK, m->c + (b * mc->keys + j) * MLA_LATENT,
                   MLA_LATENT * sizeof(float));
            memcpy(rows + slot * MLA_DQK + MLA_LATENT, m->k_rope + (b * mc->keys + j) * MLA_ROPE,
                   MLA_ROPE * sizeof(float));
        }
    float *stored = tu_floats(count);
    if (mc->cache == CLATTN_DTYPE_Q8_0) {
        *byte_count = ref_quantized_bytes(mc->cache, count);
        *bytes = tu_bytes(*byte_count);
        ref_quantize(mc->cache, rows, count, *bytes);
        ref_dequantize(mc->cache, *bytes, count, stored);
    } else if (mc->cache == CLATTN_DTYPE_F16) {
        *byte_count = count * 2;
        *bytes = tu_bytes(*byte_count);
        uint16_t *h = (uint16_t *)*bytes;
        for (size_t e = 0; e < count; ++e)
            h[e] = pb_f16_from_float(rows[e]), stored[e] = pb_f16_to_float(h[e]);
    } else {
        *byte_count = count * 4;
        *bytes = tu_bytes(*byte_count);
        memcpy(*bytes, rows, *byte_count);
        memcpy(stored, rows, *byte_count);
    }
    /* the values the cache stands for, per (batch, key), as the reference reads them */
    m->latent = tu_floats(mc->batch * mc->keys * MLA_LATENT);
    m->k_rope_s = tu_floats(mc->batch * mc->keys * MLA_ROPE);
    for (size_t b = 0; b < mc->batch; ++b)
        for (size_t j = 0; j < mc->keys; ++j) {
            const size_t at = b * mc->keys + j;
            const float *row = stored + slot_of[at] * MLA_DQK;
            memcpy(m->latent + at * MLA_LATENT, row, MLA_LATENT * sizeof(float));
            memcpy(m->k_rope_s + at * MLA_ROPE, row + MLA_LATENT, MLA_ROPE * sizeof(float));
        }
    free(slot_of);
    free(rows);
    free(stored);
    return count;
}

/* A context on the shared one's queue whose rows force a kernel (NULL: the shared context). */
static clattn_ctx *kernel_ctx(int kernel)
{
    if (kernel == KERNEL_TUNED)
        return tu_ctx();
    clattn_ctx_desc desc;
    clattn_ctx_desc_init(&desc);
    desc.queue = clattn_ctx_queue(tu_ctx());
    desc.tuning_rows =
        kernel == KERNEL_GPU
            ? "any | * | * | flash_cpu=0 flash_gpu=1 fg_bq=64 fg_bk=32 fg_tx=16 fg_ty=8"
            : "any | * | * | flash_cpu=0 flash_gpu=0 flash_rows=64 flash_vw=8";
    clattn_ctx *ctx = NULL;
    char message[512] = "";
    const clattn_status status = clattn_ctx_create_desc(&desc, &ctx, message, sizeof message);
    tu_expect(status == CLATTN_SUCCESS, "clattn_ctx_create_desc(%s rows): %s", kernel_name(kernel),
              message);
    return ctx;
}

/* The plan's tensors: q (batch, heads, seq_q, 576) F32; k the cache (576 wide) and v the view
 * of its first 512 columns (same buffer, offset and strides); out (batch, heads, seq_q, 512). */
static void bind(const mla_case *mc, size_t blocks, size_t num_pages, cl_mem q, cl_mem cache,
                 cl_mem out, cl_mem table, cl_mem kv_len, clattn_tensors *t)
{
    memset(t, 0, sizeof *t);
    t->q = clattn_tensor_make(q, 0, CLATTN_DTYPE_F32, 4, mc->batch, mc->heads, mc->seq_q, MLA_DQK);
    t->out = clattn_tensor_make(out, 0, CLATTN_DTYPE_F32, 4, mc->batch, mc->heads, mc->seq_q,
                                MLA_LATENT);
    if (mc->page_size)
        t->k = clattn_tensor_make(cache, 0, mc->cache, 4, num_pages, mc->page_size, 1, MLA_DQK);
    else
        t->k = clattn_tensor_make(cache, 0, mc->cache, 4, mc->batch, 1, mc->keys, MLA_DQK);
    t->v = t->k;
    t->v.dims[3] = MLA_LATENT; /* the latent: a view of the key rows */
    t->kv_seqlen = clattn_tensor_make(kv_len, 0, CLATTN_DTYPE_I32, 1, mc->batch, 0, 0, 0);
    if (mc->page_size)
        t->block_table = clattn_tensor_make(table, 0, CLATTN_DTYPE_I32, 2, mc->batch, blocks, 0, 0);
}

/* Compares the device's latent output, mapped by W_UV per head, with the non-absorbed
 * references on the stored latent (1e-5) and, for Q8_0, on the exact one (bound). */
static void compare(const mla_case *mc, const mla_host *m, const float *got)
{
    const size_t count = m->rows * MLA_DV;
    float *mapped = tu_floats(count);
    double *want = tu_doubles(count), *exact = tu_doubles(count);
    for (size_t r = 0; r < m->rows; ++r) {
        const float *wuv = m->w_uv + r / mc->seq_q % mc->heads * MLA_LATENT * MLA_DV;
        for (size_t e = 0; e < MLA_DV; ++e) { /* out_h = o_latent W_UV[h], in float64 */
            double acc = 0.0;
            for (size_t l = 0; l < MLA_LATENT; ++l)
                acc += (double)got[r * MLA_LATENT + l] * wuv[l * MLA_DV + e];
            mapped[r * MLA_DV + e] = (float)acc;
        }
    }
    for (size_t b = 0; b < mc->batch; ++b)
        for (size_t h = 0; h < mc->heads; ++h) {
            reference_head(mc, m, m->latent, m->k_rope_s, b, h, want);
            if (mc->cache != CLATTN_DTYPE_F32)
                reference_head(mc, m, m->c, m->k_rope, b, h, exact);
        }
    const double err = tu_rel_error(mapped, want, count);
    tu_track_error(err);
    tu_expect(err <= 1e-5, "absorbed vs non-absorbed float64 reference: relative error %.3g > 1e-5",
              err);
    if (mc->cache != CLATTN_DTYPE_F32) {
        /* The cache's rounding: a latent element moves by at most half a step, 2^-11 of it
         * (F16) or 1/254 of its block's largest (Q8_0); through the scores and the weighted
         * sum the output moves by a few such steps of its scale (measured: 0.4-0.6 % for
         * Q8_0, 0.02 % for F16; bound: three steps). */
        const double bound = mc->cache == CLATTN_DTYPE_Q8_0 ? 3.0 / 254.0 : 3.0 / 2048.0;
        const double q_err = tu_rel_error(mapped, exact, count);
        tu_expect(q_err <= bound,
                  "%s cache vs the exact latent's reference: relative error %.3g > %.3g",
                  pb_dtype_name(mc->cache), q_err, bound);
    }
    free(mapped), free(want), free(exact);
}

START_TEST(test_mla_cases)
{
    TU_BEGIN_TEST();
    const mla_case *mc = &cases[_i];
    tu_set_case("MLA batch=%zu heads=%zu seq_q=%zu keys=%zu (and %zu) cache=%s page_size=%zu "
                "kernel=%s",
                mc->batch, mc->heads, mc->seq_q, mc->keys, mc->keys - mc->keys / 3,
                pb_dtype_name(mc->cache), mc->page_size, kernel_name(mc->kernel));
    mla_host m;
    draw(mc, &m);
    const size_t blocks = mc->page_size ? (mc->keys + mc->page_size - 1) / mc->page_size : 0;
    const size_t num_pages = mc->batch * blocks + 3;
    int *table = calloc(mc->batch * blocks + 1, sizeof(int));
    uint8_t *bytes = NULL;
    size_t byte_count = 0;
    lay_cache(mc, &m, table, blocks, num_pages, &bytes, &byte_count);
    const int kv_len[2] = {(int)m.kv_len[0], (int)m.kv_len[1]};
    clattn_ctx *ctx = kernel_ctx(mc->kernel);
    cl_mem q = tu_upload_floats(m.q_abs, m.rows * MLA_DQK);
    cl_mem cache = tu_upload_bytes(bytes, byte_count);
    cl_mem out = tu_nan_buffer(m.rows * MLA_LATENT);
    cl_mem table_mem = tu_upload_bytes(table, (mc->batch * blocks + 1) * sizeof(int));
    cl_mem len_mem = tu_upload_bytes(kv_len, sizeof kv_len);
    /* the cache is one buffer of 576 elements a slot, K and V both read from it: 2304 bytes
     * a token in F32, 1152 in F16, 612 (18 blocks) in Q8_0 */
    const size_t slots = mc->page_size ? num_pages * mc->page_size : mc->batch * mc->keys;
    const size_t per_token = mc->cache == CLATTN_DTYPE_Q8_0  ? 18 * 34
                             : mc->cache == CLATTN_DTYPE_F16 ? 576 * 2
                                                             : 576 * 4;
    size_t cache_bytes = 0;
    const cl_int err =
        clGetMemObjectInfo(cache, CL_MEM_SIZE, sizeof cache_bytes, &cache_bytes, NULL);
    tu_expect(err == CL_SUCCESS && cache_bytes == slots * per_token,
              "the cache holds %zu bytes, not %zu x %zu", cache_bytes, slots, per_token);
    clattn_tensors t;
    bind(mc, blocks, num_pages, q, cache, out, table_mem, len_mem, &t);
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    CLATTN_BIND_ROLES(desc, t);
    desc.scale = (float)(1.0 / sqrt((double)(MLA_NOPE + MLA_ROPE)));
    desc.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    desc.path = CLATTN_PATH_FUSED;
    clattn_plan *plan = NULL;
    if (ctx != NULL && tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS,
                                        "clattn_sdpa_plan_create")) {
        const char *info = clattn_plan_info(plan);
        const char *want = mc->kernel == KERNEL_GPU        ? "flash_gpu.cl"
                           : mc->kernel == KERNEL_PORTABLE ? "flash.cl"
                                                           : NULL;
        tu_expect(want == NULL || strstr(info, want) != NULL, "the plan runs %s, not %s", info,
                  want);
        if (tu_expect_status(
                clattn_plan_execute(plan, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL),
                CLATTN_SUCCESS, "clattn_plan_execute")) {
            float *got = tu_nan_floats(m.rows * MLA_LATENT);
            tu_read_floats(out, 0, m.rows * MLA_LATENT, got);
            if (tu_expect_finite("out", got, m.rows * MLA_LATENT))
                compare(mc, &m, got);
            free(got);
        }
    }
    clattn_plan_release(plan);
    if (ctx != tu_ctx())
        clattn_ctx_release(ctx);
    tu_release_mem(q), tu_release_mem(cache), tu_release_mem(out);
    tu_release_mem(table_mem), tu_release_mem(len_mem);
    free(table), free(bytes);
    free_host(&m);
    TU_END_TEST();
}
END_TEST

/* V as a view of K: the cache's bytes per token are 576 elements' (F32 2304, F16 1152, Q8_0
 * 18 blocks, 612), the plan's refusals where the view or the head sizes do not fit. */
START_TEST(test_mla_layout)
{
    TU_BEGIN_TEST();
    tu_set_case("KV bytes per token, views and refusals");
    clattn_ctx *ctx = tu_ctx();
    const mla_case mc = {1, 16, 1, 8, CLATTN_DTYPE_F32, 0, KERNEL_TUNED, TIER_SMALL};
    static const clattn_dtype dtypes[3] = {CLATTN_DTYPE_F32, CLATTN_DTYPE_F16, CLATTN_DTYPE_Q8_0};
    static const size_t per_token[3] = {576 * 4, 576 * 2, 18 * 34};
    for (int i = 0; i < 3; ++i) {
        mla_case c = mc;
        c.cache = dtypes[i];
        clattn_tensors t;
        bind(&c, 0, 0, NULL, NULL, NULL, NULL, NULL, &t);
        /* the bytes the K and V tensors span per token: one row of K, V inside it */
        const size_t row = t.k.strides[2];
        const size_t bytes =
            c.cache == CLATTN_DTYPE_Q8_0 ? row / 32 * 34 : row * clattn_dtype_size(c.cache);
        tu_expect(bytes == per_token[i] && t.v.strides[2] == t.k.strides[2] && t.v.mem == t.k.mem,
                  "%s: %zu bytes per token, expected %zu", pb_dtype_name(c.cache), bytes,
                  per_token[i]);
        clattn_sdpa_desc desc;
        clattn_sdpa_desc_init(&desc);
        CLATTN_BIND_ROLES(desc, t);
        clattn_plan *plan = NULL;
        tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS,
                         "clattn_sdpa_plan_create(MLA view)");
        tu_expect(plan == NULL || clattn_plan_is_fused(plan), "MLA's head sizes did not fuse");
        clattn_plan_release(plan);
    }
    /* Refusals: a head size past 576 on the fused path; a Q8_0 view that is not whole blocks. */
    clattn_tensors t;
    bind(&mc, 0, 0, NULL, NULL, NULL, NULL, NULL, &t);
    t.q.dims[3] = t.k.dims[3] = 577;
    t.q.strides[2] = t.k.strides[2] = t.v.strides[2] = 577;
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    CLATTN_BIND_ROLES(desc, t);
    desc.path = CLATTN_PATH_FUSED;
    clattn_plan *plan = (clattn_plan *)&desc;
    clattn_status status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    tu_expect_refused(status, plan, CLATTN_ERR_UNSUPPORTED, "sdpa", "576",
                      "sdpa(FUSED, head_dim_qk 577)");
    mla_case q8 = mc;
    q8.cache = CLATTN_DTYPE_Q8_0;
    bind(&q8, 0, 0, NULL, NULL, NULL, NULL, NULL, &t);
    t.v.dims[3] = t.out.dims[3] = 500; /* not whole blocks: 512 is 16 of them, 500 is not */
    t.out.strides[2] = 500, t.out.strides[1] = 500, t.out.strides[0] = 16 * 500;
    CLATTN_BIND_ROLES(desc, t);
    plan = (clattn_plan *)&desc;
    status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    tu_expect_refused(status, plan, CLATTN_ERR_UNSUPPORTED, "sdpa", "32",
                      "sdpa(a Q8_0 view of 500 columns)");
    TU_END_TEST();
}
END_TEST

static Suite *mla_suite(void)
{
    Suite *suite = suite_create("mla");
    TCase *tc = tu_tcase(suite, "mla", 900);
    const int count = (int)(sizeof cases / sizeof cases[0]);
    const int tier = tu_full() ? TIER_FULL : tu_small() ? TIER_SMALL : TIER_DEFAULT;
    int run = 0;
    while (run < count && cases[run].tier <= tier)
        ++run;
    tcase_add_loop_test(tc, test_mla_cases, 0, run);
    if (run < count)
        tu_not_run("test_mla_cases %d-%d (%s)", run, count - 1,
                   tier == TIER_SMALL ? "128 heads, 65-1031 keys, Q8_0 pages"
                                      : "128 heads over 1031 keys");
    tcase_add_test(tc, test_mla_layout);
    return suite;
}

int main(void)
{
    return tu_main("check_mla", mla_suite);
}
