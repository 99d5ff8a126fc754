#!/usr/bin/env bash
# The GPU checks in one call on a lent CUDA machine (CI stays CPU-only):
#   1. the CUDA tests: solver and smoothing inputs stay on the device; a 3-worker + dealer CNN job
#      with bob on CUDA and alice, carol on the CPU ends with the same public model bit for bit;
#   2. per-example gradients, torch.func vs Opacus vs the per-example loop, CUDA and this machine's CPU;
#   3. DP-SGD on MNIST (the deep_mnist setting, in-process simulator) on CUDA;
#   4. the in-MPC discrete Gaussian sampler with each party's local arithmetic on CUDA, and on the
#      CPU of the same machine (same run), replicated and dealer;
#   5. data owners on CUDA beside owners on the CPU end with the CPU replay's model
#      (tests/parties/test_owner_cuda.py), and paper 002's uniform DP-Fed-LS setting (1,000 owners
#      of 50 MNIST rows, exactly 50 drawn a round by the compute parties' secret shuffle) through
#      three compute-party daemons with every owner's local epochs on CUDA (step fed_uniform).
# Needs: python3 with torch (CUDA build); the project's other dependencies as wheels in .whl/
# (installed into /tmp/site) where the machine lacks them; MNIST under $MPC_ERM_DATA (default .gpudata/).
# Writes at most 8 files under $OUT (a log and JSON results).
set -u
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
LOG="$OUT/gpu_checks.log"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 MPC_ERM_DATA=${MPC_ERM_DATA:-$PWD/.gpudata}

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log it, print its tail
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  echo "=== $name: $*" >> "$LOG"
  timeout "$limit" "$@" >> "$LOG" 2>&1
  rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - start )) s" | tee -a "$LOG"
}

{ nvidia-smi -L; nproc; python3 -c "import torch, grpc, crypten; print('torch', torch.__version__, torch.cuda.get_device_name(), 'grpc', grpc.__version__)"; } 2>&1 | tee -a "$LOG"
want() { [[ " ${STEPS:-tests owners per_example sampler deep_mnist fed_uniform} " == *" $1 "* ]]; }  # STEPS="tests sampler" reruns a part
if want tests; then
  step tests 180 python3 -m pytest -q -p no:cacheprovider -o addopts= \
    tests/models/test_solvers.py::test_cuda_inputs_stay_on_device tests/test_smoothing.py::test_cuda \
    tests/parties/test_worker.py::test_a_cuda_party_and_cpu_parties_end_with_the_same_model
fi
want owners && step owners_cuda 240 python3 -m pytest -q -s -p no:cacheprovider -o addopts= \
  tests/parties/test_owner_cuda.py
want per_example && step per_example_cuda 90 python3 -m benchmarks.per_example --device cuda --out "$OUT/per_example_cuda.json"
if want sampler; then
  DEMO="--sigma 0.0019211317096766705 --grid-bits 26"
  for trust in replicated dealer; do
    for dev in cuda cpu; do
      # shellcheck disable=SC2086
      step "sampler_${trust}_$dev" 90 python3 -m benchmarks sampler --mechanism gaussian --samples 262144 $DEMO \
        --trust "$trust" --randn-samples 0 --reference-samples 100000 --device "$dev" --traceback \
        --out "$OUT/sampler_${trust}_$dev.json"
    done
  done
fi
want deep_mnist && step deep_mnist_cuda 200 python3 -m benchmarks.deep_mnist --device cuda --out "$OUT/deep_mnist_cuda.json"
want fed_uniform && step fed_uniform ${FED_LIMIT:-420} python3 -m benchmarks.dp_fed_ls_daemons --sampling uniform \
  --owner-device cuda --owner-procs 8 --epsilons ${FED_EPSILONS:-7} --sigmas ${FED_SIGMAS:-0,1} --out "$OUT/dp_fed_ls_uniform_cuda.json"
want per_example && step per_example_cpu 100 python3 -m benchmarks.per_example --device cpu --threads 16 --out "$OUT/per_example_cpu16.json"
grep -E "^(mlp|mnist_cnn|cifar_cnn|char_lstm) |round .*epoch 10|samples/s|passed|failed|Error|grid steps|σ_LS" "$LOG" | tail -40
