/* peer_clblast: CLBlast's SGEMM timed on an OpenCL device, the peer of `clattn bench --op
 * matmul` in bench/peers.py. Built only with -DCLATTN_BENCH_CLBLAST=ON (Debian's
 * libclblast-dev); never part of libclattn or the tests.
 *
 *   peer_clblast [--platform SUBSTRING] [--runs N] [--warmup N]
 *                [--override KERNEL:NAME=VALUE,NAME=VALUE,...]... MxNxK...
 *
 * C (m x n) = A (m x k) · B (k x n), row-major, float32, alpha 1, beta 0 (the same product as
 * clattn's matmul). Each run: clFinish, a marker, CLBlastSgemm, wait; the time is OpenCL
 * profiling from the marker's end to the end of the event CLBlast returns (its last kernel:
 * the indirect path's pad/transpose kernels are included, as clattn's time includes its own
 * B transpose). Median of --runs runs (default 5) after --warmup runs (default 1; the first
 * call compiles CLBlast's kernels). --override passes a tuner's best parameters through
 * CLBlastOverrideParameters (the run-time route CLBlast documents for its tuners' JSON; the
 * other route is compiling them into its database). The device is the first one of the first
 * platform whose name contains --platform (default "Portable Computing Language": PoCL).
 * One JSON line per size on stdout: {"op": "matmul", "m": .., "n": .., "k": .., "runs": ..,
 * "median_ms": .., "gflops": .., "device": "..", "overrides": N}. Exit 1 on any error. */
#define _POSIX_C_SOURCE 200809L
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <clblast_c.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OVERRIDES 8
#define MAX_PARAMS 32

typedef struct override {
    char kernel[64];
    const char *names[MAX_PARAMS];
    size_t values[MAX_PARAMS];
    size_t count;
    char text[1024]; /* owns the names */
} override;

static int compare_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int fail(const char *what, int code)
{
    fprintf(stderr, "peer_clblast: %s failed: %d\n", what, code);
    return 1;
}

/* "Xgemm:KWG=32,MWG=64,..." into o; 0 on a malformed text. */
static int parse_override(const char *text, override *o)
{
    const char *colon = strchr(text, ':');
    if (colon == NULL || (size_t)(colon - text) >= sizeof o->kernel ||
        strlen(colon + 1) >= sizeof o->text)
        return 0;
    memcpy(o->kernel, text, (size_t)(colon - text));
    o->kernel[colon - text] = '\0';
    strcpy(o->text, colon + 1);
    o->count = 0;
    char *save = NULL;
    for (char *item = strtok_r(o->text, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (eq == NULL || o->count == MAX_PARAMS)
            return 0;
        *eq = '\0';
        char *end = NULL;
        o->values[o->count] = strtoul(eq + 1, &end, 10);
        if (end == eq + 1 || *end != '\0')
            return 0;
        o->names[o->count++] = item;
    }
    return o->count > 0;
}

static cl_mem random_buffer(cl_context context, size_t count, unsigned seed, cl_int *err)
{
    float *host = malloc(count * sizeof *host);
    if (host == NULL) {
        *err = CL_OUT_OF_HOST_MEMORY;
        return NULL;
    }
    unsigned long long state = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < count; ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        host[i] = (float)((state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
    }
    cl_mem mem = clCreateBuffer(context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                count * sizeof *host, host, err);
    free(host);
    return mem;
}

/* One size: returns 0 and prints its JSON line, or 1. */
static int bench_size(cl_context context, cl_command_queue queue, const char *device_name,
                      size_t m, size_t n, size_t k, size_t runs, size_t warmup, size_t overrides)
{
    cl_int err = CL_SUCCESS;
    cl_mem a = random_buffer(context, m * k, 1, &err);
    cl_mem b = err == CL_SUCCESS ? random_buffer(context, k * n, 2, &err) : NULL;
    cl_mem c = err == CL_SUCCESS ? random_buffer(context, m * n, 3, &err) : NULL;
    double *times = calloc(runs, sizeof *times);
    int rc = err != CL_SUCCESS ? fail("clCreateBuffer", err) : times == NULL;
    for (size_t r = 0; rc == 0 && r < warmup + runs; ++r) {
        cl_event start = NULL, end = NULL;
        err = clFinish(queue);
        if (err == CL_SUCCESS)
            err = clEnqueueMarkerWithWaitList(queue, 0, NULL, &start);
        if (err != CL_SUCCESS) {
            rc = fail("marker", err);
            break;
        }
        CLBlastStatusCode status =
            CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, m, n, k,
                         1.0f, a, 0, k, b, 0, n, 0.0f, c, 0, n, &queue, &end);
        if (status != CLBlastSuccess)
            rc = fail("CLBlastSgemm", status);
        else if ((err = clWaitForEvents(1, &end)) != CL_SUCCESS)
            rc = fail("clWaitForEvents", err);
        cl_ulong t0 = 0, t1 = 0;
        if (rc == 0 && r >= warmup) {
            err = clGetEventProfilingInfo(start, CL_PROFILING_COMMAND_END, sizeof t0, &t0, NULL);
            if (err == CL_SUCCESS)
                err = clGetEventProfilingInfo(end, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
            if (err != CL_SUCCESS || t1 <= t0)
                rc = fail("clGetEventProfilingInfo", err != CL_SUCCESS ? err : -1);
            else
                times[r - warmup] = (double)(t1 - t0) / 1e6;
        }
        clReleaseEvent(start);
        if (end)
            clReleaseEvent(end);
        fprintf(stderr, "peer_clblast: %zux%zux%zu run %zu of %zu\n", m, n, k, r + 1,
                warmup + runs);
    }
    if (rc == 0) {
        qsort(times, runs, sizeof *times, compare_double);
        const double median =
            runs % 2 ? times[runs / 2] : 0.5 * (times[runs / 2 - 1] + times[runs / 2]);
        printf("{\"op\": \"matmul\", \"m\": %zu, \"n\": %zu, \"k\": %zu, \"runs\": %zu, "
               "\"median_ms\": %.6f, \"gflops\": %.6g, \"device\": \"%s\", \"overrides\": %zu}\n",
               m, n, k, runs, median, 2.0 * m * n * k / median / 1e6, device_name, overrides);
        fflush(stdout);
    }
    free(times);
    if (a)
        clReleaseMemObject(a);
    if (b)
        clReleaseMemObject(b);
    if (c)
        clReleaseMemObject(c);
    return rc;
}

int main(int argc, char **argv)
{
    const char *platform_match = "Portable Computing Language";
    size_t runs = 5, warmup = 1, num_overrides = 0, num_sizes = 0;
    static override overrides[MAX_OVERRIDES];
    size_t sizes[64][3];
    for (int i = 1; i < argc; ++i) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned long long m, n, k;
        char extra;
        if (strcmp(arg, "--platform") == 0 && value) {
            platform_match = value, ++i;
        } else if (strcmp(arg, "--runs") == 0 && value && atoi(value) > 0) {
            runs = (size_t)atoi(value), ++i;
        } else if (strcmp(arg, "--warmup") == 0 && value && atoi(value) >= 0) {
            warmup = (size_t)atoi(value), ++i;
        } else if (strcmp(arg, "--override") == 0 && value && num_overrides < MAX_OVERRIDES &&
                   parse_override(value, &overrides[num_overrides])) {
            ++num_overrides, ++i;
        } else if (num_sizes < 64 && sscanf(arg, "%llux%llux%llu%c", &m, &n, &k, &extra) == 3 &&
                   m && n && k) {
            sizes[num_sizes][0] = m, sizes[num_sizes][1] = n, sizes[num_sizes][2] = k;
            ++num_sizes;
        } else {
            fprintf(stderr,
                    "usage: peer_clblast [--platform SUBSTRING] [--runs N] [--warmup N]\n"
                    "                    [--override KERNEL:NAME=VALUE,...]... MxNxK...\n"
                    "(bad argument '%s')\n",
                    arg);
            return 2;
        }
    }
    if (num_sizes == 0) {
        fprintf(stderr, "peer_clblast: no MxNxK size given\n");
        return 2;
    }

    cl_platform_id platforms[16];
    cl_uint num_platforms = 0;
    cl_int err = clGetPlatformIDs(16, platforms, &num_platforms);
    if (err != CL_SUCCESS)
        return fail("clGetPlatformIDs", err);
    cl_device_id device = NULL;
    for (cl_uint p = 0; p < num_platforms && p < 16 && device == NULL; ++p) {
        char name[256] = "";
        clGetPlatformInfo(platforms[p], CL_PLATFORM_NAME, sizeof name, name, NULL);
        if (strstr(name, platform_match) &&
            clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 1, &device, NULL) != CL_SUCCESS)
            device = NULL;
    }
    if (device == NULL) {
        fprintf(stderr, "peer_clblast: no device on a platform named like '%s'\n",
                platform_match);
        return 1;
    }
    char device_name[256] = "";
    clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof device_name, device_name, NULL);
    for (char *c = device_name; *c; ++c)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
            *c = ' ';
    cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (err != CL_SUCCESS)
        return fail("clCreateContext", err);
    cl_command_queue queue =
        clCreateCommandQueue(context, device, CL_QUEUE_PROFILING_ENABLE, &err);
    if (err != CL_SUCCESS) {
        clReleaseContext(context);
        return fail("clCreateCommandQueue", err);
    }
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < num_overrides; ++i) {
        const override *o = &overrides[i];
        CLBlastStatusCode status = CLBlastOverrideParameters(
            device, o->kernel, CLBlastPrecisionSingle, o->count, (const char **)o->names, o->values);
        if (status != CLBlastSuccess) {
            fprintf(stderr, "peer_clblast: CLBlastOverrideParameters(%s) failed: %d\n",
                    o->kernel, (int)status);
            rc = 1;
        }
    }
    for (size_t i = 0; rc == 0 && i < num_sizes; ++i)
        rc = bench_size(context, queue, device_name, sizes[i][0], sizes[i][1], sizes[i][2], runs,
                        warmup, num_overrides);
    clReleaseCommandQueue(queue);
    clReleaseContext(context);
    return rc;
}
