/* The program cache and builds (host/core/programs.c): kernel variants built once per context. */
#ifndef CLATTN_CORE_PROGRAMS_H
#define CLATTN_CORE_PROGRAMS_H

#include "context.h"

/* Variant `name` of `source` built with `extra` in *kernel when the compiled kernel runs
 * work-groups of `items` work-items (CL_KERNEL_WORK_GROUP_SIZE); else *kernel is NULL
 * (register pressure: the caller shrinks the group or takes another variant). */
clattn_status clattn__variant_fits(clattn_ctx *ctx, clattn_source source, const char *name,
                                   const char *extra, size_t items, cl_kernel *kernel);
/* The kernel `name` of `source` built with the extra options `extra`, cached per context. */
clattn_status clattn__variant_kernel(clattn_ctx *ctx, clattn_source source, const char *name,
                                     const char *extra, cl_kernel *out);

#endif
