"""The backend dialects: one object per llama-server build family, asked for everything that differs.

``dialect_named(name)`` / ``Dialect(name)`` look one up, ``all_dialects()`` lists them in the order
they were registered.  A new build family is one module here: a :class:`Dialect` subclass (usually
of an existing one) registered under its name, imported below.
"""

from __future__ import annotations

# Registration order is the order menus and --backend list them: keep it.
# isort: off
from offload_planner.core.dialects.base import Dialect, all_dialects, dialect_named, register, unregister
from offload_planner.core.dialects.mainline import LLAMA_CPP
from offload_planner.core.dialects.mainline_2025 import LLAMA_CPP_2025
from offload_planner.core.dialects.mainline_2025_early import LLAMA_CPP_2025_EARLY
from offload_planner.core.dialects.ik import IK
from offload_planner.core.dialects.ik_amb256 import IK_AMB256
from offload_planner.core.dialects.ik_2025 import IK_2025
from offload_planner.core.dialects.ik_2025_05 import IK_2025_05
# isort: on

__all__ = ["IK", "IK_2025", "IK_2025_05", "IK_AMB256", "LLAMA_CPP", "LLAMA_CPP_2025", "LLAMA_CPP_2025_EARLY",
           "Dialect", "all_dialects", "dialect_named", "register", "unregister"]
