#!/usr/bin/env python3
"""Mutation testing for clattn: see run.sh for usage and the mutants.txt format."""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.path.dirname(os.path.dirname(HERE))
ID_RE = re.compile(r"^\[([A-Za-z0-9_-]+)\]\s*$")
FIELD_RE = re.compile(r"^(desc|file|tests|original|replace):(.*)$")


class Mutant:
    def __init__(self, ident, line):
        self.id = ident
        self.line = line
        self.desc = ""
        self.file = ""
        self.tests = []
        self.edits = []  # [(original, replacement)]
        self._pending = None

    @property
    def kind(self):
        return "kernel" if self.file.startswith("kernels/") else "host"


def parse_mutants(path):
    """Parses the stanza file; returns the mutants or raises ValueError naming the line."""
    mutants, current = [], None
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        line, lineno = lines[i], i + 1
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = ID_RE.match(line)
        if m:
            current = Mutant(m.group(1), lineno)
            if any(x.id == current.id for x in mutants):
                raise ValueError(f"{path}:{lineno}: duplicate mutant id {current.id}")
            mutants.append(current)
            continue
        m = FIELD_RE.match(line)
        if not m or current is None:
            raise ValueError(f"{path}:{lineno}: expected [id] or 'field: value', got {line!r}")
        key, value = m.group(1), m.group(2)
        value = value[1:] if value.startswith(" ") else value
        here_doc = re.match(r"^<<([A-Za-z_]+)\s*$", value)
        if here_doc and key in ("original", "replace"):
            end, body = here_doc.group(1), []
            while i < len(lines) and lines[i] != end:
                body.append(lines[i])
                i += 1
            if i == len(lines):
                raise ValueError(f"{path}:{lineno}: no closing {end}")
            i += 1
            value = "\n".join(body)
        if key == "desc":
            current.desc = value.strip()
        elif key == "file":
            current.file = value.strip()
        elif key == "tests":
            current.tests = value.split()
        elif key == "original":
            if current._pending is not None:
                raise ValueError(f"{path}:{lineno}: original without a replace before it")
            current._pending = value
        else:
            if current._pending is None:
                raise ValueError(f"{path}:{lineno}: replace without an original")
            current.edits.append((current._pending, value))
            current._pending = None
    for m in mutants:
        missing = [n for n, v in (("desc", m.desc), ("file", m.file), ("tests", m.tests),
                                  ("original/replace", m.edits)) if not v]
        if m._pending is not None:
            missing.append("replace")
        if missing:
            raise ValueError(f"{path}:{m.line}: mutant {m.id} lacks {', '.join(missing)}")
    return mutants


def mutate(text, edits):
    """Applies the edits in order; returns (new_text, None) or (None, why)."""
    for original, replacement in edits:
        count = text.count(original)
        if count != 1:
            first = original.strip().split("\n")[0]
            return None, f"{first[:50]!r} occurs {count} times"
        text = text.replace(original, replacement)
    return text, None


def source_files(root):
    """The tree's files as git sees them (tracked plus untracked, not ignored)."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard", "-z"],
                             check=True, capture_output=True).stdout.decode()
        return [p for p in out.split("\0") if p and os.path.isfile(os.path.join(root, p))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith(("build", ".git"))]
            files += [os.path.relpath(os.path.join(dirpath, f), root) for f in filenames]
        return files


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def sync_tree(src_root, dst_root):
    """Copies the source files that differ into dst_root (so an unchanged file keeps its mtime
    and the scratch build stays incremental) and removes files that left the tree."""
    files = set(source_files(src_root))
    for rel in files:
        src, dst = os.path.join(src_root, rel), os.path.join(dst_root, rel)
        try:
            with open(src, "rb") as a, open(dst, "rb") as b:
                if a.read() == b.read():
                    continue
        except OSError:
            pass
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)
        os.utime(dst)  # newer than any object built from the old copy
    for dirpath, dirnames, filenames in os.walk(dst_root):
        for f in filenames:
            rel = os.path.relpath(os.path.join(dirpath, f), dst_root)
            if rel not in files:
                os.remove(os.path.join(dirpath, f))


class Runner:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build_dir)
        self.work = os.path.abspath(args.work_dir or os.path.join(self.build, "mutants"))
        self.logs = os.path.join(self.work, "logs")
        self.baseline = {}  # suite -> seconds
        self.scratch_src = os.path.join(self.work, "src")
        self.scratch_build = os.path.join(self.work, "build")
        self.scratch_ready = False
        self.last_host = None  # (path, original text) of the file the previous mutant changed
        os.makedirs(self.logs, exist_ok=True)

    # -- helpers ---------------------------------------------------------------------------------
    def env(self, kernel_dir=None):
        env = dict(os.environ)
        env.pop("CLATTN_KERNEL_DIR", None)
        env.setdefault("CK_FORK", "no")
        if kernel_dir:
            env["CLATTN_KERNEL_DIR"] = kernel_dir
        return env

    def run(self, cmd, cwd, env, timeout, log):
        """Runs cmd in its own session; returns (returncode or 'timeout', seconds)."""
        start = time.monotonic()
        with open(log, "ab") as out:
            out.write(("\n$ " + " ".join(cmd) + "\n").encode())
            out.flush()
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = "timeout"
        return rc, time.monotonic() - start

    def main_options(self):
        """The main build's feature switches (CLATTN_MPI and the like), so that the scratch
        build registers the same ctest entries: without them the ring's suites are missing
        there and every ring mutant reads as a survivor."""
        keep = ("CLATTN_MPI", "CLATTN_SANITIZE", "CLATTN_BUILD_TESTS")
        opts = []
        with open(os.path.join(self.build, "CMakeCache.txt")) as f:
            for line in f:
                m = re.match(r"(CLATTN_[A-Z_]+):BOOL=(\w+)$", line.strip())
                if m and m.group(1) in keep:
                    opts.append(f"-D{m.group(1)}={m.group(2)}")
        return opts

    def ctest_names(self, build):
        out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, check=True,
                             capture_output=True).stdout
        return [t["name"] for t in json.loads(out)["tests"]]

    def expand(self, patterns, names):
        chosen = []
        for p in patterns:
            hits = [n for n in names if re.fullmatch(p, n)]
            if not hits:
                raise ValueError(f"tests: {p!r} matches no ctest entry in {self.build}")
            chosen += [h for h in hits if h not in chosen]
        return chosen

    def ctest(self, build, suite, env, timeout, log):
        cmd = ["ctest", "-R", "^" + re.escape(suite) + "$", "--output-on-failure"]
        return self.run(cmd, build, env, timeout, log)

    def suite_timeout(self, suite):
        if self.args.timeout:
            return self.args.timeout
        return max(60.0, 4 * self.baseline.get(suite, 60.0) + 30)

    # -- phases ----------------------------------------------------------------------------------
    def run_baseline(self, suites):
        """The unmutated suites must pass (and warm the PoCL cache); their times order the runs."""
        log = os.path.join(self.logs, "baseline.log")
        open(log, "w").close()
        for suite in suites:
            rc, secs = self.ctest(self.build, suite, self.env(), 900, log)
            if rc != 0:
                sys.exit(f"baseline: ctest {suite} fails without any mutant (rc {rc}); see {log}")
            self.baseline[suite] = secs
        if "Skipped" in read(log) or "Not Run" in read(log):
            sys.exit(f"baseline: some suite was skipped (no OpenCL device?); see {log}")
        print("baseline: " + ", ".join(f"{s} {t:.1f}s" for s, t in
                                       sorted(self.baseline.items(), key=lambda x: x[1])),
              flush=True)

    def prepare_scratch(self, log):
        """Syncs the scratch copy, configures its build once and builds it."""
        if self.scratch_ready:
            return True
        os.makedirs(self.scratch_src, exist_ok=True)
        sync_tree(SOURCE_ROOT, self.scratch_src)
        if not os.path.exists(os.path.join(self.scratch_build, "CMakeCache.txt")):
            gen = ["-G", "Ninja"] if shutil.which("ninja") else []
            rc, _ = self.run(["cmake", "-S", self.scratch_src, "-B", self.scratch_build, *gen,
                              *self.main_options(), "-DCLATTN_BUILD_EXAMPLES=OFF"],
                             SOURCE_ROOT, self.env(), 600, log)
            if rc != 0:
                return False
        # Share the PoCL kernel cache with the main build: the host mutants embed the same
        # kernels, so they compile none.
        cache, shared = os.path.join(self.scratch_build, "pocl-cache"), os.path.join(self.build,
                                                                                  "pocl-cache")
        os.makedirs(shared, exist_ok=True)
        if not os.path.islink(cache):
            shutil.rmtree(cache, ignore_errors=True)
            os.symlink(shared, cache)
        rc, _ = self.run(["cmake", "--build", self.scratch_build, f"-j{self.args.jobs}"],
                         SOURCE_ROOT, self.env(), 1800, log)
        self.scratch_ready = rc == 0
        return self.scratch_ready

    def run_mutant(self, m, names):
        log = os.path.join(self.logs, m.id + ".log")
        open(log, "w").close()
        start = time.monotonic()
        try:
            suites = self.expand(m.tests, names)
        except ValueError as e:
            return "DOES NOT APPLY (" + str(e) + ")", False, time.monotonic() - start
        suites.sort(key=lambda s: self.baseline.get(s, 1e9))
        try:
            text = read(os.path.join(SOURCE_ROOT, m.file))
        except OSError as e:
            return f"DOES NOT APPLY ({m.file}: {e.strerror})", False, time.monotonic() - start
        mutated, why = mutate(text, m.edits)
        if mutated is None:
            return f"DOES NOT APPLY ({why})", False, time.monotonic() - start

        if m.kind == "kernel":
            with tempfile.TemporaryDirectory(prefix="clattn-mutant-") as kdir:
                for f in os.listdir(os.path.join(SOURCE_ROOT, "kernels")):
                    if f.endswith((".cl", ".h")):  # the sources and params.h
                        shutil.copy(os.path.join(SOURCE_ROOT, "kernels", f), kdir)
                write(os.path.join(kdir, os.path.basename(m.file)), mutated)
                result, ok = self.run_suites(self.build, suites, self.env(kdir), log)
        else:
            if not self.prepare_scratch(log):
                return f"ERROR (scratch build failed; see {log})", False, time.monotonic() - start
            if self.last_host:
                write(*self.last_host)
            path = os.path.join(self.scratch_src, m.file)
            self.last_host = (path, read(path))
            write(path, mutated)
            rc, _ = self.run(["cmake", "--build", self.scratch_build, f"-j{self.args.jobs}"],
                             SOURCE_ROOT, self.env(), 900, log)
            if rc != 0:
                return f"DOES NOT BUILD (see {log})", False, time.monotonic() - start
            result, ok = self.run_suites(self.scratch_build, suites, self.env(), log)
        return result, ok, time.monotonic() - start

    def run_suites(self, build, suites, env, log):
        for suite in suites:
            mark = os.path.getsize(log)
            rc, _ = self.ctest(build, suite, env, self.suite_timeout(suite), log)
            if rc == "timeout":
                # A kernel mutant's first run compiles every program of the suite cold (the
                # mutated source misses the PoCL cache the baseline warmed): check_flash takes
                # minutes that way. The programs compiled before the kill are cached now, so a
                # second run, with twice the time, usually gives a verdict rather than a timeout.
                mark = os.path.getsize(log)
                rc, _ = self.ctest(build, suite, env, 2 * self.suite_timeout(suite), log)
            with open(log, "rb") as f:
                f.seek(mark)
                ran = f.read().decode(errors="replace")
            if "No tests were found" in ran:
                return f"NOT RUN (no ctest entry {suite} in {build}; see {log})", False
            if rc == "timeout":
                return f"KILLED (timeout) by {suite}", True
            if rc != 0:
                with open(log, "rb") as f:
                    f.seek(mark)
                    output = f.read().decode(errors="replace")
                if "CL_BUILD_PROGRAM_FAILURE" in output or "CLATTN_ERR_BUILD" in output:
                    return f"INVALID (kernel does not compile; see {log})", False
                return f"KILLED by {suite}", True
        return "SURVIVED (" + " ".join(suites) + ")", False

    def finish(self):
        if self.last_host:
            write(*self.last_host)
            self.last_host = None


def main():
    parser = argparse.ArgumentParser(description="clattn mutation testing (see run.sh)")
    parser.add_argument("build_dir", nargs="?", default=os.path.join(SOURCE_ROOT, "build"))
    parser.add_argument("mutants", nargs="*", help="mutant ids (default: all)")
    parser.add_argument("--file", default=os.path.join(HERE, "mutants.txt"))
    parser.add_argument("--work-dir", help="scratch tree, build and logs (BUILD_DIR/mutants)")
    parser.add_argument("--timeout", type=float, help="seconds per suite (default from baseline)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--no-build", action="store_true", help="do not build BUILD_DIR first")
    args = parser.parse_args()
    wall = time.monotonic()

    try:
        mutants = parse_mutants(args.file)
    except (OSError, ValueError) as e:
        sys.exit(f"run.sh: {e}")
    if args.list:
        for m in mutants:
            print(f"{m.id:34} {m.kind:6} {m.file:28} {' '.join(m.tests)}")
        return 0
    if args.mutants:
        unknown = [i for i in args.mutants if i not in {m.id for m in mutants}]
        if unknown:
            sys.exit(f"run.sh: no mutant named {', '.join(unknown)} in {args.file}")
        mutants = [m for m in mutants if m.id in args.mutants]

    runner = Runner(args)
    if not os.path.exists(os.path.join(runner.build, "CTestTestfile.cmake")):
        sys.exit(f"run.sh: {runner.build} is not a configured build (run cmake first)")
    if not args.no_build:
        rc = subprocess.run(["cmake", "--build", runner.build, f"-j{args.jobs}"],
                            stdout=subprocess.DEVNULL).returncode
        if rc != 0:
            sys.exit(f"run.sh: building {runner.build} failed")
    names = runner.ctest_names(runner.build)
    wanted = []
    for m in mutants:
        try:
            wanted += [s for s in runner.expand(m.tests, names) if s not in wanted]
        except ValueError:
            pass  # reported as DOES NOT APPLY below
    runner.run_baseline(wanted)

    # Kernel mutants first (no build); host mutants grouped by file so each rebuild is small.
    order = [m for m in mutants if m.kind == "kernel"]
    order += sorted((m for m in mutants if m.kind == "host"), key=lambda m: m.file)
    rows, passed, failed = [], 0, 0
    print(f"{'mutant':34} {'result':44} time", flush=True)
    try:
        for m in order:
            result, ok, secs = runner.run_mutant(m, names)
            passed, failed = passed + ok, failed + (not ok)
            rows.append((m, result, secs))
            print(f"{m.id:34} {result:44} {secs:5.1f}s   {m.desc}", flush=True)
    finally:
        runner.finish()
    print(f"{passed} passed, {failed} failed")
    print(f"total wall time {time.monotonic() - wall:.0f}s (logs in {runner.logs})")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
