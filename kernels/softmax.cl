/*
 * softmax.cl: the score rule (score.cl) over rows of raw dot products: for each row
 * (b, h, i) of raw (batch, heads, seq_q, seq_k), float32,
 *
 *   s_c = masked_score(scale * raw[b,h,i,c], ...)         (scale, mask, key padding, causal)
 *   softmax: out[b,h,i,c] = exp(s_c - max) / sum exp(s - max)   (max subtracted: no overflow)
 *   relu:    out[b,h,i,c] = relu(s_c) / sum relu(s)
 *   a row with nothing left is written as zeros.
 *
 * raw and out are strided views (element strides; the last stride is 1), float32; out may be
 * raw itself (in place): each element is read and then written by the same work-item, and the
 * last pass reads only out. The mask is a (batch, heads, seq_q, seq_k) view with stride 0 on
 * broadcast dims, dtype MASK_DTYPE; key padding a U8 view with strides for b and c.
 *
 *   group g = row = (b * heads + h) * seq_q + i
 *   +---------------------------------------------+
 *   | l0 l1 .. lW-1 | l0 l1 .. lW-1 | ...          |   work-item l: columns l, l + W, ...
 *   +---------------------------------------------+   (W = SOFTMAX_WG), reduced in local memory
 */
#ifndef SOFTMAX_WG
#define SOFTMAX_WG 128 /* work-items per row; a power of two */
#endif

/* The score of column c of the row (masked_score's rule, reading raw only for kept keys). */
inline float row_score(__global const float *raw, const uint c, const float scale,
                       const uint key_end, const int has_mask,
                       __global const ELEM_T(MASK_DTYPE) *mask, const ulong mask_s3,
                       const int has_key_padding, __global const uchar *key_padding,
                       const ulong key_padding_s1)
{
    if (key_masked(c, key_end, key_padded(has_key_padding, key_padding, c * key_padding_s1)))
        return NEG_INF;
    return add_mask(scale * raw[c], has_mask, mask, c * mask_s3);
}

__kernel __attribute__((reqd_work_group_size(SOFTMAX_WG, 1, 1)))
void softmax_rows(__global const float *raw, const ulong raw_offset, const ulong raw_s0,
                  const ulong raw_s1, const ulong raw_s2,
                  __global float *out, const ulong out_offset, const ulong out_s0,
                  const ulong out_s1, const ulong out_s2,
                  __global const ELEM_T(MASK_DTYPE) *mask, const ulong mask_offset,
                  const ulong mask_s0, const ulong mask_s1, const ulong mask_s2,
                  const ulong mask_s3, const int has_mask,
                  __global const uchar *key_padding, const ulong key_padding_offset,
                  const ulong key_padding_s0, const ulong key_padding_s1,
                  const int has_key_padding,
                  const uint heads, const uint seq_q, const uint seq_k, const float scale,
                  const int norm_relu, const int causal)
{
    __local float scratch[SOFTMAX_WG];
    const uint lid = get_local_id(0);
    const ulong row = get_group_id(0);
    /* Remainders as x - (x / y) * y: a division and remainder of the same operands become an
     * LLVM `freeze`, which Oclgrind's --uninitialized checker cannot run. */
    const ulong bh = row / seq_q;
    const uint i = (uint)(row - bh * seq_q);
    const ulong b = bh / heads, h = bh - b * heads;

    raw += raw_offset + b * raw_s0 + h * raw_s1 + i * raw_s2;
    out += out_offset + b * out_s0 + h * out_s1 + i * out_s2;
    if (has_mask)
        mask += mask_offset + b * mask_s0 + h * mask_s1 + i * mask_s2;
    if (has_key_padding)
        key_padding += key_padding_offset + b * key_padding_s0;
    const uint key_end = causal_key_end(causal, i, seq_q, seq_k);
#define SCORE(c)                                                                                  \
    row_score(raw, (c), scale, key_end, has_mask, mask, mask_s3, has_key_padding, key_padding,   \
              key_padding_s1)

    /* norm_relu is uniform over the group: every work-item meets the same barriers. */
    if (norm_relu) {
        float partial = 0.0f;
        for (uint c = lid; c < seq_k; c += SOFTMAX_WG)
            partial += relu_weight(SCORE(c));
        const float inv = inverse_total(wg_reduce_sum(scratch, partial, lid, SOFTMAX_WG));
        for (uint c = lid; c < seq_k; c += SOFTMAX_WG)
            out[c] = relu_weight(SCORE(c)) * inv;
        return;
    }

    float partial_max = NEG_INF;
    for (uint c = lid; c < seq_k; c += SOFTMAX_WG)
        partial_max = fmax(partial_max, SCORE(c));
    const float shift = softmax_shift(wg_reduce_max(scratch, partial_max, lid, SOFTMAX_WG));

    /* exp once per element: keep the numerators in out, then scale them. */
    float partial_sum = 0.0f;
    for (uint c = lid; c < seq_k; c += SOFTMAX_WG) {
        const float e = softmax_weight(SCORE(c), shift);
        out[c] = e;
        partial_sum += e;
    }
    const float inv = inverse_total(wg_reduce_sum(scratch, partial_sum, lid, SOFTMAX_WG));
    for (uint c = lid; c < seq_k; c += SOFTMAX_WG)
        out[c] *= inv;
#undef SCORE
}
