"""Runs: the commands' layer, from a config to the folders people read.

- the commands' shared rules (command.py: one-line errors, exit statuses,
  error.log); the training command (cli.py) and its config (config.py), the
  experiment it builds (experiment.py), one run (single_run.py) or a sweep of
  seeds and values on an experiment axis (sweep.py), both through the one
  round loop (loop.py, with call_planner.py, stop_request.py for Ctrl-C and
  progress.py for what the screen shows);
- the run folder: written while training (run_writer.py, records.py,
  metrics_file.py, run_output.py, results_writer.py with tables.py,
  figures.py and tensorboard_log.py; every file through atomic_file.py or
  an fsynced append), read back (run_folder.py), checked before writing
  (output_folder.py), continued (resume.py);
- runs side by side (report.py) and papers' tables (reproduce.py,
  table_spec.py, paper_numbers.py, paper_table.py; data_check.py finds a
  table's missing datasets before it runs).

This is the top layer below the entry points (fedjax_pfl/train.py,
reproduce.py, report.py): it may import the engine, methods, models and
data, and nothing below imports it. The readers (run_folder.py, report.py,
paper_table.py, paper_numbers.py, tables.py, figures.py) need no JAX at import, so a report
can be made where no accelerator or training code runs.
"""
