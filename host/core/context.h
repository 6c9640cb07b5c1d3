/* The context: the device, its limits and tuning, the program cache, the workspace slots and
 * the last error (host/core; data only, the functions are in runtime.h). Never installed. */
#ifndef CLATTN_CORE_CONTEXT_H
#define CLATTN_CORE_CONTEXT_H

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

/* The tuning keys, one line each in the order `clattn info` prints them: (name, what it
 * sets). The list makes clattn_tuning's fields and the row parser's key table and summary
 * (host/core/tuning.c); tools/tune_space.h says which of them `clattn tune` searches. A new
 * key is one line here (its default in tuning.c's default_row, its limits in check_row). */
#define CLATTN_TUNING_KEYS(X)                                                                     \
    X(matmul_vec, "1: the register-blocked vector matmul (CPUs), 0: local tiles")                \
    X(vec_rm, "matmul_vec: rows of a micro-tile")                                               \
    X(vec_width, "matmul_vec: float vector width (4, 8, 16)")                                   \
    X(vec_wg, "matmul_vec: work-items per group")                                               \
    X(transpose_wg, "transposes: work-items per group side")                                    \
    X(tile_m, "matmul (local tiles): rows of C per group")                                      \
    X(tile_n, "matmul (local tiles): columns of C per group")                                   \
    X(tile_k, "matmul (local tiles): depth of a tile")                                          \
    X(wpt_m, "matmul (local tiles): rows per work-item")                                        \
    X(wpt_n, "matmul (local tiles): columns per work-item")                                     \
    X(softmax_wg, "softmax: work-items per row (a group per row)")                              \
    X(heads_wg, "heads.cl's kernels: work-items per group")                                     \
    X(flash_rows, "flash.cl: query rows (work-items) per group, upper bound")                  \
    X(flash_vw, "flash.cl: vector width along a row (1, 4, 8), upper bound")                   \
    X(loop_trip_limit, "0, or the loop iterations a work-item may make in all (quirks)")       \
    X(softmax_rows, "0: a group per softmax row; N: a work-item per row, N rows per group")    \
    X(flash_cpu, "1: the fused kernel for CPUs (flash_cpu.cl), 0: flash.cl")                    \
    X(flash_cpu_rb, "flash_cpu: query rows per register block (1 .. 8)")                        \
    X(flash_cpu_nb, "flash_cpu: register blocks per group sharing a key tile")                 \
    X(flash_gpu, "1: the cooperative fused kernel for GPUs (flash_gpu.cl)")                     \
    X(fg_bq, "flash_gpu: query rows per group")                                                 \
    X(fg_bk, "flash_gpu: keys per tile")                                                        \
    X(fg_tx, "flash_gpu: work-items along the keys")                                            \
    X(fg_ty, "flash_gpu: work-items along the rows")                                            \
    X(vec_nv, "matmul_vec: vectors per micro-tile row (panel = vec_nv * vec_width)")           \
    X(vec_rb, "matmul_vec: micro-tiles (vec_rm rows each) per work-item")                       \
    X(vec_kc, "matmul_vec: depth of a K block")                                                 \
    X(vec_stream, "matmul_vec: KiB of F32 C per launch from which C is streamed (0: never)")   \
    X(flash_cpu_kv, "flash_cpu: float16 vectors per block row (1, 2, 4)")                       \
    X(decode_keys, "fused decode splits: keys per split at least (0: never split)")

/* Kernel parameters: the default row computed from the device's limits, then the rows of the
 * tuning table (host/tuning/table.h, and CLATTN_TUNING=FILE) that match the device, in order.
 * Each key of CLATTN_TUNING_KEYS is a field. */
typedef struct clattn_tuning {
    bool cpu_params; /* CPU-class rows apply (the device's type, or CLATTN_PARAMS) */
#define CLATTN_TUNING_FIELD(name, doc) unsigned name;
    CLATTN_TUNING_KEYS(CLATTN_TUNING_FIELD)
#undef CLATTN_TUNING_FIELD
    char rows[256];     /* which table rows applied (for `clattn info` and tests) */
    char summary[1536]; /* clattn_ctx_tuning(): rows, file, ignored rows, parameters */
} clattn_tuning;

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
    clattn_device_info info;
    clattn_tuning tuning;
    char build_options[512];
    clattn_variant *variants;
    size_t num_variants, variant_capacity;
    size_t workspace_limit; /* 0: only the device's limits */
    bool out_of_order;      /* the queue may run commands out of order */
    cl_event last_event;    /* the end of the previous call's work on the context's workspace */
    cl_command_queue last_queue; /* the queue last_event was enqueued on */
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


#endif
