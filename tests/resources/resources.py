#!/usr/bin/env python3
"""GPU kernel resources by proxy: registers, stack, spills and shared memory of every GPU kernel
variant clattn builds, from clang + libclc + NVIDIA's ptxas (and clang's AMDGPU back end).

Run through tests/resources/run.sh (which documents the pipeline and the files). Each variant
of the variants file (FILE<TAB>OPTIONS, as capture.sh records them from clBuildProgram) is
compiled the way the host builds it (common.cl, types.cl, params.h, score.cl, then FILE; the same
options) to PTX and assembled with `ptxas -v -arch=sm_90`; and to AMDGPU code for gfx90a. The
numbers of every kernel entry are compared with the first matching line of the budgets file.

Exit status: 0 when every kernel is within its budget, 1 when one is not (or a compile failed),
77 when the tools are missing (the lane is skipped, not passed), 2 on bad usage.
"""
import argparse
import concurrent.futures
import datetime
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile

PRELUDE = ("common.cl", "types.cl", "params.h", "score.cl")  # what host/core/programs.c prepends
BASES = {"flash_bwd_gpu.cl": ("flash_bwd.cl",)}  # sources compiled before a source (programs.c)
NV_TRIPLE, NV_CPU, NV_PTX, NV_ARCH = "nvptx64-unknown-nvidiacl", "sm_80", "ptx75", "sm_90"
AMD_TRIPLE, AMD_CPU = "amdgcn-unknown-amdhsa", "gfx90a"
SKIP = 77


def tool(name, env):
    """The path of a tool: $env, else name on PATH; None if absent."""
    value = os.environ.get(env, name)
    return shutil.which(value) or (value if os.access(value, os.X_OK) else None)


def find_tools():
    """The toolchain, or (None, why) when something the NVIDIA proxy needs is missing."""
    llvm = os.environ.get("CLATTN_RES_LLVM_SUFFIX", "-15")
    tools = {
        "clang": tool("clang" + llvm, "CLATTN_RES_CLANG"),
        "link": tool("llvm-link" + llvm, "CLATTN_RES_LLVM_LINK"),
        "opt": tool("opt" + llvm, "CLATTN_RES_OPT"),
        "llc": tool("llc" + llvm, "CLATTN_RES_LLC"),
        "ptxas": tool("ptxas", "CLATTN_RES_PTXAS") or
        (None if "CLATTN_RES_PTXAS" in os.environ else tool("/usr/local/cuda/bin/ptxas", "-")),
    }
    libclc = os.environ.get("CLATTN_RES_LIBCLC", "/usr/lib/clc")
    tools["nv_lib"] = os.path.join(libclc, "nvptx64--nvidiacl.bc")
    tools["amd_lib"] = os.path.join(libclc, "amdgcn--amdhsa.bc")
    missing = [k for k in ("clang", "link", "opt", "llc", "ptxas") if tools[k] is None]
    if not os.path.exists(tools["nv_lib"]):
        missing.append("libclc's " + tools["nv_lib"] + " (apt-get install libclc-15)")
    if missing:
        return None, "missing: " + ", ".join(missing)
    return tools, None


def run(cmd):
    """stdout + stderr of cmd; raises with both on failure."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s%s" % (" ".join(cmd), done.returncode,
                                                      done.stdout, done.stderr))
    return done.stdout + done.stderr


def to_bitcode(tools, source, options, triple, cpu, lib, out):
    """source -> optimised LLVM bitcode with libclc linked in and internalised (so its
    builtins inline, as a vendor's OpenCL compiler would)."""
    front = out + ".front.bc"
    cmd = [tools["clang"], "-x", "cl", "-Xclang", "-finclude-default-header", "-target", triple,
           "-O3", "-emit-llvm", "-c", source, "-o", front] + options
    if cpu:
        cmd[1:1] = ["-mcpu=" + cpu, "-nogpulib"]
    run(cmd)
    run([tools["link"], "--internalize", "--only-needed", front, lib, "-o", out + ".linked.bc"])
    run([tools["opt"], "-O3", out + ".linked.bc", "-o", out])


def nvidia(tools, source, options, work, maxrregcount):
    """{kernel: {regs, stack, spill_st, spill_ld, smem}} from ptxas -v."""
    bc = os.path.join(work, "nv.bc")
    to_bitcode(tools, source, options, NV_TRIPLE, None, tools["nv_lib"], bc)
    ptx = os.path.join(work, "k.ptx")
    run([tools["llc"], "-O3", "-mcpu=" + NV_CPU, "-mattr=+" + NV_PTX, bc, "-o", ptx])
    cmd = [tools["ptxas"], "-v", "-arch=" + NV_ARCH, ptx, "-o", os.path.join(work, "k.cubin")]
    if maxrregcount:
        cmd[1:1] = ["--maxrregcount", str(maxrregcount)]
    kernels, current = {}, None
    for line in run(cmd).splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = kernels.setdefault(m.group(1), {})
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
                      r"loads", line)
        if m and current is not None:
            current.update(stack=int(m.group(1)), spill_st=int(m.group(2)),
                           spill_ld=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m and current is not None:
            current["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            current["smem"] = int(s.group(1)) if s else 0
    return kernels


def amd(tools, source, options, work):
    """{kernel: {vgprs, sgprs, sgpr_spill, vgpr_spill, scratch, lds}} from llc's
    kernel-resource-usage remarks."""
    bc = os.path.join(work, "amd.bc")
    to_bitcode(tools, source, options, AMD_TRIPLE, AMD_CPU, tools["amd_lib"], bc)
    text = run([tools["llc"], "-O3", "-mcpu=" + AMD_CPU, "-filetype=obj", bc, "-o",
                os.path.join(work, "k.o"), "-pass-remarks-analysis=kernel-resource-usage"])
    keys = {"SGPRs": "sgprs", "VGPRs": "vgprs", "AGPRs": "agprs",
            "ScratchSize [bytes/lane]": "scratch", "SGPRs Spill": "sgpr_spill",
            "VGPRs Spill": "vgpr_spill", "LDS Size [bytes/block]": "lds",
            "Occupancy [waves/SIMD]": "occupancy"}
    kernels, current = {}, None
    for line in text.splitlines():
        m = re.search(r"remark: .*?:\s+(Function Name|[A-Za-z][A-Za-z /\[\]]*?): (\S+)$", line)
        if not m:
            continue
        if m.group(1) == "Function Name":
            current = kernels.setdefault(m.group(2), {})
        elif current is not None and m.group(1) in keys:
            current[keys[m.group(1)]] = int(m.group(2))
    return kernels


def parse_variants(path):
    variants = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if "\t" not in line:
                sys.exit("%s:%d: expected FILE<TAB>OPTIONS" % (path, number))
            file, options = line.split("\t", 1)
            variants.append((file, options.split()))
    return variants


def parse_budgets(path):
    """[(pattern, nv_regs, nv_stack, nv_spills, amd_vgprs, amd_spills)]; '-' = unchecked."""
    budgets = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) != 6 or fields[3] not in ("none", "allowed") or \
                    fields[5] not in ("none", "allowed", "-"):
                sys.exit("%s:%d: expected PATTERN NV_REGS NV_STACK none|allowed AMD_VGPRS "
                         "none|allowed|-" % (path, number))
            num = [None if v == "-" else int(v) for v in (fields[1], fields[2], fields[4])]
            budgets.append((fields[0], num[0], num[1], fields[3], num[2], fields[5]))
    return budgets


def measure(tools, kernel_dir, file, options, maxrregcount, with_amd):
    with tempfile.TemporaryDirectory(prefix="clattn-res-") as work:
        source = os.path.join(work, "program.cl")
        with open(source, "w") as out:
            for name in PRELUDE + BASES.get(file, ()) + (file,):
                with open(os.path.join(kernel_dir, name)) as f:
                    out.write(f.read())
        nv = nvidia(tools, source, options, work, maxrregcount)
        am, why = {}, None
        if with_amd:
            try:
                am = amd(tools, source, options, work)
            except RuntimeError as e:
                why = str(e).splitlines()[-1]
        return nv, am, why


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=os.path.join(here, "variants.txt"),
                    help="FILE<TAB>OPTIONS per line (capture.sh writes it)")
    ap.add_argument("--budgets", default=os.path.join(here, "budgets.txt"),
                    help="the budget lines the kernels are held to")
    ap.add_argument("--table", help="write the markdown table here")
    ap.add_argument("--kernels", default=os.path.join(root, "kernels"),
                    help="the folder of .cl sources (default: the repository's kernels/)")
    ap.add_argument("--maxrregcount", type=int, default=0,
                    help="pass --maxrregcount N to ptxas (to check that a spill fails)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="variants compiled at once (default 2)")
    ap.add_argument("--no-amd", action="store_true", help="NVIDIA (ptxas) only")
    args = ap.parse_args()

    tools, why = find_tools()
    if tools is None:
        print("resources: SKIPPED (%s): this lane needs clang-15, llvm-15, libclc-15 and the "
              "CUDA toolkit's ptxas" % why)
        return SKIP
    variants = parse_variants(args.variants)
    budgets = parse_budgets(args.budgets)
    with_amd = not args.no_amd and os.path.exists(tools["amd_lib"])
    if not with_amd:
        print("resources: AMD columns left out (%s)" %
              ("--no-amd" if args.no_amd else "no " + tools["amd_lib"]))
    # Options every variant shares (the context's, host/core/tuning.c) are printed once; the
    # table names each variant by the rest.
    # (With one variant there is nothing to compare: only -cl-* options count as shared.)
    shared = set(variants[0][1]) if variants else set()
    for _, options in variants:
        shared &= set(options)
    if len(variants) < 2:
        shared = {o for o in shared if o.startswith("-cl-")}
    shared_list = [o for o in variants[0][1] if o in shared] if variants else []

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(measure, tools, args.kernels, f, o, args.maxrregcount, with_amd)
                   for f, o in variants]
        results = []
        failures = 0
        for (file, options), fut in zip(variants, futures):
            try:
                results.append(fut.result())
            except RuntimeError as e:
                print("resources: FAILED to compile %s %s:\n%s" % (file, " ".join(options), e))
                results.append(None)
                failures += 1

    rows, amd_notes = [], set()
    for (file, options), result in zip(variants, results):
        if result is None:
            continue  # a compile failure, counted above
        nv, am, why = result
        extra = " ".join(o[2:] if o.startswith("-D") else o for o in options if o not in shared)
        if why:
            amd_notes.add(why)
        if not nv:
            print("resources: FAILED: no kernel entry in ptxas's report for %s %s" %
                  (file, " ".join(options)))
            failures += 1
        for kernel in sorted(nv):
            name = "%s:%s %s" % (file, kernel, extra)
            n, a = nv[kernel], am.get(kernel, {})
            budget = next((b for b in budgets if fnmatch.fnmatchcase(name, b[0])), None)
            problems = []
            if budget is None:
                problems.append("no budget line matches")
            else:
                _, regs, stack, spills, vgprs, amd_spills = budget
                if regs is not None and n["regs"] > regs:
                    problems.append("%d registers > budget %d" % (n["regs"], regs))
                if stack is not None and n["stack"] > stack:
                    problems.append("%d B stack > budget %d" % (n["stack"], stack))
                if spills == "none" and (n["spill_st"] or n["spill_ld"]):
                    problems.append("spills %d/%d B, budget none" % (n["spill_st"],
                                                                       n["spill_ld"]))
                if a and vgprs is not None and a["vgprs"] > vgprs:
                    problems.append("AMD %d VGPRs > budget %d" % (a["vgprs"], vgprs))
                if a and amd_spills == "none" and a.get("vgpr_spill", 0):
                    problems.append("AMD %d VGPR spills, budget none" % a["vgpr_spill"])
            failures += bool(problems)
            rows.append((name, n, a, budget, problems))

    date = datetime.date.today().isoformat()
    ptxas_version = run([tools["ptxas"], "--version"]).strip().splitlines()[-1]
    clang_version = run([tools["clang"], "--version"]).splitlines()[0]
    lines = [
        "# GPU kernel resources (ptxas proxy)",
        "",
        "Measured %s by `tests/resources/run.sh`%s: %s + libclc (`-target %s`, "
        "`-mcpu=%s`, PTX %s) then `ptxas -v -arch=%s` (%s); AMD: the same bitcode path for "
        "`%s -mcpu=%s`, llc's kernel-resource-usage remarks." %
        (date, " with `--maxrregcount %d`" % args.maxrregcount if args.maxrregcount else "",
         clang_version, NV_TRIPLE, NV_CPU, NV_PTX[3] + "." + NV_PTX[4:], NV_ARCH,
         ptxas_version, AMD_TRIPLE, AMD_CPU),
        "",
        "Options every variant shares: `%s`" % " ".join(shared_list),
        "",
        "NV: registers per thread, stack frame (bytes per thread: private arrays placed in "
        "local memory, plus spills), spill stores/loads (bytes), shared memory (bytes per "
        "block). AMD: VGPRs (+ spilled to scratch), SGPRs (+ spilled to VGPR lanes), scratch "
        "(bytes per lane: private arrays and VGPR spills), LDS "
        "(bytes per block), occupancy (waves per SIMD). Budget: tests/resources/budgets.txt "
        "(registers, stack, spills allowed).",
        "",
        "| kernel variant | NV regs | NV stack | NV spill st/ld | NV smem | AMD VGPR | AMD SGPR "
        "| AMD scratch | AMD LDS | AMD waves | budget (regs/stack/spill) | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, n, a, budget, problems in rows:
        def b(v):
            return "-" if v is None else str(v)
        amd_cells = ["-"] * 5
        if a:
            amd_cells = ["%d (+%d spilled)" % (a.get("vgprs", 0), a["vgpr_spill"])
                         if a.get("vgpr_spill") else str(a.get("vgprs", "?")),
                         "%d (+%d)" % (a.get("sgprs", 0), a.get("sgpr_spill", 0))
                         if a.get("sgpr_spill") else str(a.get("sgprs", "?")),
                         str(a.get("scratch", "?")), str(a.get("lds", "?")),
                         str(a.get("occupancy", "?"))]
        lines.append("| `%s` | %d | %d | %d/%d | %d | %s | %s | %s |" % (
            name, n["regs"], n["stack"], n["spill_st"], n["spill_ld"], n["smem"],
            " | ".join(amd_cells),
            "%s/%s/%s" % (b(budget[1]), b(budget[2]), budget[3]) if budget else "none",
            "**FAIL: %s**" % "; ".join(problems) if problems else "ok"))
    for note in sorted(amd_notes):
        lines += ["", "AMD compile failed for some variants: " + note]
    table = "\n".join(lines) + "\n"
    print(table)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table)
    kernels = len(rows)
    print("resources: %d kernels of %d variants, %d over budget or failed" %
          (kernels, len(variants), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
