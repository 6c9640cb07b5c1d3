/*
 * check_fault: failing device calls leave the context usable, and oversized shapes are refused
 * up front. Linked against clattn_fault (the library built with the test-only hook
 * CLATTN_FAULT_INJECTION): for each kind of call (buffer allocation, command enqueue, program
 * build) and each scenario (MHA fused, unfused, packed self-attention with per-head weights,
 * clattn_attention_host's staging, two forwards ordered on an out-of-order queue) the suite
 * counts how many calls a run makes, then for every N makes the N-th fail on a fresh context
 * and checks that the run returns an error with a message naming the user's call, that the
 * next run on the same context succeeds with the right output (float64 reference), and (under
 * -DCLATTN_SANITIZE=ON) that nothing leaks.
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

/* What one walk runs; each reaches calls the others do not. */
typedef enum scenario {
    SC_MHA_FUSED = 0,     /* cross-attention MHA through the host API, every mask: fused */
    SC_MHA_UNFUSED,       /* the same with averaged weights: unfused */
    SC_MHA_SELF_PER_HEAD, /* self-attention (one pointer): the packed (B, L, 3E) projection and
                             per-head weights */
    SC_ATTENTION_HOST,    /* clattn_attention_host: staging of q, k, v, both masks, weights */
    SC_OUT_OF_ORDER,      /* two MHA forwards on a caller's out-of-order queue: the second waits
                             for the first through the ordering marker */
    SC_COUNT
} scenario;
static const char *const scenario_names[SC_COUNT] = {
    "MHA fused", "MHA unfused", "MHA packed self-attention, per-head weights",
    "attention_host staging", "two MHA forwards on an out-of-order queue"};

typedef struct problem {
    scenario sc;
    clattn_mha_desc desc;
    clattn_attention_desc attention;
    float *query, *kv, *v, *w_in, *b_in, *w_out, *b_out, *mask;
    uint8_t *padding;
    clattn_mha_host_weights weights;
    clattn_host_masks masks;
    double *want, *want_weights;
    size_t out_count, weights_count;
} problem;

static void make_problem(problem *p, scenario sc)
{
    memset(p, 0, sizeof *p);
    p->sc = sc;
    const int self = sc == SC_MHA_SELF_PER_HEAD;
    const size_t b = 2, lq = self ? 11 : 9, lk = self ? 11 : 13, e = 16, heads = 4;
    const clattn_need_weights need = sc == SC_MHA_UNFUSED         ? CLATTN_WEIGHTS_AVERAGED
                                     : sc == SC_MHA_SELF_PER_HEAD ? CLATTN_WEIGHTS_PER_HEAD
                                                                  : CLATTN_WEIGHTS_NONE;
    p->desc = (clattn_mha_desc){.batch = b, .seq_q = lq, .seq_k = lk, .embed_dim = e,
                                .num_heads = heads, .layout = CLATTN_LAYOUT_TORCH,
                                .need_weights = need};
    p->query = tu_random_floats(b * lq * e);
    p->kv = self ? p->query : tu_random_floats(b * lk * e);
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
    if (sc == SC_ATTENTION_HOST) {
        /* q (2, 4, 9, 4) from query, k (2, 4, 13, 4) from kv, v (2, 4, 13, 3). */
        p->attention = (clattn_attention_desc){.batch = b, .heads = heads, .seq_q = lq,
                                               .seq_k = lk, .head_dim_qk = 4, .head_dim_v = 3};
        p->v = tu_random_floats(b * heads * lk * 3);
        p->out_count = b * heads * lq * 3;
        p->weights_count = b * heads * lq * lk;
        p->want = tu_doubles(p->out_count);
        p->want_weights = tu_doubles(p->weights_count);
        ref_attention(&p->attention, &p->masks, p->query, p->kv, p->v, p->want, p->want_weights);
        return;
    }
    p->out_count = b * lq * e;
    p->weights_count = need == CLATTN_WEIGHTS_NONE      ? 1
                       : need == CLATTN_WEIGHTS_PER_HEAD ? b * heads * lq * lk
                                                         : b * lq * lk;
    p->want = tu_doubles(p->out_count);
    p->want_weights = tu_doubles(p->weights_count);
    ref_mha_forward(&p->desc, &p->weights, p->query, p->kv, p->kv, &p->masks, p->want,
                    need == CLATTN_WEIGHTS_NONE ? NULL : p->want_weights);
}

static void free_problem(problem *p)
{
    if (p->kv != p->query)
        free(p->kv);
    free(p->query);
    free(p->v);
    free(p->w_in);
    free(p->b_in);
    free(p->w_out);
    free(p->b_out);
    free(p->mask);
    free(p->padding);
    free(p->want);
    free(p->want_weights);
}

/* The op name every message of the scenario starts with. */
static const char *op_of(const problem *p)
{
    return p->sc == SC_ATTENTION_HOST ? "attention" : "mha_forward";
}

/* One run of the scenario (two forwards for SC_OUT_OF_ORDER, stopping at a failure); checks
 * the outputs of the calls that succeed when `check` is set. */
static clattn_status forward(clattn_ctx *ctx, const problem *p, int check)
{
    const int runs = p->sc == SC_OUT_OF_ORDER ? 2 : 1;
    for (int run = 0; run < runs; ++run) {
        float *out = tu_nan_floats(p->out_count), *weights = tu_nan_floats(p->weights_count);
        const int want_weights = p->sc == SC_ATTENTION_HOST || p->desc.need_weights;
        clattn_status status =
            p->sc == SC_ATTENTION_HOST
                ? clattn_attention_host(ctx, &p->attention, p->query, p->kv, p->v, &p->masks, out,
                                        weights)
                : clattn_mha_forward_host(ctx, &p->desc, &p->weights, p->query, p->kv, p->kv,
                                          &p->masks, out, want_weights ? weights : NULL);
        if (status == CLATTN_SUCCESS && check) {
            tu_expect_close("out", out, p->want, p->out_count, TU_TOL);
            if (want_weights)
                tu_expect_close("weights", weights, p->want_weights, p->weights_count, TU_TOL);
        }
        free(out);
        free(weights);
        if (status != CLATTN_SUCCESS)
            return status; /* its message stays the context's last error */
    }
    return CLATTN_SUCCESS;
}

/* A fresh clattn context; for SC_OUT_OF_ORDER on an out-of-order queue of the test's own,
 * returned in *queue (released by release_context). */
static clattn_ctx *fresh_context(const problem *p, cl_command_queue *queue)
{
    clattn_ctx *ctx = NULL;
    char message[512];
    *queue = NULL;
    if (p->sc != SC_OUT_OF_ORDER) {
        clattn_status status = clattn_ctx_create(NULL, &ctx, message, sizeof message);
        tu_expect(status == CLATTN_SUCCESS, "clattn_ctx_create: %s", message);
        return ctx;
    }
    cl_device_id device = clattn_ctx_device(tu_ctx());
    cl_int err = CL_SUCCESS;
    cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (!tu_expect(err == CL_SUCCESS, "clCreateContext: %d", (int)err))
        return NULL;
    *queue = clCreateCommandQueue(context, device, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
    clReleaseContext(context); /* the queue keeps it */
    if (!tu_expect(err == CL_SUCCESS, "clCreateCommandQueue(out of order): %d", (int)err)) {
        *queue = NULL;
        return NULL;
    }
    clattn_status status = clattn_ctx_create_from_queue(*queue, &ctx, message, sizeof message);
    tu_expect(status == CLATTN_SUCCESS, "clattn_ctx_create_from_queue: %s", message);
    return ctx;
}

static void release_context(clattn_ctx *ctx, cl_command_queue queue)
{
    clattn_ctx_release(ctx);
    if (queue)
        clReleaseCommandQueue(queue);
}

START_TEST(test_walk_faults)
{
    TU_BEGIN_TEST();
    const clattn_fault_kind kind = (clattn_fault_kind)(_i % CLATTN_FAULT_KINDS);
    const scenario sc = (scenario)(_i / CLATTN_FAULT_KINDS);
    tu_set_case("every %s of a run of '%s' fails once", kind_names[kind], scenario_names[sc]);
    problem p;
    make_problem(&p, sc);

    /* How many calls of this kind the scenario makes on a fresh context. */
    cl_command_queue queue = NULL;
    clattn_ctx *ctx = fresh_context(&p, &queue);
    long calls = 0;
    if (ctx) {
        clattn__fault_arm(kind, 0);
        tu_expect_status(forward(ctx, &p, 1), CLATTN_SUCCESS, "run without faults");
        calls = clattn__fault_calls(kind);
    }
    release_context(ctx, queue);
    tu_expect(calls > 0, "a run made no %s calls", kind_names[kind]);

    const char *op = op_of(&p);
    for (long n = 1; n <= calls && !tu_failed(); ++n) {
        ctx = fresh_context(&p, &queue);
        if (ctx == NULL)
            break;
        clattn__fault_arm(kind, n);
        clattn_status status = forward(ctx, &p, 0);
        clattn__fault_arm(kind, 0);
        tu_expect(status != CLATTN_SUCCESS, "%s %ld of %ld failed but the run succeeded",
                  kind_names[kind], n, calls);
        tu_expect(clattn_last_error(ctx)[0] != '\0' &&
                      strncmp(clattn_last_error(ctx), op, strlen(op)) == 0,
                  "%s %ld: message '%s' does not start with the op name %s", kind_names[kind], n,
                  clattn_last_error(ctx), op);
        status = forward(ctx, &p, 1);
        tu_expect(status == CLATTN_SUCCESS, "after %s %ld failed, the next run: %s: %s",
                  kind_names[kind], n, clattn_status_string(status), clattn_last_error(ctx));
        release_context(ctx, queue);
        ++walked[kind];
    }
    free_problem(&p);
    TU_END_TEST();
}
END_TEST

/* Scores larger than the device's largest allocation: the unfused path is refused with a
 * message naming the size; AUTO routes to the fused kernel, which needs no
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
    /* Any correct refusal: which limit refuses it (the largest allocation, the global memory
     * where the two are equal, or the driver's clCreateBuffer) is the device's business; the
     * message names the call and the size. */
    tu_expect(status != CLATTN_SUCCESS && tu_starts_with(clattn_last_error(ctx), "attention") &&
                  strstr(clattn_last_error(ctx), bytes),
              "unfused: %s: '%s' (want a refusal naming attention and %s)",
              clattn_status_string(status), clattn_last_error(ctx), bytes);
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
    /* The out-of-order scenario (the last) is registered only where the device has
     * out-of-order queues (Mesa's rusticl has none): a walk that did not run must not pass. */
    cl_command_queue_properties properties = 0;
    const int out_of_order =
        clGetDeviceInfo(clattn_ctx_device(tu_ctx()), CL_DEVICE_QUEUE_PROPERTIES, sizeof properties,
                        &properties, NULL) == CL_SUCCESS &&
        (properties & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0;
    if (!out_of_order)
        printf("check_fault: NOT RUN: the device has no out-of-order queues; the '%s' walks are "
               "not registered\n",
               scenario_names[SC_OUT_OF_ORDER]);
    tcase_add_loop_test(faults, test_walk_faults, 0,
                        (out_of_order ? SC_COUNT : SC_OUT_OF_ORDER) * CLATTN_FAULT_KINDS);
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
