#define _POSIX_C_SOURCE 200809L

#include "testutil.h"

#include "problems.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Only the suite's own bookkeeping lives here; each suite is a single-threaded process. */
static const char *suite_name_ = "check";
static uint64_t suite_seed_;
static uint64_t rng_state_;
static char test_name_[128];
static int test_index_;
static char case_label_[256];
static char where_[512];

static int failure_count_;
static char failure_text_[8192];

static double worst_error_;
static size_t comparison_count_;

static clattn_ctx *shared_ctx_;

/* --- random numbers (splitmix64) ---------------------------------------------------------- */

uint64_t tu_rand_u64(void)
{
    return pb_splitmix64(&rng_state_);
}

double tu_rand_unit(void)
{
    return (double)(tu_rand_u64() >> 11) * 0x1.0p-53;
}

size_t tu_rand_below(size_t bound)
{
    return (size_t)(tu_rand_u64() % (uint64_t)bound);
}

void tu_fill_uniform(float *values, size_t count, float low, float high)
{
    pb_fill_uniform_from(tu_rand_unit, values, count, low, high);
}

void tu_fill_nan(float *values, size_t count)
{
    for (size_t i = 0; i < count; ++i) {
        values[i] = NAN;
    }
}

static uint64_t seed_from_environment(void)
{
    const char *text = getenv("CLATTN_TEST_SEED");
    if (text != NULL && text[0] != '\0' && strcmp(text, "random") != 0) {
        char *end = NULL;
        errno = 0;
        unsigned long long value = strtoull(text, &end, 0);
        if (errno == 0 && end != NULL && *end == '\0') {
            return (uint64_t)value;
        }
        fprintf(stderr, "%s: ignoring unparsable CLATTN_TEST_SEED='%s'\n", suite_name_, text);
    }
    /* The default is fixed per suite (a hash of its name), so a failure in CI replays as is;
     * CLATTN_TEST_SEED=random draws a fresh one from the clock for exploratory runs. */
    uint64_t mix = UINT64_C(0xcbf29ce484222325);
    if (text != NULL && strcmp(text, "random") == 0) {
        mix ^= (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)clock();
    } else {
        for (const char *c = suite_name_; *c != '\0'; ++c)
            mix = (mix ^ (uint64_t)(unsigned char)*c) * UINT64_C(0x100000001b3);
    }
    return pb_splitmix64(&mix) % UINT64_C(1000000000000);
}

/* --- suite and test life cycle ------------------------------------------------------------ */

static void record_failure(const char *message);

void tu_suite_begin(const char *suite_name)
{
    suite_name_ = suite_name;
    suite_seed_ = seed_from_environment();
    rng_state_ = suite_seed_;
    printf("%s: seed %" PRIu64 " (rerun with CLATTN_TEST_SEED=%" PRIu64 ")\n", suite_name,
           suite_seed_, suite_seed_);
    fflush(stdout);
    /* problems.c draws from this generator and reports through this collector. */
    const pb_hooks hooks = {tu_rand_u64, record_failure, tu_track_error};
    pb_set_hooks(&hooks);
    (void)tu_ctx();
}

int tu_run_suite(Suite *suite)
{
    SRunner *runner = srunner_create(suite);
    /* The shared context lives in this process: a forked test child could not use it. */
    srunner_set_fork_status(runner, CK_NOFORK);
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    printf("%s: max relative error %.2g over %zu comparisons\n", suite_name_, worst_error_,
           comparison_count_);
    if (failed != 0) {
        printf("%s: %d test(s) failed; seed %" PRIu64 "\n", suite_name_, failed, suite_seed_);
    }
    tu_ctx_release();
    return failed == 0 ? 0 : 1;
}

int tu_main(const char *program, Suite *(*make_suite)(void))
{
    tu_suite_begin(program);
    return tu_run_suite(make_suite());
}

TCase *tu_tcase(Suite *suite, const char *name, double timeout)
{
    TCase *tcase = tcase_create(name);
    tcase_set_timeout(tcase, timeout);
    suite_add_tcase(suite, tcase);
    return tcase;
}

void tu_test_begin(const char *test_name, int loop_index)
{
    snprintf(test_name_, sizeof test_name_, "%s", test_name);
    test_index_ = loop_index;
    case_label_[0] = '\0';
    failure_count_ = 0;
    failure_text_[0] = '\0';

    /* Each test draws from its own stream, so one test can be replayed alone. */
    uint64_t state = suite_seed_;
    for (const char *c = test_name; *c != '\0'; ++c) {
        state ^= (uint64_t)(unsigned char)*c;
        (void)pb_splitmix64(&state);
    }
    state ^= (uint64_t)(uint32_t)loop_index * UINT64_C(0x100000001B3);
    rng_state_ = pb_splitmix64(&state);
}

void tu_set_case(const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(case_label_, sizeof case_label_, format, args);
    va_end(args);
}

const char *tu_where(void)
{
    snprintf(where_, sizeof where_, "seed=%" PRIu64 " test=%s i=%d case={%s}", suite_seed_,
             test_name_, test_index_, case_label_);
    return where_;
}

uint64_t tu_seed(void)
{
    return suite_seed_;
}

/* --- failure collector -------------------------------------------------------------------- */

static void record_failure(const char *message)
{
    ++failure_count_;
    /* Every failure goes to stderr as it happens; the check message keeps the first few. */
    if (failure_count_ <= 50) {
        fprintf(stderr, "%s: FAIL %s [%s]\n", suite_name_, message, tu_where());
    }
    size_t used = strlen(failure_text_);
    if (failure_count_ > 6) {
        if (failure_count_ == 7 && used + 32 < sizeof failure_text_) {
            snprintf(failure_text_ + used, sizeof failure_text_ - used, "\n  (more failures)");
        }
        return;
    }
    snprintf(failure_text_ + used, sizeof failure_text_ - used, "%s%s [%s]",
             used == 0 ? "" : "\n  ", message, tu_where());
}

int tu_expect(int ok, const char *format, ...)
{
    if (!ok) {
        char message[1024];
        va_list args;
        va_start(args, format);
        vsnprintf(message, sizeof message, format, args);
        va_end(args);
        record_failure(message);
    }
    return ok;
}

int tu_expect_status(clattn_status got, clattn_status want, const char *call)
{
    return tu_expect(got == want, "%s returned %s (%d), expected %s; last error: '%s'", call,
                     clattn_status_string(got), (int)got, clattn_status_string(want),
                     clattn_last_error(shared_ctx_));
}

void tu_expect_trusted(clattn_ctx *ctx, size_t *seen)
{
    const size_t n = ctx ? clattn_ctx_validations(ctx, NULL, 0) : 0;
    clattn_validation *log = n > *seen ? calloc(n, sizeof *log) : NULL;
    const size_t got = log ? clattn_ctx_validations(ctx, log, n) : 0;
    for (size_t i = *seen; i < got && i < n; ++i)
        tu_expect(log[i].result != CLATTN_CHECK_FAILED,
                  "kernel variant %s failed self-validation (%s): the numbers came from its "
                  "fallback",
                  log[i].variant, log[i].detail);
    free(log);
    if (n > *seen)
        *seen = n;
}

void tu_expect_refused(clattn_status got, const clattn_plan *plan, clattn_status want,
                       const char *kind, const char *needle, const char *call)
{
    tu_expect_status(got, want, call);
    tu_expect(plan == NULL, "%s: *out not NULL after a refusal", call);
    const char *message = clattn_last_error(tu_ctx());
    tu_expect(strstr(message, needle) != NULL && strstr(message, kind) != NULL,
              "%s: the message '%s' does not name '%s'", call, message, needle);
}

double tu_rel_error(const float *got, const double *ref, size_t count)
{
    double max_ref = 0.0;
    double max_diff = 0.0;
    for (size_t i = 0; i < count; ++i) {
        if (!isfinite(ref[i])) {
            continue;
        }
        if (!isfinite(got[i])) {
            return INFINITY;
        }
        double diff = fabs((double)got[i] - ref[i]);
        max_diff = diff > max_diff ? diff : max_diff;
        max_ref = fabs(ref[i]) > max_ref ? fabs(ref[i]) : max_ref;
    }
    return max_diff / (max_ref > 1e-30 ? max_ref : 1e-30);
}

double tu_abs_error(const float *got, const double *ref, size_t count)
{
    double max_diff = 0.0;
    for (size_t i = 0; i < count; ++i) {
        if (!isfinite(got[i])) {
            return INFINITY;
        }
        double diff = fabs((double)got[i] - ref[i]);
        max_diff = diff > max_diff ? diff : max_diff;
    }
    return max_diff;
}

void tu_track_error(double err)
{
    ++comparison_count_;
    if (err > worst_error_ || isnan(err)) {
        worst_error_ = err;
    }
}

void tu_expect_close_scaled(const char *what, const float *got, const double *ref, size_t count,
                            double scale, double tol)
{
    double largest = scale, worst = 0.0;
    for (size_t i = 0; i < count; ++i) {
        largest = fmax(largest, fabs(ref[i]));
    }
    for (size_t i = 0; i < count; ++i) {
        worst = isfinite(got[i]) ? fmax(worst, fabs((double)got[i] - ref[i])) : INFINITY;
    }
    const double err = worst / fmax(largest, 1e-30);
    tu_track_error(err);
    tu_expect(err <= tol, "%s: error %g > %g (max |difference| %g, scale %g)", what, err, tol,
              worst, largest);
}

double tu_expect_close(const char *what, const float *got, const double *ref, size_t count,
                       double tol)
{
    double err = tu_rel_error(got, ref, count);
    tu_track_error(err);
    if (!(err <= tol)) {
        size_t worst = 0;
        double worst_diff = -1.0;
        for (size_t i = 0; i < count; ++i) {
            double diff = isfinite(got[i]) ? fabs((double)got[i] - ref[i]) : INFINITY;
            if (isfinite(ref[i]) && diff > worst_diff) {
                worst_diff = diff;
                worst = i;
            }
        }
        tu_expect(0, "%s: relative error %.3g > %.1g (worst at [%zu]: got %.9g, want %.9g)", what,
                  err, tol, worst, count ? (double)got[worst] : 0.0, count ? ref[worst] : 0.0);
    }
    return err;
}

int tu_expect_nan_outside(const char *what, const float *buffer, size_t total, size_t offset,
                          size_t count)
{
    for (size_t i = 0; i < total; ++i) {
        if ((i < offset || i >= offset + count) && !isnan(buffer[i])) {
            return tu_expect(0, "%s: element %zu outside the tensor [%zu, %zu) was written (%g)",
                             what, i, offset, offset + count, (double)buffer[i]);
        }
    }
    return 1;
}

int tu_expect_finite(const char *what, const float *values, size_t count)
{
    for (size_t i = 0; i < count; ++i) {
        if (!isfinite(values[i])) {
            return tu_expect(0, "%s: element %zu is %g", what, i, (double)values[i]);
        }
    }
    return 1;
}

int tu_failed(void)
{
    return failure_count_ != 0;
}

const char *tu_failure_text(void)
{
    return failure_text_;
}

/* --- host memory -------------------------------------------------------------------------- */

static void *checked_calloc(size_t count, size_t size)
{
    void *memory = calloc(count ? count : 1, size);
    if (memory == NULL) {
        ck_abort_msg("out of host memory (%zu x %zu bytes) [%s]", count, size, tu_where());
    }
    return memory;
}

float *tu_floats(size_t count)
{
    return checked_calloc(count, sizeof(float));
}

float *tu_random_floats(size_t count)
{
    float *values = tu_floats(count);
    tu_fill_uniform(values, count, -1.0f, 1.0f);
    return values;
}

float *tu_nan_floats(size_t count)
{
    float *values = tu_floats(count);
    tu_fill_nan(values, count);
    return values;
}

double *tu_doubles(size_t count)
{
    return checked_calloc(count, sizeof(double));
}

uint8_t *tu_bytes(size_t count)
{
    return checked_calloc(count, 1);
}

float *tu_copy_floats(const float *values, size_t count)
{
    float *copy = tu_floats(count);
    memcpy(copy, values, count * sizeof(float));
    return copy;
}

/* --- device ------------------------------------------------------------------------------- */

clattn_ctx *tu_ctx(void)
{
    if (shared_ctx_ != NULL) {
        return shared_ctx_;
    }
    char message[1024] = "";
    clattn_status status = clattn_ctx_create(NULL, &shared_ctx_, message, sizeof message);
    if (status == CLATTN_ERR_NO_DEVICE) {
        /* Under CI a missing device is a broken machine, not a reason to report green. */
        const char *ci = getenv("CI");
        const int in_ci = ci != NULL && strcmp(ci, "true") == 0;
        printf("%s: %s: NO OPENCL DEVICE (CLATTN_DEVICE='%s'): %s\n", suite_name_,
               in_ci ? "FAILED under CI=true" : "SKIPPED, nothing was tested",
               getenv("CLATTN_DEVICE") ? getenv("CLATTN_DEVICE") : "", message);
        fprintf(stderr, "%s: no OpenCL device: this suite ran NO test\n", suite_name_);
        exit(in_ci ? 1 : 77);
    }
    if (status != CLATTN_SUCCESS || shared_ctx_ == NULL) {
        printf("%s: clattn_ctx_create failed: %s (%d): %s\n", suite_name_,
               clattn_status_string(status), (int)status, message);
        exit(1);
    }
    cl_device_id device = clattn_ctx_device(shared_ctx_);
    char device_name[256] = "?";
    clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof device_name, device_name, NULL);
    device_name[sizeof device_name - 1] = '\0';
    printf("%s: device %s\n", suite_name_, device_name);
    fflush(stdout);
    return shared_ctx_;
}

void tu_ctx_release(void)
{
    clattn_ctx_release(shared_ctx_);
    shared_ctx_ = NULL;
}

static cl_mem create_buffer(size_t bytes, const void *initial)
{
    cl_int err = CL_SUCCESS;
    cl_mem_flags flags = CL_MEM_READ_WRITE | (initial != NULL ? CL_MEM_COPY_HOST_PTR : 0);
    cl_mem mem = clCreateBuffer(clattn_ctx_cl_context(tu_ctx()), flags, bytes ? bytes : 4,
                                (void *)initial, &err);
    if (err != CL_SUCCESS || mem == NULL) {
        ck_abort_msg("clCreateBuffer(%zu bytes) failed: %s [%s]", bytes,
                     clattn_status_string((clattn_status)err), tu_where());
    }
    return mem;
}

cl_mem tu_upload_padded(const float *values, size_t count, size_t pad_before, size_t pad_after)
{
    size_t total = pad_before + count + pad_after;
    float *staging = tu_nan_floats(total);
    memcpy(staging + pad_before, values, count * sizeof(float));
    cl_mem mem = create_buffer(total * sizeof(float), staging);
    free(staging);
    return mem;
}

cl_mem tu_upload_floats(const float *values, size_t count)
{
    return create_buffer(count * sizeof(float), values);
}

cl_mem tu_upload_bytes(const void *bytes, size_t count)
{
    return create_buffer(count, bytes);
}

cl_mem tu_nan_buffer(size_t count)
{
    float *staging = tu_nan_floats(count);
    cl_mem mem = create_buffer(count * sizeof(float), staging);
    free(staging);
    return mem;
}

/* One blocking transfer of count floats at offset (after a finish): a write from src when it is
 * set, else a read into dst; aborts the test on either failure. */
static void transfer_floats(cl_mem mem, size_t offset, size_t count, const float *src, float *dst)
{
    const int write = src != NULL;
    clattn_ctx *ctx = tu_ctx();
    clattn_status status = clattn_finish(ctx);
    const size_t at = offset * sizeof(float), bytes = count * sizeof(float);
    cl_command_queue queue = clattn_ctx_queue(ctx);
    cl_int err = write ? clEnqueueWriteBuffer(queue, mem, CL_TRUE, at, bytes, src, 0, NULL, NULL)
                       : clEnqueueReadBuffer(queue, mem, CL_TRUE, at, bytes, dst, 0, NULL, NULL);
    if (status != CLATTN_SUCCESS || err != CL_SUCCESS) {
        const char *what = write ? "write" : "read";
        ck_abort_msg("%s of %zu floats failed: finish %s, %s %s [%s]", what, count,
                     clattn_status_string(status), what, clattn_status_string((clattn_status)err),
                     tu_where());
    }
}

void tu_write_floats(cl_mem mem, size_t offset, const float *values, size_t count)
{
    transfer_floats(mem, offset, count, values, NULL);
}

void tu_read_floats(cl_mem mem, size_t offset, size_t count, float *dst)
{
    transfer_floats(mem, offset, count, NULL, dst);
}

void tu_release_mem(cl_mem mem)
{
    if (mem != NULL) {
        clReleaseMemObject(mem);
    }
}

/* --- small conversions -------------------------------------------------------------------- */

void tu_floats_to_doubles(const float *src, size_t count, double *dst)
{
    for (size_t i = 0; i < count; ++i) {
        dst[i] = (double)src[i];
    }
}

static int is_identifier_char(char c)
{
    return isalnum((unsigned char)c) || c == '_';
}

int tu_mentions_word(const char *text, const char *word)
{
    size_t word_length = strlen(word);
    if (text == NULL || word_length == 0) {
        return 0;
    }
    for (const char *start = text; *start != '\0'; ++start) {
        if (start != text && is_identifier_char(start[-1])) {
            continue;
        }
        size_t i = 0;
        while (i < word_length && start[i] != '\0' &&
               tolower((unsigned char)start[i]) == tolower((unsigned char)word[i])) {
            ++i;
        }
        if (i == word_length && !is_identifier_char(start[word_length])) {
            return 1;
        }
    }
    return 0;
}

int tu_starts_with(const char *text, const char *prefix)
{
    return text != NULL && strncmp(text, prefix, strlen(prefix)) == 0;
}

cl_ulong tu_device_ulong(cl_device_info param)
{
    cl_ulong value = 0;
    if (clGetDeviceInfo(clattn_ctx_device(tu_ctx()), param, sizeof value, &value, NULL) !=
        CL_SUCCESS)
        return 0;
    return value;
}

int tu_device_has_fp64(void)
{
    cl_device_fp_config fp64 = 0;
    return clGetDeviceInfo(clattn_ctx_device(tu_ctx()), CL_DEVICE_DOUBLE_FP_CONFIG, sizeof fp64,
                           &fp64, NULL) == CL_SUCCESS &&
           fp64 != 0;
}

void tu_make_temp_dir(char *template)
{
    if (mkdtemp(template) == NULL)
        ck_abort_msg("mkdtemp %s failed: %s [%s]", template, strerror(errno), tu_where());
}

/* --- reduced runs ------------------------------------------------------------------------- */

int tu_small(void)
{
    const char *scale = getenv("CLATTN_TEST_SCALE");
    if (scale == NULL || scale[0] == '\0' || strcmp(scale, "full") == 0) {
        return 0;
    }
    if (strcmp(scale, "small") == 0) {
        return 1;
    }
    fprintf(stderr, "%s: ignoring unknown CLATTN_TEST_SCALE='%s' (small or full): running all\n",
            suite_name_, scale);
    return 0;
}

int tu_full(void)
{
    const char *scale = getenv("CLATTN_TEST_SCALE");
    return scale != NULL && strcmp(scale, "full") == 0;
}

void tu_not_run(const char *format, ...)
{
    char what[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(what, sizeof what, format, args);
    va_end(args);
    printf("%s: NOT RUN (CLATTN_TEST_SCALE=%s): %s\n", suite_name_,
           tu_small() ? "small" : "unset, the CI tier; =full runs them", what);
    fflush(stdout);
}

void tu_add_loop_except(TCase *tcase, const TTest *test, int start, int end, const int *skip,
                        int skip_count)
{
    for (int i = start; i < end; ++i) {
        int skipped = 0;
        for (int s = 0; s < skip_count; ++s) {
            skipped |= skip[s] == i;
        }
        if (!skipped) {
            tcase_add_loop_test(tcase, test, i, i + 1);
        }
    }
}

void tu_forward_again(clattn_ctx *ctx, clattn_plan *forward, clattn_tensors *bound,
                      const char *what)
{
    pb_rewrite(ctx, NULL, &bound->out, NULL);
    /* roles after the gradients' bound (a mask_mod's auxiliary tensors: the forward's too):
     * all roles, the gradients' absent; else the array cut before them */
    int later = 0;
    for (int r = CLATTN_ROLE_GRAD_SINKS + 1; r < CLATTN_ROLE_COUNT; ++r)
        later |= bound->by_role[r].rank != 0;
    clattn_tensors roles = *bound;
    for (int r = CLATTN_ROLE_GRAD_OUT; r <= CLATTN_ROLE_GRAD_SINKS; ++r)
        memset(&roles.by_role[r], 0, sizeof roles.by_role[r]);
    tu_expect_status(clattn_plan_execute(forward, roles.by_role,
                                         later ? CLATTN_ROLE_COUNT : CLATTN_ROLE_GRAD_OUT, NULL,
                                         NULL, 0, NULL, NULL),
                     CLATTN_SUCCESS, what);
}
