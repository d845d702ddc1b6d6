"""Imports the shipped environments so that they register (``registry._load_builtins``)."""
from . import code_feedback, python_env, search  # noqa: F401
