/*
 * flash_attention.cl: fused scaled dot-product attention that never materialises the
 * (seq_q x seq_k) score matrix (the FlashAttention scheme, written for OpenCL 1.2):
 *
 *   O[b,h,i,:] = sum_j p_ij V[b,h,j,:] / sum_j p_ij,  p_ij = exp(s_ij - m_i),
 *   s_ij = scale * Q[b,h,i,:]*K[b,h,j,:] + attn_mask[i,j]  (-inf where causal or key padding
 *   masks j), m_i = max_j s_ij; with the relu normalisation p_ij = relu(s_ij) instead.
 *
 * Work-group (g, bh) owns query rows g*BLOCK_Q .. +BLOCK_Q of one (batch, head), one row per
 * work-item. It streams the keys in tiles of BLOCK_K: the group copies K and V rows of the tile
 * into local memory, then every work-item scores its row against the tile, updates its running
 * row max m and row sum l (online softmax: when the max grows, the accumulator and l are
 * rescaled by exp(m_old - m_new)) and accumulates p*V. Each output row is written once.
 *
 *            keys: tile 0     tile 1     ...  (K, V tiles in local memory)
 *   rows g*BLOCK_Q  +----------+----------+
 *     (one per      | s, p     | s, p     |   private per work-item: q row, acc row, s tile,
 *      work-item)   +----------+----------+   m, l
 *
 * Causal: tiles whose first key is past the group's last row are skipped (the bound is the
 * same for the whole group, so every work-item meets the same barriers). A row with every key
 * masked is written as zeros and its log-sum-exp as -inf. Extra memory: the optional
 * log-sum-exp, one float per row (m + log l), the statistic that merges partial results.
 *
 * Key parts: one launch covers keys key_begin .. key_stop (key_begin a multiple of BLOCK_K,
 * key_stop too or seq_k); with resume set it starts from the output row and log-sum-exp that
 * the launch before it wrote (the same state, written as (m = lse, l = 1, acc = O)). The host splits the keys only
 * on devices that cap a work-item's loop iterations (Mesa's llvmpipe; see host/runtime.c).
 */
#ifndef HEAD_DIM_QK
#define HEAD_DIM_QK 64 /* d_k, fixed per program variant */
#endif
#ifndef HEAD_DIM_V
#define HEAD_DIM_V 64 /* d_v */
#endif
#ifndef BLOCK_Q
#define BLOCK_Q 64 /* query rows (= work-items) per work-group */
#endif
#ifndef BLOCK_K
#define BLOCK_K 32 /* keys per tile staged in local memory */
#endif
#ifndef FLASH_VW
#define FLASH_VW 1 /* floats per vector in the row loops: 1, 4 or 8 (divides both head sizes) */
#endif

/* Row vectors of FLASH_VW floats: explicit vectors let CPU compilers use SIMD within a row. */
#if FLASH_VW == 8
typedef float8 row_t;
#define row_load(i, p) vload8((i), (p))
#define row_sum(x) (dot((x).lo, (float4)(1.0f)) + dot((x).hi, (float4)(1.0f)))
#elif FLASH_VW == 4
typedef float4 row_t;
#define row_load(i, p) vload4((i), (p))
#define row_sum(x) dot((x), (float4)(1.0f))
#else
typedef float row_t;
#define row_load(i, p) ((p)[(i)])
#define row_sum(x) (x)
#endif
#if FLASH_VW == 8
#define VEC_STORE(x, i, p) vstore8((x), (i), (p))
#elif FLASH_VW == 4
#define VEC_STORE(x, i, p) vstore4((x), (i), (p))
#endif
#define QK_VECS (HEAD_DIM_QK / FLASH_VW)
#define V_VECS (HEAD_DIM_V / FLASH_VW)

__kernel __attribute__((reqd_work_group_size(BLOCK_Q, 1, 1)))
void flash_attention(__global const float *Q, const ulong q_offset,
                     __global const float *K, const ulong k_offset,
                     __global const float *V, const ulong v_offset,
                     __global float *O, const ulong o_offset,
                     __global float *lse, const ulong lse_offset, const int has_lse,
                     const uint heads, const uint seq_q, const uint seq_k,
                     const float scale, const int norm_relu, const int causal,
                     __global const float *attn_mask, const ulong attn_mask_offset,
                     const int has_mask,
                     __global const uchar *key_padding, const ulong key_padding_offset,
                     const int has_key_padding, const ulong bh_base, const uint key_begin,
                     const uint key_stop, const int resume)
{
    __local float k_tile[BLOCK_K][HEAD_DIM_QK];
    __local float v_tile[BLOCK_K][HEAD_DIM_V];

    const uint lid = get_local_id(0);
    const uint first_row = get_group_id(0) * BLOCK_Q;
    const uint row = first_row + lid;
    const bool valid = row < seq_q;
    const ulong bh = bh_base + get_global_id(1); /* batch * heads + head */
    const ulong b = bh / heads;

    Q += q_offset + (bh * seq_q + (valid ? row : 0)) * HEAD_DIM_QK;
    K += k_offset + bh * seq_k * HEAD_DIM_QK;
    V += v_offset + bh * seq_k * HEAD_DIM_V;
    if (has_mask)
        attn_mask += attn_mask_offset + (ulong)(valid ? row : 0) * seq_k;
    if (has_key_padding)
        key_padding += key_padding_offset + b * seq_k;

    row_t q[QK_VECS];
    for (uint d = 0; d < QK_VECS; ++d)
        q[d] = valid ? row_load(d, Q) * scale : (row_t)(0.0f);
    row_t acc[V_VECS];
    for (uint d = 0; d < V_VECS; ++d)
        acc[d] = (row_t)(0.0f);
    float row_max = NEG_INF, total = 0.0f; /* running max and sum of the row */
    __global float *out = O + o_offset + (bh * seq_q + (valid ? row : 0)) * HEAD_DIM_V;
    if (resume && valid) {
        const float previous = lse[lse_offset + bh * seq_q + row];
        if (previous != NEG_INF) { /* else no key so far counted: the initial state */
            total = norm_relu ? exp(previous) : 1.0f;
            row_max = norm_relu ? NEG_INF : previous;
            for (uint d = 0; d < V_VECS; ++d)
                acc[d] = row_load(d, out) * total;
        }
    }

    /* Keys past the group's last row are all causally masked: stop there (uniform bound). */
    const uint last_row = min(seq_q, first_row + BLOCK_Q) - 1;
    const uint key_end = min(key_stop, causal ? min(seq_k, last_row + 1) : seq_k);

    for (uint k0 = key_begin; k0 < key_end; k0 += BLOCK_K) {
        for (uint e = lid; e < BLOCK_K * HEAD_DIM_QK; e += BLOCK_Q) {
            const uint j = e / HEAD_DIM_QK, d = e % HEAD_DIM_QK;
            k_tile[j][d] = k0 + j < seq_k ? K[(ulong)(k0 + j) * HEAD_DIM_QK + d] : 0.0f;
        }
        for (uint e = lid; e < BLOCK_K * HEAD_DIM_V; e += BLOCK_Q) {
            const uint j = e / HEAD_DIM_V, d = e % HEAD_DIM_V;
            v_tile[j][d] = k0 + j < seq_k ? V[(ulong)(k0 + j) * HEAD_DIM_V + d] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        float s[BLOCK_K];
        float tile_max = NEG_INF;
        for (uint j = 0; j < BLOCK_K; ++j) {
            const uint key = k0 + j;
            row_t partial = (row_t)(0.0f);
            for (uint d = 0; d < QK_VECS; ++d)
                partial = mad(q[d], row_load(d, k_tile[j]), partial);
            float score = row_sum(partial);
            if (has_mask && key < seq_k)
                score += attn_mask[key];
            const bool masked = key >= seq_k || (causal && key > row) ||
                                (has_key_padding && key_padding[key] != 0);
            s[j] = masked ? NEG_INF : score;
            tile_max = fmax(tile_max, s[j]);
        }

        if (norm_relu) {
            for (uint j = 0; j < BLOCK_K; ++j) {
                const float p = fmax(s[j], 0.0f);
                total += p;
                for (uint d = 0; d < V_VECS; ++d)
                    acc[d] = mad((row_t)(p), row_load(d, v_tile[j]), acc[d]);
            }
        } else if (tile_max != NEG_INF) {
            const float new_max = fmax(row_max, tile_max);
            const float correction = exp(row_max - new_max); /* 0 while row_max is -inf */
            total *= correction;
            for (uint d = 0; d < V_VECS; ++d)
                acc[d] *= correction;
            for (uint j = 0; j < BLOCK_K; ++j) {
                const float p = exp(s[j] - new_max);
                total += p;
                for (uint d = 0; d < V_VECS; ++d)
                    acc[d] = mad((row_t)(p), row_load(d, v_tile[j]), acc[d]);
            }
            row_max = new_max;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    if (!valid)
        return;
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (uint d = 0; d < V_VECS; ++d) {
        const row_t value = acc[d] * inv;
#if FLASH_VW == 1
        out[d] = value;
#else
        VEC_STORE(value, d, out);
#endif
    }
    if (has_lse) {
        const float value = norm_relu ? (total > 0.0f ? log(total) : NEG_INF)
                                      : (total > 0.0f ? row_max + log(total) : NEG_INF);
        lse[lse_offset + bh * seq_q + row] = value;
    }
}
