/* Rotary position embeddings: variant and launch for kernels/rope.cl. */
#include "ops.h"

#include <stdio.h>
#include <string.h>

clattn_status clattn__rope_prepare(clattn_ctx *ctx, const clattn__rope_shape *shape,
                                   clattn_dtype x_dtype, clattn_dtype out_dtype,
                                   clattn_dtype cache_dtype, clattn__rope_plan *plan)
{
    static const char op[] = "rope";
    memset(plan, 0, sizeof *plan);
    plan->shape = *shape;
    plan->local = ctx->tuning.heads_wg;
    size_t total = 0; /* a work-item per row */
    if (!clattn__product(&total, 3, shape->batch, shape->heads, shape->seq) ||
        !clattn__round_up(total, plan->local, &plan->global))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: %zu x %zu x %zu rows overflow size_t",
                            op, shape->batch, shape->heads, shape->seq);
    plan->total = total;
    char extra[96];
    snprintf(extra, sizeof extra, "-DROPE_WG=%u -DX_DTYPE=%d -DO_DTYPE=%d -DC_DTYPE=%d",
             ctx->tuning.heads_wg, (int)x_dtype, (int)out_dtype, (int)cache_dtype);
    const clattn_status status =
        clattn__variant_kernel(ctx, CLATTN_SRC_ROPE, op, extra, &plan->kernel);
    /* self-validation (core/validate.h; ops/probe.c) */
    return status != CLATTN_SUCCESS ? status
                                    : clattn__rope_trust(ctx, plan, x_dtype, out_dtype, cache_dtype);
}

clattn_status clattn__rope_enqueue(clattn_chain *chain, const clattn__rope_plan *plan,
                                   const clattn__rope_io *io)
{
    const clattn__rope_shape *shape = &plan->shape;
    const clattn__view *x = &io->x, *out = &io->out;
    clattn_rope_params params = {0};
    clattn__view_fields(x, &params.x_offset, &params.x_s0, &params.x_s1, &params.x_s2,
                        &params.x_s3);
    clattn__view_fields(out, &params.out_offset, &params.out_s0, &params.out_s1, &params.out_s2,
                        &params.out_s3);
    /* Absent operands: any valid buffer (never read). */
    const cl_mem cos_mem = io->cos.mem ? io->cos.mem : out->mem;
    const cl_mem sin_mem = io->sin.mem ? io->sin.mem : out->mem;
    const cl_mem pos_mem = io->position_ids.mem ? io->position_ids.mem : out->mem;
    const cl_mem freq_mem = io->freq ? io->freq : out->mem;
    params.cos_offset = io->cos.mem ? io->cos.offset : 0;
    params.sin_offset = io->sin.mem ? io->sin.offset : 0;
    /* Caches by position: (rows, rot / 2) views, strides [2] rows, [3] columns; by row:
     * (1, batch, seq, rot / 2). */
    params.c_s0 = io->cos.strides[1];
    params.c_s1 = io->cos.strides[2];
    params.c_s2 = io->cos.strides[3];
    params.cache_mode = shape->cache_mode;
    params.cache_rows = (cl_uint)io->cos.dims[2];
    params.pos_offset = io->position_ids.mem ? io->position_ids.offset : 0;
    params.pos_s0 = io->position_ids.strides[2];
    params.pos_s1 = io->position_ids.strides[3];
    params.has_position_ids = io->position_ids.mem != NULL;
    params.pairs = shape->pairs;
    params.heads = (cl_uint)shape->heads;
    params.seq = (cl_uint)shape->seq;
    params.dim = (cl_uint)shape->dim;
    params.rot = (cl_uint)shape->rot;
    params.start = shape->start;
    params.total = plan->total;
    const clattn_arg args[] = {CLATTN_ARG(x->mem),  CLATTN_ARG(out->mem), CLATTN_ARG(cos_mem),
                               CLATTN_ARG(sin_mem), CLATTN_ARG(pos_mem),  CLATTN_ARG(freq_mem),
                               CLATTN_ARG(params)};
    return clattn__launch_kernel(chain, plan->kernel, "rope", args, sizeof args / sizeof args[0], 1,
                                 &plan->global, &plan->local);
}
