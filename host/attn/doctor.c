/* clattn_doctor: self-validation over every SDPA configuration family the device can build
 * (dtypes, head sizes, masks, ALiBi, sinks, soft-capping, relu, grouped decodes with and
 * without splits, paged and quantized (Q8_0, Q4_0, FP8) caches, the unfused path's matmuls
 * and softmax rows, softmax in double, rotary embeddings and a KV cache's copies, the
 * backward), each plan created on the context with validation forced to "always"; the
 * context's log is the report (clattn_ctx_validations), written as JSON on request. */
#include "plan.h"
#include "core/validate.h"

#include <stdio.h>
#include <string.h>

typedef struct doctor_case {
    const char *what;
    clattn_dtype q, kv, out;
    size_t dk, heads, kv_heads, seq_q, seq_k;
    unsigned extras; /* DOC_* */
    clattn_path path;
} doctor_case;

enum {
    DOC_MASK = 1u,
    DOC_BOOL = 2u,
    DOC_PADDING = 4u,
    DOC_ALIBI = 8u,
    DOC_SINKS = 16u,
    DOC_SOFTCAP = 32u,
    DOC_RELU = 64u,
    DOC_KVLEN = 128u,
    DOC_PAGED = 256u,
    DOC_WEIGHTS = 512u,
    DOC_F64 = 1024u,
    DOC_CAUSAL = 2048u,
    DOC_LSE = 4096u,
    DOC_BACKWARD = 8192u, /* the backward plan (dQ, dK, dV from dO and the forward's lse) */
    DOC_ROPE = 16384u,    /* rotary embeddings on q and k (rope.cl), halves */
    DOC_PAST = 32768u,    /* a KV cache: past_k/past_v copied into present (heads.cl's copy4d) */
};

#define F32 CLATTN_DTYPE_F32
#define F16 CLATTN_DTYPE_F16
#define BF16 CLATTN_DTYPE_BF16
static const doctor_case cases[] = {
    {"prefill f32 d64 causal", F32, F32, F32, 64, 4, 4, 129, 129, DOC_CAUSAL, CLATTN_PATH_AUTO},
    {"prefill f16 d128 float mask", F16, F16, F16, 128, 2, 2, 65, 97, DOC_MASK, CLATTN_PATH_AUTO},
    {"prefill bf16 d80 bool mask, padding", BF16, BF16, BF16, 80, 2, 1, 33, 70,
     DOC_MASK | DOC_BOOL | DOC_PADDING, CLATTN_PATH_AUTO},
    {"prefill f32 d32 alibi, sinks, softcap, lse", F32, F32, F32, 32, 4, 2, 17, 67,
     DOC_ALIBI | DOC_SINKS | DOC_SOFTCAP | DOC_CAUSAL | DOC_LSE, CLATTN_PATH_AUTO},
    {"prefill f32 d16 relu", F32, F32, F32, 16, 2, 2, 19, 41, DOC_RELU, CLATTN_PATH_AUTO},
    {"decode f32 d64 grouped, kv_seqlen", F32, F32, F32, 64, 8, 2, 1, 4096,
     DOC_KVLEN | DOC_CAUSAL, CLATTN_PATH_AUTO},
    {"decode f16 d128 grouped, sinks", F16, F16, F16, 128, 4, 1, 1, 300, DOC_SINKS | DOC_KVLEN,
     CLATTN_PATH_AUTO},
    {"decode paged f32 d64", F32, F32, F32, 64, 4, 4, 1, 256, DOC_PAGED | DOC_KVLEN,
     CLATTN_PATH_AUTO},
    {"prefill paged q8_0 d64", F32, CLATTN_DTYPE_Q8_0, F32, 64, 2, 2, 7, 128,
     DOC_PAGED | DOC_KVLEN | DOC_CAUSAL, CLATTN_PATH_AUTO},
    {"decode q4_0 d128", F16, CLATTN_DTYPE_Q4_0, F16, 128, 4, 2, 1, 200, DOC_KVLEN,
     CLATTN_PATH_AUTO},
    {"decode fp8_e4m3 d64 grouped", F32, CLATTN_DTYPE_FP8_E4M3, F32, 64, 8, 2, 1, 300, DOC_KVLEN,
     CLATTN_PATH_AUTO},
    {"prefill paged fp8_e5m2 d48", F16, CLATTN_DTYPE_FP8_E5M2, F16, 48, 2, 2, 5, 96,
     DOC_PAGED | DOC_KVLEN | DOC_CAUSAL, CLATTN_PATH_AUTO},
    {"unfused f32 d64 weights, mask", F32, F32, F32, 64, 2, 2, 17, 67, DOC_WEIGHTS | DOC_MASK,
     CLATTN_PATH_AUTO},
    {"unfused f16 d32 (matmul f16)", F16, F16, F16, 32, 2, 2, 23, 45, DOC_CAUSAL,
     CLATTN_PATH_UNFUSED},
    {"unfused bf16 d48 relu", BF16, BF16, BF16, 48, 2, 2, 9, 33, DOC_RELU, CLATTN_PATH_UNFUSED},
    {"unfused softmax in double", F32, F32, F32, 16, 2, 2, 19, 41, DOC_F64 | DOC_WEIGHTS,
     CLATTN_PATH_AUTO},
    {"fused head size 256", F32, F32, F32, 256, 1, 1, 9, 40, DOC_CAUSAL, CLATTN_PATH_FUSED},
    {"prefill f32 d64 rope, KV cache", F32, F32, F32, 64, 4, 2, 7, 96, DOC_ROPE | DOC_PAST,
     CLATTN_PATH_AUTO},
    {"backward f32 d64 causal, mask", F32, F32, F32, 64, 4, 2, 65, 65,
     DOC_BACKWARD | DOC_CAUSAL | DOC_MASK | DOC_LSE, CLATTN_PATH_AUTO},
    {"backward bf16 d32 alibi, softcap", BF16, BF16, BF16, 32, 2, 2, 33, 47,
     DOC_BACKWARD | DOC_ALIBI | DOC_SOFTCAP | DOC_LSE, CLATTN_PATH_AUTO},
};
#undef F32
#undef F16
#undef BF16

/* Creates (and releases) the case's plan on ctx: the variants it needs are built and judged.
 * A plan the device cannot make (no doubles, say) is skipped: *skipped says why. */
static clattn_status doctor_plan(clattn_ctx *ctx, const doctor_case *c, char *skipped,
                                 size_t size)
{
    const size_t page = 16, batch = 2;
    const bool paged = c->extras & DOC_PAGED;
    clattn_tensor roles[CLATTN_ROLE_COUNT];
    memset(roles, 0, sizeof roles);
    roles[CLATTN_ROLE_Q] = clattn_tensor_make(NULL, 0, c->q, 4, batch, c->heads, c->seq_q, c->dk);
    if (paged) {
        const size_t pages = batch * c->seq_k / page + 1;
        roles[CLATTN_ROLE_K] = clattn_tensor_make(NULL, 0, c->kv, 4, pages, page, c->kv_heads,
                                                  c->dk);
        roles[CLATTN_ROLE_V] = roles[CLATTN_ROLE_K];
        roles[CLATTN_ROLE_BLOCK_TABLE] = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 2, batch,
                                                            c->seq_k / page, 0, 0);
    } else {
        roles[CLATTN_ROLE_K] = clattn_tensor_make(NULL, 0, c->kv, 4, batch, c->kv_heads, c->seq_k,
                                                  c->dk);
        roles[CLATTN_ROLE_V] = roles[CLATTN_ROLE_K];
    }
    roles[CLATTN_ROLE_OUT] = clattn_tensor_make(NULL, 0, c->out, 4, batch, c->heads, c->seq_q,
                                                c->dk);
    if (c->extras & DOC_MASK)
        roles[CLATTN_ROLE_ATTN_MASK] =
            clattn_tensor_make(NULL, 0, c->extras & DOC_BOOL ? CLATTN_DTYPE_U8 : c->q, 4, batch,
                               c->heads, c->seq_q, c->seq_k);
    if (c->extras & DOC_PADDING)
        roles[CLATTN_ROLE_KEY_PADDING_MASK] =
            clattn_tensor_make(NULL, 0, CLATTN_DTYPE_U8, 2, batch, c->seq_k, 0, 0);
    if (c->extras & DOC_KVLEN)
        roles[CLATTN_ROLE_KV_SEQLEN] =
            clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 1, batch, 0, 0, 0);
    if (c->extras & DOC_ALIBI)
        roles[CLATTN_ROLE_ALIBI_SLOPES] =
            clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, c->heads, 0, 0, 0);
    if (c->extras & DOC_SINKS)
        roles[CLATTN_ROLE_SINKS] = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, c->heads, 0, 0, 0);
    if (c->extras & DOC_WEIGHTS)
        roles[CLATTN_ROLE_WEIGHTS] = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, batch,
                                                        c->heads, c->seq_q, c->seq_k);
    if (c->extras & DOC_LSE)
        roles[CLATTN_ROLE_LSE] =
            clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, batch, c->heads, c->seq_q, 0);
    if (c->extras & DOC_BACKWARD) { /* the gradients, as their tensors */
        roles[CLATTN_ROLE_GRAD_OUT] = roles[CLATTN_ROLE_OUT];
        roles[CLATTN_ROLE_GRAD_Q] = roles[CLATTN_ROLE_Q];
        roles[CLATTN_ROLE_GRAD_K] = roles[CLATTN_ROLE_K];
        roles[CLATTN_ROLE_GRAD_V] = roles[CLATTN_ROLE_V];
    }
    if (c->extras & DOC_PAST) { /* seq_k - seq_q past keys, then the new ones */
        const size_t past = c->seq_k - c->seq_q;
        roles[CLATTN_ROLE_K] = clattn_tensor_make(NULL, 0, c->kv, 4, batch, c->kv_heads, c->seq_q,
                                                  c->dk);
        roles[CLATTN_ROLE_V] = roles[CLATTN_ROLE_K];
        roles[CLATTN_ROLE_PAST_K] =
            clattn_tensor_make(NULL, 0, c->kv, 4, batch, c->kv_heads, past, c->dk);
        roles[CLATTN_ROLE_PAST_V] = roles[CLATTN_ROLE_PAST_K];
        roles[CLATTN_ROLE_PRESENT_K] =
            clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F16, 4, batch, c->kv_heads, c->seq_k, c->dk);
        roles[CLATTN_ROLE_PRESENT_V] = roles[CLATTN_ROLE_PRESENT_K];
    }
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    desc.by_role = roles;
    desc.num_roles = CLATTN_ROLE_COUNT;
    desc.causal = c->extras & DOC_CAUSAL ? CLATTN_CAUSAL_BOTTOM_RIGHT : CLATTN_CAUSAL_NONE;
    desc.norm = c->extras & DOC_RELU ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX;
    desc.softcap = c->extras & DOC_SOFTCAP ? 5.0f : 0.0f;
    desc.softmax_f64 = c->extras & DOC_F64 ? 1 : 0;
    desc.path = c->path;
    if (c->extras & DOC_ROPE)
        desc.rope = 1;
    if (c->extras & DOC_PAST)
        desc.causal = CLATTN_CAUSAL_ONNX;
    clattn_plan *plan = NULL;
    const clattn_status status = c->extras & DOC_BACKWARD
                                     ? clattn_sdpa_backward_plan_create(ctx, &desc, &plan)
                                     : clattn_sdpa_plan_create(ctx, &desc, &plan);
    clattn_plan_release(plan);
    skipped[0] = '\0';
    if (status == CLATTN_ERR_UNSUPPORTED) {
        snprintf(skipped, size, "%.150s", clattn_last_error(ctx));
        return CLATTN_SUCCESS;
    }
    return status;
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; ++s) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", (unsigned)(unsigned char)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static const char *const check_names[] = {"passed", "recorded", "failed", "unchecked"};

static void write_json(FILE *f, clattn_ctx *ctx, const char *const *outcomes, size_t first)
{
    char driver[640];
    clattn__driver_key(ctx, driver, sizeof driver);
    fprintf(f, "{\n  \"clattn\": \"%s\",\n  \"device\": ", CLATTN_VERSION_STRING);
    json_string(f, ctx->info.name);
    fprintf(f, ",\n  \"driver_key\": ");
    json_string(f, driver);
    fprintf(f, ",\n  \"cases\": [\n");
    const size_t ncases = sizeof cases / sizeof cases[0];
    for (size_t i = 0; i < ncases; ++i) {
        fprintf(f, "    {\"case\": ");
        json_string(f, cases[i].what);
        fprintf(f, ", \"outcome\": ");
        json_string(f, outcomes[i]);
        fprintf(f, "}%s\n", i + 1 < ncases ? "," : "");
    }
    fprintf(f, "  ],\n  \"variants\": [\n");
    for (size_t i = first; i < ctx->num_validations; ++i) {
        const clattn_validation *v = &ctx->validations[i];
        fprintf(f, "    {\"variant\": ");
        json_string(f, v->variant);
        fprintf(f, ", \"unit\": ");
        json_string(f, v->unit);
        fprintf(f, ", \"result\": \"%s\", \"max_error\": %.6g, \"tolerance\": %.6g, "
                   "\"ms\": %.3f, \"detail\": ",
                check_names[v->result], v->max_error, v->tolerance, v->milliseconds);
        json_string(f, v->detail);
        fprintf(f, "}%s\n", i + 1 < ctx->num_validations ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
}

clattn_status clattn_doctor(clattn_ctx *ctx, const char *json_path, size_t *checked,
                            size_t *failed)
{
    if (ctx == NULL)
        return CLATTN_ERR_INVALID_ARGUMENT;
    clattn__clear_error(ctx);
    const int mode = ctx->validate_mode;
    const size_t first = ctx->num_validations;
    ctx->validate_mode = 2; /* probe everything, whatever the records say */
    enum { CASES = sizeof cases / sizeof cases[0] };
    char notes[CASES][160];
    const char *outcomes[CASES];
    clattn_status status = CLATTN_SUCCESS;
    size_t bad_plans = 0;
    for (size_t i = 0; i < CASES; ++i) {
        const clattn_status s = doctor_plan(ctx, &cases[i], notes[i], sizeof notes[i]);
        if (s != CLATTN_SUCCESS) {
            snprintf(notes[i], sizeof notes[i], "%s: %.120s", clattn_status_string(s),
                     clattn_last_error(ctx));
            ++bad_plans;
        }
        outcomes[i] = s != CLATTN_SUCCESS ? notes[i] : notes[i][0] ? notes[i] : "ok";
    }
    ctx->validate_mode = mode;
    size_t fails = bad_plans;
    for (size_t i = first; i < ctx->num_validations; ++i)
        fails += ctx->validations[i].result == CLATTN_CHECK_FAILED;
    if (checked)
        *checked = ctx->num_validations - first;
    if (failed)
        *failed = fails;
    if (json_path && json_path[0]) {
        FILE *f = fopen(json_path, "w");
        if (f == NULL)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "clattn_doctor: cannot write the report to %s", json_path);
        write_json(f, ctx, outcomes, first);
        if (fclose(f) != 0)
            status = clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                  "clattn_doctor: writing the report to %s failed", json_path);
    }
    return status;
}
