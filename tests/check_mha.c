/*
 * check_mha: multi-head attention forward through clattn_mha_forward (device buffers made here)
 * and clattn_mha_forward_host, against the float64 reference: both weight layouts, PyTorch's
 * packed in_proj for self- and cross-attention, separate q/k/v weights with kdim/vdim != E,
 * optional biases and output projection, qk_dim != v_dim, heads 1..16, need_weights, masks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "testutil.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

enum projection_form {
    PACKED_SELF,  /* in_proj_weight, query = key = value */
    PACKED_CROSS, /* in_proj_weight, key and value differ from query */
    SEPARATE_SELF,
    SEPARATE_CROSS
};

typedef struct mha_case {
    size_t batch, seq_q, seq_k, embed_dim, num_heads;
    size_t kdim, vdim, qk_dim, v_dim; /* 0: embed_dim */
    clattn_weight_layout layout;
    enum projection_form form;
    int in_biases, out_proj, out_bias;
    clattn_need_weights need_weights;
    int causal, use_attn_mask, use_padding;
    float scale;
    clattn_norm norm;
} mha_case;

#define XW CLATTN_LAYOUT_XW
#define TORCH CLATTN_LAYOUT_TORCH
#define NONE CLATTN_WEIGHTS_NONE
#define PER_HEAD CLATTN_WEIGHTS_PER_HEAD
#define AVERAGED CLATTN_WEIGHTS_AVERAGED
#define SOFTMAX CLATTN_NORM_SOFTMAX
#define RELU CLATTN_NORM_RELU

/* clang-format off */
static const mha_case mha_cases[] = {
    /* PyTorch packed in_proj, self-attention, heads 1, 2, 4, 8, 16 */
    {1, 5, 5, 16, 1, 0, 0, 0, 0, TORCH, PACKED_SELF, 1, 1, 1, NONE, 0, 0, 0, 0, SOFTMAX},
    {2, 17, 17, 32, 2, 0, 0, 0, 0, TORCH, PACKED_SELF, 1, 1, 1, PER_HEAD, 1, 0, 0, 0, SOFTMAX},
    {3, 9, 9, 32, 4, 0, 0, 0, 0, TORCH, PACKED_SELF, 0, 1, 0, AVERAGED, 0, 0, 1, 0, SOFTMAX},
    {2, 7, 7, 64, 8, 0, 0, 0, 0, TORCH, PACKED_SELF, 1, 1, 1, AVERAGED, 0, 1, 0, 0, SOFTMAX},
    {1, 3, 3, 16, 16, 0, 0, 0, 0, TORCH, PACKED_SELF, 1, 1, 1, PER_HEAD, 0, 0, 0, 0, SOFTMAX},
    {2, 65, 65, 64, 8, 0, 0, 0, 0, TORCH, PACKED_SELF, 1, 1, 1, AVERAGED, 1, 1, 1, 0, SOFTMAX},
    /* packed in_proj, cross-attention (key/value differ from query, seq_q != seq_k) */
    {2, 5, 13, 32, 4, 0, 0, 0, 0, TORCH, PACKED_CROSS, 1, 1, 1, AVERAGED, 0, 1, 1, 0, SOFTMAX},
    {3, 17, 3, 16, 2, 0, 0, 0, 0, TORCH, PACKED_CROSS, 0, 1, 1, NONE, 1, 0, 0, 0, SOFTMAX},
    /* separate q/k/v weights, kdim/vdim != E */
    {2, 6, 11, 32, 4, 20, 12, 0, 0, TORCH, SEPARATE_CROSS, 1, 1, 1, PER_HEAD, 0, 0, 0, 0, SOFTMAX},
    {1, 4, 9, 16, 8, 7, 33, 0, 0, TORCH, SEPARATE_CROSS, 0, 1, 0, AVERAGED, 0, 0, 1, 0, SOFTMAX},
    {2, 9, 9, 16, 8, 0, 0, 0, 0, TORCH, SEPARATE_SELF, 0, 0, 0, AVERAGED, 1, 0, 0, 0, SOFTMAX},
    /* textbook XW layout */
    {2, 9, 9, 32, 4, 0, 0, 0, 0, XW, SEPARATE_SELF, 1, 1, 1, PER_HEAD, 0, 0, 0, 0, SOFTMAX},
    {1, 5, 8, 24, 2, 10, 14, 0, 0, XW, SEPARATE_CROSS, 0, 0, 0, NONE, 0, 1, 0, 0, SOFTMAX},
    {3, 7, 7, 16, 1, 0, 0, 0, 0, XW, SEPARATE_SELF, 1, 1, 0, AVERAGED, 1, 0, 0, 0, SOFTMAX},
    /* qk_dim != v_dim: single head without output projection (the textbook form), and more */
    {1, 5, 7, 8, 1, 0, 0, 6, 10, XW, SEPARATE_CROSS, 0, 0, 0, PER_HEAD, 0, 0, 0, 0.0f, SOFTMAX},
    {1, 3, 3, 4, 1, 0, 0, 3, 5, XW, SEPARATE_SELF, 0, 0, 0, PER_HEAD, 0, 0, 0, 0.5f, SOFTMAX},
    {3, 6, 10, 16, 4, 9, 11, 12, 20, XW, SEPARATE_CROSS, 1, 1, 1, AVERAGED, 0, 1, 1, 0, SOFTMAX},
    {2, 8, 8, 12, 2, 0, 0, 6, 14, XW, SEPARATE_SELF, 1, 0, 0, PER_HEAD, 1, 0, 0, 0, SOFTMAX},
    /* relu normalisation, explicit scales, tiny shapes */
    {2, 9, 9, 16, 2, 0, 0, 0, 0, XW, SEPARATE_SELF, 1, 1, 1, PER_HEAD, 1, 0, 0, 0, RELU},
    {2, 4, 6, 32, 4, 0, 0, 0, 0, TORCH, PACKED_CROSS, 1, 1, 1, AVERAGED, 0, 0, 1, 0.2f, RELU},
    {1, 1, 1, 8, 2, 0, 0, 0, 0, TORCH, PACKED_SELF, 1, 1, 1, PER_HEAD, 0, 0, 0, 0, SOFTMAX},
    {3, 1, 5, 8, 4, 0, 0, 0, 0, XW, SEPARATE_CROSS, 1, 1, 1, AVERAGED, 1, 1, 1, 0.9f, SOFTMAX},
};
/* clang-format on */

static int is_packed(const mha_case *mc)
{
    return mc->form == PACKED_SELF || mc->form == PACKED_CROSS;
}

static int is_self(const mha_case *mc)
{
    return mc->form == PACKED_SELF || mc->form == SEPARATE_SELF;
}

static clattn_mha_desc desc_of(const mha_case *mc)
{
    clattn_mha_desc desc = {
        .batch = mc->batch,
        .seq_q = mc->seq_q,
        .seq_k = mc->seq_k,
        .embed_dim = mc->embed_dim,
        .num_heads = mc->num_heads,
        .kdim = mc->kdim,
        .vdim = mc->vdim,
        .qk_dim = mc->qk_dim,
        .v_dim = mc->v_dim,
        .layout = mc->layout,
        .scale = mc->scale,
        .norm = mc->norm,
        .need_weights = mc->need_weights,
    };
    return desc;
}

static void describe(const char *api, const mha_case *mc)
{
    static const char *const forms[] = {"packed_self", "packed_cross", "separate_self",
                                        "separate_cross"};
    tu_set_case("%s batch=%zu seq_q=%zu seq_k=%zu E=%zu H=%zu kdim=%zu vdim=%zu qk_dim=%zu "
                "v_dim=%zu layout=%s form=%s in_biases=%d out_proj=%d out_bias=%d "
                "need_weights=%d causal=%d attn_mask=%d padding=%d scale=%g norm=%s",
                api, mc->batch, mc->seq_q, mc->seq_k, mc->embed_dim, mc->num_heads, mc->kdim,
                mc->vdim, mc->qk_dim, mc->v_dim, mc->layout == XW ? "xw" : "torch", forms[mc->form],
                mc->in_biases, mc->out_proj, mc->out_bias, (int)mc->need_weights, mc->causal,
                mc->use_attn_mask, mc->use_padding, (double)mc->scale,
                mc->norm == RELU ? "relu" : "softmax");
}

/* All host-side data of a case: weights packed in one arena (each tensor at its own offset,
 * NaN between them), inputs, masks and the reference outputs. */
enum weight_slot {
    SLOT_IN_PROJ,
    SLOT_IN_BIAS,
    SLOT_Q,
    SLOT_K,
    SLOT_V,
    SLOT_Q_BIAS,
    SLOT_K_BIAS,
    SLOT_V_BIAS,
    SLOT_OUT,
    SLOT_OUT_BIAS,
    SLOT_COUNT
};

typedef struct mha_data {
    float *arena;
    size_t arena_size;
    size_t offsets[SLOT_COUNT];
    size_t counts[SLOT_COUNT];
    float *query, *key, *value; /* key, value point at query for self-attention */
    size_t query_count, key_count, value_count;
    float *attn_mask;
    uint8_t *padding;
    double *out_ref, *weights_ref;
    size_t out_count, weights_count;
} mha_data;

/* Reserves `count` floats of the arena for a slot (count 0: the slot stays absent). */
static void reserve(mha_data *data, enum weight_slot slot, size_t count)
{
    data->counts[slot] = count;
    if (count == 0) {
        return;
    }
    data->arena_size += 1 + tu_rand_below(5); /* a NaN gap before each tensor */
    data->offsets[slot] = data->arena_size;
    data->arena_size += count;
}

static const float *slot_host(const mha_data *data, enum weight_slot slot)
{
    return data->counts[slot] ? data->arena + data->offsets[slot] : NULL;
}

static float *random_scaled(size_t count, float scale)
{
    float *values = tu_random_floats(count);
    for (size_t i = 0; i < count; ++i) {
        values[i] *= scale;
    }
    return values;
}

static clattn_mha_host_weights host_weights_of(const mha_data *data)
{
    clattn_mha_host_weights weights = {
        .in_proj_weight = slot_host(data, SLOT_IN_PROJ),
        .in_proj_bias = slot_host(data, SLOT_IN_BIAS),
        .q_weight = slot_host(data, SLOT_Q),
        .k_weight = slot_host(data, SLOT_K),
        .v_weight = slot_host(data, SLOT_V),
        .q_bias = slot_host(data, SLOT_Q_BIAS),
        .k_bias = slot_host(data, SLOT_K_BIAS),
        .v_bias = slot_host(data, SLOT_V_BIAS),
        .out_weight = slot_host(data, SLOT_OUT),
        .out_bias = slot_host(data, SLOT_OUT_BIAS),
    };
    return weights;
}

static mha_data make_data(const mha_case *mc)
{
    mha_data data;
    memset(&data, 0, sizeof data);
    clattn_mha_desc desc = desc_of(mc);
    size_t embed = mc->embed_dim, kdim = ref_mha_kdim(&desc), vdim = ref_mha_vdim(&desc);
    size_t qk_dim = ref_mha_qk_dim(&desc), v_dim = ref_mha_v_dim(&desc);

    if (is_packed(mc)) {
        reserve(&data, SLOT_IN_PROJ, 3 * embed * embed);
        reserve(&data, SLOT_IN_BIAS, mc->in_biases ? 3 * embed : 0);
    } else {
        reserve(&data, SLOT_Q, embed * qk_dim);
        reserve(&data, SLOT_K, kdim * qk_dim);
        reserve(&data, SLOT_V, vdim * v_dim);
        reserve(&data, SLOT_Q_BIAS, mc->in_biases ? qk_dim : 0);
        reserve(&data, SLOT_K_BIAS, mc->in_biases ? qk_dim : 0);
        reserve(&data, SLOT_V_BIAS, mc->in_biases ? v_dim : 0);
    }
    reserve(&data, SLOT_OUT, mc->out_proj ? v_dim * embed : 0);
    reserve(&data, SLOT_OUT_BIAS, mc->out_proj && mc->out_bias ? embed : 0);
    data.arena_size += 3;
    data.arena = tu_nan_floats(data.arena_size);

    /* Weights scaled by 1/sqrt(d_in) keep every projection O(1), as nn.Linear's init does. */
    for (int slot = 0; slot < SLOT_COUNT; ++slot) {
        if (data.counts[slot] == 0) {
            continue;
        }
        size_t d_in = embed;
        if (slot == SLOT_K) {
            d_in = kdim;
        } else if (slot == SLOT_V) {
            d_in = vdim;
        } else if (slot == SLOT_OUT) {
            d_in = v_dim;
        }
        float *values = random_scaled(data.counts[slot], 1.5f / sqrtf((float)d_in));
        memcpy(data.arena + data.offsets[slot], values, data.counts[slot] * sizeof(float));
        free(values);
    }

    data.query_count = mc->batch * mc->seq_q * embed;
    data.key_count = mc->batch * mc->seq_k * kdim;
    data.value_count = mc->batch * mc->seq_k * vdim;
    data.query = tu_random_floats(data.query_count);
    data.key = is_self(mc) ? data.query : tu_random_floats(data.key_count);
    data.value = is_self(mc) ? data.query : tu_random_floats(data.value_count);

    if (mc->use_attn_mask) {
        data.attn_mask = tu_floats(mc->seq_q * mc->seq_k);
        tu_fill_uniform(data.attn_mask, mc->seq_q * mc->seq_k, -1.0f, 1.0f);
        for (size_t i = 0; i < mc->seq_q * mc->seq_k; ++i) {
            if (tu_rand_below(4) == 0) {
                data.attn_mask[i] = -INFINITY;
            }
        }
    }
    if (mc->use_padding) {
        data.padding = tu_bytes(mc->batch * mc->seq_k);
        for (size_t i = 0; i < mc->batch * mc->seq_k; ++i) {
            data.padding[i] = tu_rand_below(4) == 0;
        }
        data.padding[0] = 0; /* batch entry 0 keeps key 0 */
        if (mc->batch > 2) {
            memset(data.padding + 2 * mc->seq_k, 1, mc->seq_k); /* entry 2: a fully masked row */
        }
    }

    data.out_count = mc->batch * mc->seq_q * ref_mha_out_dim(&desc, mc->out_proj);
    data.weights_count =
        mc->batch * mc->seq_q * mc->seq_k * (mc->need_weights == PER_HEAD ? mc->num_heads : 1);
    data.out_ref = tu_doubles(data.out_count);
    data.weights_ref = tu_doubles(data.weights_count);
    clattn_mha_host_weights weights = host_weights_of(&data);
    clattn_host_masks masks = {mc->causal, data.attn_mask, data.padding};
    ref_mha_forward(&desc, &weights, data.query, is_self(mc) ? NULL : data.key,
                    is_self(mc) ? NULL : data.value, &masks, data.out_ref,
                    mc->need_weights != NONE ? data.weights_ref : NULL);
    return data;
}

static void free_data(mha_data *data)
{
    free(data->weights_ref);
    free(data->out_ref);
    free(data->padding);
    free(data->attn_mask);
    if (data->value != data->query) {
        free(data->value);
    }
    if (data->key != data->query) {
        free(data->key);
    }
    free(data->query);
    free(data->arena);
}

static clattn_tensor slot_tensor(const mha_data *data, cl_mem arena, enum weight_slot slot)
{
    return data->counts[slot] ? tu_tensor(arena, data->offsets[slot]) : tu_tensor(NULL, 0);
}

static void run_device(const mha_case *mc, const mha_data *data)
{
    describe("device", mc);
    clattn_mha_desc desc = desc_of(mc);
    size_t query_offset = tu_rand_below(7), key_offset = tu_rand_below(7);
    size_t value_offset = tu_rand_below(7), out_offset = tu_rand_below(7);
    size_t weights_offset = tu_rand_below(7);

    cl_mem arena = tu_upload_floats(data->arena, data->arena_size);
    cl_mem query_mem = tu_upload_padded(data->query, data->query_count, query_offset, 2);
    cl_mem key_mem = NULL, value_mem = NULL;
    clattn_tensor query = tu_tensor(query_mem, query_offset), key = query, value = query;
    if (!is_self(mc)) {
        key_mem = tu_upload_padded(data->key, data->key_count, key_offset, 1);
        value_mem = tu_upload_padded(data->value, data->value_count, value_offset, 0);
        key = tu_tensor(key_mem, key_offset);
        value = tu_tensor(value_mem, value_offset);
    }
    size_t out_total = out_offset + data->out_count + 2;
    size_t weights_total = weights_offset + data->weights_count + 2;
    cl_mem out_mem = tu_nan_buffer(out_total);
    cl_mem weights_mem = mc->need_weights != NONE ? tu_nan_buffer(weights_total) : NULL;
    cl_mem mask_mem = NULL, padding_mem = NULL;
    desc.masks.causal = mc->causal;
    if (data->attn_mask != NULL) {
        mask_mem = tu_upload_floats(data->attn_mask, mc->seq_q * mc->seq_k);
        desc.masks.attn_mask = tu_tensor(mask_mem, 0);
    }
    if (data->padding != NULL) {
        padding_mem = tu_upload_bytes(data->padding, mc->batch * mc->seq_k);
        desc.masks.key_padding_mask = tu_tensor(padding_mem, 0);
    }
    clattn_mha_weights weights = {
        .in_proj_weight = slot_tensor(data, arena, SLOT_IN_PROJ),
        .in_proj_bias = slot_tensor(data, arena, SLOT_IN_BIAS),
        .q_weight = slot_tensor(data, arena, SLOT_Q),
        .k_weight = slot_tensor(data, arena, SLOT_K),
        .v_weight = slot_tensor(data, arena, SLOT_V),
        .q_bias = slot_tensor(data, arena, SLOT_Q_BIAS),
        .k_bias = slot_tensor(data, arena, SLOT_K_BIAS),
        .v_bias = slot_tensor(data, arena, SLOT_V_BIAS),
        .out_weight = slot_tensor(data, arena, SLOT_OUT),
        .out_bias = slot_tensor(data, arena, SLOT_OUT_BIAS),
    };

    cl_event done = NULL;
    clattn_status status = clattn_mha_forward(
        tu_ctx(), &desc, &weights, query, key, value, tu_tensor(out_mem, out_offset),
        tu_tensor(weights_mem, weights_mem ? weights_offset : 0), 0, NULL, &done);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_mha_forward") &&
        tu_expect(done != NULL, "clattn_mha_forward returned no event")) {
        tu_expect(clWaitForEvents(1, &done) == CL_SUCCESS, "clWaitForEvents failed");
        float *out = tu_floats(out_total);
        tu_read_floats(out_mem, 0, out_total, out);
        tu_expect_finite("out", out + out_offset, data->out_count);
        tu_expect_close("out", out + out_offset, data->out_ref, data->out_count, TU_TOL);
        tu_expect_nan_outside("out", out, out_total, out_offset, data->out_count);
        free(out);
        if (weights_mem != NULL) {
            float *attn = tu_floats(weights_total);
            tu_read_floats(weights_mem, 0, weights_total, attn);
            tu_expect_close("attn_weights", attn + weights_offset, data->weights_ref,
                            data->weights_count, TU_TOL);
            tu_expect_nan_outside("attn_weights", attn, weights_total, weights_offset,
                                  data->weights_count);
            free(attn);
        }
    }
    if (done != NULL) {
        clReleaseEvent(done);
    }
    tu_release_mem(padding_mem);
    tu_release_mem(mask_mem);
    tu_release_mem(weights_mem);
    tu_release_mem(out_mem);
    tu_release_mem(value_mem);
    tu_release_mem(key_mem);
    tu_release_mem(query_mem);
    tu_release_mem(arena);
}

/* explicit_self: for self-attention, pass the query pointer as key and value instead of NULL. */
static void run_host(const mha_case *mc, const mha_data *data, int explicit_self)
{
    describe(explicit_self ? "host (key = value = query pointer)" : "host", mc);
    clattn_mha_desc desc = desc_of(mc);
    clattn_mha_host_weights weights = host_weights_of(data);
    clattn_host_masks masks = {mc->causal, data->attn_mask, data->padding};
    const float *key = data->key, *value = data->value;
    if (is_self(mc) && !explicit_self) {
        key = NULL;
        value = NULL;
    }
    float *out = tu_nan_floats(data->out_count);
    float *attn = mc->need_weights != NONE ? tu_nan_floats(data->weights_count) : NULL;
    clattn_status status = clattn_mha_forward_host(tu_ctx(), &desc, &weights, data->query, key,
                                                   value, &masks, out, attn);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_mha_forward_host")) {
        tu_expect_finite("out", out, data->out_count);
        tu_expect_close("out", out, data->out_ref, data->out_count, TU_TOL);
        if (attn != NULL) {
            tu_expect_close("attn_weights", attn, data->weights_ref, data->weights_count, TU_TOL);
        }
    }
    free(attn);
    free(out);
}

START_TEST(test_mha_cases)
{
    TU_BEGIN_TEST();
    const mha_case *mc = &mha_cases[_i];
    mha_data data = make_data(mc);
    run_device(mc, &data);
    run_host(mc, &data, 0);
    if (is_self(mc)) {
        run_host(mc, &data, 1);
    }
    free_data(&data);
    TU_END_TEST();
}
END_TEST

/* The three need_weights modes on one case: the output must not depend on the choice. */
START_TEST(test_mha_need_weights_modes)
{
    TU_BEGIN_TEST();
    static const clattn_need_weights modes[] = {NONE, PER_HEAD, AVERAGED};
    /* clang-format off */
    mha_case mc = {2, 6, 10, 32, 4, 0, 0, 0, 0, TORCH, PACKED_CROSS, 1, 1, 1, NONE, 1, 0, 1, 0,
                   SOFTMAX};
    /* clang-format on */
    mc.need_weights = modes[_i];
    mha_data data = make_data(&mc);
    run_device(&mc, &data);
    run_host(&mc, &data, 0);
    free_data(&data);
    TU_END_TEST();
}
END_TEST

/* Host API on one context with different shapes in turn (small, large, small again): workspace
 * kept in the context must be grown and reused correctly. */
START_TEST(test_mha_host_workspace_reuse)
{
    TU_BEGIN_TEST();
    /* clang-format off */
    const mha_case small = {1, 4, 4, 16, 2, 0, 0, 0, 0, TORCH, PACKED_SELF, 1, 1, 1, PER_HEAD,
                            0, 0, 0, 0, SOFTMAX};
    const mha_case large = {3, 33, 47, 64, 8, 24, 40, 0, 0, TORCH, SEPARATE_CROSS, 1, 1, 1,
                            AVERAGED, 1, 1, 1, 0, SOFTMAX};
    const mha_case other = {2, 9, 5, 12, 3, 0, 0, 6, 15, XW, SEPARATE_CROSS, 0, 0, 0, PER_HEAD,
                            0, 0, 0, 0.3f, SOFTMAX};
    /* clang-format on */
    const mha_case *sequence[] = {&small, &large, &small, &other, &large};
    for (int step = 0; step < COUNT_OF(sequence); ++step) {
        mha_data data = make_data(sequence[step]);
        run_host(sequence[step], &data, 0);
        free_data(&data);
    }
    /* Attention host calls share the context's workspace too. */
    clattn_attention_desc attention = {2, 3, 5, 9, 4, 6, 0.0f, CLATTN_NORM_SOFTMAX, {0}, CLATTN_PATH_AUTO};
    size_t q_count = 2 * 3 * 5 * 4, kv_count = 2 * 3 * 9 * 4, v_count = 2 * 3 * 9 * 6;
    size_t out_count = 2 * 3 * 5 * 6;
    float *q = tu_random_floats(q_count), *k = tu_random_floats(kv_count);
    float *v = tu_random_floats(v_count), *out = tu_nan_floats(out_count);
    double *ref = tu_doubles(out_count);
    ref_attention(&attention, NULL, q, k, v, ref, NULL);
    tu_set_case("attention host after mha host calls");
    clattn_status status = clattn_attention_host(tu_ctx(), &attention, q, k, v, NULL, out, NULL);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_attention_host")) {
        tu_expect_close("out", out, ref, out_count, TU_TOL);
    }
    free(ref);
    free(out);
    free(v);
    free(k);
    free(q);
    {
        mha_data data = make_data(&small);
        run_host(&small, &data, 0);
        free_data(&data);
    }
    TU_END_TEST();
}
END_TEST

/* The host API ignores desc->masks' cl_mem fields: tensors there (too small to be valid for
 * this shape) change nothing; the masks come from the host masks argument. */
START_TEST(test_mha_host_ignores_device_masks)
{
    TU_BEGIN_TEST();
    /* clang-format off */
    const mha_case mc = {2, 5, 7, 16, 2, 0, 0, 0, 0, TORCH, PACKED_CROSS, 1, 1, 1, PER_HEAD, 1,
                         1, 1, 0, SOFTMAX};
    /* clang-format on */
    mha_data data = make_data(&mc);
    describe("host with cl_mem masks in desc", &mc);
    clattn_mha_desc desc = desc_of(&mc);
    float tiny_values[1] = {0.0f};
    cl_mem tiny = tu_upload_floats(tiny_values, 1);
    desc.masks.attn_mask = tu_tensor(tiny, 0);
    desc.masks.key_padding_mask = tu_tensor(tiny, 0);
    clattn_mha_host_weights weights = host_weights_of(&data);
    clattn_host_masks masks = {mc.causal, data.attn_mask, data.padding};
    float *out = tu_nan_floats(data.out_count), *attn = tu_nan_floats(data.weights_count);
    clattn_status status = clattn_mha_forward_host(tu_ctx(), &desc, &weights, data.query, data.key,
                                                   data.value, &masks, out, attn);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_mha_forward_host")) {
        tu_expect_close("out", out, data.out_ref, data.out_count, TU_TOL);
        tu_expect_close("attn_weights", attn, data.weights_ref, data.weights_count, TU_TOL);
    }
    free(attn);
    free(out);
    tu_release_mem(tiny);
    free_data(&data);
    TU_END_TEST();
}
END_TEST

/* heads 1, 2, 4, 8, 16 with batch 1..3 on one layout each. */
START_TEST(test_mha_heads_and_batches)
{
    TU_BEGIN_TEST();
    static const size_t heads_list[] = {1, 2, 4, 8, 16};
    size_t heads = heads_list[_i % 5];
    size_t batch = 1 + (size_t)_i % 3;
    /* clang-format off */
    mha_case mc = {batch, 5 + (size_t)_i, 3 + 2 * (size_t)_i, 32, heads, 0, 0, 0, 0,
                   _i < 5 ? TORCH : XW, _i < 5 ? PACKED_CROSS : SEPARATE_CROSS, 1, 1, 1,
                   (clattn_need_weights)(_i % 3), _i % 2, _i % 3 == 2, _i % 4 == 1, 0, SOFTMAX};
    /* clang-format on */
    mha_data data = make_data(&mc);
    run_device(&mc, &data);
    run_host(&mc, &data, 0);
    free_data(&data);
    TU_END_TEST();
}
END_TEST

/* Random configurations over every option: layout, packed or separate weights, self or cross,
 * widths, biases, output projection, need_weights, masks, scale, normalisation. */
START_TEST(test_mha_random)
{
    TU_BEGIN_TEST();
    static const size_t heads_list[] = {1, 2, 4, 8, 16};
    static const size_t seqs[] = {1, 3, 17, 33, 65};
    mha_case mc;
    memset(&mc, 0, sizeof mc);
    mc.num_heads = heads_list[tu_rand_below(5)];
    mc.embed_dim = mc.num_heads * (1 + tu_rand_below(8));
    mc.batch = 1 + tu_rand_below(3);
    mc.layout = tu_rand_below(2) ? TORCH : XW;
    int self = (int)tu_rand_below(2);
    mc.seq_q = seqs[tu_rand_below(5)];
    mc.seq_k = self ? mc.seq_q : seqs[tu_rand_below(5)];
    if (mc.layout == TORCH && tu_rand_below(2)) {
        mc.form = self ? PACKED_SELF : PACKED_CROSS;
    } else {
        mc.form = self ? SEPARATE_SELF : SEPARATE_CROSS;
        if (!self) {
            mc.kdim = 1 + tu_rand_below(40);
            mc.vdim = 1 + tu_rand_below(40);
        }
        if (mc.layout == XW && tu_rand_below(2)) {
            mc.qk_dim = mc.num_heads * (1 + tu_rand_below(6));
            mc.v_dim = mc.num_heads * (1 + tu_rand_below(6));
        }
    }
    mc.in_biases = (int)tu_rand_below(2);
    mc.out_proj = (int)tu_rand_below(3) != 0;
    mc.out_bias = (int)tu_rand_below(2);
    mc.need_weights = (clattn_need_weights)tu_rand_below(3);
    mc.causal = (int)tu_rand_below(2);
    mc.use_attn_mask = (int)tu_rand_below(2);
    mc.use_padding = (int)tu_rand_below(2);
    mc.scale = tu_rand_below(2) ? 0.0f : (float)(0.1 + tu_rand_unit());
    mc.norm = tu_rand_below(4) == 0 ? RELU : SOFTMAX;
    mha_data data = make_data(&mc);
    run_device(&mc, &data);
    run_host(&mc, &data, 0);
    free_data(&data);
    TU_END_TEST();
}
END_TEST

/* Inputs that share storage in some places but not others, each against the float64 reference
 * with explicit arrays:
 *   - host API, key given and value NULL: the value is the key (as the header says);
 *   - host API, key is the query pointer but value differs: not self-attention, so the packed
 *     (B, L, 3E) shortcut must not be taken;
 *   - device API, query and key the same tensor, value another: likewise;
 *   - device API, key and value one tensor (cross-attention), the ordinary case.
 * _i: 0 PyTorch's packed in_proj weights, 1 separate q/k/v weights (X·W layout). */
START_TEST(test_mha_shared_inputs)
{
    TU_BEGIN_TEST();
    const int packed = _i == 0;
    const size_t batch = 2, seq = 13, e = 24, heads = 3;
    tu_set_case("B=%zu L=%zu E=%zu H=%zu %s weights", batch, seq, e, heads,
                packed ? "packed in_proj" : "separate");
    const size_t count = batch * seq * e;
    float *query = tu_random_floats(count), *other = tu_random_floats(count);
    float *w_in = tu_random_floats(3 * e * e), *b_in = tu_random_floats(3 * e);
    float *w_out = tu_random_floats(e * e), *b_out = tu_random_floats(e);
    clattn_mha_host_weights w = {.out_weight = w_out, .out_bias = b_out};
    if (packed) {
        w.in_proj_weight = w_in;
        w.in_proj_bias = b_in;
    } else {
        w.q_weight = w_in, w.k_weight = w_in + e * e, w.v_weight = w_in + 2 * e * e;
        w.q_bias = b_in, w.k_bias = b_in + e, w.v_bias = b_in + 2 * e;
    }
    clattn_mha_desc desc = {.batch = batch, .seq_q = seq, .seq_k = seq, .embed_dim = e,
                            .num_heads = heads,
                            .layout = packed ? CLATTN_LAYOUT_TORCH : CLATTN_LAYOUT_XW,
                            .need_weights = CLATTN_WEIGHTS_PER_HEAD};
    const size_t weights_count = batch * heads * seq * seq;
    /* want[0]: (query, other, other); want[1]: (query, query, other). */
    double *want[2] = {tu_doubles(count), tu_doubles(count)};
    double *want_weights[2] = {tu_doubles(weights_count), tu_doubles(weights_count)};
    ref_mha_forward(&desc, &w, query, other, other, NULL, want[0], want_weights[0]);
    ref_mha_forward(&desc, &w, query, query, other, NULL, want[1], want_weights[1]);

    float *out = tu_floats(count), *attn = tu_floats(weights_count);
    const char *host_names[2] = {"host: key given, value NULL", "host: key = query, value differs"};
    const float *host_keys[2] = {other, query}, *host_values[2] = {NULL, other};
    for (int v = 0; v < 2; ++v) {
        tu_fill_nan(out, count);
        tu_fill_nan(attn, weights_count);
        clattn_status status = clattn_mha_forward_host(tu_ctx(), &desc, &w, query, host_keys[v],
                                                       host_values[v], NULL, out, attn);
        if (tu_expect_status(status, CLATTN_SUCCESS, host_names[v])) {
            tu_expect_close(host_names[v], out, want[v], count, TU_TOL);
            tu_expect_close(host_names[v], attn, want_weights[v], weights_count, TU_TOL);
        }
    }

    /* Device API: the inputs in one buffer at NaN-separated offsets. */
    const size_t query_at = 3, other_at = count + 5, total = 2 * count + 8;
    float *inputs = tu_nan_floats(total);
    memcpy(inputs + query_at, query, count * sizeof(float));
    memcpy(inputs + other_at, other, count * sizeof(float));
    cl_mem in_mem = tu_upload_floats(inputs, total);
    cl_mem w_mem = tu_upload_floats(w_in, 3 * e * e), b_mem = tu_upload_floats(b_in, 3 * e);
    cl_mem wo_mem = tu_upload_floats(w_out, e * e), bo_mem = tu_upload_floats(b_out, e);
    cl_mem out_mem = tu_nan_buffer(count), attn_mem = tu_nan_buffer(weights_count);
    clattn_mha_weights dw = {.out_weight = tu_tensor(wo_mem, 0), .out_bias = tu_tensor(bo_mem, 0)};
    if (packed) {
        dw.in_proj_weight = tu_tensor(w_mem, 0);
        dw.in_proj_bias = tu_tensor(b_mem, 0);
    } else {
        dw.q_weight = tu_tensor(w_mem, 0), dw.k_weight = tu_tensor(w_mem, e * e);
        dw.v_weight = tu_tensor(w_mem, 2 * e * e);
        dw.q_bias = tu_tensor(b_mem, 0), dw.k_bias = tu_tensor(b_mem, e);
        dw.v_bias = tu_tensor(b_mem, 2 * e);
    }
    const char *device_names[2] = {"device: key = value tensor", "device: query = key tensor"};
    const clattn_tensor q_t = tu_tensor(in_mem, query_at), o_t = tu_tensor(in_mem, other_at);
    const clattn_tensor keys[2] = {o_t, q_t};
    for (int v = 0; v < 2; ++v) {
        if (v == 1) {
            float *nan = tu_nan_floats(weights_count > count ? weights_count : count);
            tu_write_floats(out_mem, 0, nan, count);
            tu_write_floats(attn_mem, 0, nan, weights_count);
            free(nan);
        }
        clattn_status status =
            clattn_mha_forward(tu_ctx(), &desc, &dw, q_t, keys[v], o_t, tu_tensor(out_mem, 0),
                               tu_tensor(attn_mem, 0), 0, NULL, NULL);
        if (tu_expect_status(status, CLATTN_SUCCESS, device_names[v])) {
            tu_read_floats(out_mem, 0, count, out);
            tu_read_floats(attn_mem, 0, weights_count, attn);
            tu_expect_close(device_names[v], out, want[v], count, TU_TOL);
            tu_expect_close(device_names[v], attn, want_weights[v], weights_count, TU_TOL);
        }
    }
    tu_release_mem(in_mem);
    tu_release_mem(w_mem);
    tu_release_mem(b_mem);
    tu_release_mem(wo_mem);
    tu_release_mem(bo_mem);
    tu_release_mem(out_mem);
    tu_release_mem(attn_mem);
    free(inputs);
    free(out);
    free(attn);
    for (int v = 0; v < 2; ++v) {
        free(want[v]);
        free(want_weights[v]);
    }
    free(query);
    free(other);
    free(w_in);
    free(b_in);
    free(w_out);
    free(b_out);
    TU_END_TEST();
}
END_TEST

static Suite *mha_suite(void)
{
    Suite *suite = suite_create("mha");
    TCase *forward = tcase_create("forward");
    tcase_set_timeout(forward, 600);
    /* A reduced run (CLATTN_TEST_SCALE=small, for Oclgrind) leaves out what takes minutes
     * there with GPU parameters; every projection form, layout, need_weights mode, mask, head
     * count 1..16 and normalisation still runs in the other mha_cases. */
    static const int heavy_cases[] = {2, 3, 5, 10};
    const int small = tu_small();
    if (small)
        tu_not_run("test_mha_cases 2, 3, 5, 10 (averaged weights over 4 or 8 heads at E=32..64), "
                   "test_mha_heads_and_batches, test_mha_random, "
                   "test_mha_host_workspace_reuse: minutes on Oclgrind");
    tu_add_loop_except(forward, test_mha_cases, 0, COUNT_OF(mha_cases), heavy_cases,
                       small ? COUNT_OF(heavy_cases) : 0);
    tcase_add_loop_test(forward, test_mha_need_weights_modes, 0, 3);
    if (!small) {
        tcase_add_loop_test(forward, test_mha_heads_and_batches, 0, 10);
        tcase_add_loop_test(forward, test_mha_random, 0, 24);
    }
    tcase_add_loop_test(forward, test_mha_shared_inputs, 0, 2);
    suite_add_tcase(suite, forward);

    TCase *workspace = tcase_create("workspace");
    tcase_set_timeout(workspace, 600);
    if (!small)
        tcase_add_test(workspace, test_mha_host_workspace_reuse);
    tcase_add_test(workspace, test_mha_host_ignores_device_masks);
    suite_add_tcase(suite, workspace);
    return suite;
}

int main(void)
{
    tu_suite_begin("check_mha");
    return tu_run_suite(mha_suite());
}
