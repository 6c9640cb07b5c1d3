"""Translate PyTorch FlexAttention score_mod / mask_mod Python functions into OpenCL C source.

    src, aux = translate(score_mod=softcap, mask_mod=and_masks(causal, sliding_window))

The source defines (each only when its function is given)

    float score_mod(float score, int b, int h, int q_idx, int kv_idx);
    int   mask_mod(int b, int h, int q_idx, int kv_idx);          /* nonzero: key kept */
    float score_mod_grad(float score, int b, int h, int q_idx, int kv_idx);  /* d/d score */

in OpenCL C 1.2 (no double), and `aux` lists the captured tensors the source reads: each is
visible to the functions as `__global const T *NAME` (T = float, int or uchar), indexed by
flat (row-major) element index. Helpers are `inline` functions named flex_*; they read no
aux pointer (everything else is inlined into the three functions).

The subset translated is what FlexAttention's own examples use: a body of assignments
(augmented ones too) ending in a `return`, `if`/`else` (on a captured Python constant the
branch is chosen here; on a tensor condition it becomes a C if), arithmetic with torch's
eager semantics on int32 index tensors and float scores (int op int stays int, `/` is true
division, `//` and `%` are Python's floor division and modulo, bools are 0/1, Python scalars
take the tensor's kind), comparisons (chained too), & | ^ ~ and/or/not on booleans,
torch.where, abs, exp, tanh, log, sqrt, sigmoid, relu, floor, sign, pow, clamp/clip,
minimum/maximum, builtin min/max, math.* of the same names, the casts .float() .int() .long()
.bool() .to(dtype), indexing captured tensors (torch or numpy) with any int expressions,
captured Python int/float/bool scalars (baked in as constants), calls of other Python
functions in scope (inlined), and torch's and_masks / or_masks / noop_mask. Anything else
raises TranslateError naming the construct and the line.

score_mod_grad is the forward-mode derivative of score_mod with respect to score: torch.where
and if/else take the chosen branch's derivative, clamp/min/max the selected side's
(torch.clamp passes it only strictly inside the bounds and torch.minimum/maximum split ties
evenly, as torch does; builtin min/max follow Python's choice of the first on ties), comparisons, casts to int,
floor, sign and integer expressions have derivative 0. Gradients with respect to captured
tensors are not produced.

Out-of-range indices into captured tensors are not checked (negative indices wrap once, as
torch's do); integer division or modulo by zero gives 0 (torch raises).

torch is never imported here: a torch object can only be captured if torch is already
imported (it is looked up in sys.modules).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import linecache
import math
import operator
import re
import sys
import textwrap
import types

import numpy as np

__all__ = ["TranslateError", "Aux", "translate"]


class TranslateError(TypeError):
    """A score_mod / mask_mod uses something outside the subset clattn translates."""


class Aux:
    """One captured tensor the generated source reads as `__global const ctype *name`.
    requires_grad: whether the captured object is a torch tensor that requires grad (the
    translation treats it as a constant; callers that differentiate refuse it)."""

    def __init__(self, name, array, ctype, requires_grad=False):
        self.name = name
        self.array = array
        self.ctype = ctype
        self.requires_grad = requires_grad

    def __repr__(self):
        return f"Aux(name={self.name!r}, ctype={self.ctype!r}, shape={self.array.shape})"


# --------------------------------------------------------------------------- values

_RANK = {"bool": 0, "int": 1, "float": 2}
_NC = object()  # "not a constant"


class _V:
    """A typed expression: C code (an identifier or literal), type bool/int/float, the C code
    of its derivative with respect to score (None: zero), and its Python value when known."""

    __slots__ = ("c", "t", "d", "const", "nonneg")

    def __init__(self, c, t, d=None, const=_NC, nonneg=False):
        self.c, self.t, self.d, self.const, self.nonneg = c, t, d, const, nonneg

    @property
    def is_const(self):
        return self.const is not _NC


class _Tensor:
    def __init__(self, aux, info, idx):
        self.aux, self.info, self.idx = aux, info, idx


class _Sym:
    """A Python object that is not a value: a module, dtype, function, None, or opaque."""

    def __init__(self, kind, obj, name):
        self.kind, self.obj, self.name = kind, obj, name


_NONE = _Sym("none", None, "None")


def _const(v):
    if isinstance(v, (bool, np.bool_)):
        return _V(None, "bool", const=bool(v), nonneg=True)
    if isinstance(v, (int, np.integer)):
        return _V(None, "int", const=int(v), nonneg=v >= 0)
    if isinstance(v, (float, np.floating)):
        return _V(None, "float", const=float(v), nonneg=v >= 0)
    if isinstance(v, str):
        return _V(None, "str", const=v)
    raise AssertionError(v)


def _promote(*ts):
    return max(ts, key=lambda t: _RANK[t])


def _ctype(t):
    return "float" if t == "float" else "int"


_FLT_MAX_ROUND = 3.4028235677973366e38  # doubles at or above this round to float inf


def _float_lit(v):
    if v != v:
        return "NAN"
    if abs(v) >= _FLT_MAX_ROUND:
        return "INFINITY" if v > 0 else "(-INFINITY)"
    s = repr(float(v))
    if "e" not in s and "." not in s:
        s += ".0"
    if "e" in s and "." not in s.split("e")[0]:
        s = s.replace("e", ".0e", 1)
    s += "f"
    return f"({s})" if v < 0 or s.startswith("-") else s


# --------------------------------------------------------------------------- helpers (C)

_HELPERS = {
    "flex_floordiv_i": """inline int flex_floordiv_i(int a, int b)
{
    if (b == 0) return 0;
    int q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
}
""",
    "flex_mod_i": """inline int flex_mod_i(int a, int b)
{
    if (b == 0) return 0;
    int r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}
""",
    "flex_mod_f": """inline float flex_mod_f(float a, float b)
{
    float m = fmod(a, b);
    if (m != 0.0f) {
        if ((b < 0.0f) != (m < 0.0f)) m += b;
    } else {
        m = copysign(0.0f, b);
    }
    return m;
}
""",
    "flex_floordiv_f": """inline float flex_floordiv_f(float a, float b)
{
    float m = fmod(a, b);
    float d = (a - m) / b;
    if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) d -= 1.0f;
    float f;
    if (d != 0.0f) {
        f = floor(d);
        if (d - f > 0.5f) f += 1.0f;
    } else {
        f = copysign(0.0f, a / b);
    }
    return f;
}
""",
    "flex_ipow": """inline int flex_ipow(int a, int e)
{
    int r = 1;
    if (e < 0) return 0;
    while (e > 0) {
        if (e & 1) r *= a;
        e >>= 1;
        if (e > 0) a *= a;
    }
    return r;
}
""",
}

_RESERVED = set("""
auto break case char const continue default do double else enum extern float for goto if inline
int long register restrict return short signed sizeof static struct switch typedef union
unsigned void volatile while bool uchar uint ushort ulong half size_t ptrdiff_t intptr_t
uintptr_t global local constant private kernel read_only write_only read_write
__global __local __constant __private __kernel image2d_t image3d_t sampler_t event_t
exp tanh log sqrt fabs floor pow fmod copysign abs select fmin fmax min max sign clamp
INFINITY NAN M_PI score b h q_idx kv_idx score_mod mask_mod score_mod_grad
true false
""".split())

_DESC = {
    ast.For: "'for' loops", ast.AsyncFor: "'async for' loops", ast.While: "'while' loops",
    ast.Try: "'try' statements", ast.With: "'with' statements", ast.Raise: "'raise' statements",
    ast.Assert: "'assert' statements", ast.Global: "'global' statements",
    ast.Nonlocal: "'nonlocal' statements", ast.Delete: "'del' statements",
    ast.Import: "imports", ast.ImportFrom: "imports",
    ast.FunctionDef: "nested function definitions", ast.AsyncFunctionDef: "nested function definitions",
    ast.ClassDef: "class definitions", ast.Lambda: "lambda expressions inside the function",
    ast.ListComp: "list comprehensions", ast.SetComp: "set comprehensions",
    ast.DictComp: "dict comprehensions", ast.GeneratorExp: "generator expressions",
    ast.List: "list displays", ast.Tuple: "tuples", ast.Dict: "dict displays",
    ast.Set: "set displays", ast.JoinedStr: "f-strings", ast.NamedExpr: "':=' assignments",
    ast.Starred: "starred expressions", ast.Await: "'await'", ast.Yield: "'yield'",
    ast.YieldFrom: "'yield from'", ast.Slice: "slices",
}
if hasattr(ast, "Match"):
    _DESC[ast.Match] = "'match' statements"
if hasattr(ast, "TryStar"):
    _DESC[ast.TryStar] = "'try' statements"


def _desc(node):
    return _DESC.get(type(node), f"{type(node).__name__} nodes")


_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
           ast.Mod: "%", ast.Pow: "**", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
           ast.LShift: "<<", ast.RShift: ">>"}
_PYOPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
          "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "&": operator.and_,
          "|": operator.or_, "^": operator.xor, "<<": operator.lshift, ">>": operator.rshift,
          "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
          "==": operator.eq, "!=": operator.ne}
_CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}

_CASTS = {"float": "float", "double": "float", "half": "float", "bfloat16": "float",
          "int": "int", "long": "int", "short": "int", "bool": "bool"}

_FLEX_MODULE = "torch.nn.attention.flex_attention"


def _known_functions():
    """(object, op name, origin) for every function the subset knows."""
    out = [(builtins.abs, "abs", "py"), (builtins.min, "pymin", "py"),
           (builtins.max, "pymax", "py"), (builtins.float, "float", "py"),
           (builtins.int, "int", "py"), (builtins.bool, "bool", "py"),
           (builtins.pow, "pow", "py")]
    for n in ("exp", "tanh", "log", "sqrt", "floor", "pow"):
        out.append((getattr(math, n), n, "math"))
    out.append((math.fabs, "abs", "math"))
    torch = sys.modules.get("torch")
    if torch is not None:
        for n, op in (("where", "where"), ("abs", "abs"), ("exp", "exp"), ("tanh", "tanh"),
                      ("log", "log"), ("sqrt", "sqrt"), ("sigmoid", "sigmoid"),
                      ("clamp", "clamp"), ("clip", "clamp"), ("minimum", "minimum"),
                      ("maximum", "maximum"), ("floor", "floor"), ("sign", "sign"),
                      ("pow", "pow"), ("relu", "relu")):
            f = getattr(torch, n, None)
            if f is not None:
                out.append((f, op, "torch"))
        special = getattr(torch, "special", None)
        if special is not None and hasattr(special, "expit"):
            out.append((special.expit, "sigmoid", "torch"))
        F = getattr(getattr(torch, "nn", None), "functional", None)
        if F is not None and hasattr(F, "relu"):
            out.append((F.relu, "relu", "torch"))
    return out


def _torch_dtype_kind(torch, dt):
    if dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        return "float"
    if dt == torch.bool:
        return "bool"
    if dt in (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8):
        return "int"
    return None


def _tensor_array(obj):
    """(contiguous float32/int32/uint8 numpy copy, ctype, expression type)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.is_complex():
            raise TranslateError("complex captured tensors are not in the subset clattn translates")
        if t.dtype in (torch.float16, torch.bfloat16, torch.float64):
            t = t.float()
        try:
            arr = t.cpu().contiguous().numpy()
        except Exception as e:  # meta, sparse, ...
            raise TranslateError(f"captured tensor cannot be read on the host ({e})") from None
    else:
        arr = np.asarray(obj)
    dt = arr.dtype
    if dt == np.bool_:
        return np.array(arr, dtype=np.uint8, order="C"), "uchar", "bool"
    if dt == np.uint8:
        return np.array(arr, order="C"), "uchar", "int"
    if dt.kind == "f":
        return np.array(arr, dtype=np.float32, order="C"), "float", "float"
    if dt.kind in "iu":
        if arr.size and (arr.min() < -2**31 or arr.max() > 2**31 - 1):
            raise TranslateError(f"captured {dt} tensor holds values outside int32's range "
                                 f"({arr.min()}..{arr.max()})")
        return np.array(arr, dtype=np.int32, order="C"), "int", "int"
    raise TranslateError(f"captured tensors of dtype {dt} are not in the subset clattn translates")


# --------------------------------------------------------------------------- source lookup

_FILE_TREES = {}


def _file_tree(filename, text):
    key = (filename, hash(text))
    if key not in _FILE_TREES:
        try:
            _FILE_TREES[key] = ast.parse(text)
        except SyntaxError:
            _FILE_TREES[key] = None
    return _FILE_TREES[key]


def _lambda_node(fn, role):
    code = fn.__code__
    argnames = list(code.co_varnames[:code.co_argcount])
    lines = linecache.getlines(code.co_filename, fn.__globals__)
    candidates = []
    first = code.co_firstlineno
    offset = 0
    tree = _file_tree(code.co_filename, "".join(lines)) if lines else None
    if tree is None:
        try:
            src = textwrap.dedent(inspect.getsource(fn))
        except (OSError, TypeError):
            raise TranslateError(f"{role}: cannot read the source of {fn!r}; "
                                 "pass OpenCL C source as a str instead") from None
        for attempt in (src, "(" + src.strip() + ")", "(" + src.strip().rstrip(",)") + ")"):
            try:
                tree = ast.parse(attempt)
                break
            except SyntaxError:
                tree = None
        if tree is None:
            raise TranslateError(f"{role}: cannot parse the source line of {fn!r}")
        offset = first - 1
        first = 1
    for node in ast.walk(tree):
        if isinstance(node, ast.Lambda) and node.lineno == first:
            if [a.arg for a in node.args.args] == argnames:
                candidates.append(node)
    if not candidates:
        raise TranslateError(f"{role}: cannot find the lambda of {fn!r} in its source")
    if len(candidates) > 1:
        raise TranslateError(f"{role}: line {code.co_firstlineno} of {code.co_filename} holds "
                             f"several lambdas with these parameters; define the function with "
                             f"'def' or put each lambda on its own line")
    node = candidates[0]
    return node, code.co_filename, offset, node.lineno


def _function_node(fn, role):
    if not isinstance(fn, types.FunctionType):
        raise TranslateError(f"{role}: {fn!r} is not a Python function (nor OpenCL C source)")
    if fn.__name__ == "<lambda>":
        return _lambda_node(fn, role)
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise TranslateError(f"{role}: cannot read the source of {fn!r}; "
                             "pass OpenCL C source as a str instead") from None
    tree = ast.parse(src)
    node = tree.body[0]
    if isinstance(node, ast.AsyncFunctionDef):
        raise TranslateError(f"{role}: async functions are not in the subset clattn translates")
    if not isinstance(node, ast.FunctionDef):
        raise TranslateError(f"{role}: cannot find the definition of {fn!r} in its source")
    return node, fn.__code__.co_filename, fn.__code__.co_firstlineno - 1, node.lineno


def _assigned_names(stmts):
    out = set()
    for st in stmts:
        for node in ast.walk(st):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                out.add(node.id)
    return out


class _Frame:
    def __init__(self, fn, name, filename, offset, first, env, local_names):
        self.fn, self.name, self.filename = fn, name, filename
        self.offset, self.first = offset, first
        self.env, self.local_names = env, local_names
        self.lineno = first
        code = fn.__code__
        self.cells = dict(zip(code.co_freevars, fn.__closure__ or ()))


# --------------------------------------------------------------------------- translator

class _Translator:
    def __init__(self):
        self.aux = []          # Aux, in first-use order
        self.aux_info = {}     # id(obj) -> (obj, Aux, shape, value type)
        self.helpers = set()
        self.known = _known_functions()

    # ---- errors

    def fail(self, msg):
        frames = self.frames
        if not frames:
            raise TranslateError(msg)
        parts = [f"{f.name} line {f.lineno - f.first + 1}" for f in frames]
        where = ", in ".join(parts)
        f = frames[-1]
        raise TranslateError(f"{where}: {msg} ({f.filename}, line {f.lineno + f.offset})")

    def unsupported(self, node):
        self.fail(f"{_desc(node)} are not in the subset clattn translates")

    # ---- emission

    def tmp(self, t, code, d=None, nonneg=False):
        name = f"fx_{self.n}"
        self.n += 1
        self.lines.append(f"const {_ctype(t)} {name} = {code};")
        v = _V(name, t, nonneg=nonneg)
        if self.grad and d is not None and t == "float":
            v.d = self.dtmp(d)
        return v

    def dtmp(self, code):
        if code is None:
            return None
        name = f"fd_{self.n}"
        self.n += 1
        self.lines.append(f"const float {name} = {code};")
        return name

    def code(self, v):
        if not v.is_const:
            return v.c
        x = v.const
        if v.t == "float":
            return _float_lit(float(x))
        if v.t == "bool":
            return "1" if x else "0"
        if v.t == "int":
            x = int(x)
            if not -2**31 <= x < 2**31:
                self.fail(f"the integer {x} does not fit in int32")
            if x == -2**31:
                return "(-2147483647 - 1)"
            return str(x) if x >= 0 else f"({x})"
        self.fail(f"the string {x!r} used as a value")

    def cast(self, v, t):
        if v.t == t:
            return v
        if v.t == "str":
            self.fail(f"the string {v.const!r} used as a value")
        if v.is_const:
            return _const({"float": float, "int": int, "bool": bool}[t](v.const))
        c = v.c
        if t == "float":
            return _V(f"((float){c})", "float", nonneg=v.nonneg)
        if t == "int":
            if v.t == "bool":
                return _V(c, "int", nonneg=True)
            return _V(f"((int){c})", "int")
        return _V(f"({c} != {'0.0f' if v.t == 'float' else '0'})", "bool", nonneg=True)

    # ---- derivative helpers

    @staticmethod
    def dz(d):
        return d if d is not None else "0.0f"

    @staticmethod
    def dadd(a, b, sub=False):
        if a is None and b is None:
            return None
        if b is None:
            return a
        if a is None:
            return f"-{b}" if sub else b
        return f"{a} {'-' if sub else '+'} {b}"

    @staticmethod
    def dscale(coef, d):
        return None if d is None else f"({coef}) * {d}"

    # ---- values

    def need(self, x, what="value"):
        if isinstance(x, _V):
            if x.t == "str":
                self.fail(f"the string {x.const!r} used as a {what}")
            return x
        if isinstance(x, _Tensor):
            nd = len(x.info[2])
            if len(x.idx) == nd:
                return self.read(x)
            self.fail(f"captured tensor '{x.aux.name}' (shape {tuple(x.info[2])}) used as a "
                      f"{what} with {len(x.idx)} of its {nd} indices")
        if x is _NONE:
            self.fail(f"None used as a {what}")
        self.fail(f"{x.name} ({type(x.obj).__name__}) used as a {what}; "
                  "it is not in the subset clattn translates")

    def wrap(self, obj, name):
        if obj is None:
            return _NONE
        if isinstance(obj, (bool, int, float, str, np.bool_, np.integer, np.floating)):
            return _const(obj)
        if isinstance(obj, types.ModuleType):
            return _Sym("module", obj, name)
        torch = sys.modules.get("torch")
        if torch is not None:
            if isinstance(obj, torch.Tensor):
                return self.tensor(obj, name)
            if isinstance(obj, torch.dtype):
                kind = _torch_dtype_kind(torch, obj)
                if kind is None:
                    self.fail(f"dtype {obj} is not in the subset clattn translates")
                return _Sym("dtype", kind, name)
        if isinstance(obj, np.ndarray):
            return self.tensor(obj, name)
        for f, op, origin in self.known:
            if obj is f:
                return _Sym("known", (op, origin), name)
        if isinstance(obj, types.FunctionType):
            return _Sym("function", obj, name)
        return _Sym("opaque", obj, name)

    def tensor(self, obj, name):
        ent = self.aux_info.get(id(obj))
        if ent is None:
            try:
                arr, ctype, vt = _tensor_array(obj)
            except TranslateError as e:
                self.fail(f"'{name}': {e}")
            cname = re.sub(r"\W", "_", name) or "aux"
            if (cname[0].isdigit() or cname in _RESERVED or cname.startswith(("fx_", "fd_", "flex_", "__"))
                    or re.match(r"_[A-Z]", cname)):
                cname = "aux_" + cname
            used = {a.name for a in self.aux}
            base, k = cname, 2
            while cname in used:
                cname = f"{base}_{k}"
                k += 1
            aux = Aux(cname, arr, ctype, bool(getattr(obj, "requires_grad", False)))
            self.aux.append(aux)
            ent = (obj, aux, arr.shape, vt)
            self.aux_info[id(obj)] = ent
        return _Tensor(ent[1], ent, [])

    def read(self, tv):
        shape = tv.info[2]
        terms = []
        stride = 1
        strides = []
        for n in reversed(shape):
            strides.append(stride)
            stride *= n
        strides.reverse()
        const_off = 0
        for i, (v, n, s) in enumerate(zip(tv.idx, shape, strides)):
            if v.is_const:
                x = int(v.const)
                if not -n <= x < n:
                    self.fail(f"index {x} is out of range for dimension {i} of captured tensor "
                              f"'{tv.aux.name}' (size {n})")
                const_off += (x % n) * s
                continue
            c = v.c if v.nonneg else f"({v.c} < 0 ? {v.c} + {n} : {v.c})"
            terms.append(c if s == 1 else f"({c}) * {s}")
        if const_off or not terms:
            terms.append(str(const_off))
        return self.tmp(tv.info[3], f"{tv.aux.name}[{' + '.join(terms)}]")

    def lookup(self, name, frame):
        if name in frame.env:
            return frame.env[name]
        if name in frame.local_names:
            self.fail(f"local variable '{name}' is read before it is assigned")
        if name in frame.cells:
            try:
                obj = frame.cells[name].cell_contents
            except ValueError:
                self.fail(f"closure variable '{name}' is not bound yet")
            return self.wrap(obj, name)
        g = frame.fn.__globals__
        if name in g:
            return self.wrap(g[name], name)
        b = g.get("__builtins__", builtins)
        bd = b if isinstance(b, dict) else vars(b)
        if name in bd:
            return self.wrap(bd[name], name)
        self.fail(f"name '{name}' is not defined")

    # ---- expressions

    def eval(self, node, frame):
        if hasattr(node, "lineno"):
            frame.lineno = node.lineno
        if isinstance(node, ast.Constant):
            if node.value is None:
                return _NONE
            if isinstance(node.value, (bool, int, float, str)):
                return _const(node.value)
            self.fail(f"the constant {node.value!r} is not in the subset clattn translates")
        if isinstance(node, ast.Name):
            return self.lookup(node.id, frame)
        if isinstance(node, ast.BinOp):
            op = _BINOPS.get(type(node.op))
            if op is None:
                self.fail(f"the operator {type(node.op).__name__} is not in the subset clattn translates")
            a = self.need(self.eval(node.left, frame))
            b = self.need(self.eval(node.right, frame))
            frame.lineno = node.lineno
            return self.binop(op, a, b)
        if isinstance(node, ast.UnaryOp):
            return self.unary(node, self.eval(node.operand, frame), frame)
        if isinstance(node, ast.BoolOp):
            return self.boolop(node, frame)
        if isinstance(node, ast.Compare):
            return self.compare(node, frame)
        if isinstance(node, ast.IfExp):
            c = self.need(self.eval(node.test, frame), "condition")
            if c.is_const:
                return self.eval(node.body if c.const else node.orelse, frame)
            a = self.need(self.eval(node.body, frame))
            b = self.need(self.eval(node.orelse, frame))
            return self.where(self.cast(c, "bool"), a, b)
        if isinstance(node, ast.Attribute):
            return self.attribute(self.eval(node.value, frame), node.attr, frame)
        if isinstance(node, ast.Subscript):
            return self.subscript(node, frame)
        if isinstance(node, ast.Call):
            return self.call(node, frame)
        self.unsupported(node)

    def attribute(self, base, attr, frame):
        if isinstance(base, _Sym) and base.kind == "module":
            if not hasattr(base.obj, attr):
                self.fail(f"module '{base.obj.__name__}' has no attribute '{attr}'")
            return self.wrap(getattr(base.obj, attr), attr)
        if isinstance(base, _V) and attr == "dtype":
            return _Sym("dtype", base.t, "dtype")
        what = (f"captured tensor '{base.aux.name}'" if isinstance(base, _Tensor)
                else "a value" if isinstance(base, _V)
                else f"'{base.name}' ({type(base.obj).__name__})")
        self.fail(f"attribute access '.{attr}' on {what} is not in the subset clattn translates")

    def subscript(self, node, frame):
        base = self.eval(node.value, frame)
        if not isinstance(base, _Tensor):
            what = "a value" if isinstance(base, _V) else f"'{getattr(base, 'name', '?')}'"
            self.fail(f"indexing {what} is not in the subset clattn translates "
                      "(only captured tensors can be indexed)")
        sl = node.slice
        if sys.version_info < (3, 9) and isinstance(sl, ast.Index):  # pragma: no cover
            sl = sl.value
        items = sl.elts if isinstance(sl, ast.Tuple) else [sl]
        idx = list(base.idx)
        for it in items:
            if isinstance(it, ast.Slice):
                self.fail(f"slices of captured tensor '{base.aux.name}' are not in the subset "
                          "clattn translates")
            if isinstance(it, ast.Constant) and it.value is Ellipsis:
                self.fail("'...' indexing is not in the subset clattn translates")
            v = self.need(self.eval(it, frame), "index")
            if v.t == "bool":
                self.fail(f"boolean (mask) indexing of captured tensor '{base.aux.name}' is "
                          "not in the subset clattn translates")
            if v.t == "float":
                self.fail(f"captured tensor '{base.aux.name}' indexed with a float")
            idx.append(v)
        frame.lineno = node.lineno
        if len(idx) > len(base.info[2]):
            self.fail(f"captured tensor '{base.aux.name}' has {len(base.info[2])} dimensions "
                      f"but is indexed with {len(idx)} indices")
        return _Tensor(base.aux, base.info, idx)

    # ---- operators

    def fold(self, op, *vals):
        try:
            r = _PYOPS[op](*vals)
        except (ZeroDivisionError, OverflowError, ValueError, TypeError) as e:
            self.fail(f"evaluating constants: {e}")
        if isinstance(r, complex):
            self.fail("a constant expression gives a complex number")
        return _const(r)

    def binop(self, op, a, b):
        if a.t == "str" or b.t == "str":
            self.fail("strings in arithmetic are not in the subset clattn translates")
        if a.is_const and b.is_const:
            return self.fold(op, a.const, b.const)
        if op in ("&", "|", "^"):
            if a.t == "float" or b.t == "float":
                self.fail(f"'{op}' on float values is not in the subset clattn translates")
            if op in ("&", "|") and a.t == "bool" and b.t == "bool":
                k, x = (a, b) if a.is_const else (b, a) if b.is_const else (None, None)
                if k is not None:  # True & x, False | x: x; False & x, True | x: the constant
                    return x if bool(k.const) == (op == "&") else k
            t = _promote(a.t, b.t)
            a, b = self.cast(a, t), self.cast(b, t)
            return self.tmp(t, f"{self.code(a)} {op} {self.code(b)}", nonneg=t == "bool")
        if op in ("<<", ">>"):
            if a.t == "float" or b.t == "float":
                self.fail(f"'{op}' on float values is not in the subset clattn translates")
            a, b = self.cast(a, "int"), self.cast(b, "int")
            return self.tmp("int", f"{self.code(a)} {op} {self.code(b)}")
        if a.t == "bool" and b.t == "bool" and op in ("+", "*", "-"):
            if op == "-":
                self.fail("'-' on two booleans is not supported by torch")
            return self.tmp("bool", f"{self.code(a)} {'|' if op == '+' else '&'} {self.code(b)}",
                            nonneg=True)
        if op == "**":
            return self.power(a, b)
        if op == "/":
            t = "float"
        else:
            t = _promote(a.t, b.t, "int")
        a, b = self.cast(a, t), self.cast(b, t)
        A, B = self.code(a), self.code(b)
        if op in ("+", "-"):
            return self.tmp(t, f"{A} {op} {B}", self.dadd(a.d, b.d, sub=op == "-"),
                            nonneg=op == "+" and a.nonneg and b.nonneg)
        if op == "*":
            d = self.dadd(self.dscale(B, a.d), self.dscale(A, b.d))
            return self.tmp(t, f"{A} * {B}", d, nonneg=a.nonneg and b.nonneg)
        if op == "/":
            r = self.tmp("float", f"{A} / {B}")
            if self.grad and (a.d or b.d):
                r.d = self.dtmp(f"({self.dadd(a.d, self.dscale(r.c, b.d), sub=True)}) / {B}")
            return r
        if op == "//":
            if t == "int":
                self.helpers.add("flex_floordiv_i")
                return self.tmp("int", f"flex_floordiv_i({A}, {B})")
            self.helpers.add("flex_floordiv_f")
            return self.tmp("float", f"flex_floordiv_f({A}, {B})")
        if op == "%":
            if t == "int":
                self.helpers.add("flex_mod_i")
                return self.tmp("int", f"flex_mod_i({A}, {B})")
            self.helpers.add("flex_mod_f")
            d = self.dadd(a.d, self.dscale(f"floor({A} / {B})", b.d), sub=True)
            return self.tmp("float", f"flex_mod_f({A}, {B})", d)
        raise AssertionError(op)

    def power(self, a, b):
        if b.is_const and b.t in ("int", "bool"):
            e = int(b.const)
            if a.t in ("int", "bool"):
                if e < 0:
                    self.fail("integers to negative integer powers are not allowed (torch)")
                a = self.cast(a, "int")
                if e > 8:
                    self.helpers.add("flex_ipow")
                    return self.tmp("int", f"flex_ipow({self.code(a)}, {e})")
                t = "int"
            else:
                t = "float"
            if e == 0:
                return _const(1 if t == "int" else 1.0)
            if abs(e) <= 8:
                A = self.code(a)
                r = self.tmp(t, " * ".join([A] * abs(e)))
                if self.grad and a.d:
                    pm1 = " * ".join([A] * (abs(e) - 1)) or "1.0f"
                    r.d = self.dtmp(f"{float(abs(e))}f * {pm1} * {a.d}")
                if e < 0:
                    inv = self.tmp("float", f"1.0f / {r.c}")
                    if self.grad and r.d:
                        inv.d = self.dtmp(f"-{r.d} * {inv.c} * {inv.c}")
                    return inv
                return r
        if a.t != "float" and b.t != "float":
            a, b = self.cast(a, "int"), self.cast(b, "int")
            self.helpers.add("flex_ipow")
            return self.tmp("int", f"flex_ipow({self.code(a)}, {self.code(b)})")
        a, b = self.cast(a, "float"), self.cast(b, "float")
        A, B = self.code(a), self.code(b)
        r = self.tmp("float", f"pow({A}, {B})")
        if self.grad and (a.d or b.d):
            da = self.dscale(f"{B} * pow({A}, {B} - 1.0f)", a.d)
            db = self.dscale(f"({A} == 0.0f && {B} >= 0.0f) ? 0.0f : {r.c} * log({A})", b.d)
            r.d = self.dtmp(self.dadd(da, db))
        return r

    def unary(self, node, x, frame):
        x = self.need(x)
        frame.lineno = node.lineno
        if x.t == "str":
            self.fail("strings in arithmetic are not in the subset clattn translates")
        if isinstance(node.op, ast.Not):
            if x.is_const:
                return _const(not x.const)
            return self.tmp("bool", f"!{self.code(self.cast(x, 'bool'))}", nonneg=True)
        if x.is_const:
            return _const({ast.USub: operator.neg, ast.UAdd: operator.pos,
                           ast.Invert: operator.invert}[type(node.op)](x.const))
        if isinstance(node.op, ast.UAdd):
            return x
        if isinstance(node.op, ast.USub):
            if x.t == "bool":
                self.fail("negation '-' of a boolean is not supported by torch; use '~' or 'not'")
            return self.tmp(x.t, f"-{x.c}", None if x.d is None else f"-{x.d}")
        if x.t == "float":
            self.fail("'~' on a float value is not in the subset clattn translates")
        if x.t == "bool":
            return self.tmp("bool", f"!{x.c}", nonneg=True)
        return self.tmp("int", f"~{x.c}")

    def boolop(self, node, frame):
        is_and = isinstance(node.op, ast.And)
        dyn, last = [], None
        for sub in node.values:
            v = self.need(self.eval(sub, frame))
            if v.is_const:
                truthy = bool(v.const)
                if is_and != truthy:  # a deciding constant: False for 'and', True for 'or'
                    return v if not dyn else _const(not is_and)
                last = v
                continue
            if v.t != "bool":
                frame.lineno = node.lineno
                self.fail(f"'{'and' if is_and else 'or'}' on a non-boolean {v.t} value is not in "
                          "the subset clattn translates (compare explicitly, or use & / |)")
            dyn.append(v)
        if not dyn:
            return last
        if len(dyn) == 1:
            return dyn[0]
        return self.tmp("bool", f" {'&&' if is_and else '||'} ".join(v.c for v in dyn),
                        nonneg=True)

    def compare(self, node, frame):
        left = self.eval(node.left, frame)
        parts = []
        const_result = True
        for op, rnode in zip(node.ops, node.comparators):
            if not isinstance(op, (ast.Is, ast.IsNot)) and type(op) not in _CMPOPS:
                self.fail(f"the comparison {type(op).__name__} is not in the subset clattn translates")
            right = self.eval(rnode, frame)
            frame.lineno = node.lineno
            if isinstance(op, (ast.Is, ast.IsNot)):
                if left is _NONE or right is _NONE:
                    same = left is right
                    r = same if isinstance(op, ast.Is) else not same
                    if not r:
                        return _const(False)
                    left = right
                    continue
                self.fail("'is' comparisons are only translated against None")
            sym = _CMPOPS.get(type(op))
            if sym is None:
                self.fail(f"the comparison {type(op).__name__} is not in the subset clattn translates")
            a, b = self.need(left), self.need(right)
            if a.t == "str" or b.t == "str":
                self.fail("comparing strings is not in the subset clattn translates")
            if a.is_const and b.is_const:
                if not _PYOPS[sym](a.const, b.const):
                    return _const(False)
            else:
                t = _promote(a.t, b.t)
                ca, cb = self.cast(a, t), self.cast(b, t)
                parts.append(f"({self.code(ca)} {sym} {self.code(cb)})")
                const_result = False
            left = right
        if const_result:
            return _const(True)
        return self.tmp("bool", " && ".join(parts), nonneg=True)

    def where(self, c, a, b):
        if c.is_const:
            return a if c.const else b
        t = _promote(a.t, b.t)
        a, b = self.cast(a, t), self.cast(b, t)
        d = None
        if a.d or b.d:
            d = f"{c.c} ? {self.dz(a.d)} : {self.dz(b.d)}"
        return self.tmp(t, f"{c.c} ? {self.code(a)} : {self.code(b)}", d,
                        nonneg=a.nonneg and b.nonneg)

    # ---- calls

    def call(self, node, frame):
        f = node.func
        if isinstance(f, ast.Attribute):
            base = self.eval(f.value, frame)
            if isinstance(base, (_V, _Tensor)):
                if isinstance(base, _Tensor) and len(base.idx) < len(base.info[2]):
                    self.fail(f"method '.{f.attr}()' of captured tensor '{base.aux.name}' is not "
                              "in the subset clattn translates")
                return self.method(self.need(base), f.attr, node, frame)
            fobj = self.attribute(base, f.attr, frame)
        else:
            fobj = self.eval(f, frame)
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                self.unsupported(a)
            args.append(self.eval(a, frame))
        kwargs = {}
        for k in node.keywords:
            if k.arg is None:
                self.fail("'**' arguments are not in the subset clattn translates")
            kwargs[k.arg] = self.eval(k.value, frame)
        frame.lineno = node.lineno
        if isinstance(fobj, _Sym) and fobj.kind == "known":
            return self.known_call(fobj.obj[0], fobj.obj[1], fobj.name, args, kwargs)
        if isinstance(fobj, _Sym) and fobj.kind == "function":
            return self.inline(fobj.obj, args, kwargs, fobj.name)
        name = getattr(fobj, "name", "?")
        self.fail(f"calling '{name}' is not in the subset clattn translates")

    def method(self, x, attr, node, frame):
        if attr not in _CASTS and attr not in ("to", "type"):
            self.fail(f"tensor method '.{attr}()' is not in the subset clattn translates (only "
                      "the casts .float(), .int(), .long(), .bool(), .to(dtype))")
        args = [self.eval(a, frame) for a in node.args]
        kwargs = {k.arg: self.eval(k.value, frame) for k in node.keywords}
        frame.lineno = node.lineno
        if attr in _CASTS and not args and not kwargs:
            return self.cast(x, _CASTS[attr])
        if attr in ("to", "type"):
            dt = args[0] if len(args) == 1 and not kwargs else kwargs.get("dtype")
            if isinstance(dt, _Sym) and dt.kind == "dtype" and len(args) + len(kwargs) == 1:
                return self.cast(x, dt.obj)
            self.fail(f"'.{attr}()' is translated only with a single dtype argument")
        self.fail(f"tensor method '.{attr}()' is not in the subset clattn translates (only the "
                  "casts .float(), .int(), .long(), .bool(), .to(dtype))")

    def args(self, name, args, kwargs, names, required):
        if len(args) > len(names):
            self.fail(f"{name}() takes at most {len(names)} arguments here, got {len(args)}")
        out = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names or k in out:
                self.fail(f"{name}() got an unexpected or repeated argument '{k}'")
            out[k] = v
        for k in names[:required]:
            if k not in out:
                self.fail(f"{name}() needs the argument '{k}'")
        return [out.get(k, _NONE) for k in names]

    def known_call(self, op, origin, name, args, kwargs):
        if op in ("pymin", "pymax"):
            if kwargs or len(args) < 2:
                self.fail(f"{name}() is translated only with two or more positional arguments")
            vals = [self.need(a) for a in args]
            r = vals[0]
            for v in vals[1:]:
                r = self.pyminmax(op == "pymin", r, v)
            return r
        if op in ("float", "int", "bool"):
            (x,) = self.args(name, args, kwargs, ["x"], 1)
            if not (isinstance(x, _V) and x.t == "str"):
                x = self.need(x)
            if x.is_const:
                try:
                    return _const({"float": float, "int": int, "bool": bool}[op](x.const))
                except ValueError as e:
                    self.fail(f"{name}(): {e}")
            return self.cast(x, op)
        if op == "pow":
            a, b = self.args(name, args, kwargs, ["input", "exponent"], 2)
            return self.binop("**", self.need(a), self.need(b))
        if op == "where":
            c, a, b = self.args(name, args, kwargs, ["condition", "input", "other"], 3)
            c = self.need(c, "condition")
            if c.t != "bool":
                self.fail("torch.where's condition must be a boolean")
            return self.where(c, self.need(a), self.need(b))
        if op == "clamp":
            x, lo, hi = self.args(name, args, kwargs, ["input", "min", "max"], 1)
            x = self.need(x)
            bounds = [None if v is _NONE else self.need(v) for v in (lo, hi)]
            if bounds == [None, None]:
                self.fail("torch.clamp needs min or max")
            t = _promote(x.t, *[v.t for v in bounds if v is not None])
            x = self.cast(x, t)
            for v, sym in zip(bounds, ("<", ">")):
                if v is None:
                    continue
                v = self.cast(v, t)
                if x.is_const and v.is_const:
                    x = v if _PYOPS[sym](x.const, v.const) else x
                    continue
                X, Vc = self.code(x), self.code(v)
                d = None
                if x.d or v.d:  # torch: the gradient passes only strictly inside the bounds
                    d = f"({X} {sym}= {Vc}) ? {self.dz(v.d)} : {self.dz(x.d)}"
                x = self.tmp(t, f"({X} {sym} {Vc}) ? {Vc} : {X}", d)
            return x
        if op in ("minimum", "maximum"):
            a, b = self.args(name, args, kwargs, ["input", "other"], 2)
            a, b = self.need(a), self.need(b)
            if a.is_const and b.is_const:
                return _const((min if op == "minimum" else max)(a.const, b.const))
            t = _promote(a.t, b.t)
            a, b = self.cast(a, t), self.cast(b, t)
            A, B = self.code(a), self.code(b)
            sym = "<" if op == "minimum" else ">"
            nan = f" || {A} != {A}" if t == "float" else ""
            d = None
            if a.d or b.d:
                da, db = self.dz(a.d), self.dz(b.d)
                d = f"({A} {sym} {B}) ? {da} : (({B} {sym} {A}) ? {db} : 0.5f * ({da} + {db}))"
            return self.tmp(t, f"({A} {sym} {B}{nan}) ? {A} : {B}", d)
        # one-argument functions
        (x,) = self.args(name, args, kwargs, ["input"], 1)
        x = self.need(x)
        if x.is_const:
            return self.fold1(op, origin, name, x.const)
        if op == "abs":
            if x.t == "float":
                return self.tmp("float", f"fabs({x.c})", self.dscale(self.sign_code(x.c), x.d),
                                nonneg=True)
            x = self.cast(x, "int")
            return self.tmp("int", f"(int)abs({x.c})", nonneg=True)
        if op in ("floor", "sign", "relu") and x.t != "float":
            x = self.cast(x, "int") if x.t == "bool" and op != "floor" else x
            if op == "floor":
                return x
            if op == "sign":
                return self.tmp("int", f"({x.c} > 0) - ({x.c} < 0)")
            return self.tmp("int", f"({x.c} < 0) ? 0 : {x.c}", nonneg=True)
        if op == "floor":
            return self.tmp("float", f"floor({x.c})")
        if op == "sign":
            return self.tmp("float", self.sign_code(x.c))
        if op == "relu":
            r = self.tmp("float", f"({x.c} < 0.0f) ? 0.0f : {x.c}")
            if self.grad and x.d:
                r.d = self.dtmp(f"({r.c} > 0.0f) ? {x.d} : 0.0f")
            return r
        x = self.cast(x, "float")
        X = self.code(x)
        if op == "sigmoid":
            r = self.tmp("float", f"1.0f / (1.0f + exp(-{X}))")
        else:
            r = self.tmp("float", f"{op}({X})")
        if self.grad and x.d:
            R = r.c
            local = {"exp": R, "tanh": f"1.0f - {R} * {R}", "log": f"1.0f / {X}",
                     "sqrt": f"0.5f / {R}", "sigmoid": f"{R} * (1.0f - {R})"}[op]
            r.d = self.dtmp(f"({local}) * {x.d}")
        return r

    @staticmethod
    def sign_code(c):
        return f"((float)({c} > 0.0f) - (float)({c} < 0.0f))"

    def fold1(self, op, origin, name, v):
        if isinstance(v, str):
            self.fail(f"{name}() of a string")
        if origin in ("py", "math"):
            fn = {"abs": abs, "exp": math.exp, "tanh": math.tanh, "log": math.log,
                  "sqrt": math.sqrt, "floor": math.floor}.get(op)
            if origin == "math" and op == "abs":
                fn = math.fabs
            if fn is not None:
                try:
                    return _const(fn(v))
                except (ValueError, OverflowError) as e:
                    self.fail(f"{name}({v!r}): {e}")
        with np.errstate(all="ignore"):
            x = np.float64(v)
            r = {"abs": np.abs, "exp": np.exp, "tanh": np.tanh, "log": np.log, "sqrt": np.sqrt,
                 "floor": np.floor, "sign": np.sign, "relu": lambda y: max(y, 0.0) if y == y else y,
                 "sigmoid": lambda y: 1.0 / (1.0 + np.exp(-y))}[op](x)
        if isinstance(v, (bool, int)) and op in ("abs", "floor", "sign", "relu"):
            return _const(int(r))
        return _const(float(r))

    def pyminmax(self, is_min, a, b):
        # Python's min(a, b): b if b < a else a; max(a, b): b if b > a else a
        if a.is_const and b.is_const:
            return _const(min(a.const, b.const) if is_min else max(a.const, b.const))
        t = _promote(a.t, b.t)
        ca, cb = self.cast(a, t), self.cast(b, t)
        A, B = self.code(ca), self.code(cb)
        cond = f"({B} {'<' if is_min else '>'} {A})"
        d = None
        if ca.d or cb.d:
            d = f"{cond} ? {self.dz(cb.d)} : {self.dz(ca.d)}"
        return self.tmp(t, f"{cond} ? {B} : {A}", d)

    # ---- functions

    def inline(self, fn, args, kwargs, name):
        if getattr(fn, "__module__", None) == _FLEX_MODULE:
            code = fn.__code__
            if code.co_name in ("and_mask", "or_mask") and "mask_mods" in code.co_freevars:
                cell = fn.__closure__[code.co_freevars.index("mask_mods")]
                is_and = code.co_name == "and_mask"
                result = _const(is_and)
                for m in cell.cell_contents:
                    if not isinstance(m, types.FunctionType):
                        self.fail(f"{code.co_name} holds {m!r}, which is not a Python function")
                    r = self.need(self.inline(m, args, kwargs, getattr(m, "__name__", "mask")))
                    result = self.binop("&" if is_and else "|", result, self.cast(r, "bool")
                                        if r.t == "float" else r)
                return result
            if code.co_name == "noop_mask":
                return _const(True)
        if len(self.frames) > 32:
            self.fail(f"calls nest too deep (recursion?) at '{name}'")
        node, filename, offset, first = self.parse(fn, name)
        a = node.args
        if a.vararg or a.kwarg or a.kwonlyargs or getattr(a, "posonlyargs", []):
            self.fail(f"'{name}' has *args, **kwargs, keyword-only or positional-only "
                      "parameters, which are not in the subset clattn translates")
        params = [p.arg for p in a.args]
        if len(args) > len(params):
            self.fail(f"'{name}' takes {len(params)} parameters, called with {len(args)}")
        env = dict(zip(params, args))
        for k, v in kwargs.items():
            if k not in params or k in env:
                self.fail(f"'{name}' got an unexpected or repeated argument '{k}'")
            env[k] = v
        defaults = fn.__defaults__ or ()
        for p, dv in zip(params[len(params) - len(defaults):], defaults):
            if p not in env:
                env[p] = self.wrap(dv, p)
        missing = [p for p in params if p not in env]
        if missing:
            self.fail(f"'{name}' takes {len(params)} parameters, called with {len(args)} "
                      f"(missing {', '.join(missing)})")
        body = ([ast.Return(value=node.body, lineno=node.body.lineno, col_offset=0)]
                if isinstance(node, ast.Lambda) else node.body)
        frame = _Frame(fn, name, filename, offset, first, env,
                       _assigned_names(body) - set(params))
        self.frames.append(frame)
        r = self.block(body, frame)
        self.frames.pop()
        return r

    def parse(self, fn, name):
        role = ", in ".join([f"{f.name} line {f.lineno - f.first + 1}" for f in self.frames]
                            + [name])
        return _function_node(fn, role)

    def block(self, stmts, frame):
        env = frame.env
        for i, st in enumerate(stmts):
            frame.lineno = st.lineno
            if isinstance(st, ast.Return):
                if st.value is None:
                    self.fail("'return' without a value")
                return self.eval(st.value, frame)
            if isinstance(st, ast.If):
                c = self.need(self.eval(st.test, frame), "condition")
                rest = stmts[i + 1:]
                if c.is_const:
                    return self.block((st.body if c.const else st.orelse) + rest, frame)
                return self.branch(self.cast(c, "bool"), st.body + rest, st.orelse + rest, frame)
            if isinstance(st, (ast.Assign, ast.AnnAssign)):
                if st.value is None:
                    continue
                targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                value = _NC
                for tg in targets:
                    if isinstance(tg, ast.Name):
                        if value is _NC:
                            value = self.eval(st.value, frame)
                        env[tg.id] = value
                    elif isinstance(tg, (ast.Tuple, ast.List)) and isinstance(st.value, (ast.Tuple, ast.List)) \
                            and len(tg.elts) == len(st.value.elts) \
                            and all(isinstance(e, ast.Name) for e in tg.elts):
                        vals = [self.eval(e, frame) for e in st.value.elts]
                        for e, v in zip(tg.elts, vals):
                            env[e.id] = v
                    elif isinstance(tg, (ast.Tuple, ast.List)):
                        self.fail("unpacking assignments are translated only from a tuple of "
                                  "the same length")
                    else:
                        self.fail(f"assignments to {type(tg).__name__.lower()}s are not in the "
                                  "subset clattn translates")
                continue
            if isinstance(st, ast.AugAssign):
                if not isinstance(st.target, ast.Name):
                    self.fail("augmented assignments to anything but a name are not in the "
                              "subset clattn translates")
                op = _BINOPS.get(type(st.op))
                cur = self.need(self.lookup(st.target.id, frame))
                val = self.need(self.eval(st.value, frame))
                frame.lineno = st.lineno
                env[st.target.id] = self.binop(op, cur, val)
                continue
            if isinstance(st, ast.Pass):
                continue
            if isinstance(st, ast.Expr):
                if isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
                    continue  # docstring
                self.fail("expression statements (calls for their side effects) are not in "
                          "the subset clattn translates")
            self.unsupported(st)
        self.fail("the function ends without a 'return'")

    def branch(self, c, body, orelse, frame):
        saved, saved_env = self.lines, frame.env
        results = []
        for stmts in (body, orelse):
            self.lines = []
            frame.env = dict(saved_env)
            r = self.need(self.block(stmts, frame), "return value")
            results.append((r, self.lines))
        frame.env = saved_env
        t = _promote(results[0][0].t, results[1][0].t)
        name = f"fx_{self.n}"
        self.n += 1
        use_d = self.grad and t == "float" and any(r.d for r, _ in results)
        dname = f"fd_{name[3:]}" if use_d else None
        out = [f"{_ctype(t)} {name};"]
        if use_d:
            out.append(f"float {dname};")
        for k, (r, lines) in enumerate(results):
            self.lines = lines
            r = self.cast(r, t)
            lines.append(f"{name} = {self.code(r)};")
            if use_d:
                lines.append(f"{dname} = {self.dz(r.d)};")
            out.append(f"if ({c.c}) {{" if k == 0 else "} else {")
            out.extend("    " + ln for ln in lines)
        out.append("}")
        self.lines = saved
        self.lines.extend(out)
        return _V(name, t, d=dname)

    def function(self, fn, role, grad):
        self.grad = grad
        self.n = 0
        self.lines = []
        nparams = 5 if role == "score_mod" else 4
        names = ["score", "b", "h", "q_idx", "kv_idx"][5 - nparams:]
        params = []
        for n in names:
            if n == "score":
                params.append(_V("score", "float", d="1.0f" if grad else None))
            else:
                params.append(_V(n, "int", nonneg=True))
        self.frames = []
        code = getattr(fn, "__code__", None)
        if (isinstance(fn, types.FunctionType) and getattr(fn, "__module__", None) != _FLEX_MODULE
                and code is not None and code.co_argcount != nparams):
            sig = ", ".join(names)
            raise TranslateError(f"{role}: takes {nparams} parameters ({sig}); "
                                 f"{fn.__name__} takes {code.co_argcount}")
        try:
            r = self.inline(fn, params, {}, role)
        finally:
            self.frames = []
        r = self.need(r, "return value") if isinstance(r, (_V, _Tensor)) else r
        if not isinstance(r, _V):
            raise TranslateError(f"{role}: returns {getattr(r, 'name', r)!r}, not a value")
        body = self.lines
        if role == "score_mod" and not grad:
            ret, sig, rname = self.code(self.cast(r, "float")), "float", "score_mod"
        elif role == "score_mod":
            ret, sig, rname = self.dz(self.cast(r, "float").d), "float", "score_mod_grad"
        else:
            ret, sig, rname = self.code(self.cast(r, "bool")), "int", "mask_mod"
        params_c = ", ".join(("float " if n == "score" else "int ") + n for n in names)
        lines = [f"{sig} {rname}({params_c})", "{"]
        lines += ["    " + ln for ln in body]
        lines += [f"    return {ret};", "}", ""]
        return "\n".join(lines)


def translate(score_mod=None, mask_mod=None, *, want_grad=True):
    """OpenCL C source defining score_mod, mask_mod and (score_mod given, want_grad)
    score_mod_grad, and the list of Aux tensors it reads. Either function may instead be
    OpenCL C source (a str): it is passed through, after `#line 1` (a compiler's messages
    number its own lines). Raises TranslateError for anything outside
    the subset (see the module's docstring)."""
    tr = _Translator()
    fns, passthrough = [], []
    for role, fn in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if fn is None:
            continue
        if isinstance(fn, str):
            passthrough.append(fn)
            continue
        if not callable(fn):
            raise TranslateError(f"{role} must be a Python function or OpenCL C source, "
                                 f"not {type(fn).__name__}")
        fns.append(tr.function(fn, role, grad=False))
        if role == "score_mod" and want_grad:
            fns.append(tr.function(fn, role, grad=True))
    parts = ["/* generated by clattn.flex_translate */\n"]
    parts += [_HELPERS[h] for h in _HELPERS if h in tr.helpers]
    parts += ["#line 1\n" + p for p in passthrough]  # build errors: each source's own lines
    parts += fns
    return "\n".join(p if p.endswith("\n") else p + "\n" for p in parts), list(tr.aux)
