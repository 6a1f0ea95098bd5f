"""python -m bench.perf: the same as `tensorgate perf`."""

import sys

from bench.perf.cli import main

sys.exit(main())
