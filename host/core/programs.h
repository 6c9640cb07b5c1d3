/* The program cache and builds (host/core/programs.c): kernel variants built once per context. */
#ifndef CLATTN_CORE_PROGRAMS_H
#define CLATTN_CORE_PROGRAMS_H

#include "context.h"
#include "family.h"

/* Variant `name` of `family` built with `extra` in *kernel when the compiled kernel runs
 * work-groups of `items` work-items (CL_KERNEL_WORK_GROUP_SIZE); else *kernel is NULL
 * (register pressure: the caller shrinks the group or takes another variant). */
clattn_status clattn__variant_fits(clattn_ctx *ctx, const clattn_family *family, const char *name,
                                   const char *extra, size_t items, cl_kernel *kernel);
/* The kernel `name` of `family`'s program built with the extra options `extra` (from
 * clattn__family_options, or a variant's with -cl-opt-disable), cached per context. */
clattn_status clattn__variant_kernel(clattn_ctx *ctx, const clattn_family *family, const char *name,
                                     const char *extra, cl_kernel *out);

/* Kernel `kernel` of `family` built with its switches `values` (its switch struct) and
 * `defines` (the score rule's; may be NULL when count is 0), cached per context (the options
 * are the cache key). */
clattn_status clattn__family_kernel(clattn_ctx *ctx, const clattn_family *family,
                                    const char *kernel, const void *values,
                                    const clattn_define *defines, size_t count, cl_kernel *out);
/* The same, in *out only when the compiled kernel runs work-groups of `items` work-items;
 * else *out is NULL (register pressure: the caller shrinks the group or takes another
 * variant). */
clattn_status clattn__family_fits(clattn_ctx *ctx, const clattn_family *family, const char *kernel,
                                  const void *values, const clattn_define *defines, size_t count,
                                  size_t items, cl_kernel *out);

#endif
