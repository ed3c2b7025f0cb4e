#!/usr/bin/env bash
# The background run plan for fedas_table3: starts the cells below (finished ones skipped, a cut one resumed
# from its checkpoint) at nice 19 on one core, in WORK (outside the repository: every clone finds them),
# and returns. Each finished cell is copied into reproductions/fedas_table3/runs/ as a compact record and the table written
# again (commit them). SECONDS after the start the cell in flight stops after its round, with a checkpoint;
# output in WORK/plan.log, the log the next plan reads in WORK/plan_log.jsonl.
#   bash reproductions/fedas_table3/run_plan.sh [SECONDS [WORK]] (SECONDS: how long the plan may run, default 35990; WORK: where its cells run, default ${FEDJAX_PFL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fedjax_pfl}/cells/fedas_table3; CORE=k: the core, default the last)
# Written by: python -m fedjax_pfl.reproduce fedas_table3 --seeds 0 --methods fedas,fedala,fedpac,fedper --settings beta0.1_P0.2,beta0.1_P0.4,beta0.1_P0.6,beta0.1_P1 --plan-for-seconds 36000 --device-kind cpu
set -uo pipefail
seconds=${1:-35990}
work=${2:-${FEDJAX_PFL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fedjax_pfl}/cells/fedas_table3}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "error: SECONDS must be a whole number; usage: bash reproductions/fedas_table3/run_plan.sh [SECONDS [WORK]] (SECONDS: how long the plan may run, default 35990; WORK: where its cells run, default ${FEDJAX_PFL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fedjax_pfl}/cells/fedas_table3; CORE=k: the core, default the last)" >&2; exit 2; }
run_for=$((seconds - 330))
(( run_for > 70 )) || { echo "error: SECONDS too small (at least 401); usage: bash reproductions/fedas_table3/run_plan.sh [SECONDS [WORK]] (SECONDS: how long the plan may run, default 35990; WORK: where its cells run, default ${FEDJAX_PFL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fedjax_pfl}/cells/fedas_table3; CORE=k: the core, default the last)" >&2; exit 2; }
core=${CORE:-$(( $(nproc) - 1 ))}
mkdir -p "$work"
if [[ -f "$work/runner.pid" ]] && kill -0 "$(cat "$work/runner.pid")" 2>/dev/null; then
  echo "error: a plan already runs in $work (pid $(cat "$work/runner.pid")); let it finish, or stop it after its round with: kill -INT $(cat "$work/runner.pid")" >&2; exit 2
fi
export PYTHONUNBUFFERED=1
python=$(command -v python3 || command -v python)
cells='fedas-beta0.1_P0.2/seed0;fedas-beta0.1_P0.4/seed0;fedas-beta0.1_P1/seed0;fedala-beta0.1_P0.6/seed0;fedper-beta0.1_P0.6/seed0;fedpac-beta0.1_P0.6/seed0;fedala-beta0.1_P0.2/seed0;fedper-beta0.1_P0.2/seed0;fedpac-beta0.1_P0.2/seed0;fedala-beta0.1_P0.4/seed0;fedper-beta0.1_P0.4/seed0;fedpac-beta0.1_P0.4/seed0;fedala-beta0.1_P1/seed0;fedper-beta0.1_P1/seed0;fedpac-beta0.1_P1/seed0'
"$python" -m fedjax_pfl.reproduce fedas_table3 train.client_mapping=map devices.cpu=1 --no-progress --require-data --out "$work" --cells "$cells" --dry-run > /dev/null || exit $?  # missing data: one line
pin=(); command -v taskset > /dev/null && pin=(taskset -c "$core")
nohup nice -n 19 "${pin[@]}" timeout -s INT -k 300 "$run_for" "$python" -m fedjax_pfl.reproduce fedas_table3 train.client_mapping=map devices.cpu=1 --no-progress --require-data --out "$work" --collect-into reproductions/fedas_table3 --cells "$cells" >> "$work/plan.log" 2>&1 < /dev/null &
echo $! > "$work/runner.pid"
echo "started fedas_table3's plan in the background (pid $!, core $core, nice 19, $seconds s): output in $work/plan.log; finished cells are copied into reproductions/fedas_table3/runs/"
