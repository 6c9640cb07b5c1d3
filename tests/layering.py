#!/usr/bin/env python3
"""The structure rules of issue 26 as a test (ctest entry `layering`):

1. No two files of host/ include or call each other in a loop: a file-level graph of
   `#include "..."` edges and calls of non-static clattn_ functions (a call edge goes from the
   calling file to the defining one) has no cycle.
2. No __kernel in kernels/ or host/mpi/ takes more than 16 parameters (each kernel family
   takes its buffers plus one struct from kernels/params.h).
3. (issue 49) No circle anywhere in the tree: no `#include "..."` loop among the C, header and
   OpenCL files of any folder, and no import loop among the Python package's modules
   (python/clattn; an import inside a function counts: a lazy import is still a circle).
4. (issue 49) No file outside host/ includes a header of host/: tools, tests, bench and
   examples use the installed public headers (include/) and their own.

Prints what it checked and each violation; exit status 1 on a violation.
    tests/layering.py [REPO_ROOT]
"""
import collections
import glob
import os
import re
import sys

MAX_KERNEL_PARAMS = 16



def host_graph(root):
    files = sorted(glob.glob(os.path.join(root, "host", "**", "*.[ch]"), recursive=True))
    defined = {}
    for path in files:
        if path.endswith(".c"):
            text = open(path, encoding="utf-8").read()
            for m in re.finditer(r"^(?!static)[a-z][\w \*]*?\b(clattn_\w+)\s*\(", text, re.M):
                defined.setdefault(m.group(1), path)
    search = [os.path.join(root, d) for d in ("host", "host/ops", "host/attn", "include")]
    graph = collections.defaultdict(set)
    for path in files:
        text = open(path, encoding="utf-8").read()
        if path.endswith(".c"):
            for name, where in defined.items():
                if where != path and re.search(r"\b" + name + r"\s*\(", text):
                    graph[path].add(where)
        for m in re.finditer(r'#include "([^"]+)"', text):
            for base in [os.path.dirname(path)] + search:
                candidate = os.path.normpath(os.path.join(base, m.group(1)))
                if os.path.exists(candidate):
                    graph[path].add(candidate)
                    break
    return files, graph


def cycles(graph):
    """Strongly connected components of more than one file (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in list(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for succ in edges:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def list_macros(root):
    """Parameter-list macros (a #define whose body declares __global or const parameters) of
    the files prepended to every kernel, by the parameters they hold, nested ones expanded."""
    bodies = {}
    for name in ("score.cl", "params.h", "common.cl", "types.cl"):
        path = os.path.join(root, "kernels", name)
        if not os.path.exists(path):
            continue
        text = open(path, encoding="utf-8").read()
        text = text.replace("\\\n", " ")
        for m in re.finditer(r"^#define (\w+) (.*)$", text, re.M):
            body = m.group(2).strip()
            if "__global" in body or body.startswith("const "):
                bodies[m.group(1)] = [p.strip() for p in body.split(",") if p.strip()]
    counts = {}

    def count(name, depth=0):
        if name not in counts:
            counts[name] = sum(count(p, depth + 1) if p in bodies and depth < 8 else 1
                               for p in bodies[name])
        return counts[name]

    for name in bodies:
        count(name)
    return counts


def kernel_params(root):
    """(file, kernel, parameter count) of every __kernel, macros in signatures expanded by hand
    (list_macros: SCORE_BUFFERS is two buffers, FLASH_KERNEL_PARAMS eleven)."""
    macros = list_macros(root)
    result = []
    for path in sorted(glob.glob(os.path.join(root, "kernels", "*.cl")) +
                       glob.glob(os.path.join(root, "host", "mpi", "*.cl"))):
        text = open(path, encoding="utf-8").read()
        pattern = r"__kernel\s+(?:__attribute__\s*\(\(.*?\)\)\s*)*void\s+(\w+)\s*\(([^{]*?)\)\s*\{"
        for m in re.finditer(pattern, text, re.S):
            params = [p.strip() for p in m.group(2).split(",") if p.strip()]
            count = sum(macros.get(p, 1) for p in params)
            result.append((os.path.relpath(path, root), m.group(1), count))
    return result


SKIP_DIRS = {".git", "__pycache__", ".gpu"}


def tree_files(root, exts):
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith("build")
                         and not x.startswith("venv"))
        out += [os.path.join(d, f) for f in sorted(files) if f.endswith(exts)]
    return out


def include_graph(root):
    """`#include "..."` edges among every C, header and OpenCL file of the tree (resolved
    against the including file's folder, then include/, host/, host/ops and host/attn, the
    library's include path), and the files outside host/ that include one of host/."""
    files = tree_files(root, (".c", ".h", ".cl"))
    search = [os.path.join(root, d) for d in ("include", "host", "host/ops", "host/attn")]
    host = os.path.join(root, "host") + os.sep
    graph = collections.defaultdict(set)
    reaching = []
    for path in files:
        text = open(path, encoding="utf-8", errors="replace").read()
        for m in re.finditer(r'^\s*#\s*include\s+"([^"]+)"', text, re.M):
            for base in [os.path.dirname(path)] + search:
                candidate = os.path.normpath(os.path.join(base, m.group(1)))
                if os.path.exists(candidate):
                    graph[path].add(candidate)
                    if candidate.startswith(host) and not path.startswith(host):
                        reaching.append((path, candidate))
                    break
    return files, graph, reaching


def python_graph(root):
    """Import edges among python/clattn's modules (module-level and in functions)."""
    import ast
    pkg = os.path.join(root, "python", "clattn")
    modules = {os.path.splitext(f)[0]: os.path.join(pkg, f)
               for f in os.listdir(pkg) if f.endswith(".py")} if os.path.isdir(pkg) else {}
    graph = collections.defaultdict(set)
    for name, path in modules.items():
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level >= 1 or base == "clattn" or base.startswith("clattn."):
                    base = base[len("clattn."):] if base.startswith("clattn.") else (
                        "" if base == "clattn" else base)
                    if base:
                        targets.append(base.split(".")[0])
                    else:  # from . import a, b
                        targets += [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                targets += [a.name.split(".")[1] for a in node.names
                            if a.name.startswith("clattn.")]
            for t in targets:
                if t in modules and t != name and t != "__init__":
                    graph[path].add(modules[t])
    return list(modules.values()), graph


def report(root, summary, loops, kind):
    """Prints the summary and each loop; whether there was one."""
    print(summary + f", {len(loops)} loop(s)")
    for loop in loops:
        print(f"  {kind}: " + " <-> ".join(os.path.relpath(p, root) for p in loop))
    return bool(loops)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    root = os.path.abspath(root)
    files, graph = host_graph(root)
    failed = report(root, f"layering: {len(files)} files of host/, "
                    f"{sum(len(v) for v in graph.values())} include/call edges",
                    cycles(graph), "loop")
    tree, includes, reaching = include_graph(root)
    failed |= report(root, f"includes: {len(tree)} C/OpenCL files in the tree, "
                     f"{sum(len(v) for v in includes.values())} include edges, "
                     f"{len(reaching)} include(s) of host/ from outside it",
                     cycles(includes), "include loop")
    for path, header in reaching:
        failed = True
        print(f"  {os.path.relpath(path, root)} includes {os.path.relpath(header, root)} "
              "(outside host/: the public headers only)")
    modules, imports = python_graph(root)
    failed |= report(root, f"python: {len(modules)} modules of python/clattn, "
                     f"{sum(len(v) for v in imports.values())} import edges",
                     cycles(imports), "import loop")
    kernels = kernel_params(root)
    if not kernels:
        failed = True
        print("kernels: no __kernel found (the pattern is broken)")
    widest = max(kernels, key=lambda k: k[2]) if kernels else None
    print(f"kernels: {len(kernels)} kernels, the most parameters: "
          f"{widest[2]} ({widest[1]} in {widest[0]})" if widest else "")
    for path, name, count in kernels:
        if count > MAX_KERNEL_PARAMS:
            failed = True
            print(f"  {name} in {path} takes {count} parameters (at most {MAX_KERNEL_PARAMS})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
