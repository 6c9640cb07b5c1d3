/* Errors (host/core/status.c): messages on the context, OpenCL error names, CL_CHECK, fault
 * injection in test builds, and overflow-checked size arithmetic. */
#ifndef CLATTN_CORE_STATUS_H
#define CLATTN_CORE_STATUS_H

#include "context.h"

#include <stdint.h>

/* Records a formatted message on ctx (when not NULL) and returns status. */
clattn_status clattn__fail(clattn_ctx *ctx, clattn_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Records "<what>: <CL error name> (<code>)" and returns the OpenCL code as a status. */
clattn_status clattn__cl_fail(clattn_ctx *ctx, cl_int err, const char *what);
const char *clattn__cl_error_name(cl_int err);
void clattn__clear_error(clattn_ctx *ctx);
void clattn__copy_message(char *dst, size_t dst_size, const char *src);

/* Evaluates an OpenCL call; on failure records it and jumps to the function's `done` label with
 * `status` set. The only control-flow macro in the library. */
#define CL_CHECK(ctx, call, what)                                                                  \
    do {                                                                                           \
        cl_int cl_check_err_ = (call);                                                             \
        if (cl_check_err_ != CL_SUCCESS) {                                                         \
            status = clattn__cl_fail((ctx), cl_check_err_, (what));                                \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* --- fault injection (test builds only) ----------------------------------------------------
 * Built with -DCLATTN_FAULT_INJECTION (the clattn_fault test library, never the shipped one),
 * the N-th device allocation, command enqueue or program build after clattn__fault_arm fails
 * as if the OpenCL call had. Process-wide counters: a test-only exception to "no global
 * state". */
typedef enum clattn_fault_kind {
    CLATTN_FAULT_ALLOC = 0, /* clCreateBuffer */
    CLATTN_FAULT_ENQUEUE,   /* clEnqueueNDRangeKernel, read/write buffer, marker */
    CLATTN_FAULT_BUILD,     /* clBuildProgram */
    CLATTN_FAULT_KINDS
} clattn_fault_kind;

#ifdef CLATTN_FAULT_INJECTION
/* True when this call of `kind` is the one armed to fail. */
bool clattn__fault(clattn_fault_kind kind);
/* Arms `kind` to fail its n-th call from now (n = 0: never) and resets its counter. */
CLATTN_API void clattn__fault_arm(clattn_fault_kind kind, long n);
/* Calls of `kind` since it was last armed. */
CLATTN_API long clattn__fault_calls(clattn_fault_kind kind);
#else
#define clattn__fault(kind) false
#endif

/* --- size arithmetic (overflow-checked) ---------------------------------------------------- */

static inline bool clattn__mul(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return false;
    *out = a * b;
    return true;
}

static inline bool clattn__add(size_t a, size_t b, size_t *out)
{
    if (b > SIZE_MAX - a)
        return false;
    *out = a + b;
    return true;
}


#endif
