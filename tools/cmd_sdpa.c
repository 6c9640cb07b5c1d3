/* clattn sdpa: scaled dot-product attention on .npy files, no projections (the core of ONNX's
 * Attention operator and of torch.nn.functional.scaled_dot_product_attention). */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char sdpa_usage[] =
    "Attention with no projections, as ONNX's Attention operator computes it:\n"
    "  Y = softmax(cap(scale * Q Kᵀ) + mask) V,  cap(s) = C tanh(s / C) with --softcap C.\n"
    "Inputs (float32, float64, float16 or bfloat16 .npy, or a safetensors file of one tensor,\n"
    "FILE:NAME for one of several: read as float32), all of rank 4 or all of rank 3:\n"
    "  rank 4: Q (B, Hq, Lq, d), K (B, Hkv, Lk, d), V (B, Hkv, Lk, dv);\n"
    "  rank 3: Q (B, Lq, Hq * d), K (B, Lk, Hkv * d), V (B, Lk, Hkv * dv) with --q-heads Hq and\n"
    "          --kv-heads Hkv (default Hq).\n"
    "Grouped-query attention: Hkv divides Hq; query head h attends with K/V head h / (Hq / Hkv).\n"
    "--attn-mask: bool, True = attend by default (ONNX, torch's SDPA; `clattn run` and\n"
    "  `clattn additive` read True = masked, as nn.MultiheadAttention), --mask-true\n"
    "  attend|masked says which (a note on stderr when a bool mask comes without it); or float\n"
    "  (added to the scores); of rank 1..4,\n"
    "  broadcast (right-aligned, dims of 1) to (B, Hq, Lq, Lk); a last dim shorter than Lk is\n"
    "  padded as masked (ONNX's rule). A row with every key masked gives zeros.\n"
    "--past-key/--past-value (B, Hkv, P, d) / (B, Hkv, P, dv): a KV cache; attention runs over\n"
    "  the P past keys then the new ones, and --present-key-out/--present-value-out write them\n"
    "  (B, Hkv, P + Lk, d).\n"
    "--nonpad-kv-seqlen (B) int64: batch b has keys 0 .. N[b] - 1 (a static cache's fill).\n"
    "--causal: query i attends to key j only if j <= i + offset; --causal-align onnx (default,\n"
    "  ONNX's rule): offset P with --past-key, else N[b] - Lq with --nonpad-kv-seqlen, else 0;\n"
    "  top-left: 0; bottom-right: the batch's keys - Lq (the queries are the last rows of the\n"
    "  sequence, PyTorch's causal_lower_right).\n"
    "--window LEFT,RIGHT: query i attends to keys p - LEFT .. p + RIGHT, p = i + the offset\n"
    "  above; -1 leaves a side unbounded (ONNX's left_window_size, right_window_size).\n"
    "--alibi: ALiBi (not an ONNX attribute): query head h adds -m_h |i + Lk - Lq - j| to the\n"
    "  score of key j (Lk: all keys, past included; N[b] with --nonpad-kv-seqlen), the paper's\n"
    "  slopes m_h; --alibi-slopes S.npy: your own, (Hq) or (B, Hq) floats.\n"
    "--rope: rotary position embeddings on every head of Q and of the new keys K, before\n"
    "  attention (ONNX's RotaryEmbedding in front of Attention): query row i and key row j at\n"
    "  positions P + i and P + j (--rope-start P, default 0; a decode step after P tokens:\n"
    "  P), pairs (x[j], x[j + N/2]) (--rope-style halves, the default) or (x[2j], x[2j + 1])\n"
    "  (pairs) of the first N columns (--rope-dims, default d), turned by pos * B^(-2j/N)\n"
    "  (--rope-base, default 10000). --past-key holds rotated keys already; the present key\n"
    "  gets them, then the rotated new ones. Not with --nonpad-kv-seqlen.\n"
    "--scale: default 1/sqrt(d). --norm relu: relu(s) / sum (instead of softmax).\n"
    "--path: auto (fused, never forming the Lq x Lk scores), fused or unfused.\n";
/* More of the help (C11 compilers need not take string literals over 4095 characters). */
static const char sdpa_usage_serving[] =
    "--k-pages KP.npy --v-pages VP.npy --block-table BT.npy --seqlens-k N.npy: a paged KV\n"
    "  cache (FlashAttention's flash_attn_with_kvcache layout): KP (pages, page_size, Hkv, d),\n"
    "  VP (pages, page_size, Hkv, dv), BT (B, blocks) and N (B) int32 or int64; key j of\n"
    "  sequence b is slot j % page_size of page BT[b, j / page_size], its keys 0 .. N[b] - 1.\n"
    "  Q rank 4; --causal per sequence (--causal-align bottom-right: the queries are the last\n"
    "  Lq keys of each sequence). The fused path only.\n"
    "--sinks S.npy: attention sinks (GPT-OSS), (Hq) floats: head h's logit joins each row's\n"
    "  softmax denominator and takes no value, p_ij = exp(s_ij - m) / (sum_j exp(s_ij - m) +\n"
    "  exp(S[h] - m)), m the max over the row's scores and S[h]; -inf is no sink. With every\n"
    "  mask, window and causal form and grouped heads; not with --norm relu.\n"
    "--kv-dtype f32|q8_0|q4_0: quantize K and V (or the pages) on the device into llama.cpp's\n"
    "  block formats (32 values per block: q8_0 an fp16 scale amax/127 and int8 values, q4_0\n"
    "  an fp16 scale max/-8 and 4-bit values), then attend over them, dequantized as they are\n"
    "  read (the fused path; head sizes multiples of 32; not with past/present, --rope,\n"
    "  --qk-out or --ring). --kv-dtype fp8_e4m3|fp8_e5m2: vLLM's fp8 cache, a byte a value\n"
    "  (OCP e4m3fn, max 448; e5m2, max 57344), encoded from K / --k-scale and V / --v-scale\n"
    "  (default 1; rounded to nearest even, saturated) and read as code * scale; any head\n"
    "  size.\n"
    "--cu-seqlens-q CQ.npy --cu-seqlens-k CK.npy: packed variable-length batches\n"
    "  (FlashAttention's varlen functions): Q (total_q, Hq, d), K (total_k, Hkv, d) and V\n"
    "  (total_k, Hkv, dv), rank 3 with no padding; CQ and CK (B + 1) int32 or int64 offsets\n"
    "  from 0, non-decreasing, ending at total_q and total_k: sequence i is the rows\n"
    "  CQ[i] .. CQ[i+1] - 1 of Q and CK[i] .. CK[i+1] - 1 of K and V, and attends only within\n"
    "  itself. --causal and --window per sequence (--causal-align bottom-right, or onnx: the\n"
    "  queries are the last rows of their sequence); --alibi-slopes (Hq) or (B, Hq). Y is\n"
    "  (total_q, Hq, dv). The fused path; not with masks, past/present, --nonpad-kv-seqlen,\n"
    "  pages, --rope, --qk-out or --ring.\n";
/* The rest of the help: C11 compilers need not take string literals over 4095 characters. */
static const char sdpa_usage_outputs[] =
    "Output: Y with Q's rank, (B, Hq, Lq, dv) or (B, Lq, Hq * dv), written to --out or printed\n"
    "  when small. Files are written in ONNX's types: Y and --qk-out in Q's dtype, the present\n"
    "  key and value in K's and V's (float16, bfloat16, float32; float64 inputs give float32).\n"
    "  clattn computes in float32 and rounds each output once, to nearest even.\n"
    "--qk-out S.npy (B, Hq, Lq, P + Lk), unfused path: the scores by --qk-output-mode (ONNX's\n"
    "  qk_matmul_output_mode): 0 scale * Q Kᵀ, 1 after soft-capping, 2 after the masks too\n"
    "  (-inf where a key is dropped), 3 the softmax probabilities.\n"
    "--attn-png A.png: the weights of batch 0 as a heatmap, one panel per head (query position\n"
    "  down, key position across; the unfused path's weights, as --qk-output-mode 3 writes\n"
    "  them); --png-scale row (default), log or global (see `clattn run --help`). Masked cells\n"
    "  are grey for --causal and --window on the main diagonal and for an (Lq, Lk) mask.\n"
    "--softmax-precision: ONNX's type code: 1 (float, the default) or 11 (double: the unfused\n"
    "  path, on devices with cl_khr_fp64); 10 and 16 (16-bit) are not supported.\n"
    "--ring (under mpirun -np N; a build with -DCLATTN_MPI=ON): ring attention over the ranks:\n"
    "  every rank reads the same files, takes its rows (--ring-layout contiguous: L / N rows\n"
    "  each, the default; zigzag: chunks r and 2N-1-r of 2N, balancing causal work), and rank 0\n"
    "  writes or prints Y. --causal, --window (top-left, or bottom-right: at Lk - Lq),\n"
    "  --softcap, --scale, grouped heads, --nonpad-kv-seqlen (with --causal or --window:\n"
    "  --causal-align top-left), K and V of another length (cross-attention, split over the\n"
    "  ranks alike), float16 or bfloat16 files (the ring runs in their type: half the bytes\n"
    "  travel), --sinks; --ring-timing prints each rank's compute and communication times.\n"
    "Exit status: 0 success, 1 device or library failure, 2 bad options or input files.\n";
/* The backward's help. */
static const char sdpa_usage_backward[] =
    "--backward --grad-out DO.npy: the gradients (training): the forward runs (fused, keeping\n"
    "  each row's log-sum-exp), then clattn_sdpa_backward_plan_create's plan on the same\n"
    "  inputs and options, FlashAttention-2's way (the weights recomputed, never stored). DO is\n"
    "  dL/dY, Y's shape ((B, Hq, Lq, dv) or (B, Lq, Hq * dv)). Written: --grad-q-out,\n"
    "  --grad-k-out, --grad-v-out (Q's, K's and V's shapes and dtypes; with grouped heads a K/V\n"
    "  head's gradient sums its query heads), --grad-mask-out (a float --attn-mask: the mask's\n"
    "  shape, summed over its broadcast dims, in its dtype), --grad-sinks-out (with --sinks:\n"
    "  (Hq) float32); at least one of them. --out still writes Y (not printed without it).\n"
    "  Takes masks, --nonpad-kv-seqlen, --causal and its alignments, --window, grouped heads,\n"
    "  --softcap, --scale, --alibi, --norm relu, --sinks, --dropout (the forward's mask,\n"
    "  regenerated), packed sequences (--cu-seqlens-q: DO and the gradients packed as Q, K,\n"
    "  V); the library refuses (exit 2) past/present, --rope, pages, --qk-out and\n"
    "  --kv-dtype; not with --ring. --path unfused (or\n"
    "  --softmax-precision 11): both passes unfused, the backward's reference path (matmuls\n"
    "  around the Lq x Lk matrices, the weights recomputed whole; no --grad-sinks-out).\n";
/* Dropout's help. */
static const char sdpa_usage_dropout[] =
    "--dropout P [--seed S] [--dropout-offset N]: dropout on the attention weights (training;\n"
    "  torch's dropout_p), in the forward and, with --backward, the same mask in the backward\n"
    "  (clattn_sdpa_desc's dropout_p, dropout_seed, dropout_offset): after normalisation each\n"
    "  weight is kept with probability 1 - P and scaled by 1 / (1 - P), or zeroed. P from 0\n"
    "  (off, the default) to 1 (every weight zeroed: Y = 0). Which weights are kept is a pure\n"
    "  function of S, N and the weight's (b, h, i, j), the same on every device: Philox\n"
    "  4x32-10 keyed by S (default 0: a run without --seed is reproducible), counter (j / 4,\n"
    "  i, stream), stream N + b * Hq + h (N default 0; the next batch's fresh masks: N plus\n"
    "  B * Hq); its output word j % 4, an unsigned 32-bit u, keeps the weight when\n"
    "  u >= floor(P * 2^32) (clattn_dropout_keep computes it). S and N: whole numbers\n"
    "  0 .. 2^64 - 1. --seed and --dropout-offset without --dropout (or with P = 0) change\n"
    "  nothing. --qk-output-mode 3 --qk-out writes the weights after dropout (as torch's\n"
    "  nn.MultiheadAttention returns them). Not with pages, packed sequences, --kv-dtype or\n"
    "  --ring.\n";

/* User score functions' help. */
static const char sdpa_usage_flex[] =
    "--score-mod FILE.cl [--aux NAME=FILE ...] [--block-mask BQ,BK]: user score and mask\n"
    "  functions (PyTorch's FlexAttention; clattn_sdpa_desc.flex), OpenCL C built into the\n"
    "  attention kernels, forward and --backward, any of\n"
    "    float score_mod(float score, int b, int h, int q_idx, int kv_idx);\n"
    "    int   mask_mod(int b, int h, int q_idx, int kv_idx);  /* nonzero: keep the key */\n"
    "    float score_mod_grad(float score, int b, int h, int q_idx, int kv_idx);\n"
    "  The file defines those whose name stands at file scope (outside any braces or\n"
    "  parentheses; comments, strings and # lines skipped) followed by '('. score is the\n"
    "  scaled, soft-capped score (plus ALiBi); --backward needs score_mod_grad (d score_mod /\n"
    "  d score) with a score_mod. --aux NAME=FILE (up to 4, in order): a .npy the functions\n"
    "  read as the pointer NAME at flat indices: float32 (float64 rounded) as float, int32 or\n"
    "  int64 (values within +-2^24) as int, bool or uint8 as uchar; no gradient. A source\n"
    "  that does not build: one line, the compiler's first diagnostic on its own lines\n"
    "  (score_mod:LINE:COL), exit 2. --score-mod @tree: speculative decoding's tree mask\n"
    "  (clattn_flex_tree_mask), with --aux tree_bits=BITS.npy (uint8: each sequence's draft\n"
    "  block, bit (i * n + j), LSB first) --aux tree_meta=META.npy (int32 (batch, 3): the\n"
    "  first draft key, the draft count, the bits' byte offset). --block-mask BQ,BK: the\n"
    "  block mask of BQ x BK blocks\n"
    "  made on the device from mask_mod (clattn_flex_block_mask) for both passes, so the\n"
    "  fused kernels skip the tiles it empties; the fused path only (not with --path unfused,\n"
    "  --qk-out, --attn-png, --softmax-precision 11, past/present, --rope or packed\n"
    "  sequences).\n";

/* --aux NAME=FILE (repeated): the auxiliary tensors of --score-mod, bound in the order given to
 * flex_aux0, flex_aux1, ... under their names. */
typedef struct sdpa_aux {
    size_t count;
    char names[CLATTN_FLEX_AUX_MAX][64]; /* C identifiers (the library's limit: under 64) */
    const char *paths[CLATTN_FLEX_AUX_MAX];
} sdpa_aux;

typedef struct sdpa_options {
    const char *q, *k, *v, *mask, *out;
    const char *past_k, *past_v, *present_k, *present_v, *nonpad, *qk_out;
    const char *sinks; /* --sinks S.npy */
    const char *k_pages, *v_pages, *block_table, *seqlens_k; /* a paged cache */
    bool paged;
    const char *cu_q, *cu_k; /* packed variable-length batches */
    bool varlen;
    bool check_only; /* cmd_sdpa_check: stop before the ring and any device work */
    cli_rope rope; /* --rope and its options */
    int qk_mode;   /* --qk-output-mode, 0 .. 3 */
    bool qk_mode_given;
    bool softmax_f64;         /* --softmax-precision 11 */
    size_t q_heads, kv_heads; /* 0: not given */
    cli_score score; /* --causal, --causal-align, --window, --softcap, --scale, --norm... */
    cli_masks masks; /* --mask-true (default attend, as ONNX) */
    cli_exec exec;   /* --device */
    bool ring, ring_timing, ring_option; /* --ring, --ring-timing, either ring option */
    int ring_zigzag;                     /* --ring-layout zigzag */
    bool ring_layout_given;
    cli_heatmap heatmap;   /* --attn-png: the weights of batch 0 as a heatmap, --png-scale */
    clattn_dtype kv_dtype;  /* --kv-dtype: F32 (as given), Q8_0, Q4_0, FP8_E4M3 or FP8_E5M2 */
    float k_scale, v_scale; /* --k-scale, --v-scale: FP8's per-tensor scales (0: 1) */
    size_t v_from_k;        /* --v-from-k DV: v is k's rows' first DV columns (0: --v) */
    bool backward;         /* --backward: the gradients from --grad-out */
    const char *grad_out, *grad_q, *grad_k, *grad_v, *grad_mask, *grad_sinks;
    double dropout_p;                  /* --dropout (0: off) */
    unsigned long long dropout_seed;   /* --seed (default 0) */
    unsigned long long dropout_offset; /* --dropout-offset (default 0) */
    const char *score_mod;             /* --score-mod FILE.cl: user score and mask functions */
    sdpa_aux aux;                      /* --aux NAME=FILE, up to CLATTN_FLEX_AUX_MAX */
    size_t block_sizes[2];             /* --block-mask BQ,BK (0, 0: none) */
} sdpa_options;

static const cli_choice kv_dtype_choices[] = {{"f32", CLATTN_DTYPE_F32},
                                              {"q8_0", CLATTN_DTYPE_Q8_0},
                                              {"q4_0", CLATTN_DTYPE_Q4_0},
                                              {"fp8_e4m3", CLATTN_DTYPE_FP8_E4M3},
                                              {"fp8_e5m2", CLATTN_DTYPE_FP8_E5M2},
                                              {NULL, 0}};

/* --kv-dtype's name of a dtype */
static const char *kv_dtype_name(clattn_dtype dtype)
{
    for (const cli_choice *c = kv_dtype_choices; c->name; ++c)
        if (c->value == (int)dtype)
            return c->name;
    return "?";
}

enum {
    M_Q,
    M_K,
    M_V,
    M_MASK,
    M_OUT,
    M_PAST_K,
    M_PAST_V,
    M_PRESENT_K,
    M_PRESENT_V,
    M_NONPAD,
    M_SCORES,
    M_ALIBI,
    M_SINKS,
    M_BLOCK_TABLE,
    M_KQ, /* --kv-dtype: the quantized keys and values */
    M_VQ,
    M_CU_Q, /* packed sequences' offsets */
    M_CU_K,
    M_LSE, /* the backward: the forward's lse, dO, and the gradients */
    M_GRAD_OUT,
    M_GRAD_Q,
    M_GRAD_K,
    M_GRAD_V,
    M_GRAD_MASK,
    M_GRAD_SINKS,
    M_AUX0, /* --score-mod: the auxiliary tensors (M_AUX0 + i), and the block mask */
    M_AUX1,
    M_AUX2,
    M_AUX3,
    M_BLOCK_MASK,
    M_COUNT
};

typedef struct sdpa_data {
    clattn_array q, k, v, mask, past_k, past_v, nonpad, slopes, sinks, table, cu_file[2];
    int32_t *block_table; /* the paged cache's table as I32 */
    int32_t *cu[2];       /* packed sequences' offsets (q, k) as I32 */
    size_t sequences, max_len[2]; /* their count, and the longest q and k spans */
    float *mask_f32;    /* the mask as added floats, padded to Lk (float masks) */
    uint8_t *mask_keep; /* the mask as keep bytes, padded to Lk (bool masks) */
    int32_t *counts;    /* nonpad_kv_seqlen as I32 */
    float *out, *present_k, *present_v, *scores;
    clattn_array grad_out; /* --backward: dO */
    float *grad[5];        /* dQ, dK, dV, the mask's and the sinks' */
    char *flex_source;     /* --score-mod: the file's text */
    unsigned flex_functions; /* clattn_flex_flags: what it defines */
    clattn_array aux_file[CLATTN_FLEX_AUX_MAX]; /* --aux files as read */
    void *aux[CLATTN_FLEX_AUX_MAX]; /* and as bound: float, int32_t or uint8_t */
    clattn_dtype aux_dtype[CLATTN_FLEX_AUX_MAX];
    cl_mem mem[M_COUNT];
} sdpa_data;

static void sdpa_free(sdpa_data *d)
{
    cli_release_buffers(d->mem, M_COUNT);
    clattn_array *const arrays[] = {
        &d->q,      &d->k,     &d->v,     &d->mask,       &d->past_k,     &d->past_v,  &d->nonpad,
        &d->slopes, &d->sinks, &d->table, &d->cu_file[0], &d->cu_file[1], &d->grad_out};
    void *const blocks[] = {d->cu[0],     d->cu[1],     d->block_table, d->counts,
                            d->present_k, d->present_v, d->scores,      d->mask_f32,
                            d->mask_keep, d->out,       d->flex_source, d->grad[0],
                            d->grad[1],   d->grad[2],   d->grad[3],     d->grad[4]};
    cli_free_all(arrays, CLI_COUNT(arrays), blocks, CLI_COUNT(blocks));
    for (int i = 0; i < CLATTN_FLEX_AUX_MAX; ++i) {
        if (d->aux[i] != d->aux_file[i].data)
            free(d->aux[i]);
        clattn_array_free(&d->aux_file[i]);
    }
}

/* What a fused-only feature (a paged cache, quantized K and V) cannot run with: the first
 * such option given, or NULL. */
static const char *fused_only_conflict(const sdpa_options *o)
{
    return o->past_k                              ? "--past-key"
           : o->present_k                         ? "--present-key-out"
           : o->rope.on                           ? "--rope"
           : o->qk_out                            ? "--qk-out"
           : o->heatmap.png                       ? "--attn-png"
           : o->softmax_f64                       ? "--softmax-precision 11"
           : o->ring                              ? "--ring"
           : o->score.path == CLATTN_PATH_UNFUSED ? "--path unfused"
                                                  : NULL;
}

static int parse_softmax_precision(const cli_args *args, const char *value, void *target)
{
    size_t number = 0;
    if (!cli_parse_size(args->command, "--softmax-precision", value, 0, &number))
        return -1;
    if (number != 1 && number != 11)
        return cli_fail(args->command, -1,
                        "--softmax-precision %s: clattn normalises in float (1) or double (11); "
                        "%s is not supported",
                        value,
                        number == 10   ? "float16 (10)"
                        : number == 16 ? "bfloat16 (16)"
                                       : "that type");
    *(bool *)target = number == 11;
    return 1;
}

static int parse_probability(const cli_args *args, const char *value, void *target)
{
    return cli_parse_probability(args->command, args->name, value, target) ? 1 : -1;
}

static int parse_u64(const cli_args *args, const char *value, void *target)
{
    return cli_parse_u64(args->command, args->name, value, target) ? 1 : -1;
}

/* Whether name is a C identifier the library takes as an aux name (under 64 characters). */
static bool is_identifier(const char *name, size_t length)
{
    if (length == 0 || length >= 64 || !(isalpha((unsigned char)name[0]) || name[0] == '_'))
        return false;
    for (size_t i = 0; i < length; ++i)
        if (!(isalnum((unsigned char)name[i]) || name[i] == '_'))
            return false;
    return true;
}

/* --aux NAME=FILE: the next auxiliary tensor, in the order given. */
static int parse_aux(const cli_args *args, const char *value, void *target)
{
    sdpa_aux *aux = target;
    const char *equals = strchr(value, '=');
    if (equals == NULL || equals[1] == '\0')
        return cli_fail(args->command, -1, "--aux: '%s' is not NAME=FILE (e.g. bias=bias.npy)",
                        value);
    const size_t length = (size_t)(equals - value);
    if (!is_identifier(value, length))
        return cli_fail(args->command, -1,
                        "--aux: '%.*s' is not a C identifier (letters, digits and '_', not "
                        "starting with a digit; under 64 characters)",
                        (int)(length < 200 ? length : 200), value);
    if (aux->count == CLATTN_FLEX_AUX_MAX)
        return cli_fail(args->command, -1, "--aux: at most %d auxiliary tensors",
                        (int)CLATTN_FLEX_AUX_MAX);
    for (size_t i = 0; i < aux->count; ++i)
        if (strlen(aux->names[i]) == length && strncmp(aux->names[i], value, length) == 0)
            return cli_fail(args->command, -1, "--aux: the name '%s' is given twice",
                            aux->names[i]);
    memcpy(aux->names[aux->count], value, length);
    aux->names[aux->count][length] = '\0';
    aux->paths[aux->count++] = equals + 1;
    return 1;
}

/* --block-mask BQ,BK: two block sizes >= 1. */
static int parse_block_mask(const cli_args *args, const char *value, void *target)
{
    size_t *sizes = target, count = 0;
    if (!cli_parse_size_list(args->command, "--block-mask", value, sizes, 2, &count))
        return -1;
    if (count != 2)
        return cli_fail(args->command, -1,
                        "--block-mask: '%s' is not BQ,BK (the query and key block sizes)", value);
    return 1;
}

static const cli_choice qk_mode_choices[] = {{"0", 0}, {"1", 1}, {"2", 2}, {"3", 3}, {NULL, 0}};
static const cli_choice ring_layout_choices[] = {{"contiguous", 0}, {"zigzag", 1}, {NULL, 0}};

#define AT(field) CLI_AT(sdpa_options, field)
#define GIVEN(field) CLI_GIVEN(sdpa_options, field)
static const cli_option sdpa_table[] = {
    {CLI_OPT("--q", CLI_PATH, AT(q), "Q.npy", "the queries, (B, Hq, Lq, d) or (B, Lq, Hq * d)"),
     .flags = CLI_REQUIRED},
    {CLI_OPT("--k", CLI_PATH, AT(k), "K.npy", "the keys, (B, Hkv, Lk, d) or (B, Lk, Hkv * d)")},
    {CLI_OPT("--v", CLI_PATH, AT(v), "V.npy", "the values, (B, Hkv, Lk, dv) or (B, Lk, Hkv * dv)")},
    {CLI_OPT("--v-from-k", CLI_SIZE, AT(v_from_k), "DV",
             "v: the first DV columns of k's rows, one buffer (absorbed MLA; no --v)"),
     .min = 1},
    {CLI_OPT("--k-pages", CLI_PATH, AT(k_pages), "KP.npy",
             "a paged cache's keys (pages, size, Hkv, d)")},
    {CLI_OPT("--v-pages", CLI_PATH, AT(v_pages), "VP.npy", "a paged cache's values")},
    {CLI_OPT("--block-table", CLI_PATH, AT(block_table), "BT.npy",
             "a paged cache's table (B, blocks)")},
    {CLI_OPT("--seqlens-k", CLI_PATH, AT(seqlens_k), "N.npy", "a paged cache's key counts (B)")},
    {CLI_OPT("--q-heads", CLI_SIZE, AT(q_heads), "H", "Q's heads (rank 3 inputs)"), .min = 1},
    {CLI_OPT("--kv-heads", CLI_SIZE, AT(kv_heads), "H", "K's and V's heads (rank 3; default Hq)"),
     .min = 1},
    {CLI_OPT("--cu-seqlens-q", CLI_PATH, AT(cu_q), "CQ.npy",
             "packed sequences' query offsets (B + 1)")},
    {CLI_OPT("--cu-seqlens-k", CLI_PATH, AT(cu_k), "CK.npy",
             "packed sequences' key offsets (B + 1)")},
    {CLI_OPT("--attn-mask", CLI_PATH, AT(mask), "M.npy",
             "bool (True = attend) or float (added), broadcast to (B, Hq, Lq, Lk)")},
    CLI_USE(cli_masks_group, sdpa_options, masks, CLI_MASKS_TRUE),
    {CLI_OPT("--past-key", CLI_PATH, AT(past_k), "PK.npy",
             "a KV cache's past keys (B, Hkv, P, d)")},
    {CLI_OPT("--past-value", CLI_PATH, AT(past_v), "PV.npy", "a KV cache's past values")},
    {CLI_OPT("--nonpad-kv-seqlen", CLI_PATH, AT(nonpad), "N.npy",
             "batch b has keys 0 .. N[b] - 1")},
    CLI_USE(cli_score_group, sdpa_options, score, 0),
    {CLI_OPT("--sinks", CLI_PATH, AT(sinks), "S.npy", "attention sinks, one logit per query head")},
    {CLI_OPT("--kv-dtype", CLI_CHOICE, AT(kv_dtype), NULL, "quantize K and V on the device"),
     .choices = kv_dtype_choices},
    {CLI_OPT("--k-scale", CLI_FLOAT, AT(k_scale), "S", "--kv-dtype fp8_*: K's scale")},
    {CLI_OPT("--v-scale", CLI_FLOAT, AT(v_scale), "S", "--kv-dtype fp8_*: V's scale")},
    CLI_USE(cli_rope_group, sdpa_options, rope, 0),
    {CLI_OPT("--present-key-out", CLI_PATH, AT(present_k), "PK.npy", "write past + new keys")},
    {CLI_OPT("--present-value-out", CLI_PATH, AT(present_v), "PV.npy", "write past + new values")},
    {CLI_OPT("--qk-output-mode", CLI_CHOICE, AT(qk_mode), NULL,
             "what --qk-out holds (ONNX's modes)"),
     .choices = qk_mode_choices, .given = GIVEN(qk_mode_given)},
    {CLI_OPT("--qk-out", CLI_PATH, AT(qk_out), "S.npy", "write the scores or weights (unfused)")},
    {CLI_OPT("--softmax-precision", CLI_CUSTOM, AT(softmax_f64), "1|11",
             "ONNX's type code: float (1, default) or double (11)"),
     .handle = parse_softmax_precision},
    CLI_USE(cli_exec_group, sdpa_options, exec, 0),
    {CLI_OPT("--out", CLI_PATH, AT(out), "Y.npy", "write Y (else it is printed when small)")},
    CLI_USE(cli_heatmap_group, sdpa_options, heatmap, 0),
    {CLI_OPT("--ring", CLI_FLAG, AT(ring), NULL, "ring attention over MPI ranks (mpirun)")},
    {CLI_OPT("--ring-layout", CLI_CHOICE, AT(ring_zigzag), NULL,
             "with --ring: the rows of each rank"),
     .choices = ring_layout_choices, .given = GIVEN(ring_layout_given)},
    {CLI_OPT("--ring-timing", CLI_FLAG, AT(ring_timing), NULL, "with --ring: print the times")},
    {CLI_OPT("--backward", CLI_FLAG, AT(backward), NULL, "the gradients from --grad-out")},
    {CLI_OPT("--grad-out", CLI_PATH, AT(grad_out), "DO.npy", "dL/dY, Y's shape")},
    {CLI_OPT("--grad-q-out", CLI_PATH, AT(grad_q), "DQ.npy", "write dL/dQ")},
    {CLI_OPT("--grad-k-out", CLI_PATH, AT(grad_k), "DK.npy", "write dL/dK")},
    {CLI_OPT("--grad-v-out", CLI_PATH, AT(grad_v), "DV.npy", "write dL/dV")},
    {CLI_OPT("--grad-mask-out", CLI_PATH, AT(grad_mask), "DM.npy",
             "write the float mask's gradient")},
    {CLI_OPT("--grad-sinks-out", CLI_PATH, AT(grad_sinks), "DS.npy", "write the sinks' gradient")},
    {CLI_OPT("--dropout", CLI_CUSTOM, AT(dropout_p), "P", "dropout on the weights, probability P"),
     .handle = parse_probability},
    {CLI_OPT("--seed", CLI_CUSTOM, AT(dropout_seed), "S", "dropout's Philox key (default 0)"),
     .handle = parse_u64},
    {CLI_OPT("--dropout-offset", CLI_CUSTOM, AT(dropout_offset), "N", "dropout's first stream"),
     .handle = parse_u64},
    {CLI_OPT("--score-mod", CLI_PATH, AT(score_mod), "FILE.cl",
             "OpenCL C defining score_mod, mask_mod, score_mod_grad (FlexAttention; @tree: "
             "the tree mask)")},
    {CLI_OPT("--aux", CLI_CUSTOM, AT(aux), "NAME=FILE",
             "an array the functions read as NAME; repeated, up to 4 (in order)"),
     .handle = parse_aux, .flags = CLI_REPEATABLE},
    {CLI_OPT("--block-mask", CLI_CUSTOM, AT(block_sizes), "BQ,BK",
             "skip the tiles mask_mod empties (blocks of BQ x BK, fused path)"),
     .handle = parse_block_mask},
};
#undef AT
#undef GIVEN

static const char *const sdpa_help[] = {sdpa_usage,          sdpa_usage_serving,
                                        sdpa_usage_backward, sdpa_usage_dropout,
                                        sdpa_usage_flex,     sdpa_usage_outputs,
                                        NULL};
static const cli_command sdpa_command_spec = CLI_COMMAND("sdpa", sdpa_table, sdpa_help);

/* What --ring (cli_ring.c) takes: CLI_OK, or CLI_BAD_INPUT after the line. */
static int check_ring_options(const sdpa_options *o)
{
    const char *other = o->mask                                ? "--attn-mask"
                        : o->past_k                            ? "--past-key"
                        : o->present_k                         ? "--present-key-out"
                        : o->qk_out                            ? "--qk-out"
                        : o->heatmap.png                       ? "--attn-png"
                        : o->score.alibi                       ? "--alibi"
                        : o->score.alibi_slopes                ? "--alibi-slopes"
                        : o->rope.on                           ? "--rope"
                        : o->softmax_f64                       ? "--softmax-precision"
                        : o->score.norm != CLATTN_NORM_SOFTMAX ? "--norm relu"
                        : o->score_mod                         ? "--score-mod"
                                                               : NULL;
    if (other)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--ring takes --causal, --window, --softcap, --scale, grouped "
                        "heads, --sinks, --nonpad-kv-seqlen and keys of another length, "
                        "not %s",
                        other);
    if (o->nonpad && (o->score.causal || o->score.window.on) &&
        !(o->score.align_given && o->score.align == CLATTN_CAUSAL_TOP_LEFT))
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--ring with --nonpad-kv-seqlen and --causal or --window: give "
                        "--causal-align top-left (the ring's diagonal is the sequence's, "
                        "not each batch's key count as onnx's and bottom-right's are)");
    return CLI_OK;
}

/* --v-from-k DV: v is a view of k's rows, their first DV columns (absorbed multi-head latent
 * attention: d_qk 576, the latent's 512), on the device the same buffer with k's strides; k's
 * file stands for --v (or --k-pages' for --v-pages), sliced on the host for the shape checks. */
static int v_from_k_options(sdpa_options *o)
{
    if (o->v || o->v_pages)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--v-from-k: v is the first DV columns of k's rows; drop %s",
                        o->v ? "--v" : "--v-pages");
    const char *other = o->cu_q || o->cu_k ? "--cu-seqlens-q (rank 3)"
                        : o->past_k        ? "--past-key"
                        : o->present_k     ? "--present-key-out"
                        : o->backward      ? "--backward"
                        : o->ring          ? "--ring"
                        : o->rope.on       ? "--rope"
                                           : NULL;
    if (other)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--v-from-k (v a view of k's rows) cannot be combined with %s", other);
    if (o->k_pages)
        o->v_pages = o->k_pages;
    else
        o->v = o->k;
    return CLI_OK;
}

static int parse_sdpa_options(int argc, char **argv, sdpa_options *o)
{
    const int rc = cli_parse_command(&sdpa_command_spec, argc, argv, o);
    if (rc != CLI_OK)
        return rc;
    o->ring_option = o->ring_timing || o->ring_layout_given;
    if (o->v_from_k && v_from_k_options(o) != CLI_OK)
        return CLI_BAD_INPUT;
    o->paged = o->k_pages || o->v_pages || o->block_table || o->seqlens_k;
    if (o->paged) { /* a paged cache: its pools stand for --k and --v, its counts for N */
        if (!o->k_pages || !o->v_pages || !o->block_table || !o->seqlens_k)
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "a paged cache needs --k-pages, --v-pages, --block-table and "
                            "--seqlens-k together");
        const char *other = o->k      ? "--k"
                            : o->v      ? "--v"
                            : o->nonpad ? "--nonpad-kv-seqlen (--seqlens-k gives the counts)"
                                        : fused_only_conflict(o);
        if (other)
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "--k-pages (a paged cache, the fused path) cannot be combined with %s",
                            other);
        o->k = o->k_pages;
        o->v = o->v_pages;
        o->nonpad = o->seqlens_k;
    }
    o->varlen = o->cu_q || o->cu_k;
    if (o->varlen) { /* packed sequences: the fused path, each attending within itself */
        if (!o->cu_q || !o->cu_k)
            return cli_fail("sdpa", CLI_BAD_INPUT, "--cu-seqlens-q and --cu-seqlens-k go together");
        const char *other = o->paged      ? "--k-pages"
                            : o->mask     ? "--attn-mask"
                            : o->nonpad   ? "--nonpad-kv-seqlen"
                            : o->q_heads  ? "--q-heads (the heads are Q's dim 1)"
                            : o->kv_heads ? "--kv-heads (the heads are K's dim 1)"
                                          : fused_only_conflict(o);
        if (other)
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "--cu-seqlens-q (packed sequences, the fused path) cannot be combined "
                            "with %s",
                            other);
    }
    if (!o->q || !o->k || !o->v)
        return cli_fail("sdpa", CLI_BAD_INPUT, "--q, --k and --v are required (see --help)");
    if (o->score.align_given && !o->score.causal && !o->score.window.on)
        return cli_fail("sdpa", CLI_BAD_INPUT, "--causal-align needs --causal or --window");
    if (!o->past_k != !o->past_v)
        return cli_fail("sdpa", CLI_BAD_INPUT, "--past-key and --past-value go together");
    if (!o->present_k != !o->present_v)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--present-key-out and --present-value-out go together");
    if (o->qk_mode_given && !o->qk_out)
        return cli_fail("sdpa", CLI_BAD_INPUT, "--qk-output-mode needs --qk-out");
    if (o->heatmap.png && o->qk_out && o->qk_mode != 3)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--attn-png draws the weights: with --qk-out, give --qk-output-mode 3 "
                        "(the same weights) or drop one of them");
    if (o->heatmap.png && o->score.path == CLATTN_PATH_FUSED)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--path fused never forms the attention weights: drop --attn-png or use "
                        "--path auto");
    if (o->score.alibi && o->score.alibi_slopes)
        return cli_fail("sdpa", CLI_BAD_INPUT, "give --alibi or --alibi-slopes, not both");
    if (!cli_check_rope("sdpa", &o->rope))
        return CLI_BAD_INPUT;
    if (o->sinks && o->score.norm != CLATTN_NORM_SOFTMAX)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--sinks with --norm relu: attention sinks join a softmax's denominator");
    if (o->past_k && o->nonpad)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--nonpad-kv-seqlen cannot be combined with --past-key (ONNX's rule)");
    if (o->ring_option && !o->ring)
        return cli_fail("sdpa", CLI_BAD_INPUT, "--ring-layout and --ring-timing need --ring");
    if (o->kv_dtype != CLATTN_DTYPE_F32) {
        const char *other = fused_only_conflict(o);
        if (other)
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "--kv-dtype %s (quantized K and V, the fused path) cannot be "
                            "combined with %s",
                            kv_dtype_name(o->kv_dtype), other);
    }
    if (o->dropout_p > 0.0) { /* what the library (or the ring) takes no dropout with */
        const char *other = o->paged                          ? "--k-pages (a paged cache)"
                            : o->varlen                       ? "--cu-seqlens-q (packed)"
                            : o->kv_dtype != CLATTN_DTYPE_F32 ? "--kv-dtype"
                            : o->ring                         ? "--ring"
                                                              : NULL;
        if (other)
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "--dropout (training on dense batches) cannot be combined with %s",
                            other);
    }
    const bool any_grad = o->grad_q || o->grad_k || o->grad_v || o->grad_mask || o->grad_sinks;
    if (o->backward && !o->grad_out)
        return cli_fail("sdpa", CLI_BAD_INPUT, "--backward needs --grad-out DO.npy (dL/dY)");
    if (o->backward && !any_grad)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--backward: give at least one of --grad-q-out, --grad-k-out, "
                        "--grad-v-out, --grad-mask-out and --grad-sinks-out");
    if (!o->backward && (o->grad_out || any_grad))
        return cli_fail("sdpa", CLI_BAD_INPUT, "%s needs --backward",
                        o->grad_out ? "--grad-out"
                        : o->grad_q ? "--grad-q-out"
                        : o->grad_k ? "--grad-k-out"
                        : o->grad_v ? "--grad-v-out"
                        : o->grad_mask ? "--grad-mask-out"
                                       : "--grad-sinks-out");
    if (o->backward && o->ring)
        return cli_fail("sdpa", CLI_BAD_INPUT, "--backward cannot be combined with --ring");
    if (o->grad_mask && !o->mask)
        return cli_fail("sdpa", CLI_BAD_INPUT, "--grad-mask-out needs a float --attn-mask");
    if (o->grad_sinks && !o->sinks)
        return cli_fail("sdpa", CLI_BAD_INPUT, "--grad-sinks-out needs --sinks");
    if (!o->score_mod && (o->aux.count || o->block_sizes[0]))
        return cli_fail("sdpa", CLI_BAD_INPUT, "%s needs --score-mod FILE.cl",
                        o->aux.count ? "--aux" : "--block-mask");
    if (o->block_sizes[0]) { /* the fused kernels skip tiles: dense batches, the fused path */
        const char *other =
            o->varlen ? "--cu-seqlens-q (packed sequences)" : fused_only_conflict(o);
        if (other)
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "--block-mask (the fused path) cannot be combined with %s", other);
    }
    /* Before any work: an output that cannot be written fails now, not after the run. */
    if (!cli_check_output("sdpa", "--out", o->out) ||
        !cli_check_output("sdpa", "--grad-q-out", o->grad_q) ||
        !cli_check_output("sdpa", "--grad-k-out", o->grad_k) ||
        !cli_check_output("sdpa", "--grad-v-out", o->grad_v) ||
        !cli_check_output("sdpa", "--grad-mask-out", o->grad_mask) ||
        !cli_check_output("sdpa", "--grad-sinks-out", o->grad_sinks) ||
        !cli_check_output("sdpa", "--present-key-out", o->present_k) ||
        !cli_check_output("sdpa", "--present-value-out", o->present_v) ||
        !cli_check_output("sdpa", "--qk-out", o->qk_out) ||
        !cli_check_output("sdpa", "--attn-png", o->heatmap.png))
        return CLI_BAD_INPUT;
    return o->ring ? check_ring_options(o) : CLI_OK;
}

static int load(const char *path, clattn_array *out, bool mask)
{
    if (cli_read_array("sdpa", path, out) != CLI_OK)
        return CLI_BAD_INPUT;
    if (!mask && (out->source == CLATTN_IO_BOOL || out->source == CLATTN_IO_INT))
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "%s: %s array; expected float32, float64, float16 or bfloat16", path,
                        out->source == CLATTN_IO_INT ? "an integer" : "a bool/uint8");
    if (mask && out->source == CLATTN_IO_INT)
        return cli_fail("sdpa", CLI_BAD_INPUT, "%s: an integer mask; expected bool or float", path);
    return CLI_OK;
}

static const char *shape_text(const clattn_array *a, char *buffer, size_t size)
{
    int used = snprintf(buffer, size, "(");
    for (int i = 0; i < a->ndim && used > 0 && (size_t)used < size; ++i)
        used += snprintf(buffer + used, size - (size_t)used, i ? ", %zu" : "%zu", a->shape[i]);
    if (used > 0 && (size_t)used < size)
        snprintf(buffer + used, size - (size_t)used, a->ndim == 1 ? ",)" : ")");
    return buffer;
}

/* The logical (B, H, L, d) dims of an input and its strides over the packed file. */
typedef struct sdpa_view {
    size_t dims[4], strides[4];
} sdpa_view;

static int view_of(const char *what, const char *path, const clattn_array *a, size_t heads,
                   const char *heads_option, sdpa_view *view)
{
    char text[128];
    for (int i = 0; i < a->ndim; ++i)
        if (a->shape[i] == 0)
            return cli_fail("sdpa", CLI_BAD_INPUT, "%s: %s has shape %s: no dimension may be 0",
                            path, what, shape_text(a, text, sizeof text));
    if (a->ndim == 4) {
        if (heads && heads != a->shape[1])
            return cli_fail("sdpa", CLI_BAD_INPUT, "%s: %s has %zu heads (dim 1) but %s is %zu",
                            path, what, a->shape[1], heads_option, heads);
        for (int i = 0; i < 4; ++i)
            view->dims[i] = a->shape[i];
        view->strides[3] = 1;
        for (int i = 2; i >= 0; --i)
            view->strides[i] = view->strides[i + 1] * view->dims[i + 1];
        return CLI_OK;
    }
    if (a->ndim != 3)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "%s: %s has shape %s; expected rank 4 (B, H, L, d) or rank 3 "
                        "(B, L, H * d)",
                        path, what, shape_text(a, text, sizeof text));
    if (heads == 0)
        return cli_fail("sdpa", CLI_BAD_INPUT, "%s: %s is rank 3 (B, L, H * d): give %s", path,
                        what, heads_option);
    if (a->shape[2] % heads != 0)
        return cli_fail("sdpa", CLI_BAD_INPUT, "%s: %s's last dim %zu is not %s=%zu heads", path,
                        what, a->shape[2], heads_option, heads);
    const size_t b = a->shape[0], l = a->shape[1], d = a->shape[2] / heads;
    /* (B, L, H * d) seen as (B, H, L, d): strides (L * H * d, d, H * d, 1). */
    view->dims[0] = b, view->dims[1] = heads, view->dims[2] = l, view->dims[3] = d;
    view->strides[0] = l * heads * d, view->strides[1] = d, view->strides[2] = heads * d;
    view->strides[3] = 1;
    return CLI_OK;
}

/* The mask, padded along its last dim to seq_k with masked entries (ONNX), as keep bytes (bool
 * masks) or added floats; checks it broadcasts to (B, Hq, Lq, Lk). */
static int prepare_mask(const sdpa_options *o, sdpa_data *d, const size_t full[4], clattn_tensor *t)
{
    char text[128];
    const clattn_array *m = &d->mask;
    if (m->ndim < 1 || m->ndim > 4)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "%s: the mask has shape %s; expected rank 1..4 broadcasting to "
                        "(%zu, %zu, %zu, %zu)",
                        o->mask, shape_text(m, text, sizeof text), full[0], full[1], full[2],
                        full[3]);
    size_t dims[4] = {0};
    const int lead = 4 - m->ndim;
    for (int i = 0; i < m->ndim; ++i) {
        const size_t want = full[lead + i], got = m->shape[i];
        const bool last = i == m->ndim - 1;
        if (got == 0 || (last ? got > want : (got != 1 && got != want)))
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "%s: the mask has shape %s, which does not broadcast to "
                            "(%zu, %zu, %zu, %zu) (dims of 1 or full; the last at most Lk)",
                            o->mask, shape_text(m, text, sizeof text), full[0], full[1], full[2],
                            full[3]);
        dims[i] = last ? want : got;
    }
    const size_t width = m->shape[m->ndim - 1], seq_k = full[3];
    const size_t rows = m->count / width; /* fits: the file held m->count values */
    const bool keep = m->source == CLATTN_IO_BOOL;
    if (keep)
        cli_note_mask_convention("sdpa", "--attn-mask", o->masks.true_masked, o->masks.true_given);
    if (rows > SIZE_MAX / seq_k / sizeof(float))
        return cli_fail("sdpa", CLI_BAD_INPUT, "%s: the padded mask is too large", o->mask);
    const size_t padded = rows * seq_k; /* at least 1: no dim is 0 */
    if (keep)
        d->mask_keep = malloc(padded);
    else
        d->mask_f32 = malloc(padded * sizeof(float));
    if (keep ? d->mask_keep == NULL : d->mask_f32 == NULL)
        return cli_fail("sdpa", CLI_FAILED, "out of memory for the mask");
    for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < seq_k; ++c) {
            const float value = c < width ? m->data[r * width + c] : 0.0f;
            if (keep)
                d->mask_keep[r * seq_k + c] = /* True = attend, or masked with --mask-true */
                    c < width && (value != 0.0f) != o->masks.true_masked;
            else
                d->mask_f32[r * seq_k + c] = c < width ? value : -INFINITY;
        }
    *t = clattn_tensor_make(NULL, 0, keep ? CLATTN_DTYPE_U8 : CLATTN_DTYPE_F32, m->ndim, dims[0],
                            dims[1], dims[2], dims[3]);
    return CLI_OK;
}

/* Writes an output in the file dtype of the input ONNX ties it to (float64 inputs read as
 * CLATTN_IO_F32, so their outputs are float32). */
static int write_npy(const char *path, const float *data, int ndim, const size_t *shape,
                     const clattn_array *like)
{
    char msg[1024];
    return clattn_npy_write_typed(path, data, ndim, shape, like->source, msg, sizeof msg) ==
                   CLATTN_IO_OK
               ? CLI_OK
               : cli_fail("sdpa", CLI_FAILED, "%s", msg);
}

static cl_mem upload(clattn_ctx *ctx, const void *data, size_t bytes, cl_mem_flags flags,
                     cl_int *err)
{
    return clCreateBuffer(clattn_ctx_cl_context(ctx), flags | (data ? CL_MEM_COPY_HOST_PTR : 0),
                          bytes ? bytes : 1, (void *)data, err);
}

/* Writes Y to --out, or prints it when small. */
static int write_out(const sdpa_options *o, const sdpa_data *d, size_t batch, size_t heads,
                     size_t seq_q, size_t dv, bool rank3)
{
    const size_t out_count = batch * heads * seq_q * dv;
    const size_t shape4[4] = {batch, heads, seq_q, dv}, shape3[3] = {batch, seq_q, heads * dv};
    const size_t packed[3] = {seq_q, heads, dv}; /* packed sequences: (total_q, Hq, dv) */
    if (o->out)
        return write_npy(o->out, d->out, rank3 ? 3 : 4,
                         o->varlen ? packed : rank3 ? shape3 : shape4, &d->q);
    if (out_count > 4096) {
        if (rank3)
            printf("output: (%zu, %zu, %zu) floats; use --out Y.npy to save it\n", batch, seq_q,
                   heads * dv);
        else
            printf("output: (%zu, %zu, %zu, %zu) floats; use --out Y.npy to save it\n", batch,
                   heads, seq_q, dv);
        return CLI_OK;
    }
    /* Printed as (B * Hq) matrices of (Lq, dv) (rank 4) or B matrices of (Lq, Hq * dv). */
    const size_t matrices = rank3 ? batch : batch * heads, cols = rank3 ? heads * dv : dv;
    for (size_t m = 0; m < matrices; ++m) {
        char title[64]; /* Y[b, h] (rank 4), Y[b] (rank 3) */
        if (rank3)
            snprintf(title, sizeof title, "Y[%zu]", m);
        else
            snprintf(title, sizeof title, "Y[%zu,%zu]", m / heads, m % heads);
        cli_print_matrix(title, d->out + m * seq_q * cols, seq_q, cols);
    }
    return CLI_OK;
}

/* A paged cache's views: q rank 4, the pools KP (pages, page_size, Hkv, d) and VP (pages,
 * page_size, Hkv, dv), and the block table (B, blocks) read; k and v as the (B, Hkv,
 * blocks * page_size, d) problem they stand for (the checks after this; the tensors made from
 * them are replaced by the pools). */
static int paged_views(const sdpa_options *o, sdpa_data *d, sdpa_view *q, sdpa_view *k,
                       sdpa_view *v)
{
    char a[128], b[128];
    const clattn_array *kp = &d->k, *vp = &d->v, *table = &d->table;
    if (d->q.ndim != 4)
        return cli_fail("sdpa", CLI_BAD_INPUT, "%s: with --k-pages q must be rank 4 (B, Hq, Lq, d)",
                        o->q);
    if (kp->ndim != 4 || vp->ndim != 4 || vp->shape[0] != kp->shape[0] ||
        vp->shape[1] != kp->shape[1] || vp->shape[2] != kp->shape[2])
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--k-pages %s and --v-pages %s: expected pools (pages, page_size, Hkv, d) "
                        "and (pages, page_size, Hkv, dv) of the same pages, page size and heads",
                        shape_text(kp, a, sizeof a), shape_text(vp, b, sizeof b));
    for (int i = 0; i < 4; ++i)
        if (kp->shape[i] == 0 || vp->shape[i] == 0)
            return cli_fail("sdpa", CLI_BAD_INPUT, "--k-pages %s, --v-pages %s: no dim may be 0",
                            shape_text(kp, a, sizeof a), shape_text(vp, b, sizeof b));
    if (cli_read_array("sdpa", o->block_table, &d->table) != CLI_OK)
        return CLI_BAD_INPUT;
    if (table->source != CLATTN_IO_INT || table->ndim != 2 || table->shape[0] != q->dims[0] ||
        table->shape[1] == 0)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "%s: the block table has shape %s; expected int32 or int64 (B, blocks) "
                        "= (%zu, blocks >= 1)",
                        o->block_table, shape_text(table, a, sizeof a), q->dims[0]);
    if (table->shape[1] > UINT32_MAX / kp->shape[1])
        return cli_fail("sdpa", CLI_BAD_INPUT, "%s: %zu blocks of %zu keys exceed 2^32 - 1 keys",
                        o->block_table, table->shape[1], kp->shape[1]);
    const size_t keys = table->shape[1] * kp->shape[1];
    const size_t kd[4] = {q->dims[0], kp->shape[2], keys, kp->shape[3]};
    const size_t vd[4] = {q->dims[0], vp->shape[2], keys, vp->shape[3]};
    for (int i = 0; i < 4; ++i) {
        k->dims[i] = kd[i], v->dims[i] = vd[i];
        k->strides[i] = v->strides[i] = 0; /* unused: the pools are bound as they are */
    }
    return CLI_OK;
}

/* The block table's indices as I32, each block that holds one of its sequence's keys
 * (0 .. N[b] - 1) a page of the pool. */
static int check_block_table(const sdpa_options *o, sdpa_data *d, size_t batch)
{
    const clattn_array *table = &d->table;
    const size_t blocks = table->shape[1], page_size = d->k.shape[1], pages = d->k.shape[0];
    d->block_table = malloc(table->count * sizeof(int32_t));
    if (d->block_table == NULL)
        return cli_fail("sdpa", CLI_FAILED, "out of memory");
    for (size_t b = 0; b < batch; ++b) {
        const size_t used = ((size_t)d->counts[b] + page_size - 1) / page_size;
        for (size_t j = 0; j < blocks; ++j) {
            const float index = table->data[b * blocks + j];
            const bool in_pool = index >= 0.0f && index < (float)pages && index < 16777216.0f;
            if (j < used && !in_pool)
                return cli_fail("sdpa", CLI_BAD_INPUT,
                                "%s: block_table[%zu, %zu] = %g is not a page of the pool "
                                "(0 .. %zu); sequence %zu has %d keys in %zu blocks",
                                o->block_table, b, j, (double)index, pages - 1, b, d->counts[b],
                                used);
            d->block_table[b * blocks + j] = in_pool ? (int32_t)index : -1;
        }
    }
    return CLI_OK;
}

/* Packed sequences: Q (total_q, Hq, d), K (total_k, Hkv, d), V (total_k, Hkv, dv) as the
 * (1, H, total, d) views of one long batch (the checks after this), and the offsets: int
 * (B + 1) each, from 0, non-decreasing, ending at the totals; the longest spans. */
static int varlen_views(const sdpa_options *o, sdpa_data *d, sdpa_view *q, sdpa_view *k,
                        sdpa_view *v)
{
    char a[128];
    const clattn_array *arrays[3] = {&d->q, &d->k, &d->v};
    sdpa_view *views[3] = {q, k, v};
    static const char *const names[3] = {"q", "k", "v"};
    static const char *const shapes[3] = {"(total_q, Hq, d)", "(total_k, Hkv, d)",
                                          "(total_k, Hkv, dv)"};
    for (int i = 0; i < 3; ++i) {
        const clattn_array *x = arrays[i];
        if (x->ndim != 3 || x->shape[0] == 0 || x->shape[1] == 0 || x->shape[2] == 0)
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "%s has shape %s; with --cu-seqlens-q it must be packed rank 3 %s, "
                            "no dim 0",
                            names[i], shape_text(x, a, sizeof a), shapes[i]);
        const size_t rows = x->shape[0], heads = x->shape[1], dim = x->shape[2];
        const size_t dims[4] = {1, heads, rows, dim}, strides[4] = {rows * heads * dim, dim,
                                                                    heads * dim, 1};
        memcpy(views[i]->dims, dims, sizeof dims);
        memcpy(views[i]->strides, strides, sizeof strides);
    }
    const char *paths[2] = {o->cu_q, o->cu_k};
    static const char *const cu_names[2] = {"cu_seqlens_q", "cu_seqlens_k"};
    const size_t totals[2] = {d->q.shape[0], d->k.shape[0]};
    for (int x = 0; x < 2; ++x) {
        clattn_array *cu = &d->cu_file[x];
        if (cli_read_array("sdpa", paths[x], cu) != CLI_OK)
            return CLI_BAD_INPUT;
        if (cu->source != CLATTN_IO_INT || cu->ndim != 1 || cu->shape[0] < 2)
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "%s: %s has shape %s; expected int32 or int64 (B + 1) offsets, B >= 1",
                            paths[x], cu_names[x], shape_text(cu, a, sizeof a));
        if (x == 1 && cu->shape[0] != d->cu_file[0].shape[0])
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "%s: cu_seqlens_k has %zu offsets but cu_seqlens_q %zu (B + 1 each)",
                            paths[x], cu->shape[0], d->cu_file[0].shape[0]);
        d->cu[x] = malloc(cu->count * sizeof(int32_t));
        if (d->cu[x] == NULL)
            return cli_fail("sdpa", CLI_FAILED, "out of memory");
        d->max_len[x] = 0;
        for (size_t i = 0; i < cu->count; ++i) {
            const float at = cu->data[i], before = i ? cu->data[i - 1] : 0.0f;
            if (i == 0 && at != 0.0f)
                return cli_fail("sdpa", CLI_BAD_INPUT, "%s: %s[0] = %g; the offsets start at 0",
                                paths[x], cu_names[x], (double)at);
            if (at < before)
                return cli_fail("sdpa", CLI_BAD_INPUT,
                                "%s: %s[%zu] = %g is below %s[%zu] = %g: the offsets must be "
                                "non-decreasing",
                                paths[x], cu_names[x], i, (double)at, cu_names[x], i - 1,
                                (double)before);
            if (at > (float)totals[x])
                return cli_fail("sdpa", CLI_BAD_INPUT,
                                "%s: %s[%zu] = %g is past %s's %zu rows", paths[x], cu_names[x], i,
                                (double)at, x ? "k" : "q", totals[x]);
            d->cu[x][i] = (int32_t)at;
            if (i && (size_t)(at - before) > d->max_len[x])
                d->max_len[x] = (size_t)(at - before);
        }
        if (cu->data[cu->count - 1] != (float)totals[x])
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "%s: %s[%zu] = %g but %s has %zu rows: the offsets end at the total",
                            paths[x], cu_names[x], cu->count - 1,
                            (double)cu->data[cu->count - 1], x ? "k" : "q", totals[x]);
        if (d->max_len[x] == 0) /* every sequence empty: the plan still takes 1 */
            d->max_len[x] = 1;
    }
    d->sequences = d->cu_file[0].count - 1;
    return CLI_OK;
}

/* The elements of a tensor of rank t->rank. */
static size_t tensor_count(const clattn_tensor *t)
{
    size_t count = 1;
    for (int i = 0; i < t->rank; ++i)
        count *= t->dims[i];
    return count;
}

/* --backward, after the forward filled out and lse: uploads dO, runs the backward plan into
 * fresh gradient buffers (grad_counts[i] floats each; 0: absent) and reads them into
 * d->grad. Returns an OpenCL error, or CL_SUCCESS with the plan's status in *status. */
static cl_int run_backward(clattn_ctx *ctx, sdpa_data *d, const clattn_tensors *layouts,
                           clattn_plan *backward, const size_t grad_counts[5],
                           clattn_status *status)
{
    cl_int err = CL_SUCCESS;
    d->mem[M_GRAD_OUT] = upload(ctx, d->grad_out.data, d->grad_out.count * sizeof(float),
                                CL_MEM_READ_ONLY, &err);
    for (int i = 0; i < 5 && err == CL_SUCCESS; ++i)
        if (grad_counts[i])
            d->mem[M_GRAD_Q + i] =
                upload(ctx, NULL, grad_counts[i] * sizeof(float), CL_MEM_READ_WRITE, &err);
    if (err != CL_SUCCESS)
        return err;
    clattn_tensors bound = *layouts;
    bound.q.mem = d->mem[M_Q], bound.k.mem = d->mem[M_K], bound.v.mem = d->mem[M_V];
    bound.out.mem = d->mem[M_OUT], bound.lse.mem = d->mem[M_LSE];
    bound.attn_mask.mem = d->mem[M_MASK], bound.kv_seqlen.mem = d->mem[M_NONPAD];
    bound.alibi_slopes.mem = d->mem[M_ALIBI], bound.sinks.mem = d->mem[M_SINKS];
    bound.grad_out.mem = d->mem[M_GRAD_OUT];
    bound.cu_seqlens_q.mem = d->mem[M_CU_Q], bound.cu_seqlens_k.mem = d->mem[M_CU_K];
    for (int i = 0; i < CLATTN_FLEX_AUX_MAX; ++i)
        bound.by_role[CLATTN_ROLE_FLEX_AUX0 + i].mem = d->mem[M_AUX0 + i];
    bound.block_mask.mem = d->mem[M_BLOCK_MASK];
    clattn_tensor *grads[5] = {&bound.grad_q, &bound.grad_k, &bound.grad_v,
                               &bound.grad_attn_mask, &bound.grad_sinks};
    for (int i = 0; i < 5; ++i)
        grads[i]->mem = d->mem[M_GRAD_Q + i];
    *status =
        clattn_plan_execute(backward, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL);
    for (int i = 0; i < 5 && err == CL_SUCCESS && *status == CLATTN_SUCCESS; ++i)
        if (grad_counts[i])
            err = clEnqueueReadBuffer(clattn_ctx_queue(ctx), d->mem[M_GRAD_Q + i], CL_TRUE, 0,
                                      grad_counts[i] * sizeof(float), d->grad[i], 0, NULL, NULL);
    return err;
}

/* Writes the gradients asked for: dQ, dK, dV in their inputs' shapes and dtypes, the mask's in
 * the mask file's shape (the padding past its last dim cut off), the sinks' as (Hq) float32. */
static int write_grads(const sdpa_options *o, sdpa_data *d, size_t seq_k, size_t heads)
{
    int rc;
    if ((o->grad_q && (rc = write_npy(o->grad_q, d->grad[0], d->q.ndim, d->q.shape, &d->q))) ||
        (o->grad_k && (rc = write_npy(o->grad_k, d->grad[1], d->k.ndim, d->k.shape, &d->k))) ||
        (o->grad_v && (rc = write_npy(o->grad_v, d->grad[2], d->v.ndim, d->v.shape, &d->v))))
        return rc;
    if (o->grad_mask) {
        const size_t width = d->mask.shape[d->mask.ndim - 1], rows = d->mask.count / width;
        for (size_t r = 1; width < seq_k && r < rows; ++r) /* forward: r * width <= r * seq_k */
            memmove(d->grad[3] + r * width, d->grad[3] + r * seq_k, width * sizeof(float));
        if ((rc = write_npy(o->grad_mask, d->grad[3], d->mask.ndim, d->mask.shape, &d->mask)))
            return rc;
    }
    const size_t sinks_shape[1] = {heads};
    const clattn_array f32 = {.source = CLATTN_IO_F32};
    if (o->grad_sinks && (rc = write_npy(o->grad_sinks, d->grad[4], 1, sinks_shape, &f32)))
        return rc;
    return CLI_OK;
}

/* --attn-png: the weights of batch 0 (the first heads * Lq * Lk of d->scores). Masked cells
 * are marked grey where the CLI knows them cell by cell: --causal and --window when their
 * diagonal is the main one (top-left, or Lq = Lk with no past keys or counts), and a mask
 * that is (Lq, Lk) for every batch and head; other masked cells show as weight 0. */
static int write_heatmap(const sdpa_options *o, const sdpa_data *d, size_t heads, size_t seq_q,
                         size_t seq_k)
{
    const bool main_diagonal =
        !o->past_k && !o->nonpad && !o->paged && !o->varlen &&
        (seq_q == seq_k || (o->score.align_given && o->score.align == CLATTN_CAUSAL_TOP_LEFT));
    const bool plain_mask = o->mask && d->mask.count / d->mask.shape[d->mask.ndim - 1] == seq_q;
    float *additive = NULL;
    if (plain_mask) {
        additive = malloc(seq_q * seq_k * sizeof(float));
        if (additive == NULL)
            return cli_fail("sdpa", CLI_FAILED, "out of memory for the heatmap");
        for (size_t i = 0; i < seq_q * seq_k; ++i)
            additive[i] = d->mask_keep ? (d->mask_keep[i] ? 0.0f : -INFINITY) : d->mask_f32[i];
    }
    const cli_png_masks masks = {.heads = heads,
                                 .rows = seq_q,
                                 .cols = seq_k,
                                 .causal = o->score.causal && main_diagonal,
                                 .window = o->score.window.on && main_diagonal,
                                 .window_left = o->score.window.left,
                                 .window_right = o->score.window.right,
                                 .additive = additive};
    const int rc =
        cli_write_attention_png("sdpa", o->heatmap.png, d->scores, &masks, o->heatmap.scale);
    free(additive);
    return rc;
}

/* Past blanks and comments. */
static const char *skip_blank(const char *p)
{
    for (;;) {
        if (isspace((unsigned char)*p))
            ++p;
        else if (p[0] == '/' && p[1] == '*') {
            const char *end = strstr(p + 2, "*/");
            p = end ? end + 2 : p + strlen(p);
        } else if (p[0] == '/' && p[1] == '/') {
            p += strcspn(p, "\n");
        } else {
            return p;
        }
    }
}

/* Which of score_mod, mask_mod and score_mod_grad the source defines (clattn_flex_flags): each
 * whose name stands at file scope (outside braces, parentheses and brackets) followed by '('
 * (blanks and comments may come between); comments, string and character literals and
 * preprocessor lines are skipped. A prototype counts as well (the build then names it). */
static unsigned flex_functions(const char *source)
{
    static const struct {
        const char *name;
        unsigned flag;
    } functions[] = {{"score_mod", CLATTN_FLEX_SCORE_MOD},
                     {"mask_mod", CLATTN_FLEX_MASK_MOD},
                     {"score_mod_grad", CLATTN_FLEX_SCORE_MOD_GRAD}};
    unsigned found = 0;
    long depth = 0;
    bool line_start = true; /* nothing but blanks yet on this line: '#' starts a directive */
    const char *p = source;
    while (*p) {
        const char c = *p;
        if (c == '\n') {
            line_start = true;
            ++p;
        } else if (isspace((unsigned char)c)) {
            ++p;
        } else if (c == '/' && p[1] == '/') {
            p += strcspn(p, "\n");
        } else if (c == '/' && p[1] == '*') {
            const char *end = strstr(p + 2, "*/");
            p = end ? end + 2 : p + strlen(p);
        } else if (c == '#' && line_start) { /* to the line's end, through continuations */
            while (*p && *p != '\n')
                p += p[0] == '\\' && p[1] == '\n' ? 2 : 1;
        } else if (c == '"' || c == '\'') {
            for (++p; *p && *p != c && *p != '\n'; ++p)
                if (p[0] == '\\' && p[1])
                    ++p;
            if (*p == c)
                ++p;
            line_start = false;
        } else if (isalnum((unsigned char)c) || c == '_') {
            const char *start = p;
            while (isalnum((unsigned char)*p) || *p == '_')
                ++p;
            const size_t length = (size_t)(p - start);
            for (size_t i = 0; i < 3 && depth == 0; ++i)
                if (strlen(functions[i].name) == length &&
                    memcmp(start, functions[i].name, length) == 0 && *skip_blank(p) == '(')
                    found |= functions[i].flag;
            line_start = false;
        } else {
            depth += c == '{' || c == '(' || c == '[';
            depth -= (c == '}' || c == ')' || c == ']') && depth > 0;
            line_start = false;
            ++p;
        }
    }
    return found;
}

/* --score-mod's file, whole; NULL after the line. */
static char *read_source(const char *path)
{
    enum { MAX_SOURCE = 1 << 20 };
    if (strcmp(path, "@tree") == 0) { /* the library's tree mask (clattn_flex_tree_mask) */
        char *text = malloc(sizeof CLATTN_TREE_MASK_SOURCE);
        if (text == NULL)
            cli_fail("sdpa", CLI_FAILED, "out of memory for @tree");
        else
            memcpy(text, CLATTN_TREE_MASK_SOURCE, sizeof CLATTN_TREE_MASK_SOURCE);
        return text;
    }
    FILE *file = fopen(path, "rb");
    if (file == NULL) {
        cli_fail("sdpa", CLI_BAD_INPUT, "--score-mod %s: cannot read it: %s", path,
                 strerror(errno));
        return NULL;
    }
    char *text = malloc(MAX_SOURCE + 1);
    size_t length = text ? fread(text, 1, MAX_SOURCE + 1, file) : 0;
    const bool failed = text && ferror(file);
    fclose(file);
    if (text == NULL) {
        cli_fail("sdpa", CLI_FAILED, "out of memory for %s", path);
        return NULL;
    }
    const char *why = failed                       ? "cannot read it"
                      : length > MAX_SOURCE        ? "over 1 MiB; expected OpenCL C source"
                      : memchr(text, '\0', length) ? "holds a NUL byte; expected OpenCL C text"
                                                   : NULL;
    if (why) {
        free(text);
        cli_fail("sdpa", CLI_BAD_INPUT, "--score-mod %s: %s", path, why);
        return NULL;
    }
    text[length] = '\0';
    return text;
}

/* --score-mod and --aux: the source and what it defines, and each auxiliary array as the
 * library takes it (F32, I32 or U8, flat: the functions read it at flat indices). */
static int load_flex(const sdpa_options *o, sdpa_data *d)
{
    if ((d->flex_source = read_source(o->score_mod)) == NULL)
        return CLI_BAD_INPUT; /* (or out of memory: said) */
    d->flex_functions = flex_functions(d->flex_source);
    if (d->flex_functions == 0)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--score-mod %s defines none of score_mod, mask_mod and score_mod_grad "
                        "(each name at file scope, followed by '(')",
                        o->score_mod);
    if (!(d->flex_functions & CLATTN_FLEX_SCORE_MOD) &&
        (d->flex_functions & CLATTN_FLEX_SCORE_MOD_GRAD))
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--score-mod %s defines score_mod_grad but no score_mod", o->score_mod);
    if (o->block_sizes[0] && !(d->flex_functions & CLATTN_FLEX_MASK_MOD))
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--block-mask is made from mask_mod, which --score-mod %s does not define",
                        o->score_mod);
    for (size_t i = 0; i < o->aux.count; ++i) {
        clattn_array *a = &d->aux_file[i];
        const char *name = o->aux.names[i], *path = o->aux.paths[i];
        if (cli_read_array("sdpa", path, a) != CLI_OK)
            return CLI_BAD_INPUT;
        if (a->source == CLATTN_IO_F16 || a->source == CLATTN_IO_BF16)
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "--aux %s: %s is %s; expected float32, int32, int64, bool or uint8",
                            name, path, a->source == CLATTN_IO_F16 ? "float16" : "bfloat16");
        if (a->count == 0)
            return cli_fail("sdpa", CLI_BAD_INPUT, "--aux %s: %s holds no element", name, path);
        if (a->source == CLATTN_IO_F32) {
            d->aux[i] = a->data;
            d->aux_dtype[i] = CLATTN_DTYPE_F32;
            continue;
        }
        const bool bytes = a->source == CLATTN_IO_BOOL;
        d->aux_dtype[i] = bytes ? CLATTN_DTYPE_U8 : CLATTN_DTYPE_I32;
        if ((d->aux[i] = malloc(a->count * (bytes ? 1 : sizeof(int32_t)))) == NULL)
            return cli_fail("sdpa", CLI_FAILED, "out of memory for %s", path);
        for (size_t j = 0; j < a->count; ++j) {
            const float value = a->data[j];
            if (bytes) {
                ((uint8_t *)d->aux[i])[j] = (uint8_t)value; /* 0 .. 255 */
                continue;
            }
            /* integers read exactly up to 2^24 in magnitude (clattn_io's float values) */
            if (!(value >= -16777216.0f && value <= 16777216.0f))
                return cli_fail("sdpa", CLI_BAD_INPUT,
                                "--aux %s: %s[%zu] = %.0f is outside -2^24 .. 2^24 (the integers "
                                "clattn reads exactly)",
                                name, path, j, (double)value);
            ((int32_t *)d->aux[i])[j] = (int32_t)value;
        }
    }
    return CLI_OK;
}

/* A build error's first line about the user's source (a line of the compiler's log naming
 * "score_mod:", the library's name for it), or NULL. */
static const char *first_source_line(const char *message)
{
    for (const char *line = strchr(message, '\n'); line; line = strchr(line, '\n')) {
        const char *at = strstr(++line, "score_mod:");
        if (at && at < line + strcspn(line, "\n"))
            return line;
    }
    return NULL;
}

/* The problem's sizes, from the inputs' views. */
typedef struct sdpa_shape {
    sdpa_view q, k, v, out;
    size_t batch, heads, seq_q, dv, kv_heads, dk;
    size_t past, seq_k; /* a KV cache's past keys; the keys attended (past + new) */
    size_t out_count;
    bool rank3;
} sdpa_shape;

/* What the run binds and moves: the descriptors (bound to the tensors here: never copied),
 * the float K and V of --kv-dtype, and the buffers' sizes. */
typedef struct sdpa_job {
    clattn_sdpa_desc desc, back_desc;
    clattn_tensors tensors, back_tensors;
    clattn_tensor k_float, v_float;
    float k_scale, v_scale; /* --k-scale, --v-scale (FP8) */
    bool scores_out; /* --qk-out, or --attn-png (the weights, --qk-output-mode 3's) */
    int qk_mode;
    size_t kq_bytes, vq_bytes, pk_count, pv_count, scores_count, block_mask_count, mask_count;
    size_t grad_counts[5];
    bool v_view; /* --v-from-k: v is bound to k's buffer */
} sdpa_job;

/* --v-from-k DV: v (k's file read again) cut to its rows' first DV columns (rank 4). */
static int slice_v(const sdpa_options *o, clattn_array *v)
{
    const size_t dv = o->v_from_k;
    if (v->ndim != 4 || v->shape[3] < dv)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--v-from-k %zu: %s must be rank 4 with at least %zu columns", dv, o->k,
                        dv);
    const size_t rows = v->count / v->shape[3];
    for (size_t r = 0; r < rows; ++r)
        memmove(v->data + r * dv, v->data + r * v->shape[3], dv * sizeof(float));
    v->shape[3] = dv;
    v->count = rows * dv;
    return CLI_OK;
}

/* Reads q, k, v and the optional arrays; q, k and v of one rank. */
static int load_inputs(const sdpa_options *o, sdpa_data *d)
{
    int rc;
    char a[128], b[128];
    if ((rc = load(o->q, &d->q, false)) || (rc = load(o->k, &d->k, false)) ||
        (rc = load(o->v, &d->v, false)) || (o->mask && (rc = load(o->mask, &d->mask, true))) ||
        (o->past_k && (rc = load(o->past_k, &d->past_k, false))) ||
        (o->past_v && (rc = load(o->past_v, &d->past_v, false))) ||
        (o->score_mod && (rc = load_flex(o, d))))
        return rc;
    if (o->nonpad) {
        if (cli_read_array("sdpa", o->nonpad, &d->nonpad) != CLI_OK)
            return CLI_BAD_INPUT;
        if (d->nonpad.source != CLATTN_IO_INT)
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "%s: nonpad_kv_seqlen must be an int64 or int32 array", o->nonpad);
    }
    if (o->v_from_k && (rc = slice_v(o, &d->v)))
        return rc;
    if (d->q.ndim != d->k.ndim || d->q.ndim != d->v.ndim)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "q %s, k %s and v %s must all be rank 4 or all rank 3",
                        shape_text(&d->q, a, sizeof a), shape_text(&d->k, b, sizeof b),
                        d->v.ndim == 4 ? "(rank 4)" : "(rank 3)");
    return CLI_OK;
}

/* q, k and v as (B, H, L, d) views (packed sequences, a paged cache), checked against each
 * other; the sizes into s. */
static int shape_views(const sdpa_options *o, sdpa_data *d, sdpa_shape *s)
{
    int rc;
    const size_t kv_option = o->kv_heads ? o->kv_heads : o->q_heads;
    sdpa_view *q = &s->q, *k = &s->k, *v = &s->v;
    if (o->varlen) {
        if ((rc = varlen_views(o, d, q, k, v)))
            return rc;
    } else if ((rc = view_of("q", o->q, &d->q, o->q_heads, "--q-heads", q)) ||
               (!o->paged && ((rc = view_of("k", o->k, &d->k, kv_option, "--kv-heads", k)) ||
                              (rc = view_of("v", o->v, &d->v, kv_option, "--kv-heads", v)))) ||
               (o->paged && (rc = paged_views(o, d, q, k, v)))) {
        return rc;
    }
    if (k->dims[0] != q->dims[0] || v->dims[0] != q->dims[0])
        return cli_fail("sdpa", CLI_BAD_INPUT, "batch: q has %zu, k %zu, v %zu", q->dims[0],
                        k->dims[0], v->dims[0]);
    if (v->dims[1] != k->dims[1] || v->dims[2] != k->dims[2])
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "%s: v has %zu heads and %zu keys; k has %zu and %zu", o->v, v->dims[1],
                        v->dims[2], k->dims[1], k->dims[2]);
    if (k->dims[3] != q->dims[3])
        return cli_fail("sdpa", CLI_BAD_INPUT, "%s: k's head size is %zu but q's is %zu", o->k,
                        k->dims[3], q->dims[3]);
    if (q->dims[1] % k->dims[1] != 0)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "k/v have %zu heads, which must divide q's %zu (grouped-query "
                        "attention)",
                        k->dims[1], q->dims[1]);
    s->batch = q->dims[0], s->heads = q->dims[1], s->seq_q = q->dims[2];
    s->dv = v->dims[3], s->kv_heads = k->dims[1], s->dk = k->dims[3];
    return CLI_OK;
}

/* A KV cache's past keys and values (B, Hkv, P, d): s->past, and s->seq_k = past + new. */
static int shape_past(const sdpa_options *o, const sdpa_data *d, sdpa_shape *s)
{
    char a[128], b[128];
    const size_t new_k = s->k.dims[2], batch = s->batch, kv_heads = s->kv_heads;
    s->seq_k = new_k;
    if (!o->past_k)
        return CLI_OK;
    const clattn_array *pk = &d->past_k, *pv = &d->past_v;
    if (pk->ndim != 4 || pv->ndim != 4 || pk->shape[0] != batch || pk->shape[1] != kv_heads ||
        pk->shape[3] != s->dk || pv->shape[0] != batch || pv->shape[1] != kv_heads ||
        pv->shape[2] != pk->shape[2] || pv->shape[3] != s->dv || pk->shape[2] == 0)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "past key %s and value %s: expected (B, Hkv, P, d) = (%zu, %zu, P, %zu) "
                        "and (%zu, %zu, P, %zu), P >= 1",
                        shape_text(pk, a, sizeof a), shape_text(pv, b, sizeof b), batch, kv_heads,
                        s->dk, batch, kv_heads, s->dv);
    s->past = pk->shape[2];
    if (s->past > UINT32_MAX - new_k)
        return cli_fail("sdpa", CLI_BAD_INPUT, "past + new keys exceed 2^32 - 1");
    s->seq_k = s->past + new_k;
    return CLI_OK;
}

/* --nonpad-kv-seqlen: each batch's key count as I32 in d->counts, within the keys. */
static int check_counts(const sdpa_options *o, sdpa_data *d, const sdpa_shape *s)
{
    char a[128];
    const size_t batch = s->batch, seq_k = s->seq_k;
    if (d->nonpad.ndim != 1 || d->nonpad.shape[0] != batch)
        return cli_fail("sdpa", CLI_BAD_INPUT, "%s: nonpad_kv_seqlen has shape %s; expected (%zu,)",
                        o->nonpad, shape_text(&d->nonpad, a, sizeof a), batch);
    d->counts = malloc(batch * sizeof *d->counts);
    if (d->counts == NULL)
        return cli_fail("sdpa", CLI_FAILED, "out of memory");
    for (size_t i = 0; i < batch; ++i) {
        const float n = d->nonpad.data[i];
        if (!(n >= 0.0f && n <= (float)seq_k)) {
            if (o->paged)
                return cli_fail("sdpa", CLI_BAD_INPUT,
                                "%s: seqlens_k[%zu] = %g is not in 0 .. %zu: the block "
                                "table holds %zu blocks of %zu keys",
                                o->nonpad, i, (double)n, seq_k, d->table.shape[1], d->k.shape[1]);
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "%s: nonpad_kv_seqlen[%zu] = %g is not in 0 .. %zu (the keys)",
                            o->nonpad, i, (double)n, seq_k);
        }
        d->counts[i] = (int32_t)n;
    }
    return CLI_OK;
}

/* ALiBi: the paper's slopes (Hq), or the file's (Hq) or (B, Hq) (per sequence when packed). */
static int load_slopes(const sdpa_options *o, sdpa_data *d, size_t batch, size_t heads)
{
    int rc;
    char a[128];
    if (o->score.alibi) {
        d->slopes.data = malloc(heads * sizeof(float));
        if (d->slopes.data == NULL)
            return cli_fail("sdpa", CLI_FAILED, "out of memory");
        d->slopes.ndim = 1, d->slopes.shape[0] = heads, d->slopes.count = heads;
        if (clattn_alibi_slopes(heads, 8.0f, d->slopes.data) != CLATTN_SUCCESS)
            return cli_fail("sdpa", CLI_FAILED, "clattn_alibi_slopes failed for %zu heads", heads);
        return CLI_OK;
    }
    if (!o->score.alibi_slopes)
        return CLI_OK;
    if ((rc = load(o->score.alibi_slopes, &d->slopes, false)))
        return rc;
    const size_t slope_rows = o->varlen ? d->sequences : batch; /* per sequence */
    const bool per_head = d->slopes.ndim == 1 && d->slopes.shape[0] == heads;
    const bool per_batch =
        d->slopes.ndim == 2 && d->slopes.shape[0] == slope_rows && d->slopes.shape[1] == heads;
    if (!per_head && !per_batch)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "%s: the ALiBi slopes have shape %s; expected (%zu,) or (%zu, %zu)",
                        o->score.alibi_slopes, shape_text(&d->slopes, a, sizeof a), heads,
                        slope_rows, heads);
    for (size_t i = 0; i < d->slopes.count; ++i)
        if (!isfinite(d->slopes.data[i]))
            return cli_fail("sdpa", CLI_BAD_INPUT, "%s: slope %zu is not finite",
                            o->score.alibi_slopes, i);
    return CLI_OK;
}

/* Attention sinks: (Hq) logits, finite or -inf (no sink). */
static int load_sinks(const sdpa_options *o, sdpa_data *d, size_t heads)
{
    int rc;
    char a[128];
    if ((rc = load(o->sinks, &d->sinks, false)))
        return rc;
    if (d->sinks.ndim != 1 || d->sinks.shape[0] != heads)
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "%s: the sinks have shape %s; expected (%zu,): one logit per query "
                        "head",
                        o->sinks, shape_text(&d->sinks, a, sizeof a), heads);
    for (size_t i = 0; i < d->sinks.count; ++i)
        if (isnan(d->sinks.data[i]) || d->sinks.data[i] == INFINITY)
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "%s: sink %zu is %g; expected a finite logit or -inf (no sink)",
                            o->sinks, i, (double)d->sinks.data[i]);
    return CLI_OK;
}

/* Y's view (q's layout) and count; with --backward, dO must have Y's shape. */
static int shape_output(const sdpa_options *o, sdpa_data *d, sdpa_shape *s)
{
    int rc;
    char a[128], b[128];
    const size_t batch = s->batch, heads = s->heads, seq_q = s->seq_q, dv = s->dv;
    s->rank3 = d->q.ndim == 3;
    s->out = (sdpa_view){{batch, heads, seq_q, dv}, {heads * seq_q * dv, seq_q * dv, dv, 1}};
    if (s->rank3) {
        s->out.strides[1] = dv, s->out.strides[2] = heads * dv;
    }
    if (heads > SIZE_MAX / batch / seq_q / dv / sizeof(float))
        return cli_fail("sdpa", CLI_BAD_INPUT, "the output is too large");
    s->out_count = batch * heads * seq_q * dv;
    if (!o->backward) /* dO: Y's shape */
        return CLI_OK;
    if ((rc = load(o->grad_out, &d->grad_out, false)))
        return rc;
    const size_t shape4[4] = {batch, heads, seq_q, dv}, shape3[3] = {batch, seq_q, heads * dv};
    const size_t packed[3] = {seq_q, heads, dv};
    const size_t *want = o->varlen ? packed : s->rank3 ? shape3 : shape4;
    bool same = d->grad_out.ndim == d->q.ndim;
    for (int i = 0; same && i < d->q.ndim; ++i)
        same = d->grad_out.shape[i] == want[i];
    if (!same) {
        clattn_array y = {.ndim = d->q.ndim};
        memcpy(y.shape, want, (size_t)d->q.ndim * sizeof *want);
        return cli_fail("sdpa", CLI_BAD_INPUT, "%s: dO has shape %s; expected Y's, %s", o->grad_out,
                        shape_text(&d->grad_out, a, sizeof a), shape_text(&y, b, sizeof b));
    }
    return CLI_OK;
}

/* Every file read and checked against the others: the problem's sizes into s. */
static int read_problem(const sdpa_options *o, sdpa_data *d, sdpa_shape *s)
{
    int rc;
    if ((rc = load_inputs(o, d)) || (rc = shape_views(o, d, s)) || (rc = shape_past(o, d, s)) ||
        (o->nonpad && (rc = check_counts(o, d, s))) ||
        (o->paged && (rc = check_block_table(o, d, s->batch))) ||
        (rc = load_slopes(o, d, s->batch, s->heads)) ||
        (o->sinks && (rc = load_sinks(o, d, s->heads))))
        return rc;
    return shape_output(o, d, s);
}

/* --ring: the whole inputs to cli_ring.c; rank 0 writes Y. */
static int run_ring(const sdpa_options *o, sdpa_data *d, const sdpa_shape *s)
{
#ifdef CLATTN_CLI_MPI
    /* 16-bit files all of one type: the ring runs in it (its blocks travel at 2 bytes) */
    const clattn_io_dtype storage =
        d->q.source == d->k.source && d->q.source == d->v.source &&
                (d->q.source == CLATTN_IO_F16 || d->q.source == CLATTN_IO_BF16)
            ? d->q.source
            : CLATTN_IO_F32;
    cli_ring_job job = {.q = d->q.data,
                        .k = d->k.data,
                        .v = d->v.data,
                        .counts = d->counts,
                        .sinks = d->sinks.data,
                        .storage = storage,
                        .bottom_right =
                            o->score.align_given && o->score.align == CLATTN_CAUSAL_BOTTOM_RIGHT,
                        .causal = o->score.causal,
                        .window = o->score.window.on,
                        .zigzag = o->ring_zigzag,
                        .timing = o->ring_timing,
                        .window_left = o->score.window.left,
                        .window_right = o->score.window.right,
                        .scale = o->score.scale,
                        .softcap = o->score.softcap,
                        .device = o->exec.device};
    memcpy(job.q_dims, s->q.dims, sizeof s->q.dims);
    memcpy(job.q_strides, s->q.strides, sizeof s->q.dims);
    memcpy(job.k_dims, s->k.dims, sizeof s->k.dims);
    memcpy(job.k_strides, s->k.strides, sizeof s->k.dims);
    memcpy(job.v_dims, s->v.dims, sizeof s->v.dims);
    memcpy(job.v_strides, s->v.strides, sizeof s->v.dims);
    memcpy(job.out_strides, s->out.strides, sizeof s->out.strides);
    d->out = malloc(s->out_count * sizeof(float));
    if (d->out == NULL)
        return cli_fail("sdpa", CLI_FAILED, "out of memory for the output");
    bool root = false;
    int rc;
    if ((rc = cli_ring_sdpa(&job, d->out, &root)) != CLI_OK || !root)
        return rc;
    return write_out(o, d, s->batch, s->heads, s->seq_q, s->dv, s->rank3);
#else
    (void)o, (void)d, (void)s;
    return cli_fail("sdpa", CLI_BAD_INPUT,
                    "--ring: this clattn was built without MPI (cmake -DCLATTN_MPI=ON)");
#endif
}

/* The descriptor's options: the scores' rules, rotary, dropout, the masks' alignment. */
static void describe_options(const sdpa_options *o, clattn_sdpa_desc *desc)
{
    desc->scale = o->score.scale;
    desc->softcap = o->score.softcap;
    desc->norm = o->score.norm;
    desc->path = o->score.path;
    desc->softmax_f64 = o->softmax_f64;
    desc->rope = o->rope.on;
    desc->rope_style = o->rope.style;
    desc->rope_dims = o->rope.dims ? o->rope.dims : CLATTN_ROPE_WHOLE_HEAD;
    desc->rope_base = o->rope.base ? o->rope.base : CLATTN_ROPE_BASE_DEFAULT;
    desc->rope_start = o->rope.start;
    desc->dropout_p = o->dropout_p; /* back_desc copies desc: the backward regenerates the mask */
    desc->k_scale = o->k_scale, desc->v_scale = o->v_scale; /* --kv-dtype fp8_*'s */
    desc->dropout_seed = o->dropout_seed;
    desc->dropout_offset = o->dropout_offset;
    const clattn_causal align = o->score.align_given ? o->score.align : CLATTN_CAUSAL_ONNX;
    desc->causal = o->score.causal ? align : CLATTN_CAUSAL_NONE;
    if (o->score.window.on) {
        desc->window_align = align;
        desc->window_left = o->score.window.left;
        desc->window_right = o->score.window.right;
    }
}

/* --v-from-k DV: v as the view of k's rows (k's layout and dtype, DV columns). */
static int v_view(const sdpa_options *o, sdpa_job *job)
{
    if (o->v_from_k) {
        job->tensors.v = job->tensors.k;
        job->tensors.v.dims[3] = o->v_from_k;
        job->v_view = true;
    }
    return CLI_OK;
}

/* q, k, v and out as the views say, or packed (varlen), or a paged cache's pools; with
 * --kv-dtype, k and v become packed blocks quantized on the device from the float views. */
static int describe_qkv(const sdpa_options *o, const sdpa_data *d, const sdpa_shape *s,
                        sdpa_job *job)
{
    clattn_tensors *t = &job->tensors;
    clattn_tensor *roles[4] = {&t->q, &t->k, &t->v, &t->out};
    const sdpa_view *views[4] = {&s->q, &s->k, &s->v, &s->out};
    for (int r = 0; r < 4; ++r) {
        *roles[r] = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, 0, 0, 0, 0);
        for (int i = 0; i < 4; ++i) {
            roles[r]->dims[i] = views[r]->dims[i];
            roles[r]->strides[i] = views[r]->strides[i];
        }
    }
    const size_t heads = s->heads, kv_heads = s->kv_heads, dk = s->dk, dv = s->dv;
    if (o->varlen) { /* packed rank-3 operands, the offsets, the longest spans */
        t->q = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, s->seq_q, heads, dk, 0);
        t->k = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, s->seq_k, kv_heads, dk, 0);
        t->v = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, s->seq_k, kv_heads, dv, 0);
        t->out = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, s->seq_q, heads, dv, 0);
        t->cu_seqlens_q =
            clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 1, d->sequences + 1, 0, 0, 0);
        t->cu_seqlens_k = t->cu_seqlens_q;
        job->desc.max_seqlen_q = d->max_len[0];
        job->desc.max_seqlen_k = d->max_len[1];
    }
    if (o->paged) { /* the pools as they are, and the table */
        const size_t *kp = d->k.shape, *vp = d->v.shape;
        t->k = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, kp[0], kp[1], kp[2], kp[3]);
        t->v = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, vp[0], vp[1], vp[2], vp[3]);
        t->block_table =
            clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 2, s->batch, d->table.shape[1], 0, 0);
    }
    job->k_float = t->k, job->v_float = t->v;
    job->k_scale = o->k_scale, job->v_scale = o->v_scale;
    if (o->kv_dtype == CLATTN_DTYPE_F32)
        return v_view(o, job);
    const char *name = kv_dtype_name(o->kv_dtype);
    const bool fp8 = o->kv_dtype == CLATTN_DTYPE_FP8_E4M3 || o->kv_dtype == CLATTN_DTYPE_FP8_E5M2;
    if (!fp8 && (dk % 32 != 0 || dv % 32 != 0))
        return cli_fail("sdpa", CLI_BAD_INPUT,
                        "--kv-dtype %s: the head sizes (k %zu, v %zu) must be multiples of "
                        "32 (a block holds 32 values)",
                        name, dk, dv);
    /* bytes per 32 values: blocks of 34 (q8_0) or 18 (q4_0), or a byte a value (fp8) */
    const size_t block_bytes = fp8 ? 32 : o->kv_dtype == CLATTN_DTYPE_Q8_0 ? 34 : 18;
    const size_t *kd = t->k.dims, *vd = t->v.dims;
    const int rank = t->k.rank; /* 4, or 3 for packed sequences */
    t->k = clattn_tensor_make(NULL, 0, o->kv_dtype, rank, kd[0], kd[1], kd[2], kd[3]);
    t->v = clattn_tensor_make(NULL, 0, o->kv_dtype, rank, vd[0], vd[1], vd[2], vd[3]);
    job->kq_bytes = fp8 ? tensor_count(&t->k) : tensor_count(&t->k) / 32 * block_bytes;
    job->vq_bytes = o->v_from_k ? 0 : fp8 ? tensor_count(&t->v) : tensor_count(&t->v) / 32 * block_bytes;
    return v_view(o, job);
}

/* The mask, a KV cache, the counts, the slopes, the sinks and --qk-out's scores (host room
 * for the outputs included). */
static int describe_extras(const sdpa_options *o, sdpa_data *d, const sdpa_shape *s, sdpa_job *job)
{
    int rc;
    clattn_tensors *t = &job->tensors;
    const size_t batch = s->batch, heads = s->heads, seq_q = s->seq_q, seq_k = s->seq_k;
    const size_t kv_heads = s->kv_heads, dk = s->dk, dv = s->dv;
    if (o->mask) {
        const size_t full[4] = {batch, heads, seq_q, seq_k};
        if ((rc = prepare_mask(o, d, full, &t->attn_mask)))
            return rc;
        if (o->grad_mask && d->mask_keep)
            return cli_fail("sdpa", CLI_BAD_INPUT,
                            "--grad-mask-out: %s is a bool mask; only a float mask has a gradient",
                            o->mask);
    }
    job->pk_count = batch * kv_heads * seq_k * dk, job->pv_count = batch * kv_heads * seq_k * dv;
    if (o->past_k) {
        t->past_k = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, batch, kv_heads, s->past, dk);
        t->past_v = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, batch, kv_heads, s->past, dv);
    }
    if (o->past_k || o->present_k) {
        t->present_k = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, batch, kv_heads, seq_k, dk);
        t->present_v = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, batch, kv_heads, seq_k, dv);
        d->present_k = malloc(job->pk_count * sizeof(float));
        d->present_v = malloc(job->pv_count * sizeof(float));
        if (d->present_k == NULL || d->present_v == NULL)
            return cli_fail("sdpa", CLI_FAILED, "out of memory for the present key and value");
    }
    if (o->nonpad)
        t->kv_seqlen = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 1, batch, 0, 0, 0);
    if (d->slopes.data)
        t->alibi_slopes =
            d->slopes.ndim == 1
                ? clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, heads, 0, 0, 0)
                : clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, d->slopes.shape[0], heads, 0, 0);
    if (d->sinks.data)
        t->sinks = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, heads, 0, 0, 0);
    if (job->scores_out) {
        if (seq_k > SIZE_MAX / batch / heads / seq_q / sizeof(float))
            return cli_fail("sdpa", CLI_BAD_INPUT, "the scores are too large");
        job->scores_count = batch * heads * seq_q * seq_k;
        clattn_tensor *target = job->qk_mode == 3 ? &t->weights : &t->scores;
        *target = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, batch, heads, seq_q, seq_k);
        job->desc.scores_mode =
            job->qk_mode == 3 ? CLATTN_SCORES_SCALED : (clattn_scores)job->qk_mode;
        d->scores = malloc(job->scores_count * sizeof(float));
        if (d->scores == NULL)
            return cli_fail("sdpa", CLI_FAILED, "out of memory for the scores");
    }
    d->out = malloc(s->out_count * sizeof(float));
    if (d->out == NULL)
        return cli_fail("sdpa", CLI_FAILED, "out of memory for the output");
    job->mask_count = o->mask ? d->mask.count / d->mask.shape[d->mask.ndim - 1] * seq_k : 0;
    return CLI_OK;
}

/* --score-mod: the source, its auxiliary arrays (flat, as the functions index them) and the
 * block mask's layout (U8 (B, Hq, ceil(Lq / BQ), ceil(Lk / BK)), made on the device). */
static int describe_flex(const sdpa_options *o, const sdpa_data *d, const sdpa_shape *s,
                         sdpa_job *job)
{
    clattn_sdpa_desc *desc = &job->desc;
    clattn_tensors *t = &job->tensors;
    desc->flex.source = d->flex_source;
    desc->flex.functions = d->flex_functions;
    for (size_t i = 0; i < o->aux.count; ++i) {
        desc->flex.aux_names[i] = o->aux.names[i];
        t->by_role[CLATTN_ROLE_FLEX_AUX0 + i] =
            clattn_tensor_make(NULL, 0, d->aux_dtype[i], 1, d->aux_file[i].count, 0, 0, 0);
    }
    if (!o->block_sizes[0])
        return CLI_OK;
    const size_t bq = o->block_sizes[0], bk = o->block_sizes[1];
    const size_t q_blocks = (s->seq_q - 1) / bq + 1, k_blocks = (s->seq_k - 1) / bk + 1;
    if (k_blocks > SIZE_MAX / s->batch / s->heads / q_blocks)
        return cli_fail("sdpa", CLI_BAD_INPUT, "--block-mask: the block mask is too large");
    desc->flex.block_q = bq;
    desc->flex.block_k = bk;
    t->block_mask =
        clattn_tensor_make(NULL, 0, CLATTN_DTYPE_U8, 4, s->batch, s->heads, q_blocks, k_blocks);
    job->block_mask_count = s->batch * s->heads * q_blocks * k_blocks;
    return CLI_OK;
}

/* --backward: the forward keeps lse; the backward's descriptor adds dO and the gradients,
 * float32 in their inputs' layouts (host room for them included). */
static int describe_backward(const sdpa_options *o, sdpa_data *d, const sdpa_shape *s,
                             sdpa_job *job)
{
    clattn_tensors *t = &job->tensors, *back = &job->back_tensors;
    /* lse from the fused forward; unfused (--path unfused, --softmax-precision 11) both
     * passes run without it (the backward's reference path recomputes the weights whole) */
    if (job->desc.path != CLATTN_PATH_UNFUSED && !job->desc.softmax_f64)
        t->lse =
            o->varlen /* packed sequences: (Hq, total_q) */
                ? clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, s->heads, s->seq_q, 0, 0)
                : clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, s->batch, s->heads, s->seq_q, 0);
    *back = *t;
    CLATTN_BIND_ROLES(job->back_desc, *back);
    back->grad_out = t->out;
    back->grad_q = t->q;
    back->grad_k = job->k_float, back->grad_k.dtype = CLATTN_DTYPE_F32;
    back->grad_v = job->v_float, back->grad_v.dtype = CLATTN_DTYPE_F32;
    if (o->grad_mask)
        back->grad_attn_mask = t->attn_mask;
    if (o->grad_sinks)
        back->grad_sinks = t->sinks;
    size_t *counts = job->grad_counts;
    counts[0] = tensor_count(&back->grad_q);
    counts[1] = tensor_count(&back->grad_k);
    counts[2] = tensor_count(&back->grad_v);
    counts[3] = o->grad_mask ? job->mask_count : 0;
    counts[4] = o->grad_sinks ? s->heads : 0;
    for (int i = 0; i < 5; ++i)
        if (counts[i] && (d->grad[i] = malloc(counts[i] * sizeof(float))) == NULL)
            return cli_fail("sdpa", CLI_FAILED, "out of memory for the gradients");
    return CLI_OK;
}

/* The descriptors and the tensors' layouts for the run. */
static int describe(const sdpa_options *o, sdpa_data *d, const sdpa_shape *s, sdpa_job *job)
{
    int rc;
    job->scores_out = o->qk_out || o->heatmap.png;
    job->qk_mode = o->heatmap.png ? 3 : o->qk_mode;
    clattn_sdpa_desc_init(&job->desc);
    CLATTN_BIND_ROLES(job->desc, job->tensors);
    describe_options(o, &job->desc);
    if ((rc = describe_qkv(o, d, s, job)) || (rc = describe_extras(o, d, s, job)) ||
        (o->score_mod && (rc = describe_flex(o, d, s, job))))
        return rc;
    job->back_desc = job->desc; /* the backward's own tensors bound in describe_backward */
    return o->backward ? describe_backward(o, d, s, job) : CLI_OK;
}

/* The device buffers: the inputs uploaded, room for the outputs; the first error in *err. */
static void upload_all(clattn_ctx *ctx, const sdpa_options *o, sdpa_data *d, const sdpa_shape *s,
                       const sdpa_job *job, cl_int *err)
{
    const size_t f = sizeof(float);
    struct {
        bool on;
        int slot;
        const void *data;
        size_t bytes;
        cl_mem_flags flags;
    } const buffers[] = {
        {true, M_Q, d->q.data, d->q.count * f, CL_MEM_READ_ONLY},
        {true, M_K, d->k.data, d->k.count * f, CL_MEM_READ_ONLY},
        {!o->v_from_k, M_V, d->v.data, d->v.count * f, CL_MEM_READ_ONLY},
        {o->mask && d->mask_keep, M_MASK, d->mask_keep, job->mask_count, CL_MEM_READ_ONLY},
        {o->mask && !d->mask_keep, M_MASK, d->mask_f32, job->mask_count * f, CL_MEM_READ_ONLY},
        {true, M_OUT, NULL, s->out_count * f, CL_MEM_WRITE_ONLY},
        {o->past_k, M_PAST_K, d->past_k.data, d->past_k.count * f, CL_MEM_READ_ONLY},
        {o->past_k, M_PAST_V, d->past_v.data, d->past_v.count * f, CL_MEM_READ_ONLY},
        {d->present_k, M_PRESENT_K, NULL, job->pk_count * f, CL_MEM_READ_WRITE},
        {d->present_k, M_PRESENT_V, NULL, job->pv_count * f, CL_MEM_READ_WRITE},
        {job->scores_out, M_SCORES, NULL, job->scores_count * f, CL_MEM_READ_WRITE},
        {o->nonpad, M_NONPAD, d->counts, s->batch * sizeof(int32_t), CL_MEM_READ_ONLY},
        {d->slopes.data, M_ALIBI, d->slopes.data, d->slopes.count * f, CL_MEM_READ_ONLY},
        {d->block_table, M_BLOCK_TABLE, d->block_table, d->table.count * sizeof(int32_t),
         CL_MEM_READ_ONLY},
        {o->varlen, M_CU_Q, d->cu[0], (d->sequences + 1) * sizeof(int32_t), CL_MEM_READ_ONLY},
        {o->varlen, M_CU_K, d->cu[1], (d->sequences + 1) * sizeof(int32_t), CL_MEM_READ_ONLY},
        {d->sinks.data, M_SINKS, d->sinks.data, s->heads * f, CL_MEM_READ_ONLY},
        {job->kq_bytes, M_KQ, NULL, job->kq_bytes, CL_MEM_READ_WRITE},
        {job->vq_bytes, M_VQ, NULL, job->vq_bytes, CL_MEM_READ_WRITE},
        {o->backward && job->tensors.lse.rank != 0, M_LSE, NULL, s->batch * s->heads * s->seq_q * f,
         CL_MEM_READ_WRITE},
    };
    for (size_t i = 0; *err == CL_SUCCESS && i < sizeof buffers / sizeof buffers[0]; ++i)
        if (buffers[i].on)
            d->mem[buffers[i].slot] =
                upload(ctx, buffers[i].data, buffers[i].bytes, buffers[i].flags, err);
    for (size_t i = 0; *err == CL_SUCCESS && i < o->aux.count; ++i)
        d->mem[M_AUX0 + i] =
            upload(ctx, d->aux[i], d->aux_file[i].count * clattn_dtype_size(d->aux_dtype[i]),
                   CL_MEM_READ_ONLY, err);
    if (*err == CL_SUCCESS && job->block_mask_count)
        d->mem[M_BLOCK_MASK] = upload(ctx, NULL, job->block_mask_count, CL_MEM_READ_WRITE, err);
}

/* --block-mask: the block mask from mask_mod, on the device. */
static clattn_status make_block_mask(clattn_ctx *ctx, const sdpa_data *d, const sdpa_shape *s,
                                     const sdpa_job *job)
{
    clattn_tensors aux = job->tensors;
    for (int i = 0; i < CLATTN_FLEX_AUX_MAX; ++i)
        aux.by_role[CLATTN_ROLE_FLEX_AUX0 + i].mem = d->mem[M_AUX0 + i];
    clattn_block_mask_desc masks;
    clattn_block_mask_desc_init(&masks);
    masks.flex = job->desc.flex;
    masks.aux = &aux.by_role[CLATTN_ROLE_FLEX_AUX0];
    masks.batch = s->batch, masks.heads = s->heads, masks.seq_q = s->seq_q, masks.seq_k = s->seq_k;
    masks.out = job->tensors.block_mask;
    masks.out.mem = d->mem[M_BLOCK_MASK];
    return clattn_flex_block_mask(ctx, &masks, 0, NULL, NULL);
}

/* --kv-dtype: K and V quantized on the device, from their float buffers. */
static clattn_status quantize_kv(clattn_ctx *ctx, const sdpa_data *d, sdpa_job *job)
{
    clattn_tensor kq = job->tensors.k, vq = job->tensors.v;
    job->k_float.mem = d->mem[M_K], job->v_float.mem = d->mem[M_V];
    kq.mem = d->mem[M_KQ], vq.mem = d->mem[M_VQ];
    clattn_status status =
        clattn_quantize_scaled(ctx, &job->k_float, &kq, job->k_scale, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS && !job->v_view)
        status = clattn_quantize_scaled(ctx, &job->v_float, &vq, job->v_scale, 0, NULL, NULL);
    return status;
}

/* The forward plan run on the uploaded buffers. */
static clattn_status execute_forward(clattn_plan *plan, const sdpa_data *d, const sdpa_job *job)
{
    clattn_tensors bound = job->tensors;
    bound.alibi_slopes.mem = d->mem[M_ALIBI];
    bound.sinks.mem = d->mem[M_SINKS];
    bound.block_table.mem = d->mem[M_BLOCK_TABLE];
    bound.cu_seqlens_q.mem = d->mem[M_CU_Q];
    bound.cu_seqlens_k.mem = d->mem[M_CU_K];
    bound.q.mem = d->mem[M_Q], bound.k.mem = d->mem[M_K], bound.v.mem = d->mem[M_V];
    if (job->kq_bytes)
        bound.k.mem = d->mem[M_KQ], bound.v.mem = d->mem[M_VQ];
    if (job->v_view)
        bound.v.mem = bound.k.mem; /* --v-from-k: the same buffer, k's strides */
    bound.attn_mask.mem = d->mem[M_MASK], bound.out.mem = d->mem[M_OUT];
    bound.past_k.mem = d->mem[M_PAST_K], bound.past_v.mem = d->mem[M_PAST_V];
    bound.present_k.mem = d->mem[M_PRESENT_K], bound.present_v.mem = d->mem[M_PRESENT_V];
    bound.kv_seqlen.mem = d->mem[M_NONPAD];
    bound.lse.mem = d->mem[M_LSE];
    for (int i = 0; i < CLATTN_FLEX_AUX_MAX; ++i)
        bound.by_role[CLATTN_ROLE_FLEX_AUX0 + i].mem = d->mem[M_AUX0 + i];
    bound.block_mask.mem = d->mem[M_BLOCK_MASK];
    bound.scores.mem = job->scores_out && job->qk_mode != 3 ? d->mem[M_SCORES] : NULL;
    bound.weights.mem = job->scores_out && job->qk_mode == 3 ? d->mem[M_SCORES] : NULL;
    return clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL);
}

/* Y, the scores and the present key and value back to the host. */
static cl_int read_back(clattn_ctx *ctx, sdpa_data *d, const sdpa_shape *s, const sdpa_job *job)
{
    const struct {
        bool on;
        int slot;
        void *host;
        size_t count;
    } reads[] = {{true, M_OUT, d->out, s->out_count},
                 {job->scores_out, M_SCORES, d->scores, job->scores_count},
                 {d->present_k, M_PRESENT_K, d->present_k, job->pk_count},
                 {d->present_k, M_PRESENT_V, d->present_v, job->pv_count}};
    cl_int err = CL_SUCCESS;
    for (size_t i = 0; err == CL_SUCCESS && i < sizeof reads / sizeof reads[0]; ++i)
        if (reads[i].on)
            err = clEnqueueReadBuffer(clattn_ctx_queue(ctx), d->mem[reads[i].slot], CL_TRUE, 0,
                                      reads[i].count * sizeof(float), reads[i].host, 0, NULL, NULL);
    return err;
}

/* The one line for a failed run: a status (the stage it came from) or an OpenCL error. */
static int report_failure(clattn_ctx *ctx, const sdpa_options *o, clattn_status status,
                          bool refused, const char *stage, cl_int err)
{
    if (status == CLATTN_SUCCESS)
        return err == CL_SUCCESS
                   ? CLI_OK
                   : cli_fail("sdpa", CLI_FAILED, "OpenCL error %d moving the data", (int)err);
    /* (a --score-mod source that does not build is the user's input too) */
    const bool input_error = refused || status == CLATTN_ERR_INVALID_ARGUMENT ||
                             (o->score_mod && status == CLATTN_ERR_BUILD) ||
                             status == CLATTN_ERR_INVALID_SHAPE || status == CLATTN_ERR_OVERFLOW ||
                             status == CLATTN_ERR_TOO_LARGE;
    const char *message = clattn_last_error(ctx), *diagnostic = NULL;
    if (o->score_mod && status == CLATTN_ERR_BUILD) /* the log's first line on the source */
        diagnostic = first_source_line(message);
    if (diagnostic)
        return cli_fail("sdpa", CLI_BAD_INPUT, "%s%s: --score-mod %s does not build: %.*s", stage,
                        clattn_status_string(status), o->score_mod, (int)strcspn(diagnostic, "\n"),
                        diagnostic);
    return cli_fail("sdpa", input_error ? CLI_BAD_INPUT : CLI_FAILED, "%s%s: %s", stage,
                    clattn_status_string(status), message);
}

/* The plans made and run on the device (the backward's plan first: what it refuses fails
 * before any device work); the results in d. */
static int run_device(const sdpa_options *o, sdpa_data *d, const sdpa_shape *s, sdpa_job *job)
{
    clattn_ctx *ctx = cli_context("sdpa", o->exec.device);
    if (ctx == NULL)
        return cli_context_exit();
    clattn_plan *plan = NULL, *backward = NULL;
    clattn_status status = o->backward
                               ? clattn_sdpa_backward_plan_create(ctx, &job->back_desc, &backward)
                               : CLATTN_SUCCESS;
    const char *stage = status == CLATTN_SUCCESS ? "" : "--backward: ";
    const bool refused = status == CLATTN_ERR_UNSUPPORTED; /* an option the backward lacks */
    if (status == CLATTN_SUCCESS)
        status = clattn_sdpa_plan_create(ctx, &job->desc, &plan);
    cl_int err = CL_SUCCESS;
    if (status == CLATTN_SUCCESS)
        upload_all(ctx, o, d, s, job, &err);
    if (err == CL_SUCCESS && status == CLATTN_SUCCESS && job->block_mask_count) {
        status = make_block_mask(ctx, d, s, job);
        if (status != CLATTN_SUCCESS)
            stage = "--block-mask: ";
    }
    if (err == CL_SUCCESS && status == CLATTN_SUCCESS && job->kq_bytes) /* quantize, attend */
        status = quantize_kv(ctx, d, job);
    if (err == CL_SUCCESS && status == CLATTN_SUCCESS)
        status = execute_forward(plan, d, job);
    if (err == CL_SUCCESS && status == CLATTN_SUCCESS)
        err = read_back(ctx, d, s, job);
    if (err == CL_SUCCESS && status == CLATTN_SUCCESS && o->backward) {
        stage = "--backward: ";
        err = run_backward(ctx, d, &job->back_tensors, backward, job->grad_counts, &status);
    }
    const int rc = report_failure(ctx, o, status, refused, stage, err);
    clattn_plan_release(backward);
    clattn_plan_release(plan);
    cli_release_buffers(d->mem, M_COUNT);
    cli_release_context(ctx);
    return rc;
}

/* The outputs asked for: the present key and value, the scores, the heatmap, the gradients
 * and Y. */
static int write_results(const sdpa_options *o, sdpa_data *d, const sdpa_shape *s)
{
    int rc;
    const size_t batch = s->batch, heads = s->heads, seq_q = s->seq_q, seq_k = s->seq_k;
    const size_t present_k_shape[4] = {batch, s->kv_heads, seq_k, s->dk};
    const size_t present_v_shape[4] = {batch, s->kv_heads, seq_k, s->dv};
    if (o->present_k && ((rc = write_npy(o->present_k, d->present_k, 4, present_k_shape, &d->k)) ||
                         (rc = write_npy(o->present_v, d->present_v, 4, present_v_shape, &d->v))))
        return rc;
    const size_t scores_shape[4] = {batch, heads, seq_q, seq_k};
    if (o->qk_out && (rc = write_npy(o->qk_out, d->scores, 4, scores_shape, &d->q)))
        return rc;
    if (o->heatmap.png && (rc = write_heatmap(o, d, heads, seq_q, seq_k)))
        return rc;
    if (o->backward && (rc = write_grads(o, d, seq_k, heads)))
        return rc;
    if (o->backward && !o->out) /* the gradients are the result: Y is not printed */
        return CLI_OK;
    return write_out(o, d, batch, heads, seq_q, s->dv, s->rank3);
}

static int run_sdpa(const sdpa_options *o, sdpa_data *d)
{
    int rc;
    sdpa_shape shape = {0};
    if ((rc = read_problem(o, d, &shape)))
        return rc;
    if (o->ring)
        return o->check_only ? CLI_OK : run_ring(o, d, &shape);
    sdpa_job job; /* the descriptors point into it: it stays here */
    memset(&job, 0, sizeof job);
    rc = describe(o, d, &shape, &job);
    if (rc == CLI_OK && !o->check_only)
        rc = run_device(o, d, &shape, &job);
    if (rc != CLI_OK || o->check_only)
        return rc;
    return write_results(o, d, &shape);
}

static int sdpa_command(int argc, char **argv, bool check_only)
{
    sdpa_options options = {.score = {.scale = NAN, .norm = CLATTN_NORM_SOFTMAX},
                            .check_only = check_only};
    int rc = parse_sdpa_options(argc, argv, &options);
    if (rc != CLI_OK)
        return rc < 0 ? CLI_OK : rc;
    sdpa_data data;
    memset(&data, 0, sizeof data);
    if (check_only) {
        rc = run_sdpa(&options, &data);
        sdpa_free(&data);
        return rc;
    }
#ifdef CLATTN_CLI_MPI
    if (options.ring && (rc = cli_ring_init()) != CLI_OK)
        return rc;
#endif
    rc = run_sdpa(&options, &data);
    sdpa_free(&data);
#ifdef CLATTN_CLI_MPI
    if (options.ring)
        cli_ring_finalize();
#endif
    return rc;
}

int cmd_sdpa(int argc, char **argv)
{
    return sdpa_command(argc, argv, false);
}

int cmd_sdpa_check(int argc, char **argv)
{
    return sdpa_command(argc, argv, true);
}
