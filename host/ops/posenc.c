/* Positional encodings: variant and launch for kernels/posenc.cl. */
#include "ops.h"
#include "probe.h" /* self-validation (core/validate.h) */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The family (core/family.h); POSENC_WG: work-items per group (tuning key heads_wg). */
/* clang-format off */
#define POSENC_SWITCHES(X)                                                                         \
    X(POSENC_WG, 0, NULL) X(X_DTYPE, 0, NULL) X(O_DTYPE, 0, NULL) X(T_DTYPE, 0, NULL)
/* clang-format on */
CLATTN_FAMILY(posenc, POSENC_SWITCHES, .sources = {"posenc.cl"}, .tuning_keys = "heads_wg");

clattn_status clattn__posenc_prepare(clattn_ctx *ctx, const size_t dims[4], clattn_dtype x_dtype,
                                     clattn_dtype out_dtype, clattn_dtype table_dtype,
                                     clattn__posenc_plan *plan)
{
    const posenc_switches sw = {.POSENC_WG = ctx->tuning.heads_wg,
                                .X_DTYPE = x_dtype,
                                .O_DTYPE = out_dtype,
                                .T_DTYPE = table_dtype};
    const clattn_status status =
        clattn__elementwise_prepare(ctx, dims, &posenc_family, "posenc_add", &sw, plan);
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
        CLATTN__VIEW_FIELDS(x, params, x);
    CLATTN__VIEW_FIELDS(out, params, out);
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

/* ---- positional encodings (posenc.cl) ------------------------------------------------------ */

typedef struct posenc_unit {
    clattn__posenc_plan *plan;
    clattn_dtype x, out, table;
} posenc_unit;

/* Over (2, 3, 5, dim) from position 3: x + the sinusoid of grid frequencies, then a grid
 * table's rows without x. */
static clattn_status posenc_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const posenc_unit *u = unit;
    /* the width is a launch argument: at most 64 columns here */
    const size_t dim = clattn__probe_at_most(u->plan->dims[3], 64);
    const size_t dims[4] = {2, 3, 5, dim}, n = 30 * dim, start = 3;
    clattn__posenc_plan run;
    clattn_status status = clattn__posenc_prepare(ctx, dims, u->x, u->out, u->table, &run);
    if (status != CLATTN_SUCCESS)
        return status;
    run.kernel = u->plan->kernel;
    clattn__probe_rng rng = {0x9e5ULL + dim};
    clattn__probe_mem pm = {.count = 0};
    const size_t pairs = (dim + 1) / 2, rows = start + 5;
    double *x = clattn__probe_alloc(&pm, n * sizeof(double)),
           *want = clattn__probe_alloc(&pm, n * sizeof(double));
    double *table = clattn__probe_alloc(&pm, rows * dim * sizeof(double));
    float *freq = clattn__probe_alloc(&pm, 2 * pairs * sizeof(float));
    unsigned char *bytes = clattn__probe_alloc(&pm, 4 * (n > rows * dim ? n : rows * dim) + 8);
    cl_mem mx = NULL, mo = NULL, mt = NULL, mf = NULL;
    if (!x || !want || !table || !freq || !bytes) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    for (size_t i = 0; i < n; ++i)
        x[i] = clattn__probe_grid(&rng, u->x);
    for (size_t i = 0; i < rows * dim; ++i)
        table[i] = clattn__probe_grid(&rng, u->table);
    for (size_t j = 0; j < pairs; ++j) {
        freq[2 * j] = (float)((1 + clattn__probe_next(&rng) % 64) / 64.0);
        freq[2 * j + 1] = 0.0f;
    }
    clattn__probe_encode(u->x, x, n, bytes);
    if ((status = clattn__probe_upload(ctx, &pm, bytes, clattn__probe_bytes(u->x, n), &mx)) ||
        (status = clattn__probe_upload(ctx, &pm, NULL, clattn__probe_bytes(u->out, n), &mo)) ||
        (status = clattn__probe_upload(ctx, &pm, freq, 2 * pairs * sizeof(float), &mf)))
        goto done;
    clattn__probe_encode(u->table, table, rows * dim, bytes);
    if ((status =
             clattn__probe_upload(ctx, &pm, bytes, clattn__probe_bytes(u->table, rows * dim), &mt)))
        goto done;
    const clattn__view vx = clattn__probe_view(mx, u->x, 2, 3, 5, dim);
    const clattn__view vo = clattn__probe_view(mo, u->out, 2, 3, 5, dim);
    const clattn__view none = {0};
    const clattn__view vt = clattn__probe_view(mt, u->table, 1, 1, rows, dim);
    r->tolerance = clattn__probe_tolerance(u->out) * 4;
    r->max_error = 0.0;
    for (int pass = 0; pass < 2 && status == CLATTN_SUCCESS; ++pass) {
        for (size_t e = 0; e < n; ++e) {
            const size_t i = e % dim, p = e / dim % 5;
            const double t = (double)(start + p) * freq[2 * (i / 2)];
            want[e] = pass == 0 ? x[e] + (i & 1 ? cos(t) : sin(t)) : table[(start + p) * dim + i];
        }
        clattn_chain chain = clattn__probe_chain(ctx);
        status = clattn__posenc_enqueue(&chain, &run, pass == 0 ? &vx : &none, &vo,
                                        pass == 0 ? &none : &vt, pass == 0 ? mf : NULL, start);
        if (status == CLATTN_SUCCESS)
            status = clattn__probe_download(&chain, mo, clattn__probe_bytes(u->out, n), bytes);
        clattn__chain_push(&chain, NULL);
        size_t where = 0;
        const double err = status == CLATTN_SUCCESS
                               ? clattn__probe_max_error(u->out, bytes, want, n, &where)
                               : 0.0;
        if (err > r->max_error) {
            r->max_error = err;
            snprintf(r->why, sizeof r->why, "element %zu of (2, 3, 5, %zu), %s", where, dim,
                     pass == 0 ? "x + the sinusoid" : "the table");
        }
    }
done:
    clattn__probe_release(&pm);
    return status;
}

clattn_status clattn__posenc_trust(clattn_ctx *ctx, clattn__posenc_plan *plan, clattn_dtype x,
                                   clattn_dtype out, clattn_dtype table)
{
    posenc_unit unit = {plan, x, out, table};
    return clattn__trust_one(ctx, "positional encoding", &plan->kernel, posenc_probe, &unit);
}
