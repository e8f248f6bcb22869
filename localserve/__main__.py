"""`python -m localserve` runs the command line."""

from localserve.cli import main

raise SystemExit(main())
