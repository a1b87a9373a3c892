"""Live trading: from the server's target weights to orders, fills, positions and NAV.

``sizing`` turns a target into orders (pure functions), ``broker`` is the interface every broker
sits behind, ``paper`` the embedded broker, ``book`` the recorded positions and P&L, ``cycle``
one account's cycle for one bar, run exactly once. No torch: this package runs beside the
server, on the serving image.
"""
