/* The context: the device, its limits and tuning, the program cache, the workspace slots and
 * the last error (host/core; data only, the functions are in runtime.h). Never installed. */
#ifndef CLATTN_CORE_CONTEXT_H
#define CLATTN_CORE_CONTEXT_H

#include "tuning/keys.h"
#include "clattn.h"

#include <stdarg.h>
#include <stdbool.h>

/* The kernel sources; each op file owns one. common.cl is prepended to every program. */
/* A kernel family's registry entry (host/core/family.h) */
typedef struct clattn_family clattn_family;

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
    cl_ulong global_cache_size; /* CL_DEVICE_GLOBAL_MEM_CACHE_SIZE (PoCL: the last level's) */
    cl_uint compute_units;
    cl_uint preferred_float_width;
    bool has_fp64; /* CL_DEVICE_DOUBLE_FP_CONFIG != 0 (cl_khr_fp64) */
    /* cl_intel_subgroup_matrix_multiply_accumulate: its sub-group size (the device's smallest,
     * 8 or 16; flash_gpu.cl's FG_DPAS), 0 without the extension */
    unsigned dpas_sg;
    /* CL_DRIVER_VERSION and the platform's CL_PLATFORM_VERSION: with the name and clattn's
     * version they key the tuning cache's rows and the validation records (clattn__driver_key) */
    char driver_version[128];
    char platform_version[128];
    /* clattn__driver_key's text, made once: the tuning cache's rows must carry it (tuning.c) */
    char driver_key[640];
} clattn_device_info;

/* Kernel parameters: the default row computed from the device's limits, then the rows of the
 * tuning table (host/tuning/table.h, and CLATTN_TUNING=FILE) that match the device, in order.
 * Each key of CLATTN_TUNING_KEYS is a field. */
typedef struct clattn_tuning {
    bool cpu_params; /* CPU-class rows apply (the device's type, or CLATTN_PARAMS) */
#define CLATTN_TUNING_FIELD(name, scope, lo, hi, op, cls, when, values, quick, doc) unsigned name;
    CLATTN_TUNING_KEYS(CLATTN_TUNING_FIELD)
#undef CLATTN_TUNING_FIELD
} clattn_tuning;

/* A row with selectors (@head_dim=, @dtype=, @phase=): PROBLEM keys for the attention
 * problems it selects, applied per plan on top of the context's row, most specific last
 * (host/core/tuning.c: clattn__tuning_for). */
typedef struct clattn_tuning_record {
    unsigned head_dim; /* 0: any */
    int dtype;         /* a clattn_dtype, or -1: any */
    int phase;         /* 0: any, 1: prefill (more than one query row), 2: decode (one) */
    unsigned long long set; /* bit k: the row gives key k (CLATTN_TUNING_KEYS order) */
    clattn_tuning values;   /* the given keys' values */
    bool lenient;           /* from the tuning cache: ignored, not an error, when invalid */
    char origin[48];        /* "table row 2", "cache line 3", ... */
    char selectors[64];     /* as written, for messages and `clattn info` */
} clattn_tuning_record;
enum { CLATTN_TUNING_RECORDS = 16 };

/* A program built with extra -D options (e.g. per head size) and its one kernel. */
typedef struct clattn_variant {
    const clattn_family *family;
    char name[32];
    char options[512];
    cl_program program;
    cl_kernel kernel;
    char key[64]; /* "<file>:<kernel>@<hash>" (host/core/validate.c) */
    int fault;    /* CLATTN_FAULT_VARIANT's injected fault: 0 none, 1 wrong, 2 build, 3 enqueue */
    int trust;    /* validation in this context: 0 unknown, 1 good, 2 bad, 3 being probed */
} clattn_variant;

/* A validation record of this context's driver (host/core/validate.c). */
typedef struct clattn_trust_record {
    char key[64];
    bool good;
} clattn_trust_record;

struct clattn_ctx {
    cl_context context;
    cl_device_id device;
    cl_command_queue queue;
    clattn_device_info info;
    clattn_tuning tuning; /* the context's row: every problem's unless a record selects it */
    clattn_tuning_record tuning_records[CLATTN_TUNING_RECORDS];
    size_t num_tuning_records;
    char tuning_rows[256];     /* which rows applied (for `clattn info` and tests) */
    char tuning_summary[4096]; /* clattn_ctx_tuning(): rows, records, file, driver key,
                                  ignored rows, parameters */
    char build_options[512];
    clattn_variant *variants;
    size_t num_variants, variant_capacity;
    size_t workspace_limit; /* CLATTN_WORKSPACE_UNLIMITED: only the device's limits */
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
    /* User score functions' sources (host/attn/flex.c): interned, so that the same source
     * gets the same id (score.cl's FLEX_SRC = index + 1) and its programs are built once;
     * builds_user counts the programs built with one of them (tests). */
    char **flex_sources;
    size_t num_flex_sources;
    size_t builds_user;
    /* Self-validation (host/core/validate.c): CLATTN_VALIDATE's mode (0 off, 1 first-use,
     * 2 always), whether a probe is running, this driver's records (loaded on first use) and
     * the log clattn_ctx_validations returns. */
    int validate_mode;
    bool probing;
    bool enqueue_faults; /* a variant with CLATTN_FAULT_VARIANT=...:enqueue was built */
    bool records_loaded;
    clattn_trust_record *records;
    size_t num_records, records_capacity;
    struct clattn_validation *validations;
    size_t num_validations, validations_capacity;
};


#endif
