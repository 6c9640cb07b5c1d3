#!/usr/bin/env python3
"""GPU time model (issue 27): predicted time and limiting resource of each GPU kernel launch
on an NVIDIA H200 SXM, an Intel Iris Xe (Tiger Lake GT2, 96 EUs) and an Intel Arc A770
(Xe-HPG, with matrix engines: issue 51's FG_DPAS variant), from the work model's
formulas (tests/gpu_model/model.py: counts per launch, checked exactly against Oclgrind) and
the ptxas proxy's register counts (tests/resources/table.md). No GPU has been lent to the
project: these are predictions, to be replaced by measurements when one is.

Usage:
  bench/gpu_model.py                     # before (the kernels as issue 27 found them, git
                                         # ref 0ac8c24) and now (this tree), both devices
  bench/gpu_model.py --markdown          # the same tables for BENCHMARKS.md
  bench/gpu_model.py --formulas /tmp/model.py --regs flash_gpu:d64=168
                                         # another model.py in place of this tree's,
                                         # registers overridden
  --before REF / --no-before / --before-regs KEY=N: the first variant, REF's model.py and
  REF's tests/resources/table.md read with `git show` (skipped with a note where git or the
  ref is missing); --device h200|xe|arc; --no-broadcast (128-bit local loads charged per byte,
  the pessimistic bound); --breakdown (per-group work and latency terms too);
  --bwd-broadcast (the backward's warp-uniform loads as one request per warp, see below).

THE BACKWARD (cases "backward ...", since 2026-12-05): bwd_delta + bwd_dkdv + bwd_dq, the
  generic GPU kernels (64 work-items a group, one key or one row each), counts from model.py's
  backward_launches, registers from the proxy (BWD_PROXY: table.md has no flash_bwd.cl rows).
  % of peak from FlashAttention-2's useful FLOP, 10 d per kept pair (the kernels execute 14 d).
  Default (the forward's rule): every work-item's global request at DRAM bandwidth: ~0.5-0.66
  FLOP per byte, global-bound at 3 % of peak. --bwd-broadcast: the per-pair loads are
  warp-uniform (every lane walks the same row or key): one request per warp (bytes / 32 to
  DRAM) but one L1 wavefront each, and the private rows the proxy keeps on the stack (3 (dk +
  dv) accesses per pair in bwd_dkdv, 3 dk + dv in bwd_dq) one wavefront per warp access too,
  charged to the "local" pipe (the same SRAM): 8 % of peak, L1-bound.

THE MODEL (one launch; "SM" = an NVIDIA streaming multiprocessor or an Intel dual subslice)
  Counts c (formulas): FMAs, exps, local loads (operations; 128-bit ones separated with the
  bytes), local stores, global bytes, barriers; the launch's work-groups N of `items`
  work-items (the geometry the host uses, as in model.py's sdpa_launches).
  1. Lanes per instruction: w = 32 (a warp) on NVIDIA; on Intel the SIMD width the compiler
     would pick: the widest of 32, 16, 8 whose GRF budget per work-item (128 GRF x 32 B per
     hardware thread / (SIMD x 4 B) = 1024 / SIMD registers) holds the proxy's register count
     (SIMD8 at most 128 registers; beyond that spills: flagged, not charged).
  2. Groups per SM, G = min over registers (NVIDIA: registers per warp rounded up to 256,
     64K per SM), local memory (bytes per group + 1 KiB reserved per block on NVIDIA; the
     smallest local memory the host's tile rule accepts for the chosen tiles, i.e. the
     kernel's own arrays, found from model.py's flash_gpu_tiles), threads (2048 per SM; Intel
     16 EUs x 7 hardware threads = 112 SIMD threads per DSS) and blocks (32 per SM).
  3. Per-group work, in SM clocks when the group has the whole SM (totals / N):
       fma     FMA instructions (c.fma / w) over the SM's FMA issue rate (NVIDIA 4 warp-FMAs
               per clock = 128 lanes; Intel 16 EUs x one SIMD8 FMA = 128 lanes);
       issue   counted instructions (FMA, local and global loads and stores, 2 per exp, the
               barriers) / w over the SM's instruction issue rate (NVIDIA 4 per clock, one
               per scheduler; Intel 2 per EU per clock: the FPU and the send pipe co-issue).
               A lower bound: address arithmetic, loop control and the score rule's masking
               are not counted (see UNCERTAIN);
       local   local-memory transactions over 1 per clock. A warp's (SIMD thread's) scalar
               load or store is one transaction whether its lanes read one word (a
               broadcast: the 16 work-items of a row reading one q or P word) or 32 distinct
               conflict-free words (the +1-padded rows): 128 B per clock per SM on both. A
               128-bit load costs ceil(unique bytes / 128) transactions: a broadcast (q rows,
               P rows: 2 distinct float4 per warp, one per row of work-items) 1, a K row
               (16 distinct float4 per warp: the 16 key columns tx) 2 on NVIDIA, 1 on Intel
               SIMD8 (8 lanes x 16 B). The broadcast fraction of the 128-bit loads comes from
               the kernel's structure (S: RM q loads and RN K loads per 4 dims; P V: RM P
               loads per 4 keys): 6/7 at d=64 (BQ 64, BK 32), 5/7 at d=128 (BQ 32, BK 32).
               Main has no 128-bit loads: every local access is one transaction. Its
               scalar broadcasts (q and P words read by the 16 work-items of a row, about
               70 % of its local loads at d=64) carry 8 B each but still take a transaction:
               that is why 0.53 loads per FMA cost so much;
       sfu     exps over the SM's exp rate (NVIDIA MUFU 16 per clock; Intel EM 2 lanes per
               EU per clock = 32 per DSS);
       global  global bytes (the kernel's requests: K and V re-read per query block are
               charged at DRAM bandwidth, no L2/L3 credit: pessimistic) over the device's
               bandwidth; a device-wide resource, not per SM.
  4. Latency (the occupancy limit): one group's critical path S per launch when it is alone
     on an SM, from the kernel's structure: per phase that stages global data (flash: Q once
     and K and V per key tile; matmul: A and B per K tile; softmax_rows: its 3 passes;
     flash_merge: 2) a global latency L_G; per barrier a cost C_B; per key tile the row
     pass's two dependent chains of BK operations (the max, the sum) at L_DEP each plus an
     exp latency. The SM runs G groups at once: a round of g groups takes
     max(max over r of g x work_r, max over r of work_r + S): the pipes saturate when
     enough groups cover each other's stalls, otherwise the latency shows.
  5. Wave quantisation: the busiest SM gets n = ceil(N / SMs) groups, run in ceil(n / G)
     rounds (the last with n mod G). SM time = the sum of the rounds; the launch takes
     max(SM time, global bytes / bandwidth). Launch overhead is not included.
  The limiter printed is the term that sets the time: a pipe (fma, issue, local, sfu), global,
  or latency (the SM's groups cannot cover their stalls: occupancy or too few groups).
  TFLOP/s and % of peak use the useful FLOP: attention 4·d·(query rows x kept keys) per
  head (causal: the kept half), matmul 2·M·N·K; the kernel's FMAs include padding.

DEVICES (numbers used; [A] = an assumption of this model, not a published figure)
  H200 SXM (Hopper GH100, as given by the issue): 132 SMs, boost 1.98 GHz, 128 FP32 lanes
    per SM (66.9 TFLOP/s FP32 FMA, no tensor cores), HBM3e 4.8 TB/s, shared memory 32 banks
    x 4 B per clock per SM, 64K 32-bit registers per SM allocated per warp in units of 256,
    at most 2048 threads and 32 blocks per SM, 228 KiB shared memory per SM (227 KiB per
    block, 1 KiB reserved per block), MUFU exp 16 per clock per SM. OpenCL reports 48 KiB
    of local memory (CL_DEVICE_LOCAL_MEM_SIZE): the host picks the tiles for 48 KiB, as
    under Oclgrind. [A] latencies: global staging 500 clocks (a mix of L2 hits, ~260, and
    HBM), barrier 20, dependent FP op 4, exp 20.
  Iris Xe, Tiger Lake GT2, 96 EUs (i7-1165G7 1.30 GHz, i7-1185G7 1.35 GHz; 1.35 used):
    Intel's oneAPI GPU optimization guide, "Intel Xe GPU Architecture"
    (intel.com/content/www/us/en/docs/oneapi/optimization-guide-gpu/2024-0/
    intel-xe-gpu-architecture.html): an Xe-LP EU has an 8-wide FP/INT ALU (8 FP32 ops per
    clock, i.e. 8 FMA lanes) and a 2-wide extended-math ALU (exp), 7 hardware threads of 128
    GRF x 32 B each; a dual subslice (DSS) has 16 EUs, 128 KB of SLM and a 128 B/cycle data
    port; 96 EUs = 6 DSS. So 96 x 8 x 2 x 1.35 GHz = 2.07 TFLOP/s FP32 (the commonly quoted
    ~2.1). Memory: LPDDR4x-4266 on a 128-bit bus, 68.3 GB/s (shared with the CPU; third-party
    spec pages list 68.26 GB/s for the same memory on DG1). [A] SLM: one SIMD message per
    clock per DSS moving up to 128 B (the data port's width; scattered SLM throughput is not
    published); CL_DEVICE_LOCAL_MEM_SIZE 64 KiB per work-group (what Intel's driver reports)
    so the host picks BQ 64, BK 32 at d=128 on main; CL_DEVICE_MAX_COMPUTE_UNITS 96 (EUs:
    decode splits aim at 192 groups); issue 2 instructions per EU per clock; latencies:
    global 600 clocks, barrier 50, dependent op 6, exp 30.
  Arc A770, Xe-HPG ACM-G10, 32 Xe-cores at 2.1 GHz (issue 51, 2026-12-07): per Xe-core 16
    vector engines (8 FP32 lanes: 17.2 TFLOP/s FP32) and 16 XMX matrix engines of 128
    FP16/BF16 operations (64 MACs) a clock (1024 MACs per Xe-core and clock: 137.6 TFLOP/s
    FP16), 192 KB of L1/SLM per Xe-core (Intel's Xe-HPG disclosures, TechPowerUp's A750/A770
    review); GDDR6 at 560 GB/s (the 16 GB card); OpenCL: 512 compute units, 64 KiB of local
    memory, cl_intel_subgroup_matrix_multiply_accumulate with sub-groups of 8 (DPAS's native
    width on Xe-HPG; Xe-HPC's 16 is not modelled). [A] the Iris Xe's SLM rate, issue rate and
    latencies; 8 hardware threads per vector engine; 128 KiB of the L1 as SLM.

THE MATRIX ENGINE (cases "... DPAS", the Arc only): flash_gpu.cl's FG_DPAS with the device's
  sub-group size, the hardware's counts (model.py flash_group(dpas=SG, emulation=False): the
  emulation's A-fragment traffic left out). The MACs (model.py's "fma") go to the Xe-core's
  matrix engines (1024 a clock), not the FMA lanes; the issue pipe takes one DPAS instruction
  a sub-group per 128 MACs an item and the conversions of the operands to 16 bits, which the
  kernel stages as float32 (per call and item 16 B values and 8 packs; per 16 along k the A
  fragment: 8 values at sub-group 16, 16 values and 8 packs at 8); every operand word is a
  scalar local load (one transaction a sub-group instruction, as every scalar access here).
  Registers: no proxy (ptxas has no DPAS): 128 assumed, SIMD = the sub-group size. The rows
  "flash f16 ..." are flash_gpu without the variant on the same 16-bit inputs.

CROSS-CHECK against the earlier analysis (flash_gpu on H200 at 31-39 % of FP32 peak, about
21-26 TFLOP/s at L=4096 d=64 B·H=32, about 20 at d=128; the GPU matmul at about 36 %): this
model puts main's flash_gpu at 44 % at d=64 (29 TFLOP/s; local-memory bound: 0.56
transactions per FMA where the FMA pipe takes 0.25 per FMA, so 0.25 / 0.56), 33 % at d=128
(22 TFLOP/s; BK 16, RN 1: more loads per FMA, 3 groups per SM) and the matmul at 46 % (0.53
transactions per FMA). d=128 agrees; d=64 and the matmul come out 5-10 points above the
earlier figures, because this model charges only the counted accesses and lets every other
resource overlap the local-memory pipe perfectly: bank conflicts (none assumed), the
uncounted instructions (address arithmetic, the score rule, loop control: they take issue
slots, and issue is at 72 % of the local pipe's time at d=64) and the proxy's accumulators in
local (stack) memory would all push it down. The limiter (local memory, not FMAs or HBM) and
the ordering d=64 > d=128 agree. Note: at L=1024 B=1 H=8 the 16 blocks x 8 heads are only 128
groups, fewer than 2 x 132, so the host (host/ops/flash.c choose_splits, model.py's
decode_splits) splits the keys 3 ways on an H200 (384 groups, plus flash_merge) and 2 ways on
the Xe; the table shows those launches.

UNCERTAIN: the register counts are a proxy (clang 15 + libclc + ptxas), not NVIDIA's OpenCL
compiler; the proxy leaves the accumulators in (L1-cached) local memory (ld.local/st.local,
not counted here); Intel's compiler and its SIMD choice are guessed from those counts; the
128-bit broadcast rule (1 transaction for 2 distinct float4 per warp) is the crux of the
float4 branch on NVIDIA: with --no-broadcast (4 transactions per 128-bit warp load) the
branch loses its advantage there.

Python 3 standard library only. Run by tests/gpu_model/run.sh as a smoke test (--markdown).
"""
import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN_MODEL = os.path.join(ROOT, "tests", "gpu_model", "model.py")
TABLE = os.path.join(ROOT, "tests", "resources", "table.md")
# Before: main at the start of issue 27's GPU work (flash_gpu.cl as issue 24 left it: scalar
# local loads, +1 padding, d=128 at BQ 64 x BK 16), with that commit's formulas and proxy
# registers. (The float4 loads were measured first on the branch issue27-flash-gpu-float4
# and landed on main on 2026-12-04.)
BEFORE = "0ac8c24"

KIB = 1024
DEVICES = {
    "h200": dict(
        name="NVIDIA H200 SXM", sms=132, clock=1.98e9, fma_lanes=128, issue=4.0,
        local_per_clk=1.0, local_txn_bytes=128, sfu=16.0, bandwidth=4.8e12,
        regs=65536, reg_unit=256, max_threads=2048, max_blocks=32, smem=228 * KIB,
        smem_reserved=1 * KIB, cl_local_mem=48 * KIB, compute_units=132, simd=None,
        lat_global=500, lat_barrier=20, lat_dep=4, lat_exp=20, eus=None),
    "xe": dict(
        name="Intel Iris Xe (TGL GT2, 96 EU)", sms=6, clock=1.35e9, fma_lanes=128,
        issue=32.0, local_per_clk=1.0, local_txn_bytes=128, sfu=32.0, bandwidth=68.3e9,
        regs=None, reg_unit=None, max_threads=None, max_blocks=None, smem=128 * KIB,
        smem_reserved=0, cl_local_mem=64 * KIB, compute_units=96, simd="auto",
        lat_global=600, lat_barrier=50, lat_dep=6, lat_exp=30, eus=16, hw_threads=7),
    # Xe-HPG (ACM-G10): 32 Xe-cores of 16 vector engines (8 FP32 lanes each: 17.2 TFLOP/s at
    # 2.1 GHz) and 16 XMX engines (128 FP16/BF16 ops, i.e. 64 MACs, a clock each: 1024 MACs
    # per Xe-core and clock, 137.6 TFLOP/s), 192 KB of L1/SLM per Xe-core, GDDR6 560 GB/s
    # (the 16 GB card); OpenCL: 512 compute units (EUs), 64 KiB local memory, the matrix
    # engine's extension with sub-groups of 8 (DPAS's native width on Xe-HPG). [A] as the
    # Xe above: the SLM moving 128 B a clock per Xe-core, 2 instructions per EU a clock, the
    # latencies; 8 hardware threads per vector engine; 128 KiB of the L1 as SLM.
    "arc": dict(
        name="Intel Arc A770 (Xe-HPG, 32 Xe-cores)", sms=32, clock=2.1e9, fma_lanes=128,
        issue=32.0, local_per_clk=1.0, local_txn_bytes=128, sfu=32.0, bandwidth=560e9,
        regs=None, reg_unit=None, max_threads=None, max_blocks=None, smem=128 * KIB,
        smem_reserved=0, cl_local_mem=64 * KIB, compute_units=512, simd="auto",
        lat_global=600, lat_barrier=50, lat_dep=6, lat_exp=30, eus=16, hw_threads=8,
        xmx_macs=1024, dpas_sg=8),
}


def cdiv(a, b):
    return -(-a // b)


def peak_flops(dev):
    return dev["sms"] * dev["fma_lanes"] * 2 * dev["clock"]


# --- inputs: the formulas (a model.py by path) and the proxy's registers --------------------
def load_formulas(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"gpu_model.py: cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for attr in ("sdpa_launches", "matmul", "flash_gpu_tiles", "decode_splits", "PARAMS"):
        if not hasattr(mod, attr):
            raise SystemExit(f"gpu_model.py: {path} has no {attr}: not a work model")
    return mod


def git_file(ref, path, suffix):
    """File `path` of git ref `ref`, written to a temporary file; None if git cannot."""
    try:
        text = subprocess.run(["git", "-C", ROOT, "show", f"{ref}:{path}"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True,
                              universal_newlines=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    handle = tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False)
    with handle:
        handle.write(text)
    return handle.name


def parse_table(path):
    """tests/resources/table.md: {(file:kernel, options dict): (NV regs, NV smem)}."""
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            m = re.match(r"\| `([\w.]+):(\w+)((?: \w+=\w+)*)` \| (\d+) \| \d+ \| "
                         r"[\d/]+ \| (\d+) \|", line)
            if m:
                opts = dict(o.split("=") for o in m.group(3).split())
                rows.append((f"{m.group(1)}:{m.group(2)}", opts, int(m.group(4)),
                             int(m.group(5))))
    return rows


def table_regs(rows, kernel, dk=None, bq=None, bk=None):
    """(registers, shared memory bytes, how) of the closest float32 variant: exact tiles,
    else the same head size, else any variant of the kernel
    (the proxy has no d=64 decode variant, for one)."""
    file_kernel = {"flash_gpu": "flash_gpu.cl:flash_attention", "matmul": "matmul.cl:matmul",
                   "softmax_rows": "softmax.cl:softmax_rows",
                   "flash_merge": "heads.cl:flash_merge",
                   "bwd_delta": "flash_bwd.cl:bwd_delta", "bwd_dkdv": "flash_bwd.cl:bwd_dkdv",
                   "bwd_dq": "flash_bwd.cl:bwd_dq",
                   "bwd_dkdv_gpu": "flash_bwd_gpu.cl:bwd_dkdv_gpu",
                   "bwd_dq_gpu": "flash_bwd_gpu.cl:bwd_dq_gpu"}[kernel]
    cands = [r for r in rows if r[0] == file_kernel and
             all(r[1].get(k, "0") == "0" for k in r[1] if k.endswith("DTYPE"))]
    if dk is not None:
        exact = [r for r in cands if r[1].get("HEAD_DIM_QK") == str(dk) and
                 r[1].get("FG_BQ") == str(bq) and r[1].get("FG_BK") == str(bk)]
        same_d = [r for r in cands if r[1].get("HEAD_DIM_QK") == str(dk)]
        for group, how in ((exact, "proxy"), (same_d, "proxy, nearest tiles")):
            if group:
                return group[0][2], group[0][3], how
    if cands:
        return cands[0][2], cands[0][3], "proxy"
    return None, None, "none"


# The ptxas proxy's registers of the backward's GPU kernels (tests/resources/run.sh pipeline on
# the variants the host builds on a GPU, float32, no score switches), measured 2026-12-05.
# table.md has no flash_bwd.cl rows: the GPU program fails ptxas as a whole (bwd_dq_cpu and
# bwd_dkdv_cpu, in the same source, declare 96-192 KiB of __local arrays at d = 64 and 128,
# over the 48 KiB a block may declare), so the entries the GPU runs are read from ptxas's
# per-entry lines. No spills; the private rows (bwd_dkdv's k, v, dK, dV; bwd_dq's q, dO, dQ)
# sit in the stack frame (local memory): 1024 / 768 B at d = 64, 2048 / 1536 B at d = 128.
BWD_PROXY = {("bwd_delta", 64): 34, ("bwd_delta", 128): 34, ("bwd_dkdv", 64): 96,
             ("bwd_dkdv", 128): 84, ("bwd_dq", 64): 64, ("bwd_dq", 128): 62,
             # bwd_dkdv_gpu (flash_bwd_gpu.cl, measured 2026-12-06, the same pipeline on the
             # program flash_bwd.cl + flash_bwd_gpu.cl, -cl-mad-enable): d = 64 (BK 32, BR 32)
             # 194 registers, 64-byte stack, 44288 B local; d = 128 (BK 32, BR 8) 167
             # registers, 256-byte stack (dK, dV: 64 floats), 45376 B local; no spills (196
             # and 175 with dropout)
             ("bwd_dkdv_gpu", 64): 194, ("bwd_dkdv_gpu", 128): 167,
             # bwd_dq_gpu (same program): d = 64 136 registers, 64-byte stack, 39424 B local;
             # d = 128 168, no stack, 43776 B; no spills (162 and 207 with dropout)
             ("bwd_dq_gpu", 64): 136, ("bwd_dq_gpu", 128): 168}


def lookup_override(overrides, kernel, dk, bq, bk):
    for key in ([f"{kernel}:d{dk}:bq{bq}:bk{bk}", f"{kernel}:d{dk}:bq{bq}", f"{kernel}:d{dk}"]
                if dk is not None else []) + [kernel]:
        if key in overrides:
            return overrides[key]
    return None


# --- launches with their geometry ------------------------------------------------------------
class Launch:
    def __init__(self, kernel, counts, groups, items, tiles, dk=None, bq=None, bk=None,
                 smem=0, phases=0.0, row_chain=0.0):
        self.kernel, self.c, self.groups = kernel, counts, groups
        self.items, self.tiles = items, tiles
        self.dk, self.bq, self.bk, self.smem = dk, bq, bk, smem
        self.phases, self.row_chain = phases, row_chain   # per-group latency structure


def set_device(mod, dev):
    """Point the formulas at the device: compute units (decode splits) and the local memory
    the host sizes the tiles for. Returns a function that restores them."""
    saved_cu, saved_tiles = mod.COMPUTE_UNITS, mod.flash_gpu_tiles
    saved_dpas = getattr(mod, "dpas_tiles", None)
    mod.COMPUTE_UNITS = dev["compute_units"]

    def tiles(dk, dv, seq_q, p=mod.PARAMS, local_mem=None):
        return saved_tiles(dk, dv, seq_q, p, dev["cl_local_mem"])

    def dpas_tiles(dk, dv, seq_q, sg, emulated=True, p=mod.PARAMS, local_mem=None,
                   paged=False):
        return saved_dpas(dk, dv, seq_q, sg, emulated, p, dev["cl_local_mem"], paged)

    mod.flash_gpu_tiles = tiles
    if saved_dpas is not None:
        mod.dpas_tiles = dpas_tiles

    def restore():
        mod.COMPUTE_UNITS, mod.flash_gpu_tiles = saved_cu, saved_tiles
        if saved_dpas is not None:
            mod.dpas_tiles = saved_dpas
    restore.raw_tiles, restore.local_mem = saved_tiles, dev["cl_local_mem"]
    return restore


def flash_local_bytes(raw_tiles, dk, seq_q, chosen, ceiling):
    """The kernel's local arrays for the chosen tiles: the smallest local memory the host's
    rule (the formulas' flash_gpu_tiles) accepts them in, less its 1 KiB margin."""
    lo, hi = 1025, ceiling
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            ok = raw_tiles(dk, dk, seq_q, local_mem=mid) == chosen
        except ValueError:
            ok = False
        if ok:
            hi = mid
        else:
            lo = mid + 1
    return lo - 1024


def fused_launches(mod, restore, b, h, hkv, lq, lk, d, causal, elem=4, dpas=0):
    """flash_gpu's launch (and flash_merge's), float32 or 16-bit storage (elem 2); dpas: the
    matrix-engine variant with sub-groups of that size, the hardware's work (model.py
    flash_group, emulation=False: the extension's call in registers), 16-bit q, k, v."""
    kw = dict(dpas=dpas, emulation=False) if dpas else {}
    launches = mod.sdpa_launches("fused", b, h, hkv, lq, lk, d, causal, elem=elem, **kw)
    heads, seq_q = h, lq
    if lq == 1 and h > hkv and not causal:           # sdpa_launches' grouped decode
        heads, seq_q = hkv, h // hkv
    if dpas:
        bq, bk = mod.dpas_tiles(d, d, seq_q, dpas, False)
        items = dpas * (bq // 8)
        smem = mod.flash_local_bytes(d, d, bq, bk)
    else:
        bq, bk = mod.flash_gpu_tiles(d, d, seq_q)
        items = mod.PARAMS["fg_tx"] * mod.PARAMS["fg_ty"]
        smem = flash_local_bytes(restore.raw_tiles, d, seq_q, (bq, bk), restore.local_mem)
    blocks = cdiv(seq_q, bq)
    splits, split_keys = mod.decode_splits(blocks * b * heads, lk, bk)
    groups = blocks * b * heads * splits
    # key tiles per group, from the geometry (model.py's flash_group: the tiles from the
    # split's first key to the block's last row's band end)
    split_keys = split_keys if splits > 1 else lk
    tiles = 0
    for split in range(splits):
        begin, stop = split * split_keys, min(lk, split * split_keys + split_keys)
        for block in range(blocks):
            last_row = min(seq_q, block * bq + bq) - 1
            end = min(stop, mod.band_end(last_row, lk, causal))
            tiles += len(range(begin, end, bk))
    tiles_per_group = tiles * b * heads / groups
    out = []
    for kernel, c in launches:
        if kernel == "flash_attention":
            chain = 2 * bk      # the row pass: max then sum, BK dependent steps each
            tiles = f"BQ {bq} BK {bk}" + (f", {splits} splits" if splits > 1 else "")
            if dpas:
                tiles += f", sub-groups of {dpas}"
            out.append(Launch("flash_gpu_dpas" if dpas else "flash_gpu", c, groups, items,
                              tiles, d, bq, bk, smem, phases=2 * tiles_per_group + 1,
                              row_chain=tiles_per_group * chain))
            out[-1].tiles_per_group = tiles_per_group
            out[-1].dpas = dpas
        else:   # flash_merge: one work-item per (row, dim), HEADS_WG per group
            wg = mod.PARAMS.get("heads_wg", 256)
            out.append(Launch("flash_merge", c, cdiv(b * heads * seq_q * d, wg), wg,
                              f"{splits} splits", phases=2))
    return out


def matmul_launch(mod, c, m, n, k, batch):
    p = mod.PARAMS
    groups = batch * cdiv(m, p["tile_m"]) * cdiv(n, p["tile_n"])
    items = (p["tile_m"] // p["wpt_m"]) * (p["tile_n"] // p["wpt_n"])
    kt = cdiv(k, p["tile_k"])
    smem = (p["tile_m"] + p["tile_n"]) * p["tile_k"] * 4 + 128   # table.md: 8320 (used)
    return Launch("matmul", c, groups, items,
                  f"{p['tile_m']}x{p['tile_n']}x{p['tile_k']}", smem=smem, phases=kt)


def unfused_launches(mod, b, h, lq, lk, d, causal):
    bh = b * h
    launches = mod.sdpa_launches("unfused", b, h, h, lq, lk, d, causal)
    (_, c1), (_, c2), (_, c3) = launches
    w = mod.PARAMS["softmax_wg"]
    soft = Launch("softmax_rows", c2, bh * lq, w, f"{w} per row", smem=1024, phases=3)
    return [matmul_launch(mod, c1, lq, lk, d, bh), soft, matmul_launch(mod, c3, lq, d, lk, bh)]


def backward_launches(mod, b, h, hkv, lq, lk, d, causal, dkdv=None):
    """The backward's launches (model.py backward_launches) with the host's geometry
    (host/ops/flash_bwd.c: work-groups of 64 on a GPU, one row (bwd_delta, bwd_dq) or one key
    (bwd_dkdv) per work-item). Each launch also carries what the broadcast-aware variant
    (--bwd-broadcast) needs: `uniform` = the global loads every lane of a warp makes at the
    same address (bwd_dkdv walks the same query row in every lane, bwd_dq the same key), and
    `stack` = the accesses to the private rows the proxy keeps in local memory (stack frame):
    per kept pair 3 (dk + dv) in bwd_dkdv (k, v read; dK, dV read and written), 3 dk + dv in
    bwd_dq (q, dO read; dQ read and written)."""
    items = 64
    kept = b * h * mod.bwd_kept(lq, lk, causal)
    out = []
    kw = {} if dkdv is None else {"dkdv": dkdv}
    for kernel, c in mod.backward_launches(b, h, hkv, lq, lk, d, d, causal, **kw):
        if kernel in ("bwd_dkdv_gpu", "bwd_dq_gpu"):
            # a group of 128 per block of BK keys (rows) (flash_bwd_gpu.cl): latency per tile
            # one global load (the staging), the S / dP chains (d4 FMAs each) and the dV / dK
            # (dQ) chains (BR FMAs), an exp; barriers from the counts
            bk, br = mod.bwd_gpu_tiles(lq, d, d, getattr(mod, "LOCAL_MEM", 49152))
            dq = kernel == "bwd_dq_gpu"
            groups = b * h * cdiv(lq, bk) if dq else b * hkv * cdiv(lk, bk)
            tiles = c["barriers"] / 3 / (mod.BWD_GPU_TX * mod.BWD_GPU_TY) / groups
            d4 = cdiv(d, 4) * 4
            smem = (4 * ((bk + br) * 2 * (d4 + 4) + bk * (br + 4)) if dq else
                    4 * ((bk + br) * 2 * (d4 + 4) + 2 * bk * (br + 4) + 2 * br))
            launch = Launch(kernel, c, groups, mod.BWD_GPU_TX * mod.BWD_GPU_TY,
                            f"{bk} keys x {br} rows", d, br, bk, smem=smem, phases=tiles + 1,
                            row_chain=tiles * (2 * d4 + br))
            launch.tiles_per_group = tiles
            out.append(launch)
            continue
        if kernel == "bwd_delta":
            n, per_item, uniform, stack = b * h * lq, 0.0, 0, 0
        elif kernel == "bwd_dkdv":
            n = b * hkv * lk
            per_item = kept / n
            uniform = kept * (2 * d + d + 2)
            stack = kept * 3 * (d + d)
        else:
            n = b * h * lq
            per_item = kept / n
            uniform = kept * (2 * d + d)
            stack = kept * (3 * d + d)
        groups = b * hkv * cdiv(lk, items) if kernel == "bwd_dkdv" else b * h * cdiv(lq, items)
        # latency per work-item: per kept pair a global load the dot waits for and a second
        # one after the weight (dO, delta: bwd_dkdv; v: bwd_dq), the dot's and dp's dependent
        # FMA chains (dk + dv) and an exp
        launch = Launch(kernel, c, groups, items, f"{items} per group", d,
                        phases=2 * per_item + 1, row_chain=per_item * 2 * d)
        launch.tiles_per_group = per_item
        launch.uniform, launch.stack = uniform, stack
        out.append(launch)
    return out


def useful_backward_flop(b, h, lq, lk, d, causal):
    """FlashAttention-2's count: 5 products of 2 d FLOP per kept pair (S = Q K^T recomputed,
    dP = dO V^T, dV = P^T dO, dK = dS^T Q, dQ = dS K), 2.5 x the forward's 4 d. The kernels
    execute 14 d (S and dP are recomputed in both passes)."""
    kept = sum(min(i + 1, lk) for i in range(lq)) if causal else lq * lk
    return 10 * d * b * h * kept


# --- the device model --------------------------------------------------------------------------
def simd_width(dev, regs):
    if dev["simd"] is None:
        return 32
    for w in (32, 16, 8):
        if regs is not None and regs <= 1024 // w:
            return w
    return 8


def occupancy(dev, launch, regs, w):
    """Groups per SM and what bounds it."""
    limits = {}
    smem = launch.smem + dev["smem_reserved"]
    if smem:
        limits["smem"] = dev["smem"] // smem
    if dev["regs"]:
        per_warp = cdiv(regs * 32, dev["reg_unit"]) * dev["reg_unit"]
        limits["regs"] = (dev["regs"] // per_warp) // cdiv(launch.items, 32)
        limits["threads"] = dev["max_threads"] // launch.items
        limits["blocks"] = dev["max_blocks"]
    else:   # Intel: SIMD threads per DSS; the GRF is per thread, registers do not bound it
        limits["threads"] = dev["eus"] * dev["hw_threads"] // cdiv(launch.items, w)
    bound = min(limits, key=limits.get)
    return max(0, limits[bound]), bound


def vec4_split(launch):
    """(128-bit local loads, the fraction of them that are broadcasts) from the counts: local
    load bytes = 16 n16 + 4 n4 + n1, operations = n16 + n4 + n1, so n16 = (bytes - 4 ops) / 12
    when the byte loads n1 (key-padding flags: at most RM*RN per work-item and tile, and none
    without key padding) are neglected: that understates n16 by n1 / 4, under 2 %."""
    c = launch.c
    if launch.kernel in ("bwd_dkdv_gpu", "bwd_dq_gpu"):
        # S, dP: per d4 RM rows of the streamed tile (indexed by ty: 2 per warp, broadcast)
        # and RN of the resident block (by tx: 16 distinct per warp); then per 4 rows (keys)
        # 2 RK (dQ: RK) float4s of p z, dX (by ty: broadcast); full tiles
        n16 = max(0.0, (c["local_load_bytes"] - 4 * c["local_loads"]) / 12)
        rm, rn, rk = launch.bq // 8, launch.bk // 16, launch.bk // 8
        d4 = cdiv(launch.dk, 4) * 4
        per4 = rk if launch.kernel == "bwd_dq_gpu" else 2 * rk
        k_loads = 2 * d4 // 4 * rn
        all_loads = 2 * d4 // 4 * (rm + rn) + launch.bq // 4 * per4
        return n16, 1 - k_loads / all_loads
    if launch.kernel != "flash_gpu":
        return 0.0, 1.0
    rm, rn = launch.bq // 8, launch.bk // 16
    n16 = max(0.0, (c["local_load_bytes"] - 4 * c["local_loads"]) / 12)
    if n16 < 0.5:
        return 0.0, 1.0
    d4 = cdiv(launch.dk, 4) * 4
    k_loads = d4 // 4 * rn
    all_loads = d4 // 4 * (rm + rn) + launch.bk // 4 * rm
    return n16, 1 - k_loads / all_loads


def predict(dev, launch, regs, broadcast=True, bwd_broadcast=False):
    c, n_groups = launch.c, launch.groups
    dpas = getattr(launch, "dpas", 0)
    w = dpas if dpas else simd_width(dev, regs)   # (FG_DPAS: the required sub-group size)
    g_max, g_bound = occupancy(dev, launch, regs, w)
    if g_max < 1:
        return None
    n16, bcast = vec4_split(launch)
    # transactions: scalar accesses one per instruction; 128-bit ones by unique bytes
    unique_k = min(w, 16) * 16        # a K-row float4 load: TX distinct addresses per warp
    k_txn = cdiv(unique_k, dev["local_txn_bytes"])
    vec_all = cdiv(w * 16, dev["local_txn_bytes"])        # no broadcast merging at all
    if broadcast:
        vec_txn = n16 * (bcast * 1 + (1 - bcast) * k_txn)
    else:
        vec_txn = n16 * vec_all
    local_txn = ((c["local_loads"] - n16) + c["local_stores"]) / w + vec_txn / w
    fma_instr = c["fma"]
    if dpas:
        # the matrix engine: one DPAS instruction a sub-group per 128 MACs an item, and the
        # operands' conversion to 16 bits on the vector engines (the kernel stages float32):
        # per call and item its B column, 16 values and 8 packs; per 16 along k its A
        # fragment, 8 values (sub-groups of 16) or 16 values and 8 packs (of 8)
        calls = c["fma"] / 128
        fragments = (launch.tiles_per_group * launch.items * n_groups *
                     (launch.dk // 16 + launch.bk // 16))
        fma_instr = calls * (1 + 24) + fragments * (8 if dpas == 16 else 24)
    instr = (fma_instr + c["local_loads"] + c["local_stores"] + c["global_loads"] +
             c["global_stores"] + 2 * c["exp"] + c["barriers"]) / w
    gbytes = c["global_load_bytes"] + c["global_store_bytes"]
    uniform = getattr(launch, "uniform", 0)
    if bwd_broadcast and uniform:
        # the backward's warp-uniform loads: one request per warp (its bytes / w reach
        # DRAM; still no L2 credit) but one L1 wavefront each, as is every access of the
        # private rows in the stack frame (local memory; a warp's access to one private
        # offset is interleaved: one 128 B wavefront); the L1 is the SRAM of the "local"
        # pipe, so both are charged there, and both issue
        elem = c["global_load_bytes"] / c["global_loads"]
        gbytes -= uniform * elem * (1 - 1 / w)
        local_txn += (uniform + launch.stack) / w
        instr += launch.stack / w
    per_sm_issue = dev["issue"] if dev["eus"] is None else dev["issue"]
    work = {   # clocks per group with the SM to itself (FG_DPAS: MACs on the matrix engines)
        "fma": c["fma"] / (dev["xmx_macs"] if dpas else dev["fma_lanes"]) / n_groups,
        "issue": instr / per_sm_issue / n_groups,
        "local": local_txn / dev["local_per_clk"] / n_groups,
        "sfu": c["exp"] / dev["sfu"] / n_groups,
    }
    barriers_per_group = c["barriers"] / launch.items / n_groups
    latency = (launch.phases * dev["lat_global"] + barriers_per_group * dev["lat_barrier"] +
               launch.row_chain * dev["lat_dep"] +
               (getattr(launch, "tiles_per_group", 0) * dev["lat_exp"]))
    busiest = cdiv(n_groups, dev["sms"])
    rounds = [g_max] * (busiest // g_max) + ([busiest % g_max] if busiest % g_max else [])
    crit = max(work.values()) + latency
    sm_clocks = sum(max(max(g * v for v in work.values()), crit) for g in rounds)
    resource_s = {r: busiest * v / dev["clock"] for r, v in work.items()}
    resource_s["latency"] = len(rounds) * crit / dev["clock"]
    resource_s["global"] = gbytes / dev["bandwidth"]
    sm_s = sm_clocks / dev["clock"]
    time_s = max(sm_s, resource_s["global"])
    if time_s == resource_s["global"]:
        limiter = "global"
    else:   # the term that sets the busiest round
        g = rounds[0]
        pipe = max(work, key=work.get)
        limiter = pipe if g * work[pipe] >= crit else "latency"
    notes = []
    if dev["simd"] and regs and regs > 128:
        notes.append(f"{regs} regs > SIMD8's 128: spills likely")
    if n_groups < dev["sms"] * g_max:
        notes.append(f"{n_groups} groups < {dev['sms']}x{g_max} slots")
    return dict(time=time_s, limiter=limiter, groups_per_sm=g_max, g_bound=g_bound, simd=w,
                resources=resource_s, notes=notes, busiest=busiest, rounds=len(rounds),
                work=work, latency=latency, bcast=bcast, n16=n16, gbytes=gbytes)


# --- the cases ---------------------------------------------------------------------------------
def useful_attention_flop(b, h, lq, lk, d, causal):
    kept = sum(min(i + 1, lk) for i in range(lq)) if causal else lq * lk
    return 4 * d * b * h * kept


CASES = [
    # (label, kind, args)
    ("flash L4096 d64", "fused", (4, 8, 8, 4096, 4096, 64, False)),
    ("flash L4096 d64 causal", "fused", (4, 8, 8, 4096, 4096, 64, True)),
    ("flash L4096 d128", "fused", (4, 8, 8, 4096, 4096, 128, False)),
    ("flash L4096 d128 causal", "fused", (4, 8, 8, 4096, 4096, 128, True)),
    ("flash L1024 B1 H8 d64", "fused", (1, 8, 8, 1024, 1024, 64, False)),
    ("decode 4k B1 H8 d64", "fused", (1, 8, 8, 1, 4096, 64, False)),
    ("decode 32k B1 H8 d64", "fused", (1, 8, 8, 1, 32768, 64, False)),
    ("decode 4k GQA 32/8 d128", "fused", (1, 32, 8, 1, 4096, 128, False)),
    ("decode 32k GQA 32/8 d128", "fused", (1, 32, 8, 1, 32768, 128, False)),
    ("unfused L4096 d64", "unfused", (4, 8, 4096, 4096, 64, False)),
    ("matmul 4096^3", "matmul", (4096, 4096, 4096)),
    ("matmul 4096x1536x512", "matmul", (4096, 1536, 512)),
    # the attention backward (bwd_delta + bwd_dkdv + bwd_dq, the generic GPU kernels); % of
    # peak from FlashAttention-2's useful FLOP (10 d per kept pair); last, so that a "before"
    # model.py without them still pairs its rows with these
    ("backward L4096 d64", "backward", (4, 8, 8, 4096, 4096, 64, False)),
    ("backward L4096 d64 causal", "backward", (4, 8, 8, 4096, 4096, 64, True)),
    ("backward L4096 d128", "backward", (4, 8, 8, 4096, 4096, 128, False)),
    ("backward L1024 B1 H8 d64", "backward", (1, 8, 8, 1024, 1024, 64, False)),
    # the same with the generic dK/dV pass (bwd_dkdv, one key per work-item) the host ran
    # before flash_bwd_gpu.cl (2026-12-06); skipped for a model.py without the choice
    ("backward generic L4096 d64", "backward_generic", (4, 8, 8, 4096, 4096, 64, False)),
    ("backward generic L4096 d64 causal", "backward_generic", (4, 8, 8, 4096, 4096, 64, True)),
    ("backward generic L4096 d128", "backward_generic", (4, 8, 8, 4096, 4096, 128, False)),
    ("backward generic L1024 B1 H8 d64", "backward_generic",
     (1, 8, 8, 1024, 1024, 64, False)),
    # 16-bit q, k, v (issue 51): flash_gpu with f16 storage (float32 FMAs), and on a device
    # with Intel's matrix engines (DEVICES' xmx_macs) the FG_DPAS variant with the device's
    # sub-group size, counted without its emulation (model.py flash_group, emulation=False);
    # % of peak against the FP32 peak like every row (the engines' own: xmx_macs), last
    ("flash f16 L4096 d64", "fused16", (4, 8, 8, 4096, 4096, 64, False)),
    ("flash f16 L4096 d64 DPAS", "dpas", (4, 8, 8, 4096, 4096, 64, False)),
    ("flash f16 L4096 d128", "fused16", (4, 8, 8, 4096, 4096, 128, False)),
    ("flash f16 L4096 d128 DPAS", "dpas", (4, 8, 8, 4096, 4096, 128, False)),
    ("flash f16 L4096 d64 causal DPAS", "dpas", (4, 8, 8, 4096, 4096, 64, True)),
]
SHAPES = {
    "fused": "B=4 H=8 (B·H=32)", "unfused": "B=4 H=8",
}


def case_launches(mod, restore, kind, args, dev=None):
    if kind in ("backward", "backward_generic"):
        b, h, hkv, lq, lk, d, causal = args
        dkdv = "generic" if kind == "backward_generic" else None
        return backward_launches(mod, b, h, hkv, lq, lk, d, causal, dkdv), useful_backward_flop(
            b, h, lq, lk, d, causal)
    if kind in ("fused", "fused16", "dpas"):
        b, h, hkv, lq, lk, d, causal = args
        flop = useful_attention_flop(b, h, lq, lk, d, causal)
        elem = 4 if kind == "fused" else 2
        dpas = dev["dpas_sg"] if kind == "dpas" else 0
        return fused_launches(mod, restore, b, h, hkv, lq, lk, d, causal, elem, dpas), flop
    if kind == "unfused":
        b, h, lq, lk, d, causal = args
        return unfused_launches(mod, b, h, lq, lk, d, causal), useful_attention_flop(
            b, h, lq, lk, d, causal)
    m, n, k = args
    return [matmul_launch(mod, mod.matmul(m, n, k), m, n, k, 1)], 2 * m * n * k


def evaluate(variant, dev, broadcast, bwd_broadcast=False):
    """Rows for one (formulas, registers) variant on one device."""
    mod, overrides, rows_table = variant["mod"], variant["regs"], variant["table"]
    restore = set_device(mod, dev)
    out = []
    try:
        for label, kind, args in CASES:
            if kind == "backward" and not hasattr(mod, "backward_launches"):
                continue      # a model.py from before the backward
            if kind == "backward_generic" and not hasattr(mod, "bwd_dkdv_gpu"):
                continue      # a model.py from before flash_bwd_gpu.cl: "backward" is generic
            if kind in ("fused16", "dpas") and not hasattr(mod, "dpas_tiles"):
                continue      # a model.py from before FG_DPAS
            if kind == "dpas" and not dev.get("xmx_macs"):
                continue      # no matrix engine on the device
            launches, flop = case_launches(mod, restore, kind, args, dev)
            total, parts = 0.0, []
            for launch in launches:
                regs = lookup_override(overrides, launch.kernel, launch.dk, launch.bq, launch.bk)
                how = "override"
                if launch.kernel == "flash_gpu_dpas":   # no proxy: ptxas has no DPAS
                    t_regs, t_smem, t_how = 128, None, "assumed"
                else:
                    t_regs, t_smem, t_how = table_regs(rows_table, launch.kernel, launch.dk,
                                                       launch.bq, launch.bk)
                if regs is None:
                    regs, how = t_regs, t_how
                if regs is None and (launch.kernel, launch.dk) in BWD_PROXY:
                    regs, how = BWD_PROXY[(launch.kernel, launch.dk)], "proxy"
                if regs is None:
                    regs, how = 64, "assumed"
                if launch.kernel not in ("flash_gpu", "flash_gpu_dpas") and t_smem is not None:
                    launch.smem = t_smem     # the proxy's shared memory (flash_gpu: computed)
                p = predict(dev, launch, regs, broadcast, bwd_broadcast)
                if p is None:
                    raise SystemExit(f"gpu_model.py: {launch.kernel} does not fit an SM")
                p.update(launch=launch, regs=regs, regs_how=how)
                parts.append(p)
                total += p["time"]
            out.append(dict(label=label, kind=kind, args=args, flop=flop, time=total,
                            parts=parts))
    finally:
        restore()
    return out


# --- output ------------------------------------------------------------------------------------
RES = ("fma", "issue", "local", "sfu", "global", "latency")


def fmt_us(s):
    return f"{s * 1e6:.1f}" if s < 1e-3 else f"{s * 1e6:.0f}"


def row_cells(dev, row, part=None):
    """Cells of one table row: a whole case (part None: its launches summed) or one launch."""
    peak = peak_flops(dev)
    if part is None and len(row["parts"]) == 1:
        part = row["parts"][0]
    if part is not None:
        L = part["launch"]
        res = part["resources"]
        time = part["time"]
        flop = row["flop"] if len(row["parts"]) == 1 else 2 * L.c["fma"]
        tf = flop / time / 1e12
        kernel = L.kernel
        tiles = L.tiles
        occ = f"{part['groups_per_sm']} ({part['g_bound']})"
        simd = f", SIMD{part['simd']}" if dev["simd"] else ""
        regs = f"{part['regs']}{'*' if part['regs_how'] != 'proxy' else ''}{simd}"
        groups = f"{L.groups}"
        limiter = part["limiter"]
        res_cells = [fmt_us(res[r]) for r in RES]
        notes = "; ".join(part["notes"])
    else:
        time = row["time"]
        tf = row["flop"] / time / 1e12
        kernel, tiles, occ, regs, groups = "(path total)", "", "", "", ""
        limiter = " + ".join(f"{p['launch'].kernel}: {p['limiter']}" for p in row["parts"])
        res_cells = [""] * len(RES)
        notes = ""
    return [row["label"], kernel, tiles, regs, occ, groups, fmt_us(time), f"{tf:.2f}",
            f"{100 * tf * 1e12 / peak:.0f}", limiter] + res_cells + [notes]


HEADER = ["case", "kernel", "tiles", "regs", "groups/SM (bound)", "groups", "time us",
          "TFLOP/s", "% peak", "limiter"] + [f"{r} us" for r in RES] + ["notes"]


def print_tables(results, markdown):
    for dev_key, dev, variants in results:
        title = (f"{dev['name']}: {dev['sms']} {'SMs' if dev['eus'] is None else 'DSS'}, "
                 f"{dev['clock'] / 1e9:.2f} GHz, FP32 peak {peak_flops(dev) / 1e12:.2f} TFLOP/s, "
                 f"{dev['bandwidth'] / 1e12 * 1000:.0f} GB/s")
        for vname, rows in variants:
            lines = []
            for row in rows:
                if len(row["parts"]) > 1:
                    for part in row["parts"]:
                        lines.append(row_cells(dev, row, part))
                lines.append(row_cells(dev, row))
            if markdown:
                print(f"\n**{title}; formulas: {vname}**\n")
                print("| " + " | ".join(HEADER) + " |")
                print("|" + "|".join("---" if i < 5 or i == 9 or i == len(HEADER) - 1
                                     else "---:" for i in range(len(HEADER))) + "|")
                for cells in lines:
                    print("| " + " | ".join(cells) + " |")
            else:
                print(f"\n== {title}\n   formulas: {vname}")
                widths = [max(len(HEADER[i]), *(len(l[i]) for l in lines))
                          for i in range(len(HEADER))]
                print("  ".join(h.ljust(w) for h, w in zip(HEADER, widths)).rstrip())
                for cells in lines:
                    print("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())


def print_comparison(results, markdown):
    """The first variant against the second, per device and case: time ratio (> 1: the second
    variant is faster) and both limiters."""
    for dev_key, dev, variants in results:
        if len(variants) < 2:
            continue
        (n0, r0), (n1, r1) = variants[0], variants[1]
        head = ["case", f"time us ({n0})", f"time us ({n1})", "speed-up", "limiter " + n0,
                "limiter " + n1, "groups/SM"]
        lines = []
        for a, b in zip(r0, r1):
            if a["kind"] != "fused":
                continue
            pa, pb = a["parts"][0], b["parts"][0]
            lines.append([a["label"], fmt_us(a["time"]), fmt_us(b["time"]),
                          f"{a['time'] / b['time']:.2f}x", pa["limiter"], pb["limiter"],
                          f"{pa['groups_per_sm']} -> {pb['groups_per_sm']}"])
        if markdown:
            print(f"\n**{dev['name']}: {n0} against {n1} (flash_gpu; speed-up > 1: {n1} "
                  f"faster)**\n")
            print("| " + " | ".join(head) + " |")
            print("|---|---:|---:|---:|---|---|---|")
            for l in lines:
                print("| " + " | ".join(l) + " |")
        else:
            print(f"\n== {dev['name']}: {n0} against {n1} (flash_gpu; speed-up > 1: {n1} faster)")
            widths = [max(len(head[i]), *(len(l[i]) for l in lines)) for i in range(len(head))]
            print("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
            for l in lines:
                print("  ".join(c.ljust(w) for c, w in zip(l, widths)).rstrip())


def print_breakdown(results):
    for dev_key, dev, variants in results:
        for vname, rows in variants:
            print(f"\n-- {dev['name']}, {vname}: per-group clocks (whole SM), latency S, "
                  "busiest SM's groups and rounds, 128-bit loads")
            for row in rows:
                for p in row["parts"]:
                    w = " ".join(f"{k}={v:.0f}" for k, v in p["work"].items())
                    print(f"  {row['label']:28} {p['launch'].kernel:13} {w} S={p['latency']:.0f}"
                          f" n={p['busiest']} rounds={p['rounds']} n16={p['n16']:.3g}"
                          f" bcast={p['bcast']:.2f}")


def parse_regs(items):
    out = {}
    for item in items or []:
        key, _, value = item.partition("=")
        if not value.isdigit():
            raise SystemExit(f"gpu_model.py: --regs wants KERNEL[:dD[:bqN[:bkN]]]=N, got {item}")
        out[key] = int(value)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formulas", default=MAIN_MODEL,
                    help="the model.py to evaluate (default: tests/gpu_model/model.py)")
    ap.add_argument("--regs", action="append",
                    help="registers per work-item, e.g. flash_gpu:d64=168 (repeatable; "
                         "keys: kernel, kernel:dD, kernel:dD:bqN, kernel:dD:bqN:bkN)")
    ap.add_argument("--table", default=TABLE, help="the proxy's table (tests/resources/table.md)")
    ap.add_argument("--before", default=BEFORE,
                    help=f"a git ref whose model.py and table.md are the first variant "
                         f"(default {BEFORE})")
    ap.add_argument("--before-regs", action="append",
                    help="registers overridden for the first variant (as --regs)")
    ap.add_argument("--no-before", action="store_true", help="evaluate this tree only")
    ap.add_argument("--device", choices=sorted(DEVICES), action="append",
                    help="h200, xe or arc (default all three)")
    ap.add_argument("--no-broadcast", action="store_true",
                    help="charge 128-bit local loads per byte (no broadcast merging)")
    ap.add_argument("--bwd-broadcast", action="store_true",
                    help="the backward's warp-uniform global loads as one request per warp "
                         "(bytes / 32 to DRAM) and one L1 wavefront each, its private rows' "
                         "stack accesses as L1 wavefronts too (default: every work-item's "
                         "request at DRAM bandwidth, as for the forward)")
    ap.add_argument("--markdown", action="store_true", help="markdown tables for BENCHMARKS.md")
    ap.add_argument("--breakdown", action="store_true", help="per-group work and latency too")
    opts = ap.parse_args()

    table = parse_table(opts.table)
    name_now = "now" if os.path.abspath(opts.formulas) == MAIN_MODEL else opts.formulas
    now = dict(name=name_now, mod=load_formulas(opts.formulas, "work_model_now"),
               regs=parse_regs(opts.regs), table=table)
    variants = []
    if not opts.no_before:
        model_path = git_file(opts.before, "tests/gpu_model/model.py", "_model.py")
        table_path = git_file(opts.before, "tests/resources/table.md", "_table.md")
        try:
            if model_path is None or table_path is None:
                print(f"gpu_model.py: note: git has no ref {opts.before} (or no git): the "
                      "'before' variant is skipped", file=sys.stderr)
            else:
                variants.append(dict(name=f"before ({opts.before})",
                                     mod=load_formulas(model_path, "work_model_before"),
                                     regs=parse_regs(opts.before_regs),
                                     table=parse_table(table_path)))
        finally:
            for path in (model_path, table_path):
                if path is not None:
                    os.unlink(path)
    variants.append(now)
    results = []
    for key in opts.device or ["h200", "xe", "arc"]:
        dev = DEVICES[key]
        results.append((key, dev, [(v["name"], evaluate(v, dev, not opts.no_broadcast,
                                                         opts.bwd_broadcast))
                                   for v in variants]))
    print_tables(results, opts.markdown)
    print_comparison(results, opts.markdown)
    if opts.breakdown:
        print_breakdown(results)
    print("\nregs: * = not the proxy's exact variant (an override, or "
          "the nearest variant of the same head size); times exclude launch overhead.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
