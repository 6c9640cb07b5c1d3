/*
 * softmax.cl: the score rule (score.cl) over rows of raw dot products: for each row
 * (b, h, i) of raw (batch, heads, seq_q, seq_k), float32,
 *
 *   s_c = masked_score(scale * raw[b,h,i,c], ...)   (scale, cap, ALiBi, mask, key padding, band)
 *   softmax: out[b,h,i,c] = exp(s_c - max) / sum exp(s - max)   (max subtracted: no overflow)
 *   relu:    out[b,h,i,c] = relu(s_c) / sum relu(s)
 *   a row with nothing left is written as zeros.
 *   dropout (SCORE_DROPOUT): then out[b,h,i,c] *= its factor (score.cl), the row's columns
 *   again by the work-items that wrote them.
 *
 * raw and out are strided views (element strides; the last stride is 1), float32; out may be
 * raw itself (in place): each element is read and then written by the same work-item, and the
 * last pass reads only out. The mask is a (batch, heads, seq_q, seq_k) view with stride 0 on
 * broadcast dims, dtype MASK_DTYPE; key padding a U8 view with strides for b and c.
 *
 * Two variants of one kernel, chosen by SOFTMAX_VEC (the tuning table's softmax_vec):
 *
 * SOFTMAX_VEC 0 (GPUs): a work-group per row, reduced in local memory.
 *   group g = row = (b * heads + h) * seq_q + i
 *   +---------------------------------------------+
 *   | l0 l1 .. lW-1 | l0 l1 .. lW-1 | ...          |   work-item l: columns l, l + W, ...
 *   +---------------------------------------------+   (W = SOFTMAX_WG), reduced in local memory
 *   Measured 2026-12-03 (tests/resources/run.sh: clang 15 + libclc, ptxas -arch=sm_90) at
 *   SOFTMAX_WG 256: 49-50 registers, 1024 B of local memory, no stack, no spills (gfx90a: 31-32
 *   VGPRs); score_copy 29 registers.
 *
 * SOFTMAX_VEC 1 (CPUs): a work-item per row, SOFTMAX_ROWS rows per group, the row streamed
 * in float16 vectors (vload16; masks and key padding gathered when their key stride is not 1)
 * and a polynomial exp on those vectors (PoCL's exp is scalar). Three passes over the row, of
 * which only the first comes from memory (a row of 4096 keys is 16 KiB, in L1 for the next):
 * max; exp, store, sum; scale. Keys at and after the band's end are written as zeros without
 * reading raw.
 *   work-item g = row = (b * heads + h) * seq_q + i
 *   +---------------------------------------------+
 *   | c0..c15 | c16..c31 | ...        | tail      |   one work-item, 16 keys a step, then
 *   +---------------------------------------------+   the last seq_k % 16 keys one by one
 */
#ifndef SOFTMAX_VEC
#define SOFTMAX_VEC 0 /* 1: a work-item per row in float16 vectors (CPUs); 0: a group per row */
#endif
#ifndef SOFTMAX_WG
#define SOFTMAX_WG 128 /* SOFTMAX_VEC 0: work-items per row; a power of two */
#endif
#ifndef SOFTMAX_ROWS
#define SOFTMAX_ROWS 4 /* SOFTMAX_VEC 1: rows (work-items) per work-group */
#endif
#ifndef SOFTMAX_F64
#define SOFTMAX_F64 0 /* 1: also softmax_rows_f64 (below; the device has cl_khr_fp64) */
#endif
#if SOFTMAX_VEC
#define SOFTMAX_GROUP SOFTMAX_ROWS
#else
#define SOFTMAX_GROUP SOFTMAX_WG
#endif

/* The score of column c of the row (masked_score's rule, reading raw only for kept keys). */
inline float row_score(__global const float *raw, const uint c, const float scale,
                       const float softcap, const key_band band, const uint row,
                       const uint key_begin, const uint key_end,
                       const int has_mask, __global const ELEM_T(MASK_DTYPE) *mask,
                       const ulong mask_s3, const int has_key_padding,
                       __global const uchar *key_padding, const ulong key_padding_s1)
{
    if (key_masked(c, key_begin, key_end,
                   key_padded(has_key_padding, key_padding, c * key_padding_s1)) ||
        !flex_keep(band, row, c))
        return NEG_INF;
    return add_mask(score_value(scale * raw[c], softcap, band, row, c), has_mask, mask,
                    c * mask_s3);
}

#if SOFTMAX_VEC
/* exp(x) on float vectors (Cephes' expf): x = k ln 2 + r, |r| <= ln 2 / 2, k rounded by adding
 * 1.5 * 2^23 (PoCL's rint() is a slow branchy call), a degree-6 polynomial for exp(r), 2^k put
 * into the exponent bits. Within 2 ulp; exp(0) = 1 exactly; x <= -88 (and -inf) gives 0 (k =
 * -127: exponent bits 0; results below 2^-126 are flushed); NaN stays NaN. For x <= 88. */
#define EXP_POLY(n)                                                                               \
    inline float##n exp_poly##n(float##n x)                                                       \
    {                                                                                             \
        const float##n magic = (float##n)(12582912.0f);                                           \
        x = select(x, (float##n)(-88.0f), x < (float##n)(-88.0f));                                \
        const float##n t = fma(x, (float##n)(1.44269504088896341f), magic);                       \
        const float##n k = t - magic;                                                             \
        float##n r = fma(k, (float##n)(-0.693359375f), x);                                        \
        r = fma(k, (float##n)(2.12194440e-4f), r);                                                \
        float##n p = fma((float##n)(1.9875691500e-4f), r, (float##n)(1.3981999507e-3f));          \
        p = fma(p, r, (float##n)(8.3334519073e-3f));                                              \
        p = fma(p, r, (float##n)(4.1665795894e-2f));                                              \
        p = fma(p, r, (float##n)(1.6666665459e-1f));                                              \
        p = fma(p, r, (float##n)(5.0000001201e-1f));                                              \
        const float##n y = fma(p, r * r, r) + (float##n)(1.0f);                                   \
        /* t's low mantissa bits hold k: 2^k = (k + 127) << 23 as float bits */                   \
        return y * as_float##n((as_int##n(t) - (0x4b400000 - 127)) << 23);                        \
    }
EXP_POLY()
EXP_POLY(16)
#undef EXP_POLY

inline float max16(const float16 v)
{
    const float8 a = fmax(v.lo, v.hi);
    const float4 b = fmax(a.lo, a.hi);
    return fmax(fmax(b.x, b.y), fmax(b.z, b.w));
}

inline float sum16(const float16 v)
{
    const float8 a = v.lo + v.hi;
    const float4 b = a.lo + a.hi;
    return (b.x + b.y) + (b.z + b.w);
}

/* The scores of keys c .. c + 15 of the row, every one of them before key_end (the rule of
 * row_score): one vector load of raw; the mask and the key padding are vector loads when their
 * key stride is 1, else gathered element by element (stride 0: a broadcast key dim). Unlike
 * row_score it reads raw and the mask at padded keys too (in the row; the result is -inf), and
 * keys before key_begin (a sliding window's left edge) come out -inf. */
inline float16 row_scores16(__global const float *raw, const uint c, const float scale,
                            const float softcap, const key_band band, const uint row,
                            const uint key_begin, const int has_mask,
                            __global const ELEM_T(MASK_DTYPE) *mask, const ulong mask_s3,
                            const int has_key_padding, __global const uchar *key_padding,
                            const ulong key_padding_s1)
{
    float16 s = score_value16(scale * vload16(0, raw + c), softcap, band, row, c);
    if (c < key_begin) {
        const int16 lane = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        s = select(s, (float16)(NEG_INF), (int16)((int)c) + lane < (int16)((int)key_begin));
    }
    if (has_mask) {
        float16 term;
        if (mask_s3 == 1) {
#if MASK_DTYPE == DTYPE_U8
            term = select((float16)(0.0f), (float16)(NEG_INF),
                          convert_int16(vload16(0, mask + c)) == 0);
#else
            term = LOAD16(MASK_DTYPE, mask, c);
#endif
        } else {
            float gathered[16];
#pragma unroll
            for (uint j = 0; j < 16; ++j)
                gathered[j] = mask_term(mask, (ulong)(c + j) * mask_s3);
            term = vload16(0, gathered);
        }
        s += term;
    }
    if (has_key_padding) {
        uchar16 padding;
        if (key_padding_s1 == 1) {
            padding = vload16(0, key_padding + c);
        } else {
            uchar gathered[16];
#pragma unroll
            for (uint j = 0; j < 16; ++j)
                gathered[j] = key_padding[(ulong)(c + j) * key_padding_s1];
            padding = vload16(0, gathered);
        }
        s = select(s, (float16)(NEG_INF), convert_int16(padding) != 0);
    }
    s = flex_keep16(band, s, row, c); /* the user's mask_mod (score.cl) */
    return s;
}

/* One row by one work-item: keys [0, vec_end) in vectors of 16, [vec_end, key_end) one by one,
 * [key_end, seq_k) zeros (outside the band: raw is not read there); keys before key_begin
 * come out 0 through their -inf scores. Always inlined, so that a call with has_mask and
 * has_key_padding 0 compiles to loops without their tests. */
__attribute__((always_inline)) inline void
softmax_row_vec(__global const float *raw, __global float *out, const float scale,
                const float softcap, const key_band band, const uint row, const uint key_begin, const uint key_end, const uint seq_k,
                const int has_mask,
                __global const ELEM_T(MASK_DTYPE) *mask, const ulong mask_s3,
                const int has_key_padding, __global const uchar *key_padding,
                const ulong key_padding_s1, const int norm_relu, const float sink)
{
#define SCORES16(c)                                                                               \
    row_scores16(raw, (c), scale, softcap, band, row, key_begin, has_mask, mask, mask_s3,         \
                 has_key_padding, key_padding, key_padding_s1)
#define SCORE(c)                                                                                  \
    row_score(raw, (c), scale, softcap, band, row, key_begin, key_end, has_mask, mask, mask_s3,  \
              has_key_padding, key_padding, key_padding_s1)
    const uint vec_end = key_end - key_end % 16;
    float inv;
    if (norm_relu) {
        float16 sums = 0.0f;
        for (uint c = 0; c < vec_end; c += 16)
            sums += fmax(SCORES16(c), 0.0f);
        float total = sum16(sums);
        for (uint c = vec_end; c < key_end; ++c)
            total += relu_weight(SCORE(c));
        inv = inverse_total(total);
        for (uint c = 0; c < vec_end; c += 16)
            vstore16(fmax(SCORES16(c), 0.0f) * inv, 0, out + c);
        for (uint c = vec_end; c < key_end; ++c)
            out[c] = relu_weight(SCORE(c)) * inv;
    } else {
        /* max, not fmax: no NaN test per lane (a row with a NaN score comes out NaN either
         * way: its sum is NaN, and so is inverse_total's factor) */
        float16 maxima = NEG_INF;
        for (uint c = 0; c < vec_end; c += 16)
            maxima = max(maxima, SCORES16(c));
        float row_max = max16(maxima);
        for (uint c = vec_end; c < key_end; ++c)
            row_max = fmax(row_max, SCORE(c));
        row_max = fmax(row_max, sink); /* attention sinks (score.cl); -inf: none */
        const float shift = softmax_shift(row_max);
        /* exp once per element: keep the numerators in out, then scale them. */
        float16 sums = 0.0f;
        for (uint c = 0; c < vec_end; c += 16) {
            const float16 e = exp_poly16(SCORES16(c) - shift);
            vstore16(e, 0, out + c);
            sums += e;
        }
        float total = sum16(sums) + (sink != NEG_INF ? exp(sink - shift) : 0.0f); /* the sink */
        for (uint c = vec_end; c < key_end; ++c) {
            const float e = exp_poly(SCORE(c) - shift);
            out[c] = e;
            total += e;
        }
        inv = inverse_total(total);
        for (uint c = 0; c < vec_end; c += 16)
            vstore16(vload16(0, out + c) * inv, 0, out + c);
        for (uint c = vec_end; c < key_end; ++c)
            out[c] *= inv;
    }
    uint c = key_end;
    for (; c + 16 <= seq_k; c += 16)
        vstore16((float16)(0.0f), 0, out + c);
    for (; c < seq_k; ++c)
        out[c] = 0.0f;
#undef SCORES16
#undef SCORE
}
#endif

/* Dropout (score.cl's SCORE_DROPOUT) on a finished row of weights: out[c] for c = first,
 * first + step, .. (the columns this work-item wrote) times their factors of stream bh and
 * row i; a work-item with the whole row (step 1) takes 64 keys at a time. */
#if SCORE_DROPOUT
#define DROPOUT_ROW(first, step)                                                                  \
    do {                                                                                          \
        uint c = (first);                                                                         \
        if ((step) == 1) {                                                                        \
            for (; c + 64 <= seq_k; c += 64) {                                                    \
                float16 f[4];                                                                     \
                DROPOUT64_OF(bh, i, c, f);                                                        \
                for (uint v = 0; v < 4; ++v)                                                      \
                    vstore16(vload16(v, out + c) * f[v], v, out + c);                             \
            }                                                                                     \
        }                                                                                         \
        for (; c < seq_k; c += (step))                                                            \
            out[c] *= DROPOUT_OF(bh, i, c);                                                       \
    } while (0)
#else
#define DROPOUT_ROW(first, step) ((void)0)
#endif

/* The row open of the softmax kernels (score.cl's contract): row `row` of the (b, h, i) rows,
 * its batch, head and row index, raw, out, mask and key padding advanced to it, its band
 * (the rule's row open) and key range. Remainders as x - (x / y) * y: a division and
 * remainder of the same operands become an LLVM `freeze`, which Oclgrind's --uninitialized
 * checker cannot run. */
#define SOFTMAX_ROW_OPEN(row)                                                                     \
    const ulong bh = (row) / seq_q;                                                               \
    const uint i = (uint)((row) - bh * seq_q);                                                    \
    const ulong b = bh / heads, h = bh - b * heads;                                               \
    raw += raw_offset + b * raw_s0 + h * raw_s1 + i * raw_s2;                                     \
    out += out_offset + b * out_s0 + h * out_s1 + i * out_s2;                                     \
    if (has_mask)                                                                                 \
        mask += mask_offset + b * mask_s0 + h * mask_s1 + i * mask_s2;                            \
    if (has_key_padding)                                                                          \
        key_padding += key_padding_offset + b * key_padding_s0;                                   \
    const key_band band = BAND_OF(b, h);                                                          \
    const uint key_begin = band_begin(band, i), key_end = band_end(band, i);

/* CLATTN_FAULT_WRONG (types.cl): the first row's first weight off by one, written by the
 * work-item that wrote it. */
#ifdef CLATTN_FAULT_WRONG
#define FAULT_ROW(owner)                                                                          \
    if (row == 0 && (owner))                                                                      \
        out[0] += 1.0f;
#else
#define FAULT_ROW(owner)
#endif

__kernel __attribute__((reqd_work_group_size(SOFTMAX_GROUP, 1, 1)))
void softmax_rows(__global const float *raw, __global float *out,
                  __global const ELEM_T(MASK_DTYPE) *mask, __global const uchar *key_padding,
                  SCORE_BUFFERS, const clattn_softmax_params params)
{
    CLATTN_UNPACK_SCORED(CLATTN_SOFTMAX_PARAMS)
#if SOFTMAX_VEC
    /* No barriers here: the work-items past the last row leave at once. */
    const ulong row = get_global_id(0);
    if (row >= rows)
        return;
#else
    __local float scratch[SOFTMAX_WG];
    const uint lid = get_local_id(0);
    const ulong row = get_group_id(0); /* the grid holds exactly `rows` groups */
#endif
    SOFTMAX_ROW_OPEN(row)
    const float sink = SINK_OF(h, i); /* attention sinks (score.cl); -inf: none */
#if SOFTMAX_VEC
    if (has_mask || has_key_padding)
        softmax_row_vec(raw, out, scale, softcap, band, i, key_begin, key_end, seq_k, has_mask,
                        mask, mask_s3, has_key_padding, key_padding, key_padding_s1, norm_relu,
                        sink);
    else
        softmax_row_vec(raw, out, scale, softcap, band, i, key_begin, key_end, seq_k, 0, mask, 0,
                        0, key_padding, 0, norm_relu, sink);
    DROPOUT_ROW(0, 1);
    FAULT_ROW(1);
#else
#define SCORE(c)                                                                                  \
    row_score(raw, (c), scale, softcap, band, i, key_begin, key_end, has_mask, mask, mask_s3,    \
              has_key_padding, key_padding, key_padding_s1)

    /* norm_relu is uniform over the group: every work-item meets the same barriers. */
    if (norm_relu) {
        float partial = 0.0f;
        for (uint c = lid; c < seq_k; c += SOFTMAX_WG)
            partial += relu_weight(SCORE(c));
        const float inv = inverse_total(wg_reduce_sum(scratch, partial, lid, SOFTMAX_WG));
        for (uint c = lid; c < seq_k; c += SOFTMAX_WG)
            out[c] = relu_weight(SCORE(c)) * inv;
        DROPOUT_ROW(lid, SOFTMAX_WG);
        FAULT_ROW(lid == 0);
        return;
    }

    float partial_max = NEG_INF;
    for (uint c = lid; c < seq_k; c += SOFTMAX_WG)
        partial_max = fmax(partial_max, SCORE(c));
    const float shift =
        softmax_shift(fmax(wg_reduce_max(scratch, partial_max, lid, SOFTMAX_WG), sink));

    /* exp once per element: keep the numerators in out, then scale them. */
    float partial_sum = 0.0f;
    for (uint c = lid; c < seq_k; c += SOFTMAX_WG) {
        const float e = softmax_weight(SCORE(c), shift);
        out[c] = e;
        partial_sum += e;
    }
    const float inv = inverse_total(wg_reduce_sum(scratch, partial_sum, lid, SOFTMAX_WG) +
                                    (has_sinks ? exp(sink - shift) : 0.0f)); /* the sink's */
    for (uint c = lid; c < seq_k; c += SOFTMAX_WG)
        out[c] *= inv;
    DROPOUT_ROW(lid, SOFTMAX_WG);
        FAULT_ROW(lid == 0);
#undef SCORE
#endif
}

/*
 * score_copy: the scores before normalisation into their own output (ONNX Attention's
 * qk_matmul_output, modes 0 to 2), from the raw dot products:
 *   mode 0: scale * raw          mode 1: cap(scale * raw)
 *   mode 2: the score rule's s: cap(scale * raw) + ALiBi + the mask term, -inf outside the
 *           row's key band or for a padded key (masked_score)
 * One work-item per element, numbered (b, h, i, c) row-major; work-items past the end leave.
 */
__kernel void score_copy(__global const float *raw, __global float *dst,
                  __global const ELEM_T(MASK_DTYPE) *mask, __global const uchar *key_padding,
                  SCORE_BUFFERS, const clattn_softmax_params params)
{
    CLATTN_UNPACK_SCORED(CLATTN_SOFTMAX_PARAMS)
    const ulong index = get_global_id(0);
    if (index >= elements)
        return;
    /* Remainders as x - (x / y) * y (no LLVM `freeze` for Oclgrind, as above). */
    const ulong row = index / seq_k;
    const uint c = (uint)(index - row * seq_k);
    const ulong bh = row / seq_q;
    const uint i = (uint)(row - bh * seq_q);
    const ulong b = bh / heads, h = bh - b * heads;
    float s = scale * raw[raw_offset + b * raw_s0 + h * raw_s1 + i * raw_s2 + c];
    if (mode == 1)
        s = soft_cap(s, softcap);
    if (mode == 2) {
        const key_band band = BAND_OF(b, h);
        const bool padded =
            has_key_padding &&
            key_padding[key_padding_offset + b * key_padding_s0 + c * key_padding_s1] != 0;
        s = score_rule(s, softcap, band, i, c, band_begin(band, i), band_end(band, i), padded,
                       has_mask,
                       mask + (has_mask ? mask_offset + b * mask_s0 + h * mask_s1 + i * mask_s2
                                        : 0),
                       c * mask_s3);
    }
    dst[out_offset + b * out_s0 + h * out_s1 + i * out_s2 + c * out_s3] = s;
}

/*
 * softmax_rows_f64: softmax_rows with the normalisation in double precision (ONNX Attention's
 * softmax_precision = DOUBLE): each score s (float, the score rule as softmax_rows) is widened
 * to double, and the row's max, exp, sum and quotient run in double; the weights are rounded
 * to float once, at the end. One work-item per row, no local memory and no barriers (PoCL 3.1
 * computed wrong sums, and with 128 work-items or more wrote outside its memory, in a
 * work-group reduction of doubles over local memory that Oclgrind ran clean); work-items past
 * the last row leave. Built only with -DSOFTMAX_F64=1, on devices with cl_khr_fp64.
 */
#if SOFTMAX_F64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable

__kernel void softmax_rows_f64(__global const float *raw, __global float *out,
                  __global const ELEM_T(MASK_DTYPE) *mask, __global const uchar *key_padding,
                  SCORE_BUFFERS, const clattn_softmax_params params)
{
    CLATTN_UNPACK_SCORED(CLATTN_SOFTMAX_PARAMS)
    const ulong row = get_global_id(0);
    if (row >= rows)
        return;
    SOFTMAX_ROW_OPEN(row)
#define SCORE64(c)                                                                                \
    ((double)row_score(raw, (c), scale, softcap, band, i, key_begin, key_end, has_mask, mask,    \
                       mask_s3, has_key_padding, key_padding, key_padding_s1))
    if (norm_relu) {
        double total = 0.0;
        for (uint c = 0; c < seq_k; ++c)
            total += fmax(SCORE64(c), 0.0);
        for (uint c = 0; c < seq_k; ++c)
            out[c] = total == 0.0 ? 0.0f : (float)(fmax(SCORE64(c), 0.0) / total);
        DROPOUT_ROW(0, 1);
    FAULT_ROW(1);
        return;
    }
    const double sink = (double)SINK_OF(h, i); /* attention sinks (score.cl); -inf: none */
    double row_max = sink;
    for (uint c = 0; c < seq_k; ++c)
        row_max = fmax(row_max, SCORE64(c));
    const double shift = row_max == -INFINITY ? 0.0 : row_max;
    double total = exp(sink - shift);
    for (uint c = 0; c < seq_k; ++c)
        total += exp(SCORE64(c) - shift);
    for (uint c = 0; c < seq_k; ++c)
        out[c] = total == 0.0 ? 0.0f : (float)(exp(SCORE64(c) - shift) / total);
    DROPOUT_ROW(0, 1);
    FAULT_ROW(1);
#undef SCORE64
}
#endif
