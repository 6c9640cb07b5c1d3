/*
 * check_runtime: contexts made from the caller's own queue (in-order and out-of-order), wait
 * lists and returned events, ownership (releasing a clattn context leaves the caller's queue and
 * context alive), and the accessors.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "reference.h"
#include "testutil.h"

/* A wait on an event that never completes would hang the suite: a deadlock ends it instead. */
#define DEADLOCK_ALARM_SECONDS 300

/* The caller's own OpenCL objects, on the device the shared context chose. */
typedef struct own_queue {
    cl_context context;
    cl_command_queue queue;
    cl_device_id device;
} own_queue;

static int device_supports_out_of_order(cl_device_id device)
{
    cl_command_queue_properties properties = 0;
    cl_int err =
        clGetDeviceInfo(device, CL_DEVICE_QUEUE_PROPERTIES, sizeof properties, &properties, NULL);
    return err == CL_SUCCESS && (properties & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0;
}

static int make_own_queue(int out_of_order, own_queue *own)
{
    cl_int err = CL_SUCCESS;
    own->device = clattn_ctx_device(tu_ctx());
    own->context = clCreateContext(NULL, 1, &own->device, NULL, NULL, &err);
    if (!tu_expect(err == CL_SUCCESS, "clCreateContext: %s",
                   clattn_status_string((clattn_status)err))) {
        own->context = NULL;
        own->queue = NULL;
        return 0;
    }
    cl_command_queue_properties properties =
        out_of_order ? CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE : 0;
    own->queue = clCreateCommandQueue(own->context, own->device, properties, &err);
    if (!tu_expect(err == CL_SUCCESS, "clCreateCommandQueue: %s",
                   clattn_status_string((clattn_status)err))) {
        clReleaseContext(own->context);
        own->context = NULL;
        own->queue = NULL;
        return 0;
    }
    return 1;
}

static void release_own_queue(own_queue *own)
{
    if (own->queue != NULL) {
        clReleaseCommandQueue(own->queue);
    }
    if (own->context != NULL) {
        clReleaseContext(own->context);
    }
}

static cl_uint queue_reference_count(cl_command_queue queue)
{
    cl_uint count = 0;
    clGetCommandQueueInfo(queue, CL_QUEUE_REFERENCE_COUNT, sizeof count, &count, NULL);
    return count;
}

static cl_uint context_reference_count(cl_context context)
{
    cl_uint count = 0;
    clGetContextInfo(context, CL_CONTEXT_REFERENCE_COUNT, sizeof count, &count, NULL);
    return count;
}

static cl_mem own_buffer(const own_queue *own, const void *data, size_t bytes)
{
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(own->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes,
                                (void *)data, &err);
    if (err != CL_SUCCESS) {
        ck_abort_msg("clCreateBuffer: %s [%s]", clattn_status_string((clattn_status)err),
                     tu_where());
    }
    return mem;
}

static cl_mem own_nan_buffer(const own_queue *own, size_t count)
{
    float *poison = tu_nan_floats(count);
    cl_mem mem = own_buffer(own, poison, count * sizeof(float));
    free(poison);
    return mem;
}

/* Blocking read that waits for `after` (needed on an out-of-order queue). */
static int read_after(const own_queue *own, cl_mem mem, size_t count, float *dst, cl_event after)
{
    cl_int err = clEnqueueReadBuffer(own->queue, mem, CL_TRUE, 0, count * sizeof(float), dst,
                                     after != NULL ? 1 : 0, after != NULL ? &after : NULL, NULL);
    return tu_expect(err == CL_SUCCESS, "clEnqueueReadBuffer: %s",
                     clattn_status_string((clattn_status)err));
}

static clattn_ctx *ctx_from_queue(const own_queue *own)
{
    clattn_ctx *ctx = NULL;
    char message[512] = "";
    clattn_status status = clattn_ctx_create_from_queue(own->queue, &ctx, message, sizeof message);
    tu_expect(status == CLATTN_SUCCESS && ctx != NULL,
              "clattn_ctx_create_from_queue returned %s: %s", clattn_status_string(status),
              message);
    return status == CLATTN_SUCCESS ? ctx : NULL;
}

/* After the clattn context is gone, the caller's queue still runs work. */
static void expect_queue_alive(const own_queue *own)
{
    float values[16], back[16];
    for (int i = 0; i < 16; ++i) {
        values[i] = (float)i * 0.5f;
        back[i] = NAN;
    }
    cl_mem mem = own_buffer(own, values, sizeof values);
    cl_event written = NULL;
    cl_int err = clEnqueueWriteBuffer(own->queue, mem, CL_FALSE, 0, sizeof values, values, 0, NULL,
                                      &written);
    tu_expect(err == CL_SUCCESS, "write on the caller's queue after release: %s",
              clattn_status_string((clattn_status)err));
    if (err == CL_SUCCESS) {
        err =
            clEnqueueReadBuffer(own->queue, mem, CL_TRUE, 0, sizeof back, back, 1, &written, NULL);
        tu_expect(err == CL_SUCCESS, "read on the caller's queue after release: %s",
                  clattn_status_string((clattn_status)err));
        clReleaseEvent(written);
    }
    err = clFinish(own->queue);
    tu_expect(err == CL_SUCCESS, "clFinish on the caller's queue after release: %s",
              clattn_status_string((clattn_status)err));
    tu_expect(memcmp(values, back, sizeof values) == 0, "caller's queue lost data after release");
    clReleaseMemObject(mem);
}

/* Once the caller has released every buffer and event of its own and the queue is idle, the
 * reference counts return to where they were before clattn saw the queue: clattn released
 * everything it retained. OpenCL calls these counts stale by nature, and PoCL drops the
 * references of finished commands from a worker thread shortly after clFinish returns, so the
 * counts are polled for up to two seconds; a real leak never comes back. */
static void expect_references_returned(const own_queue *own, cl_uint queue_refs,
                                       cl_uint context_refs)
{
    clFinish(own->queue);
    const struct timespec pause = {0, 10 * 1000 * 1000};
    for (int attempt = 0; attempt < 200; ++attempt) {
        if (queue_reference_count(own->queue) == queue_refs &&
            context_reference_count(own->context) == context_refs) {
            return;
        }
        nanosleep(&pause, NULL);
    }
    tu_expect(queue_reference_count(own->queue) == queue_refs,
              "queue reference count %u after clattn_ctx_release, was %u before",
              queue_reference_count(own->queue), queue_refs);
    tu_expect(context_reference_count(own->context) == context_refs,
              "context reference count %u after clattn_ctx_release, was %u before",
              context_reference_count(own->context), context_refs);
}

/* --- attention on the caller's queue behind a user event ---------------------------------- */

typedef struct attention_problem {
    clattn_attention_desc desc;
    size_t q_count, k_count, v_count, out_count, weights_count;
    float *q, *k, *v;
    uint8_t *padding;
    double *out_ref, *weights_ref;
} attention_problem;

static attention_problem make_problem(void)
{
    attention_problem p;
    clattn_attention_desc desc = {2, 3, 5, 7, 8, 4, 0.0f, CLATTN_NORM_SOFTMAX, {0}, CLATTN_PATH_AUTO};
    p.desc = desc;
    p.q_count = 2 * 3 * 5 * 8;
    p.k_count = 2 * 3 * 7 * 8;
    p.v_count = 2 * 3 * 7 * 4;
    p.out_count = 2 * 3 * 5 * 4;
    p.weights_count = 2 * 3 * 5 * 7;
    p.q = tu_random_floats(p.q_count);
    p.k = tu_random_floats(p.k_count);
    p.v = tu_random_floats(p.v_count);
    p.padding = tu_bytes(2 * 7);
    p.padding[3] = 1;
    p.padding[7 + 6] = 1;
    clattn_host_masks masks = {1, NULL, p.padding};
    p.out_ref = tu_doubles(p.out_count);
    p.weights_ref = tu_doubles(p.weights_count);
    ref_attention(&p.desc, &masks, p.q, p.k, p.v, p.out_ref, p.weights_ref);
    return p;
}

static void free_problem(attention_problem *p)
{
    free(p->weights_ref);
    free(p->out_ref);
    free(p->padding);
    free(p->v);
    free(p->k);
    free(p->q);
}

/* Runs attention on buffers of the caller's context, gated by a user event; checks that the
 * returned event waits for the gate, then the results. release_early: release the clattn
 * context right after enqueueing (it must wait for its work; the event stays valid). */
static void run_gated_attention(int out_of_order, int release_early)
{
    own_queue own;
    if (!make_own_queue(out_of_order, &own)) {
        return;
    }
    cl_uint queue_refs = queue_reference_count(own.queue);
    cl_uint context_refs = context_reference_count(own.context);
    clattn_ctx *ctx = ctx_from_queue(&own);
    attention_problem p = make_problem();
    cl_mem q_mem = own_buffer(&own, p.q, p.q_count * sizeof(float));
    cl_mem k_mem = own_buffer(&own, p.k, p.k_count * sizeof(float));
    cl_mem v_mem = own_buffer(&own, p.v, p.v_count * sizeof(float));
    cl_mem padding_mem = own_buffer(&own, p.padding, 2 * 7);
    cl_mem out_mem = own_nan_buffer(&own, p.out_count);
    cl_mem weights_mem = own_nan_buffer(&own, p.weights_count);
    cl_int err = CL_SUCCESS;
    cl_event gate = clCreateUserEvent(own.context, &err);
    tu_expect(err == CL_SUCCESS, "clCreateUserEvent: %d", err);
    cl_event done = NULL;

    if (ctx != NULL) {
        tu_expect(clattn_ctx_queue(ctx) == own.queue, "clattn_ctx_queue is not the caller's");
        tu_expect(clattn_ctx_cl_context(ctx) == own.context,
                  "clattn_ctx_cl_context is not the caller's");
        tu_expect(clattn_ctx_device(ctx) == own.device, "clattn_ctx_device is not the caller's");

        clattn_attention_desc desc = p.desc;
        desc.masks.causal = 1;
        desc.masks.key_padding_mask = tu_tensor(padding_mem, 0);
        alarm(DEADLOCK_ALARM_SECONDS);
        clattn_status status = clattn_attention(
            ctx, &desc, tu_tensor(q_mem, 0), tu_tensor(k_mem, 0), tu_tensor(v_mem, 0),
            tu_tensor(out_mem, 0), tu_tensor(weights_mem, 0), 1, &gate, &done);
        tu_expect(status == CLATTN_SUCCESS, "clattn_attention returned %s: %s",
                  clattn_status_string(status), clattn_last_error(ctx));
        tu_expect(status != CLATTN_SUCCESS || done != NULL, "no event returned");
        if (done != NULL) {
            cl_int state = CL_COMPLETE;
            clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state, NULL);
            tu_expect(state != CL_COMPLETE,
                      "the returned event completed before its wait-list event");
        }
        clSetUserEventStatus(gate, CL_COMPLETE);
        if (release_early) {
            /* Released while its work may still run: release waits for that work, and the
             * event the caller holds stays valid. */
            clattn_ctx_release(ctx);
            ctx = NULL;
        }
        if (done != NULL) {
            tu_expect(clWaitForEvents(1, &done) == CL_SUCCESS, "clWaitForEvents failed");
            float *out = tu_floats(p.out_count), *weights = tu_floats(p.weights_count);
            if (read_after(&own, out_mem, p.out_count, out, done) &&
                read_after(&own, weights_mem, p.weights_count, weights, done)) {
                tu_expect_close("out", out, p.out_ref, p.out_count, TU_TOL);
                tu_expect_close("weights", weights, p.weights_ref, p.weights_count, TU_TOL);
            }
            free(weights);
            free(out);
        }
        alarm(0);
    } else {
        clSetUserEventStatus(gate, CL_COMPLETE);
    }
    if (ctx != NULL) {
        tu_expect(clattn_finish(ctx) == CLATTN_SUCCESS, "clattn_finish failed");
        clattn_ctx_release(ctx);
    }
    expect_queue_alive(&own);

    if (done != NULL) {
        clReleaseEvent(done);
    }
    clReleaseEvent(gate);
    clReleaseMemObject(weights_mem);
    clReleaseMemObject(out_mem);
    clReleaseMemObject(padding_mem);
    clReleaseMemObject(v_mem);
    clReleaseMemObject(k_mem);
    clReleaseMemObject(q_mem);
    expect_references_returned(&own, queue_refs, context_refs);
    free_problem(&p);
    release_own_queue(&own);
}

START_TEST(test_in_order_queue)
{
    TU_BEGIN_TEST();
    tu_set_case("in-order queue, release_early=%d", _i);
    run_gated_attention(0, _i);
    TU_END_TEST();
}
END_TEST

START_TEST(test_out_of_order_queue)
{
    TU_BEGIN_TEST();
    tu_set_case("out-of-order queue, release_early=%d", _i);
    run_gated_attention(1, _i);
    TU_END_TEST();
}
END_TEST

/* --- a chain of ops linked only by events --------------------------------------------------- */

/* split q, k, v out of one packed (batch, seq, 3E) buffer, attention, concat; each step waits
 * on the previous ones through wait lists only (no finish), on the queue given. */
static void run_event_chain(int out_of_order)
{
    own_queue own;
    if (!make_own_queue(out_of_order, &own)) {
        return;
    }
    clattn_ctx *ctx = ctx_from_queue(&own);
    const size_t batch = 2, seq = 9, heads = 4, head_dim = 3, embed = heads * head_dim;
    const size_t packed_count = batch * seq * 3 * embed, part_count = batch * seq * embed;
    float *packed = tu_random_floats(packed_count);
    cl_mem packed_mem = own_nan_buffer(&own, packed_count);
    cl_mem parts[3], o_heads = own_nan_buffer(&own, part_count);
    cl_mem result = own_nan_buffer(&own, part_count);
    for (int part = 0; part < 3; ++part) {
        parts[part] = own_nan_buffer(&own, part_count);
    }
    cl_event written = NULL, split_done[3] = {NULL, NULL, NULL}, attention_done = NULL;
    cl_event concat_done = NULL;
    cl_int err = clEnqueueWriteBuffer(own.queue, packed_mem, CL_FALSE, 0,
                                      packed_count * sizeof(float), packed, 0, NULL, &written);
    tu_expect(err == CL_SUCCESS, "clEnqueueWriteBuffer: %d", err);

    clattn_heads_desc heads_desc = {batch, seq, heads, head_dim, 3 * embed};
    clattn_heads_desc concat_desc = {batch, seq, heads, head_dim, 0};
    clattn_attention_desc attention_desc = {
        batch, heads, seq, seq, head_dim, head_dim, 0.0f, CLATTN_NORM_SOFTMAX, {0}, CLATTN_PATH_AUTO};
    attention_desc.masks.causal = 1;
    clattn_status status =
        ctx != NULL && err == CL_SUCCESS ? CLATTN_SUCCESS : CLATTN_ERR_INVALID_ARGUMENT;
    for (int part = 0; part < 3 && status == CLATTN_SUCCESS; ++part) {
        status = clattn_split_heads(ctx, &heads_desc, tu_tensor(packed_mem, (size_t)part * embed),
                                    tu_tensor(parts[part], 0), 1, &written, &split_done[part]);
        tu_expect(status == CLATTN_SUCCESS, "split part %d: %s: %s", part,
                  clattn_status_string(status), clattn_last_error(ctx));
    }
    if (status == CLATTN_SUCCESS) {
        status =
            clattn_attention(ctx, &attention_desc, tu_tensor(parts[0], 0), tu_tensor(parts[1], 0),
                             tu_tensor(parts[2], 0), tu_tensor(o_heads, 0), tu_tensor(NULL, 0), 3,
                             split_done, &attention_done);
        tu_expect(status == CLATTN_SUCCESS, "attention: %s: %s", clattn_status_string(status),
                  clattn_last_error(ctx));
    }
    if (status == CLATTN_SUCCESS) {
        status = clattn_concat_heads(ctx, &concat_desc, tu_tensor(o_heads, 0), tu_tensor(result, 0),
                                     1, &attention_done, &concat_done);
        tu_expect(status == CLATTN_SUCCESS, "concat: %s: %s", clattn_status_string(status),
                  clattn_last_error(ctx));
    }
    if (status == CLATTN_SUCCESS && concat_done != NULL) {
        float *got = tu_floats(part_count);
        if (read_after(&own, result, part_count, got, concat_done)) {
            double *heads_ref = tu_doubles(part_count), *o_ref = tu_doubles(part_count);
            double *expected = tu_doubles(part_count);
            float *q_f = tu_floats(part_count), *k_f = tu_floats(part_count);
            float *v_f = tu_floats(part_count);
            float *heads_f[3] = {q_f, k_f, v_f};
            for (size_t part = 0; part < 3; ++part) {
                /* split is a copy, so the float heads are exact */
                ref_split_heads(&heads_desc, packed + part * embed, heads_ref);
                for (size_t i = 0; i < part_count; ++i) {
                    heads_f[part][i] = (float)heads_ref[i];
                }
            }
            clattn_host_masks masks = {1, NULL, NULL};
            ref_attention(&attention_desc, &masks, q_f, k_f, v_f, o_ref, NULL);
            for (size_t b = 0; b < batch; ++b) {
                for (size_t h = 0; h < heads; ++h) {
                    for (size_t pos = 0; pos < seq; ++pos) {
                        for (size_t x = 0; x < head_dim; ++x) {
                            expected[(b * seq + pos) * embed + h * head_dim + x] =
                                o_ref[((b * heads + h) * seq + pos) * head_dim + x];
                        }
                    }
                }
            }
            tu_expect_close("chained result", got, expected, part_count, TU_TOL);
            free(v_f);
            free(k_f);
            free(q_f);
            free(expected);
            free(o_ref);
            free(heads_ref);
        }
        free(got);
    }

    cl_event events[] = {written,       split_done[0],  split_done[1],
                         split_done[2], attention_done, concat_done};
    for (size_t i = 0; i < sizeof events / sizeof events[0]; ++i) {
        if (events[i] != NULL) {
            clWaitForEvents(1, &events[i]);
            clReleaseEvent(events[i]);
        }
    }
    clattn_ctx_release(ctx);
    for (int part = 0; part < 3; ++part) {
        clReleaseMemObject(parts[part]);
    }
    clReleaseMemObject(result);
    clReleaseMemObject(o_heads);
    clReleaseMemObject(packed_mem);
    free(packed);
    release_own_queue(&own);
}

START_TEST(test_event_chain)
{
    TU_BEGIN_TEST();
    tu_set_case("event chain, out_of_order=%d", _i);
    run_event_chain(_i);
    TU_END_TEST();
}
END_TEST

/* --- multi-head attention on the caller's queue ------------------------------------------- */

START_TEST(test_mha_on_own_queue)
{
    TU_BEGIN_TEST();
    int out_of_order = _i == 1;
    tu_set_case("mha on own queue, out_of_order=%d", out_of_order);
    own_queue own;
    if (!make_own_queue(out_of_order, &own)) {
        TU_END_TEST();
        return;
    }
    clattn_ctx *ctx = ctx_from_queue(&own);
    const size_t batch = 2, seq_q = 6, seq_k = 8, embed = 16, heads = 4;
    clattn_mha_desc desc = {.batch = batch,
                            .seq_q = seq_q,
                            .seq_k = seq_k,
                            .embed_dim = embed,
                            .num_heads = heads,
                            .layout = CLATTN_LAYOUT_TORCH,
                            .need_weights = CLATTN_WEIGHTS_AVERAGED};
    size_t query_count = batch * seq_q * embed, kv_count = batch * seq_k * embed;
    float *query = tu_random_floats(query_count), *key = tu_random_floats(kv_count);
    float *value = tu_random_floats(kv_count);
    float *in_proj = tu_random_floats(3 * embed * embed), *in_bias = tu_random_floats(3 * embed);
    float *out_weight = tu_random_floats(embed * embed), *out_bias = tu_random_floats(embed);
    clattn_mha_host_weights host_weights = {0};
    host_weights.in_proj_weight = in_proj;
    host_weights.in_proj_bias = in_bias;
    host_weights.out_weight = out_weight;
    host_weights.out_bias = out_bias;
    double *out_ref = tu_doubles(query_count), *attn_ref = tu_doubles(batch * seq_q * seq_k);
    ref_mha_forward(&desc, &host_weights, query, key, value, NULL, out_ref, attn_ref);

    cl_mem query_mem = own_nan_buffer(&own, query_count);
    cl_mem key_mem = own_buffer(&own, key, kv_count * sizeof(float));
    cl_mem value_mem = own_buffer(&own, value, kv_count * sizeof(float));
    cl_mem in_proj_mem = own_buffer(&own, in_proj, 3 * embed * embed * sizeof(float));
    cl_mem in_bias_mem = own_buffer(&own, in_bias, 3 * embed * sizeof(float));
    cl_mem out_weight_mem = own_buffer(&own, out_weight, embed * embed * sizeof(float));
    cl_mem out_bias_mem = own_buffer(&own, out_bias, embed * sizeof(float));
    cl_mem out_mem = own_nan_buffer(&own, query_count);
    cl_mem attn_mem = own_nan_buffer(&own, batch * seq_q * seq_k);
    clattn_mha_weights weights = {
        .in_proj_weight = {in_proj_mem, 0},
        .in_proj_bias = {in_bias_mem, 0},
        .out_weight = {out_weight_mem, 0},
        .out_bias = {out_bias_mem, 0},
    };
    cl_event written = NULL, done = NULL;
    cl_int err = clEnqueueWriteBuffer(own.queue, query_mem, CL_FALSE, 0,
                                      query_count * sizeof(float), query, 0, NULL, &written);
    tu_expect(err == CL_SUCCESS, "clEnqueueWriteBuffer: %d", err);
    if (ctx != NULL && err == CL_SUCCESS) {
        clattn_status status =
            clattn_mha_forward(ctx, &desc, &weights, tu_tensor(query_mem, 0), tu_tensor(key_mem, 0),
                               tu_tensor(value_mem, 0), tu_tensor(out_mem, 0),
                               tu_tensor(attn_mem, 0), 1, &written, &done);
        tu_expect(status == CLATTN_SUCCESS, "clattn_mha_forward: %s: %s",
                  clattn_status_string(status), clattn_last_error(ctx));
    }
    if (done != NULL) {
        float *out = tu_floats(query_count), *attn = tu_floats(batch * seq_q * seq_k);
        if (read_after(&own, out_mem, query_count, out, done) &&
            read_after(&own, attn_mem, batch * seq_q * seq_k, attn, done)) {
            tu_expect_close("out", out, out_ref, query_count, TU_TOL);
            tu_expect_close("attn_weights", attn, attn_ref, batch * seq_q * seq_k, TU_TOL);
        }
        free(attn);
        free(out);
        clReleaseEvent(done);
    }
    if (written != NULL) {
        clWaitForEvents(1, &written);
        clReleaseEvent(written);
    }
    clattn_ctx_release(ctx);
    clReleaseMemObject(attn_mem);
    clReleaseMemObject(out_mem);
    clReleaseMemObject(out_bias_mem);
    clReleaseMemObject(out_weight_mem);
    clReleaseMemObject(in_bias_mem);
    clReleaseMemObject(in_proj_mem);
    clReleaseMemObject(value_mem);
    clReleaseMemObject(key_mem);
    clReleaseMemObject(query_mem);
    free(attn_ref);
    free(out_ref);
    free(out_bias);
    free(out_weight);
    free(in_bias);
    free(in_proj);
    free(value);
    free(key);
    free(query);
    release_own_queue(&own);
    TU_END_TEST();
}
END_TEST

/* --- independent calls in flight together ------------------------------------------------- */

/* Several calls enqueued back to back with no wait lists between them: trans_b matmuls (the
 * vector kernel stages B transposed in the workspace) and attention calls (every other one
 * unfused, through the scores workspace). grow: sizes grow, so the workspace grows while
 * earlier calls may still use it; else every call has the same sizes and they all share the
 * same workspace buffers. Each result must be right (calls must not trample each other's
 * workspace, on an out-of-order queue too, where only clattn's own ordering keeps them apart). */
#define INDEPENDENT_CALLS 8
static void run_independent_calls(int out_of_order, int grow)
{
    own_queue own;
    if (!make_own_queue(out_of_order, &own)) {
        return;
    }
    clattn_ctx *ctx = ctx_from_queue(&own);
    cl_mem a_mem[INDEPENDENT_CALLS], b_mem[INDEPENDENT_CALLS], c_mem[INDEPENDENT_CALLS];
    cl_mem q_mem[INDEPENDENT_CALLS], out_mem[INDEPENDENT_CALLS];
    cl_event matmul_done[INDEPENDENT_CALLS], attention_done[INDEPENDENT_CALLS];
    float *a[INDEPENDENT_CALLS], *b[INDEPENDENT_CALLS], *q[INDEPENDENT_CALLS];
    clattn_matmul_desc matmul_desc[INDEPENDENT_CALLS];
    clattn_attention_desc attention_desc[INDEPENDENT_CALLS];
    for (int call = 0; call < INDEPENDENT_CALLS; ++call) {
        size_t size = grow ? 9 + 12 * (size_t)call : 57; /* 9, 21, .., 93 */
        clattn_matmul_desc md = {.batch = 2,
                                 .m = size,
                                 .n = size + 3,
                                 .k = size + 5,
                                 .trans_b = 1,
                                 .stride_a = size * (size + 5),
                                 .stride_b = (size + 3) * (size + 5),
                                 .stride_c = size * (size + 3),
                                 .alpha = 1.0f};
        matmul_desc[call] = md;
        a[call] = tu_random_floats(2 * md.m * md.k);
        b[call] = tu_random_floats(2 * md.n * md.k);
        a_mem[call] = own_buffer(&own, a[call], 2 * md.m * md.k * sizeof(float));
        b_mem[call] = own_buffer(&own, b[call], 2 * md.n * md.k * sizeof(float));
        c_mem[call] = own_nan_buffer(&own, 2 * md.m * md.n);
        /* Self-attention of q with itself: q = k = v, (1, 2, size, 8). */
        clattn_attention_desc ad = {1, 2, size, size, 8, 8, 0.0f, CLATTN_NORM_SOFTMAX, {0}, CLATTN_PATH_AUTO};
        ad.masks.causal = call % 2;
        ad.path = call % 2 ? CLATTN_PATH_UNFUSED : CLATTN_PATH_AUTO;
        attention_desc[call] = ad;
        q[call] = tu_random_floats(2 * size * 8);
        q_mem[call] = own_buffer(&own, q[call], 2 * size * 8 * sizeof(float));
        out_mem[call] = own_nan_buffer(&own, 2 * size * 8);
        matmul_done[call] = NULL;
        attention_done[call] = NULL;
    }
    for (int call = 0; call < INDEPENDENT_CALLS && ctx != NULL; ++call) {
        clattn_status status = clattn_matmul(
            ctx, &matmul_desc[call], tu_tensor(a_mem[call], 0), tu_tensor(b_mem[call], 0),
            tu_tensor(NULL, 0), tu_tensor(c_mem[call], 0), 0, NULL, &matmul_done[call]);
        tu_expect(status == CLATTN_SUCCESS, "matmul %d: %s: %s", call, clattn_status_string(status),
                  clattn_last_error(ctx));
        clattn_tensor self = tu_tensor(q_mem[call], 0);
        status = clattn_attention(ctx, &attention_desc[call], self, self, self,
                                  tu_tensor(out_mem[call], 0), tu_tensor(NULL, 0), 0, NULL,
                                  &attention_done[call]);
        tu_expect(status == CLATTN_SUCCESS, "attention %d: %s: %s", call,
                  clattn_status_string(status), clattn_last_error(ctx));
    }
    for (int call = 0; call < INDEPENDENT_CALLS; ++call) {
        const clattn_matmul_desc *md = &matmul_desc[call];
        const clattn_attention_desc *ad = &attention_desc[call];
        size_t c_count = 2 * md->m * md->n, out_count = 2 * ad->seq_q * 8;
        if (matmul_done[call] != NULL) {
            float *c = tu_floats(c_count);
            double *ref = tu_doubles(c_count);
            ref_matmul(md, a[call], b[call], NULL, ref);
            if (read_after(&own, c_mem[call], c_count, c, matmul_done[call])) {
                tu_expect_close("independent matmul", c, ref, c_count, TU_TOL);
            }
            free(ref);
            free(c);
            clReleaseEvent(matmul_done[call]);
        }
        if (attention_done[call] != NULL) {
            float *out = tu_floats(out_count);
            double *ref = tu_doubles(out_count);
            clattn_host_masks masks = {ad->masks.causal, NULL, NULL};
            ref_attention(ad, &masks, q[call], q[call], q[call], ref, NULL);
            if (read_after(&own, out_mem[call], out_count, out, attention_done[call])) {
                tu_expect_close("independent attention", out, ref, out_count, TU_TOL);
            }
            free(ref);
            free(out);
            clReleaseEvent(attention_done[call]);
        }
    }
    clattn_ctx_release(ctx);
    for (int call = 0; call < INDEPENDENT_CALLS; ++call) {
        clReleaseMemObject(out_mem[call]);
        clReleaseMemObject(q_mem[call]);
        clReleaseMemObject(c_mem[call]);
        clReleaseMemObject(b_mem[call]);
        clReleaseMemObject(a_mem[call]);
        free(q[call]);
        free(b[call]);
        free(a[call]);
    }
    release_own_queue(&own);
}

START_TEST(test_independent_calls)
{
    TU_BEGIN_TEST();
    const int out_of_order = _i % 2, grow = _i < 2;
    tu_set_case("independent calls in flight, out_of_order=%d, %s sizes", out_of_order,
                grow ? "growing" : "equal");
    run_independent_calls(out_of_order, grow);
    TU_END_TEST();
}
END_TEST

/* --- contexts on several threads ----------------------------------------------------------- */

/* The header's contract: distinct contexts may be used concurrently. Each thread makes its own
 * context and runs host attention calls; the main thread draws the inputs, computes the
 * reference and checks (the generator and the failure collector are not thread-safe). */
#define THREAD_COUNT 3
#define CALLS_PER_THREAD 4

typedef struct thread_work {
    clattn_attention_desc desc;
    const float *q, *k, *v;
    float *out[CALLS_PER_THREAD];
    clattn_status create_status, call_status[CALLS_PER_THREAD];
    char message[256];
} thread_work;

static void *thread_main(void *argument)
{
    thread_work *work = argument;
    clattn_ctx *ctx = NULL;
    work->create_status = clattn_ctx_create(NULL, &ctx, work->message, sizeof work->message);
    for (int call = 0; call < CALLS_PER_THREAD && ctx != NULL; ++call) {
        work->call_status[call] = clattn_attention_host(ctx, &work->desc, work->q, work->k, work->v,
                                                        NULL, work->out[call], NULL);
    }
    clattn_ctx_release(ctx);
    return NULL;
}

START_TEST(test_contexts_on_threads)
{
    TU_BEGIN_TEST();
    tu_set_case("%d threads, one context each", THREAD_COUNT);
    thread_work work[THREAD_COUNT];
    pthread_t threads[THREAD_COUNT];
    int started[THREAD_COUNT];
    double *refs[THREAD_COUNT];
    size_t out_counts[THREAD_COUNT];
    for (int t = 0; t < THREAD_COUNT; ++t) {
        memset(&work[t], 0, sizeof work[t]);
        clattn_attention_desc desc = {
            2,  1 + (size_t)t, 17 + 8 * (size_t)t, 33, 8, 4 + (size_t)t, 0.0f, CLATTN_NORM_SOFTMAX,
            {0}, CLATTN_PATH_AUTO};
        work[t].desc = desc;
        size_t heads_total = desc.batch * desc.heads;
        size_t q_count = heads_total * desc.seq_q * desc.head_dim_qk;
        size_t k_count = heads_total * desc.seq_k * desc.head_dim_qk;
        size_t v_count = heads_total * desc.seq_k * desc.head_dim_v;
        out_counts[t] = heads_total * desc.seq_q * desc.head_dim_v;
        work[t].q = tu_random_floats(q_count);
        work[t].k = tu_random_floats(k_count);
        work[t].v = tu_random_floats(v_count);
        for (int call = 0; call < CALLS_PER_THREAD; ++call) {
            work[t].out[call] = tu_nan_floats(out_counts[t]);
        }
        refs[t] = tu_doubles(out_counts[t]);
        ref_attention(&desc, NULL, work[t].q, work[t].k, work[t].v, refs[t], NULL);
    }
    for (int t = 0; t < THREAD_COUNT; ++t) {
        started[t] = pthread_create(&threads[t], NULL, thread_main, &work[t]) == 0;
        tu_expect(started[t], "pthread_create failed for thread %d", t);
    }
    for (int t = 0; t < THREAD_COUNT; ++t) {
        if (started[t]) {
            pthread_join(threads[t], NULL);
            tu_expect(work[t].create_status == CLATTN_SUCCESS,
                      "thread %d: clattn_ctx_create: "
                      "%s: %s",
                      t, clattn_status_string(work[t].create_status), work[t].message);
            for (int call = 0; call < CALLS_PER_THREAD; ++call) {
                if (work[t].create_status != CLATTN_SUCCESS) {
                    break;
                }
                if (tu_expect(work[t].call_status[call] == CLATTN_SUCCESS, "thread %d call %d: %s",
                              t, call, clattn_status_string(work[t].call_status[call]))) {
                    tu_expect_close("thread out", work[t].out[call], refs[t], out_counts[t],
                                    TU_TOL);
                }
            }
        }
        for (int call = 0; call < CALLS_PER_THREAD; ++call) {
            free(work[t].out[call]);
        }
        free(refs[t]);
        free((void *)work[t].v);
        free((void *)work[t].k);
        free((void *)work[t].q);
    }
    TU_END_TEST();
}
END_TEST

/* --- accessors and several contexts ------------------------------------------------------- */

START_TEST(test_accessors_and_two_contexts)
{
    TU_BEGIN_TEST();
    tu_set_case("accessors, two clattn contexts on one queue");
    clattn_ctx *shared = tu_ctx();
    cl_command_queue shared_queue = clattn_ctx_queue(shared);
    cl_context queue_context = NULL;
    cl_device_id queue_device = NULL;
    clGetCommandQueueInfo(shared_queue, CL_QUEUE_CONTEXT, sizeof queue_context, &queue_context,
                          NULL);
    clGetCommandQueueInfo(shared_queue, CL_QUEUE_DEVICE, sizeof queue_device, &queue_device, NULL);
    tu_expect(shared_queue != NULL, "clattn_ctx_queue is NULL");
    tu_expect(queue_context == clattn_ctx_cl_context(shared),
              "the queue's context is not clattn_ctx_cl_context");
    tu_expect(queue_device == clattn_ctx_device(shared),
              "the queue's device is not clattn_ctx_device");

    own_queue own;
    if (make_own_queue(0, &own)) {
        cl_uint queue_refs = queue_reference_count(own.queue);
        cl_uint context_refs = context_reference_count(own.context);
        clattn_ctx *first = ctx_from_queue(&own);
        clattn_ctx *second = ctx_from_queue(&own);
        const size_t m = 9, n = 5, k = 17;
        float *a = tu_random_floats(m * k), *b = tu_random_floats(k * n);
        double *ref = tu_doubles(m * n);
        clattn_matmul_desc desc = {.m = m, .n = n, .k = k, .alpha = 1.0f};
        ref_matmul(&desc, a, b, NULL, ref);
        cl_mem a_mem = own_buffer(&own, a, m * k * sizeof(float));
        cl_mem b_mem = own_buffer(&own, b, k * n * sizeof(float));
        cl_mem c_mem = own_nan_buffer(&own, m * n);
        float *c = tu_floats(m * n);
        clattn_ctx *order[] = {first, second};
        for (int step = 0; step < 2; ++step) {
            if (order[step] == NULL) {
                continue;
            }
            clattn_status status =
                clattn_matmul(order[step], &desc, tu_tensor(a_mem, 0), tu_tensor(b_mem, 0),
                              tu_tensor(NULL, 0), tu_tensor(c_mem, 0), 0, NULL, NULL);
            tu_expect(status == CLATTN_SUCCESS, "matmul on context %d: %s", step,
                      clattn_status_string(status));
            tu_expect(clattn_finish(order[step]) == CLATTN_SUCCESS, "clattn_finish failed");
            if (read_after(&own, c_mem, m * n, c, NULL)) {
                tu_expect_close("C", c, ref, m * n, TU_TOL);
            }
            /* Releasing the first context must leave the second one working. */
            if (step == 0) {
                clattn_ctx_release(first);
                first = NULL;
            }
        }
        clattn_ctx_release(second);
        expect_queue_alive(&own);
        free(c);
        clReleaseMemObject(c_mem);
        clReleaseMemObject(b_mem);
        clReleaseMemObject(a_mem);
        expect_references_returned(&own, queue_refs, context_refs);
        free(ref);
        free(b);
        free(a);
        release_own_queue(&own);
    }
    TU_END_TEST();
}
END_TEST

/* A context made by clattn itself (spec "" = CLATTN_DEVICE or default) works and releases. */
START_TEST(test_own_context_lifecycle)
{
    TU_BEGIN_TEST();
    tu_set_case("clattn_ctx_create('') and release, twice");
    for (int round = 0; round < 2; ++round) {
        clattn_ctx *ctx = NULL;
        char message[512] = "";
        clattn_status status = clattn_ctx_create("", &ctx, message, sizeof message);
        tu_expect(status == CLATTN_SUCCESS && ctx != NULL, "clattn_ctx_create(''): %s: %s",
                  clattn_status_string(status), message);
        if (ctx == NULL) {
            break;
        }
        tu_expect(clattn_ctx_device(ctx) == clattn_ctx_device(tu_ctx()),
                  "'' chose another device than NULL did");
        tu_expect(clattn_last_error(ctx) != NULL && clattn_last_error(ctx)[0] == '\0',
                  "a fresh context has last error '%s'", clattn_last_error(ctx));
        tu_expect(clattn_finish(ctx) == CLATTN_SUCCESS, "clattn_finish on an idle context");
        clattn_ctx_release(ctx);
    }
    TU_END_TEST();
}
END_TEST

/* Writes text to dir/name; 1 on success. */
static int write_text(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return 0;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* Runs a 1x1x1 matmul on a fresh context made while CLATTN_KERNEL_DIR=dir; returns its status
 * and copies the context's last error into message. */
static clattn_status matmul_with_kernel_dir(const char *dir, char *message, size_t size)
{
    setenv("CLATTN_KERNEL_DIR", dir, 1);
    clattn_ctx *ctx = NULL;
    clattn_status status = clattn_ctx_create(NULL, &ctx, message, size);
    if (status == CLATTN_SUCCESS) {
        cl_int err = CL_SUCCESS;
        cl_mem one = clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_WRITE, sizeof(float),
                                    NULL, &err);
        const clattn_matmul_desc desc = {.m = 1, .n = 1, .k = 1, .alpha = 1.0f};
        status = clattn_matmul(ctx, &desc, tu_tensor(one, 0), tu_tensor(one, 0), (clattn_tensor){0},
                               tu_tensor(one, 0), 0, NULL, NULL);
        snprintf(message, size, "%s", clattn_last_error(ctx));
        clReleaseMemObject(one);
        clattn_ctx_release(ctx);
    }
    unsetenv("CLATTN_KERNEL_DIR");
    return status;
}

/* A kernel that fails to compile gives CLATTN_ERR_BUILD with the compiler's log in the
 * message; an unreadable CLATTN_KERNEL_DIR names the file. (CLATTN_KERNEL_DIR loads the .cl
 * files from disk instead of the embedded copies.) */
START_TEST(test_build_failure_reports_log)
{
    TU_BEGIN_TEST();
    tu_set_case("CLATTN_KERNEL_DIR with a broken matmul.cl, and a missing directory");
    char dir[] = "/tmp/clattn-kernels-XXXXXX";
    char message[4096] = "";
    tu_expect(mkdtemp(dir) != NULL, "mkdtemp failed");
    tu_expect(
        write_text(dir, "common.cl", "/* empty */\n") &&
            write_text(dir, "matmul.cl",
                       "__kernel void matmul(__global float *x) { x[0] = undeclared_name; }\n"),
        "cannot write kernel files into %s", dir);
    clattn_status status = matmul_with_kernel_dir(dir, message, sizeof message);
    tu_expect(status == CLATTN_ERR_BUILD, "broken kernel: got %s, want CLATTN_ERR_BUILD",
              clattn_status_string(status));
    tu_expect(strstr(message, "clBuildProgram(matmul.cl") != NULL,
              "message does not name the program: '%s'", message);
    tu_expect(strstr(message, "undeclared_name") != NULL,
              "message lacks the build log (which names the bad identifier): '%s'", message);

    char missing[600];
    snprintf(missing, sizeof missing, "%s/does-not-exist", dir);
    status = matmul_with_kernel_dir(missing, message, sizeof message);
    tu_expect(status == CLATTN_ERR_BUILD && strstr(message, "cannot read") != NULL,
              "missing kernel dir: got %s '%s'", clattn_status_string(status), message);

    char path[600];
    snprintf(path, sizeof path, "%s/common.cl", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/matmul.cl", dir);
    remove(path);
    rmdir(dir);
    TU_END_TEST();
}
END_TEST

/* --- device choice: gpu, cpu, P:D, CLATTN_DEVICE ------------------------------------------- */

#define SPEC_MAX_PLATFORMS 16
#define SPEC_MAX_DEVICES 64

/* The platforms and devices as OpenCL lists them: what every spec is checked against. */
typedef struct device_list {
    cl_uint num_platforms;
    cl_uint num_devices[SPEC_MAX_PLATFORMS];
    cl_device_id devices[SPEC_MAX_PLATFORMS][SPEC_MAX_DEVICES];
} device_list;

static void list_devices(device_list *list)
{
    cl_platform_id platforms[SPEC_MAX_PLATFORMS];
    memset(list, 0, sizeof *list);
    if (clGetPlatformIDs(SPEC_MAX_PLATFORMS, platforms, &list->num_platforms) != CL_SUCCESS) {
        list->num_platforms = 0;
    }
    if (list->num_platforms > SPEC_MAX_PLATFORMS) {
        list->num_platforms = SPEC_MAX_PLATFORMS;
    }
    for (cl_uint p = 0; p < list->num_platforms; ++p) {
        cl_uint count = 0;
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, SPEC_MAX_DEVICES, list->devices[p],
                           &count) != CL_SUCCESS) {
            count = 0;
        }
        list->num_devices[p] = count < SPEC_MAX_DEVICES ? count : SPEC_MAX_DEVICES;
    }
}

/* The first device of `type` in platform order, or NULL. */
static cl_device_id first_device_of_type(const device_list *list, cl_device_type type)
{
    for (cl_uint p = 0; p < list->num_platforms; ++p) {
        for (cl_uint d = 0; d < list->num_devices[p]; ++d) {
            cl_device_type got = 0;
            clGetDeviceInfo(list->devices[p][d], CL_DEVICE_TYPE, sizeof got, &got, NULL);
            if (got & type) {
                return list->devices[p][d];
            }
        }
    }
    return NULL;
}

/* clattn_ctx_create(spec) must give `want`. On success the context must be on `device`; on
 * failure *out must be NULL and the message must contain each non-NULL needle. Returns the
 * context when it succeeded (the caller releases it). */
static clattn_ctx *expect_spec(const char *spec, clattn_status want, cl_device_id device,
                               const char *needle, const char *second_needle)
{
    char message[512];
    memset(message, 'x', sizeof message);
    message[sizeof message - 1] = '\0';
    clattn_ctx *ctx = (clattn_ctx *)message; /* must be overwritten */
    const char *shown = spec != NULL ? spec : "(NULL)";
    const char *env = getenv("CLATTN_DEVICE");
    tu_set_case("clattn_ctx_create('%s') with CLATTN_DEVICE=%s", shown, env ? env : "(unset)");
    clattn_status status = clattn_ctx_create(spec, &ctx, message, sizeof message);
    tu_expect(status == want, "clattn_ctx_create('%s') = %s, want %s: '%s'", shown,
              clattn_status_string(status), clattn_status_string(want), message);
    if (status != CLATTN_SUCCESS) {
        tu_expect(ctx == NULL, "clattn_ctx_create('%s') failed but *out is not NULL", shown);
        ctx = NULL;
        const char *needles[2] = {needle, second_needle};
        for (int i = 0; i < 2; ++i) {
            tu_expect(needles[i] == NULL || strstr(message, needles[i]) != NULL,
                      "clattn_ctx_create('%s'): message '%s' lacks '%s'", shown, message,
                      needles[i]);
        }
        return NULL;
    }
    tu_expect(message[0] == '\0', "clattn_ctx_create('%s') succeeded with message '%s'", shown,
              message);
    tu_expect(clattn_ctx_device(ctx) == device, "clattn_ctx_create('%s') chose another device",
              shown);
    if (want != CLATTN_SUCCESS) {
        clattn_ctx_release(ctx);
        return NULL;
    }
    return ctx;
}

/* An m x n x k matmul with bias and beta on ctx (buffers of its own cl_context) against the
 * reference. */
static void expect_product_on(clattn_ctx *ctx, size_t m, size_t n, size_t k)
{
    float *a = tu_random_floats(m * k), *b = tu_random_floats(k * n), *c = tu_random_floats(m * n);
    float *bias = tu_random_floats(n);
    double *ref = tu_doubles(m * n);
    tu_floats_to_doubles(c, m * n, ref);
    const clattn_matmul_desc desc = {.m = m, .n = n, .k = k, .alpha = 1.0f, .beta = 0.5f};
    ref_matmul(&desc, a, b, bias, ref);
    cl_int err_a = CL_SUCCESS, err_b = CL_SUCCESS, err_c = CL_SUCCESS, err_bias = CL_SUCCESS;
    cl_context context = clattn_ctx_cl_context(ctx);
    cl_mem a_mem = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                  m * k * sizeof(float), a, &err_a);
    cl_mem b_mem = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                  k * n * sizeof(float), b, &err_b);
    cl_mem c_mem = clCreateBuffer(context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                  m * n * sizeof(float), c, &err_c);
    cl_mem bias_mem = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                     n * sizeof(float), bias, &err_bias);
    if (tu_expect(err_a == CL_SUCCESS && err_b == CL_SUCCESS && err_c == CL_SUCCESS &&
                      err_bias == CL_SUCCESS,
                  "clCreateBuffer on the chosen device failed")) {
        clattn_status status =
            clattn_matmul(ctx, &desc, tu_tensor(a_mem, 0), tu_tensor(b_mem, 0),
                          tu_tensor(bias_mem, 0), tu_tensor(c_mem, 0), 0, NULL, NULL);
        if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_matmul on the chosen device") &&
            tu_expect(clEnqueueReadBuffer(clattn_ctx_queue(ctx), c_mem, CL_TRUE, 0,
                                          m * n * sizeof(float), c, 0, NULL, NULL) == CL_SUCCESS,
                      "clEnqueueReadBuffer failed")) {
            tu_expect_close("C on the chosen device", c, ref, m * n, TU_TOL);
        }
    }
    tu_release_mem(bias_mem);
    tu_release_mem(c_mem);
    tu_release_mem(b_mem);
    tu_release_mem(a_mem);
    free(ref);
    free(bias);
    free(c);
    free(b);
    free(a);
}

static void expect_matmul_on(clattn_ctx *ctx)
{
    expect_product_on(ctx, 7, 5, 3);
}

static void set_device_env(const char *value)
{
    if (value != NULL) {
        setenv("CLATTN_DEVICE", value, 1);
    } else {
        unsetenv("CLATTN_DEVICE");
    }
}

/* Every spec form, valid and not, through device_spec and through CLATTN_DEVICE; the chosen
 * device is compared with what clGetPlatformIDs / clGetDeviceIDs list. */
START_TEST(test_device_specs)
{
    TU_BEGIN_TEST();
    device_list list;
    list_devices(&list);
    const char *saved = getenv("CLATTN_DEVICE");
    char *saved_copy = saved != NULL ? strdup(saved) : NULL;
    unsetenv("CLATTN_DEVICE");
    char spec[64], needle[128], expected[192];

    /* Valid P:D: the listed device, computing correct products. On the other devices (another
     * OpenCL implementation, e.g. Mesa's rusticl under RUSTICL_ENABLE=llvmpipe: the
     * runtime_rusticl test) a product with a long k too, which devices with a kernel loop limit
     * compute in several passes. */
    cl_device_id shared = clattn_ctx_device(tu_ctx());
    char shared_spec[64] = "";
    for (cl_uint p = 0; p < list.num_platforms; ++p) {
        for (cl_uint d = 0; d < list.num_devices[p] && d < 2; ++d) {
            snprintf(spec, sizeof spec, "%u:%u", (unsigned)p, (unsigned)d);
            clattn_ctx *ctx = expect_spec(spec, CLATTN_SUCCESS, list.devices[p][d], NULL, NULL);
            if (ctx != NULL && list.devices[p][d] == shared) {
                snprintf(shared_spec, sizeof shared_spec, "%s", spec);
                expect_matmul_on(ctx);
            } else if (ctx != NULL) {
                expect_matmul_on(ctx);
                expect_product_on(ctx, 3, 2, 70001);
            }
            clattn_ctx_release(ctx);
        }
    }
    tu_expect(shared_spec[0] != '\0', "the suite's device is not among the listed P:D");

    /* Device index out of range on each platform (a platform may have none at all). */
    for (cl_uint p = 0; p < list.num_platforms; ++p) {
        const unsigned count = list.num_devices[p];
        snprintf(spec, sizeof spec, "%u:%u", (unsigned)p, count);
        snprintf(needle, sizeof needle, "device_spec=%s: platform %u has no device %u", spec,
                 (unsigned)p, count);
        snprintf(expected, sizeof expected, "(%u device(s))", count);
        expect_spec(spec, CLATTN_ERR_NO_DEVICE, NULL, needle, expected);
        snprintf(spec, sizeof spec, "%u:99999999999999999999999", (unsigned)p);
        expect_spec(spec, CLATTN_ERR_NO_DEVICE, NULL, "has no device", NULL);
    }

    /* Platform index out of range. */
    const unsigned platforms = list.num_platforms;
    snprintf(spec, sizeof spec, "%u:0", platforms);
    snprintf(needle, sizeof needle, "device_spec=%s: platform %u does not exist (%u platform(s))",
             spec, platforms, platforms);
    expect_spec(spec, CLATTN_ERR_NO_DEVICE, NULL, needle, NULL);
    if (platforms <= 99) {
        expect_spec("99:0", CLATTN_ERR_NO_DEVICE, NULL, "device_spec=99:0: platform 99 does not",
                    NULL);
    }
    expect_spec("4294967296:0", CLATTN_ERR_NO_DEVICE, NULL, "does not exist", NULL);
    expect_spec("99999999999999999999999:0", CLATTN_ERR_NO_DEVICE, NULL, "does not exist", NULL);

    /* Malformed specs: refused as such, naming the spec and the accepted forms. */
    static const char *const malformed[] = {
        "0:",   ":0",    "x:y",  ":",    "0",     "12",   "0:x",  "x:0",     "-1:0",
        "0:-1", "+0:0",  "0:+0", " 0:0", "0: 0",  "0:0 ", "0::0", "0:0:0",   "0.0:0",
        "0:0x", "0x0:0", "GPU",  "Cpu",  "gpu:0", "cpu ", "gpus", "default", "0;0",
    };
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; ++i) {
        snprintf(needle, sizeof needle, "device_spec='%s'", malformed[i]);
        expect_spec(malformed[i], CLATTN_ERR_INVALID_ARGUMENT, NULL, needle,
                    "expected gpu, cpu or P:D (platform:device)");
    }

    /* gpu and cpu: the first listed device of that type, or a NO_DEVICE naming the type. */
    static const struct {
        const char *spec, *type_name;
        cl_device_type type;
    } kinds[] = {{"gpu", "GPU", CL_DEVICE_TYPE_GPU}, {"cpu", "CPU", CL_DEVICE_TYPE_CPU}};
    for (int i = 0; i < 2; ++i) {
        cl_device_id first = first_device_of_type(&list, kinds[i].type);
        snprintf(needle, sizeof needle, "device_spec=%s: no %s device on any of %u platform(s)",
                 kinds[i].spec, kinds[i].type_name, platforms);
        clattn_ctx *ctx =
            expect_spec(kinds[i].spec, first != NULL ? CLATTN_SUCCESS : CLATTN_ERR_NO_DEVICE, first,
                        needle, NULL);
        clattn_ctx_release(ctx);
        ctx = NULL;
        clattn_status status = clattn_ctx_create(kinds[i].spec, &ctx, NULL, 0);
        tu_expect(status == (first != NULL ? CLATTN_SUCCESS : CLATTN_ERR_NO_DEVICE),
                  "clattn_ctx_create('%s', NULL message) = %s", kinds[i].spec,
                  clattn_status_string(status));
        clattn_ctx_release(ctx);
    }

    /* CLATTN_DEVICE: used when device_spec is NULL or "", named in messages, and overridden by
     * a device_spec. */
    if (shared_spec[0] != '\0') {
        set_device_env(shared_spec);
        clattn_ctx_release(expect_spec(NULL, CLATTN_SUCCESS, shared, NULL, NULL));
        clattn_ctx_release(expect_spec("", CLATTN_SUCCESS, shared, NULL, NULL));
        set_device_env("x:y");
        clattn_ctx_release(expect_spec(shared_spec, CLATTN_SUCCESS, shared, NULL, NULL));
    }
    /* Empty: the default (the first GPU, else the first CPU device, else any), which is the
     * suite's device only when the suite runs without CLATTN_DEVICE. */
    set_device_env("");
    cl_device_id default_device = first_device_of_type(&list, CL_DEVICE_TYPE_GPU);
    if (default_device == NULL)
        default_device = first_device_of_type(&list, CL_DEVICE_TYPE_CPU);
    if (default_device == NULL)
        default_device = first_device_of_type(&list, CL_DEVICE_TYPE_ALL);
    clattn_ctx_release(expect_spec(NULL, CLATTN_SUCCESS, default_device, NULL, NULL));
    set_device_env("x:y");
    expect_spec(NULL, CLATTN_ERR_INVALID_ARGUMENT, NULL, "CLATTN_DEVICE='x:y': expected gpu", NULL);
    set_device_env("0:");
    expect_spec("", CLATTN_ERR_INVALID_ARGUMENT, NULL, "CLATTN_DEVICE='0:'", NULL);
    snprintf(spec, sizeof spec, "%u:0", platforms);
    set_device_env(spec);
    snprintf(needle, sizeof needle, "CLATTN_DEVICE=%s: platform %u does not exist", spec,
             platforms);
    expect_spec(NULL, CLATTN_ERR_NO_DEVICE, NULL, needle, NULL);

    set_device_env(saved_copy);
    free(saved_copy);
    TU_END_TEST();
}
END_TEST

/* --- CLATTN_KERNEL_DIR files that cannot be used ------------------------------------------- */

/* dir/name made a folder holding common.cl and `file` with the given texts (text NULL: `file`
 * is made a folder itself). Returns 1 on success; path receives dir/name. */
static int kernel_folder(const char *dir, const char *name, const char *file, const char *text,
                         char *path, size_t size)
{
    snprintf(path, size, "%s/%s", dir, name);
    if (mkdir(path, 0700) != 0) {
        return 0;
    }
    if (text == NULL) {
        char sub[700];
        snprintf(sub, sizeof sub, "%s/%s", path, file);
        return mkdir(sub, 0700) == 0 && write_text(path, "other.cl", "/* unused */\n");
    }
    return write_text(path, "common.cl", "/* empty */\n") && write_text(path, file, text);
}

/* Device buffers of `count` floats on ctx's own cl_context (NaN-filled). */
static cl_mem ctx_nan_buffer(clattn_ctx *ctx, size_t count)
{
    float *nan = tu_nan_floats(count);
    cl_int err = CL_SUCCESS;
    cl_mem mem =
        clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                       count * sizeof(float), nan, &err);
    free(nan);
    tu_expect(err == CL_SUCCESS, "clCreateBuffer: %d", (int)err);
    return err == CL_SUCCESS ? mem : NULL;
}

typedef enum kernel_dir_op { DIR_MATMUL, DIR_FLASH, DIR_SOFTMAX } kernel_dir_op;

/* Runs one small op on a fresh context while CLATTN_KERNEL_DIR=dir; returns its status and
 * copies the last error into message. */
static clattn_status op_with_kernel_dir(const char *dir, kernel_dir_op op, char *message,
                                        size_t size)
{
    setenv("CLATTN_KERNEL_DIR", dir, 1);
    clattn_ctx *ctx = NULL;
    clattn_status status = clattn_ctx_create(NULL, &ctx, message, size);
    if (status == CLATTN_SUCCESS) {
        cl_mem mem = ctx_nan_buffer(ctx, 64);
        const clattn_tensor t = {mem, 0};
        if (op == DIR_MATMUL) {
            const clattn_matmul_desc desc = {.m = 2, .n = 2, .k = 2, .alpha = 1.0f};
            status = clattn_matmul(ctx, &desc, t, t, tu_tensor(NULL, 0), t, 0, NULL, NULL);
        } else if (op == DIR_FLASH) {
            const clattn_attention_desc desc = {
                1, 1, 2, 2, 4, 4, 0.0f, CLATTN_NORM_SOFTMAX, {0}, CLATTN_PATH_FUSED};
            status =
                clattn_flash_attention(ctx, &desc, t, t, t, t, tu_tensor(NULL, 0), 0, NULL, NULL);
        } else {
            const clattn_softmax_desc desc = {.batch = 1, .heads = 1, .seq_q = 2, .seq_k = 2};
            status = clattn_softmax_rows(ctx, &desc, t, t, 0, NULL, NULL);
        }
        snprintf(message, size, "%s", clattn_last_error(ctx));
        tu_release_mem(mem);
        clattn_ctx_release(ctx);
    }
    unsetenv("CLATTN_KERNEL_DIR");
    return status;
}

/* Each way a kernel folder can be unusable gives its own status and a message naming the file
 * or kernel: an unreadable path or file, a program without the kernel, a kernel with other
 * arguments, a build log longer than the message (cut to fit after the op's name). An empty
 * CLATTN_KERNEL_DIR means the embedded kernels. */
START_TEST(test_kernel_dir_failures)
{
    TU_BEGIN_TEST();
    char dir[] = "/tmp/clattn-kernels-XXXXXX", path[600], message[4096];
    clattn_status status;
    if (!tu_expect(mkdtemp(dir) != NULL, "mkdtemp failed")) {
        TU_END_TEST();
        return;
    }

    tu_set_case("CLATTN_KERNEL_DIR=''");
    setenv("CLATTN_KERNEL_DIR", "", 1);
    clattn_ctx *ctx = NULL;
    status = clattn_ctx_create(NULL, &ctx, message, sizeof message);
    if (tu_expect(status == CLATTN_SUCCESS, "create: %s: %s", clattn_status_string(status),
                  message)) {
        expect_matmul_on(ctx);
    }
    clattn_ctx_release(ctx);
    unsetenv("CLATTN_KERNEL_DIR");

    tu_set_case("CLATTN_KERNEL_DIR longer than a path");
    char long_dir[5000];
    memset(long_dir, 'a', sizeof long_dir - 1);
    long_dir[sizeof long_dir - 1] = '\0';
    memcpy(long_dir, "/tmp/", 5);
    status = op_with_kernel_dir(long_dir, DIR_MATMUL, message, sizeof message);
    tu_expect(status == CLATTN_ERR_BUILD &&
                  tu_starts_with(message, "matmul: CLATTN_KERNEL_DIR=/tmp/aaa"),
              "got %s '%.200s'", clattn_status_string(status), message);

    tu_set_case("CLATTN_KERNEL_DIR whose common.cl is a folder");
    if (tu_expect(kernel_folder(dir, "folder", "common.cl", NULL, path, sizeof path),
                  "cannot make %s", path)) {
        status = op_with_kernel_dir(path, DIR_MATMUL, message, sizeof message);
        tu_expect(status == CLATTN_ERR_BUILD && strstr(message, "cannot read common.cl"),
                  "got %s '%s'", clattn_status_string(status), message);
    }

    tu_set_case("a folder with common.cl but no matmul.cl");
    if (tu_expect(kernel_folder(dir, "nosource", "other.cl", "/* unused */\n", path, sizeof path),
                  "cannot write %s", path)) {
        status = op_with_kernel_dir(path, DIR_MATMUL, message, sizeof message);
        tu_expect(status == CLATTN_ERR_BUILD && strstr(message, "cannot read matmul.cl"),
                  "got %s '%s'", clattn_status_string(status), message);
    }

    tu_set_case("matmul.cl without the matmul kernels");
    if (tu_expect(kernel_folder(dir, "noname", "matmul.cl",
                                "__kernel void other(__global float *x) { x[0] = 1.0f; }\n", path,
                                sizeof path),
                  "cannot write %s", path)) {
        status = op_with_kernel_dir(path, DIR_MATMUL, message, sizeof message);
        tu_expect(status == (clattn_status)CL_INVALID_KERNEL_NAME &&
                      tu_starts_with(message, "matmul: clCreateKernel(matmul"),
                  "got %s '%s'", clattn_status_string(status), message);
    }

    tu_set_case("matmul.cl whose kernels take no arguments");
    if (tu_expect(kernel_folder(dir, "noargs", "matmul.cl",
                                "__kernel void matmul(void) { }\n"
                                "__kernel void matmul_vec(void) { }\n"
                                "__kernel void transpose(void) { }\n",
                                path, sizeof path),
                  "cannot write %s", path)) {
        status = op_with_kernel_dir(path, DIR_MATMUL, message, sizeof message);
        tu_expect(status == (clattn_status)CL_INVALID_ARG_INDEX &&
                      tu_starts_with(message, "matmul: clSetKernelArg(") &&
                      strstr(message, ", 0): CL_INVALID_ARG_INDEX"),
                  "got %s '%s'", clattn_status_string(status), message);
    }

    tu_set_case("flash_attention.cl without the kernel");
    if (tu_expect(kernel_folder(dir, "noflash", "flash_attention.cl",
                                "__kernel void other(__global float *x) { x[0] = 1.0f; }\n", path,
                                sizeof path),
                  "cannot write %s", path)) {
        status = op_with_kernel_dir(path, DIR_FLASH, message, sizeof message);
        tu_expect(status == (clattn_status)CL_INVALID_KERNEL_NAME &&
                      tu_starts_with(message, "flash_attention: clCreateKernel(flash_attention)"),
                  "got %s '%s'", clattn_status_string(status), message);
    }

    tu_set_case("softmax.cl with a build log longer than the message");
    char broken[8192];
    size_t used = 0;
    for (int i = 0; i < 100 && used < sizeof broken - 128; ++i) {
        used += (size_t)snprintf(broken + used, sizeof broken - used,
                                 "__kernel void k%d(__global float *x) { x[0] = undeclared_%d; }\n",
                                 i, i);
    }
    if (tu_expect(kernel_folder(dir, "longlog", "softmax.cl", broken, path, sizeof path),
                  "cannot write %s", path)) {
        status = op_with_kernel_dir(path, DIR_SOFTMAX, message, sizeof message);
        const size_t length = strlen(message);
        tu_expect(status == CLATTN_ERR_BUILD &&
                      tu_starts_with(message, "softmax_rows: clBuildProgram(softmax.cl") &&
                      strstr(message, "undeclared_0") && length >= 1024 && length < 2048,
                  "got %s, %zu characters: '%.300s'", clattn_status_string(status), length,
                  message);
    }

    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    tu_expect(system(path) == 0, "could not remove %s", dir);
    TU_END_TEST();
}
END_TEST

/* --- CLATTN_PARAMS and CLATTN_MATMUL: every override computes the same numbers ----------- */

/* The device class's parameters (CLATTN_PARAMS=gpu|cpu) and the matmul kernel
 * (CLATTN_MATMUL=tiled|vec), each combination and unknown values (ignored: the device's own
 * choice), give correct products; the override is read when the context is made. */
START_TEST(test_params_overrides)
{
    TU_BEGIN_TEST();
    static const char *const params[] = {NULL, "cpu", "gpu", "fpga"};
    static const char *const kernels[] = {NULL, "tiled", "vec", "simd"};
    const char *saved_params = getenv("CLATTN_PARAMS"), *saved_matmul = getenv("CLATTN_MATMUL");
    char *params_copy = saved_params ? strdup(saved_params) : NULL;
    char *matmul_copy = saved_matmul ? strdup(saved_matmul) : NULL;
    for (int p = 0; p < 4; ++p) {
        for (int k = 0; k < 4; ++k) {
            tu_set_case("CLATTN_PARAMS=%s CLATTN_MATMUL=%s", params[p] ? params[p] : "(unset)",
                        kernels[k] ? kernels[k] : "(unset)");
            if (params[p]) {
                setenv("CLATTN_PARAMS", params[p], 1);
            } else {
                unsetenv("CLATTN_PARAMS");
            }
            if (kernels[k]) {
                setenv("CLATTN_MATMUL", kernels[k], 1);
            } else {
                unsetenv("CLATTN_MATMUL");
            }
            clattn_ctx *ctx = NULL;
            char message[512] = "";
            clattn_status status = clattn_ctx_create(NULL, &ctx, message, sizeof message);
            if (tu_expect(status == CLATTN_SUCCESS, "create: %s: %s", clattn_status_string(status),
                          message)) {
                expect_matmul_on(ctx);
            }
            clattn_ctx_release(ctx);
        }
    }
    if (params_copy) {
        setenv("CLATTN_PARAMS", params_copy, 1);
    } else {
        unsetenv("CLATTN_PARAMS");
    }
    if (matmul_copy) {
        setenv("CLATTN_MATMUL", matmul_copy, 1);
    } else {
        unsetenv("CLATTN_MATMUL");
    }
    free(matmul_copy);
    free(params_copy);
    TU_END_TEST();
}
END_TEST

static Suite *runtime_suite(void)
{
    Suite *suite = suite_create("runtime");
    TCase *queues = tcase_create("queues");
    tcase_set_timeout(queues, 600);
    /* Out-of-order cases (loop index 1, or odd indices) are registered only where the device
     * has out-of-order queues: a test that did not run its path must not report "passed". */
    const int ooo = device_supports_out_of_order(clattn_ctx_device(tu_ctx()));
    if (!ooo)
        printf("check_runtime: NOT RUN: the device has no out-of-order queues; the out-of-order "
               "cases of 5 tests are not registered\n");
    tcase_add_loop_test(queues, test_in_order_queue, 0, 2);
    if (ooo)
        tcase_add_loop_test(queues, test_out_of_order_queue, 0, 2);
    tcase_add_loop_test(queues, test_event_chain, 0, ooo ? 2 : 1);
    tcase_add_loop_test(queues, test_mha_on_own_queue, 0, ooo ? 2 : 1);
    for (int i = 0; i < 4; i += ooo ? 4 : 2) /* _i % 2: out-of-order; _i < 2: growing sizes */
        tcase_add_loop_test(queues, test_independent_calls, i, ooo ? 4 : i + 1);
    suite_add_tcase(suite, queues);

    TCase *contexts = tcase_create("contexts");
    tcase_set_timeout(contexts, 600);
    tcase_add_test(contexts, test_accessors_and_two_contexts);
    tcase_add_test(contexts, test_own_context_lifecycle);
    tcase_add_test(contexts, test_contexts_on_threads);
    tcase_add_test(contexts, test_build_failure_reports_log);
    tcase_add_test(contexts, test_device_specs);
    tcase_add_test(contexts, test_kernel_dir_failures);
    tcase_add_test(contexts, test_params_overrides);
    suite_add_tcase(suite, contexts);
    return suite;
}

int main(void)
{
    tu_suite_begin("check_runtime");
    return tu_run_suite(runtime_suite());
}
