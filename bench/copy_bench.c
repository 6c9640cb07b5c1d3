/*
 * copy_bench: the KV cache's past/present copies (heads.cl's copy4d_vec4 against copy4d), as
 * an ONNX-style decode step runs them: one query row over past_k/past_v of P keys and one new
 * key, present_k/present_v receiving P + 1 (F32, B = 1, H = 8, d = 64, causal as ONNX). The
 * whole step's time (median of --runs executions after a warm-up) on one context, then on a
 * context whose copy4d_vec4 fails its first-use probe (CLATTN_FAULT_VARIANT=copy4d_vec4:wrong:
 * the plan passes it over for copy4d), so the difference is the copies.
 *
 *   copy_bench [--runs N] [--past P,...]      (CLATTN_DEVICE picks the device)
 */
#define _POSIX_C_SOURCE 200809L
#include <clattn.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Buffers for the roles in use, with zeros (the copies' time does not depend on values). */
static cl_mem zeros(cl_context context, size_t floats)
{
    cl_int err = CL_SUCCESS;
    float *host = calloc(floats, sizeof(float));
    cl_mem mem = host ? clCreateBuffer(context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                       floats * sizeof(float), host, &err)
                      : NULL;
    free(host);
    return err == CL_SUCCESS ? mem : NULL;
}

/* The decode step's median time in ms on a fresh context (negative on failure). */
static double step_ms(size_t past, int runs, char *info, size_t info_size)
{
    const size_t h = 8, d = 64;
    clattn_ctx *ctx = NULL;
    char message[512];
    if (clattn_ctx_create(NULL, &ctx, message, sizeof message) != CLATTN_SUCCESS) {
        fprintf(stderr, "copy_bench: %s\n", message);
        return -1.0;
    }
    cl_context context = clattn_ctx_cl_context(ctx);
    clattn_tensor roles[CLATTN_ROLE_COUNT];
    memset(roles, 0, sizeof roles);
    cl_mem row = zeros(context, h * d), cache = zeros(context, h * past * d);
    cl_mem present_k = zeros(context, h * (past + 1) * d);
    cl_mem present_v = zeros(context, h * (past + 1) * d), out = zeros(context, h * d);
    roles[CLATTN_ROLE_Q] = clattn_tensor_make(row, 0, CLATTN_DTYPE_F32, 4, 1, h, 1, d);
    roles[CLATTN_ROLE_K] = roles[CLATTN_ROLE_V] = roles[CLATTN_ROLE_Q];
    roles[CLATTN_ROLE_OUT] = clattn_tensor_make(out, 0, CLATTN_DTYPE_F32, 4, 1, h, 1, d);
    roles[CLATTN_ROLE_PAST_K] = clattn_tensor_make(cache, 0, CLATTN_DTYPE_F32, 4, 1, h, past, d);
    roles[CLATTN_ROLE_PAST_V] = roles[CLATTN_ROLE_PAST_K];
    roles[CLATTN_ROLE_PRESENT_K] =
        clattn_tensor_make(present_k, 0, CLATTN_DTYPE_F32, 4, 1, h, past + 1, d);
    roles[CLATTN_ROLE_PRESENT_V] =
        clattn_tensor_make(present_v, 0, CLATTN_DTYPE_F32, 4, 1, h, past + 1, d);
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    desc.by_role = roles;
    desc.num_roles = CLATTN_ROLE_COUNT;
    desc.causal = CLATTN_CAUSAL_ONNX;
    clattn_plan *plan = NULL;
    double result = -1.0;
    double *ms = calloc((size_t)runs, sizeof(double));
    if (ms && row && cache && present_k && present_v && out &&
        clattn_sdpa_plan_create(ctx, &desc, &plan) == CLATTN_SUCCESS) {
        int ok = 1;
        for (int r = -1; r < runs && ok; ++r) { /* r = -1: the warm-up */
            const double t0 = now_ms();
            ok = clattn_plan_execute(plan, roles, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL,
                                     NULL) == CLATTN_SUCCESS &&
                 clattn_finish(ctx) == CLATTN_SUCCESS;
            if (r >= 0)
                ms[r] = now_ms() - t0;
        }
        if (ok) {
            qsort(ms, (size_t)runs, sizeof ms[0], by_value);
            result = ms[runs / 2];
        }
        snprintf(info, info_size, "%s", clattn_plan_info(plan));
    } else {
        fprintf(stderr, "copy_bench: %s\n", clattn_last_error(ctx));
    }
    clattn_plan_release(plan);
    free(ms);
    cl_mem mems[] = {row, cache, present_k, present_v, out};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; ++i)
        if (mems[i])
            clReleaseMemObject(mems[i]);
    clattn_ctx_release(ctx);
    return result;
}

int main(int argc, char **argv)
{
    int runs = 20;
    const char *pasts = "1023,4095,16383";
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--past") == 0 && i + 1 < argc)
            pasts = argv[++i];
        else {
            fprintf(stderr, "usage: copy_bench [--runs N] [--past P,...]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > 10000) {
        fprintf(stderr, "copy_bench: --runs must be 1 to 10000\n");
        return 2;
    }
    /* the probes' outcomes (the planted fault's included) stay out of the user's records */
    if (getenv("CLATTN_VALIDATION_FILE") == NULL)
        setenv("CLATTN_VALIDATION_FILE", "/dev/null", 1);
    printf("| past keys P | present bytes (k + v) | copy4d_vec4 step ms | copy4d step ms | "
           "copy4d / copy4d_vec4 |\n|---:|---:|---:|---:|---:|\n");
    for (const char *p = pasts; *p;) {
        char *end = NULL;
        const size_t past = strtoul(p, &end, 10);
        if (end == p || past == 0) {
            fprintf(stderr, "copy_bench: --past wants positive counts\n");
            return 2;
        }
        char info[512];
        unsetenv("CLATTN_FAULT_VARIANT");
        const double vec = step_ms(past, runs, info, sizeof info);
        setenv("CLATTN_FAULT_VARIANT", "copy4d_vec4:wrong", 1);
        const double scalar = step_ms(past, runs, info, sizeof info);
        unsetenv("CLATTN_FAULT_VARIANT");
        if (vec < 0 || scalar < 0)
            return 1;
        printf("| %zu | %.1f MB | %.3f | %.3f | %.2f |\n", past,
               2.0 * 8 * (past + 1) * 64 * 4 / 1e6, vec, scalar, scalar / vec);
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}
