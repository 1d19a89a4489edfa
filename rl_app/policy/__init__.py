"""A trained policy without RLlib's training machinery: the module as plain torch (``module``),
evaluated over episodes and on video (``evaluate``), exported to TorchScript or ONNX (``export``)."""
