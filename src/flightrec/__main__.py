"""`python -m flightrec`: the same as the `flightrec` console script."""

from flightrec.cli import main

raise SystemExit(main())
