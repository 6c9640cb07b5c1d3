/* Head split / concat and head averaging: checks and launch for kernels/heads.cl. */
#include "internal.h"

static clattn_status launch_1d(clattn_ctx *ctx, clattn_kernel_id id, const char *name,
                               const clattn_arg *args, cl_uint num_args, size_t total,
                               cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    const size_t local = ctx->tuning.heads_wg;
    size_t global = 0;
    if (!clattn__round_up(total, local, &global))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: %zu elements overflow size_t", name,
                            total);
    return clattn__launch(ctx, id, name, args, num_args, 1, &global, &local, num_wait, wait, event);
}

clattn_status clattn__move_heads_enqueue(clattn_ctx *ctx, const clattn_heads_desc *desc,
                                         int to_head_major, clattn_tensor src, clattn_tensor dst,
                                         cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    const cl_ulong total = (cl_ulong)desc->batch * desc->heads * desc->seq * desc->head_dim;
    const cl_uint heads = (cl_uint)desc->heads, seq = (cl_uint)desc->seq;
    const cl_uint head_dim = (cl_uint)desc->head_dim;
    const cl_ulong row_stride =
        desc->row_stride ? desc->row_stride : (cl_ulong)desc->heads * desc->head_dim;
    const cl_ulong src_offset = src.offset, dst_offset = dst.offset;
    const cl_int direction = to_head_major != 0;
    const clattn_arg args[] = {
        CLATTN_ARG(src.mem),    CLATTN_ARG(src_offset), CLATTN_ARG(dst.mem), CLATTN_ARG(dst_offset),
        CLATTN_ARG(total),      CLATTN_ARG(heads),      CLATTN_ARG(seq),     CLATTN_ARG(head_dim),
        CLATTN_ARG(row_stride), CLATTN_ARG(direction),
    };
    return launch_1d(ctx, CLATTN_K_MOVE_HEADS, to_head_major ? "split_heads" : "concat_heads", args,
                     sizeof args / sizeof args[0], (size_t)total, num_wait, wait, event);
}

clattn_status clattn__mean_heads_enqueue(clattn_ctx *ctx, size_t batch, size_t heads, size_t plane,
                                         clattn_tensor src, clattn_tensor dst, cl_uint num_wait,
                                         const cl_event *wait, cl_event *event)
{
    const cl_ulong total = (cl_ulong)batch * plane, plane_elems = plane;
    const cl_uint head_count = (cl_uint)heads;
    const cl_ulong src_offset = src.offset, dst_offset = dst.offset;
    const clattn_arg args[] = {
        CLATTN_ARG(src.mem),     CLATTN_ARG(src_offset), CLATTN_ARG(dst.mem),
        CLATTN_ARG(dst_offset),  CLATTN_ARG(total),      CLATTN_ARG(head_count),
        CLATTN_ARG(plane_elems),
    };
    return launch_1d(ctx, CLATTN_K_MEAN_HEADS, "mean_heads", args, sizeof args / sizeof args[0],
                     (size_t)total, num_wait, wait, event);
}

static clattn_status move_heads(clattn_ctx *ctx, const char *op, const clattn_heads_desc *desc,
                                int to_head_major, clattn_tensor src, clattn_tensor dst,
                                cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    clattn_status status = clattn__entry(ctx, op, desc, num_wait, wait, event);
    if (status != CLATTN_SUCCESS)
        return status;
    const size_t dims[4] = {desc->batch, desc->seq, desc->heads, desc->head_dim};
    static const char *const names[4] = {"batch", "seq", "heads", "head_dim"};
    status = clattn__check_dims(ctx, op, dims, names, 4, false);
    if (status != CLATTN_SUCCESS)
        return status;
    size_t width = 0, packed = 0, strided = 0;
    if (!clattn__mul(desc->heads, desc->head_dim, &width) ||
        !clattn__product(&packed, 3, desc->batch, desc->seq, width))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                            "%s: %zu x %zu x %zu x %zu elements overflow size_t", op, desc->batch,
                            desc->seq, desc->heads, desc->head_dim);
    const size_t row_stride = desc->row_stride ? desc->row_stride : width;
    if (row_stride < width)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: row_stride=%zu is less than heads*head_dim=%zu", op, row_stride,
                            width);
    if (!clattn__matrix_extent(1, 0, desc->batch * desc->seq, width, row_stride, &strided))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: row_stride=%zu overflows size_t", op,
                            row_stride);
    const size_t src_elems = to_head_major ? strided : packed;
    const size_t dst_elems = to_head_major ? packed : strided;
    if ((status = clattn__check_dims(ctx, op, dims, names, 4, true)) ||
        (status = clattn__check_tensor(ctx, op, "src", src, src_elems, sizeof(float), true)) ||
        (status = clattn__check_tensor(ctx, op, "dst", dst, dst_elems, sizeof(float), true)))
        return status;
    clattn_chain chain;
    cl_event step = NULL;
    status = clattn__begin(ctx, op, &chain, num_wait, wait);
    if (status == CLATTN_SUCCESS)
        status = clattn__step(&chain,
                              clattn__move_heads_enqueue(ctx, desc, to_head_major, src, dst,
                                                         CHAIN_WAIT(&chain), &step),
                              &step);
    return clattn__end(ctx, op, &chain, status, event);
}

clattn_status clattn_split_heads(clattn_ctx *ctx, const clattn_heads_desc *desc, clattn_tensor src,
                                 clattn_tensor dst, cl_uint num_wait, const cl_event *wait,
                                 cl_event *event)
{
    return move_heads(ctx, "split_heads", desc, 1, src, dst, num_wait, wait, event);
}

clattn_status clattn_concat_heads(clattn_ctx *ctx, const clattn_heads_desc *desc, clattn_tensor src,
                                  clattn_tensor dst, cl_uint num_wait, const cl_event *wait,
                                  cl_event *event)
{
    return move_heads(ctx, "concat_heads", desc, 0, src, dst, num_wait, wait, event);
}
