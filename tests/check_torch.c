/*
 * MHA plans and clattn_mha_forward_host against PyTorch's nn.MultiheadAttention(batch_first=True)
 * in eval mode: tests/fixtures/torch_mha.txt holds inputs, state_dicts, outputs and attention
 * weights that tests/fixtures/gen_torch_mha.py recorded from PyTorch. PyTorch is not needed to run
 * this. The fixture path is the first argument (CMake passes it).
 */
#include "problems.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TENSORS 16
#define MAX_CASES 8

typedef struct fixture_tensor {
    char name[64];
    int ndim;
    size_t dims[4];
    size_t count;
    double *values;
} fixture_tensor;

typedef struct fixture_case {
    char name[64];
    size_t embed_dim, num_heads;
    int self_attention, average;
    fixture_tensor tensors[MAX_TENSORS];
    int num_tensors;
} fixture_case;

static fixture_case cases[MAX_CASES];
static int num_cases;
static const char *fixture_path;

/* Reads the whole fixture; returns 0 on any format error (the test then fails). */
static int load_fixture(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    char word[64];
    int ok = 1;
    fixture_case *c = NULL;
    while (ok && fscanf(f, "%63s", word) == 1) {
        if (word[0] == '#') {
            int ch;
            while ((ch = fgetc(f)) != '\n' && ch != EOF) {
            }
        } else if (strcmp(word, "case") == 0) {
            ok = num_cases < MAX_CASES;
            if (ok) {
                c = &cases[num_cases++];
                ok = fscanf(f, "%63s", c->name) == 1;
            }
        } else if (strcmp(word, "param") == 0 && c) {
            char key[64];
            long value = 0;
            ok = fscanf(f, "%63s %ld", key, &value) == 2;
            if (strcmp(key, "embed_dim") == 0)
                c->embed_dim = (size_t)value;
            else if (strcmp(key, "num_heads") == 0)
                c->num_heads = (size_t)value;
            else if (strcmp(key, "self_attention") == 0)
                c->self_attention = (int)value;
            else if (strcmp(key, "average") == 0)
                c->average = (int)value;
        } else if (c && c->num_tensors < MAX_TENSORS) {
            fixture_tensor *t = &c->tensors[c->num_tensors++];
            snprintf(t->name, sizeof t->name, "%s", word);
            ok = fscanf(f, "%d", &t->ndim) == 1 && t->ndim >= 1 && t->ndim <= 4;
            t->count = 1;
            for (int d = 0; ok && d < t->ndim; ++d) {
                ok = fscanf(f, "%zu", &t->dims[d]) == 1;
                t->count *= t->dims[d];
            }
            t->values = ok ? calloc(t->count, sizeof(double)) : NULL;
            ok = ok && t->values;
            for (size_t i = 0; ok && i < t->count; ++i) {
                char number[64];
                ok = fscanf(f, "%63s", number) == 1;
                t->values[i] = strcmp(number, "-inf") == 0 ? -INFINITY : strtod(number, NULL);
            }
        } else {
            ok = 0;
        }
    }
    fclose(f);
    return ok && num_cases > 0;
}

static void free_fixture(void)
{
    for (int i = 0; i < num_cases; ++i)
        for (int t = 0; t < cases[i].num_tensors; ++t)
            free(cases[i].tensors[t].values);
}

static const fixture_tensor *find(const fixture_case *c, const char *name)
{
    for (int t = 0; t < c->num_tensors; ++t)
        if (strcmp(c->tensors[t].name, name) == 0)
            return &c->tensors[t];
    return NULL;
}

/* A float copy of a fixture tensor (NULL when absent); the caller frees it. */
static float *floats_of(const fixture_case *c, const char *name)
{
    const fixture_tensor *t = find(c, name);
    if (t == NULL)
        return NULL;
    float *values = tu_floats(t->count);
    for (size_t i = 0; i < t->count; ++i)
        values[i] = (float)t->values[i];
    return values;
}

/* How a case is run. */
typedef enum run_mode {
    MODE_HOST = 0,   /* host API, the weights PyTorch returned (unfused) */
    MODE_DEVICE,     /* an MHA plan on our own buffers (unfused) */
    MODE_FUSED,      /* host API, no weights, path FUSED: the fused kernel vs PyTorch's out */
    MODE_OTHER_FORM, /* host API, the other weights form: averaged from per-head fixtures, per
                        head for averaged fixtures (their mean over heads must match) */
    MODE_COUNT
} run_mode;
static const char *const mode_names[MODE_COUNT] = {"host API", "MHA plan", "host API, fused path",
                                                   "host API, other weights form"};

/* Where PyTorch's weight is exactly 0 (a masked key), ours must be exactly 0 too. */
static void expect_masked_zeros(const float *got, const double *want, size_t count)
{
    size_t zeros = 0, wrong = 0, first = 0;
    for (size_t i = 0; i < count; ++i) {
        if (want[i] != 0.0)
            continue;
        ++zeros;
        if (got[i] != 0.0f && wrong++ == 0)
            first = i;
    }
    tu_expect(wrong == 0, "%zu of %zu masked weights are not exactly 0 (first at [%zu]: %g)", wrong,
              zeros, first, wrong ? (double)got[first] : 0.0);
}

/* Mean over heads of per-head weights (batch, heads, plane) -> (batch, plane). */
static void mean_over_heads(const double *per_head, size_t batch, size_t heads, size_t plane,
                            double *out)
{
    for (size_t b = 0; b < batch; ++b)
        for (size_t i = 0; i < plane; ++i) {
            double sum = 0.0;
            for (size_t h = 0; h < heads; ++h)
                sum += per_head[(b * heads + h) * plane + i];
            out[b * plane + i] = sum / (double)heads;
        }
}

/* A packed tensor of the fixture tensor's dims (mem NULL). */
static clattn_tensor layout_of(const fixture_tensor *t, clattn_dtype dtype)
{
    clattn_tensor layout =
        clattn_tensor_make(NULL, 0, dtype, t->ndim, t->dims[0], t->dims[1], t->dims[2], t->dims[3]);
    return layout;
}

/* Downloads a whole output tensor, expecting no write outside it. */
static int download_output(const clattn_tensor *t, const char *what, float *values)
{
    size_t stray = 0;
    if (pb_download(tu_ctx(), NULL, t, values, &stray) != CL_SUCCESS)
        return 0;
    return tu_expect(stray == 0, "%s: %zu stray writes outside the tensor", what, stray);
}

/* Runs case i in one of the modes. */
static void run_case(int index, run_mode mode)
{
    const int device = mode == MODE_DEVICE;
    const fixture_case *c = &cases[index];
    const fixture_tensor *query = find(c, "query"), *key = find(c, "key");
    const fixture_tensor *value = find(c, "value"), *want_out = find(c, "out");
    const fixture_tensor *want_weights = find(c, "weights");
    tu_set_case("%s via %s", c->name, mode_names[mode]);
    if (!tu_expect(query && want_out && want_weights, "fixture case lacks query/out/weights"))
        return;
    const size_t batch = query->dims[0], seq_q = query->dims[1];
    const size_t seq_k = key ? key->dims[1] : seq_q;
    clattn_mha_host_desc desc;
    clattn_mha_host_desc_init(&desc);
    desc.batch = batch, desc.seq_q = seq_q, desc.seq_k = seq_k, desc.embed_dim = c->embed_dim;
    desc.num_heads = c->num_heads, desc.kdim = key ? key->dims[2] : 0;
    desc.vdim = value ? value->dims[2] : 0, desc.layout = CLATTN_LAYOUT_TORCH;
    desc.need_weights = c->average ? CLATTN_WEIGHTS_AVERAGED : CLATTN_WEIGHTS_PER_HEAD;
    /* The host and device modes run whatever AUTO picks with weights: the unfused path. */
    if (mode == MODE_FUSED) {
        desc.need_weights = CLATTN_WEIGHTS_NONE;
        desc.path = CLATTN_PATH_FUSED;
    } else if (mode == MODE_OTHER_FORM) {
        desc.need_weights = c->average ? CLATTN_WEIGHTS_PER_HEAD : CLATTN_WEIGHTS_AVERAGED;
    }
    float *host[12] = {0};
    enum { IN_W, IN_B, QW, KW, VW, OW, OB, QUERY, KEY, VALUE, MASK, KPM_F };
    static const char *const names[12] = {"in_proj_weight", "in_proj_bias",  "q_proj_weight",
                                          "k_proj_weight",  "v_proj_weight", "out_proj.weight",
                                          "out_proj.bias",  "query",         "key",
                                          "value",          "attn_mask",     "key_padding_mask"};
    for (int i = 0; i < 12; ++i)
        host[i] = floats_of(c, names[i]);
    uint8_t *kpm = NULL;
    if (host[KPM_F]) {
        kpm = tu_bytes(batch * seq_k);
        for (size_t i = 0; i < batch * seq_k; ++i)
            kpm[i] = host[KPM_F][i] != 0.0f;
    }
    /* PyTorch's MultiheadAttention has a single in_proj_bias even with separate q/k/v weights. */
    const fixture_tensor *in_bias = find(c, "in_proj_bias");
    const size_t e = c->embed_dim;
    const size_t out_count = want_out->count, plane = seq_q * seq_k;
    const size_t heads = c->num_heads;
    /* What this mode asks for: PyTorch's form, the other one, or none. */
    const size_t weights_count = mode != MODE_OTHER_FORM ? want_weights->count
                                 : c->average            ? batch * heads * plane
                                                         : batch * plane;
    float *out = tu_nan_floats(out_count), *weights = tu_nan_floats(weights_count);
    clattn_status status;

    if (!device) {
        clattn_mha_host_weights w = {.out_weight = host[OW], .out_bias = host[OB]};
        if (host[IN_W]) {
            w.in_proj_weight = host[IN_W];
            w.in_proj_bias = host[IN_B];
        } else {
            w.q_weight = host[QW], w.k_weight = host[KW], w.v_weight = host[VW];
            if (in_bias)
                w.q_bias = host[IN_B], w.k_bias = host[IN_B] + e, w.v_bias = host[IN_B] + 2 * e;
        }
        clattn_host_masks masks = {.attn_mask = host[MASK], .key_padding_mask = kpm};
        status = clattn_mha_forward_host(tu_ctx(), &desc, &w, host[QUERY], host[KEY], host[VALUE],
                                         &masks, out, mode == MODE_FUSED ? NULL : weights);
        tu_expect_status(status, CLATTN_SUCCESS, "clattn_mha_forward_host");
    } else {
        /* An MHA plan; every parameter and input in its own buffer at a nonzero offset,
         * poison around it; self-attention binds one buffer to query, key and value. */
        clattn_mha_desc plan_desc;
        clattn_mha_desc_init(&plan_desc);
        clattn_tensors plan_desc_tensors = {0};
        CLATTN_BIND_ROLES(plan_desc, plan_desc_tensors);
        clattn_tensors bound;
        memset(&bound, 0, sizeof bound);
        clattn_tensor *roles[12] = {&bound.in_proj_weight,
                                    &bound.in_proj_bias,
                                    &bound.q_weight,
                                    &bound.k_weight,
                                    &bound.v_weight,
                                    &bound.out_weight,
                                    &bound.out_bias,
                                    &bound.q,
                                    &bound.k,
                                    &bound.v,
                                    &bound.attn_mask,
                                    &bound.key_padding_mask};
        cl_int err = CL_SUCCESS;
        for (int i = 0; i < 12 && err == CL_SUCCESS; ++i) {
            const fixture_tensor *ft = find(c, names[i]);
            if (ft == NULL || (i == IN_B && !host[IN_W]))
                continue; /* separate weights: in_proj_bias is split below */
            *roles[i] = layout_of(ft, i == KPM_F ? CLATTN_DTYPE_U8 : CLATTN_DTYPE_F32);
            err = pb_upload(tu_ctx(), roles[i], 3, host[i]);
        }
        if (err == CL_SUCCESS && !host[IN_W] && in_bias) {
            /* q, k, v biases: three views of one buffer. */
            clattn_tensor packed = layout_of(in_bias, CLATTN_DTYPE_F32);
            err = pb_upload(tu_ctx(), &packed, 3, host[IN_B]);
            clattn_tensor *biases[3] = {&bound.q_bias, &bound.k_bias, &bound.v_bias};
            for (int part = 0; part < 3 && err == CL_SUCCESS; ++part) {
                *biases[part] = clattn_tensor_make(packed.mem, packed.offset + (size_t)part * e,
                                                   CLATTN_DTYPE_F32, 1, e, 0, 0, 0);
            }
        }
        if (c->self_attention) {
            bound.k = bound.q;
            bound.v = bound.q;
        }
        bound.out = layout_of(want_out, CLATTN_DTYPE_F32);
        if (err == CL_SUCCESS)
            err = pb_upload(tu_ctx(), &bound.out, 2, NULL);
        bound.weights =
            c->average
                ? clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, batch, seq_q, seq_k, 0)
                : clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, batch, heads, seq_q, seq_k);
        if (err == CL_SUCCESS)
            err = pb_upload(tu_ctx(), &bound.weights, 1, NULL);
        plan_desc_tensors = bound;
        plan_desc.num_heads = heads;
        plan_desc.layout = CLATTN_LAYOUT_TORCH;
        plan_desc.need_weights = desc.need_weights;
        clattn_plan *plan = NULL;
        status = err != CL_SUCCESS ? (clattn_status)err
                                   : clattn_mha_plan_create(tu_ctx(), &plan_desc, &plan);
        tu_expect_status(status, CLATTN_SUCCESS, "clattn_mha_plan_create");
        if (status == CLATTN_SUCCESS) {
            tu_expect(!clattn_plan_is_fused(plan), "a plan returning weights is fused");
            status = clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                         NULL, NULL);
            tu_expect_status(status, CLATTN_SUCCESS, "clattn_plan_execute");
        }
        if (status == CLATTN_SUCCESS && !(download_output(&bound.out, "out", out) &&
                                          download_output(&bound.weights, "weights", weights)))
            status = CLATTN_ERR_INVALID_ARGUMENT; /* the failure is recorded */
        clattn_plan_release(plan);
        pb_release_tensors(&bound);
    }
    if (status == CLATTN_SUCCESS) {
        tu_expect_close("out vs PyTorch", out, want_out->values, out_count, TU_TOL);
        if (mode == MODE_HOST || mode == MODE_DEVICE) {
            tu_expect_close("attention weights vs PyTorch", weights, want_weights->values,
                            weights_count, TU_TOL);
            expect_masked_zeros(weights, want_weights->values, weights_count);
        } else if (mode == MODE_OTHER_FORM) {
            double *ours = tu_doubles(weights_count), *want = tu_doubles(batch * plane);
            tu_floats_to_doubles(weights, weights_count, ours);
            if (c->average) { /* our per-head weights, averaged here, vs PyTorch's average */
                mean_over_heads(ours, batch, heads, plane, want);
                float *mean = tu_floats(batch * plane);
                for (size_t i = 0; i < batch * plane; ++i)
                    mean[i] = (float)want[i];
                tu_expect_close("mean of per-head weights vs PyTorch's averaged weights", mean,
                                want_weights->values, batch * plane, TU_TOL);
                free(mean);
            } else { /* our averaged weights vs PyTorch's per-head weights, averaged here */
                mean_over_heads(want_weights->values, batch, heads, plane, want);
                tu_expect_close("averaged weights vs PyTorch's per-head mean", weights, want,
                                batch * plane, TU_TOL);
                expect_masked_zeros(weights, want, batch * plane);
            }
            free(want);
            free(ours);
        }
    }
    for (int i = 0; i < 12; ++i)
        free(host[i]);
    free(kpm);
    free(out);
    free(weights);
}

START_TEST(test_fixture_loaded)
{
    TU_BEGIN_TEST();
    tu_expect(num_cases >= 5, "fixture %s: %d cases parsed, expected 5", fixture_path, num_cases);
    TU_END_TEST();
}
END_TEST

/* _i: case * MODE_COUNT + mode. */
START_TEST(test_torch_cases)
{
    TU_BEGIN_TEST();
    run_case(_i / MODE_COUNT, (run_mode)(_i % MODE_COUNT));
    TU_END_TEST();
}
END_TEST

int main(int argc, char **argv)
{
    fixture_path = argc > 1 ? argv[1] : "tests/fixtures/torch_mha.txt";
    tu_suite_begin("check_torch");
    if (!load_fixture(fixture_path))
        fprintf(stderr, "check_torch: cannot parse fixture %s\n", fixture_path);
    Suite *suite = suite_create("torch");
    TCase *tc = tu_tcase(suite, "nn.MultiheadAttention", 600);
    tcase_add_test(tc, test_fixture_loaded);
    tcase_add_loop_test(tc, test_torch_cases, 0, num_cases * MODE_COUNT);
    int result = tu_run_suite(suite);
    free_fixture();
    return result;
}
