/*
 * check_runtime: contexts made from the caller's own queue (in-order and out-of-order), wait
 * lists and returned events through plan executions, ordering of executions that share the
 * context's workspace (and no ordering for executions with workspaces of their own), workspace
 * growth and reuse, executions on a second queue, plan lifetimes, ownership (releasing a clattn
 * context leaves the caller's queue and context alive), device choice, kernel folders and
 * parameter overrides.
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

#include "../kernels/params.h"
#include "problems.h"
#include "reference.h"
#include "testutil.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

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

static cl_command_queue make_queue(cl_context context, cl_device_id device, int out_of_order)
{
    cl_int err = CL_SUCCESS;
    cl_command_queue_properties properties =
        out_of_order ? CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE : 0;
    cl_command_queue queue = clCreateCommandQueue(context, device, properties, &err);
    if (!tu_expect(err == CL_SUCCESS, "clCreateCommandQueue: %s",
                   clattn_status_string((clattn_status)err))) {
        return NULL;
    }
    return queue;
}

static int make_own_queue(int out_of_order, own_queue *own)
{
    cl_int err = CL_SUCCESS;
    own->device = clattn_ctx_device(tu_ctx());
    own->context = clCreateContext(NULL, 1, &own->device, NULL, NULL, &err);
    own->queue = NULL;
    if (!tu_expect(err == CL_SUCCESS, "clCreateContext: %s",
                   clattn_status_string((clattn_status)err))) {
        own->context = NULL;
        return 0;
    }
    own->queue = make_queue(own->context, own->device, out_of_order);
    if (own->queue == NULL) {
        clReleaseContext(own->context);
        own->context = NULL;
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
static int read_after(cl_command_queue queue, cl_mem mem, size_t offset, size_t count, float *dst,
                      cl_event after)
{
    cl_int err =
        clEnqueueReadBuffer(queue, mem, CL_TRUE, offset * sizeof(float), count * sizeof(float), dst,
                            after != NULL ? 1 : 0, after != NULL ? &after : NULL, NULL);
    return tu_expect(err == CL_SUCCESS, "clEnqueueReadBuffer: %s",
                     clattn_status_string((clattn_status)err));
}

static clattn_ctx *ctx_from_queue(cl_command_queue queue)
{
    clattn_ctx *ctx = NULL;
    char message[512] = "";
    clattn_status status = clattn_ctx_create_from_queue(queue, &ctx, message, sizeof message);
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

static int event_complete(cl_event event)
{
    cl_int state = CL_COMPLETE;
    clGetEventInfo(event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state, NULL);
    return state == CL_COMPLETE || state < 0;
}

/* Waits up to `seconds` for event to complete; 1 when it did. */
static int completes_within(cl_event event, double seconds)
{
    const struct timespec pause = {0, 2 * 1000 * 1000};
    for (double waited = 0.0; waited < seconds; waited += 0.002) {
        if (event_complete(event)) {
            return 1;
        }
        nanosleep(&pause, NULL);
    }
    return event_complete(event);
}

/* full, or small under CLATTN_TEST_SCALE=small (Oclgrind runs the "queues" case: its problems
 * are cut, every call and every ordering still runs). */
static size_t scaled(size_t full, size_t small)
{
    return tu_small() ? small : full;
}

static void pause_ms(long ms)
{
    const struct timespec pause = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&pause, NULL);
}

/* --- SDPA plans on the caller's queue ------------------------------------------------------ */

/* An SDPA problem with the score rule at work: causal, key padding, the weights wanted (the
 * unfused path, which uses the workspace). */
static void make_gated_problem(pb_sdpa_problem *p, size_t seq_q, size_t seq_k, clattn_path path,
                               int want_weights)
{
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = 2, spec.heads = 3, spec.seq_q = seq_q, spec.seq_k = seq_k;
    spec.dk = 8, spec.dv = 4;
    spec.causal = CLATTN_CAUSAL_TOP_LEFT;
    spec.padding = 1;
    spec.want_weights = want_weights;
    spec.path = path;
    pb_sdpa_make(p, &spec);
}

static clattn_plan *create_sdpa_plan(clattn_ctx *ctx, const pb_sdpa_problem *p)
{
    clattn_sdpa_desc desc;
    pb_sdpa_desc(p, &desc);
    clattn_plan *plan = NULL;
    clattn_status status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    tu_expect(status == CLATTN_SUCCESS, "%s: clattn_sdpa_plan_create: %s: %s", p->label,
              clattn_status_string(status), clattn_last_error(ctx));
    return status == CLATTN_SUCCESS ? plan : NULL;
}

/* Runs a plan on buffers of the caller's context, gated by a user event; checks that the
 * returned event waits for the gate, then the results. release_early: release the plan and
 * the clattn context right after the gate opens (release waits for the work; the event stays
 * valid); a second clattn context on the same queue reads the results back. */
static void run_gated_plan(int out_of_order, int release_early)
{
    own_queue own;
    if (!make_own_queue(out_of_order, &own)) {
        return;
    }
    cl_uint queue_refs = queue_reference_count(own.queue);
    cl_uint context_refs = context_reference_count(own.context);
    clattn_ctx *ctx = ctx_from_queue(own.queue);
    clattn_ctx *checker = ctx_from_queue(own.queue);
    pb_sdpa_problem p;
    make_gated_problem(&p, 5, 7, CLATTN_PATH_AUTO, 1);
    clattn_tensors bound;
    memset(&bound, 0, sizeof bound);
    clattn_plan *plan = ctx != NULL ? create_sdpa_plan(ctx, &p) : NULL;
    cl_int err = CL_SUCCESS;
    cl_event gate = clCreateUserEvent(own.context, &err);
    tu_expect(err == CL_SUCCESS, "clCreateUserEvent: %d", err);
    cl_event done = NULL;

    if (plan != NULL && checker != NULL && pb_sdpa_upload(ctx, &p, &bound) == CL_SUCCESS) {
        tu_expect(clattn_ctx_queue(ctx) == own.queue, "clattn_ctx_queue is not the caller's");
        tu_expect(clattn_ctx_cl_context(ctx) == own.context,
                  "clattn_ctx_cl_context is not the caller's");
        tu_expect(clattn_ctx_device(ctx) == own.device, "clattn_ctx_device is not the caller's");
        tu_expect(!clattn_plan_is_fused(plan), "a plan returning the weights is fused");
        alarm(DEADLOCK_ALARM_SECONDS);
        clattn_status status = clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL,
                                                   NULL, 1, &gate, &done);
        tu_expect(status == CLATTN_SUCCESS, "clattn_plan_execute returned %s: %s",
                  clattn_status_string(status), clattn_last_error(ctx));
        tu_expect(status != CLATTN_SUCCESS || done != NULL, "no event returned");
        if (done != NULL) {
            pause_ms(20);
            tu_expect(!event_complete(done),
                      "the returned event completed before its wait-list event");
        }
        clSetUserEventStatus(gate, CL_COMPLETE);
        if (release_early) {
            /* Released while the work may still run: release waits for that work, and the
             * event the caller holds stays valid. */
            clattn_plan_release(plan);
            plan = NULL;
            clattn_ctx_release(ctx);
            ctx = NULL;
        }
        if (done != NULL) {
            tu_expect(clWaitForEvents(1, &done) == CL_SUCCESS, "clWaitForEvents failed");
            pb_sdpa_check(checker, own.queue, &p, &bound);
        }
        alarm(0);
    } else {
        clSetUserEventStatus(gate, CL_COMPLETE);
    }
    clattn_plan_release(plan);
    if (ctx != NULL) {
        tu_expect(clattn_finish(ctx) == CLATTN_SUCCESS, "clattn_finish failed");
        clattn_ctx_release(ctx);
    }
    clattn_ctx_release(checker);
    expect_queue_alive(&own);

    if (done != NULL) {
        clReleaseEvent(done);
    }
    clReleaseEvent(gate);
    pb_release_tensors(&bound);
    expect_references_returned(&own, queue_refs, context_refs);
    pb_sdpa_free(&p);
    release_own_queue(&own);
}

START_TEST(test_in_order_queue)
{
    TU_BEGIN_TEST();
    tu_set_case("in-order queue, release_early=%d", _i);
    run_gated_plan(0, _i);
    TU_END_TEST();
}
END_TEST

START_TEST(test_out_of_order_queue)
{
    TU_BEGIN_TEST();
    tu_set_case("out-of-order queue, release_early=%d", _i);
    run_gated_plan(1, _i);
    TU_END_TEST();
}
END_TEST

/* --- a chain of calls linked only by events -------------------------------------------------- */

/* A packed (batch, seq, 3E) buffer written without blocking; SDPA reads q, k and v as head
 * views of it (no split copies) and writes its heads into a (batch, seq, E) buffer (no concat
 * copy); a matmul projects that output. Each step waits on the previous one through wait lists
 * only (no finish), on the queue given. */
static void run_event_chain(int out_of_order)
{
    own_queue own;
    if (!make_own_queue(out_of_order, &own)) {
        return;
    }
    clattn_ctx *ctx = ctx_from_queue(own.queue);
    const size_t batch = 2, seq = 9, heads = 4, head_dim = 3, embed = heads * head_dim;
    const size_t packed_count = batch * seq * 3 * embed, part_count = batch * seq * embed;
    float *packed = tu_random_floats(packed_count);
    float *weight = tu_random_floats(embed * embed);
    cl_mem packed_mem = own_nan_buffer(&own, packed_count);
    cl_mem heads_out = own_nan_buffer(&own, part_count);
    cl_mem weight_mem = own_buffer(&own, weight, embed * embed * sizeof(float));
    cl_mem result = own_nan_buffer(&own, part_count);
    /* Written in three pieces, three events: the attention waits on the list of all. */
    cl_event written[3] = {NULL, NULL, NULL}, attention_done = NULL, projection_done = NULL;
    cl_int err = CL_SUCCESS;
    const size_t piece = packed_count / 3;
    for (size_t i = 0; i < 3 && err == CL_SUCCESS; ++i) {
        const size_t count = i < 2 ? piece : packed_count - 2 * piece;
        err = clEnqueueWriteBuffer(own.queue, packed_mem, CL_FALSE, i * piece * sizeof(float),
                                   count * sizeof(float), packed + i * piece, 0, NULL, &written[i]);
    }
    tu_expect(err == CL_SUCCESS, "clEnqueueWriteBuffer: %d", err);

    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.causal = CLATTN_CAUSAL_TOP_LEFT;
    clattn_tensors t;
    memset(&t, 0, sizeof t);
    const size_t view_strides[4] = {seq * 3 * embed, head_dim, 3 * embed, 1};
    clattn_tensor *inputs[3] = {&t.q, &t.k, &t.v};
    for (int part = 0; part < 3; ++part) {
        *inputs[part] = clattn_tensor_make(packed_mem, (size_t)part * embed, CLATTN_DTYPE_F32, 4,
                                           batch, heads, seq, head_dim);
        memcpy(inputs[part]->strides, view_strides, sizeof view_strides);
    }
    t.out = clattn_tensor_make(heads_out, 0, CLATTN_DTYPE_F32, 4, batch, heads, seq, head_dim);
    t.out.strides[0] = seq * embed, t.out.strides[1] = head_dim, t.out.strides[2] = embed;
    t.out.strides[3] = 1;
    desc_tensors = t;
    clattn_plan *plan = NULL;
    clattn_status status = ctx != NULL && err == CL_SUCCESS
                               ? clattn_sdpa_plan_create(ctx, &desc, &plan)
                               : CLATTN_ERR_INVALID_ARGUMENT;
    tu_expect(status == CLATTN_SUCCESS, "sdpa plan: %s: %s", clattn_status_string(status),
              ctx ? clattn_last_error(ctx) : "");
    if (status == CLATTN_SUCCESS) {
        status = clattn_plan_execute(plan, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 3, written,
                                     &attention_done);
        tu_expect(status == CLATTN_SUCCESS, "attention: %s: %s", clattn_status_string(status),
                  clattn_last_error(ctx));
    }
    const clattn_matmul_desc project = {.struct_size = sizeof project, .alpha = 1.0f};
    const clattn_tensor x =
        clattn_tensor_make(heads_out, 0, CLATTN_DTYPE_F32, 2, batch * seq, embed, 0, 0);
    const clattn_tensor w =
        clattn_tensor_make(weight_mem, 0, CLATTN_DTYPE_F32, 2, embed, embed, 0, 0);
    const clattn_tensor y =
        clattn_tensor_make(result, 0, CLATTN_DTYPE_F32, 2, batch * seq, embed, 0, 0);
    if (status == CLATTN_SUCCESS) {
        status =
            clattn_matmul(ctx, &project, &x, &w, NULL, &y, 1, &attention_done, &projection_done);
        tu_expect(status == CLATTN_SUCCESS, "projection: %s: %s", clattn_status_string(status),
                  clattn_last_error(ctx));
    }
    if (status == CLATTN_SUCCESS && projection_done != NULL) {
        float *got = tu_floats(part_count), *heads_got = tu_floats(part_count);
        if (read_after(own.queue, result, 0, part_count, got, projection_done) &&
            read_after(own.queue, heads_out, 0, part_count, heads_got, projection_done)) {
            /* The reference: q, k, v gathered from the packed buffer, attention, concat. */
            float *qkv[3];
            for (int part = 0; part < 3; ++part) {
                qkv[part] = tu_floats(part_count);
                for (size_t b = 0; b < batch; ++b)
                    for (size_t h = 0; h < heads; ++h)
                        for (size_t pos = 0; pos < seq; ++pos)
                            for (size_t x_ = 0; x_ < head_dim; ++x_)
                                qkv[part][((b * heads + h) * seq + pos) * head_dim + x_] =
                                    packed[(b * seq + pos) * 3 * embed + (size_t)part * embed +
                                           h * head_dim + x_];
            }
            ref_sdpa_shape shape = ref_softmax_shape(batch, heads, seq, seq, head_dim, head_dim);
            shape.causal = CLATTN_CAUSAL_TOP_LEFT;
            double *o_ref = tu_doubles(part_count), *concat = tu_doubles(part_count);
            double *expected = tu_doubles(part_count);
            ref_sdpa(&shape, qkv[0], qkv[1], qkv[2], NULL, NULL, o_ref, NULL, NULL);
            for (size_t b = 0; b < batch; ++b)
                for (size_t h = 0; h < heads; ++h)
                    for (size_t pos = 0; pos < seq; ++pos)
                        for (size_t x_ = 0; x_ < head_dim; ++x_)
                            concat[(b * seq + pos) * embed + h * head_dim + x_] =
                                o_ref[((b * heads + h) * seq + pos) * head_dim + x_];
            tu_expect_close("attention heads written as (batch, seq, E)", heads_got, concat,
                            part_count, TU_TOL);
            /* The projection's reference starts from the float heads the device produced. */
            const ref_matmul_shape mm = {.m = batch * seq, .n = embed, .k = embed, .alpha = 1.0f};
            ref_matmul(&mm, heads_got, weight, NULL, expected);
            tu_expect_close("chained projection", got, expected, part_count, TU_TOL);
            free(expected);
            free(concat);
            free(o_ref);
            for (int part = 0; part < 3; ++part)
                free(qkv[part]);
        }
        free(heads_got);
        free(got);
    }

    cl_event events[] = {written[0], written[1], written[2], attention_done, projection_done};
    for (size_t i = 0; i < sizeof events / sizeof events[0]; ++i) {
        if (events[i] != NULL) {
            clWaitForEvents(1, &events[i]);
            clReleaseEvent(events[i]);
        }
    }
    clattn_plan_release(plan);
    clattn_ctx_release(ctx);
    clReleaseMemObject(result);
    clReleaseMemObject(weight_mem);
    clReleaseMemObject(heads_out);
    clReleaseMemObject(packed_mem);
    free(weight);
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
    clattn_ctx *ctx = ctx_from_queue(own.queue);
    pb_mha_spec spec;
    pb_mha_spec_init(&spec);
    spec.batch = 2, spec.seq_q = 6, spec.seq_k = 8, spec.embed_dim = 16, spec.num_heads = 4;
    spec.form = PB_PACKED_CROSS;
    spec.in_biases = spec.out_proj = spec.out_bias = 1;
    spec.need_weights = CLATTN_WEIGHTS_AVERAGED;
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    clattn_mha_desc desc;
    pb_mha_desc(&p, &desc);
    clattn_tensors bound;
    memset(&bound, 0, sizeof bound);
    clattn_plan *plan = NULL;
    cl_int err = CL_SUCCESS;
    cl_event gate = clCreateUserEvent(own.context, &err), done = NULL;
    if (ctx != NULL) {
        clattn_status status = clattn_mha_plan_create(ctx, &desc, &plan);
        tu_expect(status == CLATTN_SUCCESS, "mha plan: %s: %s", clattn_status_string(status),
                  clattn_last_error(ctx));
    }
    if (plan != NULL && pb_mha_upload(ctx, &p, &bound) == CL_SUCCESS) {
        alarm(DEADLOCK_ALARM_SECONDS);
        clattn_status status = clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL,
                                                   NULL, 1, &gate, &done);
        tu_expect(status == CLATTN_SUCCESS, "clattn_plan_execute (mha): %s: %s",
                  clattn_status_string(status), clattn_last_error(ctx));
        if (done != NULL) {
            pause_ms(20);
            tu_expect(!event_complete(done), "mha: the event completed before its wait list");
        }
        clSetUserEventStatus(gate, CL_COMPLETE);
        if (done != NULL) {
            tu_expect(clWaitForEvents(1, &done) == CL_SUCCESS, "clWaitForEvents failed");
            pb_mha_check(ctx, own.queue, &p, &bound);
            clReleaseEvent(done);
        }
        alarm(0);
    } else {
        clSetUserEventStatus(gate, CL_COMPLETE);
    }
    clReleaseEvent(gate);
    clattn_plan_release(plan);
    clattn_ctx_release(ctx);
    pb_release_tensors(&bound);
    pb_mha_free(&p);
    release_own_queue(&own);
    TU_END_TEST();
}
END_TEST

/* --- independent calls in flight together ------------------------------------------------- */

/* Several calls enqueued back to back with no wait lists between them: trans_b matmuls (the
 * vector kernel stages B transposed in the context's workspace) and SDPA plan executions on the
 * context's workspace (all but two unfused: the scores live there). grow: sizes grow, so the
 * workspace grows while earlier calls may still use it; else every call has the same sizes and
 * they all share the same workspace buffers. Each result must be right (calls must not trample
 * each other's workspace, on an out-of-order queue too, where only clattn's own ordering keeps
 * them apart). */
#define INDEPENDENT_CALLS 8
static void run_independent_calls(int out_of_order, int grow)
{
    own_queue own;
    if (!make_own_queue(out_of_order, &own)) {
        return;
    }
    clattn_ctx *ctx = ctx_from_queue(own.queue);
    cl_mem a_mem[INDEPENDENT_CALLS], b_mem[INDEPENDENT_CALLS], c_mem[INDEPENDENT_CALLS];
    cl_event matmul_done[INDEPENDENT_CALLS], attention_done[INDEPENDENT_CALLS];
    float *a[INDEPENDENT_CALLS], *b[INDEPENDENT_CALLS];
    size_t sizes[INDEPENDENT_CALLS];
    pb_sdpa_problem problems[INDEPENDENT_CALLS];
    clattn_tensors bound[INDEPENDENT_CALLS];
    clattn_plan *plans[INDEPENDENT_CALLS];
    for (int call = 0; call < INDEPENDENT_CALLS; ++call) {
        /* 9, 21, .., 93 (small: 3, 7, .., 31) */
        const size_t size =
            grow ? scaled(9 + 12 * (size_t)call, 3 + 4 * (size_t)call) : scaled(57, 17);
        sizes[call] = size;
        a[call] = tu_random_floats(2 * size * (size + 5));
        b[call] = tu_random_floats(2 * (size + 3) * (size + 5));
        a_mem[call] = own_buffer(&own, a[call], 2 * size * (size + 5) * sizeof(float));
        b_mem[call] = own_buffer(&own, b[call], 2 * (size + 3) * (size + 5) * sizeof(float));
        c_mem[call] = own_nan_buffer(&own, 2 * size * (size + 3));
        /* Self-attention: q, k and v bound to one buffer, (1, 2, size, 8). */
        pb_sdpa_spec spec;
        pb_sdpa_spec_init(&spec);
        spec.batch = 1, spec.heads = 2, spec.seq_q = spec.seq_k = size, spec.dk = spec.dv = 8;
        spec.causal = call % 2 ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
        spec.path = call % 4 == 0 ? CLATTN_PATH_AUTO : CLATTN_PATH_UNFUSED;
        pb_sdpa_make(&problems[call], &spec);
        memcpy(problems[call].k, problems[call].q, problems[call].q_count * sizeof(float));
        memcpy(problems[call].v, problems[call].q, problems[call].q_count * sizeof(float));
        pb_sdpa_reference(&problems[call]);
        plans[call] = ctx != NULL ? create_sdpa_plan(ctx, &problems[call]) : NULL;
        memset(&bound[call], 0, sizeof bound[call]);
        if (ctx != NULL && pb_sdpa_upload(ctx, &problems[call], &bound[call]) == CL_SUCCESS) {
            /* One buffer for q, k and v: k's and v's uploads are not needed. */
            clReleaseMemObject(bound[call].k.mem);
            clReleaseMemObject(bound[call].v.mem);
            bound[call].k.mem = bound[call].v.mem = bound[call].q.mem;
            bound[call].k.offset = bound[call].v.offset = bound[call].q.offset;
        }
        matmul_done[call] = NULL;
        attention_done[call] = NULL;
    }
    clFinish(own.queue);
    for (int call = 0; call < INDEPENDENT_CALLS && ctx != NULL; ++call) {
        const size_t size = sizes[call];
        const clattn_matmul_desc md = {.struct_size = sizeof md, .trans_b = 1, .alpha = 1.0f};
        const clattn_tensor ta =
            clattn_tensor_make(a_mem[call], 0, CLATTN_DTYPE_F32, 3, 2, size, size + 5, 0);
        const clattn_tensor tb =
            clattn_tensor_make(b_mem[call], 0, CLATTN_DTYPE_F32, 3, 2, size + 3, size + 5, 0);
        const clattn_tensor tc =
            clattn_tensor_make(c_mem[call], 0, CLATTN_DTYPE_F32, 3, 2, size, size + 3, 0);
        clattn_status status =
            clattn_matmul(ctx, &md, &ta, &tb, NULL, &tc, 0, NULL, &matmul_done[call]);
        tu_expect(status == CLATTN_SUCCESS, "matmul %d: %s: %s", call, clattn_status_string(status),
                  clattn_last_error(ctx));
        if (plans[call] != NULL && bound[call].q.mem != NULL) {
            status = clattn_plan_execute(plans[call], bound[call].by_role, CLATTN_ROLE_COUNT, NULL,
                                         NULL, 0, NULL, &attention_done[call]);
            tu_expect(status == CLATTN_SUCCESS, "attention %d: %s: %s", call,
                      clattn_status_string(status), clattn_last_error(ctx));
        }
    }
    for (int call = 0; call < INDEPENDENT_CALLS; ++call) {
        const size_t size = sizes[call], c_count = 2 * size * (size + 3);
        if (matmul_done[call] != NULL) {
            float *c = tu_floats(c_count);
            double *ref = tu_doubles(c_count);
            const ref_matmul_shape shape = {.batch = {1, 2},
                                            .a_batch = {1, 2},
                                            .b_batch = {1, 2},
                                            .m = size,
                                            .n = size + 3,
                                            .k = size + 5,
                                            .trans_b = 1,
                                            .alpha = 1.0f};
            ref_matmul(&shape, a[call], b[call], NULL, ref);
            if (read_after(own.queue, c_mem[call], 0, c_count, c, matmul_done[call])) {
                tu_expect_close("independent matmul", c, ref, c_count, TU_TOL);
            }
            free(ref);
            free(c);
            clReleaseEvent(matmul_done[call]);
        }
        if (attention_done[call] != NULL) {
            clWaitForEvents(1, &attention_done[call]);
            pb_sdpa_check(ctx, own.queue, &problems[call], &bound[call]);
            clReleaseEvent(attention_done[call]);
        }
    }
    for (int call = 0; call < INDEPENDENT_CALLS; ++call) {
        clattn_plan_release(plans[call]);
    }
    clattn_ctx_release(ctx);
    for (int call = 0; call < INDEPENDENT_CALLS; ++call) {
        pb_release_tensors(&bound[call]);
        pb_sdpa_free(&problems[call]);
        clReleaseMemObject(c_mem[call]);
        clReleaseMemObject(b_mem[call]);
        clReleaseMemObject(a_mem[call]);
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

/* --- ordering: the context's workspace, the caller's, a second queue ----------------------- */

/* Whether the OpenCL implementation runs a command of an out-of-order queue past an earlier one
 * that waits on a closed gate (OpenCL allows it to, and need not): the premise of checking
 * that clattn adds no ordering of its own. */
static int queue_runs_past_gated(const own_queue *own)
{
    cl_int err = CL_SUCCESS;
    cl_event gate = clCreateUserEvent(own->context, &err), marker = NULL, written = NULL;
    float value = 1.0f;
    cl_mem mem = own_buffer(own, &value, sizeof value);
    int runs_past = 0;
    if (clEnqueueMarkerWithWaitList(own->queue, 1, &gate, &marker) == CL_SUCCESS &&
        clEnqueueWriteBuffer(own->queue, mem, CL_FALSE, 0, sizeof value, &value, 0, NULL,
                             &written) == CL_SUCCESS) {
        runs_past = completes_within(written, 5.0);
    }
    clSetUserEventStatus(gate, CL_COMPLETE);
    clFinish(own->queue);
    if (written != NULL)
        clReleaseEvent(written);
    if (marker != NULL)
        clReleaseEvent(marker);
    clReleaseEvent(gate);
    clReleaseMemObject(mem);
    return runs_past;
}

/* Two unfused executions (they use the workspace) on an out-of-order queue, the first gated by
 * a user event. With the context's workspace the second must wait for the first (it would
 * overwrite the first's scores); with workspaces of their own nothing orders them, so the
 * second completes while the first is still gated. Both compute the reference either way. */
START_TEST(test_workspace_ordering)
{
    TU_BEGIN_TEST();
    const int own_workspaces = _i;
    tu_set_case("out-of-order queue, %s",
                own_workspaces ? "caller's workspaces" : "the context's workspace");
    own_queue own;
    if (!make_own_queue(1, &own)) {
        TU_END_TEST();
        return;
    }
    const int observable = own_workspaces ? queue_runs_past_gated(&own) : 1;
    clattn_ctx *ctx = ctx_from_queue(own.queue);
    pb_sdpa_problem first, second;
    /* Without the weights wanted the unfused path keeps the scores in the workspace. */
    make_gated_problem(&first, scaled(33, 11), scaled(17, 7), CLATTN_PATH_UNFUSED, 0);
    make_gated_problem(&second, scaled(17, 7), scaled(33, 11), CLATTN_PATH_UNFUSED, 0);
    clattn_tensors first_bound, second_bound;
    memset(&first_bound, 0, sizeof first_bound);
    memset(&second_bound, 0, sizeof second_bound);
    clattn_plan *first_plan = ctx ? create_sdpa_plan(ctx, &first) : NULL;
    clattn_plan *second_plan = ctx ? create_sdpa_plan(ctx, &second) : NULL;
    cl_mem workspaces[2] = {NULL, NULL};
    cl_int err = CL_SUCCESS;
    cl_event gate = clCreateUserEvent(own.context, &err), first_done = NULL, second_done = NULL;
    if (first_plan != NULL && second_plan != NULL &&
        pb_sdpa_upload(ctx, &first, &first_bound) == CL_SUCCESS &&
        pb_sdpa_upload(ctx, &second, &second_bound) == CL_SUCCESS) {
        if (own_workspaces) {
            const size_t bytes[2] = {clattn_plan_workspace_size(first_plan),
                                     clattn_plan_workspace_size(second_plan)};
            for (int i = 0; i < 2; ++i) {
                tu_expect(bytes[i] > 0, "an unfused plan needs no workspace");
                workspaces[i] = clCreateBuffer(own.context, CL_MEM_READ_WRITE,
                                               bytes[i] ? bytes[i] : 4, NULL, &err);
            }
        }
        const size_t before = clattn_ctx_workspace_bytes(ctx);
        alarm(DEADLOCK_ALARM_SECONDS);
        clattn_status status =
            clattn_plan_execute(first_plan, first_bound.by_role, CLATTN_ROLE_COUNT, NULL,
                                workspaces[0], 1, &gate, &first_done);
        tu_expect_status(status, CLATTN_SUCCESS, "first execution (gated)");
        status = clattn_plan_execute(second_plan, second_bound.by_role, CLATTN_ROLE_COUNT, NULL,
                                     workspaces[1], 0, NULL, &second_done);
        tu_expect_status(status, CLATTN_SUCCESS, "second execution");
        if (first_done != NULL && second_done != NULL) {
            if (own_workspaces && !observable) {
                printf("check_runtime: NOT RUN: the out-of-order queue runs commands in order: "
                       "whether executions with their own workspaces are left unordered is not "
                       "observable here\n");
            } else if (own_workspaces) {
                tu_expect(completes_within(second_done, 60.0),
                          "with workspaces of their own, the second execution waited for the "
                          "gated first one");
                tu_expect(!event_complete(first_done), "the gated execution completed");
                tu_expect(clattn_ctx_workspace_bytes(ctx) == before,
                          "the caller's workspaces grew the context's (%zu -> %zu bytes)", before,
                          clattn_ctx_workspace_bytes(ctx));
            } else {
                pause_ms(100);
                tu_expect(!event_complete(second_done),
                          "on the context's workspace, the second execution completed while "
                          "the first was gated");
            }
        }
        clSetUserEventStatus(gate, CL_COMPLETE);
        if (first_done != NULL && second_done != NULL) {
            clWaitForEvents(1, &first_done);
            clWaitForEvents(1, &second_done);
            pb_sdpa_check(ctx, own.queue, &first, &first_bound);
            pb_sdpa_check(ctx, own.queue, &second, &second_bound);
        }
        alarm(0);
    } else {
        clSetUserEventStatus(gate, CL_COMPLETE);
    }
    cl_event events[3] = {gate, first_done, second_done};
    for (int i = 0; i < 3; ++i) {
        if (events[i] != NULL) {
            clReleaseEvent(events[i]);
        }
    }
    clattn_plan_release(second_plan);
    clattn_plan_release(first_plan);
    clattn_ctx_release(ctx);
    for (int i = 0; i < 2; ++i) {
        if (workspaces[i] != NULL) {
            clReleaseMemObject(workspaces[i]);
        }
    }
    pb_release_tensors(&second_bound);
    pb_release_tensors(&first_bound);
    pb_sdpa_free(&second);
    pb_sdpa_free(&first);
    release_own_queue(&own);
    TU_END_TEST();
}
END_TEST

/* Executions on a second queue of the same cl_context and device (in-order or out-of-order):
 * correct results and events; an execution on the context's own queue after a gated one on the
 * second queue waits for it (they share the context's workspace); executions on the context's
 * queue after that still work. */
START_TEST(test_second_queue)
{
    TU_BEGIN_TEST();
    const int second_out_of_order = _i;
    tu_set_case("second queue, out_of_order=%d", second_out_of_order);
    own_queue own;
    if (!make_own_queue(0, &own)) {
        TU_END_TEST();
        return;
    }
    cl_command_queue second = make_queue(own.context, own.device, second_out_of_order);
    clattn_ctx *ctx = ctx_from_queue(own.queue);
    pb_sdpa_problem on_second, on_first;
    make_gated_problem(&on_second, scaled(29, 9), scaled(31, 11), CLATTN_PATH_UNFUSED, 1);
    make_gated_problem(&on_first, scaled(31, 11), scaled(29, 9), CLATTN_PATH_UNFUSED, 0);
    clattn_tensors second_bound, first_bound;
    memset(&second_bound, 0, sizeof second_bound);
    memset(&first_bound, 0, sizeof first_bound);
    clattn_plan *second_plan = ctx ? create_sdpa_plan(ctx, &on_second) : NULL;
    clattn_plan *first_plan = ctx ? create_sdpa_plan(ctx, &on_first) : NULL;
    cl_int err = CL_SUCCESS;
    cl_event gate = clCreateUserEvent(own.context, &err), second_done = NULL, first_done = NULL;
    if (second != NULL && second_plan != NULL && first_plan != NULL &&
        pb_sdpa_upload(ctx, &on_second, &second_bound) == CL_SUCCESS &&
        pb_sdpa_upload(ctx, &on_first, &first_bound) == CL_SUCCESS) {
        /* Plain: on the second queue, then on the context's. */
        clattn_status status =
            clattn_plan_execute(second_plan, second_bound.by_role, CLATTN_ROLE_COUNT, second, NULL,
                                0, NULL, &second_done);
        tu_expect_status(status, CLATTN_SUCCESS, "execute on the second queue");
        if (second_done != NULL) {
            clWaitForEvents(1, &second_done);
            clReleaseEvent(second_done);
            second_done = NULL;
            pb_sdpa_check(ctx, second, &on_second, &second_bound);
        }
        status = clattn_plan_execute(first_plan, first_bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                     0, NULL, NULL);
        tu_expect_status(status, CLATTN_SUCCESS, "execute on the context's queue");
        pb_sdpa_check(ctx, NULL, &on_first, &first_bound);

        /* Gated on the second queue; the next execution on the context's queue waits. */
        pb_sdpa_poison(ctx, second, &second_bound);
        pb_sdpa_poison(ctx, NULL, &first_bound);
        alarm(DEADLOCK_ALARM_SECONDS);
        status = clattn_plan_execute(second_plan, second_bound.by_role, CLATTN_ROLE_COUNT, second,
                                     NULL, 1, &gate, &second_done);
        tu_expect_status(status, CLATTN_SUCCESS, "gated execute on the second queue");
        status = clattn_plan_execute(first_plan, first_bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                     0, NULL, &first_done);
        tu_expect_status(status, CLATTN_SUCCESS, "execute on the context's queue after it");
        if (first_done != NULL) {
            pause_ms(100);
            tu_expect(!event_complete(first_done),
                      "the execution on the context's queue completed while the one on the "
                      "second queue (same workspace) was gated");
        }
        clSetUserEventStatus(gate, CL_COMPLETE);
        if (second_done != NULL && first_done != NULL) {
            clWaitForEvents(1, &second_done);
            clWaitForEvents(1, &first_done);
            pb_sdpa_check(ctx, second, &on_second, &second_bound);
            pb_sdpa_check(ctx, NULL, &on_first, &first_bound);
        }
        alarm(0);
    } else {
        clSetUserEventStatus(gate, CL_COMPLETE);
    }
    cl_event events[3] = {gate, second_done, first_done};
    for (int i = 0; i < 3; ++i) {
        if (events[i] != NULL) {
            clReleaseEvent(events[i]);
        }
    }
    if (second != NULL) {
        clFinish(second);
    }
    clattn_plan_release(first_plan);
    clattn_plan_release(second_plan);
    clattn_ctx_release(ctx);
    pb_release_tensors(&first_bound);
    pb_release_tensors(&second_bound);
    pb_sdpa_free(&on_first);
    pb_sdpa_free(&on_second);
    if (second != NULL) {
        clReleaseCommandQueue(second);
    }
    release_own_queue(&own);
    TU_END_TEST();
}
END_TEST

/* --- workspace growth and reuse ------------------------------------------------------------- */

/* clattn_ctx_workspace_bytes: 0 on a fresh context; a fused plan needs none; an unfused one
 * grows it to at least its clattn_plan_workspace_size; a smaller plan reuses it (no growth);
 * a larger one grows it; the caller's workspace leaves it alone. Every execution computes the
 * reference. */
START_TEST(test_workspace_growth)
{
    TU_BEGIN_TEST();
    tu_set_case("workspace growth and reuse");
    own_queue own;
    if (!make_own_queue(0, &own)) {
        TU_END_TEST();
        return;
    }
    clattn_ctx *ctx = ctx_from_queue(own.queue);
    enum { FUSED, SMALL, MEDIUM, LARGE, COUNT };
    const size_t seqs[COUNT] = {scaled(40, 12), scaled(17, 5), scaled(33, 9), scaled(65, 17)};
    pb_sdpa_problem p[COUNT];
    clattn_plan *plans[COUNT] = {NULL};
    clattn_tensors bound[COUNT];
    for (int i = 0; i < COUNT; ++i) {
        make_gated_problem(&p[i], seqs[i], seqs[i] + 2,
                           i == FUSED ? CLATTN_PATH_FUSED : CLATTN_PATH_UNFUSED, 0);
        memset(&bound[i], 0, sizeof bound[i]);
        if (ctx != NULL) {
            plans[i] = create_sdpa_plan(ctx, &p[i]);
            pb_sdpa_upload(ctx, &p[i], &bound[i]);
        }
    }
    if (ctx != NULL && plans[FUSED] && plans[SMALL] && plans[MEDIUM] && plans[LARGE]) {
        size_t sizes[COUNT];
        for (int i = 0; i < COUNT; ++i)
            sizes[i] = clattn_plan_workspace_size(plans[i]);
        tu_expect(sizes[FUSED] == 0, "the fused plan needs %zu bytes of workspace", sizes[FUSED]);
        tu_expect(0 < sizes[SMALL] && sizes[SMALL] < sizes[MEDIUM] && sizes[MEDIUM] < sizes[LARGE],
                  "workspace sizes %zu, %zu, %zu do not grow with the problem", sizes[SMALL],
                  sizes[MEDIUM], sizes[LARGE]);
        tu_expect(clattn_ctx_workspace_bytes(ctx) == 0, "a fresh context holds %zu bytes",
                  clattn_ctx_workspace_bytes(ctx));
        /* plan, expected bytes after (0: unchanged), whether the caller gives a workspace */
        static const struct {
            int plan, caller;
        } steps[] = {{FUSED, 0}, {MEDIUM, 0}, {SMALL, 0}, {MEDIUM, 0},
                     {LARGE, 1}, {LARGE, 0},  {SMALL, 0}, {FUSED, 0}};
        size_t held = 0;
        for (int s = 0; s < COUNT_OF(steps); ++s) {
            const int i = steps[s].plan;
            cl_mem workspace = NULL;
            cl_int err = CL_SUCCESS;
            if (steps[s].caller)
                workspace = clCreateBuffer(own.context, CL_MEM_READ_WRITE, sizes[i], NULL, &err);
            pb_sdpa_poison(ctx, NULL, &bound[i]);
            clattn_status status = clattn_plan_execute(
                plans[i], bound[i].by_role, CLATTN_ROLE_COUNT, NULL, workspace, 0, NULL, NULL);
            tu_expect(status == CLATTN_SUCCESS, "step %d: execute: %s: %s", s,
                      clattn_status_string(status), clattn_last_error(ctx));
            pb_sdpa_check(ctx, NULL, &p[i], &bound[i]);
            const size_t now = clattn_ctx_workspace_bytes(ctx);
            if (!steps[s].caller && sizes[i] > held) {
                tu_expect(now >= sizes[i],
                          "step %d: the context holds %zu bytes, the plan needs %zu", s, now,
                          sizes[i]);
                held = now;
            } else {
                tu_expect(now == held,
                          "step %d: the context's workspace changed from %zu to %zu "
                          "bytes (%s)",
                          s, held, now, steps[s].caller ? "caller's workspace" : "reuse");
            }
            if (workspace != NULL)
                clReleaseMemObject(workspace);
        }
    }
    for (int i = 0; i < COUNT; ++i) {
        clattn_plan_release(plans[i]);
        pb_release_tensors(&bound[i]);
        pb_sdpa_free(&p[i]);
    }
    clattn_ctx_release(ctx);
    release_own_queue(&own);
    TU_END_TEST();
}
END_TEST

/* --- plan lifetimes ------------------------------------------------------------------------- */

/* A plan released right after its execution was enqueued (its work still runs to the right
 * result); plans kept while the context runs other calls (a matmul, the host API, other
 * plans) and executed again afterwards; plans released in another order than created. */
START_TEST(test_plan_lifetimes)
{
    TU_BEGIN_TEST();
    tu_set_case("plan lifetimes");
    clattn_ctx *ctx = tu_ctx();
    pb_sdpa_problem p[3];
    clattn_plan *plans[3] = {NULL};
    clattn_tensors bound[3];
    static const clattn_path paths[3] = {CLATTN_PATH_UNFUSED, CLATTN_PATH_FUSED, CLATTN_PATH_AUTO};
    for (int i = 0; i < 3; ++i) {
        make_gated_problem(&p[i], 9 + 8 * (size_t)i, 12, paths[i], i == 0);
        plans[i] = create_sdpa_plan(ctx, &p[i]);
        memset(&bound[i], 0, sizeof bound[i]);
        pb_sdpa_upload(ctx, &p[i], &bound[i]);
    }
    /* Released right after enqueueing. */
    cl_event done = NULL;
    clattn_status status = plans[0]
                               ? clattn_plan_execute(plans[0], bound[0].by_role, CLATTN_ROLE_COUNT,
                                                     NULL, NULL, 0, NULL, &done)
                               : CLATTN_ERR_INVALID_ARGUMENT;
    tu_expect_status(status, CLATTN_SUCCESS, "execute, then release at once");
    clattn_plan_release(plans[0]);
    plans[0] = NULL;
    if (done != NULL) {
        clWaitForEvents(1, &done);
        clReleaseEvent(done);
        pb_sdpa_check(ctx, NULL, &p[0], &bound[0]);
    }
    /* Other calls on the context between two executions of plans[1] and plans[2]. */
    for (int round = 0; round < 2; ++round) {
        for (int i = 1; i < 3; ++i) {
            if (plans[i] == NULL)
                continue;
            pb_sdpa_poison(ctx, NULL, &bound[i]);
            status = clattn_plan_execute(plans[i], bound[i].by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                         0, NULL, NULL);
            tu_expect(status == CLATTN_SUCCESS, "round %d plan %d: %s: %s", round, i,
                      clattn_status_string(status), clattn_last_error(ctx));
            pb_sdpa_check(ctx, NULL, &p[i], &bound[i]);
        }
        if (round == 0) {
            /* A new plan created and released, a matmul, a host call. */
            pb_sdpa_problem other;
            make_gated_problem(&other, scaled(70, 20), scaled(70, 20), CLATTN_PATH_UNFUSED, 1);
            tu_expect_status(pb_sdpa_run(ctx, &other, NULL), CLATTN_SUCCESS,
                             "another plan in between");
            pb_sdpa_free(&other);
            clattn_attention_host_desc host;
            clattn_attention_host_desc_init(&host);
            host.batch = 1, host.heads = 2, host.seq_q = 5, host.seq_k = 6;
            host.head_dim_qk = 3, host.head_dim_v = 2;
            float *q = tu_random_floats(2 * 5 * 3), *k = tu_random_floats(2 * 6 * 3);
            float *v = tu_random_floats(2 * 6 * 2), *out = tu_nan_floats(2 * 5 * 2);
            double *ref = tu_doubles(2 * 5 * 2);
            ref_sdpa_shape shape = ref_softmax_shape(1, 2, 5, 6, 3, 2);
            ref_sdpa(&shape, q, k, v, NULL, NULL, ref, NULL, NULL);
            status = clattn_attention_host(ctx, &host, q, k, v, NULL, out, NULL);
            if (tu_expect_status(status, CLATTN_SUCCESS, "host call in between")) {
                tu_expect_close("host out in between", out, ref, 2 * 5 * 2, TU_TOL);
            }
            free(ref);
            free(out);
            free(v);
            free(k);
            free(q);
        }
    }
    clattn_plan_release(plans[1]);
    clattn_plan_release(plans[2]);
    for (int i = 0; i < 3; ++i) {
        pb_release_tensors(&bound[i]);
        pb_sdpa_free(&p[i]);
    }
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
    clattn_attention_host_desc desc;
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
        clattn_attention_host_desc *desc = &work[t].desc;
        clattn_attention_host_desc_init(desc);
        desc->batch = 2, desc->heads = 1 + (size_t)t, desc->seq_q = 17 + 8 * (size_t)t;
        desc->seq_k = 33, desc->head_dim_qk = 8, desc->head_dim_v = 4 + (size_t)t;
        desc->causal = t == 1 ? CLATTN_CAUSAL_BOTTOM_RIGHT : CLATTN_CAUSAL_NONE;
        desc->path = t == 2 ? CLATTN_PATH_UNFUSED : CLATTN_PATH_AUTO;
        size_t heads_total = desc->batch * desc->heads;
        size_t q_count = heads_total * desc->seq_q * desc->head_dim_qk;
        size_t k_count = heads_total * desc->seq_k * desc->head_dim_qk;
        size_t v_count = heads_total * desc->seq_k * desc->head_dim_v;
        out_counts[t] = heads_total * desc->seq_q * desc->head_dim_v;
        work[t].q = tu_random_floats(q_count);
        work[t].k = tu_random_floats(k_count);
        work[t].v = tu_random_floats(v_count);
        for (int call = 0; call < CALLS_PER_THREAD; ++call) {
            work[t].out[call] = tu_nan_floats(out_counts[t]);
        }
        refs[t] = tu_doubles(out_counts[t]);
        ref_sdpa_shape shape = ref_softmax_shape(desc->batch, desc->heads, desc->seq_q,
                                                 desc->seq_k, desc->head_dim_qk, desc->head_dim_v);
        shape.causal = desc->causal;
        ref_sdpa(&shape, work[t].q, work[t].k, work[t].v, NULL, NULL, refs[t], NULL, NULL);
    }
    for (int t = 0; t < THREAD_COUNT; ++t) {
        started[t] = pthread_create(&threads[t], NULL, thread_main, &work[t]) == 0;
        tu_expect(started[t], "pthread_create failed for thread %d", t);
    }
    for (int t = 0; t < THREAD_COUNT; ++t) {
        if (started[t]) {
            pthread_join(threads[t], NULL);
            tu_expect(work[t].create_status == CLATTN_SUCCESS,
                      "thread %d: clattn_ctx_create: %s: %s", t,
                      clattn_status_string(work[t].create_status), work[t].message);
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

/* An m x n x k matmul with bias and beta on ctx (buffers of its own cl_context) against the
 * reference. */
static void expect_product_on(clattn_ctx *ctx, size_t m, size_t n, size_t k)
{
    float *a = tu_random_floats(m * k), *b = tu_random_floats(k * n), *c = tu_random_floats(m * n);
    float *bias = tu_random_floats(n);
    double *ref = tu_doubles(m * n);
    tu_floats_to_doubles(c, m * n, ref);
    const clattn_matmul_desc desc = {.struct_size = sizeof desc, .alpha = 1.0f, .beta = 0.5f};
    const ref_matmul_shape shape = {.m = m, .n = n, .k = k, .alpha = 1.0f, .beta = 0.5f};
    ref_matmul(&shape, a, b, bias, ref);
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
        const clattn_tensor ta = clattn_tensor_make(a_mem, 0, CLATTN_DTYPE_F32, 2, m, k, 0, 0);
        const clattn_tensor tb = clattn_tensor_make(b_mem, 0, CLATTN_DTYPE_F32, 2, k, n, 0, 0);
        const clattn_tensor tc = clattn_tensor_make(c_mem, 0, CLATTN_DTYPE_F32, 2, m, n, 0, 0);
        const clattn_tensor tbias =
            clattn_tensor_make(bias_mem, 0, CLATTN_DTYPE_F32, 1, n, 0, 0, 0);
        clattn_status status = clattn_matmul(ctx, &desc, &ta, &tb, &tbias, &tc, 0, NULL, NULL);
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

/* Kernel tracing (clattn_ctx_trace_kernels / clattn_ctx_kernel_times): on a queue with
 * profiling, each launch's own device time, in launch order, and nothing once off; a queue
 * without profiling refuses the times (UNSUPPORTED), with the product still right. */
START_TEST(test_kernel_trace)
{
    TU_BEGIN_TEST();
    tu_set_case("kernel trace");
    clattn_ctx *ctx = tu_ctx();
    cl_int err = CL_SUCCESS;
    cl_command_queue profiled = clCreateCommandQueue(
        clattn_ctx_cl_context(ctx), clattn_ctx_device(ctx), CL_QUEUE_PROFILING_ENABLE, &err);
    clattn_ctx *traced = NULL;
    if (tu_expect(err == CL_SUCCESS, "clCreateCommandQueue(profiling): %d", (int)err) &&
        (traced = ctx_from_queue(profiled)) != NULL) {
        clattn_kernel_time times[8];
        size_t count = 99, dropped = 99;
        tu_expect_status(clattn_ctx_trace_kernels(traced, 1), CLATTN_SUCCESS, "trace on");
        expect_product_on(traced, 17, 13, 9);
        expect_product_on(traced, 3, 65, 2);
        tu_expect_status(clattn_ctx_kernel_times(traced, times, 8, &count, &dropped),
                         CLATTN_SUCCESS, "kernel times");
        tu_expect(count >= 2 && dropped == 0, "%zu kernels (%zu dropped), want 2 or more", count,
                  dropped);
        size_t matmuls = 0;
        for (size_t i = 0; i < count && i < 8; ++i) {
            matmuls += strncmp(times[i].name, "matmul", 6) == 0;
            tu_expect(isfinite(times[i].ms) && times[i].ms >= 0.0 && times[i].ms < 60000.0,
                      "kernel %zu (%s): %g ms", i, times[i].name, times[i].ms);
        }
        tu_expect(matmuls >= 2, "%zu matmul launches traced of %zu", matmuls, count);
        /* The record was cleared; a capacity of 1 keeps one and counts the rest as dropped. */
        tu_expect_status(clattn_ctx_kernel_times(traced, times, 8, &count, &dropped),
                         CLATTN_SUCCESS, "kernel times again");
        tu_expect(count == 0 && dropped == 0, "a second read gave %zu kernels", count);
        expect_product_on(traced, 5, 5, 5);
        expect_product_on(traced, 5, 5, 5);
        clattn_ctx_kernel_times(traced, times, 1, &count, &dropped);
        tu_expect(count == 1 && dropped >= 1, "capacity 1: %zu kept, %zu dropped", count, dropped);
        tu_expect_status(clattn_ctx_trace_kernels(traced, 0), CLATTN_SUCCESS, "trace off");
        expect_product_on(traced, 4, 4, 4);
        clattn_ctx_kernel_times(traced, times, 8, &count, &dropped);
        tu_expect(count == 0, "tracing off recorded %zu kernels", count);
    }
    clattn_ctx_release(traced);
    if (profiled)
        clReleaseCommandQueue(profiled);
    /* tu_ctx's queue has no profiling: the times are refused, the work still done. */
    size_t count = 99;
    clattn_kernel_time one;
    tu_expect_status(clattn_ctx_trace_kernels(ctx, 1), CLATTN_SUCCESS, "trace on (plain queue)");
    expect_product_on(ctx, 6, 7, 8);
    const clattn_status status = clattn_ctx_kernel_times(ctx, &one, 1, &count, NULL);
    tu_expect(status == CLATTN_ERR_UNSUPPORTED && count == 0 &&
                  strstr(clattn_last_error(ctx), "CL_QUEUE_PROFILING_ENABLE"),
              "a plain queue: %s: %s", clattn_status_string(status), clattn_last_error(ctx));
    clattn_ctx_trace_kernels(ctx, 0);
    tu_expect(clattn_ctx_kernel_times(NULL, &one, 1, &count, NULL) == CLATTN_ERR_INVALID_ARGUMENT &&
                  clattn_ctx_kernel_times(ctx, &one, 1, NULL, NULL) == CLATTN_ERR_INVALID_ARGUMENT,
              "NULL ctx or count accepted");
    TU_END_TEST();
}
END_TEST

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
        clattn_ctx *first = ctx_from_queue(own.queue);
        clattn_ctx *second = ctx_from_queue(own.queue);
        clattn_ctx *order[] = {first, second};
        for (int step = 0; step < 2; ++step) {
            if (order[step] == NULL) {
                continue;
            }
            expect_matmul_on(order[step]);
            tu_expect(clattn_finish(order[step]) == CLATTN_SUCCESS, "clattn_finish failed");
            /* Releasing the first context must leave the second one working. */
            if (step == 0) {
                clattn_ctx_release(first);
                first = NULL;
            }
        }
        clattn_ctx_release(second);
        expect_queue_alive(&own);
        expect_references_returned(&own, queue_refs, context_refs);
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
        tu_expect(clattn_ctx_workspace_bytes(ctx) == 0, "a fresh context holds %zu bytes",
                  clattn_ctx_workspace_bytes(ctx));
        tu_expect(clattn_finish(ctx) == CLATTN_SUCCESS, "clattn_finish on an idle context");
        expect_matmul_on(ctx);
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

/* The files every program is built with before its own source (programs.c's prelude). */
static int write_prelude(const char *dir)
{
    return write_text(dir, "common.cl", "/* empty */\n") &&
           write_text(dir, "types.cl", "/* empty */\n") &&
           write_text(dir, "params.h", "/* empty */\n") &&
           write_text(dir, "score.cl", "/* empty */\n");
}

/* Runs a 2x2x2 matmul on a fresh context made while CLATTN_KERNEL_DIR=dir; returns its status
 * and copies the context's last error into message. */
static clattn_status matmul_with_kernel_dir(const char *dir, char *message, size_t size)
{
    setenv("CLATTN_KERNEL_DIR", dir, 1);
    /* the errors as the broken sources give them: no probe first (check_validate's subject) */
    setenv("CLATTN_VALIDATE", "off", 1);
    clattn_ctx *ctx = NULL;
    clattn_status status = clattn_ctx_create(NULL, &ctx, message, size);
    if (status == CLATTN_SUCCESS) {
        cl_int err = CL_SUCCESS;
        cl_mem mem = clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_WRITE,
                                    4 * sizeof(float), NULL, &err);
        const clattn_matmul_desc desc = {.struct_size = sizeof desc, .alpha = 1.0f};
        const clattn_tensor t = clattn_tensor_make(mem, 0, CLATTN_DTYPE_F32, 2, 2, 2, 0, 0);
        status = clattn_matmul(ctx, &desc, &t, &t, NULL, &t, 0, NULL, NULL);
        snprintf(message, size, "%s", clattn_last_error(ctx));
        clReleaseMemObject(mem);
        clattn_ctx_release(ctx);
    }
    unsetenv("CLATTN_KERNEL_DIR");
    unsetenv("CLATTN_VALIDATE");
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
        write_prelude(dir) &&
            write_text(dir, "matmul.cl",
                       "__kernel void matmul(__global float *x) { x[0] = undeclared_name; }\n"),
        "cannot write kernel files into %s", dir);
    clattn_status status = matmul_with_kernel_dir(dir, message, sizeof message);
    tu_expect(status == CLATTN_ERR_BUILD, "broken kernel: got %s, want CLATTN_ERR_BUILD",
              clattn_status_string(status));
    tu_expect(tu_starts_with(message, "matmul: ") &&
                  strstr(message, "clBuildProgram(matmul.cl") != NULL,
              "message does not name the op and the program: '%s'", message);
    tu_expect(strstr(message, "undeclared_name") != NULL,
              "message lacks the build log (which names the bad identifier): '%s'", message);

    char missing[600];
    snprintf(missing, sizeof missing, "%s/does-not-exist", dir);
    status = matmul_with_kernel_dir(missing, message, sizeof message);
    tu_expect(status == CLATTN_ERR_BUILD && strstr(message, "cannot read") != NULL,
              "missing kernel dir: got %s '%s'", clattn_status_string(status), message);

    static const char *const files[] = {"common.cl", "types.cl", "params.h", "score.cl",
                                        "matmul.cl"};
    for (int i = 0; i < COUNT_OF(files); ++i) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        remove(path);
    }
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

static void set_device_env(const char *value)
{
    if (value != NULL) {
        setenv("CLATTN_DEVICE", value, 1);
    } else {
        unsetenv("CLATTN_DEVICE");
    }
}

/* An SDPA plan (fused, and unfused with the weights) on ctx against the reference. */
static void expect_attention_on(clattn_ctx *ctx)
{
    for (int unfused = 0; unfused < 2; ++unfused) {
        pb_sdpa_problem p;
        make_gated_problem(&p, 19, 23, unfused ? CLATTN_PATH_UNFUSED : CLATTN_PATH_AUTO, unfused);
        tu_expect_status(pb_sdpa_run(ctx, &p, NULL), CLATTN_SUCCESS, "attention on the device");
        pb_sdpa_free(&p);
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
     * compute in several passes, and attention on both paths. */
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
                expect_attention_on(ctx);
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

/* dir/name made a folder holding the prelude and `file` with the given text (text NULL: `file`
 * is made a folder itself, and nothing else). Returns 1 on success; path receives dir/name. */
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
    return write_prelude(path) && write_text(path, file, text);
}

typedef enum kernel_dir_op { DIR_MATMUL, DIR_FLASH } kernel_dir_op;

/* Runs one small call on a fresh context while CLATTN_KERNEL_DIR=dir: a matmul or a fused SDPA
 * plan; returns its status and copies the last error into message. */
static clattn_status op_with_kernel_dir(const char *dir, kernel_dir_op op, char *message,
                                        size_t size)
{
    setenv("CLATTN_KERNEL_DIR", dir, 1);
    /* the errors as the broken sources give them: no probe first (check_validate's subject) */
    setenv("CLATTN_VALIDATE", "off", 1);
    clattn_ctx *ctx = NULL;
    clattn_status status = clattn_ctx_create(NULL, &ctx, message, size);
    if (status == CLATTN_SUCCESS) {
        cl_int err = CL_SUCCESS;
        cl_mem mem = clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_WRITE,
                                    64 * sizeof(float), NULL, &err);
        if (op == DIR_MATMUL) {
            const clattn_matmul_desc desc = {.struct_size = sizeof desc, .alpha = 1.0f};
            const clattn_tensor t = clattn_tensor_make(mem, 0, CLATTN_DTYPE_F32, 2, 2, 2, 0, 0);
            status = clattn_matmul(ctx, &desc, &t, &t, NULL, &t, 0, NULL, NULL);
        } else {
            clattn_sdpa_desc desc;
            clattn_sdpa_desc_init(&desc);
            clattn_tensors desc_tensors = {0};
            CLATTN_BIND_ROLES(desc, desc_tensors);
            desc.path = CLATTN_PATH_FUSED;
            const clattn_tensor t = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, 1, 1, 2, 4);
            desc_tensors.q = desc_tensors.k = desc_tensors.v = desc_tensors.out = t;
            clattn_plan *plan = NULL;
            status = clattn_sdpa_plan_create(ctx, &desc, &plan);
            if (status == CLATTN_SUCCESS) {
                clattn_tensors bound = desc_tensors;
                bound.q.mem = bound.k.mem = bound.v.mem = bound.out.mem = mem;
                status = clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                             NULL, NULL);
            }
            clattn_plan_release(plan);
        }
        snprintf(message, size, "%s", clattn_last_error(ctx));
        tu_release_mem(mem);
        clattn_ctx_release(ctx);
    }
    unsetenv("CLATTN_KERNEL_DIR");
    unsetenv("CLATTN_VALIDATE");
    return status;
}

/* Each way a kernel folder can be unusable gives its own status and a message naming the call,
 * the file or the kernel: an unreadable path or file, a program without the kernel, a kernel
 * with other arguments, a build log longer than the message (cut to fit after the op's name).
 * An empty CLATTN_KERNEL_DIR means the embedded kernels. */
/* --- the kernel families' parameter structs (kernels/params.h) ---------------------------
 * Each struct is filled on the host with a distinct value per field (1, 2, 3, ... in list
 * order), passed by value to a kernel that writes every field back as 64 bits, and compared:
 * the layout the host writes is the one the device reads, on this device's compiler. */
#define HOST_BITS_ulong(x) ((cl_ulong)(x))
#define HOST_BITS_long(x) ((cl_ulong)(x))
#define HOST_BITS_uint(x) ((cl_ulong)(x))
#define HOST_BITS_int(x) ((cl_ulong)(cl_uint)(x))
#define HOST_BITS_float(x) ((cl_ulong)float_bits(x))
static cl_uint float_bits(float value)
{
    cl_uint bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static const char params_echo_source[] =
    "#define BITS_ulong(x) (x)\n"
    "#define BITS_long(x) as_ulong(x)\n"
    "#define BITS_uint(x) (ulong)(x)\n"
    "#define BITS_int(x) (ulong)as_uint(x)\n"
    "#define BITS_float(x) (ulong)as_uint(x)\n"
    "#define ECHO(type, name) out[i++] = BITS_##type(params.name);\n"
    "#define ECHO_SCORE(type, name) out[i++] = BITS_##type(params.score.name);\n"
    "#define PLAIN(family, LIST) __kernel void echo_##family(__global ulong *out, \\\n"
    "    const clattn_##family##_params params) { uint i = 0; LIST(ECHO) out[i] = i; }\n"
    "#define SCORED(family, LIST) __kernel void echo_##family(__global ulong *out, \\\n"
    "    const clattn_##family##_params params) { uint i = 0; \\\n"
    "    CLATTN_SCORE_PARAMS(ECHO_SCORE) LIST(ECHO) out[i] = i; }\n"
    "PLAIN(score, CLATTN_SCORE_PARAMS)\n"
    "SCORED(flash, CLATTN_FLASH_PARAMS)\n"
    "SCORED(softmax, CLATTN_SOFTMAX_PARAMS)\n"
    "PLAIN(matmul, CLATTN_MATMUL_PARAMS)\n"
    "PLAIN(rope, CLATTN_ROPE_PARAMS)\n"
    "PLAIN(posenc, CLATTN_POSENC_PARAMS)\n"
    "PLAIN(additive, CLATTN_ADDITIVE_PARAMS)\n"
    "PLAIN(merge, CLATTN_MERGE_PARAMS)\n"
    "PLAIN(append, CLATTN_APPEND_PARAMS)\n"
    "PLAIN(commit, CLATTN_COMMIT_PARAMS)\n"
    "PLAIN(merge_states, CLATTN_MERGE_STATES_PARAMS)\n";

#define PARAMS_MAX_FIELDS 128
/* Fills the struct's fields with 1, 2, ... and the expected bits. */
#define FILL(type, name) (p.name = (CLATTN_T_##type)(++n), want[n - 1] = HOST_BITS_##type(p.name));
#define FILL_SCORE(type, name)                                                                     \
    (p.score.name = (CLATTN_T_##type)(++n), want[n - 1] = HOST_BITS_##type(p.score.name));

/* Runs echo_<family> on the struct `size` bytes at `params` and compares n fields. */
static void expect_echo(cl_context context, cl_command_queue queue, cl_program program,
                        const char *family, const void *params, size_t size,
                        const cl_ulong *want, cl_uint n)
{
    char name[64];
    snprintf(name, sizeof name, "echo_%s", family);
    tu_set_case(name);
    cl_int err = CL_SUCCESS;
    cl_ulong got[PARAMS_MAX_FIELDS + 1];
    for (int i = 0; i <= PARAMS_MAX_FIELDS; ++i)
        got[i] = 0xdeadbeefdeadbeefull; /* poison */
    cl_kernel kernel = clCreateKernel(program, name, &err);
    cl_mem out = clCreateBuffer(context, CL_MEM_READ_WRITE, sizeof got, NULL, &err);
    if (tu_expect(kernel && out, "%s: clCreateKernel/clCreateBuffer: %d", name, (int)err)) {
        err = clEnqueueWriteBuffer(queue, out, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL);
        err |= clSetKernelArg(kernel, 0, sizeof out, &out);
        err |= clSetKernelArg(kernel, 1, size, params);
        const size_t one = 1;
        err |= clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &one, &one, 0, NULL, NULL);
        err |= clEnqueueReadBuffer(queue, out, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL);
        if (tu_expect(err == CL_SUCCESS, "%s: OpenCL error %d", name, (int)err) &&
            tu_expect(got[n] == n, "%s: the kernel read %llu fields, the host wrote %u", name,
                      (unsigned long long)got[n], n)) {
            for (cl_uint i = 0; i < n; ++i)
                tu_expect(got[i] == want[i], "%s: field %u: device read %#llx, host wrote %#llx",
                          name, i, (unsigned long long)got[i], (unsigned long long)want[i]);
        }
    }
    if (out)
        clReleaseMemObject(out);
    if (kernel)
        clReleaseKernel(kernel);
}

#define ECHO_PLAIN(family, LIST)                                                                   \
    do {                                                                                           \
        clattn_##family##_params p;                                                                \
        cl_ulong want[PARAMS_MAX_FIELDS];                                                          \
        cl_uint n = 0;                                                                             \
        LIST(FILL)                                                                                 \
        expect_echo(context, queue, program, #family, &p, sizeof p, want, n);                      \
    } while (0)
#define ECHO_SCORED(family, LIST)                                                                  \
    do {                                                                                           \
        clattn_##family##_params p;                                                                \
        cl_ulong want[PARAMS_MAX_FIELDS];                                                          \
        cl_uint n = 0;                                                                             \
        CLATTN_SCORE_PARAMS(FILL_SCORE)                                                            \
        LIST(FILL)                                                                                 \
        expect_echo(context, queue, program, #family, &p, sizeof p, want, n);                      \
    } while (0)

START_TEST(test_params_layout)
{
    TU_BEGIN_TEST();
    char message[4096];
    clattn_ctx *ctx = NULL;
    clattn_status status = clattn_ctx_create(NULL, &ctx, message, sizeof message);
    if (status == CLATTN_ERR_NO_DEVICE) {
        TU_END_TEST();
        return;
    }
    cl_program program = NULL;
    char *header = NULL;
    if (!tu_expect(status == CLATTN_SUCCESS, "create: %s", message))
        goto done;
    char path[1024];
    snprintf(path, sizeof path, "%s/params.h", CLATTN_TEST_KERNEL_SOURCES);
    FILE *f = fopen(path, "rb");
    if (!tu_expect(f != NULL, "cannot open %s", path))
        goto done;
    header = calloc(1, 65536);
    const size_t length = header ? fread(header, 1, 65535, f) : 0;
    fclose(f);
    if (!tu_expect(length > 0 && length < 65535, "cannot read %s", path))
        goto done;
    cl_context context = clattn_ctx_cl_context(ctx);
    cl_command_queue queue = clattn_ctx_queue(ctx);
    cl_device_id device = clattn_ctx_device(ctx);
    const char *texts[2] = {header, params_echo_source};
    cl_int err = CL_SUCCESS;
    program = clCreateProgramWithSource(context, 2, texts, NULL, &err);
    if (!tu_expect(err == CL_SUCCESS, "clCreateProgramWithSource: %d", (int)err))
        goto done;
    err = clBuildProgram(program, 1, &device, "-cl-std=CL1.2", NULL, NULL);
    if (err != CL_SUCCESS) {
        clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, sizeof message, message, NULL);
        tu_expect(0, "clBuildProgram: %d\n%s", (int)err, message);
        goto done;
    }
    ECHO_PLAIN(score, CLATTN_SCORE_PARAMS);
    ECHO_SCORED(flash, CLATTN_FLASH_PARAMS);
    ECHO_SCORED(softmax, CLATTN_SOFTMAX_PARAMS);
    ECHO_PLAIN(matmul, CLATTN_MATMUL_PARAMS);
    ECHO_PLAIN(rope, CLATTN_ROPE_PARAMS);
    ECHO_PLAIN(posenc, CLATTN_POSENC_PARAMS);
    ECHO_PLAIN(additive, CLATTN_ADDITIVE_PARAMS);
    ECHO_PLAIN(merge, CLATTN_MERGE_PARAMS);
    ECHO_PLAIN(append, CLATTN_APPEND_PARAMS);
    ECHO_PLAIN(commit, CLATTN_COMMIT_PARAMS);
    ECHO_PLAIN(merge_states, CLATTN_MERGE_STATES_PARAMS);
done:
    if (program)
        clReleaseProgram(program);
    free(header);
    clattn_ctx_release(ctx);
    TU_END_TEST();
}
END_TEST

START_TEST(test_kernel_dir_failures)
{
    TU_BEGIN_TEST();
    char dir[] = "/tmp/clattn-kernels-XXXXXX", path[600], message[4096];
    clattn_status status;
    tu_make_temp_dir(dir);

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

    tu_set_case("a folder with the prelude but no matmul.cl");
    if (tu_expect(kernel_folder(dir, "nosource", "other.cl", "/* unused */\n", path, sizeof path),
                  "cannot write %s", path)) {
        status = op_with_kernel_dir(path, DIR_MATMUL, message, sizeof message);
        tu_expect(status == CLATTN_ERR_BUILD && strstr(message, "cannot read matmul.cl"),
                  "got %s '%s'", clattn_status_string(status), message);
    }

    tu_set_case("a folder with common.cl alone (no types.cl, score.cl)");
    snprintf(path, sizeof path, "%s/noprelude", dir);
    if (tu_expect(mkdir(path, 0700) == 0 && write_text(path, "common.cl", "/* empty */\n"),
                  "cannot write %s", path)) {
        status = op_with_kernel_dir(path, DIR_MATMUL, message, sizeof message);
        tu_expect(status == CLATTN_ERR_BUILD && strstr(message, "cannot read types.cl"),
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
                                "__kernel void pack_b(void) { }\n",
                                path, sizeof path),
                  "cannot write %s", path)) {
        status = op_with_kernel_dir(path, DIR_MATMUL, message, sizeof message);
        tu_expect(status == (clattn_status)CL_INVALID_ARG_INDEX &&
                      tu_starts_with(message, "matmul: clSetKernelArg(") &&
                      strstr(message, ", 0): CL_INVALID_ARG_INDEX"),
                  "got %s '%s'", clattn_status_string(status), message);
    }

    /* The fused kernel's source is flash.cl, flash_cpu.cl (CPU rows) or flash_gpu.cl (GPU
     * rows): the same text goes into all three. */
    static const char *const no_flash = "__kernel void other(__global float *x) { x[0] = 1.0f; }\n";
    tu_set_case("flash.cl without the kernel");
    if (tu_expect(kernel_folder(dir, "noflash", "flash.cl", no_flash, path, sizeof path) &&
                      write_text(path, "flash_cpu.cl", no_flash) &&
                      write_text(path, "flash_gpu.cl", no_flash),
                  "cannot write %s", path)) {
        status = op_with_kernel_dir(path, DIR_FLASH, message, sizeof message);
        tu_expect(status == (clattn_status)CL_INVALID_KERNEL_NAME &&
                      tu_starts_with(message, "sdpa: ") &&
                      (strstr(message, "clCreateKernel(flash_attention)") != NULL ||
                       strstr(message, "clCreateKernel(flash_cpu)") != NULL),
                  "got %s '%s'", clattn_status_string(status), message);
    }

    tu_set_case("flash.cl with a build log longer than the message");
    char broken[8192];
    size_t used = 0;
    for (int i = 0; i < 100 && used < sizeof broken - 128; ++i) {
        used += (size_t)snprintf(broken + used, sizeof broken - used,
                                 "__kernel void k%d(__global float *x) { x[0] = undeclared_%d; }\n",
                                 i, i);
    }
    if (tu_expect(kernel_folder(dir, "longlog", "flash.cl", broken, path, sizeof path) &&
                      write_text(path, "flash_cpu.cl", broken) &&
                      write_text(path, "flash_gpu.cl", broken),
                  "cannot write %s", path)) {
        status = op_with_kernel_dir(path, DIR_FLASH, message, sizeof message);
        const size_t length = strlen(message);
        tu_expect(status == CLATTN_ERR_BUILD &&
                      (tu_starts_with(message, "sdpa: clBuildProgram(flash.cl") ||
                       tu_starts_with(message, "sdpa: clBuildProgram(flash_cpu.cl") ||
                       tu_starts_with(message, "sdpa: clBuildProgram(flash_gpu.cl")) &&
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
            if (p == 3) { /* an unknown CLATTN_PARAMS is refused, naming it, not ignored */
                tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT && ctx == NULL &&
                              strstr(message, "CLATTN_PARAMS='fpga': expected gpu or cpu"),
                          "CLATTN_PARAMS=fpga: %s: %s", clattn_status_string(status), message);
            } else if (tu_expect(status == CLATTN_SUCCESS, "create: %s: %s",
                                 clattn_status_string(status), message)) {
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
    TCase *queues = tu_tcase(suite, "queues", 600);
    /* Out-of-order cases (loop index 1, or odd indices) are registered only where the device
     * has out-of-order queues: a test that did not run its path must not report "passed". */
    const int ooo = device_supports_out_of_order(clattn_ctx_device(tu_ctx()));
    if (!ooo)
        printf("check_runtime: NOT RUN: the device has no out-of-order queues; the out-of-order "
               "cases of 6 tests are not registered\n");
    if (tu_small())
        tu_not_run("the queue tests' problems at full size (sequences cut about 3x: minutes on "
                   "Oclgrind; every call, event and ordering still runs)");
    tcase_add_loop_test(queues, test_in_order_queue, 0, 2);
    if (ooo)
        tcase_add_loop_test(queues, test_out_of_order_queue, 0, 2);
    tcase_add_loop_test(queues, test_event_chain, 0, ooo ? 2 : 1);
    tcase_add_loop_test(queues, test_mha_on_own_queue, 0, ooo ? 2 : 1);
    for (int i = 0; i < 4; i += ooo ? 4 : 2) /* _i % 2: out-of-order; _i < 2: growing sizes */
        tcase_add_loop_test(queues, test_independent_calls, i, ooo ? 4 : i + 1);
    if (ooo)
        tcase_add_loop_test(queues, test_workspace_ordering, 0, 2);
    tcase_add_loop_test(queues, test_second_queue, 0, ooo ? 2 : 1);
    tcase_add_test(queues, test_workspace_growth);
    tcase_add_test(queues, test_plan_lifetimes);
    /* In "queues", the case the Oclgrind lane runs: the layout is checked on all three. */
    tcase_add_test(queues, test_params_layout);

    TCase *contexts = tu_tcase(suite, "contexts", 600);
    tcase_add_test(contexts, test_accessors_and_two_contexts);
    tcase_add_test(contexts, test_kernel_trace);
    tcase_add_test(contexts, test_own_context_lifecycle);
    tcase_add_test(contexts, test_contexts_on_threads);
    tcase_add_test(contexts, test_build_failure_reports_log);
    tcase_add_test(contexts, test_device_specs);
    tcase_add_test(contexts, test_kernel_dir_failures);
    tcase_add_test(contexts, test_params_overrides);
    return suite;
}

int main(void)
{
    return tu_main("check_runtime", runtime_suite);
}
