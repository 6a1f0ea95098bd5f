"""python -m server.perf: the same as `tensorgate perf`."""

import sys

from server.perf.cli import main

sys.exit(main())
