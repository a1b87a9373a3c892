"""Statistics a skeptic accepts for a policy's daily net returns: excess Sharpe intervals
(``sharpe``), Hansen's SPA (``spa``) and the deflated Sharpe (``deflated``). Bad input raises
``ValueError`` naming what is wrong (``checks``); every bootstrap draw is seeded."""
