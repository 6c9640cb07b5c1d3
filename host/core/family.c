/* Kernel families as data: build options, kernels and descriptions from a family's registry
 * entry (family.h). The only place clattn writes -D build options. */
#include "family.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Appends "-Dmacro=value" to out (used bytes in *used); false when it does not fit. */
static bool append_define(char *out, size_t size, size_t *used, const char *macro, long value)
{
    const int n = snprintf(out + *used, size - *used, "%s-D%s=%ld", *used ? " " : "", macro, value);
    if (n < 0 || (size_t)n >= size - *used)
        return false;
    *used += (size_t)n;
    return true;
}

clattn_status clattn__family_options(clattn_ctx *ctx, const clattn_family *family,
                                     const void *values, const clattn_define *defines, size_t count,
                                     char *out, size_t size)
{
    const long *v = values;
    size_t used = 0;
    bool fits = size > 0;
    if (fits)
        out[0] = '\0';
    for (size_t i = 0; fits && i < family->num_switches; ++i) {
        const clattn_switch *s = &family->switches[i];
        if (!((s->flags & CLATTN_SWITCH_OPTIONAL) && v[i] == 0))
            fits = append_define(out, size, &used, s->macro, v[i]);
    }
    for (size_t i = 0; fits && i < count; ++i)
        fits = append_define(out, size, &used, defines[i].macro, defines[i].value);
    if (fits && family->flags && family->flags[0]) {
        const int n = snprintf(out + used, size - used, "%s%s", used ? " " : "", family->flags);
        fits = n >= 0 && (size_t)n < size - used;
    }
    if (!fits)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: build options too long",
                            family->label ? family->label : clattn__family_file(family));
    return CLATTN_SUCCESS;
}

const char *clattn__family_file(const clattn_family *family)
{
    const char *file = "";
    for (size_t i = 0; i < CLATTN_FAMILY_SOURCES && family->sources[i]; ++i)
        file = family->sources[i];
    return file;
}

/* Appends to out like snprintf, truncating at size (used never passes size - 1). */
static void append(char *out, size_t size, size_t *used, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    const int n = vsnprintf(out + *used, size - *used, format, args);
    va_end(args);
    if (n > 0)
        *used = (size_t)n < size - *used ? *used + (size_t)n : size - 1;
}

void clattn__family_describe(const clattn_family *family, const void *values, const char *tail,
                             char *out, size_t size)
{
    const long *v = values;
    size_t used = 0;
    bool first = true;
    out[0] = '\0';
    append(out, size, &used, "%s (", family->label ? family->label : clattn__family_file(family));
    for (size_t i = 0; i < family->num_switches; ++i) {
        const char *phrase = family->switches[i].describe;
        if (phrase == NULL)
            continue;
        if (!first)
            append(out, size, &used, strncmp(phrase, "x ", 2) == 0 ? " " : ", ");
        append(out, size, &used, phrase, v[i]);
        first = false;
    }
    if (tail && tail[0]) {
        append(out, size, &used, "%s%s", first ? "" : ", ", tail);
    }
    append(out, size, &used, ")");
}
