/* Structures and helpers shared inside the library; never installed. */
#ifndef CLATTN_INTERNAL_H
#define CLATTN_INTERNAL_H

#include "clattn.h"

#include <stdarg.h>
#include <stdbool.h>

/* The kernel sources; each op file owns one. common.cl is prepended to every program. */
typedef enum clattn_source {
    CLATTN_SRC_MATMUL = 0,
    CLATTN_SRC_SOFTMAX,
    CLATTN_SRC_HEADS,
    CLATTN_SRC_FLASH,
    CLATTN_SRC_FLASH_CPU,
    CLATTN_SRC_FLASH_GPU,
    CLATTN_SRC_POSENC,
    CLATTN_SRC_ROPE,
    CLATTN_SRC_ADDITIVE,
    CLATTN_SRC_COUNT
} clattn_source;

/* Device-memory scratch owned by the context, reused across calls and grown on demand.
 * Host-API staging buffers live here too. */
typedef enum clattn_ws_slot {
    CLATTN_WS_PLAN = 0,   /* plan executions without a workspace of the caller's */
    CLATTN_WS_HOST_IN0,   /* host API: query / q */
    CLATTN_WS_HOST_IN1,   /* key / k */
    CLATTN_WS_HOST_IN2,   /* value / v */
    CLATTN_WS_HOST_OUT,   /* out */
    CLATTN_WS_HOST_ATTN,  /* attention weights */
    CLATTN_WS_HOST_MASK,  /* additive mask */
    CLATTN_WS_HOST_KPM,   /* key padding mask */
    CLATTN_WS_HOST_ALIBI, /* ALiBi slopes */
    CLATTN_WS_HOST_W,     /* all weights and biases, packed one after another */
    CLATTN_WS_MATMUL_BT,  /* matmul_vec: B packed into panels */
    CLATTN_WS_COUNT
} clattn_ws_slot;

typedef struct clattn_device_info {
    cl_device_type type;
    char name[256];
    char vendor[128];
    size_t max_work_group_size;
    size_t max_item_sizes[3];
    cl_ulong local_mem_size;
    cl_ulong max_alloc_size;
    cl_ulong global_mem_size;
    cl_uint compute_units;
    cl_uint preferred_float_width;
    bool has_fp64; /* CL_DEVICE_DOUBLE_FP_CONFIG != 0 (cl_khr_fp64) */
} clattn_device_info;

/* Kernel parameters: the default row computed from the device's limits, then the rows of the
 * tuning table (host/tuning/table.h, and CLATTN_TUNING=FILE) that match the device, in order.
 * Each field is a key of the table's text format (host/core/tuning.c). */
typedef struct clattn_tuning {
    bool cpu_params; /* CPU-class rows apply (the device's type, or CLATTN_PARAMS) */
    unsigned matmul_vec; /* 1: the register-blocked vector matmul (CPUs), 0: local tiles */
    unsigned vec_rm, vec_width, vec_wg, transpose_wg;
    unsigned vec_nv; /* matmul_vec: vectors per micro-tile row (panel = vec_nv * vec_width) */
    unsigned vec_rb; /* matmul_vec: micro-tiles (vec_rm rows each) per work-item */
    unsigned vec_kc; /* matmul_vec: depth of a K block */
    unsigned vec_stream; /* matmul_vec: KiB of F32 C per launch from which it is written with
                          * nontemporal stores (0: never) */
    unsigned tile_m, tile_n, tile_k, wpt_m, wpt_n;
    unsigned softmax_wg;
    unsigned softmax_rows; /* 0: a work-group per softmax row; N: a work-item per row, N rows
                            * per group, float16 vectors (CPUs) */
    unsigned heads_wg;
    unsigned decode_keys; /* fused decode splits: keys per split at least (0: never split) */
    unsigned flash_rows; /* query rows (work-items) per fused work-group, upper bound */
    unsigned flash_vw;   /* vector width along a row in the fused kernel (1, 4, 8), upper bound */
    unsigned flash_cpu;    /* 1: the fused kernel for CPUs (flash_cpu.cl), 0: flash.cl */
    unsigned flash_cpu_rb; /* flash_cpu: query rows per register block (1 .. 8) */
    unsigned flash_cpu_nb; /* flash_cpu: register blocks per work-group sharing a key tile */
    unsigned flash_cpu_kv; /* flash_cpu: float16 vectors per block row (1, 2, 4) */
    unsigned flash_gpu;    /* 1: the cooperative fused kernel for GPUs (flash_gpu.cl) */
    unsigned fg_bq, fg_bk, fg_tx, fg_ty; /* flash_gpu: rows, keys per tile, work-items */
    unsigned loop_trip_limit; /* 0, or the loop iterations a work-item may make in all (quirks) */
    char rows[256];           /* which table rows applied (for `clattn info` and tests) */
    char summary[1536];       /* clattn_ctx_tuning(): rows, file, ignored rows, parameters */
} clattn_tuning;

/* --- tuning.c ------------------------------------------------------------------------------ */
/* Fills ctx->tuning and ctx->build_options for ctx->info. tuning_file and tuning_rows are
 * the clattn_ctx_desc fields of those names (NULL: the environment's choice; none). */
clattn_status clattn__choose_tuning(clattn_ctx *ctx, const char *tuning_file,
                                    const char *tuning_rows);

/* A program built with extra -D options (e.g. per head size) and its one kernel. */
typedef struct clattn_variant {
    clattn_source source;
    char name[32];
    char options[192];
    cl_program program;
    cl_kernel kernel;
} clattn_variant;

struct clattn_ctx {
    cl_context context;
    cl_device_id device;
    cl_command_queue queue;
    cl_command_queue exec_queue; /* set during clattn_plan_execute on another queue, else NULL */
    bool exec_out_of_order;      /* exec_queue may run commands out of order */
    clattn_device_info info;
    clattn_tuning tuning;
    char build_options[512];
    clattn_variant *variants;
    size_t num_variants, variant_capacity;
    size_t workspace_limit; /* 0: only the device's limits */
    bool out_of_order;      /* the queue may run commands out of order */
    cl_event last_event;    /* the end of the previous call's work on the context's workspace */
    cl_command_queue last_queue; /* the queue last_event was enqueued on */
    bool private_workspace; /* this call uses only the caller's workspace: no ordering needed */
    cl_mem workspace[CLATTN_WS_COUNT];
    size_t workspace_bytes[CLATTN_WS_COUNT];
    char message[2048];
    /* clattn_ctx_trace_kernels: the kernels enqueued while tracing, with a retained event. */
    bool tracing;
    struct clattn_trace_entry {
        char name[48];
        cl_event event;
    } *trace;
    size_t trace_count, trace_dropped;
};

/* The queue the current call enqueues on. */
static inline cl_command_queue clattn__queue(const clattn_ctx *ctx)
{
    return ctx->exec_queue ? ctx->exec_queue : ctx->queue;
}

/* --- status.c ------------------------------------------------------------------------------ */

/* Records a formatted message on ctx (when not NULL) and returns status. */
clattn_status clattn__fail(clattn_ctx *ctx, clattn_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Records "<what>: <CL error name> (<code>)" and returns the OpenCL code as a status. */
clattn_status clattn__cl_fail(clattn_ctx *ctx, cl_int err, const char *what);
const char *clattn__cl_error_name(cl_int err);
void clattn__clear_error(clattn_ctx *ctx);
void clattn__copy_message(char *dst, size_t dst_size, const char *src);

/* Evaluates an OpenCL call; on failure records it and jumps to the function's `done` label with
 * `status` set. The only control-flow macro in the library. */
#define CL_CHECK(ctx, call, what)                                                                  \
    do {                                                                                           \
        cl_int cl_check_err_ = (call);                                                             \
        if (cl_check_err_ != CL_SUCCESS) {                                                         \
            status = clattn__cl_fail((ctx), cl_check_err_, (what));                                \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* --- fault injection (test builds only) ----------------------------------------------------
 * Built with -DCLATTN_FAULT_INJECTION (the clattn_fault test library, never the shipped one),
 * the N-th device allocation, command enqueue or program build after clattn__fault_arm fails
 * as if the OpenCL call had. Process-wide counters: a test-only exception to "no global
 * state". */
typedef enum clattn_fault_kind {
    CLATTN_FAULT_ALLOC = 0, /* clCreateBuffer */
    CLATTN_FAULT_ENQUEUE,   /* clEnqueueNDRangeKernel, read/write buffer, marker */
    CLATTN_FAULT_BUILD,     /* clBuildProgram */
    CLATTN_FAULT_KINDS
} clattn_fault_kind;

#ifdef CLATTN_FAULT_INJECTION
/* True when this call of `kind` is the one armed to fail. */
bool clattn__fault(clattn_fault_kind kind);
/* Arms `kind` to fail its n-th call from now (n = 0: never) and resets its counter. */
CLATTN_API void clattn__fault_arm(clattn_fault_kind kind, long n);
/* Calls of `kind` since it was last armed. */
CLATTN_API long clattn__fault_calls(clattn_fault_kind kind);
#else
#define clattn__fault(kind) false
#endif

/* --- size arithmetic (overflow-checked) ---------------------------------------------------- */

static inline bool clattn__mul(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return false;
    *out = a * b;
    return true;
}

static inline bool clattn__add(size_t a, size_t b, size_t *out)
{
    if (b > SIZE_MAX - a)
        return false;
    *out = a + b;
    return true;
}

/* *out = product of count sizes; false on overflow. */
bool clattn__product(size_t *out, int count, ...);

/* --- runtime.c ----------------------------------------------------------------------------- */

/* A kernel argument: size and pointer to its value (value NULL with size sizeof(cl_mem) passes a
 * NULL buffer). */
typedef struct clattn_arg {
    size_t size;
    const void *value;
} clattn_arg;
#define CLATTN_ARG(x) ((clattn_arg){sizeof(x), &(x)})

/* The kernel `name` of `source` built with the extra options `extra`, cached per context. */
clattn_status clattn__variant_kernel(clattn_ctx *ctx, clattn_source source, const char *name,
                                     const char *extra, cl_kernel *out);
/* As clattn__launch, for a kernel already at hand. */
clattn_status clattn__launch_kernel(clattn_ctx *ctx, cl_kernel kernel, const char *name,
                                    const clattn_arg *args, cl_uint num_args, cl_uint dims,
                                    const size_t *global, const size_t *local, cl_uint num_wait,
                                    const cl_event *wait, cl_event *event);

/* A device buffer of at least `bytes` in workspace slot `slot` (grown, never shrunk); `op`
 * names the caller in messages. */
clattn_status clattn__workspace(clattn_ctx *ctx, const char *op, clattn_ws_slot slot, size_t bytes,
                                cl_mem *out);

/* The first checks of every public device call: clears *event and the last error, and refuses
 * a NULL ctx or desc and a wait list that does not match num_wait. */
clattn_status clattn__entry(clattn_ctx *ctx, const char *op, const void *desc, cl_uint num_wait,
                            const cl_event *wait, cl_event *event);
clattn_status clattn__check_norm(clattn_ctx *ctx, const char *op, clattn_norm norm);

/* Checks that no dimension is 0 (limits false), or, once the sizes are known not to overflow,
 * that each fits the kernels' 32-bit indices (limits true). */
clattn_status clattn__check_dims(clattn_ctx *ctx, const char *op, const size_t *dims,
                                 const char *const *names, int count, bool limits);

/* Rounds value up to a multiple of step (step > 0); false on overflow. */
bool clattn__round_up(size_t value, size_t step, size_t *out);

/* --- validation (runtime.c) ---------------------------------------------------------------- */

/* Checks that tensor `t` (named `name` in messages of op `op`) is present when required, and
 * that its buffer holds `offset + elems` elements of `elem_size` bytes. An absent optional
 * tensor passes. */
clattn_status clattn__check_tensor(clattn_ctx *ctx, const char *op, const char *name,
                                   clattn_tensor t, size_t elems, size_t elem_size, bool required);

/* Elements a batched strided matrix spans: (batch-1)*stride + (rows-1)*ld + cols;
 * false on overflow. */
bool clattn__matrix_extent(size_t batch, size_t stride, size_t rows, size_t cols, size_t ld,
                           size_t *out);

/* Event chaining for multi-kernel plans: each step waits for the previous one, so plans work
 * on out-of-order queues too. The first step waits for the caller's list. */
typedef struct clattn_chain {
    cl_uint num_wait;
    const cl_event *wait;
    cl_event last;
} clattn_chain;

void clattn__chain_init(clattn_chain *chain, cl_uint num_wait, const cl_event *wait);
/* Makes `event` (a step's completion event) the one the next step waits for. */
void clattn__chain_push(clattn_chain *chain, cl_event event);
/* Hands the final event to the caller (or releases it when out == NULL) and resets. */
void clattn__chain_finish(clattn_chain *chain, cl_event *out);

#define CHAIN_WAIT(chain) (chain)->num_wait, (chain)->wait

/* Public entry points wrap their work in begin/end. On an out-of-order queue, begin makes the
 * call's first step also wait for the previous call's work (the workspace is shared), and end
 * remembers the call's last event. end hands the final event to `event` on success and
 * returns status; on failure it makes sure the message starts with `op`, so that an error
 * from an inner step still names the call the user made. */
clattn_status clattn__begin(clattn_ctx *ctx, const char *op, clattn_chain *chain, cl_uint num_wait,
                            const cl_event *wait);
clattn_status clattn__end(clattn_ctx *ctx, const char *op, clattn_chain *chain,
                          clattn_status status, cl_event *event);
/* On failure, makes sure the message starts with "op: "; returns status. */
clattn_status clattn__end_message(clattn_ctx *ctx, const char *op, clattn_status status);
/* Pushes a step's event (read through the pointer after the step ran) when the step
 * succeeded; returns status. */
static inline clattn_status clattn__step(clattn_chain *chain, clattn_status status,
                                         const cl_event *step)
{
    if (status == CLATTN_SUCCESS)
        clattn__chain_push(chain, *step);
    return status;
}

#endif
