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

/* Packs rows of a strided (B, H, L, d) host view into (B, H, count, d). */
static void pack_rows(const float *data, const size_t dims[4], const size_t strides[4],
                      const clattn_ring_rows *rows, float *packed)
{
    size_t at = 0;
    for (size_t b = 0; b < dims[0]; ++b)
        for (size_t h = 0; h < dims[1]; ++h)
            for (size_t s = 0; s < rows->segments; ++s)
                for (size_t i = 0; i < rows->length[s]; ++i)
                    for (size_t c = 0; c < dims[3]; ++c)
                        packed[at++] = data[b * strides[0] + h * strides[1] +
                                            (rows->start[s] + i) * strides[2] + c * strides[3]];
}

static void unpack_rows(const float *packed, const size_t dims[4], const size_t strides[4],
                        const clattn_ring_rows *rows, float *data)
{
    size_t at = 0;
    for (size_t b = 0; b < dims[0]; ++b)
        for (size_t h = 0; h < dims[1]; ++h)
            for (size_t s = 0; s < rows->segments; ++s)
                for (size_t i = 0; i < rows->length[s]; ++i)
                    for (size_t c = 0; c < dims[3]; ++c)
                        data[b * strides[0] + h * strides[1] + (rows->start[s] + i) * strides[2] +
                             c * strides[3]] = packed[at++];
}

static cl_mem device_copy(clattn_ctx *ctx, const void *data, size_t bytes, cl_int *err)
{
    return clCreateBuffer(clattn_ctx_cl_context(ctx),
                          CL_MEM_READ_WRITE | (data ? CL_MEM_COPY_HOST_PTR : 0), bytes ? bytes : 4,
                          (void *)data, err);
}

int cli_ring_sdpa(const cli_ring_job *job, float *out, bool *root)
{
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    *root = rank == 0;
    /* the queries' rows and the keys' (cross-attention: a sequence of its own, split alike) */
    const size_t seq = job->q_dims[2], kseq = job->k_dims[2];
    const clattn_ring_rows rows = rows_of(job->zigzag, seq, ranks, rank);
    const clattn_ring_rows krows = rows_of(job->zigzag, kseq, ranks, rank);
    const size_t n = rows.count, nk = krows.count, b = job->q_dims[0], h = job->q_dims[1];
    const size_t hkv = job->k_dims[1], dk = job->q_dims[3], dv = job->v_dims[3];
    const size_t q_count = b * h * n * dk, k_count = b * hkv * nk * dk, v_count = b * hkv * nk * dv;
    const size_t o_count = b * h * n * dv;
    /* 16-bit files: the ring runs in their type (the values are exact in it) */
    const bool half = job->storage == CLATTN_IO_F16 || job->storage == CLATTN_IO_BF16;
    const clattn_dtype dtype = job->storage == CLATTN_IO_F16    ? CLATTN_DTYPE_F16
                               : job->storage == CLATTN_IO_BF16 ? CLATTN_DTYPE_BF16
                                                                : CLATTN_DTYPE_F32;
    const size_t es = clattn_dtype_size(dtype), most = q_count > k_count ? q_count : k_count;
    float *q = malloc((q_count ? q_count : 1) * sizeof(float));
    float *k = malloc((k_count ? k_count : 1) * sizeof(float));
    float *v = malloc((v_count ? v_count : 1) * sizeof(float));
    float *o = malloc((o_count ? o_count : 1) * sizeof(float));
    uint16_t *bits = half ? malloc(((most > v_count ? most : v_count) + o_count + 1) * 2) : NULL;
    uint8_t *kpm = job->counts ? malloc(b * nk + 1) : NULL;
    clattn_ctx *ctx = NULL;
    bool ok = q && k && v && o && (!half || bits) && (!job->counts || kpm);
    if (!ok)
        cli_fail("sdpa", CLI_FAILED, "--ring: out of memory for rank %d's rows", rank);
    else if ((ctx = cli_context("sdpa", job->device)) == NULL)
        ok = false;
    if (!agree_start(ok)) {
        free(q), free(k), free(v), free(o), free(bits), free(kpm);
        clattn_ctx_release(ctx);
        return ok ? cli_fail("sdpa", CLI_FAILED, "--ring: another rank failed before the ring")
                  : CLI_FAILED;
    }
    pack_rows(job->q, job->q_dims, job->q_strides, &rows, q);
    pack_rows(job->k, job->k_dims, job->k_strides, &krows, k);
    pack_rows(job->v, job->v_dims, job->v_strides, &krows, v);
    /* --nonpad-kv-seqlen: the keys past a batch's count are padding, where they lie */
    for (size_t bi = 0; kpm && bi < b; ++bi) {
        size_t at = 0;
        for (size_t s = 0; s < krows.segments; ++s)
            for (size_t i = 0; i < krows.length[s]; ++i, ++at)
                kpm[bi * nk + at] = (long long)(krows.start[s] + i) >= (long long)job->counts[bi];
    }

    int rc = CLI_OK;
    clattn_ring_desc desc;
    clattn_ring_desc_init(&desc);
    desc.batch = b, desc.heads = h, desc.kv_heads = hkv;
    desc.head_dim_qk = dk, desc.head_dim_v = dv, desc.seq_len = seq;
    desc.layout = job->zigzag ? CLATTN_RING_ZIGZAG : CLATTN_RING_CONTIGUOUS;
    desc.local_len = n;
    desc.kv_seq_len = kseq, desc.kv_local_len = nk;
    desc.dtype = dtype;
    desc.key_padding = kpm != NULL;
    const clattn_causal align = job->bottom_right ? CLATTN_CAUSAL_BOTTOM_RIGHT
                                                  : CLATTN_CAUSAL_TOP_LEFT;
    desc.causal = job->causal ? align : CLATTN_CAUSAL_NONE;
    desc.window_align = job->window ? align : CLATTN_CAUSAL_NONE;
    desc.window_left = job->window_left, desc.window_right = job->window_right;
    desc.scale = job->scale, desc.softcap = job->softcap;
    clattn_ring_plan *plan = NULL;
    char message[1024] = "";
    clattn_status status =
        clattn_ring_plan_create(ctx, MPI_COMM_WORLD, &desc, &plan, message, sizeof message);
    cl_mem mq = NULL, mk = NULL, mv = NULL, mo = NULL, mp = NULL, ms = NULL;
    cl_int err = CL_SUCCESS;
    if (status == CLATTN_SUCCESS) {
        const float *sources[3] = {q, k, v};
        const size_t counts[3] = {q_count, k_count, v_count};
        const bool held[3] = {n > 0, nk > 0, nk > 0};
        cl_mem *mems[3] = {&mq, &mk, &mv};
        for (int i = 0; i < 3 && err == CL_SUCCESS; ++i) { /* 16-bit: rounded (exactly) */
            if (half && held[i])
                clattn_io_round16(sources[i], counts[i], job->storage, bits);
            *mems[i] = device_copy(ctx, !held[i] ? NULL : half ? (const void *)bits
                                                               : (const void *)sources[i],
                                   counts[i] * es, &err);
        }
        if (err == CL_SUCCESS)
            mo = device_copy(ctx, NULL, o_count * es, &err);
        if (err == CL_SUCCESS && kpm)
            mp = device_copy(ctx, nk ? kpm : NULL, b * nk, &err);
        if (err == CL_SUCCESS && job->sinks) { /* the sinks join each row once, at the end */
            ms = device_copy(ctx, job->sinks, h * sizeof(float), &err);
            const clattn_tensor ts = clattn_tensor_make(ms, 0, CLATTN_DTYPE_F32, 1, h, 0, 0, 0);
            if (err == CL_SUCCESS && clattn_ring_set_sinks(plan, &ts) != CLATTN_SUCCESS)
                err = CL_INVALID_VALUE;
        }
        const clattn_tensor tq = clattn_tensor_make(mq, 0, dtype, 4, b, h, n, dk);
        const clattn_tensor tk = clattn_tensor_make(mk, 0, dtype, 4, b, hkv, nk, dk);
        const clattn_tensor tv = clattn_tensor_make(mv, 0, dtype, 4, b, hkv, nk, dv);
        const clattn_tensor to = clattn_tensor_make(mo, 0, dtype, 4, b, h, n, dv);
        const clattn_tensor tp = clattn_tensor_make(mp, 0, CLATTN_DTYPE_U8, 2, b, nk, 0, 0);
        if (!agree_ok(err == CL_SUCCESS)) {
            rc = cli_fail("sdpa", CLI_FAILED, "--ring: device buffers failed (on some rank)");
        } else {
            status = clattn_ring_execute(plan, &tq, &tk, &tv, &to, NULL, kpm ? &tp : NULL);
            if (status == CLATTN_SUCCESS && n > 0)
                err = clEnqueueReadBuffer(clattn_ctx_queue(ctx), mo, CL_TRUE, 0, o_count * es,
                                          half ? (void *)bits : (void *)o, 0, NULL, NULL);
            if (status == CLATTN_SUCCESS && n > 0 && half && err == CL_SUCCESS)
                clattn_io_widen16(bits, o_count, job->storage, o);
            if (status != CLATTN_SUCCESS)
                rc = cli_fail("sdpa", CLI_FAILED, "--ring: %s: %s",
                              clattn_mpi_status_string(status), clattn_ring_last_error(plan));
            else if (!agree_ok(err == CL_SUCCESS))
                rc = cli_fail("sdpa", CLI_FAILED, "--ring: reading the output failed");
            else if (job->timing) {
                const clattn_ring_timing t = clattn_ring_last_timing(plan);
                fprintf(stderr,
                        "ring rank %d/%d: rows %zu, %.3f s over %d steps (compute %.3f, comm "
                        "%.3f, waiting %.3f, staging %.3f, sync %.3f), %zu bytes sent\n",
                        rank, ranks, n, t.total_s, t.steps, t.compute_s, t.comm_s, t.comm_wait_s,
                        t.staging_s, t.sync_s, t.bytes_sent);
            }
        }
    } else {
        rc = cli_fail("sdpa",
                      status == CLATTN_ERR_INVALID_ARGUMENT || status == CLATTN_ERR_INVALID_SHAPE
                          ? CLI_BAD_INPUT
                          : CLI_FAILED,
                      "--ring: %s: %s", clattn_mpi_status_string(status), message);
    }
    /* Gather: rank 0 receives every rank's packed rows and places them. (Every rank reaches
     * this with the same rc: the ring and the agreements above fail alike everywhere.) */
    if (rc == CLI_OK) {
        int *counts = NULL, *displs = NULL;
        float *all = NULL;
        bool fits = true;
        if (rank == 0) {
            counts = calloc((size_t)ranks, sizeof *counts);
            displs = calloc((size_t)ranks, sizeof *displs);
            size_t total = 0;
            for (int r = 0; r < ranks && counts && displs; ++r) {
                const size_t c = b * h * rows_of(job->zigzag, seq, ranks, r).count * dv;
                fits = fits && c <= INT_MAX && total <= INT_MAX;
                counts[r] = (int)c;
                displs[r] = (int)total;
                total += c;
            }
            all = malloc((total ? total : 1) * sizeof(float));
            fits = fits && counts && displs && all && total <= INT_MAX;
        }
        if (!agree_ok(fits && o_count <= INT_MAX)) {
            rc = cli_fail("sdpa", CLI_FAILED, "--ring: the output is too large to gather");
        } else if (MPI_Gatherv(o, (int)o_count, MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0,
                               MPI_COMM_WORLD) != MPI_SUCCESS) {
            rc = cli_fail("sdpa", CLI_FAILED, "--ring: MPI_Gatherv failed");
        } else if (rank == 0) {
            const size_t dims[4] = {b, h, seq, dv};
            for (int r = 0; r < ranks; ++r) {
                const clattn_ring_rows rr = rows_of(job->zigzag, seq, ranks, r);
                unpack_rows(all + displs[r], dims, job->out_strides, &rr, out);
            }
        }
        free(counts);
        free(displs);
        free(all);
    }
    clattn_ring_plan_release(plan);
    const cl_mem mems[6] = {mq, mk, mv, mo, mp, ms};
    for (int i = 0; i < 6; ++i)
        if (mems[i])
            clReleaseMemObject(mems[i]);
    clattn_ctx_release(ctx);
    free(q), free(k), free(v), free(o), free(bits), free(kpm);
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
    for (int i = 0; i < 4; ++i)
        if (mem[i])
            clReleaseMemObject(mem[i]);
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
    CLI_USE(cli_exec_group, ring_bench_options, exec, CLI_EXEC_DEVICE),
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
