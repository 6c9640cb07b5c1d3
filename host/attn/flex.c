/* User score and mask functions (clattn_flex_desc: PyTorch's FlexAttention on OpenCL): the
 * source and its prelude registered with the context (score.cl's FLEX_SRC), the arena in the
 * workspace that holds the auxiliary tensors, the block mask and the tile counter, and the
 * block mask made from a mask_mod (kernels/flex.cl). The kernels' side is score.cl's
 * flex_score / flex_keep / flex_grad and FLEX_TILE. */
#include "plan.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The block-mask builder's family (core/family.h): kernels/flex.cl with the user's functions
 * (FLEX_SRC: the context's registered source, put ahead of score.cl). */
#define FLEX_SWITCHES(X) X(FLEX_SRC, 0, NULL) X(FLEX_MASK, 0, NULL)
CLATTN_FAMILY(flex, FLEX_SWITCHES, .sources = {"flex.cl"});

enum { ARENA_ALIGN = 64 }; /* bytes: each region of the arena starts on such a boundary */

static bool is_identifier(const char *name)
{
    if (name == NULL || !(isalpha((unsigned char)name[0]) || name[0] == '_'))
        return false;
    for (const char *c = name; *c; ++c)
        if (!(isalnum((unsigned char)*c) || *c == '_'))
            return false;
    return strlen(name) < 64;
}

static const char *c_type(clattn_dtype dtype)
{
    return dtype == CLATTN_DTYPE_I32 ? "int" : dtype == CLATTN_DTYPE_U8 ? "uchar" : "float";
}

/* One composed function into text (size bytes, from `at` on; returns the new end): `open`,
 * then `call` for each part whose functions include all of `needs`, formatted with the part's
 * index and the auxiliary tensors' names (`, a, b`), given twice for a call that names the
 * part twice (printf ignores arguments past its format's), then `close`. */
static size_t compose(char *text, size_t size, size_t at, const clattn__flex_parts *parts,
                      unsigned needs, const char *names, const char *open, const char *call,
                      const char *close)
{
    at += (size_t)snprintf(text + at, size - at, "%s", open);
    for (size_t p = 0; p < parts->count; ++p)
        if ((parts->part[p].functions & needs) == needs)
            at += (size_t)snprintf(text + at, size - at, call, p, names, p, names);
    return at + (size_t)snprintf(text + at, size - at, "%s", close);
}

/* The text built ahead of score.cl from the parts (a built-in's, the user's): the auxiliary
 * tensors as parameters of every part's functions (their definitions renamed flex_p<i>_* by
 * macros that take FlexAttention's arguments), each part's source with its own line numbers,
 * then flex_user_score_mod, _mask_mod and _score_mod_grad (score.cl's hooks) composing them:
 * the score through each part's score_mod in order, the gradient by the chain rule, the keep
 * test the AND of the parts' mask_mods. NULL when out of memory. */
static char *flex_text(const clattn__flex_parts *parts, const clattn__layout *const *aux_layouts)
{
    char decl[1024] = "", from[1024] = "", names[512] = "";
    size_t d = 0, f = 0, m = 0, slot = 0;
    for (size_t p = 0; p < parts->count; ++p)
        for (size_t i = 0; i < parts->part[p].num_aux; ++i, ++slot) {
            const char *type = c_type(aux_layouts[slot]->dtype), *name = parts->part[p].names[i];
            d += (size_t)snprintf(decl + d, sizeof decl - d, ", __global const %s *%s", type, name);
            f += (size_t)snprintf(from + f, sizeof from - f,
                                  ", (__global const %s *)((arena) + (off).s%zu)", type, slot);
            m += (size_t)snprintf(names + m, sizeof names - m, ", %s", name);
        }
    size_t size = 4096 + d + f + 4 * m;
    for (size_t p = 0; p < parts->count; ++p)
        size += strlen(parts->part[p].source) + 512;
    char *text = malloc(size);
    if (text == NULL)
        return NULL;
    size_t at = (size_t)snprintf(text, size,
                                 "/* clattn: the score functions (host/attn/flex.c) */\n"
                                 "#define FLEX_AUX_DECL %s\n#define FLEX_AUX_FROM(arena, off) %s\n",
                                 decl, from);
    for (size_t p = 0; p < parts->count; ++p)
        at += (size_t)snprintf(
            text + at, size - at,
            "#define score_mod(a0_, a1_, a2_, a3_, a4_) "
            "flex_p%zu_score_mod(a0_, a1_, a2_, a3_, a4_ FLEX_AUX_DECL)\n"
            "#define mask_mod(a0_, a1_, a2_, a3_) flex_p%zu_mask_mod(a0_, a1_, a2_, a3_ FLEX_AUX_DECL)\n"
            "#define score_mod_grad(a0_, a1_, a2_, a3_, a4_) "
            "flex_p%zu_score_mod_grad(a0_, a1_, a2_, a3_, a4_ FLEX_AUX_DECL)\n"
            "#line 1 \"%s\"\n%s\n#undef score_mod\n#undef mask_mod\n#undef score_mod_grad\n",
            p, p, p, parts->part[p].file, parts->part[p].source);
    /* the composition */
    at = compose(text, size, at, parts, CLATTN_FLEX_SCORE_MOD, names,
                 "#line 1 \"flex_parts\"\n"
                 "inline float flex_user_score_mod(float s, int b, int h, int q, int k "
                 "FLEX_AUX_DECL)\n{\n",
                 "    s = flex_p%zu_score_mod(s, b, h, q, k%s);\n", "    return s;\n}\n");
    at = compose(text, size, at, parts, CLATTN_FLEX_SCORE_MOD | CLATTN_FLEX_SCORE_MOD_GRAD, names,
                 "inline float flex_user_score_mod_grad(float s, int b, int h, int q, "
                 "int k FLEX_AUX_DECL)\n{\n    float g = 1.0f;\n",
                 "    g *= flex_p%zu_score_mod_grad(s, b, h, q, k%s);\n"
                 "    s = flex_p%zu_score_mod(s, b, h, q, k%s);\n",
                 "    return g;\n}\n");
    at = compose(text, size, at, parts, CLATTN_FLEX_MASK_MOD, names,
                 "inline int flex_user_mask_mod(int b, int h, int q, int k "
                 "FLEX_AUX_DECL)\n{\n    return 1",
                 " &&\n           flex_p%zu_mask_mod(b, h, q, k%s) != 0", ";\n}\n");
    snprintf(text + at, size - at, "#line 1 \"score.cl\"\n");
    return text;
}

/* The id of `text` in the context (score.cl's FLEX_SRC), interned: takes text (freed when a
 * copy is held already). 0 and a message on failure. */
static int flex_register(clattn_ctx *ctx, char *text)
{
    for (size_t i = 0; i < ctx->num_flex_sources; ++i)
        if (strcmp(ctx->flex_sources[i], text) == 0) {
            free(text);
            return (int)i + 1;
        }
    char **grown = realloc(ctx->flex_sources, (ctx->num_flex_sources + 1) * sizeof *grown);
    if (grown == NULL || ctx->num_flex_sources >= 1000000) {
        free(text);
        if (grown)
            ctx->flex_sources = grown;
        return 0;
    }
    ctx->flex_sources = grown;
    ctx->flex_sources[ctx->num_flex_sources++] = text;
    return (int)ctx->num_flex_sources;
}

/* Whether a layout is contiguous row-major (its flat elements are its strides' order). */
static bool row_major(const clattn__layout *l)
{
    size_t expected = 1;
    for (int i = l->rank - 1; i >= 0; --i) {
        if (l->dims[i] != 1 && l->strides[i] != expected)
            return false;
        expected *= l->dims[i];
    }
    return true;
}

clattn_status clattn__flex_user_part(clattn_ctx *ctx, const char *op, const clattn_flex_desc *flex,
                                     const clattn__layout *const *aux, clattn__flex_part *part)
{
    memset(part, 0, sizeof *part);
    if ((flex->functions & ~7u) != 0 || flex->functions == 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: flex.functions=%u: must name what flex.source defines "
                            "(CLATTN_FLEX_SCORE_MOD | CLATTN_FLEX_MASK_MOD | "
                            "CLATTN_FLEX_SCORE_MOD_GRAD)",
                            op, flex->functions);
    if ((flex->functions & CLATTN_FLEX_SCORE_MOD_GRAD) && !(flex->functions & CLATTN_FLEX_SCORE_MOD))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: flex.functions has CLATTN_FLEX_SCORE_MOD_GRAD without "
                            "CLATTN_FLEX_SCORE_MOD",
                            op);
    part->file = "score_mod";
    part->source = flex->source;
    part->functions = flex->functions;
    for (size_t i = 0; i < CLATTN_FLEX_AUX_MAX; ++i) {
        const char *name = flex->aux_names[i];
        const bool bound = aux[i] != NULL && aux[i]->present;
        if (name == NULL && !bound)
            continue;
        if (name == NULL || !bound)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: flex.aux_names[%zu] is %s but flex_aux%zu is %s: give both "
                                "or neither",
                                op, i, name ? name : "NULL", i, bound ? "bound" : "absent");
        if (i != part->num_aux)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: flex.aux_names[%zu] is set but flex.aux_names[%zu] is not: "
                                "use the first ones",
                                op, i, part->num_aux);
        part->names[i] = name;
        part->roles[i] = R_FLEX_AUX0 + (int)i;
        ++part->num_aux;
    }
    return CLATTN_SUCCESS;
}

/* Checks the parts' auxiliary names (C identifiers, unique over the parts, at most
 * CLATTN_FLEX_AUX_MAX in all) and layouts (contiguous row-major), then registers their text:
 * *id the source's (score.cl's FLEX_SRC). aux_layouts[slot]: the slots' layouts, in order. */
static clattn_status flex_compose(clattn_ctx *ctx, const char *op, const clattn__flex_parts *parts,
                                  const clattn__layout *const *aux_layouts, size_t slots, int *id)
{
    if (slots > CLATTN_FLEX_AUX_MAX)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: %zu auxiliary tensors in all (the built-ins' and flex's): at "
                            "most %d",
                            op, slots, (int)CLATTN_FLEX_AUX_MAX);
    size_t slot = 0;
    const char *seen[CLATTN_FLEX_AUX_MAX];
    for (size_t p = 0; p < parts->count; ++p)
        for (size_t i = 0; i < parts->part[p].num_aux; ++i, ++slot) {
            const char *name = parts->part[p].names[i];
            if (!is_identifier(name))
                return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                    "%s: flex.aux_names[%zu]=\"%s\" is not a C identifier "
                                    "(letters, digits, '_'; under 64 characters)",
                                    op, i, name);
            for (size_t j = 0; j < slot; ++j)
                if (strcmp(seen[j], name) == 0)
                    return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                        "%s: flex.aux_names[%zu]=\"%s\" is taken (by another "
                                        "auxiliary tensor or a built-in's)",
                                        op, i, name);
            seen[slot] = name;
            if (!row_major(aux_layouts[slot]))
                return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                    "%s: the auxiliary tensor \"%s\" must be contiguous row-major "
                                    "(its elements are read at flat indices)",
                                    op, name);
        }
    char *text = flex_text(parts, aux_layouts);
    if (text == NULL || (*id = flex_register(ctx, text)) == 0)
        return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", op);
    return CLATTN_SUCCESS;
}

static size_t align_up(size_t bytes)
{
    return (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
}

static size_t layout_elems(const clattn__layout *l)
{
    size_t n = 1;
    for (int i = 0; i < l->rank; ++i)
        n *= l->dims[i]; /* (checked against its buffer's reach when it was made) */
    return n;
}

clattn_status clattn__plan_flex(clattn_plan *plan, const clattn__flex_parts *builtin,
                                const clattn_flex_desc *flex, size_t batch, size_t heads,
                                size_t seq_q, size_t seq_k, bool backward,
                                clattn__score_shape *score)
{
    clattn_ctx *ctx = plan->ctx;
    const char *op = plan->op;
    const clattn__layout *l = plan->layouts;
    memset(&plan->flex, 0, sizeof plan->flex);
    clattn__flex_parts parts = *builtin;
    const bool user = flex->source != NULL && flex->source[0] != '\0';
    if (!user)
        for (int role = R_FLEX_AUX0; role <= R_BLOCK_MASK; ++role)
            if (l[role].present)
                return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                    "%s: %s is bound but flex.source is empty (no user score "
                                    "functions)",
                                    op, clattn__sdpa_role_names[role]);
    clattn_status status = CLATTN_SUCCESS;
    if (user) {
        const clattn__layout *aux[CLATTN_FLEX_AUX_MAX] = {&l[R_FLEX_AUX0], &l[R_FLEX_AUX1],
                                                          &l[R_FLEX_AUX2], &l[R_FLEX_AUX3]};
        if ((status = clattn__flex_user_part(ctx, op, flex, aux, &parts.part[parts.count])))
            return status;
        ++parts.count;
    }
    if (parts.count == 0)
        return CLATTN_SUCCESS;
    unsigned functions = 0, grads = CLATTN_FLEX_SCORE_MOD_GRAD;
    for (size_t p = 0; p < parts.count; ++p) {
        functions |= parts.part[p].functions;
        if ((parts.part[p].functions & CLATTN_FLEX_SCORE_MOD) &&
            !(parts.part[p].functions & CLATTN_FLEX_SCORE_MOD_GRAD))
            grads = 0;
    }
    if (backward && (functions & CLATTN_FLEX_SCORE_MOD) && !grads)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: flex.source's score_mod has no score_mod_grad (d score_mod / "
                            "d score), which the backward needs: define it and add "
                            "CLATTN_FLEX_SCORE_MOD_GRAD to flex.functions",
                            op);
    if (score->additive)
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "%s: score functions with additive attention", op);
    /* the arena's slots: the parts' auxiliary tensors in order */
    const clattn__layout *slots[2 * CLATTN_FLEX_AUX_MAX];
    size_t count = 0;
    for (size_t p = 0; p < parts.count; ++p)
        for (size_t i = 0; i < parts.part[p].num_aux && count < 2 * CLATTN_FLEX_AUX_MAX; ++i) {
            plan->flex.aux_roles[count] = parts.part[p].roles[i];
            slots[count++] = &l[parts.part[p].roles[i]];
        }
    int id = 0;
    if ((status = flex_compose(ctx, op, &parts, slots, count, &id)))
        return status;
    /* the arena: the auxiliary tensors, the block mask, the counter, each 64-byte aligned */
    size_t at = 0;
    for (size_t i = 0; i < count; ++i) {
        plan->flex.aux_at[i] = at;
        plan->flex.aux_bytes[i] = layout_elems(slots[i]) * clattn_dtype_size(slots[i]->dtype);
        at += align_up(plan->flex.aux_bytes[i]);
    }
    plan->flex.num_aux = count;
    const clattn__layout *bm = &l[R_BLOCK_MASK];
    if (bm->present) {
        if (flex->block_q == 0 || flex->block_k == 0 || flex->block_q > UINT32_MAX ||
            flex->block_k > UINT32_MAX)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "%s: flex.block_q=%zu, flex.block_k=%zu: a block mask needs "
                                "both block sizes (at least 1)",
                                op, flex->block_q, flex->block_k);
        const size_t q_blocks = (seq_q + flex->block_q - 1) / flex->block_q;
        const size_t k_blocks = (seq_k + flex->block_k - 1) / flex->block_k;
        const bool dims_ok = bm->rank == 4 && (bm->dims[0] == batch || bm->dims[0] == 1) &&
                             (bm->dims[1] == heads || bm->dims[1] == 1) &&
                             bm->dims[2] == q_blocks && bm->dims[3] == k_blocks;
        if (!dims_ok || !row_major(bm))
            return clattn__fail(ctx, CLATTN_ERR_INVALID_SHAPE,
                                "%s: block_mask must be a contiguous U8 (batch %zu or 1, heads "
                                "%zu or 1, %zu, %zu) for blocks of %zu x %zu; got rank %d",
                                op, batch, heads, q_blocks, k_blocks, flex->block_q,
                                flex->block_k, bm->rank);
        plan->flex.blocks = true;
        plan->flex.blocks_at = at;
        plan->flex.blocks_bytes = layout_elems(bm);
        plan->flex.block_q = flex->block_q;
        plan->flex.block_k = flex->block_k;
        plan->flex.bm_s2 = k_blocks;
        plan->flex.bm_s1 = bm->dims[1] == 1 ? 0 : q_blocks * k_blocks;
        plan->flex.bm_s0 = bm->dims[0] == 1 ? 0 : bm->dims[1] * q_blocks * k_blocks;
        at += align_up(plan->flex.blocks_bytes);
    }
    plan->flex.count = user && flex->count_tiles != 0;
    plan->flex.count_at = at;
    at += ARENA_ALIGN;
    plan->flex.on = true;
    plan->flex.arena_bytes = at;
    score->flex_id = id;
    score->flex_score = (functions & CLATTN_FLEX_SCORE_MOD) != 0;
    score->flex_mask = (functions & CLATTN_FLEX_MASK_MOD) != 0;
    score->flex_grad = grads != 0 && score->flex_score;
    score->flex_blocks = plan->flex.blocks;
    score->flex_count = plan->flex.count;
    return CLATTN_SUCCESS;
}

void clattn__flex_reserve(clattn_plan *plan)
{
    if (!plan->flex.on)
        return;
    plan->flex.arena_at = plan->workspace_floats;
    plan->workspace_floats += plan->flex.arena_bytes / sizeof(float);
}

/* A device copy (or, src NULL, a fill with zeros) on the chain. */
static clattn_status chain_copy(clattn_chain *chain, cl_mem src, size_t src_at, cl_mem dst,
                                size_t dst_at, size_t bytes, const char *what)
{
    cl_event event = NULL;
    const cl_uint zero = 0;
    const cl_int err =
        src ? clEnqueueCopyBuffer(chain->queue, src, dst, src_at, dst_at, bytes, chain->num_wait,
                                  chain->wait, &event)
            : clEnqueueFillBuffer(chain->queue, dst, &zero, sizeof zero, dst_at, bytes,
                                  chain->num_wait, chain->wait, &event);
    if (err != CL_SUCCESS)
        return clattn__fail(chain->ctx, (clattn_status)err, "%s(%s): %s (%d)",
                            src ? "clEnqueueCopyBuffer" : "clEnqueueFillBuffer", what,
                            clattn__cl_error_name(err), (int)err);
    clattn__chain_push(chain, event);
    return CLATTN_SUCCESS;
}

clattn_status clattn__flex_stage(clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                                 cl_mem workspace, clattn_chain *chain,
                                 clattn__score_masks *masks)
{
    if (!plan->flex.on)
        return CLATTN_SUCCESS;
    const size_t base = plan->flex.arena_at * sizeof(float);
    const clattn__layout *l = plan->layouts;
    clattn_status status = CLATTN_SUCCESS;
    for (size_t i = 0; i < plan->flex.num_aux && status == CLATTN_SUCCESS; ++i) {
        const int role = plan->flex.aux_roles[i];
        status = chain_copy(chain, mems[role], offsets[role] * clattn_dtype_size(l[role].dtype),
                            workspace, base + plan->flex.aux_at[i], plan->flex.aux_bytes[i],
                            clattn__sdpa_role_names[role]);
    }
    if (status == CLATTN_SUCCESS && plan->flex.blocks)
        status = chain_copy(chain, mems[R_BLOCK_MASK], offsets[R_BLOCK_MASK], workspace,
                            base + plan->flex.blocks_at, plan->flex.blocks_bytes, "block_mask");
    if (status == CLATTN_SUCCESS && plan->flex.count)
        status = chain_copy(chain, NULL, 0, workspace, base + plan->flex.count_at, sizeof(cl_uint),
                            "tile counter");
    masks->flex.arena = workspace;
    masks->flex.arena_offset = base;
    for (int i = 0; i < CLATTN_FLEX_AUX_MAX; ++i)
        masks->flex.aux[i] = plan->flex.aux_at[i];
    masks->flex.blocks = plan->flex.blocks_at;
    masks->flex.count = plan->flex.count_at;
    masks->flex.bm_s0 = plan->flex.bm_s0;
    masks->flex.bm_s1 = plan->flex.bm_s1;
    masks->flex.bm_s2 = plan->flex.bm_s2;
    masks->flex.block_q = plan->flex.block_q;
    masks->flex.block_k = plan->flex.block_k;
    return status;
}

clattn_status clattn_plan_tiles_visited(clattn_plan *plan, cl_mem workspace,
                                        unsigned long long *tiles, size_t *tile_rows,
                                        size_t *tile_keys)
{
    if (plan == NULL || tiles == NULL)
        return plan ? clattn__fail(plan->ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                   "clattn_plan_tiles_visited: tiles is NULL")
                    : CLATTN_ERR_INVALID_ARGUMENT;
    clattn_ctx *ctx = plan->ctx;
    if (!plan->flex.count || !plan->attention.fused)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "clattn_plan_tiles_visited: the plan counts no tiles (it needs "
                            "flex.count_tiles = 1 and the fused path)");
    clattn_status status = CLATTN_SUCCESS;
    if (workspace == NULL &&
        (status = clattn__workspace(ctx, "clattn_plan_tiles_visited", CLATTN_WS_PLAN,
                                    plan->workspace_floats * sizeof(float), &workspace)))
        return status;
    cl_uint count = 0;
    const cl_int err = clEnqueueReadBuffer(
        ctx->queue, workspace, CL_TRUE,
        plan->flex.arena_at * sizeof(float) + plan->flex.count_at, sizeof count, &count, 0, NULL,
        NULL);
    if (err != CL_SUCCESS)
        return clattn__fail(ctx, (clattn_status)err,
                            "clattn_plan_tiles_visited: clEnqueueReadBuffer: %s (%d)",
                            clattn__cl_error_name(err), (int)err);
    *tiles = count;
    if (tile_rows)
        *tile_rows = plan->attention.flash.tile_rows;
    if (tile_keys)
        *tile_keys = plan->attention.flash.key_tile;
    return CLATTN_SUCCESS;
}

void clattn_block_mask_desc_init(clattn_block_mask_desc *desc)
{
    if (desc) {
        memset(desc, 0, sizeof *desc);
        desc->struct_size = sizeof *desc;
    }
}

clattn_status clattn_flex_block_mask(clattn_ctx *ctx, const clattn_block_mask_desc *desc,
                                     cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    static const char op[] = "clattn_flex_block_mask";
    clattn_status status = clattn__entry(ctx, op, desc, num_wait, wait, event);
    if (status != CLATTN_SUCCESS)
        return status;
    if (desc->struct_size != sizeof *desc)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: desc.struct_size=%zu, expected %zu (clattn_block_mask_desc_init)",
                            op, desc->struct_size, sizeof *desc);
    const clattn_flex_desc *flex = &desc->flex;
    if (flex->source == NULL || !(flex->functions & CLATTN_FLEX_MASK_MOD))
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "%s: flex.source must define mask_mod (CLATTN_FLEX_MASK_MOD)", op);
    const size_t sizes[6] = {desc->batch, desc->heads, desc->seq_q, desc->seq_k, flex->block_q,
                             flex->block_k};
    static const char *const size_names[6] = {"batch", "heads", "seq_q", "seq_k", "block_q",
                                               "block_k"};
    if ((status = clattn__check_dims(ctx, op, sizes, size_names, 6, false)) ||
        (status = clattn__check_dims(ctx, op, sizes, size_names, 6, true)))
        return status;
    const size_t q_blocks = (desc->seq_q + flex->block_q - 1) / flex->block_q;
    const size_t k_blocks = (desc->seq_k + flex->block_k - 1) / flex->block_k;
    size_t blocks = 0;
    if (!clattn__product(&blocks, 4, desc->batch, desc->heads, q_blocks, k_blocks) ||
        blocks > UINT32_MAX)
        return clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: too many blocks", op);
    /* the output: U8 (batch, heads, q_blocks, k_blocks), contiguous */
    clattn__layout out;
    if ((status = clattn__layout_from(ctx, op, "out", &desc->out, CLATTN__U8, true, &out)))
        return status;
    const size_t want[4] = {desc->batch, desc->heads, q_blocks, k_blocks};
    if ((status = clattn__layout_expect(ctx, op, "out", &out, 4, want,
                                        "(batch, heads, query blocks, key blocks)")))
        return status;
    if (!row_major(&out))
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED, "%s: out must be contiguous", op);
    clattn__layout aux_layouts[CLATTN_FLEX_AUX_MAX];
    const clattn__layout *aux[CLATTN_FLEX_AUX_MAX] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < CLATTN_FLEX_AUX_MAX && desc->aux; ++i) {
        char name[16];
        snprintf(name, sizeof name, "aux[%d]", i);
        if ((status = clattn__layout_from(ctx, op, name, &desc->aux[i],
                                          CLATTN__F32 | CLATTN__I32 | CLATTN__U8, false,
                                          &aux_layouts[i])))
            return status;
        aux[i] = &aux_layouts[i];
    }
    clattn__flex_parts parts;
    memset(&parts, 0, sizeof parts);
    parts.count = 1;
    if ((status = clattn__flex_user_part(ctx, op, flex, aux, &parts.part[0])))
        return status;
    const size_t count = parts.part[0].num_aux;
    int id = 0;
    if ((status = flex_compose(ctx, op, &parts, aux, count, &id)))
        return status;
    const flex_switches sw = {.FLEX_SRC = id, .FLEX_MASK = 1};
    cl_kernel kernel = NULL;
    if ((status = clattn__family_kernel(ctx, &flex_family, "flex_block_mask", &sw, NULL, 0,
                                        &kernel)))
        return clattn__end_message(ctx, op, status);
    /* the arena: the auxiliary tensors copied in (the context's workspace) */
    size_t at = 0, aux_at[CLATTN_FLEX_AUX_MAX] = {0, 0, 0, 0}, bytes[CLATTN_FLEX_AUX_MAX];
    for (size_t i = 0; i < count; ++i) {
        aux_at[i] = at;
        bytes[i] = layout_elems(aux[i]) * clattn_dtype_size(aux[i]->dtype);
        at += align_up(bytes[i]);
    }
    clattn_chain chain;
    if ((status = clattn__begin(ctx, op, &chain, NULL, false, num_wait, wait)))
        return status;
    cl_mem arena = NULL;
    status = clattn__workspace(ctx, op, CLATTN_WS_PLAN, at, &arena);
    for (size_t i = 0; i < count && status == CLATTN_SUCCESS; ++i)
        status = chain_copy(&chain, desc->aux[i].mem,
                            desc->aux[i].offset * clattn_dtype_size(aux[i]->dtype), arena,
                            aux_at[i], bytes[i], "aux");
    if (status == CLATTN_SUCCESS) {
        const clattn_block_mask_params params = {
            .out_offset = desc->out.offset, .aux0 = aux_at[0], .aux1 = aux_at[1],
            .aux2 = aux_at[2], .aux3 = aux_at[3], .batch = (cl_uint)desc->batch,
            .heads = (cl_uint)desc->heads, .seq_q = (cl_uint)desc->seq_q,
            .seq_k = (cl_uint)desc->seq_k, .block_q = (cl_uint)flex->block_q,
            .block_k = (cl_uint)flex->block_k, .q_blocks = (cl_uint)q_blocks,
            .k_blocks = (cl_uint)k_blocks};
        const size_t local = ctx->info.max_work_group_size < 64 ? 1 : 64;
        size_t global = 0;
        if (!clattn__round_up(blocks, local, &global))
            status = clattn__fail(ctx, CLATTN_ERR_OVERFLOW, "%s: too many blocks", op);
        const clattn_arg args[] = {CLATTN_ARG(desc->out.mem), CLATTN_ARG(arena),
                                   CLATTN_ARG(params)};
        if (status == CLATTN_SUCCESS)
            status = clattn__launch_kernel(&chain, kernel, "flex_block_mask", args, 3, 1, &global,
                                           &local);
    }
    return clattn__end(op, &chain, status, event);
}

void clattn_flex_tree_mask(clattn_flex_desc *flex)
{
    if (flex == NULL)
        return;
    flex->source = CLATTN_TREE_MASK_SOURCE;
    flex->functions = CLATTN_FLEX_MASK_MOD;
    flex->aux_names[0] = "tree_bits";
    flex->aux_names[1] = "tree_meta";
}
