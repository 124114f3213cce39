"""``python -m offload_planner``."""

from offload_planner.cli import main

raise SystemExit(main())
