/* Self-validation of kernel variants (validate.h): the mode, the per-driver records file, the
 * injected faults, the log, and clattn__trust, which decides whether a family's prepared
 * kernels may be used. The probes themselves (what a family runs, and the float64 reference)
 * are the families' own (host/ops/probe.c). */
#include "validate.h"
#include "runtime.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

enum { FAULT_NONE = 0, FAULT_WRONG, FAULT_BUILD, FAULT_ENQUEUE };
static const char *const fault_names[] = {"", "wrong", "build", "enqueue"};

bool clattn__validate_mode_from_env(clattn_ctx *ctx)
{
    const char *mode = getenv("CLATTN_VALIDATE");
    ctx->validate_mode = 1;
    if (mode == NULL || mode[0] == '\0' || strcmp(mode, "first-use") == 0)
        return true;
    if (strcmp(mode, "off") == 0 || strcmp(mode, "0") == 0) {
        ctx->validate_mode = 0;
        return true;
    }
    if (strcmp(mode, "always") == 0) {
        ctx->validate_mode = 2;
        return true;
    }
    clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                 "CLATTN_VALIDATE=%s: off, first-use (the default) or always", mode);
    return false;
}

bool clattn__variant_fallible(clattn_status status)
{
    return status == CLATTN_ERR_UNTRUSTED || status == CLATTN_ERR_BUILD ||
           status == (clattn_status)CL_OUT_OF_RESOURCES ||
           status == (clattn_status)CL_INVALID_KERNEL_NAME ||
           status == (clattn_status)CL_BUILD_PROGRAM_FAILURE;
}

/* FNV-1a, 64 bits: a key for a variant's options that stays short in records and messages. */
static uint64_t hash_text(uint64_t h, const char *text)
{
    for (const unsigned char *c = (const unsigned char *)text; *c; ++c) {
        h ^= *c;
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* The fault CLATTN_FAULT_VARIANT plants in the variant described by `what`. */
static int fault_for(const char *what)
{
    const char *spec = getenv("CLATTN_FAULT_VARIANT");
    if (spec == NULL || spec[0] == '\0')
        return FAULT_NONE;
    char copy[512];
    snprintf(copy, sizeof copy, "%s", spec);
    for (char *entry = copy; entry && *entry;) {
        char *next = strchr(entry, ',');
        if (next)
            *next++ = '\0';
        int kind = FAULT_WRONG;
        char *colon = strrchr(entry, ':');
        if (colon) {
            for (int k = FAULT_WRONG; k <= FAULT_ENQUEUE; ++k)
                if (strcmp(colon + 1, fault_names[k]) == 0) {
                    kind = k;
                    *colon = '\0';
                }
        }
        if (entry[0] && strstr(what, entry))
            return kind;
        entry = next;
    }
    return FAULT_NONE;
}

void clattn__variant_identity(const clattn_ctx *ctx, const char *file, uint64_t texts_hash,
                              clattn_variant *v)
{
    uint64_t h = hash_text(0xcbf29ce484222325ULL, v->name);
    h = hash_text(h, v->options);
    for (int i = 0; i < 8; ++i) { /* the kernel texts' hash, a byte at a time */
        h ^= (texts_hash >> (8 * i)) & 0xffu;
        h *= 0x100000001b3ULL;
    }
    const char *flex_at = strstr(v->options, "-DFLEX_SRC=");
    if (flex_at) { /* the user's functions, not the context's index of them */
        const long id = strtol(flex_at + strlen("-DFLEX_SRC="), NULL, 10);
        if (id > 0 && (size_t)id <= ctx->num_flex_sources)
            h = hash_text(h, ctx->flex_sources[id - 1]);
    }
    char what[700];
    snprintf(what, sizeof what, "%s:%s@%016llx %s", file, v->name, (unsigned long long)h,
             v->options);
    v->fault = fault_for(what);
    if (v->fault != FAULT_NONE) /* a planted fault is another variant: its own records */
        h = hash_text(h, fault_names[v->fault]);
    snprintf(v->key, sizeof v->key, "%s:%s@%016llx", file, v->name, (unsigned long long)h);
    v->trust = CLATTN__TRUST_UNKNOWN;
}

bool clattn__kernel_faulted(const clattn_ctx *ctx, cl_kernel kernel)
{
    for (size_t i = 0; i < ctx->num_variants; ++i)
        if (ctx->variants[i].kernel == kernel)
            return ctx->variants[i].fault == FAULT_ENQUEUE;
    return false;
}

/* ---- records ------------------------------------------------------------------------------ */

/* The records file: CLATTN_VALIDATION_FILE, $XDG_CACHE_HOME/clattn/validation or
 * $HOME/.cache/clattn/validation; false if none. */
static bool records_path(char *path, size_t size)
{
    /* Kernels loaded from CLATTN_KERNEL_DIR are not the shipped ones a key names: no
     * records (a developer's edits are probed afresh in each process). */
    const char *kernel_dir = getenv("CLATTN_KERNEL_DIR");
    if (kernel_dir && kernel_dir[0])
        return false;
    const char *file = getenv("CLATTN_VALIDATION_FILE");
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n = -1;
    if (file && file[0])
        n = snprintf(path, size, "%s", file);
    else if (xdg && xdg[0] == '/')
        n = snprintf(path, size, "%s/clattn/validation", xdg);
    else if (home && home[0])
        n = snprintf(path, size, "%s/.cache/clattn/validation", home);
    return n > 0 && (size_t)n < size;
}

static void remember(clattn_ctx *ctx, const char *key, bool good)
{
    for (size_t i = 0; i < ctx->num_records; ++i)
        if (strcmp(ctx->records[i].key, key) == 0) {
            ctx->records[i].good = good; /* the file's later line wins */
            return;
        }
    if (ctx->num_records == ctx->records_capacity) {
        const size_t capacity = ctx->records_capacity ? 2 * ctx->records_capacity : 32;
        clattn_trust_record *grown = realloc(ctx->records, capacity * sizeof *grown);
        if (grown == NULL)
            return; /* a record not kept: the variant is probed again, nothing worse */
        ctx->records = grown;
        ctx->records_capacity = capacity;
    }
    clattn_trust_record *r = &ctx->records[ctx->num_records++];
    snprintf(r->key, sizeof r->key, "%s", key);
    r->good = good;
}

/* Lines "good|bad <TAB> driver key <TAB> variant key <TAB> detail"; this driver's only. A
 * malformed line is skipped: the file is a cache. */
static void load_records(clattn_ctx *ctx)
{
    ctx->records_loaded = true;
    char path[600], line[1400];
    const char *driver = ctx->info.driver_key;
    if (!records_path(path, sizeof path))
        return;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    while (fgets(line, sizeof line, f)) {
        char *verdict = line, *drv = strchr(line, '\t');
        char *key = drv ? strchr(drv + 1, '\t') : NULL;
        if (key == NULL)
            continue;
        *drv++ = '\0';
        *key++ = '\0';
        char *end = strpbrk(key, "\t\n");
        if (end)
            *end = '\0';
        const bool good = strcmp(verdict, "good") == 0;
        if ((good || strcmp(verdict, "bad") == 0) && strcmp(drv, driver) == 0)
            remember(ctx, key, good);
    }
    fclose(f);
}

static bool recorded(clattn_ctx *ctx, const char *key, bool *good)
{
    if (!ctx->records_loaded)
        load_records(ctx);
    for (size_t i = 0; i < ctx->num_records; ++i)
        if (strcmp(ctx->records[i].key, key) == 0) {
            *good = ctx->records[i].good;
            return true;
        }
    return false;
}

/* mkdir -p of the folders above path (the cache folder may not exist yet). */
static void make_parents(const char *path)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *slash = strchr(dir + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return;
        *slash = '/';
    }
}

/* Appends a record; a cache that cannot be written costs a probe next time, nothing more. */
static void write_record(clattn_ctx *ctx, const clattn_variant *v, bool good, const char *detail)
{
    remember(ctx, v->key, good);
#ifdef CLATTN_FAULT_INJECTION
    /* the test library's hook fails calls at random points, probes included: its verdicts
     * must not reach a records file that other programs read */
    (void)detail;
#else
    char path[600];
    const char *driver = ctx->info.driver_key;
    if (!records_path(path, sizeof path))
        return;
    make_parents(path);
    FILE *f = fopen(path, "a");
    if (f == NULL)
        return;
    char clean[200];
    snprintf(clean, sizeof clean, "%s", detail);
    for (char *c = clean; *c; ++c)
        if (*c == '\t' || *c == '\n')
            *c = ' ';
    fprintf(f, "%s\t%s\t%s\t%s\n", good ? "good" : "bad", driver, v->key, clean);
    fclose(f);
#endif
}

/* ---- the log ------------------------------------------------------------------------------ */

static void log_entry(clattn_ctx *ctx, const clattn_variant *v, const char *unit,
                      clattn_check result, const clattn__probe_result *r, double ms,
                      const char *detail)
{
    if (ctx->num_validations == ctx->validations_capacity) {
        const size_t capacity = ctx->validations_capacity ? 2 * ctx->validations_capacity : 16;
        clattn_validation *grown = realloc(ctx->validations, capacity * sizeof *grown);
        if (grown == NULL)
            return;
        ctx->validations = grown;
        ctx->validations_capacity = capacity;
    }
    clattn_validation *e = &ctx->validations[ctx->num_validations++];
    memset(e, 0, sizeof *e);
    snprintf(e->variant, sizeof e->variant, "%s", v->key);
    snprintf(e->unit, sizeof e->unit, "%s", unit);
    snprintf(e->detail, sizeof e->detail, "%.191s", detail && detail[0] ? detail : v->options);
    e->result = result;
    e->max_error = r ? r->max_error : 0.0;
    e->tolerance = r ? r->tolerance : 0.0;
    e->milliseconds = ms;
}

size_t clattn_ctx_validations(const clattn_ctx *ctx, clattn_validation *out, size_t capacity)
{
    if (ctx == NULL)
        return 0;
    for (size_t i = 0; out && i < capacity && i < ctx->num_validations; ++i)
        out[i] = ctx->validations[i];
    return ctx->num_validations;
}

void clattn__note_build_failure(clattn_ctx *ctx, const clattn_variant *v, clattn_status status)
{
    if (ctx->validate_mode == 0)
        return;
    char detail[160];
    snprintf(detail, sizeof detail, "the build failed: %s%s", clattn_status_string(status),
             v->fault == FAULT_BUILD ? " (injected: CLATTN_FAULT_VARIANT)" : "");
    log_entry(ctx, v, "build", CLATTN_CHECK_FAILED, NULL, 0.0, detail);
    /* Not recorded: a user's source's errors (the user's). */
    if (strstr(v->options, "-DFLEX_SRC=") == NULL)
        write_record(ctx, v, false, detail);
}

void clattn__validation_release(clattn_ctx *ctx)
{
    free(ctx->records);
    free(ctx->validations);
}

/* ---- trust -------------------------------------------------------------------------------- */

clattn_variant *clattn__variant_of(clattn_ctx *ctx, cl_kernel kernel)
{
    for (size_t i = 0; i < ctx->num_variants; ++i)
        if (ctx->variants[i].kernel == kernel)
            return &ctx->variants[i];
    return NULL;
}

bool clattn__same_variant(const clattn_ctx *ctx, cl_kernel judged, cl_kernel built)
{
    if (judged == built)
        return true;
    const clattn_variant *a = clattn__variant_of((clattn_ctx *)ctx, judged);
    const clattn_variant *b = clattn__variant_of((clattn_ctx *)ctx, built);
    if (a == NULL || b == NULL || a->family != b->family || strcmp(a->name, b->name) != 0)
        return false;
    const size_t n = strlen(b->options);
    return strncmp(a->options, b->options, n) == 0 && strcmp(a->options + n, " -cl-opt-disable") == 0;
}

static double now_ms(void)
{
    struct timespec t;
    timespec_get(&t, TIME_UTC);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Runs the probe on the unit as its slots hold it now: whether it passed, what it found and
 * how long it took. ctx's message is kept (a probe's failure is not the caller's error). */
bool clattn__run_probe(clattn_ctx *ctx, clattn__probe_fn probe, void *unit,
                       clattn__probe_result *r, double *ms, char *detail, size_t size)
{
    memset(r, 0, sizeof *r);
    r->checked = true;
    char saved[sizeof ctx->message];
    memcpy(saved, ctx->message, sizeof saved);
    ctx->probing = true;
    const double start = now_ms();
    const clattn_status status = probe(ctx, unit, r);
    *ms = now_ms() - start;
    ctx->probing = false;
    const bool good = status == CLATTN_SUCCESS && (!r->checked || r->max_error <= r->tolerance);
    if (status != CLATTN_SUCCESS)
        snprintf(detail, size, "the probe failed to run: %.150s", ctx->message);
    else if (!r->checked)
        snprintf(detail, size, "not probed: %.140s", r->why);
    else if (!good)
        snprintf(detail, size, "max error %.3g > tolerance %.3g (%.120s)", r->max_error,
                 r->tolerance, r->why);
    else
        detail[0] = '\0';
    memcpy(ctx->message, saved, sizeof saved);
    return good;
}

/* Judges v: logs it and records it (what the probe could not check is not recorded). */
void clattn__judge(clattn_ctx *ctx, clattn_variant *v, const char *unit_name, bool good,
                  const clattn__probe_result *r, double ms, const char *detail)
{
    v->trust = good ? CLATTN__TRUST_GOOD : CLATTN__TRUST_BAD;
    const clattn_check result = !good        ? CLATTN_CHECK_FAILED
                                : !r->checked ? CLATTN_CHECK_UNCHECKED
                                              : CLATTN_CHECK_PASSED;
    char line[192];
    snprintf(line, sizeof line, "%.160s%s%s", detail[0] ? detail : v->options,
             v->fault != FAULT_NONE ? " [fault injected: " : "",
             v->fault != FAULT_NONE ? (v->fault == FAULT_WRONG ? "wrong]" : "enqueue]") : "");
    log_entry(ctx, v, unit_name, result, r, ms, line);
    if (r->checked || !good)
        write_record(ctx, v, good, detail[0] ? detail : "probe passed");
}

/* Whether every kernel is judged good already (known in this context, or recorded). */
bool clattn__judged_good(clattn_ctx *ctx, clattn_variant **vs, int count, const char *unit_name)
{
    bool all = true;
    for (int i = 0; i < count; ++i) {
        clattn_variant *v = vs[i];
        bool good = false;
        if (v->trust == CLATTN__TRUST_UNKNOWN && ctx->validate_mode == 1 && v->fault == FAULT_NONE &&
            recorded(ctx, v->key, &good)) {
            v->trust = good ? CLATTN__TRUST_GOOD : CLATTN__TRUST_BAD;
            log_entry(ctx, v, unit_name, good ? CLATTN_CHECK_RECORDED : CLATTN_CHECK_FAILED, NULL,
                      0.0, good ? "" : "recorded bad for this driver (the validation records)");
        }
        all &= v->trust == CLATTN__TRUST_GOOD;
    }
    return all;
}

