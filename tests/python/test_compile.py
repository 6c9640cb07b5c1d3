"""torch.compile over clattn (clattn.ops: the custom operators clattn::sdpa and
clattn::sdpa_backward with fake implementations): a compiled graph with fullgraph=True (no
graph break allowed) calls clattn, forward and backward, and matches eager clattn and a
float64 reference. Needs torch >= 2.4 (torch.library.custom_op); skipped otherwise (Debian's
torch 1.13). The python lane runs it in its PyPI-torch venv."""

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "custom_op") or not hasattr(torch, "compile"):
    pytest.skip(f"torch {torch.__version__} has no torch.library.custom_op (2.4+)",
                allow_module_level=True)

import clattn  # noqa: E402
from clattn import ops  # noqa: E402
from test_dropin import close, reference  # noqa: E402


def inputs(seed, b=2, hq=4, hkv=2, lq=17, lk=23, d=16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hq, lq, d, generator=g), torch.randn(b, hkv, lk, d, generator=g),
            torch.randn(b, hkv, lk, d, generator=g))


def test_opcheck():
    """torch's own checks of a custom operator: schema, fake implementation against the real
    one, autograd registration, and the op under torch.compile-style tracing."""
    q, k, v = inputs(1)
    mask = torch.randn(17, 23)
    sinks = torch.randn(4)
    for args in ((q, k, v, None, None, False, None, True, 0.0, -1, -1, "auto"),
                 (q.requires_grad_(), k, v, mask, sinks, False, 0.3, True, 2.0, 4, 1, "auto")):
        torch.library.opcheck(torch.ops.clattn.sdpa.default, args)


@pytest.mark.parametrize("options", [{}, {"is_causal": True, "softcap": 2.5},
                                     {"mask": True, "window_size": (5, 2)},
                                     {"sinks": True, "scale": 0.2}])
def test_compiled_graph_calls_clattn(options):
    options = dict(options)
    q, k, v = inputs(2)
    mask = torch.randn(17, 23) if options.pop("mask", False) else None
    sinks = torch.randn(4) if options.pop("sinks", False) else None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def layer(q, k, v):
        out = clattn.scaled_dot_product_attention(q * 1.5, k, v, attn_mask=mask,
                                                  enable_gqa=True, sinks=sinks, **options)
        return torch.tanh(out).sum()

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    loss = compiled(*leaves)
    loss.backward()
    refs = [t.clone().double().requires_grad_() for t in (q, k, v)]
    want, _ = reference(refs[0] * 1.5, refs[1], refs[2], mask=mask,
                        causal=options.get("is_causal", False), scale=options.get("scale"),
                        softcap=options.get("softcap", 0.0),
                        window=options.get("window_size", (-1, -1)), sinks=sinks)
    torch.tanh(want).sum().backward()
    close(loss, torch.tanh(want).sum(), 1e-4)
    for a, b in zip(leaves, refs):
        close(a.grad, b.grad, 2e-4)


def test_eager_op_and_refusals():
    q, k, v = inputs(3, hq=2, hkv=2, lq=1, lk=1, d=8)
    close(ops.sdpa(q, k, v), reference(q, k, v)[0])
    with pytest.raises(clattn.ArgumentError, match="dropout"):
        ops.sdpa(q, k, v, dropout_p=0.1)

    def weights(q):
        return clattn.scaled_dot_product_attention(q, k, v, need_weights=True)[1]

    with pytest.raises(Exception, match="need_weights"):
        torch.compile(weights, fullgraph=True, backend="eager")(q)
