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
    return clattn__variant_kernel(ctx, CLATTN_SRC_ROPE, op, extra, &plan->kernel);
}

clattn_status clattn__rope_enqueue(clattn_ctx *ctx, const clattn__rope_plan *plan,
                                   const clattn__rope_io *io, cl_uint num_wait,
                                   const cl_event *wait, cl_event *event)
{
    const clattn__rope_shape *shape = &plan->shape;
    const clattn__view *x = &io->x, *out = &io->out;
    const cl_ulong x_s[4] = {x->strides[0], x->strides[1], x->strides[2], x->strides[3]};
    const cl_ulong o_s[4] = {out->strides[0], out->strides[1], out->strides[2], out->strides[3]};
    /* Absent operands: any valid buffer (never read). */
    const cl_mem cos_mem = io->cos.mem ? io->cos.mem : out->mem;
    const cl_mem sin_mem = io->sin.mem ? io->sin.mem : out->mem;
    const cl_mem pos_mem = io->position_ids.mem ? io->position_ids.mem : out->mem;
    const cl_mem freq_mem = io->freq ? io->freq : out->mem;
    const cl_ulong cos_offset = io->cos.mem ? io->cos.offset : 0;
    const cl_ulong sin_offset = io->sin.mem ? io->sin.offset : 0;
    /* Caches by position: (rows, rot / 2) views, strides [2] rows, [3] columns; by row:
     * (1, batch, seq, rot / 2). */
    const cl_ulong c_s[3] = {io->cos.strides[1], io->cos.strides[2], io->cos.strides[3]};
    const cl_int cache_mode = shape->cache_mode;
    const cl_uint cache_rows = (cl_uint)io->cos.dims[2];
    const cl_ulong pos_offset = io->position_ids.mem ? io->position_ids.offset : 0;
    const cl_ulong p_s[2] = {io->position_ids.strides[2], io->position_ids.strides[3]};
    const cl_int has_pos = io->position_ids.mem != NULL, pairs = shape->pairs;
    const cl_uint heads = (cl_uint)shape->heads, seq = (cl_uint)shape->seq;
    const cl_uint dim = (cl_uint)shape->dim, rot = (cl_uint)shape->rot;
    const cl_ulong start = shape->start, total = plan->total;
    const clattn_arg args[] = {
        CLATTN_ARG(x->mem),     CLATTN_ARG(x->offset),   CLATTN_ARG(x_s[0]),
        CLATTN_ARG(x_s[1]),     CLATTN_ARG(x_s[2]),      CLATTN_ARG(x_s[3]),
        CLATTN_ARG(out->mem),   CLATTN_ARG(out->offset), CLATTN_ARG(o_s[0]),
        CLATTN_ARG(o_s[1]),     CLATTN_ARG(o_s[2]),      CLATTN_ARG(o_s[3]),
        CLATTN_ARG(cos_mem),    CLATTN_ARG(sin_mem),     CLATTN_ARG(cos_offset),
        CLATTN_ARG(sin_offset), CLATTN_ARG(c_s[0]),      CLATTN_ARG(c_s[1]),
        CLATTN_ARG(c_s[2]),     CLATTN_ARG(cache_mode),  CLATTN_ARG(cache_rows),
        CLATTN_ARG(pos_mem),    CLATTN_ARG(pos_offset),  CLATTN_ARG(p_s[0]),
        CLATTN_ARG(p_s[1]),     CLATTN_ARG(has_pos),     CLATTN_ARG(freq_mem),
        CLATTN_ARG(pairs),      CLATTN_ARG(heads),       CLATTN_ARG(seq),
        CLATTN_ARG(dim),        CLATTN_ARG(rot),         CLATTN_ARG(start),
        CLATTN_ARG(total),
    };
    return clattn__launch_kernel(ctx, plan->kernel, "rope", args, sizeof args / sizeof args[0], 1,
                                 &plan->global, &plan->local, num_wait, wait, event);
}
