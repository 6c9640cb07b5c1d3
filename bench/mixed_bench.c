/* mixed_bench: one serving step of D decoding requests (one query row each, K keys in the
 * cache) and one prefill chunk (C rows over its request's P + C keys, causal bottom-right),
 * over one paged cache (pages of S keys, shuffled), two ways on one device in one run
 * (issue 50's measure):
 *   mixed     one plan: the D + C query rows packed (cu_seqlens_q with block_table and
 *             kv_seqlen), one launch
 *   separate  a decode plan (D requests, q (D, H, 1, d)) and a prefill plan (1 request,
 *             q (1, H, C, d)) over the same pool, executed one after the other
 * Both read and write the same packed buffers (the separate plans through strided views), so
 * their outputs must agree (max |difference| printed). Each way is timed with clFinish, the
 * median of --runs runs taken in turns (the machines are shared and noisy), after a warm-up;
 * with the process's CPU time per run too (on a CPU device the work done, whatever else runs
 * on the machine).
 *
 *   mixed_bench [--decodes D] [--keys K] [--chunk C] [--past P] [--heads H] [--kv-heads G]
 *               [--dim d] [--page S] [--runs R] [--device SPEC]
 */
#define _POSIX_C_SOURCE 200809L
#include "clattn.h"

#include "bench_common.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The process's CPU time (every thread: a CPU device's workers included), ms. */
static double cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void check(clattn_ctx *ctx, clattn_status status, const char *what)
{
    if (status != CLATTN_SUCCESS) {
        fprintf(stderr, "mixed_bench: %s: %s: %s\n", what, clattn_status_string(status),
                clattn_last_error(ctx));
        exit(1);
    }
}

static cl_mem upload(clattn_ctx *ctx, const void *host, size_t bytes)
{
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(clattn_ctx_cl_context(ctx),
                                CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0), bytes,
                                (void *)host, &err);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "mixed_bench: clCreateBuffer(%zu bytes) failed (%d)\n", bytes, (int)err);
        exit(1);
    }
    return mem;
}

struct options {
    size_t decodes, keys, chunk, past, heads, kv_heads, dim, page, runs;
    const char *device;
};

static void parse(int argc, char **argv, struct options *o)
{
    *o = (struct options){7, 2048, 256, 256, 8, 2, 64, 16, 15, NULL};
    const bench_size_option sizes[] = {
        {"--decodes", &o->decodes}, {"--keys", &o->keys},   {"--chunk", &o->chunk},
        {"--past", &o->past},       {"--heads", &o->heads}, {"--kv-heads", &o->kv_heads},
        {"--dim", &o->dim},         {"--page", &o->page},   {"--runs", &o->runs}};
    bench_parse("mixed_bench", argc, argv, sizes, sizeof sizes / sizeof sizes[0], &o->device);
    if (argc % 2 == 0 || o->heads % o->kv_heads) {
        fprintf(stderr, "mixed_bench: options come in pairs; --kv-heads divides --heads\n");
        exit(2);
    }
}

struct bench {
    clattn_ctx *ctx;
    clattn_plan *mixed, *decode, *prefill;
    clattn_tensors t_mixed, t_decode, t_prefill;
};

/* A packed (rows, H, d) buffer's rows first .. first + count - 1 as (batch, H, L, d) views:
 * batch = count, L = 1 (decodes) or batch 1, L = count (the chunk). */
static clattn_tensor rows_view(const clattn_tensor *packed, size_t first, size_t count,
                               bool one_each)
{
    const size_t heads = packed->dims[1], d = packed->dims[2];
    clattn_tensor t = clattn_tensor_make(packed->mem, first * heads * d, packed->dtype, 4,
                                         one_each ? count : 1, heads, one_each ? 1 : count, d);
    t.strides[0] = one_each ? heads * d : count * heads * d;
    t.strides[1] = d;
    t.strides[2] = heads * d;
    t.strides[3] = 1;
    return t;
}

/* The pool, table and counts; the three plans over them. */
static void setup(struct bench *b, const struct options *o)
{
    const size_t batch = o->decodes + 1, total_q = o->decodes + o->chunk, d = o->dim;
    const size_t chunk_keys = o->past + o->chunk;
    const size_t most = o->keys > chunk_keys ? o->keys : chunk_keys;
    const size_t blocks = (most + o->page - 1) / o->page;
    const size_t pages = batch * blocks;
    int32_t *table = malloc(batch * blocks * sizeof *table), cu[1024], counts[1024];
    size_t *perm = malloc(pages * sizeof *perm);
    float *q = malloc(total_q * o->heads * d * sizeof *q);
    float *kv = malloc(pages * o->page * o->kv_heads * d * sizeof *kv);
    srand(50);
    for (size_t i = 0; i < pages; ++i)
        perm[i] = i;
    for (size_t i = pages - 1; i > 0; --i) { /* shuffled pages */
        const size_t j = (size_t)rand() % (i + 1), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    for (size_t i = 0; i < batch * blocks; ++i)
        table[i] = (int32_t)perm[i];
    for (size_t i = 0; i < total_q * o->heads * d; ++i)
        q[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    for (size_t i = 0; i < pages * o->page * o->kv_heads * d; ++i)
        kv[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    cu[0] = 0;
    for (size_t r = 0; r < batch; ++r) {
        cu[r + 1] = cu[r] + (int32_t)(r < o->decodes ? 1 : o->chunk);
        counts[r] = (int32_t)(r < o->decodes ? o->keys : chunk_keys);
    }
    clattn_ctx *ctx = b->ctx;
    clattn_tensors *t = &b->t_mixed;
    memset(t, 0, sizeof *t);
    t->q = clattn_tensor_make(upload(ctx, q, total_q * o->heads * d * 4), 0, CLATTN_DTYPE_F32, 3,
                              total_q, o->heads, d, 0);
    cl_mem pool = upload(ctx, kv, pages * o->page * o->kv_heads * d * 4);
    t->k = clattn_tensor_make(pool, 0, CLATTN_DTYPE_F32, 4, pages, o->page, o->kv_heads, d);
    t->v = t->k; /* (the same pool for values: the traffic is the same) */
    t->out = clattn_tensor_make(upload(ctx, NULL, total_q * o->heads * d * 4), 0, CLATTN_DTYPE_F32,
                                3, total_q, o->heads, d, 0);
    t->block_table = clattn_tensor_make(upload(ctx, table, batch * blocks * 4), 0, CLATTN_DTYPE_I32,
                                        2, batch, blocks, 0, 0);
    t->kv_seqlen =
        clattn_tensor_make(upload(ctx, counts, batch * 4), 0, CLATTN_DTYPE_I32, 1, batch, 0, 0, 0);
    t->cu_seqlens_q = clattn_tensor_make(upload(ctx, cu, (batch + 1) * 4), 0, CLATTN_DTYPE_I32, 1,
                                         batch + 1, 0, 0, 0);
    /* the separate plans: the same buffers through views */
    clattn_tensors *dt = &b->t_decode, *pt = &b->t_prefill;
    memset(dt, 0, sizeof *dt);
    dt->q = rows_view(&t->q, 0, o->decodes, true);
    dt->out = rows_view(&t->out, 0, o->decodes, true);
    dt->k = t->k, dt->v = t->v;
    dt->block_table =
        clattn_tensor_make(t->block_table.mem, 0, CLATTN_DTYPE_I32, 2, o->decodes, blocks, 0, 0);
    dt->kv_seqlen =
        clattn_tensor_make(t->kv_seqlen.mem, 0, CLATTN_DTYPE_I32, 1, o->decodes, 0, 0, 0);
    *pt = *dt;
    pt->q = rows_view(&t->q, o->decodes, o->chunk, false);
    pt->out = rows_view(&t->out, o->decodes, o->chunk, false);
    pt->block_table = clattn_tensor_make(t->block_table.mem, o->decodes * blocks, CLATTN_DTYPE_I32,
                                         2, 1, blocks, 0, 0);
    pt->kv_seqlen =
        clattn_tensor_make(t->kv_seqlen.mem, o->decodes, CLATTN_DTYPE_I32, 1, 1, 0, 0, 0);
    clattn_tensors *const all[3] = {t, dt, pt};
    clattn_plan **const plans[3] = {&b->mixed, &b->decode, &b->prefill};
    for (int i = 0; i < 3; ++i) {
        clattn_sdpa_desc desc;
        clattn_sdpa_desc_init(&desc);
        CLATTN_BIND_ROLES(desc, *all[i]);
        desc.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        check(ctx, clattn_sdpa_plan_create(ctx, &desc, plans[i]), "plan");
    }
    free(table);
    free(perm);
    free(q);
    free(kv);
}

static void run_way(struct bench *b, int way)
{
    if (way == 0) {
        check(b->ctx,
              clattn_plan_execute(b->mixed, b->t_mixed.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                  NULL, NULL),
              "mixed");
    } else {
        check(b->ctx,
              clattn_plan_execute(b->decode, b->t_decode.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                  NULL, NULL),
              "decode");
        check(b->ctx,
              clattn_plan_execute(b->prefill, b->t_prefill.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                  0, NULL, NULL),
              "prefill");
    }
    clFinish(clattn_ctx_queue(b->ctx));
}

int main(int argc, char **argv)
{
    struct options o;
    parse(argc, argv, &o);
    struct bench b;
    memset(&b, 0, sizeof b);
    char message[512] = "";
    if (clattn_ctx_create(o.device, &b.ctx, message, sizeof message) != CLATTN_SUCCESS) {
        fprintf(stderr, "mixed_bench: no context: %s\n", message);
        return 1;
    }
    setup(&b, &o);
    const size_t n_out = (o.decodes + o.chunk) * o.heads * o.dim;
    float *out[2] = {malloc(n_out * 4), malloc(n_out * 4)};
    double *times[2] = {malloc(o.runs * sizeof(double)), malloc(o.runs * sizeof(double))};
    double *cpu[2] = {malloc(o.runs * sizeof(double)), malloc(o.runs * sizeof(double))};
    for (int way = 0; way < 2; ++way) { /* warm-up, and each way's output */
        run_way(&b, way);
        clEnqueueReadBuffer(clattn_ctx_queue(b.ctx), b.t_mixed.out.mem, CL_TRUE, 0, n_out * 4,
                            out[way], 0, NULL, NULL);
    }
    for (size_t r = 0; r < o.runs; ++r)
        for (int k = 0; k < 2; ++k) { /* in turns, the order alternating */
            const int way = (int)((r + (size_t)k) % 2);
            const double t0 = now_ms(), c0 = cpu_ms();
            run_way(&b, way);
            times[way][r] = now_ms() - t0;
            cpu[way][r] = cpu_ms() - c0;
        }
    double diff = 0.0;
    for (size_t i = 0; i < n_out; ++i)
        diff = fmax(diff, fabs((double)out[0][i] - (double)out[1][i]));
    double median[2], cpu_median[2];
    for (int w = 0; w < 2; ++w) {
        qsort(times[w], o.runs, sizeof(double), compare);
        qsort(cpu[w], o.runs, sizeof(double), compare);
        median[w] = times[w][o.runs / 2];
        cpu_median[w] = cpu[w][o.runs / 2];
    }
    printf("mixed_bench: %zu decodes at %zu keys + a %zu-row chunk over %zu keys, H=%zu Hkv=%zu "
           "d=%zu, pages of %zu; median of %zu runs; max |mixed - separate| = %.2g\n",
           o.decodes, o.keys, o.chunk, o.past + o.chunk, o.heads, o.kv_heads, o.dim, o.page, o.runs,
           diff);
    printf("| way | ms | vs separate | CPU ms | vs separate |\n|---|---|---|---|---|\n");
    printf("| mixed (one launch) | %.3f | %.2fx | %.3f | %.2fx |\n", median[0],
           median[1] / median[0], cpu_median[0], cpu_median[1] / cpu_median[0]);
    printf("| separate (decode + prefill plans) | %.3f | 1.00x | %.3f | 1.00x |\n", median[1],
           cpu_median[1]);
    printf("mixed: %s\ndecode: %s\nprefill: %s\n", clattn_plan_info(b.mixed),
           clattn_plan_info(b.decode), clattn_plan_info(b.prefill));
    return diff < 1e-4 ? 0 : 1;
}
