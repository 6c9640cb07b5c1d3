/*
 * float64 CPU reference of every clattn operation (tests only).
 *
 * Every input is a LOGICAL PACKED float array (row-major over the tensor's dims, no gaps, no
 * offset), holding the values as the device stores them (already rounded to F16/BF16 where the
 * device tensor has that dtype: see pb_round_array in problems.h). Layouts (strides, offsets,
 * dtypes) are the business of problems.c, which converts between device tensors and these
 * arrays. All arithmetic is in double. Shapes and conventions are those of clattn.h.
 * Nothing here needs an OpenCL device, check, or testutil: bench/soak.c links it alone.
 */
#ifndef CLATTN_REFERENCE_H
#define CLATTN_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "clattn.h"

/* --- matmul -------------------------------------------------------------------------------- */

/* C[b] = alpha * op(A[b]) op(B[b]) + beta * C[b] + bias, for the b of C's up to two leading
 * (batch) dims. Zero dims count as 1. */
typedef struct ref_matmul_shape {
    size_t batch[2];   /* C's leading dims (C holds batch[0] * batch[1] matrices) */
    size_t a_batch[2]; /* A's leading dims: each 1 (one matrix repeated) or equal to C's */
    size_t b_batch[2]; /* B's likewise */
    size_t m, n, k;
    int trans_a, trans_b; /* A stored m x k (k x m when trans_a); B k x n (n x k when trans_b) */
    float alpha, beta;
} ref_matmul_shape;

/* a, b: packed matrices of A's / B's batch (each stored as the trans flags say); c: packed
 * (batch..., m, n), holding C's prior contents (read only when beta != 0) and receiving the
 * result; bias: n floats or NULL. */
void ref_matmul(const ref_matmul_shape *shape, const float *a, const float *b, const float *bias,
                double *c);

/* --- scaled dot-product attention ---------------------------------------------------------- */

/* scale as clattn_sdpa_desc gives it (NAN: 1/sqrt(head_dim_qk)) resolved to the value used. */
double ref_resolve_scale(float scale, size_t head_dim_qk);

typedef struct ref_sdpa_shape {
    size_t batch, heads, seq_q, seq_k, dk, dv;
    double scale; /* resolved (never NAN): see ref_resolve_scale */
    clattn_norm norm;
    clattn_causal causal; /* TOP_LEFT: key j <= query i; BOTTOM_RIGHT: j <= i + n - seq_q (n:
                           * kv_len[b] or seq_k); ONNX: j <= i + past, or kv_len[b] - seq_q */
    size_t kv_heads;      /* heads of k and v (0: heads); query head h reads k/v head
                           * h / (heads / kv_heads) (grouped-query attention) */
    double softcap;       /* 0: off; else s = softcap * tanh(s / softcap) before the mask */
    /* ONNX Attention's key rules (clattn_sdpa_desc): kv_len (batch values or NULL): batch b
     * has keys 0 .. kv_len[b] - 1; has_past/past: the first `past` keys came from a KV cache
     * (ONNX's causal offset); window_align (NONE: no window), window_left/window_right (< 0:
     * unbounded): query i sees keys p - left <= j <= p + right, p = i + the offset. */
    const int32_t *kv_len;
    int has_past;
    size_t past;
    clattn_causal window_align;
    long long window_left, window_right;
    /* ALiBi: (batch, heads) slopes m, or NULL: the score of key j in query i gains
     * -m * |i + n - seq_q - j| (n: kv_len[b] or seq_k), with the mask (after the cap). */
    const float *alibi;
    long long diag_offset; /* OFFSET alignment (causal or window): query i sits at key
                            * position i + diag_offset */
    /* Attention sinks: (heads) logits, or NULL: softmax rows of head h take exp(sinks[h] - m)
     * into their denominator (m: the max over the kept scores and the sink); -INFINITY is no
     * sink. A row with no kept key: zero weights, lse = the sink. */
    const float *sinks;
    /* Dropout (clattn_sdpa_desc.dropout_p): 0 off; else each weight w of (b, h, i, j) becomes
     * w * ref_dropout_factor(...) after normalisation (lse unchanged). */
    double dropout_p;
    uint64_t dropout_seed, dropout_offset;
} ref_sdpa_shape;

/* Softmax attention of these sizes at the default scale (1/sqrt(dk)) with every other rule off
 * (no causal mask, kv_heads = heads): the shape tests then set their features' fields on. */
ref_sdpa_shape ref_softmax_shape(size_t batch, size_t heads, size_t seq_q, size_t seq_k, size_t dk,
                                 size_t dv);

/* Philox 4x32-10 (Salmon et al., SC 2011): the block of counter ctr under key (key[0], key[1])
 * into out, written from the paper's definition (tests check it against Random123's known
 * answers). */
void ref_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* Dropout's factor of weight (b, h, i, j) of a shape with dropout_p > 0: 1 / (1 - p) where
 * kept, 0 where dropped (p = 1: 0), by clattn_sdpa_desc's rule (word j % 4 of the block with
 * counter (j / 4, i, stream) and key seed, stream = offset + b * heads + h, kept when at
 * least floor(p * 2^32)). */
double ref_dropout_factor(const ref_sdpa_shape *shape, size_t b, size_t h, size_t i, size_t j);

/* Per (batch, head): s = cap(scale * q kᵀ) + mask (cap: softcap); keys masked by the causal rule, by key_padding
 * (nonzero = ignore) or by a -inf score drop out; out = normalise(s) v.
 *   q (B, H, Lq, dk), k (B, Hkv, Lk, dk), v (B, Hkv, Lk, dv): packed logical floats
 *   (Hkv = shape->kv_heads, or H when 0).
 *   mask: the EXPANDED additive mask (B, H, Lq, Lk) (-INFINITY = masked; boolean masks become
 *         0 / -INFINITY; pb_expand_mask builds it from any broadcast shape), or NULL.
 *   key_padding: (B, Lk) bytes, nonzero = ignore the key, or NULL.
 * Outputs (each may be NULL): out (B, H, Lq, dv); weights (B, H, Lq, Lk), the normalised
 * scores (a row with no kept key, or relu with no positive score: all zeros); lse (B, H, Lq):
 * softmax: the log-sum-exp of the row's kept scaled+masked scores, -INFINITY when none is
 * kept; relu: the log of the row's normaliser (-INFINITY when it is 0). */
void ref_sdpa(const ref_sdpa_shape *shape, const float *q, const float *k, const float *v,
              const float *mask, const uint8_t *key_padding, double *out, double *weights,
              double *lse);

/* Rotary embeddings on SDPA's inputs (clattn_sdpa_desc.rope), in double before the scores:
 * q's row i at position start + i, k's row j at start + j - past (the new keys; with
 * shape->has_past the first `past` keys of k are rotated already and stay as given). */
typedef struct ref_rope_spec {
    int pairs;    /* CLATTN_ROPE_PAIRS; else halves */
    size_t dims;  /* 0: dk */
    size_t start; /* the position of q's row 0 and of the first new key */
    double base;  /* 0: 10000 */
} ref_rope_spec;

/* ref_sdpa on q and k turned by `rope` first (NULL: ref_sdpa itself). */
void ref_sdpa_rope(const ref_sdpa_shape *shape, const ref_rope_spec *rope, const float *q,
                   const float *k, const float *v, const float *mask, const uint8_t *key_padding,
                   double *out, double *weights, double *lse);

/* The scores before normalisation (clattn_scores): mode 0 scale * q.k, 1 soft-capped, 2 also
 * ALiBi and the mask added and -INFINITY where a key rule or key_padding drops the key. Same inputs
 * as ref_sdpa; scores (B, H, Lq, Lk). */
void ref_sdpa_scores(const ref_sdpa_shape *shape, const float *q, const float *k, const float *mask,
                     const uint8_t *key_padding, int mode, double *scores);

/* The backward of ref_sdpa: the gradients of L = sum(grad_out * out) by q (B, H, Lq, dk), k
 * (B, Hkv, Lk, dk; summed over each k/v head's query heads), v (B, Hkv, Lk, dv), by the scores
 * s (dscores (B, H, Lq, Lk): a float mask's gradient before any broadcast sum; 0 where a key
 * is dropped) and by the sinks (dsinks (H)), in double. Same inputs as ref_sdpa plus
 * grad_out (B, H, Lq, dv) and, when not NULL, out_given (B, H, Lq, dv): the forward's output as
 * stored, which delta = dO . out then uses (as the backward does: where one key takes a whole
 * row its true gradient is 0, the stored out's rounding is not); each output may be NULL. Softmax: dS = w (dO . v_j - dO . out);
 * relu: [s > 0] (dO . v_j - dO . out) / normaliser; through the cap: dS (1 - tanh^2).
 * magnitudes 1: every term's magnitude summed instead (|dO . v_j| + |dO . out| for their
 * difference, |x| for every factor x): the scale of each gradient's rounding error (relu's
 * 1 / normaliser amplifies it; a broadcast mask's and a sink's sums cancel). */
void ref_sdpa_backward(const ref_sdpa_shape *shape, const float *q, const float *k, const float *v,
                       const float *mask, const uint8_t *key_padding, const float *grad_out,
                       const float *out_given, int magnitudes, double *dq, double *dk,
                       double *dv, double *dscores, double *dsinks);

/* --- positional encodings ------------------------------------------------------------------ */

/* The sinusoidal table of Attention Is All You Need for positions start .. start + seq - 1:
 * table[p * dim + 2k] = sin(pos * base^(-2k / dim)), table[p * dim + 2k + 1] = cos(...), in
 * double. */
void ref_posenc_sinusoid(size_t start, size_t seq, size_t dim, double base, double *table);

/* RoPE on x (batch, heads, seq, dim), packed: row (b, h, s) has pair j < rot / 2 ((2j, 2j + 1)
 * with pairs, else (j, j + rot / 2)) turned by the angle whose cos and sin are
 * cosv[(b * seq + s) * rot / 2 + j], sinv[...]; columns past rot copied. */
void ref_rope(size_t batch, size_t heads, size_t seq, size_t dim, size_t rot, int pairs,
              const float *x, const double *cosv, const double *sinv, double *out);

/* RoPE in place on `blocks` blocks of (seq, dim) doubles, angles computed in double
 * (t_j = pos * base^(-2j / rot)): rows first .. seq - 1 of each block at positions start,
 * start + 1, ...; the rows before `first` (a KV cache's past keys) are left as they are. */
void ref_rope_rows(double *x, size_t blocks, size_t seq, size_t first, size_t dim, size_t rot,
                   int pairs, size_t start, double base);

/* --- multi-head attention ------------------------------------------------------------------ */

/* Multi-head attention forward with the semantics of clattn_mha_forward_host: query (batch,
 * seq_q, embed_dim), key (batch, seq_k, kdim) or NULL (= query), value (batch, seq_k, vdim) or
 * NULL (= key); weights as clattn_mha_host_weights (in_proj_weight packs q, k, v in PyTorch's
 * order); causal, scale (NAN: 1/sqrt(qk_dim / num_heads)), norm and need_weights from desc;
 * masks->attn_mask (seq_q, seq_k) additive floats, masks->key_padding_mask (batch, seq_k)
 * bytes, masks->alibi_slopes (heads); masks may be NULL; softcap and the window from desc. out:
 * (batch, seq_q, ref_mha_out_dim). attn_weights receives what desc->need_weights selects ((batch,
 * heads, seq_q, seq_k) or the head mean (batch, seq_q, seq_k)); may be NULL. */
void ref_mha_forward(const clattn_mha_host_desc *desc, const clattn_mha_host_weights *weights,
                     const float *query, const float *key, const float *value,
                     const clattn_host_masks *masks, double *out, double *attn_weights);

/* Resolved widths of an MHA description (0 = embed_dim). */
size_t ref_mha_kdim(const clattn_mha_host_desc *desc);
size_t ref_mha_vdim(const clattn_mha_host_desc *desc);
size_t ref_mha_qk_dim(const clattn_mha_host_desc *desc);
size_t ref_mha_v_dim(const clattn_mha_host_desc *desc);
/* Width of each output row: embed_dim with an out weight, v_dim without. */
size_t ref_mha_out_dim(const clattn_mha_host_desc *desc, int has_out_weight);

/* --- additive attention -------------------------------------------------------------------- */

typedef struct ref_additive_shape {
    size_t batch, heads, seq_q, seq_k, dq, dk, dv, da;
    clattn_norm norm;
    clattn_causal causal; /* NONE, TOP_LEFT or BOTTOM_RIGHT (ref_sdpa_shape's rules) */
} ref_additive_shape;

/* Additive attention (clattn_additive_desc): q (B, Lq, dq), k (B, Lk, dk), v (B, Lk, dv);
 * w1 (H, dq, da), w2 (H, dk, da), b1, b2 (H, da) or NULL, w (H, da); mask and key_padding as
 * ref_sdpa's over (B, H, Lq, Lk). out (B, Lq, dv): head h's weights times v's columns
 * h * dv / H ..; weights (B, H, Lq, Lk). Either output may be NULL. */
void ref_additive(const ref_additive_shape *shape, const float *q, const float *k, const float *v,
                  const float *w1, const float *b1, const float *w2, const float *b2,
                  const float *w, const float *mask, const uint8_t *key_padding, double *out,
                  double *weights);

/* llama.cpp's reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref) on `rows`
 * rows of n floats (n a multiple of 32) into packed blocks (34 / 18 bytes per 32 values), and
 * back: ref_dequantize gives the values the blocks stand for. dtype: CLATTN_DTYPE_Q8_0 or
 * CLATTN_DTYPE_Q4_0. ref_quantized_bytes: the bytes of `count` elements. */
size_t ref_quantized_bytes(clattn_dtype dtype, size_t count);
void ref_quantize(clattn_dtype dtype, const float *x, size_t count, uint8_t *blocks);
void ref_dequantize(clattn_dtype dtype, const uint8_t *blocks, size_t count, float *x);

#endif /* CLATTN_REFERENCE_H */
