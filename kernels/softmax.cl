/*
 * softmax.cl: fused scale + mask + normalisation over the rows of a packed score tensor
 * S (batch, heads, seq_q, seq_k):
 *
 *   s[c] = scale * S[row, c] + attn_mask[q, c], or -inf where masked (causal: c > q;
 *          key padding: key_padding[b, c] != 0)
 *   softmax: out[c] = exp(s[c] - max) / sum exp(s - max)     (max subtracted: no overflow)
 *   relu:    out[c] = relu(s[c]) / sum relu(s)
 *   A row with nothing left (all masked, or a relu sum of 0) is written as zeros, never NaN.
 *
 * One work-group of SOFTMAX_WG work-items per row (group id = row = (b*heads + h)*seq_q + q);
 * work-item l handles columns l, l + SOFTMAX_WG, ... and the group reduces through local
 * memory. out may alias S: each element is read and then written by the same work-item, and
 * the last pass reads only out.
 */
#ifndef SOFTMAX_WG
#define SOFTMAX_WG 128 /* work-items per row; a power of two */
#endif

inline float masked_score(__global const float *scores, const ulong row_base, const uint c,
                          const uint q, const float scale, const int causal,
                          __global const float *attn_mask, const int has_mask,
                          __global const uchar *key_padding, const int has_key_padding)
{
    if ((causal && c > q) || (has_key_padding && key_padding[c] != 0))
        return NEG_INF;
    float s = scale * scores[row_base + c];
    if (has_mask)
        s += attn_mask[c];
    return s;
}

__kernel __attribute__((reqd_work_group_size(SOFTMAX_WG, 1, 1)))
void softmax_rows(__global const float *scores, const ulong scores_offset,
                  __global float *out, const ulong out_offset,
                  const uint heads, const uint seq_q, const uint seq_k,
                  const float scale, const int norm_relu, const int causal,
                  __global const float *attn_mask, const ulong attn_mask_offset,
                  const int has_mask,
                  __global const uchar *key_padding, const ulong key_padding_offset,
                  const int has_key_padding)
{
    __local float scratch[SOFTMAX_WG];
    const uint lid = get_local_id(0);
    const ulong row = get_group_id(0);
    const uint q = (uint)(row % seq_q);
    const ulong b = row / ((ulong)heads * seq_q);
    const ulong row_base = row * seq_k;

    scores += scores_offset;
    out += out_offset;
    /* Row-local views of the masks: the additive mask row q, the padding row b. */
    if (has_mask)
        attn_mask += attn_mask_offset + (ulong)q * seq_k;
    if (has_key_padding)
        key_padding += key_padding_offset + b * seq_k;

    if (norm_relu) {
        float partial = 0.0f;
        for (uint c = lid; c < seq_k; c += SOFTMAX_WG)
            partial += fmax(masked_score(scores, row_base, c, q, scale, causal, attn_mask,
                                         has_mask, key_padding, has_key_padding), 0.0f);
        const float total = wg_reduce_sum(scratch, partial, lid, SOFTMAX_WG);
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        for (uint c = lid; c < seq_k; c += SOFTMAX_WG) {
            const float s = masked_score(scores, row_base, c, q, scale, causal, attn_mask,
                                         has_mask, key_padding, has_key_padding);
            out[row_base + c] = fmax(s, 0.0f) * inv;
        }
        return;
    }

    float partial_max = NEG_INF;
    for (uint c = lid; c < seq_k; c += SOFTMAX_WG)
        partial_max = fmax(partial_max, masked_score(scores, row_base, c, q, scale, causal,
                                                     attn_mask, has_mask, key_padding,
                                                     has_key_padding));
    const float row_max = wg_reduce_max(scratch, partial_max, lid, SOFTMAX_WG);

    /* All keys masked: zeros, not exp(-inf - -inf) = NaN. row_max is uniform over the group,
     * so this branch (and the barriers inside the reduction below) is taken by all or none. */
    if (row_max == NEG_INF) {
        for (uint c = lid; c < seq_k; c += SOFTMAX_WG)
            out[row_base + c] = 0.0f;
        return;
    }

    /* exp once per element: keep the numerators in out, then scale them. */
    float partial_sum = 0.0f;
    for (uint c = lid; c < seq_k; c += SOFTMAX_WG) {
        const float e = exp(masked_score(scores, row_base, c, q, scale, causal, attn_mask,
                                         has_mask, key_padding, has_key_padding) - row_max);
        out[row_base + c] = e;
        partial_sum += e;
    }
    const float inv_sum = 1.0f / wg_reduce_sum(scratch, partial_sum, lid, SOFTMAX_WG);
    for (uint c = lid; c < seq_k; c += SOFTMAX_WG)
        out[row_base + c] *= inv_sum;
}
