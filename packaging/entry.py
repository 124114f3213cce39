"""Entry script of the frozen app (PyInstaller runs this as ``__main__``): the same ``main`` as the
``offload-planner`` console script, so ``offload-planner [MODEL]`` opens the window and
``offload-planner inspect|plan|launch ...`` work headless.  ``offload-planner --exec-guard ...`` is
the frozen app's way to run :mod:`offload_planner.backend.exec_guard` (there is no separate
interpreter to run it with): it ties a child to the planner's life and becomes that child."""

import sys

from offload_planner.backend import exec_guard

if __name__ == "__main__" and sys.argv[1:2] == [exec_guard.FLAG]:
    exec_guard.main(sys.argv[2:])

import multiprocessing  # noqa: E402 - not needed when exec_guard took over

from offload_planner.cli import main  # noqa: E402

if __name__ == "__main__":
    multiprocessing.freeze_support()
    raise SystemExit(main())
