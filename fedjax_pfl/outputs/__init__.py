"""Outputs: the files a run leaves for people to read, written and read back without JAX.

- written while training: metrics.jsonl (metrics_file.py), config.json and
  summary.json (run_output.py, with machine.py naming the hardware),
  metrics.csv and clients.csv (tables.py), figures (figures.py), TensorBoard
  event files (tensorboard_log.py), all behind results_writer.py; every file
  through atomic_file.py or an fsynced append;
- read back (run_folder.py) and checked before a run writes (output_folder.py);
- a stopped run kept as a compact record for the repository (compact_record.py).

Uses only core: the run loop (runs/) and the paper tables (papers/) both build on it, so a report or a
table can be made where no accelerator or training code runs.
"""
