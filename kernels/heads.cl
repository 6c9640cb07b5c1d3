/*
 * heads.cl: moving between the sequence-major layout (batch, seq, heads*head_dim), whose rows
 * are row_stride elements apart, and the head-major layout (batch, heads, seq, head_dim), packed;
 * and averaging attention weights over heads.
 *
 *   split:  dst[b, h, l, j]                          = src[b*seq*row_stride + l*row_stride + h*d + j]
 *   concat: dst[b*seq*row_stride + l*row_stride + h*d + j] = src[b, h, l, j]
 *
 * One work-item per element of the head-major side, in its memory order; the global size is
 * rounded up to the work-group size and work-items past the end do nothing.
 */
#ifndef HEADS_WG
#define HEADS_WG 256 /* work-items per work-group */
#endif

__kernel __attribute__((reqd_work_group_size(HEADS_WG, 1, 1)))
void move_heads(__global const float *src, const ulong src_offset,
                __global float *dst, const ulong dst_offset,
                const ulong total, const uint heads, const uint seq, const uint head_dim,
                const ulong row_stride, const int to_head_major)
{
    const ulong packed = get_global_id(0);
    if (packed >= total)
        return;
    const uint j = (uint)(packed % head_dim);
    ulong rest = packed / head_dim;
    const uint l = (uint)(rest % seq);
    rest /= seq;
    const uint h = (uint)(rest % heads);
    const ulong b = rest / heads;
    const ulong strided = (b * seq + l) * row_stride + (ulong)h * head_dim + j;
    if (to_head_major)
        dst[dst_offset + packed] = src[src_offset + strided];
    else
        dst[dst_offset + strided] = src[src_offset + packed];
}

/* dst[b, q, c] = mean over h of src[b, h, q, c]; `plane` = seq_q * seq_k. */
__kernel __attribute__((reqd_work_group_size(HEADS_WG, 1, 1)))
void mean_heads(__global const float *src, const ulong src_offset,
                __global float *dst, const ulong dst_offset,
                const ulong total, const uint heads, const ulong plane)
{
    const ulong i = get_global_id(0);
    if (i >= total)
        return;
    const ulong b = i / plane;
    const ulong within = i % plane;
    __global const float *base = src + src_offset + b * heads * plane + within;
    float sum = 0.0f;
    for (uint h = 0; h < heads; ++h)
        sum += base[h * plane];
    dst[dst_offset + i] = sum / (float)heads;
}
