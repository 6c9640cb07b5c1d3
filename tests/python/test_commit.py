"""clattn.kv_commit (speculative decoding's commit) against a numpy model of the rule, and a
verification round: attention over the committed cache equals float64 attention over the
prefix plus the accepted drafts."""

import numpy as np
import pytest

import clattn


def _model(k, v, lengths, accepted, draft_len, table=None):
    """The rule on host arrays (contiguous (B, H, cap, E) or pools (pages, ps, H, E))."""
    k, v, lengths = k.copy(), None if v is None else v.copy(), lengths.copy()
    B = len(lengths)
    paged = table is not None
    cap = table.shape[1] * k.shape[1] if paged else k.shape[2]

    def where(b, pos):
        if pos >= cap:
            return None
        if not paged:
            return (b, slice(None), pos)
        page = table[b, pos // k.shape[1]]
        if page < 0 or page >= k.shape[0]:
            return None
        return (page, pos % k.shape[1], slice(None))

    for b in range(B):
        if lengths[b] < 0:
            continue
        base, prev, taken = int(lengths[b]), -1, 0
        for i, t in enumerate(accepted[b]):
            if t <= prev or t >= draft_len or where(b, base + t) is None \
                    or where(b, base + i) is None:
                break
            prev, taken = int(t), taken + 1
            for cache in (k, v):
                if cache is not None:
                    cache[where(b, base + i)] = cache[where(b, base + t)]
        lengths[b] = base + taken
    return k, v, lengths


def _lists(rng, B, A, draft_len):
    acc = np.full((B, A), -1, np.int32)
    for b in range(B):
        picks = np.sort(rng.choice(draft_len, size=rng.integers(0, min(A, draft_len) + 1),
                                   replace=False))
        acc[b, :len(picks)] = picks
    return acc


@pytest.mark.parametrize("B,H,cap,E,Ev,draft,dtype", [
    (3, 2, 37, 17, 5, 7, np.float32), (1, 1, 129, 64, 64, 17, np.float16),
    (2, 3, 20, 8, None, 6, np.float32)])
def test_contiguous(B, H, cap, E, Ev, draft, dtype):
    rng = np.random.default_rng(7 + B + cap)
    k = rng.standard_normal((B, H, cap, E)).astype(dtype)
    v = None if Ev is None else rng.standard_normal((B, H, cap, Ev)).astype(dtype)
    lengths = rng.integers(0, cap - draft // 2, B).astype(np.int32)
    acc = _lists(rng, B, draft + 1, draft)
    got = clattn.kv_commit(k, v, lengths, acc, draft)
    want = _model(k, v, lengths, acc, draft)
    for g, w in zip(got, want):
        if w is None:
            assert g is None
        else:
            np.testing.assert_array_equal(g, w)


def test_paged_q8_0_and_bad_lists():
    rng = np.random.default_rng(3)
    B, H, ps, blocks, E, draft = 3, 2, 16, 4, 64, 9
    pages = B * blocks + 1
    table = rng.permutation(pages)[:B * blocks].reshape(B, blocks).astype(np.int32)
    table[1, -1] = -1  # sequence 1's last block has no page: its list ends there
    k = clattn.quantize(rng.standard_normal((pages, ps, H, E)).astype(np.float32), "q8_0")
    v = clattn.quantize(rng.standard_normal((pages, ps, H, E)).astype(np.float32), "q8_0")
    lengths = np.array([5, 44, -1], np.int32)
    acc = np.array([[0, 2, 2, 5], [1, 3, 4, 8], [0, 1, 2, 3]], np.int32)  # a repeat ends row 0
    got = clattn.kv_commit(k, v, lengths, acc, draft, block_table=table, kv_dtype="q8_0")
    # the model on the blocks' bytes: rows of E // 32 * 34 bytes, moved whole
    want = _model(k, v, lengths, acc, draft, table)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert list(got[2]) == [7, 46, -1]  # 5 + 2; 44 + 2 (draft 4 is key 48: no page); untouched


def _attention(q, keys, values):
    s = keys @ q / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max())
    return (p / p.sum()) @ values


def test_verification_round_then_attention():
    """Drafts written after a prefix, a path accepted, committed: the next step's attention
    over the cache (paged_attention) equals float64 attention over prefix + accepted rows."""
    rng = np.random.default_rng(11)
    H, ps, E, prefix, draft = 2, 16, 32, 21, 7
    blocks = 3
    table = rng.permutation(blocks)[None, :].astype(np.int32)
    k = rng.standard_normal((blocks, ps, H, E)).astype(np.float32)
    v = rng.standard_normal((blocks, ps, H, E)).astype(np.float32)
    keys = np.array([k[table[0, j // ps], j % ps] for j in range(prefix + draft)])  # (n, H, E)
    vals = np.array([v[table[0, j // ps], j % ps] for j in range(prefix + draft)])
    path = [1, 2, 5]
    acc = np.array([path + [-1] * 4], np.int32)
    k2, v2, n = clattn.kv_commit(k, v, np.array([prefix], np.int32), acc, draft,
                                 block_table=table)
    assert n[0] == prefix + len(path)
    q = rng.standard_normal((1, H, 1, E)).astype(np.float32)
    out = clattn.paged_attention(q, k2, v2, table, n)
    rows = list(range(prefix)) + [prefix + t for t in path]
    for h in range(H):
        ref = _attention(q[0, h, 0].astype(np.float64), keys[rows, h].astype(np.float64),
                         vals[rows, h].astype(np.float64))
        np.testing.assert_allclose(out[0, h, 0], ref, rtol=1e-5, atol=1e-6)


def test_refusals():
    k = np.zeros((2, 1, 8, 4), np.float32)
    with pytest.raises(clattn.ArgumentError, match="draft_len"):
        clattn.kv_commit(k, None, np.zeros(2, np.int32), np.zeros((2, 2), np.int32), 0)
    with pytest.raises(clattn.ArgumentError, match="kv_seqlen"):
        clattn.kv_commit(k, None, np.zeros(3, np.int32), np.zeros((2, 2), np.int32), 2)
    with pytest.raises(clattn.ArgumentError, match="rank 4"):
        clattn.kv_commit(k[0], None, np.zeros(2, np.int32), np.zeros((2, 2), np.int32), 2)


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    k = torch.randn(2, 1, 10, 8)
    got = clattn.kv_commit(k, None, torch.tensor([2, 3], dtype=torch.int32),
                           torch.tensor([[1, 3], [0, 2]], dtype=torch.int32), 4)
    assert isinstance(got[0], torch.Tensor) and got[1] is None
    want = _model(k.numpy(), None, np.array([2, 3], np.int32), np.array([[1, 3], [0, 2]]), 4)
    np.testing.assert_array_equal(got[0].numpy(), want[0])
    assert got[2].tolist() == [4, 5]


def _ancestors(parents):
    n = len(parents)
    m = np.zeros((n, n), bool)
    for i in range(n):
        j = i
        while j >= 0:
            m[i, j] = True
            j = parents[j]
    return m


def test_tree_mask_verification():
    """Two sequences' draft trees (7 and 3 drafts) after their prefixes, through
    flex_attention with clattn.tree_mask, against float64 attention with the dense mask."""
    rng = np.random.default_rng(5)
    B, H, E, Lk, Lq = 2, 2, 16, 40, 7
    trees = [_ancestors([-1, 0, 0, 1, 1, 2, 5]), _ancestors([-1, -1, 1])]
    prefix = [Lk - 7, Lk - 3]
    mask_mod, aux = clattn.tree_mask(trees, prefix)
    q = rng.standard_normal((B, H, Lq, E)).astype(np.float32)
    k = rng.standard_normal((B, H, Lk, E)).astype(np.float32)
    v = rng.standard_normal((B, H, Lk, E)).astype(np.float32)
    bm = clattn.create_block_mask(mask_mod, B, None, Lq, Lk, BLOCK_SIZE=16, aux=aux)
    out = clattn.flex_attention(q, k, v, block_mask=bm, aux=aux)
    for b in range(B):
        n = trees[b].shape[0]
        keep = np.zeros((Lq, Lk), bool)
        keep[:, :prefix[b]] = True
        keep[:n, prefix[b]:prefix[b] + n] = trees[b]
        for h in range(H):
            s = q[b, h].astype(np.float64) @ k[b, h].T.astype(np.float64) / np.sqrt(E)
            s[~keep] = -np.inf
            p = np.exp(s - s.max(axis=1, keepdims=True))
            ref = (p / p.sum(axis=1, keepdims=True)) @ v[b, h].astype(np.float64)
            np.testing.assert_allclose(out[b, h], ref, rtol=1e-5, atol=1e-6)
    assert aux["tree_meta"].tolist() == [[33, 7, 0], [37, 3, 7]]


def test_torch_requires_grad_refused():
    torch = pytest.importorskip("torch")
    k = torch.randn(1, 1, 4, 8, requires_grad=True)
    with pytest.raises(clattn.ArgumentError, match="require grad"):
        clattn.kv_commit(k, None, torch.tensor([1], dtype=torch.int32),
                         torch.tensor([[1]], dtype=torch.int32), 2)
