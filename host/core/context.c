/* The public context API (host/core): creating a context on a device or on the caller's queue
 * (device choice and limits from device.c, validation mode and tuning from validate.c and
 * tuning.c), releasing it, its getters, clattn_finish, the workspace limit and the kernel trace
 * (turned on here, filled by each launch in launch.c, read back as kernel times). */
#include "device.h"
#include "launch.h"
#include "status.h"
#include "tuning.h"
#include "validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static clattn_status finish_create(clattn_ctx *ctx, const clattn_ctx_desc *desc, clattn_ctx **out,
                                   char *msg, size_t msg_size)
{
    clattn_status status = clattn__query_device(ctx);
    if (status == CLATTN_SUCCESS && !clattn__validate_mode_from_env(ctx))
        status = CLATTN_ERR_INVALID_ARGUMENT;
    if (status == CLATTN_SUCCESS)
        status = clattn__choose_tuning(ctx, desc ? desc->tuning_file : NULL,
                                       desc ? desc->tuning_rows : NULL);
    if (status != CLATTN_SUCCESS) {
        clattn__copy_message(msg, msg_size, ctx->message);
        clattn_ctx_release(ctx);
        return status;
    }
    clattn__clear_error(ctx);
    *out = ctx;
    return CLATTN_SUCCESS;
}

static clattn_status create_on_device(const char *device_spec, const clattn_ctx_desc *desc,
                                      clattn_ctx **out, char *message, size_t message_size)
{
    clattn__copy_message(message, message_size, "");
    if (out == NULL) {
        clattn__copy_message(message, message_size, "clattn_ctx_create: out is NULL");
        return CLATTN_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    cl_device_id device = NULL;
    clattn_status status = clattn__choose_device(device_spec, &device, message, message_size);
    if (status != CLATTN_SUCCESS)
        return status;

    clattn_ctx *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL) {
        clattn__copy_message(message, message_size, "clattn_ctx_create: out of host memory");
        return CLATTN_ERR_HOST_MEMORY;
    }
    ctx->workspace_limit = CLATTN_WORKSPACE_UNLIMITED;
    ctx->device = device;
    cl_int err = CL_SUCCESS;
    ctx->context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (err == CL_SUCCESS)
        ctx->queue = clCreateCommandQueue(ctx->context, device, 0, &err);
    if (err != CL_SUCCESS) {
        if (message)
            snprintf(message, message_size, "%s: %s (%d)",
                     ctx->context ? "clCreateCommandQueue" : "clCreateContext",
                     clattn__cl_error_name(err), (int)err);
        clattn_ctx_release(ctx);
        return (clattn_status)err;
    }
    return finish_create(ctx, desc, out, message, message_size);
}

static clattn_status create_on_queue(cl_command_queue queue, const clattn_ctx_desc *desc,
                                     clattn_ctx **out, char *message, size_t message_size)
{
    clattn__copy_message(message, message_size, "");
    if (out)
        *out = NULL;
    if (out == NULL || queue == NULL) {
        clattn__copy_message(message, message_size,
                             out ? "clattn_ctx_create_from_queue: queue is NULL"
                                 : "clattn_ctx_create_from_queue: out is NULL");
        return CLATTN_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    clattn_ctx *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL) {
        clattn__copy_message(message, message_size,
                             "clattn_ctx_create_from_queue: out of host memory");
        return CLATTN_ERR_HOST_MEMORY;
    }
    ctx->workspace_limit = CLATTN_WORKSPACE_UNLIMITED;
    cl_context context = NULL;
    cl_device_id device = NULL;
    cl_int err = clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof context, &context, NULL);
    if (err == CL_SUCCESS)
        err = clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof device, &device, NULL);
    if (err == CL_SUCCESS)
        err = clRetainCommandQueue(queue);
    if (err != CL_SUCCESS) {
        if (message)
            snprintf(message, message_size, "clattn_ctx_create_from_queue: queue: %s (%d)",
                     clattn__cl_error_name(err), (int)err);
        free(ctx);
        return (clattn_status)err;
    }
    ctx->queue = queue;
    ctx->device = device;
    cl_command_queue_properties properties = 0;
    err = clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof properties, &properties, NULL);
    ctx->out_of_order =
        err != CL_SUCCESS || (properties & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0;
    err = clRetainContext(context);
    if (err != CL_SUCCESS) {
        if (message)
            snprintf(message, message_size, "clRetainContext: %s (%d)", clattn__cl_error_name(err),
                     (int)err);
        clattn_ctx_release(ctx);
        return (clattn_status)err;
    }
    ctx->context = context;
    return finish_create(ctx, desc, out, message, message_size);
}

clattn_status clattn_ctx_create(const char *device_spec, clattn_ctx **out, char *message,
                                size_t message_size)
{
    return create_on_device(device_spec, NULL, out, message, message_size);
}

clattn_status clattn_ctx_create_from_queue(cl_command_queue queue, clattn_ctx **out, char *message,
                                           size_t message_size)
{
    return create_on_queue(queue, NULL, out, message, message_size);
}

void clattn_ctx_desc_init(clattn_ctx_desc *desc)
{
    if (desc) {
        memset(desc, 0, sizeof *desc);
        desc->struct_size = sizeof *desc;
    }
}

clattn_status clattn_ctx_create_desc(const clattn_ctx_desc *desc, clattn_ctx **out,
                                     char *message, size_t message_size)
{
    clattn__copy_message(message, message_size, "");
    if (out)
        *out = NULL;
    if (desc == NULL || out == NULL) {
        clattn__copy_message(message, message_size,
                             desc ? "clattn_ctx_create_desc: out is NULL"
                                  : "clattn_ctx_create_desc: desc is NULL");
        return CLATTN_ERR_INVALID_ARGUMENT;
    }
    if (desc->struct_size != sizeof(clattn_ctx_desc)) {
        if (message)
            snprintf(message, message_size,
                     "clattn_ctx_create_desc: struct_size=%zu but sizeof(clattn_ctx_desc) is %zu "
                     "in clattn %s: set struct_size = sizeof(clattn_ctx_desc) (or use "
                     "clattn_ctx_desc_init) and rebuild against this header",
                     desc->struct_size, sizeof(clattn_ctx_desc), CLATTN_VERSION_STRING);
        return CLATTN_ERR_INVALID_ARGUMENT;
    }
    return desc->queue ? create_on_queue(desc->queue, desc, out, message, message_size)
                       : create_on_device(desc->device_spec, desc, out, message, message_size);
}

const char *clattn_ctx_tuning(const clattn_ctx *ctx)
{
    return ctx ? ctx->tuning_summary : "clattn_ctx_tuning: ctx is NULL";
}

/* Releases the trace's kept events and empties it. */
static void drop_trace(clattn_ctx *ctx)
{
    for (size_t i = 0; i < ctx->trace_count; ++i)
        clReleaseEvent(ctx->trace[i].event);
    ctx->trace_count = 0;
    ctx->trace_dropped = 0;
}

void clattn_ctx_release(clattn_ctx *ctx)
{
    if (ctx == NULL)
        return;
    if (ctx->queue)
        clFinish(ctx->queue);
    if (ctx->last_event)
        clReleaseEvent(ctx->last_event);
    drop_trace(ctx);
    free(ctx->trace);
    for (size_t i = 0; i < ctx->num_variants; ++i) {
        clReleaseKernel(ctx->variants[i].kernel);
        clReleaseProgram(ctx->variants[i].program);
    }
    free(ctx->variants);
    clattn__validation_release(ctx);
    for (size_t i = 0; i < ctx->num_flex_sources; ++i)
        free(ctx->flex_sources[i]);
    free(ctx->flex_sources);
    for (int i = 0; i < CLATTN_WS_COUNT; ++i)
        if (ctx->workspace[i])
            clReleaseMemObject(ctx->workspace[i]);
    if (ctx->queue)
        clReleaseCommandQueue(ctx->queue);
    if (ctx->context)
        clReleaseContext(ctx->context);
    free(ctx);
}

cl_context clattn_ctx_cl_context(const clattn_ctx *ctx)
{
    return ctx ? ctx->context : NULL;
}
cl_command_queue clattn_ctx_queue(const clattn_ctx *ctx)
{
    return ctx ? ctx->queue : NULL;
}
cl_device_id clattn_ctx_device(const clattn_ctx *ctx)
{
    return ctx ? ctx->device : NULL;
}

clattn_status clattn_ctx_set_workspace_limit(clattn_ctx *ctx, size_t bytes)
{
    if (ctx == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    ctx->workspace_limit = bytes;
    return CLATTN_SUCCESS;
}

size_t clattn_ctx_workspace_bytes(const clattn_ctx *ctx)
{
    size_t total = 0;
    for (int i = 0; ctx && i < CLATTN_WS_COUNT; ++i)
        total += ctx->workspace[i] ? ctx->workspace_bytes[i] : 0;
    return total;
}

clattn_status clattn_finish(clattn_ctx *ctx)
{
    if (ctx == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    clattn_status status = CLATTN_SUCCESS;
    CL_CHECK(ctx, clFinish(ctx->queue), "clFinish");
done:
    return status;
}

clattn_status clattn_ctx_trace_kernels(clattn_ctx *ctx, int on)
{
    if (ctx == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    drop_trace(ctx);
    if (on && ctx->trace == NULL) {
        ctx->trace = calloc(CLATTN_TRACE_MAX, sizeof *ctx->trace);
        if (ctx->trace == NULL)
            return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY,
                                "clattn_ctx_trace_kernels: out of host memory");
    }
    ctx->tracing = on != 0;
    return CLATTN_SUCCESS;
}

clattn_status clattn_ctx_kernel_times(clattn_ctx *ctx, clattn_kernel_time *out, size_t capacity,
                                      size_t *count, size_t *dropped)
{
    if (ctx == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    if (count == NULL || (out == NULL && capacity > 0))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "clattn_ctx_kernel_times: %s is NULL", count ? "out" : "count");
    *count = 0;
    cl_command_queue_properties properties = 0;
    cl_int err = clGetCommandQueueInfo(ctx->queue, CL_QUEUE_PROPERTIES, sizeof properties,
                                       &properties, NULL);
    clattn_status status = CLATTN_SUCCESS;
    if (err != CL_SUCCESS)
        status = clattn__cl_fail(ctx, err, "clGetCommandQueueInfo(CL_QUEUE_PROPERTIES)");
    else if (!(properties & CL_QUEUE_PROFILING_ENABLE))
        status = clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                              "clattn_ctx_kernel_times: the context's queue has no "
                              "CL_QUEUE_PROFILING_ENABLE");
    size_t written = 0;
    for (size_t i = 0; status == CLATTN_SUCCESS && i < ctx->trace_count && written < capacity;
         ++i) {
        cl_ulong start = 0, end = 0;
        err = clWaitForEvents(1, &ctx->trace[i].event);
        if (err == CL_SUCCESS)
            err = clGetEventProfilingInfo(ctx->trace[i].event, CL_PROFILING_COMMAND_START,
                                          sizeof start, &start, NULL);
        if (err == CL_SUCCESS)
            err = clGetEventProfilingInfo(ctx->trace[i].event, CL_PROFILING_COMMAND_END,
                                          sizeof end, &end, NULL);
        if (err != CL_SUCCESS) {
            status = clattn__cl_fail(ctx, err, "clattn_ctx_kernel_times: a kernel's event");
            break;
        }
        memcpy(out[written].name, ctx->trace[i].name, sizeof out[written].name);
        out[written].ms = end > start ? (double)(end - start) / 1e6 : 0.0;
        ++written;
    }
    if (dropped)
        *dropped = ctx->trace_dropped + (ctx->trace_count - written);
    *count = written;
    drop_trace(ctx);
    return status;
}
