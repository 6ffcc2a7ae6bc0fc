"""`python -m vramfabric`: the `vramfabric` CLI."""

from .cli import main

raise SystemExit(main())
