/* Launches and their order (host/core): kernel launches on a call's event chain, the chain's
 * begin and end around each public call (ordering calls that share the workspace), the entry
 * checks of every public device call (descriptor, wait list, dimensions, tensors, sizes) and the
 * context's workspace slots. */
#include "launch.h"
#include "status.h"
#include "validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

clattn_status clattn__launch_kernel(clattn_chain *chain, cl_kernel kernel, const char *name,
                                    const clattn_arg *args, cl_uint num_args, cl_uint dims,
                                    const size_t *global, const size_t *local)
{
    clattn_ctx *ctx = chain->ctx;
    for (cl_uint i = 0; i < num_args; ++i) {
        cl_int err = clSetKernelArg(kernel, i, args[i].size, args[i].value);
        if (err != CL_SUCCESS)
            return clattn__fail(ctx, (clattn_status)err, "clSetKernelArg(%s, %u): %s (%d)", name,
                                (unsigned)i, clattn__cl_error_name(err), (int)err);
    }
    cl_event event = NULL;
    /* CLATTN_FAULT_VARIANT=...:enqueue plants CL_OUT_OF_RESOURCES in a variant's launches */
    cl_int err = clattn__fault(CLATTN_FAULT_ENQUEUE) ||
                         (ctx->enqueue_faults && clattn__kernel_faulted(ctx, kernel))
                     ? CL_OUT_OF_RESOURCES
                     : clEnqueueNDRangeKernel(chain->queue, kernel, dims, NULL, global, local,
                                              chain->num_wait, chain->num_wait ? chain->wait : NULL,
                                              &event);
    if (err != CL_SUCCESS)
        return clattn__fail(ctx, (clattn_status)err, "clEnqueueNDRangeKernel(%s): %s (%d)", name,
                            clattn__cl_error_name(err), (int)err);
    /* Tracing: the launch's own event is kept (retained once more: the chain keeps its own). */
    if (ctx->tracing) {
        if (ctx->trace && ctx->trace_count < CLATTN_TRACE_MAX &&
            clRetainEvent(event) == CL_SUCCESS) {
            struct clattn_trace_entry *entry = &ctx->trace[ctx->trace_count++];
            snprintf(entry->name, sizeof entry->name, "%s", name);
            entry->event = event;
        } else {
            ++ctx->trace_dropped;
        }
    }
    clattn__chain_push(chain, event);
    return CLATTN_SUCCESS;
}

static const char *const workspace_names[CLATTN_WS_COUNT] = {
    [CLATTN_WS_PLAN] = "plan",
    [CLATTN_WS_HOST_IN0] = "host input 0",
    [CLATTN_WS_HOST_IN1] = "host input 1",
    [CLATTN_WS_HOST_IN2] = "host input 2",
    [CLATTN_WS_HOST_OUT] = "host output",
    [CLATTN_WS_HOST_ATTN] = "host weights output",
    [CLATTN_WS_HOST_MASK] = "host attn_mask",
    [CLATTN_WS_HOST_KPM] = "host key_padding_mask",
    [CLATTN_WS_HOST_ALIBI] = "host alibi_slopes",
    [CLATTN_WS_HOST_W] = "host parameters",
    [CLATTN_WS_MATMUL_BT] = "transposed B",
};

clattn_status clattn__workspace(clattn_ctx *ctx, const char *op, clattn_ws_slot slot, size_t bytes,
                                cl_mem *out)
{
    if (bytes == 0)
        bytes = sizeof(float);
    if (ctx->workspace[slot] && ctx->workspace_bytes[slot] >= bytes) {
        *out = ctx->workspace[slot];
        return CLATTN_SUCCESS;
    }
    if (bytes > ctx->workspace_limit)
        return clattn__fail(ctx, CLATTN_ERR_TOO_LARGE,
                            "%s: the %s workspace needs %zu bytes, more than the context's "
                            "workspace limit (%zu bytes)",
                            op, workspace_names[slot], bytes, ctx->workspace_limit);
    /* The other slots stay allocated: all of it together must fit the device's memory. */
    const size_t others = clattn_ctx_workspace_bytes(ctx) - ctx->workspace_bytes[slot];
    if ((cl_ulong)others + bytes > ctx->info.global_mem_size)
        return clattn__fail(ctx, CLATTN_ERR_TOO_LARGE,
                            "%s: the %s workspace needs %zu bytes; with the %zu bytes already "
                            "held that exceeds the device's global memory (%llu bytes)",
                            op, workspace_names[slot], bytes, others,
                            (unsigned long long)ctx->info.global_mem_size);
    if (bytes > ctx->info.max_alloc_size)
        return clattn__fail(ctx, CLATTN_ERR_TOO_LARGE,
                            "%s: the %s workspace needs %zu bytes, more than the device's largest "
                            "allocation (CL_DEVICE_MAX_MEM_ALLOC_SIZE = %llu)",
                            op, workspace_names[slot], bytes,
                            (unsigned long long)ctx->info.max_alloc_size);
    cl_int err = CL_SUCCESS;
    cl_mem mem = NULL;
    if (clattn__fault(CLATTN_FAULT_ALLOC))
        err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
    else
        mem = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS)
        return clattn__fail(ctx, (clattn_status)err, "%s: clCreateBuffer(%s, %zu bytes): %s (%d)",
                            op, workspace_names[slot], bytes, clattn__cl_error_name(err), (int)err);
    /* Work already queued that uses the old buffer keeps it alive until it completes. */
    if (ctx->workspace[slot])
        clReleaseMemObject(ctx->workspace[slot]);
    ctx->workspace[slot] = mem;
    ctx->workspace_bytes[slot] = bytes;
    *out = mem;
    return CLATTN_SUCCESS;
}

clattn_status clattn__entry(clattn_ctx *ctx, const char *op, const void *desc, cl_uint num_wait,
                            const cl_event *wait, cl_event *event)
{
    if (event)
        *event = NULL;
    if (ctx == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    clattn__clear_error(ctx);
    if (desc == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: desc is NULL", op);
    if ((num_wait > 0) != (wait != NULL))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: num_wait=%u does not match wait list %s", op, (unsigned)num_wait,
                            wait ? "given" : "NULL");
    return CLATTN_SUCCESS;
}

clattn_status clattn__check_dims(clattn_ctx *ctx, const char *op, const size_t *dims,
                                 const char *const *names, int count, bool limits)
{
    for (int i = 0; i < count; ++i) {
        if (!limits && dims[i] == 0)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                "%s: %s=0: every dimension must be at least 1", op, names[i]);
        if (limits && dims[i] > CL_UINT_MAX)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: %s=%zu exceeds the kernels' 32-bit dimension limit", op,
                                names[i], dims[i]);
    }
    return CLATTN_SUCCESS;
}

bool clattn__round_up(size_t value, size_t step, size_t *out)
{
    size_t rem = value % step;
    if (rem == 0) {
        *out = value;
        return true;
    }
    return clattn__add(value, step - rem, out);
}

bool clattn__product(size_t *out, int count, ...)
{
    va_list args;
    va_start(args, count);
    size_t result = 1;
    bool ok = true;
    for (int i = 0; i < count; ++i) {
        size_t factor = va_arg(args, size_t);
        if (ok && !clattn__mul(result, factor, &result))
            ok = false;
    }
    va_end(args);
    if (ok)
        *out = result;
    return ok;
}

clattn_status clattn__check_tensor(clattn_ctx *ctx, const char *op, const char *name,
                                   clattn_tensor t, size_t elems, size_t elem_size, bool required)
{
    if (t.mem == NULL)
        return required ? clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, name)
                        : CLATTN_SUCCESS;
    size_t end = 0, bytes = 0, have = 0;
    if (!clattn__add(t.offset, elems, &end) || !clattn__mul(end, elem_size, &bytes))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                            "%s: %s: offset %zu + %zu elements overflows size_t", op, name,
                            t.offset, elems);
    cl_context owner = NULL;
    cl_int err = clGetMemObjectInfo(t.mem, CL_MEM_SIZE, sizeof have, &have, NULL);
    if (err == CL_SUCCESS)
        err = clGetMemObjectInfo(t.mem, CL_MEM_CONTEXT, sizeof owner, &owner, NULL);
    if (err != CL_SUCCESS)
        return clattn__fail(ctx, (clattn_status)err, "%s: %s: clGetMemObjectInfo: %s (%d)", op,
                            name, clattn__cl_error_name(err), (int)err);
    if (owner != ctx->context)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: %s belongs to another cl_context than the clattn context's", op,
                            name);
    if (bytes > have)
        return clattn__fail(ctx, CLATTN_ERR_BUFFER_TOO_SMALL,
                            "%s: %s buffer too small: offset %zu + %zu elements (its extent "
                            "through the strides) need %zu bytes, the buffer has %zu",
                            op, name, t.offset, elems, bytes, have);
    return CLATTN_SUCCESS;
}

void clattn__chain_push(clattn_chain *chain, cl_event event)
{
    if (chain->last)
        clReleaseEvent(chain->last);
    chain->last = event;
    chain->num_wait = event ? 1 : 0;
    chain->wait = event ? &chain->last : NULL;
}

/* Hands the final event to the caller (or releases it when out == NULL) and resets. */
static void chain_finish(clattn_chain *chain, cl_event *out)
{
    if (out)
        *out = chain->last;
    else if (chain->last)
        clReleaseEvent(chain->last);
    chain->last = NULL;
    chain->num_wait = 0;
    chain->wait = NULL;
}

/* Checks `queue` (another queue than the context's) for the call and reads its ordering. */
static clattn_status check_queue(clattn_ctx *ctx, const char *op, cl_command_queue queue,
                                 bool *out_of_order)
{
    cl_context owner = NULL;
    cl_device_id device = NULL;
    cl_command_queue_properties properties = 0;
    cl_int err = clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof owner, &owner, NULL);
    if (err == CL_SUCCESS)
        err = clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof device, &device, NULL);
    if (err == CL_SUCCESS)
        err = clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof properties, &properties,
                                    NULL);
    if (err != CL_SUCCESS)
        return clattn__fail(ctx, (clattn_status)err, "%s: queue: clGetCommandQueueInfo: %s (%d)",
                            op, clattn__cl_error_name(err), (int)err);
    if (owner != ctx->context || device != ctx->device)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: queue belongs to another cl_context or device than the clattn "
                            "context's",
                            op);
    *out_of_order = (properties & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0;
    return CLATTN_SUCCESS;
}

clattn_status clattn__begin(clattn_ctx *ctx, const char *op, clattn_chain *chain,
                            cl_command_queue queue, bool private_workspace, cl_uint num_wait,
                            const cl_event *wait)
{
    chain->ctx = ctx;
    chain->queue = ctx->queue;
    chain->out_of_order = ctx->out_of_order;
    chain->private_workspace = private_workspace;
    chain->num_wait = wait ? num_wait : 0;
    chain->wait = wait;
    chain->last = NULL;
    if (queue != NULL && queue != ctx->queue) {
        clattn_status status = check_queue(ctx, op, queue, &chain->out_of_order);
        if (status != CLATTN_SUCCESS)
            return status;
        chain->queue = queue;
    }
    /* The previous call's work may still use the shared workspace: an in-order queue orders it
     * by itself, another queue or an out-of-order one waits for its last event. */
    if (ctx->last_event == NULL || private_workspace ||
        (!chain->out_of_order && ctx->last_queue == chain->queue))
        return CLATTN_SUCCESS;
    cl_event *list = malloc((num_wait + 1) * sizeof *list);
    if (list == NULL)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", op);
    for (cl_uint i = 0; i < num_wait; ++i)
        list[i] = wait[i];
    list[num_wait] = ctx->last_event;
    cl_event marker = NULL;
    cl_int err = clattn__fault(CLATTN_FAULT_ENQUEUE)
                     ? CL_OUT_OF_RESOURCES
                     : clEnqueueMarkerWithWaitList(chain->queue, num_wait + 1, list, &marker);
    free(list);
    if (err != CL_SUCCESS)
        return clattn__fail(ctx, (clattn_status)err, "%s: clEnqueueMarkerWithWaitList: %s (%d)", op,
                            clattn__cl_error_name(err), (int)err);
    clattn__chain_push(chain, marker);
    return CLATTN_SUCCESS;
}

clattn_status clattn__end_message(clattn_ctx *ctx, const char *op, clattn_status status)
{
    const size_t op_length = strlen(op);
    if (status != CLATTN_SUCCESS &&
        !(strncmp(ctx->message, op, op_length) == 0 && ctx->message[op_length] == ':')) {
        /* Shift the message right and write "op: " in front, truncating its end. */
        const size_t prefix = op_length + 2;
        size_t inner = strlen(ctx->message);
        if (inner > sizeof ctx->message - 1 - prefix)
            inner = sizeof ctx->message - 1 - prefix;
        memmove(ctx->message + prefix, ctx->message, inner);
        memcpy(ctx->message, op, op_length);
        ctx->message[op_length] = ':';
        ctx->message[op_length + 1] = ' ';
        ctx->message[prefix + inner] = '\0';
    }
    return status;
}

clattn_status clattn__end(const char *op, clattn_chain *chain, clattn_status status,
                          cl_event *event)
{
    clattn_ctx *ctx = chain->ctx;
    clattn__end_message(ctx, op, status);
    if (status == CLATTN_SUCCESS && !chain->private_workspace && chain->last) {
        if (ctx->last_event)
            clReleaseEvent(ctx->last_event);
        clRetainEvent(chain->last);
        ctx->last_event = chain->last;
        ctx->last_queue = chain->queue;
    }
    chain_finish(chain, status == CLATTN_SUCCESS ? event : NULL);
    return status;
}
