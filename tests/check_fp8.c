/*
 * check_fp8: FP8 K/V storage (CLATTN_DTYPE_FP8_E4M3, CLATTN_DTYPE_FP8_E5M2; issue 50, item 8),
 * on each fused kernel family (flash_cpu.cl, flash_gpu.cl and the generic flash.cl, chosen
 * through tuning rows on a second context):
 *   - every one of the 256 codes of both formats, as a value (one key: the output row is the
 *     decoded values times v_scale) and as a key (one key of head size 1, q = 1, scale 1: the
 *     log-sum-exp is the decoded key times k_scale), against a C decode written from the OCP
 *     definition (ldexp), NaN codes giving NaN (as values; a NaN key's score is dropped);
 *   - clattn_quantize_scaled's codes against the C encoder (round to nearest even,
 *     saturation) byte for byte, on random values, ties, overflows, subnormals and NaN;
 *   - attention over FP8 k and v written by clattn_quantize_scaled (awkward sizes, Lq != Lk,
 *     GQA, causal, decode) against the float64 reference over the dequantized values (TU_TOL)
 *     and against the unquantized values within the format's bound, outputs NaN-poisoned;
 *   - an FP8 KV cache (pages of 3 and 16 keys, and contiguous) appended on the device with
 *     scales, its decode steps against the reference over the host-encoded keys; keys split
 *     over several launches (a loop-limited context: the resumed output's v_scale);
 *   - refusals: FP8 q or out, the unfused path, the backward, a scale with a float operand,
 *     bad scales, a per-tensor scale for a block type.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problems.h"
#include "reference.h"
#include "testutil.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))
#define F32 CLATTN_DTYPE_F32
#define E4M3 CLATTN_DTYPE_FP8_E4M3
#define E5M2 CLATTN_DTYPE_FP8_E5M2

/* --- the formats, from the OCP 8-bit floating point specification ----------------------------- */

typedef struct fp8_format {
    int mbits, bias;
    double max; /* largest finite */
    const char *name;
} fp8_format;

static fp8_format format_of(clattn_dtype dtype)
{
    return dtype == E4M3 ? (fp8_format){3, 7, 448.0, "FP8_E4M3"}
                         : (fp8_format){2, 15, 57344.0, "FP8_E5M2"};
}

static double fp8_decode(clattn_dtype dtype, uint8_t code)
{
    const fp8_format f = format_of(dtype);
    const int exponent = (code & 0x7f) >> f.mbits, mantissa = code & ((1 << f.mbits) - 1);
    const double sign = code & 0x80 ? -1.0 : 1.0;
    if (dtype == E4M3 && (code & 0x7f) == 0x7f)
        return NAN;
    if (dtype == E5M2 && exponent == 31)
        return mantissa ? NAN : sign * INFINITY;
    if (exponent == 0)
        return sign * ldexp(mantissa, 1 - f.bias - f.mbits);
    return sign * ldexp((1 << f.mbits) + mantissa, exponent - f.bias - f.mbits);
}

/* The code of x (a float, as the device sees it): the nearest finite code by searching the
 * table (ties to the even code), saturated past the largest; e5m2 keeps infinities; NaN gives
 * 0x7f with the sign. */
static uint8_t fp8_encode(clattn_dtype dtype, float x)
{
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x))
        return sign | 0x7f;
    const fp8_format f = format_of(dtype);
    if (isinf(x) && dtype == E5M2)
        return sign | 0x7c;
    const double a = fabs((double)x);
    uint8_t best = 0;
    double best_err = INFINITY;
    for (int c = 0; c < 0x80; ++c) {
        const double v = fp8_decode(dtype, (uint8_t)c);
        if (!isfinite(v))
            continue;
        const double err = fabs(v - (a > f.max ? f.max : a));
        if (err < best_err || (err == best_err && (c & 1) == 0)) {
            best = (uint8_t)c;
            best_err = err;
        }
    }
    return sign | best;
}

/* --- contexts per kernel family --------------------------------------------------------------- */

static const struct family {
    const char *rows; /* tuning rows on top (NULL: the device's own choice) */
    const char *file; /* in clattn_plan_info */
    const char *trip_limit; /* CLATTN_LOOP_TRIP_LIMIT while the context is made, or NULL */
} families[] = {
    {NULL, NULL, NULL},
    {"any | * | * | flash_cpu=0 flash_gpu=1\n", "flash_gpu.cl", NULL},
    {"any | * | * | flash_cpu=0 flash_gpu=0\n", "flash.cl", NULL},
    /* a loop-trip limit: the keys split over launches, each later one resuming the output
     * (v_scale taken out and put back) */
    {NULL, NULL, "64"},
};
static clattn_ctx *family_ctxs[4];

static clattn_ctx *family_ctx(int which)
{
    if (which == 0)
        return tu_ctx();
    if (family_ctxs[which] == NULL) {
        clattn_ctx_desc desc;
        clattn_ctx_desc_init(&desc);
        desc.queue = clattn_ctx_queue(tu_ctx());
        desc.tuning_rows = families[which].rows;
        char message[512] = "";
        if (families[which].trip_limit)
            setenv("CLATTN_LOOP_TRIP_LIMIT", families[which].trip_limit, 1);
        tu_expect_status(clattn_ctx_create_desc(&desc, &family_ctxs[which], message,
                                                sizeof message),
                         CLATTN_SUCCESS, "a family's context");
        if (families[which].trip_limit)
            unsetenv("CLATTN_LOOP_TRIP_LIMIT");
    }
    return family_ctxs[which];
}

static void release_family_ctxs(void)
{
    for (int i = 1; i < 4; ++i) {
        clattn_ctx_release(family_ctxs[i]);
        family_ctxs[i] = NULL;
    }
}

/* The plan's kernel is the family's (NULL file: any). */
static void expect_family(const clattn_plan *plan, int which)
{
    const char *info = clattn_plan_info(plan);
    if (families[which].file)
        tu_expect(info && strstr(info, families[which].file) != NULL,
                  "the plan runs %s's kernel: %s", families[which].file, info ? info : "(null)");
}

/* --- all 256 codes ---------------------------------------------------------------------------- */

/* Codes as values: v (1, 1, 1, 256) holds code i at column i, one key, one query row: the
 * output row is decode(v) * v_scale (a weight of exactly 1). Codes as keys, one key per batch,
 * q a unit vector, scale 1: lse = decode(the key's code it picks) * k_scale (infinite keys left
 * out: an infinite score has no log-sum-exp). `wide` picks the layouts: head size 1:
 * elementwise loads; or head size 16 (32 batches of 8 heads, head h's key holding its code at
 * lane h): the CPU kernel's 16-wide in-place loads (LOADn). */
static void run_codes(clattn_ctx *ctx, int which, clattn_dtype dtype, float kv_scale, bool wide)
{
    const size_t dk = wide ? 16 : 1, heads = wide ? 8 : 1, batch = wide ? 32 : 256;
    uint8_t codes[256], keys[256 * 16] = {0};
    float q[256 * 16] = {0}, ones[256 * 16];
    for (int c = 0; c < 256; ++c)
        codes[c] = (uint8_t)c;
    for (size_t i = 0; i < 256 * 16; ++i)
        ones[i] = 1.0f;
    /* wide: key row (b, h) holds code b * heads + h at lane h, zeros elsewhere (a NaN code
     * spoils only its own row); q[b, h] = e_h */
    for (size_t b = 0; b < batch; ++b)
        for (size_t h = 0; h < heads; ++h) {
            if (wide)
                keys[(b * heads + h) * dk + h] = (uint8_t)(b * heads + h);
            q[(b * heads + h) * dk + h] = 1.0f;
        }
    cl_mem code_mem = tu_upload_bytes(codes, 256), key_mem = tu_upload_bytes(keys, sizeof keys);
    cl_mem q_mem = tu_upload_floats(q, 256 * 16), ones_mem = tu_upload_floats(ones, 256 * 16);
    cl_mem out_mem = tu_nan_buffer(256 * 16), lse_mem = tu_nan_buffer(256);
    float got[256];
    for (int keys_case = 0; keys_case < 2; ++keys_case) {
        clattn_tensors t = {0};
        clattn_sdpa_desc desc;
        clattn_sdpa_desc_init(&desc);
        CLATTN_BIND_ROLES(desc, t);
        desc.path = CLATTN_PATH_FUSED;
        if (keys_case) { /* codes as keys */
            desc.scale = 1.0f, desc.k_scale = kv_scale;
            t.q = clattn_tensor_make(q_mem, 0, F32, 4, batch, heads, 1, dk);
            t.k = clattn_tensor_make(wide ? key_mem : code_mem, 0, dtype, 4, batch, heads, 1, dk);
            t.v = clattn_tensor_make(ones_mem, 0, F32, 4, batch, heads, 1, dk);
            t.out = clattn_tensor_make(out_mem, 0, F32, 4, batch, heads, 1, dk);
            t.lse = clattn_tensor_make(lse_mem, 0, F32, 3, batch, heads, 1, 0);
        } else { /* codes as values */
            desc.v_scale = kv_scale;
            t.q = clattn_tensor_make(ones_mem, 0, F32, 4, 1, 1, 1, dk);
            t.k = clattn_tensor_make(ones_mem, 0, F32, 4, 1, 1, 1, dk);
            t.v = clattn_tensor_make(code_mem, 0, dtype, 4, 1, 1, 1, 256);
            t.out = clattn_tensor_make(out_mem, 0, F32, 4, 1, 1, 1, 256);
        }
        clattn_plan *plan = NULL;
        if (!tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS,
                              keys_case ? "k plan" : "v plan") ||
            !tu_expect_status(clattn_plan_execute(plan, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                                  0, NULL, NULL),
                              CLATTN_SUCCESS, "execute")) {
            clattn_plan_release(plan);
            continue;
        }
        expect_family(plan, which);
        if (which == 0 && wide)
            tu_expect(strstr(clattn_plan_info(plan), "flash_cpu") == NULL ||
                          strstr(clattn_plan_info(plan), "read in place") != NULL,
                      "the CPU kernel reads the codes in place: %s", clattn_plan_info(plan));
        tu_read_floats(keys_case ? lse_mem : out_mem, 0, 256, got);
        for (int c = 0; c < 256; ++c) {
            const double want = fp8_decode(dtype, (uint8_t)c) * kv_scale;
            if (keys_case && isinf(want))
                continue;
            /* a NaN score: the kernels drop it as they drop a masked one (float keys too),
             * so its row has lse -inf or NaN; the value path checks NaN codes decode to NaN */
            const bool ok = isnan(want) ? (keys_case ? !isfinite(got[c]) : isnan(got[c]))
                                        : (double)got[c] == want;
            tu_expect(ok, "%s code 0x%02x: got %a, want %a", keys_case ? "key" : "value", c,
                      got[c], want);
        }
        clattn_plan_release(plan);
    }
    clattn_finish(ctx);
    cl_mem mems[6] = {code_mem, key_mem, q_mem, ones_mem, out_mem, lse_mem};
    for (int i = 0; i < 6; ++i)
        tu_release_mem(mems[i]);
}

/* Loop index: format x family x scale (1, 0.25); each in both layouts. */
START_TEST(test_all_codes)
{
    TU_BEGIN_TEST();
    const clattn_dtype dtype = _i % 2 ? E5M2 : E4M3;
    const int which = (_i / 2) % 3;
    const float kv_scale = _i / 6 ? 0.25f : 1.0f;
    tu_set_case("%s family %d scale %g", format_of(dtype).name, which, kv_scale);
    clattn_ctx *ctx = family_ctx(which);
    if (ctx != NULL) {
        run_codes(ctx, which, dtype, kv_scale, false);
        run_codes(ctx, which, dtype, kv_scale, true);
    }
    TU_END_TEST();
}
END_TEST

/* --- the quantizer ---------------------------------------------------------------------------- */

/* clattn_quantize_scaled into FP8 (a strided destination: rows of 7 with a gap of 2) equals the
 * C encoder on x / scale byte for byte: random values over the format's range, exact ties
 * between neighbouring codes, values past the largest finite one, infinities, subnormals and
 * NaN. */
START_TEST(test_quantize)
{
    TU_BEGIN_TEST();
    const clattn_dtype dtype = _i % 2 ? E5M2 : E4M3;
    const float scale = _i / 2 ? 0.5f : 1.0f;
    const fp8_format f = format_of(dtype);
    tu_set_case("%s scale %g", f.name, scale);
    clattn_ctx *ctx = tu_ctx();
    enum { ROWS = 37, COLS = 7, GAP = 2, N = ROWS * COLS };
    float x[N];
    for (int i = 0; i < N; ++i) {
        const double u = tu_rand_unit();
        const double sign = tu_rand_unit() < 0.5 ? -1.0 : 1.0;
        x[i] = (float)(sign * ldexp(1.0 + u, (int)tu_rand_below(40) - 22));
    }
    /* ties: halfway between codes c and c + 1 (both finite), and specials */
    for (int c = 0; c < 60; ++c) {
        const uint8_t lo = (uint8_t)(c * 2 + 1);
        const double a = fp8_decode(dtype, lo), b = fp8_decode(dtype, (uint8_t)(lo + 1));
        if (isfinite(a) && isfinite(b))
            x[c] = (float)((a + b) / 2 * scale);
    }
    const float specials[] = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, (float)(f.max * 1.01),
                              (float)(-f.max * 1.06), (float)(f.max * 1.04), 1e-30f, -3e-9f};
    for (int i = 0; i < COUNT_OF(specials); ++i)
        x[60 + i] = specials[i] * (isnan(specials[i]) || isinf(specials[i]) ? 1.0f : scale);
    uint8_t got[ROWS * (COLS + GAP)];
    memset(got, 0x5a, sizeof got);
    cl_mem src = tu_upload_floats(x, N), dst = tu_upload_bytes(got, sizeof got);
    const clattn_tensor from = clattn_tensor_make(src, 0, F32, 2, ROWS, COLS, 0, 0);
    clattn_tensor to = clattn_tensor_make(dst, 0, dtype, 2, ROWS, COLS, 0, 0);
    to.strides[0] = COLS + GAP;
    if (tu_expect_status(clattn_quantize_scaled(ctx, &from, &to, scale, 0, NULL, NULL),
                         CLATTN_SUCCESS, "clattn_quantize_scaled")) {
        clattn_finish(ctx);
        clEnqueueReadBuffer(clattn_ctx_queue(ctx), dst, CL_TRUE, 0, sizeof got, got, 0, NULL,
                            NULL);
        int wrong = 0;
        for (int r = 0; r < ROWS; ++r)
            for (int c = 0; c < COLS + GAP; ++c) {
                const int i = r * COLS + c;
                const uint8_t want = c < COLS ? fp8_encode(dtype, x[i] / scale) : 0x5a;
                if (got[r * (COLS + GAP) + c] != want && wrong++ < 5)
                    tu_expect(0, "element (%d, %d) = %a: code 0x%02x, want 0x%02x", r, c,
                              c < COLS ? x[i] : 0.0f, got[r * (COLS + GAP) + c], want);
            }
        tu_expect(wrong == 0, "%d codes differ", wrong);
    }
    tu_release_mem(src);
    tu_release_mem(dst);
    TU_END_TEST();
}
END_TEST

/* --- attention over FP8 k and v --------------------------------------------------------------- */

static const struct fp8_case {
    size_t batch, heads, kv_heads, seq_q, seq_k, dk, dv;
    int causal;
    float k_scale, v_scale;
} fp8_cases[] = {
    {1, 1, 1, 1, 1, 16, 16, 0, 0.0f, 0.0f},     {2, 4, 2, 3, 17, 64, 32, 1, 0.05f, 2.0f},
    {1, 3, 3, 63, 65, 24, 40, 0, 3.0f, 0.125f}, {2, 8, 2, 1, 127, 128, 128, 1, 0.02f, 0.03f},
    {1, 2, 1, 17, 1031, 64, 64, 1, 1.0f, 1.0f},
};

/* The largest relative error of one element: half the spacing at 1 (2^-4 e4m3, 2^-3 e5m2). */
static double unit_roundoff(clattn_dtype dtype)
{
    return dtype == E4M3 ? 0x1p-4 : 0x1p-3;
}

/* Attention (fused, the loop's kernel family) over FP8 k and v quantized on the device from
 * floats with the case's scales (k values up to ~3 * k_scale: scores of a few units). */
START_TEST(test_attention)
{
    TU_BEGIN_TEST();
    const int n_cases = COUNT_OF(fp8_cases);
    const struct fp8_case *c = &fp8_cases[_i % n_cases];
    const clattn_dtype dtype = (_i / n_cases) % 2 ? E5M2 : E4M3;
    const int which = _i / (2 * n_cases);
    tu_set_case("%s family %d B=%zu H=%zu Hkv=%zu Lq=%zu Lk=%zu dk=%zu dv=%zu causal=%d "
                "k_scale=%g v_scale=%g",
                format_of(dtype).name, which, c->batch, c->heads, c->kv_heads, c->seq_q,
                c->seq_k, c->dk, c->dv, c->causal, c->k_scale, c->v_scale);
    clattn_ctx *ctx = family_ctx(which);
    if (ctx == NULL)
        goto end;
    const size_t rows = c->batch * c->kv_heads * c->seq_k;
    const size_t q_count = c->batch * c->heads * c->seq_q * c->dk;
    const size_t o_count = c->batch * c->heads * c->seq_q * c->dv;
    const size_t dims[2] = {c->dk, c->dv};
    const float scales[2] = {c->k_scale, c->v_scale};
    float *x[2], *deq[2];
    cl_mem src[2], codes[2];
    clattn_tensor kv[2];
    for (int t = 0; t < 2; ++t) {
        const size_t count = rows * dims[t];
        const float s = scales[t] > 0.0f ? scales[t] : 1.0f;
        x[t] = tu_random_floats(count);
        deq[t] = tu_floats(count);
        for (size_t i = 0; i < count; ++i) {
            x[t][i] *= (t == 0 ? 3.0f : 1.0f) * s;
            deq[t][i] = (float)(fp8_decode(dtype, fp8_encode(dtype, x[t][i] / s)) * s);
        }
        src[t] = tu_upload_floats(x[t], count);
        codes[t] = tu_nan_buffer((count + 3) / 4); /* 0xff bytes: NaN codes until written */
        const clattn_tensor from =
            clattn_tensor_make(src[t], 0, F32, 4, c->batch, c->kv_heads, c->seq_k, dims[t]);
        kv[t] = clattn_tensor_make(codes[t], 0, dtype, 4, c->batch, c->kv_heads, c->seq_k,
                                   dims[t]);
        tu_expect_status(clattn_quantize_scaled(ctx, &from, &kv[t], scales[t], 0, NULL, NULL),
                         CLATTN_SUCCESS, "clattn_quantize_scaled");
    }
    float *q = tu_random_floats(q_count), *out = tu_nan_floats(o_count);
    clattn_tensors t = {0};
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    CLATTN_BIND_ROLES(desc, t);
    t.q = clattn_tensor_make(tu_upload_floats(q, q_count), 0, F32, 4, c->batch, c->heads,
                             c->seq_q, c->dk);
    t.k = kv[0], t.v = kv[1];
    t.out = clattn_tensor_make(tu_nan_buffer(o_count), 0, F32, 4, c->batch, c->heads, c->seq_q,
                               c->dv);
    desc.causal = c->causal ? CLATTN_CAUSAL_BOTTOM_RIGHT : CLATTN_CAUSAL_NONE;
    desc.path = _i % 2 ? CLATTN_PATH_FUSED : CLATTN_PATH_AUTO;
    desc.k_scale = c->k_scale, desc.v_scale = c->v_scale;
    clattn_plan *plan = NULL;
    if (tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS, "plan") &&
        tu_expect_status(clattn_plan_execute(plan, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                             NULL, NULL),
                         CLATTN_SUCCESS, "execute")) {
        expect_family(plan, which);
        tu_expect(clattn_plan_is_fused(plan), "FP8 k/v run fused");
        tu_read_floats(t.out.mem, 0, o_count, out);
        ref_sdpa_shape shape =
            ref_softmax_shape(c->batch, c->heads, c->seq_q, c->seq_k, c->dk, c->dv);
        shape.causal = desc.causal, shape.kv_heads = c->kv_heads;
        double *ref = tu_doubles(o_count), *exact = tu_doubles(o_count);
        ref_sdpa(&shape, q, deq[0], deq[1], NULL, NULL, ref, NULL, NULL);
        ref_sdpa(&shape, q, x[0], x[1], NULL, NULL, exact, NULL, NULL);
        tu_expect_finite("fp8 k/v", out, o_count);
        tu_expect_close("fp8 k/v (the dequantized values' reference)", out, ref, o_count, TU_TOL);
        /* against the unquantized values: within a few units of the format's roundoff (the
         * keys' error moves the weights: scores of a few units, dk terms) */
        const double err = tu_rel_error(out, exact, o_count);
        tu_expect(err < 4.0 * unit_roundoff(dtype), "relative error %.3g against unquantized "
                  "attention, bound %.3g", err, 4.0 * unit_roundoff(dtype));
        printf("check_fp8: %s Lq=%zu Lk=%zu dk=%zu dv=%zu: relative error %.2g against "
               "unquantized attention\n",
               format_of(dtype).name, c->seq_q, c->seq_k, c->dk, c->dv, err);
        free(exact);
        free(ref);
    }
    clattn_plan_release(plan);
    clattn_finish(ctx);
    tu_release_mem(t.q.mem);
    tu_release_mem(t.out.mem);
    for (int i = 0; i < 2; ++i) {
        tu_release_mem(src[i]);
        tu_release_mem(codes[i]);
        free(x[i]);
        free(deq[i]);
    }
    free(q);
    free(out);
end:
    TU_END_TEST();
}
END_TEST

/* --- a paged FP8 KV cache --------------------------------------------------------------------- */

enum { CB = 2, CHQ = 4, CHKV = 2, CDK = 48, CDV = 32, CCAP = 40, PROMPT = 5, STEPS = 3 };

/* A cache under test: its plan and bound tensors, the float keys and values it is fed
 * (CB, CHKV, CCAP, CDK|CDV) and their host-encoded values. */
typedef struct cache_run {
    clattn_ctx *ctx;
    clattn_kv_cache *cache;
    clattn_plan *plan;
    clattn_tensors bound;
    const float *x[2], *encoded[2]; /* keys, values */
} cache_run;

/* Appends positions [at, at + n) of every (batch, k/v head) as F32 (encoded by the append),
 * then one decode step's output against the float64 reference over the encoded keys so far. */
static void cache_step(const cache_run *r, size_t at, size_t n)
{
    const size_t dims[2] = {CDK, CDV};
    cl_mem mems[4] = {NULL};
    clattn_tensor rows[2];
    for (int t = 0; t < 2; ++t) {
        float *packed = tu_floats(CB * CHKV * n * dims[t]);
        for (size_t bh = 0; bh < CB * CHKV; ++bh)
            memcpy(packed + bh * n * dims[t], r->x[t] + (bh * CCAP + at) * dims[t],
                   n * dims[t] * sizeof(float));
        mems[t] = tu_upload_floats(packed, CB * CHKV * n * dims[t]);
        rows[t] = clattn_tensor_make(mems[t], 0, F32, 4, CB, CHKV, n, dims[t]);
        free(packed);
    }
    tu_expect_status(clattn_kv_cache_append(r->cache, &rows[0], &rows[1], 0, NULL, NULL),
                     CLATTN_SUCCESS, "append");
    float *q = tu_random_floats(CB * CHQ * CDK), *out = tu_nan_floats(CB * CHQ * CDV);
    clattn_tensors run = r->bound;
    run.q.mem = mems[2] = tu_upload_floats(q, CB * CHQ * CDK);
    run.out.mem = mems[3] = tu_nan_buffer(CB * CHQ * CDV);
    if (tu_expect_status(clattn_plan_execute(r->plan, run.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                             0, NULL, NULL),
                         CLATTN_SUCCESS, "decode step")) {
        tu_read_floats(run.out.mem, 0, CB * CHQ * CDV, out);
        const int32_t counts[CB] = {(int32_t)(at + n), (int32_t)(at + n)};
        ref_sdpa_shape shape = ref_softmax_shape(CB, CHQ, 1, CCAP, CDK, CDV);
        shape.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        shape.kv_heads = CHKV;
        shape.kv_len = counts;
        double *want = tu_doubles(CB * CHQ * CDV);
        ref_sdpa(&shape, q, r->encoded[0], r->encoded[1], NULL, NULL, want, NULL, NULL);
        tu_expect_close("fp8 paged cache step", out, want, CB * CHQ * CDV, TU_TOL);
        free(want);
    }
    clattn_finish(r->ctx);
    for (int i = 0; i < 4; ++i)
        tu_release_mem(mems[i]);
    free(q);
    free(out);
}

/* An FP8 cache (pages of 3 keys, e4m3; pages of 16, e5m2; contiguous on the second kernel
 * family) with scales: a prompt of 5 keys, then 3 single steps appended as F32 and encoded by
 * the append; each step's grouped decode (GQA 4/2, head sizes 48 / 32) against the float64
 * reference over the host-encoded keys. */
START_TEST(test_paged_cache)
{
    TU_BEGIN_TEST();
    const clattn_dtype dtype = _i % 2 ? E5M2 : E4M3;
    const int which = (_i / 2) % 3;
    const size_t page = which == 1 ? 0 : _i % 2 ? 16 : 3; /* 0: contiguous */
    const double scales[2] = {0.5, 0.0625};
    tu_set_case("%s cache, pages of %zu (0: contiguous), family %d", format_of(dtype).name, page,
                which);
    cache_run r = {.ctx = family_ctx(which)};
    if (r.ctx == NULL)
        goto end;
    clattn_kv_cache_desc cd;
    clattn_kv_cache_desc_init(&cd);
    cd.batch = CB, cd.kv_heads = CHKV, cd.capacity = CCAP;
    cd.head_dim_qk = CDK, cd.head_dim_v = CDV;
    cd.dtype = dtype, cd.page_size = page, cd.k_scale = scales[0], cd.v_scale = scales[1];
    float *x[2], *encoded[2];
    for (int t = 0; t < 2; ++t) {
        const size_t count = CB * CHKV * CCAP * (t ? CDV : CDK);
        x[t] = tu_random_floats(count);
        encoded[t] = tu_floats(count);
        for (size_t i = 0; i < count; ++i)
            encoded[t][i] = (float)(fp8_decode(dtype, fp8_encode(dtype,
                                                                 (float)(x[t][i] / scales[t]))) *
                                    scales[t]);
        r.x[t] = x[t], r.encoded[t] = encoded[t];
    }
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    CLATTN_BIND_ROLES(desc, r.bound);
    desc.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    desc.k_scale = scales[0], desc.v_scale = scales[1];
    if (tu_expect_status(clattn_kv_cache_create(r.ctx, &cd, &r.cache), CLATTN_SUCCESS, "cache")) {
        r.bound.q = clattn_tensor_make(NULL, 0, F32, 4, CB, CHQ, 1, CDK);
        r.bound.out = clattn_tensor_make(NULL, 0, F32, 4, CB, CHQ, 1, CDV);
        clattn_kv_cache_tensors(r.cache, &r.bound.k, &r.bound.v, &r.bound.kv_seqlen);
        clattn_kv_cache_block_table(r.cache, &r.bound.block_table);
        if (tu_expect_status(clattn_sdpa_plan_create(r.ctx, &desc, &r.plan), CLATTN_SUCCESS,
                             "plan")) {
            expect_family(r.plan, which);
            cache_step(&r, 0, PROMPT);
            for (size_t at = PROMPT; at < PROMPT + STEPS && !tu_failed(); ++at)
                cache_step(&r, at, 1);
        }
    }
    clattn_plan_release(r.plan);
    clattn_kv_cache_release(r.cache);
    for (int t = 0; t < 2; ++t) {
        free(x[t]);
        free(encoded[t]);
    }
end:
    TU_END_TEST();
}
END_TEST

/* --- refusals --------------------------------------------------------------------------------- */

/* A plan over (1, 2, 5, 16) q, k, v, out with the given dtypes, path and scales (backward: the
 * backward's plan, with dO, lse and the gradients): its status, and the message holding
 * `needle`. */
static void expect_sdpa(clattn_dtype q_dtype, clattn_dtype kv_dtype, clattn_dtype out_dtype,
                        clattn_path path, double k_scale, double v_scale, bool backward,
                        clattn_status want, const char *needle)
{
    clattn_tensors t = {0};
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    CLATTN_BIND_ROLES(desc, t);
    const clattn_dtype dtypes[4] = {q_dtype, kv_dtype, kv_dtype, out_dtype};
    clattn_tensor *roles[7] = {&t.q, &t.k, &t.v, &t.out, &t.grad_out, &t.grad_q, &t.grad_k};
    for (int r = 0; r < (backward ? 7 : 4); ++r)
        *roles[r] = clattn_tensor_make(NULL, 0, r < 4 ? dtypes[r] : F32, 4, 1, 2, 5, 16);
    if (backward) {
        t.grad_v = t.grad_k;
        t.lse = clattn_tensor_make(NULL, 0, F32, 3, 1, 2, 5, 0);
    }
    desc.path = path;
    desc.k_scale = k_scale, desc.v_scale = v_scale;
    if (backward)
        TU_EXPECT_REFUSED(clattn_sdpa_backward_plan_create, "sdpa", &desc, want, needle, needle);
    else
        TU_EXPECT_REFUSED(clattn_sdpa_plan_create, "sdpa", &desc, want, needle, needle);
}

START_TEST(test_refusals)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    const clattn_status invalid = CLATTN_ERR_INVALID_ARGUMENT;
    const clattn_path fused = CLATTN_PATH_FUSED;
    /* FP8 q and out: storage for K and V only */
    expect_sdpa(E4M3, E4M3, F32, fused, 0, 0, false, invalid, "q");
    expect_sdpa(F32, E5M2, E5M2, fused, 0, 0, false, invalid, "out");
    /* the unfused path's matmuls read floats */
    expect_sdpa(F32, E4M3, F32, CLATTN_PATH_UNFUSED, 0, 0, false, CLATTN_ERR_UNSUPPORTED, "fused");
    /* scales: only FP8 operands, finite and > 0 */
    expect_sdpa(F32, F32, F32, fused, 2.0, 0, false, invalid, "k_scale");
    expect_sdpa(F32, E4M3, F32, fused, 0, -1.0, false, invalid, "v_scale");
    expect_sdpa(F32, E4M3, F32, fused, NAN, 0, false, invalid, "k_scale");
    expect_sdpa(F32, E5M2, F32, fused, 0, 1e300, false, invalid, "v_scale");
    /* the backward: k and v as floats only */
    expect_sdpa(F32, E4M3, F32, fused, 0, 0, true, invalid, "FP8_E4M3");
    /* caches: a scale without an FP8 dtype, a bad scale */
    clattn_kv_cache_desc cd;
    clattn_kv_cache_desc_init(&cd);
    cd.batch = 1, cd.kv_heads = 1, cd.capacity = 8, cd.head_dim_qk = cd.head_dim_v = 32;
    clattn_kv_cache *cache = (clattn_kv_cache *)&cd;
    cd.dtype = CLATTN_DTYPE_F16, cd.k_scale = 2.0;
    tu_expect_status(clattn_kv_cache_create(ctx, &cd, &cache), CLATTN_ERR_INVALID_ARGUMENT,
                     "F16 cache with k_scale");
    tu_expect(cache == NULL && strstr(clattn_last_error(ctx), "k_scale"), "message: %s",
              clattn_last_error(ctx));
    cd.dtype = E4M3, cd.k_scale = 0.0, cd.v_scale = INFINITY;
    tu_expect_status(clattn_kv_cache_create(ctx, &cd, &cache), CLATTN_ERR_INVALID_ARGUMENT,
                     "FP8 cache with v_scale inf");
    /* a per-tensor scale into a block type */
    cl_mem buf = tu_nan_buffer(64);
    const clattn_tensor from = clattn_tensor_make(buf, 0, F32, 2, 2, 32, 0, 0);
    const clattn_tensor to = clattn_tensor_make(buf, 0, CLATTN_DTYPE_Q8_0, 2, 2, 32, 0, 0);
    tu_expect_status(clattn_quantize_scaled(ctx, &from, &to, 2.0f, 0, NULL, NULL),
                     CLATTN_ERR_INVALID_ARGUMENT, "quantize_scaled into Q8_0 with scale 2");
    tu_expect(strstr(clattn_last_error(ctx), "scale") != NULL, "message: %s",
              clattn_last_error(ctx));
    tu_release_mem(buf);
    TU_END_TEST();
}
END_TEST

int main(void)
{
    tu_suite_begin("check_fp8");
    Suite *suite = suite_create("fp8");
    const int small = tu_small(), full = tu_full();
    if (small)
        tu_not_run("test_attention's Lq 17 x Lk 1031 case, and on the other kernel families "
                   "(flash_gpu.cl, flash.cl, a loop limit) one case each per format");
    TCase *codes = tu_tcase(suite, "codes", 900);
    tcase_add_loop_test(codes, test_all_codes, 0, 12);
    tcase_add_loop_test(codes, test_quantize, 0, 4);
    TCase *attention = tu_tcase(suite, "attention", 900);
    /* default: every case on the device's own family, the small ones on the others; full:
     * all of them everywhere */
    const int n_cases = COUNT_OF(fp8_cases);
    if (full) {
        tcase_add_loop_test(attention, test_attention, 0, 8 * n_cases);
    } else {
        /* small (Oclgrind): not the longest case (17 x 1031 keys) */
        for (int i = 0; i < 2 * n_cases; ++i)
            if (!small || i % n_cases != n_cases - 1)
                tcase_add_loop_test(attention, test_attention, i, i + 1);
        for (int family = 1; family < 4; ++family)
            for (int i = 0; i < (small ? 2 : 4); ++i) {
                /* the loop limit: cases 1 and 2 (keys in several launches) */
                const int c = family == 3 ? 1 + i / 2 : i / 2;
                const int at = family * 2 * n_cases + (i % 2) * n_cases + c;
                tcase_add_loop_test(attention, test_attention, at, at + 1);
            }
    }
    tcase_add_loop_test(attention, test_paged_cache, 0, 6);
    tcase_add_test(attention, test_refusals);
    const int status = tu_run_suite(suite);
    release_family_ctxs();
    return status;
}
