"""What the system records: the SQL trade schema, its settings and the Prometheus metrics."""
