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

static size_t at_least_one(size_t value)
{
    return value ? value : 1;
}

/* --- matmul ------------------------------------------------------------------------------- */

void ref_matmul(const ref_matmul_shape *shape, const float *a, const float *b, const float *bias,
                double *c)
{
    const size_t m = shape->m, n = shape->n, k = shape->k;
    const size_t outer = at_least_one(shape->batch[0]), inner_count = at_least_one(shape->batch[1]);
    const size_t a_outer = at_least_one(shape->a_batch[0]), a_inner = at_least_one(shape->a_batch[1]);
    const size_t b_outer = at_least_one(shape->b_batch[0]), b_inner = at_least_one(shape->b_batch[1]);
    const size_t lda = shape->trans_a ? m : k, ldb = shape->trans_b ? k : n;
    for (size_t i0 = 0; i0 < outer; ++i0) {
        for (size_t i1 = 0; i1 < inner_count; ++i1) {
            const size_t a_index = (a_outer > 1 ? i0 : 0) * a_inner + (a_inner > 1 ? i1 : 0);
            const size_t b_index = (b_outer > 1 ? i0 : 0) * b_inner + (b_inner > 1 ? i1 : 0);
            const float *a_entry = a + a_index * m * k;
            const float *b_entry = b + b_index * k * n;
            double *c_entry = c + (i0 * inner_count + i1) * m * n;
            for (size_t row = 0; row < m; ++row) {
                for (size_t col = 0; col < n; ++col) {
                    double sum = 0.0;
                    for (size_t x = 0; x < k; ++x) {
                        double a_value =
                            shape->trans_a ? a_entry[x * lda + row] : a_entry[row * lda + x];
                        double b_value =
                            shape->trans_b ? b_entry[col * ldb + x] : b_entry[x * ldb + col];
                        sum += a_value * b_value;
                    }
                    double result = (double)shape->alpha * sum;
                    if (shape->beta != 0.0f) {
                        result += (double)shape->beta * c_entry[row * n + col];
                    }
                    if (bias != NULL) {
                        result += bias[col];
                    }
                    c_entry[row * n + col] = result;
                }
            }
        }
    }
}

/* --- scaled dot-product attention --------------------------------------------------------- */

double ref_resolve_scale(float scale, size_t head_dim_qk)
{
    return isnan(scale) ? 1.0 / sqrt((double)head_dim_qk) : (double)scale;
}

ref_sdpa_shape ref_softmax_shape(size_t batch, size_t heads, size_t seq_q, size_t seq_k, size_t dk,
                                 size_t dv)
{
    ref_sdpa_shape shape;
    memset(&shape, 0, sizeof shape); /* every rule off */
    shape.batch = batch, shape.heads = heads, shape.seq_q = seq_q, shape.seq_k = seq_k;
    shape.dk = dk, shape.dv = dv, shape.scale = ref_resolve_scale(NAN, dk);
    shape.norm = CLATTN_NORM_SOFTMAX;
    return shape;
}

/* The offset of an alignment for batch b: query i sits at key position i + offset. */
static long long align_offset(const ref_sdpa_shape *s, clattn_causal align, size_t b)
{
    const long long n = s->kv_len ? (long long)s->kv_len[b] : (long long)s->seq_k;
    switch (align) {
    case CLATTN_CAUSAL_BOTTOM_RIGHT:
        return n - (long long)s->seq_q;
    case CLATTN_CAUSAL_ONNX:
        return s->has_past ? (long long)s->past : s->kv_len ? n - (long long)s->seq_q : 0;
    case CLATTN_CAUSAL_OFFSET:
        return s->diag_offset;
    default:
        return 0;
    }
}

/* ALiBi's bias of key j in query i of (b, h): -m * |i + n - seq_q - j|; 0 without slopes. */
static double alibi_bias(const ref_sdpa_shape *s, size_t b, size_t h, size_t query, size_t key)
{
    if (s->alibi == NULL) {
        return 0.0;
    }
    const double p = (double)query + (double)align_offset(s, CLATTN_CAUSAL_BOTTOM_RIGHT, b);
    return -(double)s->alibi[b * s->heads + h] * fabs(p - (double)key);
}

/* Whether the key rules (key count, causal, window) let query i of batch b see key j. */
static int rules_keep(const ref_sdpa_shape *s, size_t b, size_t query, size_t key)
{
    const long long i = (long long)query, j = (long long)key;
    if (s->kv_len != NULL && j >= (long long)s->kv_len[b]) {
        return 0;
    }
    /* In double: an OFFSET diagonal may be any long long (exact up to 2^53, and beyond that
     * far past every key either way). */
    if (s->causal != CLATTN_CAUSAL_NONE &&
        (double)j > (double)i + (double)align_offset(s, s->causal, b)) {
        return 0;
    }
    if (s->window_align != CLATTN_CAUSAL_NONE) {
        const double p = (double)i + (double)align_offset(s, s->window_align, b);
        if ((s->window_left >= 0 && (double)j < p - (double)s->window_left) ||
            (s->window_right >= 0 && (double)j > p + (double)s->window_right)) {
            return 0;
        }
    }
    return 1;
}

void ref_sdpa_scores(const ref_sdpa_shape *shape, const float *q, const float *k, const float *mask,
                     const uint8_t *key_padding, int mode, double *scores)
{
    const size_t dk = shape->dk, seq_q = shape->seq_q, seq_k = shape->seq_k;
    const size_t kv_heads = shape->kv_heads ? shape->kv_heads : shape->heads;
    const size_t group = shape->heads / kv_heads;
    for (size_t b = 0; b < shape->batch; ++b) {
        for (size_t h = 0; h < shape->heads; ++h) {
            const size_t head_index = b * shape->heads + h;
            const float *q_head = q + head_index * seq_q * dk;
            const float *k_head = k + (b * kv_heads + h / group) * seq_k * dk;
            for (size_t query = 0; query < seq_q; ++query) {
                const size_t row_index = head_index * seq_q + query;
                for (size_t key = 0; key < seq_k; ++key) {
                    double dot = 0.0;
                    for (size_t x = 0; x < dk; ++x) {
                        dot += (double)q_head[query * dk + x] * (double)k_head[key * dk + x];
                    }
                    double s = shape->scale * dot;
                    if (mode >= 1 && shape->softcap > 0.0) {
                        s = shape->softcap * tanh(s / shape->softcap);
                    }
                    if (mode == 2) {
                        s += alibi_bias(shape, b, h, query, key);
                        if (mask != NULL) {
                            s += mask[row_index * seq_k + key];
                        }
                        if (!rules_keep(shape, b, query, key) ||
                            (key_padding != NULL && key_padding[b * seq_k + key])) {
                            s = -INFINITY;
                        }
                    }
                    scores[row_index * seq_k + key] = s;
                }
            }
        }
    }
}

/* Normalises one row of scores in place over the kept keys; returns the row's log-sum-exp
 * (softmax) or log normaliser (relu), -INFINITY when nothing is kept. */
static double normalise_row(double *row, const unsigned char *keep, size_t seq_k, clattn_norm norm,
                            double sink)
{
    double sum = 0.0, max = norm == CLATTN_NORM_RELU ? -INFINITY : sink;
    if (norm == CLATTN_NORM_RELU) {
        for (size_t key = 0; key < seq_k; ++key) {
            row[key] = keep[key] && row[key] > 0.0 ? row[key] : 0.0;
            sum += row[key];
        }
    } else {
        for (size_t key = 0; key < seq_k; ++key) {
            if (keep[key] && row[key] > max) {
                max = row[key];
            }
        }
        for (size_t key = 0; key < seq_k; ++key) {
            row[key] = max != -INFINITY && keep[key] ? exp(row[key] - max) : 0.0;
            sum += row[key];
        }
        if (sink != -INFINITY) { /* the sink's term: in the denominator only */
            sum += exp(sink - max);
        }
    }
    for (size_t key = 0; key < seq_k; ++key) {
        row[key] = sum > 0.0 ? row[key] / sum : 0.0;
    }
    if (!(sum > 0.0)) {
        return -INFINITY;
    }
    return norm == CLATTN_NORM_RELU ? log(sum) : max + log(sum);
}

void ref_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t x[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int round = 0; round < 10; ++round) {
        if (round > 0) { /* the key schedule: a Weyl sequence per word */
            k[0] += UINT32_C(0x9E3779B9);
            k[1] += UINT32_C(0xBB67AE85);
        }
        const uint64_t a = (uint64_t)UINT32_C(0xD2511F53) * x[0];
        const uint64_t c = (uint64_t)UINT32_C(0xCD9E8D57) * x[2];
        const uint32_t y[4] = {(uint32_t)(c >> 32) ^ x[1] ^ k[0], (uint32_t)c,
                               (uint32_t)(a >> 32) ^ x[3] ^ k[1], (uint32_t)a};
        memcpy(x, y, sizeof x);
    }
    memcpy(out, x, sizeof x);
}

double ref_dropout_factor(const ref_sdpa_shape *shape, size_t b, size_t h, size_t i, size_t j)
{
    const double p = shape->dropout_p;
    if (!(p > 0.0))
        return 1.0;
    const uint64_t stream = shape->dropout_offset + (uint64_t)(b * shape->heads + h);
    const uint32_t ctr[4] = {(uint32_t)(j / 4), (uint32_t)i, (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
    const uint32_t key[2] = {(uint32_t)shape->dropout_seed, (uint32_t)(shape->dropout_seed >> 32)};
    uint32_t word[4];
    ref_philox4x32_10(ctr, key, word);
    const double threshold = floor(p * 4294967296.0);
    return (double)word[j % 4] >= threshold && p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
}

/* Attention on double inputs (shared with the MHA and additive references). additive_w:
 * NULL for the dot product, else (heads, dk) and the score is sum_x w[h, x] tanh(q_x + k_x). */
static void sdpa_double(const ref_sdpa_shape *shape, const double *q, const double *k,
                        const double *v, const float *mask, const uint8_t *key_padding, double *out,
                        double *weights, double *lse, const double *additive_w)
{
    const size_t dk = shape->dk, dv = shape->dv, seq_q = shape->seq_q, seq_k = shape->seq_k;
    double *row = ref_alloc(seq_k, sizeof(double));
    unsigned char *keep = ref_alloc(seq_k, 1);
    const size_t kv_heads = shape->kv_heads ? shape->kv_heads : shape->heads;
    const size_t group = shape->heads / kv_heads;
    for (size_t b = 0; b < shape->batch; ++b) {
        for (size_t h = 0; h < shape->heads; ++h) {
            const size_t head_index = b * shape->heads + h;
            const size_t kv_index = b * kv_heads + h / group;
            const double *q_head = q + head_index * seq_q * dk;
            const double *k_head = k + kv_index * seq_k * dk;
            const double *v_head = v + kv_index * seq_k * dv;
            for (size_t query = 0; query < seq_q; ++query) {
                const size_t row_index = head_index * seq_q + query;
                for (size_t key = 0; key < seq_k; ++key) {
                    double dot = 0.0;
                    for (size_t x = 0; x < dk; ++x) {
                        dot += additive_w != NULL
                                   ? additive_w[h * dk + x] *
                                         tanh(q_head[query * dk + x] + k_head[key * dk + x])
                                   : q_head[query * dk + x] * k_head[key * dk + x];
                    }
                    row[key] = shape->scale * dot;
                    if (shape->softcap > 0.0) { /* soft-capping, before the mask */
                        row[key] = shape->softcap * tanh(row[key] / shape->softcap);
                    }
                    row[key] += alibi_bias(shape, b, h, query, key);
                    if (mask != NULL) {
                        row[key] += mask[row_index * seq_k + key];
                    }
                    keep[key] = rules_keep(shape, b, query, key) &&
                                !(key_padding != NULL && key_padding[b * seq_k + key]) &&
                                row[key] != -INFINITY;
                }
                const double row_lse =
                    normalise_row(row, keep, seq_k, shape->norm,
                                  shape->sinks != NULL ? (double)shape->sinks[h] : -INFINITY);
                if (shape->dropout_p > 0.0) { /* after normalisation; lse is the row's */
                    for (size_t key = 0; key < seq_k; ++key) {
                        row[key] *= ref_dropout_factor(shape, b, h, query, key);
                    }
                }
                if (lse != NULL) {
                    lse[row_index] = row_lse;
                }
                if (out != NULL) {
                    double *out_row = out + row_index * dv;
                    for (size_t x = 0; x < dv; ++x) {
                        double sum = 0.0;
                        for (size_t key = 0; key < seq_k; ++key) {
                            if (keep[key]) { /* a dropped key's value is never read (NaN) */
                                sum += row[key] * v_head[key * dv + x];
                            }
                        }
                        out_row[x] = sum;
                    }
                }
                if (weights != NULL) {
                    memcpy(weights + row_index * seq_k, row, seq_k * sizeof(double));
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

void ref_sdpa(const ref_sdpa_shape *shape, const float *q, const float *k, const float *v,
              const float *mask, const uint8_t *key_padding, double *out, double *weights,
              double *lse)
{
    ref_sdpa_rope(shape, NULL, q, k, v, mask, key_padding, out, weights, lse);
}

void ref_sdpa_rope(const ref_sdpa_shape *shape, const ref_rope_spec *rope, const float *q,
                   const float *k, const float *v, const float *mask, const uint8_t *key_padding,
                   double *out, double *weights, double *lse)
{
    const size_t heads_total = shape->batch * shape->heads;
    const size_t kv_total = shape->batch * (shape->kv_heads ? shape->kv_heads : shape->heads);
    double *q_double = to_doubles(q, heads_total * shape->seq_q * shape->dk);
    double *k_double = to_doubles(k, kv_total * shape->seq_k * shape->dk);
    if (rope != NULL) {
        const size_t rot = rope->dims ? rope->dims : shape->dk;
        const double base = rope->base == 0.0 ? 10000.0 : rope->base;
        ref_rope_rows(q_double, heads_total, shape->seq_q, 0, shape->dk, rot, rope->pairs,
                      rope->start, base);
        ref_rope_rows(k_double, kv_total, shape->seq_k, shape->has_past ? shape->past : 0,
                      shape->dk, rot, rope->pairs, rope->start, base);
    }
    double *v_double = to_doubles(v, kv_total * shape->seq_k * shape->dv);
    sdpa_double(shape, q_double, k_double, v_double, mask, key_padding, out, weights, lse, NULL);
    free(v_double);
    free(k_double);
    free(q_double);
}

void ref_sdpa_backward(const ref_sdpa_shape *shape, const float *q, const float *k, const float *v,
                       const float *mask, const uint8_t *key_padding, const float *grad_out,
                       const float *out_given, int magnitudes, double *dq, double *dk,
                       double *dv, double *dscores, double *dsinks)
{
#define MAG(x) (magnitudes ? fabs(x) : (x))
    const size_t B = shape->batch, H = shape->heads, Lq = shape->seq_q, Lk = shape->seq_k;
    const size_t dqk = shape->dk, dvv = shape->dv;
    const size_t kv_heads = shape->kv_heads ? shape->kv_heads : H, group = H / kv_heads;
    const size_t rows = B * H * Lq;
    double *out = ref_alloc(rows * dvv, sizeof(double));
    double *weights = ref_alloc(rows * Lk, sizeof(double));
    double *lse = ref_alloc(rows, sizeof(double));
    double *raw = ref_alloc(rows * Lk, sizeof(double));    /* scale * q . k */
    double *scores = ref_alloc(rows * Lk, sizeof(double)); /* s (-inf where dropped) */
    ref_sdpa(shape, q, k, v, mask, key_padding, out, NULL, lse);
    ref_sdpa_shape undropped = *shape; /* the weights before dropout */
    undropped.dropout_p = 0.0;
    ref_sdpa(&undropped, q, k, v, mask, key_padding, NULL, weights, NULL);
    ref_sdpa_scores(shape, q, k, mask, key_padding, 0, raw);
    ref_sdpa_scores(shape, q, k, mask, key_padding, 2, scores);
    if (dq)
        memset(dq, 0, rows * dqk * sizeof(double));
    if (dk)
        memset(dk, 0, B * kv_heads * Lk * dqk * sizeof(double));
    if (dv)
        memset(dv, 0, B * kv_heads * Lk * dvv * sizeof(double));
    if (dsinks)
        memset(dsinks, 0, H * sizeof(double));
    for (size_t b = 0; b < B; ++b) {
        for (size_t h = 0; h < H; ++h) {
            const size_t g = b * kv_heads + h / group;
            for (size_t i = 0; i < Lq; ++i) {
                const size_t row = (b * H + h) * Lq + i;
                const float *go = grad_out + row * dvv;
                double delta = 0.0;
                for (size_t x = 0; x < dvv; ++x)
                    delta += MAG((double)go[x] * (out_given ? (double)out_given[row * dvv + x]
                                                            : out[row * dvv + x]));
                if (dsinks && shape->sinks && shape->sinks[h] != -INFINITY)
                    dsinks[h] += MAG(-exp((double)shape->sinks[h] - lse[row]) * delta);
                for (size_t j = 0; j < Lk; ++j) {
                    const double s = scores[row * Lk + j], w = weights[row * Lk + j];
                    const double z = ref_dropout_factor(shape, b, h, i, j); /* 1: none */
                    double ds = 0.0;
                    if (s != -INFINITY && lse[row] != -INFINITY) {
                        double dp = 0.0;
                        for (size_t x = 0; x < dvv; ++x)
                            dp += MAG((double)go[x] * v[(g * Lk + j) * dvv + x]);
                        dp *= z; /* the weight that met v_j was w z */
                        const double diff = magnitudes ? dp + delta : dp - delta;
                        if (shape->norm == CLATTN_NORM_RELU)
                            ds = s > 0.0 ? diff * exp(-lse[row]) : 0.0;
                        else
                            ds = w * diff;
                    }
                    if (dscores)
                        dscores[row * Lk + j] = ds;
                    if (dv)
                        for (size_t x = 0; x < dvv; ++x)
                            dv[(g * Lk + j) * dvv + x] += MAG(w * z * go[x]);
                    if (ds == 0.0)
                        continue;
                    double dx = ds * shape->scale;
                    if (shape->softcap > 0.0) {
                        const double t = tanh(raw[row * Lk + j] / shape->softcap);
                        dx *= 1.0 - t * t;
                    }
                    dx = MAG(dx);
                    for (size_t x = 0; x < dqk; ++x) {
                        if (dq)
                            dq[row * dqk + x] += MAG(dx * k[(g * Lk + j) * dqk + x]);
                        if (dk)
                            dk[(g * Lk + j) * dqk + x] += MAG(dx * q[row * dqk + x]);
                    }
                }
            }
        }
    }
    free(scores);
    free(raw);
    free(lse);
    free(weights);
    free(out);
#undef MAG
}

/* --- multi-head attention ----------------------------------------------------------------- */

size_t ref_mha_kdim(const clattn_mha_host_desc *desc)
{
    return desc->kdim ? desc->kdim : desc->embed_dim;
}

size_t ref_mha_vdim(const clattn_mha_host_desc *desc)
{
    return desc->vdim ? desc->vdim : desc->embed_dim;
}

size_t ref_mha_qk_dim(const clattn_mha_host_desc *desc)
{
    return desc->qk_dim ? desc->qk_dim : desc->embed_dim;
}

size_t ref_mha_v_dim(const clattn_mha_host_desc *desc)
{
    return desc->v_dim ? desc->v_dim : desc->embed_dim;
}

size_t ref_mha_out_dim(const clattn_mha_host_desc *desc, int has_out_weight)
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

void ref_posenc_sinusoid(size_t start, size_t seq, size_t dim, double base, double *table)
{
    for (size_t p = 0; p < seq; ++p) {
        const double pos = (double)(start + p);
        for (size_t i = 0; i < dim; ++i) {
            const double angle = pos * pow(base, -2.0 * (double)(i / 2) / (double)dim);
            table[p * dim + i] = i % 2 ? cos(angle) : sin(angle);
        }
    }
}

void ref_rope(size_t batch, size_t heads, size_t seq, size_t dim, size_t rot, int pairs,
              const float *x, const double *cosv, const double *sinv, double *out)
{
    const size_t half = rot / 2;
    for (size_t b = 0; b < batch; ++b) {
        for (size_t h = 0; h < heads; ++h) {
            for (size_t s = 0; s < seq; ++s) {
                const float *row = x + ((b * heads + h) * seq + s) * dim;
                double *dst = out + ((b * heads + h) * seq + s) * dim;
                for (size_t i = rot; i < dim; ++i) {
                    dst[i] = row[i];
                }
                for (size_t j = 0; j < half; ++j) {
                    const size_t i1 = pairs ? 2 * j : j, i2 = pairs ? 2 * j + 1 : j + half;
                    const double c = cosv[(b * seq + s) * half + j];
                    const double sn = sinv[(b * seq + s) * half + j];
                    dst[i1] = (double)row[i1] * c - (double)row[i2] * sn;
                    dst[i2] = (double)row[i1] * sn + (double)row[i2] * c;
                }
            }
        }
    }
}

/* RoPE in place on `rows_of` blocks of (seq, dim) doubles, positions start + s, angles in
 * double. */
static void rope_double(double *x, size_t blocks, size_t seq, size_t dim, size_t rot, int pairs,
                        size_t start, double base)
{
    const size_t half = rot / 2;
    for (size_t blk = 0; blk < blocks; ++blk) {
        for (size_t s = 0; s < seq; ++s) {
            double *row = x + (blk * seq + s) * dim;
            for (size_t j = 0; j < half; ++j) {
                const double t = (double)(start + s) * pow(base, -2.0 * (double)j / (double)rot);
                const size_t i1 = pairs ? 2 * j : j, i2 = pairs ? 2 * j + 1 : j + half;
                const double x1 = row[i1], x2 = row[i2];
                row[i1] = x1 * cos(t) - x2 * sin(t);
                row[i2] = x1 * sin(t) + x2 * cos(t);
            }
        }
    }
}

void ref_rope_rows(double *x, size_t blocks, size_t seq, size_t first, size_t dim, size_t rot,
                   int pairs, size_t start, double base)
{
    for (size_t blk = 0; blk < blocks && first < seq; ++blk) {
        rope_double(x + (blk * seq + first) * dim, 1, seq - first, dim, rot, pairs, start, base);
    }
}

void ref_mha_forward(const clattn_mha_host_desc *desc, const clattn_mha_host_weights *weights,
                     const float *query, const float *key, const float *value,
                     const clattn_host_masks *masks, double *out, double *attn_weights)
{
    const size_t embed_dim = desc->embed_dim, heads = desc->num_heads;
    const size_t kdim = ref_mha_kdim(desc), vdim = ref_mha_vdim(desc);
    const size_t qk_dim = ref_mha_qk_dim(desc), v_dim = ref_mha_v_dim(desc);
    const size_t batch = desc->batch, seq_q = desc->seq_q, seq_k = desc->seq_k;
    const size_t rows_q = batch * seq_q, rows_k = batch * seq_k;
    /* Grouped-query projections: k and v have kv_heads heads of the query side's head sizes. */
    const size_t kv_heads = desc->num_kv_heads && desc->num_kv_heads != CLATTN_KV_HEADS_ALL
                                ? desc->num_kv_heads
                                : heads;
    const size_t kv_qk_dim = qk_dim / heads * kv_heads, kv_v_dim = v_dim / heads * kv_heads;

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
    const clattn_weight_layout layout = desc->layout; /* in_proj_weight needs TORCH */

    double *query_d = to_doubles(query, rows_q * embed_dim);
    double *key_d = to_doubles(key, rows_k * kdim);
    double *value_d = to_doubles(value, rows_k * vdim);
    double *q_proj = ref_alloc(rows_q * qk_dim, sizeof(double));
    double *k_proj = ref_alloc(rows_k * kv_qk_dim, sizeof(double));
    double *v_proj = ref_alloc(rows_k * kv_v_dim, sizeof(double));
    project(query_d, rows_q, embed_dim, qk_dim, q_weight, q_bias, layout, q_proj);
    project(key_d, rows_k, kdim, kv_qk_dim, k_weight, k_bias, layout, k_proj);
    project(value_d, rows_k, vdim, kv_v_dim, v_weight, v_bias, layout, v_proj);

    const size_t head_dim_qk = qk_dim / heads, head_dim_v = v_dim / heads;
    double *q_heads = ref_alloc(rows_q * qk_dim, sizeof(double));
    double *k_heads = ref_alloc(rows_k * kv_qk_dim, sizeof(double));
    double *v_heads = ref_alloc(rows_k * kv_v_dim, sizeof(double));
    split_double(q_proj, batch, seq_q, heads, head_dim_qk, q_heads);
    split_double(k_proj, batch, seq_k, kv_heads, head_dim_qk, k_heads);
    if (desc->rope) { /* rotary embeddings on the projected q and k heads */
        const size_t rot = desc->rope_dims && desc->rope_dims != CLATTN_ROPE_WHOLE_HEAD
                               ? desc->rope_dims
                               : head_dim_qk;
        const double base = desc->rope_base == 0.0 ? 10000.0 : desc->rope_base;
        const int pairs = desc->rope_style == CLATTN_ROPE_PAIRS;
        rope_double(q_heads, batch * heads, seq_q, head_dim_qk, rot, pairs, desc->rope_start, base);
        rope_double(k_heads, batch * kv_heads, seq_k, head_dim_qk, rot, pairs, desc->rope_start,
                    base);
    }
    split_double(v_proj, batch, seq_k, kv_heads, head_dim_v, v_heads);

    /* The host masks' (seq_q, seq_k) attn_mask, expanded over (batch, heads). */
    float *mask = NULL;
    if (masks != NULL && masks->attn_mask != NULL) {
        mask = ref_alloc(batch * heads * seq_q * seq_k, sizeof(float));
        for (size_t bh = 0; bh < batch * heads; ++bh) {
            memcpy(mask + bh * seq_q * seq_k, masks->attn_mask, seq_q * seq_k * sizeof(float));
        }
    }
    /* The host masks' ALiBi slopes (heads), expanded over batch. */
    float *alibi = NULL;
    if (masks != NULL && masks->alibi_slopes != NULL) {
        alibi = ref_alloc(batch * heads, sizeof(float));
        for (size_t i = 0; i < batch * heads; ++i) {
            alibi[i] = masks->alibi_slopes[i % heads];
        }
    }
    const ref_sdpa_shape shape = {
        .batch = batch,
        .heads = heads,
        .seq_q = seq_q,
        .seq_k = seq_k,
        .dk = head_dim_qk,
        .dv = head_dim_v,
        .scale = ref_resolve_scale(desc->scale, head_dim_qk),
        .norm = desc->norm,
        .causal = desc->causal,
        .kv_heads = kv_heads,
        .softcap = desc->softcap,
        .window_align = desc->window_align,
        .window_left = desc->window_left,
        .window_right = desc->window_right,
        .alibi = alibi,
    };
    double *o_heads = ref_alloc(rows_q * v_dim, sizeof(double));
    double *head_weights = ref_alloc(batch * heads * seq_q * seq_k, sizeof(double));
    sdpa_double(&shape, q_heads, k_heads, v_heads, mask,
                masks != NULL ? masks->key_padding_mask : NULL, o_heads, head_weights, NULL, NULL);

    double *concat = ref_alloc(rows_q * v_dim, sizeof(double));
    concat_double(o_heads, batch, seq_q, heads, head_dim_v, concat);
    if (weights->out_weight != NULL) {
        project(concat, rows_q, v_dim, embed_dim, weights->out_weight, weights->out_bias, layout,
                out);
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
    free(mask);
    free(alibi);
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

/* --- additive attention -------------------------------------------------------------------- */

void ref_additive(const ref_additive_shape *s, const float *q, const float *k, const float *v,
                  const float *w1, const float *b1, const float *w2, const float *b2,
                  const float *w, const float *mask, const uint8_t *key_padding, double *out,
                  double *weights)
{
    const size_t B = s->batch, H = s->heads, da = s->da, dvh = s->dv / s->heads;
    double *qd = to_doubles(q, B * s->seq_q * s->dq), *kd = to_doubles(k, B * s->seq_k * s->dk);
    double *vd = to_doubles(v, B * s->seq_k * s->dv);
    double *p1 = ref_alloc(B * H * s->seq_q * da, sizeof(double));
    double *p2 = ref_alloc(B * H * s->seq_k * da, sizeof(double));
    double *vh = ref_alloc(B * s->seq_k * s->dv, sizeof(double));
    double *oh = ref_alloc(B * s->seq_q * s->dv, sizeof(double));
    double *wd = to_doubles(w, H * da);
    /* P1[b, h] = q[b] W1[h] + b1[h], in (batch, heads, seq, da) order. */
    for (size_t b = 0; b < B; ++b) {
        for (size_t h = 0; h < H; ++h) {
            project(qd + b * s->seq_q * s->dq, s->seq_q, s->dq, da, w1 + h * s->dq * da,
                    b1 ? b1 + h * da : NULL, CLATTN_LAYOUT_XW, p1 + (b * H + h) * s->seq_q * da);
            project(kd + b * s->seq_k * s->dk, s->seq_k, s->dk, da, w2 + h * s->dk * da,
                    b2 ? b2 + h * da : NULL, CLATTN_LAYOUT_XW, p2 + (b * H + h) * s->seq_k * da);
        }
    }
    split_double(vd, B, s->seq_k, H, dvh, vh);
    const ref_sdpa_shape shape = {
        .batch = B,
        .heads = H,
        .seq_q = s->seq_q,
        .seq_k = s->seq_k,
        .dk = da,
        .dv = dvh,
        .scale = 1.0,
        .norm = s->norm,
        .causal = s->causal,
    };
    sdpa_double(&shape, p1, p2, vh, mask, key_padding, out ? oh : NULL, weights, NULL, wd);
    if (out != NULL) {
        concat_double(oh, B, s->seq_q, H, dvh, out);
    }
    free(wd);
    free(oh);
    free(vh);
    free(p2);
    free(p1);
    free(vd);
    free(kd);
    free(qd);
}

/* float -> IEEE half bits, round to nearest even (ggml's GGML_FP32_TO_FP16 on finite values);
 * and back. Local copies: the reference links no test helper. */
static uint16_t ref_half(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    const uint32_t sign = (bits >> 16) & 0x8000u;
    const float a = fabsf(value);
    if (a >= 65520.0f)
        return (uint16_t)(sign | 0x7c00u);
    if (a < 6.103515625e-05f) { /* subnormal half: multiples of 2^-24, rounded to even */
        const float scaled = a * 16777216.0f;
        return (uint16_t)(sign | (uint32_t)nearbyintf(scaled));
    }
    uint32_t abs_bits = bits & 0x7fffffffu;
    const uint32_t rounded = abs_bits + 0xfffu + ((abs_bits >> 13) & 1u);
    return (uint16_t)(sign | ((rounded >> 13) - (112u << 10)));
}

static float ref_half_value(uint16_t h)
{
    const int exponent = (h >> 10) & 31, mantissa = h & 1023;
    const float magnitude = exponent == 0 ? ldexpf((float)mantissa, -24)
                                          : ldexpf((float)(mantissa | 1024), exponent - 25);
    return (h & 0x8000u) ? -magnitude : magnitude;
}

size_t ref_quantized_bytes(clattn_dtype dtype, size_t count)
{
    return count / 32 * (dtype == CLATTN_DTYPE_Q8_0 ? 34 : 18);
}

void ref_quantize(clattn_dtype dtype, const float *x, size_t count, uint8_t *blocks)
{
    for (size_t b = 0; b < count / 32; ++b) {
        const float *v = x + 32 * b;
        if (dtype == CLATTN_DTYPE_Q8_0) {
            uint8_t *out = blocks + 34 * b;
            float amax = 0.0f;
            for (int j = 0; j < 32; ++j)
                amax = fmaxf(amax, fabsf(v[j]));
            const volatile float d = amax / 127.0f; /* volatile: no contraction, as ggml */
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            const uint16_t h = ref_half(d);
            memcpy(out, &h, 2);
            for (int j = 0; j < 32; ++j) {
                const volatile float scaled = v[j] * id;
                /* NaN (a poisoned slot no kernel reads): 0, not an undefined conversion */
                out[2 + j] = isnan(scaled) ? 0 : (uint8_t)(int8_t)roundf(scaled);
            }
        } else {
            uint8_t *out = blocks + 18 * b;
            float amax = 0.0f, m = 0.0f;
            for (int j = 0; j < 32; ++j)
                if (amax < fabsf(v[j])) {
                    amax = fabsf(v[j]);
                    m = v[j];
                }
            const volatile float d = m / -8.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            const uint16_t h = ref_half(d);
            memcpy(out, &h, 2);
            for (int j = 0; j < 16; ++j) {
                const volatile float x0 = v[j] * id, x1 = v[16 + j] * id;
                const float y0 = x0 + 8.5f, y1 = x1 + 8.5f; /* NaN: a poisoned slot, 0 */
                const int q0 = isnan(y0) ? 0 : (int8_t)y0, q1 = isnan(y1) ? 0 : (int8_t)y1;
                out[2 + j] = (uint8_t)((q0 < 15 ? q0 : 15) | ((q1 < 15 ? q1 : 15) << 4));
            }
        }
    }
}

void ref_dequantize(clattn_dtype dtype, const uint8_t *blocks, size_t count, float *x)
{
    const size_t size = dtype == CLATTN_DTYPE_Q8_0 ? 34 : 18;
    for (size_t b = 0; b < count / 32; ++b) {
        const uint8_t *in = blocks + size * b;
        uint16_t h;
        memcpy(&h, in, 2);
        const float d = ref_half_value(h);
        for (int j = 0; j < 32; ++j)
            x[32 * b + j] = dtype == CLATTN_DTYPE_Q8_0
                                ? d * (float)(int8_t)in[2 + j]
                                : d * (float)((j < 16 ? in[2 + j] & 15 : in[2 + j - 16] >> 4) - 8);
    }
}
