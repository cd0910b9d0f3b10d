"""safetensors container: strict header parsing, mmap views, sharded indexes, a writer."""
from .dtypes import DTYPES, bf16_to_f32, f32_to_bf16
from .header import Header, TensorInfo, parse_header
from .reader import SafetensorsFile
from .writer import save_file

__all__ = ["DTYPES", "Header", "SafetensorsFile", "TensorInfo", "bf16_to_f32", "f32_to_bf16",
           "parse_header", "save_file"]
