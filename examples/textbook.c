/* The textbook self-attention example, computed on the default OpenCL device:
 * three 4-dimensional inputs, 4x4 projection matrices, scale 1/2 (= 1/sqrt(d_k)).
 * Prints Q, K, V, the scores Q·Kᵀ, the attention weights and the output Z.
 * Build it with the project (target `textbook`) and run it; CLATTN_DEVICE picks the device. */
#include <clattn.h>

#include <stdio.h>
#include <stdlib.h>

#define L 3 /* sequence length */
#define D 4 /* d_model = d_k = d_v */

static void print_matrix(const char *title, const float *m, int rows, int cols)
{
    printf("%s\n", title);
    for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < cols; ++c)
            printf(" %10.6f", m[r * cols + c]);
        printf("\n");
    }
    printf("\n");
}

/* Q = X·W through the device matmul, so that every printed matrix comes from clattn. */
static clattn_status project(clattn_ctx *ctx, const float *x, const float *w, float *y)
{
    cl_context context = clattn_ctx_cl_context(ctx);
    cl_command_queue queue = clattn_ctx_queue(ctx);
    cl_int err = CL_SUCCESS;
    clattn_status status = CLATTN_ERR_HOST_MEMORY;
    cl_mem bx = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                               sizeof(float) * L * D, (void *)x, &err);
    cl_mem bw = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                               sizeof(float) * D * D, (void *)w, &err);
    cl_mem by = clCreateBuffer(context, CL_MEM_WRITE_ONLY, sizeof(float) * L * D, NULL, &err);
    if (bx && bw && by) {
        /* Tensors: (L, D) times (D, D) into (L, D), packed row-major float32. */
        const clattn_matmul_desc desc = {.struct_size = sizeof desc, .alpha = 1.0f};
        const clattn_tensor tx = clattn_tensor_make(bx, 0, CLATTN_DTYPE_F32, 2, L, D, 0, 0);
        const clattn_tensor tw = clattn_tensor_make(bw, 0, CLATTN_DTYPE_F32, 2, D, D, 0, 0);
        const clattn_tensor ty = clattn_tensor_make(by, 0, CLATTN_DTYPE_F32, 2, L, D, 0, 0);
        status = clattn_matmul(ctx, &desc, &tx, &tw, NULL, &ty, 0, NULL, NULL);
        if (status == CLATTN_SUCCESS)
            status = (clattn_status)clEnqueueReadBuffer(queue, by, CL_TRUE, 0,
                                                        sizeof(float) * L * D, y, 0, NULL, NULL);
    }
    if (bx)
        clReleaseMemObject(bx);
    if (bw)
        clReleaseMemObject(bw);
    if (by)
        clReleaseMemObject(by);
    return status;
}

int main(void)
{
    static const float x[L * D] = {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 1, 1};
    static const float wq[D * D] = {1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0};
    static const float wk[D * D] = {0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1};
    static const float wv[D * D] = {1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 1, 1, 0, 0};
    float q[L * D], k[L * D], v[L * D], scores[L * L], weights[L * L], z[L * D];

    char message[512];
    clattn_ctx *ctx = NULL;
    clattn_status status = clattn_ctx_create(NULL, &ctx, message, sizeof message);
    if (status != CLATTN_SUCCESS) {
        fprintf(stderr, "textbook: %s: %s\n", clattn_status_string(status), message);
        return 1;
    }
    char device[256] = "";
    clGetDeviceInfo(clattn_ctx_device(ctx), CL_DEVICE_NAME, sizeof device - 1, device, NULL);
    printf("device: %s\n\n", device);

    /* Single head, no output projection, textbook X·W layout. The scale is left at its
     * default (NAN: 1/sqrt(d_k) = 0.5 here); the _init function sets it and struct_size. */
    clattn_mha_host_desc desc;
    clattn_mha_host_desc_init(&desc);
    desc.batch = 1;
    desc.seq_q = L;
    desc.seq_k = L;
    desc.embed_dim = D;
    desc.num_heads = 1;
    desc.layout = CLATTN_LAYOUT_XW;
    desc.need_weights = CLATTN_WEIGHTS_PER_HEAD;
    const clattn_mha_host_weights w = {.q_weight = wq, .k_weight = wk, .v_weight = wv};
    if ((status = project(ctx, x, wq, q)) || (status = project(ctx, x, wk, k)) ||
        (status = project(ctx, x, wv, v)) ||
        (status = clattn_mha_forward_host(ctx, &desc, &w, x, NULL, NULL, NULL, z, weights))) {
        fprintf(stderr, "textbook: %s: %s\n", clattn_status_string(status),
                clattn_last_error(ctx));
        clattn_ctx_release(ctx);
        return 1;
    }
    for (int i = 0; i < L; ++i)
        for (int j = 0; j < L; ++j) {
            float dot = 0.0f;
            for (int c = 0; c < D; ++c)
                dot += q[i * D + c] * k[j * D + c];
            scores[i * L + j] = dot;
        }

    print_matrix("X (inputs)", x, L, D);
    print_matrix("Q = X·Wq", q, L, D);
    print_matrix("K = X·Wk", k, L, D);
    print_matrix("V = X·Wv", v, L, D);
    print_matrix("scores = Q·Kᵀ", scores, L, L);
    print_matrix("weights = softmax(scores / sqrt(d_k))", weights, L, L);
    print_matrix("Z = weights·V", z, L, D);
    clattn_ctx_release(ctx);
    return 0;
}
