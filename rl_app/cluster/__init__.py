"""Where Ray runs: one Ray session per command (``session``), how its CPUs and GPUs are spread
(``resources``), a local head node on 127.0.0.1 (``head``), and Ray Jobs on a cluster (``jobs``)."""
