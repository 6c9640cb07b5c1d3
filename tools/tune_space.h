/*
 * The search space of `clattn tune` (tools/cmd_tune.c): the library's one list of tuning keys
 * (host/tuning/keys.h: CLATTN_TUNING_KEYS), read through the public API
 * (clattn_tuning_key_get), its columns op, class, when, values and quick:
 *
 *     op:      the op whose timing decides the key: matmul, softmax (the unfused attention
 *              path with its weights), flash (the fused attention kernel) or backward (the
 *              training backward, after the fused forward); "": not searched
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

#include "clattn.h"

#include <stddef.h>

typedef struct tune_space_key {
    const char *op, *class_name, *when, *key, *values, *quick;
} tune_space_key;

/* The most keys the search holds (the library keeps a bit per key in 64). */
enum { TUNE_MAX_KEYS = 64 };

/* Fills space with the library's keys in their order: their count, or 0 when the library
 * has more than TUNE_MAX_KEYS or refuses one. */
static inline size_t tune_space_load(tune_space_key space[TUNE_MAX_KEYS])
{
    const size_t count = clattn_tuning_key_count();
    if (count > TUNE_MAX_KEYS)
        return 0;
    for (size_t i = 0; i < count; ++i) {
        clattn_tuning_key_info info = {.struct_size = sizeof info};
        if (clattn_tuning_key_get(i, &info) != CLATTN_SUCCESS)
            return 0;
        space[i] = (tune_space_key){info.op,   info.device_class, info.when,
                                    info.name, info.values,       info.quick};
    }
    return count;
}

#endif
