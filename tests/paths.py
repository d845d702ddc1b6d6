"""Where the repository and the tests' shared modules are, for a test module at any depth under tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
"""tests/: the shared helpers (helpers.py, components.py, ...) and conftest.py; on sys.path through conftest.py."""
REPO = TESTS.parent
"""The repository root."""
