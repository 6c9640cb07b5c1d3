/* clattn_kv_commit: speculative decoding's commit into a KV cache the caller owns (contiguous
 * or paged), its operands checked here and the rows moved by ops/commit.c. */
#include "plan.h"

#include <stdint.h>
#include <string.h>

void clattn_kv_commit_desc_init(clattn_kv_commit_desc *desc)
{
    clattn__desc_reset(desc, sizeof *desc);
}

static void commit_defaults(void *desc)
{
    clattn_kv_commit_desc_init(desc);
}

static const clattn__desc_type commit_desc = {"clattn_kv_commit_desc",
                                              sizeof(clattn_kv_commit_desc),
                                              sizeof(clattn_kv_commit_desc), commit_defaults};

enum { C_K, C_V, C_TABLE, C_LENGTHS, C_ACCEPTED, C_COUNT };
static const char *const names[C_COUNT] = {"k", "v", "block_table", "kv_seqlen", "accepted"};

/* The operands' layouts: the caches any storage type, the rest I32; k, kv_seqlen and accepted
 * required. */
static clattn_status commit_layouts(clattn_ctx *ctx, const char *op, const clattn_kv_commit_desc *d,
                                    clattn__layout *l)
{
    const clattn_tensor *t[C_COUNT] = {&d->k, &d->v, &d->block_table, &d->kv_seqlen, &d->accepted};
    static const unsigned dtypes[C_COUNT] = {CLATTN__FLOATS | CLATTN__QUANT,
                                             CLATTN__FLOATS | CLATTN__QUANT, CLATTN__I32,
                                             CLATTN__I32, CLATTN__I32};
    static const int ranks[C_COUNT] = {4, 4, 2, 1, 2};
    for (int i = 0; i < C_COUNT; ++i) {
        clattn_status status = clattn__layout_from(ctx, op, names[i], t[i], dtypes[i],
                                                   i != C_TABLE && i != C_ACCEPTED, &l[i]);
        if (status != CLATTN_SUCCESS)
            return status;
        const bool required = i == C_K || i == C_LENGTHS || i == C_ACCEPTED;
        if (!l[i].present && required)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is absent (rank 0)", op,
                                names[i]);
        if (l[i].present && l[i].rank != ranks[i])
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE, "%s: %s has rank %d, expected %d",
                                op, names[i], l[i].rank, ranks[i]);
        if (l[i].present && i <= C_V && l[i].strides[3] != 1)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: %s has stride %zu along head_dim; rows must be packed "
                                "(stride 1)",
                                op, names[i], l[i].strides[3]);
    }
    return CLATTN_SUCCESS;
}

/* The problem's sizes from the layouts: paged pools (num_pages, page_size, kv_heads, d) with a
 * table (batch, blocks), else (batch, kv_heads, capacity, d); v's dims but its last as k's. */
static clattn_status commit_shape(clattn_ctx *ctx, const char *op, const clattn__layout *l,
                                  size_t draft_len, clattn__commit_shape *s)
{
    const clattn__layout *k = &l[C_K], *v = &l[C_V];
    const bool paged = l[C_TABLE].present;
    s->batch = paged ? l[C_TABLE].dims[0] : k->dims[0];
    s->heads = paged ? k->dims[2] : k->dims[1];
    s->page_size = paged ? k->dims[1] : 0;
    s->num_pages = paged ? k->dims[0] : 0;
    s->capacity = k->dims[2];
    if (paged && !clattn__product(&s->capacity, 2, l[C_TABLE].dims[1], s->page_size))
        s->capacity = SIZE_MAX;
    if (v->present &&
        (v->dims[0] != k->dims[0] || v->dims[1] != k->dims[1] || v->dims[2] != k->dims[2]))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: v is (%zu, %zu, %zu, %zu) but k is (%zu, %zu, %zu, %zu): the "
                            "same %s, any head_dim",
                            op, v->dims[0], v->dims[1], v->dims[2], v->dims[3], k->dims[0],
                            k->dims[1], k->dims[2], k->dims[3],
                            paged ? "pages, page size and heads" : "batch, heads and capacity");
    if (l[C_LENGTHS].dims[0] != s->batch || l[C_ACCEPTED].dims[0] != s->batch)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: kv_seqlen is (%zu) and accepted (%zu, %zu) but the batch is %zu "
                            "(%s): expected (%zu) and (%zu, max_accepted)",
                            op, l[C_LENGTHS].dims[0], l[C_ACCEPTED].dims[0], l[C_ACCEPTED].dims[1],
                            s->batch, paged ? "block_table's dim 0" : "k's dim 0", s->batch,
                            s->batch);
    s->max_accepted = l[C_ACCEPTED].dims[1];
    s->draft_len = draft_len;
    if (draft_len == 0 || draft_len > INT32_MAX)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: draft_len = %zu: expected 1 to 2^31 - 1 draft tokens", op,
                            draft_len);
    size_t block = 1, bytes = 0;
    clattn__dtype_blocks(k->dtype, &block, &bytes);
    s->k_row = k->dims[3] / block * bytes;
    clattn__dtype_blocks(v->present ? v->dtype : k->dtype, &block, &bytes);
    s->v_row = v->present ? v->dims[3] / block * bytes : 0;
    if (s->capacity > INT32_MAX || s->num_pages > INT32_MAX || s->batch > UINT32_MAX ||
        s->max_accepted > UINT32_MAX || s->k_row > UINT32_MAX || s->v_row > UINT32_MAX ||
        s->heads > UINT32_MAX / 2)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: sizes past the kernel's 32-bit indices (capacity %zu keys, %zu "
                            "pages, batch %zu, %zu accepted, rows of %zu / %zu bytes, %zu heads)",
                            op, s->capacity, s->num_pages, s->batch, s->max_accepted, s->k_row,
                            s->v_row, s->heads);
    return CLATTN_SUCCESS;
}

/* A bound cache for the op; its byte range [*begin, *end) for the overlap check. */
static void commit_cache(const clattn__layout *l, cl_mem mem, size_t offset,
                         clattn__commit_cache *c, size_t *begin, size_t *end)
{
    c->mem = mem;
    c->offset = offset;
    memcpy(c->strides, l->strides, sizeof c->strides);
    clattn__dtype_blocks(l->dtype, &c->block, &c->elem_bytes);
    *begin = offset / c->block * c->elem_bytes;
    *end = *begin + (l->extent + c->block - 1) / c->block * c->elem_bytes;
}

/* Binds the operands to their buffers (each must hold its layout) into the op's arguments. */
static clattn_status commit_bind(clattn_ctx *ctx, const char *op, const clattn_kv_commit_desc *d,
                                 const clattn__layout *l, clattn__commit_cache caches[2],
                                 clattn__commit_lists *lists)
{
    const clattn_tensor *t[C_COUNT] = {&d->k, &d->v, &d->block_table, &d->kv_seqlen, &d->accepted};
    cl_mem mem[C_COUNT] = {0};
    size_t offset[C_COUNT] = {0}, begin[2] = {0}, end[2] = {0};
    for (int i = 0; i < C_COUNT; ++i) {
        clattn_status status = clattn__bind(ctx, op, names[i], &l[i], t[i], &mem[i], &offset[i]);
        if (status != CLATTN_SUCCESS)
            return status;
    }
    commit_cache(&l[C_K], mem[C_K], offset[C_K], &caches[0], &begin[0], &end[0]);
    memset(&caches[1], 0, sizeof caches[1]);
    if (l[C_V].present)
        commit_cache(&l[C_V], mem[C_V], offset[C_V], &caches[1], &begin[1], &end[1]);
    if (l[C_V].present && mem[C_K] == mem[C_V] && begin[0] < end[1] && begin[1] < end[0])
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: k and v overlap in one buffer (bytes %zu..%zu and %zu..%zu): "
                            "give v absent when the values are a view of the keys",
                            op, begin[0], end[0], begin[1], end[1]);
    *lists = (clattn__commit_lists){.table = mem[C_TABLE],
                                    .accepted = mem[C_ACCEPTED],
                                    .lengths = mem[C_LENGTHS],
                                    .table_offset = offset[C_TABLE],
                                    .table_s0 = l[C_TABLE].strides[0],
                                    .acc_offset = offset[C_ACCEPTED],
                                    .acc_s0 = l[C_ACCEPTED].strides[0],
                                    .acc_s1 = l[C_ACCEPTED].strides[1],
                                    .len_offset = offset[C_LENGTHS],
                                    .len_s0 = l[C_LENGTHS].strides[0]};
    return CLATTN_SUCCESS;
}

clattn_status clattn_kv_commit(clattn_ctx *ctx, const clattn_kv_commit_desc *desc, cl_uint num_wait,
                               const cl_event *wait, cl_event *event)
{
    static const char op[] = "kv_commit";
    clattn_kv_commit_desc d;
    clattn__layout l[C_COUNT];
    clattn__commit_shape shape;
    clattn__commit_plan plan;
    clattn__commit_cache caches[2];
    clattn__commit_lists lists;
    clattn_status status = clattn__entry(ctx, op, desc, num_wait, wait, event);
    if (status == CLATTN_SUCCESS) /* (no out: a device call; `true` skips that check) */
        status = clattn__create_entry(ctx, op, desc, true, &commit_desc, &d);
    if (status != CLATTN_SUCCESS)
        return status;
    if ((status = commit_layouts(ctx, op, &d, l)) ||
        (status = commit_shape(ctx, op, l, d.draft_len, &shape)) ||
        (status = commit_bind(ctx, op, &d, l, caches, &lists)) ||
        (status = clattn__commit_prepare(ctx, &shape, &plan)))
        return status;
    clattn_chain chain;
    status = clattn__begin(ctx, op, &chain, NULL, false, num_wait, wait);
    if (status == CLATTN_SUCCESS)
        status = clattn__commit_enqueue(&chain, &plan, &caches[0], &caches[1], &lists);
    return clattn__end(op, &chain, status, event);
}
