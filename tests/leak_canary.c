/*
 * leak_canary: creates a clattn context and deliberately never releases it, so that under
 * -DCLATTN_SANITIZE=ON LeakSanitizer must report the leak with clattn's allocating frame. It
 * proves that tests/lsan.supp, which silences what the OpenCL implementations leak, does not
 * also silence clattn's own leaks. Registered (sanitized builds only) with a pass expression
 * on that report. Exits 77 without an OpenCL device.
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

int main(void)
{
    return leak_one_context();
}
