/* clattn bench: device-timed matmul, softmax, attention and MHA forward. */
#define _POSIX_C_SOURCE 199309L
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char bench_usage[] =
    "usage: clattn bench [--op matmul,softmax,attention,mha] [--runs N] [--warmup N] [--json]\n"
    "                    [--mnk MxNxK,...] [--batch B] [--heads H] [--seq L,...] [--seq-k S]\n"
    "                    [--head-dim D] [--embed E] [--device SPEC]\n"
    "\n"
    "Times each op on the device: the median of --runs runs (default 10) after --warmup runs\n"
    "(default 1, which also compiles the kernels). Device time comes from OpenCL profiling\n"
    "events (from a marker enqueued before the call to the call's last kernel); wall time is the\n"
    "host's clock around enqueue and wait.\n"
    "Sizes: matmul over --mnk (default 512x512x512,1024x1024x1024,4096x64x4096); softmax and\n"
    "attention over (--batch 1, --heads 8, --seq 512,1024 (= seq_q), --seq-k (default = seq),\n"
    "--head-dim 64); mha over --batch, --seq and --embed 512 with --heads.\n"
    "Rates: matmul 2MNK flop; attention 2·B·H·Lq·Lk·(dk+dv); mha adds the 4 projections\n"
    "(8·B·L·E²); softmax in GB/s of scores read and written.\n"
    "--json prints one JSON object per line per case instead of the table. A progress line goes\n"
    "to stderr while a case runs longer than a second.\n";

#define MAX_SIZES 16

typedef struct bench_options {
    const char *device;
    bool ops[4]; /* matmul, softmax, attention, mha */
    size_t runs, warmup;
    bool json;
    size_t mnk[MAX_SIZES][3], num_mnk;
    size_t batch, heads, head_dim, embed, seq_k;
    size_t seq[MAX_SIZES], num_seq;
} bench_options;

static const char *const op_names[4] = {"matmul", "softmax", "attention", "mha"};

typedef struct bench_state {
    clattn_ctx *ctx;
    cl_context context;
    cl_command_queue queue;
    const bench_options *options;
} bench_state;

/* One measured call, enqueued after a marker event and returning its final event. */
typedef clattn_status (*bench_fn)(bench_state *b, void *args, cl_uint num_wait,
                                  const cl_event *wait, cl_event *event);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int compare_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *values, size_t count)
{
    qsort(values, count, sizeof *values, compare_double);
    return count % 2 ? values[count / 2] : 0.5 * (values[count / 2 - 1] + values[count / 2]);
}

/* Runs fn warmup + runs times; medians in ms. Prints progress after the first second. */
static int measure(bench_state *b, const char *label, bench_fn fn, void *args, double *device_ms,
                   double *wall_ms)
{
    const size_t runs = b->options->runs, total = b->options->warmup + runs;
    double *device = calloc(runs, sizeof *device), *wall = calloc(runs, sizeof *wall);
    if (!device || !wall) {
        free(device);
        free(wall);
        return cli_fail("bench", CLI_FAILED, "out of memory");
    }
    const double started = now_s();
    double last_progress = started;
    int rc = CLI_OK;
    for (size_t r = 0; r < total && rc == CLI_OK; ++r) {
        cl_event start = NULL, end = NULL;
        const double t0 = now_s();
        cl_int err = clEnqueueMarkerWithWaitList(b->queue, 0, NULL, &start);
        clattn_status status = err == CL_SUCCESS ? fn(b, args, 1, &start, &end)
                                                 : (clattn_status)err;
        if (status == CLATTN_SUCCESS)
            status = (clattn_status)clWaitForEvents(1, &end);
        if (status != CLATTN_SUCCESS) {
            rc = cli_fail("bench", CLI_FAILED, "%s: %s: %s", label, clattn_status_string(status),
                          clattn_last_error(b->ctx));
        } else if (r >= b->options->warmup) {
            cl_ulong begin_ns = 0, end_ns = 0;
            clGetEventProfilingInfo(start, CL_PROFILING_COMMAND_END, sizeof begin_ns, &begin_ns,
                                    NULL);
            clGetEventProfilingInfo(end, CL_PROFILING_COMMAND_END, sizeof end_ns, &end_ns, NULL);
            device[r - b->options->warmup] = (double)(end_ns - begin_ns) / 1e6;
            wall[r - b->options->warmup] = (now_s() - t0) * 1e3;
        }
        if (start)
            clReleaseEvent(start);
        if (end)
            clReleaseEvent(end);
        const double now = now_s();
        if (now - last_progress >= 1.0) {
            fprintf(stderr, "clattn bench: %s: run %zu of %zu (%.1f s)\n", label, r + 1, total,
                    now - started);
            last_progress = now;
        }
    }
    if (rc == CLI_OK) {
        *device_ms = median(device, runs);
        *wall_ms = median(wall, runs);
    }
    free(device);
    free(wall);
    return rc;
}

/* A device buffer of `count` floats, uniform in [-1, 1). */
static cl_mem random_buffer(bench_state *b, size_t count, unsigned long long seed)
{
    float *host = malloc(count * sizeof *host);
    if (host == NULL)
        return NULL;
    unsigned long long state = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < count; ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        host[i] = (float)((state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
    }
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(b->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                count * sizeof(float), host, &err);
    free(host);
    return err == CL_SUCCESS ? mem : NULL;
}

static void release_all(cl_mem *mems, size_t count)
{
    for (size_t i = 0; i < count; ++i)
        if (mems[i])
            clReleaseMemObject(mems[i]);
}

static bool all_made(const cl_mem *mems, size_t count)
{
    for (size_t i = 0; i < count; ++i)
        if (mems[i] == NULL)
            return false;
    return true;
}

static void report(const bench_state *b, const char *op, const char *size_json,
                   const char *size_text, double device_ms, double wall_ms, const char *unit,
                   double rate)
{
    if (b->options->json)
        printf("{\"op\": \"%s\", %s, \"runs\": %zu, \"median_ms\": %.6f, \"wall_ms\": %.6f, "
               "\"%s\": %.3f}\n",
               op, size_json, b->options->runs, device_ms, wall_ms, unit, rate);
    else
        printf("%-10s %-40s %11.3f %11.3f %10.2f %s\n", op, size_text, device_ms, wall_ms, rate,
               strcmp(unit, "gbps") == 0 ? "GB/s" : "GFLOP/s");
    fflush(stdout);
}

/* --- matmul --------------------------------------------------------------------------------- */

typedef struct matmul_case {
    clattn_matmul_desc desc;
    cl_mem mem[3];
} matmul_case;

static clattn_status run_matmul(bench_state *b, void *p, cl_uint nw, const cl_event *w,
                                cl_event *e)
{
    matmul_case *c = p;
    return clattn_matmul(b->ctx, &c->desc, (clattn_tensor){c->mem[0], 0},
                         (clattn_tensor){c->mem[1], 0}, (clattn_tensor){0},
                         (clattn_tensor){c->mem[2], 0}, nw, w, e);
}

static int bench_matmul(bench_state *b, size_t m, size_t n, size_t k)
{
    matmul_case c = {.desc = {.m = m, .n = n, .k = k, .alpha = 1.0f}};
    c.mem[0] = random_buffer(b, m * k, 1);
    c.mem[1] = random_buffer(b, k * n, 2);
    c.mem[2] = random_buffer(b, m * n, 3);
    char json[160], text[80];
    snprintf(json, sizeof json, "\"m\": %zu, \"n\": %zu, \"k\": %zu", m, n, k);
    snprintf(text, sizeof text, "m=%zu n=%zu k=%zu", m, n, k);
    double device_ms = 0, wall_ms = 0;
    int rc = all_made(c.mem, 3) ? measure(b, text, run_matmul, &c, &device_ms, &wall_ms)
                                : cli_fail("bench", CLI_FAILED, "%s: cannot allocate", text);
    if (rc == CLI_OK)
        report(b, "matmul", json, text, device_ms, wall_ms, "gflops",
               2.0 * m * n * k / device_ms / 1e6);
    release_all(c.mem, 3);
    return rc;
}

/* --- softmax and attention ----------------------------------------------------------------- */

typedef struct attention_case {
    clattn_softmax_desc softmax;
    clattn_attention_desc attention;
    cl_mem mem[4];
} attention_case;

static clattn_status run_softmax(bench_state *b, void *p, cl_uint nw, const cl_event *w,
                                 cl_event *e)
{
    attention_case *c = p;
    return clattn_softmax_rows(b->ctx, &c->softmax, (clattn_tensor){c->mem[0], 0},
                               (clattn_tensor){c->mem[1], 0}, nw, w, e);
}

static clattn_status run_attention(bench_state *b, void *p, cl_uint nw, const cl_event *w,
                                   cl_event *e)
{
    attention_case *c = p;
    return clattn_attention(b->ctx, &c->attention, (clattn_tensor){c->mem[0], 0},
                            (clattn_tensor){c->mem[1], 0}, (clattn_tensor){c->mem[2], 0},
                            (clattn_tensor){c->mem[3], 0}, (clattn_tensor){0}, nw, w, e);
}

static void attention_size(const clattn_attention_desc *d, char *json, size_t json_size,
                           char *text, size_t text_size)
{
    snprintf(json, json_size,
             "\"batch\": %zu, \"heads\": %zu, \"seq_q\": %zu, \"seq_k\": %zu, \"head_dim\": %zu",
             d->batch, d->heads, d->seq_q, d->seq_k, d->head_dim_qk);
    snprintf(text, text_size, "B=%zu H=%zu Lq=%zu Lk=%zu d=%zu", d->batch, d->heads, d->seq_q,
             d->seq_k, d->head_dim_qk);
}

static int bench_softmax(bench_state *b, size_t seq_q, size_t seq_k)
{
    const bench_options *o = b->options;
    attention_case c = {.softmax = {.batch = o->batch, .heads = o->heads, .seq_q = seq_q,
                                    .seq_k = seq_k, .scale = 0.125f}};
    c.attention = (clattn_attention_desc){.batch = o->batch, .heads = o->heads, .seq_q = seq_q,
                                          .seq_k = seq_k, .head_dim_qk = o->head_dim};
    const size_t count = o->batch * o->heads * seq_q * seq_k;
    c.mem[0] = random_buffer(b, count, 4);
    c.mem[1] = random_buffer(b, count, 5);
    char json[200], text[100];
    attention_size(&c.attention, json, sizeof json, text, sizeof text);
    double device_ms = 0, wall_ms = 0;
    int rc = all_made(c.mem, 2) ? measure(b, text, run_softmax, &c, &device_ms, &wall_ms)
                                : cli_fail("bench", CLI_FAILED, "%s: cannot allocate", text);
    if (rc == CLI_OK)
        report(b, "softmax", json, text, device_ms, wall_ms, "gbps",
               2.0 * count * sizeof(float) / device_ms / 1e6);
    release_all(c.mem, 2);
    return rc;
}

static int bench_attention(bench_state *b, size_t seq_q, size_t seq_k)
{
    const bench_options *o = b->options;
    attention_case c = {.attention = {.batch = o->batch, .heads = o->heads, .seq_q = seq_q,
                                      .seq_k = seq_k, .head_dim_qk = o->head_dim,
                                      .head_dim_v = o->head_dim}};
    const size_t bh = o->batch * o->heads;
    c.mem[0] = random_buffer(b, bh * seq_q * o->head_dim, 6);
    c.mem[1] = random_buffer(b, bh * seq_k * o->head_dim, 7);
    c.mem[2] = random_buffer(b, bh * seq_k * o->head_dim, 8);
    c.mem[3] = random_buffer(b, bh * seq_q * o->head_dim, 9);
    char json[200], text[100];
    attention_size(&c.attention, json, sizeof json, text, sizeof text);
    double device_ms = 0, wall_ms = 0;
    int rc = all_made(c.mem, 4) ? measure(b, text, run_attention, &c, &device_ms, &wall_ms)
                                : cli_fail("bench", CLI_FAILED, "%s: cannot allocate", text);
    if (rc == CLI_OK)
        report(b, "attention", json, text, device_ms, wall_ms, "gflops",
               4.0 * bh * seq_q * seq_k * o->head_dim / device_ms / 1e6);
    release_all(c.mem, 4);
    return rc;
}

/* --- MHA forward ---------------------------------------------------------------------------- */

typedef struct mha_case {
    clattn_mha_desc desc;
    cl_mem mem[6]; /* x, out, in_proj_weight, in_proj_bias, out_weight, out_bias */
} mha_case;

static clattn_status run_mha(bench_state *b, void *p, cl_uint nw, const cl_event *w, cl_event *e)
{
    mha_case *c = p;
    const clattn_mha_weights weights = {
        .in_proj_weight = {c->mem[2], 0}, .in_proj_bias = {c->mem[3], 0},
        .out_weight = {c->mem[4], 0}, .out_bias = {c->mem[5], 0}};
    const clattn_tensor x = {c->mem[0], 0};
    return clattn_mha_forward(b->ctx, &c->desc, &weights, x, x, x, (clattn_tensor){c->mem[1], 0},
                              (clattn_tensor){0}, nw, w, e);
}

static int bench_mha(bench_state *b, size_t seq)
{
    const bench_options *o = b->options;
    const size_t e = o->embed;
    mha_case c = {.desc = {.batch = o->batch, .seq_q = seq, .seq_k = seq, .embed_dim = e,
                           .num_heads = o->heads, .layout = CLATTN_LAYOUT_TORCH}};
    const size_t counts[6] = {o->batch * seq * e, o->batch * seq * e, 3 * e * e, 3 * e, e * e, e};
    for (int i = 0; i < 6; ++i)
        c.mem[i] = random_buffer(b, counts[i], 10 + (unsigned)i);
    char json[200], text[100];
    snprintf(json, sizeof json,
             "\"batch\": %zu, \"heads\": %zu, \"seq_q\": %zu, \"seq_k\": %zu, \"head_dim\": %zu, "
             "\"embed_dim\": %zu",
             o->batch, o->heads, seq, seq, e / o->heads, e);
    snprintf(text, sizeof text, "B=%zu H=%zu L=%zu E=%zu", o->batch, o->heads, seq, e);
    double device_ms = 0, wall_ms = 0;
    int rc = e % o->heads ? cli_fail("bench", CLI_BAD_INPUT, "--embed %zu is not divisible by "
                                     "--heads %zu", e, o->heads)
             : all_made(c.mem, 6) ? measure(b, text, run_mha, &c, &device_ms, &wall_ms)
                                  : cli_fail("bench", CLI_FAILED, "%s: cannot allocate", text);
    const double flops = 8.0 * o->batch * seq * e * e + 4.0 * o->batch * seq * seq * e;
    if (rc == CLI_OK)
        report(b, "mha", json, text, device_ms, wall_ms, "gflops", flops / device_ms / 1e6);
    release_all(c.mem, 6);
    return rc;
}

/* --- options and driver -------------------------------------------------------------------- */

static bool parse_mnk(const char *text, bench_options *o)
{
    char buffer[512];
    if (strlen(text) >= sizeof buffer)
        return false;
    snprintf(buffer, sizeof buffer, "%s", text);
    o->num_mnk = 0;
    char *save = NULL;
    for (char *item = strtok_r(buffer, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char extra;
        unsigned long long m, n, k;
        if (o->num_mnk == MAX_SIZES || sscanf(item, "%llux%llux%llu%c", &m, &n, &k, &extra) != 3 ||
            m == 0 || n == 0 || k == 0 || m > (1u << 20) || n > (1u << 20) || k > (1u << 20))
            return false;
        o->mnk[o->num_mnk][0] = m, o->mnk[o->num_mnk][1] = n, o->mnk[o->num_mnk][2] = k;
        ++o->num_mnk;
    }
    return o->num_mnk > 0;
}

static int parse_bench_options(int argc, char **argv, bench_options *o)
{
    cli_args args = {argc, argv, 1, NULL, NULL, "bench"};
    const char *value = NULL;
    bool any_op = false;
    while (cli_next(&args)) {
        if (cli_is(&args, "--help") || cli_is(&args, "-h")) {
            fputs(bench_usage, stdout);
            return -1;
        } else if (cli_is(&args, "--json")) {
            o->json = true;
            continue;
        }
        if (!(value = cli_value(&args)))
            return CLI_BAD_INPUT;
        if (cli_is(&args, "--device")) {
            o->device = value;
        } else if (cli_is(&args, "--op")) {
            char buffer[128];
            snprintf(buffer, sizeof buffer, "%s", value);
            char *save = NULL;
            for (char *item = strtok_r(buffer, ",", &save); item;
                 item = strtok_r(NULL, ",", &save)) {
                int found = -1;
                for (int i = 0; i < 4; ++i)
                    if (strcmp(item, op_names[i]) == 0)
                        found = i;
                if (found < 0)
                    return cli_fail("bench", CLI_BAD_INPUT, "--op: unknown op '%s' (matmul, "
                                    "softmax, attention, mha)", item);
                if (!any_op)
                    memset(o->ops, 0, sizeof o->ops);
                o->ops[found] = any_op = true;
            }
        } else if (cli_is(&args, "--mnk")) {
            if (!parse_mnk(value, o))
                return cli_fail("bench", CLI_BAD_INPUT, "--mnk: '%s' is not a list of MxNxK "
                                "sizes (each 1 .. 1048576)", value);
        } else if (cli_is(&args, "--seq")) {
            if (!cli_parse_size_list("bench", "--seq", value, o->seq, MAX_SIZES, &o->num_seq))
                return CLI_BAD_INPUT;
        } else {
            struct {
                const char *option;
                size_t *target;
                size_t min;
            } sizes[] = {{"--runs", &o->runs, 1},        {"--warmup", &o->warmup, 0},
                         {"--batch", &o->batch, 1},      {"--heads", &o->heads, 1},
                         {"--head-dim", &o->head_dim, 1}, {"--embed", &o->embed, 1},
                         {"--seq-k", &o->seq_k, 1}};
            bool matched = false;
            for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && !matched; ++i) {
                if (cli_is(&args, sizes[i].option)) {
                    matched = true;
                    if (!cli_parse_size("bench", sizes[i].option, value, sizes[i].min,
                                        sizes[i].target))
                        return CLI_BAD_INPUT;
                }
            }
            if (!matched)
                return cli_fail("bench", CLI_BAD_INPUT, "unknown option '%s' (see --help)",
                                args.name);
        }
    }
    return CLI_OK;
}

int cmd_bench(int argc, char **argv)
{
    bench_options o = {.ops = {true, true, true, true}, .runs = 10, .warmup = 1,
                       .mnk = {{512, 512, 512}, {1024, 1024, 1024}, {4096, 64, 4096}},
                       .num_mnk = 3, .batch = 1, .heads = 8, .head_dim = 64, .embed = 512,
                       .seq = {512, 1024}, .num_seq = 2};
    int rc = parse_bench_options(argc, argv, &o);
    if (rc != CLI_OK)
        return rc < 0 ? CLI_OK : rc;

    /* A profiling queue of our own, handed to clattn (the embedding path). */
    clattn_ctx *probe = cli_context("bench", o.device);
    if (probe == NULL)
        return CLI_FAILED;
    bench_state b = {.options = &o, .context = clattn_ctx_cl_context(probe)};
    cl_int err = CL_SUCCESS;
    b.queue = clCreateCommandQueue(b.context, clattn_ctx_device(probe),
                                   CL_QUEUE_PROFILING_ENABLE, &err);
    char message[512];
    if (err != CL_SUCCESS ||
        clattn_ctx_create_from_queue(b.queue, &b.ctx, message, sizeof message) != CLATTN_SUCCESS)
        rc = cli_fail("bench", CLI_FAILED, "cannot make a profiling queue (%d)", (int)err);
    if (rc == CLI_OK && !o.json) {
        cli_print_device(stdout, clattn_ctx_device(probe));
        printf("median of %zu runs after %zu warm-up run(s)\n", o.runs, o.warmup);
        printf("%-10s %-40s %11s %11s %18s\n", "op", "size", "device ms", "wall ms", "rate");
    }
    for (size_t i = 0; rc == CLI_OK && o.ops[0] && i < o.num_mnk; ++i)
        rc = bench_matmul(&b, o.mnk[i][0], o.mnk[i][1], o.mnk[i][2]);
    for (size_t i = 0; rc == CLI_OK && o.ops[1] && i < o.num_seq; ++i)
        rc = bench_softmax(&b, o.seq[i], o.seq_k ? o.seq_k : o.seq[i]);
    for (size_t i = 0; rc == CLI_OK && o.ops[2] && i < o.num_seq; ++i)
        rc = bench_attention(&b, o.seq[i], o.seq_k ? o.seq_k : o.seq[i]);
    for (size_t i = 0; rc == CLI_OK && o.ops[3] && i < o.num_seq; ++i)
        rc = bench_mha(&b, o.seq[i]);
    clattn_ctx_release(b.ctx);
    if (b.queue)
        clReleaseCommandQueue(b.queue);
    clattn_ctx_release(probe);
    return rc;
}
