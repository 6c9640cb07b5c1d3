/* kernels/merge.cl: two partial attention states merged by their log-sum-exp (the public
 * clattn_merge_states and the cascade's last step, attn/cascade.c). */
#include "ops.h"
#include "probe.h" /* self-validation (core/validate.h) */

#include <math.h>
#include <stdio.h>
#include <string.h>

static clattn_status merge_trust(clattn_ctx *ctx, clattn__merge_plan *plan, clattn_dtype oa,
                                 clattn_dtype ob, clattn_dtype o);

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
    /* self-validation (core/validate.h; ops/probe.c) */
    return status != CLATTN_SUCCESS ? status : merge_trust(ctx, plan, oa_dtype, ob_dtype, o_dtype);
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

/* ---- self-validation: merge_states over (2, 3, 5) rows of 7 columns, a side empty on some
 * rows (lse -inf) and both on one, against the float64 merge of the same grid values. */
typedef struct merge_unit {
    clattn__merge_plan *plan;
    clattn_dtype oa, ob, o;
} merge_unit;

enum { PROBE_ROWS = 30, PROBE_COLS = 7 };

/* Row r's lse on each side: -inf on every fourth row of a, every third of b (row 0 both). */
static void probe_lse(clattn__probe_rng *rng, double *la, double *lb)
{
    for (size_t r = 0; r < PROBE_ROWS; ++r) {
        la[r] = r % 4 == 0 ? -INFINITY : 4.0 * clattn__probe_grid(rng, CLATTN_DTYPE_F32);
        lb[r] = r % 3 == 0 ? -INFINITY : 4.0 * clattn__probe_grid(rng, CLATTN_DTYPE_F32);
    }
}

static void probe_reference(const double *xa, const double *la, const double *xb,
                            const double *lb, double *want)
{
    for (size_t r = 0; r < PROBE_ROWS; ++r) {
        const double m = fmax(la[r], lb[r]);
        const double wa = la[r] == -INFINITY ? 0.0 : exp(la[r] - m);
        const double wb = lb[r] == -INFINITY ? 0.0 : exp(lb[r] - m);
        for (size_t c = 0; c < PROBE_COLS; ++c) {
            const size_t i = r * PROBE_COLS + c;
            want[i] = wa + wb > 0.0 ? (wa * xa[i] + wb * xb[i]) / (wa + wb) : 0.0;
        }
    }
}

static clattn_status merge_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const merge_unit *u = unit;
    const size_t n = PROBE_ROWS * PROBE_COLS;
    clattn__probe_rng rng = {0x5eedULL};
    clattn__probe_mem pm = {.count = 0};
    double *xa = clattn__probe_alloc(&pm, 3 * n * sizeof(double));
    double *lse = clattn__probe_alloc(&pm, 2 * PROBE_ROWS * sizeof(double));
    float *lse32 = clattn__probe_alloc(&pm, 2 * PROBE_ROWS * sizeof(float));
    unsigned char *host = clattn__probe_alloc(&pm, 3 * 4 * n);
    if (!xa || !lse || !lse32 || !host) {
        clattn__probe_release(&pm);
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
    }
    double *xb = xa + n, *want = xa + 2 * n;
    for (size_t i = 0; i < n; ++i) {
        xa[i] = clattn__probe_grid(&rng, u->oa);
        xb[i] = clattn__probe_grid(&rng, u->ob);
    }
    probe_lse(&rng, lse, lse + PROBE_ROWS);
    for (size_t i = 0; i < 2 * PROBE_ROWS; ++i)
        lse32[i] = (float)lse[i];
    probe_reference(xa, lse, xb, lse + PROBE_ROWS, want);
    clattn__merge_io io;
    cl_mem mems[4] = {NULL, NULL, NULL, NULL};
    clattn__probe_encode(u->oa, xa, n, host);
    clattn__probe_encode(u->ob, xb, n, host + 4 * n);
    clattn_status status;
    if ((status = clattn__probe_upload(ctx, &pm, host, clattn__probe_bytes(u->oa, n), &mems[0])) ||
        (status = clattn__probe_upload(ctx, &pm, host + 4 * n, clattn__probe_bytes(u->ob, n),
                                       &mems[1])) ||
        (status = clattn__probe_upload(ctx, &pm, lse32, 2 * PROBE_ROWS * sizeof(float),
                                       &mems[2])) ||
        (status = clattn__probe_upload(ctx, &pm, NULL, clattn__probe_bytes(u->o, n), &mems[3])))
        goto done;
    io.o_a = clattn__probe_view(mems[0], u->oa, 2, 3, 5, PROBE_COLS);
    io.o_b = clattn__probe_view(mems[1], u->ob, 2, 3, 5, PROBE_COLS);
    io.o = clattn__probe_view(mems[3], u->o, 2, 3, 5, PROBE_COLS);
    io.lse_a = clattn__probe_view(mems[2], CLATTN_DTYPE_F32, 1, 2, 3, 5);
    io.lse_b = io.lse_a;
    io.lse_b.offset = PROBE_ROWS;
    io.lse = (clattn__view){.mem = NULL};
    clattn__merge_plan run = *u->plan;
    const size_t rows[3] = {2, 3, 5};
    run.dims[0] = rows[0], run.dims[1] = rows[1], run.dims[2] = rows[2], run.dims[3] = PROBE_COLS;
    run.global = (PROBE_ROWS + run.local - 1) / run.local * run.local;
    clattn_chain chain = clattn__probe_chain(ctx);
    status = clattn__merge_enqueue(&chain, &run, &io);
    if (status == CLATTN_SUCCESS)
        status = clattn__probe_download(&chain, mems[3], clattn__probe_bytes(u->o, n), host);
    clattn__chain_push(&chain, NULL);
    if (status == CLATTN_SUCCESS) {
        size_t worst = 0;
        r->tolerance = clattn__probe_tolerance(u->o);
        r->max_error = clattn__probe_max_error(u->o, host, want, n, &worst);
        snprintf(r->why, sizeof r->why, "element %zu of (2, 3, 5, %d)", worst, PROBE_COLS);
    }
done:
    clattn__probe_release(&pm);
    return status;
}

static clattn_status merge_trust(clattn_ctx *ctx, clattn__merge_plan *plan, clattn_dtype oa,
                                 clattn_dtype ob, clattn_dtype o)
{
    merge_unit unit = {plan, oa, ob, o};
    return clattn__trust_one(ctx, "merge states", &plan->kernel, merge_probe, &unit);
}
