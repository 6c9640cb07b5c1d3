#!/usr/bin/env python3
"""The GPU work model: closed-form counts of the work each GPU kernel does, checked against
Oclgrind's instruction counter (oclgrind --inst-counts) on the shapes of CASES.

No GPU is lent to this project, so the GPU kernels' efficiency is held to formulas instead:
global and local loads and stores, barriers, FMAs and exps per launch, as functions of the
shape and of the tile parameters the host picks (GPU class: CLATTN_PARAMS=gpu, the tuning
table's gpu row, Oclgrind's local memory pinned to 48 KiB). The formulas are derived from the
kernel code (see each function below and tests/gpu_model/README.md); today they match the
measured counts exactly. A kernel change that moves any count fails this check until the
formula is updated with it, so every change of traffic is a reviewed decision.

Usage: model.py BUILD_DIR [--kernels DIR] [--case NAME...] [--list]
  Runs BUILD_DIR/gpu_model_driver under Oclgrind per case, prints one table row per
  (launch, counter): measured, formula, and the derived ratios; exits 1 on any mismatch
  (2: bad usage, no oclgrind, a driver that failed). --kernels DIR loads the .cl files from DIR
  (CLATTN_KERNEL_DIR; run.sh's canary plants a change there).

Units: loads and stores are counted in operations (Oclgrind's "load global" etc.; one float, int
or uchar each: every kernel here moves scalars) and in bytes (Oclgrind's "(N bytes)"); barriers
in work-item calls of barrier(); fma in calls of fma() or mad(); exp in calls of exp().
Python 3 standard library only.
"""
import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import time

# --- the parameters the model assumes (host/tuning/table.h's gpu row; Oclgrind's device) ----
# Checked against what the driver prints (clattn_ctx_tuning's parameters line): a change of the
# tuning row is a change of traffic too, and fails here until the model is updated.
PARAMS = {
    "tile_m": 64, "tile_n": 64, "tile_k": 16, "wpt_m": 4, "wpt_n": 4,  # matmul.cl
    "softmax_wg": 256, "softmax_rows": 0,                             # softmax.cl, GPU variant
    "flash_gpu": 1, "fg_bq": 64, "fg_bk": 32, "fg_tx": 16, "fg_ty": 8,  # flash_gpu.cl
    "loop_trip_limit": 0, "decode_keys": 256, "heads_wg": 256,        # key parts, decode splits
}
LOCAL_MEM = 49152   # oclgrind --local-mem-size (its default, 32 KiB, makes the host pick others)
COMPUTE_UNITS = 1   # Oclgrind's CL_DEVICE_MAX_COMPUTE_UNITS (decode splits depend on it)

COUNTERS = ("global_loads", "global_load_bytes", "global_stores", "global_store_bytes",
            "local_loads", "local_load_bytes", "local_stores", "local_store_bytes",
            "barriers", "fma", "exp")


def cdiv(a, b):
    return -(-a // b)


def counts(**kw):
    c = dict.fromkeys(COUNTERS, 0)
    c.update(kw)
    return c


def add(a, b):
    return {k: a[k] + b[k] for k in COUNTERS}


# --- matmul (kernels/matmul.cl, `matmul`: local-memory tiles, register blocks) ---------------
def matmul(m, n, k, batch=1, p=PARAMS):
    """C (m x n) = A (m x k) B (k x n), float32, beta 0, no bias, `batch` products.

    Work-groups: ceil(m/TM) x ceil(n/TN) per product, of (TN/WN) x (TM/WM) work-items; each
    walks ceil(k/TK) K tiles. Per tile a group stages TM*TK elements of A and TN*TK of B (every
    element stored, zeros past the edges: local stores), then each work-item reads WM + WN
    local words per kk and does WM*WN mads (so (WM+WN)/(WM*WN) = 0.5 local loads per FMA with
    4 x 4 blocks); two barriers per tile. Global loads only where in range: each A element is
    read once per column of groups and each B element once per row of groups (tiling's IO
    count); each C element stored once (beta 0: C is not read)."""
    tm, tn, tk, wm, wn = (p[x] for x in ("tile_m", "tile_n", "tile_k", "wpt_m", "wpt_n"))
    items = (tm // wm) * (tn // wn)
    gm, gn, kt = cdiv(m, tm), cdiv(n, tn), cdiv(k, tk)
    groups = batch * gm * gn
    loads = batch * (gn * m * k + gm * k * n)
    local_loads = groups * items * kt * tk * (wm + wn)
    local_stores = groups * kt * tk * (tm + tn)
    return counts(global_loads=loads, global_load_bytes=4 * loads,
                  global_stores=batch * m * n, global_store_bytes=4 * batch * m * n,
                  local_loads=local_loads, local_load_bytes=4 * local_loads,
                  local_stores=local_stores, local_store_bytes=4 * local_stores,
                  barriers=groups * items * kt * 2, fma=groups * tm * tn * kt * tk)


# --- key bands (kernels/score.cl): no window here, causal top-left or none --------------------
def band_end(row, limit, causal):
    return min(row + 1, limit) if causal else limit


# --- softmax_rows (kernels/softmax.cl, SOFTMAX_VEC 0: a work-group of W items per row) -------
def softmax_rows(rows, seq_q, seq_k, limit, causal, has_kv_len, p=PARAMS):
    """`rows` rows (b, h, i) of seq_k raw scores; row i keeps keys below band_end(i).

    Three passes over the row: max (reads raw at kept keys), exp (reads raw again at kept keys,
    stores every numerator into out: exp(-inf) = 0 for the others), scale (reads and stores out
    at every key): global loads 2 * kept + seq_k, stores 2 * seq_k, one exp per element. Each
    work-item reads its batch's key count once (make_band) when there is one. Two tree
    reductions of W = softmax_wg floats in local memory: each stores W + (W - 1) words, loads
    2 (W - 1) + W (every item reads the result), and meets 2 + log2 W barriers."""
    w = p["softmax_wg"]
    steps = w.bit_length() - 1
    assert 1 << steps == w
    per_batch = rows // seq_q
    kept = per_batch * sum(band_end(i, limit, causal) for i in range(seq_q))
    loads = 2 * kept + rows * seq_k
    kv = rows * w if has_kv_len else 0
    local_loads = rows * 2 * (w + 2 * (w - 1))
    local_stores = rows * 2 * (2 * w - 1)
    return counts(global_loads=loads + kv, global_load_bytes=4 * (loads + kv),
                  global_stores=2 * rows * seq_k, global_store_bytes=8 * rows * seq_k,
                  local_loads=local_loads, local_load_bytes=4 * local_loads,
                  local_stores=local_stores, local_store_bytes=4 * local_stores,
                  barriers=rows * w * 2 * (2 + steps), exp=rows * seq_k)


# --- flash_attention (kernels/flash_gpu.cl; tiles from host/ops/flash_gpu.c) ----------------
def flash_local_bytes(dk, dv, bq, bk, paged=False):
    """flash_gpu.cl's local arrays (host/ops/flash_gpu.c local_bytes): q and K rows of d_k in
    whole float4s + 4 words, V rows of d_v + 1, the weights' rows of FG_BK in whole float4s +
    4, the K/V tile rounded up to whole float4s, three row arrays, the padding flags (and with
    a paged cache the tile's pages and slots)."""
    qk_pad, v_pad, p_pad = cdiv(dk, 4) * 4 + 4, dv + 1, cdiv(bk, 4) * 4 + 4
    kv_words = cdiv(bk * max(qk_pad, v_pad), 4) * 4
    return (bq * qk_pad + kv_words + bq * p_pad + 3 * bq + (2 * bk if paged else 0)) * 4 + bk


def flash_gpu_tiles(dk, dv, seq_q, p=PARAMS, local_mem=LOCAL_MEM, paged=False):
    """The tiles host/ops/flash_gpu.c picks: FG_BQ halved while the rows still cover seq_q,
    then, until the local arrays fit the local memory less 1 KiB, FG_BQ halved down to 32
    rows, then FG_BK, then FG_BQ again."""
    tx, ty, bq, bk = p["fg_tx"], p["fg_ty"], p["fg_bq"], p["fg_bk"]
    while bq // 2 >= ty and (bq // 2) % ty == 0 and bq // 2 >= seq_q:
        bq //= 2

    def local_bytes(bq, bk):
        return flash_local_bytes(dk, dv, bq, bk, paged)

    budget = local_mem - 1024 if local_mem > 1024 else local_mem
    while local_bytes(bq, bk) > budget:
        if bq // 2 >= ty and (bq // 2) % ty == 0 and bq // 2 >= 32:
            bq //= 2
        elif bk // 2 >= tx and (bk // 2) % tx == 0:
            bk //= 2
        elif bq // 2 >= ty and (bq // 2) % ty == 0:
            bq //= 2
        elif tx % 2 == 0 and tx // 2 >= 4 and bk == tx:
            tx, bk = tx // 2, bk // 2   # (so TX = min(FG_TX, BK) from here on)
        else:
            raise ValueError("flash_gpu does not fit: the host would run flash.cl")
    return bq, bk


def dpas_tiles(dk, dv, seq_q, sg, emulated=True, p=PARAMS, local_mem=LOCAL_MEM, paged=False):
    """FG_DPAS's tiles (host/ops/flash_gpu.c dpas_tiles): sub-groups of sg items (FG_TX), 8
    rows each; FG_TY = fg_bq / 8 sub-groups, halved while the rows still cover seq_q, then
    (with the emulation's A fragments, FG_TY x 8 x sg words) halved, then the key tile (a
    multiple of 16) halved, until the local arrays fit. (BQ, BK)."""
    rows = max(1, p["fg_bq"] // 8)
    keys = 16 if p["fg_bk"] < 16 else p["fg_bk"] // 16 * 16
    while rows > 1 and rows // 2 * 8 >= seq_q:
        rows //= 2
    budget = local_mem - 1024 if local_mem > 1024 else local_mem
    while (flash_local_bytes(dk, dv, 8 * rows, keys, paged)
           + (rows * 8 * sg * 4 if emulated else 0)) > budget:
        if rows > 1:
            rows //= 2
        elif keys > 16:
            keys = keys // 32 * 16 if keys >= 32 else 16
        else:
            raise ValueError("FG_DPAS does not fit: the host would run flash_gpu without it")
    return 8 * rows, keys


def flash_group(bq, bk, dk, dv, seq_q, seq_k, first_row, key_begin, key_stop, limit, causal,
                has_kv_len, has_lse, elem=4, p=PARAMS, has_padding=False, flex=None,
                page_size=0, kv_elem=None, step=False, diag=0, dpas=0, emulation=True):
    """One work-group: query rows first_row .. first_row + bq - 1 (those past seq_q are padding,
    computed from zero queries on row 0's band, never stored), keys key_begin .. key_stop - 1.

    Global (FlashAttention's IO count for a bq-row block): Q's valid rows once (dk each); K and
    V once per block over the key tiles the block needs (keys below the batch's limit: past it
    the tile holds zeros); O's valid rows once; lse per valid row when written; the key count
    once per work-item (make_band). Per key tile of bk keys, 6 barriers (staging K, scores,
    two after the row pass, staging V, end), and 2 outside. q and K rows are d4 = d_k rounded
    up to whole float4s (zeros past d_k). Local stores per tile: the K tile (bk*d4), the tile's
    padding flags (bk bytes, with key padding only:
    SCORE_KPAD), the scores (bq*bk), the weights over them (bq*bk), the row state
    m, l, c (3 bq), the V tile (bk*dv); outside: the scaled q block (bq*d4), the initial m and
    l, the final 1/l. Local loads per tile: per work-item d4/4*(RM+RN) float4 loads (16 bytes)
    for S = Q K^T (RM = bq/TY rows, RN = bk/TX keys), RM*RN padding flags (bytes; with key padding only), RM rescale
    factors, and for O += P V the weights as RM float4 loads per 4 keys (scalar loads for the
    bk % 4 last keys); the V words, bk*dv per row of work-items (TY); the row pass 2 + bk (its
    max) + bk (its weights, unless every key of the tile is masked for the row). FMAs per
    work-item and tile: d4*RM*RN (S) + bk*RM*RD (P V, RD = ceil(dv/TX) dims each, padded dims
    included). exp: per row and tile that keeps a key, bk weights and one rescale.

    flex (a Flex: a user mask_mod, optionally a block mask; see flex_tiles): the tiles and the
    rows that keep a key of them come from the mask, and flex_tiles' global loads (block-mask
    bytes, mask_mod's aux loads) are added; everything else is counted as above over the
    visited tiles.

    dpas = the sub-group size (8 or 16): FG_DPAS, the two products on Intel's matrix engine
    (16-bit q, k, v; d_k a multiple of 16). TX = dpas items a sub-group, TY = BQ / 8 sub-groups,
    RM = 8 rows an item; staging, the row pass, the row close and the global traffic as above.
    The products: a call multiplies A (8 rows x 16 along k) by B (16 x TX) into the items'
    8 x 1 sums, 128 MACs an item (counted as FMAs: the same FMAs as flash_gpu's, d4 = d_k).
    Per call each item reads its A fragment from local memory once per 16 along k (dp_rows:
    8 words at sg 16, 16 at sg 8: q for S, the weights for P V; so no float4 loads) and its B
    column: S = Q K^T 16 K words a call (d_k * RN a tile), P V 16 V words for a dim below d_v
    (the V words as above). Calls per tile: d_k / 16 * RN + BK / 16 * RD. emulation (FG_DPAS =
    2, what Oclgrind runs): each call also stores the item's 8 A words to local memory (dp_xa),
    passes two barriers and reads the sub-group's fragments back, 8 x 16 words (sg 16) or 8 x 8
    (sg 8, two halves a word); emulation=False leaves those out: the hardware's work
    (FG_DPAS = 1, the extension's call in registers)."""
    tx, ty = min(p["fg_tx"], bk), p["fg_ty"]   # (the host halves TX with BK at BK == TX)
    if dpas:
        tx, ty = dpas, bq // 8
    items, rm, rn, rd = tx * ty, bq // ty, bk // tx, cdiv(dv, tx)
    d4, bk4 = cdiv(dk, 4) * 4, bk // 4 * 4
    kv_elem = elem if kv_elem is None else kv_elem
    valid = max(0, min(seq_q, first_row + bq) - first_row)
    last_row = min(seq_q, first_row + bq) - 1
    key_end = min(key_stop, band_end(last_row + diag, limit, causal))
    tiles = list(range(key_begin, key_end, bk))
    flex_loads = flex_load_bytes = 0
    if flex is not None:
        tiles, kept_row_tiles, flex_loads, flex_load_bytes = flex_tiles(
            flex, tiles, bq, bk, seq_q, seq_k, first_row, last_row, limit, causal, items)
    keys_read = sum(max(0, min(bk, limit - k0)) for k0 in tiles)

    def row_keeps(r, k0):  # whether row r keeps a key of the tile at k0 (padding: row 0's band)
        row = first_row + r
        end = band_end((row if row < seq_q else 0) + diag, limit, causal)
        return k0 < end

    if flex is None:
        kept_row_tiles = sum(row_keeps(r, k0) for r in range(bq) for k0 in tiles)
    t = len(tiles)
    kv_counts = items if has_kv_len else 0
    g_loads = valid * dk + keys_read * (dk + dv) + kv_counts
    g_stores = valid * dv + (valid if has_lse else 0)
    g_load_bytes = elem * valid * dk + kv_elem * keys_read * (dk + dv) + 4 * kv_counts
    g_loads += flex_loads
    g_load_bytes += flex_load_bytes
    g_store_bytes = elem * valid * dv + (4 * valid if has_lse else 0)
    l_loads_vec4 = t * items * (d4 // 4 * (rm + rn) + bk4 // 4 * rm)     # S; P, 4 keys
    s_split = dp_words = 0
    if dpas:
        # the products' local loads as words: A fragments (q for S, the weights for P V) and
        # S's K columns (P V's V words are counted below); no weights' tail (BK % 16 == 0)
        fragment = 8 * (2 if dpas == 8 else 1)
        l_loads_vec4 = 0
        dp_words = t * items * (dk // 16 * fragment + dk * rn + bk // 16 * fragment)
        bk4 = bk
    elif rm == 1 and rn == 1:
        # one row and one key an item (MLA's 8 x 8 tiles): the compiler splits S's float4
        # loads (q and K) into four scalar loads each, the same bytes (measured; the weights'
        # float4 loads stay whole)
        s_split = t * items * d4 // 4 * 2
        l_loads_vec4 -= s_split
    l_loads_words = (4 * s_split + dp_words + items * rm                  # acc init: row l
                     + t * items * (rm + (bk - bk4) * rm)                 # rescale, P tail
                     + t * ty * bk * dv                                   # V words
                     + t * bq * (2 + bk) + kept_row_tiles * bk            # the row pass
                     + bq + tx * valid + (valid if has_lse else 0))       # normalise, lse
    # padding flags: none without key padding (flash_gpu.cl's SCORE_KPAD variant leaves them
    # out; no case here has key padding). With it: one per (row, key) of the item's block;
    # with one key per item (RN = 1) LLVM hoists the load out of the rows loop.
    l_loads_bytes = t * items * (rn if rn == 1 else rm * rn) if has_padding else 0
    l_stores_words = bq * d4 + 2 * bq + t * (bk * d4 + 2 * bq * bk + 3 * bq + bk * dv) + bq
    l_stores_bytes = t * bk if has_padding else 0
    barriers = items * (6 * t + 2)
    if page_size:
        # KV_PAGED (fg_stage_pages): each item lowers the limit through the table (paged_limit:
        # one I32 load per block below it); per tile one I32 table load per key below the
        # limit, 2 BK words staged (pages, slots), one barrier; each staged K and V element
        # reads its key's page and slot from local memory
        # (a decode step's table walk covers the new key's block too: its band is the one after
        # the step, the tiles' the cached keys')
        table = items * cdiv(limit + (1 if step else 0), page_size) + keys_read
        g_loads += table
        g_load_bytes += 4 * table
        l_stores_words += 2 * bk * t
        l_loads_words += 2 * keys_read * (dk + dv)
        barriers += items * t
    if dpas and emulation:
        # the emulation's A fragments through local memory, per call and item
        calls = t * items * (dk // 16 * rn + bk // 16 * rd)
        l_stores_words += 8 * calls
        l_loads_words += 8 * (16 if dpas == 16 else 8) * calls
        barriers += 2 * calls
    return counts(global_loads=g_loads, global_load_bytes=g_load_bytes,
                  global_stores=g_stores, global_store_bytes=g_store_bytes,
                  local_loads=l_loads_vec4 + l_loads_words + l_loads_bytes,
                  local_load_bytes=16 * l_loads_vec4 + 4 * l_loads_words + l_loads_bytes,
                  local_stores=l_stores_words + l_stores_bytes,
                  local_store_bytes=4 * l_stores_words + l_stores_bytes,
                  barriers=barriers,
                  fma=t * items * (d4 * rm * rn + bk * rm * rd),
                  exp=kept_row_tiles * (bk + 1))


# --- a KV cache's decode step in one launch (flash_gpu.cl's KV_STEP) ------------------------
def step_group(bq, bk, dk, dv, valid, stores_row, elem=4, page_size=0, p=PARAMS):
    """The step's part of a work-group's counts (flash_gpu.cl after the key tiles: the group
    whose keys hold the new key, step_keys): three barriers; fg_step_weights by the row
    owners: for each of the `valid` rows (every valid row's band holds the new key: bottom-
    right causal) the dot of its staged q row (dk local loads) with k_new (dk global loads,
    dk FMAs), row_m and row_l (2 local loads, 2 stores), two exps (the rescale and the weight),
    one more FMA (l * c + p, contracted); every row of the block stores its weight (p_tile) and factor (row_c); fg_step_accumulate:
    each item reads c and p of its RM rows (2 RM local loads) and, per row and dim below dv,
    v_new from global memory (not hoisted out of the rows: BQ * dv loads a group), RM * RD
    FMAs (padded dims included); the k/v head's first group (stores_row) copies k_new and v_new
    into the cache (kv_step_store: dk + dv loads and stores; paged, each of its items first
    reads the new key's page from the table: one I32 load, the same entry for K and V)."""
    tx, ty = min(p["fg_tx"], bk), p["fg_ty"]
    items, rm, rd = tx * ty, bq // ty, cdiv(dv, tx)
    loads = valid * dk + bq * dv + ((dk + dv) if stores_row else 0)
    table = items if stores_row and page_size else 0
    stores = (dk + dv) if stores_row else 0
    local_loads = valid * (dk + 2) + items * 2 * rm
    local_stores = 2 * bq + 2 * valid
    return counts(global_loads=loads + table, global_load_bytes=elem * loads + 4 * table,
                  global_stores=stores, global_store_bytes=elem * stores,
                  local_loads=local_loads, local_load_bytes=4 * local_loads,
                  local_stores=local_stores, local_store_bytes=4 * local_stores,
                  barriers=3 * items, fma=valid * (dk + 1) + items * rm * rd, exp=2 * valid)


def kv_append(batch, kv_heads, n, dk, dv, page_size=0, elem=4):
    """kernels/heads.cl kv_append (the cache's append of n keys): one work-item per element of
    the new keys and of the values: one load (+ one block-table load, paged), one store; the
    batch's key counts stored once each."""
    elems = batch * kv_heads * n * (dk + dv)
    table = elems if page_size else 0
    return counts(global_loads=elems + table, global_load_bytes=elem * elems + 4 * table,
                  global_stores=elems + batch, global_store_bytes=elem * elems + 4 * batch)


def step_launches(batch, heads, kv_heads, n, d, page_size=0, elem=4):
    """clattn_kv_cache_append of n keys (kv_append), then one decode step
    (clattn_kv_cache_decode: flash_attention with KV_STEP): seq_k = n + 1 keys, no key counts
    read (the host gives the step's), the tiles over the n cached keys (flash_group), then the
    step (step_group) in the group holding key n, and query head 0's first item stores the
    batch's new key count."""
    h, rows = heads, 1
    if heads > kv_heads:   # the grouped decode
        h, rows = kv_heads, heads // kv_heads
    bq, bk = (flash_gpu_tiles(d, d, rows, paged=True) if page_size
              else flash_gpu_tiles(d, d, rows))
    blocks = cdiv(rows, bq)
    splits, split_keys = decode_splits(blocks * batch * h, n + 1, bk)
    assert splits == 1, "the step's model covers one split"
    total = counts()
    for block in range(blocks):
        group = flash_group(bq, bk, d, d, rows, n + 1, block * bq, 0, n + 1, n, False, False,
                            False, elem, page_size=page_size, step=True)
        valid = min(rows, block * bq + bq) - block * bq
        group = add(group, step_group(bq, bk, d, d, valid, block == 0, elem, page_size))
        total = add(total, {k: v * batch * h for k, v in group.items()})
    total["global_stores"] += batch
    total["global_store_bytes"] += 4 * batch
    return [("kv_append", kv_append(batch, kv_heads, n, d, d, page_size, elem)),
            ("flash_attention", total)]


# --- a mixed batch in one launch (packed queries over a paged cache: PACKED_GRID) ---------
def mixed_launches(heads, kv_heads, d, page_size, requests, p=PARAMS):
    """requests: [(rows, keys)], bottom-right causal, float32. The host sizes BQ for the
    longest request's rows and launches total_q // BQ + batch work-groups per head (score.cl
    PACKED_GRID); request b owns the groups from cu_q[b] // BQ + b on. Every item of a group
    finds its request by bisection over cu_seqlens_q (packed_group_of: one I32 load per step,
    then one of its request's offset), then its span (paged_varlen_span: the request's two
    offsets and its key count: 3 loads); a group past its request's rows leaves there. The
    others are flash_group's over the request's rows and keys (the band's diagonal at
    keys - rows), paged."""
    batch = len(requests)
    cu = [0]
    for rows, _ in requests:
        cu.append(cu[-1] + rows)
    total_q = cu[-1]
    bq, bk = flash_gpu_tiles(d, d, max(r for r, _ in requests), paged=True)
    tx, ty = min(p["fg_tx"], bk), p["fg_ty"]
    items = tx * ty
    blocks = max(cdiv(n, page_size) for _, n in requests)
    seq_k = blocks * page_size
    total = counts()
    for g in range(total_q // bq + batch):
        lo, hi, loads = 0, batch, 0
        while hi - lo > 1:
            mid = lo + (hi - lo) // 2
            loads += 1
            if cu[mid] // bq + mid <= g:
                lo = mid
            else:
                hi = mid
        first_row = (g - min(g, cu[lo] // bq + lo)) * bq
        loads += 1 + 3
        group = counts(global_loads=items * loads, global_load_bytes=4 * items * loads)
        rows, keys = requests[lo]
        if first_row < rows:
            group = add(group, flash_group(bq, bk, d, d, rows, seq_k, first_row, 0, seq_k,
                                           min(keys, seq_k), True, True, False,
                                           page_size=page_size, diag=keys - rows))
        total = add(total, group)
    return [("flash_attention", {k: v * heads for k, v in total.items()})]


# --- user mask functions (clattn_flex_desc; score.cl's FLEX section, kernels/flex.cl) -------
class Flex:
    """A user mask_mod and its costs: keep(q, k) -> bool (the same for every batch and head),
    aux_loads: the global loads of one call (each of aux_bytes bytes), blocks: (BQ, BK) of a
    block mask made from it (clattn_flex_block_mask), or None."""

    def __init__(self, keep, aux_loads, aux_bytes, blocks=None):
        self.keep, self.aux_loads, self.aux_bytes, self.blocks = keep, aux_loads, aux_bytes, blocks


def doc_mask(seq, docs, blocks=None):
    """The driver's flexdoc=N: doc[i] = i * N / L, kept when doc[q] == doc[k]; mask_mod reads
    doc twice (two I32 loads a call: both kept by the compiler, nothing hoisted)."""
    doc = [i * docs // seq for i in range(seq)]
    return Flex(lambda q, k: doc[q] == doc[k], 2, 4, blocks)


def block_states(flex, seq_q, seq_k):
    """flex_block_mask's verdicts (kernels/flex.cl) per (query block, key block): 0 empty, 1
    partial, 2 full, and the mask_mod calls that made them (a work-item stops at the first pair
    that makes its block partial: once it has seen a kept and a dropped pair)."""
    fbq, fbk = flex.blocks
    states, calls = {}, 0
    for qb in range(cdiv(seq_q, fbq)):
        for kb in range(cdiv(seq_k, fbk)):
            seen_any, seen_all = False, True
            for q in range(qb * fbq, min(seq_q, (qb + 1) * fbq)):
                for k in range(kb * fbk, min(seq_k, (kb + 1) * fbk)):
                    keep = flex.keep(q, k)
                    calls += 1
                    seen_any, seen_all = seen_any or keep, seen_all and keep
                    if seen_any and not seen_all:
                        break
                if seen_any and not seen_all:
                    break
            states[qb, kb] = 0 if not seen_any else 2 if seen_all else 1
    return states, calls


def flex_block_mask(batch, heads, seq_q, seq_k, flex):
    """kernels/flex.cl flex_block_mask, one work-item per block of every (b, h) (the work-items
    past the last block, up to a multiple of 64, leave): mask_mod's loads per call it makes
    (block_states), one U8 store per block. No local memory, barriers, FMAs or exps."""
    states, calls = block_states(flex, seq_q, seq_k)
    loads = batch * heads * calls * flex.aux_loads
    stores = batch * heads * len(states)
    return counts(global_loads=loads, global_load_bytes=flex.aux_bytes * loads,
                  global_stores=stores, global_store_bytes=stores)


def flex_tiles(flex, tiles, bq, bk, seq_q, seq_k, first_row, last_row, limit, causal, items):
    """A flash_attention work-group's key tiles with a user mask_mod (flash_gpu.cl's key-tile
    loop, score.cl's FLEX_TILE, flex_tile_band, score_rule): (the tiles visited, the (row, tile)
    pairs where the row keeps a key of the tile, the extra global loads and their bytes).

    With a block mask every work-item computes the tile's verdict (flex_tile: one U8 load per
    block that rows first_row .. last_row (the valid ones) and keys k0 .. min(k0 + BK, limit) - 1
    touch), on every tile of the group's key range; a tile whose blocks are all empty is skipped
    (nothing else is loaded, stored or counted for it), one whose blocks are all full is visited
    without mask_mod. Without a block mask every tile is visited, mask_mod on. Where mask_mod is
    on, score_rule calls it for each (row, key) of the tile inside the row's band (key below
    band_end; so never past the key count), every row of the block: padding rows (past seq_q)
    too, as row 0 (their safe_row); aux_loads global loads per call. A row keeps a key of the
    tile when some key inside its band passes mask_mod (every one on a full tile)."""
    fbq, fbk = flex.blocks or (0, 0)
    states = block_states(flex, seq_q, seq_k)[0] if flex.blocks else None
    visited, kept, block_loads, calls = [], 0, 0, 0
    for k0 in tiles:
        state = 1
        if states is not None:
            key1 = min(k0 + bk, limit)
            blocks = [states[qb, kb] for qb in range(first_row // fbq, last_row // fbq + 1)
                      for kb in range(k0 // fbk, (key1 - 1) // fbk + 1)]
            block_loads += items * len(blocks)
            state = 0 if not any(blocks) else 2 if all(b == 2 for b in blocks) else 1
        if state == 0:
            continue
        visited.append(k0)
        for r in range(bq):
            row = first_row + r if first_row + r < seq_q else 0
            keys = range(k0, min(k0 + bk, band_end(row, limit, causal)))
            if state == 1:
                calls += len(keys)
                kept += any(flex.keep(row, k) for k in keys)
            else:
                kept += len(keys) > 0
    mask_loads = calls * flex.aux_loads
    return visited, kept, block_loads + mask_loads, block_loads + flex.aux_bytes * mask_loads


def decode_splits(groups, seq_k, bk, p=PARAMS):
    """host/ops/flash.c choose_splits: (count, keys per split), or (1, 0)."""
    target = 2 * COMPUTE_UNITS
    min_keys = p["decode_keys"]
    if min_keys == 0 or groups >= target or seq_k < 2 * min_keys:
        return 1, 0
    want = min(cdiv(target, groups), seq_k // min_keys, 64)
    keys = cdiv(cdiv(seq_k, want), bk) * bk
    count = cdiv(seq_k, keys)
    return (count, keys) if count >= 2 else (1, 0)


def flash_merge(rows, dv, splits):
    """kernels/heads.cl flash_merge, one work-item per (row, d): each reads the splits' lse
    twice (max, weights) and their partial outputs once, one exp and one multiply-add (sum +=
    w * o, contracted to an FMA) per split, one store."""
    loads = rows * dv * 3 * splits
    return counts(global_loads=loads, global_load_bytes=4 * loads, global_stores=rows * dv,
                  global_store_bytes=4 * rows * dv, fma=rows * dv * splits,
                  exp=rows * dv * splits)


def sdpa_launches(path, batch, heads, kv_heads, seq_q, seq_k, dim, causal=False, kv_len=0,
                  elem=4, flex=None, dv=None, page_size=0, kv_elem=None, dpas=0,
                  emulation=True):
    """The launches of an SDPA plan (packed, d_k = d_v = dim, q, k, v and out of `elem` bytes:
    float32, or F16 / BF16 on the fused path), as (kernel, counts). flex (fused only): a user
    mask_mod (Flex), and with flex.blocks the driver's flex_block_mask launch first. dpas:
    FG_DPAS with sub-groups of that size (flash_group; emulation=False: the hardware's
    work)."""
    limit = kv_len if kv_len else seq_k
    has_kv_len = kv_len > 0
    if path == "unfused":
        bh = batch * heads
        return [("matmul", matmul(seq_q, seq_k, dim, bh)),
                ("softmax_rows", softmax_rows(bh * seq_q, seq_q, seq_k, limit, causal,
                                              has_kv_len)),
                ("matmul", matmul(seq_q, dim, seq_k, bh))]
    # The grouped decode (host/attn/sdpa.c): one query row per head, no causal band and no
    # window: the query heads of a k/v head become the rows of one block.
    if seq_q == 1 and heads > kv_heads and not causal and flex is None:
        heads, seq_q = kv_heads, heads // kv_heads
    dv = dim if dv is None else dv
    if dpas:
        bq, bk = dpas_tiles(dim, dv, seq_q, dpas, emulation, paged=page_size > 0)
    else:
        bq, bk = (flash_gpu_tiles(dim, dv, seq_q, paged=True) if page_size
                  else flash_gpu_tiles(dim, dv, seq_q))
    blocks = cdiv(seq_q, bq)
    splits, split_keys = decode_splits(blocks * batch * heads, seq_k, bk)
    total = counts()
    for split in range(splits):
        begin = split * split_keys if splits > 1 else 0
        stop = min(seq_k, begin + split_keys) if splits > 1 else seq_k
        for block in range(blocks):
            group = flash_group(bq, bk, dim, dv, seq_q, seq_k, block * bq, begin, stop, limit,
                                causal, has_kv_len, splits > 1, elem, flex=flex,
                                page_size=page_size, kv_elem=kv_elem, dpas=dpas,
                                emulation=emulation)
            total = add(total, {k: v * batch * heads for k, v in group.items()})
    launches = [("flash_attention", total)]
    if flex is not None and flex.blocks:
        launches.insert(0, ("flex_block_mask", flex_block_mask(batch, heads, seq_q, seq_k, flex)))
    if splits > 1:
        launches.append(("flash_merge", flash_merge(batch * heads * seq_q, dv, splits)))
    return launches


# --- the attention backward (kernels/flash_bwd.cl, the generic GPU kernels) -----------------
def bwd_kept(seq_q, limit, causal):
    """(row, key) pairs of one head that the rule keeps: the band [0, band_end(row))."""
    return sum(band_end(i, limit, causal) for i in range(seq_q))


def bwd_delta(rows, dv, elem=4):
    """bwd_delta, one work-item per (b, h, row): D = dO . O, dv FMAs over two loaded rows; one
    float into the scratch."""
    loads = 2 * dv * rows
    return counts(global_loads=loads, global_load_bytes=elem * loads, global_stores=rows,
                  global_store_bytes=4 * rows, fma=dv * rows)


def bwd_dkdv(batch, heads, kv_heads, seq_q, seq_k, dk, dv, limit, causal, has_kv_len, elem=4):
    """bwd_dkdv, one work-item per key j of a (batch, k/v head): loads k_j and v_j (dk + dv),
    then per query head of the group its band (the key count when given: one load per head
    visited, the walk stops at the first head whose limit the key passes, so keys past it
    load it once) and per row i whose band holds j: the q row for s = q . k (dk loads, dk
    FMAs), lse, one exp (the weight), dO (dv loads; dp = dO . v and dV += p dO: 2 dv FMAs),
    delta, and the q row again for dK += dX q (dk loads, dk FMAs: not hoisted, the dot's loads
    are not kept). Per kept pair: 2 dk + dv + 2 loads, 2 dk + 2 dv FMAs, 1 exp. Stores dK_j,
    dV_j (dk + dv) for every key, padding included."""
    group = heads // kv_heads
    keys = batch * kv_heads * seq_k
    pairs = batch * heads * bwd_kept(seq_q, limit, causal)
    band_loads = batch * kv_heads * (min(seq_k, limit) * group + max(0, seq_k - limit)) \
        if has_kv_len else 0
    elem_loads = keys * (dk + dv) + pairs * (2 * dk + dv)
    f32_loads = pairs * 2 + band_loads
    return counts(global_loads=elem_loads + f32_loads,
                  global_load_bytes=elem * elem_loads + 4 * f32_loads,
                  global_stores=keys * (dk + dv), global_store_bytes=elem * keys * (dk + dv),
                  fma=pairs * (2 * dk + 2 * dv), exp=pairs)


def bwd_dq(batch, heads, seq_q, seq_k, dk, dv, limit, causal, has_kv_len, elem=4):
    """bwd_dq, one work-item per (b, h, row i): loads q_i and dO_i (dk + dv), its band (the key
    count when given), lse and delta; per key j of its band: the k row for s = q . k (dk loads
    and FMAs), one exp, the v row for dp = dO . v (dv), and the k row again for dQ += dX k (dk
    loads and FMAs). Per kept pair: 2 dk + dv loads and FMAs, 1 exp. Stores dQ_i (dk)."""
    rows = batch * heads * seq_q
    pairs = batch * heads * bwd_kept(seq_q, limit, causal)
    elem_loads = rows * (dk + dv) + pairs * (2 * dk + dv)
    f32_loads = rows * (2 + (1 if has_kv_len else 0))
    return counts(global_loads=elem_loads + f32_loads,
                  global_load_bytes=elem * elem_loads + 4 * f32_loads,
                  global_stores=rows * dk, global_store_bytes=elem * rows * dk,
                  fma=pairs * (2 * dk + dv), exp=pairs)


# --- the GPU dK/dV pass (kernels/flash_bwd_gpu.cl, bwd_dkdv_gpu) ----------------------------
BWD_GPU_TX, BWD_GPU_TY = 16, 8   # host/ops/flash_bwd_gpu.c: 128 work-items


def bwd_gpu_tiles(seq_q, dk, dv, local_mem=LOCAL_MEM):
    """host/ops/flash_bwd_gpu.c's tiles: keys per work-group BK and rows per tile BR, from 32
    and 32: BR halved while it still covers seq_q (down to TY), then, until the local arrays
    fit local_mem - 1 KiB, BR halved (down to TY), then BK (down to TX)."""
    tx, ty, bk, br = BWD_GPU_TX, BWD_GPU_TY, 32, 32

    def local_bytes(bk, br):
        return 4 * ((bk + br) * ((dk + 3) // 4 * 4 + 4 + (dv + 3) // 4 * 4 + 4)
                    + 2 * bk * (br + 4) + 2 * br)
    while br // 2 >= ty and br // 2 % 4 == 0 and br // 2 >= seq_q:
        br //= 2
    while local_bytes(bk, br) > local_mem - 1024:
        if br // 2 >= ty and br // 2 % 4 == 0:
            br //= 2
        elif bk // 2 >= tx and bk // 2 % ty == 0:
            bk //= 2
        else:
            return None
    return bk, br


def bwd_gpu_totals(c, elem, elem_loads, f32_loads, groups, exps):
    """A GPU backward pass's counts per work-group, completed (bytes, global loads) and times
    its `groups` work-groups; `exps` exponentials in all."""
    c["local_store_bytes"] = 4 * c["local_stores"]
    c["global_loads"] = elem_loads + f32_loads
    c["global_load_bytes"] = elem * elem_loads + 4 * f32_loads
    c["global_store_bytes"] = elem * c["global_stores"]
    c = {k: v * groups for k, v in c.items()}
    c["exp"] = exps
    return c


def bwd_dkdv_gpu(batch, heads, kv_heads, seq_q, seq_k, dk, dv, limit, causal, has_kv_len,
                 elem=4, local_mem=LOCAL_MEM):
    """bwd_dkdv_gpu: a work-group of T = TX x TY items per block of BK keys of a (batch, k/v
    head) (keys = min(BK, seq_k - key0) of them valid). It stages the block's K and V rows
    once (keys * (dk + dv) global loads; BK * (dk4 + dv4) local stores, dk4 / dv4 = the head
    sizes rounded up to whole float4s), loads the key count once per item and query head
    (given), and per query head walks the rows whose band meets the block (first = the first
    row whose band end passes key0, to seq_q; none when key0 >= limit) in tiles of BR rows
    (`rows` valid). Per tile:
      staging: rows * (dk + dv) + 2 * rows (lse, delta) global loads; BR * (dk4 + dv4 + 2)
        local stores; T barriers;
      S and dP: each item RM x RN (RM = BR/TY, RN = BK/TX) of each from float4 rows:
        T * (RM + RN) * (dk4 + dv4) / 4 local loads (16 bytes) and BR * BK * (dk4 + dv4)
        FMAs; 2 * T * RM local loads of lse and delta; one exp per kept pair; p z and dX
        into the tiles: 2 * BR * BK local stores; T barriers;
      dV, dK: rows4 = rows rounded up to 4, per four rows each item loads 2 * RK float4s of
        p z and dX (RK = BK/TY keys) and TY * (dk + dv) * 4 dO and q words over the group
        (dims past d are not loaded), and makes 4 * BK * TX * (RDK + RDV) FMAs (RD = the
        head sizes over TX, rounded up); T barriers.
    Stores dK, dV of the valid keys: keys * (dk + dv)."""
    tiles = bwd_gpu_tiles(seq_q, dk, dv, local_mem)
    bk, br = tiles
    tx, ty = BWD_GPU_TX, BWD_GPU_TY
    t = tx * ty
    rm, rn, rk = br // ty, bk // tx, bk // ty
    rdk, rdv = cdiv(dk, tx), cdiv(dv, tx)
    dk4, dv4 = cdiv(dk, 4) * 4, cdiv(dv, 4) * 4
    group = heads // kv_heads
    c = counts()
    elem_loads = f32_loads = 0
    for key0 in range(0, seq_k, bk):
        keys = min(bk, seq_k - key0)
        elem_loads += keys * (dk + dv)
        c["local_stores"] += bk * (dk4 + dv4)
        c["global_stores"] += keys * (dk + dv)
        f32_loads += group * t if has_kv_len else 0
        if key0 >= limit:
            continue
        first = next((i for i in range(seq_q) if band_end(i, limit, causal) > key0), seq_q)
        for row0 in range(first, seq_q, br):
            rows = min(br, seq_q - row0)
            elem_loads += rows * (dk + dv) * group
            f32_loads += 2 * rows * group
            c["local_stores"] += (br * (dk4 + dv4 + 2) + 2 * br * bk) * group
            c["local_loads"] += (t * (rm + rn) * (dk4 + dv4) // 4 + 2 * t * rm) * group
            c["local_load_bytes"] += (4 * t * (rm + rn) * (dk4 + dv4) + 8 * t * rm) * group
            rows4 = cdiv(rows, 4)
            c["local_loads"] += rows4 * (2 * t * rk + 4 * ty * (dk + dv)) * group
            c["local_load_bytes"] += rows4 * (32 * t * rk + 16 * ty * (dk + dv)) * group
            c["fma"] += (br * bk * (dk4 + dv4) + 4 * rows4 * bk * tx * (rdk + rdv)) * group
            c["barriers"] += 3 * t * group
    return bwd_gpu_totals(c, elem, elem_loads, f32_loads, batch * kv_heads,
                          batch * heads * bwd_kept(seq_q, limit, causal))


def bwd_dq_gpu(batch, heads, seq_q, seq_k, dk, dv, limit, causal, has_kv_len, elem=4,
               local_mem=LOCAL_MEM):
    """bwd_dq_gpu: bwd_dkdv_gpu with the roles swapped, a work-group of T items per block of
    BK rows of a (batch, head) (`rows` valid), the same BK and BR. It stages the block's Q and
    dO rows once (rows * (dk + dv) global loads, BK * (dk4 + dv4) local stores), each item
    loads lse and delta of its RN = BK/TX rows of S^T (TY * rows * 2 over the group) and the
    key count (given); then walks the keys 0 .. band_end(last row) in tiles of BR (`keys`
    valid). Per tile:
      staging: keys * (dk + dv) global loads, BR * (dk4 + dv4) local stores; T barriers;
      S^T and dP^T: as bwd_dkdv_gpu's step 2 (T * (RM + RN) * (dk4 + dv4) / 4 float4 loads,
        BR * BK * (dk4 + dv4) FMAs), one exp per kept pair, BK * BR stores of dX; T barriers;
      dQ: keys4 = keys rounded up to 4, per four keys T * RK float4s of dX and TY * dk * 4
        K words over the group, 4 * BK * TX * RDK FMAs; T barriers.
    Stores dQ of the valid rows: rows * dk."""
    bk, br = bwd_gpu_tiles(seq_q, dk, dv, local_mem)
    tx, ty = BWD_GPU_TX, BWD_GPU_TY
    t = tx * ty
    rm, rn, rk = br // ty, bk // tx, bk // ty
    rdk = cdiv(dk, tx)
    dk4, dv4 = cdiv(dk, 4) * 4, cdiv(dv, 4) * 4
    c = counts()
    elem_loads = f32_loads = 0
    for row0 in range(0, seq_q, bk):
        rows = min(bk, seq_q - row0)
        elem_loads += rows * (dk + dv)
        f32_loads += 2 * ty * rows + (t if has_kv_len else 0)
        c["local_stores"] += bk * (dk4 + dv4)
        c["global_stores"] += rows * dk
        stop = band_end(row0 + rows - 1, limit, causal)
        for key0 in range(0, stop, br):
            keys = min(br, stop - key0)
            elem_loads += keys * (dk + dv)
            c["local_stores"] += br * (dk4 + dv4) + bk * br
            c["local_loads"] += t * (rm + rn) * (dk4 + dv4) // 4
            c["local_load_bytes"] += 4 * t * (rm + rn) * (dk4 + dv4)
            keys4 = cdiv(keys, 4)
            c["local_loads"] += keys4 * (t * rk + 4 * ty * dk)
            c["local_load_bytes"] += keys4 * (16 * t * rk + 16 * ty * dk)
            c["fma"] += br * bk * (dk4 + dv4) + 4 * keys4 * bk * tx * rdk
            c["barriers"] += 3 * t
    return bwd_gpu_totals(c, elem, elem_loads, f32_loads, batch * heads,
                          batch * heads * bwd_kept(seq_q, limit, causal))


def backward_launches(batch, heads, kv_heads, seq_q, seq_k, dk, dv=None, causal=False,
                      kv_len=0, elem=4, dkdv="gpu"):
    """The launches of an SDPA backward plan on a GPU (packed tensors, no mask gradient, no
    sinks; loop_trip_limit 0: one row part and one key part, so no bwd_sum_parts):
    bwd_delta, then bwd_dkdv_gpu and bwd_dq_gpu (dkdv="gpu", what the host runs since
    2026-12-06) or the generic bwd_dkdv and bwd_dq (dkdv="generic": nothing staged in local
    memory, no barriers, every operand from global memory per (row, key) pair), as (kernel,
    counts)."""
    dv = dk if dv is None else dv
    limit = kv_len if kv_len else seq_k
    has_kv_len = kv_len > 0
    if dkdv == "gpu" and bwd_gpu_tiles(seq_q, dk, dv) is not None:
        pass_dkdv = ("bwd_dkdv_gpu", bwd_dkdv_gpu(batch, heads, kv_heads, seq_q, seq_k, dk, dv,
                                                  limit, causal, has_kv_len, elem))
        pass_dq = ("bwd_dq_gpu", bwd_dq_gpu(batch, heads, seq_q, seq_k, dk, dv, limit, causal,
                                            has_kv_len, elem))
    else:
        pass_dkdv = ("bwd_dkdv", bwd_dkdv(batch, heads, kv_heads, seq_q, seq_k, dk, dv, limit,
                                          causal, has_kv_len, elem))
        pass_dq = ("bwd_dq", bwd_dq(batch, heads, seq_q, seq_k, dk, dv, limit, causal,
                                    has_kv_len, elem))
    return [("bwd_delta", bwd_delta(batch * heads * seq_q, dv, elem)), pass_dkdv, pass_dq]


# --- the cases: (name, driver arguments, expected launches) ---------------------------------
def sdpa_case(name, path, b, h, hkv, lq, lk, d, causal=False, kv_len=0, dtype="f32"):
    args = ["sdpa", path] + [str(x) for x in (b, h, hkv, lq, lk, d)]
    args += (["causal"] if causal else []) + ([f"kvlen={kv_len}"] if kv_len else [])
    args += [] if dtype == "f32" else [dtype]
    elem = 4 if dtype == "f32" else 2
    return name, args, sdpa_launches(path, b, h, hkv, lq, lk, d, causal, kv_len, elem)


def dpas_case(name, b, h, hkv, lq, lk, d, sg, dtype="f16", causal=False, dv=None):
    """flash_gpu.cl's matrix-engine variant, emulated (the driver's dpas=SG: fg_dpas=2)."""
    args = ["sdpa", "fused"] + [str(x) for x in (b, h, hkv, lq, lk, d)]
    args += (["causal"] if causal else []) + ([f"dv={dv}"] if dv is not None else [])
    args += [dtype, f"dpas={sg}"]
    return name, args, sdpa_launches("fused", b, h, hkv, lq, lk, d, causal, elem=2, dv=dv,
                                     dpas=sg)


def flex_case(name, b, h, hkv, length, d, docs, blocks=None):
    """The fused SDPA with the driver's document mask_mod (flexdoc=N, LQ = LK = length) and,
    with blocks = (BQ, BK), a block mask made from it on the device."""
    args = ["sdpa", "fused"] + [str(x) for x in (b, h, hkv, length, length, d)]
    args += [f"flexdoc={docs}"] + ([f"blocks={blocks[0]},{blocks[1]}"] if blocks else [])
    flex = doc_mask(length, docs, blocks)
    return name, args, sdpa_launches("fused", b, h, hkv, length, length, d, flex=flex)



def paged_case(name, b, h, hkv, lq, lk, d, kv_len, page_size, dv=None, fp8=None):
    """The fused SDPA over a paged cache (paged=PS: K and V in pools of pages of page_size
    keys, capacity lk, in a shuffled order; kv_len keys a sequence) and/or FP8 k and v
    (fp8="e4m3" or "e5m2": one byte an element, q and out float32)."""
    args = ["sdpa", "fused"] + [str(x) for x in (b, h, hkv, lq, lk, d)]
    args += [f"kvlen={kv_len}"] if kv_len else []
    args += [f"paged={page_size}"] if page_size else []
    args += [f"dv={dv}"] if dv is not None else []
    args += [f"fp8={fp8}"] if fp8 else []
    return name, args, sdpa_launches("fused", b, h, hkv, lq, lk, d, False, kv_len, dv=dv,
                                     page_size=page_size, kv_elem=1 if fp8 else None)


def step_case(name, b, h, hkv, n, d, page_size=0, dtype="f32"):
    """A KV cache filled with n keys, then one decode step in one launch (the driver's step)."""
    args = ["step"] + [str(x) for x in (b, h, hkv, n, d)]
    args += [f"paged={page_size}"] if page_size else []
    args += [] if dtype == "f32" else [dtype]
    elem = 4 if dtype == "f32" else 2
    return name, args, step_launches(b, h, hkv, n, d, page_size, elem)


def mixed_case(name, h, hkv, d, page_size, requests):
    """A mixed batch in one launch (the driver's mixed): requests [(rows, keys)]."""
    args = ["mixed"] + [str(x) for x in (h, hkv, d, page_size)]
    args += [f"{r}:{n}" for r, n in requests]
    return name, args, mixed_launches(h, hkv, d, page_size, requests)


def backward_case(name, b, h, hkv, lq, lk, dk, dv=None, causal=False, kv_len=0, dtype="f32"):
    args = ["backward"] + [str(x) for x in (b, h, hkv, lq, lk, dk)]
    args += (["causal"] if causal else []) + ([f"kvlen={kv_len}"] if kv_len else [])
    args += [f"dv={dv}"] if dv is not None else []
    args += [] if dtype == "f32" else [dtype]
    elem = 4 if dtype == "f32" else 2
    return name, args, backward_launches(b, h, hkv, lq, lk, dk, dv, causal, kv_len, elem)


CASES = [
    ("matmul 70x50x40", ["matmul", "70", "50", "40"], [("matmul", matmul(70, 50, 40))]),
    ("matmul 128x64x32", ["matmul", "128", "64", "32"], [("matmul", matmul(128, 64, 32))]),
    # unfused: matmul (q k^T, GQA: b_group 2), softmax_rows, matmul; then causal with a KV
    # cache's key counts (softmax reads raw only inside the band)
    sdpa_case("unfused H2/1 12x40 d40", "unfused", 1, 2, 1, 12, 40, 40),
    sdpa_case("unfused causal kvlen 30/45 d16", "unfused", 1, 1, 1, 20, 45, 16, True, 30),
    # fused prefill: two 64-row blocks (the second 6 rows), a partial key tile; causal at
    # d = 24 (RD = 2: dims 24 .. 31 idle), tiles skipped past each block's diagonal and rows
    # that keep no key of a tile; d = 128 (BK shrinks to 16 to fit 48 KiB, RN = 1)
    sdpa_case("fused 70x50 d64", "fused", 1, 1, 1, 70, 50, 64),
    sdpa_case("fused causal 66x66 d24", "fused", 1, 1, 1, 66, 66, 24, True),
    sdpa_case("fused 40x20 d128", "fused", 1, 1, 1, 40, 20, 128),
    # user mask functions (clattn_flex_desc): a document mask_mod over 4 documents (two I32
    # aux loads a call). Without a block mask every tile is visited and mask_mod is called on
    # every (row, key) of it, padding rows as row 0 (200 = 3 * 64 + 8 rows); with 32 x 16
    # blocks inside documents of 64 the tiles are full (no mask_mod) or empty (skipped), each
    # verdict reading 2 x 2 blocks; with 128 x 32 blocks over documents of 50 the visited
    # tiles are partial, mixed with empty ones, padding rows included. First flex_block_mask
    # (kernels/flex.cl) makes the block mask.
    flex_case("flex doc4 200x200 d32", 1, 1, 1, 200, 32, 4),
    flex_case("flex doc4 256x256 d32 blocks 32x16", 1, 1, 1, 256, 32, 4, (32, 16)),
    flex_case("flex doc4 200x200 d32 blocks 128x32", 1, 1, 1, 200, 32, 4, (128, 32)),
    # 16-bit storage: q, k, v, out of 2 bytes (F16 through vload_half / vstore_half_rte, BF16
    # through 16-bit loads and shifts); the counts in operations do not change
    sdpa_case("fused f16 33x20 d64", "fused", 1, 1, 1, 33, 20, 64, dtype="f16"),
    # the matrix-engine variant (FG_DPAS, issue 51) through its emulation: sub-groups of 16
    # (two 64-row blocks, the second 6 rows; 2 heads), of 8 in bfloat16 with causal, GQA 4/2
    # and d_v = 40 (dims 40 .. 47 of the last column idle: no V words, still MACs); d = 128
    # (the rows halve to fit 48 KiB with the emulation's fragments)
    dpas_case("dpas16 f16 H2 70x50 d64", 1, 2, 2, 70, 50, 64, 16),
    dpas_case("dpas8 bf16 causal H4/2 37x45 d32 dv40", 1, 4, 2, 37, 45, 32, 8, "bf16", True,
              dv=40),
    dpas_case("dpas16 f16 20x33 d128", 1, 1, 1, 20, 33, 128, 16),
    # decode (an 8-row block, one row used) over a KV cache of 100 filled to 77; grouped (8
    # query heads on 2 k/v heads: 4 rows of the block) over a cache of 80 filled to 37, and
    # 4 on 1 in bfloat16; one head over 520 keys: two decode splits (288 and 232 keys) and
    # flash_merge
    sdpa_case("decode kvlen 77/100 d64", "fused", 1, 1, 1, 1, 100, 64, False, 77),
    sdpa_case("decode grouped H8/2 kvlen 37/80 d64", "fused", 2, 8, 2, 1, 80, 64, False, 37),
    sdpa_case("decode grouped bf16 H4/1 kvlen 50/64 d64", "fused", 1, 4, 1, 1, 64, 64, False, 50,
              dtype="bf16"),
    sdpa_case("decode split 1x520 d32", "fused", 1, 1, 1, 1, 520, 32),
    # a paged cache (issue 50): pools of shuffled pages
    paged_case("paged16 decode grouped H4/2 kvlen 77/80 d64", 2, 4, 2, 1, 80, 64, 77, 16),
    paged_case("paged64 5x192 kvlen 131 d24", 1, 1, 1, 5, 192, 24, 131, 64),
    paged_case("paged64 decode split kvlen 531/576 d32", 1, 1, 1, 1, 576, 32, 531, 64),
    # FP8 k and v (one byte an element, decoded in registers: integer arithmetic and selects,
    # no FMA or exp), q and out float32
    paged_case("fp8 e4m3 decode grouped H4/2 kvlen 45/64 d64", 1, 4, 2, 1, 64, 64, 45, 0,
               fp8="e4m3"),
    paged_case("fp8 e5m2 paged16 19x48 kvlen 37 d40", 1, 1, 1, 19, 48, 40, 37, 16, fp8="e5m2"),
    # MLA's absorbed decode (DeepSeek: d_qk 576, d_v 512, 16 query heads on one latent head):
    # in 48 KiB the tiles shrink to 8 rows x 8 keys and 8 x 8 work-items (two row blocks)
    paged_case("mla decode H16/1 kvlen 21/24 dk576 dv512", 1, 16, 1, 1, 24, 576, 21, 0, dv=512),
    step_case("step grouped H4/2 37+1 d64", 1, 4, 2, 37, 64),
    # a mixed batch in one launch (packed queries over pages of 16, bottom-right causal): two
    # decodes, a 20-row and a 17-row chunk, a 7-row request; BQ 32: the 17-row chunk's
    # second group leaves at once
    mixed_case("mixed H2/1 d32 pages16 1+20+17+1+7 rows", 2, 1, 32, 16,
               [(1, 63), (20, 50), (17, 33), (1, 1), (7, 20)]),
    step_case("step paged16 grouped H16/1 B2 50+1 d32", 2, 16, 1, 50, 32, 16),
    # the backward (bwd_delta, bwd_dkdv, bwd_dq: the generic GPU kernels, one key / one row per
    # work-item). Head sizes that are not multiples of 16: Oclgrind reports a CPU device too,
    # and there the host runs the CPU variants (16-key float16 lanes) at multiples of 16. GQA
    # (2 query heads per k/v head: bwd_dkdv walks both); causal with d_k != d_v; a KV cache's
    # key counts (keys past them: one band load, no pair); float16 storage (2-byte loads and
    # stores; lse and delta stay float32). d_k at most 24: at 40 Oclgrind refuses bwd_dq
    # (CL_OUT_OF_RESOURCES: bwd_dq_cpu's __local arrays, in the same program, are charged to it)
    backward_case("backward GQA H2/1 12x20 d24", 1, 2, 1, 12, 20, 24),
    backward_case("backward causal 18x18 dk24 dv40", 1, 1, 1, 18, 18, 24, 40, True),
    backward_case("backward kvlen 30/45 B2 H2 9x45 d20", 2, 2, 2, 9, 45, 20, kv_len=30),
    backward_case("backward causal f16 H4/2 10x14 d24", 1, 4, 2, 10, 14, 24, causal=True,
                  dtype="f16"),
    # the GPU dK/dV pass's tiles (bwd_dkdv_gpu): d = 64, GQA 2:1, causal, 40 rows in tiles of
    # 32 (one of 8) over 70 keys in blocks of 32 (one of 6), blocks past a row tile's band
    # skipped; d = 128, where the row tile shrinks to 8 rows to fit 48 KiB (3 tiles, one of 4)
    backward_case("backward GPU tiles causal H2/1 40x70 d64", 1, 2, 1, 40, 70, 64, causal=True),
    backward_case("backward GPU tiles 20x33 d128", 1, 1, 1, 20, 33, 128),
]


# --- measuring -------------------------------------------------------------------------------
OCLGRIND_NAMES = {
    "load global": ("global_loads", "global_load_bytes"),
    "store global": ("global_stores", "global_store_bytes"),
    "load local": ("local_loads", "local_load_bytes"),
    "store local": ("local_stores", "local_store_bytes"),
}
CALL_NAMES = {"_Z7barrierj": "barriers", "_Z3fmafff": "fma", "_Z3madfff": "fma",
              "llvm.fmuladd.f32": "fma", "llvm.fma.f32": "fma", "_Z3expf": "exp"}


def parse_inst_counts(text):
    """Oclgrind's blocks 'Instructions executed for kernel 'NAME':' then 'N - op [(B bytes)]'
    lines, in launch order, as [(name, counts)]."""
    launches = []
    for line in text.splitlines():
        head = re.match(r"Instructions executed for kernel '(\w+)':", line)
        if head:
            launches.append((head.group(1), counts()))
            continue
        row = re.match(r"\s*(\d+) - (.+?)(?: \((\d+) bytes\))?$", line)
        if not row or not launches:
            continue
        n, op, nbytes = int(row.group(1)), row.group(2), row.group(3)
        c = launches[-1][1]
        if op in OCLGRIND_NAMES:
            ops, byte_key = OCLGRIND_NAMES[op]
            c[ops] += n
            c[byte_key] += int(nbytes or 0)
        else:
            call = re.match(r"call (\S+)\(\)$", op)
            half = re.match(r"call _Z\d+v(load|store)_half(\d*)\w*PU3AS([13])", op)
            if call and call.group(1) in CALL_NAMES:
                c[CALL_NAMES[call.group(1)]] += n
            elif half:
                # Oclgrind runs vload_half / vstore_half[_rte] (F16 storage) as builtins that it
                # counts as calls, not as loads and stores: counted here, 2 bytes a half,
                # address space 1 global, 3 local
                space = "global" if half.group(3) == "1" else "local"
                ops, byte_key = OCLGRIND_NAMES[f"{half.group(1)} {space}"]
                c[ops] += n
                c[byte_key] += n * 2 * int(half.group(2) or 1)
    return launches


def run_case(build, args, kernel_dir):
    env = dict(os.environ, CLATTN_PARAMS="gpu", CLATTN_TUNING="/dev/null")
    env.pop("CLATTN_DEVICE", None)
    if kernel_dir:
        env["CLATTN_KERNEL_DIR"] = kernel_dir
    cmd = ["oclgrind", "--inst-counts", "--local-mem-size", str(LOCAL_MEM),
           os.path.join(build, "gpu_model_driver")] + args
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True)
    return proc.returncode, proc.stdout


def child_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def check_params(output):
    """Mismatches between PARAMS / the device and what the driver printed."""
    found = dict(re.findall(r"(\w+)=(\d+)", " ".join(
        l for l in output.splitlines() if l.startswith(("parameters:", "device:")))))
    wrong = [f"{k}={found.get(k)} (the model assumes {v})" for k, v in PARAMS.items()
             if found.get(k) != str(v)]
    for key, value in (("compute_units", COMPUTE_UNITS), ("local_mem_size", LOCAL_MEM)):
        if found.get(key) != str(value):
            wrong.append(f"{key}={found.get(key)} (the model assumes {value})")
    return wrong


def ratios(c):
    flops = 2 * c["fma"]
    parts = []
    if c["fma"]:
        parts.append(f"local loads/FMA {c['local_loads'] / c['fma']:.3f}")
        parts.append(f"FLOP/global byte "
                     f"{flops / (c['global_load_bytes'] + c['global_store_bytes']):.2f}")
    return ", ".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", nargs="?", help="build folder with gpu_model_driver")
    ap.add_argument("--kernels", help="CLATTN_KERNEL_DIR for the driver (the canary)")
    ap.add_argument("--case", action="append", help="run only the cases named (repeatable)")
    ap.add_argument("--list", action="store_true", help="print the formulas' table, run nothing")
    ap.add_argument("--markdown", action="store_true",
                    help="print the formulas' table for BENCHMARKS.md, run nothing")
    opts = ap.parse_args()
    cases = [c for c in CASES if not opts.case or c[0] in opts.case]
    if opts.case and len(cases) != len(opts.case):
        print(f"model.py: unknown case in {opts.case}; cases: {[c[0] for c in CASES]}",
              file=sys.stderr)
        return 2
    if opts.markdown:
        print("| case | kernel | global loads (B) | global stores (B) | local loads | "
              "local stores | barriers | FMAs | exps | local loads / FMA | FLOP / global B |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, args, launches in cases:
            for kernel, c in launches:
                gbytes = c["global_load_bytes"] + c["global_store_bytes"]
                per_fma = f"{c['local_loads'] / c['fma']:.3f}" if c["fma"] else "-"
                print(f"| {name} | `{kernel}` | {c['global_load_bytes']} | "
                      f"{c['global_store_bytes']} | {c['local_loads']} | {c['local_stores']} | "
                      f"{c['barriers']} | {c['fma']} | {c['exp']} | {per_fma} | "
                      f"{2 * c['fma'] / gbytes:.2f} |")
        return 0
    if opts.list:
        for name, args, launches in cases:
            for kernel, c in launches:
                print(f"{name:42} {kernel:16} " + " ".join(f"{k}={c[k]}" for k in COUNTERS))
        return 0
    if not opts.build:
        ap.print_usage(sys.stderr)
        return 2
    if shutil.which("oclgrind") is None:
        print("model.py: oclgrind not found (apt-get install oclgrind)", file=sys.stderr)
        return 2
    driver = os.path.join(opts.build, "gpu_model_driver")
    if not os.access(driver, os.X_OK):
        print(f"model.py: {driver} missing (build the gpu_model_driver target)", file=sys.stderr)
        return 2
    mismatches = []
    print(f"{'case':42} {'kernel':16} {'counter':18} {'measured':>12} {'formula':>12}")
    for name, args, expected in cases:
        start, cpu_start = time.time(), child_cpu()
        rc, output = run_case(opts.build, args, opts.kernels)
        if rc != 0:
            print(f"{name}: the driver failed (exit {rc}):\n{output[-2000:]}", file=sys.stderr)
            return 2
        wrong = check_params(output)
        if wrong:
            print(f"{name}: the parameters differ from the model's: {'; '.join(wrong)}. "
                  "Update PARAMS and the formulas in tests/gpu_model/model.py with the change, "
                  "on purpose.", file=sys.stderr)
            return 1
        measured = parse_inst_counts(output)
        if [k for k, _ in measured] != [k for k, _ in expected]:
            mismatches.append(f"{name}: launches {[k for k, _ in measured]}, "
                              f"the model expects {[k for k, _ in expected]}")
            print(f"{name:42} LAUNCHES DIFFER: measured {[k for k, _ in measured]}, "
                  f"expected {[k for k, _ in expected]}")
            continue
        for (kernel, got), (_, want) in zip(measured, expected):
            for counter in COUNTERS:
                flag = "" if got[counter] == want[counter] else "  MISMATCH"
                print(f"{name:42} {kernel:16} {counter:18} {got[counter]:12d} "
                      f"{want[counter]:12d}{flag}")
                if flag:
                    mismatches.append(f"{name}: {kernel} {counter}: measured {got[counter]}, "
                                      f"formula {want[counter]}")
            derived = ratios(got)
            if derived:
                print(f"{name:42} {kernel:16} {derived}")
        print(f"{name:42} ({time.time() - start:.1f} s under Oclgrind, "
              f"{child_cpu() - cpu_start:.1f} s of CPU)")
    if mismatches:
        print(f"\nGPU work model: {len(mismatches)} MISMATCH(ES):")
        for m in mismatches:
            print(f"  {m}")
        print("A kernel's traffic changed (or the host's tiles). If that is intended, update the "
              "formula in tests/gpu_model/model.py (and BENCHMARKS.md's table) with the change, "
              "on purpose; if not, the change is a regression.")
        return 1
    print(f"\nGPU work model: {len(cases)} cases, every count matches its formula")
    return 0


if __name__ == "__main__":
    sys.exit(main())
