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
 * (host/tuning/keys.h: CLATTN_TUNING_KEYS). Selectors before the keys (@head_dim=N,
 * @dtype=f32|f16|bf16, @phase=prefill|decode) make a row a record: it sets the fused kernels'
 * (PROBLEM-scope) keys for the attention plans it selects only, the most specific record last
 * (host/core/tuning.c: clattn__tuning_for). The tuning cache that `clattn tune` writes ($XDG_CACHE_HOME/clattn/tuning,
 * same format, # comments) applies after these rows, or CLATTN_TUNING=FILE's rows instead;
 * CLATTN_TUNING=default applies no row at all. A row of FILE whose values do not fit the
 * device's limits is refused when the context is created; such a row of the cache is ignored.
 * The cache's rows also carry the driver key of the device they were measured on, after the
 * name (`| driver D | PLATFORM | clattn V`), and apply on that driver only; these rows, which
 * name devices, not drivers, need not (host/core/tuning.c: driver_rows).
 */
#ifndef CLATTN_TUNING_TABLE_H
#define CLATTN_TUNING_TABLE_H

static const char *const clattn_tuning_table[] = {
    /* CPUs (PoCL; measured on 2-core AVX-512 and AVX2 machines, float32): LLVM vectorises a
     * work-group's loop over work-items, local memory is ordinary cache. The register-blocked
     * matmul_vec (micro-tiles of 6 rows x vec_nv vectors, B packed; vec_nv and vec_width from
     * the device's vector width) beats local-memory tiles 10-40x; short
     * softmax rows per work-item beat wide tree reductions (64 items were 1.5x slower than 4
     * on 8 x 512 x 512), and a whole row per work-item in float16 vectors with a polynomial
     * exp (softmax_rows=4 rows per group) beat 4 items per row 10-25x at 8 x 1024^2 and
     * 8 x 4096^2 (0.6-1.1x a copy of the same bytes without a mask, on a loaded machine);
     * the fused kernel wants 8-float vectors along the row. */
    "cpu | * | * | matmul_vec=1 vec_rm=6 vec_rb=4 vec_kc=256 vec_stream=16384 vec_wg=1 "
    "transpose_wg=16 softmax_wg=4 "
    "softmax_rows=4 "
    "tile_m=64 tile_n=64 tile_k=32 wpt_m=8 wpt_n=4 flash_rows=64 flash_vw=8 "
    /* flash_cpu: the register-blocked fused kernel (kernels/flash_cpu.cl), 6-row blocks,
     * 32 blocks sharing each 64-key tile (4% over 16 at L = 1024 and 4096, d = 64; ops/flash.c
     * uses fewer where that leaves under 4 groups per compute unit): 6-8x flash.cl. */
    "flash_cpu=1 flash_cpu_rb=6 flash_cpu_nb=32 "
    /* Decode tiles of a paged cache or of spread rows ask for the K and V rows 4 tiles ahead
     * (flash_cpu.cl's fc_prefetch_tile): shuffled pages of 16 keys ran at 2.3-3.2x the
     * contiguous step's CPU time without it, 1.3-2.3x with it, and a (B, L, Hkv, d) cache's
     * decode 2x faster (2-vCPU AMD EPYC, H = 8, d = 64, 4k-32k keys). */
    "flash_cpu_pf=4",
    /* The CPU backward at d = 64 in 32-key blocks (flash_bwd_nv=2): its block's arrays (K^T,
     * V^T, the dK and dV sums, K's rows: 5 x 8 KiB) fit a 48 KiB L1, where 64-key blocks
     * (80 KiB) went to L2: the backward 1.12x at L = 1024, 1.05x at 2048 (2-vCPU Intel Xeon,
     * alternating, 3 rounds). d = 128 keeps 64-key blocks (32-key ones 0.92x, 16-key 0.79x). */
    "cpu | * | * | @head_dim=64 flash_bwd_nv=2",
    /* GPUs: local-memory tiles with 4 x 4 register blocks, 256-wide reductions; the fused
     * kernel is flash_gpu.cl (64 query rows x 32-key tiles per group of 16 x 8 work-items, see
     * its header for the register and local-memory budget; not yet timed on a GPU), else
     * flash.cl's one scalar lane per query row. */
    "gpu | * | * | matmul_vec=0 tile_m=64 tile_n=64 tile_k=16 wpt_m=4 wpt_n=4 softmax_wg=256 "
    "softmax_rows=0 "
    "flash_rows=64 flash_vw=1 flash_gpu=1 fg_bq=64 fg_bk=32 fg_tx=16 fg_ty=8",
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
     * 3 * seq_k / 16 trips per work-item with CPU parameters, so rows longer than ~340000
     * keys; 3 * seq_k / softmax_wg with GPU ones). */
    "any | Mesa | llvmpipe | loop_trip_limit=65535",
    /* Under that limit the register-blocked CPU fused kernel runs one 6-row block per group
     * and few key tiles per launch, and the vector softmax's many variants each go through
     * Mesa's slow compiler: check_softmax took 250 s and check_attention over 15 minutes on
     * llvmpipe, against about a minute with the kernels below (correct either way). Until
     * that is profiled, llvmpipe keeps flash.cl (split keys) and the work-group softmax. */
    "any | Mesa | llvmpipe | flash_cpu=0 softmax_rows=0",
};

#endif
