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
#include "clattn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int compare(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static cl_mem upload(clattn_ctx *ctx, const void *host, size_t bytes)
{
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                bytes, (void *)host, &err);
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

int main(int argc, char **argv)
{
    size_t seq = 4096, heads = 8, dim = 64, docs = 8, block = 128, runs = 5;
    const char *device = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        const size_t v = strtoull(argv[i + 1], NULL, 10);
        if (strcmp(argv[i], "--seq") == 0)
            seq = v;
        else if (strcmp(argv[i], "--heads") == 0)
            heads = v;
        else if (strcmp(argv[i], "--dim") == 0)
            dim = v;
        else if (strcmp(argv[i], "--docs") == 0)
            docs = v;
        else if (strcmp(argv[i], "--block") == 0)
            block = v;
        else if (strcmp(argv[i], "--runs") == 0)
            runs = v;
        else if (strcmp(argv[i], "--device") == 0)
            device = argv[i + 1];
        else {
            fprintf(stderr, "flex_bench: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (seq == 0 || heads == 0 || dim == 0 || docs == 0 || block == 0 || runs == 0 || runs > 99) {
        fprintf(stderr, "flex_bench: sizes must be positive (runs at most 99)\n");
        return 2;
    }
    clattn_ctx *ctx = NULL;
    char message[512];
    if (clattn_ctx_create(device, &ctx, message, sizeof message) != CLATTN_SUCCESS) {
        fprintf(stderr, "flex_bench: no device: %s\n", message);
        return 1;
    }
    const size_t n = heads * seq * dim;
    float *x = malloc(n * sizeof *x);
    int32_t *ids = malloc(seq * sizeof *ids);
    uint8_t *dense = malloc(seq * seq);
    float *out[WAYS];
    if (!x || !ids || !dense)
        return 1;
    srand(47);
    for (size_t i = 0; i < n; ++i)
        x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < seq; ++i)
        ids[i] = (int32_t)(i * docs / seq);
    for (size_t i = 0; i < seq; ++i)
        for (size_t j = 0; j < seq; ++j)
            dense[i * seq + j] = ids[i] == ids[j];
    cl_mem q = upload(ctx, x, n * 4), k = upload(ctx, x, n * 4), v = upload(ctx, x, n * 4);
    cl_mem o = upload(ctx, x, n * 4), id_mem = upload(ctx, ids, seq * 4);
    cl_mem mask_mem = upload(ctx, dense, seq * seq);
    const size_t qdims[4] = {1, heads, seq, dim}, mdims[4] = {1, 1, seq, seq}, idims[1] = {seq};
    const size_t nb = (seq + block - 1) / block;
    const size_t bdims[4] = {1, 1, nb, nb};
    cl_mem bm_mem = upload(ctx, dense, nb * nb); /* (contents replaced below) */
    const char *source = "int mask_mod(int b, int h, int q_idx, int kv_idx)\n"
                         "{ return doc[q_idx] == doc[kv_idx]; }\n";
    clattn_block_mask_desc bdesc;
    clattn_block_mask_desc_init(&bdesc);
    bdesc.flex.source = source;
    bdesc.flex.functions = CLATTN_FLEX_MASK_MOD;
    bdesc.flex.aux_names[0] = "doc";
    bdesc.flex.block_q = bdesc.flex.block_k = block;
    clattn_tensor aux[CLATTN_FLEX_AUX_MAX];
    memset(aux, 0, sizeof aux);
    aux[0] = tensor(id_mem, CLATTN_DTYPE_I32, 1, idims);
    bdesc.aux = aux;
    bdesc.batch = bdesc.heads = 1;
    bdesc.seq_q = bdesc.seq_k = seq;
    bdesc.out = tensor(bm_mem, CLATTN_DTYPE_U8, 4, bdims);
    const double bm_start = now_ms();
    check(ctx, clattn_flex_block_mask(ctx, &bdesc, 0, NULL, NULL), "clattn_flex_block_mask");
    check(ctx, clattn_finish(ctx), "clattn_finish");
    const double bm_ms = now_ms() - bm_start;

    clattn_plan *plans[WAYS];
    clattn_tensors t[WAYS];
    for (int w = 0; w < WAYS; ++w) {
        memset(&t[w], 0, sizeof t[w]);
        t[w].q = tensor(q, CLATTN_DTYPE_F32, 4, qdims);
        t[w].k = tensor(k, CLATTN_DTYPE_F32, 4, qdims);
        t[w].v = tensor(v, CLATTN_DTYPE_F32, 4, qdims);
        t[w].out = tensor(o, CLATTN_DTYPE_F32, 4, qdims);
        clattn_sdpa_desc desc;
        clattn_sdpa_desc_init(&desc);
        desc.path = CLATTN_PATH_FUSED;
        if (w == DENSE)
            t[w].attn_mask = tensor(mask_mem, CLATTN_DTYPE_U8, 4, mdims);
        if (w == FLEX || w == BLOCKS) {
            desc.flex = bdesc.flex;
            t[w].flex_aux0 = aux[0];
        }
        if (w == BLOCKS) {
            t[w].block_mask = bdesc.out;
            desc.flex.count_tiles = 1;
        }
        CLATTN_BIND_ROLES(desc, t[w]);
        check(ctx, clattn_sdpa_plan_create(ctx, &desc, &plans[w]), names[w]);
        out[w] = malloc(n * sizeof(float));
    }
    double times[WAYS][100];
    for (size_t r = 0; r <= runs; ++r) /* run 0: the warm-up (builds, first touches) */
        for (int w = 0; w < WAYS; ++w) {
            const double start = now_ms();
            check(ctx, clattn_plan_execute(plans[w], t[w].by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                           0, NULL, NULL),
                  names[w]);
            check(ctx, clattn_finish(ctx), "clattn_finish");
            if (r > 0)
                times[w][r - 1] = now_ms() - start;
            if (r == runs)
                clEnqueueReadBuffer(clattn_ctx_queue(ctx), o, CL_TRUE, 0, n * 4, out[w], 0, NULL,
                                    NULL);
        }
    unsigned long long tiles = 0;
    size_t tile_rows = 0, tile_keys = 0;
    check(ctx, clattn_plan_tiles_visited(plans[BLOCKS], NULL, &tiles, &tile_rows, &tile_keys),
          "clattn_plan_tiles_visited");
    const size_t dense_tiles = heads * ((seq + tile_rows - 1) / tile_rows) *
                               ((seq + tile_keys - 1) / tile_keys);
    double median[WAYS];
    for (int w = 0; w < WAYS; ++w) {
        qsort(times[w], runs, sizeof(double), compare);
        median[w] = times[w][runs / 2];
    }
    double diff_flex = 0.0, diff_blocks = 0.0;
    for (size_t i = 0; i < n; ++i) {
        diff_flex = fmax(diff_flex, fabs((double)out[FLEX][i] - out[DENSE][i]));
        diff_blocks = fmax(diff_blocks, fabs((double)out[BLOCKS][i] - out[DENSE][i]));
    }
    char name[256] = "";
    clGetDeviceInfo(clattn_ctx_device(ctx), CL_DEVICE_NAME, sizeof name, name, NULL);
    printf("flex_bench: %s; B=1 H=%zu L=%zu d=%zu, %zu documents, blocks of %zu, median of %zu\n",
           name, heads, seq, dim, docs, block, runs);
    printf("| mask | ms | vs dense |\n|---|---:|---:|\n");
    for (int w = 0; w < WAYS; ++w)
        printf("| %s | %.2f | %.2fx |\n", names[w], median[w], median[DENSE] / median[w]);
    printf("block mask made in %.2f ms (first call: its build included); tiles visited %llu of "
           "%zu (%zu rows x %zu keys); max |out - dense|: flex %.2g, blocks %.2g\n",
           bm_ms, tiles, dense_tiles, tile_rows, tile_keys, diff_flex, diff_blocks);
    for (int w = 0; w < WAYS; ++w) {
        clattn_plan_release(plans[w]);
        free(out[w]);
    }
    clReleaseMemObject(q);
    clReleaseMemObject(k);
    clReleaseMemObject(v);
    clReleaseMemObject(o);
    clReleaseMemObject(id_mem);
    clReleaseMemObject(mask_mem);
    clReleaseMemObject(bm_mem);
    clattn_ctx_release(ctx);
    free(x);
    free(ids);
    free(dense);
    return diff_flex < 1e-5 && diff_blocks < 1e-5 ? 0 : 1;
}
