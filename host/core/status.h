/* Errors (host/core/status.c): messages on the context, OpenCL error names, CL_CHECK, fault
 * injection in test builds, and overflow-checked size arithmetic. */
#ifndef CLATTN_CORE_STATUS_H
#define CLATTN_CORE_STATUS_H

#include "context.h"
#include "fault.h" /* clattn__fault: the OpenCL calls a test build may make fail */

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
