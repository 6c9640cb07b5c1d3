/*
 * types.cl: element types of tensors in device memory, and float loads and stores of them.
 * Prepended to every kernel source (after common.cl). Kernels compute in float; a tensor's
 * dtype only changes how its elements are read and written.
 *
 *   code  dtype  storage (ELEM_T)  load                       store
 *   0     F32    float             p[i]                       p[i] = v
 *   1     F16    half              vload_half                 vstore_half_rte
 *   2     BF16   ushort            upper 16 bits of a float   round to nearest even, NaN kept
 *   3     U8     uchar             (float)p[i]                saturated, rounded to nearest
 *   5     Q8_0   uchar (bytes)     d * q                      (quantizer: heads.cl)
 *   6     Q4_0   uchar (bytes)     (q - 8) * d                (quantizer: heads.cl)
 *   7     FP8_E4M3  uchar          decode(code)               encode, RNE, saturating
 *   8     FP8_E5M2  uchar          decode(code)               encode, RNE, saturating
 *
 * Q8_0 and Q4_0 are llama.cpp's (ggml's) block formats, byte for byte: every 32 consecutive
 * elements along a row form a block, an fp16 scale d then 32 int8 (34 bytes) or 16 bytes of
 * nibbles, element j in the low nibble of byte j and element j + 16 in its high one (18
 * bytes). Their elements are still numbered as elements (offsets and strides are multiples
 * of 32, rows are whole blocks): element i lies in block i / 32. Pointer arithmetic on such a
 * tensor goes through ADVANCE(code, p, i) (p + i for the other types), and only loads exist
 * (LOAD, LOADn with i a multiple of n: n elements of one block).
 *
 * FP8_E4M3 and FP8_E5M2 are the OCP 8-bit floats, one byte an element (torch.float8_e4m3fn:
 * bias 7, no infinities, 0x7f / 0xff NaN, max 448; torch.float8_e5m2: bias 15, IEEE-like, max
 * 57344). Their loads decode the code exactly (integer arithmetic: OpenCL C 1.2 has no fp8
 * type); the per-tensor scale of vLLM's fp8 cache is applied by the kernels, not here.
 *
 * The codes match clattn_dtype (include/clattn.h). A kernel takes a tensor's dtype as a -D
 * number, e.g. -DQ_DTYPE=1, and writes
 *
 *   __global const ELEM_T(Q_DTYPE) *Q;   float x = LOAD(Q_DTYPE, Q, i);
 *
 * LOADn / STOREn (n = 4, 8, 16) move elements i .. i+n-1 as a floatn (no alignment needed
 * beyond the element's own). half appears only as pointer storage, so cl_khr_fp16 is not
 * needed (OpenCL C 1.2).
 */
#ifndef CLATTN_TYPES_CL
#define CLATTN_TYPES_CL

#define DTYPE_F32 0
#define DTYPE_F16 1
#define DTYPE_BF16 2
#define DTYPE_U8 3
#define DTYPE_Q8_0 5
#define DTYPE_Q4_0 6
#define DTYPE_FP8_E4M3 7
#define DTYPE_FP8_E5M2 8
#define IS_FP8(code) ((code) == DTYPE_FP8_E4M3 || (code) == DTYPE_FP8_E5M2)

/* The kernels' operand dtypes, 0 (F32) unless built with others: the attention kernels' q, k,
 * v and out (flash*.cl, flash_bwd*.cl; out also posenc.cl's and rope.cl's) */
#ifndef Q_DTYPE
#define Q_DTYPE 0
#endif
#ifndef K_DTYPE
#define K_DTYPE 0
#endif
#ifndef V_DTYPE
#define V_DTYPE 0
#endif
#ifndef O_DTYPE
#define O_DTYPE 0
#endif
/* ... and of the positional kernels' input x (posenc.cl, rope.cl) */
#ifndef X_DTYPE
#define X_DTYPE 0
#endif

/* The fused kernels' output factor: FP8 values' per-tensor scale (the flash struct's v_scale,
 * folded into the row's normalisation and taken out again where a later key part resumes
 * it), else a constant 1 that compiles away. */
#if IS_FP8(V_DTYPE)
#define FLASH_V_SCALE v_scale
#else
#define FLASH_V_SCALE 1.0f
#endif

/* Two levels, so that a code given as a macro (Q_DTYPE) is expanded before pasting. */
#define ELEM_T(code) ELEM_T_(code)
#define ELEM_T_(code) ELEM_T_##code
#define ELEM_T_0 float
#define ELEM_T_1 half
#define ELEM_T_2 ushort
#define ELEM_T_3 uchar
#define ELEM_T_5 uchar
#define ELEM_T_6 uchar
#define ELEM_T_7 uchar
#define ELEM_T_8 uchar

/* Bytes per 32-element block of the block types. */
#define Q8_0_BYTES 34
#define Q4_0_BYTES 18

/* p advanced by i elements (i a multiple of 32 for the block types). */
#define ADVANCE(code, p, i) ADVANCE_(code, p, i)
#define ADVANCE_(code, p, i) ADVANCE_##code(p, i)
#define ADVANCE_0(p, i) ((p) + (i))
#define ADVANCE_1(p, i) ((p) + (i))
#define ADVANCE_2(p, i) ((p) + (i))
#define ADVANCE_3(p, i) ((p) + (i))
#define ADVANCE_5(p, i) ((p) + ((i) >> 5) * Q8_0_BYTES)
#define ADVANCE_6(p, i) ((p) + ((i) >> 5) * Q4_0_BYTES)
#define ADVANCE_7(p, i) ((p) + (i))
#define ADVANCE_8(p, i) ((p) + (i))

/* The block's scale (fp16 at its first byte; blocks are 2-byte aligned: 34 and 18 are even),
 * converted in integer arithmetic: PoCL's scalar vload_half was half of a q8_0 decode step's
 * time. Exact for every half: subnormals as mantissa * 2^-24 (no float denormal, which a
 * flush-to-zero device would drop), infinities and NaNs kept. */
inline float q_scale(__global const uchar *block)
{
    const uint h = *(__global const ushort *)block;
    const uint bits = (h & 0x7fffu) << 13, exponent = h & 0x7c00u;
    float magnitude = as_float(bits + (112u << 23));                            /* normal */
    magnitude = exponent == 0u ? (float)(h & 1023u) * 0x1p-24f : magnitude;     /* subnormal */
    magnitude = exponent == 0x7c00u ? as_float(bits | 0x7f800000u) : magnitude; /* inf, NaN */
    return as_float(as_uint(magnitude) | ((h & 0x8000u) << 16));
}

inline float load_q8_0(__global const uchar *p, const ulong i)
{
    __global const uchar *block = p + (i >> 5) * Q8_0_BYTES;
    return q_scale(block) * (float)as_char(block[2 + (i & 31)]);
}

inline float load_q4_0(__global const uchar *p, const ulong i)
{
    __global const uchar *block = p + (i >> 5) * Q4_0_BYTES;
    const uint j = (uint)(i & 31);
    const uint byte = block[2 + (j & 15)];
    return q_scale(block) * (float)((int)(j < 16 ? byte & 15u : byte >> 4) - 8);
}

/* n elements i .. i + n - 1 (i a multiple of n, n <= 16: inside one block) */
#define LOADN_5(n, p, i) load_q8_0_##n((p), (i))
#define LOADN_6(n, p, i) load_q4_0_##n((p), (i))
#define LOAD_QN(n)                                                                             \
    inline float##n load_q8_0_##n(__global const uchar *p, const ulong i)                      \
    {                                                                                          \
        __global const uchar *block = p + (i >> 5) * Q8_0_BYTES;                               \
        return q_scale(block) *                                                                \
               convert_float##n(as_char##n(vload##n(0, block + 2 + (i & 31))));               \
    }                                                                                          \
    inline float##n load_q4_0_##n(__global const uchar *p, const ulong i)                      \
    {                                                                                          \
        __global const uchar *block = p + (i >> 5) * Q4_0_BYTES;                               \
        const uint j = (uint)(i & 31);                                                         \
        const uint##n bytes = convert_uint##n(vload##n(0, block + 2 + (j & 15)));              \
        const uint##n nib = j < 16 ? bytes & 15u : bytes >> 4;                                 \
        return q_scale(block) * convert_float##n(as_int##n(nib) - 8);                          \
    }
LOAD_QN(4)
LOAD_QN(8)
LOAD_QN(16)

/* A whole block (elements i .. i + 31, i a multiple of 32) as two float16, its scale read
 * once and q4_0's bytes once: what the CPU decode's in-place reads take for the block types. */
inline void load_q8_0_32(__global const uchar *p, const ulong i, float16 *lo, float16 *hi)
{
    __global const uchar *block = p + (i >> 5) * Q8_0_BYTES;
    const float d = q_scale(block);
    *lo = d * convert_float16(as_char16(vload16(0, block + 2)));
    *hi = d * convert_float16(as_char16(vload16(0, block + 18)));
}

inline void load_q4_0_32(__global const uchar *p, const ulong i, float16 *lo, float16 *hi)
{
    __global const uchar *block = p + (i >> 5) * Q4_0_BYTES;
    const float d = q_scale(block);
    const int16 bytes = convert_int16(vload16(0, block + 2));
    *lo = d * convert_float16((bytes & 15) - 8);
    *hi = d * convert_float16((bytes >> 4) - 8);
}

#define IS_BLOCK(code) ((code) == DTYPE_Q8_0 || (code) == DTYPE_Q4_0)
/* LOAD32(code, p, i, lo, hi): the block at element i of a block type (lo, hi: float16 *) */
#define LOAD32(code, p, i, lo, hi) LOAD32_(code, p, i, lo, hi)
#define LOAD32_(code, p, i, lo, hi) LOAD32_##code(p, i, lo, hi)
#define LOAD32_5(p, i, lo, hi) load_q8_0_32((p), (i), (lo), (hi))
#define LOAD32_6(p, i, lo, hi) load_q4_0_32((p), (i), (lo), (hi))

/* FP8 codes to float, exact for all 256 codes of each format. The magnitude bits shifted
 * into a float's exponent and mantissa and the exponent rebiased give every normal code;
 * subnormal codes are m * 2^-9 (e4m3) or m * 2^-16 (e5m2), computed as such (no float
 * denormal, which a flush-to-zero device would drop); e4m3's 0x7f and e5m2's exponent 31
 * are NaN (and e5m2's infinities) with the sign kept. */
inline float fp8_e4m3(const uint code)
{
    const uint mag = code & 0x7fu;
    float x = as_float((mag << 20) + (120u << 23));
    x = mag < 8u ? (float)mag * 0x1p-9f : x;
    x = mag == 0x7fu ? as_float(0x7fc00000u) : x;
    return as_float(as_uint(x) | ((code & 0x80u) << 24));
}

inline float fp8_e5m2(const uint code)
{
    const uint mag = code & 0x7fu;
    float x = as_float((mag << 21) + (112u << 23));
    x = mag < 4u ? (float)mag * 0x1p-16f : x;
    x = mag >= 0x7cu ? as_float((mag << 21) | 0x7f800000u) : x;
    return as_float(as_uint(x) | ((code & 0x80u) << 24));
}

/* n codes at once (LOADn): as halves, whose conversion to float is one vector instruction on
 * CPUs (F16C) and exact everywhere (half subnormals become normal floats). e5m2 is the upper
 * byte of a half. e4m3 goes to S EEEE MMM -> S 0EEEE MMM0000000 (a half 2^-8 times the
 * value: the code sign-extended and shifted by 7, its copy of the sign at bit 14 cleared),
 * and its NaN code (EEEE MMM all ones) gets the half's top exponent bit too, making a NaN
 * without a select. Measured on PoCL (AVX-512), decode at 4096 keys: e5m2 0.58 -> 0.38 ms
 * against the integer form above. */
#define FP8_DECODE_N(n)                                                                        \
    inline float##n fp8_e5m2_##n(const uchar##n code)                                          \
    {                                                                                          \
        const ushort##n h = convert_ushort##n(code) << (ushort)8;                              \
        return vload_half##n(0, (const half *)&h);                                             \
    }                                                                                          \
    inline float##n fp8_e4m3_##n(const uchar##n code)                                          \
    {                                                                                          \
        ushort##n h = as_ushort##n(convert_short##n(as_char##n(code)) << (short)7) &           \
                      (ushort)0xbf80;                                                          \
        h |= ((h & (ushort)0x3f80) + (ushort)0x80) & (ushort)0x4000;                           \
        return vload_half##n(0, (const half *)&h) * 256.0f;                                    \
    }
FP8_DECODE_N(4)
FP8_DECODE_N(8)
FP8_DECODE_N(16)

/* float -> FP8 code (clattn_quantize, the KV cache's appends): round to nearest even, a
 * finite value past the largest finite one saturated to it (+-448, +-57344: vLLM's clamp
 * before its cast), infinities to +-448 in e4m3 (it has none) and kept in e5m2, NaN to a
 * NaN code (0x7f, sign kept). Normal codes round the float's bits (the carry into the
 * exponent is the next binade), subnormal ones |x| * 2^9 or 2^16 to an integer. */
inline uchar fp8_encode(const float value, const uint mbits, const uint bias, const uint max_code)
{
    const uint sign = (as_uint(value) >> 24) & 0x80u, magnitude = as_uint(fabs(value));
    if (magnitude > 0x7f800000u) /* NaN */
        return (uchar)(sign | 0x7fu);
    const uint max_bits = ((max_code >> mbits) + 127u - bias) << 23 |
                          (max_code & ((1u << mbits) - 1u)) << (23u - mbits);
    if (magnitude >= max_bits) /* saturated; e5m2 keeps infinities */
        return (uchar)(sign | (magnitude == 0x7f800000u && mbits == 2u ? 0x7cu : max_code));
    if (magnitude < (128u - bias) << 23) /* below the smallest normal code, 2^(1 - bias) */
        return (uchar)(sign | (uint)convert_int_rte(as_float(magnitude) *
                                                     as_float((126u + bias + mbits) << 23)));
    const uint shift = 23u - mbits;
    const uint rounded =
        (magnitude + (1u << (shift - 1u)) - 1u + ((magnitude >> shift) & 1u)) >> shift;
    return (uchar)(sign | (rounded - ((127u - bias) << mbits)));
}
#define FP8_E4M3_FROM(v) fp8_encode((v), 3u, 7u, 0x7eu)
#define FP8_E5M2_FROM(v) fp8_encode((v), 2u, 15u, 0x7bu)

/* float -> bfloat16 bits, rounded to nearest even; a NaN stays a (quiet) NaN. */
inline ushort bf16_from_float(float value)
{
    const uint bits = as_uint(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (ushort)((bits >> 16) | 0x40u);
    return (ushort)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

#define BF16_FROM_FLOATN(n)                                                                    \
    inline ushort##n bf16_from_float##n(float##n value)                                        \
    {                                                                                          \
        const uint##n bits = as_uint##n(value);                                                \
        const uint##n rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;                  \
        const uint##n quiet = (bits >> 16) | 0x40u;                                            \
        return convert_ushort##n(select(rounded, quiet, (bits & 0x7fffffffu) > 0x7f800000u));  \
    }
BF16_FROM_FLOATN(4)
BF16_FROM_FLOATN(8)
BF16_FROM_FLOATN(16)

#define LOAD(code, p, i) LOAD_(code, p, i)
#define LOAD_(code, p, i) LOAD_##code(p, i)
#define LOAD_0(p, i) ((p)[i])
#define LOAD_1(p, i) vload_half((i), (p))
#define LOAD_2(p, i) as_float((uint)(p)[i] << 16)
#define LOAD_3(p, i) ((float)(p)[i])
#define LOAD_5(p, i) load_q8_0((p), (i))
#define LOAD_6(p, i) load_q4_0((p), (i))
#define LOAD_7(p, i) fp8_e4m3((uint)(p)[i])
#define LOAD_8(p, i) fp8_e5m2((uint)(p)[i])

/* CLATTN_FAULT_WRONG: the test switch CLATTN_FAULT_VARIANT=<variant>:wrong builds the variant
 * with element 0 of every store off by one (FAULT, FAULTN), which self-validation (the host's
 * host/core/validate.c) must catch; never set otherwise. */
#ifdef CLATTN_FAULT_WRONG
#define FAULT(v, i) ((i) == 0 ? (v) + 1.0f : (v))
#define FAULTN(n, v, i) fault##n((v), (i))
#define FAULT_VEC(n)                                                                               \
    inline float##n fault##n(float##n v, const ulong i)                                            \
    {                                                                                              \
        v.s0 += i == 0 ? 1.0f : 0.0f;                                                              \
        return v;                                                                                  \
    }
FAULT_VEC(2)
FAULT_VEC(4)
FAULT_VEC(8)
FAULT_VEC(16)
#else
#define FAULT(v, i) (v)
#define FAULTN(n, v, i) (v)
#endif

#define STORE(code, v, p, i) STORE_(code, FAULT(v, i), p, i)
#define STORE_(code, v, p, i) STORE_##code(v, p, i)
#define STORE_0(v, p, i) ((p)[i] = (v))
#define STORE_1(v, p, i) vstore_half_rte((v), (i), (p))
#define STORE_2(v, p, i) ((p)[i] = bf16_from_float(v))
#define STORE_3(v, p, i) ((p)[i] = convert_uchar_sat_rte(v))
#define STORE_7(v, p, i) ((p)[i] = FP8_E4M3_FROM(v))
#define STORE_8(v, p, i) ((p)[i] = FP8_E5M2_FROM(v))

/* Vectors of n elements starting at element i (any i: vloadn at offset 0 of p + i). */
#define LOADN_0(n, p, i) vload##n(0, (p) + (i))
#define LOADN_1(n, p, i) vload_half##n(0, (p) + (i))
#define LOADN_2(n, p, i) as_float##n(convert_uint##n(vload##n(0, (p) + (i))) << 16)
#define LOADN_3(n, p, i) convert_float##n(vload##n(0, (p) + (i)))
#define LOADN_7(n, p, i) fp8_e4m3_##n(vload##n(0, (p) + (i)))
#define LOADN_8(n, p, i) fp8_e5m2_##n(vload##n(0, (p) + (i)))
#define STOREN_0(n, v, p, i) vstore##n((v), 0, (p) + (i))
#define STOREN_1(n, v, p, i) vstore_half##n##_rte((v), 0, (p) + (i))
#define STOREN_2(n, v, p, i) vstore##n(bf16_from_float##n(v), 0, (p) + (i))
#define STOREN_3(n, v, p, i) vstore##n(convert_uchar##n##_sat_rte(v), 0, (p) + (i))

#define LOAD4(code, p, i) LOADN_(code, 4, p, i)
#define LOAD8(code, p, i) LOADN_(code, 8, p, i)
#define LOAD16(code, p, i) LOADN_(code, 16, p, i)
#define LOADN_(code, n, p, i) LOADN__(code, n, p, i)
#define LOADN__(code, n, p, i) LOADN_##code(n, p, i)
#define STORE4(code, v, p, i) STOREN_(code, 4, v, p, i)
#define STORE8(code, v, p, i) STOREN_(code, 8, v, p, i)
#define STORE16(code, v, p, i) STOREN_(code, 16, v, p, i)
#define STOREN_(code, n, v, p, i) STOREN__(code, n, FAULTN(n, v, i), p, i)
#define STOREN__(code, n, v, p, i) STOREN_##code(n, v, p, i)

#endif
