/* Launches, event chains, entry checks and the workspace (host/core/launch.c). */
#ifndef CLATTN_CORE_LAUNCH_H
#define CLATTN_CORE_LAUNCH_H

#include "context.h"

enum { CLATTN_TRACE_MAX = 4096 }; /* kernels a trace keeps (clattn_ctx_trace_kernels) */

/* The launch context of one public call, passed down explicitly to every op and kernel launch
 * (clattn_ctx holds no per-call state): the queue the call enqueues on (the context's, or the
 * caller's for clattn_plan_execute), whether that queue may reorder commands, whether the call
 * works only in the caller's workspace (no ordering with other calls then), and the event
 * chain of its steps: each launch waits for the previous one, so plans work on out-of-order
 * queues too; the first waits for the caller's list. Made by clattn__begin, finished by
 * clattn__end. */
typedef struct clattn_chain {
    clattn_ctx *ctx;
    cl_command_queue queue;
    bool out_of_order;
    bool private_workspace;
    cl_uint num_wait;
    const cl_event *wait;
    cl_event last;
} clattn_chain;

/* Makes `event` (a step's completion event) the one the next step waits for. */
void clattn__chain_push(clattn_chain *chain, cl_event event);

/* Public entry points wrap their work in begin/end. begin makes the launch context: on `queue`
 * (NULL: the context's; another one must belong to the context's cl_context and device),
 * private_workspace when the call uses only the caller's workspace. On an out-of-order queue,
 * or another queue than the previous call's, begin makes the call's first step also wait for
 * the previous call's work (the context's workspace is shared), and end remembers the call's
 * last event. end hands the final event to `event` on success and returns status; on failure
 * it makes sure the message starts with `op`, so that an error from an inner step still names
 * the call the user made. */
clattn_status clattn__begin(clattn_ctx *ctx, const char *op, clattn_chain *chain,
                            cl_command_queue queue, bool private_workspace, cl_uint num_wait,
                            const cl_event *wait);
clattn_status clattn__end(const char *op, clattn_chain *chain, clattn_status status,
                          cl_event *event);
/* On failure, makes sure the message starts with "op: "; returns status. */
clattn_status clattn__end_message(clattn_ctx *ctx, const char *op, clattn_status status);

/* A kernel argument: size and pointer to its value (value NULL with size sizeof(cl_mem) passes a
 * NULL buffer). */
typedef struct clattn_arg {
    size_t size;
    const void *value;
} clattn_arg;
#define CLATTN_ARG(x) ((clattn_arg){sizeof(x), &(x)})

/* Sets the arguments and enqueues `kernel` on the call's queue after its chain's last step;
 * the launch becomes the chain's last step. */
clattn_status clattn__launch_kernel(clattn_chain *chain, cl_kernel kernel, const char *name,
                                    const clattn_arg *args, cl_uint num_args, cl_uint dims,
                                    const size_t *global, const size_t *local);

/* The first checks of every public device call: clears *event and the last error, and refuses
 * a NULL ctx or desc and a wait list that does not match num_wait. */
clattn_status clattn__entry(clattn_ctx *ctx, const char *op, const void *desc, cl_uint num_wait,
                            const cl_event *wait, cl_event *event);

/* Checks that no dimension is 0 (limits false), or, once the sizes are known not to overflow,
 * that each fits the kernels' 32-bit indices (limits true). */
clattn_status clattn__check_dims(clattn_ctx *ctx, const char *op, const size_t *dims,
                                 const char *const *names, int count, bool limits);

/* Checks that tensor `t` (named `name` in messages of op `op`) is present when required, and
 * that its buffer holds `offset + elems` elements of `elem_size` bytes. An absent optional
 * tensor passes. */
clattn_status clattn__check_tensor(clattn_ctx *ctx, const char *op, const char *name,
                                   clattn_tensor t, size_t elems, size_t elem_size, bool required);

/* A device buffer of at least `bytes` in workspace slot `slot` (grown, never shrunk); `op`
 * names the caller in messages. */
clattn_status clattn__workspace(clattn_ctx *ctx, const char *op, clattn_ws_slot slot, size_t bytes,
                                cl_mem *out);

/* *out = product of count sizes; false on overflow. */
bool clattn__product(size_t *out, int count, ...);

/* Rounds value up to a multiple of step (step > 0); false on overflow. */
bool clattn__round_up(size_t value, size_t step, size_t *out);

#endif
