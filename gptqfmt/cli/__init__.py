"""Command-line interface: thin click commands and reporters. The only place that prints or
exits."""
from .main import main, run

__all__ = ["main", "run"]
