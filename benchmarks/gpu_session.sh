#!/usr/bin/env bash
# Everything one call on the lent GPU does, in order: build, parity tests under the validation
# layer, the demo, the benchmarks. On the device machine, from the repository root:
#   source .gpu/setup.sh && bash benchmarks/gpu_session.sh
# BITNET_GPU_STEPS picks the checks (default "info demo ctest pytest"), BITNET_GPU_PYTEST the
# pytest arguments (default: the whole suite), BITNET_GPU_BENCHMARKS the benchmarks (default: every
# user-facing one; "" for none).
# Logs and JSON go to $OUT (the device tool's folder) or /tmp/bitnet_gpu_out.
set -uo pipefail
out=${OUT:-/tmp/bitnet_gpu_out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 BITNET_GPU_CACHE_DIR=/tmp/bitnet_gpu_cache
step() { echo "=== $* ($(date +%T))"; }

step vulkan
vulkaninfo --summary 2>/dev/null | grep -E "deviceName|driverName|driverInfo|apiVersion" | head -8
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv 2>/dev/null

step build
python3 -m pip install --no-build-isolation --no-deps -q . > "$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }

steps=" ${BITNET_GPU_STEPS:-info demo ctest pytest} "
if [[ $steps == *" info "* ]]; then step info; python3 -m bitnet_gpu info; fi
if [[ $steps == *" demo "* ]]; then step demo; python3 -m bitnet_gpu demo; fi

if [[ $steps == *" ctest "* ]]; then
step ctest
{ cmake -S . -B build/gpu-tests -G Ninja -DBITNET_GPU_TESTS=ON -DBITNET_GPU_PYTHON=OFF \
    && cmake --build build/gpu-tests && ctest --test-dir build/gpu-tests --output-on-failure; } \
  > "$out/ctest.log" 2>&1
tail -4 "$out/ctest.log"
fi

if [[ $steps == *" pytest "* ]]; then
step pytest
# shellcheck disable=SC2086  # the arguments are meant to split
BITNET_GPU_VALIDATION=1 python3 -m pytest ${BITNET_GPU_PYTEST:-tests_py} -q -p no:cacheprovider > "$out/pytest.log" 2>&1
tail -15 "$out/pytest.log"
# The layer hides VK_KHR_cooperative_matrix here, so the float16 tensor-core paths run again
# without it.
BITNET_GPU_VALIDATION=0 python3 -m pytest tests_py -q -p no:cacheprovider -k float16 \
  > "$out/pytest-float16.log" 2>&1
tail -3 "$out/pytest-float16.log"
fi

for bench in ${BITNET_GPU_BENCHMARKS-runtime quantize bitlinear ops attention sampling model linalg roundtrip serve}; do
  step "benchmark $bench"
  python3 "benchmarks/bench_$bench.py" --json "$out/$bench-gpu.json"
done
step done
