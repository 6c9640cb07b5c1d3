/* Kernel families as data (host/core/family.c). A family is one kernel program (its sources)
 * and the compile-time switches its kernels take. Its registry entry (a clattn_family,
 * declared beside the op that launches it in host/ops/) lists:
 *   - its sources: the kernels/ files after the prelude (common.cl, types.cl, params.h, the
 *     user's score functions, score.cl), in build order: a kernel's dependencies are declared
 *     here (host/core/programs.c looks the files up by name);
 *   - its switches: one X-macro list, X(MACRO, flags, "plan_info phrase"), which makes the
 *     struct of values the op fills (one `long` per switch, named as the macro), the -D build
 *     options (written in family.c and nowhere else), hence the program cache's and
 *     validation's key, and plan_info's description of the variant;
 *   - the score rule's switches it compiles in (ops/score.c's table) and extra build flags;
 *   - the tuning keys its chooser reads (for readers; docs/architecture.md lists them).
 *
 * For example (host/ops/heads.c):
 *
 *     #define COPY_SWITCHES(X) X(HEADS_WG, 0, NULL) X(SRC_DTYPE, 0, NULL) X(DST_DTYPE, 0, NULL)
 *     CLATTN_FAMILY(copy, COPY_SWITCHES, .sources = {"heads.cl"}, .tuning_keys = "heads_wg");
 *     ...
 *     const copy_switches sw = {.HEADS_WG = 256, .SRC_DTYPE = src, .DST_DTYPE = dst};
 *     clattn__family_kernel(ctx, &copy_family, "copy4d", &sw, NULL, 0, &kernel);
 *
 * A phrase is a printf format of one %ld (NULL: the switch is not described); one that starts
 * with "x " joins the one before it with a space ("64", "x 32 tiles" -> "64 x 32 tiles"), the
 * others with ", ". */
#ifndef CLATTN_CORE_FAMILY_H
#define CLATTN_CORE_FAMILY_H

#include "context.h"
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

enum { CLATTN_FAMILY_SOURCES = 3 };

struct clattn_family {
    const char *label; /* plan_info's name of the variant (NULL: its main source's name) */
    /* kernels/ files after the prelude, in build order (the unused ones NULL): the last is
     * the family's own, the ones before it sources it builds on */
    const char *sources[CLATTN_FAMILY_SOURCES];
    const clattn_switch *switches;
    size_t num_switches;
    const char *flags;       /* extra build flags, e.g. "-cl-mad-enable" ("" or NULL: none) */
    unsigned score_family;   /* ops/score.c's family bit of the score switches (0: none) */
    const char *tuning_keys; /* the tuning keys its chooser reads, space-separated */
};

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

/* The family's main source (its last; "" for the context's options) */
const char *clattn__family_file(const clattn_family *family);

/* plan_info's description: "<label> (<phrases>)", e.g. "flash.cl (64 rows, 32-key tiles)";
 * `tail` (may be NULL or "") is appended inside the parentheses after ", ". */
void clattn__family_describe(const clattn_family *family, const void *values, const char *tail,
                             char *out, size_t size);

#endif
