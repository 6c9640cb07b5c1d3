/* Oclgrind 21.10 --uninitialized defect (not built; evidence for tests/oclgrind_lane.sh): after a
 * buffer is released and a larger one created, elements past the old size stay "uninitialised"
 * even after a kernel writes them. Run: cc this.c -lOpenCL && oclgrind --uninitialized ./a.out
 * (reports with the release; none without it, or with equal sizes). */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdio.h>
static const char *src =
"__kernel void fill(__global float *b, uint n) { uint i = get_global_id(0); if (i < n) b[i] = (float)i; }\n"
"__kernel void sum(__global const float *b, __global float *out, uint n) { if (get_global_id(0)==0) { float s = 0; for (uint i = 0; i < n; ++i) if (b[i] > 1e9f) s += 1; else s += b[i]; out[0] = s; } }\n";
int main(void)
{
    cl_platform_id p; cl_device_id d; cl_int err;
    clGetPlatformIDs(1, &p, NULL); clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL);
    cl_context c = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    cl_command_queue q = clCreateCommandQueue(c, d, 0, &err);
    cl_program pr = clCreateProgramWithSource(c, 1, &src, NULL, &err);
    clBuildProgram(pr, 1, &d, "", NULL, NULL);
    cl_kernel kf = clCreateKernel(pr, "fill", &err), ks = clCreateKernel(pr, "sum", &err);
    float host[4] = {0};
    cl_mem out = clCreateBuffer(c, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, 16, host, &err);
    cl_uint small = 189, big = 2268;
    cl_mem a = clCreateBuffer(c, CL_MEM_READ_WRITE, small * 4, NULL, &err);
    clSetKernelArg(kf, 0, sizeof a, &a); clSetKernelArg(kf, 1, 4, &small);
    size_t g = 256; clEnqueueNDRangeKernel(q, kf, 1, NULL, &g, NULL, 0, NULL, NULL);
    clFinish(q);
    clReleaseMemObject(a);
    cl_mem b = clCreateBuffer(c, CL_MEM_READ_WRITE, big * 4, NULL, &err);
    clSetKernelArg(kf, 0, sizeof b, &b); clSetKernelArg(kf, 1, 4, &big);
    g = 2304; clEnqueueNDRangeKernel(q, kf, 1, NULL, &g, NULL, 0, NULL, NULL);
    clSetKernelArg(ks, 0, sizeof b, &b); clSetKernelArg(ks, 1, sizeof out, &out); clSetKernelArg(ks, 2, 4, &big);
    g = 1; clEnqueueNDRangeKernel(q, ks, 1, NULL, &g, NULL, 0, NULL, NULL);
    clEnqueueReadBuffer(q, out, CL_TRUE, 0, 4, host, 0, NULL, NULL);
    printf("sum %g (want %g)\n", host[0], (double)big * (big - 1) / 2);
    return 0;
}
