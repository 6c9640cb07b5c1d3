/* clattn tune: searches the tuning keys of each op on the present device (tools/tune_space.h),
 * checks every candidate's outputs, times it, and writes the winners as tuning-table rows to
 * the cache the library reads at context creation (host/core/tuning.c). */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "tune_space.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char tune_usage[] =
    "Searches the kernel parameters of each op (default all) on the device: coordinate descent\n"
    "from the built-in table's values, one key at a time over its candidates (tools/\n"
    "tune_space.h), each candidate in a fresh context. A candidate's outputs must match the\n"
    "defaults' (themselves checked against a float64 reference) on the same random inputs, at\n"
    "awkward sizes and at the timed sizes; one the device refuses or that computes wrongly is\n"
    "reported and skipped. Keys that depend on each other (tile sides, work-group sides,\n"
    "flash_cpu's rows per block and blocks) are searched jointly over their cross product.\n"
    "Times are wall-clock medians after a warm-up, on a CPU:\n"
    "  matmul   1024x1024x1024 and 4096x4096x64 (A·Bᵀ, the QKᵀ shape)\n"
    "  softmax  the unfused attention path with its weights, B=1 H=8 L=1024 d=16\n"
    "  flash    the fused attention kernel, B=1 H=8 L=1024 d=64; then d=128 on its own\n"
    "  backward the training backward (dQ, dK, dV after the fused forward), B=1 H=8 L=1024,\n"
    "           d=64 and d=128 each on its own (CPUs only: its key blocks, flash_bwd_nv, and\n"
    "           rows a step, flash_bwd_rb)\n"
    "A search at one head size writes a record, `@head_dim=D key=value ...`, that applies to\n"
    "attention plans of that head size only, and starts from the values the built-in records\n"
    "give it; the others write rows for every problem.\n"
    "on a GPU (a wave of work-groups on a large one): matmul 4096x4096x1024 and 4096x4096x64,\n"
    "softmax B=4 H=8 L=1024 d=16, flash B=4 H=8 L=1024 at d=64 and d=128 and a decode step\n"
    "(B=1 H=32, one row per head over 8192 keys, d=128; decode_keys is searched there).\n"
    "--quick shrinks the sizes and the candidates. Time, all ops, on a 2-core EPYC through\n"
    "PoCL (2026-12-04, kernels compiled cold): --quick 28 s, a full tune 4.5 minutes before\n"
    "the joint search (about 30 more flash candidates there, not re-timed).\n"
    "A winner must beat the current best by --min-gain percent (default 3) and hold that in a\n"
    "paired re-measurement\n"
    "against the defaults. The winners' keys that differ from the defaults are written as rows\n"
    "`class | vendor | device name | driver D | PLATFORM | clattn V | key=value ...` (the\n"
    "device's driver key, as `clattn info` prints it: the rows apply on that driver, platform\n"
    "and clattn version only), with a comment, to --out FILE or (a full tune only) the tuning\n"
    "cache $XDG_CACHE_HOME/clattn/tuning (~/.cache/clattn/tuning), replacing earlier rows of\n"
    "this device (whatever their driver) for the tuned ops and keeping the rest. --quick\n"
    "without --out prints its rows and writes nothing: measured at toy sizes, they must not\n"
    "reach the cache every context reads. --dry-run prints the rows only.\n"
    "Every context reads the cache; CLATTN_TUNING=FILE reads FILE instead, and\n"
    "CLATTN_TUNING=default applies no row. `clattn info` shows which rows apply.\n"
    "Exit status: 0 success, 1 device or library failure, 2 bad options (an unwritable --out,\n"
    "a malformed --device, CLATTN_PARAMS / CLATTN_MATMUL / CLATTN_LOOP_TRIP_LIMIT set).\n";

static tune_space_key tune_space[TUNE_MAX_KEYS]; /* the library's keys (tune_space_load) */
static size_t num_keys;                          /* how many */

typedef struct tune_options {
    cli_exec exec; /* --device */
    const char *out, *op;
    bool quick, dry_run;
    double min_gain; /* percent */
} tune_options;

/* --- problems: one matmul or attention call, its inputs, its outputs ---------------------- */

typedef enum { CASE_MATMUL, CASE_FUSED, CASE_UNFUSED, CASE_BACKWARD } case_kind;

typedef struct tune_case {
    case_kind kind;
    size_t m, n, k;                              /* matmul: C (m x n) = A · op(B) */
    int trans_b;                                 /* B stored n x k */
    size_t batch, heads, seq_q, seq_k, head_dim; /* attention */
    clattn_causal causal;
    bool timed; /* timed (else checked only, and against float64 for the defaults) */
} tune_case;

typedef struct case_data {
    float *in[4]; /* matmul: A, B; attention: Q, K, V (the backward: and dO) */
    size_t in_count[4];
    float *expected; /* the defaults' outputs (the backward: dQ, dK, dV in a row) */
    size_t out_count;
    double base_ms; /* the defaults' median (timed cases) */
} case_data;

static void case_label(const tune_case *c, char *text, size_t size)
{
    if (c->kind == CASE_MATMUL)
        snprintf(text, size, "%zux%zux%zu%s", c->m, c->n, c->k, c->trans_b ? " (A·Bᵀ)" : "");
    else
        snprintf(text, size, "B=%zu H=%zu Lq=%zu Lk=%zu d=%zu%s%s", c->batch, c->heads, c->seq_q,
                 c->seq_k, c->head_dim, c->causal ? " causal" : "",
                 c->kind == CASE_UNFUSED    ? " unfused+weights"
                 : c->kind == CASE_BACKWARD ? " backward"
                                            : "");
}

static uint64_t next_random(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return *state >> 33;
}

static float *random_floats(size_t count, uint64_t seed)
{
    float *values = malloc((count ? count : 1) * sizeof *values);
    uint64_t state = seed * 2654435761ull + 1;
    for (size_t i = 0; values && i < count; ++i)
        values[i] = (float)((double)next_random(&state) / 2147483648.0 * 2.0 - 1.0);
    return values;
}

static bool case_make(const tune_case *c, case_data *d, uint64_t seed)
{
    memset(d, 0, sizeof *d);
    if (c->kind == CASE_MATMUL) {
        d->in_count[0] = c->m * c->k;
        d->in_count[1] = c->k * c->n;
        d->out_count = c->m * c->n;
    } else {
        const size_t bh = c->batch * c->heads;
        d->in_count[0] = bh * c->seq_q * c->head_dim;
        d->in_count[1] = d->in_count[2] = bh * c->seq_k * c->head_dim;
        d->out_count =
            bh * c->seq_q * c->head_dim + (c->kind == CASE_UNFUSED ? bh * c->seq_q * c->seq_k : 0);
        if (c->kind == CASE_BACKWARD) { /* dO in; dQ, dK, dV out */
            d->in_count[3] = bh * c->seq_q * c->head_dim;
            d->out_count = bh * (c->seq_q + 2 * c->seq_k) * c->head_dim;
        }
    }
    for (int i = 0; i < 4; ++i)
        if (d->in_count[i] && !(d->in[i] = random_floats(d->in_count[i], seed + (uint64_t)i)))
            return false;
    return (d->expected = malloc(d->out_count * sizeof(float))) != NULL;
}

static void case_free(case_data *d)
{
    for (int i = 0; i < 4; ++i)
        free(d->in[i]);
    free(d->expected);
}

/* The backward's float64 reference: dQ, dK, dV (in a row in ref) of softmax(scale Q K^T) V
 * (top-left causal if asked) for the upstream gradient dO: P from the scores, dV = P^T dO,
 * dS = P * (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q. */
static void backward_reference(const tune_case *c, const case_data *d, double *ref)
{
    const size_t dim = c->head_dim, lq = c->seq_q, lk = c->seq_k;
    const double scale = 1.0 / sqrt((double)dim);
    const size_t bh_count = c->batch * c->heads;
    double *p = malloc(lq * lk * sizeof *p), *o = malloc(dim * sizeof *o);
    double *dq = ref, *dk = ref + bh_count * lq * dim, *dv = dk + bh_count * lk * dim;
    if (p == NULL || o == NULL) {
        free(p);
        free(o);
        return;
    }
    for (size_t i = 0; i < bh_count * (lq + 2 * lk) * dim; ++i)
        ref[i] = 0.0;
    for (size_t bh = 0; bh < bh_count; ++bh) {
        const float *q = d->in[0] + bh * lq * dim, *k = d->in[1] + bh * lk * dim;
        const float *v = d->in[2] + bh * lk * dim, *g = d->in[3] + bh * lq * dim;
        double *gq = dq + bh * lq * dim, *gk = dk + bh * lk * dim, *gv = dv + bh * lk * dim;
        for (size_t i = 0; i < lq; ++i) {
            double *row = p + i * lk, max = -INFINITY, sum = 0.0;
            for (size_t j = 0; j < lk; ++j) {
                double dot = 0.0;
                for (size_t e = 0; e < dim; ++e)
                    dot += (double)q[i * dim + e] * k[j * dim + e];
                row[j] = c->causal && j > i ? -INFINITY : dot * scale;
                max = row[j] > max ? row[j] : max;
            }
            for (size_t j = 0; j < lk; ++j)
                sum += (row[j] = row[j] == -INFINITY ? 0.0 : exp(row[j] - max));
            for (size_t e = 0; e < dim; ++e)
                o[e] = 0.0;
            for (size_t j = 0; j < lk; ++j) {
                row[j] /= sum;
                for (size_t e = 0; e < dim; ++e)
                    o[e] += row[j] * v[j * dim + e];
            }
            double delta = 0.0; /* rowsum(dO * O) */
            for (size_t e = 0; e < dim; ++e)
                delta += (double)g[i * dim + e] * o[e];
            for (size_t j = 0; j < lk; ++j) {
                double dp = 0.0;
                for (size_t e = 0; e < dim; ++e) {
                    dp += (double)g[i * dim + e] * v[j * dim + e];
                    gv[j * dim + e] += row[j] * g[i * dim + e];
                }
                const double ds = row[j] * (dp - delta) * scale;
                for (size_t e = 0; e < dim; ++e) {
                    gq[i * dim + e] += ds * k[j * dim + e];
                    gk[j * dim + e] += ds * q[i * dim + e];
                }
            }
        }
    }
    free(p);
    free(o);
}

/* float64 reference of a case into ref (out_count doubles). */
static void case_reference(const tune_case *c, const case_data *d, double *ref)
{
    if (c->kind == CASE_MATMUL) {
        for (size_t i = 0; i < c->m; ++i)
            for (size_t j = 0; j < c->n; ++j) {
                double sum = 0.0;
                for (size_t p = 0; p < c->k; ++p)
                    sum += (double)d->in[0][i * c->k + p] *
                           d->in[1][c->trans_b ? j * c->k + p : p * c->n + j];
                ref[i * c->n + j] = sum;
            }
        return;
    }
    const size_t dim = c->head_dim, lq = c->seq_q, lk = c->seq_k;
    const double scale = 1.0 / sqrt((double)dim);
    if (c->kind == CASE_BACKWARD) {
        backward_reference(c, d, ref);
        return;
    }
    double *p = malloc(lk * sizeof *p);
    if (p == NULL)
        return;
    double *weights = ref + c->batch * c->heads * lq * dim;
    for (size_t bh = 0; bh < c->batch * c->heads; ++bh)
        for (size_t i = 0; i < lq; ++i) {
            const float *q = d->in[0] + (bh * lq + i) * dim;
            double max = -INFINITY, sum = 0.0;
            for (size_t j = 0; j < lk; ++j) {
                const float *k = d->in[1] + (bh * lk + j) * dim;
                double s = 0.0;
                for (size_t e = 0; e < dim; ++e)
                    s += (double)q[e] * k[e];
                p[j] = c->causal && j > i ? -INFINITY : s * scale;
                max = p[j] > max ? p[j] : max;
            }
            for (size_t j = 0; j < lk; ++j)
                sum += (p[j] = p[j] == -INFINITY ? 0.0 : exp(p[j] - max));
            double *out = ref + (bh * lq + i) * dim;
            for (size_t e = 0; e < dim; ++e)
                out[e] = 0.0;
            for (size_t j = 0; j < lk; ++j) {
                p[j] /= sum;
                const float *v = d->in[2] + (bh * lk + j) * dim;
                for (size_t e = 0; e < dim; ++e)
                    out[e] += p[j] * v[e];
                if (c->kind == CASE_UNFUSED)
                    weights[(bh * lq + i) * lk + j] = p[j];
            }
        }
    free(p);
}

/* The largest |got - want| relative to max(1, max |want|); infinity for a NaN. */
static double max_error(const float *got, const float *want_f, const double *want_d, size_t count)
{
    double err = 0.0, scale = 1.0;
    for (size_t i = 0; i < count; ++i) {
        const double want = want_f ? want_f[i] : want_d[i];
        scale = fabs(want) > scale ? fabs(want) : scale;
    }
    for (size_t i = 0; i < count; ++i) {
        const double want = want_f ? want_f[i] : want_d[i];
        const double diff = fabs((double)got[i] - want);
        if (!(diff <= err)) /* NaN compares false */
            err = isnan(diff) ? INFINITY : diff;
    }
    return err / scale;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int compare_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs case c on ctx: once, or 1 warm-up + `runs` times (median wall ms in *ms); the outputs
 * (poisoned with NaN first) into out. The backward: the fused forward with its lse once, then
 * the backward plan (dQ, dK, dV) timed. */
static clattn_status case_run(clattn_ctx *ctx, const tune_case *c, const case_data *d, float *out,
                              int runs, double *ms)
{
    cl_context context = clattn_ctx_cl_context(ctx);
    cl_command_queue queue = clattn_ctx_queue(ctx);
    const size_t bh = c->batch * c->heads;
    const bool backward = c->kind == CASE_BACKWARD;
    size_t out_counts[3] = {c->kind == CASE_MATMUL ? d->out_count : bh * c->seq_q * c->head_dim,
                            c->kind == CASE_UNFUSED ? bh * c->seq_q * c->seq_k : 0, 0};
    if (backward) /* dQ, dK, dV */
        out_counts[1] = out_counts[2] = bh * c->seq_k * c->head_dim;
    cl_mem in[4] = {NULL}, outs[3] = {NULL}, fwd[2] = {NULL}; /* fwd: the forward's out, lse */
    clattn_plan *plan = NULL, *forward = NULL;
    double *times = calloc((size_t)runs + 1, sizeof *times);
    cl_int err = times ? CL_SUCCESS : CL_OUT_OF_HOST_MEMORY;
    for (int i = 0; i < 4 && err == CL_SUCCESS; ++i)
        if (d->in_count[i])
            in[i] = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                   d->in_count[i] * sizeof(float), d->in[i], &err);
    const float nan_pattern = NAN;
    for (int i = 0; i < 3 && err == CL_SUCCESS; ++i)
        if (out_counts[i]) {
            outs[i] = clCreateBuffer(context, CL_MEM_READ_WRITE, out_counts[i] * sizeof(float),
                                     NULL, &err);
            if (err == CL_SUCCESS)
                err = clEnqueueFillBuffer(queue, outs[i], &nan_pattern, sizeof nan_pattern, 0,
                                          out_counts[i] * sizeof(float), 0, NULL, NULL);
        }
    const size_t fwd_counts[2] = {bh * c->seq_q * c->head_dim, bh * c->seq_q};
    for (int i = 0; i < 2 && backward && err == CL_SUCCESS; ++i)
        fwd[i] = clCreateBuffer(context, CL_MEM_READ_WRITE, fwd_counts[i] * sizeof(float), NULL,
                                &err);
    clattn_status status = (clattn_status)err;
    clattn_matmul_desc mm = {.struct_size = sizeof mm, .trans_b = c->trans_b, .alpha = 1.0f};
    clattn_tensor a = {0}, b = {0}, cc = {0};
    clattn_sdpa_desc sdpa;
    clattn_sdpa_desc_init(&sdpa);
    clattn_tensors sdpa_tensors = {0};
    CLATTN_BIND_ROLES(sdpa, sdpa_tensors);
    if (c->kind == CASE_MATMUL) {
        a = clattn_tensor_make(in[0], 0, CLATTN_DTYPE_F32, 2, c->m, c->k, 0, 0);
        b = c->trans_b ? clattn_tensor_make(in[1], 0, CLATTN_DTYPE_F32, 2, c->n, c->k, 0, 0)
                       : clattn_tensor_make(in[1], 0, CLATTN_DTYPE_F32, 2, c->k, c->n, 0, 0);
        cc = clattn_tensor_make(outs[0], 0, CLATTN_DTYPE_F32, 2, c->m, c->n, 0, 0);
    } else if (status == CLATTN_SUCCESS) {
        clattn_tensors *t = &sdpa_tensors;
        t->q = clattn_tensor_make(in[0], 0, CLATTN_DTYPE_F32, 4, c->batch, c->heads, c->seq_q,
                                  c->head_dim);
        t->k = clattn_tensor_make(in[1], 0, CLATTN_DTYPE_F32, 4, c->batch, c->heads, c->seq_k,
                                  c->head_dim);
        t->v = clattn_tensor_make(in[2], 0, CLATTN_DTYPE_F32, 4, c->batch, c->heads, c->seq_k,
                                  c->head_dim);
        t->out = clattn_tensor_make(backward ? fwd[0] : outs[0], 0, CLATTN_DTYPE_F32, 4, c->batch,
                                    c->heads, c->seq_q, c->head_dim);
        if (c->kind == CASE_UNFUSED)
            t->weights = clattn_tensor_make(outs[1], 0, CLATTN_DTYPE_F32, 4, c->batch, c->heads,
                                            c->seq_q, c->seq_k);
        if (backward)
            t->lse =
                clattn_tensor_make(fwd[1], 0, CLATTN_DTYPE_F32, 3, c->batch, c->heads, c->seq_q, 0);
        sdpa.causal = c->causal;
        sdpa.path = c->kind == CASE_UNFUSED ? CLATTN_PATH_UNFUSED : CLATTN_PATH_FUSED;
        status = clattn_sdpa_plan_create(ctx, &sdpa, backward ? &forward : &plan);
        if (backward && status == CLATTN_SUCCESS) /* the forward's out and lse, once */
            status = clattn_plan_execute(forward, sdpa_tensors.by_role, CLATTN_ROLE_COUNT, NULL,
                                         NULL, 0, NULL, NULL);
        if (backward && status == CLATTN_SUCCESS) {
            t->grad_out = clattn_tensor_make(in[3], 0, CLATTN_DTYPE_F32, 4, c->batch, c->heads,
                                             c->seq_q, c->head_dim);
            t->grad_q = clattn_tensor_make(outs[0], 0, CLATTN_DTYPE_F32, 4, c->batch, c->heads,
                                           c->seq_q, c->head_dim);
            t->grad_k = clattn_tensor_make(outs[1], 0, CLATTN_DTYPE_F32, 4, c->batch, c->heads,
                                           c->seq_k, c->head_dim);
            t->grad_v = clattn_tensor_make(outs[2], 0, CLATTN_DTYPE_F32, 4, c->batch, c->heads,
                                           c->seq_k, c->head_dim);
            status = clattn_sdpa_backward_plan_create(ctx, &sdpa, &plan);
        }
    }
    const int total = runs > 0 ? runs + 1 : 1;
    for (int r = 0; r < total && status == CLATTN_SUCCESS; ++r) {
        status = (clattn_status)clFinish(queue);
        const double start = now_ms();
        if (status == CLATTN_SUCCESS)
            status = c->kind == CASE_MATMUL
                         ? clattn_matmul(ctx, &mm, &a, &b, NULL, &cc, 0, NULL, NULL)
                         : clattn_plan_execute(plan, sdpa_tensors.by_role, CLATTN_ROLE_COUNT, NULL,
                                               NULL, 0, NULL, NULL);
        if (status == CLATTN_SUCCESS)
            status = (clattn_status)clFinish(queue);
        times[r] = now_ms() - start;
    }
    if (status == CLATTN_SUCCESS && runs > 0) {
        qsort(times + 1, (size_t)runs, sizeof *times, compare_double);
        *ms = runs % 2 ? times[1 + runs / 2] : 0.5 * (times[runs / 2] + times[1 + runs / 2]);
    }
    size_t offset = 0;
    for (int i = 0; i < 3 && status == CLATTN_SUCCESS; ++i)
        if (out_counts[i]) {
            status = (clattn_status)clEnqueueReadBuffer(queue, outs[i], CL_TRUE, 0,
                                                        out_counts[i] * sizeof(float),
                                                        out + offset, 0, NULL, NULL);
            offset += out_counts[i];
        }
    clattn_plan_release(plan);
    clattn_plan_release(forward);
    cli_release_buffers(in, 4);
    cli_release_buffers(outs, 3);
    cli_release_buffers(fwd, 2);
    free(times);
    return status;
}

/* --- the ops ------------------------------------------------------------------------------ */

enum { MAX_CASES = 6 };

/* full: a full tune on a CPU; gpu: a full tune on a GPU (sizes that fill a large GPU: at least
 * one wave of work-groups over 132 compute units with the default tiles, and the head sizes
 * and decode shapes that GPU kernels are chosen for); quick: --quick on either. */
typedef struct tune_op {
    const char *name; /* the keys' op column (tools/tune_space.h) and --op's name */
    tune_case full[MAX_CASES], gpu[MAX_CASES], quick[MAX_CASES]; /* m == 0, kind 0 ends a list */
    /* NULL: the row applies to every problem; else its selectors ("@head_dim=128"): the search
     * starts from the values the built-in records give those problems, its trials and its row
     * are records with these selectors (host/tuning/table.h) */
    const char *select;
    bool cpu_only; /* searched on CPUs only (a GPU's list times that head size already) */
} tune_op;

#define MM(M, N, K, T, TIMED)                                                                      \
    {                                                                                              \
        CASE_MATMUL, M, N, K, T, 0, 0, 0, 0, 0, CLATTN_CAUSAL_NONE, TIMED                          \
    }
#define ATT(KIND, B, H, LQ, LK, D, CAUSAL, TIMED)                                                  \
    {                                                                                              \
        KIND, 0, 0, 0, 0, B, H, LQ, LK, D, CAUSAL, TIMED                                           \
    }

/* A CPU-only search at head size D, written as a record "@head_dim=D": checked at 129 x 65
 * and causal 65 x 129, timed at B=1 H=8 L=1024 (--quick: 256, two heads); no GPU list. */
#define HEAD_SIZE_OP(NAME, KIND, D)                                                                \
    {                                                                                              \
        NAME,                                                                                      \
            {ATT(KIND, 1, 2, 129, 65, D, CLATTN_CAUSAL_NONE, false),                               \
             ATT(KIND, 1, 1, 65, 129, D, CLATTN_CAUSAL_TOP_LEFT, false),                           \
             ATT(KIND, 1, 8, 1024, 1024, D, CLATTN_CAUSAL_NONE, true)},                            \
            {ATT(CASE_MATMUL, 0, 0, 0, 0, 0, CLATTN_CAUSAL_NONE, false)},                          \
            {ATT(KIND, 1, 2, 129, 65, D, CLATTN_CAUSAL_NONE, false),                               \
             ATT(KIND, 1, 2, 256, 256, D, CLATTN_CAUSAL_NONE, true)},                              \
            "@head_dim=" #D, true                                                                  \
    }

static const tune_op tune_ops[] = {
    {"matmul",
     {MM(129, 127, 65, 0, false), MM(65, 129, 64, 1, false), MM(1024, 1024, 1024, 0, true),
      MM(4096, 4096, 64, 1, true)},
     /* 4096^2 x 1024: 4096 groups of 64 x 64 (1024 of 128 x 128) */
     {MM(129, 127, 65, 0, false), MM(65, 129, 64, 1, false), MM(4096, 4096, 1024, 0, true),
      MM(4096, 4096, 64, 1, true)},
     {MM(129, 127, 65, 0, false), MM(65, 129, 64, 1, false), MM(256, 256, 256, 0, true),
      MM(512, 512, 64, 1, true)},
     NULL,
     false},
    {"softmax",
     {ATT(CASE_UNFUSED, 1, 2, 129, 65, 16, CLATTN_CAUSAL_NONE, false),
      ATT(CASE_UNFUSED, 1, 1, 65, 129, 16, CLATTN_CAUSAL_TOP_LEFT, false),
      ATT(CASE_UNFUSED, 1, 8, 1024, 1024, 16, CLATTN_CAUSAL_NONE, true)},
     {ATT(CASE_UNFUSED, 1, 2, 129, 65, 16, CLATTN_CAUSAL_NONE, false),
      ATT(CASE_UNFUSED, 1, 1, 65, 129, 16, CLATTN_CAUSAL_TOP_LEFT, false),
      ATT(CASE_UNFUSED, 4, 8, 1024, 1024, 16, CLATTN_CAUSAL_NONE, true)},
     {ATT(CASE_UNFUSED, 1, 2, 129, 65, 16, CLATTN_CAUSAL_NONE, false),
      ATT(CASE_UNFUSED, 1, 1, 65, 129, 16, CLATTN_CAUSAL_TOP_LEFT, false),
      ATT(CASE_UNFUSED, 1, 4, 256, 256, 16, CLATTN_CAUSAL_NONE, true)},
     NULL,
     false},
    {"flash",
     {ATT(CASE_FUSED, 1, 2, 129, 65, 64, CLATTN_CAUSAL_NONE, false),
      ATT(CASE_FUSED, 1, 1, 65, 129, 64, CLATTN_CAUSAL_TOP_LEFT, false),
      ATT(CASE_FUSED, 1, 8, 1024, 1024, 64, CLATTN_CAUSAL_NONE, true)},
     /* B=4 H=8 L=1024: 512 groups of 64 rows (B=1 gives 128, under one per compute unit of a
      * 132-unit GPU); d=128 (the tile shape changes there); decode: one row per head over
      * 8192 keys (decode_keys's splits) */
     {ATT(CASE_FUSED, 1, 2, 129, 65, 64, CLATTN_CAUSAL_NONE, false),
      ATT(CASE_FUSED, 1, 1, 65, 129, 128, CLATTN_CAUSAL_TOP_LEFT, false),
      ATT(CASE_FUSED, 4, 8, 1024, 1024, 64, CLATTN_CAUSAL_NONE, true),
      ATT(CASE_FUSED, 4, 8, 1024, 1024, 128, CLATTN_CAUSAL_NONE, true),
      ATT(CASE_FUSED, 1, 32, 1, 8192, 128, CLATTN_CAUSAL_NONE, true)},
     {ATT(CASE_FUSED, 1, 2, 129, 65, 64, CLATTN_CAUSAL_NONE, false),
      ATT(CASE_FUSED, 1, 1, 65, 129, 64, CLATTN_CAUSAL_TOP_LEFT, false),
      ATT(CASE_FUSED, 1, 2, 256, 256, 64, CLATTN_CAUSAL_NONE, true)},
     NULL,
     false},
    /* CPUs: flash_cpu's register blocks at d = 128 (rows per block, blocks, vectors per row
     * change with the head size), as a record for that head size */
    HEAD_SIZE_OP("flash", CASE_FUSED, 128),
    /* CPUs: the training backward's key blocks (flash_bwd_nv) per head size: the fused
     * forward with its lse, then dQ, dK, dV timed */
    HEAD_SIZE_OP("backward", CASE_BACKWARD, 64),
    HEAD_SIZE_OP("backward", CASE_BACKWARD, 128),
};

/* The op's selectors ("" for a row that applies to every problem). */
static const char *op_select(const tune_op *op)
{
    return op->select ? op->select : "";
}

static bool case_present(const tune_case *c)
{
    return c->kind != CASE_MATMUL || c->m != 0;
}

/* --- the search --------------------------------------------------------------------------- */

typedef struct tune_state {
    const tune_options *options;
    bool cpu; /* the device's class */
    char vendor[256], name[256];
    char driver[640];       /* the driver key's fields after the name: "driver D | P | clattn V" */
    char base_params[2048]; /* the "parameters:" line of the defaults' context */
    unsigned base[TUNE_MAX_KEYS], value[TUNE_MAX_KEYS];
    bool known[TUNE_MAX_KEYS]; /* the library knows the key (it is in base_params) */
} tune_state;

/* The value of key in a "parameters: k=v k=v" text; false if absent. */
static bool param_value(const char *params, const char *key, unsigned *out)
{
    const size_t length = strlen(key);
    for (const char *at = strstr(params, key); at; at = strstr(at + 1, key))
        if ((at == params || at[-1] == ' ') && at[length] == '=') {
            char *end = NULL;
            const unsigned long v = strtoul(at + length + 1, &end, 10);
            *out = (unsigned)v;
            return end != at + length + 1;
        }
    return false;
}

/* A context with the built-in rows (no cache, no CLATTN_TUNING file) and `rows` last. */
static clattn_status tune_context(const tune_state *s, const char *rows, clattn_ctx **ctx,
                                  char *message, size_t size)
{
    clattn_ctx_desc desc;
    clattn_ctx_desc_init(&desc);
    desc.device_spec = s->options->exec.device;
    desc.tuning_file = "";
    desc.tuning_rows = rows;
    return clattn_ctx_create_desc(&desc, ctx, message, size);
}

/* The keys of `values` that differ from the defaults, as "k=v k=v" ("" when none). */
static void diff_keys(const tune_state *s, const unsigned *values, const char *op, char *text,
                      size_t size)
{
    text[0] = '\0';
    for (size_t i = 0; i < num_keys; ++i) {
        const size_t used = strlen(text);
        if (s->known[i] && values[i] != s->base[i] && (!op || !strcmp(tune_space[i].op, op)))
            snprintf(text + used, size - used, "%s%s=%u", used ? " " : "", tune_space[i].key,
                     values[i]);
    }
}

static bool class_matches(const tune_state *s, const char *class_name)
{
    return strcmp(class_name, "any") == 0 || strcmp(class_name, s->cpu ? "cpu" : "gpu") == 0;
}

/* Whether a "key=value" condition holds for the current values ("" always does). */
static bool when_holds(const tune_state *s, const unsigned *values, const char *when)
{
    if (when[0] == '\0')
        return true;
    const char *eq = strchr(when, '=');
    const unsigned want = (unsigned)strtoul(eq + 1, NULL, 10);
    for (size_t i = 0; i < num_keys; ++i)
        if (strlen(tune_space[i].key) == (size_t)(eq - when) &&
            strncmp(tune_space[i].key, when, (size_t)(eq - when)) == 0)
            return s->known[i] && values[i] == want;
    return false;
}

/* Over values: the keys that ctx's records with exactly the selectors `select` set (its
 * clattn_ctx_tuning "records:" line: "ORIGIN (SELECTORS: k=v ...); ..."). A search of the
 * problems those records select starts from what they give (the built-in table's
 * "@head_dim=64 flash_bwd_nv=2", for one). */
static void overlay_records(const tune_state *s, clattn_ctx *ctx, const char *select,
                            unsigned *values)
{
    const char *text = strstr(clattn_ctx_tuning(ctx), "records:");
    const size_t length = strlen(select);
    if (text == NULL || length == 0)
        return;
    const char *end = strchr(text, '\n');
    for (const char *open = strchr(text, '('); open && (!end || open < end);
         open = strchr(open + 1, '(')) {
        const char *colon = strchr(open, ':'), *close = strchr(open, ')');
        if (!colon || !close || colon > close || (size_t)(colon - open - 1) != length ||
            strncmp(open + 1, select, length) != 0)
            continue;
        char items[1024];
        snprintf(items, sizeof items, "%.*s", (int)(close - colon - 1), colon + 1);
        char *save = NULL;
        for (char *item = strtok_r(items, " ", &save); item; item = strtok_r(NULL, " ", &save)) {
            const size_t name = strcspn(item, "=");
            for (size_t i = 0; i < num_keys; ++i)
                if (s->known[i] && item[name] == '=' && strlen(tune_space[i].key) == name &&
                    strncmp(tune_space[i].key, item, name) == 0)
                    values[i] = (unsigned)strtoul(item + name + 1, NULL, 10);
        }
    }
}

typedef enum { TRY_OK, TRY_REFUSED, TRY_WRONG } try_result;

/* Checks the op's cases on ctx. expect: ctx has the defaults: their outputs become the
 * expected ones, and the checked (untimed) cases are compared with float64; otherwise the
 * outputs are compared with the defaults'. */
static try_result check_cases(clattn_ctx *ctx, const tune_case *cases, case_data *data,
                              size_t count, bool expect, char *why, size_t why_size)
{
    try_result result = TRY_OK;
    for (size_t i = 0; i < count && result == TRY_OK; ++i) {
        const tune_case *c = &cases[i];
        float *out = malloc(data[i].out_count * sizeof *out);
        double *ref = expect && !c->timed ? malloc(data[i].out_count * sizeof *ref) : NULL;
        char label[128];
        case_label(c, label, sizeof label);
        double ms = 0.0;
        const clattn_status status = out && (ref || !expect || c->timed)
                                         ? case_run(ctx, c, &data[i], out, 0, &ms)
                                         : CLATTN_ERR_HOST_MEMORY;
        double err = 0.0;
        if (status != CLATTN_SUCCESS) {
            snprintf(why, why_size, "%s: %s: %s", label, clattn_status_string(status),
                     clattn_last_error(ctx));
            result = TRY_REFUSED;
        } else if (!expect) {
            err = max_error(out, data[i].expected, NULL, data[i].out_count);
        } else {
            memcpy(data[i].expected, out, data[i].out_count * sizeof *out);
            if (ref) {
                case_reference(c, &data[i], ref);
                err = max_error(out, NULL, ref, data[i].out_count);
            }
        }
        if (result == TRY_OK && !(err <= 1e-4)) {
            snprintf(why, why_size, "%s: outputs differ from %s by %.3g (relative)", label,
                     expect ? "the float64 reference" : "the defaults'", err);
            result = TRY_WRONG;
        }
        free(out);
        free(ref);
    }
    return result;
}

/* Times ctx against `against` in alternation (A B A B ..., rounds of medians of a few runs
 * after a warm-up): the geometric mean over the timed cases of the ratio of the medians,
 * against's time / ctx's (above 1: ctx is faster); 0 when a run fails (why says it). */
static double paired_speedup(const tune_state *s, clattn_ctx *ctx, clattn_ctx *against,
                             const tune_case *cases, case_data *data, size_t count, char *why,
                             size_t why_size)
{
    enum { MAX_ROUNDS = 5 };
    const int rounds = s->options->quick ? 2 : 3, runs = s->options->quick ? 3 : 5;
    double log_sum = 0.0;
    size_t timed = 0;
    for (size_t i = 0; i < count; ++i) {
        if (!cases[i].timed)
            continue;
        double ms[2][MAX_ROUNDS];
        float *out = malloc(data[i].out_count * sizeof *out);
        clattn_status status = out ? CLATTN_SUCCESS : CLATTN_ERR_HOST_MEMORY;
        for (int round = 0; round < rounds && status == CLATTN_SUCCESS; ++round)
            for (int which = 0; which < 2 && status == CLATTN_SUCCESS; ++which) {
                clattn_ctx *on = which ? ctx : against;
                status = case_run(on, &cases[i], &data[i], out, runs, &ms[which][round]);
                if (status != CLATTN_SUCCESS)
                    snprintf(why, why_size, "%s: %s", clattn_status_string(status),
                             clattn_last_error(on));
            }
        free(out);
        if (status != CLATTN_SUCCESS)
            return 0.0;
        qsort(ms[0], (size_t)rounds, sizeof(double), compare_double);
        qsort(ms[1], (size_t)rounds, sizeof(double), compare_double);
        const double a = rounds % 2 ? ms[0][rounds / 2] : 0.5 * (ms[0][0] + ms[0][1]);
        const double b = rounds % 2 ? ms[1][rounds / 2] : 0.5 * (ms[1][0] + ms[1][1]);
        log_sum += log(a / b);
        ++timed;
    }
    return timed ? exp(log_sum / (double)timed) : 1.0;
}

enum { MAX_CANDIDATES = 16 };

/* Keys searched jointly, as one key whose candidates are the cross product of theirs: the best
 * value of one depends on the other (a tile's two sides, a work-group's two sides, flash_cpu's
 * register blocks and blocks per group). */
static const char *const joint_keys[][2] = {
    {"tile_m", "tile_n"},
    {"wpt_m", "wpt_n"},
    {"fg_bq", "fg_bk"},
    {"fg_tx", "fg_ty"},
    {"flash_cpu_rb", "flash_cpu_nb"},
};

static size_t key_index(const char *name)
{
    for (size_t i = 0; i < num_keys; ++i)
        if (strcmp(tune_space[i].key, name) == 0)
            return i;
    return num_keys;
}

/* Whether key i is searched for op on this device with the current best values. */
static bool searched_now(const tune_state *s, const tune_op *op, size_t i)
{
    const tune_space_key *key = &tune_space[i];
    if (strcmp(key->op, op->name) != 0 || !class_matches(s, key->class_name) ||
        !when_holds(s, s->value, key->when))
        return false;
    const char *values = s->options->quick ? key->quick : key->values;
    if (values[0] && !s->known[i]) {
        printf("  %s: not a key of this clattn, skipped\n", key->key);
        return false;
    }
    return values[0] != '\0';
}

/* The key searched together with key i (joint_keys), when it is searched now; else num_keys. */
static size_t joint_partner(const tune_state *s, const tune_op *op, size_t i)
{
    for (size_t g = 0; g < sizeof joint_keys / sizeof joint_keys[0]; ++g)
        if (strcmp(joint_keys[g][0], tune_space[i].key) == 0) {
            const size_t partner = key_index(joint_keys[g][1]);
            const tune_space_key *key = partner < num_keys ? &tune_space[partner] : NULL;
            if (key && strcmp(key->op, op->name) == 0 && class_matches(s, key->class_name) &&
                when_holds(s, s->value, key->when) && s->known[partner])
                return partner;
        }
    return num_keys;
}

/* Key i's candidates (--quick's or the full list), its current value first, no repeats. */
static size_t key_candidates(const tune_state *s, size_t i, unsigned *out)
{
    const char *values = s->options->quick ? tune_space[i].quick : tune_space[i].values;
    size_t count = 0;
    out[count++] = s->value[i];
    for (const char *at = values; *at && count < MAX_CANDIDATES;) {
        char *end = NULL;
        const unsigned long candidate = strtoul(at, &end, 10);
        if (end == at)
            break;
        at = end + strspn(end, " ");
        bool seen = false;
        for (size_t k = 0; k < count; ++k)
            seen |= out[k] == (unsigned)candidate;
        if (!seen)
            out[count++] = (unsigned)candidate;
    }
    return values[0] ? count : 0;
}

/* One op: the defaults, then coordinate descent; each candidate timed in pairs against the
 * current best. Writes the row's keys ("" when the defaults won) and its comment. Returns
 * CLI_OK, or CLI_FAILED when the defaults themselves fail. */
static int tune_op_search(tune_state *s, const tune_op *op, char *keys, size_t keys_size,
                          char *comment, size_t comment_size)
{
    const tune_case *cases = s->options->quick ? op->quick : s->cpu ? op->full : op->gpu;
    size_t count = 0;
    while (count < MAX_CASES && case_present(&cases[count]))
        ++count;
    case_data data[MAX_CASES];
    memset(data, 0, sizeof data);
    keys[0] = comment[0] = '\0';
    int rc = CLI_OK;
    for (size_t i = 0; i < count && rc == CLI_OK; ++i)
        if (!case_make(&cases[i], &data[i], 1000 * (uint64_t)(op - tune_ops) + 10 * i))
            rc = cli_fail("tune", CLI_FAILED, "out of host memory");
    char why[1024] = "", sizes[512] = "", message[1024] = "";
    for (size_t i = 0; i < count; ++i)
        if (cases[i].timed) {
            char label[128];
            case_label(&cases[i], label, sizeof label);
            const size_t used = strlen(sizes);
            snprintf(sizes + used, sizeof sizes - used, "%s%s", used ? ", " : "", label);
        }
    const char *select = op_select(op);
    printf("%s%s%s (timed at %s):\n", op->name, select[0] ? " " : "", select, sizes);
    fflush(stdout);
    clattn_ctx *defaults = NULL, *best = NULL;
    if (rc == CLI_OK) {
        clattn_status status = tune_context(s, NULL, &defaults, message, sizeof message);
        if (status != CLATTN_SUCCESS)
            rc = cli_fail("tune", CLI_FAILED, "%s: %s", clattn_status_string(status), message);
        else if (check_cases(defaults, cases, data, count, true, why, sizeof why) != TRY_OK)
            rc = cli_fail("tune", CLI_FAILED, "%s with the default parameters: %s", op->name, why);
    }
    unsigned saved_base[TUNE_MAX_KEYS]; /* the context's; the op's records on top for now */
    memcpy(saved_base, s->base, sizeof saved_base);
    if (rc == CLI_OK)
        overlay_records(s, defaults, select, s->base);
    for (size_t i = 0; i < num_keys; ++i)
        s->value[i] = s->base[i];
    best = defaults;
    const double accept = 1.0 + s->options->min_gain / 100.0;
    unsigned tried = 0, refused = 0;
    bool done[TUNE_MAX_KEYS] = {
        false}; /* the second key of a joint pair, searched with the first */
    for (size_t i = 0; i < num_keys && rc == CLI_OK; ++i) {
        if (done[i] || !searched_now(s, op, i))
            continue;
        const size_t partner = joint_partner(s, op, i);
        const size_t pair[2] = {i, partner};
        const size_t keys_in_trial = partner < num_keys ? 2 : 1;
        if (partner < num_keys)
            done[partner] = true;
        /* each key's candidates, its current value first (a pair: their cross product) */
        unsigned candidates[2][MAX_CANDIDATES];
        size_t counts[2] = {0, 0};
        for (size_t k = 0; k < keys_in_trial; ++k)
            counts[k] = key_candidates(s, pair[k], candidates[k]);
        if (counts[0] == 0)
            continue;
        if (keys_in_trial == 2 && counts[1] == 0) {
            candidates[1][0] = s->value[partner];
            counts[1] = 1;
        }
        for (size_t a = 0; a < counts[0] && rc == CLI_OK; ++a)
            for (size_t b = 0; b < (keys_in_trial == 2 ? counts[1] : 1); ++b) {
                unsigned trial[TUNE_MAX_KEYS];
                memcpy(trial, s->value, sizeof trial);
                trial[i] = candidates[0][a];
                if (keys_in_trial == 2)
                    trial[partner] = candidates[1][b];
                if (memcmp(trial, s->value, sizeof trial) == 0)
                    continue;
                char label[128];
                if (keys_in_trial == 2)
                    snprintf(label, sizeof label, "%s=%u %s=%u", tune_space[i].key, trial[i],
                             tune_space[partner].key, trial[partner]);
                else
                    snprintf(label, sizeof label, "%s=%u", tune_space[i].key, trial[i]);
                char trial_keys[512], rows[600];
                diff_keys(s, trial, NULL, trial_keys, sizeof trial_keys);
                snprintf(rows, sizeof rows, "any | * | * | %s%s%s", select, select[0] ? " " : "",
                         trial_keys);
                ++tried;
                clattn_ctx *ctx = NULL;
                const clattn_status status = tune_context(s, rows, &ctx, message, sizeof message);
                try_result result = TRY_REFUSED;
                double speedup = 0.0;
                if (status != CLATTN_SUCCESS)
                    snprintf(why, sizeof why, "%s: %s", clattn_status_string(status), message);
                else
                    result = check_cases(ctx, cases, data, count, false, why, sizeof why);
                if (result == TRY_OK && (speedup = paired_speedup(s, ctx, best, cases, data, count,
                                                                  why, sizeof why)) == 0.0)
                    result = TRY_REFUSED;
                if (result != TRY_OK) {
                    ++refused;
                    printf("  %s: %s: %s\n", label,
                           result == TRY_WRONG ? "WRONG, skipped" : "refused", why);
                    clattn_ctx_release(ctx);
                } else {
                    const bool better = speedup >= accept;
                    printf("  %s: %.3fx the speed of the best so far%s\n", label, speedup,
                           better ? " (new best)" : "");
                    if (better) {
                        if (best != defaults)
                            clattn_ctx_release(best);
                        best = ctx;
                        memcpy(s->value, trial, sizeof trial);
                    } else {
                        clattn_ctx_release(ctx);
                    }
                }
                fflush(stdout);
            }
    }
    if (rc == CLI_OK)
        diff_keys(s, s->value, op->name, keys, keys_size);
    if (rc == CLI_OK && keys[0]) {
        const double speedup =
            paired_speedup(s, best, defaults, cases, data, count, why, sizeof why);
        if (speedup < accept) {
            printf("  %s: %.3fx the defaults' speed re-measured in pairs: not kept\n", keys,
                   speedup);
            keys[0] = '\0';
        } else {
            time_t now = time(NULL);
            struct tm utc;
            char date[32] = "";
            if (gmtime_r(&now, &utc))
                strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &utc);
            snprintf(comment, comment_size,
                     "# clattn tune %s%s%s, %s, clattn %s%s: %s: %.2fx the defaults' speed "
                     "(coordinate descent, joint pairs, %u candidates, %u refused)",
                     op->name, select[0] ? " " : "", select, date, CLATTN_VERSION_STRING,
                     s->options->quick ? ", --quick" : "", sizes, speedup, tried, refused);
        }
    }
    if (rc == CLI_OK)
        printf("  -> %s\n", keys[0] ? keys : "the defaults");
    if (best != defaults)
        clattn_ctx_release(best);
    clattn_ctx_release(defaults);
    for (size_t i = 0; i < count; ++i)
        case_free(&data[i]);
    memcpy(s->base, saved_base, sizeof saved_base);
    return rc;
}

/* --- the file ----------------------------------------------------------------------------- */

static void trim(char *text)
{
    size_t n = strlen(text);
    while (n > 0 && (text[n - 1] == ' ' || text[n - 1] == '\t' || text[n - 1] == '\n' ||
                     text[n - 1] == '\r'))
        text[--n] = '\0';
    const size_t start = strspn(text, " \t");
    memmove(text, text + start, n - start + 1);
}

/* Whether a row (a line without its comment) belongs to this device, keyed by any driver or
 * none, and sets a key of one of the ops being tuned (or no key at all): such rows are
 * replaced. */
static bool replaced_row(const tune_state *s, const char *line, const bool *ops)
{
    char text[2048];
    snprintf(text, sizeof text, "%s", line);
    char *hash = strchr(text, '#');
    if (hash)
        *hash = '\0';
    /* class | vendor | name [| driver fields] | keys (host/core/tuning.c's apply_row) */
    char *fields[4] = {text, NULL, NULL, strrchr(text, '|')};
    for (int i = 1; i < 3; ++i) {
        char *bar = fields[i - 1] ? strchr(fields[i - 1], '|') : NULL;
        if (bar == NULL || bar >= fields[3])
            return false;
        *bar = '\0';
        fields[i] = bar + 1;
    }
    *fields[3]++ = '\0';
    char *driver = strchr(fields[2], '|');
    if (driver)
        *driver = '\0';
    for (int i = 0; i < 4; ++i)
        trim(fields[i]);
    if (strcmp(fields[0], s->cpu ? "cpu" : "gpu") || strcmp(fields[1], s->vendor) ||
        strcmp(fields[2], s->name))
        return false;
    if (fields[3][0] == '\0')
        return true;
    /* the row's selectors (a record's "@head_dim=128 ..."), then its keys: replaced when a
     * tuned op with the same selectors searches one of them */
    char select[256] = "", keys[2048] = "";
    char *save = NULL;
    for (char *item = strtok_r(fields[3], " \t", &save); item;
         item = strtok_r(NULL, " \t", &save)) {
        char *into = item[0] == '@' ? select : keys;
        const size_t size = item[0] == '@' ? sizeof select : sizeof keys, used = strlen(into);
        snprintf(into + used, size - used, "%s%s", used ? " " : "", item);
    }
    for (char *item = strtok_r(keys, " ", &save); item; item = strtok_r(NULL, " ", &save)) {
        const size_t length = strcspn(item, "=");
        for (size_t k = 0; k < num_keys; ++k)
            if (strlen(tune_space[k].key) == length && !strncmp(tune_space[k].key, item, length))
                for (size_t o = 0; o < sizeof tune_ops / sizeof tune_ops[0]; ++o)
                    if (ops[o] && !strcmp(tune_ops[o].name, tune_space[k].op) &&
                        !strcmp(op_select(&tune_ops[o]), select))
                        return true;
    }
    return false;
}

/* Rewrites `path` atomically (a temporary file in its folder, then rename): its lines except
 * the replaced rows (and the `# clattn tune` comments just above them), then `added`. */
static int write_rows(const tune_state *s, const char *path, const bool *ops, const char *added)
{
    if (cli_make_dirs(path) != 0)
        return cli_fail("tune", CLI_FAILED, "cannot create the folder of %s: %s", path,
                        strerror(errno));
    char temp[1100];
    snprintf(temp, sizeof temp, "%s.XXXXXX", path);
    const int fd = mkstemp(temp);
    FILE *out = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (out == NULL) {
        if (fd >= 0)
            close(fd);
        return cli_fail("tune", CLI_FAILED, "cannot write next to %s: %s", path, strerror(errno));
    }
    FILE *in = fopen(path, "r");
    char pending[8192] = ""; /* `# clattn tune` comment lines waiting for their row */
    char line[2048];
    while (in && fgets(line, sizeof line, in)) {
        if (strncmp(line, "# clattn tune ", 14) == 0) {
            if (strlen(pending) + strlen(line) < sizeof pending)
                strcat(pending, line);
            continue;
        }
        if (!replaced_row(s, line, ops))
            fputs(pending, out), fputs(line, out);
        pending[0] = '\0';
    }
    fputs(pending, out);
    if (in)
        fclose(in);
    fputs(added, out);
    const bool ok = fflush(out) == 0 && fsync(fd) == 0;
    if (fclose(out) != 0 || !ok || rename(temp, path) != 0) {
        const int code = errno;
        remove(temp);
        return cli_fail("tune", CLI_FAILED, "cannot write %s: %s", path, strerror(code));
    }
    return CLI_OK;
}

/* The cache path the library reads (host/core/tuning.c, cache_path): keep the two alike. */
static bool default_cache_path(char *path, size_t size)
{
    return cli_cache_file("tuning", path, size);
}

/* --- the command -------------------------------------------------------------------------- */

static int parse_op(const cli_args *args, const char *value, void *target)
{
    bool found = strcmp(value, "all") == 0;
    for (size_t i = 0; i < sizeof tune_ops / sizeof tune_ops[0]; ++i)
        found = found || strcmp(value, tune_ops[i].name) == 0;
    if (!found)
        return cli_fail(args->command, -1,
                        "--op '%s': expected matmul, softmax, flash, backward or all", value);
    *(const char **)target = value;
    return 1;
}

static int parse_out(const cli_args *args, const char *value, void *target)
{
    if (value[0] == '\0')
        return cli_fail(args->command, -1, "--out: empty path");
    *(const char **)target = value;
    return 1;
}

static int parse_min_gain(const cli_args *args, const char *value, void *target)
{
    float gain = 0.0f;
    if (!cli_parse_float(args->command, "--min-gain", value, &gain))
        return -1;
    if (gain <= -100.0f || gain >= 100.0f)
        return cli_fail(args->command, -1,
                        "--min-gain %s: expected a percentage above -100 and below 100", value);
    *(double *)target = gain;
    return 1;
}

#define AT(field) CLI_AT(tune_options, field)
static const cli_option tune_table[] = {
    {CLI_OPT("--op", CLI_CUSTOM, AT(op), "matmul|softmax|flash|backward|all",
             "the op to tune (default all)"),
     .handle = parse_op},
    {CLI_OPT("--quick", CLI_FLAG, AT(quick), NULL,
             "smaller sizes, fewer candidates (rows go to --out only)")},
    {CLI_OPT("--out", CLI_CUSTOM, AT(out), "FILE", "write the rows there (default: the cache)"),
     .handle = parse_out},
    {CLI_OPT("--dry-run", CLI_FLAG, AT(dry_run), NULL, "measure and print, write nothing")},
    {CLI_OPT("--min-gain", CLI_CUSTOM, AT(min_gain), "PCT",
             "keep a candidate only if this much faster (default 3)"),
     .handle = parse_min_gain},
    CLI_USE(cli_exec_group, tune_options, exec, 0),
};
#undef AT

static const char *const tune_help[] = {tune_usage, NULL};
static const cli_command tune_command = CLI_COMMAND("tune", tune_table, tune_help);

static int parse_options(int argc, char **argv, tune_options *o)
{
    return cli_parse_command(&tune_command, argc, argv, o);
}

int cmd_tune(int argc, char **argv)
{
    tune_options o = {.op = "all", .min_gain = 3.0};
    num_keys = tune_space_load(tune_space);
    if (num_keys == 0)
        return cli_fail("tune", CLI_FAILED, "the library's tuning keys could not be read");
    const int parsed = parse_options(argc, argv, &o);
    if (parsed != CLI_OK)
        return parsed < 0 ? CLI_OK : parsed;
    /* These override the rows in every context, the tuner's included: what it measured would
     * not be what the rows give. */
    static const char *const overrides[] = {"CLATTN_PARAMS", "CLATTN_MATMUL",
                                            "CLATTN_LOOP_TRIP_LIMIT"};
    for (size_t i = 0; i < sizeof overrides / sizeof overrides[0]; ++i) {
        const char *set = getenv(overrides[i]);
        if (set && set[0])
            return cli_fail("tune", CLI_BAD_INPUT,
                            "%s=%s overrides the tuning rows: unset it to tune", overrides[i], set);
    }
    if (o.out && !cli_check_output_ex("tune", "--out", o.out, true))
        return CLI_BAD_INPUT;
    /* --quick measures at toy sizes: its rows must not reach the cache every context reads. */
    const bool quick_to_cache = o.quick && !o.out && !o.dry_run;
    char path[1024];
    if (o.out)
        snprintf(path, sizeof path, "%s", o.out);
    else if (!default_cache_path(path, sizeof path) && !o.dry_run)
        return cli_fail("tune", CLI_BAD_INPUT,
                        "neither XDG_CACHE_HOME (absolute) nor HOME is set: give --out FILE");

    tune_state s = {.options = &o};
    clattn_ctx *ctx = NULL;
    char message[1024] = "";
    clattn_status status = tune_context(&s, NULL, &ctx, message, sizeof message);
    if (status != CLATTN_SUCCESS)
        return cli_context_failure("tune", o.exec.device, status, message);
    cl_device_type type = 0;
    cl_device_id device = clattn_ctx_device(ctx);
    cl_int err = clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(device, CL_DEVICE_VENDOR, sizeof s.vendor - 1, s.vendor, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof s.name - 1, s.name, NULL);
    const char *params = strstr(clattn_ctx_tuning(ctx), "parameters:");
    snprintf(s.base_params, sizeof s.base_params, "%s", params ? params + 11 : "");
    /* The rows carry the device's driver key (clattn_ctx_tuning's "driver key:" line, the name
     * first): the library applies them on this driver, platform and clattn version only. */
    const char *key = strstr(clattn_ctx_tuning(ctx), "\ndriver key: ");
    const char *fields = key ? strstr(key, " | driver ") : NULL;
    if (fields)
        snprintf(s.driver, sizeof s.driver, "%.*s", (int)strcspn(fields + 3, "\n"), fields + 3);
    clattn_ctx_release(ctx);
    if (s.driver[0] == '\0')
        return cli_fail("tune", CLI_FAILED,
                        "the library gave no driver key for the device (clattn_ctx_tuning)");
    if (err != CL_SUCCESS)
        return cli_fail("tune", CLI_FAILED, "clGetDeviceInfo: %d", (int)err);
    trim(s.vendor);
    trim(s.name);
    if (strpbrk(s.vendor, "|#\n") || strpbrk(s.name, "|#\n") || !s.vendor[0] || !s.name[0])
        return cli_fail("tune", CLI_FAILED,
                        "device '%s' of '%s': a name the tuning table cannot hold ('|', '#')",
                        s.name, s.vendor);
    s.cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
    for (size_t i = 0; i < num_keys; ++i)
        s.known[i] = param_value(s.base_params, tune_space[i].key, &s.base[i]);
    printf("device: %s (%s, %s)%s\n", s.name, s.vendor, s.cpu ? "CPU" : "GPU",
           o.quick ? ", --quick" : "");

    bool ops[sizeof tune_ops / sizeof tune_ops[0]];
    char added[8192] = "";
    int rc = CLI_OK;
    for (size_t i = 0; i < sizeof tune_ops / sizeof tune_ops[0] && rc == CLI_OK; ++i) {
        ops[i] = (strcmp(o.op, "all") == 0 || strcmp(o.op, tune_ops[i].name) == 0) &&
                 (s.cpu || !tune_ops[i].cpu_only);
        if (!ops[i])
            continue;
        char keys[512], comment[1024];
        rc = tune_op_search(&s, &tune_ops[i], keys, sizeof keys, comment, sizeof comment);
        const size_t used = strlen(added);
        if (rc == CLI_OK && keys[0])
            snprintf(added + used, sizeof added - used, "%s\n%s | %s | %s | %s | %s%s%s\n",
                     comment, s.cpu ? "cpu" : "gpu", s.vendor, s.name, s.driver,
                     op_select(&tune_ops[i]), tune_ops[i].select ? " " : "", keys);
    }
    if (rc != CLI_OK)
        return rc;
    if (o.dry_run) {
        printf("\nrows (--dry-run: nothing written):\n%s", added[0] ? added : "none\n");
        return CLI_OK;
    }
    if (quick_to_cache) {
        printf("\nrows (--quick, measured at toy sizes: not written to the tuning cache %s; "
               "--out FILE keeps them, a full `clattn tune` writes the cache):\n%s",
               path, added[0] ? added : "none\n");
        return CLI_OK;
    }
    rc = write_rows(&s, path, ops, added);
    if (rc == CLI_OK)
        printf("\n%s: %s", path, added[0] ? "rows written:\n" : "no row (the defaults won)\n");
    if (rc == CLI_OK)
        fputs(added, stdout);
    return rc;
}
