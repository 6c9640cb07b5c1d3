/* Fused (flash) attention: per-device tiles, per-head-size program variants, launch geometry
 * for kernels/flash_attention.cl. */
#include "internal.h"

#include <math.h>
#include <stdio.h>

#define FLASH_MAX_HEAD_DIM 256
/* NVIDIA's OpenCL maps global dimension 1 onto a grid dimension of at most 65535 blocks. */
#define MAX_BH_PER_LAUNCH 65535u

bool clattn__flash_supports(size_t head_dim_qk, size_t head_dim_v)
{
    return head_dim_qk <= FLASH_MAX_HEAD_DIM && head_dim_v <= FLASH_MAX_HEAD_DIM;
}

static unsigned floor_pow2(size_t value, unsigned cap)
{
    unsigned v = 1;
    while (v * 2 <= cap && v * 2 <= value)
        v *= 2;
    return v;
}

/* Keys per launch where the device caps the loop iterations of a work-item in all
 * (tuning.loop_trip_limit, from the quirks table in runtime.c): whole tiles whose loop trips,
 * counted as if no loop were unrolled, stay within half the limit. 0: all keys in one launch. */
static size_t keys_per_launch(const clattn_ctx *ctx, size_t dk, size_t dv, unsigned rows,
                              unsigned block_k, unsigned vw)
{
    const size_t limit = ctx->tuning.loop_trip_limit;
    if (limit == 0)
        return 0;
    const size_t qk_vecs = dk / vw, v_vecs = dv / vw;
    /* Per tile: staging K and V, scoring, rescaling, accumulating; outside: q, acc, output. */
    const size_t per_tile = (block_k * dk + rows - 1) / rows + (block_k * dv + rows - 1) / rows +
                            block_k * (1 + qk_vecs) + v_vecs + block_k * (1 + v_vecs) + 1;
    const size_t outside = qk_vecs + 3 * v_vecs;
    const size_t tiles = limit / 2 > outside + per_tile ? (limit / 2 - outside) / per_tile : 1;
    return tiles * block_k;
}

/* The kernel variant for these head sizes: BLOCK_K from the local memory the K and V tiles
 * need, BLOCK_Q from the work-group size, shrunk while the compiled kernel cannot run that
 * many work-items (register pressure at large head sizes); *part_keys from keys_per_launch. */
static clattn_status flash_kernel(clattn_ctx *ctx, size_t dk, size_t dv, cl_kernel *kernel,
                                  unsigned *block_q, size_t *part_keys)
{
    const bool is_cpu = ctx->tuning.cpu_params;
    const cl_ulong local_budget = ctx->info.local_mem_size > 16384 ? ctx->info.local_mem_size - 1024
                                                                   : ctx->info.local_mem_size;
    const cl_ulong tile_budget = local_budget < 32768 ? local_budget : 32768;
    unsigned block_k = 32;
    while (block_k > 1 && (cl_ulong)block_k * (dk + dv) * sizeof(float) > tile_budget)
        block_k /= 2;
    const size_t max_1d = ctx->info.max_work_group_size < ctx->info.max_item_sizes[0]
                              ? ctx->info.max_work_group_size
                              : ctx->info.max_item_sizes[0];
    /* 64 rows per group on both: on PoCL (measured, L=1024 d=64) 1 row ran 2.4 GFLOP/s,
     * 16 rows 12.7, 64 rows 16.5; 128 no better. */
    unsigned rows = floor_pow2(max_1d, 64);
    /* CPUs: explicit vectors along the row; GPUs: scalars (a work-item is one SIMD lane). */
    const unsigned vw = !is_cpu                        ? 1
                        : (dk % 8 == 0 && dv % 8 == 0) ? 8
                        : (dk % 4 == 0 && dv % 4 == 0) ? 4
                                                       : 1;
    for (;;) {
        char extra[160];
        snprintf(extra, sizeof extra,
                 "-DHEAD_DIM_QK=%zu -DHEAD_DIM_V=%zu -DBLOCK_Q=%u -DBLOCK_K=%u -DFLASH_VW=%u", dk,
                 dv, rows, block_k, vw);
        clattn_status status =
            clattn__variant_kernel(ctx, CLATTN_SRC_FLASH, "flash_attention", extra, kernel);
        if (status != CLATTN_SUCCESS)
            return status;
        size_t kernel_max = 0;
        cl_int err = clGetKernelWorkGroupInfo(*kernel, ctx->device, CL_KERNEL_WORK_GROUP_SIZE,
                                              sizeof kernel_max, &kernel_max, NULL);
        if (err != CL_SUCCESS)
            return clattn__cl_fail(ctx, err, "clGetKernelWorkGroupInfo(flash_attention)");
        if (kernel_max >= rows) {
            *block_q = rows;
            *part_keys = keys_per_launch(ctx, dk, dv, rows, block_k, vw);
            return CLATTN_SUCCESS;
        }
        if (rows == 1)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "flash_attention: the device runs no work-group of this kernel "
                                "(head sizes %zu, %zu)",
                                dk, dv);
        rows /= 2;
    }
}

clattn_status clattn__flash_enqueue(clattn_ctx *ctx, const clattn_attention_desc *desc,
                                    clattn_tensor q, clattn_tensor k, clattn_tensor v,
                                    clattn_tensor out, clattn_tensor lse, cl_uint num_wait,
                                    const cl_event *wait, cl_event *event)
{
    cl_kernel kernel = NULL;
    unsigned block_q = 1;
    size_t part_keys = 0;
    clattn_status status =
        flash_kernel(ctx, desc->head_dim_qk, desc->head_dim_v, &kernel, &block_q, &part_keys);
    if (status != CLATTN_SUCCESS)
        return status;
    /* Keys in parts (devices with a loop limit): each launch resumes from the output and
     * log-sum-exp of the one before, kept in the caller's lse or one float per row of ours. */
    if (part_keys == 0 || part_keys > desc->seq_k)
        part_keys = desc->seq_k;
    const size_t parts = (desc->seq_k + part_keys - 1) / part_keys;
    if (parts > 1 && lse.mem == NULL) {
        lse.offset = 0;
        status =
            clattn__workspace(ctx, "flash_attention", CLATTN_WS_FLASH_LSE,
                              desc->batch * desc->heads * desc->seq_q * sizeof(float), &lse.mem);
        if (status != CLATTN_SUCCESS)
            return status;
    }
    const clattn_masks *masks = &desc->masks;
    const cl_ulong q_offset = q.offset, k_offset = k.offset, v_offset = v.offset;
    const cl_ulong o_offset = out.offset, lse_offset = lse.offset;
    const cl_int has_lse = lse.mem != NULL;
    cl_mem lse_mem = lse.mem ? lse.mem : out.mem; /* never written when absent */
    const cl_uint heads = (cl_uint)desc->heads, seq_q = (cl_uint)desc->seq_q;
    const cl_uint seq_k = (cl_uint)desc->seq_k;
    const cl_float scale =
        desc->scale != 0.0f ? desc->scale : (float)(1.0 / sqrt((double)desc->head_dim_qk));
    const cl_int norm_relu = desc->norm == CLATTN_NORM_RELU, causal = masks->causal != 0;
    const cl_int has_mask = masks->attn_mask.mem != NULL;
    const cl_int has_key_padding = masks->key_padding_mask.mem != NULL;
    cl_mem mask_mem = has_mask ? masks->attn_mask.mem : q.mem;
    cl_mem key_padding_mem = has_key_padding ? masks->key_padding_mask.mem : q.mem;
    const cl_ulong mask_offset = masks->attn_mask.offset;
    const cl_ulong key_padding_offset = masks->key_padding_mask.offset;
    const size_t bh_total = desc->batch * desc->heads;
    const size_t local[2] = {block_q, 1};
    size_t global[2] = {((desc->seq_q + block_q - 1) / block_q) * block_q, 1};

    clattn_chain chain;
    clattn__chain_init(&chain, num_wait, wait);
    const size_t bh_parts = (bh_total + MAX_BH_PER_LAUNCH - 1) / MAX_BH_PER_LAUNCH;
    for (size_t launch = 0; launch < parts * bh_parts && status == CLATTN_SUCCESS; ++launch) {
        const size_t first = (launch % bh_parts) * MAX_BH_PER_LAUNCH;
        const cl_ulong bh_base = first;
        const cl_uint key_begin = (cl_uint)((launch / bh_parts) * part_keys);
        const cl_uint key_stop =
            (cl_uint)(desc->seq_k - key_begin < part_keys ? desc->seq_k : key_begin + part_keys);
        const cl_int resume = key_begin > 0;
        const clattn_arg args[] = {
            CLATTN_ARG(q.mem),           CLATTN_ARG(q_offset),
            CLATTN_ARG(k.mem),           CLATTN_ARG(k_offset),
            CLATTN_ARG(v.mem),           CLATTN_ARG(v_offset),
            CLATTN_ARG(out.mem),         CLATTN_ARG(o_offset),
            CLATTN_ARG(lse_mem),         CLATTN_ARG(lse_offset),
            CLATTN_ARG(has_lse),         CLATTN_ARG(heads),
            CLATTN_ARG(seq_q),           CLATTN_ARG(seq_k),
            CLATTN_ARG(scale),           CLATTN_ARG(norm_relu),
            CLATTN_ARG(causal),          CLATTN_ARG(mask_mem),
            CLATTN_ARG(mask_offset),     CLATTN_ARG(has_mask),
            CLATTN_ARG(key_padding_mem), CLATTN_ARG(key_padding_offset),
            CLATTN_ARG(has_key_padding), CLATTN_ARG(bh_base),
            CLATTN_ARG(key_begin),       CLATTN_ARG(key_stop),
            CLATTN_ARG(resume),
        };
        global[1] = bh_total - first < MAX_BH_PER_LAUNCH ? bh_total - first : MAX_BH_PER_LAUNCH;
        cl_event step = NULL;
        status = clattn__step(&chain,
                              clattn__launch_kernel(ctx, kernel, "flash_attention", args,
                                                    sizeof args / sizeof args[0], 2, global, local,
                                                    CHAIN_WAIT(&chain), &step),
                              &step);
    }
    clattn__chain_finish(&chain, status == CLATTN_SUCCESS ? event : NULL);
    return status;
}

clattn_status clattn_flash_attention(clattn_ctx *ctx, const clattn_attention_desc *desc,
                                     clattn_tensor q, clattn_tensor k, clattn_tensor v,
                                     clattn_tensor out, clattn_tensor lse, cl_uint num_wait,
                                     const cl_event *wait, cl_event *event)
{
    static const char op[] = "flash_attention";
    clattn_status status = clattn__entry(ctx, op, desc, num_wait, wait, event);
    if (status == CLATTN_SUCCESS)
        status = clattn__check_norm(ctx, op, desc->norm);
    if (status != CLATTN_SUCCESS)
        return status;
    clattn_attention_sizes sizes;
    status = clattn__attention_shapes(ctx, desc, &sizes);
    if (status != CLATTN_SUCCESS)
        return status;
    if (!clattn__flash_supports(desc->head_dim_qk, desc->head_dim_v))
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: head_dim_qk=%zu, head_dim_v=%zu: the fused kernel takes head "
                            "sizes up to %d",
                            op, desc->head_dim_qk, desc->head_dim_v, FLASH_MAX_HEAD_DIM);
    const size_t rows = sizes.out / desc->head_dim_v; /* batch * heads * seq_q */
    if ((status = clattn__check_tensor(ctx, op, "q", q, sizes.q, sizeof(float), true)) ||
        (status = clattn__check_tensor(ctx, op, "k", k, sizes.k, sizeof(float), true)) ||
        (status = clattn__check_tensor(ctx, op, "v", v, sizes.v, sizeof(float), true)) ||
        (status = clattn__check_tensor(ctx, op, "out", out, sizes.out, sizeof(float), true)) ||
        (status = clattn__check_tensor(ctx, op, "lse", lse, rows, sizeof(float), false)) ||
        (status =
             clattn__check_masks(ctx, op, &desc->masks, desc->batch, desc->seq_q, desc->seq_k)))
        return status;
    clattn_chain chain;
    cl_event step = NULL;
    status = clattn__begin(ctx, op, &chain, num_wait, wait);
    if (status == CLATTN_SUCCESS)
        status = clattn__step(
            &chain, clattn__flash_enqueue(ctx, desc, q, k, v, out, lse, CHAIN_WAIT(&chain), &step),
            &step);
    return clattn__end(ctx, op, &chain, status, event);
}
