/* Trust in kernel variants on the user's device (host/core/validate.c): the first time a plan
 * would use a program variant, the family's probe runs it on a small random problem against a
 * float64 host reference; a variant that fails is not used (its -cl-opt-disable build is tried,
 * then the family's next variant), and the outcome is recorded per driver in a file next to the
 * tuning cache, so that later processes on the same driver pay nothing. */
#ifndef CLATTN_CORE_VALIDATE_H
#define CLATTN_CORE_VALIDATE_H

#include "context.h"
#include "status.h"

/* What a probe found: checked false when the probe could not compare (features it does not
 * model: the variant is then used unprobed and logged CLATTN_CHECK_UNCHECKED); else the largest
 * error against the reference and the tolerance it was held to. why: the failing step or
 * element, or what was left unchecked. */
typedef struct clattn__probe_result {
    bool checked;
    double max_error, tolerance;
    char why[160];
} clattn__probe_result;

/* Runs the unit (a family's prepared plan, with the kernels trusted below in place) on the
 * probe's problem. A status other than success (an enqueue refused, a build) fails the unit. */
typedef clattn_status (*clattn__probe_fn)(clattn_ctx *ctx, void *unit, clattn__probe_result *r);

/* A variant's standing in its context (clattn_variant.trust). */
enum { CLATTN__TRUST_UNKNOWN = 0, CLATTN__TRUST_GOOD, CLATTN__TRUST_BAD, CLATTN__TRUST_PROBING };

/* Whether the kernels in slots[0 .. count) may be used (host/ops/trust.c): passes when validation is off, when
 * each is known good in this context or recorded good for this driver (first-use mode), or
 * when the probe passes. On a failure each failing kernel's slot is replaced by its
 * -cl-opt-disable build and the probe runs again; if that fails too the result is
 * CLATTN_ERR_UNTRUSTED with a message naming the variant, and the caller takes its family's
 * next variant. `unit` names the probe in the log ("flash attention", "matmul"). While a
 * probe runs, nested plans of the probe trust everything (no recursion). */
clattn_status clattn__trust(clattn_ctx *ctx, const char *unit_name, cl_kernel *const *slots,
                            int count, clattn__probe_fn probe, void *unit);

/* The steps clattn__trust takes (validate.c). The variant built as `kernel` (NULL: none). */
clattn_variant *clattn__variant_of(clattn_ctx *ctx, cl_kernel kernel);
/* Runs the probe on the unit as its slots hold it now: whether it passed, what it found, its
 * time and a detail (what failed; "" when it passed); ctx's message is kept. */
bool clattn__run_probe(clattn_ctx *ctx, clattn__probe_fn probe, void *unit,
                       clattn__probe_result *r, double *ms, char *detail, size_t size);
/* Judges v good or bad: logs it and records it (what the probe could not check is not). */
void clattn__judge(clattn_ctx *ctx, clattn_variant *v, const char *unit_name, bool good,
                   const clattn__probe_result *r, double ms, const char *detail);
/* Whether every kernel is judged good already (in this context, or recorded for this driver
 * in first-use mode: those are logged CLATTN_CHECK_RECORDED). */
bool clattn__judged_good(clattn_ctx *ctx, clattn_variant **vs, int count, const char *unit_name);

/* A build (or kernel creation) of a variant failed: logs and records it as failed. */
void clattn__note_build_failure(clattn_ctx *ctx, const clattn_variant *v, clattn_status status);

/* The variant's key "<file>:<kernel>@<16 hex digits>" (the hash of its options, the user's
 * score functions, texts_hash: the library's kernel texts it is built from, and any injected
 * fault) and its fault, from CLATTN_FAULT_VARIANT. */
void clattn__variant_identity(const clattn_ctx *ctx, const char *file, uint64_t texts_hash,
                              clattn_variant *v);

/* Whether `kernel` carries an injected enqueue fault (CLATTN_FAULT_VARIANT=...:enqueue). */
bool clattn__kernel_faulted(const clattn_ctx *ctx, cl_kernel kernel);

/* CLATTN_VALIDATE into ctx->validate_mode; false (with the message) for an unknown value. */
bool clattn__validate_mode_from_env(clattn_ctx *ctx);

/* Whether the status is one a family's next variant may cure (a build, a refused enqueue, a
 * failed validation) rather than the caller's error. */
bool clattn__variant_fallible(clattn_status status);

/* Whether `judged` is `built` or its -cl-opt-disable build (a probe that prepared its own plan
 * then runs the judged kernel in its place). */
bool clattn__same_variant(const clattn_ctx *ctx, cl_kernel judged, cl_kernel built);

void clattn__validation_release(clattn_ctx *ctx);

#endif
