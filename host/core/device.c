/* Device choice (host/core): the platform and device a context runs on (a device_spec or
 * CLATTN_DEVICE: gpu, cpu or P:D; else the first GPU, then CPU), the device's limits read into
 * ctx->info, and the driver key that records are keyed by. */
#include "device.h"
#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

clattn_status clattn__choose_device(const char *spec, cl_device_id *out, char *msg, size_t msg_size)
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

/* cl_intel_subgroup_matrix_multiply_accumulate's sub-group size on the device: its smallest of
 * CL_DEVICE_SUB_GROUP_SIZES_INTEL (8: DG2, Meteor Lake's Arc; 16: Xe2, Ponte Vecchio), 0
 * without the extension or the query. Not CL_CHECKed: an absent extension is an answer. */
static unsigned dpas_subgroup(cl_device_id device)
{
    size_t size = 0;
    if (clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, 0, NULL, &size) != CL_SUCCESS || size == 0)
        return 0;
    char *extensions = malloc(size + 1);
    if (extensions == NULL)
        return 0;
    unsigned sg = 0;
    if (clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, size, extensions, NULL) == CL_SUCCESS) {
        extensions[size] = '\0';
        static const char name[] = "cl_intel_subgroup_matrix_multiply_accumulate";
        for (const char *at = strstr(extensions, name); at && !sg; at = strstr(at + 1, name)) {
            const char end = at[sizeof name - 1];
            if ((at == extensions || at[-1] == ' ') && (end == ' ' || end == '\0'))
                sg = 1;
        }
    }
    free(extensions);
    if (!sg)
        return 0;
    enum { SUB_GROUP_SIZES_INTEL = 0x4108 }; /* CL_DEVICE_SUB_GROUP_SIZES_INTEL */
    size_t sizes[16] = {0}, bytes = 0;
    if (clGetDeviceInfo(device, SUB_GROUP_SIZES_INTEL, sizeof sizes, sizes, &bytes) != CL_SUCCESS)
        return 0;
    unsigned smallest = 0;
    for (size_t i = 0; i < bytes / sizeof sizes[0] && i < 16; ++i)
        if ((sizes[i] == 8 || sizes[i] == 16) && (smallest == 0 || sizes[i] < smallest))
            smallest = (unsigned)sizes[i];
    return smallest;
}

clattn_status clattn__query_device(clattn_ctx *ctx)
{
    clattn_status status = CLATTN_SUCCESS;
    clattn_device_info *info = &ctx->info;
    size_t item_sizes[3] = {1, 1, 1};
    /* The limits every context needs, in this order; a failed query fails the context. */
/* clang-format off */
#define DEVICE_QUERY(param, field) {param, sizeof(field), &(field), "clGetDeviceInfo(" #param ")"}
    /* clang-format on */
    const struct {
        cl_device_info param;
        size_t size;
        void *value;
        const char *what;
    } queries[] = {
        DEVICE_QUERY(CL_DEVICE_TYPE, info->type),
        DEVICE_QUERY(CL_DEVICE_NAME, info->name),
        DEVICE_QUERY(CL_DEVICE_VENDOR, info->vendor),
        DEVICE_QUERY(CL_DEVICE_MAX_WORK_GROUP_SIZE, info->max_work_group_size),
        DEVICE_QUERY(CL_DEVICE_MAX_WORK_ITEM_SIZES, item_sizes),
        DEVICE_QUERY(CL_DEVICE_LOCAL_MEM_SIZE, info->local_mem_size),
        DEVICE_QUERY(CL_DEVICE_MAX_MEM_ALLOC_SIZE, info->max_alloc_size),
        DEVICE_QUERY(CL_DEVICE_GLOBAL_MEM_SIZE, info->global_mem_size),
        DEVICE_QUERY(CL_DEVICE_GLOBAL_MEM_CACHE_SIZE, info->global_cache_size),
        DEVICE_QUERY(CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT, info->preferred_float_width),
        DEVICE_QUERY(CL_DEVICE_MAX_COMPUTE_UNITS, info->compute_units),
    };
#undef DEVICE_QUERY
    for (size_t i = 0; i < sizeof queries / sizeof queries[0]; ++i)
        CL_CHECK(
            ctx,
            clGetDeviceInfo(ctx->device, queries[i].param, queries[i].size, queries[i].value, NULL),
            queries[i].what);
    {
        /* Not CL_CHECKed: a device without doubles may refuse the query instead of 0. */
        cl_device_fp_config fp64 = 0;
        info->has_fp64 = clGetDeviceInfo(ctx->device, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof fp64,
                                         &fp64, NULL) == CL_SUCCESS &&
                         fp64 != 0;
    }
    info->dpas_sg = dpas_subgroup(ctx->device);
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
