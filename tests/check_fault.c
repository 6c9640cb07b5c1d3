/*
 * check_fault: failing device calls leave the context usable, and oversized shapes are refused
 * up front. Linked against clattn_fault (the library built with the test-only hook
 * CLATTN_FAULT_INJECTION): for each kind of call (buffer allocation, command enqueue, program
 * build) the suite counts how many a full MHA forward makes, then for every N makes the N-th
 * fail on a fresh context and checks that the forward returns an error with a message, that
 * the next forward on the same context succeeds with the right output (float64 reference),
 * and (under -DCLATTN_SANITIZE=ON) that nothing leaks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "reference.h"
#include "testutil.h"

static const char *const kind_names[CLATTN_FAULT_KINDS] = {"allocation", "enqueue", "build"};
static long walked[CLATTN_FAULT_KINDS];

/* A cross-attention MHA problem with every mask; fused when need_weights is NONE. */
typedef struct problem {
    clattn_mha_desc desc;
    float *query, *kv, *w_in, *b_in, *w_out, *b_out, *mask;
    uint8_t *padding;
    clattn_mha_host_weights weights;
    clattn_host_masks masks;
    double *want, *want_weights;
    size_t out_count, weights_count;
} problem;

static void make_problem(problem *p, clattn_need_weights need)
{
    memset(p, 0, sizeof *p);
    const size_t b = 2, lq = 9, lk = 13, e = 16;
    p->desc = (clattn_mha_desc){.batch = b, .seq_q = lq, .seq_k = lk, .embed_dim = e,
                                .num_heads = 4, .layout = CLATTN_LAYOUT_TORCH,
                                .need_weights = need};
    p->query = tu_random_floats(b * lq * e);
    p->kv = tu_random_floats(b * lk * e);
    p->w_in = tu_random_floats(3 * e * e);
    p->b_in = tu_random_floats(3 * e);
    p->w_out = tu_random_floats(e * e);
    p->b_out = tu_random_floats(e);
    p->mask = tu_random_floats(lq * lk);
    p->mask[3] = -INFINITY;
    p->padding = tu_bytes(b * lk);
    p->padding[lk - 1] = 1;
    p->weights = (clattn_mha_host_weights){.in_proj_weight = p->w_in, .in_proj_bias = p->b_in,
                                           .out_weight = p->w_out, .out_bias = p->b_out};
    p->masks = (clattn_host_masks){.causal = 1, .attn_mask = p->mask,
                                   .key_padding_mask = p->padding};
    p->out_count = b * lq * e;
    p->weights_count = need == CLATTN_WEIGHTS_NONE ? 1 : b * lq * lk;
    p->want = tu_doubles(p->out_count);
    p->want_weights = tu_doubles(p->weights_count);
    ref_mha_forward(&p->desc, &p->weights, p->query, p->kv, p->kv, &p->masks, p->want,
                    need == CLATTN_WEIGHTS_NONE ? NULL : p->want_weights);
}

static void free_problem(problem *p)
{
    free(p->query);
    free(p->kv);
    free(p->w_in);
    free(p->b_in);
    free(p->w_out);
    free(p->b_out);
    free(p->mask);
    free(p->padding);
    free(p->want);
    free(p->want_weights);
}

/* One forward; checks the output when it succeeds and `check` is set. */
static clattn_status forward(clattn_ctx *ctx, const problem *p, int check)
{
    float *out = tu_nan_floats(p->out_count), *weights = tu_nan_floats(p->weights_count);
    clattn_status status =
        clattn_mha_forward_host(ctx, &p->desc, &p->weights, p->query, p->kv, p->kv, &p->masks,
                                out, p->desc.need_weights ? weights : NULL);
    if (status == CLATTN_SUCCESS && check) {
        tu_expect_close("out", out, p->want, p->out_count, TU_TOL);
        if (p->desc.need_weights)
            tu_expect_close("weights", weights, p->want_weights, p->weights_count, TU_TOL);
    }
    free(out);
    free(weights);
    return status;
}

static clattn_ctx *fresh_context(void)
{
    clattn_ctx *ctx = NULL;
    char message[512];
    clattn_status status = clattn_ctx_create(NULL, &ctx, message, sizeof message);
    tu_expect(status == CLATTN_SUCCESS, "clattn_ctx_create: %s", message);
    return ctx;
}

START_TEST(test_walk_faults)
{
    TU_BEGIN_TEST();
    const clattn_fault_kind kind = (clattn_fault_kind)(_i % CLATTN_FAULT_KINDS);
    const clattn_need_weights need = _i < CLATTN_FAULT_KINDS ? CLATTN_WEIGHTS_NONE
                                                             : CLATTN_WEIGHTS_AVERAGED;
    tu_set_case("every %s of an MHA forward (%s path) fails once", kind_names[kind],
                need == CLATTN_WEIGHTS_NONE ? "fused" : "unfused");
    problem p;
    make_problem(&p, need);

    /* How many calls of this kind a forward on a fresh context makes. */
    clattn_ctx *ctx = fresh_context();
    long calls = 0;
    if (ctx) {
        clattn__fault_arm(kind, 0);
        tu_expect_status(forward(ctx, &p, 1), CLATTN_SUCCESS, "forward without faults");
        calls = clattn__fault_calls(kind);
        clattn_ctx_release(ctx);
    }
    tu_expect(calls > 0, "a forward made no %s calls", kind_names[kind]);

    for (long n = 1; n <= calls && !tu_failed(); ++n) {
        ctx = fresh_context();
        if (ctx == NULL)
            break;
        clattn__fault_arm(kind, n);
        clattn_status status = forward(ctx, &p, 0);
        clattn__fault_arm(kind, 0);
        tu_expect(status != CLATTN_SUCCESS, "%s %ld of %ld failed but the forward succeeded",
                  kind_names[kind], n, calls);
        tu_expect(clattn_last_error(ctx)[0] != '\0' &&
                      strncmp(clattn_last_error(ctx), "mha_forward", 11) == 0,
                  "%s %ld: message '%s' does not start with the op name", kind_names[kind], n,
                  clattn_last_error(ctx));
        status = forward(ctx, &p, 1);
        tu_expect(status == CLATTN_SUCCESS, "after %s %ld failed, the next forward: %s: %s",
                  kind_names[kind], n, clattn_status_string(status), clattn_last_error(ctx));
        clattn_ctx_release(ctx);
        ++walked[kind];
    }
    free_problem(&p);
    TU_END_TEST();
}
END_TEST

/* Scores larger than the device's largest allocation: the unfused path is refused before any
 * work with a message naming the size; AUTO routes to the fused kernel, which needs no
 * workspace, and computes it (checked on its first and last rows). */
START_TEST(test_max_alloc_refused_or_fused)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    cl_ulong max_alloc = 0;
    clGetDeviceInfo(clattn_ctx_device(ctx), CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc,
                    &max_alloc, NULL);
    const size_t seq = (size_t)sqrt((double)max_alloc / sizeof(float)) + 2; /* seq^2 floats > max */
    tu_set_case("B=1 H=1 Lq=Lk=%zu d=1: scores of %.2f GiB vs max allocation %.2f GiB", seq,
                (double)seq * seq * 4 / 1073741824.0, max_alloc / 1073741824.0);
    if (seq > ((size_t)1 << 20)) { /* a device with > 4 TiB buffers: nothing to exceed here */
        TU_END_TEST();
        return;
    }
    float *q = tu_random_floats(seq), *k = tu_random_floats(seq), *v = tu_random_floats(seq);
    float *out = tu_nan_floats(seq);
    clattn_attention_desc desc = {.batch = 1, .heads = 1, .seq_q = seq, .seq_k = seq,
                                  .head_dim_qk = 1, .head_dim_v = 1,
                                  .path = CLATTN_PATH_UNFUSED};
    clattn_status status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
    char bytes[64];
    snprintf(bytes, sizeof bytes, "%zu bytes", seq * seq * sizeof(float));
    tu_expect(status == CLATTN_ERR_TOO_LARGE && strstr(clattn_last_error(ctx), bytes) &&
                  strstr(clattn_last_error(ctx), "CL_DEVICE_MAX_MEM_ALLOC_SIZE"),
              "unfused: %s: '%s' (want TOO_LARGE naming %s)", clattn_status_string(status),
              clattn_last_error(ctx), bytes);
    desc.path = CLATTN_PATH_AUTO;
    status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
    tu_expect_status(status, CLATTN_SUCCESS, "AUTO (fused) at the same size");
    if (status == CLATTN_SUCCESS) {
        const size_t rows[2] = {0, seq - 1};
        for (int r = 0; r < 2; ++r) {
            clattn_attention_desc one = desc;
            one.seq_q = 1;
            double want = 0.0;
            ref_attention(&one, NULL, q + rows[r], k, v, &want, NULL);
            tu_expect_close("sampled row", out + rows[r], &want, 1, TU_TOL);
        }
    }
    free(q);
    free(k);
    free(v);
    free(out);
    TU_END_TEST();
}
END_TEST

int main(void)
{
    tu_suite_begin("check_fault");
    Suite *suite = suite_create("fault");
    TCase *faults = tcase_create("fault injection");
    tcase_set_timeout(faults, 900);
    tcase_add_loop_test(faults, test_walk_faults, 0, 2 * CLATTN_FAULT_KINDS);
    suite_add_tcase(suite, faults);
    TCase *limits = tcase_create("limits");
    tcase_set_timeout(limits, 900);
    tcase_add_test(limits, test_max_alloc_refused_or_fused);
    suite_add_tcase(suite, limits);
    int result = tu_run_suite(suite);
    printf("check_fault: walked %ld allocation, %ld enqueue and %ld build failure points\n",
           walked[CLATTN_FAULT_ALLOC], walked[CLATTN_FAULT_ENQUEUE], walked[CLATTN_FAULT_BUILD]);
    return result;
}
