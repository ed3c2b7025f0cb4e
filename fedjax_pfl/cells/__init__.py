"""Cells: running a paper's table, one cell (a row in a setting, a seed) at a time.

reproduce.py is the table command: it runs the missing cells through the
training command (cell_command.py builds each cell's command line and reads
the state of its run folder; parallel_cells.py runs cells side by side;
data_check.py finds missing datasets first) and has papers/ write the table.
A time budget: run_plan.py orders and packs the missing cells into commands,
plan_command.py writes the plan from the measured seconds of a device kind
(round_seconds.py); a background plan (the CPU's) runs in a work folder
whose log (plan_log.py) the next plan reads, and copies each finished cell
into the table's folder (collect.py).

The top layer below the entry points: it may import papers/, runs/ and everything below.
"""
