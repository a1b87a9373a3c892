"""The on-disk model registry: versions, the production pointer, and atomic publishing.

``REGISTRY/NAME/VERSION/`` (``model.onnx``, optional ``icm.onnx``, ``manifest.json``),
``REGISTRY/NAME/production.json``, hidden staging ``NAME/.tmp-<uuid>`` and hidden candidates
``REGISTRY/.candidates/NAME/VERSION``. Torch- and onnxruntime-free; ``naming`` is stdlib-only
for the gRPC client, so this ``__init__`` imports nothing: import the modules themselves.
"""
