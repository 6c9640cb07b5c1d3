/* clattn additive: additive (Bahdanau) attention on .npy files. */
#include "cli.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char additive_usage[] =
    "Additive attention (Bahdanau, Cho and Bengio 2015): the score of query i and key j is\n"
    "  score(i, j) = w . tanh(q_i W1 + b1 + k_j W2 + b2),\n"
    "then the masks and softmax (or relu) over j, and out_i = sum_j weights_ij v_j.\n"
    "Q (L, dq) or (B, L, dq); K (S, dk) or (B, S, dk), default Q; V (S, dv) or (B, S, dv),\n"
    "default K. W1 (dq, da), W2 (dk, da), w (da); b1, b2 (da), optional.\n"
    "--heads H: H heads, each with its own W1, W2, w (and b1, b2): W1 (H, dq, da) or\n"
    "  (dq, H * da) (head h: columns h * da ..), W2 likewise, w and b (H, da) or (H * da); head\n"
    "  h attends over V's columns h * dv / H .. (dv divisible by H) and the heads' outputs are\n"
    "  concatenated (no output projection).\n"
    "Masks: --causal (query i sees keys j <= i); --attn-mask (L, S): float, added to the scores\n"
    "(-inf masks), or bool/uint8, True = masked by default (as `clattn run` and PyTorch's\n"
    "nn.MultiheadAttention; `clattn sdpa` reads True = attend); --mask-true attend|masked says\n"
    "which (a note on stderr when a bool mask comes without it); --key-padding-mask (B, S) (or\n"
    "(S)), true = ignore that key (--mask-true does not change it). A fully masked row gives\n"
    "zeros.\n"
    "--path: auto (default: the fused kernel, which never stores the L x S scores, unless the\n"
    "weights are asked for), fused, or unfused (a kernel forms the scores tile by tile, without\n"
    "the (L, S, da) tanh terms).\n"
    "Outputs: --out O.npy ((L, dv) or (B, L, dv)), else printed when small; --attn-out A.npy:\n"
    "the weights (B, H, L, S) ((H, L, S) unbatched); --attn-png A.png: their heatmap for batch 0,\n"
    "one panel per head, masked cells grey, --png-scale row (default), log or global (see\n"
    "`clattn run --help`).\n"
    "Exit status: 0 success, 1 device or library failure, 2 bad options or input files.\n";

typedef struct additive_options {
    const char *query, *key, *value, *w1, *w2, *w, *b1, *b2, *attn_mask;
    const char *out, *attn_out; /* --out O.npy, --attn-out A.npy */
    size_t heads;
    bool heads_given;
    cli_score score;     /* --causal, --norm, --path */
    cli_masks masks;     /* --mask-true (default masked), --key-padding-mask */
    cli_heatmap heatmap; /* --attn-png, --png-scale (default row) */
    cli_exec exec;       /* --device */
} additive_options;

enum { A_Q, A_K, A_V, A_W1, A_W2, A_W, A_B1, A_B2, A_MASK, A_KPM, A_COUNT };

typedef struct additive_data {
    clattn_array in[A_COUNT];
    float *mask;      /* additive (L, S) */
    uint8_t *padding; /* (B, S), nonzero = ignore */
    float *out, *weights;
    cl_mem mem[A_COUNT + 2];
} additive_data;

static void additive_free(additive_data *d)
{
    cli_release_buffers(d->mem, A_COUNT + 2);
    for (int i = 0; i < A_COUNT; ++i)
        clattn_array_free(&d->in[i]);
    void *const blocks[] = {d->mask, d->padding, d->out, d->weights};
    cli_free_all(NULL, 0, blocks, CLI_COUNT(blocks));
}

#define AT(field) CLI_AT(additive_options, field)
static const cli_option additive_table[] = {
    {CLI_OPT("--query", CLI_PATH, AT(query), "Q.npy", "the queries, (L, dq) or (B, L, dq)"),
     .flags = CLI_REQUIRED},
    {CLI_OPT("--key", CLI_PATH, AT(key), "K.npy", "the keys, (S, dk) or (B, S, dk) (default: Q)")},
    {CLI_OPT("--value", CLI_PATH, AT(value), "V.npy",
             "the values, (S, dv) or (B, S, dv) (default: K)")},
    {CLI_OPT("--w1", CLI_PATH, AT(w1), "W1.npy", "the query weights (dq, da)"),
     .flags = CLI_REQUIRED},
    {CLI_OPT("--w2", CLI_PATH, AT(w2), "W2.npy", "the key weights (dk, da)"),
     .flags = CLI_REQUIRED},
    {CLI_OPT("--w", CLI_PATH, AT(w), "w.npy", "the score vector (da)"), .flags = CLI_REQUIRED},
    {CLI_OPT("--b1", CLI_PATH, AT(b1), "B1.npy", "the query bias (da)")},
    {CLI_OPT("--b2", CLI_PATH, AT(b2), "B2.npy", "the key bias (da)")},
    {CLI_OPT("--heads", CLI_SIZE, AT(heads), "H", "heads, each with its own weights (default 1)"),
     .min = 1, .given = CLI_GIVEN(additive_options, heads_given)},
    CLI_USE(cli_score_group, additive_options, score,
            CLI_SCORE_CAUSAL | CLI_SCORE_NORM | CLI_SCORE_PATH),
    {CLI_OPT("--attn-mask", CLI_PATH, AT(attn_mask), "M.npy",
             "(L, S): float added, or bool (True = masked by default)")},
    CLI_USE(cli_masks_group, additive_options, masks, 0),
    {CLI_OPT("--out", CLI_PATH, AT(out), "O.npy",
             "write the output (else it is printed when small)")},
    {CLI_OPT("--attn-out", CLI_PATH, AT(attn_out), "A.npy", "write the weights (B, H, L, S)")},
    CLI_USE(cli_heatmap_group, additive_options, heatmap, 0),
    CLI_USE(cli_exec_group, additive_options, exec, 0),
};
#undef AT

static const char *const additive_help[] = {additive_usage, NULL};
static const cli_command additive_command_spec =
    CLI_COMMAND("additive", additive_table, additive_help);

static int parse_options(int argc, char **argv, additive_options *o)
{
    o->heads = 1;
    const int rc = cli_parse_command(&additive_command_spec, argc, argv, o);
    if (rc != CLI_OK)
        return rc;
    if (!o->query || !o->w1 || !o->w2 || !o->w)
        return cli_fail("additive", CLI_BAD_INPUT,
                        "--query, --w1, --w2 and --w are required (see --help)");
    if (o->score.path == CLATTN_PATH_FUSED && (o->attn_out || o->heatmap.png))
        return cli_fail("additive", CLI_BAD_INPUT,
                        "--path fused never forms the weights: drop --attn-out/--attn-png or use "
                        "--path auto");
    if (!cli_check_output("additive", "--out", o->out) ||
        !cli_check_output("additive", "--attn-out", o->attn_out) ||
        !cli_check_output("additive", "--attn-png", o->heatmap.png))
        return CLI_BAD_INPUT;
    return CLI_OK;
}

static const char *shape_text(const clattn_array *a, char *text, size_t size)
{
    size_t used = (size_t)snprintf(text, size, "(");
    for (int i = 0; i < a->ndim && used < size; ++i)
        used += (size_t)snprintf(text + used, size - used, i ? ", %zu" : "%zu", a->shape[i]);
    if (used < size)
        snprintf(text + used, size - used, a->ndim == 1 ? ",)" : ")");
    return text;
}

static int load(const char *path, clattn_array *out)
{
    if (cli_read_array("additive", path, out) != CLI_OK)
        return CLI_BAD_INPUT;
    if (out->source == CLATTN_IO_INT)
        return cli_fail("additive", CLI_BAD_INPUT, "%s: expected float values", path);
    return CLI_OK;
}

/* A tensor of a's shape, packed F32 (mem bound later). */
static clattn_tensor tensor_of(const clattn_array *a)
{
    clattn_tensor t =
        clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, a->ndim, a->ndim > 0 ? a->shape[0] : 0,
                           a->ndim > 1 ? a->shape[1] : 0, a->ndim > 2 ? a->shape[2] : 0, 0);
    return t;
}

/* *out = a * b, false on overflow. */
static bool product(size_t a, size_t b, size_t *out)
{
    if (b != 0 && a > SIZE_MAX / b)
        return false;
    *out = a * b;
    return true;
}

static cl_mem upload(clattn_ctx *ctx, const void *data, size_t bytes, cl_int *err)
{
    return clCreateBuffer(clattn_ctx_cl_context(ctx),
                          (data ? CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR : CL_MEM_WRITE_ONLY),
                          bytes ? bytes : 1, (void *)data, err);
}

/* The problem's sizes, from the inputs. */
typedef struct additive_sizes {
    size_t batch, heads, seq_q, seq_k, dv;
    size_t out_count, weight_count; /* weight_count 0: the weights not asked for */
    bool batched, want_weights;
} additive_sizes;

/* Reads every file (key and value default to the query, value to the key) and checks q, k, v
 * and W1's shapes against each other. */
static int load_inputs(const additive_options *o, additive_data *d, additive_sizes *z)
{
    int rc;
    char text[128];
    const char *files[A_COUNT] = {o->query,
                                  o->key ? o->key : o->query,
                                  o->value ? o->value : (o->key ? o->key : o->query),
                                  o->w1,
                                  o->w2,
                                  o->w,
                                  o->b1,
                                  o->b2,
                                  o->attn_mask,
                                  o->masks.key_padding};
    for (int i = 0; i < A_COUNT; ++i)
        if (files[i] && (rc = load(files[i], &d->in[i])))
            return rc;
    const clattn_array *q = &d->in[A_Q], *k = &d->in[A_K], *v = &d->in[A_V];
    if (q->ndim != 2 && q->ndim != 3)
        return cli_fail("additive", CLI_BAD_INPUT,
                        "%s has shape %s; expected (L, dq) or (B, L, dq)", o->query,
                        shape_text(q, text, sizeof text));
    const bool batched = z->batched = q->ndim == 3;
    const size_t batch = z->batch = batched ? q->shape[0] : 1;
    z->seq_q = q->shape[q->ndim - 2];
    if (k->ndim != q->ndim || (batched && k->shape[0] != batch))
        return cli_fail("additive", CLI_BAD_INPUT, "%s has shape %s; expected %s", files[A_K],
                        shape_text(k, text, sizeof text),
                        batched ? "(B, S, dk) with the query's B" : "(S, dk)");
    const size_t seq_k = z->seq_k = k->shape[k->ndim - 2];
    if (v->ndim != q->ndim || (batched && v->shape[0] != batch) || v->shape[v->ndim - 2] != seq_k)
        return cli_fail("additive", CLI_BAD_INPUT, "%s has shape %s; expected %s with S = %zu",
                        files[A_V], shape_text(v, text, sizeof text),
                        batched ? "(B, S, dv)" : "(S, dv)", seq_k);
    z->dv = v->shape[v->ndim - 1], z->heads = o->heads;
    /* W1 (dq, da) for one head is (dq, H * da) with H = 1; (H, d, da) likewise. */
    const clattn_array *w1 = &d->in[A_W1];
    if (w1->ndim != 2 && w1->ndim != 3)
        return cli_fail("additive", CLI_BAD_INPUT,
                        "%s has shape %s; expected (dq, da), (dq, H * da) or (H, dq, da)", o->w1,
                        shape_text(w1, text, sizeof text));
    if (w1->ndim == 3 && !o->heads_given && w1->shape[0] != z->heads)
        return cli_fail("additive", CLI_BAD_INPUT,
                        "%s has shape %s: %zu heads of (dq, da); pass --heads %zu", o->w1,
                        shape_text(w1, text, sizeof text), w1->shape[0], w1->shape[0]);
    return CLI_OK;
}

/* The attention mask as added floats (L, S), the key padding as bytes (nonzero = ignore). */
static int load_masks(const additive_options *o, additive_data *d, const additive_sizes *z)
{
    char text[128];
    if (d->in[A_MASK].count) {
        const clattn_array *m = &d->in[A_MASK];
        if (m->ndim != 2 || m->shape[0] != z->seq_q || m->shape[1] != z->seq_k)
            return cli_fail("additive", CLI_BAD_INPUT, "%s has shape %s, expected (%zu, %zu)",
                            o->attn_mask, shape_text(m, text, sizeof text), z->seq_q, z->seq_k);
        d->mask = malloc(m->count * sizeof(float));
        if (d->mask == NULL)
            return cli_fail("additive", CLI_FAILED, "out of memory");
        const bool boolean = m->source == CLATTN_IO_BOOL;
        if (boolean)
            cli_note_mask_convention("additive", "--attn-mask", o->masks.true_masked,
                                     o->masks.true_given);
        for (size_t i = 0; i < m->count; ++i)
            d->mask[i] = boolean ? ((m->data[i] != 0.0f) == o->masks.true_masked ? -INFINITY : 0.0f)
                                 : m->data[i];
    }
    if (o->masks.key_padding) {
        const clattn_array *p = &d->in[A_KPM];
        const bool ok = z->batched
                            ? p->ndim == 2 && p->shape[0] == z->batch && p->shape[1] == z->seq_k
                            : p->ndim == 1 && p->shape[0] == z->seq_k;
        if (!ok)
            return cli_fail("additive", CLI_BAD_INPUT, "%s has shape %s, expected %s",
                            o->masks.key_padding, shape_text(p, text, sizeof text),
                            z->batched ? "(B, S)" : "(S,)");
        d->padding = malloc(p->count ? p->count : 1);
        if (d->padding == NULL)
            return cli_fail("additive", CLI_FAILED, "out of memory");
        for (size_t i = 0; i < p->count; ++i)
            d->padding[i] = p->data[i] != 0.0f;
    }
    return CLI_OK;
}

/* The descriptor's options and the tensors' layouts; host room for the outputs. */
static int describe(const additive_options *o, additive_data *d, additive_sizes *z,
                    clattn_additive_desc *desc, clattn_tensors *t)
{
    const size_t batch = z->batch, heads = z->heads, seq_q = z->seq_q, seq_k = z->seq_k;
    desc->num_heads = heads;
    desc->causal = o->score.causal ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
    desc->norm = o->score.norm;
    desc->path = o->score.path;
    t->q = tensor_of(&d->in[A_Q]);
    t->k = tensor_of(&d->in[A_K]);
    t->v = tensor_of(&d->in[A_V]);
    t->out = z->batched ? clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, batch, seq_q, z->dv, 0)
                        : clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, seq_q, z->dv, 0, 0);
    t->q_weight = tensor_of(&d->in[A_W1]);
    t->k_weight = tensor_of(&d->in[A_W2]);
    t->score_weight = tensor_of(&d->in[A_W]);
    if (o->b1)
        t->q_bias = tensor_of(&d->in[A_B1]);
    if (o->b2)
        t->k_bias = tensor_of(&d->in[A_B2]);
    if (d->mask)
        t->attn_mask = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, seq_q, seq_k, 0, 0);
    if (d->padding)
        t->key_padding_mask = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_U8, 2, batch, seq_k, 0, 0);
    const bool want_weights = z->want_weights = o->attn_out || o->heatmap.png;
    size_t rows = 0;
    if (!product(batch, seq_q, &rows) || !product(rows, z->dv, &z->out_count) ||
        (want_weights && (!product(batch, heads, &z->weight_count) ||
                          !product(z->weight_count, seq_q, &z->weight_count) ||
                          !product(z->weight_count, seq_k, &z->weight_count))))
        return cli_fail("additive", CLI_BAD_INPUT, "the outputs' sizes overflow");
    if (want_weights)
        t->weights = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, batch, heads, seq_q, seq_k);
    d->out = malloc((z->out_count ? z->out_count : 1) * sizeof(float));
    d->weights =
        want_weights ? malloc((z->weight_count ? z->weight_count : 1) * sizeof(float)) : NULL;
    if (d->out == NULL || (want_weights && d->weights == NULL))
        return cli_fail("additive", CLI_FAILED, "out of memory for the outputs");
    return CLI_OK;
}

/* The inputs uploaded (their roles bound in bound), the plan run, the outputs read back. */
static cl_int execute(clattn_ctx *ctx, clattn_plan *plan, additive_data *d, const additive_sizes *z,
                      clattn_tensors bound, clattn_status *status)
{
    cl_int err = CL_SUCCESS;
    clattn_tensor *roles[A_COUNT] = {&bound.q,         &bound.k,
                                     &bound.v,         &bound.q_weight,
                                     &bound.k_weight,  &bound.score_weight,
                                     &bound.q_bias,    &bound.k_bias,
                                     &bound.attn_mask, &bound.key_padding_mask};
    for (int i = 0; i < A_COUNT && err == CL_SUCCESS; ++i) {
        if (roles[i]->rank == 0)
            continue;
        const void *data = i == A_MASK  ? (const void *)d->mask
                           : i == A_KPM ? (const void *)d->padding
                                        : (const void *)d->in[i].data;
        const size_t bytes = d->in[i].count * (i == A_KPM ? 1 : sizeof(float));
        d->mem[i] = upload(ctx, data, bytes, &err);
        roles[i]->mem = d->mem[i];
    }
    if (err == CL_SUCCESS)
        d->mem[A_COUNT] = upload(ctx, NULL, z->out_count * sizeof(float), &err);
    if (err == CL_SUCCESS && z->want_weights)
        d->mem[A_COUNT + 1] = upload(ctx, NULL, z->weight_count * sizeof(float), &err);
    bound.out.mem = d->mem[A_COUNT];
    bound.weights.mem = d->mem[A_COUNT + 1];
    if (err == CL_SUCCESS)
        *status =
            clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL);
    if (err == CL_SUCCESS && *status == CLATTN_SUCCESS)
        err = clEnqueueReadBuffer(clattn_ctx_queue(ctx), d->mem[A_COUNT], CL_TRUE, 0,
                                  z->out_count * sizeof(float), d->out, 0, NULL, NULL);
    if (err == CL_SUCCESS && *status == CLATTN_SUCCESS && z->want_weights)
        err = clEnqueueReadBuffer(clattn_ctx_queue(ctx), d->mem[A_COUNT + 1], CL_TRUE, 0,
                                  z->weight_count * sizeof(float), d->weights, 0, NULL, NULL);
    return err;
}

/* The plan made and run on the device. */
static int run_device(const additive_options *o, additive_data *d, const additive_sizes *z,
                      const clattn_additive_desc *desc, const clattn_tensors *tensors)
{
    clattn_ctx *ctx = cli_context("additive", o->exec.device);
    if (ctx == NULL)
        return cli_context_exit();
    clattn_plan *plan = NULL;
    clattn_status status = clattn_additive_plan_create(ctx, desc, &plan);
    cl_int err = CL_SUCCESS;
    if (status == CLATTN_SUCCESS)
        err = execute(ctx, plan, d, z, *tensors, &status);
    const int rc = cli_call_failure("additive", ctx, status, false, err);
    clattn_plan_release(plan);
    cli_release_context(ctx);
    return rc;
}

/* The output (written, or printed when small), the weights and their heatmap. */
static int write_results(const additive_options *o, const additive_data *d, const additive_sizes *z)
{
    char msg[1024];
    const size_t batch = z->batch, seq_q = z->seq_q, dv = z->dv;
    const bool batched = z->batched;
    const size_t out_shape[3] = {batch, seq_q, dv};
    if (o->out) {
        if (clattn_npy_write(o->out, d->out, batched ? 3 : 2, batched ? out_shape : out_shape + 1,
                             msg, sizeof msg) != CLATTN_IO_OK)
            return cli_fail("additive", CLI_FAILED, "%s", msg);
    } else if (z->out_count <= 4096) {
        for (size_t b = 0; b < batch; ++b) {
            char title[64];
            snprintf(title, sizeof title, batched ? "output[%zu]" : "output", b);
            cli_print_matrix(title, d->out + b * seq_q * dv, seq_q, dv);
        }
    } else {
        printf("output: %zu values (give --out O.npy to keep them)\n", z->out_count);
    }
    const size_t w_shape[4] = {batch, z->heads, seq_q, z->seq_k};
    if (o->attn_out &&
        clattn_npy_write(o->attn_out, d->weights, batched ? 4 : 3, batched ? w_shape : w_shape + 1,
                         msg, sizeof msg) != CLATTN_IO_OK)
        return cli_fail("additive", CLI_FAILED, "%s", msg);
    if (!o->heatmap.png)
        return CLI_OK;
    const cli_png_masks masks_png = {.heads = z->heads,
                                     .rows = seq_q,
                                     .cols = z->seq_k,
                                     .causal = o->score.causal,
                                     .padding = d->padding,
                                     .additive = d->mask};
    return cli_write_attention_png("additive", o->heatmap.png, d->weights, &masks_png,
                                   o->heatmap.scale);
}

static int run(const additive_options *o, additive_data *d)
{
    int rc;
    additive_sizes sizes = {0};
    clattn_additive_desc desc;
    clattn_additive_desc_init(&desc);
    clattn_tensors tensors = {0};
    CLATTN_BIND_ROLES(desc, tensors);
    if ((rc = load_inputs(o, d, &sizes)) || (rc = load_masks(o, d, &sizes)) ||
        (rc = describe(o, d, &sizes, &desc, &tensors)) ||
        (rc = run_device(o, d, &sizes, &desc, &tensors)))
        return rc;
    return write_results(o, d, &sizes);
}

int cmd_additive(int argc, char **argv)
{
    /* True = masked: PyTorch's nn.MultiheadAttention convention */
    additive_options options = {.masks = {.true_masked = true}};
    int rc = parse_options(argc, argv, &options);
    if (rc != CLI_OK)
        return rc < 0 ? CLI_OK : rc;
    additive_data data = {.mask = NULL}; /* everything empty */
    rc = run(&options, &data);
    additive_free(&data);
    return rc;
}
