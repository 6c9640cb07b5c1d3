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


/* Whole float vectors from and to global memory at any float-aligned address: VLOADU_G(n, p),
 * VSTOREU_G(n, v, p) for n = 8, 16. With clang, through a vector type of float alignment (one
 * unaligned load or store): PoCL 3.1 emitted vload16 / vstore16 of global memory that feeds
 * the register transposes below as 128-bit pieces and inserts (matmul.cl's pack_b: 40 % of
 * its instructions). Elsewhere vloadn / vstoren. */
#if defined(__clang__)
typedef float clattn_float8_u __attribute__((ext_vector_type(8), aligned(4)));
typedef float clattn_float16_u __attribute__((ext_vector_type(16), aligned(4)));
#define VLOADU_G_(n, p) (*(__global const clattn_float##n##_u *)(p))
#define VSTOREU_G_(n, v, p) (*(__global clattn_float##n##_u *)(p) = (v))
#else
#define VLOADU_G_(n, p) vload##n(0, (p))
#define VSTOREU_G_(n, v, p) vstore##n((v), 0, (p))
#endif
#define VLOADU_G(n, p) VLOADU_G_(n, p) /* (n expanded first: PACK_TW) */
#define VSTOREU_G(n, v, p) VSTOREU_G_(n, v, p)

/* Transposes in registers: r[0 .. TW-1] hold the rows of a TW x TW block (TW = 16, 8); after,
 * r[i] holds column i. log2(TW) steps each swap the off-diagonal s x s blocks of every
 * 2s x 2s block (s = TW / 2 .. 1): rows i and i + s (bit s of i clear) exchange halves, the
 * lanes with bit s set in row i taking row i + s's lanes s below them. Each exchange is two
 * two-source shuffles (clang: __builtin_shufflevector, one vpermt2ps on AVX-512; other
 * compilers: OpenCL's shuffle2). flash_cpu.cl's K pack and matmul.cl's pack_b use them;
 * always inlined (PoCL 3.1 left plain inline functions as calls, their vectors in memory). */
#if defined(__clang__)
#define TR_SHUF(x, y, n, ...) __builtin_shufflevector((x), (y), __VA_ARGS__)
#else
#define TR_SHUF_(n) uint##n
#define TR_SHUF(x, y, n, ...) shuffle2((x), (y), (TR_SHUF_(n))(__VA_ARGS__))
#endif
#define TR_SWAP(T, n, r, s, LO, HI)                                                                \
    _Pragma("unroll") for (uint i = 0; i < (n); ++i) if ((i & (s)) == 0)                          \
    {                                                                                             \
        const T a = r[i], b = r[i + (s)];                                                         \
        r[i] = TR_SHUF(a, b, n, LO);                                                              \
        r[i + (s)] = TR_SHUF(a, b, n, HI);                                                        \
    }
/* the shuffles' lane lists: TR<width>_<s>_LO for row i, _HI for row i + s */
#define TR16_8_LO 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define TR16_8_HI 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define TR16_4_LO 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define TR16_4_HI 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define TR16_2_LO 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define TR16_2_HI 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define TR16_1_LO 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define TR16_1_HI 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
#define TR8_4_LO 0, 1, 2, 3, 8, 9, 10, 11
#define TR8_4_HI 4, 5, 6, 7, 12, 13, 14, 15
#define TR8_2_LO 0, 1, 8, 9, 4, 5, 12, 13
#define TR8_2_HI 2, 3, 10, 11, 6, 7, 14, 15
#define TR8_1_LO 0, 8, 2, 10, 4, 12, 6, 14
#define TR8_1_HI 1, 9, 3, 11, 5, 13, 7, 15
__attribute__((always_inline)) inline void transpose16(float16 *r)
{
    TR_SWAP(float16, 16, r, 8, TR16_8_LO, TR16_8_HI)
    TR_SWAP(float16, 16, r, 4, TR16_4_LO, TR16_4_HI)
    TR_SWAP(float16, 16, r, 2, TR16_2_LO, TR16_2_HI)
    TR_SWAP(float16, 16, r, 1, TR16_1_LO, TR16_1_HI)
}
__attribute__((always_inline)) inline void transpose8(float8 *r)
{
    TR_SWAP(float8, 8, r, 4, TR8_4_LO, TR8_4_HI)
    TR_SWAP(float8, 8, r, 2, TR8_2_LO, TR8_2_HI)
    TR_SWAP(float8, 8, r, 1, TR8_1_LO, TR8_1_HI)
}

#endif
