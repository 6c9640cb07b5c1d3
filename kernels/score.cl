/*
 * score.cl: the score rule, the one place that says what an attention score is and how a row
 * of scores becomes weights. Prepended to every kernel source (after types.cl); softmax.cl
 * (scores from a matmul) and flash.cl (scores computed in place) both apply it through these
 * helpers only.
 *
 *   s_ij = cap(scale * (q_i . k_j)) + mask[b,h,i,j]  float masks (F32, F16, BF16) are added
 *   cap(x) = softcap * tanh(x / softcap)               soft-capping (Gemma 2, ONNX Attention's
 *                                                      softcap), when softcap > 0; else x
 *   s_ij = -inf  where a U8 mask[b,h,i,j] is 0        (U8: nonzero = the key takes part)
 *              or key_padding[b, j] != 0               (nonzero = ignore the key)
 *              or j >= causal_key_end(i)               TOP_LEFT: j > i
 *                                                      BOTTOM_RIGHT: j > i + seq_k - seq_q
 *   softmax: w_ij = exp(s_ij - m_i) / sum_j exp(s_ij - m_i),  m_i = max_j s_ij
 *   relu:    w_ij = relu(s_ij) / sum_j relu(s_ij)
 *   a row whose sum is 0 (every key masked, or relu of nothing positive) gives zeros, not NaN.
 *
 * Compile-time switch: MASK_DTYPE, the dtype code of the mask (types.cl); it only matters in
 * programs launched with a mask. Whether a mask or key padding is present, the causal
 * alignment and the normalisation are kernel arguments: uniform branches, so each program
 * serves every combination and the variants stay few.
 */
#ifndef CLATTN_SCORE_CL
#define CLATTN_SCORE_CL

#ifndef MASK_DTYPE
#define MASK_DTYPE 0 /* dtype code of the attention mask (F32 when there is none) */
#endif

#define CAUSAL_NONE 0
#define CAUSAL_TOP_LEFT 1
#define CAUSAL_BOTTOM_RIGHT 2

/* Keys 0 .. causal_key_end - 1 are causally visible from query row `row`: min(seq_k, row + 1)
 * for TOP_LEFT, row + 1 + seq_k - seq_q clamped to [0, seq_k] for BOTTOM_RIGHT, seq_k when not
 * causal. Nondecreasing in row, so a block's last row bounds the keys the block needs. */
inline uint causal_key_end(const int causal, const uint row, const uint seq_q, const uint seq_k)
{
    if (causal == CAUSAL_NONE)
        return seq_k;
    const long shift = causal == CAUSAL_BOTTOM_RIGHT ? (long)seq_k - (long)seq_q : 0;
    const long end = (long)row + 1 + shift;
    return end <= 0 ? 0u : end >= (long)seq_k ? seq_k : (uint)end;
}

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

/* Whether the rule drops key `key` from a row: past the row's causal_key_end (which is at
 * most seq_k, so keys past seq_k are dropped too) or `padded`. */
inline bool key_masked(const uint key, const uint key_end, const bool padded)
{
    return key >= key_end || padded;
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
    return softcap * tanh(x * (1.0f / softcap));
}

/* The scaled dot product plus the mask term at element mask_index of `mask` (when there is a
 * mask). Only for keys key_masked keeps: the mask is read nowhere else. */
inline float add_mask(const float scaled_dot, const int has_mask,
                      __global const ELEM_T(MASK_DTYPE) *mask, const ulong mask_index)
{
    return has_mask ? scaled_dot + mask_term(mask, mask_index) : scaled_dot;
}

/* The score of key `key` from the scaled dot product: -inf where key_masked, else add_mask. */
inline float masked_score(const float scaled_dot, const uint key, const uint key_end,
                          const bool padded, const int has_mask,
                          __global const ELEM_T(MASK_DTYPE) *mask, const ulong mask_index)
{
    if (key_masked(key, key_end, padded))
        return NEG_INF;
    return add_mask(scaled_dot, has_mask, mask, mask_index);
}

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

/* The factor that normalises a row of weights summing to `total`: 0 when nothing is left. */
inline float inverse_total(const float total)
{
    return total > 0.0f ? 1.0f / total : 0.0f;
}

#endif
