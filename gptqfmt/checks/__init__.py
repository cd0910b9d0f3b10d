"""The rules verify applies, as findings: per module (modules.py, one entry for every source)
and of the label against the data (labels.py)."""
