/*
 * check_errors: every documented error path of the public API returns the right status, leaves a
 * message that starts with the operation's name and names the offending argument (and, for
 * shapes, the expected dims), never writes an output, and leaves the context usable: after the
 * failing calls a correct call on the same context gives correct output.
 *
 * Operation names in messages: "matmul" (clattn_matmul), "sdpa" and "mha" (plan creation and
 * execution), "attention" and "mha_forward" (the host API).
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "problems.h"
#include "reference.h"
#include "testutil.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

static const clattn_tensor absent; /* rank 0: absent */

/* --- tensors ------------------------------------------------------------------------------ */

static clattn_tensor f32_4(cl_mem mem, size_t d0, size_t d1, size_t d2, size_t d3)
{
    return clattn_tensor_make(mem, 0, CLATTN_DTYPE_F32, 4, d0, d1, d2, d3);
}

static clattn_tensor f32_3(cl_mem mem, size_t d0, size_t d1, size_t d2)
{
    return clattn_tensor_make(mem, 0, CLATTN_DTYPE_F32, 3, d0, d1, d2, 0);
}

static clattn_tensor f32_2(cl_mem mem, size_t d0, size_t d1)
{
    return clattn_tensor_make(mem, 0, CLATTN_DTYPE_F32, 2, d0, d1, 0, 0);
}

static clattn_tensor f32_1(cl_mem mem, size_t d0)
{
    return clattn_tensor_make(mem, 0, CLATTN_DTYPE_F32, 1, d0, 0, 0, 0);
}

static clattn_tensor with_dtype(clattn_tensor t, clattn_dtype dtype)
{
    t.dtype = dtype;
    return t;
}

static clattn_tensor with_offset(clattn_tensor t, size_t offset)
{
    t.offset = offset;
    return t;
}

static clattn_tensor with_strides(clattn_tensor t, size_t s0, size_t s1, size_t s2, size_t s3)
{
    t.strides[0] = s0, t.strides[1] = s1, t.strides[2] = s2, t.strides[3] = s3;
    return t;
}

/* A device buffer of `bytes` bytes on the shared context, every byte 0xff (NaN as floats). */
static cl_mem nan_bytes(size_t bytes)
{
    uint8_t *poison = tu_bytes(bytes);
    memset(poison, 0xff, bytes);
    cl_mem mem = tu_upload_bytes(poison, bytes);
    free(poison);
    return mem;
}

/* --- expectations ------------------------------------------------------------------------- */

/* `names` lists acceptable argument names separated by '|' (NULL skips the name check);
 * `needle`, when not NULL, must occur in the message. alternative is a second acceptable status
 * (CLATTN_SUCCESS: none). */
static void expect_error_full(clattn_status got, clattn_status want, clattn_status alternative,
                              const char *op, const char *names, const char *needle,
                              const char *call)
{
    clattn_ctx *ctx = tu_ctx();
    if (alternative != CLATTN_SUCCESS && got == alternative) {
        want = alternative;
    }
    if (!tu_expect_status(got, want, call)) {
        return;
    }
    const char *message = clattn_last_error(ctx);
    if (!tu_expect(message != NULL && message[0] != '\0', "%s: empty last error", call)) {
        return;
    }
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s:", op);
    tu_expect(tu_starts_with(message, prefix), "%s: message '%s' does not start with '%s'", call,
              message, prefix);
    tu_expect(needle == NULL || strstr(message, needle) != NULL,
              "%s: message '%s' does not contain '%s'", call, message, needle);
    if (names == NULL) {
        return;
    }
    char list[256];
    snprintf(list, sizeof list, "%s", names);
    int mentioned = 0;
    for (char *name = list; name != NULL && !mentioned;) {
        char *bar = strchr(name, '|');
        if (bar != NULL) {
            *bar = '\0';
        }
        mentioned = tu_mentions_word(message, name);
        name = bar != NULL ? bar + 1 : NULL;
    }
    tu_expect(mentioned, "%s: message '%s' names none of '%s'", call, message, names);
}

static void expect_error(clattn_status got, clattn_status want, const char *op, const char *names,
                         const char *call)
{
    expect_error_full(got, want, CLATTN_SUCCESS, op, names, NULL, call);
}

static void expect_error_text(clattn_status got, clattn_status want, const char *op,
                              const char *names, const char *needle, const char *call)
{
    expect_error_full(got, want, CLATTN_SUCCESS, op, names, needle, call);
}

/* A call made with a NULL context: INVALID_ARGUMENT, and clattn_last_error(NULL) says why. */
static void expect_null_ctx(clattn_status got, const char *call)
{
    tu_expect(got == CLATTN_ERR_INVALID_ARGUMENT, "%s: got %s, want CLATTN_ERR_INVALID_ARGUMENT",
              call, clattn_status_string(got));
    tu_expect(tu_mentions_word(clattn_last_error(NULL), "ctx"),
              "clattn_last_error(NULL) = '%s' does not name ctx", clattn_last_error(NULL));
}

/* Records a failure unless the `count` floats of mem are all still NaN (nothing was written). */
static void expect_untouched(cl_mem mem, size_t count, const char *call)
{
    float *got = tu_floats(count);
    tu_read_floats(mem, 0, count, got);
    char what[160];
    snprintf(what, sizeof what, "%s: the output", call);
    tu_expect_nan_outside(what, got, count, 0, 0);
    free(got);
}

/* A correct small matmul (with bias, alpha, beta) on the shared context still works. */
static void expect_context_still_works(void)
{
    const size_t m = 5, n = 7, k = 3;
    float *a = tu_random_floats(m * k), *b = tu_random_floats(k * n);
    float *bias = tu_random_floats(n), *c = tu_random_floats(m * n);
    const clattn_matmul_desc desc = {.struct_size = sizeof desc, .alpha = 0.5f, .beta = 2.0f};
    double *ref = tu_doubles(m * n);
    tu_floats_to_doubles(c, m * n, ref);
    cl_mem a_mem = tu_upload_floats(a, m * k), b_mem = tu_upload_floats(b, k * n);
    cl_mem bias_mem = tu_upload_floats(bias, n), c_mem = tu_upload_floats(c, m * n);
    const clattn_tensor ta = f32_2(a_mem, m, k), tb = f32_2(b_mem, k, n);
    const clattn_tensor tbias = f32_1(bias_mem, n), tc = f32_2(c_mem, m, n);
    const ref_matmul_shape shape = {.m = m, .n = n, .k = k, .alpha = 0.5f, .beta = 2.0f};
    ref_matmul(&shape, a, b, bias, ref);
    clattn_status status = clattn_matmul(tu_ctx(), &desc, &ta, &tb, &tbias, &tc, 0, NULL, NULL);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_matmul after the errors")) {
        tu_read_floats(c_mem, 0, m * n, c);
        tu_expect_close("matmul after the errors", c, ref, m * n, TU_TOL);
    }
    tu_release_mem(c_mem);
    tu_release_mem(bias_mem);
    tu_release_mem(b_mem);
    tu_release_mem(a_mem);
    free(ref);
    free(c);
    free(bias);
    free(b);
    free(a);
}

/* --- matmul ------------------------------------------------------------------------------- */

START_TEST(test_matmul_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("matmul errors");
    clattn_ctx *ctx = tu_ctx();
    const size_t m = 5, n = 7, k = 3;
    cl_mem a_mem = tu_nan_buffer(m * k), b_mem = tu_nan_buffer(k * n);
    cl_mem c_mem = tu_nan_buffer(2 * m * n), bias_mem = tu_nan_buffer(n);
    cl_mem short_mem = tu_nan_buffer(m * k - 1), short_bias_mem = tu_nan_buffer(n - 1);
    /* Large enough for every shape below, so that shapes are refused as shapes. */
    cl_mem big_mem = tu_nan_buffer(4096);
    const clattn_tensor a = f32_2(a_mem, m, k), b = f32_2(b_mem, k, n), c = f32_2(c_mem, m, n);
    const clattn_tensor bias = f32_1(bias_mem, n);
    const clattn_matmul_desc good = {.struct_size = sizeof good, .alpha = 1.0f};
    clattn_matmul_desc desc;
    clattn_tensor t;
    clattn_status status;
    cl_event event = (cl_event)&event; /* must be cleared on failure */

#define MM(desc_ptr, ta, tb, tbias, tc)                                                            \
    clattn_matmul(ctx, (desc_ptr), (ta), (tb), (tbias), (tc), 0, NULL, &event)

    /* NULL pointers. */
    status = clattn_matmul(NULL, &good, &a, &b, NULL, &c, 0, NULL, &event);
    expect_null_ctx(status, "matmul(NULL ctx)");
    tu_expect(event == NULL, "matmul(NULL ctx) left *event set");
    status = MM(NULL, &a, &b, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "desc", "matmul(NULL desc)");
    status = MM(&good, NULL, &b, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "a", "matmul(a NULL)");
    status = MM(&good, &a, NULL, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "b", "matmul(b NULL)");
    status = MM(&good, &a, &b, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "c", "matmul(c NULL)");
    tu_expect(event == NULL, "a refused matmul left *event set");

    /* The descriptor. */
    desc = good, desc.struct_size = 0;
    status = MM(&desc, &a, &b, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "struct_size",
                 "matmul(struct_size 0)");
    desc = good, desc.struct_size = sizeof desc + 8;
    status = MM(&desc, &a, &b, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "struct_size",
                 "matmul(struct_size too large)");

    /* Absent operands, ranks, dtypes, missing buffers. */
    status = MM(&good, &absent, &b, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "a", "matmul(a rank 0)");
    status = MM(&good, &a, &absent, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "b", "matmul(b rank 0)");
    status = MM(&good, &a, &b, NULL, &absent);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "c", "matmul(c rank 0)");
    t = a, t.rank = 1;
    status = MM(&good, &t, &b, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "a", "matmul(a rank 1)");
    t = c, t.rank = 5;
    status = MM(&good, &a, &b, NULL, &t);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "c", "matmul(c rank 5)");
    t = b, t.rank = -1;
    status = MM(&good, &a, &t, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "b", "matmul(b rank -1)");
    t = bias, t.rank = 2, t.dims[1] = 1;
    status = MM(&good, &a, &b, &t, &c);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "bias", "matmul(bias rank 2)");
    t = a, t.mem = NULL;
    status = MM(&good, &t, &b, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "a", "matmul(a without buffer)");
    t = c, t.mem = NULL;
    status = MM(&good, &a, &b, NULL, &t);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "c", "matmul(c without buffer)");
    t = with_dtype(a, CLATTN_DTYPE_U8);
    status = MM(&good, &t, &b, NULL, &c);
    expect_error_text(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "a", "U8", "matmul(a U8)");
    t = with_dtype(c, CLATTN_DTYPE_U8);
    status = MM(&good, &a, &b, NULL, &t);
    expect_error_text(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "c", "U8", "matmul(c U8)");
    t = with_dtype(b, (clattn_dtype)9);
    status = MM(&good, &a, &t, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "b", "matmul(b dtype 9)");
    t = with_dtype(bias, CLATTN_DTYPE_F16);
    status = MM(&good, &a, &b, &t, &c);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "bias", "matmul(bias F16)");

    /* Shapes: zero dims, mismatched operands, batch dims that do not broadcast. */
    t = a, t.dims[0] = 0;
    status = MM(&good, &t, &b, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "a", "matmul(a dims[0] = 0)");
    t = b, t.dims[1] = 0;
    status = MM(&good, &a, &t, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "b", "matmul(b dims[1] = 0)");
    t = f32_2(big_mem, k + 1, n);
    status = MM(&good, &a, &t, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "b", "matmul(b has k+1 rows)");
    desc = good, desc.trans_b = 1;
    status = MM(&desc, &a, &b, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "b", "matmul(trans_b, b k x n)");
    t = f32_2(c_mem, m, n + 1);
    status = MM(&good, &a, &b, NULL, &t);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "c", "matmul(c m x n+1)");
    desc = good, desc.trans_a = 1;
    status = MM(&desc, &a, &b, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "b|c", "matmul(trans_a, a m x k)");
    t = f32_1(bias_mem, n - 1);
    status = MM(&good, &a, &b, &t, &c);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "bias", "matmul(bias n-1)");
    {
        const clattn_tensor a3 = f32_3(big_mem, 3, m, k), c2 = f32_3(c_mem, 2, m, n);
        status = MM(&good, &a3, &b, NULL, &c2);
        expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "a",
                     "matmul(a batch 3, c batch 2)");
        const clattn_tensor b4 = f32_4(big_mem, 2, 1, k, n), c4 = f32_4(c_mem, 1, 2, m, n);
        status = MM(&good, &a, &b4, NULL, &c4);
        expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "b",
                     "matmul(b batch (2, 1), c batch (1, 2))");
    }
    /* The kernels read rows: the last stride must be 1. */
    t = with_strides(a, k, 2, 0, 0);
    status = MM(&good, &t, &b, NULL, &c);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "a", "matmul(a column stride 2)");

    /* Outputs whose elements would overlap. */
    t = with_strides(c, n - 1, 1, 0, 0);
    status = MM(&good, &a, &b, NULL, &t);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "c", "matmul(c row stride n-1)");
    t = with_strides(c, 0, 1, 0, 0);
    status = MM(&good, &a, &b, NULL, &t);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "c", "matmul(c row stride 0)");
    for (size_t batch = 2; batch <= 3; ++batch) {
        /* The old stride_c = 0 with batch > 1: every entry would write one matrix. */
        const clattn_tensor a3 = f32_3(a_mem, batch, m, k);
        const clattn_tensor c3 = with_strides(f32_3(c_mem, batch, m, n), 0, n, 1, 0);
        const clattn_tensor a3_broadcast = with_strides(a3, 0, k, 1, 0);
        status = MM(&good, &a3_broadcast, &b, NULL, &c3);
        char call[64];
        snprintf(call, sizeof call, "matmul(batch %zu, c batch stride 0)", batch);
        expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "c", call);
    }

    /* Buffers too small for the shape, or offsets past the end. */
    t = f32_2(short_mem, m, k);
    status = MM(&good, &t, &b, NULL, &c);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "matmul", "a", "matmul(a one float short)");
    t = with_offset(b, 1);
    status = MM(&good, &a, &t, NULL, &c);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "matmul", "b", "matmul(b offset 1)");
    t = with_offset(c, 2 * m * n);
    status = MM(&good, &a, &b, NULL, &t);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "matmul", "c", "matmul(c offset at end)");
    t = with_offset(c, SIZE_MAX / 2);
    status = MM(&good, &a, &b, NULL, &t);
    expect_error_full(status, CLATTN_ERR_BUFFER_TOO_SMALL, CLATTN_ERR_OVERFLOW, "matmul", "c", NULL,
                      "matmul(c offset SIZE_MAX/2)");
    t = f32_1(short_bias_mem, n);
    status = MM(&good, &a, &b, &t, &c);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "matmul", "bias",
                 "matmul(bias one float short)");
    /* Row strides (the old lda) larger than the packed ones need a larger buffer. */
    t = with_strides(a, k + 1, 1, 0, 0);
    status = MM(&good, &t, &b, NULL, &c);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "matmul", "a", "matmul(a row stride k+1)");
    {
        const clattn_tensor a3 = f32_3(a_mem, 2, m, k), c3 = f32_3(c_mem, 2, m, n);
        status = MM(&good, &a3, &b, &bias, &c3);
        expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "matmul", "a",
                     "matmul(batch 2 on a one-matrix a)");
    }

    /* Sizes and strides whose extent overflows size_t. */
    t = f32_2(a_mem, SIZE_MAX / 2, SIZE_MAX / 2);
    status = MM(&good, &t, &b, NULL, &c);
    expect_error(status, CLATTN_ERR_OVERFLOW, "matmul", "a", "matmul(a SIZE_MAX/2 squared)");
    t = with_strides(f32_3(a_mem, 3, m, k), SIZE_MAX / 2, k, 1, 0);
    status = MM(&good, &t, &b, NULL, &c);
    expect_error_full(status, CLATTN_ERR_OVERFLOW, CLATTN_ERR_INVALID_SHAPE, "matmul", "a", NULL,
                      "matmul(a batch stride SIZE_MAX/2)");
    t = f32_3(big_mem, 3, m, k);
    {
        const clattn_tensor c3 = with_strides(f32_3(c_mem, 3, m, n), SIZE_MAX / 2, n, 1, 0);
        status = MM(&good, &t, &b, NULL, &c3);
        expect_error(status, CLATTN_ERR_OVERFLOW, "matmul", "c",
                     "matmul(c batch stride SIZE_MAX/2)");
    }
    t = with_offset(c, SIZE_MAX - 1);
    status = MM(&good, &a, &b, NULL, &t);
    expect_error(status, CLATTN_ERR_OVERFLOW, "matmul", "c", "matmul(c offset SIZE_MAX - 1)");

    /* Wait lists that do not match num_wait. */
    status = clattn_matmul(ctx, &good, &a, &b, NULL, &c, 1, NULL, NULL);
    expect_error_full(status, CLATTN_ERR_INVALID_ARGUMENT,
                      (clattn_status)CL_INVALID_EVENT_WAIT_LIST, "matmul", "num_wait|wait", NULL,
                      "matmul(num_wait 1, wait NULL)");
#undef MM
    tu_expect(event == NULL, "a refused matmul left *event set");

    expect_untouched(c_mem, 2 * m * n, "matmul (refused calls)");
    tu_release_mem(big_mem);
    tu_release_mem(short_bias_mem);
    tu_release_mem(short_mem);
    tu_release_mem(bias_mem);
    tu_release_mem(c_mem);
    tu_release_mem(b_mem);
    tu_release_mem(a_mem);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- SDPA plans: creation ------------------------------------------------------------------ */

/* batch 2, heads 2, seq_q 3, seq_k 4, head_dim_qk 5, head_dim_v 6 */
enum { SB = 2, SH = 2, SQ = 3, SK = 4, SDK = 5, SDV = 6 };

static clattn_sdpa_desc sdpa_good(clattn_tensors *out)
{
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc_tensors.q = f32_4(NULL, SB, SH, SQ, SDK);
    desc_tensors.k = f32_4(NULL, SB, SH, SK, SDK);
    desc_tensors.v = f32_4(NULL, SB, SH, SK, SDV);
    desc_tensors.out = f32_4(NULL, SB, SH, SQ, SDV);
    *out = desc_tensors;
    CLATTN_BIND_ROLES(desc, *out);
    return desc;
}

/* Creates a plan from desc and expects it refused. */
static void expect_sdpa_refused(const clattn_sdpa_desc *desc, clattn_status want,
                                clattn_status alternative, const char *names, const char *needle,
                                const char *call)
{
    clattn_plan *plan = (clattn_plan *)&plan; /* must be overwritten with NULL */
    clattn_status status = clattn_sdpa_plan_create(tu_ctx(), desc, &plan);
    expect_error_full(status, want, alternative, "sdpa", names, needle, call);
    tu_expect(status == CLATTN_SUCCESS || plan == NULL, "%s: failed but *out is not NULL", call);
    if (status == CLATTN_SUCCESS) {
        clattn_plan_release(plan);
    }
}

/* Creates a plan from desc and expects success; returns it (the caller releases it). */
static clattn_plan *expect_sdpa_created(const clattn_sdpa_desc *desc, const char *call)
{
    clattn_plan *plan = NULL;
    clattn_status status = clattn_sdpa_plan_create(tu_ctx(), desc, &plan);
    tu_expect(status == CLATTN_SUCCESS && plan != NULL, "%s: %s: %s", call,
              clattn_status_string(status), clattn_last_error(tu_ctx()));
    return status == CLATTN_SUCCESS ? plan : NULL;
}

START_TEST(test_sdpa_create_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("sdpa plan creation errors");
    clattn_ctx *ctx = tu_ctx();
    clattn_tensors good_tensors;
    const clattn_sdpa_desc good = sdpa_good(&good_tensors);
    clattn_sdpa_desc desc;
    clattn_tensors desc_tensors = {0};
    clattn_plan *plan = (clattn_plan *)&plan;
    clattn_status status;

    /* NULL pointers. */
    status = clattn_sdpa_plan_create(NULL, &good, &plan);
    expect_null_ctx(status, "sdpa_plan_create(NULL ctx)");
    tu_expect(plan == NULL, "sdpa_plan_create(NULL ctx) left *out set");
    status = clattn_sdpa_plan_create(ctx, NULL, &plan);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "sdpa", "desc", "sdpa(NULL desc)");
    status = clattn_sdpa_plan_create(ctx, &good, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "sdpa", "out", "sdpa(NULL out)");

    /* struct_size. */
    RESET(desc, good), desc.struct_size = 0;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "struct_size", NULL,
                        "sdpa(struct_size 0)");
    RESET(desc, good), desc.struct_size = sizeof desc - 4;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "struct_size", "clattn_sdpa_desc",
                        "sdpa(struct_size no version has)");

    /* Bad enum values and scale. */
    RESET(desc, good), desc.norm = (clattn_norm)7;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "norm", NULL, "sdpa(norm 7)");
    RESET(desc, good), desc.norm = (clattn_norm)-1;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "norm", NULL, "sdpa(norm -1)");
    RESET(desc, good), desc.causal = (clattn_causal)5;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "causal", NULL, "sdpa(causal 5)");
    RESET(desc, good), desc.causal = (clattn_causal)-2;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "causal", NULL, "sdpa(causal -2)");
    RESET(desc, good), desc.path = (clattn_path)5;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "path", NULL, "sdpa(path 5)");

    /* The key rules: windows, key counts, the KV cache, the scores. */
    RESET(desc, good), desc.window_align = (clattn_causal)5;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "window_align", NULL,
                        "sdpa(window_align 5)");
    RESET(desc, good), desc.causal = CLATTN_CAUSAL_OFFSET, desc.diag_offset = 3;
    desc.window_align = CLATTN_CAUSAL_TOP_LEFT;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "causal", "same alignment",
                        "sdpa(causal OFFSET, window TOP_LEFT)");
    RESET(desc, good), desc.causal = CLATTN_CAUSAL_TOP_LEFT;
    desc.window_align = CLATTN_CAUSAL_BOTTOM_RIGHT;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "causal", "same alignment",
                        "sdpa(causal and window aligned apart)");
    RESET(desc, good), desc_tensors.kv_seqlen = f32_1(NULL, SB);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "kv_seqlen", "I32",
                        "sdpa(kv_seqlen F32)");
    RESET(desc, good), desc_tensors.kv_seqlen = with_dtype(f32_1(NULL, SB + 1), CLATTN_DTYPE_I32);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "kv_seqlen", "(batch)",
                        "sdpa(kv_seqlen of 3 batches)");
    RESET(desc, good), desc_tensors.past_k = f32_4(NULL, SB, SH, 7, SDK);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "past_v", "together",
                        "sdpa(past_k without past_v)");
    desc_tensors.past_v = f32_4(NULL, SB, SH, 7, SDV);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "present_k", "written",
                        "sdpa(past without present)");
    desc_tensors.present_k = f32_4(NULL, SB, SH, 7 + SK, SDK);
    desc_tensors.present_v = f32_4(NULL, SB, SH, 7 + SK, SDV);
    clattn_plan *cached = expect_sdpa_created(&desc, "sdpa(past and present)");
    clattn_plan_release(cached);
    desc_tensors.present_v = f32_4(NULL, SB, SH, 7 + SK - 1, SDV);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "present_v", "past + seq_k",
                        "sdpa(present_v one key short)");
    desc_tensors.present_v = f32_4(NULL, SB, SH, 7 + SK, SDV);
    desc_tensors.past_v = f32_4(NULL, SB, SH, 6, SDV);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "past_v", "past",
                        "sdpa(past_v shorter than past_k)");
    desc_tensors.past_v = f32_4(NULL, SB, SH, 7, SDV);
    desc_tensors.kv_seqlen = with_dtype(f32_1(NULL, SB), CLATTN_DTYPE_I32);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "kv_seqlen", "past",
                        "sdpa(kv_seqlen with a past)");
    RESET(desc, good), desc_tensors.scores = f32_4(NULL, SB, SH, SQ, SK);
    desc.path = CLATTN_PATH_FUSED;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "path", "scores",
                        "sdpa(FUSED with scores)");
    desc.path = CLATTN_PATH_AUTO, desc.scores_mode = (clattn_scores)3;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "scores_mode", "weights",
                        "sdpa(scores_mode 3)");
    desc.scores_mode = CLATTN_SCORES_MASKED;
    desc_tensors.scores = f32_4(NULL, SB, SH, SQ, SK + 1);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "scores", NULL,
                        "sdpa(scores one key too many)");
    desc_tensors.scores = f32_4(NULL, SB, SH, SQ, SK);
    cached = expect_sdpa_created(&desc, "sdpa(AUTO with scores)");
    tu_expect(cached == NULL || !clattn_plan_is_fused(cached), "AUTO with scores is fused");
    clattn_plan_release(cached);
    RESET(desc, good), desc.scale = INFINITY;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "scale", NULL, "sdpa(scale inf)");
    static const float bad_caps[] = {-1.0f, -0.0001f, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad_caps / sizeof bad_caps[0]; ++i) {
        char call[64];
        snprintf(call, sizeof call, "sdpa(softcap %g)", (double)bad_caps[i]);
        RESET(desc, good), desc.softcap = bad_caps[i];
        expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "softcap", NULL, call);
    }
    RESET(desc, good), desc.softcap = 1e-30f; /* tiny but positive: a valid (extreme) cap */
    clattn_plan_release(expect_sdpa_created(&desc, "sdpa(softcap 1e-30)"));

    /* ALiBi slopes: F32 (heads) or (batch, heads) only. */
    RESET(desc, good), desc_tensors.alibi_slopes = f32_1(NULL, SH + 1);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "alibi_slopes", "(heads)",
                        "sdpa(alibi_slopes of one head too many)");
    RESET(desc, good), desc_tensors.alibi_slopes = f32_2(NULL, SB + 1, SH);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "alibi_slopes", "(batch, heads)",
                        "sdpa(alibi_slopes of 3 batches)");
    RESET(desc, good), desc_tensors.alibi_slopes = f32_4(NULL, 1, 1, SB, SH);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "alibi_slopes", NULL,
                        "sdpa(alibi_slopes of rank 4)");
    RESET(desc, good), desc_tensors.alibi_slopes = with_dtype(f32_1(NULL, SH), CLATTN_DTYPE_F16);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "alibi_slopes", "F32",
                        "sdpa(alibi_slopes F16)");
    RESET(desc, good), desc_tensors.alibi_slopes = f32_2(NULL, SB, SH);
    clattn_plan_release(expect_sdpa_created(&desc, "sdpa(alibi_slopes (batch, heads))"));

    /* clattn_alibi_slopes: refusals, and the paper's slopes (H = 8: 2^-1 .. 2^-8; H = 12:
     * the 8-head ones, then the odd terms of the 16-head sequence, 2^-0.5, 2^-1.5, ...). */
    float slopes[12];
    tu_expect_status(clattn_alibi_slopes(0, 8.0f, slopes), CLATTN_ERR_INVALID_ARGUMENT,
                     "clattn_alibi_slopes(0 heads)");
    tu_expect_status(clattn_alibi_slopes(4, 8.0f, NULL), CLATTN_ERR_INVALID_ARGUMENT,
                     "clattn_alibi_slopes(NULL)");
    tu_expect_status(clattn_alibi_slopes(4, 0.0f, slopes), CLATTN_ERR_INVALID_ARGUMENT,
                     "clattn_alibi_slopes(max_bias 0)");
    tu_expect_status(clattn_alibi_slopes(4, NAN, slopes), CLATTN_ERR_INVALID_ARGUMENT,
                     "clattn_alibi_slopes(max_bias NAN)");
    if (tu_expect_status(clattn_alibi_slopes(8, 8.0f, slopes), CLATTN_SUCCESS,
                         "clattn_alibi_slopes(8)"))
        for (int h = 0; h < 8; ++h)
            tu_expect(slopes[h] == ldexpf(1.0f, -(h + 1)), "8 heads: slope %d is %g, not 2^-%d", h,
                      (double)slopes[h], h + 1);
    if (tu_expect_status(clattn_alibi_slopes(12, 8.0f, slopes), CLATTN_SUCCESS,
                         "clattn_alibi_slopes(12)"))
        for (int h = 0; h < 12; ++h) {
            const double want = h < 8 ? ldexp(1.0, -(h + 1)) : pow(2.0, -0.5 * (2 * (h - 8) + 1));
            tu_expect(fabs(slopes[h] - want) <= 1e-7 * want, "12 heads: slope %d is %.9g, not %.9g",
                      h, (double)slopes[h], want);
        }
    /* not a dtype (7 is FP8_E4M3 since 0.12) */
    RESET(desc, good), desc_tensors.q.dtype = (clattn_dtype)31;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "q", "dtype", "sdpa(q dtype 31)");
    RESET(desc, good), desc_tensors.out.dtype = (clattn_dtype)-1;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "out", "dtype",
                        "sdpa(out dtype -1)");

    /* Required tensors absent, ranks 0, 3 and 5, MHA tensors. */
    static const char *const required[4] = {"q", "k", "v", "out"};
    for (int i = 0; i < 4; ++i) {
        char call[64];
        RESET(desc, good);
        clattn_tensor *tensors[4] = {&desc_tensors.q, &desc_tensors.k, &desc_tensors.v,
                                     &desc_tensors.out};
        *tensors[i] = absent;
        snprintf(call, sizeof call, "sdpa(%s absent)", required[i]);
        expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, required[i], NULL, call);
        RESET(desc, good);
        tensors[i]->rank = 3;
        snprintf(call, sizeof call, "sdpa(%s rank 3)", required[i]);
        expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, required[i], "rank", call);
        RESET(desc, good);
        tensors[i]->rank = 5;
        snprintf(call, sizeof call, "sdpa(%s rank 5)", required[i]);
        expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, required[i], "rank", call);
        RESET(desc, good);
        tensors[i]->dims[i] = 0;
        snprintf(call, sizeof call, "sdpa(%s dims[%d] = 0)", required[i], i);
        expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, required[i], NULL, call);
    }
    RESET(desc, good), desc_tensors.q_weight = f32_2(NULL, SDK, SDK);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "q_weight", NULL,
                        "sdpa(q_weight given)");
    RESET(desc, good), desc_tensors.out_bias = f32_1(NULL, SDV);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "out_bias", NULL,
                        "sdpa(out_bias given)");

    /* Mismatched dims: the message names the tensor and the dims expected. */
    RESET(desc, good), desc_tensors.k.dims[3] = SDK + 1;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "k", "(2, 2, 4, 5)",
                        "sdpa(k head_dim 6, q 5)");
    RESET(desc, good), desc_tensors.k.dims[0] = SB + 1;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "k", "(2, 2, 4, 5)",
                        "sdpa(k batch 3, q 2)");
    /* k and v may have fewer heads than q (grouped-query), a divisor of q's, both the same. */
    RESET(desc, good), desc_tensors.k.dims[1] = 3;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "k",
                        "has 3 heads (dim 1), which must divide q's 2 heads",
                        "sdpa(k heads 3, q 2)");
    RESET(desc, good), desc_tensors.k.dims[1] = 1;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "v", "(2, 1, 4, 6)",
                        "sdpa(k heads 1, v 2)");
    RESET(desc, good), desc_tensors.v.dims[2] = SK + 1;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "v", "(2, 2, 4, 6)",
                        "sdpa(v seq_k 5, k 4)");
    RESET(desc, good), desc_tensors.out.dims[3] = SDV - 1;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "out", "(2, 2, 3, 6)",
                        "sdpa(out head_dim 5, v 6)");
    RESET(desc, good), desc_tensors.out.dims[2] = SK;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "out", "(2, 2, 3, 6)",
                        "sdpa(out seq 4, q 3)");
    RESET(desc, good), desc_tensors.weights = f32_4(NULL, SB, SH, SQ, SK + 1);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "weights", "(2, 2, 3, 4)",
                        "sdpa(weights seq_k 5)");
    RESET(desc, good), desc_tensors.weights = f32_3(NULL, SB, SQ, SK);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "weights", "(2, 2, 3, 4)",
                        "sdpa(weights rank 3)");
    RESET(desc, good), desc_tensors.lse = f32_3(NULL, SB, SH, SK);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "lse", "(2, 2, 3)", "sdpa(lse seq 4)");

    /* Masks that do not broadcast to (batch, heads, seq_q, seq_k). */
    static const struct {
        int rank;
        size_t dims[4];
        const char *label;
    } bad_masks[] = {
        {2, {SQ, SK + 1}, "attn_mask (3, 5)"},
        {2, {SQ + 1, SK}, "attn_mask (4, 4)"},
        {1, {SK - 1}, "attn_mask (3)"},
        {4, {3, SH, SQ, SK}, "attn_mask batch 3"},
        {3, {SH + 1, SQ, SK}, "attn_mask heads 3"},
        {4, {SB, SH, SQ, 2}, "attn_mask seq_k 2"},
    };
    for (int i = 0; i < COUNT_OF(bad_masks); ++i) {
        RESET(desc, good);
        desc_tensors.attn_mask =
            clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, bad_masks[i].rank, bad_masks[i].dims[0],
                               bad_masks[i].dims[1], bad_masks[i].dims[2], bad_masks[i].dims[3]);
        char call[96];
        snprintf(call, sizeof call, "sdpa(%s)", bad_masks[i].label);
        expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "attn_mask", "(2, 2, 3, 4)", call);
    }
    RESET(desc, good), desc_tensors.attn_mask = f32_4(NULL, 1, 1, 1, 1);
    desc_tensors.attn_mask.rank = 5;
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "attn_mask", "rank",
                        "sdpa(attn_mask rank 5)");
    RESET(desc, good);
    desc_tensors.key_padding_mask =
        clattn_tensor_make(NULL, 0, CLATTN_DTYPE_U8, 2, SB, SK + 1, 0, 0);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "key_padding_mask", "(2, 4)",
                        "sdpa(key_padding_mask (2, 5))");
    RESET(desc, good);
    desc_tensors.key_padding_mask = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_U8, 1, SK, 0, 0, 0);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "key_padding_mask", "(2, 4)",
                        "sdpa(key_padding_mask rank 1)");
    RESET(desc, good);
    desc_tensors.key_padding_mask = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_U8, 3, SB, 1, SK, 0);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "key_padding_mask", "(2, 4)",
                        "sdpa(key_padding_mask rank 3)");

    /* U8 where floats are needed, and floats where U8 is. */
    static const struct {
        size_t field;
        const char *name;
        clattn_dtype dtype;
    } bad_dtypes[] = {
        {offsetof(clattn_tensors, q), "q", CLATTN_DTYPE_U8},
        {offsetof(clattn_tensors, k), "k", CLATTN_DTYPE_U8},
        {offsetof(clattn_tensors, v), "v", CLATTN_DTYPE_U8},
        {offsetof(clattn_tensors, out), "out", CLATTN_DTYPE_U8},
    };
    for (int i = 0; i < COUNT_OF(bad_dtypes); ++i) {
        RESET(desc, good);
        clattn_tensor *tensor = (clattn_tensor *)((char *)&desc_tensors + bad_dtypes[i].field);
        tensor->dtype = bad_dtypes[i].dtype;
        char call[64];
        snprintf(call, sizeof call, "sdpa(%s U8)", bad_dtypes[i].name);
        expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, bad_dtypes[i].name, "U8", call);
    }
    RESET(desc, good), desc_tensors.key_padding_mask = f32_2(NULL, SB, SK);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "key_padding_mask", "F32",
                        "sdpa(key_padding_mask F32)");
    RESET(desc, good);
    desc_tensors.key_padding_mask = with_dtype(f32_2(NULL, SB, SK), CLATTN_DTYPE_F16);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "key_padding_mask", "F16",
                        "sdpa(key_padding_mask F16)");
    RESET(desc, good),
        desc_tensors.weights = with_dtype(f32_4(NULL, SB, SH, SQ, SK), CLATTN_DTYPE_F16);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "weights", "F16",
                        "sdpa(weights F16)");
    RESET(desc, good),
        desc_tensors.weights = with_dtype(f32_4(NULL, SB, SH, SQ, SK), CLATTN_DTYPE_U8);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "weights", "U8", "sdpa(weights U8)");
    RESET(desc, good), desc_tensors.lse = with_dtype(f32_3(NULL, SB, SH, SQ), CLATTN_DTYPE_BF16);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "lse", "BF16", "sdpa(lse BF16)");

    /* Outputs with stride 0 along a dimension above 1 (elements would overlap); inputs may. */
    RESET(desc, good), desc_tensors.out = with_strides(desc_tensors.out, SH * SQ * SDV, 0, SDV, 1);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "out", "stride 0",
                        "sdpa(out heads stride 0)");
    RESET(desc, good),
        desc_tensors.out = with_strides(desc_tensors.out, SH * SQ * SDV, SQ * SDV, SDV, 0);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "out", "stride 0",
                        "sdpa(out head_dim stride 0)");
    RESET(desc, good), desc_tensors.weights = f32_4(NULL, SB, SH, SQ, SK);
    desc_tensors.weights = with_strides(desc_tensors.weights, 0, SQ * SK, SK, 1);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "weights", "stride 0",
                        "sdpa(weights batch stride 0)");
    RESET(desc, good), desc_tensors.lse = with_strides(f32_3(NULL, SB, SH, SQ), SH * SQ, SQ, 0, 0);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "lse", "stride 0",
                        "sdpa(lse seq stride 0)");
    RESET(desc, good), desc_tensors.k = with_strides(desc_tensors.k, SK * SDK, 0, SDK, 1);
    desc_tensors.v = with_strides(desc_tensors.v, 0, 0, SDV, 1);
    plan = expect_sdpa_created(&desc, "sdpa(k and v broadcast over heads by stride 0)");
    clattn_plan_release(plan);
    /* All-zero strides: packed until 0.7; refused now (one element repeated everywhere is no
     * attention input anyone means), except on a tensor of one element. */
    RESET(desc, good), desc_tensors.k = with_strides(desc_tensors.k, 0, 0, 0, 0);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "k", "strides all 0",
                        "sdpa(k with all-zero strides)");
    RESET(desc, good), desc_tensors.attn_mask = with_strides(f32_4(NULL, 1, 1, 1, 1), 0, 0, 0, 0);
    plan = expect_sdpa_created(&desc, "sdpa(a one-element mask with all-zero strides)");
    clattn_plan_release(plan);

    /* Sizes and strides whose extent overflows size_t; single dims over 32 bits. */
    const size_t big = (size_t)1 << 31, over = (size_t)UINT32_MAX + 1;
    if (SIZE_MAX > UINT32_MAX) {
        RESET(desc, good), desc_tensors.q = f32_4(NULL, big, big, big, SDK);
        expect_sdpa_refused(&desc, CLATTN_ERR_OVERFLOW, 0, "q", NULL, "sdpa(q 2^93 elements)");
        RESET(desc, good),
            desc_tensors.k = with_strides(desc_tensors.k, SIZE_MAX / 2, SK * SDK, SDK, 1);
        expect_sdpa_refused(&desc, CLATTN_ERR_OVERFLOW, 0, "k", NULL,
                            "sdpa(k batch stride SIZE_MAX/2)");
        RESET(desc, good), desc_tensors.v = with_strides(desc_tensors.v, 1, 1, SIZE_MAX / 4, 1);
        expect_sdpa_refused(&desc, CLATTN_ERR_OVERFLOW, 0, "v", NULL,
                            "sdpa(v seq stride SIZE_MAX/4)");
        /* 2^63 elements fit size_t; their 2^65 bytes do not. */
        RESET(desc, good), desc_tensors.q = f32_4(NULL, big, big, 2, 1);
        desc_tensors.k = f32_4(NULL, big, big, SK, 1);
        expect_sdpa_refused(&desc, CLATTN_ERR_OVERFLOW, 0, "q", "bytes", "sdpa(q 2^65 bytes)");
        RESET(desc, good), desc_tensors.q.dims[2] = over;
        expect_sdpa_refused(&desc, CLATTN_ERR_UNSUPPORTED, 0, "q", "32-bit", "sdpa(seq_q 2^32)");
        RESET(desc, good), desc_tensors.k.dims[2] = over, desc_tensors.v.dims[2] = over;
        expect_sdpa_refused(&desc, CLATTN_ERR_UNSUPPORTED, 0, "k", "32-bit", "sdpa(seq_k 2^32)");
        RESET(desc, good), desc_tensors.q.dims[1] = over;
        expect_sdpa_refused(&desc, CLATTN_ERR_UNSUPPORTED, 0, "q", "32-bit", "sdpa(heads 2^32)");
        RESET(desc, good), desc_tensors.lse = f32_3(NULL, SB, over, SQ);
        expect_sdpa_refused(&desc, CLATTN_ERR_UNSUPPORTED, 0, "lse", "32-bit",
                            "sdpa(lse heads 2^32)");
        /* The scores of the unfused path overflow though every tensor fits. */
        const size_t side = (size_t)1 << 20;
        RESET(desc, good), desc.path = CLATTN_PATH_UNFUSED;
        desc_tensors.q = f32_4(NULL, side, side, side, 1);
        desc_tensors.k = f32_4(NULL, side, side, side, 1);
        desc_tensors.v = f32_4(NULL, side, side, side, 1);
        desc_tensors.out = f32_4(NULL, side, side, side, 1);
        expect_sdpa_refused(&desc, CLATTN_ERR_OVERFLOW, 0, "scores|rows", NULL,
                            "sdpa(unfused scores 2^80)");
        /* ... or fit size_t but not the device. */
        RESET(desc, good), desc.path = CLATTN_PATH_UNFUSED;
        desc_tensors.q = f32_4(NULL, 1024, 1, 4096, 1);
        desc_tensors.k = f32_4(NULL, 1024, 1, 4096, 1);
        desc_tensors.v = f32_4(NULL, 1024, 1, 4096, 1);
        desc_tensors.out = f32_4(NULL, 1024, 1, 4096, 1);
        expect_sdpa_refused(&desc, CLATTN_ERR_TOO_LARGE, 0, "scores", NULL,
                            "sdpa(unfused scores of 16 GiB)");
    }

    /* Paths: FUSED cannot return weights nor take head sizes over 576; lse needs the fused
     * kernel. */
    RESET(desc, good), desc.path = CLATTN_PATH_FUSED;
    desc_tensors.weights = f32_4(NULL, SB, SH, SQ, SK);
    expect_sdpa_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "weights", "FUSED",
                        "sdpa(FUSED with weights)");
    static const size_t large_heads[][2] = {{577, SDV}, {SDK, 577}, {600, 600}};
    for (int i = 0; i < COUNT_OF(large_heads); ++i) {
        RESET(desc, good), desc.path = CLATTN_PATH_FUSED;
        desc_tensors.q.dims[3] = desc_tensors.k.dims[3] = large_heads[i][0];
        desc_tensors.v.dims[3] = desc_tensors.out.dims[3] = large_heads[i][1];
        char call[64];
        snprintf(call, sizeof call, "sdpa(FUSED, head sizes %zu, %zu)", large_heads[i][0],
                 large_heads[i][1]);
        expect_sdpa_refused(&desc, CLATTN_ERR_UNSUPPORTED, 0, "FUSED", "576", call);
        desc.path = CLATTN_PATH_AUTO;
        plan = expect_sdpa_created(&desc, "sdpa(AUTO, head size over 576)");
        tu_expect(plan == NULL || !clattn_plan_is_fused(plan),
                  "AUTO with a head size over 576 chose the fused kernel");
        clattn_plan_release(plan);
        desc_tensors.lse = f32_3(NULL, SB, SH, SQ);
        expect_sdpa_refused(&desc, CLATTN_ERR_UNSUPPORTED, 0, "lse", NULL,
                            "sdpa(AUTO, head size over 576, lse)");
    }
    RESET(desc, good), desc.path = CLATTN_PATH_UNFUSED, desc_tensors.lse = f32_3(NULL, SB, SH, SQ);
    expect_sdpa_refused(&desc, CLATTN_ERR_UNSUPPORTED, 0, "lse", "fused", "sdpa(UNFUSED with lse)");
    RESET(desc, good), desc_tensors.lse = f32_3(NULL, SB, SH, SQ);
    desc_tensors.weights = f32_4(NULL, SB, SH, SQ, SK);
    expect_sdpa_refused(&desc, CLATTN_ERR_UNSUPPORTED, 0, "lse", NULL,
                        "sdpa(AUTO with weights and lse)");

    /* The unfused path reads rows: head_dim strides of 1; the weights' seq_k stride 1. */
    RESET(desc, good), desc.path = CLATTN_PATH_UNFUSED;
    desc_tensors.q = with_strides(desc_tensors.q, SH * SQ * SDK * 2, SQ * SDK * 2, SDK * 2, 2);
    expect_sdpa_refused(&desc, CLATTN_ERR_UNSUPPORTED, 0, "q", "stride",
                        "sdpa(UNFUSED, q head_dim stride 2)");
    desc.path = CLATTN_PATH_AUTO;
    plan = expect_sdpa_created(&desc, "sdpa(AUTO, q head_dim stride 2)");
    clattn_plan_release(plan);
    RESET(desc, good), desc_tensors.weights = f32_4(NULL, SB, SH, SQ, SK);
    desc_tensors.weights = with_strides(desc_tensors.weights, SH * SK * SQ, SK * SQ, 1, SQ);
    expect_sdpa_refused(&desc, CLATTN_ERR_UNSUPPORTED, 0, "weights", "stride",
                        "sdpa(weights transposed)");

    /* Everything refused above left the context as it was. */
    plan = expect_sdpa_created(&good, "sdpa(good)");
    tu_expect(plan == NULL || clattn_plan_is_fused(plan), "AUTO without weights is not fused");
    clattn_plan_release(plan);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- SDPA plans: execution ----------------------------------------------------------------- */

typedef struct sdpa_buffers {
    cl_mem q, k, v, out, weights, mask, kpm;
} sdpa_buffers;

static void release_sdpa_buffers(sdpa_buffers *b)
{
    cl_mem all[] = {b->q, b->k, b->v, b->out, b->weights, b->mask, b->kpm};
    for (int i = 0; i < COUNT_OF(all); ++i) {
        tu_release_mem(all[i]);
    }
}

/* Executes plan on tensors and expects it refused without touching the outputs. */
static void expect_execute_refused(clattn_plan *plan, const clattn_tensors *tensors,
                                   cl_command_queue queue, cl_mem workspace, clattn_status want,
                                   clattn_status alternative, const char *op, const char *names,
                                   const char *needle, const char *call)
{
    cl_event event = (cl_event)&event;
    clattn_status status = clattn_plan_execute(plan, tensors ? tensors->by_role : NULL,
                                               CLATTN_ROLE_COUNT, queue, workspace, 0, NULL, &event);
    expect_error_full(status, want, alternative, op, names, needle, call);
    tu_expect(event == NULL, "%s: *event not cleared on failure", call);
    if (status == CLATTN_SUCCESS && event != NULL) {
        clWaitForEvents(1, &event);
        clReleaseEvent(event);
    }
}

START_TEST(test_sdpa_execute_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("sdpa plan execution errors");
    clattn_ctx *ctx = tu_ctx();
    const size_t q_count = SB * SH * SQ * SDK, k_count = SB * SH * SK * SDK;
    const size_t v_count = SB * SH * SK * SDV, out_count = SB * SH * SQ * SDV;
    const size_t weights_count = SB * SH * SQ * SK;
    sdpa_buffers buf = {
        .q = tu_nan_buffer(q_count),
        .k = tu_nan_buffer(k_count),
        .v = tu_nan_buffer(v_count),
        .out = tu_nan_buffer(out_count),
        .weights = tu_nan_buffer(weights_count),
        .mask = tu_nan_buffer(SQ * SK),
        .kpm = nan_bytes(SB * SK),
    };
    /* An unfused plan with weights, an additive mask and a padding mask: every role bound. */
    clattn_tensors desc_tensors;
    clattn_sdpa_desc desc = sdpa_good(&desc_tensors);
    desc.path = CLATTN_PATH_UNFUSED;
    desc_tensors.weights = f32_4(NULL, SB, SH, SQ, SK);
    desc_tensors.attn_mask = f32_2(NULL, SQ, SK);
    desc_tensors.key_padding_mask = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_U8, 2, SB, SK, 0, 0);
    clattn_plan *plan = expect_sdpa_created(&desc, "sdpa(unfused, weights, masks)");
    clattn_tensors good = desc_tensors;
    good.q.mem = buf.q, good.k.mem = buf.k, good.v.mem = buf.v, good.out.mem = buf.out;
    good.weights.mem = buf.weights, good.attn_mask.mem = buf.mask;
    good.key_padding_mask.mem = buf.kpm;
    clattn_tensors t;
    cl_event event = (cl_event)&event;
    clattn_status status;
    if (plan == NULL) {
        release_sdpa_buffers(&buf);
        TU_END_TEST();
        return;
    }
    const size_t need = clattn_plan_workspace_size(plan);

    /* NULL plan and tensors. */
    status =
        clattn_plan_execute(NULL, good.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, &event);
    tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT && event == NULL,
              "execute(NULL plan): %s, event %p", clattn_status_string(status), (void *)event);
    expect_execute_refused(plan, NULL, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "sdpa",
                           "by_role", NULL, "execute(NULL by_role, 30 roles)");

    /* Tensors that differ from the plan, or lack a buffer. */
    t = good, t.q.mem = NULL;
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "sdpa", "q", NULL,
                           "execute(q without buffer)");
    t = good, t.out = absent;
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "sdpa", "out",
                           NULL, "execute(out absent)");
    t = good, t.k.dims[2] = SK - 1;
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "sdpa", "k", NULL,
                           "execute(k seq_k 3, planned 4)");
    t = good, t.v = with_strides(t.v, SH * SK * SDV, SK * SDV, SDV + 1, 1);
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "sdpa", "v",
                           "strides", "execute(v with other strides)");
    t = good, t.q.dtype = CLATTN_DTYPE_F16;
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "sdpa", "q", "F16",
                           "execute(q F16, planned F32)");
    t = good, t.q.rank = 5;
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "sdpa", "q", NULL,
                           "execute(q rank 5)");
    t = good, t.lse = f32_3(buf.out, SB, SH, SQ);
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "sdpa", "lse",
                           NULL, "execute(lse bound, not planned)");
    t = good, t.q_weight = f32_2(buf.q, SDK, SDK);
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "sdpa", "q_weight",
                           NULL, "execute(q_weight bound)");

    /* Buffers too small: one element short, offsets, strides larger than packed. */
    t = good, t.q.offset = 1;
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "sdpa", "q", NULL,
                           "execute(q offset 1)");
    t = good, t.k.offset = 2;
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "sdpa", "k", NULL,
                           "execute(k offset 2)");
    t = good, t.out.offset = out_count;
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "sdpa", "out",
                           NULL, "execute(out offset at end)");
    t = good, t.weights.offset = 1;
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "sdpa", "weights",
                           NULL, "execute(weights offset 1)");
    t = good, t.attn_mask.offset = 1;
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "sdpa",
                           "attn_mask", NULL, "execute(attn_mask offset 1)");
    t = good, t.key_padding_mask.offset = 1;
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "sdpa",
                           "key_padding_mask", NULL, "execute(key_padding_mask offset 1)");
    t = good, t.q.offset = SIZE_MAX / 2;
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, CLATTN_ERR_OVERFLOW,
                           "sdpa", "q", NULL, "execute(q offset SIZE_MAX/2)");
    t = good, t.q.offset = SIZE_MAX - 3;
    expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_OVERFLOW, 0, "sdpa", "q", NULL,
                           "execute(q offset SIZE_MAX - 3)");
    {
        /* A plan whose k has a row stride one larger than packed: the packed buffer is too
         * small through the strides. */
        clattn_tensors strided_tensors = desc_tensors;
        clattn_sdpa_desc strided = desc;
        CLATTN_BIND_ROLES(strided, strided_tensors);
        strided_tensors.k =
            with_strides(strided_tensors.k, SH * SK * (SDK + 1), SK * (SDK + 1), SDK + 1, 1);
        clattn_plan *strided_plan = expect_sdpa_created(&strided, "sdpa(k row stride 6)");
        t = good, t.k = strided_tensors.k, t.k.mem = buf.k;
        if (strided_plan != NULL)
            expect_execute_refused(strided_plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0,
                                   "sdpa", "k", "strides",
                                   "execute(k row stride 6, packed buffer)");
        clattn_plan_release(strided_plan);
    }

    /* The caller's workspace too small; a queue of another context; wait lists. */
    if (need > 0) {
        cl_mem small = tu_nan_buffer(need / sizeof(float) - 1);
        expect_execute_refused(plan, &good, NULL, small, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "sdpa",
                               "workspace", NULL, "execute(workspace 4 bytes short)");
        tu_release_mem(small);
    }
    status =
        clattn_plan_execute(plan, good.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 1, NULL, &event);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "sdpa", "num_wait",
                 "execute(num_wait 1, wait NULL)");
    tu_expect(event == NULL, "execute(num_wait 1, wait NULL) left *event set");
    cl_event marker = NULL;
    cl_int err = clEnqueueMarkerWithWaitList(clattn_ctx_queue(ctx), 0, NULL, &marker);
    tu_expect(err == CL_SUCCESS, "clEnqueueMarkerWithWaitList: %d", (int)err);
    status =
        clattn_plan_execute(plan, good.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, &marker, &event);
    expect_error_text(status, CLATTN_ERR_INVALID_ARGUMENT, "sdpa", "num_wait", "given",
                      "execute(num_wait 0, wait given)");
    if (marker != NULL) {
        clWaitForEvents(1, &marker);
        clReleaseEvent(marker);
    }

    expect_untouched(buf.out, out_count, "execute (refused calls)");
    expect_untouched(buf.weights, weights_count, "execute (refused calls), weights");
    clattn_plan_release(plan);
    release_sdpa_buffers(&buf);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- MHA plans ----------------------------------------------------------------------------- */

/* batch 2, seq 3, embed 8, heads 2; PyTorch layout, packed in_proj, out projection. */
enum { MB = 2, MS = 3, ME = 8, MH = 2 };

static clattn_mha_desc mha_good(clattn_tensors *out)
{
    clattn_mha_desc desc;
    clattn_mha_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.num_heads = MH;
    desc.layout = CLATTN_LAYOUT_TORCH;
    desc_tensors.q = f32_3(NULL, MB, MS, ME);
    desc_tensors.k = f32_3(NULL, MB, MS, ME);
    desc_tensors.v = f32_3(NULL, MB, MS, ME);
    desc_tensors.out = f32_3(NULL, MB, MS, ME);
    desc_tensors.in_proj_weight = f32_2(NULL, 3 * ME, ME);
    desc_tensors.in_proj_bias = f32_1(NULL, 3 * ME);
    desc_tensors.out_weight = f32_2(NULL, ME, ME);
    desc_tensors.out_bias = f32_1(NULL, ME);
    *out = desc_tensors;
    CLATTN_BIND_ROLES(desc, *out);
    return desc;
}

/* The same description with separate XW weights (q, k, v: ME -> ME) and no packed ones. */
static clattn_mha_desc mha_separate(clattn_tensors *out)
{
    clattn_tensors desc_tensors;
    clattn_mha_desc desc = mha_good(&desc_tensors);
    desc.layout = CLATTN_LAYOUT_XW;
    desc_tensors.in_proj_weight = absent;
    desc_tensors.in_proj_bias = absent;
    desc_tensors.q_weight = f32_2(NULL, ME, ME);
    desc_tensors.k_weight = f32_2(NULL, ME, ME);
    desc_tensors.v_weight = f32_2(NULL, ME, ME);
    *out = desc_tensors;
    CLATTN_BIND_ROLES(desc, *out);
    return desc;
}

static void expect_mha_refused(const clattn_mha_desc *desc, clattn_status want,
                               clattn_status alternative, const char *names, const char *needle,
                               const char *call)
{
    clattn_plan *plan = (clattn_plan *)&plan;
    clattn_status status = clattn_mha_plan_create(tu_ctx(), desc, &plan);
    expect_error_full(status, want, alternative, "mha", names, needle, call);
    tu_expect(status == CLATTN_SUCCESS || plan == NULL, "%s: failed but *out is not NULL", call);
    if (status == CLATTN_SUCCESS) {
        clattn_plan_release(plan);
    }
}

static clattn_plan *expect_mha_created(const clattn_mha_desc *desc, const char *call)
{
    clattn_plan *plan = NULL;
    clattn_status status = clattn_mha_plan_create(tu_ctx(), desc, &plan);
    tu_expect(status == CLATTN_SUCCESS && plan != NULL, "%s: %s: %s", call,
              clattn_status_string(status), clattn_last_error(tu_ctx()));
    return status == CLATTN_SUCCESS ? plan : NULL;
}

START_TEST(test_mha_create_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("mha plan creation errors");
    clattn_ctx *ctx = tu_ctx();
    clattn_tensors good_tensors, separate_tensors;
    const clattn_mha_desc good = mha_good(&good_tensors);
    const clattn_mha_desc separate = mha_separate(&separate_tensors);
    clattn_mha_desc desc;
    clattn_tensors desc_tensors = {0};
    clattn_plan *plan = (clattn_plan *)&plan;
    clattn_status status;

    status = clattn_mha_plan_create(NULL, &good, &plan);
    expect_null_ctx(status, "mha_plan_create(NULL ctx)");
    tu_expect(plan == NULL, "mha_plan_create(NULL ctx) left *out set");
    status = clattn_mha_plan_create(ctx, NULL, &plan);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha", "desc", "mha(NULL desc)");
    status = clattn_mha_plan_create(ctx, &good, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha", "out", "mha(NULL out)");

    /* Soft-capping, windows and ALiBi slopes (as SDPA's; ONNX's alignment is SDPA's only). */
    RESET(desc, good), desc.softcap = -1.0f;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "softcap", NULL, "mha(softcap -1)");
    RESET(desc, good), desc.softcap = NAN;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "softcap", NULL, "mha(softcap NAN)");
    RESET(desc, good), desc.window_align = CLATTN_CAUSAL_ONNX;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "window_align", NULL,
                       "mha(window_align ONNX)");
    RESET(desc, good), desc.causal = CLATTN_CAUSAL_TOP_LEFT;
    desc.window_align = CLATTN_CAUSAL_BOTTOM_RIGHT;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "causal", "same alignment",
                       "mha(causal and window aligned apart)");
    RESET(desc, good), desc_tensors.alibi_slopes = f32_1(NULL, desc.num_heads + 1);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "alibi_slopes", "(heads)",
                       "mha(alibi_slopes of one head too many)");
    RESET(desc, good), desc_tensors.alibi_slopes = f32_1(NULL, desc.num_heads);
    desc.softcap = 2.0f, desc.window_align = CLATTN_CAUSAL_TOP_LEFT, desc.window_left = 3;
    desc.window_right = -1;
    clattn_plan_release(expect_mha_created(&desc, "mha(alibi, softcap and a window)"));
    RESET(desc, good), desc.struct_size = sizeof(clattn_mha_desc) + sizeof(size_t);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "struct_size", "clattn_mha_desc",
                       "mha(struct_size from a newer header)");

    /* Inputs and outputs absent. */
    RESET(desc, good), desc_tensors.q = absent;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "query", NULL, "mha(query absent)");
    RESET(desc, good), desc_tensors.k = absent;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "key", NULL, "mha(key absent)");
    RESET(desc, good), desc_tensors.v = absent;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "value", NULL, "mha(value absent)");
    RESET(desc, good), desc_tensors.out = absent;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "out", NULL, "mha(out absent)");
    RESET(desc, good), desc_tensors.q.rank = 4, desc_tensors.q.dims[3] = 1;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, CLATTN_ERR_INVALID_SHAPE, "query",
                       "rank", "mha(query rank 4)");
    RESET(desc, good), desc_tensors.q.rank = 0, desc_tensors.q.mem = NULL;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "query", NULL, "mha(query rank 0)");
    RESET(desc, good), desc_tensors.k.rank = 5;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "key", "rank", "mha(key rank 5)");

    /* Weights: none, packed with XW, packed and separate, half a set, biases without their
     * weights. */
    RESET(desc, good), desc_tensors.in_proj_weight = absent, desc_tensors.in_proj_bias = absent;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "q_weight|in_proj_weight", NULL,
                       "mha(no projection weights)");
    RESET(desc, good), desc.layout = CLATTN_LAYOUT_XW;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "in_proj_weight|layout", NULL,
                       "mha(in_proj_weight with layout XW)");
    static const struct {
        size_t field;
        const char *name;
    } with_packed[] = {
        {offsetof(clattn_tensors, q_weight), "q_weight"},
        {offsetof(clattn_tensors, k_weight), "k_weight"},
        {offsetof(clattn_tensors, v_weight), "v_weight"},
        {offsetof(clattn_tensors, q_bias), "q_bias"},
        {offsetof(clattn_tensors, k_bias), "k_bias"},
        {offsetof(clattn_tensors, v_bias), "v_bias"},
    };
    for (int i = 0; i < COUNT_OF(with_packed); ++i) {
        RESET(desc, good);
        clattn_tensor *extra = (clattn_tensor *)((char *)&desc_tensors + with_packed[i].field);
        *extra = i < 3 ? f32_2(NULL, ME, ME) : f32_1(NULL, ME);
        char call[64];
        snprintf(call, sizeof call, "mha(in_proj_weight and %s)", with_packed[i].name);
        expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "in_proj_weight|in_proj_bias",
                           NULL, call);
    }
    RESET(desc, separate), desc_tensors.k_weight = absent;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "k_weight", NULL,
                       "mha(q_weight and v_weight without k_weight)");
    RESET(desc, separate), desc_tensors.v_weight = absent;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "v_weight", NULL,
                       "mha(q_weight and k_weight without v_weight)");
    RESET(desc, separate), desc_tensors.in_proj_bias = f32_1(NULL, 3 * ME);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "in_proj_bias", NULL,
                       "mha(in_proj_bias without in_proj_weight)");
    RESET(desc, good), desc_tensors.out_weight = absent;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "out_bias|out_weight", NULL,
                       "mha(out_bias without out_weight)");

    /* Enums. */
    RESET(desc, good), desc.layout = (clattn_weight_layout)5;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "layout", NULL, "mha(layout 5)");
    RESET(desc, good), desc.norm = (clattn_norm)9;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "norm", NULL, "mha(norm 9)");
    RESET(desc, good), desc.causal = (clattn_causal)7;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "causal", NULL, "mha(causal 7)");
    RESET(desc, good), desc.causal = CLATTN_CAUSAL_ONNX; /* SDPA only: MHA has no cache */
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "causal", "MHA", "mha(causal ONNX)");
    RESET(desc, good), desc.path = (clattn_path)-1;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "path", NULL, "mha(path -1)");
    RESET(desc, good), desc.need_weights = (clattn_need_weights)4;
    desc_tensors.weights = f32_4(NULL, MB, MH, MS, MS);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "need_weights", NULL,
                       "mha(need_weights 4)");

    /* The weights returned: wanted but absent, given but not wanted, wrong shape, FUSED. */
    RESET(desc, good), desc.need_weights = CLATTN_WEIGHTS_PER_HEAD;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "weights", NULL,
                       "mha(PER_HEAD without the weights tensor)");
    RESET(desc, good), desc_tensors.weights = f32_3(NULL, MB, MS, MS);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "weights|need_weights", NULL,
                       "mha(weights given, need_weights NONE)");
    RESET(desc, good), desc.need_weights = CLATTN_WEIGHTS_AVERAGED;
    desc_tensors.weights = f32_4(NULL, MB, MH, MS, MS);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "weights", "(2, 3, 3)",
                       "mha(AVERAGED with per-head weights)");
    RESET(desc, good), desc.need_weights = CLATTN_WEIGHTS_PER_HEAD;
    desc_tensors.weights = f32_3(NULL, MB, MS, MS);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "weights", "(2, 2, 3, 3)",
                       "mha(PER_HEAD with averaged weights)");
    RESET(desc, good), desc.need_weights = CLATTN_WEIGHTS_AVERAGED, desc.path = CLATTN_PATH_FUSED;
    desc_tensors.weights = f32_3(NULL, MB, MS, MS);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "weights", "FUSED",
                       "mha(FUSED with need_weights)");
    RESET(desc, good), desc_tensors.lse = f32_3(NULL, MB, MH, MS);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "lse", NULL, "mha(lse given)");

    /* Shapes. */
    RESET(desc, good), desc.num_heads = 3;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "num_heads", NULL,
                       "mha(E = 8 not divisible by H = 3)");
    RESET(desc, good), desc.num_heads = 0;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "num_heads", NULL, "mha(num_heads 0)");
    RESET(desc, good), desc.num_kv_heads = 1;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "num_kv_heads|in_proj_weight",
                       "separate", "mha(num_kv_heads 1 with the packed in_proj_weight)");
    RESET(desc, separate), desc.num_kv_heads = 0; /* num_heads before 0.7 */
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "num_kv_heads", "must divide",
                       "mha(num_kv_heads 0)");
    RESET(desc, separate), desc.num_kv_heads = 3;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "num_kv_heads|num_heads",
                       "must divide", "mha(num_kv_heads 3, num_heads 2)");
    RESET(desc, separate),
        desc.num_kv_heads = 1; /* k_weight still E x E: its heads' width is E / 2 */
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "k_weight", "(8, 4)",
                       "mha(num_kv_heads 1, k_weight 8 x 8)");
    RESET(desc, separate), desc.num_kv_heads = 1;
    desc_tensors.q_weight = f32_2(NULL, ME, 3), desc_tensors.k_weight = f32_2(NULL, ME, 1);
    desc_tensors.v_weight = f32_2(NULL, ME, ME / MH);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "q_weight", "divisible",
                       "mha(num_kv_heads 1, q_weight 8 x 3: not whole heads)");
    RESET(desc, separate), desc.num_kv_heads = 1;
    desc_tensors.k_weight = f32_2(NULL, ME, ME / MH),
    desc_tensors.v_weight = f32_2(NULL, ME, ME / MH);
    clattn_plan_release(expect_mha_created(&desc, "mha(num_kv_heads 1: k/v weights 8 x 4)"));
    RESET(desc, good), desc_tensors.q.dims[2] = 0;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "query", NULL, "mha(embed_dim 0)");
    RESET(desc, good), desc_tensors.k.dims[1] = 0, desc_tensors.v.dims[1] = 0;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "key", NULL, "mha(seq_k 0)");
    RESET(desc, good), desc_tensors.q.dims[0] = 0;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "query", NULL, "mha(batch 0)");
    RESET(desc, good), desc_tensors.k.dims[0] = MB + 1, desc_tensors.v.dims[0] = MB + 1;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "key", "batch=2",
                       "mha(key batch 3, query 2)");
    RESET(desc, good), desc_tensors.v.dims[1] = MS + 1;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "value", "seq=3",
                       "mha(value seq 4, key 3)");
    RESET(desc, good), desc_tensors.out.dims[2] = ME + 1;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "out", "(2, 3, 8)", "mha(out width 9)");
    RESET(desc, good), desc_tensors.k.dims[2] = ME / 2, desc_tensors.v.dims[2] = ME / 2;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, CLATTN_ERR_INVALID_ARGUMENT,
                       "kdim|in_proj_weight", NULL, "mha(in_proj_weight with kdim 4)");
    RESET(desc, good), desc_tensors.in_proj_weight = f32_2(NULL, 3 * ME, ME + 1);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "in_proj_weight", "(24, 8)",
                       "mha(in_proj_weight (24, 9))");
    RESET(desc, good), desc_tensors.in_proj_bias = f32_1(NULL, 3 * ME - 1);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "in_proj_bias", "(24)",
                       "mha(in_proj_bias 23)");
    RESET(desc, good), desc_tensors.out_bias = f32_1(NULL, ME + 1);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "out_bias", "(8)", "mha(out_bias 9)");
    RESET(desc, good), desc_tensors.out_weight = f32_2(NULL, ME, ME - 1);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "out_weight|out", NULL,
                       "mha(out_weight (8, 7))");
    RESET(desc, separate), desc_tensors.k_weight = f32_2(NULL, ME, ME / 2);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "k_weight", "(8, 8)",
                       "mha(k_weight width 4, q_weight 8)");
    RESET(desc, separate), desc.num_heads = 4, desc_tensors.q_weight = f32_2(NULL, ME, 6);
    desc_tensors.k_weight = f32_2(NULL, ME, 6);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "qk_dim|num_heads", NULL,
                       "mha(qk_dim 6 not divisible by 4 heads)");
    RESET(desc, separate), desc_tensors.v_weight = f32_2(NULL, ME, 3);
    desc_tensors.out_weight = f32_2(NULL, 3, ME);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "v_dim|num_heads", NULL,
                       "mha(v_dim 3 not divisible by 2 heads)");

    /* Dtypes. */
    RESET(desc, good), desc_tensors.q.dtype = CLATTN_DTYPE_U8;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "query", "U8", "mha(query U8)");
    RESET(desc, good), desc_tensors.in_proj_weight.dtype = CLATTN_DTYPE_U8;
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "in_proj_weight", "U8",
                       "mha(in_proj_weight U8)");
    RESET(desc, good), desc_tensors.key_padding_mask = f32_2(NULL, MB, MS);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_ARGUMENT, 0, "key_padding_mask", "F32",
                       "mha(key_padding_mask F32)");
    RESET(desc, separate), desc_tensors.q_bias = with_dtype(f32_1(NULL, ME), CLATTN_DTYPE_F16);
    expect_mha_refused(&desc, CLATTN_ERR_UNSUPPORTED, CLATTN_ERR_INVALID_ARGUMENT, "q_bias", "F16",
                       "mha(q_bias F16)");
    RESET(desc, good), desc_tensors.attn_mask = f32_2(NULL, MS + 1, MS);
    expect_mha_refused(&desc, CLATTN_ERR_INVALID_SHAPE, 0, "attn_mask", "(2, 2, 3, 3)",
                       "mha(attn_mask (4, 3))");

    /* Overflow of the sizes computed from the layouts. */
    if (SIZE_MAX > UINT32_MAX) {
        const size_t limit = UINT32_MAX;
        RESET(desc, good), desc_tensors.k = f32_3(NULL, MB, limit, limit);
        desc_tensors.v = f32_3(NULL, MB, limit, ME);
        expect_mha_refused(&desc, CLATTN_ERR_OVERFLOW, 0, "key", NULL,
                           "mha(key 2 x (2^32-1)^2 elements)");
        /* Every tensor fits, the projections (batch * seq_q * qk_dim) do not. */
        const size_t rows = (size_t)1 << 30, seq = (size_t)1 << 31;
        RESET(desc, separate), desc_tensors.out_weight = absent, desc_tensors.out_bias = absent;
        desc.num_heads = 1;
        desc_tensors.q = f32_3(NULL, rows, seq, 1);
        desc_tensors.k = f32_3(NULL, rows, 1, 1);
        desc_tensors.v = f32_3(NULL, rows, 1, 1);
        desc_tensors.q_weight = f32_2(NULL, 1, limit);
        desc_tensors.k_weight = f32_2(NULL, 1, limit);
        desc_tensors.v_weight = f32_2(NULL, 1, 1);
        desc_tensors.out = f32_3(NULL, rows, seq, 1);
        expect_mha_refused(&desc, CLATTN_ERR_OVERFLOW, 0, "projections", NULL,
                           "mha(projections overflow)");
        RESET(desc, good), desc_tensors.q.dims[1] = (size_t)UINT32_MAX + 1;
        expect_mha_refused(&desc, CLATTN_ERR_UNSUPPORTED, 0, "query", "32-bit", "mha(seq_q 2^32)");
    }

    /* The workspace of the unfused path (per-head weights of 2 x 2 x 32768^2 floats) is
     * more than any device allocates at once. */
    RESET(desc, good), desc.need_weights = CLATTN_WEIGHTS_AVERAGED;
    desc_tensors.q = f32_3(NULL, MB, 32768, ME), desc_tensors.out = f32_3(NULL, MB, 32768, ME);
    desc_tensors.k = f32_3(NULL, MB, 32768, ME), desc_tensors.v = f32_3(NULL, MB, 32768, ME);
    desc_tensors.weights = f32_3(NULL, MB, 32768, 32768);
    expect_mha_refused(&desc, CLATTN_ERR_TOO_LARGE, 0, "scores|workspace", NULL,
                       "mha(16 GiB of per-head weights)");

    plan = expect_mha_created(&good, "mha(good)");
    clattn_plan_release(plan);
    plan = expect_mha_created(&separate, "mha(separate weights)");
    clattn_plan_release(plan);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

typedef struct mha_buffers {
    cl_mem query, out, weights, in_proj, in_bias, out_weight, out_bias, small;
} mha_buffers;

START_TEST(test_mha_execute_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("mha plan execution errors");
    mha_buffers buf = {
        .query = tu_nan_buffer(MB * MS * ME),
        .out = tu_nan_buffer(MB * MS * ME),
        .weights = tu_nan_buffer(MB * MS * MS),
        .in_proj = tu_nan_buffer(3 * ME * ME),
        .in_bias = tu_nan_buffer(3 * ME),
        .out_weight = tu_nan_buffer(ME * ME),
        .out_bias = tu_nan_buffer(ME),
        .small = tu_nan_buffer(ME - 1),
    };
    clattn_tensors desc_tensors;
    clattn_mha_desc desc = mha_good(&desc_tensors);
    desc.need_weights = CLATTN_WEIGHTS_AVERAGED;
    desc_tensors.weights = f32_3(NULL, MB, MS, MS);
    clattn_plan *plan = expect_mha_created(&desc, "mha(averaged weights)");
    clattn_tensors good = desc_tensors, t;
    good.q.mem = good.k.mem = good.v.mem = buf.query;
    good.out.mem = buf.out, good.weights.mem = buf.weights;
    good.in_proj_weight.mem = buf.in_proj, good.in_proj_bias.mem = buf.in_bias;
    good.out_weight.mem = buf.out_weight, good.out_bias.mem = buf.out_bias;
    if (plan != NULL) {
        t = good, t.out.offset = 1;
        expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "mha", "out",
                               NULL, "mha execute(out offset 1)");
        t = good, t.q.offset = 2;
        expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "mha", "query",
                               NULL, "mha execute(query offset 2)");
        t = good, t.v.offset = 1;
        expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "mha", "value",
                               NULL, "mha execute(value offset 1)");
        t = good, t.in_proj_weight.offset = 1;
        expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "mha",
                               "in_proj_weight", NULL, "mha execute(in_proj_weight offset 1)");
        t = good, t.in_proj_bias.mem = buf.small;
        expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "mha",
                               "in_proj_bias", NULL, "mha execute(in_proj_bias too small)");
        t = good, t.out_bias.mem = buf.small;
        expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "mha",
                               "out_bias", NULL, "mha execute(out_bias one float short)");
        t = good, t.out_weight.offset = 3;
        expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "mha",
                               "out_weight", NULL, "mha execute(out_weight offset 3)");
        t = good, t.weights.offset = 1;
        expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "mha",
                               "weights", NULL, "mha execute(weights offset 1)");
        t = good, t.weights = absent;
        expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "mha",
                               "weights", NULL, "mha execute(weights absent)");
        t = good, t.out_weight.dims[0] = ME - 1;
        expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "mha",
                               "out_weight", NULL, "mha execute(out_weight (7, 8))");
        t = good, t.q_bias = f32_1(buf.out_bias, ME);
        expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "mha",
                               "q_bias", NULL, "mha execute(q_bias bound, not planned)");
        expect_untouched(buf.out, MB * MS * ME, "mha execute (refused calls)");
        expect_untouched(buf.weights, MB * MS * MS, "mha execute (refused calls), weights");
    }
    clattn_plan_release(plan);
    cl_mem all[] = {buf.query,   buf.out,        buf.weights,  buf.in_proj,
                    buf.in_bias, buf.out_weight, buf.out_bias, buf.small};
    for (int i = 0; i < COUNT_OF(all); ++i) {
        tu_release_mem(all[i]);
    }
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- the host API ------------------------------------------------------------------------- */

START_TEST(test_attention_host_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("attention host errors");
    clattn_ctx *ctx = tu_ctx();
    clattn_attention_host_desc good;
    clattn_attention_host_desc_init(&good);
    good.batch = 1, good.heads = 2, good.seq_q = 3, good.seq_k = 4;
    good.head_dim_qk = 5, good.head_dim_v = 6;
    float *q = tu_random_floats(2 * 3 * 5), *k = tu_random_floats(2 * 4 * 5);
    float *v = tu_random_floats(2 * 4 * 6), *out = tu_nan_floats(2 * 3 * 6);
    float *weights = tu_nan_floats(2 * 3 * 4);
    clattn_attention_host_desc desc;
    clattn_status status;

    status = clattn_attention_host(NULL, &good, q, k, v, NULL, out, NULL);
    expect_null_ctx(status, "clattn_attention_host(NULL ctx)");
    status = clattn_attention_host(ctx, NULL, q, k, v, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "desc", "host NULL desc");
    status = clattn_attention_host(ctx, &good, NULL, k, v, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "q", "host q NULL");
    status = clattn_attention_host(ctx, &good, q, NULL, v, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "k", "host k NULL");
    status = clattn_attention_host(ctx, &good, q, k, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "v", "host v NULL");
    status = clattn_attention_host(ctx, &good, q, k, v, NULL, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "out", "host out NULL");
    desc = good, desc.struct_size = sizeof desc / 2;
    status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "struct_size",
                 "host struct_size");

    static const char *const field_names[] = {"batch", "heads",       "seq_q",
                                              "seq_k", "head_dim_qk", "head_dim_v"};
    for (int field = 0; field < 6; ++field) {
        desc = good;
        size_t *fields[] = {&desc.batch, &desc.heads,       &desc.seq_q,
                            &desc.seq_k, &desc.head_dim_qk, &desc.head_dim_v};
        *fields[field] = 0;
        char call[64];
        snprintf(call, sizeof call, "host %s = 0", field_names[field]);
        status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
        expect_error(status, CLATTN_ERR_INVALID_SHAPE, "attention", field_names[field], call);
    }
    desc = good, desc.norm = (clattn_norm)3;
    status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "norm", "host norm 3");
    desc = good, desc.causal = (clattn_causal)9;
    status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "causal", "host causal 9");
    desc = good, desc.causal = CLATTN_CAUSAL_OFFSET;
    status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "diag_offset",
                 "host causal OFFSET (no diagonal)");
    desc = good, desc.path = (clattn_path)3;
    status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "path", "host path 3");
    desc = good, desc.path = CLATTN_PATH_FUSED;
    status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, weights);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "weights",
                 "host FUSED with weights");
    desc = good, desc.scale = -INFINITY;
    status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "scale", "host scale -inf");
    if (SIZE_MAX > UINT32_MAX) {
        desc = good, desc.seq_q = (size_t)UINT32_MAX + 1;
        status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
        expect_error_text(status, CLATTN_ERR_UNSUPPORTED, "attention", "seq_q|q", "32-bit",
                          "host seq_q = 2^32");
        desc = good, desc.batch = (size_t)1 << 31, desc.heads = (size_t)1 << 31;
        desc.seq_q = (size_t)1 << 31;
        status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
        expect_error(status, CLATTN_ERR_OVERFLOW, "attention", "q|seq_q",
                     "host q of 2^93 * 5 elements");
    }
    tu_expect_nan_outside("host out after the refused calls", out, 2 * 3 * 6, 0, 0);
    tu_expect_nan_outside("host weights after the refused calls", weights, 2 * 3 * 4, 0, 0);

    free(weights);
    free(out);
    free(v);
    free(k);
    free(q);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

START_TEST(test_mha_host_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("mha_forward_host errors");
    clattn_ctx *ctx = tu_ctx();
    const size_t batch = 1, seq = 3, embed = 4;
    float *query = tu_random_floats(batch * 5 * embed);
    float *key = tu_random_floats(batch * 5 * embed);
    float *weight = tu_random_floats(3 * embed * embed);
    float *out = tu_nan_floats(batch * 5 * embed);
    clattn_mha_host_desc good;
    clattn_mha_host_desc_init(&good);
    good.batch = batch, good.seq_q = seq, good.seq_k = seq, good.embed_dim = embed;
    good.num_heads = 2, good.layout = CLATTN_LAYOUT_TORCH;
    clattn_mha_host_weights weights = {0};
    weights.in_proj_weight = weight;
    const clattn_mha_host_weights separate = {
        .q_weight = weight, .k_weight = weight, .v_weight = weight};
    clattn_mha_host_desc desc;
    clattn_status status;

    status = clattn_mha_forward_host(NULL, &good, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_null_ctx(status, "clattn_mha_forward_host(NULL ctx)");
    status = clattn_mha_forward_host(ctx, NULL, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "desc", "host NULL desc");
    status = clattn_mha_forward_host(ctx, &good, NULL, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "weights",
                 "host NULL weights");
    status = clattn_mha_forward_host(ctx, &good, &weights, NULL, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "query", "host NULL query");
    status = clattn_mha_forward_host(ctx, &good, &weights, query, NULL, NULL, NULL, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "out", "host NULL out");
    desc = good, desc.struct_size = 0;
    status = clattn_mha_forward_host(ctx, &desc, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "struct_size",
                 "host struct_size 0");
    desc = good, desc.need_weights = CLATTN_WEIGHTS_AVERAGED;
    status = clattn_mha_forward_host(ctx, &desc, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "attn_weights",
                 "host AVERAGED without attn_weights");
    desc = good, desc.need_weights = CLATTN_WEIGHTS_PER_HEAD;
    status = clattn_mha_forward_host(ctx, &desc, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "attn_weights",
                 "host PER_HEAD without attn_weights");
    static const char *const field_names[] = {"batch", "seq_q", "seq_k", "embed_dim", "num_heads"};
    for (int field = 0; field < 5; ++field) {
        desc = good;
        size_t *fields[] = {&desc.batch, &desc.seq_q, &desc.seq_k, &desc.embed_dim,
                            &desc.num_heads};
        *fields[field] = 0;
        char call[64];
        snprintf(call, sizeof call, "host %s = 0", field_names[field]);
        status = clattn_mha_forward_host(ctx, &desc, &weights, query, key, key, NULL, out, NULL);
        expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", field_names[field], call);
    }
    desc = good, desc.num_heads = 3;
    status = clattn_mha_forward_host(ctx, &desc, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "num_heads",
                 "host E = 4 not divisible by H = 3");
    desc = good, desc.layout = CLATTN_LAYOUT_XW;
    status = clattn_mha_forward_host(ctx, &desc, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "in_proj_weight|layout",
                 "host in_proj_weight with layout XW");
    desc = good, desc.layout = (clattn_weight_layout)7;
    status = clattn_mha_forward_host(ctx, &desc, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "layout", "host layout 7");
    desc = good, desc.need_weights = (clattn_need_weights)5;
    status = clattn_mha_forward_host(ctx, &desc, &weights, query, NULL, NULL, NULL, out, out);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "need_weights",
                 "host need_weights 5");
    desc = good, desc.norm = (clattn_norm)2;
    status = clattn_mha_forward_host(ctx, &desc, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "norm", "host norm 2");

    /* Self-attention: key or value omitted (or the query itself) contradicting the desc. */
    desc = good, desc.kdim = 2, desc.layout = CLATTN_LAYOUT_XW;
    status = clattn_mha_forward_host(ctx, &desc, &separate, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "kdim|key",
                 "host key omitted with kdim = 2");
    desc = good, desc.vdim = 2, desc.layout = CLATTN_LAYOUT_XW;
    status = clattn_mha_forward_host(ctx, &desc, &separate, query, key, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "vdim|value",
                 "host value omitted with vdim = 2");
    desc = good, desc.seq_k = 5;
    status = clattn_mha_forward_host(ctx, &desc, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "seq_k",
                 "host key omitted with seq_k != seq_q");
    desc = good, desc.seq_k = 5, desc.layout = CLATTN_LAYOUT_XW;
    status = clattn_mha_forward_host(ctx, &desc, &separate, query, key, query, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "seq_k",
                 "host value = query with seq_k != seq_q");

    /* Overflow: a dim over 32 bits, and the parameters to stage overflowing together though
     * each fits (four weights just under 2^62 elements each, plus the biases). With every dim
     * under 2^32 that needs projections of 4 x 2^30 floats, so a device that cannot allocate
     * them refuses the workspace first (TOO_LARGE): either way a clean refusal. */
    if (SIZE_MAX > UINT32_MAX) {
        desc = good, desc.seq_q = desc.seq_k = (size_t)UINT32_MAX + 1;
        status = clattn_mha_forward_host(ctx, &desc, &weights, query, NULL, NULL, NULL, out, NULL);
        expect_error_text(status, CLATTN_ERR_UNSUPPORTED, "mha_forward", "seq_q|query", "32-bit",
                          "host seq_q = 2^32");
        float dummy[4] = {0};
        const clattn_mha_host_weights all = {.q_weight = dummy,
                                             .k_weight = dummy,
                                             .v_weight = dummy,
                                             .q_bias = dummy,
                                             .k_bias = dummy,
                                             .v_bias = dummy,
                                             .out_weight = dummy,
                                             .out_bias = dummy};
        desc = good, desc.layout = CLATTN_LAYOUT_XW, desc.num_heads = 1, desc.seq_q = 1;
        desc.seq_k = 1, desc.embed_dim = desc.kdim = desc.vdim = UINT32_MAX;
        desc.qk_dim = desc.v_dim = (size_t)1 << 30;
        status = clattn_mha_forward_host(ctx, &desc, &all, dummy, dummy, dummy, NULL, dummy, NULL);
        expect_error_full(status, CLATTN_ERR_OVERFLOW, CLATTN_ERR_TOO_LARGE, "mha_forward",
                          "weights|parameters|workspace", NULL,
                          "host: the staged parameters overflow together");
    }
    tu_expect_nan_outside("host out after the refused calls", out, batch * 5 * embed, 0, 0);

    free(out);
    free(weight);
    free(key);
    free(query);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* A host call so large that its device buffers exceed what the device can hold, though no size
 * overflows: a clean error (TOO_LARGE; HOST_MEMORY or UNSUPPORTED for a library limit), never a
 * crash or a read of the (small) inputs. */
START_TEST(test_host_too_large)
{
    TU_BEGIN_TEST();
    tu_set_case("attention host with a 2^34-element q");
    float q[4] = {0}, k[4] = {0}, v[4] = {0}, out[4] = {0};
    clattn_attention_host_desc desc;
    clattn_attention_host_desc_init(&desc);
    desc.batch = (size_t)1 << 20, desc.heads = 1, desc.seq_q = (size_t)1 << 12;
    desc.seq_k = 1, desc.head_dim_qk = 4, desc.head_dim_v = 1;
    clattn_status status = clattn_attention_host(tu_ctx(), &desc, q, k, v, NULL, out, NULL);
    if (status == CLATTN_ERR_HOST_MEMORY || status == CLATTN_ERR_UNSUPPORTED) {
        status = CLATTN_ERR_TOO_LARGE; /* acceptable too; the message is still checked */
    }
    expect_error(status, CLATTN_ERR_TOO_LARGE, "attention", NULL, "attention host 2^34 floats");
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- contexts and statuses ---------------------------------------------------------------- */

START_TEST(test_context_errors)
{
    TU_BEGIN_TEST();
    static const char *const bad_specs[] = {"9:9", "banana", "0:999", "999:0", "gpu:x"};
    for (int i = 0; i < COUNT_OF(bad_specs); ++i) {
        tu_set_case("clattn_ctx_create('%s')", bad_specs[i]);
        char message[512];
        memset(message, 0, sizeof message);
        clattn_ctx *ctx = (clattn_ctx *)&message; /* must be overwritten with NULL */
        clattn_status status = clattn_ctx_create(bad_specs[i], &ctx, message, sizeof message);
        tu_expect(status == CLATTN_ERR_NO_DEVICE || status == CLATTN_ERR_INVALID_ARGUMENT,
                  "clattn_ctx_create('%s') returned %s", bad_specs[i],
                  clattn_status_string(status));
        tu_expect(ctx == NULL, "clattn_ctx_create('%s') failed but *out is not NULL", bad_specs[i]);
        tu_expect(strstr(message, bad_specs[i]) != NULL,
                  "clattn_ctx_create('%s'): message '%s' does not name the spec", bad_specs[i],
                  message);
        if (status == CLATTN_SUCCESS) {
            clattn_ctx_release(ctx);
        }
    }

    tu_set_case("clattn_ctx_create with a bad CLATTN_DEVICE");
    const char *saved = getenv("CLATTN_DEVICE");
    char *saved_copy = saved != NULL ? strdup(saved) : NULL;
    setenv("CLATTN_DEVICE", "banana", 1);
    clattn_ctx *from_env = NULL;
    char message[256] = "";
    clattn_status status = clattn_ctx_create(NULL, &from_env, message, sizeof message);
    tu_expect(status == CLATTN_ERR_NO_DEVICE || status == CLATTN_ERR_INVALID_ARGUMENT,
              "CLATTN_DEVICE=banana: clattn_ctx_create(NULL) returned %s",
              clattn_status_string(status));
    tu_expect(strstr(message, "CLATTN_DEVICE") != NULL, "CLATTN_DEVICE=banana: message '%s'",
              message);
    clattn_ctx_release(from_env);
    if (saved_copy != NULL) {
        setenv("CLATTN_DEVICE", saved_copy, 1);
    } else {
        unsetenv("CLATTN_DEVICE");
    }
    free(saved_copy);

    tu_set_case("clattn_ctx_create message handling");
    /* A message buffer of 8 bytes is written NUL-terminated and not beyond. */
    char small[16];
    memset(small, 'x', sizeof small);
    clattn_ctx *ctx = NULL;
    status = clattn_ctx_create("banana", &ctx, small, 8);
    tu_expect(status != CLATTN_SUCCESS, "clattn_ctx_create('banana') succeeded");
    tu_expect(memchr(small, '\0', 8) != NULL, "message of size 8 not NUL-terminated");
    tu_expect(small[8] == 'x' && small[15] == 'x', "message written past message_size");
    clattn_ctx_release(ctx);
    ctx = NULL;
    status = clattn_ctx_create("banana", &ctx, NULL, 0);
    tu_expect(status != CLATTN_SUCCESS && ctx == NULL, "clattn_ctx_create('banana', NULL msg)");
    char out_message[128] = "";
    status = clattn_ctx_create("banana", NULL, out_message, sizeof out_message);
    tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT && tu_mentions_word(out_message, "out"),
              "clattn_ctx_create(out NULL) returned %s '%s'", clattn_status_string(status),
              out_message);
    status = clattn_ctx_create(NULL, NULL, NULL, 0);
    tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT,
              "clattn_ctx_create(NULL, out NULL) returned %s", clattn_status_string(status));

    tu_set_case("clattn_ctx_create_from_queue(NULL)");
    char queue_message[256] = "";
    ctx = (clattn_ctx *)&queue_message;
    status = clattn_ctx_create_from_queue(NULL, &ctx, queue_message, sizeof queue_message);
    tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT, "from_queue(NULL) returned %s",
              clattn_status_string(status));
    tu_expect(ctx == NULL, "from_queue(NULL) failed but *out is not NULL");
    tu_expect(tu_mentions_word(queue_message, "queue"), "from_queue(NULL): message '%s'",
              queue_message);

    tu_set_case("NULL handles");
    clattn_ctx_release(NULL);
    clattn_plan_release(NULL);
    clattn_sdpa_desc_init(NULL);
    clattn_mha_desc_init(NULL);
    clattn_attention_host_desc_init(NULL);
    clattn_mha_host_desc_init(NULL);
    tu_expect(clattn_last_error(NULL) != NULL, "clattn_last_error(NULL) is NULL");
    tu_expect(clattn_finish(NULL) == CLATTN_ERR_INVALID_ARGUMENT, "clattn_finish(NULL) returned %s",
              clattn_status_string(clattn_finish(NULL)));
    tu_expect(clattn_ctx_set_workspace_limit(NULL, 1) == CLATTN_ERR_INVALID_ARGUMENT,
              "clattn_ctx_set_workspace_limit(NULL) is not INVALID_ARGUMENT");
    tu_expect(clattn_ctx_workspace_bytes(NULL) == 0, "clattn_ctx_workspace_bytes(NULL) != 0");
    tu_expect(clattn_plan_workspace_size(NULL) == 0, "clattn_plan_workspace_size(NULL) != 0");
    tu_expect(clattn_plan_is_fused(NULL) == 0, "clattn_plan_is_fused(NULL) != 0");
    tu_expect(clattn_ctx_cl_context(NULL) == NULL && clattn_ctx_queue(NULL) == NULL &&
                  clattn_ctx_device(NULL) == NULL,
              "an accessor of a NULL context is not NULL");

    tu_set_case("clattn_dtype_size");
    tu_expect(
        clattn_dtype_size(CLATTN_DTYPE_F32) == 4 && clattn_dtype_size(CLATTN_DTYPE_F16) == 2 &&
            clattn_dtype_size(CLATTN_DTYPE_BF16) == 2 && clattn_dtype_size(CLATTN_DTYPE_U8) == 1,
        "clattn_dtype_size of the dtypes is not 4, 2, 2, 1");
    tu_expect(clattn_dtype_size(CLATTN_DTYPE_I32) == 4, "clattn_dtype_size(I32) is not 4");
    tu_expect(clattn_dtype_size((clattn_dtype)5) == 0 && clattn_dtype_size((clattn_dtype)-1) == 0,
              "clattn_dtype_size of an unknown dtype is not 0");

    tu_set_case("descriptor initialisers");
    clattn_sdpa_desc sdpa;
    memset(&sdpa, 0x5a, sizeof sdpa);
    clattn_sdpa_desc_init(&sdpa);
    tu_expect(sdpa.struct_size == sizeof sdpa && isnan(sdpa.scale) && sdpa.by_role == NULL &&
                  sdpa.num_roles == 0 && sdpa.path == CLATTN_PATH_AUTO &&
                  sdpa.causal == CLATTN_CAUSAL_NONE && sdpa.rope_dims == CLATTN_ROPE_WHOLE_HEAD &&
                  sdpa.rope_base == CLATTN_ROPE_BASE_DEFAULT && sdpa.rope == 0,
              "clattn_sdpa_desc_init: struct_size %zu, scale %g, rope_dims %zu, rope_base %g",
              sdpa.struct_size, (double)sdpa.scale, sdpa.rope_dims, sdpa.rope_base);
    clattn_mha_desc mha;
    memset(&mha, 0x5a, sizeof mha);
    clattn_mha_desc_init(&mha);
    tu_expect(mha.struct_size == sizeof mha && isnan(mha.scale) && mha.by_role == NULL &&
                  mha.num_heads == 0 && mha.num_kv_heads == CLATTN_KV_HEADS_ALL &&
                  mha.rope_dims == CLATTN_ROPE_WHOLE_HEAD &&
                  mha.rope_base == CLATTN_ROPE_BASE_DEFAULT,
              "clattn_mha_desc_init: num_kv_heads %zu, rope_dims %zu, rope_base %g",
              mha.num_kv_heads, mha.rope_dims, mha.rope_base);
    clattn_rope_desc rope;
    memset(&rope, 0x5a, sizeof rope);
    clattn_rope_desc_init(&rope);
    clattn_posenc_desc posenc;
    memset(&posenc, 0x5a, sizeof posenc);
    clattn_posenc_desc_init(&posenc);
    clattn_additive_desc additive;
    memset(&additive, 0x5a, sizeof additive);
    clattn_additive_desc_init(&additive);
    tu_expect(rope.rotary_dim == CLATTN_ROPE_WHOLE_HEAD && rope.base == CLATTN_ROPE_BASE_DEFAULT &&
                  rope.start == 0 && posenc.base == CLATTN_ROPE_BASE_DEFAULT && posenc.start == 0 &&
                  additive.num_heads == 1 && additive.by_role == NULL,
              "rope/posenc/additive_desc_init: rotary_dim %zu, base %g, %g, num_heads %zu",
              rope.rotary_dim, rope.base, posenc.base, additive.num_heads);
    clattn_mha_host_desc host;
    memset(&host, 0x5a, sizeof host);
    clattn_mha_host_desc_init(&host);
    tu_expect(host.struct_size == sizeof host && isnan(host.scale) && host.kdim == 0 &&
                  host.num_kv_heads == CLATTN_KV_HEADS_ALL &&
                  host.rope_dims == CLATTN_ROPE_WHOLE_HEAD &&
                  host.rope_base == CLATTN_ROPE_BASE_DEFAULT,
              "clattn_mha_host_desc_init: struct_size %zu", host.struct_size);

    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

START_TEST(test_status_strings)
{
    TU_BEGIN_TEST();
    tu_set_case("clattn_status_string");
    static const struct {
        int status;
        const char *name;
    } names[] = {
        {CLATTN_SUCCESS, "CLATTN_SUCCESS"},
        {CLATTN_ERR_INVALID_ARGUMENT, "CLATTN_ERR_INVALID_ARGUMENT"},
        {CLATTN_ERR_INVALID_SHAPE, "CLATTN_ERR_INVALID_SHAPE"},
        {CLATTN_ERR_OVERFLOW, "CLATTN_ERR_OVERFLOW"},
        {CLATTN_ERR_BUFFER_TOO_SMALL, "CLATTN_ERR_BUFFER_TOO_SMALL"},
        {CLATTN_ERR_NO_DEVICE, "CLATTN_ERR_NO_DEVICE"},
        {CLATTN_ERR_BUILD, "CLATTN_ERR_BUILD"},
        {CLATTN_ERR_HOST_MEMORY, "CLATTN_ERR_HOST_MEMORY"},
        {CLATTN_ERR_UNSUPPORTED, "CLATTN_ERR_UNSUPPORTED"},
        {CLATTN_ERR_TOO_LARGE, "CLATTN_ERR_TOO_LARGE"},
        {CLATTN_ERR_UNTRUSTED, "CLATTN_ERR_UNTRUSTED"},
        {CL_DEVICE_NOT_FOUND, "CL_DEVICE_NOT_FOUND"},
        {CL_OUT_OF_RESOURCES, "CL_OUT_OF_RESOURCES"},
        {CL_OUT_OF_HOST_MEMORY, "CL_OUT_OF_HOST_MEMORY"},
        {CL_BUILD_PROGRAM_FAILURE, "CL_BUILD_PROGRAM_FAILURE"},
        {CL_INVALID_VALUE, "CL_INVALID_VALUE"},
        {CL_INVALID_KERNEL_ARGS, "CL_INVALID_KERNEL_ARGS"},
        {CL_INVALID_WORK_GROUP_SIZE, "CL_INVALID_WORK_GROUP_SIZE"},
        {CL_INVALID_EVENT_WAIT_LIST, "CL_INVALID_EVENT_WAIT_LIST"},
        {CL_INVALID_BUFFER_SIZE, "CL_INVALID_BUFFER_SIZE"},
        {CL_MEM_OBJECT_ALLOCATION_FAILURE, "CL_MEM_OBJECT_ALLOCATION_FAILURE"},
    };
    for (int i = 0; i < COUNT_OF(names); ++i) {
        const char *got = clattn_status_string((clattn_status)names[i].status);
        tu_expect(got != NULL && strcmp(got, names[i].name) == 0,
                  "clattn_status_string(%d) = '%s', want '%s'", names[i].status,
                  got ? got : "(null)", names[i].name);
    }
    tu_expect(strcmp(clattn_status_string((clattn_status)-5), "CL_OUT_OF_RESOURCES") == 0,
              "clattn_status_string(-5) = '%s'", clattn_status_string((clattn_status)-5));
    static const int unknown[] = {12345, 1, -500, -999, -2047, -2058, -3000, INT32_MIN};
    for (int i = 0; i < COUNT_OF(unknown); ++i) {
        const char *got = clattn_status_string((clattn_status)unknown[i]);
        tu_expect(got != NULL && strcmp(got, "CLATTN_UNKNOWN_STATUS") == 0,
                  "clattn_status_string(%d) = '%s', want CLATTN_UNKNOWN_STATUS", unknown[i],
                  got ? got : "(null)");
    }
    TU_END_TEST();
}
END_TEST

/* --- the context's workspace limit ---------------------------------------------------------- */

/* A workspace limit below the unfused path's scores: an UNFUSED plan is refused at creation
 * (TOO_LARGE, naming the scores), AUTO picks the fused kernel and computes the reference. */
START_TEST(test_workspace_limit)
{
    TU_BEGIN_TEST();
    tu_set_case("clattn_ctx_set_workspace_limit(1024)");
    clattn_ctx *ctx = tu_ctx();
    tu_expect(clattn_ctx_set_workspace_limit(ctx, 1024) == CLATTN_SUCCESS,
              "clattn_ctx_set_workspace_limit failed");
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = 1, spec.heads = 2, spec.seq_q = 37, spec.seq_k = 41, spec.dk = spec.dv = 8;
    spec.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    spec.mask = PB_MASK_BOOL;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_tensors desc_tensors = p.layouts; /* used after p is freed */
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.path = CLATTN_PATH_UNFUSED;
    expect_sdpa_refused(&desc, CLATTN_ERR_TOO_LARGE, 0, "scores", "limit",
                        "sdpa(UNFUSED over the workspace limit)");
    clattn_tensors mha_tensors;
    clattn_mha_desc mha = mha_good(&mha_tensors);
    mha.need_weights = CLATTN_WEIGHTS_PER_HEAD;
    mha_tensors.q = mha_tensors.k = mha_tensors.v = mha_tensors.out = f32_3(NULL, MB, 40, ME);
    mha_tensors.weights = f32_4(NULL, MB, MH, 40, 40);
    expect_mha_refused(&mha, CLATTN_ERR_TOO_LARGE, 0, "scores|projections", "limit",
                       "mha(PER_HEAD over the workspace limit)");

    /* AUTO: the fused kernel, which needs no workspace, computes the reference. */
    desc.path = CLATTN_PATH_AUTO;
    clattn_plan *plan = expect_sdpa_created(&desc, "sdpa(AUTO under the workspace limit)");
    if (plan != NULL) {
        tu_expect(clattn_plan_is_fused(plan), "AUTO under the limit did not pick the fused path");
        tu_expect(clattn_plan_workspace_size(plan) <= 1024, "AUTO plan needs %zu bytes",
                  clattn_plan_workspace_size(plan));
    }
    clattn_plan_release(plan);
    clattn_status status = pb_sdpa_run(ctx, &p, NULL);
    tu_expect_status(status, CLATTN_SUCCESS, "AUTO plan run under the workspace limit");
    pb_sdpa_free(&p);

    /* The host API stages its arrays in the context's workspace: refused too. */
    clattn_attention_host_desc host;
    clattn_attention_host_desc_init(&host);
    host.batch = 1, host.heads = 4, host.seq_q = 64, host.seq_k = 64;
    host.head_dim_qk = host.head_dim_v = 8;
    float *zeros = tu_nan_floats(4 * 64 * 8), *host_out = tu_nan_floats(4 * 64 * 8);
    status = clattn_attention_host(ctx, &host, zeros, zeros, zeros, NULL, host_out, NULL);
    expect_error_text(status, CLATTN_ERR_TOO_LARGE, "attention", "workspace", "limit",
                      "host attention over the workspace limit");
    free(host_out);
    free(zeros);
    /* 0 is a cap of zero bytes (it meant "no cap" before 0.7): what needs no workspace runs. */
    tu_expect(clattn_ctx_set_workspace_limit(ctx, 0) == CLATTN_SUCCESS,
              "clattn_ctx_set_workspace_limit(0) failed");
    desc.path = CLATTN_PATH_UNFUSED;
    expect_sdpa_refused(&desc, CLATTN_ERR_TOO_LARGE, 0, "scores", "limit (0 bytes)",
                        "sdpa(UNFUSED under a zero limit)");
    desc.path = CLATTN_PATH_FUSED;
    clattn_plan_release(expect_sdpa_created(&desc, "sdpa(FUSED under a zero limit)"));
    tu_expect(clattn_ctx_set_workspace_limit(ctx, CLATTN_WORKSPACE_UNLIMITED) == CLATTN_SUCCESS,
              "clattn_ctx_set_workspace_limit(CLATTN_WORKSPACE_UNLIMITED) failed");
    desc.path = CLATTN_PATH_UNFUSED;
    plan = expect_sdpa_created(&desc, "sdpa(UNFUSED after the limit is lifted)");
    clattn_plan_release(plan);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- buffers of another cl_context ---------------------------------------------------------- */

/* A cl_mem made in a second cl_context (same device) passed as each tensor: refused with
 * CLATTN_ERR_INVALID_ARGUMENT and a message naming the tensor and the other cl_context, before
 * anything is enqueued (the outputs keep their NaN). So are a workspace and a queue of the other
 * context. */
START_TEST(test_foreign_buffers)
{
    TU_BEGIN_TEST();
    tu_set_case("tensors from another cl_context");
    clattn_ctx *ctx = tu_ctx();
    cl_device_id device = clattn_ctx_device(ctx);
    cl_int err = CL_SUCCESS;
    cl_context other = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (!tu_expect(err == CL_SUCCESS, "clCreateContext: %s",
                   clattn_status_string((clattn_status)err))) {
        TU_END_TEST();
        return;
    }
    enum { FLOATS = 4096 };
    cl_mem foreign_mem =
        clCreateBuffer(other, CL_MEM_READ_WRITE, FLOATS * sizeof(float), NULL, &err);
    tu_expect(err == CL_SUCCESS, "clCreateBuffer in the other context: %d", (int)err);
    cl_command_queue foreign_queue = clCreateCommandQueue(other, device, 0, &err);
    tu_expect(err == CL_SUCCESS, "clCreateCommandQueue in the other context: %d", (int)err);
    cl_mem in_mem = tu_nan_buffer(FLOATS), out_mem = tu_nan_buffer(FLOATS);
    clattn_status status;

    /* matmul: each of a, b, bias and c. */
    const clattn_matmul_desc mm = {.struct_size = sizeof mm, .alpha = 1.0f};
    const clattn_tensor a = f32_2(in_mem, 4, 3), b = f32_2(in_mem, 3, 5);
    const clattn_tensor bias = f32_1(in_mem, 5), c = f32_2(out_mem, 4, 5);
    clattn_tensor t;
    t = a, t.mem = foreign_mem;
    status = clattn_matmul(ctx, &mm, &t, &b, NULL, &c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "a", "matmul(foreign a)");
    t = b, t.mem = foreign_mem;
    status = clattn_matmul(ctx, &mm, &a, &t, NULL, &c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "b", "matmul(foreign b)");
    t = bias, t.mem = foreign_mem;
    status = clattn_matmul(ctx, &mm, &a, &b, &t, &c, 0, NULL, NULL);
    expect_error_text(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "bias", "another cl_context",
                      "matmul(foreign bias)");
    t = c, t.mem = foreign_mem;
    status = clattn_matmul(ctx, &mm, &a, &b, NULL, &t, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "c", "matmul(foreign c)");
    expect_untouched(out_mem, FLOATS, "matmul(foreign a, b, bias)");

    /* SDPA execution: q, v, the weights, both masks, lse; the workspace; the queue. */
    clattn_tensors unfused_tensors;
    clattn_sdpa_desc unfused = sdpa_good(&unfused_tensors);
    unfused.path = CLATTN_PATH_UNFUSED;
    unfused_tensors.weights = f32_4(NULL, SB, SH, SQ, SK);
    unfused_tensors.attn_mask = f32_2(NULL, SQ, SK);
    unfused_tensors.key_padding_mask =
        clattn_tensor_make(NULL, 0, CLATTN_DTYPE_U8, 2, SB, SK, 0, 0);
    clattn_tensors fused_tensors;
    clattn_sdpa_desc fused = sdpa_good(&fused_tensors);
    fused.path = CLATTN_PATH_FUSED;
    fused_tensors.lse = f32_3(NULL, SB, SH, SQ);
    clattn_plan *unfused_plan = expect_sdpa_created(&unfused, "sdpa(unfused, masks, weights)");
    clattn_plan *fused_plan = expect_sdpa_created(&fused, "sdpa(fused, lse)");
    clattn_tensors good_unfused = unfused_tensors, good_fused = fused_tensors;
    clattn_tensor *roles[] = {&good_unfused.q,
                              &good_unfused.k,
                              &good_unfused.v,
                              &good_unfused.attn_mask,
                              &good_unfused.key_padding_mask,
                              &good_fused.q,
                              &good_fused.k,
                              &good_fused.v,
                              &good_fused.lse};
    for (int i = 0; i < COUNT_OF(roles); ++i) {
        roles[i]->mem = in_mem;
    }
    good_unfused.out.mem = good_unfused.weights.mem = out_mem;
    good_fused.out.mem = out_mem;
    good_fused.lse.mem = out_mem, good_fused.lse.offset = SB * SH * SQ * SDV;
    static const struct {
        int fused;
        size_t field;
        const char *name;
    } foreign_roles[] = {
        {0, offsetof(clattn_tensors, q), "q"},
        {0, offsetof(clattn_tensors, v), "v"},
        {0, offsetof(clattn_tensors, weights), "weights"},
        {0, offsetof(clattn_tensors, attn_mask), "attn_mask"},
        {0, offsetof(clattn_tensors, key_padding_mask), "key_padding_mask"},
        {1, offsetof(clattn_tensors, k), "k"},
        {1, offsetof(clattn_tensors, out), "out"},
        {1, offsetof(clattn_tensors, lse), "lse"},
    };
    for (int i = 0; i < COUNT_OF(foreign_roles); ++i) {
        clattn_plan *plan = foreign_roles[i].fused ? fused_plan : unfused_plan;
        if (plan == NULL) {
            continue;
        }
        clattn_tensors tensors = foreign_roles[i].fused ? good_fused : good_unfused;
        ((clattn_tensor *)((char *)&tensors + foreign_roles[i].field))->mem = foreign_mem;
        char call[96];
        snprintf(call, sizeof call, "sdpa execute(foreign %s)", foreign_roles[i].name);
        expect_execute_refused(plan, &tensors, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "sdpa",
                               foreign_roles[i].name, "another cl_context", call);
    }
    if (unfused_plan != NULL) {
        expect_execute_refused(unfused_plan, &good_unfused, NULL, foreign_mem,
                               CLATTN_ERR_INVALID_ARGUMENT, 0, "sdpa", "workspace",
                               "another cl_context", "sdpa execute(foreign workspace)");
        expect_execute_refused(unfused_plan, &good_unfused, foreign_queue, NULL,
                               CLATTN_ERR_INVALID_ARGUMENT, 0, "sdpa", "queue",
                               "another cl_context", "sdpa execute(foreign queue)");
    }
    expect_untouched(out_mem, FLOATS, "sdpa execute(foreign tensors)");
    clattn_plan_release(fused_plan);
    clattn_plan_release(unfused_plan);

    /* MHA execution: an input and a weight. */
    clattn_tensors md_tensors;
    clattn_mha_desc md = mha_good(&md_tensors);
    md_tensors.in_proj_bias = absent, md_tensors.out_bias = absent;
    clattn_plan *mha_plan = expect_mha_created(&md, "mha(packed)");
    if (mha_plan != NULL) {
        clattn_tensors mt = md_tensors;
        mt.q.mem = mt.k.mem = mt.v.mem = in_mem;
        mt.in_proj_weight.mem = mt.out_weight.mem = in_mem;
        mt.out.mem = out_mem;
        clattn_tensors bad = mt;
        bad.out_weight.mem = foreign_mem;
        expect_execute_refused(mha_plan, &bad, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "mha",
                               "out_weight", "another cl_context",
                               "mha execute(foreign out_weight)");
        bad = mt, bad.k.mem = bad.v.mem = foreign_mem;
        expect_execute_refused(mha_plan, &bad, NULL, NULL, CLATTN_ERR_INVALID_ARGUMENT, 0, "mha",
                               "key", "another cl_context", "mha execute(foreign key)");
        expect_untouched(out_mem, FLOATS, "mha execute(foreign out_weight, key)");
    }
    clattn_plan_release(mha_plan);

    tu_release_mem(out_mem);
    tu_release_mem(in_mem);
    tu_release_mem(foreign_mem);
    if (foreign_queue != NULL) {
        clReleaseCommandQueue(foreign_queue);
    }
    clReleaseContext(other);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- the kernels' 32-bit dimension limit ---------------------------------------------------- */

/* A single dimension above UINT32_MAX (no size overflowing size_t) is refused with
 * CLATTN_ERR_UNSUPPORTED naming it; UINT32_MAX itself passes that check and is refused only
 * because the (small) buffers cannot hold it. */
START_TEST(test_dimension_limit)
{
    TU_BEGIN_TEST();
    tu_set_case("dimensions of 2^32 - 1 and 2^32");
    if (SIZE_MAX <= UINT32_MAX) {
        TU_END_TEST(); /* 32-bit size_t: no such dimension can be described */
        return;
    }
    clattn_ctx *ctx = tu_ctx();
    const size_t limit = UINT32_MAX, over = (size_t)UINT32_MAX + 1;
    cl_mem mem = tu_nan_buffer(64);

    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc_tensors.q = f32_4(NULL, 1, 1, 1, 1);
    desc_tensors.k = f32_4(NULL, 1, 1, over, 1);
    desc_tensors.v = f32_4(NULL, 1, 1, over, 1);
    desc_tensors.out = f32_4(NULL, 1, 1, 1, 1);
    expect_sdpa_refused(&desc, CLATTN_ERR_UNSUPPORTED, 0, "k", "dims[2] = 4294967296",
                        "sdpa(seq_k 2^32)");
    tu_expect(strstr(clattn_last_error(ctx), "32-bit") != NULL,
              "seq_k = 2^32: message '%s' lacks '32-bit'", clattn_last_error(ctx));
    desc_tensors.k.dims[2] = desc_tensors.v.dims[2] = limit;
    clattn_plan *plan = expect_sdpa_created(&desc, "sdpa(seq_k 2^32 - 1)");
    if (plan != NULL) {
        clattn_tensors t = desc_tensors;
        t.q.mem = t.k.mem = t.v.mem = t.out.mem = mem;
        expect_execute_refused(plan, &t, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "sdpa", "k",
                               NULL, "sdpa execute(seq_k 2^32 - 1 on a small buffer)");
    }
    clattn_plan_release(plan);

    clattn_tensors md_tensors;
    clattn_mha_desc md = mha_separate(&md_tensors);
    md_tensors.out_weight = md_tensors.out_bias = absent;
    md_tensors.k = f32_3(NULL, MB, over, ME);
    md_tensors.v = f32_3(NULL, MB, over, ME);
    expect_mha_refused(&md, CLATTN_ERR_UNSUPPORTED, 0, "key", "32-bit", "mha(seq_k 2^32)");
    md = mha_separate(&md_tensors);
    md_tensors.k = f32_3(NULL, MB, MS, over);
    md_tensors.k_weight = f32_2(NULL, over, ME);
    expect_mha_refused(&md, CLATTN_ERR_UNSUPPORTED, 0, "key|k_weight", "32-bit", "mha(kdim 2^32)");

    /* matmul checks its operands' buffers first: a 2^32-row A needs a 16 GiB buffer, so the
     * small one is what is refused. */
    const clattn_matmul_desc mat = {.struct_size = sizeof mat, .alpha = 1.0f};
    const clattn_tensor a = f32_2(mem, over, 1), b = f32_2(mem, 1, 1), c = f32_2(mem, over, 1);
    clattn_status status = clattn_matmul(ctx, &mat, &a, &b, NULL, &c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "matmul", "a", "matmul m = 2^32");

    expect_untouched(mem, 64, "the refused calls");
    tu_release_mem(mem);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- tuning and loop-limit environment ------------------------------------------------------ */

/* Sets (value non-NULL) or unsets an environment variable; returns a copy of the old value. */
static char *swap_env(const char *name, const char *value)
{
    const char *old = getenv(name);
    char *copy = old != NULL ? strdup(old) : NULL;
    if (value != NULL) {
        setenv(name, value, 1);
    } else {
        unsetenv(name);
    }
    return copy;
}

static void restore_env(const char *name, char *copy)
{
    if (copy != NULL) {
        setenv(name, copy, 1);
    } else {
        unsetenv(name);
    }
    free(copy);
}

/* Creates a context with `name`=`value`; expects `want` and, on failure, *out NULL and a message
 * containing each non-NULL needle. On success the context runs a correct matmul. */
static void expect_env_create(const char *name, const char *value, clattn_status want,
                              const char *needle, const char *second_needle)
{
    tu_set_case("clattn_ctx_create with %s='%s'", name, value ? value : "(unset)");
    char *saved = swap_env(name, value);
    char message[1024] = "";
    clattn_ctx *ctx = (clattn_ctx *)message;
    clattn_status status = clattn_ctx_create(NULL, &ctx, message, sizeof message);
    restore_env(name, saved);
    tu_expect(status == want, "%s='%s': clattn_ctx_create = %s, want %s: '%s'", name, value,
              clattn_status_string(status), clattn_status_string(want), message);
    if (status != CLATTN_SUCCESS) {
        tu_expect(ctx == NULL, "%s='%s': failed but *out is not NULL", name, value);
        const char *needles[2] = {needle, second_needle};
        for (int i = 0; i < 2; ++i) {
            tu_expect(needles[i] == NULL || strstr(message, needles[i]) != NULL,
                      "%s='%s': message '%s' lacks '%s'", name, value, message, needles[i]);
        }
        return;
    }
    const size_t m = 9, n = 70, k = 33;
    float *a = tu_random_floats(m * k), *b = tu_random_floats(k * n), *c = tu_floats(m * n);
    double *ref = tu_doubles(m * n);
    cl_int err = CL_SUCCESS;
    cl_context context = clattn_ctx_cl_context(ctx);
    cl_mem a_mem = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                  m * k * sizeof(float), a, &err);
    cl_mem b_mem = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                  k * n * sizeof(float), b, &err);
    cl_mem c_mem = clCreateBuffer(context, CL_MEM_READ_WRITE, m * n * sizeof(float), NULL, &err);
    const clattn_matmul_desc desc = {.struct_size = sizeof desc, .trans_b = 0, .alpha = 1.0f};
    const clattn_tensor ta = f32_2(a_mem, m, k), tb = f32_2(b_mem, k, n), tc = f32_2(c_mem, m, n);
    const ref_matmul_shape shape = {.m = m, .n = n, .k = k, .alpha = 1.0f};
    ref_matmul(&shape, a, b, NULL, ref);
    status = clattn_matmul(ctx, &desc, &ta, &tb, NULL, &tc, 0, NULL, NULL);
    if (tu_expect_status(status, CLATTN_SUCCESS, "matmul on the context") &&
        tu_expect(clEnqueueReadBuffer(clattn_ctx_queue(ctx), c_mem, CL_TRUE, 0,
                                      m * n * sizeof(float), c, 0, NULL, NULL) == CL_SUCCESS,
                  "clEnqueueReadBuffer failed")) {
        tu_expect_close("C", c, ref, m * n, TU_TOL);
    }
    tu_release_mem(c_mem);
    tu_release_mem(b_mem);
    tu_release_mem(a_mem);
    clattn_ctx_release(ctx);
    free(ref);
    free(c);
    free(b);
    free(a);
}

/* Writes text to a fresh file under dir; path receives its name. */
static int write_file(const char *dir, const char *name, const char *text, char *path, size_t size)
{
    snprintf(path, size, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return 0;
    }
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* CLATTN_TUNING naming a missing or malformed file, or a row the device cannot run: context
 * creation fails with a message naming the variable or the row; CLATTN_LOOP_TRIP_LIMIT outside
 * 64 .. 2^32-1 or not a number likewise. Good values give working contexts. */
START_TEST(test_tuning_environment)
{
    TU_BEGIN_TEST();
    char dir[] = "/tmp/clattn-tuning-XXXXXX", path[600], missing[600];
    tu_make_temp_dir(dir);
    snprintf(missing, sizeof missing, "%s/does-not-exist.txt", dir);
    expect_env_create("CLATTN_TUNING", missing, CLATTN_ERR_INVALID_ARGUMENT, "CLATTN_TUNING",
                      "does-not-exist.txt");
    expect_env_create("CLATTN_TUNING", dir, CLATTN_ERR_INVALID_ARGUMENT, "CLATTN_TUNING", NULL);
    static const struct {
        const char *name, *text, *needle, *second;
        clattn_status want;
    } files[] = {
        {"no-bars.txt", "any matmul_vec=1\n", "line 1", "class | vendor",
         CLATTN_ERR_INVALID_ARGUMENT},
        {"bad-class.txt", "# comment\n\nfpga | * | * | vec_wg=8\n", "line 3", "fpga",
         CLATTN_ERR_INVALID_ARGUMENT},
        {"bad-key.txt", "any | * | * | no_such_key=4\n", "line 1", "no_such_key",
         CLATTN_ERR_INVALID_ARGUMENT},
        {"bad-value.txt", "any | * | * | vec_wg=eight\n", "line 1", "vec_wg=eight",
         CLATTN_ERR_INVALID_ARGUMENT},
        {"no-value.txt", "any | * | * | vec_wg\n", "line 1", "vec_wg", CLATTN_ERR_INVALID_ARGUMENT},
        {"huge-value.txt", "any | * | * | vec_wg=99999999999\n", "line 1", "vec_wg",
         CLATTN_ERR_INVALID_ARGUMENT},
        {"unfit.txt", "any | * | * | vec_width=5\n", "tuning rows", "line 1",
         CLATTN_ERR_UNSUPPORTED},
        {"unfit-wg.txt", "any | * | * | softmax_wg=3\n", "tuning rows", "line 1",
         CLATTN_ERR_UNSUPPORTED},
        {"other-class-bad-key.txt", "cpu | * | * | vec_wg=8\ngpu | * | * | no_such_key=1\n",
         "line 2", "no_such_key", CLATTN_ERR_INVALID_ARGUMENT},
        {"other-device-bad-value.txt", "any | NoSuchVendor | * | vec_wg=x\n", "line 1", "vec_wg=x",
         CLATTN_ERR_INVALID_ARGUMENT},
        {"good.txt", "# a valid row for every device\nany | * | * | softmax_wg=4 flash_vw=4\n",
         NULL, NULL, CLATTN_SUCCESS},
        {"other-device.txt", "any | NoSuchVendor | * | vec_width=5\n", NULL, NULL, CLATTN_SUCCESS},
        {"empty.txt", "", NULL, NULL, CLATTN_SUCCESS},
    };
    for (int i = 0; i < COUNT_OF(files); ++i) {
        if (!tu_expect(write_file(dir, files[i].name, files[i].text, path, sizeof path),
                       "cannot write %s", path)) {
            continue;
        }
        expect_env_create("CLATTN_TUNING", path, files[i].want, files[i].needle, files[i].second);
        remove(path);
    }
    expect_env_create("CLATTN_TUNING", "default", CLATTN_SUCCESS, NULL, NULL);
    expect_env_create("CLATTN_TUNING", "", CLATTN_SUCCESS, NULL, NULL);
    rmdir(dir);

    static const char *const bad_limits[] = {
        "abc", "63", "0", "-1", "100x", "4294967296", "99999999999999999999999", " ", "1e6"};
    for (int i = 0; i < COUNT_OF(bad_limits); ++i) {
        expect_env_create("CLATTN_LOOP_TRIP_LIMIT", bad_limits[i], CLATTN_ERR_INVALID_ARGUMENT,
                          "CLATTN_LOOP_TRIP_LIMIT", NULL);
    }
    expect_env_create("CLATTN_LOOP_TRIP_LIMIT", "64", CLATTN_SUCCESS, NULL, NULL);
    expect_env_create("CLATTN_LOOP_TRIP_LIMIT", "", CLATTN_SUCCESS, NULL, NULL);
    TU_END_TEST();
}
END_TEST

/* --- argument combinations not covered above ----------------------------------------------- */

START_TEST(test_more_argument_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("wait lists, from_queue, message buffers");
    clattn_ctx *ctx = tu_ctx();
    cl_mem mem = tu_nan_buffer(256), out_mem = tu_nan_buffer(64);
    clattn_status status;

    /* A wait list given with num_wait = 0. */
    cl_event marker = NULL;
    cl_int err = clEnqueueMarkerWithWaitList(clattn_ctx_queue(ctx), 0, NULL, &marker);
    tu_expect(err == CL_SUCCESS, "clEnqueueMarkerWithWaitList: %d", (int)err);
    const clattn_matmul_desc mm = {.struct_size = sizeof mm, .alpha = 1.0f};
    const clattn_tensor t = f32_2(mem, 2, 2), out = f32_2(out_mem, 2, 2);
    status = clattn_matmul(ctx, &mm, &t, &t, NULL, &out, 0, &marker, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "num_wait",
                 "matmul(num_wait 0, wait given)");
    tu_expect(strstr(clattn_last_error(ctx), "num_wait=0") &&
                  strstr(clattn_last_error(ctx), "given"),
              "num_wait 0 with a list: message '%s'", clattn_last_error(ctx));
    if (marker != NULL) {
        clWaitForEvents(1, &marker);
        clReleaseEvent(marker);
    }

    /* from_queue with out NULL. */
    char message[128] = "";
    status = clattn_ctx_create_from_queue(clattn_ctx_queue(ctx), NULL, message, sizeof message);
    tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT && strstr(message, "out is NULL"),
              "from_queue(queue, out NULL): %s '%s'", clattn_status_string(status), message);
    status = clattn_ctx_create_from_queue(NULL, NULL, message, sizeof message);
    tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT && strstr(message, "out is NULL"),
              "from_queue(NULL, out NULL): %s '%s'", clattn_status_string(status), message);
    /* A message buffer of size 0 is not written at all. */
    memset(message, 'x', sizeof message);
    clattn_ctx *none = NULL;
    status = clattn_ctx_create("x:y", &none, message, 0);
    tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT && none == NULL && message[0] == 'x',
              "create('x:y', message size 0): %s, first byte %d", clattn_status_string(status),
              message[0]);
    /* No message buffer at all, for each kind of refused spec. */
    static const char *const specs[] = {"x:y", "99999:0", "0:99999"};
    for (int i = 0; i < COUNT_OF(specs); ++i) {
        status = clattn_ctx_create(specs[i], &none, NULL, 0);
        tu_expect((status == CLATTN_ERR_INVALID_ARGUMENT) == (i == 0) &&
                      (status == CLATTN_ERR_NO_DEVICE) == (i > 0) && none == NULL,
                  "create('%s', NULL message): %s", specs[i], clattn_status_string(status));
    }

    /* The fused path: each tensor one element short (its own offset past the fit). */
    clattn_sdpa_desc fd;
    clattn_sdpa_desc_init(&fd);
    clattn_tensors fd_tensors = {0};
    CLATTN_BIND_ROLES(fd, fd_tensors);
    fd.path = CLATTN_PATH_FUSED;
    fd_tensors.q = f32_4(NULL, 1, 2, 4, 8);
    fd_tensors.k = f32_4(NULL, 1, 2, 4, 8);
    fd_tensors.v = f32_4(NULL, 1, 2, 4, 8);
    fd_tensors.out = f32_4(NULL, 1, 2, 4, 8);
    fd_tensors.lse = f32_3(NULL, 1, 2, 4);
    clattn_plan *plan = expect_sdpa_created(&fd, "sdpa(fused with lse)");
    static const char *const fused_names[] = {"q", "k", "v", "out", "lse"};
    /* q, k, v (64 floats) in the 256-float buffer, out in the 64-float one, lse (8 rows). */
    static const size_t short_offsets[] = {256 - 64 + 1, 256 - 64 + 1, 256 - 64 + 1, 1, 64 - 8 + 1};
    for (int i = 0; i < 5 && plan != NULL; ++i) {
        clattn_tensors args = fd_tensors;
        args.q.mem = args.k.mem = args.v.mem = mem;
        args.out.mem = args.lse.mem = out_mem;
        clattn_tensor *roles[5] = {&args.q, &args.k, &args.v, &args.out, &args.lse};
        roles[i]->offset = short_offsets[i];
        char call[64];
        snprintf(call, sizeof call, "sdpa execute(%s one short)", fused_names[i]);
        expect_execute_refused(plan, &args, NULL, NULL, CLATTN_ERR_BUFFER_TOO_SMALL, 0, "sdpa",
                               fused_names[i], NULL, call);
    }
    clattn_plan_release(plan);

    expect_untouched(out_mem, 64, "out after the refused calls");
    tu_release_mem(out_mem);
    tu_release_mem(mem);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

static Suite *errors_suite(void)
{
    Suite *suite = suite_create("errors");
    TCase *ops = tu_tcase(suite, "ops", 600);
    tcase_add_test(ops, test_matmul_errors);
    tcase_add_test(ops, test_sdpa_create_errors);
    tcase_add_test(ops, test_sdpa_execute_errors);
    tcase_add_test(ops, test_mha_create_errors);
    tcase_add_test(ops, test_mha_execute_errors);
    tcase_add_test(ops, test_attention_host_errors);
    tcase_add_test(ops, test_mha_host_errors);

    TCase *runtime = tu_tcase(suite, "runtime", 600);
    tcase_add_test(runtime, test_context_errors);
    tcase_add_test(runtime, test_status_strings);
    tcase_add_test(runtime, test_host_too_large);
    tcase_add_test(runtime, test_workspace_limit);
    tcase_add_test(runtime, test_foreign_buffers);
    tcase_add_test(runtime, test_dimension_limit);
    tcase_add_test(runtime, test_tuning_environment);
    tcase_add_test(runtime, test_more_argument_errors);
    return suite;
}

int main(void)
{
    return tu_main("check_errors", errors_suite);
}
