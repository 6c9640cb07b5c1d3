/* The runtime of host/core, for the files of host/ that build and launch kernels: one header per
 * concern, included here together.
 *   device.h    device choice, the device's limits and driver key (device.c)
 *   programs.h  the program cache and variant builds (programs.c)
 *   launch.h    kernel launches, event chains, entry checks, the workspace (launch.c)
 *   status.h    errors and overflow-checked sizes (status.c), fault.h's injection (fault.c)
 * The public context API (create, release, getters, trace) is context.c's, declared in
 * clattn.h; the context's data is context.h. */
#ifndef CLATTN_CORE_RUNTIME_H
#define CLATTN_CORE_RUNTIME_H

#include "context.h"
#include "device.h"
#include "launch.h"
#include "programs.h"
#include "status.h"

#endif
