"""The on-disk model registry: ``REGISTRY/NAME/VERSION/`` (``model.onnx``, optional ``icm.onnx``,
``manifest.json``), the pointer ``REGISTRY/NAME/production.json``, hidden staging
``NAME/.tmp-<uuid>`` and candidates ``REGISTRY/.candidates/NAME/VERSION``. This ``__init__``
imports nothing (``naming`` stays stdlib-only for the gRPC client): import the modules."""
