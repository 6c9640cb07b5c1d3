/* Fused (flash) attention: the program variant per head sizes and dtypes, per-device tiles,
 * key parts and launch geometry for kernels/flash.cl (wherever neither variant below runs),
 * kernels/flash_cpu.cl (CPUs: tuning key flash_cpu=1) and kernels/flash_gpu.cl (GPUs:
 * flash_gpu=1; its tiles are chosen in ops/flash_gpu.c). */
#include "ops.h"
#include "probe.h" /* self-validation (core/validate.h) */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The families this file builds (core/family.h): the CPU fused kernel and the portable one. */
/* clang-format off */
#define FLASH_CPU_SWITCHES(X)                                                                      \
    X(HEAD_DIM_QK, 0, NULL) X(HEAD_DIM_V, 0, NULL) X(FC_NB, 0, "%ld")                              \
    X(FC_RB, 0, "x %ld-row blocks") X(FC_KV, 0, NULL) X(FC_DIRECT, 0, NULL) X(Q_DTYPE, 0, NULL)    \
    X(K_DTYPE, 0, NULL) X(V_DTYPE, 0, NULL) X(O_DTYPE, 0, NULL) X(FC_PF, 0, NULL)                 \
    X(FC_TWO_PASS, 0, NULL)
/* clang-format on */
CLATTN_FAMILY(flash_cpu, FLASH_CPU_SWITCHES, .sources = {"flash_cpu.cl"},
              .score_family = CLATTN__FAMILY_FLASH_CPU,
              .tuning_keys = "flash_cpu flash_cpu_rb flash_cpu_nb flash_cpu_kv flash_cpu_tp "
                             "flash_cpu_pf flash_cpu_pf_min");

/* clang-format off */
#define FLASH_SWITCHES(X)                                                                          \
    X(HEAD_DIM_QK, 0, NULL) X(HEAD_DIM_V, 0, NULL) X(BLOCK_Q, 0, "%ld rows")                       \
    X(BLOCK_K, 0, "%ld-key tiles") X(FLASH_VW, 0, "%ld-float vectors") X(Q_DTYPE, 0, NULL)         \
    X(K_DTYPE, 0, NULL) X(V_DTYPE, 0, NULL) X(O_DTYPE, 0, NULL) X(ADDITIVE, 0, NULL)
/* clang-format on */
CLATTN_FAMILY(flash, FLASH_SWITCHES, .sources = {"flash.cl"}, .score_family = CLATTN__FAMILY_FLASH,
              .tuning_keys = "flash_rows flash_vw");

/* The decode splits' merge (kernels/heads.cl's flash_merge) */
#define FLASH_MERGE_SWITCHES(X) X(HEADS_WG, 0, NULL) X(O_DTYPE, 0, NULL)
CLATTN_FAMILY(flash_merge, FLASH_MERGE_SWITCHES, .sources = {"heads.cl"},
              .tuning_keys = "heads_wg decode_keys");

#define FLASH_MAX_HEAD_DIM CLATTN__FLASH_MAX_HEAD_DIM
/* NVIDIA's OpenCL maps global dimension 1 onto a grid dimension of at most 65535 blocks. */
#define MAX_BH_PER_LAUNCH 65535u

bool clattn__flash_supports(size_t head_dim_qk, size_t head_dim_v)
{
    return head_dim_qk >= 1 && head_dim_v >= 1 && head_dim_qk <= FLASH_MAX_HEAD_DIM &&
           head_dim_v <= FLASH_MAX_HEAD_DIM;
}

/* The rows of a head in the key parts' scratch log-sum-exp: batch * seq_q, or a packed
 * batch's total_q (its rows at their packed index). */
static size_t lse_rows(const clattn__score_shape *score)
{
    return score->varlen ? score->total_q : score->batch * score->seq_q;
}

static unsigned floor_pow2(size_t value, unsigned cap)
{
    unsigned v = 1;
    while (v * 2 <= cap && v * 2 <= value)
        v *= 2;
    return v;
}

/* Keys per launch where the device caps the loop iterations of a work-item in all
 * (tuning.loop_trip_limit, from the quirk rows in tuning/table.h): whole tiles whose loop trips,
 * counted as if no loop were unrolled, stay within half the limit. 0: all keys in one launch. */
static size_t keys_per_launch(const clattn_ctx *ctx, size_t dk, size_t dv, unsigned rows,
                              unsigned block_k, unsigned vw)
{
    const size_t limit = ctx->tuning.loop_trip_limit;
    if (limit == 0)
        return 0;
    const size_t qk_vecs = dk / vw, v_vecs = dv / vw;
    /* Per tile: staging K, V and the padding, scoring, rescaling, accumulating; outside: q,
     * acc (twice when resuming), output. */
    const size_t per_tile = (block_k * dk + rows - 1) / rows + (block_k * dv + rows - 1) / rows +
                            (block_k + rows - 1) / rows + block_k * (1 + qk_vecs) + v_vecs +
                            block_k * (1 + v_vecs) + 1;
    const size_t outside = qk_vecs + 3 * v_vecs;
    const size_t tiles = limit / 2 > outside + per_tile ? (limit / 2 - outside) / per_tile : 1;
    return tiles * block_k;
}

static bool float_dtype(clattn_dtype dtype)
{
    return dtype == CLATTN_DTYPE_F32 || dtype == CLATTN_DTYPE_F16 || dtype == CLATTN_DTYPE_BF16;
}

#define FC_KT 64         /* keys per tile in flash_cpu.cl */
#define FC_DIRECT_ROWS 8 /* flash_cpu.cl: at most this many query rows run as one block */

/* flash_cpu's loop trips per 64-key tile and outside the tiles, counted as if no loop were
 * unrolled (keys_per_launch's rule), for rb rows per block and nb blocks per group. */
static size_t cpu_trips_per_tile(const clattn__score_shape *score, size_t dk, size_t dv,
                                 unsigned rb, unsigned nb)
{
    const size_t dvv = (dv + 15) / 16, chunks = (dvv + 3) / 4;
    const size_t pack = dk * (1 + FC_KT) + FC_KT * (3 + dv + (dvv * 16 - dv));
    const size_t qk = 4 * rb + dk * (1 + rb);
    const size_t rule = (score->has_mask ? rb * (1 + FC_KT) + 8 * rb : 0) + 5 * rb + rb;
    const size_t softmax = rb * (1 + 4 + 4 + 4);
    const size_t pv = chunks * (10 * rb + FC_KT * (5 + 5 * rb));
    return pack + nb * (1 + qk + rule + softmax + pv) + 1;
}

/* Blocks per group at head sizes past 256 (MLA's 576 / 512: a decode group's 16-128 query heads
 * as rows of one latent head): packing a 64-key tile (transposing K, converting F16 and Q8_0
 * element by element) then costs more than the rows' arithmetic on it, so as few groups as
 * keep every compute unit busy, the rows split evenly among them (at most the tuning's nb;
 * the local-memory check below halves it where it does not fit). */
static unsigned wide_head_blocks(const clattn_ctx *ctx, const clattn__score_shape *score, size_t dk,
                                 unsigned rb, unsigned nb, unsigned tuned)
{
    const size_t bh = score->batch * score->heads, units = ctx->info.compute_units;
    if (dk <= 256 || ctx->tuning.loop_trip_limit || rb == 0 || bh >= units || units == 0)
        return nb;
    const size_t blocks = (score->seq_q + rb - 1) / rb;
    const size_t groups_per_bh = (units + bh - 1) / bh; /* groups per (batch, head) */
    const size_t even = (blocks + groups_per_bh - 1) / groups_per_bh;
    return even > nb ? (unsigned)(even < tuned ? even : tuned) : nb;
}

/* flash_cpu.cl's prefetch distance (FC_PF) for the shape: the tuning's, where the keys and
 * values come from memory: their bytes from flash_cpu_pf_min KiB (by default half the
 * device's global memory cache, PoCL's last-level cache); inside the cache the prefetches only
 * cost: head-major pages of 16 at 1k-2k keys (H = 8, d = 64: 4-8 MiB of a 32 MiB cache) ran at
 * 0.42-0.80x the contiguous step with them, 0.66-0.96x without (2-vCPU AMD EPYC). The kernel
 * prefetches paged tiles and tiles of rows a row or more apart only. */
static unsigned cpu_prefetch(const clattn__flash_shape *shape)
{
    const clattn__score_shape *score = &shape->score;
    /* (bytes a value: probe.c's storage sizes, per block of 32 for the block types) */
    const double per_value[2] = {(double)clattn__probe_bytes(shape->k_dtype, 32) / 32,
                                 (double)clattn__probe_bytes(shape->v_dtype, 32) / 32};
    const double kv_heads = (double)score->heads / (score->kv_group > 1 ? score->kv_group : 1);
    const double bytes =
        (double)score->batch * kv_heads * (double)score->seq_k *
        ((double)shape->head_dim_qk * per_value[0] + (double)shape->head_dim_v * per_value[1]);
    return bytes >= 1024.0 * shape->tuning->flash_cpu_pf_min ? shape->tuning->flash_cpu_pf : 0;
}

/* flash_cpu.cl for the shape, when the tuning asks for it and the device has the local memory;
 * plan->cpu stays false otherwise (flash.cl then). */
static clattn_status prepare_cpu(clattn_ctx *ctx, const clattn__flash_shape *shape,
                                 clattn__flash_plan *plan)
{
    const clattn__score_shape *score = &shape->score;
    const size_t dk = shape->head_dim_qk, dv = shape->head_dim_v, dvp = (dv + 15) / 16 * 16;
    if (!shape->tuning->flash_cpu || score->seq_k == 0 || score->seq_q == 0)
        return CLATTN_SUCCESS;
    /* Decode (a few query rows: one per head, or a decode group's heads): one block of exactly
     * those rows, and the tiles read in place (FC_DIRECT) where the head sizes are whole
     * float16 vectors. */
    const bool few_rows = score->seq_q <= FC_DIRECT_ROWS;
    const bool direct =
        few_rows && dk % 16 == 0 && dv % 16 == 0 && ctx->tuning.loop_trip_limit == 0;
    const unsigned rb = few_rows ? (unsigned)score->seq_q : shape->tuning->flash_cpu_rb;
    /* Under a loop limit one block per group keeps a tile's trips small. Else flash_cpu_nb
     * blocks share a key tile, fewer while that would leave under 4 groups per compute unit. */
    unsigned nb = ctx->tuning.loop_trip_limit || few_rows ? 1 : shape->tuning->flash_cpu_nb;
    const size_t bh = score->batch * score->heads;
    while (nb > 1 && (score->seq_q + (size_t)rb * nb - 1) / ((size_t)rb * nb) * bh <
                         4 * (size_t)ctx->info.compute_units)
        nb /= 2;
    nb = wide_head_blocks(ctx, score, dk, rb, nb, shape->tuning->flash_cpu_nb);
    const cl_ulong local_budget = ctx->info.local_mem_size > 16384 ? ctx->info.local_mem_size - 1024
                                                                   : ctx->info.local_mem_size;
    /* Two passes over a key tile's blocks (flash_cpu_tp: all their weights, then all their
     * P.V, so the tile's K and then its V stay in L1 while every block uses them; with one
     * block it is the same order) keep every block's weights: FC_KT floats a row, not a block's. */
    const bool two_pass = shape->tuning->flash_cpu_tp && !few_rows;
#define CPU_LOCAL(nb)                                                                              \
    (((cl_ulong)rb * (nb) * (dk + dvp + 2 + (two_pass && (nb) > 1 ? FC_KT : 0)) +                 \
      (cl_ulong)FC_KT * (rb + dk + dvp + 1)) *                                                     \
     sizeof(float))
    while (nb > 1 && CPU_LOCAL(nb) > local_budget)
        nb /= 2;
    if (CPU_LOCAL(nb) > local_budget)
        return clattn__flash_pass(plan,
                                  "flash_cpu: a %u-row block needs more than %llu bytes "
                                  "of local memory",
                                  rb, (unsigned long long)local_budget);
#undef CPU_LOCAL
    /* Keys in parts under a loop limit: whole tiles whose trips stay within half of it; a
     * shape whose one tile does not fit runs flash.cl (finer key tiles) instead. */
    const size_t tiles = (score->seq_k + FC_KT - 1) / FC_KT;
    const size_t limit = ctx->tuning.loop_trip_limit;
    const size_t outside = (size_t)rb * nb * (dk + 2 * dvp + 2 * dv + 4);
    const size_t per_tile = cpu_trips_per_tile(score, dk, dv, rb, nb);
    if (limit != 0 && limit / 2 <= outside + per_tile)
        return clattn__flash_pass(plan,
                                  "flash_cpu: one key tile exceeds the device's loop "
                                  "limit (%zu)",
                                  limit);
    const size_t part_tiles = limit == 0 ? tiles : (limit / 2 - outside) / per_tile;
    const flash_cpu_switches sw = {.HEAD_DIM_QK = (long)dk,
                                   .HEAD_DIM_V = (long)dv,
                                   .FC_NB = nb,
                                   .FC_RB = rb,
                                   .FC_KV = shape->tuning->flash_cpu_kv,
                                   .FC_DIRECT = direct,
                                   .Q_DTYPE = shape->q_dtype,
                                   .K_DTYPE = shape->k_dtype,
                                   .V_DTYPE = shape->v_dtype,
                                   .O_DTYPE = shape->out_dtype,
                                   /* a paged cache's rows prefetched (direct tiles only) */
                                   .FC_PF = direct ? cpu_prefetch(shape) : 0,
                                   .FC_TWO_PASS = two_pass && nb > 1};
    clattn_define defines[CLATTN_DEFINES_MAX];
    const size_t count = clattn__score_defines(score, flash_cpu_family.score_family, defines);
    clattn_status status = clattn__family_kernel(ctx, &flash_cpu_family, "flash_cpu", &sw, defines,
                                                 count, &plan->kernel);
    if (status != CLATTN_SUCCESS)
        return status;
    plan->cpu = true;
    plan->kv_step = score->kv_step; /* (one key part: keys_per_launch's limit cleared it) */
    plan->key_tile = FC_KT;
    plan->tile_rows = rb;
    plan->block_q = rb * nb;
    char tail[48];
    snprintf(tail, sizeof tail, "%d-key tiles%s", FC_KT, direct ? ", read in place" : "");
    clattn__family_describe(&flash_cpu_family, &sw, tail, plan->variant, sizeof plan->variant);
    plan->part_keys = part_tiles >= tiles ? score->seq_k : part_tiles * FC_KT;
    plan->kv_step = plan->kv_step && plan->part_keys == score->seq_k;
    size_t lse_floats = 0;
    if (plan->part_keys < score->seq_k && !shape->has_lse &&
        !clattn__product(&lse_floats, 2, score->heads, lse_rows(score)))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                            "flash_attention: log-sum-exp scratch overflows size_t");
    plan->scratch_floats = lse_floats;
    return CLATTN_SUCCESS;
}

/* The kernel variant for the shape: BLOCK_K from the local memory the K and V tiles need,
 * BLOCK_Q from the work-group size, shrunk while the compiled kernel cannot run that many
 * work-items (register pressure at large head sizes). */
static clattn_status prepare_kernel(clattn_ctx *ctx, const clattn__flash_shape *shape,
                                    clattn__flash_plan *plan)
{
    static const char op[] = "flash_attention";
    memset(plan, 0, sizeof *plan);
    plan->shape = *shape;
    const size_t dk = shape->head_dim_qk, dv = shape->head_dim_v;
    const clattn__score_shape *score = &shape->score;
    if (!clattn__flash_supports(dk, dv))
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: head_dim_qk=%zu, head_dim_v=%zu: the fused kernel takes head "
                            "sizes 1 to %d",
                            op, dk, dv, FLASH_MAX_HEAD_DIM);
    /* k and v may be blocks (Q8_0, Q4_0) or FP8: types.cl's loads dequantize them */
    const bool k_ok = float_dtype(shape->k_dtype) || ((1u << shape->k_dtype) & CLATTN__QUANT);
    const bool v_ok = float_dtype(shape->v_dtype) || ((1u << shape->v_dtype) & CLATTN__QUANT);
    if (!float_dtype(shape->q_dtype) || !k_ok || !v_ok || !float_dtype(shape->out_dtype))
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: q and out must be F32, F16 or BF16, k and v those or Q8_0, "
                            "Q4_0, FP8_E4M3, FP8_E5M2",
                            op);
    if (score->has_mask && (unsigned)score->mask_dtype > CLATTN_DTYPE_U8)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: mask dtype %d is unknown", op,
                            (int)score->mask_dtype);
    /* Additive scores run in flash.cl's ADDITIVE variant only. */
    clattn_status cpu_status =
        !score->additive ? prepare_cpu(ctx, shape, plan)
        : shape->tuning->flash_cpu || shape->tuning->flash_gpu
            ? clattn__flash_pass(plan, "additive scores run in flash.cl's ADDITIVE variant")
            : CLATTN_SUCCESS;
    if (cpu_status != CLATTN_SUCCESS || plan->cpu)
        return cpu_status;
    if (shape->tuning->flash_gpu && !score->additive) {
        const clattn_status status = clattn__flash_gpu_prepare(ctx, shape, plan);
        if (status != CLATTN_SUCCESS)
            return status;
        if (plan->kernel != NULL)
            goto key_parts; /* flash_gpu.cl set block_q, group_items and part_keys */
    }

    const cl_ulong local_budget = ctx->info.local_mem_size > 16384 ? ctx->info.local_mem_size - 1024
                                                                   : ctx->info.local_mem_size;
    const cl_ulong tile_budget = local_budget < 32768 ? local_budget : 32768;
    unsigned block_k = 32;
    /* per key: its K and V rows, its padding byte; the additive variant adds exp(2 K) */
    const size_t key_floats = (score->additive ? 2 * dk : dk) + dv;
    while (block_k > 1 && (cl_ulong)block_k * (key_floats * sizeof(float) + 1) > tile_budget)
        block_k /= 2;
    const size_t max_1d = ctx->info.max_work_group_size < ctx->info.max_item_sizes[0]
                              ? ctx->info.max_work_group_size
                              : ctx->info.max_item_sizes[0];
    /* Rows per group and the vector width along a row are upper bounds from the tuning
     * table (CPUs: 64 rows, 8-float vectors; GPUs: 64 rows, scalars, a work-item being one
     * SIMD lane); the width shrinks to one that divides both head sizes. */
    unsigned rows = floor_pow2(max_1d, shape->tuning->flash_rows);
    unsigned vw = shape->tuning->flash_vw >= 8 ? 8 : shape->tuning->flash_vw >= 4 ? 4 : 1;
    if (vw == 8 && (dk % 8 != 0 || dv % 8 != 0))
        vw = 4;
    if (vw == 4 && (dk % 4 != 0 || dv % 4 != 0))
        vw = 1;
    clattn_define defines[CLATTN_DEFINES_MAX];
    const size_t count = clattn__score_defines(score, flash_family.score_family, defines);
    for (;;) {
        const flash_switches sw = {.HEAD_DIM_QK = (long)dk,
                                   .HEAD_DIM_V = (long)dv,
                                   .BLOCK_Q = rows,
                                   .BLOCK_K = block_k,
                                   .FLASH_VW = vw,
                                   .Q_DTYPE = shape->q_dtype,
                                   .K_DTYPE = shape->k_dtype,
                                   .V_DTYPE = shape->v_dtype,
                                   .O_DTYPE = shape->out_dtype,
                                   .ADDITIVE = score->additive};
        cl_kernel kernel = NULL;
        const clattn_status status =
            clattn__family_fits(ctx, &flash_family, op, &sw, defines, count, rows, &kernel);
        if (status != CLATTN_SUCCESS)
            return status;
        if (kernel != NULL) {
            plan->kernel = kernel;
            plan->key_tile = block_k;
            plan->tile_rows = rows;
            plan->block_q = rows;
            plan->group_items = rows;
            clattn__family_describe(&flash_family, &sw, NULL, plan->variant, sizeof plan->variant);
            break;
        }
        if (rows == 1)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: the device runs no work-group of this kernel (head sizes "
                                "%zu, %zu)",
                                op, dk, dv);
        rows /= 2;
    }
    /* Keys in parts (devices with a loop limit): each launch resumes from the output and
     * log-sum-exp of the one before, kept in the caller's lse or in scratch. */
    const size_t part_keys = keys_per_launch(ctx, dk, dv, plan->block_q, block_k, vw);
    plan->part_keys = part_keys == 0 || part_keys > score->seq_k ? score->seq_k : part_keys;
key_parts:
    if (plan->part_keys < score->seq_k && !shape->has_lse &&
        !clattn__product(&plan->scratch_floats, 2, score->heads, lse_rows(score)))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: log-sum-exp scratch overflows size_t",
                            op);
    return CLATTN_SUCCESS;
}

/* Decode splits: how many, where the fused kernel would leave the device idle (fewer row
 * blocks x heads than twice its compute units) and the keys are many (tuning.decode_keys per
 * split at least; 0: never). Whole key tiles per split, at most 64 splits. */
static void choose_splits(const clattn_ctx *ctx, const clattn__flash_plan *plan, unsigned *splits,
                          size_t *split_keys)
{
    const clattn__score_shape *score = &plan->shape.score;
    *splits = 1;
    *split_keys = 0;
    const size_t min_keys = plan->shape.tuning->decode_keys;
    /* (not for packed sequences: flash_merge writes padded rows) */
    if (min_keys == 0 || plan->part_keys < score->seq_k || plan->key_tile == 0 || score->varlen)
        return;
    const size_t groups =
        (score->seq_q + plan->block_q - 1) / plan->block_q * score->batch * score->heads;
    const size_t target = 2 * (size_t)ctx->info.compute_units;
    if (groups >= target || score->seq_k < 2 * min_keys)
        return;
    size_t want = (target + groups - 1) / groups;
    const size_t most = score->seq_k / min_keys;
    if (want > most)
        want = most;
    if (want > 64)
        want = 64;
    size_t keys = (score->seq_k + want - 1) / want;
    keys = (keys + plan->key_tile - 1) / plan->key_tile * plan->key_tile;
    const size_t count = (score->seq_k + keys - 1) / keys;
    if (count < 2)
        return;
    *splits = (unsigned)count;
    *split_keys = keys;
}

static clattn_status prepare_once(clattn_ctx *ctx, const clattn__flash_shape *shape,
                                  clattn__flash_plan *plan)
{
    clattn_status status = prepare_kernel(ctx, shape, plan);
    if (status != CLATTN_SUCCESS)
        return status;
    plan->splits = 1;
    unsigned splits = 1;
    size_t split_keys = 0;
    choose_splits(ctx, plan, &splits, &split_keys);
    if (splits < 2)
        return CLATTN_SUCCESS;
    /* The splits write float32 partial outputs and their log-sum-exps: the kernel built for
     * an F32 output (the same but for out's dtype), then flash_merge for the real one. */
    clattn__flash_shape inner = *shape;
    inner.out_dtype = CLATTN_DTYPE_F32;
    inner.has_lse = true;
    clattn__flash_plan split_plan;
    if ((status = prepare_kernel(ctx, &inner, &split_plan)))
        return status;
    if (split_plan.part_keys < shape->score.seq_k || split_plan.key_tile != plan->key_tile)
        return CLATTN_SUCCESS; /* another kernel for F32: keep the plan without splits */
    const clattn__score_shape *score = &shape->score;
    size_t rows = 0, floats = 0;
    if (!clattn__product(&rows, 3, score->batch, score->heads, score->seq_q) ||
        !clattn__product(&floats, 3, (size_t)splits, rows, shape->head_dim_v + 1))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                            "flash_attention: the decode splits' scratch overflows size_t");
    plan->kernel = split_plan.kernel;
    plan->splits = splits;
    plan->split_keys = split_keys;
    plan->scratch_floats = floats;
    plan->merge_local = ctx->tuning.heads_wg;
    if (!clattn__round_up(rows * shape->head_dim_v, plan->merge_local, &plan->merge_global))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "flash_merge: rows overflow size_t");
    const flash_merge_switches sw = {.HEADS_WG = ctx->tuning.heads_wg, .O_DTYPE = shape->out_dtype};
    return clattn__family_kernel(ctx, &flash_merge_family, "flash_merge", &sw, NULL, 0,
                                 &plan->merge);
}

clattn_status clattn__flash_prepare(clattn_ctx *ctx, const clattn__flash_shape *shape,
                                    clattn__flash_plan *plan)
{
    /* Self-validation's ladder (core/validate.h): the tuning's preferred variant (flash_cpu.cl,
     * flash_gpu.cl), else flash.cl, each only once its probe passed on this device. */
    clattn_tuning tuning = *shape->tuning;
    clattn__flash_shape attempt = *shape;
    attempt.tuning = &tuning;
    char passed[sizeof plan->passed] = "";
    for (;;) {
        clattn_status status = prepare_once(ctx, &attempt, plan);
        const bool cpu = plan->cpu;
        if (status == CLATTN_SUCCESS)
            status = clattn__flash_trust(ctx, plan);
        plan->shape.tuning = shape->tuning;
        if (status == CLATTN_SUCCESS) {
            if (passed[0])
                snprintf(plan->passed, sizeof plan->passed, "%s", passed);
            return CLATTN_SUCCESS;
        }
        if (!(tuning.flash_cpu || tuning.flash_gpu) || !clattn__variant_fallible(status))
            return status;
        snprintf(passed, sizeof passed, "%s failed on this device (%s)",
                 tuning.flash_cpu && cpu ? "flash_cpu.cl" : "flash_gpu.cl",
                 clattn_status_string(status));
        tuning.flash_cpu = tuning.flash_gpu = 0;
    }
}

/* flash_merge over the decode splits in scratch: out and, when the plan has it, lse. */
static clattn_status merge_splits(clattn_chain *chain, const clattn__flash_plan *plan,
                                  clattn__scratch scratch, cl_ulong rows, const clattn__view *out,
                                  const clattn__view *lse, const clattn__score_masks *masks)
{
    const clattn__score_shape *score = &plan->shape.score;
    const bool has_lse = plan->shape.has_lse;
    clattn_merge_params params = {0};
    params.rows = rows;
    params.splits = plan->splits;
    params.dv = (cl_uint)plan->shape.head_dim_v;
    params.heads = (cl_uint)score->heads;
    params.seq_q = (cl_uint)score->seq_q;
    /* The parts as sub-buffers would need alignment; the kernel takes element offsets. */
    params.o_parts_at = scratch.offset;
    params.lse_parts_at = scratch.offset + (cl_ulong)params.splits * rows * params.dv;
    CLATTN__VIEW_FIELDS(out, params, o);
    params.has_lse = has_lse;
    if (has_lse) { /* lse: (1, b, h, row) */
        params.lse_offset = lse->offset;
        params.lse_s0 = lse->strides[1];
        params.lse_s1 = lse->strides[2];
        params.lse_s2 = lse->strides[3];
    }
    params.has_sinks = score->has_sinks; /* the splits left them out: they join here */
    if (score->has_sinks) {
        params.sinks_offset = masks->sinks.offset;
        params.sinks_s0 = masks->sinks.strides[2];
        params.sinks_s1 = masks->sinks.strides[3];
    }
    const cl_mem lse_mem = has_lse ? lse->mem : out->mem;
    const cl_mem sinks_mem = score->has_sinks ? masks->sinks.mem : out->mem;
    const clattn_arg args[] = {CLATTN_ARG(scratch.mem), CLATTN_ARG(scratch.mem),
                               CLATTN_ARG(out->mem),    CLATTN_ARG(lse_mem),
                               CLATTN_ARG(sinks_mem),   CLATTN_ARG(params)};
    return clattn__launch_kernel(chain, plan->merge, "flash_merge", args,
                                 sizeof args / sizeof args[0], 1, &plan->merge_global,
                                 &plan->merge_local);
}

/* A decode step's launch (flash_cpu.cl's KV_STEP): the new rows in the slots of varlen's
 * offsets, seq_k = the keys after the step and no key counts read (the kernel sets them). */
static void step_fields(const clattn__kv_step *step, clattn_flash_params *params,
                        clattn__score_buffers *buffers, cl_mem *k_new, cl_mem *v_new)
{
    params->kv_step = 1;
    params->step_keys = (cl_uint)step->keys;
    params->kn_offset = step->k_new.offset;
    params->kn_s0 = step->k_new.strides[0];
    params->kn_s1 = step->k_new.strides[1];
    params->kn_s3 = step->k_new.strides[3];
    params->vn_offset = step->v_new.offset;
    params->vn_s0 = step->v_new.strides[0];
    params->vn_s1 = step->v_new.strides[1];
    params->vn_s3 = step->v_new.strides[3];
    params->score.seq_k = (cl_uint)(step->keys + 1);
    params->score.has_kv_len = 0;
    params->score.kv_len_offset = 0;
    params->score.kv_len_s0 = 1;
    buffers->kv_len = step->lengths;
    *k_new = step->k_new.mem;
    *v_new = step->v_new.mem;
}

clattn_status clattn__flash_enqueue(clattn_chain *chain, const clattn__flash_plan *plan,
                                    const clattn__view *q, const clattn__view *k,
                                    const clattn__view *v, const clattn__view *out,
                                    const clattn__view *lse, const clattn__score_masks *masks,
                                    clattn__scratch scratch)
{
    const clattn__score_shape *score = &plan->shape.score;
    const size_t parts = (score->seq_k + plan->part_keys - 1) / plan->part_keys;
    const bool split = plan->splits > 1;
    const cl_ulong rows = (cl_ulong)score->batch * score->heads * score->seq_q;
    /* Decode splits: partial outputs (splits, B, H, Lq, dv) and lse (splits, B, H, Lq) packed
     * float32 in scratch, for flash_merge. */
    const cl_uint split_keys = (cl_uint)plan->split_keys;
    const cl_ulong o_split = split ? rows * plan->shape.head_dim_v : 0;
    const cl_ulong lse_split = split ? rows : 0;
    const clattn__view *final_out = out;
    clattn__view parts_out = *out;
    if (split) {
        const size_t dv = plan->shape.head_dim_v;
        parts_out.mem = scratch.mem;
        parts_out.offset = scratch.offset;
        parts_out.dtype = CLATTN_DTYPE_F32;
        parts_out.strides[0] = score->heads * score->seq_q * dv;
        parts_out.strides[1] = score->seq_q * dv;
        parts_out.strides[2] = dv;
        parts_out.strides[3] = 1;
        out = &parts_out;
    }
    /* Without the caller's lse, several key parts keep theirs in scratch, packed (B, H, Lq). */
    const bool own_lse = plan->shape.has_lse && !split;
    const cl_int has_lse = own_lse || parts > 1 || split;
    cl_mem lse_mem = own_lse ? lse->mem : parts > 1 || split ? scratch.mem : out->mem;
    const cl_ulong lse_offset = own_lse     ? lse->offset
                                : split     ? scratch.offset + (cl_ulong)plan->splits * o_split
                                : parts > 1 ? scratch.offset
                                            : 0;
    /* (packed sequences: the scratch lse is (heads, total_q), rows at their packed index) */
    const size_t scratch_rows = score->varlen ? score->total_q : score->seq_q;
    const cl_ulong lse_s0 = own_lse         ? lse->strides[1]
                            : score->varlen ? 0
                                            : score->heads * score->seq_q;
    const cl_ulong lse_s1 = own_lse ? lse->strides[2] : scratch_rows;
    const cl_ulong lse_s2 = own_lse ? lse->strides[3] : 1;
    clattn_flash_params params;
    memset(&params, 0, sizeof params);
    clattn__score_buffers buffers;
    clattn__score_params(score, masks, q->mem, &params.score, &buffers);
    CLATTN__VIEW_FIELDS(q, params, q);
    CLATTN__VIEW_FIELDS(k, params, k);
    CLATTN__VIEW_FIELDS(v, params, v);
    CLATTN__VIEW_FIELDS(out, params, o);
    params.lse_offset = lse_offset;
    params.lse_s0 = lse_s0;
    params.lse_s1 = lse_s1;
    params.lse_s2 = lse_s2;
    params.o_split = o_split;
    params.lse_split = lse_split;
    params.w_offset = score->additive ? masks->additive_w.offset : 0;
    params.w_s0 = score->additive ? masks->additive_w.strides[2] : 0;
    params.w_s1 = score->additive ? masks->additive_w.strides[3] : 0;
    params.has_lse = has_lse;
    params.kv_group = score->kv_group > 1 ? (cl_uint)score->kv_group : 1u;
    params.split_keys = split_keys;
    params.v_scale = score->v_scale > 0.0f ? score->v_scale : 1.0f; /* FP8 v (score.v_scale) */
    if (score->kv_paged) { /* the block table's (b, block) strides, the pages' */
        const clattn__view *table = &masks->paging.block_table;
        params.bt_offset = table->offset;
        params.bt_s0 = table->strides[2];
        params.bt_s1 = table->strides[3];
        params.k_page = masks->paging.k_page;
        params.v_page = masks->paging.v_page;
        params.page_size = (cl_uint)masks->paging.page_size;
        params.num_pages = (cl_uint)masks->paging.num_pages;
    }
    const cl_mem block_table = score->kv_paged ? masks->paging.block_table.mem : q->mem;
    cl_mem cu_q = score->varlen ? masks->varlen.cu_q : q->mem;
    /* (packed queries over a paged cache have no cu_seqlens_k: q's buffer, unread) */
    cl_mem cu_k = score->varlen && masks->varlen.cu_k ? masks->varlen.cu_k : q->mem;
    if (plan->kv_step && masks->step.on)
        step_fields(&masks->step, &params, &buffers, &cu_q, &cu_k);
    if (score->varlen) { /* packed sequences: their offsets and totals */
        params.cu_q_offset = masks->varlen.q_offset;
        params.cu_k_offset = masks->varlen.k_offset;
        params.total_q = (cl_uint)score->total_q;
        params.total_k = (cl_uint)score->total_k;
    }
    const cl_mem score_w = score->additive ? masks->additive_w.mem : q->mem;
    /* Packed queries over a paged cache (score.cl's PACKED_GRID): the row blocks of all
     * sequences in dimension 0 (total_q / block_q + batch of them), the heads in dimension 1. */
    const bool packed_grid = score->varlen && score->kv_paged;
    params.packed_batch = packed_grid ? (cl_uint)score->batch : 0u;
    const size_t bh_total = packed_grid ? score->heads : score->batch * score->heads;
    /* flash_cpu.cl: one work-item per group, the masks' presence, whether the band has a
     * diagonal edge and the normalisation compiled in (so not arguments); flash.cl and
     * flash_gpu.cl: group_items. */
    const size_t items = plan->cpu ? 1 : plan->group_items;
    const size_t local[3] = {items, 1, 1};
    const size_t row_blocks = packed_grid ? score->total_q / plan->block_q + score->batch
                                          : (score->seq_q + plan->block_q - 1) / plan->block_q;
    size_t global[3] = {row_blocks * items, 1, plan->splits};
    const char *name = plan->cpu ? "flash_cpu" : "flash_attention";

    clattn_status status = CLATTN_SUCCESS;
    const size_t bh_parts = (bh_total + MAX_BH_PER_LAUNCH - 1) / MAX_BH_PER_LAUNCH;
    for (size_t launch = 0; launch < parts * bh_parts && status == CLATTN_SUCCESS; ++launch) {
        const size_t first = (launch % bh_parts) * MAX_BH_PER_LAUNCH;
        params.bh_base = first;
        params.part_begin = (cl_uint)((launch / bh_parts) * plan->part_keys);
        params.part_stop = (cl_uint)(score->seq_k - params.part_begin < plan->part_keys
                                         ? score->seq_k
                                         : params.part_begin + plan->part_keys);
        params.resume = params.part_begin > 0; /* a later part: from the one before */
        /* Attention sinks join a row once: in its first key part (later ones resume from an
         * lse that holds them), or in flash_merge after decode splits. */
        params.score.has_sinks = score->has_sinks && !params.resume && !split;
        const clattn_arg args[] = {CLATTN_ARG(q->mem),
                                   CLATTN_ARG(k->mem),
                                   CLATTN_ARG(v->mem),
                                   CLATTN_ARG(out->mem),
                                   CLATTN_ARG(lse_mem),
                                   CLATTN_ARG(buffers.mask),
                                   CLATTN_ARG(buffers.key_padding),
                                   CLATTN_ARG(buffers.kv_len),
                                   CLATTN_ARG(buffers.alibi),
                                   CLATTN_ARG(buffers.sinks),
                                   CLATTN_ARG(buffers.flex),
                                   CLATTN_ARG(score_w),
                                   CLATTN_ARG(block_table),
                                   CLATTN_ARG(cu_q),
                                   CLATTN_ARG(cu_k),
                                   CLATTN_ARG(params)};
        const cl_uint n = sizeof args / sizeof args[0];
        global[1] = bh_total - first < MAX_BH_PER_LAUNCH ? bh_total - first : MAX_BH_PER_LAUNCH;
        status = clattn__launch_kernel(chain, plan->kernel, name, args, n, 3, global, local);
    }
    if (split && status == CLATTN_SUCCESS) {
        /* flash_merge: the splits into out (and the caller's lse) */
        status = merge_splits(chain, plan, scratch, rows, final_out, lse, masks);
    }
    return status;
}

/* ---- flash attention ----------------------------------------------------------------------- */

/* The plan on the probe's sizes: its kernels, tiles and splits as prepared. */
static void probe_flash_plan(const clattn__flash_plan *prepared, clattn__flash_plan *run)
{
    *run = *prepared;
    clattn__score_shape *s = &run->shape.score;
    s->v_scale = 1.0f; /* FP8 v's scale: the reference takes the codes' values */
    /* (the query group is a launch argument too: at most 4 query heads a k/v head) */
    const size_t group = s->kv_group > 1 ? s->kv_group : 1;
    s->batch = clattn__probe_at_most(s->batch, 2);
    s->kv_group = group > 1 ? clattn__probe_at_most(group, 4) : s->kv_group;
    s->heads = clattn__probe_at_most(s->heads / group, 2) * clattn__probe_at_most(group, 4);
    s->seq_q = s->seq_q <= 8 ? s->seq_q : clattn__probe_at_most(s->seq_q, 19);
    /* Key parts and decode splits are launch arguments: one tile each here, so that a few
     * tiles (however long the plan's parts and splits) exercise them. */
    const bool parts = prepared->part_keys < prepared->shape.score.seq_k;
    s->seq_k = clattn__probe_at_most(s->seq_k, 2 * (size_t)prepared->key_tile + 13);
    run->part_keys = parts ? prepared->key_tile : s->seq_k;
    const size_t rows = s->batch * s->heads * s->seq_q;
    if (prepared->splits > 1) {
        run->split_keys = prepared->key_tile;
        run->splits = (unsigned)((s->seq_k + run->split_keys - 1) / run->split_keys);
        run->scratch_floats = run->splits * rows * (run->shape.head_dim_v + 1);
        const size_t items = rows * run->shape.head_dim_v;
        run->merge_global = (items + run->merge_local - 1) / run->merge_local * run->merge_local;
    } else {
        run->scratch_floats = run->part_keys < s->seq_k ? rows : 0;
    }
}

typedef struct flash_host {
    double *q, *k, *v, *out, *lse, *raw, *w;
} flash_host;

static void free_flash_host(flash_host *h)
{
    free(h->q);
    free(h->k);
    free(h->v);
    free(h->out);
    free(h->lse);
    free(h->raw);
    free(h->w);
}

/* k or v drawn as (batch, kv_heads, seq_k, d) values; on the device packed, or in a pool of
 * pages (pages, page_size, kv_heads, d) at the table's pages. */
static clattn_status upload_keys(clattn_ctx *ctx, clattn__probe_mem *pm, clattn_dtype dtype,
                                 const double *x, const clattn__score_shape *s, size_t kv_heads,
                                 size_t d, const clattn__probe_scores *ps, clattn__view *view)
{
    const size_t per_batch = kv_heads * s->seq_k * d;
    size_t count = s->batch * per_batch;
    double *laid = NULL;
    if (ps->table) { /* the pool: each (page, slot, head) row from its key, zeros elsewhere */
        count = ps->num_pages * ps->page_size * kv_heads * d;
        laid = calloc(count, sizeof(double));
        if (laid == NULL)
            return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        for (size_t b = 0; b < s->batch; ++b)
            for (size_t j = 0; j < s->seq_k; ++j) {
                const int page = ps->table[b * ps->blocks + j / ps->page_size];
                if (page < 0 || (size_t)page >= ps->num_pages)
                    continue;
                for (size_t h = 0; h < kv_heads; ++h)
                    memcpy(laid +
                               (((size_t)page * ps->page_size + j % ps->page_size) * kv_heads + h) *
                                   d,
                           x + ((b * kv_heads + h) * s->seq_k + j) * d, d * sizeof(double));
            }
    }
    unsigned char *bytes = malloc(clattn__probe_bytes(dtype, count) + 4);
    if (bytes == NULL) {
        free(laid);
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
    }
    clattn__probe_encode(dtype, laid ? laid : x, count, bytes);
    cl_mem mem = NULL;
    const clattn_status status =
        clattn__probe_upload(ctx, pm, bytes, clattn__probe_bytes(dtype, count), &mem);
    free(bytes);
    free(laid);
    if (status)
        return status;
    *view = clattn__probe_view(mem, dtype, s->batch, kv_heads, s->seq_k, d);
    if (ps->table) { /* sdpa.c's paged views: batch stride 0, the slot stride per key */
        view->strides[0] = 0;
        view->strides[1] = d;
        view->strides[2] = kv_heads * d;
    }
    return CLATTN_SUCCESS;
}

/* The paged pool's table: 7-key pages, a random page per block; past each sequence's keys an
 * index outside the pool (never read), and in the second sequence one inside its keys too
 * (its keys end there). */
static clattn_status draw_table(clattn_ctx *ctx, clattn__probe_rng *rng,
                                const clattn__score_shape *s, clattn__probe_mem *pm,
                                clattn__probe_inputs *in, clattn__score_masks *masks)
{
    clattn__probe_scores *ps = &in->scores;
    ps->page_size = 7;
    ps->blocks = (s->seq_k + ps->page_size - 1) / ps->page_size;
    ps->num_pages = s->batch * ps->blocks + 2;
    in->table = malloc(s->batch * ps->blocks * sizeof(int));
    if (in->table == NULL)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
    for (size_t b = 0; b < s->batch; ++b) {
        const size_t keys = in->kv_len ? (size_t)in->kv_len[b] : s->seq_k;
        const size_t used = (keys + ps->page_size - 1) / ps->page_size;
        for (size_t blk = 0; blk < ps->blocks; ++blk) /* pages in reverse: not the identity */
            in->table[b * ps->blocks + blk] =
                blk < used ? (int)(ps->num_pages - 1 - (b * ps->blocks + blk))
                           : (clattn__probe_next(rng) % 2 ? -1 : (int)ps->num_pages + 3);
        if (b == 1 && used >= 3)
            in->table[b * ps->blocks + 1] = (int)ps->num_pages + 9;
    }
    ps->table = in->table;
    cl_mem mem = NULL;
    const clattn_status status =
        clattn__probe_upload(ctx, pm, in->table, s->batch * ps->blocks * sizeof(int), &mem);
    if (status)
        return status;
    masks->paging.block_table =
        clattn__probe_view(mem, CLATTN_DTYPE_F32, 1, 1, s->batch, ps->blocks);
    masks->paging.page_size = ps->page_size;
    masks->paging.num_pages = ps->num_pages;
    return CLATTN_SUCCESS;
}

static const char *flash_unprobed(const clattn__score_shape *s)
{
    return s->varlen     ? "packed sequences (cu_seqlens)"
           : s->flex_id  ? "user score functions (flex)"
           : s->dropout  ? "dropout"
           : s->additive ? "additive scores"
                         : NULL;
}

static clattn_status run_flash_probe(clattn_ctx *ctx, const clattn__flash_plan *run,
                                     clattn__probe_mem *pm, flash_host *host,
                                     clattn__probe_inputs *in, clattn__probe_result *r)
{
    const clattn__flash_shape *shape = &run->shape;
    const clattn__score_shape *s = &shape->score;
    const size_t group = s->kv_group > 1 ? s->kv_group : 1, kv_heads = s->heads / group;
    const size_t dk = shape->head_dim_qk, dv = shape->head_dim_v;
    const size_t rows = s->batch * s->heads * s->seq_q;
    const size_t nq = rows * dk, nk = s->batch * kv_heads * s->seq_k * dk;
    const size_t nv = s->batch * kv_heads * s->seq_k * dv, no = rows * dv;
    clattn__probe_rng rng = {0x5eed0000ULL + dk * 131 + s->seq_k};
    host->q = malloc(nq * sizeof(double));
    host->k = malloc(nk * sizeof(double));
    host->v = malloc(nv * sizeof(double));
    host->out = malloc(no * sizeof(double));
    host->lse = malloc(rows * sizeof(double));
    host->raw = malloc(s->seq_k * sizeof(double));
    host->w = malloc(s->seq_k * sizeof(double));
    unsigned char *got = malloc(clattn__probe_bytes(CLATTN_DTYPE_F32, no > rows ? no : rows) + 4);
    clattn_status status = CLATTN_SUCCESS;
    if (!host->q || !host->k || !host->v || !host->out || !host->lse || !host->raw || !host->w ||
        !got) {
        free(got);
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
    }
    for (size_t i = 0; i < nq; ++i)
        host->q[i] = clattn__probe_grid(&rng, shape->q_dtype);
    for (size_t i = 0; i < nk; ++i)
        host->k[i] = clattn__probe_grid(&rng, shape->k_dtype);
    for (size_t i = 0; i < nv; ++i)
        host->v[i] = clattn__probe_grid(&rng, shape->v_dtype);
    clattn__score_masks masks;
    clattn__view q, k, v, out, lse = {0};
    cl_mem mem = NULL, scratch = NULL;
    unsigned char *bytes = malloc(clattn__probe_bytes(CLATTN_DTYPE_F32, nq) + 4);
    if (bytes == NULL) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    clattn__probe_encode(shape->q_dtype, host->q, nq, bytes);
    if ((status = clattn__probe_draw_modifiers(ctx, &rng, s, pm, in, &masks)) ||
        (s->kv_paged && (status = draw_table(ctx, &rng, s, pm, in, &masks))) ||
        (status =
             clattn__probe_upload(ctx, pm, bytes, clattn__probe_bytes(shape->q_dtype, nq), &mem)))
        goto done;
    q = clattn__probe_view(mem, shape->q_dtype, s->batch, s->heads, s->seq_q, dk);
    if ((status =
             upload_keys(ctx, pm, shape->k_dtype, host->k, s, kv_heads, dk, &in->scores, &k)) ||
        (status =
             upload_keys(ctx, pm, shape->v_dtype, host->v, s, kv_heads, dv, &in->scores, &v)) ||
        (status =
             clattn__probe_upload(ctx, pm, NULL, clattn__probe_bytes(shape->out_dtype, no), &mem)))
        goto done;
    out = clattn__probe_view(mem, shape->out_dtype, s->batch, s->heads, s->seq_q, dv);
    if (s->kv_paged) {
        masks.paging.k_page = masks.paging.page_size * kv_heads * dk;
        masks.paging.v_page = masks.paging.page_size * kv_heads * dv;
    }
    if (shape->has_lse) {
        if ((status = clattn__probe_upload(ctx, pm, NULL, rows * sizeof(float), &mem)))
            goto done;
        lse = clattn__probe_view(mem, CLATTN_DTYPE_F32, 1, s->batch, s->heads, s->seq_q);
    }
    if ((status =
             clattn__probe_upload(ctx, pm, NULL, run->scratch_floats * sizeof(float), &scratch)))
        goto done;
    clattn_chain chain = clattn__probe_chain(ctx);
    status = clattn__flash_enqueue(&chain, run, &q, &k, &v, &out, &lse, &masks,
                                   (clattn__scratch){scratch, 0});
    if (status == CLATTN_SUCCESS)
        status =
            clattn__probe_download(&chain, out.mem, clattn__probe_bytes(shape->out_dtype, no), got);
    /* the reference, while the device works */
    for (size_t b = 0; b < s->batch; ++b)
        for (size_t h = 0; h < s->heads; ++h)
            for (size_t i = 0; i < s->seq_q; ++i) {
                const size_t row = (b * s->heads + h) * s->seq_q + i;
                const double *qi = host->q + row * dk;
                const size_t kv = b * kv_heads + h / group;
                for (size_t j = 0; j < s->seq_k; ++j) {
                    const double *kj = host->k + (kv * s->seq_k + j) * dk;
                    double dot = 0.0;
                    for (size_t c = 0; c < dk; ++c)
                        dot += qi[c] * kj[c];
                    host->raw[j] = dot;
                }
                clattn__probe_reference_row(&in->scores, b, h, i, host->raw, host->w,
                                            &host->lse[row], NULL);
                for (size_t c = 0; c < dv; ++c) {
                    double acc = 0.0;
                    for (size_t j = 0; j < s->seq_k; ++j)
                        acc += host->w[j] * host->v[(kv * s->seq_k + j) * dv + c];
                    host->out[row * dv + c] = acc;
                }
            }
    if (status == CLATTN_SUCCESS) {
        size_t where = 0;
        r->tolerance = clattn__probe_tolerance(shape->out_dtype);
        r->max_error = clattn__probe_max_error(shape->out_dtype, got, host->out, no, &where);
        snprintf(r->why, sizeof r->why, "out[%zu] of (%zu, %zu, %zu, %zu)", where, s->batch,
                 s->heads, s->seq_q, dv);
    }
    if (status == CLATTN_SUCCESS && shape->has_lse && s->norm == CLATTN_NORM_SOFTMAX &&
        (status = clattn__probe_download(&chain, lse.mem, rows * sizeof(float), got)) ==
            CLATTN_SUCCESS) {
        for (size_t i = 0; i < rows; ++i) { /* (rows that keep nothing: -inf, not compared) */
            const double g = clattn__probe_decode(CLATTN_DTYPE_F32, got, i);
            const double e = !isfinite(host->lse[i]) ? 0.0
                             : isnan(g)              ? INFINITY
                                                     : fabs(g - host->lse[i]);
            if (e > r->max_error && e > r->tolerance) {
                r->max_error = e;
                snprintf(r->why, sizeof r->why, "lse[%zu] of %zu rows", i, rows);
            }
        }
    }
    clattn__chain_push(&chain, NULL);
done:
    free(bytes);
    free(got);
    return status;
}

static clattn_status flash_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const clattn__flash_plan *prepared = unit;
    const char *unprobed = flash_unprobed(&prepared->shape.score);
    if (unprobed) {
        r->checked = false;
        snprintf(r->why, sizeof r->why, "%s", unprobed);
        return CLATTN_SUCCESS;
    }
    clattn__flash_plan run;
    probe_flash_plan(prepared, &run);
    clattn__probe_mem pm = {.count = 0};
    flash_host host;
    memset(&host, 0, sizeof host);
    clattn__probe_inputs in;
    memset(&in, 0, sizeof in);
    const clattn_status status = run_flash_probe(ctx, &run, &pm, &host, &in, r);
    clattn__probe_release(&pm);
    free_flash_host(&host);
    clattn__probe_free_inputs(&in);
    return status;
}

clattn_status clattn__flash_trust(clattn_ctx *ctx, clattn__flash_plan *plan)
{
    cl_kernel *slots[2] = {&plan->kernel, &plan->merge};
    return clattn__trust(ctx, "flash attention", slots, plan->splits > 1 ? 2 : 1, flash_probe,
                         plan);
}
