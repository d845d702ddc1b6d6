"""Imports the shipped environments so that they register (``registry._load_builtins``)."""
from . import python_env  # noqa: F401
