"""``python -m cdcsync.devstack.workload``."""

import sys

from cdcsync.devstack.workload.cli import main

sys.exit(main())
