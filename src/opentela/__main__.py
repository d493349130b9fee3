"""`python -m opentela` runs the `otela` command line."""

from opentela.cli import main

raise SystemExit(main())
