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

struct clattn_cascade {
    clattn_ctx *ctx;
    clattn_cascade_desc desc; /* the layouts it was made for (mem and offset unused) */
    size_t batch, heads, dv;
    clattn_plan *prefix, *suffix; /* the two SDPA plans */
    clattn__merge_plan merge;
    cl_mem scratch; /* float32: o_p (H, B, dv), o_s (B, H, dv), lse_p (H, B), lse_s (B, H) */
    size_t o_s_at, lse_p_at, lse_s_at;
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

/* The prefix problem's tensors: q (B, H, 1, d) viewed as batch 1 with B rows per head,
 * (1, H, B, d) through its strides; out and lse into scratch, (1, H, B, dv) and (1, H, B). */
static void prefix_tensors(const clattn_cascade *c, const clattn_cascade_desc *d,
                           clattn_tensors *t)
{
    memset(t, 0, sizeof *t);
    const clattn_tensor *q = &d->q;
    t->q = (clattn_tensor){q->mem, q->offset, q->dtype, 4,
                           {1, c->heads, c->batch, q->dims[3]},
                           {c->batch * q->strides[0], q->strides[1], q->strides[0], q->strides[3]}};
    t->k = d->prefix_k;
    t->v = d->prefix_v;
    t->out = clattn_tensor_make(c->scratch, 0, CLATTN_DTYPE_F32, 4, 1, c->heads, c->batch, c->dv);
    t->lse = clattn_tensor_make(c->scratch, c->lse_p_at, CLATTN_DTYPE_F32, 3, 1, c->heads,
                                c->batch, 0);
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
 * a prefix of batch 1. */
static clattn_status cascade_shapes(clattn_ctx *ctx, const char *op, const clattn_cascade_desc *d)
{
    if (d->q.rank != 4 || d->q.dims[2] != 1)
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
    if (d->out.rank != 4 || d->out.dims[0] != d->q.dims[0] || d->out.dims[1] != d->q.dims[1] ||
        d->out.dims[2] != 1 || d->out.dims[3] != d->prefix_v.dims[3])
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: out must be (batch %zu, heads %zu, 1, head_dim_v %zu)", op,
                            d->q.dims[0], d->q.dims[1], d->prefix_v.dims[3]);
    return CLATTN_SUCCESS;
}

static clattn_status cascade_scratch(clattn_cascade *c, const char *op)
{
    size_t rows = 0, block = 0, floats = 0;
    if (!clattn__product(&rows, 2, c->batch, c->heads) ||
        !clattn__product(&block, 2, rows, c->dv) || !clattn__product(&floats, 2, block + 1, 2) ||
        floats > SIZE_MAX / sizeof(float))
        return clattn__fail(c->ctx, CLATTN_ERR_OVERFLOW, "%s: the states overflow size_t", op);
    c->o_s_at = block;
    c->lse_p_at = 2 * block;
    c->lse_s_at = 2 * block + rows;
    cl_int err = CL_SUCCESS;
    c->scratch = clCreateBuffer(c->ctx->context, CL_MEM_READ_WRITE,
                                (2 * block + 2 * rows) * sizeof(float), NULL, &err);
    if (err != CL_SUCCESS || c->scratch == NULL)
        return clattn__fail(c->ctx, err != CL_SUCCESS ? (clattn_status)err : CLATTN_ERR_HOST_MEMORY,
                            "%s: clCreateBuffer(states, %zu bytes)", op,
                            (2 * block + 2 * rows) * sizeof(float));
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
    c->dv = d->prefix_v.dims[3];
    if ((status = cascade_outputs(c, op)) || (status = cascade_scratch(c, op)))
        return status;
    clattn_tensors t;
    prefix_tensors(c, d, &t);
    if ((status = cascade_plan(c, &t, &c->prefix)))
        return clattn__end_message(c->ctx, "cascade (the shared prefix)", status);
    suffix_tensors(c, d, &t);
    if ((status = cascade_plan(c, &t, &c->suffix)))
        return clattn__end_message(c->ctx, "cascade (the suffixes)", status);
    const size_t rows[3] = {c->batch, c->heads, 1};
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

/* The merge's operands: o_s and o_p (scratch, as (B, H, 1, dv) views), the caller's out. */
static clattn_status merge_views(clattn_cascade *c, const clattn_cascade_desc *d,
                                 clattn__merge_io *io)
{
    const size_t B = c->batch, H = c->heads, dv = c->dv;
    const clattn__view o_s = {c->scratch, c->o_s_at, CLATTN_DTYPE_F32, {B, H, 1, dv},
                              {H * dv, dv, dv, 1}};
    const clattn__view o_p = {c->scratch, 0, CLATTN_DTYPE_F32, {B, H, 1, dv}, {dv, B * dv, dv, 1}};
    /* lse views hold the rows in dims 1 .. 3 */
    const clattn__view lse_s = {c->scratch, c->lse_s_at, CLATTN_DTYPE_F32, {1, B, H, 1},
                                {0, H, 1, 1}};
    const clattn__view lse_p = {c->scratch, c->lse_p_at, CLATTN_DTYPE_F32, {1, B, H, 1},
                                {0, 1, B, 1}};
    *io = (clattn__merge_io){.o_a = o_s, .lse_a = lse_s, .o_b = o_p, .lse_b = lse_p};
    cl_mem mem = NULL;
    size_t offset = 0;
    clattn_status status = clattn__bind(c->ctx, "cascade_execute", "out", &c->out, &d->out, &mem,
                                        &offset);
    if (status != CLATTN_SUCCESS)
        return status;
    clattn__view_of(&c->out, &io->o);
    io->o.mem = mem;
    io->o.offset = offset;
    if ((status = clattn__bind(c->ctx, "cascade_execute", "lse", &c->lse, &d->lse, &mem,
                               &offset)))
        return status;
    if (c->lse.present) {
        clattn__view_of(&c->lse, &io->lse);
        io->lse.mem = mem;
        io->lse.offset = offset;
    }
    return CLATTN_SUCCESS;
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
    cl_event prefix_done = NULL, suffix_done = NULL;
    clattn_tensors t;
    prefix_tensors(cascade, tensors, &t);
    status = clattn_plan_execute(cascade->prefix, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                 num_wait, wait, &prefix_done);
    if (status == CLATTN_SUCCESS) {
        suffix_tensors(cascade, tensors, &t);
        status = clattn_plan_execute(cascade->suffix, t.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 1,
                                     &prefix_done, &suffix_done);
    }
    if (status != CLATTN_SUCCESS) {
        if (prefix_done)
            clReleaseEvent(prefix_done);
        return clattn__end_message(ctx, op, status);
    }
    clattn_chain chain;
    status = clattn__begin(ctx, op, &chain, NULL, false, 1, &suffix_done);
    if (status == CLATTN_SUCCESS)
        status = clattn__merge_enqueue(&chain, &cascade->merge, &io);
    status = clattn__end(op, &chain, status, event);
    clReleaseEvent(prefix_done);
    clReleaseEvent(suffix_done);
    return status;
}
