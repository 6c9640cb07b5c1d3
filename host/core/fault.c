/* Fault injection (host/core, test builds only): with -DCLATTN_FAULT_INJECTION (the
 * clattn_fault test library) the N-th device allocation, command enqueue or program build after
 * clattn__fault_arm fails as if the OpenCL call had (fault.h). The shipped library has none of
 * it: clattn__fault is the constant false there. */
#include "fault.h"

#ifdef CLATTN_FAULT_INJECTION
static long fault_target[CLATTN_FAULT_KINDS];
static long fault_calls[CLATTN_FAULT_KINDS];

bool clattn__fault(clattn_fault_kind kind)
{
    return ++fault_calls[kind] == fault_target[kind];
}

void clattn__fault_arm(clattn_fault_kind kind, long n)
{
    fault_target[kind] = n;
    fault_calls[kind] = 0;
}

long clattn__fault_calls(clattn_fault_kind kind)
{
    return fault_calls[kind];
}
#endif
