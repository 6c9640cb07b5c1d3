/*
 * flash_gpu.cl: fused scaled dot-product attention for GPUs, shaped like FlashAttention-2: a
 * work-group owns a block of FG_BQ query rows of one (batch, head) and its FG_TX x FG_TY
 * work-items cooperate on every tile, so no work-item holds a whole row of q or of the output
 * (flash.cl gives each work-item one row, which lives in local memory on GPUs: see its header).
 *
 * Same arguments, same score rule (score.cl) and same results as flash.cl, which documents
 * them: Q, K, V, O views with four strides and dtypes, mask, key padding, key band,
 * relu, log-sum-exp, key parts (key_begin .. key_stop, resume).
 *
 * Per key tile of FG_BK keys (six barriers per work-item: after staging K, after the scores,
 * two after the row pass (one only PoCL 3.1 needs, see step 3), after staging V, at the end):
 *   1. the group stages K (as float) in kv_tile and, with key padding (SCORE_KPAD), the
 *      tile's padding flags;
 *   2. S = Q K^T: work-item (tx, ty) computes FG_RM x FG_RN scores in registers, rows
 *      ty + i*FG_TY and keys tx + j*FG_TX (strided, so neighbouring work-items read
 *      neighbouring rows), from q_tile (staged once, scaled) and kv_tile, read as float4s
 *      (128-bit local loads: rows of QK4 = d_k rounded up to whole float4s, zeros past d_k,
 *      + 4 words of padding so that rows start 16-byte aligned 4 banks apart); the masked
 *      scores go to p_tile;
 *   3. one work-item per row turns its row of p_tile into weights (online softmax: the running
 *      max m and sum l of the row live in local memory, the rescale factor of the accumulator
 *      goes to row_c), then the group stages V over K in kv_tile;
 *   4. O = O * c + P V: work-item (tx, ty) keeps FG_RM x FG_RD output elements in registers,
 *      rows ty + i*FG_TY and dims tx + c*FG_TX, reading each row's weights four keys at a
 *      time as one float4.
 * Local loads per FMA (tests/gpu_model, counted by Oclgrind with 48 KiB of local memory and
 * held to its formulas): 0.195 at d = 64, 0.235 at d = 24, 0.248 at d = 128 (0.531, 0.668
 * and 0.703 with the scalar loads before 2026-12-04).
 *
 *            keys k0 .. k0+FG_BK          dims 0 .. HEAD_DIM_V
 *   rows   +-------------------+         +-------------------+
 *   (FG_BQ)| S, P: item (tx,ty)|    x V  | O: item (tx,ty)   |  registers: FG_RM x FG_RN (S)
 *          | rows ty+i*TY,     |  ---->  | rows ty+i*TY,     |             FG_RM x FG_RD (O)
 *          | keys tx+j*TX      |         | dims tx+c*TX      |
 *          +-------------------+         +-------------------+
 *
 * Resources, measured 2026-12-04 by tests/resources/run.sh (a proxy: clang 15 + libclc to PTX,
 * then CUDA 13.0's `ptxas -v -arch=sm_90`; AMD: LLVM 15's gfx90a back end; every variant in
 * tests/resources/table.md, budgets in tests/resources/budgets.txt), float32, with the tiles
 * the host picks for 48 KiB of local memory (it halves FG_BQ down to 32, then FG_BK, then
 * FG_BQ, until they fit), for the variant without mask, padding, relu or soft-capping:
 *   d = 64:  BQ 64, BK 32, TX 16, TY 8 (128 items): 128 registers and a 192-byte stack frame:
 *            S 8x2 + O 8x4 = 48 floats that the proxy leaves in (cached) local memory, not
 *            in registers; no spills. Local 36096 B. gfx90a: 202 VGPRs, no scratch. With a
 *            mask or key padding: 154 registers, 218 VGPRs.
 *   d = 128: BQ 32, BK 32: 128 registers, 128-byte stack (S 4x2 + O 4x8); local 38784 B;
 *            gfx90a 170 VGPRs (168 registers with a mask or padding). Before: BQ 64, BK 16,
 *            168 registers, 288-byte stack.
 *   d = 256: BQ 16, BK 16: 153 registers, no stack; local 34752 B; gfx90a 154 VGPRs.
 *   d = 32, 80 (BQ 64, BK 32): 168, 96 registers; 64, 224-byte stacks. d = 96: BQ 32, BK 32,
 *            202 registers, no stack.
 * 16-bit storage changes these by at most one register.
 * The paper budget this header gave before (~60 registers: S + O + operands) counted only the
 * accumulators; addresses (64-bit strides and offsets), the key band, loop state and the QK^T
 * operands take the rest. With every loop over FG_RM, FG_RN and FG_RD unrolled (#pragma
 * unroll, tried on 2026-12-03, not kept) the accumulators do move to registers, but d = 64
 * then needs 255 registers (no stack) and d = 128 255 registers plus 168 bytes of spills.
 * Occupancy on sm_90 (64 K registers, 227 KiB of shared memory per SM): registers bound it,
 * 4 groups (16 warps) per SM at d = 64 and d = 128. bench/gpu_model.py turns the counts and
 * these registers into predicted times (H200: 77 % of FP32 peak at L = 4096 d = 64, 73 % at
 * d = 128, issue-bound; 43 % and 33 % before the float4 loads, local-memory-bound).
 *
 * Rows past seq_q are computed from zero queries and never stored; keys past seq_k load as
 * zeros and are masked by the score rule.
 */
#ifndef FG_BQ
#define FG_BQ 64 /* query rows per work-group (a multiple of FG_TY) */
#endif
#ifndef FG_BK
#define FG_BK 32 /* keys per tile (a multiple of FG_TX) */
#endif
#ifndef FG_TX
#define FG_TX 16 /* work-items along the keys of S and the dims of O */
#endif
#ifndef FG_TY
#define FG_TY 8 /* work-items along the rows */
#endif
#ifndef FG_DPAS
#define FG_DPAS 0 /* 1: the two products on Intel's matrix engine, 2: its emulation (below) */
#endif

/* Score switches (host/ops/score.c's one table, as flash_cpu.cl has them): a variant built
 * without a mask, key padding, soft-capping or relu leaves their code out, so that a plain
 * attention carries no tanh, mask loads or relu pass (the runtime flags still decide within a
 * variant that has them). Unset: everything compiled in. */
#ifndef SCORE_MASK
#define SCORE_MASK 1
#endif
#ifndef SCORE_KPAD
#define SCORE_KPAD 1
#endif
#ifndef SCORE_RELU
#define SCORE_RELU 1
#endif
#ifndef SCORE_SOFTCAP
#define SCORE_SOFTCAP 1
#endif

#if FG_BQ % FG_TY != 0 || FG_BK % FG_TX != 0
#error "flash_gpu.cl: FG_BQ must be a multiple of FG_TY and FG_BK of FG_TX"
#endif

#define FG_THREADS (FG_TX * FG_TY)
#define FG_RM (FG_BQ / FG_TY)                      /* rows per work-item */
#define FG_RN (FG_BK / FG_TX)                      /* keys per work-item in S */
#define FG_RD ((HEAD_DIM_V + FG_TX - 1) / FG_TX)   /* output dims per work-item */
/* q and K rows are read as float4 (128-bit local loads): d_k rounded up to whole float4s
 * (zeros past d_k), rows 4 words longer than that (16-byte aligned, and neighbouring rows 4
 * banks apart); the weights' rows likewise (FG_BK rounded up, + 4). V stays scalar, rows of
 * d_v + 1 words (its dims are strided over the work-items). */
#define QK4 ((HEAD_DIM_QK + 3) / 4 * 4)
#define QK_PAD (QK4 + 4)
#define V_PAD (HEAD_DIM_V + 1)
#define BK4 (FG_BK / 4 * 4) /* keys of a tile whose weights are read as float4 */
#define P_PAD ((FG_BK + 3) / 4 * 4 + 4)
#define KV_WORDS ((FG_BK * (QK_PAD > V_PAD ? QK_PAD : V_PAD) + 3) / 4 * 4)

/* O += P V for key j of the tile, the rows' weights in component c of p4[i]. */
#define FG_PV_KEY(j, c)                                                                           \
    {                                                                                             \
        float v[FG_RD];                                                                           \
        for (uint cc = 0; cc < FG_RD; ++cc) {                                                     \
            const uint dim = tx + cc * FG_TX;                                                     \
            v[cc] = dim < HEAD_DIM_V ? kv_tile[(j) * V_PAD + dim] : 0.0f;                         \
        }                                                                                         \
        for (uint i = 0; i < FG_RM; ++i)                                                          \
            for (uint cc = 0; cc < FG_RD; ++cc)                                                   \
                acc[i][cc] = fma(p4[i].c, v[cc], acc[i][cc]);                                     \
    }

/* ---- flash_attention's steps (score.cl's contract), always inlined into the kernel (PoCL
 * left plain `inline` steps as calls, their register arrays in memory): the row open
 * (fg_load_q, fg_open_rows; the accumulators' start stays in the kernel: as a step it cost
 * gfx90a 16 VGPRs at d = 256 in the resources proxy), per key tile steps 1-4 (fg_stage_k,
 * fg_scores, fg_weights, fg_stage_v, fg_accumulate), the row close (fg_close_rows,
 * fg_store). Every work-item calls each of them; the barriers between them stay in the
 * kernel. Each takes the kernel's parameter struct and reads its fields by name. */

/* The query block, scaled (FG_DPAS: as stored, its 16-bit values exact; the scores are scaled
 * instead); rows past seq_q and dims past d_k are zeros. */
#if FG_DPAS
#define FG_Q_SCALE 1.0f
#else
#define FG_Q_SCALE scale
#endif
__attribute__((always_inline)) inline void
fg_load_q(__local float *q_tile, __global const ELEM_T(Q_DTYPE) *Q,
          const clattn_flash_params params, const seq_span span, const uint first_row,
          const uint lid)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    for (uint e = lid; e < FG_BQ * QK4; e += FG_THREADS) {
        const uint r = e / QK4, d = e - r * QK4;
        const uint row = first_row + r;
        q_tile[r * QK_PAD + d] = row < span.rows && d < HEAD_DIM_QK
                                     ? LOAD(Q_DTYPE, Q, row * q_s2 + d * q_s3) * FG_Q_SCALE
                                     : 0.0f;
    }
}

/* Row state: the initial one, or the state the previous key part left (m = lse, l = 1;
 * relu: l = exp(lse)). */
__attribute__((always_inline)) inline void
fg_open_rows(__local float *row_m, __local float *row_l, __global const float *lse,
             const clattn_flash_params params, const seq_span span, const uint first_row,
             const ulong lse_base, const uint lid, const int relu)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    for (uint r = lid; r < FG_BQ; r += FG_THREADS) {
        const uint row = first_row + r;
        float m = NEG_INF, l = 0.0f;
        if (resume && row < span.rows) {
            const float previous = lse[lse_base + row * lse_s2];
            if (previous != NEG_INF) {
                l = relu ? exp(previous) : 1.0f;
                m = relu ? NEG_INF : previous;
            }
        }
        row_m[r] = m;
        row_l[r] = l;
    }
}

#if KV_PAGED
/* A paged cache: the tile's keys' pages (tile_pages[j]) and slots (tile_pages[FG_BK + j]),
 * one table read and one division a key, once a tile for the K and the V staging (each of
 * their elements took a division and a table read through KEY_AT). Keys past the count: 0. */
__attribute__((always_inline)) inline void
fg_stage_pages(__local uint *tile_pages, __global const int *block_table, const ulong bt_row,
               const clattn_flash_params params, const key_band band, const uint k0,
               const uint lid)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    for (uint j = lid; j < FG_BK; j += FG_THREADS) {
        const uint key = k0 + j, block = key / page_size;
        const bool real = key < band.limit;
        tile_pages[j] = real ? (uint)block_table[bt_row + block * bt_s1] : 0u;
        tile_pages[FG_BK + j] = real ? key - block * page_size : 0u;
    }
}
/* The element offset of the tile's key j's row (fg_stage_pages' page and slot) */
#define FG_KEY_AT(j, row_stride, page_stride)                                                     \
    ((ulong)tile_pages[(j)] * (page_stride) + (ulong)tile_pages[FG_BK + (j)] * (row_stride))
#else
#define FG_KEY_AT(j, row_stride, page_stride) ((ulong)(k0 + (j)) * (row_stride))
#endif

/* 1. K tile and key padding. */
__attribute__((always_inline)) inline void
fg_stage_k(__local float *kv_tile, __local uchar *tile_padded,
           __global const ELEM_T(K_DTYPE) *K, __global const uchar *key_padding,
           __local const uint *tile_pages, const clattn_flash_params params,
           const key_band band, const uint k0, const uint lid, const int use_padding)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    for (uint e = lid; e < FG_BK * QK4; e += FG_THREADS) {
        const uint j = e / QK4, d = e - j * QK4;
        kv_tile[j * QK_PAD + d] = k0 + j < band.limit && d < HEAD_DIM_QK
                                      ? LOAD(K_DTYPE, K, FG_KEY_AT(j, k_s2, k_page) + d * k_s3)
                                      : 0.0f;
    }
    if (use_padding) /* (no flags to stage or read without key padding) */
        for (uint j = lid; j < FG_BK; j += FG_THREADS) {
            const uint key = k0 + j;
            tile_padded[j] = key < seq_k && key_padded(1, key_padding, key * key_padding_s1);
        }
}

/* The score rule (score.cl's score_rule) on this item's FG_RM x FG_RN block of scaled dot
 * products, rows ty + i * FG_TY and keys tx + j * FG_TX, into p_tile (fg_scores,
 * fg_scores_dpas). */
__attribute__((always_inline)) inline void
fg_rule_block(__local float *p_tile, float (*s)[FG_RN], __local const uchar *tile_padded,
              __global const ELEM_T(MASK_DTYPE) *mask, const clattn_flash_params params,
              const key_band band, const key_band tile_band, const seq_span span,
              const uint first_row, const uint k0, const uint tx, const uint ty, const float cap,
              const int use_padding, const int use_mask)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    for (uint i = 0; i < FG_RM; ++i) {
        const uint r = ty + i * FG_TY, row = first_row + r;
        const uint safe_row = row < span.rows ? row : 0;
        const uint row_key_begin = band_begin(band, safe_row);
        const uint row_key_end = band_end(band, safe_row);
        for (uint j = 0; j < FG_RN; ++j) {
            const uint jj = tx + j * FG_TX, key = k0 + jj;
            p_tile[r * P_PAD + jj] = score_rule(
                s[i][j], cap, tile_band, safe_row, key, row_key_begin, row_key_end,
                use_padding && tile_padded[jj], use_mask, mask,
                safe_row * mask_s2 + key * mask_s3);
        }
    }
}

/* 2. Scores of this item's FG_RM x FG_RN block (SCORE, KEEP: score.cl's score_rule), masked,
 * into p_tile. */
__attribute__((always_inline)) inline void
fg_scores(__local float *p_tile, __local const float4 *q_tile4, __local const float4 *kv_tile4,
          __local const uchar *tile_padded, __global const ELEM_T(MASK_DTYPE) *mask,
          const clattn_flash_params params, const key_band band, const key_band tile_band,
          const seq_span span, const uint first_row, const uint k0, const uint tx,
          const uint ty, const float cap, const int use_padding, const int use_mask)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    float s[FG_RM][FG_RN];
    for (uint i = 0; i < FG_RM; ++i)
        for (uint j = 0; j < FG_RN; ++j)
            s[i][j] = 0.0f;
    for (uint d4 = 0; d4 < QK4 / 4; ++d4) {
        float4 a[FG_RM], k[FG_RN];
        for (uint i = 0; i < FG_RM; ++i)
            a[i] = q_tile4[(ty + i * FG_TY) * (QK_PAD / 4) + d4];
        for (uint j = 0; j < FG_RN; ++j)
            k[j] = kv_tile4[(tx + j * FG_TX) * (QK_PAD / 4) + d4];
        for (uint i = 0; i < FG_RM; ++i)
            for (uint j = 0; j < FG_RN; ++j) {
                s[i][j] = fma(a[i].x, k[j].x, s[i][j]);
                s[i][j] = fma(a[i].y, k[j].y, s[i][j]);
                s[i][j] = fma(a[i].z, k[j].z, s[i][j]);
                s[i][j] = fma(a[i].w, k[j].w, s[i][j]);
            }
    }
    fg_rule_block(p_tile, s, tile_padded, mask, params, band, tile_band, span, first_row, k0, tx,
                  ty, cap, use_padding, use_mask);
}

/* 3. Weights (the online softmax update), one work-item per row: each row's tile of p_tile
 * becomes its weights (dropout's factors after the row sum), its running max and sum move
 * on, and its accumulator's rescale factor goes to row_c. */
__attribute__((always_inline)) inline void
fg_weights(__local float *p_tile, __local float *row_m, __local float *row_l,
           __local float *row_c, const clattn_flash_params params, const ulong bh,
           const uint first_row, const uint k0, const uint lid, const int relu)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    for (uint r = lid; r < FG_BQ; r += FG_THREADS) {
        __local float *p = p_tile + r * P_PAD;
        float m = row_m[r], l = row_l[r], c = 1.0f;
        if (relu) {
            for (uint j = 0; j < FG_BK; ++j) {
                const float w = relu_weight(p[j]);
                p[j] = w;
                l += w;
            }
        } else {
            float tile_max = NEG_INF;
            for (uint j = 0; j < FG_BK; ++j)
                tile_max = fmax(tile_max, p[j]);
            if (tile_max == NEG_INF) { /* every key of the tile masked: nothing changes */
                for (uint j = 0; j < FG_BK; ++j)
                    p[j] = 0.0f;
            } else {
                const float new_max = fmax(m, tile_max);
                c = exp(m - new_max); /* 0 while m is -inf */
                l *= c;
                for (uint j = 0; j < FG_BK; ++j) {
                    const float w = softmax_weight(p[j], new_max);
                    p[j] = w;
                    l += w;
                }
                m = new_max;
            }
        }
#if SCORE_DROPOUT
        /* after the row sum: the normaliser is the undropped row's (score.cl) */
        for (uint j = 0; j < FG_BK; ++j)
            p[j] *= DROPOUT_OF(bh, first_row + r, k0 + j);
#endif
        row_m[r] = m;
        row_l[r] = l;
        row_c[r] = c;
    }
}

/* The V tile over K in kv_tile (rows of V_PAD words). */
__attribute__((always_inline)) inline void
fg_stage_v(__local float *kv_tile, __global const ELEM_T(V_DTYPE) *V,
           __local const uint *tile_pages, const clattn_flash_params params,
           const key_band band, const uint k0, const uint lid)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    for (uint e = lid; e < FG_BK * HEAD_DIM_V; e += FG_THREADS) {
        const uint j = e / HEAD_DIM_V, d = e - j * HEAD_DIM_V;
        kv_tile[j * V_PAD + d] =
            k0 + j < band.limit ? LOAD(V_DTYPE, V, FG_KEY_AT(j, v_s2, v_page) + d * v_s3) : 0.0f;
    }
}

/* 4. O = O * c + P V on this item's FG_RM x FG_RD block. */
__attribute__((always_inline)) inline void
fg_accumulate(float (*acc)[FG_RD], __local const float4 *p_tile4, __local const float *p_tile,
              __local const float *kv_tile, __local const float *row_c, const uint tx,
              const uint ty)
{
    for (uint i = 0; i < FG_RM; ++i) {
        const float c = row_c[ty + i * FG_TY];
        for (uint cc = 0; cc < FG_RD; ++cc)
            acc[i][cc] *= c;
    }
    /* four keys at a time: each row's four weights in one float4 load */
    for (uint j4 = 0; j4 < BK4 / 4; ++j4) {
        float4 p4[FG_RM];
        for (uint i = 0; i < FG_RM; ++i)
            p4[i] = p_tile4[(ty + i * FG_TY) * (P_PAD / 4) + j4];
        FG_PV_KEY(4 * j4, x)
        FG_PV_KEY(4 * j4 + 1, y)
        FG_PV_KEY(4 * j4 + 2, z)
        FG_PV_KEY(4 * j4 + 3, w)
    }
    for (uint j = BK4; j < FG_BK; ++j) { /* FG_BK not a multiple of 4: the last keys */
        float v[FG_RD];
        for (uint cc = 0; cc < FG_RD; ++cc) {
            const uint dim = tx + cc * FG_TX;
            v[cc] = dim < HEAD_DIM_V ? kv_tile[j * V_PAD + dim] : 0.0f;
        }
        for (uint i = 0; i < FG_RM; ++i) {
            const float p = p_tile[(ty + i * FG_TY) * P_PAD + j];
            for (uint cc = 0; cc < FG_RD; ++cc)
                acc[i][cc] = fma(p, v[cc], acc[i][cc]);
        }
    }
}

/* The row close, by the row owners: the sinks (score.cl) folded in, each row's normaliser
 * into row_c, the log-sum-exp. */
__attribute__((always_inline)) inline void
fg_close_rows(__local float *row_m, __local const float *row_l, __local float *row_c,
              __global float *lse, __global const float *sinks,
              const clattn_flash_params params, const ulong h, const seq_span span,
              const uint first_row, const ulong lse_base, const uint lid, const int relu)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    for (uint r = lid; r < FG_BQ; r += FG_THREADS) {
        const uint row = first_row + r;
        /* attention sinks (score.cl): into the row's denominator, in the launch that ends it
         * (rows past seq_q read no sink) */
        float l = row_l[r], factor = 1.0f;
        if (has_sinks && row < span.rows) {
            const sunk_row sunk = sink_fold(SINK_OF(h, row), row_m[r], l);
            l = sunk.total;
            factor = sunk.factor;
            row_m[r] = sunk.max;
        }
        row_c[r] = factor * inverse_total(l) * FLASH_V_SCALE;
        if (has_lse && row < span.rows)
            lse[lse_base + row * lse_s2] =
                l == 0.0f ? NEG_INF : (relu ? log(l) : row_m[r] + log(l));
    }
}

/* This item's block of the output, normalised (row_c), stored. */
__attribute__((always_inline)) inline void
fg_store(__global ELEM_T(O_DTYPE) *O, float (*acc)[FG_RD], __local const float *row_c,
         const clattn_flash_params params, const seq_span span, const uint first_row,
         const uint tx, const uint ty)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    for (uint i = 0; i < FG_RM; ++i) {
        const uint r = ty + i * FG_TY, row = first_row + r;
        if (row >= span.rows)
            continue;
        const float inv = row_c[r];
        for (uint cc = 0; cc < FG_RD; ++cc) {
            const uint dim = tx + cc * FG_TX;
            if (dim < HEAD_DIM_V)
                STORE(O_DTYPE, acc[i][cc] * inv, O, row * o_s2 + dim * o_s3);
        }
    }
}

#ifndef KV_STEP
#define KV_STEP 0
#endif
#if KV_STEP
/* ---- a KV cache's decode step in one launch (KV_STEP; clattn_kv_cache_decode; flash_cpu.cl
 * says how): the tiles cover the cached keys (STEP_CACHED_BAND), then the group of the new
 * key's split attends it from k_new / v_new in two passes (the row owners' weights, then
 * every item's accumulators), and a k/v head's first group writes the new row into the cache
 * (score.cl's kv_step_store). */

/* The row owners: the new key's weight in p_tile's first column, the rescale factor in row_c
 * (weight 0, factor 1 for a row whose band leaves it out). */
__attribute__((always_inline)) inline void
fg_step_weights(__local float *p_tile, __local float *row_m, __local float *row_l,
                __local float *row_c, __local const float *q_tile,
                __global const ELEM_T(Q_DTYPE) *kn, const clattn_flash_params params,
                const key_band whole, const seq_span span, const uint first_row,
                const uint lid, const float cap, const int relu)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    const uint key = step_keys;
    for (uint r = lid; r < FG_BQ; r += FG_THREADS) {
        const uint row = first_row + r;
        float p = 0.0f, c = 1.0f;
        if (row < span.rows && key >= band_begin(whole, row) && key < band_end(whole, row)) {
            float dot = 0.0f;
            for (uint d = 0; d < HEAD_DIM_QK; ++d)
                dot = fma(q_tile[r * QK_PAD + d], LOAD(Q_DTYPE, kn, d * kn_s3), dot);
            const float s = score_builtin(dot, cap, whole, row, key);
            if (relu) {
                p = relu_weight(s);
            } else {
                const float m = row_m[r], new_max = fmax(m, s);
                c = exp(m - new_max); /* 0 while m is -inf (the new key) */
                p = softmax_weight(s, new_max);
                row_m[r] = new_max;
            }
            row_l[r] = row_l[r] * c + p;
        }
        p_tile[r * P_PAD] = p;
        row_c[r] = c;
    }
}

/* Every item: acc = acc * c + p v_new on its block. */
__attribute__((always_inline)) inline void
fg_step_accumulate(float (*acc)[FG_RD], __local const float *p_tile, __local const float *row_c,
                   __global const ELEM_T(Q_DTYPE) *vn, const clattn_flash_params params,
                   const uint tx, const uint ty)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    for (uint i = 0; i < FG_RM; ++i) {
        const uint r = ty + i * FG_TY;
        const float c = row_c[r], p = p_tile[r * P_PAD];
        for (uint cc = 0; cc < FG_RD; ++cc) {
            const uint dim = tx + cc * FG_TX;
            const float v = dim < HEAD_DIM_V ? LOAD(Q_DTYPE, vn, dim * vn_s3) : 0.0f;
            acc[i][cc] = fma(p, v, acc[i][cc] * c);
        }
    }
}

#endif

#if FG_DPAS
/* ---- The two products on Intel's matrix engines (FG_DPAS; issue 51) ------------------------
 * cl_intel_subgroup_matrix_multiply_accumulate's 16-bit functions (the DPAS instruction under
 * oneDNN's SDPA micro-kernels): one call multiplies an 8 x 16 matrix A by a 16 x N matrix B,
 * N = the sub-group size (8 or 16), into 8 x N float32 sums, all lanes of the sub-group
 * together. The operands, as the extension lays them out (k = 0 .. 15 along the product):
 *   A, 8 rows m: sub-group size 8: lane l holds A[m][2l] | A[m][2l + 1] << 16 (int8 a);
 *                sub-group size 16: lane l holds A[m][l] (short8 a);
 *   B, column n = the lane: b[p] = B[2p][n] | B[2p + 1][n] << 16 (int8 b, p = 0 .. 7);
 *   C, D: lane n holds column n, component m = row m (float8).
 * Here a sub-group is one row ty of the group's FG_TX x FG_TY items (FG_TX = its size) and its
 * 8 rows are this item's FG_RM = 8 rows ty + i * FG_TY, so every other step (staging, the
 * score rule, the weights, the row close, the store) is flash_gpu's own:
 *   S = Q K^T: A = q (the 8 rows, 16 dims at a time), B = K^T (lane n: key tx + j * FG_TX's 16
 *              dims, one 16-bit pair per int): the item's s[i][j] as flash_gpu computes it;
 *   O += P V:  A = P (the weights, as 16-bit values: the only rounding the variant adds),
 *              B = V (lane n: dim tx + cc * FG_TX of 16 keys): the item's acc[i][cc].
 * q is staged unscaled (the 16-bit inputs convert exactly) and the scores scaled after the
 * product. FG_DPAS = 2 emulates the extension's function in plain OpenCL C: each lane's A
 * fragment goes through local memory (dp_xa: FG_TY x 8 x FG_TX words) and every lane
 * computes its own column, so the layout and indexing above run, and are tested, on any
 * device (PoCL, Oclgrind); its speed means nothing. The host picks FG_DPAS = 1 only where the
 * device reports the extension (host/ops/flash_gpu.c, tuning key fg_dpas); no device of ours
 * has it, so the hardware path is compiled by nobody here and its speed is unmeasured. */
#if FG_RM != 8 || FG_BK % 16 != 0 || HEAD_DIM_QK % 16 != 0 || (FG_TX != 8 && FG_TX != 16) ||      \
    KV_STEP || Q_DTYPE != K_DTYPE || Q_DTYPE != V_DTYPE || (Q_DTYPE != 1 && Q_DTYPE != 2)
#error "flash_gpu.cl: FG_DPAS takes 8 rows an item, 16-key tiles, d_k a multiple of 16, "      \
       "sub-groups of 8 or 16, f16 or bf16 q, k and v of one type, and no KV_STEP"
#endif
#define FG_DP_BF16 (Q_DTYPE == 2)

/* A float (a 16-bit input's value, or a weight) as the operand's 16 bits: f16 or bf16, rounded
 * to nearest even. */
__attribute__((always_inline)) inline uint dp_bits(const float x)
{
#if FG_DP_BF16
    return bf16_from_float(x);
#else
    ushort h;
    vstore_half_rte(x, 0, (half *)&h);
    return h;
#endif
}

/* Two neighbours along k in one operand word (the lower k in the low half). */
#define DP_PAIR(lo, hi) (dp_bits(lo) | dp_bits(hi) << 16)

#if FG_DPAS == 1
#pragma OPENCL EXTENSION cl_intel_subgroups : enable
#if FG_DP_BF16
#define DP_MAD intel_sub_group_bf16_bf16_matrix_mad_k16
#else
#define DP_MAD intel_sub_group_f16_f16_matrix_mad_k16
#endif
#if FG_TX == 8
#define DP_A(a) (int8)((int)a[0], (int)a[1], (int)a[2], (int)a[3], (int)a[4], (int)a[5], \
                       (int)a[6], (int)a[7])
#else
#define DP_A(a) (short8)((short)a[0], (short)a[1], (short)a[2], (short)a[3], (short)a[4], \
                         (short)a[5], (short)a[6], (short)a[7])
#endif
#define FG_KERNEL_ATTRS __attribute__((intel_reqd_sub_group_size(FG_TX)))

/* d[m] += sum_k A[m][k] B[k][lane] on the sub-group's matrix engine */
__attribute__((always_inline)) inline void dp_mad(float *d, const uint *a, const uint *b,
                                                  __local uint *xa, const uint lane)
{
    float8 c = (float8)(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]);
    c = DP_MAD(DP_A(a),
               (int8)((int)b[0], (int)b[1], (int)b[2], (int)b[3], (int)b[4], (int)b[5],
                      (int)b[6], (int)b[7]),
               c);
    d[0] = c.s0, d[1] = c.s1, d[2] = c.s2, d[3] = c.s3;
    d[4] = c.s4, d[5] = c.s5, d[6] = c.s6, d[7] = c.s7;
}
#else
#define FG_KERNEL_ATTRS

/* The 16 bits back to a float (emulation). */
__attribute__((always_inline)) inline float dp_value(const uint bits)
{
#if FG_DP_BF16
    return as_float((bits & 0xffffu) << 16);
#else
    const ushort h = (ushort)bits;
    return vload_half(0, (const half *)&h);
#endif
}

/* The same in plain OpenCL C: the sub-group's A fragments through xa (its 8 x FG_TX words),
 * then each lane its own column. Every item of the group calls it (uniform: the barriers). */
__attribute__((always_inline)) inline void dp_mad(float *d, const uint *a, const uint *b,
                                                  __local uint *xa, const uint lane)
{
    for (uint m = 0; m < 8; ++m)
        xa[m * FG_TX + lane] = a[m];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint m = 0; m < 8; ++m) {
        float sum = d[m];
        for (uint p = 0; p < 8; ++p) {
#if FG_TX == 8
            const uint w = xa[m * 8 + p];
            const float a0 = dp_value(w), a1 = dp_value(w >> 16);
#else
            const float a0 = dp_value(xa[m * 16 + 2 * p]), a1 = dp_value(xa[m * 16 + 2 * p + 1]);
#endif
            sum = fma(a0, dp_value(b[p]), sum);
            sum = fma(a1, dp_value(b[p] >> 16), sum);
        }
        d[m] = sum;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#endif

/* This item's A fragment of 8 rows (ty + i * FG_TY of `tile`, rows `pitch` words apart) at
 * columns c0 .. c0 + 15. */
__attribute__((always_inline)) inline void dp_rows(uint *a, __local const float *tile,
                                                   const uint pitch, const uint c0,
                                                   const uint tx, const uint ty)
{
    for (uint i = 0; i < 8; ++i) {
        __local const float *x = tile + (ty + i * FG_TY) * pitch + c0;
#if FG_TX == 8
        a[i] = DP_PAIR(x[2 * tx], x[2 * tx + 1]);
#else
        a[i] = dp_bits(x[tx]);
#endif
    }
}

/* 2. (FG_DPAS) fg_scores with S = Q K^T on the matrix engine. */
__attribute__((always_inline)) inline void
fg_scores_dpas(__local float *p_tile, __local const float *q_tile, __local const float *kv_tile,
               __local const uchar *tile_padded, __global const ELEM_T(MASK_DTYPE) *mask,
               const clattn_flash_params params, const key_band band, const key_band tile_band,
               const seq_span span, const uint first_row, const uint k0, const uint tx,
               const uint ty, const float cap, const int use_padding, const int use_mask,
               __local uint *xa)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    float s[FG_RN][8]; /* s[j][i]: row ty + i * FG_TY, key tx + j * FG_TX */
    for (uint j = 0; j < FG_RN; ++j)
        for (uint i = 0; i < 8; ++i)
            s[j][i] = 0.0f;
    for (uint c0 = 0; c0 < HEAD_DIM_QK; c0 += 16) {
        uint a[8];
        dp_rows(a, q_tile, QK_PAD, c0, tx, ty);
        for (uint j = 0; j < FG_RN; ++j) {
            __local const float *k = kv_tile + (tx + j * FG_TX) * QK_PAD + c0;
            uint b[8];
            for (uint p = 0; p < 8; ++p)
                b[p] = DP_PAIR(k[2 * p], k[2 * p + 1]);
            dp_mad(s[j], a, b, xa, tx);
        }
    }
    float scaled[FG_RM][FG_RN]; /* (fg_rule_block's layout, the scale applied) */
    for (uint i = 0; i < FG_RM; ++i)
        for (uint j = 0; j < FG_RN; ++j)
            scaled[i][j] = s[j][i] * scale;
    fg_rule_block(p_tile, scaled, tile_padded, mask, params, band, tile_band, span, first_row,
                  k0, tx, ty, cap, use_padding, use_mask);
}

/* 4. (FG_DPAS) fg_accumulate with O += P V on the matrix engine, 16 keys a call. */
__attribute__((always_inline)) inline void
fg_accumulate_dpas(float (*acc)[FG_RD], __local const float *p_tile, __local const float *kv_tile,
                   __local const float *row_c, const uint tx, const uint ty, __local uint *xa)
{
    for (uint i = 0; i < FG_RM; ++i) {
        const float c = row_c[ty + i * FG_TY];
        for (uint cc = 0; cc < FG_RD; ++cc)
            acc[i][cc] *= c;
    }
    for (uint k0 = 0; k0 < FG_BK; k0 += 16) {
        uint a[8];
        dp_rows(a, p_tile, P_PAD, k0, tx, ty);
        for (uint cc = 0; cc < FG_RD; ++cc) {
            const uint dim = tx + cc * FG_TX;
            uint b[8];
            for (uint p = 0; p < 8; ++p)
                b[p] = dim < HEAD_DIM_V ? DP_PAIR(kv_tile[(k0 + 2 * p) * V_PAD + dim],
                                                  kv_tile[(k0 + 2 * p + 1) * V_PAD + dim])
                                        : 0u;
            float d[8];
            for (uint i = 0; i < 8; ++i)
                d[i] = acc[i][cc];
            dp_mad(d, a, b, xa, tx);
            for (uint i = 0; i < 8; ++i)
                acc[i][cc] = d[i];
        }
    }
}
#else
#define FG_KERNEL_ATTRS
#endif


__kernel __attribute__((reqd_work_group_size(FG_THREADS, 1, 1))) FG_KERNEL_ATTRS
void flash_attention(FLASH_KERNEL_PARAMS)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    const int use_mask = SCORE_MASK && has_mask;
    const int use_padding = SCORE_KPAD && has_key_padding;
    const int relu = SCORE_RELU && norm_relu;
    const float cap = SCORE_SOFTCAP ? softcap : 0.0f;
    __local float4 q_tile4[FG_BQ * QK_PAD / 4];
    __local float4 kv_tile4[KV_WORDS / 4];
    __local float4 p_tile4[FG_BQ * P_PAD / 4];
    __local float *q_tile = (__local float *)q_tile4; /* the same words, one float at a time */
    __local float *kv_tile = (__local float *)kv_tile4;
    __local float *p_tile = (__local float *)p_tile4;
    __local float row_m[FG_BQ], row_l[FG_BQ], row_c[FG_BQ]; /* running max, sum, rescale */
    __local uchar tile_padded[FG_BK];
#if FG_DPAS == 2
    __local uint dp_xa_all[FG_TY * 8 * FG_TX]; /* the emulated sub-groups' A fragments */
    __local uint *dp_xa = dp_xa_all + (get_local_id(0) / FG_TX) * 8 * FG_TX;
#else
    __local uint *dp_xa = 0; /* (unread) */
#endif
#if KV_PAGED
    __local uint tile_pages[2 * FG_BK]; /* the tile's keys' pages and slots (fg_stage_pages) */
#else
    __local const uint *tile_pages = 0; /* (unread) */
#endif

    const uint lid = get_local_id(0);
    const uint tx = lid % FG_TX, ty = lid / FG_TX;
    OPEN_GROUP_ROWS(FG_BQ) /* score.cl: first_row, bh, b, h (the packed grid's, or by id) */
    /* the batch's rows and keys (score.cl: a packed sequence's, or seq_q and seq_k) */
    const seq_span span = SPAN_OF(b);
    if (first_row >= span.rows)
        return; /* the whole work-group past a packed sequence's rows (uniform) */
    /* the launch's keys (score.cl's split_begin: a decode split's, else the part's) */
    const uint split = get_global_id(2);
    const uint key_begin = split_begin(part_begin, split_keys, split);
    const uint key_stop = split_stop(part_stop, split_keys, key_begin);

    OPEN_GROUP_QKV(b, h, span) /* score.cl: Q, K, V at the group's batch, head, sequence */
    O += o_offset + split * o_split + b * o_s0 + h * o_s1 + span.q0 * o_s2;
    const ulong lse_base =
        lse_offset + split * lse_split + b * lse_s0 + h * lse_s1 + span.q0 * lse_s2;
    if (use_mask)
        mask += mask_offset + b * mask_s0 + h * mask_s1;
    if (use_padding)
        key_padding += key_padding_offset + b * key_padding_s0;

    fg_load_q(q_tile, Q, params, span, first_row, lid);
    fg_open_rows(row_m, row_l, lse, params, span, first_row, lse_base, lid, relu);
    barrier(CLK_LOCAL_MEM_FENCE);
    /* this item's FG_RM x FG_RD block of the output: zeros, or the previous key part's */
    float acc[FG_RM][FG_RD];
    for (uint i = 0; i < FG_RM; ++i) {
        const uint r = ty + i * FG_TY, row = first_row + r;
        const float l = row_l[r];
        for (uint c = 0; c < FG_RD; ++c) {
            const uint dim = tx + c * FG_TX;
            acc[i][c] = resume && l > 0.0f && row < span.rows && dim < HEAD_DIM_V
                            ? LOAD(O_DTYPE, O, row * o_s2 + dim * o_s3) * l / FLASH_V_SCALE
                            : 0.0f;
        }
    }

    /* Keys the group needs: from its first row's band begin to its last row's band end
     * (bounds uniform over the group). */
    OPEN_PAGED_ROW(b)
    const key_band whole = FUSED_BAND(b, h, span); /* score.cl's row open */
    const key_band band = STEP_CACHED_BAND(whole);    /* KV_STEP: the cached keys' tiles */
    const group_keys group = open_group(band, span.rows, first_row, FG_BQ, key_begin, key_stop, FG_BK);
    const uint last_row = group.last_row, key_end = group.key_end;

    for (uint k0 = group.key_first; k0 < key_end; k0 += FG_BK) {
        /* score.cl's block-mask verdict on the tile (uniform): empty ones skipped */
        const uint tile_state = FLEX_VISIT(
            FLEX_TILE(b, h, first_row, last_row, k0, min(k0 + FG_BK, band.limit)), lid == 0);
        if (tile_state == FLEX_EMPTY)
            continue;
        const key_band tile_band = flex_tile_band(band, tile_state);
#if KV_PAGED
        fg_stage_pages(tile_pages, block_table, bt_row, params, band, k0, lid);
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        fg_stage_k(kv_tile, tile_padded, K, key_padding, tile_pages, params, band, k0, lid,
                   use_padding);
        barrier(CLK_LOCAL_MEM_FENCE);
#if FG_DPAS
        fg_scores_dpas(p_tile, q_tile, kv_tile, tile_padded, mask, params, band, tile_band, span,
                       first_row, k0, tx, ty, cap, use_padding, use_mask, dp_xa);
#else
        fg_scores(p_tile, q_tile4, kv_tile4, tile_padded, mask, params, band, tile_band, span,
                  first_row, k0, tx, ty, cap, use_padding, use_mask);
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        /* 3. while the group stages V over K */
        fg_weights(p_tile, row_m, row_l, row_c, params, bh, first_row, k0, lid, relu);
        /* A barrier the algorithm does not need (the V staging below touches none of the row
         * pass's data), but PoCL 3.1 computes wrong weights without it: seen as NaN outputs
         * on the CPU with more than one work-item per group; Oclgrind is clean either way. */
        barrier(CLK_LOCAL_MEM_FENCE);
        barrier(CLK_LOCAL_MEM_FENCE);
        fg_stage_v(kv_tile, V, tile_pages, params, band, k0, lid);
        barrier(CLK_LOCAL_MEM_FENCE);
#if FG_DPAS
        fg_accumulate_dpas(acc, p_tile, kv_tile, row_c, tx, ty, dp_xa);
#else
        fg_accumulate(acc, p_tile4, p_tile, kv_tile, row_c, tx, ty);
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
    }

#if KV_STEP
    /* (uniform; the barriers outside the branches: with them inside the branch PoCL 3.1 gave
     * every item of the row close below the first row's index, so a decode group's query
     * heads all took the first one's sink; check_decode_step's GQA cases with sinks) */
    const bool step_here = kv_step && key_begin <= step_keys && step_keys < key_stop;
    if (step_here) {
        k_new += kn_offset + b * kn_s0 + (h / kv_group) * kn_s1;
        v_new += vn_offset + b * vn_s0 + (h / kv_group) * vn_s1;
    }
    /* (no tile may have run: the accumulators' start read row_l) */
    barrier(CLK_LOCAL_MEM_FENCE);
    if (step_here)
        fg_step_weights(p_tile, row_m, row_l, row_c, q_tile, k_new, params, whole, span,
                        first_row, lid, cap, relu);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (step_here)
        fg_step_accumulate(acc, p_tile, row_c, v_new, params, tx, ty);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (step_here && first_row == 0 && h % kv_group == 0)
        kv_step_store(K, V, k_new, v_new, kv_len, block_table, bt_row, params, b, h, lid,
                      FG_THREADS);
#endif
    /* Normalise and store; the log-sum-exp by the row owners. */
    fg_close_rows(row_m, row_l, row_c, lse, sinks, params, h, span, first_row, lse_base, lid,
                  relu);
    barrier(CLK_LOCAL_MEM_FENCE);
    fg_store(O, acc, row_c, params, span, first_row, tx, ty);
}
