/*
 * score.cl: the score rule, the one place that says what an attention score is and how a row
 * of scores becomes weights. Prepended to every kernel source (after types.cl); softmax.cl
 * (scores from a matmul) and flash.cl (scores computed in place) both apply it through these
 * helpers only.
 *
 *   s_ij = cap(scale * (q_i . k_j)) + alibi_ij + mask[b,h,i,j]
 *                                                      float masks (F32, F16, BF16) are added
 *   cap(x) = softcap * tanh(x / softcap)               soft-capping (Gemma 2, ONNX Attention's
 *                                                      softcap), when softcap > 0; else x
 *   alibi_ij = -slope[b,h] * |i + n_b - seq_q - j|     ALiBi (Press et al.; BLOOM, MPT), when
 *                                                      slopes are given; else 0. n_b: the
 *                                                      batch's key count (bottom-right distance)
 *   s_ij = -inf  where a U8 mask[b,h,i,j] is 0        (U8: nonzero = the key takes part)
 *              or key_padding[b, j] != 0               (nonzero = ignore the key)
 *              or j is outside the row's key band      (key_band below: key counts per batch,
 *                                                      causal, sliding window)
 *   softmax: w_ij = exp(s_ij - m_i) / sum_j exp(s_ij - m_i),  m_i = max_j s_ij
 *   with a sink: w_ij = exp(s_ij - m_i) / (sum_j exp(s_ij - m_i) + exp(sink_h - m_i)),
 *            m_i = max(max_j s_ij, sink_h)      attention sinks (GPT-OSS): one learned logit
 *                                               per query head joins the denominator and
 *                                               takes no value (sink_fold, at a row's end)
 *   relu:    w_ij = relu(s_ij) / sum_j relu(s_ij)
 *   a row whose sum is 0 (every key masked, or relu of nothing positive) gives zeros, not NaN.
 *
 * Compile-time switches, from the host's one table (host/ops/score.c, clattn__score_defines):
 * MASK_DTYPE, the dtype code of the mask (types.cl; every family; it only matters in programs
 * launched with a mask); SCORE_MASK, SCORE_KPAD, SCORE_BAND (the band has a diagonal edge) and
 * SCORE_RELU, compiled into flash_cpu.cl; SCORE_MASK, SCORE_KPAD, SCORE_RELU and SCORE_SOFTCAP
 * (soft-capping on) into flash_gpu.cl. Elsewhere whether a mask or key padding is
 * present, the key band and the normalisation are kernel arguments (params.h): uniform
 * branches, so each program serves every combination and the variants stay few.
 *
 * The key band of row i of batch b: keys j with
 *   j < limit            limit = kv_len[b] clamped to [0, seq_k] (per-batch key counts, ONNX's
 *                        nonpad_kv_seqlen, a static KV cache's fill), or seq_k
 *   j <= p + upper       when upper >= 0 (causal: 0; a window's right size)
 *   j >= p - lower       when lower >= 0 (a window's left size)
 * where p = i + diag_b is the row's position among the keys and diag_b = diag (+ kv_len[b] when
 * diag_kv): TOP_LEFT 0, BOTTOM_RIGHT seq_k - seq_q (kv_len[b] - seq_q), ONNX's rule the past
 * length (kv_len[b] - seq_q). The host computes diag, upper and lower (ops.h). Both ends are
 * nondecreasing in i, so a block's first and last rows bound the keys the block needs.
 * Kernels take the key counts and the ALiBi slopes (F32, per batch and head; strides 0
 * broadcast) as the buffers SCORE_BUFFERS, and the band, offsets, strides and flags in their
 * parameter struct (params.h: clattn_score_params, from the CLATTN_SCORE_PARAMS list, the
 * head of the flash, softmax and backward families' structs).
 */
#ifndef CLATTN_SCORE_CL
#define CLATTN_SCORE_CL

#ifndef HEAD_DIM_QK
#define HEAD_DIM_QK 64 /* d_k, fixed per program variant */
#endif
#ifndef HEAD_DIM_V
#define HEAD_DIM_V 64 /* d_v */
#endif
#ifndef MASK_DTYPE
#define MASK_DTYPE 0 /* dtype code of the attention mask (F32 when there is none) */
#endif

/* ---- user score functions (FlexAttention's score_mod / mask_mod; host/attn/flex.c) ---------
 * FLEX_SCORE: the program holds the user's `float score_mod(float score, int b, int h,
 * int q_idx, int kv_idx)`, applied to every kept key's score after the built-in value
 * modifiers (soft-capping, ALiBi) and before a float mask's term; FLEX_GRAD: also its
 * derivative by the score, `score_mod_grad` (the backward's chain rule). FLEX_MASK: the user's
 * `mask_mod(int b, int h, int q_idx, int kv_idx)`, nonzero where the key is kept, joins the
 * keep test (band, padding, bool mask). q_idx is the row within its sequence, kv_idx the key's
 * logical index (a paged cache's or a packed sequence's own). The host puts the user's source,
 * after a prelude of its own, ahead of this file (flex_user_score_mod & co.: the user's functions
 * with the auxiliary tensors as extra pointer parameters, FLEX_AUX_FROM(arena, offsets) the
 * arguments that pass them from the flex arena). FLEX_BLOCKS: a block mask in the arena (per
 * (b, h, query block, key block): 0 empty, 1 partial, 2 full; blocks of flex_bq x flex_bk)
 * lets the fused kernels skip empty tiles and call mask_mod on partial ones only; FLEX_COUNT:
 * they count the tiles they visit (a uint at flex_count in the arena). */
#ifndef FLEX_SCORE
#define FLEX_SCORE 0
#endif
#ifndef FLEX_MASK
#define FLEX_MASK 0
#endif
#ifndef FLEX_GRAD
#define FLEX_GRAD 0
#endif
#ifndef FLEX_BLOCKS
#define FLEX_BLOCKS 0
#endif
#ifndef FLEX_COUNT
#define FLEX_COUNT 0
#endif
#define FLEX_USER (FLEX_SCORE || FLEX_MASK)

/* The row's open: what every score and keep test of one (batch, head) reads. Its key band
 * (see above), the head's ALiBi slope, and for user functions the batch, head and arena. */
typedef struct key_band {
    uint limit;  /* keys at and past it are dropped */
    long diag;   /* row i sits at key position i + diag */
    long upper;  /* j <= i + diag + upper; < 0: no bound */
    long lower;  /* j >= i + diag - lower; < 0: no bound */
    float slope; /* ALiBi: the head's slope; 0: none */
    long apos;   /* ALiBi: row i sits at key position i + apos (n_b - seq_q) */
#if FLEX_USER
    int b, h;                     /* the user functions' batch and head */
    __global const uchar *arena;  /* the flex arena: the auxiliary tensors */
    ulong4 aux;                   /* their byte offsets in it */
    int mask_on;                  /* 0 on a tile the block mask calls full: no mask_mod */
#endif
} key_band;

/* The buffers of the key counts, ALiBi slopes, sinks and the flex arena: kernel arguments of
 * every kernel that applies the rule (their offsets, strides and flags are in the family's
 * parameter struct). */
#define SCORE_BUFFERS_BASE                                                                        \
    __global const int *kv_len, __global const float *alibi, __global const float *sinks
#define SCORE_BUFFERS SCORE_BUFFERS_BASE, __global uchar *flex
/* The backward's kernels take SCORE_BUFFERS_BASE: their scratch is the plan's workspace,
 * which holds the arena (FLEX_FROM_SCRATCH declares `flex` from it). */
#define FLEX_FROM_SCRATCH __global uchar *flex = (__global uchar *)scratch;
/* The band of batch b and the slope of head h. */
#define BAND_OF(b, h)                                                                             \
    flex_band(make_band(kv_len, kv_len_offset + (b) * kv_len_s0, has_kv_len, seq_k, band_diag,    \
                        band_diag_kv, band_upper, band_lower, alibi,                              \
                        alibi_offset + (b) * alibi_s0 + (h) * alibi_s1, has_alibi, seq_q),        \
              (b), (h), flex, (ulong4)(flex_aux0, flex_aux1, flex_aux2, flex_aux3))

inline key_band make_band(__global const int *kv_len, const ulong index, const int has_kv_len,
                          const uint seq_k, const long diag, const int diag_kv, const long upper,
                          const long lower, __global const float *alibi, const ulong alibi_index,
                          const int has_alibi, const uint seq_q)
{
    key_band band;
    const long n = has_kv_len ? (long)kv_len[index] : (long)seq_k;
    band.limit = n <= 0 ? 0u : n >= (long)seq_k ? seq_k : (uint)n;
    band.diag = diag + (diag_kv ? n : 0);
    band.upper = upper;
    band.lower = lower;
    band.slope = has_alibi ? alibi[alibi_index] : 0.0f;
    band.apos = (long)band.limit - (long)seq_q;
    return band;
}

/* The user functions' batch, head and arena on a band (nothing without FLEX_USER). */
inline key_band flex_band(key_band band, const ulong b, const ulong h, __global uchar *arena,
                          const ulong4 aux)
{
#if FLEX_USER
    band.b = (int)b;
    band.h = (int)h;
    band.arena = arena;
    band.aux = aux;
    band.mask_on = 1;
#endif
    return band;
}

/* The band for one tile of the block mask's verdict `state` (FLEX_TILE): mask_mod off on a
 * full tile. */
inline key_band flex_tile_band(key_band band, const uint state)
{
#if FLEX_USER
    band.mask_on = state != 2u;
#endif
    return band;
}

/* SCORE's user step: score_mod on a kept key's score (identity without FLEX_SCORE). */
inline float flex_score(const key_band band, const float s, const uint row, const uint key)
{
#if FLEX_SCORE
    return flex_user_score_mod(s, band.b, band.h, (int)row, (int)key
                               FLEX_AUX_FROM(band.arena, band.aux));
#else
    return s;
#endif
}

/* score_mod's derivative by its score at s (1 without FLEX_SCORE). */
inline float flex_grad(const key_band band, const float s, const uint row, const uint key)
{
#if FLEX_SCORE && FLEX_GRAD
    return flex_user_score_mod_grad(s, band.b, band.h, (int)row, (int)key
                                    FLEX_AUX_FROM(band.arena, band.aux));
#else
    return 1.0f;
#endif
}

/* KEEP's user step: whether mask_mod keeps the key (true without FLEX_MASK). */
inline bool flex_keep(const key_band band, const uint row, const uint key)
{
#if FLEX_MASK
    return !band.mask_on || flex_user_mask_mod(band.b, band.h, (int)row, (int)key
                                               FLEX_AUX_FROM(band.arena, band.aux)) != 0;
#else
    return true;
#endif
}

/* score_mod on 16 keys key0 .. key0 + 15 of one row, a lane at a time. */
inline float16 flex_score16(const key_band band, float16 s, const uint row, const uint key0)
{
#if FLEX_SCORE
    float lanes[16];
    vstore16(s, 0, lanes);
    for (uint j = 0; j < 16 && key0 + j < band.limit; ++j) /* (keys past it: never kept) */
        lanes[j] = flex_score(band, lanes[j], row, key0 + j);
    s = vload16(0, lanes);
#endif
    return s;
}

/* -inf where mask_mod drops one of the 16 keys key0 .. key0 + 15 of one row. */
inline float16 flex_keep16(const key_band band, float16 s, const uint row, const uint key0)
{
#if FLEX_MASK
    float lanes[16];
    vstore16(s, 0, lanes);
    for (uint j = 0; j < 16; ++j)
        lanes[j] = key0 + j < band.limit && flex_keep(band, row, key0 + j) ? lanes[j] : NEG_INF;
    s = vload16(0, lanes);
#endif
    return s;
}

/* The block mask's verdict on a tile of rows row0 .. row1 and keys key0 .. key1 - 1 of
 * (b, h) (FLEX_BLOCKS; the kernel's locals flex, flex_bm* and its block sizes): 0 when every
 * block it touches is empty (the tile is skipped), 2 when every one is full (mask_mod is not
 * called), else 1. Without a block mask: 1 (mask_mod on every score). */
#define FLEX_EMPTY 0u
#define FLEX_PARTIAL 1u
#define FLEX_FULL 2u
inline uint flex_tile(__global const uchar *arena, const ulong at, const ulong s0,
                      const ulong s1, const ulong s2, const uint bq, const uint bk, const ulong b,
                      const ulong h, const uint row0, const uint row1, const uint key0,
                      const uint key1)
{
    bool any = false, all_full = true;
    const __global uchar *blocks = arena + at + b * s0 + h * s1;
    for (uint qb = row0 / bq; qb <= row1 / bq; ++qb)
        for (uint kb = key0 / bk; kb <= (key1 - 1) / bk; ++kb) {
            const uchar state = blocks[qb * s2 + kb];
            any = any || state != FLEX_EMPTY;
            all_full = all_full && state == FLEX_FULL;
        }
    return !any ? FLEX_EMPTY : all_full ? FLEX_FULL : FLEX_PARTIAL;
}
#if FLEX_BLOCKS
#define FLEX_TILE(b, h, row0, row1, key0, key1)                                                   \
    flex_tile(flex, flex_bm, flex_bm_s0, flex_bm_s1, flex_bm_s2, flex_bq, flex_bk, (b), (h),      \
              (row0), (row1), (key0), (key1))
#else
#define FLEX_TILE(b, h, row0, row1, key0, key1) FLEX_PARTIAL
#endif

/* ALiBi's bias of key `key` in row `row`: -slope * |row + apos - key| (0 without slopes). The
 * distance is exact in float up to 2^24. The float16 form for 16 keys key0 .. key0 + 15. */
inline float alibi_bias(const key_band band, const uint row, const uint key)
{
    if (band.slope == 0.0f)
        return 0.0f;
    return -band.slope * fabs((float)((long)row + band.apos - (long)key));
}

inline float16 alibi_bias16(const key_band band, const uint row, const uint key0)
{
    const float16 lane = (float16)(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f,
                                   10.0f, 11.0f, 12.0f, 13.0f, 14.0f, 15.0f);
    const float16 distance = (float16)((float)((long)row + band.apos - (long)key0)) - lane;
    return -band.slope * fabs(distance);
}

/* Keys band_begin(row) .. band_end(row) - 1 are in the row's band (empty when begin >= end). */
inline uint band_end(const key_band band, const uint row)
{
    if (band.upper < 0)
        return band.limit;
    const long end = (long)row + band.diag + band.upper + 1;
    return end <= 0 ? 0u : end >= (long)band.limit ? band.limit : (uint)end;
}

inline uint band_begin(const key_band band, const uint row)
{
    if (band.lower < 0)
        return 0u;
    const long begin = (long)row + band.diag - band.lower;
    return begin <= 0 ? 0u : begin >= (long)band.limit ? band.limit : (uint)begin;
}

/* ---- paged keys (KV_PAGED: a paged KV cache, FlashAttention's flash_attn_with_kvcache layout)
 * Key j of batch b lies in page block_table[b, j / page_size] at slot j % page_size: its row
 * starts page * page_stride + slot * slot_stride elements into K (or V), whose batch stride is
 * 0 (the pages are shared by the batches). A batch's keys end at its first block index
 * outside 0 .. num_pages - 1 (paged_limit lowers the band's limit there), so no page outside
 * the pool is ever read. bt_row: the element of block_table[b, 0]. */
#ifndef KV_PAGED
#define KV_PAGED 0
#endif

inline ulong paged_key_at(__global const int *block_table, const ulong bt_row, const ulong bt_s1,
                          const uint page_size, const uint key, const ulong slot_stride,
                          const ulong page_stride)
{
    const uint block = key / page_size, slot = key - block * page_size;
    return (ulong)(uint)block_table[bt_row + block * bt_s1] * page_stride + slot * slot_stride;
}

/* The key count `limit` lowered to the first key of the first block outside the pool. */
inline uint paged_limit(__global const int *block_table, const ulong bt_row, const ulong bt_s1,
                        const uint page_size, const uint num_pages, const uint limit)
{
    const uint blocks = limit / page_size + (limit % page_size != 0);
    for (uint block = 0; block < blocks; ++block) {
        const int page = block_table[bt_row + block * bt_s1];
        if (page < 0 || (uint)page >= num_pages)
            return block * page_size;
    }
    return limit;
}

/* The band with its limit lowered to the pool's end (paged_limit). */
inline key_band paged_band(key_band band, __global const int *block_table, const ulong bt_row,
                           const ulong bt_s1, const uint page_size, const uint num_pages)
{
    band.limit = paged_limit(block_table, bt_row, bt_s1, page_size, num_pages, band.limit);
    return band;
}

/* The element offset of key `key`'s row in K or V: KEY_AT(key, k_s2, k_page) (the kernel's
 * locals bt_row, bt_s1, page_size and its block_table argument); unpaged: key * row stride. */
#if KV_PAGED
#define KEY_AT(key, row_stride, page_stride)                                                      \
    paged_key_at(block_table, bt_row, bt_s1, page_size, (key), (row_stride), (page_stride))
#else
#define KEY_AT(key, row_stride, page_stride) ((ulong)(key) * (row_stride))
#endif

/* ---- a KV cache's decode step (KV_STEP: flash_cpu.cl, flash_gpu.cl; clattn_kv_cache_decode)
 * The new key and value rows (kn, vn: q's dtype, unit-less strides kn_s3, vn_s3) into the
 * cache at key step_keys (K, V: the k/v head's first key, as OPEN_GROUP_QKV leaves them;
 * KEY_AT: a paged cache's page from the block table), converted to the cache's dtype,
 * elements first, first + stride, .. (a work-group's items); the batch's key count set to
 * step_keys + 1 by query head 0's first item. The cache's buffers are the plan's k and v,
 * const to the attention, which never reads the slot written here (so the casts). */
#if defined(KV_STEP) && KV_STEP
/* The band without the new key (kv_step: the host gives seq_k = step_keys + 1 and no key
 * counts, so FUSED_BAND is the band after the step): the tiles' keys, the cached ones. */
inline key_band kv_step_cached(key_band whole, const uint kv_step, const uint step_keys)
{
    if (kv_step)
        whole.limit = min(whole.limit, step_keys);
    return whole;
}
#define STEP_CACHED_BAND(whole) kv_step_cached((whole), kv_step, step_keys)

inline void kv_step_store(__global const ELEM_T(K_DTYPE) *K, __global const ELEM_T(V_DTYPE) *V,
                          __global const ELEM_T(Q_DTYPE) *kn, __global const ELEM_T(Q_DTYPE) *vn,
                          __global const int *kv_len, __global const int *block_table,
                          const ulong bt_row, const clattn_flash_params params, const ulong b,
                          const ulong h, const uint first, const uint stride)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    __global ELEM_T(K_DTYPE) *kw = (__global ELEM_T(K_DTYPE) *)K;
    __global ELEM_T(V_DTYPE) *vw = (__global ELEM_T(V_DTYPE) *)V;
    const ulong k_at = KEY_AT(step_keys, k_s2, k_page), v_at = KEY_AT(step_keys, v_s2, v_page);
    for (uint d = first; d < HEAD_DIM_QK; d += stride)
        STORE(K_DTYPE, LOAD(Q_DTYPE, kn, d * kn_s3), kw, k_at + d * k_s3);
    for (uint d = first; d < HEAD_DIM_V; d += stride)
        STORE(V_DTYPE, LOAD(Q_DTYPE, vn, d * vn_s3), vw, v_at + d * v_s3);
    if (h == 0 && first == 0)
        ((__global int *)kv_len)[kv_len_offset + b * kv_len_s0] = (int)step_keys + 1;
}
#else
#define STEP_CACHED_BAND(whole) (whole)
#endif

/* ---- the row open of the fused forward kernels (flash.cl, flash_cpu.cl, flash_gpu.cl) ----
 * A work-group's rows first_row .. last_row of one (b, h) need the keys from its first row's
 * band begin to its last row's band end (both ends grow with the row, so the bounds are the
 * group's, uniform), cut to its launch's keys [key_begin, key_stop); key_first: the tile
 * (a multiple of `tile` from key_begin) that holds the first. FUSED_BAND(b, h, span): the
 * band of batch b, head h (score.cl's BAND_SPAN; with a paged cache, its limit lowered to the
 * first block outside the pool: the kernel's local bt_row, KEY_AT's, names its table row). */
typedef struct group_keys {
    uint last_row, key_first, key_end;
} group_keys;

inline group_keys open_group(const key_band band, const uint span_rows, const uint first_row,
                             const uint group_rows, const uint key_begin, const uint key_stop,
                             const uint tile)
{
    group_keys g;
    g.last_row = min(span_rows, first_row + group_rows) - 1;
    g.key_end = min(key_stop, band_end(band, g.last_row));
    const uint group_begin = band_begin(band, first_row);
    g.key_first = group_begin > key_begin ? key_begin + (group_begin - key_begin) / tile * tile
                                          : key_begin;
    return g;
}

/* Decode splits (split_keys > 0): global dimension 2 numbers the split; each takes its own
 * split_keys keys of the launch's part [part_begin, part_stop) and writes its own partial
 * output and log-sum-exp (o_split and lse_split elements on), which flash_merge (heads.cl)
 * combines. split_begin / split_stop: the keys of split `split` (the part's without splits). */
inline uint split_begin(const uint part_begin, const uint split_keys, const uint split)
{
    return split_keys ? part_begin + split * split_keys : part_begin;
}

inline uint split_stop(const uint part_stop, const uint split_keys, const uint begin)
{
    return split_keys ? min(part_stop, begin + split_keys) : part_stop;
}

/* Q, K and V advanced to batch b, query head h and its sequence's first row and key (a
 * fused kernel's locals and arguments; grouped-query: the shared k/v head h / kv_group;
 * ADVANCE: the block types' rows are whole blocks). */
#define OPEN_GROUP_QKV(b, h, span)                                                                \
    Q += q_offset + (b) * q_s0 + (h) * q_s1 + (span).q0 * q_s2;                                   \
    K = ADVANCE(K_DTYPE, K, k_offset + (b) * k_s0 + ((h) / kv_group) * k_s1 + (span).k0 * k_s2);  \
    V = ADVANCE(V_DTYPE, V, v_offset + (b) * v_s0 + ((h) / kv_group) * v_s1 + (span).k0 * v_s2);

/* The block mask's verdict on a tile (FLEX_TILE), counted as visited (FLEX_COUNT) by the
 * work-item that `counts` unless it is empty. */
inline uint flex_visit(const uint state, const bool counts, __global uchar *flex,
                       const ulong flex_count)
{
#if FLEX_COUNT
    if (counts && state != FLEX_EMPTY)
        atomic_inc((volatile __global uint *)(flex + flex_count));
#endif
    return state;
}
#define FLEX_VISIT(state, counts) flex_visit((state), (counts), flex, flex_count)

/* ---- packed variable-length batches (VARLEN: FlashAttention's varlen layout) ---------------
 * Sequence b's query rows are the packed rows cu_q[b] .. cu_q[b + 1] - 1 of Q, O and lse, its
 * keys the packed rows cu_k[b] .. cu_k[b + 1] - 1 of K and V: the views have batch stride 0
 * and the token stride as their row stride, so a kernel adds span.q0 (span.k0) row strides to
 * its bases and takes span.rows rows (span.keys keys) where a batch has seq_q (seq_k). Each
 * offset is clamped to 0 .. total, an end to at least its start, the rows to seq_q
 * (max_seqlen_q) and the keys to seq_k (max_seqlen_k): offsets that are not non-decreasing or
 * that pass the totals never reach outside the tensors (the host checks them where it holds
 * them: the CLI and the Python package). The band is the sequence's: its key count is
 * span.keys, and bottom-right (and ONNX's) diagonals are span.keys - span.rows. */
#ifndef VARLEN
#define VARLEN 0
#endif

typedef struct seq_span {
    uint q0, k0;     /* the sequence's first packed query row and key */
    uint rows, keys; /* its query rows and keys */
} seq_span;

inline uint packed_offset(__global const int *cu, const ulong b, const uint total)
{
    const int at = cu[b];
    return at <= 0 ? 0u : (uint)at >= total ? total : (uint)at;
}

inline seq_span varlen_span(__global const int *cu_q, __global const int *cu_k, const ulong b,
                            const uint total_q, const uint total_k, const uint seq_q,
                            const uint seq_k)
{
    seq_span span;
    span.q0 = packed_offset(cu_q, b, total_q);
    span.k0 = packed_offset(cu_k, b, total_k);
    const uint q_end = max(span.q0, packed_offset(cu_q, b + 1, total_q));
    const uint k_end = max(span.k0, packed_offset(cu_k, b + 1, total_k));
    span.rows = min(q_end - span.q0, seq_q);
    span.keys = min(k_end - span.k0, seq_k);
    return span;
}

inline seq_span whole_span(const uint seq_q, const uint seq_k)
{
    seq_span span = {0u, 0u, seq_q, seq_k};
    return span;
}

/* The band of batch b (BAND_OF) made the sequence's (VARLEN). */
inline key_band span_band(key_band band, const seq_span span, const long diag,
                          const int diag_kv, const uint seq_q)
{
    band.limit = span.keys;
    if (diag_kv) /* the host's diag is -seq_q: the sequence's is keys - rows */
        band.diag = diag + (long)seq_q + (long)span.keys - (long)span.rows;
    band.apos = (long)span.keys - (long)span.rows;
    return band;
}

/* SPAN_OF(b): batch b's rows and keys (the kernel's locals seq_q, seq_k, total_q, total_k,
 * cu_q_offset, cu_k_offset and its cu_seqlens_q, cu_seqlens_k arguments); BAND_SPAN(b, h,
 * span): its band. */
/* Packed queries over a paged cache (VARLEN and KV_PAGED: chunked prefill and mixed batches):
 * sequence b's rows are packed as above, its keys are its pages' first kv_len[b] keys (clamped
 * to 0 .. seq_k, the table's blocks * page_size), k0 = 0; no cu_seqlens_k. */
inline seq_span paged_varlen_span(__global const int *cu_q, __global const int *kv_len,
                                  const ulong b, const uint total_q, const uint seq_q,
                                  const uint seq_k)
{
    seq_span span;
    span.q0 = packed_offset(cu_q, b, total_q);
    const uint q_end = max(span.q0, packed_offset(cu_q, b + 1, total_q));
    span.rows = min(q_end - span.q0, seq_q);
    span.k0 = 0u;
    const int keys = kv_len[0];
    span.keys = keys <= 0 ? 0u : min((uint)keys, seq_k);
    return span;
}

/* PACKED_GRID (packed queries over a paged cache): global dimension 0 numbers row blocks of
 * all sequences, dimension 1 the heads; sequence b owns the groups from
 * packed_offset(cu_q, b) / rows + b on (strictly increasing in b, so found by bisection), at
 * least as many as its rows need and at most one more: a batch of one-row decodes and a long
 * chunk launches about total_q / rows + batch groups, not batch x the longest. The host
 * launches total_q / rows + batch of them (clattn_flash_params.packed_batch = batch). */
#define PACKED_GRID (VARLEN && KV_PAGED)
typedef struct packed_group {
    ulong b;        /* the group's sequence */
    uint first_row; /* its first row within the sequence */
} packed_group;

inline packed_group packed_group_of(__global const int *cu_q, const uint group, const uint batch,
                                    const uint total_q, const uint rows)
{
    uint lo = 0u, hi = batch; /* the last sequence whose first group is at or before `group` */
    while (hi - lo > 1u) {
        const uint mid = lo + (hi - lo) / 2u;
        if (packed_offset(cu_q, mid, total_q) / rows + mid <= group)
            lo = mid;
        else
            hi = mid;
    }
    packed_group g;
    g.b = lo;
    g.first_row = (group - min(group, packed_offset(cu_q, lo, total_q) / rows + lo)) * rows;
    return g;
}

/* OPEN_GROUP_ROWS(rows): the work-group's first_row, bh, b and h (a kernel's locals): from
 * the packed grid (PACKED_GRID), else row block get_group_id(0) of (batch * heads) index
 * bh_base + get_global_id(1). h as bh - b * heads, not bh % heads: a division and remainder
 * of the same operands become an LLVM `freeze`, which Oclgrind's --uninitialized checker
 * cannot run. */
#if PACKED_GRID
#define OPEN_GROUP_ROWS(rows)                                                                     \
    const packed_group group_at = packed_group_of(cu_seqlens_q + cu_q_offset, get_group_id(0),   \
                                                  packed_batch, total_q, (rows));                \
    const uint first_row = group_at.first_row;                                                    \
    const ulong b = group_at.b, h = bh_base + get_global_id(1), bh = b * heads + h;
#else
#define OPEN_GROUP_ROWS(rows)                                                                     \
    const uint first_row = get_group_id(0) * (rows);                                              \
    const ulong bh = bh_base + get_global_id(1);                                                  \
    const ulong b = bh / heads, h = bh - b * heads;
#endif

#if VARLEN && KV_PAGED
#define SPAN_OF(b)                                                                                \
    paged_varlen_span(cu_seqlens_q + cu_q_offset, kv_len + kv_len_offset + (b) * kv_len_s0, (b), \
                      total_q, seq_q, seq_k)
#define BAND_SPAN(b, h, span) span_band(BAND_OF(b, h), (span), band_diag, band_diag_kv, seq_q)
#elif VARLEN
#define SPAN_OF(b)                                                                                \
    varlen_span(cu_seqlens_q + cu_q_offset, cu_seqlens_k + cu_k_offset, (b), total_q, total_k,     \
                seq_q, seq_k)
#define BAND_SPAN(b, h, span) span_band(BAND_OF(b, h), (span), band_diag, band_diag_kv, seq_q)
#else
#define SPAN_OF(b) whole_span(seq_q, seq_k)
#define BAND_SPAN(b, h, span) BAND_OF(b, h)
#endif
#if KV_PAGED
#define FUSED_BAND(b, h, span)                                                                    \
    paged_band(BAND_SPAN(b, h, span), block_table, bt_row, bt_s1, page_size, num_pages)
/* The block table's row of batch b as the local bt_row (KEY_AT's and FUSED_BAND's). */
#define OPEN_PAGED_ROW(b) const ulong bt_row = bt_offset + (b) * bt_s0;
#else
#define FUSED_BAND(b, h, span) BAND_SPAN(b, h, span)
/* (no table: 0, for the kernels' steps that take bt_row and pass it to KEY_AT, unread) */
#define OPEN_PAGED_ROW(b) const ulong bt_row = 0;
#endif

/* Whether key padding drops the key at element `index` of the padding row. */
inline bool key_padded(const int has_key_padding, __global const uchar *key_padding,
                       const ulong index)
{
    return has_key_padding && key_padding[index] != 0;
}

/* The mask's contribution to a score: the float value added, or 0 / -inf for a U8 mask. */
inline float mask_term(__global const ELEM_T(MASK_DTYPE) *mask, const ulong index)
{
#if MASK_DTYPE == DTYPE_U8
    return mask[index] != 0 ? 0.0f : NEG_INF;
#else
    return LOAD(MASK_DTYPE, mask, index);
#endif
}

/* Whether the rule drops key `key` from a row: outside the row's band [key_begin, key_end)
 * (key_end is at most seq_k, so keys past seq_k are dropped too) or `padded`. */
inline bool key_masked(const uint key, const uint key_begin, const uint key_end,
                       const bool padded)
{
    return key < key_begin || key >= key_end || padded;
}

/* Soft-capping of a scaled dot product: softcap * tanh(x / softcap), before any mask (so that
 * masked keys stay masked), or x when softcap is 0 (off). The float16 form for the CPU kernels'
 * tiles. */
inline float soft_cap(const float x, const float softcap)
{
    return softcap > 0.0f ? softcap * tanh(x / softcap) : x;
}

inline float16 soft_cap16(const float16 x, const float softcap)
{
    return softcap * tanh(x / softcap); /* (as soft_cap: the same bits lane by lane) */
}

/* The scaled dot product plus the mask term at element mask_index of `mask` (when there is a
 * mask). Only for keys key_masked keeps: the mask is read nowhere else. */
inline float add_mask(const float scaled_dot, const int has_mask,
                      __global const ELEM_T(MASK_DTYPE) *mask, const ulong mask_index)
{
    return has_mask ? scaled_dot + mask_term(mask, mask_index) : scaled_dot;
}

/* The score of key `key` from the scaled dot product: -inf where key_masked, else add_mask. */
inline float masked_score(const float scaled_dot, const uint key, const uint key_begin,
                          const uint key_end, const bool padded, const int has_mask,
                          __global const ELEM_T(MASK_DTYPE) *mask, const ulong mask_index)
{
    if (key_masked(key, key_begin, key_end, padded))
        return NEG_INF;
    return add_mask(scaled_dot, has_mask, mask, mask_index);
}

/* ---- the rule, composed in one place: every kernel computes its scores through these ----
 * score_value: a kept key's value before the mask term: the scaled dot product soft-capped,
 * then ALiBi's bias (score_builtin), then the user's score_mod (the float16 form: 16 keys
 * key0 .. key0 + 15 of one row, uniform branches).
 * score_rule: one key's score: -inf where key_masked, else score_value plus the mask term.
 * The order (scale, cap, ALiBi, mask, band and padding, then normalisation) is written here
 * and nowhere else; a new modifier of the value goes into score_value(16), a new way to drop
 * keys into key_masked. */
inline float score_builtin(const float scaled_dot, const float softcap, const key_band band,
                           const uint row, const uint key)
{
    return soft_cap(scaled_dot, softcap) + alibi_bias(band, row, key);
}

inline float score_value(const float scaled_dot, const float softcap, const key_band band,
                         const uint row, const uint key)
{
    return flex_score(band, score_builtin(scaled_dot, softcap, band, row, key), row, key);
}

/* score_builtin on 16 keys: the built-in value modifiers before the user's score_mod. */
inline float16 score_builtin16(float16 scaled_dot, const float softcap, const key_band band,
                               const uint row, const uint key0)
{
    if (softcap > 0.0f)
        scaled_dot = soft_cap16(scaled_dot, softcap);
    if (band.slope != 0.0f)
        scaled_dot += alibi_bias16(band, row, key0);
    return scaled_dot;
}

inline float16 score_value16(const float16 scaled_dot, const float softcap, const key_band band,
                             const uint row, const uint key0)
{
    return flex_score16(band, score_builtin16(scaled_dot, softcap, band, row, key0), row, key0);
}

/* score_mod's derivative on 16 keys (1 without FLEX_GRAD); pre: score_builtin16's values. */
inline float16 flex_grad16(const key_band band, const float16 pre, const uint row,
                           const uint key0)
{
#if FLEX_SCORE && FLEX_GRAD
    float lanes[16];
    vstore16(pre, 0, lanes);
    for (uint j = 0; j < 16; ++j)
        lanes[j] = key0 + j < band.limit ? flex_grad(band, lanes[j], row, key0 + j) : 0.0f;
    return vload16(0, lanes);
#else
    return (float16)(1.0f);
#endif
}

inline float score_rule(const float scaled_dot, const float softcap, const key_band band,
                        const uint row, const uint key, const uint key_begin, const uint key_end,
                        const bool padded, const int has_mask,
                        __global const ELEM_T(MASK_DTYPE) *mask, const ulong mask_index)
{
    /* the keep test first: the user's functions see only keys inside the row's band */
    if (key_masked(key, key_begin, key_end, padded) || !flex_keep(band, row, key))
        return NEG_INF;
    return add_mask(score_value(scaled_dot, softcap, band, row, key), has_mask, mask, mask_index);
}

/* Attention sinks: the sink logit of row i of head h (SINK_OF(h, i); the rows of a decode
 * group's query heads have their own, through sinks_s1), or -inf without sinks: a sink of
 * -inf is no sink. Read where a row is finished, by the kernels that finish it. */
#define SINK_OF(h, i) (has_sinks ? sinks[sinks_offset + (h) * sinks_s0 + (i) * sinks_s1] : NEG_INF)

/* A finished softmax row with its sink folded in (sink_fold). */
typedef struct sunk_row {
    float max;    /* the max over the row's scores and the sink */
    float total;  /* the sum of exp(s - max) over the kept keys, plus exp(sink - max) */
    float factor; /* exp(the row's old max - max): what its unnormalised output is scaled by */
} sunk_row;

/* Folds a sink into a finished softmax row of max `row_max` whose kept keys sum to `total`
 * (of exp(s - row_max)). A row with no key left (row_max -inf) gets factor 0: its output is
 * zeros and its log-sum-exp the sink. A sink of -inf changes nothing (factor 1). Softmax only
 * (the host refuses sinks with relu). */
inline sunk_row sink_fold(const float sink, const float row_max, const float total)
{
    sunk_row r = {row_max, total, 1.0f};
    if (sink == NEG_INF)
        return r;
    r.max = fmax(row_max, sink);
    r.factor = row_max == NEG_INF ? 0.0f : exp(row_max - r.max);
    r.total = total * r.factor + exp(sink - r.max);
    return r;
}

/* ---- dropout (SCORE_DROPOUT: 1 in the programs of plans with dropout_p > 0) ---------------
 * After normalisation, the weight w_ij of query row i and key j of stream `stream` (the host's
 * dropout_offset + b * heads + h) becomes w_ij * dropout_scale where kept, 0 where not; the
 * row's normaliser and lse stay the undropped row's (FlashAttention's rule, so the backward
 * regenerates the same mask from lse). Kept: word j % 4 of Philox 4x32-10 (Salmon et al.,
 * "Parallel random numbers: as easy as 1, 2, 3", SC 2011) with key (seed's low, high words)
 * and counter (j / 4, i, stream's low, high words), as an unsigned integer, is at least
 * dropout_threshold (floor(p * 2^32)); dropout_scale = 1 / (1 - p), 0 when p = 1. Integer
 * arithmetic only, so every device draws the same mask. The locals dropout_seed,
 * dropout_offset, dropout_threshold, dropout_scale are the kernel's (params.h). */
#ifndef SCORE_DROPOUT
#define SCORE_DROPOUT 0
#endif
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* the key's Weyl increments */
#define PHILOX_W1 0xBB67AE85u

/* Ten Philox rounds on counters c0..c3 of vector type T (one block per lane) under the key
 * (seed's low, high words), in place. */
#define PHILOX_ROUNDS(T, c0, c1, c2, c3, seed)                                                    \
    {                                                                                             \
        uint k0_ = (uint)(seed), k1_ = (uint)((seed) >> 32);                                      \
        for (uint round_ = 0; round_ < 10; ++round_) {                                            \
            const T lo0_ = (T)(PHILOX_M0) * c0, hi0_ = mul_hi((T)(PHILOX_M0), c0);                \
            const T lo1_ = (T)(PHILOX_M1) * c2, hi1_ = mul_hi((T)(PHILOX_M1), c2);                \
            c0 = hi1_ ^ c1 ^ (T)(k0_);                                                            \
            c1 = lo1_;                                                                            \
            c2 = hi0_ ^ c3 ^ (T)(k1_);                                                            \
            c3 = lo0_;                                                                            \
            k0_ += PHILOX_W0;                                                                     \
            k1_ += PHILOX_W1;                                                                     \
        }                                                                                         \
    }

/* The dropout factor of one weight: scale where kept, else 0. */
inline float dropout_factor(const ulong seed, const ulong stream, const uint threshold,
                            const float scale, const uint row, const uint key)
{
    uint c0 = key >> 2, c1 = row, c2 = (uint)stream, c3 = (uint)(stream >> 32);
    PHILOX_ROUNDS(uint, c0, c1, c2, c3, seed)
    /* Word key % 4 by its two bits. (Not a chain of lane == 0, 1, 2: clang makes that a switch
     * on key truncated to an i2, which Oclgrind 21.10 runs unmasked, so keys >= 4 of lanes 0
     * and 1 read word 3 there.) */
    const uint odd = key & 1u;
    const uint word = (key & 2u) ? (odd ? c3 : c2) : (odd ? c1 : c0);
    return word >= threshold ? scale : 0.0f;
}

/* The factors of 16 consecutive keys key0 .. key0 + 15 of one row: four blocks in uint4
 * lanes (a key at a time where key0 is not a multiple of 4). */
inline float16 dropout_factor16(const ulong seed, const ulong stream, const uint threshold,
                                const float scale, const uint row, const uint key0)
{
    if ((key0 & 3u) != 0u) {
        float f[16];
        for (uint j = 0; j < 16; ++j)
            f[j] = dropout_factor(seed, stream, threshold, scale, row, key0 + j);
        return vload16(0, f);
    }
    uint4 c0 = (uint4)(key0 >> 2) + (uint4)(0u, 1u, 2u, 3u), c1 = (uint4)(row);
    uint4 c2 = (uint4)((uint)stream), c3 = (uint4)((uint)(stream >> 32));
    PHILOX_ROUNDS(uint4, c0, c1, c2, c3, seed)
    /* key key0 + 4m + w is word w of lane m */
    const uint16 words = (uint16)(c0.x, c1.x, c2.x, c3.x, c0.y, c1.y, c2.y, c3.y, c0.z, c1.z,
                                  c2.z, c3.z, c0.w, c1.w, c2.w, c3.w);
    return select((float16)(0.0f), (float16)(scale), words >= (uint16)(threshold));
}

/* The factors of 64 consecutive keys key0 .. key0 + 63 of one row as four float16 (out[v]:
 * keys key0 + 16v ..): sixteen blocks in uint16 lanes. */
inline void dropout_factor64(const ulong seed, const ulong stream, const uint threshold,
                             const float scale, const uint row, const uint key0, float16 *out)
{
    if ((key0 & 3u) != 0u) {
        for (uint v = 0; v < 4; ++v)
            out[v] = dropout_factor16(seed, stream, threshold, scale, row, key0 + 16 * v);
        return;
    }
    uint16 c0 = (uint16)(key0 >> 2) + (uint16)(0u, 1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 10u, 11u,
                                               12u, 13u, 14u, 15u);
    uint16 c1 = (uint16)(row), c2 = (uint16)((uint)stream), c3 = (uint16)((uint)(stream >> 32));
    PHILOX_ROUNDS(uint16, c0, c1, c2, c3, seed)
    /* key key0 + 16v + 4m + w is word w of lane 4v + m */
    const float16 zero = (float16)(0.0f), kept = (float16)(scale);
    const uint16 t = (uint16)(threshold);
#define DROPOUT_WORDS(a, b, c, d)                                                                 \
    (uint16)(c0.a, c1.a, c2.a, c3.a, c0.b, c1.b, c2.b, c3.b, c0.c, c1.c, c2.c, c3.c, c0.d, c1.d,  \
             c2.d, c3.d)
    out[0] = select(zero, kept, DROPOUT_WORDS(s0, s1, s2, s3) >= t);
    out[1] = select(zero, kept, DROPOUT_WORDS(s4, s5, s6, s7) >= t);
    out[2] = select(zero, kept, DROPOUT_WORDS(s8, s9, sa, sb) >= t);
    out[3] = select(zero, kept, DROPOUT_WORDS(sc, sd, se, sf) >= t);
#undef DROPOUT_WORDS
}

/* DROPOUT_OF(bh, row, key): the factor of one weight of (batch * heads) index bh. */
#define DROPOUT_OF(bh, row, key)                                                                  \
    dropout_factor(dropout_seed, dropout_offset + (bh), dropout_threshold, dropout_scale, (row),  \
                   (key))
#define DROPOUT64_OF(bh, row, key0, out)                                                          \
    dropout_factor64(dropout_seed, dropout_offset + (bh), dropout_threshold, dropout_scale,       \
                     (row), (key0), (out))
#define DROPOUT16_OF(bh, row, key0)                                                               \
    dropout_factor16(dropout_seed, dropout_offset + (bh), dropout_threshold, dropout_scale,       \
                     (row), (key0))

/* Normalisation. softmax_shift: what a row subtracts before exp, its max, or 0 for a row with
 * every score -inf (whose weights then come out 0 instead of exp(-inf - -inf) = NaN). */
inline float softmax_shift(const float row_max)
{
    return row_max == NEG_INF ? 0.0f : row_max;
}

/* The unnormalised softmax weight of score s in a row shifted by `shift`. */
inline float softmax_weight(const float s, const float shift)
{
    return exp(s - shift);
}

/* The unnormalised relu weight of score s. */
inline float relu_weight(const float s)
{
    return fmax(s, 0.0f);
}

/* The factor that normalises a row of weights summing to `total`: 0 when nothing is left, NaN
 * when the sum is (a NaN score: the row comes out NaN, as PyTorch's does). */
inline float inverse_total(const float total)
{
    return total == 0.0f ? 0.0f : 1.0f / total;
}

#endif
