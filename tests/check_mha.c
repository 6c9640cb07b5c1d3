/*
 * check_mha: multi-head attention through MHA plans (clattn_mha_plan_create / execute on device
 * buffers) and clattn_mha_forward_host, against the float64 reference: both weight layouts,
 * PyTorch's packed in_proj for self- and cross-attention (self-attention binds one buffer to
 * query, key and value: the plan's packed QKV projection), separate q/k/v weights with
 * kdim/vdim != E, optional biases and output projection, qk_dim != v_dim, heads 1..16,
 * need_weights PER_HEAD and AVERAGED (the mean-over-heads kernel), float and boolean masks, key
 * padding, both causal alignments, relu, paths AUTO/FUSED/UNFUSED; strided views of the inputs
 * (rows with gaps, q/k/v as three views of one (B, L, 3E) buffer), F16/BF16 storage of the
 * activations, rank-4 broadcast masks, grouped-query projections (num_kv_heads), and the workspace of a fused plan (the projections only:
 * heads are views, never copies).
 *
 * Problems come from tests/problems.h (the shared builder); outputs are NaN-poisoned and every
 * stray write outside an output is an error.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "problems.h"
#include "reference.h"
#include "testutil.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

#define XW CLATTN_LAYOUT_XW
#define TORCH CLATTN_LAYOUT_TORCH
#define NONE CLATTN_WEIGHTS_NONE
#define PER_HEAD CLATTN_WEIGHTS_PER_HEAD
#define AVERAGED CLATTN_WEIGHTS_AVERAGED
#define SMAX CLATTN_NORM_SOFTMAX
#define RELU CLATTN_NORM_RELU
#define AUTO CLATTN_PATH_AUTO
#define FUSED CLATTN_PATH_FUSED
#define UNFUSED CLATTN_PATH_UNFUSED
#define PK_SELF PB_PACKED_SELF      /* in_proj_weight, key = value = query */
#define PK_CROSS PB_PACKED_CROSS    /* in_proj_weight, key/value differ from the query */
#define SEP_SELF PB_SEPARATE_SELF   /* q/k/v weights, key = value = query */
#define SEP_CROSS PB_SEPARATE_CROSS /* q/k/v weights, key and value of their own */
#define DEF NAN                     /* scale: 1/sqrt(head size) */

/* One row of the case tables. causal: 0 none, 1 top-left, 2 bottom-right (clattn_causal's
 * values); mask: 0 none, 1 float (-inf entries), 2 boolean (U8). */
typedef struct mha_case {
    size_t batch, seq_q, seq_k, embed_dim, num_heads;
    size_t kdim, vdim, qk_dim, v_dim; /* 0: embed_dim */
    clattn_weight_layout layout;
    pb_mha_form form;
    int in_biases, out_proj, out_bias;
    clattn_need_weights need_weights;
    clattn_path path;
    int causal, mask, padding;
    float scale;
    clattn_norm norm;
} mha_case;

/* clang-format off */
static const mha_case mha_cases[] = {
    /* batch seq_q seq_k E H kdim vdim qk_dim v_dim layout form in_biases out_proj out_bias
       need_weights path causal mask padding scale norm */
    /* PyTorch packed in_proj, self-attention, heads 1, 2, 4, 8, 16 */
    {1, 5, 5, 16, 1, 0, 0, 0, 0, TORCH, PK_SELF, 1, 1, 1, NONE, AUTO, 0, 0, 0, DEF, SMAX},
    {2, 17, 17, 32, 2, 0, 0, 0, 0, TORCH, PK_SELF, 1, 1, 1, PER_HEAD, AUTO, 1, 0, 0, DEF, SMAX},
    {3, 9, 9, 32, 4, 0, 0, 0, 0, TORCH, PK_SELF, 0, 1, 0, AVERAGED, UNFUSED, 0, 0, 1, DEF, SMAX},
    {2, 7, 7, 64, 8, 0, 0, 0, 0, TORCH, PK_SELF, 1, 1, 1, AVERAGED, AUTO, 0, 1, 0, DEF, SMAX},
    {1, 3, 3, 16, 16, 0, 0, 0, 0, TORCH, PK_SELF, 1, 1, 1, PER_HEAD, UNFUSED, 0, 0, 0, DEF, SMAX},
    {2, 65, 65, 64, 8, 0, 0, 0, 0, TORCH, PK_SELF, 1, 1, 1, AVERAGED, AUTO, 1, 2, 1, DEF, SMAX},
    /* packed in_proj, cross-attention (key/value differ from query, seq_q != seq_k) */
    {2, 5, 13, 32, 4, 0, 0, 0, 0, TORCH, PK_CROSS, 1, 1, 1, AVERAGED, AUTO, 0, 1, 1, DEF, SMAX},
    {3, 17, 3, 16, 2, 0, 0, 0, 0, TORCH, PK_CROSS, 0, 1, 1, NONE, FUSED, 1, 0, 0, DEF, SMAX},
    /* separate q/k/v weights, kdim/vdim != E */
    {2, 6, 11, 32, 4, 20, 12, 0, 0, TORCH, SEP_CROSS, 1, 1, 1, PER_HEAD, AUTO, 0, 0, 0, DEF, SMAX},
    {1, 4, 9, 16, 8, 7, 33, 0, 0, TORCH, SEP_CROSS, 0, 1, 0, AVERAGED, AUTO, 0, 0, 1, DEF, SMAX},
    {2, 9, 9, 16, 8, 0, 0, 0, 0, TORCH, SEP_SELF, 0, 0, 0, AVERAGED, AUTO, 1, 0, 0, DEF, SMAX},
    /* textbook XW layout */
    {2, 9, 9, 32, 4, 0, 0, 0, 0, XW, SEP_SELF, 1, 1, 1, PER_HEAD, AUTO, 0, 0, 0, DEF, SMAX},
    {1, 5, 8, 24, 2, 10, 14, 0, 0, XW, SEP_CROSS, 0, 0, 0, NONE, UNFUSED, 0, 2, 0, DEF, SMAX},
    {3, 7, 7, 16, 1, 0, 0, 0, 0, XW, SEP_SELF, 1, 1, 0, AVERAGED, AUTO, 1, 0, 0, DEF, SMAX},
    /* qk_dim != v_dim: single head without output projection (the textbook form), and more */
    {1, 5, 7, 8, 1, 0, 0, 6, 10, XW, SEP_CROSS, 0, 0, 0, PER_HEAD, AUTO, 0, 0, 0, DEF, SMAX},
    {1, 3, 3, 4, 1, 0, 0, 3, 5, XW, SEP_SELF, 0, 0, 0, PER_HEAD, UNFUSED, 0, 0, 0, 0.5f, SMAX},
    {3, 6, 10, 16, 4, 9, 11, 12, 20, XW, SEP_CROSS, 1, 1, 1, AVERAGED, AUTO, 0, 1, 1, DEF, SMAX},
    {2, 8, 8, 12, 2, 0, 0, 6, 14, XW, SEP_SELF, 1, 0, 0, PER_HEAD, AUTO, 1, 0, 0, DEF, SMAX},
    /* relu normalisation, explicit scales (0 is a real scale now), tiny shapes, fused path */
    {2, 9, 9, 16, 2, 0, 0, 0, 0, XW, SEP_SELF, 1, 1, 1, PER_HEAD, AUTO, 1, 0, 0, DEF, RELU},
    {2, 4, 6, 32, 4, 0, 0, 0, 0, TORCH, PK_CROSS, 1, 1, 1, AVERAGED, AUTO, 0, 0, 1, 0.2f, RELU},
    {1, 1, 1, 8, 2, 0, 0, 0, 0, TORCH, PK_SELF, 1, 1, 1, PER_HEAD, AUTO, 0, 0, 0, DEF, SMAX},
    {3, 1, 5, 8, 4, 0, 0, 0, 0, XW, SEP_CROSS, 1, 1, 1, AVERAGED, AUTO, 1, 1, 1, 0.9f, SMAX},
    {2, 11, 11, 24, 3, 0, 0, 0, 0, TORCH, PK_SELF, 1, 1, 1, NONE, FUSED, 1, 2, 1, 0.0f, SMAX},
    {3, 9, 9, 16, 2, 0, 0, 0, 0, XW, SEP_SELF, 1, 1, 1, NONE, FUSED, 0, 1, 1, DEF, RELU},
    {2, 7, 12, 20, 5, 0, 0, 0, 0, TORCH, PK_CROSS, 1, 0, 0, NONE, UNFUSED, 2, 1, 1, DEF, RELU},
};
/* clang-format on */

static void spec_of(const mha_case *mc, pb_mha_spec *spec)
{
    pb_mha_spec_init(spec);
    spec->batch = mc->batch;
    spec->seq_q = mc->seq_q;
    spec->seq_k = mc->seq_k;
    spec->embed_dim = mc->embed_dim;
    spec->num_heads = mc->num_heads;
    spec->kdim = mc->kdim;
    spec->vdim = mc->vdim;
    spec->qk_dim = mc->qk_dim;
    spec->v_dim = mc->v_dim;
    spec->layout = mc->layout;
    spec->form = mc->form;
    spec->in_biases = mc->in_biases;
    spec->out_proj = mc->out_proj;
    spec->out_bias = mc->out_bias;
    spec->need_weights = mc->need_weights;
    spec->path = mc->path;
    spec->causal = (clattn_causal)mc->causal;
    spec->mask = (pb_mask_kind)mc->mask;
    spec->padding = mc->padding;
    spec->scale = mc->scale;
    spec->norm = mc->norm;
}

static int is_self(const pb_mha_problem *p)
{
    return p->spec.form == PB_PACKED_SELF || p->spec.form == PB_SEPARATE_SELF;
}

/* CLATTN_TEST_SCALE=small (Oclgrind): the host API, which runs the same kernels as the plans
 * once more, is left out where a device plan already ran the problem; plans run once. */
static int reduced;

/* --- the two APIs --------------------------------------------------------------------------- */

/* A plan on device buffers (each at a random offset, poison around), executed `executions`
 * times on fresh buffers, every output checked. */
static void run_device(const pb_mha_problem *p, int executions)
{
    tu_set_case("device plan: %s", p->label);
    const pb_run_options options = {.executions = reduced ? 1 : executions};
    pb_mha_run(tu_ctx(), p, &options);
}

/* clattn_mha_forward_host with the problem's host arrays and masks. explicit_self: for
 * self-attention, pass the query pointer as key and value instead of NULL. */
static void run_host(const pb_mha_problem *p, int explicit_self)
{
    tu_set_case("host%s: %s", explicit_self ? " (key = value = query pointer)" : "", p->label);
    const float *key = p->key, *value = p->value;
    if (is_self(p) && explicit_self) {
        key = p->query;
        value = p->query;
    }
    float *out = tu_nan_floats(p->out_count);
    float *attn = p->attn_count ? tu_nan_floats(p->attn_count) : NULL;
    clattn_status status = clattn_mha_forward_host(tu_ctx(), &p->desc, &p->weights, p->query, key,
                                                   value, &p->masks, out, attn);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_mha_forward_host")) {
        pb_mha_check_host(p, out, attn);
    }
    free(attn);
    free(out);
}

static void run_host_unless_reduced(const pb_mha_problem *p, int explicit_self)
{
    if (!reduced) {
        run_host(p, explicit_self);
    }
}

static void run_both(const mha_case *mc)
{
    pb_mha_spec spec;
    spec_of(mc, &spec);
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    run_device(&p, 1);
    run_host_unless_reduced(&p, 0);
    if (is_self(&p)) {
        run_host_unless_reduced(&p, 1);
    }
    pb_mha_free(&p);
}

START_TEST(test_mha_cases)
{
    TU_BEGIN_TEST();
    run_both(&mha_cases[_i]);
    TU_END_TEST();
}
END_TEST

/* Grouped-query projections (num_kv_heads a divisor of num_heads, 1 = multi-query): k_weight
 * and v_weight project to num_kv_heads heads, query head h attends with k/v head
 * h / (num_heads / num_kv_heads). Separate weights only, both layouts, both paths, every
 * need_weights mode, masks, padding, causal alignments, qk_dim != v_dim, kdim/vdim != E. */
typedef struct gqa_case {
    mha_case base;
    size_t num_kv_heads;
} gqa_case;

/* clang-format off */
static const gqa_case gqa_cases[] = {
    {{2, 9, 9, 32, 4, 0, 0, 0, 0, XW, SEP_SELF, 1, 1, 1, NONE, AUTO, 1, 0, 0, DEF, SMAX}, 2},
    {{1, 17, 13, 48, 6, 20, 12, 0, 0, TORCH, SEP_CROSS, 1, 1, 0, PER_HEAD, UNFUSED, 0, 1, 1, DEF,
      SMAX}, 3},
    {{3, 5, 7, 16, 8, 0, 0, 0, 0, XW, SEP_CROSS, 0, 1, 1, AVERAGED, AUTO, 2, 2, 0, DEF, SMAX}, 1},
    {{2, 65, 65, 64, 8, 0, 0, 0, 0, TORCH, SEP_SELF, 1, 1, 1, NONE, FUSED, 1, 0, 1, DEF, SMAX}, 2},
    {{1, 6, 10, 16, 4, 0, 0, 12, 20, XW, SEP_CROSS, 1, 0, 0, PER_HEAD, AUTO, 0, 0, 0, DEF, RELU},
     2},
    {{2, 3, 3, 8, 2, 0, 0, 0, 0, XW, SEP_SELF, 0, 1, 0, NONE, UNFUSED, 0, 2, 1, 0.7f, SMAX}, 1},
    {{1, 129, 127, 32, 4, 0, 0, 0, 0, TORCH, SEP_CROSS, 1, 1, 1, NONE, FUSED, 2, 1, 0, DEF, SMAX},
     1},
};
/* clang-format on */

START_TEST(test_mha_grouped_query)
{
    TU_BEGIN_TEST();
    pb_mha_spec spec;
    spec_of(&gqa_cases[_i].base, &spec);
    spec.num_kv_heads = gqa_cases[_i].num_kv_heads;
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    run_device(&p, 2);
    run_host_unless_reduced(&p, 0);
    pb_mha_free(&p);
    TU_END_TEST();
}
END_TEST

/* Rotary embeddings on the projected q and k (clattn_mha_desc.rope and the host call's): both
 * conventions, partial rotary dims, a start position, another base, grouped heads, cross
 * attention with Lq != Lk, causal masks, both paths; device plans and the host API. */
typedef struct rope_mha_case {
    mha_case base;
    size_t num_kv_heads;
    clattn_rope_style style;
    size_t dims, start;
    double rope_base;
} rope_mha_case;

/* clang-format off */
static const rope_mha_case rope_mha_cases[] = {
    {{2, 9, 9, 32, 4, 0, 0, 0, 0, TORCH, PK_SELF, 1, 1, 1, NONE, AUTO, 1, 0, 0, DEF, SMAX}, 0,
     CLATTN_ROPE_HALVES, 0, 0, 0},
    {{1, 17, 13, 48, 6, 20, 12, 0, 0, TORCH, SEP_CROSS, 1, 1, 0, PER_HEAD, UNFUSED, 0, 1, 1, DEF,
      SMAX}, 3, CLATTN_ROPE_PAIRS, 4, 7, 0},
    {{2, 65, 65, 64, 8, 0, 0, 0, 0, XW, SEP_SELF, 1, 1, 1, NONE, FUSED, 1, 0, 1, DEF, SMAX}, 2,
     CLATTN_ROPE_HALVES, 6, 1000, 500},
    {{3, 5, 7, 16, 2, 0, 0, 24, 8, XW, SEP_CROSS, 0, 1, 1, AVERAGED, AUTO, 2, 2, 0, DEF, SMAX}, 0,
     CLATTN_ROPE_PAIRS, 0, 3, 0},
};
/* clang-format on */

START_TEST(test_mha_rope)
{
    TU_BEGIN_TEST();
    const rope_mha_case *rc = &rope_mha_cases[_i];
    pb_mha_spec spec;
    spec_of(&rc->base, &spec);
    spec.num_kv_heads = rc->num_kv_heads;
    spec.rope = 1;
    spec.rope_style = rc->style;
    spec.rope_dims = rc->dims;
    spec.rope_start = rc->start;
    spec.rope_base = rc->rope_base;
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    run_device(&p, 1);
    run_host_unless_reduced(&p, 0);
    pb_mha_free(&p);
    TU_END_TEST();
}
END_TEST

/* The three need_weights modes on one case: the output must not depend on the choice. Each
 * plan runs twice, on new buffers at new offsets (plan reuse). */
START_TEST(test_mha_need_weights_modes)
{
    TU_BEGIN_TEST();
    static const clattn_need_weights modes[] = {NONE, PER_HEAD, AVERAGED};
    /* clang-format off */
    mha_case mc = {2, 6, 10, 32, 4, 0, 0, 0, 0, TORCH, PK_CROSS, 1, 1, 1, NONE, AUTO, 1, 0, 1,
                   DEF, SMAX};
    /* clang-format on */
    mc.need_weights = modes[_i];
    pb_mha_spec spec;
    spec_of(&mc, &spec);
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    run_device(&p, 2);
    run_host_unless_reduced(&p, 0);
    pb_mha_free(&p);
    TU_END_TEST();
}
END_TEST

/* Host API on one context with different shapes in turn (small, large, small again): workspace
 * kept in the context must be grown and reused correctly. */
START_TEST(test_mha_host_workspace_reuse)
{
    TU_BEGIN_TEST();
    /* clang-format off */
    const mha_case small = {1, 4, 4, 16, 2, 0, 0, 0, 0, TORCH, PK_SELF, 1, 1, 1, PER_HEAD,
                            AUTO, 0, 0, 0, DEF, SMAX};
    const mha_case large = {3, 33, 47, 64, 8, 24, 40, 0, 0, TORCH, SEP_CROSS, 1, 1, 1,
                            AVERAGED, AUTO, 1, 1, 1, DEF, SMAX};
    const mha_case other = {2, 9, 5, 12, 3, 0, 0, 6, 15, XW, SEP_CROSS, 0, 0, 0, PER_HEAD,
                            AUTO, 0, 0, 0, 0.3f, SMAX};
    /* clang-format on */
    const mha_case *sequence[] = {&small, &large, &small, &other, &large};
    for (int step = 0; step < COUNT_OF(sequence); ++step) {
        pb_mha_spec spec;
        spec_of(sequence[step], &spec);
        pb_mha_problem p;
        pb_mha_make(&p, &spec);
        run_host(&p, 0);
        pb_mha_free(&p);
    }
    /* Attention host calls share the context's workspace too. */
    pb_sdpa_spec attention;
    pb_sdpa_spec_init(&attention);
    attention.batch = 2, attention.heads = 3, attention.seq_q = 5, attention.seq_k = 9;
    attention.dk = 4, attention.dv = 6;
    pb_sdpa_problem sp;
    pb_sdpa_make(&sp, &attention);
    clattn_attention_host_desc host;
    clattn_attention_host_desc_init(&host);
    host.batch = 2, host.heads = 3, host.seq_q = 5, host.seq_k = 9;
    host.head_dim_qk = 4, host.head_dim_v = 6;
    float *out = tu_nan_floats(sp.out_count);
    tu_set_case("attention host after mha host calls: %s", sp.label);
    clattn_status status =
        clattn_attention_host(tu_ctx(), &host, sp.q, sp.k, sp.v, NULL, out, NULL);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_attention_host")) {
        tu_expect_close("out", out, sp.out_ref, sp.out_count, TU_TOL);
    }
    free(out);
    pb_sdpa_free(&sp);
    {
        pb_mha_spec spec;
        spec_of(&small, &spec);
        pb_mha_problem p;
        pb_mha_make(&p, &spec);
        run_host(&p, 0);
        pb_mha_free(&p);
    }
    TU_END_TEST();
}
END_TEST

/* Host masks come from the host masks argument only (NULL: none; NULL fields: that mask
 * absent), whatever device plans with masks ran on the context before. */
START_TEST(test_mha_host_masks_only_from_argument)
{
    TU_BEGIN_TEST();
    /* clang-format off */
    const mha_case mc = {2, 5, 7, 16, 2, 0, 0, 0, 0, TORCH, PK_CROSS, 1, 1, 1, PER_HEAD,
                         AUTO, 1, 1, 1, DEF, SMAX};
    /* clang-format on */
    pb_mha_spec spec;
    spec_of(&mc, &spec);
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    run_device(&p, 1); /* a plan with both masks ran on this context */
    run_host(&p, 0);
    /* The same problem without masks: host masks NULL, then host masks with NULL fields. */
    free(p.attn_mask);
    free(p.padding);
    p.attn_mask = NULL;
    p.padding = NULL;
    p.masks.attn_mask = NULL;
    p.masks.key_padding_mask = NULL;
    pb_mha_reference(&p);
    for (int variant = 0; variant < 2; ++variant) {
        tu_set_case("host, masks %s after a device plan with masks: %s",
                    variant == 0 ? "NULL" : "with NULL fields", p.label);
        const clattn_host_masks empty = {NULL, NULL, NULL};
        float *out = tu_nan_floats(p.out_count), *attn = tu_nan_floats(p.attn_count);
        clattn_status status =
            clattn_mha_forward_host(tu_ctx(), &p.desc, &p.weights, p.query, p.key, p.value,
                                    variant == 0 ? NULL : &empty, out, attn);
        if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_mha_forward_host")) {
            pb_mha_check_host(&p, out, attn);
        }
        free(attn);
        free(out);
    }
    pb_mha_free(&p);
    TU_END_TEST();
}
END_TEST

/* heads 1, 2, 4, 8, 16 with batch 1..3 on one layout each. */
START_TEST(test_mha_heads_and_batches)
{
    TU_BEGIN_TEST();
    static const size_t heads_list[] = {1, 2, 4, 8, 16};
    static const clattn_path paths[] = {AUTO, UNFUSED, FUSED};
    size_t heads = heads_list[_i % 5];
    size_t batch = 1 + (size_t)_i % 3;
    const clattn_need_weights need = (clattn_need_weights)(_i % 3);
    /* clang-format off */
    mha_case mc = {batch, 5 + (size_t)_i, 3 + 2 * (size_t)_i, 32, heads, 0, 0, 0, 0,
                   _i < 5 ? TORCH : XW, _i < 5 ? PK_CROSS : SEP_CROSS, 1, 1, 1,
                   need, need == NONE ? paths[_i % 3] : paths[_i % 2], _i % 2,
                   _i % 3 == 2 ? 1 + _i % 2 : 0, _i % 4 == 1, DEF, SMAX};
    /* clang-format on */
    pb_mha_spec spec;
    spec_of(&mc, &spec);
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    run_device(&p, 1);
    run_host(&p, 0);
    pb_mha_free(&p);
    TU_END_TEST();
}
END_TEST

/* Random configurations over every option: layout, packed or separate weights, self or cross,
 * widths, biases, output projection, need_weights, path, masks, causal alignment, scale,
 * normalisation, and now and then strided rows and 16-bit storage of the activations. */
START_TEST(test_mha_random)
{
    TU_BEGIN_TEST();
    static const size_t heads_list[] = {1, 2, 4, 8, 16};
    static const size_t seqs[] = {1, 3, 17, 33, 65};
    static const clattn_dtype dtypes[] = {CLATTN_DTYPE_F32, CLATTN_DTYPE_F16, CLATTN_DTYPE_BF16};
    pb_mha_spec spec;
    pb_mha_spec_init(&spec);
    spec.num_heads = heads_list[tu_rand_below(5)];
    spec.embed_dim = spec.num_heads * (1 + tu_rand_below(8));
    spec.batch = 1 + tu_rand_below(3);
    spec.layout = tu_rand_below(2) ? TORCH : XW;
    const int self = (int)tu_rand_below(2);
    spec.seq_q = seqs[tu_rand_below(5)];
    spec.seq_k = self ? spec.seq_q : seqs[tu_rand_below(5)];
    if (spec.layout == TORCH && tu_rand_below(2)) {
        spec.form = self ? PK_SELF : PK_CROSS;
    } else {
        spec.form = self ? SEP_SELF : SEP_CROSS;
        if (!self) {
            spec.kdim = 1 + tu_rand_below(40);
            spec.vdim = 1 + tu_rand_below(40);
        }
        if (spec.layout == XW && tu_rand_below(2)) {
            spec.qk_dim = spec.num_heads * (1 + tu_rand_below(6));
            spec.v_dim = spec.num_heads * (1 + tu_rand_below(6));
        }
        if (tu_rand_below(3) == 0) { /* grouped-query: a divisor of num_heads */
            do {
                spec.num_kv_heads = 1 + tu_rand_below(spec.num_heads);
            } while (spec.num_heads % spec.num_kv_heads != 0);
        }
    }
    spec.in_biases = (int)tu_rand_below(2);
    spec.out_proj = (int)tu_rand_below(3) != 0;
    spec.out_bias = (int)tu_rand_below(2);
    spec.need_weights = (clattn_need_weights)tu_rand_below(3);
    spec.path = spec.need_weights == NONE ? (clattn_path)tu_rand_below(3)
                                          : (tu_rand_below(2) ? AUTO : UNFUSED);
    spec.causal = (clattn_causal)tu_rand_below(3);
    spec.mask = (pb_mask_kind)tu_rand_below(3);
    spec.padding = (int)tu_rand_below(2);
    spec.scale = tu_rand_below(2) ? NAN : (float)(0.1 + tu_rand_unit());
    spec.norm = tu_rand_below(4) == 0 ? RELU : SMAX;
    if (tu_rand_below(4) == 0) {
        spec.query_dtype = dtypes[tu_rand_below(3)];
        spec.key_dtype = dtypes[tu_rand_below(3)];
        spec.value_dtype = dtypes[tu_rand_below(3)];
        spec.out_dtype = dtypes[tu_rand_below(3)];
    }
    if (tu_rand_below(4) == 0) {
        spec.query_row_gap = tu_rand_below(9);
        spec.key_row_gap = tu_rand_below(9);
        spec.value_row_gap = tu_rand_below(9);
        spec.out_row_gap = tu_rand_below(9);
    }
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    run_device(&p, 1);
    run_host(&p, 0);
    pb_mha_free(&p);
    TU_END_TEST();
}
END_TEST

/* --- shared and strided inputs --------------------------------------------------------------- */

/* Uploads the problem's parameters and poisoned outputs (pb_mha_upload) and drops its query,
 * key and value buffers: the caller binds its own views. */
static cl_int upload_without_inputs(const pb_mha_problem *p, clattn_tensors *bound)
{
    cl_int err = pb_mha_upload(tu_ctx(), p, bound);
    if (err != CL_SUCCESS) {
        return err;
    }
    clattn_tensors inputs;
    memset(&inputs, 0, sizeof inputs);
    inputs.q = bound->q, inputs.k = bound->k, inputs.v = bound->v;
    pb_release_tensors(&inputs);
    bound->q.mem = bound->k.mem = bound->v.mem = NULL;
    return CL_SUCCESS;
}

/* The problem's reference for explicit query, key and value arrays (the problem's masks). */
static void reference_for(pb_mha_problem *p, const float *query, const float *key,
                          const float *value)
{
    ref_mha_forward(&p->desc, &p->weights, query, key, value, &p->masks, p->out_ref, p->attn_ref);
}

/* Creates a plan from `layouts` (the problem's settings), executes it once on `bound` and
 * checks the outputs against the problem's reference. */
static void run_plan_desc(const pb_mha_problem *p, const clattn_mha_desc *desc,
                          const clattn_tensors *bound, int expect_fused);

static void run_plan_on(const pb_mha_problem *p, const clattn_tensors *layouts,
                        const clattn_tensors *bound, int expect_fused)
{
    clattn_mha_desc desc;
    pb_mha_desc(p, &desc);
    CLATTN_BIND_ROLES(desc, *layouts);
    run_plan_desc(p, &desc, bound, expect_fused);
}

/* Runs an MHA plan of `desc` on bound, checks it against p's reference. */
static void run_plan_desc(const pb_mha_problem *p, const clattn_mha_desc *desc_in,
                          const clattn_tensors *bound, int expect_fused)
{
    const clattn_mha_desc desc = *desc_in;
    clattn_plan *plan = NULL;
    clattn_status status = clattn_mha_plan_create(tu_ctx(), &desc, &plan);
    if (!tu_expect_status(status, CLATTN_SUCCESS, "clattn_mha_plan_create")) {
        return;
    }
    tu_expect(!clattn_plan_is_fused(plan) == !expect_fused, "the plan is %s, expected %s",
              clattn_plan_is_fused(plan) ? "fused" : "unfused", expect_fused ? "fused" : "unfused");
    cl_event done = NULL;
    status =
        clattn_plan_execute(plan, bound->by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, &done);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_plan_execute") &&
        tu_expect(done != NULL, "clattn_plan_execute returned no event")) {
        tu_expect(clWaitForEvents(1, &done) == CL_SUCCESS, "clWaitForEvents failed");
        pb_mha_check(tu_ctx(), NULL, p, bound);
    }
    if (done != NULL) {
        clReleaseEvent(done);
    }
    clattn_plan_release(plan);
}

/* Inputs that share storage in some places but not others, each against the float64 reference
 * with explicit arrays:
 *   - host API, key given and value NULL: the value is the key (as the header says);
 *   - host API, key is the query pointer but value differs: not self-attention, so the packed
 *     (B, L, 3E) projection must not be taken;
 *   - device plan, query and key the same tensor, value another: likewise;
 *   - device plan, key and value one tensor (cross-attention), the ordinary case.
 * _i: 0 PyTorch's packed in_proj weights, 1 separate q/k/v weights (X·W layout). */
START_TEST(test_mha_shared_inputs)
{
    TU_BEGIN_TEST();
    const int packed = _i == 0;
    pb_mha_spec spec;
    pb_mha_spec_init(&spec);
    spec.batch = 2, spec.seq_q = spec.seq_k = 13, spec.embed_dim = 24, spec.num_heads = 3;
    spec.layout = packed ? TORCH : XW;
    spec.form = packed ? PK_CROSS : SEP_CROSS;
    spec.in_biases = spec.out_proj = spec.out_bias = 1;
    spec.need_weights = PER_HEAD;
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    const size_t count = p.query_count;
    const float *query = p.query, *other = p.key;

    /* want 0: (query, other, other); want 1: (query, query, other). */
    const char *host_names[2] = {"host: key given, value NULL", "host: key = query, value differs"};
    const float *host_keys[2] = {other, query}, *host_values[2] = {NULL, other};
    for (int v = 0; v < 2; ++v) {
        tu_set_case("%s: %s", host_names[v], p.label);
        reference_for(&p, query, host_keys[v], other);
        float *out = tu_nan_floats(count), *attn = tu_nan_floats(p.attn_count);
        clattn_status status = clattn_mha_forward_host(
            tu_ctx(), &p.desc, &p.weights, query, host_keys[v], host_values[v], NULL, out, attn);
        if (tu_expect_status(status, CLATTN_SUCCESS, host_names[v])) {
            pb_mha_check_host(&p, out, attn);
        }
        free(attn);
        free(out);
    }

    /* Device plans: the inputs in one buffer at poison-separated offsets. */
    const char *device_names[2] = {"device: key = value tensor", "device: query = key tensor"};
    const size_t query_at = 3, other_at = count + 5;
    clattn_tensor inputs = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, 2 * count + 8, 0, 0, 0);
    float *values = tu_nan_floats(2 * count + 8);
    memcpy(values + query_at, query, count * sizeof(float));
    memcpy(values + other_at, other, count * sizeof(float));
    pb_upload(tu_ctx(), &inputs, 0, values);
    free(values);
    for (int v = 0; v < 2 && inputs.mem != NULL; ++v) {
        tu_set_case("%s: %s", device_names[v], p.label);
        reference_for(&p, query, v == 0 ? other : query, other);
        clattn_tensors bound;
        if (upload_without_inputs(&p, &bound) != CL_SUCCESS) {
            break;
        }
        clattn_tensor q_t = p.layouts.q, o_t = p.layouts.q;
        q_t.mem = o_t.mem = inputs.mem;
        q_t.offset = query_at;
        o_t.offset = other_at;
        bound.q = q_t;
        bound.k = v == 0 ? o_t : q_t;
        bound.v = o_t;
        run_plan_on(&p, &p.layouts, &bound, 0);
        bound.q.mem = bound.k.mem = bound.v.mem = NULL;
        pb_release_tensors(&bound);
    }
    tu_release_mem(inputs.mem);
    pb_mha_free(&p);
    TU_END_TEST();
}
END_TEST

/* Strided views of the inputs and output, no copies:
 *   0: self-attention, one buffer for query, key and value whose rows are 3E apart (the packed
 *      QKV projection reads a strided view);
 *   1: cross-attention with gaps after every row of query, key, value and out (unfused, with
 *      weights);
 *   2: query, key and value three views (offsets 0, E, 2E, row stride 3E) of one (B, L, 3E)
 *      buffer, separate X·W weights (fused);
 *   3: the same with PyTorch's packed in_proj and per-head weights: the views differ, so it
 *      is not the packed self-attention projection. */
START_TEST(test_mha_strided_inputs)
{
    TU_BEGIN_TEST();
    pb_mha_spec spec;
    pb_mha_spec_init(&spec);
    spec.batch = 2, spec.seq_q = 11, spec.seq_k = 11, spec.embed_dim = 24, spec.num_heads = 4;
    spec.in_biases = spec.out_proj = spec.out_bias = 1;
    spec.causal = CLATTN_CAUSAL_TOP_LEFT;
    spec.padding = 1;
    if (_i == 0) {
        spec.form = PK_SELF;
        spec.query_row_gap = 2 * spec.embed_dim;
        spec.mask = PB_MASK_FLOAT;
    } else if (_i == 1) {
        spec.form = SEP_CROSS, spec.layout = TORCH;
        spec.seq_k = 17, spec.kdim = 10, spec.vdim = 13;
        spec.query_row_gap = 3, spec.key_row_gap = 1, spec.value_row_gap = 7;
        spec.out_row_gap = 5;
        spec.need_weights = PER_HEAD;
        spec.mask = PB_MASK_BOOL;
    } else {
        spec.form = _i == 2 ? SEP_CROSS : PK_CROSS;
        spec.layout = _i == 2 ? XW : TORCH;
        spec.need_weights = _i == 2 ? NONE : PER_HEAD;
        spec.path = _i == 2 ? FUSED : AUTO;
    }
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    tu_set_case("strided %d: %s", _i, p.label);
    if (_i < 2) {
        pb_mha_run(tu_ctx(), &p, NULL);
        run_host_unless_reduced(&p, 0);
        pb_mha_free(&p);
        TU_END_TEST();
        return;
    }
    /* One (B, L, 3E) buffer: query | key | value in each row. */
    const size_t b = spec.batch, l = spec.seq_q, e = spec.embed_dim;
    float *rows = tu_floats(b * l * 3 * e);
    for (size_t r = 0; r < b * l; ++r) {
        memcpy(rows + r * 3 * e, p.query + r * e, e * sizeof(float));
        memcpy(rows + r * 3 * e + e, p.key + r * e, e * sizeof(float));
        memcpy(rows + r * 3 * e + 2 * e, p.value + r * e, e * sizeof(float));
    }
    clattn_tensor packed = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, b, l, 3 * e, 0);
    pb_upload(tu_ctx(), &packed, 2, rows);
    free(rows);
    clattn_tensors bound;
    if (packed.mem != NULL && upload_without_inputs(&p, &bound) == CL_SUCCESS) {
        clattn_tensors layouts = p.layouts;
        clattn_tensor *views[3] = {&layouts.q, &layouts.k, &layouts.v};
        clattn_tensor *bound_views[3] = {&bound.q, &bound.k, &bound.v};
        for (int part = 0; part < 3; ++part) {
            clattn_tensor view = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, b, l, e, 0);
            view.strides[0] = l * 3 * e, view.strides[1] = 3 * e, view.strides[2] = 1;
            *views[part] = view;
            view.mem = packed.mem;
            view.offset = packed.offset + (size_t)part * e;
            *bound_views[part] = view;
        }
        run_plan_on(&p, &layouts, &bound, _i == 2);
        bound.q.mem = bound.k.mem = bound.v.mem = NULL;
        pb_release_tensors(&bound);
    }
    tu_release_mem(packed.mem);
    pb_mha_free(&p);
    TU_END_TEST();
}
END_TEST

/* F16 and BF16 storage of query, key, value and out (separate weights, cross-attention; and
 * the packed self-attention projection reading F16), on the fused and the unfused path, against
 * the reference of the rounded inputs. _i: dtype (F16, BF16) x path (fused, unfused with
 * averaged weights) x form. */
START_TEST(test_mha_half_storage)
{
    TU_BEGIN_TEST();
    const clattn_dtype dtype = _i % 2 ? CLATTN_DTYPE_BF16 : CLATTN_DTYPE_F16;
    const int fused = (_i / 2) % 2 == 0;
    const int self = _i / 4;
    pb_mha_spec spec;
    pb_mha_spec_init(&spec);
    spec.batch = 2, spec.seq_q = 9, spec.seq_k = self ? 9 : 14, spec.embed_dim = 24;
    spec.num_heads = 3;
    spec.form = self ? PK_SELF : SEP_CROSS;
    spec.layout = self ? TORCH : XW;
    spec.kdim = self ? 0 : 10, spec.vdim = self ? 0 : 18;
    spec.in_biases = spec.out_proj = spec.out_bias = 1;
    spec.need_weights = fused ? NONE : AVERAGED;
    spec.path = fused ? FUSED : UNFUSED;
    spec.causal = self ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
    spec.mask = PB_MASK_FLOAT;
    spec.padding = 1;
    spec.query_dtype = spec.key_dtype = spec.value_dtype = spec.out_dtype = dtype;
    spec.key_dtype = self ? dtype : CLATTN_DTYPE_F32; /* mixed storage too */
    spec.out_row_gap = 3;
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    run_device(&p, 1);
    run_host_unless_reduced(&p, 0);
    pb_mha_free(&p);
    TU_END_TEST();
}
END_TEST

/* Bottom-right causal alignment with seq_q != seq_k (the queries are the last rows of a longer
 * sequence), on both paths, through the plan and the host API; seq_q > seq_k leaves the first
 * queries with no key (all-zero weights, never NaN). */
START_TEST(test_mha_bottom_right_causal)
{
    TU_BEGIN_TEST();
    static const size_t seq_q[] = {5, 19, 1, 13};
    static const size_t seq_k[] = {17, 7, 9, 13};
    pb_mha_spec spec;
    pb_mha_spec_init(&spec);
    spec.batch = 2, spec.embed_dim = 16, spec.num_heads = 2;
    spec.seq_q = seq_q[_i / 2], spec.seq_k = seq_k[_i / 2];
    spec.form = spec.seq_q == spec.seq_k ? PK_SELF : PK_CROSS;
    spec.layout = TORCH;
    spec.in_biases = spec.out_proj = spec.out_bias = 1;
    spec.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    spec.need_weights = _i % 2 ? PER_HEAD : NONE;
    spec.path = _i % 2 ? UNFUSED : FUSED;
    spec.mask = _i == 2 ? PB_MASK_BOOL : PB_MASK_NONE;
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    run_device(&p, 1);
    run_host_unless_reduced(&p, 0);
    pb_mha_free(&p);
    TU_END_TEST();
}
END_TEST

/* --- rank-4 broadcast masks ------------------------------------------------------------------ */

/* x (rows, d_in) projected by a weight stored as `torch` says, plus bias: rounded to float as
 * the device keeps projections. */
static float *project(const float *x, size_t rows, size_t d_in, const float *w, const float *bias,
                      size_t d_out, int torch)
{
    ref_matmul_shape shape;
    memset(&shape, 0, sizeof shape);
    shape.m = rows, shape.n = d_out, shape.k = d_in;
    shape.trans_b = torch;
    shape.alpha = 1.0f;
    double *y = tu_doubles(rows * d_out);
    ref_matmul(&shape, x, w, bias, y);
    float *out = tu_floats(rows * d_out);
    for (size_t i = 0; i < rows * d_out; ++i) {
        out[i] = (float)y[i];
    }
    free(y);
    return out;
}

/* (batch, seq, heads * d) -> packed (batch, heads, seq, d). */
static float *split_heads(const float *x, size_t batch, size_t seq, size_t heads, size_t d)
{
    float *out = tu_floats(batch * heads * seq * d);
    for (size_t b = 0; b < batch; ++b) {
        for (size_t h = 0; h < heads; ++h) {
            for (size_t i = 0; i < seq; ++i) {
                memcpy(out + ((b * heads + h) * seq + i) * d, x + (b * seq + i) * heads * d + h * d,
                       d * sizeof(float));
            }
        }
    }
    return out;
}

/* The MHA reference with an expanded (B, H, Lq, Lk) additive mask (per head, which
 * ref_mha_forward's (Lq, Lk) mask cannot say) and the score rules of `rules` (softcap, the
 * window, the ALiBi slopes; NULL: none): projections, ref_sdpa per head, concatenation,
 * output projection. Fills p->out_ref and p->attn_ref. */
static void reference_with_rules(pb_mha_problem *p, const float *mask, const ref_sdpa_shape *rules)
{
    const pb_mha_spec *s = &p->spec;
    const size_t b = s->batch, lq = s->seq_q, lk = s->seq_k, h = s->num_heads;
    const size_t qk = s->qk_dim, vd = s->v_dim, dk = qk / h, dv = vd / h, e = s->embed_dim;
    const int torch = s->layout == TORCH;
    const clattn_mha_host_weights *w = &p->weights;
    const float *wq = w->q_weight, *wk = w->k_weight, *wv = w->v_weight;
    const float *bq = w->q_bias, *bk = w->k_bias, *bv = w->v_bias;
    if (w->in_proj_weight != NULL) {
        wq = w->in_proj_weight, wk = wq + e * e, wv = wq + 2 * e * e;
        bq = w->in_proj_bias, bk = bq ? bq + e : NULL, bv = bq ? bq + 2 * e : NULL;
    }
    const float *key = p->key ? p->key : p->query, *value = p->value ? p->value : key;
    float *q = project(p->query, b * lq, e, wq, bq, qk, torch);
    float *k = project(key, b * lk, s->kdim, wk, bk, qk, torch);
    float *v = project(value, b * lk, s->vdim, wv, bv, vd, torch);
    float *qh = split_heads(q, b, lq, h, dk), *kh = split_heads(k, b, lk, h, dk);
    float *vh = split_heads(v, b, lk, h, dv);
    ref_sdpa_shape shape = ref_softmax_shape(b, h, lq, lk, dk, dv);
    shape.scale = ref_resolve_scale(s->scale, dk), shape.norm = s->norm, shape.causal = s->causal;
    ref_sdpa_shape ruled = shape;
    if (rules != NULL) {
        ruled.softcap = rules->softcap;
        ruled.window_align = rules->window_align;
        ruled.window_left = rules->window_left;
        ruled.window_right = rules->window_right;
        ruled.alibi = rules->alibi;
        ruled.sinks = rules->sinks;
    }
    double *heads_out = tu_doubles(b * h * lq * dv), *weights = tu_doubles(b * h * lq * lk);
    ref_sdpa(&ruled, qh, kh, vh, mask, p->padding, heads_out, weights, NULL);
    float *concat = tu_floats(b * lq * vd);
    for (size_t bi = 0; bi < b; ++bi) {
        for (size_t hi = 0; hi < h; ++hi) {
            for (size_t i = 0; i < lq; ++i) {
                for (size_t d = 0; d < dv; ++d) {
                    concat[(bi * lq + i) * vd + hi * dv + d] =
                        (float)heads_out[((bi * h + hi) * lq + i) * dv + d];
                }
            }
        }
    }
    if (w->out_weight != NULL) {
        float *out = project(concat, b * lq, vd, w->out_weight, w->out_bias, e, torch);
        tu_floats_to_doubles(out, b * lq * e, p->out_ref);
        free(out);
    } else {
        tu_floats_to_doubles(concat, b * lq * vd, p->out_ref);
    }
    if (s->need_weights == PER_HEAD) {
        memcpy(p->attn_ref, weights, b * h * lq * lk * sizeof(double));
    } else if (s->need_weights == AVERAGED) {
        for (size_t bi = 0; bi < b; ++bi) {
            for (size_t i = 0; i < lq * lk; ++i) {
                double sum = 0.0;
                for (size_t hi = 0; hi < h; ++hi) {
                    sum += weights[(bi * h + hi) * lq * lk + i];
                }
                p->attn_ref[bi * lq * lk + i] = sum / (double)h;
            }
        }
    }
    free(concat);
    free(weights);
    free(heads_out);
    free(vh);
    free(kh);
    free(qh);
    free(v);
    free(k);
    free(q);
}

static void reference_with_head_mask(pb_mha_problem *p, const float *mask)
{
    reference_with_rules(p, mask, NULL);
}

/* A rank-4 attn_mask broadcast to (B, H, Lq, Lk): dims of 1 (or stride 0) where it repeats.
 * Masks come from the shared SDPA mask generator (problems.h). The first row, (1, 1, Lq, Lk),
 * also checks this test's own per-head reference against ref_mha_forward. */
typedef struct mask4_case {
    unsigned ones; /* PB_MASK_ONES_* */
    int zero_strides;
    pb_mask_kind kind;
    clattn_dtype dtype;
    clattn_need_weights need_weights;
    clattn_path path;
    pb_mha_form form;
} mask4_case;

#define ONE_B PB_MASK_ONES_B
#define ONE_H PB_MASK_ONES_H
#define ONE_LQ PB_MASK_ONES_LQ
#define ONE_LK PB_MASK_ONES_LK
#define DT_F32 CLATTN_DTYPE_F32
#define DT_F16 CLATTN_DTYPE_F16
#define DT_BF16 CLATTN_DTYPE_BF16
#define DT_U8 CLATTN_DTYPE_U8

/* clang-format off */
static const mask4_case mask4_cases[] = {
    {ONE_B | ONE_H, 0, PB_MASK_FLOAT, DT_F32, PER_HEAD, UNFUSED, SEP_CROSS},
    {0, 0, PB_MASK_FLOAT, DT_F32, NONE, FUSED, SEP_CROSS},
    {ONE_B | ONE_LQ, 0, PB_MASK_BOOL, DT_U8, PER_HEAD, AUTO, PK_SELF},
    {ONE_H, 1, PB_MASK_FLOAT, DT_F16, AVERAGED, AUTO, PK_CROSS},
    {ONE_B, 1, PB_MASK_BOOL, DT_U8, NONE, AUTO, SEP_SELF},
    {ONE_LK, 0, PB_MASK_FLOAT, DT_BF16, NONE, FUSED, PK_SELF},
};
/* clang-format on */

START_TEST(test_mha_rank4_mask)
{
    TU_BEGIN_TEST();
    const mask4_case *mc = &mask4_cases[_i];
    pb_mha_spec spec;
    pb_mha_spec_init(&spec);
    spec.batch = 2, spec.seq_q = 7, spec.seq_k = 10, spec.embed_dim = 24, spec.num_heads = 3;
    spec.form = mc->form;
    spec.layout = mc->form == SEP_CROSS ? XW : TORCH;
    if (mc->form == SEP_CROSS) {
        spec.kdim = 11, spec.vdim = 5;
    }
    spec.in_biases = spec.out_proj = spec.out_bias = 1;
    spec.need_weights = mc->need_weights;
    spec.path = mc->path;
    spec.padding = 1;
    spec.causal = _i % 2 ? CLATTN_CAUSAL_BOTTOM_RIGHT : CLATTN_CAUSAL_NONE;
    pb_mha_problem p;
    pb_mha_make(&p, &spec);

    /* The mask, from the SDPA builder on the same (B, H, Lq, Lk). */
    pb_sdpa_spec mask_spec;
    pb_sdpa_spec_init(&mask_spec);
    mask_spec.batch = p.spec.batch, mask_spec.heads = p.spec.num_heads;
    mask_spec.seq_q = p.spec.seq_q, mask_spec.seq_k = p.spec.seq_k;
    mask_spec.dk = mask_spec.dv = 1;
    mask_spec.mask = mc->kind;
    mask_spec.mask_dtype = mc->dtype;
    mask_spec.mask_rank = 4;
    mask_spec.mask_ones = mc->ones;
    mask_spec.mask_zero_strides = mc->zero_strides;
    mask_spec.skip_reference = 1;
    pb_sdpa_problem mask_problem;
    pb_sdpa_make(&mask_problem, &mask_spec);
    float *expanded = pb_expand_mask(&mask_problem);
    tu_set_case("rank-4 mask %s: %s", mask_problem.label, p.label);

    if (_i == 0) {
        /* (1, 1, Lq, Lk): the same mask as ref_mha_forward's (Lq, Lk) one. */
        const size_t plane = p.spec.seq_q * p.spec.seq_k;
        double *out_want = tu_doubles(p.out_count), *attn_want = tu_doubles(p.attn_count);
        const clattn_host_masks masks = {mask_problem.mask, p.padding, NULL};
        ref_mha_forward(&p.desc, &p.weights, p.query, p.key, p.value, &masks, out_want, attn_want);
        reference_with_head_mask(&p, expanded);
        double worst = 0.0;
        for (size_t i = 0; i < p.out_count; ++i) {
            worst = fmax(worst, fabs(out_want[i] - p.out_ref[i]));
        }
        for (size_t i = 0; i < p.attn_count; ++i) {
            worst = fmax(worst, fabs(attn_want[i] - p.attn_ref[i]));
        }
        tu_expect(worst < 1e-5,
                  "the per-head reference differs from ref_mha_forward by %g "
                  "(mask of %zu elements)",
                  worst, plane);
        free(attn_want);
        free(out_want);
    } else {
        reference_with_head_mask(&p, expanded);
    }

    clattn_tensors bound;
    if (pb_mha_upload(tu_ctx(), &p, &bound) == CL_SUCCESS) {
        clattn_tensors layouts = p.layouts;
        layouts.attn_mask = mask_problem.layouts.attn_mask;
        bound.attn_mask = mask_problem.layouts.attn_mask;
        if (pb_upload(tu_ctx(), &bound.attn_mask, 5, mask_problem.mask) == CL_SUCCESS) {
            const int fused = mc->path == FUSED || (mc->path == AUTO && mc->need_weights == NONE);
            run_plan_on(&p, &layouts, &bound, fused);
        }
        pb_release_tensors(&bound);
    }
    free(expanded);
    pb_sdpa_free(&mask_problem);
    pb_mha_free(&p);
    TU_END_TEST();
}
END_TEST

/* Soft-capping, sliding windows, ALiBi slopes and attention sinks on MHA plans
 * (clattn_mha_desc's softcap, window_align/left/right, tensors.alibi_slopes, tensors.sinks),
 * against the per-head reference with the same rules, on both paths, with causal masks, key
 * padding and Lq != Lk. */
typedef struct rules_case {
    size_t seq_q, seq_k;
    clattn_causal causal;
    float softcap;
    clattn_causal window_align;
    long long left, right;
    int alibi; /* 0 none, 1 (heads), 2 (batch, heads) */
    clattn_path path;
    clattn_need_weights need_weights;
    int sinks; /* attention sinks (heads), one of them -inf */
} rules_case;

#define TL CLATTN_CAUSAL_TOP_LEFT
#define BR CLATTN_CAUSAL_BOTTOM_RIGHT
/* clang-format off */
static const rules_case rules_cases[] = {
    /* Lq  Lk causal cap  window left right alibi path need_weights sinks */
    { 17,  17, CLATTN_CAUSAL_NONE, 1.5f, CLATTN_CAUSAL_NONE, 0,  0, 0, FUSED, NONE, 0},
    { 13,  29, BR,     0.0f, BR,     5, -1, 0, UNFUSED, PER_HEAD, 1},
    { 29,  13, CLATTN_CAUSAL_NONE, 0.0f, TL,     3,  2, 0, FUSED, NONE, 1},
    { 17,  65, CLATTN_CAUSAL_NONE, 0.0f, CLATTN_CAUSAL_NONE, 0,  0, 1, FUSED, NONE, 0},
    { 17,  65, BR,     2.0f, CLATTN_CAUSAL_NONE, 0,  0, 2, UNFUSED, AVERAGED, 0},
    { 65,  63, TL,     0.7f, TL,    17, -1, 1, AUTO, NONE, 1},
    {  1, 129, BR,     0.0f, BR,    31, -1, 2, AUTO, NONE, 1},
};
/* clang-format on */
#undef TL
#undef BR

START_TEST(test_mha_score_rules)
{
    TU_BEGIN_TEST();
    const rules_case *rc = &rules_cases[_i];
    pb_mha_spec spec;
    pb_mha_spec_init(&spec);
    spec.batch = 2, spec.seq_q = rc->seq_q, spec.seq_k = rc->seq_k;
    spec.embed_dim = 24, spec.num_heads = 3;
    spec.form = _i % 2 ? SEP_CROSS : PK_CROSS;
    spec.layout = _i % 2 ? XW : TORCH;
    spec.in_biases = spec.out_proj = spec.out_bias = 1;
    spec.need_weights = rc->need_weights;
    spec.path = rc->path;
    spec.padding = _i % 3 == 1;
    spec.causal = rc->causal;
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    const size_t b = spec.batch, h = spec.num_heads;
    float *slopes = NULL, *expanded = NULL;
    if (rc->alibi) {
        slopes = tu_floats(b * h);
        expanded = tu_floats(b * h);
        for (size_t e = 0; e < b * h; ++e)
            slopes[e] = (float)(0.05 + 0.4 * tu_rand_unit());
        for (size_t e = 0; e < b * h; ++e)
            expanded[e] = slopes[rc->alibi == 1 ? e % h : e];
    }
    ref_sdpa_shape rules;
    memset(&rules, 0, sizeof rules);
    rules.softcap = rc->softcap;
    rules.window_align = rc->window_align;
    rules.window_left = rc->left;
    rules.window_right = rc->right;
    rules.alibi = expanded;
    float *sinks = NULL;
    if (rc->sinks) {
        sinks = tu_floats(h);
        for (size_t e = 0; e < h; ++e)
            sinks[e] = (float)(-1.0 + 4.0 * tu_rand_unit());
        sinks[tu_rand_below(h)] = -INFINITY;
    }
    rules.sinks = sinks;
    reference_with_rules(&p, NULL, &rules);
    tu_set_case("MHA rules cap=%g window=%d(%lld,%lld) alibi=%d sinks=%d: %s", (double)rc->softcap,
                (int)rc->window_align, rc->left, rc->right, rc->alibi, rc->sinks, p.label);

    clattn_tensors bound;
    if (pb_mha_upload(tu_ctx(), &p, &bound) == CL_SUCCESS) {
        clattn_mha_desc desc;
        pb_mha_desc(&p, &desc);
        clattn_tensors desc_tensors = p.layouts;
        CLATTN_BIND_ROLES(desc, desc_tensors);
        desc.softcap = rc->softcap;
        desc.window_align = rc->window_align;
        desc.window_left = rc->left;
        desc.window_right = rc->right;
        cl_int err = CL_SUCCESS;
        if (rc->alibi) {
            const size_t dims[2] = {b, h};
            pb_make_layout(&desc_tensors.alibi_slopes, CLATTN_DTYPE_F32, rc->alibi == 1 ? 1 : 2,
                           rc->alibi == 1 ? dims + 1 : dims, PB_PACKED);
            bound.alibi_slopes = desc_tensors.alibi_slopes;
            err = pb_upload(tu_ctx(), &bound.alibi_slopes, 3, slopes);
        }
        if (rc->sinks && err == CL_SUCCESS) {
            const size_t dims[1] = {h};
            pb_make_layout(&desc_tensors.sinks, CLATTN_DTYPE_F32, 1, dims, PB_PADDED);
            bound.sinks = desc_tensors.sinks;
            err = pb_upload(tu_ctx(), &bound.sinks, 5, sinks);
        }
        if (tu_expect(err == CL_SUCCESS, "upload of the slopes failed (%d)", (int)err)) {
            const int fused = rc->path == FUSED || (rc->path == AUTO && rc->need_weights == NONE);
            run_plan_desc(&p, &desc, &bound, fused);
        }
        pb_release_tensors(&bound);
    }
    free(sinks);
    free(expanded);
    free(slopes);
    pb_mha_free(&p);
    TU_END_TEST();
}
END_TEST

/* --- workspace: heads are views ------------------------------------------------------------ */

/* A fused MHA plan's workspace is the projections alone: q, k, v (one (B, L, 3E) region for
 * packed self-attention) and the concatenated heads when an output projection follows; no
 * head-split or concat buffers. On CPUs a matmul may add one packed weight (its scratch: op(W)
 * with its output features rounded up to whole panels of at most 128 columns). The plan then
 * runs and is checked. */
START_TEST(test_mha_workspace_is_projections)
{
    TU_BEGIN_TEST();
    /* clang-format off */
    static const mha_case cases[] = {
        {2, 13, 21, 24, 4, 10, 14, 16, 20, XW, SEP_CROSS, 1, 1, 1, NONE, AUTO, 1, 1, 1, DEF, SMAX},
        {3, 9, 9, 24, 3, 0, 0, 0, 12, XW, SEP_SELF, 0, 0, 0, NONE, FUSED, 0, 0, 0, DEF, SMAX},
        {2, 17, 17, 32, 4, 0, 0, 0, 0, TORCH, PK_SELF, 1, 1, 1, NONE, AUTO, 1, 0, 1, DEF, SMAX},
        {1, 6, 15, 16, 2, 0, 0, 0, 0, TORCH, PK_CROSS, 1, 1, 0, NONE, FUSED, 0, 2, 0, DEF, SMAX},
    };
    /* clang-format on */
    pb_mha_spec spec;
    spec_of(&cases[_i], &spec);
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    const pb_mha_spec *s = &p.spec;
    tu_set_case("%s", p.label);
    const size_t projections =
        s->batch * (s->seq_q * s->qk_dim + s->seq_k * s->qk_dim + s->seq_k * s->v_dim +
                    (s->out_proj ? s->seq_q * s->v_dim : 0));
    /* What a CPU matmul may pack into scratch: one of the weights, or for packed in_proj one
     * (E, E) slice of it, as (in, out) features either way round. */
    size_t weights[PB_PARAM_COUNT + 1][2] = {{s->embed_dim, s->embed_dim}};
    for (int i = 0; i < PB_PARAM_COUNT; ++i) {
        weights[i + 1][0] = p.param_dims[i][0];
        weights[i + 1][1] = p.param_dims[i][1];
    }
    clattn_mha_desc desc;
    pb_mha_desc(&p, &desc);
    clattn_plan *plan = NULL;
    if (tu_expect_status(clattn_mha_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                         "clattn_mha_plan_create")) {
        tu_expect(clattn_plan_is_fused(plan), "the plan is not fused");
        const size_t bytes = clattn_plan_workspace_size(plan);
        const int exact = bytes == projections * sizeof(float);
        const size_t extra = bytes / sizeof(float) > projections
                                 ? bytes / sizeof(float) - projections
                                 : 0;
        int with_pack = 0;
        for (int i = 0; i <= PB_PARAM_COUNT; ++i) {
            for (int o = 0; o < 2; ++o) {
                const size_t out = weights[i][o], in = weights[i][1 - o];
                with_pack |= bytes % sizeof(float) == 0 && in && extra % in == 0 &&
                             extra / in >= out && extra / in < out + 128;
            }
        }
        tu_expect(exact || with_pack,
                  "workspace %zu bytes, expected the projections' %zu floats (%zu bytes), or "
                  "plus one packed weight",
                  bytes, projections, projections * sizeof(float));
    }
    clattn_plan_release(plan);
    const pb_run_options options = {.caller_workspace = 1};
    pb_mha_run(tu_ctx(), &p, &options);
    pb_mha_free(&p);
    TU_END_TEST();
}
END_TEST

static Suite *mha_suite(void)
{
    Suite *suite = suite_create("mha");
    TCase *forward = tu_tcase(suite, "forward", 600);
    /* A reduced run (CLATTN_TEST_SCALE=small, for Oclgrind) leaves out what takes minutes
     * there with GPU parameters; every projection form, layout, need_weights mode, path, mask,
     * head count 1..16 and normalisation still runs in the other mha_cases. */
    static const int heavy_cases[] = {2, 3, 5, 10};
    static const int shared_skip[] = {1};
    static const int half_skip[] = {1, 2, 4, 7};
    static const int bottom_right_skip[] = {4, 5, 6, 7};
    static const int gqa_skip[] = {3, 6};
    const int small = tu_small();
    reduced = small;
    if (small)
        tu_not_run("test_mha_cases 2, 3, 5, 10 (averaged weights over 4 or 8 heads at E=32..64), "
                   "test_mha_heads_and_batches, test_mha_random, "
                   "test_mha_host_workspace_reuse, test_mha_shared_inputs 1 (separate weights), "
                   "test_mha_half_storage 1, 2, 4, 7 (F16 and BF16 still run on both paths and "
                   "forms), test_mha_bottom_right_causal 4..7 (Lq = 1, Lq = Lk), "
                   "test_mha_workspace_is_projections 1, 3, test_mha_grouped_query 3, 6 (65 and 129 "
                   "queries; grouped heads still run on both paths and layouts), and the host "
                   "API's second run of "
                   "problems a plan ran (the same kernels): minutes on Oclgrind");
    tu_add_loop_except(forward, test_mha_cases, 0, COUNT_OF(mha_cases), heavy_cases,
                       small ? COUNT_OF(heavy_cases) : 0);
    tcase_add_loop_test(forward, test_mha_need_weights_modes, 0, 3);
    tu_add_loop_except(forward, test_mha_grouped_query, 0, COUNT_OF(gqa_cases), gqa_skip,
                       small ? COUNT_OF(gqa_skip) : 0);
    if (!small) {
        tcase_add_loop_test(forward, test_mha_heads_and_batches, 0, 10);
        tcase_add_loop_test(forward, test_mha_random, 0, 24);
    }
    tu_add_loop_except(forward, test_mha_shared_inputs, 0, 2, shared_skip,
                       small ? COUNT_OF(shared_skip) : 0);
    tcase_add_loop_test(forward, test_mha_strided_inputs, 0, 4);
    tu_add_loop_except(forward, test_mha_half_storage, 0, 8, half_skip,
                       small ? COUNT_OF(half_skip) : 0);
    tu_add_loop_except(forward, test_mha_bottom_right_causal, 0, 8, bottom_right_skip,
                       small ? COUNT_OF(bottom_right_skip) : 0);
    tcase_add_loop_test(forward, test_mha_rank4_mask, 0, COUNT_OF(mask4_cases));
    tcase_add_loop_test(forward, test_mha_score_rules, 0, COUNT_OF(rules_cases));
    tcase_add_loop_test(forward, test_mha_rope, 0, COUNT_OF(rope_mha_cases));

    TCase *workspace = tu_tcase(suite, "workspace", 600);
    if (!small)
        tcase_add_test(workspace, test_mha_host_workspace_reuse);
    tcase_add_test(workspace, test_mha_host_masks_only_from_argument);
    static const int workspace_skip[] = {1, 3};
    tu_add_loop_except(workspace, test_mha_workspace_is_projections, 0, 4, workspace_skip,
                       small ? COUNT_OF(workspace_skip) : 0);
    return suite;
}

int main(void)
{
    return tu_main("check_mha", mha_suite);
}
