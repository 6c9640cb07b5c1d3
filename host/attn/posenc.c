/* Positional-encoding plans: out = x + PE(start + p), the sinusoidal table or a learned one. */
#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void clattn_posenc_desc_init(clattn_posenc_desc *desc)
{
    if (clattn__desc_reset(desc, sizeof *desc))
        desc->base = CLATTN_ROPE_BASE_DEFAULT;
}

/* Frequencies w_k = base^(-2k / dim), k < count, as float pairs (hi, lo) with hi + lo = w_k
 * to about 2^-48 (computed in double), in a device buffer (the sinusoid's, RoPE's). */
clattn_status clattn__make_frequencies(clattn_plan *plan, size_t count, size_t dim, double base)
{
    clattn_ctx *ctx = plan->ctx;
    float *pairs = malloc(2 * count * sizeof(float));
    if (pairs == NULL)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", plan->op);
    for (size_t k = 0; k < count; ++k) {
        const double w = pow(base, -2.0 * (double)k / (double)dim);
        pairs[2 * k] = (float)w;
        pairs[2 * k + 1] = (float)(w - (double)pairs[2 * k]);
    }
    const clattn_status status =
        clattn__plan_upload(plan, &plan->angles.freq, pairs, 2 * count * sizeof(float),
                            "the frequencies");
    free(pairs);
    return status;
}

clattn_status clattn__plan_upload(clattn_plan *plan, cl_mem *mem, const void *host, size_t bytes,
                                  const char *what)
{
    cl_int err = CL_SUCCESS;
    *mem = NULL;
    if (clattn__fault(CLATTN_FAULT_ALLOC))
        err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
    else
        *mem = clCreateBuffer(plan->ctx->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes,
                              (void *)host, &err);
    if (err == CL_SUCCESS)
        return CLATTN_SUCCESS;
    if (*mem)
        clReleaseMemObject(*mem);
    *mem = NULL;
    return clattn__fail(plan->ctx, (clattn_status)err, "%s: clCreateBuffer (%s, %zu bytes): %s (%d)",
                        plan->op, what, bytes, clattn__cl_error_name(err), (int)err);
}

clattn_status clattn__plan_base(clattn_plan *plan, const char *name, double given, double *base)
{
    *base = given;
    if (given > 0.0 && isfinite(given))
        return CLATTN_SUCCESS;
    return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT,
                        "%s: %s=%g: give a finite base > 0 (CLATTN_ROPE_BASE_DEFAULT = 10000 is "
                        "the usual one)",
                        plan->op, name, given);
}

static clattn_status create(clattn_plan *plan, const void *any)
{
    const clattn_posenc_desc *desc = any;
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    const clattn__layout *x = &l[R_Q], *out = &l[R_OUT], *table = &l[R_POS_TABLE];
    if ((unsigned)desc->kind > CLATTN_POSENC_TABLE)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: kind=%d is not a clattn_posenc_kind", op, (int)desc->kind);
    if (!out->present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: out is required", op);
    if (out->rank < 2)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: out has rank %d; expected (seq, dim), (batch, seq, dim) or a "
                            "rank-4 (.., .., seq, dim)",
                            op, out->rank);
    clattn_status status;
    if (x->present &&
        (status = clattn__layout_expect(ctx, op, "out", out, x->rank, x->dims, "x's dims")))
        return status;
    clattn__view view;
    clattn__view_of(out, &view);
    const size_t seq = view.dims[2], dim = view.dims[3];
    size_t end = 0;
    if (!clattn__add(desc->start, seq, &end))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: start + seq overflows size_t", op);
    if (desc->kind == CLATTN_POSENC_SINUSOIDAL) {
        if (table->present)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: pos_table is given but kind is SINUSOIDAL (TABLE adds it)",
                                op);
        if (end > ((size_t)1 << 24))
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: positions %zu .. %zu: the sinusoid takes positions below "
                                "2^24 = 16777216",
                                op, desc->start, end - 1);
        double base = 0.0;
        if ((status = clattn__plan_base(plan, "base", desc->base, &base)) ||
            (status = clattn__make_frequencies(plan, (dim + 1) / 2, dim, base)))
            return status;
    } else {
        if (!table->present)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: kind TABLE needs pos_table (max_len, dim)", op);
        if (table->rank != 2 || table->dims[1] != dim)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                "%s: pos_table must be (max_len, dim = %zu); it has rank %d%s", op,
                                dim, table->rank, table->rank == 2 ? " and another dim" : "");
        if (end > table->dims[0])
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                "%s: positions %zu .. %zu, but pos_table has %zu rows (max_len)",
                                op, desc->start, end - 1, table->dims[0]);
    }
    plan->posenc.start = desc->start;
    const clattn_dtype x_dtype = x->present ? x->dtype : CLATTN_DTYPE_F32;
    const clattn_dtype table_dtype = table->present ? table->dtype : CLATTN_DTYPE_F32;
    return clattn__posenc_prepare(ctx, view.dims, x_dtype, out->dtype, table_dtype,
                                  &plan->posenc.op); /* no workspace */
}

static clattn_status posenc_execute(clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                                    cl_mem workspace, clattn_chain *chain)
{
    (void)workspace; /* no workspace */
    clattn__view x, out, table;
    static const clattn__role roles[3] = {R_Q, R_OUT, R_POS_TABLE};
    clattn__view *const views[3] = {&x, &out, &table};
    clattn__bind_views(plan, mems, offsets, 3, roles, views);
    return clattn__posenc_enqueue(chain, &plan->posenc.op, &x, &out, &table,
                                               plan->angles.freq, plan->posenc.start);
}

CLATTN__PLAN_KIND(posenc, CLATTN__POSENC, clattn_posenc_desc, create, posenc_execute,
                  clattn_posenc_plan_create, "posenc", clattn__x_role_names,
                  CLATTN__ROLE(R_Q) | CLATTN__ROLE(R_OUT) | CLATTN__ROLE(R_POS_TABLE))
