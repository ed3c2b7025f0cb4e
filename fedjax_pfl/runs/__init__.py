"""Runs: the commands' layer, from a config to a finished run.

- the training command (cli.py, its exit statuses and one-line errors from
  runs/command.py) and its config (config.py), the
  experiment it builds (experiment.py), one run (single_run.py) or a sweep of
  seeds and values on an experiment axis (sweep.py), both through the one
  round loop (loop.py, with call_planner.py, stop_request.py for Ctrl-C and
  progress.py for what the screen shows);
- what a run writes while it trains (run_writer.py, records.py; the files
  themselves are outputs/) and how it continues (resume.py).

This layer sits below the paper tables (papers/) and the entry points
(fedjax_pfl/train.py, reproduce.py, report.py): it may import the engine,
methods, models, data and outputs, and nothing below imports it.
"""
