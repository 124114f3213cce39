"""Entry script of the frozen app (PyInstaller runs this as ``__main__``): the same ``main`` as the
``offload-planner`` console script, so ``offload-planner [MODEL]`` opens the window and
``offload-planner inspect|plan|launch ...`` work headless."""

import multiprocessing

from offload_planner.cli import main

if __name__ == "__main__":
    multiprocessing.freeze_support()
    raise SystemExit(main())
