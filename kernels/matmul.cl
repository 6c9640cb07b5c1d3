/*
 * matmul.cl: batched, strided C = alpha * op(A) * op(B) + beta * C + bias (row-major).
 *
 * Each work-group owns a TILE_M x TILE_N block of one C matrix (batch index = global id 2) and
 * walks K in steps of TILE_K, staging the A and B tiles in local memory. Each work-item keeps a
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
 */
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

__kernel __attribute__((reqd_work_group_size(LOCAL_X, LOCAL_Y, 1)))
void matmul(const uint M, const uint N, const uint K,
            __global const float *A, const ulong a_offset, const ulong lda, const ulong a_stride,
            const int trans_a,
            __global const float *B, const ulong b_offset, const ulong ldb, const ulong b_stride,
            const int trans_b,
            __global float *C, const ulong c_offset, const ulong ldc, const ulong c_stride,
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
    const ulong batch = get_global_id(2);

    A += a_offset + batch * a_stride;
    B += b_offset + batch * b_stride;
    C += c_offset + batch * c_stride;

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
                value = trans_a ? A[gk * lda + gm] : A[gm * lda + gk];
            a_tile[kk][mm] = value;
        }
        for (uint e = lid; e < TILE_N * TILE_K; e += LOCAL_ITEMS) {
            uint nn, kk;
            if (trans_b) { kk = e % TILE_K; nn = e / TILE_K; } /* B stored N x K */
            else         { nn = e % TILE_N; kk = e / TILE_N; } /* B stored K x N */
            const uint gn = n0 + nn, gk = k0 + kk;
            float value = 0.0f;
            if (gn < N && gk < K)
                value = trans_b ? B[gn * ldb + gk] : B[gk * ldb + gn];
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
            float value = alpha * acc[i][j];
            if (beta != 0.0f)
                value = mad(beta, C[gm * ldc + gn], value);
            if (has_bias)
                value += bias[bias_offset + gn];
            C[gm * ldc + gn] = value;
        }
    }
}
