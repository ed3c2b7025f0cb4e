"""Papers: the published tables, run and compared.

A table file (configs/tables/*.yaml, read by table_spec.py, with the paper's
numbers parsed by paper_numbers.py) names its settings, methods and cells;
reproduce.py runs the missing cells through the training command
(parallel_cells.py runs cells side by side, data_check.py finds missing
datasets first) and paper_table.py writes table.md with the paper's number
beside ours (earlier_table.py keeps cells an earlier run of the table made).

The top layer below the entry points: it may import runs/ and everything below.
"""
