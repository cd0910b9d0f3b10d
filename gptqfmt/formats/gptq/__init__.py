"""GPTQ's packing in its two zero-point conventions: its configs (config.py), its modules
from the tensors (checkpoint.py), read as a Source (source.py) and written (writer.py)."""
