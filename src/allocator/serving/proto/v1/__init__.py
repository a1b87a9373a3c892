"""Generated code of proto/allocator/v1/allocator.proto (scripts/generate_proto.py)."""
