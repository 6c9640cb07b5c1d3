/* flex_bench: a document mask three ways on one device, in one run (issue 47's measure):
 *   dense    the mask as a (L, L) U8 attn_mask (the built-in bool mask; every tile computed)
 *   flex     the same mask as a mask_mod reading document ids (clattn_flex_desc), no block mask
 *   blocks   mask_mod plus a block mask made on the device (clattn_flex_block_mask): empty
 *            tiles skipped, mask_mod only on partial ones
 * and `none` (no mask: every key) for scale. Each is the fused plan's execution, timed with
 * clFinish, median of --runs runs taken in turns (the machines are shared and noisy), after a
 * warm-up; the outputs of dense, flex and blocks must agree (max |difference| printed), and
 * the blocks run's tile counter is printed next to the dense tile count.
 *
 *   flex_bench [--seq L] [--heads H] [--dim D] [--docs N] [--block B] [--runs R] [--device S]
 */
#define _POSIX_C_SOURCE 200809L
#include "bench_time.h"
#include "clattn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static cl_mem upload(clattn_ctx *ctx, const void *host, size_t bytes)
{
    cl_int err = CL_SUCCESS;
    cl_mem mem =
        clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes,
                       (void *)host, &err);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "flex_bench: clCreateBuffer(%zu bytes) failed (%d)\n", bytes, (int)err);
        exit(1);
    }
    return mem;
}

static clattn_tensor tensor(cl_mem mem, clattn_dtype dtype, int rank, const size_t *dims)
{
    clattn_tensor t;
    memset(&t, 0, sizeof t);
    t.mem = mem;
    t.dtype = dtype;
    t.rank = rank;
    size_t stride = 1;
    for (int i = rank - 1; i >= 0; --i) {
        t.dims[i] = dims[i];
        t.strides[i] = stride;
        stride *= dims[i];
    }
    return t;
}

static void check(clattn_ctx *ctx, clattn_status status, const char *what)
{
    if (status != CLATTN_SUCCESS) {
        fprintf(stderr, "flex_bench: %s: %s: %s\n", what, clattn_status_string(status),
                clattn_last_error(ctx));
        exit(1);
    }
}

enum { NONE, DENSE, FLEX, BLOCKS, WAYS };
static const char *const names[WAYS] = {"none", "dense", "flex", "blocks"};

struct options {
    size_t seq, heads, dim, docs, block, runs;
    const char *device;
};

/* The command line into o (its defaults kept where not given); 2 on an unknown option or a
 * size that is not positive, else 0. */
static int parse_options(int argc, char **argv, struct options *o)
{
    const struct {
        const char *name;
        size_t *value;
    } sizes[] = {{"--seq", &o->seq},   {"--heads", &o->heads}, {"--dim", &o->dim},
                 {"--docs", &o->docs}, {"--block", &o->block}, {"--runs", &o->runs}};
    const size_t count = sizeof sizes / sizeof sizes[0];
    for (int i = 1; i + 1 < argc; i += 2) {
        size_t s = 0;
        while (s < count && strcmp(argv[i], sizes[s].name) != 0)
            ++s;
        if (s < count)
            *sizes[s].value = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--device") == 0)
            o->device = argv[i + 1];
        else {
            fprintf(stderr, "flex_bench: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (o->seq == 0 || o->heads == 0 || o->dim == 0 || o->docs == 0 || o->block == 0 ||
        o->runs == 0 || o->runs > 99) {
        fprintf(stderr, "flex_bench: sizes must be positive (runs at most 99)\n");
        return 2;
    }
    return 0;
}

/* What the four ways share (q = k = v, one output buffer, the document ids and masks) and
 * each way's plan, bound tensors and output. */
struct bench {
    clattn_ctx *ctx;
    size_t n; /* heads * seq * dim: the floats of q, k, v and out */
    cl_mem q, k, v, o, id_mem, mask_mem, bm_mem;
    clattn_block_mask_desc bdesc; /* mask_mod over the ids, and the block mask it makes */
    clattn_tensor aux[CLATTN_FLEX_AUX_MAX];
    clattn_plan *plans[WAYS];
    clattn_tensors t[WAYS];
    float *out[WAYS];
};

/* Random q = k = v, the document ids (docs equal runs of positions) and the dense (L, L) mask
 * uploaded; 1 when the host arrays cannot be allocated. */
static int upload_inputs(struct bench *b, const struct options *o)
{
    const size_t seq = o->seq, nb = (seq + o->block - 1) / o->block;
    b->n = o->heads * seq * o->dim;
    float *x = malloc(b->n * sizeof *x);
    int32_t *ids = malloc(seq * sizeof *ids);
    uint8_t *dense = malloc(seq * seq);
    if (!x || !ids || !dense)
        return 1;
    srand(47);
    for (size_t i = 0; i < b->n; ++i)
        x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < seq; ++i)
        ids[i] = (int32_t)(i * o->docs / seq);
    for (size_t i = 0; i < seq; ++i)
        for (size_t j = 0; j < seq; ++j)
            dense[i * seq + j] = ids[i] == ids[j];
    b->q = upload(b->ctx, x, b->n * 4);
    b->k = upload(b->ctx, x, b->n * 4);
    b->v = upload(b->ctx, x, b->n * 4);
    b->o = upload(b->ctx, x, b->n * 4);
    b->id_mem = upload(b->ctx, ids, seq * 4);
    b->mask_mem = upload(b->ctx, dense, seq * seq);
    b->bm_mem = upload(b->ctx, dense, nb * nb); /* (contents replaced by make_block_mask) */
    free(x);
    free(ids);
    free(dense);
    return 0;
}

/* The mask_mod over the document ids and the block mask it makes on the device; returns the
 * milliseconds that took (its first call: the build included). */
static double make_block_mask(struct bench *b, const struct options *o)
{
    const size_t seq = o->seq, nb = (seq + o->block - 1) / o->block;
    const size_t idims[1] = {seq}, bdims[4] = {1, 1, nb, nb};
    clattn_block_mask_desc *bdesc = &b->bdesc;
    clattn_block_mask_desc_init(bdesc);
    bdesc->flex.source = "int mask_mod(int b, int h, int q_idx, int kv_idx)\n"
                         "{ return doc[q_idx] == doc[kv_idx]; }\n";
    bdesc->flex.functions = CLATTN_FLEX_MASK_MOD;
    bdesc->flex.aux_names[0] = "doc";
    bdesc->flex.block_q = bdesc->flex.block_k = o->block;
    memset(b->aux, 0, sizeof b->aux);
    b->aux[0] = tensor(b->id_mem, CLATTN_DTYPE_I32, 1, idims);
    bdesc->aux = b->aux;
    bdesc->batch = bdesc->heads = 1;
    bdesc->seq_q = bdesc->seq_k = seq;
    bdesc->out = tensor(b->bm_mem, CLATTN_DTYPE_U8, 4, bdims);
    const double start = now_ms();
    check(b->ctx, clattn_flex_block_mask(b->ctx, bdesc, 0, NULL, NULL), "clattn_flex_block_mask");
    check(b->ctx, clattn_finish(b->ctx), "clattn_finish");
    return now_ms() - start;
}

/* Each way's fused plan and bound tensors: none, the dense U8 mask, mask_mod alone, and
 * mask_mod with the block mask (counting the tiles it visits). */
static void make_plans(struct bench *b, const struct options *o)
{
    const size_t qdims[4] = {1, o->heads, o->seq, o->dim}, mdims[4] = {1, 1, o->seq, o->seq};
    for (int w = 0; w < WAYS; ++w) {
        clattn_tensors *t = &b->t[w];
        memset(t, 0, sizeof *t);
        t->q = tensor(b->q, CLATTN_DTYPE_F32, 4, qdims);
        t->k = tensor(b->k, CLATTN_DTYPE_F32, 4, qdims);
        t->v = tensor(b->v, CLATTN_DTYPE_F32, 4, qdims);
        t->out = tensor(b->o, CLATTN_DTYPE_F32, 4, qdims);
        clattn_sdpa_desc desc;
        clattn_sdpa_desc_init(&desc);
        desc.path = CLATTN_PATH_FUSED;
        if (w == DENSE)
            t->attn_mask = tensor(b->mask_mem, CLATTN_DTYPE_U8, 4, mdims);
        if (w == FLEX || w == BLOCKS) {
            desc.flex = b->bdesc.flex;
            t->flex_aux0 = b->aux[0];
        }
        if (w == BLOCKS) {
            t->block_mask = b->bdesc.out;
            desc.flex.count_tiles = 1;
        }
        CLATTN_BIND_ROLES(desc, *t);
        check(b->ctx, clattn_sdpa_plan_create(b->ctx, &desc, &b->plans[w]), names[w]);
        b->out[w] = malloc(b->n * sizeof(float));
    }
}

/* Every way run runs + 1 times in turns (run 0: the warm-up, builds and first touches), each
 * clFinish-timed; the last run's outputs read back; median[w] the median of way w's times. */
static void time_ways(struct bench *b, size_t runs, double median[WAYS])
{
    double times[WAYS][100];
    for (size_t r = 0; r <= runs; ++r)
        for (int w = 0; w < WAYS; ++w) {
            const double start = now_ms();
            check(b->ctx,
                  clattn_plan_execute(b->plans[w], b->t[w].by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                      0, NULL, NULL),
                  names[w]);
            check(b->ctx, clattn_finish(b->ctx), "clattn_finish");
            if (r > 0)
                times[w][r - 1] = now_ms() - start;
            if (r == runs)
                clEnqueueReadBuffer(clattn_ctx_queue(b->ctx), b->o, CL_TRUE, 0, b->n * 4, b->out[w],
                                    0, NULL, NULL);
        }
    for (int w = 0; w < WAYS; ++w) {
        qsort(times[w], runs, sizeof(double), compare);
        median[w] = times[w][runs / 2];
    }
}

/* The table, the block mask's time and tile count, and the outputs' agreement; 0 when flex
 * and blocks agree with dense (max |difference| < 1e-5), else 1. */
static int report(struct bench *b, const struct options *o, const double median[WAYS], double bm_ms)
{
    unsigned long long tiles = 0;
    size_t tile_rows = 0, tile_keys = 0;
    check(b->ctx, clattn_plan_tiles_visited(b->plans[BLOCKS], NULL, &tiles, &tile_rows, &tile_keys),
          "clattn_plan_tiles_visited");
    const size_t dense_tiles =
        o->heads * ((o->seq + tile_rows - 1) / tile_rows) * ((o->seq + tile_keys - 1) / tile_keys);
    double diff_flex = 0.0, diff_blocks = 0.0;
    for (size_t i = 0; i < b->n; ++i) {
        diff_flex = fmax(diff_flex, fabs((double)b->out[FLEX][i] - b->out[DENSE][i]));
        diff_blocks = fmax(diff_blocks, fabs((double)b->out[BLOCKS][i] - b->out[DENSE][i]));
    }
    char name[256] = "";
    clGetDeviceInfo(clattn_ctx_device(b->ctx), CL_DEVICE_NAME, sizeof name, name, NULL);
    printf("flex_bench: %s; B=1 H=%zu L=%zu d=%zu, %zu documents, blocks of %zu, median of %zu\n",
           name, o->heads, o->seq, o->dim, o->docs, o->block, o->runs);
    printf("| mask | ms | vs dense |\n|---|---:|---:|\n");
    for (int w = 0; w < WAYS; ++w)
        printf("| %s | %.2f | %.2fx |\n", names[w], median[w], median[DENSE] / median[w]);
    printf("block mask made in %.2f ms (first call: its build included); tiles visited %llu of "
           "%zu (%zu rows x %zu keys); max |out - dense|: flex %.2g, blocks %.2g\n",
           bm_ms, tiles, dense_tiles, tile_rows, tile_keys, diff_flex, diff_blocks);
    return diff_flex < 1e-5 && diff_blocks < 1e-5 ? 0 : 1;
}

static void release(struct bench *b)
{
    for (int w = 0; w < WAYS; ++w) {
        clattn_plan_release(b->plans[w]);
        free(b->out[w]);
    }
    const cl_mem mems[] = {b->q, b->k, b->v, b->o, b->id_mem, b->mask_mem, b->bm_mem};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; ++i)
        clReleaseMemObject(mems[i]);
    clattn_ctx_release(b->ctx);
}

int main(int argc, char **argv)
{
    struct options o = {.seq = 4096, .heads = 8, .dim = 64, .docs = 8, .block = 128, .runs = 5};
    const int bad = parse_options(argc, argv, &o);
    if (bad)
        return bad;
    struct bench b;
    memset(&b, 0, sizeof b);
    char message[512];
    if (clattn_ctx_create(o.device, &b.ctx, message, sizeof message) != CLATTN_SUCCESS) {
        fprintf(stderr, "flex_bench: no device: %s\n", message);
        return 1;
    }
    if (upload_inputs(&b, &o))
        return 1;
    const double bm_ms = make_block_mask(&b, &o);
    make_plans(&b, &o);
    double median[WAYS];
    time_ways(&b, o.runs, median);
    const int status = report(&b, &o, median, bm_ms);
    release(&b);
    return status;
}
