"""The on-disk model registry: which directories are versions, which one is production, and
how a version is published so that readers never see half of one.

Layout: ``REGISTRY/NAME/VERSION/`` (``model.onnx``, optional ``icm.onnx``, ``manifest.json``),
``REGISTRY/NAME/production.json`` (the production pointer), hidden staging directories
``REGISTRY/NAME/.tmp-<uuid>`` and hidden candidates ``REGISTRY/.candidates/NAME/VERSION``.

Torch-free and onnxruntime-free: the exporter, the retraining job and the server all use it.
``allocator.registry.naming`` is stdlib-only, so the gRPC client can import it too. This
``__init__`` imports nothing, for the same reason: import the modules themselves.
"""
