/* Embedding clattn in an OpenCL program that owns its context, queue and buffers:
 * the program picks a device, makes its own cl_context and cl_command_queue, hands the queue
 * to clattn, runs scaled dot-product attention on its own cl_mem buffers after its own event,
 * reads the result back and checks it against a plain C computation.
 * Exits 0 when the maximum relative error is below 1e-4. */
#include <clattn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { BATCH = 2, HEADS = 3, SEQ_Q = 5, SEQ_K = 7, DIM = 8 };

/* The first GPU, else the first device of any kind. */
static cl_device_id pick_device(void)
{
    cl_platform_id platforms[8];
    cl_uint count = 0;
    cl_device_id device = NULL;
    if (clGetPlatformIDs(8, platforms, &count) != CL_SUCCESS)
        return NULL;
    for (cl_uint pass = 0; pass < 2 && device == NULL; ++pass)
        for (cl_uint p = 0; p < count && p < 8 && device == NULL; ++p) {
            cl_uint found = 0;
            clGetDeviceIDs(platforms[p], pass == 0 ? CL_DEVICE_TYPE_GPU : CL_DEVICE_TYPE_ALL, 1,
                           &device, &found);
            if (found == 0)
                device = NULL;
        }
    return device;
}

/* Plain C attention for one (batch, head): out = softmax(q kᵀ / sqrt(DIM)) v. */
static void reference(const float *q, const float *k, const float *v, double *out)
{
    for (int i = 0; i < SEQ_Q; ++i) {
        double scores[SEQ_K], max = -INFINITY, sum = 0.0;
        for (int j = 0; j < SEQ_K; ++j) {
            double dot = 0.0;
            for (int c = 0; c < DIM; ++c)
                dot += (double)q[i * DIM + c] * k[j * DIM + c];
            scores[j] = dot / sqrt((double)DIM);
            max = scores[j] > max ? scores[j] : max;
        }
        for (int j = 0; j < SEQ_K; ++j)
            sum += scores[j] = exp(scores[j] - max);
        for (int c = 0; c < DIM; ++c) {
            double acc = 0.0;
            for (int j = 0; j < SEQ_K; ++j)
                acc += scores[j] / sum * v[j * DIM + c];
            out[i * DIM + c] = acc;
        }
    }
}

int main(void)
{
    const size_t q_count = BATCH * HEADS * SEQ_Q * DIM, kv_count = BATCH * HEADS * SEQ_K * DIM;
    float *q = malloc(q_count * sizeof *q), *k = malloc(kv_count * sizeof *k);
    float *v = malloc(kv_count * sizeof *v), *out = malloc(q_count * sizeof *out);
    double *want = malloc(q_count * sizeof *want);
    int result = 1;
    if (!q || !k || !v || !out || !want)
        goto done_host;
    srand(7);
    for (size_t i = 0; i < q_count; ++i)
        q[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    for (size_t i = 0; i < kv_count; ++i) {
        k[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
        v[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    }

    cl_device_id device = pick_device();
    if (device == NULL) {
        fprintf(stderr, "embed_queue: no OpenCL device\n");
        result = 77;
        goto done_host;
    }
    cl_int err = CL_SUCCESS;
    cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    cl_command_queue queue = clCreateCommandQueue(context, device, 0, &err);
    cl_mem bq = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                               q_count * sizeof *q, q, &err);
    cl_mem bk = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                               kv_count * sizeof *k, k, &err);
    cl_mem bv = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                               kv_count * sizeof *v, v, &err);
    cl_mem bo = clCreateBuffer(context, CL_MEM_WRITE_ONLY, q_count * sizeof *out, NULL, &err);
    cl_event ready = clCreateUserEvent(context, &err), done = NULL;

    char message[512];
    clattn_ctx *ctx = NULL;
    clattn_status status = clattn_ctx_create_from_queue(queue, &ctx, message, sizeof message);
    if (status == CLATTN_SUCCESS) {
        /* The plan is made from the tensors' layouts (packed (B, H, L, D) floats); executing
         * it binds our buffers. */
        clattn_sdpa_desc desc;
        clattn_sdpa_desc_init(&desc);
        clattn_tensors desc_tensors = {0};
        CLATTN_BIND_ROLES(desc, desc_tensors);
        desc_tensors.q = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, BATCH, HEADS, SEQ_Q, DIM);
        desc_tensors.k = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, BATCH, HEADS, SEQ_K, DIM);
        desc_tensors.v = desc_tensors.k;
        desc_tensors.out = desc_tensors.q;
        clattn_plan *plan = NULL;
        status = clattn_sdpa_plan_create(ctx, &desc, &plan);
        clattn_tensors tensors = desc_tensors;
        tensors.q.mem = bq, tensors.k.mem = bk, tensors.v.mem = bv, tensors.out.mem = bo;
        /* Our own event gates clattn's work; clattn's event gates our read. */
        if (status == CLATTN_SUCCESS)
            status = clattn_plan_execute(plan, tensors.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 1,
                                         &ready, &done);
        clattn_plan_release(plan);
        if (status != CLATTN_SUCCESS)
            snprintf(message, sizeof message, "%s", clattn_last_error(ctx));
    }
    clSetUserEventStatus(ready, CL_COMPLETE);
    if (status == CLATTN_SUCCESS)
        err = clEnqueueReadBuffer(queue, bo, CL_TRUE, 0, q_count * sizeof *out, out, 1, &done,
                                  NULL);
    clattn_ctx_release(ctx); /* our queue and context stay ours */

    if (status != CLATTN_SUCCESS || err != CL_SUCCESS) {
        fprintf(stderr, "embed_queue: %s: %s\n", clattn_status_string(status), message);
    } else {
        double max_err = 0.0, max_ref = 0.0;
        for (int bh = 0; bh < BATCH * HEADS; ++bh)
            reference(q + bh * SEQ_Q * DIM, k + bh * SEQ_K * DIM, v + bh * SEQ_K * DIM,
                      want + bh * SEQ_Q * DIM);
        for (size_t i = 0; i < q_count; ++i) {
            double diff = fabs(out[i] - want[i]);
            max_err = diff > max_err || isnan(diff) ? diff : max_err;
            max_ref = fabs(want[i]) > max_ref ? fabs(want[i]) : max_ref;
        }
        const double rel = max_err / max_ref;
        printf("embed_queue: clattn %s on our own queue: max relative error %.2e\n",
               CLATTN_VERSION_STRING, rel);
        result = rel <= 1e-4 ? 0 : 1;
    }
    if (done)
        clReleaseEvent(done);
    clReleaseEvent(ready);
    clReleaseMemObject(bq);
    clReleaseMemObject(bk);
    clReleaseMemObject(bv);
    clReleaseMemObject(bo);
    clReleaseCommandQueue(queue);
    clReleaseContext(context);
done_host:
    free(q);
    free(k);
    free(v);
    free(out);
    free(want);
    return result;
}
