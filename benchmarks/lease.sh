#!/usr/bin/env bash
# One lent GPU's whole visit as one call: the GPU suite first, then the table
# cells still missing, one at a time, each stopped (SIGINT: it writes its
# checkpoint) before the deadline, and every record packed under $OUT.
#
#   bash benchmarks/lease.sh SECONDS            # on the lent machine, repository root
#   bash benchmarks/lease.sh SECONDS --dry-run  # anywhere: print the plan, check each cell exists
#
# SECONDS: the wall time the call may use (a few seconds are kept for packing).
# The machine goes back about 30 s after a call ends, so nothing may wait for a
# second call: cells run one at a time (seven at once were 4-5x slower each).
# Data: $FEDJAX_PFL_DATA_DIR, else .dev/data (carried beside the checkout).
# Finished cells already under reproductions/ are copied in first, so
# `reproduce` skips them; a cut cell's checkpoint comes back in cells.tar.gz
# (WORK/TABLE/runs/CELL/seedN) and resumes when carried into the next visit's .dev/repro.
set -uo pipefail

budget=${1:?usage: bash benchmarks/lease.sh SECONDS [--dry-run]}
dry=${2:-}
start=$(date +%s)
deadline=$((start + budget - 20))
out=${OUT:-/tmp/lease_out}
work=${LEASE_WORK:-.dev/repro}
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
export FEDJAX_PFL_DATA_DIR=${FEDJAX_PFL_DATA_DIR:-$PWD/.dev/data}
python=$(command -v python3 || command -v python)
mkdir -p "$out" "$work/probes"
touch "$work/.start"  # records newer than this come back; the copied finished ones keep their times

left() { echo $((deadline - $(date +%s))); }

# what the next visit should run, most wanted first: TABLE METHOD SETTING SEED [overrides...]
CELLS=(
  "pfakd_table1 fedrep cifar10_E10 0"
  "pfakd_table1 fedpac cifar10_E10 0"
)
# probes: their own folder, not table cells (the PFAKD authors' main.py GPFL defaults)
PROBES=(
  "pfakd_table1 gpfl cifar10_E5 0 method.mu=1.0 method.lamda=0.0001"
  "pfakd_table1 gpfl cifar10_E10 0 method.mu=1.0 method.lamda=0.0001"
)

run_cell() {  # FOLDER TABLE METHOD SETTING SEED [overrides...]: the table's run in FOLDER/TABLE
  local folder=$1/$2 table=$2 method=$3 setting=$4 seed=$5; shift 5
  local cmd=("$python" -m fedjax_pfl.reproduce "$table" --seeds "$seed" --methods "$method" --settings "$setting"
             --out "$folder" --no-progress train.client_mapping=vmap "$@")
  if [[ $dry == --dry-run ]]; then "${cmd[@]}" --dry-run || exit 2; return; fi
  local seconds; seconds=$(left)
  if (( seconds < 60 )); then echo "lease: no time left for $method $setting"; return; fi
  echo "lease: $table $method $setting seed $seed ($seconds s left) $(date -u +%T)"
  timeout -s INT -k 15 "$seconds" "${cmd[@]}"
  echo "lease: $table $method $setting seed $seed rc=$? $(date -u +%T)"
}

if [[ $dry != --dry-run ]]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
  uptime
  timeout -k 10 170 "$python" benchmarks/gpu_suite.py --methods fedavg --clients 100 --mappings auto \
    --convs im2col,direct --sides jax --budget-s 150 --child-timeout 140 --out "$out/suite"
  echo "lease: suite rc=$? $(date -u +%T)"
fi
for table in $(printf '%s\n' "${CELLS[@]%% *}" | sort -u); do  # finished cells: reproduce skips them
  mkdir -p "$work/$table/runs"
  [[ -d reproductions/$table/runs ]] && cp -rnp reproductions/"$table"/runs/. "$work/$table/runs/"
done
for cell in "${CELLS[@]}"; do run_cell "$work" $cell; done
for probe in "${PROBES[@]}"; do run_cell "$work/probes" $probe; done
[[ $dry == --dry-run ]] && exit 0
(cd "$work" && find . -type f -newer .start -print0 | tar -czf "$out/cells.tar.gz" --null -T -)
echo "lease: packed $(du -h "$out/cells.tar.gz" | cut -f1) $(date -u +%T)"
