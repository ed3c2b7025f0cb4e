#!/usr/bin/env bash
# One lent GPU's visit for the accelerator step (bf16, the Pallas convolution, per-step latency flags),
# as one call, every record under $OUT:
#
#   bash benchmarks/lease_step.sh SECONDS      # on the lent machine, repository root
#
# 1. the Pallas kernels on the GPU itself (Triton, not interpret mode) against lax's convolution:
#    tests/test_pallas_conv.py (a failure here makes the pallas rows below meaningless);
# 2. the GPU suite's variant rows for FedAvg over 100 clients (the workload) in one call, so the
#    ratio table sets each against its baseline twin: direct fp32 (today's default), bf16, pallas, pallas
#    bf16, and the two XLA flag variants on direct fp32;
# 3. with time left, FedAS on the best-looking pair and the kernels alone (benchmarks/conv_impl.py).
# SECONDS: the wall time the call may use (a few seconds are kept for the last step to end).
set -uo pipefail

budget=${1:?usage: bash benchmarks/lease_step.sh SECONDS}
start=$(date +%s)
deadline=$((start + budget - 15))
out=${OUT:-/tmp/lease_step_out}
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
python=$(command -v python3 || command -v python)
mkdir -p "$out"
left() { echo $((deadline - $(date +%s))); }

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
uptime
"$python" -c "import jax; print('jax', jax.__version__, jax.devices())"

timeout -k 10 $(( $(left) < 240 ? $(left) : 240 )) "$python" -m pytest -q -p no:cacheprovider \
  tests/test_pallas_conv.py 2>&1 | tee "$out/pallas_tests.txt" | tail -15
echo "lease_step: pallas tests rc=${PIPESTATUS[0]} $(date -u +%T)"

s=$(left)
timeout -k 10 "$s" "$python" benchmarks/gpu_suite.py --methods fedavg --clients 100 --mappings auto --sides jax \
  --variants direct:fp32:default,direct:bf16:default,pallas:fp32:default,pallas:bf16:default,direct:fp32:command_buffer,direct:fp32:triton_gemm_any \
  --budget-s $((s - 20)) --child-timeout 150 --out "$out/suite"
echo "lease_step: suite rc=$? $(date -u +%T)"

s=$(left)
if (( s > 120 )); then
  timeout -k 10 "$s" "$python" benchmarks/gpu_suite.py --methods fedas --clients 100 --mappings auto --sides jax \
    --variants direct:fp32:default,pallas:bf16:default --budget-s $((s - 20)) --child-timeout 150 \
    --out "$out/suite_fedas"
  echo "lease_step: fedas suite rc=$? $(date -u +%T)"
fi
s=$(left)
if (( s > 90 )); then
  timeout -k 10 "$s" "$python" benchmarks/conv_impl.py --impls direct,pallas --modes vmap --clients 100 \
    --batch 16 --steps 16 > "$out/conv_impl.json"
  echo "lease_step: conv_impl rc=$? $(date -u +%T)"
fi
