#!/usr/bin/env bash
# One device command of the next lease for fedas_table3: trains the cells below in order (finished ones
# skipped, a cut one resumed from its checkpoint) until SECONDS minus the stop and packing margins, in
# runs/lease/ (ignored by git: the lent machine keeps it between calls while it stays warm), then packs
# the records of its runs into $OUT/records.tar.gz.
# Written by: python -m fedjax_pfl.reproduce fedas_table3 --plan-for-seconds 720
set -uo pipefail
seconds=${1:?usage: bash reproductions/fedas_table3/lease_plan.sh SECONDS (the timeout_s of the device call minus 10)}
run_for=$((seconds - 40))
(( run_for > 65 )) || { echo "usage: bash reproductions/fedas_table3/lease_plan.sh SECONDS (the timeout_s of the device call minus 10); SECONDS too small"; exit 2; }
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export FEDJAX_PFL_DATA_DIR=${FEDJAX_PFL_DATA_DIR:-$PWD/.dev/data}
out=${OUT:-/tmp/lease_out}
work=${LEASE_WORK:-runs/lease}/fedas_table3
python=$(command -v python3 || command -v python)
mkdir -p "$out" "$work"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; uptime; } 2>&1 | tee "$out/lease.log"
cells=fedas-beta0.1_P0.6/seed0,fedala-beta0.1_P0.6/seed0,fedper-beta0.1_P0.6/seed0,lgfedavg-beta0.1_P0.6/seed0,fedpac-beta0.1_P0.6/seed0,fedper-beta0.1_P0.2/seed0,fedbabu-beta0.1_P0.6/seed0,fedproto-beta0.1_P0.6/seed0,ditto-beta0.1_P0.6/seed0,fedavg_p-beta0.1_P0.6/seed0,fedprox_p-beta0.1_P0.6/seed0,fedas-beta0.1_P0.2/seed0,fedala-beta0.1_P0.2/seed0,fedbabu-beta0.1_P0.2/seed0,lgfedavg-beta0.1_P0.2/seed0,fedpac-beta0.1_P0.2/seed0,ditto-beta0.1_P0.2/seed0,fedproto-beta0.1_P0.2/seed0,fedavg_p-beta0.1_P0.2/seed0,fedprox_p-beta0.1_P0.2/seed0,fedas-beta0.1_P0.4/seed0,fedala-beta0.1_P0.4/seed0,fedper-beta0.1_P0.4/seed0,fedbabu-beta0.1_P0.4/seed0,lgfedavg-beta0.1_P0.4/seed0,fedpac-beta0.1_P0.4/seed0,ditto-beta0.1_P0.4/seed0,fedproto-beta0.1_P0.4/seed0,fedavg_p-beta0.1_P0.4/seed0,fedprox_p-beta0.1_P0.4/seed0,fedas-beta0.1_P1/seed0,fedala-beta0.1_P1/seed0,fedper-beta0.1_P1/seed0,lgfedavg-beta0.1_P1/seed0,fedbabu-beta0.1_P1/seed0,fedproto-beta0.1_P1/seed0,ditto-beta0.1_P1/seed0,fedpac-beta0.1_P1/seed0,fedavg_p-beta0.1_P1/seed0,fedprox_p-beta0.1_P1/seed0,fedas-beta0.3_P0.2/seed0,fedala-beta0.3_P0.2/seed0,fedpac-beta0.3_P0.2/seed0,fedbabu-beta0.3_P0.2/seed0,fedper-beta0.3_P0.2/seed0,lgfedavg-beta0.3_P0.2/seed0
timeout -s INT -k 30 "$run_for" "$python" -m fedjax_pfl.reproduce fedas_table3 train.client_mapping=vmap --no-progress --out "$work" --cells "$cells" 2>&1 | tee -a "$out/lease.log"
echo "lease: reproduce rc=${PIPESTATUS[0]} $(date -u +%T)" | tee -a "$out/lease.log"
"$python" -m fedjax_pfl.reproduce fedas_table3 --out "$work" --pack-records "$out/records.tar.gz" 2>&1 | tee -a "$out/lease.log"
