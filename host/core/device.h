/* Device choice and the device's limits (host/core/device.c). */
#ifndef CLATTN_CORE_DEVICE_H
#define CLATTN_CORE_DEVICE_H

#include "context.h"

/* The device `spec` names in *out: "gpu", "cpu" or "P:D" (platform:device); NULL or "" reads
 * CLATTN_DEVICE, and where that is unset too the first GPU, else CPU, else any device. On
 * failure writes why to msg. */
clattn_status clattn__choose_device(const char *spec, cl_device_id *out, char *msg,
                                    size_t msg_size);

/* Reads the limits and identity of ctx->device into ctx->info, its driver key included. */
clattn_status clattn__query_device(clattn_ctx *ctx);

/* The device's identity as records key it: "<device name> | driver <CL_DRIVER_VERSION> |
 * <CL_PLATFORM_VERSION> | clattn <version>", tabs and line breaks as spaces. A new driver, platform
 * or clattn version is a new key: its tuning rows and validation records start afresh. */
void clattn__driver_key(const clattn_ctx *ctx, char *out, size_t size);

#endif
