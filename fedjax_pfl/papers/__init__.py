"""Papers: the published tables as data and text.

A table file (configs/tables/*.yaml, read by table_spec.py, with the paper's
numbers parsed by paper_numbers.py) names its settings, methods and cells;
paper_table.py writes table.md with the paper's number beside ours
(earlier_table.py keeps cells an earlier run of the table made;
weight_notes.py adds how the cells weighed their clients; overview.py
counts every table). Running the cells is cells/'s.

It may import runs/ and everything below.
"""
