"""`python -m vramfabric.worker.executor`: one executor process, started by the node agent."""

from __future__ import annotations

import sys

from .process import main

if __name__ == "__main__":
    sys.exit(main())
