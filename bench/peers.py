#!/usr/bin/env python3
"""clattn against its peers on one machine, in one run, on the same sizes (issue 10).

Times, with 2 threads for every peer (--threads):
  clattn    `clattn bench --json` (OpenCL profiling time; --clattn or $CLATTN_BIN);
  PyTorch   torch.nn.functional.scaled_dot_product_attention, nn.MultiheadAttention (eval,
            no_grad, need_weights=False, batch_first=True), torch.mm, Tensor.copy_;
            torch.set_num_threads(2);
  numpy     a @ b on OpenBLAS (OPENBLAS_NUM_THREADS=2), np.copyto;
  CLBlast   SGEMM on the same PoCL device (bench/peer_clblast, CMake -DCLATTN_BENCH_CLBLAST=ON;
            --clblast or $CLBLAST_BENCH), with the parameters of CLBlast's own tuner when
            --clblast-tuned names the folder of its JSON files (see bench/peers.sh); every
            size on both CLBlast paths (XgemmDirect, and Xgemm with its pad/transpose
            helpers, forced through GemmRoutine's XGEMM_MIN_INDIRECT_SIZE), the faster kept,
            which is the choice CLBlast's routine tuner makes by timing both.
Prints one markdown table (sizes, rates, ours/peer, the issue's target and whether it is met),
the growth exponents over L (least squares of log time on log L) with a flag on any pair of
neighbouring sizes whose local exponent is more than 0.25 from the expected one, and the
machine, versions, threads and load average. Progress goes to stderr.

Rates: attention 4·B·H·Lq·Lk·d (causal and masked counted the same as unmasked, as is
conventional when comparing with peers), MHA 8·B·L·E² + 4·B·L²·E, matmul 2·M·N·K: the
definitions of `clattn bench`, whose own rates are used for clattn. Softmax: clattn bench's
GB/s (4·B·H·Lq·Lk·4 bytes of score traffic over the unfused attention plan that returns the
weights; see `clattn bench --help`) against the copy bandwidth (bytes read + written).

Run through bench/peers.sh (it sets the thread variables before numpy and torch load):
    bench/peers.sh [--quick] [--runs N] [--clattn build/clattn] [--clblast build/peer_clblast]
                   [--clblast-tuned DIR] [--only attention,gqa,alibi,mha,matmul,softmax,
                   bahdanau]
                   [--markdown FILE] [--json FILE] [--no-torch]
Needs: numpy and threadpoolctl (else no numpy column), torch (else no PyTorch column); the
virtual environment bench/peers.sh uses is /work/venv-peers (PEERS_VENV). Not part of CI.
"""
import argparse
import glob
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time

from timing import median_time  # bench/timing.py, next to this script


def log(message):
    print(f"peers: {message}", file=sys.stderr, flush=True)


# --- sizes ----------------------------------------------------------------------------------

def plan(quick):
    """The cases: (group, key, clattn bench arguments) per clattn invocation, and the peers'
    sizes derive from the same keys."""
    if quick:
        attn_l = [512, 1024, 2048]
        attn_extra_l = [1024]
        mha = [(512, 1, [512, 1024])]
        mm = [(1024, 1024, 1024), (4096, 1536, 512), (4096, 64, 4096), (4096, 4096, 64)]
        proj_l = [512, 1024, 2048]
        softmax_l = 2048
    else:
        attn_l = [512, 1024, 2048, 4096, 8192]
        attn_extra_l = attn_l
        mha = [(e, b, [512, 1024, 2048, 4096]) for e in (512, 1024) for b in (1, 4)]
        mm = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 1536, 512), (4096, 64, 4096),
              (4096, 4096, 64)]
        proj_l = [512, 1024, 2048, 4096]
        softmax_l = 4096
    attention = [  # (variant, head_dim, causal, mask, L list)
        ("plain", 64, False, "none", attn_l),
        ("causal", 64, True, "none", attn_l),
        ("d128", 128, False, "none", attn_extra_l),
        ("padding", 64, False, "padding", attn_extra_l),
        ("additive", 64, False, "additive", attn_extra_l),
    ]
    # Grouped-query attention (group "gqa", not in the default --only): k/v with 2 heads (4
    # query heads each), and multi-query (1 k/v head), against torch's enable_gqa=True.
    gqa = [  # (variant, head_dim, causal, mask, L list, kv heads)
        ("gqa kv=2", 64, False, "none", attn_extra_l, 2),
        ("gqa kv=2 causal", 64, True, "none", attn_extra_l, 2),
        ("mqa kv=1", 64, False, "none", attn_extra_l, 1),
    ]
    attention = [a + (8,) for a in attention] + [("gqa",) + g for g in gqa]
    # ALiBi (group "alibi", not in the default --only): clattn's slopes in the score rule
    # against torch with the same biases as a float mask (causal folded in: torch takes
    # attn_mask or is_causal, not both), as models without a fused ALiBi kernel run it.
    attention += [("alibi", "alibi causal", 64, True, "alibi", attn_extra_l, 8)]
    # The projection shape over L: x (L, E) · W_inᵀ (E, 3E), E = 512 (expected exponent 1).
    proj = [(l, 1536, 512) for l in proj_l]
    return attention, mha, mm, proj, softmax_l


TARGETS = {  # (peer, minimum ours/peer)
    "attention plain": ("torch", 1.3),
    "attention causal": ("torch", 1.5),
    "attention d128": ("torch", 1.0),
    "attention padding": ("torch", 1.0),
    "attention additive": ("torch", 1.0),
}


def last_level_cache():
    """The largest CPU cache in bytes (sysfs), or 32 MiB where sysfs does not say."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        with open(path) as f:
            text = f.read().strip()
        scale = {"K": 1024, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes) if sizes else 32 << 20


# --- clattn ---------------------------------------------------------------------------------

def run_clattn(binary, args, runs, warmup):
    command = [binary, "bench", "--json", "--runs", str(runs), "--warmup", str(warmup)] + args
    log("$ " + " ".join(command))
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=None, text=True)
    if done.returncode != 0:
        raise SystemExit(f"peers: clattn bench failed ({done.returncode}): {' '.join(command)}")
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    for line in lines:
        if "refused" in line:
            log(f"clattn refused {line}")
    return [line for line in lines if "refused" not in line]


def clattn_rate(line):
    return line.get("gflops", line.get("gbps"))


# --- peers ----------------------------------------------------------------------------------

def torch_sdpa(t):
    """torch's scaled_dot_product_attention; before torch 2.0 (Debian 12's python3-torch is
    1.13) the same function composed of matmul and softmax, as users of those versions wrote
    it (slower than the fused op: ratios against it are not comparable with 2.x peers)."""
    fused = getattr(t.nn.functional, "scaled_dot_product_attention", None)
    if fused is not None:
        return fused

    def composed(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False):
        if k.shape[1] != q.shape[1]:  # grouped-query: each k/v head serves a group
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        s = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
        if is_causal:
            lq, lk = s.shape[-2], s.shape[-1]
            s = s.masked_fill(t.ones(lq, lk, dtype=t.bool).triu(1), float("-inf"))
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == t.bool \
                else s + attn_mask
        return t.softmax(s, -1) @ v

    return composed


def median_ms(fn, runs, warmup):
    return median_time(fn, runs, warmup)


class Torch:
    def __init__(self, threads):
        import torch
        self.torch = torch
        torch.set_num_threads(threads)
        torch.manual_seed(0)

    def rand(self, *shape):
        return self.torch.rand(*shape, dtype=self.torch.float32) * 2 - 1

    def settle(self):
        time.sleep(0.3)  # let OpenMP workers stop spinning before the next timed program

    def sdpa(self, l, d, causal, mask, runs, warmup, kv_heads=8):
        t = self.torch
        q, k, v = self.rand(1, 8, l, d), self.rand(1, kv_heads, l, d), self.rand(1, kv_heads, l, d)
        gqa = {"enable_gqa": True} if kv_heads != 8 else {}
        attn_mask = None
        if mask == "alibi":  # the paper's slopes for 8 heads, -m|i - j|, -inf past the row
            slopes = t.tensor([2.0 ** -(h + 1) for h in range(8)]).reshape(8, 1, 1)
            pos = t.arange(l)
            attn_mask = -slopes * (pos.reshape(l, 1) - pos.reshape(1, l)).abs().float()
            if causal:
                attn_mask = attn_mask.masked_fill(pos.reshape(1, l) > pos.reshape(l, 1),
                                                  float("-inf"))
            attn_mask = attn_mask.reshape(1, 8, l, l)
            causal = False
        elif mask == "padding":  # True = takes part; the last l/8 keys are padding (as clattn)
            attn_mask = (t.arange(l) < l - l // 8).reshape(1, 1, 1, l)
        elif mask == "additive":
            attn_mask = self.rand(l, l)
        f = torch_sdpa(t)
        with t.inference_mode():
            return median_ms(lambda: f(q, k, v, attn_mask=attn_mask, is_causal=causal, **gqa),
                             runs, warmup)

    def decode(self, length, runs, warmup, heads=32, kv_heads=8, d=128):
        """One decode step as clattn bench --op decode times it: the new token's key and value
        written into a preallocated cache at position length - 1, then one query row per head
        over the cache's first `length` keys (grouped-query, enable_gqa)."""
        t = self.torch
        k_cache, v_cache = self.rand(1, kv_heads, length, d), self.rand(1, kv_heads, length, d)
        k_new, v_new = self.rand(1, kv_heads, 1, d), self.rand(1, kv_heads, 1, d)
        q = self.rand(1, heads, 1, d)
        f = torch_sdpa(t)

        def step():
            k_cache[:, :, length - 1:length] = k_new
            v_cache[:, :, length - 1:length] = v_new
            return f(q, k_cache[:, :, :length], v_cache[:, :, :length],
                     enable_gqa=kv_heads != heads)

        with t.inference_mode():
            return median_ms(step, runs, warmup)

    def bahdanau(self, l, e, heads, da, runs, warmup, chunk=64):
        """Additive self-attention as clattn bench --op additive runs it, written the way PyTorch
        users do (there is no torch op): P1 = x W1 + b1, P2 = x W2 + b2, then per block of
        `chunk` query rows the broadcast tanh(P1_i + P2_j) (block, L, da) tensor contracted
        with w (einsum: at L = 512 it measured 0.11 Gterm/s against 0.07-0.09 for `@ w` or
        `(t * w).sum(-1)`), softmax, times the head's columns of x (blocks keep the tensor
        to 8 * 64 * L * 64 floats)."""
        t = self.torch
        x = self.rand(1, l, e)
        w1, w2 = self.rand(e, heads * da) / e ** 0.5, self.rand(e, heads * da) / e ** 0.5
        b1, b2, w = self.rand(heads * da), self.rand(heads * da), self.rand(heads, da)

        def forward():
            p1 = (x @ w1 + b1).view(1, l, heads, da).transpose(1, 2)
            p2 = (x @ w2 + b2).view(1, l, heads, da).transpose(1, 2)
            v = x.view(1, l, heads, e // heads).transpose(1, 2)
            outs = []
            for i in range(0, l, chunk):
                s = t.einsum("bhijc,hc->bhij",
                             t.tanh(p1[:, :, i:i + chunk, None, :] + p2[:, :, None, :, :]), w)
                outs.append(t.softmax(s, -1) @ v)
            return t.cat(outs, 2)

        with t.inference_mode():
            return median_ms(forward, runs, warmup)

    def mha(self, e, b, l, runs, warmup):
        t = self.torch
        module = t.nn.MultiheadAttention(e, 8, batch_first=True).eval()
        x = self.rand(b, l, e)
        with t.inference_mode():
            return median_ms(lambda: module(x, x, x, need_weights=False), runs, warmup)

    def mm(self, m, n, k, runs, warmup):
        a, b = self.rand(m, k), self.rand(k, n)
        with self.torch.inference_mode():
            return median_ms(lambda: self.torch.mm(a, b), runs, warmup)

    def copy(self, count, runs, warmup):
        src, dst = self.rand(count), self.torch.empty(count)
        return median_ms(lambda: dst.copy_(src), runs, warmup)


class Numpy:
    def __init__(self):
        import numpy as np
        self.np = np
        self.rng = np.random.default_rng(0)

    def rand(self, *shape):
        return self.rng.uniform(-1, 1, shape).astype(self.np.float32)

    def mm(self, m, n, k, runs, warmup):
        a, b = self.rand(m, k), self.rand(k, n)
        return median_ms(lambda: a @ b, runs, warmup)

    def copy(self, count, runs, warmup):
        src, dst = self.rand(count), self.np.empty(count, self.np.float32)
        return median_ms(lambda: self.np.copyto(dst, src), runs, warmup)


def clblast_overrides(folder):
    """The best of CLBlast's tuner JSON files (clblast_xgemm_*_32.json) in folder, as
    peer_clblast --override arguments; (args, description)."""
    best = {}
    for path in sorted(glob.glob(os.path.join(folder, "clblast_*_32.json"))):
        with open(path) as f:
            data = json.load(f)
        kernel = data.get("best_kernel") or data.get("kernel_family")
        # The tuners name the kernel family (xgemm_1, xgemm_2, ..); the parameters belong to
        # the kernel CLBlast looks up: Xgemm for every xgemm_* family.
        family = data.get("kernel_family", "")
        name = "Xgemm" if family.startswith("xgemm_") and "direct" not in family else \
               "XgemmDirect" if family.startswith("xgemm_direct") else kernel
        params = data.get("best_parameters", "")
        if isinstance(params, str):
            pairs = dict(p.split("=") for p in params.split() if "=" in p)
        else:
            pairs = {str(key): str(value) for key, value in params.items()}
        pairs.pop("PRECISION", None)
        # Files tuned at different sizes compare by rate, not time.
        flops = 2.0 * float(data.get("arg_m", 1)) * float(data.get("arg_n", 1)) * \
            float(data.get("arg_k", 1))
        score = float(data.get("best_time", "inf")) / flops
        if name not in best or score < best[name][0]:
            best[name] = (score, pairs, os.path.basename(path))
    args, notes = [], []
    for name, (score, pairs, source) in sorted(best.items()):
        args += ["--override", name + ":" + ",".join(f"{k}={v}" for k, v in sorted(pairs.items()))]
        notes.append(f"{name} from {source} ({1e-6 / score:.1f} GFLOP/s at the tuner's size): "
                     + " ".join(f"{k}={v}" for k, v in sorted(pairs.items())))
    return args, notes


def run_clblast(binary, sizes, runs, warmup, overrides):
    command = [binary, "--runs", str(runs), "--warmup", str(warmup)] + overrides + \
        [f"{m}x{n}x{k}" for m, n, k in sizes]
    log("$ " + " ".join(command[:5]) + (" --override ..." if overrides else "") + " " +
        " ".join(command[len(command) - len(sizes):]))
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if done.returncode != 0:
        log(f"peer_clblast failed ({done.returncode}): no CLBlast column")
        return {}
    out = {}
    for line in done.stdout.splitlines():
        j = json.loads(line)
        out[(j["m"], j["n"], j["k"])] = j["median_ms"]
    return out


# --- description of the machine -------------------------------------------------------------

def command_output(command):
    try:
        return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def machine(threads):
    lines = []
    lscpu = command_output(["lscpu"])
    model = re.search(r"Model name:\s*(.*)", lscpu)
    cpus = re.search(r"^CPU\(s\):\s*(\d+)", lscpu, re.M)
    flags = re.search(r"Flags:\s*(.*)", lscpu)
    isa = [f for f in ("avx2", "fma", "avx512f") if flags and f in flags.group(1).split()]
    lines.append(f"machine: {model.group(1) if model else platform.processor()}, "
                 f"{cpus.group(1) if cpus else os.cpu_count()} CPUs ({', '.join(isa)}), "
                 f"{platform.system()} {platform.release()}")
    versions = [f"Python {platform.python_version()}"]
    try:
        import numpy
        versions.append(f"numpy {numpy.__version__}")
    except ImportError:
        pass
    try:
        import torch
        versions.append(f"torch {torch.__version__} (CPU, float32"
                        + (")" if hasattr(torch.nn.functional, "scaled_dot_product_attention")
                           else "; SDPA composed of matmul and softmax: torch < 2.0)"))
    except ImportError:
        pass
    try:
        from threadpoolctl import threadpool_info
        for pool in threadpool_info():
            details = [pool.get("prefix"), pool.get("architecture"),
                       f"{pool.get('num_threads')} threads"]
            name = f"{pool.get('internal_api')} {pool.get('version') or ''}".strip()
            versions.append(f"{name} ({', '.join(str(d) for d in details if d)})")
    except ImportError:
        versions.append("threadpoolctl missing: BLAS versions unknown")
    for package in ("libclblast1", "libpocl2", "pocl-opencl-icd"):
        v = command_output(["dpkg-query", "-W", "-f", "${Version}", package]).strip()
        if v:
            versions.append(f"{package} {v}")
    lines.append("versions: " + "; ".join(versions))
    lines.append(f"threads: {threads} for every peer (torch.set_num_threads, OPENBLAS_NUM_THREADS,"
                 f" OMP_NUM_THREADS); PoCL runs on all {os.cpu_count()} CPUs "
                 f"(POCL_MAX_CPU_CU_COUNT={os.environ.get('POCL_MAX_CPU_CU_COUNT', 'unset')})")
    return lines


def loadavg():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


# --- the table ------------------------------------------------------------------------------

def ratio(ours, peer):
    return ours / peer if ours and peer else None


def fmt(value, digits=1):
    return "" if value is None else f"{value:.{digits}f}"


def fit_exponent(ls, ts):
    """Least-squares slope of log t on log L."""
    xs, ys = [math.log(l) for l in ls], [math.log(t) for t in ts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else float("nan")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer sizes, 3 runs (a few minutes on 2 cores)")
    parser.add_argument("--runs", type=int, help="timed runs per case (default 5, --quick 3)")
    # 3 untimed runs each side: on the 2-vCPU VMs a process's first PoCL launches after its
    # plan's compile run at up to half speed for a few launches (causal L = 1024: 9-14 ms, then
    # 4.8-6 ms), which one warm-up left in the median of 5
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed runs before each case's timed ones, both sides (default 3)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clattn", default=os.environ.get("CLATTN_BIN", "build/clattn"))
    parser.add_argument("--clblast", default=os.environ.get("CLBLAST_BENCH", ""),
                        help="bench/peer_clblast binary (none: no CLBlast column)")
    parser.add_argument("--clblast-tuned", default=os.environ.get("CLBLAST_TUNED", ""),
                        help="folder with CLBlast tuner JSON (clblast_xgemm_*_32.json)")
    parser.add_argument("--only", default="attention,mha,matmul,softmax",
                        help="the groups to run (comma-separated; default all but gqa: "
                             "grouped-query attention against torch's enable_gqa, alibi: "
                             "ALiBi slopes against torch with the biases as a float mask, "
                             "bahdanau: additive (Bahdanau) self-attention, B=1 H=8 E=512 "
                             "da=64, against a PyTorch implementation, "
                             "and decode: "
                             "one-token steps over a KV cache, B=1 H=32 Hkv=8 d=128, 1k-32k "
                             "keys, in tokens/s)")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--markdown", help="also write the report to this file")
    parser.add_argument("--json", help="write every measurement to this file")
    return parser.parse_args()


class Session:
    """One run's settings, peers and results: rows (dicts: group, size, unit, ours, torch,
    numpy, clblast, copy, target) and series ((name, [(L, ours ms, torch ms, flops)]))."""

    def __init__(self, args):
        self.args = args
        self.runs = args.runs or (3 if args.quick else 5)
        self.warmup = args.warmup
        self.torch = None
        if not args.no_torch:
            try:
                self.torch = Torch(args.threads)
            except ImportError:
                log("torch is not installed: no PyTorch column")
        try:
            self.numpy = Numpy()
        except ImportError:
            self.numpy = None
            log("numpy is not installed: no numpy column")
        self.rows = []
        self.series = []

    def clattn(self, arguments):
        return run_clattn(self.args.clattn, arguments, self.runs, self.warmup)

    def torch_ms(self, what, method, *sizes):
        """torch's median ms for Torch.method(*sizes, runs, warmup, ...) (None without torch),
        the machine settled after it."""
        if not self.torch:
            return None
        log(what)
        ms = getattr(self.torch, method)(*sizes)
        self.torch.settle()
        return ms


def bench_attention(run, attention):
    """Attention: fused kernel, B=1, H=8 (k/v heads kv: 8, or grouped-query)."""
    for variant, d, causal, mask, ls, kv in attention:
        extra = ["--causal"] if causal else []
        if mask == "alibi":
            extra += ["--alibi"]
        elif mask != "none":
            extra += ["--mask", mask]
        if kv != 8:
            extra += ["--kv-heads", str(kv)]
        lines = run.clattn(["--op", "attention", "--path", "fused", "--batch", "1",
                            "--heads", "8", "--head-dim", str(d), "--seq",
                            ",".join(map(str, ls))] + extra)
        points = []
        for line in lines:
            l = line["seq_q"]
            flops = 4.0 * 8 * l * l * d
            peer_ms = run.torch_ms(f"torch sdpa {variant} L={l} d={d}", "sdpa", l, d, causal,
                                   mask, run.runs, run.warmup, kv)
            run.rows.append({"group": f"attention {variant}",
                             "size": f"B=1 H=8 L={l} d={d}" + (f" Hkv={kv}" if kv != 8 else "") +
                                     (" causal" if causal else "") +
                                     (f" mask={mask}" if mask != "none" else ""),
                             "unit": "GFLOP/s", "ours": clattn_rate(line),
                             "torch": flops / peer_ms / 1e6 if peer_ms else None})
            points.append((l, line["median_ms"], peer_ms, flops))
        if len(points) > 1:
            run.series.append((f"attention {variant} (d={d})", points))


def bench_decode(run):
    """Decode steps over a KV cache (group "decode"): B=1, 8 heads at d=64 (issue 27's case),
    then 32 query heads on 8 k/v heads at d=128 (a grouped-query model's). The copy column is
    the cache read per step as a fraction of a device copy's rate (issue 27: at least 0.7
    once the cache is past the last-level cache)."""
    lengths = [1024, 4096, 16384] if run.args.quick else [1024, 2048, 4096, 8192, 16384, 32768]
    for heads, kv_heads, d in ((8, 8, 64), (32, 8, 128)):
        lines = run.clattn(["--op", "decode", "--path", "fused", "--batch", "1",
                            "--heads", str(heads), "--kv-heads", str(kv_heads),
                            "--head-dim", str(d), "--seq", ",".join(map(str, lengths))])
        for line in lines:
            length = line["cache"]
            peer_ms = run.torch_ms(f"torch decode step H={heads} Hkv={kv_heads} d={d}, cache "
                                   f"{length}", "decode", length, run.runs, run.warmup, heads,
                                   kv_heads, d)
            shape = f"H={heads}" + (f" Hkv={kv_heads}" if kv_heads != heads else "")
            run.rows.append({"group": "decode", "size": f"B=1 {shape} d={d} cache={length}",
                             "unit": "tok/s", "ours": line["tokens_per_s"],
                             "torch": 1e3 / peer_ms if peer_ms else None,
                             "cache_vs_copy": line.get("cache_vs_copy"),
                             "past_llc": 2 * length * kv_heads * d * 4 > last_level_cache(),
                             "target": ("torch", 1.0)})


def bench_bahdanau(run):
    """Additive (Bahdanau) self-attention (group "bahdanau"): B=1, H=8, E=512, da=64, fused."""
    ls = [256, 512] if run.args.quick else [256, 512, 1024, 2048]
    lines = run.clattn(["--op", "additive", "--path", "fused", "--batch", "1",
                        "--heads", "8", "--embed", "512", "--head-dim", "64",
                        "--seq", ",".join(map(str, ls))])
    for line in lines:
        l = line["seq_q"]
        terms = 8.0 * l * l * 64
        peer_ms = run.torch_ms(f"torch additive attention L={l}", "bahdanau", l, 512, 8, 64,
                               run.runs, run.warmup)
        run.rows.append({"group": "additive (Bahdanau)", "size": f"B=1 H=8 L={l} E=512 da=64",
                         "unit": "Gterm/s", "ours": line["gterms_per_s"],
                         "torch": terms / peer_ms / 1e6 if peer_ms else None})


def bench_mha(run, mha):
    """MHA forward: self-attention, packed in_proj, output projection, H = 8."""
    for e, b, ls in mha:
        lines = run.clattn(["--op", "mha", "--path", "fused", "--batch", str(b),
                            "--heads", "8", "--embed", str(e), "--seq",
                            ",".join(map(str, ls))])
        points = []
        for line in lines:
            l = line["seq_q"]
            flops = 8.0 * b * l * e * e + 4.0 * b * l * l * e
            peer_ms = run.torch_ms(f"torch mha E={e} B={b} L={l}", "mha", e, b, l, run.runs,
                                   run.warmup)
            run.rows.append({"group": "mha", "size": f"B={b} H=8 L={l} E={e}",
                             "unit": "GFLOP/s", "ours": clattn_rate(line),
                             "torch": flops / peer_ms / 1e6 if peer_ms else None,
                             "target": ("torch", 1.5 if l >= 1024 else 1.0)})
            points.append((l, line["median_ms"], peer_ms, flops))
        if len(points) > 1:
            run.series.append((f"mha E={e} B={b}", points))


def clblast_times(run, mm):
    """CLBlast's ms per matmul size and notes on how they were taken. CLBlast picks its
    direct kernel (XgemmDirect) below XGEMM_MIN_INDIRECT_SIZE³ and the tuned Xgemm (with
    pad/transpose helpers) above; its routine tuner sets that threshold by timing both. We
    time both paths at every size and keep the faster."""
    args = run.args
    overrides = []
    if args.clblast_tuned:
        overrides, notes = clblast_overrides(args.clblast_tuned)
        if not overrides:
            notes = [f"no tuner JSON in {args.clblast_tuned}: built-in parameters"]
    else:
        notes = ["built-in parameters (no --clblast-tuned)"]
    paths = {"indirect (Xgemm)": ["--override", "GemmRoutine:XGEMM_MIN_INDIRECT_SIZE=0"],
             "direct (XgemmDirect)": ["--override",
                                      "GemmRoutine:XGEMM_MIN_INDIRECT_SIZE=1000000"]}
    best = {}
    for path, force in paths.items():
        log(f"CLBlast SGEMM, {path}")
        for size, ms in run_clblast(args.clblast, mm, run.runs, run.warmup,
                                    overrides + force).items():
            if size not in best or ms < best[size][0]:
                best[size] = (ms, path)
    notes.append("each size on both CLBlast paths, the faster kept: " + ", ".join(
        f"{m}x{n}x{k} {path}" for (m, n, k), (_, path) in best.items()))
    return {size: ms for size, (ms, _) in best.items()}, notes


def bench_matmul(run, mm, proj):
    """Matmul, and the projection shape over L; returns CLBlast's notes."""
    all_mm = mm + [s for s in proj if s not in mm]
    lines = [] if not all_mm else run.clattn(["--op", "matmul", "--mnk",
                                              ",".join(f"{m}x{n}x{k}" for m, n, k in all_mm)])
    ours_mm = {(j["m"], j["n"], j["k"]): j for j in lines}
    clblast_ms, clblast_notes = {}, []
    if run.args.clblast and mm:
        clblast_ms, clblast_notes = clblast_times(run, mm)
    proj_points = []
    for m, n, k in all_mm:
        line = ours_mm.get((m, n, k))
        if line is None:
            continue
        flops = 2.0 * m * n * k
        t_ms = run.torch_ms(f"torch mm {m}x{n}x{k}", "mm", m, n, k, run.runs, run.warmup)
        n_ms = None
        if run.numpy:
            log(f"numpy matmul {m}x{n}x{k}")
            n_ms = run.numpy.mm(m, n, k, run.runs, run.warmup)
        if (m, n, k) in mm:
            c_ms = clblast_ms.get((m, n, k))
            run.rows.append({"group": "matmul", "size": f"{m} x {n} x {k}", "unit": "GFLOP/s",
                             "ours": clattn_rate(line),
                             "torch": flops / t_ms / 1e6 if t_ms else None,
                             "numpy": flops / n_ms / 1e6 if n_ms else None,
                             "clblast": flops / c_ms / 1e6 if c_ms else None})
        if (m, n, k) in proj:
            proj_points.append((m, line["median_ms"], t_ms, flops))
    if len(proj_points) > 1:
        run.series.append(("matmul L x 1536 x 512 (projection)", sorted(proj_points)))
    return clblast_notes


def bench_softmax(run, softmax_l, wanted):
    """Softmax against the copy bandwidth at 8 x L x L floats: returns (copies: name -> GB/s,
    the highest as (name, GB/s) or None, whether clattn gave the step's own time)."""
    softmax_lines = [] if not wanted else run.clattn(["--op", "softmax", "--batch", "1",
                                                      "--heads", "8", "--seq", str(softmax_l)])
    count = 8 * softmax_l * softmax_l
    copies = {}
    # Newer clattn bench lines carry the softmax step alone ("step_gbps": the device time of
    # the plan's own softmax_rows launch, from its profiling event, over 2·B·H·L²·4 bytes) and
    # a device copy of the scores ("copy_gbps").
    step = [j for j in softmax_lines if j.get("step_gbps") is not None]
    for j in softmax_lines:
        if j.get("copy_gbps"):
            copies["clEnqueueCopyBuffer on the device"] = j["copy_gbps"]
    if run.numpy and softmax_lines:
        log("numpy copy")
        ms = run.numpy.copy(count, run.runs, run.warmup)
        copies["numpy copyto (1 thread)"] = 2 * 4 * count / ms / 1e6
    if run.torch and softmax_lines:
        log("torch copy_")
        ms = run.torch.copy(count, run.runs, run.warmup)
        copies[f"torch copy_ ({run.args.threads} threads)"] = 2 * 4 * count / ms / 1e6
    reference = max(copies.items(), key=lambda kv: kv[1]) if copies else None
    for line in softmax_lines:
        run.rows.append({"group": "softmax", "size": f"8 x {softmax_l} x {softmax_l}" +
                         (" (step)" if step else " (whole unfused plan)"), "unit": "GB/s",
                         "ours": line["step_gbps"] if step else clattn_rate(line),
                         "copy": reference[1] if reference else None})
    return copies, reference, bool(step)


def report_header(run, started, loads, clblast_notes, softmax):
    """The report's title and its list of the machine, devices, loads and definitions."""
    args = run.args
    copies, reference, step = softmax
    out = [f"clattn vs peers, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}"
           f"{' (--quick)' if args.quick else ''}: median of {run.runs} runs after "
           f"{args.warmup} warm-up, one run back to back", ""]
    for line in machine(args.threads):
        out.append(f"- {line}")
    listing = command_output([args.clattn, "devices"]).splitlines()
    used = [i for i, line in enumerate(listing) if line.startswith("* ")]
    if used:  # the device clattn uses, and its platform (the nearest line above it)
        platform_line = next((listing[i] for i in range(used[0], -1, -1)
                              if listing[i].startswith("platform")), "")
        out.append(f"- clattn: {args.clattn} on {listing[used[0]][2:].strip()}, "
                   f"{platform_line.strip()}")
    out.append("- CLBlast: " + ("; ".join(clblast_notes) if args.clblast else "not run"))
    out.append(f"- load average (1, 5, 15 min) at start {loads[0]}, at end {loads[1]}")
    if reference:
        out.append("- copy reference (bytes read + written): " +
                   ", ".join(f"{k} {v:.1f} GB/s" for k, v in copies.items()) +
                   f"; the softmax ratio uses the highest ({reference[0]}). clattn's softmax: " +
                   ("the step alone (the softmax_rows kernel's own device time, from its "
                    "profiling event, over 2·B·H·L²·4 bytes)" if step else
                    "this clattn bench has no step time: the whole unfused plan's rate "
                    "(4·B·H·L²·4 bytes over products and softmax)"))
    out.append("- flops: attention 4·B·H·L²·d (causal and masked counted as full), "
               "MHA 8·B·L·E² + 4·B·L²·E, matmul 2·M·N·K (M x N x K: A is M x K)")
    return out


def row_target(r):
    """A row's target as text and its checks: [ratio, minimum, ...] pairs."""
    target = r.get("target") or TARGETS.get(r["group"])
    if r["group"] == "matmul":
        return "0.9x numpy, 3x CLBlast", [ratio(r["ours"], r.get("numpy")), 0.9,
                                          ratio(r["ours"], r.get("clblast")), 3.0]
    if r["group"] == "softmax":
        return "0.8x copy", [ratio(r["ours"], r.get("copy")), 0.8]
    if r["group"] == "decode":
        # 1.0x torch; past the last-level cache also 0.7 of the device's copy rate
        copy = r.get("cache_vs_copy")
        target_text = "1.0x torch" + (", 0.7x copy" if r["past_llc"] else "") + (
            f" (cache read {copy:.2f}x copy)" if copy is not None else "")
        checks = [ratio(r["ours"], r.get("torch")), 1.0]
        if r["past_llc"]:
            checks += [r.get("cache_vs_copy"), 0.7]
        return target_text, checks
    target_text = f"{target[1]}x {target[0]}" if target else ""
    return target_text, [ratio(r["ours"], r.get(target[0])), target[1]] if target else []


def report_row(r):
    """One row of the results table."""
    target_text, checks = row_target(r)
    verdicts = []
    names = (["numpy", "CLBlast"] if r["group"] == "matmul" else
             ["torch", "copy"] if r["group"] == "decode" else [""])
    for i in range(0, len(checks), 2):
        if checks[i] is not None:
            verdict = "yes" if checks[i] >= checks[i + 1] else "**no**"
            verdicts.append(f"{names[i // 2]}: {verdict}" if names[i // 2] else verdict)
    met = ", ".join(verdicts) if verdicts else "n/a"
    unit = "GB/s" if r["unit"] == "GB/s" else ""
    peer_copy = r.get("copy")
    return (f"| {r['group']} | {r['size']} | {fmt(r['ours'])}{' ' + unit if unit else ''} "
            f"| {fmt(r.get('torch'))} | {fmt(ratio(r['ours'], r.get('torch')), 2)} "
            f"| {fmt(r.get('numpy'))} | {fmt(ratio(r['ours'], r.get('numpy')), 2)} "
            f"| {fmt(r.get('clblast'))} | {fmt(ratio(r['ours'], r.get('clblast')), 2)} "
            f"| {target_text}"
            + (f" ({fmt(peer_copy)} GB/s: {fmt(ratio(r['ours'], peer_copy), 2)}x)"
               if peer_copy else "") + f" | {met} |")


def report_series(name, points):
    """One row of the growth table: the fitted exponents and the flagged neighbours."""
    ls = [p[0] for p in points]
    ours = fit_exponent(ls, [p[1] for p in points])
    theirs = fit_exponent(ls, [p[2] for p in points]) if all(p[2] for p in points) else None
    expected = fit_exponent(ls, [p[3] for p in points])
    local, flags = [], []
    for (l0, t0, _, f0), (l1, t1, _, f1) in zip(points, points[1:]):
        e = math.log(t1 / t0) / math.log(l1 / l0)
        want = math.log(f1 / f0) / math.log(l1 / l0)
        local.append(f"{l0}-{l1}: {e:.2f}")
        if abs(e - want) > 0.25:
            flags.append(f"{l0}-{l1} ({e:.2f} vs {want:.2f})")
    return (f"| {name} | {', '.join(map(str, ls))} | {ours:.2f} | {fmt(theirs, 2)} "
            f"| {expected:.2f} | {'; '.join(local)} | {'; '.join(flags) or 'none'} |")


def report(run, header):
    """The whole markdown report: the header, the results table and the growth table."""
    out = header + ["", "| op | size | clattn | torch | clattn/torch | numpy | clattn/numpy "
                    "| CLBlast | clattn/CLBlast | target | met |",
                    "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    out += [report_row(r) for r in run.rows]
    out.append("")
    out.append("Rates in GFLOP/s unless marked. Growth over L: least-squares exponent of log "
               "time on log L; expected = the exponent the flop count implies (2 for attention, "
               "1 for the projection, between for MHA); a local exponent (between neighbouring "
               "sizes) more than 0.25 from the expected one is flagged.")
    out.append("")
    out.append("| series | L | clattn exponent | torch exponent | expected | local (clattn) "
               "| flagged |")
    out.append("|---|---|---:|---:|---:|---|---|")
    out += [report_series(name, points) for name, points in run.series]
    return "\n".join(out)


def main():
    args = parse_args()
    started = time.time()
    load_start = loadavg()
    log(f"load average at start: {load_start}")
    if not shutil.which(args.clattn) and not os.path.exists(args.clattn):
        raise SystemExit(f"peers: no clattn binary at '{args.clattn}' (--clattn, CLATTN_BIN)")
    run = Session(args)

    attention, mha, mm, proj, softmax_l = plan(args.quick)
    only = set(args.only.split(","))
    if only - {"attention", "gqa", "alibi", "mha", "matmul", "softmax", "decode", "bahdanau"}:
        raise SystemExit(f"peers: --only: unknown group in '{args.only}'")
    attention = [a[1:] for a in attention if a[0] in ("gqa", "alibi") and a[0] in only] + \
                [a for a in attention if a[0] not in ("gqa", "alibi") and "attention" in only]
    mha = mha if "mha" in only else []
    if "matmul" not in only:
        mm, proj = [], []

    bench_attention(run, attention)
    if "decode" in only:
        bench_decode(run)
    if "bahdanau" in only:
        bench_bahdanau(run)
    bench_mha(run, mha)
    clblast_notes = bench_matmul(run, mm, proj)
    softmax = bench_softmax(run, softmax_l, "softmax" in only)

    load_end = loadavg()
    log(f"load average at end: {load_end} ({time.time() - started:.0f} s)")
    text = report(run, report_header(run, started, (load_start, load_end), clblast_notes,
                                     softmax))
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": run.rows, "series": run.series,
                       "load": [load_start, load_end]}, f, indent=1)

if __name__ == "__main__":
    main()
