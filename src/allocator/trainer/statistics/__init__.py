"""Statistics a skeptic accepts for a policy's daily net returns: excess Sharpe intervals, SPA
and the deflated Sharpe; bad input raises ``ValueError`` and every bootstrap draw is seeded."""
