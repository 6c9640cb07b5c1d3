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
 * Problems (parameters, inputs, masks, the float64 reference) come from tests/problems.h, the
 * builder the test suites share, drawing from this program's seeded generator.
 *
 * Build: the `soak` target, or from the repository root after building the library in build/:
 *   gcc -std=c11 -O2 -Iinclude -Itests bench/soak.c tests/reference.c tests/problems.c \
 *       -Lbuild -lclattn -Wl,-rpath,$PWD/build -lOpenCL -lm -o soak
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
#include "problems.h"
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

/* --- random numbers (splitmix64) and problems.h's hooks ------------------------------------- */

static uint64_t rng_state;
static uint64_t soak_seed; /* printed with every failure */

static uint64_t rand_u64(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static void problems_fail(const char *message)
{
    fprintf(stderr, "soak: FAIL (seed %" PRIu64 "): %s\n", soak_seed, message);
}

/* --- one shape's data ---------------------------------------------------------------------- */

typedef struct soak_job {
    pb_mha_problem problem; /* parameters, inputs, masks, reference (tests/problems.h) */
    float *out, *attn;
} soak_job;

static void make_job(const soak_shape *shape, soak_job *job)
{
    memset(job, 0, sizeof *job);
    pb_mha_spec spec;
    pb_mha_spec_init(&spec);
    spec.batch = shape->batch;
    spec.seq_q = shape->seq_q;
    spec.seq_k = shape->seq_k;
    spec.embed_dim = shape->embed_dim;
    spec.num_heads = shape->num_heads;
    spec.kdim = shape->kdim;
    spec.vdim = shape->vdim;
    spec.layout = shape->layout;
    spec.form = shape->packed ? (shape->self ? PB_PACKED_SELF : PB_PACKED_CROSS)
                              : (shape->self ? PB_SEPARATE_SELF : PB_SEPARATE_CROSS);
    spec.in_biases = shape->biases;
    spec.out_proj = shape->out_proj;
    spec.out_bias = shape->biases;
    spec.need_weights = shape->need_weights;
    spec.path = shape->path;
    spec.causal = shape->causal ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
    spec.mask = shape->attn_mask ? PB_MASK_FLOAT : PB_MASK_NONE;
    spec.padding = shape->padding;
    spec.norm = shape->norm;
    pb_mha_make(&job->problem, &spec);
    job->out = pb_nan_floats(job->problem.out_count);
    job->attn = job->problem.attn_count ? pb_nan_floats(job->problem.attn_count) : NULL;
}

static void free_job(soak_job *job)
{
    free(job->attn);
    free(job->out);
    pb_mha_free(&job->problem);
}

/* --- checks -------------------------------------------------------------------------------- */

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
    fprintf(stderr, "soak: FAIL forward %ld (seed %" PRIu64 "): ", forward, soak_seed);
    va_list args;
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fprintf(stderr, " [%s]\n", job->problem.label);
}

/* One forward: fresh inputs, NaN-poisoned outputs, finite check, reference when `check`. */
static void run_forward(clattn_ctx *ctx, soak_job *job, long forward, int check, soak_stats *stats)
{
    pb_mha_problem *p = &job->problem;
    pb_mha_redraw_inputs(p);
    for (size_t i = 0; i < p->out_count; ++i) {
        job->out[i] = NAN;
    }
    for (size_t i = 0; i < p->attn_count; ++i) {
        job->attn[i] = NAN;
    }
    clattn_status status = clattn_mha_forward_host(ctx, &p->desc, &p->weights, p->query, p->key,
                                                   p->value, &p->masks, job->out, job->attn);
    if (status != CLATTN_SUCCESS) {
        report_failure(stats, forward, job, "clattn_mha_forward_host: %s (%d): %s",
                       clattn_status_string(status), (int)status, clattn_last_error(ctx));
        return;
    }
    size_t bad = first_non_finite(job->out, p->out_count);
    if (bad < p->out_count) {
        report_failure(stats, forward, job, "out[%zu] is %g (not finite)", bad,
                       (double)job->out[bad]);
        return;
    }
    if (!check) {
        return;
    }
    ++stats->checks;
    pb_mha_reference(p);
    const double out_error = pb_rel_error(job->out, p->out_ref, p->out_count);
    const double attn_error =
        p->attn_count ? pb_rel_error(job->attn, p->attn_ref, p->attn_count) : 0.0;
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
    const pb_hooks hooks = {rand_u64, problems_fail, NULL};
    pb_set_hooks(&hooks);

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
