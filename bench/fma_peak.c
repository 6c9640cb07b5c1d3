/*
 * fma_peak: the device's measured float32 FMA throughput, the roof that BENCHMARKS.md's
 * percentages of peak are taken against (not a unit test).
 *
 *     fma_peak [--iters N] [--runs R]      (device: clattn's rule, CLATTN_DEVICE)
 *
 * A kernel of independent fma() chains on registers (no memory traffic inside the loop) is
 * built for each vector width (float4, float8, float16) and number of chains (8, 12, 16, 24),
 * enough chains to cover an FMA unit's latency times its issue width on CPUs and GPUs; each
 * runs R times on many work-groups (64 per compute unit, one work-item each on CPUs, 64 on
 * GPUs), timed by OpenCL profiling events. Prints every configuration's median GFLOP/s and
 * the best, the number to divide by. Flops: 2 per lane per fma.
 */
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn.h"

static const char *source =
    "__kernel void peak(__global float *out, const uint iters, const float m, const float c)\n"
    "{\n"
    "    const float seed = (float)get_global_id(0) * 1e-7f;\n"
    "    VEC acc[CHAINS];\n"
    "    for (int k = 0; k < CHAINS; ++k)\n"
    "        acc[k] = (VEC)(seed + (float)k * 1e-3f);\n"
    "    for (uint i = 0; i < iters; ++i) {\n"
    "#pragma unroll\n"
    "        for (int k = 0; k < CHAINS; ++k)\n"
    "            acc[k] = fma(acc[k], (VEC)(m), (VEC)(c));\n"
    "    }\n"
    "    VEC s = acc[0];\n"
    "    for (int k = 1; k < CHAINS; ++k)\n"
    "        s += acc[k];\n"
    "    out[get_global_id(0)] = s.s0 + s.s1;\n"
    "}\n";

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    unsigned iters = 20000, runs = 5;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = (unsigned)strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: fma_peak [--iters N] [--runs R]\n");
            return 2;
        }
    }
    if (iters == 0 || runs == 0 || runs > 100) {
        fprintf(stderr, "fma_peak: --iters must be > 0 and --runs 1..100\n");
        return 2;
    }
    char message[512] = "";
    clattn_ctx *ctx = NULL;
    if (clattn_ctx_create(NULL, &ctx, message, sizeof message) != CLATTN_SUCCESS) {
        fprintf(stderr, "fma_peak: %s\n", message);
        return 1;
    }
    cl_context context = clattn_ctx_cl_context(ctx);
    cl_device_id device = clattn_ctx_device(ctx);
    char name[256] = "?";
    cl_uint units = 1;
    cl_device_type type = 0;
    clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof name, name, NULL);
    clGetDeviceInfo(device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL);
    clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    name[sizeof name - 1] = '\0';
    cl_int err = CL_SUCCESS;
    cl_command_queue queue =
        clCreateCommandQueue(context, device, CL_QUEUE_PROFILING_ENABLE, &err);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "fma_peak: clCreateCommandQueue failed (%d)\n", err);
        clattn_ctx_release(ctx);
        return 1;
    }
    const size_t local = (type & CL_DEVICE_TYPE_CPU) ? 1 : 64;
    const size_t global = (size_t)units * 64 * local;
    cl_mem out = clCreateBuffer(context, CL_MEM_WRITE_ONLY, global * sizeof(float), NULL, &err);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "fma_peak: clCreateBuffer failed (%d)\n", err);
        clReleaseCommandQueue(queue);
        clattn_ctx_release(ctx);
        return 1;
    }
    printf("fma_peak on %s: %u compute units, %zu work-groups of %zu, %u iterations, median of "
           "%u runs\n",
           name, units, global / local, local, iters, runs);
    printf("%-8s %7s %12s\n", "vector", "chains", "GFLOP/s");
    static const char *vecs[] = {"float4", "float8", "float16"};
    static const unsigned widths[] = {4, 8, 16};
    static const unsigned chains[] = {8, 12, 16, 24};
    double best = 0.0;
    char best_label[64] = "none";
    int status = 0;
    for (size_t v = 0; v < 3 && status == 0; ++v) {
        for (size_t c = 0; c < sizeof chains / sizeof chains[0] && status == 0; ++c) {
            char options[128];
            snprintf(options, sizeof options, "-cl-std=CL1.2 -DVEC=%s -DCHAINS=%u", vecs[v],
                     chains[c]);
            cl_program program = clCreateProgramWithSource(context, 1, &source, NULL, &err);
            if (err == CL_SUCCESS)
                err = clBuildProgram(program, 1, &device, options, NULL, NULL);
            cl_kernel kernel = NULL;
            if (err == CL_SUCCESS)
                kernel = clCreateKernel(program, "peak", &err);
            const float m = 0.999999f, add = 1e-6f;
            if (err == CL_SUCCESS)
                err = clSetKernelArg(kernel, 0, sizeof out, &out);
            if (err == CL_SUCCESS)
                err = clSetKernelArg(kernel, 1, sizeof iters, &iters);
            if (err == CL_SUCCESS)
                err = clSetKernelArg(kernel, 2, sizeof m, &m);
            if (err == CL_SUCCESS)
                err = clSetKernelArg(kernel, 3, sizeof add, &add);
            double times[101];
            for (unsigned r = 0; r <= runs && err == CL_SUCCESS; ++r) { /* run 0: warm-up */
                cl_event event = NULL;
                err = clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &global, &local, 0, NULL,
                                             &event);
                if (err == CL_SUCCESS)
                    err = clWaitForEvents(1, &event);
                cl_ulong start = 0, end = 0;
                if (err == CL_SUCCESS)
                    err = clGetEventProfilingInfo(event, CL_PROFILING_COMMAND_START,
                                                  sizeof start, &start, NULL);
                if (err == CL_SUCCESS)
                    err = clGetEventProfilingInfo(event, CL_PROFILING_COMMAND_END, sizeof end,
                                                  &end, NULL);
                if (event)
                    clReleaseEvent(event);
                times[r] = (double)(end - start) * 1e-9;
            }
            if (err != CL_SUCCESS) {
                fprintf(stderr, "fma_peak: %s: OpenCL error %d\n", options, err);
                status = 1;
            } else {
                qsort(times + 1, runs, sizeof times[0], cmp_double);
                const double seconds = times[1 + runs / 2];
                const double flops =
                    2.0 * (double)global * iters * chains[c] * widths[v];
                const double gflops = seconds > 0 ? flops / seconds * 1e-9 : 0.0;
                printf("%-8s %7u %12.1f\n", vecs[v], chains[c], gflops);
                if (gflops > best) {
                    best = gflops;
                    snprintf(best_label, sizeof best_label, "%s x %u chains", vecs[v],
                             chains[c]);
                }
            }
            if (kernel)
                clReleaseKernel(kernel);
            if (program)
                clReleaseProgram(program);
        }
    }
    if (status == 0)
        printf("peak: %.1f GFLOP/s (%s)\n", best, best_label);
    clReleaseMemObject(out);
    clReleaseCommandQueue(queue);
    clattn_ctx_release(ctx);
    return status;
}
