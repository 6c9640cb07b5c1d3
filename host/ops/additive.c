/* Additive attention's scores: variant and launch for kernels/additive.cl. */
#include "ops.h"
#include "probe.h" /* self-validation (core/validate.h) */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The family (core/family.h): TILE x TILE work-items, CHUNK features per step. */
#define ADDITIVE_SWITCHES(X) X(TILE, 0, NULL) X(CHUNK, 0, NULL)
CLATTN_FAMILY(additive, ADDITIVE_SWITCHES, .sources = {"additive.cl"});

clattn_status clattn__additive_prepare(clattn_ctx *ctx, size_t batch, size_t heads, size_t seq_q,
                                       size_t seq_k, size_t dim, clattn__additive_plan *plan)
{
    static const char op[] = "additive_scores";
    memset(plan, 0, sizeof *plan);
    plan->batch = batch, plan->heads = heads, plan->seq_q = seq_q, plan->seq_k = seq_k;
    plan->dim = dim;
    /* TILE x TILE work-items: the largest power of two up to 16 the device runs in both
     * dimensions (16 x 16 = 256 items, a work-group size every GPU and PoCL take). */
    const unsigned chunk = 32;
    /* local memory: four (TILE, CHUNK + 1) float tiles, CHUNK weights, two flags (17 KB at
     * TILE 16); queried, not assumed */
#define ADDITIVE_LOCAL(t) ((4 * (size_t)(t) * (chunk + 1) + chunk) * sizeof(float) + 8)
    unsigned tile = 16;
    while (tile > 1 && ((size_t)tile * tile > ctx->info.max_work_group_size ||
                        tile > ctx->info.max_item_sizes[0] || tile > ctx->info.max_item_sizes[1] ||
                        ADDITIVE_LOCAL(tile) > ctx->info.local_mem_size))
        tile /= 2;
    if (ADDITIVE_LOCAL(tile) > ctx->info.local_mem_size)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: the device has %llu bytes of local memory, fewer than the %zu "
                            "the smallest tile needs",
                            op, (unsigned long long)ctx->info.local_mem_size, ADDITIVE_LOCAL(1));
#undef ADDITIVE_LOCAL
    size_t bh = 0;
    if (!clattn__mul(batch, heads, &bh) || bh > UINT32_MAX || seq_q > UINT32_MAX ||
        seq_k > UINT32_MAX || dim > UINT32_MAX)
        return clattn__fail(ctx, CLATTN_ERR_TOO_LARGE,
                            "%s: batch %zu x heads %zu, seq_q %zu, seq_k %zu exceed the kernel's "
                            "32-bit indices",
                            op, batch, heads, seq_q, seq_k);
    /* The compiled kernel may run fewer work-items than the device's limit (Mesa's llvmpipe:
     * 32): shrink the tile until it fits. */
    for (;; tile /= 2) {
        const additive_switches sw = {.TILE = tile, .CHUNK = chunk};
        clattn_status status =
            clattn__family_kernel(ctx, &additive_family, op, &sw, NULL, 0, &plan->kernel);
        if (status != CLATTN_SUCCESS)
            return status;
        size_t kernel_max = 0;
        const cl_int err =
            clGetKernelWorkGroupInfo(plan->kernel, ctx->device, CL_KERNEL_WORK_GROUP_SIZE,
                                     sizeof kernel_max, &kernel_max, NULL);
        if (err != CL_SUCCESS)
            return clattn__cl_fail(ctx, err, "clGetKernelWorkGroupInfo(additive_scores)");
        if (kernel_max >= (size_t)tile * tile)
            break;
        if (tile == 1)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: the device runs no work-group of this kernel", op);
    }
    if (!clattn__round_up(seq_k, tile, &plan->global[0]) ||
        !clattn__round_up(seq_q, tile, &plan->global[1]))
        return clattn__fail(ctx, CLATTN_ERR_TOO_LARGE, "%s: seq_q %zu, seq_k %zu overflow", op,
                            seq_q, seq_k);
    plan->global[2] = bh;
    plan->local[0] = plan->local[1] = tile;
    plan->local[2] = 1;
    plan->tile = tile;
    return clattn__additive_trust(ctx, plan); /* self-validation (core/validate.h) */
}

clattn_status clattn__additive_enqueue(clattn_chain *chain, const clattn__additive_plan *plan,
                                       const clattn__view *p1, const clattn__view *p2,
                                       const clattn__view *w, const clattn__view *raw)
{
    const clattn_additive_params params = {.p1_offset = p1->offset,
                                           .p1_s0 = p1->strides[0],
                                           .p1_s1 = p1->strides[1],
                                           .p1_s2 = p1->strides[2],
                                           .p2_offset = p2->offset,
                                           .p2_s0 = p2->strides[0],
                                           .p2_s1 = p2->strides[1],
                                           .p2_s2 = p2->strides[2],
                                           .w_offset = w->offset,
                                           .w_s0 = w->strides[2],
                                           .w_s1 = w->strides[3],
                                           .raw_offset = raw->offset,
                                           .raw_s0 = raw->strides[0],
                                           .raw_s1 = raw->strides[1],
                                           .raw_s2 = raw->strides[2],
                                           .heads = (cl_uint)plan->heads,
                                           .seq_q = (cl_uint)plan->seq_q,
                                           .seq_k = (cl_uint)plan->seq_k,
                                           .dim = (cl_uint)plan->dim};
    const clattn_arg args[] = {CLATTN_ARG(p1->mem), CLATTN_ARG(p2->mem), CLATTN_ARG(w->mem),
                               CLATTN_ARG(raw->mem), CLATTN_ARG(params)};
    return clattn__launch_kernel(chain, plan->kernel, "additive_scores", args,
                                 sizeof args / sizeof args[0], 3, plan->global, plan->local);
}

/* ---- additive attention's scores (additive.cl) --------------------------------------------- */

/* raw over (2, 2, 19, 23) with dim 37 (a chunk and a part): sum_c w[h, c] tanh(p1 + p2). */
static clattn_status additive_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const clattn__additive_plan *prepared = unit;
    const size_t b = 2, h = 2, q = 19, k = 23, d = 37;
    clattn__additive_plan run;
    clattn_status status = clattn__additive_prepare(ctx, b, h, q, k, d, &run);
    if (status != CLATTN_SUCCESS)
        return status;
    if (!clattn__same_variant(ctx, prepared->kernel, run.kernel)) {
        r->checked = false;
        snprintf(r->why, sizeof r->why, "the probe's sizes take another tile");
        return CLATTN_SUCCESS;
    }
    run.kernel = prepared->kernel;
    clattn__probe_rng rng = {0xadd1ULL};
    clattn__probe_mem pm = {.count = 0};
    const size_t n1 = b * h * q * d, n2 = b * h * k * d, nw = h * d, nr = b * h * q * k;
    float *host = clattn__probe_alloc(&pm, (n1 + n2 + nw) * sizeof(float));
    float *got = clattn__probe_alloc(&pm, nr * sizeof(float));
    double *want = clattn__probe_alloc(&pm, nr * sizeof(double));
    cl_mem m1 = NULL, m2 = NULL, mw = NULL, mr = NULL;
    if (!host || !got || !want) {
        status = clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
        goto done;
    }
    for (size_t i = 0; i < n1 + n2 + nw; ++i)
        host[i] = (float)(2.0 * clattn__probe_grid(&rng, CLATTN_DTYPE_F32));
    const float *p1 = host, *p2 = host + n1, *w = host + n1 + n2;
    for (size_t bh = 0; bh < b * h; ++bh)
        for (size_t i = 0; i < q; ++i)
            for (size_t j = 0; j < k; ++j) {
                double sum = 0.0;
                for (size_t c = 0; c < d; ++c)
                    sum += (double)w[(bh % h) * d + c] *
                           tanh((double)p1[(bh * q + i) * d + c] + p2[(bh * k + j) * d + c]);
                want[(bh * q + i) * k + j] = sum;
            }
    if ((status = clattn__probe_upload(ctx, &pm, p1, n1 * sizeof(float), &m1)) ||
        (status = clattn__probe_upload(ctx, &pm, p2, n2 * sizeof(float), &m2)) ||
        (status = clattn__probe_upload(ctx, &pm, w, nw * sizeof(float), &mw)) ||
        (status = clattn__probe_upload(ctx, &pm, NULL, nr * sizeof(float), &mr)))
        goto done;
    const clattn__view v1 = clattn__probe_view(m1, CLATTN_DTYPE_F32, b, h, q, d);
    const clattn__view v2 = clattn__probe_view(m2, CLATTN_DTYPE_F32, b, h, k, d);
    const clattn__view vw = clattn__probe_view(mw, CLATTN_DTYPE_F32, 1, 1, h, d);
    const clattn__view vr = clattn__probe_view(mr, CLATTN_DTYPE_F32, b, h, q, k);
    clattn_chain chain = clattn__probe_chain(ctx);
    status = clattn__additive_enqueue(&chain, &run, &v1, &v2, &vw, &vr);
    if (status == CLATTN_SUCCESS)
        status = clattn__probe_download(&chain, mr, nr * sizeof(float), got);
    clattn__chain_push(&chain, NULL);
    if (status == CLATTN_SUCCESS) {
        size_t where = 0;
        r->tolerance = 1e-4 * (double)d;
        r->max_error =
            clattn__probe_max_error(CLATTN_DTYPE_F32, (const unsigned char *)got, want, nr, &where);
        snprintf(r->why, sizeof r->why, "raw[%zu] of (2, 2, 19, 23)", where);
    }
done:
    clattn__probe_release(&pm);
    return status;
}

clattn_status clattn__additive_trust(clattn_ctx *ctx, clattn__additive_plan *plan)
{
    return clattn__trust_one(ctx, "additive scores", &plan->kernel, additive_probe, plan);
}
