/*
 * gpu_model_driver: launches the GPU kernels whose work tests/gpu_model/model.py predicts, on
 * shapes given on the command line, each plan executed once, so that Oclgrind's instruction
 * counter (oclgrind --inst-counts) prints one block per kernel launch. run.sh runs it under
 * Oclgrind with CLATTN_PARAMS=gpu and --local-mem-size 49152 and compares the counts with the
 * formulas. Inputs are uniform in [-1, 1) from a fixed seed; the counts do not depend on the
 * values (no input here masks a whole key tile of a row by its value).
 *
 *   gpu_model_driver matmul M N K
 *       clattn_matmul, C (M x N) = A (M x K) B (K x N), float32, alpha 1, beta 0: one launch
 *       of `matmul` (kernels/matmul.cl, the tiled GPU kernel).
 *   gpu_model_driver sdpa fused|unfused B H KV_HEADS LQ LK D [causal] [kvlen=N] [f16|bf16]
 *       an SDPA plan, float32 unless said, d_k = d_v = D, packed (B, H, L, D) tensors, default
 * scale. fused: one launch of `flash_attention` (kernels/flash_gpu.cl); with LQ = 1 and KV_HEADS <
 * H the plan groups the query heads of a k/v head as rows (the grouped decode). unfused: `matmul`
 * (scores = q k^T), `softmax_rows`, `matmul` (weights v). causal: top-left causal masking. kvlen=N:
 * per-batch key counts (I32 kv_seqlen, all N), as a KV cache of capacity LK filled to N. f16, bf16:
 * q, k, v and out stored in that type (float32 arithmetic in the kernels). Prints the device's
 * compute units and local memory, the tuning parameters (clattn_ctx_tuning), the plan's kind and a
 * checksum of the output; exits 1 on any error, 2 on bad usage.
 *   gpu_model_driver sdpa fused B H KV_HEADS L L D flexdoc=N [blocks=BQ,BK]
 *       the fused SDPA with a user mask_mod (clattn_flex_desc): document masking, key j kept
 *       for query i when doc[i] == doc[j], doc an I32 aux tensor of L document ids, N
 *       documents of equal length (doc[i] = i * N / L; LQ must equal LK). blocks=BQ,BK: with a
 *       block mask of BQ x BK blocks (U8 (B, H, ceil(L / BQ), ceil(L / BK))) made on the
 *       device from the same mask_mod by clattn_flex_block_mask (a launch of
 *       `flex_block_mask`, kernels/flex.cl) before the plan's `flash_attention`.
 *   gpu_model_driver backward B H KV_HEADS LQ LK D [causal] [kvlen=N] [dv=N] [f16|bf16]
 *       the attention backward (clattn_sdpa_backward_plan_create) of the same shape: dQ, dK, dV
 *       from random q, k, v, out, dO and an F32 lse uniform in [-1, 1) (the counts do not depend
 *       on the values: no weight underflows to 0 with these inputs), no mask gradient or
 *       sinks: launches `bwd_delta`, `bwd_dkdv`, `bwd_dq` (kernels/flash_bwd.cl; the generic
 *       kernels where the host does not pick the CPU variants, i.e. under Oclgrind at head
 *       sizes that are not multiples of 16). dv=N: d_v = N (d_k = D; sdpa takes it too).
 *       Prints the checksum of dQ, dK and dV and the plan's clattn_plan_info.
 *   gpu_model_driver sdpa fused B H KV_HEADS LQ LK D f16|bf16 dpas=8|16
 *       flash_gpu.cl's matrix-engine variant (FG_DPAS) as CI can run it: a context with the
 *       tuning row `fg_dpas=2 fg_dpas_sg=SG` (the extension's function emulated in plain
 *       OpenCL C, sub-groups of SG items); the plan's info names the emulated engine.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn.h"

static int usage(void)
{
    fprintf(stderr, "usage: gpu_model_driver matmul M N K\n"
                    "       gpu_model_driver sdpa fused|unfused B H KV_HEADS LQ LK D [causal] "
                    "[kvlen=N] [dv=N] [f16|bf16]\n"
                    "       gpu_model_driver sdpa fused B H KV_HEADS L L D flexdoc=N "
                    "[blocks=BQ,BK]\n"
                    "       gpu_model_driver sdpa fused B H KV_HEADS LQ LK D kvlen=N paged=PS "
                    "[causal] [dv=N] [fp8=e4m3|e5m2]\n"
                    "       gpu_model_driver backward B H KV_HEADS LQ LK D [causal] [kvlen=N] "
                    "[dv=N] [f16|bf16]\n"
                    "       gpu_model_driver sdpa fused B H KV_HEADS LQ LK D f16|bf16 "
                    "dpas=8|16\n"
                    "       gpu_model_driver step B H KV_HEADS N D [paged=PS] [f16]\n"
                    "       gpu_model_driver mixed H KV_HEADS D PS R1:N1 [R2:N2 ...]\n");
    return 2;
}

static int parse_size(const char *text, size_t *value)
{
    char *end = NULL;
    const unsigned long long v = strtoull(text, &end, 10);
    if (end == text || *end != '\0' || v == 0 || v > 1u << 20)
        return 0;
    *value = (size_t)v;
    return 1;
}

/* float <-> the 16-bit storage types, for values in [-1, 1) (F16: below 2^-14 flushed to 0,
 * the mantissa truncated; enough for inputs whose values do not matter to the counts). */
static uint16_t to_16(float value, clattn_dtype dtype)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if (dtype == CLATTN_DTYPE_BF16)
        return (uint16_t)(bits >> 16);
    const int exponent = (int)((bits >> 23) & 0xff) - 127 + 15;
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
    return exponent <= 0 ? sign : (uint16_t)(sign | exponent << 10 | ((bits >> 13) & 0x3ff));
}

static float from_16(uint16_t half, clattn_dtype dtype)
{
    uint32_t bits = (uint32_t)half << 16;
    if (dtype == CLATTN_DTYPE_F16) {
        const uint32_t exponent = (half >> 10) & 0x1f;
        bits = (uint32_t)(half & 0x8000) << 16;
        if (exponent != 0)
            bits |= (exponent - 15 + 127) << 23 | (uint32_t)(half & 0x3ff) << 13;
    }
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* A device buffer of n elements of dtype (F32, F16 or BF16), uniform in [-1, 1) (a 32-bit
 * LCG, fixed seed), or zeros; FP8 (E4M3, E5M2): random codes of magnitude below 2 (the
 * magnitude bits below 0x40: no NaN or infinity). */
static cl_mem make_buffer(clattn_ctx *ctx, clattn_dtype dtype, size_t n, uint32_t *seed, int random)
{
    const size_t size = clattn_dtype_size(dtype);
    unsigned char *host = malloc(n * size);
    if (host == NULL)
        return NULL;
    for (size_t i = 0; i < n; ++i) {
        *seed = *seed * 1664525u + 1013904223u;
        const float value = random ? (float)(*seed >> 8) / (float)(1u << 23) - 1.0f : 0.0f;
        if (size == 1) {
            host[i] = random ? (unsigned char)((*seed >> 24) & 0xbf) : 0;
        } else if (dtype == CLATTN_DTYPE_F32) {
            memcpy(host + i * size, &value, size);
        } else {
            const uint16_t half = to_16(value, dtype);
            memcpy(host + i * size, &half, size);
        }
    }
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(clattn_ctx_cl_context(ctx),
                                CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * size, host, &err);
    free(host);
    return err == CL_SUCCESS ? mem : NULL;
}

/* The sum of |x| over the n elements of mem, or NAN when it cannot be read or holds a NaN. */
static double checksum(clattn_ctx *ctx, clattn_dtype dtype, cl_mem mem, size_t n)
{
    const size_t size = clattn_dtype_size(dtype);
    unsigned char *host = malloc(n * size);
    double sum = NAN;
    if (host != NULL && clEnqueueReadBuffer(clattn_ctx_queue(ctx), mem, CL_TRUE, 0, n * size, host,
                                            0, NULL, NULL) == CL_SUCCESS) {
        sum = 0.0;
        for (size_t i = 0; i < n; ++i) {
            float value;
            if (dtype == CLATTN_DTYPE_F32) {
                memcpy(&value, host + i * size, size);
            } else {
                uint16_t half;
                memcpy(&half, host + i * size, size);
                value = from_16(half, dtype);
            }
            sum += fabs((double)value);
        }
    }
    free(host);
    return sum;
}

static int run_matmul(clattn_ctx *ctx, size_t m, size_t n, size_t k)
{
    uint32_t seed = 1;
    cl_mem a = make_buffer(ctx, CLATTN_DTYPE_F32, m * k, &seed, 1),
           b = make_buffer(ctx, CLATTN_DTYPE_F32, k * n, &seed, 1);
    cl_mem c = make_buffer(ctx, CLATTN_DTYPE_F32, m * n, &seed, 0);
    int rc = 1;
    if (a == NULL || b == NULL || c == NULL) {
        fprintf(stderr, "gpu_model_driver: buffers: out of memory\n");
        goto done;
    }
    const clattn_tensor ta = clattn_tensor_make(a, 0, CLATTN_DTYPE_F32, 2, m, k, 0, 0);
    const clattn_tensor tb = clattn_tensor_make(b, 0, CLATTN_DTYPE_F32, 2, k, n, 0, 0);
    const clattn_tensor tc = clattn_tensor_make(c, 0, CLATTN_DTYPE_F32, 2, m, n, 0, 0);
    const clattn_matmul_desc desc = {sizeof desc, 0, 0, 1.0f, 0.0f};
    clattn_status status = clattn_matmul(ctx, &desc, &ta, &tb, NULL, &tc, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS)
        status = clattn_finish(ctx);
    if (status != CLATTN_SUCCESS) {
        fprintf(stderr, "gpu_model_driver: matmul: %s\n", clattn_last_error(ctx));
        goto done;
    }
    printf("matmul M=%zu N=%zu K=%zu: checksum %.6g\n", m, n, k,
           checksum(ctx, CLATTN_DTYPE_F32, c, m * n));
    rc = 0;
done:
    if (a)
        clReleaseMemObject(a);
    if (b)
        clReleaseMemObject(b);
    if (c)
        clReleaseMemObject(c);
    return rc;
}

typedef struct sdpa_shape {
    int fused, causal, backward;
    clattn_dtype dtype;                                       /* of q, k, v and out */
    size_t batch, heads, kv_heads, seq_q, seq_k, dim, kv_len; /* kv_len 0: no kv_seqlen */
    size_t dim_v;                                             /* d_v (dv=N; 0: D) */
    size_t flex_docs;        /* flexdoc=N: a document mask_mod of N documents (0: none) */
    size_t flex_bq, flex_bk; /* blocks=BQ,BK: a block mask of those blocks (0: none) */
    size_t page_size;        /* paged=PS: k and v in pools of pages of PS keys (0: none) */
    clattn_dtype kv_dtype;   /* fp8=e4m3|e5m2: k and v in that FP8 type (0: q's dtype) */
    size_t dpas_sg;          /* dpas=8|16: flash_gpu.cl's emulated matrix engine (0: none) */
} sdpa_shape;

/* A block table of batch x blocks I32 entries on the device: the pool's batch * blocks pages
 * in a shuffled order (a fixed seed), or NULL. */
static cl_mem shuffled_table(clattn_ctx *ctx, size_t batch, size_t blocks, uint32_t *seed)
{
    const size_t count = batch * blocks;
    cl_int *table = malloc(count * sizeof *table);
    if (table == NULL)
        return NULL;
    for (size_t i = 0; i < count; ++i)
        table[i] = (cl_int)i;
    for (size_t i = count; i > 1; --i) {
        *seed = *seed * 1664525u + 1013904223u;
        const size_t j = (*seed >> 8) % i;
        const cl_int swap = table[i - 1];
        table[i - 1] = table[j];
        table[j] = swap;
    }
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                count * sizeof *table, table, &err);
    free(table);
    return err == CL_SUCCESS ? mem : NULL;
}

/* The user mask_mod of flexdoc=N: the same document (doc: the I32 aux tensor of ids). */
static const char flex_doc_source[] = "int mask_mod(int b, int h, int q_idx, int kv_idx)\n"
                                      "{\n"
                                      "    return doc[q_idx] == doc[kv_idx];\n"
                                      "}\n";

static void flex_doc_desc(clattn_flex_desc *flex, const sdpa_shape *s)
{
    memset(flex, 0, sizeof *flex);
    flex->source = flex_doc_source;
    flex->functions = CLATTN_FLEX_MASK_MOD;
    flex->aux_names[0] = "doc";
    flex->block_q = s->flex_bq;
    flex->block_k = s->flex_bk;
}

static int run_sdpa(clattn_ctx *ctx, const sdpa_shape *s)
{
    uint32_t seed = 2;
    const size_t q_n = s->batch * s->heads * s->seq_q * s->dim;
    const size_t kv_n = s->batch * s->kv_heads * s->seq_k * s->dim;
    const size_t dim_v = s->dim_v ? s->dim_v : s->dim;
    const size_t v_n = s->batch * s->kv_heads * s->seq_k * dim_v;
    const size_t o_n = s->batch * s->heads * s->seq_q * dim_v;
    const clattn_dtype dt = s->dtype, kvt = s->kv_dtype ? s->kv_dtype : dt;
    cl_mem q = make_buffer(ctx, dt, q_n, &seed, 1), k = make_buffer(ctx, kvt, kv_n, &seed, 1);
    cl_mem v = make_buffer(ctx, kvt, v_n, &seed, 1),
           out = make_buffer(ctx, dt, o_n, &seed, s->backward);
    cl_mem lens = NULL, doc = NULL, block_mask = NULL; /* flexdoc=N, blocks=BQ,BK */
    cl_mem table = NULL;                               /* paged=PS */
    /* the backward's: lse (F32), dO (random), dQ, dK, dV (zeros) */
    cl_mem lse = NULL, go = NULL, dq = NULL, dk = NULL, dv = NULL;
    clattn_plan *plan = NULL;
    int rc = 1;
    if (s->backward) {
        lse = make_buffer(ctx, CLATTN_DTYPE_F32, s->batch * s->heads * s->seq_q, &seed, 1);
        go = make_buffer(ctx, dt, o_n, &seed, 1);
        dq = make_buffer(ctx, dt, q_n, &seed, 0);
        dk = make_buffer(ctx, dt, kv_n, &seed, 0);
        dv = make_buffer(ctx, dt, v_n, &seed, 0);
    }
    if (q == NULL || k == NULL || v == NULL || out == NULL ||
        (s->backward && (lse == NULL || go == NULL || dq == NULL || dk == NULL || dv == NULL))) {
        fprintf(stderr, "gpu_model_driver: buffers: out of memory\n");
        goto done;
    }
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    clattn_tensors *t = &desc_tensors;
    t->q = clattn_tensor_make(q, 0, dt, 4, s->batch, s->heads, s->seq_q, s->dim);
    t->k = clattn_tensor_make(k, 0, kvt, 4, s->batch, s->kv_heads, s->seq_k, s->dim);
    t->v = clattn_tensor_make(v, 0, kvt, 4, s->batch, s->kv_heads, s->seq_k, dim_v);
    if (s->page_size) { /* pools (pages, page_size, kv_heads, d) of the same elements */
        const size_t blocks = s->seq_k / s->page_size, pages = s->batch * blocks;
        table = shuffled_table(ctx, s->batch, blocks, &seed);
        if (table == NULL)
            goto done;
        t->k = clattn_tensor_make(k, 0, kvt, 4, pages, s->page_size, s->kv_heads, s->dim);
        t->v = clattn_tensor_make(v, 0, kvt, 4, pages, s->page_size, s->kv_heads, dim_v);
        t->block_table = clattn_tensor_make(table, 0, CLATTN_DTYPE_I32, 2, s->batch, blocks, 0, 0);
    }
    if (s->kv_dtype) { /* FP8: per-tensor scales */
        desc.k_scale = 0.5;
        desc.v_scale = 0.25;
    }
    t->out = clattn_tensor_make(out, 0, dt, 4, s->batch, s->heads, s->seq_q, dim_v);
    if (s->kv_len) {
        cl_int host[64];
        cl_int err = CL_SUCCESS;
        if (s->batch > 64 || s->kv_len > s->seq_k) {
            fprintf(stderr, "gpu_model_driver: kvlen=%zu: at most LK, batch at most 64\n",
                    s->kv_len);
            goto done;
        }
        for (size_t b = 0; b < s->batch; ++b)
            host[b] = (cl_int)s->kv_len;
        lens = clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                              s->batch * sizeof host[0], host, &err);
        if (err != CL_SUCCESS)
            goto done;
        t->kv_seqlen = clattn_tensor_make(lens, 0, CLATTN_DTYPE_I32, 1, s->batch, 0, 0, 0);
    }
    if (s->flex_docs) {
        /* the document ids, then the block mask from the same mask_mod (on the device) */
        cl_int *ids = malloc(s->seq_q * sizeof *ids);
        cl_int err = CL_SUCCESS;
        if (ids == NULL)
            goto done;
        for (size_t i = 0; i < s->seq_q; ++i)
            ids[i] = (cl_int)(i * s->flex_docs / s->seq_q);
        doc = clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                             s->seq_q * sizeof *ids, ids, &err);
        free(ids);
        if (err != CL_SUCCESS)
            goto done;
        t->flex_aux0 = clattn_tensor_make(doc, 0, CLATTN_DTYPE_I32, 1, s->seq_q, 0, 0, 0);
        flex_doc_desc(&desc.flex, s);
        if (s->flex_bq) {
            const size_t qb = (s->seq_q + s->flex_bq - 1) / s->flex_bq,
                         kb = (s->seq_k + s->flex_bk - 1) / s->flex_bk;
            block_mask = clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_WRITE,
                                        s->batch * s->heads * qb * kb, NULL, &err);
            if (err != CL_SUCCESS)
                goto done;
            clattn_block_mask_desc bdesc;
            clattn_block_mask_desc_init(&bdesc);
            flex_doc_desc(&bdesc.flex, s);
            bdesc.aux = &t->flex_aux0; /* (flex_aux0 .. 3: the four aux roles in a row) */
            bdesc.batch = s->batch;
            bdesc.heads = s->heads;
            bdesc.seq_q = s->seq_q;
            bdesc.seq_k = s->seq_k;
            bdesc.out =
                clattn_tensor_make(block_mask, 0, CLATTN_DTYPE_U8, 4, s->batch, s->heads, qb, kb);
            if (clattn_flex_block_mask(ctx, &bdesc, 0, NULL, NULL) != CLATTN_SUCCESS ||
                clattn_finish(ctx) != CLATTN_SUCCESS) {
                fprintf(stderr, "gpu_model_driver: block mask: %s\n", clattn_last_error(ctx));
                goto done;
            }
            t->block_mask = bdesc.out;
        }
    }
    if (s->backward) {
        t->lse = clattn_tensor_make(lse, 0, CLATTN_DTYPE_F32, 3, s->batch, s->heads, s->seq_q, 0);
        t->grad_out = clattn_tensor_make(go, 0, dt, 4, s->batch, s->heads, s->seq_q, dim_v);
        t->grad_q = clattn_tensor_make(dq, 0, dt, 4, s->batch, s->heads, s->seq_q, s->dim);
        t->grad_k = clattn_tensor_make(dk, 0, dt, 4, s->batch, s->kv_heads, s->seq_k, s->dim);
        t->grad_v = clattn_tensor_make(dv, 0, dt, 4, s->batch, s->kv_heads, s->seq_k, dim_v);
    }
    desc.causal = s->causal ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
    desc.path = s->fused ? CLATTN_PATH_FUSED : CLATTN_PATH_UNFUSED;
    clattn_status status = s->backward ? clattn_sdpa_backward_plan_create(ctx, &desc, &plan)
                                       : clattn_sdpa_plan_create(ctx, &desc, &plan);
    if (status == CLATTN_SUCCESS)
        status =
            clattn_plan_execute(plan, t->by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS)
        status = clattn_finish(ctx);
    if (status != CLATTN_SUCCESS) {
        fprintf(stderr, "gpu_model_driver: sdpa: %s\n", clattn_last_error(ctx));
        goto done;
    }
    if (s->backward) {
        const double sum =
            checksum(ctx, dt, dq, q_n) + checksum(ctx, dt, dk, kv_n) + checksum(ctx, dt, dv, v_n);
        printf("backward B=%zu H=%zu Hkv=%zu Lq=%zu Lk=%zu dk=%zu dv=%zu causal=%d kvlen=%zu: "
               "checksum %.6g (%s)\n",
               s->batch, s->heads, s->kv_heads, s->seq_q, s->seq_k, s->dim, dim_v, s->causal,
               s->kv_len, sum, clattn_plan_info(plan));
        rc = isfinite(sum) ? 0 : 1;
        goto done;
    }
    const double sum = checksum(ctx, dt, out, o_n);
    printf("sdpa %s B=%zu H=%zu Hkv=%zu Lq=%zu Lk=%zu d=%zu dv=%zu causal=%d kvlen=%zu "
           "flexdoc=%zu blocks=%zux%zu paged=%zu kv_dtype=%d: checksum %.6g (%s)\n",
           clattn_plan_is_fused(plan) ? "fused" : "unfused", s->batch, s->heads, s->kv_heads,
           s->seq_q, s->seq_k, s->dim, dim_v, s->causal, s->kv_len, s->flex_docs, s->flex_bq,
           s->flex_bk, s->page_size, (int)kvt, sum, clattn_plan_info(plan));
    rc = isfinite(sum) ? 0 : 1;
done:
    clattn_plan_release(plan);
    cl_mem mems[] = {q, k, v, out, lens, doc, block_mask, table, lse, go, dq, dk, dv};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; ++i)
        if (mems[i])
            clReleaseMemObject(mems[i]);
    return rc;
}

/* A fused SDPA plan's description bound to t (zeroed), bottom-right causal: step's and mixed's. */
static void serving_desc(clattn_sdpa_desc *desc, clattn_tensors *t)
{
    clattn_sdpa_desc_init(desc);
    memset(t, 0, sizeof *t);
    CLATTN_BIND_ROLES(*desc, *t);
    desc->path = CLATTN_PATH_FUSED;
    desc->causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
}

/* step B H KV_HEADS N D [paged=PS] [f16]: a KV cache (capacity N + 1, contiguous or in pages of
 * PS keys mapped in a shuffled order) filled with N random keys and values by
 * clattn_kv_cache_append (a launch of `kv_append`, which the model does not count), then one
 * decode step in one launch (clattn_kv_cache_decode with a kv_step plan: `flash_attention`
 * with KV_STEP), q, k_new, v_new random, bottom-right causal. */
static int run_step(clattn_ctx *ctx, const sdpa_shape *s)
{
    uint32_t seed = 3;
    const size_t n = s->seq_k, d = s->dim, ps = s->page_size;
    const size_t capacity = ps ? (n + 1 + ps - 1) / ps * ps : n + 1;
    const clattn_dtype dt = s->dtype;
    const size_t prompt_n = s->batch * s->kv_heads * n * d, new_n = s->batch * s->kv_heads * d;
    const size_t q_n = s->batch * s->heads * d;
    cl_mem pk = make_buffer(ctx, dt, prompt_n, &seed, 1),
           pv = make_buffer(ctx, dt, prompt_n, &seed, 1);
    cl_mem kn = make_buffer(ctx, dt, new_n, &seed, 1), vn = make_buffer(ctx, dt, new_n, &seed, 1);
    cl_mem q = make_buffer(ctx, dt, q_n, &seed, 1), out = make_buffer(ctx, dt, q_n, &seed, 0);
    clattn_kv_cache *cache = NULL;
    clattn_plan *plan = NULL;
    int32_t *map = NULL;
    int rc = 1;
    clattn_kv_cache_desc cd;
    clattn_kv_cache_desc_init(&cd);
    cd.batch = s->batch, cd.kv_heads = s->kv_heads, cd.capacity = capacity;
    cd.head_dim_qk = d, cd.head_dim_v = d, cd.dtype = dt, cd.page_size = ps;
    const char *what = "buffers";
    if (pk == NULL || pv == NULL || kn == NULL || vn == NULL || q == NULL || out == NULL)
        goto done;
    what = "cache";
    if (clattn_kv_cache_create(ctx, &cd, &cache) != CLATTN_SUCCESS)
        goto done;
    if (ps) { /* the pool's pages in a shuffled order (the caller's pages) */
        const size_t blocks = capacity / ps, count = s->batch * blocks;
        map = malloc(count * sizeof *map);
        if (map == NULL)
            goto done;
        for (size_t i = 0; i < count; ++i)
            map[i] = (int32_t)i;
        for (size_t i = count; i > 1; --i) {
            seed = seed * 1664525u + 1013904223u;
            const size_t j = (seed >> 8) % i;
            const int32_t swap = map[i - 1];
            map[i - 1] = map[j];
            map[j] = swap;
        }
        what = "map_pages";
        if (clattn_kv_cache_map_pages(cache, map, 0, NULL, NULL) != CLATTN_SUCCESS)
            goto done;
    }
    const clattn_tensor tk = clattn_tensor_make(pk, 0, dt, 4, s->batch, s->kv_heads, n, d);
    const clattn_tensor tv = clattn_tensor_make(pv, 0, dt, 4, s->batch, s->kv_heads, n, d);
    what = "append";
    if (clattn_kv_cache_append(cache, &tk, &tv, 0, NULL, NULL) != CLATTN_SUCCESS ||
        clattn_finish(ctx) != CLATTN_SUCCESS)
        goto done;
    clattn_sdpa_desc desc;
    clattn_tensors t;
    serving_desc(&desc, &t);
    desc.kv_step = 1;
    t.q = clattn_tensor_make(q, 0, dt, 4, s->batch, s->heads, 1, d);
    t.out = clattn_tensor_make(out, 0, dt, 4, s->batch, s->heads, 1, d);
    clattn_kv_cache_tensors(cache, &t.k, &t.v, &t.kv_seqlen);
    clattn_kv_cache_block_table(cache, &t.block_table);
    what = "plan";
    if (clattn_sdpa_plan_create(ctx, &desc, &plan) != CLATTN_SUCCESS)
        goto done;
    const clattn_tensor k_new = clattn_tensor_make(kn, 0, dt, 4, s->batch, s->kv_heads, 1, d);
    const clattn_tensor v_new = clattn_tensor_make(vn, 0, dt, 4, s->batch, s->kv_heads, 1, d);
    what = "decode";
    if (clattn_kv_cache_decode(cache, plan, &k_new, &v_new, t.by_role, CLATTN_ROLE_COUNT, NULL, 0,
                               NULL, NULL) != CLATTN_SUCCESS ||
        clattn_finish(ctx) != CLATTN_SUCCESS)
        goto done;
    const double sum = checksum(ctx, dt, out, q_n);
    printf("step B=%zu H=%zu Hkv=%zu N=%zu d=%zu paged=%zu: length %zu, checksum %.6g (%s)\n",
           s->batch, s->heads, s->kv_heads, n, d, ps, clattn_kv_cache_length(cache), sum,
           clattn_plan_info(plan));
    rc = isfinite(sum) && clattn_kv_cache_length(cache) == n + 1 ? 0 : 1;
    what = NULL;
done:
    if (what)
        fprintf(stderr, "gpu_model_driver: step: %s: %s\n", what, clattn_last_error(ctx));
    free(map);
    clattn_plan_release(plan);
    clattn_kv_cache_release(cache);
    cl_mem mems[] = {pk, pv, kn, vn, q, out};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; ++i)
        if (mems[i])
            clReleaseMemObject(mems[i]);
    return rc;
}

/* mixed H KV_HEADS D PS R1:N1 [R2:N2 ...]: a mixed batch in one launch (packed queries over a
 * paged cache: cu_seqlens_q, block_table, kv_seqlen; flash_gpu.cl's PACKED_GRID): request b
 * has R_b query rows attending its N_b keys bottom-right causal, q and out (total_q, H, D),
 * pools of pages of PS keys (pages, PS, KV_HEADS, D), each request's blocks mapped to pages of
 * one shuffled order, float32; max_seqlen_q the longest request's rows. */
static int run_mixed(clattn_ctx *ctx, size_t heads, size_t kv_heads, size_t d, size_t ps,
                     size_t batch, const cl_int *rows, const cl_int *keys)
{
    uint32_t seed = 4;
    cl_int cu[65] = {0}, lens[64];
    size_t blocks = 1;
    for (size_t b = 0; b < batch; ++b) {
        cu[b + 1] = cu[b] + rows[b];
        lens[b] = keys[b];
        const size_t need = ((size_t)keys[b] + ps - 1) / ps;
        blocks = need > blocks ? need : blocks;
    }
    const size_t total_q = (size_t)cu[batch], pages = batch * blocks;
    const size_t q_n = total_q * heads * d, kv_n = pages * ps * kv_heads * d;
    cl_mem q = make_buffer(ctx, CLATTN_DTYPE_F32, q_n, &seed, 1);
    cl_mem k = make_buffer(ctx, CLATTN_DTYPE_F32, kv_n, &seed, 1);
    cl_mem v = make_buffer(ctx, CLATTN_DTYPE_F32, kv_n, &seed, 1);
    cl_mem out = make_buffer(ctx, CLATTN_DTYPE_F32, q_n, &seed, 0);
    cl_mem table = shuffled_table(ctx, batch, blocks, &seed);
    cl_int err = CL_SUCCESS, err2 = CL_SUCCESS;
    cl_mem cu_mem =
        clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                       (batch + 1) * sizeof cu[0], cu, &err);
    cl_mem len_mem =
        clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                       batch * sizeof lens[0], lens, &err2);
    clattn_plan *plan = NULL;
    int rc = 1;
    if (q == NULL || k == NULL || v == NULL || out == NULL || table == NULL || err != CL_SUCCESS ||
        err2 != CL_SUCCESS) {
        fprintf(stderr, "gpu_model_driver: mixed: buffers: out of memory\n");
        goto done;
    }
    clattn_sdpa_desc desc;
    clattn_tensors t;
    serving_desc(&desc, &t);
    for (size_t b = 0; b < batch; ++b) /* the longest request's rows (the host's row blocks) */
        desc.max_seqlen_q =
            (size_t)rows[b] > desc.max_seqlen_q ? (size_t)rows[b] : desc.max_seqlen_q;
    t.q = clattn_tensor_make(q, 0, CLATTN_DTYPE_F32, 3, total_q, heads, d, 0);
    t.out = clattn_tensor_make(out, 0, CLATTN_DTYPE_F32, 3, total_q, heads, d, 0);
    t.k = clattn_tensor_make(k, 0, CLATTN_DTYPE_F32, 4, pages, ps, kv_heads, d);
    t.v = clattn_tensor_make(v, 0, CLATTN_DTYPE_F32, 4, pages, ps, kv_heads, d);
    t.block_table = clattn_tensor_make(table, 0, CLATTN_DTYPE_I32, 2, batch, blocks, 0, 0);
    t.kv_seqlen = clattn_tensor_make(len_mem, 0, CLATTN_DTYPE_I32, 1, batch, 0, 0, 0);
    t.cu_seqlens_q = clattn_tensor_make(cu_mem, 0, CLATTN_DTYPE_I32, 1, batch + 1, 0, 0, 0);
    clattn_status status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    if (status == CLATTN_SUCCESS)
        status = clattn_plan_execute(plan, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS)
        status = clattn_finish(ctx);
    if (status != CLATTN_SUCCESS) {
        fprintf(stderr, "gpu_model_driver: mixed: %s\n", clattn_last_error(ctx));
        goto done;
    }
    const double sum = checksum(ctx, CLATTN_DTYPE_F32, out, q_n);
    printf("mixed H=%zu Hkv=%zu d=%zu pages of %zu, %zu requests, %zu rows: checksum %.6g (%s)\n",
           heads, kv_heads, d, ps, batch, total_q, sum, clattn_plan_info(plan));
    rc = isfinite(sum) ? 0 : 1;
done:
    clattn_plan_release(plan);
    cl_mem mems[] = {q, k, v, out, table, cu_mem, len_mem};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; ++i)
        if (mems[i])
            clReleaseMemObject(mems[i]);
    return rc;
}

/* mixed's arguments: H KV_HEADS D PS R1:N1 ...; 0 on bad usage. */
static int parse_mixed(int argc, char **argv, size_t *dims, size_t *batch, cl_int *rows,
                       cl_int *keys)
{
    if (argc < 7 || argc - 6 > 64)
        return 0;
    for (int i = 0; i < 4; ++i)
        if (!parse_size(argv[2 + i], &dims[i]))
            return 0;
    *batch = (size_t)(argc - 6);
    for (int i = 6; i < argc; ++i) {
        char *colon = strchr(argv[i], ':');
        size_t r = 0, n = 0;
        if (colon == NULL)
            return 0;
        *colon = '\0';
        if (!parse_size(argv[i], &r) || !parse_size(colon + 1, &n))
            return 0;
        rows[i - 6] = (cl_int)r;
        keys[i - 6] = (cl_int)n;
    }
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage();
    sdpa_shape shape = {0};
    size_t m = 0, n = 0, k = 0;
    size_t mixed_dims[4], mixed_batch = 0; /* mixed: H, KV_HEADS, D, PS; the requests */
    cl_int mixed_rows[64], mixed_keys[64];
    if (strcmp(argv[1], "mixed") == 0) {
        if (!parse_mixed(argc, argv, mixed_dims, &mixed_batch, mixed_rows, mixed_keys))
            return usage();
    } else if (strcmp(argv[1], "matmul") == 0) {
        if (argc != 5 || !parse_size(argv[2], &m) || !parse_size(argv[3], &n) ||
            !parse_size(argv[4], &k))
            return usage();
    } else if (strcmp(argv[1], "sdpa") == 0 || strcmp(argv[1], "backward") == 0) {
        /* backward: the shape's arguments start one earlier (no path: the backward is fused) */
        shape.backward = strcmp(argv[1], "backward") == 0;
        const int a = shape.backward ? 2 : 3;
        if (argc < a + 6 ||
            (!shape.backward && strcmp(argv[2], "fused") != 0 && strcmp(argv[2], "unfused") != 0) ||
            !parse_size(argv[a], &shape.batch) || !parse_size(argv[a + 1], &shape.heads) ||
            !parse_size(argv[a + 2], &shape.kv_heads) || !parse_size(argv[a + 3], &shape.seq_q) ||
            !parse_size(argv[a + 4], &shape.seq_k) || !parse_size(argv[a + 5], &shape.dim))
            return usage();
        shape.fused = shape.backward || strcmp(argv[2], "fused") == 0;
        for (int i = a + 6; i < argc; ++i) {
            if (strcmp(argv[i], "causal") == 0)
                shape.causal = 1;
            else if (strcmp(argv[i], "f16") == 0)
                shape.dtype = CLATTN_DTYPE_F16;
            else if (strcmp(argv[i], "bf16") == 0)
                shape.dtype = CLATTN_DTYPE_BF16;
            else if (strncmp(argv[i], "dv=", 3) == 0) {
                if (!parse_size(argv[i] + 3, &shape.dim_v))
                    return usage();
            } else if (strncmp(argv[i], "paged=", 6) == 0 && !shape.backward) {
                if (!parse_size(argv[i] + 6, &shape.page_size))
                    return usage();
            } else if (strcmp(argv[i], "fp8=e4m3") == 0 && !shape.backward) {
                shape.kv_dtype = CLATTN_DTYPE_FP8_E4M3;
            } else if (strcmp(argv[i], "fp8=e5m2") == 0 && !shape.backward) {
                shape.kv_dtype = CLATTN_DTYPE_FP8_E5M2;
            } else if (strncmp(argv[i], "dpas=", 5) == 0 && !shape.backward) {
                if (!parse_size(argv[i] + 5, &shape.dpas_sg) ||
                    (shape.dpas_sg != 8 && shape.dpas_sg != 16))
                    return usage();
            } else if (strncmp(argv[i], "flexdoc=", 8) == 0 && !shape.backward) {
                if (!parse_size(argv[i] + 8, &shape.flex_docs))
                    return usage();
            } else if (strncmp(argv[i], "blocks=", 7) == 0 && !shape.backward) {
                char *comma = strchr(argv[i] + 7, ',');
                if (comma == NULL)
                    return usage();
                *comma = '\0';
                if (!parse_size(argv[i] + 7, &shape.flex_bq) ||
                    !parse_size(comma + 1, &shape.flex_bk))
                    return usage();
            } else if (strncmp(argv[i], "kvlen=", 6) != 0 ||
                       !parse_size(argv[i] + 6, &shape.kv_len))
                return usage();
        }
        /* flexdoc: the fused path, LQ = LK (the ids index both); blocks only with flexdoc */
        if ((shape.flex_docs &&
             (!shape.fused || shape.seq_q != shape.seq_k || shape.flex_docs > shape.seq_q)) ||
            (shape.flex_bq && !shape.flex_docs) ||
            (shape.page_size && (!shape.kv_len || shape.seq_k % shape.page_size != 0)))
            return usage();
    } else if (strcmp(argv[1], "step") == 0) {
        if (argc < 7 || !parse_size(argv[2], &shape.batch) || !parse_size(argv[3], &shape.heads) ||
            !parse_size(argv[4], &shape.kv_heads) || !parse_size(argv[5], &shape.seq_k) ||
            !parse_size(argv[6], &shape.dim))
            return usage();
        for (int i = 7; i < argc; ++i) {
            if (strcmp(argv[i], "f16") == 0)
                shape.dtype = CLATTN_DTYPE_F16;
            else if (strncmp(argv[i], "paged=", 6) != 0 ||
                     !parse_size(argv[i] + 6, &shape.page_size))
                return usage();
        }
    } else {
        return usage();
    }
    char message[256];
    clattn_ctx *ctx = NULL;
    clattn_ctx_desc ctx_desc;
    clattn_ctx_desc_init(&ctx_desc);
    char dpas_row[96];
    if (shape.dpas_sg) { /* dpas=SG: the tuning row that builds FG_DPAS = 2 */
        snprintf(dpas_row, sizeof dpas_row, "any | * | * | fg_dpas=2 fg_dpas_sg=%zu",
                 shape.dpas_sg);
        ctx_desc.tuning_rows = dpas_row;
    }
    if (clattn_ctx_create_desc(&ctx_desc, &ctx, message, sizeof message) != CLATTN_SUCCESS) {
        fprintf(stderr, "gpu_model_driver: no device: %s\n", message);
        return 1;
    }
    /* What the model's tiles depend on: the tuning parameters and the device's limits. */
    cl_uint units = 0;
    cl_ulong local_mem = 0;
    clGetDeviceInfo(clattn_ctx_device(ctx), CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units,
                    NULL);
    clGetDeviceInfo(clattn_ctx_device(ctx), CL_DEVICE_LOCAL_MEM_SIZE, sizeof local_mem, &local_mem,
                    NULL);
    const char *parameters = strstr(clattn_ctx_tuning(ctx), "parameters:");
    printf("device: compute_units=%u local_mem_size=%llu\n%s\n", units,
           (unsigned long long)local_mem, parameters ? parameters : "parameters: unknown");
    const int rc = strcmp(argv[1], "matmul") == 0 ? run_matmul(ctx, m, n, k)
                   : strcmp(argv[1], "mixed") == 0
                       ? run_mixed(ctx, mixed_dims[0], mixed_dims[1], mixed_dims[2], mixed_dims[3],
                                   mixed_batch, mixed_rows, mixed_keys)
                   : strcmp(argv[1], "step") == 0 ? run_step(ctx, &shape)
                                                  : run_sdpa(ctx, &shape);
    clattn_ctx_release(ctx);
    return rc;
}
