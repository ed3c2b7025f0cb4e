"""Runs: the commands' layer, from a config to the folders people read.

- the training command (cli.py) and its config (config.py), the experiment it
  builds (experiment.py), one run (single_run.py) or a sweep of seeds and
  values on an experiment axis (sweep.py), both through the one round loop
  (loop.py, with call_planner.py, stop_request.py, progress.py);
- the run folder: written while training (run_writer.py, records.py,
  run_output.py, results_writer.py: tables.py, figures.py,
  tensorboard_log.py), read back (run_folder.py), checked before writing
  (output_folder.py), continued (resume.py);
- runs side by side (report.py) and papers' tables (reproduce.py,
  table_spec.py, paper_table.py).

This is the top layer below the entry points: it may import the engine,
methods, models and data, and nothing below imports it. The readers
(run_folder.py, report.py, paper_table.py, tables.py, figures.py) need no
JAX, so a report can be made where no accelerator or training code runs.
"""
