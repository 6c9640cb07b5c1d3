/* Positional encodings: variant and launch for kernels/posenc.cl. */
#include "ops.h"

#include <stdio.h>
#include <string.h>

clattn_status clattn__posenc_prepare(clattn_ctx *ctx, const size_t dims[4], clattn_dtype x_dtype,
                                     clattn_dtype out_dtype, clattn_dtype table_dtype,
                                     clattn__posenc_plan *plan)
{
    static const char op[] = "posenc";
    memset(plan, 0, sizeof *plan);
    memcpy(plan->dims, dims, sizeof plan->dims);
    plan->local = ctx->tuning.heads_wg;
    size_t total = 0;
    if (!clattn__product(&total, 4, dims[0], dims[1], dims[2], dims[3]) ||
        !clattn__round_up(total, plan->local, &plan->global))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: %zu x %zu x %zu x %zu overflow size_t",
                            op, dims[0], dims[1], dims[2], dims[3]);
    char extra[96];
    snprintf(extra, sizeof extra, "-DPOSENC_WG=%u -DX_DTYPE=%d -DO_DTYPE=%d -DT_DTYPE=%d",
             ctx->tuning.heads_wg, (int)x_dtype, (int)out_dtype, (int)table_dtype);
    return clattn__variant_kernel(ctx, CLATTN_SRC_POSENC, "posenc_add", extra, &plan->kernel);
}

clattn_status clattn__posenc_enqueue(clattn_ctx *ctx, const clattn__posenc_plan *plan,
                                     const clattn__view *x, const clattn__view *out,
                                     const clattn__view *table, cl_mem freq, size_t start,
                                     cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    const size_t *dims = plan->dims;
    const cl_ulong total = (cl_ulong)dims[0] * dims[1] * dims[2] * dims[3];
    const cl_int has_x = x->mem != NULL, has_table = table->mem != NULL;
    /* Absent operands: any valid buffer (never read) */
    const cl_mem x_mem = has_x ? x->mem : out->mem, table_mem = has_table ? table->mem : out->mem;
    const cl_mem freq_mem = freq ? freq : out->mem;
    const cl_ulong x_s[4] = {x->strides[0], x->strides[1], x->strides[2], x->strides[3]};
    const cl_ulong o_s[4] = {out->strides[0], out->strides[1], out->strides[2], out->strides[3]};
    const cl_ulong t_s[2] = {table->strides[2], table->strides[3]};
    const cl_ulong x_offset = has_x ? x->offset : 0, t_offset = has_table ? table->offset : 0;
    const cl_uint d0 = (cl_uint)dims[0], d1 = (cl_uint)dims[1], seq = (cl_uint)dims[2];
    const cl_uint dim = (cl_uint)dims[3];
    const cl_ulong first = start;
    const clattn_arg args[] = {
        CLATTN_ARG(x_mem),       CLATTN_ARG(x_offset),  CLATTN_ARG(x_s[0]),   CLATTN_ARG(x_s[1]),
        CLATTN_ARG(x_s[2]),      CLATTN_ARG(x_s[3]),    CLATTN_ARG(has_x),    CLATTN_ARG(out->mem),
        CLATTN_ARG(out->offset), CLATTN_ARG(o_s[0]),    CLATTN_ARG(o_s[1]),   CLATTN_ARG(o_s[2]),
        CLATTN_ARG(o_s[3]),      CLATTN_ARG(table_mem), CLATTN_ARG(t_offset), CLATTN_ARG(t_s[0]),
        CLATTN_ARG(t_s[1]),      CLATTN_ARG(has_table), CLATTN_ARG(freq_mem), CLATTN_ARG(d0),
        CLATTN_ARG(d1),          CLATTN_ARG(seq),       CLATTN_ARG(dim),      CLATTN_ARG(first),
        CLATTN_ARG(total),
    };
    return clattn__launch_kernel(ctx, plan->kernel, "posenc_add", args,
                                 sizeof args / sizeof args[0], 1, &plan->global, &plan->local,
                                 num_wait, wait, event);
}
