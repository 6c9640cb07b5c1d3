/*
 * flash_bwd.cl: the backward pass of attention, FlashAttention-2's way: the weights are
 * recomputed from Q, K and the forward's log-sum-exp, never stored, so memory stays linear in
 * the sequence (no seq_q x seq_k matrix unless the float mask's gradient is asked for).
 *
 *   s_ij  the score rule (score.cl) on x_ij = scale * q_i . k_j: cap(x) + alibi + mask
 *   p_ij  softmax: exp(s_ij - lse_i) (sinks are in lse);  relu: relu(s_ij) / exp(lse_i)
 *   D_i   = dO_i . O_i                                     (bwd_delta)
 *   dp_ij = dO_i . v_j
 *   dS_ij = softmax: p_ij (dp_ij - D_i);  relu: [s_ij > 0] (dp_ij - D_i) / exp(lse_i)
 *   dV_j  = sum_i p_ij dO_i,   dK_j = sum_i dX_ij q_i,   dQ_i = sum_j dX_ij k_j
 *   dropout (SCORE_DROPOUT; score.cl): with z_ij the forward's factor (1 / (1 - p) or 0),
 *         dV_j sums p_ij z_ij dO_i and dp_ij becomes z_ij dO_i . v_j (D_i = dO_i . O_i still)
 *   dX_ij = dS_ij * scale * cap'(x_ij)      cap'(x) = 1 - tanh^2(x / softcap) (1 without)
 *   dmask = dS (a float mask is added to s), dsink_h = -sum_{b,i} exp(sink_h - lse_i) D_i
 *
 * Deterministic: no atomics, every sum in a fixed order. bwd_dkdv: one work-item per key j of
 * a (batch, k/v head); it walks the query rows of its group's query heads (GQA's sum) in
 * order and keeps dK_j, dV_j in registers. bwd_dq: one work-item per query row; it walks the
 * keys. Keys (rows) past a row's band (a key's rows) are skipped, so causal and windowed
 * problems do the band's work. Where a device caps a work-item's loop trips (Mesa's llvmpipe)
 * the host splits the walk into parts whose partial sums bwd_sum_parts adds in order.
 * CPUs run bwd_dkdv_cpu (below): blocks of 16 * BWD_NV keys in float16 lanes, BWD_RB rows a
 * step; without the mask's gradient it also sums dQ, each work-group of a (batch, k/v head)
 * into its own slot of the scratch (FlashAttention-2's single pass, with slots instead of
 * atomics), and bwd_sum_parts adds the slots in order: no second pass over the scores.
 * GPUs (GPU-class parameters, no parts) run flash_bwd_gpu.cl's bwd_dkdv_gpu and bwd_dq_gpu
 * (key and row tiles in local memory; compiled after this source, sharing its definitions);
 * bwd_dkdv and bwd_dq are their fallback (parts; bwd_dq for the mask's gradient).
 *
 *     bwd_dkdv                         bwd_dq
 *     work-item j: k_j, v_j, dK_j, dV_j   work-item i: q_i, dO_i, dQ_i
 *       for h in the group: for i:          for j in the row's band:
 *         recompute p_ij, dS_ij               recompute p_ij, dS_ij (dmask)
 *
 * Tunables: HEAD_DIM_QK, HEAD_DIM_V (the head sizes), the dtype codes (types.cl) Q_DTYPE,
 * K_DTYPE, V_DTYPE, O_DTYPE, GO_DTYPE (dO), DQ_DTYPE, DK_DTYPE, DV_DTYPE, DMASK_DTYPE;
 * MASK_DTYPE, VARLEN (packed sequences: each batch its span of packed rows and keys; ROW_INDEX
 * below) (score.cl). Work-group sizes are the host's (any).
 */
#ifndef GO_DTYPE
#define GO_DTYPE 0
#endif
#ifndef DQ_DTYPE
#define DQ_DTYPE 0
#endif
#ifndef DK_DTYPE
#define DK_DTYPE 0
#endif
#ifndef DV_DTYPE
#define DV_DTYPE 0
#endif
#ifndef DMASK_DTYPE
#define DMASK_DTYPE 0
#endif

/* The weight p and the score's gradient factor of one (row, key) pair, recomputed from the
 * rule: p = 0 where the rule drops the key (or relu's weight is 0). */
typedef struct bwd_pair {
    float p;      /* the weight the forward gave the key */
    float grad;   /* dS = grad * (dp - D): softmax p, relu [s > 0] / exp(lse) */
    float dcap;   /* scale * cap'(x): dX = dS * dcap */
} bwd_pair;

inline bwd_pair bwd_recompute(const float dot, const float scale, const float softcap,
                              const key_band band, const uint row, const uint key,
                              const float mask_value, const float lse, const int norm_relu)
{
    bwd_pair r = {0.0f, 0.0f, 0.0f};
    if (!flex_keep(band, row, key)) /* the user's mask_mod (score.cl) */
        return r;
    const float x = scale * dot;
    const float pre = score_builtin(x, softcap, band, row, key);
    const float s = flex_score(band, pre, row, key) + mask_value;
    if (s == NEG_INF || lse == NEG_INF)
        return r;
    if (norm_relu) {
        if (!(s > 0.0f))
            return r;
        const float inv = exp(-lse); /* 1 / the row's normaliser */
        r.p = s * inv;
        r.grad = inv;
    } else {
        r.p = exp(s - lse);
        r.grad = r.p;
    }
    float cap = 1.0f;
    if (softcap > 0.0f) {
        const float t = tanh(x / softcap);
        cap = 1.0f - t * t;
    }
    r.dcap = scale * cap * flex_grad(band, pre, row, key); /* chain rule through score_mod */
    return r;
}

/* The mask's term of (b, h, row, key) when the key is in the row's band and not padded, else
 * -inf (the rule drops it). */
#define BWD_MASK_TERM(row, key)                                                                   \
    (has_mask ? mask_term(mask, mask_offset + b * mask_s0 + h * mask_s1 + (ulong)(row) * mask_s2 + \
                                    (ulong)(key) * mask_s3)                                       \
              : 0.0f)

/* Packed variable-length batches (VARLEN, score.cl): the offsets' buffers (arguments of the
 * kernels that walk rows or keys); batch b's rows and keys are then span.rows and span.keys
 * packed rows from span.q0 and span.k0 (its views' batch stride is 0, their row stride the
 * token's), and delta, the parts and the dQ slots hold row `row` of (b, h) at the packed index
 * (h, span.q0 + row) (ROW_INDEX; else (b, h, row): bh * seq_q + row), the dK/dV parts key `key`
 * of (b, g) at (g, span.k0 + key) (KEY_INDEX; else bg * seq_k + key): the sums then land on the
 * caller's packed gradients seen as (1, heads, total, d). */
#define BWD_CU_ARGS __global const int *cu_seqlens_q, __global const int *cu_seqlens_k
#if VARLEN
#define ROW_INDEX(bh, h, span, row) ((ulong)(h) * total_q + (span).q0 + (row))
#define KEY_INDEX(bg, g, span, key) ((ulong)(g) * total_k + (span).k0 + (key))
#else
#define ROW_INDEX(bh, h, span, row) ((ulong)(bh) * seq_q + (row))
#define KEY_INDEX(bg, g, span, key) ((ulong)(bg) * seq_k + (key))
#endif

/* The parameters of the dK/dV kernels (bwd_dkdv, bwd_dkdv_cpu, flash_bwd_gpu.cl's bwd_dkdv_gpu)
 * and of the dQ kernels (bwd_dq, bwd_dq_cpu, bwd_dq_gpu), and what each of them opens with: the
 * struct's fields as locals, the flex arena in the scratch (score.cl). */
#define BWD_DKDV_PARAMS                                                                           \
    __global const ELEM_T(Q_DTYPE) *Q, __global const ELEM_T(K_DTYPE) *K,                        \
        __global const ELEM_T(V_DTYPE) *V, __global const ELEM_T(GO_DTYPE) *GO,                  \
        __global const float *lse_in, __global float *scratch, __global ELEM_T(DK_DTYPE) *DK,    \
        __global ELEM_T(DV_DTYPE) *DV, __global const ELEM_T(MASK_DTYPE) *mask,                  \
        __global const uchar *key_padding, SCORE_BUFFERS_BASE, BWD_CU_ARGS,                      \
        const clattn_flash_bwd_params params
#define BWD_DQ_PARAMS                                                                             \
    __global const ELEM_T(Q_DTYPE) *Q, __global const ELEM_T(K_DTYPE) *K,                        \
        __global const ELEM_T(V_DTYPE) *V, __global const ELEM_T(GO_DTYPE) *GO,                  \
        __global const float *lse_in, __global float *scratch, __global ELEM_T(DQ_DTYPE) *DQ,    \
        __global const ELEM_T(MASK_DTYPE) *mask, __global const uchar *key_padding,              \
        SCORE_BUFFERS_BASE, BWD_CU_ARGS, const clattn_flash_bwd_params params
#define BWD_OPEN CLATTN_UNPACK_SCORED(CLATTN_FLASH_BWD_PARAMS) FLEX_FROM_SCRATCH

/* delta_i = dO_i . O_i per (b, h, row), into the scratch (packed (b, h, row); ROW_INDEX). */
__kernel void bwd_delta(__global const ELEM_T(O_DTYPE) *O, __global const ELEM_T(GO_DTYPE) *GO,
                        __global float *scratch, BWD_CU_ARGS,
                        const clattn_flash_bwd_params params)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_BWD_PARAMS)
    FLEX_FROM_SCRATCH
    const uint row = get_global_id(0);
    const ulong bh = bh_base + get_global_id(1);
    const ulong b = bh / heads, h = bh - b * heads;
    const seq_span span = SPAN_OF(b);
    if (row >= span.rows)
        return;
    const ulong at = (ulong)span.q0 + row; /* the row in the views (the token with VARLEN) */
    const ulong o = o_offset + b * o_s0 + h * o_s1 + at * o_s2;
    const ulong go = go_offset + b * go_s0 + h * go_s1 + at * go_s2;
    float sum = 0.0f;
    for (uint d = 0; d < HEAD_DIM_V; ++d)
        sum = fma(LOAD(O_DTYPE, O, o + d * o_s3), LOAD(GO_DTYPE, GO, go + d * go_s3), sum);
    scratch[delta_at + ROW_INDEX(bh, h, span, row)] = FAULT(sum, bh + row); /* (types.cl) */
}

/* dK_j and dV_j of key j of (b, k/v head g): rows part_begin .. part_stop - 1 of every query
 * head of the group. To the outputs, or (to_scratch) as part `part`'s partial sums. */
__kernel void bwd_dkdv(BWD_DKDV_PARAMS)
{
    BWD_OPEN
    const uint key = get_global_id(0);
    const ulong bg = bh_base + get_global_id(1);
    const ulong kv_heads = heads / kv_group;
    const ulong b = bg / kv_heads, g = bg - b * kv_heads;
    const seq_span span = SPAN_OF(b); /* the batch's rows and keys (score.cl) */
    if (key >= span.keys)
        return;
    const uint row_stop = min(part_stop, span.rows);
    float k_row[HEAD_DIM_QK], v_row[HEAD_DIM_V], dk[HEAD_DIM_QK], dv[HEAD_DIM_V];
    const ulong k_at = k_offset + b * k_s0 + g * k_s1 + ((ulong)span.k0 + key) * k_s2;
    const ulong v_at = v_offset + b * v_s0 + g * v_s1 + ((ulong)span.k0 + key) * v_s2;
    for (uint d = 0; d < HEAD_DIM_QK; ++d) {
        k_row[d] = LOAD(K_DTYPE, K, k_at + d * k_s3);
        dk[d] = 0.0f;
    }
    for (uint d = 0; d < HEAD_DIM_V; ++d) {
        v_row[d] = LOAD(V_DTYPE, V, v_at + d * v_s3);
        dv[d] = 0.0f;
    }
    const bool padded =
        key_padded(has_key_padding, key_padding,
                   key_padding_offset + b * key_padding_s0 + (ulong)key * key_padding_s1);
    for (uint t = 0; t < kv_group && !padded; ++t) {
        const ulong h = g * kv_group + t;
        const key_band band = BAND_SPAN(b, h, span);
        if (key >= band.limit)
            break; /* past the batch's key count: no row sees it */
        const ulong bh = b * heads + h;
        for (uint row = part_begin; row < row_stop; ++row) {
            if (key < band_begin(band, row) || key >= band_end(band, row))
                continue;
            const ulong at = (ulong)span.q0 + row; /* the row in the views */
            const ulong q_at = q_offset + b * q_s0 + h * q_s1 + at * q_s2;
            float dot = 0.0f;
            for (uint d = 0; d < HEAD_DIM_QK; ++d)
                dot = fma(LOAD(Q_DTYPE, Q, q_at + d * q_s3), k_row[d], dot);
            const float lse = lse_in[lse_offset + b * lse_s0 + h * lse_s1 + at * lse_s2];
            const bwd_pair pair = bwd_recompute(dot, scale, softcap, band, row, key,
                                                BWD_MASK_TERM(row, key), lse, norm_relu);
            if (pair.p == 0.0f && pair.grad == 0.0f)
                continue;
            const ulong go_at = go_offset + b * go_s0 + h * go_s1 + at * go_s2;
            /* dropout (score.cl): the forward's factor z on what met V: dV by p z, dp by z */
            const float z = SCORE_DROPOUT ? DROPOUT_OF(bh, row, key) : 1.0f;
            const float pz = pair.p * z;
            float dp = 0.0f;
            for (uint d = 0; d < HEAD_DIM_V; ++d) {
                const float go = LOAD(GO_DTYPE, GO, go_at + d * go_s3);
                dp = fma(go, v_row[d], dp);
                dv[d] = fma(pz, go, dv[d]);
            }
            const float dx = pair.grad *
                             (dp * z - scratch[delta_at + ROW_INDEX(bh, h, span, row)]) *
                             pair.dcap;
            for (uint d = 0; d < HEAD_DIM_QK; ++d)
                dk[d] = fma(dx, LOAD(Q_DTYPE, Q, q_at + d * q_s3), dk[d]);
        }
    }
    if (to_scratch) {
        /* packed (b, g, key, col) partial sums of part `part` (KEY_INDEX): dK's, then dV's
         * dv_part_at on */
        __global float *out = scratch + part_at + part * part_stride;
        const ulong k_elems = KEY_INDEX(bg, g, span, key);
        for (uint d = 0; d < HEAD_DIM_QK; ++d)
            out[k_elems * HEAD_DIM_QK + d] = dk[d];
        out += dv_part_at;
        for (uint d = 0; d < HEAD_DIM_V; ++d)
            out[k_elems * HEAD_DIM_V + d] = dv[d];
        return;
    }
    const ulong dk_at = dk_offset + b * dk_s0 + g * dk_s1 + ((ulong)span.k0 + key) * dk_s2;
    const ulong dv_at = dv_offset + b * dv_s0 + g * dv_s1 + ((ulong)span.k0 + key) * dv_s2;
    for (uint d = 0; d < HEAD_DIM_QK; ++d)
        STORE(DK_DTYPE, dk[d], DK, dk_at + d * dk_s3);
    for (uint d = 0; d < HEAD_DIM_V; ++d)
        STORE(DV_DTYPE, dv[d], DV, dv_at + d * dv_s3);
}

/* dQ_i of row i of (b, h): keys part_begin .. part_stop - 1 of its band; with has_dmask, the
 * row's dS over every key of the part into the scratch (packed (b, h, i, j) at dmask_at). */
__kernel void bwd_dq(BWD_DQ_PARAMS)
{
    BWD_OPEN
    const uint row = get_global_id(0);
    const ulong bh = bh_base + get_global_id(1);
    const ulong b = bh / heads, h = bh - b * heads, g = h / kv_group;
    const seq_span span = SPAN_OF(b); /* the batch's rows and keys (score.cl) */
    if (row >= span.rows)
        return;
    const key_band band = BAND_SPAN(b, h, span);
    const ulong at = (ulong)span.q0 + row; /* the row in the views */
    float q_row[HEAD_DIM_QK], go_row[HEAD_DIM_V], dq[HEAD_DIM_QK];
    const ulong q_at = q_offset + b * q_s0 + h * q_s1 + at * q_s2;
    const ulong go_at = go_offset + b * go_s0 + h * go_s1 + at * go_s2;
    for (uint d = 0; d < HEAD_DIM_QK; ++d) {
        q_row[d] = LOAD(Q_DTYPE, Q, q_at + d * q_s3);
        dq[d] = 0.0f;
    }
    for (uint d = 0; d < HEAD_DIM_V; ++d)
        go_row[d] = LOAD(GO_DTYPE, GO, go_at + d * go_s3);
    const float lse = lse_in[lse_offset + b * lse_s0 + h * lse_s1 + at * lse_s2];
    const float delta = scratch[delta_at + ROW_INDEX(bh, h, span, row)];
    __global float *dmask_row = scratch + dmask_at + (bh * seq_q + row) * (ulong)seq_k;
    if (has_dmask)
        for (uint key = part_begin; key < part_stop; ++key)
            dmask_row[key] = 0.0f;
    const uint begin = max(band_begin(band, row), part_begin);
    const uint end = min(band_end(band, row), part_stop);
    for (uint key = begin; key < end; ++key) {
        if (key_padded(has_key_padding, key_padding,
                       key_padding_offset + b * key_padding_s0 + (ulong)key * key_padding_s1))
            continue;
        const ulong k_at = k_offset + b * k_s0 + g * k_s1 + ((ulong)span.k0 + key) * k_s2;
        const ulong v_at = v_offset + b * v_s0 + g * v_s1 + ((ulong)span.k0 + key) * v_s2;
        float dot = 0.0f;
        for (uint d = 0; d < HEAD_DIM_QK; ++d)
            dot = fma(q_row[d], LOAD(K_DTYPE, K, k_at + d * k_s3), dot);
        const bwd_pair pair = bwd_recompute(dot, scale, softcap, band, row, key,
                                            BWD_MASK_TERM(row, key), lse, norm_relu);
        if (pair.grad == 0.0f)
            continue;
        float dp = 0.0f;
        for (uint d = 0; d < HEAD_DIM_V; ++d)
            dp = fma(go_row[d], LOAD(V_DTYPE, V, v_at + d * v_s3), dp);
        if (SCORE_DROPOUT) /* the forward's factor on the weight (score.cl) */
            dp *= DROPOUT_OF(bh, row, key);
        const float ds = pair.grad * (dp - delta);
        if (has_dmask)
            dmask_row[key] = ds;
        const float dx = ds * pair.dcap;
        for (uint d = 0; d < HEAD_DIM_QK; ++d)
            dq[d] = fma(dx, LOAD(K_DTYPE, K, k_at + d * k_s3), dq[d]);
    }
    if (to_scratch) {
        __global float *out = scratch + part_at + part * part_stride +
                              ROW_INDEX(bh, h, span, row) * HEAD_DIM_QK;
        for (uint d = 0; d < HEAD_DIM_QK; ++d)
            out[d] = dq[d];
        return;
    }
    const ulong dq_at = dq_offset + b * dq_s0 + h * dq_s1 + at * dq_s2;
    for (uint d = 0; d < HEAD_DIM_QK; ++d)
        STORE(DQ_DTYPE, dq[d], DQ, dq_at + d * dq_s3);
}

/* ---- CPU variants (work-groups of one work-item; head sizes multiples of 16) ---------------
 * The same sums, with 16 keys in the lanes of a float16: a row's scores and dp for a block of
 * 16 keys are d FMAs each of q (dO) broadcast against the block's transposed keys (values), the
 * rule applied lane-wise (score_value16, the band by lane compares, exp16_nonpositive), then
 * the block's dK, dV rows (bwd_dkdv_cpu) or the row's dQ (bwd_dq_cpu) take 16-float FMAs. Every
 * loop over the register blocks (BWD_RB rows, BWD_NV vectors) is unrolled (#pragma unroll), as
 * flash_cpu.cl's are: without it PoCL 3.1 kept dot, dp, p and dx in memory and the backward
 * ran at half the speed (L = 1024, H = 8, d = 64: 70-80 ms, 38-42 ms unrolled). */
#ifndef BWD_CPU
#define BWD_CPU 0 /* 1: the CPU variants are compiled in (their local arrays are CPU-sized) */
#endif
#if BWD_CPU
#ifndef BWD_NV
#define BWD_NV 4 /* 16-key vectors per key block (the host's choice, by local memory) */
#endif
#define BWD_BK (16 * BWD_NV) /* keys per block */
#ifndef BWD_BQ
#define BWD_BQ 64 /* query rows per work-item of bwd_dq_cpu (a multiple of BWD_RB) */
#endif
#ifndef BWD_RB
#define BWD_RB 4 /* query rows a step takes together (their loads of a key block shared; the
                    host's choice, tuning key flash_bwd_rb, 1 .. 8) */
#endif
#if BWD_BQ % BWD_RB != 0
#error "BWD_BQ must be a multiple of BWD_RB (bwd_dq_cpu steps its rows BWD_RB at a time)"
#endif
#define BWD_DQV (HEAD_DIM_QK / 16) /* float16 vectors of a dQ row (bwd_dq_slots) */
#define BWD_DQW (BWD_DQV < 1 ? 1 : BWD_DQV < 4 ? BWD_DQV : 4) /* summed in one pass over the keys */

/* The rule on a block's 16 scaled dot products xs of row `row` (keys key0 ..): p, and dX = dS
 * * scale * cap' (0 where a key is dropped: outside [kb, ke), padded (pad: -inf) or masked).
 * drop: the keys' dropout factors (score.cl; 1 without dropout): p_out is p * drop, the weight
 * that met V, and dp is taken times drop.
 * mask_row: the row's mask elements (has_mask), element j at mask_row[(key0 + j) * mask_s3].
 * Always inlined: as a call (PoCL 3.1 left the plain `inline` one a call, 8 a step) its
 * outputs went through memory; inlined the backward took 0.92x the time at d = 64. */
__attribute__((always_inline)) inline void
bwd_block16(const float16 xs, const float16 dp, const float softcap, const key_band band,
            const uint row, const uint key0, const uint kb, const uint ke, const float16 pad,
            const int has_mask, __global const ELEM_T(MASK_DTYPE) *mask_row, const ulong mask_s3,
            const float lse, const float delta, const float scale, const int norm_relu,
            const float16 drop, float16 *p_out, float16 *dx_out, float16 *ds_out)
{
    const float16 pre = score_builtin16(xs, softcap, band, row, key0);
    float16 sv = flex_keep16(band, flex_score16(band, pre, row, key0) + pad, row, key0);
    if (has_mask) {
        float m[16];
        for (uint j = 0; j < 16; ++j)
            m[j] = key0 + j < ke ? mask_term(mask_row, (ulong)(key0 + j) * mask_s3) : 0.0f;
        sv += vload16(0, m);
    }
    const int16 key = (int16)((int)key0) +
                      (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const int16 keep = (key >= (int16)((int)kb)) & (key < (int16)((int)ke)) &
                       (sv != (float16)(NEG_INF));
    float16 p, grad;
    if (norm_relu) {
        const float inv = exp(-lse);
        grad = select((float16)(0.0f), (float16)(inv), keep & (sv > (float16)(0.0f)));
        p = select((float16)(0.0f), grad * sv, keep & (sv > (float16)(0.0f))); /* not 0 * -inf */
    } else {
        p = select((float16)(0.0f), exp16_nonpositive(sv - lse), keep);
        grad = p;
    }
    float16 dcap = (float16)(scale);
    if (softcap > 0.0f) {
        const float16 t = tanh(xs * (1.0f / softcap));
        dcap = scale * (1.0f - t * t);
    }
    if (FLEX_SCORE)
        dcap *= flex_grad16(band, pre, row, key0); /* chain rule through score_mod */
    const float16 ds = select((float16)(0.0f), grad * (dp * drop - delta), keep);
    *p_out = p * drop;
    *ds_out = ds;
    *dx_out = ds * dcap;
}

/* The block's keys (values) key0 .. key0 + keys - 1 transposed into kt (vt), keys in lanes (zero
 * past `keys`), k_rows too when not NULL; their key padding as 0 / -inf terms in pad_terms. */
inline void bwd_stage_keys(__global const ELEM_T(K_DTYPE) *K, __global const ELEM_T(V_DTYPE) *V,
                           const ulong k_base, const ulong k_s2, const ulong k_s3,
                           const ulong v_base, const ulong v_s2, const ulong v_s3,
                           const uint key0, const uint keys, const int has_key_padding,
                           __global const uchar *key_padding, const ulong pad_base,
                           const ulong pad_s1, __local float (*kt)[BWD_BK],
                           __local float (*vt)[BWD_BK], __local float (*k_rows)[HEAD_DIM_QK],
                           float *pad_terms)
{
    for (uint j = 0; j < BWD_BK; ++j) {
        const uint key = key0 + j;
        const bool here = j < keys;
        pad_terms[j] = here && !key_padded(has_key_padding, key_padding,
                                           pad_base + (ulong)key * pad_s1)
                           ? 0.0f
                           : NEG_INF;
        const ulong k_at = k_base + (ulong)key * k_s2, v_at = v_base + (ulong)key * v_s2;
        for (uint d = 0; d < HEAD_DIM_QK; ++d) {
            const float x = here ? LOAD(K_DTYPE, K, k_at + d * k_s3) : 0.0f;
            kt[d][j] = x;
            if (k_rows)
                k_rows[j][d] = x;
        }
        for (uint d = 0; d < HEAD_DIM_V; ++d)
            vt[d][j] = here ? LOAD(V_DTYPE, V, v_at + d * v_s3) : 0.0f;
    }
}

/* The dropout factors (score.cl) of keys key0 .. key0 + 16 * BWD_NV - 1 of row `row` of
 * stream bh, or 1 without dropout (a kernel's locals). */
#if SCORE_DROPOUT
#define BWD_DROP(drop, bh, row, key0)                                                             \
    {                                                                                             \
        uint v_ = 0;                                                                              \
        for (; v_ + 4 <= BWD_NV; v_ += 4)                                                         \
            DROPOUT64_OF((bh), (row), (key0) + 16 * v_, (drop) + v_);                             \
        for (; v_ < BWD_NV; ++v_)                                                                 \
            (drop)[v_] = DROPOUT16_OF((bh), (row), (key0) + 16 * v_);                             \
    }
#else
#define BWD_DROP(drop, bh, row, key0)                                                             \
    for (uint v_ = 0; v_ < BWD_NV; ++v_)                                                          \
        (drop)[v_] = (float16)(1.0f);
#endif

/* Rows row0 .. row0 + BWD_RB - 1 against a staged key block: their scaled dot products and
 * dp (lanes: keys, vectors: BWD_NV) from q_rows, go_rows (BWD_RB rows each). */
#define BWD_DOTS(q_rows, go_rows)                                                                 \
    float16 dot[BWD_RB][BWD_NV], dp[BWD_RB][BWD_NV];                                              \
    _Pragma("unroll") for (uint r = 0; r < BWD_RB; ++r)                                           \
        _Pragma("unroll") for (uint v = 0; v < BWD_NV; ++v)                                       \
            dot[r][v] = dp[r][v] = (float16)(0.0f);                                               \
    for (uint d = 0; d < HEAD_DIM_QK; ++d)                                                        \
        _Pragma("unroll") for (uint v = 0; v < BWD_NV; ++v) {                                     \
            const float16 kd = vload16(v, kt[d]);                                                 \
            _Pragma("unroll") for (uint r = 0; r < BWD_RB; ++r)                                   \
                dot[r][v] = fma((float16)((q_rows)[r][d]), kd, dot[r][v]);                        \
        }                                                                                         \
    for (uint d = 0; d < HEAD_DIM_V; ++d)                                                         \
        _Pragma("unroll") for (uint v = 0; v < BWD_NV; ++v) {                                     \
            const float16 vd = vload16(v, vt[d]);                                                 \
            _Pragma("unroll") for (uint r = 0; r < BWD_RB; ++r)                                   \
                dp[r][v] = fma((float16)((go_rows)[r][d]), vd, dp[r][v]);                         \
        }

/* The CPU kernels' steps, always inlined (PoCL left plain `inline` steps as calls, their
 * register blocks in memory). bwd_load_row: row `row` of (b, h) (the row's open): its q and dO
 * rows into q_row and go_row, its lse and delta (ROW_INDEX) into *lse and *delta; zeros (lse
 * -inf) where the row is not `here`. */
__attribute__((always_inline)) inline void
bwd_load_row(__local float *q_row, __local float *go_row, float *lse, float *delta,
             __global const ELEM_T(Q_DTYPE) *Q, __global const ELEM_T(GO_DTYPE) *GO,
             __global const float *lse_in, __global const float *scratch,
             const clattn_flash_bwd_params params, const ulong b, const ulong h, const ulong bh,
             const seq_span span, const uint row, const bool here)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_BWD_PARAMS)
    const ulong at = (ulong)span.q0 + row; /* the row in the views */
    const ulong q_at = q_offset + b * q_s0 + h * q_s1 + at * q_s2;
    const ulong go_at = go_offset + b * go_s0 + h * go_s1 + at * go_s2;
    for (uint d = 0; d < HEAD_DIM_QK; ++d)
        q_row[d] = here ? LOAD(Q_DTYPE, Q, q_at + d * q_s3) : 0.0f;
    for (uint d = 0; d < HEAD_DIM_V; ++d)
        go_row[d] = here ? LOAD(GO_DTYPE, GO, go_at + d * go_s3) : 0.0f;
    *lse = here ? lse_in[lse_offset + b * lse_s0 + h * lse_s1 + at * lse_s2] : NEG_INF;
    *delta = here ? scratch[delta_at + ROW_INDEX(bh, h, span, row)] : 0.0f;
}

/* acc[r][c] += sum over the first `keys` keys j of dxj[r][j] x k_rows[j], vectors c0 .. c0 + nc
 * of 16 columns (BWD_RB x BWD_DQW independent sums; bwd_dq_slots and bwd_dq_cpu) */
__attribute__((always_inline)) inline void
bwd_dq_keys(float16 (*acc)[BWD_DQW], float (*dxj)[BWD_BK], __local float (*k_rows)[HEAD_DIM_QK],
            uint keys, uint c0, uint nc)
{
    for (uint j = 0; j < keys; ++j) {
        float16 kj[BWD_DQW];
#pragma unroll
        for (uint c = 0; c < BWD_DQW; ++c)
            kj[c] = c < nc ? vload16(c0 + c, k_rows[j]) : (float16)(0.0f);
#pragma unroll
        for (uint r = 0; r < BWD_RB; ++r) {
            const float16 x = (float16)(dxj[r][j]);
#pragma unroll
            for (uint c = 0; c < BWD_DQW; ++c)
                acc[r][c] = fma(x, kj[c], acc[r][c]);
        }
    }
}

/* dQ_i += sum_j dX_ij k_j for rows row0 .. min(row0 + BWD_RB, last) - 1 of (b, h) against the
 * block's first `keys` keys (k_rows), into this work-group's slot of the scratch (bwd_dkdv_cpu
 * with dq_slots; bwd_sum_parts adds the slots in order). */
__attribute__((always_inline)) inline void
bwd_dq_slots(__global float *scratch, float16 (*dx)[BWD_NV], __local float (*k_rows)[HEAD_DIM_QK],
             const clattn_flash_bwd_params params, const ulong h, const ulong bh,
             const seq_span span, const uint row0, const uint last, const uint keys)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_BWD_PARAMS)
    float dxj[BWD_RB][BWD_BK];
#pragma unroll
    for (uint r = 0; r < BWD_RB; ++r)
#pragma unroll
        for (uint v = 0; v < BWD_NV; ++v)
            vstore16(dx[r][v], v, dxj[r]);
    __global float *slot = scratch + dq_slots_at +
                           get_group_id(0) * dq_slot_stride +
                           ROW_INDEX(bh, h, span, row0) * HEAD_DIM_QK;
    const uint n = min((uint)BWD_RB, last - row0);
    /* BWD_DQW vectors of 16 columns at a time: BWD_RB x BWD_DQW independent sums (4 x 1 kept
     * each FMA waiting on the one before: 20 % of the kernel, latency-bound, at d = 64) */
    for (uint c0 = 0; c0 < BWD_DQV; c0 += BWD_DQW) {
        const uint nc = min((uint)BWD_DQW, (uint)BWD_DQV - c0);
        float16 acc[BWD_RB][BWD_DQW];
#pragma unroll
        for (uint r = 0; r < BWD_RB; ++r)
#pragma unroll
            for (uint c = 0; c < BWD_DQW; ++c)
                acc[r][c] = r < n && c < nc ? vload16(c0 + c, slot + r * HEAD_DIM_QK)
                                            : (float16)(0.0f);
        bwd_dq_keys(acc, dxj, k_rows, keys, c0, nc);
        for (uint r = 0; r < n; ++r)
#pragma unroll
            for (uint c = 0; c < BWD_DQW; ++c)
                if (c < nc)
                    vstore16(acc[r][c], c0 + c, slot + r * HEAD_DIM_QK);
    }
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bwd_dkdv_cpu(BWD_DKDV_PARAMS)
{
    BWD_OPEN
    /* the block's keys and values transposed (keys in lanes), its dK and dV transposed; its
     * keys as rows too when dQ is summed here (dq_slots) */
    __local float kt[HEAD_DIM_QK][BWD_BK], vt[HEAD_DIM_V][BWD_BK];
    __local float16 dkt[HEAD_DIM_QK][BWD_NV], dvt[HEAD_DIM_V][BWD_NV]; /* (whole vectors) */
    __local float q_rows[BWD_RB][HEAD_DIM_QK], go_rows[BWD_RB][HEAD_DIM_V];
    __local float k_rows[BWD_BK][HEAD_DIM_QK];
    const ulong bg = bh_base + get_global_id(1);
    const ulong kv_heads = heads / kv_group;
    const ulong b = bg / kv_heads, g = bg - b * kv_heads;
    const seq_span span = SPAN_OF(b); /* the batch's rows and keys (score.cl) */
    const uint row_stop = min(part_stop, span.rows);
    /* Work-group i takes key blocks i, i + n, ... (n work-groups along dimension 0: one block
     * each, or dq_slots, each summing its blocks' dQ into its own slot) */
    const uint blocks = (span.keys + BWD_BK - 1) / BWD_BK;
    for (uint block = get_group_id(0); block < blocks; block += get_num_groups(0)) {
        const uint key0 = block * BWD_BK;
        const uint keys = min((uint)BWD_BK, span.keys - key0);
        float pad_terms[BWD_BK];
        bwd_stage_keys(K, V, k_offset + b * k_s0 + g * k_s1 + span.k0 * k_s2, k_s2, k_s3,
                       v_offset + b * v_s0 + g * v_s1 + span.k0 * v_s2, v_s2, v_s3, key0, keys,
                       has_key_padding,
                       key_padding, key_padding_offset + b * key_padding_s0, key_padding_s1, kt, vt,
                       dq_slots ? k_rows : NULL, pad_terms);
        for (uint d = 0; d < HEAD_DIM_QK; ++d)
            for (uint v = 0; v < BWD_NV; ++v)
                dkt[d][v] = (float16)(0.0f);
        for (uint d = 0; d < HEAD_DIM_V; ++d)
            for (uint v = 0; v < BWD_NV; ++v)
                dvt[d][v] = (float16)(0.0f);
        for (uint t = 0; t < kv_group; ++t) {
            const ulong h = g * kv_group + t;
            const key_band band = BAND_SPAN(b, h, span);
            if (key0 >= band.limit)
                break; /* past the batch's key count: no row sees the block */
            const ulong bh = b * heads + h;
            /* the rows whose band meets the block: both band ends grow with the row */
            uint first = part_begin, last;
            while (first < row_stop && band_end(band, first) <= key0)
                ++first;
            for (last = first; last < row_stop && band_begin(band, last) < key0 + keys; ++last)
                ;
            for (uint row0 = first; row0 < last; row0 += BWD_RB) {
                float lse_r[BWD_RB], delta_r[BWD_RB];
                for (uint r = 0; r < BWD_RB; ++r)
                    bwd_load_row(q_rows[r], go_rows[r], &lse_r[r], &delta_r[r], Q, GO, lse_in,
                                 scratch, params, b, h, bh, span, row0 + r, row0 + r < last);
                BWD_DOTS(q_rows, go_rows)
                float16 p[BWD_RB][BWD_NV], dx[BWD_RB][BWD_NV];
#pragma unroll
                for (uint r = 0; r < BWD_RB; ++r) {
                    const uint row = row0 + r;
                    const uint kb = band_begin(band, row), ke = band_end(band, row);
                    float16 drop[BWD_NV];
                    BWD_DROP(drop, bh, row, key0)
#pragma unroll
                    for (uint v = 0; v < BWD_NV; ++v) {
                        p[r][v] = dx[r][v] = (float16)(0.0f);
                        const uint k0 = key0 + 16 * v;
                        if (lse_r[r] == NEG_INF || ke <= k0 || kb >= k0 + 16)
                            continue;
                        float16 ds;
                        bwd_block16(dot[r][v] * scale, dp[r][v], softcap, band, row, k0, kb, ke,
                                    vload16(v, pad_terms), has_mask,
                                    mask + mask_offset + b * mask_s0 + h * mask_s1 +
                                        (ulong)row * mask_s2,
                                    mask_s3, lse_r[r], delta_r[r], scale, norm_relu, drop[v],
                                    &p[r][v], &dx[r][v], &ds);
                    }
                }
                for (uint d = 0; d < HEAD_DIM_V; ++d)
#pragma unroll
                    for (uint v = 0; v < BWD_NV; ++v) {
                        float16 acc = dvt[d][v];
#pragma unroll
                        for (uint r = 0; r < BWD_RB; ++r)
                            acc = fma((float16)(go_rows[r][d]), p[r][v], acc);
                        dvt[d][v] = acc;
                    }
                for (uint d = 0; d < HEAD_DIM_QK; ++d)
#pragma unroll
                    for (uint v = 0; v < BWD_NV; ++v) {
                        float16 acc = dkt[d][v];
#pragma unroll
                        for (uint r = 0; r < BWD_RB; ++r)
                            acc = fma((float16)(q_rows[r][d]), dx[r][v], acc);
                        dkt[d][v] = acc;
                    }
                if (dq_slots) /* dQ_i += sum_j dX_ij k_j into this work-group's slot */
                    bwd_dq_slots(scratch, dx, k_rows, params, h, bh, span, row0, last, keys);
            }
        }
        for (uint j = 0; j < keys; ++j) {
            const uint key = key0 + j;
            if (to_scratch) {
                __global float *out = scratch + part_at + part * part_stride;
                const ulong k_elems = KEY_INDEX(bg, g, span, key);
                for (uint d = 0; d < HEAD_DIM_QK; ++d)
                    out[k_elems * HEAD_DIM_QK + d] = ((__local const float *)dkt[d])[j];
                for (uint d = 0; d < HEAD_DIM_V; ++d)
                    out[dv_part_at + k_elems * HEAD_DIM_V + d] = ((__local const float *)dvt[d])[j];
                continue;
            }
            const ulong dk_at =
                dk_offset + b * dk_s0 + g * dk_s1 + ((ulong)span.k0 + key) * dk_s2;
            const ulong dv_at =
                dv_offset + b * dv_s0 + g * dv_s1 + ((ulong)span.k0 + key) * dv_s2;
            for (uint d = 0; d < HEAD_DIM_QK; ++d)
                STORE(DK_DTYPE, ((__local const float *)dkt[d])[j], DK, dk_at + d * dk_s3);
            for (uint d = 0; d < HEAD_DIM_V; ++d)
                STORE(DV_DTYPE, ((__local const float *)dvt[d])[j], DV, dv_at + d * dv_s3);
        }
    } /* the key blocks */
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bwd_dq_cpu(BWD_DQ_PARAMS)
{
    BWD_OPEN
    __local float kt[HEAD_DIM_QK][BWD_BK], vt[HEAD_DIM_V][BWD_BK], k_rows[BWD_BK][HEAD_DIM_QK];
    __local float q_all[BWD_BQ][HEAD_DIM_QK], go_all[BWD_BQ][HEAD_DIM_V];
    __local float16 dq_acc[BWD_BQ][(HEAD_DIM_QK + 15) / 16]; /* (whole vectors) */
    const uint row0 = get_group_id(0) * BWD_BQ;
    const ulong bh = bh_base + get_global_id(1);
    const ulong b = bh / heads, h = bh - b * heads, g = h / kv_group;
    const seq_span span = SPAN_OF(b); /* the batch's rows and keys (score.cl) */
    if (row0 >= span.rows)
        return; /* (a work-group of one work-item) */
    const key_band band = BAND_SPAN(b, h, span);
    const uint rows = min((uint)BWD_BQ, span.rows - row0);
    float lse_all[BWD_BQ], delta_all[BWD_BQ];
    for (uint r = 0; r < BWD_BQ; ++r) {
        const uint row = row0 + r;
        const bool here = r < rows;
        bwd_load_row(q_all[r], go_all[r], &lse_all[r], &delta_all[r], Q, GO, lse_in, scratch,
                     params, b, h, bh, span, row, here);
        for (uint c = 0; c < (HEAD_DIM_QK + 15) / 16; ++c)
            dq_acc[r][c] = (float16)(0.0f);
        if (has_dmask && here)
            for (uint key = part_begin; key < part_stop; ++key)
                scratch[dmask_at + (bh * seq_q + row) * (ulong)seq_k + key] = 0.0f;
    }
    /* the keys any of the rows sees (both band ends grow with the row) */
    const uint first = max(band_begin(band, row0), part_begin);
    const uint stop = min(band_end(band, row0 + rows - 1), part_stop);
    float pad_terms[BWD_BK];
    for (uint key0 = first; key0 < stop; key0 += BWD_BK) {
        const uint keys = min((uint)BWD_BK, stop - key0);
        bwd_stage_keys(K, V, k_offset + b * k_s0 + g * k_s1 + span.k0 * k_s2, k_s2, k_s3,
                       v_offset + b * v_s0 + g * v_s1 + span.k0 * v_s2, v_s2, v_s3, key0, keys,
                       has_key_padding, key_padding, key_padding_offset + b * key_padding_s0,
                       key_padding_s1, kt, vt, k_rows, pad_terms);
        for (uint r0 = 0; r0 < rows; r0 += BWD_RB) {
            BWD_DOTS(q_all + r0, go_all + r0)
            float dxj[BWD_RB][BWD_BK];
#pragma unroll
            for (uint r = 0; r < BWD_RB; ++r) {
                const uint row = row0 + r0 + r;
                const uint kb = band_begin(band, row), ke = min(band_end(band, row), key0 + keys);
                float16 drop[BWD_NV];
                BWD_DROP(drop, bh, row, key0)
#pragma unroll
                for (uint v = 0; v < BWD_NV; ++v) {
                    const uint k0 = key0 + 16 * v;
                    float16 p, dx = (float16)(0.0f), ds = (float16)(0.0f);
                    if (lse_all[r0 + r] != NEG_INF && ke > k0 && kb < k0 + 16)
                        bwd_block16(dot[r][v] * scale, dp[r][v], softcap, band, row, k0, kb, ke,
                                    vload16(v, pad_terms), has_mask,
                                    mask + mask_offset + b * mask_s0 + h * mask_s1 +
                                        (ulong)row * mask_s2,
                                    mask_s3, lse_all[r0 + r], delta_all[r0 + r], scale,
                                    norm_relu, drop[v], &p, &dx, &ds);
                    vstore16(dx, v, dxj[r]);
                    if (has_dmask && r0 + r < rows) {
                        float dsj[16];
                        vstore16(ds, 0, dsj);
                        for (uint j = 0; j < 16 && 16 * v + j < keys; ++j)
                            scratch[dmask_at + (bh * seq_q + row) * (ulong)seq_k + k0 + j] =
                                dsj[j];
                    }
                }
            }
            /* (BWD_RB x BWD_DQW independent sums, as bwd_dq_slots) */
            for (uint c0 = 0; c0 < BWD_DQV; c0 += BWD_DQW) {
                const uint nc = min((uint)BWD_DQW, (uint)BWD_DQV - c0);
                float16 acc[BWD_RB][BWD_DQW];
#pragma unroll
                for (uint r = 0; r < BWD_RB; ++r)
#pragma unroll
                    for (uint c = 0; c < BWD_DQW; ++c)
                        acc[r][c] = c < nc ? dq_acc[r0 + r][c0 + c] : (float16)(0.0f);
                bwd_dq_keys(acc, dxj, k_rows, keys, c0, nc);
#pragma unroll
                for (uint r = 0; r < BWD_RB; ++r)
#pragma unroll
                    for (uint c = 0; c < BWD_DQW; ++c)
                        if (c < nc)
                            dq_acc[r0 + r][c0 + c] = acc[r][c];
            }
        }
    }
    for (uint r = 0; r < rows; ++r) {
        const uint row = row0 + r;
        if (to_scratch) {
            __global float *out = scratch + part_at + part * part_stride +
                                  ROW_INDEX(bh, h, span, row) * HEAD_DIM_QK;
            for (uint d = 0; d < HEAD_DIM_QK; ++d)
                out[d] = ((__local const float *)dq_acc[r])[d];
            continue;
        }
        const ulong dq_at = dq_offset + b * dq_s0 + h * dq_s1 + ((ulong)span.q0 + row) * dq_s2;
        for (uint d = 0; d < HEAD_DIM_QK; ++d)
            STORE(DQ_DTYPE, ((__local const float *)dq_acc[r])[d], DQ, dq_at + d * dq_s3);
    }
}

#endif /* BWD_CPU */

/* out[i] = sum over parts p of in[p][i], in order, for the packed (d0, d1, d2, d3) elements,
 * stored through out's strides in OUT_DTYPE. row_items work-items share a row of d3 elements,
 * work-item c of a row taking its columns c, c + row_items, ...: on CPUs one (the 64-bit
 * divisions that place a row in out once a row: done once an element, they took 6 % of a CPU
 * backward, d = 64, L = 1024, one part: a copy), on GPUs d3 (neighbouring work-items read
 * neighbouring floats). */
#ifndef OUT_DTYPE
#define OUT_DTYPE 0 /* bwd_sum_parts', bwd_mask_reduce's output dtype */
#endif
__kernel void bwd_sum_parts(__global const float *scratch, __global ELEM_T(OUT_DTYPE) *out,
                            const clattn_bwd_reduce_params params)
{
    CLATTN_UNPACK(CLATTN_BWD_REDUCE_PARAMS)
    const ulong item = get_global_id(0), row = item / row_items;
    if (row >= total / d3)
        return;
    const ulong c2 = row % d2, r2 = row / d2;
    const ulong c1 = r2 % d1, c0 = r2 / d1;
    __global const float *in = scratch + in_at + row * d3;
    const ulong out_at = out_offset + c0 * out_s0 + c1 * out_s1 + c2 * out_s2;
    for (uint c3 = (uint)(item - row * row_items); c3 < d3; c3 += row_items) {
        float sum = 0.0f;
        for (uint p = 0; p < parts; ++p)
            sum += in[p * in_stride + c3];
        STORE(OUT_DTYPE, sum, out, out_at + c3 * out_s3);
    }
}

/* Zeros into the scratch's floats in_at .. in_at + total - 1 (the dQ slots before they sum). */
__kernel void bwd_zero(__global float *scratch, const clattn_bwd_reduce_params params)
{
    CLATTN_UNPACK(CLATTN_BWD_REDUCE_PARAMS)
    const ulong i = get_global_id(0);
    if (i < total)
        scratch[in_at + i] = 0.0f;
}

/* A broadcast float mask's gradient: element (c0, c1, c2, c3) of the (d0, d1, d2, d3) result
 * is the sum of the packed (n0, n1, n2, n3) dS over the dims where d is 1 and n is not, in
 * order. */
__kernel void bwd_mask_reduce(__global const float *scratch, __global ELEM_T(OUT_DTYPE) *out,
                              const clattn_bwd_reduce_params params)
{
    CLATTN_UNPACK(CLATTN_BWD_REDUCE_PARAMS)
    const ulong i = get_global_id(0);
    if (i >= total)
        return;
    const ulong c3 = i % d3, r3 = i / d3;
    const ulong c2 = r3 % d2, r2 = r3 / d2;
    const ulong c1 = r2 % d1, c0 = r2 / d1;
    const uint e0 = d0 == n0 ? 1u : n0, e1 = d1 == n1 ? 1u : n1;
    const uint e2 = d2 == n2 ? 1u : n2, e3 = d3 == n3 ? 1u : n3;
    float sum = 0.0f;
    for (uint a0 = 0; a0 < e0; ++a0)
        for (uint a1 = 0; a1 < e1; ++a1)
            for (uint a2 = 0; a2 < e2; ++a2)
                for (uint a3 = 0; a3 < e3; ++a3) {
                    const ulong i0 = e0 == 1u ? c0 : a0, i1 = e1 == 1u ? c1 : a1;
                    const ulong i2 = e2 == 1u ? c2 : a2, i3 = e3 == 1u ? c3 : a3;
                    sum += scratch[in_at + ((i0 * n1 + i1) * n2 + i2) * n3 + i3];
                }
    STORE(OUT_DTYPE, sum, out, out_offset + c0 * out_s0 + c1 * out_s1 + c2 * out_s2 + c3 * out_s3);
}

/* The sinks' gradient of head h: -sum over batches b and rows i of exp(sink_h - lse) D, in
 * order. aux: the sinks (offset, per-head stride aux_s0); lse's strides in out_s1 .. out_s3
 * with its offset in in_stride; n0 batches, n1 heads, n2 rows; out (heads) at out_offset,
 * stride out_s0. */
__kernel void bwd_sinks(__global const float *scratch, __global const float *lse_in,
                        __global const float *sinks, __global float *out,
                        const clattn_bwd_reduce_params params)
{
    CLATTN_UNPACK(CLATTN_BWD_REDUCE_PARAMS)
    const uint h = get_global_id(0);
    if (h >= n1)
        return;
    const float sink = sinks[aux_offset + h * aux_s0];
    float sum = 0.0f;
    if (sink != NEG_INF) {
        for (uint b = 0; b < n0; ++b)
            for (uint row = 0; row < n2; ++row) {
                const float lse = lse_in[in_stride + b * out_s1 + h * out_s2 + row * out_s3];
                const float delta = scratch[in_at + ((ulong)b * n1 + h) * n2 + row];
                sum += exp(sink - lse) * delta;
            }
    }
    out[out_offset + h * out_s0] = -sum;
}

/* The unfused path's step between its matmuls (host/attn/sdpa_backward_unfused.c), one
 * work-item per query row of (b, h), over the packed (b, h, i, j) matrices in the scratch: the
 * raw dots x_ij = q_i . k_j (at dmask_at), the weights p_ij the forward's softmax kernel forms
 * from them, undropped (at p_at), and dp_ij = dO_i . v_j (at dp_at). First D_i = sum_j p_ij
 * z_ij dp_ij (= dO_i . O_i; into the scratch at delta_at), then per key: p z over p (what met
 * V: dV = (P Z)^T dO), dX = dS * scale * cap'(x) over dp (dQ = dX K, dK = dX^T Q) and dS
 * over the dot (a float mask's gradient). dS = g (dp z - D) with g = p (softmax) or
 * [s > 0] / sum relu = p / s (relu). */
__kernel void bwd_unfused_rows(__global float *scratch, __global const ELEM_T(MASK_DTYPE) *mask,
                               __global const uchar *key_padding, SCORE_BUFFERS_BASE,
                               const clattn_flash_bwd_params params)
{
    CLATTN_UNPACK_SCORED(CLATTN_FLASH_BWD_PARAMS)
    FLEX_FROM_SCRATCH
    const uint row = get_global_id(0);
    const ulong bh = bh_base + get_global_id(1);
    if (row >= seq_q)
        return;
    const ulong b = bh / heads, h = bh - b * heads;
    const ulong at = (bh * seq_q + row) * (ulong)seq_k;
    __global float *raw = scratch + dmask_at + at;
    __global float *p = scratch + p_at + at;
    __global float *dp = scratch + dp_at + at;
    float delta = 0.0f;
    for (uint key = 0; key < seq_k; ++key) {
        const float z = SCORE_DROPOUT ? DROPOUT_OF(bh, row, key) : 1.0f;
        delta = fma(p[key] * z, dp[key], delta);
    }
    scratch[delta_at + bh * seq_q + row] = delta;
    const key_band band = BAND_OF(b, h);
    for (uint key = 0; key < seq_k; ++key) {
        const float x = scale * raw[key];
        const float pk = p[key];
        float grad = pk;
        if (norm_relu) {
            const float s = score_value(x, softcap, band, row, key) + BWD_MASK_TERM(row, key);
            grad = pk > 0.0f ? pk / s : 0.0f;
        }
        const float z = SCORE_DROPOUT ? DROPOUT_OF(bh, row, key) : 1.0f;
        const float ds = grad * (dp[key] * z - delta);
        float cap = 1.0f;
        if (softcap > 0.0f) {
            const float t = tanh(x / softcap);
            cap = 1.0f - t * t;
        }
        if (FLEX_SCORE && pk != 0.0f) /* chain rule through score_mod (kept keys only) */
            cap *= flex_grad(band, score_builtin(x, softcap, band, row, key), row, key);
        p[key] = pk * z;
        dp[key] = ds * scale * cap;
        raw[key] = ds;
    }
}
