/* Probes for self-validation (core/validate.h): each family's prepared variant runs a small
 * random problem that exercises the switches it was built with, with NaN-poisoned outputs, and
 * is compared with a float64 reference computed here. Inputs lie on the grid k/64 in [-1, 1]
 * (k/8 for Q4_0), which F16, BF16, Q8_0 (scale 1/64) and Q4_0 (scale 1/8) hold exactly, so the
 * reference sees the very values the device reads.
 *
 * flash attention (flash.cl, flash_cpu.cl, flash_gpu.cl; heads.cl's flash_merge after decode
 * splits): the prepared plan itself (its kernels, tiles, key parts and splits) on a batch of at
 * most 2, at most 2 k/v heads with the plan's query group, up to 19 query rows (a decode's few
 * rows as they are) and one tile, key part or split plus 13 keys; every modifier the plan has:
 * masks of its dtype, key padding, key counts, the band, ALiBi, per-row sinks, soft-capping,
 * relu, grouped heads, a paged pool of 7-key pages whose tables hold indices outside the pool
 * past the keys (and, in the second sequence, inside them: its keys end there), quantized k/v.
 * Left unprobed (logged CLATTN_CHECK_UNCHECKED): packed sequences, user score functions,
 * dropout and additive scores.
 * softmax rows: the plan's kernel on random raw scores with the same modifiers.
 * matmul: the plan's kernels (and pack_b) on 37 x (panel + 5) x 19 products, two batches. */
#include "ops.h"
#include "core/validate.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct probe_rng {
    uint64_t state;
} probe_rng;

static uint32_t next_u32(probe_rng *r)
{
    r->state = r->state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(r->state >> 33);
}

static double grid_value(probe_rng *r, clattn_dtype dtype)
{
    if (dtype == CLATTN_DTYPE_Q4_0)
        return ((int)(next_u32(r) % 16) - 8) / 8.0;
    return ((int)(next_u32(r) % 129) - 64) / 64.0;
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

static size_t elem_bytes(clattn_dtype dtype, size_t count)
{
    switch (dtype) {
    case CLATTN_DTYPE_F16:
    case CLATTN_DTYPE_BF16:
        return 2 * count;
    case CLATTN_DTYPE_U8:
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
static void encode(clattn_dtype dtype, const double *x, size_t count, unsigned char *out)
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

static double decode_one(clattn_dtype dtype, const unsigned char *in, size_t i)
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
    default:
        memcpy(&f, in + 4 * i, 4);
        return f;
    }
}

/* ---- device buffers ------------------------------------------------------------------------ */

enum { MAX_BUFFERS = 16 };
typedef struct probe_mem {
    cl_mem mems[MAX_BUFFERS];
    int count;
} probe_mem;

/* A buffer holding bytes of data (or `bytes` of 0xff, NaN in every float dtype, when data is
 * NULL: the outputs' poison). */
static clattn_status upload(clattn_ctx *ctx, probe_mem *pm, const void *data, size_t bytes,
                            cl_mem *out)
{
    if (pm->count == MAX_BUFFERS)
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

static void release_all(probe_mem *pm)
{
    for (int i = 0; i < pm->count; ++i)
        clReleaseMemObject(pm->mems[i]);
    pm->count = 0;
}

/* Blocking read after the chain's last step. */
static clattn_status download(clattn_chain *chain, cl_mem mem, size_t bytes, void *out)
{
    const cl_int err = clEnqueueReadBuffer(chain->queue, mem, CL_TRUE, 0, bytes, out,
                                           chain->last ? 1 : 0, chain->last ? &chain->last : NULL,
                                           NULL);
    return err == CL_SUCCESS ? CLATTN_SUCCESS : clattn__cl_fail(chain->ctx, err, "probe: read");
}

static clattn_chain probe_chain(clattn_ctx *ctx)
{
    clattn_chain chain;
    memset(&chain, 0, sizeof chain);
    chain.ctx = ctx;
    chain.queue = ctx->queue;
    chain.out_of_order = ctx->out_of_order;
    chain.private_workspace = true;
    return chain;
}

static clattn__view packed_view(cl_mem mem, clattn_dtype dtype, size_t d0, size_t d1, size_t d2,
                                size_t d3)
{
    return (clattn__view){.mem = mem,
                          .dtype = dtype,
                          .dims = {d0, d1, d2, d3},
                          .strides = {d1 * d2 * d3, d2 * d3, d3, 1}};
}

/* ---- the score rule in float64 (ops.h, kernels/score.cl) ----------------------------------- */

typedef struct probe_scores {
    const clattn__score_shape *s;
    const double *mask;         /* (b, h, i, j), or NULL */
    const unsigned char *kpm;   /* (b, j), or NULL */
    const int *kv_len;          /* (b), or NULL */
    const double *alibi;        /* (b, h), or NULL */
    const double *sinks;        /* (h, i), or NULL */
    const int *table;           /* paged: (b, blocks) */
    size_t blocks, page_size, num_pages;
} probe_scores;

/* Weights of row (b, h, i) from its raw dot products raw[0 .. seq_k) into w; false when the
 * row keeps no key (zeros). *lse: the row's log-sum-exp (softmax). */
static void reference_row(const probe_scores *p, size_t b, size_t h, size_t i, const double *raw,
                          double *w, double *lse, double *dcap)
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
typedef struct probe_inputs {
    double *mask, *alibi, *sinks;
    unsigned char *kpm;
    int *kv_len, *table;
    probe_scores scores;
} probe_inputs;

static void free_inputs(probe_inputs *in)
{
    free(in->mask);
    free(in->alibi);
    free(in->sinks);
    free(in->kpm);
    free(in->kv_len);
    free(in->table);
}

static clattn_status draw_modifiers(clattn_ctx *ctx, probe_rng *rng, const clattn__score_shape *s,
                                    probe_mem *pm, probe_inputs *in, clattn__score_masks *masks)
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
        bytes = malloc(elem_bytes(s->mask_dtype, count) + 4);
        if (!in->mask || !bytes)
            goto oom;
        for (size_t i = 0; i < count; ++i)
            in->mask[i] = s->mask_dtype == CLATTN_DTYPE_U8 ? (next_u32(rng) % 5 != 0)
                                                           : grid_value(rng, s->mask_dtype);
        encode(s->mask_dtype, in->mask, count, bytes);
        if ((status = upload(ctx, pm, bytes, elem_bytes(s->mask_dtype, count), &mem)))
            goto done;
        masks->mask = packed_view(mem, s->mask_dtype, b, h, q, k);
        in->scores.mask = in->mask;
        free(bytes);
        bytes = NULL;
    }
    if (s->has_key_padding) {
        in->kpm = malloc(b * k + 1);
        if (!in->kpm)
            goto oom;
        for (size_t i = 0; i < b * k; ++i)
            in->kpm[i] = next_u32(rng) % 6 == 0;
        if ((status = upload(ctx, pm, in->kpm, b * k, &mem)))
            goto done;
        masks->key_padding = packed_view(mem, CLATTN_DTYPE_U8, 1, 1, b, k);
        in->scores.kpm = in->kpm;
    }
    if (s->has_kv_len) {
        in->kv_len = malloc(b * sizeof(int));
        if (!in->kv_len)
            goto oom;
        for (size_t i = 0; i < b; ++i) /* the first full, the others anywhere up to seq_k */
            in->kv_len[i] = i == 0 ? (int)k : (int)(next_u32(rng) % (k + 1));
        if ((status = upload(ctx, pm, in->kv_len, b * sizeof(int), &mem)))
            goto done;
        masks->kv_len = packed_view(mem, CLATTN_DTYPE_F32, 1, 1, 1, b);
        in->scores.kv_len = in->kv_len;
    }
    float values[64];
    if (s->has_alibi) {
        in->alibi = malloc(b * h * sizeof(double));
        if (!in->alibi || b * h > 64)
            goto oom;
        for (size_t i = 0; i < b * h; ++i)
            values[i] = (float)(in->alibi[i] = (1 + next_u32(rng) % 16) / 64.0);
        if ((status = upload(ctx, pm, values, b * h * sizeof(float), &mem)))
            goto done;
        masks->alibi = packed_view(mem, CLATTN_DTYPE_F32, 1, 1, b, h);
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
            host[i] = (float)(in->sinks[i] = 2.0 * grid_value(rng, CLATTN_DTYPE_F32));
        status = upload(ctx, pm, host, h * q * sizeof(float), &mem);
        free(host);
        if (status)
            goto done;
        masks->sinks = packed_view(mem, CLATTN_DTYPE_F32, 1, 1, h, q);
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
static double max_error(clattn_dtype dtype, const unsigned char *got, const double *want,
                        size_t count, size_t *where)
{
    double worst = 0.0;
    for (size_t i = 0; i < count; ++i) {
        const double g = decode_one(dtype, got, i);
        const double e = isnan(g) ? INFINITY : fabs(g - want[i]);
        if (e > worst) {
            worst = e;
            *where = i;
        }
    }
    return worst;
}

static double tolerance_of(clattn_dtype dtype)
{
    return dtype == CLATTN_DTYPE_BF16 ? 1.6e-2 : dtype == CLATTN_DTYPE_F16 ? 2e-3 : 2e-4;
}

/* ---- flash attention ----------------------------------------------------------------------- */

static size_t at_most(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* The plan on the probe's sizes: its kernels, tiles and splits as prepared. */
static void probe_flash_plan(const clattn__flash_plan *prepared, clattn__flash_plan *run)
{
    *run = *prepared;
    clattn__score_shape *s = &run->shape.score;
    const size_t group = s->kv_group > 1 ? s->kv_group : 1;
    s->batch = at_most(s->batch, 2);
    s->heads = at_most(s->heads / group, 2) * group;
    s->seq_q = s->seq_q <= 8 ? s->seq_q : at_most(s->seq_q, 19);
    const bool parts = prepared->part_keys < prepared->shape.score.seq_k;
    const size_t unit = prepared->splits > 1 ? prepared->split_keys
                        : parts              ? prepared->part_keys
                                             : prepared->key_tile;
    s->seq_k = at_most(s->seq_k, unit + 13);
    run->part_keys = parts ? prepared->part_keys : s->seq_k;
    const size_t rows = s->batch * s->heads * s->seq_q;
    if (prepared->splits > 1) {
        run->splits = (unsigned)((s->seq_k + run->split_keys - 1) / run->split_keys);
        run->scratch_floats = run->splits * rows * (run->shape.head_dim_v + 1);
        const size_t items = rows * run->shape.head_dim_v;
        run->merge_global = (items + run->merge_local - 1) / run->merge_local * run->merge_local;
    } else {
        run->scratch_floats = run->part_keys < s->seq_k ? rows : 0;
    }
}

typedef struct flash_host {
    double *q, *k, *v, *out, *lse, *raw, *w;
} flash_host;

static void free_flash_host(flash_host *h)
{
    free(h->q);
    free(h->k);
    free(h->v);
    free(h->out);
    free(h->lse);
    free(h->raw);
    free(h->w);
}

/* k or v drawn as (batch, kv_heads, seq_k, d) values; on the device packed, or in a pool of
 * pages (pages, page_size, kv_heads, d) at the table's pages. */
static clattn_status upload_keys(clattn_ctx *ctx, probe_mem *pm, clattn_dtype dtype,
                                 const double *x, const clattn__score_shape *s, size_t kv_heads,
                                 size_t d, const probe_scores *ps, clattn__view *view)
{
    const size_t per_batch = kv_heads * s->seq_k * d;
    size_t count = s->batch * per_batch;
    double *laid = NULL;
    if (ps->table) { /* the pool: each (page, slot, head) row from its key, zeros elsewhere */
        count = ps->num_pages * ps->page_size * kv_heads * d;
        laid = calloc(count, sizeof(double));
        if (laid == NULL)
            return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        for (size_t b = 0; b < s->batch; ++b)
            for (size_t j = 0; j < s->seq_k; ++j) {
                const int page = ps->table[b * ps->blocks + j / ps->page_size];
                if (page < 0 || (size_t)page >= ps->num_pages)
                    continue;
                for (size_t h = 0; h < kv_heads; ++h)
                    memcpy(laid + (((size_t)page * ps->page_size + j % ps->page_size) * kv_heads +
                                   h) * d,
                           x + ((b * kv_heads + h) * s->seq_k + j) * d, d * sizeof(double));
            }
    }
    unsigned char *bytes = malloc(elem_bytes(dtype, count) + 4);
    if (bytes == NULL) {
        free(laid);
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
    }
    encode(dtype, laid ? laid : x, count, bytes);
    cl_mem mem = NULL;
    const clattn_status status = upload(ctx, pm, bytes, elem_bytes(dtype, count), &mem);
    free(bytes);
    free(laid);
    if (status)
        return status;
    *view = packed_view(mem, dtype, s->batch, kv_heads, s->seq_k, d);
    if (ps->table) { /* sdpa.c's paged views: batch stride 0, the slot stride per key */
        view->strides[0] = 0;
        view->strides[1] = d;
        view->strides[2] = kv_heads * d;
    }
    return CLATTN_SUCCESS;
}

/* The paged pool's table: 7-key pages, a random page per block; past each sequence's keys an
 * index outside the pool (never read), and in the second sequence one inside its keys too
 * (its keys end there). */
static clattn_status draw_table(clattn_ctx *ctx, probe_rng *rng, const clattn__score_shape *s,
                                probe_mem *pm, probe_inputs *in, clattn__score_masks *masks)
{
    probe_scores *ps = &in->scores;
    ps->page_size = 7;
    ps->blocks = (s->seq_k + ps->page_size - 1) / ps->page_size;
    ps->num_pages = s->batch * ps->blocks + 2;
    in->table = malloc(s->batch * ps->blocks * sizeof(int));
    if (in->table == NULL)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
    for (size_t b = 0; b < s->batch; ++b) {
        const size_t keys = in->kv_len ? (size_t)in->kv_len[b] : s->seq_k;
        const size_t used = (keys + ps->page_size - 1) / ps->page_size;
        for (size_t blk = 0; blk < ps->blocks; ++blk) /* pages in reverse: not the identity */
            in->table[b * ps->blocks + blk] =
                blk < used ? (int)(ps->num_pages - 1 - (b * ps->blocks + blk))
                           : (next_u32(rng) % 2 ? -1 : (int)ps->num_pages + 3);
        if (b == 1 && used >= 3)
            in->table[b * ps->blocks + 1] = (int)ps->num_pages + 9;
    }
    ps->table = in->table;
    cl_mem mem = NULL;
    const clattn_status status =
        upload(ctx, pm, in->table, s->batch * ps->blocks * sizeof(int), &mem);
    if (status)
        return status;
    masks->paging.block_table = packed_view(mem, CLATTN_DTYPE_F32, 1, 1, s->batch, ps->blocks);
    masks->paging.page_size = ps->page_size;
    masks->paging.num_pages = ps->num_pages;
    return CLATTN_SUCCESS;
}

static const char *flash_unprobed(const clattn__score_shape *s)
{
    return s->varlen     ? "packed sequences (cu_seqlens)"
           : s->flex_id  ? "user score functions (flex)"
           : s->dropout  ? "dropout"
           : s->additive ? "additive scores"
                         : NULL;
}

static clattn_status run_flash_probe(clattn_ctx *ctx, const clattn__flash_plan *run,
                                     probe_mem *pm, flash_host *host, probe_inputs *in,
                                     clattn__probe_result *r)
{
    const clattn__flash_shape *shape = &run->shape;
    const clattn__score_shape *s = &shape->score;
    const size_t group = s->kv_group > 1 ? s->kv_group : 1, kv_heads = s->heads / group;
    const size_t dk = shape->head_dim_qk, dv = shape->head_dim_v;
    const size_t rows = s->batch * s->heads * s->seq_q;
    const size_t nq = rows * dk, nk = s->batch * kv_heads * s->seq_k * dk;
    const size_t nv = s->batch * kv_heads * s->seq_k * dv, no = rows * dv;
    probe_rng rng = {0x5eed0000ULL + dk * 131 + s->seq_k};
    host->q = malloc(nq * sizeof(double));
    host->k = malloc(nk * sizeof(double));
    host->v = malloc(nv * sizeof(double));
    host->out = malloc(no * sizeof(double));
    host->lse = malloc(rows * sizeof(double));
    host->raw = malloc(s->seq_k * sizeof(double));
    host->w = malloc(s->seq_k * sizeof(double));
    unsigned char *got = malloc(elem_bytes(CLATTN_DTYPE_F32, no > rows ? no : rows) + 4);
    clattn_status status = CLATTN_SUCCESS;
    if (!host->q || !host->k || !host->v || !host->out || !host->lse || !host->raw || !host->w ||
        !got) {
        free(got);
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
    }
    for (size_t i = 0; i < nq; ++i)
        host->q[i] = grid_value(&rng, shape->q_dtype);
    for (size_t i = 0; i < nk; ++i)
        host->k[i] = grid_value(&rng, shape->k_dtype);
    for (size_t i = 0; i < nv; ++i)
        host->v[i] = grid_value(&rng, shape->v_dtype);
    clattn__score_masks masks;
    clattn__view q, k, v, out, lse = {0};
    cl_mem mem = NULL, scratch = NULL;
    unsigned char *bytes = malloc(elem_bytes(CLATTN_DTYPE_F32, nq) + 4);
    if (bytes == NULL) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    encode(shape->q_dtype, host->q, nq, bytes);
    if ((status = draw_modifiers(ctx, &rng, s, pm, in, &masks)) ||
        (s->kv_paged && (status = draw_table(ctx, &rng, s, pm, in, &masks))) ||
        (status = upload(ctx, pm, bytes, elem_bytes(shape->q_dtype, nq), &mem)))
        goto done;
    q = packed_view(mem, shape->q_dtype, s->batch, s->heads, s->seq_q, dk);
    if ((status = upload_keys(ctx, pm, shape->k_dtype, host->k, s, kv_heads, dk, &in->scores,
                              &k)) ||
        (status = upload_keys(ctx, pm, shape->v_dtype, host->v, s, kv_heads, dv, &in->scores,
                              &v)) ||
        (status = upload(ctx, pm, NULL, elem_bytes(shape->out_dtype, no), &mem)))
        goto done;
    out = packed_view(mem, shape->out_dtype, s->batch, s->heads, s->seq_q, dv);
    if (s->kv_paged) {
        masks.paging.k_page = masks.paging.page_size * kv_heads * dk;
        masks.paging.v_page = masks.paging.page_size * kv_heads * dv;
    }
    if (shape->has_lse) {
        if ((status = upload(ctx, pm, NULL, rows * sizeof(float), &mem)))
            goto done;
        lse = packed_view(mem, CLATTN_DTYPE_F32, 1, s->batch, s->heads, s->seq_q);
    }
    if ((status = upload(ctx, pm, NULL, run->scratch_floats * sizeof(float), &scratch)))
        goto done;
    clattn_chain chain = probe_chain(ctx);
    status = clattn__flash_enqueue(&chain, run, &q, &k, &v, &out, &lse, &masks,
                                   (clattn__scratch){scratch, 0});
    if (status == CLATTN_SUCCESS)
        status = download(&chain, out.mem, elem_bytes(shape->out_dtype, no), got);
    /* the reference, while the device works */
    for (size_t b = 0; b < s->batch; ++b)
        for (size_t h = 0; h < s->heads; ++h)
            for (size_t i = 0; i < s->seq_q; ++i) {
                const size_t row = (b * s->heads + h) * s->seq_q + i;
                const double *qi = host->q + row * dk;
                const size_t kv = b * kv_heads + h / group;
                for (size_t j = 0; j < s->seq_k; ++j) {
                    const double *kj = host->k + (kv * s->seq_k + j) * dk;
                    double dot = 0.0;
                    for (size_t c = 0; c < dk; ++c)
                        dot += qi[c] * kj[c];
                    host->raw[j] = dot;
                }
                reference_row(&in->scores, b, h, i, host->raw, host->w, &host->lse[row], NULL);
                for (size_t c = 0; c < dv; ++c) {
                    double acc = 0.0;
                    for (size_t j = 0; j < s->seq_k; ++j)
                        acc += host->w[j] * host->v[(kv * s->seq_k + j) * dv + c];
                    host->out[row * dv + c] = acc;
                }
            }
    if (status == CLATTN_SUCCESS) {
        size_t where = 0;
        r->tolerance = tolerance_of(shape->out_dtype);
        r->max_error = max_error(shape->out_dtype, got, host->out, no, &where);
        snprintf(r->why, sizeof r->why, "out[%zu] of (%zu, %zu, %zu, %zu)", where, s->batch,
                 s->heads, s->seq_q, dv);
    }
    if (status == CLATTN_SUCCESS && shape->has_lse && s->norm == CLATTN_NORM_SOFTMAX &&
        (status = download(&chain, lse.mem, rows * sizeof(float), got)) == CLATTN_SUCCESS) {
        for (size_t i = 0; i < rows; ++i) { /* (rows that keep nothing: -inf, not compared) */
            const double g = decode_one(CLATTN_DTYPE_F32, got, i);
            const double e = !isfinite(host->lse[i]) ? 0.0 : isnan(g) ? INFINITY
                                                                      : fabs(g - host->lse[i]);
            if (e > r->max_error && e > r->tolerance) {
                r->max_error = e;
                snprintf(r->why, sizeof r->why, "lse[%zu] of %zu rows", i, rows);
            }
        }
    }
    clattn__chain_push(&chain, NULL);
done:
    free(bytes);
    free(got);
    return status;
}

static clattn_status flash_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const clattn__flash_plan *prepared = unit;
    const char *unprobed = flash_unprobed(&prepared->shape.score);
    if (unprobed) {
        r->checked = false;
        snprintf(r->why, sizeof r->why, "%s", unprobed);
        return CLATTN_SUCCESS;
    }
    clattn__flash_plan run;
    probe_flash_plan(prepared, &run);
    probe_mem pm = {.count = 0};
    flash_host host;
    memset(&host, 0, sizeof host);
    probe_inputs in;
    memset(&in, 0, sizeof in);
    const clattn_status status = run_flash_probe(ctx, &run, &pm, &host, &in, r);
    release_all(&pm);
    free_flash_host(&host);
    free_inputs(&in);
    return status;
}

clattn_status clattn__flash_trust(clattn_ctx *ctx, clattn__flash_plan *plan)
{
    cl_kernel *slots[2] = {&plan->kernel, &plan->merge};
    return clattn__trust(ctx, "flash attention", slots, plan->splits > 1 ? 2 : 1, flash_probe,
                         plan);
}

/* ---- softmax rows -------------------------------------------------------------------------- */

static clattn_status softmax_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const clattn__softmax_plan *prepared = unit;
    if (prepared->score.flex_id || prepared->score.dropout) {
        r->checked = false;
        snprintf(r->why, sizeof r->why, "%s",
                 prepared->score.flex_id ? "user score functions (flex)" : "dropout");
        return CLATTN_SUCCESS;
    }
    clattn__softmax_plan run = *prepared;
    clattn__score_shape *s = &run.score;
    s->batch = at_most(s->batch, 2);
    s->heads = at_most(s->heads, 2);
    s->seq_q = at_most(s->seq_q, 19);
    s->seq_k = at_most(s->seq_k, 77);
    s->kv_group = 1;
    run.rows = s->batch * s->heads * s->seq_q;
    /* a work-group per row, or a work-item per row in groups of `local` (a build option) */
    run.global = prepared->global == prepared->rows * prepared->local
                     ? run.rows * run.local
                     : (run.rows + run.local - 1) / run.local * run.local;
    const size_t count = run.rows * s->seq_k;
    probe_rng rng = {0xab5eedULL + count};
    probe_mem pm = {.count = 0};
    probe_inputs in;
    clattn__score_masks masks;
    double *raw = malloc(count * sizeof(double)), *want = malloc(count * sizeof(double));
    float *host = malloc(count * sizeof(float) + 4);
    clattn_status status = CLATTN_SUCCESS;
    memset(&in, 0, sizeof in);
    if (!raw || !want || !host) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    for (size_t i = 0; i < count; ++i)
        host[i] = (float)(raw[i] = 4.0 * grid_value(&rng, CLATTN_DTYPE_F32));
    cl_mem in_mem = NULL, out_mem = NULL;
    if ((status = draw_modifiers(ctx, &rng, s, &pm, &in, &masks)) ||
        (status = upload(ctx, &pm, host, count * sizeof(float), &in_mem)) ||
        (status = upload(ctx, &pm, NULL, count * sizeof(float), &out_mem)))
        goto done;
    const clattn__view raw_view = packed_view(in_mem, CLATTN_DTYPE_F32, s->batch, s->heads,
                                              s->seq_q, s->seq_k);
    const clattn__view out_view = packed_view(out_mem, CLATTN_DTYPE_F32, s->batch, s->heads,
                                              s->seq_q, s->seq_k);
    clattn_chain chain = probe_chain(ctx);
    status = clattn__softmax_enqueue(&chain, &run, &raw_view, &out_view, &masks);
    if (status == CLATTN_SUCCESS)
        status = download(&chain, out_mem, count * sizeof(float), host);
    clattn__chain_push(&chain, NULL);
    for (size_t row = 0; row < run.rows; ++row) {
        double lse;
        const size_t b = row / (s->heads * s->seq_q), h = row / s->seq_q % s->heads;
        reference_row(&in.scores, b, h, row % s->seq_q, raw + row * s->seq_k,
                      want + row * s->seq_k, &lse, NULL);
    }
    if (status == CLATTN_SUCCESS) {
        size_t where = 0;
        r->tolerance = 2e-5;
        r->max_error = max_error(CLATTN_DTYPE_F32, (const unsigned char *)host, want, count,
                                 &where);
        snprintf(r->why, sizeof r->why, "weight %zu of (%zu, %zu, %zu, %zu)", where, s->batch,
                 s->heads, s->seq_q, s->seq_k);
    }
done:
    release_all(&pm);
    free_inputs(&in);
    free(raw);
    free(want);
    free(host);
    return status;
}

clattn_status clattn__softmax_trust(clattn_ctx *ctx, clattn__softmax_plan *plan)
{
    cl_kernel *slots[1] = {&plan->kernel};
    return clattn__trust(ctx, "softmax rows", slots, 1, softmax_probe, plan);
}

/* ---- matmul -------------------------------------------------------------------------------- */

static clattn_status matmul_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const clattn__matmul_plan *prepared = unit;
    clattn__matmul_shape shape = prepared->shape;
    shape.m = 37;
    shape.n = (prepared->panel ? prepared->panel : 16) + 5;
    shape.k = 19;
    shape.batch[0] = 1;
    shape.batch[1] = 2;
    shape.b_group = 1;
    clattn__matmul_plan run;
    clattn_status status = clattn__matmul_prepare(ctx, &shape, &run);
    if (status != CLATTN_SUCCESS)
        return status;
    run.kernel = prepared->kernel; /* the kernels judged, whatever prepare found */
    run.pack = prepared->pack;
    const size_t m = shape.m, n = shape.n, k = shape.k, na = 2 * m * k, nb = 2 * k * n;
    probe_rng rng = {0x3a7a11ULL + n};
    probe_mem pm = {.count = 0};
    double *a = malloc((na + nb + n + 2 * m * n) * sizeof(double));
    unsigned char *bytes = malloc(4 * (na + nb + n + 2 * m * n) + 4);
    cl_mem ma = NULL, mb = NULL, mbias = NULL, mc = NULL, scratch = NULL;
    if (!a || !bytes) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    double *b = a + na, *bias = b + nb, *want = bias + n;
    for (size_t i = 0; i < na + nb + n; ++i)
        a[i] = grid_value(&rng, CLATTN_DTYPE_F32);
    encode(shape.a_dtype, a, na, bytes);
    if ((status = upload(ctx, &pm, bytes, elem_bytes(shape.a_dtype, na), &ma)))
        goto done;
    encode(shape.b_dtype, b, nb, bytes);
    if ((status = upload(ctx, &pm, bytes, elem_bytes(shape.b_dtype, nb), &mb)))
        goto done;
    encode(CLATTN_DTYPE_F32, bias, n, bytes);
    if ((status = upload(ctx, &pm, bytes, 4 * n, &mbias)) ||
        (status = upload(ctx, &pm, NULL, elem_bytes(shape.c_dtype, 2 * m * n), &mc)) ||
        (status = upload(ctx, &pm, NULL, run.scratch_floats * sizeof(float), &scratch)))
        goto done;
    const clattn__view va = shape.trans_a ? packed_view(ma, shape.a_dtype, 1, 2, k, m)
                                          : packed_view(ma, shape.a_dtype, 1, 2, m, k);
    const clattn__view vb = shape.trans_b ? packed_view(mb, shape.b_dtype, 1, 2, n, k)
                                          : packed_view(mb, shape.b_dtype, 1, 2, k, n);
    const clattn__view vbias = packed_view(mbias, CLATTN_DTYPE_F32, 1, 1, 1, n);
    const clattn__view vc = packed_view(mc, shape.c_dtype, 1, 2, m, n);
    clattn_chain chain = probe_chain(ctx);
    status = clattn__matmul_enqueue(&chain, &run, &va, &vb, &vbias, &vc, 0.5f, 0.0f,
                                    (clattn__scratch){scratch, 0});
    if (status == CLATTN_SUCCESS)
        status = download(&chain, mc, elem_bytes(shape.c_dtype, 2 * m * n), bytes);
    clattn__chain_push(&chain, NULL);
    for (size_t e = 0; e < 2; ++e)
        for (size_t i = 0; i < m; ++i)
            for (size_t j = 0; j < n; ++j) {
                double acc = 0.0;
                for (size_t c = 0; c < k; ++c)
                    acc += a[e * m * k + (shape.trans_a ? c * m + i : i * k + c)] *
                           b[e * k * n + (shape.trans_b ? j * k + c : c * n + j)];
                want[(e * m + i) * n + j] = 0.5 * acc + (shape.has_bias ? bias[j] : 0.0);
            }
    if (status == CLATTN_SUCCESS) {
        size_t where = 0;
        r->tolerance = tolerance_of(shape.c_dtype) * 8;
        r->max_error = max_error(shape.c_dtype, bytes, want, 2 * m * n, &where);
        snprintf(r->why, sizeof r->why, "c[%zu] of (2, %zu, %zu), k %zu", where, m, n, k);
    }
done:
    release_all(&pm);
    free(a);
    free(bytes);
    return status;
}

clattn_status clattn__matmul_trust(clattn_ctx *ctx, clattn__matmul_plan *plan)
{
    cl_kernel *slots[2] = {&plan->kernel, &plan->pack};
    return clattn__trust(ctx, "matmul", slots, plan->pack ? 2 : 1, matmul_probe, plan);
}

/* ---- attention backward -------------------------------------------------------------------- */

typedef struct bwd_host {
    double *q, *k, *v, *o, *go, *dq, *dk, *dv, *raw, *w, *dcap, *lse;
    unsigned char *bytes;
} bwd_host;

static void free_bwd_host(bwd_host *h)
{
    double *all[] = {h->q, h->k, h->v, h->o, h->go, h->dq, h->dk, h->dv, h->raw, h->w, h->dcap,
                     h->lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        free(all[i]);
    free(h->bytes);
}

/* dQ, dK, dV in float64: P from the score rule, delta = rowsum(dO * O) of the O given, dS =
 * P (dP - delta) times the soft-cap's derivative, summed over a k/v head's query group. */
static void reference_backward(const clattn__flash_bwd_shape *shape, const probe_scores *ps,
                               bwd_host *h)
{
    const clattn__score_shape *s = &shape->score;
    const size_t group = s->kv_group > 1 ? s->kv_group : 1, kv_heads = s->heads / group;
    const size_t dk = shape->head_dim_qk, dv = shape->head_dim_v;
    memset(h->dk, 0, s->batch * kv_heads * s->seq_k * dk * sizeof(double));
    memset(h->dv, 0, s->batch * kv_heads * s->seq_k * dv * sizeof(double));
    for (size_t b = 0; b < s->batch; ++b)
        for (size_t hd = 0; hd < s->heads; ++hd)
            for (size_t i = 0; i < s->seq_q; ++i) {
                const size_t row = (b * s->heads + hd) * s->seq_q + i;
                const size_t kv = b * kv_heads + hd / group;
                const double *qi = h->q + row * dk, *gi = h->go + row * dv;
                for (size_t j = 0; j < s->seq_k; ++j) {
                    double dot = 0.0;
                    for (size_t c = 0; c < dk; ++c)
                        dot += qi[c] * h->k[(kv * s->seq_k + j) * dk + c];
                    h->raw[j] = dot;
                }
                double lse;
                reference_row(ps, b, hd, i, h->raw, h->w, &lse, h->dcap);
                h->lse[row] = lse;
                double delta = 0.0;
                for (size_t c = 0; c < dv; ++c)
                    delta += gi[c] * h->o[row * dv + c];
                for (size_t c = 0; c < dk; ++c)
                    h->dq[row * dk + c] = 0.0;
                for (size_t j = 0; j < s->seq_k; ++j) {
                    const double p = h->w[j];
                    if (p == 0.0)
                        continue;
                    double dp = 0.0;
                    for (size_t c = 0; c < dv; ++c) {
                        dp += gi[c] * h->v[(kv * s->seq_k + j) * dv + c];
                        h->dv[(kv * s->seq_k + j) * dv + c] += p * gi[c];
                    }
                    const double ds = p * (dp - delta) * h->dcap[j] * s->scale;
                    for (size_t c = 0; c < dk; ++c) {
                        h->dq[row * dk + c] += ds * h->k[(kv * s->seq_k + j) * dk + c];
                        h->dk[(kv * s->seq_k + j) * dk + c] += ds * qi[c];
                    }
                }
            }
}

static clattn_status upload_values(clattn_ctx *ctx, probe_mem *pm, clattn_dtype dtype,
                                   const double *x, size_t count, unsigned char *bytes,
                                   cl_mem *out)
{
    encode(dtype, x, count, bytes);
    return upload(ctx, pm, bytes, elem_bytes(dtype, count), out);
}

static const char *bwd_unprobed(const clattn__flash_bwd_shape *shape)
{
    const clattn__score_shape *s = &shape->score;
    return s->varlen                        ? "packed sequences (cu_seqlens)"
           : s->flex_id                     ? "user score functions (flex)"
           : s->dropout                     ? "dropout"
           : s->norm == CLATTN_NORM_RELU    ? "relu normalisation"
           : shape->want_dmask              ? "the mask's gradient"
           : shape->want_dsinks             ? "the sinks' gradient"
                                            : NULL;
}

static clattn_status run_bwd_probe(clattn_ctx *ctx, const clattn__flash_bwd_plan *run,
                                   probe_mem *pm, bwd_host *h, probe_inputs *in,
                                   clattn__probe_result *r)
{
    const clattn__flash_bwd_shape *shape = &run->shape;
    const clattn__score_shape *s = &shape->score;
    const size_t group = s->kv_group > 1 ? s->kv_group : 1, kv_heads = s->heads / group;
    const size_t dk = shape->head_dim_qk, dv = shape->head_dim_v;
    const size_t rows = s->batch * s->heads * s->seq_q;
    const size_t nq = rows * dk, no = rows * dv;
    const size_t nk = s->batch * kv_heads * s->seq_k * dk, nv = s->batch * kv_heads * s->seq_k * dv;
    const size_t most = nq > nk ? (nq > nv ? nq : nv) : (nk > nv ? nk : nv);
    probe_rng rng = {0xbac4ULL + dk * 7 + s->seq_k};
    double **arrays[] = {&h->q, &h->k, &h->v, &h->o, &h->go, &h->dq, &h->dk, &h->dv};
    const size_t counts[] = {nq, nk, nv, no, no, nq, nk, nv};
    for (int i = 0; i < 8; ++i)
        *arrays[i] = malloc(counts[i] * sizeof(double) + 8);
    h->raw = malloc(s->seq_k * sizeof(double));
    h->w = malloc(s->seq_k * sizeof(double));
    h->dcap = malloc(s->seq_k * sizeof(double));
    h->lse = malloc(rows * sizeof(double));
    h->bytes = malloc(4 * (most > rows ? most : rows) + 8);
    for (int i = 0; i < 8; ++i)
        if (*arrays[i] == NULL)
            return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
    if (!h->raw || !h->w || !h->dcap || !h->lse || !h->bytes)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
    const clattn_dtype in_dtypes[5] = {shape->q_dtype, shape->k_dtype, shape->v_dtype,
                                       shape->o_dtype, shape->go_dtype};
    for (int i = 0; i < 5; ++i)
        for (size_t e = 0; e < counts[i]; ++e)
            (*arrays[i])[e] = grid_value(&rng, in_dtypes[i]);
    clattn__flash_bwd_io io;
    memset(&io, 0, sizeof io);
    clattn_status status = draw_modifiers(ctx, &rng, s, pm, in, &io.masks);
    if (status)
        return status;
    reference_backward(shape, &in->scores, h);
    cl_mem mems[9] = {NULL};
    for (int i = 0; i < 5 && status == CLATTN_SUCCESS; ++i)
        status = upload_values(ctx, pm, in_dtypes[i], *arrays[i], counts[i], h->bytes, &mems[i]);
    float *lse = (float *)h->bytes;
    for (size_t i = 0; i < rows; ++i)
        lse[i] = (float)h->lse[i];
    const clattn_dtype out_dtypes[3] = {shape->dq_dtype, shape->dk_dtype, shape->dv_dtype};
    cl_mem scratch = NULL;
    if (status == CLATTN_SUCCESS &&
        ((status = upload(ctx, pm, lse, rows * sizeof(float), &mems[5])) ||
         (status = upload(ctx, pm, NULL, elem_bytes(out_dtypes[0], nq), &mems[6])) ||
         (status = upload(ctx, pm, NULL, elem_bytes(out_dtypes[1], nk), &mems[7])) ||
         (status = upload(ctx, pm, NULL, elem_bytes(out_dtypes[2], nv), &mems[8])) ||
         (status = upload(ctx, pm, NULL, run->scratch_floats * sizeof(float), &scratch))))
        return status;
    if (status)
        return status;
    io.q = packed_view(mems[0], shape->q_dtype, s->batch, s->heads, s->seq_q, dk);
    io.k = packed_view(mems[1], shape->k_dtype, s->batch, kv_heads, s->seq_k, dk);
    io.v = packed_view(mems[2], shape->v_dtype, s->batch, kv_heads, s->seq_k, dv);
    io.out = packed_view(mems[3], shape->o_dtype, s->batch, s->heads, s->seq_q, dv);
    io.grad_out = packed_view(mems[4], shape->go_dtype, s->batch, s->heads, s->seq_q, dv);
    io.lse = packed_view(mems[5], CLATTN_DTYPE_F32, 1, s->batch, s->heads, s->seq_q);
    io.dq = packed_view(mems[6], out_dtypes[0], s->batch, s->heads, s->seq_q, dk);
    io.dk = packed_view(mems[7], out_dtypes[1], s->batch, kv_heads, s->seq_k, dk);
    io.dv = packed_view(mems[8], out_dtypes[2], s->batch, kv_heads, s->seq_k, dv);
    clattn_chain chain = probe_chain(ctx);
    status = clattn__flash_bwd_enqueue(&chain, run, &io, (clattn__scratch){scratch, 0});
    const double *want[3] = {h->dq, h->dk, h->dv};
    const size_t sizes[3] = {nq, nk, nv};
    static const char *const names[3] = {"dq", "dk", "dv"};
    r->tolerance = 0.0;
    for (int i = 0; i < 3 && status == CLATTN_SUCCESS; ++i) {
        status = download(&chain, mems[6 + i], elem_bytes(out_dtypes[i], sizes[i]), h->bytes);
        if (status)
            break;
        /* gradients grow with the keys summed: the bound scales with seq_k */
        const double tol = tolerance_of(out_dtypes[i]) * 8;
        size_t where = 0;
        const double err = max_error(out_dtypes[i], h->bytes, want[i], sizes[i], &where);
        if (i == 0 || err / tol > r->max_error / r->tolerance) {
            r->max_error = err;
            r->tolerance = tol;
            snprintf(r->why, sizeof r->why, "%s[%zu] of %zu", names[i], where, sizes[i]);
        }
    }
    clattn__chain_push(&chain, NULL);
    return status;
}

static clattn_status bwd_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const clattn__flash_bwd_plan *prepared = unit;
    const char *unprobed = bwd_unprobed(&prepared->shape);
    clattn__flash_bwd_shape shape = prepared->shape;
    clattn__score_shape *s = &shape.score;
    const size_t group = s->kv_group > 1 ? s->kv_group : 1;
    s->batch = at_most(s->batch, 2);
    s->heads = at_most(s->heads / group, 2) * group;
    s->seq_q = at_most(s->seq_q, 19);
    s->seq_k = at_most(s->seq_k, 37);
    clattn__flash_bwd_plan run;
    clattn_status status = unprobed ? CLATTN_SUCCESS : clattn__flash_bwd_prepare(ctx, &shape, &run);
    if (status != CLATTN_SUCCESS)
        return status;
    /* the judged kernels in the probe's plan (its sizes may take another variant: then not
     * probed) */
    cl_kernel *mine[3] = {&run.delta, &run.dkdv, &run.dq};
    const cl_kernel judged[3] = {prepared->delta, prepared->dkdv, prepared->dq};
    for (int i = 0; i < 3 && !unprobed; ++i) {
        if (!clattn__same_variant(ctx, judged[i], *mine[i]))
            unprobed = "the probe's sizes take another variant";
        *mine[i] = judged[i];
    }
    if (unprobed) {
        r->checked = false;
        snprintf(r->why, sizeof r->why, "%s", unprobed);
        return CLATTN_SUCCESS;
    }
    probe_mem pm = {.count = 0};
    bwd_host host;
    memset(&host, 0, sizeof host);
    probe_inputs in;
    memset(&in, 0, sizeof in);
    status = run_bwd_probe(ctx, &run, &pm, &host, &in, r);
    release_all(&pm);
    free_bwd_host(&host);
    free_inputs(&in);
    return status;
}

clattn_status clattn__flash_bwd_trust(clattn_ctx *ctx, clattn__flash_bwd_plan *plan)
{
    cl_kernel *slots[3] = {&plan->dkdv, plan->dq_slots ? &plan->delta : &plan->dq, &plan->delta};
    return clattn__trust(ctx, "attention backward", slots, plan->dq_slots ? 2 : 3, bwd_probe,
                         plan);
}

/* ---- strided copies and the mean over heads (heads.cl) ------------------------------------- */

/* copy4d over a (2, 3, 5, 7) box (block destinations: unprobed) from a packed source into a
 * destination with a row gap, converting dtypes. */
static clattn_status copy_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const struct copy_unit {
        clattn__copy_plan *plan;
        clattn_dtype src, dst;
    } *u = unit;
    size_t block = 1, bytes = 0, src_block = 1;
    clattn__dtype_blocks(u->src, &src_block, &bytes);
    if ((clattn__dtype_blocks(u->dst, &block, &bytes) && block > 1) || src_block > 1) {
        r->checked = false;
        snprintf(r->why, sizeof r->why, "blocks (a quantizing or dequantizing copy)");
        return CLATTN_SUCCESS;
    }
    const size_t dims[4] = {2, 3, 5, 7}, n = 2 * 3 * 5 * 7, gap = 3;
    clattn__copy_plan run;
    clattn_status status = clattn__copy_prepare(ctx, dims, u->src, u->dst, &run);
    if (status != CLATTN_SUCCESS)
        return status;
    run.kernel = u->plan->kernel;
    probe_rng rng = {0xc0ffeeULL};
    probe_mem pm = {.count = 0};
    const size_t padded = 2 * 3 * 5 * (7 + gap);
    double *x = malloc(padded * sizeof(double)), *want = malloc(padded * sizeof(double));
    unsigned char *host = malloc(4 * padded + 8);
    cl_mem src = NULL, dst = NULL;
    if (!x || !want || !host) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    for (size_t i = 0; i < n; ++i)
        x[i] = grid_value(&rng, u->src);
    encode(u->src, x, n, host);
    if ((status = upload(ctx, &pm, host, elem_bytes(u->src, n), &src)) ||
        (status = upload(ctx, &pm, NULL, elem_bytes(u->dst, padded), &dst)))
        goto done;
    const clattn__view vs = packed_view(src, u->src, 2, 3, 5, 7);
    clattn__view vd = packed_view(dst, u->dst, 2, 3, 5, 7 + gap);
    vd.dims[3] = 7;
    clattn_chain chain = probe_chain(ctx);
    status = clattn__copy_enqueue(&chain, &run, &vs, &vd);
    if (status == CLATTN_SUCCESS)
        status = download(&chain, dst, elem_bytes(u->dst, padded), host);
    clattn__chain_push(&chain, NULL);
    if (status == CLATTN_SUCCESS) {
        size_t worst = 0;
        r->tolerance = tolerance_of(u->dst);
        r->max_error = 0.0;
        for (size_t row = 0; row < 30; ++row)
            for (size_t c = 0; c < 7; ++c) {
                const double g = decode_one(u->dst, host, row * (7 + gap) + c);
                const double e = isnan(g) ? INFINITY : fabs(g - x[row * 7 + c]);
                if (e > r->max_error) {
                    r->max_error = e;
                    worst = row * 7 + c;
                }
            }
        snprintf(r->why, sizeof r->why, "element %zu of (2, 3, 5, 7)", worst);
    }
done:
    release_all(&pm);
    free(x);
    free(want);
    free(host);
    return status;
}

clattn_status clattn__copy_trust(clattn_ctx *ctx, clattn__copy_plan *plan, clattn_dtype src,
                                 clattn_dtype dst)
{
    struct copy_unit {
        clattn__copy_plan *plan;
        clattn_dtype src, dst;
    } unit = {plan, src, dst};
    cl_kernel *slots[1] = {&plan->kernel};
    return clattn__trust(ctx, "strided copy", slots, 1, copy_probe, &unit);
}

/* mean_heads over (2, 3, 7, 11) weights into (1, 2, 7, 11). */
static clattn_status mean_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const clattn__mean_heads_plan *prepared = unit;
    clattn__mean_heads_plan run;
    clattn_status status = clattn__mean_heads_prepare(ctx, 2, 3, 7, 11, &run);
    if (status != CLATTN_SUCCESS)
        return status;
    run.kernel = prepared->kernel;
    const size_t n = 2 * 3 * 7 * 11, m = 2 * 7 * 11;
    probe_rng rng = {0x3ea11ULL};
    probe_mem pm = {.count = 0};
    float *x = malloc(n * sizeof(float)), *got = malloc(m * sizeof(float));
    double *want = calloc(m, sizeof(double));
    cl_mem src = NULL, dst = NULL;
    if (!x || !got || !want) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    for (size_t i = 0; i < n; ++i)
        x[i] = (float)grid_value(&rng, CLATTN_DTYPE_F32);
    for (size_t b = 0; b < 2; ++b)
        for (size_t h = 0; h < 3; ++h)
            for (size_t e = 0; e < 77; ++e)
                want[b * 77 + e] += x[(b * 3 + h) * 77 + e] / 3.0;
    if ((status = upload(ctx, &pm, x, n * sizeof(float), &src)) ||
        (status = upload(ctx, &pm, NULL, m * sizeof(float), &dst)))
        goto done;
    const clattn__view vs = packed_view(src, CLATTN_DTYPE_F32, 2, 3, 7, 11);
    const clattn__view vd = packed_view(dst, CLATTN_DTYPE_F32, 1, 2, 7, 11);
    clattn_chain chain = probe_chain(ctx);
    status = clattn__mean_heads_enqueue(&chain, &run, &vs, &vd);
    if (status == CLATTN_SUCCESS)
        status = download(&chain, dst, m * sizeof(float), got);
    clattn__chain_push(&chain, NULL);
    if (status == CLATTN_SUCCESS) {
        size_t where = 0;
        r->tolerance = 1e-6;
        r->max_error = max_error(CLATTN_DTYPE_F32, (const unsigned char *)got, want, m, &where);
        snprintf(r->why, sizeof r->why, "mean %zu of (1, 2, 7, 11)", where);
    }
done:
    release_all(&pm);
    free(x);
    free(got);
    free(want);
    return status;
}

clattn_status clattn__mean_heads_trust(clattn_ctx *ctx, clattn__mean_heads_plan *plan)
{
    cl_kernel *slots[1] = {&plan->kernel};
    return clattn__trust(ctx, "mean over heads", slots, 1, mean_probe, plan);
}

/* ---- rotary embeddings (rope.cl) ----------------------------------------------------------- */

typedef struct rope_unit {
    clattn__rope_plan *plan;
    clattn_dtype x, out, cache;
} rope_unit;

/* The plan's rotation (its pairs or halves, rot of dim, its cache mode) over (2, 3, 5, dim)
 * rows from position 3: angles pos * w_j for grid frequencies w_j, or grid cos and sin caches
 * (by position: 9 rows; by row). */
static clattn_status rope_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const rope_unit *u = unit;
    clattn__rope_shape shape = u->plan->shape;
    shape.batch = 2, shape.heads = 3, shape.seq = 5, shape.start = 3;
    clattn__rope_plan run;
    clattn_status status = clattn__rope_prepare(ctx, &shape, u->x, u->out, u->cache, &run);
    if (status != CLATTN_SUCCESS)
        return status;
    run.kernel = u->plan->kernel;
    const size_t rows = 2 * 3 * 5, dim = shape.dim, half = shape.rot / 2, n = rows * dim;
    const size_t cache_rows = shape.cache_mode == 1 ? 9 : 10; /* by row: (2, 5) rows */
    probe_rng rng = {0x20beULL + dim};
    probe_mem pm = {.count = 0};
    double *x = malloc(n * sizeof(double)), *want = malloc(n * sizeof(double));
    double *c = malloc((2 * cache_rows * half + 1) * sizeof(double));
    float *freq = malloc((2 * half + 1) * sizeof(float));
    unsigned char *bytes = malloc(4 * (n > 2 * cache_rows * half ? n : 2 * cache_rows * half) + 8);
    clattn__rope_io io;
    memset(&io, 0, sizeof io);
    cl_mem mx = NULL, mo = NULL, mcos = NULL, msin = NULL;
    if (!x || !want || !c || !freq || !bytes) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    for (size_t i = 0; i < n; ++i)
        x[i] = grid_value(&rng, u->x);
    for (size_t j = 0; j < half; ++j) {
        freq[2 * j] = (float)((1 + next_u32(&rng) % 64) / 64.0);
        freq[2 * j + 1] = 0.0f;
    }
    for (size_t i = 0; i < 2 * cache_rows * half; ++i)
        c[i] = grid_value(&rng, u->cache);
    for (size_t row = 0; row < rows; ++row) {
        const size_t s = row % 5, b = row / 15, pos = 3 + s;
        const size_t at = shape.cache_mode == 1 ? (pos < cache_rows ? pos : cache_rows - 1)
                                                : b * 5 + s;
        for (size_t i = 0; i < dim; ++i)
            want[row * dim + i] = x[row * dim + i];
        for (size_t j = 0; j < half; ++j) {
            const double t = (double)pos * freq[2 * j];
            const double ct = shape.cache_mode ? c[at * half + j] : cos(t);
            const double st = shape.cache_mode ? c[cache_rows * half + at * half + j] : sin(t);
            const size_t i1 = shape.pairs ? 2 * j : j, i2 = shape.pairs ? 2 * j + 1 : j + half;
            const double x1 = x[row * dim + i1], x2 = x[row * dim + i2];
            want[row * dim + i1] = x1 * ct - x2 * st;
            want[row * dim + i2] = x1 * st + x2 * ct;
        }
    }
    encode(u->x, x, n, bytes);
    if ((status = upload(ctx, &pm, bytes, elem_bytes(u->x, n), &mx)) ||
        (status = upload(ctx, &pm, NULL, elem_bytes(u->out, n), &mo)))
        goto done;
    if (shape.cache_mode) {
        encode(u->cache, c, 2 * cache_rows * half, bytes);
        if ((status = upload(ctx, &pm, bytes, elem_bytes(u->cache, cache_rows * half), &mcos)) ||
            (status = upload(ctx, &pm, bytes + elem_bytes(u->cache, cache_rows * half),
                             elem_bytes(u->cache, cache_rows * half), &msin)))
            goto done;
        io.cos = shape.cache_mode == 1 ? packed_view(mcos, u->cache, 1, 1, cache_rows, half)
                                       : packed_view(mcos, u->cache, 1, 2, 5, half);
        io.sin = io.cos;
        io.sin.mem = msin;
    } else if ((status = upload(ctx, &pm, freq, 2 * half * sizeof(float), &io.freq))) {
        goto done;
    }
    io.x = packed_view(mx, u->x, 2, 3, 5, dim);
    io.out = packed_view(mo, u->out, 2, 3, 5, dim);
    clattn_chain chain = probe_chain(ctx);
    status = clattn__rope_enqueue(&chain, &run, &io);
    if (status == CLATTN_SUCCESS)
        status = download(&chain, mo, elem_bytes(u->out, n), bytes);
    clattn__chain_push(&chain, NULL);
    if (status == CLATTN_SUCCESS) {
        size_t where = 0;
        r->tolerance = tolerance_of(u->out) * 2;
        r->max_error = max_error(u->out, bytes, want, n, &where);
        snprintf(r->why, sizeof r->why, "element %zu of (2, 3, 5, %zu)", where, dim);
    }
done:
    release_all(&pm);
    free(x);
    free(want);
    free(c);
    free(freq);
    free(bytes);
    return status;
}

clattn_status clattn__rope_trust(clattn_ctx *ctx, clattn__rope_plan *plan, clattn_dtype x,
                                 clattn_dtype out, clattn_dtype cache)
{
    rope_unit unit = {plan, x, out, cache};
    cl_kernel *slots[1] = {&plan->kernel};
    return clattn__trust(ctx, "rotary embedding", slots, 1, rope_probe, &unit);
}

/* ---- positional encodings (posenc.cl) ------------------------------------------------------ */

typedef struct posenc_unit {
    clattn__posenc_plan *plan;
    clattn_dtype x, out, table;
} posenc_unit;

/* Over (2, 3, 5, dim) from position 3: x + the sinusoid of grid frequencies, then a grid
 * table's rows without x. */
static clattn_status posenc_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const posenc_unit *u = unit;
    const size_t dim = u->plan->dims[3], dims[4] = {2, 3, 5, dim}, n = 30 * dim, start = 3;
    clattn__posenc_plan run;
    clattn_status status = clattn__posenc_prepare(ctx, dims, u->x, u->out, u->table, &run);
    if (status != CLATTN_SUCCESS)
        return status;
    run.kernel = u->plan->kernel;
    probe_rng rng = {0x9e5ULL + dim};
    probe_mem pm = {.count = 0};
    const size_t pairs = (dim + 1) / 2, rows = start + 5;
    double *x = malloc(n * sizeof(double)), *want = malloc(n * sizeof(double));
    double *table = malloc(rows * dim * sizeof(double));
    float *freq = malloc(2 * pairs * sizeof(float));
    unsigned char *bytes = malloc(4 * (n > rows * dim ? n : rows * dim) + 8);
    cl_mem mx = NULL, mo = NULL, mt = NULL, mf = NULL;
    if (!x || !want || !table || !freq || !bytes) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    for (size_t i = 0; i < n; ++i)
        x[i] = grid_value(&rng, u->x);
    for (size_t i = 0; i < rows * dim; ++i)
        table[i] = grid_value(&rng, u->table);
    for (size_t j = 0; j < pairs; ++j) {
        freq[2 * j] = (float)((1 + next_u32(&rng) % 64) / 64.0);
        freq[2 * j + 1] = 0.0f;
    }
    encode(u->x, x, n, bytes);
    if ((status = upload(ctx, &pm, bytes, elem_bytes(u->x, n), &mx)) ||
        (status = upload(ctx, &pm, NULL, elem_bytes(u->out, n), &mo)) ||
        (status = upload(ctx, &pm, freq, 2 * pairs * sizeof(float), &mf)))
        goto done;
    encode(u->table, table, rows * dim, bytes);
    if ((status = upload(ctx, &pm, bytes, elem_bytes(u->table, rows * dim), &mt)))
        goto done;
    const clattn__view vx = packed_view(mx, u->x, 2, 3, 5, dim);
    const clattn__view vo = packed_view(mo, u->out, 2, 3, 5, dim);
    const clattn__view none = {0};
    const clattn__view vt = packed_view(mt, u->table, 1, 1, rows, dim);
    r->tolerance = tolerance_of(u->out) * 4;
    r->max_error = 0.0;
    for (int pass = 0; pass < 2 && status == CLATTN_SUCCESS; ++pass) {
        for (size_t e = 0; e < n; ++e) {
            const size_t i = e % dim, p = e / dim % 5;
            const double t = (double)(start + p) * freq[2 * (i / 2)];
            want[e] = pass == 0 ? x[e] + (i & 1 ? cos(t) : sin(t)) : table[(start + p) * dim + i];
        }
        clattn_chain chain = probe_chain(ctx);
        status = clattn__posenc_enqueue(&chain, &run, pass == 0 ? &vx : &none, &vo,
                                        pass == 0 ? &none : &vt, pass == 0 ? mf : NULL, start);
        if (status == CLATTN_SUCCESS)
            status = download(&chain, mo, elem_bytes(u->out, n), bytes);
        clattn__chain_push(&chain, NULL);
        size_t where = 0;
        const double err = status == CLATTN_SUCCESS ? max_error(u->out, bytes, want, n, &where)
                                                    : 0.0;
        if (err > r->max_error) {
            r->max_error = err;
            snprintf(r->why, sizeof r->why, "element %zu of (2, 3, 5, %zu), %s", where, dim,
                     pass == 0 ? "x + the sinusoid" : "the table");
        }
    }
done:
    release_all(&pm);
    free(x);
    free(want);
    free(table);
    free(freq);
    free(bytes);
    return status;
}

clattn_status clattn__posenc_trust(clattn_ctx *ctx, clattn__posenc_plan *plan, clattn_dtype x,
                                   clattn_dtype out, clattn_dtype table)
{
    posenc_unit unit = {plan, x, out, table};
    cl_kernel *slots[1] = {&plan->kernel};
    return clattn__trust(ctx, "positional encoding", slots, 1, posenc_probe, &unit);
}

/* ---- additive attention's scores (additive.cl) --------------------------------------------- */

/* raw over (2, 2, 19, 23) with dim 37 (a chunk and a part): sum_c w[h, c] tanh(p1 + p2). */
static clattn_status additive_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const clattn__additive_plan *prepared = unit;
    const size_t b = 2, h = 2, q = 19, k = 23, d = 37;
    clattn__additive_plan run;
    clattn_status status = clattn__additive_prepare(ctx, b, h, q, k, d, &run);
    if (status != CLATTN_SUCCESS)
        return status;
    if (!clattn__same_variant(ctx, prepared->kernel, run.kernel)) {
        r->checked = false;
        snprintf(r->why, sizeof r->why, "the probe's sizes take another tile");
        return CLATTN_SUCCESS;
    }
    run.kernel = prepared->kernel;
    probe_rng rng = {0xadd1ULL};
    probe_mem pm = {.count = 0};
    const size_t n1 = b * h * q * d, n2 = b * h * k * d, nw = h * d, nr = b * h * q * k;
    float *host = malloc((n1 + n2 + nw) * sizeof(float));
    float *got = malloc(nr * sizeof(float));
    double *want = malloc(nr * sizeof(double));
    cl_mem m1 = NULL, m2 = NULL, mw = NULL, mr = NULL;
    if (!host || !got || !want) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    for (size_t i = 0; i < n1 + n2 + nw; ++i)
        host[i] = (float)(2.0 * grid_value(&rng, CLATTN_DTYPE_F32));
    const float *p1 = host, *p2 = host + n1, *w = host + n1 + n2;
    for (size_t bh = 0; bh < b * h; ++bh)
        for (size_t i = 0; i < q; ++i)
            for (size_t j = 0; j < k; ++j) {
                double sum = 0.0;
                for (size_t c = 0; c < d; ++c)
                    sum += (double)w[(bh % h) * d + c] *
                           tanh((double)p1[(bh * q + i) * d + c] + p2[(bh * k + j) * d + c]);
                want[(bh * q + i) * k + j] = sum;
            }
    if ((status = upload(ctx, &pm, p1, n1 * sizeof(float), &m1)) ||
        (status = upload(ctx, &pm, p2, n2 * sizeof(float), &m2)) ||
        (status = upload(ctx, &pm, w, nw * sizeof(float), &mw)) ||
        (status = upload(ctx, &pm, NULL, nr * sizeof(float), &mr)))
        goto done;
    const clattn__view v1 = packed_view(m1, CLATTN_DTYPE_F32, b, h, q, d);
    const clattn__view v2 = packed_view(m2, CLATTN_DTYPE_F32, b, h, k, d);
    const clattn__view vw = packed_view(mw, CLATTN_DTYPE_F32, 1, 1, h, d);
    const clattn__view vr = packed_view(mr, CLATTN_DTYPE_F32, b, h, q, k);
    clattn_chain chain = probe_chain(ctx);
    status = clattn__additive_enqueue(&chain, &run, &v1, &v2, &vw, &vr);
    if (status == CLATTN_SUCCESS)
        status = download(&chain, mr, nr * sizeof(float), got);
    clattn__chain_push(&chain, NULL);
    if (status == CLATTN_SUCCESS) {
        size_t where = 0;
        r->tolerance = 1e-4 * (double)d;
        r->max_error = max_error(CLATTN_DTYPE_F32, (const unsigned char *)got, want, nr, &where);
        snprintf(r->why, sizeof r->why, "raw[%zu] of (2, 2, 19, 23)", where);
    }
done:
    release_all(&pm);
    free(host);
    free(got);
    free(want);
    return status;
}

clattn_status clattn__additive_trust(clattn_ctx *ctx, clattn__additive_plan *plan)
{
    cl_kernel *slots[1] = {&plan->kernel};
    return clattn__trust(ctx, "additive scores", slots, 1, additive_probe, plan);
}
