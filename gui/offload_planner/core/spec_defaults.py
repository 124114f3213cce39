"""The pinned llama.cpp's speculative-decoding defaults, in a module that imports nothing of the planner:
``core.speculative`` (which imports the dialects) and the dialects (``Dialect.draft_n_max``) both read
them from here, so neither has to repeat them (a dialect importing ``core.speculative`` made a cycle).
The dated builds' own defaults live with their dialects (``mainline_2025``, ``handlers_ik_spec``)."""

from __future__ import annotations

#: ``--spec-type`` values whose draft length is ``--spec-draft-n-max`` (``common_speculative_n_max``,
#: common/speculative.cpp): the ones that run a draft model or the MTP head
DRAFT_TYPES = frozenset({"draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"})

#: ``common_params_speculative_draft::n_max`` (common/common.h): tokens drafted a step without
#: ``--spec-draft-n-max``
DEFAULT_DRAFT_N_MAX = 3
