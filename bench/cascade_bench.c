/* cascade_bench: one decode step of B requests that share a prefix of P keys, each with its own
 * suffix of S keys, two ways on one device, in one run (issue 50's measure):
 *   paged    one batched paged decode over the full P + S keys of every request (the prefix's
 *            pages shared in the block table, each request reading them again)
 *   cascade  clattn_cascade: the prefix as one problem (B rows per head against the stored
 *            prefix), the suffixes through the same page pool, and the merge
 * Each is timed with clFinish, median of --runs runs taken in turns (the machine is shared),
 * after a warm-up; the outputs must agree (max |difference| printed). The K/V bytes each way
 * reads per step are computed from the sizes: paged B (P + S) Hkv (dk + dv) 4, cascade
 * (P + B S) Hkv (dk + dv) 4 (the prefix once per kv head; the fused kernel reads a kv head's
 * keys once for the rows of its query heads' work-groups).
 *
 *   cascade_bench [--batch B] [--prefix P] [--suffix S] [--heads H] [--kv-heads G] [--dim D]
 *                 [--page N] [--runs R] [--device SPEC]
 */
#define _POSIX_C_SOURCE 200809L
#include "clattn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"

static cl_mem upload(clattn_ctx *ctx, const void *host, size_t bytes)
{
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(clattn_ctx_cl_context(ctx),
                                CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0), bytes,
                                (void *)host, &err);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "cascade_bench: clCreateBuffer(%zu bytes): %d\n", bytes, err);
        exit(1);
    }
    return mem;
}

static void check(clattn_ctx *ctx, clattn_status status, const char *what)
{
    if (status != CLATTN_SUCCESS) {
        fprintf(stderr, "cascade_bench: %s: %s: %s\n", what, clattn_status_string(status),
                clattn_last_error(ctx));
        exit(1);
    }
}

struct options {
    size_t batch, prefix, suffix, heads, kv_heads, dim, page, runs;
    const char *device;
};

static void parse(int argc, char **argv, struct options *o)
{
    *o = (struct options){8, 4096, 256, 8, 8, 64, 16, 15, NULL};
    const bench_size_option sizes[] = {{"--batch", &o->batch},       {"--prefix", &o->prefix},
                                       {"--suffix", &o->suffix},     {"--heads", &o->heads},
                                       {"--kv-heads", &o->kv_heads}, {"--dim", &o->dim},
                                       {"--page", &o->page},         {"--runs", &o->runs}};
    bench_parse("cascade_bench", argc, argv, sizes, sizeof sizes / sizeof sizes[0], &o->device);
    if (!o->batch || !o->prefix || !o->suffix || !o->heads || !o->kv_heads || !o->dim || !o->page ||
        !o->runs || o->prefix % o->page || o->suffix % o->page || o->heads % o->kv_heads) {
        fprintf(stderr, "cascade_bench: sizes must be >= 1, prefix and suffix multiples of the "
                        "page, kv-heads a divisor of heads\n");
        exit(2);
    }
}

static float *random_floats(size_t n, unsigned *state)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; ++i) {
        *state = *state * 1664525u + 1013904223u;
        x[i] = (float)(*state >> 8) / 8388608.0f - 1.0f;
    }
    return x;
}

struct bench {
    clattn_ctx *ctx;
    clattn_tensors paged;    /* the full sequences through one table */
    clattn_cascade_desc cas; /* prefix + the suffixes through their own table */
    clattn_plan *plan;
    clattn_cascade *cascade;
};

/* The page pool: the prefix's P / page pages (shared) and each request's S / page pages;
 * the prefix also as one (1, Hkv, P, d) tensor for the cascade. */
static void setup(struct bench *b, const struct options *o)
{
    const size_t B = o->batch, H = o->heads, G = o->kv_heads, d = o->dim, ps = o->page;
    const size_t pp = o->prefix / ps, sp = o->suffix / ps, pages = pp + B * sp;
    unsigned seed = 12345;
    float *pool_k = random_floats(pages * ps * G * d, &seed);
    float *pool_v = random_floats(pages * ps * G * d, &seed);
    float *q = random_floats(B * H * d, &seed);
    /* the prefix tensor (1, G, P, d) from the pool's first pp pages (page, slot, head, col) */
    float *pk = malloc(G * o->prefix * d * sizeof *pk),
          *pv = malloc(G * o->prefix * d * sizeof *pv);
    for (size_t h = 0; h < G; ++h)
        for (size_t j = 0; j < o->prefix; ++j) {
            memcpy(pk + (h * o->prefix + j) * d, pool_k + (j * G + h) * d, d * sizeof *pk);
            memcpy(pv + (h * o->prefix + j) * d, pool_v + (j * G + h) * d, d * sizeof *pv);
        }
    const size_t blocks = pp + sp;
    int32_t *table = malloc(B * blocks * sizeof *table), *stable = malloc(B * sp * sizeof *table);
    int32_t *lens = malloc(B * sizeof *lens), *slens = malloc(B * sizeof *lens);
    for (size_t r = 0; r < B; ++r) {
        for (size_t j = 0; j < blocks; ++j)
            table[r * blocks + j] = (int32_t)(j < pp ? j : pp + r * sp + (j - pp));
        for (size_t j = 0; j < sp; ++j)
            stable[r * sp + j] = (int32_t)(pp + r * sp + j);
        lens[r] = (int32_t)(o->prefix + o->suffix);
        slens[r] = (int32_t)o->suffix;
    }
    clattn_ctx *ctx = b->ctx;
    const size_t pool_bytes = pages * ps * G * d * sizeof(float);
    cl_mem kmem = upload(ctx, pool_k, pool_bytes), vmem = upload(ctx, pool_v, pool_bytes);
    cl_mem qmem = upload(ctx, q, B * H * d * sizeof *q);
    memset(&b->paged, 0, sizeof b->paged);
    clattn_tensors *t = &b->paged;
    t->q = clattn_tensor_make(qmem, 0, CLATTN_DTYPE_F32, 4, B, H, 1, d);
    t->k = clattn_tensor_make(kmem, 0, CLATTN_DTYPE_F32, 4, pages, ps, G, d);
    t->v = clattn_tensor_make(vmem, 0, CLATTN_DTYPE_F32, 4, pages, ps, G, d);
    t->out =
        clattn_tensor_make(upload(ctx, NULL, B * H * d * 4), 0, CLATTN_DTYPE_F32, 4, B, H, 1, d);
    t->block_table = clattn_tensor_make(upload(ctx, table, B * blocks * 4), 0, CLATTN_DTYPE_I32, 2,
                                        B, blocks, 0, 0);
    t->kv_seqlen = clattn_tensor_make(upload(ctx, lens, B * 4), 0, CLATTN_DTYPE_I32, 1, B, 0, 0, 0);
    clattn_sdpa_desc sd;
    clattn_sdpa_desc_init(&sd);
    CLATTN_BIND_ROLES(sd, *t);
    check(ctx, clattn_sdpa_plan_create(ctx, &sd, &b->plan), "paged plan");
    clattn_cascade_desc *c = &b->cas;
    clattn_cascade_desc_init(c);
    c->q = t->q;
    c->prefix_k = clattn_tensor_make(upload(ctx, pk, G * o->prefix * d * 4), 0, CLATTN_DTYPE_F32, 4,
                                     1, G, o->prefix, d);
    c->prefix_v = clattn_tensor_make(upload(ctx, pv, G * o->prefix * d * 4), 0, CLATTN_DTYPE_F32, 4,
                                     1, G, o->prefix, d);
    c->k = t->k;
    c->v = t->v;
    c->block_table =
        clattn_tensor_make(upload(ctx, stable, B * sp * 4), 0, CLATTN_DTYPE_I32, 2, B, sp, 0, 0);
    c->kv_seqlen =
        clattn_tensor_make(upload(ctx, slens, B * 4), 0, CLATTN_DTYPE_I32, 1, B, 0, 0, 0);
    c->out =
        clattn_tensor_make(upload(ctx, NULL, B * H * d * 4), 0, CLATTN_DTYPE_F32, 4, B, H, 1, d);
    check(ctx, clattn_cascade_create(ctx, c, &b->cascade), "cascade");
    free(pool_k), free(pool_v), free(q), free(pk), free(pv);
    free(table), free(stable), free(lens), free(slens);
}

static double run_paged(struct bench *b)
{
    const double t0 = now_ms();
    check(b->ctx,
          clattn_plan_execute(b->plan, b->paged.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL,
                              NULL),
          "paged execute");
    check(b->ctx, clattn_finish(b->ctx), "finish");
    return now_ms() - t0;
}

static double run_cascade(struct bench *b)
{
    const double t0 = now_ms();
    check(b->ctx, clattn_cascade_execute(b->cascade, &b->cas, 0, NULL, NULL), "cascade execute");
    check(b->ctx, clattn_finish(b->ctx), "finish");
    return now_ms() - t0;
}

static double max_difference(struct bench *b, size_t n)
{
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    cl_command_queue queue = clattn_ctx_queue(b->ctx);
    clEnqueueReadBuffer(queue, b->paged.out.mem, CL_TRUE, 0, n * 4, x, 0, NULL, NULL);
    clEnqueueReadBuffer(queue, b->cas.out.mem, CL_TRUE, 0, n * 4, y, 0, NULL, NULL);
    double worst = 0;
    for (size_t i = 0; i < n; ++i)
        worst = fmax(worst, fabs((double)x[i] - y[i]));
    free(x), free(y);
    return worst;
}

int main(int argc, char **argv)
{
    struct options o;
    parse(argc, argv, &o);
    struct bench b;
    char message[512];
    if (clattn_ctx_create(o.device, &b.ctx, message, sizeof message) != CLATTN_SUCCESS) {
        fprintf(stderr, "cascade_bench: %s\n", message);
        return 77;
    }
    setup(&b, &o);
    run_paged(&b), run_cascade(&b); /* warm-up: builds, validation */
    double *tp = malloc(o.runs * sizeof *tp), *tc = malloc(o.runs * sizeof *tc);
    for (size_t r = 0; r < o.runs; ++r) {
        tp[r] = run_paged(&b);
        tc[r] = run_cascade(&b);
    }
    qsort(tp, o.runs, sizeof *tp, compare);
    qsort(tc, o.runs, sizeof *tc, compare);
    const double mp = tp[o.runs / 2], mc = tc[o.runs / 2];
    const double row = (double)o.kv_heads * 2 * o.dim * 4; /* K and V bytes of one key */
    const double paged_bytes = row * o.batch * (o.prefix + o.suffix);
    const double cascade_bytes = row * (o.prefix + o.batch * o.suffix);
    char device[256] = "";
    clGetDeviceInfo(clattn_ctx_device(b.ctx), CL_DEVICE_NAME, sizeof device, device, NULL);
    printf("cascade_bench: %s; B=%zu prefix=%zu suffix=%zu H=%zu Hkv=%zu d=%zu F32, pages of "
           "%zu, median of %zu (alternating)\n",
           device, o.batch, o.prefix, o.suffix, o.heads, o.kv_heads, o.dim, o.page, o.runs);
    printf("| way | ms | speedup | K/V MB read per step |\n|---|---|---|---|\n");
    printf("| paged (%zu x %zu keys) | %.3f | 1.00x | %.2f |\n", o.batch, o.prefix + o.suffix, mp,
           paged_bytes / 1e6);
    printf("| cascade (prefix once + %zu x %zu) | %.3f | %.2fx | %.2f |\n", o.batch, o.suffix, mc,
           mp / mc, cascade_bytes / 1e6);
    printf("bytes ratio %.2fx (prefix K/V %.2f MB read once instead of %zu times); max |paged - "
           "cascade| = %.3g\n",
           paged_bytes / cascade_bytes, row * o.prefix / 1e6, o.batch,
           max_difference(&b, o.batch * o.heads * o.dim));
    clattn_plan_release(b.plan);
    clattn_cascade_release(b.cascade);
    clattn_ctx_release(b.ctx);
    free(tp), free(tc);
    return 0;
}
