#!/usr/bin/env bash
# One lent GPU's visit as one command: the device and its peaks, the Pallas kernels on it, the GPU suite's
# FedAvg round in its variants, then as many FedAS Table 3 cells as fit, a method's cells as rows of one program.
#
#   bash benchmarks/lease.sh [SECONDS]                # on the lent machine, repository root; default 560 (a
#                                                     # 580 s command: 20 s of it left to the device tool)
#   bash benchmarks/lease.sh SECONDS --cells-only     # a further command of the same window: step (f) alone
#   LEASE_TINY=1 JAX_PLATFORMS=cpu bash benchmarks/lease.sh 60   # every step on tiny work, on a CPU (its test)
#
# Data: step (f) trains on cifar10_jpeg, which the lent machine has only when it is in the tree it gets. Bring it
#     mkdir -p .dev/data && cp -r ../shared/data/cifar10_jpeg .dev/data/       # 19 MiB; .dev/ is ignored by git
# and make the device call with carry: [".dev/data"]. The files are looked for in $FEDJAX_PFL_DATA_DIR, else in
# .dev/data; without them the script stops in one line (exit 2) before anything touches the GPU.
#
# Steps, in order, each under its own timeout; the caps sum under SECONDS (a step whose cap falls under its floor
# is skipped and says so; time a step leaves goes to the cells). After every step what it made is copied to $OUT:
#   (a) device.json       the device, versions, matmul and copy peaks, measured once (the suite reuses them)
#   (b) lease.log         tests/test_pallas_conv.py on the device, under the XLA flags this jax accepts
#   (c) suite.md, suite.json  FedAvg over the suite's 100 clients: packed and chunked:32 x direct and pallas x
#                         fp32 and bf16, and packed direct fp32 with command buffers (no parameter dumps)
#   (d) rows.jsonl        benchmarks/scale_rounds.py: FedAvg and Ditto at 1,000, 10,000 and 100,000 clients,
#                         cohort 50, client state on the device and on the host
#   (e) rows.jsonl        benchmarks/vs_pfl.py --quick --device gpu: pfl-research on torch CUDA beside fedjax_pfl,
#                         when pfl's wheels are in .dev/peer_wheels (carried; benchmarks/RESULTS.md says which)
#   (f) table.md, records.tar.gz  FedAS Table 3 planned for the seconds left (python -m fedjax_pfl.reproduce
#                         fedas_table3 --plan-for-seconds LEFT) and trained by the plan's script; the records of its
#                         runs packed (tools/run_records.py). Back here: python tools/run_records.py land
#                         fedas_table3 FILES_AT/records.tar.gz
#   summary.md (each step: its status and seconds, or why it did not run) and lease.log (all that was printed).
# That is at most 8 files, all in $OUT itself (the device tool returns 8). Tiny mode (LEASE_TINY=1) runs every step on a few clients and seconds:
# LEASE_TABLE (a table name or YAML file, default fedas_table3) and LEASE_CELLS (--cells of it, instead of a plan).
set -uo pipefail

budget=${1:-560}
only=${2:-}
[[ $budget =~ ^[0-9]+$ ]] && (( budget >= 30 )) || { echo "error: SECONDS must be a whole number >= 30; usage: bash benchmarks/lease.sh [SECONDS] [--cells-only]" >&2; exit 2; }
[[ -z $only || $only == --cells-only ]] || { echo "error: unknown option $only; usage: bash benchmarks/lease.sh [SECONDS] [--cells-only]" >&2; exit 2; }
start=$(date +%s)
deadline=$((start + budget - 5))  # 5 s for the last packing
out=${OUT:-/tmp/lease_out}
work=${LEASE_WORK:-runs/lease}
tiny=${LEASE_TINY:-}
table=${LEASE_TABLE:-fedas_table3}
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export FEDJAX_PFL_DATA_DIR=${FEDJAX_PFL_DATA_DIR:-$PWD/.dev/data}
python=$(command -v python3 || command -v python)
mkdir -p "$out" "$work"
log=$out/lease.log
: > "$log"
if [[ $table == *.yaml || $table == *.yml ]]; then table_args=(--table-file "$table"); else table_args=("$table"); fi
name=$(basename "$table" .yaml)

left() { echo $((deadline - $(date +%s))); }
note() { echo "$*" | tee -a "$log"; }
summary() { echo "$*" >> "$out/summary.md"; }

# before the GPU: the table's dataset files must be in the tree (a dry run on the CPU, one line if they are not)
if ! JAX_PLATFORMS=cpu "$python" -m fedjax_pfl.reproduce "${table_args[@]}" --dry-run --require-data \
     --out "$work/$name" > "$work/data_check.txt" 2>&1; then
  reason=$(grep -m1 '^error: ' "$work/data_check.txt" | sed 's/^error: //')
  echo "error: ${reason:-the data check failed (see $work/data_check.txt)}; bring the files into the tree: mkdir -p .dev/data && cp -r ../shared/data/cifar10_jpeg .dev/data/ and carry .dev/data" >&2
  exit 2
fi

printf '# Lease: %s seconds%s\n\n| step | status | seconds | note |\n|---|---|---|---|\n' "$budget" "${tiny:+ (tiny mode)}" > "$out/summary.md"

step() {  # LABEL CAP FLOOR OUTPUT CMD...: CMD (its output to OUTPUT, '-': the log) under min(CAP, what is left)
  local label=$1 cap=$2 floor=$3 output=$4; shift 4
  local have; have=$(left)
  (( have < cap )) && cap=$have
  if (( cap < floor )); then
    note "lease: $label not run ($cap s left, it needs $floor)"
    summary "| $label | not run | 0 | $cap s left, it needs at least $floor |"
    return 1
  fi
  note "lease: $label (at most $cap s) $(date -u +%T)"
  local began rc said; began=$(date +%s)
  [[ $output == - ]] && output=$work/step.txt
  timeout -s INT -k 10 "$cap" "$@" > "$output" 2>&1; rc=$?
  cat "$output" >> "$log"
  said=$(grep -v '^[[:space:]]*$' "$output" | tail -n 1 | cut -c1-160 | tr '|' '/')
  local took=$(( $(date +%s) - began )) status=ran
  (( rc != 0 )) && status="exit $rc"
  (( rc == 124 || rc == 130 )) && status="stopped at its cap ($cap s), exit $rc"
  note "lease: $label rc=$rc after $took s"
  summary "| $label | $status | $took | ${tiny:+tiny mode; }$said |"
  return $rc
}

if [[ -n $tiny ]]; then
  caps=(10 15 30 10 20 5) floors=(3 3 5 3 5 3 3)
  scale_size=(--methods ditto --clients 30 --cohort 5 --samples 8 --features 5 --rounds 1)
  suite_size=(--quick --clients 4 --mappings packed,chunked:2 --variants direct:fp32:default,direct:bf16:default)
  pallas_select=(-k float32_with_one_kernel)
else
  caps=($((budget * 8 / 100)) $((budget * 11 / 100)) $((budget * 26 / 100)) 60 $((budget * 6 / 100))
        $((budget * 8 / 100))) floors=(20 20 60 20 180 20 30)
  scale_size=(--methods fedavg,ditto --clients 1000,10000,100000 --cohort 50 --rounds 5)
  suite_size=(--clients 100 --rounds 2 --mappings packed,chunked:32
              --variants direct:fp32:default,direct:bf16:default,pallas:fp32:default,pallas:bf16:default
              --extra-rows packed:direct:fp32:command_buffer)
  pallas_select=()
fi

if [[ $only != --cells-only ]]; then
  step "(a) device and peaks" "${caps[0]}" "${floors[0]}" - \
    "$python" benchmarks/gpu_suite.py --device-only ${tiny:+--quick} --out "$work/device"
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true; uptime; } >> "$log"
  cp "$work/device/device.json" "$out/" 2>/dev/null

  step "(b) Pallas tests" "${caps[1]}" "${floors[1]}" "$work/pallas_tests.txt" \
    "$python" -m pytest -q -p no:cacheprovider tests/test_pallas_conv.py "${pallas_select[@]}"
  cat "$work/pallas_tests.txt" >> "$log" 2>/dev/null

  device=()
  [[ -f $work/device/device.json ]] && device=(--device-json "$work/device/device.json")
  have=$(left); cap=${caps[2]}; (( have < cap )) && cap=$have
  step "(c) GPU suite" "$cap" "${floors[2]}" - \
    "$python" benchmarks/gpu_suite.py --methods fedavg --sides jax "${suite_size[@]}" "${device[@]}" \
    --budget-s $((cap - 2)) --child-timeout $((cap - 2)) --out "$work/suite"
  cp "$work/suite/suite.md" "$work/suite/suite.json" "$out/" 2>/dev/null

  step "(d) scale rows" "${caps[4]}" "${floors[5]}" "$work/scale.txt" \
    "$python" benchmarks/scale_rounds.py "${scale_size[@]}"
  grep '^{' "$work/scale.txt" >> "$out/rows.jsonl" 2>/dev/null

  if compgen -G ".dev/peer_wheels/*.whl" > /dev/null && [[ -z $tiny ]]; then
    step "(e) vs pfl-research" "${caps[5]}" "${floors[6]}" - bash -c "$python -m venv --system-site-packages \
      $work/peers && $work/peers/bin/pip install -q --no-index --no-deps .dev/peer_wheels/*.whl && \
      $work/peers/bin/python benchmarks/vs_pfl.py --quick --device gpu --out $out/rows.jsonl"
  else
    why=${tiny:+tiny mode}; why=${why:-no pfl wheels in .dev/peer_wheels (benchmarks/RESULTS.md: how to bring them)}
    note "lease: (e) vs pfl-research not run: $why"
    summary "| (e) vs pfl-research | not run | 0 | $why |"
  fi
fi

# (f) the table's cells: LEASE_CELLS as given, else planned on the CPU for the seconds left and trained by the
# plan's script (which stops its cells, with their checkpoints, before this step's cap)
dir=$work/$name
extra=(${LEASE_TABLE_ARGS:-})
if [[ -n ${LEASE_CELLS:-} ]]; then
  step "(f) $name cells" "$(left)" "${floors[4]}" - \
    "$python" -m fedjax_pfl.reproduce "${table_args[@]}" --out "$dir" --cells "$LEASE_CELLS" --no-progress \
    --require-data train.client_mapping=packed "${extra[@]}"
elif step "(f) $name plan" "${caps[3]}" "${floors[3]}" "$work/plan.txt" \
     env JAX_PLATFORMS=cpu "$python" -m fedjax_pfl.reproduce "${table_args[@]}" --out "$dir" \
     --plan-for-seconds $(( $(left) - ${caps[3]} )) "${extra[@]}"; then
  step "(f) $name cells" "$(left)" "${floors[4]}" - bash "$dir/run_plan.sh" $(( $(left) - 5 )) "$dir"
fi
if [[ -d $dir/runs ]]; then
  "$python" tools/run_records.py pack "$dir" "$out/records.tar.gz" >> "$log" 2>&1
  cp "$dir/table.md" "$out/" 2>/dev/null
fi
note "lease: done after $(( $(date +%s) - start )) s of $budget; $out holds: $(cd "$out" && ls | tr '\n' ' ')"
