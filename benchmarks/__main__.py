"""``python -m benchmarks <command>``: the same as ``textrl-bench <command>``."""

import sys

from benchmarks.cli import main

sys.exit(main())
