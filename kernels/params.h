/*
 * params.h: the parameter struct of each kernel family, declared once for both sides. The host
 * C (host/ops) includes it, and it is prepended to every kernel source (after types.cl), so
 * the struct a host fills is, field for field, the struct the kernel reads. A kernel takes its
 * buffers plus one such struct by value (OpenCL C passes structs by value), so no kernel has
 * more than 16 parameters and a new field is one line here, not a new argument at every launch.
 *
 * Each family is an X-macro list of (type, name). The layout is the same on both sides by
 * construction: the fields come in the same order, the types have the same sizes (ulong/long
 * 8 bytes, uint/int/float 4), every 8-byte field precedes every 4-byte one, and each struct
 * asserts (host: _Static_assert; kernel: a negative array size) that it has no padding at all,
 * so each field's offset is the sum of the sizes before it. tests/check_runtime.c
 * (test_params_layout) also passes every struct to a device and reads each field back.
 *
 * In a kernel, CLATTN_UNPACK(LIST) declares a const local per field from the struct argument
 * `params`, with the field's name, so the kernel body reads `seq_k`, `q_s2` as it would an
 * argument.
 */
#ifndef CLATTN_PARAMS_H
#define CLATTN_PARAMS_H

#if defined(__OPENCL_VERSION__) || defined(__OPENCL_C_VERSION__)
#define CLATTN_T_ulong ulong
#define CLATTN_T_long long
#define CLATTN_T_uint uint
#define CLATTN_T_int int
#define CLATTN_T_float float
#else
#include <CL/cl.h>
#define CLATTN_T_ulong cl_ulong
#define CLATTN_T_long cl_long
#define CLATTN_T_uint cl_uint
#define CLATTN_T_int cl_int
#define CLATTN_T_float cl_float
#endif

#define CLATTN_PARAM_FIELD(type, name) CLATTN_T_##type name;
#define CLATTN_PARAM_SIZE(type, name) +sizeof(CLATTN_T_##type)
#define CLATTN_PARAM_LOCAL(type, name) const CLATTN_T_##type name = params.name;

/* Declares the struct `clattn_<family>_params` from its list and asserts it has no padding. */
#if defined(__OPENCL_VERSION__) || defined(__OPENCL_C_VERSION__)
#define CLATTN_PARAMS_STRUCT(family, LIST)                                                        \
    typedef struct clattn_##family##_params {                                                     \
        LIST(CLATTN_PARAM_FIELD)                                                                  \
    } clattn_##family##_params;                                                                   \
    typedef char clattn_##family##_params_unpadded                                                \
        [sizeof(clattn_##family##_params) == (0 LIST(CLATTN_PARAM_SIZE)) ? 1 : -1];
#else
#define CLATTN_PARAMS_STRUCT(family, LIST)                                                        \
    typedef struct clattn_##family##_params {                                                     \
        LIST(CLATTN_PARAM_FIELD)                                                                  \
    } clattn_##family##_params;                                                                   \
    _Static_assert(sizeof(clattn_##family##_params) == (0 LIST(CLATTN_PARAM_SIZE)),               \
                   "clattn_" #family "_params has padding: keep 8-byte fields first and an "      \
                   "even count of 4-byte fields");
#endif

/* A family whose struct starts with the score rule's operands (clattn_score_params score). */
#if defined(__OPENCL_VERSION__) || defined(__OPENCL_C_VERSION__)
#define CLATTN_SCORED_PARAMS_STRUCT(family, LIST)                                                 \
    typedef struct clattn_##family##_params {                                                     \
        clattn_score_params score;                                                                \
        LIST(CLATTN_PARAM_FIELD)                                                                  \
    } clattn_##family##_params;                                                                   \
    typedef char clattn_##family##_params_unpadded                                                \
        [sizeof(clattn_##family##_params) ==                                                      \
                 sizeof(clattn_score_params) + (0 LIST(CLATTN_PARAM_SIZE))                        \
             ? 1                                                                                  \
             : -1];
#else
#define CLATTN_SCORED_PARAMS_STRUCT(family, LIST)                                                 \
    typedef struct clattn_##family##_params {                                                     \
        clattn_score_params score;                                                                \
        LIST(CLATTN_PARAM_FIELD)                                                                  \
    } clattn_##family##_params;                                                                   \
    _Static_assert(sizeof(clattn_##family##_params) ==                                            \
                       sizeof(clattn_score_params) + (0 LIST(CLATTN_PARAM_SIZE)),                 \
                   "clattn_" #family "_params has padding");
#endif

/* Inside a kernel whose struct argument is named `params`: `const T name = params.name;` for
 * every field of the family (fields a kernel does not read cost nothing). */
#define CLATTN_UNPACK(LIST) LIST(CLATTN_PARAM_LOCAL)
/* The same for a family headed by the score operands: their fields come from params.score. */
#define CLATTN_SCORE_LOCAL(type, name) const CLATTN_T_##type name = params.score.name;
#define CLATTN_UNPACK_SCORED(LIST) CLATTN_SCORE_PARAMS(CLATTN_SCORE_LOCAL) LIST(CLATTN_PARAM_LOCAL)

/* ---- the score rule's operands (score.cl): the head of the flash and softmax structs -------
 * mask: (b, h, i, j) strides (0 broadcasts); key padding: (b, j) strides; key counts per batch
 * and ALiBi slopes per (b, h) with their presence flags; attention sinks per (h, i) (the
 * query head h of a row; i: a row of a decode group's heads, else stride 0) and their flag,
 * which a launch that leaves its row unfinished clears; the key band (see score.cl); dropout's
 * Philox key and stream base, keep threshold and scale (score.cl's SCORE_DROPOUT); user score
 * functions (score.cl's FLEX_*): the byte offsets in the flex arena of the auxiliary tensors
 * (flex_aux0..3), of the block mask (flex_bm; its (b, h, query block) strides in bytes, 1 per
 * key block) and of the tile counter (flex_count), the block mask's block sizes. The
 * buffers themselves are kernel arguments (mask, key_padding, SCORE_BUFFERS). The host fills
 * it in one place (ops.h: clattn__score_params). */
#define CLATTN_SCORE_PARAMS(X)                                                                    \
    X(ulong, mask_offset) X(ulong, mask_s0) X(ulong, mask_s1) X(ulong, mask_s2)                   \
    X(ulong, mask_s3) X(ulong, key_padding_offset) X(ulong, key_padding_s0)                       \
    X(ulong, key_padding_s1) X(ulong, kv_len_offset) X(ulong, kv_len_s0) X(long, band_diag)       \
    X(long, band_upper) X(long, band_lower) X(ulong, alibi_offset) X(ulong, alibi_s0)             \
    X(ulong, alibi_s1) X(ulong, sinks_offset) X(ulong, sinks_s0) X(ulong, sinks_s1)               \
    X(ulong, dropout_seed) X(ulong, dropout_offset) X(ulong, flex_aux0) X(ulong, flex_aux1)      \
    X(ulong, flex_aux2) X(ulong, flex_aux3) X(ulong, flex_bm) X(ulong, flex_bm_s0)                \
    X(ulong, flex_bm_s1) X(ulong, flex_bm_s2) X(ulong, flex_count) X(int, has_mask) X(int, has_key_padding) X(int, has_kv_len) X(int, band_diag_kv)              \
    X(int, has_alibi) X(uint, heads) X(uint, seq_q) X(uint, seq_k) X(float, scale)                \
    X(float, softcap) X(int, norm_relu) X(int, has_sinks) X(uint, dropout_threshold)             \
    X(float, dropout_scale) X(uint, flex_bq) X(uint, flex_bk)
CLATTN_PARAMS_STRUCT(score, CLATTN_SCORE_PARAMS)

/* ---- fused attention (flash.cl, flash_cpu.cl, flash_gpu.cl) --------------------------------
 * q, k, v, o: (b, h, row, col) strides and element offsets; lse: (b, h, row) strides; bh_base:
 * the first (batch * heads) index of this launch; keys [part_begin, part_stop) of this launch,
 * resume: a later part (continue from the lse and output of the one before); decode splits:
 * split_keys keys per split, o_split / lse_split elements between splits' partial outputs;
 * additive variant: w (1, 1, h, c) strides; a paged KV cache (KV_PAGED, score.cl's paged keys):
 * the block table's (b, block) strides from bt_offset, the pages' strides k_page / v_page (a
 * key's slot is k_s2 / v_s2 within its page; k_s0 = v_s0 = 0), page_size keys a page, pages
 * 0 .. num_pages - 1 in the pool; packed variable-length batches (VARLEN, score.cl): the
 * offsets' first elements in their buffers (cu_q_offset, cu_k_offset; unit stride) and the
 * packed totals of query rows and keys (total_q, total_k) that clamp the offsets; packed
 * queries over a paged cache (score.cl's PACKED_GRID): packed_batch, the sequences; v_scale:
 * FP8 values' per-tensor scale (1 otherwise), a factor of the output's normalisation
 * (types.cl's FLASH_V_SCALE). */
#define CLATTN_FLASH_PARAMS(X)                                                                    \
    X(ulong, q_offset) X(ulong, q_s0) X(ulong, q_s1) X(ulong, q_s2) X(ulong, q_s3)                \
    X(ulong, k_offset) X(ulong, k_s0) X(ulong, k_s1) X(ulong, k_s2) X(ulong, k_s3)                \
    X(ulong, v_offset) X(ulong, v_s0) X(ulong, v_s1) X(ulong, v_s2) X(ulong, v_s3)                \
    X(ulong, o_offset) X(ulong, o_s0) X(ulong, o_s1) X(ulong, o_s2) X(ulong, o_s3)                \
    X(ulong, lse_offset) X(ulong, lse_s0) X(ulong, lse_s1) X(ulong, lse_s2)                       \
    X(ulong, bh_base) X(ulong, o_split) X(ulong, lse_split) X(ulong, w_offset) X(ulong, w_s0)     \
    X(ulong, w_s1) X(ulong, bt_offset) X(ulong, bt_s0) X(ulong, bt_s1) X(ulong, k_page)           \
    X(ulong, v_page) X(int, has_lse) X(uint, part_begin) X(uint, part_stop) X(int, resume)        \
    X(uint, kv_group) X(uint, split_keys) X(uint, page_size) X(uint, num_pages)        \
    X(ulong, cu_q_offset) X(ulong, cu_k_offset) X(uint, total_q) X(uint, total_k)               \
    X(uint, packed_batch) X(float, v_scale) CLATTN_FLASH_STEP_PARAMS(X)
/* A KV cache's decode step in one launch (KV_STEP; clattn_kv_cache_decode): kv_step 1 attends
 * step_keys cached keys plus one new key and value read from k_new, v_new ((b, kv head, col)
 * strides kn_*, vn_*), writes them into the cache at key step_keys and sets the key counts to
 * step_keys + 1; 0: a plain launch. */
#define CLATTN_FLASH_STEP_PARAMS(X)                                                               \
    X(ulong, kn_offset) X(ulong, kn_s0) X(ulong, kn_s1) X(ulong, kn_s3) X(ulong, vn_offset)       \
    X(ulong, vn_s0) X(ulong, vn_s1) X(ulong, vn_s3) X(uint, kv_step) X(uint, step_keys)
CLATTN_SCORED_PARAMS_STRUCT(flash, CLATTN_FLASH_PARAMS)
#if defined(__OPENCL_VERSION__) || defined(__OPENCL_C_VERSION__)
/* The fused kernels' parameter list (flash.cl, flash_gpu.cl, flash_cpu.cl: one launch serves
 * each): q, k, v, out, lse, the score rule's buffers, additive attention's w, a paged
 * cache's block table, varlen's offsets (cu_seqlens_q, cu_seqlens_k: (batch + 1) I32), the
 * struct. */
#define FLASH_KERNEL_PARAMS                                                                       \
    __global const ELEM_T(Q_DTYPE) *Q, __global const ELEM_T(K_DTYPE) *K,                        \
        __global const ELEM_T(V_DTYPE) *V, __global ELEM_T(O_DTYPE) *O, __global float *lse,     \
        __global const ELEM_T(MASK_DTYPE) *mask, __global const uchar *key_padding,              \
        SCORE_BUFFERS, __global const float *score_w, __global const int *block_table,           \
        FLASH_SEQ_BUFFERS, const clattn_flash_params params
/* varlen's offsets, or (KV_STEP: no packed batches there) the decode step's new key and
 * value rows, in q's dtype */
#if defined(KV_STEP) && KV_STEP
#define FLASH_SEQ_BUFFERS                                                                         \
    __global const ELEM_T(Q_DTYPE) *k_new, __global const ELEM_T(Q_DTYPE) *v_new
#else
#define FLASH_SEQ_BUFFERS __global const int *cu_seqlens_q, __global const int *cu_seqlens_k
#endif
#endif

/* ---- score rows (softmax.cl: softmax_rows, softmax_rows_f64, score_copy) -------------------
 * raw: (b, h, i) strides of the q.k products (unit column stride); out: (b, h, i, j) strides
 * (softmax rows: unit column stride); rows: b * h * seq_q; elements: rows * seq_k (score_copy);
 * mode: score_copy's kind of score. */
#define CLATTN_SOFTMAX_PARAMS(X)                                                                  \
    X(ulong, raw_offset) X(ulong, raw_s0) X(ulong, raw_s1) X(ulong, raw_s2) X(ulong, out_offset)  \
    X(ulong, out_s0) X(ulong, out_s1) X(ulong, out_s2) X(ulong, out_s3) X(ulong, rows)           \
    X(ulong, elements) X(int, mode) X(int, softmax_pad_)
CLATTN_SCORED_PARAMS_STRUCT(softmax, CLATTN_SOFTMAX_PARAMS)

/* ---- matmul (matmul.cl: matmul, matmul_vec) ------------------------------------------------
 * C[b0, b1] = alpha op(A) op(B) + beta C + bias over batch entries batch_base + z (z: global
 * dimension 2), b1 < batch1; *_batch0/1: the operands' batch strides; b_group: b1 / b_group
 * selects B's entry; matmul_vec: b_panel (B packed in panels), stream_c. */
#define CLATTN_MATMUL_PARAMS(X)                                                                   \
    X(ulong, batch1) X(ulong, batch_base) X(ulong, a_offset) X(ulong, a_batch0)                  \
    X(ulong, a_batch1) X(ulong, lda) X(ulong, b_offset) X(ulong, b_batch0) X(ulong, b_batch1)    \
    X(ulong, ldb) X(ulong, b_panel) X(ulong, c_offset) X(ulong, c_batch0) X(ulong, c_batch1)     \
    X(ulong, ldc) X(ulong, bias_offset) X(ulong, b_group) X(uint, M) X(uint, N) X(uint, K)       \
    X(int, trans_a) X(int, trans_b) X(float, alpha) X(float, beta) X(int, has_bias)              \
    X(int, stream_c) X(uint, matmul_pad_)
CLATTN_PARAMS_STRUCT(matmul, CLATTN_MATMUL_PARAMS)
/* pack_b (matmul_vec's panels of B): rows of a panel per work-item; the host sizes the launch
 * by it (ops/matmul.c), the kernel steps by it */
#define CLATTN_MATMUL_PACK_K 64

/* ---- rotary embeddings (rope.cl) -----------------------------------------------------------
 * x, out: (b, h, s, c) strides; the cos/sin caches (cache_mode 1: (position, j), 2: (b, s, j)
 * strides c_s0..2); position ids (b, s) strides; pairs: (2j, 2j + 1) else (j, j + rot / 2). */
#define CLATTN_ROPE_PARAMS(X)                                                                     \
    X(ulong, x_offset) X(ulong, x_s0) X(ulong, x_s1) X(ulong, x_s2) X(ulong, x_s3)                \
    X(ulong, out_offset) X(ulong, out_s0) X(ulong, out_s1) X(ulong, out_s2) X(ulong, out_s3)     \
    X(ulong, cos_offset) X(ulong, sin_offset) X(ulong, c_s0) X(ulong, c_s1) X(ulong, c_s2)       \
    X(ulong, pos_offset) X(ulong, pos_s0) X(ulong, pos_s1) X(ulong, start) X(ulong, total)        \
    X(int, cache_mode) X(uint, cache_rows) X(int, has_position_ids) X(int, pairs)                \
    X(uint, heads) X(uint, seq) X(uint, dim) X(uint, rot)
CLATTN_PARAMS_STRUCT(rope, CLATTN_ROPE_PARAMS)

/* ---- positional encodings (posenc.cl) ------------------------------------------------------
 * x, out: (a, b, p, i) strides; table: (position, i) strides; the box d0 x d1 x seq x dim. */
#define CLATTN_POSENC_PARAMS(X)                                                                   \
    X(ulong, x_offset) X(ulong, x_s0) X(ulong, x_s1) X(ulong, x_s2) X(ulong, x_s3)                \
    X(ulong, out_offset) X(ulong, out_s0) X(ulong, out_s1) X(ulong, out_s2) X(ulong, out_s3)     \
    X(ulong, table_offset) X(ulong, table_s0) X(ulong, table_s1) X(ulong, start)                 \
    X(ulong, total) X(int, has_x) X(int, has_table) X(uint, d0) X(uint, d1) X(uint, seq)         \
    X(uint, dim)
CLATTN_PARAMS_STRUCT(posenc, CLATTN_POSENC_PARAMS)

/* ---- additive scores (additive.cl) ---------------------------------------------------------
 * p1, p2, raw: (b, h, row) strides (unit column stride); w: (h, c) strides. */
#define CLATTN_ADDITIVE_PARAMS(X)                                                                 \
    X(ulong, p1_offset) X(ulong, p1_s0) X(ulong, p1_s1) X(ulong, p1_s2) X(ulong, p2_offset)      \
    X(ulong, p2_s0) X(ulong, p2_s1) X(ulong, p2_s2) X(ulong, w_offset) X(ulong, w_s0)            \
    X(ulong, w_s1) X(ulong, raw_offset) X(ulong, raw_s0) X(ulong, raw_s1) X(ulong, raw_s2)       \
    X(uint, heads) X(uint, seq_q) X(uint, seq_k) X(uint, dim)
CLATTN_PARAMS_STRUCT(additive, CLATTN_ADDITIVE_PARAMS)

/* ---- decode-split merge (heads.cl's flash_merge) -------------------------------------------
 * splits partial outputs and lse (packed float32 at o_parts_at / lse_parts_at of the scratch)
 * into O ((b, h, row, col) strides) and lse ((b, h, row) strides, when has_lse); the attention
 * sinks (h, row) strides, when has_sinks (the splits leave them to the merge). */
#define CLATTN_MERGE_PARAMS(X)                                                                    \
    X(ulong, rows) X(ulong, o_offset) X(ulong, o_s0) X(ulong, o_s1) X(ulong, o_s2)               \
    X(ulong, o_s3) X(ulong, lse_offset) X(ulong, lse_s0) X(ulong, lse_s1) X(ulong, lse_s2)       \
    X(ulong, o_parts_at) X(ulong, lse_parts_at) X(ulong, sinks_offset) X(ulong, sinks_s0)        \
    X(ulong, sinks_s1) X(uint, splits) X(uint, dv) X(int, has_lse) X(uint, heads) X(uint, seq_q) \
    X(int, has_sinks)
CLATTN_PARAMS_STRUCT(merge, CLATTN_MERGE_PARAMS)

/* ---- the KV cache's append (heads.cl's kv_append) ------------------------------------------
 * the new keys and values (ks, vs: (b, h, j, c) strides) into the cache's buffers (kd, vd)
 * over the boxes (d0, d1, d2, k_d3) and (d0, d1, d2, v_d3); the key counts lengths[0 .. d0)
 * set to `length`. Paged (APPEND_PAGED): kd_s0 / vd_s0 are page strides, _s2 slot strides;
 * key start + j of batch b lies in page table[b * bt_s0 + (start + j) / page_size]; an FP8
 * cache stores k * k_inv_scale and v * v_inv_scale (1 / its per-tensor scales). */
#define CLATTN_APPEND_PARAMS(X)                                                                   \
    X(ulong, ks_offset) X(ulong, ks_s0) X(ulong, ks_s1) X(ulong, ks_s2) X(ulong, ks_s3)           \
    X(ulong, vs_offset) X(ulong, vs_s0) X(ulong, vs_s1) X(ulong, vs_s2) X(ulong, vs_s3)           \
    X(ulong, kd_offset) X(ulong, kd_s0) X(ulong, kd_s1) X(ulong, kd_s2) X(ulong, kd_s3)           \
    X(ulong, vd_offset) X(ulong, vd_s0) X(ulong, vd_s1) X(ulong, vd_s2) X(ulong, vd_s3)           \
    X(uint, d0) X(uint, d1) X(uint, d2) X(uint, k_d3) X(uint, v_d3) X(int, length)               \
    X(ulong, bt_s0) X(uint, page_size) X(uint, num_pages) X(uint, start) X(uint, append_pad)     \
    X(float, k_inv_scale) X(float, v_inv_scale)
CLATTN_PARAMS_STRUCT(append, CLATTN_APPEND_PARAMS)

/* ---- speculative decoding's commit (commit.cl) ----------------------------------------------
 * table (paged: (batch, blocks) I32, bt_s0 its row stride), accepted (batch, max_accepted) and
 * lengths (batch) I32: element offsets and strides; the caches k and v: BYTE offsets and the
 * byte strides of (page, slot, head) for pools, else (batch, head, key); k_row / v_row: bytes
 * of a row (v_row 0: no value cache); capacity: keys a sequence holds; draft_len: the drafts
 * written after each sequence's keys. */
#define CLATTN_COMMIT_PARAMS(X)                                                                   \
    X(ulong, bt_offset) X(ulong, bt_s0) X(ulong, capacity) X(ulong, acc_offset) X(ulong, acc_s0) \
    X(ulong, acc_s1) X(ulong, len_offset) X(ulong, len_s0) X(ulong, k_offset) X(ulong, k_s0)      \
    X(ulong, k_s1) X(ulong, k_s2) X(ulong, v_offset) X(ulong, v_s0) X(ulong, v_s1) X(ulong, v_s2) \
    X(uint, page_size) X(uint, num_pages) X(uint, max_accepted) X(uint, draft_len) X(uint, k_row) \
    X(uint, v_row) X(uint, batch) X(uint, commit_pad)
CLATTN_PARAMS_STRUCT(commit, CLATTN_COMMIT_PARAMS)

/* ---- copy4d into FP8 (heads.cl; clattn_quantize_scaled) ------------------------------------
 * src, dst: (i0, i1, i2, i3) strides and element offsets; the box (d1, d2, d3; total
 * elements); inv_scale: 1 / the destination's per-tensor scale. */
#define CLATTN_COPY_FP8_PARAMS(X)                                                                 \
    X(ulong, src_offset) X(ulong, src_s0) X(ulong, src_s1) X(ulong, src_s2) X(ulong, src_s3)     \
    X(ulong, dst_offset) X(ulong, dst_s0) X(ulong, dst_s1) X(ulong, dst_s2) X(ulong, dst_s3)     \
    X(ulong, total) X(uint, d1) X(uint, d2) X(uint, d3) X(float, inv_scale)
CLATTN_PARAMS_STRUCT(copy_fp8, CLATTN_COPY_FP8_PARAMS)


/* ---- attention backward (flash_bwd.cl) -----------------------------------------------------
 * q, k, v, o, go (the output's gradient dO), dq, dk, dv: (b, h, row, col) strides and element
 * offsets; lse: (b, h, row) strides; the F32 scratch holds delta (dO . O per row, packed
 * (b, h, row) at delta_at), the float mask's gradient dS (packed (b, h, i, j) at dmask_at,
 * when has_dmask) and the parts' partial sums (packed (b, h, row, col), part_stride apart from
 * part_at, when to_scratch; bwd_dkdv's dV partials dv_part_at after its dK ones; with
 * dq_slots > 0, bwd_dkdv_cpu's dQ sums, one slot per work-group of a (batch, k/v head), packed
 * (b, h, row, col) dq_slot_stride apart from dq_slots_at); bh_base: the first (batch * heads) index
 * of this launch (of
 * batch * kv_heads for bwd_dkdv); rows [part_begin, part_stop) (bwd_dkdv) or keys (bwd_dq) of
 * this launch, which is part `part`; kv_group: query heads per k/v head; packed variable-length
 * batches (VARLEN, score.cl): the offsets' first elements (cu_q_offset, cu_k_offset) and the
 * packed totals (total_q, total_k), as the flash family's; delta, the parts' and the slots'
 * rows are then at their packed index per head ((h, packed row) instead of (b, h, row); dK/dV
 * parts (g, packed key)). The unfused path's
 * bwd_unfused_rows: the weights P at p_at and dP = dO V^T at dp_at, packed (b, h, i, j); the
 * raw scores q . k at dmask_at (dS written over them). */
#define CLATTN_FLASH_BWD_PARAMS(X)                                                                \
    X(ulong, q_offset) X(ulong, q_s0) X(ulong, q_s1) X(ulong, q_s2) X(ulong, q_s3)                \
    X(ulong, k_offset) X(ulong, k_s0) X(ulong, k_s1) X(ulong, k_s2) X(ulong, k_s3)                \
    X(ulong, v_offset) X(ulong, v_s0) X(ulong, v_s1) X(ulong, v_s2) X(ulong, v_s3)                \
    X(ulong, o_offset) X(ulong, o_s0) X(ulong, o_s1) X(ulong, o_s2) X(ulong, o_s3)                \
    X(ulong, go_offset) X(ulong, go_s0) X(ulong, go_s1) X(ulong, go_s2) X(ulong, go_s3)           \
    X(ulong, dq_offset) X(ulong, dq_s0) X(ulong, dq_s1) X(ulong, dq_s2) X(ulong, dq_s3)           \
    X(ulong, dk_offset) X(ulong, dk_s0) X(ulong, dk_s1) X(ulong, dk_s2) X(ulong, dk_s3)           \
    X(ulong, dv_offset) X(ulong, dv_s0) X(ulong, dv_s1) X(ulong, dv_s2) X(ulong, dv_s3)           \
    X(ulong, lse_offset) X(ulong, lse_s0) X(ulong, lse_s1) X(ulong, lse_s2) X(ulong, bh_base)     \
    X(ulong, delta_at) X(ulong, dmask_at) X(ulong, part_at) X(ulong, part_stride)                 \
    X(ulong, dv_part_at) X(ulong, dq_slots_at) X(ulong, dq_slot_stride)                          \
    X(ulong, p_at) X(ulong, dp_at) X(ulong, cu_q_offset) X(ulong, cu_k_offset)                   \
    X(uint, kv_group) X(uint, part_begin) X(uint, part_stop) X(uint, part) X(int, to_scratch)     \
    X(int, has_dmask) X(uint, dq_slots) X(uint, bwd_pad_) X(uint, total_q) X(uint, total_k)
CLATTN_SCORED_PARAMS_STRUCT(flash_bwd, CLATTN_FLASH_BWD_PARAMS)

/* ---- block masks from a mask_mod (flex.cl: flex_block_mask) ------------------------------
 * out: the mask's first byte in its buffer; aux0..3: the auxiliary tensors' byte offsets in
 * the arena; the problem's sizes, the block sizes and the blocks per row and column. */
#define CLATTN_BLOCK_MASK_PARAMS(X)                                                               \
    X(ulong, out_offset) X(ulong, aux0) X(ulong, aux1) X(ulong, aux2) X(ulong, aux3)             \
    X(uint, batch) X(uint, heads) X(uint, seq_q) X(uint, seq_k) X(uint, block_q)                 \
    X(uint, block_k) X(uint, q_blocks) X(uint, k_blocks)
CLATTN_PARAMS_STRUCT(block_mask, CLATTN_BLOCK_MASK_PARAMS)

/* ---- attention backward's reductions (flash_bwd.cl: bwd_sum_parts, bwd_mask_reduce,
 * bwd_sinks) ---------------------------------------------------------------------------------
 * out: a (d0, d1, d2, d3) view (offset, strides) of the reduced result; the F32 scratch from
 * in_at: bwd_sum_parts adds `parts` packed (d0, d1, d2, d3) partial sums in_stride apart;
 * bwd_mask_reduce sums the packed (n0, n1, n2, n3) gradient over the dims where d is 1 and n
 * is not (a broadcast mask's); bwd_sinks: out (heads) and the sinks (offset, s0), lse (b, h,
 * row) strides, delta at in_at, n0 batches, n1 heads, n2 rows. */
#define CLATTN_BWD_REDUCE_PARAMS(X)                                                               \
    X(ulong, out_offset) X(ulong, out_s0) X(ulong, out_s1) X(ulong, out_s2) X(ulong, out_s3)     \
    X(ulong, in_at) X(ulong, in_stride) X(ulong, aux_offset) X(ulong, aux_s0) X(ulong, aux_s1)   \
    X(ulong, aux_s2) X(ulong, total) X(uint, d0) X(uint, d1) X(uint, d2) X(uint, d3) X(uint, n0)  \
    X(uint, n1) X(uint, n2) X(uint, n3) X(uint, parts) X(uint, row_items)
CLATTN_PARAMS_STRUCT(bwd_reduce, CLATTN_BWD_REDUCE_PARAMS)

/* ---- attention states merged by their log-sum-exp (merge.cl's merge_states) ----------------
 * o_a, o_b, o: (i0, i1, i2, col) strides; lse_a, lse_b, lse: (i0, i1, i2) strides; d0 x d1 x
 * d2 rows of dv columns; has_lse: lse is written. */
#define CLATTN_MERGE_STATES_PARAMS(X)                                                             \
    X(ulong, oa_offset) X(ulong, oa_s0) X(ulong, oa_s1) X(ulong, oa_s2) X(ulong, oa_s3)           \
    X(ulong, ob_offset) X(ulong, ob_s0) X(ulong, ob_s1) X(ulong, ob_s2) X(ulong, ob_s3)           \
    X(ulong, o_offset) X(ulong, o_s0) X(ulong, o_s1) X(ulong, o_s2) X(ulong, o_s3)                \
    X(ulong, la_offset) X(ulong, la_s0) X(ulong, la_s1) X(ulong, la_s2) X(ulong, lb_offset)       \
    X(ulong, lb_s0) X(ulong, lb_s1) X(ulong, lb_s2) X(ulong, l_offset) X(ulong, l_s0)             \
    X(ulong, l_s1) X(ulong, l_s2) X(uint, d0) X(uint, d1) X(uint, d2) X(uint, dv) X(int, has_lse) \
    X(int, merge_pad_)
CLATTN_PARAMS_STRUCT(merge_states, CLATTN_MERGE_STATES_PARAMS)

#endif
