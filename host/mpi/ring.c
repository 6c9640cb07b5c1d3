/* Ring attention over MPI (clattn_mpi.h), on libclattn's public API only.
 *
 * A rank's rows are one or two segments of the sequence (CONTIGUOUS: one; ZIGZAG: two). The
 * block that travels is a rank's k, v (and key padding), packed as the rank holds them. At
 * step s rank r holds the block of rank r - s; for each pair (own query segment, visiting key
 * segment) that is not entirely masked, an SDPA sub-plan (made at creation, causal and window
 * aligned with CLATTN_CAUSAL_OFFSET = the segments' global distance) writes a partial output
 * and its log-sum-exp, which clattn_merge_states folds into out and lse. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */
#include "clattn_mpi.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The store and sink kernels (host/mpi/ring_merge.cl, embedded at build time as
 * clattn_kernel_ring_merge). */
#include "ring_kernels.h"

#define MERGE_LOCAL 64 /* work-items per store or sink work-group */

/* One rank's rows: segments in local order. */
typedef struct ring_block {
    size_t count, segments;
    size_t start[2], length[2], local[2]; /* global start, length, first local row */
} ring_block;

/* When a step's last compute command completed, set by an event callback. */
typedef struct device_clock {
    atomic_int done;
    double when;
} device_clock;

struct clattn_ring_plan {
    clattn_ctx *ctx;
    MPI_Comm comm;
    int rank, ranks;
    clattn_ring_desc desc; /* kv_heads resolved */
    ring_block *blocks;    /* per rank: its query rows */
    ring_block *kblocks;   /* per rank: its key rows (== blocks for self-attention) */
    unsigned long long *lengths; /* per rank: the gathered local_len (CONTIGUOUS) */
    unsigned long long *kv_lengths; /* per rank: the gathered kv_local_len (cross, CONTIGUOUS) */
    size_t max_rows;       /* the longest key block (the one that travels) */
    size_t elem;           /* bytes of an element of q, k, v and out (desc.dtype) */
    long long shift;       /* a query row's key position minus its own (BOTTOM_RIGHT: Lk - Lq) */
    clattn_plan **sub;     /* [(src * 2 + q_segment) * 2 + k_segment]; NULL: none (skipped) */
    cl_program program;
    cl_kernel store;        /* out_acc into a 16-bit out */
    cl_kernel sink;         /* the sinks folded into out and lse after the last merge */
    clattn_tensor sinks;    /* clattn_ring_set_sinks: F32 (heads), rank 0 when none */
    cl_mem part_out,
        part_lse;   /* one pair's partial result, packed (B, H, qlen, dv), (B, H, qlen) */
    cl_mem own_lse; /* the running lse when the caller wants none */
    cl_mem out_acc; /* 16-bit out: the running output in float32 (B, H, rows, dv) */
    /* The visiting block on the device: one slot. A step's received block is written there
     * after the step's compute (the writes wait for its last event), so the two host slots
     * are the only blocks in flight. */
    cl_mem dev_k, dev_v, dev_kpm;
    size_t host_bytes, device_bytes; /* what make_buffers allocated (clattn_ring_plan_memory) */
    unsigned char *host_k[2], *host_v[2]; /* desc.dtype's elements */
    uint8_t *host_kpm[2];
    clattn_ring_timing timing;
    device_clock clock; /* the step's compute completion (on_compute_done) */
    char message[1024];
};

/* ---- small helpers ---------------------------------------------------------------------- */

/* Monotonic seconds (also called from OpenCL's callback thread, so not MPI_Wtime). */
static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void CL_CALLBACK on_compute_done(cl_event event, cl_int status, void *data)
{
    (void)event, (void)status;
    device_clock *clock = data;
    clock->when = now_s();
    atomic_store(&clock->done, 1);
}

/* After clFinish the callback may still be on its way: wait for it (bounded: 2 s). */
static double compute_end(device_clock *clock, double fallback)
{
    const struct timespec pause = {0, 20000};
    for (int i = 0; i < 100000 && !atomic_load(&clock->done); ++i)
        nanosleep(&pause, NULL);
    return atomic_load(&clock->done) ? clock->when : fallback;
}

static clattn_status fail(clattn_ring_plan *plan, clattn_status status, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(plan->message, sizeof plan->message, format, args);
    va_end(args);
    return status;
}

static clattn_status fail_mpi(clattn_ring_plan *plan, int rc, const char *call)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int length = 0;
    if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", rc);
    return fail(plan, CLATTN_MPI_ERR_COMM, "ring: %s: %s", call, text);
}

static clattn_status fail_cl(clattn_ring_plan *plan, cl_int err, const char *call)
{
    return fail(plan, (clattn_status)err, "ring: %s: %s", call,
                clattn_status_string((clattn_status)err));
}

static bool mul_ok(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return false;
    *out = a * b;
    return true;
}

static bool product(size_t *out, int n, const size_t *factors)
{
    size_t p = 1;
    for (int i = 0; i < n; ++i)
        if (!mul_ok(p, factors[i], &p))
            return false;
    *out = p;
    return true;
}

/* Every rank learns the lowest failing status (and the first rank with it); a rank that did
 * not fail returns CLATTN_MPI_ERR_PEER with the failing rank's message. */
static clattn_status agree(clattn_ring_plan *plan, clattn_status local, const char *where)
{
    int in[2] = {(int)local, plan->rank}, worst[2] = {0, 0};
    int rc = MPI_Allreduce(in, worst, 1, MPI_2INT, MPI_MINLOC, plan->comm);
    if (rc != MPI_SUCCESS)
        return fail_mpi(plan, rc, "MPI_Allreduce(status)");
    if (worst[0] == 0)
        return CLATTN_SUCCESS;
    char theirs[512];
    snprintf(theirs, sizeof theirs, "%.500s", plan->message);
    rc = MPI_Bcast(theirs, (int)sizeof theirs, MPI_CHAR, worst[1], plan->comm);
    if (local != CLATTN_SUCCESS)
        return local;
    if (rc != MPI_SUCCESS)
        return fail_mpi(plan, rc, "MPI_Bcast(message)");
    theirs[sizeof theirs - 1] = '\0';
    return fail(plan, CLATTN_MPI_ERR_PEER, "ring: rank %d failed (%s) %s: %s", worst[1],
                clattn_mpi_status_string((clattn_status)worst[0]), where, theirs);
}

/* ---- public helpers --------------------------------------------------------------------- */

const char *clattn_mpi_status_string(clattn_status status)
{
    switch ((int)status) {
    case CLATTN_MPI_ERR_COMM:
        return "CLATTN_MPI_ERR_COMM";
    case CLATTN_MPI_ERR_PEER:
        return "CLATTN_MPI_ERR_PEER";
    default:
        return clattn_status_string(status);
    }
}

void clattn_ring_desc_init(clattn_ring_desc *desc)
{
    if (desc == NULL)
        return;
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->scale = NAN;
    desc->window_left = -1;
    desc->window_right = -1;
}

clattn_status clattn_ring_zigzag_rows(size_t seq_len, int ranks, int rank, clattn_ring_rows *rows)
{
    if (rows == NULL || ranks < 1 || rank < 0 || rank >= ranks)
        return CLATTN_ERR_INVALID_ARGUMENT;
    const size_t chunks = 2 * (size_t)ranks, base = seq_len / chunks, extra = seq_len % chunks;
    const size_t pick[2] = {(size_t)rank, chunks - 1 - (size_t)rank};
    memset(rows, 0, sizeof *rows);
    rows->segments = 2;
    for (int s = 0; s < 2; ++s) {
        const size_t c = pick[s];
        rows->start[s] = c * base + (c < extra ? c : extra);
        rows->length[s] = base + (c < extra ? 1 : 0);
        rows->count += rows->length[s];
    }
    return CLATTN_SUCCESS;
}

clattn_status clattn_mpi_head_range(size_t heads, size_t kv_heads, int ranks, int rank,
                                    size_t *first, size_t *count)
{
    if (first == NULL || count == NULL || ranks < 1 || rank < 0 || rank >= ranks || heads == 0)
        return CLATTN_ERR_INVALID_ARGUMENT;
    if (kv_heads == 0)
        kv_heads = heads;
    if (heads % kv_heads != 0)
        return CLATTN_ERR_INVALID_SHAPE;
    const size_t group = heads / kv_heads, n = (size_t)ranks, r = (size_t)rank;
    const size_t base = kv_heads / n, extra = kv_heads % n;
    const size_t first_group = r * base + (r < extra ? r : extra);
    *first = first_group * group;
    *count = (base + (r < extra ? 1 : 0)) * group;
    return CLATTN_SUCCESS;
}

/* ---- plan creation ---------------------------------------------------------------------- */

static clattn_status check_desc(clattn_ring_plan *plan, const clattn_ring_desc *d)
{
    if (d->struct_size != sizeof *d)
        return fail(plan, CLATTN_ERR_INVALID_ARGUMENT,
                    "ring: struct_size=%zu but sizeof(clattn_ring_desc) is %zu: set struct_size "
                    "(or use clattn_ring_desc_init) and rebuild against this header",
                    d->struct_size, sizeof *d);
    static const char *const names[6] = {"batch",      "heads",   "head_dim_qk",
                                         "head_dim_v", "seq_len", "kv_heads"};
    const size_t values[6] = {d->batch,      d->heads,   d->head_dim_qk,
                              d->head_dim_v, d->seq_len, d->kv_heads ? d->kv_heads : d->heads};
    for (int i = 0; i < 6; ++i)
        if (values[i] == 0 || values[i] > UINT32_MAX)
            return fail(plan, CLATTN_ERR_INVALID_SHAPE, "ring: %s=%zu: must be 1 .. 2^32-1",
                        names[i], values[i]);
    if (d->heads % values[5] != 0)
        return fail(plan, CLATTN_ERR_INVALID_SHAPE, "ring: kv_heads=%zu does not divide heads=%zu",
                    values[5], d->heads);
    if (d->layout != CLATTN_RING_CONTIGUOUS && d->layout != CLATTN_RING_ZIGZAG)
        return fail(plan, CLATTN_ERR_INVALID_ARGUMENT,
                    "ring: layout=%d: CLATTN_RING_CONTIGUOUS or CLATTN_RING_ZIGZAG",
                    (int)d->layout);
    if (d->layout == CLATTN_RING_CONTIGUOUS && d->local_len > d->seq_len)
        return fail(plan, CLATTN_ERR_INVALID_SHAPE, "ring: local_len=%zu exceeds seq_len=%zu",
                    d->local_len, d->seq_len);
    if (d->kv_seq_len > UINT32_MAX)
        return fail(plan, CLATTN_ERR_INVALID_SHAPE, "ring: kv_seq_len=%zu: must be 0 .. 2^32-1",
                    d->kv_seq_len);
    if (d->layout == CLATTN_RING_CONTIGUOUS && d->kv_seq_len && d->kv_local_len > d->kv_seq_len)
        return fail(plan, CLATTN_ERR_INVALID_SHAPE,
                    "ring: kv_local_len=%zu exceeds kv_seq_len=%zu", d->kv_local_len,
                    d->kv_seq_len);
    if (d->dtype != CLATTN_DTYPE_F32 && d->dtype != CLATTN_DTYPE_F16 &&
        d->dtype != CLATTN_DTYPE_BF16)
        return fail(plan, CLATTN_ERR_INVALID_ARGUMENT,
                    "ring: dtype=%d: CLATTN_DTYPE_F32, _F16 or _BF16 (q, k, v and out)",
                    (int)d->dtype);
    if (d->causal != CLATTN_CAUSAL_NONE && d->causal != CLATTN_CAUSAL_TOP_LEFT &&
        d->causal != CLATTN_CAUSAL_BOTTOM_RIGHT)
        return fail(plan, CLATTN_ERR_INVALID_ARGUMENT,
                    "ring: causal=%d: NONE, TOP_LEFT or BOTTOM_RIGHT (global positions)",
                    (int)d->causal);
    if (d->causal != CLATTN_CAUSAL_NONE && d->window_align != CLATTN_CAUSAL_NONE &&
        d->causal != d->window_align && d->kv_seq_len && d->kv_seq_len != d->seq_len)
        return fail(plan, CLATTN_ERR_INVALID_ARGUMENT,
                    "ring: causal=%d and window_align=%d: the causal bound and the sliding "
                    "window must use the same alignment",
                    (int)d->causal, (int)d->window_align);
    if (d->window_align != CLATTN_CAUSAL_NONE && d->window_align != CLATTN_CAUSAL_TOP_LEFT &&
        d->window_align != CLATTN_CAUSAL_BOTTOM_RIGHT)
        return fail(plan, CLATTN_ERR_INVALID_ARGUMENT,
                    "ring: window_align=%d: NONE, TOP_LEFT or BOTTOM_RIGHT", (int)d->window_align);
    if (d->key_padding != 0 && d->key_padding != 1)
        return fail(plan, CLATTN_ERR_INVALID_ARGUMENT, "ring: key_padding=%d: 0 or 1",
                    d->key_padding);
    /* scale and softcap are checked by the sub-plans (the same rules as SDPA's). */
    return CLATTN_SUCCESS;
}

/* Every rank's desc must match (local_len aside): min and max over the ranks of each field. */
static clattn_status check_same(clattn_ring_plan *plan)
{
    const clattn_ring_desc *d = &plan->desc;
    uint32_t scale_bits, cap_bits;
    memcpy(&scale_bits, &d->scale, sizeof scale_bits);
    memcpy(&cap_bits, &d->softcap, sizeof cap_bits);
    const char *names[] = {"batch",        "heads",  "kv_heads", "head_dim_qk",  "head_dim_v",
                           "seq_len",      "layout", "causal",   "window_align", "window_left",
                           "window_right", "scale",  "softcap",  "key_padding",  "kv_seq_len",
                           "dtype"};
    enum { FIELDS = 16 };
    long long mine[FIELDS] = {(long long)d->batch,
                              (long long)d->heads,
                              (long long)d->kv_heads,
                              (long long)d->head_dim_qk,
                              (long long)d->head_dim_v,
                              (long long)d->seq_len,
                              d->layout,
                              d->causal,
                              d->window_align,
                              d->window_left < 0 ? -1 : d->window_left,
                              d->window_right < 0 ? -1 : d->window_right,
                              scale_bits,
                              cap_bits,
                              d->key_padding,
                              (long long)d->kv_seq_len,
                              d->dtype};
    long long low[FIELDS], high[FIELDS];
    int rc = MPI_Allreduce(mine, low, FIELDS, MPI_LONG_LONG, MPI_MIN, plan->comm);
    if (rc == MPI_SUCCESS)
        rc = MPI_Allreduce(mine, high, FIELDS, MPI_LONG_LONG, MPI_MAX, plan->comm);
    if (rc != MPI_SUCCESS)
        return fail_mpi(plan, rc, "MPI_Allreduce(desc)");
    for (int i = 0; i < FIELDS; ++i)
        if (low[i] != high[i])
            return fail(plan, CLATTN_ERR_INVALID_ARGUMENT,
                        "ring: desc.%s differs between ranks (%lld .. %lld); every field but "
                        "local_len must be the same on every rank",
                        names[i], low[i], high[i]);
    return CLATTN_SUCCESS;
}

/* Every rank's rows of a sequence of seq_len rows (the queries', or the keys' of
 * cross-attention) into blocks[]: ZIGZAG's chunks, or the gathered local lengths (CONTIGUOUS,
 * into lengths[]). */
static clattn_status gather_rows(clattn_ring_plan *plan, size_t seq_len, size_t local_len,
                                 unsigned long long *lengths, ring_block *blocks,
                                 const char *what)
{
    const clattn_ring_desc *d = &plan->desc;
    if (d->layout == CLATTN_RING_ZIGZAG) {
        for (int r = 0; r < plan->ranks; ++r) {
            clattn_ring_rows rows;
            clattn_ring_zigzag_rows(seq_len, plan->ranks, r, &rows);
            ring_block *b = &blocks[r];
            b->count = rows.count;
            b->segments = 2;
            for (int s = 0; s < 2; ++s) {
                b->start[s] = rows.start[s];
                b->length[s] = rows.length[s];
            }
            b->local[1] = rows.length[0];
        }
    } else {
        unsigned long long mine = local_len;
        int rc = MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, lengths, 1,
                               MPI_UNSIGNED_LONG_LONG, plan->comm);
        if (rc != MPI_SUCCESS)
            return fail_mpi(plan, rc, "MPI_Allgather(local lengths)");
        unsigned long long start = 0;
        for (int r = 0; r < plan->ranks; ++r) {
            ring_block *b = &blocks[r];
            b->count = b->length[0] = (size_t)lengths[r];
            b->start[0] = (size_t)start;
            b->segments = 1;
            start += lengths[r]; /* each <= the length < 2^32: no overflow */
        }
        if (start != seq_len)
            return fail(plan, CLATTN_ERR_INVALID_SHAPE,
                        "ring: the ranks' %s sum to %llu but %s=%zu", what, start,
                        what[0] == 'k' ? "kv_seq_len" : "seq_len", seq_len);
    }
    return CLATTN_SUCCESS;
}

/* The queries' blocks, and the keys' (the same blocks for self-attention); the longest key
 * block, the element size, the query positions' shift. */
static clattn_status gather_blocks(clattn_ring_plan *plan)
{
    const clattn_ring_desc *d = &plan->desc;
    clattn_status status =
        gather_rows(plan, d->seq_len, d->local_len, plan->lengths, plan->blocks, "local_len");
    if (status == CLATTN_SUCCESS && d->kv_seq_len)
        status = gather_rows(plan, d->kv_seq_len, d->kv_local_len, plan->kv_lengths,
                             plan->kblocks, "kv_local_len");
    if (status != CLATTN_SUCCESS)
        return status;
    if (!d->kv_seq_len)
        memcpy(plan->kblocks, plan->blocks, (size_t)plan->ranks * sizeof *plan->blocks);
    for (int r = 0; r < plan->ranks; ++r)
        if (plan->kblocks[r].count > plan->max_rows)
            plan->max_rows = plan->kblocks[r].count;
    plan->elem = clattn_dtype_size(d->dtype);
    const size_t keys = d->kv_seq_len ? d->kv_seq_len : d->seq_len;
    plan->shift = d->causal == CLATTN_CAUSAL_BOTTOM_RIGHT ||
                          (d->causal == CLATTN_CAUSAL_NONE &&
                           d->window_align == CLATTN_CAUSAL_BOTTOM_RIGHT)
                      ? (long long)keys - (long long)d->seq_len
                      : 0;
    return CLATTN_SUCCESS;
}

/* Whether queries [q0, q0 + ql) and keys [k0, k0 + kl) have a visible pair under the causal
 * bound and the window: i - left <= j <= i + right (right 0 with causal) for some pair. */
static bool pair_visible(const clattn_ring_desc *d, long long q0, size_t ql, size_t k0, size_t kl)
{
    if (ql == 0 || kl == 0)
        return false;
    const bool window = d->window_align != CLATTN_CAUSAL_NONE;
    long long right = -1, left = -1;
    if (window) {
        right = d->window_right;
        left = d->window_left;
    }
    if (d->causal != CLATTN_CAUSAL_NONE && (right < 0 || right > 0))
        right = 0;
    const long long q_first = q0, q_last = q0 + (long long)ql - 1;
    const long long k_first = (long long)k0, k_last = (long long)(k0 + kl - 1);
    if (right >= 0 && k_first > q_last + right)
        return false;
    if (left >= 0 && k_last < q_first - left)
        return false;
    return true;
}

static clattn_tensor view4(clattn_dtype dtype, size_t d0, size_t d1, size_t d2, size_t d3,
                           size_t rows_total)
{
    clattn_tensor t = clattn_tensor_make(NULL, 0, dtype, 4, d0, d1, d2, d3);
    t.strides[0] = d1 * rows_total * d3;
    t.strides[1] = rows_total * d3;
    t.strides[2] = d3;
    t.strides[3] = 1;
    return t;
}

static clattn_status make_sub_plans(clattn_ring_plan *plan)
{
    const clattn_ring_desc *d = &plan->desc;
    const ring_block *mine = &plan->blocks[plan->rank];
    plan->sub = calloc((size_t)plan->ranks * 4, sizeof *plan->sub);
    if (plan->sub == NULL)
        return fail(plan, CLATTN_ERR_HOST_MEMORY, "ring: out of host memory (sub-plans)");
    for (int src = 0; src < plan->ranks; ++src) {
        const ring_block *kb = &plan->kblocks[src];
        for (size_t qs = 0; qs < mine->segments; ++qs)
            for (size_t ks = 0; ks < kb->segments; ++ks) {
                const size_t ql = mine->length[qs], kl = kb->length[ks];
                const long long q_at = (long long)mine->start[qs] + plan->shift;
                if (!pair_visible(d, q_at, ql, kb->start[ks], kl))
                    continue;
                clattn_sdpa_desc sd;
                clattn_sdpa_desc_init(&sd);
                clattn_tensors tensors = {0};
                clattn_tensors *t = &tensors;
                CLATTN_BIND_ROLES(sd, tensors);
                t->q = view4(d->dtype, d->batch, d->heads, ql, d->head_dim_qk, mine->count);
                t->k = view4(d->dtype, d->batch, d->kv_heads, kl, d->head_dim_qk, kb->count);
                t->v = view4(d->dtype, d->batch, d->kv_heads, kl, d->head_dim_v, kb->count);
                t->out = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, d->batch, d->heads, ql,
                                            d->head_dim_v);
                t->lse =
                    clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, d->batch, d->heads, ql, 0);
                if (d->key_padding) {
                    t->key_padding_mask =
                        clattn_tensor_make(NULL, 0, CLATTN_DTYPE_U8, 2, d->batch, kl, 0, 0);
                    t->key_padding_mask.strides[0] = kb->count;
                    t->key_padding_mask.strides[1] = 1;
                }
                const long long offset = q_at - (long long)kb->start[ks];
                if (d->causal != CLATTN_CAUSAL_NONE)
                    sd.causal = CLATTN_CAUSAL_OFFSET;
                if (d->window_align != CLATTN_CAUSAL_NONE) {
                    sd.window_align = CLATTN_CAUSAL_OFFSET;
                    sd.window_left = d->window_left;
                    sd.window_right = d->window_right;
                }
                sd.diag_offset = offset;
                sd.scale = d->scale;
                sd.softcap = d->softcap;
                clattn_plan **slot = &plan->sub[((size_t)src * 2 + qs) * 2 + ks];
                clattn_status status = clattn_sdpa_plan_create(plan->ctx, &sd, slot);
                if (status != CLATTN_SUCCESS)
                    return fail(plan, status, "ring: SDPA sub-plan (block of rank %d): %s", src,
                                clattn_last_error(plan->ctx));
            }
    }
    return CLATTN_SUCCESS;
}

static clattn_status make_merge_kernel(clattn_ring_plan *plan)
{
    cl_context context = clattn_ctx_cl_context(plan->ctx);
    cl_device_id device = clattn_ctx_device(plan->ctx);
    const char *source = clattn_kernel_ring_merge;
    cl_int err = CL_SUCCESS;
    plan->program = clCreateProgramWithSource(context, 1, &source, NULL, &err);
    if (err != CL_SUCCESS)
        return fail_cl(plan, err, "clCreateProgramWithSource(ring_merge)");
    err = clBuildProgram(plan->program, 1, &device, "-cl-std=CL1.2", NULL, NULL);
    if (err != CL_SUCCESS) {
        char log[600] = "";
        clGetProgramBuildInfo(plan->program, device, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log,
                              NULL);
        return fail(plan, CLATTN_ERR_BUILD, "ring: clBuildProgram(ring_merge): %s: %s",
                    clattn_status_string((clattn_status)err), log);
    }
    plan->store = clCreateKernel(plan->program, "ring_store", &err);
    if (err != CL_SUCCESS)
        return fail_cl(plan, err, "clCreateKernel(ring_store)");
    plan->sink = clCreateKernel(plan->program, "ring_sink", &err);
    if (err != CL_SUCCESS)
        return fail_cl(plan, err, "clCreateKernel(ring_sink)");
    return CLATTN_SUCCESS;
}

/* A device buffer of `bytes` (at least 4: OpenCL refuses empty buffers). */
static cl_int new_buffer(clattn_ring_plan *plan, cl_mem *mem, size_t bytes, const char *name)
{
    cl_int err = CL_SUCCESS;
    *mem = clCreateBuffer(clattn_ctx_cl_context(plan->ctx), CL_MEM_READ_WRITE,
                          bytes < 4 ? 4 : bytes, NULL, &err);
    if (err != CL_SUCCESS) {
        *mem = NULL;
        char call[64];
        snprintf(call, sizeof call, "clCreateBuffer(%s)", name);
        fail_cl(plan, err, call);
    }
    return err;
}

static clattn_status make_buffers(clattn_ring_plan *plan)
{
    const clattn_ring_desc *d = &plan->desc;
    const ring_block *mine = &plan->blocks[plan->rank];
    size_t k_floats, v_floats, kpm_bytes, part_floats, lse_floats, max_q = 0;
    for (size_t s = 0; s < mine->segments; ++s)
        if (mine->length[s] > max_q)
            max_q = mine->length[s];
    const size_t kf[4] = {d->batch, d->kv_heads, plan->max_rows, d->head_dim_qk};
    const size_t vf[4] = {d->batch, d->kv_heads, plan->max_rows, d->head_dim_v};
    const size_t pf[4] = {d->batch, d->heads, max_q, d->head_dim_v};
    const size_t lf[3] = {d->batch, d->heads, mine->count};
    const size_t es = plan->elem; /* the blocks' element bytes */
    size_t acc_floats = 0;        /* a 16-bit out's float32 running output */
    if (!product(&k_floats, 4, kf) || !product(&v_floats, 4, vf) || !product(&part_floats, 4, pf) ||
        !product(&lse_floats, 3, lf) || !mul_ok(d->batch, plan->max_rows, &kpm_bytes) ||
        !mul_ok(lse_floats, d->head_dim_v, &acc_floats) || k_floats > SIZE_MAX / 4 ||
        v_floats > SIZE_MAX / 4 || part_floats > SIZE_MAX / 4 || acc_floats > SIZE_MAX / 4)
        return fail(plan, CLATTN_ERR_OVERFLOW, "ring: block sizes overflow size_t");
    if (k_floats * es > INT_MAX || v_floats * es > INT_MAX || kpm_bytes > INT_MAX)
        return fail(plan, CLATTN_ERR_UNSUPPORTED,
                    "ring: a block of %zu k / %zu v elements exceeds MPI's int count of bytes: "
                    "use more ranks",
                    k_floats, v_floats);
    if (part_floats / d->head_dim_v > UINT32_MAX || acc_floats > UINT32_MAX)
        return fail(plan, CLATTN_ERR_UNSUPPORTED, "ring: batch * heads * rows exceeds 2^32");
    if (d->dtype == CLATTN_DTYPE_F32)
        acc_floats = 0; /* out itself accumulates */
    cl_int err = CL_SUCCESS;
    if ((err = new_buffer(plan, &plan->part_out, part_floats * 4, "partial out")) ||
        (err = new_buffer(plan, &plan->part_lse, part_floats / d->head_dim_v * 4, "partial lse")) ||
        (err = new_buffer(plan, &plan->own_lse, lse_floats * 4, "lse")) ||
        (acc_floats && (err = new_buffer(plan, &plan->out_acc, acc_floats * 4, "float32 out"))))
        return (clattn_status)err;
    plan->device_bytes =
        part_floats * 4 + part_floats / d->head_dim_v * 4 + lse_floats * 4 + acc_floats * 4;
    if (plan->ranks == 1) /* one rank: no block ever travels, no staging */
        return CLATTN_SUCCESS;
    if ((err = new_buffer(plan, &plan->dev_k, k_floats * es, "k block")) ||
        (err = new_buffer(plan, &plan->dev_v, v_floats * es, "v block")) ||
        (err = new_buffer(plan, &plan->dev_kpm, kpm_bytes, "key padding block")))
        return (clattn_status)err;
    const size_t block_bytes = (k_floats + v_floats) * es + kpm_bytes;
    plan->host_bytes = 2 * block_bytes;
    plan->device_bytes += block_bytes;
    for (int i = 0; i < 2; ++i) {
        plan->host_k[i] = malloc(k_floats ? k_floats * es : 4);
        plan->host_v[i] = malloc(v_floats ? v_floats * es : 4);
        plan->host_kpm[i] = malloc(kpm_bytes ? kpm_bytes : 1);
        if (!plan->host_k[i] || !plan->host_v[i] || !plan->host_kpm[i])
            return fail(plan, CLATTN_ERR_HOST_MEMORY,
                        "ring: out of host memory (staging: 2 x %zu bytes)", block_bytes);
    }
    return CLATTN_SUCCESS;
}

clattn_status clattn_ring_plan_create(clattn_ctx *ctx, MPI_Comm comm, const clattn_ring_desc *desc,
                                      clattn_ring_plan **out, char *message, size_t message_size)
{
    if (out)
        *out = NULL;
    if (message && message_size)
        message[0] = '\0';
    clattn_ring_plan *plan = calloc(1, sizeof *plan);
    if (plan == NULL) {
        if (message && message_size)
            snprintf(message, message_size, "ring: out of host memory");
        return CLATTN_ERR_HOST_MEMORY;
    }
    plan->comm = MPI_COMM_NULL;
    clattn_status status = CLATTN_SUCCESS;
    int rc = MPI_Comm_dup(comm, &plan->comm);
    if (rc != MPI_SUCCESS) {
        plan->comm = MPI_COMM_NULL;
        status = fail_mpi(plan, rc, "MPI_Comm_dup");
        goto done;
    }
    if ((rc = MPI_Comm_set_errhandler(plan->comm, MPI_ERRORS_RETURN)) != MPI_SUCCESS ||
        (rc = MPI_Comm_rank(plan->comm, &plan->rank)) != MPI_SUCCESS ||
        (rc = MPI_Comm_size(plan->comm, &plan->ranks)) != MPI_SUCCESS) {
        status = fail_mpi(plan, rc, "MPI_Comm_set_errhandler/rank/size");
        goto done; /* the same on every rank */
    }
    clattn_status local = CLATTN_SUCCESS;
    if (ctx == NULL || desc == NULL || out == NULL)
        local = fail(plan, CLATTN_ERR_INVALID_ARGUMENT, "ring: %s is NULL",
                     ctx == NULL    ? "ctx"
                     : desc == NULL ? "desc"
                                    : "out");
    else if ((local = check_desc(plan, desc)) == CLATTN_SUCCESS) {
        plan->ctx = ctx;
        plan->desc = *desc;
        if (plan->desc.kv_heads == 0)
            plan->desc.kv_heads = plan->desc.heads;
        /* Allocated before the agreement, so that no rank fails alone in the gather. */
        plan->blocks = calloc((size_t)plan->ranks, sizeof *plan->blocks);
        plan->kblocks = calloc((size_t)plan->ranks, sizeof *plan->kblocks);
        plan->lengths = calloc((size_t)plan->ranks, sizeof *plan->lengths);
        plan->kv_lengths = calloc((size_t)plan->ranks, sizeof *plan->kv_lengths);
        if (plan->blocks == NULL || plan->kblocks == NULL || plan->lengths == NULL ||
            plan->kv_lengths == NULL)
            local = fail(plan, CLATTN_ERR_HOST_MEMORY, "ring: out of host memory (%d blocks)",
                         plan->ranks);
    }
    if ((status = agree(plan, local, "validating the ring descriptor")) ||
        (status = check_same(plan)) || (status = gather_blocks(plan)))
        goto done; /* these fail alike on every rank */
    local = make_sub_plans(plan);
    if (local == CLATTN_SUCCESS)
        local = make_merge_kernel(plan);
    if (local == CLATTN_SUCCESS)
        local = make_buffers(plan);
    status = agree(plan, local, "creating its ring plan");
done:
    if (status != CLATTN_SUCCESS) {
        if (message && message_size)
            snprintf(message, message_size, "%s", plan->message);
        clattn_ring_plan_release(plan);
        return status;
    }
    *out = plan;
    return CLATTN_SUCCESS;
}

static clattn_ring_rows rows_of_block(const ring_block *b)
{
    clattn_ring_rows rows;
    memset(&rows, 0, sizeof rows);
    if (b == NULL)
        return rows;
    rows.count = b->count;
    rows.segments = b->segments;
    for (size_t s = 0; s < b->segments; ++s) {
        rows.start[s] = b->start[s];
        rows.length[s] = b->length[s];
    }
    return rows;
}

clattn_ring_rows clattn_ring_plan_rows(const clattn_ring_plan *plan)
{
    return rows_of_block(plan ? &plan->blocks[plan->rank] : NULL);
}

clattn_ring_rows clattn_ring_plan_kv_rows(const clattn_ring_plan *plan)
{
    return rows_of_block(plan ? &plan->kblocks[plan->rank] : NULL);
}

void clattn_ring_plan_release(clattn_ring_plan *plan)
{
    if (plan == NULL)
        return;
    if (plan->sub)
        for (size_t i = 0; i < (size_t)plan->ranks * 4; ++i)
            clattn_plan_release(plan->sub[i]);
    free(plan->sub);
    if (plan->store)
        clReleaseKernel(plan->store);
    if (plan->sink)
        clReleaseKernel(plan->sink);
    if (plan->program)
        clReleaseProgram(plan->program);
    cl_mem mems[7] = {plan->part_out, plan->part_lse, plan->own_lse, plan->dev_k,
                      plan->dev_v,    plan->dev_kpm,  plan->out_acc};
    for (int i = 0; i < 7; ++i)
        if (mems[i])
            clReleaseMemObject(mems[i]);
    for (int i = 0; i < 2; ++i) {
        free(plan->host_k[i]);
        free(plan->host_v[i]);
        free(plan->host_kpm[i]);
    }
    free(plan->blocks);
    free(plan->kblocks);
    free(plan->lengths);
    free(plan->kv_lengths);
    if (plan->comm != MPI_COMM_NULL)
        MPI_Comm_free(&plan->comm);
    free(plan);
}

const char *clattn_ring_last_error(const clattn_ring_plan *plan)
{
    return plan ? plan->message : "ring: plan is NULL";
}

clattn_status clattn_ring_plan_memory(const clattn_ring_plan *plan, size_t *host_bytes,
                                      size_t *device_bytes)
{
    if (plan == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    if (host_bytes)
        *host_bytes = plan->host_bytes;
    if (device_bytes)
        *device_bytes = plan->device_bytes;
    return CLATTN_SUCCESS;
}

clattn_ring_timing clattn_ring_last_timing(const clattn_ring_plan *plan)
{
    clattn_ring_timing none;
    memset(&none, 0, sizeof none);
    return plan ? plan->timing : none;
}

/* ---- execution -------------------------------------------------------------------------- */

/* t must be a packed tensor of the given dtype and dims on a buffer holding it. */
static clattn_status check_tensor(clattn_ring_plan *plan, const char *name, const clattn_tensor *t,
                                  clattn_dtype dtype, int rank, const size_t *dims,
                                  size_t *elements)
{
    if (t == NULL || t->rank == 0 || t->mem == NULL)
        return fail(plan, CLATTN_ERR_INVALID_ARGUMENT, "ring: %s is %s", name,
                    t == NULL      ? "NULL"
                    : t->rank == 0 ? "absent (rank 0)"
                                   : "without a buffer");
    char want[96];
    int used = snprintf(want, sizeof want, "(");
    for (int i = 0; i < rank; ++i)
        used += snprintf(want + used, sizeof want - (size_t)used, "%s%zu", i ? ", " : "", dims[i]);
    snprintf(want + used, sizeof want - (size_t)used, ")");
    bool same = t->dtype == dtype && t->rank == rank;
    for (int i = 0; same && i < rank; ++i)
        same = t->dims[i] == dims[i];
    if (!same)
        return fail(plan, CLATTN_ERR_INVALID_SHAPE,
                    "ring: %s must be %s %s (this rank's rows), got dtype %d rank %d", name,
                    dtype == CLATTN_DTYPE_U8     ? "U8"
                    : dtype == CLATTN_DTYPE_F16  ? "F16"
                    : dtype == CLATTN_DTYPE_BF16 ? "BF16"
                                                 : "F32",
                    want, (int)t->dtype, t->rank);
    size_t packed = 1;
    bool zero = true, row_major = true;
    for (int i = rank - 1; i >= 0; --i) {
        zero = zero && t->strides[i] == 0;
        row_major = row_major && (t->strides[i] == packed || dims[i] == 1);
        packed *= dims[i]; /* dims were checked against the plan's: no overflow */
    }
    if (!zero && !row_major)
        return fail(plan, CLATTN_ERR_INVALID_ARGUMENT,
                    "ring: %s must be packed row-major (strides 0 or packed)", name);
    size_t have = 0;
    cl_int err = clGetMemObjectInfo(t->mem, CL_MEM_SIZE, sizeof have, &have, NULL);
    if (err != CL_SUCCESS)
        return fail_cl(plan, err, "clGetMemObjectInfo(CL_MEM_SIZE)");
    const size_t size = clattn_dtype_size(dtype);
    if (t->offset > SIZE_MAX / size - packed || (t->offset + packed) * size > have)
        return fail(plan, CLATTN_ERR_BUFFER_TOO_SMALL,
                    "ring: %s buffer too small: offset %zu + %zu elements need %zu bytes, the "
                    "buffer has %zu",
                    name, t->offset, packed, (t->offset + packed) * size, have);
    *elements = packed;
    return CLATTN_SUCCESS;
}

static clattn_status check_args(clattn_ring_plan *plan, const clattn_tensor *q,
                                const clattn_tensor *k, const clattn_tensor *v,
                                const clattn_tensor *out, const clattn_tensor *lse,
                                const clattn_tensor *kpm)
{
    const clattn_ring_desc *d = &plan->desc;
    const size_t rows = plan->blocks[plan->rank].count, kv_rows = plan->kblocks[plan->rank].count;
    const size_t qd[4] = {d->batch, d->heads, rows, d->head_dim_qk};
    const size_t kd[4] = {d->batch, d->kv_heads, kv_rows, d->head_dim_qk};
    const size_t vd[4] = {d->batch, d->kv_heads, kv_rows, d->head_dim_v};
    const size_t od[4] = {d->batch, d->heads, rows, d->head_dim_v};
    const size_t ld[3] = {d->batch, d->heads, rows};
    const size_t pd[2] = {d->batch, kv_rows};
    size_t n;
    clattn_status status;
    if (rows > 0 && ((status = check_tensor(plan, "q", q, d->dtype, 4, qd, &n)) ||
                     (status = check_tensor(plan, "out", out, d->dtype, 4, od, &n)) ||
                     (lse && lse->rank != 0 &&
                      (status = check_tensor(plan, "lse", lse, CLATTN_DTYPE_F32, 3, ld, &n)))))
        return status;
    if (kv_rows > 0 &&
        ((status = check_tensor(plan, "k", k, d->dtype, 4, kd, &n)) ||
         (status = check_tensor(plan, "v", v, d->dtype, 4, vd, &n)) ||
         (d->key_padding &&
          (status = check_tensor(plan, "key_padding_mask", kpm, CLATTN_DTYPE_U8, 2, pd, &n)))))
        return status;
    if (!d->key_padding && kpm && kpm->rank != 0)
        return fail(plan, CLATTN_ERR_INVALID_ARGUMENT,
                    "ring: key_padding_mask given but the plan was made without key_padding");
    return CLATTN_SUCCESS;
}

/* The block in hand at one step: where its k, v and key padding lie. */
typedef struct ring_kv {
    cl_mem k, v, kpm;
    size_t k_offset, v_offset, kpm_offset; /* elements */
} ring_kv;

static void release_event(cl_event *event)
{
    if (*event) {
        clReleaseEvent(*event);
        *event = NULL;
    }
}

/* A kernel argument: its size and value (clSetKernelArg's). */
typedef struct ring_arg {
    size_t size;
    const void *value;
} ring_arg;

/* Sets kernel's arguments and launches it over `count` work-items (work-groups of
 * MERGE_LOCAL) on the context's queue after *last, which then becomes the launch's event
 * (ring_sink, ring_store); `name` names the kernel in messages. */
static clattn_status launch_after(clattn_ring_plan *plan, cl_kernel kernel, const char *name,
                                  const ring_arg *args, cl_uint num_args, cl_uint count,
                                  cl_event *last)
{
    cl_int err = CL_SUCCESS;
    for (cl_uint a = 0; a < num_args; ++a)
        if ((err = clSetKernelArg(kernel, a, args[a].size, args[a].value)) != CL_SUCCESS)
            return fail(plan, (clattn_status)err, "ring: clSetKernelArg(%s, %u): %s", name, a,
                        clattn_status_string((clattn_status)err));
    const size_t local = MERGE_LOCAL;
    const size_t global = ((size_t)count + local - 1) / local * local;
    cl_event done = NULL;
    err = clEnqueueNDRangeKernel(clattn_ctx_queue(plan->ctx), kernel, 1, NULL, &global, &local,
                                 *last ? 1 : 0, *last ? last : NULL, &done);
    if (err != CL_SUCCESS)
        return fail(plan, (clattn_status)err, "ring: clEnqueueNDRangeKernel(%s): %s", name,
                    clattn_status_string((clattn_status)err));
    release_event(last);
    *last = done;
    return CLATTN_SUCCESS;
}

/* Folds the sub-plan's partial result (part_out, part_lse: (B, H, qlen) rows) into rows
 * row0 .. row0 + qlen - 1 of the running out and lse ((B, H, rows) rows), in place, with the
 * library's clattn_merge_states, after *last (which becomes the merge's event). */
static clattn_status merge_part(clattn_ring_plan *plan, const clattn_tensor *out, cl_mem lse,
                                size_t lse_offset, size_t qlen, size_t rows, size_t row0,
                                cl_event *last)
{
    const clattn_ring_desc *d = &plan->desc;
    const size_t B = d->batch, H = d->heads, dv = d->head_dim_v;
    clattn_tensor run_o = clattn_tensor_make(out->mem, out->offset + row0 * dv, CLATTN_DTYPE_F32,
                                             4, B, H, qlen, dv);
    run_o.strides[0] = H * rows * dv, run_o.strides[1] = rows * dv;
    clattn_tensor run_lse =
        clattn_tensor_make(lse, lse_offset + row0, CLATTN_DTYPE_F32, 3, B, H, qlen, 0);
    run_lse.strides[0] = H * rows, run_lse.strides[1] = rows;
    const clattn_tensor part_o =
        clattn_tensor_make(plan->part_out, 0, CLATTN_DTYPE_F32, 4, B, H, qlen, dv);
    const clattn_tensor part_lse =
        clattn_tensor_make(plan->part_lse, 0, CLATTN_DTYPE_F32, 3, B, H, qlen, 0);
    cl_event done = NULL;
    const clattn_status status =
        clattn_merge_states(plan->ctx, &run_o, &run_lse, &part_o, &part_lse, &run_o, &run_lse,
                            *last ? 1 : 0, *last ? last : NULL, &done);
    if (status != CLATTN_SUCCESS)
        return fail(plan, status, "ring: merge: %s", clattn_last_error(plan->ctx));
    release_event(last);
    *last = done;
    return CLATTN_SUCCESS;
}

/* Enqueues the sub-plans and merges of the block of rank `src`; *last receives the event of
 * the last command (chained after *last's previous value, which it releases). */
static clattn_status compute_block(clattn_ring_plan *plan, int src, const ring_kv *kv,
                                   const clattn_tensor *q, const clattn_tensor *out, cl_mem lse,
                                   size_t lse_offset, cl_event *last)
{
    const clattn_ring_desc *d = &plan->desc;
    const ring_block *mine = &plan->blocks[plan->rank], *kb = &plan->kblocks[src];
    cl_command_queue queue = clattn_ctx_queue(plan->ctx);
    for (size_t qs = 0; qs < mine->segments; ++qs)
        for (size_t ks = 0; ks < kb->segments; ++ks) {
            clattn_plan *sub = plan->sub[((size_t)src * 2 + qs) * 2 + ks];
            if (sub == NULL)
                continue;
            const size_t ql = mine->length[qs], kl = kb->length[ks];
            clattn_tensors t;
            memset(&t, 0, sizeof t);
            t.q = view4(d->dtype, d->batch, d->heads, ql, d->head_dim_qk, mine->count);
            t.q.mem = q->mem;
            t.q.offset = q->offset + mine->local[qs] * d->head_dim_qk;
            t.k = view4(d->dtype, d->batch, d->kv_heads, kl, d->head_dim_qk, kb->count);
            t.k.mem = kv->k;
            t.k.offset = kv->k_offset + kb->local[ks] * d->head_dim_qk;
            t.v = view4(d->dtype, d->batch, d->kv_heads, kl, d->head_dim_v, kb->count);
            t.v.mem = kv->v;
            t.v.offset = kv->v_offset + kb->local[ks] * d->head_dim_v;
            t.out = clattn_tensor_make(plan->part_out, 0, CLATTN_DTYPE_F32, 4, d->batch, d->heads,
                                       ql, d->head_dim_v);
            t.lse = clattn_tensor_make(plan->part_lse, 0, CLATTN_DTYPE_F32, 3, d->batch, d->heads,
                                       ql, 0);
            if (d->key_padding) {
                t.key_padding_mask = clattn_tensor_make(kv->kpm, kv->kpm_offset + kb->local[ks],
                                                        CLATTN_DTYPE_U8, 2, d->batch, kl, 0, 0);
                t.key_padding_mask.strides[0] = kb->count;
                t.key_padding_mask.strides[1] = 1;
            }
            cl_event done = NULL;
            clattn_status status =
                clattn_plan_execute(sub, t.by_role, CLATTN_ROLE_COUNT, queue, NULL, *last ? 1 : 0,
                                    *last ? last : NULL, &done);
            if (status != CLATTN_SUCCESS)
                return fail(plan, status, "ring: SDPA sub-plan (block of rank %d): %s", src,
                            clattn_last_error(plan->ctx));
            release_event(last);
            *last = done;
            if ((status = merge_part(plan, out, lse, lse_offset, ql, mine->count,
                                     mine->local[qs], last)))
                return status;
        }
    return CLATTN_SUCCESS;
}

/* Out rows = 0 and lse = -inf before the first merge. */
static clattn_status reset_outputs(clattn_ring_plan *plan, const clattn_tensor *out, cl_mem lse,
                                   size_t lse_offset, cl_event *last)
{
    const clattn_ring_desc *d = &plan->desc;
    const size_t rows = plan->blocks[plan->rank].count;
    cl_command_queue queue = clattn_ctx_queue(plan->ctx);
    const size_t lse_count = d->batch * d->heads * rows, out_count = lse_count * d->head_dim_v;
    const float zero = 0.0f, minus_inf = -INFINITY;
    cl_event e1 = NULL, e2 = NULL;
    cl_int err = clEnqueueFillBuffer(queue, out->mem, &zero, sizeof zero, out->offset * 4,
                                     out_count * 4, 0, NULL, &e1); /* the float32 output */
    if (err != CL_SUCCESS)
        return fail_cl(plan, err, "clEnqueueFillBuffer(out)");
    err = clEnqueueFillBuffer(queue, lse, &minus_inf, sizeof minus_inf, lse_offset * 4,
                              lse_count * 4, 1, &e1, &e2);
    release_event(&e1);
    if (err != CL_SUCCESS)
        return fail_cl(plan, err, "clEnqueueFillBuffer(lse)");
    *last = e2;
    return CLATTN_SUCCESS;
}

/* Bytes of rank r's k (head_dim_qk) or v (head_dim_v) block in desc.dtype. */
static size_t block_bytes(const clattn_ring_plan *plan, int r, size_t head_dim)
{
    return plan->desc.batch * plan->desc.kv_heads * plan->kblocks[r].count * head_dim * plan->elem;
}

/* Reads this rank's k, v (and key padding) into host staging slot 0. */
static clattn_status stage_own(clattn_ring_plan *plan, const clattn_tensor *k,
                               const clattn_tensor *v, const clattn_tensor *kpm)
{
    const int r = plan->rank;
    const size_t kb = block_bytes(plan, r, plan->desc.head_dim_qk);
    const size_t vb = block_bytes(plan, r, plan->desc.head_dim_v);
    const size_t pb = plan->desc.batch * plan->kblocks[r].count, es = plan->elem;
    if (plan->kblocks[r].count == 0)
        return CLATTN_SUCCESS;
    cl_command_queue queue = clattn_ctx_queue(plan->ctx);
    cl_int err = clEnqueueReadBuffer(queue, k->mem, CL_TRUE, k->offset * es, kb, plan->host_k[0],
                                     0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = clEnqueueReadBuffer(queue, v->mem, CL_TRUE, v->offset * es, vb, plan->host_v[0], 0,
                                  NULL, NULL);
    if (err == CL_SUCCESS && plan->desc.key_padding)
        err = clEnqueueReadBuffer(queue, kpm->mem, CL_TRUE, kpm->offset, pb, plan->host_kpm[0], 0,
                                  NULL, NULL);
    if (err != CL_SUCCESS)
        return fail_cl(plan, err, "clEnqueueReadBuffer(own k/v block)");
    return CLATTN_SUCCESS;
}

/* Posts the receive of the next block (from the left) into slot `into` and the send of the
 * block in slot `from` (of rank `src`) to the right. */
static clattn_status post_exchange(clattn_ring_plan *plan, int src, int next_src, int from,
                                   int into, MPI_Request *requests, int *count)
{
    const int left = (plan->rank - 1 + plan->ranks) % plan->ranks;
    const int right = (plan->rank + 1) % plan->ranks;
    /* (byte counts: each below INT_MAX, checked at creation) */
    const int kf_in = (int)block_bytes(plan, next_src, plan->desc.head_dim_qk);
    const int vf_in = (int)block_bytes(plan, next_src, plan->desc.head_dim_v);
    const int kf_out = (int)block_bytes(plan, src, plan->desc.head_dim_qk);
    const int vf_out = (int)block_bytes(plan, src, plan->desc.head_dim_v);
    const int pb_in = (int)(plan->desc.batch * plan->kblocks[next_src].count);
    const int pb_out = (int)(plan->desc.batch * plan->kblocks[src].count);
    /* k (tag 0), v (tag 1) and the key padding (tag 2, when given): every receive, then every
     * send */
    void *const in[3] = {plan->host_k[into], plan->host_v[into], plan->host_kpm[into]};
    void *const out[3] = {plan->host_k[from], plan->host_v[from], plan->host_kpm[from]};
    const int in_bytes[3] = {kf_in, vf_in, pb_in}, out_bytes[3] = {kf_out, vf_out, pb_out};
    const MPI_Datatype types[3] = {MPI_BYTE, MPI_BYTE, MPI_UNSIGNED_CHAR};
    const int parts = plan->desc.key_padding ? 3 : 2;
    int rc = MPI_SUCCESS;
    *count = 0;
    for (int i = 0; i < parts && rc == MPI_SUCCESS; ++i)
        rc = MPI_Irecv(in[i], in_bytes[i], types[i], left, i, plan->comm, &requests[(*count)++]);
    for (int i = 0; i < parts && rc == MPI_SUCCESS; ++i)
        rc = MPI_Isend(out[i], out_bytes[i], types[i], right, i, plan->comm,
                       &requests[(*count)++]);
    if (rc != MPI_SUCCESS) {
        --*count; /* the failed call gave no request */
        return fail_mpi(plan, rc, "MPI_Irecv/MPI_Isend(k/v block)");
    }
    plan->timing.bytes_sent +=
        (size_t)kf_out + (size_t)vf_out + (plan->desc.key_padding ? (size_t)pb_out : 0);
    return CLATTN_SUCCESS;
}

/* Writes the received block in host slot `slot` to the device block, after *last (the
 * step's compute, which reads the device block: one slot serves every step). The step's
 * clFinish then completes the writes before the next step's compute. */
static clattn_status upload_block(clattn_ring_plan *plan, int src, int slot, cl_event *last)
{
    cl_command_queue queue = clattn_ctx_queue(plan->ctx);
    const size_t kb = block_bytes(plan, src, plan->desc.head_dim_qk);
    const size_t vb = block_bytes(plan, src, plan->desc.head_dim_v);
    const size_t pb = plan->desc.batch * plan->kblocks[src].count;
    if (plan->kblocks[src].count == 0)
        return CLATTN_SUCCESS;
    const cl_uint waits = *last ? 1 : 0;
    const cl_event *wait = *last ? last : NULL;
    cl_int err = clEnqueueWriteBuffer(queue, plan->dev_k, CL_FALSE, 0, kb, plan->host_k[slot],
                                      waits, wait, NULL);
    if (err == CL_SUCCESS)
        err = clEnqueueWriteBuffer(queue, plan->dev_v, CL_FALSE, 0, vb, plan->host_v[slot],
                                   waits, wait, NULL);
    if (err == CL_SUCCESS && plan->desc.key_padding)
        err = clEnqueueWriteBuffer(queue, plan->dev_kpm, CL_FALSE, 0, pb, plan->host_kpm[slot],
                                   waits, wait, NULL);
    if (err != CL_SUCCESS)
        return fail_cl(plan, err, "clEnqueueWriteBuffer(received k/v block)");
    return CLATTN_SUCCESS;
}

clattn_status clattn_ring_set_sinks(clattn_ring_plan *plan, const clattn_tensor *sinks)
{
    if (plan == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    plan->message[0] = '\0';
    if (sinks == NULL || sinks->rank == 0) {
        memset(&plan->sinks, 0, sizeof plan->sinks);
        return CLATTN_SUCCESS;
    }
    if (sinks->dtype != CLATTN_DTYPE_F32 || sinks->rank != 1 ||
        sinks->dims[0] != plan->desc.heads || sinks->mem == NULL)
        return fail(plan, CLATTN_ERR_INVALID_SHAPE,
                    "ring: sinks must be F32 (heads) = (%zu) with a buffer, one logit per query "
                    "head (got dtype %d rank %d dim 0 %zu)",
                    plan->desc.heads, (int)sinks->dtype, sinks->rank,
                    sinks->rank ? sinks->dims[0] : 0);
    size_t have = 0;
    const size_t stride = sinks->strides[0] ? sinks->strides[0] : 1;
    cl_int err = clGetMemObjectInfo(sinks->mem, CL_MEM_SIZE, sizeof have, &have, NULL);
    if (err != CL_SUCCESS)
        return fail_cl(plan, err, "clGetMemObjectInfo(sinks)");
    if ((sinks->offset + (plan->desc.heads - 1) * stride + 1) * 4 > have)
        return fail(plan, CLATTN_ERR_BUFFER_TOO_SMALL, "ring: sinks buffer too small (%zu bytes)",
                    have);
    plan->sinks = *sinks;
    plan->sinks.strides[0] = stride;
    return CLATTN_SUCCESS;
}

/* Attention sinks into the float32 out (or out_acc) and lse after the last merge, after *last. */
static clattn_status fold_sinks(clattn_ring_plan *plan, const clattn_tensor *target, cl_mem lse,
                                size_t lse_offset, cl_event *last)
{
    const clattn_ring_desc *d = &plan->desc;
    const cl_uint rows = (cl_uint)plan->blocks[plan->rank].count;
    const cl_uint heads = (cl_uint)d->heads, dv = (cl_uint)d->head_dim_v;
    const cl_uint count = (cl_uint)(d->batch * d->heads) * rows; /* below 2^32: creation */
    const cl_ulong out_offset = target->offset, lse_off = lse_offset;
    const cl_ulong s_offset = plan->sinks.offset, s_stride = plan->sinks.strides[0];
    const ring_arg args[] = {{sizeof(cl_mem), &target->mem},   {sizeof out_offset, &out_offset},
                             {sizeof(cl_mem), &lse},           {sizeof lse_off, &lse_off},
                             {sizeof(cl_mem), &plan->sinks.mem}, {sizeof s_offset, &s_offset},
                             {sizeof s_stride, &s_stride},     {sizeof heads, &heads},
                             {sizeof rows, &rows},             {sizeof dv, &dv},
                             {sizeof count, &count}};
    return launch_after(plan, plan->sink, "ring_sink", args, sizeof args / sizeof args[0], count,
                        last);
}

/* A 16-bit out: the float32 running output rounded into it (ring_store), after *last. */
static clattn_status store_out(clattn_ring_plan *plan, const clattn_tensor *out, cl_event *last)
{
    const clattn_ring_desc *d = &plan->desc;
    const cl_uint count = (cl_uint)(d->batch * d->heads * plan->blocks[plan->rank].count *
                                    d->head_dim_v); /* below 2^32: checked at creation */
    const cl_ulong offset = out->offset;
    const cl_int bf16 = d->dtype == CLATTN_DTYPE_BF16;
    const ring_arg args[] = {{sizeof(cl_mem), &plan->out_acc}, {sizeof(cl_mem), &out->mem},
                             {sizeof offset, &offset},         {sizeof count, &count},
                             {sizeof bf16, &bf16}};
    return launch_after(plan, plan->store, "ring_store", args, sizeof args / sizeof args[0], count,
                        last);
}

clattn_status clattn_ring_execute(clattn_ring_plan *plan, const clattn_tensor *q,
                                  const clattn_tensor *k, const clattn_tensor *v,
                                  const clattn_tensor *out, const clattn_tensor *lse,
                                  const clattn_tensor *key_padding_mask)
{
    if (plan == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    plan->message[0] = '\0';
    memset(&plan->timing, 0, sizeof plan->timing);
    const double t_start = now_s();
    cl_command_queue queue = clattn_ctx_queue(plan->ctx);
    clattn_status status =
        agree(plan, check_args(plan, q, k, v, out, lse, key_padding_mask), "checking arguments");
    if (status != CLATTN_SUCCESS)
        return status;
    const bool has_rows = plan->blocks[plan->rank].count > 0;
    const bool user_lse = lse && lse->rank != 0;
    cl_mem lse_mem = user_lse ? lse->mem : plan->own_lse;
    const size_t lse_offset = user_lse ? lse->offset : 0;
    /* the float32 output the merges accumulate: out, or out_acc for a 16-bit out */
    clattn_tensor target;
    memset(&target, 0, sizeof target);
    if (has_rows)
        target = *out;
    if (plan->out_acc) {
        target.mem = plan->out_acc;
        target.offset = 0;
    }
    cl_event last = NULL;
    MPI_Request requests[6];
    int pending = 0;
    clattn_status local = CLATTN_SUCCESS;
    const double t0 = now_s();
    if (has_rows)
        local = reset_outputs(plan, &target, lse_mem, lse_offset, &last);
    /* this rank's own keys go around (cross-attention: a rank may hold keys and no queries) */
    if (local == CLATTN_SUCCESS && plan->ranks > 1 && plan->kblocks[plan->rank].count > 0)
        local = stage_own(plan, k, v, key_padding_mask);
    plan->timing.staging_s += now_s() - t0;
    for (int step = 0; step < plan->ranks; ++step) {
        const int src = (plan->rank - step + plan->ranks) % plan->ranks;
        const int next_src = (src - 1 + plan->ranks) % plan->ranks;
        const int slot = step % 2, next = (step + 1) % 2;
        const double t_post = now_s();
        if (step + 1 < plan->ranks) {
            clattn_status posted =
                post_exchange(plan, src, next_src, slot, next, requests, &pending);
            if (local == CLATTN_SUCCESS)
                local = posted;
        }
        const double t_compute = now_s();
        device_clock *clock = &plan->clock; /* in the plan: outlives a late callback */
        atomic_store(&clock->done, 0);
        bool timed = false;
        if (local == CLATTN_SUCCESS && has_rows) {
            ring_kv kv;
            const bool own = step == 0 && plan->kblocks[plan->rank].count > 0;
            const bool own_kpm = own && plan->desc.key_padding;
            if (step == 0)
                kv = (ring_kv){own ? k->mem : NULL,
                               own ? v->mem : NULL,
                               own_kpm ? key_padding_mask->mem : NULL,
                               own ? k->offset : 0,
                               own ? v->offset : 0,
                               own_kpm ? key_padding_mask->offset : 0};
            else
                kv = (ring_kv){plan->dev_k, plan->dev_v, plan->dev_kpm, 0, 0, 0};
            if (!plan->desc.key_padding)
                kv.kpm = NULL;
            cl_event before = last;
            if (before)
                clRetainEvent(before);
            local = compute_block(plan, src, &kv, q, &target, lse_mem, lse_offset, &last);
            /* Time the step's device work when it enqueued any (last changed). */
            if (local == CLATTN_SUCCESS && last && last != before)
                timed = clSetEventCallback(last, CL_COMPLETE, on_compute_done, clock) == CL_SUCCESS;
            release_event(&before);
            if (last)
                clFlush(queue);
        }
        const double t_wait = now_s();
        if (pending > 0) {
            int rc = MPI_Waitall(pending, requests, MPI_STATUSES_IGNORE);
            pending = 0;
            if (rc != MPI_SUCCESS && local == CLATTN_SUCCESS)
                local = fail_mpi(plan, rc, "MPI_Waitall(k/v block)");
        }
        const double t_waited = now_s();
        if (local == CLATTN_SUCCESS && step + 1 < plan->ranks)
            local = upload_block(plan, next_src, next, &last);
        if (local == CLATTN_SUCCESS && step + 1 == plan->ranks && has_rows &&
            plan->sinks.rank != 0) /* the sinks join each row once, after every key block */
            local = fold_sinks(plan, &target, lse_mem, lse_offset, &last);
        if (local == CLATTN_SUCCESS && step + 1 == plan->ranks && has_rows && plan->out_acc)
            local = store_out(plan, out, &last); /* 16-bit out: rounded once, at the end */
        cl_int err = clFinish(queue);
        if (err != CL_SUCCESS && local == CLATTN_SUCCESS)
            local = fail_cl(plan, err, "clFinish");
        const double t_done = now_s();
        /* The device's part of the step: enqueue to its last compute command's completion. */
        const double computed = timed ? compute_end(clock, t_done) : t_compute;
        plan->timing.compute_s += computed - t_compute;
        plan->timing.comm_s += t_waited - t_post;
        const double idle_from = computed > t_wait ? computed : t_wait;
        if (t_waited > idle_from)
            plan->timing.comm_wait_s += t_waited - idle_from;
        plan->timing.staging_s += t_done - (computed > t_waited ? computed : t_waited);
        plan->timing.steps = step + 1;
        char where[64];
        snprintf(where, sizeof where, "at step %d", step);
        status = agree(plan, local, where);
        plan->timing.sync_s += now_s() - t_done;
        if (status != CLATTN_SUCCESS)
            break;
    }
    release_event(&last);
    plan->timing.total_s = now_s() - t_start;
    return status;
}
