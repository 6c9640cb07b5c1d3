/* Tuning (host/core/tuning.c): the kernel parameters of a context. */
#ifndef CLATTN_CORE_TUNING_H
#define CLATTN_CORE_TUNING_H

#include "context.h"

/* Fills ctx->tuning and ctx->build_options for ctx->info. tuning_file and tuning_rows are
 * the clattn_ctx_desc fields of those names (NULL: the environment's choice; none). */
clattn_status clattn__choose_tuning(clattn_ctx *ctx, const char *tuning_file,
                                    const char *tuning_rows);

/* The tuning of an attention problem with heads of head_dim (q's and k's), q of dtype, one
 * query row per head (decode) or more: the context's row with the records that select it
 * applied, least specific first (a record with more selectors wins). `applied` lists them
 * ("none" when a combination the kernels refuse drops them). */
void clattn__tuning_for(clattn_ctx *ctx, size_t head_dim, clattn_dtype dtype, bool decode,
                        clattn_tuning *out, char *applied, size_t applied_size);

#endif
