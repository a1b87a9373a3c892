"""Live trading: from the server's target weights to orders, fills, positions and NAV. No
torch: this package runs beside the server, on the serving image."""
