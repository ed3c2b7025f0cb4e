"""Continuing a run (``--resume --out RUN``): what its folder must hold and what may change.

A resumed run uses the configuration saved in RUN/config.json (only
``train.rounds`` may grow, plus the settings in
`config.RESUME_MAY_CHANGE`), the same partition, and its checkpoint; every
mismatch is a one-line `UserError` raised before anything in the folder
changes. metrics.jsonl keeps the records up to the checkpoint's round and
loses none: a damaged line that held a later round (a write cut short by a
kill) is dropped, as that round runs again; a damaged line that held an
earlier one, or a missing file or record of a round up to the checkpoint's,
stops the resume with what is lost and how to repair it.
Reads only.
"""

from __future__ import annotations

from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.outputs import run_output
from fedjax_pfl.outputs.compact_record import is_compact
from fedjax_pfl.outputs.metrics_file import read_metrics


def saved_run(out: Path | None, cfg=None) -> dict:
    """The config.json of the run in ``out`` (to resume it), or UserError."""
    if not out or (cfg is not None and not cfg.out):
        raise UserError("--resume needs --out FOLDER, the folder of the run to continue")
    saved = run_output.read_json(Path(out) / "config.json")
    if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict):
        raise UserError(f"nothing to resume in {out} (no readable config.json); run without --resume to start afresh")
    if is_compact(out):
        raise UserError(f"{out} is a compact record of a stopped run (metrics.jsonl.xz, no partition.json): it "
                        "cannot be resumed; train it again in another --out")
    return saved


def check_same_method(saved: dict, method_name: str, out) -> None:
    """A resumed run keeps its method: another one is refused naming both, before the other method's options
    are checked against the saved ones."""
    before = saved["config"].get("method_name")
    if method_name != before:
        raise UserError(f"--resume continues the {before} run in {out}; --method {method_name} would change its "
                        f"method: leave --method out (or pass --method {before}), or run {method_name} in another "
                        "--out")


def check_same_config(saved: dict, cfg) -> None:
    """A resumed run must use the configuration it was started with (train.rounds may grow)."""
    changed = config_lib.resume_differences(saved["config"], config_lib.to_dict(cfg))
    if changed:
        raise UserError(f"--resume must use the configuration the run was started with; changed: {'; '.join(changed)}"
                        " (only train.rounds may grow)")


def check_resume(saved: dict, cfg, done: int, partition_now: dict, partition_saved) -> list[dict]:
    """Checks a resume from a checkpoint after round ``done`` against what the run was started with
    -> the updated resume history."""
    check_same_config(saved, cfg)
    before = saved["config"]["train"]["rounds"]
    rounds = cfg.train.rounds
    if cfg.train.lr_schedule == "cosine" and rounds != before:
        raise UserError(f"a cosine lr schedule spans the run's {before} rounds; it cannot be extended to {rounds}")
    if done >= rounds:
        if rounds == before:
            raise UserError(f"the run in {cfg.out} already finished its {rounds} rounds; to extend it, "
                            f"pass a larger --rounds with --resume")
        raise UserError(f"the checkpoint is after round {done}; --rounds must be more than {done}")
    if partition_saved is not None and run_output.as_json(partition_now) != partition_saved:
        raise UserError("the data give a different partition than the run was started with; resume with the same "
                        "dataset files")
    return [*saved.get("resumed", []), {"after_round": done, "rounds_before": before, "rounds": rounds}]


def evaluated_rounds(saved: dict) -> set[int]:
    """The rounds (from 1) after which the saved run evaluated, up to its planned rounds (and earlier ends)."""
    config = saved["config"]
    rounds, every = config["train"]["rounds"], config["eval_every"]
    ends = {rounds, *(h.get("rounds_before", rounds) for h in saved.get("resumed", []))}
    return {r for r in range(1, rounds + 1) if r % every == 0 or r in ends}


def check_metrics(out: Path, saved: dict, done: int) -> list[str]:
    """UserError when a damaged line of ``out``/metrics.jsonl held a round <= ``done`` (it would be lost);
    otherwise the warnings for the damaged lines that are dropped (their rounds run again)."""
    metrics = read_metrics(Path(out) / "metrics.jsonl")
    evaluated = sorted(evaluated_rounds(saved))
    warnings = []
    for number in metrics.damaged:
        before = [r["round"] for r, at in zip(metrics.records, metrics.line_of) if at < number]
        held = next((r for r in evaluated if r > (before[-1] if before else 0)), None)  # the round it must hold
        if held is not None and held <= done:
            raise UserError(f"{metrics.path} line {number} is damaged (not a metrics record) and held round {held}, "
                            f"at or before the checkpoint's round {done}: resuming would lose it; restore that line "
                            "(e.g. from a backup), or delete it to resume without that evaluation")
        warnings.append(f"warning: {metrics.path} line {number} is damaged (a write cut short); it held a round after "
                        f"the checkpoint's round {done}, which runs again")
    present = {r["round"] for r in metrics.records}
    lost = [r for r in evaluated if r <= done and r not in present]
    if lost:
        what = ("is missing" if not metrics.path.exists() else
                f"lacks the record{'s' if len(lost) > 1 else ''} of round{'s' if len(lost) > 1 else ''} "
                f"{_rounds_text(lost)}")
        raise UserError(f"{metrics.path} {what}, though the checkpoint is after round {done}: resuming would drop "
                        f"{'them' if len(lost) > 1 else 'it'} from the run's history and summary; restore the file "
                        "(e.g. from a backup), or start the run afresh (in place with --start-over, or in a new --out)")
    return warnings


def _rounds_text(rounds: list[int]) -> str:
    """'3', '1-3', '1-3, 5' for sorted round numbers."""
    spans: list[list[int]] = []
    for r in rounds:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
