/*
 * flash.cl: fused scaled dot-product attention that never materialises the (seq_q x seq_k)
 * score matrix (the FlashAttention scheme, written for OpenCL 1.2):
 *
 *   O[b,h,i,:] = sum_j w_ij V[b,h,j,:],  w_ij the weights of the score rule (score.cl) on
 *   s_ij = scale * Q[b,h,i,:] . K[b,h,j,:] (+ mask, -inf where masked)
 *
 * Q (batch, heads, seq_q, HEAD_DIM_QK), K (.., seq_k, HEAD_DIM_QK), V (.., seq_k, HEAD_DIM_V)
 * and O (.., seq_q, HEAD_DIM_V) are views with four element strides each and dtypes Q_DTYPE,
 * K_DTYPE, V_DTYPE, O_DTYPE (types.cl); strides touch only the global loads and stores, the
 * inner loops run on float tiles in local memory. The mask is a (batch, heads, seq_q, seq_k)
 * view (stride 0 on broadcast dims) of MASK_DTYPE, key padding a U8 view with strides for b
 * and j, lse a float32 (batch, heads, seq_q) view with three strides.
 *
 * Work-group (g, bh) owns query rows g*BLOCK_Q .. +BLOCK_Q of one (batch, head), one row per
 * work-item; bh = bh_base + get_global_id(1) = b * heads + h. Grouped-query attention: K and
 * V have heads / kv_group heads, and query head h reads K/V head h / kv_group (1: one each; the
 * shared head is indexed, never copied). It streams the keys in tiles of
 * BLOCK_K: the group copies K and V rows of the tile into local memory (as float), then every
 * work-item scores its row against the tile, updates its running row max m and row sum l
 * (online softmax: when the max grows, the accumulator and l are rescaled by exp(m_old - m_new))
 * and accumulates p*V. Each output row is written once.
 *
 *            keys: tile 0     tile 1     ...  (K, V tiles in local memory)
 *   rows g*BLOCK_Q  +----------+----------+
 *     (one per      | s, p     | s, p     |   private per work-item: q row, acc row, s tile,
 *      work-item)   +----------+----------+   m, l
 *
 * Causal (either alignment): tiles past the keys the group's last row sees are skipped (the
 * bound is the same for the whole group, so every work-item meets the same barriers). A row
 * with every key masked is written as zeros and its log-sum-exp as -inf. Extra memory: the
 * optional log-sum-exp, one float per row (m + log l; log l for relu), the statistic that
 * merges partial results.
 *
 * Key parts: one launch covers keys key_begin .. key_stop (key_begin a multiple of BLOCK_K,
 * key_stop too or seq_k); with resume set it starts from the output row and log-sum-exp that
 * the launch before it wrote (the same state, written as (m = lse, l = 1, acc = O)). The host
 * splits the keys only on devices that cap a work-item's loop iterations (Mesa's llvmpipe; see
 * host/tuning/table.h). An output of F16 or BF16 is rounded between parts.
 *
 * Resources, measured 2026-12-03 (tests/resources/run.sh: clang 15 + libclc, ptxas
 * -arch=sm_90; LLVM 15 for gfx90a), BLOCK_Q 64, BLOCK_K 32, FLASH_VW 1 (the GPU row): the
 * per-item rows live in local memory, not registers. The ADDITIVE variant that GPUs run
 * (head size 16 in the lane's capture): 157 registers, a 384-byte stack, no spills (gfx90a:
 * 240 VGPRs, 132 bytes of scratch per lane). The plain kernel, which GPUs run with
 * CLATTN_TUNING=default or where flash_gpu.cl does not fit: 72 registers and a 640-byte stack
 * at d = 64, 62 registers and 1088 bytes at d = 128 (BLOCK_K 16), no spills (gfx90a: 245 and
 * 256 VGPRs, 1 wave per SIMD at d = 128): hence flash_gpu.cl.
 */
#ifndef BLOCK_Q
#define BLOCK_Q 64 /* query rows (= work-items) per work-group */
#endif
#ifndef BLOCK_K
#define BLOCK_K 32 /* keys per tile staged in local memory */
#endif
#ifndef FLASH_VW
#define FLASH_VW 1 /* floats per vector in the row loops: 1, 4 or 8 (divides both head sizes) */
#endif
#ifndef ADDITIVE
#define ADDITIVE 0 /* 1: additive attention's score (below) instead of the dot product */
#endif
#define ADDITIVE_BIG 40.0f /* additive: |P| past which exp(2 P) is not used (see below) */

/* Row vectors of FLASH_VW floats: explicit vectors let CPU compilers use SIMD within a row.
 * row_gather / row_scatter move vector i of a global row whose elements are `s` apart. */
#if FLASH_VW == 8
typedef float8 row_t;
#define row_load(i, p) vload8((i), (p))
#define row_sum(x) (dot((x).lo, (float4)(1.0f)) + dot((x).hi, (float4)(1.0f)))
#define row_gather(code, p, i, s)                                                                 \
    (float8)(LOAD(code, p, ((i) * 8 + 0) * (s)), LOAD(code, p, ((i) * 8 + 1) * (s)),             \
             LOAD(code, p, ((i) * 8 + 2) * (s)), LOAD(code, p, ((i) * 8 + 3) * (s)),             \
             LOAD(code, p, ((i) * 8 + 4) * (s)), LOAD(code, p, ((i) * 8 + 5) * (s)),             \
             LOAD(code, p, ((i) * 8 + 6) * (s)), LOAD(code, p, ((i) * 8 + 7) * (s)))
#define row_scatter(code, x, p, i, s)                                                             \
    do {                                                                                          \
        STORE(code, (x).s0, p, ((i) * 8 + 0) * (s));                                              \
        STORE(code, (x).s1, p, ((i) * 8 + 1) * (s));                                              \
        STORE(code, (x).s2, p, ((i) * 8 + 2) * (s));                                              \
        STORE(code, (x).s3, p, ((i) * 8 + 3) * (s));                                              \
        STORE(code, (x).s4, p, ((i) * 8 + 4) * (s));                                              \
        STORE(code, (x).s5, p, ((i) * 8 + 5) * (s));                                              \
        STORE(code, (x).s6, p, ((i) * 8 + 6) * (s));                                              \
        STORE(code, (x).s7, p, ((i) * 8 + 7) * (s));                                              \
    } while (0)
#elif FLASH_VW == 4
typedef float4 row_t;
#define row_load(i, p) vload4((i), (p))
#define row_sum(x) dot((x), (float4)(1.0f))
#define row_gather(code, p, i, s)                                                                 \
    (float4)(LOAD(code, p, ((i) * 4 + 0) * (s)), LOAD(code, p, ((i) * 4 + 1) * (s)),             \
             LOAD(code, p, ((i) * 4 + 2) * (s)), LOAD(code, p, ((i) * 4 + 3) * (s)))
#define row_scatter(code, x, p, i, s)                                                             \
    do {                                                                                          \
        STORE(code, (x).s0, p, ((i) * 4 + 0) * (s));                                              \
        STORE(code, (x).s1, p, ((i) * 4 + 1) * (s));                                              \
        STORE(code, (x).s2, p, ((i) * 4 + 2) * (s));                                              \
        STORE(code, (x).s3, p, ((i) * 4 + 3) * (s));                                              \
    } while (0)
#else
typedef float row_t;
#define row_load(i, p) ((p)[(i)])
#define row_sum(x) (x)
#define row_gather(code, p, i, s) LOAD(code, p, (i) * (s))
#define row_scatter(code, x, p, i, s) STORE(code, x, p, (i) * (s))
#endif
#define QK_VECS (HEAD_DIM_QK / FLASH_VW)

#define V_VECS (HEAD_DIM_V / FLASH_VW)

/* ---- flash_attention's steps (score.cl's contract), always inlined into the kernel (PoCL
 * left plain `inline` steps as calls, their row arrays in memory): the row open
 * (fl_additive_open, fl_open_acc), per key tile the staging (fl_stage_tile, fl_stage_exp), the
 * row close (fl_close_row); the scores and the online softmax update with P.V stay in the
 * kernel (as a step, the update cost gfx90a 82 spilled VGPRs at d = 128 in the resources
 * proxy). Every work-item calls each step; the barriers stay in the kernel. */

#if ADDITIVE
/* Additive attention (host/attn/additive.c): Q and K hold the projections P1 = q W1 + b1
 * and P2 = k W2 + b2 of the head (HEAD_DIM_QK = da; scale 1), and the score of key j is
 * sum_c w[h, c] tanh(P1[i, c] + P2[j, c]); the head's w stays in registers.
 * One tanh per term is what the score costs; instead, with E1 = exp(2 P1) per row and
 * E2 = exp(2 P2) per key (each computed once),
 *   tanh(a + b) = 1 - 2 / (1 + E1 E2),  so  sum_c w_c tanh = sum_c w_c - 2 sum_c w_c / (1 + E1 E2)
 * (a product, an add and a division per term). The error in tanh is at most half the
 * relative error of E1 E2 (d tanh / dP = 2 / (1 + P)^2), so within a few 1e-7; a product
 * past the float range gives 0 or 1 / inf, the exact limits. Only exponentials of
 * |P| > ADDITIVE_BIG (40: e^80 is still a float) would overflow: a row or a key tile
 * holding one takes the tanh path instead (flags: row_big, tile_big).
 * The row's part: w, -2 w, E1, sum_c w_c (w_total) and its flag (row_big > 0). */
__attribute__((always_inline)) inline void
fl_additive_open(row_t *w_row, row_t *w_neg2, row_t *q_exp, float *w_total, float *row_big,
                 const row_t *q, __global const float *score_w, const clattn_flash_params params,
                 const ulong h)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    score_w += w_offset + h * w_s0;
    *w_total = 0.0f;
    *row_big = 0.0f;
    for (uint d = 0; d < QK_VECS; ++d) {
        w_row[d] = row_gather(0, score_w, d, w_s1);
        w_neg2[d] = -2.0f * w_row[d];
        *w_total += row_sum(w_row[d]);
        *row_big += row_sum(step((row_t)(ADDITIVE_BIG), fabs(q[d])));
        q_exp[d] = exp(2.0f * clamp(q[d], -ADDITIVE_BIG, ADDITIVE_BIG));
    }
}

/* exp(2 P2) of the elements this work-item loaded into k_tile (its own writes), and the
 * tile's flag (parity's). */
__attribute__((always_inline)) inline void
fl_stage_exp(__local float (*e_tile)[HEAD_DIM_QK], __local int *tile_big,
             __local float (*k_tile)[HEAD_DIM_QK], const uint parity, const uint lid)
{
    for (uint e = lid; e < BLOCK_K * HEAD_DIM_QK; e += BLOCK_Q) {
        const uint j = e / HEAD_DIM_QK, d = e - j * HEAD_DIM_QK;
        const float p = k_tile[j][d];
        e_tile[j][d] = exp(2.0f * clamp(p, -ADDITIVE_BIG, ADDITIVE_BIG));
        if (fabs(p) > ADDITIVE_BIG)
            atomic_or(&tile_big[parity], 1);
    }
}
#endif

/* The row's accumulator, max and sum at the start, or the state the previous key part left
 * (resume; see the header). */
__attribute__((always_inline)) inline void
fl_open_acc(row_t *acc, float *row_max_out, float *total_out,
            __global const ELEM_T(O_DTYPE) *out, __global const float *lse,
            const clattn_flash_params params, const bool valid, const ulong lse_index)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    for (uint d = 0; d < V_VECS; ++d)
        acc[d] = (row_t)(0.0f);
    float row_max = NEG_INF, total = 0.0f; /* running max and sum of the row */
    if (resume && valid) {
        const float previous = lse[lse_index];
        if (previous != NEG_INF) { /* else no key so far counted: the initial state */
            total = norm_relu ? exp(previous) : 1.0f;
            row_max = norm_relu ? NEG_INF : previous;
            for (uint d = 0; d < V_VECS; ++d)
                acc[d] = row_gather(O_DTYPE, out, d, o_s3) * (total / FLASH_V_SCALE);
        }
    }
    *row_max_out = row_max;
    *total_out = total;
}

/* The tile's K and V rows (as float; zeros past the key count) and its keys' padding flags. */
__attribute__((always_inline)) inline void
fl_stage_tile(__local float (*k_tile)[HEAD_DIM_QK], __local float (*v_tile)[HEAD_DIM_V],
              __local uchar *tile_padded, __global const ELEM_T(K_DTYPE) *K,
              __global const ELEM_T(V_DTYPE) *V, __global const uchar *key_padding,
              __global const int *block_table, const ulong bt_row,
              const clattn_flash_params params, const key_band band, const uint k0,
              const uint lid)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    /* Rows with unit stride along head_dim (every packed or (B, L, H*d) layout) skip the
     * multiply; the branch is uniform over the work-group. */
    if (k_s3 == 1 && v_s3 == 1) {
        for (uint e = lid; e < BLOCK_K * HEAD_DIM_QK; e += BLOCK_Q) {
            const uint j = e / HEAD_DIM_QK, d = e - j * HEAD_DIM_QK;
            k_tile[j][d] = k0 + j < band.limit ? LOAD(K_DTYPE, K, KEY_AT(k0 + j, k_s2, k_page) + d) : 0.0f;
        }
        for (uint e = lid; e < BLOCK_K * HEAD_DIM_V; e += BLOCK_Q) {
            const uint j = e / HEAD_DIM_V, d = e - j * HEAD_DIM_V;
            v_tile[j][d] = k0 + j < band.limit ? LOAD(V_DTYPE, V, KEY_AT(k0 + j, v_s2, v_page) + d) : 0.0f;
        }
    } else {
        for (uint e = lid; e < BLOCK_K * HEAD_DIM_QK; e += BLOCK_Q) {
            const uint j = e / HEAD_DIM_QK, d = e - j * HEAD_DIM_QK;
            k_tile[j][d] =
                k0 + j < band.limit ? LOAD(K_DTYPE, K, KEY_AT(k0 + j, k_s2, k_page) + d * k_s3) : 0.0f;
        }
        for (uint e = lid; e < BLOCK_K * HEAD_DIM_V; e += BLOCK_Q) {
            const uint j = e / HEAD_DIM_V, d = e - j * HEAD_DIM_V;
            v_tile[j][d] =
                k0 + j < band.limit ? LOAD(V_DTYPE, V, KEY_AT(k0 + j, v_s2, v_page) + d * v_s3) : 0.0f;
        }
    }
    for (uint j = lid; j < BLOCK_K; j += BLOCK_Q) {
        const uint key = k0 + j;
        tile_padded[j] = key < seq_k && key_padded(has_key_padding, key_padding,
                                                   key * key_padding_s1);
    }
}

/* The row close: attention sinks (score.cl) into the row's denominator, in the launch that
 * finishes it; the output row normalised and stored, its log-sum-exp. */
__attribute__((always_inline)) inline void
fl_close_row(__global ELEM_T(O_DTYPE) *out, __global float *lse, __global const float *sinks,
             const row_t *acc, float row_max, float total, const clattn_flash_params params,
             const ulong h, const uint row, const ulong lse_index)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    const sunk_row sunk = sink_fold(SINK_OF(h, row), row_max, total);
    row_max = sunk.max;
    total = sunk.total;
    const float inv = sunk.factor * inverse_total(total) * FLASH_V_SCALE;
    for (uint d = 0; d < V_VECS; ++d)
        row_scatter(O_DTYPE, acc[d] * inv, out, d, o_s3);
    if (has_lse)
        lse[lse_index] = total == 0.0f ? NEG_INF : (norm_relu ? log(total) : row_max + log(total));
}

__kernel __attribute__((reqd_work_group_size(BLOCK_Q, 1, 1)))
void flash_attention(FLASH_KERNEL_PARAMS)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    __local float k_tile[BLOCK_K][HEAD_DIM_QK];
    __local float v_tile[BLOCK_K][HEAD_DIM_V];
    __local uchar tile_padded[BLOCK_K]; /* key padding of the tile's keys */
#if ADDITIVE
    __local float e_tile[BLOCK_K][HEAD_DIM_QK]; /* exp(2 P2) of the tile's keys */
    __local int tile_big[2]; /* per tile parity: a key of the tile has |P2| > ADDITIVE_BIG */
#endif

    const uint lid = get_local_id(0);
    OPEN_GROUP_ROWS(BLOCK_Q) /* score.cl: first_row, bh, b, h (the packed grid's, or by id) */
    const uint row = first_row + lid;
    /* the batch's rows and keys (score.cl: a packed sequence's, or seq_q and seq_k) */
    const seq_span span = SPAN_OF(b);
    if (first_row >= span.rows)
        return; /* the whole work-group past a packed sequence's rows (uniform) */
    const bool valid = row < span.rows;
    const uint safe_row = valid ? row : 0; /* rows past the batch's compute row 0, store nothing */
    /* the launch's keys (score.cl's split_begin: a decode split's, else the part's) */
    const uint split = get_global_id(2);
    const uint key_begin = split_begin(part_begin, split_keys, split);
    const uint key_stop = split_stop(part_stop, split_keys, key_begin);

    const ulong q_row = span.q0 + safe_row;
    Q += q_offset + b * q_s0 + h * q_s1 + q_row * q_s2;
    /* grouped-query: a shared head (ADVANCE: the block types' rows are whole blocks) */
    K = ADVANCE(K_DTYPE, K, k_offset + b * k_s0 + (h / kv_group) * k_s1 + span.k0 * k_s2);
    V = ADVANCE(V_DTYPE, V, v_offset + b * v_s0 + (h / kv_group) * v_s1 + span.k0 * v_s2);
    __global ELEM_T(O_DTYPE) *out = O + o_offset + split * o_split + b * o_s0 + h * o_s1 + q_row * o_s2;
    const ulong lse_index = lse_offset + split * lse_split + b * lse_s0 + h * lse_s1 + q_row * lse_s2;
    if (has_mask)
        mask += mask_offset + b * mask_s0 + h * mask_s1 + safe_row * mask_s2;
    if (has_key_padding)
        key_padding += key_padding_offset + b * key_padding_s0;

    row_t q[QK_VECS];
    for (uint d = 0; d < QK_VECS; ++d)
        q[d] = row_gather(Q_DTYPE, Q, d, q_s3) * scale;
#if ADDITIVE
    row_t w_row[QK_VECS], w_neg2[QK_VECS], q_exp[QK_VECS];
    float w_total, row_big;
    fl_additive_open(w_row, w_neg2, q_exp, &w_total, &row_big, q, score_w, params, h);
    if (lid == 0)
        tile_big[0] = tile_big[1] = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    uint parity = 0;
#endif
    row_t acc[V_VECS];
    float row_max, total; /* running max and sum of the row */
    fl_open_acc(acc, &row_max, &total, out, lse, params, valid, lse_index);

    /* The row's key band; the group needs keys from its first row's begin to its last row's
     * end (uniform bounds), the tiles before the begin skipped whole. */
    OPEN_PAGED_ROW(b)
    const key_band band = FUSED_BAND(b, h, span); /* score.cl's row open */
    const uint row_key_begin = band_begin(band, safe_row), row_key_end = band_end(band, safe_row);
    const group_keys group = open_group(band, span.rows, first_row, BLOCK_Q, key_begin, key_stop, BLOCK_K);
    const uint last_row = group.last_row, key_end = group.key_end;

    for (uint k0 = group.key_first; k0 < key_end; k0 += BLOCK_K) {
        /* the block mask's verdict on the tile (score.cl; uniform): empty tiles are skipped */
        const uint tile_state = FLEX_VISIT(
            FLEX_TILE(b, h, first_row, last_row, k0, min(k0 + BLOCK_K, band.limit)), lid == 0);
        if (tile_state == FLEX_EMPTY)
            continue;
        const key_band tile_band = flex_tile_band(band, tile_state);
        fl_stage_tile(k_tile, v_tile, tile_padded, K, V, key_padding, block_table, bt_row,
                      params, band, k0, lid);
#if ADDITIVE
        fl_stage_exp(e_tile, tile_big, k_tile, parity, lid);
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
#if ADDITIVE
        /* tile_big[parity] is final; the other parity's flag, last read in the tile before,
         * is cleared for the next tile (whose loads come after this tile's closing barrier). */
        const bool exact = row_big > 0.0f || tile_big[parity] != 0;
        if (lid == 0)
            tile_big[parity ^ 1] = 0;
        parity ^= 1;
#endif

        /* SCORE and KEEP (score.cl's score_rule) on the row's keys of the tile */
        float s[BLOCK_K];
        float tile_max = NEG_INF;
        for (uint j = 0; j < BLOCK_K; ++j) {
            const uint key = k0 + j;
            row_t partial = (row_t)(0.0f);
#if ADDITIVE
            if (exact) {
                for (uint d = 0; d < QK_VECS; ++d)
                    partial = mad(w_row[d], tanh(q[d] + row_load(d, k_tile[j])), partial);
            } else {
                for (uint d = 0; d < QK_VECS; ++d)
                    partial = mad(w_neg2[d], 1.0f / mad(q_exp[d], row_load(d, e_tile[j]), 1.0f),
                                  partial);
                partial += (row_t)(w_total / FLASH_VW); /* sum_c w_c, spread over the lanes */
            }
#else
            for (uint d = 0; d < QK_VECS; ++d)
                partial = mad(q[d], row_load(d, k_tile[j]), partial);
#endif
            s[j] = score_rule(row_sum(partial), softcap, tile_band, safe_row, key, row_key_begin,
                              row_key_end, tile_padded[j], has_mask, mask, key * mask_s3);
            tile_max = fmax(tile_max, s[j]);
        }
        /* the online softmax update (relu: the weights as they are) and P.V; dropout (score.cl)
         * on what meets V */
        if (norm_relu) {
            for (uint j = 0; j < BLOCK_K; ++j) {
                const float p = relu_weight(s[j]);
                total += p;
                const float pv = SCORE_DROPOUT ? p * DROPOUT_OF(bh, safe_row, k0 + j) : p;
                for (uint d = 0; d < V_VECS; ++d)
                    acc[d] = mad((row_t)(pv), row_load(d, v_tile[j]), acc[d]);
            }
        } else if (tile_max != NEG_INF) { /* a tile with every key masked changes nothing */
            const float new_max = fmax(row_max, tile_max);
            const float correction = exp(row_max - new_max); /* 0 while row_max is -inf */
            total *= correction;
            for (uint d = 0; d < V_VECS; ++d)
                acc[d] *= correction;
            for (uint j = 0; j < BLOCK_K; ++j) {
                const float p = softmax_weight(s[j], new_max);
                total += p; /* the undropped sum; dropout (score.cl) on what meets V */
                const float pv = SCORE_DROPOUT ? p * DROPOUT_OF(bh, safe_row, k0 + j) : p;
                for (uint d = 0; d < V_VECS; ++d)
                    acc[d] = mad((row_t)(pv), row_load(d, v_tile[j]), acc[d]);
            }
            row_max = new_max;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    if (!valid)
        return;
    fl_close_row(out, lse, sinks, acc, row_max, total, params, h, row, lse_index);
}
