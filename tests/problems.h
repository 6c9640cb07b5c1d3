/*
 * The one builder of random test problems and masks (tests and bench/soak only).
 *
 * A problem is drawn from a spec: logical packed float inputs (rounded to the dtype each device
 * tensor stores, so the float64 reference of reference.h sees exactly what the device reads),
 * masks of any broadcast shape, the tensor layouts a plan is created from (packed, a
 * (B, L, H*d) buffer read as heads, padded strides, ...), and the float64 reference outputs.
 * Device helpers upload logical arrays into strided typed buffers whose unused elements are
 * poison (NaN; U8: a 0x00/0xFF pattern), download strided typed tensors back into logical
 * arrays, and run a whole problem through a plan, comparing every output with the reference.
 *
 * No dependence on check or testutil: random numbers and failure reports go through hooks
 * (pb_set_hooks). tu_suite_begin installs testutil's seeded generator and failure collector,
 * so in a check suite every draw follows the per-test seeds and every failure is a tu_expect
 * failure; bench/soak.c installs its own generator. Not thread-safe: draw problems on one
 * thread (running them through clattn from other threads is fine).
 *
 * Conventions: "logical packed" = row-major over the tensor's dims, no gaps, no offset.
 * Counts and offsets are in elements of the tensor's dtype, as in clattn.h.
 */
#ifndef CLATTN_PROBLEMS_H
#define CLATTN_PROBLEMS_H

#include <stddef.h>
#include <stdint.h>

#include "clattn.h"
#include "reference.h"

/* --- hooks: random numbers and failure reports --------------------------------------------- */

typedef struct pb_hooks {
    uint64_t (*rand_u64)(void);         /* NULL: a built-in splitmix64 (seed 1) */
    void (*fail)(const char *message);  /* NULL: print to stderr */
    void (*track_error)(double error);  /* each comparison's relative error; may be NULL */
} pb_hooks;

/* Installs hooks (NULL: the defaults). */
void pb_set_hooks(const pb_hooks *hooks);

uint64_t pb_rand_u64(void);
double pb_rand_unit(void);          /* [0, 1) */
size_t pb_rand_below(size_t bound); /* [0, bound), bound > 0 */
void pb_fill_uniform(float *values, size_t count, float low, float high);

/* The generators' pieces, for testutil's own stream: one splitmix64 step of *state, and a
 * uniform [low, high) fill drawing from `unit` ([0, 1) values). */
uint64_t pb_splitmix64(uint64_t *state);
void pb_fill_uniform_from(double (*unit)(void), float *values, size_t count, float low, float high);

/* Reports a failure through the hook (printf-style). Always returns 0. */
int pb_fail(const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Allocation that aborts when out of memory (count 0 gives one element); zeroed. */
void *pb_calloc(size_t count, size_t size);
float *pb_nan_floats(size_t count);

/* --- dtypes --------------------------------------------------------------------------------- */

/* float <-> IEEE half and bfloat16, round to nearest even (NaN stays NaN, overflow gives inf). */
uint16_t pb_f16_from_float(float value);
float pb_f16_to_float(uint16_t bits);
uint16_t pb_bf16_from_float(float value);
float pb_bf16_to_float(uint16_t bits);

/* FP8 (FP8_E4M3, FP8_E5M2; OCP): a code's value, and a float's code (round to nearest even,
 * saturating past the largest finite value; e5m2 keeps infinities; NaN gives 0x7f with the
 * sign), clattn_quantize_scaled's rule. */
float pb_fp8_decode(clattn_dtype dtype, uint8_t code);
uint8_t pb_fp8_encode(clattn_dtype dtype, float value);

/* value as a tensor of `dtype` stores it: F32 unchanged, F16/BF16 rounded to nearest even,
 * FP8 to its nearest code (scale 1),
 * U8: 0 stays 0, anything else becomes its byte (clamped to 1..255) as a float. */
float pb_round(clattn_dtype dtype, float value);
void pb_round_array(clattn_dtype dtype, float *values, size_t count);
const char *pb_dtype_name(clattn_dtype dtype); /* "F32", "F16", "BF16", "U8" */

/* Relative tolerance of an output STORED in dtype against the float64 reference of the rounded
 * inputs: F32 1e-4 (TU_TOL), F16 2e-3, BF16 1.6e-2. */
double pb_tolerance(clattn_dtype stored);

/* --- layouts -------------------------------------------------------------------------------- */

typedef enum pb_layout {
    PB_PACKED = 0,        /* packed row-major (strides spelled out, as clattn_tensor_make's) */
    PB_PACKED_STRIDES,    /* the same (all-zero strides meant packed before 0.7) */
    PB_SEQ_MAJOR,         /* rank 4 (B, H, L, d) viewed in a (B, L, H*d) buffer: strides
                           * (L*H*d, d, H*d, 1); other ranks: as PB_PACKED_STRIDES */
    PB_SEQ_MAJOR_PADDED,  /* as PB_SEQ_MAJOR with rows of H*d + gap (gap 1..7, drawn) */
    PB_PADDED,            /* every dim's stride above the packed one (gaps drawn), last 1 */
    PB_STRIDED_LAST,      /* last dim's stride 2 (plus padded leading strides); the fused
                           * SDPA path takes it, the unfused path and matmul need stride 1 */
    PB_LAYOUT_COUNT
} pb_layout;

const char *pb_layout_name(pb_layout layout);

/* Fills t with a layout of `dims` (mem NULL, offset 0). Draws the gaps of padded layouts. */
void pb_make_layout(clattn_tensor *t, clattn_dtype dtype, int rank, const size_t *dims,
                    pb_layout layout);
/* Product of t's dims (0 for an absent tensor). */
size_t pb_tensor_count(const clattn_tensor *t);
/* t's strides with the packed ones filled in (strides all 0 = packed). */
void pb_tensor_strides(const clattn_tensor *t, size_t strides[CLATTN_MAX_RANK]);
/* 1 + the highest element offset t's strides reach (from its offset). */
size_t pb_tensor_extent(const clattn_tensor *t);

/* --- device buffers ------------------------------------------------------------------------- */

/* Creates a buffer of offset + extent + 3 elements of t->dtype on ctx's cl_context, holding
 * the logical packed `values` (pb_tensor_count(t) floats, converted to t->dtype) at t's
 * strided positions and poison everywhere else; values NULL: poison only (an output). Sets
 * t->mem and t->offset. Along a stride-0 dim every repeat lands on one element: the logical
 * values must repeat there too. Returns CL_SUCCESS or the OpenCL error (also reported as a
 * failure). */
cl_int pb_upload(clattn_ctx *ctx, clattn_tensor *t, size_t offset, const float *values);
/* Rewrites t's whole existing buffer: poison, then values (NULL: poison only). Blocking, on
 * queue (NULL: the context's) after the context's queued work. */
cl_int pb_rewrite(clattn_ctx *ctx, cl_command_queue queue, const clattn_tensor *t,
                  const float *values);
/* Waits for ctx's work (and queue's, when not NULL), reads t into the logical packed floats
 * `values` (pb_tensor_count(t) of them); *stray (may be NULL) receives how many elements of the
 * buffer outside t are no longer poison (stray writes). */
cl_int pb_download(clattn_ctx *ctx, cl_command_queue queue, const clattn_tensor *t, float *values,
                   size_t *stray);
/* Releases every distinct cl_mem of the tensors (a buffer bound to several roles once) and
 * sets them NULL. */
void pb_release_tensors(clattn_tensors *tensors);

/* --- masks ---------------------------------------------------------------------------------- */

typedef enum pb_mask_kind {
    PB_MASK_NONE = 0,
    PB_MASK_FLOAT = 1, /* additive: uniform [-1, 1), about one entry in four -INFINITY */
    PB_MASK_BOOL = 2   /* U8: nonzero keeps (1 or 255), about one entry in four 0 (masked) */
} pb_mask_kind;

/* --- scaled dot-product attention problems --------------------------------------------------- */

typedef struct pb_sdpa_spec {
    size_t batch, heads, seq_q, seq_k, dk, dv;
    float scale; /* passed to clattn as is: NAN = 1/sqrt(dk) (pb_sdpa_spec_init sets NAN) */
    clattn_norm norm;
    clattn_causal causal;
    clattn_path path;
    clattn_dtype q_dtype, k_dtype, v_dtype, out_dtype; /* storage (F32 = 0) */
    pb_layout q_layout, k_layout, v_layout, out_layout;
    /* attn_mask: rank mask_rank (1..4; 0 means 2) right-aligned on (B, H, Lq, Lk): rank 2 is
     * (Lq, Lk), rank 3 (H, Lq, Lk), rank 1 (Lk). mask_ones: bit d (0 = B, 1 = H, 2 = Lq,
     * 3 = Lk) gives that dim size 1 (broadcast). mask_zero_strides (rank 4 only, and not
     * with all four dims broadcast: all-zero strides are refused): the broadcast dims keep
     * their full size with stride 0 instead. */
    pb_mask_kind mask;
    clattn_dtype mask_dtype; /* PB_MASK_FLOAT: F32 (0), F16 or BF16; PB_MASK_BOOL: always U8 */
    int mask_rank;
    unsigned mask_ones;
    int mask_zero_strides;
    pb_layout mask_layout; /* PB_PACKED or PB_PADDED */
    int padding;           /* key_padding_mask (B, Lk) U8, about 3 in 10 keys ignored */
    /* 1: padding ignores every key of batch 0 (turns padding on); 2: the mask masks every key
     * of query 0 (turns a float mask on if none; needs the Lq dim not broadcast) */
    int fully_masked;
    int want_weights, want_lse;
    float q_gain; /* q is uniform in [-q_gain, q_gain) (0: 1) to spread the scores */
    int skip_reference; /* leave out_ref, weights_ref and lse_ref NULL (huge problems that a
                         * test checks on sampled rows itself) */
    size_t kv_heads; /* heads of k and v (0: heads; must divide heads): grouped-query attention */
    float softcap;   /* 0: off; else scores capped as softcap * tanh(s / softcap) */
    /* ONNX Attention's key rules: kv_len 1: I32 key counts per batch in [0, seq_k] (kv_seqlen);
     * past P (0 < P < seq_k): the first P keys are past_k/past_v and the rest k/v, and
     * present_k/present_v (k's and v's dtype and layout) receive them all; a sliding window
     * with window_align other than NONE. */
    int kv_len;
    size_t past;
    clattn_causal window_align;
    long long window_left, window_right;
    long long diag_offset; /* CLATTN_CAUSAL_OFFSET's diagonal (clattn_sdpa_desc.diag_offset) */
    int softmax_f64; /* the normalisation in double (unfused only) */
    /* ALiBi slopes (alibi_slopes): 0 none, 1 one per head (heads), 2 per batch and head
     * (batch, heads); drawn by pb_sdpa_make: per head the paper's slopes or uniform in
     * [0, 0.5), per (batch, head) uniform */
    int alibi;
    /* Rotary embeddings on q and the new keys (clattn_sdpa_desc's rope fields); present_k is
     * then checked against past + the rotated new keys */
    int rope;
    clattn_rope_style rope_style;
    size_t rope_dims;
    double rope_base;
    size_t rope_start;
    /* Attention sinks (sinks, F32 (H); softmax only): 0 none; 1 one logit per head, uniform
     * in [-2, 4), about one head in eight -INFINITY (no sink), in a packed or a padded (stride
     * > 1) buffer (sinks_layout) */
    int sinks;
    pb_layout sinks_layout;
    /* A paged KV cache (block_table; the fused path only): 0 off; else keys per page. seq_k
     * must be a multiple of it and kv_len is turned on. k and v are uploaded as pools of
     * (num_pages, page_size, Hkv, d) pages (the k/v layouts applied to the pool) in a drawn
     * order, with spare pages of NaN; keys past a batch's count are NaN in their pages, and
     * the blocks wholly past it get indices outside the pool (never to be read). */
    size_t page_size;
    /* Packed variable-length batches (cu_seqlens_q/_k; the fused path only): 0 off; 1 on:
     * batch b has its own n_q(b) in 0 .. seq_q query rows and n_k(b) in 0 .. seq_k keys
     * (drawn, the ends now and then; one sequence has both maxima), packed without padding
     * into q (total_q, H, dk), k and v (total_k, Hkv, d), out (total_q, H, dv) and lse
     * (H, total_q), with the spec's layouts; seq_q and seq_k are the plan's max_seqlen_q/_k.
     * The reference runs each sequence alone. No masks, kv_len, past, rope or weights. 2: as
     * 1, and (batch >= 3) the sequence after the longest has no query rows, the one after that
     * no keys. With page_size (issue 50): packed queries over a paged cache: cu_seqlens_q,
     * and each request's n_k(b) keys in its pages (pools and block table as below, seq_k a
     * multiple of page_size), its count in kv_seqlen (B); no cu_seqlens_k nor max_seqlen_k
     * (p->cu_k and total_k then only index the logical keys, packed as (total_k, Hkv, d)). */
    int varlen;
    /* Dropout (clattn_sdpa_desc.dropout_p, _seed, _offset): 0 off; the reference drops the
     * same weights (ref_dropout_factor). Not with varlen, pages or quantized k/v (refused). */
    double dropout_p;
    uint64_t dropout_seed, dropout_offset;
    /* FP8 k or v (k_dtype / v_dtype FP8_E4M3 or FP8_E5M2): their per-tensor scales
     * (clattn_sdpa_desc's k_scale, v_scale; 0 means 1). The logical k and v are rounded to
     * decode(encode(x / scale)) * scale and uploaded as the codes of x / scale. */
    double k_scale, v_scale;
    /* 1: v is a view of k's storage (MLA's latent cache: k's buffer, offset and strides, its
     * first dv columns); v's values are then k's. Needs dv <= dk, k's dtype and scale, no
     * past (else turned off). */
    int v_from_k;
    /* 1: speculative decoding's tree mask (clattn_flex_tree_mask, CLATTN_TREE_MASK_SOURCE;
     * flex_aux0 tree_bits U8, flex_aux1 tree_meta I32 (B, 3)): each sequence's last n_b keys
     * (of its key count) are drafts, query row i draft i, a random tree over them; the
     * reference drops what the rule drops (pb_expand_mask; packed sequences per sequence). */
    int tree;
} pb_sdpa_spec;

#define PB_MASK_ONES_B 1u
#define PB_MASK_ONES_H 2u
#define PB_MASK_ONES_LQ 4u
#define PB_MASK_ONES_LK 8u

/* Zeros, then scale = NAN, q_gain = 2. */
void pb_sdpa_spec_init(pb_sdpa_spec *spec);

/* Random spec over awkward sizes (seq 1..129, head dims 1..64, batch 1..3, heads 1..16).
 * flags choose what else varies; unset features stay F32 / packed / none. */
#define PB_RANDOM_OPTIONS 1u  /* norm, scale, causal alignment, padding, weights, lse, path */
#define PB_RANDOM_DTYPES 2u   /* F16 / BF16 storage of q, k, v, out and float masks */
#define PB_RANDOM_LAYOUTS 4u  /* every layout (PB_STRIDED_LAST only where the path is FUSED) */
#define PB_RANDOM_MASKS 8u    /* every mask kind, rank and broadcast */
#define PB_RANDOM_GQA 32u     /* kv_heads a random divisor of heads */
#define PB_RANDOM_SOFTCAP 64u /* softcap in [0.5, 4.5) on half the problems (drawn last) */
#define PB_RANDOM_BAND 128u   /* pb_sdpa_random_band: ONNX causal, windows, kv_len, a past */
#define PB_RANDOM_ALIBI 256u  /* ALiBi slopes (rank 1 or 2) on a third of the problems */
#define PB_RANDOM_SINKS 512u  /* attention sinks on a third of the softmax problems */
#define PB_RANDOM_DROPOUT 1024u /* dropout (p 0.1 .. 0.9 or 1) on a quarter of the problems */
#define PB_RANDOM_ALL 2031u
#define PB_RANDOM_SMALL 16u   /* sizes for simulators: seq up to 63, head dims up to 16,
                               * heads up to 4 (combine with the others) */
void pb_sdpa_random_spec(pb_sdpa_spec *spec, unsigned flags);
/* Draws the key rules of a spec whose sizes and causal alignment are set: ONNX's alignment on
 * a quarter of the causal ones; a window on half (left/right -1, 0, 1, 3 or 17); then kv_len on
 * a quarter, or a past (1 .. seq_k - 1) on another quarter. */
void pb_sdpa_random_band(pb_sdpa_spec *spec);

typedef struct pb_sdpa_problem {
    pb_sdpa_spec spec;
    size_t q_count, k_count, v_count, out_count, weights_count, lse_count;
    float *q, *k, *v; /* logical packed, rounded to their dtypes */
    /* The attn_mask as uploaded: logical packed over mask_dims (rank mask_rank): floats
     * (rounded to mask_dtype) or bool as 0 / 1 (0 = masked); NULL when none. */
    float *mask;
    int mask_rank;
    size_t mask_dims[4];
    size_t mask_count;
    uint8_t *padding; /* (B, Lk), nonzero = ignore; NULL when none */
    int32_t *kv_len;  /* (B) key counts (spec.kv_len), else NULL */
    float *alibi;     /* the slopes as uploaded ((H) or (B, H); spec.alibi), else NULL */
    float *sinks;     /* the sinks as uploaded ((H); spec.sinks), else NULL */
    int32_t *block_table; /* (B, blocks) page indices (spec.page_size), else NULL */
    size_t blocks, num_pages;
    /* spec.varlen: the (B + 1) offsets of the sequences' query rows and keys, and their
     * totals; q, k, v, out_ref and lse_ref are then packed (lse_ref as (H, total_q)) */
    int32_t *cu_q, *cu_k;
    size_t total_q, total_k;
    /* spec.tree: the packed ancestor bits (tree_bytes of them, one more uploaded) and the
     * (B, 3) meta (first draft key, drafts, byte offset) as uploaded, else NULL */
    uint8_t *tree_bits;
    size_t tree_bytes;
    int32_t *tree_meta;
    /* float64 reference: out (B, H, Lq, dv), lse (B, H, Lq) and, when want_weights, weights
     * (B, H, Lq, Lk) (else NULL) */
    double *out_ref, *weights_ref, *lse_ref;
    /* Plan layouts (mem NULL): q, k, v, out, attn_mask, key_padding_mask, weights (F32,
     * packed) and lse (F32, packed) as the spec asks. Drawn once: create plans and bind
     * buffers from these. */
    clattn_tensors layouts;
    char label[512]; /* one line describing the problem, for failure messages */
} pb_sdpa_problem;

/* Draws inputs and masks, makes the layouts, computes the reference. */
void pb_sdpa_make(pb_sdpa_problem *p, const pb_sdpa_spec *spec);
/* After a test changed p->q / k / v / mask / padding: rounds them to their dtypes again and
 * recomputes the reference. */
void pb_sdpa_reference(pb_sdpa_problem *p);
void pb_sdpa_free(pb_sdpa_problem *p);

/* The reference shape of a spec (scale resolved). */
ref_sdpa_shape pb_sdpa_ref_shape(const pb_sdpa_spec *spec);
/* ... with the problem's key counts, ALiBi slopes expanded to (B, H) (into *alibi_out, which
 * the caller frees; NULL without ALiBi) and sinks. */
ref_sdpa_shape pb_sdpa_problem_ref_shape(const pb_sdpa_problem *p, float **alibi_out);
/* The expanded (B, H, Lq, Lk) additive mask of the problem's attn_mask (bool: 0 / -INFINITY)
 * and tree mask (spec.tree: -INFINITY where the tree drops a key), for ref_sdpa; NULL when
 * the problem has neither. The caller frees it. */
float *pb_expand_mask(const pb_sdpa_problem *p);
/* The plan descriptor: struct_size, layouts, causal, scale, norm, path of the spec. */
/* The specs' 0 means "the default"; the descriptors name it (CLATTN_KV_HEADS_ALL, ...). */
#define PB_OR(value, named_default) ((value) ? (value) : (named_default))

void pb_sdpa_desc(const pb_sdpa_problem *p, clattn_sdpa_desc *desc);
/* Whether a plan for the spec should be fused: FUSED yes, UNFUSED no, AUTO when no weights
 * are wanted and dk, dv <= 576. */
int pb_sdpa_expect_fused(const pb_sdpa_spec *spec);

/* Uploads the inputs (each in its own buffer at a random offset 0..8, poison around) and
 * poisoned outputs into `bound` (p->layouts with buffers). */
cl_int pb_sdpa_upload(clattn_ctx *ctx, const pb_sdpa_problem *p, clattn_tensors *bound);
/* The backward's tensors into bound, each at a random offset of its own buffer: dO (grad_out's
 * values, out's dtype and layout) and, poisoned (NaN), grad_q/_k/_v with their inputs' dtypes
 * and layouts, grad_attn_mask (want_mask: the mask's dims and dtype, packed) and grad_sinks
 * (want_sinks: F32 (heads)). Packed sequences (spec.varlen): dO, grad_q/_k/_v rank 3 over the
 * packed rows, as out, q, k and v. */
cl_int pb_sdpa_upload_gradients(clattn_ctx *ctx, const pb_sdpa_problem *p, const float *grad_out,
                                int want_mask, int want_sinks, clattn_tensors *bound);
/* The float64 backward of the problem (ref_sdpa_backward with its key counts, slopes, sinks
 * and mask; delta from `out`, the forward's output as stored, when not NULL): dq, dk, dv in q's,
 * k's and v's logical packed order (q_count, k_count, v_count), dsinks (H), dscores (B, H, Lq,
 * Lk; may be NULL). Packed sequences (spec.varlen): each sequence alone, scattered into the
 * packed gradients, the sinks' summed over them; dscores is not computed (no mask there).
 * magnitudes as ref_sdpa_backward's (every term's magnitude summed: the error scales). */
void pb_sdpa_backward_reference(const pb_sdpa_problem *p, const float *grad_out, const float *out,
                                int magnitudes, double *dq, double *dk, double *dv,
                                double *dscores, double *dsinks);
/* Poisons the output buffers of bound again (before a new execution). */
cl_int pb_sdpa_poison(clattn_ctx *ctx, cl_command_queue queue, const clattn_tensors *bound);
/* Downloads out, weights and lse from bound and compares them with the reference: out within
 * pb_tolerance(out_dtype), weights and lse within 1e-4 (lse: relative to max(|lse|, 1), -inf
 * where the reference is -inf), every output finite, rows with no kept key exactly zero, no
 * stray write outside any output. Returns 1 when all pass (failures go to the fail hook). */
int pb_sdpa_check(clattn_ctx *ctx, cl_command_queue queue, const pb_sdpa_problem *p,
                  const clattn_tensors *bound);

typedef struct pb_run_options {
    cl_command_queue queue; /* NULL: the context's */
    int executions;         /* executions of one plan (0: 1); each on fresh buffers at new
                             * offsets from the second on, outputs checked each time */
    int caller_workspace;   /* pass a buffer of clattn_plan_workspace_size bytes */
} pb_run_options;

/* Creates the plan (checking clattn_plan_is_fused against pb_sdpa_expect_fused), uploads,
 * executes, checks (pb_sdpa_check), releases. options may be NULL. With CLATTN_TEST_TRACE
 * set, prints "problems: running <label>" to stderr first (to match a simulator's reports,
 * printed as they happen, to their problem). Returns the first
 * failing clattn status (CLATTN_SUCCESS when every call succeeded; the numbers may still
 * have failed: see the fail hook). */
clattn_status pb_sdpa_run(clattn_ctx *ctx, const pb_sdpa_problem *p,
                          const pb_run_options *options);
/* Uploads p and executes plan (made for p, on ctx's queue) on it twice, the outputs poisoned
 * before each run (the second reuses the plan's scratch and workspace), checking each run
 * (pb_sdpa_check); releases the buffers. The first failing status (CLATTN_SUCCESS when every
 * call succeeded; the numbers may still have failed: see the fail hook). */
clattn_status pb_sdpa_execute_twice(clattn_ctx *ctx, clattn_plan *plan, const pb_sdpa_problem *p);

/* --- multi-head attention problems ------------------------------------------------------- */

typedef enum pb_mha_form {
    PB_PACKED_SELF = 0,  /* in_proj_weight (TORCH layout), key = value = query */
    PB_PACKED_CROSS,     /* in_proj_weight, key = value differ from the query */
    PB_SEPARATE_SELF,    /* q/k/v weights, key = value = query */
    PB_SEPARATE_CROSS    /* q/k/v weights, key and value separate (kdim, vdim) */
} pb_mha_form;

typedef struct pb_mha_spec {
    size_t batch, seq_q, seq_k, embed_dim, num_heads;
    size_t kdim, vdim, qk_dim, v_dim; /* 0: embed_dim. Self forms: seq_k = seq_q and
                                       * kdim = vdim = embed_dim; packed forms: all embed_dim */
    clattn_weight_layout layout;      /* packed forms use TORCH whatever is set here */
    pb_mha_form form;
    int in_biases, out_proj, out_bias;
    clattn_need_weights need_weights;
    clattn_causal causal;
    pb_mask_kind mask; /* attn_mask (seq_q, seq_k): floats with -inf, or U8 bool */
    int padding;       /* key padding: batch entry 0 keeps key 0, entry 2 (if any) fully masked */
    float scale;       /* NAN: default (pb_mha_spec_init) */
    clattn_norm norm;
    clattn_path path;
    /* MHA plan layouts of query/key/value/out: dtype (F32 = 0) and extra elements after
     * each row of the (batch, seq, width) tensor (0: packed). Weights and masks stay F32/U8
     * packed. Self forms bind one buffer to query, key and value (query's layout). */
    clattn_dtype query_dtype, key_dtype, value_dtype, out_dtype;
    size_t query_row_gap, key_row_gap, value_row_gap, out_row_gap;
    /* Grouped-query projections (separate forms only): k and v heads (0: num_heads); k_weight
     * then has qk_dim / num_heads * num_kv_heads outputs, v_weight v_dim / num_heads * ... */
    size_t num_kv_heads;
    /* Rotary embeddings on the projected q and k (clattn_mha_desc's rope fields) */
    int rope;
    clattn_rope_style rope_style;
    size_t rope_dims;
    double rope_base;
    size_t rope_start;
} pb_mha_spec;

/* Zeros, then scale = NAN. */
void pb_mha_spec_init(pb_mha_spec *spec);

enum pb_mha_param {
    PB_IN_PROJ_W = 0, PB_IN_PROJ_B, PB_Q_W, PB_K_W, PB_V_W, PB_Q_B, PB_K_B, PB_V_B, PB_OUT_W,
    PB_OUT_B, PB_PARAM_COUNT
};

typedef struct pb_mha_problem {
    pb_mha_spec spec;          /* resolved: seq_k, kdim, vdim, qk_dim, v_dim filled in */
    clattn_mha_host_desc desc; /* for clattn_mha_forward_host and ref_mha_forward */
    float *params[PB_PARAM_COUNT]; /* NULL where absent; scaled by 1.5/sqrt(fan_in) */
    size_t param_dims[PB_PARAM_COUNT][2]; /* as stored: (rows, cols), biases (n, 0) */
    clattn_mha_host_weights weights;      /* pointing at params */
    float *query, *key, *value; /* key, value NULL for self forms; rounded to their dtypes */
    size_t query_count, key_count, value_count;
    float *attn_mask;   /* (Lq, Lk) additive (bool masks as 0 / -INFINITY); NULL when none */
    uint8_t *bool_mask; /* (Lq, Lk) U8, nonzero keeps, when spec.mask == PB_MASK_BOOL */
    uint8_t *padding;   /* (B, Lk) or NULL */
    clattn_host_masks masks; /* {attn_mask, padding} for the host API */
    size_t out_dim, out_count, attn_count; /* attn_count 0 for NONE */
    double *out_ref, *attn_ref;            /* attn_ref NULL for NONE */
    clattn_tensors layouts;                /* MHA plan layouts (mem NULL) */
    char label[512];
} pb_mha_problem;

/* Draws parameters, inputs and masks; computes the reference. */
void pb_mha_make(pb_mha_problem *p, const pb_mha_spec *spec);
/* Fresh query/key/value (rounded); the reference is NOT recomputed (pb_mha_reference). */
void pb_mha_redraw_inputs(pb_mha_problem *p);
void pb_mha_reference(pb_mha_problem *p);
void pb_mha_free(pb_mha_problem *p);

/* The plan descriptor from the problem (layouts, heads, layout, causal, scale, norm,
 * need_weights, path). */
void pb_mha_desc(const pb_mha_problem *p, clattn_mha_desc *desc);
/* Uploads every input and parameter (own buffers, random offsets, poison around; self forms:
 * one buffer for query, key and value) and poisoned outputs into bound. */
cl_int pb_mha_upload(clattn_ctx *ctx, const pb_mha_problem *p, clattn_tensors *bound);
cl_int pb_mha_poison(clattn_ctx *ctx, cl_command_queue queue, const clattn_tensors *bound);
/* Downloads out and weights from bound and compares them with the reference (out within
 * pb_tolerance(out_dtype), weights 1e-4, finite, no stray writes). Returns 1 when all pass. */
int pb_mha_check(clattn_ctx *ctx, cl_command_queue queue, const pb_mha_problem *p,
                 const clattn_tensors *bound);
/* Compares host-API outputs (out: out_count floats, attn: attn_count or NULL) with the
 * reference, within 1e-4. Returns 1 when all pass. */
int pb_mha_check_host(const pb_mha_problem *p, const float *out, const float *attn);
/* As pb_sdpa_run for an MHA plan. */
clattn_status pb_mha_run(clattn_ctx *ctx, const pb_mha_problem *p, const pb_run_options *options);

/* --- comparisons (through the hooks) ------------------------------------------------------- */

/* max |got - want| / max(max |want|, 1e-30) over the finite want; INFINITY when got is not
 * finite where want is. */
double pb_rel_error(const float *got, const double *want, size_t count);
/* The expanded (B, H, Lq, Lk) score gradient dscores summed over the problem's mask's broadcast
 * dims (right-aligned dims of 1 where the problem's dim is not) into out (the mask's logical
 * packed elements): a broadcast float mask's gradient. */
void pb_reduce_to_mask(const pb_sdpa_problem *p, const double *dscores, double *out);
/* Reports "<label>: <what>: relative error E > tol (worst at [i]: got, want)" when over tol;
 * tracks the error. Returns 1 when within. */
int pb_expect_close(const char *label, const char *what, const float *got, const double *want,
                    size_t count, double tol);

#endif /* CLATTN_PROBLEMS_H */
