/* Links against an installed libclattn_mpi (find_package(clattn COMPONENTS mpi) or
 * pkg-config clattn_mpi) and runs a ring attention step on every rank: each rank holds L/N
 * rows of q, k and v; the output rows are compared with attention over the whole sequence
 * computed on the host in double. Exit 0 when they agree, 77 without an OpenCL device. */
#include <clattn.h>
#include <clattn_mpi.h>
#include <mpi.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { L_PER_RANK = 5, D = 8 };

static float value_of(size_t row, size_t col, int which)
{
    return (float)sin(0.37 * (double)(row * D + col) + 1.3 * which);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    clattn_ctx *ctx = NULL;
    char message[512];
    int have = clattn_ctx_create(NULL, &ctx, message, sizeof message) == CLATTN_SUCCESS;
    int all = 0;
    MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        if (rank == 0)
            printf("no OpenCL device on some rank: %s\n", have ? "" : message);
        clattn_ctx_release(ctx);
        MPI_Finalize();
        return 77;
    }
    const size_t total = (size_t)L_PER_RANK * (size_t)ranks, first = (size_t)rank * L_PER_RANK;
    float q[L_PER_RANK * D], k[L_PER_RANK * D], v[L_PER_RANK * D], out[L_PER_RANK * D];
    for (size_t i = 0; i < L_PER_RANK; ++i)
        for (size_t c = 0; c < D; ++c) {
            q[i * D + c] = value_of(first + i, c, 0);
            k[i * D + c] = value_of(first + i, c, 1);
            v[i * D + c] = value_of(first + i, c, 2);
        }
    clattn_ring_desc desc;
    clattn_ring_desc_init(&desc);
    desc.batch = 1, desc.heads = 1, desc.head_dim_qk = D, desc.head_dim_v = D;
    desc.seq_len = total, desc.local_len = L_PER_RANK;
    desc.causal = CLATTN_CAUSAL_TOP_LEFT;
    clattn_ring_plan *plan = NULL;
    clattn_status status =
        clattn_ring_plan_create(ctx, MPI_COMM_WORLD, &desc, &plan, message, sizeof message);
    /* This rank's rows in buffers of the library's context, as an application's own. */
    cl_mem mem[4] = {NULL, NULL, NULL, NULL};
    float *host[4] = {q, k, v, out};
    cl_int err = CL_SUCCESS;
    for (int i = 0; i < 4 && status == CLATTN_SUCCESS && err == CL_SUCCESS; ++i)
        mem[i] = clCreateBuffer(clattn_ctx_cl_context(ctx),
                                CL_MEM_READ_WRITE | (i < 3 ? CL_MEM_COPY_HOST_PTR : 0),
                                sizeof q, i < 3 ? host[i] : NULL, &err);
    if (status == CLATTN_SUCCESS && err == CL_SUCCESS) {
        clattn_tensor t[4];
        for (int i = 0; i < 4; ++i)
            t[i] = clattn_tensor_make(mem[i], 0, CLATTN_DTYPE_F32, 4, 1, 1, L_PER_RANK, D);
        status = clattn_ring_execute(plan, &t[0], &t[1], &t[2], &t[3], NULL, NULL);
        if (status == CLATTN_SUCCESS)
            err = clEnqueueReadBuffer(clattn_ctx_queue(ctx), mem[3], CL_TRUE, 0, sizeof out, out,
                                      0, NULL, NULL);
    }
    for (int i = 0; i < 4; ++i)
        if (mem[i])
            clReleaseMemObject(mem[i]);
    if (err != CL_SUCCESS)
        status = (clattn_status)err; /* OpenCL errors are statuses too */
    double worst = 0.0;
    for (size_t i = 0; status == CLATTN_SUCCESS && i < L_PER_RANK; ++i) {
        const size_t row = first + i;
        double scores[64], max = -INFINITY, sum = 0.0;
        for (size_t j = 0; j <= row && j < total; ++j) {
            double s = 0.0;
            for (size_t c = 0; c < D; ++c)
                s += (double)value_of(row, c, 0) * value_of(j, c, 1);
            scores[j] = s / sqrt((double)D);
            max = scores[j] > max ? scores[j] : max;
        }
        for (size_t j = 0; j <= row; ++j)
            sum += exp(scores[j] - max);
        for (size_t c = 0; c < D; ++c) {
            double want = 0.0;
            for (size_t j = 0; j <= row; ++j)
                want += exp(scores[j] - max) / sum * value_of(j, c, 2);
            worst = fmax(worst, fabs(want - out[i * D + c]));
        }
    }
    clattn_ring_plan_release(plan);
    clattn_ctx_release(ctx);
    double all_worst = 0.0;
    int ok = status == CLATTN_SUCCESS && worst < 1e-4, all_ok = 0;
    MPI_Allreduce(&worst, &all_worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 0)
        printf("ring attention over %d rank(s), L = %zu: max |error| %.2e: %s\n", ranks, total,
               all_worst, all_ok ? "ok" : "FAILED");
    if (status != CLATTN_SUCCESS)
        fprintf(stderr, "rank %d: %s: %s\n", rank, clattn_mpi_status_string(status), message);
    MPI_Finalize();
    return all_ok ? 0 : 1;
}
