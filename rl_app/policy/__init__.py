"""A trained policy without RLlib's training machinery: the module as plain torch (``module``),
evaluated over episodes and on video (``evaluate``), exported to TorchScript or ONNX (``export``)."""

# The version of each file entry in an export's policy.json. 2: SAC's deterministic action is
# tanh(mean), the squashed Gaussian's mode; files without one came from rl_app before that and act
# with RLlib 2.60's clip(mean) (rl_app.rllib.distributions).
EXPORT_FORMAT_VERSION = 2
