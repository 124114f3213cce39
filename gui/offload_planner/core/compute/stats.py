"""Counters of the incremental reserve's paths (:mod:`.incremental`), read by tests and benches."""

#: replays, full runs, refusals; item_diffs: changes found by comparing placement items by identity;
#: late_start: windows starting at the first affected node inside a split; moved_back: replay starts
#: moved back before a use whose count the window changes; tails: backends whose allocator was still
#: in another state than the reference's after the window, replayed from the reference's event list;
#: plain: first simulations of a topology, run without recording a reference; skips: stretches of a
#: window taken from the reference's events; diff_shortcuts: remaining window counts taken as the whole
#: window's less the shorter part before; tail_hits: tails that met a state an earlier tail passed;
#: period_jumps: runs of equal layers a tail or a stretch jumped; period_misses: runs whose first period
#: did not bring the state back (walked on; see .periods); graph_reuses: graphs re-placed instead of
#: built (.template); far: changes densely spanning most of the graph, simulated in full (replay.FAR_SPAN);
#: replay_errors: replays that raised
#: something other than a refusal (a bug, hidden from the user by a full run; the tests require none);
#: left_out: one-token reserves a replay left out (a bound put them below the prompt reserve everywhere);
#: left_out_early: of which those a bound put there after passes 1-4 (``_Replay.early_bound``) or
#: before them; left_out_any: of which those the bound of any placement put there
#: (``Reference.below_any_placement``); patched_back: replay starts not moved back, the one backend whose
#: allocator a count before the window changes patched from the reference's events instead;
#: graph_copies: kept graphs copied from one a recorded reference took (.template), not built;
#: walk_jumps: periods of equal layers a from-scratch walk over a kept graph jumped (.jumps);
#: walk_restarts: such walks that found a jump inexact and walked again without jumps (the tests require
#: none); sched_layers: layers whose scheduler pass on a kept graph was taken from an earlier equal layer
#: (.sched_layers); rec_jumps: periods of equal layers a reference's recording walk jumped (.rec_jumps);
#: rec_restarts: such recordings that found a jump inexact and recorded again without jumps (the tests
#: require none); from_start: replays whose free leaf (DSA's zeros, .dsa) moved to another backend: the
#: allocator walked again from the graph's start over the replayed schedule
stats = {"replays": 0, "full": 0, "refused": 0, "replay_errors": 0, "item_diffs": 0, "late_start": 0,
         "moved_back": 0, "patched_back": 0,
         "tails": 0, "plain": 0, "skips": 0, "diff_shortcuts": 0,
         "tail_hits": 0, "period_jumps": 0, "period_misses": 0, "graph_reuses": 0,
         "far": 0, "left_out": 0, "left_out_early": 0, "left_out_any": 0, "walk_jumps": 0, "walk_restarts": 0,
         "graph_copies": 0, "sched_layers": 0, "rec_jumps": 0, "rec_restarts": 0, "from_start": 0}
