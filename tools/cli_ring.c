/* `clattn sdpa --ring` under mpirun: every rank has read the same input files; it takes its
 * rows, runs the ring (libclattn_mpi) and rank 0 gathers the output rows into the whole
 * output. Built only with -DCLATTN_MPI=ON. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "clattn_mpi.h"
#include "cli.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static bool initialised_by_us;
static bool agreed; /* whether this rank has taken part in the start agreement */

int cli_ring_init(void)
{
    int already = 0;
    MPI_Initialized(&already);
    if (!already) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return cli_fail("sdpa", CLI_FAILED, "--ring: MPI_Init_thread failed");
        initialised_by_us = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    /* PoCL's kernel cache: a subfolder per rank of $POCL_CACHE_DIR (before the first OpenCL
     * call). The ranks build the same new kernel variants at once, and two PoCL processes
     * writing one cache entry at the same moment have failed a build. */
    const char *cache = getenv("POCL_CACHE_DIR");
    int rank = 0;
    if (cache && *cache && MPI_Comm_rank(MPI_COMM_WORLD, &rank) == MPI_SUCCESS) {
        char own[4096];
        snprintf(own, sizeof own, "%s/mpi-rank%d", cache, rank);
        setenv("POCL_CACHE_DIR", own, 1);
    }
    return CLI_OK;
}

/* Every rank says whether it got as far as the ring; all go on only when all did. */
static bool agree_start(bool ok)
{
    agreed = true;
    int mine = ok ? 1 : 0, all = 0;
    if (MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
        return false;
    return all == 1;
}

static bool agree_ok(bool ok)
{
    int mine = ok ? 1 : 0, all = 0;
    return MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) == MPI_SUCCESS &&
           all == 1;
}

void cli_ring_finalize(void)
{
    if (!agreed)
        agree_start(false); /* this rank failed before the ring: release the others */
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (initialised_by_us && !finalized)
        MPI_Finalize();
}

/* The rows of rank r: ZIGZAG's chunks, or L / N each (the first L % N ranks one more). */
static clattn_ring_rows rows_of(bool zigzag, size_t seq, int ranks, int r)
{
    clattn_ring_rows rows;
    memset(&rows, 0, sizeof rows);
    if (zigzag) {
        clattn_ring_zigzag_rows(seq, ranks, r, &rows);
        return rows;
    }
    const size_t n = (size_t)ranks, i = (size_t)r, extra = seq % n;
    rows.segments = 1;
    rows.count = rows.length[0] = seq / n + (i < extra ? 1 : 0);
    rows.start[0] = i * (seq / n) + (i < extra ? i : extra);
    return rows;
}

/* Moves the rows of a strided (B, H, L, d) host view to and from (B, H, count, d): packs
 * view's rows into out when view is given, else unpacks packed into out's rows. */
static void move_rows(const float *view, const float *packed, const size_t dims[4],
                      const size_t strides[4], const clattn_ring_rows *rows, float *out)
{
    size_t at = 0;
    for (size_t b = 0; b < dims[0]; ++b)
        for (size_t h = 0; h < dims[1]; ++h)
            for (size_t s = 0; s < rows->segments; ++s)
                for (size_t i = 0; i < rows->length[s]; ++i)
                    for (size_t c = 0; c < dims[3]; ++c, ++at) {
                        const size_t cell = b * strides[0] + h * strides[1] +
                                            (rows->start[s] + i) * strides[2] + c * strides[3];
                        if (view)
                            out[at] = view[cell];
                        else
                            out[cell] = packed[at];
                    }
}

static cl_mem device_copy(clattn_ctx *ctx, const void *data, size_t bytes, cl_int *err)
{
    return clCreateBuffer(clattn_ctx_cl_context(ctx),
                          CL_MEM_READ_WRITE | (data ? CL_MEM_COPY_HOST_PTR : 0), bytes ? bytes : 4,
                          (void *)data, err);
}

/* This rank's share of a ring run: its rows of q and of k and v, their sizes, and the host
 * buffers (packed rows, 16-bit staging, the key padding). */
typedef struct ring_share {
    int rank, ranks;
    clattn_ring_rows rows, krows;
    size_t n, nk, b, h, hkv, dk, dv;
    size_t q_count, k_count, v_count, o_count;
    bool half; /* 16-bit files: the ring runs in their type (the values are exact in it) */
    clattn_dtype dtype;
    size_t es; /* dtype's bytes */
    float *q, *k, *v, *o;
    uint16_t *bits;
    uint8_t *kpm; /* --nonpad-kv-seqlen: (b, nk), nonzero = padding */
} ring_share;

/* The rank's rows (the queries' and the keys': cross-attention has a sequence of its own, split
 * alike) and room for them; false when out of memory. */
static bool share_of(const cli_ring_job *job, ring_share *s)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &s->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &s->ranks);
    s->rows = rows_of(job->zigzag, job->q_dims[2], s->ranks, s->rank);
    s->krows = rows_of(job->zigzag, job->k_dims[2], s->ranks, s->rank);
    s->n = s->rows.count, s->nk = s->krows.count, s->b = job->q_dims[0], s->h = job->q_dims[1];
    s->hkv = job->k_dims[1], s->dk = job->q_dims[3], s->dv = job->v_dims[3];
    s->q_count = s->b * s->h * s->n * s->dk, s->k_count = s->b * s->hkv * s->nk * s->dk;
    s->v_count = s->b * s->hkv * s->nk * s->dv, s->o_count = s->b * s->h * s->n * s->dv;
    s->half = job->storage == CLATTN_IO_F16 || job->storage == CLATTN_IO_BF16;
    s->dtype = job->storage == CLATTN_IO_F16    ? CLATTN_DTYPE_F16
               : job->storage == CLATTN_IO_BF16 ? CLATTN_DTYPE_BF16
                                                : CLATTN_DTYPE_F32;
    s->es = clattn_dtype_size(s->dtype);
    const size_t most = s->q_count > s->k_count ? s->q_count : s->k_count;
    s->q = malloc((s->q_count ? s->q_count : 1) * sizeof(float));
    s->k = malloc((s->k_count ? s->k_count : 1) * sizeof(float));
    s->v = malloc((s->v_count ? s->v_count : 1) * sizeof(float));
    s->o = malloc((s->o_count ? s->o_count : 1) * sizeof(float));
    s->bits =
        s->half ? malloc(((most > s->v_count ? most : s->v_count) + s->o_count + 1) * 2) : NULL;
    s->kpm = job->counts ? malloc(s->b * s->nk + 1) : NULL;
    return s->q && s->k && s->v && s->o && (!s->half || s->bits) && (!job->counts || s->kpm);
}

static void share_free(ring_share *s)
{
    free(s->q), free(s->k), free(s->v), free(s->o), free(s->bits), free(s->kpm);
}

/* The rank's rows packed; the key padding (--nonpad-kv-seqlen: the keys past a batch's count
 * are padding, where they lie). */
static void pack_share(const cli_ring_job *job, ring_share *s)
{
    move_rows(job->q, NULL, job->q_dims, job->q_strides, &s->rows, s->q);
    move_rows(job->k, NULL, job->k_dims, job->k_strides, &s->krows, s->k);
    move_rows(job->v, NULL, job->v_dims, job->v_strides, &s->krows, s->v);
    for (size_t bi = 0; s->kpm && bi < s->b; ++bi) {
        size_t at = 0;
        for (size_t g = 0; g < s->krows.segments; ++g)
            for (size_t i = 0; i < s->krows.length[g]; ++i, ++at)
                s->kpm[bi * s->nk + at] =
                    (long long)(s->krows.start[g] + i) >= (long long)job->counts[bi];
    }
}

/* The ring's descriptor for this rank's share. */
static void ring_describe(const cli_ring_job *job, const ring_share *s, clattn_ring_desc *desc)
{
    clattn_ring_desc_init(desc);
    desc->batch = s->b, desc->heads = s->h, desc->kv_heads = s->hkv;
    desc->head_dim_qk = s->dk, desc->head_dim_v = s->dv, desc->seq_len = job->q_dims[2];
    desc->layout = job->zigzag ? CLATTN_RING_ZIGZAG : CLATTN_RING_CONTIGUOUS;
    desc->local_len = s->n;
    desc->kv_seq_len = job->k_dims[2], desc->kv_local_len = s->nk;
    desc->dtype = s->dtype;
    desc->key_padding = s->kpm != NULL;
    const clattn_causal align =
        job->bottom_right ? CLATTN_CAUSAL_BOTTOM_RIGHT : CLATTN_CAUSAL_TOP_LEFT;
    desc->causal = job->causal ? align : CLATTN_CAUSAL_NONE;
    desc->window_align = job->window ? align : CLATTN_CAUSAL_NONE;
    desc->window_left = job->window_left, desc->window_right = job->window_right;
    desc->scale = job->scale, desc->softcap = job->softcap;
}

/* The share on the device (mems: q, k, v, out, the padding, the sinks); the first error. */
static cl_int upload_share(clattn_ctx *ctx, clattn_ring_plan *plan, const cli_ring_job *job,
                           ring_share *s, cl_mem mems[6])
{
    cl_int err = CL_SUCCESS;
    const float *sources[3] = {s->q, s->k, s->v};
    const size_t counts[3] = {s->q_count, s->k_count, s->v_count};
    const bool held[3] = {s->n > 0, s->nk > 0, s->nk > 0};
    for (int i = 0; i < 3 && err == CL_SUCCESS; ++i) { /* 16-bit: rounded (exactly) */
        if (s->half && held[i])
            clattn_io_round16(sources[i], counts[i], job->storage, s->bits);
        mems[i] = device_copy(ctx,
                              !held[i]  ? NULL
                              : s->half ? (const void *)s->bits
                                        : (const void *)sources[i],
                              counts[i] * s->es, &err);
    }
    if (err == CL_SUCCESS)
        mems[3] = device_copy(ctx, NULL, s->o_count * s->es, &err);
    if (err == CL_SUCCESS && s->kpm)
        mems[4] = device_copy(ctx, s->nk ? s->kpm : NULL, s->b * s->nk, &err);
    if (err == CL_SUCCESS && job->sinks) { /* the sinks join each row once, at the end */
        mems[5] = device_copy(ctx, job->sinks, s->h * sizeof(float), &err);
        const clattn_tensor ts = clattn_tensor_make(mems[5], 0, CLATTN_DTYPE_F32, 1, s->h, 0, 0, 0);
        if (err == CL_SUCCESS && clattn_ring_set_sinks(plan, &ts) != CLATTN_SUCCESS)
            err = CL_INVALID_VALUE;
    }
    return err;
}

/* The ring run on the uploaded share (every rank agreeing that its buffers are there), its
 * rows of the output read back into s->o; --ring-timing's line. */
static int execute_share(clattn_ctx *ctx, clattn_ring_plan *plan, const cli_ring_job *job,
                         ring_share *s, const cl_mem mems[6], cl_int err)
{
    const size_t b = s->b, h = s->h, hkv = s->hkv, n = s->n, nk = s->nk;
    const clattn_tensor tq = clattn_tensor_make(mems[0], 0, s->dtype, 4, b, h, n, s->dk);
    const clattn_tensor tk = clattn_tensor_make(mems[1], 0, s->dtype, 4, b, hkv, nk, s->dk);
    const clattn_tensor tv = clattn_tensor_make(mems[2], 0, s->dtype, 4, b, hkv, nk, s->dv);
    const clattn_tensor to = clattn_tensor_make(mems[3], 0, s->dtype, 4, b, h, n, s->dv);
    const clattn_tensor tp = clattn_tensor_make(mems[4], 0, CLATTN_DTYPE_U8, 2, b, nk, 0, 0);
    if (!agree_ok(err == CL_SUCCESS))
        return cli_fail("sdpa", CLI_FAILED, "--ring: device buffers failed (on some rank)");
    const clattn_status status =
        clattn_ring_execute(plan, &tq, &tk, &tv, &to, NULL, s->kpm ? &tp : NULL);
    if (status == CLATTN_SUCCESS && n > 0)
        err = clEnqueueReadBuffer(clattn_ctx_queue(ctx), mems[3], CL_TRUE, 0, s->o_count * s->es,
                                  s->half ? (void *)s->bits : (void *)s->o, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS && n > 0 && s->half && err == CL_SUCCESS)
        clattn_io_widen16(s->bits, s->o_count, job->storage, s->o);
    if (status != CLATTN_SUCCESS)
        return cli_fail("sdpa", CLI_FAILED, "--ring: %s: %s", clattn_mpi_status_string(status),
                        clattn_ring_last_error(plan));
    if (!agree_ok(err == CL_SUCCESS))
        return cli_fail("sdpa", CLI_FAILED, "--ring: reading the output failed");
    if (job->timing) {
        const clattn_ring_timing t = clattn_ring_last_timing(plan);
        fprintf(stderr,
                "ring rank %d/%d: rows %zu, %.3f s over %d steps (compute %.3f, comm "
                "%.3f, waiting %.3f, staging %.3f, sync %.3f), %zu bytes sent\n",
                s->rank, s->ranks, n, t.total_s, t.steps, t.compute_s, t.comm_s, t.comm_wait_s,
                t.staging_s, t.sync_s, t.bytes_sent);
    }
    return CLI_OK;
}

/* Gather: rank 0 receives every rank's packed rows and places them in out. (Every rank reaches
 * this with the same rc: the ring and the agreements fail alike everywhere.) */
static int gather_output(const cli_ring_job *job, const ring_share *s, float *out)
{
    int rc = CLI_OK;
    const size_t seq = job->q_dims[2], b = s->b, h = s->h, dv = s->dv;
    int *counts = NULL, *displs = NULL;
    float *all = NULL;
    bool fits = true;
    if (s->rank == 0) {
        counts = calloc((size_t)s->ranks, sizeof *counts);
        displs = calloc((size_t)s->ranks, sizeof *displs);
        size_t total = 0;
        for (int r = 0; r < s->ranks && counts && displs; ++r) {
            const size_t c = b * h * rows_of(job->zigzag, seq, s->ranks, r).count * dv;
            fits = fits && c <= INT_MAX && total <= INT_MAX;
            counts[r] = (int)c;
            displs[r] = (int)total;
            total += c;
        }
        all = malloc((total ? total : 1) * sizeof(float));
        fits = fits && counts && displs && all && total <= INT_MAX;
    }
    if (!agree_ok(fits && s->o_count <= INT_MAX)) {
        rc = cli_fail("sdpa", CLI_FAILED, "--ring: the output is too large to gather");
    } else if (MPI_Gatherv(s->o, (int)s->o_count, MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0,
                           MPI_COMM_WORLD) != MPI_SUCCESS) {
        rc = cli_fail("sdpa", CLI_FAILED, "--ring: MPI_Gatherv failed");
    } else if (s->rank == 0) {
        const size_t dims[4] = {b, h, seq, dv};
        for (int r = 0; r < s->ranks; ++r) {
            const clattn_ring_rows rr = rows_of(job->zigzag, seq, s->ranks, r);
            move_rows(NULL, all + displs[r], dims, job->out_strides, &rr, out);
        }
    }
    free(counts);
    free(displs);
    free(all);
    return rc;
}

int cli_ring_sdpa(const cli_ring_job *job, float *out, bool *root)
{
    ring_share s;
    memset(&s, 0, sizeof s);
    bool ok = share_of(job, &s);
    *root = s.rank == 0;
    clattn_ctx *ctx = NULL;
    if (!ok)
        cli_fail("sdpa", CLI_FAILED, "--ring: out of memory for rank %d's rows", s.rank);
    else if ((ctx = cli_context("sdpa", job->device)) == NULL)
        ok = false;
    if (!agree_start(ok)) {
        share_free(&s);
        clattn_ctx_release(ctx);
        return ok ? cli_fail("sdpa", CLI_FAILED, "--ring: another rank failed before the ring")
                  : CLI_FAILED;
    }
    pack_share(job, &s);
    int rc = CLI_OK;
    clattn_ring_desc desc;
    ring_describe(job, &s, &desc);
    clattn_ring_plan *plan = NULL;
    char message[1024] = "";
    clattn_status status =
        clattn_ring_plan_create(ctx, MPI_COMM_WORLD, &desc, &plan, message, sizeof message);
    cl_mem mems[6] = {NULL}; /* q, k, v, out, the padding, the sinks */
    if (status == CLATTN_SUCCESS) {
        const cl_int err = upload_share(ctx, plan, job, &s, mems);
        rc = execute_share(ctx, plan, job, &s, mems, err);
    } else {
        rc = cli_fail("sdpa",
                      status == CLATTN_ERR_INVALID_ARGUMENT || status == CLATTN_ERR_INVALID_SHAPE
                          ? CLI_BAD_INPUT
                          : CLI_FAILED,
                      "--ring: %s: %s", clattn_mpi_status_string(status), message);
    }
    if (rc == CLI_OK)
        rc = gather_output(job, &s, out);
    clattn_ring_plan_release(plan);
    cli_release_buffers(mems, 6);
    clattn_ctx_release(ctx);
    share_free(&s);
    return rc;
}

/* ---- clattn bench --op ring ------------------------------------------------------------- */

static const char ring_bench_usage[] =
    "Run as: mpirun -np N clattn bench --op ring [options].\n"
    "Ring attention (libclattn_mpi) over the ranks: each rank makes random inputs for its own\n"
    "rows only (memory O(L/N): q, k, v, out plus two k/v blocks in flight), one plan per size,\n"
    "--warmup runs, then --runs timed ones. Rank 0 prints, per rank, the median run's time and\n"
    "its split summed over the N steps: compute (device, enqueue to completion), comm (the\n"
    "exchanges, overlapping compute), wait (communication after the device had finished: not\n"
    "hidden), staging (host copies not overlapped), sync (waiting for the slowest rank at each\n"
    "step's status agreement), MB sent, the rank's data (q, k, v, out: 'data MiB') and what its\n"
    "plan allocated (host staging + device block and partials: 'plan MiB', both O(L/N)), and\n"
    "the rank's peak RSS. --dtype f16 or bf16: q, k, v and out in that storage (the blocks\n"
    "travel at 2 bytes an element; clattn_ring_desc.dtype).\n"
    "Defaults: --seq 2048, --batch 1, --heads 8, --head-dim 64, contiguous, not causal, f32.\n";

typedef struct ring_bench_row {
    double rows, total_ms, compute_ms, comm_ms, wait_ms, staging_ms, sync_ms, sent_mb, rss_mib,
        steps, data_mib, plan_mib;
} ring_bench_row;

static double peak_rss_mib(void)
{
    struct rusage usage;
    return getrusage(RUSAGE_SELF, &usage) == 0 ? usage.ru_maxrss / 1024.0 : 0.0;
}

static const char *dtype_name(clattn_dtype dtype)
{
    return dtype == CLATTN_DTYPE_F16 ? "f16" : dtype == CLATTN_DTYPE_BF16 ? "bf16" : "f32";
}

static int compare_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One size: every rank's row of the table (rank 0 receives them all into rows). */
static int ring_bench_case(clattn_ctx *ctx, const clattn_ring_desc *base, size_t runs,
                           size_t warmup, ring_bench_row *all)
{
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    clattn_ring_desc desc = *base;
    const bool zigzag = desc.layout == CLATTN_RING_ZIGZAG;
    const clattn_ring_rows rows = rows_of(zigzag, desc.seq_len, ranks, rank);
    desc.local_len = rows.count;
    const size_t n = rows.count, b = desc.batch, h = desc.heads;
    const size_t hkv = desc.kv_heads ? desc.kv_heads : h, d = desc.head_dim_qk;
    const size_t counts[4] = {b * h * n * d, b * hkv * n * d, b * hkv * n * d, b * h * n * d};
    const size_t es = clattn_dtype_size(desc.dtype);
    const clattn_io_dtype io = desc.dtype == CLATTN_DTYPE_F16    ? CLATTN_IO_F16
                               : desc.dtype == CLATTN_DTYPE_BF16 ? CLATTN_IO_BF16
                                                                 : CLATTN_IO_F32;
    size_t largest = 1;
    for (int i = 0; i < 4; ++i)
        largest = counts[i] > largest ? counts[i] : largest;
    float *host = malloc(largest * sizeof(float));
    uint16_t *bits = es == 2 ? malloc(largest * sizeof *bits) : NULL;
    cl_mem mem[4] = {NULL, NULL, NULL, NULL};
    cl_int err = host && (es != 2 || bits) ? CL_SUCCESS : CL_OUT_OF_HOST_MEMORY;
    unsigned state = 12345u + (unsigned)rank;
    for (int i = 0; i < 4 && err == CL_SUCCESS; ++i) {
        for (size_t j = 0; j < counts[i]; ++j) {
            state = state * 1664525u + 1013904223u;
            host[j] = (float)(state >> 8) / 8388608.0f - 1.0f;
        }
        clattn_io_round16(host, counts[i], io, bits); /* (16-bit storage only) */
        const void *data = es == 2 ? (const void *)bits : (const void *)host;
        mem[i] = device_copy(ctx, i < 3 && counts[i] ? data : NULL, counts[i] * es, &err);
    }
    free(host);
    free(bits);
    int rc = CLI_OK;
    clattn_ring_plan *plan = NULL;
    char message[1024] = "";
    if (!agree_ok(err == CL_SUCCESS)) {
        rc = cli_fail("bench", CLI_FAILED, "ring: device buffers failed (on some rank)");
    } else {
        clattn_status status =
            clattn_ring_plan_create(ctx, MPI_COMM_WORLD, &desc, &plan, message, sizeof message);
        if (status != CLATTN_SUCCESS)
            rc = cli_fail("bench", CLI_FAILED, "ring: %s: %s", clattn_mpi_status_string(status),
                          message);
    }
    ring_bench_row mine;
    memset(&mine, 0, sizeof mine);
    if (rc == CLI_OK) {
        const clattn_tensor tq = clattn_tensor_make(mem[0], 0, desc.dtype, 4, b, h, n, d);
        const clattn_tensor tk = clattn_tensor_make(mem[1], 0, desc.dtype, 4, b, hkv, n, d);
        const clattn_tensor tv = clattn_tensor_make(mem[2], 0, desc.dtype, 4, b, hkv, n, d);
        const clattn_tensor to = clattn_tensor_make(mem[3], 0, desc.dtype, 4, b, h, n, d);
        clattn_ring_timing *timings = calloc(runs, sizeof *timings);
        double *totals = calloc(runs, sizeof *totals);
        if (timings == NULL || totals == NULL)
            rc = cli_fail("bench", CLI_FAILED, "out of memory");
        for (size_t run = 0; rc == CLI_OK && run < warmup + runs; ++run) {
            MPI_Barrier(MPI_COMM_WORLD); /* every rank starts the run together */
            clattn_status status = clattn_ring_execute(plan, &tq, &tk, &tv, &to, NULL, NULL);
            if (status != CLATTN_SUCCESS)
                rc = cli_fail("bench", CLI_FAILED, "ring: %s: %s", clattn_mpi_status_string(status),
                              clattn_ring_last_error(plan));
            else if (run >= warmup)
                timings[run - warmup] = clattn_ring_last_timing(plan);
        }
        if (rc == CLI_OK) {
            for (size_t i = 0; i < runs; ++i)
                totals[i] = timings[i].total_s;
            qsort(totals, runs, sizeof *totals, compare_double);
            const double median = totals[runs / 2];
            size_t pick = 0;
            for (size_t i = 0; i < runs; ++i)
                if (timings[i].total_s == median)
                    pick = i;
            const clattn_ring_timing *t = &timings[pick];
            mine = (ring_bench_row){(double)n,
                                    1e3 * t->total_s,
                                    1e3 * t->compute_s,
                                    1e3 * t->comm_s,
                                    1e3 * t->comm_wait_s,
                                    1e3 * t->staging_s,
                                    1e3 * t->sync_s,
                                    (double)t->bytes_sent / 1e6,
                                    peak_rss_mib(),
                                    (double)t->steps,
                                    0.0,
                                    0.0};
            size_t host_bytes = 0, device_bytes = 0;
            clattn_ring_plan_memory(plan, &host_bytes, &device_bytes);
            mine.plan_mib = (double)(host_bytes + device_bytes) / 1048576.0;
            mine.data_mib =
                (double)(counts[0] + counts[1] + counts[2] + counts[3]) * (double)es / 1048576.0;
        }
        free(timings);
        free(totals);
    }
    clattn_ring_plan_release(plan);
    cli_release_buffers(mem, 4);
    const int fields = (int)(sizeof mine / sizeof(double));
    if (MPI_Gather(&mine, fields, MPI_DOUBLE, all, fields, MPI_DOUBLE, 0, MPI_COMM_WORLD) !=
        MPI_SUCCESS)
        rc = cli_fail("bench", CLI_FAILED, "ring: MPI_Gather failed");
    return rc;
}

typedef struct ring_bench_options {
    size_t seqs[16], num_seq;
    cli_bench shape; /* --batch --heads --kv-heads --head-dim --runs --warmup --json */
    cli_score score; /* --causal */
    cli_exec exec;   /* --device */
    int zigzag, dtype;
    const char *op;
} ring_bench_options;

static int parse_ring_op(const cli_args *args, const char *value, void *target)
{
    if (strcmp(value, "ring") != 0)
        return cli_fail(args->command, -1, "--op ring runs alone, not with '%s'", value);
    *(const char **)target = value;
    return 1;
}

static int parse_ring_seq(const cli_args *args, const char *value, void *target)
{
    ring_bench_options *o = target;
    return cli_parse_size_list(args->command, "--seq", value, o->seqs, 16, &o->num_seq) ? 1 : -1;
}

static const cli_choice ring_layouts[] = {{"contiguous", 0}, {"zigzag", 1}, {NULL, 0}};
static const cli_choice ring_dtypes[] = {
    {"f32", CLATTN_DTYPE_F32}, {"f16", CLATTN_DTYPE_F16}, {"bf16", CLATTN_DTYPE_BF16}, {NULL, 0}};

#define AT(field) CLI_AT(ring_bench_options, field)
static const cli_option ring_bench_table[] = {
    {CLI_OPT("--op", CLI_CUSTOM, AT(op), "ring", "ring attention over the MPI ranks"),
     .handle = parse_ring_op, .flags = CLI_REQUIRED},
    {CLI_OPT("--seq", CLI_CUSTOM, 0, "L,...", "sequence lengths (default 2048)"),
     .handle = parse_ring_seq},
    CLI_USE(cli_bench_group, ring_bench_options, shape, 0),
    CLI_USE(cli_score_group, ring_bench_options, score, CLI_SCORE_CAUSAL),
    {CLI_OPT("--ring-layout", CLI_CHOICE, AT(zigzag), NULL, "the rows of each rank"),
     .choices = ring_layouts},
    {CLI_OPT("--dtype", CLI_CHOICE, AT(dtype), NULL, "q, k, v and out storage (default f32)"),
     .choices = ring_dtypes},
    CLI_USE(cli_exec_group, ring_bench_options, exec, 0),
};
#undef AT
static const char *const ring_bench_help[] = {ring_bench_usage, NULL};
static const cli_command ring_bench_command =
    CLI_COMMAND("bench", ring_bench_table, ring_bench_help);

int cli_ring_bench(int argc, char **argv)
{
    ring_bench_options o = {
        .seqs = {2048},
        .num_seq = 1,
        .shape = {.batch = 1, .heads = 8, .head_dim = 64, .runs = 5, .warmup = 1},
        .dtype = CLATTN_DTYPE_F32};
    const int parsed = cli_parse_command(&ring_bench_command, argc, argv, &o);
    if (parsed != CLI_OK)
        return parsed < 0 ? CLI_OK : parsed;
    size_t *seqs = o.seqs;
    const size_t num_seq = o.num_seq, runs = o.shape.runs, warmup = o.shape.warmup;
    const bool json = o.shape.json;
    const char *device = o.exec.device;
    clattn_ring_desc desc;
    clattn_ring_desc_init(&desc);
    desc.batch = o.shape.batch, desc.heads = o.shape.heads, desc.kv_heads = o.shape.kv_heads;
    desc.head_dim_qk = o.shape.head_dim;
    desc.causal = o.score.causal ? CLATTN_CAUSAL_TOP_LEFT : desc.causal;
    desc.layout = o.zigzag ? CLATTN_RING_ZIGZAG : desc.layout;
    desc.dtype = (clattn_dtype)o.dtype;
    desc.head_dim_v = desc.head_dim_qk;
    int rc = cli_ring_init();
    if (rc != CLI_OK)
        return rc;
    agreed = true; /* the bench agrees at each step itself */
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    clattn_ctx *ctx = cli_context("bench", device);
    ring_bench_row *all = calloc((size_t)ranks, sizeof *all);
    if (!agree_ok(ctx != NULL && all != NULL))
        rc = ctx ? cli_fail("bench", CLI_FAILED, "ring: no device or memory on some rank")
                 : CLI_FAILED;
    if (rc == CLI_OK && rank == 0 && !json)
        printf("ring attention, %d ranks, %s, B=%zu H=%zu Hkv=%zu d=%zu%s %s, median of %zu\n"
               "%7s %5s %7s %10s %10s %10s %10s %10s %10s %8s %9s %9s %8s\n",
               ranks, desc.layout == CLATTN_RING_ZIGZAG ? "zigzag" : "contiguous", desc.batch,
               desc.heads, desc.kv_heads ? desc.kv_heads : desc.heads, desc.head_dim_qk,
               desc.causal ? " causal" : "",
               dtype_name(desc.dtype),
               runs, "L", "rank", "rows", "total ms", "compute",
               "comm", "wait", "staging", "sync", "MB sent", "data MiB", "plan MiB", "rss MiB");
    for (size_t i = 0; rc == CLI_OK && i < num_seq; ++i) {
        desc.seq_len = seqs[i];
        rc = ring_bench_case(ctx, &desc, runs, warmup, all);
        for (int r = 0; rc == CLI_OK && rank == 0 && r < ranks; ++r) {
            const ring_bench_row *w = &all[r];
            if (json)
                printf("{\"op\": \"ring\", \"ranks\": %d, \"rank\": %d, \"layout\": \"%s\", "
                       "\"dtype\": \"%s\", \"causal\": %s, \"batch\": %zu, \"heads\": %zu, \"kv_heads\": %zu, "
                       "\"head_dim\": %zu, \"seq\": %zu, \"rows\": %.0f, \"steps\": %.0f, "
                       "\"total_ms\": %.3f, \"compute_ms\": %.3f, \"comm_ms\": %.3f, "
                       "\"wait_ms\": %.3f, \"staging_ms\": %.3f, \"sync_ms\": %.3f, "
                       "\"mb_sent\": %.3f, \"data_mib\": %.2f, \"plan_mib\": %.2f, "
                       "\"peak_rss_mib\": %.1f}\n",
                       ranks, r, desc.layout == CLATTN_RING_ZIGZAG ? "zigzag" : "contiguous",
                       dtype_name(desc.dtype),
                       desc.causal ? "true" : "false", desc.batch, desc.heads,
                       desc.kv_heads ? desc.kv_heads : desc.heads, desc.head_dim_qk, seqs[i],
                       w->rows, w->steps, w->total_ms, w->compute_ms, w->comm_ms, w->wait_ms,
                       w->staging_ms, w->sync_ms, w->sent_mb, w->data_mib, w->plan_mib, w->rss_mib);
            else
                printf("%7zu %5d %7.0f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %8.2f %9.2f %9.2f "
                       "%8.1f\n",
                       seqs[i], r, w->rows, w->total_ms, w->compute_ms, w->comm_ms, w->wait_ms,
                       w->staging_ms, w->sync_ms, w->sent_mb, w->data_mib, w->plan_mib, w->rss_mib);
        }
    }
    free(all);
    clattn_ctx_release(ctx);
    cli_ring_finalize();
    return rc;
}
