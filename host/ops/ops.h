/* The ops layer: one kernel family per file (host/ops/<name>.c launches kernels/<name>.cl).
 * Each op has a prepare step (plan time: choose the program variant, build or fetch it, fix the
 * launch geometry, size the scratch) and an enqueue step (execution time: bind buffers and
 * launch; no validation). Ops know strides, not heads or models. */
#ifndef CLATTN_OPS_H
#define CLATTN_OPS_H

#include "../../kernels/params.h" /* the kernel families' parameter structs */
#include "core/family.h"
#include "core/runtime.h"
#include "core/tensor.h"

/* ---- matmul (ops/matmul.c, kernels/matmul.cl) ----------------------------------------------
 * C[b0, b1] = alpha * op(A[b0, b1]) * op(B[b0, b1]) + beta * C[b0, b1] + bias, where
 * b0 < batch[0], b1 < batch[1]; the operands' dims[0..1] are their batch dims (1 with stride 0
 * broadcasts), dims[2..3] the matrix as stored; strides[3] == 1 for A, B, C. */
typedef struct clattn__matmul_shape {
    size_t m, n, k;
    size_t batch[2];
    bool trans_a, trans_b;
    clattn_dtype a_dtype, b_dtype, c_dtype;
    bool has_bias;  /* bias: F32, n elements, stride 1 */
    size_t b_group; /* B's second batch index is b1 / b_group (0 or 1: b1), so that b_group
                     * consecutive entries share one B (grouped-query attention's k and v) */
} clattn__matmul_shape;

typedef struct clattn__matmul_plan {
    clattn__matmul_shape shape;
    cl_kernel kernel; /* matmul or matmul_vec variant for these dtypes */
    cl_kernel pack;   /* matmul_vec: pack_b, B into panels of float in scratch first */
    size_t panel;     /* matmul_vec: columns of a B panel (vec_nv * vec_width); else 0 */
    size_t local[3], global[3];
    size_t scratch_floats; /* floats of scratch the enqueue needs at most (0: none) */
    /* ... anything else the enqueue needs (k parts under a loop limit, batch parts) */
    size_t k_step;
} clattn__matmul_plan;

clattn_status clattn__matmul_prepare(clattn_ctx *ctx, const clattn__matmul_shape *shape,
                                     clattn__matmul_plan *plan);
clattn_status clattn__matmul_enqueue(clattn_chain *chain, const clattn__matmul_plan *plan,
                                     const clattn__view *a, const clattn__view *b,
                                     const clattn__view *bias, const clattn__view *c, float alpha,
                                     float beta, clattn__scratch scratch);

/* ---- the score rule (kernels/score.cl; shared by softmax and flash) ------------------------
 * s_ij = cap(scale * (q_i . k_j)) + float mask[b,h,i,j] (cap(x) = softcap * tanh(x / softcap)
 * when softcap > 0); -inf where a U8 mask is 0, where key_padding[b, j] != 0, or outside the
 * row's key band: j >= n_b (n_b = kv_len[b] clamped to [0, seq_k] with has_kv_len, else
 * seq_k), j > i + diag_b + band_upper (band_upper >= 0), j < i + diag_b - band_lower
 * (band_lower >= 0), diag_b = band_diag + (band_diag_kv ? kv_len[b] : 0);
 * softmax or relu normalisation (softmax with attention sinks: one logit per query head joins
 * each row's denominator, has_sinks); a row with nothing left gives zeros. */
typedef struct clattn__score_shape {
    size_t batch, heads, seq_q, seq_k;
    size_t kv_group; /* grouped-query attention: query head h reads k/v head h / kv_group (k and
                      * v have heads / kv_group heads); 0 or 1: a k/v head per query head */
    float scale;     /* resolved: never NAN (FP8 keys: times their k_scale) */
    float v_scale;   /* FP8 values' per-tensor scale, the fused kernels' (0 or 1: none) */
    float softcap;   /* 0: off */
    clattn_norm norm;
    bool has_kv_len; /* I32 key counts per batch (clattn__score_masks.kv_len) */
    bool has_alibi;  /* F32 ALiBi slopes per (batch, head) (clattn__score_masks.alibi) */
    bool has_sinks;  /* F32 attention sinks per query head (clattn__score_masks.sinks) */
    bool kv_paged;   /* k and v in pages through a block table (clattn__score_masks.paging;
                      * the fused kernels only: KV_PAGED) */
    /* Packed variable-length batches (clattn__score_masks.varlen; the fused kernels only:
     * VARLEN): batch b's rows and keys are spans of total_q packed query rows and total_k
     * packed keys; seq_q and seq_k are the longest a sequence may have (max_seqlen_q, _k). */
    bool varlen;
    size_t total_q, total_k;
    long long band_diag;
    bool band_diag_kv;
    long long band_upper, band_lower; /* < 0: that side unbounded (causal: upper 0) */
    bool want_scores; /* unfused: score_copy writes the scores before normalisation */
    bool softmax_f64; /* unfused: normalise in double (softmax_rows_f64; cl_khr_fp64) */
    int scores_mode;  /* 0 scale * q.k, 1 capped, 2 the score rule's s (clattn_scores) */
    bool has_mask;
    clattn_dtype mask_dtype; /* F32, F16, BF16 (added) or U8 (boolean keep) */
    bool has_key_padding;    /* U8 (batch, seq_k) */
    /* Additive attention's score (q and k being the projections P1, P2): the raw score of
     * (i, j) is sum_c w[h, c] tanh(q_i[c] + k_j[c]) instead of q_i . k_j
     * (clattn__score_masks.additive_w; fused: flash.cl's ADDITIVE variant). */
    bool additive;
    /* Dropout after normalisation (score.cl's SCORE_DROPOUT): on when dropout_p > 0; the
     * Philox key, the stream of (batch 0, head 0), the keep threshold floor(p * 2^32) and the
     * kept weights' scale 1 / (1 - p) (clattn__dropout_fields). */
    bool dropout;
    uint64_t dropout_seed, dropout_offset;
    uint32_t dropout_threshold;
    float dropout_scale;
    /* User score functions (score.cl's FLEX_*; host/attn/flex.c): flex_id, the context's
     * registered source (flex.c's flex_register; 0: none) built into every program of the
     * plan; which functions it defines; whether a block mask and the tile counter are on
     * (clattn__score_masks.flex). */
    int flex_id;
    bool flex_score, flex_mask, flex_grad, flex_blocks, flex_count;
    /* A KV cache's decode step in one launch (clattn_kv_cache_decode; flash_cpu.cl's KV_STEP):
     * the fused kernel built to take the step's new key and value too (clattn__score_masks.step) */
    bool kv_step;
} clattn__score_shape;

/* Dropout's threshold and scale for probability p (0 < p <= 1; score.cl's rule). */
void clattn__dropout_fields(double p, uint32_t *threshold, float *scale);

/* Views of the masks at execution: mask dims broadcast to (batch, heads, seq_q, seq_k) with
 * stride 0 on broadcast dims; key_padding as a view with dims (1, 1, batch, seq_k); kv_len as
 * a view with dims (1, 1, 1, batch). */
typedef struct clattn__kv_step {
    bool on;
    clattn__view k_new, v_new;
    cl_mem lengths;
    size_t keys;
} clattn__kv_step;

typedef struct clattn__score_masks {
    clattn__view mask, key_padding, kv_len;
    clattn__view alibi;      /* dims (1, 1, batch, heads), strides 0 on broadcast dims */
    clattn__view sinks;      /* dims (1, 1, heads, seq_q): strides (per head, per row: 0 but
                              * where a decode group's query heads are rows) */
    clattn__view additive_w; /* score.additive: w, F32 (1, 1, heads, da) */
    /* score.kv_paged: the block table, I32 (1, 1, batch, blocks), and the pages: k and v are
     * then views (batch, kv_heads, blocks * page_size, d) with batch stride 0 and the slot
     * stride as their key stride; page strides k_page, v_page; num_pages pages in the pool. */
    struct {
        clattn__view block_table;
        size_t page_size, num_pages, k_page, v_page;
    } paging;
    /* score.varlen: the (batch + 1) I32 offsets of the sequences' query rows and keys */
    struct {
        cl_mem cu_q, cu_k;
        size_t q_offset, k_offset;
    } varlen;
    /* score.flex_id: the flex arena (the auxiliary tensors, the block mask and the tile
     * counter, copied in by the plan; byte offsets in it) and the block mask's geometry */
    struct {
        cl_mem arena;
        size_t arena_offset; /* bytes: where the arena starts in its buffer */
        size_t aux[4], blocks, count;
        size_t bm_s0, bm_s1, bm_s2; /* bytes per batch, head (0: broadcast), query block */
        size_t block_q, block_k;
    } flex;
    /* A decode step (on: the flash plan's kv_step): the new key and value rows (batch,
     * kv_heads, 1, d) in q's dtype, written into the cache's slot `keys` (k and v being the
     * cache), and the cache's key counts (I32 (batch), unit stride) set to keys + 1. */
    clattn__kv_step step;
} clattn__score_masks;

/* Whether the band has a diagonal edge (causal or a sliding window). */
static inline bool clattn__band_diagonal(const clattn__score_shape *score)
{
    return score->band_upper >= 0 || score->band_lower >= 0;
}

/* The buffers every kernel applying the score rule takes (mask, key_padding, then score.cl's
 * SCORE_BUFFERS: kv_len, alibi, sinks); an absent one is `fallback` (any valid buffer: the kernel
 * never reads it without its flag). */
typedef struct clattn__score_buffers {
    cl_mem mask, key_padding, kv_len, alibi, sinks, flex;
} clattn__score_buffers;

/* The score rule's operands (params.h's clattn_score_params, the head of the flash and softmax
 * structs) and the buffers that go with them, from the score shape and masks (ops/score.c: the
 * one place the host writes them). */
void clattn__score_params(const clattn__score_shape *score, const clattn__score_masks *masks,
                          cl_mem fallback, clattn_score_params *p, clattn__score_buffers *buffers);

/* The kernel families that apply the score rule, for clattn__score_defines. */
typedef enum clattn__score_family {
    CLATTN__FAMILY_SOFTMAX = 1u << 0,   /* softmax.cl */
    CLATTN__FAMILY_FLASH = 1u << 1,     /* flash.cl */
    CLATTN__FAMILY_FLASH_GPU = 1u << 2, /* flash_gpu.cl */
    CLATTN__FAMILY_FLASH_CPU = 1u << 3, /* flash_cpu.cl */
    CLATTN__FAMILY_ALL = 15u
} clattn__score_family;

/* The score rule's compile-time switches for `family` (a clattn__score_family bit, as a
 * clattn_family's score_family) as definitions (MASK_DTYPE=2, SCORE_MASK=1, ...) in out (room
 * for CLATTN_DEFINES_MAX); returns their count. From the one table in ops/score.c: a switch a
 * family does not compile in is a kernel argument there (params.h), so one program serves
 * every value. */
size_t clattn__score_defines(const clattn__score_shape *score, unsigned family, clattn_define *out);

/* ---- softmax rows (ops/softmax.c, kernels/softmax.cl) --------------------------------------
 * out[b,h,i,:] = normalise(score rule applied to raw[b,h,i,:]) where raw holds q.k dot products
 * (F32); raw and out are (batch, heads, seq_q, seq_k) views (strides[3] == 1), possibly the
 * same buffer (in place). */
typedef struct clattn__softmax_plan {
    clattn__score_shape score;
    cl_kernel kernel; /* softmax_rows: a work-group per row, or (tuning softmax_rows > 0) a
                       * work-item per row in float16 vectors */
    size_t rows;      /* batch * heads * seq_q */
    size_t local, global;
    cl_kernel copy; /* score_copy, when score.want_scores */
    size_t copy_local, copy_global;
} clattn__softmax_plan;

clattn_status clattn__softmax_prepare(clattn_ctx *ctx, const clattn__score_shape *score,
                                      clattn__softmax_plan *plan);
clattn_status clattn__softmax_enqueue(clattn_chain *chain, const clattn__softmax_plan *plan,
                                      const clattn__view *raw, const clattn__view *out,
                                      const clattn__score_masks *masks);
/* dst (batch, heads, seq_q, seq_k) F32, any strides = the scores of raw before normalisation,
 * as score.scores_mode says (softmax.cl's score_copy). */
clattn_status clattn__score_copy_enqueue(clattn_chain *chain, const clattn__softmax_plan *plan,
                                         const clattn__view *raw, const clattn__view *dst,
                                         const clattn__score_masks *masks);

/* ---- fused attention (ops/flash.c, kernels/flash.cl; CPUs: kernels/flash_cpu.cl) ----------
 * q (batch, heads, seq_q, dk), k (batch, kv_heads, seq_k, dk), v (batch, kv_heads, seq_k, dv)
 * (kv_heads = heads / score.kv_group), out (batch, heads, seq_q, dv): any strides; lse (batch,
 * heads, seq_q) F32, optional. */
typedef struct clattn__flash_shape {
    clattn__score_shape score;
    size_t head_dim_qk, head_dim_v;
    clattn_dtype q_dtype, k_dtype, v_dtype, out_dtype;
    bool has_lse;
    const clattn_tuning *tuning; /* the problem's (clattn__tuning_for), alive as long as the plan */
} clattn__flash_shape;

typedef struct clattn__flash_plan {
    clattn__flash_shape shape;
    cl_kernel kernel;
    bool cpu;              /* kernel is flash_cpu.cl's (tuning flash_cpu), else flash.cl's */
    unsigned block_q;      /* query rows per work-group */
    unsigned group_items;  /* work-items per work-group (flash.cl, flash_gpu.cl) */
    size_t part_keys;      /* keys per launch (loop-limited devices), else seq_k */
    size_t scratch_floats; /* (batch*heads*seq_q) when keys are split and no lse is wanted;
                            * decode splits: splits * (rows * dv + rows) */
    unsigned key_tile;     /* keys per tile of the kernel: parts and splits are whole tiles */
    unsigned tile_rows;    /* query rows of a tile (a block mask's verdicts, counted tiles) */
    /* Decode splits (few query rows against many keys, too few work-groups for the device):
     * `splits` work-groups per row block attend split_keys keys each into scratch, partial
     * outputs and log-sum-exps, which `merge` (heads.cl's flash_merge) combines. 1: none. */
    unsigned splits;
    size_t split_keys;
    cl_kernel merge;
    size_t merge_local, merge_global;
    bool kv_step;     /* the kernel takes a decode step (score.kv_step on flash_cpu.cl) */
    char variant[80]; /* the kernel and its geometry, for clattn_plan_info */
    char passed[96];  /* "" or why the tuning's preferred variant does not run this shape */
} clattn__flash_plan;

/* Self-validation (ops/probe.c; core/validate.h): whether a prepared plan's kernels may be
 * used on this device; CLATTN_ERR_UNTRUSTED (or the build's or enqueue's status) if not, after
 * trying their -cl-opt-disable builds, which then replace them in the plan. */
struct clattn__flash_bwd_plan;
clattn_status clattn__flash_trust(clattn_ctx *ctx, struct clattn__flash_plan *plan);
clattn_status clattn__softmax_trust(clattn_ctx *ctx, struct clattn__softmax_plan *plan);
clattn_status clattn__matmul_trust(clattn_ctx *ctx, struct clattn__matmul_plan *plan);
clattn_status clattn__flash_bwd_trust(clattn_ctx *ctx, struct clattn__flash_bwd_plan *plan);
struct clattn__elementwise_plan;
struct clattn__mean_heads_plan;
clattn_status clattn__copy_trust(clattn_ctx *ctx, struct clattn__elementwise_plan *plan,
                                 clattn_dtype src, clattn_dtype dst);
clattn_status clattn__mean_heads_trust(clattn_ctx *ctx, struct clattn__mean_heads_plan *plan);
struct clattn__rope_plan;
struct clattn__additive_plan;
clattn_status clattn__posenc_trust(clattn_ctx *ctx, struct clattn__elementwise_plan *plan,
                                   clattn_dtype x, clattn_dtype out, clattn_dtype table);
clattn_status clattn__additive_trust(clattn_ctx *ctx, struct clattn__additive_plan *plan);
clattn_status clattn__rope_trust(clattn_ctx *ctx, struct clattn__rope_plan *plan, clattn_dtype x,
                                 clattn_dtype out, clattn_dtype cache);

/* The fused kernels' largest head size (d_qk and d_v alike): 576 since 0.12, DeepSeek's
 * absorbed multi-head latent attention (512 latent + 64 rotary columns; d_v 512). */
#define CLATTN__FLASH_MAX_HEAD_DIM 576
/* Whether the fused kernel takes these head sizes. */
bool clattn__flash_supports(size_t head_dim_qk, size_t head_dim_v);
clattn_status clattn__flash_prepare(clattn_ctx *ctx, const clattn__flash_shape *shape,
                                    clattn__flash_plan *plan);
/* The cooperative GPU variant (ops/flash_gpu.c, kernels/flash_gpu.cl), where the tuning asks
 * for it (flash_gpu=1) and it fits the device: sets plan->kernel, block_q, group_items and
 * part_keys; leaves plan->kernel NULL (and succeeds) where it does not apply. It takes
 * flash.cl's arguments, so clattn__flash_enqueue launches either. */
/* Notes in plan->passed why the tuning's preferred variant does not run the shape (printf
 * format); returns CLATTN_SUCCESS: the caller goes on with the next variant. */
clattn_status clattn__flash_pass(clattn__flash_plan *plan, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
clattn_status clattn__flash_gpu_prepare(clattn_ctx *ctx, const clattn__flash_shape *shape,
                                        clattn__flash_plan *plan);
clattn_status clattn__flash_enqueue(clattn_chain *chain, const clattn__flash_plan *plan,
                                    const clattn__view *q, const clattn__view *k,
                                    const clattn__view *v, const clattn__view *out,
                                    const clattn__view *lse, const clattn__score_masks *masks,
                                    clattn__scratch scratch);

/* ---- additive scores (ops/additive.c, kernels/additive.cl) ----------------------------------
 * raw[b, h, i, j] = sum_c w[h, c] tanh(p1[b, h, i, c] + p2[b, h, j, c]), c < dim: p1 (batch,
 * heads, seq_q, dim) and p2 (batch, heads, seq_k, dim) F32 views (strides[3] == 1), w a
 * (1, 1, heads, dim) F32 view, raw a (batch, heads, seq_q, seq_k) F32 view (strides[3] == 1).
 * Tiles of the scores per work-group; the (seq_q, seq_k, dim) sums are never stored. */
typedef struct clattn__additive_plan {
    size_t batch, heads, seq_q, seq_k, dim;
    cl_kernel kernel;
    unsigned tile; /* TILE x TILE scores per work-group */
    size_t local[3], global[3];
} clattn__additive_plan;

clattn_status clattn__additive_prepare(clattn_ctx *ctx, size_t batch, size_t heads, size_t seq_q,
                                       size_t seq_k, size_t dim, clattn__additive_plan *plan);
clattn_status clattn__additive_enqueue(clattn_chain *chain, const clattn__additive_plan *plan,
                                       const clattn__view *p1, const clattn__view *p2,
                                       const clattn__view *w, const clattn__view *raw);

/* ---- mean over heads (ops/heads.c, kernels/heads.cl) ----------------------------------------
 * dst[b, i, j] = mean_h src[b, h, i, j]; src a (batch, heads, seq_q, seq_k) F32 view,
 * dst a (1, batch, seq_q, seq_k) F32 view. */
typedef struct clattn__mean_heads_plan {
    size_t batch, heads, seq_q, seq_k;
    cl_kernel kernel;
    size_t local, global;
} clattn__mean_heads_plan;

clattn_status clattn__mean_heads_prepare(clattn_ctx *ctx, size_t batch, size_t heads, size_t seq_q,
                                         size_t seq_k, clattn__mean_heads_plan *plan);
clattn_status clattn__mean_heads_enqueue(clattn_chain *chain, const clattn__mean_heads_plan *plan,
                                         const clattn__view *src, const clattn__view *dst);

/* ---- one work-item per element (ops/heads.c) -------------------------------------------------
 * A kernel over a 4-d box of `dims`, one work-item per element in groups of the tuning's
 * heads_wg (copy4d, posenc_add). */
typedef struct clattn__elementwise_plan {
    size_t dims[4];
    cl_kernel kernel;
    size_t local, global;
    /* copy4d_vec4 (F32 to F32, dims[3] a multiple of 4): 4 elements a work-item, launched
     * where both views' last dimensions are contiguous; NULL where it does not apply */
    cl_kernel vec4;
    size_t vec4_global;
} clattn__elementwise_plan;

/* The plan's geometry and kernel `name` of `family` built with its switches `values`; fails
 * naming `name` when the element count overflows. */
clattn_status clattn__elementwise_prepare(clattn_ctx *ctx, const size_t dims[4],
                                          const clattn_family *family, const char *name,
                                          const void *values, clattn__elementwise_plan *plan);

/* ---- positional encodings (ops/posenc.c, kernels/posenc.cl) --------------------------------
 * out[a, b, p, i] = x[a, b, p, i] (when x is bound) + PE(start + p, i) over a box of dims
 * (a, b, p, i): the sinusoid from `freq` (dim / 2 rounded up float pairs hi + lo = w_k) or,
 * when a table is bound, table[start + p, i] (a view with strides[2] rows, strides[3] cols). */
typedef clattn__elementwise_plan clattn__posenc_plan;

clattn_status clattn__posenc_prepare(clattn_ctx *ctx, const size_t dims[4], clattn_dtype x_dtype,
                                     clattn_dtype out_dtype, clattn_dtype table_dtype,
                                     clattn__posenc_plan *plan);
clattn_status clattn__posenc_enqueue(clattn_chain *chain, const clattn__posenc_plan *plan,
                                     const clattn__view *x, const clattn__view *out,
                                     const clattn__view *table, cl_mem freq, size_t start);

/* ---- rotary position embeddings (ops/rope.c, kernels/rope.cl) ------------------------------
 * out = x with the first rot columns of each row (b, h, s) rotated pair by pair (pairs: (2j,
 * 2j + 1), else (j, j + rot / 2)) by t_j at the row's position (position_ids[b, s] when bound,
 * else start + s): t_j from `freq` (cache_mode 0), or cos/sin caches by position (1: (rows,
 * rot / 2) views) or by row (2: (1, batch, seq, rot / 2) views); other columns copied. */
typedef struct clattn__rope_shape {
    size_t batch, heads, seq, dim, rot;
    bool pairs;
    int cache_mode; /* 0 computed, 1 by position, 2 by row */
    size_t start;
} clattn__rope_shape;

typedef struct clattn__rope_plan {
    clattn__rope_shape shape;
    cl_kernel kernel;
    size_t local, global, total; /* total: rows (a work-item each) */
} clattn__rope_plan;

typedef struct clattn__rope_io {
    clattn__view x, out;       /* (batch, heads, seq, dim) */
    clattn__view cos, sin;     /* mem NULL: computed angles */
    clattn__view position_ids; /* (1, 1, batch, seq) I32; mem NULL: start + s */
    cl_mem freq;               /* cache_mode 0: rot / 2 float pairs (hi, lo) */
} clattn__rope_io;

clattn_status clattn__rope_prepare(clattn_ctx *ctx, const clattn__rope_shape *shape,
                                   clattn_dtype x_dtype, clattn_dtype out_dtype,
                                   clattn_dtype cache_dtype, clattn__rope_plan *plan);
clattn_status clattn__rope_enqueue(clattn_chain *chain, const clattn__rope_plan *plan,
                                   const clattn__rope_io *io);

/* ---- strided copy (ops/heads.c, kernels/heads.cl's copy4d) ----------------------------------
 * dst[i] = src[i] over a box of `dims` (4 dims), any strides, converting src_dtype to
 * dst_dtype (floats) through float. */
typedef clattn__elementwise_plan clattn__copy_plan;

/* ---- the KV cache's append (ops/heads.c, kernels/heads.cl's kv_append) ---------------------
 * n new keys and values (views of (batch, kv_heads, n, dk / dv)) into the cache's views, and
 * the key counts (batch I32) set to `length`, in one launch. Paged (page_size > 0): the views'
 * strides are (page, head, slot, 1) and key `start + j` of batch b goes to page
 * table[b, (start + j) / page_size], slot (start + j) % page_size (an entry outside the pool
 * writes nothing). */
typedef struct clattn__append_plan {
    size_t batch, kv_heads, n, dk, dv;
    cl_kernel kernel;
    size_t local, global[2];
    float k_scale, v_scale; /* an FP8 cache's per-tensor scales (0: 1), set after prepare */
} clattn__append_plan;

typedef struct clattn__append_pages {
    cl_mem table; /* NULL: contiguous */
    size_t blocks, page_size, num_pages, start;
} clattn__append_pages;

clattn_status clattn__append_prepare(clattn_ctx *ctx, size_t batch, size_t kv_heads, size_t n,
                                     size_t dk, size_t dv, clattn_dtype k_dtype,
                                     clattn_dtype v_dtype, clattn_dtype cache_dtype,
                                     size_t page_size, clattn__append_plan *plan);
clattn_status clattn__append_enqueue(clattn_chain *chain, const clattn__append_plan *plan,
                                     const clattn__view *k, const clattn__view *v,
                                     const clattn__view *k_dst, const clattn__view *v_dst,
                                     cl_mem lengths, size_t length,
                                     const clattn__append_pages *pages);

/* ---- speculative decoding's commit (ops/commit.c, kernels/commit.cl) ------------------------
 * Moves each sequence's accepted draft rows down to follow its committed keys and advances the
 * key counts (the rules: kernels/commit.cl). Rows move as bytes: k_row / v_row bytes each. */
typedef struct clattn__commit_shape {
    size_t batch, heads, k_row, v_row; /* v_row 0: no value cache */
    size_t page_size, num_pages;       /* page_size 0: contiguous (batch, heads, capacity, d) */
    size_t capacity;                   /* keys a sequence can hold */
    size_t max_accepted, draft_len;
} clattn__commit_shape;

typedef struct clattn__commit_plan {
    clattn__commit_shape shape;
    cl_kernel kernel, lengths_kernel;
    size_t local, global[3], lengths_global;
} clattn__commit_plan;

/* A cache: its buffer, element offset and strides (pools: page, slot, head; else batch, head,
 * key), and its dtype's block (elements) and bytes per block (1 and the element size for
 * unblocked types). mem NULL: absent. */
typedef struct clattn__commit_cache {
    cl_mem mem;
    size_t offset, strides[3], block, elem_bytes;
} clattn__commit_cache;

/* The I32 operands: element offsets and strides. table NULL: contiguous. */
typedef struct clattn__commit_lists {
    cl_mem table, accepted, lengths;
    cl_ulong table_offset, table_s0, acc_offset, acc_s0, acc_s1, len_offset, len_s0;
} clattn__commit_lists;

clattn_status clattn__commit_prepare(clattn_ctx *ctx, const clattn__commit_shape *shape,
                                     clattn__commit_plan *plan);
clattn_status clattn__commit_enqueue(clattn_chain *chain, const clattn__commit_plan *plan,
                                     const clattn__commit_cache *k, const clattn__commit_cache *v,
                                     const clattn__commit_lists *lists);

clattn_status clattn__copy_prepare(clattn_ctx *ctx, const size_t dims[4], clattn_dtype src_dtype,
                                   clattn_dtype dst_dtype, clattn__copy_plan *plan);
clattn_status clattn__copy_enqueue(clattn_chain *chain, const clattn__copy_plan *plan,
                                   const clattn__view *src, const clattn__view *dst);
/* Into an FP8 dst: dst = encode(src * inv_scale) (clattn_quantize_scaled). */
clattn_status clattn__copy_enqueue_fp8(clattn_chain *chain, const clattn__copy_plan *plan,
                                       const clattn__view *src, const clattn__view *dst,
                                       float inv_scale);

/* ---- attention states merged by their log-sum-exp (ops/merge.c, kernels/merge.cl) ---------
 * o = (w_a o_a + w_b o_b) / (w_a + w_b), lse = m + log(w_a + w_b), w_x = exp(lse_x - m), per row
 * of a (d0, d1, d2) box (dims[0..2]) of dims[3] columns; o's views (i0, i1, i2, col), lse's
 * views with the rows in dims 1 .. 3. lse.mem NULL: not written. o may be o_a or o_b. */
typedef clattn__elementwise_plan clattn__merge_plan;
typedef struct clattn__merge_io {
    clattn__view o_a, lse_a, o_b, lse_b, o, lse;
} clattn__merge_io;
clattn_status clattn__merge_prepare(clattn_ctx *ctx, const size_t rows[3], size_t dv,
                                    clattn_dtype oa_dtype, clattn_dtype ob_dtype,
                                    clattn_dtype o_dtype, clattn__merge_plan *plan);
clattn_status clattn__merge_enqueue(clattn_chain *chain, const clattn__merge_plan *plan,
                                    const clattn__merge_io *io);

/* ---- attention backward (ops/flash_bwd.c, kernels/flash_bwd.cl) ----------------------------
 * dQ, dK, dV (and a float mask's, the sinks' gradients) of the score rule's attention from q,
 * k, v, out, dO and the forward's lse, recomputing the weights (no (seq_q x seq_k) matrix
 * unless the mask's gradient is wanted). Deterministic: no atomics. */
typedef struct clattn__flash_bwd_shape {
    clattn__score_shape score; /* kv_group: query heads per k/v head */
    size_t head_dim_qk, head_dim_v;
    clattn_dtype q_dtype, k_dtype, v_dtype, o_dtype, go_dtype, dq_dtype, dk_dtype, dv_dtype;
    bool want_dmask; /* a float mask's gradient (dmask_dtype), summed over its broadcast dims */
    clattn_dtype dmask_dtype;
    bool want_dsinks;            /* the sinks' gradient, F32 (heads) */
    const clattn_tuning *tuning; /* the problem's (clattn__tuning_for); NULL: the context's */
} clattn__flash_bwd_shape;

typedef struct clattn__flash_bwd_plan {
    clattn__flash_bwd_shape shape;
    bool cpu; /* the CPU variants (bwd_dkdv_cpu, bwd_dq_cpu: blocks of keys or rows) */
    unsigned cpu_nv, cpu_rows; /* their 16-key vectors per key block, rows per dQ work-item */
    unsigned cpu_rb;           /* their query rows a step (cpu_rows: a multiple of it) */
    bool gpu; /* dK/dV by bwd_dkdv_gpu (flash_bwd_gpu.cl: gpu_keys per work-group of
               * local_dkdv work-items, query rows in tiles of gpu_rows) */
    unsigned gpu_keys, gpu_rows;
    bool gpu_dq; /* dQ by bwd_dq_gpu: gpu_keys rows per work-group, keys in tiles of gpu_rows */
    unsigned dq_slots; /* > 0: dQ summed in bwd_dkdv_cpu, one slot per work-group (no bwd_dq) */
    cl_kernel zero;    /* bwd_zero: the slots cleared first */
    cl_kernel delta, dkdv, dq;                         /* the passes */
    cl_kernel sum_q, sum_k, sum_v, mask_reduce, sinks; /* the reductions (NULL: not used) */
    size_t local_delta, local_dkdv, local_dq;          /* work-group sizes */
    size_t rows_per_part, row_parts;                   /* dK/dV's walk over the rows, in launches */
    size_t keys_per_part, key_parts;                   /* dQ's walk over the keys */
    /* scratch float offsets: delta, dS, the parts' partial sums (dK's then dV's dv_part_at on,
     * dkdv_part_floats a part; dQ's, dq_part_floats a part) */
    size_t delta_at, dmask_at, dkdv_parts_at, dq_parts_at, dv_part_at;
    size_t dkdv_part_floats, dq_part_floats;
    size_t scratch_floats;
} clattn__flash_bwd_plan;

/* What the backward reads and writes: the 4-d views q, k, v, out, grad_out, dq, dk, dv
 * ((batch, heads or kv_heads, row, col)); lse (1, batch, heads, seq_q); dmask the mask's
 * gradient (its dims, 1 where broadcast); dsinks (1, 1, 1, heads); the score rule's masks. */
typedef struct clattn__flash_bwd_io {
    clattn__view q, k, v, out, grad_out, lse, dq, dk, dv, dmask, dsinks;
    clattn__score_masks masks;
} clattn__flash_bwd_io;

clattn_status clattn__flash_bwd_prepare(clattn_ctx *ctx, const clattn__flash_bwd_shape *shape,
                                        clattn__flash_bwd_plan *plan);
clattn_status clattn__flash_bwd_enqueue(clattn_chain *chain, const clattn__flash_bwd_plan *plan,
                                        const clattn__flash_bwd_io *io, clattn__scratch scratch);
/* flash_bwd.cl's switches (ops/flash_bwd.c's family; flash_bwd_gpu.c's family adds its tiles
 * to these). BWD_CPU compiles the CPU variants in (BWD_NV 16-key vectors per key block,
 * BWD_BQ query rows per bwd_dq_cpu work-item, BWD_RB rows a step). */
/* clang-format off */
#define CLATTN__FLASH_BWD_SWITCHES(X)                                                              \
    X(HEAD_DIM_QK, 0, NULL) X(HEAD_DIM_V, 0, NULL) X(Q_DTYPE, 0, NULL) X(K_DTYPE, 0, NULL)         \
    X(V_DTYPE, 0, NULL) X(O_DTYPE, 0, NULL) X(GO_DTYPE, 0, NULL) X(DQ_DTYPE, 0, NULL)              \
    X(DK_DTYPE, 0, NULL) X(DV_DTYPE, 0, NULL) X(BWD_CPU, CLATTN_SWITCH_OPTIONAL, NULL)             \
    X(BWD_NV, CLATTN_SWITCH_OPTIONAL, NULL) X(BWD_BQ, CLATTN_SWITCH_OPTIONAL, NULL)             \
    X(BWD_RB, CLATTN_SWITCH_OPTIONAL, NULL)
/* clang-format on */
/* flash_bwd.cl's kernels that take one switch, the dtype they store (bwd_sum_parts,
 * bwd_mask_reduce), or only the score rule's (bwd_unfused_rows; score NULL: none, for bwd_zero
 * and bwd_sinks); the unfused backward (attn/sdpa_backward_unfused.c) runs them too. */
clattn_status clattn__flash_bwd_out_kernel(clattn_ctx *ctx, const char *name, clattn_dtype dtype,
                                           cl_kernel *out);
clattn_status clattn__flash_bwd_plain_kernel(clattn_ctx *ctx, const char *name,
                                             const clattn__score_shape *score, cl_kernel *out);
/* The GPU dK/dV pass (ops/flash_bwd_gpu.c, kernels/flash_bwd_gpu.cl) built with flash_bwd.cl's
 * switches `base` (CLATTN__FLASH_BWD_SWITCHES' values) and score `defines`, and tiles that fit
 * the device: true when it replaced plan->dkdv (plan->gpu, gpu_keys, gpu_rows, local_dkdv set;
 * and plan->dq, local_dq, gpu_dq without a mask gradient or key parts); false where it does
 * not fit (or CLATTN_BWD_GPU=0), or on an error (*status). */
bool clattn__flash_bwd_gpu_prepare(clattn_ctx *ctx, const clattn__flash_bwd_shape *shape,
                                   const void *base, const clattn_define *defines, size_t count,
                                   clattn__flash_bwd_plan *plan, clattn_status *status);
/* Its reductions, for the unfused path: bwd_sum_parts (`parts` packed partial sums at float
 * `at` of the scratch, `stride` apart, into `out`), bwd_mask_reduce (the packed (B, H, Lq, Lk)
 * dS at `at` into a mask's gradient `out`), bwd_sinks (delta at `delta_at`, io's lse, sinks and
 * dsinks). */
clattn_status clattn__bwd_sum_parts(clattn_chain *chain, cl_kernel kernel, clattn__scratch scratch,
                                    size_t at, size_t stride, size_t parts,
                                    const clattn__view *out);
clattn_status clattn__bwd_mask_reduce(clattn_chain *chain, cl_kernel kernel,
                                      clattn__scratch scratch, size_t at,
                                      const clattn__score_shape *score, const clattn__view *out);
clattn_status clattn__bwd_sinks(clattn_chain *chain, cl_kernel kernel, clattn__scratch scratch,
                                size_t delta_at, const clattn__score_shape *score,
                                const clattn__flash_bwd_io *io);

#endif
