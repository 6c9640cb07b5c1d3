/* Tuning (host/core/tuning.c): the kernel parameters of a context. */
#ifndef CLATTN_CORE_TUNING_H
#define CLATTN_CORE_TUNING_H

#include "context.h"

/* Fills ctx->tuning and ctx->build_options for ctx->info. tuning_file and tuning_rows are
 * the clattn_ctx_desc fields of those names (NULL: the environment's choice; none). */
clattn_status clattn__choose_tuning(clattn_ctx *ctx, const char *tuning_file,
                                    const char *tuning_rows);

#endif
