/*
 * check_threads: the thread-safety contract of clattn.h and run-to-run determinism.
 *
 * Concurrency. Four threads run the same ten awkward MHA forwards (host API; fused and unfused
 * paths, all need_weights modes, masks, Lq != Lk, head sizes 4, 7, 8, 16), each starting at a
 * different job so that different shapes run at the same time:
 *   - each thread with its own context from clattn_ctx_create (made concurrently);
 *   - each thread with its own context from clattn_ctx_create_from_queue on a queue it made from
 *     ONE cl_context the test shares (in-order and, where the device has them, out-of-order
 *     queues; two threads release their queue right after creating the context, which retains
 *     it);
 *   - all threads on ONE context, each call serialised by a mutex (the contract's "serialise
 *     calls on a shared context yourself").
 * Every output is checked against the float64 reference, and the four threads' outputs of a job
 * must be bit-identical. check's assertions are not thread-safe: workers only record statuses
 * and outputs in their own struct, and the main thread checks them after pthread_join. Workers
 * call nothing of testutil (its generator and failure collector are process-global): all inputs
 * are drawn and all memory is allocated before the threads start.
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

enum param {
    PARAM_IN_PROJ,
    PARAM_IN_BIAS,
    PARAM_Q,
    PARAM_K,
    PARAM_V,
    PARAM_Q_BIAS,
    PARAM_K_BIAS,
    PARAM_V_BIAS,
    PARAM_OUT,
    PARAM_OUT_BIAS,
    PARAM_COUNT
};

typedef struct mha_job {
    mha_shape shape;
    clattn_mha_desc desc;
    float *params[PARAM_COUNT]; /* NULL where absent */
    clattn_mha_host_weights weights;
    float *query, *key, *value; /* key and value NULL for self-attention */
    float *attn_mask;
    uint8_t *padding;
    clattn_host_masks masks;
    size_t out_count, attn_count; /* attn_count 0 for NONE */
    double *out_ref, *attn_ref;
    char label[256];
} mha_job;

/* Parameters scaled by 1.5/sqrt(fan_in) keep every projection O(1), as nn.Linear's init does. */
static float *random_params(size_t count, size_t fan_in)
{
    float *values = tu_random_floats(count);
    const float scale = 1.5f / sqrtf((float)fan_in);
    for (size_t i = 0; i < count; ++i) {
        values[i] *= scale;
    }
    return values;
}

static void label_job(mha_job *job)
{
    static const char *const weight_modes[] = {"none", "per_head", "averaged"};
    static const char *const paths[] = {"auto", "fused", "unfused"};
    const mha_shape *s = &job->shape;
    snprintf(job->label, sizeof job->label,
             "batch=%zu seq_q=%zu seq_k=%zu E=%zu H=%zu kdim=%zu vdim=%zu %s %s %s biases=%d "
             "out_proj=%d need_weights=%s path=%s causal=%d attn_mask=%d padding=%d norm=%s",
             s->batch, s->seq_q, job->desc.seq_k, s->embed_dim, s->num_heads,
             ref_mha_kdim(&job->desc), ref_mha_vdim(&job->desc), s->layout == XW ? "xw" : "torch",
             s->packed ? "packed" : "separate", s->self ? "self" : "cross", s->biases, s->out_proj,
             weight_modes[s->need_weights], paths[s->path], s->causal, s->attn_mask, s->padding,
             s->norm == RELU ? "relu" : "softmax");
}

/* Draws the job's inputs (main thread only: the generator is global) and its reference. */
static void make_job(const mha_shape *shape, mha_job *job)
{
    memset(job, 0, sizeof *job);
    job->shape = *shape;
    const size_t embed = shape->embed_dim;
    const size_t seq_k = shape->self ? shape->seq_q : shape->seq_k;
    clattn_mha_desc desc = {
        .batch = shape->batch,
        .seq_q = shape->seq_q,
        .seq_k = seq_k,
        .embed_dim = embed,
        .num_heads = shape->num_heads,
        .kdim = shape->kdim,
        .vdim = shape->vdim,
        .layout = shape->layout,
        .norm = shape->norm,
        .need_weights = shape->need_weights,
        .path = shape->path,
    };
    job->desc = desc;
    const size_t kdim = ref_mha_kdim(&desc), vdim = ref_mha_vdim(&desc);
    label_job(job);

    if (shape->packed) {
        job->params[PARAM_IN_PROJ] = random_params(3 * embed * embed, embed);
        job->params[PARAM_IN_BIAS] = shape->biases ? random_params(3 * embed, embed) : NULL;
    } else {
        job->params[PARAM_Q] = random_params(embed * embed, embed);
        job->params[PARAM_K] = random_params(kdim * embed, kdim);
        job->params[PARAM_V] = random_params(vdim * embed, vdim);
        if (shape->biases) {
            job->params[PARAM_Q_BIAS] = random_params(embed, embed);
            job->params[PARAM_K_BIAS] = random_params(embed, embed);
            job->params[PARAM_V_BIAS] = random_params(embed, embed);
        }
    }
    if (shape->out_proj) {
        job->params[PARAM_OUT] = random_params(embed * embed, embed);
        job->params[PARAM_OUT_BIAS] = shape->biases ? random_params(embed, embed) : NULL;
    }
    clattn_mha_host_weights weights = {
        .in_proj_weight = job->params[PARAM_IN_PROJ],
        .in_proj_bias = job->params[PARAM_IN_BIAS],
        .q_weight = job->params[PARAM_Q],
        .k_weight = job->params[PARAM_K],
        .v_weight = job->params[PARAM_V],
        .q_bias = job->params[PARAM_Q_BIAS],
        .k_bias = job->params[PARAM_K_BIAS],
        .v_bias = job->params[PARAM_V_BIAS],
        .out_weight = job->params[PARAM_OUT],
        .out_bias = job->params[PARAM_OUT_BIAS],
    };
    job->weights = weights;

    job->query = tu_random_floats(shape->batch * shape->seq_q * embed);
    if (!shape->self) {
        job->key = tu_random_floats(shape->batch * seq_k * kdim);
        job->value = tu_random_floats(shape->batch * seq_k * vdim);
    }
    if (shape->attn_mask) {
        const size_t count = shape->seq_q * seq_k;
        job->attn_mask = tu_floats(count);
        tu_fill_uniform(job->attn_mask, count, -1.0f, 1.0f);
        for (size_t i = 0; i < count; ++i) {
            if (tu_rand_below(4) == 0) {
                job->attn_mask[i] = -INFINITY;
            }
        }
    }
    if (shape->padding) {
        job->padding = tu_bytes(shape->batch * seq_k);
        for (size_t i = 0; i < shape->batch * seq_k; ++i) {
            job->padding[i] = tu_rand_below(4) == 0;
        }
        job->padding[0] = 0; /* batch entry 0 keeps key 0 */
        if (shape->batch > 2) {
            memset(job->padding + 2 * seq_k, 1, seq_k); /* entry 2: every key masked */
        }
    }
    clattn_host_masks masks = {shape->causal, job->attn_mask, job->padding};
    job->masks = masks;

    job->out_count = shape->batch * shape->seq_q * ref_mha_out_dim(&desc, shape->out_proj);
    if (shape->need_weights != NONE) {
        job->attn_count = shape->batch * shape->seq_q * seq_k *
                          (shape->need_weights == PER_HEAD ? shape->num_heads : 1);
    }
    job->out_ref = tu_doubles(job->out_count);
    job->attn_ref = job->attn_count ? tu_doubles(job->attn_count) : NULL;
    ref_mha_forward(&job->desc, &job->weights, job->query, job->key, job->value, &job->masks,
                    job->out_ref, job->attn_ref);
}

static void free_job(mha_job *job)
{
    free(job->attn_ref);
    free(job->out_ref);
    free(job->padding);
    free(job->attn_mask);
    free(job->value);
    free(job->key);
    free(job->query);
    for (int i = 0; i < PARAM_COUNT; ++i) {
        free(job->params[i]);
    }
    memset(job, 0, sizeof *job);
}

/* Safe from any thread on a context that thread may use: touches only ctx and the job. */
static clattn_status run_job(clattn_ctx *ctx, const mha_job *job, float *out, float *attn)
{
    return clattn_mha_forward_host(ctx, &job->desc, &job->weights, job->query, job->key, job->value,
                                   &job->masks, out, job->attn_count ? attn : NULL);
}

/* Main thread: output (and weights) against the reference. */
static void expect_job_close(const mha_job *job, const float *out, const float *attn)
{
    tu_expect_finite("out", out, job->out_count);
    tu_expect_close("out", out, job->out_ref, job->out_count, TU_TOL);
    if (job->attn_count) {
        tu_expect_close("attn_weights", attn, job->attn_ref, job->attn_count, TU_TOL);
    }
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
    const mha_job *jobs;
    int job_count;
    start_gate *gate;

    /* SHARED_CL_CONTEXT */
    cl_context cl_context;
    cl_device_id device;
    cl_command_queue_properties queue_properties;
    int release_queue_early; /* the clattn context retains the queue; drop ours at once */

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
        w->status[j] = run_job(ctx, &w->jobs[j], w->out[j], w->attn[j]);
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
} thread_setup;

/* Runs every job of the table on THREAD_COUNT threads and checks all results. */
static void run_threads(const thread_setup *setup)
{
    const int job_count = COUNT_OF(thread_shapes);
    mha_job jobs[COUNT_OF(thread_shapes)];
    for (int j = 0; j < job_count; ++j) {
        make_job(&thread_shapes[j], &jobs[j]);
    }

    start_gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
    worker workers[THREAD_COUNT];
    pthread_t threads[THREAD_COUNT];
    int started[THREAD_COUNT] = {0};
    memset(workers, 0, sizeof workers);
    for (int t = 0; t < THREAD_COUNT; ++t) {
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
        }
    }
    for (int t = 0; t < THREAD_COUNT; ++t) {
        started[t] = pthread_create(&threads[t], NULL, worker_main, &workers[t]) == 0;
    }
    gate_open(&gate);
    for (int t = 0; t < THREAD_COUNT; ++t) {
        if (started[t]) {
            pthread_join(threads[t], NULL);
        }
    }

    /* All threads have finished: check from here only. */
    for (int t = 0; t < THREAD_COUNT; ++t) {
        const worker *w = &workers[t];
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
            tu_set_case("%s, thread %d%s, job %d: %s", source_name(setup->source), t,
                        w->queue_properties ? " (out-of-order queue)" : "", j, jobs[j].label);
            if (!tu_expect(w->ran[j], "job did not run") ||
                !tu_expect(w->status[j] == CLATTN_SUCCESS,
                           "clattn_mha_forward_host returned %s (%d); first error: '%s'",
                           clattn_status_string(w->status[j]), (int)w->status[j], w->first_error)) {
                continue;
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
    for (int j = 0; j < job_count; ++j) {
        free_job(&jobs[j]);
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
    if (shared != NULL) {
        thread_setup setup = {
            .source = SHARED_CL_CONTEXT,
            .cl_context = shared,
            .device = device,
            .out_of_order = queue_properties & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE,
        };
        run_threads(&setup);
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
        mha_job job;
        make_job(&perturbing_shape, &job);
        float *out = tu_nan_floats(job.out_count), *attn = tu_nan_floats(job.attn_count);
        tu_expect_status(run_job(tu_ctx(), &job, out, attn), CLATTN_SUCCESS,
                         "clattn_mha_forward_host (perturbing forward)");
        free(attn);
        free(out);
        free_job(&job);
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
    mha_job job;
    make_job(&shape, &job);
    tu_set_case("mha %s", job.label);
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
    free_job(&job);
    TU_END_TEST();
}
END_TEST

/* Attention on the fused and the unfused path (the unfused one also returns the weights). */
START_TEST(test_determinism_attention)
{
    TU_BEGIN_TEST();
    const clattn_path path = _i == 0 ? FUSED : UNFUSED;
    clattn_attention_desc desc = {
        .batch = 2,
        .heads = 3,
        .seq_q = 37,
        .seq_k = 70,
        .head_dim_qk = 24,
        .head_dim_v = 20,
        .norm = SOFTMAX,
        .path = path,
    };
    tu_set_case("attention batch=2 heads=3 seq_q=37 seq_k=70 dk=24 dv=20 causal attn_mask "
                "padding path=%s",
                path == FUSED ? "fused" : "unfused");
    const size_t rows_q = desc.batch * desc.heads * desc.seq_q;
    const size_t rows_k = desc.batch * desc.heads * desc.seq_k;
    const size_t out_count = rows_q * desc.head_dim_v, weights_count = rows_q * desc.seq_k;
    float *q = tu_random_floats(rows_q * desc.head_dim_qk);
    float *k = tu_random_floats(rows_k * desc.head_dim_qk);
    float *v = tu_random_floats(rows_k * desc.head_dim_v);
    float *attn_mask = tu_floats(desc.seq_q * desc.seq_k);
    tu_fill_uniform(attn_mask, desc.seq_q * desc.seq_k, -2.0f, 2.0f);
    for (size_t i = 0; i < desc.seq_q * desc.seq_k; ++i) {
        if (tu_rand_below(5) == 0) {
            attn_mask[i] = -INFINITY;
        }
    }
    uint8_t *padding = tu_bytes(desc.batch * desc.seq_k);
    for (size_t i = 1; i < desc.batch * desc.seq_k; ++i) {
        padding[i] = tu_rand_below(3) == 0;
    }
    clattn_host_masks masks = {1, attn_mask, padding};
    double *out_ref = tu_doubles(out_count), *weights_ref = tu_doubles(weights_count);
    ref_attention(&desc, &masks, q, k, v, out_ref, weights_ref);

    clattn_ctx *fresh = fresh_context();
    float *out[DETERMINISM_RUNS], *weights[DETERMINISM_RUNS];
    int ok[DETERMINISM_RUNS] = {0};
    for (int run = 0; run < DETERMINISM_RUNS; ++run) {
        out[run] = tu_nan_floats(out_count);
        weights[run] = tu_nan_floats(weights_count);
        clattn_ctx *ctx = context_for_run(run, fresh);
        if (ctx != NULL) {
            clattn_status status = clattn_attention_host(ctx, &desc, q, k, v, &masks, out[run],
                                                         path == UNFUSED ? weights[run] : NULL);
            expect_run_ok(ctx, status, run, "clattn_attention_host", &ok[run]);
        }
    }
    if (ok[0]) {
        tu_expect_close("out", out[0], out_ref, out_count, TU_TOL);
        if (path == UNFUSED) {
            tu_expect_close("weights", weights[0], weights_ref, weights_count, TU_TOL);
        }
    }
    expect_runs_identical("out", out, ok, out_count);
    if (path == UNFUSED) {
        expect_runs_identical("weights", weights, ok, weights_count);
    }
    for (int run = 0; run < DETERMINISM_RUNS; ++run) {
        free(weights[run]);
        free(out[run]);
    }
    clattn_ctx_release(fresh);
    free(weights_ref);
    free(out_ref);
    free(padding);
    free(attn_mask);
    free(v);
    free(k);
    free(q);
    TU_END_TEST();
}
END_TEST

/* Matmul on device buffers made in each run's own context. */
typedef struct matmul_case {
    clattn_matmul_desc desc;
    int bias;
} matmul_case;

/* clang-format off */
static const matmul_case matmul_cases[] = {
    /* batch m n k trans_a trans_b lda ldb ldc stride_a stride_b stride_c alpha beta; bias */
    {{1, 256, 320, 384, 0, 0, 0, 0, 0, 0, 0, 0, 1.0f, 0.0f}, 0},
    {{3, 67, 45, 131, 0, 1, 0, 0, 0, 67 * 131, 45 * 131, 67 * 45, 0.7f, 0.5f}, 1},
    {{2, 33, 129, 70, 1, 0, 40, 131, 130, 2801, 9170, 4293, -1.25f, 0.0f}, 1},
};
/* clang-format on */

/* Uploads count floats into a new buffer of ctx's cl_context (count 0: one NaN-free float). */
static cl_mem buffer_on(clattn_ctx *ctx, const float *values, size_t count, cl_int *err)
{
    float zero = 0.0f;
    return clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                          (count ? count : 1) * sizeof(float), count ? (void *)values : &zero, err);
}

static clattn_status run_matmul(clattn_ctx *ctx, const matmul_case *mc, const float *a,
                                const float *b, const float *bias, const float *c_before,
                                float *c_out)
{
    const clattn_matmul_desc *desc = &mc->desc;
    const size_t extent_c = ref_matmul_extent_c(desc);
    cl_int err_a = CL_SUCCESS, err_b = CL_SUCCESS, err_bias = CL_SUCCESS, err_c = CL_SUCCESS;
    cl_mem mem_a = buffer_on(ctx, a, ref_matmul_extent_a(desc), &err_a);
    cl_mem mem_b = buffer_on(ctx, b, ref_matmul_extent_b(desc), &err_b);
    cl_mem mem_bias = mc->bias ? buffer_on(ctx, bias, desc->n, &err_bias) : NULL;
    cl_mem mem_c = buffer_on(ctx, c_before, extent_c, &err_c);
    clattn_status status = (clattn_status)(err_a      ? err_a
                                           : err_b    ? err_b
                                           : err_bias ? err_bias
                                                      : err_c);
    if (status == CLATTN_SUCCESS) {
        clattn_tensor ta = {mem_a, 0}, tb = {mem_b, 0}, tbias = {mem_bias, 0}, tc = {mem_c, 0};
        status = clattn_matmul(ctx, desc, ta, tb, tbias, tc, 0, NULL, NULL);
    }
    if (status == CLATTN_SUCCESS) {
        status = clattn_finish(ctx);
    }
    if (status == CLATTN_SUCCESS) {
        status = (clattn_status)clEnqueueReadBuffer(clattn_ctx_queue(ctx), mem_c, CL_TRUE, 0,
                                                    extent_c * sizeof(float), c_out, 0, NULL, NULL);
    }
    cl_mem mems[] = {mem_c, mem_bias, mem_b, mem_a};
    for (int i = 0; i < COUNT_OF(mems); ++i) {
        if (mems[i] != NULL) {
            clReleaseMemObject(mems[i]);
        }
    }
    return status;
}

START_TEST(test_determinism_matmul)
{
    TU_BEGIN_TEST();
    const matmul_case *mc = &matmul_cases[_i];
    const clattn_matmul_desc *desc = &mc->desc;
    tu_set_case("matmul batch=%zu m=%zu n=%zu k=%zu trans_a=%d trans_b=%d lda=%zu ldb=%zu "
                "ldc=%zu alpha=%g beta=%g bias=%d",
                desc->batch, desc->m, desc->n, desc->k, desc->trans_a, desc->trans_b, desc->lda,
                desc->ldb, desc->ldc, (double)desc->alpha, (double)desc->beta, mc->bias);
    const size_t extent_c = ref_matmul_extent_c(desc);
    float *a = tu_random_floats(ref_matmul_extent_a(desc));
    float *b = tu_random_floats(ref_matmul_extent_b(desc));
    float *bias = tu_random_floats(desc->n);
    /* beta != 0 reads C: give it values; else NaN, which the kernel must not read. */
    float *c_before = desc->beta != 0.0f ? tu_random_floats(extent_c) : tu_nan_floats(extent_c);
    double *c_ref = tu_doubles(extent_c);
    tu_floats_to_doubles(c_before, extent_c, c_ref);
    ref_matmul(desc, a, b, mc->bias ? bias : NULL, c_ref);

    clattn_ctx *fresh = fresh_context();
    float *c[DETERMINISM_RUNS];
    int ok[DETERMINISM_RUNS] = {0};
    for (int run = 0; run < DETERMINISM_RUNS; ++run) {
        c[run] = tu_nan_floats(extent_c);
        clattn_ctx *ctx = context_for_run(run, fresh);
        if (ctx != NULL) {
            expect_run_ok(ctx, run_matmul(ctx, mc, a, b, bias, c_before, c[run]), run,
                          "clattn_matmul", &ok[run]);
        }
    }
    if (ok[0]) {
        tu_expect_close("c", c[0], c_ref, extent_c, TU_TOL);
    }
    expect_runs_identical("c", c, ok, extent_c);
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
    TCase *concurrency = tcase_create("concurrency");
    tcase_set_timeout(concurrency, 600);
    tcase_add_test(concurrency, test_threads_own_contexts);
    tcase_add_test(concurrency, test_threads_contexts_from_shared_cl_context);
    tcase_add_test(concurrency, test_threads_shared_context_serialised);
    suite_add_tcase(suite, concurrency);

    TCase *determinism = tcase_create("determinism");
    tcase_set_timeout(determinism, 600);
    tcase_add_loop_test(determinism, test_determinism_attention, 0, 2);
    tcase_add_loop_test(determinism, test_determinism_mha, 0, COUNT_OF(mha_determinism_modes));
    tcase_add_loop_test(determinism, test_determinism_matmul, 0, COUNT_OF(matmul_cases));
    suite_add_tcase(suite, determinism);
    return suite;
}

int main(void)
{
    tu_suite_begin("check_threads");
    return tu_run_suite(threads_suite());
}
