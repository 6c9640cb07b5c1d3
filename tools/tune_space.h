/*
 * The search space of `clattn tune` (tools/cmd_tune.c), made from the one list of tuning keys
 * (host/tuning/keys.h: CLATTN_TUNING_KEYS; its columns op, class, when, values and quick):
 *
 *     op:      the op whose timing decides the key: matmul, softmax (the unfused attention
 *              path with its weights) or flash (the fused attention kernel); "": not searched
 *     class:   the devices it is searched on: cpu, gpu or any (the device's type)
 *     when:    "" or "key=value": searched only while the current best has that value (a
 *              key of another kernel variant is not searched where that variant is not used)
 *     key:     the tuning key
 *     values:  the candidates, space-separated
 *     quick:   the candidates under --quick ("": the key is not searched then)
 *
 * Candidates the device or the kernels refuse (limits, a key this library does not know) are
 * reported and skipped, so a line may list values that fit only some devices. Keys are tried
 * in the order of the list (coordinate descent: tools/cmd_tune.c).
 */
#ifndef CLATTN_TUNE_SPACE_H
#define CLATTN_TUNE_SPACE_H

#include "../host/tuning/keys.h"

typedef struct tune_space_key {
    const char *op, *class_name, *when, *key, *values, *quick;
} tune_space_key;

#define CLATTN_TUNE_SPACE_ROW(name, scope, lo, hi, op, cls, when, values, quick, doc)           \
    {op, cls, when, #name, values, quick},
static const tune_space_key tune_space[] = {CLATTN_TUNING_KEYS(CLATTN_TUNE_SPACE_ROW)};
#undef CLATTN_TUNE_SPACE_ROW

#endif
