"""python -m tensorgate.perf: the same as `tensorgate perf`."""

import sys

from tensorgate.perf.cli import main

sys.exit(main())
