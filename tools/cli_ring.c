/* `clattn sdpa --ring` under mpirun: every rank has read the same input files; it takes its
 * rows, runs the ring (libclattn_mpi) and rank 0 gathers the output rows into the whole
 * output. Built only with -DCLATTN_MPI=ON. */
#include "clattn_mpi.h"
#include "cli.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

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
    const size_t seq = job->q_dims[2], rows_max = seq / (size_t)ranks + 2;
    const clattn_ring_rows rows = rows_of(job->zigzag, seq, ranks, rank);
    const size_t n = rows.count, b = job->q_dims[0], h = job->q_dims[1], hkv = job->k_dims[1];
    const size_t dk = job->q_dims[3], dv = job->v_dims[3];
    const size_t q_count = b * h * n * dk, k_count = b * hkv * n * dk, v_count = b * hkv * n * dv;
    const size_t o_count = b * h * n * dv;
    (void)rows_max;
    float *q = malloc((q_count ? q_count : 1) * sizeof(float));
    float *k = malloc((k_count ? k_count : 1) * sizeof(float));
    float *v = malloc((v_count ? v_count : 1) * sizeof(float));
    float *o = malloc((o_count ? o_count : 1) * sizeof(float));
    clattn_ctx *ctx = NULL;
    bool ok = q && k && v && o;
    if (!ok)
        cli_fail("sdpa", CLI_FAILED, "--ring: out of memory for rank %d's rows", rank);
    else if ((ctx = cli_context("sdpa", job->device)) == NULL)
        ok = false;
    if (!agree_start(ok)) {
        free(q), free(k), free(v), free(o);
        clattn_ctx_release(ctx);
        return ok ? cli_fail("sdpa", CLI_FAILED, "--ring: another rank failed before the ring")
                  : CLI_FAILED;
    }
    pack_rows(job->q, job->q_dims, job->q_strides, &rows, q);
    pack_rows(job->k, job->k_dims, job->k_strides, &rows, k);
    pack_rows(job->v, job->v_dims, job->v_strides, &rows, v);

    int rc = CLI_OK;
    clattn_ring_desc desc;
    clattn_ring_desc_init(&desc);
    desc.batch = b, desc.heads = h, desc.kv_heads = hkv;
    desc.head_dim_qk = dk, desc.head_dim_v = dv, desc.seq_len = seq;
    desc.layout = job->zigzag ? CLATTN_RING_ZIGZAG : CLATTN_RING_CONTIGUOUS;
    desc.local_len = n;
    desc.causal = job->causal ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
    desc.window_align = job->window ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
    desc.window_left = job->window_left, desc.window_right = job->window_right;
    desc.scale = job->scale, desc.softcap = job->softcap;
    clattn_ring_plan *plan = NULL;
    char message[1024] = "";
    clattn_status status =
        clattn_ring_plan_create(ctx, MPI_COMM_WORLD, &desc, &plan, message, sizeof message);
    cl_mem mq = NULL, mk = NULL, mv = NULL, mo = NULL;
    cl_int err = CL_SUCCESS;
    if (status == CLATTN_SUCCESS) {
        mq = device_copy(ctx, n ? q : NULL, q_count * sizeof(float), &err);
        if (err == CL_SUCCESS)
            mk = device_copy(ctx, n ? k : NULL, k_count * sizeof(float), &err);
        if (err == CL_SUCCESS)
            mv = device_copy(ctx, n ? v : NULL, v_count * sizeof(float), &err);
        if (err == CL_SUCCESS)
            mo = device_copy(ctx, NULL, o_count * sizeof(float), &err);
        const clattn_tensor tq = clattn_tensor_make(mq, 0, CLATTN_DTYPE_F32, 4, b, h, n, dk);
        const clattn_tensor tk = clattn_tensor_make(mk, 0, CLATTN_DTYPE_F32, 4, b, hkv, n, dk);
        const clattn_tensor tv = clattn_tensor_make(mv, 0, CLATTN_DTYPE_F32, 4, b, hkv, n, dv);
        const clattn_tensor to = clattn_tensor_make(mo, 0, CLATTN_DTYPE_F32, 4, b, h, n, dv);
        if (!agree_ok(err == CL_SUCCESS)) {
            rc = cli_fail("sdpa", CLI_FAILED, "--ring: device buffers failed (on some rank)");
        } else {
            status = clattn_ring_execute(plan, &tq, &tk, &tv, &to, NULL, NULL);
            if (status == CLATTN_SUCCESS && n > 0)
                err = clEnqueueReadBuffer(clattn_ctx_queue(ctx), mo, CL_TRUE, 0,
                                          o_count * sizeof(float), o, 0, NULL, NULL);
            if (status != CLATTN_SUCCESS)
                rc = cli_fail("sdpa", CLI_FAILED, "--ring: %s: %s",
                              clattn_mpi_status_string(status), clattn_ring_last_error(plan));
            else if (!agree_ok(err == CL_SUCCESS))
                rc = cli_fail("sdpa", CLI_FAILED, "--ring: reading the output failed");
            else if (job->timing) {
                const clattn_ring_timing t = clattn_ring_last_timing(plan);
                fprintf(stderr,
                        "ring rank %d/%d: rows %zu, %.3f s (compute %.3f, comm wait %.3f, "
                        "staging %.3f), %zu bytes sent\n",
                        rank, ranks, n, t.total_s, t.compute_s, t.comm_wait_s, t.staging_s,
                        t.bytes_sent);
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
    const cl_mem mems[4] = {mq, mk, mv, mo};
    for (int i = 0; i < 4; ++i)
        if (mems[i])
            clReleaseMemObject(mems[i]);
    clattn_ctx_release(ctx);
    free(q), free(k), free(v), free(o);
    return rc;
}
