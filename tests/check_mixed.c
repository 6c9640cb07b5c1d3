/*
 * check_mixed: packed queries over a paged KV cache (issue 50, items 3 and 4): one SDPA plan
 * with cu_seqlens_q, block_table and kv_seqlen serves a batch of requests that decode (one
 * row) and requests that prefill a chunk (many rows, their keys already in their pages), each
 * with bottom-right causal over its own key count. Every request is compared with its own
 * single-request float64 reference; pages are shuffled, pool slots no request holds and
 * output elements outside the tensors are NaN (a read of them, or a stray write, shows); the
 * mixed batch is one kernel launch (the context's kernel trace). Then the refusals.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "testutil.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))
#define MAX_REQ 8

typedef struct mixed_case {
    const char *name;
    size_t heads, kv_heads, dk, dv, page_size;
    clattn_causal causal;
    int count;                           /* requests */
    size_t rows[MAX_REQ], keys[MAX_REQ]; /* each request's query rows and key count */
    int lse;
} mixed_case;

/* The done-when case first: 3 decodes and a 200-row chunk whose cache already holds
 * 100 keys before it (300 in all), over shuffled pages of 16. */
static const mixed_case cases[] = {
    {"3 decodes + 200-row chunk, pages of 16",
     4,
     2,
     64,
     64,
     16,
     CLATTN_CAUSAL_BOTTOM_RIGHT,
     4,
     {1, 1, 200, 1},
     {63, 129, 300, 1},
     1},
    {"rows 1/17/65, pages of 1, no causal",
     2,
     1,
     16,
     8,
     1,
     CLATTN_CAUSAL_NONE,
     4,
     {1, 17, 65, 1},
     {1, 63, 129, 17},
     0},
    {"rows 17/1/65, pages of 48, fewer keys than rows",
     3,
     3,
     16,
     8,
     48,
     CLATTN_CAUSAL_BOTTOM_RIGHT,
     3,
     {17, 1, 65},
     {129, 63, 63},
     1},
    /* full scale: more mixes */
    {"7 decodes + 33-row chunk, GQA 8/2, pages of 16",
     8,
     2,
     64,
     64,
     16,
     CLATTN_CAUSAL_BOTTOM_RIGHT,
     8,
     {1, 1, 1, 33, 1, 1, 1, 1},
     {17, 2, 48, 97, 1, 300, 16, 33},
     1},
    {"one request, rows 65, pages of 48",
     2,
     2,
     16,
     8,
     48,
     CLATTN_CAUSAL_BOTTOM_RIGHT,
     1,
     {65},
     {130},
     1},
};
#define DEFAULT_CASES 3
/* CLATTN_TEST_SCALE=small (Oclgrind): the first case with a 40-row chunk over 70 keys, 2 heads */
static const mixed_case small_first = {"3 decodes + 40-row chunk, pages of 16 (small)",
                                       2,
                                       1,
                                       32,
                                       32,
                                       16,
                                       CLATTN_CAUSAL_BOTTOM_RIGHT,
                                       4,
                                       {1, 1, 40, 1},
                                       {63, 17, 70, 1},
                                       1};

typedef struct mixed_problem {
    const mixed_case *c;
    size_t batch, total_q, blocks, num_pages;
    int32_t cu_q[MAX_REQ + 1], kv_len[MAX_REQ];
    int32_t *table;             /* (batch, blocks) */
    float *q, *k_pool, *v_pool; /* q (total_q, heads, dk); pools (pages, page, kv_heads, d) */
    double *ref_out, *ref_lse;  /* (total_q, heads, dv), (heads, total_q) */
} mixed_problem;

static size_t ceil_div(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

/* Pages: every request's blocks get distinct pages of a shuffled pool with 3 spares; slots
 * past a request's keys, and the spares, hold NaN; blocks past the keys are -1. */
static void make_problem(mixed_problem *p, const mixed_case *c)
{
    memset(p, 0, sizeof *p);
    p->c = c;
    p->batch = (size_t)c->count;
    size_t used = 0;
    for (size_t b = 0; b < p->batch; ++b) {
        p->cu_q[b + 1] = p->cu_q[b] + (int32_t)c->rows[b];
        p->kv_len[b] = (int32_t)c->keys[b];
        const size_t need = ceil_div(c->keys[b], c->page_size);
        p->blocks = need + 1 > p->blocks ? need + 1 : p->blocks;
        used += need;
    }
    p->total_q = (size_t)p->cu_q[p->batch];
    p->num_pages = used + 3;
    size_t *perm = malloc(p->num_pages * sizeof *perm);
    for (size_t i = 0; i < p->num_pages; ++i)
        perm[i] = i;
    for (size_t i = p->num_pages - 1; i > 0; --i) {
        const size_t j = tu_rand_below(i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    p->table = malloc(p->batch * p->blocks * sizeof *p->table);
    const size_t kvh = c->kv_heads, page = c->page_size;
    p->k_pool = tu_nan_floats(p->num_pages * page * kvh * c->dk);
    p->v_pool = tu_nan_floats(p->num_pages * page * kvh * c->dv);
    size_t next = 0;
    for (size_t b = 0; b < p->batch; ++b)
        for (size_t blk = 0; blk < p->blocks; ++blk) {
            const bool holds = blk * page < c->keys[b];
            const size_t pg = holds ? perm[next++] : 0;
            p->table[b * p->blocks + blk] = holds ? (int32_t)pg : -1;
            for (size_t s = 0; holds && s < page && blk * page + s < c->keys[b]; ++s) {
                const size_t row = (pg * page + s) * kvh;
                tu_fill_uniform(p->k_pool + row * c->dk, kvh * c->dk, -1.0f, 1.0f);
                tu_fill_uniform(p->v_pool + row * c->dv, kvh * c->dv, -1.0f, 1.0f);
            }
        }
    free(perm);
    p->q = tu_random_floats(p->total_q * c->heads * c->dk);
}

/* Each request alone, in float64: row i of request b sees keys j < n_b (j <= i + n_b - rows_b
 * with causal bottom-right); a row with no key gives zeros and lse -inf. */
static void reference(mixed_problem *p)
{
    const mixed_case *c = p->c;
    const size_t heads = c->heads, group = c->heads / c->kv_heads, page = c->page_size;
    p->ref_out = tu_doubles(p->total_q * heads * c->dv);
    p->ref_lse = tu_doubles(heads * p->total_q);
    const double scale = 1.0 / sqrt((double)c->dk);
    double *w = tu_doubles(c->keys[0] + 1);
    for (size_t b = 0; b < p->batch; ++b) {
        const size_t n = c->keys[b], rows = c->rows[b];
        free(w);
        w = tu_doubles(n + 1);
        for (size_t i = 0; i < rows; ++i)
            for (size_t h = 0; h < heads; ++h) {
                const size_t t = (size_t)p->cu_q[b] + i, kvh = h / group;
                const float *qi = p->q + (t * heads + h) * c->dk;
                long long last = (long long)n - 1;
                if (c->causal == CLATTN_CAUSAL_BOTTOM_RIGHT)
                    last = (long long)i + (long long)n - (long long)rows;
                double m = -INFINITY, sum = 0.0;
                for (long long j = 0; j <= last && j < (long long)n; ++j) {
                    const size_t pg = (size_t)p->table[b * p->blocks + (size_t)j / page];
                    const float *kj =
                        p->k_pool + ((pg * page + (size_t)j % page) * c->kv_heads + kvh) * c->dk;
                    double dot = 0.0;
                    for (size_t d = 0; d < c->dk; ++d)
                        dot += (double)qi[d] * (double)kj[d];
                    w[j] = dot * scale;
                    m = w[j] > m ? w[j] : m;
                }
                for (long long j = 0; j <= last && j < (long long)n; ++j)
                    sum += (w[j] = exp(w[j] - m));
                double *o = p->ref_out + (t * heads + h) * c->dv;
                for (long long j = 0; j <= last && j < (long long)n; ++j) {
                    const size_t pg = (size_t)p->table[b * p->blocks + (size_t)j / page];
                    const float *vj =
                        p->v_pool + ((pg * page + (size_t)j % page) * c->kv_heads + kvh) * c->dv;
                    for (size_t d = 0; d < c->dv; ++d)
                        o[d] += w[j] / sum * (double)vj[d];
                }
                p->ref_lse[h * p->total_q + t] = sum > 0.0 ? m + log(sum) : -INFINITY;
            }
    }
    free(w);
}

static void free_problem(mixed_problem *p)
{
    free(p->table);
    free(p->q);
    free(p->k_pool);
    free(p->v_pool);
    free(p->ref_out);
    free(p->ref_lse);
}

/* The plan's layouts (no buffers): q, out, lse packed; k, v pools; the table, the counts. */
static void layouts(const mixed_problem *p, clattn_tensors *t)
{
    const mixed_case *c = p->c;
    memset(t, 0, sizeof *t);
    t->q = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, p->total_q, c->heads, c->dk, 0);
    t->k = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, p->num_pages, c->page_size, c->kv_heads,
                              c->dk);
    t->v = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, p->num_pages, c->page_size, c->kv_heads,
                              c->dv);
    t->out = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, p->total_q, c->heads, c->dv, 0);
    if (c->lse)
        t->lse = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, c->heads, p->total_q, 0, 0);
    t->block_table = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 2, p->batch, p->blocks, 0, 0);
    t->kv_seqlen = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 1, p->batch, 0, 0, 0);
    t->cu_seqlens_q = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 1, p->batch + 1, 0, 0, 0);
}

static void make_desc(const mixed_case *c, clattn_tensors *t, clattn_sdpa_desc *desc)
{
    clattn_sdpa_desc_init(desc);
    CLATTN_BIND_ROLES(*desc, *t);
    desc->causal = c->causal;
}

#define PAD 5 /* NaN floats before and after out and lse */

/* Runs case c on ctx (traced when `traced`: the attention must be one launch), each request
 * against its own reference, the pads around out and lse still NaN. */
static void run_case(clattn_ctx *ctx, const mixed_case *c, bool traced)
{
    mixed_problem p;
    make_problem(&p, c);
    reference(&p);
    tu_set_case("%s", c->name);
    clattn_tensors t;
    layouts(&p, &t);
    clattn_sdpa_desc desc;
    make_desc(c, &t, &desc);
    clattn_plan *plan = NULL;
    const size_t n_out = p.total_q * c->heads * c->dv, n_lse = c->heads * p.total_q;
    if (!tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS, "create")) {
        free_problem(&p);
        return;
    }
    float *nan_out = tu_nan_floats(n_out);
    t.q.mem = tu_upload_floats(p.q, p.total_q * c->heads * c->dk);
    t.k.mem = tu_upload_floats(p.k_pool, p.num_pages * c->page_size * c->kv_heads * c->dk);
    t.v.mem = tu_upload_floats(p.v_pool, p.num_pages * c->page_size * c->kv_heads * c->dv);
    t.out.mem = tu_upload_padded(nan_out, n_out, PAD, PAD);
    t.out.offset = PAD;
    if (c->lse) {
        t.lse.mem = tu_upload_padded(nan_out, n_lse, PAD, PAD);
        t.lse.offset = PAD;
    }
    t.block_table.mem = tu_upload_bytes(p.table, p.batch * p.blocks * sizeof(int32_t));
    t.kv_seqlen.mem = tu_upload_bytes(p.kv_len, p.batch * sizeof(int32_t));
    t.cu_seqlens_q.mem = tu_upload_bytes(p.cu_q, (p.batch + 1) * sizeof(int32_t));
    if (traced)
        clattn_ctx_trace_kernels(ctx, 1);
    if (tu_expect_status(
            clattn_plan_execute(plan, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL),
            CLATTN_SUCCESS, "execute")) {
        if (traced) {
            clattn_kernel_time times[8];
            size_t count = 0, dropped = 0;
            tu_expect_status(clattn_ctx_kernel_times(ctx, times, 8, &count, &dropped),
                             CLATTN_SUCCESS, "kernel times");
            /* (a device with a loop-trip limit, llvmpipe's quirk or CLATTN_LOOP_TRIP_LIMIT,
             * splits the keys over launches: each a fused launch of all the requests) */
            char name[256] = "";
            clGetDeviceInfo(clattn_ctx_device(ctx), CL_DEVICE_NAME, sizeof name, name, NULL);
            const bool parts = getenv("CLATTN_LOOP_TRIP_LIMIT") || strstr(name, "llvmpipe");
            bool fused = count >= 1 && dropped == 0;
            for (size_t i = 0; i < count && i < 8; ++i)
                fused = fused && (strcmp(times[i].name, "flash_cpu") == 0 ||
                                  strcmp(times[i].name, "flash_attention") == 0);
            tu_expect(fused && (count == 1 || parts),
                      "the mixed batch took %zu launches (first '%s'), want one fused launch",
                      count, count ? times[0].name : "");
            clattn_ctx_trace_kernels(ctx, 0);
        }
        float *got = tu_floats(n_out + 2 * PAD);
        clFinish(clattn_ctx_queue(ctx));
        tu_read_floats(t.out.mem, 0, n_out + 2 * PAD, got);
        tu_expect_close("out", got + PAD, p.ref_out, n_out, TU_TOL);
        tu_expect_nan_outside("out's buffer", got, n_out + 2 * PAD, PAD, n_out);
        if (c->lse) {
            tu_read_floats(t.lse.mem, 0, n_lse + 2 * PAD, got);
            for (size_t i = 0; i < n_lse; ++i) {
                const double want = p.ref_lse[i], have = got[PAD + i];
                tu_expect(isinf(want) ? have == -INFINITY
                                      : fabs(have - want) < 1e-4 * (1 + fabs(want)),
                          "lse[%zu] = %g, want %g", i, have, want);
            }
            tu_expect_nan_outside("lse's buffer", got, n_lse + 2 * PAD, PAD, n_lse);
        }
        free(got);
    }
    clattn_plan_release(plan);
    free(nan_out);
    for (int r = 0; r < CLATTN_ROLE_COUNT; ++r)
        tu_release_mem(t.by_role[r].mem);
    free_problem(&p);
}

/* A queue with profiling on tu_ctx's device, and a context on it (for the kernel trace). */
static clattn_ctx *traced_ctx(cl_command_queue *queue)
{
    cl_int err = CL_SUCCESS;
    *queue = clCreateCommandQueue(clattn_ctx_cl_context(tu_ctx()), clattn_ctx_device(tu_ctx()),
                                  CL_QUEUE_PROFILING_ENABLE, &err);
    if (!tu_expect(err == CL_SUCCESS, "clCreateCommandQueue(profiling): %d", (int)err))
        return NULL;
    clattn_ctx *ctx = NULL;
    char message[512] = "";
    const clattn_status status =
        clattn_ctx_create_from_queue(*queue, &ctx, message, sizeof message);
    tu_expect(status == CLATTN_SUCCESS, "clattn_ctx_create_from_queue: %s", message);
    return status == CLATTN_SUCCESS ? ctx : NULL;
}

/* Each case's mixed batch equals each request alone; one launch (the trace). */
START_TEST(test_mixed_batch)
{
    TU_BEGIN_TEST();
    cl_command_queue queue = NULL;
    clattn_ctx *ctx = traced_ctx(&queue);
    if (ctx != NULL)
        run_case(ctx, _i == 0 && tu_small() ? &small_first : &cases[_i], true);
    clattn_ctx_release(ctx);
    if (queue)
        clReleaseCommandQueue(queue);
    TU_END_TEST();
}
END_TEST

/* The same request run as a batch of one and inside the mixed batch give the same rows (the
 * packed grid finds each request's rows wherever it sits): the chunk of the first case moved
 * to the front, with its neighbours' rows shifted. */
START_TEST(test_chunk_first)
{
    TU_BEGIN_TEST();
    mixed_case c = tu_small() ? small_first : cases[0];
    c.name = "the chunk first, then 3 decodes";
    const size_t rows[4] = {c.rows[2], 1, 1, 1}, keys[4] = {c.keys[2], 63, 1, 129};
    for (int b = 0; b < 4; ++b)
        c.rows[b] = rows[b], c.keys[b] = keys[b];
    run_case(tu_ctx(), &c, false);
    TU_END_TEST();
}
END_TEST

/* --- clattn serve (the CLI; CLATTN_TEST_CLI names the binary) -------------------------------- */

/* A version 1.0 .npy of `count` values, '<f4' (floats) or '<i4' (ints) of shape dims. */
static bool write_npy(const char *dir, const char *name, const void *data, bool ints, int ndim,
                      const size_t *dims)
{
    char path[512], shape[128] = "", header[256];
    size_t count = 1, at = 0;
    for (int i = 0; i < ndim; ++i) {
        at += (size_t)snprintf(shape + at, sizeof shape - at, "%zu,%s", dims[i],
                               i + 1 < ndim ? " " : "");
        count *= dims[i];
    }
    int len = snprintf(header, sizeof header,
                       "{'descr': '%s', 'fortran_order': False, "
                       "'shape': (%s), }",
                       ints ? "<i4" : "<f4", shape);
    while ((10 + len + 1) % 64 != 0)
        header[len++] = ' ';
    header[len++] = '\n';
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return false;
    const unsigned char magic[10] = {
        0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(len & 255), (unsigned char)(len >> 8)};
    const bool ok = fwrite(magic, 1, 10, f) == 10 &&
                    fwrite(header, 1, (size_t)len, f) == (size_t)len &&
                    fwrite(data, 4, count, f) == count;
    return fclose(f) == 0 && ok;
}

/* Reads `count` float32 values after a .npy's header (the CLI writes '<f4' version 1.0). */
static bool read_npy(const char *dir, const char *name, float *values, size_t count)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    unsigned char head[10];
    bool ok = f != NULL && fread(head, 1, 10, f) == 10 &&
              fseek(f, 10 + head[8] + 256 * head[9], SEEK_SET) == 0 &&
              fread(values, sizeof(float), count, f) == count;
    if (f)
        fclose(f);
    return ok;
}

/* The second case's batch through `clattn serve` (its files written here), equal to the
 * reference; then a decreasing cu_seqlens_q refused with exit 2, naming the offset. */
START_TEST(test_cli)
{
    TU_BEGIN_TEST();
    const char *cli = getenv("CLATTN_TEST_CLI");
    if (cli == NULL || !*cli) {
        tu_not_run("test_cli (CLATTN_TEST_CLI, the clattn binary, is unset)");
        TU_END_TEST();
        return;
    }
    mixed_case c = cases[1];
    c.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    c.heads = 4, c.kv_heads = 2;
    mixed_problem p;
    make_problem(&p, &c);
    reference(&p);
    tu_set_case("clattn serve: %s, causal", c.name);
    char dir[] = "/tmp/clattn_mixed_XXXXXX";
    tu_make_temp_dir(dir);
    const size_t q_dims[3] = {p.total_q, c.heads, c.dk};
    const size_t k_dims[4] = {p.num_pages, c.page_size, c.kv_heads, c.dk};
    const size_t v_dims[4] = {p.num_pages, c.page_size, c.kv_heads, c.dv};
    const size_t t_dims[2] = {p.batch, p.blocks}, n_dims[1] = {p.batch}, c_dims[1] = {p.batch + 1};
    int32_t bad_cu[MAX_REQ + 1];
    memcpy(bad_cu, p.cu_q, sizeof bad_cu);
    bad_cu[2] = bad_cu[1] - 1;
    tu_expect(write_npy(dir, "q.npy", p.q, false, 3, q_dims) &&
                  write_npy(dir, "kp.npy", p.k_pool, false, 4, k_dims) &&
                  write_npy(dir, "vp.npy", p.v_pool, false, 4, v_dims) &&
                  write_npy(dir, "bt.npy", p.table, true, 2, t_dims) &&
                  write_npy(dir, "n.npy", p.kv_len, true, 1, n_dims) &&
                  write_npy(dir, "cq.npy", p.cu_q, true, 1, c_dims) &&
                  write_npy(dir, "bad.npy", bad_cu, true, 1, c_dims),
              "writing the .npy files in %s", dir);
    char command[2048];
    const char *common = "%s serve --q %s/q.npy --k-pages %s/kp.npy --v-pages %s/vp.npy "
                         "--block-table %s/bt.npy --seqlens-k %s/n.npy --causal ";
    int at = snprintf(command, sizeof command, common, cli, dir, dir, dir, dir, dir);
    snprintf(command + at, sizeof command - (size_t)at,
             "--cu-seqlens-q %s/cq.npy --out %s/o.npy --lse-out %s/l.npy", dir, dir, dir);
    int rc = system(command);
    const size_t n_out = p.total_q * c.heads * c.dv;
    float *got = tu_nan_floats(n_out);
    if (tu_expect(rc == 0, "%s: exit status %d", command, rc) &&
        tu_expect(read_npy(dir, "o.npy", got, n_out), "reading o.npy"))
        tu_expect_close("clattn serve's out", got, p.ref_out, n_out, TU_TOL);
    snprintf(command + at, sizeof command - (size_t)at,
             "--cu-seqlens-q %s/bad.npy --out %s/o.npy 2> %s/err.txt", dir, dir, dir);
    rc = system(command);
    char err_path[600], text[512] = "";
    snprintf(err_path, sizeof err_path, "%s/err.txt", dir);
    FILE *f = fopen(err_path, "r");
    if (f) {
        text[fread(text, 1, sizeof text - 1, f)] = '\0';
        fclose(f);
    }
    tu_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == 2 && strstr(text, "cu_seqlens_q[2]") != NULL,
              "a decreasing cu_seqlens_q: exit status %d, '%s'", rc, text);
    snprintf(command, sizeof command, "rm -rf %s", dir);
    tu_expect(system(command) == 0, "%s", command);
    free(got);
    free_problem(&p);
    TU_END_TEST();
}
END_TEST

/* What the packed paged plan does not take, each refused naming it. */
START_TEST(test_refusals)
{
    TU_BEGIN_TEST();
    mixed_problem p;
    make_problem(&p, &cases[1]);
    static const tu_refusal refusals[] = {
        {"cu_seqlens_k too", "cu_seqlens_k with block_table", CLATTN_ERR_UNSUPPORTED},
        {"no kv_seqlen", "block_table needs kv_seqlen", CLATTN_ERR_INVALID_ARGUMENT},
        {"path UNFUSED", "fused path only", CLATTN_ERR_UNSUPPORTED},
        {"weights", "with weights: not supported", CLATTN_ERR_UNSUPPORTED},
        {"attn_mask", "with attn_mask: not supported", CLATTN_ERR_UNSUPPORTED},
        {"max_seqlen_k", "with max_seqlen_k: not supported", CLATTN_ERR_UNSUPPORTED},
        {"out of rank 4", "out must be a packed rank-3 tensor", CLATTN_ERR_INVALID_SHAPE},
        {"lse of (total_q, heads)", "lse has dims", CLATTN_ERR_INVALID_SHAPE},
        {"a table of batch + 1 rows", "block_table must be (batch, blocks)",
         CLATTN_ERR_INVALID_SHAPE},
        {"kv_seqlen of batch + 1", "kv_seqlen", CLATTN_ERR_INVALID_SHAPE},
        {"max_seqlen_q past total_q", "max_seqlen_q", CLATTN_ERR_INVALID_ARGUMENT},
    };
    for (int r = 0; r < COUNT_OF(refusals); ++r) {
        tu_set_case("refusal: %s", refusals[r].given);
        clattn_tensors t;
        layouts(&p, &t);
        clattn_sdpa_desc desc;
        make_desc(p.c, &t, &desc);
        switch (r) {
        case 0:
            t.cu_seqlens_k = t.cu_seqlens_q;
            break;
        case 1:
            memset(&t.kv_seqlen, 0, sizeof t.kv_seqlen);
            break;
        case 2:
            desc.path = CLATTN_PATH_UNFUSED;
            break;
        case 3:
            t.weights = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, p.batch, 2, 65, 129);
            break;
        case 4:
            t.attn_mask = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, p.total_q, 129, 0, 0);
            break;
        case 5:
            desc.max_seqlen_k = 129;
            break;
        case 6:
            t.out = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, 1, p.total_q, 2, 8);
            break;
        case 7:
            t.lse = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, p.total_q, 2, 0, 0);
            break;
        case 8:
            t.block_table.dims[0] += 1;
            break;
        case 9:
            t.kv_seqlen.dims[0] += 1;
            break;
        default:
            desc.max_seqlen_q = p.total_q + 1;
            break;
        }
        CLATTN_BIND_ROLES(desc, t);
        TU_EXPECT_REFUSED(clattn_sdpa_plan_create, "sdpa", &desc, refusals[r].want,
                          refusals[r].needle, refusals[r].given);
    }
    /* The backward of packed queries over a paged cache: refused. */
    tu_set_case("refusal: the backward");
    clattn_tensors t;
    layouts(&p, &t);
    t.grad_out = t.out;
    t.grad_q = t.q;
    clattn_sdpa_desc desc;
    make_desc(p.c, &t, &desc);
    clattn_plan *plan = (clattn_plan *)&plan;
    const clattn_status status = clattn_sdpa_backward_plan_create(tu_ctx(), &desc, &plan);
    tu_expect(status != CLATTN_SUCCESS && plan == NULL &&
                  strstr(clattn_last_error(tu_ctx()), "block_table") != NULL,
              "the backward: %s: %s", clattn_status_string(status), clattn_last_error(tu_ctx()));
    free_problem(&p);
    TU_END_TEST();
}
END_TEST

int main(void)
{
    tu_suite_begin("mixed");
    Suite *suite = suite_create("mixed");
    TCase *mixed = tu_tcase(suite, "mixed", 900);
    tcase_add_loop_test(mixed, test_mixed_batch, 0, tu_full() ? COUNT_OF(cases) : DEFAULT_CASES);
    if (!tu_full())
        tu_not_run("test_mixed_batch %d .. %d (more mixes: CLATTN_TEST_SCALE=full)%s",
                   DEFAULT_CASES, COUNT_OF(cases) - 1,
                   tu_small() ? "; the first case with a 40-row chunk over 70 keys" : "");
    tcase_add_test(mixed, test_chunk_first);
    tcase_add_test(mixed, test_refusals);
    tcase_add_test(mixed, test_cli);
    return tu_run_suite(suite);
}
