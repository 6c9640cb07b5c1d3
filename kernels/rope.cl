/*
 * rope.cl: rotary position embeddings (RoPE, RoFormer), as ONNX's RotaryEmbedding computes
 * them. Row (b, h, s) of x at position pos has its first `rot` columns rotated pair by pair:
 *
 *   (x1, x2) -> (x1 cos t_j - x2 sin t_j,  x1 sin t_j + x2 cos t_j),   j < rot / 2
 *   pairs  (ROPE_PAIRS, RoFormer, ONNX interleaved = 1): x1 = x[2j], x2 = x[2j + 1]
 *   halves (GPT-NeoX, Llama, ONNX interleaved = 0):     x1 = x[j],  x2 = x[j + rot / 2]
 *
 * and its other columns copied. The angles: t_j = pos * base^(-2j / rot) (freq: the float
 * pairs of common.cl's position_angle), or cos t_j and sin t_j read from caches: by position
 * (cache_mode 1: row pos, clamped to the cache's rows) or by row (cache_mode 2: [b, s, j]).
 * pos = position_ids[b, s] (I32, clamped at 0) when given, else start + s.
 *
 * x, out: 4-d (batch, heads, seq, dim) views of dtypes X_DTYPE, O_DTYPE (out may be x: each
 * element is read, then written, by one work-item). One work-item per row (b, h, s), numbered
 * row-major (the global size rounded up to ROPE_WG): it turns the row's pairs, then copies its
 * columns past rot. A row per work-item keeps the index arithmetic (64-bit divisions) out of
 * the loop over the columns: a work-item per element spent more time there than in memory.
 * Measured 2026-12-03 (tests/resources/run.sh: clang 15 + libclc, ptxas -arch=sm_90),
 * ROPE_WG 256, float32: 32 registers, no stack or spills (gfx90a: 35 VGPRs).
 */
#ifndef ROPE_WG
#define ROPE_WG 256 /* work-items per work-group */
#endif
#ifndef C_DTYPE
#define C_DTYPE 0 /* dtype code of the cos and sin caches */
#endif

__kernel __attribute__((reqd_work_group_size(ROPE_WG, 1, 1)))
void rope(__global const ELEM_T(X_DTYPE) *x, __global ELEM_T(O_DTYPE) *out,
          __global const ELEM_T(C_DTYPE) *cos_cache, __global const ELEM_T(C_DTYPE) *sin_cache,
          __global const int *position_ids, __global const float2 *freq,
          const clattn_rope_params params)
{
    CLATTN_UNPACK(CLATTN_ROPE_PARAMS)
    const ulong row = get_global_id(0);
    if (row >= total)
        return;
    const uint half_rot = rot / 2;
    /* Remainders as x - (x / y) * y (no LLVM `freeze` for Oclgrind: see softmax.cl). */
    const ulong bh = row / seq;
    const uint s = (uint)(row - bh * seq);
    const ulong b = bh / heads, h = bh - b * heads;
    const ulong x_row = x_offset + b * x_s0 + h * x_s1 + s * x_s2;
    const ulong out_row = out_offset + b * out_s0 + h * out_s1 + s * out_s2;
    ulong pos = start + s;
    if (has_position_ids) {
        const int id = position_ids[pos_offset + b * pos_s0 + s * pos_s1];
        pos = id < 0 ? 0 : (ulong)id;
    }
    /* The row's angles: cache rows by position (clamped) or by row, else computed. */
    const ulong cache_row = cache_mode == 1 ? (pos < cache_rows ? pos : cache_rows - 1) : 0;
    const ulong cache_at = cache_mode == 1 ? cache_row * c_s1 : b * c_s0 + s * c_s1;
    for (uint j = 0; j < half_rot; ++j) {
        float cos_t, sin_t;
        if (cache_mode == 0) {
            const float t = position_angle(pos, freq[j]);
            cos_t = cos(t);
            sin_t = sin(t);
        } else {
            cos_t = LOAD(C_DTYPE, cos_cache, cos_offset + cache_at + j * c_s2);
            sin_t = LOAD(C_DTYPE, sin_cache, sin_offset + cache_at + j * c_s2);
        }
        const uint i1 = pairs ? 2 * j : j, i2 = pairs ? 2 * j + 1 : j + half_rot;
        const float x1 = LOAD(X_DTYPE, x, x_row + i1 * x_s3);
        const float x2 = LOAD(X_DTYPE, x, x_row + i2 * x_s3);
        STORE(O_DTYPE, x1 * cos_t - x2 * sin_t, out, out_row + i1 * out_s3);
        STORE(O_DTYPE, x1 * sin_t + x2 * cos_t, out, out_row + i2 * out_s3);
    }
    for (uint i = rot; i < dim; ++i) /* the columns past the rotation: copied */
        STORE(O_DTYPE, LOAD(X_DTYPE, x, x_row + i * x_s3), out, out_row + i * out_s3);
}
