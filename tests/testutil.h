/*
 * Shared helpers of the clattn check suites: a seeded random generator, NaN poisoning, cl_mem
 * helpers on one shared context, error measurement against the float64 reference, and a
 * per-test failure collector.
 *
 * Reproducing a failure: every suite prints its seed at start and every failure message carries
 * it. Each test reseeds the generator from (suite seed, test name, loop index), so
 * `CLATTN_TEST_SEED=<seed> CK_RUN_CASE=<case> ./check_<unit>` replays the same inputs.
 *
 * tu_suite_begin also installs the hooks of tests/problems.h: the problem builders draw from
 * the per-test generator and report into the failure collector.
 *
 * Failures are collected (tu_expect*) rather than asserted at once, so a test can release what it
 * allocated before TU_END_TEST() turns the collected failures into one check failure. (With
 * CK_FORK=no a failing ck_assert leaves the test through longjmp and would leak.)
 */
#ifndef CLATTN_TESTUTIL_H
#define CLATTN_TESTUTIL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "clattn.h"

/* Relative tolerance of every float32 result against the float64 reference. */
#define TU_TOL 1e-4

/* --- suite and test life cycle ------------------------------------------------------------ */

/* Picks the seed (CLATTN_TEST_SEED; else a fixed one per suite; CLATTN_TEST_SEED=random: from
 * the clock), prints it, creates the shared context. No device: exits 77 (skipped, said loudly),
 * or 1 under CI=true. Call first in main. */
void tu_suite_begin(const char *suite_name);

/* Runs the suite in this process (CK_NOFORK, whatever CK_FORK says: OpenCL does not survive
 * fork) with CK_NORMAL output, prints the worst error seen, releases the shared context and
 * returns the process exit status (0 all passed, 1 otherwise). */
int tu_run_suite(Suite *suite);

/* tu_suite_begin(program), then tu_run_suite(make_suite()): a suite's whole main. */
int tu_main(const char *program, Suite *(*make_suite)(void));

/* A test case named `name`, added to `suite`, timed out after `timeout` seconds (where check
 * forks; the suites run in-process, CK_NOFORK). Fill it after adding: check runs a case's tests
 * as they stand when the suite runs. */
TCase *tu_tcase(Suite *suite, const char *name, double timeout);

/* Reseeds the generator for this test and clears the failure collector and case label. */
void tu_test_begin(const char *test_name, int loop_index);
#define TU_BEGIN_TEST() tu_test_begin(__func__, _i)

/* Describes the case being run (sizes, flags); it is part of every failure message. */
void tu_set_case(const char *format, ...) CK_ATTRIBUTE_FORMAT(printf, 1, 2);

/* "seed=... test=... i=... case=..." for messages. */
const char *tu_where(void);
uint64_t tu_seed(void);

/* --- failure collector -------------------------------------------------------------------- */

/* Records a failure (with tu_where()) when ok is false; returns ok. */
int tu_expect(int ok, const char *format, ...) CK_ATTRIBUTE_FORMAT(printf, 2, 3);

/* Records a failure when got != want, naming both statuses and the context's last error. */
int tu_expect_status(clattn_status got, clattn_status want, const char *call);

/* Records a failure for each entry of ctx's validation log from index *seen on that failed
 * (a kernel variant self-validation turned down: the numbers then came from the fallback, so a
 * test of that variant would pass without it); *seen becomes the log's length. For contexts
 * whose tuning rows select the variants a test is about. */
void tu_expect_trusted(clattn_ctx *ctx, size_t *seen);

/* A plan creation's refusal, as each plan kind's suite checks it: status `want`, *out set to
 * NULL (plan; the caller primes it with a non-NULL value) and the context's last message naming
 * both `needle` and the plan kind `kind`. */
void tu_expect_refused(clattn_status got, const clattn_plan *plan, clattn_status want,
                       const char *kind, const char *needle, const char *call);

/* A row of a suite's refusal table: what is given (a label, tuning rows, ...), a word the
 * message must hold, and the status wanted. */
typedef struct tu_refusal {
    const char *given, *needle;
    clattn_status want;
} tu_refusal;

/* The same without a status (one the table's loop knows): what is given, and the word. */
typedef struct tu_needle {
    const char *given, *needle;
} tu_needle;

/* Calls create(tu_ctx(), desc, &plan) with plan primed non-NULL and checks the refusal. */
#define TU_EXPECT_REFUSED(create, kind, desc, want, needle, call)                                  \
    do {                                                                                           \
        clattn_plan *tu_plan_ = (clattn_plan *)&tu_plan_;                                          \
        const clattn_status tu_got_ = create(tu_ctx(), (desc), &tu_plan_);                         \
        tu_expect_refused(tu_got_, tu_plan_, (want), (kind), (needle), (call));                    \
    } while (0)

/* Relative error of got vs ref (see tu_rel_error), counted in the suite's worst-error tracker;
 * records a failure when it exceeds tol. Returns the error. */
double tu_expect_close(const char *what, const float *got, const double *ref, size_t count,
                       double tol);

/* Records a failure unless every float outside [offset, offset + count) of a buffer of `total`
 * floats is NaN (the buffer was poisoned with NaN, so anything else is a stray write). */
int tu_expect_nan_outside(const char *what, const float *buffer, size_t total, size_t offset,
                          size_t count);

/* Records a failure unless every value is finite. */
int tu_expect_finite(const char *what, const float *values, size_t count);

int tu_failed(void);
const char *tu_failure_text(void);

/* Ends a test: one check failure carrying all collected messages. */
#define TU_END_TEST() ck_assert_msg(!tu_failed(), "%s", tu_failure_text())

/* err = max_i |got_i - ref_i| / max(max_i |ref_i|, 1e-30); INFINITY when got holds NaN or Inf
 * where ref is finite. */
double tu_rel_error(const float *got, const double *ref, size_t count);

/* Max absolute difference; INFINITY on a non-finite got. */
double tu_abs_error(const float *got, const double *ref, size_t count);

/* Counts one comparison towards the suite's "max relative error over N comparisons" line. */
void tu_track_error(double err);

/* Records a failure unless got is within tol of ref, relative to the larger of max |ref| and
 * `scale` (a sum's scale, the sum of its terms' magnitudes: the gradient of a broadcast mask
 * or of a sink is a sum whose terms cancel, so its own size says nothing of the rounding). */
void tu_expect_close_scaled(const char *what, const float *got, const double *ref, size_t count,
                            double scale, double tol);

/* --- random numbers ----------------------------------------------------------------------- */

uint64_t tu_rand_u64(void);
double tu_rand_unit(void);          /* [0, 1) */
size_t tu_rand_below(size_t bound); /* [0, bound), bound > 0 */
void tu_fill_uniform(float *values, size_t count, float low, float high); /* [low, high) */
void tu_fill_nan(float *values, size_t count);

/* --- host memory (aborts the test when out of memory; count 0 allocates one element) ------- */

float *tu_floats(size_t count);        /* uninitialised */
float *tu_random_floats(size_t count); /* uniform [-1, 1) */
float *tu_nan_floats(size_t count);
double *tu_doubles(size_t count); /* zeroed */
uint8_t *tu_bytes(size_t count);  /* zeroed */
float *tu_copy_floats(const float *values, size_t count);

/* --- device ------------------------------------------------------------------------------- */

/* The shared context, created with clattn_ctx_create(NULL, ...) (CLATTN_DEVICE picks the device).
 * No device: prints why and exits 77. */
clattn_ctx *tu_ctx(void);
void tu_ctx_release(void);

/* Buffers on the shared context. A float buffer of pad_before + count + pad_after floats holding
 * NaN in the pads, so reads outside the tensor show up as NaN. */
cl_mem tu_upload_padded(const float *values, size_t count, size_t pad_before, size_t pad_after);
cl_mem tu_upload_floats(const float *values, size_t count);
cl_mem tu_upload_bytes(const void *bytes, size_t count);
cl_mem tu_nan_buffer(size_t count); /* count floats, all NaN */
void tu_write_floats(cl_mem mem, size_t offset, const float *values, size_t count);
/* Waits for the shared context's queued work, then reads `count` floats from element `offset`. */
void tu_read_floats(cl_mem mem, size_t offset, size_t count, float *dst);
void tu_release_mem(cl_mem mem); /* NULL is a no-op */

/* (Tensors: clattn_tensor_make for packed ones; tests/problems.h for strided typed layouts,
 * uploads and downloads.) */

/* --- small conversions -------------------------------------------------------------------- */

void tu_floats_to_doubles(const float *src, size_t count, double *dst);

/* 1 when `word` occurs in text, case-insensitively, not as part of a longer identifier. */
int tu_mentions_word(const char *text, const char *word);

/* 1 when text starts with prefix. */
int tu_starts_with(const char *text, const char *prefix);

/* A cl_ulong-sized property (a size, a bitfield) of the shared context's device; 0 when the
 * query fails. */
cl_ulong tu_device_ulong(cl_device_info param);

/* 1 when the shared context's device has double precision (CL_DEVICE_DOUBLE_FP_CONFIG). */
int tu_device_has_fp64(void);

/* mkdtemp(template), aborting the test (a failure) when no directory could be made. */
void tu_make_temp_dir(char *template);

/* --- reduced runs ------------------------------------------------------------------------- */

/* 1 when CLATTN_TEST_SCALE=small: a suite then does not register its heaviest cases (huge
 * sequences, grids past 65535 work-groups), for slow simulators such as Oclgrind
 * (tests/oclgrind_lane.sh). Every kernel and kernel variant still runs. Unset or "full": 0;
 * any other value is reported on stderr and treated as full. */
int tu_small(void);

/* 1 when CLATTN_TEST_SCALE=full (tests/all_lanes.sh --full): a suite then runs the whole cross
 * product of a case table that the CI tier (scale unset, the pocl lane in CI) samples, where
 * a table is mostly PoCL kernel compilations (one per variant and size). Unset or small: 0. */
int tu_full(void);

/* Prints one loud line, "<suite>: NOT RUN (CLATTN_TEST_SCALE=small): <what>" (or "unset, the CI
 * tier; =full runs them" when the scale is not small), naming the cases a reduced run leaves
 * unregistered and why. */
void tu_not_run(const char *format, ...) CK_ATTRIBUTE_FORMAT(printf, 1, 2);

/* Registers `test` for the loop indices [start, end) except the skip_count ones in `skip`: how
 * a reduced run leaves single heavy rows of a case table out (and names them in tu_not_run). */
void tu_add_loop_except(TCase *tcase, const TTest *test, int start, int end, const int *skip,
                        int skip_count);

/* d = g for plan descriptors whose tensors live in d_tensors and g_tensors (the tests' naming):
 * d becomes g with a copy of g's tensors, bound to d. */
#define RESET(d, g) ((d) = (g), d##_tensors = g##_tensors, CLATTN_BIND_ROLES(d, d##_tensors))

/* The SDPA forward `forward` again on bound's tensors (out poisoned first), the gradients'
 * roles left out (the role array cut at CLATTN_ROLE_GRAD_OUT; where a later role is bound, a
 * mask_mod's auxiliary tensors, all roles with the gradients' absent); expects success
 * (`what` names it). */
void tu_forward_again(clattn_ctx *ctx, clattn_plan *forward, clattn_tensors *bound,
                      const char *what);

/* A plan creator's first checks: the descriptor `good` creates a plan (released), a NULL ctx
 * and a NULL desc are refused (CLATTN_ERR_INVALID_ARGUMENT). */
#define TU_EXPECT_PLAN_BASICS(create, good)                                                        \
    do {                                                                                           \
        clattn_plan *basics_ = NULL;                                                               \
        tu_expect_status(create(tu_ctx(), &(good), &basics_), CLATTN_SUCCESS, "good");             \
        clattn_plan_release(basics_);                                                              \
        tu_expect_status(create(NULL, &(good), &basics_), CLATTN_ERR_INVALID_ARGUMENT,             \
                         "NULL ctx");                                                              \
        tu_expect_status(create(tu_ctx(), NULL, &basics_), CLATTN_ERR_INVALID_ARGUMENT,            \
                         "NULL desc");                                                             \
    } while (0)

#endif /* CLATTN_TESTUTIL_H */
