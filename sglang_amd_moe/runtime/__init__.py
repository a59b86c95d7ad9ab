"""What runs inside a server process: the plugin entry points, the hook skeleton
(``target``) and the SGLang and aiter targets. Nothing here imports
:mod:`sglang_amd_moe.diagnostics`."""
