/* What the C benchmarks share: a monotonic clock and the comparison qsort takes for medians. */
#ifndef CLATTN_BENCH_COMMON_H
#define CLATTN_BENCH_COMMON_H

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

#endif
