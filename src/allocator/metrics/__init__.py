"""Prometheus metric definitions and the Pushgateway client."""
