"""One rule for every public Python function (issue 46): the same arguments reach the same
core whether they come as numpy arrays or as torch tensors, and torch in gives torch out.

Each public function has cases that together give a non-default value to every one of its
parameters (a parameter the cases do not cover fails the test, so a new argument must be
added here), and each case is checked three ways:
  1. coverage: every parameter of the signature is given, or listed in NO_EFFECT with why;
  2. sensitivity: on numpy, leaving out any one given argument (its default instead) changes
     the result, so a call that dropped it would be seen;
  3. parity: the same call on torch tensors gives torch tensors with the numpy call's numbers.
test_a_planted_dropped_argument_fails shows that a torch branch that drops one argument fails
the check."""

import functools
import inspect

import numpy as np
import pytest

import clattn

torch = pytest.importorskip("torch")

# Parameters that do not change the numbers by design, with the reason.
NO_EFFECT = {
    "ctx": "which context (device) runs it; the default context is the one the cases use",
    "path": "the fused and unfused paths compute the same attention",
    "generator": "draws dropout_seed when none is given; the cases give the seed",
    "max_seqlen_q": "a bound for the launch geometry, at least the longest sequence",
    "max_seqlen_k": "a bound for the launch geometry, at least the longest sequence",
    "deterministic": "clattn's backward is always deterministic (flash-attn's flag)",
    "kernel_options": "flex_attention: counts the tiles visited (last_tiles_visited) or "
                      "carries torch's Triton options; the same numbers",
}


def rng_arrays(seed):
    rng = np.random.default_rng(seed)
    return lambda *shape, dtype=np.float32: rng.standard_normal(shape).astype(dtype)


def to_torch(x):
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x.copy())
    if isinstance(x, (tuple, list)) and any(isinstance(v, np.ndarray) for v in x):
        return type(x)(to_torch(v) for v in x)
    return x


def flatten(result, torch_out):
    """The arrays of a result (tensor, array, tuple, dict, SdpaGrads) as numpy, in order;
    with torch_out, every array must be a tensor."""
    if isinstance(result, dict):
        return [a for k in sorted(result) for a in flatten(result[k], torch_out)]
    if isinstance(result, (tuple, list)):
        extra = [getattr(result, n) for n in ("grad_attn_mask", "grad_sinks")
                 if hasattr(result, n)]
        return [a for r in list(result) + extra for a in flatten(r, torch_out)]
    if result is None:
        return [None]
    if torch_out:
        assert isinstance(result, torch.Tensor), f"torch in gave {type(result).__name__} out"
        if result.dtype == torch.bfloat16:
            result = result.float()
        return [result.detach().numpy()]
    assert not isinstance(result, torch.Tensor), "numpy in gave a torch tensor out"
    return [np.asarray(result, dtype=np.float32) if np.asarray(result).dtype.name ==
            "bfloat16" else np.asarray(result)]


def same(a, b) -> bool:
    """Bit for bit (the torch branch runs the same core on the same values)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if (x is None) != (y is None):
            return False
        if x is not None and (x.shape != y.shape or x.dtype != y.dtype or
                              not np.array_equal(x, y, equal_nan=True)):
            return False
    return True


def is_default(value, param) -> bool:
    if param.default is inspect.Parameter.empty or isinstance(value, np.ndarray):
        return False
    try:
        return bool(value == param.default)
    except Exception:
        return False


def check_case(fn, args, kwargs):
    """Sensitivity and parity of one call (see the module's docstring); returns the names of
    the parameters it gave."""
    sig = inspect.signature(fn)
    bound = sig.bind(*args, **kwargs)
    want = flatten(fn(*args, **kwargs), False)
    for name, value in bound.arguments.items():
        param = sig.parameters[name]
        if param.default is inspect.Parameter.empty or name in NO_EFFECT or \
                is_default(value, param):
            continue
        rest = {n: v for n, v in bound.arguments.items() if n != name}
        try:
            other = flatten(fn(**rest), False)
        except (ValueError, TypeError):  # refused without it (e.g. a seed with dropout)
            continue
        assert not same(want, other), \
            f"{fn.__qualname__}: {name}={value!r} changes nothing in this case; give a value " \
            f"that does (or list it in NO_EFFECT with the reason)"
    if not any(isinstance(x, np.ndarray) for x in (*args, *kwargs.values())):
        return set(bound.arguments)  # no array in: no torch form of this call
    got = flatten(fn(*(to_torch(a) for a in args),
                     **{k: to_torch(v) for k, v in kwargs.items()}), True)
    assert same(want, got), f"{fn.__qualname__}: torch and numpy inputs give other numbers"
    return set(bound.arguments)


def check(fn, cases, skip=()):
    """Every case of fn, and the coverage of its parameters by them."""
    given = set()
    for args, kwargs in cases:
        given |= check_case(fn, args, kwargs)
    params = [p for p in inspect.signature(fn).parameters if p != "self"]
    missing = [p for p in params if p not in given and p not in NO_EFFECT and p not in skip]
    assert not missing, f"{fn.__qualname__}: no parity case gives {missing}"


def sdpa_cases(a):
    q, k, v = a(2, 4, 5, 8), a(2, 2, 7, 8), a(2, 2, 7, 8)
    mask, sinks = a(5, 7), a(4)
    with_mask = ((q, k, v, mask, 0.3, False, 0.4, True),
                 dict(sinks=sinks, softcap=2.0, window_size=(3, 1), need_weights=True,
                      dropout_seed=5, dropout_offset=3, path="unfused"))
    causal = ((q, k, v), dict(is_causal=True, enable_gqa=True, ctx=clattn.default_context()))
    return [with_mask, causal]


def test_scaled_dot_product_attention():
    check(clattn.scaled_dot_product_attention, sdpa_cases(rng_arrays(1)))


def test_sdpa_forward_and_backward():
    a = rng_arrays(2)
    q, k, v = a(2, 4, 5, 8), a(2, 2, 7, 8), a(2, 2, 7, 8)
    mask, sinks = a(5, 7), a(4)
    opts = dict(sinks=sinks, softcap=2.0, window_size=(3, 1), dropout_p=0.3, dropout_seed=5,
                dropout_offset=3)
    check(clattn.sdpa_forward, [((q, k, v, mask, False, 0.4, True), dict(opts)),
                                ((q, k, v), dict(is_causal=True, enable_gqa=True,
                                                 path="fused"))])
    out, lse = clattn.sdpa_forward(q, k, v, mask, False, 0.4, True, **opts)
    dout = a(*out.shape)
    check(clattn.sdpa_backward,
          [((q, k, v, out, lse, dout, mask, False, 0.4, True),
            dict(opts, want_mask_grad=True)),
           ((q, k, v, *clattn.sdpa_forward(q, k, v, is_causal=True, enable_gqa=True), dout,
             None, True, None, True), dict(path="auto"))])


def test_flex_attention():
    a = rng_arrays(9)
    q, k, v = a(2, 4, 5, 8), a(2, 2, 7, 8), a(2, 2, 7, 8)
    bias = a(4)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias[h] * (q_idx - kv_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    block_mask = clattn.create_block_mask(causal, None, None, 5, 7, BLOCK_SIZE=2)
    keep_src = "int mask_mod(int b, int h, int q_idx, int kv_idx) { return keep[kv_idx]; }"
    keep = np.array([1, 0, 1, 1, 0, 1, 1], np.uint8)
    # one partial block under both tensors: flex_attention's aux (which overrides the block
    # mask's own) decides which keys mask_mod keeps
    c_mask = clattn.create_block_mask(keep_src, None, None, 5, 7, BLOCK_SIZE=8,
                                      aux={"keep": np.array([0, 1, 1, 1, 1, 0, 1], np.uint8)})
    assert c_mask.to_dense().tolist() == [[[[1]]]]
    check(clattn.flex_attention,
          [((q, k, v, score_mod, block_mask, 0.4, True, True, {"count_tiles": True}), {}),
           ((q, k, v), dict(block_mask=c_mask, enable_gqa=True, aux={"keep": keep},
                            ctx=clattn.default_context()))])


def test_paged_attention():
    a = rng_arrays(3)
    q = a(2, 4, 3, 32)
    k_pages, v_pages = a(6, 4, 2, 32), a(6, 4, 2, 32)
    table = np.array([[3, 1, 5], [0, 2, 4]], np.int32)
    lens = np.array([10, 7], np.int32)
    check(clattn.paged_attention,
          [((q, k_pages, v_pages, table, lens), dict(is_causal=True, scale=0.3, sinks=a(4))),
           ((q, k_pages, v_pages, table, lens), dict(kv_dtype="q8_0")),
           ((q, codes(k_pages.shape), codes(v_pages.shape), table, lens),
            dict(kv_dtype="fp8_e4m3", k_scale=0.25, v_scale=2.0))])


def codes(shape, seed=4):
    """FP8 e4m3 codes of finite values up to 32 in magnitude, either sign (uint8 pools)."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 0x60, shape) | (rng.integers(0, 2, shape) << 7)).astype(np.uint8)


def test_varlen_attention():
    a = rng_arrays(4)
    cu_q, cu_k = np.array([0, 3, 4, 9], np.int32), np.array([0, 5, 11, 13], np.int32)
    q, k, v = a(9, 4, 8), a(13, 2, 8), a(13, 2, 8)
    sig = inspect.signature(clattn.varlen_attention).parameters
    full = dict(softmax_scale=0.3, causal=True, window_size=(4, 2), softcap=2.5,
                alibi_slopes=np.abs(a(4)), sinks=a(4), return_attn_probs=True)
    if "dropout_p" in sig:
        full.update(dropout_p=0.2, dropout_seed=7) if "dropout_seed" in sig else None
    cases = [((q, k, v, cu_q, cu_k), {n: x for n, x in full.items() if n in sig}),
             ((q, k, v, cu_q, cu_k), {"scale": 0.7} if "scale" in sig else {})]
    check(clattn.varlen_attention, cases,
          skip={"dropout_p"} - set(full))  # dropout with packed sequences: where supported


def test_quantize_and_positions():
    a = rng_arrays(5)
    x = a(2, 3, 5, 32)
    check(clattn.quantize, [((x, "q4_0"), {}), ((x, "fp8_e5m2"), dict(scale=0.125))])
    check(clattn.rotary_embedding,
          [((x,), dict(style="pairs", rotary_dim=16, base=500.0, start=3)),
           ((x,), dict(position_ids=np.array([[4, 1, 0, 9, 2], [3, 3, 1, 0, 7]], np.int32)))])
    check(clattn.positional_encoding,
          [((x[0, 0],), dict(start=4, base=300.0)),
           ((), dict(seq=5, dim=32, start=1)),
           ((x[0, 0],), dict(table=a(12, 32), start=2))])


def test_onnx_attention():
    a = rng_arrays(6)
    q, k, v = a(2, 4, 3, 8), a(2, 2, 5, 8), a(2, 2, 5, 8)
    past_k, past_v = a(2, 2, 2, 8), a(2, 2, 2, 8)
    mask = a(3, 7)
    check(clattn.onnx_attention,
          [((q, k, v, mask, past_k, past_v), dict(is_causal=1, scale=0.3, softcap=3.0,
                                                  softmax_precision=11,
                                                  want_qk_matmul_output=True,
                                                  qk_matmul_output_mode=1)),
           ((q.transpose(0, 2, 1, 3).reshape(2, 3, 32), k.transpose(0, 2, 1, 3).reshape(2, 5, 16),
             v.transpose(0, 2, 1, 3).reshape(2, 5, 16), None, None, None,
             np.array([5, 3], np.int64)),
            dict(q_num_heads=4, kv_num_heads=2, left_window_size=2,
                 right_window_size=1, path="fused"))])


def test_numpy_multihead_attention_and_kv_cache():
    a = rng_arrays(7)
    e, h = 16, 4
    mha = clattn.NumpyMultiheadAttention(e, h, batch_first=True)
    mha.load_state_dict(torch.nn.MultiheadAttention(e, h, batch_first=True).state_dict())
    x, y = a(2, 5, e), a(2, 7, e)
    pad = np.zeros((2, 7), bool)
    pad[1, 4:] = True
    check(mha.__call__, [((x, y, y, pad, True, a(5, 7), False), {}),
                         ((x, x, x), dict(is_causal=True, need_weights=False))])

    def attend(keys, values, query, **kw):
        cache = clattn.KVCache(2, 2, 16, 32)
        cache.append(keys, values)
        return cache.attend(query, **kw)

    attend.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
         for n in ("keys", "values", "query")] +
        list(inspect.signature(clattn.KVCache.attend).parameters.values())[2:])
    check(attend, [((a(2, 2, 6, 32), a(2, 2, 6, 32), a(2, 4, 2, 32)),
                    dict(scale=0.2, path="fused"))])


def with_copies(fn, *names):
    """fn with the named array arguments copied first (functions that write into their
    inputs, as flash_attn_with_kvcache's caches), same signature."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        for n in names:
            x = bound.arguments.get(n)
            if x is not None:
                bound.arguments[n] = x.clone() if isinstance(x, torch.Tensor) else x.copy()
        return fn(*bound.args, **bound.kwargs)
    return call


def test_flash_attn_functions():
    fa = pytest.importorskip("clattn.flash_attn")
    a = rng_arrays(8)
    q, k, v = a(2, 5, 4, 8), a(2, 7, 2, 8), a(2, 7, 2, 8)
    slopes, sinks = np.abs(a(4)), a(4)
    common = dict(softmax_scale=0.3, causal=True, window_size=(2, 2), softcap=2.0,
                  alibi_slopes=slopes, sinks=sinks)
    dropped = dict(dropout_p=0.2, dropout_seed=11, dropout_offset=2, return_attn_probs=True)
    check(fa.flash_attn_func, [((q, k, v), common), ((q, k, v), dropped)])
    qkv = a(2, 5, 3, 4, 8)
    check(fa.flash_attn_qkvpacked_func, [((qkv,), common), ((qkv,), dropped)])
    kv = a(2, 7, 2, 2, 8)
    check(fa.flash_attn_kvpacked_func, [((q, kv), common), ((q, kv), dropped)])
    cu_q, cu_k = np.array([0, 3, 4, 9], np.int32), np.array([0, 5, 11, 13], np.int32)
    pq, pk, pv = a(9, 4, 8), a(13, 2, 8), a(13, 2, 8)
    varlen = dict(common, return_attn_probs=True)
    check(fa.flash_attn_varlen_func,
          [((pq, pk, pv, cu_q, cu_k, 5, 6), varlen),
           ((pq, a(6, 4, 2, 8), a(6, 4, 2, 8), cu_q, np.array([0, 5, 11, 13], np.int32), 5,
             6), dict(block_table=np.array([[1, 4], [0, 3], [5, 2]], np.int32)))],
          skip={"dropout_p"})  # no dropout with packed sequences (refused)
    cu = np.array([0, 4, 6, 11], np.int32)
    check(fa.flash_attn_varlen_qkvpacked_func, [((a(11, 3, 4, 8), cu, 5), varlen)],
          skip={"dropout_p"})
    check(fa.flash_attn_varlen_kvpacked_func, [((pq, a(13, 2, 2, 8), cu_q, cu_k, 5, 6),
                                                varlen)], skip={"dropout_p"})
    cache = with_copies(fa.flash_attn_with_kvcache, "k_cache", "v_cache")
    kc, vc = a(3, 12, 2, 32), a(3, 12, 2, 32)
    qd, kn, vn = a(2, 2, 4, 32), a(2, 2, 2, 32), a(2, 2, 2, 32)
    lens = np.array([5, 8], np.int32)
    cos, sin = a(16, 8), a(16, 8)
    check(cache, [((qd, kc, vc, kn, vn, cos, sin, lens, np.array([2, 0], np.int32)),
                   dict(softmax_scale=0.3, causal=True, rotary_interleaved=False,
                        return_softmax_lse=True, sinks=sinks)),
                  ((qd, kc, vc), dict(cache_seqlens=lens, cache_leftpad=np.array([1, 2],
                                                                                  np.int32),
                                      window_size=(3, 0), softcap=2.0, alibi_slopes=slopes)),
                  ((qd, a(6, 4, 2, 32), a(6, 4, 2, 32), kn, vn), dict(
                      cache_seqlens=lens, block_table=np.array([[1, 4, 0], [5, 2, 3]],
                                                               np.int32),
                      kv_dtype="q8_0"))],
          skip={"num_splits"})  # flash-attn's split-KV hint: ignored (documented)


# --- issue 50's serving functions -------------------------------------------------------------


def test_merge_state():
    a = rng_arrays(12)
    sa, sb = a(17, 3) * 4, a(17, 3) * 4
    sb[2::5] = -np.inf  # rows with one side empty
    check(clattn.merge_state, [((a(17, 3, 63), sa, a(17, 3, 63), sb), {}),
                               ((a(2, 3, 5, 8), a(2, 3, 5), a(2, 3, 5, 8), a(2, 3, 5)),
                                dict(ctx=clattn.default_context()))])


def test_cascade_decode():
    a = rng_arrays(13)
    B, H, G, P, S, D, Dv, page = 3, 4, 2, 9, 5, 16, 8, 2
    q, pk, pv = a(B, H, D), a(P, G, D), a(P, G, Dv)
    lens = np.array([3, 0, 5], np.int32)
    table = np.array([[5, 0, 3], [1, 6, 2], [4, 7, 8]], np.int32)
    check(clattn.cascade_decode,
          [((q, pk, pv, a(B, S, G, D), a(B, S, G, Dv), lens), dict(scale=0.3, return_lse=True)),
           ((q, pk, pv, a(9, page, G, D), a(9, page, G, Dv), lens, table), {})])


def test_paged_varlen_attention():
    a = rng_arrays(14)
    cu_q = np.array([0, 1, 5, 7], np.int32)  # a decode row, a 4-row chunk, 2 rows
    table = np.array([[3, 1, 5], [0, 2, 4], [6, 7, 8]], np.int32)
    lens = np.array([10, 9, 4], np.int32)
    check(clattn.paged_varlen_attention,
          [((a(7, 4, 16), a(9, 4, 2, 16), a(9, 4, 2, 8), cu_q, table, lens),
            dict(causal=True, softmax_scale=0.3, softcap=2.0, sinks=a(4), return_lse=True))])


def test_mla_decode():
    a = rng_arrays(15)
    indptr, indices = np.array([0, 2, 5], np.int32), np.array([3, 0, 4, 1, 2], np.int32)
    lens = np.array([7, 9], np.int32)
    ckv, kpe = a(5, 4, 512), a(5, 4, 64)
    check(clattn.mla_decode,
          [((a(2, 2, 512), a(2, 2, 64), ckv, kpe, indptr, indices, lens), dict(sm_scale=0.07)),
           ((a(4, 2, 512), a(4, 2, 64), ckv, kpe, indptr, indices, lens),
            dict(sm_scale=0.05, causal=True, qo_indptr=np.array([0, 2, 4], np.int32),
                 kv_dtype="q8_0"))])


def test_kv_commit():
    a = rng_arrays(16)
    acc = np.array([[0, 2, 3], [1, -1, -1]], np.int32)
    lens = np.array([3, 5], np.int32)
    pages = clattn.quantize(a(7, 4, 2, 32), "q8_0")  # (7, 4, 2, 34) bytes
    check(clattn.kv_commit,
          [((a(2, 2, 12, 8), a(2, 2, 12, 4), lens, acc, 4), {}),
           ((pages, pages[::-1].copy(), lens, acc, 4),
            dict(block_table=np.array([[2, 6, 0], [5, 1, 3]], np.int32), kv_dtype="q8_0"))])


def test_tree_mask_in_flex_attention():
    """tree_mask gives a source and aux arrays (no tensors out); its trees may be torch, and
    flex_attention over its mask gives the same numbers either way."""
    a = rng_arrays(17)

    def ancestors(parents):
        m = np.zeros((len(parents), len(parents)), bool)
        for i in range(len(parents)):
            j = i
            while j >= 0:
                m[i, j], j = True, parents[j]
        return m

    def tree_attention(query, key, value, trees, prefix_lens):
        mask_mod, aux = clattn.tree_mask(trees, prefix_lens)
        bm = clattn.create_block_mask(mask_mod, 2, None, query.shape[2], key.shape[2],
                                      BLOCK_SIZE=8, aux=aux)
        return clattn.flex_attention(query, key, value, block_mask=bm, aux=aux)

    check(tree_attention, [((a(2, 2, 5, 16), a(2, 2, 19, 16), a(2, 2, 19, 16),
                             [ancestors([-1, 0, 0, 1, 3]), ancestors([-1, -1])], [14, 17]),
                            {})])


def test_kv_cache_step():
    """KVCache.step (a decode step's append fused into the attention) on an FP8 cache with
    its scales, after an append; the cache's constructor arguments are the step's here."""
    a = rng_arrays(18)

    def step(keys, values, query, key, value, dtype=np.float32, k_scale=None, v_scale=None,
             scale=None):
        cache = clattn.KVCache(2, 2, 16, 32, dtype=dtype, k_scale=k_scale, v_scale=v_scale)
        cache.append(keys, values)
        return cache.step(query, key, value, scale=scale)

    check(step, [((a(2, 2, 6, 32), a(2, 2, 6, 32), a(2, 4, 1, 32), a(2, 2, 1, 32),
                   a(2, 2, 1, 32)),
                  dict(dtype="fp8_e5m2", k_scale=0.3, v_scale=1.7, scale=0.2)),
                 ((a(2, 2, 6, 32), a(2, 2, 6, 32), a(2, 4, 1, 32), a(2, 2, 1, 32),
                   a(2, 2, 1, 32)), dict(dtype="fp8_e4m3"))])


# Every public name and the test here that checks its torch/numpy parity, or why it has none
# and where its numbers are tested (test_every_public_name_is_covered keeps this complete).
PARITY = {
    "scaled_dot_product_attention": "test_scaled_dot_product_attention",
    "sdpa_forward": "test_sdpa_forward_and_backward",
    "sdpa_backward": "test_sdpa_forward_and_backward",
    "flex_attention": "test_flex_attention",
    "paged_attention": "test_paged_attention",
    "varlen_attention": "test_varlen_attention",
    "quantize": "test_quantize_and_positions",
    "rotary_embedding": "test_quantize_and_positions",
    "positional_encoding": "test_quantize_and_positions",
    "onnx_attention": "test_onnx_attention",
    "NumpyMultiheadAttention": "test_numpy_multihead_attention_and_kv_cache",
    "KVCache": "test_numpy_multihead_attention_and_kv_cache",  # append, attend
    "KVCache.step": "test_kv_cache_step",
    "merge_state": "test_merge_state",
    "cascade_decode": "test_cascade_decode",
    "paged_varlen_attention": "test_paged_varlen_attention",
    "mla_decode": "test_mla_decode",
    "kv_commit": "test_kv_commit",
    "tree_mask": "test_tree_mask_in_flex_attention",
    "create_block_mask": "test_flex_attention",
}
NO_PARITY = {
    "ArgumentError": ("an exception class", None),
    "DeviceError": ("an exception class", None),
    "Error": ("an exception class", None),
    "Context": ("the device handle; every case runs in the default one", None),
    "BlockMask": ("create_block_mask's result, built from a mask_mod (no arrays in)",
                  "test_flex.py::test_create_block_mask_matches_brute_force"),
    "SdpaGrads": ("sdpa_backward's result tuple", None),
    "default_context": ("no arguments", None),
    "last_tiles_visited": ("no arguments: the last flex_attention's tile counts",
                           "test_flex.py::test_block_mask_skips_tiles_same_numbers"),
    "doctor": ("a device self-check (no arrays in)", "test_doctor.py::test_doctor_clean"),
    "validations": ("a context's self-validation records (no arrays in)",
                    "test_doctor.py::test_doctor_clean"),
    "dropout_mask": ("shape and seed in, a numpy mask out (no arrays in)",
                     "test_dropout.py::test_mask_matches_clattn_dropout_keep"),
    "ring_attention": ("needs MPI ranks (mpi4py)", "test_ring.py::test_ring_attention_ranks"),
}


def test_every_public_name_is_covered():
    """Each name of clattn.__all__ (and KVCache's step) has a parity test here, or a reason
    and the test of its numbers elsewhere; each named test exists."""
    import os
    import re
    names = set(clattn.__all__) | {"KVCache.step"}
    both = set(PARITY) & set(NO_PARITY)
    assert not both, f"{sorted(both)} listed twice"
    missing = names - set(PARITY) - set(NO_PARITY)
    assert not missing, f"public names with no parity test listed in PARITY: {sorted(missing)}"
    stale = (set(PARITY) | set(NO_PARITY)) - names
    assert not stale, f"listed but not public: {sorted(stale)}"
    for name, test in PARITY.items():
        assert callable(globals().get(test)), f"{name}: no test {test} in test_parity.py"
    here = os.path.dirname(os.path.abspath(__file__))
    for name, (_, where) in NO_PARITY.items():
        if where is not None:
            path, test = where.split("::")
            with open(os.path.join(here, path), encoding="utf-8") as f:
                assert re.search(rf"^def {test}\(", f.read(), re.M), f"{name}: no {where}"


def test_a_planted_dropped_argument_fails():
    """The check catches a torch branch that loses one argument on the way to the core."""
    real = clattn.scaled_dot_product_attention

    @functools.wraps(real)
    def planted(*args, **kwargs):
        if any(isinstance(x, torch.Tensor) for x in args):
            kwargs.pop("softcap", None)  # the bug: the torch branch forgets softcap
        return real(*args, **kwargs)

    with pytest.raises(AssertionError, match="torch and numpy inputs give other numbers"):
        check(planted, sdpa_cases(rng_arrays(1)))
