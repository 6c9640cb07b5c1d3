/*
 * The tuning table: kernel parameters per device, as data (CLBlast keeps its tuned values the
 * same way). Each row reads
 *
 *     class | vendor prefix | device-name prefix | key=value key=value ...
 *
 * class is cpu, gpu or any (cpu rows apply to CPU devices, or wherever CLATTN_PARAMS=cpu);
 * `*` matches any vendor or name. Rows apply in order on top of the default row that
 * host/core/tuning.c computes from the device's limits (work-group size, local memory), so a
 * later, more specific row overrides an earlier one. The keys are the fields of clattn_tuning
 * (host/internal.h). CLATTN_TUNING=FILE appends the rows of FILE (same format, # comments);
 * CLATTN_TUNING=default applies no row at all. A row whose values do not fit the device's
 * limits is refused when the context is created.
 */
#ifndef CLATTN_TUNING_TABLE_H
#define CLATTN_TUNING_TABLE_H

static const char *const clattn_tuning_table[] = {
    /* CPUs (PoCL; measured on 2-core AVX-512 and AVX2 machines, float32): LLVM vectorises a
     * work-group's loop over work-items, local memory is ordinary cache. The register-blocked
     * matmul_vec (6 rows x 2 vectors per work-item) beats local-memory tiles 10-40x; short
     * softmax rows per work-item beat wide tree reductions (64 items were 1.5x slower than 4
     * on 8 x 512 x 512); the fused kernel wants 8-float vectors along the row. */
    "cpu | * | * | matmul_vec=1 vec_rm=6 vec_wg=8 transpose_wg=16 softmax_wg=4 "
    "tile_m=64 tile_n=64 tile_k=32 wpt_m=8 wpt_n=4 flash_rows=64 flash_vw=8",
    /* GPUs: local-memory tiles with 4 x 4 register blocks, 256-wide reductions, one scalar
     * lane per query row in the fused kernel. */
    "gpu | * | * | matmul_vec=0 tile_m=64 tile_n=64 tile_k=16 wpt_m=4 wpt_n=4 softmax_wg=256 "
    "flash_rows=64 flash_vw=1",
};

/* Device quirks: rows that route around defects, so they apply even under
 * CLATTN_TUNING=default (they are about correctness, not speed). Same format. */
static const char *const clattn_quirk_table[] = {
    /* Mesa's llvmpipe (rusticl; Mesa 22.3.6, LLVM 15): gallivm gives each invocation one loop
     * counter shared by all its loops (LP_MAX_TGSI_LOOP_ITERATIONS = 65535, decremented on
     * every back-edge in lp_exec_endloop) and leaves the loop when it reaches zero, silently:
     * the kernel completes with truncated sums. Reproducer: a kernel whose one loop is
     * `for (uint i = 0; i < n; ++i) x = x * 1664525u + 1013904223u;` stores x after 65535
     * steps for every n > 65535 (PoCL: after n). ops/matmul.c splits K and ops/flash.c the
     * keys into launches that stay under the limit. Not split: softmax rows (about
     * 3 * seq_k / softmax_wg trips, so rows longer than ~80000 keys with CPU parameters). */
    "any | Mesa | llvmpipe | loop_trip_limit=65535",
};

#endif
