/* kernels/commit.cl: speculative decoding's commit, the accepted draft rows moved down in a KV
 * cache (kv_commit) and the key counts advanced (kv_commit_lengths), two launches. */
#include "ops.h"

#include <string.h>

/* The family (core/family.h); COMMIT_WG: work-items per group along a row's bytes (tuning key
 * heads_wg, capped at 64: rows are short), COMMIT_PAGED: pools through a block table. */
#define COMMIT_SWITCHES(X) X(COMMIT_WG, 0, NULL) X(COMMIT_PAGED, CLATTN_SWITCH_OPTIONAL, NULL)
CLATTN_FAMILY(commit, COMMIT_SWITCHES, .sources = {"commit.cl"}, .tuning_keys = "heads_wg");

clattn_status clattn__commit_prepare(clattn_ctx *ctx, const clattn__commit_shape *shape,
                                     clattn__commit_plan *plan)
{
    static const char op[] = "kv_commit";
    memset(plan, 0, sizeof *plan);
    plan->shape = *shape;
    plan->local = ctx->tuning.heads_wg < 64 ? ctx->tuning.heads_wg : 64;
    const size_t row = shape->k_row > shape->v_row ? shape->k_row : shape->v_row;
    if (!clattn__round_up(row, plan->local, &plan->global[0]) ||
        !clattn__product(&plan->global[1], 2, (size_t)2, shape->heads) ||
        !clattn__round_up(shape->batch, plan->local, &plan->lengths_global))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: %zu-byte rows of %zu heads overflow", op,
                            row, shape->heads);
    plan->global[2] = shape->batch;
    const commit_switches sw = {.COMMIT_WG = (long)plan->local,
                                .COMMIT_PAGED = shape->page_size > 0};
    clattn_status status =
        clattn__family_kernel(ctx, &commit_family, "kv_commit", &sw, NULL, 0, &plan->kernel);
    if (status == CLATTN_SUCCESS)
        status = clattn__family_kernel(ctx, &commit_family, "kv_commit_lengths", &sw, NULL, 0,
                                       &plan->lengths_kernel);
    return status;
}

/* A cache's byte offset and first three byte strides into the struct's fields (the fourth
 * stride is 1: rows are packed); the element offsets and strides count whole blocks. */
static void byte_fields(const clattn__commit_cache *cache, cl_ulong *offset, cl_ulong *s0,
                        cl_ulong *s1, cl_ulong *s2)
{
    const cl_ulong per = cache->elem_bytes, block = cache->block;
    *offset = cache->offset / block * per;
    *s0 = cache->strides[0] / block * per;
    *s1 = cache->strides[1] / block * per;
    *s2 = cache->strides[2] / block * per;
}

clattn_status clattn__commit_enqueue(clattn_chain *chain, const clattn__commit_plan *plan,
                                     const clattn__commit_cache *k, const clattn__commit_cache *v,
                                     const clattn__commit_lists *lists)
{
    const clattn__commit_shape *s = &plan->shape;
    clattn_commit_params p = {.bt_offset = lists->table_offset,
                              .bt_s0 = lists->table_s0,
                              .capacity = s->capacity,
                              .acc_offset = lists->acc_offset,
                              .acc_s0 = lists->acc_s0,
                              .acc_s1 = lists->acc_s1,
                              .len_offset = lists->len_offset,
                              .len_s0 = lists->len_s0,
                              .page_size = (cl_uint)s->page_size,
                              .num_pages = (cl_uint)s->num_pages,
                              .max_accepted = (cl_uint)s->max_accepted,
                              .draft_len = (cl_uint)s->draft_len,
                              .k_row = (cl_uint)s->k_row,
                              .v_row = v->mem ? (cl_uint)s->v_row : 0,
                              .batch = (cl_uint)s->batch};
    byte_fields(k, &p.k_offset, &p.k_s0, &p.k_s1, &p.k_s2);
    if (v->mem)
        byte_fields(v, &p.v_offset, &p.v_s0, &p.v_s1, &p.v_s2);
    const cl_mem v_mem = v->mem ? v->mem : k->mem; /* (v_row 0: never read) */
    /* Contiguous: no table is read; any buffer stands in for the argument. */
    const cl_mem table = lists->table ? lists->table : lists->lengths;
    const clattn_arg args[] = {CLATTN_ARG(table),          CLATTN_ARG(lists->accepted),
                               CLATTN_ARG(lists->lengths), CLATTN_ARG(k->mem),
                               CLATTN_ARG(v_mem),          CLATTN_ARG(p)};
    const size_t local[3] = {plan->local, 1, 1};
    clattn_status status =
        clattn__launch_kernel(chain, plan->kernel, "kv_commit", args, 6, 3, plan->global, local);
    if (status != CLATTN_SUCCESS)
        return status;
    const clattn_arg counts[] = {CLATTN_ARG(table), CLATTN_ARG(lists->accepted),
                                 CLATTN_ARG(lists->lengths), CLATTN_ARG(p)};
    return clattn__launch_kernel(chain, plan->lengths_kernel, "kv_commit_lengths", counts, 4, 1,
                                 &plan->lengths_global, &plan->local);
}
