/* Batched strided matmul: variant choice, launch geometry and argument packing for
 * kernels/matmul.cl (ops.h), and the public clattn_matmul with its argument checks. */
#include "ops.h"
#include "probe.h" /* self-validation (core/validate.h) */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OP "matmul"

/* NVIDIA's OpenCL maps global dimension 2 onto a grid dimension limited to 65535 blocks. */
#define MAX_BATCH_PER_LAUNCH 65535u

/* The families (core/family.h): the local-tile kernel, the register-blocked vector kernel
 * (CPUs) and its B packing. The device-wide tiles (TILE_M, VEC_RM, ...) are the context's
 * options (core/tuning.c). */
/* clang-format off */
#define MATMUL_SWITCHES(X)                                                                         \
    X(A_DTYPE, 0, NULL) X(B_DTYPE, 0, NULL) X(C_DTYPE, 0, NULL)
/* clang-format on */
CLATTN_FAMILY(matmul, MATMUL_SWITCHES, .sources = {"matmul.cl"},
              .tuning_keys = "matmul_vec tile_m tile_n tile_k wpt_m wpt_n");
/* clang-format off */
#define MATMUL_VEC_SWITCHES(X)                                                                     \
    X(A_DTYPE, 0, NULL) X(B_DTYPE, 0, NULL) X(C_DTYPE, 0, NULL) X(VEC_NV, 0, NULL)                 \
    X(VEC_RB, 0, NULL) X(VEC_KC, 0, NULL)
/* clang-format on */
CLATTN_FAMILY(matmul_vec, MATMUL_VEC_SWITCHES, .sources = {"matmul.cl"}, .flags = "-cl-mad-enable",
              .tuning_keys = "matmul_vec vec_rm vec_width vec_nv vec_rb vec_kc vec_wg vec_stream");
#define PACK_B_SWITCHES(X) X(B_DTYPE, 0, NULL) X(VEC_NV, 0, NULL)
CLATTN_FAMILY(pack_b, PACK_B_SWITCHES, .sources = {"matmul.cl"}, .tuning_keys = "vec_nv vec_width");

static bool matmul_dtype(clattn_dtype dtype)
{
    return dtype == CLATTN_DTYPE_F32 || dtype == CLATTN_DTYPE_F16 || dtype == CLATTN_DTYPE_BF16;
}

static const char *dtype_name(clattn_dtype dtype)
{
    static const char *const names[] = {"F32", "F16", "BF16", "U8"};
    return (unsigned)dtype < sizeof names / sizeof names[0] ? names[dtype] : "?";
}

static clattn_status prepare_variant(clattn_ctx *ctx, const clattn__matmul_shape *shape,
                                     const clattn_tuning *t, clattn__matmul_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->shape = *shape;
    if (!matmul_dtype(shape->a_dtype) || !matmul_dtype(shape->b_dtype) ||
        !matmul_dtype(shape->c_dtype))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            OP ": dtypes (a %d, b %d, c %d) must each be F32, F16 or BF16",
                            (int)shape->a_dtype, (int)shape->b_dtype, (int)shape->c_dtype);
    const bool vec = t->matmul_vec != 0;
    /* matmul_vec reads B as panels of float (pack_b writes them into scratch; see
     * read_b_in_place for the one case it reads B itself). */
    plan->panel = vec ? (size_t)t->vec_nv * t->vec_width : 0;
    const size_t panels = vec ? (shape->n + plan->panel - 1) / plan->panel : 0;
    size_t entries = 0, bytes = 0;
    if (!clattn__mul(shape->batch[0], shape->batch[1], &entries))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, OP ": %zu x %zu batches overflow size_t",
                            shape->batch[0], shape->batch[1]);
    /* A bound too large for size_t (in bytes) is left to the caller's workspace arithmetic
     * to refuse, which names what the workspace holds. */
    if (vec &&
        (!clattn__product(&plan->scratch_floats, 4, entries, panels, plan->panel, shape->k) ||
         !clattn__mul(plan->scratch_floats, sizeof(float), &bytes)))
        plan->scratch_floats = SIZE_MAX;

    clattn_status status;
    if (vec) {
        const matmul_vec_switches sw = {.A_DTYPE = shape->a_dtype,
                                        .C_DTYPE = shape->c_dtype,
                                        .VEC_NV = t->vec_nv,
                                        .VEC_RB = t->vec_rb,
                                        .VEC_KC = t->vec_kc};
        const pack_b_switches pack = {.B_DTYPE = shape->b_dtype, .VEC_NV = t->vec_nv};
        if (!(status = clattn__family_kernel(ctx, &matmul_vec_family, "matmul_vec", &sw, NULL, 0,
                                             &plan->kernel)))
            status =
                clattn__family_kernel(ctx, &pack_b_family, "pack_b", &pack, NULL, 0, &plan->pack);
    } else {
        const matmul_switches sw = {
            .A_DTYPE = shape->a_dtype, .B_DTYPE = shape->b_dtype, .C_DTYPE = shape->c_dtype};
        status = clattn__family_kernel(ctx, &matmul_family, "matmul", &sw, NULL, 0, &plan->kernel);
    }
    if (status != CLATTN_SUCCESS)
        return status;

    if (vec) {
        const size_t rows = (size_t)t->vec_rm * t->vec_rb; /* per work-item */
        plan->local[0] = t->vec_wg, plan->local[1] = 1;
        plan->global[0] =
            (((shape->m + rows - 1) / rows + plan->local[0] - 1) / plan->local[0]) * plan->local[0];
        plan->global[1] = panels;
    } else {
        plan->local[0] = t->tile_n / t->wpt_n, plan->local[1] = t->tile_m / t->wpt_m;
        plan->global[0] = ((shape->n + t->tile_n - 1) / t->tile_n) * plan->local[0];
        plan->global[1] = ((shape->m + t->tile_m - 1) / t->tile_m) * plan->local[1];
    }
    plan->local[2] = 1;
    plan->global[2] = entries; /* split into launches of MAX_BATCH_PER_LAUNCH by the enqueue */
    /* A device that caps the loop iterations of a work-item (loop_trip_limit, from the quirks
     * table) gets K in parts accumulated onto C: the first part with the caller's beta and
     * bias, the others with beta = 1 and no bias. A quarter of the limit leaves room for the
     * tiled kernel's ~2 trips per k and the loops outside its K loop; matmul_vec walks K once
     * per micro-tile (vec_rb times), with room for 2 trips per k. */
    plan->k_step = shape->k;
    if (t->loop_trip_limit) {
        plan->k_step = t->loop_trip_limit / (vec ? 8 * t->vec_rb : 4);
        if (plan->k_step == 0)
            plan->k_step = 1;
    }
    return CLATTN_SUCCESS;
}

clattn_status clattn__matmul_prepare(clattn_ctx *ctx, const clattn__matmul_shape *shape,
                                     clattn__matmul_plan *plan)
{
    /* Self-validation's ladder (core/validate.h): matmul_vec where the tuning asks for it,
     * else (or when it fails on this device) the tiled kernel. */
    clattn_tuning tuning = ctx->tuning;
    for (;;) {
        clattn_status status = prepare_variant(ctx, shape, &tuning, plan);
        if (status == CLATTN_SUCCESS)
            status = clattn__matmul_trust(ctx, plan);
        if (status == CLATTN_SUCCESS || !tuning.matmul_vec || !clattn__variant_fallible(status))
            return status;
        tuning.matmul_vec = 0;
    }
}

/* A batch stride as the kernels take it: 0 where the operand has one matrix along that dim. */
static cl_ulong batch_stride(const clattn__view *v, int d)
{
    return v->dims[d] > 1 ? (cl_ulong)v->strides[d] : 0;
}

/* Whether matmul_vec reads b where it lies instead of a packed copy: an F32 B stored K x N
 * whose columns fill whole panels and whose rows are short enough (at most two panels apart)
 * that a panel's rows do not fall on the same cache sets. */
static bool read_b_in_place(const clattn__matmul_plan *plan, const clattn__view *b)
{
    return b->dtype == CLATTN_DTYPE_F32 && !plan->shape.trans_b &&
           plan->shape.n % plan->panel == 0 && b->strides[2] <= 2 * plan->panel;
}

/* The number of distinct matrices of b (a batch dim of size 1 or stride 0 has one). */
static size_t distinct_b(const clattn__view *b)
{
    return (batch_stride(b, 0) ? b->dims[0] : 1) * (batch_stride(b, 1) ? b->dims[1] : 1);
}

/* Enqueues pack_b for every distinct matrix of b into panels of float at scratch; *bp is the
 * view of the copy (dims[2], dims[3] = K, N; strides[2] = the panel width, the floats from one
 * k to the next). */
static clattn_status pack_b(clattn_chain *chain, const clattn__matmul_plan *plan,
                            const clattn__view *b, clattn__scratch scratch, clattn__view *bp)
{
    const cl_uint n = (cl_uint)plan->shape.n, k = (cl_uint)plan->shape.k;
    const cl_int trans = plan->shape.trans_b;
    const cl_ulong src_batch0 = batch_stride(b, 0), src_batch1 = batch_stride(b, 1);
    const size_t copies0 = src_batch0 ? b->dims[0] : 1, copies1 = src_batch1 ? b->dims[1] : 1;
    const cl_ulong batch1 = copies1, ld = b->strides[2], src_offset = b->offset;
    const cl_ulong dst_offset = scratch.offset;
    const size_t panel = plan->panel, padded = ((n + panel - 1) / panel) * panel;
    const size_t pack_k = CLATTN_MATMUL_PACK_K; /* rows of a panel per work-item (params.h) */
    const size_t local[3] = {1, 1, 1};
    size_t global[3] = {(k + pack_k - 1) / pack_k, padded / panel, 0};
    clattn_status status = CLATTN_SUCCESS;
    for (size_t first = 0; first < copies0 * copies1 && status == CLATTN_SUCCESS;
         first += MAX_BATCH_PER_LAUNCH) {
        const cl_ulong batch_base = first;
        const size_t left = copies0 * copies1 - first;
        global[2] = left < MAX_BATCH_PER_LAUNCH ? left : MAX_BATCH_PER_LAUNCH;
        const clattn_arg args[] = {
            CLATTN_ARG(n),          CLATTN_ARG(k),           CLATTN_ARG(batch1),
            CLATTN_ARG(batch_base), CLATTN_ARG(b->mem),      CLATTN_ARG(src_offset),
            CLATTN_ARG(src_batch0), CLATTN_ARG(src_batch1),  CLATTN_ARG(ld),
            CLATTN_ARG(trans),      CLATTN_ARG(scratch.mem), CLATTN_ARG(dst_offset),
        };
        status = clattn__launch_kernel(chain, plan->pack, "matmul (pack b)", args,
                                       sizeof args / sizeof args[0], 3, global, local);
    }
    *bp = (clattn__view){.mem = scratch.mem, .offset = scratch.offset, .dtype = CLATTN_DTYPE_F32};
    bp->dims[0] = copies0, bp->dims[1] = copies1, bp->dims[2] = k, bp->dims[3] = n;
    bp->strides[0] = copies1 * padded * k, bp->strides[1] = padded * k, bp->strides[2] = panel;
    bp->strides[3] = 1;
    return status;
}

clattn_status clattn__matmul_enqueue(clattn_chain *chain, const clattn__matmul_plan *plan,
                                     const clattn__view *a, const clattn__view *b,
                                     const clattn__view *bias, const clattn__view *c, float alpha,
                                     float beta, clattn__scratch scratch)
{
    const clattn__matmul_shape *shape = &plan->shape;
    const bool vec = plan->panel != 0;
    const cl_uint m = (cl_uint)shape->m, n = (cl_uint)shape->n, k = (cl_uint)shape->k;
    const cl_ulong batch1 = shape->batch[1];
    const cl_ulong b_group = shape->b_group > 1 ? shape->b_group : 1;
    const size_t entries = shape->batch[0] * shape->batch[1];
    const cl_int trans_a = shape->trans_a;
    cl_int trans_b = shape->trans_b;
    const cl_int has_bias = shape->has_bias && bias != NULL && bias->mem != NULL;
    const cl_ulong bias_offset = has_bias ? bias->offset : 0;
    const cl_mem bias_mem = has_bias ? bias->mem : a->mem; /* any valid buffer; never read */
    const clattn_ctx *ctx = chain->ctx;
    clattn_status status = CLATTN_SUCCESS;
    clattn__view packed;
    /* matmul_vec: floats from one panel of B to the next (in place: the panel's width). */
    cl_ulong b_panel = plan->panel;
    if (vec && !read_b_in_place(plan, b)) {
        status = pack_b(chain, plan, b, scratch, &packed);
        b = &packed;
        b_panel = (cl_ulong)plan->panel * k;
    }
    if (vec)
        trans_b = 0;
    const cl_ulong a_batch0 = batch_stride(a, 0), a_batch1 = batch_stride(a, 1);
    const cl_ulong b_batch0 = batch_stride(b, 0), b_batch1 = batch_stride(b, 1);
    const cl_ulong c_batch0 = batch_stride(c, 0), c_batch1 = batch_stride(c, 1);
    const cl_ulong lda = a->strides[2], ldb = b->strides[2], ldc = c->strides[2];
    const cl_ulong c_offset = c->offset;
    const size_t k_step = plan->k_step ? plan->k_step : k;
    const size_t k_parts = (k + k_step - 1) / k_step;
    const size_t batch_parts = (entries + MAX_BATCH_PER_LAUNCH - 1) / MAX_BATCH_PER_LAUNCH;
    for (size_t part = 0; part < k_parts * batch_parts && status == CLATTN_SUCCESS; ++part) {
        const cl_uint k0 = (cl_uint)((part / batch_parts) * k_step);
        const size_t first = (part % batch_parts) * MAX_BATCH_PER_LAUNCH;
        const cl_ulong batch_base = first;
        const cl_uint k_part = k - k0 < k_step ? k - k0 : (cl_uint)k_step;
        const cl_float beta_part = k0 == 0 ? beta : 1.0f;
        const cl_int bias_part = k0 == 0 ? has_bias : 0;
        /* Element k0 of op(A)'s rows and of op(B)'s columns. */
        const cl_ulong a_offset = a->offset + k0 * (trans_a ? lda : 1);
        const cl_ulong b_offset = b->offset + k0 * (trans_b ? 1 : ldb);
        const size_t global[3] = {plan->global[0], plan->global[1],
                                  entries - first < MAX_BATCH_PER_LAUNCH ? entries - first
                                                                         : MAX_BATCH_PER_LAUNCH};
        /* matmul_vec streams an F32 C of at least vec_stream KiB per launch past the caches. */
        const size_t launch_kib = (size_t)m * n / 256 * global[2];
        const clattn_matmul_params params = {
            .batch1 = batch1,
            .batch_base = batch_base,
            .a_offset = a_offset,
            .a_batch0 = a_batch0,
            .a_batch1 = a_batch1,
            .lda = lda,
            .b_offset = b_offset,
            .b_batch0 = b_batch0,
            .b_batch1 = b_batch1,
            .ldb = ldb,
            .b_panel = b_panel,
            .c_offset = c_offset,
            .c_batch0 = c_batch0,
            .c_batch1 = c_batch1,
            .ldc = ldc,
            .bias_offset = bias_offset,
            .b_group = b_group,
            .M = m,
            .N = n,
            .K = k_part,
            .trans_a = trans_a,
            .trans_b = trans_b,
            .alpha = alpha,
            .beta = beta_part,
            .has_bias = bias_part,
            .stream_c = vec && shape->c_dtype == CLATTN_DTYPE_F32 && ctx->tuning.vec_stream != 0 &&
                        launch_kib >= ctx->tuning.vec_stream};
        const clattn_arg args[] = {CLATTN_ARG(a->mem), CLATTN_ARG(b->mem), CLATTN_ARG(c->mem),
                                   CLATTN_ARG(bias_mem), CLATTN_ARG(params)};
        status = clattn__launch_kernel(chain, plan->kernel, vec ? "matmul_vec" : "matmul", args,
                                       sizeof args / sizeof args[0], 3, global, plan->local);
    }
    return status;
}

/* ---------------------------------------------------------------------------------------------
 * clattn_matmul: the one-shot public call
 * ------------------------------------------------------------------------------------------- */

/* Elements a view spans: 1 + the highest element offset its strides reach; false on
 * overflow. (Private to matmul.c until host/core/tensor.c offers the shared one.) */
static bool view_extent(const clattn__view *v, size_t *out)
{
    size_t extent = 1;
    for (int d = 0; d < 4; ++d) {
        size_t reach = 0;
        if (!clattn__mul(v->dims[d] - 1, v->strides[d], &reach) ||
            !clattn__add(extent, reach, &extent))
            return false;
    }
    *out = extent;
    return true;
}

/* Resolves tensor t (named `name`, of rank min_rank .. max_rank) into a 4-d right-aligned view
 * with explicit strides, and checks its dtype, dims, last stride and buffer extent. */
static clattn_status operand_view(clattn_ctx *ctx, const char *name, const clattn_tensor *t,
                                  int min_rank, int max_rank, bool any_dtype, clattn__view *v)
{
    if (t->rank < min_rank || t->rank > max_rank) {
        char wanted[32];
        if (min_rank == max_rank)
            snprintf(wanted, sizeof wanted, "%d", min_rank);
        else
            snprintf(wanted, sizeof wanted, "%d to %d", min_rank, max_rank);
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            OP ": %s has rank %d; it must have rank %s", name, t->rank, wanted);
    }
    if (t->mem == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, OP ": %s has no buffer (mem is NULL)",
                            name);
    const size_t elem_size = clattn_dtype_size(t->dtype);
    if (elem_size == 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            OP ": %s has dtype %d, which is not a clattn_dtype", name,
                            (int)t->dtype);
    if (any_dtype ? !matmul_dtype(t->dtype) : t->dtype != CLATTN_DTYPE_F32)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, OP ": %s has dtype %s; %s", name,
                            dtype_name(t->dtype),
                            any_dtype ? "matmul takes F32, F16 or BF16" : "it must be F32");
    bool packed = true;
    for (int d = 0; d < t->rank; ++d) {
        if (t->dims[d] == 0)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                OP ": %s has dims[%d]=0: every dimension must be at least 1", name,
                                d);
        if (t->strides[d] != 0)
            packed = false;
    }
    memset(v, 0, sizeof *v);
    v->mem = t->mem;
    v->offset = t->offset;
    v->dtype = t->dtype;
    const int shift = 4 - t->rank;
    size_t step = 1; /* the packed stride of the dim being filled */
    for (int d = 3; d >= 0; --d) {
        v->dims[d] = d < shift ? 1 : t->dims[d - shift];
        v->strides[d] = d < shift ? 0 : packed ? step : t->strides[d - shift];
        if (packed && d >= shift && !clattn__mul(step, v->dims[d], &step))
            return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, OP ": the elements of %s overflow size_t",
                                name);
    }
    if (v->strides[3] != 1)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            OP ": %s has stride %zu along its last dim; the kernels need 1 "
                               "(contiguous rows)",
                            name, v->strides[3]);
    size_t extent = 0;
    if (!view_extent(v, &extent))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                            OP ": %s: the elements its strides reach overflow size_t", name);
    return clattn__check_tensor(ctx, OP, name, *t, extent, elem_size, true);
}

/* Checks that the batch dims of operand v (named name) are 1 or equal C's. */
static clattn_status check_batch(clattn_ctx *ctx, const char *name, const clattn__view *v,
                                 const clattn__view *c)
{
    for (int d = 0; d < 2; ++d)
        if (v->dims[d] != 1 && v->dims[d] != c->dims[d])
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                OP ": %s has batch dims (%zu, %zu) but c has (%zu, %zu): each must "
                                   "be 1 (broadcast) or equal c's",
                                name, v->dims[0], v->dims[1], c->dims[0], c->dims[1]);
    return CLATTN_SUCCESS;
}

/* Checks that no two elements of the output c share an address along a dim: a row stride of
 * at least n, nonzero batch strides where a batch dim is above 1. */
static clattn_status check_output(clattn_ctx *ctx, const clattn__view *c)
{
    if (c->dims[2] > 1 && c->strides[2] < c->dims[3])
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            OP ": c has row stride %zu but %zu columns: its rows would overlap",
                            c->strides[2], c->dims[3]);
    for (int d = 0; d < 2; ++d)
        if (c->dims[d] > 1 && c->strides[d] == 0)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                OP ": c has batch stride 0 along a batch dim of %zu: every entry "
                                   "would write the same matrix",
                                c->dims[d]);
    return CLATTN_SUCCESS;
}

/* Validates the operands and fills the plan's shape and the four views. */
static clattn_status check_matmul(clattn_ctx *ctx, const clattn_matmul_desc *desc,
                                  const clattn_tensor *a, const clattn_tensor *b,
                                  const clattn_tensor *bias, const clattn_tensor *c,
                                  clattn__matmul_shape *shape, clattn__view views[4])
{
    clattn__view *va = &views[0], *vb = &views[1], *vbias = &views[2], *vc = &views[3];
    if (desc->struct_size != sizeof(clattn_matmul_desc))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            OP ": desc->struct_size=%zu but sizeof(clattn_matmul_desc) is %zu "
                               "in this clattn: set struct_size = sizeof(clattn_matmul_desc)",
                            desc->struct_size, sizeof(clattn_matmul_desc));
    const clattn_tensor *const required[3] = {a, b, c};
    static const char *const names[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; ++i)
        if (required[i] == NULL)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, OP ": %s is NULL", names[i]);
    clattn_status status = CLATTN_SUCCESS;
    if ((status = operand_view(ctx, "a", a, 2, 4, true, va)) ||
        (status = operand_view(ctx, "b", b, 2, 4, true, vb)) ||
        (status = operand_view(ctx, "c", c, 2, 4, true, vc)))
        return status;
    const bool has_bias = bias != NULL && (bias->rank != 0 || bias->mem != NULL);
    memset(vbias, 0, sizeof *vbias);
    if (has_bias && (status = operand_view(ctx, "bias", bias, 1, 1, false, vbias)))
        return status;

    const bool trans_a = desc->trans_a != 0, trans_b = desc->trans_b != 0;
    const size_t m = trans_a ? va->dims[3] : va->dims[2];
    const size_t k = trans_a ? va->dims[2] : va->dims[3];
    const size_t b_k = trans_b ? vb->dims[3] : vb->dims[2];
    const size_t n = trans_b ? vb->dims[2] : vb->dims[3];
    if (b_k != k)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            OP ": b has %zu %s as stored but op(A) has k=%zu columns%s", b_k,
                            trans_b ? "columns" : "rows", k,
                            trans_b ? " (trans_b: b is stored n x k)" : "");
    if (vc->dims[2] != m || vc->dims[3] != n)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            OP ": c is %zu x %zu as stored but op(A) * op(B) is m x n = %zu x %zu",
                            vc->dims[2], vc->dims[3], m, n);
    if (has_bias && vbias->dims[3] != n)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            OP ": bias has %zu elements but c has n=%zu columns", vbias->dims[3],
                            n);
    if ((status = check_batch(ctx, "a", va, vc)) || (status = check_batch(ctx, "b", vb, vc)) ||
        (status = check_output(ctx, vc)))
        return status;
    const size_t dims[3] = {m, n, k};
    static const char *const dim_names[3] = {"m", "n", "k"};
    if ((status = clattn__check_dims(ctx, OP, dims, dim_names, 3, true)))
        return status;
    *shape = (clattn__matmul_shape){
        .m = m,
        .n = n,
        .k = k,
        .batch = {vc->dims[0], vc->dims[1]},
        .trans_a = trans_a,
        .trans_b = trans_b,
        .a_dtype = va->dtype,
        .b_dtype = vb->dtype,
        .c_dtype = vc->dtype,
        .has_bias = has_bias,
    };
    return CLATTN_SUCCESS;
}

clattn_status clattn_matmul(clattn_ctx *ctx, const clattn_matmul_desc *desc, const clattn_tensor *a,
                            const clattn_tensor *b, const clattn_tensor *bias,
                            const clattn_tensor *c, cl_uint num_wait, const cl_event *wait,
                            cl_event *event)
{
    clattn_status status = clattn__entry(ctx, OP, desc, num_wait, wait, event);
    if (status != CLATTN_SUCCESS)
        return status;
    clattn__matmul_shape shape;
    clattn__view views[4];
    status = check_matmul(ctx, desc, a, b, bias, c, &shape, views);
    if (status != CLATTN_SUCCESS)
        return status;
    clattn_chain chain;
    clattn__matmul_plan plan;
    clattn__scratch scratch = {NULL, 0};
    status = clattn__begin(ctx, OP, &chain, NULL, false, num_wait, wait);
    if (status == CLATTN_SUCCESS)
        status = clattn__matmul_prepare(ctx, &shape, &plan);
    if (status == CLATTN_SUCCESS && plan.panel != 0 && !read_b_in_place(&plan, &views[1])) {
        /* Only b's distinct matrices are packed: fewer than the plan's bound when b is
         * broadcast over a batch dim. */
        const size_t padded = ((shape.n + plan.panel - 1) / plan.panel) * plan.panel;
        size_t bytes = 0;
        if (!clattn__product(&bytes, 4, distinct_b(&views[1]), padded, shape.k, sizeof(float)))
            status = clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                                  OP ": the packed copy of b overflows size_t");
        else
            status = clattn__workspace(ctx, OP, CLATTN_WS_MATMUL_BT, bytes, &scratch.mem);
    }
    if (status == CLATTN_SUCCESS)
        status = clattn__matmul_enqueue(&chain, &plan, &views[0], &views[1],
                                        shape.has_bias ? &views[2] : NULL, &views[3], desc->alpha,
                                        desc->beta, scratch);
    return clattn__end(OP, &chain, status, event);
}

/* ---- matmul -------------------------------------------------------------------------------- */

static clattn_status matmul_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const clattn__matmul_plan *prepared = unit;
    clattn__matmul_shape shape = prepared->shape;
    shape.m = 37;
    shape.n = (prepared->panel ? prepared->panel : 16) + 5;
    shape.k = 19;
    shape.batch[0] = 1;
    shape.batch[1] = 2;
    shape.b_group = 1;
    clattn__matmul_plan run;
    clattn_status status = clattn__matmul_prepare(ctx, &shape, &run);
    if (status != CLATTN_SUCCESS)
        return status;
    run.kernel = prepared->kernel; /* the kernels judged, whatever prepare found */
    run.pack = prepared->pack;
    const size_t m = shape.m, n = shape.n, k = shape.k, na = 2 * m * k, nb = 2 * k * n;
    clattn__probe_rng rng = {0x3a7a11ULL + n};
    clattn__probe_mem pm = {.count = 0};
    double *a = malloc((na + nb + n + 2 * m * n) * sizeof(double));
    unsigned char *bytes = malloc(4 * (na + nb + n + 2 * m * n) + 4);
    cl_mem ma = NULL, mb = NULL, mbias = NULL, mc = NULL, scratch = NULL;
    if (!a || !bytes) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    double *b = a + na, *bias = b + nb, *want = bias + n;
    for (size_t i = 0; i < na + nb + n; ++i)
        a[i] = clattn__probe_grid(&rng, CLATTN_DTYPE_F32);
    clattn__probe_encode(shape.a_dtype, a, na, bytes);
    if ((status =
             clattn__probe_upload(ctx, &pm, bytes, clattn__probe_bytes(shape.a_dtype, na), &ma)))
        goto done;
    clattn__probe_encode(shape.b_dtype, b, nb, bytes);
    if ((status =
             clattn__probe_upload(ctx, &pm, bytes, clattn__probe_bytes(shape.b_dtype, nb), &mb)))
        goto done;
    clattn__probe_encode(CLATTN_DTYPE_F32, bias, n, bytes);
    if ((status = clattn__probe_upload(ctx, &pm, bytes, 4 * n, &mbias)) ||
        (status = clattn__probe_upload(ctx, &pm, NULL,
                                       clattn__probe_bytes(shape.c_dtype, 2 * m * n), &mc)) ||
        (status =
             clattn__probe_upload(ctx, &pm, NULL, run.scratch_floats * sizeof(float), &scratch)))
        goto done;
    const clattn__view va = shape.trans_a ? clattn__probe_view(ma, shape.a_dtype, 1, 2, k, m)
                                          : clattn__probe_view(ma, shape.a_dtype, 1, 2, m, k);
    const clattn__view vb = shape.trans_b ? clattn__probe_view(mb, shape.b_dtype, 1, 2, n, k)
                                          : clattn__probe_view(mb, shape.b_dtype, 1, 2, k, n);
    const clattn__view vbias = clattn__probe_view(mbias, CLATTN_DTYPE_F32, 1, 1, 1, n);
    const clattn__view vc = clattn__probe_view(mc, shape.c_dtype, 1, 2, m, n);
    clattn_chain chain = clattn__probe_chain(ctx);
    status = clattn__matmul_enqueue(&chain, &run, &va, &vb, &vbias, &vc, 0.5f, 0.0f,
                                    (clattn__scratch){scratch, 0});
    if (status == CLATTN_SUCCESS)
        status = clattn__probe_download(&chain, mc, clattn__probe_bytes(shape.c_dtype, 2 * m * n),
                                        bytes);
    clattn__chain_push(&chain, NULL);
    for (size_t e = 0; e < 2; ++e)
        for (size_t i = 0; i < m; ++i)
            for (size_t j = 0; j < n; ++j) {
                double acc = 0.0;
                for (size_t c = 0; c < k; ++c)
                    acc += a[e * m * k + (shape.trans_a ? c * m + i : i * k + c)] *
                           b[e * k * n + (shape.trans_b ? j * k + c : c * n + j)];
                want[(e * m + i) * n + j] = 0.5 * acc + (shape.has_bias ? bias[j] : 0.0);
            }
    if (status == CLATTN_SUCCESS) {
        size_t where = 0;
        r->tolerance = clattn__probe_tolerance(shape.c_dtype) * 8;
        r->max_error = clattn__probe_max_error(shape.c_dtype, bytes, want, 2 * m * n, &where);
        snprintf(r->why, sizeof r->why, "c[%zu] of (2, %zu, %zu), k %zu", where, m, n, k);
    }
done:
    clattn__probe_release(&pm);
    free(a);
    free(bytes);
    return status;
}

clattn_status clattn__matmul_trust(clattn_ctx *ctx, clattn__matmul_plan *plan)
{
    cl_kernel *slots[2] = {&plan->kernel, &plan->pack};
    return clattn__trust(ctx, "matmul", slots, plan->pack ? 2 : 1, matmul_probe, plan);
}
