"""The zero-point convention of a GPTQ checkpoint from its data: code sums (codestats.py),
statistics of one module (stats.py), its verdict (decide.py), the checkpoint's from all of
them (pool.py), and the reading of the data around those pure functions (read.py)."""
