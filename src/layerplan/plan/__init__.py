"""Planning: the papers' optimizers (Stanza node assignment, RALP profiler, Omnivore's g, Yan's DP)
and the cross-strategy planner."""
