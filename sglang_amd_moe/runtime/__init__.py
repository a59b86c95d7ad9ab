"""What runs inside a server process: the plugin entry points, the form classifiers and
the hooks. Nothing here imports :mod:`sglang_amd_moe.diagnostics`."""
