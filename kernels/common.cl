/*
 * common.cl: definitions shared by every clattn kernel. It is prepended to each kernel source
 * when a program is built, so it holds only macros and small inline helpers.
 *
 * Index convention: every tensor is row-major float32 in a __global buffer; the host passes a
 * base offset in elements (ulong) so that callers' sub-ranges need no sub-buffers.
 */
#ifndef CLATTN_COMMON_CL
#define CLATTN_COMMON_CL

/* The sentinel for a masked score. exp(NEG_INF - m) == 0 for any finite m. */
#define NEG_INF (-INFINITY)

/* Reduces `value` over a work-group of `size` work-items (a power of two) through `scratch`
 * (at least `size` floats of local memory). Every work-item of the group must call it; every
 * work-item gets the result. OpenCL 1.2 has no work-group collectives, hence the tree. */
inline float wg_reduce_max(__local float *scratch, float value, uint lid, uint size)
{
    scratch[lid] = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint span = size / 2; span > 0; span /= 2) {
        if (lid < span)
            scratch[lid] = fmax(scratch[lid], scratch[lid + span]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float result = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE); /* scratch is reused by the caller's next reduction */
    return result;
}

inline float wg_reduce_sum(__local float *scratch, float value, uint lid, uint size)
{
    scratch[lid] = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint span = size / 2; span > 0; span /= 2) {
        if (lid < span)
            scratch[lid] += scratch[lid + span];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float result = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return result;
}

/* The angle pos * w reduced to about [-pi, pi] + 1 for sin and cos, accurate to a few 1e-7
 * rad for every pos < 2^24 (positional encodings, rotary embeddings). w is given as a float
 * pair (hi, lo), hi + lo = w to about 2^-48 (computed in double on the host). A float product
 * would carry |pos * w| * 2^-24 of error (0.004 rad at pos = 65536, 0.5 near 2^24); instead
 * the product is kept as a + t (t: fma's exact error term, plus pos * lo) and the multiple k
 * of 2 pi is taken off a in three fma steps against 2 pi split into three floats (Cody-Waite:
 * k * hi cancels a's leading bits, so the first step is exact), t added last. */
#define TWO_PI_HI 6.28318548202514648438f
#define TWO_PI_MID -1.74845553146951715462e-7f
#define TWO_PI_LO -6.8604980400e-15f
#define INV_TWO_PI 0.159154943091895335769f

inline float position_angle(const ulong pos, const float2 w)
{
    const float p = (float)pos; /* exact below 2^24 */
    const float a = p * w.x;
    const float t = fma(p, w.x, -a) + p * w.y;
    const float k = rint(a * INV_TWO_PI);
    float r = fma(-k, TWO_PI_HI, a);
    r = fma(-k, TWO_PI_MID, r);
    return fma(-k, TWO_PI_LO, r) + t;
}

/* exp on 16 floats for x <= 0 (what softmax takes; flash_cpu.cl, flash_bwd.cl): exp(-inf) = 0,
 * NaN stays NaN. Cephes' expf: n = round(x / ln 2) by adding 1.5 * 2^23 (the rounding the
 * float add does; PoCL's rint() is a slow branchy call), x - n ln 2 in two parts, a degree-7
 * polynomial, times 2^n built in the exponent bits. Below -87 (weights under 2^-125 of the
 * row's largest) it gives 0: no subnormal scale is needed. Within 2 ulp of exp on [-87, 0]. */
inline float16 exp16_nonpositive(const float16 x)
{
    /* (x < -87 is false for NaN: it runs through and comes out NaN; one compare, no fmax, whose
     * NaN rule costs four instructions on x86) */
    const int16 under = x < (float16)(-87.0f);
    const float16 xc = select(x, (float16)(-87.0f), under);
    const float16 t = fma(xc, (float16)(1.44269504088896341f), (float16)(12582912.0f));
    const float16 n = t - (float16)(12582912.0f);
    float16 r = fma(n, (float16)(-0.693359375f), xc);
    r = fma(n, (float16)(2.12194440e-4f), r);
    float16 y = (float16)(1.9875691500e-4f);
    y = fma(y, r, (float16)(1.3981999507e-3f));
    y = fma(y, r, (float16)(8.3334519073e-3f));
    y = fma(y, r, (float16)(4.1665795894e-2f));
    y = fma(y, r, (float16)(1.6666665459e-1f));
    y = fma(y, r, (float16)(5.0000001201e-1f));
    y = fma(y, r * r, r + (float16)(1.0f));
    const int16 e = (as_int16(t) - (int16)(0x4B400000 - 127)) << 23;
    return select(y * as_float16(e), (float16)(0.0f), under);
}

#endif
