/* Batched strided matmul: argument checks and launch geometry for kernels/matmul.cl. */
#include "internal.h"

/* NVIDIA's OpenCL maps global dimension 2 onto a grid dimension limited to 65535 blocks. */
#define MAX_BATCH_PER_LAUNCH 65535u

/* Enqueues dst = the transpose of each of `batch` N x K matrices of b (row stride ldb). */
static clattn_status transpose_b(clattn_ctx *ctx, size_t batch, cl_uint n, cl_uint k,
                                 clattn_tensor b, cl_ulong ldb, cl_ulong stride_b, cl_mem dst,
                                 cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    const cl_ulong offset = b.offset;
    const size_t local[3] = {ctx->tuning.transpose_wg, 1, 1};
    const size_t global[3] = {((k + local[0] - 1) / local[0]) * local[0], n, batch};
    const clattn_arg args[] = {CLATTN_ARG(n),      CLATTN_ARG(k),   CLATTN_ARG(b.mem),
                               CLATTN_ARG(offset), CLATTN_ARG(ldb), CLATTN_ARG(stride_b),
                               CLATTN_ARG(dst)};
    return clattn__launch(ctx, CLATTN_K_TRANSPOSE, "matmul (transpose B)", args,
                          sizeof args / sizeof args[0], 3, global, local, num_wait, wait, event);
}

clattn_status clattn__matmul_enqueue(clattn_ctx *ctx, const clattn_matmul_desc *desc,
                                     clattn_tensor a, clattn_tensor b, clattn_tensor bias,
                                     clattn_tensor c, cl_uint num_wait, const cl_event *wait,
                                     cl_event *event)
{
    const clattn_tuning *t = &ctx->tuning;
    const bool vec = t->matmul_vec;
    const size_t batch = desc->batch ? desc->batch : 1;
    const cl_uint m = (cl_uint)desc->m, n = (cl_uint)desc->n, k = (cl_uint)desc->k;
    const cl_ulong lda = desc->lda ? desc->lda : (desc->trans_a ? desc->m : desc->k);
    cl_ulong ldb = desc->ldb ? desc->ldb : (desc->trans_b ? desc->k : desc->n);
    const cl_ulong ldc = desc->ldc ? desc->ldc : desc->n;
    const cl_ulong stride_a = batch > 1 ? desc->stride_a : 0;
    cl_ulong stride_b = batch > 1 ? desc->stride_b : 0;
    const cl_ulong stride_c = batch > 1 ? desc->stride_c : 0;
    const cl_int trans_a = desc->trans_a != 0;
    cl_int trans_b = desc->trans_b != 0;
    const cl_float alpha = desc->alpha, beta = desc->beta;
    const cl_int has_bias = bias.mem != NULL;
    const cl_ulong bias_offset = bias.offset;
    cl_mem bias_mem = bias.mem ? bias.mem : a.mem; /* any valid buffer; never read */

    clattn_chain chain;
    clattn__chain_init(&chain, num_wait, wait);
    clattn_status status = CLATTN_SUCCESS;
    cl_event step = NULL;
    if (vec && trans_b) {
        /* matmul_vec reads rows of a K x N B: transpose once (once in all if broadcast). */
        const size_t copies = stride_b == 0 ? 1 : batch;
        cl_mem transposed = NULL;
        status = clattn__workspace(ctx, "matmul", CLATTN_WS_MATMUL_BT,
                                   copies * desc->n * desc->k * sizeof(float), &transposed);
        if (status == CLATTN_SUCCESS)
            status = transpose_b(ctx, copies, n, k, b, ldb, stride_b, transposed,
                                 CHAIN_WAIT(&chain), &step);
        if (status != CLATTN_SUCCESS) {
            clattn__chain_finish(&chain, NULL);
            return status;
        }
        clattn__chain_push(&chain, step);
        b = (clattn_tensor){transposed, 0};
        ldb = n;
        stride_b = stride_b == 0 ? 0 : (cl_ulong)n * k;
        trans_b = 0;
    }

    size_t local[3], global[3];
    if (vec) {
        local[0] = t->vec_wg, local[1] = 1, local[2] = 1;
        const size_t cols = 2 * (size_t)t->vec_width; /* per work-item */
        global[0] = (((desc->n + cols - 1) / cols + local[0] - 1) / local[0]) * local[0];
        global[1] = (desc->m + t->vec_rm - 1) / t->vec_rm;
    } else {
        local[0] = t->tile_n / t->wpt_n, local[1] = t->tile_m / t->wpt_m, local[2] = 1;
        global[0] = ((desc->n + t->tile_n - 1) / t->tile_n) * local[0];
        global[1] = ((desc->m + t->tile_m - 1) / t->tile_m) * local[1];
    }
    /* A device that caps the loop iterations of a work-item (loop_trip_limit, from the quirks
     * table in runtime.c) gets K in parts accumulated onto C: the first part with the caller's
     * beta and bias, the others with beta = 1 and no bias. A quarter of the limit leaves room
     * for the tiled kernel's ~2 trips per k and the loops outside its K loop. */
    const cl_uint k_step = t->loop_trip_limit ? t->loop_trip_limit / 4 : k;
    const size_t k_parts = (k + (size_t)k_step - 1) / k_step;
    const size_t batch_parts = (batch + MAX_BATCH_PER_LAUNCH - 1) / MAX_BATCH_PER_LAUNCH;
    for (size_t part = 0; part < k_parts * batch_parts && status == CLATTN_SUCCESS; ++part) {
        const cl_uint k0 = (cl_uint)(part / batch_parts) * k_step;
        const size_t first = (part % batch_parts) * MAX_BATCH_PER_LAUNCH;
        const size_t count =
            batch - first < MAX_BATCH_PER_LAUNCH ? batch - first : MAX_BATCH_PER_LAUNCH;
        const cl_uint k_part = k - k0 < k_step ? k - k0 : k_step;
        const cl_float beta_part = k0 == 0 ? beta : 1.0f;
        const cl_int bias_part = k0 == 0 ? has_bias : 0;
        /* Element k0 of op(A)'s rows and of op(B)'s columns. */
        const cl_ulong a_offset = a.offset + first * stride_a + k0 * (trans_a ? lda : 1);
        const cl_ulong b_offset = b.offset + first * stride_b + k0 * (trans_b ? 1 : ldb);
        const cl_ulong c_offset = c.offset + first * stride_c;
        /* The two kernels share their signature except matmul's trans_b flag. */
        const clattn_arg tiled_args[] = {
            CLATTN_ARG(m),         CLATTN_ARG(n),        CLATTN_ARG(k_part),
            CLATTN_ARG(a.mem),     CLATTN_ARG(a_offset), CLATTN_ARG(lda),
            CLATTN_ARG(stride_a),  CLATTN_ARG(trans_a),  CLATTN_ARG(b.mem),
            CLATTN_ARG(b_offset),  CLATTN_ARG(ldb),      CLATTN_ARG(stride_b),
            CLATTN_ARG(trans_b),   CLATTN_ARG(c.mem),    CLATTN_ARG(c_offset),
            CLATTN_ARG(ldc),       CLATTN_ARG(stride_c), CLATTN_ARG(alpha),
            CLATTN_ARG(beta_part), CLATTN_ARG(bias_mem), CLATTN_ARG(bias_offset),
            CLATTN_ARG(bias_part),
        };
        clattn_arg vec_args[sizeof tiled_args / sizeof tiled_args[0] - 1];
        for (size_t i = 0, j = 0; i < sizeof tiled_args / sizeof tiled_args[0]; ++i)
            if (i != 12)
                vec_args[j++] = tiled_args[i];
        global[2] = count;
        status = vec ? clattn__launch(ctx, CLATTN_K_MATMUL_VEC, "matmul_vec", vec_args,
                                      sizeof vec_args / sizeof vec_args[0], 3, global, local,
                                      CHAIN_WAIT(&chain), &step)
                     : clattn__launch(ctx, CLATTN_K_MATMUL, "matmul", tiled_args,
                                      sizeof tiled_args / sizeof tiled_args[0], 3, global, local,
                                      CHAIN_WAIT(&chain), &step);
        if (status == CLATTN_SUCCESS)
            clattn__chain_push(&chain, step);
    }
    clattn__chain_finish(&chain, status == CLATTN_SUCCESS ? event : NULL);
    return status;
}

/* Checks one operand: its leading dimension and that its buffer holds the batched extent. */
static clattn_status check_operand(clattn_ctx *ctx, const char *name, const char *ld_name,
                                   clattn_tensor t, size_t batch, size_t stride, size_t rows,
                                   size_t cols, size_t ld, bool required)
{
    if (t.mem == NULL)
        return clattn__check_tensor(ctx, "matmul", name, t, 0, sizeof(float), required);
    if (ld == 0)
        ld = cols;
    if (ld < cols)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "matmul: %s=%zu but %s has %zu columns as stored", ld_name, ld, name,
                            cols);
    size_t extent = 0;
    if (!clattn__matrix_extent(batch, stride, rows, cols, ld, &extent))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                            "matmul: %s (%zu batches of %zu x %zu, ld %zu, stride %zu) overflows "
                            "size_t",
                            name, batch, rows, cols, ld, stride);
    return clattn__check_tensor(ctx, "matmul", name, t, extent, sizeof(float), required);
}

clattn_status clattn_matmul(clattn_ctx *ctx, const clattn_matmul_desc *desc, clattn_tensor a,
                            clattn_tensor b, clattn_tensor bias, clattn_tensor c, cl_uint num_wait,
                            const cl_event *wait, cl_event *event)
{
    clattn_status status = clattn__entry(ctx, "matmul", desc, num_wait, wait, event);
    if (status != CLATTN_SUCCESS)
        return status;
    const size_t batch = desc->batch ? desc->batch : 1;
    const size_t dims[3] = {desc->m, desc->n, desc->k};
    static const char *const dim_names[3] = {"m", "n", "k"};
    status = clattn__check_dims(ctx, "matmul", dims, dim_names, 3, false);
    if (status != CLATTN_SUCCESS)
        return status;
    const size_t a_rows = desc->trans_a ? desc->k : desc->m;
    const size_t a_cols = desc->trans_a ? desc->m : desc->k;
    const size_t b_rows = desc->trans_b ? desc->n : desc->k;
    const size_t b_cols = desc->trans_b ? desc->k : desc->n;
    const size_t sa = batch > 1 ? desc->stride_a : 0, sb = batch > 1 ? desc->stride_b : 0;
    const size_t sc = batch > 1 ? desc->stride_c : 0;
    if ((status = check_operand(ctx, "a", "lda", a, batch, sa, a_rows, a_cols, desc->lda, true)) ||
        (status = check_operand(ctx, "b", "ldb", b, batch, sb, b_rows, b_cols, desc->ldb, true)) ||
        (status =
             check_operand(ctx, "c", "ldc", c, batch, sc, desc->m, desc->n, desc->ldc, true)) ||
        (status =
             clattn__check_tensor(ctx, "matmul", "bias", bias, desc->n, sizeof(float), false)) ||
        (status = clattn__check_dims(ctx, "matmul", dims, dim_names, 3, true)))
        return status;
    if (batch > 1 && sc == 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "matmul: stride_c=0 with batch=%zu would write every batch entry to "
                            "the same C",
                            batch);
    clattn_chain chain;
    cl_event step = NULL;
    status = clattn__begin(ctx, "matmul", &chain, num_wait, wait);
    if (status == CLATTN_SUCCESS)
        status = clattn__step(
            &chain, clattn__matmul_enqueue(ctx, desc, a, b, bias, c, CHAIN_WAIT(&chain), &step),
            &step);
    return clattn__end(ctx, "matmul", &chain, status, event);
}
