"""`python -m launch ...`."""

from launch.cli import main

raise SystemExit(main())
