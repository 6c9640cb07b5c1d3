/* Self-validation's probes, the shared part (probe.h): the random grid, dtype encodings,
 * probe buffers, and the score rule in float64 (reference_row, draw_modifiers), which the
 * families' probes use (each beside its family's enqueue: flash.c, flash_bwd.c, softmax.c,
 * matmul.c, heads.c, rope.c, posenc.c, additive.c; core/validate.h says when they run). */
#include "probe.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

uint32_t clattn__probe_next(clattn__probe_rng *r)
{
    r->state = r->state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(r->state >> 33);
}

double clattn__probe_grid(clattn__probe_rng *r, clattn_dtype dtype)
{
    if (dtype == CLATTN_DTYPE_Q4_0)
        return ((int)(clattn__probe_next(r) % 16) - 8) / 8.0;
    if (dtype == CLATTN_DTYPE_FP8_E4M3 || dtype == CLATTN_DTYPE_FP8_E5M2)
        return ((int)(clattn__probe_next(r) % 17) - 8) / 8.0; /* 3 significant bits: exact */
    return ((int)(clattn__probe_next(r) % 129) - 64) / 64.0;
}

/* The F16 bits of a grid value (0, or a normal number: exact). */
static uint16_t half_bits(double x)
{
    if (x == 0.0)
        return 0;
    const float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t exponent = ((u >> 23) & 0xffu) - 127u + 15u;
    return (uint16_t)(sign | (exponent << 10) | ((u >> 13) & 0x3ffu));
}

/* The FP8 code of a grid value (0, or a normal number of that format: exact). */
static unsigned char fp8_bits(double x, bool e4m3)
{
    if (x == 0.0)
        return 0;
    const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    int exponent = 0;
    const double mantissa = frexp(fabs(x), &exponent); /* [0.5, 1) */
    const int m = (int)ldexp(mantissa * 2.0 - 1.0, mbits);
    return (unsigned char)((x < 0 ? 0x80 : 0) | ((exponent - 1 + bias) << mbits) | m);
}

static double fp8_value(unsigned char c, bool e4m3)
{
    const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, mag = c & 0x7f;
    const int exponent = mag >> mbits, m = mag & ((1 << mbits) - 1);
    const double sign = c & 0x80 ? -1.0 : 1.0;
    if (e4m3 ? mag == 0x7f : exponent == 31)
        return !e4m3 && m == 0 ? sign * INFINITY : NAN;
    if (exponent == 0)
        return sign * ldexp(m, 1 - bias - mbits);
    return sign * ldexp((1 << mbits) + m, exponent - bias - mbits);
}

static double half_value(uint16_t h)
{
    const int exponent = (h >> 10) & 31, mantissa = h & 1023;
    const double sign = h & 0x8000u ? -1.0 : 1.0;
    if (exponent == 31)
        return mantissa ? NAN : sign * INFINITY;
    if (exponent == 0)
        return sign * ldexp(mantissa, -24);
    return sign * ldexp(1024 + mantissa, exponent - 25);
}

size_t clattn__probe_bytes(clattn_dtype dtype, size_t count)
{
    switch (dtype) {
    case CLATTN_DTYPE_F16:
    case CLATTN_DTYPE_BF16:
        return 2 * count;
    case CLATTN_DTYPE_U8:
    case CLATTN_DTYPE_FP8_E4M3:
    case CLATTN_DTYPE_FP8_E5M2:
        return count;
    case CLATTN_DTYPE_Q8_0:
        return count / 32 * 34;
    case CLATTN_DTYPE_Q4_0:
        return count / 32 * 18;
    default:
        return 4 * count;
    }
}

/* x[0 .. count) in dtype's layout (count a multiple of 32 for the block types). */
void clattn__probe_encode(clattn_dtype dtype, const double *x, size_t count, unsigned char *out)
{
    for (size_t i = 0; i < count; ++i) {
        const float f = (float)x[i];
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        switch (dtype) {
        case CLATTN_DTYPE_F16: {
            const uint16_t h = half_bits(x[i]);
            memcpy(out + 2 * i, &h, 2);
            break;
        }
        case CLATTN_DTYPE_BF16: {
            const uint16_t h = (uint16_t)(u >> 16);
            memcpy(out + 2 * i, &h, 2);
            break;
        }
        case CLATTN_DTYPE_U8:
            out[i] = (unsigned char)x[i];
            break;
        case CLATTN_DTYPE_FP8_E4M3:
        case CLATTN_DTYPE_FP8_E5M2:
            out[i] = fp8_bits(x[i], dtype == CLATTN_DTYPE_FP8_E4M3);
            break;
        case CLATTN_DTYPE_Q8_0:
        case CLATTN_DTYPE_Q4_0: {
            const bool q8 = dtype == CLATTN_DTYPE_Q8_0;
            unsigned char *block = out + (i / 32) * (q8 ? 34 : 18);
            const size_t j = i % 32;
            if (j == 0) {
                const uint16_t scale = half_bits(q8 ? 1.0 / 64 : 1.0 / 8);
                memcpy(block, &scale, 2);
                memset(block + 2, 0, q8 ? 32 : 16);
            }
            if (q8)
                block[2 + j] = (unsigned char)(signed char)lround(x[i] * 64);
            else
                block[2 + j % 16] |= (unsigned char)((lround(x[i] * 8) + 8) << (j < 16 ? 0 : 4));
            break;
        }
        default:
            memcpy(out + 4 * i, &f, 4);
        }
    }
}

double clattn__probe_decode(clattn_dtype dtype, const unsigned char *in, size_t i)
{
    uint16_t h;
    float f;
    switch (dtype) {
    case CLATTN_DTYPE_F16:
        memcpy(&h, in + 2 * i, 2);
        return half_value(h);
    case CLATTN_DTYPE_BF16: {
        memcpy(&h, in + 2 * i, 2);
        const uint32_t u = (uint32_t)h << 16;
        memcpy(&f, &u, 4);
        return f;
    }
    case CLATTN_DTYPE_FP8_E4M3:
    case CLATTN_DTYPE_FP8_E5M2:
        return fp8_value(in[i], dtype == CLATTN_DTYPE_FP8_E4M3);
    default:
        memcpy(&f, in + 4 * i, 4);
        return f;
    }
}

/* ---- device buffers ------------------------------------------------------------------------ */

/* A buffer holding bytes of data (or `bytes` of 0xff, NaN in every float dtype, when data is
 * NULL: the outputs' poison). */
clattn_status clattn__probe_upload(clattn_ctx *ctx, clattn__probe_mem *pm, const void *data,
                                   size_t bytes, cl_mem *out)
{
    if (pm->count == CLATTN__PROBE_BUFFERS)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: too many buffers");
    const size_t size = bytes ? bytes : 4;
    void *poison = NULL;
    if (data == NULL || bytes == 0) {
        poison = malloc(size);
        if (poison == NULL)
            return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        memset(poison, 0xff, size);
        if (data && bytes == 0)
            memset(poison, 0, size);
    }
    cl_int err = CL_SUCCESS;
    *out = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, size,
                          poison ? poison : (void *)data, &err);
    free(poison);
    if (err != CL_SUCCESS)
        return clattn__cl_fail(ctx, err, "probe: clCreateBuffer");
    pm->mems[pm->count++] = *out;
    return CLATTN_SUCCESS;
}

void clattn__probe_release(clattn__probe_mem *pm)
{
    for (int i = 0; i < pm->count; ++i)
        clReleaseMemObject(pm->mems[i]);
    pm->count = 0;
    for (int i = 0; i < pm->host_count; ++i)
        free(pm->host[i]);
    pm->host_count = 0;
}

void *clattn__probe_alloc(clattn__probe_mem *pm, size_t bytes)
{
    if (pm->host_count == CLATTN__PROBE_BUFFERS)
        return NULL;
    void *p = calloc(bytes ? bytes : 1, 1);
    if (p)
        pm->host[pm->host_count++] = p;
    return p;
}

clattn_status clattn__trust_one(clattn_ctx *ctx, const char *unit_name, cl_kernel *slot,
                                clattn__probe_fn probe, void *unit)
{
    cl_kernel *slots[1] = {slot};
    return clattn__trust(ctx, unit_name, slots, 1, probe, unit);
}

/* Blocking read after the chain's last step. */
clattn_status clattn__probe_download(clattn_chain *chain, cl_mem mem, size_t bytes, void *out)
{
    const cl_int err =
        clEnqueueReadBuffer(chain->queue, mem, CL_TRUE, 0, bytes, out, chain->last ? 1 : 0,
                            chain->last ? &chain->last : NULL, NULL);
    return err == CL_SUCCESS ? CLATTN_SUCCESS : clattn__cl_fail(chain->ctx, err, "probe: read");
}

clattn_chain clattn__probe_chain(clattn_ctx *ctx)
{
    clattn_chain chain;
    memset(&chain, 0, sizeof chain);
    chain.ctx = ctx;
    chain.queue = ctx->queue;
    chain.out_of_order = ctx->out_of_order;
    chain.private_workspace = true;
    return chain;
}

clattn__view clattn__probe_view(cl_mem mem, clattn_dtype dtype, size_t d0, size_t d1, size_t d2,
                                size_t d3)
{
    return (clattn__view){.mem = mem,
                          .dtype = dtype,
                          .dims = {d0, d1, d2, d3},
                          .strides = {d1 * d2 * d3, d2 * d3, d3, 1}};
}

/* ---- the score rule in float64 (ops.h, kernels/score.cl) ----------------------------------- */

/* Weights of row (b, h, i) from its raw dot products raw[0 .. seq_k) into w; false when the
 * row keeps no key (zeros). *lse: the row's log-sum-exp (softmax). */
void clattn__probe_reference_row(const clattn__probe_scores *p, size_t b, size_t h, size_t i,
                                 const double *raw, double *w, double *lse, double *dcap)
{
    const clattn__score_shape *s = p->s;
    const long long n = p->kv_len ? p->kv_len[b] : (long long)s->seq_k;
    long long limit = n <= 0 ? 0 : n >= (long long)s->seq_k ? (long long)s->seq_k : n;
    const long long apos = limit - (long long)s->seq_q;
    if (p->table) { /* a paged sequence ends at its first block outside the pool */
        for (long long blk = 0; blk * (long long)p->page_size < limit; ++blk) {
            const int page = p->table[b * p->blocks + (size_t)blk];
            if (page < 0 || (size_t)page >= p->num_pages) {
                limit = blk * (long long)p->page_size;
                break;
            }
        }
    }
    const long long pos = (long long)i + s->band_diag + (s->band_diag_kv ? n : 0);
    const double slope = p->alibi ? p->alibi[b * s->heads + h] : 0.0;
    const double sink = p->sinks ? p->sinks[h * s->seq_q + i] : -INFINITY;
    double top = sink;
    for (size_t j = 0; j < s->seq_k; ++j) {
        double x = -INFINITY;
        const long long jj = (long long)j;
        const bool kept = jj < limit && !(s->band_upper >= 0 && jj > pos + s->band_upper) &&
                          !(s->band_lower >= 0 && jj < pos - s->band_lower) &&
                          !(p->kpm && p->kpm[b * s->seq_k + j]);
        const size_t m = ((b * s->heads + h) * s->seq_q + i) * s->seq_k + j;
        if (kept && !(p->mask && s->mask_dtype == CLATTN_DTYPE_U8 && p->mask[m] == 0.0)) {
            x = (double)s->scale * raw[j];
            if (s->softcap > 0.0f)
                x = s->softcap * tanh(x / s->softcap);
            if (dcap) /* d(capped)/d(scale q.k), for the backward */
                dcap[j] = s->softcap > 0.0f ? 1.0 - (x / s->softcap) * (x / s->softcap) : 1.0;
            x -= slope * fabs((double)((long long)i + apos - jj));
            if (p->mask && s->mask_dtype != CLATTN_DTYPE_U8)
                x += p->mask[m];
        }
        w[j] = x;
        top = x > top ? x : top;
    }
    double total = 0.0;
    if (s->norm == CLATTN_NORM_RELU) {
        for (size_t j = 0; j < s->seq_k; ++j)
            total += w[j] > 0.0 ? w[j] : 0.0;
        for (size_t j = 0; j < s->seq_k; ++j)
            w[j] = total > 0.0 && w[j] > 0.0 ? w[j] / total : 0.0;
        *lse = NAN;
        return;
    }
    for (size_t j = 0; j < s->seq_k; ++j)
        total += w[j] == -INFINITY ? 0.0 : exp(w[j] - top);
    if (sink != -INFINITY)
        total += exp(sink - top);
    for (size_t j = 0; j < s->seq_k; ++j)
        w[j] = total > 0.0 && w[j] != -INFINITY ? exp(w[j] - top) / total : 0.0;
    *lse = total > 0.0 ? top + log(total) : -INFINITY;
}

/* Host copies of the modifiers' inputs, drawn for shape s, and their device buffers as masks. */

void clattn__probe_free_inputs(clattn__probe_inputs *in)
{
    free(in->mask);
    free(in->alibi);
    free(in->sinks);
    free(in->kpm);
    free(in->kv_len);
    free(in->table);
}

clattn_status clattn__probe_draw_modifiers(clattn_ctx *ctx, clattn__probe_rng *rng,
                                           const clattn__score_shape *s, clattn__probe_mem *pm,
                                           clattn__probe_inputs *in, clattn__score_masks *masks)
{
    const size_t b = s->batch, h = s->heads, q = s->seq_q, k = s->seq_k;
    memset(in, 0, sizeof *in);
    memset(masks, 0, sizeof *masks);
    in->scores.s = s;
    clattn_status status = CLATTN_SUCCESS;
    cl_mem mem = NULL;
    unsigned char *bytes = NULL;
    if (s->has_mask) {
        const size_t count = b * h * q * k;
        in->mask = malloc(count * sizeof(double));
        bytes = malloc(clattn__probe_bytes(s->mask_dtype, count) + 4);
        if (!in->mask || !bytes)
            goto oom;
        for (size_t i = 0; i < count; ++i)
            in->mask[i] = s->mask_dtype == CLATTN_DTYPE_U8 ? (clattn__probe_next(rng) % 5 != 0)
                                                           : clattn__probe_grid(rng, s->mask_dtype);
        clattn__probe_encode(s->mask_dtype, in->mask, count, bytes);
        if ((status = clattn__probe_upload(ctx, pm, bytes,
                                           clattn__probe_bytes(s->mask_dtype, count), &mem)))
            goto done;
        masks->mask = clattn__probe_view(mem, s->mask_dtype, b, h, q, k);
        in->scores.mask = in->mask;
        free(bytes);
        bytes = NULL;
    }
    if (s->has_key_padding) {
        in->kpm = malloc(b * k + 1);
        if (!in->kpm)
            goto oom;
        for (size_t i = 0; i < b * k; ++i)
            in->kpm[i] = clattn__probe_next(rng) % 6 == 0;
        if ((status = clattn__probe_upload(ctx, pm, in->kpm, b * k, &mem)))
            goto done;
        masks->key_padding = clattn__probe_view(mem, CLATTN_DTYPE_U8, 1, 1, b, k);
        in->scores.kpm = in->kpm;
    }
    if (s->has_kv_len) {
        in->kv_len = malloc(b * sizeof(int));
        if (!in->kv_len)
            goto oom;
        for (size_t i = 0; i < b; ++i) /* the first full, the others anywhere up to seq_k */
            in->kv_len[i] = i == 0 ? (int)k : (int)(clattn__probe_next(rng) % (k + 1));
        if ((status = clattn__probe_upload(ctx, pm, in->kv_len, b * sizeof(int), &mem)))
            goto done;
        masks->kv_len = clattn__probe_view(mem, CLATTN_DTYPE_F32, 1, 1, 1, b);
        in->scores.kv_len = in->kv_len;
    }
    float values[64];
    if (s->has_alibi) {
        in->alibi = malloc(b * h * sizeof(double));
        if (!in->alibi || b * h > 64)
            goto oom;
        for (size_t i = 0; i < b * h; ++i)
            values[i] = (float)(in->alibi[i] = (1 + clattn__probe_next(rng) % 16) / 64.0);
        if ((status = clattn__probe_upload(ctx, pm, values, b * h * sizeof(float), &mem)))
            goto done;
        masks->alibi = clattn__probe_view(mem, CLATTN_DTYPE_F32, 1, 1, b, h);
        in->scores.alibi = in->alibi;
    }
    if (s->has_sinks) { /* one per (head, row): each query head's own, decode groups' too */
        in->sinks = malloc(h * q * sizeof(double));
        float *host = malloc(h * q * sizeof(float) + 4);
        if (!in->sinks || !host) {
            free(host);
            goto oom;
        }
        for (size_t i = 0; i < h * q; ++i)
            host[i] = (float)(in->sinks[i] = 2.0 * clattn__probe_grid(rng, CLATTN_DTYPE_F32));
        status = clattn__probe_upload(ctx, pm, host, h * q * sizeof(float), &mem);
        free(host);
        if (status)
            goto done;
        masks->sinks = clattn__probe_view(mem, CLATTN_DTYPE_F32, 1, 1, h, q);
        in->scores.sinks = in->sinks;
    }
    goto done;
oom:
    status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
done:
    free(bytes);
    return status;
}

/* The largest error of got (dtype) against want over count elements; NaN counts as infinite.
 * *where: the first element at that error. */
double clattn__probe_max_error(clattn_dtype dtype, const unsigned char *got, const double *want,
                               size_t count, size_t *where)
{
    double worst = 0.0;
    for (size_t i = 0; i < count; ++i) {
        const double g = clattn__probe_decode(dtype, got, i);
        const double e = isnan(g) ? INFINITY : fabs(g - want[i]);
        if (e > worst) {
            worst = e;
            *where = i;
        }
    }
    return worst;
}

double clattn__probe_tolerance(clattn_dtype dtype)
{
    return dtype == CLATTN_DTYPE_BF16 ? 1.6e-2 : dtype == CLATTN_DTYPE_F16 ? 2e-3 : 2e-4;
}
