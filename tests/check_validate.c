/*
 * check_validate: self-validation at first use (host/core/validate.c, host/ops/probe.c).
 * For each problem below (one per kernel family the probes cover: flash_cpu.cl or
 * flash_gpu.cl with every modifier, a grouped decode through decode splits and flash_merge,
 * a paged quantized cache, flash.cl, the unfused path's matmul_vec / pack_b / matmul and
 * softmax_rows, softmax_rows_f64) a clean context runs it once and lists the variants its plan
 * used; then, for each of those variants and each planted fault (CLATTN_FAULT_VARIANT=<key>:
 * wrong, :build, :enqueue), a fresh context must still give the float64 reference's numbers
 * (NaN-poisoned outputs), log the variant as failed, and write a "bad" record naming the
 * variant and this driver. A fault planted in a whole family (flash_cpu.cl, flash_gpu.cl)
 * falls to flash.cl; in every fused kernel, AUTO falls to the unfused path and FUSED fails
 * with CLATTN_ERR_UNTRUSTED naming the variant, never a wrong answer. Records: a second
 * context on the same driver probes nothing (every entry CLATTN_CHECK_RECORDED, no time); a
 * record of another driver does not count; CLATTN_VALIDATE=off logs nothing, =always probes
 * again, and an unknown value is refused.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "problems.h"
#include "reference.h"
#include "testutil.h"

static char records[200];

/* A fresh records file for the test (none of another test's records). */
static void fresh_records(void)
{
    snprintf(records, sizeof records, "/tmp/clattn-validate-%ld-%llu", (long)getpid(),
             (unsigned long long)tu_seed());
    remove(records);
    setenv("CLATTN_VALIDATION_FILE", records, 1);
}

/* A test's end: validation off again and its records file gone. */
static void drop_records(void)
{
    unsetenv("CLATTN_VALIDATE");
    remove(records);
}

static clattn_ctx *fresh_ctx(const char *row)
{
    clattn_ctx_desc desc;
    clattn_ctx_desc_init(&desc);
    desc.tuning_rows = row;
    clattn_ctx *ctx = NULL;
    char message[512] = "";
    const clattn_status status = clattn_ctx_create_desc(&desc, &ctx, message, sizeof message);
    tu_expect(status == CLATTN_SUCCESS, "clattn_ctx_create_desc: %s: %s",
              clattn_status_string(status), message);
    return ctx;
}

/* A fresh context made under CLATTN_PARAMS=params (unset again after). */
static clattn_ctx *fresh_ctx_under(const char *params)
{
    setenv("CLATTN_PARAMS", params, 1);
    clattn_ctx *ctx = fresh_ctx(NULL);
    unsetenv("CLATTN_PARAMS");
    return ctx;
}

typedef struct problem {
    const char *name;
    const char *params; /* CLATTN_PARAMS: "cpu" or "gpu" */
    const char *row;    /* a tuning row for the context, or NULL */
    void (*spec)(pb_sdpa_spec *s);
} problem;

static void prefill_all(pb_sdpa_spec *s)
{
    s->batch = 2, s->heads = 4, s->kv_heads = 2, s->seq_q = 17, s->seq_k = 67;
    s->dk = 16, s->dv = 8;
    s->mask = PB_MASK_FLOAT, s->mask_rank = 4, s->padding = 1, s->alibi = 1, s->sinks = 1;
    s->softcap = 3.0f, s->causal = CLATTN_CAUSAL_BOTTOM_RIGHT, s->want_lse = 1;
    s->q_dtype = CLATTN_DTYPE_F16, s->out_dtype = CLATTN_DTYPE_BF16;
}

/* (no lse: the unfused path can take it) */
static void prefill_no_lse(pb_sdpa_spec *s)
{
    prefill_all(s);
    s->want_lse = 0;
}

static void decode_group(pb_sdpa_spec *s)
{
    s->batch = 1, s->heads = 4, s->kv_heads = 1, s->seq_q = 1, s->seq_k = 300;
    s->dk = 32, s->dv = 32, s->sinks = 1, s->kv_len = 1;
    s->causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
}

static void paged_quantized(pb_sdpa_spec *s)
{
    s->batch = 2, s->heads = 2, s->seq_q = 3, s->seq_k = 96, s->page_size = 16;
    s->dk = 32, s->dv = 32;
    s->k_dtype = CLATTN_DTYPE_Q8_0, s->v_dtype = CLATTN_DTYPE_Q4_0;
    s->causal = CLATTN_CAUSAL_BOTTOM_RIGHT, s->mask = PB_MASK_BOOL, s->mask_rank = 4;
}

/* rope on q and k (rope.cl), halves */
static void rotary(pb_sdpa_spec *s)
{
    s->batch = 1, s->heads = 2, s->seq_q = 9, s->seq_k = 21, s->dk = 16, s->dv = 8, s->rope = 1;
    s->rope_style = CLATTN_ROPE_HALVES, s->causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
}

/* past/present: the cache's copies (heads.cl's copy4d), F16 present */
static void kv_cache(pb_sdpa_spec *s)
{
    s->batch = 2, s->heads = 2, s->seq_q = 3, s->seq_k = 29, s->past = 23, s->dk = 16, s->dv = 16;
    s->causal = CLATTN_CAUSAL_ONNX;
    s->k_dtype = s->v_dtype = CLATTN_DTYPE_F16; /* (F32 rows of whole float4s: copy4d_vec4) */
}

/* past/present in F32 rows of whole float4s: heads.cl's copy4d_vec4 (d = 20 and 12); the
 * decode's one query row */
static void kv_cache_vec4(pb_sdpa_spec *s)
{
    s->batch = 3, s->heads = 2, s->seq_q = 1, s->seq_k = 65, s->past = 64, s->dk = 20, s->dv = 12;
    s->causal = CLATTN_CAUSAL_ONNX;
}

static void unfused_weights(pb_sdpa_spec *s)
{
    s->batch = 1, s->heads = 3, s->seq_q = 19, s->seq_k = 41, s->dk = 24;
    s->dv = 24, s->want_weights = 1, s->mask = PB_MASK_BOOL, s->mask_rank = 4;
    s->causal = CLATTN_CAUSAL_TOP_LEFT, s->sinks = 1;
}

static void unfused_f64(pb_sdpa_spec *s)
{
    unfused_weights(s);
    s->softmax_f64 = 1, s->sinks = 0, s->norm = CLATTN_NORM_RELU;
}

static const problem problems[] = {
    {"prefill, every modifier (flash_cpu.cl)", "cpu", NULL, prefill_all},
    {"prefill, every modifier (flash_gpu.cl)", "gpu", NULL, prefill_all},
    {"grouped decode in splits (flash_merge)", "cpu", "any | * | * | decode_keys=16", decode_group},
    {"grouped decode in splits, GPU parameters", "gpu", "any | * | * | decode_keys=16",
     decode_group},
    {"paged q8_0/q4_0 cache", "cpu", NULL, paged_quantized},
    {"unfused with weights (matmul, softmax rows)", "cpu", NULL, unfused_weights},
    {"unfused, GPU parameters (tiled matmul)", "gpu", NULL, unfused_weights},
    {"unfused, softmax in double", "cpu", NULL, unfused_f64},
    {"a KV cache's past and present (copy4d)", "cpu", NULL, kv_cache},
    {"a KV cache's past and present in float4 rows (copy4d_vec4)", "cpu", NULL, kv_cache_vec4},
    {"rotary embeddings on q and k (rope.cl)", "cpu", NULL, rotary},
    {"prefill without lse", "cpu", NULL, prefill_no_lse},
};
enum { PROBLEMS = sizeof problems / sizeof problems[0], MAX_KEYS = 16 };

/* Runs the problem on a fresh context (params, row) and checks its numbers; the context's
 * log into log[0 .. *count). path overrides the spec's (-1: keep). */
static clattn_status run_problem(const problem *pr, int path, clattn_validation *log, size_t *count,
                                 char *info, size_t info_size)
{
    setenv("CLATTN_PARAMS", pr->params, 1);
    clattn_ctx *ctx = fresh_ctx(pr->row);
    unsetenv("CLATTN_PARAMS");
    if (ctx == NULL)
        return CLATTN_ERR_NO_DEVICE;
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    pr->spec(&spec);
    if (path >= 0)
        spec.path = (clattn_path)path;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("%s: %s", pr->name, p.label);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_plan *plan = NULL;
    clattn_status status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    if (status == CLATTN_SUCCESS) {
        snprintf(info, info_size, "%s", clattn_plan_info(plan));
        clattn_tensors bound;
        tu_expect(pb_sdpa_upload(ctx, &p, &bound) == CL_SUCCESS, "upload");
        tu_expect(pb_sdpa_poison(ctx, NULL, &bound) == CL_SUCCESS, "poison");
        status =
            clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL);
        tu_expect_status(status, CLATTN_SUCCESS, "clattn_plan_execute");
        if (status == CLATTN_SUCCESS)
            pb_sdpa_check(ctx, NULL, &p, &bound);
        pb_release_tensors(&bound);
        clattn_plan_release(plan);
    } else {
        snprintf(info, info_size, "%s", clattn_last_error(ctx));
    }
    *count = clattn_ctx_validations(ctx, log, MAX_KEYS);
    if (*count > MAX_KEYS)
        *count = MAX_KEYS;
    clattn_ctx_release(ctx);
    pb_sdpa_free(&p);
    return status;
}

/* Whether the records file has a line "<verdict>\t<...driver...>\t<key>". */
static int record_names(const char *verdict, const char *key, const char *device)
{
    FILE *f = fopen(records, "r");
    if (f == NULL)
        return 0;
    char line[2048];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strncmp(line, verdict, strlen(verdict)) == 0 && strstr(line, key) &&
                strstr(line, device) && strstr(line, "| driver ");
    fclose(f);
    return found;
}

/* Whether log[0 .. count) has a failed entry for the variant `key` names (its file and kernel:
 * a planted fault's key has its own hash). */
static int logged_failed(const clattn_validation *log, size_t count, const char *key)
{
    const size_t named = (size_t)(strchr(key, '@') - key);
    for (size_t i = 0; i < count; ++i)
        if (log[i].result == CLATTN_CHECK_FAILED && strncmp(log[i].variant, key, named) == 0)
            return 1;
    return 0;
}

static const char *const fault_kinds[] = {"wrong", "build", "enqueue"};

/* Each variant a clean run used, with each fault planted in it alone (its exact key: its
 * -cl-opt-disable build or the family's next variant takes over). */
START_TEST(test_fault_each_variant)
{
    TU_BEGIN_TEST();
    const problem *pr = &problems[_i];
    fresh_records();
    clattn_validation clean[MAX_KEYS], log[MAX_KEYS];
    size_t used = 0, count = 0;
    char info[1024];
    setenv("CLATTN_VALIDATE", "always", 1);
    const clattn_status clean_status = run_problem(pr, -1, clean, &used, info, sizeof info);
    if (clean_status == CLATTN_ERR_UNSUPPORTED && pr->spec == unfused_f64) {
        printf("validate: %s: skipped (%s)\n", pr->name, info); /* no doubles: rusticl */
        unsetenv("CLATTN_VALIDATE");
        return;
    }
    tu_expect_status(clean_status, CLATTN_SUCCESS, "the clean run");
    tu_expect(used > 0, "%s: the clean run validated no variant (%s)", pr->name, info);
    for (size_t u = 0; u < used && !tu_failed(); ++u) {
        tu_expect(clean[u].result == CLATTN_CHECK_PASSED, "%s: %s: %s (%s)", pr->name,
                  clean[u].variant, "not passed on a clean run", clean[u].detail);
        for (int f = 0; f < 3 && !tu_failed(); ++f) {
            char fault[sizeof clean[u].variant + 16];
            snprintf(fault, sizeof fault, "%.63s:%s", clean[u].variant, fault_kinds[f]);
            setenv("CLATTN_FAULT_VARIANT", fault, 1);
            const clattn_status status = run_problem(pr, -1, log, &count, info, sizeof info);
            unsetenv("CLATTN_FAULT_VARIANT");
            tu_expect_status(status, CLATTN_SUCCESS, fault);
            tu_expect(logged_failed(log, count, clean[u].variant),
                      "%s: fault %s: no failed entry in the log (%s)", pr->name, fault, info);
            char named[sizeof clean[u].variant];
            snprintf(named, sizeof named, "\t%.*s@",
                     (int)(strchr(clean[u].variant, '@') - clean[u].variant), clean[u].variant);
            tu_expect(record_names("bad", named, " | clattn "),
                      "%s: fault %s: no bad record naming the variant and the driver in %s",
                      pr->name, fault, records);
        }
    }
    drop_records();
    TU_END_TEST();
}
END_TEST

/* A fault in a whole family: flash_cpu.cl or flash_gpu.cl falls to flash.cl; in every fused
 * kernel, AUTO runs unfused and FUSED refuses (CLATTN_ERR_UNTRUSTED, naming the variant). */
START_TEST(test_fault_family)
{
    TU_BEGIN_TEST();
    fresh_records();
    clattn_validation log[MAX_KEYS];
    size_t count = 0;
    char info[1024];
    static const struct {
        int problem;
        const char *fault;
        int path;
        const char *info_has;
        clattn_status status;
    } cases[] = {
        {0, "flash_cpu.cl", -1, "flash.cl", CLATTN_SUCCESS},
        {1, "flash_gpu.cl:enqueue", -1, "flash.cl", CLATTN_SUCCESS},
        {2, "flash_cpu.cl:build", -1, "flash.cl", CLATTN_SUCCESS},
        {10, "flash_cpu.cl,flash.cl", -1, "unfused", CLATTN_SUCCESS},
        {2, "flash_cpu.cl,flash.cl", -1, "unfused", CLATTN_SUCCESS},
        {10, "flash_cpu.cl,flash.cl", CLATTN_PATH_FUSED, "failed validation", CLATTN_ERR_UNTRUSTED},
    };
    const size_t n = sizeof cases / sizeof cases[0];
    for (size_t c = 0; c < n && !tu_failed(); ++c) {
        setenv("CLATTN_FAULT_VARIANT", cases[c].fault, 1);
        const clattn_status status =
            run_problem(&problems[cases[c].problem], cases[c].path, log, &count, info, sizeof info);
        unsetenv("CLATTN_FAULT_VARIANT");
        tu_expect_status(status, cases[c].status, cases[c].fault);
        tu_expect(strstr(info, cases[c].info_has) != NULL, "fault %s: the plan says '%s'",
                  cases[c].fault, info);
    }
    remove(records);
    TU_END_TEST();
}
END_TEST

/* Records: a second context on this driver probes nothing; another driver's records and
 * CLATTN_VALIDATE=always do not count; off logs nothing; an unknown mode is refused. */
START_TEST(test_records)
{
    TU_BEGIN_TEST();
    fresh_records();
    clattn_validation first[MAX_KEYS], second[MAX_KEYS];
    size_t n1 = 0, n2 = 0;
    char info[1024];
    run_problem(&problems[0], -1, first, &n1, info, sizeof info);
    tu_expect(n1 > 0, "the first context validated nothing");
    for (size_t i = 0; i < n1; ++i)
        tu_expect(first[i].result == CLATTN_CHECK_PASSED && first[i].milliseconds > 0.0,
                  "first context: %s: result %d, %.3f ms", first[i].variant, (int)first[i].result,
                  first[i].milliseconds);
    run_problem(&problems[0], -1, second, &n2, info, sizeof info);
    tu_expect(n2 == n1, "the second context logged %zu entries, the first %zu", n2, n1);
    for (size_t i = 0; i < n2; ++i)
        tu_expect(second[i].result == CLATTN_CHECK_RECORDED && second[i].milliseconds == 0.0,
                  "second context: %s: result %d, %.3f ms (a probe)", second[i].variant,
                  (int)second[i].result, second[i].milliseconds);
    /* the same records under another driver's name: probed again */
    FILE *in = fopen(records, "r");
    char other[256];
    snprintf(other, sizeof other, "%s.other", records);
    FILE *out = fopen(other, "w");
    char line[2048];
    while (in && out && fgets(line, sizeof line, in)) {
        char *driver = strstr(line, "| driver ");
        if (driver)
            driver[9] = driver[9] == 'X' ? 'Y' : 'X';
        fputs(line, out);
    }
    if (in)
        fclose(in);
    if (out)
        fclose(out);
    setenv("CLATTN_VALIDATION_FILE", other, 1);
    run_problem(&problems[0], -1, second, &n2, info, sizeof info);
    for (size_t i = 0; i < n2; ++i)
        tu_expect(second[i].result == CLATTN_CHECK_PASSED,
                  "another driver's record counted: %s: result %d", second[i].variant,
                  (int)second[i].result);
    setenv("CLATTN_VALIDATION_FILE", records, 1);
    setenv("CLATTN_VALIDATE", "always", 1);
    run_problem(&problems[0], -1, second, &n2, info, sizeof info);
    for (size_t i = 0; i < n2; ++i)
        tu_expect(second[i].result == CLATTN_CHECK_PASSED, "always: %s: result %d",
                  second[i].variant, (int)second[i].result);
    setenv("CLATTN_VALIDATE", "off", 1);
    run_problem(&problems[0], -1, second, &n2, info, sizeof info);
    tu_expect(n2 == 0, "CLATTN_VALIDATE=off logged %zu entries", n2);
    setenv("CLATTN_VALIDATE", "sometimes", 1);
    clattn_ctx *ctx = NULL;
    char message[512] = "";
    const clattn_status status = clattn_ctx_create(NULL, &ctx, message, sizeof message);
    tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT && strstr(message, "CLATTN_VALIDATE"),
              "CLATTN_VALIDATE=sometimes: %s: %s", clattn_status_string(status), message);
    clattn_ctx_release(ctx);
    drop_records();
    remove(other);
    TU_END_TEST();
}
END_TEST

/* The backward (flash_bwd.cl; bwd_dkdv_cpu on CPUs, flash_bwd_gpu.cl under GPU parameters):
 * forward, then the backward plan on a fresh context; dQ, dK, dV against float64. keys: the
 * backward variants the context judged (NULL: not wanted). */
static clattn_status run_backward(const char *params, clattn_validation *log, size_t *count)
{
    clattn_ctx *ctx = fresh_ctx_under(params);
    if (ctx == NULL)
        return CLATTN_ERR_NO_DEVICE;
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = 2, spec.heads = 4, spec.kv_heads = 2, spec.seq_q = 19, spec.seq_k = 37;
    spec.dk = 32, spec.dv = 16, spec.mask = PB_MASK_FLOAT, spec.mask_rank = 4, spec.alibi = 1;
    spec.causal = CLATTN_CAUSAL_BOTTOM_RIGHT, spec.softcap = 4.0f, spec.want_lse = 1;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("backward (%s parameters): %s", params, p.label);
    clattn_tensors bound;
    clattn_plan *forward = NULL, *backward = NULL;
    float *grad_out = tu_random_floats(p.out_count);
    clattn_sdpa_desc desc;
    clattn_status status = CLATTN_ERR_INVALID_ARGUMENT;
    if (pb_sdpa_upload(ctx, &p, &bound) != CL_SUCCESS)
        goto done;
    pb_sdpa_desc(&p, &desc);
    if ((status = clattn_sdpa_plan_create(ctx, &desc, &forward)) ||
        (status = clattn_plan_execute(forward, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                      NULL, NULL)))
        goto done;
    if (pb_sdpa_upload_gradients(ctx, &p, grad_out, 0, 0, &bound) != CL_SUCCESS)
        goto done;
    CLATTN_BIND_ROLES(desc, bound);
    if ((status = clattn_sdpa_backward_plan_create(ctx, &desc, &backward)) ||
        (status = clattn_plan_execute(backward, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                      NULL, NULL)))
        goto done;
    double *dq = tu_doubles(p.q_count), *dk = tu_doubles(p.k_count), *dv = tu_doubles(p.v_count);
    float *out = tu_floats(p.out_count), *got = tu_floats(p.q_count + p.k_count + p.v_count);
    pb_download(ctx, NULL, &bound.out, out, NULL);
    pb_sdpa_backward_reference(&p, grad_out, out, 0, dq, dk, dv, NULL, NULL);
    pb_download(ctx, NULL, &bound.grad_q, got, NULL);
    tu_expect_close("grad_q", got, dq, p.q_count, 2e-4);
    pb_download(ctx, NULL, &bound.grad_k, got, NULL);
    tu_expect_close("grad_k", got, dk, p.k_count, 2e-4);
    pb_download(ctx, NULL, &bound.grad_v, got, NULL);
    tu_expect_close("grad_v", got, dv, p.v_count, 2e-4);
    free(dq);
    free(dk);
    free(dv);
    free(out);
    free(got);
done:
    if (status != CLATTN_SUCCESS)
        tu_expect(0, "backward: %s: %s", clattn_status_string(status), clattn_last_error(ctx));
    *count = clattn_ctx_validations(ctx, log, MAX_KEYS);
    if (*count > MAX_KEYS)
        *count = MAX_KEYS;
    free(grad_out);
    clattn_plan_release(forward);
    clattn_plan_release(backward);
    pb_release_tensors(&bound);
    clattn_ctx_release(ctx);
    pb_sdpa_free(&p);
    return status;
}

/* A fault in each backward variant judged: the right gradients through the fallback. */
/* Each fault kind planted in variant v alone, `run` again under `params`: the log must name
 * v failed (and, with check_status, the run still succeed: the family's next variant). */
static void walk_faults(clattn_status (*run)(const char *, clattn_validation *, size_t *),
                        const char *params, const clattn_validation *v, int check_status)
{
    clattn_validation log[MAX_KEYS];
    size_t count = 0;
    for (int f = 0; f < 3 && !tu_failed(); ++f) {
        char fault[sizeof v->variant + 16];
        snprintf(fault, sizeof fault, "%.63s:%s", v->variant, fault_kinds[f]);
        setenv("CLATTN_FAULT_VARIANT", fault, 1);
        const clattn_status status = run(params, log, &count);
        unsetenv("CLATTN_FAULT_VARIANT");
        if (check_status)
            tu_expect_status(status, CLATTN_SUCCESS, fault);
        tu_expect(logged_failed(log, count, v->variant), "fault %s: no failed entry in the log",
                  fault);
    }
}

START_TEST(test_fault_backward)
{
    TU_BEGIN_TEST();
    const char *params = _i == 0 ? "cpu" : "gpu";
    fresh_records();
    clattn_validation clean[MAX_KEYS];
    size_t used = 0;
    setenv("CLATTN_VALIDATE", "always", 1);
    run_backward(params, clean, &used);
    int judged = 0;
    for (size_t u = 0; u < used && !tu_failed(); ++u) {
        if (strcmp(clean[u].unit, "attention backward") != 0)
            continue;
        ++judged;
        tu_expect(clean[u].result == CLATTN_CHECK_PASSED, "%s: %s (%s)", clean[u].variant,
                  "not passed on a clean run", clean[u].detail);
        walk_faults(run_backward, params, &clean[u], 0);
    }
    tu_expect(judged > 0, "the backward judged no variant");
    drop_records();
    TU_END_TEST();
}
END_TEST

/* MHA with averaged weights (heads.cl's mean_heads, the projections' matmuls) on a fresh
 * context; its numbers checked by pb_mha_run against float64. */
static clattn_status run_mha(const char *params, clattn_validation *log, size_t *count)
{
    clattn_ctx *ctx = fresh_ctx_under(params);
    if (ctx == NULL)
        return CLATTN_ERR_NO_DEVICE;
    pb_mha_spec spec;
    pb_mha_spec_init(&spec);
    spec.batch = 2, spec.seq_q = 7, spec.seq_k = 11, spec.embed_dim = 24, spec.num_heads = 3;
    spec.form = PB_SEPARATE_CROSS, spec.in_biases = 1, spec.out_proj = 1, spec.out_bias = 1;
    spec.need_weights = CLATTN_WEIGHTS_AVERAGED, spec.mask = PB_MASK_FLOAT;
    pb_mha_problem p;
    pb_mha_make(&p, &spec);
    tu_set_case("mha (%s parameters): %s", params, p.label);
    const clattn_status status = pb_mha_run(ctx, &p, NULL);
    *count = clattn_ctx_validations(ctx, log, MAX_KEYS);
    if (*count > MAX_KEYS)
        *count = MAX_KEYS;
    clattn_ctx_release(ctx);
    pb_mha_free(&p);
    return status;
}

/* A fault in each variant an MHA plan with averaged weights judged (mean over heads, matmuls,
 * softmax rows): the right numbers through the fallback. */
START_TEST(test_fault_mha)
{
    TU_BEGIN_TEST();
    const char *params = _i == 0 ? "cpu" : "gpu";
    fresh_records();
    clattn_validation clean[MAX_KEYS];
    size_t used = 0;
    setenv("CLATTN_VALIDATE", "always", 1);
    tu_expect_status(run_mha(params, clean, &used), CLATTN_SUCCESS, "the clean run");
    int means = 0;
    for (size_t u = 0; u < used && !tu_failed(); ++u) {
        means += strcmp(clean[u].unit, "mean over heads") == 0;
        walk_faults(run_mha, params, &clean[u], 1);
    }
    tu_expect(means == 1, "the MHA plan judged %d mean_heads variants, not 1", means);
    drop_records();
    TU_END_TEST();
}
END_TEST

/* A plan of the family on a fresh context (layouts only): its log into log[0 .. *count). */
static clattn_status family_plan(int family, clattn_validation *log, size_t *count)
{
    clattn_ctx *ctx = fresh_ctx(NULL);
    if (ctx == NULL)
        return CLATTN_ERR_NO_DEVICE;
    clattn_tensor roles[CLATTN_ROLE_COUNT];
    memset(roles, 0, sizeof roles);
    clattn_plan *plan = NULL;
    clattn_status status;
    if (family == 0) { /* positional encodings: x + the sinusoid, F16 out */
        roles[CLATTN_ROLE_Q] = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, 2, 9, 10, 0);
        roles[CLATTN_ROLE_OUT] = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F16, 3, 2, 9, 10, 0);
        clattn_posenc_desc desc;
        clattn_posenc_desc_init(&desc);
        desc.by_role = roles;
        desc.num_roles = CLATTN_ROLE_COUNT;
        status = clattn_posenc_plan_create(ctx, &desc, &plan);
    } else { /* additive attention, unfused (additive.cl's scores) */
        roles[CLATTN_ROLE_Q] = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, 2, 7, 12, 0);
        roles[CLATTN_ROLE_K] = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, 2, 9, 12, 0);
        roles[CLATTN_ROLE_V] = roles[CLATTN_ROLE_K];
        roles[CLATTN_ROLE_OUT] = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, 2, 7, 12, 0);
        roles[CLATTN_ROLE_Q_WEIGHT] =
            clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, 12, 16, 0, 0);
        roles[CLATTN_ROLE_K_WEIGHT] = roles[CLATTN_ROLE_Q_WEIGHT];
        roles[CLATTN_ROLE_SCORE_WEIGHT] =
            clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, 16, 0, 0, 0);
        clattn_additive_desc desc;
        clattn_additive_desc_init(&desc);
        desc.by_role = roles;
        desc.num_roles = CLATTN_ROLE_COUNT;
        desc.num_heads = 2;
        desc.path = CLATTN_PATH_UNFUSED;
        status = clattn_additive_plan_create(ctx, &desc, &plan);
    }
    clattn_plan_release(plan);
    *count = clattn_ctx_validations(ctx, log, MAX_KEYS);
    if (*count > MAX_KEYS)
        *count = MAX_KEYS;
    clattn_ctx_release(ctx);
    return status;
}

/* Positional encodings and additive scores (their numbers: the probe's, against float64): a
 * fault in the variant's exact key is cured by its -cl-opt-disable build (the plan is made,
 * the variant logged failed, its safe build passed); one in every build of the kernel leaves
 * no variant: CLATTN_ERR_UNTRUSTED (or the build's status), never a plan. */
START_TEST(test_fault_elementwise)
{
    TU_BEGIN_TEST();
    static const char *const units[2] = {"positional encoding", "additive scores"};
    static const char *const files[2] = {"posenc.cl", "additive.cl"};
    fresh_records();
    clattn_validation clean[MAX_KEYS], log[MAX_KEYS];
    size_t used = 0, count = 0;
    setenv("CLATTN_VALIDATE", "always", 1);
    tu_expect_status(family_plan(_i, clean, &used), CLATTN_SUCCESS, "the clean plan");
    const clattn_validation *mine = NULL;
    for (size_t u = 0; u < used; ++u)
        if (strcmp(clean[u].unit, units[_i]) == 0)
            mine = &clean[u];
    tu_expect(mine && mine->result == CLATTN_CHECK_PASSED, "no passed %s variant", units[_i]);
    for (int f = 0; f < 3 && mine && !tu_failed(); ++f) {
        char fault[sizeof mine->variant + 16];
        snprintf(fault, sizeof fault, "%.63s:%s", mine->variant, fault_kinds[f]);
        setenv("CLATTN_FAULT_VARIANT", fault, 1);
        tu_expect_status(family_plan(_i, log, &count), CLATTN_SUCCESS, fault);
        int failed = 0, cured = 0;
        for (size_t i = 0; i < count; ++i) {
            failed |= log[i].result == CLATTN_CHECK_FAILED && strcmp(log[i].unit, "build") != 0;
            failed |= log[i].result == CLATTN_CHECK_FAILED && f == 1;
            cured |= log[i].result == CLATTN_CHECK_PASSED && strcmp(log[i].unit, units[_i]) == 0 &&
                     strstr(log[i].detail, "-cl-opt-disable") != NULL;
        }
        tu_expect(failed && cured, "fault %s: failed %d, cured by the safe build %d", fault, failed,
                  cured);
        snprintf(fault, sizeof fault, "%s:%s", files[_i], fault_kinds[f]);
        setenv("CLATTN_FAULT_VARIANT", fault, 1);
        const clattn_status status = family_plan(_i, log, &count);
        tu_expect(status == CLATTN_ERR_UNTRUSTED || status == CLATTN_ERR_BUILD,
                  "fault %s in every build: %s, expected no plan", fault,
                  clattn_status_string(status));
        unsetenv("CLATTN_FAULT_VARIANT");
    }
    drop_records();
    TU_END_TEST();
}
END_TEST

int main(void)
{
    tu_suite_begin("validate");
    Suite *suite = suite_create("validate");
    TCase *faults = tu_tcase(suite, "faults", 900);
    /* Every fault walk builds each variant again on fresh contexts: on a slow compiler
     * (rusticl, ASan's allocator) the small scale walks the CPU parameters' families only. */
    const int small = tu_small();
    static const int gpu_problems[] = {1, 3, 6, 7, 8};
    if (small)
        tu_not_run("test_fault_each_variant %d, %d, %d, %d, %d, test_fault_backward 1, "
                   "test_fault_mha 1 (the GPU parameters' variants and the rest of the "
                   "table: a build per variant and fault; the pocl lane runs them)",
                   gpu_problems[0], gpu_problems[1], gpu_problems[2], gpu_problems[3],
                   gpu_problems[4]);
    tu_add_loop_except(faults, test_fault_each_variant, 0, PROBLEMS - 1, gpu_problems,
                       small ? 5 : 0);
    tcase_add_loop_test(faults, test_fault_family, 0, 1);
    tcase_add_loop_test(faults, test_fault_backward, 0, small ? 1 : 2);
    tcase_add_loop_test(faults, test_fault_mha, 0, small ? 1 : 2);
    tcase_add_loop_test(faults, test_fault_elementwise, 0, 2);
    TCase *recs = tu_tcase(suite, "records", 900);
    tcase_add_loop_test(recs, test_records, 0, 1);
    return tu_run_suite(suite);
}
