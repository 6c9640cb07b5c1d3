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
 * Measured 2026-12-03 (tests/resources/run.sh: clang 15 + libclc, ptxas -arch=sm_90; LLVM 15
 * for gfx90a) with the GPU row (64 x 64 tiles, TILE_K 16, 4 x 4 per item, 256 items): 55-56
 * registers, 8320 B of local memory, no spills; the 4 x 4 block is in registers for float32
 * B, but with a 16-bit B the proxy leaves it in local memory (a 64-byte stack frame).
 * gfx90a: 78 VGPRs, no scratch. (matmul_vec is in the same program for GPUs but not launched
 * there: 165-167 registers and a 1600-byte stack.)
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
 * Tunables: TILE_M, TILE_N, TILE_K, WPT_M, WPT_N (matmul); VEC_RM, VEC_W, VEC_NV, VEC_RB,
 * VEC_KC, VEC_WG (matmul_vec, pack_b);
 * A_DTYPE, B_DTYPE, C_DTYPE (element types of the variant).
 */
#ifndef A_DTYPE
#define A_DTYPE 0 /* element type of A: 0 F32, 1 F16, 2 BF16 */
#endif
#ifndef B_DTYPE
#define B_DTYPE 0 /* element type of B (of pack_b's source) */
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

/* The same for B, whose second batch index is b1 / b_group: b_group consecutive entries share
 * one matrix (grouped-query attention: the query heads of a group read one k/v head). */
inline ulong batch_start_grouped(const ulong batch_base, const ulong batch1, const ulong stride0,
                                 const ulong stride1, const ulong b_group)
{
    const ulong entry = batch_base + get_global_id(2);
    const ulong b0 = entry / batch1, b1 = entry - b0 * batch1;
    return b0 * stride0 + (b1 / b_group) * stride1;
}

__kernel __attribute__((reqd_work_group_size(LOCAL_X, LOCAL_Y, 1)))
void matmul(__global const a_elem_t *A, __global const b_elem_t *B, __global c_elem_t *C,
            __global const float *bias, const clattn_matmul_params params)
{
    CLATTN_UNPACK(CLATTN_MATMUL_PARAMS)
    __local float a_tile[TILE_K][TILE_M + 1]; /* a_tile[k][m]; +1 staggers the banks */
    __local float b_tile[TILE_K][TILE_N + 1]; /* b_tile[k][n] */

    const uint tx = get_local_id(0);
    const uint ty = get_local_id(1);
    const uint lid = ty * LOCAL_X + tx;
    const uint n0 = get_group_id(0) * TILE_N;
    const uint m0 = get_group_id(1) * TILE_M;

    A += a_offset + batch_start(batch_base, batch1, a_batch0, a_batch1);
    B += b_offset + batch_start_grouped(batch_base, batch1, b_batch0, b_batch1, b_group);
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
 * matmul_vec: the same product for CPUs (PoCL), where a work-group is a loop over its
 * work-items and local memory is ordinary cache; register blocking in the way of GotoBLAS.
 * B is first packed (pack_b, below) into panels of VEC_N = VEC_NV * VEC_W columns, each panel
 * K rows of VEC_N contiguous floats, zero past column N; that also converts F16/BF16 and
 * transposes a B stored N x K, so the inner loop has one form. (A F32 B stored K x N whose N
 * is a multiple of VEC_N may be read in place: ldb is then its row stride and b_panel VEC_N.)
 *
 * A work-item owns VEC_RB micro-tiles of VEC_RM rows x VEC_N columns of C, stacked along M,
 * in one B panel (work-item (gid0, gid1): rows from gid0 * VEC_RM * VEC_RB, panel gid1). K is
 * walked in blocks of VEC_KC; within a block every micro-tile runs in VEC_RM * VEC_NV vector
 * accumulators (6 x 4 float16 = 24 of AVX-512's 32 registers), so the block's slice of the
 * B panel (VEC_KC * VEC_N floats: 64 KiB) stays in L1/L2 while the VEC_RB tiles use it.
 * Per k a tile broadcasts one A element per row and multiplies it with the VEC_NV vectors of
 * the B row: mad, built with -cl-mad-enable (PoCL, LLVM 15, makes an FMA instruction of it
 * only then, and fma() would be a slow library call on a device without FMA). The tiles' sums
 * wait between K blocks in a private array (L1). Work-items next to each other along gid0
 * share the B panel, so the threads that run neighbouring work-groups share it in cache.
 *
 *                 n0 = VEC_N * gid1 .. + VEC_N
 *   m0          +-------------------------+  tile 0: VEC_RM x VEC_NV accumulators
 *   m0+VEC_RM   +-------------------------+  tile 1
 *               :                         :  ... VEC_RB tiles
 *
 * Rows past M read A's last row (their sums are never stored); columns past N come from the
 * panel's zero padding and are not stored. The arguments are matmul's with trans_b replaced by
 * b_panel (floats from one panel to the next), ldb the floats from one k to the next, and
 * stream_c (nonzero: an F32 C may be written with nontemporal stores).
 */
#ifndef VEC_RM
#define VEC_RM 6 /* rows of a micro-tile */
#endif
#ifndef VEC_W
#define VEC_W 16 /* floats per vector (4, 8 or 16) */
#endif
#ifndef VEC_NV
#define VEC_NV 4 /* vectors per micro-tile row */
#endif
#ifndef VEC_RB
#define VEC_RB 4 /* micro-tiles per work-item, along M */
#endif
#ifndef VEC_KC
#define VEC_KC 256 /* depth of a K block */
#endif
#ifndef VEC_WG
#define VEC_WG 1 /* work-items per work-group, along M */
#endif

#define VEC_N (VEC_NV * VEC_W) /* columns of a panel */
#define VEC_CAT_(a, b) a##b
#define VEC_CAT(a, b) VEC_CAT_(a, b)
#define vec_t VEC_CAT(float, VEC_W)
#define vec_load VEC_CAT(vload, VEC_W)
#define vec_store VEC_CAT(vstore, VEC_W)
/* VEC_W elements of dtype `code` from p[i..] as a vec_t, and back. */
#define LOAD_VEC(code, p, i) VEC_CAT(LOAD, VEC_W)(code, p, i)
#define STORE_VEC(code, v, p, i) VEC_CAT(STORE, VEC_W)(code, v, p, i)

__kernel __attribute__((reqd_work_group_size(VEC_WG, 1, 1)))
void matmul_vec(__global const a_elem_t *A, __global const float *B, __global c_elem_t *C,
                __global const float *bias, const clattn_matmul_params params)
{
    CLATTN_UNPACK(CLATTN_MATMUL_PARAMS)
    const uint m_first = get_global_id(0) * (VEC_RM * VEC_RB);
    const uint n0 = get_global_id(1) * VEC_N;
    if (m_first >= M)
        return; /* no barriers in this kernel */
    A += a_offset + batch_start(batch_base, batch1, a_batch0, a_batch1);
    B += b_offset + batch_start_grouped(batch_base, batch1, b_batch0, b_batch1, b_group) +
         get_global_id(1) * b_panel;
    C += c_offset + batch_start(batch_base, batch1, c_batch0, c_batch1);
    /* Element (m, k) of op(A) is A[m * a_row_step + k * a_k_step]. */
    const ulong a_row_step = trans_a ? 1 : lda, a_k_step = trans_a ? lda : 1;
    const uint tiles = min((uint)VEC_RB, (M - m_first + VEC_RM - 1) / VEC_RM);

    vec_t sums[VEC_RB][VEC_RM][VEC_NV]; /* the tiles' sums between K blocks */
    for (uint k0 = 0; k0 < K; k0 += VEC_KC) {
        const uint depth = min((uint)VEC_KC, K - k0);
        for (uint t = 0; t < tiles; ++t) {
            vec_t acc[VEC_RM][VEC_NV];
            __global const a_elem_t *a_row[VEC_RM];
#pragma unroll
            for (uint i = 0; i < VEC_RM; ++i) {
                const uint m = min(m_first + t * VEC_RM + i, M - 1);
                a_row[i] = A + m * a_row_step + k0 * a_k_step;
#pragma unroll
                for (uint v = 0; v < VEC_NV; ++v)
                    acc[i][v] = k0 == 0 ? (vec_t)(0.0f) : sums[t][i][v];
            }
            __global const float *b_row = B + (ulong)k0 * ldb;
            ulong a_at = 0;
            for (uint k = 0; k < depth; ++k) {
                vec_t b[VEC_NV];
#pragma unroll
                for (uint v = 0; v < VEC_NV; ++v)
                    b[v] = vec_load(v, b_row);
#pragma unroll
                for (uint i = 0; i < VEC_RM; ++i) {
                    const vec_t a = (vec_t)(LOAD(A_DTYPE, a_row[i], a_at));
#pragma unroll
                    for (uint v = 0; v < VEC_NV; ++v)
                        acc[i][v] += a * b[v];
                }
                a_at += a_k_step;
                b_row += ldb;
            }
#pragma unroll
            for (uint i = 0; i < VEC_RM; ++i)
#pragma unroll
                for (uint v = 0; v < VEC_NV; ++v)
                    sums[t][i][v] = acc[i][v];
        }
    }

    const bool full = n0 + VEC_N <= N;
    vec_t bias_v[VEC_NV];
    for (uint v = 0; v < VEC_NV; ++v)
        bias_v[v] = has_bias && full ? vec_load(v, bias + bias_offset + n0) : (vec_t)(0.0f);
    /* A large F32 C (the host's choice) whose rows are aligned to vectors is written with
     * streaming stores, past the caches: its lines are not read first (4096 x 4096 x 64:
     * 1.8x). */
    const bool stream = stream_c && (ldc % VEC_W) == 0 &&
                        ((ulong)(C + n0) % (VEC_W * sizeof(float))) == 0;
    for (uint t = 0; t < tiles; ++t) {
        for (uint i = 0; i < VEC_RM; ++i) {
            const uint m = m_first + t * VEC_RM + i;
            if (m >= M)
                break;
            __global c_elem_t *c_row = C + (ulong)m * ldc + n0;
            if (full) {
                for (uint v = 0; v < VEC_NV; ++v) {
                    vec_t value = alpha * sums[t][i][v];
                    if (beta != 0.0f)
                        value = mad((vec_t)(beta), LOAD_VEC(C_DTYPE, c_row, v * VEC_W), value);
#if C_DTYPE == 0 && defined(__clang__)
                    if (stream)
                        __builtin_nontemporal_store(value + bias_v[v],
                                                    (__global vec_t *)(c_row + v * VEC_W));
                    else
#endif
                    STORE_VEC(C_DTYPE, value + bias_v[v], c_row, v * VEC_W);
                }
                continue;
            }
            /* The last panel: only its columns below N. */
            float part[VEC_N];
            for (uint v = 0; v < VEC_NV; ++v)
                vec_store(sums[t][i][v], v, part);
            for (uint j = 0; j < N - n0; ++j) {
                float value = alpha * part[j];
                if (beta != 0.0f)
                    value = mad(beta, LOAD(C_DTYPE, c_row, j), value);
                if (has_bias)
                    value += bias[bias_offset + n0 + j];
                STORE(C_DTYPE, value, c_row, j);
            }
        }
    }
}

/* Packs op(B) of every batch entry (as in matmul: batch_base + get_global_id(2), split by
 * batch1) into matmul_vec's panels of float: element (k, n) of entry `entry` goes to
 * dst[dst_offset + entry * panels * VEC_N * K + ((n / VEC_N) * K + k) * VEC_N + n % VEC_N],
 * with zeros for N <= n < panels * VEC_N. src holds B_DTYPE, K x N (trans 0) or N x K (trans
 * 1) with row stride ld. A work-item packs PACK_K rows of one panel, reading along src's
 * contiguous dimension; global size (K / PACK_K rounded up, panels, entries). */
#define PACK_K CLATTN_MATMUL_PACK_K /* (params.h: the host's launch uses the same) */
/* the transposing pack's blocks: 16 x 16 where rows are 16-float vectors (32 vector registers,
 * AVX-512), else 8 x 8 */
#if VEC_W >= 16
#define PACK_TW 16
#define PACK_TWV float16
#define pack_transpose transpose16
#else
#define PACK_TW 8
#define PACK_TWV float8
#define pack_transpose transpose8
#endif
/* a block's rows loaded and its columns stored as whole vectors (float: common.cl's VLOADU_G /
 * VSTOREU_G; F16 / BF16 B through types.cl's converting loads) */
#if B_DTYPE == 0
#define PACK_LOAD_TW(code, p, i) VLOADU_G(PACK_TW, (p) + (i))
#elif VEC_W >= 16
#define PACK_LOAD_TW(code, p, i) LOAD16(code, p, i)
#else
#define PACK_LOAD_TW(code, p, i) LOAD8(code, p, i)
#endif
#define PACK_STORE_TW(v, p) VSTOREU_G(PACK_TW, (v), (p))

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pack_b(const uint N, const uint K, const ulong batch1, const ulong batch_base,
            __global const b_elem_t *src, const ulong src_offset, const ulong src_batch0,
            const ulong src_batch1, const ulong ld, const int trans, __global float *dst,
            const ulong dst_offset)
{
    const uint k0 = get_global_id(0) * PACK_K, panel = get_global_id(1);
    if (k0 >= K)
        return;
    const uint n0 = panel * VEC_N, depth = min((uint)PACK_K, K - k0);
    const uint cols = min((uint)VEC_N, N - n0), panels = (N + VEC_N - 1) / VEC_N;
    const ulong entry = batch_base + get_global_id(2);
    src += src_offset + batch_start(batch_base, batch1, src_batch0, src_batch1);
    dst += dst_offset + entry * panels * VEC_N * K + ((ulong)panel * K + k0) * VEC_N;
    uint kk_first = 0; /* the rows the transposing blocks leave to the element loop */
    if (trans && cols == VEC_N && VEC_N % PACK_TW == 0) {
        /* column n of op(B) is row n of src: PACK_TW x PACK_TW blocks (PACK_TW rows of src,
         * PACK_TW of their k) transposed in registers (common.cl), each column stored whole;
         * element by element, the stores PACK_K x VEC_N scalars a stride apart, this took 17 %
         * of a 512-row projection's matmul time (MHA, L = 512) */
        kk_first = depth - depth % PACK_TW;
        for (uint j0 = 0; j0 < VEC_N; j0 += PACK_TW)
            for (uint kk0 = 0; kk0 < kk_first; kk0 += PACK_TW) {
                PACK_TWV r[PACK_TW];
#pragma unroll
                for (uint i = 0; i < PACK_TW; ++i)
                    r[i] = PACK_LOAD_TW(B_DTYPE, src + (ulong)(n0 + j0 + i) * ld + k0, kk0);
                pack_transpose(r);
#pragma unroll
                for (uint i = 0; i < PACK_TW; ++i)
                    PACK_STORE_TW(r[i], dst + (kk0 + i) * VEC_N + j0);
            }
    }
    if (trans) { /* column n of op(B) is row n of src */
        for (uint j = 0; kk_first < depth && j < VEC_N; ++j) {
            __global const b_elem_t *row = src + (ulong)min(n0 + j, N - 1) * ld + k0;
            for (uint kk = kk_first; kk < depth; ++kk)
                dst[kk * VEC_N + j] = j < cols ? LOAD(B_DTYPE, row, kk) : 0.0f;
        }
    } else if (cols == VEC_N) {
        for (uint kk = 0; kk < depth; ++kk) {
            __global const b_elem_t *row = src + (ulong)(k0 + kk) * ld + n0;
            for (uint v = 0; v < VEC_NV; ++v)
                vec_store(LOAD_VEC(B_DTYPE, row, v * VEC_W), v, dst + kk * VEC_N);
        }
    } else {
        for (uint kk = 0; kk < depth; ++kk) {
            __global const b_elem_t *row = src + (ulong)(k0 + kk) * ld + n0;
            for (uint j = 0; j < VEC_N; ++j)
                dst[kk * VEC_N + j] = j < cols ? LOAD(B_DTYPE, row, j) : 0.0f;
        }
    }
#ifdef CLATTN_FAULT_WRONG /* (types.cl) the first packed element off by one */
    if (k0 == 0 && panel == 0 && get_global_id(2) == 0)
        dst[0] += 1.0f;
#endif
}
