"""What the system records: decision records, the durable recorder, the SQL trade schema."""
