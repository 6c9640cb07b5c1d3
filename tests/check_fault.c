/*
 * check_fault: failing device calls leave the context usable, and oversized shapes are refused
 * up front. Linked against clattn_fault (the library built with the test-only hook
 * CLATTN_FAULT_INJECTION): for each kind of call (buffer allocation: workspace growth; command
 * enqueue: mid-plan; program build: at plan creation) and each scenario (MHA through the host
 * API fused, unfused, packed self-attention with per-head weights; clattn_attention_host's
 * staging; an MHA plan and an SDPA plan created and executed on device buffers; two forwards
 * ordered on an out-of-order queue) the suite counts how many calls a run makes, then for every
 * N makes the N-th fail on a fresh context and checks that the run returns that kind's status
 * (CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_RESOURCES, CLATTN_ERR_BUILD) with a message
 * naming the user's call (or, for a build, the right numbers through the variant's
 * -cl-opt-disable build), that a plan whose execution failed executes correctly afterwards,
 * that the next run on the same context succeeds with the right output (float64 reference),
 * and (under -DCLATTN_SANITIZE=ON) that nothing leaks.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault_hooks.h"
#include "problems.h"
#include "reference.h"
#include "testutil.h"

static const char *const kind_names[CLATTN_FAULT_KINDS] = {"allocation", "enqueue", "build"};
/* The status a failed call of each kind turns into. */
static const clattn_status kind_status[CLATTN_FAULT_KINDS] = {
    (clattn_status)CL_MEM_OBJECT_ALLOCATION_FAILURE, (clattn_status)CL_OUT_OF_RESOURCES,
    CLATTN_ERR_BUILD};
static long walked[CLATTN_FAULT_KINDS];

/* What one walk runs; each reaches calls the others do not. */
typedef enum scenario {
    SC_MHA_FUSED = 0,     /* cross-attention MHA through the host API, every mask: fused */
    SC_MHA_UNFUSED,       /* the same with averaged weights: unfused */
    SC_MHA_SELF_PER_HEAD, /* self-attention (one pointer): the packed (B, L, 3E) projection and
                             per-head weights */
    SC_ATTENTION_HOST,    /* clattn_attention_host: staging of q, k, v, both masks, weights */
    SC_MHA_PLAN,          /* an MHA plan (averaged weights: the mean-over-heads kernel) created
                             and executed on device buffers, the context's workspace */
    SC_SDPA_PLAN,         /* an SDPA plan, unfused without weights (scores in the workspace),
                             F16 q, a (B, 1, Lq, Lk) mask, strided views */
    SC_OUT_OF_ORDER,      /* two MHA forwards on a caller's out-of-order queue: the second waits
                             for the first through the ordering marker */
    SC_COUNT
} scenario;
static const char *const scenario_names[SC_COUNT] = {"MHA fused",
                                                     "MHA unfused",
                                                     "MHA packed self-attention, per-head weights",
                                                     "attention_host staging",
                                                     "MHA plan on device buffers",
                                                     "SDPA plan on device buffers",
                                                     "two MHA forwards on an out-of-order queue"};

typedef struct problem {
    scenario sc;
    pb_mha_problem mha;   /* every scenario but the SDPA ones */
    pb_sdpa_problem sdpa; /* SC_ATTENTION_HOST, SC_SDPA_PLAN */
} problem;

static int is_sdpa(scenario sc)
{
    return sc == SC_ATTENTION_HOST || sc == SC_SDPA_PLAN;
}

static int is_plan(scenario sc)
{
    return sc == SC_MHA_PLAN || sc == SC_SDPA_PLAN;
}

static void make_problem(problem *p, scenario sc)
{
    memset(p, 0, sizeof *p);
    p->sc = sc;
    if (is_sdpa(sc)) {
        pb_sdpa_spec spec;
        pb_sdpa_spec_init(&spec);
        spec.batch = 2, spec.heads = 4, spec.seq_q = 9, spec.seq_k = 13, spec.dk = 4, spec.dv = 3;
        spec.causal = CLATTN_CAUSAL_TOP_LEFT;
        spec.mask = PB_MASK_FLOAT;
        spec.padding = 1;
        if (sc == SC_ATTENTION_HOST) {
            spec.want_weights = 1;
        } else {
            spec.path = CLATTN_PATH_UNFUSED;
            spec.q_dtype = CLATTN_DTYPE_F16;
            spec.q_layout = PB_SEQ_MAJOR;
            spec.out_layout = PB_SEQ_MAJOR_PADDED;
            spec.mask_rank = 4;
            spec.mask_ones = PB_MASK_ONES_H;
        }
        pb_sdpa_make(&p->sdpa, &spec);
        return;
    }
    const int self = sc == SC_MHA_SELF_PER_HEAD;
    pb_mha_spec spec;
    pb_mha_spec_init(&spec);
    spec.batch = 2, spec.seq_q = self ? 11 : 9, spec.seq_k = self ? 11 : 13;
    spec.embed_dim = 16, spec.num_heads = 4;
    spec.layout = CLATTN_LAYOUT_TORCH;
    spec.form = self ? PB_PACKED_SELF : PB_PACKED_CROSS;
    spec.in_biases = spec.out_proj = spec.out_bias = 1;
    spec.need_weights = sc == SC_MHA_UNFUSED || sc == SC_MHA_PLAN ? CLATTN_WEIGHTS_AVERAGED
                        : self                                    ? CLATTN_WEIGHTS_PER_HEAD
                                                                  : CLATTN_WEIGHTS_NONE;
    spec.causal = CLATTN_CAUSAL_TOP_LEFT;
    spec.mask = PB_MASK_FLOAT;
    spec.padding = 1;
    pb_mha_make(&p->mha, &spec);
}

static void free_problem(problem *p)
{
    if (is_sdpa(p->sc)) {
        pb_sdpa_free(&p->sdpa);
    } else {
        pb_mha_free(&p->mha);
    }
}

/* The op name every message of the scenario starts with: the user's call. */
static const char *op_of(const problem *p)
{
    switch (p->sc) {
    case SC_ATTENTION_HOST:
        return "attention";
    case SC_MHA_PLAN:
        return "mha";
    case SC_SDPA_PLAN:
        return "sdpa";
    default:
        return "mha_forward";
    }
}

/* One host API call of the scenario; checks the outputs when `check` is set. */
static clattn_status host_call(clattn_ctx *ctx, const problem *p, int check)
{
    if (p->sc == SC_ATTENTION_HOST) {
        const pb_sdpa_problem *s = &p->sdpa;
        clattn_attention_host_desc desc;
        clattn_attention_host_desc_init(&desc);
        desc.batch = s->spec.batch, desc.heads = s->spec.heads;
        desc.seq_q = s->spec.seq_q, desc.seq_k = s->spec.seq_k;
        desc.head_dim_qk = s->spec.dk, desc.head_dim_v = s->spec.dv;
        desc.causal = s->spec.causal;
        const clattn_host_masks masks = {s->mask, s->padding, NULL};
        float *out = tu_nan_floats(s->out_count), *weights = tu_nan_floats(s->weights_count);
        clattn_status status =
            clattn_attention_host(ctx, &desc, s->q, s->k, s->v, &masks, out, weights);
        if (status == CLATTN_SUCCESS && check) {
            tu_expect_close("out", out, s->out_ref, s->out_count, TU_TOL);
            tu_expect_close("weights", weights, s->weights_ref, s->weights_count, TU_TOL);
        }
        free(out);
        free(weights);
        return status;
    }
    const pb_mha_problem *m = &p->mha;
    float *out = tu_nan_floats(m->out_count), *weights = tu_nan_floats(m->attn_count);
    clattn_status status =
        clattn_mha_forward_host(ctx, &m->desc, &m->weights, m->query, m->key, m->value, &m->masks,
                                out, m->attn_count ? weights : NULL);
    if (status == CLATTN_SUCCESS && check) {
        pb_mha_check_host(m, out, m->attn_count ? weights : NULL);
    }
    free(out);
    free(weights);
    return status;
}

/* Executes plan on freshly uploaded buffers; checks the outputs when `check` is set. */
static clattn_status execute_plan(clattn_ctx *ctx, const problem *p, clattn_plan *plan, int check)
{
    clattn_tensors bound;
    cl_int err = p->sc == SC_SDPA_PLAN ? pb_sdpa_upload(ctx, &p->sdpa, &bound)
                                       : pb_mha_upload(ctx, &p->mha, &bound);
    if (!tu_expect(err == CL_SUCCESS, "uploading the plan's buffers failed (%d)", (int)err)) {
        return (clattn_status)err;
    }
    cl_event done = NULL;
    clattn_status status =
        clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, &done);
    tu_expect(status == CLATTN_SUCCESS || done == NULL, "a failed execution returned an event");
    if (status == CLATTN_SUCCESS) {
        status = (clattn_status)clWaitForEvents(1, &done);
    }
    if (done != NULL) {
        clReleaseEvent(done);
    }
    if (status == CLATTN_SUCCESS && check) {
        if (p->sc == SC_SDPA_PLAN) {
            pb_sdpa_check(ctx, NULL, &p->sdpa, &bound);
        } else {
            pb_mha_check(ctx, NULL, &p->mha, &bound);
        }
    }
    pb_release_tensors(&bound);
    return status;
}

/* One run of the scenario (two calls for SC_OUT_OF_ORDER, stopping at a failure; plan
 * creation and one execution for the plan scenarios); checks the outputs of the calls that succeed
 * when `check` is set. A plan scenario whose execution failed hands its plan to *failed_plan (when
 * not NULL), for the caller to execute again. */
static clattn_status forward(clattn_ctx *ctx, const problem *p, int check,
                             clattn_plan **failed_plan)
{
    if (!is_plan(p->sc)) {
        const int runs = p->sc == SC_OUT_OF_ORDER ? 2 : 1;
        for (int run = 0; run < runs; ++run) {
            clattn_status status = host_call(ctx, p, check);
            if (status != CLATTN_SUCCESS) {
                return status; /* its message stays the context's last error */
            }
        }
        return CLATTN_SUCCESS;
    }
    clattn_plan *plan = (clattn_plan *)&plan; /* must become NULL on failure */
    clattn_status status;
    if (p->sc == SC_SDPA_PLAN) {
        clattn_sdpa_desc desc;
        pb_sdpa_desc(&p->sdpa, &desc);
        status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    } else {
        clattn_mha_desc desc;
        pb_mha_desc(&p->mha, &desc);
        status = clattn_mha_plan_create(ctx, &desc, &plan);
    }
    if (status != CLATTN_SUCCESS) {
        tu_expect(plan == NULL, "a failed plan creation left *out = %p", (void *)plan);
        return status;
    }
    status = execute_plan(ctx, p, plan, check);
    if (status != CLATTN_SUCCESS && failed_plan != NULL) {
        *failed_plan = plan;
        return status;
    }
    clattn_plan_release(plan);
    return status;
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
        tu_expect_status(forward(ctx, &p, 1, NULL), CLATTN_SUCCESS, "run without faults");
        calls = clattn__fault_calls(kind);
    }
    release_context(ctx, queue);
    tu_expect(calls > 0, "a run made no %s calls", kind_names[kind]);

    const char *op = op_of(&p);
    for (long n = 1; n <= calls && !tu_failed(); ++n) {
        ctx = fresh_context(&p, &queue);
        if (ctx == NULL)
            break;
        clattn_plan *failed_plan = NULL;
        clattn__fault_arm(kind, n);
        clattn_status status = forward(ctx, &p, 0, &failed_plan);
        clattn__fault_arm(kind, 0);
        /* A failed build is cured by the variant's -cl-opt-disable build (self-validation's
         * fallback, host/core/programs.c): then the run succeeds, with the right numbers. */
        const bool cured = kind == CLATTN_FAULT_BUILD && status == CLATTN_SUCCESS;
        tu_expect(status == kind_status[kind] || cured,
                  "%s %ld of %ld failed: the run returned %s (%d), "
                  "expected %s",
                  kind_names[kind], n, calls, clattn_status_string(status), (int)status,
                  clattn_status_string(kind_status[kind]));
        const char *message = clattn_last_error(ctx);
        tu_expect(cured || (strncmp(message, op, strlen(op)) == 0 && message[strlen(op)] == ':'),
                  "%s %ld: message '%s' does not start with the op name %s", kind_names[kind], n,
                  message, op);
        if (failed_plan != NULL) {
            /* The plan survives a failed execution. */
            status = execute_plan(ctx, &p, failed_plan, 1);
            tu_expect(status == CLATTN_SUCCESS,
                      "after %s %ld failed, executing the same plan again: %s: %s",
                      kind_names[kind], n, clattn_status_string(status), clattn_last_error(ctx));
            clattn_plan_release(failed_plan);
        }
        status = forward(ctx, &p, 1, NULL);
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
    const cl_ulong max_alloc = tu_device_ulong(CL_DEVICE_MAX_MEM_ALLOC_SIZE);
    const size_t seq = (size_t)sqrt((double)max_alloc / sizeof(float)) + 2; /* seq^2 floats > max */
    tu_set_case("B=1 H=1 Lq=Lk=%zu d=1: scores of %.2f GiB vs max allocation %.2f GiB", seq,
                (double)seq * seq * 4 / 1073741824.0, max_alloc / 1073741824.0);
    if (seq > ((size_t)1 << 20)) { /* a device with > 4 TiB buffers: nothing to exceed here */
        TU_END_TEST();
        return;
    }
    float *q = tu_random_floats(seq), *k = tu_random_floats(seq), *v = tu_random_floats(seq);
    float *out = tu_nan_floats(seq);
    clattn_attention_host_desc desc;
    clattn_attention_host_desc_init(&desc);
    desc.batch = desc.heads = 1, desc.seq_q = desc.seq_k = seq;
    desc.head_dim_qk = desc.head_dim_v = 1;
    desc.path = CLATTN_PATH_UNFUSED;
    clattn_status status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
    /* Any correct refusal: which limit refuses it (the largest allocation, the global memory
     * where the two are equal, or the driver's clCreateBuffer) is the device's business; the
     * message names the call and a size of at least the scores' bytes. */
    const char *message = clattn_last_error(ctx);
    const char *bytes_at = strstr(message, " bytes");
    size_t named = 0;
    if (bytes_at != NULL) {
        const char *digits = bytes_at;
        while (digits > message && digits[-1] >= '0' && digits[-1] <= '9')
            --digits;
        named = (size_t)strtoull(digits, NULL, 10);
    }
    tu_expect(status != CLATTN_SUCCESS && tu_starts_with(message, "attention") &&
                  named >= seq * seq * sizeof(float),
              "unfused: %s: '%s' (want a refusal naming attention and at least %zu bytes)",
              clattn_status_string(status), message, seq * seq * sizeof(float));
    desc.path = CLATTN_PATH_AUTO;
    status = clattn_attention_host(ctx, &desc, q, k, v, NULL, out, NULL);
    tu_expect_status(status, CLATTN_SUCCESS, "AUTO (fused) at the same size");
    if (status == CLATTN_SUCCESS) {
        /* Each output is a weighted mean of 32770 values in [-1, 1]: it can come out near 0
         * (cancellation), so it is judged against the weighted mean of |v| (the terms'
         * magnitude), as the matmul tests judge a dot product, not against itself. */
        float *v_abs = tu_floats(seq);
        for (size_t j = 0; j < seq; ++j)
            v_abs[j] = fabsf(v[j]);
        const size_t rows[2] = {0, seq - 1};
        for (int r = 0; r < 2; ++r) {
            ref_sdpa_shape one = ref_softmax_shape(1, 1, 1, seq, 1, 1);
            one.scale = 1.0;
            double want = 0.0, magnitude = 0.0;
            ref_sdpa(&one, q + rows[r], k, v, NULL, NULL, &want, NULL, NULL);
            ref_sdpa(&one, q + rows[r], k, v_abs, NULL, NULL, &magnitude, NULL, NULL);
            const double err = fabs((double)out[rows[r]] - want) / magnitude;
            tu_expect(isfinite(out[rows[r]]) && err <= TU_TOL,
                      "sampled row %zu: got %.9g, want %.9g: error %.3g of the terms' "
                      "magnitude %.3g (tolerance %.1g)",
                      rows[r], (double)out[rows[r]], want, err, magnitude, TU_TOL);
        }
        free(v_abs);
    }
    free(q);
    free(k);
    free(v);
    free(out);
    TU_END_TEST();
}
END_TEST

/* A user's score function equal in text to one built before, at another address, is not
 * built again: the context interns flex sources, so the second plan's programs all come from
 * the program cache. (Here, not in check_flex, because counting builds needs this library's
 * hook.) */
START_TEST(test_flex_source_built_once)
{
    TU_BEGIN_TEST();
    tu_set_case("two SDPA plans with the same score_mod text at two addresses");
    static const char source[] = "float score_mod(float score, int b, int h, int q_idx, int kv_idx)\n"
                                 "{\n"
                                 "    return score + 0.25f * (float)(q_idx - kv_idx);\n"
                                 "}\n";
    char copy[sizeof source];
    memcpy(copy, source, sizeof source);
    clattn_tensors t;
    memset(&t, 0, sizeof t);
    t.q = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, 1, 2, 17, 16);
    t.k = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, 1, 2, 19, 16);
    t.v = t.k;
    t.out = t.q;
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    CLATTN_BIND_ROLES(desc, t);
    desc.flex.source = source;
    desc.flex.functions = CLATTN_FLEX_SCORE_MOD;
    clattn_plan *first = NULL, *second = NULL;
    clattn__fault_arm(CLATTN_FAULT_BUILD, 0);
    tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &first), CLATTN_SUCCESS, "first");
    const long built = clattn__fault_calls(CLATTN_FAULT_BUILD);
    desc.flex.source = copy;
    tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &second), CLATTN_SUCCESS, "second");
    tu_expect(built > 0 && clattn__fault_calls(CLATTN_FAULT_BUILD) == built,
              "program builds: %ld for the first plan, %ld after the second", built,
              clattn__fault_calls(CLATTN_FAULT_BUILD));
    clattn_plan_release(first);
    clattn_plan_release(second);
    TU_END_TEST();
}
END_TEST

/* A KV cache pool of 2 MiB or more whose huge-page allocation fails (host/attn/cache.c
 * huge_pool: the injected ALLOC fault stands for posix_memalign, madvise's buffer or
 * clCreateBuffer with USE_HOST_PTR failing) falls back to the runtime's memory: the cache is
 * still made, the keys' pool is the runtime's, the values' pool (the next call) takes the huge
 * pages on a CPU under Linux, and an append lands in both exactly. */
START_TEST(test_cache_huge_pages_fall_back)
{
    TU_BEGIN_TEST();
    const size_t kv_heads = 8, capacity = 1040, d = 64, n = 5; /* pools of 2.1 MB */
    tu_set_case("kv cache %zu x %zu x %zu f32, the keys' huge-page allocation failing", kv_heads,
                capacity, d);
    clattn_ctx *ctx = tu_ctx();
    clattn_kv_cache_desc cd;
    clattn_kv_cache_desc_init(&cd);
    cd.batch = 1, cd.kv_heads = kv_heads, cd.capacity = capacity;
    cd.head_dim_qk = cd.head_dim_v = d, cd.dtype = CLATTN_DTYPE_F32;
    clattn_kv_cache *cache = NULL;
    clattn__fault_arm(CLATTN_FAULT_ALLOC, 1);
    const clattn_status made = clattn_kv_cache_create(ctx, &cd, &cache);
    const long calls = clattn__fault_calls(CLATTN_FAULT_ALLOC);
    clattn__fault_arm(CLATTN_FAULT_ALLOC, 0);
    cl_device_type type = 0;
    clGetDeviceInfo(clattn_ctx_device(ctx), CL_DEVICE_TYPE, sizeof type, &type, NULL);
#if defined(__linux__)
    const bool huge = (type & CL_DEVICE_TYPE_CPU) != 0;
#else
    const bool huge = false;
#endif
    if (!tu_expect_status(made, CLATTN_SUCCESS, "the cache, its first allocation failing")) {
        TU_END_TEST();
        return;
    }
    tu_expect(!huge || calls == 2, "huge-page allocations tried: %ld (want the keys' and values')",
              calls);
    clattn_tensor k, v;
    clattn_kv_cache_tensors(cache, &k, &v, NULL);
    cl_mem_flags flags[2] = {0, 0};
    clGetMemObjectInfo(k.mem, CL_MEM_FLAGS, sizeof flags[0], &flags[0], NULL);
    clGetMemObjectInfo(v.mem, CL_MEM_FLAGS, sizeof flags[1], &flags[1], NULL);
    tu_expect(!(flags[0] & CL_MEM_USE_HOST_PTR), "the keys' pool uses host memory after the fault");
    tu_expect(!(flags[1] & CL_MEM_USE_HOST_PTR) == !huge,
              "the values' pool: USE_HOST_PTR %d, huge pages expected %d",
              !!(flags[1] & CL_MEM_USE_HOST_PTR), huge);
    /* an append of n keys and values lands in both pools exactly */
    float *keys = tu_random_floats(kv_heads * n * d), *values = tu_random_floats(kv_heads * n * d);
    cl_int err = CL_SUCCESS;
    cl_mem mem[2] = {
        clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                       kv_heads * n * d * sizeof(float), keys, &err),
        clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                       kv_heads * n * d * sizeof(float), values, &err)};
    clattn_tensor nk = clattn_tensor_make(mem[0], 0, CLATTN_DTYPE_F32, 4, 1, kv_heads, n, d);
    clattn_tensor nv = clattn_tensor_make(mem[1], 0, CLATTN_DTYPE_F32, 4, 1, kv_heads, n, d);
    if (tu_expect(err == CL_SUCCESS, "buffers") &&
        tu_expect_status(clattn_kv_cache_append(cache, &nk, &nv, 0, NULL, NULL), CLATTN_SUCCESS,
                         "append") &&
        tu_expect_status(clattn_finish(ctx), CLATTN_SUCCESS, "finish")) {
        const clattn_tensor *pools[2] = {&k, &v};
        const float *want[2] = {keys, values};
        float row[64];
        size_t wrong = 0;
        for (int p = 0; p < 2; ++p)
            for (size_t h = 0; h < kv_heads; ++h)
                for (size_t j = 0; j < n; ++j) {
                    const size_t at = (size_t)pools[p]->offset + h * pools[p]->strides[1] +
                                      j * pools[p]->strides[2];
                    clEnqueueReadBuffer(clattn_ctx_queue(ctx), pools[p]->mem, CL_TRUE,
                                        at * sizeof(float), d * sizeof(float), row, 0, NULL,
                                        NULL);
                    wrong += memcmp(row, want[p] + (h * n + j) * d, d * sizeof(float)) != 0;
                }
        tu_expect(wrong == 0, "%zu of %zu appended rows differ", wrong, 2 * kv_heads * n);
    }
    for (int i = 0; i < 2; ++i)
        if (mem[i])
            clReleaseMemObject(mem[i]);
    free(keys);
    free(values);
    clattn_kv_cache_release(cache);
    TU_END_TEST();
}
END_TEST

int main(void)
{
    /* The error paths of plans, not self-validation's (check_validate): probes would add
     * calls that fail and turn errors into fallbacks. */
    setenv("CLATTN_VALIDATE", "off", 1);
    tu_suite_begin("check_fault");
    Suite *suite = suite_create("fault");
    TCase *faults = tu_tcase(suite, "fault injection", 900);
    /* The out-of-order scenario (the last) is registered only where the device has
     * out-of-order queues (Mesa's rusticl has none): a walk that did not run must not pass. */
    const int out_of_order =
        (tu_device_ulong(CL_DEVICE_QUEUE_PROPERTIES) & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0;
    if (!out_of_order)
        printf("check_fault: NOT RUN: the device has no out-of-order queues; the '%s' walks are "
               "not registered\n",
               scenario_names[SC_OUT_OF_ORDER]);
    tcase_add_loop_test(faults, test_walk_faults, 0,
                        (out_of_order ? SC_COUNT : SC_OUT_OF_ORDER) * CLATTN_FAULT_KINDS);
    TCase *limits = tu_tcase(suite, "limits", 900);
    tcase_add_test(limits, test_max_alloc_refused_or_fused);
    tcase_add_test(limits, test_flex_source_built_once);
    tcase_add_test(limits, test_cache_huge_pages_fall_back);
    int result = tu_run_suite(suite);
    printf("check_fault: walked %ld allocation, %ld enqueue and %ld build failure points\n",
           walked[CLATTN_FAULT_ALLOC], walked[CLATTN_FAULT_ENQUEUE], walked[CLATTN_FAULT_BUILD]);
    return result;
}
