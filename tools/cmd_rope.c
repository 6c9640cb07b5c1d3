/* clattn rope: rotary position embeddings on .npy files, as ONNX's RotaryEmbedding. */
#include "cli.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char rope_usage[] =
    "Rotary position embeddings (RoFormer), as ONNX's RotaryEmbedding operator computes them:\n"
    "row (b, h, s) at position pos has pair j < R / 2 of its first R columns turned by t_j,\n"
    "  (x1, x2) -> (x1 cos t_j - x2 sin t_j, x1 sin t_j + x2 cos t_j),\n"
    "the pairs (x[j], x[j + R/2]) (GPT-NeoX, Llama; the default) or with --interleaved\n"
    "(x[2j], x[2j + 1]) (the paper's); the other columns are copied.\n"
    "X: (B, H, S, d), or (B, S, H * d) with --num-heads H; float32, float64, float16 or\n"
    "bfloat16. --rotary-dim R: even, at most d (default d).\n"
    "Angles: --cos/--sin caches, (max_pos, R/2) indexed by --position-ids (B, S) int64, or\n"
    "(B, S, R/2) per row without ids; or, without caches, t_j = pos * B^(-2j / R) (--base,\n"
    "default 10000) at pos = the id, or --start + s.\n"
    "Output: Y with X's shape and dtype (float64 gives float32), to --out or printed when small.\n"
    "Exit status: 0 success, 1 device or library failure, 2 bad options or input files.\n";

typedef struct rope_options {
    cli_exec exec; /* --device */
    const char *x, *cos, *sin, *ids, *out;
    size_t num_heads, rotary_dim, start;
    bool interleaved;
    float base; /* 0: the default */
} rope_options;

typedef struct rope_data {
    clattn_array x, cos, sin, ids;
    int32_t *ids32;
    float *out;
    cl_mem mem[5];
} rope_data;

static void rope_free(rope_data *d)
{
    cli_release_buffers(d->mem, 5);
    clattn_array *const arrays[] = {&d->x, &d->cos, &d->sin, &d->ids};
    void *const blocks[] = {d->ids32, d->out};
    cli_free_all(arrays, CLI_COUNT(arrays), blocks, CLI_COUNT(blocks));
}

#define AT(field) CLI_AT(rope_options, field)
static const cli_option rope_table[] = {
    {CLI_OPT("--x", CLI_PATH, AT(x), "X.npy", "the input, (B, H, S, d) or (B, S, H * d)"),
     .flags = CLI_REQUIRED},
    {CLI_OPT("--cos", CLI_PATH, AT(cos), "C.npy", "a cosine cache (max_pos, R/2) or (B, S, R/2)")},
    {CLI_OPT("--sin", CLI_PATH, AT(sin), "S.npy", "the sine cache, as --cos")},
    {CLI_OPT("--position-ids", CLI_PATH, AT(ids), "P.npy", "positions (B, S) int64")},
    {CLI_OPT("--num-heads", CLI_SIZE, AT(num_heads), "H", "the heads of a rank 3 input"), .min = 1},
    {CLI_OPT("--interleaved", CLI_FLAG, AT(interleaved), NULL, "pairs (x[2j], x[2j + 1])")},
    {CLI_OPT("--rotary-dim", CLI_SIZE, AT(rotary_dim), "R",
             "the columns that turn (even; default d)")},
    {CLI_OPT("--base", CLI_FLOAT, AT(base), "B", "the angles' base (default 10000)"), .min = 1},
    {CLI_OPT("--start", CLI_SIZE, AT(start), "P", "the position of row 0 without ids (default 0)")},
    {CLI_OPT("--out", CLI_PATH, AT(out), "Y.npy", "write Y (else it is printed when small)")},
    CLI_USE(cli_exec_group, rope_options, exec, 0),
};
#undef AT

static const char *const rope_help[] = {rope_usage, NULL};
static const cli_command rope_command_spec = CLI_COMMAND("rope", rope_table, rope_help);

static int parse_rope_options(int argc, char **argv, rope_options *o)
{
    const int rc = cli_parse_command(&rope_command_spec, argc, argv, o);
    if (rc != CLI_OK)
        return rc;
    if (!o->x)
        return cli_fail("rope", CLI_BAD_INPUT, "--x X.npy is required (see --help)");
    if (!o->cos != !o->sin)
        return cli_fail("rope", CLI_BAD_INPUT, "--cos and --sin go together");
    if (!cli_check_output("rope", "--out", o->out)) /* before any work */
        return CLI_BAD_INPUT;
    return CLI_OK;
}

static int load(const char *path, clattn_array *out, bool integer)
{
    if (cli_read_array("rope", path, out) != CLI_OK)
        return CLI_BAD_INPUT;
    if (integer != (out->source == CLATTN_IO_INT))
        return cli_fail("rope", CLI_BAD_INPUT, "%s: expected %s values", path,
                        integer ? "int64 or int32" : "float");
    if (!integer && out->source == CLATTN_IO_BOOL)
        return cli_fail("rope", CLI_BAD_INPUT, "%s: expected float values", path);
    return CLI_OK;
}

static cl_mem upload(clattn_ctx *ctx, const void *data, size_t bytes, cl_int *err)
{
    return clCreateBuffer(clattn_ctx_cl_context(ctx),
                          (data ? CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR : CL_MEM_WRITE_ONLY),
                          bytes ? bytes : 1, (void *)data, err);
}

static int run_rope(const rope_options *o, rope_data *d)
{
    int rc;
    if ((rc = load(o->x, &d->x, false)) || (o->cos && (rc = load(o->cos, &d->cos, false))) ||
        (o->sin && (rc = load(o->sin, &d->sin, false))) ||
        (o->ids && (rc = load(o->ids, &d->ids, true))))
        return rc;
    const clattn_array *x = &d->x;
    size_t batch, heads, seq, dim;
    bool rank3 = false;
    if (x->ndim == 4) {
        batch = x->shape[0], heads = x->shape[1], seq = x->shape[2], dim = x->shape[3];
        if (o->num_heads && o->num_heads != heads)
            return cli_fail("rope", CLI_BAD_INPUT, "%s has %zu heads but --num-heads is %zu", o->x,
                            heads, o->num_heads);
    } else if (x->ndim == 3) {
        if (!o->num_heads)
            return cli_fail("rope", CLI_BAD_INPUT, "%s is (B, S, H * d): give --num-heads H", o->x);
        if (x->shape[2] % o->num_heads != 0)
            return cli_fail("rope", CLI_BAD_INPUT, "%s: %zu features do not split into %zu heads",
                            o->x, x->shape[2], o->num_heads);
        rank3 = true;
        batch = x->shape[0], seq = x->shape[1], heads = o->num_heads;
        dim = x->shape[2] / heads;
    } else {
        return cli_fail("rope", CLI_BAD_INPUT,
                        "%s has rank %d; expected (B, H, S, d) or (B, S, H * d)", o->x, x->ndim);
    }
    const size_t rot = o->rotary_dim ? o->rotary_dim : dim;
    if (rot % 2 != 0 || rot > dim)
        return cli_fail("rope", CLI_BAD_INPUT, "--rotary-dim %zu: must be even and at most %zu",
                        rot, dim);
    const size_t half = rot / 2;
    if (o->ids) {
        if (d->ids.ndim != 2 || d->ids.shape[0] != batch || d->ids.shape[1] != seq)
            return cli_fail("rope", CLI_BAD_INPUT, "%s: position ids must be (%zu, %zu)", o->ids,
                            batch, seq);
        const size_t rows = o->cos ? (d->cos.ndim == 2 ? d->cos.shape[0] : 0) : (size_t)1 << 24;
        d->ids32 = malloc(d->ids.count * sizeof *d->ids32);
        if (d->ids32 == NULL)
            return cli_fail("rope", CLI_FAILED, "out of memory");
        for (size_t i = 0; i < d->ids.count; ++i) {
            const float id = d->ids.data[i];
            if (!(id >= 0.0f && id < (float)rows))
                return cli_fail("rope", CLI_BAD_INPUT,
                                "%s: position id %g is not in 0 .. %zu (the cache's rows)", o->ids,
                                (double)id, rows ? rows - 1 : 0);
            d->ids32[i] = (int32_t)id;
        }
    }
    if (o->cos) {
        const bool by_position = o->ids != NULL;
        const bool ok = by_position ? d->cos.ndim == 2 && d->cos.shape[1] == half
                                    : d->cos.ndim == 3 && d->cos.shape[0] == batch &&
                                          d->cos.shape[1] == seq && d->cos.shape[2] == half;
        const bool same = d->sin.ndim == d->cos.ndim && d->sin.count == d->cos.count &&
                          memcmp(d->sin.shape, d->cos.shape, sizeof d->cos.shape) == 0;
        if (!ok || !same)
            return cli_fail("rope", CLI_BAD_INPUT, "%s and %s: the caches must both be %s", o->cos,
                            o->sin,
                            by_position ? "(max_pos, R/2) with --position-ids"
                                        : "(B, S, R/2) without --position-ids");
    }

    clattn_rope_desc desc;
    clattn_rope_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.style = o->interleaved ? CLATTN_ROPE_PAIRS : CLATTN_ROPE_HALVES;
    desc.rotary_dim = rot;
    desc.base = o->base ? o->base : CLATTN_ROPE_BASE_DEFAULT;
    desc.start = o->start;
    clattn_tensors *t = &desc_tensors;
    t->q = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, batch, heads, seq, dim);
    if (rank3) { /* (B, S, H*d) viewed as (B, H, S, d) */
        t->q.strides[0] = seq * heads * dim, t->q.strides[1] = dim;
        t->q.strides[2] = heads * dim, t->q.strides[3] = 1;
    }
    t->out = t->q;
    if (o->cos) {
        t->rope_cos =
            d->cos.ndim == 2
                ? clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, d->cos.shape[0], half, 0, 0)
                : clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, batch, seq, half, 0);
        t->rope_sin = t->rope_cos;
    }
    if (o->ids)
        t->position_ids = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 2, batch, seq, 0, 0);
    d->out = malloc(x->count * sizeof(float));
    if (d->out == NULL)
        return cli_fail("rope", CLI_FAILED, "out of memory for the output");

    clattn_ctx *ctx = cli_context("rope", o->exec.device);
    if (ctx == NULL)
        return cli_context_exit();
    clattn_plan *plan = NULL;
    clattn_status status = clattn_rope_plan_create(ctx, &desc, &plan);
    cl_int err = CL_SUCCESS;
    if (status == CLATTN_SUCCESS) {
        d->mem[0] = upload(ctx, x->data, x->count * sizeof(float), &err);
        if (err == CL_SUCCESS)
            d->mem[1] = upload(ctx, NULL, x->count * sizeof(float), &err);
        if (err == CL_SUCCESS && o->cos)
            d->mem[2] = upload(ctx, d->cos.data, d->cos.count * sizeof(float), &err);
        if (err == CL_SUCCESS && o->cos)
            d->mem[3] = upload(ctx, d->sin.data, d->sin.count * sizeof(float), &err);
        if (err == CL_SUCCESS && o->ids)
            d->mem[4] = upload(ctx, d->ids32, d->ids.count * sizeof(int32_t), &err);
        if (err == CL_SUCCESS) {
            clattn_tensors bound = desc_tensors;
            bound.q.mem = d->mem[0], bound.out.mem = d->mem[1];
            bound.rope_cos.mem = d->mem[2], bound.rope_sin.mem = d->mem[3];
            bound.position_ids.mem = d->mem[4];
            status = clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                         NULL, NULL);
        }
        if (err == CL_SUCCESS && status == CLATTN_SUCCESS)
            err = clEnqueueReadBuffer(clattn_ctx_queue(ctx), d->mem[1], CL_TRUE, 0,
                                      x->count * sizeof(float), d->out, 0, NULL, NULL);
    }
    rc = cli_call_failure("rope", ctx, status, false, err);
    clattn_plan_release(plan);
    cli_release_context(ctx);
    if (rc != CLI_OK)
        return rc;
    if (o->out) {
        char msg[1024];
        if (clattn_npy_write_typed(o->out, d->out, x->ndim, x->shape, x->source, msg, sizeof msg) !=
            CLATTN_IO_OK)
            return cli_fail("rope", CLI_FAILED, "%s", msg);
    } else if (x->count <= 4096) {
        cli_print_matrix("Y (every row of the last dim)", d->out, x->count / x->shape[x->ndim - 1],
                         x->shape[x->ndim - 1]);
    } else {
        printf("Y: %zu values (give --out Y.npy to keep them)\n", x->count);
    }
    return CLI_OK;
}

int cmd_rope(int argc, char **argv)
{
    rope_options options;
    memset(&options, 0, sizeof options);
    int rc = parse_rope_options(argc, argv, &options);
    if (rc != CLI_OK)
        return rc < 0 ? CLI_OK : rc;
    rope_data data;
    memset(&data, 0, sizeof data);
    rc = run_rope(&options, &data);
    rope_free(&data);
    return rc;
}
