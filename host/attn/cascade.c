/* Attention states merged by their log-sum-exp (clattn_merge_states) and cascade decoding
 * (clattn_cascade_*): a batch whose requests share one stored prefix attends to it as one
 * problem (every request's query row against the one prefix), to each suffix per request, and
 * merges the two states, so that a step reads the prefix once, not once per request. */
#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- clattn_merge_states ------------------------------------------------------------------ */

/* The six tensors of a merge, validated and bound: views as ops/merge.c takes them. */
static clattn_status merge_operand(clattn_ctx *ctx, const char *op, const char *name,
                                   const clattn_tensor *t, bool is_lse, bool output,
                                   const clattn__layout *like, clattn__view *view)
{
    memset(view, 0, sizeof *view);
    if (t == NULL || t->rank == 0) {
        if (output && is_lse)
            return CLATTN_SUCCESS; /* lse out is optional */
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is %s", op, name,
                            t == NULL ? "NULL" : "absent (rank 0)");
    }
    clattn__layout l;
    clattn_status status = clattn__layout_from(ctx, op, name, t, is_lse ? CLATTN__F32 :
                                               CLATTN__FLOATS, output, &l);
    if (status != CLATTN_SUCCESS)
        return status;
    if (like == NULL) { /* o_a: the shape every other operand follows */
        if (l.rank < 2)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                "%s: o_a has rank %d; expected rank 2 to 4, (rows.., head_dim), "
                                "e.g. (seq_len, heads, head_dim) or (batch, heads, seq_q, "
                                "head_dim)",
                                op, l.rank);
    } else if (is_lse) {
        if ((status = clattn__layout_expect(ctx, op, name, &l, like->rank - 1, like->dims,
                                            "(o_a's dims without head_dim), F32")))
            return status;
    } else if ((status = clattn__layout_expect(ctx, op, name, &l, like->rank, like->dims,
                                               "(o_a's dims)"))) {
        return status;
    }
    cl_mem mem = NULL;
    size_t offset = 0;
    if ((status = clattn__bind(ctx, op, name, &l, t, &mem, &offset)))
        return status;
    clattn__view_of(&l, view);
    view->mem = mem;
    view->offset = offset;
    return CLATTN_SUCCESS;
}

/* Every row dim and head_dim within the kernel's 32-bit indices. */
static clattn_status merge_dims(clattn_ctx *ctx, const char *op, const clattn__view *o_a,
                                size_t rows[3])
{
    for (int d = 0; d < 4; ++d)
        if (o_a->dims[d] > UINT32_MAX)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: o_a's dimension %zu is past 2^32 - 1", op, o_a->dims[d]);
    size_t count = 0;
    if (!clattn__product(&count, 3, o_a->dims[0], o_a->dims[1], o_a->dims[2]))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: o_a's rows overflow size_t", op);
    memcpy(rows, o_a->dims, 3 * sizeof rows[0]);
    return CLATTN_SUCCESS;
}

clattn_status clattn_merge_states(clattn_ctx *ctx, const clattn_tensor *o_a,
                                  const clattn_tensor *lse_a, const clattn_tensor *o_b,
                                  const clattn_tensor *lse_b, const clattn_tensor *o,
                                  const clattn_tensor *lse, cl_uint num_wait, const cl_event *wait,
                                  cl_event *event)
{
    static const char op[] = "merge_states";
    clattn_status status = clattn__entry(ctx, op, ctx, num_wait, wait, event);
    if (status != CLATTN_SUCCESS)
        return status;
    clattn__merge_io io;
    clattn__layout like;
    if ((status = merge_operand(ctx, op, "o_a", o_a, false, false, NULL, &io.o_a)))
        return status;
    clattn__layout_from(ctx, op, "o_a", o_a, CLATTN__FLOATS, false, &like);
    if ((status = merge_operand(ctx, op, "lse_a", lse_a, true, false, &like, &io.lse_a)) ||
        (status = merge_operand(ctx, op, "o_b", o_b, false, false, &like, &io.o_b)) ||
        (status = merge_operand(ctx, op, "lse_b", lse_b, true, false, &like, &io.lse_b)) ||
        (status = merge_operand(ctx, op, "o", o, false, true, &like, &io.o)) ||
        (status = merge_operand(ctx, op, "lse", lse, true, true, &like, &io.lse)))
        return status;
    size_t rows[3];
    if ((status = merge_dims(ctx, op, &io.o_a, rows)))
        return status;
    clattn__merge_plan plan;
    if ((status = clattn__merge_prepare(ctx, rows, io.o_a.dims[3], io.o_a.dtype, io.o_b.dtype,
                                        io.o.dtype, &plan)))
        return status;
    clattn_chain chain;
    status = clattn__begin(ctx, op, &chain, NULL, false, num_wait, wait);
    if (status == CLATTN_SUCCESS)
        status = clattn__merge_enqueue(&chain, &plan, &io);
    return clattn__end(op, &chain, status, event);
}

/* ---- cascade decoding ------------------------------------------------------------------- */

/* Rows of the merge: (batch, kv heads, group), query head h = g * group + j. The prefix runs
 * per kv head with its group's rows of every request together, (1, Hkv, B * group, d), so a
 * kv head's prefix is read once whatever the group size; with group > 1, q is first copied
 * into that order (the copy `fold`), one (B, H, d) copy per step. */
struct clattn_cascade {
    clattn_ctx *ctx;
    clattn_cascade_desc desc; /* the layouts it was made for (mem and offset unused) */
    size_t batch, heads, kv_heads, group, dk, dv;
    clattn_plan *prefix, *suffix; /* the two SDPA plans */
    clattn__copy_plan fold;       /* group > 1: q into (Hkv, B, group, dk) float32 */
    clattn__merge_plan merge;
    /* float32 scratch: o_p (Hkv, B * group, dv) at 0, o_s (B, H, dv), lse_p (Hkv, B * group),
     * lse_s (B, H), the folded q (Hkv, B * group, dk) */
    cl_mem scratch;
    size_t o_s_at, lse_p_at, lse_s_at, q_at;
    clattn__layout out, lse; /* the caller's outputs, as bound at execution */
};

void clattn_cascade_desc_init(clattn_cascade_desc *desc)
{
    if (clattn__desc_reset(desc, sizeof *desc))
        desc->scale = NAN;
}

static void cascade_defaults(void *desc)
{
    clattn_cascade_desc_init(desc);
}
static const clattn__desc_type cascade_desc_type = {"clattn_cascade_desc",
                                                    sizeof(clattn_cascade_desc),
                                                    sizeof(clattn_cascade_desc), cascade_defaults};

void clattn_cascade_release(clattn_cascade *cascade)
{
    if (cascade == NULL)
        return;
    clattn_plan_release(cascade->prefix);
    clattn_plan_release(cascade->suffix);
    if (cascade->scratch)
        clReleaseMemObject(cascade->scratch);
    free(cascade);
}

/* The prefix problem's tensors: every request's rows of a kv head's group as one batch,
 * (1, Hkv, B * group, d): q viewed so through its strides when group is 1 (rows b), else the
 * folded copy (rows b * group + j); out and lse into scratch. */
static void prefix_tensors(const clattn_cascade *c, const clattn_cascade_desc *d,
                           clattn_tensors *t)
{
    memset(t, 0, sizeof *t);
    const clattn_tensor *q = &d->q;
    const size_t rows = c->batch * c->group;
    if (c->group == 1)
        t->q = (clattn_tensor){q->mem,
                               q->offset,
                               q->dtype,
                               4,
                               {1, c->heads, c->batch, c->dk},
                               {c->batch * q->strides[0], q->strides[1], q->strides[0],
                                q->strides[3]}};
    else
        t->q = clattn_tensor_make(c->scratch, c->q_at, CLATTN_DTYPE_F32, 4, 1, c->kv_heads, rows,
                                  c->dk);
    t->k = d->prefix_k;
    t->v = d->prefix_v;
    t->out = clattn_tensor_make(c->scratch, 0, CLATTN_DTYPE_F32, 4, 1, c->kv_heads, rows, c->dv);
    t->lse = clattn_tensor_make(c->scratch, c->lse_p_at, CLATTN_DTYPE_F32, 3, 1, c->kv_heads,
                                rows, 0);
}

/* The suffixes' problem: the caller's q, k, v, kv_seqlen, block_table; out and lse into
 * scratch, (B, H, 1, dv) and (B, H, 1). */
static void suffix_tensors(const clattn_cascade *c, const clattn_cascade_desc *d,
                           clattn_tensors *t)
{
    memset(t, 0, sizeof *t);
    t->q = d->q;
    t->k = d->k;
    t->v = d->v;
    t->kv_seqlen = d->kv_seqlen;
    t->block_table = d->block_table;
    t->out = clattn_tensor_make(c->scratch, c->o_s_at, CLATTN_DTYPE_F32, 4, c->batch, c->heads, 1,
                                c->dv);
    t->lse = clattn_tensor_make(c->scratch, c->lse_s_at, CLATTN_DTYPE_F32, 3, c->batch, c->heads,
                                1, 0);
}

static clattn_status cascade_plan(clattn_cascade *c, const clattn_tensors *t, clattn_plan **out)
{
    clattn_sdpa_desc sd;
    clattn_sdpa_desc_init(&sd);
    CLATTN_BIND_ROLES(sd, *t);
    sd.scale = c->desc.scale;
    sd.path = CLATTN_PATH_FUSED;
    return clattn_sdpa_plan_create(c->ctx, &sd, out);
}

/* The shapes the cascade takes (beyond what the SDPA plans check): one query row per request,
 * a prefix of batch 1 whose kv heads divide q's heads. */
static clattn_status cascade_shapes(clattn_ctx *ctx, const char *op, const clattn_cascade_desc *d)
{
    if (d->q.rank != 4 || d->q.dims[2] != 1 || d->q.dims[0] == 0 || d->q.dims[1] == 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: q must be (batch, heads, 1, head_dim_qk): one decoding row per "
                            "request (rank %d, %zu rows given)",
                            op, d->q.rank, d->q.rank == 4 ? d->q.dims[2] : (size_t)0);
    if (d->prefix_k.rank != 4 || d->prefix_k.dims[0] != 1 || d->prefix_v.rank != 4 ||
        d->prefix_v.dims[0] != 1)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: prefix_k and prefix_v must be (1, kv_heads, prefix_len, "
                            "head_dim): one prefix stored once for the whole batch",
                            op);
    const size_t kv_heads = d->prefix_k.dims[1];
    if (kv_heads == 0 || d->q.dims[1] % kv_heads != 0 || d->prefix_v.dims[1] != kv_heads)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: prefix_k has %zu kv heads and prefix_v %zu: expected one "
                            "count that divides q's %zu heads",
                            op, kv_heads, d->prefix_v.dims[1], d->q.dims[1]);
    if (d->out.rank != 4 || d->out.dims[0] != d->q.dims[0] || d->out.dims[1] != d->q.dims[1] ||
        d->out.dims[2] != 1 || d->out.dims[3] != d->prefix_v.dims[3])
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: out must be (batch %zu, heads %zu, 1, head_dim_v %zu)", op,
                            d->q.dims[0], d->q.dims[1], d->prefix_v.dims[3]);
    return CLATTN_SUCCESS;
}

static clattn_status cascade_scratch(clattn_cascade *c, const char *op)
{
    size_t rows = 0, block = 0, q_floats = 0, floats = 0;
    if (!clattn__product(&rows, 2, c->batch, c->heads) ||
        !clattn__product(&block, 2, rows, c->dv) ||
        !clattn__product(&q_floats, 2, rows, c->group > 1 ? c->dk : 0) ||
        !clattn__product(&floats, 2, block + rows, 2) || floats > SIZE_MAX - q_floats ||
        floats + q_floats > SIZE_MAX / sizeof(float))
        return clattn__fail(c->ctx, CLATTN_ERR_OVERFLOW, "%s: the states overflow size_t", op);
    c->o_s_at = block;
    c->lse_p_at = 2 * block;
    c->lse_s_at = 2 * block + rows;
    c->q_at = floats;
    const size_t bytes = (floats + q_floats) * sizeof(float);
    cl_int err = CL_SUCCESS;
    c->scratch = clCreateBuffer(c->ctx->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS || c->scratch == NULL)
        return clattn__fail(c->ctx, err != CL_SUCCESS ? (clattn_status)err : CLATTN_ERR_HOST_MEMORY,
                            "%s: clCreateBuffer(states, %zu bytes)", op, bytes);
    return CLATTN_SUCCESS;
}

static clattn_status cascade_outputs(clattn_cascade *c, const char *op)
{
    const clattn_cascade_desc *d = &c->desc;
    clattn_status status =
        clattn__layout_from(c->ctx, op, "out", &d->out, CLATTN__FLOATS, true, &c->out);
    if (status == CLATTN_SUCCESS)
        status = clattn__layout_from(c->ctx, op, "lse", &d->lse, CLATTN__F32, true, &c->lse);
    if (status == CLATTN_SUCCESS && c->lse.present) {
        const size_t dims[3] = {c->batch, c->heads, 1};
        status = clattn__layout_expect(c->ctx, op, "lse", &c->lse, 3, dims, "(batch, heads, 1)");
    }
    return status;
}

static clattn_status cascade_build(clattn_cascade *c, const char *op)
{
    const clattn_cascade_desc *d = &c->desc;
    clattn_status status = cascade_shapes(c->ctx, op, d);
    if (status != CLATTN_SUCCESS)
        return status;
    c->batch = d->q.dims[0];
    c->heads = d->q.dims[1];
    c->kv_heads = d->prefix_k.dims[1];
    c->group = c->heads / c->kv_heads;
    c->dk = d->q.dims[3];
    c->dv = d->prefix_v.dims[3];
    if ((status = cascade_outputs(c, op)) || (status = cascade_scratch(c, op)))
        return status;
    if (c->group > 1) {
        const size_t box[4] = {c->kv_heads, c->batch, c->group, c->dk};
        if ((status = clattn__copy_prepare(c->ctx, box, d->q.dtype, CLATTN_DTYPE_F32, &c->fold)))
            return status;
    }
    clattn_tensors t;
    prefix_tensors(c, d, &t);
    if ((status = cascade_plan(c, &t, &c->prefix)))
        return clattn__end_message(c->ctx, "cascade (the shared prefix)", status);
    suffix_tensors(c, d, &t);
    if ((status = cascade_plan(c, &t, &c->suffix)))
        return clattn__end_message(c->ctx, "cascade (the suffixes)", status);
    const size_t rows[3] = {c->batch, c->kv_heads, c->group};
    return clattn__merge_prepare(c->ctx, rows, c->dv, CLATTN_DTYPE_F32, CLATTN_DTYPE_F32,
                                 c->out.dtype, &c->merge);
}

clattn_status clattn_cascade_create(clattn_ctx *ctx, const clattn_cascade_desc *desc,
                                    clattn_cascade **out)
{
    static const char op[] = "cascade_create";
    clattn_cascade_desc full;
    clattn_status status = clattn__create_entry(ctx, op, desc, true, &cascade_desc_type, &full);
    if (status != CLATTN_SUCCESS)
        return status;
    *out = NULL;
    clattn_cascade *c = calloc(1, sizeof *c);
    if (c == NULL)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", op);
    c->ctx = ctx;
    c->desc = full;
    status = cascade_build(c, op);
    if (status != CLATTN_SUCCESS) {
        clattn_cascade_release(c);
        return status;
    }
    *out = c;
    return CLATTN_SUCCESS;
}

/* A caller's output bound (clattn__bind) as the merge's (B, Hkv, group) rows: query head
 * g * group + j at g * group * s1 + j * s1. `rows_at` is 0 for out ((B, H, 1, dv): rows in
 * dims 0 .. 2), 1 for lse ((B, H, 1): rows in dims 1 .. 3). */
static clattn_status bind_grouped(clattn_cascade *c, const char *name, const clattn__layout *l,
                                  const clattn_tensor *t, int rows_at, clattn__view *view)
{
    memset(view, 0, sizeof *view);
    cl_mem mem = NULL;
    size_t offset = 0;
    const clattn_status status = clattn__bind(c->ctx, "cascade_execute", name, l, t, &mem, &offset);
    if (status != CLATTN_SUCCESS || !l->present)
        return status;
    const size_t G = c->kv_heads, group = c->group;
    *view = (clattn__view){mem, offset, l->dtype, {0}, {0}};
    const size_t dims[4] = {c->batch, G, group, c->dv};
    const size_t strides[4] = {l->strides[0], group * l->strides[1], l->strides[1],
                               rows_at == 0 ? l->strides[3] : 0};
    for (int i = 0; i < 4 - rows_at; ++i) {
        view->dims[i + rows_at] = dims[i];
        view->strides[i + rows_at] = strides[i];
    }
    if (rows_at == 1)
        view->dims[0] = 1;
    return CLATTN_SUCCESS;
}

/* The merge's operands over (B, Hkv, group) rows: o_s and o_p in scratch, the caller's out. */
static clattn_status merge_views(clattn_cascade *c, const clattn_cascade_desc *d,
                                 clattn__merge_io *io)
{
    const size_t B = c->batch, H = c->heads, G = c->kv_heads, g = c->group, dv = c->dv;
    const clattn__view o_s = {c->scratch, c->o_s_at, CLATTN_DTYPE_F32, {B, G, g, dv},
                              {H * dv, g * dv, dv, 1}};
    const clattn__view o_p = {c->scratch, 0, CLATTN_DTYPE_F32, {B, G, g, dv},
                              {g * dv, B * g * dv, dv, 1}};
    /* lse views hold the rows in dims 1 .. 3 */
    const clattn__view lse_s = {c->scratch, c->lse_s_at, CLATTN_DTYPE_F32, {1, B, G, g},
                                {0, H, g, 1}};
    const clattn__view lse_p = {c->scratch, c->lse_p_at, CLATTN_DTYPE_F32, {1, B, G, g},
                                {0, g, B * g, 1}};
    *io = (clattn__merge_io){.o_a = o_s, .lse_a = lse_s, .o_b = o_p, .lse_b = lse_p};
    clattn_status status = bind_grouped(c, "out", &c->out, &d->out, 0, &io->o);
    if (status == CLATTN_SUCCESS)
        status = bind_grouped(c, "lse", &c->lse, &d->lse, 1, &io->lse);
    return status;
}

/* group > 1: q (B, H, 1, dk) into scratch as (Hkv, B, group, dk) float32, after `wait`. */
static clattn_status fold_queries(clattn_cascade *c, const clattn_cascade_desc *d,
                                  cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    static const char op[] = "cascade_execute";
    const clattn_tensor *q = &d->q;
    const size_t G = c->kv_heads, g = c->group;
    const clattn__view src = {q->mem, q->offset, q->dtype, {G, c->batch, g, c->dk},
                              {g * q->strides[1], q->strides[0], q->strides[1], q->strides[3]}};
    const clattn__view dst = {c->scratch, c->q_at, CLATTN_DTYPE_F32, {G, c->batch, g, c->dk},
                              {c->batch * g * c->dk, g * c->dk, c->dk, 1}};
    clattn_chain chain;
    clattn_status status = clattn__begin(c->ctx, op, &chain, NULL, false, num_wait, wait);
    if (status == CLATTN_SUCCESS)
        status = clattn__copy_enqueue(&chain, &c->fold, &src, &dst);
    return clattn__end(op, &chain, status, done);
}

/* The prefix and the suffixes (after the fold when there is one); *suffix_done: the last. */
static clattn_status attend_parts(clattn_cascade *c, const clattn_cascade_desc *d,
                                  cl_uint num_wait, const cl_event *wait, cl_event *suffix_done)
{
    cl_event folded = NULL, prefix_done = NULL;
    clattn_status status = CLATTN_SUCCESS;
    if (c->group > 1) {
        if ((status = fold_queries(c, d, num_wait, wait, &folded)))
            return status;
        num_wait = 1, wait = &folded;
    }
    clattn_tensors t;
    prefix_tensors(c, d, &t);
    status = clattn_plan_execute(c->prefix, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL, num_wait,
                                 wait, &prefix_done);
    if (status == CLATTN_SUCCESS) {
        suffix_tensors(c, d, &t);
        status = clattn_plan_execute(c->suffix, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 1,
                                     &prefix_done, suffix_done);
    }
    if (folded)
        clReleaseEvent(folded);
    if (prefix_done)
        clReleaseEvent(prefix_done);
    return status;
}

clattn_status clattn_cascade_execute(clattn_cascade *cascade, const clattn_cascade_desc *tensors,
                                     cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    static const char op[] = "cascade_execute";
    if (cascade == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    clattn_ctx *ctx = cascade->ctx;
    clattn_status status = clattn__entry(ctx, op, tensors, num_wait, wait, event);
    if (status != CLATTN_SUCCESS)
        return status;
    clattn__merge_io io;
    if ((status = merge_views(cascade, tensors, &io)))
        return status;
    cl_event suffix_done = NULL;
    if ((status = attend_parts(cascade, tensors, num_wait, wait, &suffix_done)))
        return clattn__end_message(ctx, op, status);
    clattn_chain chain;
    status = clattn__begin(ctx, op, &chain, NULL, false, 1, &suffix_done);
    if (status == CLATTN_SUCCESS)
        status = clattn__merge_enqueue(&chain, &cascade->merge, &io);
    status = clattn__end(op, &chain, status, event);
    clReleaseEvent(suffix_done);
    return status;
}
