/*
 * check_sweep: the interaction sweep. One generator draws random SDPA problems over the cross
 * product of the score features (llama.cpp's test-backend-ops is the model) and checks each one
 * against the float64 reference on every path:
 *
 *   axes (each an enum below, so that draws can be counted): the context (PoCL's own CPU
 *   parameters, the GPU-class ones, split launches under a loop-trip limit, decode splits),
 *   the GQA ratio (1, 2, 4, 8), Lq (1, short 2..17, long 63..129), Lk (= Lq, short, long:
 *   Lq != Lk), the causal alignment and the window alignment drawn separately (none, top-left,
 *   bottom-right, ONNX, a diagonal offset), the window's left and right sizes (unbounded, 0,
 *   small, beyond every key), soft-capping, ALiBi ((H) or (B, H) slopes), attention sinks (one
 *   logit per query head, some -inf, packed or strided), a paged KV cache (pages of 1 key,
 *   2..17 or 32..256, in a drawn order; the fused path only), the mask (none, bool,
 *   float), its rank (1 to 4, or a rank-4 view with stride 0 on its broadcast dims) and whether
 *   it differs between heads, the key rules (all keys, per-batch key counts, a past with
 *   present_k/present_v), key padding, storage (F32, F16, BF16, mixed), the normalisation
 *   (softmax, relu, softmax in double), the layouts (packed, (B, L, H*d) views, padded, stride 2
 *   along head_dim, mixed), the outputs (out, + lse, + weights) and the head sizes.
 *   Derived and counted too: the route AUTO takes (fused, the grouped one-row decode of
 *   host/attn/sdpa.c, unfused, or refused), predicted from sdpa.c's rule, and whether that fused
 *   kernel reads K and V tiles where they lie (kv_read: flash_cpu.cl's in-place decode read,
 *   predicted from host/ops/flash.c's rule and checked against the plan's description), and
 *   whether the draw runs the backward too (AX_BACKWARD, below).
 *
 * The backward (clattn_sdpa_backward_plan_create): every drawn problem it takes (the fused
 * path's, without a past, pages, quantized k/v, packed sequences, weights or softmax_f64; one
 * in BACKWARD_ONE_IN_SMALL at small scale) runs it after the three paths, on the same context:
 * the forward on FUSED with lse, then the backward on NaN-poisoned gradients, twice, dQ, dK,
 * dV, a float mask's gradient (summed over its broadcast dims) and the sinks' against
 * ref_sdpa_backward with check_backward.c's tolerances. Listed combinations force it with
 * grouped heads, broadcast float masks, sinks, softcap, ALiBi, relu, windows, key counts,
 * 16-bit storage, the GPU-class parameters and split launches; the coverage then adds the axis
 * values and pairs the backward's draws reached.
 *
 * Every problem runs on each of FUSED, UNFUSED and AUTO: a path that can run it is executed
 * twice (pb_sdpa_run: fresh NaN-poisoned outputs each time, every output and the present
 * tensors checked, no stray writes); a path that cannot must refuse with the status clattn.h
 * documents (mixed causal/window alignments, weights or softmax_f64 on FUSED: INVALID_ARGUMENT;
 * lse, a head_dim stride other than 1, or softmax_f64 without fp64 off the fused kernel:
 * UNSUPPORTED), and any other refusal, or a success where a refusal is documented, fails.
 *
 * Coverage: each draw forces one of the combinations issue 24 lists (`required` below: a window
 * with causal masking in every alignment pair, the grouped decode with a sliding window or a
 * per-head mask, stride-0 mask views with per-batch values, the KV cache, split launches...),
 * cycling through them, and draws every other axis at random. At the end the suite prints the
 * count of every axis value, the pairwise coverage (pairs of (axis value, axis value) reached,
 * out of those the generator can reach: a census of 20000 host-only draws) and the required
 * combinations it missed (none, unless a context they need is switched off).
 *
 * Seeds and replay: the seed is printed first ("sweep: seed S (replay: ...)"); every failure
 * names its draw index and the problem. CLATTN_SWEEP_SEED=S replays a run (it wins over
 * CLATTN_TEST_SEED; "random": from the clock), CLATTN_SWEEP_DRAWS=N sets the number of draws,
 * CLATTN_SWEEP_ONLY=I runs draw I alone (each draw is a function of the seed and its index),
 * CLATTN_SWEEP_CONFIGS=default,gpu,... picks the contexts (see config_names), and
 * CLATTN_SWEEP_MISSED=1 lists every pair not reached. The seed is fixed unless set (CI is then
 * reproducible: a red run is the commit's, not the dice's), except at CLATTN_TEST_SCALE=full
 * (tests/all_lanes.sh --full), which draws a fresh one from the clock to explore; either way it
 * is printed, so every run replays.
 *
 * Tiers: unset scale (the pocl lane's CI run) SWEEP_DRAWS_CI draws, CLATTN_TEST_SCALE=small
 * (asan, rusticl, Oclgrind) SWEEP_DRAWS_SMALL smaller ones, CLATTN_TEST_SCALE=full
 * SWEEP_DRAWS_FULL. When CLATTN_PARAMS or CLATTN_LOOP_TRIP_LIMIT is set (the Oclgrind lane), the
 * contexts that would set them are left out: the environment chooses.
 */
#define _POSIX_C_SOURCE 200809L

#include "problems.h"
#include "testutil.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define COUNT_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Draws per run of each tier (measured: see README's Testing section). */
#define SWEEP_DRAWS_CI 132
#define SWEEP_DRAWS_SMALL 12
#define SWEEP_DRAWS_FULL 1500
#define CENSUS_DRAWS 20000
/* Of the drawn problems the backward takes (about one in six), each runs it too, besides
 * those the listed combinations force; at CLATTN_TEST_SCALE=small (simulators) one in
 * BACKWARD_ONE_IN_SMALL */
#define BACKWARD_ONE_IN_SMALL 3

/* --- axes ------------------------------------------------------------------------------------ */

typedef enum axis_id {
    AX_CONFIG,
    AX_GQA,
    AX_LQ,
    AX_LK,
    AX_CAUSAL,
    AX_WINDOW,
    AX_WLEFT,
    AX_WRIGHT,
    AX_SOFTCAP,
    AX_ALIBI,
    AX_SINKS,
    AX_PAGED,
    AX_QUANT,
    AX_VARLEN,
    AX_MASK,
    AX_MASK_RANK,
    AX_MASK_HEADS,
    AX_KEYS,
    AX_PADDING,
    AX_DTYPE,
    AX_NORM,
    AX_LAYOUT,
    AX_OUTPUTS,
    AX_HEAD_DIM,
    AX_ROUTE, /* derived: what AUTO runs */
    AX_READ,  /* derived: whether AUTO's fused kernel reads K and V tiles in place */
    AX_BACKWARD, /* whether the draw runs the backward too (where it takes the problem) */
    AX_COUNT
} axis_id;

enum { CFG_DEFAULT, CFG_GPU, CFG_SPLIT, CFG_CPU_SPLIT, CFG_DECODE_SPLIT, CFG_GPU_SPLIT, CFG_COUNT };
enum { GQA_1, GQA_2, GQA_4, GQA_8 };
enum { LQ_ONE, LQ_SHORT, LQ_LONG };
enum { LK_SAME, LK_SHORT, LK_LONG };
/* AL_* are clattn_causal's values */
enum { AL_NONE, AL_TOP_LEFT, AL_BOTTOM_RIGHT, AL_ONNX, AL_OFFSET };
enum { WS_OFF, WS_UNBOUNDED, WS_ZERO, WS_SMALL, WS_LARGE };
enum { OFF, ON };
enum { ALIBI_NONE, ALIBI_H, ALIBI_BH };
enum { PAGED_OFF, PAGED_1, PAGED_SMALL, PAGED_LARGE };
enum { QUANT_OFF, QUANT_Q8_0, QUANT_Q4_0 };
enum { MASK_NONE, MASK_BOOL, MASK_FLOAT };
enum { RANK_NONE, RANK_1, RANK_2, RANK_3, RANK_4, RANK_4_STRIDE0 };
enum { HEADS_NONE, HEADS_SHARED, HEADS_PER_HEAD };
enum { KEYS_ALL, KEYS_KV_LEN, KEYS_PAST };
enum { PAD_OFF, PAD_ON, PAD_BATCH_MASKED };
enum { DT_F32, DT_F16, DT_BF16, DT_MIXED };
enum { NORM_SOFTMAX, NORM_RELU, NORM_SOFTMAX_F64 };
enum { LAY_PACKED, LAY_SEQ_MAJOR, LAY_PADDED, LAY_STRIDED_LAST, LAY_MIXED };
enum { OUT_ONLY, OUT_LSE, OUT_WEIGHTS };
enum { HD_3_5, HD_16, HD_64, HD_64_16 };
enum { ROUTE_FUSED, ROUTE_GROUPED, ROUTE_UNFUSED, ROUTE_REFUSED };
enum { READ_PACKED, READ_IN_PLACE };

#define MAX_VALUES 6

typedef struct axis_def {
    const char *name;
    int count;
    const char *values[MAX_VALUES];
} axis_def;

static const axis_def axes[AX_COUNT] = {
    [AX_CONFIG] = {"config",
                   CFG_COUNT,
                   {"default", "gpu", "split", "cpu_split", "decode_split", "gpu_split"}},
    [AX_GQA] = {"gqa", 4, {"1", "2", "4", "8"}},
    [AX_LQ] = {"lq", 3, {"1", "short", "long"}},
    [AX_LK] = {"lk", 3, {"=lq", "short", "long"}},
    [AX_CAUSAL] = {"causal", 5, {"none", "top_left", "bottom_right", "onnx", "offset"}},
    [AX_WINDOW] = {"window", 5, {"none", "top_left", "bottom_right", "onnx", "offset"}},
    [AX_WLEFT] = {"wleft", 5, {"off", "-1", "0", "small", "large"}},
    [AX_WRIGHT] = {"wright", 5, {"off", "-1", "0", "small", "large"}},
    [AX_SOFTCAP] = {"softcap", 2, {"off", "on"}},
    [AX_ALIBI] = {"alibi", 3, {"none", "(H)", "(B,H)"}},
    [AX_SINKS] = {"sinks", 2, {"off", "on"}},
    [AX_PAGED] = {"paged", 4, {"off", "1", "2..17", "32..256"}},
    [AX_QUANT] = {"kv_quant", 3, {"off", "q8_0", "q4_0"}},
    [AX_VARLEN] = {"varlen", 2, {"off", "on"}},
    [AX_MASK] = {"mask", 3, {"none", "bool", "float"}},
    [AX_MASK_RANK] = {"mask_rank", 6, {"none", "1", "2", "3", "4", "4_stride0"}},
    [AX_MASK_HEADS] = {"mask_heads", 3, {"none", "shared", "per_head"}},
    [AX_KEYS] = {"keys", 3, {"all", "kv_len", "past"}},
    [AX_PADDING] = {"padding", 3, {"off", "on", "batch_masked"}},
    [AX_DTYPE] = {"dtype", 4, {"f32", "f16", "bf16", "mixed"}},
    [AX_NORM] = {"norm", 3, {"softmax", "relu", "softmax_f64"}},
    [AX_LAYOUT] = {"layout", 5, {"packed", "seq_major", "padded", "strided_last", "mixed"}},
    [AX_OUTPUTS] = {"outputs", 3, {"out", "+lse", "+weights"}},
    [AX_HEAD_DIM] = {"head_dim", 4, {"3,5", "16", "64", "64,16"}},
    [AX_ROUTE] = {"route", 4, {"fused", "grouped_decode", "unfused", "refused"}},
    [AX_READ] = {"kv_read", 2, {"packed", "in_place"}},
    [AX_BACKWARD] = {"backward", 2, {"off", "on"}},
};

/* --- the combinations issue 24 lists: each draw forces one, in turn ------------------------ */

typedef struct cond {
    signed char axis, value;
} cond;

typedef struct combo {
    cond c[3];
} combo;

/* Unused conditions have axis -1 (C2 fills the third). */
#define C2(a, x, b, y) {{{a, x}, {b, y}, {-1, 0}}}
#define C3(a, x, b, y, c, z) {{{a, x}, {b, y}, {c, z}}}

static const combo required[] = {
    /* A window together with causal masking: mixed alignments (documented refusals)... */
    C2(AX_CAUSAL, AL_TOP_LEFT, AX_WINDOW, AL_BOTTOM_RIGHT),
    C2(AX_CAUSAL, AL_BOTTOM_RIGHT, AX_WINDOW, AL_TOP_LEFT),
    C2(AX_CAUSAL, AL_TOP_LEFT, AX_WINDOW, AL_ONNX),
    C2(AX_CAUSAL, AL_ONNX, AX_WINDOW, AL_TOP_LEFT),
    C2(AX_CAUSAL, AL_BOTTOM_RIGHT, AX_WINDOW, AL_ONNX),
    C2(AX_CAUSAL, AL_ONNX, AX_WINDOW, AL_BOTTOM_RIGHT),
    C2(AX_CAUSAL, AL_OFFSET, AX_WINDOW, AL_BOTTOM_RIGHT),
    /* ...and the same alignment, whose right edge may only tighten the causal bound */
    C3(AX_CAUSAL, AL_TOP_LEFT, AX_WINDOW, AL_TOP_LEFT, AX_WRIGHT, WS_SMALL),
    C3(AX_CAUSAL, AL_BOTTOM_RIGHT, AX_WINDOW, AL_BOTTOM_RIGHT, AX_WRIGHT, WS_SMALL),
    C3(AX_CAUSAL, AL_ONNX, AX_WINDOW, AL_ONNX, AX_WRIGHT, WS_SMALL),
    C3(AX_CAUSAL, AL_OFFSET, AX_WINDOW, AL_OFFSET, AX_WRIGHT, WS_SMALL),
    C3(AX_CAUSAL, AL_TOP_LEFT, AX_WINDOW, AL_TOP_LEFT, AX_WRIGHT, WS_LARGE),
    C3(AX_CAUSAL, AL_BOTTOM_RIGHT, AX_WINDOW, AL_BOTTOM_RIGHT, AX_WLEFT, WS_SMALL),
    C3(AX_CAUSAL, AL_BOTTOM_RIGHT, AX_WINDOW, AL_BOTTOM_RIGHT, AX_KEYS, KEYS_KV_LEN),
    C3(AX_CAUSAL, AL_ONNX, AX_WINDOW, AL_ONNX, AX_KEYS, KEYS_PAST),
    C2(AX_CAUSAL, AL_ONNX, AX_KEYS, KEYS_KV_LEN),
    C3(AX_WINDOW, AL_TOP_LEFT, AX_WLEFT, WS_ZERO, AX_WRIGHT, WS_ZERO),
    /* The grouped one-row decode: a sliding window, masks whose rows differ between the heads
     * of a group, and everything else it runs with */
    C3(AX_ROUTE, ROUTE_GROUPED, AX_MASK_HEADS, HEADS_PER_HEAD, AX_MASK, MASK_FLOAT),
    C3(AX_ROUTE, ROUTE_GROUPED, AX_MASK_HEADS, HEADS_PER_HEAD, AX_MASK, MASK_BOOL),
    C3(AX_ROUTE, ROUTE_GROUPED, AX_MASK_RANK, RANK_4_STRIDE0, AX_MASK_HEADS, HEADS_SHARED),
    C3(AX_ROUTE, ROUTE_GROUPED, AX_MASK_RANK, RANK_4_STRIDE0, AX_MASK_HEADS, HEADS_PER_HEAD),
    C3(AX_ROUTE, ROUTE_GROUPED, AX_WINDOW, AL_BOTTOM_RIGHT, AX_WRIGHT, WS_ZERO),
    C2(AX_ROUTE, ROUTE_GROUPED, AX_KEYS, KEYS_PAST),
    C2(AX_ROUTE, ROUTE_GROUPED, AX_KEYS, KEYS_KV_LEN),
    C2(AX_ROUTE, ROUTE_GROUPED, AX_SOFTCAP, ON),
    C2(AX_ROUTE, ROUTE_GROUPED, AX_OUTPUTS, OUT_LSE),
    C2(AX_ROUTE, ROUTE_GROUPED, AX_NORM, NORM_RELU),
    C2(AX_ROUTE, ROUTE_GROUPED, AX_DTYPE, DT_BF16),
    C2(AX_ROUTE, ROUTE_GROUPED, AX_CONFIG, CFG_DECODE_SPLIT),
    C2(AX_ROUTE, ROUTE_GROUPED, AX_CONFIG, CFG_GPU),
    C2(AX_ROUTE, ROUTE_GROUPED, AX_CONFIG, CFG_SPLIT),
    C3(AX_LQ, LQ_ONE, AX_GQA, GQA_4, AX_WLEFT, WS_SMALL), /* a per-head window stops grouping */
    C3(AX_LQ, LQ_ONE, AX_GQA, GQA_8, AX_WLEFT, WS_ZERO),
    C3(AX_LQ, LQ_ONE, AX_GQA, GQA_8, AX_ALIBI, ALIBI_H), /* so does ALiBi */
    /* Broadcast views: stride 0 over the heads with values per batch */
    C3(AX_MASK_RANK, RANK_4_STRIDE0, AX_MASK_HEADS, HEADS_SHARED, AX_MASK, MASK_FLOAT),
    C3(AX_MASK_RANK, RANK_4_STRIDE0, AX_MASK_HEADS, HEADS_SHARED, AX_MASK, MASK_BOOL),
    C3(AX_MASK_RANK, RANK_4_STRIDE0, AX_OUTPUTS, OUT_WEIGHTS, AX_MASK_HEADS, HEADS_SHARED),
    C3(AX_MASK_RANK, RANK_4_STRIDE0, AX_CONFIG, CFG_GPU, AX_MASK_HEADS, HEADS_SHARED),
    C2(AX_MASK_RANK, RANK_4_STRIDE0, AX_CONFIG, CFG_SPLIT),
    C2(AX_MASK_RANK, RANK_3, AX_GQA, GQA_4),
    /* The KV cache and per-batch key counts */
    C2(AX_KEYS, KEYS_PAST, AX_GQA, GQA_8),
    C2(AX_KEYS, KEYS_PAST, AX_DTYPE, DT_MIXED),
    C2(AX_KEYS, KEYS_PAST, AX_LAYOUT, LAY_STRIDED_LAST),
    C2(AX_KEYS, KEYS_PAST, AX_CONFIG, CFG_SPLIT),
    C2(AX_KEYS, KEYS_KV_LEN, AX_ALIBI, ALIBI_BH),
    C2(AX_KEYS, KEYS_KV_LEN, AX_CONFIG, CFG_CPU_SPLIT),
    C2(AX_KEYS, KEYS_KV_LEN, AX_CONFIG, CFG_GPU_SPLIT),
    /* Split launches and the GPU-class kernels with the score modifiers */
    C2(AX_CONFIG, CFG_SPLIT, AX_WLEFT, WS_SMALL),
    C2(AX_CONFIG, CFG_CPU_SPLIT, AX_CAUSAL, AL_BOTTOM_RIGHT),
    C2(AX_CONFIG, CFG_GPU_SPLIT, AX_SOFTCAP, ON),
    C2(AX_CONFIG, CFG_GPU, AX_ALIBI, ALIBI_BH),
    C2(AX_CONFIG, CFG_GPU, AX_LQ, LQ_LONG),
    /* Soft-capping, ALiBi, storage and layouts */
    C2(AX_SOFTCAP, ON, AX_ALIBI, ALIBI_H),
    C2(AX_SOFTCAP, ON, AX_NORM, NORM_RELU),
    C2(AX_DTYPE, DT_BF16, AX_MASK, MASK_FLOAT),
    C2(AX_DTYPE, DT_F16, AX_LAYOUT, LAY_STRIDED_LAST),
    C2(AX_NORM, NORM_SOFTMAX_F64, AX_MASK_RANK, RANK_4_STRIDE0),
    /* Decode reading the cache in place (flash_cpu.cl's FC_DIRECT, issue 27) with the score
     * rules, storage, layouts, key rules and splits: drawable where a context runs
     * flash_cpu.cl without a loop limit (PoCL's own parameters) */
    C2(AX_READ, READ_IN_PLACE, AX_KEYS, KEYS_PAST),
    C2(AX_READ, READ_IN_PLACE, AX_KEYS, KEYS_KV_LEN),
    C2(AX_READ, READ_IN_PLACE, AX_ROUTE, ROUTE_GROUPED),
    C2(AX_READ, READ_IN_PLACE, AX_LQ, LQ_SHORT),
    C3(AX_READ, READ_IN_PLACE, AX_MASK, MASK_FLOAT, AX_MASK_HEADS, HEADS_PER_HEAD),
    C2(AX_READ, READ_IN_PLACE, AX_MASK, MASK_BOOL),
    C2(AX_READ, READ_IN_PLACE, AX_PADDING, PAD_ON),
    C2(AX_READ, READ_IN_PLACE, AX_SOFTCAP, ON),
    C2(AX_READ, READ_IN_PLACE, AX_ALIBI, ALIBI_BH),
    C3(AX_READ, READ_IN_PLACE, AX_WINDOW, AL_BOTTOM_RIGHT, AX_WLEFT, WS_SMALL),
    C2(AX_READ, READ_IN_PLACE, AX_NORM, NORM_RELU),
    C2(AX_READ, READ_IN_PLACE, AX_OUTPUTS, OUT_LSE),
    C2(AX_READ, READ_IN_PLACE, AX_DTYPE, DT_MIXED),
    C2(AX_READ, READ_IN_PLACE, AX_LAYOUT, LAY_SEQ_MAJOR),
    C2(AX_READ, READ_IN_PLACE, AX_CONFIG, CFG_DECODE_SPLIT),
    /* Attention sinks (issue 28) where a row is finished: the grouped decode (a sink per row),
     * decode splits (the merge adds it), key parts (the first part adds it, the rest resume),
     * the GPU kernel, the unfused rows (float and double), rows with no key left, and relu's
     * refusal */
    C2(AX_SINKS, ON, AX_ROUTE, ROUTE_GROUPED),
    C3(AX_SINKS, ON, AX_ROUTE, ROUTE_GROUPED, AX_CONFIG, CFG_GPU),
    C2(AX_SINKS, ON, AX_CONFIG, CFG_DECODE_SPLIT),
    C2(AX_SINKS, ON, AX_CONFIG, CFG_SPLIT),
    C2(AX_SINKS, ON, AX_CONFIG, CFG_CPU_SPLIT),
    C2(AX_SINKS, ON, AX_CONFIG, CFG_GPU),
    C2(AX_SINKS, ON, AX_CONFIG, CFG_GPU_SPLIT),
    C2(AX_SINKS, ON, AX_OUTPUTS, OUT_WEIGHTS),
    C2(AX_SINKS, ON, AX_NORM, NORM_SOFTMAX_F64),
    C2(AX_SINKS, ON, AX_NORM, NORM_RELU),
    C3(AX_SINKS, ON, AX_PADDING, PAD_BATCH_MASKED, AX_OUTPUTS, OUT_LSE),
    C2(AX_SINKS, ON, AX_KEYS, KEYS_PAST),
    C3(AX_SINKS, ON, AX_WINDOW, AL_BOTTOM_RIGHT, AX_WLEFT, WS_SMALL),
    C2(AX_READ, READ_IN_PLACE, AX_SINKS, ON),
    /* A paged KV cache (issue 28): through the block table on every fused kernel and context,
     * with the score rules, storage and layouts; refused off the fused path */
    C2(AX_PAGED, PAGED_1, AX_ROUTE, ROUTE_GROUPED),
    C2(AX_PAGED, PAGED_SMALL, AX_CONFIG, CFG_DECODE_SPLIT),
    C2(AX_PAGED, PAGED_LARGE, AX_CONFIG, CFG_GPU),
    C2(AX_PAGED, PAGED_SMALL, AX_CONFIG, CFG_SPLIT),
    C2(AX_PAGED, PAGED_SMALL, AX_CONFIG, CFG_CPU_SPLIT),
    C2(AX_PAGED, PAGED_1, AX_CONFIG, CFG_GPU_SPLIT),
    C2(AX_PAGED, PAGED_SMALL, AX_SINKS, ON),
    C2(AX_PAGED, PAGED_SMALL, AX_OUTPUTS, OUT_WEIGHTS),
    C2(AX_PAGED, PAGED_LARGE, AX_LAYOUT, LAY_STRIDED_LAST),
    C2(AX_PAGED, PAGED_SMALL, AX_DTYPE, DT_MIXED),
    C3(AX_PAGED, PAGED_SMALL, AX_MASK, MASK_FLOAT, AX_MASK_HEADS, HEADS_PER_HEAD),
    C2(AX_PAGED, PAGED_1, AX_ALIBI, ALIBI_BH),
    C3(AX_PAGED, PAGED_SMALL, AX_WINDOW, AL_BOTTOM_RIGHT, AX_WLEFT, WS_SMALL),
    C2(AX_PAGED, PAGED_LARGE, AX_PADDING, PAD_ON),
    /* Quantized k and v (issue 28): the grouped decode, pages, the in-place read, decode
     * splits, the GPU kernel, sinks, strided rows, and the unfused path's refusal */
    C2(AX_QUANT, QUANT_Q8_0, AX_ROUTE, ROUTE_GROUPED),
    C2(AX_QUANT, QUANT_Q4_0, AX_PAGED, PAGED_SMALL),
    C2(AX_QUANT, QUANT_Q8_0, AX_READ, READ_IN_PLACE),
    C2(AX_QUANT, QUANT_Q4_0, AX_CONFIG, CFG_DECODE_SPLIT),
    C2(AX_QUANT, QUANT_Q8_0, AX_CONFIG, CFG_GPU),
    C2(AX_QUANT, QUANT_Q4_0, AX_CONFIG, CFG_GPU_SPLIT),
    C2(AX_QUANT, QUANT_Q8_0, AX_SINKS, ON),
    C2(AX_QUANT, QUANT_Q4_0, AX_LAYOUT, LAY_PADDED),
    C2(AX_QUANT, QUANT_Q8_0, AX_OUTPUTS, OUT_WEIGHTS),
    /* Packed variable-length batches (issue 28): every fused kernel and context (key parts
     * keep a packed lse in scratch; decode splits are off for them), one-row decode with
     * grouped heads (not run grouped), the in-place read, the score rules per sequence,
     * storage, layouts, lse, quantized k/v; refused off the fused path */
    C2(AX_VARLEN, ON, AX_CONFIG, CFG_GPU),
    C2(AX_VARLEN, ON, AX_CONFIG, CFG_SPLIT),
    C2(AX_VARLEN, ON, AX_CONFIG, CFG_CPU_SPLIT),
    C2(AX_VARLEN, ON, AX_CONFIG, CFG_GPU_SPLIT),
    C2(AX_VARLEN, ON, AX_CONFIG, CFG_DECODE_SPLIT),
    C3(AX_VARLEN, ON, AX_LQ, LQ_ONE, AX_GQA, GQA_4),
    C2(AX_VARLEN, ON, AX_READ, READ_IN_PLACE),
    C2(AX_VARLEN, ON, AX_SINKS, ON),
    C2(AX_VARLEN, ON, AX_ALIBI, ALIBI_BH),
    C3(AX_VARLEN, ON, AX_CAUSAL, AL_BOTTOM_RIGHT, AX_WINDOW, AL_BOTTOM_RIGHT),
    C2(AX_VARLEN, ON, AX_CAUSAL, AL_ONNX),
    C2(AX_VARLEN, ON, AX_CAUSAL, AL_OFFSET),
    C2(AX_VARLEN, ON, AX_QUANT, QUANT_Q8_0),
    C2(AX_VARLEN, ON, AX_DTYPE, DT_MIXED),
    C2(AX_VARLEN, ON, AX_LAYOUT, LAY_STRIDED_LAST),
    C2(AX_VARLEN, ON, AX_OUTPUTS, OUT_LSE),
    C2(AX_VARLEN, ON, AX_NORM, NORM_RELU),
    /* The backward (clattn_sdpa_backward_plan_create) after the forward, on the forward's
     * context: grouped heads on the GPU-class parameters, a float mask's gradient summed over
     * its broadcast (batch, heads), the sinks' gradient under split launches (parts of the
     * walks), softcap with ALiBi, relu in a window, per-batch key counts with 16-bit storage
     * (F16 and BF16 mixed) */
    C3(AX_BACKWARD, ON, AX_GQA, GQA_4, AX_CONFIG, CFG_GPU),
    C3(AX_BACKWARD, ON, AX_MASK, MASK_FLOAT, AX_MASK_RANK, RANK_2),
    C3(AX_BACKWARD, ON, AX_SINKS, ON, AX_CONFIG, CFG_SPLIT),
    C3(AX_BACKWARD, ON, AX_SOFTCAP, ON, AX_ALIBI, ALIBI_BH),
    C3(AX_BACKWARD, ON, AX_NORM, NORM_RELU, AX_WINDOW, AL_BOTTOM_RIGHT),
    C3(AX_BACKWARD, ON, AX_KEYS, KEYS_KV_LEN, AX_DTYPE, DT_MIXED),
};

/* --- the contexts ---------------------------------------------------------------------------- */

/* CLATTN_PARAMS=gpu (set around the context's creation) and a tuning row on top. */
typedef struct config_def {
    int gpu_params;
    const char *row;
} config_def;

static const config_def configs[CFG_COUNT] = {
    [CFG_DEFAULT] = {0, NULL},
    [CFG_GPU] = {1, NULL},
    /* flash.cl's and matmul's split launches (the *_split entries' limit) */
    [CFG_SPLIT] = {0, "any | * | * | loop_trip_limit=4000"},
    /* flash_cpu.cl's own key split (flash_cpu_split's limit) */
    [CFG_CPU_SPLIT] = {0, "any | * | * | loop_trip_limit=40000"},
    /* the decode splits of flash.c from 16 keys on */
    [CFG_DECODE_SPLIT] = {0, "any | * | * | decode_keys=16"},
    [CFG_GPU_SPLIT] = {1, "any | * | * | loop_trip_limit=4000"},
};

static int config_on_[CFG_COUNT];
static clattn_ctx *config_ctx_[CFG_COUNT];
static int config_failed_[CFG_COUNT];
static int has_fp64_;

static clattn_ctx *config_ctx(int config)
{
    if (config == CFG_DEFAULT)
        return tu_ctx();
    if (config_ctx_[config] != NULL || config_failed_[config])
        return config_ctx_[config];
    const config_def *c = &configs[config];
    clattn_ctx_desc desc;
    clattn_ctx_desc_init(&desc);
    desc.queue = clattn_ctx_queue(tu_ctx());
    desc.tuning_rows = c->row;
    /* CLATTN_PARAMS is read when a context is created (host/core/tuning.c) */
    if (c->gpu_params)
        setenv("CLATTN_PARAMS", "gpu", 1);
    char message[512] = "";
    const clattn_status status = clattn_ctx_create_desc(&desc, &config_ctx_[config], message,
                                                        sizeof message);
    if (c->gpu_params)
        unsetenv("CLATTN_PARAMS");
    if (status != CLATTN_SUCCESS) {
        tu_expect(0, "context %s: clattn_ctx_create_desc: %s (%d): %s", axes[AX_CONFIG].values[config],
                  clattn_status_string(status), (int)status, message);
        config_failed_[config] = 1;
        config_ctx_[config] = NULL;
    }
    return config_ctx_[config];
}

static void release_configs(void)
{
    for (int c = 0; c < CFG_COUNT; ++c) {
        clattn_ctx_release(config_ctx_[c]);
        config_ctx_[c] = NULL;
    }
}

/* --- the generator --------------------------------------------------------------------------- */

typedef struct draw {
    int v[AX_COUNT];
    unsigned forced; /* bit per axis */
    int want_grouped;
    int want_in_place;
    int want_backward; /* forced: steer the draw to what the backward takes */
    int combo; /* the forced combination's index into required */
} draw;

static int small_;

static int is_forced(const draw *d, int axis)
{
    return (d->forced >> axis) & 1u;
}

/* d->v[axis] = value unless the axis is forced; returns the axis's value. */
static int pick(draw *d, int axis, int value)
{
    if (!is_forced(d, axis))
        d->v[axis] = value;
    return d->v[axis];
}

/* An index drawn with the given weights. */
static int weighted(const int *weights, int count)
{
    int total = 0;
    for (int i = 0; i < count; ++i)
        total += weights[i];
    int r = (int)tu_rand_below((size_t)total);
    for (int i = 0; i < count; ++i) {
        if (r < weights[i])
            return i;
        r -= weights[i];
    }
    return count - 1;
}

static int uniform(int count)
{
    return (int)tu_rand_below((size_t)count);
}

static size_t in_range(size_t low, size_t high)
{
    return low + tu_rand_below(high - low + 1);
}

/* The required combinations whose contexts are on (the others cannot be drawn). */
static int active_[COUNT_OF(required)];
static int active_count_;

/* The contexts whose fused plans read K and V in place for few query rows: flash_cpu.cl without
 * a loop limit (host/ops/flash.c's prepare_cpu), PoCL's own parameters with a tuning row that
 * leaves those two alone (default, decode_split). Set by choose_in_place from the default
 * context's parameters. */
static int in_place_on_[CFG_COUNT];

static int combo_possible(const combo *c)
{
    for (int i = 0; i < 3; ++i) {
        if (c->c[i].axis == AX_CONFIG && !config_on_[c->c[i].value])
            return 0;
        if (c->c[i].axis == AX_READ && c->c[i].value == READ_IN_PLACE) {
            int any = 0;
            for (int k = 0; k < CFG_COUNT; ++k)
                any |= config_on_[k] && in_place_on_[k];
            if (!any)
                return 0;
        }
    }
    return 1;
}

static int pick_config(draw *d)
{
    int on[CFG_COUNT], count = 0;
    for (int c = 0; c < CFG_COUNT; ++c)
        if (config_on_[c] && (!d->want_in_place || in_place_on_[c]))
            on[count++] = c;
    if (count == 0) /* (not when the combination is active) */
        for (int c = 0; c < CFG_COUNT; ++c)
            if (config_on_[c])
                on[count++] = c;
    return pick(d, AX_CONFIG, on[uniform(count)]);
}

/* The mask: kind, rank and broadcast, and whether it differs between heads. */
static void draw_mask(draw *d, pb_sdpa_spec *s)
{
    static const int kind_w[] = {30, 35, 35};
    int kind = pick(d, AX_MASK, weighted(kind_w, 3));
    const int wants_rank = is_forced(d, AX_MASK_RANK) && d->v[AX_MASK_RANK] != RANK_NONE;
    const int wants_heads = is_forced(d, AX_MASK_HEADS) && d->v[AX_MASK_HEADS] != HEADS_NONE;
    if (kind == MASK_NONE && (wants_rank || wants_heads))
        kind = pick(d, AX_MASK, MASK_FLOAT);
    if (kind == MASK_NONE) {
        pick(d, AX_MASK_RANK, RANK_NONE);
        pick(d, AX_MASK_HEADS, HEADS_NONE);
        return;
    }
    int rank = pick(d, AX_MASK_RANK, RANK_1 + uniform(5));
    int heads = pick(d, AX_MASK_HEADS, rank <= RANK_2 ? HEADS_SHARED : HEADS_SHARED + uniform(2));
    if (heads == HEADS_PER_HEAD && rank <= RANK_2)
        rank = pick(d, AX_MASK_RANK, RANK_3 + uniform(3));
    if (heads == HEADS_SHARED && rank <= RANK_2) {
        /* nothing to choose: ranks 1 and 2 have no head dim */
    }
    s->mask = kind == MASK_BOOL ? PB_MASK_BOOL : PB_MASK_FLOAT;
    s->mask_rank = rank == RANK_4_STRIDE0 ? 4 : rank;
    s->mask_zero_strides = rank == RANK_4_STRIDE0;
    /* broadcast dims (size 1, or stride 0 in the stride-0 view): the head dim by the axis, the
     * others now and then; the batch dim rarely, so that values differ per batch */
    unsigned ones = 0;
    if (s->mask_rank >= 3 && heads == HEADS_SHARED)
        ones |= PB_MASK_ONES_H;
    if (s->mask_rank == 4 && tu_rand_below(4) == 0)
        ones |= PB_MASK_ONES_B;
    if (tu_rand_below(5) == 0)
        ones |= PB_MASK_ONES_LQ;
    else if (tu_rand_below(6) == 0)
        ones |= PB_MASK_ONES_LK;
    if (rank == RANK_4_STRIDE0 && ones == 0)
        ones = tu_rand_below(2) ? PB_MASK_ONES_B : PB_MASK_ONES_LQ; /* a stride 0 somewhere */
    s->mask_ones = ones;
    s->mask_layout = !s->mask_zero_strides && tu_rand_below(3) == 0 ? PB_PADDED : PB_PACKED;
}

static long long window_size(int value, size_t seq_k)
{
    switch (value) {
    case WS_ZERO:
        return 0;
    case WS_SMALL:
        return (long long)in_range(1, 5);
    case WS_LARGE: /* past every key; now and then past 2^34, which the plan takes as none */
        return tu_rand_below(4) == 0 ? (1LL << 40) : (long long)(seq_k + in_range(1, 8));
    default:
        return -1;
    }
}

static int head_dim_strided(const pb_sdpa_spec *s);

static const clattn_dtype float_dtypes[3] = {CLATTN_DTYPE_F32, CLATTN_DTYPE_F16,
                                             CLATTN_DTYPE_BF16};

static pb_layout layout_of(int value)
{
    switch (value) {
    case LAY_SEQ_MAJOR:
        return tu_rand_below(2) ? PB_SEQ_MAJOR : PB_SEQ_MAJOR_PADDED;
    case LAY_PADDED:
        return PB_PADDED;
    case LAY_STRIDED_LAST:
        return PB_STRIDED_LAST;
    case LAY_MIXED:
        return (pb_layout)tu_rand_below(PB_LAYOUT_COUNT);
    default:
        return tu_rand_below(2) ? PB_PACKED : PB_PACKED_STRIDES;
    }
}

/* Storage and head sizes. Each distinct (dtypes, head sizes, mask dtype) is a kernel variant
 * that PoCL compiles (1 to 2 s each on the CI machine, three kernel families: the CPU, GPU-class
 * and portable fused kernels), so below the full tier they come from a few signatures: every
 * dtype value, every head size value, both paths' variants compiled once each. The full tier
 * draws them independently. */
typedef struct signature {
    int dtype, head_dim;
    clattn_dtype q, k, v, out, mask; /* mask: of float masks */
} signature;

static const signature signatures[] = {
    {DT_F32, HD_16, CLATTN_DTYPE_F32, CLATTN_DTYPE_F32, CLATTN_DTYPE_F32, CLATTN_DTYPE_F32,
     CLATTN_DTYPE_F32},
    {DT_F32, HD_64, CLATTN_DTYPE_F32, CLATTN_DTYPE_F32, CLATTN_DTYPE_F32, CLATTN_DTYPE_F32,
     CLATTN_DTYPE_F32},
    {DT_F16, HD_64, CLATTN_DTYPE_F16, CLATTN_DTYPE_F16, CLATTN_DTYPE_F16, CLATTN_DTYPE_F16,
     CLATTN_DTYPE_F16},
    {DT_BF16, HD_3_5, CLATTN_DTYPE_BF16, CLATTN_DTYPE_BF16, CLATTN_DTYPE_BF16, CLATTN_DTYPE_BF16,
     CLATTN_DTYPE_F32},
    {DT_MIXED, HD_64_16, CLATTN_DTYPE_F16, CLATTN_DTYPE_BF16, CLATTN_DTYPE_F32, CLATTN_DTYPE_BF16,
     CLATTN_DTYPE_BF16},
};

static int full_;

static void draw_storage(draw *d, pb_sdpa_spec *s)
{
    static const size_t dks[4] = {3, 16, 64, 64}, dvs[4] = {5, 16, 64, 16};
    if (full_) {
        static const int dtype_w[] = {35, 25, 25, 15};
        const int dtype = pick(d, AX_DTYPE, weighted(dtype_w, 4));
        if (dtype == DT_MIXED) {
            s->q_dtype = float_dtypes[uniform(3)];
            s->k_dtype = float_dtypes[uniform(3)];
            s->v_dtype = float_dtypes[uniform(3)];
            s->out_dtype = float_dtypes[uniform(3)];
            s->mask_dtype = float_dtypes[uniform(3)];
        } else {
            const clattn_dtype t = float_dtypes[dtype];
            s->q_dtype = s->k_dtype = s->v_dtype = s->out_dtype = t;
            s->mask_dtype = tu_rand_below(3) == 0 ? CLATTN_DTYPE_F32 : t;
        }
        pick(d, AX_HEAD_DIM, d->want_in_place ? HD_16 + uniform(3) : uniform(4));
    } else {
        int fits[COUNT_OF(signatures)], count = 0;
        for (int i = 0; i < COUNT_OF(signatures); ++i)
            if ((!is_forced(d, AX_DTYPE) || signatures[i].dtype == d->v[AX_DTYPE]) &&
                (!is_forced(d, AX_HEAD_DIM) || signatures[i].head_dim == d->v[AX_HEAD_DIM]) &&
                (!d->want_in_place || signatures[i].head_dim != HD_3_5))
                fits[count++] = i;
        /* a forced pair no signature has: the dtype wins, any head size */
        const signature *g = NULL;
        if (count > 0) {
            g = &signatures[fits[uniform(count)]];
        } else {
            for (int i = 0; i < COUNT_OF(signatures) && g == NULL; ++i)
                if (signatures[i].dtype == d->v[AX_DTYPE])
                    g = &signatures[i];
        }
        d->v[AX_DTYPE] = g->dtype;
        d->v[AX_HEAD_DIM] = g->head_dim;
        s->q_dtype = g->q, s->k_dtype = g->k, s->v_dtype = g->v, s->out_dtype = g->out;
        s->mask_dtype = g->mask;
    }
    s->dk = dks[d->v[AX_HEAD_DIM]];
    s->dv = dvs[d->v[AX_HEAD_DIM]];
    if (small_) { /* simulators: head sizes up to 32 */
        s->dk = s->dk > 32 ? 32 : s->dk;
        s->dv = s->dv > 32 ? 32 : s->dv;
    }
}

/* Draw `index`: the forced combination, then every axis (the forced ones kept), then the spec.
 * Reads the generator of the running test (tu_test_begin seeds it from the seed and index). */
static void draw_spec(int index, draw *d, pb_sdpa_spec *s)
{
    memset(d, 0, sizeof *d);
    pb_sdpa_spec_init(s);
    /* a stride coprime with the count visits every combination in active_count_ draws, in an
     * order that mixes the groups (a run of a few draws, under Oclgrind, is not all refusals) */
    size_t stride = 7;
    while (active_count_ > 0 && active_count_ % (int)stride == 0)
        stride += 2;
    d->combo = active_count_ > 0 ? active_[((size_t)index * stride) % (size_t)active_count_] : -1;
    if (d->combo >= 0) {
        for (int i = 0; i < 3; ++i) {
            const cond c = required[d->combo].c[i];
            if (c.axis < 0)
                continue;
            if (c.axis == AX_ROUTE) {
                d->want_grouped = c.value == ROUTE_GROUPED;
                continue;
            }
            if (c.axis == AX_READ) {
                d->want_in_place = c.value == READ_IN_PLACE;
                continue;
            }
            if (c.axis == AX_BACKWARD) {
                d->want_backward = c.value == ON;
                continue;
            }
            d->v[c.axis] = c.value;
            d->forced |= 1u << c.axis;
        }
    }
    const int grouped = d->want_grouped;
    const int in_place = d->want_in_place; /* few rows, a whole key tile, head sizes of 16s */
    /* the backward takes no past, pages, quantized k/v, packed sequences, weights, double
     * softmax or mixed alignments: a forced backward draws none of them (unless forced) */
    const int backward = d->want_backward;
    const int config = pick_config(d);

    /* heads, sequence lengths, key rules */
    const int gqa = pick(d, AX_GQA, grouped || is_forced(d, AX_LQ) ? 1 + uniform(3) : uniform(4));
    static const int lq_w[] = {30, 35, 35};
    const int lq = pick(d, AX_LQ,
                        grouped    ? LQ_ONE
                        : in_place ? LQ_ONE + uniform(2)
                                   : weighted(lq_w, 3));
    int lk = pick(d, AX_LK, in_place ? LK_LONG : uniform(3));
    static const int keys_w[] = {40, 30, 30};
    static const int backward_keys_w[] = {50, 50, 0};
    int keys = pick(d, AX_KEYS, weighted(backward ? backward_keys_w : keys_w, 3));
    /* a paged cache takes per-batch key counts (no past): a forced past turns paging off */
    static const int paged_w[] = {70, 10, 10, 10};
    const int paged = pick(d, AX_PAGED, (keys == KEYS_PAST && is_forced(d, AX_KEYS)) || backward
                                            ? PAGED_OFF
                                            : weighted(paged_w, 4));
    if (paged != PAGED_OFF)
        keys = pick(d, AX_KEYS, KEYS_KV_LEN);
    /* quantized k/v (Q8_0, Q4_0): no past (refused), so a forced past turns quantizing off */
    static const int quant_w[] = {84, 8, 8};
    const int quant = pick(d, AX_QUANT, (keys == KEYS_PAST && is_forced(d, AX_KEYS)) || backward
                                            ? QUANT_OFF
                                            : weighted(quant_w, 3));
    if (quant != QUANT_OFF && keys == KEYS_PAST)
        keys = pick(d, AX_KEYS, KEYS_ALL);
    /* packed sequences: no per-batch counts, past or pages, masks, padding, weights or
     * softmax_f64 (the fused path, each sequence within itself); on only where no forced axis
     * asks for one of them, which are then set off below */
    const int varlen_blocked =
        (is_forced(d, AX_KEYS) && keys != KEYS_ALL) ||
        (is_forced(d, AX_PAGED) && paged != PAGED_OFF) ||
        (is_forced(d, AX_MASK) && d->v[AX_MASK] != MASK_NONE) ||
        (is_forced(d, AX_MASK_RANK) && d->v[AX_MASK_RANK] != RANK_NONE) ||
        (is_forced(d, AX_MASK_HEADS) && d->v[AX_MASK_HEADS] != HEADS_NONE) ||
        (is_forced(d, AX_PADDING) && d->v[AX_PADDING] != PAD_OFF) ||
        (is_forced(d, AX_OUTPUTS) && d->v[AX_OUTPUTS] == OUT_WEIGHTS) ||
        (is_forced(d, AX_NORM) && d->v[AX_NORM] == NORM_SOFTMAX_F64) || grouped || backward;
    static const int varlen_w[] = {88, 12};
    const int varlen = pick(d, AX_VARLEN, varlen_blocked ? OFF : weighted(varlen_w, 2));
    if (varlen == ON) {
        keys = pick(d, AX_KEYS, KEYS_ALL);
        pick(d, AX_PAGED, PAGED_OFF);
    }
    const size_t long_low = 63, long_high = small_ ? 67 : 129;
    s->seq_q = lq == LQ_ONE     ? 1
               : lq == LQ_SHORT ? in_range(2, in_place ? 8 : 17)
                                : in_range(long_low, long_high);
    if (lk == LK_SAME && s->seq_q == 1 && keys == KEYS_PAST)
        lk = pick(d, AX_LK, LK_SHORT); /* a past needs two keys at least */
    if (lk == LK_SAME && s->seq_q == 1 && keys == KEYS_PAST)
        keys = pick(d, AX_KEYS, KEYS_ALL); /* both forced: the forced Lk wins */
    const size_t short_low = keys == KEYS_PAST ? 2 : 1;
    for (;;) {
        s->seq_k = lk == LK_SAME    ? s->seq_q
                   : lk == LK_SHORT ? in_range(short_low, 17)
                                    : in_range(in_place ? 64 : long_low, long_high);
        if (lk == LK_SAME || s->seq_k != s->seq_q)
            break;
    }
    if (paged != PAGED_OFF) { /* whole pages: seq_k rounded up to one */
        s->page_size = paged == PAGED_1       ? 1
                       : paged == PAGED_SMALL ? in_range(2, 17)
                                              : in_range(32, 256);
        s->seq_k = (s->seq_k + s->page_size - 1) / s->page_size * s->page_size;
    }
    const int decode_split = config == CFG_DECODE_SPLIT;
    /* decode splits need few row blocks x heads: one batch entry and few k/v heads there */
    const size_t kv_heads = decode_split ? 1 : in_range(1, small_ ? 2 : 3);
    static const size_t ratios[4] = {1, 2, 4, 8};
    s->heads = kv_heads * ratios[gqa];
    s->kv_heads = kv_heads;
    if (keys == KEYS_KV_LEN) {
        s->kv_len = 1;
    } else if (keys == KEYS_PAST) {
        /* mostly as many new keys as queries (a decode step, a chunk of a prompt) */
        if (grouped || (s->seq_q < s->seq_k && tu_rand_below(2)))
            s->past = s->seq_k - s->seq_q;
        else
            s->past = in_range(1, s->seq_k - 1);
        if (s->past == 0)
            s->past = 1;
    }

    /* the causal bound and the window, drawn separately. One-row grouped problems take the
     * grouped decode's band on half the draws (no causal bound or a bottom-right one, a window
     * aligned the same way whose right edge ends at the key count), so that the decode's rule
     * (no left bound: each head of a group would see another window) is put to the test */
    const int decode_like =
        grouped || (lq == LQ_ONE && gqa != GQA_1 && (is_forced(d, AX_LQ) || tu_rand_below(2)));
    static const int causal_w[] = {30, 20, 20, 15, 15};
    static const int decode_causal_w[] = {40, 0, 40, 20, 0};
    int causal = pick(d, AX_CAUSAL, weighted(decode_like ? decode_causal_w : causal_w, 5));
    const int decode_align = causal != AL_NONE ? causal : AL_BOTTOM_RIGHT;
    const int sized = (is_forced(d, AX_WLEFT) && d->v[AX_WLEFT] != WS_OFF) ||
                      (is_forced(d, AX_WRIGHT) && d->v[AX_WRIGHT] != WS_OFF);
    int window;
    {
        const int r = (int)tu_rand_below(100);
        const int same = causal != AL_NONE ? causal : 1 + uniform(4);
        /* 40 none, 40 aligned as causal (or any alignment without it), 20 any alignment */
        window = pick(d, AX_WINDOW, r < 40 && !sized ? AL_NONE : r < 80 ? same : 1 + uniform(4));
        if (decode_like && !is_forced(d, AX_WINDOW) && window != AL_NONE)
            window = pick(d, AX_WINDOW, decode_align);
        if (backward && causal != AL_NONE && window != AL_NONE && causal != window) {
            if (!is_forced(d, AX_WINDOW)) /* one alignment for both */
                window = pick(d, AX_WINDOW, causal);
            else
                causal = pick(d, AX_CAUSAL, window);
        }
    }
    int wleft = WS_OFF, wright = WS_OFF;
    if (window == AL_NONE) {
        wleft = pick(d, AX_WLEFT, WS_OFF);
        wright = pick(d, AX_WRIGHT, WS_OFF);
    } else {
        /* the grouped decode takes no left bound and a right one that ends at the key count */
        wleft = pick(d, AX_WLEFT, grouped ? WS_UNBOUNDED : WS_UNBOUNDED + uniform(4));
        wright = pick(d, AX_WRIGHT, decode_like ? (tu_rand_below(2) ? WS_UNBOUNDED : WS_ZERO)
                                                : WS_UNBOUNDED + uniform(4));
    }
    s->causal = (clattn_causal)causal;
    s->window_align = (clattn_causal)window;
    s->window_left = window_size(wleft, s->seq_k);
    s->window_right = window_size(wright, s->seq_k);
    if (causal == AL_OFFSET || window == AL_OFFSET) {
        const long long reach = (long long)(s->seq_q + s->seq_k) + 3;
        s->diag_offset = tu_rand_below(8) == 0 ? (tu_rand_below(2) ? 1LL << 40 : -(1LL << 40))
                                               : (long long)tu_rand_below((size_t)(2 * reach + 1)) -
                                                     reach;
        if (grouped)
            s->diag_offset = (long long)s->seq_k - 1 + (long long)tu_rand_below(3);
    }

    /* score modifiers */
    s->softcap = pick(d, AX_SOFTCAP, uniform(2)) == ON ? (float)(0.5 + 4.0 * tu_rand_unit()) : 0.0f;
    static const int alibi_w[] = {50, 25, 25};
    const int alibi = pick(d, AX_ALIBI, grouped ? ALIBI_NONE : weighted(alibi_w, 3));
    s->alibi = alibi;
    draw_mask(d, s);
    static const int pad_w[] = {60, 30, 10};
    const int padding = pick(d, AX_PADDING, weighted(pad_w, 3));
    s->padding = padding != PAD_OFF;
    s->fully_masked = padding == PAD_BATCH_MASKED;

    /* per-batch features get two or three batch entries */
    const int per_batch = keys == KEYS_KV_LEN || alibi == ALIBI_BH || s->mask_zero_strides ||
                          (s->mask_rank == 4 && !(s->mask_ones & PB_MASK_ONES_B)) ||
                          padding != PAD_OFF;
    s->batch = decode_split ? 1 : per_batch ? in_range(2, small_ ? 2 : 3)
                                            : in_range(1, small_ ? 2 : 3);
    if (varlen == ON) /* several sequences of their own lengths */
        s->batch = in_range(2, small_ ? 3 : 5);

    /* storage, normalisation, layouts, outputs, head sizes */
    draw_storage(d, s);
    static const int norm_w[] = {60, 25, 15};
    static const int grouped_norm_w[] = {70, 30, 0};
    const int norm = pick(d, AX_NORM, weighted(grouped || backward ? grouped_norm_w : norm_w, 3));
    s->norm = norm == NORM_RELU ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX;
    s->softmax_f64 = norm == NORM_SOFTMAX_F64;
    /* sinks join a softmax: with relu they are refused, so that pair is drawn only forced */
    const int sinks_w[] = {70, 30};
    int sinks = pick(d, AX_SINKS, norm == NORM_RELU ? OFF : weighted(sinks_w, 2));
    if (sinks == ON && norm == NORM_RELU && !is_forced(d, AX_NORM)) {
        pick(d, AX_NORM, NORM_SOFTMAX);
        s->norm = CLATTN_NORM_SOFTMAX;
    }
    s->sinks = sinks == ON;
    s->sinks_layout = tu_rand_below(2) ? PB_PADDED : PB_PACKED;
    static const int layout_w[] = {30, 20, 20, 15, 15};
    const int layout = pick(d, AX_LAYOUT, weighted(layout_w, 5));
    s->q_layout = layout_of(layout);
    s->k_layout = layout_of(layout);
    s->v_layout = layout_of(layout);
    s->out_layout = layout_of(layout);
    static const int outputs_w[] = {50, 30, 20};
    static const int grouped_outputs_w[] = {60, 40, 0};
    const int outputs = pick(d, AX_OUTPUTS, weighted(grouped || backward ? grouped_outputs_w
                                                                         : outputs_w,
                                                     3));
    s->want_lse = outputs == OUT_LSE;
    s->want_weights = outputs == OUT_WEIGHTS;
    /* No path runs weights or softmax_f64 (unfused only) with lse or a head_dim stride (fused
     * only): such a draw would only check refusals, so those are redrawn unless forced */
    if (s->softmax_f64 && s->want_lse && !is_forced(d, AX_OUTPUTS)) {
        pick(d, AX_OUTPUTS, OUT_ONLY);
        s->want_lse = 0;
    }
    if ((s->softmax_f64 || s->want_weights) && head_dim_strided(s) && !is_forced(d, AX_LAYOUT)) {
        pb_layout *all[4] = {&s->q_layout, &s->k_layout, &s->v_layout, &s->out_layout};
        for (int i = 0; i < 4; ++i)
            if (*all[i] == PB_STRIDED_LAST)
                *all[i] = PB_PADDED;
        if (layout == LAY_STRIDED_LAST)
            pick(d, AX_LAYOUT, LAY_PADDED);
    }
    if (in_place && (s->k_layout == PB_STRIDED_LAST || s->v_layout == PB_STRIDED_LAST)) {
        /* K and V rows of unit stride (a strided V packs every tile) */
        if (layout == LAY_STRIDED_LAST && !is_forced(d, AX_LAYOUT))
            pick(d, AX_LAYOUT, LAY_PADDED);
        if (s->k_layout == PB_STRIDED_LAST)
            s->k_layout = PB_PADDED;
        if (s->v_layout == PB_STRIDED_LAST)
            s->v_layout = PB_PADDED;
    }
    if (quant != QUANT_OFF) {
        /* blocks of 32 along the head size; rows of whole blocks (unit last stride) */
        s->k_dtype = s->v_dtype = quant == QUANT_Q8_0 ? CLATTN_DTYPE_Q8_0 : CLATTN_DTYPE_Q4_0;
        s->dk = s->dv = small_ ? 32 : 64;
        pick(d, AX_HEAD_DIM, HD_64);
        if (s->k_layout == PB_STRIDED_LAST)
            s->k_layout = PB_PADDED;
        if (s->v_layout == PB_STRIDED_LAST)
            s->v_layout = PB_PADDED;
    }
    if (varlen == ON) { /* what packed sequences do not take: off (none of it forced) */
        pick(d, AX_MASK, MASK_NONE);
        pick(d, AX_MASK_RANK, RANK_NONE);
        pick(d, AX_MASK_HEADS, HEADS_NONE);
        pick(d, AX_PADDING, PAD_OFF);
        if (s->want_weights)
            pick(d, AX_OUTPUTS, OUT_ONLY);
        if (s->softmax_f64)
            pick(d, AX_NORM, NORM_SOFTMAX);
        s->varlen = 1;
        s->mask = PB_MASK_NONE;
        s->padding = s->fully_masked = s->want_weights = s->softmax_f64 = 0;
    }
    s->scale = tu_rand_below(3) == 0 ? (float)(0.05 + tu_rand_unit()) : NAN;
    s->q_gain = (float)(1.0 + 3.0 * tu_rand_unit());
    s->path = CLATTN_PATH_AUTO;
}

/* --- what each path must do ------------------------------------------------------------------ */

static int mixed_alignments(const pb_sdpa_spec *s)
{
    return s->causal != CLATTN_CAUSAL_NONE && s->window_align != CLATTN_CAUSAL_NONE &&
           s->causal != s->window_align;
}

/* Whether q, k, v or out has a stride other than 1 along head_dim (PB_STRIDED_LAST; the
 * present tensors take k's and v's layouts). */
static int head_dim_strided(const pb_sdpa_spec *s)
{
    return s->q_layout == PB_STRIDED_LAST || s->k_layout == PB_STRIDED_LAST ||
           s->v_layout == PB_STRIDED_LAST || s->out_layout == PB_STRIDED_LAST;
}

/* Whether k or v is a block type (Q8_0, Q4_0). */
static int quantized(const pb_sdpa_spec *s)
{
    return s->k_dtype == CLATTN_DTYPE_Q8_0 || s->k_dtype == CLATTN_DTYPE_Q4_0 ||
           s->v_dtype == CLATTN_DTYPE_Q8_0 || s->v_dtype == CLATTN_DTYPE_Q4_0;
}

/* Whether a plan on `path` runs the fused kernel (clattn_path's rule; head sizes <= 256). */
static int path_fused(const pb_sdpa_spec *s, clattn_path path)
{
    return path == CLATTN_PATH_FUSED ||
           (path == CLATTN_PATH_AUTO && !s->want_weights && !s->softmax_f64);
}

/* The status clattn.h documents for the problem on `path`. */
static clattn_status expected_status(const pb_sdpa_spec *s, clattn_path path)
{
    if (s->sinks && s->norm == CLATTN_NORM_RELU)
        return CLATTN_ERR_UNSUPPORTED; /* sinks join a softmax (checked before the band) */
    if (mixed_alignments(s))
        return CLATTN_ERR_INVALID_ARGUMENT; /* "both must use the same alignment" */
    if (path == CLATTN_PATH_FUSED && (s->want_weights || s->softmax_f64))
        return CLATTN_ERR_INVALID_ARGUMENT; /* FUSED never forms the weights, nor doubles */
    if (path_fused(s, path))
        return CLATTN_SUCCESS;
    if (s->varlen)
        return CLATTN_ERR_UNSUPPORTED; /* packed sequences run on the fused path only */
    if (quantized(s))
        return CLATTN_ERR_UNSUPPORTED; /* quantized k/v run on the fused path only */
    if (s->page_size)
        return CLATTN_ERR_UNSUPPORTED; /* a paged cache runs on the fused path only */
    if (s->want_lse)
        return CLATTN_ERR_UNSUPPORTED; /* lse comes from the fused kernel only */
    if (s->softmax_f64 && !has_fp64_)
        return CLATTN_ERR_UNSUPPORTED;
    if (head_dim_strided(s))
        return CLATTN_ERR_UNSUPPORTED; /* the unfused path's matmuls need stride 1 there */
    return CLATTN_SUCCESS;
}

/* Whether a fused plan takes the grouped one-row decode: host/attn/sdpa.c's rule (one query
 * row, grouped heads, no left bound, every row's band ending at the key count, no ALiBi). */
static int grouped_decode(const pb_sdpa_spec *s)
{
    if (s->seq_q != 1 || s->kv_heads == 0 || s->heads / s->kv_heads < 2 || s->alibi || s->varlen)
        return 0; /* (packed sequences run one query head per row) */
    const long long seq_q = (long long)s->seq_q, seq_k = (long long)s->seq_k;
    const long long huge = 1LL << 34;
    const int align = s->causal != CLATTN_CAUSAL_NONE ? s->causal : s->window_align;
    if (align == CLATTN_CAUSAL_OFFSET) {
        /* plan.c's offset_band: the edges are summed before "past every key" is decided */
        const int window = s->window_align != CLATTN_CAUSAL_NONE;
        if (window && s->window_left >= 0 && s->diag_offset - s->window_left >= -huge)
            return 0; /* a lower bound */
        int has_upper = s->causal != CLATTN_CAUSAL_NONE;
        long long upper = s->diag_offset;
        if (window && s->window_right >= 0) {
            const long long edge = s->diag_offset + s->window_right; /* both below 2^62 here */
            upper = has_upper && upper < edge ? upper : edge;
            has_upper = 1;
        }
        return !has_upper || upper > huge || upper + 1 >= seq_k;
    }
    long long upper = s->causal != CLATTN_CAUSAL_NONE ? 0 : -1, lower = -1;
    if (s->window_align != CLATTN_CAUSAL_NONE) {
        const long long right = s->window_right < 0 || s->window_right > huge ? -1 : s->window_right;
        if (right >= 0 && (upper < 0 || right < upper))
            upper = right;
        lower = s->window_left < 0 || s->window_left > huge ? -1 : s->window_left;
    }
    if (lower >= 0)
        return 0;
    int diag_kv = 0;
    long long diag = 0;
    if (align == CLATTN_CAUSAL_BOTTOM_RIGHT ||
        (align == CLATTN_CAUSAL_ONNX && s->past == 0 && s->kv_len)) {
        diag_kv = s->kv_len;
        diag = s->kv_len ? -seq_q : seq_k - seq_q;
    } else if (align == CLATTN_CAUSAL_ONNX && s->past > 0) {
        diag = (long long)s->past;
    }
    return upper < 0 || (upper == 0 && (diag_kv ? diag == -1 : diag + 1 >= seq_k));
}

static int route_of(const pb_sdpa_spec *s)
{
    if (expected_status(s, CLATTN_PATH_AUTO) != CLATTN_SUCCESS)
        return ROUTE_REFUSED;
    if (!path_fused(s, CLATTN_PATH_AUTO))
        return ROUTE_UNFUSED;
    return grouped_decode(s) ? ROUTE_GROUPED : ROUTE_FUSED;
}

/* Whether flash_cpu.cl is built to read tiles in place for the fused plan's rows
 * (host/ops/flash.c: at most FC_DIRECT_ROWS = 8 rows per k/v head, a grouped decode's group
 * being the rows; both head sizes multiples of 16), on a context that runs it without a loop
 * limit. */
static int in_place_built(const pb_sdpa_spec *s, int route)
{
    const size_t rows = route == ROUTE_GROUPED ? s->heads / s->kv_heads : s->seq_q;
    return rows <= 8 && s->dk % 16 == 0 && s->dv % 16 == 0;
}

/* AX_READ: that build, and a whole 64-key tile whose K and V rows have unit stride (else every
 * tile is packed; per-batch key counts may still end a batch's keys before the tile does). */
static int read_of(const pb_sdpa_spec *s, int config, int route)
{
    const int fused = route == ROUTE_FUSED || route == ROUTE_GROUPED;
    return fused && in_place_on_[config] && in_place_built(s, route) && s->seq_k >= 64 &&
                   s->k_layout != PB_STRIDED_LAST && s->v_layout != PB_STRIDED_LAST
               ? READ_IN_PLACE
               : READ_PACKED;
}

/* Whether clattn_sdpa_backward_plan_create takes the problem (clattn.h): what the fused path
 * runs, less a past, rope, a paged cache, packed sequences, weights, softmax_f64 and quantized
 * k/v. The forward then runs on FUSED with lse (the backward's input). */
static int backward_takes(const pb_sdpa_spec *s)
{
    return expected_status(s, CLATTN_PATH_FUSED) == CLATTN_SUCCESS && s->past == 0 && !s->rope &&
           s->page_size == 0 && !s->varlen && !s->want_weights && !s->softmax_f64 &&
           !quantized(s);
}

/* Whether the draw meets its forced combination (the route included). */
static int combo_met(const draw *d)
{
    if (d->combo < 0)
        return 1;
    for (int i = 0; i < 3; ++i) {
        const cond c = required[d->combo].c[i];
        if (c.axis >= 0 && d->v[c.axis] != c.value)
            return 0;
    }
    return 1;
}

/* Draw `index` (draw_spec) with its route. The route is derived from the other axes: a draw
 * whose forced combination asked for a route that another drawn axis rules out is drawn again
 * (deterministically: the test's generator goes on), up to 16 times, so that every listed
 * combination is reached in one cycle of draws. */
static void draw_met(int index, draw *d, pb_sdpa_spec *s)
{
    for (int attempt = 0; attempt < 16; ++attempt) {
        draw_spec(index, d, s);
        d->v[AX_ROUTE] = route_of(s);
        d->v[AX_READ] = read_of(s, d->v[AX_CONFIG], d->v[AX_ROUTE]);
        d->v[AX_BACKWARD] = d->want_backward && backward_takes(s) ? ON : OFF;
        if (combo_met(d))
            break;
    }
    /* unforced: the problems the backward takes run it too (small scale: one in
     * BACKWARD_ONE_IN_SMALL) */
    if (!d->want_backward && backward_takes(s) &&
        (!small_ || tu_rand_below(BACKWARD_ONE_IN_SMALL) == 0))
        d->v[AX_BACKWARD] = ON;
}

/* --- coverage -------------------------------------------------------------------------------- */

#define SLOTS (AX_COUNT * MAX_VALUES)

typedef struct coverage {
    long values[AX_COUNT][MAX_VALUES];
    unsigned char pairs[SLOTS][SLOTS];
    int combos[COUNT_OF(required)];
    long draws;
} coverage;

static coverage run_; /* what the draws that ran reached */
static coverage census_; /* what the generator can reach */
static coverage bwd_;        /* what the draws that ran the backward reached */
static coverage census_bwd_; /* what the generator's backward draws can reach */
static long path_ran_[3], path_refused_[3];
/* draws that ran the backward: all, forced, with a float mask's gradient, with the sinks' */
static long bwd_ran_, bwd_forced_, bwd_mask_grads_, bwd_sinks_grads_;

static void count_draw(coverage *c, const draw *d)
{
    c->draws++;
    for (int a = 0; a < AX_COUNT; ++a) {
        c->values[a][d->v[a]]++;
        for (int b = a + 1; b < AX_COUNT; ++b)
            c->pairs[a * MAX_VALUES + d->v[a]][b * MAX_VALUES + d->v[b]] = 1;
    }
    for (int i = 0; i < COUNT_OF(required); ++i) {
        int all = 1;
        for (int k = 0; k < 3; ++k) {
            const cond cc = required[i].c[k];
            all &= cc.axis < 0 || d->v[cc.axis] == cc.value;
        }
        c->combos[i] += all;
    }
}

static void describe_combo(const combo *c, char *text, size_t size)
{
    size_t used = 0;
    text[0] = '\0';
    for (int k = 0; k < 3 && used < size; ++k) {
        if (c->c[k].axis < 0)
            continue;
        used += (size_t)snprintf(text + used, size - used, "%s%s=%s", used ? " " : "",
                                 axes[c->c[k].axis].name, axes[c->c[k].axis].values[c->c[k].value]);
    }
}

/* The draws that ran the backward: how many, their gradients, the values of every axis that
 * varies among the generator's backward draws (the census's), and the pairs of those values
 * reached together with the backward, out of those the census reaches; `list_missed`: each
 * pair not reached. */
static void print_backward_coverage(int list_missed)
{
    printf("sweep: backward: %ld of %ld draws ran it (%ld forced by a listed combination; the "
           "census: %ld of %d; gradients of q, k and v in all, of a float mask in %ld, of the "
           "sinks in %ld); their axis values:\n",
           bwd_ran_, run_.draws, bwd_forced_, census_bwd_.draws, CENSUS_DRAWS, bwd_mask_grads_,
           bwd_sinks_grads_);
    int varies[AX_COUNT];
    for (int a = 0; a < AX_COUNT; ++a) {
        int reachable = 0;
        for (int v = 0; v < axes[a].count; ++v)
            reachable += census_bwd_.values[a][v] > 0;
        varies[a] = reachable > 1;
        if (!varies[a])
            continue;
        char line[512];
        size_t used = (size_t)snprintf(line, sizeof line, "  %-11s", axes[a].name);
        for (int v = 0; v < axes[a].count; ++v)
            if (census_bwd_.values[a][v] > 0)
                used += (size_t)snprintf(line + used, sizeof line - used, " %s:%ld",
                                         axes[a].values[v], bwd_.values[a][v]);
        printf("%s\n", line);
    }
    long reachable = 0, reached = 0;
    for (int a = 0; a < AX_COUNT; ++a)
        for (int b = a + 1; b < AX_COUNT; ++b)
            for (int x = 0; x < axes[a].count && varies[a] && varies[b]; ++x)
                for (int y = 0; y < axes[b].count; ++y) {
                    const int i = a * MAX_VALUES + x, j = b * MAX_VALUES + y;
                    if (!census_bwd_.pairs[i][j])
                        continue;
                    reachable++;
                    reached += bwd_.pairs[i][j];
                    if (list_missed && !bwd_.pairs[i][j])
                        printf("  missed backward pair: %s=%s %s=%s\n", axes[a].name,
                               axes[a].values[x], axes[b].name, axes[b].values[y]);
                }
    printf("sweep: backward pairwise coverage: %ld of %ld (axis value, axis value) pairs the "
           "census's backward draws reach (%.1f%%)\n",
           reached, reachable, reachable ? 100.0 * (double)reached / (double)reachable : 0.0);
}

static void print_coverage(void)
{
    printf("sweep: coverage of %ld draws (paths: fused %ld run / %ld refused, unfused %ld / %ld, "
           "auto %ld / %ld; backward %ld run)\n",
           run_.draws, path_ran_[0], path_refused_[0], path_ran_[1], path_refused_[1],
           path_ran_[2], path_refused_[2], bwd_ran_);
    for (int a = 0; a < AX_COUNT; ++a) {
        char line[512];
        size_t used = (size_t)snprintf(line, sizeof line, "  %-11s", axes[a].name);
        for (int v = 0; v < axes[a].count; ++v)
            used += (size_t)snprintf(line + used, sizeof line - used, " %s:%ld",
                                     axes[a].values[v], run_.values[a][v]);
        printf("%s\n", line);
    }
    long total = 0, reachable = 0, reached = 0;
    for (int a = 0; a < AX_COUNT; ++a)
        for (int b = a + 1; b < AX_COUNT; ++b)
            for (int x = 0; x < axes[a].count; ++x)
                for (int y = 0; y < axes[b].count; ++y) {
                    const int i = a * MAX_VALUES + x, j = b * MAX_VALUES + y;
                    total++;
                    reachable += census_.pairs[i][j];
                    reached += run_.pairs[i][j] && census_.pairs[i][j];
                }
    printf("sweep: pairwise coverage: %ld of %ld reachable (axis value, axis value) pairs "
           "(%.1f%%); %ld of all %ld pairs are never drawn by construction (e.g. a window size "
           "without a window; the census: %d host-only draws)\n",
           reached, reachable, reachable ? 100.0 * (double)reached / (double)reachable : 0.0,
           total - reachable, total, CENSUS_DRAWS);
    const char *list = getenv("CLATTN_SWEEP_MISSED");
    if (list != NULL && list[0] != '\0' && strcmp(list, "0") != 0) {
        for (int a = 0; a < AX_COUNT; ++a)
            for (int b = a + 1; b < AX_COUNT; ++b)
                for (int x = 0; x < axes[a].count; ++x)
                    for (int y = 0; y < axes[b].count; ++y) {
                        const int i = a * MAX_VALUES + x, j = b * MAX_VALUES + y;
                        if (census_.pairs[i][j] && !run_.pairs[i][j])
                            printf("  missed pair: %s=%s %s=%s\n", axes[a].name,
                                   axes[a].values[x], axes[b].name, axes[b].values[y]);
                    }
    }
    print_backward_coverage(list != NULL && list[0] != '\0' && strcmp(list, "0") != 0);
    int missed = 0, off = 0;
    for (int i = 0; i < COUNT_OF(required); ++i) {
        char text[160];
        describe_combo(&required[i], text, sizeof text);
        if (!combo_possible(&required[i])) {
            off++;
            printf("  required combination not drawable here (its context is off): %s\n", text);
        } else if (run_.combos[i] == 0) {
            missed++;
            printf("  MISSED required combination: %s\n", text);
        }
    }
    printf("sweep: required combinations (issue 24): %d of %d reached, %d missed, %d with their "
           "context off\n",
           COUNT_OF(required) - missed - off, COUNT_OF(required), missed, off);
}

/* What the generator reaches (host only: no problem is made). */
static void census(void)
{
    for (int i = 0; i < CENSUS_DRAWS; ++i) {
        tu_test_begin("census", i);
        draw d;
        pb_sdpa_spec spec;
        draw_met(i, &d, &spec);
        count_draw(&census_, &d);
        if (d.v[AX_BACKWARD] == ON)
            count_draw(&census_bwd_, &d);
    }
}

/* --- the test -------------------------------------------------------------------------------- */

static const clattn_path paths[3] = {CLATTN_PATH_FUSED, CLATTN_PATH_UNFUSED, CLATTN_PATH_AUTO};
static const char *const path_names[3] = {"fused", "unfused", "auto"};

/* The problem's label with path=<name> (the label is made once, for the drawn path). */
static void set_path(pb_sdpa_problem *p, int path_index)
{
    p->spec.path = paths[path_index];
    char *at = strstr(p->label, " path=");
    if (at == NULL)
        return;
    char *end = strchr(at + 1, ' ');
    char rest[sizeof p->label];
    snprintf(rest, sizeof rest, "%s", end ? end : "");
    snprintf(at, sizeof p->label - (size_t)(at - p->label), " path=%s%s", path_names[path_index],
             rest);
}

/* AUTO's plan reads K and V in place exactly where the draw predicts it (AX_READ): on a
 * context that runs flash_cpu.cl without a loop limit, the plan says "read in place" iff
 * in_place_built, and it runs flash_cpu.cl whenever the draw counts as in place. */
static void check_read(clattn_ctx *ctx, const pb_sdpa_problem *p, const draw *d)
{
    const int route = d->v[AX_ROUTE];
    if (route != ROUTE_FUSED && route != ROUTE_GROUPED)
        return;
    clattn_sdpa_desc desc;
    pb_sdpa_desc(p, &desc);
    clattn_plan *plan = NULL;
    if (!tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS,
                          "auto plan (read in place)"))
        return;
    const char *info = clattn_plan_info(plan);
    const int cpu = strstr(info, "flash_cpu.cl") != NULL;
    const int says = strstr(info, "read in place") != NULL;
    if (d->v[AX_READ] == READ_IN_PLACE)
        tu_expect(cpu && says, "the draw reads K and V in place, the plan does not: %s", info);
    else if (cpu && in_place_on_[d->v[AX_CONFIG]])
        tu_expect(says == in_place_built(&p->spec, route),
                  "flash_cpu.cl %s in place, host/ops/flash.c's rule says %s: %s",
                  says ? "reads" : "does not read", says ? "no" : "yes", info);
    clattn_plan_release(plan);
}

/* --- the backward ---------------------------------------------------------------------------- */

/* check_backward.c's comparison helpers (no shared copy in problems.c). */

/* The expanded (B, H, Lq, Lk) dS summed over the mask's broadcast dims (right-aligned dims of
 * 1 where the problem's dim is not), into out (the mask's logical packed elements). */
static void bwd_reduce_to_mask(const pb_sdpa_problem *p, const double *dscores, double *out)
{
    const pb_sdpa_spec *s = &p->spec;
    const size_t full[4] = {s->batch, s->heads, s->seq_q, s->seq_k};
    size_t md[4] = {1, 1, 1, 1};
    for (int d = 0; d < p->mask_rank; ++d)
        md[4 - p->mask_rank + d] = p->mask_dims[d];
    memset(out, 0, p->mask_count * sizeof(double));
    for (size_t b = 0; b < full[0]; ++b)
        for (size_t h = 0; h < full[1]; ++h)
            for (size_t i = 0; i < full[2]; ++i)
                for (size_t j = 0; j < full[3]; ++j) {
                    const size_t c[4] = {md[0] == 1 ? 0 : b, md[1] == 1 ? 0 : h,
                                         md[2] == 1 ? 0 : i, md[3] == 1 ? 0 : j};
                    const size_t at = ((c[0] * md[1] + c[1]) * md[2] + c[2]) * md[3] + c[3];
                    out[at] += dscores[((b * full[1] + h) * full[2] + i) * full[3] + j];
                }
}

/* Records a failure unless got is within tol of ref, relative to the larger of max |ref| and
 * `scale` (the sum of the terms' magnitudes: a broadcast mask's or a sink's gradient is a sum
 * whose terms cancel, so its own size says nothing of the rounding). */
static void bwd_expect_close(const char *what, const float *got, const double *ref, size_t count,
                             double scale, double tol)
{
    double largest = scale, worst = 0.0;
    for (size_t i = 0; i < count; ++i)
        largest = fmax(largest, fabs(ref[i]));
    for (size_t i = 0; i < count; ++i)
        worst = isfinite(got[i]) ? fmax(worst, fabs((double)got[i] - ref[i])) : INFINITY;
    const double err = worst / fmax(largest, 1e-30);
    tu_track_error(err);
    tu_expect(err <= tol, "backward: %s: error %g > %g (max |difference| %g, scale %g)", what,
              err, tol, worst, largest);
}

enum { G_Q, G_K, G_V, G_MASK, G_SINKS, G_COUNT };

/* The float64 gradients of the problem (ref_sdpa_backward; delta from the stored `out`), the
 * mask's summed to its dims, and each one's error scale: the largest of the same sums over the
 * terms' magnitudes (ref_sdpa_backward's magnitudes pass). */
typedef struct bwd_reference {
    double *grad[G_COUNT];
    double scale[G_COUNT];
} bwd_reference;

static void bwd_reference_make(const pb_sdpa_problem *p, const float *grad_out, const float *out,
                               int want_mask, bwd_reference *r)
{
    const pb_sdpa_spec *s = &p->spec;
    const size_t counts[G_COUNT] = {p->q_count, p->k_count, p->v_count,
                                     p->mask_count ? p->mask_count : 1, s->heads};
    ref_sdpa_shape shape = pb_sdpa_ref_shape(s);
    shape.kv_len = p->kv_len;
    float *alibi = NULL;
    if (p->alibi != NULL) { /* (B, H) */
        alibi = tu_floats(s->batch * s->heads);
        for (size_t i = 0; i < s->batch * s->heads; ++i)
            alibi[i] = p->alibi[s->alibi == 1 ? i % s->heads : i];
    }
    shape.alibi = alibi;
    shape.sinks = p->sinks;
    float *mask = pb_expand_mask(p);
    double *dscores = tu_doubles(s->batch * s->heads * s->seq_q * s->seq_k);
    for (int magnitudes = 0; magnitudes < 2; ++magnitudes) {
        double *g[G_COUNT];
        for (int i = 0; i < G_COUNT; ++i)
            g[i] = tu_doubles(counts[i]);
        ref_sdpa_backward(&shape, p->q, p->k, p->v, mask, p->padding, grad_out, out, magnitudes,
                          g[G_Q], g[G_K], g[G_V], dscores, g[G_SINKS]);
        if (want_mask)
            bwd_reduce_to_mask(p, dscores, g[G_MASK]);
        for (int i = 0; i < G_COUNT; ++i) {
            if (!magnitudes) {
                r->grad[i] = g[i];
                continue;
            }
            r->scale[i] = 0.0;
            for (size_t x = 0; x < counts[i]; ++x)
                r->scale[i] = fmax(r->scale[i], g[i][x]);
            free(g[i]);
        }
    }
    free(dscores);
    free(mask);
    free(alibi);
}

static void bwd_reference_free(bwd_reference *r)
{
    for (int i = 0; i < G_COUNT; ++i)
        free(r->grad[i]);
    memset(r, 0, sizeof *r);
}

/* The backward of a drawn problem, on the context that ran its forward (check_backward.c's
 * flow): the forward again on FUSED with lse (out and lse checked), the backward on
 * NaN-poisoned gradients (dO in out's dtype and layout, each gradient in its input's dtype and
 * layout; a float mask's and the sinks' whenever the problem has them), executed twice (the
 * forward rerun between with the gradients' roles, the last ones, left out), every gradient
 * against ref_sdpa_backward within check_backward.c's tolerances, no stray writes. Turns the
 * problem's lse on and its path to FUSED. */
static void run_backward(clattn_ctx *ctx, pb_sdpa_problem *p)
{
    pb_sdpa_spec *s = &p->spec;
    const size_t kv_heads = s->kv_heads ? s->kv_heads : s->heads;
    const size_t q_dims[4] = {s->batch, s->heads, s->seq_q, s->dk};
    const size_t k_dims[4] = {s->batch, kv_heads, s->seq_k, s->dk};
    const size_t v_dims[4] = {s->batch, kv_heads, s->seq_k, s->dv};
    const size_t o_dims[4] = {s->batch, s->heads, s->seq_q, s->dv};
    const size_t lse_dims[3] = {s->batch, s->heads, s->seq_q};
    s->want_lse = 1;
    if (pb_tensor_count(&p->layouts.lse) == 0)
        pb_make_layout(&p->layouts.lse, CLATTN_DTYPE_F32, 3, lse_dims, PB_PACKED);
    set_path(p, 0);
    const int want_mask = p->mask != NULL && s->mask == PB_MASK_FLOAT;
    const int want_sinks = p->sinks != NULL;
    bwd_mask_grads_ += want_mask;
    bwd_sinks_grads_ += want_sinks;

    clattn_tensors bound;
    clattn_plan *forward = NULL, *backward = NULL;
    bwd_reference ref = {{NULL}, {0.0}};
    float *grad_out = tu_random_floats(p->out_count);
    float *out = tu_floats(p->out_count), *out_again = tu_floats(p->out_count);
    pb_round_array(s->out_dtype, grad_out, p->out_count);
    if (pb_sdpa_upload(ctx, p, &bound) != CL_SUCCESS)
        goto done;
    clattn_sdpa_desc desc;
    pb_sdpa_desc(p, &desc);
    if (!tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &forward), CLATTN_SUCCESS,
                          "backward: forward plan (fused, lse)") ||
        !tu_expect_status(clattn_plan_execute(forward, bound.by_role, CLATTN_ROLE_COUNT, NULL,
                                              NULL, 0, NULL, NULL),
                          CLATTN_SUCCESS, "backward: forward") ||
        !pb_sdpa_check(ctx, NULL, p, &bound))
        goto done;
    pb_make_layout(&bound.grad_out, s->out_dtype, 4, o_dims, s->out_layout);
    pb_make_layout(&bound.grad_q, s->q_dtype, 4, q_dims, s->q_layout);
    pb_make_layout(&bound.grad_k, s->k_dtype, 4, k_dims, s->k_layout);
    pb_make_layout(&bound.grad_v, s->v_dtype, 4, v_dims, s->v_layout);
    if (pb_upload(ctx, &bound.grad_out, tu_rand_below(5), grad_out) != CL_SUCCESS ||
        pb_upload(ctx, &bound.grad_q, tu_rand_below(5), NULL) != CL_SUCCESS ||
        pb_upload(ctx, &bound.grad_k, tu_rand_below(5), NULL) != CL_SUCCESS ||
        pb_upload(ctx, &bound.grad_v, tu_rand_below(5), NULL) != CL_SUCCESS)
        goto done;
    if (want_mask) { /* the mask's dims (1 where broadcast, summed there), packed */
        pb_make_layout(&bound.grad_attn_mask, s->mask_dtype, p->mask_rank, p->mask_dims,
                       PB_PACKED);
        if (pb_upload(ctx, &bound.grad_attn_mask, tu_rand_below(5), NULL) != CL_SUCCESS)
            goto done;
    }
    if (want_sinks) {
        const size_t dims[1] = {s->heads};
        pb_make_layout(&bound.grad_sinks, CLATTN_DTYPE_F32, 1, dims, PB_PACKED);
        if (pb_upload(ctx, &bound.grad_sinks, tu_rand_below(5), NULL) != CL_SUCCESS)
            goto done;
    }
    CLATTN_BIND_ROLES(desc, bound); /* the layouts, now with the gradients' */
    if (!tu_expect_status(clattn_sdpa_backward_plan_create(ctx, &desc, &backward),
                          CLATTN_SUCCESS, "backward plan"))
        goto done;
    clattn_tensor *grads[G_COUNT] = {&bound.grad_q, &bound.grad_k, &bound.grad_v,
                                     &bound.grad_attn_mask, &bound.grad_sinks};
    static const char *const names[G_COUNT] = {"grad_q", "grad_k", "grad_v", "grad_attn_mask",
                                               "grad_sinks"};
    const size_t counts[G_COUNT] = {p->q_count, p->k_count, p->v_count, p->mask_count, s->heads};
    /* 16-bit storage: the inputs are exact (rounded), but out (in delta = dO . out) and the
     * gradients are rounded once more */
    const int half = s->q_dtype != CLATTN_DTYPE_F32 || s->k_dtype != CLATTN_DTYPE_F32 ||
                     s->v_dtype != CLATTN_DTYPE_F32 || s->out_dtype != CLATTN_DTYPE_F32;
    for (int run = 0; run < 2 && !tu_failed(); ++run) { /* twice: the workspace is reused */
        if (run == 1) {
            pb_rewrite(ctx, NULL, &bound.out, NULL);
            tu_expect_status(clattn_plan_execute(forward, bound.by_role, CLATTN_ROLE_GRAD_OUT,
                                                 NULL, NULL, 0, NULL, NULL),
                             CLATTN_SUCCESS, "backward: forward, the gradients' roles left out");
            for (int i = 0; i < G_COUNT; ++i)
                if (grads[i]->mem != NULL)
                    pb_rewrite(ctx, NULL, grads[i], NULL);
        }
        if (!tu_expect_status(clattn_plan_execute(backward, bound.by_role, CLATTN_ROLE_COUNT,
                                                  NULL, NULL, 0, NULL, NULL),
                              CLATTN_SUCCESS, "backward"))
            break;
        /* the reference reads the forward's out as stored (delta = dO . out); once, unless the
         * rerun's out differs */
        float *stored = run == 0 ? out : out_again;
        if (pb_download(ctx, NULL, &bound.out, stored, NULL) != CL_SUCCESS)
            break;
        if (run == 0 || memcmp(out, out_again, p->out_count * sizeof(float)) != 0) {
            bwd_reference_free(&ref);
            bwd_reference_make(p, grad_out, stored, want_mask, &ref);
        }
        for (int i = 0; i < G_COUNT; ++i) {
            if (grads[i]->mem == NULL)
                continue;
            float *got = tu_floats(counts[i]);
            size_t stray = 0;
            if (pb_download(ctx, NULL, grads[i], got, &stray) == CL_SUCCESS) {
                tu_expect(stray == 0, "backward: %s: %zu stray writes outside it", names[i],
                          stray);
                tu_expect_finite(names[i], got, counts[i]);
                bwd_expect_close(names[i], got, ref.grad[i], counts[i], ref.scale[i],
                                 grads[i]->dtype == CLATTN_DTYPE_F32 && !half ? 2e-4 : 3e-2);
            }
            free(got);
        }
    }
done:
    bwd_reference_free(&ref);
    clattn_plan_release(backward);
    clattn_plan_release(forward);
    pb_release_tensors(&bound);
    free(out_again);
    free(out);
    free(grad_out);
}

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int print_times_;

START_TEST(test_draw)
{
    TU_BEGIN_TEST();
    const double start = now_seconds();
    draw d;
    pb_sdpa_spec spec;
    draw_met(_i, &d, &spec);
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    char forced[160] = "none";
    if (d.combo >= 0)
        describe_combo(&required[d.combo], forced, sizeof forced);
    clattn_ctx *ctx = config_ctx(d.v[AX_CONFIG]);
    if (ctx != NULL) {
        for (int k = 0; k < 3; ++k) {
            set_path(&p, k);
            tu_set_case("draw %d context=%s route=%s (forced: %s): %s", _i,
                        axes[AX_CONFIG].values[d.v[AX_CONFIG]], axes[AX_ROUTE].values[d.v[AX_ROUTE]],
                        forced, p.label);
            const clattn_status want = expected_status(&p.spec, paths[k]);
            if (want == CLATTN_SUCCESS) {
                const pb_run_options options = {.executions = 2};
                tu_expect_status(pb_sdpa_run(ctx, &p, &options), CLATTN_SUCCESS, "pb_sdpa_run");
                path_ran_[k]++;
                if (paths[k] == CLATTN_PATH_AUTO)
                    check_read(ctx, &p, &d);
                continue;
            }
            clattn_sdpa_desc desc;
            pb_sdpa_desc(&p, &desc);
            clattn_plan *plan = NULL;
            const clattn_status got = clattn_sdpa_plan_create(ctx, &desc, &plan);
            tu_expect(got == want && plan == NULL,
                      "path %s: expected the documented refusal %s, got %s (%d): %s",
                      path_names[k], clattn_status_string(want), clattn_status_string(got),
                      (int)got, clattn_last_error(ctx));
            clattn_plan_release(plan);
            path_refused_[k]++;
        }
        if (d.v[AX_BACKWARD] == ON && !tu_failed()) {
            tu_set_case("draw %d backward (forward on FUSED with lse) context=%s (forced: %s): %s",
                        _i, axes[AX_CONFIG].values[d.v[AX_CONFIG]], forced, p.label);
            run_backward(ctx, &p);
            bwd_ran_++;
            bwd_forced_ += d.want_backward;
            count_draw(&bwd_, &d);
        }
        count_draw(&run_, &d);
    }
    if (print_times_)
        printf("sweep: draw %d: %.2f s: context=%s route=%s%s %s\n", _i, now_seconds() - start,
               axes[AX_CONFIG].values[d.v[AX_CONFIG]], axes[AX_ROUTE].values[d.v[AX_ROUTE]],
               d.v[AX_BACKWARD] == ON ? " +backward" : "", p.label);
    pb_sdpa_free(&p);
    /* TU_END_TEST, cut short: check refuses messages past a few KiB ("Message string too
     * long"), and a draw that fails on three paths twice says more than that */
    ck_assert_msg(!tu_failed(), "%.3000s", tu_failure_text());
}
END_TEST

/* --- main ------------------------------------------------------------------------------------ */

static long env_long(const char *name, long fallback)
{
    const char *text = getenv(name);
    if (text == NULL || text[0] == '\0')
        return fallback;
    char *end = NULL;
    const long value = strtol(text, &end, 10);
    if (*end != '\0' || value < 0) {
        fprintf(stderr, "sweep: ignoring %s='%s' (not a count)\n", name, text);
        return fallback;
    }
    return value;
}

/* CLATTN_SWEEP_SEED (or CLATTN_TEST_SEED) as given; else fixed, but from the clock at
 * CLATTN_TEST_SCALE=full or with "random". Handed to testutil as CLATTN_TEST_SEED. */
static void choose_seed(int full)
{
    const char *sweep = getenv("CLATTN_SWEEP_SEED");
    const char *test = getenv("CLATTN_TEST_SEED");
    const char *given = sweep && sweep[0] ? sweep : test && test[0] ? test : NULL;
    char text[32];
    if (given != NULL && strcmp(given, "random") != 0) {
        setenv("CLATTN_TEST_SEED", given, 1);
        return;
    }
    if (given != NULL || full) {
        uint64_t mix = (uint64_t)time(NULL) * UINT64_C(0x9E3779B97F4A7C15) ^ (uint64_t)getpid() ^
                       (uint64_t)clock() << 32;
        mix ^= mix >> 29;
        snprintf(text, sizeof text, "%" PRIu64, (mix * UINT64_C(0xBF58476D1CE4E5B9)) % 1000000000000u);
        setenv("CLATTN_TEST_SEED", text, 1);
        return;
    }
    unsetenv("CLATTN_TEST_SEED"); /* testutil's fixed seed of the suite */
}

/* in_place_on_: the default context's parameters say flash_cpu=1 and loop_trip_limit=0 (the
 * default and decode_split contexts add only decode_keys to them). */
static void choose_in_place(void)
{
    const char *t = clattn_ctx_tuning(tu_ctx());
    const int on = t != NULL && strstr(t, " flash_cpu=1 ") != NULL &&
                   strstr(t, " loop_trip_limit=0") != NULL &&
                   (getenv("CLATTN_PARAMS") == NULL || getenv("CLATTN_PARAMS")[0] == '\0');
    in_place_on_[CFG_DEFAULT] = on;
    in_place_on_[CFG_DECODE_SPLIT] = on;
}

static void choose_configs(void)
{
    const char *list = getenv("CLATTN_SWEEP_CONFIGS");
    /* the environment's parameters win: its contexts that would set them are left out */
    const int env_params = getenv("CLATTN_PARAMS") != NULL && getenv("CLATTN_PARAMS")[0];
    const int env_limit = getenv("CLATTN_LOOP_TRIP_LIMIT") != NULL &&
                          getenv("CLATTN_LOOP_TRIP_LIMIT")[0];
    for (int c = 0; c < CFG_COUNT; ++c) {
        int on = 1;
        if (list != NULL && list[0] != '\0') {
            const char *name = axes[AX_CONFIG].values[c];
            const size_t n = strlen(name);
            on = 0;
            for (const char *at = strstr(list, name); at != NULL; at = strstr(at + 1, name))
                if ((at == list || at[-1] == ',') && (at[n] == '\0' || at[n] == ','))
                    on = 1;
        }
        if (configs[c].gpu_params && env_params)
            on = 0;
        if (env_limit && configs[c].row != NULL && strstr(configs[c].row, "loop_trip_limit"))
            on = 0;
        config_on_[c] = on;
    }
    int any = 0;
    for (int c = 0; c < CFG_COUNT; ++c)
        any |= config_on_[c];
    if (!any) {
        fprintf(stderr, "sweep: CLATTN_SWEEP_CONFIGS='%s' names no context; taking default\n",
                list ? list : "");
        config_on_[CFG_DEFAULT] = 1;
    }
    active_count_ = 0;
    for (int i = 0; i < COUNT_OF(required); ++i)
        if (combo_possible(&required[i]))
            active_[active_count_++] = i;
}

int main(void)
{
    const char *scale = getenv("CLATTN_TEST_SCALE");
    const int full = scale != NULL && strcmp(scale, "full") == 0;
    small_ = tu_small();
    full_ = full;
    choose_seed(full);
    tu_suite_begin("check_sweep");
    choose_in_place();
    choose_configs();
    {
        cl_device_fp_config fp64 = 0;
        has_fp64_ = clGetDeviceInfo(clattn_ctx_device(tu_ctx()), CL_DEVICE_DOUBLE_FP_CONFIG,
                                    sizeof fp64, &fp64, NULL) == CL_SUCCESS &&
                    fp64 != 0;
    }
    const long draws =
        env_long("CLATTN_SWEEP_DRAWS", small_ ? SWEEP_DRAWS_SMALL : full ? SWEEP_DRAWS_FULL
                                                                        : SWEEP_DRAWS_CI);
    const long only = env_long("CLATTN_SWEEP_ONLY", -1);
    print_times_ = env_long("CLATTN_SWEEP_TIMES", 0) != 0;
    const uint64_t seed = tu_seed();
    /* the replay line: the seed and every variable that changes what runs */
    char replay[1024];
    size_t used = (size_t)snprintf(replay, sizeof replay, "CLATTN_SWEEP_SEED=%" PRIu64
                                   " CLATTN_SWEEP_DRAWS=%ld", seed, draws);
    static const char *const vars[] = {"CLATTN_TEST_SCALE", "CLATTN_SWEEP_CONFIGS",
                                       "CLATTN_PARAMS",     "CLATTN_LOOP_TRIP_LIMIT",
                                       "CLATTN_DEVICE",     "CLATTN_TUNING",
                                       "CLATTN_MATMUL"};
    for (int i = 0; i < COUNT_OF(vars) && used < sizeof replay; ++i) {
        const char *value = getenv(vars[i]);
        if (value != NULL && value[0] != '\0')
            used += (size_t)snprintf(replay + used, sizeof replay - used, " %s=%s", vars[i],
                                     value);
    }
    printf("sweep: seed %" PRIu64 " (replay: %s ./check_sweep; one draw: add "
           "CLATTN_SWEEP_ONLY=<draw>)\n",
           seed, replay);
    char on[128] = "";
    used = 0;
    for (int c = 0; c < CFG_COUNT; ++c)
        if (config_on_[c])
            used += (size_t)snprintf(on + used, sizeof on - used, "%s%s", used ? "," : "",
                                     axes[AX_CONFIG].values[c]);
    printf("sweep: %ld draws%s, contexts %s, %d required combinations cycled, device fp64 %s\n",
           draws, small_ ? " (small scale)" : full ? " (full scale)" : "", on, active_count_,
           has_fp64_ ? "yes" : "no");
    fflush(stdout);

    Suite *suite = suite_create("sweep");
    TCase *tc = tcase_create("draws");
    tcase_set_timeout(tc, 3600);
    if (only >= 0)
        tcase_add_loop_test(tc, test_draw, (int)only, (int)only + 1);
    else
        tcase_add_loop_test(tc, test_draw, 0, (int)draws);
    tcase_add_unchecked_fixture(tc, NULL, release_configs);
    suite_add_tcase(suite, tc);
    census();
    const int status = tu_run_suite(suite);
    print_coverage();
    return status;
}
