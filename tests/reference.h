/*
 * float64 CPU reference of every clattn operation (tests only).
 *
 * Inputs are the float arrays that were uploaded; all arithmetic is in double. Shapes and
 * conventions are exactly those documented in clattn.h; pointers are already advanced to the
 * tensor's offset.
 */
#ifndef CLATTN_REFERENCE_H
#define CLATTN_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "clattn.h"

/* The stored row strides clattn_matmul uses (ld 0 = packed). */
size_t ref_matmul_lda(const clattn_matmul_desc *desc);
size_t ref_matmul_ldb(const clattn_matmul_desc *desc);
size_t ref_matmul_ldc(const clattn_matmul_desc *desc);

/* Elements a buffer needs past the tensor's offset: (batch-1)*stride + (rows-1)*ld + cols,
 * with the stride counted only when batch > 1. */
size_t ref_matmul_extent_a(const clattn_matmul_desc *desc);
size_t ref_matmul_extent_b(const clattn_matmul_desc *desc);
size_t ref_matmul_extent_c(const clattn_matmul_desc *desc);

/* C[b] = alpha * op(A[b]) op(B[b]) + beta * C[b] + bias. c holds the prior contents of the C
 * buffer (read only when beta != 0) and receives the result; elements between rows (ldc > n)
 * are left as they are. bias may be NULL. */
void ref_matmul(const clattn_matmul_desc *desc, const float *a, const float *b, const float *bias,
                double *c);

/* out = normalise(scale * scores + masks) over packed (batch, heads, seq_q, seq_k) rows.
 * masks may be NULL; desc->masks' cl_mem fields are ignored. */
void ref_softmax_rows(const clattn_softmax_desc *desc, const clattn_host_masks *masks,
                      const float *scores, double *out);

/* (batch, seq, row_stride) -> packed (batch, heads, seq, head_dim), and the inverse. Concat
 * writes only the heads*head_dim columns of each row of dst. */
void ref_split_heads(const clattn_heads_desc *desc, const float *src, double *dst);
void ref_concat_heads(const clattn_heads_desc *desc, const float *src, double *dst);

/* O = normalise(scale * Q Kᵀ + masks) V; weights (batch, heads, seq_q, seq_k) may be NULL. */
void ref_attention(const clattn_attention_desc *desc, const clattn_host_masks *masks,
                   const float *q, const float *k, const float *v, double *out, double *weights);

/* Multi-head attention forward with the semantics of clattn_mha_forward_host: key NULL means
 * the query, value NULL the key. attn_weights receives what desc->need_weights selects (may be NULL for
 * NONE). out has (batch, seq_q, embed_dim) elements with an out weight, else (.., v_dim). */
void ref_mha_forward(const clattn_mha_desc *desc, const clattn_mha_host_weights *weights,
                     const float *query, const float *key, const float *value,
                     const clattn_host_masks *masks, double *out, double *attn_weights);

/* Resolved widths of an MHA description (0 = embed_dim). */
size_t ref_mha_kdim(const clattn_mha_desc *desc);
size_t ref_mha_vdim(const clattn_mha_desc *desc);
size_t ref_mha_qk_dim(const clattn_mha_desc *desc);
size_t ref_mha_v_dim(const clattn_mha_desc *desc);
/* Width of each output row: embed_dim with an out weight, v_dim without. */
size_t ref_mha_out_dim(const clattn_mha_desc *desc, int has_out_weight);

#endif /* CLATTN_REFERENCE_H */
