/*
 * check_errors: every documented error path returns the right status, leaves a message that
 * starts with the operation's name and names the offending argument, and leaves the context
 * usable: after the failing calls a correct call on the same context gives correct output.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "testutil.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

static const clattn_tensor absent = {NULL, 0};

/* `names` lists acceptable argument names separated by '|'; NULL skips the name check.
 * alternative is a second acceptable status (CLATTN_SUCCESS: none). */
static void expect_error_either(clattn_status got, clattn_status want, clattn_status alternative,
                                const char *op, const char *names, const char *call)
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
    tu_expect(tu_starts_with(message, op), "%s: message '%s' does not start with '%s'", call,
              message, op);
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
    expect_error_either(got, want, CLATTN_SUCCESS, op, names, call);
}

/* A correct small matmul (with bias, alpha, beta) on the shared context still works. */
static void expect_context_still_works(void)
{
    const size_t m = 5, n = 7, k = 3;
    float *a = tu_random_floats(m * k), *b = tu_random_floats(k * n);
    float *bias = tu_random_floats(n), *c = tu_random_floats(m * n);
    clattn_matmul_desc desc = {.m = m, .n = n, .k = k, .alpha = 0.5f, .beta = 2.0f};
    double *ref = tu_doubles(m * n);
    tu_floats_to_doubles(c, m * n, ref);
    ref_matmul(&desc, a, b, bias, ref);
    cl_mem a_mem = tu_upload_floats(a, m * k), b_mem = tu_upload_floats(b, k * n);
    cl_mem bias_mem = tu_upload_floats(bias, n), c_mem = tu_upload_floats(c, m * n);
    clattn_status status =
        clattn_matmul(tu_ctx(), &desc, tu_tensor(a_mem, 0), tu_tensor(b_mem, 0),
                      tu_tensor(bias_mem, 0), tu_tensor(c_mem, 0), 0, NULL, NULL);
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
    cl_mem c_mem = tu_nan_buffer(m * n), bias_mem = tu_nan_buffer(n);
    cl_mem short_mem = tu_nan_buffer(m * k - 1), short_bias_mem = tu_nan_buffer(n - 1);
    clattn_tensor a = {a_mem, 0}, b = {b_mem, 0}, c = {c_mem, 0};
    const clattn_matmul_desc good = {.m = m, .n = n, .k = k, .alpha = 1.0f};
    clattn_matmul_desc desc;
    clattn_status status;

    status = clattn_matmul(NULL, &good, a, b, absent, c, 0, NULL, NULL);
    tu_expect_status(status, CLATTN_ERR_INVALID_ARGUMENT, "clattn_matmul(NULL ctx)");
    status = clattn_matmul(ctx, NULL, a, b, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "desc", "matmul(NULL desc)");
    status = clattn_matmul(ctx, &good, absent, b, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "a", "matmul(a absent)");
    status = clattn_matmul(ctx, &good, a, absent, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "b", "matmul(b absent)");
    status = clattn_matmul(ctx, &good, a, b, absent, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "c", "matmul(c absent)");

    desc = good, desc.m = 0;
    status = clattn_matmul(ctx, &desc, a, b, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "m", "matmul(m = 0)");
    desc = good, desc.n = 0;
    status = clattn_matmul(ctx, &desc, a, b, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "n", "matmul(n = 0)");
    desc = good, desc.k = 0;
    status = clattn_matmul(ctx, &desc, a, b, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "k", "matmul(k = 0)");

    /* Leading dimensions shorter than the stored rows. */
    desc = good, desc.lda = k - 1;
    status = clattn_matmul(ctx, &desc, a, b, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "lda|ld", "matmul(lda < k)");
    desc = good, desc.trans_a = 1, desc.lda = m - 1;
    status = clattn_matmul(ctx, &desc, a, b, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "lda|ld", "matmul(trans_a, lda < m)");
    desc = good, desc.ldb = n - 1;
    status = clattn_matmul(ctx, &desc, a, b, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "ldb|ld", "matmul(ldb < n)");
    desc = good, desc.trans_b = 1, desc.ldb = k - 1;
    status = clattn_matmul(ctx, &desc, a, b, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "ldb|ld", "matmul(trans_b, ldb < k)");
    desc = good, desc.ldc = n - 1;
    status = clattn_matmul(ctx, &desc, a, b, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "matmul", "ldc|ld", "matmul(ldc < n)");

    /* Buffers too small for the shape, or offsets past the end. */
    status = clattn_matmul(ctx, &good, tu_tensor(short_mem, 0), b, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "matmul", "a", "matmul(a one float short)");
    status = clattn_matmul(ctx, &good, a, tu_tensor(b_mem, 1), absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "matmul", "b", "matmul(b offset 1)");
    status = clattn_matmul(ctx, &good, a, b, absent, tu_tensor(c_mem, m * n), 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "matmul", "c", "matmul(c offset at end)");
    status = clattn_matmul(ctx, &good, a, b, absent, tu_tensor(c_mem, SIZE_MAX / 2), 0, NULL, NULL);
    expect_error_either(status, CLATTN_ERR_BUFFER_TOO_SMALL, CLATTN_ERR_OVERFLOW, "matmul", "c",
                        "matmul(c offset SIZE_MAX/2)");
    status = clattn_matmul(ctx, &good, a, b, tu_tensor(short_bias_mem, 0), c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "matmul", "bias",
                 "matmul(bias one float short)");
    desc = good, desc.batch = 2, desc.stride_a = m * k, desc.stride_b = 0, desc.stride_c = m * n;
    status = clattn_matmul(ctx, &desc, a, b, tu_tensor(bias_mem, 0), c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "matmul", "a|c",
                 "matmul(batch 2 on single-matrix buffers)");

    /* Sizes whose byte counts overflow size_t. */
    desc = good, desc.m = SIZE_MAX / 2, desc.n = SIZE_MAX / 2, desc.k = 1;
    status = clattn_matmul(ctx, &desc, a, b, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "matmul", NULL, "matmul(m = n = SIZE_MAX/2)");
    desc = good, desc.m = SIZE_MAX / 4 + 1, desc.n = 1, desc.k = 1;
    status = clattn_matmul(ctx, &desc, a, b, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "matmul", NULL, "matmul(m*4 bytes overflow)");
    desc = good, desc.batch = SIZE_MAX / 2, desc.stride_a = 16, desc.stride_b = 16,
    desc.stride_c = 16;
    status = clattn_matmul(ctx, &desc, a, b, absent, c, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "matmul", NULL, "matmul(batch*stride overflow)");

    /* A wait list of one event given as NULL. */
    status = clattn_matmul(ctx, &good, a, b, absent, c, 1, NULL, NULL);
    expect_error_either(status, CLATTN_ERR_INVALID_ARGUMENT,
                        (clattn_status)CL_INVALID_EVENT_WAIT_LIST, "matmul", NULL,
                        "matmul(num_wait 1, wait NULL)");

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

/* --- softmax ------------------------------------------------------------------------------ */

START_TEST(test_softmax_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("softmax_rows errors");
    clattn_ctx *ctx = tu_ctx();
    const size_t batch = 2, heads = 3, seq_q = 4, seq_k = 5;
    const size_t count = batch * heads * seq_q * seq_k;
    cl_mem scores_mem = tu_nan_buffer(count), out_mem = tu_nan_buffer(count);
    cl_mem mask_mem = tu_nan_buffer(seq_q * seq_k - 1);
    uint8_t padding[2 * 5] = {0};
    cl_mem padding_mem = tu_upload_bytes(padding, batch * seq_k - 1);
    clattn_tensor scores = {scores_mem, 0}, out = {out_mem, 0};
    const clattn_softmax_desc good = {
        .batch = batch, .heads = heads, .seq_q = seq_q, .seq_k = seq_k};
    clattn_softmax_desc desc;
    clattn_status status;

    status = clattn_softmax_rows(NULL, &good, scores, out, 0, NULL, NULL);
    tu_expect_status(status, CLATTN_ERR_INVALID_ARGUMENT, "clattn_softmax_rows(NULL ctx)");
    status = clattn_softmax_rows(ctx, NULL, scores, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "softmax_rows", "desc", "NULL desc");
    status = clattn_softmax_rows(ctx, &good, absent, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "softmax_rows", "scores", "scores absent");
    status = clattn_softmax_rows(ctx, &good, scores, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "softmax_rows", "out", "out absent");
    desc = good, desc.norm = (clattn_norm)7;
    status = clattn_softmax_rows(ctx, &desc, scores, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "softmax_rows", "norm", "norm = 7");

    desc = good, desc.batch = 0;
    status = clattn_softmax_rows(ctx, &desc, scores, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "softmax_rows", "batch", "batch = 0");
    desc = good, desc.heads = 0;
    status = clattn_softmax_rows(ctx, &desc, scores, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "softmax_rows", "heads", "heads = 0");
    desc = good, desc.seq_q = 0;
    status = clattn_softmax_rows(ctx, &desc, scores, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "softmax_rows", "seq_q", "seq_q = 0");
    desc = good, desc.seq_k = 0;
    status = clattn_softmax_rows(ctx, &desc, scores, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "softmax_rows", "seq_k", "seq_k = 0");

    desc = good, desc.seq_k = seq_k + 1;
    status = clattn_softmax_rows(ctx, &desc, scores, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "softmax_rows", "scores|out",
                 "seq_k one more than the buffers hold");
    status = clattn_softmax_rows(ctx, &good, scores, tu_tensor(out_mem, 1), 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "softmax_rows", "out", "out offset 1");
    desc = good, desc.masks.attn_mask = tu_tensor(mask_mem, 0);
    status = clattn_softmax_rows(ctx, &desc, scores, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "softmax_rows", "attn_mask",
                 "attn_mask one float short");
    desc = good, desc.masks.key_padding_mask = tu_tensor(padding_mem, 0);
    status = clattn_softmax_rows(ctx, &desc, scores, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "softmax_rows", "key_padding_mask",
                 "key_padding_mask one byte short");

    desc = good, desc.seq_q = SIZE_MAX / 2, desc.seq_k = 3;
    status = clattn_softmax_rows(ctx, &desc, scores, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "softmax_rows", NULL, "seq_q = SIZE_MAX/2");
    desc = good, desc.batch = (size_t)1 << (sizeof(size_t) * 4),
    desc.heads = (size_t)1 << (sizeof(size_t) * 4);
    status = clattn_softmax_rows(ctx, &desc, scores, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "softmax_rows", NULL, "batch*heads = 2^64");

    tu_release_mem(padding_mem);
    tu_release_mem(mask_mem);
    tu_release_mem(out_mem);
    tu_release_mem(scores_mem);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- heads -------------------------------------------------------------------------------- */

typedef clattn_status (*heads_op)(clattn_ctx *, const clattn_heads_desc *, clattn_tensor,
                                  clattn_tensor, cl_uint, const cl_event *, cl_event *);

START_TEST(test_heads_errors)
{
    TU_BEGIN_TEST();
    static const char *const op_names[] = {"split_heads", "concat_heads"};
    const heads_op ops[] = {clattn_split_heads, clattn_concat_heads};
    const char *op = op_names[_i];
    heads_op call = ops[_i];
    tu_set_case("%s errors", op);
    clattn_ctx *ctx = tu_ctx();
    const size_t batch = 2, seq = 3, heads = 4, head_dim = 5;
    const size_t count = batch * seq * heads * head_dim;
    cl_mem src_mem = tu_nan_buffer(count), dst_mem = tu_nan_buffer(count);
    cl_mem short_mem = tu_nan_buffer(count - 1);
    clattn_tensor src = {src_mem, 0}, dst = {dst_mem, 0};
    const clattn_heads_desc good = {batch, seq, heads, head_dim, 0};
    clattn_heads_desc desc;
    clattn_status status;
    /* The (batch, seq, ...) side is src for split and dst for concat. */
    const char *strided_name = _i == 0 ? "src" : "dst";

    status = call(NULL, &good, src, dst, 0, NULL, NULL);
    tu_expect_status(status, CLATTN_ERR_INVALID_ARGUMENT, "NULL ctx");
    status = call(ctx, NULL, src, dst, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, op, "desc", "NULL desc");
    status = call(ctx, &good, absent, dst, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, op, "src", "src absent");
    status = call(ctx, &good, src, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, op, "dst", "dst absent");

    desc = good, desc.batch = 0;
    status = call(ctx, &desc, src, dst, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, op, "batch", "batch = 0");
    desc = good, desc.seq = 0;
    status = call(ctx, &desc, src, dst, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, op, "seq", "seq = 0");
    desc = good, desc.heads = 0;
    status = call(ctx, &desc, src, dst, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, op, "heads", "heads = 0");
    desc = good, desc.head_dim = 0;
    status = call(ctx, &desc, src, dst, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, op, "head_dim", "head_dim = 0");
    desc = good, desc.row_stride = heads * head_dim - 1;
    status = call(ctx, &desc, src, dst, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, op, "row_stride", "row_stride < heads*dim");

    status = call(ctx, &good, tu_tensor(short_mem, 0), dst, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, op, "src", "src one float short");
    status = call(ctx, &good, src, tu_tensor(dst_mem, 1), 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, op, "dst", "dst offset 1");
    desc = good, desc.row_stride = heads * head_dim + 1;
    status = call(ctx, &desc, src, dst, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, op, strided_name,
                 "row_stride larger than the strided buffer allows");

    desc = good, desc.seq = SIZE_MAX / 2;
    status = call(ctx, &desc, src, dst, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, op, NULL, "seq = SIZE_MAX/2");

    tu_release_mem(short_mem);
    tu_release_mem(dst_mem);
    tu_release_mem(src_mem);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- attention ---------------------------------------------------------------------------- */

START_TEST(test_attention_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("attention errors");
    clattn_ctx *ctx = tu_ctx();
    const size_t batch = 2, heads = 2, seq_q = 3, seq_k = 4, dk = 5, dv = 6;
    const size_t q_count = batch * heads * seq_q * dk, k_count = batch * heads * seq_k * dk;
    const size_t v_count = batch * heads * seq_k * dv, out_count = batch * heads * seq_q * dv;
    const size_t weights_count = batch * heads * seq_q * seq_k;
    cl_mem q_mem = tu_nan_buffer(q_count), k_mem = tu_nan_buffer(k_count);
    cl_mem v_mem = tu_nan_buffer(v_count), out_mem = tu_nan_buffer(out_count);
    cl_mem weights_mem = tu_nan_buffer(weights_count - 1);
    clattn_tensor q = {q_mem, 0}, k = {k_mem, 0}, v = {v_mem, 0}, out = {out_mem, 0};
    const clattn_attention_desc good = {
        batch, heads, seq_q, seq_k, dk, dv, 0.0f, CLATTN_NORM_SOFTMAX, {0}, CLATTN_PATH_AUTO};
    clattn_attention_desc desc;
    clattn_status status;

    status = clattn_attention(NULL, &good, q, k, v, out, absent, 0, NULL, NULL);
    tu_expect_status(status, CLATTN_ERR_INVALID_ARGUMENT, "clattn_attention(NULL ctx)");
    status = clattn_attention(ctx, NULL, q, k, v, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "desc", "NULL desc");
    status = clattn_attention(ctx, &good, absent, k, v, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "q", "q absent");
    status = clattn_attention(ctx, &good, q, absent, v, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "k", "k absent");
    status = clattn_attention(ctx, &good, q, k, absent, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "v", "v absent");
    status = clattn_attention(ctx, &good, q, k, v, absent, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "out", "out absent");
    desc = good, desc.norm = (clattn_norm)3;
    status = clattn_attention(ctx, &desc, q, k, v, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "norm", "norm = 3");

    static const char *const field_names[] = {"batch", "heads",       "seq_q",
                                              "seq_k", "head_dim_qk", "head_dim_v"};
    for (int field = 0; field < 6; ++field) {
        desc = good;
        size_t *fields[] = {&desc.batch, &desc.heads,       &desc.seq_q,
                            &desc.seq_k, &desc.head_dim_qk, &desc.head_dim_v};
        *fields[field] = 0;
        status = clattn_attention(ctx, &desc, q, k, v, out, absent, 0, NULL, NULL);
        expect_error(status, CLATTN_ERR_INVALID_SHAPE, "attention", field_names[field],
                     field_names[field]);
    }

    status = clattn_attention(ctx, &good, tu_tensor(q_mem, 1), k, v, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "attention", "q", "q offset 1");
    status = clattn_attention(ctx, &good, q, tu_tensor(k_mem, 2), v, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "attention", "k", "k offset 2");
    desc = good, desc.head_dim_v = dv + 1;
    status = clattn_attention(ctx, &desc, q, k, v, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "attention", "v|out",
                 "head_dim_v one more than v holds");
    status =
        clattn_attention(ctx, &good, q, k, v, tu_tensor(out_mem, out_count), absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "attention", "out", "out offset at end");
    status = clattn_attention(ctx, &good, q, k, v, out, tu_tensor(weights_mem, 0), 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "attention", "weights",
                 "weights one float short");

    desc = good, desc.seq_q = SIZE_MAX / 2;
    status = clattn_attention(ctx, &desc, q, k, v, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "attention", NULL, "seq_q = SIZE_MAX/2");
    desc = good, desc.head_dim_v = SIZE_MAX / 4 + 1, desc.batch = 1, desc.heads = 1, desc.seq_k = 1;
    status = clattn_attention(ctx, &desc, q, k, v, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "attention", NULL, "head_dim_v*4 bytes overflow");

    tu_release_mem(weights_mem);
    tu_release_mem(out_mem);
    tu_release_mem(v_mem);
    tu_release_mem(k_mem);
    tu_release_mem(q_mem);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

START_TEST(test_attention_host_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("attention host errors");
    clattn_ctx *ctx = tu_ctx();
    const clattn_attention_desc good = {1, 2, 3, 4, 5, 6, 0.0f, CLATTN_NORM_SOFTMAX, {0}, CLATTN_PATH_AUTO};
    float *q = tu_random_floats(2 * 3 * 5), *k = tu_random_floats(2 * 4 * 5);
    float *v = tu_random_floats(2 * 4 * 6), *out = tu_nan_floats(2 * 3 * 6);
    clattn_attention_desc desc;
    clattn_status status;

    status = clattn_attention_host(NULL, &good, q, k, v, NULL, out, NULL);
    tu_expect_status(status, CLATTN_ERR_INVALID_ARGUMENT, "clattn_attention_host(NULL ctx)");
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
    desc = good, desc.seq_k = 0;
    status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "attention", "seq_k", "host seq_k = 0");
    desc = good, desc.seq_q = SIZE_MAX / 2;
    status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "attention", NULL, "host seq_q = SIZE_MAX/2");

    free(out);
    free(v);
    free(k);
    free(q);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- multi-head attention ----------------------------------------------------------------- */

typedef struct mha_buffers {
    cl_mem query, out, attn, in_proj, in_bias, out_weight, out_bias, q_weight, small;
} mha_buffers;

START_TEST(test_mha_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("mha_forward errors");
    clattn_ctx *ctx = tu_ctx();
    const size_t batch = 2, seq = 3, embed = 8, heads = 2;
    mha_buffers buf = {
        .query = tu_nan_buffer(batch * seq * embed),
        .out = tu_nan_buffer(batch * seq * embed),
        .attn = tu_nan_buffer(batch * heads * seq * seq),
        .in_proj = tu_nan_buffer(3 * embed * embed),
        .in_bias = tu_nan_buffer(3 * embed),
        .out_weight = tu_nan_buffer(embed * embed),
        .out_bias = tu_nan_buffer(embed),
        .q_weight = tu_nan_buffer(embed * embed),
        .small = tu_nan_buffer(embed - 1),
    };
    clattn_tensor query = {buf.query, 0}, out = {buf.out, 0}, attn = {buf.attn, 0};
    const clattn_mha_desc good = {.batch = batch,
                                  .seq_q = seq,
                                  .seq_k = seq,
                                  .embed_dim = embed,
                                  .num_heads = heads,
                                  .layout = CLATTN_LAYOUT_TORCH};
    const clattn_mha_weights good_weights = {
        .in_proj_weight = {buf.in_proj, 0},
        .in_proj_bias = {buf.in_bias, 0},
        .out_weight = {buf.out_weight, 0},
        .out_bias = {buf.out_bias, 0},
    };
    clattn_mha_desc desc;
    clattn_mha_weights weights;
    clattn_status status;

#define MHA_CALL(desc_ptr, weights_ptr, out_tensor, attn_tensor)                                   \
    clattn_mha_forward(ctx, (desc_ptr), (weights_ptr), query, query, query, (out_tensor),          \
                       (attn_tensor), 0, NULL, NULL)

    status = clattn_mha_forward(NULL, &good, &good_weights, query, query, query, out, absent, 0,
                                NULL, NULL);
    tu_expect_status(status, CLATTN_ERR_INVALID_ARGUMENT, "clattn_mha_forward(NULL ctx)");
    status = MHA_CALL(NULL, &good_weights, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "desc", "NULL desc");
    status = MHA_CALL(&good, NULL, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "weights", "NULL weights");
    status = clattn_mha_forward(ctx, &good, &good_weights, absent, query, query, out, absent, 0,
                                NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "query", "query absent");
    status = clattn_mha_forward(ctx, &good, &good_weights, query, absent, query, out, absent, 0,
                                NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "key", "key absent");
    status = clattn_mha_forward(ctx, &good, &good_weights, query, query, absent, out, absent, 0,
                                NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "value", "value absent");
    status = MHA_CALL(&good, &good_weights, absent, absent);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "out", "out absent");

    /* Weights: none, in_proj with the XW layout, in_proj plus separate weights, half a set. */
    weights = good_weights, weights.in_proj_weight = absent, weights.in_proj_bias = absent;
    status = MHA_CALL(&good, &weights, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward",
                 "q_weight|in_proj_weight|weight|weights", "no projection weights");
    desc = good, desc.layout = CLATTN_LAYOUT_XW;
    status = MHA_CALL(&desc, &good_weights, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "in_proj_weight|layout",
                 "in_proj_weight with layout XW");
    weights = good_weights, weights.q_weight = tu_tensor(buf.q_weight, 0);
    status = MHA_CALL(&good, &weights, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "in_proj_weight|q_weight",
                 "in_proj_weight and q_weight both given");
    weights = good_weights, weights.in_proj_weight = absent, weights.in_proj_bias = absent;
    weights.q_weight = tu_tensor(buf.q_weight, 0);
    status = MHA_CALL(&good, &weights, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "k_weight|v_weight",
                 "q_weight without k_weight and v_weight");
    desc = good, desc.layout = (clattn_weight_layout)5;
    status = MHA_CALL(&desc, &good_weights, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "layout", "layout = 5");
    desc = good, desc.norm = (clattn_norm)9;
    status = MHA_CALL(&desc, &good_weights, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "norm", "norm = 9");
    desc = good, desc.need_weights = (clattn_need_weights)4;
    status = MHA_CALL(&desc, &good_weights, out, attn);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "need_weights",
                 "need_weights = 4");
    desc = good, desc.need_weights = CLATTN_WEIGHTS_PER_HEAD;
    status = MHA_CALL(&desc, &good_weights, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "attn_weights",
                 "need_weights PER_HEAD without attn_weights");

    /* Shapes. */
    desc = good, desc.num_heads = 3;
    status = MHA_CALL(&desc, &good_weights, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward",
                 "num_heads|heads|embed_dim|qk_dim", "E = 8 not divisible by H = 3");
    desc = good, desc.num_heads = 0;
    status = MHA_CALL(&desc, &good_weights, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "num_heads|heads",
                 "num_heads = 0");
    desc = good, desc.embed_dim = 0;
    status = MHA_CALL(&desc, &good_weights, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "embed_dim", "embed_dim = 0");
    desc = good, desc.seq_k = 0;
    status = MHA_CALL(&desc, &good_weights, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "seq_k", "seq_k = 0");
    desc = good, desc.batch = 0;
    status = MHA_CALL(&desc, &good_weights, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "batch", "batch = 0");
    desc = good, desc.kdim = embed / 2;
    status = MHA_CALL(&desc, &good_weights, out, absent);
    expect_error_either(status, CLATTN_ERR_INVALID_SHAPE, CLATTN_ERR_INVALID_ARGUMENT,
                        "mha_forward", "kdim|in_proj_weight", "in_proj_weight with kdim != E");
    desc = good, desc.qk_dim = 6, desc.v_dim = 6, desc.layout = CLATTN_LAYOUT_XW;
    desc.num_heads = 4;
    weights = good_weights, weights.in_proj_weight = absent, weights.in_proj_bias = absent;
    weights.q_weight = tu_tensor(buf.q_weight, 0);
    weights.k_weight = tu_tensor(buf.q_weight, 0);
    weights.v_weight = tu_tensor(buf.q_weight, 0);
    weights.out_weight = absent, weights.out_bias = absent;
    status = MHA_CALL(&desc, &weights, out, absent);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "qk_dim|num_heads|heads",
                 "qk_dim = 6 not divisible by 4 heads (E = 8 is)");

    /* Buffers too small. */
    status = MHA_CALL(&good, &good_weights, tu_tensor(buf.out, 1), absent);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "mha_forward", "out", "out offset 1");
    status = clattn_mha_forward(ctx, &good, &good_weights, tu_tensor(buf.query, 2), query, query,
                                out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "mha_forward", "query", "query offset 2");
    weights = good_weights, weights.in_proj_weight = tu_tensor(buf.in_proj, 1);
    status = MHA_CALL(&good, &weights, out, absent);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "mha_forward", "in_proj_weight",
                 "in_proj_weight offset 1");
    weights = good_weights, weights.in_proj_bias = tu_tensor(buf.small, 0);
    status = MHA_CALL(&good, &weights, out, absent);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "mha_forward", "in_proj_bias",
                 "in_proj_bias too small");
    weights = good_weights, weights.out_bias = tu_tensor(buf.small, 0);
    status = MHA_CALL(&good, &weights, out, absent);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "mha_forward", "out_bias",
                 "out_bias one float short");
    weights = good_weights, weights.out_weight = tu_tensor(buf.out_weight, 3);
    status = MHA_CALL(&good, &weights, out, absent);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "mha_forward", "out_weight",
                 "out_weight offset 3");
    desc = good, desc.need_weights = CLATTN_WEIGHTS_PER_HEAD;
    status = MHA_CALL(&desc, &good_weights, out, tu_tensor(buf.attn, 1));
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "mha_forward", "attn_weights",
                 "attn_weights offset 1");

    /* Overflow. */
    desc = good, desc.seq_q = SIZE_MAX / 2;
    status = MHA_CALL(&desc, &good_weights, out, absent);
    expect_error(status, CLATTN_ERR_OVERFLOW, "mha_forward", NULL, "seq_q = SIZE_MAX/2");
    desc = good, desc.embed_dim = SIZE_MAX / 2 + 1, desc.num_heads = 1;
    status = MHA_CALL(&desc, &good_weights, out, absent);
    expect_error(status, CLATTN_ERR_OVERFLOW, "mha_forward", NULL, "embed_dim = SIZE_MAX/2+1");
#undef MHA_CALL

    tu_release_mem(buf.small);
    tu_release_mem(buf.q_weight);
    tu_release_mem(buf.out_bias);
    tu_release_mem(buf.out_weight);
    tu_release_mem(buf.in_bias);
    tu_release_mem(buf.in_proj);
    tu_release_mem(buf.attn);
    tu_release_mem(buf.out);
    tu_release_mem(buf.query);
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
    float *query = tu_random_floats(batch * seq * embed);
    float *weight = tu_random_floats(3 * embed * embed);
    float *out = tu_nan_floats(batch * seq * embed);
    const clattn_mha_desc good = {.batch = batch,
                                  .seq_q = seq,
                                  .seq_k = seq,
                                  .embed_dim = embed,
                                  .num_heads = 2,
                                  .layout = CLATTN_LAYOUT_TORCH};
    clattn_mha_host_weights weights = {0};
    weights.in_proj_weight = weight;
    clattn_mha_desc desc;
    clattn_status status;

    status = clattn_mha_forward_host(NULL, &good, &weights, query, NULL, NULL, NULL, out, NULL);
    tu_expect_status(status, CLATTN_ERR_INVALID_ARGUMENT, "clattn_mha_forward_host(NULL ctx)");
    status = clattn_mha_forward_host(ctx, NULL, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "desc", "host NULL desc");
    status = clattn_mha_forward_host(ctx, &good, NULL, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "weights",
                 "host NULL weights");
    status = clattn_mha_forward_host(ctx, &good, &weights, NULL, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "query", "host NULL query");
    status = clattn_mha_forward_host(ctx, &good, &weights, query, NULL, NULL, NULL, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "out", "host NULL out");
    desc = good, desc.need_weights = CLATTN_WEIGHTS_AVERAGED;
    status = clattn_mha_forward_host(ctx, &desc, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "attn_weights",
                 "host AVERAGED without attn_weights");
    desc = good, desc.num_heads = 3;
    status = clattn_mha_forward_host(ctx, &desc, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward",
                 "num_heads|heads|embed_dim|qk_dim", "host E = 4 not divisible by H = 3");
    desc = good, desc.layout = CLATTN_LAYOUT_XW;
    status = clattn_mha_forward_host(ctx, &desc, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "in_proj_weight|layout",
                 "host in_proj_weight with layout XW");
    desc = good, desc.seq_q = SIZE_MAX / 2;
    status = clattn_mha_forward_host(ctx, &desc, &weights, query, NULL, NULL, NULL, out, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "mha_forward", NULL, "host seq_q = SIZE_MAX/2");

    free(out);
    free(weight);
    free(query);
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
        tu_expect(message[0] != '\0', "clattn_ctx_create('%s') left no message", bad_specs[i]);
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
    tu_expect(message[0] != '\0', "CLATTN_DEVICE=banana: no message");
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
    status = clattn_ctx_create("banana", NULL, NULL, 0);
    tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT || status == CLATTN_ERR_NO_DEVICE,
              "clattn_ctx_create(out NULL) returned %s", clattn_status_string(status));
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
    tu_expect(queue_message[0] != '\0', "from_queue(NULL) left no message");

    tu_set_case("NULL handles");
    clattn_ctx_release(NULL);
    const char *null_message = clattn_last_error(NULL);
    tu_expect(null_message != NULL, "clattn_last_error(NULL) is NULL");
    tu_expect(clattn_finish(NULL) == CLATTN_ERR_INVALID_ARGUMENT, "clattn_finish(NULL) returned %s",
              clattn_status_string(clattn_finish(NULL)));

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
    static const int unknown[] = {12345, 1, -500, -999, -2047, -2057, -3000, INT32_MIN};
    for (int i = 0; i < COUNT_OF(unknown); ++i) {
        const char *got = clattn_status_string((clattn_status)unknown[i]);
        tu_expect(got != NULL && strcmp(got, "CLATTN_UNKNOWN_STATUS") == 0,
                  "clattn_status_string(%d) = '%s', want CLATTN_UNKNOWN_STATUS", unknown[i],
                  got ? got : "(null)");
    }
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
    clattn_attention_desc desc = {(size_t)1 << 20,     1,  (size_t)1 << 12, 1, 4, 1, 0.0f,
                                  CLATTN_NORM_SOFTMAX, {0}, CLATTN_PATH_AUTO};
    clattn_status status = clattn_attention_host(tu_ctx(), &desc, q, k, v, NULL, out, NULL);
    if (status == CLATTN_ERR_HOST_MEMORY || status == CLATTN_ERR_UNSUPPORTED) {
        status = CLATTN_ERR_TOO_LARGE; /* acceptable too; the message is still checked */
    }
    expect_error(status, CLATTN_ERR_TOO_LARGE, "attention", NULL, "attention host 2^34 floats");
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- buffers of another cl_context ---------------------------------------------------------- */

/* Records a failure unless the count floats of mem are all still NaN (nothing was written). */
static void expect_untouched(cl_mem mem, size_t count, const char *call)
{
    float *got = tu_floats(count);
    tu_read_floats(mem, 0, count, got);
    char what[160];
    snprintf(what, sizeof what, "%s: the output", call);
    tu_expect_nan_outside(what, got, count, 0, 0);
    free(got);
}

/* A cl_mem made in a second cl_context (same device) passed as each tensor of each op: refused
 * with CLATTN_ERR_INVALID_ARGUMENT and a message naming the tensor and the other cl_context,
 * before anything is enqueued (the outputs keep their NaN). */
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
    const clattn_tensor foreign = {foreign_mem, 0};
    cl_mem in_mem = tu_nan_buffer(FLOATS), out_mem = tu_nan_buffer(FLOATS);
    const clattn_tensor in = {in_mem, 0}, out = {out_mem, 0};
    clattn_status status;

    /* matmul: each of a, b, bias and c. */
    const clattn_matmul_desc mm = {.m = 4, .n = 5, .k = 3, .alpha = 1.0f};
    status = clattn_matmul(ctx, &mm, foreign, in, absent, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "a", "matmul(foreign a)");
    status = clattn_matmul(ctx, &mm, in, foreign, absent, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "b", "matmul(foreign b)");
    status = clattn_matmul(ctx, &mm, in, in, foreign, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "bias", "matmul(foreign bias)");
    tu_expect(strstr(clattn_last_error(ctx), "another cl_context") != NULL,
              "matmul(foreign bias): message '%s' does not say 'another cl_context'",
              clattn_last_error(ctx));
    expect_untouched(out_mem, FLOATS, "matmul(foreign a, b, bias)");
    status = clattn_matmul(ctx, &mm, in, in, absent, foreign, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "c", "matmul(foreign c)");

    /* softmax_rows: scores, out, and the additive mask. */
    clattn_softmax_desc sm = {.batch = 1, .heads = 2, .seq_q = 3, .seq_k = 4};
    status = clattn_softmax_rows(ctx, &sm, foreign, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "softmax_rows", "scores",
                 "softmax(foreign scores)");
    status = clattn_softmax_rows(ctx, &sm, in, foreign, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "softmax_rows", "out",
                 "softmax(foreign out)");
    sm.masks.attn_mask = foreign;
    status = clattn_softmax_rows(ctx, &sm, in, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "softmax_rows", "attn_mask",
                 "softmax(foreign attn_mask)");
    expect_untouched(out_mem, FLOATS, "softmax(foreign scores, attn_mask)");

    /* split / concat heads. */
    const clattn_heads_desc hd = {.batch = 2, .seq = 3, .heads = 2, .head_dim = 4};
    status = clattn_split_heads(ctx, &hd, foreign, out, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "split_heads", "src",
                 "split_heads(foreign src)");
    status = clattn_concat_heads(ctx, &hd, in, foreign, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "concat_heads", "dst",
                 "concat_heads(foreign dst)");

    /* attention (both paths), the fused op, and its optional tensors. */
    const clattn_attention_desc ad = {
        1, 2, 3, 4, 5, 6, 0.0f, CLATTN_NORM_SOFTMAX, {0}, CLATTN_PATH_AUTO};
    status = clattn_attention(ctx, &ad, foreign, in, in, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "q", "attention(foreign q)");
    status = clattn_attention(ctx, &ad, in, in, foreign, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "v", "attention(foreign v)");
    status = clattn_attention(ctx, &ad, in, in, in, out, foreign, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "weights",
                 "attention(foreign weights)");
    clattn_attention_desc masked = ad;
    masked.masks.key_padding_mask = foreign;
    status = clattn_attention(ctx, &masked, in, in, in, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "attention", "key_padding_mask",
                 "attention(foreign key_padding_mask)");
    status = clattn_flash_attention(ctx, &ad, in, foreign, in, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "flash_attention", "k",
                 "flash_attention(foreign k)");
    status = clattn_flash_attention(ctx, &ad, in, in, in, out, foreign, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "flash_attention", "lse",
                 "flash_attention(foreign lse)");
    expect_untouched(out_mem, FLOATS, "attention(foreign q, v, weights, masks, k, lse)");

    /* mha_forward: an input and a weight. */
    const clattn_mha_desc md = {.batch = 1,
                                .seq_q = 3,
                                .seq_k = 3,
                                .embed_dim = 4,
                                .num_heads = 2,
                                .layout = CLATTN_LAYOUT_TORCH};
    const clattn_mha_weights mw = {.in_proj_weight = in, .out_weight = foreign};
    status = clattn_mha_forward(ctx, &md, &mw, in, in, in, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "out_weight",
                 "mha_forward(foreign out_weight)");
    const clattn_mha_weights packed = {.in_proj_weight = in};
    status =
        clattn_mha_forward(ctx, &md, &packed, in, foreign, foreign, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "key",
                 "mha_forward(foreign key)");
    expect_untouched(out_mem, FLOATS, "mha_forward(foreign out_weight, key)");

    tu_release_mem(out_mem);
    tu_release_mem(in_mem);
    tu_release_mem(foreign_mem);
    clReleaseContext(other);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- the kernels' 32-bit dimension limit ---------------------------------------------------- */

/* A single dimension above UINT32_MAX (no size overflowing size_t) is refused with
 * CLATTN_ERR_UNSUPPORTED naming it, before any buffer is looked at; UINT32_MAX itself passes that
 * check and is refused only because the (small) buffers cannot hold it. */
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
    const clattn_tensor t = {mem, 0};
    clattn_status status;

    const clattn_softmax_desc sm = {.batch = 1, .heads = 1, .seq_q = 1, .seq_k = 1};
    clattn_softmax_desc sd = sm;
    sd.seq_q = over;
    status = clattn_softmax_rows(ctx, &sd, t, t, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_UNSUPPORTED, "softmax_rows", "seq_q", "softmax seq_q = 2^32");
    tu_expect(strstr(clattn_last_error(ctx), "seq_q=4294967296") != NULL &&
                  strstr(clattn_last_error(ctx), "32-bit") != NULL,
              "softmax seq_q = 2^32: message '%s' lacks 'seq_q=4294967296' or '32-bit'",
              clattn_last_error(ctx));
    sd = sm, sd.seq_k = over;
    status = clattn_softmax_rows(ctx, &sd, t, t, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_UNSUPPORTED, "softmax_rows", "seq_k", "softmax seq_k = 2^32");
    sd = sm, sd.seq_k = limit;
    status = clattn_softmax_rows(ctx, &sd, t, t, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "softmax_rows", "scores",
                 "softmax seq_k = 2^32 - 1");

    const clattn_heads_desc hm = {.batch = 1, .seq = 1, .heads = 1, .head_dim = 1};
    clattn_heads_desc hd = hm;
    hd.seq = over;
    status = clattn_split_heads(ctx, &hd, t, t, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_UNSUPPORTED, "split_heads", "seq", "split_heads seq = 2^32");
    hd = hm, hd.head_dim = over;
    status = clattn_concat_heads(ctx, &hd, t, t, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_UNSUPPORTED, "concat_heads", "head_dim",
                 "concat_heads head_dim = 2^32");

    const clattn_attention_desc am = {
        1, 1, 1, 1, 1, 1, 0.0f, CLATTN_NORM_SOFTMAX, {0}, CLATTN_PATH_AUTO};
    clattn_attention_desc ad = am;
    ad.seq_k = over;
    status = clattn_attention(ctx, &ad, t, t, t, t, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_UNSUPPORTED, "attention", "seq_k", "attention seq_k = 2^32");
    ad = am, ad.heads = over;
    status = clattn_attention(ctx, &ad, t, t, t, t, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_UNSUPPORTED, "attention", "heads", "attention heads = 2^32");
    ad = am, ad.head_dim_v = limit;
    status = clattn_attention(ctx, &ad, t, t, t, t, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "attention", "v|out",
                 "attention head_dim_v = 2^32 - 1");
    float one[1] = {0.0f}, result[1];
    ad = am, ad.seq_q = over;
    status = clattn_attention_host(ctx, &ad, one, one, one, NULL, result, NULL);
    expect_error(status, CLATTN_ERR_UNSUPPORTED, "attention", "seq_q",
                 "attention host seq_q = 2^32");

    const clattn_mha_desc mm = {.batch = 1,
                                .seq_q = 1,
                                .seq_k = 1,
                                .embed_dim = 2,
                                .num_heads = 1,
                                .layout = CLATTN_LAYOUT_XW};
    const clattn_mha_weights mw = {.q_weight = t, .k_weight = t, .v_weight = t};
    clattn_mha_desc md = mm;
    md.seq_k = over;
    status = clattn_mha_forward(ctx, &md, &mw, t, t, t, t, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_UNSUPPORTED, "mha_forward", "seq_k", "mha seq_k = 2^32");
    md = mm, md.kdim = over;
    status = clattn_mha_forward(ctx, &md, &mw, t, t, t, t, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_UNSUPPORTED, "mha_forward", "kdim", "mha kdim = 2^32");

    /* matmul checks its operands' buffers first: a 2^32-row A needs a 16 GiB buffer, so the
     * small one is what is refused. */
    const clattn_matmul_desc mat = {.m = over, .n = 1, .k = 1, .alpha = 1.0f};
    status = clattn_matmul(ctx, &mat, t, t, absent, t, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "matmul", "a", "matmul m = 2^32");

    float *left = tu_floats(64);
    tu_read_floats(mem, 0, 64, left);
    tu_expect_nan_outside("buffer after the refused calls", left, 64, 0, 0);
    free(left);
    tu_release_mem(mem);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- multi-head weight combinations and self-attention shapes -------------------------------- */

/* Combinations of weights that contradict each other, and host calls whose omitted key/value
 * (self-attention) contradict the description. */
START_TEST(test_mha_weight_combinations)
{
    TU_BEGIN_TEST();
    tu_set_case("mha_forward weight combinations");
    clattn_ctx *ctx = tu_ctx();
    const size_t batch = 1, seq = 3, embed = 4;
    cl_mem big = tu_nan_buffer(256), out_mem = tu_nan_buffer(batch * seq * embed);
    const clattn_tensor t = {big, 0}, out = {out_mem, 0};
    const clattn_mha_desc good = {.batch = batch,
                                  .seq_q = seq,
                                  .seq_k = seq,
                                  .embed_dim = embed,
                                  .num_heads = 2,
                                  .layout = CLATTN_LAYOUT_TORCH};
    const clattn_mha_weights packed = {.in_proj_weight = t};
    const clattn_mha_weights separate = {.q_weight = t, .k_weight = t, .v_weight = t};
    clattn_mha_weights w;
    clattn_mha_desc desc;
    clattn_status status;

    w = packed, w.k_bias = t;
    status = clattn_mha_forward(ctx, &good, &w, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "in_proj_bias",
                 "in_proj_weight with k_bias");
    w = separate, w.in_proj_bias = t;
    status = clattn_mha_forward(ctx, &good, &w, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "in_proj_bias",
                 "in_proj_bias without in_proj_weight");
    w = separate, w.out_bias = t;
    status = clattn_mha_forward(ctx, &good, &w, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "out_bias|out_weight",
                 "out_bias without out_weight");
    desc = good, desc.v_dim = 3;
    status = clattn_mha_forward(ctx, &desc, &separate, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "v_dim",
                 "v_dim = 3 not divisible by 2 heads");
    desc = good, desc.vdim = 2;
    status = clattn_mha_forward(ctx, &desc, &packed, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "in_proj_weight|vdim",
                 "in_proj_weight with vdim != E");
    w = separate, w.v_weight = absent;
    status = clattn_mha_forward(ctx, &good, &w, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "v_weight",
                 "q_weight and k_weight without v_weight");
    w = separate, w.q_bias = tu_tensor(big, 255);
    status = clattn_mha_forward(ctx, &good, &w, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "mha_forward", "q_bias",
                 "q_bias past the end of its buffer");
    expect_untouched(out_mem, batch * seq * embed, "mha_forward(contradicting weights)");

    /* Host calls: key omitted (self-attention) with a kdim, or with seq_k != seq_q. */
    float *query = tu_random_floats(batch * 5 * embed), *weight = tu_random_floats(embed * embed);
    float *host_out = tu_nan_floats(batch * 5 * embed);
    const clattn_mha_host_weights hw = {.q_weight = weight, .k_weight = weight, .v_weight = weight};
    desc = good, desc.kdim = 2;
    status = clattn_mha_forward_host(ctx, &desc, &hw, query, NULL, NULL, NULL, host_out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "kdim|key",
                 "host key omitted with kdim = 2");
    desc = good, desc.vdim = 2;
    status = clattn_mha_forward_host(ctx, &desc, &hw, query, query, NULL, NULL, host_out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "vdim|value",
                 "host value omitted with vdim = 2");
    desc = good, desc.seq_k = 5;
    status = clattn_mha_forward_host(ctx, &desc, &hw, query, NULL, NULL, NULL, host_out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "seq_k",
                 "host key omitted with seq_k != seq_q");
    tu_expect_nan_outside("host out after the refused calls", host_out, batch * 5 * embed, 0, 0);

    free(host_out);
    free(weight);
    free(query);
    tu_release_mem(out_mem);
    tu_release_mem(big);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- every size computation's overflow, one at a time ---------------------------------------- */

/* Each size the library computes, made to overflow alone while every size computed before it
 * fits: CLATTN_ERR_OVERFLOW with a message naming that size (not a later BUFFER_TOO_SMALL from
 * a wrapped-around product). The buffers are tiny; nothing may be enqueued. */
START_TEST(test_overflow_each_size)
{
    TU_BEGIN_TEST();
    tu_set_case("overflow of each size in turn");
    if (SIZE_MAX <= UINT32_MAX) {
        TU_END_TEST(); /* the sizes below assume a 64-bit size_t */
        return;
    }
    clattn_ctx *ctx = tu_ctx();
    const size_t big = (size_t)1 << 31, huge = (size_t)1 << 40;
    cl_mem mem = tu_nan_buffer(64);
    const clattn_tensor t = {mem, 0};
    clattn_status status;

    /* attention: k, out and the scores (q, v: test_attention_errors). */
    const clattn_attention_desc one = {
        1, 1, 1, 1, 1, 1, 0.0f, CLATTN_NORM_SOFTMAX, {0}, CLATTN_PATH_UNFUSED};
    clattn_attention_desc ad = one;
    ad.seq_k = SIZE_MAX / 2;
    status = clattn_attention(ctx, &ad, t, t, t, t, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "attention", "k", "attention k overflows");
    ad = one, ad.seq_q = big, ad.head_dim_v = big;
    status = clattn_attention(ctx, &ad, t, t, t, t, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "attention", "out", "attention out overflows");
    ad = one, ad.seq_q = big, ad.seq_k = big;
    status = clattn_attention(ctx, &ad, t, t, t, t, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "attention", "scores", "attention scores overflow");

    /* mha_forward: inputs, output, each weight, the weights returned, the projections. */
    const clattn_mha_desc unit = {.batch = 1,
                                  .seq_q = 1,
                                  .seq_k = 1,
                                  .embed_dim = 1,
                                  .num_heads = 1,
                                  .layout = CLATTN_LAYOUT_XW};
    const clattn_mha_weights separate = {.q_weight = t, .k_weight = t, .v_weight = t};
    static const struct {
        size_t seq_q, seq_k, embed_dim, kdim, vdim, qk_dim, v_dim;
        const char *names, *label;
    } mha_cases[] = {
        {1, huge, 1, huge, 0, 0, 0, "key", "key (seq_k * kdim)"},
        {1, huge, 1, 1, huge, 0, 0, "value", "value (seq_k * vdim)"},
        {big, 1, 1, 0, 0, 0, big, "out", "out (seq_q * v_dim, no out weight)"},
        {1, 1, big, 0, 0, big, 1, "weights", "q_weight (embed_dim * qk_dim)"},
        {1, 1, 1, big, 0, big, 1, "weights", "k_weight (kdim * qk_dim)"},
        {1, 1, 1, 0, big, 1, big, "weights", "v_weight (vdim * v_dim)"},
        {big, big, 1, 0, 0, 0, 0, "weights", "the weights returned (seq_q * seq_k)"},
        {big, 1, 1, 0, 0, (size_t)1 << 30, 1, "projections", "the projections"},
    };
    for (int i = 0; i < COUNT_OF(mha_cases); ++i) {
        clattn_mha_desc md = unit;
        md.seq_q = mha_cases[i].seq_q, md.seq_k = mha_cases[i].seq_k;
        md.embed_dim = mha_cases[i].embed_dim, md.kdim = mha_cases[i].kdim;
        md.vdim = mha_cases[i].vdim, md.qk_dim = mha_cases[i].qk_dim;
        md.v_dim = mha_cases[i].v_dim;
        status = clattn_mha_forward(ctx, &md, &separate, t, t, t, t, absent, 0, NULL, NULL);
        expect_error(status, CLATTN_ERR_OVERFLOW, "mha_forward", mha_cases[i].names,
                     mha_cases[i].label);
    }
    /* out_weight (v_dim * embed_dim) with every other weight small, and in_proj (3 E^2). */
    clattn_mha_desc md = unit;
    md.embed_dim = big, md.kdim = 1, md.vdim = 1, md.qk_dim = 1, md.v_dim = big;
    clattn_mha_weights with_out = separate;
    with_out.out_weight = t;
    status = clattn_mha_forward(ctx, &md, &with_out, t, t, t, t, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "mha_forward", "weights", "out_weight overflows");
    md = unit, md.embed_dim = 1518500250, md.layout = CLATTN_LAYOUT_TORCH; /* E^2 fits, 3E^2 not */
    const clattn_mha_weights packed = {.in_proj_weight = t};
    status = clattn_mha_forward(ctx, &md, &packed, t, t, t, t, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "mha_forward", "weights", "in_proj overflows");

    /* Host API: the sum of the parameters to stage overflows, though each of them fits (the
     * four weights just under 2^62 elements each, plus the biases). */
    float dummy[4] = {0};
    const clattn_mha_host_weights all = {.in_proj_bias = dummy,
                                         .q_weight = dummy,
                                         .k_weight = dummy,
                                         .v_weight = dummy,
                                         .q_bias = dummy,
                                         .k_bias = dummy,
                                         .v_bias = dummy,
                                         .out_weight = dummy,
                                         .out_bias = dummy};
    md = unit;
    md.embed_dim = md.kdim = md.vdim = 1239850262;
    md.qk_dim = md.v_dim = 3719550787u;
    status = clattn_mha_forward_host(ctx, &md, &all, dummy, NULL, NULL, NULL, dummy, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "mha_forward", "weights",
                 "host: the staged parameters overflow together");

    /* Heads: heads * head_dim, and the strided extent. */
    clattn_heads_desc hd = {.batch = 1, .seq = 1, .heads = huge, .head_dim = huge};
    status = clattn_split_heads(ctx, &hd, t, t, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "split_heads", NULL, "heads * head_dim");
    hd = (clattn_heads_desc){
        .batch = 1, .seq = 3, .heads = 1, .head_dim = 1, .row_stride = SIZE_MAX / 2 + 1};
    status = clattn_concat_heads(ctx, &hd, t, t, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "concat_heads", "row_stride", "row_stride extent");

    /* softmax: rows * seq_k, and rows * the work-group width (seq_k = 1). */
    clattn_softmax_desc sd = {.batch = 1, .heads = 1, .seq_q = 4, .seq_k = SIZE_MAX / 2};
    status = clattn_softmax_rows(ctx, &sd, t, t, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "softmax_rows", "scores", "rows * seq_k");
    sd = (clattn_softmax_desc){.batch = 1, .heads = 1, .seq_q = SIZE_MAX / 2 + 1, .seq_k = 1};
    status = clattn_softmax_rows(ctx, &sd, t, t, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "softmax_rows", "scores", "rows * work-group");

    /* A tensor offset so large that offset + elements wraps around. */
    const clattn_matmul_desc mm = {.m = 2, .n = 2, .k = 2, .alpha = 1.0f};
    status = clattn_matmul(ctx, &mm, t, t, absent, tu_tensor(mem, SIZE_MAX - 1), 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_OVERFLOW, "matmul", "c", "c offset SIZE_MAX - 1");

    float *left = tu_floats(64);
    tu_read_floats(mem, 0, 64, left);
    tu_expect_nan_outside("buffer after the refused calls", left, 64, 0, 0);
    free(left);
    tu_release_mem(mem);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

/* --- argument combinations not covered above ----------------------------------------------- */

START_TEST(test_more_argument_errors)
{
    TU_BEGIN_TEST();
    tu_set_case("wait lists, packed weights, self-attention shapes, NULL handles");
    clattn_ctx *ctx = tu_ctx();
    cl_mem mem = tu_nan_buffer(256), out_mem = tu_nan_buffer(64);
    const clattn_tensor t = {mem, 0}, out = {out_mem, 0};
    clattn_status status;

    /* A wait list given with num_wait = 0. */
    cl_event marker = NULL;
    cl_int err = clEnqueueMarkerWithWaitList(clattn_ctx_queue(ctx), 0, NULL, &marker);
    tu_expect(err == CL_SUCCESS, "clEnqueueMarkerWithWaitList: %d", (int)err);
    const clattn_matmul_desc mm = {.m = 2, .n = 2, .k = 2, .alpha = 1.0f};
    status = clattn_matmul(ctx, &mm, t, t, absent, out, 0, &marker, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "matmul", "num_wait",
                 "matmul(num_wait 0, wait given)");
    tu_expect(strstr(clattn_last_error(ctx), "num_wait=0") &&
                  strstr(clattn_last_error(ctx), "given"),
              "num_wait 0 with a list: message '%s'", clattn_last_error(ctx));
    if (marker != NULL) {
        clWaitForEvents(1, &marker);
        clReleaseEvent(marker);
    }

    /* in_proj_weight with a separate v_weight or v_bias; qk_dim or v_dim with in_proj. */
    const clattn_mha_desc md = {.batch = 1,
                                .seq_q = 2,
                                .seq_k = 2,
                                .embed_dim = 4,
                                .num_heads = 2,
                                .layout = CLATTN_LAYOUT_TORCH};
    clattn_mha_weights w = {.in_proj_weight = t, .v_weight = t};
    status = clattn_mha_forward(ctx, &md, &w, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "in_proj_weight|v_weight",
                 "in_proj_weight with v_weight");
    w = (clattn_mha_weights){.in_proj_weight = t, .v_bias = t};
    status = clattn_mha_forward(ctx, &md, &w, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "in_proj_bias",
                 "in_proj_weight with v_bias");
    w = (clattn_mha_weights){.in_proj_weight = t, .k_weight = t};
    status = clattn_mha_forward(ctx, &md, &w, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "in_proj_weight|k_weight",
                 "in_proj_weight with k_weight");
    w = (clattn_mha_weights){.in_proj_weight = t, .q_bias = t};
    status = clattn_mha_forward(ctx, &md, &w, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_ARGUMENT, "mha_forward", "in_proj_bias",
                 "in_proj_weight with q_bias");
    w = (clattn_mha_weights){
        .q_weight = t, .k_weight = t, .v_weight = t, .q_bias = t, .k_bias = tu_tensor(mem, 255)};
    status = clattn_mha_forward(ctx, &md, &w, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "mha_forward", "k_bias",
                 "k_bias past the end (q_bias fits)");
    w = (clattn_mha_weights){.in_proj_weight = t};
    clattn_mha_desc desc = md;
    desc.qk_dim = 2;
    status = clattn_mha_forward(ctx, &desc, &w, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "in_proj_weight",
                 "in_proj_weight with qk_dim 2");
    desc = md, desc.v_dim = 2;
    status = clattn_mha_forward(ctx, &desc, &w, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "in_proj_weight",
                 "in_proj_weight with v_dim 2");
    /* embed_dim 5 over 2 heads with qk_dim 4: the message names embed_dim as the v width. */
    desc = md, desc.embed_dim = 5, desc.qk_dim = 4, desc.layout = CLATTN_LAYOUT_XW;
    const clattn_mha_weights separate = {.q_weight = t, .k_weight = t, .v_weight = t};
    status = clattn_mha_forward(ctx, &desc, &separate, t, t, t, out, absent, 0, NULL, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "embed_dim",
                 "v width embed_dim 5 over 2 heads");

    /* The fused op: each tensor one element short (its own offset past the fit). */
    const clattn_attention_desc fd = {
        1, 2, 4, 4, 8, 8, 0.0f, CLATTN_NORM_SOFTMAX, {0}, CLATTN_PATH_FUSED};
    static const char *const fused_names[] = {"q", "k", "v", "out", "lse"};
    /* q, k, v (1, 2, 4, 8) in the 256-float buffer, out in the 64-float one, lse (8 rows). */
    static const size_t short_offsets[] = {256 - 64 + 1, 256 - 64 + 1, 256 - 64 + 1, 1, 64 - 8 + 1};
    for (int i = 0; i < 5; ++i) {
        clattn_tensor args[5] = {t, t, t, out, tu_tensor(out_mem, 0)};
        args[i].offset = short_offsets[i];
        status = clattn_flash_attention(ctx, &fd, args[0], args[1], args[2], args[3], args[4], 0,
                                        NULL, NULL);
        char call[64];
        snprintf(call, sizeof call, "flash_attention(%s one short)", fused_names[i]);
        expect_error(status, CLATTN_ERR_BUFFER_TOO_SMALL, "flash_attention", fused_names[i], call);
    }

    /* Host: value is the query but key is not, with seq_k != seq_q. */
    float *query = tu_random_floats(64), *key = tu_random_floats(64), *host_out = tu_nan_floats(64);
    const clattn_mha_host_weights hw = {.q_weight = query, .k_weight = query, .v_weight = query};
    desc = md, desc.seq_k = 3, desc.layout = CLATTN_LAYOUT_XW;
    status = clattn_mha_forward_host(ctx, &desc, &hw, query, key, query, NULL, host_out, NULL);
    expect_error(status, CLATTN_ERR_INVALID_SHAPE, "mha_forward", "seq_k",
                 "host value = query with seq_k != seq_q");
    tu_expect_nan_outside("host out after the refused call", host_out, 64, 0, 0);

    /* NULL handles on the accessors; from_queue with out NULL. */
    tu_expect(clattn_ctx_cl_context(NULL) == NULL && clattn_ctx_queue(NULL) == NULL &&
                  clattn_ctx_device(NULL) == NULL,
              "an accessor of a NULL context is not NULL");
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

    free(host_out);
    free(key);
    free(query);
    float *left = tu_floats(64);
    tu_read_floats(out_mem, 0, 64, left);
    tu_expect_nan_outside("out after the refused calls", left, 64, 0, 0);
    free(left);
    tu_release_mem(out_mem);
    tu_release_mem(mem);
    expect_context_still_works();
    TU_END_TEST();
}
END_TEST

static Suite *errors_suite(void)
{
    Suite *suite = suite_create("errors");
    TCase *ops = tcase_create("ops");
    tcase_set_timeout(ops, 600);
    tcase_add_test(ops, test_matmul_errors);
    tcase_add_test(ops, test_softmax_errors);
    tcase_add_loop_test(ops, test_heads_errors, 0, 2);
    tcase_add_test(ops, test_attention_errors);
    tcase_add_test(ops, test_attention_host_errors);
    tcase_add_test(ops, test_mha_errors);
    tcase_add_test(ops, test_mha_host_errors);
    tcase_add_test(ops, test_mha_weight_combinations);
    suite_add_tcase(suite, ops);

    TCase *runtime = tcase_create("runtime");
    tcase_set_timeout(runtime, 600);
    tcase_add_test(runtime, test_context_errors);
    tcase_add_test(runtime, test_status_strings);
    tcase_add_test(runtime, test_host_too_large);
    tcase_add_test(runtime, test_foreign_buffers);
    tcase_add_test(runtime, test_dimension_limit);
    tcase_add_test(runtime, test_overflow_each_size);
    tcase_add_test(runtime, test_more_argument_errors);
    suite_add_tcase(suite, runtime);
    return suite;
}

int main(void)
{
    tu_suite_begin("check_errors");
    return tu_run_suite(errors_suite());
}
