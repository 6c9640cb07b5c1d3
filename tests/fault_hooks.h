/*
 * The test-only hooks that the clattn_fault library (the library built with
 * -DCLATTN_FAULT_INJECTION, CMakeLists.txt; never the shipped one) exports, declared here so
 * that a test needs none of host/'s private headers. They mirror host/core/status.h's fault
 * injection section: keep the kinds in the same order (the library reads them as numbers).
 */
#ifndef CLATTN_TESTS_FAULT_HOOKS_H
#define CLATTN_TESTS_FAULT_HOOKS_H

#include "clattn.h"

typedef enum clattn_fault_kind {
    CLATTN_FAULT_ALLOC = 0, /* clCreateBuffer */
    CLATTN_FAULT_ENQUEUE,   /* clEnqueueNDRangeKernel, read/write buffer, marker */
    CLATTN_FAULT_BUILD,     /* clBuildProgram */
    CLATTN_FAULT_KINDS
} clattn_fault_kind;

/* Arms `kind` to fail its n-th call from now (n = 0: never) and resets its counter. */
CLATTN_API void clattn__fault_arm(clattn_fault_kind kind, long n);
/* Calls of `kind` since it was last armed. */
CLATTN_API long clattn__fault_calls(clattn_fault_kind kind);

#endif /* CLATTN_TESTS_FAULT_HOOKS_H */
