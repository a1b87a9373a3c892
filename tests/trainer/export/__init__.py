"""Export tests share two tiny trained runs (``conftest.py``) and these figures."""

TOL = 1e-5
MAX_ASSETS = 4  # the market has 3 assets, so one slot is always masked on real data
SHARED_MAX_ASSETS = 6  # shared runs train on 6 slots of a 12-asset market
