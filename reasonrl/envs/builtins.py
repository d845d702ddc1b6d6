"""Imports the shipped environments so that they register (the registry imports this module on its first lookup)."""
from . import code_feedback, python_env, search  # noqa: F401
