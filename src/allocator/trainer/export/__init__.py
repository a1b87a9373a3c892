"""ONNX export of a run, checked against torch before publishing."""
