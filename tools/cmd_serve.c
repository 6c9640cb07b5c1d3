/* clattn serve: one serving step's attention on .npy files: a batch of requests, each decoding
 * (one query row) or prefilling a chunk (many rows), their rows packed, over one paged KV
 * cache, in one fused launch (the C API's cu_seqlens_q with block_table and kv_seqlen). */
#include "cli.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char serve_usage[] =
    "One serving step's attention (a mixed batch: chunked prefill and decoding in one launch).\n"
    "Q (total_q, Hq, d): the step's query rows of B requests packed, request b's rows\n"
    "CQ[b] .. CQ[b + 1] - 1 (--cu-seqlens-q, (B + 1) integers from 0 to total_q, non-\n"
    "decreasing); a decoding request has one row, a prefill chunk many. The keys are a paged\n"
    "cache's (FlashAttention's flash_attn_with_kvcache layout): KP (pages, page_size, Hkv, d)\n"
    "and VP (pages, page_size, Hkv, dv), request b's key j in slot j % page_size of page\n"
    "BT[b, j / page_size] (--block-table (B, blocks) integers), its first N[b] keys attended\n"
    "(--seqlens-k (B) integers; a chunk's own keys are in the cache already, written by the\n"
    "step's append). --causal: bottom-right per request, row i of a request with n rows and N\n"
    "keys sees keys j <= i + N - n. Hkv divides Hq (grouped-query attention).\n"
    "Output: O (total_q, Hq, dv) to --out (printed when small), and with --lse-out the\n"
    "log-sum-exp (Hq, total_q) (-inf for a row with no key).\n"
    "Exit status: 0 success, 1 device or library failure, 2 bad options or input files.\n";

typedef struct serve_options {
    cli_exec exec;   /* --device */
    cli_score score; /* --causal, --scale, --softcap */
    const char *q, *k_pages, *v_pages, *block_table, *seqlens_k, *cu_q, *out, *lse;
} serve_options;

typedef struct serve_data {
    clattn_array q, kp, vp, table, counts, cu;
    int32_t *ints[3]; /* the table, the counts, the offsets as I32 */
    float *out, *lse;
    cl_mem mem[8];
} serve_data;

static void serve_free(serve_data *d)
{
    cli_release_buffers(d->mem, CLI_COUNT(d->mem));
    clattn_array *const arrays[] = {&d->q, &d->kp, &d->vp, &d->table, &d->counts, &d->cu};
    void *const blocks[] = {d->ints[0], d->ints[1], d->ints[2], d->out, d->lse};
    cli_free_all(arrays, CLI_COUNT(arrays), blocks, CLI_COUNT(blocks));
}

#define AT(field) CLI_AT(serve_options, field)
static const cli_option serve_table[] = {
    {CLI_OPT("--q", CLI_PATH, AT(q), "Q.npy", "the packed query rows (total_q, Hq, d)"),
     .flags = CLI_REQUIRED},
    {CLI_OPT("--cu-seqlens-q", CLI_PATH, AT(cu_q), "CQ.npy",
             "each request's rows: (B + 1) offsets"),
     .flags = CLI_REQUIRED},
    {CLI_OPT("--k-pages", CLI_PATH, AT(k_pages), "KP.npy",
             "the cache's keys (pages, size, Hkv, d)"),
     .flags = CLI_REQUIRED},
    {CLI_OPT("--v-pages", CLI_PATH, AT(v_pages), "VP.npy", "its values (pages, size, Hkv, dv)"),
     .flags = CLI_REQUIRED},
    {CLI_OPT("--block-table", CLI_PATH, AT(block_table), "BT.npy",
             "each request's pages (B, blocks)"),
     .flags = CLI_REQUIRED},
    {CLI_OPT("--seqlens-k", CLI_PATH, AT(seqlens_k), "N.npy", "each request's key count (B)"),
     .flags = CLI_REQUIRED},
    CLI_USE(cli_score_group, serve_options, score,
            CLI_SCORE_CAUSAL | CLI_SCORE_SCALE | CLI_SCORE_SOFTCAP),
    {CLI_OPT("--out", CLI_PATH, AT(out), "O.npy", "write O (else it is printed when small)")},
    {CLI_OPT("--lse-out", CLI_PATH, AT(lse), "L.npy", "write the log-sum-exp (Hq, total_q)")},
    CLI_USE(cli_exec_group, serve_options, exec, 0),
};
#undef AT

static const char *const serve_help[] = {serve_usage, NULL};
static const cli_command serve_command_spec = CLI_COMMAND("serve", serve_table, serve_help);

static int parse_serve_options(int argc, char **argv, serve_options *o)
{
    o->score.scale = NAN;
    const int rc = cli_parse_command(&serve_command_spec, argc, argv, o);
    if (rc != CLI_OK)
        return rc;
    if (!o->q || !o->cu_q || !o->k_pages || !o->v_pages || !o->block_table || !o->seqlens_k)
        return cli_fail("serve", CLI_BAD_INPUT,
                        "--q, --cu-seqlens-q, --k-pages, --v-pages, --block-table and "
                        "--seqlens-k are required (see --help)");
    if (!cli_check_output("serve", "--out", o->out) ||
        !cli_check_output("serve", "--lse-out", o->lse))
        return CLI_BAD_INPUT;
    return CLI_OK;
}

/* An array of `rank` dims with float (integer: int) values. */
static int load(const char *path, clattn_array *out, int rank, bool integer, const char *shape)
{
    if (cli_read_array("serve", path, out) != CLI_OK)
        return CLI_BAD_INPUT;
    if (integer != (out->source == CLATTN_IO_INT) || out->source == CLATTN_IO_BOOL)
        return cli_fail("serve", CLI_BAD_INPUT, "%s: expected %s values", path,
                        integer ? "int32 or int64" : "float");
    if (out->ndim != rank)
        return cli_fail("serve", CLI_BAD_INPUT, "%s has rank %d; expected %s", path, out->ndim,
                        shape);
    return CLI_OK;
}

/* The integers as I32 in [low, high] (what = the array's name for the message). */
static int to_i32(const clattn_array *a, const char *what, double low, double high, int32_t **out)
{
    *out = malloc((a->count ? a->count : 1) * sizeof(int32_t));
    if (*out == NULL)
        return cli_fail("serve", CLI_FAILED, "out of memory");
    for (size_t i = 0; i < a->count; ++i) {
        const double x = a->data[i];
        if (!(x >= low && x <= high))
            return cli_fail("serve", CLI_BAD_INPUT, "%s[%zu] = %g is not in %g .. %g", what, i, x,
                            low, high);
        (*out)[i] = (int32_t)x;
    }
    return CLI_OK;
}

/* The offsets from 0 to total_q, non-decreasing; each block that holds one of its request's
 * keys a page of the pool. */
static int check_batch(const serve_options *o, serve_data *d, size_t total_q, size_t pages,
                       size_t page_size)
{
    const size_t batch = d->cu.count - 1, blocks = d->table.shape[1];
    int rc;
    if (d->table.shape[0] != batch || d->counts.count != batch)
        return cli_fail("serve", CLI_BAD_INPUT,
                        "%s has %zu offsets (B + 1): %s must be (%zu, blocks) and %s (%zu)",
                        o->cu_q, d->cu.count, o->block_table, batch, o->seqlens_k, batch);
    if ((rc = to_i32(&d->cu, "cu_seqlens_q", 0, (double)total_q, &d->ints[2])) ||
        (rc = to_i32(&d->counts, "seqlens_k", 0, (double)(blocks * page_size), &d->ints[1])) ||
        (rc = to_i32(&d->table, "block_table", -1, (double)INT32_MAX, &d->ints[0])))
        return rc;
    const int32_t *cu = d->ints[2];
    if (cu[0] != 0 || (size_t)cu[batch] != total_q)
        return cli_fail("serve", CLI_BAD_INPUT,
                        "cu_seqlens_q runs from %d to %d; it must run from 0 to total_q = %zu",
                        cu[0], cu[batch], total_q);
    for (size_t b = 0; b < batch; ++b) {
        if (cu[b + 1] < cu[b])
            return cli_fail("serve", CLI_BAD_INPUT,
                            "cu_seqlens_q[%zu] = %d is below cu_seqlens_q[%zu] = %d: the offsets "
                            "must not decrease",
                            b + 1, cu[b + 1], b, cu[b]);
        const size_t used = ((size_t)d->ints[1][b] + page_size - 1) / page_size;
        for (size_t j = 0; j < used; ++j)
            if (d->ints[0][b * blocks + j] < 0 || (size_t)d->ints[0][b * blocks + j] >= pages)
                return cli_fail("serve", CLI_BAD_INPUT,
                                "block_table[%zu, %zu] = %d is not a page of the pool (0 .. %zu), "
                                "and request %zu has %d keys",
                                b, j, d->ints[0][b * blocks + j], pages - 1, b, d->ints[1][b]);
    }
    return CLI_OK;
}

/* The inputs read and checked: Q (total_q, Hq, d), the pools, the table, counts and offsets. */
static int read_inputs(const serve_options *o, serve_data *d)
{
    int rc;
    if ((rc = load(o->q, &d->q, 3, false, "(total_q, Hq, d)")) ||
        (rc = load(o->k_pages, &d->kp, 4, false, "(pages, page_size, Hkv, d)")) ||
        (rc = load(o->v_pages, &d->vp, 4, false, "(pages, page_size, Hkv, dv)")) ||
        (rc = load(o->block_table, &d->table, 2, true, "(B, blocks)")) ||
        (rc = load(o->seqlens_k, &d->counts, 1, true, "(B)")) ||
        (rc = load(o->cu_q, &d->cu, 1, true, "(B + 1)")))
        return rc;
    const size_t *q = d->q.shape, *kp = d->kp.shape, *vp = d->vp.shape;
    if (kp[3] != q[2] || vp[0] != kp[0] || vp[1] != kp[1] || vp[2] != kp[2] || kp[2] == 0 ||
        q[1] % kp[2] != 0)
        return cli_fail("serve", CLI_BAD_INPUT,
                        "%s (pages, page_size, Hkv, d) and %s (pages, page_size, Hkv, dv) must "
                        "share pages, page_size and Hkv, with d = Q's %zu and Hkv dividing Q's "
                        "%zu heads",
                        o->k_pages, o->v_pages, q[2], q[1]);
    if (d->cu.count < 2)
        return cli_fail("serve", CLI_BAD_INPUT, "%s: at least one request (B + 1 >= 2 offsets)",
                        o->cu_q);
    return check_batch(o, d, q[0], kp[0], kp[1]);
}

/* The plan on the inputs' layouts, run once; out and lse read back. */
static int run_step(const serve_options *o, serve_data *d)
{
    const size_t *q = d->q.shape, *kp = d->kp.shape;
    const size_t total_q = q[0], heads = q[1], dv = d->vp.shape[3], batch = d->cu.count - 1;
    clattn_tensors t;
    memset(&t, 0, sizeof t);
    t.q = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, total_q, heads, q[2], 0);
    t.k = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, kp[0], kp[1], kp[2], kp[3]);
    t.v = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, kp[0], kp[1], kp[2], dv);
    t.out = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, total_q, heads, dv, 0);
    if (o->lse)
        t.lse = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, heads, total_q, 0, 0);
    t.block_table =
        clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 2, batch, d->table.shape[1], 0, 0);
    t.kv_seqlen = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 1, batch, 0, 0, 0);
    t.cu_seqlens_q = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 1, batch + 1, 0, 0, 0);
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    CLATTN_BIND_ROLES(desc, t);
    desc.causal = o->score.causal ? CLATTN_CAUSAL_BOTTOM_RIGHT : CLATTN_CAUSAL_NONE;
    desc.scale = o->score.scale;
    desc.softcap = o->score.softcap;
    d->out = malloc(total_q * heads * dv * sizeof(float));
    d->lse = malloc(heads * total_q * sizeof(float));
    if (d->out == NULL || d->lse == NULL)
        return cli_fail("serve", CLI_FAILED, "out of memory for the output");
    clattn_ctx *ctx = cli_context("serve", o->exec.device);
    if (ctx == NULL)
        return cli_context_exit();
    clattn_plan *plan = NULL;
    clattn_status status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    cl_int err = CL_SUCCESS;
    const struct {
        const void *data;
        size_t bytes;
        clattn_tensor *tensor;
    } inputs[] = {
        {d->q.data, d->q.count * sizeof(float), &t.q},
        {d->kp.data, d->kp.count * sizeof(float), &t.k},
        {d->vp.data, d->vp.count * sizeof(float), &t.v},
        {d->ints[0], d->table.count * sizeof(int32_t), &t.block_table},
        {d->ints[1], batch * sizeof(int32_t), &t.kv_seqlen},
        {d->ints[2], (batch + 1) * sizeof(int32_t), &t.cu_seqlens_q},
        {NULL, total_q * heads * dv * sizeof(float), &t.out},
        {NULL, o->lse ? heads * total_q * sizeof(float) : 0, &t.lse},
    };
    for (size_t i = 0; i < CLI_COUNT(inputs) && status == CLATTN_SUCCESS && err == CL_SUCCESS; ++i)
        if (inputs[i].bytes) {
            d->mem[i] = clCreateBuffer(clattn_ctx_cl_context(ctx),
                                       inputs[i].data ? CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR
                                                      : CL_MEM_WRITE_ONLY,
                                       inputs[i].bytes, (void *)inputs[i].data, &err);
            inputs[i].tensor->mem = d->mem[i];
        }
    if (status == CLATTN_SUCCESS && err == CL_SUCCESS)
        status = clattn_plan_execute(plan, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS && err == CL_SUCCESS)
        err = clEnqueueReadBuffer(clattn_ctx_queue(ctx), d->mem[6], CL_TRUE, 0, inputs[6].bytes,
                                  d->out, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS && err == CL_SUCCESS && o->lse)
        err = clEnqueueReadBuffer(clattn_ctx_queue(ctx), d->mem[7], CL_TRUE, 0, inputs[7].bytes,
                                  d->lse, 0, NULL, NULL);
    const int rc = cli_call_failure("serve", ctx, status, false, err);
    clattn_plan_release(plan);
    cli_release_buffers(d->mem, CLI_COUNT(d->mem));
    cli_release_context(ctx);
    return rc;
}

static int write_outputs(const serve_options *o, const serve_data *d)
{
    const size_t total_q = d->q.shape[0], heads = d->q.shape[1], dv = d->vp.shape[3];
    const size_t o_shape[3] = {total_q, heads, dv}, l_shape[2] = {heads, total_q};
    char msg[1024];
    if (o->out && clattn_npy_write_typed(o->out, d->out, 3, o_shape, d->q.source, msg,
                                         sizeof msg) != CLATTN_IO_OK)
        return cli_fail("serve", CLI_FAILED, "%s", msg);
    if (o->lse && clattn_npy_write_typed(o->lse, d->lse, 2, l_shape, CLATTN_IO_F32, msg,
                                         sizeof msg) != CLATTN_IO_OK)
        return cli_fail("serve", CLI_FAILED, "%s", msg);
    if (!o->out && total_q * heads * dv <= 4096)
        cli_print_matrix("O (total_q * Hq rows of dv)", d->out, total_q * heads, dv);
    else if (!o->out)
        printf("O: %zu values (give --out O.npy to keep them)\n", total_q * heads * dv);
    return CLI_OK;
}

int cmd_serve(int argc, char **argv)
{
    serve_options options;
    memset(&options, 0, sizeof options);
    int rc = parse_serve_options(argc, argv, &options);
    if (rc != CLI_OK)
        return rc < 0 ? CLI_OK : rc;
    serve_data data;
    memset(&data, 0, sizeof data);
    if ((rc = read_inputs(&options, &data)) == CLI_OK && (rc = run_step(&options, &data)) == CLI_OK)
        rc = write_outputs(&options, &data);
    serve_free(&data);
    return rc;
}
