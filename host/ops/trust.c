/* Self-validation's decision (core/validate.h's clattn__trust): whether a family's prepared
 * kernels may be used, probing them when nothing says so yet, and finding which kernel failed
 * by its -cl-opt-disable build. In the ops layer: it builds variants (core/programs.c) and
 * judges them (core/validate.c), and the families call it with their probes. */
#include "core/validate.h"
#include "ops.h"

#include <stdio.h>
#include <string.h>

/* The variant's -cl-opt-disable build (the usual cure for a miscompile), or NULL. */
static cl_kernel safe_build(clattn_ctx *ctx, const clattn_variant *v)
{
    char options[sizeof v->options], name[sizeof v->name];
    if (strstr(v->options, "-cl-opt-disable") ||
        snprintf(options, sizeof options, "%s -cl-opt-disable", v->options) >= (int)sizeof options)
        return NULL;
    snprintf(name, sizeof name, "%s", v->name);
    const clattn_family *family = v->family;
    char saved[sizeof ctx->message];
    memcpy(saved, ctx->message, sizeof saved);
    cl_kernel safe = NULL;
    if (clattn__variant_kernel(ctx, family, name, options, &safe) != CLATTN_SUCCESS)
        safe = NULL; /* (the build failure is logged and recorded) */
    memcpy(ctx->message, saved, sizeof saved);
    return safe;
}

clattn_status clattn__trust(clattn_ctx *ctx, const char *unit_name, cl_kernel *const *slots,
                            int count, clattn__probe_fn probe, void *unit)
{
    enum { MOST = 4 };
    if (ctx->validate_mode == 0 || ctx->probing || count > MOST)
        return CLATTN_SUCCESS;
    clattn_variant *vs[MOST];
#define RESOLVE()                                                                                  \
    for (int j = 0; j < count; ++j)                                                                \
        if ((vs[j] = clattn__variant_of(ctx, *slots[j])) == NULL)                                  \
            return CLATTN_SUCCESS; /* not a cached variant: nothing to judge it by */
    RESOLVE();
    if (clattn__judged_good(ctx, vs, count, unit_name))
        return CLATTN_SUCCESS;
    clattn__probe_result r;
    double ms = 0.0;
    char detail[192] = "", first[192] = "";
    bool any_bad = false;
    for (int i = 0; i < count; ++i)
        any_bad |= vs[i]->trust == CLATTN__TRUST_BAD;
    if (!any_bad) {
        const bool good = clattn__run_probe(ctx, probe, unit, &r, &ms, detail, sizeof detail);
        for (int i = 0; i < count && good; ++i)
            if (vs[i]->trust == CLATTN__TRUST_UNKNOWN)
                clattn__judge(ctx, vs[i], unit_name, true, &r, ms, detail);
        if (good)
            return CLATTN_SUCCESS;
        snprintf(first, sizeof first, "%s", detail);
    }
    /* The culprit: the kernel whose -cl-opt-disable build alone makes the unit pass. */
    for (int i = 0; i < count; ++i) {
        if (vs[i]->trust == CLATTN__TRUST_GOOD)
            continue;
        const cl_kernel original = *slots[i];
        const cl_kernel safe = safe_build(ctx, vs[i]);
        RESOLVE();
        clattn_variant *bad = vs[i];
        if (safe == NULL)
            continue;
        *slots[i] = safe;
        RESOLVE();
        if (vs[i]->trust != CLATTN__TRUST_BAD &&
            clattn__run_probe(ctx, probe, unit, &r, &ms, detail, sizeof detail)) {
            if (bad->trust != CLATTN__TRUST_BAD) {
                const clattn__probe_result none = {.checked = true};
                clattn__judge(ctx, bad, unit_name, false, &none, 0.0, first);
            }
            for (int j = 0; j < count; ++j)
                if (vs[j]->trust == CLATTN__TRUST_UNKNOWN)
                    clattn__judge(ctx, vs[j], unit_name, true, &r, ms, detail);
            return CLATTN_SUCCESS;
        }
        *slots[i] = original;
        RESOLVE();
    }
    /* Nothing cured it: the first kernel not judged good takes the blame. */
    clattn_variant *bad = vs[0];
    for (int i = 0; i < count; ++i)
        if (vs[i]->trust != CLATTN__TRUST_GOOD) {
            bad = vs[i];
            break;
        }
    if (bad->trust != CLATTN__TRUST_BAD) {
        const clattn__probe_result none = {.checked = true};
        clattn__judge(ctx, bad, unit_name, false, &none, 0.0, first);
    }
#undef RESOLVE
    return clattn__fail(ctx, CLATTN_ERR_UNTRUSTED,
                        "%s: variant %s failed validation on %s (%s); its -cl-opt-disable build "
                        "too",
                        unit_name, bad->key, ctx->info.name,
                        first[0] ? first : "recorded bad for this driver");
}
