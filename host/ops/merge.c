/* kernels/merge.cl: two partial attention states merged by their log-sum-exp (the public
 * clattn_merge_states and the cascade's last step, attn/cascade.c). */
#include "ops.h"

#include <string.h>

/* The family (core/family.h); HEADS_WG: work-items per group (tuning key heads_wg). */
/* clang-format off */
#define MERGE_STATES_SWITCHES(X)                                                                   \
    X(HEADS_WG, 0, NULL) X(OA_DTYPE, 0, NULL) X(OB_DTYPE, 0, NULL) X(O_DTYPE, 0, NULL)
/* clang-format on */
CLATTN_FAMILY(merge_states, MERGE_STATES_SWITCHES, .sources = {"merge.cl"},
              .tuning_keys = "heads_wg");

clattn_status clattn__merge_prepare(clattn_ctx *ctx, const size_t rows[3], size_t dv,
                                    clattn_dtype oa_dtype, clattn_dtype ob_dtype,
                                    clattn_dtype o_dtype, clattn__merge_plan *plan)
{
    const merge_states_switches sw = {.HEADS_WG = ctx->tuning.heads_wg,
                                      .OA_DTYPE = oa_dtype,
                                      .OB_DTYPE = ob_dtype,
                                      .O_DTYPE = o_dtype};
    /* one work-item per row: a box of the rows' dims and 1 */
    const size_t box[4] = {rows[0], rows[1], rows[2], 1};
    const clattn_status status =
        clattn__elementwise_prepare(ctx, box, &merge_states_family, "merge_states", &sw, plan);
    plan->dims[3] = dv;
    return status;
}

/* A row view's (i0, i1, i2) strides: lse's 4-d view holds the rows in dims 1 .. 3. */
static void lse_fields(const clattn__view *v, cl_ulong *offset, cl_ulong *s0, cl_ulong *s1,
                       cl_ulong *s2)
{
    *offset = v->offset;
    *s0 = v->strides[1];
    *s1 = v->strides[2];
    *s2 = v->strides[3];
}

clattn_status clattn__merge_enqueue(clattn_chain *chain, const clattn__merge_plan *plan,
                                    const clattn__merge_io *io)
{
    clattn_merge_states_params p;
    memset(&p, 0, sizeof p);
    CLATTN__VIEW_FIELDS(&io->o_a, p, oa);
    CLATTN__VIEW_FIELDS(&io->o_b, p, ob);
    CLATTN__VIEW_FIELDS(&io->o, p, o);
    lse_fields(&io->lse_a, &p.la_offset, &p.la_s0, &p.la_s1, &p.la_s2);
    lse_fields(&io->lse_b, &p.lb_offset, &p.lb_s0, &p.lb_s1, &p.lb_s2);
    const bool has_lse = io->lse.mem != NULL;
    if (has_lse)
        lse_fields(&io->lse, &p.l_offset, &p.l_s0, &p.l_s1, &p.l_s2);
    p.d0 = (cl_uint)plan->dims[0];
    p.d1 = (cl_uint)plan->dims[1];
    p.d2 = (cl_uint)plan->dims[2];
    p.dv = (cl_uint)plan->dims[3];
    p.has_lse = has_lse;
    /* an absent lse: the kernel never writes it, any buffer stands in */
    const cl_mem lse = has_lse ? io->lse.mem : io->lse_a.mem;
    const clattn_arg args[] = {
        CLATTN_ARG(io->o_a.mem), CLATTN_ARG(io->lse_a.mem), CLATTN_ARG(io->o_b.mem),
        CLATTN_ARG(io->lse_b.mem), CLATTN_ARG(io->o.mem), CLATTN_ARG(lse), CLATTN_ARG(p),
    };
    return clattn__launch_kernel(chain, plan->kernel, "merge_states", args,
                                 sizeof args / sizeof args[0], 1, &plan->global, &plan->local);
}
