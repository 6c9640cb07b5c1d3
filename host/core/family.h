/* Kernel families as data (host/core/family.c). A family is one kernel source program and the
 * compile-time switches its kernels take; its registry entry (a clattn_family, declared beside
 * the op that launches it in host/ops/) lists:
 *   - its sources: the kernels/ files after the prelude (common.cl, types.cl, params.h,
 *     score.cl), in build order, so a kernel's dependencies are declared here, not in a table;
 *   - its switches: one X-macro list, X(MACRO, flags, "plan_info phrase"), which makes the
 *     struct of values the op fills (one `long` per switch, named as the macro), the -D build
 *     options (built here and nowhere else), hence the program-cache and validation key, and
 *     plan_info's description of the variant;
 *   - the score rule's switches it compiles in (ops/score.c's table) and extra build flags;
 *   - the tuning keys its chooser reads (for plan_info readers and docs/architecture.md).
 *
 * A family's switch list, e.g.
 *
 *     #define HEADS_COPY_SWITCHES(X) X(HEADS_WG, 0, NULL) X(SRC_DTYPE, 0, NULL) ...
 *     CLATTN_SWITCHES(heads_copy_switches, HEADS_COPY_SWITCHES);
 *
 * declares `heads_copy_switches` (a struct of longs) and its table; the entry names the table
 * with CLATTN_FAMILY_SWITCHES(heads_copy_switches). The phrase is a printf format of one %ld,
 * NULL when the switch is not described; a phrase that starts with "x " joins the one before
 * it with a space ("64", "x 32 tiles" -> "64 x 32 tiles"), the others with ", ". */
#ifndef CLATTN_CORE_FAMILY_H
#define CLATTN_CORE_FAMILY_H

#include "context.h"
#include "runtime.h"
#include "status.h"

#include <stddef.h>

enum {
    CLATTN_SWITCH_OPTIONAL = 1 /* left out of the options when 0 (the kernel's default) */
};

typedef struct clattn_switch {
    const char *macro;
    unsigned flags;
    const char *describe;
} clattn_switch;

/* A -D definition that is not one of the family's own switches (the score rule's, from
 * ops/score.c's table). */
typedef struct clattn_define {
    const char *macro;
    long value;
} clattn_define;
enum { CLATTN_DEFINES_MAX = 24 };

typedef struct clattn_family {
    const char *label;      /* plan_info's name of the variant, e.g. "flash.cl" */
    clattn_source source;   /* the program cache's source (host/core/runtime.c) */
    const char *sources[3]; /* kernels/ files after the prelude, in order (NULL-ended) */
    const clattn_switch *switches;
    size_t num_switches;
    const char *flags;       /* extra build flags, e.g. "-cl-mad-enable" ("" or NULL: none) */
    unsigned score_family;   /* ops/score.c's family bit of the score switches (0: none) */
    const char *tuning_keys; /* the tuning keys its chooser reads, space-separated */
} clattn_family;

#define CLATTN__SWITCH_FIELD(macro, flags, describe) long macro;
#define CLATTN__SWITCH_ROW(macro, flags, describe) {#macro, flags, describe},
/* Declares the struct `type` (one long per switch, named as its macro) and its table. */
#define CLATTN_SWITCHES(type, LIST)                                                                \
    typedef struct type {                                                                          \
        LIST(CLATTN__SWITCH_FIELD)                                                                 \
    } type;                                                                                        \
    static const clattn_switch type##_table[] = {LIST(CLATTN__SWITCH_ROW)};                        \
    _Static_assert(sizeof(type) == sizeof type##_table / sizeof type##_table[0] * sizeof(long),    \
                   #type ": one long per switch")
/* Declares family `name`: its switch struct name##_switches (from LIST, as CLATTN_SWITCHES)
 * and its entry name##_family, the rest of the entry's fields given as designated
 * initialisers. */
#define CLATTN_FAMILY(name, LIST, ...)                                                             \
    CLATTN_SWITCHES(name##_switches, LIST);                                                        \
    static const clattn_family name##_family = {CLATTN_FAMILY_SWITCHES(name##_switches),           \
                                                __VA_ARGS__}
#define CLATTN_FAMILY_SWITCHES(type)                                                               \
    .switches = type##_table, .num_switches = sizeof type##_table / sizeof type##_table[0]

/* The build options of `family` for `values` (its switch struct, as longs) and `defines` (may
 * be NULL when count is 0): "-DMACRO=value ..." in the list's order, then the defines, then the
 * family's flags. Fails (CLATTN_ERR_INVALID_ARGUMENT naming the family) when they do not fit. */
clattn_status clattn__family_options(clattn_ctx *ctx, const clattn_family *family,
                                     const void *values, const clattn_define *defines, size_t count,
                                     char *out, size_t size);

/* Kernel `kernel` of `family` built with those switches, cached per context (the options are
 * the cache key). */
static inline clattn_status clattn__family_kernel(clattn_ctx *ctx, const clattn_family *family,
                                                  const char *kernel, const void *values,
                                                  const clattn_define *defines, size_t count,
                                                  cl_kernel *out)
{
    char options[sizeof ctx->variants[0].options];
    const clattn_status status =
        clattn__family_options(ctx, family, values, defines, count, options, sizeof options);
    return status != CLATTN_SUCCESS
               ? status
               : clattn__variant_kernel(ctx, family->source, kernel, options, out);
}

/* The same, in *out only when the compiled kernel runs work-groups of `items` work-items;
 * else *out is NULL (register pressure: the caller shrinks the group or takes another
 * variant). */
static inline clattn_status clattn__family_fits(clattn_ctx *ctx, const clattn_family *family,
                                                const char *kernel, const void *values,
                                                const clattn_define *defines, size_t count,
                                                size_t items, cl_kernel *out)
{
    char options[sizeof ctx->variants[0].options];
    const clattn_status status =
        clattn__family_options(ctx, family, values, defines, count, options, sizeof options);
    return status != CLATTN_SUCCESS
               ? status
               : clattn__variant_fits(ctx, family->source, kernel, options, items, out);
}

/* plan_info's description: "<label> (<phrases>)", e.g. "flash.cl (64 rows, 32-key tiles)";
 * `tail` (may be NULL or "") is appended inside the parentheses after ", ". */
void clattn__family_describe(const clattn_family *family, const void *values, const char *tail,
                             char *out, size_t size);

#endif
