/*
 * clattn_mpi: attention over a sequence spread across the ranks of an MPI communicator
 * (sequence-parallel "ring" attention), built on libclattn's public API. Optional
 * (-DCLATTN_MPI=ON); libclattn itself never depends on MPI.
 *
 * Ring attention: each rank holds some rows of one sequence (its queries, keys and values).
 * In N steps the key/value blocks travel around the ring of ranks (rank r sends to r + 1 and
 * receives from r - 1); at each step a rank attends its queries to the block it holds, with
 * SDPA plans whose causal diagonal (CLATTN_CAUSAL_OFFSET) is the blocks' global distance, and
 * merges the partial outputs exactly by their log-sum-exp. The send and receive of the next
 * block are posted before the current block's compute, so communication overlaps compute.
 * Device buffers cross MPI through host memory (read, send; receive, write): no MPI passes
 * OpenCL buffers directly.
 *
 * Conventions are libclattn's (clattn.h): descriptors start with struct_size, calls return
 * clattn_status, handles are released with *_release (NULL is a no-op).
 *
 * Collective calls: clattn_ring_plan_create, clattn_ring_execute and clattn_ring_plan_release
 * must be called by every rank of the communicator, in the same order. A failure on any rank
 * (a bad argument, an OpenCL or MPI error) makes the call return an error on every rank: the
 * ranks agree on a status after validation and after each step, so none is left waiting.
 * The failing rank returns its own status; the others return CLATTN_MPI_ERR_PEER. (The
 * agreement is one MPI_Allreduce per step. Not covered: an error inside MPI itself while one
 * rank posts a step's exchange can leave its neighbour in MPI_Waitall.)
 *
 * Thread safety: as libclattn's: a plan is used by one thread at a time, and the MPI library
 * must be initialised with at least MPI_THREAD_FUNNELED by the thread that calls.
 */
#ifndef CLATTN_MPI_H
#define CLATTN_MPI_H

#include <mpi.h>

#include "clattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Statuses of this library, below libclattn's own codes. */
#define CLATTN_MPI_ERR_COMM (-2100) /* an MPI call failed (the message has MPI's text) */
#define CLATTN_MPI_ERR_PEER (-2101) /* another rank failed (the message names it and why) */

/* A static name for a status of clattn_mpi or of libclattn. Never NULL. */
CLATTN_API const char *clattn_mpi_status_string(clattn_status status);

/* Which rows of the sequence each rank holds.
 * CONTIGUOUS: rank r holds one block, rows start_r .. start_r + local_len_r - 1, in rank
 *   order (start_0 = 0); each rank gives its own local_len (blocks may be uneven or empty);
 *   the lengths are gathered at plan creation and must sum to seq_len.
 * ZIGZAG: the sequence is cut into 2N chunks as evenly as possible (the first seq_len % 2N
 *   chunks one row longer); rank r holds chunks r and 2N - 1 - r, in that order, as its
 *   local rows (local_len is then ignored: clattn_ring_plan_rows gives them). Why: with causal
 *   masking, query row i attends i + 1 keys, so with contiguous blocks the last rank does about
 *   2N - 1 times the work of the first, and every step waits for the slowest rank. Pairing an
 *   early chunk with its mirror gives every rank the same number of (query, key) pairs, within
 *   a chunk, and the blocks wholly above the diagonal are skipped (Brandon et al., Striped
 *   Attention, and the zig-zag of Llama 3's context parallelism make the same point). */
typedef enum clattn_ring_layout {
    CLATTN_RING_CONTIGUOUS = 0,
    CLATTN_RING_ZIGZAG = 1
} clattn_ring_layout;

/* Zero-initialise and set struct_size = sizeof(clattn_ring_desc), or call
 * clattn_ring_desc_init (scale NAN). Every field but local_len must be the same on every rank
 * (checked at creation). */
typedef struct clattn_ring_desc {
    size_t struct_size;
    size_t batch, heads;
    size_t kv_heads; /* heads of k and v: a divisor of heads (grouped-query); 0 means heads */
    size_t head_dim_qk, head_dim_v;
    size_t seq_len; /* the whole sequence's length (queries and keys alike: self-attention) */
    clattn_ring_layout layout;
    size_t local_len; /* CONTIGUOUS: this rank's rows (0 allowed); ZIGZAG: unused */
    /* Global positions: causal NONE, TOP_LEFT (query i sees keys j <= i) or BOTTOM_RIGHT
     * (j <= i + kv_seq_len - seq_len: the queries are the last rows of the keys' sequence;
     * the same as TOP_LEFT for self-attention). */
    clattn_causal causal;
    /* Sliding window over global positions: window_align NONE, TOP_LEFT or BOTTOM_RIGHT (as
     * causal); query i at position p sees keys p - window_left <= j <= p + window_right (< 0:
     * unbounded). */
    clattn_causal window_align;
    long long window_left, window_right;
    float scale;   /* NAN: 1/sqrt(head_dim_qk) */
    float softcap; /* 0: off; as clattn_sdpa_desc's */
    /* 1: clattn_ring_execute takes key_padding_mask, U8 (batch, local rows) for this rank's
     * keys, nonzero = ignore the key (its global position is where the row lies); it travels
     * with the rank's keys. */
    int key_padding;
    /* Cross-attention (since 0.8): the keys and values are a sequence of their own, kv_seq_len
     * rows (0: seq_len, self-attention, the keys being the queries' rows), spread over the
     * ranks by the same layout: CONTIGUOUS, this rank holds kv_local_len of them (gathered;
     * they must sum to kv_seq_len; 0 allowed); ZIGZAG, chunks r and 2N-1-r of the kv_seq_len
     * rows (clattn_ring_zigzag_rows(kv_seq_len, ...)). key_padding is then (batch, key rows). */
    size_t kv_seq_len, kv_local_len;
    /* Storage of q, k, v and out (since 0.8): CLATTN_DTYPE_F32 (0), F16 or BF16. The blocks
     * travel in it (16-bit: half the bytes), the steps' partial outputs merge in float32 and
     * out is rounded once, to nearest even, at the end; lse stays F32. */
    clattn_dtype dtype;
} clattn_ring_desc;

CLATTN_API void clattn_ring_desc_init(clattn_ring_desc *desc);

/* The rows a rank holds under a layout: the count, and for each of at most two segments its
 * global start and length (in local order). A pure function: no communicator needed.
 * CONTIGUOUS needs every rank's length and is not answered here (CLATTN_ERR_INVALID_ARGUMENT). */
typedef struct clattn_ring_rows {
    size_t count;    /* local rows */
    size_t segments; /* 1 or 2 */
    size_t start[2], length[2];
} clattn_ring_rows;
CLATTN_API clattn_status clattn_ring_zigzag_rows(size_t seq_len, int ranks, int rank,
                                                 clattn_ring_rows *rows);

typedef struct clattn_ring_plan clattn_ring_plan;

/* Collective over comm. Validates desc (the same on every rank), gathers the blocks' lengths,
 * creates the SDPA sub-plans (one per pair of this rank's query segment and a visiting key
 * segment that is not entirely masked), the merge kernel and the staging buffers (host: two
 * blocks of k, v and key padding, the one sent and the one received; device: one, the
 * visiting block computed on; see clattn_ring_plan_memory). comm is duplicated (the plan's own,
 * with MPI_ERRORS_RETURN); the caller's is untouched. The plan keeps a reference to ctx: release
 * the plan first. On failure *out is NULL and, when message != NULL, the reason (on ranks that
 * did not fail themselves: which rank failed and why) is written there. */
CLATTN_API clattn_status clattn_ring_plan_create(clattn_ctx *ctx, MPI_Comm comm,
                                                 const clattn_ring_desc *desc,
                                                 clattn_ring_plan **out, char *message,
                                                 size_t message_size);

/* This rank's rows under the plan (CONTIGUOUS: one segment at its gathered start): of the
 * queries; clattn_ring_plan_kv_rows: of the keys and values (the same for self-attention;
 * since 0.8). */
CLATTN_API clattn_ring_rows clattn_ring_plan_rows(const clattn_ring_plan *plan);
CLATTN_API clattn_ring_rows clattn_ring_plan_kv_rows(const clattn_ring_plan *plan);

/* Collective. Attention of this rank's query rows over the whole sequence's keys; q, k, v,
 * out, lse and key_padding_mask are this rank's rows, of desc.dtype (lse F32, key padding U8),
 * packed row-major (strides 0, or those of a packed tensor) in the context's cl_context:
 *   q (batch, heads, rows, head_dim_qk), k (batch, kv_heads, kv_rows, head_dim_qk),
 *   v (batch, kv_heads, kv_rows, head_dim_v), out (batch, heads, rows, head_dim_v),
 *   lse (batch, heads, rows), optional (rank 0: not wanted): the log-sum-exp of each row over
 *   all keys, -INFINITY for a row with no visible key (whose out row is zeros),
 *   key_padding_mask (batch, kv_rows) when desc.key_padding, else rank 0.
 * rows = clattn_ring_plan_rows(plan).count, kv_rows = clattn_ring_plan_kv_rows(plan).count
 * (the same for self-attention); with 0 rows q, out and lse are ignored, with 0 kv_rows k, v
 * and the key padding (the rank still forwards the blocks). Synchronous: returns when out and lse are written (waits for
 * the context's queue). Errors: see the collective rule at the top; clattn_ring_last_error
 * says why. */
CLATTN_API clattn_status clattn_ring_execute(clattn_ring_plan *plan, const clattn_tensor *q,
                                             const clattn_tensor *k, const clattn_tensor *v,
                                             const clattn_tensor *out, const clattn_tensor *lse,
                                             const clattn_tensor *key_padding_mask);

/* Attention sinks (GPT-OSS; since 0.8): sinks F32 (heads), one logit per query head, in the
 * context's cl_context, read by every later clattn_ring_execute of the plan (after its last
 * merge each row's softmax denominator gains exp(sink - m) once: clattn.h's rule; -INFINITY is
 * no sink); NULL or rank 0 removes them. Every rank must set the same values (not checked).
 * Not collective. CLATTN_ERR_INVALID_SHAPE for another shape or dtype,
 * CLATTN_ERR_BUFFER_TOO_SMALL for a buffer that does not hold it. */
CLATTN_API clattn_status clattn_ring_set_sinks(clattn_ring_plan *plan, const clattn_tensor *sinks);

/* Times of the last execution on this rank, in seconds (monotonic host clock), summed over
 * its steps. A step posts its exchange, enqueues its compute, waits in MPI_Waitall (the
 * device computes meanwhile), writes the received block to the device and waits for it:
 *   compute_s: from enqueueing the step's sub-plans and merges to the device's completion
 *     of the last of them (an event callback);
 *   comm_s: from posting the exchange to its completion (overlapping the compute);
 *   comm_wait_s: the part of comm_s after the device had finished: communication not hidden;
 *   staging_s: host staging not overlapped: resetting out/lse and reading the own block to
 *     the host (once per call), and each step's tail after compute and exchange (writing the
 *     received block to the device);
 *   sync_s: the steps' status agreement (an MPI_Allreduce): waiting for the slowest rank,
 *     which is where an unbalanced layout (contiguous blocks under causal masking) shows;
 *   total_s: the whole call; steps: steps run; bytes_sent: by this rank, all steps.
 * A step lasts about max(compute, comm) + its staging + its sync. */
typedef struct clattn_ring_timing {
    double total_s, compute_s, comm_s, comm_wait_s, staging_s, sync_s;
    int steps;
    size_t bytes_sent; /* by this rank, all steps */
} clattn_ring_timing;
CLATTN_API clattn_ring_timing clattn_ring_last_timing(const clattn_ring_plan *plan);

/* What the plan allocated beyond the caller's q, k, v, out (and lse): host_bytes, the two
 * host staging blocks (each the largest rank's k, v and key padding: O(L/N)); device_bytes,
 * the device's visiting block plus the partial output and log-sum-exp of one query segment
 * and the rank's lse scratch (O(L/N)); with one rank there is no staging (no block travels).
 * The SDPA sub-plans use the fused kernel (no device
 * workspace). Either pointer may be NULL. CLATTN_ERR_INVALID_ARGUMENT for a NULL plan. */
CLATTN_API clattn_status clattn_ring_plan_memory(const clattn_ring_plan *plan, size_t *host_bytes,
                                                 size_t *device_bytes);

/* The last error message of the plan ("" when none). */
CLATTN_API const char *clattn_ring_last_error(const clattn_ring_plan *plan);

/* Collective (frees the duplicated communicator). NULL is a no-op (on every rank alike). */
CLATTN_API void clattn_ring_plan_release(clattn_ring_plan *plan);

/* The simple split, for many heads: heads (of every batch) divided across the ranks as
 * evenly as possible; rank r computes query heads first .. first + count - 1 with an ordinary
 * SDPA plan on views of its tensors. With grouped-query attention (kv_heads < heads) the
 * ranges are whole k/v groups: the groups are divided, so each rank needs only its groups'
 * k/v heads. A rank may get count 0 (more ranks than groups). Pure: no communication. */
CLATTN_API clattn_status clattn_mpi_head_range(size_t heads, size_t kv_heads, int ranks, int rank,
                                               size_t *first, size_t *count);

#ifdef __cplusplus
}
#endif

#endif /* CLATTN_MPI_H */
