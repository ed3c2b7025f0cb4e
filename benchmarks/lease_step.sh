#!/usr/bin/env bash
# One lent GPU's call for the accelerator step (bf16, the Pallas convolution, per-step latency flags, packed
# lanes), as one call; what comes back (six files, the device tool's limit is eight): $OUT/records.tar.gz (every
# suite's suite.md, suite.json, suite.jsonl and log, without the parameter files), each suite's suite.md as
# $OUT/NAME.md, and the Pallas tests' output:
#
#   bash benchmarks/lease_step.sh SECONDS      # on the lent machine, repository root; nothing to carry
#
# 1. the Pallas kernels on the GPU itself (Triton, not interpret mode) against lax's convolution:
#    tests/test_pallas_conv.py (a failure here makes the pallas rows below meaningless);
# 2. suite "variants": FedAvg over the suite's 100 clients in chunks of 32, one row per variant, so its ratio
#    table sets each against its twin: native, direct (what conv_impl=auto runs), pallas; fp32 and bf16; XLA's
#    defaults and the two flag variants. Each row: s/round, share of the fp32 and bf16 peaks, GB/s moved and
#    its share of the copy bandwidth;
# 3. suite "mappings": packed against vmap, fp32 and bf16, same workload;
# 4. with the time left, FedAS on the baseline and on pallas bf16, then one step of W lanes (--sweep-width)
#    for direct fp32, direct bf16 and pallas bf16.
# Each suite stops starting rows when its share of SECONDS is spent and lists the rest as not run.
set -uo pipefail

budget=${1:?usage: bash benchmarks/lease_step.sh SECONDS}
deadline=$(( $(date +%s) + budget - 10 ))
out=${OUT:-/tmp/lease_step_out}
work=$(mktemp -d)
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
python=$(command -v python3 || command -v python)
mkdir -p "$out"
pack() { tar czf "$out/records.tar.gz" --exclude params -C "$work" . ; }
left() { echo $(( deadline - $(date +%s) )); }
cap() { local l; l=$(left); echo $(( l < $1 ? l : $1 )); }  # at most $1 seconds, at most what is left
suite() {  # NAME SECONDS ARGS...: one gpu_suite call under its own budget
  local name=$1 s=$2; shift 2
  (( s > 30 )) || { echo "lease_step: $name not run ($s s left)"; return; }
  timeout -k 10 "$s" "$python" benchmarks/gpu_suite.py --sides jax --clients 100 --child-timeout 90 \
    --budget-s $(( s - 15 )) --out "$work/$name" "$@" > "$work/$name.log" 2>&1
  echo "lease_step: $name rc=$? $(date -u +%T)"
  cp "$work/$name/suite.md" "$out/$name.md" 2>/dev/null && cat "$out/$name.md"
  pack
}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
uptime
"$python" -c "import jax; print('jax', jax.__version__, jax.devices())"

timeout -k 5 "$(cap 90)" "$python" -m pytest -q -p no:cacheprovider tests/test_pallas_conv.py \
  > "$out/pallas_tests.txt" 2>&1
echo "lease_step: pallas tests rc=$? $(date -u +%T)"; tail -n 5 "$out/pallas_tests.txt"

suite variants "$(cap 200)" --methods fedavg --mappings chunked:32 --variants \
  direct:fp32:default,native:fp32:default,direct:bf16:default,pallas:fp32:default,pallas:bf16:default,direct:fp32:command_buffer,direct:fp32:triton_gemm_any
suite mappings "$(cap 130)" --methods fedavg --mappings packed,vmap \
  --variants direct:fp32:default,direct:bf16:default
suite fedas "$(cap 70)" --methods fedas --mappings chunked:32 --variants direct:fp32:default,pallas:bf16:default
suite sweep "$(left)" --sweep-width --widths 8,24,100 --variants direct:fp32:default,direct:bf16:default,pallas:bf16:default
