/* The benchmarks' clock and median (the programs in bench/): wall milliseconds from
 * CLOCK_MONOTONIC, and qsort's comparison of doubles. Define _POSIX_C_SOURCE 200809L before
 * including. */
#ifndef CLATTN_BENCH_TIME_H
#define CLATTN_BENCH_TIME_H

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

#endif /* CLATTN_BENCH_TIME_H */
