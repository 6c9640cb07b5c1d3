/* clattn demo: the textbook's attention examples computed on the device, chapter by chapter, in
 * Hung-yi Lee's lecture notation (inputs a^i, queries q^i, keys k^i, values v^i, scores
 * α_{i,j}, weights α'_{i,j}, outputs b^i). Every number printed comes from the library, except
 * the lines that say "host check". */
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char demo_usage[] =
    "The textbook's attention examples, computed on the device with clattn's kernels. Every\n"
    "matrix is printed with its name in Hung-yi Lee's lecture notation (inputs a^i, queries\n"
    "q^i, keys k^i, values v^i, scores α, weights α', outputs b^i) and what it is.\n"
    "chapters:\n"
    "  dot        (the default) self-attention of 3 inputs of 4 features, one head:\n"
    "             q^i = W^q a^i, k^i, v^i (clattn_matmul); α_{i,j} = q^i·k^j / sqrt(d),\n"
    "             α' = softmax over j, b^i = Σ_j α'_{i,j} v^j (an attention plan)\n"
    "  multihead  the same in matrix form with 2 heads of 2: Q = X·Wq, K, V; per head h\n"
    "             A_h = Q_h·K_hᵀ / sqrt(d_h), A'_h = softmax of A_h's rows, O_h = A'_h·V_h;\n"
    "             O = concat(O_1, O_2)·Wo (clattn_matmul, and an MHA plan for A' and O)\n"
    "  posenc     Attention Is All You Need's sinusoidal positional encodings e^i\n"
    "             (8 positions x 6), and a^i + e^i (a positional-encoding plan)\n"
    "  rope       rotary embeddings: q^i and k^i before and after rotation, and the rotated\n"
    "             q·k for positions 0..9: it depends on the positions' difference only\n"
    "  additive   Bahdanau's additive attention: α_{i,j} = wᵀ tanh(q^i W1 + k^j W2),\n"
    "             α' = softmax over j, b^i = Σ_j α'_{i,j} v^j (an additive attention plan)\n"
    "  all        every chapter in order\n"
    "Exit status: 0 success, 1 device or library failure, 2 bad options (an unwritable --png\n"
    "FILE or a malformed --device included).\n";

/* ---------------------------------------------------------------------------------------------
 * Device steps: a sticky status (every step after a failure does nothing), the buffers and
 * plans of one chapter, released together.
 * ------------------------------------------------------------------------------------------- */

enum { DEMO_MAX_BUFFERS = 24, DEMO_MAX_PLANS = 4 };

typedef struct demo {
    clattn_ctx *ctx;
    clattn_status status; /* the first failure */
    char failure[1024];   /* what failed and why */
    cl_mem buffers[DEMO_MAX_BUFFERS];
    size_t buffer_count;
    clattn_plan *plans[DEMO_MAX_PLANS];
    size_t plan_count;
} demo;

/* Records an OpenCL call's failure. */
static bool demo_cl(demo *d, cl_int err, const char *call)
{
    if (err != CL_SUCCESS && d->status == CLATTN_SUCCESS) {
        d->status = (clattn_status)err;
        snprintf(d->failure, sizeof d->failure, "%s: %s", call,
                 clattn_status_string((clattn_status)err));
    }
    return d->status == CLATTN_SUCCESS;
}

/* Records a library call's failure with the context's message. */
static bool demo_lib(demo *d, clattn_status status, const char *call)
{
    if (status != CLATTN_SUCCESS && d->status == CLATTN_SUCCESS) {
        d->status = status;
        snprintf(d->failure, sizeof d->failure, "%s: %s: %s", call, clattn_status_string(status),
                 clattn_last_error(d->ctx));
    }
    return d->status == CLATTN_SUCCESS;
}

/* A device buffer of count floats holding `values` (NULL: unset). */
static cl_mem demo_buffer(demo *d, const float *values, size_t count)
{
    if (d->status != CLATTN_SUCCESS)
        return NULL;
    if (d->buffer_count == DEMO_MAX_BUFFERS) {
        demo_cl(d, CL_OUT_OF_HOST_MEMORY, "demo: too many buffers");
        return NULL;
    }
    cl_int err = CL_SUCCESS;
    cl_mem mem =
        clCreateBuffer(clattn_ctx_cl_context(d->ctx),
                       CL_MEM_READ_WRITE | (values ? CL_MEM_COPY_HOST_PTR : (cl_mem_flags)0),
                       count * sizeof(float), (void *)values, &err);
    if (!demo_cl(d, err, "clCreateBuffer"))
        return NULL;
    d->buffers[d->buffer_count++] = mem;
    return mem;
}

/* Reads count floats of mem into out (after the work queued before: the queue is in order). */
static void demo_read(demo *d, cl_mem mem, size_t count, float *out)
{
    if (d->status == CLATTN_SUCCESS)
        demo_cl(d,
                clEnqueueReadBuffer(clattn_ctx_queue(d->ctx), mem, CL_TRUE, 0,
                                    count * sizeof(float), out, 0, NULL, NULL),
                "clEnqueueReadBuffer");
}

/* Keeps the plan a create call made (*created, read after the call) for demo_release; NULL
 * after a failure. */
static clattn_plan *demo_plan(demo *d, clattn_status status, clattn_plan **created,
                              const char *call)
{
    clattn_plan *plan = *created;
    if (!demo_lib(d, status, call)) {
        clattn_plan_release(plan);
        return NULL;
    }
    if (d->plan_count == DEMO_MAX_PLANS) {
        clattn_plan_release(plan);
        demo_cl(d, CL_OUT_OF_HOST_MEMORY, "demo: too many plans");
        return NULL;
    }
    d->plans[d->plan_count++] = plan;
    return plan;
}

static void demo_execute(demo *d, clattn_plan *plan, const clattn_tensors *tensors)
{
    if (d->status == CLATTN_SUCCESS)
        demo_lib(d,
                 clattn_plan_execute(plan, tensors->by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL,
                                     NULL),
                 "clattn_plan_execute");
}

/* Releases the chapter's plans and buffers (the status stays). */
static void demo_release(demo *d)
{
    for (size_t i = 0; i < d->plan_count; ++i)
        clattn_plan_release(d->plans[i]);
    for (size_t i = 0; i < d->buffer_count; ++i)
        clReleaseMemObject(d->buffers[i]);
    d->plan_count = d->buffer_count = 0;
}

/* A rows x cols matrix in a float buffer, its rows row_stride elements apart (a block of
 * columns of a wider matrix is the same buffer at another offset). */
static clattn_tensor demo_matrix(cl_mem mem, size_t offset, size_t rows, size_t cols,
                                 size_t row_stride)
{
    clattn_tensor t = clattn_tensor_make(mem, offset, CLATTN_DTYPE_F32, 2, rows, cols, 0, 0);
    t.strides[0] = row_stride;
    t.strides[1] = 1;
    return t;
}

/* c = alpha · a · b, or alpha · a · bᵀ with trans_b. */
static void demo_matmul(demo *d, clattn_tensor a, clattn_tensor b, int trans_b, float alpha,
                        clattn_tensor c)
{
    if (d->status != CLATTN_SUCCESS)
        return;
    const clattn_matmul_desc desc = {
        .struct_size = sizeof desc, .trans_b = trans_b, .alpha = alpha};
    demo_lib(d, clattn_matmul(d->ctx, &desc, &a, &b, NULL, &c, 0, NULL, NULL), "clattn_matmul");
}

/* Prints the chapter's failure as the command's one line; returns the exit code. */
static int demo_failed(demo *d)
{
    demo_release(d);
    return cli_fail("demo", CLI_FAILED, "%s", d->failure);
}

/* ---------------------------------------------------------------------------------------------
 * Printing: a title line (the name and what it is), then the rows, each labelled.
 * ------------------------------------------------------------------------------------------- */

typedef struct demo_print {
    const char *title;
    const float *values;
    size_t rows, cols;
    const char *row_name; /* rows labelled row_name + index ("a^": a^1, a^2 ..); NULL: none */
    size_t row_base;      /* the first row's index */
    const char *col_name; /* a header line of col_name + index over the columns; NULL: none */
    size_t col_base;
    int width, decimals; /* of each value; 0: 10 and 6 */
} demo_print;

enum { DEMO_LABEL = 5 }; /* the row labels' column, in characters */

/* Characters as a terminal shows them: UTF-8 continuation bytes take no column. */
static size_t display_width(const char *text)
{
    size_t width = 0;
    for (const unsigned char *c = (const unsigned char *)text; *c; ++c)
        width += (*c & 0xC0) != 0x80;
    return width;
}

static void print_label(const char *label)
{
    printf("  %s", label);
    for (size_t w = display_width(label); w < DEMO_LABEL; ++w)
        putchar(' ');
}

static void print_table(const demo_print *m)
{
    const int width = m->width ? m->width : 10, decimals = m->decimals ? m->decimals : 6;
    char label[64];
    printf("%s\n", m->title);
    if (m->col_name) {
        print_label("");
        for (size_t c = 0; c < m->cols; ++c) {
            snprintf(label, sizeof label, "%s%zu", m->col_name, m->col_base + c);
            printf(" %*s", width, label);
        }
        printf("\n");
    }
    for (size_t r = 0; r < m->rows; ++r) {
        label[0] = '\0';
        if (m->row_name)
            snprintf(label, sizeof label, "%s%zu", m->row_name, m->row_base + r);
        print_label(label);
        for (size_t c = 0; c < m->cols; ++c)
            printf(" %*.*f", width, decimals, m->values[r * m->cols + c] + 0.0f); /* no -0 */
        printf("\n");
    }
    printf("\n");
}

/* A matrix with rows labelled row_name + 1, 2 .. and columns col_name + 1, 2 .. (NULL: none). */
static void print_matrix(const char *title, const float *values, size_t rows, size_t cols,
                         const char *row_name, const char *col_name)
{
    print_table(&(demo_print){.title = title,
                              .values = values,
                              .rows = rows,
                              .cols = cols,
                              .row_name = row_name,
                              .row_base = 1,
                              .col_name = col_name,
                              .col_base = 1});
}

static void print_chapter(const char *title)
{
    printf("== %s ==\n\n", title);
}

/* Largest |got - want| over count values. */
static double max_difference(const float *got, const double *want, size_t count)
{
    double worst = 0.0;
    for (size_t i = 0; i < count; ++i)
        worst = fmax(worst, fabs((double)got[i] - want[i]));
    return worst;
}

/* ---------------------------------------------------------------------------------------------
 * The example every chapter starts from: 3 inputs of d_model = 4 features, and 4 x 4
 * projections stored d_in x d_out (q^i = W^q a^i is the row a^i·Wq).
 * ------------------------------------------------------------------------------------------- */

enum { SEQ = 3, DMODEL = 4 }; /* positions, features */

static const float example_x[SEQ * DMODEL] = {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 1, 1};
static const float example_wq[DMODEL * DMODEL] = {1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0};
static const float example_wk[DMODEL * DMODEL] = {0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1};
static const float example_wv[DMODEL * DMODEL] = {1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 1, 1, 0, 0};

/* The example's inputs and weights on the device, and Q, K, V = X·Wq, X·Wk, X·Wv. */
typedef struct example {
    cl_mem x, w[3], qkv[3];
} example;

static example example_project(demo *d)
{
    example e = {demo_buffer(d, example_x, SEQ * DMODEL),
                 {demo_buffer(d, example_wq, DMODEL * DMODEL),
                  demo_buffer(d, example_wk, DMODEL * DMODEL),
                  demo_buffer(d, example_wv, DMODEL * DMODEL)},
                 {NULL, NULL, NULL}};
    for (int i = 0; i < 3; ++i) {
        e.qkv[i] = demo_buffer(d, NULL, SEQ * DMODEL);
        demo_matmul(d, demo_matrix(e.x, 0, SEQ, DMODEL, DMODEL),
                    demo_matrix(e.w[i], 0, DMODEL, DMODEL, DMODEL), 0, 1.0f,
                    demo_matrix(e.qkv[i], 0, SEQ, DMODEL, DMODEL));
    }
    return e;
}

/* ---------------------------------------------------------------------------------------------
 * Chapter dot
 * ------------------------------------------------------------------------------------------- */

static int chapter_dot(demo *d)
{
    float q[SEQ * DMODEL], k[SEQ * DMODEL], v[SEQ * DMODEL], alpha[SEQ * SEQ], weights[SEQ * SEQ],
        b[SEQ * DMODEL];
    const example e = example_project(d);
    cl_mem alpha_mem = demo_buffer(d, NULL, SEQ * SEQ),
           weights_mem = demo_buffer(d, NULL, SEQ * SEQ);
    cl_mem b_mem = demo_buffer(d, NULL, SEQ * DMODEL);
    /* α, α' and b from one plan on the unfused path, which materialises the scaled scores
     * (its `scores` output) and their softmax (its `weights`). */
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.scale = 0.5f; /* 1 / sqrt(d), d = 4 */
    desc.path = CLATTN_PATH_UNFUSED;
    desc.scores_mode = CLATTN_SCORES_SCALED;
    clattn_tensors *t = &desc_tensors;
    t->q = clattn_tensor_make(e.qkv[0], 0, CLATTN_DTYPE_F32, 4, 1, 1, SEQ, DMODEL);
    t->k = clattn_tensor_make(e.qkv[1], 0, CLATTN_DTYPE_F32, 4, 1, 1, SEQ, DMODEL);
    t->v = clattn_tensor_make(e.qkv[2], 0, CLATTN_DTYPE_F32, 4, 1, 1, SEQ, DMODEL);
    t->out = clattn_tensor_make(b_mem, 0, CLATTN_DTYPE_F32, 4, 1, 1, SEQ, DMODEL);
    t->scores = clattn_tensor_make(alpha_mem, 0, CLATTN_DTYPE_F32, 4, 1, 1, SEQ, SEQ);
    t->weights = clattn_tensor_make(weights_mem, 0, CLATTN_DTYPE_F32, 4, 1, 1, SEQ, SEQ);
    clattn_plan *plan = NULL;
    if (d->status == CLATTN_SUCCESS)
        plan = demo_plan(d, clattn_sdpa_plan_create(d->ctx, &desc, &plan), &plan,
                         "clattn_sdpa_plan_create");
    demo_execute(d, plan, t);
    demo_read(d, e.qkv[0], SEQ * DMODEL, q);
    demo_read(d, e.qkv[1], SEQ * DMODEL, k);
    demo_read(d, e.qkv[2], SEQ * DMODEL, v);
    demo_read(d, alpha_mem, SEQ * SEQ, alpha);
    demo_read(d, weights_mem, SEQ * SEQ, weights);
    demo_read(d, b_mem, SEQ * DMODEL, b);
    if (d->status != CLATTN_SUCCESS)
        return demo_failed(d);
    demo_release(d);

    print_chapter("dot: self-attention by dot products, one head");
    print_matrix("a^i: the inputs, one per position i (the rows of X, 3 x 4)", example_x, SEQ,
                 DMODEL, "a^", NULL);
    print_matrix("W^q: learned, maps an input to its query (stored d_model x d: q^i is the row "
                 "a^i·W^q)",
                 example_wq, DMODEL, DMODEL, NULL, NULL);
    print_matrix("W^k: learned, maps an input to its key", example_wk, DMODEL, DMODEL, NULL, NULL);
    print_matrix("W^v: learned, maps an input to its value", example_wv, DMODEL, DMODEL, NULL,
                 NULL);
    print_matrix("q^i = W^q a^i: the query, what position i looks for", q, SEQ, DMODEL, "q^", NULL);
    print_matrix("k^i = W^k a^i: the key, what position i is found by", k, SEQ, DMODEL, "k^", NULL);
    print_matrix("v^i = W^v a^i: the value, what position i passes on", v, SEQ, DMODEL, "v^", NULL);
    print_matrix("α_{i,j} = q^i·k^j / sqrt(d), d = 4: how well query i matches "
                 "key j (the attention scores)",
                 alpha, SEQ, SEQ, "i=", "j=");
    print_matrix("α'_{i,j} = exp(α_{i,j}) / Σ_j' exp(α_{i,j'}): softmax over j, the attention "
                 "weights (rows sum to 1)",
                 weights, SEQ, SEQ, "i=", "j=");
    print_matrix("b^i = Σ_j α'_{i,j} v^j: the output at position i, a mix of the "
                 "values weighted by α'",
                 b, SEQ, DMODEL, "b^", NULL);
    return CLI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Chapter multihead
 * ------------------------------------------------------------------------------------------- */

enum { HEADS = 2, HEAD_DIM = DMODEL / HEADS };

static const float example_wo[DMODEL * DMODEL] = {1, 0, 0, 1, 0, 1, 1, 0, 1, 0, -1, 0, 0, 1, 0, -1};

/* Host check: the largest difference between a SEQ x SEQ block of weights and the softmax of
 * the scores' rows, in double. */
static double softmax_difference(const float *scores, const float *weights)
{
    double worst = 0.0;
    for (size_t r = 0; r < SEQ; ++r) {
        const float *s = scores + r * SEQ;
        double top = -INFINITY, sum = 0.0, row[SEQ];
        for (size_t c = 0; c < SEQ; ++c)
            top = fmax(top, (double)s[c]);
        for (size_t c = 0; c < SEQ; ++c)
            sum += row[c] = exp((double)s[c] - top);
        for (size_t c = 0; c < SEQ; ++c)
            row[c] /= sum;
        worst = fmax(worst, max_difference(weights + r * SEQ, row, SEQ));
    }
    return worst;
}

static int chapter_multihead(demo *d)
{
    float q[SEQ * DMODEL], k[SEQ * DMODEL], v[SEQ * DMODEL], scores[HEADS * SEQ * SEQ],
        weights[HEADS * SEQ * SEQ];
    float heads[SEQ * DMODEL], out_chain[SEQ * DMODEL], out[SEQ * DMODEL];
    const example e = example_project(d);
    cl_mem wo = demo_buffer(d, example_wo, DMODEL * DMODEL);
    cl_mem scores_mem = demo_buffer(d, NULL, HEADS * SEQ * SEQ);
    cl_mem weights_mem = demo_buffer(d, NULL, HEADS * SEQ * SEQ);
    cl_mem heads_mem = demo_buffer(d, NULL, SEQ * DMODEL),
           chain_mem = demo_buffer(d, NULL, SEQ * DMODEL);
    cl_mem out_mem = demo_buffer(d, NULL, SEQ * DMODEL);

    /* The MHA plan: X as query, key and value; Wq, Wk, Wv, Wo as X·W matrices; A' per head. */
    clattn_mha_desc desc;
    clattn_mha_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.num_heads = HEADS;
    desc.layout = CLATTN_LAYOUT_XW;
    desc.need_weights = CLATTN_WEIGHTS_PER_HEAD;
    clattn_tensors *t = &desc_tensors;
    t->q = t->k = t->v = clattn_tensor_make(e.x, 0, CLATTN_DTYPE_F32, 3, 1, SEQ, DMODEL, 0);
    t->q_weight = clattn_tensor_make(e.w[0], 0, CLATTN_DTYPE_F32, 2, DMODEL, DMODEL, 0, 0);
    t->k_weight = clattn_tensor_make(e.w[1], 0, CLATTN_DTYPE_F32, 2, DMODEL, DMODEL, 0, 0);
    t->v_weight = clattn_tensor_make(e.w[2], 0, CLATTN_DTYPE_F32, 2, DMODEL, DMODEL, 0, 0);
    t->out_weight = clattn_tensor_make(wo, 0, CLATTN_DTYPE_F32, 2, DMODEL, DMODEL, 0, 0);
    t->out = clattn_tensor_make(out_mem, 0, CLATTN_DTYPE_F32, 3, 1, SEQ, DMODEL, 0);
    t->weights = clattn_tensor_make(weights_mem, 0, CLATTN_DTYPE_F32, 4, 1, HEADS, SEQ, SEQ);
    clattn_plan *plan = NULL;
    if (d->status == CLATTN_SUCCESS)
        plan = demo_plan(d, clattn_mha_plan_create(d->ctx, &desc, &plan), &plan,
                         "clattn_mha_plan_create");
    demo_execute(d, plan, t);

    /* Head h is columns h·d_h .. of Q, K and V: a view, no copy. A_h = Q_h·K_hᵀ / sqrt(d_h);
     * O_h = A'_h·V_h, written into its columns of concat(O_1, O_2). */
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    for (size_t h = 0; h < HEADS; ++h) {
        const size_t column = h * HEAD_DIM;
        demo_matmul(d, demo_matrix(e.qkv[0], column, SEQ, HEAD_DIM, DMODEL),
                    demo_matrix(e.qkv[1], column, SEQ, HEAD_DIM, DMODEL), 1, scale,
                    demo_matrix(scores_mem, h * SEQ * SEQ, SEQ, SEQ, SEQ));
        demo_matmul(d, demo_matrix(weights_mem, h * SEQ * SEQ, SEQ, SEQ, SEQ),
                    demo_matrix(e.qkv[2], column, SEQ, HEAD_DIM, DMODEL), 0, 1.0f,
                    demo_matrix(heads_mem, column, SEQ, HEAD_DIM, DMODEL));
    }
    demo_matmul(d, demo_matrix(heads_mem, 0, SEQ, DMODEL, DMODEL),
                demo_matrix(wo, 0, DMODEL, DMODEL, DMODEL), 0, 1.0f,
                demo_matrix(chain_mem, 0, SEQ, DMODEL, DMODEL));
    demo_read(d, e.qkv[0], SEQ * DMODEL, q);
    demo_read(d, e.qkv[1], SEQ * DMODEL, k);
    demo_read(d, e.qkv[2], SEQ * DMODEL, v);
    demo_read(d, scores_mem, HEADS * SEQ * SEQ, scores);
    demo_read(d, weights_mem, HEADS * SEQ * SEQ, weights);
    demo_read(d, heads_mem, SEQ * DMODEL, heads);
    demo_read(d, chain_mem, SEQ * DMODEL, out_chain);
    demo_read(d, out_mem, SEQ * DMODEL, out);
    if (d->status != CLATTN_SUCCESS)
        return demo_failed(d);
    demo_release(d);

    print_chapter("multihead: the same in matrix form, 2 heads of d_h = 2");
    print_matrix("X: the inputs a^i as rows (3 x 4)", example_x, SEQ, DMODEL, "a^", NULL);
    print_matrix("Wq = dot's W^q", example_wq, DMODEL, DMODEL, NULL, NULL);
    print_matrix("Wk = dot's W^k", example_wk, DMODEL, DMODEL, NULL, NULL);
    print_matrix("Wv = dot's W^v", example_wv, DMODEL, DMODEL, NULL, NULL);
    print_matrix("Wo: learned, mixes the heads' outputs back into d_model = 4", example_wo, DMODEL,
                 DMODEL, NULL, NULL);
    print_matrix("Q = X·Wq: every query at once, row i is q^i; head h takes "
                 "columns 2h-1, 2h (Q_h)",
                 q, SEQ, DMODEL, "q^", NULL);
    print_matrix("K = X·Wk: the keys, row j is k^j (K_h: columns 2h-1, 2h)", k, SEQ, DMODEL, "k^",
                 NULL);
    print_matrix("V = X·Wv: the values, row j is v^j (V_h: columns 2h-1, 2h)", v, SEQ, DMODEL, "v^",
                 NULL);
    for (size_t h = 0; h < HEADS; ++h) {
        char title[256];
        snprintf(title, sizeof title,
                 "A_%zu = Q_%zu·K_%zuᵀ / sqrt(d_h), d_h = 2: head %zu's scores α (query i, "
                 "key j)",
                 h + 1, h + 1, h + 1, h + 1);
        print_matrix(title, scores + h * SEQ * SEQ, SEQ, SEQ, "i=", "j=");
        snprintf(title, sizeof title,
                 "A'_%zu = softmax of each row of A_%zu: head %zu's weights α' (the MHA plan's)",
                 h + 1, h + 1, h + 1);
        print_matrix(title, weights + h * SEQ * SEQ, SEQ, SEQ, "i=", "j=");
        float head_out[SEQ * HEAD_DIM];
        for (size_t r = 0; r < SEQ; ++r)
            memcpy(head_out + r * HEAD_DIM, heads + r * DMODEL + h * HEAD_DIM,
                   sizeof(float) * HEAD_DIM);
        snprintf(title, sizeof title, "O_%zu = A'_%zu·V_%zu: head %zu's outputs b^i", h + 1, h + 1,
                 h + 1, h + 1);
        print_matrix(title, head_out, SEQ, HEAD_DIM, "b^", NULL);
    }
    print_matrix("concat(O_1, O_2): the heads' outputs side by side", heads, SEQ, DMODEL,
                 "i=", NULL);
    print_matrix("O = concat(O_1, O_2)·Wo: multi-head attention's output (the MHA "
                 "plan's)",
                 out, SEQ, DMODEL, "b^", NULL);
    double worst_softmax = 0.0, chain[SEQ * DMODEL];
    for (size_t h = 0; h < HEADS; ++h)
        worst_softmax = fmax(worst_softmax,
                             softmax_difference(scores + h * SEQ * SEQ, weights + h * SEQ * SEQ));
    for (size_t i = 0; i < SEQ * DMODEL; ++i)
        chain[i] = out_chain[i];
    printf("host check: the rows of A'_h are softmax(rows of A_h) to %.1e; concat·Wo from the "
           "matrices\nabove (clattn_matmul) equals the plan's O to %.1e\n\n",
           worst_softmax, max_difference(out, chain, SEQ * DMODEL));
    return CLI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Chapter posenc
 * ------------------------------------------------------------------------------------------- */

enum { PE_L = 8, PE_D = 6, PNG_L = 128, PNG_D = 64, DEMO_PNG_MIN_PANEL = 384 };

/* The sinusoidal table of seq x dim into mem (no x: out only). */
static void posenc_table(demo *d, cl_mem mem, size_t seq, size_t dim)
{
    clattn_posenc_desc desc;
    clattn_posenc_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.kind = CLATTN_POSENC_SINUSOIDAL;
    desc_tensors.out = clattn_tensor_make(mem, 0, CLATTN_DTYPE_F32, 2, seq, dim, 0, 0);
    clattn_plan *plan = NULL;
    if (d->status == CLATTN_SUCCESS)
        plan = demo_plan(d, clattn_posenc_plan_create(d->ctx, &desc, &plan), &plan,
                         "clattn_posenc_plan_create");
    demo_execute(d, plan, &desc_tensors);
}

/* The --png heatmap: the table of PNG_L x PNG_D, drawn as (PE + 1) / 2 (the heatmap's scale
 * starts at 0). */
static int posenc_png(demo *d, const char *path)
{
    float *table = malloc(sizeof(float) * PNG_L * PNG_D);
    if (table == NULL)
        return cli_fail("demo", CLI_FAILED, "out of memory");
    cl_mem mem = demo_buffer(d, NULL, PNG_L * PNG_D);
    posenc_table(d, mem, PNG_L, PNG_D);
    demo_read(d, mem, PNG_L * PNG_D, table);
    if (d->status != CLATTN_SUCCESS) {
        free(table);
        return demo_failed(d);
    }
    demo_release(d);
    for (size_t i = 0; i < PNG_L * PNG_D; ++i)
        table[i] = (table[i] + 1.0f) / 2.0f;
    char msg[1024];
    /* A table, not attention: its own title and axes, a linear scale, 3 pixels a cell. */
    const clattn_heatmap_options options = {.scale = CLATTN_HEATMAP_GLOBAL,
                                            .panel_title = "sinusoidal positional encoding",
                                            .row_label = "position",
                                            .col_label = "dimension",
                                            .value_label = "(PE + 1) / 2",
                                            .min_panel = DEMO_PNG_MIN_PANEL};
    const clattn_io_status written =
        clattn_png_write_heatmap_ex(path, table, 1, PNG_L, PNG_D, &options, msg, sizeof msg);
    free(table);
    if (written != CLATTN_IO_OK)
        return cli_fail("demo", CLI_FAILED, "--png: %s", msg);
    printf("wrote %s: the table of %d positions (down) x %d dimensions (across),\n"
           "colour = (PE + 1) / 2: dark -1, bright +1. Low dimensions turn fast along the\n"
           "positions, high ones slowly: each position gets its own row.\n\n",
           path, PNG_L, PNG_D);
    return CLI_OK;
}

static int chapter_posenc(demo *d, const char *png)
{
    float table[PE_L * PE_D], added[SEQ * DMODEL];
    cl_mem table_mem = demo_buffer(d, NULL, PE_L * PE_D);
    posenc_table(d, table_mem, PE_L, PE_D);
    /* a^i + e^i: the same plan kind with x, in place on a copy of the inputs. */
    cl_mem x = demo_buffer(d, example_x, SEQ * DMODEL);
    clattn_posenc_desc desc;
    clattn_posenc_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc_tensors.q = desc_tensors.out =
        clattn_tensor_make(x, 0, CLATTN_DTYPE_F32, 2, SEQ, DMODEL, 0, 0);
    clattn_plan *plan = NULL;
    if (d->status == CLATTN_SUCCESS)
        plan = demo_plan(d, clattn_posenc_plan_create(d->ctx, &desc, &plan), &plan,
                         "clattn_posenc_plan_create");
    demo_execute(d, plan, &desc_tensors);
    demo_read(d, table_mem, PE_L * PE_D, table);
    demo_read(d, x, SEQ * DMODEL, added);
    if (d->status != CLATTN_SUCCESS)
        return demo_failed(d);
    demo_release(d);

    print_chapter("posenc: sinusoidal positional encodings (Attention Is All You Need)");
    printf("Self-attention ignores order: shuffle the a^i and each b^i just moves with its a^i.\n"
           "So position pos gets a vector e added, PE(pos, 2k) = sin(pos / 10000^(2k/d)),\n"
           "PE(pos, 2k+1) = cos(pos / 10000^(2k/d)): pairs of columns turning at wavelengths\n"
           "from 2π to 10000·2π.\n\n");
    print_table(&(demo_print){.title = "e^i = PE(pos = i - 1), d = 6; columns: sin, cos of pos, "
                                       "pos / 10000^(1/3), pos / 10000^(2/3)",
                              .values = table,
                              .rows = PE_L,
                              .cols = PE_D,
                              .row_name = "e^",
                              .row_base = 1,
                              .col_name = "c",
                              .col_base = 0});
    double want[PE_L * PE_D];
    for (size_t p = 0; p < PE_L; ++p)
        for (size_t c = 0; c < PE_D; ++c) {
            const double angle = (double)p / pow(10000.0, (double)(c / 2 * 2) / PE_D);
            want[p * PE_D + c] = c % 2 ? cos(angle) : sin(angle);
        }
    printf("host check: sin and cos in double differ from the table by at most %.1e\n\n",
           max_difference(table, want, PE_L * PE_D));
    print_matrix("a^i + e^i: dot's inputs, positions 0, 1, 2 added (e^i of d = 4: sin, cos of pos, "
                 "pos / 100)",
                 added, SEQ, DMODEL, "a+e^", NULL);
    return png ? posenc_png(d, png) : CLI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Chapter rope
 * ------------------------------------------------------------------------------------------- */

enum { ROPE_POSITIONS = 10 };

/* A rotary plan for (1, 1, seq, DMODEL) rows at positions 0 .., in place; halves pairing. */
static clattn_plan *rope_plan(demo *d, size_t seq)
{
    clattn_rope_desc desc;
    clattn_rope_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.style = CLATTN_ROPE_HALVES;
    desc_tensors.q = desc_tensors.out =
        clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, 1, 1, seq, DMODEL);
    clattn_plan *plan = NULL;
    if (d->status != CLATTN_SUCCESS)
        return NULL;
    return demo_plan(d, clattn_rope_plan_create(d->ctx, &desc, &plan), &plan,
                     "clattn_rope_plan_create");
}

static void rope_rotate(demo *d, clattn_plan *plan, cl_mem mem, size_t seq)
{
    clattn_tensors t = {0};
    t.q = t.out = clattn_tensor_make(mem, 0, CLATTN_DTYPE_F32, 4, 1, 1, seq, DMODEL);
    demo_execute(d, plan, &t);
}

static int chapter_rope(demo *d)
{
    float q[SEQ * DMODEL], k[SEQ * DMODEL], q_rot[SEQ * DMODEL], k_rot[SEQ * DMODEL];
    float gram[ROPE_POSITIONS * ROPE_POSITIONS];
    const example e = example_project(d);
    demo_read(d, e.qkv[0], SEQ * DMODEL, q);
    demo_read(d, e.qkv[1], SEQ * DMODEL, k);
    /* q^i and k^i at positions i - 1, rotated in place on the device. */
    clattn_plan *three = rope_plan(d, SEQ);
    rope_rotate(d, three, e.qkv[0], SEQ);
    rope_rotate(d, three, e.qkv[1], SEQ);
    demo_read(d, e.qkv[0], SEQ * DMODEL, q_rot);
    demo_read(d, e.qkv[1], SEQ * DMODEL, k_rot);
    /* q = q^1 at every position m = 0..9 and k = k^2 at every n, rotated, and all their dot
     * products: gram[m][n] = R_m q · R_n k. */
    float q_rows[ROPE_POSITIONS * DMODEL], k_rows[ROPE_POSITIONS * DMODEL];
    for (size_t p = 0; p < ROPE_POSITIONS; ++p) {
        memcpy(q_rows + p * DMODEL, q, sizeof(float) * DMODEL);
        memcpy(k_rows + p * DMODEL, k + DMODEL, sizeof(float) * DMODEL);
    }
    cl_mem q_mem = demo_buffer(d, q_rows, ROPE_POSITIONS * DMODEL);
    cl_mem k_mem = demo_buffer(d, k_rows, ROPE_POSITIONS * DMODEL);
    cl_mem gram_mem = demo_buffer(d, NULL, ROPE_POSITIONS * ROPE_POSITIONS);
    clattn_plan *ten = rope_plan(d, ROPE_POSITIONS);
    rope_rotate(d, ten, q_mem, ROPE_POSITIONS);
    rope_rotate(d, ten, k_mem, ROPE_POSITIONS);
    demo_matmul(d, demo_matrix(q_mem, 0, ROPE_POSITIONS, DMODEL, DMODEL),
                demo_matrix(k_mem, 0, ROPE_POSITIONS, DMODEL, DMODEL), 1, 1.0f,
                demo_matrix(gram_mem, 0, ROPE_POSITIONS, ROPE_POSITIONS, ROPE_POSITIONS));
    demo_read(d, gram_mem, ROPE_POSITIONS * ROPE_POSITIONS, gram);
    if (d->status != CLATTN_SUCCESS)
        return demo_failed(d);
    demo_release(d);

    print_chapter("rope: rotary position embeddings (RoFormer; GPT-NeoX and Llama's pairing)");
    printf("Instead of adding e^i to the input, turn q and k by angles that grow with the\n"
           "position m: the pairs of columns (1, 3) and (2, 4) of a row at position m turn by\n"
           "m·θ_1 and m·θ_2, θ_j = 10000^(-2(j-1)/d) (here 1 and 1/100 radians).\n\n");
    print_matrix("q^i: dot's queries, q^i at position m = i - 1", q, SEQ, DMODEL, "q^", NULL);
    print_matrix("R_m q^i: the queries rotated to their positions", q_rot, SEQ, DMODEL, "q^", NULL);
    print_matrix("k^i: dot's keys, k^i at position m = i - 1", k, SEQ, DMODEL, "k^", NULL);
    print_matrix("R_m k^i: the keys rotated to their positions", k_rot, SEQ, DMODEL, "k^", NULL);
    print_table(&(demo_print){.title =
                                  "R_m q · R_n k, q = q^1 at position m, k = k^2 at n: constant "
                                  "along each diagonal",
                              .values = gram,
                              .rows = ROPE_POSITIONS,
                              .cols = ROPE_POSITIONS,
                              .row_name = "m=",
                              .row_base = 0,
                              .col_name = "n=",
                              .col_base = 0,
                              .width = 7,
                              .decimals = 3});
    static const size_t pairs[3][2] = {{0, 2}, {3, 5}, {7, 9}};
    printf("The same q and k two positions apart (n - m = 2), wherever they are:\n");
    for (int i = 0; i < 3; ++i)
        printf("  (m, n) = (%zu, %zu): R_m q · R_n k = %.6f\n", pairs[i][0], pairs[i][1],
               gram[pairs[i][0] * ROPE_POSITIONS + pairs[i][1]]);
    printf("R_mᵀ R_n = R_(n-m): the rotated dot product depends on n - m only, so attention\n"
           "sees relative positions; at n = m it is q·k itself (%.6f).\n\n",
           gram[0]);
    return CLI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Chapter additive
 * ------------------------------------------------------------------------------------------- */

enum { DA = 3 };

static const float additive_w1[DMODEL * DA] = {0.5f, 0,     -0.5f, 0, 0.5f, 0.5f,
                                               0.5f, -0.5f, 0,     0, 0,    0.5f};
static const float additive_w2[DMODEL * DA] = {0, 0.5f, 0,     -0.5f, 0,     0.5f,
                                               0, 0,    -0.5f, 0.5f,  -0.5f, 0};
static const float additive_w[DA] = {1, -1, 2};

static int chapter_additive(demo *d)
{
    float v[SEQ * DMODEL], qw1[SEQ * DA], kw2[SEQ * DA], weights[SEQ * SEQ], b[SEQ * DMODEL];
    const example e = example_project(d);
    cl_mem w1 = demo_buffer(d, additive_w1, DMODEL * DA),
           w2 = demo_buffer(d, additive_w2, DMODEL * DA);
    cl_mem w = demo_buffer(d, additive_w, DA);
    cl_mem qw1_mem = demo_buffer(d, NULL, SEQ * DA), kw2_mem = demo_buffer(d, NULL, SEQ * DA);
    cl_mem weights_mem = demo_buffer(d, NULL, SEQ * SEQ),
           b_mem = demo_buffer(d, NULL, SEQ * DMODEL);
    /* The two projections as the plan forms them (it runs its own): q^i W1 and k^j W2. */
    demo_matmul(d, demo_matrix(e.x, 0, SEQ, DMODEL, DMODEL), demo_matrix(w1, 0, DMODEL, DA, DA), 0,
                1.0f, demo_matrix(qw1_mem, 0, SEQ, DA, DA));
    demo_matmul(d, demo_matrix(e.x, 0, SEQ, DMODEL, DMODEL), demo_matrix(w2, 0, DMODEL, DA, DA), 0,
                1.0f, demo_matrix(kw2_mem, 0, SEQ, DA, DA));
    /* Self-attention: the queries and keys are the inputs a^i, the values dot's v^j. */
    clattn_additive_desc desc;
    clattn_additive_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.path = CLATTN_PATH_UNFUSED;
    clattn_tensors *t = &desc_tensors;
    t->q = t->k = clattn_tensor_make(e.x, 0, CLATTN_DTYPE_F32, 3, 1, SEQ, DMODEL, 0);
    t->v = clattn_tensor_make(e.qkv[2], 0, CLATTN_DTYPE_F32, 3, 1, SEQ, DMODEL, 0);
    t->out = clattn_tensor_make(b_mem, 0, CLATTN_DTYPE_F32, 3, 1, SEQ, DMODEL, 0);
    t->q_weight = clattn_tensor_make(w1, 0, CLATTN_DTYPE_F32, 2, DMODEL, DA, 0, 0);
    t->k_weight = clattn_tensor_make(w2, 0, CLATTN_DTYPE_F32, 2, DMODEL, DA, 0, 0);
    t->score_weight = clattn_tensor_make(w, 0, CLATTN_DTYPE_F32, 1, DA, 0, 0, 0);
    t->weights = clattn_tensor_make(weights_mem, 0, CLATTN_DTYPE_F32, 4, 1, 1, SEQ, SEQ);
    clattn_plan *plan = NULL;
    if (d->status == CLATTN_SUCCESS)
        plan = demo_plan(d, clattn_additive_plan_create(d->ctx, &desc, &plan), &plan,
                         "clattn_additive_plan_create");
    demo_execute(d, plan, t);
    demo_read(d, e.qkv[2], SEQ * DMODEL, v);
    demo_read(d, qw1_mem, SEQ * DA, qw1);
    demo_read(d, kw2_mem, SEQ * DA, kw2);
    demo_read(d, weights_mem, SEQ * SEQ, weights);
    demo_read(d, b_mem, SEQ * DMODEL, b);
    if (d->status != CLATTN_SUCCESS)
        return demo_failed(d);
    demo_release(d);

    /* Host check: α from the two projections the device printed, and its softmax. */
    float alpha[SEQ * SEQ];
    double softmax[SEQ * SEQ];
    for (size_t i = 0; i < SEQ; ++i) {
        double sum = 0.0;
        for (size_t j = 0; j < SEQ; ++j) {
            double s = 0.0;
            for (size_t c = 0; c < DA; ++c)
                s += additive_w[c] * tanh((double)qw1[i * DA + c] + (double)kw2[j * DA + c]);
            alpha[i * SEQ + j] = (float)s;
            softmax[i * SEQ + j] = exp(s);
            sum += softmax[i * SEQ + j];
        }
        for (size_t j = 0; j < SEQ; ++j)
            softmax[i * SEQ + j] /= sum;
    }

    print_chapter("additive: Bahdanau's attention, scores from a small network");
    printf("The score of query i and key j is a one-hidden-layer network of both instead of\n"
           "their dot product: α_{i,j} = wᵀ tanh(q^i W1 + k^j W2). Here the queries and keys are\n"
           "the inputs a^i themselves, and the values dot's v^j.\n\n");
    print_matrix("q^i = a^i: the queries (and the keys k^j = a^j)", example_x, SEQ, DMODEL, "q^",
                 NULL);
    print_matrix("W1: learned, maps a query to the network's 3 hidden units", additive_w1, DMODEL,
                 DA, NULL, NULL);
    print_matrix("W2: learned, maps a key to the same 3 hidden units", additive_w2, DMODEL, DA,
                 NULL, NULL);
    print_matrix("w: learned, weighs the hidden units into one score", additive_w, 1, DA, NULL,
                 NULL);
    print_matrix("v^j = W^v a^j: the values (dot's)", v, SEQ, DMODEL, "v^", NULL);
    print_matrix("q^i W1: each query's share of the hidden units", qw1, SEQ, DA, "q^", NULL);
    print_matrix("k^j W2: each key's share of the hidden units", kw2, SEQ, DA, "k^", NULL);
    print_matrix("α_{i,j} = wᵀ tanh(q^i W1 + k^j W2): the scores (host check, from the two "
                 "matrices above)",
                 alpha, SEQ, SEQ, "i=", "j=");
    print_matrix("α'_{i,j} = softmax over j of α_{i,j}: the weights (the additive "
                 "plan's)",
                 weights, SEQ, SEQ, "i=", "j=");
    printf("host check: softmax of the α above differs from the plan's α' by at most %.1e\n\n",
           max_difference(weights, softmax, SEQ * SEQ));
    print_matrix("b^i = Σ_j α'_{i,j} v^j: the output at position i", b, SEQ, DMODEL, "b^", NULL);
    return CLI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The command
 * ------------------------------------------------------------------------------------------- */

enum {
    CHAPTER_DOT,
    CHAPTER_MULTIHEAD,
    CHAPTER_POSENC,
    CHAPTER_ROPE,
    CHAPTER_ADDITIVE,
    CHAPTER_COUNT,
    CHAPTER_ALL = CHAPTER_COUNT
};

static const char *const chapter_names[CHAPTER_COUNT + 1] = {"dot",  "multihead", "posenc",
                                                             "rope", "additive",  "all"};

static int run_chapter(demo *d, int chapter, const char *png)
{
    switch (chapter) {
    case CHAPTER_DOT:
        return chapter_dot(d);
    case CHAPTER_MULTIHEAD:
        return chapter_multihead(d);
    case CHAPTER_POSENC:
        return chapter_posenc(d, png);
    case CHAPTER_ROPE:
        return chapter_rope(d);
    default:
        return chapter_additive(d);
    }
}

typedef struct demo_options {
    cli_exec exec; /* --device */
    const char *png, *chapter_name;
    int chapter;
} demo_options;

/* The chapter operand: one at a time. */
static int parse_chapter(const cli_args *args, const char *value, void *target)
{
    demo_options *o = target;
    if (o->chapter_name)
        return cli_fail(args->command, -1,
                        "one chapter at a time (got '%s' and '%s'; 'all' runs every one)",
                        o->chapter_name, value);
    o->chapter_name = value;
    for (o->chapter = 0; o->chapter <= CHAPTER_ALL; ++o->chapter)
        if (strcmp(value, chapter_names[o->chapter]) == 0)
            return 1;
    return cli_fail(args->command, -1,
                    "unknown chapter '%s' (chapters: dot, multihead, posenc, rope, additive, all)",
                    value);
}

static int parse_png(const cli_args *args, const char *value, void *target)
{
    if (value[0] == '\0')
        return cli_fail(args->command, -1, "--png needs a file name");
    *(const char **)target = value;
    return 1;
}

static const cli_option demo_table[] = {
    {CLI_OPT("--png", CLI_CUSTOM, CLI_AT(demo_options, png), "FILE",
             "(posenc, all) the sinusoidal table (128 x 64) as a heatmap PNG"),
     .handle = parse_png},
    CLI_USE(cli_exec_group, demo_options, exec, 0),
};
static const char *const demo_help[] = {demo_usage, NULL};
static const cli_command demo_command = {.name = "demo",
                                         .options = demo_table,
                                         .count = CLI_COUNT(demo_table),
                                         .help = demo_help,
                                         .operands = "[dot|multihead|posenc|rope|additive|all]",
                                         .operand = parse_chapter};

int cmd_demo(int argc, char **argv)
{
    demo_options options = {.chapter = CHAPTER_DOT};
    const int rc = cli_parse_command(&demo_command, argc, argv, &options);
    if (rc != CLI_OK)
        return rc < 0 ? CLI_OK : rc;
    const char *device_spec = options.exec.device, *png = options.png;
    const int chapter = options.chapter;
    if (png && chapter != CHAPTER_POSENC && chapter != CHAPTER_ALL)
        return cli_fail("demo", CLI_BAD_INPUT,
                        "--png draws the posenc chapter's table: use it with posenc or all");
    if (!cli_check_output("demo", "--png", png))
        return CLI_BAD_INPUT;

    demo d = {.ctx = cli_context("demo", device_spec)};
    if (d.ctx == NULL)
        return cli_context_exit();
    cli_print_device(stdout, clattn_ctx_device(d.ctx));
    printf("\n");
    int code = CLI_OK;
    const int first = chapter == CHAPTER_ALL ? 0 : chapter;
    const int last = chapter == CHAPTER_ALL ? CHAPTER_COUNT - 1 : chapter;
    for (int c = first; c <= last && code == CLI_OK; ++c) {
        fflush(stdout);
        code = run_chapter(&d, c, png);
    }
    demo_release(&d);
    clattn_ctx_release(d.ctx);
    return code;
}
