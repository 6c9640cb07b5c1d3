/* Status names, OpenCL error names and the per-context last-error message. */
#include "status.h"

#include <stdio.h>
#include <string.h>

typedef struct name_entry {
    cl_int code;
    const char *name;
} name_entry;

#define NAME(code)                                                                                 \
    {                                                                                              \
        code, #code                                                                                \
    }

/* OpenCL 1.2 error codes (and the few 2.x/3.x ones a newer ICD may pass back). */
static const name_entry cl_error_names[] = {
    NAME(CL_SUCCESS),
    NAME(CL_DEVICE_NOT_FOUND),
    NAME(CL_DEVICE_NOT_AVAILABLE),
    NAME(CL_COMPILER_NOT_AVAILABLE),
    NAME(CL_MEM_OBJECT_ALLOCATION_FAILURE),
    NAME(CL_OUT_OF_RESOURCES),
    NAME(CL_OUT_OF_HOST_MEMORY),
    NAME(CL_PROFILING_INFO_NOT_AVAILABLE),
    NAME(CL_MEM_COPY_OVERLAP),
    NAME(CL_IMAGE_FORMAT_MISMATCH),
    NAME(CL_IMAGE_FORMAT_NOT_SUPPORTED),
    NAME(CL_BUILD_PROGRAM_FAILURE),
    NAME(CL_MAP_FAILURE),
    NAME(CL_MISALIGNED_SUB_BUFFER_OFFSET),
    NAME(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST),
    NAME(CL_COMPILE_PROGRAM_FAILURE),
    NAME(CL_LINKER_NOT_AVAILABLE),
    NAME(CL_LINK_PROGRAM_FAILURE),
    NAME(CL_DEVICE_PARTITION_FAILED),
    NAME(CL_KERNEL_ARG_INFO_NOT_AVAILABLE),
    NAME(CL_INVALID_VALUE),
    NAME(CL_INVALID_DEVICE_TYPE),
    NAME(CL_INVALID_PLATFORM),
    NAME(CL_INVALID_DEVICE),
    NAME(CL_INVALID_CONTEXT),
    NAME(CL_INVALID_QUEUE_PROPERTIES),
    NAME(CL_INVALID_COMMAND_QUEUE),
    NAME(CL_INVALID_HOST_PTR),
    NAME(CL_INVALID_MEM_OBJECT),
    NAME(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR),
    NAME(CL_INVALID_IMAGE_SIZE),
    NAME(CL_INVALID_SAMPLER),
    NAME(CL_INVALID_BINARY),
    NAME(CL_INVALID_BUILD_OPTIONS),
    NAME(CL_INVALID_PROGRAM),
    NAME(CL_INVALID_PROGRAM_EXECUTABLE),
    NAME(CL_INVALID_KERNEL_NAME),
    NAME(CL_INVALID_KERNEL_DEFINITION),
    NAME(CL_INVALID_KERNEL),
    NAME(CL_INVALID_ARG_INDEX),
    NAME(CL_INVALID_ARG_VALUE),
    NAME(CL_INVALID_ARG_SIZE),
    NAME(CL_INVALID_KERNEL_ARGS),
    NAME(CL_INVALID_WORK_DIMENSION),
    NAME(CL_INVALID_WORK_GROUP_SIZE),
    NAME(CL_INVALID_WORK_ITEM_SIZE),
    NAME(CL_INVALID_GLOBAL_OFFSET),
    NAME(CL_INVALID_EVENT_WAIT_LIST),
    NAME(CL_INVALID_EVENT),
    NAME(CL_INVALID_OPERATION),
    NAME(CL_INVALID_GL_OBJECT),
    NAME(CL_INVALID_BUFFER_SIZE),
    NAME(CL_INVALID_MIP_LEVEL),
    NAME(CL_INVALID_GLOBAL_WORK_SIZE),
    NAME(CL_INVALID_PROPERTY),
    NAME(CL_INVALID_IMAGE_DESCRIPTOR),
    NAME(CL_INVALID_COMPILER_OPTIONS),
    NAME(CL_INVALID_LINKER_OPTIONS),
    NAME(CL_INVALID_DEVICE_PARTITION_COUNT),
    {-70, "CL_INVALID_PIPE_SIZE"},
    {-71, "CL_INVALID_DEVICE_QUEUE"},
    {-72, "CL_INVALID_SPEC_ID"},
    {-73, "CL_MAX_SIZE_RESTRICTION_EXCEEDED"},
    {-1001, "CL_PLATFORM_NOT_FOUND_KHR"},
};

static const name_entry status_names[] = {
    NAME(CLATTN_SUCCESS),       NAME(CLATTN_ERR_INVALID_ARGUMENT), NAME(CLATTN_ERR_INVALID_SHAPE),
    NAME(CLATTN_ERR_OVERFLOW),  NAME(CLATTN_ERR_BUFFER_TOO_SMALL), NAME(CLATTN_ERR_NO_DEVICE),
    NAME(CLATTN_ERR_BUILD),     NAME(CLATTN_ERR_HOST_MEMORY),      NAME(CLATTN_ERR_UNSUPPORTED),
    NAME(CLATTN_ERR_TOO_LARGE),
    NAME(CLATTN_ERR_UNTRUSTED),
};

static const char *find_name(const name_entry *table, size_t count, cl_int code)
{
    for (size_t i = 0; i < count; ++i)
        if (table[i].code == code)
            return table[i].name;
    return NULL;
}

const char *clattn__cl_error_name(cl_int err)
{
    const char *name =
        find_name(cl_error_names, sizeof cl_error_names / sizeof cl_error_names[0], err);
    return name ? name : "CL_UNKNOWN_ERROR";
}

const char *clattn_status_string(clattn_status status)
{
    const char *name =
        find_name(status_names, sizeof status_names / sizeof status_names[0], (cl_int)status);
    if (name)
        return name;
    name =
        find_name(cl_error_names, sizeof cl_error_names / sizeof cl_error_names[0], (cl_int)status);
    return name ? name : "CLATTN_UNKNOWN_STATUS";
}

void clattn__copy_message(char *dst, size_t dst_size, const char *src)
{
    if (dst == NULL || dst_size == 0)
        return;
    snprintf(dst, dst_size, "%s", src ? src : "");
}

void clattn__clear_error(clattn_ctx *ctx)
{
    if (ctx)
        ctx->message[0] = '\0';
}

clattn_status clattn__fail(clattn_ctx *ctx, clattn_status status, const char *fmt, ...)
{
    if (ctx) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(ctx->message, sizeof ctx->message, fmt, args);
        va_end(args);
    }
    return status;
}

clattn_status clattn__cl_fail(clattn_ctx *ctx, cl_int err, const char *what)
{
    return clattn__fail(ctx, (clattn_status)err, "%s: %s (%d)", what, clattn__cl_error_name(err),
                        (int)err);
}

const char *clattn_last_error(const clattn_ctx *ctx)
{
    return ctx ? ctx->message : "clattn_last_error: ctx is NULL";
}
