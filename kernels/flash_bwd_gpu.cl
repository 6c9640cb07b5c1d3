/*
 * flash_bwd_gpu.cl: the attention backward's dK/dV and dQ passes for GPUs, shaped like
 * FlashAttention-2's (Dao, 2023, Algorithm 2). bwd_dkdv_gpu: a work-group owns a block of BG_BK
 * keys of one (batch, k/v head), keeps their K and V rows in local memory and their dK, dV in
 * registers spread over its BG_TX x BG_TY work-items, and walks the query rows of its group's
 * query heads (GQA's sum) in tiles of BG_BR rows whose Q, dO, lse and delta all its
 * work-items share. bwd_dq_gpu: the same with the roles swapped (a block of BG_BK query rows
 * of one (batch, head) stays, the keys stream through in tiles of BG_BR). The math, the score
 * rule and the dropout are flash_bwd.cl's (this source is compiled after it: bwd_recompute,
 * BWD_MASK_TERM, ROW_INDEX, VARLEN's spans), so the sums are those of the generic bwd_dkdv and
 * bwd_dq, in another order; deterministic (no atomics: dQ is a second pass, not slots).
 *
 * bwd_dkdv_gpu, per row tile (three barriers per work-item: after staging, after the
 * weights, after the sums):
 *   1. the group stages the tile's Q and dO rows (as float; zeros past the rows the block
 *      needs and past the head sizes), lse and delta;
 *   2. S = Q K^T and dP = dO V^T: work-item (tx, ty) computes BG_RM x BG_RN of each in
 *      registers, rows ty + i*BG_TY and keys tx + j*BG_TX, reading q, k, dO, v rows as float4
 *      (rows of QK4 / VK4 = the head sizes rounded up to whole float4s, + 4 words); then the
 *      rule (bwd_recompute: scale, soft-cap, ALiBi, mask, band, padding, lse, relu) gives p
 *      and dX = dS * scale * cap', dropout's factor z (score.cl) p z and dp z; p z and dX go
 *      to local memory transposed (keys by rows, so that step 3 reads four rows as a float4);
 *   3. dV += (P Z)^T dO and dK += dX^T Q: work-item (tx, ty) keeps BG_RK x BG_RDV of dV and
 *      BG_RK x BG_RDK of dK, keys ty + i*BG_TY and dims tx + c*BG_TX, four rows a step.
 * The rows a key block needs: those whose band meets it (both band ends grow with the row:
 * found by bisection, uniform over the group), so causal and windowed problems skip the
 * tiles outside the band. Keys past the batch's, padded keys and rows past the band give
 * p = dX = 0. bwd_dq_gpu per key tile: 1. K, V rows; 2. S^T, dP^T by the same step (keys
 * ty + i*BG_TY, rows tx + j*BG_TX; the rows' lse, delta and band in registers), dX into the
 * tile (rows by keys); 3. dQ += dX K (rows ty + i*BG_TY, dims tx + c*BG_TX). Its keys: the
 * first row's band begin to the last row's band end.
 *
 *   bwd_dkdv_gpu: key block (BG_BK keys of (b, g)); row tiles (BG_BR rows of (b, h), h in g)
 *   local: K, V rows of the block; Q, dO rows, lse, delta of the tile; P Z, dX (keys x rows)
 *           keys k0 .. k0+BK                        dims 0 .. d
 *   rows  +--------------------+        keys  +---------------------+
 *   (BR)  | S, dP: item(tx,ty) |  ^T x  (BK)  | dV, dK: item (tx,ty)|  registers: RM x RN (S, dP)
 *         | rows ty+i*TY,      | -----> Q,dO  | keys ty+i*TY,       |      RK x (RDK + RDV)
 *         | keys tx+j*TX       |              | dims tx+c*TX        |
 *         +--------------------+              +---------------------+
 *   bwd_dq_gpu: the same picture with rows and keys exchanged (dQ: RK x RDK registers).
 *
 * Work model (tests/gpu_model: Oclgrind's counts held to model.py's formulas; bench/
 * gpu_model.py's H200 times), 48 KiB of local memory, full tiles: local loads per FMA 0.254
 * (dK/dV) and 0.229 (dQ) at d = 64 (BK = BR = 32), 0.330 and 0.344 at d = 128 (BK 32, BR 8:
 * the row tile shrinks first, it is what is reloaded). Registers (ptxas proxy, sm_90, no
 * score switches): d = 64 194 (dK/dV) and 136 (dQ), d = 128 167 and 168, no spills (stack
 * frames of 64-256 bytes); 2-3 groups of 128 per SM, register-bound.
 *
 * Tunables: BG_BK (keys (rows) per work-group, a multiple of BG_TX and of BG_TY), BG_BR (rows
 * (keys) per tile, a multiple of BG_TY and of 4), BG_TX, BG_TY (work-items); the host picks
 * them from the device's local memory and work-group size (host/ops/flash_bwd_gpu.c). The
 * rest is flash_bwd.cl's (head sizes, dtypes, VARLEN, the score switches).
 */
#ifndef BG_BK
#define BG_BK 32 /* keys per work-group */
#endif
#ifndef BG_BR
#define BG_BR 32 /* query rows per tile */
#endif
#ifndef BG_TX
#define BG_TX 16 /* work-items along the keys of S (the dims of dK, dV) */
#endif
#ifndef BG_TY
#define BG_TY 8 /* work-items along the rows of S (the keys of dK, dV) */
#endif

#if BG_BK % BG_TX != 0 || BG_BK % BG_TY != 0 || BG_BR % BG_TY != 0 || BG_BR % 4 != 0
#error "flash_bwd_gpu.cl: BG_BK must be a multiple of BG_TX and BG_TY, BG_BR of BG_TY and 4"
#endif

#define BG_THREADS (BG_TX * BG_TY)
#define BG_RM (BG_BR / BG_TY)                          /* rows of S per work-item */
#define BG_RN (BG_BK / BG_TX)                          /* keys of S per work-item */
#define BG_RK (BG_BK / BG_TY)                          /* keys of dK, dV per work-item */
#define BG_RDK ((HEAD_DIM_QK + BG_TX - 1) / BG_TX)     /* dims of dK per work-item */
#define BG_RDV ((HEAD_DIM_V + BG_TX - 1) / BG_TX)      /* dims of dV per work-item */
#define BG_QK4 ((HEAD_DIM_QK + 3) / 4 * 4)             /* q, k rows in whole float4s */
#define BG_VK4 ((HEAD_DIM_V + 3) / 4 * 4)              /* dO, v rows */
#define BG_QK_PAD (BG_QK4 + 4)                         /* words per staged q, k row */
#define BG_V_PAD (BG_VK4 + 4)                          /* words per staged dO, v row */
#define BG_BR_PAD (BG_BR + 4)                          /* words per key of P Z, dX */

/* acc[i][j] = a row (ty + i*BG_TY) . b row (tx + j*BG_TX) over n4 float4s of two local tiles
 * (rows a_row4 and b_row4 float4s apart): step 2's S and dP (S^T, dP^T) in registers. */
#define BG_DOTS(acc, a4, a_row4, b4, b_row4, n4)                                                   \
    for (uint i = 0; i < BG_RM; ++i)                                                              \
        for (uint j = 0; j < BG_RN; ++j)                                                          \
            acc[i][j] = 0.0f;                                                                     \
    for (uint d4 = 0; d4 < (n4); ++d4) {                                                          \
        float4 av[BG_RM], bv[BG_RN];                                                              \
        for (uint i = 0; i < BG_RM; ++i)                                                          \
            av[i] = (a4)[(ty + i * BG_TY) * (a_row4) + d4];                                       \
        for (uint j = 0; j < BG_RN; ++j)                                                          \
            bv[j] = (b4)[(tx + j * BG_TX) * (b_row4) + d4];                                       \
        for (uint i = 0; i < BG_RM; ++i)                                                          \
            for (uint j = 0; j < BG_RN; ++j) {                                                    \
                acc[i][j] = fma(av[i].x, bv[j].x, acc[i][j]);                                     \
                acc[i][j] = fma(av[i].y, bv[j].y, acc[i][j]);                                     \
                acc[i][j] = fma(av[i].z, bv[j].z, acc[i][j]);                                     \
                acc[i][j] = fma(av[i].w, bv[j].w, acc[i][j]);                                     \
            }                                                                                     \
    }

/* Step 3 for row r0 + u of the tile, its weights in component `comp` of p4[i], x4[i]. */
#define BG_SUM_ROW(u, comp)                                                                       \
    {                                                                                             \
        float go[BG_RDV], qd[BG_RDK];                                                             \
        for (uint c = 0; c < BG_RDV; ++c) {                                                       \
            const uint dim = tx + c * BG_TX;                                                      \
            go[c] = dim < HEAD_DIM_V ? go_tile[(r0 + (u)) * BG_V_PAD + dim] : 0.0f;               \
        }                                                                                         \
        for (uint c = 0; c < BG_RDK; ++c) {                                                       \
            const uint dim = tx + c * BG_TX;                                                      \
            qd[c] = dim < HEAD_DIM_QK ? q_tile[(r0 + (u)) * BG_QK_PAD + dim] : 0.0f;              \
        }                                                                                         \
        for (uint i = 0; i < BG_RK; ++i) {                                                        \
            for (uint c = 0; c < BG_RDV; ++c)                                                     \
                dv[i][c] = fma(p4[i].comp, go[c], dv[i][c]);                                      \
            for (uint c = 0; c < BG_RDK; ++c)                                                     \
                dk[i][c] = fma(x4[i].comp, qd[c], dk[i][c]);                                      \
        }                                                                                         \
    }

/* bwd_dq_gpu's step 3 for key r0 + u of the tile, its dX in component `comp` of x4[i]. */
#define BG_DQ_KEY(u, comp)                                                                        \
    {                                                                                             \
        float kd[BG_RDK];                                                                         \
        for (uint c = 0; c < BG_RDK; ++c) {                                                       \
            const uint dim = tx + c * BG_TX;                                                      \
            kd[c] = dim < HEAD_DIM_QK ? k_tile[(r0 + (u)) * BG_QK_PAD + dim] : 0.0f;              \
        }                                                                                         \
        for (uint i = 0; i < BG_RK; ++i)                                                          \
            for (uint c = 0; c < BG_RDK; ++c)                                                     \
                dq[i][c] = fma(x4[i].comp, kd[c], dq[i][c]);                                      \
    }

/* ---- bwd_dkdv_gpu's steps, always inlined (PoCL left plain `inline` steps as calls, their
 * register arrays in memory); every work-item calls each, the barriers stay in the kernel. */

/* The rows first .. last - 1 (of part_begin .. row_stop - 1) whose band meets keys key0 ..
 * key0 + keys - 1, as (first, last): both band ends are nondecreasing in the row, so two
 * bisections find them (uniform over the group); none where the block is past the key count. */
__attribute__((always_inline)) inline uint2
bg_block_rows(const key_band band, const uint part_begin, const uint row_stop, const uint key0,
              const uint keys)
{
    uint lo = part_begin, hi = max(part_begin, row_stop);
    while (lo < hi) {
        const uint mid = lo + (hi - lo) / 2;
        if (band_end(band, mid) > key0)
            hi = mid;
        else
            lo = mid + 1;
    }
    const uint first = lo;
    hi = max(first, row_stop);
    while (lo < hi) {
        const uint mid = lo + (hi - lo) / 2;
        if (band_begin(band, mid) >= key0 + keys)
            hi = mid;
        else
            lo = mid + 1;
    }
    const uint last = key0 < band.limit ? lo : first;
    return (uint2)(first, last);
}

/* Step 2's rule on this item's S and dP (rows ty + i*BG_TY of the tile, keys tx + j*BG_TX of
 * the block): bwd_recompute's p and dX = dS * scale * cap', dropout's factor z (score.cl) on
 * p and dp, into the transposed tiles (0 for rows past the tile's, keys not key_ok, keys
 * outside the row's band). */
__attribute__((always_inline)) inline void
bg_weights(__local float *p_tile, __local float *dx_tile, float (*s)[BG_RN],
           float (*dp)[BG_RN], __local const float *lse_t, __local const float *delta_t,
           const bool *key_ok, __global const ELEM_T(MASK_DTYPE) *mask,
           const clattn_flash_bwd_params params, const key_band band, const ulong b,
           const ulong h, const ulong bh, const uint row0, const uint rows, const uint key0,
           const uint tx, const uint ty)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_BWD_PARAMS)
    for (uint i = 0; i < BG_RM; ++i) {
        const uint r = ty + i * BG_TY, row = row0 + r;
        const float lse = lse_t[r], delta = delta_t[r];
        const uint kb = band_begin(band, row), ke = band_end(band, row);
        for (uint j = 0; j < BG_RN; ++j) {
            const uint kk = tx + j * BG_TX, key = key0 + kk;
            float pz = 0.0f, dx = 0.0f;
            if (r < rows && key_ok[j] && key >= kb && key < ke) {
                const bwd_pair pair =
                    bwd_recompute(s[i][j], scale, softcap, band, row, key,
                                  BWD_MASK_TERM(row, key), lse, norm_relu);
                if (pair.p != 0.0f || pair.grad != 0.0f) {
                    /* dropout (score.cl): the forward's factor z on what met V */
                    const float z = SCORE_DROPOUT ? DROPOUT_OF(bh, row, key) : 1.0f;
                    pz = pair.p * z;
                    dx = pair.grad * (dp[i][j] * z - delta) * pair.dcap;
                }
            }
            p_tile[kk * BG_BR_PAD + r] = pz;
            dx_tile[kk * BG_BR_PAD + r] = dx;
        }
    }
}

/* The block's dK and dV, this item's keys ty + i*BG_TY and dims tx + c*BG_TX, to DK and DV. */
__attribute__((always_inline)) inline void
bg_store_dkdv(__global ELEM_T(DK_DTYPE) *DK, __global ELEM_T(DV_DTYPE) *DV, float (*dk)[BG_RDK],
              float (*dv)[BG_RDV], const clattn_flash_bwd_params params, const ulong b,
              const ulong g, const seq_span span, const uint key0, const uint keys,
              const uint tx, const uint ty)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_BWD_PARAMS)
    for (uint i = 0; i < BG_RK; ++i) {
        const uint kk = ty + i * BG_TY;
        if (kk >= keys)
            continue;
        const ulong key_at = (ulong)span.k0 + key0 + kk;
        const ulong dk_at = dk_offset + b * dk_s0 + g * dk_s1 + key_at * dk_s2;
        const ulong dv_at = dv_offset + b * dv_s0 + g * dv_s1 + key_at * dv_s2;
        for (uint c = 0; c < BG_RDK; ++c) {
            const uint dim = tx + c * BG_TX;
            if (dim < HEAD_DIM_QK)
                STORE(DK_DTYPE, dk[i][c], DK, dk_at + dim * dk_s3);
        }
        for (uint c = 0; c < BG_RDV; ++c) {
            const uint dim = tx + c * BG_TX;
            if (dim < HEAD_DIM_V)
                STORE(DV_DTYPE, dv[i][c], DV, dv_at + dim * dv_s3);
        }
    }
}

/* dK and dV of keys BG_BK * group .. of (b, k/v head g) over rows part_begin .. part_stop - 1
 * of every query head of the group, to DK and DV (no parts: the host takes flash_bwd.cl's
 * bwd_dkdv where a device caps loop trips). Arguments as bwd_dkdv's. */
__kernel __attribute__((reqd_work_group_size(BG_THREADS, 1, 1)))
void bwd_dkdv_gpu(BWD_DKDV_PARAMS)
{
    BWD_OPEN
    __local float4 k_tile4[BG_BK * BG_QK_PAD / 4], v_tile4[BG_BK * BG_V_PAD / 4];
    __local float4 q_tile4[BG_BR * BG_QK_PAD / 4], go_tile4[BG_BR * BG_V_PAD / 4];
    __local float4 p_tile4[BG_BK * BG_BR_PAD / 4], dx_tile4[BG_BK * BG_BR_PAD / 4];
    __local float lse_t[BG_BR], delta_t[BG_BR];
    /* the same words, one float at a time */
    __local float *k_tile = (__local float *)k_tile4, *v_tile = (__local float *)v_tile4;
    __local float *q_tile = (__local float *)q_tile4, *go_tile = (__local float *)go_tile4;
    __local float *p_tile = (__local float *)p_tile4, *dx_tile = (__local float *)dx_tile4;

    const uint lid = get_local_id(0);
    const uint tx = lid % BG_TX, ty = lid / BG_TX;
    const uint key0 = get_group_id(0) * BG_BK;
    const ulong bg = bh_base + get_global_id(1);
    const ulong kv_heads = heads / kv_group;
    const ulong b = bg / kv_heads, g = bg - b * kv_heads;
    const seq_span span = SPAN_OF(b); /* the batch's rows and keys (score.cl) */
    if (key0 >= span.keys)
        return; /* the whole work-group past the batch's keys (uniform) */
    const uint keys = min((uint)BG_BK, span.keys - key0);
    const uint row_stop = min(part_stop, span.rows);

    /* The block's K and V rows (zeros past its keys and the head sizes). */
    const ulong k_base = k_offset + b * k_s0 + g * k_s1 + ((ulong)span.k0 + key0) * k_s2;
    const ulong v_base = v_offset + b * v_s0 + g * v_s1 + ((ulong)span.k0 + key0) * v_s2;
    for (uint e = lid; e < BG_BK * BG_QK4; e += BG_THREADS) {
        const uint j = e / BG_QK4, d = e - j * BG_QK4;
        k_tile[j * BG_QK_PAD + d] =
            j < keys && d < HEAD_DIM_QK ? LOAD(K_DTYPE, K, k_base + j * k_s2 + d * k_s3) : 0.0f;
    }
    for (uint e = lid; e < BG_BK * BG_VK4; e += BG_THREADS) {
        const uint j = e / BG_VK4, d = e - j * BG_VK4;
        v_tile[j * BG_V_PAD + d] =
            j < keys && d < HEAD_DIM_V ? LOAD(V_DTYPE, V, v_base + j * v_s2 + d * v_s3) : 0.0f;
    }
    /* This work-item's keys of S: in the batch and not padded */
    bool key_ok[BG_RN];
    for (uint j = 0; j < BG_RN; ++j) {
        const uint kk = tx + j * BG_TX;
        key_ok[j] = kk < keys &&
                    !key_padded(has_key_padding, key_padding,
                                key_padding_offset + b * key_padding_s0 +
                                    (ulong)(key0 + kk) * key_padding_s1);
    }
    float dk[BG_RK][BG_RDK], dv[BG_RK][BG_RDV];
    for (uint i = 0; i < BG_RK; ++i) {
        for (uint c = 0; c < BG_RDK; ++c)
            dk[i][c] = 0.0f;
        for (uint c = 0; c < BG_RDV; ++c)
            dv[i][c] = 0.0f;
    }

    for (uint t = 0; t < kv_group; ++t) {
        const ulong h = g * kv_group + t;
        const ulong bh = b * heads + h;
        const key_band band = BAND_SPAN(b, h, span);
        /* the rows whose band meets the block (uniform over the group) */
        const uint2 block_rows = bg_block_rows(band, part_begin, row_stop, key0, keys);
        const uint first = block_rows.x, last = block_rows.y;
        const ulong q_base = q_offset + b * q_s0 + h * q_s1 + (ulong)span.q0 * q_s2;
        const ulong go_base = go_offset + b * go_s0 + h * go_s1 + (ulong)span.q0 * go_s2;
        const ulong lse_base = lse_offset + b * lse_s0 + h * lse_s1 + (ulong)span.q0 * lse_s2;

        for (uint row0 = first; row0 < last; row0 += BG_BR) {
            const uint rows = min((uint)BG_BR, last - row0);
            /* 1. the tile's Q, dO rows, lse and delta */
            for (uint e = lid; e < BG_BR * BG_QK4; e += BG_THREADS) {
                const uint r = e / BG_QK4, d = e - r * BG_QK4;
                q_tile[r * BG_QK_PAD + d] =
                    r < rows && d < HEAD_DIM_QK
                        ? LOAD(Q_DTYPE, Q, q_base + (ulong)(row0 + r) * q_s2 + d * q_s3)
                        : 0.0f;
            }
            for (uint e = lid; e < BG_BR * BG_VK4; e += BG_THREADS) {
                const uint r = e / BG_VK4, d = e - r * BG_VK4;
                go_tile[r * BG_V_PAD + d] =
                    r < rows && d < HEAD_DIM_V
                        ? LOAD(GO_DTYPE, GO, go_base + (ulong)(row0 + r) * go_s2 + d * go_s3)
                        : 0.0f;
            }
            for (uint r = lid; r < BG_BR; r += BG_THREADS) {
                const uint row = row0 + r;
                lse_t[r] = r < rows ? lse_in[lse_base + (ulong)row * lse_s2] : NEG_INF;
                delta_t[r] = r < rows ? scratch[delta_at + ROW_INDEX(bh, h, span, row)] : 0.0f;
            }
            barrier(CLK_LOCAL_MEM_FENCE);

            /* 2. S and dP, then p z and dX into the transposed tiles */
            float s[BG_RM][BG_RN], dp[BG_RM][BG_RN];
            BG_DOTS(s, q_tile4, BG_QK_PAD / 4, k_tile4, BG_QK_PAD / 4, BG_QK4 / 4)
            BG_DOTS(dp, go_tile4, BG_V_PAD / 4, v_tile4, BG_V_PAD / 4, BG_VK4 / 4)
            bg_weights(p_tile, dx_tile, s, dp, lse_t, delta_t, key_ok, mask, params, band, b, h,
                       bh, row0, rows, key0, tx, ty);
            barrier(CLK_LOCAL_MEM_FENCE);

            /* 3. dV += (P Z)^T dO, dK += dX^T Q over the tile's rows, four at a time */
            const uint rows4 = (rows + 3) / 4 * 4;
            for (uint r0 = 0; r0 < rows4; r0 += 4) {
                float4 p4[BG_RK], x4[BG_RK];
                for (uint i = 0; i < BG_RK; ++i) {
                    const uint kk = ty + i * BG_TY;
                    p4[i] = p_tile4[(kk * BG_BR_PAD + r0) / 4];
                    x4[i] = dx_tile4[(kk * BG_BR_PAD + r0) / 4];
                }
                BG_SUM_ROW(0, x)
                BG_SUM_ROW(1, y)
                BG_SUM_ROW(2, z)
                BG_SUM_ROW(3, w)
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    }

    bg_store_dkdv(DK, DV, dk, dv, params, b, g, span, key0, keys, tx, ty);
}

/* dQ of rows BG_BK * group .. of (b, h) over its keys: bwd_dkdv_gpu with the roles swapped
 * (the rows stay, their Q, dO in local memory, lse and delta per work-item; the keys stream
 * through in tiles of BG_BR, K and V rows in local memory): S^T and dP^T by the same step 2
 * (item (tx, ty): keys ty + i*BG_TY of the tile, rows tx + j*BG_TX), dX into the tile
 * (rows by keys), then dQ += dX K (item (tx, ty): rows ty + i*BG_TY, dims tx + c*BG_TX).
 * Keys: from the first row's band begin to the last row's band end (both nondecreasing).
 * No mask gradient (the host takes bwd_dq for it) and no key parts. */
__kernel __attribute__((reqd_work_group_size(BG_THREADS, 1, 1)))
void bwd_dq_gpu(BWD_DQ_PARAMS)
{
    BWD_OPEN
    __local float4 q_tile4[BG_BK * BG_QK_PAD / 4], go_tile4[BG_BK * BG_V_PAD / 4];
    __local float4 k_tile4[BG_BR * BG_QK_PAD / 4], v_tile4[BG_BR * BG_V_PAD / 4];
    __local float4 dx_tile4[BG_BK * BG_BR_PAD / 4];
    __local float *q_tile = (__local float *)q_tile4, *go_tile = (__local float *)go_tile4;
    __local float *k_tile = (__local float *)k_tile4, *v_tile = (__local float *)v_tile4;
    __local float *dx_tile = (__local float *)dx_tile4;

    const uint lid = get_local_id(0);
    const uint tx = lid % BG_TX, ty = lid / BG_TX;
    const uint row0 = get_group_id(0) * BG_BK;
    const ulong bh = bh_base + get_global_id(1);
    const ulong b = bh / heads, h = bh - b * heads, g = h / kv_group;
    const seq_span span = SPAN_OF(b); /* the batch's rows and keys (score.cl) */
    if (row0 >= span.rows)
        return; /* the whole work-group past the batch's rows (uniform) */
    const uint rows = min((uint)BG_BK, span.rows - row0);
    const key_band band = BAND_SPAN(b, h, span);

    /* The block's Q and dO rows (zeros past its rows and the head sizes). */
    const ulong q_base = q_offset + b * q_s0 + h * q_s1 + ((ulong)span.q0 + row0) * q_s2;
    const ulong go_base = go_offset + b * go_s0 + h * go_s1 + ((ulong)span.q0 + row0) * go_s2;
    for (uint e = lid; e < BG_BK * BG_QK4; e += BG_THREADS) {
        const uint r = e / BG_QK4, d = e - r * BG_QK4;
        q_tile[r * BG_QK_PAD + d] =
            r < rows && d < HEAD_DIM_QK ? LOAD(Q_DTYPE, Q, q_base + r * q_s2 + d * q_s3) : 0.0f;
    }
    for (uint e = lid; e < BG_BK * BG_VK4; e += BG_THREADS) {
        const uint r = e / BG_VK4, d = e - r * BG_VK4;
        go_tile[r * BG_V_PAD + d] =
            r < rows && d < HEAD_DIM_V ? LOAD(GO_DTYPE, GO, go_base + r * go_s2 + d * go_s3)
                                       : 0.0f;
    }
    /* This work-item's rows of S^T: lse, delta, band */
    float lse_r[BG_RN], delta_r[BG_RN];
    uint kb_r[BG_RN], ke_r[BG_RN];
    for (uint j = 0; j < BG_RN; ++j) {
        const uint rr = tx + j * BG_TX, row = row0 + rr;
        const bool here = rr < rows;
        lse_r[j] = here ? lse_in[lse_offset + b * lse_s0 + h * lse_s1 +
                                 ((ulong)span.q0 + row) * lse_s2]
                        : NEG_INF;
        delta_r[j] = here ? scratch[delta_at + ROW_INDEX(bh, h, span, row)] : 0.0f;
        kb_r[j] = here ? band_begin(band, row) : 0u;
        ke_r[j] = here ? band_end(band, row) : 0u;
    }
    float dq[BG_RK][BG_RDK];
    for (uint i = 0; i < BG_RK; ++i)
        for (uint c = 0; c < BG_RDK; ++c)
            dq[i][c] = 0.0f;

    /* the keys any of the rows sees (uniform over the group) */
    const uint first = max(band_begin(band, row0), part_begin);
    const uint stop = min(band_end(band, row0 + rows - 1), part_stop);
    const ulong k_base = k_offset + b * k_s0 + g * k_s1 + (ulong)span.k0 * k_s2;
    const ulong v_base = v_offset + b * v_s0 + g * v_s1 + (ulong)span.k0 * v_s2;
    for (uint key0 = first; key0 < stop; key0 += BG_BR) {
        const uint keys = min((uint)BG_BR, stop - key0);
        /* 1. the tile's K and V rows */
        for (uint e = lid; e < BG_BR * BG_QK4; e += BG_THREADS) {
            const uint j = e / BG_QK4, d = e - j * BG_QK4;
            k_tile[j * BG_QK_PAD + d] =
                j < keys && d < HEAD_DIM_QK
                    ? LOAD(K_DTYPE, K, k_base + (ulong)(key0 + j) * k_s2 + d * k_s3)
                    : 0.0f;
        }
        for (uint e = lid; e < BG_BR * BG_VK4; e += BG_THREADS) {
            const uint j = e / BG_VK4, d = e - j * BG_VK4;
            v_tile[j * BG_V_PAD + d] =
                j < keys && d < HEAD_DIM_V
                    ? LOAD(V_DTYPE, V, v_base + (ulong)(key0 + j) * v_s2 + d * v_s3)
                    : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* 2. S^T and dP^T: keys ty + i*TY of the tile, rows tx + j*TX of the block */
        float s[BG_RM][BG_RN], dp[BG_RM][BG_RN];
        BG_DOTS(s, k_tile4, BG_QK_PAD / 4, q_tile4, BG_QK_PAD / 4, BG_QK4 / 4)
        BG_DOTS(dp, v_tile4, BG_V_PAD / 4, go_tile4, BG_V_PAD / 4, BG_VK4 / 4)
        for (uint i = 0; i < BG_RM; ++i) {
            const uint kk = ty + i * BG_TY, key = key0 + kk;
            const bool key_ok =
                kk < keys && !key_padded(has_key_padding, key_padding,
                                         key_padding_offset + b * key_padding_s0 +
                                             (ulong)key * key_padding_s1);
            for (uint j = 0; j < BG_RN; ++j) {
                const uint rr = tx + j * BG_TX, row = row0 + rr;
                float dx = 0.0f;
                if (key_ok && key >= kb_r[j] && key < ke_r[j]) {
                    const bwd_pair pair =
                        bwd_recompute(s[i][j], scale, softcap, band, row, key,
                                      BWD_MASK_TERM(row, key), lse_r[j], norm_relu);
                    if (pair.grad != 0.0f) {
                        /* dropout (score.cl): the forward's factor on the weight */
                        const float z = SCORE_DROPOUT ? DROPOUT_OF(bh, row, key) : 1.0f;
                        dx = pair.grad * (dp[i][j] * z - delta_r[j]) * pair.dcap;
                    }
                }
                dx_tile[rr * BG_BR_PAD + kk] = dx;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* 3. dQ += dX K over the tile's keys, four at a time */
        const uint keys4 = (keys + 3) / 4 * 4;
        for (uint r0 = 0; r0 < keys4; r0 += 4) {
            float4 x4[BG_RK];
            for (uint i = 0; i < BG_RK; ++i)
                x4[i] = dx_tile4[((ty + i * BG_TY) * BG_BR_PAD + r0) / 4];
            BG_DQ_KEY(0, x)
            BG_DQ_KEY(1, y)
            BG_DQ_KEY(2, z)
            BG_DQ_KEY(3, w)
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (uint i = 0; i < BG_RK; ++i) {
        const uint rr = ty + i * BG_TY;
        if (rr >= rows)
            continue;
        const ulong dq_at =
            dq_offset + b * dq_s0 + h * dq_s1 + ((ulong)span.q0 + row0 + rr) * dq_s2;
        for (uint c = 0; c < BG_RDK; ++c) {
            const uint dim = tx + c * BG_TX;
            if (dim < HEAD_DIM_QK)
                STORE(DQ_DTYPE, dq[i][c], DQ, dq_at + dim * dq_s3);
        }
    }
}
