#!/bin/bash
# The whole ctest suite on Mesa's rusticl (llvmpipe: a CPU device behind another compiler,
# clang -> SPIR-V -> NIR -> gallivm; no fp64, 32 KiB of local memory, its own platform), a third
# OpenCL implementation beside PoCL and Oclgrind.
#
#   tests/rusticl_lane.sh BUILD_DIR [ctest options...]
#
# Needs mesa-opencl-icd. Finds rusticl's platform in `BUILD_DIR/clattn devices`, exports
# CLATTN_DEVICE=P:0 (ctest passes it to every suite), runs ctest --output-on-failure in
# BUILD_DIR, prints the wall time and exits with ctest's status; exits 1 at once if there is
# no rusticl platform. No suite is excluded: none needs fp64 on the device (the float64
# reference runs on the host).
set -u -o pipefail

build=${1:?usage: tests/rusticl_lane.sh BUILD_DIR [ctest options...]}
shift
if [ ! -x "$build/clattn" ]; then
    echo "rusticl_lane: $build/clattn not found: build first (cmake --build $build)" >&2
    exit 1
fi

# rusticl exposes no device unless told which gallium drivers to use.
export RUSTICL_ENABLE=${RUSTICL_ENABLE:-llvmpipe}
devices=$("$build/clattn" devices 2>&1) || {
    echo "rusticl_lane: '$build/clattn devices' failed:" >&2
    echo "$devices" >&2
    exit 1
}
platform=$(printf '%s\n' "$devices" | sed -n 's/^platform \([0-9][0-9]*\): rusticl .*/\1/p' |
           head -n 1)
if [ -z "$platform" ] || ! printf '%s\n' "$devices" | grep -q "^. $platform:0 "; then
    echo "rusticl_lane: FAILED: no rusticl platform with a device in '$build/clattn devices'" \
         "(is mesa-opencl-icd installed? RUSTICL_ENABLE=$RUSTICL_ENABLE):" >&2
    echo "$devices" >&2
    exit 1
fi
export CLATTN_DEVICE=$platform:0
echo "rusticl_lane: CLATTN_DEVICE=$CLATTN_DEVICE:" \
     "$(printf '%s\n' "$devices" | grep "^. $platform:0 " | sed 's/^. [0-9:]* *//')"

start=$(date +%s)
(cd "$build" && ctest --output-on-failure "$@")
status=$?
end=$(date +%s)
echo "rusticl_lane: ctest on rusticl ($CLATTN_DEVICE) exited $status after $((end - start)) s"
exit $status
