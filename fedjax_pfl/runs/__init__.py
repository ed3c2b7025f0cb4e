"""Runs: from a config to a finished run.

- a run's config (config.py), validated once (experiment.py's `validate` -> `ValidRun`; a sweep's points:
  sweep_points.py), the experiment it builds (experiment.py), one run (single_run.py) or a sweep of
  seeds and values as federations of one program (sweep.py), both through the one
  round loop (loop.py, with call_planner.py and progress.py for what the
  screen shows; Ctrl-C and SIGTERM: process/stop_request.py);
- what a run writes while it trains (run_writer.py, records.py; the files
  themselves are outputs/) and how it continues (resume.py).

This layer sits below the commands (commands/: train and report), the paper
tables (papers/) and the entry points (fedjax_pfl/train.py, reproduce.py, report.py): it may import the engine,
methods, models, data and outputs, and nothing below imports it.
"""
