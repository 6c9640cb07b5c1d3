#!/usr/bin/env python3
"""The docs test: every example in README.md and docs/*.md runs, and every file, C symbol and
Python name they cite exists.

Usage: run_docs_test.py BUILD_DIR [--source DIR] [--only FILE.md] [--keep] [-v]

BUILD_DIR holds the built `clattn` command and libclattn (a CMake build tree). What it does,
for each fenced code block, in document order (one scratch folder per Markdown file, so a
block may use the files an earlier block of the same page wrote):

  ```c        a complete program: compiled against include/ (cc -std=c11 -Wall -Werror),
              linked with BUILD_DIR's libclattn, and run (exit 0 required).
  ```sh       must carry a marker: `run` (run with bash -e, BUILD_DIR first in PATH, so
              `clattn` is the built command and `python3` this interpreter) or `skip (...)`.
  ```python   executed (from a file block_LINE.py in the scratch folder) with
              PYTHONPATH=python/ and CLATTN_LIBRARY=BUILD_DIR's libclattn; a
              block that needs an optional third-party module this Python lacks (torch,
              safetensors, pyopencl, mpi4py, transformers, ml_dtypes) is reported SKIPPED
              with the module's name, never passed.
  ```cmake    find_package(clattn X.Y ...) must name the project's version.
  other       (text, indented blocks) not run.

Markers: an HTML comment on the lines before a block (blank lines and other comments, such as
README's `<!-- test-command -->`, may come between):

  <!-- docs-test: skip (REASON) -->      the block is not run; the reason is printed. For what
                                          cannot run here (apt-get, PyPI, a GPU, mpirun) and
                                          for modules that do not exist yet.
  <!-- docs-test: run -->                 a shell block that runs (on small files).
  <!-- docs-test: run (needs M, N: why) -->   the same where Python modules M and N import
                                          (an earlier block that makes its files needs them);
                                          else SKIPPED, naming them. A dotted name
                                          (torch.compile) needs that attribute too (a newer
                                          version). On a Python block: the same test.
  <!-- docs-test: old-names (REASON) -->  before a paragraph or table (prose, not a block):
                                          the names in it are not checked (the 0.1 API's
                                          names, in the migration table).
  <!-- docs-test: fragment NAME -->       a C fragment: placed in main() between the prelude
                                          and epilogue of the wrapper NAME (WRAPPERS below:
                                          they declare what the fragment uses, with real
                                          buffers), then compiled and run.

Then the references: every Markdown link to a page of the tree must resolve, and in every
inline `code` span outside code blocks:
  - file paths (`kernels/score.cl`, `tests/check_sweep.c`, `host/ops/`, `flash_cpu.cl`)
    must be tracked files or folders (a bare file name anywhere in the tree; `<unit>` is a
    wildcard);
  - C names (`clattn_*`, `CLATTN_*`, `clattn__*`) must occur in the sources (include/,
    host/, kernels/, tools/, tests/, python/, examples/, bench/, CMake files); a field named
    as `clattn_type.field` must occur in the public headers;
  - command lines (`clattn sdpa --causal ...`): each option in that command's --help; on
    docs/cli.md a lone `--option` in some command's --help;
  - Python names (`clattn.xxx`, `clattn.Context.from_pyopencl`) must resolve in the package
    (names that need torch are skipped without torch; PENDING lists the ones being built).
And the version: every version named in README/docs (`find_package(clattn X.Y`, "version
X.Y.Z", `clattn X.Y.Z`) equals CMakeLists.txt's project version, "since X.Y" is not later
than it, and include/clattn.h, python/clattn/__init__.py and examples/*/CMakeLists.txt agree.

Exit 0 when everything ran or was skipped with a reason, 1 on any failure, 77 (skipped) when
no OpenCL device is found and CI is not set (the static checks still run).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

OPTIONAL_MODULES = ("torch", "safetensors", "pyopencl", "mpi4py", "transformers", "ml_dtypes")
# Python names being built (issue 46): allowed to be missing until they land.
PENDING: dict = {}
TIMEOUT = 120  # seconds per block
CLI_COMMANDS = ("devices", "info", "demo", "run", "sdpa", "rope", "additive", "bench", "tune",
                "serve")
PLACEHOLDERS = {"name", "this", "file", "foo", "prog", "app"}
# A code span that starts with one of these is a command line: its bare file names are the
# user's own files (`cc app.c ...`), not the repository's.
COMMANDS = {"cc", "gcc", "clang", "python3", "python", "pip", "cmake", "clattn", "mpirun",
            "apt-get", "pkg-config", "oclgrind", "ctest", "bash", "sh"}

# C fragment wrappers: a prelude that declares what the fragment uses, then the fragment, then
# the epilogue; `ok` is the program's success. Buffers are real (zeros or small values).
_C_HEAD = r"""
#include <clattn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
static inline float *filled(size_t n)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; p && i < n; ++i)
        p[i] = (float)((i * 7919u) % 17u) / 17.0f - 0.5f;
    return p;
}
static inline cl_mem device_buffer(clattn_ctx *ctx, size_t floats)
{
    cl_int err = CL_SUCCESS;
    float *host = filled(floats);
    cl_mem mem = clCreateBuffer(clattn_ctx_cl_context(ctx),
                                CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                floats * sizeof(float), host, &err);
    free(host);
    return err == CL_SUCCESS ? mem : NULL;
}
"""
_DEVICE_CTX = r"""
    clattn_ctx *ctx = NULL;
    char create_msg[512];
    if (clattn_ctx_create(NULL, &ctx, create_msg, sizeof create_msg) != CLATTN_SUCCESS) {
        fprintf(stderr, "docs test: no context: %s\n", create_msg);
        return 1;
    }
"""
_STATUS_END = r"""
    if (s != CLATTN_SUCCESS)
        fprintf(stderr, "docs test: %s: %s\n", clattn_status_string(s), clattn_last_error(ctx));
    clattn_ctx_release(ctx);
    return s == CLATTN_SUCCESS ? 0 : 1;
"""
WRAPPERS = {
    # c-api.md: the host-pointer MHA call (the fragment makes and releases its own context).
    "mha_host": (r"""
    float *in_proj_weight = filled(768 * 256), *in_proj_bias = filled(768);
    float *out_proj_weight = filled(256 * 256), *out_proj_bias = filled(256);
    float *x = filled(2 * 128 * 256), *out = filled(2 * 128 * 256);
""", r"""
    printf("out[0] = %g\n", out[0]);
    free(in_proj_weight), free(in_proj_bias), free(out_proj_weight), free(out_proj_bias);
    free(x), free(out);
    return s == CLATTN_SUCCESS ? 0 : 1;
"""),
    # c-api.md: an SDPA plan on (B, L, H*D) device buffers, executed `steps` times.
    "sdpa_plan": (_DEVICE_CTX + r"""
    const size_t B = 2, H = 4, L = 33, D = 16;
    const int steps = 3;
    cl_mem q_buf = device_buffer(ctx, B * L * H * D), k_buf = device_buffer(ctx, B * L * H * D);
    cl_mem v_buf = device_buffer(ctx, B * L * H * D), out_buf = device_buffer(ctx, B * L * H * D);
""", r"""
    clReleaseMemObject(q_buf), clReleaseMemObject(k_buf), clReleaseMemObject(v_buf);
    clReleaseMemObject(out_buf);
""" + _STATUS_END),
    # serving.md: decoding with a KV cache (32 query heads on 8 k/v heads of 128).
    "kv_cache": (_DEVICE_CTX + r"""
    const int steps = 3;
    cl_mem q_buf = device_buffer(ctx, 32 * 128), out_buf = device_buffer(ctx, 32 * 128);
    cl_mem kn = device_buffer(ctx, 8 * 128), vn = device_buffer(ctx, 8 * 128);
    clattn_tensor k_new = clattn_tensor_make(kn, 0, CLATTN_DTYPE_F32, 4, 1, 8, 1, 128);
    clattn_tensor v_new = clattn_tensor_make(vn, 0, CLATTN_DTYPE_F32, 4, 1, 8, 1, 128);
""", r"""
    clReleaseMemObject(q_buf), clReleaseMemObject(out_buf), clReleaseMemObject(kn);
    clReleaseMemObject(vn);
""" + _STATUS_END),
    # training.md: the forward with lse, then the backward plan.
    "backward": (_DEVICE_CTX + r"""
    const size_t B = 1, H = 4, Hkv = 2, L = 24, d = 16;
    clattn_status s = CLATTN_SUCCESS;
    cl_mem q_buf = device_buffer(ctx, B * H * L * d), out_buf = device_buffer(ctx, B * H * L * d);
    cl_mem k_buf = device_buffer(ctx, B * Hkv * L * d), v_buf = device_buffer(ctx, B * Hkv * L * d);
    cl_mem lse_buf = device_buffer(ctx, B * H * L), dout_buf = device_buffer(ctx, B * H * L * d);
    cl_mem dq_buf = device_buffer(ctx, B * H * L * d), dk_buf = device_buffer(ctx, B * Hkv * L * d);
    cl_mem dv_buf = device_buffer(ctx, B * Hkv * L * d);
""", r"""
    clattn_plan_release(forward), clattn_plan_release(backward);
    cl_mem all[] = {q_buf, k_buf, v_buf, out_buf, lse_buf, dout_buf, dq_buf, dk_buf, dv_buf};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        clReleaseMemObject(all[i]);
""" + _STATUS_END),
    # training.md: the dropout fields of a descriptor.
    "sdpa_desc": (r"""
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
""", r"""
    return desc.dropout_p > 0.09 && desc.dropout_p < 0.11 && desc.dropout_seed == 1234 ? 0 : 1;
"""),
}

FENCE = re.compile(r"^(\s*)```\s*([A-Za-z0-9_+-]*)\s*$")
MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")
COMMENT = re.compile(r"^\s*<!--.*-->\s*$")


def _kind(path):
    """'c' for C-like sources (/* */ and // comments), 'hash' for # comments, else None."""
    if re.search(r"\.(c|h|cl)$", path):
        return "c"
    if re.search(r"\.(py|sh|cmake|txt|toml)$|CMakeLists\.txt$|^\.ci/", path):
        return "hash"
    return None


def _split_comments(text, kind):
    """(the text with its comments blanked out, [(line, comment)]); strings are kept."""
    if kind == "c":
        pattern = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|/\*.*?\*/|//[^\n]*',
                             re.S)
    else:
        pattern = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|#[^\n]*')
    comments, out, last = [], [], 0
    for m in pattern.finditer(text):
        if m.group(0)[0] in "\"'":
            continue
        out.append(text[last:m.start()])
        out.append(re.sub(r"[^\n]", " ", m.group(0)))
        comments.append((text.count("\n", 0, m.start()) + 1, m.group(0)))
        last = m.end()
    out.append(text[last:])
    return "".join(out), comments


def _signature(args):
    """[(name, default text or None, keyword_only)] when a span's argument list is a
    signature (every item `name`, `name=default` or `*`); None for a call with values."""
    items, depth, cur = [], 0, ""
    for ch in args:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        items.append(cur.strip())
    out, kw = [], False
    for item in items:
        if item == "*":
            kw = True
            continue
        m = re.match(r"^([A-Za-z_]\w*)\s*(?:=\s*(.+))?$", item)
        if not m:
            return None
        out.append((m.group(1), m.group(2), kw))
    return out if len(out) >= 2 else None


class Block:
    def __init__(self, path, line, lang, text, marker):
        self.path, self.line, self.lang, self.text, self.marker = path, line, lang, text, marker

    def where(self):
        return f"{self.path}:{self.line}"


def parse(path, rel):
    """(blocks, prose lines with their numbers) of one Markdown file."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, prose, i = [], [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        start, lang = i, m.group(2).lower()
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        marker, k = None, start - 1
        while k >= 0 and (not lines[k].strip() or COMMENT.match(lines[k])):
            mm = MARKER.search(lines[k])
            if mm:
                marker = mm.group(1)
                break
            k -= 1
        blocks.append(Block(rel, start + 1, lang, "\n".join(lines[start + 1:j]) + "\n", marker))
        i = j + 1
    return blocks, prose


class Runner:
    def __init__(self, args):
        self.src = os.path.abspath(args.source)
        self.build = os.path.abspath(args.build_dir)
        self.verbose = args.verbose
        self.results = []  # (status, where, what)
        self.work = tempfile.mkdtemp(prefix="clattn-docs-")
        self.keep = args.keep
        self.bin = os.path.join(self.work, "bin")
        os.makedirs(self.bin)
        for name in ("python3", "python"):  # a script, not a link: a venv's python finds
            with open(os.path.join(self.bin, name), "w") as f:  # its site-packages this way
                f.write(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
            os.chmod(os.path.join(self.bin, name), 0o755)
        lib = os.path.join(self.build, "libclattn.so")
        self.env = dict(os.environ)
        self.env.update({
            "PATH": os.pathsep.join([self.bin, self.build, self.env.get("PATH", "")]),
            "PYTHONPATH": os.pathsep.join(filter(None, [os.path.join(self.src, "python"),
                                                        self.env.get("PYTHONPATH")])),
            "CLATTN_LIBRARY": lib,
            "CLATTN_NO_TUNE_HINT": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        })
        self.env.setdefault("XDG_CACHE_HOME", os.path.join(self.work, "xdg-cache"))
        self.have = {}

    def record(self, status, where, what):
        self.results.append((status, where, what))
        if status == "FAIL" or self.verbose:
            print(f"{status:7} {where}: {what}", flush=True)

    def has_module(self, name):
        """Whether module `name` imports; a dotted name past a module (`torch.compile`) must
        also exist as an attribute (a feature of a newer version)."""
        if name not in self.have:
            root = name.split(".")[0]
            code = f"import {root}" + (f"; {name}" if "." in name else "")
            r = subprocess.run([sys.executable, "-c", code], env=self.env,
                               capture_output=True)
            self.have[name] = r.returncode == 0
        return self.have[name]

    def run(self, cmd, cwd, where, what, stdin=None):
        t0 = time.monotonic()
        try:
            r = subprocess.run(cmd, cwd=cwd, env=self.env, capture_output=True, text=True,
                               input=stdin, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.record("FAIL", where, f"{what}: timed out after {TIMEOUT} s")
            return False
        dt = time.monotonic() - t0
        if r.returncode != 0:
            tail = (r.stdout + r.stderr).strip().splitlines()[-25:]
            self.record("FAIL", where, f"{what} exited {r.returncode}:\n    " +
                        "\n    ".join(tail))
            return False
        self.record("PASS", where, f"{what} ({dt:.1f} s)")
        return True

    # ---- code blocks ---------------------------------------------------------------------
    def block(self, b, cwd, device):
        m = b.marker or ""
        if m.startswith("skip"):
            reason = re.match(r"skip\s*\((.+)\)\s*$", m)
            if not reason:
                self.record("FAIL", b.where(), f"skip marker without a (reason): {m!r}")
            else:
                self.record("SKIP", b.where(), f"{b.lang} block: {reason.group(1)}")
            return
        if b.lang in ("c",):
            self.c_block(b, cwd, device, m)
        elif b.lang in ("sh", "bash", "shell", "console"):
            needs = re.match(r"run\s*\(needs ([\w., ]+?)(?::.*)?\)\s*$", m)
            missing = [mod.strip() for mod in needs.group(1).split(",")
                       if not self.has_module(mod.strip())] if needs else []
            if m != "run" and not needs:
                self.record("FAIL", b.where(), "a shell block needs a marker: "
                            "<!-- docs-test: run --> or <!-- docs-test: skip (reason) -->")
            elif missing:
                self.record("SKIP", b.where(), f"shell block: needs {', '.join(missing)}, "
                            f"which {sys.executable} lacks")
            elif not device:
                self.record("SKIP", b.where(), "shell block: no OpenCL device")
            else:
                self.run(["bash", "-euo", "pipefail", "-c", b.text], cwd, b.where(),
                         "shell block")
        elif b.lang in ("python", "py"):
            needs = re.match(r"run\s*\(needs ([\w., ]+?)(?::.*)?\)\s*$", m)
            if m and not needs:
                self.record("FAIL", b.where(), f"unknown marker for a Python block: {m!r}")
                return
            need = [mod for mod in OPTIONAL_MODULES
                    if re.search(rf"^\s*(import|from)\s+[^#\n]*\b{mod}\b", b.text, re.M)]
            need += [mod.strip() for mod in needs.group(1).split(",")] if needs else []
            missing = [mod for mod in need if not self.has_module(mod)]
            if missing:
                self.record("SKIP", b.where(), f"Python block: needs {', '.join(missing)}, "
                            f"which {sys.executable} lacks")
            elif not device:
                self.record("SKIP", b.where(), "Python block: no OpenCL device")
            else:
                # from a file, as a user's script runs (inspect.getsource works: clattn's
                # FlexAttention translator reads the functions' source)
                script = os.path.join(cwd, f"block_{b.line}.py")
                with open(script, "w", encoding="utf-8") as f:
                    f.write(b.text)
                self.run([sys.executable, script], cwd, b.where(), "Python block")
        elif b.lang == "cmake":
            self.version_text(b.text, b.where())
            self.record("PASS", b.where(), "cmake block: versions")
        elif m:
            self.record("FAIL", b.where(), f"marker {m!r} on a {b.lang or 'plain'} block")

    def c_block(self, b, cwd, device, m):
        if m.startswith("fragment"):
            name = m.split()[1] if len(m.split()) > 1 else ""
            if name not in WRAPPERS:
                self.record("FAIL", b.where(), f"unknown C fragment wrapper {name!r}")
                return
            pre, post = WRAPPERS[name]
            body = "\n".join("    " + line for line in b.text.splitlines())
            source = f"{_C_HEAD}\nint main(void)\n{{{pre}\n#line {b.line + 1} \"{b.path}\"\n" \
                     f"{body}\n#line 1 \"epilogue\"\n{post}}}\n"
            what = f"C fragment ({name})"
        elif m:
            self.record("FAIL", b.where(), f"unknown marker for a C block: {m!r}")
            return
        else:
            source = f"#line {b.line + 1} \"{b.path}\"\n{b.text}"
            what = "C program"
        stem = os.path.join(cwd, f"block_{b.line}")
        with open(stem + ".c", "w") as f:
            f.write(source)
        cc = os.environ.get("CC", "cc")
        cmd = [cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-variable",
               "-Wno-unused-but-set-variable", "-I", os.path.join(self.src, "include"),
               stem + ".c", "-o", stem, "-L", self.build, "-lclattn", "-lOpenCL", "-lm",
               "-Wl,-rpath," + self.build]
        if not self.run(cmd, cwd, b.where(), f"{what}: compile"):
            return
        if not device:
            self.record("SKIP", b.where(), f"{what}: compiled; not run: no OpenCL device")
            return
        self.run([stem], cwd, b.where(), f"{what}: run")

    # ---- references --------------------------------------------------------------------------
    def load_tree(self):
        r = subprocess.run(["git", "-C", self.src, "ls-files"], capture_output=True, text=True)
        files = r.stdout.split() if r.returncode == 0 else []
        if not files:  # not a git checkout (an unpacked sdist): walk it
            for root, dirs, names in os.walk(self.src):
                dirs[:] = [d for d in dirs if not d.startswith((".", "build", "venv"))]
                files += [os.path.relpath(os.path.join(root, n), self.src) for n in names]
        self.files = set(files)
        self.dirs = {os.path.dirname(f) for f in files}
        for d in list(self.dirs):
            while d:
                d = os.path.dirname(d)
                self.dirs.add(d)
        self.basenames = {os.path.basename(f) for f in files}
        self.dir_names = {os.path.basename(d) for d in self.dirs if d}
        # Names count as existing where the code (comments stripped) has them; the comments
        # are checked like the docs (comment_references).
        words, header_words = set(), set()
        self.comments = []  # (file, line, comment text)
        for f in files:
            ext = _kind(f)
            if not ext or f.startswith(("docs/", "tests/docs/")):
                continue
            try:
                text = open(os.path.join(self.src, f), encoding="utf-8", errors="replace").read()
            except OSError:
                continue
            code, comments = _split_comments(text, ext)
            self.comments += [(f, line, c) for line, c in comments]
            ws = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code))
            words |= ws
            if f in ("include/clattn.h", "include/clattn_mpi.h", "tools/clattn_io.h"):
                header_words |= ws
        self.words, self.header_words = words, header_words

    PATH_TOKEN = re.compile(r"^(\.?/)?([\w.*<>+-]+/)+[\w.*<>+-]*$|"
                            r"^[\w<>-]+\.(c|h|cl|py|sh|cmake|txt|md|toml|supp)$")
    NOT_REPO = ("build/", "./build/", "/", "$", "~", "build-", "venv", "mpi-rank")

    def path_ok(self, token):
        if token.startswith("./"):
            token = token[2:]
        is_dir = token.endswith("/")
        token = token.rstrip("/")
        if "<" in token or "*" in token:
            pattern = re.sub(r"<[^>]*>", "[^/]*", re.escape(token).replace(r"\*", "[^/]*"))
            pool = self.files | self.dirs if "/" in token or is_dir else self.basenames
            return any(re.match("^" + pattern + "$", f) for f in pool)
        if "/" in token or is_dir:
            return token in self.files or token in self.dirs or \
                any(f.endswith("/" + token) for f in self.files | self.dirs)
        return token in self.basenames

    def looks_like_repo_path(self, token):
        """A token with a slash is a repository path when its first folder is one of the
        tree's folders (so `q/k/v_proj_weight` and `(B, H)/x` are not)."""
        first = token.lstrip("./").split("/")[0]
        return first in self.dir_names or "<" in first

    def references(self, rel, prose, py_names):
        # The prose with code blocks blanked (line numbers kept), so a code span may run over
        # a line break, as Markdown allows.
        last = prose[-1][0] if prose else 0
        lines = [""] * (last + 1)
        for num, line in prose:
            lines[num] = line
        skipped = set()  # lines of a paragraph after an old-names marker
        for num, line in prose:
            m = MARKER.search(line)
            if m and m.group(1).startswith("old-names"):
                reason = re.match(r"old-names\s*\((.+)\)\s*$", m.group(1))
                if not reason:
                    self.record("FAIL", f"{rel}:{num}", "old-names marker without a (reason)")
                self.record("SKIP", f"{rel}:{num}",
                            f"names not checked: {reason.group(1) if reason else ''}")
                k = num + 1
                while k <= last and not lines[k].strip():
                    k += 1
                while k <= last and lines[k].strip():
                    skipped.add(k)
                    k += 1
        text = "\n".join(lines)
        for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):  # [page](docs/x.md)
            target = os.path.normpath(os.path.join(os.path.dirname(rel), m.group(1)))
            if not m.group(1).startswith(("http:", "https:", "mailto:")) and \
                    target not in self.files and target not in self.dirs and \
                    not os.path.exists(os.path.join(self.src, target)):
                self.record("FAIL", f"{rel}:{text.count(chr(10), 0, m.start())}",
                            f"link to `{m.group(1)}`, which does not exist")
        for m in re.finditer(r"`([^`]+)`", text):
            num = text.count("\n", 0, m.start())
            if num in skipped:
                continue
            self.span(m.group(1).replace("\n", " "), f"{rel}:{num}", py_names)
        self.version_text(text, rel)

    def cli_flags(self, command=None):
        """The options `clattn COMMAND --help` names (all commands' when None)."""
        if not hasattr(self, "_help"):
            self._help = {}
            cli = os.path.join(self.build, "clattn")
            for cmd in CLI_COMMANDS:
                r = subprocess.run([cli, cmd, "--help"], env=self.env, capture_output=True,
                                   text=True)
                self._help[cmd] = set(re.findall(r"--[a-z0-9][a-z0-9-]*", r.stdout + r.stderr))
        if command is None:
            return set().union(*self._help.values())
        return self._help.get(command, set())

    def cli_span(self, span, where, lone_flags):
        """`clattn CMD --flag ...`: each flag in CMD's --help; on the CLI's page a lone
        `--flag` in some command's --help."""
        words = span.split()
        if len(words) >= 2 and words[0] == "clattn" and words[1] in CLI_COMMANDS:
            known, what = self.cli_flags(words[1]), f"`clattn {words[1]} --help`"
        elif lone_flags and words and re.match(r"^--[a-z]", words[0]):
            known, what = self.cli_flags(), "any command's --help"
        else:
            return
        for flag in re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", span):
            if flag not in known and flag != "--help":
                self.record("FAIL", where, f"`{flag}` is not in {what}")

    def span(self, span, where, py_names):
        self.cli_span(span, where, where.startswith("docs/cli.md"))
        command = span.split()[0] in COMMANDS if span.split() else False
        for tok in span.split():
            tok = tok.strip(",;:()'\"")
            tok = re.sub(r"[(\[].*$", "", tok)
            if not tok or tok.startswith(self.NOT_REPO) or "=" in tok:
                continue
            if tok.startswith(("-", "http")):
                continue
            if command and "/" not in tok:
                continue  # `cc app.c ...`: the user's own files
            if self.PATH_TOKEN.match(tok) and not re.match(r"^clattn(\.\w+)+$", tok) \
                    and ("/" not in tok or self.looks_like_repo_path(tok)):
                if not self.path_ok(tok):
                    self.record("FAIL", where, f"file `{tok}` does not exist")
        for sym, field in re.findall(r"(?<![\w.$/-])(clattn__\w+|clattn_\w+|CLATTN_\w+)"
                                     r"(?:\.(\w+))?", span):
            if sym.endswith("_") and any(w.startswith(sym) for w in self.words):
                continue  # a prefix: `clattn__plan_*`
            if sym not in self.words and not self.path_ok(sym):
                self.record("FAIL", where, f"C name `{sym}` is not in the sources")
            elif field and sym in self.header_words and field not in self.header_words \
                    and field not in ("h", "pc", "so"):
                self.record("FAIL", where, f"`{sym}.{field}`: no field `{field}` in the "
                            "public headers")
        for dotted, args in re.findall(r"(?<![\w./$-])(clattn(?:\.[A-Za-z_]\w*)+)"
                                       r"(?:\(([^()]*(?:\([^()]*\)[^()]*)*)\))?", span):
            if dotted in ("clattn.h", "clattn.pc") or dotted.endswith((".py", ".so")):
                continue
            entry = py_names.setdefault(dotted, [where, []])
            signature = _signature(args) if args else None
            if signature:
                entry[1].append((where, signature))

    def comment_references(self):
        """Paths and C names cited in the sources' comments must exist too."""
        for f, line, comment in self.comments:
            for k, text in enumerate(comment.split("\n")):
                where = f"{f}:{line + k}"
                for tok in re.findall(r"(?<![\w/.$-])((?:[\w.-]+/)+[\w.*-]*[\w/]|"
                                      r"[\w*-]+\.(?:c|cl|py|sh))(?![\w/(])", text):
                    if tok.startswith(self.NOT_REPO) or tok.endswith((".so", ".h")):
                        continue
                    if "/" in tok and not self.looks_like_repo_path(tok):
                        continue
                    last = tok.rstrip("/").split("/")[-1]
                    if "/" in tok and not tok.endswith("/") and "." not in last:
                        continue  # a built program (bench/soak) or another project's file
                    stem = last.split(".")[0]
                    if stem.isupper() or len(stem) == 1 or stem in PLACEHOLDERS:
                        continue  # `NAME.cl`, `a.cl`: placeholders
                    if not self.path_ok(tok):
                        self.record("FAIL", where, f"comment cites `{tok}`, which does not exist")
                for sym in re.findall(r"(?<![\w.$/-])(clattn__\w+|clattn_\w+|CLATTN_\w+)", text):
                    if sym.endswith("_") and any(w.startswith(sym) for w in self.words):
                        continue
                    if re.match(r"^clattn_[a-z_]+_[A-Z]+$", sym):
                        continue  # `clattn_kernel_NAME`: a placeholder
                    if sym not in self.words and not self.path_ok(sym):
                        self.record("FAIL", where, f"comment names `{sym}`, which is not in "
                                    "the code")

    def python_names(self, py_names, device):
        """Each cited clattn.name must resolve; a cited signature (`clattn.f(a, b=1, *, c=None)`)
        must list the code's parameters, in order, with its keyword-only split and its literal
        defaults."""
        if not py_names:
            return
        script = r"""
import ast, importlib, inspect, json, sys
out = {}
for name in json.loads(sys.argv[1]):
    parts = name.split(".")
    try:
        obj = importlib.import_module(parts[0])
        for i, p in enumerate(parts[1:], 1):
            try:
                obj = getattr(obj, p)
            except AttributeError:
                obj = importlib.import_module(".".join(parts[:i + 1]))
        try:
            sig = inspect.signature(obj)
            params = [(p.name, repr(p.default) if p.default is not p.empty else None,
                       p.kind == p.KEYWORD_ONLY) for p in sig.parameters.values()
                      if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        except (TypeError, ValueError):
            params = None
        out[name] = ["ok", params]
    except ModuleNotFoundError as e:
        out[name] = ["module:" + str(e.name), None]
    except ImportError as e:  # a clattn module that needs a newer optional module
        out[name] = [("newer:" if " needs " in str(e) else "error:ImportError: ") + str(e),
                     None]
    except Exception as e:
        out[name] = ["error:" + type(e).__name__ + ": " + str(e), None]
print(json.dumps(out))
"""
        import json
        r = subprocess.run([sys.executable, "-c", script, json.dumps(sorted(py_names))],
                           env=self.env, capture_output=True, text=True, cwd=self.work)
        if r.returncode != 0:
            self.record("FAIL", "python names", r.stderr.strip()[-2000:])
            return
        found = json.loads(r.stdout)
        for name, (where, signatures) in sorted(py_names.items()):
            res, params = found.get(name, ["error:not checked", None])
            pending = next((p for p in PENDING if name == p or name.startswith(p + ".")), None)
            if res == "ok":
                if pending:
                    self.record("NOTE", where, f"`{name}` exists now: remove it from PENDING "
                                "in tests/docs/run_docs_test.py (and its skip markers)")
                for sig_where, sig in signatures:
                    self.check_signature(name, sig_where, sig, params)
                continue
            if pending:
                self.record("SKIP", where, f"`{name}`: {PENDING[pending]}")
            elif res.startswith("module:") and res[7:].split(".")[0] in OPTIONAL_MODULES:
                self.record("SKIP", where, f"`{name}` needs {res[7:]}, which this Python lacks")
            elif res.startswith("newer:"):
                self.record("SKIP", where, f"`{name}`: {res[6:]}")
            else:
                self.record("FAIL", where, f"Python name `{name}`: {res}")

    def check_signature(self, name, where, doc, code):
        import ast
        if code is None:
            return
        code = [c for c in code if c[0] != "self"]
        doc_names, code_names = [d[0] for d in doc], [c[0] for c in code]
        if doc_names != code_names:
            self.record("FAIL", where, f"`{name}`: the docs give the parameters "
                        f"({', '.join(doc_names)}), the code ({', '.join(code_names)})")
            return
        for (pname, ddef, dkw), (_, cdef, ckw) in zip(doc, code):
            if dkw != ckw:
                self.record("FAIL", where, f"`{name}`: `{pname}` is "
                            f"{'' if ckw else 'not '}keyword-only in the code")
            if ddef is None or cdef is None:
                if (ddef is None) != (cdef is None):
                    self.record("FAIL", where, f"`{name}`: `{pname}` has "
                                f"{'a default ' + cdef if cdef else 'no default'} in the code")
                continue
            try:
                same = ast.literal_eval(ddef) == ast.literal_eval(cdef)
            except (ValueError, SyntaxError):
                continue  # not a literal (np.float32): not compared
            if not same:
                self.record("FAIL", where, f"`{name}`: `{pname}={ddef}` in the docs, "
                            f"`{pname}={cdef}` in the code")

    # ---- versions ----------------------------------------------------------------------------
    def project_version(self):
        text = open(os.path.join(self.src, "CMakeLists.txt")).read()
        self.version = re.search(r"project\(clattn\s+VERSION\s+(\d+\.\d+\.\d+)", text).group(1)
        self.minor = tuple(int(x) for x in self.version.split(".")[:2])
        header = open(os.path.join(self.src, "include/clattn.h")).read()
        parts = [re.search(rf"#define CLATTN_VERSION_{p}\s+(\d+)", header) for p in
                 ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            v = ".".join(m.group(1) for m in parts)
            if v != self.version:
                self.record("FAIL", "include/clattn.h", f"CLATTN_VERSION_* say {v}, "
                            f"CMakeLists.txt {self.version}")
        m = re.search(r'#define CLATTN_VERSION_STRING\s+"([^"]+)"', header)
        if m and m.group(1) != self.version:
            self.record("FAIL", "include/clattn.h", f"CLATTN_VERSION_STRING is {m.group(1)}, "
                        f"CMakeLists.txt {self.version}")
        py = open(os.path.join(self.src, "python/clattn/__init__.py")).read()
        m = re.search(r"__version__\s*=\s*\"([^\"]+)\"", py)
        if not m or m.group(1) != self.version:
            self.record("FAIL", "python/clattn/__init__.py", f"__version__ is "
                        f"{m.group(1) if m else 'missing'}, CMakeLists.txt {self.version}")
        for f in sorted(glob.glob(os.path.join(self.src, "examples/*/CMakeLists.txt"))):
            self.version_text(open(f).read(), os.path.relpath(f, self.src))

    def version_text(self, text, where):
        for m in re.finditer(r"find_package\(clattn\s+(\d+)\.(\d+)", text):
            if (int(m.group(1)), int(m.group(2))) != self.minor:
                self.record("FAIL", where, f"{m.group(0)}: the version is {self.version} "
                            "(the package's rule is SameMinorVersion)")
        for m in re.finditer(r"\b(?:[Vv]ersion|clattn)\s+v?(\d+\.\d+\.\d+)\b", text):
            if m.group(1) != self.version:
                self.record("FAIL", where, f"'{m.group(0)}' but the version is {self.version}")
        for m in re.finditer(r"\bsince\s+(\d+)\.(\d+)\b", text):
            if (int(m.group(1)), int(m.group(2))) > self.minor:
                self.record("FAIL", where, f"'{m.group(0)}' is later than the version "
                            f"{self.version}")

    def kernel_parameter_count(self, pages_text):
        """'the fused kernels take N' in the docs must be FLASH_KERNEL_PARAMS' count."""
        params = open(os.path.join(self.src, "kernels/params.h")).read()
        score = open(os.path.join(self.src, "kernels/score.cl")).read()

        def count(macro, text):
            m = re.search(rf"#define {macro}\s*\\?\n?(.*?)(?<!\\)\n", text, re.S)
            body = re.sub(r"\(.*?\)", "", m.group(1).replace("\\\n", " "))
            return len([a for a in body.split(",") if a.strip()])
        # the macros inside it stand for several parameters each (FLASH_SEQ_BUFFERS: the two
        # packed-sequence offsets, or the decode step's two new rows; the same count)
        n = count("FLASH_KERNEL_PARAMS", params) - 1 + count("SCORE_BUFFERS", score)
        if re.search(r"#define FLASH_SEQ_BUFFERS", params):
            n += count("FLASH_SEQ_BUFFERS", params) - 1
        for where, text in pages_text:
            for m in re.finditer(r"fused kernels take (\d+)", text):
                if int(m.group(1)) != n:
                    self.record("FAIL", where, f"'{m.group(0)}', but FLASH_KERNEL_PARAMS "
                                f"(kernels/params.h) has {n}")

    # ---- main --------------------------------------------------------------------------------
    def device(self):
        cli = os.path.join(self.build, "clattn")
        if not os.access(cli, os.X_OK):
            self.record("FAIL", self.build, "no built clattn command here")
            return False
        r = subprocess.run([cli, "devices"], env=self.env, capture_output=True, text=True)
        return r.returncode == 0 and "*" in r.stdout

    def main(self, only):
        t0 = time.monotonic()
        self.project_version()
        self.load_tree()
        device = self.device()
        if not device:
            print("docs test: no OpenCL device: the examples are compiled but not run",
                  flush=True)
        pages = ["README.md"] + sorted(os.path.relpath(p, self.src) for p in
                                       glob.glob(os.path.join(self.src, "docs", "*.md")))
        if only:
            pages = [p for p in pages if p in only or os.path.basename(p) in only]
        py_names, pages_text = {}, []
        for rel in pages:
            pages_text.append((rel, open(os.path.join(self.src, rel), encoding="utf-8").read()))
            blocks, prose = parse(os.path.join(self.src, rel), rel)
            cwd = os.path.join(self.work, rel.replace("/", "_"))
            os.makedirs(cwd, exist_ok=True)
            for b in blocks:
                self.block(b, cwd, device)
            self.references(rel, prose, py_names)
        self.python_names(py_names, device)
        self.kernel_parameter_count(pages_text)
        if not only:
            self.comment_references()
        counts = {}
        for status, _, _ in self.results:
            counts[status] = counts.get(status, 0) + 1
        print("\ndocs test:", ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())),
              f"in {time.monotonic() - t0:.0f} s (clattn {self.version}; {sys.executable})")
        for status, where, what in self.results:
            if status in ("SKIP", "NOTE") and not self.verbose:
                print(f"  {status:5} {where}: {what}")
        if not self.keep:
            shutil.rmtree(self.work, ignore_errors=True)
        else:
            print("scratch folders kept in", self.work)
        if counts.get("FAIL"):
            return 1
        if not device:
            return 1 if os.environ.get("CI") == "true" else 77
        return 0


def python_with_numpy():
    """The examples need numpy: run under this Python if it has it, else under the first of
    $CLATTN_DOCS_PYTHON, /usr/bin/python3 that does (ctest's python3 may be another one)."""
    try:
        import numpy  # noqa: F401
        return None
    except ImportError:
        pass
    for candidate in (os.environ.get("CLATTN_DOCS_PYTHON"), "/usr/bin/python3"):
        if candidate and os.access(candidate, os.X_OK) and os.path.realpath(candidate) != \
                os.path.realpath(sys.executable) and subprocess.run(
                    [candidate, "-c", "import numpy"], capture_output=True).returncode == 0:
            return candidate
    print("docs test: SKIPPED: no Python with numpy (set CLATTN_DOCS_PYTHON)", flush=True)
    sys.exit(1 if os.environ.get("CI") == "true" else 77)


def main():
    other = python_with_numpy()
    if other:
        os.execv(other, [other, os.path.abspath(__file__)] + sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build_dir")
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--only", nargs="*", help="only these pages (README.md, docs/cli.md, ...)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folders")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    sys.exit(Runner(args).main(args.only))


if __name__ == "__main__":
    main()
