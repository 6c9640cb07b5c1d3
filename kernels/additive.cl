/*
 * additive.cl: additive (Bahdanau) attention scores, tile by tile.
 *
 *   raw[b, h, i, j] = sum_c w[h, c] tanh(p1[b, h, i, c] + p2[b, h, j, c]),  c < dim
 *
 * p1 = q W1 + b1 and p2 = k W2 + b2 are the projections (matmul.cl wrote them); the masks and
 * the normalisation then run on raw (softmax.cl, scale 1). p1 (batch, heads, seq_q, dim) and
 * p2 (batch, heads, seq_k, dim) are F32 views with unit stride along dim, w an F32 (heads,
 * dim) view with two strides, raw a (batch, heads, seq_q, seq_k) F32 view (unit stride along
 * seq_k). The (seq_q, seq_k, dim) tensor of tanh terms is never stored: each work-group owns
 * a TILE x TILE block of raw, one score per work-item, and walks dim in chunks of CHUNK,
 * staging the block's TILE rows of p1 and of p2 (and the chunk of w) in local memory:
 *
 *              keys j0 .. j0 + TILE
 *   rows i0  +---------------------+    p1 chunk [TILE][CHUNK]   (rows of the block)
 *   ..       |  one work-item per  |    p2 chunk [TILE][CHUNK]   (keys of the block)
 *   i0+TILE  |  score (i, j)       |    w chunk  [CHUNK]
 *            +---------------------+
 *
 * Each term is 1 - 2 / (1 + e^2a e^2b) = tanh(a + b) from the exponentials of the staged
 * elements (flash.cl explains the form and its error); a chunk holding any |p| > 40, whose
 * exponentials would overflow, takes tanh instead.
 *
 * Work-group (gj, gi, bh): dimension 0 numbers key tiles, 1 row tiles, 2 the (batch, head)
 * pairs. Work-items past seq_q or seq_k load zeros and skip their store; every work-item meets
 * every barrier (the chunk loop's trip count is the same for the whole group).
 *
 * Measured 2026-12-03 (tests/resources/run.sh: clang 15 + libclc, ptxas -arch=sm_90; LLVM 15
 * for gfx90a), TILE 16, CHUNK 32: 60 registers, 8584 B of local memory, no stack, no spills;
 * gfx90a 74 VGPRs, no scratch.
 */
#ifndef TILE
#define TILE 16 /* scores per work-group side: TILE x TILE work-items */
#endif
#ifndef CHUNK
#define CHUNK 32 /* columns of p1, p2 and w staged in local memory per step */
#endif
#define ADDITIVE_BIG 40.0f /* |p| past which exp(2 p) is not used (flash.cl's exp form) */

__kernel __attribute__((reqd_work_group_size(TILE, TILE, 1)))
void additive_scores(__global const float *p1, __global const float *p2,
                     __global const float *w, __global float *raw,
                     const clattn_additive_params params)
{
    CLATTN_UNPACK(CLATTN_ADDITIVE_PARAMS)
    __local float rows[TILE][CHUNK + 1]; /* +1: a column read by TILE work-items hits TILE banks */
    __local float keys[TILE][CHUNK + 1];
    __local float rows_exp[TILE][CHUNK + 1]; /* exp(2 p1), exp(2 p2) (flash.cl's exp form) */
    __local float keys_exp[TILE][CHUNK + 1];
    __local float weights[CHUNK];
    __local int chunk_big[2]; /* per chunk parity: some |p| > ADDITIVE_BIG (tanh instead) */

    const uint tj = get_local_id(0), ti = get_local_id(1);
    const uint j0 = get_group_id(0) * TILE, i0 = get_group_id(1) * TILE;
    const ulong bh = get_global_id(2);
    const ulong b = bh / heads, h = bh - b * heads;
    const uint flat = ti * TILE + tj;

    p1 += p1_offset + b * p1_s0 + h * p1_s1;
    p2 += p2_offset + b * p2_s0 + h * p2_s1;
    w += w_offset + h * w_s0;

    float sum = 0.0f;
    if (flat == 0)
        chunk_big[0] = chunk_big[1] = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    uint parity = 0;
    for (uint c0 = 0; c0 < dim; c0 += CHUNK) {
        for (uint e = flat; e < TILE * CHUNK; e += TILE * TILE) {
            const uint r = e / CHUNK, c = e - r * CHUNK;
            const bool in_dim = c0 + c < dim;
            rows[r][c] = in_dim && i0 + r < seq_q ? p1[(i0 + r) * p1_s2 + c0 + c] : 0.0f;
            keys[r][c] = in_dim && j0 + r < seq_k ? p2[(j0 + r) * p2_s2 + c0 + c] : 0.0f;
            /* tanh(a + b) = 1 - 2 / (1 + e^2a e^2b): two exponentials per staged element
             * instead of a tanh per score term (TILE terms share each one) */
            const float a = rows[r][c], k = keys[r][c];
            rows_exp[r][c] = exp(2.0f * clamp(a, -ADDITIVE_BIG, ADDITIVE_BIG));
            keys_exp[r][c] = exp(2.0f * clamp(k, -ADDITIVE_BIG, ADDITIVE_BIG));
            if (fabs(a) > ADDITIVE_BIG || fabs(k) > ADDITIVE_BIG)
                atomic_or(&chunk_big[parity], 1);
        }
        for (uint c = flat; c < CHUNK; c += TILE * TILE)
            weights[c] = c0 + c < dim ? w[(c0 + c) * w_s1] : 0.0f; /* 0: tanh terms past dim */
        barrier(CLK_LOCAL_MEM_FENCE);
        /* the flag is final; the other parity's, read in the chunk before, is cleared for the
         * next chunk (whose loads come after this chunk's closing barrier) */
        const bool exact = chunk_big[parity] != 0;
        if (flat == 0)
            chunk_big[parity ^ 1] = 0;
        parity ^= 1;
        if (exact) {
            for (uint c = 0; c < CHUNK; ++c)
                sum = mad(weights[c], tanh(rows[ti][c] + keys[tj][c]), sum);
        } else {
            for (uint c = 0; c < CHUNK; ++c)
                sum = mad(weights[c],
                          1.0f - 2.0f / mad(rows_exp[ti][c], keys_exp[tj][c], 1.0f), sum);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (i0 + ti < seq_q && j0 + tj < seq_k)
        raw[raw_offset + b * raw_s0 + h * raw_s1 + (i0 + ti) * raw_s2 + j0 + tj] =
            FAULT(sum, b + h + i0 + ti + j0 + tj); /* (types.cl) */
}
