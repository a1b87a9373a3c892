"""Statistics a skeptic accepts for a policy's daily net returns.

A walk-forward report of shares and medians says nothing about luck: a year of daily returns
puts a Sharpe ratio within about one unit of its truth. These pure functions on numpy arrays
give the uncertainty and the tests:

- ``sharpe``: the annualized Sharpe ratio, and the excess Sharpe of a policy over a benchmark
  on the same days with a stationary-bootstrap confidence interval (paired days resampled in
  blocks, so autocorrelation and the two series' correlation are kept);
- ``spa``: Hansen's test of superior predictive ability of the policy against baselines;
- ``deflated``: the probabilistic and the deflated Sharpe ratio of Bailey and Lopez de Prado
  (2014), which discount a Sharpe for short samples, fat tails and the configurations tried.

Bad input (mismatched lengths, NaN, too few days) raises ``ValueError`` naming what is wrong
(``checks``). The bootstraps come from ``arch``; every random draw is seeded.
"""
