"""The market suite: a recipe on generated markets whose right answer is known and on the S&P 500
development years, scored beside its anchor, equal weight, the best simple rule chosen on the
training span and the generator's ceiling (docs/suite.md)."""
