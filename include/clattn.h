/*
 * clattn: scaled dot-product and multi-head attention on any OpenCL 1.2+ device.
 *
 * Conventions
 * - Tensors are strided views of cl_mem buffers (clattn_tensor): element type, rank 1 to 4,
 *   dims, strides and the offset counted in elements of the tensor's type, never in bytes.
 *   16-bit types (F16, BF16) are storage only; arithmetic is float32. Each single dimension
 *   must fit in 32 bits (CLATTN_ERR_UNSUPPORTED otherwise), and sizes whose element or byte
 *   counts overflow size_t give CLATTN_ERR_OVERFLOW.
 * - Attention runs through plans: create a plan once from a descriptor (validation, kernel and
 *   variant choice, program builds, workspace size), execute it many times on buffers. Every
 *   descriptor starts with struct_size = sizeof(the struct); the _init functions set it and
 *   the defaults. Fields are appended in later versions (in whole 8-byte units), and the plan
 *   descriptors, clattn_kv_cache_desc and the host descriptors take an earlier version's
 *   smaller struct: the fields it lacks keep their defaults (tests/check_plan.c,
 *   test_struct_size_older). A struct_size larger than this version's, or not a multiple of 8,
 *   is refused. (clattn_ctx_desc and clattn_matmul_desc still want this version's size.)
 * - Every fallible call returns clattn_status (CLATTN_SUCCESS = 0). Negative values above
 *   CLATTN_ERROR_BASE are OpenCL's own error codes passed through; the library's own codes lie
 *   at and below CLATTN_ERROR_BASE. clattn_last_error(ctx) holds a message naming the argument or
 *   OpenCL call that failed.
 * - The caller owns what it passes in (queues, buffers, events). clattn retains what it keeps and
 *   releases what it retained. Device calls are asynchronous: they enqueue work after `num_wait`
 *   events and, when `event` is not NULL, return an event that completes when the whole call's
 *   work has finished (the caller releases it). In-order and out-of-order queues both work:
 *   clattn chains its own kernels with events.
 * - Host calls (suffix _host) are synchronous: they copy float arrays in, compute, copy out and
 *   wait. Device workspace is kept in the context and reused across calls; it only grows.
 *
 * Thread safety
 * - A clattn_ctx is not thread-safe: use one context per thread, or serialise calls on a shared
 *   context yourself. Distinct contexts may be used concurrently, including contexts made from
 *   the same cl_command_queue's context. clattn has no global mutable state.
 * - A plan belongs to its context and is used under the same rule; release plans before the
 *   context. Executions of one plan may overlap on the device when each has its own workspace.
 * - clattn_status_string() and clattn_dtype_size() are thread-safe.
 */
#ifndef CLATTN_H
#define CLATTN_H

#include <stddef.h>
#include <stdint.h>

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#ifdef __APPLE__
#include <OpenCL/opencl.h>
#else
#include <CL/cl.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define CLATTN_VERSION_MAJOR 0
#define CLATTN_VERSION_MINOR 12
#define CLATTN_VERSION_PATCH 0
#define CLATTN_VERSION_STRING "0.12.0"

#if defined(_WIN32)
#define CLATTN_API
#elif defined(__GNUC__)
#define CLATTN_API __attribute__((visibility("default")))
#else
#define CLATTN_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Status
 * ------------------------------------------------------------------------------------------- */

/* OpenCL error codes (CL_OUT_OF_RESOURCES = -5, ...) are passed through unchanged. */
#define CLATTN_ERROR_BASE (-2048)

typedef enum clattn_status {
    CLATTN_SUCCESS = 0,
    CLATTN_ERR_INVALID_ARGUMENT = -2048, /* NULL pointer, bad enum or flag value */
    CLATTN_ERR_INVALID_SHAPE = -2049,    /* zero or mismatched dimension, E not divisible by H */
    CLATTN_ERR_OVERFLOW = -2050,         /* a size or byte count does not fit in size_t */
    CLATTN_ERR_BUFFER_TOO_SMALL = -2051, /* a cl_mem is smaller than offset + shape needs */
    CLATTN_ERR_NO_DEVICE = -2052,        /* no OpenCL device matches CLATTN_DEVICE / the request */
    CLATTN_ERR_BUILD = -2053,            /* a kernel failed to compile; message has the log */
    CLATTN_ERR_HOST_MEMORY = -2054,      /* malloc failed */
    CLATTN_ERR_UNSUPPORTED = -2055,      /* the device cannot run this (limits, features) */
    CLATTN_ERR_TOO_LARGE = -2056,        /* a buffer would exceed the device's allocation limit */
    CLATTN_ERR_UNTRUSTED = -2057         /* every kernel variant that could run this failed
                                          * validation on the device (clattn_ctx_validations);
                                          * since 0.10 */
} clattn_status;

/* A static name for any status, e.g. "CLATTN_ERR_INVALID_SHAPE" or "CL_OUT_OF_RESOURCES".
 * Unknown values give "CLATTN_UNKNOWN_STATUS". Never NULL. */
CLATTN_API const char *clattn_status_string(clattn_status status);

/* ---------------------------------------------------------------------------------------------
 * Context
 * ------------------------------------------------------------------------------------------- */

typedef struct clattn_ctx clattn_ctx;

/* Creates a context on a device chosen by `device_spec`:
 *   "gpu"  the first GPU of any platform
 *   "cpu"  the first CPU device of any platform
 *   "P:D"  device D of platform P (both 0-based, as `clinfo -l` lists them)
 *   NULL or "" : the environment variable CLATTN_DEVICE, and if that is unset or empty, the first
 *   GPU, else the first CPU device, else the first device of any type.
 * On failure *out is NULL and, when message != NULL, a description is written to message
 * (at most message_size bytes, NUL-terminated). */
CLATTN_API clattn_status clattn_ctx_create(const char *device_spec, clattn_ctx **out,
                                           char *message, size_t message_size);

/* Creates a context that enqueues on the caller's queue (its context and device are used).
 * clattn retains the queue and releases it in clattn_ctx_release; it never destroys the
 * caller's objects. Errors as clattn_ctx_create. */
CLATTN_API clattn_status clattn_ctx_create_from_queue(cl_command_queue queue, clattn_ctx **out,
                                                      char *message, size_t message_size);

/* Kernel parameters come from the tuning table: rows `class | vendor prefix | device-name
 * prefix | key=value ...` applied in order on a default computed from the device's limits:
 * the built-in rows, then the tuning cache that `clattn tune` writes
 * ($XDG_CACHE_HOME/clattn/tuning, else ~/.cache/clattn/tuning), then device quirks.
 * The environment variable CLATTN_TUNING=FILE reads FILE instead of the cache (a malformed row
 * there, or one the device cannot run, fails context creation); CLATTN_TUNING=default applies
 * no row at all (quirks excepted). A row of the cache that is malformed, stale (a key this
 * version does not know) or that the device cannot run is ignored, whole, and listed by
 * clattn_ctx_tuning: rerun `clattn tune` or delete the file. A row may carry, after the device
 * name, the driver key's fields of the device it was tuned on (`| driver D | PLATFORM |
 * clattn V`, clattn_ctx_tuning's "driver key:" line): it applies on that driver, platform and
 * clattn version only, else it is listed as tuned on another driver. The cache's rows must
 * carry them (`clattn tune` writes them); a FILE's may. */

/* Context options: zero-initialise and set struct_size = sizeof(clattn_ctx_desc), or call
 * clattn_ctx_desc_init; later versions may append fields. */
typedef struct clattn_ctx_desc {
    size_t struct_size;
    const char *device_spec; /* as clattn_ctx_create's (NULL: CLATTN_DEVICE or the default) */
    cl_command_queue queue;  /* not NULL: as clattn_ctx_create_from_queue (device_spec unused) */
    /* NULL: as the environment says (CLATTN_TUNING, else the cache); "": built-in rows only,
     * no file; "default": no row at all; else a file read as CLATTN_TUNING=FILE. */
    const char *tuning_file;
    /* NULL, or rows in the table's format (one per line, # comments) applied after all others
     * but the quirks; a malformed row, or values the device cannot run, fail creation
     * (CLATTN_ERR_INVALID_ARGUMENT, CLATTN_ERR_UNSUPPORTED). `clattn tune` tries its
     * candidates this way. */
    const char *tuning_rows;
} clattn_ctx_desc;

CLATTN_API void clattn_ctx_desc_init(clattn_ctx_desc *desc);
/* Creates a context with the options of desc. Errors as clattn_ctx_create. */
CLATTN_API clattn_status clattn_ctx_create_desc(const clattn_ctx_desc *desc, clattn_ctx **out,
                                                char *message, size_t message_size);

/* Which tuning rows the context applied, as text for people and tools, one item a line:
 *   rows: table row 0; cache line 3         (or "none")
 *   records: cache line 4 (@head_dim=64: ...) (rows with selectors; or "none")
 *   file: PATH (the tuning cache)           (", absent"; or the CLATTN_TUNING file; "none ...")
 *   driver key: NAME | driver D | PLATFORM | clattn V   (what the cache's rows must carry)
 *   ignored: cache line 5 (why)             (or "none"; rows tuned on another driver too)
 *   parameters: key=value ...               (every key, as the kernels get them)
 * Valid as long as the context. NULL ctx gives a static message. */
CLATTN_API const char *clattn_ctx_tuning(const clattn_ctx *ctx);

/* The tuning keys (since 0.11): the names a row may set, in the order `clattn info` lists them
 * and `clattn tune` searches them, with what the search tries. Set struct_size =
 * sizeof(clattn_tuning_key_info) before clattn_tuning_key_get; later versions append fields
 * (an earlier version's smaller struct gets the fields it has). The strings are static. */
typedef enum clattn_tuning_scope {
    CLATTN_TUNING_DEVICE = 0, /* one value per context (build options, every op) */
    CLATTN_TUNING_PROBLEM = 1 /* a row with @selectors may set it per attention problem */
} clattn_tuning_scope;
typedef struct clattn_tuning_key_info {
    size_t struct_size;
    const char *name;         /* the key, as rows write it (key=value) */
    const char *op;           /* the op whose timing decides it in `clattn tune`: "matmul",
                               * "softmax", "flash" or "backward"; "": not searched */
    const char *device_class; /* the devices it is searched on: "cpu", "gpu" or "any" */
    const char *when;         /* "" or "key=value": searched only while that key has that value */
    const char *values;       /* the candidates, space-separated */
    const char *quick;        /* the candidates of a quick search ("": not searched then) */
    const char *doc;          /* what it sets, one line */
    unsigned lo, hi;          /* the values a row may give */
    clattn_tuning_scope scope;
} clattn_tuning_key_info;

/* How many tuning keys this version knows. */
CLATTN_API size_t clattn_tuning_key_count(void);
/* Key `index` (0 .. clattn_tuning_key_count() - 1) into *out. CLATTN_ERR_INVALID_ARGUMENT for
 * a NULL out, an index out of range, or a struct_size that is 0, larger than this version's or
 * not a multiple of 8. */
CLATTN_API clattn_status clattn_tuning_key_get(size_t index, clattn_tuning_key_info *out);

/* Releases everything the context holds. NULL is a no-op. Waits for the context's queued
 * work to finish first. */
CLATTN_API void clattn_ctx_release(clattn_ctx *ctx);

/* The last error message recorded on this context ("" when none). Valid until the next call
 * on the context. NULL ctx gives a static message. */
CLATTN_API const char *clattn_last_error(const clattn_ctx *ctx);

CLATTN_API cl_context clattn_ctx_cl_context(const clattn_ctx *ctx);
CLATTN_API cl_command_queue clattn_ctx_queue(const clattn_ctx *ctx);
CLATTN_API cl_device_id clattn_ctx_device(const clattn_ctx *ctx);

/* Kernel tracing, for benchmarks: while on, every kernel the context enqueues (on any queue a
 * call uses) is recorded with its event; clattn_ctx_kernel_times waits for them and returns
 * each kernel's device time, END - START of its own profiling event (so one step of a plan is
 * timed by itself, never as a difference of two totals). The queue must have
 * CL_QUEUE_PROFILING_ENABLE (clattn_ctx_create_from_queue with such a queue), else the times
 * call returns CLATTN_ERR_UNSUPPORTED. clattn_ctx_trace_kernels(ctx, 1) starts a new record
 * (dropping an old one), 0 stops and drops it. At most 4096 kernels are kept (later ones are
 * counted in `dropped`). */
typedef struct clattn_kernel_time {
    char name[48]; /* the kernel, e.g. "softmax_rows", "matmul", "flash_attention" */
    double ms;     /* device time, from its profiling event */
} clattn_kernel_time;
CLATTN_API clattn_status clattn_ctx_trace_kernels(clattn_ctx *ctx, int on);
/* Fills out[0 .. *count) with the recorded kernels in launch order (at most capacity; *count
 * says how many were written, *dropped (may be NULL) how many did not fit or were not kept),
 * then clears the record; tracing stays on. */
CLATTN_API clattn_status clattn_ctx_kernel_times(clattn_ctx *ctx, clattn_kernel_time *out,
                                                 size_t capacity, size_t *count, size_t *dropped);

/* Caps every device workspace buffer the context allocates at `bytes`
 * (CLATTN_WORKSPACE_UNLIMITED, the default: only the device's own limits; 0 is a cap of zero
 * bytes, so only calls that need no workspace run). A call whose workspace would exceed it fails
 * with CLATTN_ERR_TOO_LARGE, naming the size; the fused attention path needs no workspace. */
CLATTN_API clattn_status clattn_ctx_set_workspace_limit(clattn_ctx *ctx, size_t bytes);

/* Bytes of device workspace the context holds now (it grows to the largest call's need and is
 * kept for reuse until clattn_ctx_release). */
CLATTN_API size_t clattn_ctx_workspace_bytes(const clattn_ctx *ctx);

/* Self-validation (since 0.10). The first time a plan would use a kernel variant on the device,
 * the variant runs a small random problem that exercises its switches (awkward sizes, NaN-
 * poisoned outputs) and is compared with a float64 host reference. A variant that fails is not
 * used: its -cl-opt-disable build is tried, then the family's next variant (GPU or CPU fused ->
 * generic fused -> unfused), and a plan that nothing trusted fails with CLATTN_ERR_UNTRUSTED.
 * Outcomes are recorded per (device, driver version, platform version, clattn version, variant)
 * in $XDG_CACHE_HOME/clattn/validation (or ~/.cache/clattn/validation, or the file
 * CLATTN_VALIDATION_FILE names), so a later process on the same driver probes nothing again.
 * CLATTN_VALIDATE=off|first-use|always (default first-use; always probes every variant once
 * per context, ignoring the records). Test switch: CLATTN_FAULT_VARIANT=PATTERN[:wrong|:build|
 * :enqueue][,...] plants a fault in each variant whose "file:kernel@key options" contains
 * PATTERN: one wrong output element (-DCLATTN_FAULT_WRONG), a failed build, or
 * CL_OUT_OF_RESOURCES at every enqueue; validation must then catch it. */
typedef enum clattn_check {
    CLATTN_CHECK_PASSED = 0, /* probed now: within tolerance of the float64 reference */
    CLATTN_CHECK_RECORDED,   /* recorded good for this driver: used without a probe */
    CLATTN_CHECK_FAILED,     /* probed now, failed to build, or recorded bad: not used */
    CLATTN_CHECK_UNCHECKED   /* its features are beyond the probe (detail says which): used */
} clattn_check;
typedef struct clattn_validation {
    char variant[64];   /* "flash_cpu.cl:flash_cpu@3f9c0e12a4b5d678": file, kernel, options' key */
    char unit[32];      /* the probe: "flash attention", "matmul", "softmax rows", ... */
    char detail[192];   /* the failing step or element, or what went unchecked; else the options */
    clattn_check result;
    double max_error;   /* against the reference (0 when not probed) */
    double tolerance;   /* the bound the probe held it to */
    double milliseconds; /* the probe's wall time, host reference included (0: not probed) */
} clattn_validation;
/* The context's validation log, oldest first: copies min(capacity, total) entries into out and
 * returns the total (out may be NULL with capacity 0 to count). */
CLATTN_API size_t clattn_ctx_validations(const clattn_ctx *ctx, clattn_validation *out,
                                         size_t capacity);

/* Runs self-validation over every SDPA configuration family the device can build (F32, F16,
 * BF16; head sizes 16 to 256; masks, key padding, ALiBi, sinks, soft-capping, relu; prefill,
 * grouped decodes, paged and Q8_0/Q4_0 caches; the unfused path's matmuls and softmax rows,
 * softmax in double; rotary embeddings, a KV cache's copies; the backward), probing every
 * variant on ctx whatever the records say (`clattn doctor`,
 * `clattn.doctor()`). The entries are appended to the context's log (clattn_ctx_validations);
 * *checked counts them, *failed the failed ones plus plans that could not be made (either may
 * be NULL). json_path (may be NULL): the report as JSON (device, driver key, each case's
 * outcome, each variant's result, error, tolerance, time and detail). Since 0.10. */
CLATTN_API clattn_status clattn_doctor(clattn_ctx *ctx, const char *json_path, size_t *checked,
                                       size_t *failed);

/* Waits for all work enqueued through this context. */
CLATTN_API clattn_status clattn_finish(clattn_ctx *ctx);

/* ---------------------------------------------------------------------------------------------
 * Tensors
 * ------------------------------------------------------------------------------------------- */

/* Element types. 16-bit types are storage only: kernels convert them to float in registers
 * (vload_half, bit shifts), so no device needs cl_khr_fp16; arithmetic is float32.
 * U8 is for masks (boolean attention masks, key padding masks); I32 for key counts
 * (clattn_tensors.kv_seqlen). */
typedef enum clattn_dtype {
    CLATTN_DTYPE_F32 = 0,
    CLATTN_DTYPE_F16 = 1,
    CLATTN_DTYPE_BF16 = 2,
    CLATTN_DTYPE_U8 = 3,
    CLATTN_DTYPE_I32 = 4,
    /* Block types (since 0.8), llama.cpp's (ggml's) quantized formats byte for byte, for K and
     * V of SDPA plans (fused path) and KV caches: each 32 consecutive elements of a row are one
     * block. Q8_0: an fp16 scale d = amax / 127, then 32 int8 q = round(x / d) (half away
     * from zero); x = d * q; 34 bytes (block_q8_0). Q4_0: d = m / -8 (m the block's value of
     * largest magnitude, its sign kept), fp16, then 16 bytes, element j's q = min(15,
     * (int)(x / d + 8.5)) in the low nibble of byte j and element j + 16's in the high one;
     * x = (q - 8) * d; 18 bytes (block_q4_0). Tensors of them count elements, as every tensor:
     * the last dimension is a multiple of 32 with stride 1, the other strides and the offset
     * are multiples of 32 (whole blocks). clattn_quantize writes them on the device. */
    CLATTN_DTYPE_Q8_0 = 5,
    CLATTN_DTYPE_Q4_0 = 6,
    /* 8-bit floats (since 0.12), the OCP formats byte for byte, one byte an element, for K and
     * V of SDPA plans (fused path) and KV caches, as vLLM's fp8 KV cache: x = decode(code) *
     * scale with one float scale per tensor (clattn_sdpa_desc's k_scale, v_scale;
     * clattn_kv_cache_desc's). FP8_E4M3 is torch.float8_e4m3fn: sign, 4 exponent bits (bias
     * 7), 3 mantissa bits, no infinities, S.1111.111 NaN, largest finite 448, subnormals
     * m * 2^-9. FP8_E5M2 is torch.float8_e5m2: sign, 5 exponent bits (bias 15), 2 mantissa
     * bits, IEEE-like (exponent 31: infinities and NaNs), largest finite 57344, subnormals
     * m * 2^-16. The kernels decode every code exactly (integer arithmetic; NaN codes give
     * NaN). Encoding (clattn_quantize_scaled, KV cache appends) rounds x / scale to nearest
     * even and saturates: a finite value past the largest finite one gives it (+-448,
     * +-57344; torch's plain cast would give NaN in e4m3, vLLM clamps first), an infinity
     * gives +-448 in e4m3 and stays infinite in e5m2, NaN gives 0x7f (sign kept). */
    CLATTN_DTYPE_FP8_E4M3 = 7,
    CLATTN_DTYPE_FP8_E5M2 = 8
} clattn_dtype;

/* Bytes per element of dtype (0 for an unknown value and for the block types: 34 bytes per
 * 32 elements for Q8_0, 18 for Q4_0; 1 for the FP8 types). */
CLATTN_API size_t clattn_dtype_size(clattn_dtype dtype);

#define CLATTN_MAX_RANK 4

/* A strided view of a device buffer. rank 0 means "absent" wherever a tensor is optional.
 * Element (i0, .., i{rank-1}) lives at element offset + sum(i_d * strides[d]) of mem, counted
 * in elements of dtype (never bytes). Strides are always given (clattn_tensor_make gives packed
 * row-major ones): a stride of 0 repeats one element along that dimension (inputs only), and
 * strides all 0 on a tensor of more than one element are refused (until 0.7 they meant
 * packed). Every stride of an output must be nonzero where its dimension is above 1.
 * Plans are created from tensors' layouts (dtype, rank, dims, strides; mem and offset are
 * ignored there) and executed on tensors with the same layout and a buffer. */
typedef struct clattn_tensor {
    cl_mem mem;
    size_t offset; /* in elements */
    clattn_dtype dtype;
    int rank;
    size_t dims[CLATTN_MAX_RANK];
    size_t strides[CLATTN_MAX_RANK]; /* in elements */
} clattn_tensor;

/* A packed row-major tensor of rank 1 .. 4 (unused dims are ignored): its strides spelled
 * out (a stride that would overflow size_t is SIZE_MAX, which the plans then refuse). */
static inline clattn_tensor clattn_tensor_make(cl_mem mem, size_t offset, clattn_dtype dtype,
                                               int rank, size_t d0, size_t d1, size_t d2,
                                               size_t d3)
{
    clattn_tensor t = {mem, offset, dtype, rank, {d0, d1, d2, d3}, {0, 0, 0, 0}};
    size_t step = 1;
    for (int d = (rank < CLATTN_MAX_RANK ? rank : CLATTN_MAX_RANK) - 1; d >= 0; --d) {
        t.strides[d] = step;
        step = t.dims[d] != 0 && step > SIZE_MAX / t.dims[d] ? SIZE_MAX : step * t.dims[d];
    }
    return t;
}

/* ---------------------------------------------------------------------------------------------
 * Matrix product (one kernel; batched over up to two leading dimensions)
 *   C[..] = alpha * op(A[..]) * op(B[..]) + beta * C[..] + bias
 * a, b, c are tensors of rank 2 to 4: the last two dims are the matrix as stored (rows, cols),
 * leading dims are batch dims. op(A) is m x k: A is stored m x k, or k x m when trans_a (and
 * likewise B: k x n, or n x k when trans_b). C is m x n. Batch dims of A and B are 1 (one
 * matrix for every entry) or equal C's. The last dim of A, B and C must have stride 1 (the
 * kernels read rows); the others are free. bias (rank 1, n elements) is optional.
 * With beta == 0, C is not read (it may hold NaN).
 * ------------------------------------------------------------------------------------------- */
typedef struct clattn_matmul_desc {
    size_t struct_size; /* sizeof(clattn_matmul_desc) */
    int trans_a, trans_b;
    float alpha, beta;
} clattn_matmul_desc;

CLATTN_API clattn_status clattn_matmul(clattn_ctx *ctx, const clattn_matmul_desc *desc,
                                       const clattn_tensor *a, const clattn_tensor *b,
                                       const clattn_tensor *bias, const clattn_tensor *c,
                                       cl_uint num_wait, const cl_event *wait, cl_event *event);

/* ---------------------------------------------------------------------------------------------
 * Attention plans: validate once, execute many times.
 * ------------------------------------------------------------------------------------------- */

/* Named defaults (since 0.7; zero meant "the default" in these fields before, and is now
 * refused where it is not a valid value). The _init functions set them. */
#define CLATTN_KV_HEADS_ALL ((size_t)-1)    /* num_kv_heads: as many as query heads */
#define CLATTN_ROPE_WHOLE_HEAD ((size_t)-1) /* rope_dims, rotary_dim: every column of the head */
/* rope_base, base: RoFormer's and the sinusoidal encoding's 10000 */
#define CLATTN_ROPE_BASE_DEFAULT 10000.0
#define CLATTN_WORKSPACE_UNLIMITED ((size_t)-1) /* clattn_ctx_set_workspace_limit: no cap */

typedef enum clattn_norm {
    CLATTN_NORM_SOFTMAX = 0, /* exp(s - max) / sum exp(s - max) */
    CLATTN_NORM_RELU = 1     /* relu(s) / sum relu(s); a row with sum 0 gives zeros */
} clattn_norm;

/* Rotary embeddings' pairing of a row's columns (clattn_rope_desc, clattn_mha_desc.rope,
 * clattn_sdpa_desc.rope). */
typedef enum clattn_rope_style {
    CLATTN_ROPE_HALVES = 0, /* pairs (x[j], x[j + r/2]): GPT-NeoX, Llama (ONNX interleaved 0) */
    CLATTN_ROPE_PAIRS = 1   /* pairs (x[2j], x[2j + 1]): the RoFormer paper (interleaved 1) */
} clattn_rope_style;

/* Which attention kernels run. AUTO: the fused (flash) kernel whenever the caller does not ask
 * for the attention weights and the head sizes are at most 576 (256 before 0.12; 576 is
 * DeepSeek's absorbed multi-head latent attention, d_qk 576 and d_v 512: see the MLA note at
 * clattn_sdpa_desc), else the unfused path (matmul, softmax over the materialised scores,
 * matmul). FUSED: always fused (asking for the weights, or a head size over 576, is then an
 * error). UNFUSED: always unfused. The backward's fused kernels stop at 256. */
typedef enum clattn_path {
    CLATTN_PATH_AUTO = 0,
    CLATTN_PATH_FUSED = 1,
    CLATTN_PATH_UNFUSED = 2
} clattn_path;

/* Where the causal diagonal sits when seq_q != seq_k: query i sees keys j <= i + offset.
 * TOP_LEFT: offset 0 (PyTorch's is_causal).
 * BOTTOM_RIGHT: offset n - seq_q, n = the batch's key count (kv_seqlen[b] when given, else
 * seq_k): the queries are the last rows of the sequence, as in decoding with a KV cache
 * (PyTorch's causal_lower_right, FlashAttention's causal).
 * ONNX (SDPA plans only): ONNX Attention's rule: offset = the past length P when past_k is
 * given, else kv_seqlen[b] - seq_q when kv_seqlen is given, else 0.
 * OFFSET (SDPA plans only): offset = clattn_sdpa_desc.diag_offset, any value, the same for
 * every batch: a block of queries at global positions q0 .. against a block of keys at
 * k0 .. takes diag_offset = q0 - k0 (ring attention's blocks; since 0.6).
 * The sliding window (clattn_sdpa_desc.window_align) takes the same offsets. */
typedef enum clattn_causal {
    CLATTN_CAUSAL_NONE = 0,
    CLATTN_CAUSAL_TOP_LEFT = 1,
    CLATTN_CAUSAL_BOTTOM_RIGHT = 2,
    CLATTN_CAUSAL_ONNX = 3,
    CLATTN_CAUSAL_OFFSET = 4
} clattn_causal;

/* The tensor roles: the indices of the array that the plan descriptors' `by_role` and
 * clattn_plan_execute take, each with a count (since 0.7). Roles are appended in later
 * versions; an array of an earlier version's count leaves the newer roles absent, and no
 * descriptor field moves when a role is added. */
typedef enum clattn_role {
    CLATTN_ROLE_Q = 0,
    CLATTN_ROLE_K,
    CLATTN_ROLE_V,
    CLATTN_ROLE_OUT,
    CLATTN_ROLE_ATTN_MASK,
    CLATTN_ROLE_KEY_PADDING_MASK,
    CLATTN_ROLE_WEIGHTS,
    CLATTN_ROLE_LSE,
    CLATTN_ROLE_IN_PROJ_WEIGHT,
    CLATTN_ROLE_IN_PROJ_BIAS,
    CLATTN_ROLE_Q_WEIGHT,
    CLATTN_ROLE_K_WEIGHT,
    CLATTN_ROLE_V_WEIGHT,
    CLATTN_ROLE_Q_BIAS,
    CLATTN_ROLE_K_BIAS,
    CLATTN_ROLE_V_BIAS,
    CLATTN_ROLE_OUT_WEIGHT,
    CLATTN_ROLE_OUT_BIAS,
    CLATTN_ROLE_KV_SEQLEN,
    CLATTN_ROLE_PAST_K,
    CLATTN_ROLE_PAST_V,
    CLATTN_ROLE_PRESENT_K,
    CLATTN_ROLE_PRESENT_V,
    CLATTN_ROLE_SCORES,
    CLATTN_ROLE_ALIBI_SLOPES,
    CLATTN_ROLE_POS_TABLE,
    CLATTN_ROLE_ROPE_COS,
    CLATTN_ROLE_ROPE_SIN,
    CLATTN_ROLE_POSITION_IDS,
    CLATTN_ROLE_SCORE_WEIGHT,
    CLATTN_ROLE_SINKS,       /* since 0.8 */
    CLATTN_ROLE_BLOCK_TABLE, /* since 0.8 */
    CLATTN_ROLE_CU_SEQLENS_Q, /* since 0.8 */
    CLATTN_ROLE_CU_SEQLENS_K, /* since 0.8 */
    /* the backward (clattn_sdpa_backward_plan_create), since 0.8: */
    CLATTN_ROLE_GRAD_OUT,       /* dO, the loss's gradient by out */
    CLATTN_ROLE_GRAD_Q,         /* dQ */
    CLATTN_ROLE_GRAD_K,         /* dK */
    CLATTN_ROLE_GRAD_V,         /* dV */
    CLATTN_ROLE_GRAD_ATTN_MASK, /* a float attn_mask's gradient */
    CLATTN_ROLE_GRAD_SINKS,     /* the attention sinks' gradient */
    /* user score functions (clattn_flex_desc), since 0.9: */
    CLATTN_ROLE_FLEX_AUX0, /* the auxiliary tensors the source reads by name */
    CLATTN_ROLE_FLEX_AUX1,
    CLATTN_ROLE_FLEX_AUX2,
    CLATTN_ROLE_FLEX_AUX3,
    CLATTN_ROLE_BLOCK_MASK, /* U8 (batch|1, heads|1, query blocks, key blocks) */
    CLATTN_ROLE_T5_BIAS,    /* F32 (t5_num_buckets, heads): T5's relative_attention_bias */
    CLATTN_ROLE_COUNT /* the roles this version knows */
} clattn_role;

/* The tensors of a plan by role, as an array (by_role, indexed by clattn_role) and by name
 * (q, k, ...: the same storage; C11's anonymous members). It is not part of any descriptor:
 * descriptors and clattn_plan_execute take a pointer to the array and a count, so the union
 * may grow with new roles without moving anything (pass CLATTN_ROLE_COUNT, as
 * CLATTN_BIND_ROLES does). Plans are created from the layouts and executed on tensors with
 * buffers; a tensor absent (rank 0) at creation must be absent at execution.
 *
 * Masks (both optional; a row whose keys are all masked gives all-zero weights, never NaN):
 * - attn_mask: rank 1 to 4, dims broadcast (numpy rules, right-aligned, dims of 1 repeat)
 *   to (batch, heads, seq_q, seq_k). Float types (F32, F16, BF16) are added to the scaled
 *   scores (-INFINITY masks); U8 is boolean: nonzero = the key takes part, 0 = masked
 *   (PyTorch's scaled_dot_product_attention and ONNX's convention).
 * - key_padding_mask: U8 (batch, seq_k), nonzero = ignore that key (nn.MultiheadAttention's
 *   convention).
 *
 * SDPA: q (batch, heads, seq_q, head_dim_qk), k (batch, kv_heads, seq_k, head_dim_qk),
 *   v (batch, kv_heads, seq_k, head_dim_v), out (batch, heads, seq_q, head_dim_v), any strides
 *   (a (batch, seq, heads * head_dim) buffer is the view dims (B, H, L, d), strides
 *   (L*H*d, d, H*d, 1)). kv_heads = heads, or a divisor of it (grouped-query attention; 1 is
 *   multi-query): query head h then attends with k/v head h / (heads / kv_heads), read where it
 *   lies (never copied). softcap > 0 caps each scaled score s to softcap * tanh(s / softcap) before
 *   the masks (clattn_sdpa_desc.softcap). weights (F32, batch, heads, seq_q, seq_k) and lse (F32,
 * batch, heads, seq_q: the log-sum-exp of each row's masked, scaled scores, -INFINITY for a fully
 * masked row; with the relu normalisation, the log of the row's normaliser) are optional outputs.
 *   kv_seqlen (optional, I32, (batch)): the keys of batch b are 0 .. kv_seqlen[b] - 1 (ONNX's
 *   nonpad_kv_seqlen; a static KV cache's fill level), read on the device at execution, so a
 *   plan made for a cache's capacity serves every step; values are clamped to [0, seq_k]. The
 *   fused path never reads keys or values past the count; the unfused one multiplies those
 *   values by zero weights, so they must be finite (clattn_kv_cache zero-fills its buffers).
 *   past_k (batch, kv_heads, P, head_dim_qk) and past_v (batch, kv_heads, P, head_dim_v)
 *   (optional, together; ONNX's past_key/past_value): the keys and values before k and v.
 *   present_k/present_v (batch, kv_heads, P + seq_k, ...) then receive past and new, written
 *   on the device, and attention runs over all P + seq_k keys (seq_k in the rule above means
 *   that total). present_k/present_v may be given without past (a copy of k and v).
 *
 * ALiBi (SDPA and MHA; optional): alibi_slopes, F32 (heads) or (batch, heads), one slope m per
 *   query head; the score of key j in query row i gains -m * |i + n - seq_q - j|, n = the
 *   batch's key count (kv_seqlen[b] when given, else all keys, past included): the distance
 *   from the row's position when the queries are the last rows (bottom-right, as
 *   FlashAttention's alibi_slopes; with causal masking it is ALiBi's -m * (i - j)). Added with
 *   the masks, after soft-capping. clattn_alibi_slopes gives the slopes of the ALiBi paper.
 *
 * Attention sinks (SDPA and MHA; optional; GPT-OSS): sinks, F32 (heads), one learned logit
 *   per query head that joins each row's softmax denominator and takes no value:
 *   w_ij = exp(s_ij - m) / (sum_j exp(s_ij - m) + exp(sinks[h] - m)), m the max over the row's
 *   scores and the sink. So a row's weights sum to less than 1, and a row whose keys are all
 *   masked gives zeros (its lse is the sink). With every mask, window, causal form, GQA,
 *   kv_seqlen, the KV cache and both paths; read on the device at execution; -INFINITY is no
 *   sink. Softmax only (CLATTN_ERR_UNSUPPORTED with CLATTN_NORM_RELU). Since 0.8.
 *
 * A paged KV cache (SDPA only; optional; FlashAttention's flash_attn_with_kvcache layout, as
 *   vLLM keeps it): block_table, I32 (batch, blocks), makes k and v pools of pages,
 *   k (num_pages, page_size, kv_heads, head_dim_qk) and v (num_pages, page_size, kv_heads,
 *   head_dim_v), any strides and any page_size >= 1; key j of batch b is slot j % page_size
 *   of page block_table[b, j / page_size]. A sequence's pages need not be contiguous nor in
 *   order, and batches may share pages. kv_seqlen (I32 (batch)) is then required: batch b
 *   attends keys 0 .. kv_seqlen[b] - 1, clamped to blocks * page_size (seq_k in the rules
 *   above is blocks * page_size, so causal BOTTOM_RIGHT puts the queries at the end of each
 *   sequence). Block indices are read on the device: a sequence's keys end at its first
 *   index outside 0 .. num_pages - 1, and no page outside the pool is read. The fused path
 *   only (weights, scores and softmax_f64 are refused, as are past_k/present_k and rope).
 *   Since 0.8.
 *
 * Multi-head latent attention (DeepSeek V2/V3, Kimi K2; MLA) in its absorbed form (SDPA;
 *   since 0.12): q (batch, heads, seq_q, 576) holds [q_nope W_UK[h]^T, q_rope] per query head
 *   (512 latent + 64 rotary columns); k is the latent cache, one KV head for all the query
 *   heads: (batch, 1, keys, 576) rows [c, k_rope], or a paged pool (num_pages, page_size, 1,
 *   576) with block_table; v is a view of k's storage, its first 512 columns: the same
 *   buffer, offset and strides with dims[3] = 512 (k and v may be the same cl_mem); out
 *   (batch, heads, seq_q, 512) is the latent output, which the caller maps by W_UV[h].
 *   Give scale explicitly: 1/sqrt(d_nope + d_rope) (DeepSeek: 1/sqrt(192)), not the default
 *   1/sqrt(576). A cache row is 576 elements: 2304 bytes per token in F32, 1152 in F16, 612 in
 *   Q8_0 (18 blocks; the view is 16 whole blocks). Decoding (seq_q 1) takes the query heads
 *   as the rows of the latent head (grouped-query decoding), so each key tile is read once per
 *   work-group for all heads. The fused path only (head sizes past 256 have no fused
 *   backward).
 *
 * Packed variable-length batches (SDPA only; optional; FlashAttention's varlen functions):
 *   cu_seqlens_q and cu_seqlens_k, I32 (batch + 1) with unit stride, given together, make q
 *   (total_q, heads, head_dim_qk), k (total_k, kv_heads, head_dim_qk), v (total_k, kv_heads,
 *   head_dim_v) and out (total_q, heads, head_dim_v) rank 3, any strides, and lse (F32,
 *   optional) (heads, total_q). Sequence b is the query rows cu_seqlens_q[b] ..
 *   cu_seqlens_q[b + 1] - 1 and the keys cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1; it
 *   attends only within itself and no work is spent on other sequences' keys or on padding.
 *   The rules above apply per sequence: seq_q and seq_k are its own lengths (causal
 *   BOTTOM_RIGHT and ONNX's rule put its queries at the end of its keys; ALiBi's n is its
 *   key count). clattn_sdpa_desc.max_seqlen_q / max_seqlen_k bound the lengths (0: the
 *   totals; the launch is sized by them). The offsets are read on the device at execution;
 *   offsets that decrease or pass the totals are clamped (an offset to 0 .. total, an end to
 *   at least its start, a length to the max), so nothing outside the tensors is read or
 *   written, but the rows such a sequence loses are not written either: check them where
 *   they are made (the CLI and the Python package refuse them with the index named). With
 *   GQA, causal forms, windows, softcap, ALiBi ((heads) or (batch, heads)), sinks, relu,
 *   f16/bf16 and quantized k/v. The fused path only: attn_mask, key_padding_mask, kv_seqlen,
 *   block_table, past/present, weights, scores, softmax_f64 and rope are refused.
 *   Since 0.8.
 *
 * Packed queries over a paged cache (SDPA only; optional; chunked prefill and a mixed batch
 *   of decoding and prefilling requests in one launch; FlashAttention's flash_attn_varlen_func
 *   with block_table, vLLM's seqused_k): cu_seqlens_q with block_table and kv_seqlen, and no
 *   cu_seqlens_k. q (total_q, heads, head_dim_qk), out (total_q, heads, head_dim_v) and lse
 *   (heads, total_q) are packed as above (request b's rows cu_seqlens_q[b] ..
 *   cu_seqlens_q[b + 1] - 1: one for a decoding request, a chunk's for a prefilling one); k
 *   and v are the paged cache's pools, block_table (batch, blocks) and kv_seqlen (batch) as
 *   for a paged cache, batch = cu_seqlens_q's dim 0 - 1: request b attends its first
 *   kv_seqlen[b] keys (a chunk's own keys written to its pages before the attention, by the
 *   caller's append). The rules apply per request with seq_q its rows and seq_k its key
 *   count: causal BOTTOM_RIGHT puts its rows at the end of its keys (the chunk's last row
 *   sees every key of its request; offset kv_seqlen[b] - rows). One launch of the fused
 *   kernel, whose work-groups are numbered over all requests' row blocks (each request gets
 *   the groups its rows need, at most one more: no padding to the longest). With GQA,
 *   softcap and sinks (tested), and not refusing the paged cache's other options (windows,
 *   ALiBi, relu, 16-bit and quantized pools: the same kernel code, not yet tested here).
 *   Refused: cu_seqlens_k (kv_seqlen counts the keys), max_seqlen_k (unused: give 0), the
 *   unfused path, attn_mask, key_padding_mask, past/present, weights, scores, softmax_f64,
 *   rope and the backward (clattn_sdpa_backward_plan_create refuses a paged cache). Since 0.12.
 *
 * MHA: query (batch, seq_q, embed_dim), key (batch, seq_k, kdim), value (batch, seq_k, vdim),
 *   out (batch, seq_q, out_dim). Weights as matrices (see clattn_weight_layout): q_weight maps
 *   embed_dim to qk_dim, k_weight kdim to qk_dim, v_weight vdim to v_dim, out_weight v_dim to
 *   out_dim; biases rank 1. Or in_proj_weight (PyTorch's packed (3E, E), layout TORCH) with
 *   in_proj_bias (3E). out_weight absent: out is the concatenated heads (out_dim = v_dim).
 *   Grouped-query projections (num_kv_heads = G, a divisor of num_heads, separate weights):
 *   k_weight maps kdim to qk_dim / num_heads * G and v_weight vdim to v_dim / num_heads * G
 *   (Llama's k_proj and v_proj); qk_dim and v_dim stay the query side's widths, and query
 *   head h attends with k/v head h / (num_heads / G).
 *   weights: (batch, num_heads, seq_q, seq_k) for CLATTN_WEIGHTS_PER_HEAD or
 *   (batch, seq_q, seq_k) for CLATTN_WEIGHTS_AVERAGED, F32. The same buffer may be bound to
 *   query, key and value (self-attention). */
typedef union clattn_tensors {
    clattn_tensor by_role[CLATTN_ROLE_COUNT]; /* by_role[CLATTN_ROLE_Q] is q, and so on */
    struct {
        clattn_tensor q, k, v, out;
        clattn_tensor attn_mask, key_padding_mask;
        clattn_tensor weights, lse;
        clattn_tensor in_proj_weight, in_proj_bias;
        clattn_tensor q_weight, k_weight, v_weight;
        clattn_tensor q_bias, k_bias, v_bias;
        clattn_tensor out_weight, out_bias;
        /* SDPA only (see above): per-batch key counts, and the KV cache's past and present. */
        clattn_tensor kv_seqlen;
        clattn_tensor past_k, past_v, present_k, present_v;
        clattn_tensor scores;       /* SDPA only: the scores before normalisation (clattn_scores) */
        clattn_tensor alibi_slopes; /* ALiBi: F32 (heads) or (batch, heads) (see above) */
        clattn_tensor pos_table;    /* positional-encoding plans: a learned table (max_len, dim) */
        /* rotary plans: cos and sin caches and I32 position ids (clattn_rope_desc) */
        clattn_tensor rope_cos, rope_sin, position_ids;
        clattn_tensor score_weight; /* additive plans: w, the scores' final linear map */
        clattn_tensor sinks;        /* attention sinks: F32 (heads) (see above) */
        clattn_tensor block_table;  /* SDPA only: a paged KV cache's I32 (batch, blocks) */
        /* SDPA only: packed variable-length batches' I32 (batch + 1) offsets (see above) */
        clattn_tensor cu_seqlens_q, cu_seqlens_k;
        /* the backward's (clattn_sdpa_backward_plan_create): dO, then the gradients it gives */
        clattn_tensor grad_out, grad_q, grad_k, grad_v, grad_attn_mask, grad_sinks;
        /* user score functions (clattn_flex_desc): auxiliary tensors and the block mask */
        clattn_tensor flex_aux0, flex_aux1, flex_aux2, flex_aux3, block_mask;
        clattn_tensor t5_bias; /* T5's relative-position bias table (clattn_sdpa_desc.t5_*) */
    };
} clattn_tensors;

/* Binds the tensors `t` (a clattn_tensors) to a plan descriptor: desc.by_role = t.by_role,
 * desc.num_roles = CLATTN_ROLE_COUNT. */
#define CLATTN_BIND_ROLES(desc, t)                                                                 \
    ((desc).by_role = (t).by_role, (desc).num_roles = (size_t)CLATTN_ROLE_COUNT)

/* The ALiBi paper's slopes for `heads` heads into slopes[0 .. heads - 1]: with n the largest
 * power of two <= heads, head h < n gets 2^(-max_bias (h + 1) / n), and the heads past n take
 * the odd terms of the 2n-head sequence, 2^(-max_bias (2 (h - n) + 1) / (2 n)) (BLOOM's rule;
 * max_bias 8 is the paper's and MPT's default). CLATTN_ERR_INVALID_ARGUMENT for heads 0, a NULL
 * slopes or a max_bias that is not finite and positive. */
CLATTN_API clattn_status clattn_alibi_slopes(size_t heads, float max_bias, float *slopes);

/* What the optional SDPA output `scores` (F32, (batch, heads, seq_q, keys), unfused path
 * only) receives: ONNX Attention's qk_matmul_output, modes 0 to 2 (mode 3, the probabilities,
 * is the `weights` output). */
typedef enum clattn_scores {
    CLATTN_SCORES_SCALED = 0, /* scale * q kᵀ */
    CLATTN_SCORES_CAPPED = 1, /* after soft-capping (= SCALED without softcap) */
    CLATTN_SCORES_MASKED = 2  /* after soft-capping, the masks and the key rules (-inf where a
                               * key is dropped): what the normalisation takes */
} clattn_scores;

/* Scaled dot-product attention: out = normalise(scale * q kᵀ + masks) v, per (batch, head).
 * Start from clattn_sdpa_desc_init (struct_size and every default), then bind the tensors. */
/* User score and mask functions (PyTorch's FlexAttention on OpenCL), since 0.9: OpenCL C
 * source built into the plan's own kernels, forward and backward, fused and unfused. The
 * source defines any of
 *     float score_mod(float score, int b, int h, int q_idx, int kv_idx);
 *     int   mask_mod(int b, int h, int q_idx, int kv_idx);   nonzero: the key is kept
 *     float score_mod_grad(float score, int b, int h, int q_idx, int kv_idx);
 * (bool may stand for int) and says which in the flags. score is the scaled, soft-capped
 * score plus ALiBi's bias (the built-ins come first; a float attn_mask is added after
 * score_mod); q_idx is the query row within its sequence, kv_idx the key's index (a packed
 * sequence's or a paged cache's own). mask_mod joins the keep test (band, padding, bool mask);
 * neither function is called for keys outside the row's band or past its key count.
 * score_mod_grad is d score_mod / d score, which the backward needs (a backward plan with
 * score_mod but without it is refused). Auxiliary tensors: aux_names[i] (a C identifier)
 * names the tensor bound in role CLATTN_ROLE_FLEX_AUX0 + i (F32, I32 or U8, rank 1-4,
 * contiguous row-major), which the functions read as `__global const float *` (int, uchar)
 * at flat element indices; they are constants (no gradient), copied into the plan's
 * workspace at each execution. Helper functions the source defines cannot see them unless
 * passed. Identical source and names build the same programs once per context.
 * Block masks (role CLATTN_ROLE_BLOCK_MASK, U8 (batch or 1, heads or 1, ceil(seq_q /
 * block_q), ceil(seq_k / block_k)), contiguous: 0 empty, 1 partial, 2 full;
 * clattn_flex_block_mask makes one from a mask_mod): the fused kernels skip every tile whose
 * blocks are all empty and call mask_mod only on tiles with a partial block. A block mask
 * must agree with mask_mod (an "empty" block whose keys mask_mod keeps loses them). With
 * count_tiles 1 the fused kernels count the tiles they visit (clattn_plan_tiles_visited).
 * A build error returns CLATTN_ERR_BUILD with the compiler's log, the source's lines numbered
 * as its own, in the file "score_mod" (score_mod:LINE). Not with additive attention, nor with
 * decode's grouped heads (grouped-query decoding then runs a row per query head). */
enum { CLATTN_FLEX_AUX_MAX = 4 };
typedef enum clattn_flex_flags {
    CLATTN_FLEX_SCORE_MOD = 1,
    CLATTN_FLEX_MASK_MOD = 2,
    CLATTN_FLEX_SCORE_MOD_GRAD = 4
} clattn_flex_flags;
typedef struct clattn_flex_desc {
    const char *source;  /* NULL or "": no user functions */
    unsigned functions;  /* clattn_flex_flags: what the source defines */
    const char *aux_names[CLATTN_FLEX_AUX_MAX];
    size_t block_q, block_k; /* the block mask's block sizes (with a block mask) */
    int count_tiles;
} clattn_flex_desc;

typedef struct clattn_sdpa_desc {
    size_t struct_size;
    /* The tensors' layouts by role (clattn_role): by_role[r] for r < num_roles; roles past
     * num_roles are absent (see CLATTN_BIND_ROLES). */
    const clattn_tensor *by_role;
    size_t num_roles;
    clattn_causal causal;
    float scale; /* NAN: 1/sqrt(head_dim_qk); any other value is used as given */
    clattn_norm norm;
    clattn_path path;
    float softcap; /* 0: off; > 0: each scaled score s becomes softcap * tanh(s / softcap)
                    * before the masks (Gemma 2's attention soft-capping, ONNX Attention's
                    * softcap attribute). Finite, >= 0. */
    /* Sliding window (Mistral, Gemma; ONNX's left_window_size/right_window_size): with
     * window_align other than NONE, query i sees keys j with p - window_left <= j and
     * j <= p + window_right, p = i + the alignment's offset (clattn_causal); a negative size
     * leaves that side unbounded. With causal too, both must use the same alignment. */
    clattn_causal window_align;
    long long window_left, window_right;
    clattn_scores scores_mode; /* what the scores role receives, when it is given */
    /* 1: the normalisation runs in double precision (ONNX's softmax_precision = DOUBLE): the
     * unfused path only (AUTO takes it; FUSED is refused), on devices with cl_khr_fp64
     * (CLATTN_ERR_UNSUPPORTED elsewhere). 0: float. */
    int softmax_f64;
    /* Rotary embeddings (clattn_rope_desc's rules, angles computed) on every head of q and of
     * the new keys k, before attention: rope 1 turns them on; query row i and key row j sit at
     * positions rope_start + i and rope_start + j (a decode step after P tokens: rope_start =
     * P). q and k are left as they are: the plan rotates copies in the workspace (F32).
     * past_k is taken as rotated already (a cache holds rotated keys), and present_k receives
     * past_k then the rotated new keys. Not with kv_seqlen (there k is the whole cache: rotate
     * keys as they are appended, with a rotary plan). rope_dims: CLATTN_ROPE_WHOLE_HEAD (the
     * default), else even and at most head_dim_qk; rope_base: CLATTN_ROPE_BASE_DEFAULT (10000)
     * by default, finite and > 0; positions below 2^24. */
    int rope;
    clattn_rope_style rope_style;
    size_t rope_dims;
    double rope_base;
    size_t rope_start;
    /* The diagonal of CLATTN_CAUSAL_OFFSET (causal and window_align): query i sees keys
     * j <= i + diag_offset (causal). Any value: past the keys on either side it leaves every
     * row all keys, or none (a row with no key gives zeros and lse -INFINITY). With a
     * window the edges are i + diag_offset - window_left and i + diag_offset + window_right,
     * summed exactly (window sizes as large as the diagonal cancel it). Unused with the other
     * alignments. Since 0.6. */
    long long diag_offset;
    /* Packed variable-length batches (cu_seqlens_q/_k given): the most query rows and keys a
     * sequence has (FlashAttention's max_seqlen_q/_k); 0: total_q / total_k. At least 1 and
     * at most the total; a sequence longer is cut to it. Since 0.8. */
    size_t max_seqlen_q, max_seqlen_k;
    /* Dropout on the attention weights (training; torch's dropout_p), in the forward and the
     * backward alike: after normalisation each weight w_ij of query head h of batch b is kept
     * with probability 1 - dropout_p and scaled by 1 / (1 - dropout_p), or zeroed; the row's
     * normaliser and lse are the undropped row's (the backward recomputes the mask from the
     * same fields, so give the backward plan the forward's). 0: off (the default); at most 1
     * (1 zeroes every weight). Which weights are kept is a pure function of (dropout_seed,
     * dropout_offset, b, h, i, j), the same on every device: Philox 4x32-10 with key
     * dropout_seed (low word first), counter (j / 4, i, low and high word of
     * dropout_offset + b * heads + h), whose output word j % 4, as an unsigned 32-bit
     * integer u, keeps the weight when u >= floor(dropout_p * 2^32) (clattn_dropout_keep
     * computes it on the host). dropout_offset advanced by batch * heads gives the next call
     * fresh streams under one seed. The weights output (path UNFUSED) receives the dropped
     * weights, as torch's nn.MultiheadAttention returns them. Not with packed sequences
     * (cu_seqlens), a paged cache, or quantized k/v. Since 0.8. */
    double dropout_p;
    unsigned long long dropout_seed, dropout_offset;
    /* User score and mask functions (see clattn_flex_desc). Since 0.9. */
    clattn_flex_desc flex;
    /* T5's relative-position buckets (Raffel et al. 2020; HF's T5Attention), on when the
     * t5_bias role is bound (F32 (t5_num_buckets, heads), the relative_attention_bias
     * weight): each score gets t5_bias[bucket(j - (i + seq_k - seq_q)), h], the bucket of the
     * key's distance from the query's position: t5_num_buckets in all (2 to 4096; half per
     * side when t5_bidirectional is 1, else only keys before the query count), exact up to
     * half of a side's buckets, then logarithmic up to t5_max_distance (below which the
     * exact buckets must end). No defaults: give all three (T5: 32, 128, 1 in the encoder, 0
     * in the decoder); T5 uses scale 1. A score function (flex.c) built into the same hook
     * as clattn_flex_desc's, so it takes one of its CLATTN_FLEX_AUX_MAX auxiliary slots;
     * its gradient by the score is 1 (the table gets none). Not with packed sequences.
     * Since 0.9. */
    size_t t5_num_buckets, t5_max_distance;
    int t5_bidirectional;
    int reserved_; /* (0.11's tail padding, never read: a field there would take an older
                    * caller's padding bytes as its value) */
    /* FP8 k and v (CLATTN_DTYPE_FP8_E4M3, _E5M2): their per-tensor scales, vLLM's k_scale and
     * v_scale: a key's element is decode(code) * k_scale, a value's decode(code) * v_scale.
     * 0 (the default) means 1; else finite and > 0, and other than 1 only with that operand
     * in FP8 (CLATTN_ERR_INVALID_ARGUMENT otherwise). The fused kernels fold k_scale into the score
     * scale and v_scale into the output's normalisation: neither costs a multiply per
     * element. Since 0.12. */
    double k_scale, v_scale;
    /* 1: a plan for a KV cache's decode steps in one launch (clattn_kv_cache_decode: the cache's
     * append fused into the attention); 0 (the default): off. The plan's tensors are the cache's
     * (clattn_kv_cache_tensors, kv_seqlen required) and one query row (seq_q = 1); refused
     * (CLATTN_ERR_UNSUPPORTED) with attn_mask, key_padding_mask, dropout, user score functions,
     * rope, past/present, weights and path UNFUSED. Causal forms, windows, softcap, ALiBi,
     * sinks, GQA, relu and paged caches all take it. clattn_plan_execute runs such a plan as
     * any other (attention over the cache, no append). Since 0.12. */
    int kv_step;
} clattn_sdpa_desc;

typedef enum clattn_weight_layout {
    /* Textbook: y = x·W with W stored d_in x d_out. */
    CLATTN_LAYOUT_XW = 0,
    /* PyTorch nn.Linear / nn.MultiheadAttention: y = x·Wᵀ with W stored d_out x d_in. */
    CLATTN_LAYOUT_TORCH = 1
} clattn_weight_layout;

typedef enum clattn_need_weights {
    CLATTN_WEIGHTS_NONE = 0,
    CLATTN_WEIGHTS_PER_HEAD = 1, /* (batch, heads, seq_q, seq_k) */
    CLATTN_WEIGHTS_AVERAGED = 2  /* (batch, seq_q, seq_k), the mean over heads (PyTorch default) */
} clattn_need_weights;

/* Multi-head attention: Q = query·Wq + bq, K = key·Wk + bk, V = value·Wv + bv, heads of
 * qk_dim/num_heads and v_dim/num_heads, attention per head, out = concat·Wo + bo. */
typedef struct clattn_mha_desc {
    size_t struct_size;
    /* The tensors' layouts by role (clattn_role): by_role[r] for r < num_roles; roles past
     * num_roles are absent (see CLATTN_BIND_ROLES). */
    const clattn_tensor *by_role;
    size_t num_roles;
    size_t num_heads;
    size_t num_kv_heads; /* heads of K and V (grouped-query attention): a divisor of num_heads;
                          * CLATTN_KV_HEADS_ALL (the default) means num_heads (0 is refused).
                          * Other than num_heads: separate weights only */
    clattn_weight_layout layout;
    clattn_causal causal;
    float scale; /* NAN: 1/sqrt(qk_dim / num_heads) */
    clattn_norm norm;
    clattn_need_weights need_weights;
    clattn_path path; /* AUTO: fused unless the weights are wanted */
    /* As clattn_sdpa_desc's: soft-capping and the sliding window (MHA takes the alignments
     * NONE, TOP_LEFT and BOTTOM_RIGHT). */
    float softcap;
    clattn_causal window_align;
    long long window_left, window_right;
    /* Rotary embeddings (clattn_rope_desc's rules, angles computed) on every head of the
     * projected q and k, before attention: rope 1 turns them on; query row i and key row j sit
     * at positions rope_start + i and rope_start + j. rope_dims and rope_base as
     * clattn_sdpa_desc's. */
    int rope;
    clattn_rope_style rope_style;
    size_t rope_dims;
    double rope_base;
    size_t rope_start;
} clattn_mha_desc;

/* Fill *desc with the defaults: struct_size, scale = NAN, num_kv_heads = CLATTN_KV_HEADS_ALL,
 * rope_dims = CLATTN_ROPE_WHOLE_HEAD, rope_base = CLATTN_ROPE_BASE_DEFAULT, the rest zero. */
CLATTN_API void clattn_sdpa_desc_init(clattn_sdpa_desc *desc);
CLATTN_API void clattn_mha_desc_init(clattn_mha_desc *desc);

typedef struct clattn_plan clattn_plan;

/* Validate the descriptor once, choose kernels, variants and launch geometry, build (or fetch
 * from the context's cache) the programs and size the workspace. The plan keeps a reference
 * to ctx: release plans before their context. */
CLATTN_API clattn_status clattn_sdpa_plan_create(clattn_ctx *ctx, const clattn_sdpa_desc *desc,
                                                 clattn_plan **out);
CLATTN_API clattn_status clattn_mha_plan_create(clattn_ctx *ctx, const clattn_mha_desc *desc,
                                                clattn_plan **out);
/* The backward pass of SDPA (training): the gradients of a loss L by q, k and v (and by a
 * float attn_mask, and by the attention sinks) from dO = dL/d out, FlashAttention-2's way: the
 * weights are recomputed from q, k and the forward's lse, never stored, so memory is linear in
 * the sequence. The descriptor is the forward's (clattn_sdpa_desc: the same rule, scale,
 * softcap, causal form, window, norm), its tensors those of the forward plus:
 * - lse (required on the fused path): the forward's F32 (batch, heads, seq_q) log-sum-exp
 *   (the forward's optional lse output, from the same inputs and rule; its relu form too);
 * - out (required): the forward's output; grad_out (required): dO, out's dims, any float
 *   dtype and strides;
 * - grad_q, grad_k, grad_v (required): q's, k's and v's dims, any float dtype and strides;
 *   accumulated in float32. With grouped-query heads, grad_k and grad_v sum the group's
 *   query heads;
 * - grad_attn_mask (optional; a float attn_mask only): the mask's dims (1 where broadcast,
 *   summed over those), any float dtype;
 * - grad_sinks (optional; with sinks): F32 (heads).
 * Taken from the forward: attn_mask (bool or float, any broadcast rank), key_padding_mask,
 * kv_seqlen, alibi_slopes and sinks (their gradients are 0 but the sinks' and the float
 * mask's), every causal alignment and window, GQA, softcap, relu. Refused
 * (CLATTN_ERR_UNSUPPORTED): past/present, rope, a paged cache, weights, scores, quantized
 * k/v. Packed variable-length batches (cu_seqlens_q/_k, max_seqlen_q/_k as the forward's;
 * since 0.8) on the fused path: q, k, v, out as the forward's packed rank-3 tensors, lse
 * (required) F32 (heads, total_q), grad_out and grad_q (total_q, heads, d), grad_k and
 * grad_v (total_k, kv_heads, d), any float dtype and strides; each sequence within itself,
 * with GQA, every causal form and window (per sequence), softcap, ALiBi, sinks (grad_sinks
 * sums every sequence's rows), relu, f16/bf16; masks, key padding, kv_seqlen (hence
 * grad_attn_mask), dropout and path UNFUSED are refused with them. The offsets must cover
 * the totals as FlashAttention's do (0, non-decreasing, ending at each total; no sequence
 * longer than its max_seqlen): the gradients of rows or keys no sequence holds are
 * unspecified (nothing outside the tensors is written). Dropout (dropout_p, _seed, _offset: the
 * forward's) is regenerated, not stored. Deterministic: no atomics; the same
 * inputs give the same bits. The workspace holds delta (dO . out per row) and, with
 * grad_attn_mask, the (batch, heads, seq_q, seq_k) score gradient. Since 0.8.
 * The path (desc.path): FUSED as above (head sizes up to 256); UNFUSED the reference path
 * (since 0.8): the textbook's matmuls (Q K^T, dO V^T, dX K, dX^T Q, (P Z)^T dO) around the
 * whole (batch, heads, seq_q, seq_k) matrices, the weights recomputed by the forward's own
 * softmax kernel (so it takes softmax_f64, needs no lse but for grad_sinks, and any head
 * size; q, k, v and grad_out need stride 1 along head_dim); its workspace holds three such
 * float matrices. AUTO: FUSED unless softmax_f64, no lse or a head size past 256. */
CLATTN_API clattn_status clattn_sdpa_backward_plan_create(clattn_ctx *ctx,
                                                          const clattn_sdpa_desc *desc,
                                                          clattn_plan **out);

/* Dropout's keep decision (clattn_sdpa_desc.dropout_p), as every device computes it: 1 when
 * the weight of query row `row` and key `key` in stream `stream` (dropout_offset + b * heads
 * + h) is kept, 0 when it is zeroed; -1 for a dropout_p outside [0, 1] or rows or keys past
 * 2^32 - 1. For checking a device or rebuilding the mask on the host. Since 0.8. */
CLATTN_API int clattn_dropout_keep(double dropout_p, unsigned long long seed,
                                   unsigned long long stream, size_t row, size_t key);

/* The tiles the fused kernels visited in the plan's last execution with flex.count_tiles
 * (clattn_flex_desc), read from `workspace` (NULL: the context's) once that execution has
 * finished (wait for its event first). tile_rows and tile_keys (may be NULL) receive the
 * kernel's tile: a tile is tile_rows query rows of one (batch, head) against tile_keys keys.
 * Since 0.9. */
CLATTN_API clattn_status clattn_plan_tiles_visited(clattn_plan *plan, cl_mem workspace,
                                                   unsigned long long *tiles, size_t *tile_rows,
                                                   size_t *tile_keys);

/* A block mask from a mask_mod, on the device (PyTorch's create_block_mask): block (b, h, qb,
 * kb) of out (U8 (batch, heads, ceil(seq_q / block_q), ceil(seq_k / block_k)), contiguous) is
 * 0 when mask_mod keeps no (q, k) of it, 2 when it keeps every one (inside seq_q x seq_k),
 * else 1. flex: its source (CLATTN_FLEX_MASK_MOD), aux_names, and the auxiliary tensors in
 * aux[0 .. 3] (as clattn_flex_desc's roles); block_q, block_k: the sizes. Enqueued on the
 * context's queue after `wait`. Since 0.9. */
typedef struct clattn_block_mask_desc {
    size_t struct_size;
    clattn_flex_desc flex;
    const clattn_tensor *aux; /* CLATTN_FLEX_AUX_MAX tensors; rank 0: absent */
    size_t batch, heads, seq_q, seq_k;
    clattn_tensor out;
} clattn_block_mask_desc;
CLATTN_API void clattn_block_mask_desc_init(clattn_block_mask_desc *desc);
CLATTN_API clattn_status clattn_flex_block_mask(clattn_ctx *ctx, const clattn_block_mask_desc *desc,
                                                cl_uint num_wait, const cl_event *wait,
                                                cl_event *event);

/* Speculative decoding's tree mask (since 0.12): fills `flex` (source, CLATTN_FLEX_MASK_MOD,
 * aux_names; the rest untouched) with a mask_mod that lets each draft token see the cached
 * prefix and its own ancestors in the draft tree. Bind two auxiliary tensors:
 *   CLATTN_ROLE_FLEX_AUX0 tree_bits, U8 (bytes): per sequence b with n_b > 0 drafts, an n_b x
 *     n_b bit matrix, row-major, bit (i, j) = 1 when draft j is draft i or an ancestor of it,
 *     at bit (i * n_b + j) of the sequence's bytes, least significant bit first
 *     (FlashInfer's packed custom_mask, np.packbits(..., bitorder="little"), for the draft
 *     block only), starting at byte tree_meta[b, 2];
 *   CLATTN_ROLE_FLEX_AUX1 tree_meta, I32 (batch, 3): the sequence's first draft key (its
 *     committed length), its draft count n_b (0: no tree: every key is kept, as for a decoding
 *     or prefilling sequence of a mixed batch) and the byte offset of its bits.
 * Query row i of sequence b is draft i: it keeps keys below tree_meta[b, 0] and draft key
 * tree_meta[b, 0] + j where bit (i, j) is set; rows past n_b keep the prefix only. It joins
 * the other rules (causal, key counts): with causal BOTTOM_RIGHT, drafts numbered parents
 * first keep exactly their ancestors. clattn_kv_commit then keeps the accepted path. */
#define CLATTN_TREE_MASK_SOURCE                                                                    \
    "int mask_mod(int b, int h, int q_idx, int kv_idx)\n"                                          \
    "{\n"                                                                                         \
    "    const int start = tree_meta[3 * b], n = tree_meta[3 * b + 1];\n"                          \
    "    if (kv_idx < start || n == 0)\n"                                                         \
    "        return 1;\n"                                                                         \
    "    const int j = kv_idx - start;\n"                                                         \
    "    if (j >= n || q_idx >= n)\n"                                                             \
    "        return 0;\n"                                                                         \
    "    const int bit = q_idx * n + j;\n"                                                        \
    "    return (tree_bits[tree_meta[3 * b + 2] + (bit >> 3)] >> (bit & 7)) & 1;\n"               \
    "}\n"
CLATTN_API void clattn_flex_tree_mask(clattn_flex_desc *flex);

/* NULL is a no-op. */
CLATTN_API void clattn_plan_release(clattn_plan *plan);

/* Bytes of device workspace an execution needs (0 when none). */
CLATTN_API size_t clattn_plan_workspace_size(const clattn_plan *plan);
/* Whether the plan runs the fused kernel. */
CLATTN_API int clattn_plan_is_fused(const clattn_plan *plan);
/* What the plan runs, in one line owned by the plan: the path and kernel with its geometry,
 * why the tuning's preferred kernel was passed over (if it was), the phase (prefill or decode)
 * and the tuning records (rows with @selectors, see `clattn info`) that chose its parameters.
 * For reading, not parsing. */
CLATTN_API const char *clattn_plan_info(const clattn_plan *plan);

/* Enqueues the planned steps on `queue` (NULL: the context's queue; another queue must belong
 * to the context's cl_context and device) after `num_wait` events, binding the tensors
 * by_role[0 .. num_roles) (indexed by clattn_role; the roles past num_roles are absent, and one
 * this version does not know must be absent; clattn_tensors' by_role and CLATTN_ROLE_COUNT
 * bind them all): every tensor present in the plan must be present with the same layout and a
 * buffer large enough for offset + the highest element its strides reach. `workspace` (NULL: the
 * context's) holds at least clattn_plan_workspace_size bytes; executions that run concurrently need
 * their own. When event is not NULL it receives an event for the whole execution (the caller
 * releases it). Executions on one context are not thread-safe (as every call on a context). */
CLATTN_API clattn_status clattn_plan_execute(clattn_plan *plan, const clattn_tensor *by_role,
                                             size_t num_roles, cl_command_queue queue,
                                             cl_mem workspace, cl_uint num_wait,
                                             const cl_event *wait, cl_event *event);

/* ---------------------------------------------------------------------------------------------
 * Positional encodings: self-attention has no notion of order, so position p's row gets a
 * vector PE(p) added (Attention Is All You Need's sinusoidal table, or a table the model
 * learned). Plans like the attention ones, executed with clattn_plan_execute.
 * ------------------------------------------------------------------------------------------- */

typedef enum clattn_posenc_kind {
    /* PE(pos, 2k) = sin(pos / base^(2k / dim)), PE(pos, 2k + 1) = cos(pos / base^(2k / dim));
     * an odd dim ends with a sine. Positions below 2^24; the angle is reduced in extended
     * precision, so the values are within about 1e-6 of the exact ones at any position. */
    CLATTN_POSENC_SINUSOIDAL = 0,
    /* PE(pos, i) = pos_table[pos, i]: a learned table (max_len, dim), any float dtype and
     * strides; start + seq must not exceed max_len. */
    CLATTN_POSENC_TABLE = 1
} clattn_posenc_kind;

/* out = x + PE(start + p) on each row p, or out = PE(start + p) without x.
 * Roles: q is x (rank 2 (seq, dim), 3 (batch, seq, dim) or 4 (.., .., seq, dim); optional),
 * out the result (x's dims, or any rank 2 to 4 without x; required; may be x itself: in
 * place), pos_table the TABLE kind's table; no other tensor. Start from
 * clattn_posenc_desc_init. */
typedef struct clattn_posenc_desc {
    size_t struct_size;
    /* The tensors' layouts by role (clattn_role): by_role[r] for r < num_roles; roles past
     * num_roles are absent (see CLATTN_BIND_ROLES). */
    const clattn_tensor *by_role;
    size_t num_roles;
    clattn_posenc_kind kind;
    size_t start; /* the position of row 0 (decoding: the tokens before this block) */
    double base;  /* SINUSOIDAL: the wavelengths' base (CLATTN_ROPE_BASE_DEFAULT = 10000 by
                   * default); finite and > 0 */
} clattn_posenc_desc;

CLATTN_API void clattn_posenc_desc_init(clattn_posenc_desc *desc);
CLATTN_API clattn_status clattn_posenc_plan_create(clattn_ctx *ctx, const clattn_posenc_desc *desc,
                                                   clattn_plan **out);

/* ---------------------------------------------------------------------------------------------
 * Rotary position embeddings (RoPE; ONNX's RotaryEmbedding): the first rotary_dim columns of
 * each row of q or k rotated pair by pair by angles that grow with the row's position, so
 * that q.k depends on the positions' difference only.
 * ------------------------------------------------------------------------------------------- */

/* out = RoPE(x). Row (b, h, s) at position pos = position_ids[b, s] (when given; negative
 * ids count as 0) or start + s: pair j < r / 2 (r = rotary_dim) turns by t_j,
 * (x1, x2) -> (x1 cos t_j - x2 sin t_j, x1 sin t_j + x2 cos t_j); columns past r are copied.
 * t_j = pos * base^(-2j / r), computed on the device (angle reduced as the sinusoidal
 * encoding's: within about 1e-6 for positions below 2^24), or read from caches rope_cos and
 * rope_sin (same dims and dtype): (max_pos, r / 2) rows by position (with position_ids;
 * positions past the last row read the last row), or (batch, seq, r / 2) per row (without).
 * tensors: q is x, (batch, heads, seq, head_dim) any strides and float dtype (a (B, S, H*d)
 * buffer is the view (B, H, S, d) with strides (S*H*d, d, H*d, 1)); out the same dims (may be
 * x: in place); position_ids I32 (batch, seq). */
typedef struct clattn_rope_desc {
    size_t struct_size;
    /* The tensors' layouts by role (clattn_role): by_role[r] for r < num_roles; roles past
     * num_roles are absent (see CLATTN_BIND_ROLES). */
    const clattn_tensor *by_role;
    size_t num_roles;
    clattn_rope_style style;
    size_t rotary_dim; /* CLATTN_ROPE_WHOLE_HEAD (default): head_dim; else even, <= head_dim */
    double base;       /* computed angles: CLATTN_ROPE_BASE_DEFAULT by default; finite, > 0 */
    size_t start;      /* without position_ids: the position of row 0 */
} clattn_rope_desc;

CLATTN_API void clattn_rope_desc_init(clattn_rope_desc *desc);
CLATTN_API clattn_status clattn_rope_plan_create(clattn_ctx *ctx, const clattn_rope_desc *desc,
                                                 clattn_plan **out);

/* ---------------------------------------------------------------------------------------------
 * Additive attention (Bahdanau et al. 2015): the score of query i and key j is a small network
 * of both rather than their dot product.
 * ------------------------------------------------------------------------------------------- */

/* Per head h (of H = num_heads, 0 meaning 1), with P1 = q·W1_h + b1_h and P2 = k·W2_h + b2_h:
 *
 *   s[b,h,i,j] = sum_c w_h[c] tanh(P1[b,i,c] + P2[b,j,c]),  c < da
 *
 * then the masks, the causal rule and the normalisation of dot-product attention (no scale),
 * and out[b,i,h-th block] = sum_j weights[b,h,i,j] v[b,j,h-th block], the blocks being dv / H
 * columns of v and out (one head: all of them). The projections run once (the matmul); the
 * scores are formed tile by tile without the (seq_q, seq_k, da) tensor, and the fused path
 * (flash.cl's additive variant) never stores the (seq_q, seq_k) scores either.
 * tensors:
 *   q (batch, seq_q, dq) or (seq_q, dq), k (batch, seq_k, dk), v (batch, seq_k, dv) (ranks
 *   equal; any float dtype; stride 1 along features), out (batch, seq_q, dv);
 *   q_weight = W1: (dq, H * da) (head h: columns h * da ..) or (H, dq, da); k_weight = W2:
 *   (dk, H * da) or (H, dk, da); stride 1 along their last dim;
 *   q_bias = b1, k_bias = b2 (optional): (H * da) or (H, da), packed F32;
 *   score_weight = w: (H * da) or (H, da), F32, any strides;
 *   attn_mask, key_padding_mask (clattn_tensors' rules, over (batch, H, seq_q, seq_k));
 *   weights (optional, unfused path): (batch, H, seq_q, seq_k) F32.
 * Start from clattn_additive_desc_init. */
typedef struct clattn_additive_desc {
    size_t struct_size;
    /* The tensors' layouts by role (clattn_role): by_role[r] for r < num_roles; roles past
     * num_roles are absent (see CLATTN_BIND_ROLES). */
    const clattn_tensor *by_role;
    size_t num_roles;
    size_t num_heads;     /* at least 1 (the default: one head) */
    clattn_causal causal; /* NONE, TOP_LEFT or BOTTOM_RIGHT */
    clattn_norm norm;
    clattn_path path; /* AUTO: fused unless the weights are wanted or da, dv / H exceed 576 */
} clattn_additive_desc;

CLATTN_API void clattn_additive_desc_init(clattn_additive_desc *desc);
CLATTN_API clattn_status clattn_additive_plan_create(clattn_ctx *ctx,
                                                     const clattn_additive_desc *desc,
                                                     clattn_plan **out);

/* ---------------------------------------------------------------------------------------------
 * KV caches for decoding: keys and values of a fixed capacity in device buffers, appended to
 * on the device (no reallocation while within capacity), with their fill level as a kv_seqlen
 * tensor on the device. An SDPA plan made once from clattn_kv_cache_tensors (causal
 * BOTTOM_RIGHT or ONNX: query i of the step sees keys up to length - seq_q + i) serves every
 * step: the fused kernel skips the keys past the length, and with few query rows against many
 * keys splits them over work-groups (decode splits). One fill level for every batch entry.
 *
 * Paged mode (page_size > 0, since 0.8): keys and values live in pools of pages, (num_pages,
 * page_size, kv_heads, head_dim) each as plans take them (FlashAttention's
 * flash_attn_with_kvcache dims; stored head-major within a page, strides (kv_heads *
 * page_size * d, d, page_size * d, 1): a head's keys of a page lie together), and
 * a block table (batch, ceil(capacity / page_size)) int32 says which page holds each
 * sequence's keys j*page_size .. (j+1)*page_size - 1 (-1: none yet). An append that reaches
 * an unmapped block takes the lowest free page of the pool (the built-in allocator), unless
 * the caller has mapped the block first (clattn_kv_cache_map_pages). Reset unmaps every block.
 * Plans attend through the table: bind clattn_kv_cache_block_table's tensor to
 * CLATTN_ROLE_BLOCK_TABLE (fused path only, as every paged plan). An append that maps new
 * pages writes the table to the device with a blocking write (once per page_size steps).
 * ------------------------------------------------------------------------------------------- */

typedef struct clattn_kv_cache clattn_kv_cache;

/* Zero-initialise and set struct_size = sizeof(clattn_kv_cache_desc) (clattn_kv_cache_desc_init
 * does). dtype: storage of keys and values, F32, F16 or BF16 (0: F32). capacity: keys per
 * sequence. page_size: 0 = contiguous (batch, kv_heads, capacity, head_dim) buffers; >= 1 =
 * paged (since 0.8), with num_pages pages in the pool (0: batch * ceil(capacity / page_size),
 * room for every sequence to fill). */
typedef struct clattn_kv_cache_desc {
    size_t struct_size;
    size_t batch, kv_heads, capacity, head_dim_qk, head_dim_v;
    clattn_dtype dtype;
    size_t page_size, num_pages; /* since 0.8 */
    /* dtype FP8_E4M3 or FP8_E5M2 (since 0.12): appends store the new keys as
     * encode(k / k_scale) and values as encode(v / v_scale) (see clattn_dtype); give plans
     * over the cache the same scales (clattn_sdpa_desc's k_scale, v_scale). 0 (the default)
     * means 1; else finite and > 0, and other than 1 only with an FP8 dtype. */
    double k_scale, v_scale;
} clattn_kv_cache_desc;

CLATTN_API void clattn_kv_cache_desc_init(clattn_kv_cache_desc *desc);
/* Allocates (batch, kv_heads, capacity, head_dim) keys and values and the lengths on ctx's
 * device; the cache starts empty. Keeps ctx: release caches before their context. */
CLATTN_API clattn_status clattn_kv_cache_create(clattn_ctx *ctx, const clattn_kv_cache_desc *desc,
                                                clattn_kv_cache **out);
/* NULL is a no-op. */
CLATTN_API void clattn_kv_cache_release(clattn_kv_cache *cache);
/* Copies k (batch, kv_heads, n, head_dim_qk) and v (batch, kv_heads, n, head_dim_v), any float
 * dtype and strides, after the cache's keys on the context's queue and advances the length by
 * n (the device's copy too). More than capacity - length keys: CLATTN_ERR_INVALID_SHAPE, the
 * cache unchanged. Asynchronous, as every device call. */
CLATTN_API clattn_status clattn_kv_cache_append(clattn_kv_cache *cache, const clattn_tensor *k,
                                                const clattn_tensor *v, cl_uint num_wait,
                                                const cl_event *wait, cl_event *event);
/* A decode step in one launch (since 0.12): appends k_new (batch, kv_heads, 1, head_dim_qk)
 * and v_new (batch, kv_heads, 1, head_dim_v) to the cache and runs `plan`, an SDPA plan made
 * with kv_step = 1 on the cache's tensors (clattn_sdpa_desc.kv_step), on by_role[0 ..
 * num_roles) (q, out and the cache's k, v, kv_seqlen and block table, as
 * clattn_kv_cache_tensors and clattn_kv_cache_block_table give them) over the cache's keys
 * and the new one, in one kernel: the fused kernel reads the new key and value from k_new and
 * v_new and writes them into the cache (and its length), so no launch waits on another. The
 * length advances by 1. k_new, v_new: any strides, q's dtype. The same result in two launches
 * (clattn_kv_cache_append, then clattn_plan_execute) where the plan's kernel has no step:
 * flash_cpu.cl has it in this version (GPU devices and the portable kernel do not), for F32,
 * F16 and BF16 caches (not Q8_0/Q4_0), k_new and v_new in q's dtype. Refused
 * (CLATTN_ERR_INVALID_ARGUMENT): a NULL argument, a plan without kv_step, by_role's k, v,
 * kv_seqlen or block table not the cache's; CLATTN_ERR_INVALID_SHAPE: a full cache, k_new
 * or v_new of other dims. workspace as clattn_plan_execute's. */
CLATTN_API clattn_status clattn_kv_cache_decode(clattn_kv_cache *cache, clattn_plan *plan,
                                                const clattn_tensor *k_new,
                                                const clattn_tensor *v_new,
                                                const clattn_tensor *by_role, size_t num_roles,
                                                cl_mem workspace, cl_uint num_wait,
                                                const cl_event *wait, cl_event *event);
/* Empties the cache (the length, on the host and the device). */
CLATTN_API clattn_status clattn_kv_cache_reset(clattn_kv_cache *cache, cl_uint num_wait,
                                               const cl_event *wait, cl_event *event);
/* Keys filled so far (0 for NULL). */
CLATTN_API size_t clattn_kv_cache_length(const clattn_kv_cache *cache);
/* The cache as an SDPA plan's tensors (any may be NULL): k and v over the whole capacity
 * (batch, kv_heads, capacity, head_dim) and kv_seqlen (batch), I32, the fill level. Valid as
 * long as the cache. */
CLATTN_API void clattn_kv_cache_tensors(const clattn_kv_cache *cache, clattn_tensor *k,
                                        clattn_tensor *v, clattn_tensor *kv_seqlen);
/* Paged mode: the block table, (batch, ceil(capacity / page_size)) I32 on the device, for
 * CLATTN_ROLE_BLOCK_TABLE (k and v of clattn_kv_cache_tensors are then the pools). A
 * contiguous cache (or NULL) gives an absent tensor (rank 0). Valid as long as the cache. */
CLATTN_API void clattn_kv_cache_block_table(const clattn_kv_cache *cache, clattn_tensor *table);
/* Paged mode: the caller gives pages. table: host (batch, ceil(capacity / page_size)) int32,
 * row-major; entry [b, j] >= 0 maps sequence b's block j to that page of the pool, -1 leaves
 * the block as it is (mapped or not). Refused (CLATTN_ERR_INVALID_ARGUMENT, naming the entry,
 * nothing changed): an entry below -1 or at or past num_pages, a page that two blocks would
 * hold, a block that holds keys already (below the length) mapped to another page, a
 * contiguous cache. Appends fill the caller's pages; blocks still unmapped get the
 * allocator's. Writes the table to the device (blocking) after the wait list. */
CLATTN_API clattn_status clattn_kv_cache_map_pages(clattn_kv_cache *cache, const int32_t *table,
                                                   cl_uint num_wait, const cl_event *wait,
                                                   cl_event *event);

/* Quantizes src (F32, F16 or BF16, rank 1 to 4, any strides) into dst (Q8_0 or Q4_0, the same
 * dims; its last dimension a multiple of 32) on the device, with llama.cpp's reference
 * rounding (see clattn_dtype): a ggml user's blocks, byte for byte. For SDPA plans' k and v
 * and for handing float caches over. Asynchronous, on the context's queue. */
CLATTN_API clattn_status clattn_quantize(clattn_ctx *ctx, const clattn_tensor *src,
                                         const clattn_tensor *dst, cl_uint num_wait,
                                         const cl_event *wait, cl_event *event);

/* ---- Speculative decoding: keeping the accepted draft tokens (since 0.12) ------------------
 * A verification step writes each sequence's draft tokens' keys and values after its committed
 * keys (draft token t of sequence b at key kv_seqlen[b] + t) and attends over them with a tree
 * mask; clattn_kv_commit then keeps the accepted path's rows and drops the rest, on the
 * device: for i = 0, 1, .. key kv_seqlen[b] + accepted[b, i] moves to kv_seqlen[b] + i, and
 * kv_seqlen[b] grows by the number of entries taken. A sequence's list ends at its first
 * entry that is not above the one before it (the first: not >= 0; -1 pads a short list), not
 * below draft_len, or whose rows lie outside the cache (past its capacity, or in a block with
 * no page of the pool): the entries are read on the device, and a bad one ends the list rather
 * than writing outside the cache. A path of a tree whose tokens are numbered parents first
 * rises, as the rule asks. A sequence whose kv_seqlen is negative is left alone. Rows after
 * the new count keep what they held (they are past the key count, which every plan reads).
 *
 * k: keys, contiguous (batch, kv_heads, capacity, head_dim_qk) or, with block_table, a pool of
 * pages (num_pages, page_size, kv_heads, head_dim_qk) as SDPA plans take them; any storage type
 * (F32, F16, BF16, Q8_0, Q4_0), any strides but stride 1 along head_dim (rows move as bytes).
 * v: values, the same form with head_dim_v, or absent (rank 0: keys only, e.g. multi-head latent
 * attention's one latent cache whose values are a view of its keys). k and v must not overlap.
 * block_table: I32 (batch, blocks), or absent for a contiguous cache. kv_seqlen: I32 (batch),
 * read and advanced in place. accepted: I32 (batch, max_accepted). draft_len >= 1: the draft
 * tokens written after each sequence's keys. Two launches (the moves, then the counts), on the
 * context's queue after the wait list. */
typedef struct clattn_kv_commit_desc {
    size_t struct_size;
    clattn_tensor k, v, block_table, kv_seqlen, accepted;
    size_t draft_len;
} clattn_kv_commit_desc;

CLATTN_API void clattn_kv_commit_desc_init(clattn_kv_commit_desc *desc);
CLATTN_API clattn_status clattn_kv_commit(clattn_ctx *ctx, const clattn_kv_commit_desc *desc,
                                          cl_uint num_wait, const cl_event *wait,
                                          cl_event *event);

/* ---------------------------------------------------------------------------------------------
 * Attention states and shared prefixes (cascade attention). Since 0.12.
 * ------------------------------------------------------------------------------------------- */

/* Merges two partial attention results of the same query rows over disjoint sets of keys,
 * (o_a, lse_a) and (o_b, lse_b), into the result over their union (FlashInfer's merge_state;
 * ring attention's and the decode splits' step): per row, with m = max(lse_a, lse_b) and
 * w_x = exp(lse_x - m),
 *   o = (w_a o_a + w_b o_b) / (w_a + w_b),   lse = m + log(w_a + w_b).
 * lse is the natural-log log-sum-exp, as the SDPA plans' lse output gives it (FlashInfer's
 * kernels give base 2 by default: multiply theirs by ln 2 first). It is associative, and a
 * side with lse = -INFINITY (no key) changes nothing: the other side's o (converted to o's
 * dtype) and lse are copied bit for bit, the empty side's o is not read; both empty give zeros
 * and -INFINITY. Tensors:
 *   o_a, o_b, o: rank 2 to 4, (rows.., head_dim), the same dims, any float dtype and strides
 *   (FlashInfer's (seq_len, heads, head_dim), or an SDPA out (batch, heads, seq_q, head_dim));
 *   lse_a, lse_b, lse: F32, o_a's dims without head_dim ((seq_len, heads); (batch, heads,
 *   seq_q)), any strides. lse may be NULL or absent (rank 0): not written.
 * In place: o may be o_a or o_b (the same buffer, offset, dtype and strides), lse likewise
 * lse_a or lse_b; other overlaps of an output with an input are undefined. Each dimension
 * below 2^32 (CLATTN_ERR_UNSUPPORTED). One launch on the context's queue after `wait`. */
CLATTN_API clattn_status clattn_merge_states(clattn_ctx *ctx, const clattn_tensor *o_a,
                                             const clattn_tensor *lse_a, const clattn_tensor *o_b,
                                             const clattn_tensor *lse_b, const clattn_tensor *o,
                                             const clattn_tensor *lse, cl_uint num_wait,
                                             const cl_event *wait, cl_event *event);

/* Cascade decoding: a batch of B requests whose sequences all begin with one prefix of P keys,
 * stored once (a system prompt), each followed by its own suffix. A step attends the prefix as
 * ONE problem, every request's query rows against the one prefix (per kv head, the rows of
 * its group of query heads for all B requests as one batch: q viewed so through its strides,
 * or, with grouped heads, copied so first; no causal rule: the rows are after the prefix),
 * each suffix per request (an SDPA plan over the caller's suffix cache), and merges the two
 * states (clattn_merge_states), so each kv head's prefix keys and values are read once per
 * step, not once per request. The result is attention of each row over its prefix and suffix
 * keys together.
 * Tensors (mem and offset ignored at creation; execution binds the same layouts):
 *   q (B, H, 1, head_dim_qk): one decoding row per request (more rows are refused);
 *   prefix_k (1, Hkv, P, head_dim_qk), prefix_v (1, Hkv, P, head_dim_v): any float or block
 *   dtype and strides (an SDPA plan's k and v of batch 1);
 *   k, v, kv_seqlen, block_table: the suffixes, as an SDPA plan takes them: (B, Hkv, S, d)
 *   with optional kv_seqlen (I32 (B), a request's suffix keys 0 .. kv_seqlen[b] - 1, 0 for
 *   none), or a paged pool with block_table and kv_seqlen (clattn_tensors' rules);
 *   out (B, H, 1, head_dim_v), any float dtype; lse (optional) F32 (B, H, 1): the whole
 *   row's log-sum-exp.
 * Hkv divides H (GQA, as SDPA's). scale NAN: 1/sqrt(head_dim_qk). No masks or other score
 * modifiers (the parts would need them alike). Scratch: (2 B H head_dim_v + 2 B H) floats of
 * device memory the cascade holds (B H head_dim_qk more with grouped heads); the two SDPA
 * plans use the context's workspace. Start from clattn_cascade_desc_init. */
typedef struct clattn_cascade_desc {
    size_t struct_size;
    clattn_tensor q;
    clattn_tensor prefix_k, prefix_v;
    clattn_tensor k, v, kv_seqlen, block_table;
    clattn_tensor out, lse;
    float scale;
} clattn_cascade_desc;
typedef struct clattn_cascade clattn_cascade;
CLATTN_API void clattn_cascade_desc_init(clattn_cascade_desc *desc);
/* Validates the layouts, makes the prefix's and the suffixes' SDPA plans and the merge; an
 * error names the part ("cascade (the shared prefix): ..."). Keeps ctx: release first. */
CLATTN_API clattn_status clattn_cascade_create(clattn_ctx *ctx, const clattn_cascade_desc *desc,
                                               clattn_cascade **out);
/* One step: the prefix, the suffixes and the merge (three enqueues; a copy of q first with
 * grouped heads) on the context's queue after `wait`, on `tensors` (the creation's layouts with
 * buffers). Steps of one cascade share its scratch, so they run one after another (as the
 * context's calls do). */
CLATTN_API clattn_status clattn_cascade_execute(clattn_cascade *cascade,
                                                const clattn_cascade_desc *tensors,
                                                cl_uint num_wait, const cl_event *wait,
                                                cl_event *event);
/* NULL is a no-op. */
CLATTN_API void clattn_cascade_release(clattn_cascade *cascade);

/* As clattn_quantize, and dst may be FP8_E4M3 or FP8_E5M2 (any strides, the same dims as
 * src): dst = encode(src / scale), rounded to nearest even and saturated (see clattn_dtype),
 * vLLM's scaled fp8 cast with its per-tensor scale. scale 0 means 1; else finite and > 0;
 * block destinations (Q8_0, Q4_0) take only 0 or 1 (their scales are per block). Since
 * 0.12. */
CLATTN_API clattn_status clattn_quantize_scaled(clattn_ctx *ctx, const clattn_tensor *src,
                                                const clattn_tensor *dst, float scale,
                                                cl_uint num_wait, const cl_event *wait,
                                                cl_event *event);

/* ---------------------------------------------------------------------------------------------
 * Host-pointer API: packed float32 arrays in and out; synchronous. Built on plans.
 * ------------------------------------------------------------------------------------------- */

/* Host masks: attn_mask seq_q x seq_k floats (added), key_padding_mask batch x seq_k bytes
 * (nonzero = ignore the key), alibi_slopes heads floats (ALiBi, see clattn_tensors); NULL =
 * none. */
typedef struct clattn_host_masks {
    const float *attn_mask;
    const uint8_t *key_padding_mask;
    const float *alibi_slopes;
} clattn_host_masks;

/* Shapes of packed (batch, heads, seq, head_dim) q, k, v, out; weights (batch, heads, seq_q,
 * seq_k) may be NULL. struct_size = sizeof(clattn_attention_host_desc); scale NAN = default. */
typedef struct clattn_attention_host_desc {
    size_t struct_size;
    size_t batch, heads, seq_q, seq_k, head_dim_qk, head_dim_v;
    clattn_causal causal;
    float scale;
    clattn_norm norm;
    clattn_path path;
    float softcap; /* soft-capping and the sliding window, as clattn_sdpa_desc's */
    clattn_causal window_align;
    long long window_left, window_right;
} clattn_attention_host_desc;

CLATTN_API void clattn_attention_host_desc_init(clattn_attention_host_desc *desc);
CLATTN_API clattn_status clattn_attention_host(clattn_ctx *ctx,
                                               const clattn_attention_host_desc *desc,
                                               const float *q, const float *k, const float *v,
                                               const clattn_host_masks *masks, float *out,
                                               float *weights);

/* Packed query (batch, seq_q, embed_dim), key (batch, seq_k, kdim), value (batch, seq_k, vdim),
 * out (batch, seq_q, embed_dim), or (.., v_dim) without out_weight. Zero dims mean: kdim, vdim,
 * qk_dim, v_dim = embed_dim. */
typedef struct clattn_mha_host_desc {
    size_t struct_size;
    size_t batch, seq_q, seq_k;
    size_t embed_dim, num_heads;
    size_t kdim, vdim, qk_dim, v_dim;
    clattn_weight_layout layout;
    size_t num_kv_heads; /* CLATTN_KV_HEADS_ALL (default): num_heads; else grouped-query
                          * projections (see clattn_mha_desc) */
    clattn_causal causal;
    float scale;
    clattn_norm norm;
    clattn_need_weights need_weights;
    clattn_path path;
    float softcap; /* soft-capping and the sliding window, as clattn_mha_desc's */
    clattn_causal window_align;
    long long window_left, window_right;
    int rope; /* rotary embeddings, as clattn_mha_desc's */
    clattn_rope_style rope_style;
    size_t rope_dims;
    double rope_base;
    size_t rope_start;
    /* Nonzero: masks->attn_mask is (batch * num_heads, seq_q, seq_k) (PyTorch's 3-d mask, one
     * matrix per batch entry and head, head fastest), not one (seq_q, seq_k) for all. */
    int attn_mask_per_head;
} clattn_mha_host_desc;

typedef struct clattn_mha_host_weights {
    const float *in_proj_weight, *in_proj_bias;
    const float *q_weight, *k_weight, *v_weight;
    const float *q_bias, *k_bias, *v_bias;
    const float *out_weight, *out_bias;
} clattn_mha_host_weights;

CLATTN_API void clattn_mha_host_desc_init(clattn_mha_host_desc *desc);
/* key NULL means the query (self-attention); value NULL means the key. attn_weights may be
 * NULL when need_weights is NONE. */
CLATTN_API clattn_status clattn_mha_forward_host(clattn_ctx *ctx, const clattn_mha_host_desc *desc,
                                                 const clattn_mha_host_weights *weights,
                                                 const float *query, const float *key,
                                                 const float *value,
                                                 const clattn_host_masks *masks, float *out,
                                                 float *attn_weights);

#ifdef __cplusplus
}
#endif

#endif /* CLATTN_H */
