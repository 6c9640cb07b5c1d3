/* Plans inside the library: what create decided, what execute runs. */
#ifndef CLATTN_PLAN_H
#define CLATTN_PLAN_H

#include "core/tensor.h"
#include "ops.h"

/* The roles (clattn_tensors' names, in the order of its by_role array): (role, field, the public
 * clattn_role, the name SDPA gives it, MHA's, the positional ops'). */
#define CLATTN__ROLES(X)                                                                           \
    X(R_Q, q, CLATTN_ROLE_Q, "q", "query", "x")                                                    \
    X(R_K, k, CLATTN_ROLE_K, "k", "key", "k")                                                      \
    X(R_V, v, CLATTN_ROLE_V, "v", "value", "v")                                                    \
    X(R_OUT, out, CLATTN_ROLE_OUT, "out", "out", "out")                                            \
    X(R_MASK, attn_mask, CLATTN_ROLE_ATTN_MASK, "attn_mask", "attn_mask", "attn_mask")             \
    X(R_KPM, key_padding_mask, CLATTN_ROLE_KEY_PADDING_MASK, "key_padding_mask", "key_padding_mask", "key_padding_mask")\
    X(R_WEIGHTS, weights, CLATTN_ROLE_WEIGHTS, "weights", "weights", "weights")                    \
    X(R_LSE, lse, CLATTN_ROLE_LSE, "lse", "lse", "lse")                                            \
    X(R_IN_W, in_proj_weight, CLATTN_ROLE_IN_PROJ_WEIGHT, "in_proj_weight", "in_proj_weight", "in_proj_weight")\
    X(R_IN_B, in_proj_bias, CLATTN_ROLE_IN_PROJ_BIAS, "in_proj_bias", "in_proj_bias", "in_proj_bias")\
    X(R_QW, q_weight, CLATTN_ROLE_Q_WEIGHT, "q_weight", "q_weight", "q_weight")                    \
    X(R_KW, k_weight, CLATTN_ROLE_K_WEIGHT, "k_weight", "k_weight", "k_weight")                    \
    X(R_VW, v_weight, CLATTN_ROLE_V_WEIGHT, "v_weight", "v_weight", "v_weight")                    \
    X(R_QB, q_bias, CLATTN_ROLE_Q_BIAS, "q_bias", "q_bias", "q_bias")                              \
    X(R_KB, k_bias, CLATTN_ROLE_K_BIAS, "k_bias", "k_bias", "k_bias")                              \
    X(R_VB, v_bias, CLATTN_ROLE_V_BIAS, "v_bias", "v_bias", "v_bias")                              \
    X(R_OW, out_weight, CLATTN_ROLE_OUT_WEIGHT, "out_weight", "out_weight", "out_weight")          \
    X(R_OB, out_bias, CLATTN_ROLE_OUT_BIAS, "out_bias", "out_bias", "out_bias")                    \
    X(R_KVLEN, kv_seqlen, CLATTN_ROLE_KV_SEQLEN, "kv_seqlen", "kv_seqlen", "kv_seqlen")            \
    X(R_PAST_K, past_k, CLATTN_ROLE_PAST_K, "past_k", "past_k", "past_k")                          \
    X(R_PAST_V, past_v, CLATTN_ROLE_PAST_V, "past_v", "past_v", "past_v")                          \
    X(R_PRESENT_K, present_k, CLATTN_ROLE_PRESENT_K, "present_k", "present_k", "present_k")        \
    X(R_PRESENT_V, present_v, CLATTN_ROLE_PRESENT_V, "present_v", "present_v", "present_v")        \
    X(R_SCORES, scores, CLATTN_ROLE_SCORES, "scores", "scores", "scores")                          \
    X(R_ALIBI, alibi_slopes, CLATTN_ROLE_ALIBI_SLOPES, "alibi_slopes", "alibi_slopes", "alibi_slopes")\
    X(R_POS_TABLE, pos_table, CLATTN_ROLE_POS_TABLE, "pos_table", "pos_table", "pos_table")        \
    X(R_ROPE_COS, rope_cos, CLATTN_ROLE_ROPE_COS, "rope_cos", "rope_cos", "rope_cos")              \
    X(R_ROPE_SIN, rope_sin, CLATTN_ROLE_ROPE_SIN, "rope_sin", "rope_sin", "rope_sin")              \
    X(R_POS_IDS, position_ids, CLATTN_ROLE_POSITION_IDS, "position_ids", "position_ids", "position_ids")\
    X(R_SCORE_W, score_weight, CLATTN_ROLE_SCORE_WEIGHT, "score_weight", "score_weight", "score_weight")\
    X(R_SINKS, sinks, CLATTN_ROLE_SINKS, "sinks", "sinks", "sinks")                              \
    X(R_BLOCK_TABLE, block_table, CLATTN_ROLE_BLOCK_TABLE, "block_table", "block_table",         \
      "block_table")                                                                               \
    X(R_CU_Q, cu_seqlens_q, CLATTN_ROLE_CU_SEQLENS_Q, "cu_seqlens_q", "cu_seqlens_q",              \
      "cu_seqlens_q")                                                                              \
    X(R_CU_K, cu_seqlens_k, CLATTN_ROLE_CU_SEQLENS_K, "cu_seqlens_k", "cu_seqlens_k",              \
      "cu_seqlens_k")                                                                              \
    X(R_GRAD_OUT, grad_out, CLATTN_ROLE_GRAD_OUT, "grad_out", "grad_out", "grad_out")              \
    X(R_GRAD_Q, grad_q, CLATTN_ROLE_GRAD_Q, "grad_q", "grad_q", "grad_q")                          \
    X(R_GRAD_K, grad_k, CLATTN_ROLE_GRAD_K, "grad_k", "grad_k", "grad_k")                          \
    X(R_GRAD_V, grad_v, CLATTN_ROLE_GRAD_V, "grad_v", "grad_v", "grad_v")                          \
    X(R_GRAD_MASK, grad_attn_mask, CLATTN_ROLE_GRAD_ATTN_MASK, "grad_attn_mask",                   \
      "grad_attn_mask", "grad_attn_mask")                                                          \
    X(R_GRAD_SINKS, grad_sinks, CLATTN_ROLE_GRAD_SINKS, "grad_sinks", "grad_sinks", "grad_sinks") \
    X(R_FLEX_AUX0, flex_aux0, CLATTN_ROLE_FLEX_AUX0, "flex_aux0", "flex_aux0", "flex_aux0")        \
    X(R_FLEX_AUX1, flex_aux1, CLATTN_ROLE_FLEX_AUX1, "flex_aux1", "flex_aux1", "flex_aux1")        \
    X(R_FLEX_AUX2, flex_aux2, CLATTN_ROLE_FLEX_AUX2, "flex_aux2", "flex_aux2", "flex_aux2")        \
    X(R_FLEX_AUX3, flex_aux3, CLATTN_ROLE_FLEX_AUX3, "flex_aux3", "flex_aux3", "flex_aux3")        \
    X(R_BLOCK_MASK, block_mask, CLATTN_ROLE_BLOCK_MASK, "block_mask", "block_mask", "block_mask") \
    X(R_T5_BIAS, t5_bias, CLATTN_ROLE_T5_BIAS, "t5_bias", "t5_bias", "t5_bias")

typedef enum clattn__role {
#define CLATTN__ROLE_ENUM(role, field, pub, sdpa, mha, x) role = pub,
    CLATTN__ROLES(CLATTN__ROLE_ENUM)
#undef CLATTN__ROLE_ENUM
    R_COUNT
} clattn__role;

const clattn_tensor *clattn__tensor_of(const clattn_tensors *t, clattn__role role);

/* A set of roles: bit (1 << role) per role. */
#define CLATTN__ROLE(r) ((uint64_t)1 << (r))
/* The roles of the score modifiers' tables and functions (modifiers.c, clattn_flex_desc): the
 * roles from flex_aux0 on, each validated by its modifier's step. */
#define CLATTN__FLEX_ROLES                                                                         \
    (CLATTN__ROLE(R_FLEX_AUX0) | CLATTN__ROLE(R_FLEX_AUX1) | CLATTN__ROLE(R_FLEX_AUX2) |          \
     CLATTN__ROLE(R_FLEX_AUX3) | CLATTN__ROLE(R_BLOCK_MASK) | CLATTN__ROLE(R_T5_BIAS))
_Static_assert(R_COUNT <= 64, "a role set is a 64-bit mask");
/* The roles SDPA and its backward both take: the operands and out, the masks, lse, kv_seqlen,
 * ALiBi's slopes, the attention sinks, packed sequences' offsets and the score functions'. */
#define CLATTN__SDPA_RULE_ROLES                                                                    \
    (CLATTN__ROLE(R_Q) | CLATTN__ROLE(R_K) | CLATTN__ROLE(R_V) | CLATTN__ROLE(R_OUT) |             \
     CLATTN__ROLE(R_MASK) | CLATTN__ROLE(R_KPM) | CLATTN__ROLE(R_LSE) | CLATTN__ROLE(R_KVLEN) |    \
     CLATTN__ROLE(R_ALIBI) | CLATTN__ROLE(R_SINKS) | CLATTN__ROLE(R_CU_Q) | CLATTN__ROLE(R_CU_K) | \
     CLATTN__FLEX_ROLES)

/* Attention over (batch, heads, seq, head_dim) views: the steps both plans share. */
typedef struct clattn__attention {
    clattn__score_shape score;
    size_t head_dim_qk, head_dim_v;
    /* > 1: a decode group's query heads run as the rows of their k/v head (sdpa.c); its
     * tuning is the decode phase's */
    size_t decode_group;
    clattn_tuning tuning;   /* the problem's: the context's row and the records that select it */
    char tuning_records[160]; /* which records applied ("" none) */
    bool fused;
    char fallback[160]; /* "" or why the fused path failed validation (then unfused) */
    clattn__flash_plan flash;
    clattn__matmul_plan qk, pv;
    clattn__additive_plan additive; /* score.additive: the raw scores instead of qk */
    clattn__softmax_plan softmax;
    bool own_scores;   /* unfused without the caller's weights: scores in the workspace */
    size_t scores_at;  /* workspace float offset of the scores */
    size_t scratch_at; /* workspace float offset of the ops' scratch */
} clattn__attention;

/* Everything the attention steps read at execution. */
typedef struct clattn__attention_io {
    clattn__view q, k, v, out;
    clattn__view weights; /* mem NULL: not wanted */
    clattn__view scores;  /* mem NULL: not wanted (score.want_scores) */
    clattn__view lse;     /* mem NULL: not wanted */
    clattn__score_masks masks;
} clattn__attention_io;

/* The backward's unfused reference path (sdpa_backward_unfused.c): the score matrices in the
 * workspace, matmuls around one elementwise step (flash_bwd.cl's bwd_unfused_rows). */
typedef struct clattn__unfused_bwd {
    bool on;
    clattn__score_shape score;      /* the rule (dropout included: the rows step applies it) */
    clattn__softmax_plan softmax;   /* the forward's weights, undropped */
    clattn__matmul_plan qk, dov;    /* x = Q K^T, dp = dO V^T */
    clattn__matmul_plan dq, dk, dv; /* dX K, then per group member dX^T Q, (P Z)^T dO */
    cl_kernel rows, sum_q, sum_k, sum_v, mask_reduce, sinks;
    size_t local_rows;
    size_t head_dim_qk, head_dim_v;
    bool want_dmask, want_dsinks;
    /* workspace float offsets: the (B, H, Lq, Lk) matrices, delta (B, H, Lq), the gradients'
     * F32 sums (dQ (B, H, Lq, dk); dK, dV: one (B, kv_heads, Lk, d) part per group member),
     * the matmuls' scratch */
    size_t raw_at, p_at, dp_at, delta_at, dq_at, dk_at, dv_at, mm_at;
    size_t dk_part, dv_part; /* floats of one part */
} clattn__unfused_bwd;

typedef struct clattn__mha {
    size_t batch, seq_q, seq_k, heads, qk_dim, v_dim, head_dim_qk, head_dim_v;
    size_t kv_heads, kv_qk_dim, kv_v_dim; /* grouped-query: k/v heads and projected widths */
    bool packed_in_proj;               /* in_proj_weight given (layout TORCH) */
    clattn__matmul_plan q_proj, k_proj, v_proj, qkv_proj, out_proj;
    bool has_out_proj;
    size_t q_at, k_at, v_at, concat_at; /* workspace float offsets */
    size_t weights_at;                  /* per-head weights for AVERAGED */
    size_t scratch_at;                  /* the projections' matmul scratch */
    clattn__mean_heads_plan mean;
    clattn_need_weights need_weights;
    bool trans_w; /* layout TORCH: weights stored (d_out, d_in) */
    bool rope;    /* RoPE on the projected q and k, in place (rope_q, rope_k; plan->angles) */
    clattn__rope_plan rope_q, rope_k;
} clattn__mha;

/* SDPA's KV cache: present = concat(past, new) along the keys, by copies on the device. */
typedef struct clattn__sdpa_cache {
    bool has_past, has_present;
    size_t past_len, new_len;
    clattn__copy_plan past_k, past_v, new_k, new_v;
} clattn__sdpa_cache;

/* SDPA's rotary embeddings: q and the new keys rotated into packed F32 copies in the workspace
 * (the caller's tensors are inputs), on which attention (and present_k's copy) then runs. */
typedef struct clattn__sdpa_rope {
    bool on;
    clattn__rope_plan q, k; /* (batch, heads, seq_q, d) and (batch, kv_heads, seq_k, d) */
    size_t q_at, k_at;      /* workspace float offsets of the copies */
} clattn__sdpa_rope;

/* Additive attention: the projections P1 = q W1 + b1, P2 = k W2 + b2 into the workspace, then
 * attention with the additive score on head views of them. */
typedef struct clattn__additive {
    size_t batch, seq_q, seq_k, heads, da, head_dim_v;
    bool per_head_w1, per_head_w2;        /* (H, d, da) weights: one projection per head */
    bool flat_q, flat_k;                  /* (batch * seq) rows as one matrix */
    clattn__matmul_plan p1_proj, p2_proj; /* n = H * da, or da per head */
    size_t p1_at, p2_at, scratch_at;      /* workspace float offsets */
} clattn__additive;

typedef enum clattn__plan_kind {
    CLATTN__SDPA,
    CLATTN__MHA,
    CLATTN__POSENC,
    CLATTN__ROPE,
    CLATTN__ADDITIVE,
    CLATTN__SDPA_BACKWARD
} clattn__plan_kind;

/* The device tables of angles a plan uploads (posenc.c, rope.c): the sinusoid's frequencies and
 * RoPE's (the POSENC and ROPE kinds', SDPA's and MHA's rotary embeddings); released with the
 * plan (plan.c). */
typedef struct clattn__angles {
    cl_mem freq; /* (dim + 1) / 2 float pairs (hi, lo); NULL for a table */
    /* RoPE with positions known at creation: cos then sin of every (row, pair) angle,
     * (rows, half) each, computed in double on the host (clattn__make_angle_table) */
    cl_mem table;
    size_t rows, half;
} clattn__angles;

/* Positional-encoding plans (posenc.c): the op and the first position. */
typedef struct clattn__posenc {
    clattn__posenc_plan op;
    size_t start;
} clattn__posenc;

/* SDPA plans (sdpa.c). */
typedef struct clattn__sdpa {
    clattn__sdpa_cache cache;
    clattn__sdpa_rope rope;
    size_t page_size, num_pages; /* with a block table: k and v are pools of pages */
    /* clattn_kv_cache_decode's step, set for the one execution it makes (cache.c); NULL else */
    const clattn__kv_step *step;
    bool kv_step; /* made with kv_step = 1 (clattn_sdpa_desc) */
} clattn__sdpa;

/* SDPA's backward (sdpa_backward.c): the fused passes, or the unfused path (unfused.on); the
 * fused plan's shape (want_dmask) is set on both paths. */
typedef struct clattn__sdpa_backward {
    clattn__flash_bwd_plan flash;
    clattn__unfused_bwd unfused;
    clattn__view grad_mask_view; /* grad_attn_mask, the mask's dims (mem bound later) */
} clattn__sdpa_backward;

/* The score masks' views, built from the plan's layouts at creation (attention.c); their mem
 * and offset are bound at execution (clattn__bound_masks). */
typedef struct clattn__score_views {
    clattn__view mask, key_padding; /* broadcast views of the masks */
    clattn__view kv_len;            /* (1, 1, 1, batch) view of kv_seqlen */
    clattn__view alibi;             /* (1, 1, batch, heads) view of alibi_slopes */
    clattn__view sinks;             /* (1, 1, heads, seq_q) view of sinks (per-row stride 0) */
} clattn__score_views;

/* Packed sequences (cu_seqlens; SDPA and its backward): q, k, v, out and lse (and the
 * backward's grad_out, grad_q, grad_k, grad_v) as the (batch, heads, max_seqlen, d) views the
 * kernels take (batch stride 0, the token stride per row), by role (clattn__varlen_role); the
 * plan's layouts[] keep the caller's packed ones, which execution binds. The packed totals of
 * query rows and keys (clattn__plan_masks copies them to the score). */
typedef struct clattn__varlen {
    bool on;
    bool paged; /* packed queries over a paged cache: k and v stay pools (not packed) */
    clattn__layout layouts[R_COUNT];
    size_t total_q, total_k;
} clattn__varlen;

/* User score functions (flex.c; SDPA and its backward): the arena in the workspace (float
 * offset arena_at, bytes) and where each auxiliary tensor, the block mask and the counter sit
 * in it. */
typedef struct clattn__flex_arena {
    bool on, blocks, count;
    size_t arena_at, arena_bytes;
    size_t num_aux; /* the arena's auxiliary tensors: their roles, offsets and sizes */
    int aux_roles[2 * CLATTN_FLEX_AUX_MAX];
    size_t aux_at[2 * CLATTN_FLEX_AUX_MAX], aux_bytes[2 * CLATTN_FLEX_AUX_MAX];
    size_t blocks_at, blocks_bytes, count_at;
    size_t block_q, block_k, bm_s0, bm_s1, bm_s2;
    size_t tile_rows, tile_keys; /* the fused kernel's tile (clattn_plan_tiles_visited) */
} clattn__flex_arena;

/* What a plan kind provides (one table per kind, defined in its own file): plan.c reaches a kind
 * only through it, so no file of host/attn calls back into the one that calls it. The kind's
 * public clattn_*_plan_create calls clattn__plan_create with its table, which runs the shared
 * prologue (entry checks, struct_size, the tensors' layouts) and then create: all validation
 * and geometry, on a plan whose layouts are set. execute enqueues the planned steps on tensors
 * already bound and checked against the plan (no validation, no planning); release frees what
 * the kind added beyond the shared fields (NULL: nothing); role_names name the tensors in
 * messages; a tensor set in a role outside `roles` fails before create runs. Every plan
 * descriptor starts with `size_t struct_size; const clattn_tensor *by_role; size_t num_roles;`. */
typedef struct clattn__plan_ops {
    clattn__plan_kind kind;
    clattn__desc_type desc; /* the descriptor's type: name, sizes, defaults */
    clattn_status (*create)(clattn_plan *plan, const void *desc);
    clattn_status (*execute)(clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                             cl_mem workspace, clattn_chain *chain);
    void (*release)(clattn_plan *plan);
    const char *const *role_names; /* R_COUNT names */
    size_t by_role_at; /* offsetof(desc, by_role), followed by num_roles */
    uint64_t roles; /* the roles the kind takes (CLATTN__ROLE bits); a tensor in another fails */
} clattn__plan_ops;

/* Defines a kind's table `name##_ops` (no release) and its public create function `fn`, which
 * is clattn__plan_create with the table and the op name `op`. Every version of a plan
 * descriptor has struct_size, by_role and num_roles; desc_t##_init gives the defaults. */
#define CLATTN__PLAN_KIND(name, kind, desc_t, create_fn, execute_fn, fn, op, names, roles)         \
    static void name##_defaults(void *desc)                                                        \
    {                                                                                              \
        desc_t##_init(desc);                                                                       \
    }                                                                                              \
    static const clattn__plan_ops name##_ops = {                                                   \
        kind,                                                                                      \
        {#desc_t, sizeof(desc_t), offsetof(desc_t, num_roles) + sizeof(size_t), name##_defaults},  \
        create_fn,                                                                                 \
        execute_fn,                                                                                \
        NULL,                                                                                      \
        names,                                                                                     \
        offsetof(desc_t, by_role),                                                                 \
        roles};                                                                                    \
    clattn_status fn(clattn_ctx *ctx, const desc_t *desc, clattn_plan **out)                       \
    {                                                                                              \
        return clattn__plan_create(ctx, &name##_ops, op, desc, out);                               \
    }

/* desc_t##_init for descriptors with a score scale: zeroed, struct_size set, scale NAN (the
 * default 1/sqrt(head_dim)), then `more` (statements on desc: the named defaults). */
#define CLATTN__DESC_INIT_SCALED(desc_t, more)                                                     \
    void desc_t##_init(desc_t *desc)                                                               \
    {                                                                                              \
        if (clattn__desc_reset(desc, sizeof *desc)) {                                              \
            desc->scale = NAN;                                                                     \
            more                                                                                   \
        }                                                                                          \
    }
/* The rotary fields' named defaults, and num_kv_heads' (CLATTN__DESC_INIT_SCALED's `more`). */
#define CLATTN__ROPE_DEFAULTS                                                                      \
    desc->rope_dims = CLATTN_ROPE_WHOLE_HEAD;                                                      \
    desc->rope_base = CLATTN_ROPE_BASE_DEFAULT;
#define CLATTN__HEADS_DEFAULTS CLATTN__ROPE_DEFAULTS desc->num_kv_heads = CLATTN_KV_HEADS_ALL;

/* The score rule's fields that the host calls' descriptors share with the plans'. */
#define CLATTN__SCORE_FIELDS(X)                                                                    \
    X(causal) X(scale) X(norm) X(path) X(softcap) X(window_align) X(window_left) X(window_right)

/* The tensors' names: SDPA's (q, k, v, ...), MHA's (query, key, value, ...) and the
 * positional ops' (x, ...). */
extern const char *const clattn__sdpa_role_names[];
extern const char *const clattn__mha_role_names[];
extern const char *const clattn__x_role_names[];

struct clattn_plan {
    /* The prologue every kind shares (plan.c). */
    clattn_ctx *ctx;
    const clattn__plan_ops *ops; /* ops->kind names the member of the union below */
    const char *op;              /* the call's name in messages: "sdpa", "mha", .. */
    clattn__layout layouts[R_COUNT];
    clattn__angles angles;
    char info[512]; /* clattn_plan_info */
    size_t workspace_floats;
    /* The score steps' state (attention.c, modifiers.c, flex.c): the kinds that compute
     * attention scores (SDPA, its backward, MHA, additive); zero in posenc and rope plans.
     * varlen, flex and t5_source serve SDPA and its backward only. */
    clattn__score_views views;
    clattn__attention attention;
    clattn__varlen varlen;
    clattn__flex_arena flex;
    char t5_source[1536]; /* T5's buckets as a score function, with its constants */
    /* What one kind alone uses: the member ops->kind names (the others overlap it). */
    union {
        clattn__sdpa sdpa;                  /* CLATTN__SDPA */
        clattn__sdpa_backward backward;     /* CLATTN__SDPA_BACKWARD */
        clattn__mha mha;                    /* CLATTN__MHA */
        clattn__additive additive;          /* CLATTN__ADDITIVE */
        clattn__posenc posenc;              /* CLATTN__POSENC */
        clattn__rope_plan rope;             /* CLATTN__ROPE */
    };
};

/* Packed variable-length batches (roles R_CU_Q, R_CU_K; SDPA and its backward): checks the
 * packed operands (q, k, v, out rank 3, lse (heads, total_q); the backward's grad_out, grad_q,
 * grad_k, grad_v as out, q, k, v), refuses what packed sequences do not take, then makes every
 * packed role the (batch, heads, max_seqlen, d) view the rest of create and the kernels take
 * (batch stride 0, the token stride per row; score.cl's VARLEN adds each sequence's offset).
 * Sets plan->varlen (on, the totals) and score's varlen fields. The caller's layouts go to
 * plan->varlen.layouts until clattn__unpack_varlen swaps them back at the end of create. */
clattn_status clattn__pack_varlen(clattn_plan *plan, const clattn_sdpa_desc *desc,
                                  clattn__score_shape *score);
/* The caller's packed layouts back into plan->layouts (which execution binds), the kernels'
 * views into plan->varlen.layouts. */
void clattn__unpack_varlen(clattn_plan *plan);
/* Fails unless q, k, v and out (roles R_Q .. R_OUT) are given with rank `rank`, naming the
 * dims shapes[role] describes (NULL: "(batch, heads, seq, head_dim)" for all; "with
 * cu_seqlens, .. a packed rank-3 tensor" when packed). */
clattn_status clattn__expect_operands(const clattn_plan *plan, int rank, bool packed,
                                      const char *const shapes[4]);
/* Grouped-query (and multi-query) attention in SDPA and its backward: k and v may have fewer
 * heads than q, a divisor of q's; query head h then reads k/v head h / (heads / kv_heads).
 * Fails (naming k's and q's heads) unless kv_heads divides heads. */
clattn_status clattn__check_kv_heads(const clattn_plan *plan, size_t heads, size_t kv_heads);
/* Whether packed sequences make `role` a (batch, heads, max_seqlen, d) view: q, k, v, out, lse,
 * grad_out, grad_q, grad_k, grad_v. */
bool clattn__varlen_role(clattn__role role);
/* A role's view as the kernels take it: with packed sequences, the (batch, heads, max_seqlen, d)
 * view of the packed tensor (clattn__varlen_role); else clattn__role_view's. */
clattn__view clattn__kernel_view(const clattn_plan *plan, const cl_mem *mems,
                                 const size_t *offsets, clattn__role role);
/* The kernels' views (clattn__kernel_view) of `count` roles into *views[i]: an execution's
 * operands bound in one table. */
void clattn__bind_views(const clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                        size_t count, const clattn__role *roles, clattn__view *const *views);

/* Builds the broadcast views of the masks from the plan's layouts (masks in roles R_MASK and
 * R_KPM) for a (batch, heads, seq_q, seq_k) problem and fills the score shape's mask fields
 * and its packed sequences' (plan->varlen: clattn__pack_varlen). */
clattn_status clattn__plan_masks(clattn_plan *plan, size_t batch, size_t heads, size_t seq_q,
                                 size_t seq_k, clattn__score_shape *score);
/* The ALiBi slopes (role R_ALIBI: F32 (heads) or (batch, heads)) as plan->views.alibi, and
 * score->has_alibi; score's batch and heads set. */
clattn_status clattn__plan_alibi(clattn_plan *plan, clattn__score_shape *score);
/* The attention sinks (role R_SINKS: F32 (heads)) as plan->views.sinks, and score->has_sinks;
 * score's heads, seq_q and norm set. */
clattn_status clattn__plan_sinks(clattn_plan *plan, clattn__score_shape *score);
/* Dropout (clattn_sdpa_desc.dropout_p, _seed, _offset) into the score shape; validates p and
 * refuses it with packed sequences, a paged cache or quantized k/v (the plan's layouts). */
clattn_status clattn__plan_dropout(clattn_plan *plan, double p, unsigned long long seed,
                                   unsigned long long offset, clattn__score_shape *score);
/* Score functions as OpenCL C (flex.c): a part is one source's score_mod / mask_mod /
 * score_mod_grad (clattn_flex_flags), its file name in compiler messages and its auxiliary
 * tensors (names the source reads, the roles that hold them). The built-in modifiers written
 * as functions (modifiers.c) are parts; the user's clattn_flex_desc is the last. */
typedef struct clattn__flex_part {
    const char *file;
    const char *source;
    unsigned functions;
    size_t num_aux;
    const char *names[CLATTN_FLEX_AUX_MAX];
    int roles[CLATTN_FLEX_AUX_MAX];
} clattn__flex_part;
typedef struct clattn__flex_parts {
    size_t count;
    clattn__flex_part part[3];
} clattn__flex_parts;
/* The user's part from desc.flex (flex_aux0..3's layouts in aux): functions and names. */
clattn_status clattn__flex_user_part(clattn_ctx *ctx, const char *op, const clattn_flex_desc *flex,
                                     const clattn__layout *const *aux, clattn__flex_part *part);
/* Composes the built-ins' parts and the user's (desc.flex) into the plan's score functions:
 * validates the names and layouts (the block mask's for (batch, heads, seq_q, seq_k)),
 * registers the text with the context, sets score's flex fields and sizes the arena. Nothing
 * without parts (a flex role bound then fails). backward: refuses a score_mod without its
 * gradient. */
clattn_status clattn__plan_flex(clattn_plan *plan, const clattn__flex_parts *builtin,
                                const clattn_flex_desc *flex, size_t batch, size_t heads,
                                size_t seq_q, size_t seq_k, bool backward,
                                clattn__score_shape *score);
/* Reserves the arena at the end of the plan's workspace (plan->workspace_floats): called
 * once the other steps have reserved theirs. */
void clattn__flex_reserve(clattn_plan *plan);
/* At execution: copies the auxiliary tensors and block mask into the arena, zeroes the
 * counter (on the chain), and points masks->flex at it. Nothing without flex. */
clattn_status clattn__flex_stage(clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                                 cl_mem workspace, clattn_chain *chain,
                                 clattn__score_masks *masks);
/* The score modifiers' table (modifiers.c): every modifier's validation, refusals and score
 * shape fields for an SDPA plan or its backward, in one pass (batch, heads, seq_q, seq_k: the
 * problem's, seq_k counting past keys; past_len -1: no past tensors). */
clattn_status clattn__plan_modifiers(clattn_plan *plan, const clattn_sdpa_desc *desc,
                                     size_t batch, size_t heads, size_t seq_q, size_t seq_k,
                                     size_t head_dim_qk, long long past_len, bool backward,
                                     clattn__score_shape *score);
/* Validates the score rule's settings and resolves scale (NAN: 1/sqrt(head_dim_qk)). */
clattn_status clattn__plan_score(clattn_plan *plan, float scale, clattn_norm norm,
                                 size_t head_dim_qk, clattn__score_shape *score);
/* The key band of the score shape (batch, seq_q, seq_k set: seq_k counts past keys too) from
 * the causal alignment, the sliding window (window_align NONE: none), the past length
 * (-1: no past tensors), CLATTN_CAUSAL_OFFSET's diagonal (SDPA only; unused by the other
 * alignments) and the plan's kv_seqlen (role R_KVLEN); validates them. */
clattn_status clattn__plan_band(clattn_plan *plan, clattn_causal causal, clattn_causal window_align,
                                long long window_left, long long window_right, long long past_len,
                                long long diag_offset, clattn__score_shape *score);

/* Whether path AUTO runs the fused kernel: no weights or scores wanted, normalised in float,
 * head sizes the fused kernel takes. */
bool clattn__auto_fuses(const clattn__score_shape *score, size_t head_dim_qk, size_t head_dim_v,
                        bool want_weights);
/* Chooses the path and prepares the attention steps, reserving workspace from
 * *workspace_floats on. want_weights: the caller's weights view receives the weights. */
clattn_status clattn__attention_prepare(clattn_plan *plan, const clattn__score_shape *score,
                                        size_t head_dim_qk, size_t head_dim_v,
                                        clattn_dtype q_dtype, clattn_dtype k_dtype,
                                        clattn_dtype v_dtype, clattn_dtype out_dtype,
                                        bool want_weights, bool want_lse, clattn_path path,
                                        size_t *workspace_floats);
clattn_status clattn__attention_enqueue(clattn_plan *plan, const clattn__attention_io *io,
                                        cl_mem workspace, clattn_chain *chain);

/* The backward's unfused path (sdpa_backward_unfused.c): prepares plan->backward.unfused for
 * the score shape (masks, band, sinks, dropout set), the plan's layouts (q, k, v, grad_out with
 * unit head_dim stride) and the gradients asked for; the workspace from *workspace_floats on. */
clattn_status clattn__unfused_bwd_prepare(clattn_plan *plan, const clattn__score_shape *score,
                                          size_t head_dim_qk, size_t head_dim_v, bool want_dmask,
                                          bool want_dsinks, size_t *workspace_floats);
/* Its execution: io as the fused backward's (ops.h's clattn__flash_bwd_io). */
clattn_status clattn__unfused_bwd_enqueue(const clattn_plan *plan, const clattn__flash_bwd_io *io,
                                          cl_mem workspace, clattn_chain *chain);

/* A read-only device copy of `bytes` of host memory in *mem, owned by the plan (released with
 * it); `what` names it in the message on failure (posenc.c). */
clattn_status clattn__plan_upload(clattn_plan *plan, cl_mem *mem, const void *host, size_t bytes,
                                  const char *what);
/* A frequency base: `given`, or 10000 for 0; fails naming the field `name` unless finite and
 * positive (posenc.c). */
clattn_status clattn__plan_base(clattn_plan *plan, const char *name, double given, double *base);
/* The float pairs (hi, lo) of base^(-2k / dim), k < count, in plan->angles.freq (posenc.c). */
clattn_status clattn__make_frequencies(clattn_plan *plan, size_t count, size_t dim, double base);
/* RoPE's angle table for positions start .. start + rows - 1 (plan->angles.table): cos, then
 * sin, of (start + r) * base^(-2j / rot), j < rot / 2, in double, rounded to float. Tables of
 * more than CLATTN__ANGLE_TABLE_MAX entries are not made (the device computes the angles). */
#define CLATTN__ANGLE_TABLE_MAX ((size_t)1 << 22)
clattn_status clattn__make_angle_table(clattn_plan *plan, size_t rows, size_t rot, size_t start,
                                       double base);
/* The table's cos and sin as (rows, half) views (rope.c). */
void clattn__angle_views(const clattn_plan *plan, clattn__view *cos_view, clattn__view *sin_view);

/* A plan of the kind `ops` from its descriptor: the whole of every clattn_*_plan_create (see
 * clattn__plan_ops). On failure *out is NULL and the message names `op`. */
clattn_status clattn__plan_create(clattn_ctx *ctx, const clattn__plan_ops *ops, const char *op,
                                  const void *desc, clattn_plan **out);
/* Allocates a plan of the kind `ops` on ctx and validates every tensor layout in `tensors`
 * (floats, masks U8 or floats, outputs overlap-free). */
clattn_status clattn__plan_new(clattn_ctx *ctx, const clattn__plan_ops *ops, const char *op,
                               const clattn_tensors *tensors, clattn_plan **out);
/* Finishes creation: checks the workspace against the context's limit. */
clattn_status clattn__plan_finish(clattn_plan *plan, const char *largest);

/* An attention descriptor's rotary fields (clattn_mha_desc's and clattn_sdpa_desc's rope,
 * rope_style, rope_dims, rope_base, rope_start). */
typedef struct clattn__rope_fields {
    int rope;
    clattn_rope_style style;
    size_t dims;
    double base;
    size_t start;
} clattn__rope_fields;
/* Validates the fields for heads of head_dim columns and rows at positions start ..
 * start + longest - 1, each error naming its field (rope.c). With rope 1, *on is true, the
 * angles are made (the table of those positions when it fits, else the frequencies: see
 * clattn__make_angle_table) and *shape holds the op's dim, rot, pairs, cache_mode and start
 * (the caller sets batch, heads and seq; the table's row s is position start + s). */
clattn_status clattn__rope_fields_prepare(clattn_plan *plan, const clattn__rope_fields *fields,
                                          size_t head_dim, size_t longest, bool *on,
                                          clattn__rope_shape *shape);

/* A (batch, seq, features) layout as a matmul operand: (1, 1, batch * seq, f) when flat, else
 * (1, batch, seq, f) (attention.c; MHA's and additive attention's projections). */
clattn__view clattn__rows_view(const clattn__layout *l, cl_mem mem, size_t offset, bool flat);
/* Whether such a layout's rows make one (batch * seq)-row matrix (the batch stride allows it);
 * else they are a batch of seq-row matrices. */
bool clattn__rows_flatten(const clattn__layout *l);
/* A projection: rows of the (batch, seq = rows, features) input times weight (d_in, n), or its
 * transpose (n, d_in) with trans_w, as one matrix when flat (clattn__rows_flatten). */
clattn_status clattn__projection_prepare(clattn_ctx *ctx, const clattn__layout *input,
                                         const clattn__layout *weight, size_t batch, size_t rows,
                                         size_t n, bool trans_w, bool has_bias,
                                         clattn_dtype out_dtype, bool flat, clattn__matmul_plan *mm);
/* The projections' matmul scratch (`scratch` floats) after the first `cursor` floats of the
 * workspace (its offset in *scratch_at), then clattn__plan_finish (MHA, additive). */
clattn_status clattn__finish_projections(clattn_plan *plan, size_t cursor, size_t scratch,
                                         size_t *scratch_at);
/* Fails (UNSUPPORTED, naming `name` and the axis `along`) unless the layout's last stride is 1. */
clattn_status clattn__expect_unit_stride(const clattn_plan *plan, const char *name,
                                         const clattn__layout *l, const char *along);

/* A plan's layout bound to a buffer at an element offset: the op-level view. */
clattn__view clattn__bound_view(const clattn__layout *l, cl_mem mem, size_t offset);
/* The plan's mask views (mask, key padding, kv_seqlen, ALiBi's slopes, sinks) and packed
 * sequences' offsets bound to the execution's buffers (an absent role's mem is NULL). */
clattn__score_masks clattn__bound_masks(const clattn_plan *plan, const cl_mem *mems,
                                        const size_t *offsets);
/* The plan's tensor in `role` bound to its buffer (mems, offsets as execute gets them); a
 * zeroed view (mem NULL) when the role is absent. */
clattn__view clattn__role_view(const clattn_plan *plan, const cl_mem *mems, const size_t *offsets,
                               clattn__role role);

#endif
