"""Command-line interface: thin click commands and reporters. The only place that prints or exits."""
from .main import main

__all__ = ["main"]
