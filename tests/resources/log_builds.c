/*
 * log_builds.c: an LD_PRELOAD shim for tests/resources/capture.sh. It wraps clBuildProgram and
 * appends one line per build to the file named by CLATTN_BUILD_LOG:
 *
 *     KERNEL_FILE<TAB>OPTIONS
 *
 * KERNEL_FILE is the kernel source the program was made from (found by its header line
 * " * NAME.cl:", the last one in the source: clattn prepends common.cl, types.cl and score.cl),
 * OPTIONS the build options exactly as passed. So the resource lane compiles the variants the
 * host really builds, not a copy of its option strings. Not part of libclattn.
 */
#define _GNU_SOURCE
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef cl_int (*build_fn)(cl_program, cl_uint, const cl_device_id *, const char *,
                           void(CL_CALLBACK *)(cl_program, void *), void *);

/* The name of the last " * NAME.cl:" header in `source`, into name (size bytes). */
static void kernel_file(const char *source, char *name, size_t size)
{
    snprintf(name, size, "?");
    for (const char *p = source; (p = strstr(p, "\n * ")) != NULL; p += 4) {
        const char *start = p + 4, *end = start;
        while ((*end >= 'a' && *end <= 'z') || *end == '_' || (*end >= '0' && *end <= '9'))
            ++end;
        if (end > start && strncmp(end, ".cl:", 4) == 0)
            snprintf(name, size, "%.*s.cl", (int)(end - start), start);
    }
}

CL_API_ENTRY cl_int CL_API_CALL clBuildProgram(cl_program program, cl_uint num_devices,
                                               const cl_device_id *devices, const char *options,
                                               void(CL_CALLBACK *notify)(cl_program, void *),
                                               void *user_data)
{
    build_fn real = (build_fn)dlsym(RTLD_NEXT, "clBuildProgram");
    if (real == NULL)
        return CL_BUILD_PROGRAM_FAILURE;
    const char *path = getenv("CLATTN_BUILD_LOG");
    size_t length = 0;
    if (path && clGetProgramInfo(program, CL_PROGRAM_SOURCE, 0, NULL, &length) == CL_SUCCESS &&
        length > 0) {
        char *source = malloc(length + 1);
        if (source &&
            clGetProgramInfo(program, CL_PROGRAM_SOURCE, length, source, NULL) == CL_SUCCESS) {
            source[length] = '\0';
            char name[64], line[1024];
            kernel_file(source, name, sizeof name);
            const int n = snprintf(line, sizeof line, "%s\t%s\n", name, options ? options : "");
            const int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
            if (fd >= 0 && n > 0 && (size_t)n < sizeof line) {
                if (write(fd, line, (size_t)n) != n) {
                    /* a log line lost: capture.sh finds the variant missing */
                }
            }
            if (fd >= 0)
                close(fd);
        }
        free(source);
    }
    return real(program, num_devices, devices, options, notify, user_data);
}
