/* Positional encodings: variant and launch for kernels/posenc.cl. */
#include "ops.h"

#include <stdio.h>
#include <string.h>

clattn_status clattn__posenc_prepare(clattn_ctx *ctx, const size_t dims[4], clattn_dtype x_dtype,
                                     clattn_dtype out_dtype, clattn_dtype table_dtype,
                                     clattn__posenc_plan *plan)
{
    char extra[96];
    snprintf(extra, sizeof extra, "-DPOSENC_WG=%u -DX_DTYPE=%d -DO_DTYPE=%d -DT_DTYPE=%d",
             ctx->tuning.heads_wg, (int)x_dtype, (int)out_dtype, (int)table_dtype);
    const clattn_status status =
        clattn__elementwise_prepare(ctx, dims, CLATTN_SRC_POSENC, "posenc_add", extra, plan);
    /* self-validation (core/validate.h; ops/probe.c) */
    return status != CLATTN_SUCCESS
               ? status
               : clattn__posenc_trust(ctx, plan, x_dtype, out_dtype, table_dtype);
}

clattn_status clattn__posenc_enqueue(clattn_chain *chain, const clattn__posenc_plan *plan,
                                     const clattn__view *x, const clattn__view *out,
                                     const clattn__view *table, cl_mem freq, size_t start)
{
    const size_t *dims = plan->dims;
    const cl_ulong total = (cl_ulong)dims[0] * dims[1] * dims[2] * dims[3];
    const cl_int has_x = x->mem != NULL, has_table = table->mem != NULL;
    /* Absent operands: any valid buffer (never read) */
    const cl_mem x_mem = has_x ? x->mem : out->mem, table_mem = has_table ? table->mem : out->mem;
    const cl_mem freq_mem = freq ? freq : out->mem;
    clattn_posenc_params params = {0};
    if (has_x)
        clattn__view_fields(x, &params.x_offset, &params.x_s0, &params.x_s1, &params.x_s2,
                            &params.x_s3);
    clattn__view_fields(out, &params.out_offset, &params.out_s0, &params.out_s1, &params.out_s2,
                        &params.out_s3);
    if (has_table) {
        params.table_offset = table->offset;
        params.table_s0 = table->strides[2];
        params.table_s1 = table->strides[3];
    }
    params.start = start;
    params.total = total;
    params.has_x = has_x;
    params.has_table = has_table;
    params.d0 = (cl_uint)dims[0];
    params.d1 = (cl_uint)dims[1];
    params.seq = (cl_uint)dims[2];
    params.dim = (cl_uint)dims[3];
    const clattn_arg args[] = {CLATTN_ARG(x_mem), CLATTN_ARG(out->mem), CLATTN_ARG(table_mem),
                               CLATTN_ARG(freq_mem), CLATTN_ARG(params)};
    return clattn__launch_kernel(chain, plan->kernel, "posenc_add", args,
                                 sizeof args / sizeof args[0], 1, &plan->global, &plan->local);
}
