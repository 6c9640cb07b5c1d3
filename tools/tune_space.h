/*
 * The search space of `clattn tune` (tools/cmd_tune.c): data only, one line per tunable key of
 * the tuning table (host/core/context.h: CLATTN_TUNING_KEYS). A new key is
 * one line here:
 *
 *     op:      the op whose timing decides the key: matmul, softmax (the unfused attention
 *              path with its weights) or flash (the fused attention kernel)
 *     class:   the devices it is searched on: cpu, gpu or any (the device's type)
 *     when:    "" or "key=value": searched only while the current best has that value (a
 *              key of another kernel variant is not searched where that variant is not used)
 *     key:     the tuning key
 *     values:  the candidates, space-separated
 *     quick:   the candidates under --quick ("": the key is not searched then)
 *
 * Candidates the device or the kernels refuse (limits, a key this library does not know) are
 * reported and skipped, so a line may list values that fit only some devices. Keys are tried
 * in the order of the lines (coordinate descent: tools/cmd_tune.c).
 */
#ifndef CLATTN_TUNE_SPACE_H
#define CLATTN_TUNE_SPACE_H

typedef struct tune_space_key {
    const char *op, *class_name, *when, *key, *values, *quick;
} tune_space_key;

static const tune_space_key tune_space[] = {
    /* op       class  when            key             values                 quick */
    {"matmul", "any", "", "matmul_vec", "0 1", ""},
    {"matmul", "any", "matmul_vec=1", "vec_rm", "2 3 4 5 6 7 8", "4"},
    {"matmul", "any", "matmul_vec=1", "vec_width", "4 8 16", ""},
    {"matmul", "any", "matmul_vec=1", "vec_nv", "1 2 3 4 6 8", ""},
    {"matmul", "any", "matmul_vec=1", "vec_rb", "1 2 4 8 16", ""},
    {"matmul", "any", "matmul_vec=1", "vec_kc", "64 128 256 512 1024 4096", "128"},
    {"matmul", "any", "matmul_vec=1", "vec_wg", "1 2 4 8 16 32", "4"},
    {"matmul", "any", "matmul_vec=1", "vec_stream", "0 4096 16384 65536", ""},
    {"matmul", "any", "matmul_vec=0", "tile_m", "16 32 64 128", "32"},
    {"matmul", "any", "matmul_vec=0", "tile_n", "16 32 64 128", "32"},
    {"matmul", "any", "matmul_vec=0", "tile_k", "8 16 32", "32"},
    {"matmul", "any", "matmul_vec=0", "wpt_m", "1 2 4 8", ""},
    {"matmul", "any", "matmul_vec=0", "wpt_n", "1 2 4 8", ""},
    {"softmax", "any", "", "softmax_rows", "0 1 2 4 8 16 32", "2 8"},
    {"softmax", "any", "softmax_rows=0", "softmax_wg", "1 4 16 64 128 256", "16 64"},
    {"flash", "any", "", "flash_cpu", "0 1", ""},
    {"flash", "any", "flash_cpu=1", "flash_cpu_rb", "2 3 4 5 6 7 8", "4"},
    {"flash", "any", "flash_cpu=1", "flash_cpu_nb", "1 2 4 8 16 32", "4"},
    {"flash", "any", "flash_cpu=1", "flash_cpu_kv", "1 2 4", ""},
    {"flash", "gpu", "flash_cpu=0", "flash_gpu", "0 1", ""},
    {"flash", "gpu", "flash_gpu=1", "fg_bq", "16 32 64 128", ""},
    {"flash", "gpu", "flash_gpu=1", "fg_bk", "16 32 64", ""},
    {"flash", "gpu", "flash_gpu=1", "fg_tx", "8 16 32", ""},
    {"flash", "gpu", "flash_gpu=1", "fg_ty", "4 8 16", ""},
    {"flash", "any", "flash_cpu=0", "flash_rows", "16 32 64 128 256", "32"},
    {"flash", "any", "flash_cpu=0", "flash_vw", "1 4 8", "4"},
    /* heads_wg (head split/merge copies of the unfused MHA path) is not searched: no op here
     * times it. */
};

#endif
