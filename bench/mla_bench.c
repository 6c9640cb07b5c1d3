/* mla_bench: one decode step of DeepSeek's absorbed multi-head latent attention (issue 50): 128
 * query heads (one row each) over one shared latent KV head, d_qk = 576 (512 latent + 64
 * rotary columns), d_v = 512 read as a view of the same cache rows (one buffer, K's strides),
 * through a fused SDPA plan made once. Per cache length (--seq, default 1024,2048,4096,8192)
 * and cache type (F32, F16, Q8_0; paged in pages of --page-size keys, 0 = contiguous), the
 * median over --runs rounds of the step's wall time (clFinish before and after), the configs
 * taken in turns within each round (the machines are shared and noisy), after a warm-up; GB/s
 * counts the latent cache's bytes read once per step (keys x 576 elements: 2304 bytes a token
 * in F32, 1152 in F16, 612 in Q8_0).
 *
 *   mla_bench [--seq L,...] [--heads H] [--page-size P] [--runs R] [--device SPEC]
 *
 * MLA_BENCH_INFO=1 prints each plan's clattn_plan_info (the kernel and its blocks) on stderr.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench_common.h"
#include "clattn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DQK 576
#define DV 512
#define MAX_SEQS 8
#define TYPES 3

static void check(clattn_status status, clattn_ctx *ctx, const char *what)
{
    if (status != CLATTN_SUCCESS) {
        fprintf(stderr, "mla_bench: %s: %s\n", what, ctx ? clattn_last_error(ctx) : "");
        exit(1);
    }
}

static cl_mem buffer(clattn_ctx *ctx, const void *host, size_t bytes)
{
    cl_int err = CL_SUCCESS;
    const cl_mem_flags flags = CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0);
    cl_mem mem = clCreateBuffer(clattn_ctx_cl_context(ctx), flags, bytes, (void *)host, &err);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "mla_bench: clCreateBuffer(%zu bytes) failed (%d)\n", bytes, (int)err);
        exit(1);
    }
    return mem;
}

/* IEEE half of a float in [-1, 1] (round to nearest; tiny values flush to zero). */
static unsigned short to_half(float f)
{
    unsigned int x;
    memcpy(&x, &f, sizeof x);
    const unsigned int sign = (x >> 16) & 0x8000u;
    const int exp = (int)((x >> 23) & 0xff) - 127 + 15;
    if (exp <= 0)
        return (unsigned short)sign;
    unsigned int mant = (x & 0x7fffffu) + 0x1000u; /* round at bit 13 */
    unsigned int e = (unsigned int)exp;
    if (mant & 0x800000u)
        mant = 0, ++e;
    return (unsigned short)(sign | (e << 10) | (mant >> 13));
}

typedef struct config {
    clattn_dtype dtype;
    size_t keys;
    clattn_plan *plan;
    clattn_tensors t;
    cl_mem cache, table;
    double ms[64];
} config;

/* The cache (keys x 576 of dtype: F32 and F16 from the host, Q8_0 quantized on the device),
 * contiguous (1, 1, keys, 576) or a pool of shuffled pages (pages, page_size, 1, 576) with
 * its table; v the view of its first 512 columns; the plan. */
static void prepare(clattn_ctx *ctx, config *c, size_t heads, size_t page_size, cl_mem q,
                    cl_mem out, cl_mem count, const float *rows)
{
    const size_t n = c->keys, elems = n * DQK;
    const size_t pages = page_size ? (n + page_size - 1) / page_size : 0;
    clattn_tensor k = page_size ? clattn_tensor_make(NULL, 0, c->dtype, 4, pages, page_size, 1, DQK)
                                : clattn_tensor_make(NULL, 0, c->dtype, 4, 1, 1, n, DQK);
    if (page_size) { /* the pages in a random order; rows laid out through the table */
        int *table = malloc(pages * sizeof(int));
        for (size_t p = 0; p < pages; ++p)
            table[p] = (int)p;
        for (size_t p = pages - 1; p > 0; --p) {
            const size_t s = (size_t)rand() % (p + 1);
            const int tmp = table[p];
            table[p] = table[s], table[s] = tmp;
        }
        c->table = buffer(ctx, table, pages * sizeof(int));
        free(table);
    }
    if (c->dtype == CLATTN_DTYPE_F16) {
        unsigned short *h = malloc(pages ? pages * page_size * DQK * 2 : elems * 2);
        for (size_t e = 0; e < (pages ? pages * page_size : n) * DQK; ++e)
            h[e] = to_half(rows[e]);
        c->cache = buffer(ctx, h, (pages ? pages * page_size : n) * DQK * 2);
        free(h);
    } else {
        const size_t floats = (pages ? pages * page_size : n) * DQK;
        cl_mem f32 = buffer(ctx, rows, floats * 4);
        if (c->dtype == CLATTN_DTYPE_Q8_0) {
            c->cache = buffer(ctx, NULL, floats / 32 * 34);
            clattn_tensor src = k, dst = k;
            src.dtype = CLATTN_DTYPE_F32;
            src.mem = f32, dst.mem = c->cache;
            check(clattn_quantize(ctx, &src, &dst, 0, NULL, NULL), ctx, "clattn_quantize");
            check(clattn_finish(ctx), ctx, "clattn_finish");
            clReleaseMemObject(f32);
        } else {
            c->cache = f32;
        }
    }
    memset(&c->t, 0, sizeof c->t);
    c->t.q = clattn_tensor_make(q, 0, CLATTN_DTYPE_F32, 4, 1, heads, 1, DQK);
    c->t.out = clattn_tensor_make(out, 0, CLATTN_DTYPE_F32, 4, 1, heads, 1, DV);
    c->t.k = k;
    c->t.k.mem = c->cache;
    c->t.v = c->t.k;
    c->t.v.dims[3] = DV; /* the latent: a view of the key rows */
    c->t.kv_seqlen = clattn_tensor_make(count, 0, CLATTN_DTYPE_I32, 1, 1, 0, 0, 0);
    if (page_size)
        c->t.block_table = clattn_tensor_make(c->table, 0, CLATTN_DTYPE_I32, 2, 1, pages, 0, 0);
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    CLATTN_BIND_ROLES(desc, c->t);
    desc.scale = (float)(1.0 / sqrt(192.0));
    desc.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    desc.path = CLATTN_PATH_FUSED;
    check(clattn_sdpa_plan_create(ctx, &desc, &c->plan), ctx, "clattn_sdpa_plan_create");
    if (getenv("MLA_BENCH_INFO"))
        fprintf(stderr, "%s\n", clattn_plan_info(c->plan));
}

static double run_once(clattn_ctx *ctx, config *c)
{
    check(clattn_finish(ctx), ctx, "clattn_finish");
    const double start = now_ms();
    check(clattn_plan_execute(c->plan, c->t.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL),
          ctx, "clattn_plan_execute");
    check(clattn_finish(ctx), ctx, "clattn_finish");
    return now_ms() - start;
}

static size_t parse_list(const char *text, size_t *out, size_t max)
{
    size_t n = 0;
    for (const char *p = text; *p && n < max;) {
        out[n++] = strtoul(p, (char **)&p, 10);
        if (*p == ',')
            ++p;
        else
            break;
    }
    return n;
}

int main(int argc, char **argv)
{
    size_t seqs[MAX_SEQS] = {1024, 2048, 4096, 8192}, nseq = 4, heads = 128, page_size = 0;
    int runs = 15;
    const char *device = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seq"))
            nseq = parse_list(argv[i + 1], seqs, MAX_SEQS);
        else if (!strcmp(argv[i], "--heads"))
            heads = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--page-size"))
            page_size = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--runs"))
            runs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--device"))
            device = argv[i + 1];
        else {
            fprintf(stderr, "usage: mla_bench [--seq L,...] [--heads H] [--page-size P] [--runs R] "
                            "[--device SPEC]\n");
            return 2;
        }
    }
    runs = runs < 1 ? 1 : runs > 64 ? 64 : runs;
    clattn_ctx *ctx = NULL;
    char message[512] = "";
    if (clattn_ctx_create(device, &ctx, message, sizeof message) != CLATTN_SUCCESS) {
        fprintf(stderr, "mla_bench: %s\n", message);
        return 1;
    }
    static const clattn_dtype types[TYPES] = {CLATTN_DTYPE_F32, CLATTN_DTYPE_F16,
                                              CLATTN_DTYPE_Q8_0};
    static const char *names[TYPES] = {"f32", "f16", "q8_0"};
    static const double bytes_per_token[TYPES] = {DQK * 4.0, DQK * 2.0, DQK / 32 * 34.0};
    size_t max_keys = 0;
    for (size_t s = 0; s < nseq; ++s)
        max_keys = seqs[s] > max_keys ? seqs[s] : max_keys;
    const size_t max_rows = (max_keys + (page_size ? page_size : 1)) * DQK;
    float *rows = malloc(max_rows * sizeof(float)), *qh = malloc(heads * DQK * sizeof(float));
    srand(1);
    for (size_t e = 0; e < max_rows; ++e)
        rows[e] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    for (size_t e = 0; e < heads * DQK; ++e)
        qh[e] = ((float)rand() / RAND_MAX * 2.0f - 1.0f) * 0.2f;
    cl_mem q = buffer(ctx, qh, heads * DQK * sizeof(float));
    cl_mem out = buffer(ctx, NULL, heads * DV * sizeof(float));
    config *configs = calloc(nseq * TYPES, sizeof(config));
    cl_mem counts[MAX_SEQS];
    for (size_t s = 0; s < nseq; ++s) {
        const int n = (int)seqs[s];
        counts[s] = buffer(ctx, &n, sizeof n);
        for (int t = 0; t < TYPES; ++t) {
            config *c = &configs[s * TYPES + t];
            c->dtype = types[t], c->keys = seqs[s];
            prepare(ctx, c, heads, page_size, q, out, counts[s], rows);
            run_once(ctx, c); /* warm-up */
        }
    }
    for (int r = 0; r < runs; ++r) /* rounds: every config once per round, in turns */
        for (size_t i = 0; i < nseq * TYPES; ++i)
            configs[i].ms[r] = run_once(ctx, &configs[i]);
    char device_name[256] = "";
    clGetDeviceInfo(clattn_ctx_device(ctx), CL_DEVICE_NAME, sizeof device_name, device_name, NULL);
    printf("# device: %s; decode step: 1 query row x %zu heads, one latent head, d_qk %d, d_v %d "
           "(a view of K), %s; median of %d rounds (wall, clFinish around each)\n",
           device_name, heads, DQK, DV, page_size ? "paged (shuffled pages)" : "contiguous", runs);
    if (page_size)
        printf("# page size %zu\n", page_size);
    printf("%-6s %-6s %10s %10s %12s\n", "keys", "cache", "ms", "GB/s", "bytes/token");
    for (size_t i = 0; i < nseq * TYPES; ++i) {
        config *c = &configs[i];
        qsort(c->ms, (size_t)runs, sizeof(double), compare);
        const double median = c->ms[runs / 2];
        const int t = (int)(i % TYPES);
        printf("%-6zu %-6s %10.3f %10.2f %12.0f\n", c->keys, names[t], median,
               c->keys * bytes_per_token[t] / (median * 1e6), bytes_per_token[t]);
        clattn_plan_release(c->plan);
        clReleaseMemObject(c->cache);
        if (c->table)
            clReleaseMemObject(c->table);
    }
    for (size_t s = 0; s < nseq; ++s)
        clReleaseMemObject(counts[s]);
    clReleaseMemObject(q), clReleaseMemObject(out);
    free(configs), free(rows), free(qh);
    clattn_ctx_release(ctx);
    return 0;
}
