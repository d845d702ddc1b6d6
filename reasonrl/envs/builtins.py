"""Imports the shipped environments so that they register (the package face imports this module once the registry exists)."""
from . import code_feedback, python_env, search  # noqa: F401
