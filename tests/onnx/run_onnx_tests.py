#!/usr/bin/env python3
"""ONNX's own Attention and RotaryEmbedding node tests, run through `clattn sdpa` and `clattn rope`.

The `onnx` package generates its node tests from onnx/backend/test/case/node/attention.py
(each `expect(node, inputs, outputs, name)`); collect_testcases("Attention") returns them with
their model (the node and its attributes) and data (inputs, expected outputs). Every distinct
test (the `_expanded` twins run the same data through the function body, so they are left out)
is written to .npy files, run with `clattn sdpa` on each path, and its outputs compared with
ONNX's expected ones.

    python tests/onnx/run_onnx_tests.py --clattn build/clattn [--operator Attention]
        [--paths fused,unfused] [--only SUBSTRING] [--min-pass N] [--list] [--keep DIR]
        [--wrap CMD] [--fail-on REGEX] [--jobs N]

--operator RotaryEmbedding runs that operator's 8 node tests through `clattn rope` (one path:
the rotary kernel has no other).

--wrap runs clattn under a command (the Oclgrind lane: "oclgrind --data-races --check-api");
--fail-on fails a test whose clattn wrote a line matching REGEX to stderr, whatever its exit
status (Oclgrind's reports); --jobs runs that many tests at once.

A test is one of
    PASS         every output of every path of the expected output's dtype (ONNX: Y and
                 qk_matmul_output of Q's type, present_key/present_value of K's/V's) and within
                 tolerance (float32 rtol 1e-3, atol 1e-5;
                 float16 inputs rtol 1e-2, atol 2e-3; bfloat16 rtol 4e-2, atol 2e-2: ONNX's
                 expected values are themselves rounded to those types at several steps)
    FAIL         an output differs, or clattn crashed or exited 1 (a device or library failure)
    UNSUPPORTED  clattn refused it (exit 2: an input or attribute it cannot express yet), or the
                 runner has no flag for an input/attribute; the reason is printed
The exit status is 1 when any test FAILED or fewer than --min-pass tests passed.
Needs numpy and onnx (tests/onnx/requirements.txt; .ci runs it in a virtual environment).
"""
import argparse
import concurrent.futures
import os
import re
import shlex
import subprocess
import sys
import tempfile
import warnings

import numpy as np

INPUTS = ["Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]
OUTPUTS = ["Y", "present_key", "present_value", "qk_matmul_output"]
OPERATORS = {  # operator: (input names, output names, the input whose dtype the outputs take)
    "Attention": (INPUTS, OUTPUTS, "Q"),
    "RotaryEmbedding": (["input", "cos_cache", "sin_cache", "position_ids"], ["output"],
                        "input"),
}


def collect(operator="Attention"):
    warnings.simplefilter("ignore")  # other operators' generators warn on import
    from onnx import helper, numpy_helper
    from onnx.backend.test.case.node import collect_testcases

    input_names, output_names, _ = OPERATORS[operator]
    cases = []
    for case in collect_testcases(operator):
        if case.name.endswith("_expanded"):
            continue
        node = case.model.graph.node[0]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        inputs, outputs = case.data_sets[0]
        to_array = lambda t: t if isinstance(t, np.ndarray) else numpy_helper.to_array(t)
        named_in = {}
        present_inputs = [n for n in node.input]
        arrays = [to_array(t) for t in inputs]
        # data_sets hold the inputs the node names, in order, skipping empty names
        it = iter(arrays)
        for position, name in enumerate(present_inputs):
            if name:
                named_in[input_names[position]] = next(it)
        named_out = {}
        it = iter([to_array(t) for t in outputs])
        for position, name in enumerate(node.output):
            if name:
                named_out[output_names[position]] = next(it)
        cases.append((case.name, attrs, named_in, named_out))
    return cases


def type_of(array):
    name = str(array.dtype)
    return "bf16" if name == "bfloat16" else name


def save(path, array):
    if str(array.dtype) == "bfloat16":
        array = array.view("<V2")  # what np.save writes for ml_dtypes.bfloat16
    np.save(path, np.ascontiguousarray(array))


def tolerance(dtype):
    return {"float16": (1e-2, 2e-3), "bf16": (4e-2, 2e-2)}.get(dtype, (1e-3, 1e-5))


def command_for(attrs, files, path):
    """The clattn sdpa arguments for a test, or (None, reason) when the runner has none."""
    args = ["sdpa", "--q", files["Q"], "--k", files["K"], "--v", files["V"], "--path", path]
    known = {"is_causal", "scale", "q_num_heads", "kv_num_heads", "softcap",
             "left_window_size", "right_window_size", "qk_matmul_output_mode",
             "softmax_precision"}
    for name in attrs:
        if name not in known:
            return None, f"attribute {name}"
    if attrs.get("is_causal", 0):
        args += ["--causal"]
    if "scale" in attrs:
        args += ["--scale", repr(float(attrs["scale"]))]
    if "q_num_heads" in attrs:
        args += ["--q-heads", str(attrs["q_num_heads"])]
    if "kv_num_heads" in attrs:
        args += ["--kv-heads", str(attrs["kv_num_heads"])]
    if attrs.get("softcap", 0.0) > 0.0:
        args += ["--softcap", repr(float(attrs["softcap"]))]
    left, right = attrs.get("left_window_size", -1), attrs.get("right_window_size", -1)
    if left >= 0 or right >= 0:
        args += ["--window", f"{left},{right}"]
    if "qk_matmul_output_mode" in attrs or "qk_matmul_output" in files:
        args += ["--qk-output-mode", str(attrs.get("qk_matmul_output_mode", 0))]
    if "softmax_precision" in attrs:
        args += ["--softmax-precision", str(attrs["softmax_precision"])]
    for name, flag in [("attn_mask", "--attn-mask"), ("past_key", "--past-key"),
                       ("past_value", "--past-value"), ("nonpad_kv_seqlen", "--nonpad-kv-seqlen")]:
        if name in files:
            args += [flag, files[name]]
    outs = {"Y": "--out", "present_key": "--present-key-out",
            "present_value": "--present-value-out", "qk_matmul_output": "--qk-out"}
    for name, flag in outs.items():
        if name + "_out" in files:
            args += [flag, files[name + "_out"]]
    return args, None


def rope_command_for(attrs, files, path):
    """The clattn rope arguments for a RotaryEmbedding test (path: unused, one kernel)."""
    del path
    args = ["rope", "--x", files["input"], "--cos", files["cos_cache"], "--sin",
            files["sin_cache"], "--out", files["output_out"]]
    for name in attrs:
        if name not in {"interleaved", "rotary_embedding_dim", "num_heads"}:
            return None, f"attribute {name}"
    if attrs.get("interleaved", 0):
        args += ["--interleaved"]
    if attrs.get("rotary_embedding_dim", 0):
        args += ["--rotary-dim", str(attrs["rotary_embedding_dim"])]
    if attrs.get("num_heads", 0):
        args += ["--num-heads", str(attrs["num_heads"])]
    if "position_ids" in files:
        args += ["--position-ids", files["position_ids"]]
    return args, None


def run_case(clattn, wrap, fail_on, name, attrs, inputs, outputs, paths, workdir,
             operator="Attention"):
    files = {}
    for key, array in inputs.items():
        files[key] = os.path.join(workdir, f"{key}.npy")
        save(files[key], array)
    for key in outputs:
        files[key + "_out"] = os.path.join(workdir, f"out_{key}.npy")
    dtype = type_of(inputs[OPERATORS[operator][2]])
    rtol, atol = tolerance(dtype)
    command = command_for if operator == "Attention" else rope_command_for
    if operator != "Attention":
        paths = ["rope"]
    if "qk_matmul_output" in outputs:
        paths = [p for p in paths if p != "fused"] or ["unfused"]  # scores: unfused only
    notes = []
    for path in paths:
        args, missing = command(attrs, files, path)
        if args is None:
            return "UNSUPPORTED", f"no clattn flag for {missing}"
        for key in outputs:
            if os.path.exists(files[key + "_out"]):
                os.remove(files[key + "_out"])
        result = subprocess.run(wrap + [clattn] + args, capture_output=True, text=True)
        if fail_on is not None:
            found = [line for line in result.stderr.splitlines() if fail_on.search(line)]
            if found:
                return "FAIL", f"{path}: {len(found)} report line(s), the first: {found[0]}"
        if result.returncode == 2:
            message = (result.stderr.strip().splitlines() or ["exit 2"])[-1]
            return "UNSUPPORTED", f"{path}: {message}"
        if result.returncode != 0:
            tail = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
            return "FAIL", f"{path}: exit {result.returncode}: {tail}"
        for key, want in outputs.items():
            if not os.path.exists(files[key + "_out"]):
                return "FAIL", f"{path}: no {key} written"
            got = np.load(files[key + "_out"])
            if got.dtype == np.dtype("V2"):  # '<V2' in the header: numpy's bfloat16
                import ml_dtypes
                got = got.view(ml_dtypes.bfloat16)
            if type_of(got) != type_of(want):
                return "FAIL", f"{path}: {key} is {type_of(got)}, ONNX's is {type_of(want)}"
            want64 = want.astype(np.float64)
            got64 = got.astype(np.float64)
            if got64.shape != want64.shape:
                return "FAIL", f"{path}: {key} has shape {got64.shape}, ONNX {want64.shape}"
            bad = ~np.isclose(got64, want64, rtol=rtol, atol=atol, equal_nan=True)
            if bad.any():
                worst = np.max(np.abs(got64 - want64)[bad])
                return "FAIL", (f"{path}: {key}: {int(bad.sum())} of {bad.size} values off "
                                f"(largest difference {worst:.3g}; rtol {rtol}, atol {atol})")
        notes.append(path)
    return "PASS", ", ".join(notes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clattn", default="build/clattn")
    parser.add_argument("--operator", default="Attention", choices=sorted(OPERATORS))
    parser.add_argument("--paths", default="fused,unfused")
    parser.add_argument("--only", default="")
    parser.add_argument("--min-pass", type=int, default=0)
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--keep", default="")
    parser.add_argument("--wrap", default="", help="a command to run clattn under (oclgrind)")
    parser.add_argument("--fail-on", default="", help="stderr lines that fail a test (regex)")
    parser.add_argument("--jobs", type=int, default=1)
    options = parser.parse_args()
    import onnx

    cases = [c for c in collect(options.operator) if options.only in c[0]]
    if options.list:
        for name, attrs, inputs, outputs in cases:
            print(name, attrs, {k: (v.shape, type_of(v)) for k, v in inputs.items()},
                  list(outputs))
        return 0
    clattn = os.path.abspath(options.clattn)
    wrap = shlex.split(options.wrap)
    paths = [p for p in options.paths.split(",") if p]
    totals = {"PASS": 0, "FAIL": 0, "UNSUPPORTED": 0}
    unsupported = {}
    print(f"onnx {onnx.__version__}: {len(cases)} distinct {options.operator} node tests; "
          f"paths {', '.join(paths) if options.operator == 'Attention' else 'rope'}; "
          f"clattn {clattn}")
    fail_on = re.compile(options.fail_on) if options.fail_on else None

    def one(case):
        name, attrs, inputs, outputs = case
        with tempfile.TemporaryDirectory(dir=options.keep or None) as workdir:
            return run_case(clattn, wrap, fail_on, name, attrs, inputs, outputs, paths, workdir,
                            options.operator)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        results = list(pool.map(one, cases))
    for (name, _, _, _), (status, detail) in zip(cases, results):
        totals[status] += 1
        if status == "UNSUPPORTED":
            unsupported.setdefault(detail.split(": ", 1)[-1], []).append(name)
        print(f"{status:<11} {name}: {detail}", flush=True)
    print(f"totals: {totals['PASS']} passed, {totals['FAIL']} failed, "
          f"{totals['UNSUPPORTED']} unsupported, of {len(cases)}")
    for reason, names in sorted(unsupported.items(), key=lambda item: -len(item[1])):
        print(f"  unsupported ({len(names)}): {reason}")
    if totals["FAIL"] or totals["PASS"] < options.min_pass:
        if totals["PASS"] < options.min_pass:
            print(f"fewer than --min-pass {options.min_pass} tests passed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
