/*
 * soak: many MHA forwards of mixed shapes in ONE process on ONE context (host API), checking the
 * outputs against the float64 reference and that resident memory stays flat.
 *
 *   soak [--forwards N] [--check-every K] [--seed S]
 *
 * N forwards (default 10000) cycle through 13 shapes (batch 1..3, seq 1..129 with Lq != Lk,
 * embed 8..64, heads 1..8, packed and separate weights, both layouts, masks, fused and unfused
 * paths, need_weights NONE / PER_HEAD / AVERAGED). Inputs are redrawn before every forward and
 * outputs poisoned with NaN; every output must come back finite. The whole first cycle and then
 * every K-th forward (default 50) are compared with the reference (13 is prime, so any K that is
 * not a multiple of 13 visits every shape). RSS (VmRSS of /proc/self/status) is printed after
 * the first cycle, when every kernel is built and the workspace has reached its largest size,
 * every 1000 forwards and at the end.
 *
 * RSS is meaningful in a plain build only: under AddressSanitizer its quarantine of freed memory
 * makes RSS climb (run with ASAN_OPTIONS=quarantine_size_mb=0 to soak a sanitizer build).
 *
 * Exit status: 0 passed; 1 a forward failed, a check failed, or RSS grew by more than
 * 10% + 16 MiB from the end of the first cycle to the end; 2 bad arguments; 77 no device.
 *
 * Build (from the repository root, after building the library in build/):
 *   gcc -std=c11 -O2 -Iinclude -Itests bench/soak.c tests/reference.c -Lbuild -lclattn \
 *       -Wl,-rpath,$PWD/build -lOpenCL -lm -o soak
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clattn.h"
#include "reference.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

#define SOAK_TOL 1e-4                        /* relative error bound, as the unit tests' TU_TOL */
#define REPORT_EVERY 1000                    /* forwards between RSS lines */
#define RSS_GROWTH_FRACTION 0.10             /* allowed growth: 10% of the post-warm-up RSS ... */
#define RSS_GROWTH_SLACK_KIB (16.0 * 1024.0) /* ... plus 16 MiB */
#define MAX_REPORTED_FAILURES 20

typedef struct soak_shape {
    size_t batch, seq_q, seq_k, embed_dim, num_heads;
    size_t kdim, vdim; /* 0: embed_dim */
    clattn_weight_layout layout;
    int packed; /* in_proj_weight (TORCH layout, kdim = vdim = embed_dim) */
    int self;   /* key = value = query (passed as NULL); seq_k is then seq_q */
    int biases, out_proj;
    clattn_need_weights need_weights;
    clattn_path path;
    int causal, attn_mask, padding;
    clattn_norm norm;
} soak_shape;

#define XW CLATTN_LAYOUT_XW
#define TORCH CLATTN_LAYOUT_TORCH
#define NONE CLATTN_WEIGHTS_NONE
#define PER_HEAD CLATTN_WEIGHTS_PER_HEAD
#define AVERAGED CLATTN_WEIGHTS_AVERAGED
#define AUTO CLATTN_PATH_AUTO
#define FUSED CLATTN_PATH_FUSED
#define UNFUSED CLATTN_PATH_UNFUSED
#define SOFTMAX CLATTN_NORM_SOFTMAX
#define RELU CLATTN_NORM_RELU

/* NONE + AUTO or FUSED runs the fused kernel; PER_HEAD, AVERAGED or UNFUSED the unfused path.
 * The largest unfused shape (the last) comes last in the cycle, so the workspace is at its
 * largest when the first cycle ends. */
/* clang-format off */
static const soak_shape shapes[] = {
    /* batch seq_q seq_k E H kdim vdim layout packed self biases out_proj need_weights path
       causal attn_mask padding norm */
    {1, 1, 1, 8, 1, 0, 0, TORCH, 1, 1, 1, 1, NONE, AUTO, 0, 0, 0, SOFTMAX},
    {2, 17, 17, 32, 4, 0, 0, TORCH, 1, 1, 1, 1, PER_HEAD, AUTO, 1, 0, 0, SOFTMAX},
    {3, 129, 129, 64, 8, 0, 0, TORCH, 1, 1, 1, 1, NONE, AUTO, 1, 0, 1, SOFTMAX},
    {1, 5, 129, 16, 2, 12, 20, TORCH, 0, 0, 1, 1, AVERAGED, AUTO, 0, 1, 0, SOFTMAX},
    {2, 129, 7, 48, 6, 0, 0, TORCH, 1, 0, 1, 1, NONE, UNFUSED, 0, 0, 1, SOFTMAX},
    {3, 33, 65, 40, 5, 24, 40, XW, 0, 0, 0, 1, PER_HEAD, AUTO, 1, 1, 1, SOFTMAX},
    {1, 100, 100, 24, 3, 0, 0, XW, 0, 1, 1, 0, NONE, FUSED, 0, 1, 0, SOFTMAX},
    {2, 9, 31, 8, 8, 0, 0, TORCH, 1, 0, 1, 1, AVERAGED, AUTO, 1, 0, 0, SOFTMAX},
    {3, 129, 64, 64, 4, 33, 17, TORCH, 0, 0, 1, 1, NONE, AUTO, 0, 0, 1, RELU},
    {1, 77, 77, 56, 7, 0, 0, TORCH, 1, 1, 0, 1, AVERAGED, UNFUSED, 1, 1, 0, SOFTMAX},
    {2, 3, 2, 12, 3, 5, 7, XW, 0, 0, 1, 1, NONE, AUTO, 0, 0, 0, SOFTMAX},
    {3, 64, 1, 32, 2, 0, 0, TORCH, 1, 0, 1, 1, NONE, FUSED, 0, 1, 1, SOFTMAX},
    {3, 129, 129, 64, 8, 0, 0, TORCH, 1, 1, 1, 1, PER_HEAD, AUTO, 0, 0, 1, SOFTMAX},
};
/* clang-format on */

/* --- random numbers (splitmix64) ---------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t soak_seed; /* printed with every failure */

static uint64_t rand_u64(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static float rand_uniform(float low, float high)
{
    float value = (float)(low + (high - low) * ((double)(rand_u64() >> 11) * 0x1.0p-53));
    return value < high ? value : low;
}

static void fill_uniform(float *values, size_t count, float low, float high)
{
    for (size_t i = 0; i < count; ++i) {
        values[i] = rand_uniform(low, high);
    }
}

/* --- host memory --------------------------------------------------------------------------- */

static void *checked_calloc(size_t count, size_t size)
{
    void *memory = calloc(count ? count : 1, size);
    if (memory == NULL) {
        fprintf(stderr, "soak: out of host memory (%zu x %zu bytes)\n", count, size);
        exit(1);
    }
    return memory;
}

static float *random_floats(size_t count, float scale)
{
    float *values = checked_calloc(count, sizeof(float));
    fill_uniform(values, count, -scale, scale);
    return values;
}

/* --- one shape's data ---------------------------------------------------------------------- */

enum param {
    PARAM_IN_PROJ,
    PARAM_IN_BIAS,
    PARAM_Q,
    PARAM_K,
    PARAM_V,
    PARAM_Q_BIAS,
    PARAM_K_BIAS,
    PARAM_V_BIAS,
    PARAM_OUT,
    PARAM_OUT_BIAS,
    PARAM_COUNT
};

typedef struct soak_job {
    const soak_shape *shape;
    clattn_mha_desc desc;
    float *params[PARAM_COUNT]; /* NULL where absent */
    clattn_mha_host_weights weights;
    float *query, *key, *value; /* key and value NULL for self-attention */
    size_t query_count, key_count, value_count;
    float *attn_mask;
    uint8_t *padding;
    clattn_host_masks masks;
    float *out, *attn;
    size_t out_count, attn_count; /* attn_count 0 for NONE */
    double *out_ref, *attn_ref;
} soak_job;

static void describe(const soak_job *job, char *text, size_t size)
{
    static const char *const weight_modes[] = {"none", "per_head", "averaged"};
    static const char *const paths[] = {"auto", "fused", "unfused"};
    const soak_shape *s = job->shape;
    snprintf(text, size,
             "batch=%zu seq_q=%zu seq_k=%zu E=%zu H=%zu kdim=%zu vdim=%zu %s %s %s "
             "need_weights=%s path=%s causal=%d attn_mask=%d padding=%d norm=%s",
             s->batch, s->seq_q, job->desc.seq_k, s->embed_dim, s->num_heads,
             ref_mha_kdim(&job->desc), ref_mha_vdim(&job->desc), s->layout == XW ? "xw" : "torch",
             s->packed ? "packed" : "separate", s->self ? "self" : "cross",
             weight_modes[s->need_weights], paths[s->path], s->causal, s->attn_mask, s->padding,
             s->norm == RELU ? "relu" : "softmax");
}

static void make_job(const soak_shape *shape, soak_job *job)
{
    memset(job, 0, sizeof *job);
    job->shape = shape;
    const size_t embed = shape->embed_dim;
    const size_t seq_k = shape->self ? shape->seq_q : shape->seq_k;
    clattn_mha_desc desc = {
        .batch = shape->batch,
        .seq_q = shape->seq_q,
        .seq_k = seq_k,
        .embed_dim = embed,
        .num_heads = shape->num_heads,
        .kdim = shape->kdim,
        .vdim = shape->vdim,
        .layout = shape->layout,
        .norm = shape->norm,
        .need_weights = shape->need_weights,
        .path = shape->path,
    };
    job->desc = desc;
    const size_t kdim = ref_mha_kdim(&desc), vdim = ref_mha_vdim(&desc);

    /* Parameters scaled by 1.5/sqrt(fan_in) keep every projection O(1). */
    const float scale_e = 1.5f / sqrtf((float)embed);
    if (shape->packed) {
        job->params[PARAM_IN_PROJ] = random_floats(3 * embed * embed, scale_e);
        job->params[PARAM_IN_BIAS] = shape->biases ? random_floats(3 * embed, scale_e) : NULL;
    } else {
        job->params[PARAM_Q] = random_floats(embed * embed, scale_e);
        job->params[PARAM_K] = random_floats(kdim * embed, 1.5f / sqrtf((float)kdim));
        job->params[PARAM_V] = random_floats(vdim * embed, 1.5f / sqrtf((float)vdim));
        if (shape->biases) {
            job->params[PARAM_Q_BIAS] = random_floats(embed, scale_e);
            job->params[PARAM_K_BIAS] = random_floats(embed, scale_e);
            job->params[PARAM_V_BIAS] = random_floats(embed, scale_e);
        }
    }
    if (shape->out_proj) {
        job->params[PARAM_OUT] = random_floats(embed * embed, scale_e);
        job->params[PARAM_OUT_BIAS] = shape->biases ? random_floats(embed, scale_e) : NULL;
    }
    clattn_mha_host_weights weights = {
        .in_proj_weight = job->params[PARAM_IN_PROJ],
        .in_proj_bias = job->params[PARAM_IN_BIAS],
        .q_weight = job->params[PARAM_Q],
        .k_weight = job->params[PARAM_K],
        .v_weight = job->params[PARAM_V],
        .q_bias = job->params[PARAM_Q_BIAS],
        .k_bias = job->params[PARAM_K_BIAS],
        .v_bias = job->params[PARAM_V_BIAS],
        .out_weight = job->params[PARAM_OUT],
        .out_bias = job->params[PARAM_OUT_BIAS],
    };
    job->weights = weights;

    job->query_count = shape->batch * shape->seq_q * embed;
    job->query = random_floats(job->query_count, 1.0f);
    if (!shape->self) {
        job->key_count = shape->batch * seq_k * kdim;
        job->value_count = shape->batch * seq_k * vdim;
        job->key = random_floats(job->key_count, 1.0f);
        job->value = random_floats(job->value_count, 1.0f);
    }
    if (shape->attn_mask) {
        const size_t count = shape->seq_q * seq_k;
        job->attn_mask = random_floats(count, 1.0f);
        for (size_t i = 0; i < count; ++i) {
            if (rand_u64() % 4 == 0) {
                job->attn_mask[i] = -INFINITY;
            }
        }
    }
    if (shape->padding) {
        job->padding = checked_calloc(shape->batch * seq_k, 1);
        for (size_t i = 1; i < shape->batch * seq_k; ++i) {
            job->padding[i] = rand_u64() % 4 == 0;
        }
        if (shape->batch > 2) {
            memset(job->padding + 2 * seq_k, 1, seq_k); /* entry 2: every key masked */
        }
    }
    clattn_host_masks masks = {shape->causal, job->attn_mask, job->padding};
    job->masks = masks;

    job->out_count = shape->batch * shape->seq_q * ref_mha_out_dim(&desc, shape->out_proj);
    if (shape->need_weights != NONE) {
        job->attn_count = shape->batch * shape->seq_q * seq_k *
                          (shape->need_weights == PER_HEAD ? shape->num_heads : 1);
    }
    job->out = checked_calloc(job->out_count, sizeof(float));
    job->attn = job->attn_count ? checked_calloc(job->attn_count, sizeof(float)) : NULL;
    job->out_ref = checked_calloc(job->out_count, sizeof(double));
    job->attn_ref = job->attn_count ? checked_calloc(job->attn_count, sizeof(double)) : NULL;
}

static void free_job(soak_job *job)
{
    free(job->attn_ref);
    free(job->out_ref);
    free(job->attn);
    free(job->out);
    free(job->padding);
    free(job->attn_mask);
    free(job->value);
    free(job->key);
    free(job->query);
    for (int i = 0; i < PARAM_COUNT; ++i) {
        free(job->params[i]);
    }
}

/* --- checks -------------------------------------------------------------------------------- */

/* max |got - ref| / max |ref| over the finite references; INFINITY when got is not finite. */
static double rel_error(const float *got, const double *ref, size_t count)
{
    double max_diff = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < count; ++i) {
        if (!isfinite(ref[i])) {
            continue;
        }
        if (!isfinite(got[i])) {
            return INFINITY;
        }
        const double diff = fabs((double)got[i] - ref[i]);
        max_diff = diff > max_diff ? diff : max_diff;
        max_ref = fabs(ref[i]) > max_ref ? fabs(ref[i]) : max_ref;
    }
    return max_diff / (max_ref > 1e-30 ? max_ref : 1e-30);
}

static size_t first_non_finite(const float *values, size_t count)
{
    for (size_t i = 0; i < count; ++i) {
        if (!isfinite(values[i])) {
            return i;
        }
    }
    return count;
}

typedef struct soak_stats {
    long failures;
    long checks;
    double worst_error;
} soak_stats;

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static void
report_failure(soak_stats *stats, long forward, const soak_job *job, const char *format, ...)
{
    ++stats->failures;
    if (stats->failures > MAX_REPORTED_FAILURES) {
        return;
    }
    char shape[320];
    describe(job, shape, sizeof shape);
    fprintf(stderr, "soak: FAIL forward %ld (seed %" PRIu64 "): ", forward, soak_seed);
    va_list args;
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fprintf(stderr, " [%s]\n", shape);
}

/* One forward: fresh inputs, NaN-poisoned outputs, finite check, reference when `check`. */
static void run_forward(clattn_ctx *ctx, soak_job *job, long forward, int check, soak_stats *stats)
{
    fill_uniform(job->query, job->query_count, -1.0f, 1.0f);
    if (job->key != NULL) {
        fill_uniform(job->key, job->key_count, -1.0f, 1.0f);
        fill_uniform(job->value, job->value_count, -1.0f, 1.0f);
    }
    for (size_t i = 0; i < job->out_count; ++i) {
        job->out[i] = NAN;
    }
    for (size_t i = 0; i < job->attn_count; ++i) {
        job->attn[i] = NAN;
    }
    clattn_status status =
        clattn_mha_forward_host(ctx, &job->desc, &job->weights, job->query, job->key, job->value,
                                &job->masks, job->out, job->attn);
    if (status != CLATTN_SUCCESS) {
        report_failure(stats, forward, job, "clattn_mha_forward_host: %s (%d): %s",
                       clattn_status_string(status), (int)status, clattn_last_error(ctx));
        return;
    }
    size_t bad = first_non_finite(job->out, job->out_count);
    if (bad < job->out_count) {
        report_failure(stats, forward, job, "out[%zu] is %g (not finite)", bad,
                       (double)job->out[bad]);
        return;
    }
    if (!check) {
        return;
    }
    ++stats->checks;
    ref_mha_forward(&job->desc, &job->weights, job->query, job->key, job->value, &job->masks,
                    job->out_ref, job->attn_ref);
    const double out_error = rel_error(job->out, job->out_ref, job->out_count);
    const double attn_error =
        job->attn_count ? rel_error(job->attn, job->attn_ref, job->attn_count) : 0.0;
    const double error = out_error > attn_error ? out_error : attn_error;
    if (!(error <= stats->worst_error)) {
        stats->worst_error = error;
    }
    if (!(out_error <= SOAK_TOL)) {
        report_failure(stats, forward, job, "out: relative error %.3g", out_error);
    }
    if (!(attn_error <= SOAK_TOL)) {
        report_failure(stats, forward, job, "attn_weights: relative error %.3g", attn_error);
    }
}

/* --- memory and time ----------------------------------------------------------------------- */

/* Current resident set (VmRSS) in KiB, or -1. */
static long rss_kib(void)
{
    FILE *file = fopen("/proc/self/status", "r");
    if (file == NULL) {
        return -1;
    }
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, file) != NULL) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kib = strtol(line + 6, NULL, 10);
            break;
        }
    }
    fclose(file);
    return kib;
}

static double mib(double kib)
{
    return kib / 1024.0;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --- arguments ----------------------------------------------------------------------------- */

static int parse_count(const char *text, unsigned long long minimum, unsigned long long *value)
{
    char *end = NULL;
    errno = 0;
    if (text == NULL || text[0] == '-') {
        return 0;
    }
    *value = strtoull(text, &end, 0);
    return errno == 0 && end != text && *end == '\0' && *value >= minimum;
}

static int parse_arguments(int argc, char **argv, long *forwards, long *check_every, uint64_t *seed)
{
    /* Every option takes a value: options sit at odd indices. */
    for (int i = 1; i < argc; i += 2) {
        unsigned long long value = 0;
        const char *option = argv[i];
        const char *text = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(option, "--forwards") == 0 && parse_count(text, 1, &value) &&
            value <= 1000000000ULL) {
            *forwards = (long)value;
        } else if (strcmp(option, "--check-every") == 0 && parse_count(text, 1, &value) &&
                   value <= 1000000000ULL) {
            *check_every = (long)value;
        } else if (strcmp(option, "--seed") == 0 && parse_count(text, 0, &value)) {
            *seed = (uint64_t)value;
        } else {
            fprintf(stderr,
                    "usage: soak [--forwards N] [--check-every K] [--seed S]\n"
                    "  N forwards (default 10000, >= 1), checked against the float64 reference\n"
                    "  every K-th (default 50, >= 1); bad or missing value for '%s'\n",
                    option);
            return 0;
        }
    }
    return 1;
}

/* --- main ---------------------------------------------------------------------------------- */

static void print_progress(long done, long forwards, long rss_start, double seconds, double rate,
                           size_t workspace)
{
    const long rss = rss_kib();
    printf("soak: %6ld/%ld forwards  RSS %.1f MiB (%+.1f MiB)  workspace %.2f MiB  "
           "%.0f forwards/s  %.1f s\n",
           done, forwards, mib((double)rss), mib((double)(rss - rss_start)),
           (double)workspace / 1048576.0, rate, seconds);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    long forwards = 10000, check_every = 50;
    uint64_t seed = (uint64_t)time(NULL);
    if (!parse_arguments(argc, argv, &forwards, &check_every, &seed)) {
        return 2;
    }
    rng_state = seed;
    soak_seed = seed;

    clattn_ctx *ctx = NULL;
    char message[512] = "";
    clattn_status status = clattn_ctx_create(NULL, &ctx, message, sizeof message);
    if (status != CLATTN_SUCCESS) {
        fprintf(stderr, "soak: clattn_ctx_create: %s: %s\n", clattn_status_string(status), message);
        return status == CLATTN_ERR_NO_DEVICE ? 77 : 1;
    }
    char device_name[256] = "?";
    clGetDeviceInfo(clattn_ctx_device(ctx), CL_DEVICE_NAME, sizeof device_name, device_name, NULL);
    device_name[sizeof device_name - 1] = '\0';

    const int shape_count = COUNT_OF(shapes);
    soak_job jobs[COUNT_OF(shapes)];
    for (int s = 0; s < shape_count; ++s) {
        make_job(&shapes[s], &jobs[s]);
    }
    printf("soak: device %s; %ld forwards over %d shapes, reference check every %ld (and the "
           "whole first cycle); seed %" PRIu64 " (rerun with --seed %" PRIu64 ")\n",
           device_name, forwards, shape_count, check_every, seed, seed);
    printf("soak: RSS before the first forward %.1f MiB\n", mib((double)rss_kib()));
    fflush(stdout);

    soak_stats stats = {0, 0, 0.0};
    const double start = now_seconds();
    double warm_time = start, report_time = start;
    long report_forward = 0;
    long rss_start = -1;
    size_t workspace_start = 0;
    for (long forward = 1; forward <= forwards; ++forward) {
        const int first_cycle = forward <= shape_count;
        const int check = first_cycle || forward % check_every == 0;
        run_forward(ctx, &jobs[(forward - 1) % shape_count], forward, check, &stats);
        const double now = now_seconds();
        if (forward == shape_count || (forward == forwards && rss_start < 0)) {
            rss_start = rss_kib();
            workspace_start = clattn_ctx_workspace_bytes(ctx);
            warm_time = now;
            printf("soak: start (after the first cycle of %ld forwards, %.2f s): RSS %.1f MiB, "
                   "workspace %.2f MiB\n",
                   forward, now - start, mib((double)rss_start),
                   (double)workspace_start / 1048576.0);
            fflush(stdout);
            report_time = now;
            report_forward = forward;
        } else if (forward % REPORT_EVERY == 0 || forward == forwards) {
            print_progress(forward, forwards, rss_start, now - start,
                           (double)(forward - report_forward) / (now - report_time),
                           clattn_ctx_workspace_bytes(ctx));
            report_time = now;
            report_forward = forward;
        }
    }
    const double end = now_seconds();
    const long rss_end = rss_kib();
    const size_t workspace_end = clattn_ctx_workspace_bytes(ctx);

    const double allowed_kib = RSS_GROWTH_FRACTION * (double)rss_start + RSS_GROWTH_SLACK_KIB;
    const double growth_kib = (double)(rss_end - rss_start);
    const int rss_ok = rss_start >= 0 && rss_end >= 0 && growth_kib <= allowed_kib;
    const long steady = forwards - (forwards < shape_count ? forwards : shape_count);
    printf("soak: end: %ld forwards in %.1f s (%.1f forwards/s overall, %.1f after warm-up)\n",
           forwards, end - start, (double)forwards / (end - start),
           steady > 0 && end > warm_time ? (double)steady / (end - warm_time) : 0.0);
    printf("soak: RSS start %.1f MiB, end %.1f MiB, growth %+.1f MiB (limit %.1f MiB); "
           "workspace start %.2f MiB, end %.2f MiB\n",
           mib((double)rss_start), mib((double)rss_end), mib(growth_kib), mib(allowed_kib),
           (double)workspace_start / 1048576.0, (double)workspace_end / 1048576.0);
    printf("soak: %ld reference checks, worst relative error %.2g (tolerance %.0e); "
           "%ld failure(s)\n",
           stats.checks, stats.worst_error, SOAK_TOL, stats.failures);
    if (!rss_ok) {
        printf("soak: FAIL: resident memory grew by %.1f MiB, more than %.1f MiB\n",
               mib(growth_kib), mib(allowed_kib));
    }
    const int passed = rss_ok && stats.failures == 0;
    printf("soak: %s\n", passed ? "PASS" : "FAIL");

    for (int s = 0; s < shape_count; ++s) {
        free_job(&jobs[s]);
    }
    clattn_ctx_release(ctx);
    return passed ? 0 : 1;
}
