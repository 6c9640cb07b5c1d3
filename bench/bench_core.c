/* Benchmarks of the core ops on the default device (CLATTN_DEVICE picks it): matmul, fused
 * softmax, scaled dot-product attention and MHA forward. Device time comes from OpenCL
 * profiling events (first kernel's start to the last one's end), wall time from the host clock
 * around enqueue + wait. Prints the median of `--runs` runs after one warm-up run.
 * Usage: bench_core [--runs N] [--quick] */
#define _POSIX_C_SOURCE 199309L
#include <clattn.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct bench {
    clattn_ctx *ctx;
    cl_context context;
    cl_command_queue queue;
    int runs;
} bench;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, compare_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static cl_mem random_buffer(bench *b, size_t elems)
{
    float *host = malloc(elems * sizeof *host);
    if (host == NULL)
        return NULL;
    unsigned long long state = 0x9e3779b97f4a7c15ull ^ elems;
    for (size_t i = 0; i < elems; ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        host[i] = (float)((state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
    }
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(b->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                elems * sizeof(float), host, &err);
    free(host);
    return err == CL_SUCCESS ? mem : NULL;
}

/* One measured call: enqueues after a marker, so device time = marker end .. call's event end. */
typedef clattn_status (*bench_fn)(bench *b, void *args, cl_uint num_wait, const cl_event *wait,
                                  cl_event *event);

static int measure(bench *b, bench_fn fn, void *args, double *device_ms, double *wall_ms)
{
    double *dev = calloc((size_t)b->runs, sizeof *dev), *wall = calloc((size_t)b->runs, sizeof *wall);
    int ok = dev && wall;
    for (int r = -1; ok && r < b->runs; ++r) { /* r = -1: warm-up (program builds) */
        cl_event start = NULL, end = NULL;
        double t0 = now_ms();
        ok = clEnqueueMarkerWithWaitList(b->queue, 0, NULL, &start) == CL_SUCCESS;
        clattn_status s = ok ? fn(b, args, 1, &start, &end) : CLATTN_ERR_INVALID_ARGUMENT;
        if (s != CLATTN_SUCCESS) {
            fprintf(stderr, "bench: %s: %s\n", clattn_status_string(s), clattn_last_error(b->ctx));
            ok = 0;
        }
        if (ok && clWaitForEvents(1, &end) == CL_SUCCESS && r >= 0) {
            cl_ulong t_start = 0, t_end = 0;
            clGetEventProfilingInfo(start, CL_PROFILING_COMMAND_END, sizeof t_start, &t_start,
                                    NULL);
            clGetEventProfilingInfo(end, CL_PROFILING_COMMAND_END, sizeof t_end, &t_end, NULL);
            dev[r] = (double)(t_end - t_start) / 1e6;
            wall[r] = now_ms() - t0;
        }
        if (start)
            clReleaseEvent(start);
        if (end)
            clReleaseEvent(end);
    }
    if (ok) {
        *device_ms = median(dev, b->runs);
        *wall_ms = median(wall, b->runs);
    }
    free(dev);
    free(wall);
    return ok;
}

typedef struct matmul_args {
    clattn_matmul_desc desc;
    cl_mem a, b, c;
} matmul_args;

static clattn_status run_matmul(bench *b, void *p, cl_uint nw, const cl_event *w, cl_event *e)
{
    matmul_args *m = p;
    return clattn_matmul(b->ctx, &m->desc, (clattn_tensor){m->a, 0}, (clattn_tensor){m->b, 0},
                         (clattn_tensor){0}, (clattn_tensor){m->c, 0}, nw, w, e);
}

typedef struct softmax_args {
    clattn_softmax_desc desc;
    cl_mem scores, out;
} softmax_args;

static clattn_status run_softmax(bench *b, void *p, cl_uint nw, const cl_event *w, cl_event *e)
{
    softmax_args *s = p;
    return clattn_softmax_rows(b->ctx, &s->desc, (clattn_tensor){s->scores, 0},
                               (clattn_tensor){s->out, 0}, nw, w, e);
}

typedef struct attention_args {
    clattn_attention_desc desc;
    cl_mem q, k, v, o;
} attention_args;

static clattn_status run_attention(bench *b, void *p, cl_uint nw, const cl_event *w, cl_event *e)
{
    attention_args *a = p;
    return clattn_attention(b->ctx, &a->desc, (clattn_tensor){a->q, 0}, (clattn_tensor){a->k, 0},
                            (clattn_tensor){a->v, 0}, (clattn_tensor){a->o, 0},
                            (clattn_tensor){0}, nw, w, e);
}

typedef struct mha_args {
    clattn_mha_desc desc;
    clattn_mha_weights weights;
    cl_mem x, o;
} mha_args;

static clattn_status run_mha(bench *b, void *p, cl_uint nw, const cl_event *w, cl_event *e)
{
    mha_args *m = p;
    clattn_tensor x = {m->x, 0};
    return clattn_mha_forward(b->ctx, &m->desc, &m->weights, x, x, x, (clattn_tensor){m->o, 0},
                              (clattn_tensor){0}, nw, w, e);
}

static void bench_matmul(bench *b, size_t m, size_t n, size_t k)
{
    matmul_args args = {.desc = {.m = m, .n = n, .k = k, .alpha = 1.0f}};
    args.a = random_buffer(b, m * k);
    args.b = random_buffer(b, k * n);
    args.c = random_buffer(b, m * n);
    double dev = 0, wall = 0;
    if (args.a && args.b && args.c && measure(b, run_matmul, &args, &dev, &wall))
        printf("%-10s m=%-5zu n=%-5zu k=%-5zu          %10.3f %10.3f %9.1f GFLOP/s\n", "matmul",
               m, n, k, dev, wall, 2.0 * m * n * k / dev / 1e6);
    clReleaseMemObject(args.a);
    clReleaseMemObject(args.b);
    clReleaseMemObject(args.c);
}

static void bench_softmax(bench *b, size_t heads, size_t seq, int causal)
{
    softmax_args args = {.desc = {.batch = 1, .heads = heads, .seq_q = seq, .seq_k = seq,
                                  .scale = 0.125f, .masks = {.causal = causal}}};
    const size_t elems = heads * seq * seq;
    args.scores = random_buffer(b, elems);
    args.out = random_buffer(b, elems);
    double dev = 0, wall = 0;
    if (args.scores && args.out && measure(b, run_softmax, &args, &dev, &wall))
        printf("%-10s H=%-2zu L=%-5zu causal=%d              %10.3f %10.3f %9.1f GB/s\n",
               "softmax", heads, seq, causal, dev, wall, 2.0 * elems * sizeof(float) / dev / 1e6);
    clReleaseMemObject(args.scores);
    clReleaseMemObject(args.out);
}

static void bench_attention(bench *b, size_t batch, size_t heads, size_t seq, size_t dim)
{
    attention_args args = {.desc = {.batch = batch, .heads = heads, .seq_q = seq, .seq_k = seq,
                                    .head_dim_qk = dim, .head_dim_v = dim}};
    size_t elems = batch * heads * seq * dim;
    args.q = random_buffer(b, elems);
    args.k = random_buffer(b, elems);
    args.v = random_buffer(b, elems);
    args.o = random_buffer(b, elems);
    double dev = 0, wall = 0;
    double flops = 4.0 * batch * heads * seq * seq * dim;
    if (args.q && args.k && args.v && args.o && measure(b, run_attention, &args, &dev, &wall))
        printf("%-10s B=%zu H=%-2zu L=%-5zu d=%-4zu          %10.3f %10.3f %9.1f GFLOP/s\n",
               "attention", batch, heads, seq, dim, dev, wall, flops / dev / 1e6);
    clReleaseMemObject(args.q);
    clReleaseMemObject(args.k);
    clReleaseMemObject(args.v);
    clReleaseMemObject(args.o);
}

static void bench_mha(bench *b, size_t batch, size_t seq, size_t embed, size_t heads)
{
    mha_args args = {.desc = {.batch = batch, .seq_q = seq, .seq_k = seq, .embed_dim = embed,
                              .num_heads = heads, .layout = CLATTN_LAYOUT_TORCH}};
    args.x = random_buffer(b, batch * seq * embed);
    args.o = random_buffer(b, batch * seq * embed);
    cl_mem w_in = random_buffer(b, 3 * embed * embed), b_in = random_buffer(b, 3 * embed);
    cl_mem w_out = random_buffer(b, embed * embed), b_out = random_buffer(b, embed);
    args.weights = (clattn_mha_weights){.in_proj_weight = {w_in, 0}, .in_proj_bias = {b_in, 0},
                                        .out_weight = {w_out, 0}, .out_bias = {b_out, 0}};
    double dev = 0, wall = 0;
    double flops = 2.0 * batch * seq * embed * embed * 4 + 4.0 * batch * seq * seq * embed;
    if (args.x && args.o && w_in && w_out && measure(b, run_mha, &args, &dev, &wall))
        printf("%-10s B=%zu L=%-5zu E=%-5zu H=%-2zu          %10.3f %10.3f %9.1f GFLOP/s\n",
               "mha", batch, seq, embed, heads, dev, wall, flops / dev / 1e6);
    clReleaseMemObject(args.x);
    clReleaseMemObject(args.o);
    clReleaseMemObject(w_in);
    clReleaseMemObject(b_in);
    clReleaseMemObject(w_out);
    clReleaseMemObject(b_out);
}

int main(int argc, char **argv)
{
    bench b = {.runs = 7};
    int quick = 0;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            b.runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else {
            fprintf(stderr, "usage: bench_core [--runs N] [--quick]\n");
            return 2;
        }
    }
    if (b.runs < 1)
        b.runs = 1;

    /* A profiling queue of our own, handed to clattn: also exercises the embedding path. */
    char msg[512];
    clattn_ctx *probe = NULL;
    clattn_status s = clattn_ctx_create(NULL, &probe, msg, sizeof msg);
    if (s != CLATTN_SUCCESS) {
        fprintf(stderr, "bench_core: %s: %s\n", clattn_status_string(s), msg);
        return 1;
    }
    cl_device_id device = clattn_ctx_device(probe);
    b.context = clattn_ctx_cl_context(probe);
    cl_int err = CL_SUCCESS;
    b.queue = clCreateCommandQueue(b.context, device, CL_QUEUE_PROFILING_ENABLE, &err);
    if (err != CL_SUCCESS || clattn_ctx_create_from_queue(b.queue, &b.ctx, msg, sizeof msg)) {
        fprintf(stderr, "bench_core: cannot make a profiling queue: %s\n", msg);
        return 1;
    }
    char name[256] = "";
    clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof name - 1, name, NULL);
    printf("device: %s; median of %d runs after 1 warm-up\n", name, b.runs);
    printf("%-10s %-36s %10s %10s %17s\n", "op", "size", "device ms", "wall ms", "rate");

    const size_t mm[][3] = {{256, 256, 256}, {512, 512, 512}, {1024, 1024, 1024},
                            {4096, 64, 4096}, {1024, 1024, 64}};
    for (size_t i = 0; i < (quick ? 2 : sizeof mm / sizeof mm[0]); ++i)
        bench_matmul(&b, mm[i][0], mm[i][1], mm[i][2]);
    bench_softmax(&b, 8, quick ? 128 : 512, 0);
    bench_softmax(&b, 8, quick ? 128 : 512, 1);
    bench_attention(&b, 1, 8, quick ? 128 : 512, 64);
    if (!quick)
        bench_attention(&b, 1, 8, 1024, 64);
    bench_mha(&b, 1, quick ? 128 : 512, 512, 8);

    clattn_ctx_release(b.ctx);
    clReleaseCommandQueue(b.queue);
    clattn_ctx_release(probe);
    return 0;
}
