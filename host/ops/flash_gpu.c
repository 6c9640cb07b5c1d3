/* The cooperative fused kernel for GPUs (kernels/flash_gpu.cl): its tile sizes from the
 * tuning row (fg_bq, fg_bk, fg_tx, fg_ty) shrunk to the device's local memory and to what the
 * compiled kernel can run, and its key parts on loop-limited devices. It takes the same
 * arguments as flash.cl, so ops/flash.c launches it. */
#include "ops.h"

#include <stdarg.h>
#include <stdio.h>

/* The family (core/family.h) */
/* clang-format off */
#define FLASH_GPU_SWITCHES(X)                                                                      \
    X(HEAD_DIM_QK, 0, NULL) X(HEAD_DIM_V, 0, NULL) X(FG_BQ, 0, "%ld") X(FG_BK, 0, "x %ld tiles")   \
    X(FG_TX, 0, "%ld") X(FG_TY, 0, "x %ld items") X(Q_DTYPE, 0, NULL) X(K_DTYPE, 0, NULL)          \
    X(V_DTYPE, 0, NULL) X(O_DTYPE, 0, NULL) X(FG_DPAS, 0, NULL)
/* clang-format on */
CLATTN_FAMILY(flash_gpu, FLASH_GPU_SWITCHES, .sources = {"flash_gpu.cl"},
              .score_family = CLATTN__FAMILY_FLASH_GPU,
              .tuning_keys = "flash_gpu fg_bq fg_bk fg_tx fg_ty fg_dpas fg_dpas_sg");

/* Local memory the variant declares (kernels/flash_gpu.cl: q_tile, kv_tile, p_tile, the three
 * row arrays, tile_padded; a paged cache's tile_pages). */
static cl_ulong local_bytes(size_t dk, size_t dv, unsigned bq, unsigned bk, bool paged)
{
    /* q and K rows: d_k in whole float4s + 4 words; V rows d_v + 1; weights' rows: bk in
     * whole float4s + 4; the K/V tile rounded up to whole float4s */
    const size_t qk_pad = (dk + 3) / 4 * 4 + 4, v_pad = dv + 1;
    const size_t kv_words = ((size_t)bk * (qk_pad > v_pad ? qk_pad : v_pad) + 3) / 4 * 4;
    const size_t p_pad = ((size_t)bk + 3) / 4 * 4 + 4;
    return (cl_ulong)(bq * qk_pad + kv_words + bq * p_pad + 3 * bq + (paged ? 2 * bk : 0)) *
               sizeof(float) +
           bk;
}

/* Loop trips of one work-item per key tile and outside the tiles, counted as if no loop were
 * unrolled, over-estimated; for devices that cap them (tuning.loop_trip_limit). */
static size_t keys_per_launch(const clattn_ctx *ctx, size_t dk, size_t dv, unsigned bq, unsigned bk,
                              unsigned tx, unsigned ty)
{
    const size_t limit = ctx->tuning.loop_trip_limit;
    if (limit == 0)
        return 0;
    const size_t items = (size_t)tx * ty, rm = bq / ty, rn = bk / tx, rd = (dv + tx - 1) / tx;
    const size_t rows_per_item = (bq + items - 1) / items;
    const size_t per_tile = (bk * dk + items - 1) / items + 1 + rm * rn +
                            dk * (1 + rm + rn + rm * rn) + rm * (1 + rn) +
                            rows_per_item * (1 + 3 * bk) + (bk * dv + items - 1) / items +
                            rm * (1 + rd) + bk * (1 + rd + rm * (1 + rd)) + 1;
    const size_t outside = (bq * dk + items - 1) / items + 2 * rows_per_item + rm * (1 + rd) * 2;
    const size_t tiles = limit / 2 > outside + per_tile ? (limit / 2 - outside) / per_tile : 1;
    return tiles * bk;
}

clattn_status clattn__flash_pass(clattn__flash_plan *plan, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(plan->passed, sizeof plan->passed, format, args);
    va_end(args);
    return CLATTN_SUCCESS;
}

/* Intel's matrix engine (kernels/flash_gpu.cl's FG_DPAS): 1 where the device reports
 * cl_intel_subgroup_matrix_multiply_accumulate, 2 its emulation (fg_dpas=2), 0 not: q, k and v
 * f16 or all bf16, d_k a multiple of 16, no decode step in the launch (KV_STEP reads q scaled). */
static unsigned dpas_mode(const clattn_ctx *ctx, const clattn__flash_shape *shape)
{
    const unsigned want = shape->tuning->fg_dpas;
    const clattn_dtype q = shape->q_dtype;
    if (want == 0 || (want == 1 && ctx->info.dpas_sg == 0))
        return 0;
    if ((q != CLATTN_DTYPE_F16 && q != CLATTN_DTYPE_BF16) || shape->k_dtype != q ||
        shape->v_dtype != q || shape->head_dim_qk % 16 != 0 || shape->score.kv_step)
        return 0;
    return want;
}

/* FG_DPAS's tiles: sub-groups of `sg` items (fg_tx), 8 rows each (fg_bq = 8 fg_ty, fg_ty from
 * the tuning's fg_bq), key tiles of a multiple of 16 keys; no more rows than the problem has,
 * then halved until the local memory (with the emulation's fragments) fits. */
static bool dpas_tiles(const clattn_ctx *ctx, const clattn__flash_shape *shape, unsigned sg,
                       unsigned dpas, cl_ulong budget, unsigned *tx, unsigned *ty, unsigned *bq,
                       unsigned *bk)
{
    const size_t dk = shape->head_dim_qk, dv = shape->head_dim_v;
    unsigned rows = shape->tuning->fg_bq / 8 ? shape->tuning->fg_bq / 8 : 1;
    unsigned keys = shape->tuning->fg_bk < 16 ? 16 : shape->tuning->fg_bk / 16 * 16;
    while (rows > 1 && (size_t)(rows / 2) * 8 >= shape->score.seq_q)
        rows /= 2;
    while ((size_t)rows * sg > ctx->info.max_work_group_size && rows > 1)
        rows /= 2;
    for (;;) {
        const cl_ulong emulated = dpas == 2 ? (cl_ulong)rows * 8 * sg * sizeof(cl_uint) : 0;
        if (local_bytes(dk, dv, 8 * rows, keys, shape->score.kv_paged) + emulated <= budget)
            break;
        if (rows > 1)
            rows /= 2;
        else if (keys > 16)
            keys = keys >= 32 ? keys / 32 * 16 : 16;
        else
            return false;
    }
    *tx = sg, *ty = rows, *bq = 8 * rows, *bk = keys;
    return (size_t)sg * rows <= ctx->info.max_work_group_size &&
           (size_t)sg * rows <= ctx->info.max_item_sizes[0];
}

clattn_status clattn__flash_gpu_prepare(clattn_ctx *ctx, const clattn__flash_shape *shape,
                                        clattn__flash_plan *plan)
{
    static const char op[] = "flash_attention";
    const clattn_tuning *t = shape->tuning;
    const size_t dk = shape->head_dim_qk, dv = shape->head_dim_v;
    const clattn__score_shape *score = &shape->score;
    unsigned tx = t->fg_tx, ty = t->fg_ty, bq = t->fg_bq, bk = t->fg_bk;
    unsigned dpas = dpas_mode(ctx, shape);
    if (dpas) {
        const cl_ulong room = ctx->info.local_mem_size > 1024 ? ctx->info.local_mem_size - 1024
                                                              : ctx->info.local_mem_size;
        const unsigned sg = dpas == 1 ? ctx->info.dpas_sg : t->fg_dpas_sg;
        if (!dpas_tiles(ctx, shape, sg, dpas, room, &tx, &ty, &bq, &bk))
            dpas = 0, tx = t->fg_tx, ty = t->fg_ty, bq = t->fg_bq, bk = t->fg_bk;
    }
    if (tx == 0 || ty == 0 || bq < ty || bk < tx || bq % ty != 0 || bk % tx != 0)
        return clattn__flash_pass(plan,
                                  "flash_gpu: fg_bq=%u fg_bk=%u do not tile by fg_ty=%u "
                                  "fg_tx=%u",
                                  bq, bk, ty, tx);
    /* No bigger than the problem needs (fewer idle rows for short sequences). */
    while (!dpas && bq / 2 >= ty && bq / 2 % ty == 0 && bq / 2 >= score->seq_q)
        bq /= 2;
    const cl_ulong budget = ctx->info.local_mem_size > 1024 ? ctx->info.local_mem_size - 1024
                                                            : ctx->info.local_mem_size;
    /* Too big (large head sizes): the query block shrinks to 32 rows first, then the key
     * tile, then the query block again (a key tile of FG_TX keys is one key per work-item),
     * then the key tile with the work-items along it (MLA's d_qk = 576, d_v = 512 in 48 KiB:
     * 8 rows, 8 keys, 8 x 8 items). */
    while (local_bytes(dk, dv, bq, bk, score->kv_paged) > budget) {
        if (bq / 2 >= ty && bq / 2 % ty == 0 && bq / 2 >= 32)
            bq /= 2;
        else if (bk / 2 >= tx && bk / 2 % tx == 0)
            bk /= 2;
        else if (bq / 2 >= ty && bq / 2 % ty == 0)
            bq /= 2;
        else if (tx % 2 == 0 && tx / 2 >= 4 && bk == tx)
            tx /= 2, bk /= 2;
        else
            return clattn__flash_pass(plan, "flash_gpu: no tile fits %llu bytes of local memory",
                                      (unsigned long long)budget);
    }
    if ((size_t)tx * ty > ctx->info.max_work_group_size ||
        (size_t)tx * ty > ctx->info.max_item_sizes[0])
        return clattn__flash_pass(plan,
                                  "flash_gpu: fg_tx * fg_ty = %u work-items, more than the "
                                  "device's group (%zu)",
                                  tx * ty, ctx->info.max_work_group_size);
    const flash_gpu_switches sw = {.HEAD_DIM_QK = (long)dk,
                                   .HEAD_DIM_V = (long)dv,
                                   .FG_BQ = bq,
                                   .FG_BK = bk,
                                   .FG_TX = tx,
                                   .FG_TY = ty,
                                   .Q_DTYPE = shape->q_dtype,
                                   .K_DTYPE = shape->k_dtype,
                                   .V_DTYPE = shape->v_dtype,
                                   .O_DTYPE = shape->out_dtype,
                                   .FG_DPAS = dpas};
    clattn_define defines[CLATTN_DEFINES_MAX];
    const size_t count = clattn__score_defines(score, flash_gpu_family.score_family, defines);
    cl_kernel kernel = NULL;
    clattn_status status = clattn__family_fits(ctx, &flash_gpu_family, op, &sw, defines, count,
                                               (size_t)tx * ty, &kernel);
    if (status != CLATTN_SUCCESS)
        return status;
    if (kernel == NULL) /* too many registers for this many work-items */
        return clattn__flash_pass(plan,
                                  "flash_gpu: the compiled kernel runs fewer than %u "
                                  "work-items per group (registers)",
                                  tx * ty);
    plan->kernel = kernel;
    clattn__family_describe(&flash_gpu_family, &sw,
                            dpas == 1   ? "matrix engine (DPAS)"
                            : dpas == 2 ? "matrix engine emulated (DPAS)"
                                        : NULL,
                            plan->variant, sizeof plan->variant);
    plan->key_tile = bk;
    plan->tile_rows = bq;
    plan->block_q = bq;
    plan->group_items = tx * ty;
    const size_t part_keys = keys_per_launch(ctx, dk, dv, bq, bk, tx, ty);
    plan->part_keys = part_keys == 0 || part_keys > score->seq_k ? score->seq_k : part_keys;
    /* a decode step (KV_STEP) in the one launch of a plan whose keys need no parts */
    plan->kv_step = score->kv_step && plan->part_keys == score->seq_k;
    return CLATTN_SUCCESS;
}
