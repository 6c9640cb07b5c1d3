/*
 * leak_canary: creates a clattn context and deliberately never releases it, so that under
 * -DCLATTN_SANITIZE=ON LeakSanitizer must report the leak with clattn's allocating frame. It
 * proves that tests/lsan.supp, which silences what the OpenCL implementations leak, does not
 * also silence clattn's own leaks. Registered (sanitized builds only) with a pass expression
 * on that report. Exits 77 without an OpenCL device.
 *
 * LeakSanitizer is conservative: a stale copy of the pointer anywhere it scans (a dead stack
 * slot inside the live part of the stack at exit, a freed block that an OpenCL
 * implementation's thread took again without overwriting it) makes the context "reachable".
 * With one context that happened in about 1 run of 4 (a CI failure; 10 of 40 runs here), so
 * the canary leaks several contexts, each from its own call, and scrubs the stack after each:
 * the pass expression needs one report.
 */
#include <stdio.h>

#include "clattn.h"

/* A separate, non-inlined function, so that no live stack slot of main still points at the
 * context when the leak check runs at exit. */
__attribute__((noinline)) static int leak_one_context(void)
{
    clattn_ctx *ctx = NULL;
    char message[256];
    if (clattn_ctx_create(NULL, &ctx, message, sizeof message) != CLATTN_SUCCESS) {
        printf("leak_canary: no context (%s): skipped\n", message);
        return 77;
    }
    puts("leak_canary: a clattn context is left unreleased on purpose");
    ctx = NULL;
    return 0;
}

/* Overwrites the dead stack below the caller's frame, where leak_one_context's frames were. */
__attribute__((noinline)) static void scrub_stack(void)
{
    volatile unsigned char area[16384];
    for (size_t i = 0; i < sizeof area; i++)
        area[i] = 0;
}

enum { CANARY_CONTEXTS = 4 };

int main(void)
{
    for (int i = 0; i < CANARY_CONTEXTS; i++) {
        int status = leak_one_context();
        if (status != 0)
            return status;
        scrub_stack();
    }
    return 0;
}
