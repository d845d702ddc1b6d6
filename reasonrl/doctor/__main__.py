"""``python -m reasonrl.doctor``."""
import sys

from reasonrl.doctor.cli import main

sys.exit(main())
