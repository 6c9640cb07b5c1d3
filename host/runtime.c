/* Device choice, context and queue, per-device tuning, program cache, launches, workspace. */
#include "internal.h"
#include "kernels_embedded.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Device choice
 * ------------------------------------------------------------------------------------------- */

#define MAX_PLATFORMS 16
#define MAX_DEVICES 64

typedef struct device_query {
    cl_platform_id platforms[MAX_PLATFORMS];
    cl_uint num_platforms;
} device_query;

static clattn_status list_platforms(device_query *q, char *msg, size_t msg_size)
{
    cl_int err = clGetPlatformIDs(MAX_PLATFORMS, q->platforms, &q->num_platforms);
    if (err == -1001 /* CL_PLATFORM_NOT_FOUND_KHR */ ||
        (err == CL_SUCCESS && q->num_platforms == 0)) {
        clattn__copy_message(msg, msg_size,
                             "no OpenCL platform found: install an ICD (e.g. pocl-opencl-icd "
                             "for CPUs, or the GPU vendor's driver)");
        return CLATTN_ERR_NO_DEVICE;
    }
    if (err != CL_SUCCESS) {
        if (msg)
            snprintf(msg, msg_size, "clGetPlatformIDs: %s (%d)", clattn__cl_error_name(err),
                     (int)err);
        return (clattn_status)err;
    }
    if (q->num_platforms > MAX_PLATFORMS)
        q->num_platforms = MAX_PLATFORMS;
    return CLATTN_SUCCESS;
}

/* The first device of `type` on any platform; false if none. */
static bool first_of_type(const device_query *q, cl_device_type type, cl_device_id *out)
{
    for (cl_uint p = 0; p < q->num_platforms; ++p) {
        cl_uint count = 0;
        if (clGetDeviceIDs(q->platforms[p], type, 1, out, &count) == CL_SUCCESS && count > 0)
            return true;
    }
    return false;
}

/* Parses "P:D" with P, D decimal; false for anything else. */
static bool parse_index_pair(const char *spec, unsigned long *platform, unsigned long *device)
{
    char *end = NULL;
    if (spec[0] < '0' || spec[0] > '9')
        return false;
    *platform = strtoul(spec, &end, 10);
    if (*end != ':' || end[1] < '0' || end[1] > '9')
        return false;
    *device = strtoul(end + 1, &end, 10);
    return *end == '\0';
}

static clattn_status choose_device(const char *spec, cl_device_id *out, char *msg, size_t msg_size)
{
    device_query q;
    clattn_status status = list_platforms(&q, msg, msg_size);
    if (status != CLATTN_SUCCESS)
        return status;

    const char *from = "device_spec";
    if (spec == NULL || spec[0] == '\0') {
        spec = getenv("CLATTN_DEVICE");
        from = "CLATTN_DEVICE";
    }
    if (spec == NULL || spec[0] == '\0') {
        if (first_of_type(&q, CL_DEVICE_TYPE_GPU, out) ||
            first_of_type(&q, CL_DEVICE_TYPE_CPU, out) ||
            first_of_type(&q, CL_DEVICE_TYPE_ALL, out))
            return CLATTN_SUCCESS;
        clattn__copy_message(msg, msg_size, "no OpenCL device found on any platform");
        return CLATTN_ERR_NO_DEVICE;
    }

    unsigned long platform_index, device_index;
    if (strcmp(spec, "gpu") == 0 || strcmp(spec, "cpu") == 0) {
        cl_device_type type = spec[0] == 'g' ? CL_DEVICE_TYPE_GPU : CL_DEVICE_TYPE_CPU;
        if (first_of_type(&q, type, out))
            return CLATTN_SUCCESS;
        if (msg)
            snprintf(msg, msg_size, "%s=%s: no %s device on any of %u platform(s)", from, spec,
                     spec[0] == 'g' ? "GPU" : "CPU", (unsigned)q.num_platforms);
        return CLATTN_ERR_NO_DEVICE;
    }
    if (!parse_index_pair(spec, &platform_index, &device_index)) {
        if (msg)
            snprintf(msg, msg_size, "%s='%s': expected gpu, cpu or P:D (platform:device)", from,
                     spec);
        return CLATTN_ERR_INVALID_ARGUMENT;
    }
    if (platform_index >= q.num_platforms) {
        if (msg)
            snprintf(msg, msg_size, "%s=%s: platform %lu does not exist (%u platform(s))", from,
                     spec, platform_index, (unsigned)q.num_platforms);
        return CLATTN_ERR_NO_DEVICE;
    }
    cl_device_id devices[MAX_DEVICES];
    cl_uint count = 0;
    cl_int err = clGetDeviceIDs(q.platforms[platform_index], CL_DEVICE_TYPE_ALL, MAX_DEVICES,
                                devices, &count);
    if (err != CL_SUCCESS && err != CL_DEVICE_NOT_FOUND) {
        if (msg)
            snprintf(msg, msg_size, "clGetDeviceIDs: %s (%d)", clattn__cl_error_name(err),
                     (int)err);
        return (clattn_status)err;
    }
    if (count > MAX_DEVICES)
        count = MAX_DEVICES;
    if (err == CL_DEVICE_NOT_FOUND || device_index >= count) {
        if (msg)
            snprintf(msg, msg_size, "%s=%s: platform %lu has no device %lu (%u device(s))", from,
                     spec, platform_index, device_index, (unsigned)count);
        return CLATTN_ERR_NO_DEVICE;
    }
    *out = devices[device_index];
    return CLATTN_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * Device limits and tuning
 * ------------------------------------------------------------------------------------------- */

static clattn_status query_device(clattn_ctx *ctx)
{
    clattn_status status = CLATTN_SUCCESS;
    clattn_device_info *info = &ctx->info;
    size_t item_sizes[3] = {1, 1, 1};
    CL_CHECK(ctx,
             clGetDeviceInfo(ctx->device, CL_DEVICE_TYPE, sizeof info->type, &info->type, NULL),
             "clGetDeviceInfo(CL_DEVICE_TYPE)");
    CL_CHECK(ctx, clGetDeviceInfo(ctx->device, CL_DEVICE_NAME, sizeof info->name, info->name, NULL),
             "clGetDeviceInfo(CL_DEVICE_NAME)");
    CL_CHECK(
        ctx,
        clGetDeviceInfo(ctx->device, CL_DEVICE_VENDOR, sizeof info->vendor, info->vendor, NULL),
        "clGetDeviceInfo(CL_DEVICE_VENDOR)");
    CL_CHECK(ctx,
             clGetDeviceInfo(ctx->device, CL_DEVICE_MAX_WORK_GROUP_SIZE,
                             sizeof info->max_work_group_size, &info->max_work_group_size, NULL),
             "clGetDeviceInfo(CL_DEVICE_MAX_WORK_GROUP_SIZE)");
    CL_CHECK(ctx,
             clGetDeviceInfo(ctx->device, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof item_sizes,
                             item_sizes, NULL),
             "clGetDeviceInfo(CL_DEVICE_MAX_WORK_ITEM_SIZES)");
    CL_CHECK(ctx,
             clGetDeviceInfo(ctx->device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof info->local_mem_size,
                             &info->local_mem_size, NULL),
             "clGetDeviceInfo(CL_DEVICE_LOCAL_MEM_SIZE)");
    CL_CHECK(ctx,
             clGetDeviceInfo(ctx->device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof info->max_alloc_size,
                             &info->max_alloc_size, NULL),
             "clGetDeviceInfo(CL_DEVICE_MAX_MEM_ALLOC_SIZE)");
    CL_CHECK(ctx,
             clGetDeviceInfo(ctx->device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof info->global_mem_size,
                             &info->global_mem_size, NULL),
             "clGetDeviceInfo(CL_DEVICE_GLOBAL_MEM_SIZE)");
    CL_CHECK(ctx,
             clGetDeviceInfo(ctx->device, CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT,
                             sizeof info->preferred_float_width, &info->preferred_float_width,
                             NULL),
             "clGetDeviceInfo(CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT)");
    CL_CHECK(ctx,
             clGetDeviceInfo(ctx->device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof info->compute_units,
                             &info->compute_units, NULL),
             "clGetDeviceInfo(CL_DEVICE_MAX_COMPUTE_UNITS)");
    info->name[sizeof info->name - 1] = '\0';
    info->vendor[sizeof info->vendor - 1] = '\0';
    for (int d = 0; d < 3; ++d)
        info->max_item_sizes[d] = item_sizes[d];
done:
    return status;
}

static unsigned pow2_at_most(size_t limit, unsigned cap)
{
    unsigned v = 1;
    while (v * 2 <= cap && v * 2 <= limit)
        v *= 2;
    return v;
}

/* Known defects of OpenCL implementations that clattn routes around: data, one row per
 * implementation, matched on prefixes of CL_DEVICE_VENDOR and CL_DEVICE_NAME. Add a row here,
 * not a branch in the code. */
typedef struct device_quirk {
    const char *vendor, *name;
    unsigned loop_trip_limit; /* loop iterations a work-item may make in all; 0: no limit */
} device_quirk;

static const device_quirk device_quirks[] = {
    /* Mesa's llvmpipe (rusticl; measured on Mesa 22.3.6 with LLVM 15): gallivm gives each
     * invocation one loop counter shared by all its loops (LP_MAX_TGSI_LOOP_ITERATIONS = 65535,
     * decremented on every back-edge in lp_exec_endloop) and leaves the loop when it reaches
     * zero, silently: the kernel completes with truncated sums. Reproducer: a kernel whose one
     * loop is `for (uint i = 0; i < n; ++i) x = x * 1664525u + 1013904223u;` stores x after
     * 65535 steps for every n > 65535 (PoCL: after n); nested loops of 100 x 700 stop after
     * 65349 inner steps. It made matmul_vec's edge blocks (then VEC_RM * VEC_N trips per k)
     * wrong from 5 x 7 x 2000, and the fused kernel from seq_k ~ 1000 (GPU parameters, d = 64).
     * So ops_matmul.c splits K and ops_flash.c the keys into launches that stay under the
     * limit. Not split: softmax rows (about 3 * seq_k / SOFTMAX_WG trips, so with CPU
     * parameters rows longer than ~80000 keys). */
    {"Mesa", "llvmpipe", 65535},
};

static const device_quirk *find_quirk(const clattn_device_info *info)
{
    for (size_t i = 0; i < sizeof device_quirks / sizeof device_quirks[0]; ++i) {
        const device_quirk *q = &device_quirks[i];
        if (strncmp(info->vendor, q->vendor, strlen(q->vendor)) == 0 &&
            strncmp(info->name, q->name, strlen(q->name)) == 0)
            return q;
    }
    return NULL;
}

/* Picks tile parameters from the device's limits. Candidates are ordered from the one that
 * wins on that class of device down to one that fits anything. */
static clattn_status choose_tuning(clattn_ctx *ctx)
{
    typedef struct {
        unsigned tm, tn, tk, wm, wn;
    } tile;
    static const tile gpu_tiles[] = {
        {64, 64, 16, 4, 4}, {32, 32, 16, 4, 4}, {16, 16, 16, 2, 2},
        {8, 8, 8, 1, 1},    {4, 4, 4, 1, 1},    {1, 1, 1, 1, 1},
    };
    /* On CPUs (PoCL) a work-group is a loop LLVM vectorises: modest groups, bigger blocks. */
    static const tile cpu_tiles[] = {
        {64, 64, 32, 8, 4},
        {32, 32, 16, 4, 4},
        {8, 8, 8, 1, 1},
        {1, 1, 1, 1, 1},
    };
    /* CLATTN_PARAMS=gpu|cpu picks the other class's parameters (tests run the GPU kernels'
     * work-group sizes, vector widths and tiles on a CPU device); unset: the device's type. */
    const char *params = getenv("CLATTN_PARAMS");
    const bool is_cpu = params && strcmp(params, "gpu") == 0 ? false
                        : params && strcmp(params, "cpu") == 0
                            ? true
                            : (ctx->info.type & CL_DEVICE_TYPE_CPU) != 0;
    ctx->tuning.cpu_params = is_cpu;
    const tile *list = is_cpu ? cpu_tiles : gpu_tiles;
    const size_t count =
        is_cpu ? sizeof cpu_tiles / sizeof cpu_tiles[0] : sizeof gpu_tiles / sizeof gpu_tiles[0];
    const size_t max_wg = ctx->info.max_work_group_size;
    const size_t max_x = ctx->info.max_item_sizes[0], max_y = ctx->info.max_item_sizes[1];
    /* Leave room for the runtime's own use of local memory. */
    const cl_ulong local_budget = ctx->info.local_mem_size > 1024 ? ctx->info.local_mem_size - 1024
                                                                  : ctx->info.local_mem_size;
    for (size_t i = 0; i < count; ++i) {
        const tile *t = &list[i];
        const size_t items_x = t->tn / t->wn, items_y = t->tm / t->wm;
        const cl_ulong local_bytes = (cl_ulong)t->tk * (t->tm + 1 + t->tn + 1) * sizeof(float);
        if (items_x * items_y <= max_wg && items_x <= max_x && items_y <= max_y &&
            local_bytes <= local_budget) {
            ctx->tuning.tile_m = t->tm;
            ctx->tuning.tile_n = t->tn;
            ctx->tuning.tile_k = t->tk;
            ctx->tuning.wpt_m = t->wm;
            ctx->tuning.wpt_n = t->wn;
            break;
        }
        if (i + 1 == count)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "device '%s': no matmul tile fits its limits (work-group %zu, "
                                "local memory %llu bytes)",
                                ctx->info.name, max_wg,
                                (unsigned long long)ctx->info.local_mem_size);
    }
    const size_t max_1d = max_wg < max_x ? max_wg : max_x;
    /* CPUs: short rows per work-item beat wide tree reductions under PoCL (measured: 64 was
     * 1.5x slower than 4 on softmax over 8 x 512 x 512). */
    ctx->tuning.softmax_wg = pow2_at_most(max_1d, is_cpu ? 4 : 256);
    ctx->tuning.heads_wg = pow2_at_most(max_1d, 256);
    ctx->tuning.transpose_wg = pow2_at_most(max_1d, 16);
    /* CPUs get the vector kernel; CLATTN_MATMUL=tiled|vec overrides (tests run both). */
    const char *choice = getenv("CLATTN_MATMUL");
    ctx->tuning.matmul_vec = is_cpu;
    if (choice && strcmp(choice, "tiled") == 0)
        ctx->tuning.matmul_vec = false;
    else if (choice && strcmp(choice, "vec") == 0)
        ctx->tuning.matmul_vec = true;
    const device_quirk *quirk = find_quirk(&ctx->info);
    ctx->tuning.loop_trip_limit = quirk ? quirk->loop_trip_limit : 0;
    /* CLATTN_LOOP_TRIP_LIMIT=N imposes such a limit on any device, so that the split launches
     * it causes are tested where no quirk asks for them (the *_split ctest entries). */
    const char *trip_limit = getenv("CLATTN_LOOP_TRIP_LIMIT");
    if (trip_limit && trip_limit[0] != '\0') {
        char *end = NULL;
        const unsigned long value = strtoul(trip_limit, &end, 10);
        if (*end != '\0' || value < 64 || value > UINT_MAX)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "CLATTN_LOOP_TRIP_LIMIT='%s' is not a number from 64 to %u",
                                trip_limit, UINT_MAX);
        ctx->tuning.loop_trip_limit = (unsigned)value;
    }
    ctx->tuning.vec_rm = 6;
    /* Vectors of twice the preferred width (two registers per accumulator) measured faster
     * than one register on AVX2 PoCL: 1024^3 matmul 20 vs 15.5 GFLOP/s. */
    const cl_uint width = 2 * ctx->info.preferred_float_width;
    ctx->tuning.vec_width = width >= 16 ? 16 : width >= 8 ? 8 : 4;
    ctx->tuning.vec_wg = pow2_at_most(max_1d, 8);
    snprintf(ctx->build_options, sizeof ctx->build_options,
             "-cl-std=CL1.2 -DTILE_M=%u -DTILE_N=%u -DTILE_K=%u -DWPT_M=%u -DWPT_N=%u "
             "-DVEC_RM=%u -DVEC_W=%u -DVEC_WG=%u -DTRANSPOSE_WG=%u -DSOFTMAX_WG=%u "
             "-DHEADS_WG=%u",
             ctx->tuning.tile_m, ctx->tuning.tile_n, ctx->tuning.tile_k, ctx->tuning.wpt_m,
             ctx->tuning.wpt_n, ctx->tuning.vec_rm, ctx->tuning.vec_width, ctx->tuning.vec_wg,
             ctx->tuning.transpose_wg, ctx->tuning.softmax_wg, ctx->tuning.heads_wg);
    return CLATTN_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * Context
 * ------------------------------------------------------------------------------------------- */

static clattn_status finish_create(clattn_ctx *ctx, clattn_ctx **out, char *msg, size_t msg_size)
{
    clattn_status status = query_device(ctx);
    if (status == CLATTN_SUCCESS)
        status = choose_tuning(ctx);
    if (status != CLATTN_SUCCESS) {
        clattn__copy_message(msg, msg_size, ctx->message);
        clattn_ctx_release(ctx);
        return status;
    }
    clattn__clear_error(ctx);
    *out = ctx;
    return CLATTN_SUCCESS;
}

clattn_status clattn_ctx_create(const char *device_spec, clattn_ctx **out, char *message,
                                size_t message_size)
{
    clattn__copy_message(message, message_size, "");
    if (out == NULL) {
        clattn__copy_message(message, message_size, "clattn_ctx_create: out is NULL");
        return CLATTN_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    cl_device_id device = NULL;
    clattn_status status = choose_device(device_spec, &device, message, message_size);
    if (status != CLATTN_SUCCESS)
        return status;

    clattn_ctx *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL) {
        clattn__copy_message(message, message_size, "clattn_ctx_create: out of host memory");
        return CLATTN_ERR_HOST_MEMORY;
    }
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
    return finish_create(ctx, out, message, message_size);
}

clattn_status clattn_ctx_create_from_queue(cl_command_queue queue, clattn_ctx **out, char *message,
                                           size_t message_size)
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
    return finish_create(ctx, out, message, message_size);
}

void clattn_ctx_release(clattn_ctx *ctx)
{
    if (ctx == NULL)
        return;
    if (ctx->queue)
        clFinish(ctx->queue);
    if (ctx->last_event)
        clReleaseEvent(ctx->last_event);
    for (int i = 0; i < CLATTN_K_COUNT; ++i)
        if (ctx->kernels[i])
            clReleaseKernel(ctx->kernels[i]);
    for (int i = 0; i < CLATTN_SRC_COUNT; ++i)
        if (ctx->programs[i])
            clReleaseProgram(ctx->programs[i]);
    for (size_t i = 0; i < ctx->num_variants; ++i) {
        clReleaseKernel(ctx->variants[i].kernel);
        clReleaseProgram(ctx->variants[i].program);
    }
    free(ctx->variants);
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

/* ---------------------------------------------------------------------------------------------
 * Programs and kernels
 * ------------------------------------------------------------------------------------------- */

typedef struct source_entry {
    const char *file; /* for CLATTN_KERNEL_DIR and messages */
    const char *embedded;
} source_entry;

static const source_entry sources[CLATTN_SRC_COUNT] = {
    [CLATTN_SRC_MATMUL] = {"matmul.cl", clattn_kernel_matmul},
    [CLATTN_SRC_SOFTMAX] = {"softmax.cl", clattn_kernel_softmax},
    [CLATTN_SRC_HEADS] = {"heads.cl", clattn_kernel_heads},
    [CLATTN_SRC_FLASH] = {"flash_attention.cl", clattn_kernel_flash_attention},
};

typedef struct kernel_entry {
    clattn_source source;
    const char *name;
} kernel_entry;

static const kernel_entry kernel_table[CLATTN_K_COUNT] = {
    [CLATTN_K_MATMUL] = {CLATTN_SRC_MATMUL, "matmul"},
    [CLATTN_K_MATMUL_VEC] = {CLATTN_SRC_MATMUL, "matmul_vec"},
    [CLATTN_K_TRANSPOSE] = {CLATTN_SRC_MATMUL, "transpose"},
    [CLATTN_K_SOFTMAX_ROWS] = {CLATTN_SRC_SOFTMAX, "softmax_rows"},
    [CLATTN_K_MOVE_HEADS] = {CLATTN_SRC_HEADS, "move_heads"},
    [CLATTN_K_MEAN_HEADS] = {CLATTN_SRC_HEADS, "mean_heads"},
};

/* Reads dir/file into a malloc'd string; NULL on failure. */
static char *read_text_file(const char *dir, const char *file)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, file) >= sizeof path)
        return NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    char *text = NULL;
    long length = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        length = ftell(f);
    /* A folder opens too, and its "length" is LONG_MAX on Linux: no kernel source is 64 MiB. */
    if (length >= 0 && length < (64L << 20) && fseek(f, 0, SEEK_SET) == 0)
        text = malloc((size_t)length + 1);
    if (text && fread(text, 1, (size_t)length, f) == (size_t)length) {
        text[length] = '\0';
    } else {
        free(text);
        text = NULL;
    }
    fclose(f);
    return text;
}

/* Builds `source` with the context's options plus `extra` (may be ""). */
static clattn_status build_program(clattn_ctx *ctx, clattn_source source, const char *extra,
                                   cl_program *out)
{
    clattn_status status = CLATTN_SUCCESS;
    const char *kernel_dir = getenv("CLATTN_KERNEL_DIR");
    char *disk_common = NULL, *disk_source = NULL;
    const char *texts[2] = {clattn_kernel_common, sources[source].embedded};
    cl_program program = NULL;
    cl_int err = CL_SUCCESS;

    if (kernel_dir && kernel_dir[0]) {
        disk_common = read_text_file(kernel_dir, "common.cl");
        disk_source = read_text_file(kernel_dir, sources[source].file);
        if (!disk_common || !disk_source) {
            status = clattn__fail(ctx, CLATTN_ERR_BUILD, "CLATTN_KERNEL_DIR=%s: cannot read %s",
                                  kernel_dir, disk_common ? sources[source].file : "common.cl");
            goto done;
        }
        texts[0] = disk_common;
        texts[1] = disk_source;
    }
    program = clCreateProgramWithSource(ctx->context, 2, texts, NULL, &err);
    CL_CHECK(ctx, err, "clCreateProgramWithSource");
    char options[sizeof ctx->build_options + 256];
    snprintf(options, sizeof options, "%s %s", ctx->build_options, extra);
    err = clattn__fault(CLATTN_FAULT_BUILD)
              ? CL_BUILD_PROGRAM_FAILURE
              : clBuildProgram(program, 1, &ctx->device, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        /* The log may be longer than the message keeps: fetch it whole, keep its start. */
        size_t log_size = 0;
        char *log = NULL;
        if (clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &log_size) ==
            CL_SUCCESS)
            log = calloc(log_size + 1, 1);
        if (log && clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, log_size, log,
                                         NULL) != CL_SUCCESS)
            log[0] = '\0';
        status = clattn__fail(
            ctx, err == CL_BUILD_PROGRAM_FAILURE ? CLATTN_ERR_BUILD : (clattn_status)err,
            "clBuildProgram(%s, %s): %s (%d)\n%s", sources[source].file, options,
            clattn__cl_error_name(err), (int)err, log ? log : "(no build log)");
        free(log);
        goto done;
    }
    *out = program;
    program = NULL;
done:
    if (program)
        clReleaseProgram(program);
    free(disk_common);
    free(disk_source);
    return status;
}

clattn_status clattn__kernel(clattn_ctx *ctx, clattn_kernel_id id, cl_kernel *out)
{
    clattn_status status = CLATTN_SUCCESS;
    if (ctx->kernels[id]) {
        *out = ctx->kernels[id];
        return CLATTN_SUCCESS;
    }
    const kernel_entry *entry = &kernel_table[id];
    if (ctx->programs[entry->source] == NULL) {
        status = build_program(ctx, entry->source, "", &ctx->programs[entry->source]);
        if (status != CLATTN_SUCCESS)
            return status;
    }
    cl_int err = CL_SUCCESS;
    cl_kernel kernel = clCreateKernel(ctx->programs[entry->source], entry->name, &err);
    if (err != CL_SUCCESS)
        return clattn__fail(ctx, (clattn_status)err, "clCreateKernel(%s): %s (%d)", entry->name,
                            clattn__cl_error_name(err), (int)err);
    ctx->kernels[id] = kernel;
    *out = kernel;
    return status;
}

clattn_status clattn__launch_kernel(clattn_ctx *ctx, cl_kernel kernel, const char *name,
                                    const clattn_arg *args, cl_uint num_args, cl_uint dims,
                                    const size_t *global, const size_t *local, cl_uint num_wait,
                                    const cl_event *wait, cl_event *event)
{
    for (cl_uint i = 0; i < num_args; ++i) {
        cl_int err = clSetKernelArg(kernel, i, args[i].size, args[i].value);
        if (err != CL_SUCCESS)
            return clattn__fail(ctx, (clattn_status)err, "clSetKernelArg(%s, %u): %s (%d)", name,
                                (unsigned)i, clattn__cl_error_name(err), (int)err);
    }
    cl_int err = clattn__fault(CLATTN_FAULT_ENQUEUE)
                     ? CL_OUT_OF_RESOURCES
                     : clEnqueueNDRangeKernel(ctx->queue, kernel, dims, NULL, global, local,
                                              num_wait, num_wait ? wait : NULL, event);
    if (err != CL_SUCCESS)
        return clattn__fail(ctx, (clattn_status)err, "clEnqueueNDRangeKernel(%s): %s (%d)", name,
                            clattn__cl_error_name(err), (int)err);
    return CLATTN_SUCCESS;
}

clattn_status clattn__launch(clattn_ctx *ctx, clattn_kernel_id id, const char *name,
                             const clattn_arg *args, cl_uint num_args, cl_uint dims,
                             const size_t *global, const size_t *local, cl_uint num_wait,
                             const cl_event *wait, cl_event *event)
{
    cl_kernel kernel = NULL;
    clattn_status status = clattn__kernel(ctx, id, &kernel);
    if (status != CLATTN_SUCCESS)
        return status;
    return clattn__launch_kernel(ctx, kernel, name, args, num_args, dims, global, local, num_wait,
                                 wait, event);
}

clattn_status clattn__variant_kernel(clattn_ctx *ctx, clattn_source source, const char *name,
                                     const char *extra, cl_kernel *out)
{
    for (size_t i = 0; i < ctx->num_variants; ++i) {
        const clattn_variant *v = &ctx->variants[i];
        if (v->source == source && strcmp(v->options, extra) == 0 && strcmp(v->name, name) == 0) {
            *out = v->kernel;
            return CLATTN_SUCCESS;
        }
    }
    if (strlen(extra) >= sizeof ctx->variants[0].options)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: build options too long", name);
    if (ctx->num_variants == ctx->variant_capacity) {
        const size_t capacity = ctx->variant_capacity ? 2 * ctx->variant_capacity : 8;
        clattn_variant *grown = realloc(ctx->variants, capacity * sizeof *grown);
        if (grown == NULL)
            return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", name);
        ctx->variants = grown;
        ctx->variant_capacity = capacity;
    }
    cl_program program = NULL;
    clattn_status status = build_program(ctx, source, extra, &program);
    if (status != CLATTN_SUCCESS)
        return status;
    cl_int err = CL_SUCCESS;
    cl_kernel kernel = clCreateKernel(program, name, &err);
    if (err != CL_SUCCESS) {
        clReleaseProgram(program);
        return clattn__fail(ctx, (clattn_status)err, "clCreateKernel(%s): %s (%d)", name,
                            clattn__cl_error_name(err), (int)err);
    }
    clattn_variant *v = &ctx->variants[ctx->num_variants++];
    v->source = source;
    snprintf(v->name, sizeof v->name, "%s", name);
    snprintf(v->options, sizeof v->options, "%s", extra);
    v->program = program;
    v->kernel = kernel;
    *out = kernel;
    return CLATTN_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * Workspace, sizes, validation, event chains
 * ------------------------------------------------------------------------------------------- */

static const char *const workspace_names[CLATTN_WS_COUNT] = {
    [CLATTN_WS_Q_PROJ] = "q projection",
    [CLATTN_WS_K_PROJ] = "k projection",
    [CLATTN_WS_V_PROJ] = "v projection",
    [CLATTN_WS_Q_HEADS] = "q heads",
    [CLATTN_WS_K_HEADS] = "k heads",
    [CLATTN_WS_V_HEADS] = "v heads",
    [CLATTN_WS_SCORES] = "scores",
    [CLATTN_WS_O_HEADS] = "output heads",
    [CLATTN_WS_CONCAT] = "concatenated heads",
    [CLATTN_WS_HOST_IN0] = "host input 0",
    [CLATTN_WS_HOST_IN1] = "host input 1",
    [CLATTN_WS_HOST_IN2] = "host input 2",
    [CLATTN_WS_HOST_OUT] = "host output",
    [CLATTN_WS_HOST_ATTN] = "host weights output",
    [CLATTN_WS_HOST_MASK] = "host attn_mask",
    [CLATTN_WS_HOST_KPM] = "host key_padding_mask",
    [CLATTN_WS_HOST_W] = "host parameters",
    [CLATTN_WS_MATMUL_BT] = "transposed B",
    [CLATTN_WS_FLASH_LSE] = "log-sum-exp",
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
    if (ctx->workspace_limit && bytes > ctx->workspace_limit)
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

clattn_status clattn__check_norm(clattn_ctx *ctx, const char *op, clattn_norm norm)
{
    if (norm != CLATTN_NORM_SOFTMAX && norm != CLATTN_NORM_RELU)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: norm=%d is not a clattn_norm",
                            op, (int)norm);
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

bool clattn__matrix_extent(size_t batch, size_t stride, size_t rows, size_t cols, size_t ld,
                           size_t *out)
{
    size_t batch_part = 0, row_part = 0, total = 0;
    if (batch == 0 || rows == 0 || cols == 0) {
        *out = 0;
        return true;
    }
    return clattn__mul(batch - 1, stride, &batch_part) && clattn__mul(rows - 1, ld, &row_part) &&
           clattn__add(batch_part, row_part, &total) && clattn__add(total, cols, out);
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
                            "%s: %s buffer too small: offset %zu + %zu elements need %zu bytes, "
                            "the buffer has %zu",
                            op, name, t.offset, elems, bytes, have);
    return CLATTN_SUCCESS;
}

void clattn__chain_init(clattn_chain *chain, cl_uint num_wait, const cl_event *wait)
{
    chain->num_wait = wait ? num_wait : 0;
    chain->wait = wait;
    chain->last = NULL;
}

void clattn__chain_push(clattn_chain *chain, cl_event event)
{
    if (chain->last)
        clReleaseEvent(chain->last);
    chain->last = event;
    chain->num_wait = event ? 1 : 0;
    chain->wait = event ? &chain->last : NULL;
}

void clattn__chain_finish(clattn_chain *chain, cl_event *out)
{
    if (out)
        *out = chain->last;
    else if (chain->last)
        clReleaseEvent(chain->last);
    chain->last = NULL;
    chain->num_wait = 0;
    chain->wait = NULL;
}

clattn_status clattn__begin(clattn_ctx *ctx, const char *op, clattn_chain *chain, cl_uint num_wait,
                            const cl_event *wait)
{
    clattn__chain_init(chain, num_wait, wait);
    if (!ctx->out_of_order || ctx->last_event == NULL)
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
                     : clEnqueueMarkerWithWaitList(ctx->queue, num_wait + 1, list, &marker);
    free(list);
    if (err != CL_SUCCESS)
        return clattn__fail(ctx, (clattn_status)err, "%s: clEnqueueMarkerWithWaitList: %s (%d)", op,
                            clattn__cl_error_name(err), (int)err);
    clattn__chain_push(chain, marker);
    return CLATTN_SUCCESS;
}

clattn_status clattn__end(clattn_ctx *ctx, const char *op, clattn_chain *chain,
                          clattn_status status, cl_event *event)
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
    if (status == CLATTN_SUCCESS && ctx->out_of_order && chain->last) {
        if (ctx->last_event)
            clReleaseEvent(ctx->last_event);
        clRetainEvent(chain->last);
        ctx->last_event = chain->last;
    }
    clattn__chain_finish(chain, status == CLATTN_SUCCESS ? event : NULL);
    return status;
}

#ifdef CLATTN_FAULT_INJECTION
static long fault_target[CLATTN_FAULT_KINDS];
static long fault_calls[CLATTN_FAULT_KINDS];

bool clattn__fault(clattn_fault_kind kind)
{
    return ++fault_calls[kind] == fault_target[kind];
}

void clattn__fault_arm(clattn_fault_kind kind, long n)
{
    fault_target[kind] = n;
    fault_calls[kind] = 0;
}

long clattn__fault_calls(clattn_fault_kind kind)
{
    return fault_calls[kind];
}
#endif
