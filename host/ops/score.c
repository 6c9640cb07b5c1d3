/* The score rule on the host: its operands for the kernels (clattn__score_params) and its
 * compile-time switches (clattn__score_defines), each written once for every kernel family
 * that applies the rule (softmax, flash, flash_gpu, flash_cpu), as -D definitions that
 * host/core/family.c writes into the build options. kernels/score.cl is the device
 * side. A new score modifier: a row in `switches` when it is compiled in, fields in params.h's
 * CLATTN_SCORE_PARAMS filled in clattn__score_params when it is an argument. */
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void clattn__score_params(const clattn__score_shape *score, const clattn__score_masks *masks,
                          cl_mem fallback, clattn_score_params *p, clattn__score_buffers *buffers)
{
    const clattn__view *mask = &masks->mask, *padding = &masks->key_padding;
    const bool has_mask = score->has_mask, has_padding = score->has_key_padding;
    const bool has_kv_len = score->has_kv_len, has_alibi = score->has_alibi;
    const bool has_sinks = score->has_sinks;
    *p = (clattn_score_params){0};
    buffers->mask = has_mask ? mask->mem : fallback;
    buffers->key_padding = has_padding ? padding->mem : fallback;
    buffers->kv_len = has_kv_len ? masks->kv_len.mem : fallback;
    buffers->alibi = has_alibi ? masks->alibi.mem : fallback;
    buffers->sinks = has_sinks ? masks->sinks.mem : fallback;
    buffers->flex = score->flex_id && masks->flex.arena ? masks->flex.arena : fallback;
    if (has_mask) {
        p->mask_offset = mask->offset;
        p->mask_s0 = mask->strides[0];
        p->mask_s1 = mask->strides[1];
        p->mask_s2 = mask->strides[2];
        p->mask_s3 = mask->strides[3];
    }
    if (has_padding) {
        p->key_padding_offset = padding->offset;
        p->key_padding_s0 = padding->strides[2];
        p->key_padding_s1 = padding->strides[3];
    }
    if (has_kv_len) {
        p->kv_len_offset = masks->kv_len.offset;
        p->kv_len_s0 = masks->kv_len.strides[3];
    }
    if (has_alibi) {
        p->alibi_offset = masks->alibi.offset;
        p->alibi_s0 = masks->alibi.strides[2];
        p->alibi_s1 = masks->alibi.strides[3];
    }
    if (has_sinks) {
        p->sinks_offset = masks->sinks.offset;
        p->sinks_s0 = masks->sinks.strides[2];
        p->sinks_s1 = masks->sinks.strides[3];
    }
    p->band_diag = score->band_diag;
    p->band_upper = score->band_upper;
    p->band_lower = score->band_lower;
    p->has_mask = has_mask;
    p->has_key_padding = has_padding;
    p->has_kv_len = has_kv_len;
    p->band_diag_kv = score->band_diag_kv;
    p->has_alibi = has_alibi;
    p->has_sinks = has_sinks;
    p->heads = (cl_uint)score->heads;
    p->seq_q = (cl_uint)score->seq_q;
    p->seq_k = (cl_uint)score->seq_k;
    p->scale = score->scale;
    p->softcap = score->softcap;
    p->norm_relu = score->norm == CLATTN_NORM_RELU;
    if (score->flex_id && masks->flex.arena) { /* byte offsets in the arena's buffer */
        const size_t base = masks->flex.arena_offset;
        p->flex_aux0 = base + masks->flex.aux[0];
        p->flex_aux1 = base + masks->flex.aux[1];
        p->flex_aux2 = base + masks->flex.aux[2];
        p->flex_aux3 = base + masks->flex.aux[3];
        p->flex_bm = base + masks->flex.blocks;
        p->flex_bm_s0 = masks->flex.bm_s0;
        p->flex_bm_s1 = masks->flex.bm_s1;
        p->flex_bm_s2 = masks->flex.bm_s2;
        p->flex_count = base + masks->flex.count;
        p->flex_bq = (cl_uint)masks->flex.block_q;
        p->flex_bk = (cl_uint)masks->flex.block_k;
    }
    if (score->dropout) {
        p->dropout_seed = score->dropout_seed;
        p->dropout_offset = score->dropout_offset;
        p->dropout_threshold = score->dropout_threshold;
        p->dropout_scale = score->dropout_scale;
    }
}

void clattn__dropout_fields(double p, uint32_t *threshold, float *scale)
{
    const double t = floor(p * 4294967296.0);
    *threshold = t >= 4294967295.0 ? UINT32_MAX : (uint32_t)t;
    *scale = p < 1.0 ? (float)(1.0 / (1.0 - p)) : 0.0f;
}

/* Philox 4x32-10 (score.cl's philox4x32_10) on the host. */
static void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1)
{
    for (int round = 0; round < 10; ++round) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
        const uint32_t next[4] = {(uint32_t)(p1 >> 32) ^ c[1] ^ k0, (uint32_t)p1,
                                  (uint32_t)(p0 >> 32) ^ c[3] ^ k1, (uint32_t)p0};
        memcpy(c, next, sizeof next);
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

int clattn_dropout_keep(double dropout_p, unsigned long long seed, unsigned long long stream,
                        size_t row, size_t key)
{
    if (!(dropout_p >= 0.0 && dropout_p <= 1.0) || row > UINT32_MAX || key > UINT32_MAX)
        return -1;
    if (dropout_p == 0.0)
        return 1;
    uint32_t threshold;
    float scale;
    clattn__dropout_fields(dropout_p, &threshold, &scale);
    uint32_t c[4] = {(uint32_t)(key >> 2), (uint32_t)row, (uint32_t)stream,
                     (uint32_t)(stream >> 32)};
    philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    return c[key & 3u] >= threshold;
}

static int mask_dtype(const clattn__score_shape *score)
{
    return score->has_mask ? (int)score->mask_dtype : 0;
}
static int has_mask(const clattn__score_shape *score)
{
    return score->has_mask;
}
static int has_key_padding(const clattn__score_shape *score)
{
    return score->has_key_padding;
}
static int band_diagonal(const clattn__score_shape *score)
{
    return clattn__band_diagonal(score);
}
static int norm_relu(const clattn__score_shape *score)
{
    return score->norm == CLATTN_NORM_RELU;
}
static int has_softcap(const clattn__score_shape *score)
{
    return score->softcap > 0.0f;
}
static int kv_paged(const clattn__score_shape *score)
{
    return score->kv_paged;
}
static int varlen(const clattn__score_shape *score)
{
    return score->varlen;
}
static int dropout(const clattn__score_shape *score)
{
    return score->dropout;
}
static int kv_step(const clattn__score_shape *score)
{
    return score->kv_step;
}
static int flex_source(const clattn__score_shape *score)
{
    return score->flex_id;
}
static int flex_score(const clattn__score_shape *score)
{
    return score->flex_id && score->flex_score;
}
static int flex_mask(const clattn__score_shape *score)
{
    return score->flex_id && score->flex_mask;
}
static int flex_grad(const clattn__score_shape *score)
{
    return score->flex_id && score->flex_grad;
}
static int flex_blocks(const clattn__score_shape *score)
{
    return score->flex_id && score->flex_blocks;
}
static int flex_count(const clattn__score_shape *score)
{
    return score->flex_id && score->flex_count;
}

/* The switches: the macro (score.cl says what each means), its value for a score shape, and
 * the families that compile it in. */
static const struct score_switch {
    const char *macro;
    int (*value)(const clattn__score_shape *score);
    unsigned families;
    bool omit_zero; /* left out at 0 (score.cl's default): plans without it keep their keys */
} switches[] = {
    {"MASK_DTYPE", mask_dtype,
     CLATTN__FAMILY_SOFTMAX | CLATTN__FAMILY_FLASH | CLATTN__FAMILY_FLASH_GPU |
         CLATTN__FAMILY_FLASH_CPU,
     false},
    {"SCORE_MASK", has_mask, CLATTN__FAMILY_FLASH_CPU | CLATTN__FAMILY_FLASH_GPU, false},
    {"SCORE_KPAD", has_key_padding, CLATTN__FAMILY_FLASH_CPU | CLATTN__FAMILY_FLASH_GPU, false},
    {"SCORE_BAND", band_diagonal, CLATTN__FAMILY_FLASH_CPU, false},
    {"SCORE_RELU", norm_relu, CLATTN__FAMILY_FLASH_CPU | CLATTN__FAMILY_FLASH_GPU, false},
    {"SCORE_SOFTCAP", has_softcap, CLATTN__FAMILY_FLASH_GPU, false},
    {"KV_PAGED", kv_paged,
     CLATTN__FAMILY_FLASH | CLATTN__FAMILY_FLASH_GPU | CLATTN__FAMILY_FLASH_CPU, false},
    {"VARLEN", varlen, CLATTN__FAMILY_FLASH | CLATTN__FAMILY_FLASH_GPU | CLATTN__FAMILY_FLASH_CPU,
     false},
    {"SCORE_DROPOUT", dropout,
     CLATTN__FAMILY_SOFTMAX | CLATTN__FAMILY_FLASH | CLATTN__FAMILY_FLASH_GPU |
         CLATTN__FAMILY_FLASH_CPU,
     false},
    /* a KV cache's decode step in one launch (flash_cpu.cl's KV_STEP) */
    {"KV_STEP", kv_step, CLATTN__FAMILY_FLASH_CPU | CLATTN__FAMILY_FLASH_GPU, true},
    /* user score functions (score.cl's FLEX_*): FLEX_SRC names the context's registered
     * source that build_program puts ahead of score.cl (programs.c), so the cache key holds it */
    {"FLEX_SRC", flex_source, CLATTN__FAMILY_ALL, true},
    {"FLEX_SCORE", flex_score, CLATTN__FAMILY_ALL, true},
    {"FLEX_MASK", flex_mask, CLATTN__FAMILY_ALL, true},
    {"FLEX_GRAD", flex_grad, CLATTN__FAMILY_ALL, true},
    {"FLEX_BLOCKS", flex_blocks,
     CLATTN__FAMILY_FLASH | CLATTN__FAMILY_FLASH_GPU | CLATTN__FAMILY_FLASH_CPU, true},
    {"FLEX_COUNT", flex_count,
     CLATTN__FAMILY_FLASH | CLATTN__FAMILY_FLASH_GPU | CLATTN__FAMILY_FLASH_CPU, true},
};

size_t clattn__score_defines(const clattn__score_shape *score, unsigned family, clattn_define *out)
{
    size_t count = 0;
    for (size_t i = 0; i < sizeof switches / sizeof switches[0]; ++i) {
        const int value = switches[i].value(score);
        if (!(switches[i].families & family) || (switches[i].omit_zero && value == 0))
            continue;
        out[count++] = (clattn_define){switches[i].macro, value};
    }
    return count;
}
