"""The commands: ``python -m fedjax_pfl.train`` (train.py) and ``python -m fedjax_pfl.report`` (report.py),
and what every command shares (command.py: one-line errors, honest exit statuses). ``python -m
fedjax_pfl.reproduce`` builds on the train command from papers/.
"""
