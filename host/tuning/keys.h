/*
 * The tuning keys: one line each, the only list of them. It makes clattn_tuning's fields
 * (host/core/context.h), the row parser's key table, the range checks and the summary
 * (host/core/tuning.c), and the public list of clattn_tuning_key_get (`clattn tune`'s search
 * space, tools/tune_space.h). A new key is one line here (its default in tuning.c's
 * default_row; rules that tie it to other keys in check_row; its name in check_tune's
 * known_keys). The columns:
 *
 *     name     the key, a field of clattn_tuning
 *     scope    DEVICE: one value per context (it goes into the programs' build options or
 *              shapes every op); PROBLEM: a row with selectors (@head_dim=, @dtype=,
 *              @phase=) may set it for the attention problems it selects (host/core/tuning.c)
 *     lo, hi   the values a row may give (more rules in check_row)
 *     op       `clattn tune`: the op whose timing decides the key (matmul, softmax, flash),
 *              "" when it is not searched
 *     class    the devices it is searched on: cpu, gpu or any
 *     when     "" or "key=value": searched only while the current best has that value
 *     values   the candidates; quick: those under --quick ("": not searched then)
 *     doc      what it sets, for `clattn info` readers
 *
 * The order is `clattn info`'s and the search's (coordinate descent, one key at a time).
 */
#ifndef CLATTN_TUNING_KEYS_H
#define CLATTN_TUNING_KEYS_H

/* clang-format off */
#define CLATTN_TUNING_KEYS(X)                                                                     \
    X(matmul_vec, DEVICE, 0, 1, "matmul", "any", "", "0 1", "",                                  \
      "1: the register-blocked vector matmul (CPUs), 0: local tiles")                           \
    X(vec_rm, DEVICE, 1, 16, "matmul", "any", "matmul_vec=1", "2 3 4 5 6 7 8", "4",              \
      "matmul_vec: rows of a micro-tile")                                                       \
    X(vec_width, DEVICE, 4, 16, "matmul", "any", "matmul_vec=1", "4 8 16", "",                   \
      "matmul_vec: float vector width (4, 8, 16)")                                              \
    X(vec_nv, DEVICE, 1, 8, "matmul", "any", "matmul_vec=1", "1 2 3 4 6 8", "",                  \
      "matmul_vec: vectors per micro-tile row (panel = vec_nv * vec_width)")                    \
    X(vec_rb, DEVICE, 1, 64, "matmul", "any", "matmul_vec=1", "1 2 4 8 16", "",                  \
      "matmul_vec: micro-tiles (vec_rm rows each) per work-item")                               \
    X(vec_kc, DEVICE, 1, 65536, "matmul", "any", "matmul_vec=1", "64 128 256 512 1024 4096",     \
      "128", "matmul_vec: depth of a K block")                                                  \
    X(vec_wg, DEVICE, 1, 65536, "matmul", "any", "matmul_vec=1", "1 2 4 8 16 32", "4",           \
      "matmul_vec: work-items per group")                                                       \
    X(vec_stream, DEVICE, 0, 4194304, "matmul", "any", "matmul_vec=1", "0 4096 16384 65536", "", \
      "matmul_vec: KiB of F32 C per launch from which C is streamed (0: never)")                \
    X(tile_m, DEVICE, 1, 1024, "matmul", "any", "matmul_vec=0", "16 32 64 128", "32",            \
      "matmul (local tiles): rows of C per group")                                              \
    X(tile_n, DEVICE, 1, 1024, "matmul", "any", "matmul_vec=0", "16 32 64 128", "32",            \
      "matmul (local tiles): columns of C per group")                                           \
    X(tile_k, DEVICE, 1, 1024, "matmul", "any", "matmul_vec=0", "8 16 32", "32",                 \
      "matmul (local tiles): depth of a tile")                                                  \
    X(wpt_m, DEVICE, 1, 1024, "matmul", "any", "matmul_vec=0", "1 2 4 8", "",                    \
      "matmul (local tiles): rows per work-item")                                               \
    X(wpt_n, DEVICE, 1, 1024, "matmul", "any", "matmul_vec=0", "1 2 4 8", "",                    \
      "matmul (local tiles): columns per work-item")                                            \
    X(transpose_wg, DEVICE, 1, 65536, "", "any", "", "", "",                                     \
      "transposes: work-items per group side")                                                  \
    X(softmax_rows, DEVICE, 0, 65536, "softmax", "any", "", "0 1 2 4 8 16 32", "2 8",            \
      "0: a group per softmax row; N: a work-item per row, N rows per group")                   \
    X(softmax_wg, DEVICE, 1, 65536, "softmax", "any", "softmax_rows=0", "1 4 16 64 128 256",     \
      "16 64", "softmax: work-items per row (a group per row)")                                 \
    X(heads_wg, DEVICE, 1, 65536, "", "any", "", "", "",                                         \
      "heads.cl's kernels: work-items per group (not searched: no op of clattn tune times it)") \
    X(flash_cpu, PROBLEM, 0, 1, "flash", "any", "", "0 1", "",                                   \
      "1: the fused kernel for CPUs (flash_cpu.cl), 0: flash.cl")                               \
    X(flash_cpu_rb, PROBLEM, 1, 8, "flash", "any", "flash_cpu=1", "2 3 4 5 6 7 8", "4",          \
      "flash_cpu: query rows per register block (1 .. 8)")                                      \
    X(flash_cpu_nb, PROBLEM, 1, 64, "flash", "any", "flash_cpu=1", "1 2 4 8 16 32", "4",         \
      "flash_cpu: register blocks per group sharing a key tile")                                \
    X(flash_cpu_kv, PROBLEM, 1, 4, "flash", "any", "flash_cpu=1", "1 2 4", "",                   \
      "flash_cpu: float16 vectors per block row (1, 2, 4)")                                     \
    X(flash_cpu_tp, PROBLEM, 0, 1, "flash", "any", "flash_cpu=1", "0 1", "",                     \
      "flash_cpu: 1: a tile's blocks take all their weights, then P.V (0: block by block)")    \
    X(flash_cpu_pf, PROBLEM, 0, 16, "", "cpu", "", "", "",                                       \
      "flash_cpu: decode tiles of paged or spread rows prefetch this many key tiles ahead (0: " \
      "none; not searched: the search times no paged cache)")                                 \
    X(flash_cpu_pf_min, PROBLEM, 0, 4194304, "", "cpu", "", "", "",                              \
      "flash_cpu_pf: from this many KiB of keys and values (default: half the device's global " \
      "memory cache)")                                                                        \
    X(flash_bwd_nv, PROBLEM, 1, 4, "backward", "cpu", "", "1 2 4", "2 4",                         \
      "the CPU backward (flash_bwd.cl): 16-key vectors per key block, 1, 2 or 4, fewer where "  \
      "local memory is short (clattn tune: per head size, d = 64 and 128)")                     \
    X(flash_bwd_rb, PROBLEM, 1, 8, "backward", "cpu", "", "4 5 6 7 8", "4 6",                   \
      "the CPU backward (flash_bwd.cl): query rows a step takes together, 1 .. 8 (their "       \
      "scores and dp: rows x flash_bwd_nv float16 sums each)")                                  \
    X(flash_gpu, PROBLEM, 0, 1, "flash", "gpu", "flash_cpu=0", "0 1", "",                        \
      "1: the cooperative fused kernel for GPUs (flash_gpu.cl)")                                \
    X(fg_bq, PROBLEM, 1, 256, "flash", "gpu", "flash_gpu=1", "16 32 64 128", "",                 \
      "flash_gpu: query rows per group")                                                        \
    X(fg_bk, PROBLEM, 1, 256, "flash", "gpu", "flash_gpu=1", "16 32 64", "",                     \
      "flash_gpu: keys per tile")                                                               \
    X(fg_tx, PROBLEM, 1, 256, "flash", "gpu", "flash_gpu=1", "8 16 32", "",                      \
      "flash_gpu: work-items along the keys")                                                   \
    X(fg_ty, PROBLEM, 1, 256, "flash", "gpu", "flash_gpu=1", "4 8 16", "",                       \
      "flash_gpu: work-items along the rows")                                                   \
    X(fg_dpas, PROBLEM, 0, 2, "", "gpu", "", "", "",                                             \
      "flash_gpu: f16/bf16 products on Intel's matrix engine (cl_intel_subgroup_matrix_multiply_" \
      "accumulate): 1 where the device reports it, 0 never, 2 its emulation (tests; any device)") \
    X(fg_dpas_sg, PROBLEM, 8, 16, "", "gpu", "", "", "",                                         \
      "fg_dpas=2: the emulated sub-group size, 8 or 16 (the hardware's is the device's)")       \
    X(flash_rows, PROBLEM, 1, 65536, "flash", "any", "flash_cpu=0", "16 32 64 128 256", "32",    \
      "flash.cl: query rows (work-items) per group, upper bound")                               \
    X(flash_vw, PROBLEM, 1, 8, "flash", "any", "flash_cpu=0", "1 4 8", "4",                      \
      "flash.cl: vector width along a row (1, 4, 8), upper bound")                              \
    X(decode_keys, PROBLEM, 0, 4294967295u, "flash", "gpu", "", "0 128 256 512 1024", "",       \
      "fused decode splits: keys per split at least (0: never split)")                          \
    X(loop_trip_limit, DEVICE, 0, 4294967295u, "", "any", "", "", "",                            \
      "0, or the loop iterations a work-item may make in all (quirks)")
/* clang-format on */

#endif
