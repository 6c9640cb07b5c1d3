/*
 * posenc.cl: positional encodings, added to the rows of a tensor or written out alone.
 *
 *   out[a, b, p, i] = x[a, b, p, i] + PE(start + p, i)      (without x: out = PE)
 *
 *   sinusoidal (Attention Is All You Need), w_k = base^(-2k / dim):
 *     PE(pos, 2k) = sin(pos * w_k),  PE(pos, 2k + 1) = cos(pos * w_k)   (odd dim: the last
 *     column is a sine)
 *   table (learned): PE(pos, i) = table[pos, i]
 *
 * x, out: 4-d views (leading dims of 1 for rank 2 or 3), dtypes X_DTYPE and O_DTYPE; the
 * table a (rows, dim) view of dtype T_DTYPE. One work-item per element of out, numbered in
 * (a, b, p, i) order; the global size is rounded up to POSENC_WG and work-items past the end
 * do nothing. out may be x itself (in place): each element is read, then written, by the
 * same work-item.
 *
 * Accuracy of the sinusoid at large positions: pos * w_k in float would carry an absolute
 * error of about |pos * w_k| * 2^-24 (0.004 rad at pos = 65536), before sin sees it. Instead
 * the host gives each w_k as a float pair (hi, lo) (hi + lo = w_k to about 2^-48, computed in
 * double), and common.cl's position_angle keeps the product as a float pair and takes the
 * multiple of 2 pi off in three fma steps, so the reduced angle is within a few 1e-7 rad of
 * the true one for every pos < 2^24; sin and cos of it are the builtins (at most 4 ulp). The
 * tests bound the whole error by 2e-6 up to 2^24 (tests/check_posenc.c).
 * Measured 2026-12-03 (tests/resources/run.sh: clang 15 + libclc, ptxas -arch=sm_90),
 * POSENC_WG 256, float32: 28 registers, no stack or spills (gfx90a: 19 VGPRs).
 */
#ifndef POSENC_WG
#define POSENC_WG 256 /* work-items per work-group */
#endif
#ifndef T_DTYPE
#define T_DTYPE 0 /* dtype code of the table */
#endif

/* The sinusoid's column i at position pos (common.cl's position_angle). */
inline float sinusoid(const ulong pos, const float2 w, const uint i)
{
    const float r = position_angle(pos, w);
    return (i & 1u) ? cos(r) : sin(r);
}

__kernel __attribute__((reqd_work_group_size(POSENC_WG, 1, 1)))
void posenc_add(__global const ELEM_T(X_DTYPE) *x, __global ELEM_T(O_DTYPE) *out,
                __global const ELEM_T(T_DTYPE) *table, __global const float2 *freq,
                const clattn_posenc_params params)
{
    CLATTN_UNPACK(CLATTN_POSENC_PARAMS)
    const ulong index = get_global_id(0);
    if (index >= total)
        return;
    /* Remainders as x - (x / y) * y (no LLVM `freeze` for Oclgrind: see softmax.cl). */
    const ulong row = index / dim;
    const uint i = (uint)(index - row * dim);
    const ulong plane = row / seq;
    const uint p = (uint)(row - plane * seq);
    const ulong a = plane / d1, b = plane - a * d1;
    const ulong pos = start + p;
    const float value = has_table
                            ? LOAD(T_DTYPE, table, table_offset + pos * table_s0 + i * table_s1)
                            : sinusoid(pos, freq[i >> 1], i);
    const float base =
        has_x ? LOAD(X_DTYPE, x, x_offset + a * x_s0 + b * x_s1 + p * x_s2 + i * x_s3) : 0.0f;
    STORE(O_DTYPE, base + value, out,
          out_offset + a * out_s0 + b * out_s1 + p * out_s2 + i * out_s3);
}
