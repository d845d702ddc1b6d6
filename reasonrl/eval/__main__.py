"""``python -m reasonrl.eval task=... model.path=... eval.n=... eval.k=[...]``."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
