/*
 * validate_bench: what self-validation costs at plan creation (docs/validation.md), per plan
 * kind. For each kind, a fresh context creates the plan (tensor layouts only; nothing is
 * executed) with CLATTN_VALIDATE=off, then with first-use on an empty records file (the probes
 * run), then again with the records that run wrote (a second process on the same driver: no
 * probe). Programs come from PoCL's kernel cache in every mode (a warm-up creation first), so
 * the differences are the probes. Median of --runs (default 5) creations, milliseconds.
 *
 *   validate_bench [--runs N]     (CLATTN_DEVICE picks the device)
 */
#define _POSIX_C_SOURCE 200809L
#include <clattn.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct kind {
    const char *name;
    size_t heads, kv_heads, seq_q, seq_k, dk;
    int unfused, backward;
} kind;

static const kind kinds[] = {
    {"prefill, fused (B=2, H=8, L=1024, d=64)", 8, 8, 1024, 1024, 64, 0, 0},
    {"decode, grouped, fused (H=32, Hkv=8, Lk=4096, d=128)", 32, 8, 1, 4096, 128, 0, 0},
    {"prefill, unfused with weights (H=8, L=512, d=64)", 8, 8, 512, 512, 64, 1, 0},
    {"backward, fused (H=8, L=1024, d=64)", 8, 8, 1024, 1024, 64, 0, 1},
};

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* One creation on a fresh context: its time in ms (negative on failure). */
static double create_once(const kind *k)
{
    clattn_ctx *ctx = NULL;
    char message[512];
    if (clattn_ctx_create(NULL, &ctx, message, sizeof message) != CLATTN_SUCCESS) {
        fprintf(stderr, "validate_bench: %s\n", message);
        return -1.0;
    }
    const size_t b = 2;
    clattn_tensor roles[CLATTN_ROLE_COUNT];
    memset(roles, 0, sizeof roles);
    roles[CLATTN_ROLE_Q] = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, b, k->heads, k->seq_q,
                                              k->dk);
    roles[CLATTN_ROLE_K] = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, b, k->kv_heads,
                                              k->seq_k, k->dk);
    roles[CLATTN_ROLE_V] = roles[CLATTN_ROLE_K];
    roles[CLATTN_ROLE_OUT] = roles[CLATTN_ROLE_Q];
    if (k->unfused)
        roles[CLATTN_ROLE_WEIGHTS] = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, b, k->heads,
                                                        k->seq_q, k->seq_k);
    if (k->backward) {
        roles[CLATTN_ROLE_LSE] =
            clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, b, k->heads, k->seq_q, 0);
        roles[CLATTN_ROLE_GRAD_OUT] = roles[CLATTN_ROLE_Q];
        roles[CLATTN_ROLE_GRAD_Q] = roles[CLATTN_ROLE_Q];
        roles[CLATTN_ROLE_GRAD_K] = roles[CLATTN_ROLE_K];
        roles[CLATTN_ROLE_GRAD_V] = roles[CLATTN_ROLE_K];
    }
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    desc.by_role = roles;
    desc.num_roles = CLATTN_ROLE_COUNT;
    desc.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    clattn_plan *plan = NULL;
    const double start = now_ms();
    const clattn_status status = k->backward ? clattn_sdpa_backward_plan_create(ctx, &desc, &plan)
                                             : clattn_sdpa_plan_create(ctx, &desc, &plan);
    const double ms = now_ms() - start;
    if (status != CLATTN_SUCCESS)
        fprintf(stderr, "validate_bench: %s: %s\n", k->name, clattn_last_error(ctx));
    clattn_plan_release(plan);
    clattn_ctx_release(ctx);
    return status == CLATTN_SUCCESS ? ms : -1.0;
}

static int compare(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int runs = 5;
    if (argc == 3 && strcmp(argv[1], "--runs") == 0)
        runs = atoi(argv[2]) > 0 ? atoi(argv[2]) : 5;
    char records[64];
    snprintf(records, sizeof records, "/tmp/validate_bench.%ld", (long)getpid());
    setenv("CLATTN_VALIDATION_FILE", records, 1);
    printf("%-56s %10s %12s %12s\n", "plan kind (median ms of plan creation)", "off",
           "first use", "recorded");
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; ++i) {
        const kind *k = &kinds[i];
        static const char *const modes[3] = {"off", "first-use", "first-use"};
        double median[3];
        setenv("CLATTN_VALIDATE", "off", 1);
        if (create_once(k) < 0) /* the programs into the kernel cache */
            return 1;
        for (int m = 0; m < 3; ++m) {
            double *t = calloc((size_t)runs, sizeof *t);
            setenv("CLATTN_VALIDATE", modes[m], 1);
            for (int r = 0; r < runs; ++r) {
                if (m == 1)
                    remove(records); /* first use: nothing recorded */
                t[r] = create_once(k);
            }
            qsort(t, (size_t)runs, sizeof *t, compare);
            median[m] = t[runs / 2];
            free(t);
        }
        printf("%-56s %10.1f %12.1f %12.1f\n", k->name, median[0], median[1], median[2]);
    }
    remove(records);
    return 0;
}
