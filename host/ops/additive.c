/* Additive attention's scores: variant and launch for kernels/additive.cl. */
#include "ops.h"
#include "core/validate.h"

#include <stdio.h>
#include <string.h>

clattn_status clattn__additive_prepare(clattn_ctx *ctx, size_t batch, size_t heads, size_t seq_q,
                                       size_t seq_k, size_t dim, clattn__additive_plan *plan)
{
    static const char op[] = "additive_scores";
    memset(plan, 0, sizeof *plan);
    plan->batch = batch, plan->heads = heads, plan->seq_q = seq_q, plan->seq_k = seq_k;
    plan->dim = dim;
    /* TILE x TILE work-items: the largest power of two up to 16 the device runs in both
     * dimensions (16 x 16 = 256 items, a work-group size every GPU and PoCL take). */
    const unsigned chunk = 32;
    /* local memory: four (TILE, CHUNK + 1) float tiles, CHUNK weights, two flags (17 KB at
     * TILE 16); queried, not assumed */
#define ADDITIVE_LOCAL(t) ((4 * (size_t)(t) * (chunk + 1) + chunk) * sizeof(float) + 8)
    unsigned tile = 16;
    while (tile > 1 && ((size_t)tile * tile > ctx->info.max_work_group_size ||
                        tile > ctx->info.max_item_sizes[0] || tile > ctx->info.max_item_sizes[1] ||
                        ADDITIVE_LOCAL(tile) > ctx->info.local_mem_size))
        tile /= 2;
    if (ADDITIVE_LOCAL(tile) > ctx->info.local_mem_size)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: the device has %llu bytes of local memory, fewer than the %zu "
                            "the smallest tile needs",
                            op, (unsigned long long)ctx->info.local_mem_size, ADDITIVE_LOCAL(1));
#undef ADDITIVE_LOCAL
    size_t bh = 0;
    if (!clattn__mul(batch, heads, &bh) || bh > UINT32_MAX || seq_q > UINT32_MAX ||
        seq_k > UINT32_MAX || dim > UINT32_MAX)
        return clattn__fail(ctx, CLATTN_ERR_TOO_LARGE,
                            "%s: batch %zu x heads %zu, seq_q %zu, seq_k %zu exceed the kernel's "
                            "32-bit indices",
                            op, batch, heads, seq_q, seq_k);
    /* The compiled kernel may run fewer work-items than the device's limit (Mesa's llvmpipe:
     * 32): shrink the tile until it fits. */
    for (;; tile /= 2) {
        char extra[64];
        snprintf(extra, sizeof extra, "-DTILE=%u -DCHUNK=%u", tile, chunk);
        clattn_status status =
            clattn__variant_kernel(ctx, CLATTN_SRC_ADDITIVE, op, extra, &plan->kernel);
        if (status != CLATTN_SUCCESS)
            return status;
        size_t kernel_max = 0;
        const cl_int err =
            clGetKernelWorkGroupInfo(plan->kernel, ctx->device, CL_KERNEL_WORK_GROUP_SIZE,
                                     sizeof kernel_max, &kernel_max, NULL);
        if (err != CL_SUCCESS)
            return clattn__cl_fail(ctx, err, "clGetKernelWorkGroupInfo(additive_scores)");
        if (kernel_max >= (size_t)tile * tile)
            break;
        if (tile == 1)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: the device runs no work-group of this kernel", op);
    }
    if (!clattn__round_up(seq_k, tile, &plan->global[0]) ||
        !clattn__round_up(seq_q, tile, &plan->global[1]))
        return clattn__fail(ctx, CLATTN_ERR_TOO_LARGE, "%s: seq_q %zu, seq_k %zu overflow", op,
                            seq_q, seq_k);
    plan->global[2] = bh;
    plan->local[0] = plan->local[1] = tile;
    plan->local[2] = 1;
    plan->tile = tile;
    return clattn__additive_trust(ctx, plan); /* self-validation (core/validate.h) */
}

clattn_status clattn__additive_enqueue(clattn_chain *chain, const clattn__additive_plan *plan,
                                       const clattn__view *p1, const clattn__view *p2,
                                       const clattn__view *w, const clattn__view *raw)
{
    const clattn_additive_params params = {.p1_offset = p1->offset,
                                           .p1_s0 = p1->strides[0],
                                           .p1_s1 = p1->strides[1],
                                           .p1_s2 = p1->strides[2],
                                           .p2_offset = p2->offset,
                                           .p2_s0 = p2->strides[0],
                                           .p2_s1 = p2->strides[1],
                                           .p2_s2 = p2->strides[2],
                                           .w_offset = w->offset,
                                           .w_s0 = w->strides[2],
                                           .w_s1 = w->strides[3],
                                           .raw_offset = raw->offset,
                                           .raw_s0 = raw->strides[0],
                                           .raw_s1 = raw->strides[1],
                                           .raw_s2 = raw->strides[2],
                                           .heads = (cl_uint)plan->heads,
                                           .seq_q = (cl_uint)plan->seq_q,
                                           .seq_k = (cl_uint)plan->seq_k,
                                           .dim = (cl_uint)plan->dim};
    const clattn_arg args[] = {CLATTN_ARG(p1->mem), CLATTN_ARG(p2->mem), CLATTN_ARG(w->mem),
                               CLATTN_ARG(raw->mem), CLATTN_ARG(params)};
    return clattn__launch_kernel(chain, plan->kernel, "additive_scores", args,
                                 sizeof args / sizeof args[0], 3, plan->global, plan->local);
}
