/*
 * clattn: scaled dot-product and multi-head attention on any OpenCL 1.2+ device.
 *
 * Conventions
 * - Every matrix is row-major float32. Sizes are size_t; offsets into cl_mem buffers are counted
 *   in elements (floats, or bytes for uint8 masks), never in bytes. Each single dimension must
 *   fit in 32 bits (the kernels index with cl_uint within a matrix); larger ones give
 *   CLATTN_ERR_UNSUPPORTED, and sizes whose element or byte counts overflow size_t give
 *   CLATTN_ERR_OVERFLOW.
 * - Every fallible call returns clattn_status (CLATTN_SUCCESS = 0). Negative values above
 *   CLATTN_ERROR_BASE are OpenCL's own error codes passed through; the library's own codes lie
 *   at and below CLATTN_ERROR_BASE. clattn_last_error(ctx) holds a message naming the argument or
 *   OpenCL call that failed.
 * - The caller owns what it passes in (queues, buffers, events). clattn retains what it keeps and
 *   releases what it retained. Device calls are asynchronous: they enqueue work on the context's
 *   queue after `num_wait` events and, when `event` is not NULL, return an event that completes
 *   when the whole call's work has finished (the caller releases it). In-order and out-of-order
 *   queues both work: clattn chains its own kernels with events.
 * - Host calls (suffix _host) are synchronous: they copy float arrays in, compute, copy out and
 *   wait. Device workspace is kept in the context and reused across calls; it only grows.
 *
 * Thread safety
 * - A clattn_ctx is not thread-safe: use one context per thread, or serialise calls on a shared
 *   context yourself. Distinct contexts may be used concurrently, including contexts made from
 *   the same cl_command_queue's context. clattn has no global mutable state.
 * - clattn_status_string() is thread-safe.
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
#define CLATTN_VERSION_MINOR 1
#define CLATTN_VERSION_PATCH 0
#define CLATTN_VERSION_STRING "0.1.0"

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
    CLATTN_ERR_TOO_LARGE = -2056         /* a buffer would exceed the device's allocation limit */
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

/* Releases everything the context holds. NULL is a no-op. Waits for the context's queued
 * work to finish first. */
CLATTN_API void clattn_ctx_release(clattn_ctx *ctx);

/* The last error message recorded on this context ("" when none). Valid until the next call
 * on the context. NULL ctx gives a static message. */
CLATTN_API const char *clattn_last_error(const clattn_ctx *ctx);

CLATTN_API cl_context clattn_ctx_cl_context(const clattn_ctx *ctx);
CLATTN_API cl_command_queue clattn_ctx_queue(const clattn_ctx *ctx);
CLATTN_API cl_device_id clattn_ctx_device(const clattn_ctx *ctx);

/* Caps every device workspace buffer the context allocates at `bytes` (0: only the device's
 * own limits). A call whose workspace would exceed it fails with CLATTN_ERR_TOO_LARGE, naming
 * the size; the fused attention path needs no workspace. */
CLATTN_API clattn_status clattn_ctx_set_workspace_limit(clattn_ctx *ctx, size_t bytes);

/* Bytes of device workspace the context holds now (it grows to the largest call's need and is
 * kept for reuse until clattn_ctx_release). */
CLATTN_API size_t clattn_ctx_workspace_bytes(const clattn_ctx *ctx);

/* Waits for all work enqueued through this context. */
CLATTN_API clattn_status clattn_finish(clattn_ctx *ctx);

/* ---------------------------------------------------------------------------------------------
 * Device operations
 * ------------------------------------------------------------------------------------------- */

/* A device tensor: a buffer and the element offset at which the tensor starts.
 * mem == NULL means "absent" wherever a tensor is optional. */
typedef struct clattn_tensor {
    cl_mem mem;
    size_t offset; /* in elements */
} clattn_tensor;

/* C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b] + bias, for b in [0, batch).
 * op(A) is m x k: A is stored m x k, or k x m when trans_a (and likewise B: k x n or n x k).
 * ld* is the row stride of the matrix as stored (0 = packed: the stored column count).
 * stride_* is the element distance between consecutive batch entries (0 = the same matrix
 * for every entry; ignored when batch == 1; stride_c must be nonzero when batch > 1).
 * With beta == 0, C is not read (it may hold NaN).
 * bias, when present, holds n floats added to every row of C. */
typedef struct clattn_matmul_desc {
    size_t batch; /* 0 is treated as 1 */
    size_t m, n, k;
    int trans_a, trans_b;
    size_t lda, ldb, ldc;
    size_t stride_a, stride_b, stride_c;
    float alpha, beta;
} clattn_matmul_desc;

CLATTN_API clattn_status clattn_matmul(clattn_ctx *ctx, const clattn_matmul_desc *desc,
                                       clattn_tensor a, clattn_tensor b, clattn_tensor bias,
                                       clattn_tensor c, cl_uint num_wait, const cl_event *wait,
                                       cl_event *event);

typedef enum clattn_norm {
    CLATTN_NORM_SOFTMAX = 0, /* exp(s - max) / sum exp(s - max) */
    CLATTN_NORM_RELU = 1     /* relu(s) / sum relu(s); a row with sum 0 gives zeros */
} clattn_norm;

/* Masks applied to a (batch, heads, seq_q, seq_k) score tensor. All optional.
 * - causal: key j is masked for query i when j > i (top-left aligned, as PyTorch's is_causal).
 * - attn_mask: seq_q x seq_k floats added to the scaled scores (-INFINITY masks), broadcast over
 *   batch and heads.
 * - key_padding_mask: batch x seq_k bytes (cl_uchar), nonzero = ignore that key.
 * A row whose keys are all masked gives all-zero weights (never NaN). */
typedef struct clattn_masks {
    int causal;
    clattn_tensor attn_mask;        /* float, offset in floats */
    clattn_tensor key_padding_mask; /* uint8, offset in bytes */
} clattn_masks;

/* out = normalise(scale * scores + masks), row by row, over a packed
 * (batch, heads, seq_q, seq_k) tensor. out may be the same tensor as scores (in place). */
typedef struct clattn_softmax_desc {
    size_t batch, heads, seq_q, seq_k;
    float scale; /* multiplies the scores; 0 means 1.0 here */
    clattn_norm norm;
    clattn_masks masks;
} clattn_softmax_desc;

CLATTN_API clattn_status clattn_softmax_rows(clattn_ctx *ctx, const clattn_softmax_desc *desc,
                                             clattn_tensor scores, clattn_tensor out,
                                             cl_uint num_wait, const cl_event *wait,
                                             cl_event *event);

/* Head split: (batch, seq, heads*head_dim) -> (batch, heads, seq, head_dim), packed output.
 * Head concat: the inverse. row_stride is the element distance between consecutive sequence
 * positions of the (batch, seq, ...) side (0 = heads*head_dim); it lets a split read one part
 * of a packed (batch, seq, 3E) projection: pass offset = part*E and row_stride = 3E. */
typedef struct clattn_heads_desc {
    size_t batch, seq, heads, head_dim;
    size_t row_stride;
} clattn_heads_desc;

CLATTN_API clattn_status clattn_split_heads(clattn_ctx *ctx, const clattn_heads_desc *desc,
                                            clattn_tensor src, clattn_tensor dst,
                                            cl_uint num_wait, const cl_event *wait,
                                            cl_event *event);
CLATTN_API clattn_status clattn_concat_heads(clattn_ctx *ctx, const clattn_heads_desc *desc,
                                             clattn_tensor src, clattn_tensor dst,
                                             cl_uint num_wait, const cl_event *wait,
                                             cl_event *event);

/* Which attention kernels run. AUTO: the fused (flash) kernel whenever the caller does not ask
 * for the attention weights and the head sizes are at most 256, else the unfused path
 * (matmul, softmax over the materialised scores, matmul). FUSED: always fused (asking for the
 * weights, or a head size over 256, is then an error). UNFUSED: always unfused. */
typedef enum clattn_path {
    CLATTN_PATH_AUTO = 0,
    CLATTN_PATH_FUSED = 1,
    CLATTN_PATH_UNFUSED = 2
} clattn_path;

/* ---------------------------------------------------------------------------------------------
 * Scaled dot-product attention on device buffers
 *   Q (batch, heads, seq_q, head_dim_qk), K (batch, heads, seq_k, head_dim_qk),
 *   V (batch, heads, seq_k, head_dim_v) -> O (batch, heads, seq_q, head_dim_v),
 *   O = normalise(scale * Q Kᵀ + masks) V.
 * weights, when present, receives the attention weights (batch, heads, seq_q, seq_k).
 * ------------------------------------------------------------------------------------------- */
typedef struct clattn_attention_desc {
    size_t batch, heads, seq_q, seq_k, head_dim_qk, head_dim_v;
    float scale; /* 0 means 1/sqrt(head_dim_qk) */
    clattn_norm norm;
    clattn_masks masks;
    clattn_path path;
} clattn_attention_desc;

CLATTN_API clattn_status clattn_attention(clattn_ctx *ctx, const clattn_attention_desc *desc,
                                          clattn_tensor q, clattn_tensor k, clattn_tensor v,
                                          clattn_tensor out, clattn_tensor weights,
                                          cl_uint num_wait, const cl_event *wait,
                                          cl_event *event);

/* The fused kernel alone (what clattn_attention runs on the fused path), with desc->path
 * ignored: extra device memory is only the optional lse, never the (seq_q x seq_k) scores.
 * lse, when present, receives (batch, heads, seq_q) floats: the log-sum-exp of each row's
 * masked, scaled scores (m + log sum exp(s - m)), -INFINITY for a fully masked row; with the
 * relu normalisation, the log of the row's normaliser. Head sizes 1 .. 256. */
CLATTN_API clattn_status clattn_flash_attention(clattn_ctx *ctx,
                                                const clattn_attention_desc *desc,
                                                clattn_tensor q, clattn_tensor k, clattn_tensor v,
                                                clattn_tensor out, clattn_tensor lse,
                                                cl_uint num_wait, const cl_event *wait,
                                                cl_event *event);

/* ---------------------------------------------------------------------------------------------
 * Multi-head attention forward
 *   query (batch, seq_q, embed_dim), key (batch, seq_k, kdim), value (batch, seq_k, vdim).
 *   Q = query·Wq + bq (batch, seq_q, qk_dim); K = key·Wk + bk; V = value·Wv + bv (.., v_dim);
 *   split into heads of qk_dim/heads and v_dim/heads; attention per head; concat;
 *   out = concat·Wo + bo (batch, seq_q, embed_dim), or out = concat (.., v_dim) without Wo.
 * Self-attention passes the same tensor as query, key and value.
 * ------------------------------------------------------------------------------------------- */
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

typedef struct clattn_mha_desc {
    size_t batch, seq_q, seq_k;
    size_t embed_dim; /* E: query features, and the output features when Wo is given */
    size_t num_heads;
    size_t kdim, vdim;     /* key / value input features; 0 means embed_dim */
    size_t qk_dim, v_dim;  /* projected q/k and v widths (all heads); 0 means embed_dim */
    clattn_weight_layout layout;
    float scale; /* 0 means 1/sqrt(qk_dim / num_heads) */
    clattn_norm norm;
    clattn_masks masks;
    clattn_need_weights need_weights;
    clattn_path path; /* AUTO: fused unless need_weights asks for the weights */
} clattn_mha_desc;

/* Weights on the device. Either in_proj_weight (PyTorch's packed (3E x E) matrix, layout TORCH
 * only, requires kdim = vdim = qk_dim = v_dim = E) or q/k/v_weight. Biases are optional;
 * in_proj_bias (3E) goes with in_proj_weight. out_weight absent: no output projection. */
typedef struct clattn_mha_weights {
    clattn_tensor in_proj_weight, in_proj_bias;
    clattn_tensor q_weight, k_weight, v_weight;
    clattn_tensor q_bias, k_bias, v_bias;
    clattn_tensor out_weight, out_bias;
} clattn_mha_weights;

/* attn_weights receives the weights selected by desc->need_weights (ignored for NONE). */
CLATTN_API clattn_status clattn_mha_forward(clattn_ctx *ctx, const clattn_mha_desc *desc,
                                            const clattn_mha_weights *weights,
                                            clattn_tensor query, clattn_tensor key,
                                            clattn_tensor value, clattn_tensor out,
                                            clattn_tensor attn_weights, cl_uint num_wait,
                                            const cl_event *wait, cl_event *event);

/* ---------------------------------------------------------------------------------------------
 * Host-pointer API: float arrays in, float arrays out; synchronous.
 * ------------------------------------------------------------------------------------------- */

/* Host masks: attn_mask seq_q x seq_k floats, key_padding_mask batch x seq_k bytes; NULL = none. */
typedef struct clattn_host_masks {
    int causal;
    const float *attn_mask;
    const uint8_t *key_padding_mask;
} clattn_host_masks;

/* Same shapes as clattn_attention; q/k/v/out are packed host arrays. weights may be NULL.
 * Masks come from `masks` (may be NULL); desc->masks' cl_mem fields are ignored, and the mask is
 * causal when either desc->masks.causal or masks->causal is set. */
CLATTN_API clattn_status clattn_attention_host(clattn_ctx *ctx, const clattn_attention_desc *desc,
                                               const float *q, const float *k, const float *v,
                                               const clattn_host_masks *masks, float *out,
                                               float *weights);

typedef struct clattn_mha_host_weights {
    const float *in_proj_weight, *in_proj_bias;
    const float *q_weight, *k_weight, *v_weight;
    const float *q_bias, *k_bias, *v_bias;
    const float *out_weight, *out_bias;
} clattn_mha_host_weights;

/* Same shapes as clattn_mha_forward. key NULL means the query (self-attention); value NULL
 * means the key. Passing the same pointer for query, key and value is self-attention too.
 * Masks as for clattn_attention_host.
 * attn_weights may be NULL when desc->need_weights is NONE. */
CLATTN_API clattn_status clattn_mha_forward_host(clattn_ctx *ctx, const clattn_mha_desc *desc,
                                                 const clattn_mha_host_weights *weights,
                                                 const float *query, const float *key,
                                                 const float *value,
                                                 const clattn_host_masks *masks, float *out,
                                                 float *attn_weights);

#ifdef __cplusplus
}
#endif

#endif /* CLATTN_H */
