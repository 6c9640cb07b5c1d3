/*
 * heads.cl: attention weights averaged over heads, a strided copy (copy4d, below), the KV
 * cache's append (kv_append) and the decode splits' merge (flash_merge),
 *
 *   dst[b, i, c] = (1 / heads) * sum_h src[b, h, i, c]
 *
 * src a (batch, heads, seq_q, seq_k) float32 view, dst a (batch, seq_q, seq_k) float32 view,
 * both with element strides. One work-item per element of dst, numbered in (b, i, c) order;
 * the global size is rounded up to the work-group size and work-items past the end do nothing.
 *
 * Measured 2026-12-04 (tests/resources/run.sh: clang 15 + libclc, ptxas -arch=sm_90) at
 * HEADS_WG 256, float32: mean_heads 32 registers, copy4d 24, kv_append 28, flash_merge 40; no
 * local memory, stack or spills (gfx90a: 15-31 VGPRs). Indices are split in 32-bit arithmetic
 * below 2^32 elements (box_coords).
 */
#ifndef HEADS_WG
#define HEADS_WG 256 /* work-items per work-group */
#endif

/* index = ((i0 * d1 + i1) * d2 + i2) * d3 + i3 split into its coordinates, in 32-bit
 * arithmetic while the index fits in 32 bits (GPUs divide 64-bit integers in software, tens of
 * instructions per division), in 64-bit past that. Remainders as x - (x / y) * y (see
 * softmax.cl: no LLVM `freeze` for Oclgrind). d1 = 1 serves a 3-d box. */
inline void box_coords(const ulong index, const uint d1, const uint d2, const uint d3, ulong *i0,
                       ulong *i1, ulong *i2, ulong *i3)
{
    if (index <= 0xffffffffUL) {
        const uint x = (uint)index;
        const uint r3 = x / d3, r2 = r3 / d2, q0 = r2 / d1;
        *i3 = x - r3 * d3;
        *i2 = r3 - r2 * d2;
        *i1 = r2 - q0 * d1;
        *i0 = q0;
    } else {
        const ulong r3 = index / d3, r2 = r3 / d2, q0 = r2 / d1;
        *i3 = index - r3 * d3;
        *i2 = r3 - r2 * d2;
        *i1 = r2 - q0 * d1;
        *i0 = q0;
    }
}

__kernel __attribute__((reqd_work_group_size(HEADS_WG, 1, 1)))
void mean_heads(__global const float *src, const ulong src_offset, const ulong src_s0,
                const ulong src_s1, const ulong src_s2, const ulong src_s3,
                __global float *dst, const ulong dst_offset, const ulong dst_s0,
                const ulong dst_s1, const ulong dst_s2,
                const ulong total, const uint heads, const uint seq_q, const uint seq_k)
{
    const ulong index = get_global_id(0);
    if (index >= total)
        return;
    ulong unused, b, i, c;
    box_coords(index, 1, seq_q, seq_k, &b, &unused, &i, &c);
    __global const float *base = src + src_offset + b * src_s0 + i * src_s2 + c * src_s3;
    float sum = 0.0f;
    for (uint h = 0; h < heads; ++h)
        sum += base[h * src_s1];
    dst[dst_offset + b * dst_s0 + i * dst_s1 + c * dst_s2] = FAULT(sum / (float)heads, index);
}

/*
 * copy4d: dst[i0, i1, i2, i3] = src[i0, i1, i2, i3] over a (d0, d1, d2, d3) box, any strides,
 * converting SRC_DTYPE to DST_DTYPE through float (types.cl); the KV cache's concatenation
 * of past and new keys and values into present. One work-item per element, numbered in
 * row-major order; work-items past the end do nothing. A block destination (Q8_0, Q4_0:
 * clattn_quantize) takes one work-item per block: d3 counts blocks, 32 elements each.
 */
#ifndef SRC_DTYPE
#define SRC_DTYPE 0
#endif
#ifndef DST_DTYPE
#define DST_DTYPE 0
#endif
#define DST_BLOCKS (DST_DTYPE == DTYPE_Q8_0 || DST_DTYPE == DTYPE_Q4_0)
/* An FP8 destination's values are divided by its per-tensor scale (times inv_scale) first. */
#if IS_FP8(DST_DTYPE)
#define TO_DST(x, inv_scale) ((x) * (inv_scale))
#else
#define TO_DST(x, inv_scale) (x)
#endif

/*
 * The quantizer, llama.cpp's reference rounding (quantize_row_q8_0_ref / _q4_0_ref), in float
 * without contraction (no fma: x * id + 8.5 is two roundings, as there):
 *   Q8_0: d = amax / 127, id = d ? 1 / d : 0, q_j = round(x_j * id) (half away from zero)
 *   Q4_0: m = the element of largest magnitude (the first of equals), d = m / -8,
 *         id = d ? 1 / d : 0, q_j = min(15, (int)(x_j * id + 8.5)) (toward zero)
 * d is stored as fp16 (round to nearest even); the values are dequantized with it. Where the
 * device's float division is not correctly rounded (OpenCL allows 2.5 ulp), a q at a rounding
 * tie may differ by one from the reference's.
 */
#pragma OPENCL FP_CONTRACT OFF
inline void store_block(const float *x, __global uchar *block)
{
#if DST_DTYPE == DTYPE_Q8_0
    float amax = 0.0f;
    for (uint j = 0; j < 32; ++j)
        amax = fmax(amax, fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    vstore_half_rte(d, 0, (__global half *)block);
    for (uint j = 0; j < 32; ++j)
        block[2 + j] = as_uchar((char)(int)round(x[j] * id));
#elif DST_DTYPE == DTYPE_Q4_0
    float amax = 0.0f, m = 0.0f;
    for (uint j = 0; j < 32; ++j)
        if (amax < fabs(x[j])) {
            amax = fabs(x[j]);
            m = x[j];
        }
    const float d = m / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    vstore_half_rte(d, 0, (__global half *)block);
    for (uint j = 0; j < 16; ++j) {
        const float x0 = x[j] * id, x1 = x[16 + j] * id;
        const int q0 = min(15, (int)(x0 + 8.5f)), q1 = min(15, (int)(x1 + 8.5f));
        block[2 + j] = (uchar)(q0 | (q1 << 4));
    }
#else
    (void)x;
    (void)block;
#endif
}
#pragma OPENCL FP_CONTRACT ON

#if IS_FP8(DST_DTYPE)
/* copy4d into FP8 (clattn_quantize_scaled): its per-tensor scale needs one argument more than
 * copy4d's sixteen, so this variant takes a struct (params.h). */
__kernel __attribute__((reqd_work_group_size(HEADS_WG, 1, 1)))
void copy4d(__global const ELEM_T(SRC_DTYPE) *src, __global ELEM_T(DST_DTYPE) *dst,
            const clattn_copy_fp8_params params)
{
    CLATTN_UNPACK(CLATTN_COPY_FP8_PARAMS)
    const ulong index = get_global_id(0);
    if (index >= total)
        return;
    ulong i0, i1, i2, i3;
    box_coords(index, d1, d2, d3, &i0, &i1, &i2, &i3);
    const float value =
        LOAD(SRC_DTYPE, src, src_offset + i0 * src_s0 + i1 * src_s1 + i2 * src_s2 + i3 * src_s3);
    STORE(DST_DTYPE, value * inv_scale, dst,
          dst_offset + i0 * dst_s0 + i1 * dst_s1 + i2 * dst_s2 + i3 * dst_s3);
}
#else
__kernel __attribute__((reqd_work_group_size(HEADS_WG, 1, 1)))
void copy4d(__global const ELEM_T(SRC_DTYPE) *src, const ulong src_offset, const ulong src_s0,
            const ulong src_s1, const ulong src_s2, const ulong src_s3,
            __global ELEM_T(DST_DTYPE) *dst, const ulong dst_offset, const ulong dst_s0,
            const ulong dst_s1, const ulong dst_s2, const ulong dst_s3,
            const ulong total, const uint d1, const uint d2, const uint d3)
{
    const ulong index = get_global_id(0);
    if (index >= total)
        return;
    ulong i0, i1, i2, i3;
    box_coords(index, d1, d2, d3, &i0, &i1, &i2, &i3);
#if DST_BLOCKS
    float x[32];
    const ulong first = src_offset + i0 * src_s0 + i1 * src_s1 + i2 * src_s2 + i3 * 32 * src_s3;
    for (uint j = 0; j < 32; ++j)
        x[j] = LOAD(SRC_DTYPE, src, first + j * src_s3);
    store_block(x, ADVANCE(DST_DTYPE, dst,
                           dst_offset + i0 * dst_s0 + i1 * dst_s1 + i2 * dst_s2 + i3 * 32));
#else
    const float value =
        LOAD(SRC_DTYPE, src, src_offset + i0 * src_s0 + i1 * src_s1 + i2 * src_s2 + i3 * src_s3);
    STORE(DST_DTYPE, value, dst, dst_offset + i0 * dst_s0 + i1 * dst_s1 + i2 * dst_s2 + i3 * dst_s3);
#endif
}
#endif

/*
 * copy4d_vec4: copy4d's float32-to-float32 case where both last dimensions are contiguous
 * (src_s3 = dst_s3 = 1) and d3 is a multiple of 4 (the KV cache's past and new keys and values
 * into present, the usual case): one work-item per 4 elements of a row, d3 counting them
 * (vload4/vstore4 need only a float's alignment, so any offset and strides serve).
 */
__kernel __attribute__((reqd_work_group_size(HEADS_WG, 1, 1)))
void copy4d_vec4(__global const float *src, const ulong src_offset, const ulong src_s0,
                 const ulong src_s1, const ulong src_s2, __global float *dst,
                 const ulong dst_offset, const ulong dst_s0, const ulong dst_s1,
                 const ulong dst_s2, const ulong total, const uint d1, const uint d2,
                 const uint d3)
{
    const ulong index = get_global_id(0);
    if (index >= total)
        return;
    ulong i0, i1, i2, i3;
    box_coords(index, d1, d2, d3, &i0, &i1, &i2, &i3);
    const float4 x = vload4(0, src + src_offset + i0 * src_s0 + i1 * src_s1 + i2 * src_s2 + 4 * i3);
    vstore4(FAULTN(4, x, index), 0,
            dst + dst_offset + i0 * dst_s0 + i1 * dst_s1 + i2 * dst_s2 + 4 * i3);
}

/*
 * kv_append: one decode step's append to the KV cache in one launch (it was three commands:
 * a copy4d of the keys, one of the values, and a fill of the key counts, each a launch with
 * its own gap on the queue). Work-item (i, 0) copies element i of the new keys' box, (i, 1)
 * element i of the values' (numbered as copy4d's), converting K_SRC_DTYPE / V_SRC_DTYPE to
 * the cache's DST_DTYPE; (i, 0) with i < d0 also sets the batch's key count. A paged cache
 * (APPEND_PAGED) writes key start + j of batch b into page table[b, (start + j) / page_size]
 * at slot (start + j) % page_size; a page outside the pool is never written.
 */
#ifndef K_SRC_DTYPE
#define K_SRC_DTYPE 0
#endif
#ifndef V_SRC_DTYPE
#define V_SRC_DTYPE 0
#endif
#ifndef APPEND_PAGED
#define APPEND_PAGED 0
#endif

__kernel __attribute__((reqd_work_group_size(HEADS_WG, 1, 1)))
void kv_append(__global const ELEM_T(K_SRC_DTYPE) *ks, __global const ELEM_T(V_SRC_DTYPE) *vs,
               __global ELEM_T(DST_DTYPE) *kd, __global ELEM_T(DST_DTYPE) *vd,
               __global int *lengths, __global const int *table,
               const clattn_append_params params)
{
    CLATTN_UNPACK(CLATTN_APPEND_PARAMS)
    const ulong index = get_global_id(0);
    const bool values = get_global_id(1) == 1;
    if (!values && index < d0)
        lengths[index] = length;
    const uint d3 = values ? v_d3 : k_d3;
    if (index >= (ulong)d0 * d1 * d2 * d3)
        return;
    ulong i0, i1, i2, i3;
    box_coords(index, d1, d2, d3, &i0, &i1, &i2, &i3);
    /* Destination coordinates: paged, the key's page and slot replace the batch and key. */
    ulong o0 = i0, o2 = i2;
#if APPEND_PAGED
    const uint key = start + (uint)i2;
    const int page = table[i0 * bt_s0 + key / page_size];
    if (page < 0 || (uint)page >= num_pages)
        return;
    o0 = (ulong)page;
    o2 = (ulong)(key % page_size);
#endif
#if DST_BLOCKS
    /* A block cache: i3 numbers the row's blocks; each work-item quantizes one. */
    float x[32];
    if (values) {
        const ulong first = vs_offset + i0 * vs_s0 + i1 * vs_s1 + i2 * vs_s2 + i3 * 32 * vs_s3;
        for (uint j = 0; j < 32; ++j)
            x[j] = LOAD(V_SRC_DTYPE, vs, first + j * vs_s3);
        store_block(x, ADVANCE(DST_DTYPE, vd, vd_offset + o0 * vd_s0 + i1 * vd_s1 + o2 * vd_s2 +
                                                  i3 * 32));
    } else {
        const ulong first = ks_offset + i0 * ks_s0 + i1 * ks_s1 + i2 * ks_s2 + i3 * 32 * ks_s3;
        for (uint j = 0; j < 32; ++j)
            x[j] = LOAD(K_SRC_DTYPE, ks, first + j * ks_s3);
        store_block(x, ADVANCE(DST_DTYPE, kd, kd_offset + o0 * kd_s0 + i1 * kd_s1 + o2 * kd_s2 +
                                                  i3 * 32));
    }
#else
    if (values)
        STORE(DST_DTYPE,
              TO_DST(LOAD(V_SRC_DTYPE, vs,
                          vs_offset + i0 * vs_s0 + i1 * vs_s1 + i2 * vs_s2 + i3 * vs_s3),
                     v_inv_scale),
              vd, vd_offset + o0 * vd_s0 + i1 * vd_s1 + o2 * vd_s2 + i3 * vd_s3);
    else
        STORE(DST_DTYPE,
              TO_DST(LOAD(K_SRC_DTYPE, ks,
                          ks_offset + i0 * ks_s0 + i1 * ks_s1 + i2 * ks_s2 + i3 * ks_s3),
                     k_inv_scale),
              kd, kd_offset + o0 * kd_s0 + i1 * kd_s1 + o2 * kd_s2 + i3 * kd_s3);
#endif
}

/*
 * flash_merge: the fused kernel's decode splits combined by their log-sum-exp (each split
 * attended its own keys of the row and left a normalised partial output o_p and its lse_p):
 *   m = max_p lse_p,  w_p = exp(lse_p - m),  out = sum_p w_p o_p / sum_p w_p,
 *   lse = m + log(sum_p w_p)
 * (relu's lse is the log of the split's normaliser: the same formula). A split with no key
 * left (lse_p = -inf) weighs 0; a row with none at all gives zeros and -inf. o_parts
 * (splits, rows, dv) and lse_parts (splits, rows) are packed float32, rows numbered
 * (b, h, i). One work-item per (row, d); the d = 0 ones write lse when has_lse. Attention
 * sinks (has_sinks; score.cl) join here, once per row: the splits leave them out.
 */
#ifndef O_DTYPE
#define O_DTYPE 0
#endif

__kernel __attribute__((reqd_work_group_size(HEADS_WG, 1, 1)))
void flash_merge(__global const float *o_parts, __global const float *lse_parts,
                 __global ELEM_T(O_DTYPE) *O, __global float *lse,
                 __global const float *sinks, const clattn_merge_params params)
{
    CLATTN_UNPACK(CLATTN_MERGE_PARAMS)
    o_parts += o_parts_at; /* element offsets of the parts in the scratch buffer */
    lse_parts += lse_parts_at;
    const ulong index = get_global_id(0);
    if (index >= rows * dv)
        return;
    /* index = row * dv + d, row = (b * heads + h) * seq_q + i */
    ulong b, h, i, dim;
    box_coords(index, heads, seq_q, dv, &b, &h, &i, &dim);
    const uint d = (uint)dim;
    const ulong row = (b * heads + h) * seq_q + i;
    float m = NEG_INF;
    for (uint p = 0; p < splits; ++p) { /* (a NaN split makes m NaN: the row comes out NaN) */
        const float l = lse_parts[p * rows + row];
        m = m < l || isnan(l) ? l : m;
    }
    float total = 0.0f, sum = 0.0f;
    if (m != NEG_INF) {
        for (uint p = 0; p < splits; ++p) {
            const float w = exp(lse_parts[p * rows + row] - m); /* 0 for a split with no key */
            total += w;
            sum += w * o_parts[(p * rows + row) * dv + d];
        }
    }
    /* the sink as one more split with no output (score.cl's sink_fold) */
    const sunk_row sunk = sink_fold(
        has_sinks ? sinks[sinks_offset + h * sinks_s0 + i * sinks_s1] : NEG_INF, m, total);
    m = sunk.max;
    total = sunk.total;
    sum *= sunk.factor;
    STORE(O_DTYPE, total == 0.0f ? 0.0f : sum / total, O,
          o_offset + b * o_s0 + h * o_s1 + i * o_s2 + d * o_s3);
    if (has_lse && d == 0)
        lse[lse_offset + b * lse_s0 + h * lse_s1 + i * lse_s2] =
            total == 0.0f ? NEG_INF : m + log(total);
}
