"""Files that travel with a model: the versioned manifest, checksums, atomic writes."""
