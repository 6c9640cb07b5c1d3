"""clattn.flex_translate: FlexAttention score_mod / mask_mod Python functions translated into
OpenCL C, checked by numbers. The generated source is compiled as plain C (a shim defines
__global and inline away and takes float math from tgmath.h), loaded with ctypes through a
driver generated here, and evaluated on a random grid of (score, b, h, q_idx, kv_idx) with
negative scores, big magnitudes and q_idx <, ==, > kv_idx; the reference is the same Python
function evaluated eagerly: in torch on int32 index tensors (float64 scores for the value,
torch.autograd for score_mod_grad) where torch with flex_attention is importable, else (the
tests written without torch) on Python scalars, with numpy arrays as the captured tensors.

    python3 -m pytest tests/python/test_flex_translate.py            # Debian python + numpy
    /work/venv-torch/bin/python -m pytest tests/python/test_flex_translate.py   # + torch
"""

import ctypes
import hashlib
import importlib.util
import math
import shutil
import subprocess
import types
from pathlib import Path

import numpy as np
import pytest


def _load_module():
    try:
        from clattn import flex_translate  # the installed package, where it has the module
        return flex_translate
    except Exception:
        path = Path(__file__).resolve().parents[2] / "python" / "clattn" / "flex_translate.py"
        spec = importlib.util.spec_from_file_location("clattn_flex_translate", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


ft = _load_module()
TranslateError = ft.TranslateError

try:
    import torch
    from torch.nn.attention.flex_attention import and_masks, noop_mask, or_masks
    HAVE_TORCH = True
except Exception:  # no torch, or a torch without flex_attention
    torch = None
    HAVE_TORCH = False

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch with flex_attention")
CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler (cc)")

B, H, L = 2, 4, 16

# --------------------------------------------------------------------------- C harness

SHIM = """#include <tgmath.h>
#include <stdlib.h>
#define __global
#define inline static
typedef unsigned char uchar;
"""


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("flex_c")


def compile_source(src, aux, build_dir):
    has_score = "float score_mod(float score" in src
    has_grad = "float score_mod_grad(float score" in src
    has_mask = "int mask_mod(int b" in src
    decls = "".join(f"static __global const {a.ctype} *{a.name};\n" for a in aux)
    cases = "".join(f"    case {i}: {a.name} = (const {a.ctype} *)p; break;\n"
                    for i, a in enumerate(aux))
    body = []
    if has_score:
        body.append("os[i] = score_mod(s[i], b[i], h[i], q[i], kv[i]);")
    if has_grad:
        body.append("og[i] = score_mod_grad(s[i], b[i], h[i], q[i], kv[i]);")
    if has_mask:
        body.append("om[i] = mask_mod(b[i], h[i], q[i], kv[i]);")
    driver = f"""
void flex_set_aux(int i, const void *p)
{{
    switch (i) {{
{cases}    default: break;
    }}
}}
void flex_eval(int n, const float *s, const int *b, const int *h, const int *q, const int *kv,
               float *os, float *og, int *om)
{{
    for (int i = 0; i < n; i++) {{
        {' '.join(body)}
    }}
}}
"""
    full = SHIM + decls + src + driver
    key = hashlib.sha1(full.encode()).hexdigest()[:16]
    c_path = build_dir / f"flex_{key}.c"
    so_path = build_dir / f"flex_{key}.so"
    if not so_path.exists():
        c_path.write_text(full)
        r = subprocess.run([CC, "-std=c11", "-O1", "-fPIC", "-shared", "-Werror=implicit-function-declaration",
                            "-o", str(so_path), str(c_path), "-lm"], capture_output=True, text=True)
        assert r.returncode == 0, f"generated source does not compile:\n{r.stderr}\n{full}"
    lib = ctypes.CDLL(str(so_path))
    for i, a in enumerate(aux):
        assert a.array.flags.c_contiguous
        assert a.array.dtype == {"float": np.float32, "int": np.int32, "uchar": np.uint8}[a.ctype]
        lib.flex_set_aux(i, a.array.ctypes.data_as(ctypes.c_void_p))
    lib._keep = aux  # the aux arrays must outlive the calls
    return lib, has_score, has_grad, has_mask


def run_c(src, aux, build_dir, s, b, h, q, kv):
    lib, has_score, has_grad, has_mask = compile_source(src, aux, build_dir)
    n = len(s)
    s32 = np.ascontiguousarray(s, dtype=np.float32)
    ints = [np.ascontiguousarray(x, dtype=np.int32) for x in (b, h, q, kv)]
    os_, og, om = np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.int32)
    P = ctypes.c_void_p
    lib.flex_eval(ctypes.c_int(n), s32.ctypes.data_as(P), *[x.ctypes.data_as(P) for x in ints],
                  os_.ctypes.data_as(P), og.ctypes.data_as(P), om.ctypes.data_as(P))
    return (os_ if has_score else None, og if has_grad else None, om if has_mask else None)


def grid(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    k1, k2 = n // 2, n // 4
    s = np.concatenate([rng.standard_normal(k1) * 3, rng.uniform(-300, 300, k2),
                        rng.choice([-1e4, -55.5, -1.0, -0.0, 0.0, 0.5, 2.0, 1e4], n - k1 - k2)])
    b = rng.integers(0, B, n)
    h = rng.integers(0, H, n)
    q = rng.integers(0, L, n)
    kv = rng.integers(0, L, n)
    m = min(n, 3 * L)  # diagonal, just above and just below it
    q[:m] = np.arange(m) % L
    kv[:m] = np.clip(q[:m] + (np.arange(m) // L) - 1, 0, L - 1)
    s = s.astype(np.float32).astype(np.float64)  # the scores C sees, exactly
    return s, b.astype(np.int32), h.astype(np.int32), q.astype(np.int32), kv.astype(np.int32)


def close(got, want, scale, rtol=2e-5, what=""):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    both_nan = np.isnan(got) & np.isnan(want)
    same_inf = np.isinf(want) & (got == want)
    with np.errstate(invalid="ignore"):
        err = np.abs(got - want)
    ok = both_nan | same_inf | (err <= rtol * (np.abs(want) + scale) + 1e-30)
    if not ok.all():
        i = np.flatnonzero(~ok)[:8]
        raise AssertionError(f"{what}: {len(np.flatnonzero(~ok))} mismatches, e.g. at {i}: "
                             f"got {got[i]}, want {want[i]}")


def reference(fn, kind, s, b, h, q, kv, mode, grad=True):
    """Value (and score derivative) of fn on the grid, evaluated eagerly."""
    n = len(b)
    if mode == "python":
        if kind == "mask":
            return np.array([bool(fn(int(b[i]), int(h[i]), int(q[i]), int(kv[i])))
                             for i in range(n)]), None
        return np.array([float(fn(float(s[i]), int(b[i]), int(h[i]), int(q[i]), int(kv[i])))
                         for i in range(n)]), None
    ti = [torch.tensor(x, dtype=torch.int32) for x in (b, h, q, kv)]
    if mode == "elementwise":  # Python control flow on tensors: one 0-d tensor at a time
        vals, grads = [], []
        for i in range(n):
            args = [x[i] for x in ti]
            if kind == "mask":
                vals.append(bool(fn(*args)))
                continue
            sc = torch.tensor(s[i], dtype=torch.float64, requires_grad=grad)
            out = fn(sc, *args)
            if not isinstance(out, torch.Tensor):
                out = torch.tensor(out, dtype=torch.float64)
            vals.append(float(out.detach()))
            if out.requires_grad:
                (g,) = torch.autograd.grad(out.to(torch.float64), sc, allow_unused=True)
                grads.append(0.0 if g is None else float(g))
            else:
                grads.append(0.0)
        return np.array(vals), (np.array(grads) if kind == "score" else None)
    if kind == "mask":
        out = fn(*ti)
        return torch.broadcast_to(torch.as_tensor(out), (n,)).numpy().astype(bool), None
    sc = torch.tensor(s, dtype=torch.float64, requires_grad=grad)
    out = torch.broadcast_to(torch.as_tensor(fn(sc, *ti)), (n,))
    if out.requires_grad:
        (g,) = torch.autograd.grad(out.to(torch.float64).sum(), sc, allow_unused=True)
        g = torch.zeros(n, dtype=torch.float64) if g is None else g
    else:
        g = torch.zeros(n, dtype=torch.float64)
    return out.detach().double().numpy(), g.numpy()


def check(build_dir, score_mod=None, mask_mod=None, mode="torch", n=3000, rtol=2e-5,
          grad=True, scale=None, fd_grad=False):
    """Translate, run the C, compare with the eager reference. Returns the source."""
    if mode in ("python",):
        n = min(n, 1500)
    if mode == "elementwise":
        n = min(n, 250)
    src, aux = ft.translate(score_mod, mask_mod, want_grad=grad)
    s, b, h, q, kv = grid(n)
    got_s, got_g, got_m = run_c(src, aux, build_dir, s, b, h, q, kv)
    if score_mod is not None:
        want, want_g = reference(score_mod, "score", s, b, h, q, kv, mode, grad)
        sc = (1.0 + np.abs(s)) if scale is None else scale
        close(got_s, want, sc, rtol, "score_mod")
        if grad:
            assert got_g is not None
            if want_g is not None:
                close(got_g, want_g, 1.0, rtol * 5, "score_mod_grad")
            if fd_grad:  # no torch: central differences where the function is smooth
                eps = 1e-4 * (1.0 + np.abs(s))
                up, _ = reference(score_mod, "score", s + eps, b, h, q, kv, "python")
                dn, _ = reference(score_mod, "score", s - eps, b, h, q, kv, "python")
                close(got_g, (up - dn) / (2 * eps), 1.0, 2e-3, "score_mod_grad (finite diff)")
        else:
            assert got_g is None
    if mask_mod is not None:
        want, _ = reference(mask_mod, "mask", s, b, h, q, kv, mode)
        np.testing.assert_array_equal(got_m != 0, want)
    return src


# --------------------------------------------------------------------------- pure Python
# (these run without torch: captured tensors are numpy arrays, the reference is Python)

NP_DOC = np.array([0] * 4 + [1] * 7 + [2] * 5, dtype=np.int64)
NP_SLOPES = np.array([2.0 ** (-8 * (i + 1) / H) for i in range(H)], dtype=np.float32)
NP_REL = np.random.default_rng(1).standard_normal((H, 2 * L - 1)).astype(np.float32)
SOFTCAP = 20.0
WINDOW = 4


def py_causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def py_softcap(score, b, h, q_idx, kv_idx):
    return SOFTCAP * math.tanh(score / SOFTCAP)


def py_relpos(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx)


def py_alibi(score, b, h, q_idx, kv_idx):
    bias = NP_SLOPES[h] * (kv_idx - q_idx)
    return score + bias


def py_doc(b, h, q_idx, kv_idx):
    return NP_DOC[q_idx] == NP_DOC[kv_idx]


def py_window(b, h, q_idx, kv_idx):
    return abs(q_idx - kv_idx) <= WINDOW


def py_table(score, b, h, q_idx, kv_idx):
    return score + NP_REL[h, q_idx - kv_idx + L - 1]


def py_composed(b, h, q_idx, kv_idx):
    return py_causal(b, h, q_idx, kv_idx) & py_doc(b, h, q_idx, kv_idx)


def py_floordiv_mod(b, h, q_idx, kv_idx):
    d = q_idx - kv_idx
    x = d // 3 + d % 5 * 7 + (d // -4) * 11 + (d % -3) * 13 + (-d) // (h + 1) * 17
    return x % 4 == 1


def py_float_floordiv_mod(score, b, h, q_idx, kv_idx):
    return score // 2.5 + score % -1.5 + (q_idx - kv_idx) / 4 + (q_idx - kv_idx) // 2.0


def py_multi(score, b, h, q_idx, kv_idx):
    """A docstring is fine."""
    x = score * 2
    x += 3
    x -= q_idx
    y = x ** 2 / 100.0 + abs(score) ** 0.5
    y *= 0.5
    z = max(y, -score)
    return min(z, 50.0) + (kv_idx > q_idx) * 2.0 - (b == h)


def py_ifelse(score, b, h, q_idx, kv_idx):
    if q_idx >= kv_idx:
        t = score * 2.0
        return t
    elif q_idx + 3 > kv_idx:
        return score - 1
    x = score / 3
    return x


def test_causal_python(build_dir):
    src = check(build_dir, mask_mod=py_causal, mode="python")
    assert "int mask_mod(int b, int h, int q_idx, int kv_idx)" in src


def test_softcap_python_with_finite_difference_grad(build_dir):
    check(build_dir, score_mod=py_softcap, mode="python", fd_grad=True)


def test_relpos_alibi_table_python(build_dir):
    check(build_dir, score_mod=py_relpos, mode="python", fd_grad=True)
    check(build_dir, score_mod=py_alibi, mode="python", fd_grad=True)
    src = check(build_dir, score_mod=py_table, mode="python", fd_grad=True)
    _, aux = ft.translate(py_table)
    assert [(a.name, a.ctype, a.array.shape) for a in aux] == [("NP_REL", "float", (H, 2 * L - 1))]
    assert "NP_REL[" in src


def test_document_and_window_and_composed_python(build_dir):
    check(build_dir, mask_mod=py_doc, mode="python")
    check(build_dir, mask_mod=py_window, mode="python")
    check(build_dir, mask_mod=py_composed, mode="python")
    _, aux = ft.translate(mask_mod=py_doc)
    assert len(aux) == 1 and aux[0].ctype == "int" and aux[0].array.dtype == np.int32
    np.testing.assert_array_equal(aux[0].array, NP_DOC)


def test_floordiv_and_mod_follow_python_on_negative_operands(build_dir):
    check(build_dir, mask_mod=py_floordiv_mod, mode="python")
    check(build_dir, score_mod=py_float_floordiv_mod, mode="python", grad=False)


def test_assignments_min_max_bool_arithmetic_python(build_dir):
    check(build_dir, score_mod=py_multi, mode="python", rtol=3e-5)


def test_if_elif_else_python(build_dir):
    src = check(build_dir, score_mod=py_ifelse, mode="python", fd_grad=True)
    assert "if (" in src


CAUSAL_FLAG = False


def py_static_if(score, b, h, q_idx, kv_idx):
    if CAUSAL_FLAG:
        return score + undefined_name  # noqa: F821 -- never translated: the branch is dead
    return score * 0.5 if SOFTCAP > 10 else score


def test_if_on_captured_constant_is_decided_at_translation(build_dir):
    src = check(build_dir, score_mod=py_static_if, mode="python", fd_grad=True)
    assert "if (" not in src


def py_chained(b, h, q_idx, kv_idx):
    return kv_idx - WINDOW <= q_idx < kv_idx + WINDOW and not (b == 1 and h == 3) or q_idx == 0


def test_chained_comparisons_and_or_not_python(build_dir):
    check(build_dir, mask_mod=py_chained, mode="python")


py_lambda_mask = lambda b, h, q, kv: (q - kv) % 3 == 0  # noqa: E731
py_lambda_score = lambda s, b, h, q, kv: s * (q + 1) / (kv + 1)  # noqa: E731


def test_lambdas_python(build_dir):
    check(build_dir, score_mod=py_lambda_score, mask_mod=py_lambda_mask, mode="python",
          fd_grad=True, rtol=3e-5)


two_lambdas = [lambda b, h, q, kv: q >= kv, lambda b, h, q, kv: q <= kv]  # noqa: E731


def test_two_lambdas_on_one_line_raise():
    with pytest.raises(TranslateError, match="several lambdas"):
        ft.translate(mask_mod=two_lambdas[0])


def test_constants_and_literals(build_dir):
    big = 1e30

    def f(score, b, h, q_idx, kv_idx):
        return score * 1e-3 + big * 0.0 + float("-inf") * (q_idx > 100) * 0 + 2 ** 3 + 7 // 2 + 0.1

    check(build_dir, score_mod=f, mode="python", grad=False)

    def inf_mask(score, b, h, q_idx, kv_idx):
        return score - float("inf") if q_idx < kv_idx else score

    src = check(build_dir, score_mod=inf_mask, mode="python", grad=True)
    assert "INFINITY" in src


def test_numpy_aux_conversions(build_dir):
    allowed = np.random.default_rng(2).random((L, L)) < 0.5
    five = np.arange(B * H * 2 * 2 * 3, dtype=np.int16).reshape(B, H, 2, 2, 3)
    halfs = np.linspace(-2, 2, L)  # float64: a float32 copy
    f16 = np.linspace(-1, 1, H).astype(np.float16)

    def m(b, h, q_idx, kv_idx):
        return allowed[q_idx][kv_idx] | (five[b, h, q_idx % 2, kv_idx % 2, 1] % 7 == 0) | \
            (f16[h] > 0.5)

    def s(score, b, h, q_idx, kv_idx):
        return score + halfs[q_idx - kv_idx]  # negative indices wrap, as torch's and numpy's

    check(build_dir, score_mod=s, mask_mod=m, mode="python")
    _, aux = ft.translate(s, m)
    got = {a.name: (a.ctype, a.array.dtype, a.array.shape) for a in aux}
    assert got == {"halfs": ("float", np.float32, (L,)), "allowed": ("uchar", np.uint8, (L, L)),
                   "five": ("int", np.int32, (B, H, 2, 2, 3)), "f16": ("float", np.float32, (H,))}


def test_int64_out_of_range_raises():
    big = np.array([0, 2**40], dtype=np.int64)

    def m(b, h, q_idx, kv_idx):
        return big[b] > 0

    with pytest.raises(TranslateError, match="int32"):
        ft.translate(mask_mod=m)


def test_aux_names_are_valid_unique_c_identifiers(build_dir):
    exp = np.ones(L, np.float32)          # a C function's name
    h_table = np.full(H, 2, np.int32)
    src, aux = ft.translate(_names_fn(exp, h_table))
    names = [a.name for a in aux]
    assert names[0] != "exp" and names[0].endswith("exp") and names[1] == "h_table"
    assert len(set(names)) == len(names)
    s, b, h, q, kv = grid(200)
    got, _, _ = run_c(src, aux, build_dir, s, b, h, q, kv)
    close(got, s + 1 + 2, 1 + np.abs(s), what="names")


def _names_fn(exp, h_table):
    def f(score, b, h, q_idx, kv_idx):
        return score + exp[q_idx] + h_table[h]
    return f


def test_str_passthrough_and_concatenation():
    c_score = "float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return score; }\n"
    c_mask = "int mask_mod(int b, int h, int q_idx, int kv_idx) { return q_idx >= kv_idx; }\n"
    src, aux = ft.translate(c_score, c_mask)
    assert c_score in src and c_mask in src and aux == []
    src, aux = ft.translate(c_score, py_causal)
    assert c_score in src and "int mask_mod(" in src and "score_mod_grad" not in src
    src, _ = ft.translate(py_softcap, want_grad=False)
    assert "score_mod_grad" not in src and "float score_mod(" in src
    src, _ = ft.translate(py_softcap)
    assert "score_mod_grad" in src


# ---- refusals

FOR_LOOP_LINE = 3


def bad_for(score, b, h, q_idx, kv_idx):
    x = score
    for i in range(3):
        x = x + i
    return x


def bad_while(score, b, h, q_idx, kv_idx):
    while score > 0:
        score = score - 1
    return score


def bad_attr(b, h, q_idx, kv_idx):
    return q_idx >= CONFIG.window


CONFIG = types.SimpleNamespace(window=3)


def bad_unknown_call(b, h, q_idx, kv_idx):
    return len(q_idx) > 0


def bad_method(score, b, h, q_idx, kv_idx):
    return score.exp()


def bad_slice(score, b, h, q_idx, kv_idx):
    return score + NP_REL[h, 1:3]


def bad_too_many(score, b, h, q_idx, kv_idx):
    return score + NP_SLOPES[h, q_idx]


def bad_partial(score, b, h, q_idx, kv_idx):
    return score + NP_REL[h]


def bad_float_index(score, b, h, q_idx, kv_idx):
    return score + NP_SLOPES[score]


def bad_bool_index(score, b, h, q_idx, kv_idx):
    return score + NP_SLOPES[q_idx > kv_idx]


def bad_list(score, b, h, q_idx, kv_idx):
    return score + [1, 2][0]


def bad_comprehension(score, b, h, q_idx, kv_idx):
    return score + sum([i for i in range(3)])


def bad_nested_def(score, b, h, q_idx, kv_idx):
    def inner(x):
        return x
    return inner(score)


def bad_no_return(score, b, h, q_idx, kv_idx):
    x = score  # noqa: F841


def bad_bare_return(score, b, h, q_idx, kv_idx):
    return


def bad_undefined(score, b, h, q_idx, kv_idx):
    return score + not_defined_anywhere  # noqa: F821


def bad_try(score, b, h, q_idx, kv_idx):
    try:
        return score
    except Exception:
        return score


def bad_side_effect(score, b, h, q_idx, kv_idx):
    print(score)
    return score


def bad_subscript_assign(score, b, h, q_idx, kv_idx):
    NP_SLOPES[h] = score
    return score


def bad_and_on_ints(b, h, q_idx, kv_idx):
    return q_idx and kv_idx


def bad_float_bitand(score, b, h, q_idx, kv_idx):
    return score & 1


def bad_neg_int_power(score, b, h, q_idx, kv_idx):
    return score + q_idx ** -1


def bad_string(score, b, h, q_idx, kv_idx):
    return score + "a"


def bad_is(b, h, q_idx, kv_idx):
    return q_idx is kv_idx


def bad_in(b, h, q_idx, kv_idx):
    return q_idx in (1, 2)


def bad_local_before_assign(score, b, h, q_idx, kv_idx):
    y = x + 1  # noqa: F821
    x = score
    return y


def bad_walrus(score, b, h, q_idx, kv_idx):
    return (y := score) + y


def bad_fstring(score, b, h, q_idx, kv_idx):
    return float(f"{score}")


def bad_starargs(score, *rest):
    return score


def bad_callee(b, h, q_idx, kv_idx):
    return bad_while_mask(b, h, q_idx, kv_idx)


def bad_while_mask(b, h, q_idx, kv_idx):
    while True:
        return q_idx >= kv_idx


def three_params(score, b, h):
    return score


def bad_list_capture(score, b, h, q_idx, kv_idx):
    return score + PY_LIST[h]


PY_LIST = [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("fn, kind, pattern", [
    (bad_for, "score", r"^score_mod line 3: 'for' loops are not in the subset clattn translates"),
    (bad_while, "score", r"score_mod line 2: 'while' loops"),
    (bad_attr, "mask", r"attribute access '.window' on 'CONFIG' \(SimpleNamespace\)"),
    (bad_unknown_call, "mask", r"calling 'len' is not in the subset"),
    (bad_method, "score", r"tensor method '.exp\(\)' is not in the subset"),
    (bad_slice, "score", r"slices of captured tensor 'NP_REL'"),
    (bad_too_many, "score", r"has 1 dimensions but is indexed with 2"),
    (bad_partial, "score", r"'NP_REL' \(shape \(4, 31\)\) used as a value with 1 of its 2 indices"),
    (bad_float_index, "score", r"indexed with a float"),
    (bad_bool_index, "score", r"boolean \(mask\) indexing"),
    (bad_list, "score", r"list displays are not in the subset"),
    (bad_comprehension, "score", r"list comprehensions|calling 'sum'"),
    (bad_nested_def, "score", r"score_mod line 2: nested function definitions"),
    (bad_no_return, "score", r"ends without a 'return'"),
    (bad_bare_return, "score", r"'return' without a value"),
    (bad_undefined, "score", r"name 'not_defined_anywhere' is not defined"),
    (bad_try, "score", r"'try' statements"),
    (bad_side_effect, "score", r"score_mod line 2: expression statements"),
    (bad_subscript_assign, "score", r"assignments to subscripts"),
    (bad_and_on_ints, "mask", r"'and' on a non-boolean int value"),
    (bad_float_bitand, "score", r"'&' on float values"),
    (bad_neg_int_power, "score", r"negative integer powers"),
    (bad_string, "score", r"the string 'a' used as a value"),
    (bad_is, "mask", r"'is' comparisons are only translated against None"),
    (bad_in, "mask", r"comparison In is not in the subset"),
    (bad_local_before_assign, "score", r"local variable 'x' is read before it is assigned"),
    (bad_walrus, "score", r"':=' assignments"),
    (bad_fstring, "score", r"f-strings"),
    (bad_starargs, "score", r"score_mod: takes 5 parameters"),
    (bad_callee, "mask", r"^mask_mod line 2, in bad_while_mask line 2: 'while' loops"),
    (three_params, "score", r"score_mod: takes 5 parameters \(score, b, h, q_idx, kv_idx\); three_params takes 3"),
    (bad_list_capture, "score", r"PY_LIST \(list\) used as a value|indexing 'PY_LIST'"),
])
def test_refusals_name_the_construct_and_line(fn, kind, pattern):
    with pytest.raises(TranslateError, match=pattern) as e:
        ft.translate(**{f"{kind}_mod": fn})
    assert isinstance(e.value, TypeError)
    assert "test_flex_translate.py" in str(e.value) or "takes" in str(e.value) or \
        "lambdas" in str(e.value)


def test_refusal_of_non_callable():
    with pytest.raises(TranslateError, match="must be a Python function or OpenCL C source"):
        ft.translate(score_mod=3)
    with pytest.raises(TranslateError, match="is not a Python function"):
        ft.translate(mask_mod=np.maximum)


def test_no_torch_import_at_module_import():
    import sys
    import subprocess as sp
    path = Path(ft.__file__)
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('m', {str(path)!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "print('torch' in sys.modules)\n")
    out = sp.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- torch

if HAVE_TORCH:
    DOC_ID = torch.tensor([0] * 4 + [1] * 7 + [2] * 5)  # int64, as users make it
    PREFIX = torch.tensor([5, 11])
    ALIBI = torch.tensor([2.0 ** (-8 * (i + 1) / H) for i in range(H)])
    REL_BIAS = torch.randn(H, 2 * L - 1, generator=torch.Generator().manual_seed(3))
    FULL_BIAS = torch.randn(L, L, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    T5_TABLE = torch.randn(H, 16, generator=torch.Generator().manual_seed(5))
    ALLOWED = torch.rand(L, L, generator=torch.Generator().manual_seed(6)) < 0.6
    BF16 = torch.linspace(-3, 3, L).to(torch.bfloat16)
    F16 = torch.linspace(-1, 1, H).to(torch.float16)
    SCALE0D = torch.tensor(1.5)
    FIVE = torch.arange(B * H * 2 * 3 * 2).reshape(B, H, 2, 3, 2)
NUM_BUCKETS, MAX_DISTANCE = 16, 32


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return q_idx - kv_idx <= WINDOW


def sliding_abs(b, h, q_idx, kv_idx):
    return torch.abs(q_idx - kv_idx) <= WINDOW


def prefix_lm(b, h, q_idx, kv_idx):
    return kv_idx <= PREFIX[b]


def prefix_lm_full(b, h, q_idx, kv_idx):
    return prefix_lm(b, h, q_idx, kv_idx) | causal(b, h, q_idx, kv_idx)


def document_mask(b, h, q_idx, kv_idx):
    return DOC_ID[q_idx] == DOC_ID[kv_idx]


def doc_causal(b, h, q_idx, kv_idx):
    causal_mask = q_idx >= kv_idx
    document = DOC_ID[q_idx] == DOC_ID[kv_idx]
    return causal_mask & document


def alibi(score, b, h, q_idx, kv_idx):
    bias = ALIBI[h] * (kv_idx - q_idx)
    return score + bias


def softcap(score, b, h, q_idx, kv_idx):
    score = score / SOFTCAP
    score = torch.tanh(score)
    score = score * SOFTCAP
    return score


def relative_positional(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx)


def rel_bias_table(score, b, h, q_idx, kv_idx):
    return score + REL_BIAS[h, q_idx - kv_idx + L - 1]


def full_bias(score, b, h, q_idx, kv_idx):
    return score + FULL_BIAS[q_idx][kv_idx]


def t5_bucket(relative_position):
    nb = NUM_BUCKETS // 2
    ret = (relative_position > 0).int() * nb
    n = torch.abs(relative_position)
    max_exact = nb // 2
    is_small = n < max_exact
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(MAX_DISTANCE / max_exact)
                         * (nb - max_exact)).to(torch.int32)
    large = torch.clamp(large, max=nb - 1)
    return ret + torch.where(is_small, n, large)


def t5_bias(score, b, h, q_idx, kv_idx):
    return score + T5_TABLE[h, t5_bucket(kv_idx - q_idx)]


def where_promotes(score, b, h, q_idx, kv_idx):
    return score + torch.where(q_idx >= kv_idx, q_idx - kv_idx, 0.5)


def math_funcs(score, b, h, q_idx, kv_idx):
    a = torch.sigmoid(score) * 2 + torch.exp(-torch.abs(score) / 10)
    c = torch.log(score * score + 1) + torch.sqrt(torch.abs(score) + 1)
    d = torch.clamp(score, min=-5.0) + torch.clamp(score, None, 3.0) + torch.clamp(score, -1, 1)
    e = torch.maximum(score, (q_idx - kv_idx).float()) + torch.minimum(score * 0.5, ALIBI[h])
    f = score ** 2 / 1000 + score ** 3 / 1e6 + torch.floor(score) + torch.sign(score)
    g = torch.relu(score - 1) + torch.pow(torch.abs(score) + 1, 0.5)
    return a + c + d + e + f + g


def int_math(score, b, h, q_idx, kv_idx):
    d = q_idx - kv_idx
    x = torch.abs(d) + torch.sign(d) * 3 + torch.floor(d) + torch.clamp(d, -2, 5) + d ** 2
    y = torch.maximum(d, h) - torch.minimum(d, b) + (d > 0) * 2 + (d < 0) + True
    z = torch.clamp(d, min=0.5) + d / 3 + 2 ** h + torch.relu(d) + (d << 1) + (d >> 1) + (d & 3) + (d ^ h)
    return score + x + y + z + ~d


def casts(score, b, h, q_idx, kv_idx):
    q = q_idx.float() / 2 + kv_idx.to(torch.float32) + h.to(dtype=torch.float64)
    trunc = (score * 3).int() + (score / 7).long() + (score > 0).int()
    keep = score.to(score.dtype) + b.bool().float() + (q_idx - kv_idx).bool()
    return q + trunc + keep


def torch_floordiv_mod_mask(b, h, q_idx, kv_idx):
    d = q_idx - kv_idx
    x = d // 3 + d % 5 * 7 + (d // -4) * 11 + (d % -3) * 13 + (-d) // (h + 1) * 17
    return x % 4 == 1


def torch_floordiv_score(score, b, h, q_idx, kv_idx):  # torch has no derivative of //
    return score // 2.5 + score // -0.75 + (q_idx - kv_idx) / 4 + (q_idx - kv_idx) // 2.0


def torch_mod_score(score, b, h, q_idx, kv_idx):
    return score % -1.5 + score % 4 + (q_idx - kv_idx) % 2.5


def bool_arith(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) + (b == 0)  # bool + bool is a logical or in torch


def bool_mul(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) * (h < 2) | ~(kv_idx > 12)


def if_else_torch(score, b, h, q_idx, kv_idx):
    if q_idx >= kv_idx:
        return torch.tanh(score)
    else:
        x = score * 2
        if h > 1:
            return x
        return q_idx  # an int branch: promoted to float


def builtins_elementwise(score, b, h, q_idx, kv_idx):
    m = min(score, q_idx - kv_idx)
    return max(m, -3.0) + min(score, 2, h) + abs(score)


def chained_torch(b, h, q_idx, kv_idx):
    return kv_idx - WINDOW <= q_idx < kv_idx + WINDOW and not (b == 1 and h == 3) or q_idx == 0


def math_module_funcs(score, b, h, q_idx, kv_idx):
    return math.tanh(score / 5) * math.exp(1) + math.sqrt(abs(score) + 1) + math.log(abs(score) + 2)


def aux_dtypes(score, b, h, q_idx, kv_idx):
    return score * SCALE0D + BF16[q_idx] + F16[h] + FIVE[b, h, q_idx % 2, kv_idx % 3, 1] + \
        ALLOWED[q_idx, kv_idx]


def negative_tensor_index(score, b, h, q_idx, kv_idx):
    return score + ALIBI[-1] + REL_BIAS[-2, q_idx - kv_idx]


@needs_torch
@pytest.mark.parametrize("mask", [causal, sliding_window, sliding_abs, prefix_lm, prefix_lm_full,
                                  document_mask, doc_causal, torch_floordiv_mod_mask, bool_arith,
                                  bool_mul])
def test_torch_masks(build_dir, mask):
    check(build_dir, mask_mod=mask)


@needs_torch
@pytest.mark.parametrize("score", [alibi, softcap, relative_positional, rel_bias_table,
                                   t5_bias, where_promotes, int_math, casts,
                                   aux_dtypes, negative_tensor_index])
def test_torch_score_mods(build_dir, score):
    check(build_dir, score_mod=score, rtol=3e-5)


@needs_torch
def test_torch_math_and_grads(build_dir):
    check(build_dir, score_mod=math_funcs, rtol=5e-5)


@needs_torch
def test_torch_floordiv_mod_score(build_dir):
    check(build_dir, score_mod=torch_floordiv_score, rtol=3e-5, grad=False)
    check(build_dir, score_mod=torch_mod_score, rtol=3e-5)


@needs_torch
def test_torch_control_flow_elementwise(build_dir):
    check(build_dir, score_mod=if_else_torch, mode="elementwise")
    check(build_dir, score_mod=builtins_elementwise, mode="elementwise")
    check(build_dir, mask_mod=chained_torch, mode="elementwise")
    # math.* on a tensor gives a Python float (no autograd) in eager torch; the translation
    # differentiates them like their torch namesakes, so only the values are compared
    check(build_dir, score_mod=math_module_funcs, mode="elementwise", rtol=5e-5, grad=False)
    check(build_dir, score_mod=full_bias, mode="elementwise")  # t[q][kv] is per element


@needs_torch
def test_and_masks_or_masks_noop_mask(build_dir):
    check(build_dir, score_mod=softcap, mask_mod=and_masks(causal, sliding_window))
    check(build_dir, mask_mod=or_masks(prefix_lm, causal))
    check(build_dir, mask_mod=and_masks(or_masks(prefix_lm, causal), document_mask, sliding_abs))
    src = check(build_dir, mask_mod=noop_mask)
    assert "return 1;" in src
    check(build_dir, mask_mod=and_masks())
    check(build_dir, mask_mod=or_masks())


combined_global = None


def calls_combined(b, h, q_idx, kv_idx):
    return combined_global(b, h, q_idx, kv_idx) & (h != 2)


@needs_torch
def test_and_masks_called_inside_a_function(build_dir):
    global combined_global
    combined_global = and_masks(causal, document_mask)
    check(build_dir, mask_mod=calls_combined)


@needs_torch
def test_torch_lambdas_and_closures(build_dir):
    window = 3
    slopes = ALIBI * 2

    def make_window(w):
        return lambda b, h, q, kv: (q - kv).abs() <= w if False else torch.abs(q - kv) <= w

    win = make_window(window)
    score = lambda s, b, h, q, kv: s + slopes[h] * (kv - q)  # noqa: E731
    src = check(build_dir, score_mod=score, mask_mod=win)
    assert "<= 3" in src
    _, aux = ft.translate(score, win)
    assert [a.name for a in aux] == ["slopes"]


@needs_torch
def test_torch_aux_conversions():
    _, aux = ft.translate(aux_dtypes)
    got = {a.name: (a.ctype, a.array.dtype, a.array.shape) for a in aux}
    assert got == {"SCALE0D": ("float", np.float32, ()), "BF16": ("float", np.float32, (L,)),
                   "F16": ("float", np.float32, (H,)),
                   "FIVE": ("int", np.int32, (B, H, 2, 3, 2)),
                   "ALLOWED": ("uchar", np.uint8, (L, L))}
    _, aux = ft.translate(mask_mod=doc_causal)
    assert aux[0].array.dtype == np.int32 and aux[0].array.flags.c_contiguous
    big = torch.tensor([1, 2**33])

    def m(b, h, q_idx, kv_idx):
        return big[b] > q_idx

    with pytest.raises(TranslateError, match="int32"):
        ft.translate(mask_mod=m)


@needs_torch
def test_same_tensor_twice_is_one_aux(build_dir):
    def s(score, b, h, q_idx, kv_idx):
        return score + ALIBI[h] + alibi(score, b, h, q_idx, kv_idx)

    src, aux = ft.translate(s, prefix_lm_full)
    assert [a.name for a in aux] == ["ALIBI", "PREFIX"]
    check(build_dir, score_mod=s, mask_mod=prefix_lm_full)


def torch_bad_method(score, b, h, q_idx, kv_idx):
    return score + q_idx.new_ones(())


def torch_bad_fn(score, b, h, q_idx, kv_idx):
    return score + torch.erf(score)


def torch_bad_full(score, b, h, q_idx, kv_idx):
    return torch.full_like(score, 1.0)


def torch_bad_where1(b, h, q_idx, kv_idx):
    return torch.where(q_idx > kv_idx)


def torch_bad_where_cond(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx, score, 0.0)


def torch_bad_attr(b, h, q_idx, kv_idx):
    return q_idx < DOC_ID.shape[0]


def torch_bad_dtype(score, b, h, q_idx, kv_idx):
    return score.to(torch.complex64)


@needs_torch
@pytest.mark.parametrize("fn, kind, pattern", [
    (torch_bad_method, "score", r"tensor method '.new_ones\(\)'"),
    (torch_bad_fn, "score", r"calling 'erf' is not in the subset"),
    (torch_bad_full, "score", r"calling 'full_like'"),
    (torch_bad_where1, "mask", r"where\(\) needs the argument 'input'"),
    (torch_bad_where_cond, "score", r"condition must be a boolean"),
    (torch_bad_attr, "mask", r"attribute access '.shape' on captured tensor 'DOC_ID'"),
    (torch_bad_dtype, "score", r"dtype torch.complex64"),
])
def test_torch_refusals(fn, kind, pattern):
    with pytest.raises(TranslateError, match=pattern):
        ft.translate(**{f"{kind}_mod": fn})


@needs_torch
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_accepts_the_same_functions():
    """The functions tested here are real FlexAttention mods: flex_attention runs them."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    q = torch.randn(B, H, L, 8)
    bm = create_block_mask(and_masks(doc_causal, sliding_window), B, H, L, L, device="cpu")
    out = flex_attention(q, q, q, score_mod=t5_bias, block_mask=bm)
    assert torch.isfinite(out).all()


# --------------------------------------------------------------------------- OpenCL C 1.2

CLANG = shutil.which("clang")


def _opencl_syntax_check(src, aux, tmp_path, has_mask):
    """clang's OpenCL C 1.2 front end, -Werror (no double, no implicit declarations); the
    aux pointers become null pointer macros, as the syntax needs only their type."""
    pre = "".join(f"#define {a.name} ((__global const {a.ctype} *)0)\n" for a in aux)
    kernel = ("__kernel void k(__global float *o, __global int *mo) {"
              " o[0] = score_mod(1.0f, 0, 1, 2, 3) + score_mod_grad(1.0f, 0, 1, 2, 3);"
              + (" mo[0] = mask_mod(0, 1, 2, 3);" if has_mask else "") + " }\n")
    path = tmp_path / "flex.cl"
    path.write_text(pre + src + kernel)
    r = subprocess.run([CLANG, "-x", "cl", "-cl-std=CL1.2", "-Xclang", "-finclude-default-header",
                        "-fsyntax-only", "-Werror", str(path)], capture_output=True, text=True)
    if r.returncode and "finclude-default-header" in r.stderr:
        pytest.skip("this clang has no OpenCL default header")
    assert r.returncode == 0, r.stderr + "\n" + pre + src


@pytest.mark.skipif(CLANG is None, reason="needs clang for the OpenCL C syntax check")
@pytest.mark.parametrize("pair", ["python", "torch"])
def test_generated_source_is_opencl_c_1_2(tmp_path, pair):
    if pair == "python":
        pairs = [(py_multi, py_floordiv_mod), (py_float_floordiv_mod, py_chained),
                 (py_ifelse, py_composed), (py_table, py_window), (py_alibi, None)]
    else:
        if not HAVE_TORCH:
            pytest.skip("needs torch with flex_attention")
        pairs = [(math_funcs, None), (int_math, and_masks(doc_causal, sliding_abs)),
                 (t5_bias, torch_floordiv_mod_mask), (torch_floordiv_score, bool_mul),
                 (torch_mod_score, chained_torch), (if_else_torch, prefix_lm_full),
                 (casts, None), (aux_dtypes, None), (builtins_elementwise, None)]
    for score, mask in pairs:
        src, aux = ft.translate(score, mask)
        _opencl_syntax_check(src, aux, tmp_path, mask is not None)
