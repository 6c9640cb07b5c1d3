#!/usr/bin/env python3
"""No function a reader must scroll: lists every function longer than a limit (default 150 lines)
in the C, OpenCL and Python sources outside tests/, and exits 1 if there is one.

    python3 tests/func_length.py [ROOT] [--limit N] [--all]

C and OpenCL C (.c, .h, .cl): a function is a brace block at file level whose opening brace follows
a closing parenthesis (after comments, strings and preprocessor lines are blanked); its length is
the lines from the line of its name to its closing brace. Python: every def (nested ones too), by
the ast's line numbers. --all prints every function's length, longest first (for planning)."""
import ast
import os
import re
import sys

SKIP_DIRS = {".git", "build", "tests", "third_party", "__pycache__", ".gpu"}
C_EXT = (".c", ".h", ".cl")


def blank_c(text):
    """Comments, string and char literals and preprocessor lines become spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#" or (line_start and c in " \t" and
                                       text[i:].lstrip(" \t").startswith("#")):
            # a preprocessor line, with its continuations
            j = i
            while j < n:
                if text[j] == "\n" and text[j - 1] != "\\":
                    break
                j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            line_start = False
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (j + 1 - i))
            i = j + 1
            line_start = False
            continue
        out.append(c)
        line_start = c == "\n"
        i += 1
    return "".join(out)


def c_functions(path):
    text = blank_c(open(path, encoding="utf-8", errors="replace").read())
    found = []
    depth = 0
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            if depth == 0:
                before = text[:m.start()].rstrip()
                if before.endswith(")"):
                    # the function's name: the identifier before the parameter list's '('
                    k, par = len(before) - 1, 0
                    while k >= 0:
                        if before[k] == ")":
                            par += 1
                        elif before[k] == "(":
                            par -= 1
                            if par == 0:
                                break
                        k -= 1
                    name_m = re.search(r"(\w+)\s*$", before[:k])
                    name = name_m.group(1) if name_m else "?"
                    start_line = before[:k].count("\n") + 1
                    found.append([name, start_line, m.start()])
                else:
                    found.append(None)
            depth += 1
        else:
            depth -= 1
            if depth == 0 and found and found[-1] is not None and len(found[-1]) == 3:
                end_line = text[:m.start()].count("\n") + 1
                found[-1] = (found[-1][0], found[-1][1], end_line)
    return [(f[0], f[1], f[2]) for f in found if f is not None and len(f) == 3 and
            isinstance(f[2], int) and f[2] >= f[1] and not isinstance(f, list)]


def py_functions(path):
    try:
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out.append((node.name, first, node.end_lineno))
    return out


def main(argv):
    root, limit, show_all = ".", 150, False
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--limit":
            limit = int(args.pop(0))
        elif a == "--all":
            show_all = True
        else:
            root = a
    rows = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith("build"))
        for f in sorted(files):
            p = os.path.join(d, f)
            if f.endswith(C_EXT):
                funcs = c_functions(p)
            elif f.endswith(".py"):
                funcs = py_functions(p)
            else:
                continue
            for name, a, b in funcs:
                rows.append((b - a + 1, os.path.relpath(p, root), a, name))
    rows.sort(reverse=True)
    long_ = [r for r in rows if r[0] > limit]
    for n, p, a, name in (rows if show_all else long_):
        print(f"{n:5d}  {p}:{a}  {name}")
    if long_:
        print(f"func_length: {len(long_)} function(s) over {limit} lines", file=sys.stderr)
        return 1
    print(f"func_length: {len(rows)} functions, none over {limit} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
