/* Rotary position embeddings: variant and launch for kernels/rope.cl. */
#include "ops.h"
#include "probe.h" /* self-validation (core/validate.h) */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The family (core/family.h); ROPE_WG: work-items per group (tuning key heads_wg). */
/* clang-format off */
#define ROPE_SWITCHES(X)                                                                           \
    X(ROPE_WG, 0, NULL) X(X_DTYPE, 0, NULL) X(O_DTYPE, 0, NULL) X(C_DTYPE, 0, NULL)
/* clang-format on */
CLATTN_FAMILY(rope, ROPE_SWITCHES, .sources = {"rope.cl"}, .tuning_keys = "heads_wg");

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
    const rope_switches sw = {.ROPE_WG = ctx->tuning.heads_wg,
                              .X_DTYPE = x_dtype,
                              .O_DTYPE = out_dtype,
                              .C_DTYPE = cache_dtype};
    const clattn_status status =
        clattn__family_kernel(ctx, &rope_family, op, &sw, NULL, 0, &plan->kernel);
    /* self-validation (core/validate.h; ops/probe.c) */
    return status != CLATTN_SUCCESS
               ? status
               : clattn__rope_trust(ctx, plan, x_dtype, out_dtype, cache_dtype);
}

clattn_status clattn__rope_enqueue(clattn_chain *chain, const clattn__rope_plan *plan,
                                   const clattn__rope_io *io)
{
    const clattn__rope_shape *shape = &plan->shape;
    const clattn__view *x = &io->x, *out = &io->out;
    clattn_rope_params params = {0};
    CLATTN__VIEW_FIELDS(x, params, x);
    CLATTN__VIEW_FIELDS(out, params, out);
    /* Absent operands: any valid buffer (never read). */
    const cl_mem cos_mem = io->cos.mem ? io->cos.mem : out->mem;
    const cl_mem sin_mem = io->sin.mem ? io->sin.mem : out->mem;
    const cl_mem pos_mem = io->position_ids.mem ? io->position_ids.mem : out->mem;
    const cl_mem freq_mem = io->freq ? io->freq : out->mem;
    params.cos_offset = io->cos.mem ? io->cos.offset : 0;
    params.sin_offset = io->sin.mem ? io->sin.offset : 0;
    /* Caches by position: (rows, rot / 2) views, strides [2] rows, [3] columns; by row:
     * (1, batch, seq, rot / 2). */
    params.c_s0 = io->cos.strides[1];
    params.c_s1 = io->cos.strides[2];
    params.c_s2 = io->cos.strides[3];
    params.cache_mode = shape->cache_mode;
    params.cache_rows = (cl_uint)io->cos.dims[2];
    params.pos_offset = io->position_ids.mem ? io->position_ids.offset : 0;
    params.pos_s0 = io->position_ids.strides[2];
    params.pos_s1 = io->position_ids.strides[3];
    params.has_position_ids = io->position_ids.mem != NULL;
    params.pairs = shape->pairs;
    params.heads = (cl_uint)shape->heads;
    params.seq = (cl_uint)shape->seq;
    params.dim = (cl_uint)shape->dim;
    params.rot = (cl_uint)shape->rot;
    params.start = shape->start;
    params.total = plan->total;
    const clattn_arg args[] = {CLATTN_ARG(x->mem),  CLATTN_ARG(out->mem), CLATTN_ARG(cos_mem),
                               CLATTN_ARG(sin_mem), CLATTN_ARG(pos_mem),  CLATTN_ARG(freq_mem),
                               CLATTN_ARG(params)};
    return clattn__launch_kernel(chain, plan->kernel, "rope", args, sizeof args / sizeof args[0], 1,
                                 &plan->global, &plan->local);
}

/* ---- rotary embeddings (rope.cl) ----------------------------------------------------------- */

typedef struct rope_unit {
    clattn__rope_plan *plan;
    clattn_dtype x, out, cache;
} rope_unit;

/* The plan's rotation (its pairs or halves, rot of dim, its cache mode) over (2, 3, 5, dim)
 * rows from position 3: angles pos * w_j for grid frequencies w_j, or grid cos and sin caches
 * (by position: 9 rows; by row). */
static clattn_status rope_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const rope_unit *u = unit;
    clattn__rope_shape shape = u->plan->shape;
    shape.batch = 2, shape.heads = 3, shape.seq = 5, shape.start = 3;
    /* the row's width and rotation are launch arguments: at most 64 columns here */
    shape.dim = clattn__probe_at_most(shape.dim, 64);
    shape.rot = clattn__probe_at_most(shape.rot, shape.dim) / 2 * 2;
    clattn__rope_plan run;
    clattn_status status = clattn__rope_prepare(ctx, &shape, u->x, u->out, u->cache, &run);
    if (status != CLATTN_SUCCESS)
        return status;
    run.kernel = u->plan->kernel;
    const size_t rows = 2 * 3 * 5, dim = shape.dim, half = shape.rot / 2, n = rows * dim;
    const size_t cache_rows = shape.cache_mode == 1 ? 9 : 10; /* by row: (2, 5) rows */
    clattn__probe_rng rng = {0x20beULL + dim};
    clattn__probe_mem pm = {.count = 0};
    double *x = clattn__probe_alloc(&pm, n * sizeof(double)),
           *want = clattn__probe_alloc(&pm, n * sizeof(double));
    double *c = clattn__probe_alloc(&pm, (2 * cache_rows * half + 1) * sizeof(double));
    float *freq = clattn__probe_alloc(&pm, (2 * half + 1) * sizeof(float));
    unsigned char *bytes =
        clattn__probe_alloc(&pm, 4 * (n > 2 * cache_rows * half ? n : 2 * cache_rows * half) + 8);
    clattn__rope_io io;
    memset(&io, 0, sizeof io);
    cl_mem mx = NULL, mo = NULL, mcos = NULL, msin = NULL;
    if (!x || !want || !c || !freq || !bytes) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    for (size_t i = 0; i < n; ++i)
        x[i] = clattn__probe_grid(&rng, u->x);
    for (size_t j = 0; j < half; ++j) {
        freq[2 * j] = (float)((1 + clattn__probe_next(&rng) % 64) / 64.0);
        freq[2 * j + 1] = 0.0f;
    }
    for (size_t i = 0; i < 2 * cache_rows * half; ++i)
        c[i] = clattn__probe_grid(&rng, u->cache);
    for (size_t row = 0; row < rows; ++row) {
        const size_t s = row % 5, b = row / 15, pos = 3 + s;
        const size_t at =
            shape.cache_mode == 1 ? (pos < cache_rows ? pos : cache_rows - 1) : b * 5 + s;
        for (size_t i = 0; i < dim; ++i)
            want[row * dim + i] = x[row * dim + i];
        for (size_t j = 0; j < half; ++j) {
            const double t = (double)pos * freq[2 * j];
            const double ct = shape.cache_mode ? c[at * half + j] : cos(t);
            const double st = shape.cache_mode ? c[cache_rows * half + at * half + j] : sin(t);
            const size_t i1 = shape.pairs ? 2 * j : j, i2 = shape.pairs ? 2 * j + 1 : j + half;
            const double x1 = x[row * dim + i1], x2 = x[row * dim + i2];
            want[row * dim + i1] = x1 * ct - x2 * st;
            want[row * dim + i2] = x1 * st + x2 * ct;
        }
    }
    clattn__probe_encode(u->x, x, n, bytes);
    if ((status = clattn__probe_upload(ctx, &pm, bytes, clattn__probe_bytes(u->x, n), &mx)) ||
        (status = clattn__probe_upload(ctx, &pm, NULL, clattn__probe_bytes(u->out, n), &mo)))
        goto done;
    if (shape.cache_mode) {
        clattn__probe_encode(u->cache, c, 2 * cache_rows * half, bytes);
        if ((status = clattn__probe_upload(
                 ctx, &pm, bytes, clattn__probe_bytes(u->cache, cache_rows * half), &mcos)) ||
            (status = clattn__probe_upload(
                 ctx, &pm, bytes + clattn__probe_bytes(u->cache, cache_rows * half),
                 clattn__probe_bytes(u->cache, cache_rows * half), &msin)))
            goto done;
        io.cos = shape.cache_mode == 1 ? clattn__probe_view(mcos, u->cache, 1, 1, cache_rows, half)
                                       : clattn__probe_view(mcos, u->cache, 1, 2, 5, half);
        io.sin = io.cos;
        io.sin.mem = msin;
    } else if ((status =
                    clattn__probe_upload(ctx, &pm, freq, 2 * half * sizeof(float), &io.freq))) {
        goto done;
    }
    io.x = clattn__probe_view(mx, u->x, 2, 3, 5, dim);
    io.out = clattn__probe_view(mo, u->out, 2, 3, 5, dim);
    clattn_chain chain = clattn__probe_chain(ctx);
    status = clattn__rope_enqueue(&chain, &run, &io);
    if (status == CLATTN_SUCCESS)
        status = clattn__probe_download(&chain, mo, clattn__probe_bytes(u->out, n), bytes);
    clattn__chain_push(&chain, NULL);
    if (status == CLATTN_SUCCESS) {
        size_t where = 0;
        r->tolerance = clattn__probe_tolerance(u->out) * 2;
        r->max_error = clattn__probe_max_error(u->out, bytes, want, n, &where);
        snprintf(r->why, sizeof r->why, "element %zu of (2, 3, 5, %zu)", where, dim);
    }
done:
    clattn__probe_release(&pm);
    return status;
}

clattn_status clattn__rope_trust(clattn_ctx *ctx, clattn__rope_plan *plan, clattn_dtype x,
                                 clattn_dtype out, clattn_dtype cache)
{
    rope_unit unit = {plan, x, out, cache};
    return clattn__trust_one(ctx, "rotary embedding", &plan->kernel, rope_probe, &unit);
}
