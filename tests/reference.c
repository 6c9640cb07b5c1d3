#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The reference allocates little and a failure here is a broken test machine. */
static void *ref_alloc(size_t count, size_t size)
{
    void *memory = calloc(count ? count : 1, size);
    if (memory == NULL) {
        abort();
    }
    return memory;
}

/* --- matmul ------------------------------------------------------------------------------- */

static size_t matmul_batch(const clattn_matmul_desc *desc)
{
    return desc->batch ? desc->batch : 1;
}

size_t ref_matmul_lda(const clattn_matmul_desc *desc)
{
    return desc->lda ? desc->lda : (desc->trans_a ? desc->m : desc->k);
}

size_t ref_matmul_ldb(const clattn_matmul_desc *desc)
{
    return desc->ldb ? desc->ldb : (desc->trans_b ? desc->k : desc->n);
}

size_t ref_matmul_ldc(const clattn_matmul_desc *desc)
{
    return desc->ldc ? desc->ldc : desc->n;
}

static size_t matrix_extent(size_t batch, size_t stride, size_t rows, size_t cols, size_t ld)
{
    return (batch > 1 ? (batch - 1) * stride : 0) + (rows - 1) * ld + cols;
}

size_t ref_matmul_extent_a(const clattn_matmul_desc *desc)
{
    size_t rows = desc->trans_a ? desc->k : desc->m;
    size_t cols = desc->trans_a ? desc->m : desc->k;
    return matrix_extent(matmul_batch(desc), desc->stride_a, rows, cols, ref_matmul_lda(desc));
}

size_t ref_matmul_extent_b(const clattn_matmul_desc *desc)
{
    size_t rows = desc->trans_b ? desc->n : desc->k;
    size_t cols = desc->trans_b ? desc->k : desc->n;
    return matrix_extent(matmul_batch(desc), desc->stride_b, rows, cols, ref_matmul_ldb(desc));
}

size_t ref_matmul_extent_c(const clattn_matmul_desc *desc)
{
    return matrix_extent(matmul_batch(desc), desc->stride_c, desc->m, desc->n,
                         ref_matmul_ldc(desc));
}

void ref_matmul(const clattn_matmul_desc *desc, const float *a, const float *b, const float *bias,
                double *c)
{
    size_t batch = matmul_batch(desc);
    size_t lda = ref_matmul_lda(desc), ldb = ref_matmul_ldb(desc), ldc = ref_matmul_ldc(desc);
    for (size_t entry = 0; entry < batch; ++entry) {
        const float *a_entry = a + (batch > 1 ? entry * desc->stride_a : 0);
        const float *b_entry = b + (batch > 1 ? entry * desc->stride_b : 0);
        double *c_entry = c + (batch > 1 ? entry * desc->stride_c : 0);
        for (size_t row = 0; row < desc->m; ++row) {
            for (size_t col = 0; col < desc->n; ++col) {
                double sum = 0.0;
                for (size_t inner = 0; inner < desc->k; ++inner) {
                    double a_value =
                        desc->trans_a ? a_entry[inner * lda + row] : a_entry[row * lda + inner];
                    double b_value =
                        desc->trans_b ? b_entry[col * ldb + inner] : b_entry[inner * ldb + col];
                    sum += a_value * b_value;
                }
                double result = (double)desc->alpha * sum;
                if (desc->beta != 0.0f) {
                    result += (double)desc->beta * c_entry[row * ldc + col];
                }
                if (bias != NULL) {
                    result += bias[col];
                }
                c_entry[row * ldc + col] = result;
            }
        }
    }
}

/* --- normalisation of score rows ---------------------------------------------------------- */

/* row[j] = scale * score + additive mask on entry; keep[j] is cleared for masked keys. */
static void mask_row(const clattn_host_masks *masks, size_t batch_index, size_t query_index,
                     size_t seq_k, double *row, unsigned char *keep)
{
    for (size_t key = 0; key < seq_k; ++key) {
        keep[key] = 1;
        if (masks == NULL) {
            continue;
        }
        if (masks->causal && key > query_index) {
            keep[key] = 0;
        }
        if (masks->key_padding_mask != NULL && masks->key_padding_mask[batch_index * seq_k + key]) {
            keep[key] = 0;
        }
        if (masks->attn_mask != NULL) {
            row[key] += masks->attn_mask[query_index * seq_k + key];
        }
        if (row[key] == -INFINITY) {
            keep[key] = 0;
        }
    }
}

static void normalise_row(double *row, const unsigned char *keep, size_t seq_k, clattn_norm norm)
{
    double sum = 0.0;
    if (norm == CLATTN_NORM_RELU) {
        for (size_t key = 0; key < seq_k; ++key) {
            row[key] = keep[key] && row[key] > 0.0 ? row[key] : 0.0;
            sum += row[key];
        }
    } else {
        int any_kept = 0;
        double max = -INFINITY;
        for (size_t key = 0; key < seq_k; ++key) {
            if (keep[key]) {
                any_kept = 1;
                max = row[key] > max ? row[key] : max;
            }
        }
        for (size_t key = 0; key < seq_k; ++key) {
            row[key] = any_kept && keep[key] ? exp(row[key] - max) : 0.0;
            sum += row[key];
        }
    }
    for (size_t key = 0; key < seq_k; ++key) {
        row[key] = sum > 0.0 ? row[key] / sum : 0.0;
    }
}

void ref_softmax_rows(const clattn_softmax_desc *desc, const clattn_host_masks *masks,
                      const float *scores, double *out)
{
    double scale = desc->scale != 0.0f ? (double)desc->scale : 1.0;
    unsigned char *keep = ref_alloc(desc->seq_k, 1);
    for (size_t batch_index = 0; batch_index < desc->batch; ++batch_index) {
        for (size_t head = 0; head < desc->heads; ++head) {
            for (size_t query = 0; query < desc->seq_q; ++query) {
                size_t row_start =
                    ((batch_index * desc->heads + head) * desc->seq_q + query) * desc->seq_k;
                double *row = out + row_start;
                for (size_t key = 0; key < desc->seq_k; ++key) {
                    row[key] = scale * (double)scores[row_start + key];
                }
                mask_row(masks, batch_index, query, desc->seq_k, row, keep);
                normalise_row(row, keep, desc->seq_k, desc->norm);
            }
        }
    }
    free(keep);
}

/* --- heads -------------------------------------------------------------------------------- */

static size_t heads_row_stride(const clattn_heads_desc *desc)
{
    return desc->row_stride ? desc->row_stride : desc->heads * desc->head_dim;
}

void ref_split_heads(const clattn_heads_desc *desc, const float *src, double *dst)
{
    size_t row_stride = heads_row_stride(desc);
    for (size_t b = 0; b < desc->batch; ++b) {
        for (size_t h = 0; h < desc->heads; ++h) {
            for (size_t pos = 0; pos < desc->seq; ++pos) {
                for (size_t x = 0; x < desc->head_dim; ++x) {
                    size_t from = (b * desc->seq + pos) * row_stride + h * desc->head_dim + x;
                    size_t to = ((b * desc->heads + h) * desc->seq + pos) * desc->head_dim + x;
                    dst[to] = src[from];
                }
            }
        }
    }
}

void ref_concat_heads(const clattn_heads_desc *desc, const float *src, double *dst)
{
    size_t row_stride = heads_row_stride(desc);
    for (size_t b = 0; b < desc->batch; ++b) {
        for (size_t h = 0; h < desc->heads; ++h) {
            for (size_t pos = 0; pos < desc->seq; ++pos) {
                for (size_t x = 0; x < desc->head_dim; ++x) {
                    size_t from = ((b * desc->heads + h) * desc->seq + pos) * desc->head_dim + x;
                    size_t to = (b * desc->seq + pos) * row_stride + h * desc->head_dim + x;
                    dst[to] = src[from];
                }
            }
        }
    }
}

/* --- attention ---------------------------------------------------------------------------- */

static void attention_double(const clattn_attention_desc *desc, const clattn_host_masks *masks,
                             const double *q, const double *k, const double *v, double *out,
                             double *weights)
{
    size_t dk = desc->head_dim_qk, dv = desc->head_dim_v;
    double scale = desc->scale != 0.0f ? (double)desc->scale : 1.0 / sqrt((double)dk);
    double *row = ref_alloc(desc->seq_k, sizeof(double));
    unsigned char *keep = ref_alloc(desc->seq_k, 1);
    for (size_t b = 0; b < desc->batch; ++b) {
        for (size_t h = 0; h < desc->heads; ++h) {
            size_t head_index = b * desc->heads + h;
            const double *q_head = q + head_index * desc->seq_q * dk;
            const double *k_head = k + head_index * desc->seq_k * dk;
            const double *v_head = v + head_index * desc->seq_k * dv;
            for (size_t query = 0; query < desc->seq_q; ++query) {
                for (size_t key = 0; key < desc->seq_k; ++key) {
                    double dot = 0.0;
                    for (size_t x = 0; x < dk; ++x) {
                        dot += q_head[query * dk + x] * k_head[key * dk + x];
                    }
                    row[key] = scale * dot;
                }
                mask_row(masks, b, query, desc->seq_k, row, keep);
                normalise_row(row, keep, desc->seq_k, desc->norm);
                double *out_row = out + (head_index * desc->seq_q + query) * dv;
                for (size_t x = 0; x < dv; ++x) {
                    double sum = 0.0;
                    for (size_t key = 0; key < desc->seq_k; ++key) {
                        sum += row[key] * v_head[key * dv + x];
                    }
                    out_row[x] = sum;
                }
                if (weights != NULL) {
                    memcpy(weights + (head_index * desc->seq_q + query) * desc->seq_k, row,
                           desc->seq_k * sizeof(double));
                }
            }
        }
    }
    free(keep);
    free(row);
}

static double *to_doubles(const float *values, size_t count)
{
    double *result = ref_alloc(count, sizeof(double));
    for (size_t i = 0; i < count; ++i) {
        result[i] = values[i];
    }
    return result;
}

void ref_attention(const clattn_attention_desc *desc, const clattn_host_masks *masks,
                   const float *q, const float *k, const float *v, double *out, double *weights)
{
    size_t heads_total = desc->batch * desc->heads;
    double *q_double = to_doubles(q, heads_total * desc->seq_q * desc->head_dim_qk);
    double *k_double = to_doubles(k, heads_total * desc->seq_k * desc->head_dim_qk);
    double *v_double = to_doubles(v, heads_total * desc->seq_k * desc->head_dim_v);
    attention_double(desc, masks, q_double, k_double, v_double, out, weights);
    free(v_double);
    free(k_double);
    free(q_double);
}

/* --- multi-head attention ----------------------------------------------------------------- */

size_t ref_mha_kdim(const clattn_mha_desc *desc)
{
    return desc->kdim ? desc->kdim : desc->embed_dim;
}

size_t ref_mha_vdim(const clattn_mha_desc *desc)
{
    return desc->vdim ? desc->vdim : desc->embed_dim;
}

size_t ref_mha_qk_dim(const clattn_mha_desc *desc)
{
    return desc->qk_dim ? desc->qk_dim : desc->embed_dim;
}

size_t ref_mha_v_dim(const clattn_mha_desc *desc)
{
    return desc->v_dim ? desc->v_dim : desc->embed_dim;
}

size_t ref_mha_out_dim(const clattn_mha_desc *desc, int has_out_weight)
{
    return has_out_weight ? desc->embed_dim : ref_mha_v_dim(desc);
}

/* y (rows x d_out) = x·W + bias, W stored d_in x d_out (XW) or d_out x d_in (TORCH). */
static void project(const double *x, size_t rows, size_t d_in, size_t d_out, const float *weight,
                    const float *bias, clattn_weight_layout layout, double *y)
{
    for (size_t row = 0; row < rows; ++row) {
        for (size_t col = 0; col < d_out; ++col) {
            double sum = bias != NULL ? (double)bias[col] : 0.0;
            for (size_t i = 0; i < d_in; ++i) {
                double w = layout == CLATTN_LAYOUT_TORCH ? weight[col * d_in + i]
                                                         : weight[i * d_out + col];
                sum += x[row * d_in + i] * w;
            }
            y[row * d_out + col] = sum;
        }
    }
}

/* (batch, seq, heads*head_dim) -> (batch, heads, seq, head_dim), in double. */
static void split_double(const double *src, size_t batch, size_t seq, size_t heads, size_t head_dim,
                         double *dst)
{
    for (size_t b = 0; b < batch; ++b) {
        for (size_t h = 0; h < heads; ++h) {
            for (size_t pos = 0; pos < seq; ++pos) {
                memcpy(dst + ((b * heads + h) * seq + pos) * head_dim,
                       src + (b * seq + pos) * heads * head_dim + h * head_dim,
                       head_dim * sizeof(double));
            }
        }
    }
}

static void concat_double(const double *src, size_t batch, size_t seq, size_t heads,
                          size_t head_dim, double *dst)
{
    for (size_t b = 0; b < batch; ++b) {
        for (size_t h = 0; h < heads; ++h) {
            for (size_t pos = 0; pos < seq; ++pos) {
                memcpy(dst + (b * seq + pos) * heads * head_dim + h * head_dim,
                       src + ((b * heads + h) * seq + pos) * head_dim, head_dim * sizeof(double));
            }
        }
    }
}

void ref_mha_forward(const clattn_mha_desc *desc, const clattn_mha_host_weights *weights,
                     const float *query, const float *key, const float *value,
                     const clattn_host_masks *masks, double *out, double *attn_weights)
{
    size_t embed_dim = desc->embed_dim, heads = desc->num_heads;
    size_t kdim = ref_mha_kdim(desc), vdim = ref_mha_vdim(desc);
    size_t qk_dim = ref_mha_qk_dim(desc), v_dim = ref_mha_v_dim(desc);
    size_t batch = desc->batch, seq_q = desc->seq_q, seq_k = desc->seq_k;
    size_t rows_q = batch * seq_q, rows_k = batch * seq_k;

    const float *q_weight = weights->q_weight, *k_weight = weights->k_weight;
    const float *v_weight = weights->v_weight;
    const float *q_bias = weights->q_bias, *k_bias = weights->k_bias, *v_bias = weights->v_bias;
    if (weights->in_proj_weight != NULL) {
        /* PyTorch's packing: rows [0,E) project q, [E,2E) k, [2E,3E) v. */
        q_weight = weights->in_proj_weight;
        k_weight = weights->in_proj_weight + embed_dim * embed_dim;
        v_weight = weights->in_proj_weight + 2 * embed_dim * embed_dim;
        q_bias = weights->in_proj_bias;
        k_bias = weights->in_proj_bias ? weights->in_proj_bias + embed_dim : NULL;
        v_bias = weights->in_proj_bias ? weights->in_proj_bias + 2 * embed_dim : NULL;
    }
    key = key != NULL ? key : query;
    value = value != NULL ? value : key; /* as clattn_mha_forward_host: value NULL is the key */

    double *query_d = to_doubles(query, rows_q * embed_dim);
    double *key_d = to_doubles(key, rows_k * kdim);
    double *value_d = to_doubles(value, rows_k * vdim);
    double *q_proj = ref_alloc(rows_q * qk_dim, sizeof(double));
    double *k_proj = ref_alloc(rows_k * qk_dim, sizeof(double));
    double *v_proj = ref_alloc(rows_k * v_dim, sizeof(double));
    project(query_d, rows_q, embed_dim, qk_dim, q_weight, q_bias, desc->layout, q_proj);
    project(key_d, rows_k, kdim, qk_dim, k_weight, k_bias, desc->layout, k_proj);
    project(value_d, rows_k, vdim, v_dim, v_weight, v_bias, desc->layout, v_proj);

    size_t head_dim_qk = qk_dim / heads, head_dim_v = v_dim / heads;
    double *q_heads = ref_alloc(rows_q * qk_dim, sizeof(double));
    double *k_heads = ref_alloc(rows_k * qk_dim, sizeof(double));
    double *v_heads = ref_alloc(rows_k * v_dim, sizeof(double));
    split_double(q_proj, batch, seq_q, heads, head_dim_qk, q_heads);
    split_double(k_proj, batch, seq_k, heads, head_dim_qk, k_heads);
    split_double(v_proj, batch, seq_k, heads, head_dim_v, v_heads);

    clattn_attention_desc attention = {
        .batch = batch,
        .heads = heads,
        .seq_q = seq_q,
        .seq_k = seq_k,
        .head_dim_qk = head_dim_qk,
        .head_dim_v = head_dim_v,
        .scale = desc->scale,
        .norm = desc->norm,
    };
    double *o_heads = ref_alloc(rows_q * v_dim, sizeof(double));
    double *head_weights = ref_alloc(batch * heads * seq_q * seq_k, sizeof(double));
    attention_double(&attention, masks, q_heads, k_heads, v_heads, o_heads, head_weights);

    double *concat = ref_alloc(rows_q * v_dim, sizeof(double));
    concat_double(o_heads, batch, seq_q, heads, head_dim_v, concat);
    if (weights->out_weight != NULL) {
        project(concat, rows_q, v_dim, embed_dim, weights->out_weight, weights->out_bias,
                desc->layout, out);
    } else {
        memcpy(out, concat, rows_q * v_dim * sizeof(double));
    }

    if (attn_weights != NULL && desc->need_weights == CLATTN_WEIGHTS_PER_HEAD) {
        memcpy(attn_weights, head_weights, batch * heads * seq_q * seq_k * sizeof(double));
    } else if (attn_weights != NULL && desc->need_weights == CLATTN_WEIGHTS_AVERAGED) {
        for (size_t b = 0; b < batch; ++b) {
            for (size_t i = 0; i < seq_q * seq_k; ++i) {
                double sum = 0.0;
                for (size_t h = 0; h < heads; ++h) {
                    sum += head_weights[(b * heads + h) * seq_q * seq_k + i];
                }
                attn_weights[b * seq_q * seq_k + i] = sum / (double)heads;
            }
        }
    }

    free(concat);
    free(head_weights);
    free(o_heads);
    free(v_heads);
    free(k_heads);
    free(q_heads);
    free(v_proj);
    free(k_proj);
    free(q_proj);
    free(value_d);
    free(key_d);
    free(query_d);
}
