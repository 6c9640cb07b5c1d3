/* The benchmarks' shared helpers: a monotonic clock in ms and a qsort comparison of doubles
 * (for medians). Header only: each bench is one program. */
#ifndef CLATTN_BENCH_UTIL_H
#define CLATTN_BENCH_UTIL_H

#include <time.h>

static inline double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static inline int compare(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
