/*
 * flash_cpu.cl: fused scaled dot-product attention for CPU devices (PoCL), the same operation
 * and arguments' meaning as flash.cl (read its header for the score rule, key parts, resume
 * and the all-masked row), written for a CPU core instead of a GPU's lanes:
 *
 * A work-group of one work-item owns FC_ROWS = FC_RB * FC_NB query rows of one (b, h) and
 * streams the keys in tiles of FC_KT = 64. It packs each tile once into local memory, as float
 * (any dtype, any strides), in the layouts the inner loops want:
 *     kt [d][64]       K transposed;   vt [64][FC_DVP]  V rows padded with zeros to a multiple
 *     of 16;   kb [64]  0, or -inf for a key the rule drops in every row (key_masked: key
 *     padding, or past seq_k; such keys are packed as zeros)
 * then loops over its FC_NB row blocks, which all use the tile while it is in L1/L2 (the pack
 * costs 1/FC_ROWS of the tile's arithmetic). With FC_TWO_PASS (tuning key flash_cpu_tp, the
 * default) the blocks go over the tile twice: first each block's scores and weights (kept in
 * pt, a row each, and each row's rescale factor), then each block's P.V. So the blocks read K's
 * tile, then V's, back to back: at d = 128 the two are 32 KiB each, and taken block by block
 * they evicted each other from a 48 KiB L1 (1.05-1.09x at d = 128, L = 1024-4096, on an Intel
 * Xeon; d = 64 and 96 within noise). A block of FC_RB rows against the tile is a
 * register-blocked microkernel: FC_RB x FC_KV float16 scores (FC_KV = 4 where the device has
 * 32 vector registers, AVX-512; 1 where it has 16, AVX2), each step broadcasting q[r][d]
 * times the 16-key vectors kt[d][..] with fma(); then the online softmax on those vectors
 * (the block's row maxima and sums reduced together, fc_rows_max8; vectorised exp below; the
 * rescale of the row's accumulator is folded into the P.V step, a
 * factor 1 unless the row's max grew), then P.V in registers the same way: FC_RB x FC_KV float16
 * accumulators of 16 * FC_KV output columns at a time, broadcasting p[r][j] times the V row j.
 * Accumulators, row max and row sum live in local memory between tiles.
 *
 *       tile of 64 keys (kt: d x 64)        V tile (vt: 64 x FC_DVP)
 *   block r0..r0+FC_RB  s[FC_RB][4] float16  ->  p  ->  acc[FC_RB][4] float16 per 64 columns
 *
 * FC_DIRECT (decode: a few query rows, FC_NB = 1, head sizes multiples of 16): a tile whose K
 * and V rows have unit stride is not packed. Each row's score on a key is the dot product of
 * the q row and the key's row read from global memory (float16 vectors along d, one
 * horizontal sum per row and key), and P.V reads V's rows where they lie. With one to eight
 * rows the pack would cost more than the arithmetic it serves: it moved every element of the
 * cache twice through local memory, transposing K with scalar stores, for one use. The edge
 * tile (the last, past the key count) is read in place too, its keys inside the count only:
 * packed, its scalar transposing loop took 10-20 % of a decode step at caches of 1k-2k keys.
 * Tiles of strided K or V are packed as above.
 *
 * Compile-time variants keep the plain case free of extras (score.cl's switches, set from the
 * host's one table in ops/score.c): SCORE_MASK (a mask of MASK_DTYPE, applied per score with
 * score.cl's masked_score), SCORE_KPAD (key padding: the KB bias on every tile), SCORE_BAND (1
 * when the key band has a diagonal bound, causal or a sliding window: tiles outside a block's
 * band are skipped, and the keys outside each row's band dropped only on tiles that cross one
 * of its edges; the band's values are arguments), SCORE_RELU (relu normalisation instead of
 * softmax), SCORE_DROPOUT (each tile's weights times their dropout factors, after the row
 * sum). lse and resume are arguments, used outside the tile loop. Local memory:
 * FC_ROWS * (HEAD_DIM_QK + FC_DVP + 2)
 * + 64 * (FC_RB + HEAD_DIM_QK + FC_DVP + 1) floats (96 rows at d = 256: 324 KiB), and
 * 64 * FC_ROWS more with FC_TWO_PASS (48 KiB at 192 rows); the host checks the device's size.
 */
#ifndef FC_RB
#define FC_RB 6 /* query rows per register block */
#endif
#ifndef FC_NB
#define FC_NB 32 /* register blocks per work-group: they share each key tile while it is cached */
#endif
#ifndef FC_KV
#define FC_KV 4 /* float16 vectors per register-block row: 4 (32 registers), 1 (16: AVX2) */
#endif
#ifndef FC_TWO_PASS
#define FC_TWO_PASS 0 /* 1: a tile's blocks all take their weights, then all their P.V (below) */
#endif
#ifndef FC_PF
#define FC_PF 0 /* N > 0: a paged cache's direct tiles prefetch the rows of the tile N ahead */
#endif
#ifndef FC_DIRECT
#define FC_DIRECT 0 /* 1: tiles read straight from K and V where they can (decode; see above) */
#endif
#ifndef SCORE_MASK
#define SCORE_MASK 0
#endif
#ifndef SCORE_KPAD
#define SCORE_KPAD 0
#endif
#ifndef SCORE_BAND
#define SCORE_BAND 0
#endif
#ifndef SCORE_RELU
#define SCORE_RELU 0
#endif

#define FC_KT 64                         /* keys per tile: 4 vectors of 16 */
#define FC_DVV ((HEAD_DIM_V + 15) / 16)  /* float16 vectors per V row */
#define FC_DVP (FC_DVV * 16)             /* V row length in the packed layout */
#define FC_ROWS (FC_RB * FC_NB)

/* mask_term (score.cl) of 16 consecutive mask elements from p. */
inline float16 fc_mask_term16(__global const ELEM_T(MASK_DTYPE) *p)
{
#if MASK_DTYPE == DTYPE_U8
    return select((float16)(NEG_INF), (float16)(0.0f), convert_int16(vload16(0, p)) != 0);
#else
    return LOAD16(MASK_DTYPE, p, 0);
#endif
}

/* The larger of a and b, one instruction on x86 (fmax's NaN rule costs four there): a NaN
 * score may be dropped from a row's max, but its weight exp(NaN - max) is NaN all the same. */
#define FC_MAX(a, b) select((a), (b), (a) < (b))
inline float fc_hsum(const float16 v)
{
    const float8 a = v.lo + v.hi;
    const float4 b = a.lo + a.hi;
    const float2 c = b.lo + b.hi;
    return c.x + c.y;
}

/* The horizontal max (sum) of 8 rows' vectors at once, lane r of the result row r's: the rows
 * are paired level by level, each level halving the lanes a row keeps (8, 4, 2, then 1), so 8
 * rows take 15 two-source shuffles and 8 vector operations where one row alone takes 4 of each
 * and a scalar step (64 for 8 rows; an Intel Xeon's d = 64 forward gained 4-6 %, BENCHMARKS).
 * A block's rows past FC_RB pass any vector. */
#define FC_ROWS8(NAME, OP)                                                                         \
    inline float8 NAME(const float16 *v)                                                          \
    {                                                                                             \
        float16 a[4], b[2];                                                                       \
        _Pragma("unroll") for (uint i = 0; i < 4; ++i) a[i] =                                     \
            OP((float16)(v[2 * i].lo, v[2 * i + 1].lo), (float16)(v[2 * i].hi, v[2 * i + 1].hi)); \
        _Pragma("unroll") for (uint i = 0; i < 2; ++i) b[i] =                                     \
            OP((float16)(a[2 * i].s0123, a[2 * i].s89ab, a[2 * i + 1].s0123,                      \
                         a[2 * i + 1].s89ab),                                                     \
               (float16)(a[2 * i].s4567, a[2 * i].scdef, a[2 * i + 1].s4567,                      \
                         a[2 * i + 1].scdef));                                                    \
        const float16 c =                                                                         \
            OP((float16)(b[0].s01, b[0].s45, b[0].s89, b[0].scd, b[1].s01, b[1].s45, b[1].s89,    \
                         b[1].scd),                                                               \
               (float16)(b[0].s23, b[0].s67, b[0].sab, b[0].sef, b[1].s23, b[1].s67, b[1].sab,    \
                         b[1].sef));                                                              \
        return OP(c.even, c.odd);                                                                 \
    }
#define FC_ADD(a, b) ((a) + (b))
FC_ROWS8(fc_rows_max8, FC_MAX)
FC_ROWS8(fc_rows_sum8, FC_ADD)

/* Vector stores into the group's local arrays (declared 64-byte aligned; every offset a whole
 * vector): as an assignment through a vector pointer, not vstoreN, which PoCL 3.1 emitted as
 * 128-bit pieces and extracts (four stores and three shuffles per float16; the backward's
 * accumulators lost 9 % to it on an Intel Xeon). */
#define FC_VSTORE16(x, i, p) (*((__local float16 *)(p) + (i)) = (x))
#define FC_VSTORE8(x, i, p) (*((__local float8 *)(p) + (i)) = (x))
#define FC_ALIGNED __attribute__((aligned(64)))

/* acc[r][c0*16 ..] += sum_j p[r][j] V[j][c0*16 ..] for nv vectors of columns (at most 4) and
 * the tile's first nk keys (FC_KT but on fc_pv_direct's edge tile), the
 * accumulator first scaled by corr[r] (the online-softmax rescale, 1 unless the row's max
 * grew). V_ROW16(j, v): the 16 columns of vector v of the tile's key j (fc_pv: the packed
 * tile; fc_pv_direct: V where it lies). */
#ifndef FC_PVW
#define FC_PVW 4 /* fc_pv_direct / fc_pv_paged: vectors of 16 columns per pass over a tile */
#endif
/* FC_VSTEP pieces at a time: 2 (a whole block, its scale read once) for the block types.
 * V_ROW32(j, v, lo, hi): pieces v and v + 1 of the tile's key j. */
#if IS_BLOCK(V_DTYPE)
#define FC_VSTEP 2
#define FC_LOAD_V32(row, i, lo, hi) LOAD32(V_DTYPE, (row), (i), &(lo), &(hi))
#else
#define FC_VSTEP 1
#define FC_LOAD_V32(row, i, lo, hi) ((lo) = LOAD16(V_DTYPE, (row), (i)), (hi) = LOAD16(V_DTYPE, (row), (i) + 16))
#endif
#define FC_V_PIECES(V_ROW16, V_ROW32, j, vv)                                                      \
    if (FC_VSTEP == 2 && FC_PVW % 2 == 0) {                                                       \
        _Pragma("unroll") for (uint v = 0; v < 4; v += 2) if (v < nv)                             \
            V_ROW32((j), c0 + v, vv[v], vv[v + 1]);                                               \
    } else {                                                                                      \
        _Pragma("unroll") for (uint v = 0; v < 4; ++v) if (v < nv) vv[v] = V_ROW16((j), c0 + v);  \
    }
/* (in three steps: FC_PV_OPEN, FC_PV_KEYS over keys first .. first + count - 1, FC_PV_CLOSE;
 * a paged tile takes its keys a page's run at a time) */
#define FC_PV_OPEN                                                                                \
    float16 o[FC_RB][4];                                                                          \
    _Pragma("unroll") for (uint r = 0; r < FC_RB; ++r)                                            \
    {                                                                                             \
        _Pragma("unroll") for (uint v = 0; v < 4; ++v) if (v < nv) o[r][v] =                      \
            vload16(c0 + v, acc[r]) * corr[r];                                                    \
    }
#define FC_PV_KEYS(V_ROW16, V_ROW32, first, count)                                                \
    for (uint j = (first); j < (first) + (count); ++j) {                                          \
        float16 vv[4];                                                                            \
        FC_V_PIECES(V_ROW16, V_ROW32, j, vv);                                                     \
        _Pragma("unroll") for (uint r = 0; r < FC_RB; ++r)                                        \
        {                                                                                         \
            const float16 p = (float16)(pt[r][j]);                                                \
            _Pragma("unroll") for (uint v = 0; v < 4; ++v) if (v < nv) o[r][v] =                  \
                fma(p, vv[v], o[r][v]);                                                           \
        }                                                                                         \
    }
#define FC_PV_CLOSE                                                                               \
    _Pragma("unroll") for (uint r = 0; r < FC_RB; ++r)                                            \
    {                                                                                             \
        _Pragma("unroll") for (uint v = 0; v < 4; ++v) if (v < nv)                                \
            FC_VSTORE16(o[r][v], c0 + v, acc[r]);                                                 \
    }
#define FC_PV_BODY(V_ROW16, V_ROW32)                                                              \
    FC_PV_OPEN                                                                                    \
    FC_PV_KEYS(V_ROW16, V_ROW32, 0, nk)                                                           \
    FC_PV_CLOSE

#define FC_PACKED_ROW16(j, v) vload16((v), vt[(j)])
#define FC_PACKED_ROW32(j, v, lo, hi) ((lo) = vload16((v), vt[(j)]), (hi) = vload16((v) + 1, vt[(j)]))
inline void fc_pv(__local float (*acc)[FC_DVP], __local float (*pt)[FC_KT],
                  __local float (*vt)[FC_DVP], const float *corr, const uint c0, const uint nv)
{
    const uint nk = FC_KT;
    FC_PV_BODY(FC_PACKED_ROW16, FC_PACKED_ROW32)
}

#if FC_DIRECT
#if HEAD_DIM_QK % 16 != 0 || HEAD_DIM_V % 16 != 0 || FC_NB != 1
#error "FC_DIRECT takes head sizes that are multiples of 16 and one row block per group"
#endif
#define FC_DQV (HEAD_DIM_QK / 16) /* float16 vectors per q and K row */

/* pt[r][j] = qs[r] . K[j] for the tile's first nk keys (K: the tile's first row, unit stride
 * along d, rows ks elements apart), 0 for the rest (keys past the count on the edge tile,
 * never read): each 16-float piece of a K row is loaded once and multiplied into FC_RB
 * accumulators (registers: FC_RB + 1 vectors, whatever the head size), which are summed
 * across their lanes at the end of the row. The accumulators start at 0 and take every piece
 * by fma: a first piece by multiplication was compiled by PoCL 3.1 (LLVM 15) into 8-byte
 * loads and multiplies, about as many instructions as the rest of the row. */
/* KEY_ROW(j): the tile's key j's row (fc_scores_direct: K + j * ks; fc_scores_paged: through
 * the block table) */
/* FC_KSTEP pieces at a time: 2 (a whole block) for the block types, whose scale is then read
 * once per block (FC_LOAD_K: pieces c and c + 1 into k0, k1). */
#if IS_BLOCK(K_DTYPE)
#define FC_KSTEP 2
#define FC_LOAD_K(row, c, k0, k1) LOAD32(K_DTYPE, (row), 16 * (c), &(k0), &(k1))
#else
#define FC_KSTEP 1
#define FC_LOAD_K(row, c, k0, k1) ((k0) = LOAD16(K_DTYPE, (row), 16 * (c)))
#endif
/* (FC_SCORES_KEYS: keys first .. first + count - 1; a paged tile takes a page's run at a time) */
#define FC_SCORES_KEYS(KEY_ROW, first, count)                                                     \
    for (uint j = (first); j < (first) + (count); ++j) {                                          \
        __global const ELEM_T(K_DTYPE) *row = KEY_ROW(j);                                         \
        float16 t[FC_RB];                                                                         \
        _Pragma("unroll") for (uint r = 0; r < FC_RB; ++r) t[r] = (float16)(0.0f);                \
        for (uint c = 0; c < FC_DQV; c += FC_KSTEP) {                                             \
            float16 k, k1;                                                                        \
            FC_LOAD_K(row, c, k, k1);                                                             \
            _Pragma("unroll") for (uint r = 0; r < FC_RB; ++r) t[r] =                             \
                fma(vload16(c, qs[r]), k, t[r]);                                                  \
            if (FC_KSTEP == 2) {                                                                  \
                _Pragma("unroll") for (uint r = 0; r < FC_RB; ++r) t[r] =                         \
                    fma(vload16(c + 1, qs[r]), k1, t[r]);                                         \
            }                                                                                     \
        }                                                                                         \
        _Pragma("unroll") for (uint r = 0; r < FC_RB; ++r) pt[r][j] = fc_hsum(t[r]);              \
    }
#define FC_SCORES_ZERO                                                                            \
    for (uint j = nk; j < FC_KT; ++j) {                                                           \
        _Pragma("unroll") for (uint r = 0; r < FC_RB; ++r) pt[r][j] = 0.0f;                       \
    }
#define FC_SCORES_BODY(KEY_ROW)                                                                   \
    FC_SCORES_KEYS(KEY_ROW, 0, nk)                                                                \
    FC_SCORES_ZERO

#define FC_STRIDED_KEY(j) ADVANCE(K_DTYPE, K, (j) * ks)
inline void fc_scores_direct(__global const ELEM_T(K_DTYPE) *K, const ulong ks,
                             __local float (*qs)[HEAD_DIM_QK], __local float (*pt)[FC_KT],
                             const uint nk)
{
    FC_SCORES_BODY(FC_STRIDED_KEY)
}

#if KV_PAGED
/* A paged cache's tile read where it lies, in runs: the tile's keys in one page are
 * consecutive slots, rows ks (vs) elements apart from the run's first (unit stride along d),
 * read as the contiguous tile's are; krow[i] (vrow[i]): run i's first row (fc_paged_runs).
 * The first run starts at slot `slot` of its page and holds at most page_size - slot keys,
 * the others at most page_size (one table read a run: one a tile when pages hold whole
 * tiles). FC_PAGED_RUNS(BODY): BODY(i, j0, run) for each run i of keys j0 .. j0 + run - 1. */
#define FC_PAGED_RUNS(BODY)                                                                       \
    for (uint i = 0, j0 = 0, room = page_size - slot; j0 < nk; ++i, room = page_size) {           \
        const uint run = nk - j0 < room ? nk - j0 : room;                                         \
        BODY(i, j0, run)                                                                          \
        j0 += run;                                                                                \
    }
#define FC_RUN_KEY(j) ADVANCE(K_DTYPE, K, krow[i] + ((j) - j0) * ks)
#define FC_RUN_SCORES(i, j0, run) FC_SCORES_KEYS(FC_RUN_KEY, j0, run)
inline void fc_scores_paged(__global const ELEM_T(K_DTYPE) *K, const ulong *krow, const uint slot,
                            const uint page_size, const ulong ks,
                            __local float (*qs)[HEAD_DIM_QK], __local float (*pt)[FC_KT],
                            const uint nk)
{
    FC_PAGED_RUNS(FC_RUN_SCORES)
    FC_SCORES_ZERO
}

#define FC_RUN_ROW(j) ADVANCE(V_DTYPE, V, vrow[i] + ((j) - j0) * vs)
#define FC_RUN_ROW16(j, v) LOAD16(V_DTYPE, FC_RUN_ROW(j), 16 * (v))
#define FC_RUN_ROW32(j, v, lo, hi) FC_LOAD_V32(FC_RUN_ROW(j), 16 * (v), lo, hi)
#define FC_RUN_PV(i, j0, run) FC_PV_KEYS(FC_RUN_ROW16, FC_RUN_ROW32, j0, run)
inline void fc_pv_paged(__local float (*acc)[FC_DVP], __local float (*pt)[FC_KT],
                        __global const ELEM_T(V_DTYPE) *V, const ulong *vrow, const uint slot,
                        const uint page_size, const ulong vs, const float *corr, const uint c0,
                        const uint nk)
{
    const uint nv = FC_DVV - c0 < FC_PVW ? FC_DVV - c0 : FC_PVW;
    FC_PV_OPEN
    FC_PAGED_RUNS(FC_RUN_PV)
    FC_PV_CLOSE
}
#endif

/* fc_pv with the tile's first nk V rows read where they lie (V: the tile's first row, unit
 * stride, rows vs elements apart), FC_PVW vectors of columns (or the rest) from c0. */
#define FC_GLOBAL_ROW16(j, v) LOAD16(V_DTYPE, ADVANCE(V_DTYPE, V, (j) * vs), 16 * (v))
#define FC_GLOBAL_ROW32(j, v, lo, hi) FC_LOAD_V32(ADVANCE(V_DTYPE, V, (j) * vs), 16 * (v), lo, hi)
inline void fc_pv_direct(__local float (*acc)[FC_DVP], __local float (*pt)[FC_KT],
                         __global const ELEM_T(V_DTYPE) *V, const ulong vs, const float *corr,
                         const uint c0, const uint nk)
{
    const uint nv = FC_DVV - c0 < FC_PVW ? FC_DVV - c0 : FC_PVW;
    FC_PV_BODY(FC_GLOBAL_ROW16, FC_GLOBAL_ROW32)
}
#endif

/* ---- flash_cpu's steps (score.cl's contract): the row open (fc_open_rows), per key tile the
 * pack (fc_paged_rows, fc_pack_tile) and per register block its dot products
 * (fc_block_dots), SCORE (fc_block_value), KEEP (fc_block_keep), the online softmax update
 * (fc_block_weights) and P.V (fc_block_accumulate), then the row close (fc_close_rows). Each
 * takes the kernel's parameter struct and reads its fields by name (CLATTN_UNPACK_SCORED).
 * Always inlined: PoCL 3.1 left plain `inline` steps as calls, the register blocks s and corr
 * in memory and the struct copied per call (half the speed); `static inline` crashed its LLVM
 * 15 inliner. Inlined, the kernel compiles to the code of the single body it replaced. */

/* Row open: the group's q rows, times scale, into qs; acc, row_max and total at the rows'
 * start, or the state the previous key part left (resume; flash.cl). */
__attribute__((always_inline)) inline void
fc_open_rows(__global const ELEM_T(Q_DTYPE) *Q,
             __global const ELEM_T(O_DTYPE) *O, __global const float *lse,
             const clattn_flash_params params, const seq_span span,
             const uint first_row, __local float (*qs)[HEAD_DIM_QK],
             __local float (*acc)[FC_DVP], __local float *row_max,
             __local float *total)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    for (uint i = 0; i < FC_ROWS; ++i) {
        const uint row = first_row + i;
        const bool valid = row < span.rows;
        for (uint d = 0; d < HEAD_DIM_QK; ++d)
            qs[i][d] = valid ? LOAD(Q_DTYPE, Q, row * q_s2 + d * q_s3) * scale : 0.0f;
        for (uint d = 0; d < FC_DVP; ++d)
            acc[i][d] = 0.0f;
        row_max[i] = NEG_INF;
        total[i] = 0.0f;
        if (resume && valid) { /* the state the previous key part left (flash.cl) */
            const float previous = lse[row * lse_s2];
            if (previous != NEG_INF) {
                total[i] = SCORE_RELU ? exp(previous) : 1.0f;
                row_max[i] = SCORE_RELU ? NEG_INF : previous;
                for (uint d = 0; d < HEAD_DIM_V; ++d)
                    acc[i][d] = LOAD(O_DTYPE, O, row * o_s2 + d * o_s3) *
                                (total[i] / FLASH_V_SCALE);
            }
        }
    }
}

#if KV_PAGED
/* A paged cache (score.cl): each key's row from the block table, once per tile; one
 * division for the tile's first key, then slots counted up (a division per key was
 * most of a paged decode step's time), the table read once per page and only for
 * keys inside the count. krow[j], vrow[j]: the element offsets of key k0 + j's rows. */
__attribute__((always_inline)) inline void
fc_paged_rows(__global const int *block_table, const ulong bt_row,
              const clattn_flash_params params, const key_band band,
              const uint k0, ulong *krow, ulong *vrow)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    uint block = k0 / page_size, slot = k0 - block * page_size;
    ulong page = k0 < band.limit ? (ulong)(uint)block_table[bt_row + block * bt_s1] : 0;
    for (uint j = 0; j < FC_KT; ++j) {
        const bool real = k0 + j < band.limit;
        krow[j] = real ? page * k_page + slot * k_s2 : 0;
        vrow[j] = real ? page * v_page + slot * v_s2 : 0;
        if (++slot == page_size) {
            slot = 0;
            ++block;
            if (k0 + j + 1 < band.limit)
                page = (ulong)(uint)block_table[bt_row + block * bt_s1];
        }
    }
}

/* A direct tile's runs (fc_scores_paged): krow[i], vrow[i], the first row of run i, the
 * tile's keys in one page (one table read each: a page of a multiple of 64 keys holds the
 * whole tile), for the nk keys inside the count. */
__attribute__((always_inline)) inline void
fc_paged_runs(__global const int *block_table, const ulong bt_row,
              const clattn_flash_params params, const uint k0, const uint nk, ulong *krow,
              ulong *vrow)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    uint block = k0 / page_size, slot = k0 - block * page_size;
    for (uint i = 0, j0 = 0; j0 < nk; ++i, ++block, slot = 0) {
        const ulong page = (ulong)(uint)block_table[bt_row + block * bt_s1];
        krow[i] = page * k_page + slot * k_s2;
        vrow[i] = page * v_page + slot * v_s2;
        j0 += nk - j0 < page_size - slot ? nk - j0 : page_size - slot;
    }
}
#define FC_KROW(j) krow[j]
#define FC_VROW(j) vrow[j]
#else
#define FC_KROW(j) ((k0 + (j)) * k_s2)
#define FC_VROW(j) ((k0 + (j)) * v_s2)
#endif

/* One 64-byte line at p into L2 (fc_prefetch_tile, the mask's next tile; see below). */
#if defined(__has_builtin) && (defined(__x86_64__) || defined(__aarch64__))
#if __has_builtin(__builtin_prefetch)
#define FC_PREFETCH_LINE(p) __builtin_prefetch((p), 0, 2)
#endif
#endif
#ifndef FC_PREFETCH_LINE
#define FC_PREFETCH_LINE(p) prefetch((p), 64)
#endif
#if FC_PF
/* Ask for a later tile's K and V rows (tile k0, its first nk keys) while this one runs (the
 * tile FC_PF ahead; tuning key flash_cpu_pf), into L2: one prefetch per 64-byte line of each
 * row. A shuffled pool's pages are a few KiB apart in no order, where a CPU's stream
 * prefetcher stops (it follows one 4 KiB page), so without it each page's run started with
 * misses to memory: P.V's loads took 3x the contiguous step's (perf, page 16, 16k keys). Rows
 * a row or more apart (a (B, L, Hkv, d) cache, vLLM's (pages, page_size, Hkv, d) pools) are
 * prefetched too: the hardware's stream follows them badly (2x the step at 16k keys). Not
 * prefetched: tiles of adjacent rows (one block: there the prefetches cost 2-3x the step,
 * waiting for line-fill buffers the hardware's stream does not need); prefetching only a
 * run's first lines (to start the hardware's stream) did not help. Clang's __builtin_prefetch where
 * the program is compiled for the CPU itself (PoCL: x86-64, AArch64), else OpenCL's prefetch()
 * (SPIR targets: Oclgrind has no llvm.prefetch). */
#define FC_PF_RUN(P, DT, first, run, stride, width)                                               \
    {                                                                                             \
        __global const char *at = (__global const char *)ADVANCE(DT, P, first);                  \
        const ulong step = (ulong)((__global const char *)ADVANCE(DT, P, stride) -               \
                                   (__global const char *)(P));                                  \
        const ulong bytes = (ulong)((__global const char *)ADVANCE(DT, P, width) -               \
                                    (__global const char *)(P));                                 \
        for (uint j = 0; j < (run); ++j)                                                          \
            for (ulong c = 0; c < bytes; c += 64)                                                 \
                FC_PREFETCH_LINE(at + j * step + c);                                              \
    }
__attribute__((always_inline)) inline void
fc_prefetch_tile(__global const ELEM_T(K_DTYPE) *K, __global const ELEM_T(V_DTYPE) *V,
                 __global const int *block_table, const ulong bt_row,
                 const clattn_flash_params params, const uint k0, const uint nk)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
#if KV_PAGED
    uint block = k0 / page_size, slot = k0 - block * page_size;
    for (uint j0 = 0; j0 < nk; ++block, slot = 0) {
        const ulong page = (ulong)(uint)block_table[bt_row + block * bt_s1];
        const uint run = nk - j0 < page_size - slot ? nk - j0 : page_size - slot;
        FC_PF_RUN(K, K_DTYPE, page * k_page + slot * k_s2, run, k_s2, HEAD_DIM_QK)
        FC_PF_RUN(V, V_DTYPE, page * v_page + slot * v_s2, run, v_s2, HEAD_DIM_V)
        j0 += run;
    }
#else
    FC_PF_RUN(K, K_DTYPE, k0 * k_s2, nk, k_s2, HEAD_DIM_QK)
    FC_PF_RUN(V, V_DTYPE, k0 * v_s2, nk, v_s2, HEAD_DIM_V)
#endif
}
#endif

/* The K pack's transpose in registers (fc_pack_tile; common.cl's transpose16 / transpose8):
 * it replaces a gather per 8 elements, 10-12 % of the kernel's samples in prefill (perf,
 * L = 1024, d = 64). FC_TW: 16 where the device has 32 vector registers (FC_KV = 4), else 8
 * (16 registers: 16 float16 rows would spill). */
#if FC_KV >= 4
#define FC_TW 16
#define FC_TWV float16
#if K_DTYPE == 0
#define FC_LOAD_TW(code, p, i) VLOADU_G(16, (p) + (i)) /* (common.cl: one load, not 4 pieces) */
#else
#define FC_LOAD_TW(code, p, i) LOAD16(code, p, i)
#endif
#define FC_STORE_TW(v, p) FC_VSTORE16((v), 0, (p))
#define fc_transpose transpose16
#else
#define FC_TW 8
#define FC_TWV float8
#define FC_LOAD_TW(code, p, i) LOAD8(code, p, i)
#define FC_STORE_TW(v, p) FC_VSTORE8((v), 0, (p))
#define fc_transpose transpose8
#endif

/* The tile k0 .. k0 + 63 for the register blocks: K transposed into kt, V's rows padded with
 * zeros into vt (keys past the count, edge, packed as zeros), and in kb score.cl's key_masked
 * for the keys every row drops (padded, past the count). A direct tile (FC_DIRECT, see the
 * header) is read where it lies: only kb, and only where something can be dropped. krow,
 * vrow: fc_paged_rows' offsets (KV_PAGED; else unused). */
__attribute__((always_inline)) inline void
fc_pack_tile(__global const ELEM_T(K_DTYPE) *K,
             __global const ELEM_T(V_DTYPE) *V,
             __global const uchar *key_padding,
             const clattn_flash_params params, const key_band band,
             const uint k0, const bool edge, const bool direct, const uint nk,
             const ulong *krow, const ulong *vrow, __local float (*kt)[FC_KT],
             __local float (*vt)[FC_DVP], __local float *kb)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    if (direct) {
        if (SCORE_MASK || SCORE_KPAD || edge) {
            for (uint j = 0; j < FC_KT; ++j) { /* key_masked: padded and past the count */
                const uint key = k0 + j;
                kb[j] = key_masked(key, 0, band.limit,
                                   j < nk && key_padded(SCORE_KPAD, key_padding,
                                                        key * key_padding_s1))
                            ? NEG_INF
                            : 0.0f;
            }
        }
    } else if (!edge && k_s3 == 1) {
        /* FC_TW x FC_TW blocks of the tile transposed in registers (fc_transpose); head
         * sizes past a multiple of FC_TW finish element by element */
        for (uint j0 = 0; j0 < FC_KT; j0 += FC_TW)
            for (uint d0 = 0; d0 + FC_TW <= HEAD_DIM_QK; d0 += FC_TW) {
                FC_TWV r[FC_TW];
#pragma unroll
                for (uint i = 0; i < FC_TW; ++i)
                    r[i] = FC_LOAD_TW(K_DTYPE, K, FC_KROW(j0 + i) + d0);
                fc_transpose(r);
#pragma unroll
                for (uint i = 0; i < FC_TW; ++i)
                    FC_STORE_TW(r[i], kt[d0 + i] + j0);
            }
        for (uint d = HEAD_DIM_QK - HEAD_DIM_QK % FC_TW; d < HEAD_DIM_QK; ++d)
            for (uint j = 0; j < FC_KT; ++j)
                kt[d][j] = LOAD(K_DTYPE, K, FC_KROW(j) + d);
    } else {
        for (uint d = 0; d < HEAD_DIM_QK; ++d)
            for (uint j = 0; j < FC_KT; ++j)
                kt[d][j] = k0 + j < band.limit ? LOAD(K_DTYPE, K, FC_KROW(j) + d * k_s3) : 0.0f;
    }
    /* (a bound, not `&& !direct`: PoCL warned of the constant operand at every build) */
    for (uint j = 0; j < (direct ? 0u : (uint)FC_KT); ++j) {
        const bool real = k0 + j < band.limit;
        if (real && v_s3 == 1 && V_DTYPE == 0 && HEAD_DIM_V % 16 == 0) {
            for (uint c = 0; c < HEAD_DIM_V / 16; ++c) /* whole vectors (common.cl) */
                FC_VSTORE16(VLOADU_G(16, V + FC_VROW(j) + 16 * c), c, vt[j]);
        } else if (real && v_s3 == 1) {
            for (uint d = 0; d < HEAD_DIM_V; ++d)
                vt[j][d] = LOAD(V_DTYPE, V, FC_VROW(j) + d);
        } else {
            for (uint d = 0; d < HEAD_DIM_V; ++d)
                vt[j][d] = real ? LOAD(V_DTYPE, V, FC_VROW(j) + d * v_s3) : 0.0f;
        }
        for (uint d = HEAD_DIM_V; d < FC_DVP; ++d)
            vt[j][d] = 0.0f;
        /* key_masked for keys past the key count and padded keys */
        const uint key = k0 + j;
        kb[j] = key_masked(key, 0, band.limit,
                           real && key_padded(SCORE_KPAD, key_padding, key * key_padding_s1))
                    ? NEG_INF
                    : 0.0f;
    }
}

/* The dot products of block r0 (rows r0 .. r0 + FC_RB - 1 of qs) with the tile's keys: s =
 * (q * scale) . k for FC_RB rows x 64 keys, FC_KV vectors of 16 keys at a time (FC_RB x
 * FC_KV float16 accumulators held in registers over d); a direct tile's (FC_DIRECT) through
 * pt, from K where it lies (krow: fc_paged_runs' runs). */
__attribute__((always_inline)) inline void
fc_block_dots(float16 (*s)[4], __global const ELEM_T(K_DTYPE) *K,
              const ulong *krow, const clattn_flash_params params,
              __local float (*qs)[HEAD_DIM_QK], __local float (*kt)[FC_KT],
              __local float (*pt)[FC_KT], const uint r0, const uint k0,
              const uint nk, const bool direct)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
#if FC_DIRECT
    if (direct) {
#if KV_PAGED
        fc_scores_paged(K, krow, k0 % page_size, page_size, k_s2, qs + r0, pt, nk);
#else
        fc_scores_direct(ADVANCE(K_DTYPE, K, k0 * k_s2), k_s2, qs + r0, pt, nk);
#endif
#pragma unroll
        for (uint r = 0; r < FC_RB; ++r) {
#pragma unroll
            for (uint v = 0; v < 4; ++v)
                s[r][v] = vload16(v, pt[r]);
        }
    } else
#endif
#pragma unroll
    for (uint v0 = 0; v0 < 4; v0 += FC_KV) {
        float16 a[FC_RB][FC_KV];
#pragma unroll
        for (uint r = 0; r < FC_RB; ++r) {
#pragma unroll
            for (uint w = 0; w < FC_KV; ++w)
                a[r][w] = (float16)(0.0f);
        }
        for (uint d = 0; d < HEAD_DIM_QK; ++d) {
            float16 k[FC_KV];
#pragma unroll
            for (uint w = 0; w < FC_KV; ++w)
                k[w] = vload16(v0 + w, kt[d]);
#pragma unroll
            for (uint r = 0; r < FC_RB; ++r) {
                const float16 q = (float16)(qs[r0 + r][d]);
#pragma unroll
                for (uint w = 0; w < FC_KV; ++w)
                    a[r][w] = fma(q, k[w], a[r][w]);
            }
        }
#pragma unroll
        for (uint r = 0; r < FC_RB; ++r) {
#pragma unroll
            for (uint w = 0; w < FC_KV; ++w)
                s[r][v0 + w] = a[r][w];
        }
    }
}

/* SCORE on block row0's tile: the rule's value (score.cl's score_value16: soft-capping, then
 * ALiBi, then the user's score_mod), before any mask, written out as two loops under uniform
 * branches: one loop calling score_value16 ran 20-25% slower with key padding on PoCL
 * (L = 1024, d = 64). */
__attribute__((always_inline)) inline void
fc_block_value(float16 (*s)[4], const float softcap, const key_band band,
               const seq_span span, const uint row0, const uint k0)
{
    if (softcap > 0.0f) {
#pragma unroll
        for (uint r = 0; r < FC_RB; ++r) {
#pragma unroll
            for (uint v = 0; v < 4; ++v)
                s[r][v] = soft_cap16(s[r][v], softcap);
        }
    }
    if (band.slope != 0.0f) {
#pragma unroll
        for (uint r = 0; r < FC_RB; ++r) {
#pragma unroll
            for (uint v = 0; v < 4; ++v)
                s[r][v] += alibi_bias16(band, row0 + r, k0 + 16 * v);
        }
    }
#if FLEX_SCORE
    /* the user's score_mod (score.cl's SCORE), on the block's rows inside the batch */
    for (uint r = 0; r < FC_RB && row0 + r < span.rows; ++r) {
#pragma unroll
        for (uint v = 0; v < 4; ++v)
            s[r][v] = flex_score16(band, s[r][v], row0 + r, k0 + 16 * v);
    }
#endif
}

/* KEEP on block row0's tile (score.cl), only where something can be dropped: the mask, the
 * keys every row drops (kb), the band's diagonal bounds (diagonal: the tile crosses one of
 * the block's band edges), the user's mask_mod (but on a tile the block mask calls full). */
__attribute__((always_inline)) inline void
fc_block_keep(float16 (*s)[4], __global const ELEM_T(MASK_DTYPE) *mask,
              const clattn_flash_params params, const key_band band,
              const seq_span span, const uint row0, const uint k0,
              const bool edge, const bool diagonal, const uint tile_state,
              __local float (*pt)[FC_KT], __local const float *kb)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
#if SCORE_MASK
    if (!edge && mask_s3 == 1) {
        /* masked_score on 16 keys at a time (a tile inside seq_k, a mask row of unit
         * stride): the mask term, and -inf for padded keys (kb); the band's diagonal bounds
         * below */
#pragma unroll
        for (uint r = 0; r < FC_RB; ++r) {
            const uint row = row0 + r;
            __global const ELEM_T(MASK_DTYPE) *mask_row =
                mask + (row < span.rows ? row : 0) * mask_s2 + k0;
            if (k0 + 2 * FC_KT <= band.limit) { /* the row's mask on the next tile, into L2 */
                __global const char *next = (__global const char *)(mask_row + FC_KT);
                for (uint at = 0; at < FC_KT * sizeof(ELEM_T(MASK_DTYPE)); at += 64)
                    FC_PREFETCH_LINE(next + at);
            }
            if (SCORE_KPAD) { /* (kb is all 0 on a tile inside seq_k without key padding) */
#pragma unroll
                for (uint v = 0; v < 4; ++v)
                    s[r][v] = select(s[r][v] + fc_mask_term16(mask_row + 16 * v),
                                     (float16)(NEG_INF), vload16(v, kb) != (float16)(0.0f));
            } else {
#pragma unroll
                for (uint v = 0; v < 4; ++v)
                    s[r][v] += fc_mask_term16(mask_row + 16 * v);
            }
        }
    } else {
        /* every score through masked_score: the mask term, the band, the key
         * padding and seq_k (kb says which keys are padded or past seq_k) */
#pragma unroll
        for (uint r = 0; r < FC_RB; ++r) {
#pragma unroll
            for (uint v = 0; v < 4; ++v)
                FC_VSTORE16(s[r][v], v, pt[r]);
        }
        for (uint r = 0; r < FC_RB; ++r) {
            const uint row = row0 + r;
            const uint safe_row = row < span.rows ? row : 0;
            const uint row_begin = band_begin(band, safe_row);
            const uint row_end = band_end(band, safe_row);
            __global const ELEM_T(MASK_DTYPE) *mask_row = mask + safe_row * mask_s2;
            for (uint j = 0; j < FC_KT; ++j) {
                const uint key = k0 + j;
                pt[r][j] = masked_score(pt[r][j], key, row_begin, row_end, kb[j] != 0.0f,
                                        1, mask_row, key * mask_s3);
            }
        }
#pragma unroll
        for (uint r = 0; r < FC_RB; ++r) {
#pragma unroll
            for (uint v = 0; v < 4; ++v)
                s[r][v] = vload16(v, pt[r]);
        }
    }
#else
    if (SCORE_KPAD || edge) { /* key_masked for padding and keys past the count: KB */
        const float16 b_0 = vload16(0, kb), b_1 = vload16(1, kb);
        const float16 b_2 = vload16(2, kb), b_3 = vload16(3, kb);
#pragma unroll
        for (uint r = 0; r < FC_RB; ++r) {
            s[r][0] += b_0;
            s[r][1] += b_1;
            s[r][2] += b_2;
            s[r][3] += b_3;
        }
    }
#endif
#if SCORE_BAND
    if (diagonal) { /* key_masked(key, the row's band) on 16 keys at a time */
        const int16 lane = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#pragma unroll
        for (uint r = 0; r < FC_RB; ++r) {
            const uint row = row0 + r < span.rows ? row0 + r : row0;
            const int16 row_begin = (int16)((int)band_begin(band, row));
            const int16 row_end = (int16)((int)band_end(band, row));
#pragma unroll
            for (uint v = 0; v < 4; ++v) {
                const int16 key = (int16)((int)(k0 + 16 * v)) + lane;
                s[r][v] = select(s[r][v], (float16)(NEG_INF),
                                 key >= row_end || key < row_begin);
            }
        }
    }
#endif
#if FLEX_MASK
    /* the user's mask_mod (score.cl's KEEP), but on a tile the block mask calls full */
    for (uint r = 0; tile_state != FLEX_FULL && r < FC_RB && row0 + r < span.rows; ++r) {
#pragma unroll
        for (uint v = 0; v < 4; ++v)
            s[r][v] = flex_keep16(band, s[r][v], row0 + r, k0 + 16 * v);
    }
#endif
}

/* The online softmax update of block r0 (rows row0 ..) on the tile: its weights into pt
 * (dropout's factors applied after the row sums), the row maxima and sums, and each row's
 * rescale factor in corr (1 unless the row's max grew; relu: always 1). */
__attribute__((always_inline)) inline void
fc_block_weights(float16 (*s)[4], float *corr, __local float (*pt)[FC_KT],
                 __local float *row_max, __local float *total,
                 const clattn_flash_params params, const ulong bh,
                 const uint r0, const uint row0, const uint k0)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    float16 rows[8]; /* each row's 16 lanes of max, then of sum (fc_rows_max8 / sum8) */
    float red[8];
#if !SCORE_RELU
#pragma unroll
    for (uint r = 0; r < 8; ++r)
        rows[r] = r < FC_RB ? FC_MAX(FC_MAX(s[r][0], s[r][1]), FC_MAX(s[r][2], s[r][3]))
                            : rows[0];
    vstore8(fc_rows_max8(rows), 0, red);
#endif
#pragma unroll
    for (uint r = 0; r < FC_RB; ++r) {
#if SCORE_RELU
        corr[r] = 1.0f;
        float16 p[4];
#pragma unroll
        for (uint v = 0; v < 4; ++v)
            p[v] = fmax(s[r][v], (float16)(0.0f)); /* relu_weight */
#else
        const float old_max = row_max[r0 + r];
        const float tile_max = red[r];
        const float new_max = old_max < tile_max ? tile_max : old_max;
        /* softmax_weight(s, softmax_shift(max)) on 16 scores at a time */
        const float16 shift = (float16)(softmax_shift(new_max));
        float16 p[4];
#pragma unroll
        for (uint v = 0; v < 4; ++v)
            p[v] = exp16_nonpositive(s[r][v] - shift);
        corr[r] = 1.0f;
        if (new_max > old_max) { /* 0 while the row had no key */
            corr[r] = exp16_nonpositive((float16)(old_max - new_max)).s0;
            row_max[r0 + r] = new_max;
        }
#endif
        rows[r] = (p[0] + p[1]) + (p[2] + p[3]);
#if SCORE_DROPOUT
        { /* after the row's sum: its normaliser is the undropped row's (score.cl) */
            float16 keep[4];
            DROPOUT64_OF(bh, row0 + r, k0, keep);
#pragma unroll
            for (uint v = 0; v < 4; ++v)
                p[v] *= keep[v];
        }
#endif
#pragma unroll
        for (uint v = 0; v < 4; ++v)
            FC_VSTORE16(p[v], v, pt[r]);
    }
#pragma unroll
    for (uint r = FC_RB; r < 8; ++r)
        rows[r] = rows[0];
    vstore8(fc_rows_sum8(rows), 0, red);
#pragma unroll
    for (uint r = 0; r < FC_RB; ++r)
        total[r0 + r] = total[r0 + r] * corr[r] + red[r];
}

/* acc = acc * corr + p . V for block r0, 16 * FC_KV output columns at a time (a direct
 * tile's V read where it lies; vrow: fc_paged_runs' runs). */
__attribute__((always_inline)) inline void
fc_block_accumulate(__local float (*acc)[FC_DVP], __local float (*pt)[FC_KT],
                    __local float (*vt)[FC_DVP],
                    __global const ELEM_T(V_DTYPE) *V, const ulong *vrow,
                    const clattn_flash_params params, const float *corr,
                    const uint r0, const uint k0, const uint nk,
                    const bool direct)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
#if FC_DIRECT
    if (direct) {
        for (uint c0 = 0; c0 < FC_DVV; c0 += FC_PVW)
#if KV_PAGED
            fc_pv_paged(acc + r0, pt, V, vrow, k0 % page_size, page_size, v_s2, corr, c0, nk);
#else
            fc_pv_direct(acc + r0, pt, ADVANCE(V_DTYPE, V, k0 * v_s2), v_s2, corr, c0, nk);
#endif
        return;
    }
#endif
    for (uint c0 = 0; c0 + FC_KV <= FC_DVV; c0 += FC_KV)
        fc_pv(acc + r0, pt, vt, corr, c0, FC_KV);
#if FC_DVV % FC_KV != 0
    fc_pv(acc + r0, pt, vt, corr, FC_DVV - FC_DVV % FC_KV, FC_DVV % FC_KV);
#endif
}

/* Row close: each row's sink folded in (score.cl), its output normalised and stored, its
 * log-sum-exp (has_lse). */
__attribute__((always_inline)) inline void
fc_close_rows(__global ELEM_T(O_DTYPE) *O, __global float *lse,
              __global const float *sinks, const clattn_flash_params params,
              const ulong h, const seq_span span, const uint first_row,
              __local float (*acc)[FC_DVP], __local const float *row_max,
              __local const float *total)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    for (uint i = 0; i < FC_ROWS; ++i) {
        const uint row = first_row + i;
        if (row >= span.rows)
            break;
        /* attention sinks (score.cl): into the row's denominator, in the launch that ends it */
        const sunk_row sunk = sink_fold(SINK_OF(h, row), row_max[i], total[i]);
        const float inv = sunk.factor * inverse_total(sunk.total) * FLASH_V_SCALE;
        for (uint d = 0; d < HEAD_DIM_V; ++d)
            STORE(O_DTYPE, acc[i][d] * inv, O, row * o_s2 + d * o_s3);
        if (has_lse)
            lse[row * lse_s2] = sunk.total == 0.0f
                                    ? NEG_INF
                                    : (SCORE_RELU ? log(sunk.total) : sunk.max + log(sunk.total));
    }
}

#ifndef KV_STEP
#define KV_STEP 0
#endif
#if KV_STEP
/* ---- a KV cache's decode step in one launch (KV_STEP; clattn_kv_cache_decode) -------------
 * With kv_step set the launch attends the cache's step_keys keys plus one new key, key
 * step_keys, whose row is read from k_new / v_new (the step's inputs, never the cache: no
 * work-group reads what another writes in the launch); the host gives seq_k = step_keys + 1
 * and no key counts, so `whole` (FUSED_BAND) is the band after the step and
 * STEP_CACHED_BAND (score.cl) cuts the tiles to the cached keys. The group of a k/v head's
 * first rows that holds the new key (its decode split) writes the new row into the cache's
 * slot and head 0's the batch's key count (score.cl's kv_step_store). A plain launch
 * (kv_step 0) is flash_cpu as without KV_STEP. */

/* The new key's score, weight and value in each row of the group whose band holds it (the
 * online softmax of fc_block_weights on one key, then acc += p v_new). */
__attribute__((always_inline)) inline void
fc_step_attend(__global const ELEM_T(Q_DTYPE) *kn, __global const ELEM_T(Q_DTYPE) *vn,
               const clattn_flash_params params, const key_band whole, const seq_span span,
               const uint first_row, __local float (*qs)[HEAD_DIM_QK],
               __local float (*acc)[FC_DVP], __local float *row_max, __local float *total)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    const uint key = step_keys;
    for (uint i = 0; i < FC_ROWS; ++i) {
        const uint row = first_row + i;
        if (row >= span.rows)
            break;
        if (key < band_begin(whole, row) || key >= band_end(whole, row))
            continue;
        float dot = 0.0f;
        for (uint d = 0; d < HEAD_DIM_QK; ++d)
            dot = fma(qs[i][d], LOAD(Q_DTYPE, kn, d * kn_s3), dot);
        const float s = score_builtin(dot, softcap, whole, row, key);
        float corr = 1.0f, p;
#if SCORE_RELU
        p = fmax(s, 0.0f); /* relu_weight */
#else
        const float old_max = row_max[i], new_max = fmax(old_max, s);
        p = exp(s - softmax_shift(new_max));
        if (new_max > old_max) {
            corr = exp(old_max - new_max); /* 0 while the row had no key */
            row_max[i] = new_max;
        }
#endif
        total[i] = total[i] * corr + p;
        for (uint d = 0; d < HEAD_DIM_V; ++d)
            acc[i][d] = acc[i][d] * corr + p * LOAD(Q_DTYPE, vn, d * vn_s3);
    }
}

#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void flash_cpu(FLASH_KERNEL_PARAMS)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_PARAMS)
    __local float qs[FC_ROWS][HEAD_DIM_QK]; /* the group's q rows, times scale */
    __local float acc[FC_ROWS][FC_DVP] FC_ALIGNED; /* unnormalised output rows */
    __local float row_max[FC_ROWS], total[FC_ROWS];
#if FC_TWO_PASS
    __local float pt[FC_ROWS][FC_KT] FC_ALIGNED; /* the blocks' weights on the current tile */
    float corr_rows[FC_ROWS];                    /* each row's rescale factor on the tile */
#else
    __local float pt[FC_RB][FC_KT] FC_ALIGNED;     /* a block's weights on the current tile */
#endif
    __local float kt[HEAD_DIM_QK][FC_KT] FC_ALIGNED; /* the tile's keys, transposed */
    __local float vt[FC_KT][FC_DVP] FC_ALIGNED; /* the tile's values, rows padded with zeros */
    __local float kb[FC_KT]; /* 0, or -inf for a key the rule drops in every row */

    OPEN_GROUP_ROWS(FC_ROWS) /* score.cl: first_row, bh, b, h (the packed grid's, or by id) */
    /* the batch's rows and keys (score.cl: a packed sequence's, or seq_q and seq_k) */
    const seq_span span = SPAN_OF(b);
    if (first_row >= span.rows)
        return; /* past a packed sequence's rows */
    /* the launch's keys (score.cl's split_begin: a decode split's, else the part's) */
    const uint split = get_global_id(2);
    const uint key_begin = split_begin(part_begin, split_keys, split);
    const uint key_stop = split_stop(part_stop, split_keys, key_begin);
    OPEN_GROUP_QKV(b, h, span) /* score.cl: Q, K, V at the group's batch, head, sequence */
#if SCORE_KPAD
    key_padding += key_padding_offset + b * key_padding_s0;
#endif
    O += o_offset + split * o_split + b * o_s0 + h * o_s1 + span.q0 * o_s2;
    lse += lse_offset + split * lse_split + b * lse_s0 + h * lse_s1 + span.q0 * lse_s2;
#if SCORE_MASK
    mask += mask_offset + b * mask_s0 + h * mask_s1;
#endif
    fc_open_rows(Q, O, lse, params, span, first_row, qs, acc, row_max, total);

    OPEN_PAGED_ROW(b)
    const key_band whole = FUSED_BAND(b, h, span); /* score.cl's row open */
    const key_band band = STEP_CACHED_BAND(whole);    /* KV_STEP: the cached keys' tiles */
    const group_keys group = open_group(band, span.rows, first_row, FC_ROWS, key_begin, key_stop, FC_KT);
    const uint key_end = group.key_end;

    for (uint k0 = group.key_first; k0 < key_end; k0 += FC_KT) {
        /* a tile with keys past the batch's key count (or seq_k): never read, packed as 0 */
        const bool edge = k0 + FC_KT > band.limit;
        /* FC_DIRECT: a tile of unit-stride rows is read where it lies, the edge tile's keys
         * inside the count only (nk of them) */
        const bool direct = FC_DIRECT && k_s3 == 1 && v_s3 == 1;
        const uint nk = edge ? band.limit - k0 : FC_KT; /* k0 < key_end <= band.limit */
#if KV_PAGED
        ulong krow[FC_KT], vrow[FC_KT]; /* the keys' rows; a direct tile's, its runs' */
        if (direct)
            fc_paged_runs(block_table, bt_row, params, k0, nk, krow, vrow);
        else
            fc_paged_rows(block_table, bt_row, params, band, k0, krow, vrow);
#else
        const ulong *krow = 0, *vrow = 0; /* (unpaged: rows at key * stride) */
#endif
#if FC_PF
        /* (a later tile inside the count, of a paged cache or rows a row or more apart) */
        if (direct && (KV_PAGED || k_s2 >= 2 * HEAD_DIM_QK || v_s2 >= 2 * HEAD_DIM_V) &&
            k0 + FC_PF * FC_KT < key_end)
            fc_prefetch_tile(K, V, block_table, bt_row, params, k0 + FC_PF * FC_KT,
                             min((uint)FC_KT, band.limit - (k0 + FC_PF * FC_KT)));
#endif
        fc_pack_tile(K, V, key_padding, params, band, k0, edge, direct, nk, krow, vrow, kt, vt,
                     kb);
#if FC_TWO_PASS
        bool visited[FC_NB];
        for (uint blk = 0; blk < FC_NB; ++blk)
            visited[blk] = false;
#endif
        for (uint blk = 0; blk < FC_NB; ++blk) {
            const uint r0 = blk * FC_RB, row0 = first_row + r0;
            if (row0 >= span.rows)
                break;
#if SCORE_BAND
            const uint block_last = min(span.rows, row0 + FC_RB) - 1;
            if (k0 >= band_end(band, block_last) || k0 + FC_KT <= band_begin(band, row0))
                continue; /* the block sees no key of this tile */
            const bool diagonal =
                k0 + FC_KT > band_end(band, row0) || k0 < band_begin(band, block_last);
#else
            const bool diagonal = false;
#endif
            /* the block mask's verdict on the block's tile (score.cl): empty ones skipped */
            const uint tile_state = FLEX_VISIT(FLEX_TILE(b, h, row0, min(span.rows, row0 + FC_RB) - 1,
                                                         k0, min(k0 + FC_KT, band.limit)),
                                               true);
            if (tile_state == FLEX_EMPTY)
                continue;
            float16 s[FC_RB][4]; /* the block's scores, then weights, on the tile */
#if FC_TWO_PASS
            __local float (*bpt)[FC_KT] = pt + r0;
            float *corr = corr_rows + r0;
            visited[blk] = true;
#else
            __local float (*bpt)[FC_KT] = pt;
            float corr[FC_RB]; /* each row's rescale factor */
#endif
            fc_block_dots(s, K, krow, params, qs, kt, bpt, r0, k0, nk, direct);
            fc_block_value(s, softcap, band, span, row0, k0);
            fc_block_keep(s, mask, params, band, span, row0, k0, edge, diagonal, tile_state, bpt,
                          kb);
            fc_block_weights(s, corr, bpt, row_max, total, params, bh, r0, row0, k0);
#if !FC_TWO_PASS
            fc_block_accumulate(acc, bpt, vt, V, vrow, params, corr, r0, k0, nk, direct);
#endif
        }
#if FC_TWO_PASS
        for (uint blk = 0; blk < FC_NB; ++blk)
            if (visited[blk])
                fc_block_accumulate(acc, pt + blk * FC_RB, vt, V, vrow, params,
                                    corr_rows + blk * FC_RB, blk * FC_RB, k0, nk, direct);
#endif
    }
#if KV_STEP
    if (kv_step && key_begin <= step_keys && step_keys < key_stop) { /* the new key's split */
        k_new += kn_offset + b * kn_s0 + (h / kv_group) * kn_s1;
        v_new += vn_offset + b * vn_s0 + (h / kv_group) * vn_s1;
        fc_step_attend(k_new, v_new, params, whole, span, first_row, qs, acc, row_max, total);
        if (first_row == 0 && h % kv_group == 0)
            kv_step_store(K, V, k_new, v_new, kv_len, block_table, bt_row, params, b, h, 0, 1);
    }
#endif
    fc_close_rows(O, lse, sinks, params, h, span, first_row, acc, row_max, total);
}
