"""Tests of allocator.artifacts: manifests and durable file writes."""
