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
    suite_add_tcase(suite, ops);

    TCase *runtime = tcase_create("runtime");
    tcase_set_timeout(runtime, 600);
    tcase_add_test(runtime, test_context_errors);
    tcase_add_test(runtime, test_status_strings);
    tcase_add_test(runtime, test_host_too_large);
    suite_add_tcase(suite, runtime);
    return suite;
}

int main(void)
{
    tu_suite_begin("check_errors");
    return tu_run_suite(errors_suite());
}
