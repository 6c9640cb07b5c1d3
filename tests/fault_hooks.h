/*
 * The test-only hooks that the clattn_fault library (the library built with
 * -DCLATTN_FAULT_INJECTION, CMakeLists.txt; never the shipped one) exports, declared here so
 * that a test needs none of host/'s private headers. They mirror host/core/status.h's fault
 * injection section: keep the kinds' numbers the same.
 */
#ifndef CLATTN_TESTS_FAULT_HOOKS_H
#define CLATTN_TESTS_FAULT_HOOKS_H

#include "clattn.h"

/* The kinds of call that can be made to fail, by number (host/core/status.h's enum). */
typedef int clattn_fault_kind;
#define CLATTN_FAULT_ALLOC 0   /* clCreateBuffer */
#define CLATTN_FAULT_ENQUEUE 1 /* clEnqueueNDRangeKernel, read/write buffer, marker */
#define CLATTN_FAULT_BUILD 2   /* clBuildProgram */
#define CLATTN_FAULT_KINDS 3

/* Arms `kind` to fail its n-th call from now (n = 0: never) and resets its counter. */
CLATTN_API void clattn__fault_arm(clattn_fault_kind kind, long n);
/* Calls of `kind` since it was last armed. */
CLATTN_API long clattn__fault_calls(clattn_fault_kind kind);

#endif /* CLATTN_TESTS_FAULT_HOOKS_H */
