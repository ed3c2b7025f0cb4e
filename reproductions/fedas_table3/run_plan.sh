#!/usr/bin/env bash
# One device command of the run plan for fedas_table3: trains the cells below in order (finished ones
# skipped, a cut one resumed from its checkpoint) into WORK (default: the table's folder) and stops them
# (SIGINT: after the round in flight, with a checkpoint) SECONDS minus the stop and packing margins after
# it starts. The dataset files come from FEDJAX_PFL_DATA_DIR: missing ones stop it before training (exit 2).
#   bash reproductions/fedas_table3/run_plan.sh [SECONDS [WORK]] (SECONDS: the command's limit minus 10, default 350)
# Written by: python -m fedjax_pfl.reproduce fedas_table3 --plan-for-seconds 720
set -uo pipefail
seconds=${1:-350}
work=${2:-reproductions/fedas_table3}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "error: SECONDS must be a whole number; usage: bash reproductions/fedas_table3/run_plan.sh [SECONDS [WORK]] (SECONDS: the command's limit minus 10, default 350)" >&2; exit 2; }
run_for=$((seconds - 40))
(( run_for > 65 )) || { echo "error: SECONDS too small (at least 106); usage: bash reproductions/fedas_table3/run_plan.sh [SECONDS [WORK]] (SECONDS: the command's limit minus 10, default 350)" >&2; exit 2; }
export PYTHONUNBUFFERED=1
python=$(command -v python3 || command -v python)
cells=fedas-beta0.1_P0.6/seed0,fedala-beta0.1_P0.6/seed0,fedper-beta0.1_P0.6/seed0,lgfedavg-beta0.1_P0.6/seed0,fedpac-beta0.1_P0.6/seed0,fedper-beta0.1_P0.2/seed0,fedbabu-beta0.1_P0.6/seed0,fedproto-beta0.1_P0.6/seed0,ditto-beta0.1_P0.6/seed0,fedavg_p-beta0.1_P0.6/seed0,fedprox_p-beta0.1_P0.6/seed0,fedas-beta0.1_P0.2/seed0,fedala-beta0.1_P0.2/seed0,fedbabu-beta0.1_P0.2/seed0,lgfedavg-beta0.1_P0.2/seed0,fedpac-beta0.1_P0.2/seed0,ditto-beta0.1_P0.2/seed0,fedproto-beta0.1_P0.2/seed0,fedavg_p-beta0.1_P0.2/seed0,fedprox_p-beta0.1_P0.2/seed0,fedas-beta0.1_P0.4/seed0,fedala-beta0.1_P0.4/seed0,fedper-beta0.1_P0.4/seed0,fedbabu-beta0.1_P0.4/seed0,lgfedavg-beta0.1_P0.4/seed0,fedpac-beta0.1_P0.4/seed0,ditto-beta0.1_P0.4/seed0,fedproto-beta0.1_P0.4/seed0,fedavg_p-beta0.1_P0.4/seed0,fedprox_p-beta0.1_P0.4/seed0,fedas-beta0.1_P1/seed0,fedala-beta0.1_P1/seed0,fedper-beta0.1_P1/seed0,lgfedavg-beta0.1_P1/seed0,fedbabu-beta0.1_P1/seed0,fedproto-beta0.1_P1/seed0,ditto-beta0.1_P1/seed0,fedpac-beta0.1_P1/seed0,fedavg_p-beta0.1_P1/seed0,fedprox_p-beta0.1_P1/seed0,fedas-beta0.3_P0.2/seed0,fedala-beta0.3_P0.2/seed0,fedpac-beta0.3_P0.2/seed0,fedbabu-beta0.3_P0.2/seed0,fedper-beta0.3_P0.2/seed0,lgfedavg-beta0.3_P0.2/seed0
timeout -s INT -k 30 "$run_for" "$python" -m fedjax_pfl.reproduce fedas_table3 train.client_mapping=vmap --no-progress --require-data --out "$work" --cells "$cells"
