/* What every plan shares: tensor roles, creation checks, masks, workspace and execution. */
#include "plan.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* clattn_tensors' names are its by_role array's entries: role r's field is its r-th tensor. */
#define AT_ITS_INDEX(role, field, pub, sdpa, mha, x)                                               \
    _Static_assert(offsetof(clattn_tensors, field) == (size_t)pub * sizeof(clattn_tensor),       \
                   #field " is clattn_tensors' tensor number " #pub);
CLATTN__ROLES(AT_ITS_INDEX)
#undef AT_ITS_INDEX
_Static_assert(sizeof(clattn_tensors) == CLATTN_ROLE_COUNT * sizeof(clattn_tensor) &&
                   (int)R_COUNT == (int)CLATTN_ROLE_COUNT,
               "clattn_tensors names every role and holds nothing else");

#define SDPA_NAME(role, field, pub, sdpa, mha, x) sdpa,
#define MHA_NAME(role, field, pub, sdpa, mha, x) mha,
#define X_NAME(role, field, pub, sdpa, mha, x) x,
const char *const clattn__sdpa_role_names[R_COUNT] = {CLATTN__ROLES(SDPA_NAME)};
const char *const clattn__mha_role_names[R_COUNT] = {CLATTN__ROLES(MHA_NAME)};
const char *const clattn__x_role_names[R_COUNT] = {CLATTN__ROLES(X_NAME)};
#undef SDPA_NAME
#undef MHA_NAME
#undef X_NAME

const clattn_tensor *clattn__tensor_of(const clattn_tensors *t, clattn__role role)
{
    return &t->by_role[role];
}

/* The tensors of by_role (num_roles of them) as clattn_tensors; a role this version does not
 * know must be absent. */
static clattn_status from_roles(clattn_ctx *ctx, const char *op, const clattn_tensor *by_role,
                                size_t num_roles, clattn_tensors *out)
{
    memset(out, 0, sizeof *out);
    if (by_role == NULL && num_roles != 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: by_role is NULL but num_roles is %zu", op, num_roles);
    for (size_t r = 0; r < num_roles; ++r) {
        if (r < CLATTN_ROLE_COUNT)
            out->by_role[r] = by_role[r];
        else if (by_role[r].rank != 0)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: by_role[%zu] is set, but this clattn (%s) knows roles 0 .. %d "
                                "only (clattn_role)",
                                op, r, CLATTN_VERSION_STRING, CLATTN_ROLE_COUNT - 1);
    }
    return CLATTN_SUCCESS;
}

static const char *role_name(const clattn_plan *plan, int role)
{
    return plan->ops->role_names[role];
}

CLATTN__DESC_INIT_SCALED(clattn_sdpa_desc, CLATTN__ROPE_DEFAULTS)
CLATTN__DESC_INIT_SCALED(clattn_mha_desc, CLATTN__HEADS_DEFAULTS)

clattn_status clattn__plan_new(clattn_ctx *ctx, const clattn__plan_ops *ops, const char *op,
                               const clattn_tensors *tensors, clattn_plan **out)
{
    clattn_plan *plan = calloc(1, sizeof *plan);
    if (plan == NULL)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", op);
    plan->ctx = ctx;
    plan->ops = ops;
    plan->op = op;
    clattn_status status = CLATTN_SUCCESS;
    for (int role = 0; role < R_COUNT && status == CLATTN_SUCCESS; ++role) {
        /* (the backward reads out and lse: inputs there) */
        const bool backward = ops->kind == CLATTN__SDPA_BACKWARD;
        const bool output = role == R_GRAD_Q || role == R_GRAD_K || role == R_GRAD_V ||
                            role == R_GRAD_MASK || role == R_GRAD_SINKS ||
                            (!backward && (role == R_OUT || role == R_WEIGHTS || role == R_LSE ||
                                           role == R_PRESENT_K || role == R_PRESENT_V ||
                                           role == R_SCORES));
        const unsigned dtypes = role == R_KPM || role == R_BLOCK_MASK   ? CLATTN__U8
                                : role >= R_FLEX_AUX0 /* (the modifiers check their own) */
                                    ? CLATTN__F32 | CLATTN__I32 | CLATTN__U8
                                : role == R_KVLEN || role == R_POS_IDS || role == R_BLOCK_TABLE ||
                                        role == R_CU_Q || role == R_CU_K
                                    ? CLATTN__I32
                                : role == R_MASK                       ? CLATTN__FLOATS | CLATTN__U8
                                : role == R_WEIGHTS || role == R_LSE || role == R_SCORES ||
                                        role == R_ALIBI || role == R_SCORE_W || role == R_SINKS ||
                                        role == R_GRAD_SINKS
                                    ? CLATTN__F32
                                : (role == R_K || role == R_V) && ops->kind == CLATTN__SDPA
                                    ? CLATTN__FLOATS | CLATTN__QUANT /* SDPA's k, v: also blocks */
                                    : CLATTN__FLOATS;
        status = clattn__layout_from(ctx, op, role_name(plan, role),
                                     clattn__tensor_of(tensors, (clattn__role)role), dtypes, output,
                                     &plan->layouts[role]);
    }
    if (status != CLATTN_SUCCESS) {
        free(plan);
        return status;
    }
    *out = plan;
    return CLATTN_SUCCESS;
}

/* Every plan descriptor starts with struct_size, by_role and num_roles (clattn__plan_ops). */
#define CLATTN__HEAD_AT(desc_t)                                                                    \
    (offsetof(desc_t, by_role) == sizeof(size_t) &&                                                \
     offsetof(desc_t, num_roles) == sizeof(size_t) + sizeof(const clattn_tensor *))
_Static_assert(CLATTN__HEAD_AT(clattn_sdpa_desc) && CLATTN__HEAD_AT(clattn_mha_desc) &&
                   CLATTN__HEAD_AT(clattn_posenc_desc) && CLATTN__HEAD_AT(clattn_rope_desc) &&
                   CLATTN__HEAD_AT(clattn_additive_desc),
               "plan descriptors share their head");
#undef CLATTN__HEAD_AT

/* Refuses a tensor in a role the plan's kind does not take, listing those it does. */
static clattn_status check_roles(const clattn_plan *plan)
{
    for (int role = 0; role < R_COUNT; ++role) {
        if (!plan->layouts[role].present || (plan->ops->roles & CLATTN__ROLE(role)))
            continue;
        char taken[512] = "";
        size_t used = 0;
        for (int r = 0; r < R_COUNT && used < sizeof taken; ++r)
            if (plan->ops->roles & CLATTN__ROLE(r))
                used += (size_t)snprintf(taken + used, sizeof taken - used, "%s%s",
                                         used ? ", " : "", role_name(plan, r));
        return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: %s was given, but this plan takes only %s", plan->op,
                            role_name(plan, role), taken);
    }
    return CLATTN_SUCCESS;
}

clattn_status clattn__plan_create(clattn_ctx *ctx, const clattn__plan_ops *ops, const char *op,
                                  const void *desc, clattn_plan **out)
{
    if (out)
        *out = NULL;
    if (ctx == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    /* The descriptor as this version's struct, the fields an older caller lacks defaulted. */
    void *full = malloc(ops->desc.size);
    if (full == NULL)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", op);
    clattn_status status = clattn__create_entry(ctx, op, desc, out != NULL, &ops->desc, full);
    clattn_plan *plan = NULL;
    if (status == CLATTN_SUCCESS) {
        const clattn_tensor *by_role = NULL;
        size_t num_roles = 0;
        memcpy(&by_role, (const char *)full + ops->by_role_at, sizeof by_role);
        memcpy(&num_roles, (const char *)full + ops->by_role_at + sizeof by_role,
               sizeof num_roles);
        clattn_tensors bound;
        status = from_roles(ctx, op, by_role, num_roles, &bound);
        if (status == CLATTN_SUCCESS)
            status = clattn__plan_new(ctx, ops, op, &bound, &plan);
    }
    if (status == CLATTN_SUCCESS)
        status = check_roles(plan);
    if (status == CLATTN_SUCCESS)
        status = ops->create(plan, full);
    free(full);
    if (status != CLATTN_SUCCESS) {
        clattn_plan_release(plan);
        return clattn__end_message(ctx, op, status); /* the message names the call */
    }
    *out = plan;
    return CLATTN_SUCCESS;
}

clattn_status clattn__plan_finish(clattn_plan *plan, const char *largest)
{
    clattn_ctx *ctx = plan->ctx;
    size_t bytes = 0;
    if (!clattn__mul(plan->workspace_floats, sizeof(float), &bytes))
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: the workspace overflows size_t",
                            plan->op);
    if (bytes > ctx->workspace_limit)
        return clattn__fail(ctx, CLATTN_ERR_TOO_LARGE,
                            "%s: the workspace (%s) needs %zu bytes, more than the context's "
                            "workspace limit (%zu bytes)",
                            plan->op, largest, bytes, ctx->workspace_limit);
    if (bytes > ctx->info.max_alloc_size)
        return clattn__fail(ctx, CLATTN_ERR_TOO_LARGE,
                            "%s: the workspace (%s) needs %zu bytes, more than the device's "
                            "largest allocation (CL_DEVICE_MAX_MEM_ALLOC_SIZE = %llu)",
                            plan->op, largest, bytes,
                            (unsigned long long)ctx->info.max_alloc_size);
    return CLATTN_SUCCESS;
}

void clattn_plan_release(clattn_plan *plan)
{
    if (plan && plan->ops && plan->ops->release)
        plan->ops->release(plan);
    if (plan && plan->angles.freq)
        clReleaseMemObject(plan->angles.freq);
    if (plan && plan->angles.table)
        clReleaseMemObject(plan->angles.table);
    free(plan);
}

size_t clattn_plan_workspace_size(const clattn_plan *plan)
{
    return plan ? plan->workspace_floats * sizeof(float) : 0;
}

int clattn_plan_is_fused(const clattn_plan *plan)
{
    return plan && plan->attention.fused;
}

const char *clattn_plan_info(const clattn_plan *plan)
{
    if (plan == NULL)
        return "clattn_plan_info: plan is NULL";
    return plan->info[0] ? plan->info : plan->op;
}

clattn_status clattn_plan_execute(clattn_plan *plan, const clattn_tensor *by_role, size_t num_roles,
                                  cl_command_queue queue, cl_mem workspace, cl_uint num_wait,
                                  const cl_event *wait, cl_event *event)
{
    if (event)
        *event = NULL;
    if (plan == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    clattn_status status = clattn__entry(ctx, op, plan, num_wait, wait, event);
    clattn_tensors bound;
    if (status == CLATTN_SUCCESS)
        status = from_roles(ctx, op, by_role, num_roles, &bound);
    if (status != CLATTN_SUCCESS)
        return status;
    const clattn_tensors *tensors = &bound;
    cl_mem mems[R_COUNT];
    size_t offsets[R_COUNT];
    for (int role = 0; role < R_COUNT && status == CLATTN_SUCCESS; ++role)
        status = clattn__bind(ctx, op, role_name(plan, role), &plan->layouts[role],
                              clattn__tensor_of(tensors, (clattn__role)role), &mems[role],
                              &offsets[role]);
    if (status != CLATTN_SUCCESS)
        return status;
    const size_t need = plan->workspace_floats * sizeof(float);
    if (workspace != NULL) {
        size_t have = 0;
        cl_context owner = NULL;
        cl_int err = clGetMemObjectInfo(workspace, CL_MEM_SIZE, sizeof have, &have, NULL);
        if (err == CL_SUCCESS)
            err = clGetMemObjectInfo(workspace, CL_MEM_CONTEXT, sizeof owner, &owner, NULL);
        if (err != CL_SUCCESS)
            return clattn__fail(ctx, (clattn_status)err,
                                "%s: workspace: clGetMemObjectInfo: %s (%d)", op,
                                clattn__cl_error_name(err), (int)err);
        if (owner != ctx->context)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: workspace belongs to another cl_context than the clattn "
                                "context's",
                                op);
        if (have < need)
            return clattn__fail(ctx, CLATTN_ERR_BUFFER_TOO_SMALL,
                                "%s: workspace has %zu bytes, the plan needs %zu "
                                "(clattn_plan_workspace_size)",
                                op, have, need);
    } else if (need > 0 &&
               (status = clattn__workspace(ctx, op, CLATTN_WS_PLAN, need, &workspace))) {
        return status;
    }
    /* The launch context: the caller's queue or the context's; a caller's own workspace needs
     * no ordering with other calls. */
    const bool private_workspace =
        workspace != NULL && workspace != ctx->workspace[CLATTN_WS_PLAN];
    clattn_chain chain;
    status = clattn__begin(ctx, op, &chain, queue, private_workspace, num_wait, wait);
    if (status == CLATTN_SUCCESS)
        status = plan->ops->execute(plan, mems, offsets, workspace, &chain);
    status = clattn__end(op, &chain, status, event);
    return status;
}

clattn__view clattn__bound_view(const clattn__layout *l, cl_mem mem, size_t offset)
{
    clattn__view v;
    clattn__view_of(l, &v);
    v.mem = mem;
    v.offset = offset;
    return v;
}

clattn__view clattn__role_view(const clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                               clattn__role role)
{
    clattn__view v;
    memset(&v, 0, sizeof v);
    return plan->layouts[role].present
               ? clattn__bound_view(&plan->layouts[role], mems[role], offsets[role])
               : v;
}

clattn__score_masks clattn__bound_masks(const clattn_plan *plan, const cl_mem *mems,
                                        const size_t *offsets)
{
    clattn__score_masks m = {.mask = plan->views.mask,
                             .key_padding = plan->views.key_padding,
                             .kv_len = plan->views.kv_len,
                             .alibi = plan->views.alibi,
                             .sinks = plan->views.sinks};
    clattn__view *views[5] = {&m.mask, &m.key_padding, &m.kv_len, &m.alibi, &m.sinks};
    static const clattn__role roles[5] = {R_MASK, R_KPM, R_KVLEN, R_ALIBI, R_SINKS};
    for (int i = 0; i < 5; ++i) {
        views[i]->mem = mems[roles[i]];
        views[i]->offset = offsets[roles[i]];
    }
    if (plan->varlen.on) { /* packed sequences' offsets */
        m.varlen.cu_q = mems[R_CU_Q];
        m.varlen.cu_k = mems[R_CU_K];
        m.varlen.q_offset = offsets[R_CU_Q];
        m.varlen.k_offset = offsets[R_CU_K];
    }
    return m;
}

clattn_status clattn__expect_operands(const clattn_plan *plan, int rank, bool packed,
                                      const char *const shapes[4])
{
    static const char *const names[4] = {"q", "k", "v", "out"};
    const clattn__layout *l = plan->layouts;
    for (int role = R_Q; role <= R_OUT; ++role)
        if (!l[role].present || l[role].rank != rank)
            return clattn__fail(plan->ctx, l[role].present ? CLATTN_ERR_INVALID_SHAPE
                                                           : CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: %s%s must be a %srank-%d tensor %s, got rank %d", plan->op,
                                packed ? "with cu_seqlens, " : "", names[role],
                                packed ? "packed " : "", rank,
                                shapes ? shapes[role] : "(batch, heads, seq, head_dim)",
                                l[role].rank);
    return CLATTN_SUCCESS;
}

clattn_status clattn__check_kv_heads(const clattn_plan *plan, size_t heads, size_t kv_heads)
{
    if (kv_heads != 0 && heads % kv_heads == 0)
        return CLATTN_SUCCESS;
    return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_SHAPE,
                        "%s: k has %zu heads (dim 1), which must divide q's %zu heads "
                        "(grouped-query attention: query head h reads k/v head "
                        "h / (q heads / k heads))",
                        plan->op, kv_heads, heads);
}

/* The roles packed sequences make (batch, heads, max_seqlen, d) views, and whether their rows
 * are keys (else query rows). */
static const struct {
    clattn__role role;
    bool keys;
} varlen_roles[] = {{R_Q, false},       {R_K, true},        {R_V, true},
                    {R_OUT, false},     {R_LSE, false},     {R_GRAD_OUT, false},
                    {R_GRAD_Q, false},  {R_GRAD_K, true},   {R_GRAD_V, true}};

bool clattn__varlen_role(clattn__role role)
{
    for (size_t i = 0; i < sizeof varlen_roles / sizeof varlen_roles[0]; ++i)
        if (varlen_roles[i].role == role)
            return true;
    return false;
}

/* Whether the plan's packed sequences pack varlen_roles[i] (a paged cache's k and v stay pools). */
static bool packs(const clattn_plan *plan, size_t i)
{
    return plan->layouts[varlen_roles[i].role].present &&
           !(plan->varlen.paged && varlen_roles[i].keys);
}

/* The backward's gradients (absent in the forward: its roles refuse them) against the packed
 * dims of the tensors they are the gradients of. */
static clattn_status check_packed_gradients(clattn_plan *plan)
{
    const clattn__layout *l = plan->layouts;
    static const struct {
        clattn__role role, like;
        const char *name, *shape;
    } grads[] = {
        {R_GRAD_OUT, R_OUT, "grad_out", "(total_q, heads, head_dim_v), out's"},
        {R_GRAD_Q, R_Q, "grad_q", "(total_q, heads, head_dim_qk), q's"},
        {R_GRAD_K, R_K, "grad_k", "(total_k, kv_heads, head_dim_qk), k's"},
        {R_GRAD_V, R_V, "grad_v", "(total_k, kv_heads, head_dim_v), v's"},
    };
    clattn_status status = CLATTN_SUCCESS;
    for (size_t i = 0; i < sizeof grads / sizeof grads[0] && status == CLATTN_SUCCESS; ++i)
        if (l[grads[i].role].present)
            status = clattn__layout_expect(plan->ctx, plan->op, grads[i].name, &l[grads[i].role],
                                           3, l[grads[i].like].dims, grads[i].shape);
    return status;
}

static void pack_roles(clattn_plan *plan, size_t batch, size_t max_q, size_t max_k);

static clattn_status check_cu_q(const clattn_plan *plan)
{
    const clattn__layout *cu_q = &plan->layouts[R_CU_Q];
    if (cu_q->rank != 1 || cu_q->dims[0] < 2 || cu_q->strides[0] != 1)
        return clattn__fail(plan->ctx, CLATTN_ERR_INVALID_SHAPE,
                            "%s: cu_seqlens_q must be I32 (batch + 1) offsets with unit stride, "
                            "batch >= 1 (got rank %d, dim 0 %zu)",
                            plan->op, cu_q->rank, cu_q->rank ? cu_q->dims[0] : 0);
    return CLATTN_SUCCESS;
}

/* Packed queries over a paged cache (cu_seqlens_q with block_table and kv_seqlen; no
 * cu_seqlens_k): q (total_q, heads, head_dim_qk), out (total_q, heads, head_dim_v) and lse
 * (heads, total_q) packed as clattn__pack_varlen's; k and v stay the cache's pools (sdpa.c's
 * check_paged checks them, the table and kv_seqlen, with batch = cu_seqlens_q's). */
static clattn_status pack_paged(clattn_plan *plan, const clattn_sdpa_desc *desc,
                                clattn__score_shape *score)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    static const struct {
        clattn__role role;
        const char *name;
    } refused[] = {{R_MASK, "attn_mask"},      {R_KPM, "key_padding_mask"},
                   {R_PAST_K, "past_k"},       {R_PAST_V, "past_v"},
                   {R_PRESENT_K, "present_k"}, {R_PRESENT_V, "present_v"},
                   {R_WEIGHTS, "weights"},     {R_SCORES, "scores"},
                   {R_GRAD_OUT, "grad_out (the backward)"}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; ++i)
        if (l[refused[i].role].present)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: cu_seqlens_q over a paged cache (block_table) with %s: not "
                                "supported (the forward on the fused path only)",
                                op, refused[i].name);
    if (desc->rope != 0 || desc->softmax_f64 != 0 || desc->max_seqlen_k != 0)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: cu_seqlens_q over a paged cache (block_table) with %s: not "
                            "supported (kv_seqlen counts each sequence's keys)",
                            op, desc->rope != 0          ? "rope"
                                : desc->softmax_f64 != 0 ? "softmax_f64"
                                                         : "max_seqlen_k");
    clattn_status status = check_cu_q(plan);
    if (status == CLATTN_SUCCESS && (l[R_Q].rank != 3 || l[R_OUT].rank != 3))
        status = clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                              "%s: with cu_seqlens_q, %s must be a packed rank-3 tensor %s, got "
                              "rank %d",
                              op, l[R_Q].rank != 3 ? "q" : "out",
                              l[R_Q].rank != 3 ? "(total_q, heads, head_dim_qk)"
                                               : "(total_q, heads, head_dim_v)",
                              l[R_Q].rank != 3 ? l[R_Q].rank : l[R_OUT].rank);
    if (status != CLATTN_SUCCESS)
        return status;
    const size_t total_q = l[R_Q].dims[0], heads = l[R_Q].dims[1];
    const size_t batch = l[R_CU_Q].dims[0] - 1;
    const size_t o_dims[3] = {total_q, heads, l[R_OUT].dims[2]};
    const size_t lse_dims[2] = {heads, total_q};
    if ((status = clattn__layout_expect(ctx, op, "out", &l[R_OUT], 3, o_dims,
                                        "(total_q, heads, head_dim_v) from q")) ||
        (l[R_LSE].present && (status = clattn__layout_expect(ctx, op, "lse", &l[R_LSE], 2,
                                                             lse_dims, "(heads, total_q)"))))
        return status;
    const size_t max_q = desc->max_seqlen_q ? desc->max_seqlen_q : total_q;
    if (total_q > UINT32_MAX || batch > UINT32_MAX || max_q > total_q || max_q == 0)
        return clattn__fail(ctx, total_q > UINT32_MAX || batch > UINT32_MAX
                                     ? CLATTN_ERR_UNSUPPORTED
                                     : CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: total_q %zu, batch %zu, max_seqlen_q=%zu: the totals below "
                            "2^32, max_seqlen_q from 1 to total_q (0 takes the total)",
                            op, total_q, batch, desc->max_seqlen_q);
    plan->varlen.paged = true;
    pack_roles(plan, batch, max_q, 0);
    plan->varlen.total_q = total_q;
    plan->varlen.total_k = 0;
    score->varlen = true;
    score->total_q = total_q;
    score->total_k = 0;
    return CLATTN_SUCCESS;
}

clattn_status clattn__pack_varlen(clattn_plan *plan, const clattn_sdpa_desc *desc,
                                  clattn__score_shape *score)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    clattn__layout *l = plan->layouts;
    const clattn__layout *cu_q = &l[R_CU_Q], *cu_k = &l[R_CU_K];
    if (cu_q->present && !cu_k->present && l[R_BLOCK_TABLE].present)
        return pack_paged(plan, desc, score);
    if (cu_k->present && l[R_BLOCK_TABLE].present)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: cu_seqlens_k with block_table: not supported (a paged cache's "
                            "keys are counted by kv_seqlen: give cu_seqlens_q, block_table and "
                            "kv_seqlen)",
                            op);
    if (!cu_q->present || !cu_k->present)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: cu_seqlens_q and cu_seqlens_k go together (%s is absent)", op,
                            cu_q->present ? "cu_seqlens_k" : "cu_seqlens_q");
    clattn_status status = check_cu_q(plan);
    if (status != CLATTN_SUCCESS)
        return status;
    const size_t want_cu[1] = {cu_q->dims[0]};
    status = clattn__layout_expect(ctx, op, "cu_seqlens_k", cu_k, 1, want_cu,
                                   "(batch + 1) offsets, as cu_seqlens_q");
    if (status != CLATTN_SUCCESS)
        return status;
    if (cu_k->strides[0] != 1)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: cu_seqlens_k must have unit stride (got %zu)", op,
                            cu_k->strides[0]);
    static const struct {
        clattn__role role;
        const char *name;
    } refused[] = {{R_MASK, "attn_mask"},     {R_KPM, "key_padding_mask"},
                   {R_KVLEN, "kv_seqlen"},    {R_BLOCK_TABLE, "block_table"},
                   {R_PAST_K, "past_k"},      {R_PAST_V, "past_v"},
                   {R_PRESENT_K, "present_k"}, {R_PRESENT_V, "present_v"},
                   {R_WEIGHTS, "weights"},    {R_SCORES, "scores"},
                   {R_GRAD_MASK, "grad_attn_mask"}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; ++i)
        if (l[refused[i].role].present)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "%s: cu_seqlens_q/cu_seqlens_k with %s: not supported (packed "
                                "sequences run on the fused path, each attending within itself)",
                                op, refused[i].name);
    if (desc->rope != 0 || desc->softmax_f64 != 0)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: cu_seqlens_q/cu_seqlens_k with %s: not supported (packed "
                            "sequences run on the fused path only)",
                            op, desc->rope != 0 ? "rope" : "softmax_f64");
    static const char *const shapes[4] = {"(total_q, heads, head_dim_qk)",
                                          "(total_k, kv_heads, head_dim_qk)",
                                          "(total_k, kv_heads, head_dim_v)",
                                          "(total_q, heads, head_dim_v)"};
    if ((status = clattn__expect_operands(plan, 3, true, shapes)))
        return status;
    const size_t total_q = l[R_Q].dims[0], heads = l[R_Q].dims[1];
    const size_t total_k = l[R_K].dims[0], kv_heads = l[R_K].dims[1];
    const size_t v_dims[3] = {total_k, kv_heads, l[R_V].dims[2]};
    const size_t o_dims[3] = {total_q, heads, l[R_V].dims[2]};
    const size_t lse_dims[2] = {heads, total_q};
    if ((status = clattn__layout_expect(ctx, op, "v", &l[R_V], 3, v_dims,
                                        "(total_k, kv_heads, head_dim_v) from k")) ||
        (status = clattn__layout_expect(ctx, op, "out", &l[R_OUT], 3, o_dims,
                                        "(total_q, heads, head_dim_v) from q and v")) ||
        (l[R_LSE].present && (status = clattn__layout_expect(ctx, op, "lse", &l[R_LSE], 2,
                                                             lse_dims, "(heads, total_q)"))) ||
        (status = check_packed_gradients(plan)))
        return status;
    if (total_q > UINT32_MAX || total_k > UINT32_MAX || cu_q->dims[0] - 1 > UINT32_MAX)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: packed totals above 2^32 - 1 rows (%zu queries, %zu keys)", op,
                            total_q, total_k);
    const size_t max_q = desc->max_seqlen_q ? desc->max_seqlen_q : total_q;
    const size_t max_k = desc->max_seqlen_k ? desc->max_seqlen_k : total_k;
    if (max_q > total_q || max_k > total_k || max_q == 0 || max_k == 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: max_seqlen_q=%zu, max_seqlen_k=%zu: each from 1 to its total "
                            "(total_q %zu, total_k %zu; 0 takes the total)",
                            op, desc->max_seqlen_q, desc->max_seqlen_k, total_q, total_k);
    pack_roles(plan, cu_q->dims[0] - 1, max_q, max_k);
    plan->varlen.total_q = total_q;
    plan->varlen.total_k = total_k;
    score->varlen = true;
    score->total_q = total_q;
    score->total_k = total_k;
    return CLATTN_SUCCESS;
}

/* The packed roles' layouts as the kernels' (batch, heads, max_seqlen, d) views (batch
 * stride 0, the token stride per row); the caller's into plan->varlen.layouts. */
static void pack_roles(clattn_plan *plan, size_t batch, size_t max_q, size_t max_k)
{
    clattn__layout *l = plan->layouts;
    for (size_t i = 0; i < sizeof varlen_roles / sizeof varlen_roles[0]; ++i) {
        const clattn__role role = varlen_roles[i].role;
        if (!packs(plan, i))
            continue;
        const clattn__layout packed = l[role];
        clattn__layout *x = &l[role];
        const bool is_lse = role == R_LSE;
        x->rank = is_lse ? 3 : 4;
        x->dims[0] = batch;
        x->strides[0] = 0;
        x->dims[1] = is_lse ? packed.dims[0] : packed.dims[1]; /* heads */
        x->strides[1] = is_lse ? packed.strides[0] : packed.strides[1];
        x->dims[2] = varlen_roles[i].keys ? max_k : max_q;
        x->strides[2] = is_lse ? packed.strides[1] : packed.strides[0]; /* per token */
        if (!is_lse) {
            x->dims[3] = packed.dims[2];
            x->strides[3] = packed.strides[2];
        }
        plan->varlen.layouts[role] = packed;
    }
    plan->varlen.on = true;
}

void clattn__unpack_varlen(clattn_plan *plan)
{
    for (size_t i = 0; i < sizeof varlen_roles / sizeof varlen_roles[0]; ++i) {
        const clattn__role role = varlen_roles[i].role;
        if (!packs(plan, i))
            continue;
        const clattn__layout kernels = plan->layouts[role];
        plan->layouts[role] = plan->varlen.layouts[role];
        plan->varlen.layouts[role] = kernels;
    }
}

clattn__view clattn__kernel_view(const clattn_plan *plan, const cl_mem *mems,
                                 const size_t *offsets, clattn__role role)
{
    if (!plan->varlen.on || !clattn__varlen_role(role) || !plan->layouts[role].present ||
        (plan->varlen.paged && (role == R_K || role == R_V)))
        return clattn__role_view(plan, mems, offsets, role);
    return clattn__bound_view(&plan->varlen.layouts[role], mems[role], offsets[role]);
}

void clattn__bind_views(const clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                        size_t count, const clattn__role *roles, clattn__view *const *views)
{
    for (size_t i = 0; i < count; ++i)
        *views[i] = clattn__kernel_view(plan, mems, offsets, roles[i]);
}
