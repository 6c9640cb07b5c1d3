/* Device choice, context and queue, per-device tuning, program cache, launches, workspace. */
#include "runtime.h"
#include "validate.h"
#include "tuning.h"
#include "kernels_embedded.h"

#include <ctype.h>
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

void clattn__driver_key(const clattn_ctx *ctx, char *out, size_t size)
{
    if (size == 0)
        return;
    snprintf(out, size, "%s | driver %s | %s | clattn %s", ctx->info.name,
             ctx->info.driver_version, ctx->info.platform_version, CLATTN_VERSION_STRING);
    for (char *c = out; *c; ++c)
        if (*c == '\t' || *c == '\n' || *c == '\r')
            *c = ' ';
}

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
    {
        /* Not CL_CHECKed: a device without doubles may refuse the query instead of 0. */
        cl_device_fp_config fp64 = 0;
        info->has_fp64 = clGetDeviceInfo(ctx->device, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof fp64,
                                         &fp64, NULL) == CL_SUCCESS &&
                         fp64 != 0;
    }
    {
        /* Not CL_CHECKed: they key records (clattn__driver_key); an empty string is a key too. */
        cl_platform_id platform = NULL;
        if (clGetDeviceInfo(ctx->device, CL_DRIVER_VERSION, sizeof info->driver_version,
                            info->driver_version, NULL) != CL_SUCCESS)
            info->driver_version[0] = '\0';
        if (clGetDeviceInfo(ctx->device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL) !=
                CL_SUCCESS ||
            clGetPlatformInfo(platform, CL_PLATFORM_VERSION, sizeof info->platform_version,
                              info->platform_version, NULL) != CL_SUCCESS)
            info->platform_version[0] = '\0';
        info->driver_version[sizeof info->driver_version - 1] = '\0';
        info->platform_version[sizeof info->platform_version - 1] = '\0';
    }
    info->name[sizeof info->name - 1] = '\0';
    info->vendor[sizeof info->vendor - 1] = '\0';
    for (int d = 0; d < 3; ++d)
        info->max_item_sizes[d] = item_sizes[d];
    clattn__driver_key(ctx, info->driver_key, sizeof info->driver_key);
done:
    return status;
}

/* ---------------------------------------------------------------------------------------------
 * Context
 * ------------------------------------------------------------------------------------------- */

static clattn_status finish_create(clattn_ctx *ctx, const clattn_ctx_desc *desc, clattn_ctx **out,
                                   char *msg, size_t msg_size)
{
    clattn_status status = query_device(ctx);
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
    clattn_status status = choose_device(device_spec, &device, message, message_size);
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

enum { CLATTN_TRACE_MAX = 4096 }; /* kernels a trace keeps */
static void drop_trace(clattn_ctx *ctx);

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

/* ---------------------------------------------------------------------------------------------
 * Programs and kernels
 * ------------------------------------------------------------------------------------------- */

typedef struct source_entry {
    const char *file; /* for CLATTN_KERNEL_DIR and messages */
    const char *embedded;
    const char *base_file; /* a source that precedes this one in its programs, or NULL */
    const char *base_embedded;
} source_entry;

static const source_entry sources[CLATTN_SRC_COUNT] = {
    [CLATTN_SRC_MATMUL] = {"matmul.cl", clattn_kernel_matmul},
    [CLATTN_SRC_SOFTMAX] = {"softmax.cl", clattn_kernel_softmax},
    [CLATTN_SRC_HEADS] = {"heads.cl", clattn_kernel_heads},
    [CLATTN_SRC_FLASH] = {"flash.cl", clattn_kernel_flash},
    [CLATTN_SRC_FLASH_CPU] = {"flash_cpu.cl", clattn_kernel_flash_cpu},
    [CLATTN_SRC_FLASH_GPU] = {"flash_gpu.cl", clattn_kernel_flash_gpu},
    [CLATTN_SRC_POSENC] = {"posenc.cl", clattn_kernel_posenc},
    [CLATTN_SRC_ROPE] = {"rope.cl", clattn_kernel_rope},
    [CLATTN_SRC_ADDITIVE] = {"additive.cl", clattn_kernel_additive},
    [CLATTN_SRC_FLASH_BWD] = {"flash_bwd.cl", clattn_kernel_flash_bwd},
    /* the GPU backward shares flash_bwd.cl's definitions (bwd_recompute, ROW_INDEX, ...) */
    [CLATTN_SRC_FLASH_BWD_GPU] = {"flash_bwd_gpu.cl", clattn_kernel_flash_bwd_gpu, "flash_bwd.cl",
                                  clattn_kernel_flash_bwd},
    [CLATTN_SRC_FLEX] = {"flex.cl", clattn_kernel_flex},
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

static size_t count_lines(const char *text)
{
    size_t n = 0;
    for (; *text; ++text)
        n += *text == '\n';
    return n;
}

/* The build log with the score functions' lines named as their own: a compiler that ignores
 * #line (Oclgrind numbers the whole program's lines as one file's) names a line of one of the
 * parts in `flex` (the text that follows `before` lines of the program) by its place; each
 * `FILE:LINE:` that falls inside a part becomes `PART:LINE':`, PART the name its #line gives
 * (host/attn/flex.c). Returns a new string, or NULL (out of memory: the caller keeps log). */
static char *map_flex_lines(const char *log, const char *flex, size_t before)
{
    enum { PARTS = 8 };
    struct { size_t first, last; char name[32]; } parts[PARTS];
    size_t count = 0, line = 1;
    for (const char *at = flex; *at && count < PARTS; ++line) {
        const char *end = strchr(at, '\n');
        if (end == NULL)
            break;
        char name[32];
        if (sscanf(at, "#line 1 \"%31[^\"]\"", name) == 1 && strcmp(name, "score.cl") != 0) {
            parts[count].first = before + line + 1;
            parts[count].last = SIZE_MAX;
            snprintf(parts[count].name, sizeof parts[count].name, "%s", name);
            ++count;
        } else if (count && parts[count - 1].last == SIZE_MAX &&
                   strncmp(at, "#undef score_mod\n", 17) == 0) {
            parts[count - 1].last = before + line - 1;
        }
        at = end + 1;
    }
    const size_t size = strlen(log) * 2 + 64;
    char *out = malloc(size);
    if (out == NULL)
        return NULL;
    size_t used = 0;
    for (const char *at = log; *at && used + 48 < size;) {
        /* a token of file-name characters followed by ":digits:" */
        size_t token = 0;
        while (at[token] && (isalnum((unsigned char)at[token]) || strchr("._-<>/", at[token])))
            ++token;
        if (token > 0 && at[token] == ':' && isdigit((unsigned char)at[token + 1])) {
            char *digits_end = NULL;
            const unsigned long long n = strtoull(at + token + 1, &digits_end, 10);
            size_t p = 0;
            while (p < count && !(n >= parts[p].first && n <= parts[p].last))
                ++p;
            if (*digits_end == ':' && p < count) {
                used += (size_t)snprintf(out + used, size - used, "%s:%llu", parts[p].name,
                                         n - parts[p].first + 1);
                at = digits_end;
                continue;
            }
        }
        const size_t step = token > 0 ? token : 1;
        for (size_t i = 0; i < step && used + 1 < size; ++i)
            out[used++] = at[i];
        at += step;
    }
    out[used < size ? used : size - 1] = '\0';
    return out;
}

/* Builds `source` with the context's options plus `extra` (may be ""). */
static clattn_status build_program(clattn_ctx *ctx, clattn_source source, const char *extra,
                                   int fault, cl_program *out)
{
    clattn_status status = CLATTN_SUCCESS;
    const char *kernel_dir = getenv("CLATTN_KERNEL_DIR");
    /* common.cl, types.cl (dtype loads and stores), params.h (the kernel families' parameter
     * structs, shared with the host) and score.cl (the score rule) precede every kernel
     * source. */
    enum { PRELUDE = 4, TEXTS = PRELUDE + 3 };
    static const char *const prelude_files[PRELUDE] = {"common.cl", "types.cl", "params.h",
                                                       "score.cl"};
    /* A user's score functions (-DFLEX_SRC=n: the context's source n - 1, host/attn/flex.c)
     * go between params.h and score.cl, which calls them. */
    const char *flex_at = strstr(extra, "-DFLEX_SRC=");
    const long flex_id = flex_at ? strtol(flex_at + strlen("-DFLEX_SRC="), NULL, 10) : 0;
    const char *flex_text = flex_id > 0 && (size_t)flex_id <= ctx->num_flex_sources
                                ? ctx->flex_sources[flex_id - 1]
                                : "";
    /* the source's base (if any), then the source */
    const bool has_base = sources[source].base_embedded != NULL;
    const cl_uint count = has_base ? TEXTS : TEXTS - 1;
    char *disk[TEXTS] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    const char *texts[TEXTS] = {clattn_kernel_common, clattn_kernel_types, clattn_kernel_params,
                                flex_text, clattn_kernel_score,
                                has_base ? sources[source].base_embedded : sources[source].embedded,
                                sources[source].embedded};
    cl_program program = NULL;
    cl_int err = CL_SUCCESS;

    if (kernel_dir && kernel_dir[0]) {
        for (cl_uint i = 0; i < count; ++i) {
            if (i == 3)
                continue; /* the user's functions: not a file */
            const cl_uint f = i < 3 ? i : i - 1; /* the file's index without them */
            const char *file = f < PRELUDE                ? prelude_files[f]
                               : has_base && f == PRELUDE ? sources[source].base_file
                                                          : sources[source].file;
            disk[i] = read_text_file(kernel_dir, file);
            if (disk[i] == NULL) {
                status = clattn__fail(ctx, CLATTN_ERR_BUILD,
                                      "CLATTN_KERNEL_DIR=%s: cannot read %s", kernel_dir, file);
                goto done;
            }
            texts[i] = disk[i];
        }
    }
    program = clCreateProgramWithSource(ctx->context, count, texts, NULL, &err);
    CL_CHECK(ctx, err, "clCreateProgramWithSource");
    char options[sizeof ctx->build_options + 256];
    /* CLATTN_FAULT_VARIANT's planted faults (validate.c): 1 a wrong element, 2 a failed build */
    snprintf(options, sizeof options, "%s %s%s", ctx->build_options, extra,
             fault == 1 ? " -DCLATTN_FAULT_WRONG=1" : "");
    err = clattn__fault(CLATTN_FAULT_BUILD) || fault == 2
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
        if (flex_text[0] && log) { /* the user's source: its lines numbered as its own */
            char *mapped = map_flex_lines(
                log, flex_text, count_lines(texts[0]) + count_lines(texts[1]) + count_lines(texts[2]));
            if (mapped) {
                free(log);
                log = mapped;
            }
        }
        if (flex_text[0])
            status = clattn__fail(
                ctx, err == CL_BUILD_PROGRAM_FAILURE ? CLATTN_ERR_BUILD : (clattn_status)err,
                "the user's score functions do not build (lines of score_mod are the "
                "source's own): %s (%d)\n%s",
                clattn__cl_error_name(err), (int)err, log ? log : "(no build log)");
        else
            status = clattn__fail(
                ctx, err == CL_BUILD_PROGRAM_FAILURE ? CLATTN_ERR_BUILD : (clattn_status)err,
                "clBuildProgram(%s, %s): %s (%d)\n%s", sources[source].file, options,
                clattn__cl_error_name(err), (int)err, log ? log : "(no build log)");
        free(log);
        goto done;
    }
    if (flex_text[0])
        ++ctx->builds_user;
    *out = program;
    program = NULL;
done:
    if (program)
        clReleaseProgram(program);
    for (int i = 0; i < TEXTS; ++i)
        free(disk[i]);
    return status;
}

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

static void drop_trace(clattn_ctx *ctx)
{
    for (size_t i = 0; i < ctx->trace_count; ++i)
        clReleaseEvent(ctx->trace[i].event);
    ctx->trace_count = 0;
    ctx->trace_dropped = 0;
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

/* A variant whose build failed: its -cl-opt-disable build (a compiler's crash is often in an
 * optimisation), kept under the original options too so that it is built once; the user's
 * score functions excepted (their errors are theirs to see). Else the build's status. */
static clattn_status safe_instead(clattn_ctx *ctx, clattn_source source, const char *name,
                                  const char *extra, clattn_status status, cl_kernel *out)
{
    char safe[sizeof ctx->variants[0].options];
    if (status != CLATTN_ERR_BUILD || strstr(extra, "-cl-opt-disable") ||
        strstr(extra, "-DFLEX_SRC=") ||
        snprintf(safe, sizeof safe, "%s -cl-opt-disable", extra) >= (int)sizeof safe)
        return status;
    char message[sizeof ctx->message];
    memcpy(message, ctx->message, sizeof message);
    cl_kernel kernel = NULL;
    if (clattn__variant_kernel(ctx, source, name, safe, &kernel) != CLATTN_SUCCESS ||
        ctx->num_variants == ctx->variant_capacity) {
        memcpy(ctx->message, message, sizeof message);
        return status;
    }
    clattn_variant alias = ctx->variants[ctx->num_variants - 1];
    snprintf(alias.options, sizeof alias.options, "%s", extra);
    clRetainProgram(alias.program);
    clRetainKernel(alias.kernel);
    ctx->variants[ctx->num_variants++] = alias;
    *out = kernel;
    return CLATTN_SUCCESS;
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
    /* The entry is filled first (its key and planted fault), and kept only once built. */
    clattn_variant *v = &ctx->variants[ctx->num_variants];
    memset(v, 0, sizeof *v);
    v->source = source;
    snprintf(v->name, sizeof v->name, "%s", name);
    snprintf(v->options, sizeof v->options, "%s", extra);
    clattn__variant_identity(ctx, sources[source].file, v);
    cl_program program = NULL;
    clattn_status status = build_program(ctx, source, extra, v->fault, &program);
    if (status != CLATTN_SUCCESS) {
        const clattn_variant failed = *v;
        char message[sizeof ctx->message];
        memcpy(message, ctx->message, sizeof message);
        clattn__note_build_failure(ctx, &failed, status);
        memcpy(ctx->message, message, sizeof message);
        return safe_instead(ctx, source, name, extra, status, out);
    }
    cl_int err = CL_SUCCESS;
    cl_kernel kernel = clCreateKernel(program, name, &err);
    if (err != CL_SUCCESS) {
        clReleaseProgram(program);
        return clattn__fail(ctx, (clattn_status)err, "clCreateKernel(%s): %s (%d)", name,
                            clattn__cl_error_name(err), (int)err);
    }
    v->program = program;
    v->kernel = kernel;
    ctx->num_variants++;
    if (v->fault == 3)
        ctx->enqueue_faults = true;
    *out = kernel;
    return CLATTN_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * Workspace, sizes, validation, event chains
 * ------------------------------------------------------------------------------------------- */

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

clattn_status clattn__variant_fits(clattn_ctx *ctx, clattn_source source, const char *name,
                                   const char *extra, size_t items, cl_kernel *kernel)
{
    cl_kernel built = NULL;
    *kernel = NULL;
    clattn_status status = clattn__variant_kernel(ctx, source, name, extra, &built);
    if (status != CLATTN_SUCCESS)
        return status;
    size_t kernel_max = 0;
    const cl_int err = clGetKernelWorkGroupInfo(built, ctx->device, CL_KERNEL_WORK_GROUP_SIZE,
                                                sizeof kernel_max, &kernel_max, NULL);
    if (err != CL_SUCCESS)
        return clattn__cl_fail(ctx, err, "clGetKernelWorkGroupInfo(CL_KERNEL_WORK_GROUP_SIZE)");
    if (kernel_max >= items)
        *kernel = built;
    return CLATTN_SUCCESS;
}
