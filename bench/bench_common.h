/* What the C benchmarks share: a monotonic clock and the comparison qsort takes for medians. */
#ifndef CLATTN_BENCH_COMMON_H
#define CLATTN_BENCH_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Milliseconds on CLOCK_MONOTONIC (needs _POSIX_C_SOURCE >= 199309L before any include). */
static inline double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* qsort's ascending order of doubles. */
static inline int compare(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A size option of a benchmark: its flag and the field it sets. */
typedef struct bench_size_option {
    const char *flag;
    size_t *field;
} bench_size_option;

/* `--flag value` pairs: each size (>= 1) into its field, --device into *device; an unknown flag,
 * a size of 0 or a flag without a value: one line naming `program` and exit 2. */
static inline void bench_parse(const char *program, int argc, char **argv,
                               const bench_size_option *options, size_t count, const char **device)
{
    for (int i = 1; i < argc; i += 2) {
        const char *name = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        size_t *field = NULL;
        for (size_t o = 0; o < count && field == NULL; ++o)
            if (strcmp(name, options[o].flag) == 0)
                field = options[o].field;
        if (value && strcmp(name, "--device") == 0) {
            *device = value;
        } else if (value == NULL || field == NULL || (*field = strtoull(value, NULL, 10)) == 0) {
            fprintf(stderr, "%s: bad option %s %s (see the file's head)\n", program, name,
                    value ? value : "(no value)");
            exit(2);
        }
    }
}

#endif
