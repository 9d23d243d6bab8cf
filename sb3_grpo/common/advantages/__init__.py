"""Advantage forms beyond GAE: the per-step bookkeeping that turns finished episodes into advantages
(:mod:`.group_trackers`), and ``carry_over`` (:mod:`.carry_over`), which trains steps once their advantage is known."""
