/* The attention backward's launches (kernels/flash_bwd.cl): delta, dK/dV per key, dQ per row,
 * then the reductions (parts, a broadcast mask's gradient, the sinks'). */
#include "ops.h"
#include "probe.h" /* self-validation (core/validate.h) */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BH_PER_LAUNCH 65535u

/* Work-items per key (row) whose loop trips, counted as if nothing were unrolled, stay within
 * half a device's cap on them (tuning.loop_trip_limit); 0: all in one launch. `per_step`:
 * the trips of one step of the walk, `outside`: the rest. */
static size_t steps_per_launch(const clattn_ctx *ctx, size_t per_step, size_t outside)
{
    const size_t limit = ctx->tuning.loop_trip_limit;
    if (limit == 0)
        return 0;
    return limit / 2 > outside + per_step ? (limit / 2 - outside) / per_step : 1;
}

/* The largest power of two up to `want` that the kernel runs as a work-group. */
static size_t group_size(cl_kernel kernel, const clattn_ctx *ctx, size_t want)
{
    size_t fits = ctx->info.max_work_group_size;
    if (ctx->info.max_item_sizes[0] > 0 && ctx->info.max_item_sizes[0] < fits)
        fits = ctx->info.max_item_sizes[0];
    size_t kernel_max = 0;
    if (clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kernel_max,
                                 &kernel_max, NULL) == CL_SUCCESS &&
        kernel_max > 0 && kernel_max < fits)
        fits = kernel_max;
    size_t size = 1;
    while (size * 2 <= want && size * 2 <= fits)
        size *= 2;
    return size;
}

/* The families (core/family.h): the passes (flash_bwd.cl, CLATTN__FLASH_BWD_SWITCHES in
 * ops.h), the reductions that store in one dtype, and the ones without switches. */
CLATTN_FAMILY(flash_bwd, CLATTN__FLASH_BWD_SWITCHES, .sources = {"flash_bwd.cl"},
              .score_family = CLATTN__FAMILY_FLASH, .tuning_keys = "flash_cpu loop_trip_limit");
#define FLASH_BWD_OUT_SWITCHES(X) X(OUT_DTYPE, 0, NULL)
CLATTN_FAMILY(flash_bwd_out, FLASH_BWD_OUT_SWITCHES, .sources = {"flash_bwd.cl"});
static const clattn_family flash_bwd_plain_family = {
    .sources = {"flash_bwd.cl"},
    .score_family = CLATTN__FAMILY_FLASH,
};

clattn_status clattn__flash_bwd_plain_kernel(clattn_ctx *ctx, const char *name,
                                             const clattn__score_shape *score, cl_kernel *out)
{
    clattn_define defines[CLATTN_DEFINES_MAX];
    const size_t count =
        score ? clattn__score_defines(score, flash_bwd_plain_family.score_family, defines) : 0;
    return clattn__family_kernel(ctx, &flash_bwd_plain_family, name, NULL, defines, count, out);
}

clattn_status clattn__flash_bwd_out_kernel(clattn_ctx *ctx, const char *name, clattn_dtype dtype,
                                           cl_kernel *out)
{
    const flash_bwd_out_switches sw = {.OUT_DTYPE = dtype};
    return clattn__family_kernel(ctx, &flash_bwd_out_family, name, &sw, NULL, 0, out);
}

/* The passes' kernels: delta, dK/dV and dQ, the CPU variants where the tuning takes the CPU
 * fused kernel (flash_cpu: CPUs, not CLATTN_PARAMS=gpu), head sizes are multiples of 16 and no
 * loop-trip cap applies (their walks are long): blocks of keys (rows) in float16 lanes;
 * elsewhere one key (row) per work-item. BWD_CPU compiles them in: their local arrays are
 * CPU-sized. */
static clattn_status build_passes(clattn_ctx *ctx, const clattn__flash_bwd_shape *shape,
                                  clattn__flash_bwd_plan *plan, flash_bwd_switches *sw,
                                  clattn_define *defines, size_t *count)
{
    const size_t dk = shape->head_dim_qk, dv = shape->head_dim_v;
    *sw = (flash_bwd_switches){.HEAD_DIM_QK = (long)dk,
                               .HEAD_DIM_V = (long)dv,
                               .Q_DTYPE = shape->q_dtype,
                               .K_DTYPE = shape->k_dtype,
                               .V_DTYPE = shape->v_dtype,
                               .O_DTYPE = shape->o_dtype,
                               .GO_DTYPE = shape->go_dtype,
                               .DQ_DTYPE = shape->dq_dtype,
                               .DK_DTYPE = shape->dk_dtype,
                               .DV_DTYPE = shape->dv_dtype};
    *count = clattn__score_defines(&shape->score, flash_bwd_family.score_family, defines);
    plan->cpu =
        ctx->tuning.flash_cpu && ctx->tuning.loop_trip_limit == 0 && dk % 16 == 0 && dv % 16 == 0;
    if (plan->cpu) {
        /* 16-key vectors per key block and query rows per bwd_dq_cpu work-item: the largest
         * whose local arrays fit the device's local memory */
        /* bwd_dkdv_cpu: kt, vt, dkt, dvt and k_rows (16 * nv keys each), the 4-row q and dO
         * blocks (8 rows counted), 256 bytes of alignment; bwd_dq_cpu: kt, k_rows, vt and
         * the rows' q, dO and dQ */
#define DKDV_LOCAL(nv) (((2 * dk + 2 * dv + dk) * 16 * (nv) + 8 * (dk + dv)) * sizeof(float) + 256)
#define DQ_LOCAL(nv, rows)                                                                         \
    (((2 * dk + dv) * 16 * (nv) + (2 * dk + dv) * (rows)) * sizeof(float) + 256)
        /* at most the tuning's flash_bwd_nv (d = 64 on an Intel Xeon: 2, whose blocks' arrays
         * fit a 48 KiB L1: the step 1.05-1.12x; d = 128 keeps 4: host/tuning/table.h) */
        const clattn_tuning *t = shape->tuning ? shape->tuning : &ctx->tuning;
        plan->cpu_nv = t->flash_bwd_nv >= 4 ? 4 : t->flash_bwd_nv >= 2 ? 2 : 1;
        /* query rows a step: the tuning's flash_bwd_rb (1 .. 8: the local q and dO blocks
         * above count 8 rows); bwd_dq_cpu's rows a multiple of it, 64 rounded down, halved
         * (still a multiple) while local memory is short */
        plan->cpu_rb = t->flash_bwd_rb >= 1 && t->flash_bwd_rb <= 8 ? t->flash_bwd_rb : 4;
        plan->cpu_rows = 64 / plan->cpu_rb * plan->cpu_rb;
        while (plan->cpu_nv > 1 && DKDV_LOCAL(plan->cpu_nv) > ctx->info.local_mem_size / 2)
            plan->cpu_nv /= 2;
        while (plan->cpu_rows > plan->cpu_rb &&
               DQ_LOCAL(plan->cpu_nv, plan->cpu_rows) > ctx->info.local_mem_size / 2) {
            const unsigned half = plan->cpu_rows / 2 / plan->cpu_rb * plan->cpu_rb;
            plan->cpu_rows = half > plan->cpu_rb ? half : plan->cpu_rb;
        }
        /* (a device whose local memory holds neither at the smallest, Oclgrind's 32 KiB at
         * d = 128: the generic kernels) */
        plan->cpu = DKDV_LOCAL(plan->cpu_nv) <= ctx->info.local_mem_size &&
                    DQ_LOCAL(plan->cpu_nv, plan->cpu_rows) <= ctx->info.local_mem_size;
#undef DKDV_LOCAL
#undef DQ_LOCAL
    }
    if (plan->cpu)
        sw->BWD_CPU = 1, sw->BWD_NV = plan->cpu_nv, sw->BWD_BQ = plan->cpu_rows,
        sw->BWD_RB = plan->cpu_rb;
    const clattn_family *f = &flash_bwd_family;
    clattn_status status;
    if ((status = clattn__family_kernel(ctx, f, "bwd_delta", sw, defines, *count, &plan->delta)) ||
        (status = clattn__family_kernel(ctx, f, plan->cpu ? "bwd_dkdv_cpu" : "bwd_dkdv", sw,
                                        defines, *count, &plan->dkdv)) ||
        (status = clattn__family_kernel(ctx, f, plan->cpu ? "bwd_dq_cpu" : "bwd_dq", sw, defines,
                                        *count, &plan->dq)))
        return status;
    const size_t want = (ctx->info.type & CL_DEVICE_TYPE_GPU) ? 64 : 16;
    plan->local_dkdv = plan->cpu ? 1 : group_size(plan->dkdv, ctx, want);
    plan->local_dq = plan->cpu ? 1 : group_size(plan->dq, ctx, want);
    plan->local_delta = group_size(plan->delta, ctx, 64);
    return CLATTN_SUCCESS;
}

/* Parts of the walks where the device caps loop trips (dK/dV over rows, dQ over keys), and on
 * CPUs without the mask's gradient or parts, dQ summed in the dK/dV pass (FlashAttention-2's
 * one pass; bwd_dq_cpu recomputes the scores otherwise), into one slot per work-group of a
 * (batch, k/v head), summed in order after: enough work-groups for twice the compute units,
 * at most one per key block. */
static void plan_parts(const clattn_ctx *ctx, const clattn__flash_bwd_shape *shape,
                       clattn__flash_bwd_plan *plan)
{
    const clattn__score_shape *score = &shape->score;
    const size_t dk = shape->head_dim_qk, dv = shape->head_dim_v;
    const size_t group = score->kv_group > 1 ? score->kv_group : 1;
    size_t rows = steps_per_launch(ctx, group * (2 * dk + 2 * dv + 8), 3 * dk + 3 * dv);
    size_t keys = steps_per_launch(ctx, 2 * dk + dv + 8 + (shape->want_dmask ? 1 : 0),
                                   3 * dk + dv + (shape->want_dmask ? score->seq_k : 0));
    plan->rows_per_part = rows == 0 || rows >= score->seq_q ? score->seq_q : rows;
    plan->keys_per_part = keys == 0 || keys >= score->seq_k ? score->seq_k : keys;
    plan->row_parts = (score->seq_q + plan->rows_per_part - 1) / plan->rows_per_part;
    plan->key_parts = (score->seq_k + plan->keys_per_part - 1) / plan->keys_per_part;
}

static void plan_dq_slots(const clattn_ctx *ctx, const clattn__flash_bwd_shape *shape,
                          clattn__flash_bwd_plan *plan)
{
    const clattn__score_shape *score = &shape->score;
    const size_t group = score->kv_group > 1 ? score->kv_group : 1;
    if (plan->cpu && !shape->want_dmask && plan->row_parts == 1 && plan->key_parts == 1) {
        const size_t blocks = (score->seq_k + 16 * plan->cpu_nv - 1) / (16 * plan->cpu_nv);
        const size_t pairs = score->batch * (score->heads / group);
        size_t slots = (2 * (size_t)ctx->info.compute_units + pairs - 1) / pairs;
        plan->dq_slots = slots > blocks ? blocks : slots < 1 ? 1 : slots;
    }
}

/* The scratch (floats): delta (B, H, Lq); dS (B, H, Lq, Lk) for a float mask's gradient; the
 * parts' partial sums; the dQ slots. Packed sequences: rows (keys) by their packed index,
 * (H, total_q) ((Hkv, total_k)) in place of (B, H, Lq) ((B, Hkv, Lk); ROW_INDEX). */
static clattn_status plan_scratch(clattn_ctx *ctx, const clattn__flash_bwd_shape *shape,
                                  clattn__flash_bwd_plan *plan)
{
    const clattn__score_shape *score = &shape->score;
    const size_t dk = shape->head_dim_qk, dv = shape->head_dim_v;
    const size_t kv_heads = score->heads / (score->kv_group > 1 ? score->kv_group : 1);
    const size_t q_rows = score->varlen ? score->total_q : score->seq_q;
    const size_t q_batch = score->varlen ? 1 : score->batch;
    const size_t k_rows = score->varlen ? score->total_k : score->seq_k;
    size_t cursor = 0, n = 0;
    if (!clattn__product(&n, 3, q_batch, score->heads, q_rows))
        goto overflow;
    plan->delta_at = cursor;
    cursor += n;
    if (shape->want_dmask) {
        if (!clattn__product(&n, 4, score->batch, score->heads, score->seq_q, score->seq_k) ||
            !clattn__add(cursor, 0, &plan->dmask_at) || !clattn__add(cursor, n, &cursor))
            goto overflow;
    }
    if (plan->row_parts > 1) {
        size_t kn = 0, vn = 0;
        if (!clattn__product(&kn, 4, q_batch, kv_heads, k_rows, dk) ||
            !clattn__product(&vn, 4, q_batch, kv_heads, k_rows, dv) ||
            !clattn__add(kn, vn, &plan->dkdv_part_floats) ||
            !clattn__product(&n, 2, plan->dkdv_part_floats, plan->row_parts))
            goto overflow;
        plan->dv_part_at = kn;
        plan->dkdv_parts_at = cursor;
        if (!clattn__add(cursor, n, &cursor))
            goto overflow;
    }
    if (plan->key_parts > 1) {
        if (!clattn__product(&plan->dq_part_floats, 4, q_batch, score->heads, q_rows, dk) ||
            !clattn__product(&n, 2, plan->dq_part_floats, plan->key_parts))
            goto overflow;
        plan->dq_parts_at = cursor;
        if (!clattn__add(cursor, n, &cursor))
            goto overflow;
    }
    if (plan->dq_slots) {
        if (!clattn__product(&plan->dq_part_floats, 4, q_batch, score->heads, q_rows, dk) ||
            !clattn__product(&n, 2, plan->dq_part_floats, (size_t)plan->dq_slots))
            goto overflow;
        plan->dq_parts_at = cursor;
        if (!clattn__add(cursor, n, &cursor))
            goto overflow;
    }
    plan->scratch_floats = cursor;

    return CLATTN_SUCCESS;
overflow:
    return clattn__fail(ctx, CLATTN_ERR_OVERFLOW,
                        "sdpa_backward: the scratch (delta, partial sums, the mask's gradient) "
                        "overflows size_t");
}

/* The reductions, built only when used. */
static clattn_status build_reductions(clattn_ctx *ctx, const clattn__flash_bwd_shape *shape,
                                      clattn__flash_bwd_plan *plan)
{
    clattn_status status;
    if (plan->row_parts > 1 &&
        ((status =
              clattn__flash_bwd_out_kernel(ctx, "bwd_sum_parts", shape->dk_dtype, &plan->sum_k)) ||
         (status =
              clattn__flash_bwd_out_kernel(ctx, "bwd_sum_parts", shape->dv_dtype, &plan->sum_v))))
        return status;
    if (plan->dq_slots &&
        (status = clattn__flash_bwd_plain_kernel(ctx, "bwd_zero", NULL, &plan->zero)))
        return status;
    if ((plan->key_parts > 1 || plan->dq_slots) &&
        (status =
             clattn__flash_bwd_out_kernel(ctx, "bwd_sum_parts", shape->dq_dtype, &plan->sum_q)))
        return status;
    if (shape->want_dmask && (status = clattn__flash_bwd_out_kernel(
                                  ctx, "bwd_mask_reduce", shape->dmask_dtype, &plan->mask_reduce)))
        return status;
    if (shape->want_dsinks &&
        (status = clattn__flash_bwd_plain_kernel(ctx, "bwd_sinks", NULL, &plan->sinks)))
        return status;
    return CLATTN_SUCCESS;
}

static clattn_status prepare_once(clattn_ctx *ctx, const clattn__flash_bwd_shape *shape,
                                  clattn__flash_bwd_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->shape = *shape;
    flash_bwd_switches sw;
    clattn_define defines[CLATTN_DEFINES_MAX];
    size_t count = 0;
    clattn_status status = build_passes(ctx, shape, plan, &sw, defines, &count);
    if (status != CLATTN_SUCCESS)
        return status;
    plan_parts(ctx, shape, plan);
    /* GPU-class parameters, dK/dV in one launch: the tiled GPU pass (ops/flash_bwd_gpu.c)
     * where it fits the device (not with packed sequences yet: the generic kernels take their
     * spans) */
    if (!ctx->tuning.flash_cpu && plan->row_parts == 1 && !shape->score.varlen &&
        !clattn__flash_bwd_gpu_prepare(ctx, shape, &sw, defines, count, plan, &status) && status)
        return status;
    plan_dq_slots(ctx, shape, plan);
    if ((status = plan_scratch(ctx, shape, plan)))
        return status;
    return build_reductions(ctx, shape, plan);
}

clattn_status clattn__flash_bwd_prepare(clattn_ctx *ctx, const clattn__flash_bwd_shape *shape,
                                        clattn__flash_bwd_plan *plan)
{
    /* Self-validation (core/validate.h): the passes' kernels are probed before use. */
    const clattn_status status = prepare_once(ctx, shape, plan);
    return status != CLATTN_SUCCESS ? status : clattn__flash_bwd_trust(ctx, plan);
}

/* global[0] rounded up to a multiple of local. */
static size_t rounded(size_t n, size_t local)
{
    return (n + local - 1) / local * local;
}

/* Launches `kernel` over (items, count) with dimension 1 in launches of at most
 * MAX_BH_PER_LAUNCH entries, each with params->bh_base set. */
static clattn_status launch_rows(clattn_chain *chain, cl_kernel kernel, const char *name,
                                 clattn_arg *args, cl_uint n, clattn_flash_bwd_params *params,
                                 size_t items, size_t local, size_t count)
{
    clattn_status status = CLATTN_SUCCESS;
    for (size_t first = 0; first < count && status == CLATTN_SUCCESS; first += MAX_BH_PER_LAUNCH) {
        params->bh_base = first;
        args[n - 1] = CLATTN_ARG(*params);
        const size_t global[2] = {rounded(items, local), count - first < MAX_BH_PER_LAUNCH
                                                             ? count - first
                                                             : MAX_BH_PER_LAUNCH};
        const size_t local2[2] = {local, 1};
        status = clattn__launch_kernel(chain, kernel, name, args, n, 2, global, local2);
    }
    return status;
}

/* The kernels' view of a gradient as the parts' sums see it: with packed sequences the
 * caller's packed tensor as (1, heads, total, d) (its (batch, heads, max_seqlen, d) view has
 * batch stride 0 and the token's stride per row; the parts hold (head, packed row) in that
 * order: flash_bwd.cl's ROW_INDEX, KEY_INDEX); else the view itself. */
static clattn__view summed_view(const clattn__view *kernels, const clattn__score_shape *score,
                                bool keys)
{
    clattn__view v = *kernels;
    if (score->varlen) {
        v.dims[0] = 1;
        v.dims[2] = keys ? score->total_k : score->total_q;
    }
    return v;
}

/* bwd_sum_parts: `parts` packed partial sums at `at` (floats of the scratch), `stride` apart,
 * into the (d0, d1, d2, d3) view `out`. */
static clattn_status sum_parts(clattn_chain *chain, cl_kernel kernel, clattn__scratch scratch,
                               size_t at, size_t stride, size_t parts, const clattn__view *out)
{
    clattn_bwd_reduce_params p;
    memset(&p, 0, sizeof p);
    CLATTN__VIEW_FIELDS(out, p, out);
    p.in_at = scratch.offset + at;
    p.in_stride = stride;
    p.d0 = (cl_uint)out->dims[0], p.d1 = (cl_uint)out->dims[1];
    p.d2 = (cl_uint)out->dims[2], p.d3 = (cl_uint)out->dims[3];
    p.total = (cl_ulong)out->dims[0] * out->dims[1] * out->dims[2] * out->dims[3];
    p.parts = (cl_uint)parts;
    /* work-items a row of d3 elements (kernels/flash_bwd.cl): one where the CPU rows apply
     * (the row's place in out computed once), else d3, whose neighbours read neighbouring
     * floats (a GPU's coalesced loads) */
    p.row_items = chain->ctx->tuning.cpu_params || p.d3 == 0 ? 1 : p.d3;
    const clattn_arg args[] = {CLATTN_ARG(scratch.mem), CLATTN_ARG(out->mem), CLATTN_ARG(p)};
    const size_t local = 64,
                 global = rounded(p.d3 ? (size_t)(p.total / p.d3) * p.row_items : 0, local);
    return clattn__launch_kernel(chain, kernel, "bwd_sum_parts", args, 3, 1, &global, &local);
}

/* One backward's launch state: the passes' parameter struct and the buffers they share. */
typedef struct bwd_launch {
    clattn_flash_bwd_params params;
    clattn__score_buffers buffers;
    cl_mem cu_q, cu_k; /* packed sequences' offsets (any valid buffer without) */
} bwd_launch;

/* The parameters every pass reads: views, the score rule's operands, the scratch's slots. */
static void fill_params(const clattn__flash_bwd_plan *plan, const clattn__flash_bwd_io *io,
                        clattn__scratch scratch, bwd_launch *l)
{
    const clattn__score_shape *score = &plan->shape.score;
    clattn_flash_bwd_params *p = &l->params;
    memset(p, 0, sizeof *p);
    clattn__score_params(score, &io->masks, io->q.mem, &p->score, &l->buffers);
    CLATTN__VIEW_FIELDS(&io->q, *p, q);
    CLATTN__VIEW_FIELDS(&io->k, *p, k);
    CLATTN__VIEW_FIELDS(&io->v, *p, v);
    CLATTN__VIEW_FIELDS(&io->out, *p, o);
    CLATTN__VIEW_FIELDS(&io->grad_out, *p, go);
    CLATTN__VIEW_FIELDS(&io->dq, *p, dq);
    CLATTN__VIEW_FIELDS(&io->dk, *p, dk);
    CLATTN__VIEW_FIELDS(&io->dv, *p, dv);
    /* lse (batch, heads, seq_q) as the view (1, batch, heads, seq_q) */
    p->lse_offset = io->lse.offset;
    p->lse_s0 = io->lse.strides[1];
    p->lse_s1 = io->lse.strides[2];
    p->lse_s2 = io->lse.strides[3];
    p->delta_at = scratch.offset + plan->delta_at;
    p->dmask_at = scratch.offset + plan->dmask_at;
    p->kv_group = (cl_uint)(score->kv_group > 1 ? score->kv_group : 1);
    p->has_dmask = plan->shape.want_dmask;
    /* packed sequences (VARLEN): their offsets and totals */
    l->cu_q = score->varlen ? io->masks.varlen.cu_q : io->q.mem;
    l->cu_k = score->varlen ? io->masks.varlen.cu_k : io->q.mem;
    if (score->varlen) {
        p->cu_q_offset = io->masks.varlen.q_offset;
        p->cu_k_offset = io->masks.varlen.k_offset;
        p->total_q = (cl_uint)score->total_q;
        p->total_k = (cl_uint)score->total_k;
    }
}

/* The passes' arguments: q, k, v, grad_out, lse, the scratch, the gradients the pass writes
 * (dK and dV, or dQ), the score rule's buffers, the packed offsets, the parameters; their
 * count (at most 16). */
static cl_uint pass_args(const clattn__flash_bwd_io *io, const clattn__scratch *scratch,
                         const bwd_launch *l, const cl_mem *const *grads, cl_uint num_grads,
                         clattn_arg *args)
{
    cl_uint n = 0;
    const cl_mem *const first[] = {&io->q.mem,        &io->k.mem,   &io->v.mem,
                                   &io->grad_out.mem, &io->lse.mem, &scratch->mem};
    for (size_t i = 0; i < sizeof first / sizeof first[0]; ++i)
        args[n++] = (clattn_arg){sizeof(cl_mem), first[i]};
    for (cl_uint i = 0; i < num_grads; ++i)
        args[n++] = (clattn_arg){sizeof(cl_mem), grads[i]};
    const cl_mem *const rest[] = {&l->buffers.mask,  &l->buffers.key_padding, &l->buffers.kv_len,
                                  &l->buffers.alibi, &l->buffers.sinks,       &l->cu_q,
                                  &l->cu_k};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; ++i)
        args[n++] = (clattn_arg){sizeof(cl_mem), rest[i]};
    args[n++] = CLATTN_ARG(l->params);
    return n;
}

/* A pass's launches: its walk in `parts` parts of `per_part` of `total` rows (keys), each
 * over (items, count) work-items in groups of `local`. */
typedef struct bwd_pass {
    cl_kernel kernel;
    const char *name;
    size_t parts, per_part, total, items, local, count;
    const cl_mem *const *grads;
    cl_uint num_grads;
} bwd_pass;

static clattn_status run_pass(clattn_chain *chain, const clattn__flash_bwd_io *io,
                              const clattn__scratch *scratch, bwd_launch *l, const bwd_pass *pass)
{
    clattn_flash_bwd_params *p = &l->params;
    clattn_status status = CLATTN_SUCCESS;
    for (size_t part = 0; part < pass->parts && status == CLATTN_SUCCESS; ++part) {
        p->part = (cl_uint)part;
        p->part_begin = (cl_uint)(part * pass->per_part);
        p->part_stop =
            (cl_uint)(part + 1 == pass->parts ? pass->total : (part + 1) * pass->per_part);
        clattn_arg args[16];
        const cl_uint n = pass_args(io, scratch, l, pass->grads, pass->num_grads, args);
        status = launch_rows(chain, pass->kernel, pass->name, args, n, p, pass->items, pass->local,
                             pass->count);
    }
    return status;
}

/* dQ's slots (summed in the dK/dV pass) start at zero. */
static clattn_status zero_slots(clattn_chain *chain, const clattn__flash_bwd_plan *plan,
                                clattn__scratch scratch, bwd_launch *l)
{
    clattn_bwd_reduce_params p;
    memset(&p, 0, sizeof p);
    p.in_at = scratch.offset + plan->dq_parts_at;
    p.total = (cl_ulong)plan->dq_part_floats * plan->dq_slots;
    const clattn_arg args[] = {CLATTN_ARG(scratch.mem), CLATTN_ARG(p)};
    const size_t local = 64, global = rounded((size_t)p.total, local);
    l->params.dq_slots = plan->dq_slots;
    l->params.dq_slots_at = scratch.offset + plan->dq_parts_at;
    l->params.dq_slot_stride = plan->dq_part_floats;
    return clattn__launch_kernel(chain, plan->zero, "bwd_zero", args, 2, 1, &global, &local);
}

/* dK, dV: per key, over the rows (in parts where the device caps loop trips). */
static clattn_status dkdv_pass(clattn_chain *chain, const clattn__flash_bwd_plan *plan,
                               const clattn__flash_bwd_io *io, clattn__scratch scratch,
                               bwd_launch *l)
{
    const clattn__score_shape *score = &plan->shape.score;
    clattn_flash_bwd_params *p = &l->params;
    const size_t bg = score->batch * score->heads / (size_t)p->kv_group;
    const size_t items =
        plan->dq_slots ? plan->dq_slots
        : plan->gpu    ? (score->seq_k + plan->gpu_keys - 1) / plan->gpu_keys * plan->local_dkdv
        : plan->cpu    ? (score->seq_k + 16 * plan->cpu_nv - 1) / (16 * plan->cpu_nv)
                       : score->seq_k;
    p->to_scratch = plan->row_parts > 1;
    p->part_at = scratch.offset + plan->dkdv_parts_at;
    p->part_stride = plan->dkdv_part_floats;
    p->dv_part_at = plan->dv_part_at;
    const cl_mem *grads[2] = {&io->dk.mem, &io->dv.mem};
    const bwd_pass pass = {plan->dkdv,   "bwd_dkdv", plan->row_parts,  plan->rows_per_part,
                           score->seq_q, items,      plan->local_dkdv, bg,
                           grads,        2};
    clattn_status status = run_pass(chain, io, &scratch, l, &pass);
    return status;
}

/* dQ (and dS for the mask): per row, over the keys (not with dq_slots). */
static clattn_status dq_pass(clattn_chain *chain, const clattn__flash_bwd_plan *plan,
                             const clattn__flash_bwd_io *io, clattn__scratch scratch, bwd_launch *l)
{
    const clattn__score_shape *score = &plan->shape.score;
    clattn_flash_bwd_params *p = &l->params;
    const size_t items = plan->gpu_dq
                             ? (score->seq_q + plan->gpu_keys - 1) / plan->gpu_keys * plan->local_dq
                         : plan->cpu ? (score->seq_q + plan->cpu_rows - 1) / plan->cpu_rows
                                     : score->seq_q;
    p->to_scratch = plan->key_parts > 1;
    p->dq_slots = 0;
    p->part_at = scratch.offset + plan->dq_parts_at;
    p->part_stride = plan->dq_part_floats;
    const cl_mem *grads[1] = {&io->dq.mem};
    const bwd_pass pass = {plan->dq,     "bwd_dq", plan->key_parts, plan->keys_per_part,
                           score->seq_k, items,    plan->local_dq,  score->batch * score->heads,
                           grads,        1};
    clattn_status status = run_pass(chain, io, &scratch, l, &pass);
    return status;
}

clattn_status clattn__flash_bwd_enqueue(clattn_chain *chain, const clattn__flash_bwd_plan *plan,
                                        const clattn__flash_bwd_io *io, clattn__scratch scratch)
{
    const clattn__flash_bwd_shape *shape = &plan->shape;
    const clattn__score_shape *score = &shape->score;
    const size_t bh = score->batch * score->heads;
    bwd_launch l;
    fill_params(plan, io, scratch, &l);
    const clattn__view dq_sums = summed_view(&io->dq, score, false);
    const clattn__view dk_sums = summed_view(&io->dk, score, true);
    const clattn__view dv_sums = summed_view(&io->dv, score, true);
    clattn_status status;
    clattn_arg delta_args[] = {CLATTN_ARG(io->out.mem), CLATTN_ARG(io->grad_out.mem),
                               CLATTN_ARG(scratch.mem), CLATTN_ARG(l.cu_q),
                               CLATTN_ARG(l.cu_k),      CLATTN_ARG(l.params)};
    if ((status = launch_rows(chain, plan->delta, "bwd_delta", delta_args, 6, &l.params,
                              score->seq_q, plan->local_delta, bh)) ||
        (plan->dq_slots && (status = zero_slots(chain, plan, scratch, &l))) ||
        (status = dkdv_pass(chain, plan, io, scratch, &l)))
        return status;
    if (plan->row_parts > 1) {
        const size_t at = plan->dkdv_parts_at;
        if ((status = sum_parts(chain, plan->sum_k, scratch, at, plan->dkdv_part_floats,
                                plan->row_parts, &dk_sums)) ||
            (status = sum_parts(chain, plan->sum_v, scratch, at + plan->dv_part_at,
                                plan->dkdv_part_floats, plan->row_parts, &dv_sums)))
            return status;
    }
    /* dQ: the slots' sums, in order; else the dQ pass (and its parts' sums) */
    const size_t dq_parts = plan->dq_slots ? plan->dq_slots : plan->key_parts;
    if ((!plan->dq_slots && (status = dq_pass(chain, plan, io, scratch, &l))) ||
        ((plan->dq_slots || dq_parts > 1) &&
         (status = sum_parts(chain, plan->sum_q, scratch, plan->dq_parts_at, plan->dq_part_floats,
                             dq_parts, &dq_sums))))
        return status;
    /* dS (B, H, Lq, Lk) summed over the mask's broadcast dims into its gradient */
    if (shape->want_dmask && (status = clattn__bwd_mask_reduce(chain, plan->mask_reduce, scratch,
                                                               plan->dmask_at, score, &io->dmask)))
        return status;
    if (shape->want_dsinks &&
        (status = clattn__bwd_sinks(chain, plan->sinks, scratch, plan->delta_at, score, io)))
        return status;
    return CLATTN_SUCCESS;
}

/* The reductions (also the unfused path's: host/attn/sdpa_backward_unfused.c). */
clattn_status clattn__bwd_sum_parts(clattn_chain *chain, cl_kernel kernel, clattn__scratch scratch,
                                    size_t at, size_t stride, size_t parts, const clattn__view *out)
{
    return sum_parts(chain, kernel, scratch, at, stride, parts, out);
}

clattn_status clattn__bwd_mask_reduce(clattn_chain *chain, cl_kernel kernel,
                                      clattn__scratch scratch, size_t at,
                                      const clattn__score_shape *score, const clattn__view *out)
{
    clattn_bwd_reduce_params p;
    memset(&p, 0, sizeof p);
    CLATTN__VIEW_FIELDS(out, p, out);
    p.in_at = scratch.offset + at;
    p.d0 = (cl_uint)out->dims[0], p.d1 = (cl_uint)out->dims[1];
    p.d2 = (cl_uint)out->dims[2], p.d3 = (cl_uint)out->dims[3];
    p.n0 = (cl_uint)score->batch, p.n1 = (cl_uint)score->heads;
    p.n2 = (cl_uint)score->seq_q, p.n3 = (cl_uint)score->seq_k;
    p.total = (cl_ulong)out->dims[0] * out->dims[1] * out->dims[2] * out->dims[3];
    const clattn_arg args[] = {CLATTN_ARG(scratch.mem), CLATTN_ARG(out->mem), CLATTN_ARG(p)};
    const size_t local = 64, global = rounded((size_t)p.total, local);
    return clattn__launch_kernel(chain, kernel, "bwd_mask_reduce", args, 3, 1, &global, &local);
}

clattn_status clattn__bwd_sinks(clattn_chain *chain, cl_kernel kernel, clattn__scratch scratch,
                                size_t delta_at, const clattn__score_shape *score,
                                const clattn__flash_bwd_io *io)
{
    clattn_bwd_reduce_params p;
    memset(&p, 0, sizeof p);
    p.out_offset = io->dsinks.offset;
    p.out_s0 = io->dsinks.strides[3];
    p.out_s1 = io->lse.strides[1];
    p.out_s2 = io->lse.strides[2];
    p.out_s3 = io->lse.strides[3];
    p.in_stride = io->lse.offset;
    p.in_at = scratch.offset + delta_at;
    p.aux_offset = io->masks.sinks.offset;
    p.aux_s0 = io->masks.sinks.strides[2];
    /* (packed sequences: every packed row of lse (heads, total_q) and delta, as batch 1) */
    p.n0 = (cl_uint)(score->varlen ? 1 : score->batch), p.n1 = (cl_uint)score->heads;
    p.n2 = (cl_uint)(score->varlen ? score->total_q : score->seq_q);
    const clattn_arg args[] = {CLATTN_ARG(scratch.mem), CLATTN_ARG(io->lse.mem),
                               CLATTN_ARG(io->masks.sinks.mem), CLATTN_ARG(io->dsinks.mem),
                               CLATTN_ARG(p)};
    const size_t local = 1, global = score->heads;
    return clattn__launch_kernel(chain, kernel, "bwd_sinks", args, 5, 1, &global, &local);
}

/* ---- attention backward -------------------------------------------------------------------- */

typedef struct bwd_host {
    double *q, *k, *v, *o, *go, *dq, *dk, *dv, *raw, *w, *dcap, *lse;
    unsigned char *bytes;
} bwd_host;

static void free_bwd_host(bwd_host *h)
{
    double *all[] = {h->q,  h->k,  h->v,   h->o, h->go,   h->dq,
                     h->dk, h->dv, h->raw, h->w, h->dcap, h->lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        free(all[i]);
    free(h->bytes);
}

/* dQ, dK, dV in float64: P from the score rule, delta = rowsum(dO * O) of the O given, dS =
 * P (dP - delta) times the soft-cap's derivative, summed over a k/v head's query group. */
static void reference_backward(const clattn__flash_bwd_shape *shape, const clattn__probe_scores *ps,
                               bwd_host *h)
{
    const clattn__score_shape *s = &shape->score;
    const size_t group = s->kv_group > 1 ? s->kv_group : 1, kv_heads = s->heads / group;
    const size_t dk = shape->head_dim_qk, dv = shape->head_dim_v;
    memset(h->dk, 0, s->batch * kv_heads * s->seq_k * dk * sizeof(double));
    memset(h->dv, 0, s->batch * kv_heads * s->seq_k * dv * sizeof(double));
    for (size_t b = 0; b < s->batch; ++b)
        for (size_t hd = 0; hd < s->heads; ++hd)
            for (size_t i = 0; i < s->seq_q; ++i) {
                const size_t row = (b * s->heads + hd) * s->seq_q + i;
                const size_t kv = b * kv_heads + hd / group;
                const double *qi = h->q + row * dk, *gi = h->go + row * dv;
                for (size_t j = 0; j < s->seq_k; ++j) {
                    double dot = 0.0;
                    for (size_t c = 0; c < dk; ++c)
                        dot += qi[c] * h->k[(kv * s->seq_k + j) * dk + c];
                    h->raw[j] = dot;
                }
                double lse;
                clattn__probe_reference_row(ps, b, hd, i, h->raw, h->w, &lse, h->dcap);
                h->lse[row] = lse;
                double delta = 0.0;
                for (size_t c = 0; c < dv; ++c)
                    delta += gi[c] * h->o[row * dv + c];
                for (size_t c = 0; c < dk; ++c)
                    h->dq[row * dk + c] = 0.0;
                for (size_t j = 0; j < s->seq_k; ++j) {
                    const double p = h->w[j];
                    if (p == 0.0)
                        continue;
                    double dp = 0.0;
                    for (size_t c = 0; c < dv; ++c) {
                        dp += gi[c] * h->v[(kv * s->seq_k + j) * dv + c];
                        h->dv[(kv * s->seq_k + j) * dv + c] += p * gi[c];
                    }
                    const double ds = p * (dp - delta) * h->dcap[j] * s->scale;
                    for (size_t c = 0; c < dk; ++c) {
                        h->dq[row * dk + c] += ds * h->k[(kv * s->seq_k + j) * dk + c];
                        h->dk[(kv * s->seq_k + j) * dk + c] += ds * qi[c];
                    }
                }
            }
}

static clattn_status upload_values(clattn_ctx *ctx, clattn__probe_mem *pm, clattn_dtype dtype,
                                   const double *x, size_t count, unsigned char *bytes, cl_mem *out)
{
    clattn__probe_encode(dtype, x, count, bytes);
    return clattn__probe_upload(ctx, pm, bytes, clattn__probe_bytes(dtype, count), out);
}

static const char *bwd_unprobed(const clattn__flash_bwd_shape *shape)
{
    const clattn__score_shape *s = &shape->score;
    return s->varlen                     ? "packed sequences (cu_seqlens)"
           : s->flex_id                  ? "user score functions (flex)"
           : s->dropout                  ? "dropout"
           : s->norm == CLATTN_NORM_RELU ? "relu normalisation"
           : shape->want_dmask           ? "the mask's gradient"
           : shape->want_dsinks          ? "the sinks' gradient"
                                         : NULL;
}

static clattn_status run_bwd_probe(clattn_ctx *ctx, const clattn__flash_bwd_plan *run,
                                   clattn__probe_mem *pm, bwd_host *h, clattn__probe_inputs *in,
                                   clattn__probe_result *r)
{
    const clattn__flash_bwd_shape *shape = &run->shape;
    const clattn__score_shape *s = &shape->score;
    const size_t group = s->kv_group > 1 ? s->kv_group : 1, kv_heads = s->heads / group;
    const size_t dk = shape->head_dim_qk, dv = shape->head_dim_v;
    const size_t rows = s->batch * s->heads * s->seq_q;
    const size_t nq = rows * dk, no = rows * dv;
    const size_t nk = s->batch * kv_heads * s->seq_k * dk, nv = s->batch * kv_heads * s->seq_k * dv;
    const size_t most = nq > nk ? (nq > nv ? nq : nv) : (nk > nv ? nk : nv);
    clattn__probe_rng rng = {0xbac4ULL + dk * 7 + s->seq_k};
    double **arrays[] = {&h->q, &h->k, &h->v, &h->o, &h->go, &h->dq, &h->dk, &h->dv};
    const size_t counts[] = {nq, nk, nv, no, no, nq, nk, nv};
    for (int i = 0; i < 8; ++i)
        *arrays[i] = malloc(counts[i] * sizeof(double) + 8);
    h->raw = malloc(s->seq_k * sizeof(double));
    h->w = malloc(s->seq_k * sizeof(double));
    h->dcap = malloc(s->seq_k * sizeof(double));
    h->lse = malloc(rows * sizeof(double));
    h->bytes = malloc(4 * (most > rows ? most : rows) + 8);
    for (int i = 0; i < 8; ++i)
        if (*arrays[i] == NULL)
            return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
    if (!h->raw || !h->w || !h->dcap || !h->lse || !h->bytes)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "probe: out of host memory");
    const clattn_dtype in_dtypes[5] = {shape->q_dtype, shape->k_dtype, shape->v_dtype,
                                       shape->o_dtype, shape->go_dtype};
    for (int i = 0; i < 5; ++i)
        for (size_t e = 0; e < counts[i]; ++e)
            (*arrays[i])[e] = clattn__probe_grid(&rng, in_dtypes[i]);
    clattn__flash_bwd_io io;
    memset(&io, 0, sizeof io);
    clattn_status status = clattn__probe_draw_modifiers(ctx, &rng, s, pm, in, &io.masks);
    if (status)
        return status;
    reference_backward(shape, &in->scores, h);
    cl_mem mems[9] = {NULL};
    for (int i = 0; i < 5 && status == CLATTN_SUCCESS; ++i)
        status = upload_values(ctx, pm, in_dtypes[i], *arrays[i], counts[i], h->bytes, &mems[i]);
    float *lse = (float *)h->bytes;
    for (size_t i = 0; i < rows; ++i)
        lse[i] = (float)h->lse[i];
    const clattn_dtype out_dtypes[3] = {shape->dq_dtype, shape->dk_dtype, shape->dv_dtype};
    cl_mem scratch = NULL;
    if (status == CLATTN_SUCCESS &&
        ((status = clattn__probe_upload(ctx, pm, lse, rows * sizeof(float), &mems[5])) ||
         (status = clattn__probe_upload(ctx, pm, NULL, clattn__probe_bytes(out_dtypes[0], nq),
                                        &mems[6])) ||
         (status = clattn__probe_upload(ctx, pm, NULL, clattn__probe_bytes(out_dtypes[1], nk),
                                        &mems[7])) ||
         (status = clattn__probe_upload(ctx, pm, NULL, clattn__probe_bytes(out_dtypes[2], nv),
                                        &mems[8])) ||
         (status =
              clattn__probe_upload(ctx, pm, NULL, run->scratch_floats * sizeof(float), &scratch))))
        return status;
    if (status)
        return status;
    io.q = clattn__probe_view(mems[0], shape->q_dtype, s->batch, s->heads, s->seq_q, dk);
    io.k = clattn__probe_view(mems[1], shape->k_dtype, s->batch, kv_heads, s->seq_k, dk);
    io.v = clattn__probe_view(mems[2], shape->v_dtype, s->batch, kv_heads, s->seq_k, dv);
    io.out = clattn__probe_view(mems[3], shape->o_dtype, s->batch, s->heads, s->seq_q, dv);
    io.grad_out = clattn__probe_view(mems[4], shape->go_dtype, s->batch, s->heads, s->seq_q, dv);
    io.lse = clattn__probe_view(mems[5], CLATTN_DTYPE_F32, 1, s->batch, s->heads, s->seq_q);
    io.dq = clattn__probe_view(mems[6], out_dtypes[0], s->batch, s->heads, s->seq_q, dk);
    io.dk = clattn__probe_view(mems[7], out_dtypes[1], s->batch, kv_heads, s->seq_k, dk);
    io.dv = clattn__probe_view(mems[8], out_dtypes[2], s->batch, kv_heads, s->seq_k, dv);
    clattn_chain chain = clattn__probe_chain(ctx);
    status = clattn__flash_bwd_enqueue(&chain, run, &io, (clattn__scratch){scratch, 0});
    const double *want[3] = {h->dq, h->dk, h->dv};
    const size_t sizes[3] = {nq, nk, nv};
    static const char *const names[3] = {"dq", "dk", "dv"};
    r->tolerance = 0.0;
    for (int i = 0; i < 3 && status == CLATTN_SUCCESS; ++i) {
        status = clattn__probe_download(&chain, mems[6 + i],
                                        clattn__probe_bytes(out_dtypes[i], sizes[i]), h->bytes);
        if (status)
            break;
        /* gradients grow with the keys summed: the bound scales with seq_k */
        const double tol = clattn__probe_tolerance(out_dtypes[i]) * 8;
        size_t where = 0;
        const double err =
            clattn__probe_max_error(out_dtypes[i], h->bytes, want[i], sizes[i], &where);
        if (i == 0 || err / tol > r->max_error / r->tolerance) {
            r->max_error = err;
            r->tolerance = tol;
            snprintf(r->why, sizeof r->why, "%s[%zu] of %zu", names[i], where, sizes[i]);
        }
    }
    clattn__chain_push(&chain, NULL);
    return status;
}

static clattn_status bwd_probe(clattn_ctx *ctx, void *unit, clattn__probe_result *r)
{
    const clattn__flash_bwd_plan *prepared = unit;
    const char *unprobed = bwd_unprobed(&prepared->shape);
    clattn__flash_bwd_shape shape = prepared->shape;
    clattn__score_shape *s = &shape.score;
    const size_t group = s->kv_group > 1 ? s->kv_group : 1;
    s->batch = clattn__probe_at_most(s->batch, 2);
    s->kv_group = group > 1 ? clattn__probe_at_most(group, 4) : s->kv_group;
    s->heads = clattn__probe_at_most(s->heads / group, 2) * clattn__probe_at_most(group, 4);
    s->seq_q = clattn__probe_at_most(s->seq_q, 19);
    s->seq_k = clattn__probe_at_most(s->seq_k, 37);
    clattn__flash_bwd_plan run;
    clattn_status status = unprobed ? CLATTN_SUCCESS : clattn__flash_bwd_prepare(ctx, &shape, &run);
    if (status != CLATTN_SUCCESS)
        return status;
    /* the judged kernels in the probe's plan (its sizes may take another variant: then not
     * probed) */
    cl_kernel *mine[3] = {&run.delta, &run.dkdv, &run.dq};
    const cl_kernel judged[3] = {prepared->delta, prepared->dkdv, prepared->dq};
    for (int i = 0; i < 3 && !unprobed; ++i) {
        if (!clattn__same_variant(ctx, judged[i], *mine[i]))
            unprobed = "the probe's sizes take another variant";
        *mine[i] = judged[i];
    }
    if (unprobed) {
        r->checked = false;
        snprintf(r->why, sizeof r->why, "%s", unprobed);
        return CLATTN_SUCCESS;
    }
    clattn__probe_mem pm = {.count = 0};
    bwd_host host;
    memset(&host, 0, sizeof host);
    clattn__probe_inputs in;
    memset(&in, 0, sizeof in);
    status = run_bwd_probe(ctx, &run, &pm, &host, &in, r);
    clattn__probe_release(&pm);
    free_bwd_host(&host);
    clattn__probe_free_inputs(&in);
    return status;
}

clattn_status clattn__flash_bwd_trust(clattn_ctx *ctx, clattn__flash_bwd_plan *plan)
{
    cl_kernel *slots[3] = {&plan->dkdv, plan->dq_slots ? &plan->delta : &plan->dq, &plan->delta};
    return clattn__trust(ctx, "attention backward", slots, plan->dq_slots ? 2 : 3, bwd_probe, plan);
}
