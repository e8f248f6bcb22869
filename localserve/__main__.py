"""`python -m localserve` runs the command line."""

from localserve.cli.main import main

raise SystemExit(main())
