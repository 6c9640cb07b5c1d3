/* Fault injection (host/core/fault.c, test builds only). Built with -DCLATTN_FAULT_INJECTION
 * (the clattn_fault test library, never the shipped one), the N-th device allocation, command
 * enqueue or program build after clattn__fault_arm fails as if the OpenCL call had.
 * Process-wide counters: a test-only exception to "no global state". status.h includes this
 * header, so every file that reports OpenCL errors can plant them. */
#ifndef CLATTN_CORE_FAULT_H
#define CLATTN_CORE_FAULT_H

#include "clattn.h"

#include <stdbool.h>

typedef enum clattn_fault_kind {
    CLATTN_FAULT_ALLOC = 0, /* clCreateBuffer */
    CLATTN_FAULT_ENQUEUE,   /* clEnqueueNDRangeKernel, read/write buffer, marker */
    CLATTN_FAULT_BUILD,     /* clBuildProgram */
    CLATTN_FAULT_KINDS
} clattn_fault_kind;

#ifdef CLATTN_FAULT_INJECTION
/* True when this call of `kind` is the one armed to fail. */
bool clattn__fault(clattn_fault_kind kind);
/* Arms `kind` to fail its n-th call from now (n = 0: never) and resets its counter. */
CLATTN_API void clattn__fault_arm(clattn_fault_kind kind, long n);
/* Calls of `kind` since it was last armed. */
CLATTN_API long clattn__fault_calls(clattn_fault_kind kind);
#else
#define clattn__fault(kind) false
#endif

#endif
