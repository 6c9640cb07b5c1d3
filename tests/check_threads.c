/*
 * check_threads: the thread-safety contract of clattn.h and run-to-run determinism.
 *
 * Concurrency. Four threads run the same ten awkward MHA forwards (fused and unfused paths,
 * all need_weights modes, masks, Lq != Lk, head sizes 4, 7, 8, 16), each starting at a
 * different job so that different shapes run at the same time:
 *   - each thread with its own context from clattn_ctx_create (made concurrently), host API;
 *   - each thread with its own context from clattn_ctx_create_from_queue on a queue it made from
 *     ONE cl_context the test shares (in-order and, where the device has them, out-of-order
 *     queues; two threads release their queue right after creating the context, which retains
 *     it): half the jobs through the host API, the other half (fused and unfused) through MHA
 *     plans that each thread creates on its own context and executes on input buffers all
 *     threads share (made once in the shared cl_context) and output buffers of its own;
 *   - all threads on ONE context, each call serialised by a mutex (the contract's "serialise
 *     calls on a shared context yourself"), host API.
 * Every output is checked against the float64 reference, and the four threads' outputs of a job
 * must be bit-identical. check's assertions are not thread-safe: workers only record statuses
 * and outputs in their own struct, and the main thread checks them after pthread_join. Workers
 * call nothing of testutil, and of problems.h only pb_mha_desc, which reads the problem (their
 * generator and failure collector are process-global): all problems are drawn
 * (tests/problems.h) and all memory is allocated before the threads start.
 *
 * Determinism. Attention (fused and unfused), MHA forward (fused, unfused, with weights) and
 * matmul run three times on the suite's context and once on a fresh one; every output must be
 * bit-identical (memcmp). Between the second and the third run a larger, different forward runs
 * on the same context, so the third run finds the workspace grown and other kernels cached.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problems.h"
#include "reference.h"
#include "testutil.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

#define THREAD_COUNT 4
#define MAX_JOBS 16

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

/* --- MHA jobs: one shape with its inputs and float64 reference ------------------------------ */

typedef struct mha_shape {
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
} mha_shape;

/* Ten awkward shapes: seq 1..129 with Lq != Lk, E not a power of two, head sizes 4..16
 * (odd ones too), batch entry 2 fully padded where batch is 3, -inf in the float masks.
 * NONE + AUTO runs the fused kernel; PER_HEAD, AVERAGED or UNFUSED the unfused path. */
/* clang-format off */
static const mha_shape thread_shapes[] = {
    {1, 1, 1, 8, 2, 0, 0, TORCH, 1, 1, 1, 1, NONE, AUTO, 0, 0, 0, SOFTMAX},
    {2, 13, 13, 24, 3, 0, 0, TORCH, 1, 1, 1, 1, PER_HEAD, AUTO, 1, 0, 0, SOFTMAX},
    {3, 7, 33, 40, 5, 17, 9, TORCH, 0, 0, 1, 1, NONE, AUTO, 0, 0, 1, SOFTMAX},
    {2, 65, 31, 32, 4, 0, 0, TORCH, 1, 0, 0, 1, AVERAGED, AUTO, 0, 1, 0, SOFTMAX},
    {1, 129, 129, 64, 8, 0, 0, TORCH, 1, 1, 1, 1, NONE, FUSED, 1, 0, 1, SOFTMAX},
    {2, 33, 5, 21, 3, 11, 13, XW, 0, 0, 1, 1, NONE, UNFUSED, 0, 1, 0, SOFTMAX},
    {3, 17, 17, 28, 7, 0, 0, XW, 0, 1, 0, 1, NONE, FUSED, 1, 0, 1, SOFTMAX},
    {1, 50, 129, 16, 1, 0, 0, TORCH, 1, 0, 1, 1, PER_HEAD, AUTO, 0, 0, 1, RELU},
    {2, 9, 9, 56, 8, 0, 0, TORCH, 0, 1, 1, 0, NONE, AUTO, 1, 1, 0, SOFTMAX},
    {3, 3, 64, 48, 6, 0, 0, TORCH, 1, 0, 1, 1, AVERAGED, UNFUSED, 1, 0, 1, SOFTMAX},
};
/* clang-format on */

/* Runs between the second and third determinism run: grows the workspace past every other
 * shape here and builds other kernel variants. */
/* clang-format off */
static const mha_shape perturbing_shape =
    {3, 97, 129, 64, 4, 0, 0, TORCH, 1, 0, 1, 1, PER_HEAD, AUTO, 0, 1, 1, SOFTMAX};
/* clang-format on */

/* Draws the shape's problem (main thread only: the generator is global) and its reference. */
static void make_job(const mha_shape *shape, pb_mha_problem *job)
{
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
    pb_mha_make(job, &spec);
}

/* Safe from any thread on a context that thread may use: touches only ctx and the job. */
static clattn_status run_job(clattn_ctx *ctx, const pb_mha_problem *job, float *out, float *attn)
{
    return clattn_mha_forward_host(ctx, &job->desc, &job->weights, job->query, job->key, job->value,
                                   &job->masks, out, job->attn_count ? attn : NULL);
}

/* Safe from any thread: an MHA plan on ctx, executed on `bound` (inputs shared with other
 * threads, outputs this thread's own), waited for. */
static clattn_status run_job_plan(clattn_ctx *ctx, const pb_mha_problem *job,
                                  const clattn_tensors *bound)
{
    clattn_mha_desc desc;
    pb_mha_desc(job, &desc);
    clattn_plan *plan = NULL;
    clattn_status status = clattn_mha_plan_create(ctx, &desc, &plan);
    cl_event done = NULL;
    if (status == CLATTN_SUCCESS) {
        status = clattn_plan_execute(plan, bound->by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL,
                                     &done);
    }
    if (status == CLATTN_SUCCESS) {
        status = (clattn_status)clWaitForEvents(1, &done);
    }
    if (done != NULL) {
        clReleaseEvent(done);
    }
    clattn_plan_release(plan);
    return status;
}

/* Main thread: output (and weights) against the reference. */
static void expect_job_close(const pb_mha_problem *job, const float *out, const float *attn)
{
    pb_mha_check_host(job, out, job->attn_count ? attn : NULL);
}

/* Records a failure unless got and want hold the same bits. */
static int expect_identical(const char *what, const float *got, const float *want, size_t count)
{
    if (memcmp(got, want, count * sizeof(float)) == 0) {
        return 1;
    }
    size_t first = count, differing = 0;
    for (size_t i = 0; i < count; ++i) {
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            first = first < count ? first : i;
            ++differing;
        }
    }
    return tu_expect(0, "%s: %zu of %zu floats differ in their bits; first at [%zu]: %.9g vs %.9g",
                     what, differing, count, first, (double)got[first], (double)want[first]);
}

/* --- worker threads ------------------------------------------------------------------------ */

/* Holds the workers until all have made their contexts, so their forwards overlap. Unlike a
 * pthread barrier it cannot deadlock when a thread fails to start: the main thread opens it. */
typedef struct start_gate {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int open;
} start_gate;

static void gate_wait(start_gate *gate)
{
    pthread_mutex_lock(&gate->lock);
    while (!gate->open) {
        pthread_cond_wait(&gate->cond, &gate->lock);
    }
    pthread_mutex_unlock(&gate->lock);
}

static void gate_open(start_gate *gate)
{
    pthread_mutex_lock(&gate->lock);
    gate->open = 1;
    pthread_cond_broadcast(&gate->cond);
    pthread_mutex_unlock(&gate->lock);
}

typedef enum context_source {
    OWN_CONTEXT,       /* clattn_ctx_create(NULL) in the thread */
    SHARED_CL_CONTEXT, /* clattn_ctx_create_from_queue on a queue of the shared cl_context */
    SHARED_LOCKED      /* one clattn_ctx for all, every call under a mutex */
} context_source;

typedef struct worker {
    int index;
    context_source source;
    const pb_mha_problem *jobs;
    int job_count;
    start_gate *gate;

    /* SHARED_CL_CONTEXT */
    cl_context cl_context;
    cl_device_id device;
    cl_command_queue_properties queue_properties;
    int release_queue_early; /* the clattn context retains the queue; drop ours at once */
    /* Jobs run through a plan (NULL bound: through the host API): the shared inputs and this
     * worker's outputs, in the shared cl_context. */
    const clattn_tensors *bound[MAX_JOBS];

    /* SHARED_LOCKED */
    clattn_ctx *shared_ctx;
    pthread_mutex_t *shared_lock;

    /* Results, read by the main thread after pthread_join. Buffers are allocated (and poisoned
     * with NaN) by the main thread; indexed by job, not by the order of the runs. */
    float *out[MAX_JOBS], *attn[MAX_JOBS];
    clattn_status status[MAX_JOBS];
    int ran[MAX_JOBS];
    int setup_ok;
    int context_matches; /* SHARED_CL_CONTEXT: the clattn context uses the shared cl_context */
    char setup_message[1024];
    char first_error[512];
} worker;

static const char *source_name(context_source source)
{
    return source == OWN_CONTEXT         ? "own context"
           : source == SHARED_CL_CONTEXT ? "context from a queue of the shared cl_context"
                                         : "shared context under a mutex";
}

static int open_worker_context(worker *w, clattn_ctx **ctx, cl_command_queue *queue)
{
    char message[512] = "";
    clattn_status status = CLATTN_SUCCESS;
    if (w->source == SHARED_LOCKED) {
        *ctx = w->shared_ctx;
        return 1;
    }
    if (w->source == OWN_CONTEXT) {
        status = clattn_ctx_create(NULL, ctx, message, sizeof message);
    } else {
        cl_int err = CL_SUCCESS;
        *queue = clCreateCommandQueue(w->cl_context, w->device, w->queue_properties, &err);
        if (err != CL_SUCCESS || *queue == NULL) {
            snprintf(w->setup_message, sizeof w->setup_message, "clCreateCommandQueue: %s (%d)",
                     clattn_status_string((clattn_status)err), (int)err);
            *queue = NULL;
            return 0;
        }
        status = clattn_ctx_create_from_queue(*queue, ctx, message, sizeof message);
        if (w->release_queue_early) {
            clReleaseCommandQueue(*queue);
            *queue = NULL;
        }
        w->context_matches = *ctx != NULL && clattn_ctx_cl_context(*ctx) == w->cl_context;
    }
    if (status != CLATTN_SUCCESS || *ctx == NULL) {
        snprintf(w->setup_message, sizeof w->setup_message, "context creation: %s (%d): %s",
                 clattn_status_string(status), (int)status, message);
        return 0;
    }
    return 1;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    clattn_ctx *ctx = NULL;
    cl_command_queue queue = NULL;
    w->setup_ok = open_worker_context(w, &ctx, &queue);
    gate_wait(w->gate);
    for (int run = 0; w->setup_ok && run < w->job_count; ++run) {
        /* Each thread starts elsewhere in the table: different shapes run at the same time. */
        const int j = (run + w->index * w->job_count / THREAD_COUNT) % w->job_count;
        if (w->shared_lock != NULL) {
            pthread_mutex_lock(w->shared_lock);
        }
        w->status[j] = w->bound[j] != NULL ? run_job_plan(ctx, &w->jobs[j], w->bound[j])
                                           : run_job(ctx, &w->jobs[j], w->out[j], w->attn[j]);
        w->ran[j] = 1;
        if (w->status[j] != CLATTN_SUCCESS && w->first_error[0] == '\0') {
            snprintf(w->first_error, sizeof w->first_error, "%s", clattn_last_error(ctx));
        }
        if (w->shared_lock != NULL) {
            pthread_mutex_unlock(w->shared_lock);
        }
    }
    if (w->source != SHARED_LOCKED) {
        clattn_ctx_release(ctx);
    }
    if (queue != NULL) {
        clReleaseCommandQueue(queue);
    }
    return NULL;
}

typedef struct thread_setup {
    context_source source;
    cl_context cl_context; /* SHARED_CL_CONTEXT */
    cl_device_id device;
    cl_command_queue_properties out_of_order; /* 0 when the device has no out-of-order queues */
    clattn_ctx *shared_ctx;                   /* SHARED_LOCKED */
    /* SHARED_CL_CONTEXT: a clattn context on the shared cl_context through which the main
     * thread makes and reads the plan jobs' buffers. */
    clattn_ctx *buffer_ctx;
} thread_setup;

/* Plan jobs (SHARED_CL_CONTEXT): half of them, fused and unfused (jobs 0, 1, 4, 5, 8, 9). */
static int is_plan_job(const thread_setup *setup, int job)
{
    return setup->source == SHARED_CL_CONTEXT && job % 4 < 2;
}

/* Main thread, before the threads start: the plan jobs' inputs, uploaded once, and each
 * worker's own poisoned outputs. */
static int upload_plan_jobs(const thread_setup *setup, const pb_mha_problem *jobs, int job_count,
                            clattn_tensors *inputs,
                            clattn_tensors (*outputs)[COUNT_OF(thread_shapes)])
{
    for (int j = 0; j < job_count; ++j) {
        if (!is_plan_job(setup, j)) {
            continue;
        }
        if (pb_mha_upload(setup->buffer_ctx, &jobs[j], &inputs[j]) != CL_SUCCESS) {
            return 0;
        }
        for (int t = 0; t < THREAD_COUNT; ++t) {
            clattn_tensors *own = &outputs[t][j];
            *own = inputs[j];
            own->out = jobs[j].layouts.out;
            own->weights = jobs[j].layouts.weights;
            if (pb_upload(setup->buffer_ctx, &own->out, 1 + (size_t)t, NULL) != CL_SUCCESS ||
                (own->weights.rank != 0 &&
                 pb_upload(setup->buffer_ctx, &own->weights, 2, NULL) != CL_SUCCESS)) {
                return 0;
            }
        }
    }
    return 1;
}

/* Main thread, after the threads: reads a worker's plan outputs, expecting no stray write. */
static void download_plan_job(clattn_ctx *buffer_ctx, const clattn_tensors *own,
                              const pb_mha_problem *job, float *out, float *attn)
{
    size_t stray = 0;
    if (pb_download(buffer_ctx, NULL, &own->out, out, &stray) == CL_SUCCESS) {
        tu_expect(stray == 0, "out: %zu stray writes", stray);
    }
    if (job->attn_count &&
        pb_download(buffer_ctx, NULL, &own->weights, attn, &stray) == CL_SUCCESS) {
        tu_expect(stray == 0, "attn_weights: %zu stray writes", stray);
    }
}

/* Releases the plan jobs' buffers (inputs once; each worker's outputs). */
static void release_plan_jobs(clattn_tensors *inputs,
                              clattn_tensors (*outputs)[COUNT_OF(thread_shapes)], int job_count)
{
    for (int j = 0; j < job_count; ++j) {
        for (int t = 0; t < THREAD_COUNT; ++t) {
            clattn_tensors own;
            memset(&own, 0, sizeof own);
            own.out = outputs[t][j].out;
            own.weights = outputs[t][j].weights;
            pb_release_tensors(&own);
        }
        pb_release_tensors(&inputs[j]);
    }
}

/* Runs every job of the table on THREAD_COUNT threads and checks all results. */
static void run_threads(const thread_setup *setup)
{
    const int job_count = COUNT_OF(thread_shapes);
    pb_mha_problem jobs[COUNT_OF(thread_shapes)];
    for (int j = 0; j < job_count; ++j) {
        make_job(&thread_shapes[j], &jobs[j]);
    }
    static clattn_tensors inputs[COUNT_OF(thread_shapes)];
    static clattn_tensors outputs[THREAD_COUNT][COUNT_OF(thread_shapes)];
    memset(inputs, 0, sizeof inputs);
    memset(outputs, 0, sizeof outputs);
    const int uploaded = upload_plan_jobs(setup, jobs, job_count, inputs, outputs);
    tu_expect(uploaded, "uploading the plan jobs' buffers failed");

    start_gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
    worker workers[THREAD_COUNT];
    pthread_t threads[THREAD_COUNT];
    int started[THREAD_COUNT] = {0};
    memset(workers, 0, sizeof workers);
    for (int t = 0; t < THREAD_COUNT && uploaded; ++t) {
        worker *w = &workers[t];
        w->index = t;
        w->source = setup->source;
        w->jobs = jobs;
        w->job_count = job_count;
        w->gate = &gate;
        w->cl_context = setup->cl_context;
        w->device = setup->device;
        w->queue_properties = t % 2 ? setup->out_of_order : 0;
        w->release_queue_early = t >= 2;
        w->shared_ctx = setup->shared_ctx;
        w->shared_lock = setup->source == SHARED_LOCKED ? &shared_lock : NULL;
        for (int j = 0; j < job_count; ++j) {
            w->out[j] = tu_nan_floats(jobs[j].out_count);
            w->attn[j] = jobs[j].attn_count ? tu_nan_floats(jobs[j].attn_count) : NULL;
            w->bound[j] = is_plan_job(setup, j) ? &outputs[t][j] : NULL;
        }
    }
    for (int t = 0; t < THREAD_COUNT && uploaded; ++t) {
        started[t] = pthread_create(&threads[t], NULL, worker_main, &workers[t]) == 0;
    }
    gate_open(&gate);
    for (int t = 0; t < THREAD_COUNT; ++t) {
        if (started[t]) {
            pthread_join(threads[t], NULL);
        }
    }

    /* All threads have finished: check from here only. */
    for (int t = 0; t < THREAD_COUNT && uploaded; ++t) {
        worker *w = &workers[t];
        tu_set_case("%s, thread %d%s", source_name(setup->source), t,
                    w->queue_properties ? " (out-of-order queue)" : "");
        if (!tu_expect(started[t], "pthread_create failed") ||
            !tu_expect(w->setup_ok, "thread setup failed: %s", w->setup_message)) {
            continue;
        }
        if (setup->source == SHARED_CL_CONTEXT) {
            tu_expect(w->context_matches, "clattn_ctx_cl_context is not the shared cl_context");
        }
        for (int j = 0; j < job_count; ++j) {
            const int plan = is_plan_job(setup, j);
            tu_set_case("%s, thread %d%s, job %d through %s: %s", source_name(setup->source), t,
                        w->queue_properties ? " (out-of-order queue)" : "", j,
                        plan ? "a plan" : "the host API", jobs[j].label);
            if (!tu_expect(w->ran[j], "job did not run") ||
                !tu_expect(w->status[j] == CLATTN_SUCCESS, "%s returned %s (%d); first error: '%s'",
                           plan ? "the plan" : "clattn_mha_forward_host",
                           clattn_status_string(w->status[j]), (int)w->status[j], w->first_error)) {
                continue;
            }
            if (plan) {
                download_plan_job(setup->buffer_ctx, &outputs[t][j], &jobs[j], w->out[j],
                                  w->attn[j]);
            }
            expect_job_close(&jobs[j], w->out[j], w->attn[j]);
            const worker *first = &workers[0];
            if (t > 0 && first->setup_ok && first->ran[j] && first->status[j] == CLATTN_SUCCESS) {
                expect_identical("out vs thread 0", w->out[j], first->out[j], jobs[j].out_count);
                if (jobs[j].attn_count) {
                    expect_identical("attn_weights vs thread 0", w->attn[j], first->attn[j],
                                     jobs[j].attn_count);
                }
            }
        }
    }

    for (int t = 0; t < THREAD_COUNT; ++t) {
        for (int j = 0; j < job_count; ++j) {
            free(workers[t].attn[j]);
            free(workers[t].out[j]);
        }
    }
    release_plan_jobs(inputs, outputs, job_count);
    for (int j = 0; j < job_count; ++j) {
        pb_mha_free(&jobs[j]);
    }
}

START_TEST(test_threads_own_contexts)
{
    TU_BEGIN_TEST();
    thread_setup setup = {.source = OWN_CONTEXT};
    run_threads(&setup);
    TU_END_TEST();
}
END_TEST

START_TEST(test_threads_contexts_from_shared_cl_context)
{
    TU_BEGIN_TEST();
    tu_set_case("shared cl_context setup");
    cl_device_id device = clattn_ctx_device(tu_ctx());
    cl_platform_id platform = NULL;
    cl_command_queue_properties queue_properties = 0;
    cl_int err = clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL);
    if (err == CL_SUCCESS) {
        err = clGetDeviceInfo(device, CL_DEVICE_QUEUE_PROPERTIES, sizeof queue_properties,
                              &queue_properties, NULL);
    }
    cl_context shared = NULL;
    if (tu_expect(err == CL_SUCCESS, "clGetDeviceInfo failed (%d)", (int)err)) {
        cl_context_properties properties[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)platform,
                                              0};
        shared = clCreateContext(properties, 1, &device, NULL, NULL, &err);
        tu_expect(err == CL_SUCCESS && shared != NULL, "clCreateContext failed (%d)", (int)err);
    }
    /* The main thread's own clattn context on the shared cl_context, for the plan jobs'
     * buffers. */
    cl_command_queue buffer_queue = NULL;
    clattn_ctx *buffer_ctx = NULL;
    if (shared != NULL) {
        buffer_queue = clCreateCommandQueue(shared, device, 0, &err);
        char message[512] = "";
        if (tu_expect(err == CL_SUCCESS, "clCreateCommandQueue failed (%d)", (int)err)) {
            clattn_status status =
                clattn_ctx_create_from_queue(buffer_queue, &buffer_ctx, message, sizeof message);
            tu_expect(status == CLATTN_SUCCESS, "clattn_ctx_create_from_queue: %s: %s",
                      clattn_status_string(status), message);
        }
    }
    if (buffer_ctx != NULL) {
        thread_setup setup = {
            .source = SHARED_CL_CONTEXT,
            .cl_context = shared,
            .device = device,
            .out_of_order = queue_properties & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE,
            .buffer_ctx = buffer_ctx,
        };
        run_threads(&setup);
    }
    clattn_ctx_release(buffer_ctx);
    if (buffer_queue != NULL) {
        clReleaseCommandQueue(buffer_queue);
    }
    if (shared != NULL) {
        clReleaseContext(shared);
    }
    TU_END_TEST();
}
END_TEST

/* Not concurrency on one context (the contract forbids it) but the documented alternative:
 * the caller serialises the calls, and the context gives correct results to every thread. */
START_TEST(test_threads_shared_context_serialised)
{
    TU_BEGIN_TEST();
    tu_set_case("shared context setup");
    clattn_ctx *shared = NULL;
    char message[512] = "";
    clattn_status status = clattn_ctx_create(NULL, &shared, message, sizeof message);
    if (tu_expect(status == CLATTN_SUCCESS && shared != NULL, "clattn_ctx_create: %s: %s",
                  clattn_status_string(status), message)) {
        thread_setup setup = {.source = SHARED_LOCKED, .shared_ctx = shared};
        run_threads(&setup);
    }
    clattn_ctx_release(shared);
    TU_END_TEST();
}
END_TEST

/* --- determinism --------------------------------------------------------------------------- */

#define DETERMINISM_RUNS 4 /* runs 1..3 on the suite's context, run 4 on a fresh one */

static const char *const run_names[DETERMINISM_RUNS] = {
    "run 1", "run 2", "run 3 (same context, after a larger forward)", "run 4 (fresh context)"};

static clattn_ctx *fresh_context(void)
{
    clattn_ctx *ctx = NULL;
    char message[512] = "";
    clattn_status status = clattn_ctx_create(NULL, &ctx, message, sizeof message);
    tu_expect(status == CLATTN_SUCCESS && ctx != NULL, "clattn_ctx_create: %s: %s",
              clattn_status_string(status), message);
    return ctx;
}

/* The context of run `run`, and before run 3 the perturbing forward on the suite's context. */
static clattn_ctx *context_for_run(int run, clattn_ctx *fresh)
{
    if (run == 2) {
        pb_mha_problem job;
        make_job(&perturbing_shape, &job);
        float *out = tu_nan_floats(job.out_count), *attn = tu_nan_floats(job.attn_count);
        tu_expect_status(run_job(tu_ctx(), &job, out, attn), CLATTN_SUCCESS,
                         "clattn_mha_forward_host (perturbing forward)");
        free(attn);
        free(out);
        pb_mha_free(&job);
    }
    return run < 3 ? tu_ctx() : fresh;
}

static void expect_runs_identical(const char *what, float *const runs[DETERMINISM_RUNS],
                                  const int ok[DETERMINISM_RUNS], size_t count)
{
    for (int run = 1; run < DETERMINISM_RUNS; ++run) {
        if (ok[0] && ok[run]) {
            char label[128];
            snprintf(label, sizeof label, "%s: %s vs run 1", what, run_names[run]);
            expect_identical(label, runs[run], runs[0], count);
        }
    }
}

static void expect_run_ok(clattn_ctx *ctx, clattn_status status, int run, const char *call, int *ok)
{
    *ok = tu_expect(status == CLATTN_SUCCESS, "%s, %s: %s (%d): '%s'", call, run_names[run],
                    clattn_status_string(status), (int)status, clattn_last_error(ctx));
}

/* MHA forward: fused (NONE, AUTO), unfused without weights, unfused with per-head weights. */
static const struct {
    clattn_need_weights need_weights;
    clattn_path path;
} mha_determinism_modes[] = {{NONE, AUTO}, {NONE, UNFUSED}, {PER_HEAD, AUTO}, {AVERAGED, AUTO}};

START_TEST(test_determinism_mha)
{
    TU_BEGIN_TEST();
    mha_shape shape = {2, 37, 70, 48, 4, 0, 0, TORCH, 1, 0, 1, 1, NONE, AUTO, 1, 1, 1, SOFTMAX};
    shape.need_weights = mha_determinism_modes[_i].need_weights;
    shape.path = mha_determinism_modes[_i].path;
    pb_mha_problem job;
    make_job(&shape, &job);
    tu_set_case("%s", job.label);
    clattn_ctx *fresh = fresh_context();
    float *out[DETERMINISM_RUNS], *attn[DETERMINISM_RUNS];
    int ok[DETERMINISM_RUNS] = {0};
    for (int run = 0; run < DETERMINISM_RUNS; ++run) {
        out[run] = tu_nan_floats(job.out_count);
        attn[run] = tu_nan_floats(job.attn_count);
        clattn_ctx *ctx = context_for_run(run, fresh);
        if (ctx != NULL) {
            expect_run_ok(ctx, run_job(ctx, &job, out[run], attn[run]), run,
                          "clattn_mha_forward_host", &ok[run]);
        }
    }
    if (ok[0]) {
        expect_job_close(&job, out[0], attn[0]);
    }
    expect_runs_identical("out", out, ok, job.out_count);
    if (job.attn_count) {
        expect_runs_identical("attn_weights", attn, ok, job.attn_count);
    }
    for (int run = 0; run < DETERMINISM_RUNS; ++run) {
        free(attn[run]);
        free(out[run]);
    }
    clattn_ctx_release(fresh);
    pb_mha_free(&job);
    TU_END_TEST();
}
END_TEST

/* Attention (host API) on the fused and the unfused path (the unfused one also returns the
 * weights), causal with a float mask and key padding. */
START_TEST(test_determinism_attention)
{
    TU_BEGIN_TEST();
    const clattn_path path = _i == 0 ? FUSED : UNFUSED;
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = 2, spec.heads = 3, spec.seq_q = 37, spec.seq_k = 70;
    spec.dk = 24, spec.dv = 20;
    spec.causal = CLATTN_CAUSAL_TOP_LEFT;
    spec.path = path;
    spec.mask = PB_MASK_FLOAT; /* (Lq, Lk), as the host API takes it */
    spec.padding = 1;
    spec.want_weights = path == UNFUSED;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("attention host: %s", p.label);
    clattn_attention_host_desc desc;
    clattn_attention_host_desc_init(&desc);
    desc.batch = spec.batch, desc.heads = spec.heads, desc.seq_q = spec.seq_q;
    desc.seq_k = spec.seq_k, desc.head_dim_qk = spec.dk, desc.head_dim_v = spec.dv;
    desc.causal = spec.causal;
    desc.path = path;
    const clattn_host_masks masks = {p.mask, p.padding, NULL};

    clattn_ctx *fresh = fresh_context();
    float *out[DETERMINISM_RUNS], *weights[DETERMINISM_RUNS];
    int ok[DETERMINISM_RUNS] = {0};
    for (int run = 0; run < DETERMINISM_RUNS; ++run) {
        out[run] = tu_nan_floats(p.out_count);
        weights[run] = tu_nan_floats(p.weights_count);
        clattn_ctx *ctx = context_for_run(run, fresh);
        if (ctx != NULL) {
            clattn_status status = clattn_attention_host(
                ctx, &desc, p.q, p.k, p.v, &masks, out[run], path == UNFUSED ? weights[run] : NULL);
            expect_run_ok(ctx, status, run, "clattn_attention_host", &ok[run]);
        }
    }
    if (ok[0]) {
        tu_expect_close("out", out[0], p.out_ref, p.out_count, TU_TOL);
        if (path == UNFUSED) {
            tu_expect_close("weights", weights[0], p.weights_ref, p.weights_count, TU_TOL);
        }
    }
    expect_runs_identical("out", out, ok, p.out_count);
    if (path == UNFUSED) {
        expect_runs_identical("weights", weights, ok, p.weights_count);
    }
    for (int run = 0; run < DETERMINISM_RUNS; ++run) {
        free(weights[run]);
        free(out[run]);
    }
    clattn_ctx_release(fresh);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* Matmul on device buffers made in each run's own context: A, B and C with batch strides and
 * row strides (ld) of their own, as stored (op(A) = A, or Aᵀ when trans_a). */
typedef struct matmul_case {
    size_t batch, m, n, k;
    int trans_a, trans_b;
    size_t lda, ldb, ldc;                /* 0: packed rows */
    size_t stride_a, stride_b, stride_c; /* 0: packed matrices */
    float alpha, beta;
    int bias;
} matmul_case;

/* clang-format off */
static const matmul_case matmul_cases[] = {
    /* batch m n k trans_a trans_b lda ldb ldc stride_a stride_b stride_c alpha beta bias */
    {1, 256, 320, 384, 0, 0, 0, 0, 0, 0, 0, 0, 1.0f, 0.0f, 0},
    {3, 67, 45, 131, 0, 1, 0, 0, 0, 67 * 131, 45 * 131, 67 * 45, 0.7f, 0.5f, 1},
    {2, 33, 129, 70, 1, 0, 40, 131, 130, 2801, 9170, 4293, -1.25f, 0.0f, 1},
};
/* clang-format on */

/* A (batch, rows, cols) layout with row stride ld and batch stride `stride` (0: packed). */
static clattn_tensor matrix_layout(size_t batch, size_t rows, size_t cols, size_t ld, size_t stride)
{
    clattn_tensor t = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, batch, rows, cols, 0);
    t.strides[2] = 1;
    t.strides[1] = ld ? ld : cols;
    t.strides[0] = stride ? stride : rows * t.strides[1];
    return t;
}

typedef struct matmul_operands {
    clattn_tensor a, b, bias, c;
} matmul_operands;

static matmul_operands matmul_layouts(const matmul_case *mc)
{
    matmul_operands t;
    t.a = matrix_layout(mc->batch, mc->trans_a ? mc->k : mc->m, mc->trans_a ? mc->m : mc->k,
                        mc->lda, mc->stride_a);
    t.b = matrix_layout(mc->batch, mc->trans_b ? mc->n : mc->k, mc->trans_b ? mc->k : mc->n,
                        mc->ldb, mc->stride_b);
    t.c = matrix_layout(mc->batch, mc->m, mc->n, mc->ldc, mc->stride_c);
    t.bias = mc->bias ? clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, mc->n, 0, 0, 0)
                      : clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 0, 0, 0, 0, 0);
    return t;
}

/* One run on ctx: uploads (buffers of ctx's cl_context), clattn_matmul, reads C back. */
static clattn_status run_matmul(clattn_ctx *ctx, const matmul_case *mc, const float *a,
                                const float *b, const float *bias, const float *c_before,
                                float *c_out)
{
    matmul_operands t = matmul_layouts(mc);
    clattn_status status = (clattn_status)pb_upload(ctx, &t.a, 1, a);
    if (status == CLATTN_SUCCESS) {
        status = (clattn_status)pb_upload(ctx, &t.b, 2, b);
    }
    if (status == CLATTN_SUCCESS && mc->bias) {
        status = (clattn_status)pb_upload(ctx, &t.bias, 3, bias);
    }
    if (status == CLATTN_SUCCESS) {
        /* beta != 0 reads C: give it values; else poison, which the kernel must not read. */
        status = (clattn_status)pb_upload(ctx, &t.c, 4, mc->beta != 0.0f ? c_before : NULL);
    }
    if (status == CLATTN_SUCCESS) {
        const clattn_matmul_desc desc = {sizeof desc, mc->trans_a, mc->trans_b, mc->alpha,
                                         mc->beta};
        status = clattn_matmul(ctx, &desc, &t.a, &t.b, &t.bias, &t.c, 0, NULL, NULL);
    }
    size_t stray = 0;
    if (status == CLATTN_SUCCESS) {
        status = (clattn_status)pb_download(ctx, NULL, &t.c, c_out, &stray);
    }
    if (status == CLATTN_SUCCESS) {
        tu_expect(stray == 0, "c: %zu stray writes outside C", stray);
    }
    clattn_tensors all;
    memset(&all, 0, sizeof all);
    all.q = t.a, all.k = t.b, all.v = t.bias, all.out = t.c;
    pb_release_tensors(&all);
    return status;
}

START_TEST(test_determinism_matmul)
{
    TU_BEGIN_TEST();
    const matmul_case *mc = &matmul_cases[_i];
    tu_set_case("matmul batch=%zu m=%zu n=%zu k=%zu trans_a=%d trans_b=%d lda=%zu ldb=%zu "
                "ldc=%zu stride_a=%zu stride_b=%zu stride_c=%zu alpha=%g beta=%g bias=%d",
                mc->batch, mc->m, mc->n, mc->k, mc->trans_a, mc->trans_b, mc->lda, mc->ldb, mc->ldc,
                mc->stride_a, mc->stride_b, mc->stride_c, (double)mc->alpha, (double)mc->beta,
                mc->bias);
    const size_t count_a = mc->batch * mc->m * mc->k, count_b = mc->batch * mc->k * mc->n;
    const size_t count_c = mc->batch * mc->m * mc->n;
    float *a = tu_random_floats(count_a), *b = tu_random_floats(count_b);
    float *bias = tu_random_floats(mc->n), *c_before = tu_random_floats(count_c);
    double *c_ref = tu_doubles(count_c);
    tu_floats_to_doubles(c_before, count_c, c_ref);
    ref_matmul_shape shape;
    memset(&shape, 0, sizeof shape);
    shape.batch[0] = shape.a_batch[0] = shape.b_batch[0] = mc->batch;
    shape.m = mc->m, shape.n = mc->n, shape.k = mc->k;
    shape.trans_a = mc->trans_a, shape.trans_b = mc->trans_b;
    shape.alpha = mc->alpha, shape.beta = mc->beta;
    ref_matmul(&shape, a, b, mc->bias ? bias : NULL, c_ref);

    clattn_ctx *fresh = fresh_context();
    float *c[DETERMINISM_RUNS];
    int ok[DETERMINISM_RUNS] = {0};
    for (int run = 0; run < DETERMINISM_RUNS; ++run) {
        c[run] = tu_nan_floats(count_c);
        clattn_ctx *ctx = context_for_run(run, fresh);
        if (ctx != NULL) {
            expect_run_ok(ctx, run_matmul(ctx, mc, a, b, bias, c_before, c[run]), run,
                          "clattn_matmul", &ok[run]);
        }
    }
    if (ok[0]) {
        tu_expect_close("c", c[0], c_ref, count_c, TU_TOL);
    }
    expect_runs_identical("c", c, ok, count_c);
    for (int run = 0; run < DETERMINISM_RUNS; ++run) {
        free(c[run]);
    }
    clattn_ctx_release(fresh);
    free(c_ref);
    free(c_before);
    free(bias);
    free(b);
    free(a);
    TU_END_TEST();
}
END_TEST

static Suite *threads_suite(void)
{
    Suite *suite = suite_create("threads");
    TCase *concurrency = tu_tcase(suite, "concurrency", 600);
    tcase_add_test(concurrency, test_threads_own_contexts);
    tcase_add_test(concurrency, test_threads_contexts_from_shared_cl_context);
    tcase_add_test(concurrency, test_threads_shared_context_serialised);

    TCase *determinism = tu_tcase(suite, "determinism", 600);
    tcase_add_loop_test(determinism, test_determinism_attention, 0, 2);
    tcase_add_loop_test(determinism, test_determinism_mha, 0, COUNT_OF(mha_determinism_modes));
    tcase_add_loop_test(determinism, test_determinism_matmul, 0, COUNT_OF(matmul_cases));
    return suite;
}

int main(void)
{
    return tu_main("check_threads", threads_suite);
}
