/*
 * matmul.cl: batched, strided C = alpha * op(A) * op(B) + beta * C + bias (row-major).
 *
 * Operands: A, B and C hold A_DTYPE, B_DTYPE and C_DTYPE elements (0 F32, 1 F16, 2 BF16; loads
 * and stores through types.cl, arithmetic in float); bias is float. Each operand has two batch
 * strides and a row stride (all in elements; its elements along a row are contiguous). Global
 * dimension 2 enumerates the batch entries: entry batch_base + get_global_id(2) is
 * (b0, b1) = (entry / batch1, entry % batch1), and an operand's matrix starts at
 * offset + b0 * batch0 + b1 * batch1 (a stride of 0 broadcasts one matrix).
 *
 * matmul (GPUs): each work-group owns a TILE_M x TILE_N block of one C matrix and walks K in
 * steps of TILE_K, staging the A and B tiles in local memory (as float). Each work-item keeps a
 * WPT_M x WPT_N block of C in registers; its rows and columns are strided by the work-group's
 * extent so that neighbouring work-items touch neighbouring local-memory words.
 *
 *              n0 .......... n0+TILE_N
 *        m0  +------------------------+      work-group (gx, gy) = block (m0 = gy*TILE_M,
 *            | item (tx,ty) owns rows |                                  n0 = gx*TILE_N)
 *            | ty + i*LOCAL_Y, cols   |      local size LOCAL_X x LOCAL_Y =
 *            | tx + j*LOCAL_X         |        (TILE_N/WPT_N) x (TILE_M/WPT_M)
 *  m0+TILE_M +------------------------+
 *
 * Out-of-range elements of A and B load as zero and out-of-range C elements are not stored,
 * so any M, N, K >= 1 works. With beta == 0, C is never read.
 *
 * Tunables: TILE_M, TILE_N, TILE_K, WPT_M, WPT_N (matmul); VEC_RM, VEC_W, VEC_WG (matmul_vec);
 * TRANSPOSE_WG (transpose); A_DTYPE, B_DTYPE, C_DTYPE (element types of the variant).
 */
#ifndef A_DTYPE
#define A_DTYPE 0 /* element type of A: 0 F32, 1 F16, 2 BF16 */
#endif
#ifndef B_DTYPE
#define B_DTYPE 0 /* element type of B (of the transpose's source) */
#endif
#ifndef C_DTYPE
#define C_DTYPE 0 /* element type of C */
#endif
#ifndef TILE_M
#define TILE_M 32 /* rows of C per work-group */
#endif
#ifndef TILE_N
#define TILE_N 32 /* columns of C per work-group */
#endif
#ifndef TILE_K
#define TILE_K 16 /* depth of the local-memory tiles */
#endif
#ifndef WPT_M
#define WPT_M 4 /* rows of C per work-item */
#endif
#ifndef WPT_N
#define WPT_N 4 /* columns of C per work-item */
#endif

#define LOCAL_X (TILE_N / WPT_N)
#define LOCAL_Y (TILE_M / WPT_M)
#define LOCAL_ITEMS (LOCAL_X * LOCAL_Y)

#define a_elem_t ELEM_T(A_DTYPE)
#define b_elem_t ELEM_T(B_DTYPE)
#define c_elem_t ELEM_T(C_DTYPE)

/* Element offset of batch entry batch_base + get_global_id(2) in an operand with batch strides
 * stride0, stride1. */
inline ulong batch_start(const ulong batch_base, const ulong batch1, const ulong stride0,
                         const ulong stride1)
{
    const ulong entry = batch_base + get_global_id(2);
    const ulong b0 = entry / batch1, b1 = entry - b0 * batch1;
    return b0 * stride0 + b1 * stride1;
}

__kernel __attribute__((reqd_work_group_size(LOCAL_X, LOCAL_Y, 1)))
void matmul(const uint M, const uint N, const uint K, const ulong batch1, const ulong batch_base,
            __global const a_elem_t *A, const ulong a_offset, const ulong a_batch0,
            const ulong a_batch1, const ulong lda, const int trans_a,
            __global const b_elem_t *B, const ulong b_offset, const ulong b_batch0,
            const ulong b_batch1, const ulong ldb, const int trans_b,
            __global c_elem_t *C, const ulong c_offset, const ulong c_batch0,
            const ulong c_batch1, const ulong ldc,
            const float alpha, const float beta,
            __global const float *bias, const ulong bias_offset, const int has_bias)
{
    __local float a_tile[TILE_K][TILE_M + 1]; /* a_tile[k][m]; +1 staggers the banks */
    __local float b_tile[TILE_K][TILE_N + 1]; /* b_tile[k][n] */

    const uint tx = get_local_id(0);
    const uint ty = get_local_id(1);
    const uint lid = ty * LOCAL_X + tx;
    const uint n0 = get_group_id(0) * TILE_N;
    const uint m0 = get_group_id(1) * TILE_M;

    A += a_offset + batch_start(batch_base, batch1, a_batch0, a_batch1);
    B += b_offset + batch_start(batch_base, batch1, b_batch0, b_batch1);
    C += c_offset + batch_start(batch_base, batch1, c_batch0, c_batch1);

    float acc[WPT_M][WPT_N];
    for (uint i = 0; i < WPT_M; ++i)
        for (uint j = 0; j < WPT_N; ++j)
            acc[i][j] = 0.0f;

    for (uint k0 = 0; k0 < K; k0 += TILE_K) {
        /* Stage op(A)[m0.., k0..] and op(B)[k0.., n0..]; consecutive work-items read
         * consecutive addresses of whichever dimension is contiguous in memory. */
        for (uint e = lid; e < TILE_M * TILE_K; e += LOCAL_ITEMS) {
            uint mm, kk;
            if (trans_a) { mm = e % TILE_M; kk = e / TILE_M; } /* A stored K x M */
            else         { kk = e % TILE_K; mm = e / TILE_K; } /* A stored M x K */
            const uint gm = m0 + mm, gk = k0 + kk;
            float value = 0.0f;
            if (gm < M && gk < K)
                value = LOAD(A_DTYPE, A, trans_a ? gk * lda + gm : gm * lda + gk);
            a_tile[kk][mm] = value;
        }
        for (uint e = lid; e < TILE_N * TILE_K; e += LOCAL_ITEMS) {
            uint nn, kk;
            if (trans_b) { kk = e % TILE_K; nn = e / TILE_K; } /* B stored N x K */
            else         { nn = e % TILE_N; kk = e / TILE_N; } /* B stored K x N */
            const uint gn = n0 + nn, gk = k0 + kk;
            float value = 0.0f;
            if (gn < N && gk < K)
                value = LOAD(B_DTYPE, B, trans_b ? gn * ldb + gk : gk * ldb + gn);
            b_tile[kk][nn] = value;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        for (uint kk = 0; kk < TILE_K; ++kk) {
            float a_reg[WPT_M];
            for (uint i = 0; i < WPT_M; ++i)
                a_reg[i] = a_tile[kk][ty + i * LOCAL_Y];
            for (uint j = 0; j < WPT_N; ++j) {
                const float b_value = b_tile[kk][tx + j * LOCAL_X];
                for (uint i = 0; i < WPT_M; ++i)
                    acc[i][j] = mad(a_reg[i], b_value, acc[i][j]);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (uint i = 0; i < WPT_M; ++i) {
        const uint gm = m0 + ty + i * LOCAL_Y;
        if (gm >= M)
            continue;
        for (uint j = 0; j < WPT_N; ++j) {
            const uint gn = n0 + tx + j * LOCAL_X;
            if (gn >= N)
                continue;
            const ulong at = gm * ldc + gn;
            float value = alpha * acc[i][j];
            if (beta != 0.0f)
                value = mad(beta, LOAD(C_DTYPE, C, at), value);
            if (has_bias)
                value += bias[bias_offset + gn];
            STORE(C_DTYPE, value, C, at);
        }
    }
}

/*
 * matmul_vec: the same product for CPUs (PoCL), where a work-group is a loop that LLVM
 * vectorises and local memory is ordinary cache. Each work-item owns a VEC_RM x (2*VEC_W) block
 * of C and keeps it in 2*VEC_RM vector accumulators of VEC_W floats: per k it broadcasts one A
 * value per row and multiplies it with two vectors of the B row. B must be stored K x N (the host
 * transposes a B given N x K into float scratch first). Blocks that cross the edge of C take the
 * same single pass over K with bounds-checked loads and stores. The arguments are matmul's
 * without trans_b.
 *
 *        n0 = VEC_N*gid0 .. +VEC_N
 *   m0 = VEC_RM*gid1 +-----------+   work-item (gid0, gid1, batch): C[m0.., n0..]
 *                    | acc0 acc1 |   acc0 = columns n0..n0+VEC_W-1, acc1 = the next VEC_W
 *                    +-----------+
 */
#ifndef VEC_RM
#define VEC_RM 6 /* rows of C per work-item */
#endif
#ifndef VEC_W
#define VEC_W 8 /* floats per vector: the device's preferred float vector width (4, 8 or 16) */
#endif
#ifndef VEC_WG
#define VEC_WG 8 /* work-items per work-group, along N */
#endif

#define VEC_N (2 * VEC_W) /* columns of C per work-item */
#define VEC_CAT_(a, b) a##b
#define VEC_CAT(a, b) VEC_CAT_(a, b)
#define vec_t VEC_CAT(float, VEC_W)
#define vec_load VEC_CAT(vload, VEC_W)
#define vec_store VEC_CAT(vstore, VEC_W)
/* VEC_W elements of dtype `code` from p[i..] as a vec_t, and back. */
#define LOAD_VEC(code, p, i) VEC_CAT(LOAD, VEC_W)(code, p, i)
#define STORE_VEC(code, v, p, i) VEC_CAT(STORE, VEC_W)(code, v, p, i)

__kernel __attribute__((reqd_work_group_size(VEC_WG, 1, 1)))
void matmul_vec(const uint M, const uint N, const uint K, const ulong batch1,
                const ulong batch_base,
                __global const a_elem_t *A, const ulong a_offset, const ulong a_batch0,
                const ulong a_batch1, const ulong lda, const int trans_a,
                __global const b_elem_t *B, const ulong b_offset, const ulong b_batch0,
                const ulong b_batch1, const ulong ldb,
                __global c_elem_t *C, const ulong c_offset, const ulong c_batch0,
                const ulong c_batch1, const ulong ldc,
                const float alpha, const float beta,
                __global const float *bias, const ulong bias_offset, const int has_bias)
{
    const uint n0 = get_global_id(0) * VEC_N;
    const uint m0 = get_global_id(1) * VEC_RM;
    if (n0 >= N || m0 >= M)
        return; /* no barriers in this kernel */
    A += a_offset + batch_start(batch_base, batch1, a_batch0, a_batch1);
    B += b_offset + batch_start(batch_base, batch1, b_batch0, b_batch1);
    C += c_offset + batch_start(batch_base, batch1, c_batch0, c_batch1);
    /* Element (m, k) of op(A) is A[m * a_row_step + k * a_k_step]. */
    const ulong a_row_step = trans_a ? 1 : lda, a_k_step = trans_a ? lda : 1;

    if (n0 + VEC_N <= N && m0 + VEC_RM <= M) {
        vec_t acc0[VEC_RM], acc1[VEC_RM];
        for (uint i = 0; i < VEC_RM; ++i) {
            acc0[i] = (vec_t)(0.0f);
            acc1[i] = (vec_t)(0.0f);
        }
        __global const a_elem_t *a_col = A + m0 * a_row_step;
        __global const b_elem_t *b_row = B + n0;
        for (uint k = 0; k < K; ++k) {
            const vec_t b0 = LOAD_VEC(B_DTYPE, b_row, 0);
            const vec_t b1 = LOAD_VEC(B_DTYPE, b_row, VEC_W);
            for (uint i = 0; i < VEC_RM; ++i) {
                const vec_t a = (vec_t)(LOAD(A_DTYPE, a_col, i * a_row_step));
                acc0[i] = mad(a, b0, acc0[i]);
                acc1[i] = mad(a, b1, acc1[i]);
            }
            a_col += a_k_step;
            b_row += ldb;
        }
        vec_t bias0 = (vec_t)(0.0f), bias1 = (vec_t)(0.0f);
        if (has_bias) {
            bias0 = vec_load(0, bias + bias_offset + n0);
            bias1 = vec_load(0, bias + bias_offset + n0 + VEC_W);
        }
        for (uint i = 0; i < VEC_RM; ++i) {
            __global c_elem_t *c_row = C + (m0 + i) * ldc + n0;
            vec_t v0 = alpha * acc0[i], v1 = alpha * acc1[i];
            if (beta != 0.0f) {
                v0 = mad((vec_t)(beta), LOAD_VEC(C_DTYPE, c_row, 0), v0);
                v1 = mad((vec_t)(beta), LOAD_VEC(C_DTYPE, c_row, VEC_W), v1);
            }
            STORE_VEC(C_DTYPE, v0 + bias0, c_row, 0);
            STORE_VEC(C_DTYPE, v1 + bias1, c_row, VEC_W);
        }
        return;
    }

    /* Edge block (the last rows or columns of C): the same single pass over K, with the rows
     * and columns past C's edge loaded as zeros and never stored. One pass, not one dot
     * product per element, also keeps a work-item's loop trip count near K: Mesa's llvmpipe
     * (rusticl) silently ends every loop once a work-item's loops together have iterated
     * 65535 times (see the quirks table in host/core/). */
    const uint rows = min((uint)VEC_RM, M - m0), cols = min((uint)VEC_N, N - n0);
    vec_t acc0[VEC_RM], acc1[VEC_RM];
    for (uint i = 0; i < VEC_RM; ++i) {
        acc0[i] = (vec_t)(0.0f);
        acc1[i] = (vec_t)(0.0f);
    }
    __global const a_elem_t *a_col = A + m0 * a_row_step;
    __global const b_elem_t *b_row = B + n0;
    for (uint k = 0; k < K; ++k) {
        float b_part[VEC_N];
        for (uint j = 0; j < VEC_N; ++j)
            b_part[j] = j < cols ? LOAD(B_DTYPE, b_row, j) : 0.0f;
        const vec_t b0 = vec_load(0, b_part), b1 = vec_load(0, b_part + VEC_W);
        for (uint i = 0; i < VEC_RM; ++i) {
            const vec_t a = (vec_t)(i < rows ? LOAD(A_DTYPE, a_col, i * a_row_step) : 0.0f);
            acc0[i] = mad(a, b0, acc0[i]);
            acc1[i] = mad(a, b1, acc1[i]);
        }
        a_col += a_k_step;
        b_row += ldb;
    }
    for (uint i = 0; i < rows; ++i) {
        float c_part[VEC_N];
        vec_store(acc0[i], 0, c_part);
        vec_store(acc1[i], 0, c_part + VEC_W);
        __global c_elem_t *c_row = C + (m0 + i) * ldc + n0;
        for (uint j = 0; j < cols; ++j) {
            float value = alpha * c_part[j];
            if (beta != 0.0f)
                value = mad(beta, LOAD(C_DTYPE, c_row, j), value);
            if (has_bias)
                value += bias[bias_offset + n0 + j];
            STORE(C_DTYPE, value, c_row, j);
        }
    }
}

/* dst[dst_offset + entry*N*K + k*N + n] = src[n, k] of batch entry `entry` (as in matmul:
 * batch_base + get_global_id(2), split by batch1): batches of N x K matrices of B_DTYPE (row
 * stride ld) into packed K x N float, so that matmul_vec can read B rows. One work-item per
 * element; global size (K rounded up to TRANSPOSE_WG, N, entries). */
#ifndef TRANSPOSE_WG
#define TRANSPOSE_WG 16 /* work-items per work-group, along K */
#endif

__kernel __attribute__((reqd_work_group_size(TRANSPOSE_WG, 1, 1)))
void transpose(const uint N, const uint K, const ulong batch1, const ulong batch_base,
               __global const b_elem_t *src, const ulong src_offset, const ulong src_batch0,
               const ulong src_batch1, const ulong ld, __global float *dst,
               const ulong dst_offset)
{
    const uint k = get_global_id(0), n = get_global_id(1);
    if (k >= K)
        return;
    const ulong entry = batch_base + get_global_id(2);
    src += src_offset + batch_start(batch_base, batch1, src_batch0, src_batch1);
    dst[dst_offset + entry * N * K + (ulong)k * N + n] = LOAD(B_DTYPE, src, (ulong)n * ld + k);
}
