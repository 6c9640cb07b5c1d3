/* clattn merge: two partial attention states merged by their log-sum-exp (clattn_merge_states,
 * FlashInfer's merge_state) on .npy files. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char merge_usage[] =
    "Merges two partial attention results of the same query rows over disjoint key sets into\n"
    "the result over their union (FlashInfer's merge_state): per row, m = max(lse_a, lse_b),\n"
    "w = exp(lse - m), O = (w_a O_a + w_b O_b) / (w_a + w_b), LSE = m + log(w_a + w_b).\n"
    "O_a, O_b: (rows.., head_dim), rank 2 to 4, e.g. (seq_len, heads, head_dim) or an sdpa\n"
    "output (B, H, L, d); LSE_a, LSE_b: the same dims without head_dim, the natural-log\n"
    "log-sum-exp (clattn's lse, torch.logsumexp of the scaled scores; FlashInfer's base-2 lse\n"
    "times ln 2). A row with lse -inf saw no key: the other side is taken as it is.\n"
    "Output: O to --out (else printed when small), LSE to --lse-out.\n"
    "Exit status: 0 success, 1 device or library failure, 2 bad options or input files.\n";

typedef struct merge_options {
    cli_exec exec; /* --device */
    const char *o_a, *lse_a, *o_b, *lse_b, *out, *lse_out;
} merge_options;

#define AT(field) CLI_AT(merge_options, field)
static const cli_option merge_table[] = {
    {CLI_OPT("--o-a", CLI_PATH, AT(o_a), "A.npy", "the first state's output (rows.., d)"),
     .flags = CLI_REQUIRED},
    {CLI_OPT("--lse-a", CLI_PATH, AT(lse_a), "LA.npy", "its log-sum-exp (rows..)"),
     .flags = CLI_REQUIRED},
    {CLI_OPT("--o-b", CLI_PATH, AT(o_b), "B.npy", "the second state's output"),
     .flags = CLI_REQUIRED},
    {CLI_OPT("--lse-b", CLI_PATH, AT(lse_b), "LB.npy", "its log-sum-exp"), .flags = CLI_REQUIRED},
    {CLI_OPT("--out", CLI_PATH, AT(out), "O.npy", "write the merged output")},
    {CLI_OPT("--lse-out", CLI_PATH, AT(lse_out), "L.npy", "write the merged log-sum-exp")},
    CLI_USE(cli_exec_group, merge_options, exec, 0),
};
#undef AT

static const char *const merge_help[] = {merge_usage, NULL};
static const cli_command merge_command_spec = CLI_COMMAND("merge", merge_table, merge_help);

typedef struct merge_data {
    clattn_array a[4]; /* o_a, lse_a, o_b, lse_b */
    float *out, *lse;
    cl_mem mem[6];
} merge_data;

static int merge_shapes(const merge_options *o, const merge_data *d)
{
    const char *paths[4] = {o->o_a, o->lse_a, o->o_b, o->lse_b};
    const clattn_array *oa = &d->a[0];
    if (oa->ndim < 2 || oa->ndim > 4)
        return cli_fail("merge", CLI_BAD_INPUT, "%s has rank %d; expected 2 to 4, (rows.., d)",
                        paths[0], oa->ndim);
    for (int i = 1; i < 4; ++i) {
        const clattn_array *x = &d->a[i];
        const int rank = i == 2 ? oa->ndim : oa->ndim - 1;
        if (x->ndim != rank || memcmp(x->shape, oa->shape, (size_t)rank * sizeof x->shape[0]))
            return cli_fail("merge", CLI_BAD_INPUT, "%s: expected %s's dims%s", paths[i],
                            paths[0], i == 2 ? "" : " without the last");
    }
    return CLI_OK;
}

static clattn_status merge_on_device(clattn_ctx *ctx, merge_data *d, cl_int *err)
{
    const clattn_array *oa = &d->a[0];
    size_t dims[4] = {1, 1, 1, 1};
    memcpy(dims, oa->shape, (size_t)oa->ndim * sizeof dims[0]);
    const size_t rows = oa->count / oa->shape[oa->ndim - 1];
    const size_t counts[6] = {oa->count, rows, oa->count, rows, oa->count, rows};
    for (int i = 0; i < 6 && *err == CL_SUCCESS; ++i)
        d->mem[i] = clCreateBuffer(clattn_ctx_cl_context(ctx),
                                   CL_MEM_READ_WRITE | (i < 4 ? CL_MEM_COPY_HOST_PTR : 0),
                                   counts[i] * sizeof(float), i < 4 ? d->a[i].data : NULL, err);
    if (*err != CL_SUCCESS)
        return CLATTN_SUCCESS;
    clattn_tensor t[6];
    for (int i = 0; i < 6; ++i) {
        const int rank = i % 2 ? oa->ndim - 1 : oa->ndim;
        t[i] = clattn_tensor_make(d->mem[i], 0, CLATTN_DTYPE_F32, rank, dims[0], dims[1], dims[2],
                                  dims[3]);
    }
    clattn_status status =
        clattn_merge_states(ctx, &t[0], &t[1], &t[2], &t[3], &t[4], &t[5], 0, NULL, NULL);
    cl_command_queue queue = clattn_ctx_queue(ctx);
    if (status == CLATTN_SUCCESS)
        *err = clEnqueueReadBuffer(queue, d->mem[4], CL_TRUE, 0, oa->count * sizeof(float),
                                   d->out, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS && *err == CL_SUCCESS)
        *err = clEnqueueReadBuffer(queue, d->mem[5], CL_TRUE, 0, rows * sizeof(float), d->lse, 0,
                                   NULL, NULL);
    return status;
}

static int merge_write(const merge_options *o, const merge_data *d)
{
    const clattn_array *oa = &d->a[0];
    char msg[1024];
    if (o->out && clattn_npy_write_typed(o->out, d->out, oa->ndim, oa->shape, CLATTN_IO_F32, msg,
                                         sizeof msg) != CLATTN_IO_OK)
        return cli_fail("merge", CLI_FAILED, "%s", msg);
    if (o->lse_out && clattn_npy_write_typed(o->lse_out, d->lse, oa->ndim - 1, oa->shape,
                                             CLATTN_IO_F32, msg, sizeof msg) != CLATTN_IO_OK)
        return cli_fail("merge", CLI_FAILED, "%s", msg);
    if (!o->out && oa->count <= 4096)
        cli_print_matrix("O (every row of the last dim)", d->out,
                         oa->count / oa->shape[oa->ndim - 1], oa->shape[oa->ndim - 1]);
    return CLI_OK;
}

static int run_merge(const merge_options *o, merge_data *d)
{
    const char *paths[4] = {o->o_a, o->lse_a, o->o_b, o->lse_b};
    int rc = CLI_OK;
    for (int i = 0; i < 4 && rc == CLI_OK; ++i)
        rc = cli_read_array("merge", paths[i], &d->a[i]);
    if (rc != CLI_OK || (rc = merge_shapes(o, d)) != CLI_OK)
        return rc;
    d->out = malloc(d->a[0].count * sizeof(float));
    d->lse = malloc(d->a[1].count * sizeof(float));
    if (d->out == NULL || d->lse == NULL)
        return cli_fail("merge", CLI_FAILED, "out of memory for the output");
    clattn_ctx *ctx = cli_context("merge", o->exec.device);
    if (ctx == NULL)
        return cli_context_exit();
    cl_int err = CL_SUCCESS;
    const clattn_status status = merge_on_device(ctx, d, &err);
    rc = cli_call_failure("merge", ctx, status, false, err);
    cli_release_context(ctx);
    return rc != CLI_OK ? rc : merge_write(o, d);
}

int cmd_merge(int argc, char **argv)
{
    merge_options options;
    memset(&options, 0, sizeof options);
    int rc = cli_parse_command(&merge_command_spec, argc, argv, &options);
    if (rc != CLI_OK)
        return rc < 0 ? CLI_OK : rc;
    if (!options.o_a || !options.lse_a || !options.o_b || !options.lse_b)
        return cli_fail("merge", CLI_BAD_INPUT,
                        "--o-a, --lse-a, --o-b and --lse-b are required (see --help)");
    if (!cli_check_output("merge", "--out", options.out) ||
        !cli_check_output("merge", "--lse-out", options.lse_out))
        return CLI_BAD_INPUT;
    merge_data data;
    memset(&data, 0, sizeof data);
    rc = run_merge(&options, &data);
    cli_release_buffers(data.mem, 6);
    clattn_array *const arrays[] = {&data.a[0], &data.a[1], &data.a[2], &data.a[3]};
    void *const blocks[] = {data.out, data.lse};
    cli_free_all(arrays, CLI_COUNT(arrays), blocks, CLI_COUNT(blocks));
    return rc;
}
