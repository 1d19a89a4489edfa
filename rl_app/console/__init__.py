"""What people look at: live progress (``progress``, ``sweep``), system telemetry and TensorBoard
(``telemetry``), PNG plots (``plots``) and the read-only commands list/show/runs (``commands``)."""
