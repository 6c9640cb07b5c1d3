/* The attention backward's dK/dV and dQ passes for GPUs (kernels/flash_bwd_gpu.cl: a
 * work-group per block of keys (rows), their rows and tiles of query rows (keys) in local
 * memory): the tiles from the device's local memory and work-group size, chosen where the host
 * would run the generic one-key (one-row) per work-item bwd_dkdv and bwd_dq (ops/flash_bwd.c
 * launches them). */
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Local memory the kernel declares: K, V rows of the block (the head sizes in whole float4s +
 * 4 words), Q, dO rows of a row tile, the transposed P Z and dX tiles (rows + 4 words a key),
 * lse and delta of the tile. */
static cl_ulong local_bytes(size_t dk, size_t dv, unsigned bk, unsigned br)
{
    const size_t qk_pad = (dk + 3) / 4 * 4 + 4, v_pad = (dv + 3) / 4 * 4 + 4;
    return (cl_ulong)((size_t)(bk + br) * (qk_pad + v_pad) + 2 * (size_t)bk * (br + 4) + 2 * br) *
           sizeof(float);
}

/* The family (core/family.h): flash_bwd.cl's switches and the tiles, after flash_bwd.cl */
/* clang-format off */
#define FLASH_BWD_GPU_SWITCHES(X)                                                                  \
    CLATTN__FLASH_BWD_SWITCHES(X) X(BG_BK, 0, NULL) X(BG_BR, 0, NULL) X(BG_TX, 0, NULL)            \
    X(BG_TY, 0, NULL)
/* clang-format on */
CLATTN_FAMILY(flash_bwd_gpu, FLASH_BWD_GPU_SWITCHES,
              .sources = {"flash_bwd.cl", "flash_bwd_gpu.cl"}, .score_family = CLATTN__FAMILY_FLASH,
              .tuning_keys = "flash_cpu");
/* flash_bwd.cl's switches, the head of flash_bwd_gpu_switches */
#define BASE_COUNT(macro, flags, describe) +1
enum { FLASH_BWD_SWITCH_COUNT = 0 CLATTN__FLASH_BWD_SWITCHES(BASE_COUNT) };
#undef BASE_COUNT

bool clattn__flash_bwd_gpu_prepare(clattn_ctx *ctx, const clattn__flash_bwd_shape *shape,
                                   const void *base, const clattn_define *defines, size_t count,
                                   clattn__flash_bwd_plan *plan, clattn_status *status)
{
    *status = CLATTN_SUCCESS;
    /* CLATTN_BWD_GPU=0: the generic kernels everywhere (a switch for comparing them) */
    const char *choice = getenv("CLATTN_BWD_GPU");
    if (choice && strcmp(choice, "0") == 0)
        return false;
    const size_t dk = shape->head_dim_qk, dv = shape->head_dim_v;
    unsigned tx = 16, ty = 8, bk = 32, br = 32;
    const size_t items = (size_t)tx * ty;
    if (items > ctx->info.max_work_group_size || items > ctx->info.max_item_sizes[0])
        return false;
    /* No more rows than the problem has (down to ty); then, too big for the local memory
     * (large head sizes), the row tile shrinks first (it is reloaded per key block; the key
     * block's size sets how often), then the key block. */
    const size_t seq_q = shape->score.seq_q;
    while (br / 2 >= ty && br / 2 % 4 == 0 && br / 2 >= seq_q)
        br /= 2;
    const cl_ulong budget = ctx->info.local_mem_size > 1024 ? ctx->info.local_mem_size - 1024
                                                            : ctx->info.local_mem_size;
    while (local_bytes(dk, dv, bk, br) > budget) {
        if (br / 2 >= ty && br / 2 % 4 == 0)
            br /= 2;
        else if (bk / 2 >= tx && bk / 2 % ty == 0)
            bk /= 2;
        else
            return false;
    }
    flash_bwd_gpu_switches sw;
    memcpy(&sw, base, FLASH_BWD_SWITCH_COUNT * sizeof(long));
    sw.BG_BK = bk, sw.BG_BR = br, sw.BG_TX = tx, sw.BG_TY = ty;
    cl_kernel kernel = NULL;
    *status = clattn__family_fits(ctx, &flash_bwd_gpu_family, "bwd_dkdv_gpu", &sw, defines, count,
                                  items, &kernel);
    if (*status != CLATTN_SUCCESS || kernel == NULL) /* an error, or too many registers */
        return false;
    plan->dkdv = kernel;
    plan->local_dkdv = items;
    plan->gpu = true;
    plan->gpu_keys = bk;
    plan->gpu_rows = br;
    /* dQ the same way (blocks of bk rows, tiles of br keys: less local memory) where no
     * mask gradient (bwd_dq writes dS) or key parts are wanted */
    if (!shape->want_dmask && plan->key_parts == 1) {
        *status = clattn__family_fits(ctx, &flash_bwd_gpu_family, "bwd_dq_gpu", &sw, defines, count,
                                      items, &kernel);
        if (*status != CLATTN_SUCCESS)
            return false;
        if (kernel != NULL) {
            plan->dq = kernel;
            plan->local_dq = items;
            plan->gpu_dq = true;
        }
    }
    return true;
}
