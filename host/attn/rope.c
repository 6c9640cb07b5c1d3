/* Rotary plans: RoPE on (batch, heads, seq, head_dim) views, ONNX RotaryEmbedding's rules. */
#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void clattn_rope_desc_init(clattn_rope_desc *desc)
{
    if (clattn__desc_reset(desc, sizeof *desc)) {
        desc->rotary_dim = CLATTN_ROPE_WHOLE_HEAD;
        desc->base = CLATTN_ROPE_BASE_DEFAULT;
    }
}

static bool same_layout(const clattn__layout *a, const clattn__layout *b)
{
    if (a->dtype != b->dtype || a->rank != b->rank)
        return false;
    for (int d = 0; d < a->rank; ++d)
        if (a->dims[d] != b->dims[d] || a->strides[d] != b->strides[d])
            return false;
    return true;
}

clattn_status clattn__make_angle_table(clattn_plan *plan, size_t rows, size_t rot, size_t start,
                                       double base)
{
    clattn_ctx *ctx = plan->ctx;
    const size_t half = rot / 2, count = rows * half;
    float *values = malloc(2 * count * sizeof(float) + 1);
    if (values == NULL)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", plan->op);
    for (size_t j = 0; j < half; ++j) {
        const double w = pow(base, -2.0 * (double)j / (double)rot);
        for (size_t r = 0; r < rows; ++r) {
            const double t = (double)(start + r) * w;
            values[r * half + j] = (float)cos(t);
            values[count + r * half + j] = (float)sin(t);
        }
    }
    const clattn_status status = clattn__plan_upload(
        plan, &plan->angles.table, values, 2 * count * sizeof(float), "the rotary angles");
    free(values);
    if (status != CLATTN_SUCCESS)
        return status;
    plan->angles.rows = rows;
    plan->angles.half = half;
    return CLATTN_SUCCESS;
}

void clattn__angle_views(const clattn_plan *plan, clattn__view *cos_view, clattn__view *sin_view)
{
    const size_t rows = plan->angles.rows, half = plan->angles.half;
    clattn__view v = {.mem = plan->angles.table,
                      .offset = 0,
                      .dtype = CLATTN_DTYPE_F32,
                      .dims = {1, 1, rows, half},
                      .strides = {0, 0, half, 1}};
    *cos_view = v;
    v.offset = rows * half;
    *sin_view = v;
}

clattn_status clattn__rope_fields_prepare(clattn_plan *plan, const clattn__rope_fields *fields,
                                          size_t head_dim, size_t longest, bool *on,
                                          clattn__rope_shape *shape)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    *on = false;
    memset(shape, 0, sizeof *shape);
    if (fields->rope != 0 && fields->rope != 1)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: rope=%d: 0 (off) or 1 (on)", op,
                            fields->rope);
    if (fields->rope == 0)
        return CLATTN_SUCCESS;
    if ((unsigned)fields->style > CLATTN_ROPE_PAIRS)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: rope_style=%d is not a clattn_rope_style (0 HALVES, 1 PAIRS)", op,
                            (int)fields->style);
    const size_t rot = fields->dims == CLATTN_ROPE_WHOLE_HEAD ? head_dim : fields->dims;
    if (rot == 0 || rot % 2 != 0 || rot > head_dim)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: rope_dims=%zu: must be even, at least 2 and at most the head "
                            "size %zu (CLATTN_ROPE_WHOLE_HEAD: all of it)",
                            op, fields->dims, head_dim);
    size_t end = 0;
    if (!clattn__add(fields->start, longest, &end) || end > ((size_t)1 << 24))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: rope_start=%zu with %zu rows: rotary positions must stay below "
                            "2^24 = 16777216",
                            op, fields->start, longest);
    double base = 0.0;
    clattn_status status = clattn__plan_base(plan, "rope_base", fields->base, &base);
    if (status != CLATTN_SUCCESS)
        return status;
    /* The angles of positions start .. start + longest - 1 once, in double (a table of at most
     * CLATTN__ANGLE_TABLE_MAX entries), else computed on the device. */
    const bool table = longest * (rot / 2) <= CLATTN__ANGLE_TABLE_MAX;
    status = table ? clattn__make_angle_table(plan, longest, rot, fields->start, base)
              : clattn__make_frequencies(plan, rot / 2, rot, base);
    if (status != CLATTN_SUCCESS)
        return status;
    shape->dim = head_dim;
    shape->rot = rot;
    shape->pairs = fields->style == CLATTN_ROPE_PAIRS;
    shape->cache_mode = table ? 1 : 0;
    shape->start = table ? 0 : fields->start;
    *on = true;
    return CLATTN_SUCCESS;
}

/* Where the angles come from (shape's cache_mode, start): the caller's rope_cos/rope_sin, by
 * position_ids (1) or per (batch, row) (2); else computed: a table of the positions made now
 * when they are known and it fits (1), or the frequencies, the device computing the angles. */
static clattn_status plan_angles(clattn_plan *plan, const clattn_rope_desc *desc,
                                 clattn__rope_shape *shape)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    const clattn__layout *cos_l = &l[R_ROPE_COS], *sin_l = &l[R_ROPE_SIN], *ids = &l[R_POS_IDS];
    const size_t half = shape->rot / 2;
    clattn_status status;
    if (ids->present) {
        const size_t want[2] = {shape->batch, shape->seq};
        if ((status = clattn__layout_expect(ctx, op, "position_ids", ids, 2, want,
                                            "(batch, seq) of I32 positions")))
            return status;
    }
    if (cos_l->present != sin_l->present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: rope_cos and rope_sin go together", op);
    if (cos_l->present) {
        if (!same_layout(cos_l, sin_l))
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                "%s: rope_cos and rope_sin must have the same dims, strides and "
                                "dtype",
                                op);
        if (ids->present) {
            if (cos_l->rank != 2 || cos_l->dims[1] != half)
                return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                    "%s: with position_ids, rope_cos must be (max_pos, "
                                    "rotary_dim / 2 = %zu)",
                                    op, half);
            shape->cache_mode = 1;
            return CLATTN_SUCCESS;
        }
        const size_t want[3] = {shape->batch, shape->seq, half};
        if ((status = clattn__layout_expect(ctx, op, "rope_cos", cos_l, 3, want,
                                            "(batch, seq, rotary_dim / 2) without "
                                            "position_ids")))
            return status;
        shape->cache_mode = 2;
        return CLATTN_SUCCESS;
    }
    size_t end = 0;
    if (!clattn__add(desc->start, shape->seq, &end))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: start + seq overflows size_t", op);
    if (!ids->present && end > ((size_t)1 << 24))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: positions %zu .. %zu: computed angles take positions below "
                            "2^24 = 16777216",
                            op, desc->start, end - 1);
    double base = 0.0;
    if ((status = clattn__plan_base(plan, "base", desc->base, &base)))
        return status;
    if (ids->present || shape->seq * half > CLATTN__ANGLE_TABLE_MAX)
        return clattn__make_frequencies(plan, half, shape->rot, base);
    /* Positions known now: the angles once, in double (the device would recompute each for
     * every batch entry and head). */
    if ((status = clattn__make_angle_table(plan, shape->seq, shape->rot, desc->start, base)))
        return status;
    shape->cache_mode = 1;
    shape->start = 0; /* row s of the table is position start + s */
    return CLATTN_SUCCESS;
}

static clattn_status create(clattn_plan *plan, const void *any)
{
    const clattn_rope_desc *desc = any;
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *x = &plan->layouts[R_Q], *out = &plan->layouts[R_OUT];
    if ((unsigned)desc->style > CLATTN_ROPE_PAIRS)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: style=%d is not a clattn_rope_style", op, (int)desc->style);
    if (!x->present || !out->present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: %s is required", op,
                            x->present ? "out" : "x (tensors.q)");
    if (x->rank != 4)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: x has rank %d; expected (batch, heads, seq, head_dim)", op,
                            x->rank);
    clattn_status status =
        clattn__layout_expect(ctx, op, "out", out, 4, x->dims, "x's (batch, heads, seq, head_dim)");
    if (status != CLATTN_SUCCESS)
        return status;
    clattn__rope_shape shape = {.batch = x->dims[0],
                                .heads = x->dims[1],
                                .seq = x->dims[2],
                                .dim = x->dims[3],
                                .pairs = desc->style == CLATTN_ROPE_PAIRS,
                                .start = desc->start};
    shape.rot = desc->rotary_dim == CLATTN_ROPE_WHOLE_HEAD ? shape.dim : desc->rotary_dim;
    if (shape.rot == 0 || shape.rot % 2 != 0 || shape.rot > shape.dim)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: rotary_dim=%zu: must be even, at least 2 and at most "
                            "head_dim=%zu (CLATTN_ROPE_WHOLE_HEAD: all)",
                            op, desc->rotary_dim, shape.dim);
    if ((status = plan_angles(plan, desc, &shape)))
        return status;
    const clattn__layout *cos_l = &plan->layouts[R_ROPE_COS];
    const clattn_dtype cache_dtype = cos_l->present ? cos_l->dtype : CLATTN_DTYPE_F32;
    return clattn__rope_prepare(ctx, &shape, x->dtype, out->dtype, cache_dtype,
                                &plan->rope); /* no workspace */
}

static clattn_status rope_execute(clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                                  cl_mem workspace, clattn_chain *chain)
{
    (void)workspace; /* no workspace */
    clattn__rope_io io;
    memset(&io, 0, sizeof io);
    static const clattn__role roles[5] = {R_Q, R_OUT, R_ROPE_COS, R_ROPE_SIN, R_POS_IDS};
    clattn__view *const views[5] = {&io.x, &io.out, &io.cos, &io.sin, &io.position_ids};
    clattn__bind_views(plan, mems, offsets, 5, roles, views);
    io.freq = plan->angles.freq;
    if (plan->angles.table)
        clattn__angle_views(plan, &io.cos, &io.sin);
    return clattn__rope_enqueue(chain, &plan->rope, &io);
}

CLATTN__PLAN_KIND(rope, CLATTN__ROPE, clattn_rope_desc, create, rope_execute,
                  clattn_rope_plan_create, "rope", clattn__x_role_names,
                  CLATTN__ROLE(R_Q) | CLATTN__ROLE(R_OUT) | CLATTN__ROLE(R_ROPE_COS) |
                      CLATTN__ROLE(R_ROPE_SIN) | CLATTN__ROLE(R_POS_IDS))
