"""What runs inside a server process: the plugin entry points, the hook skeleton
(``target``) and the SGLang and aiter targets. Nothing here imports
:mod:`sglang_amd_moe.diagnostics`.

:func:`collector_paused` lives here, with nothing but the standard library around it, so
the entry point can pause the collector before it imports the rest of the plugin.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's garbage collector paused while the plugin imports itself and decides (at
    plugin load, and at a watched module's import), then one young-generation pass over
    what it allocated, then the collector back as it was.

    Right after SGLang's imports a full collection of their objects is often due: the next
    few automatic young passes start it, and on a large heap it takes 0.1-1 s. Left running,
    the plugin's few thousand allocations would make those passes, so the plugin's load
    would run SGLang's collection. Paused, they add one cheap pass (``gc.collect(0)``
    counts once towards the older generations, as one automatic pass would), and the full
    collection runs when the process's own allocations make it due, as without the plugin.
    A process that turned the collector off keeps it off, and gets no pass. A process
    forked while the collector is paused gets it back as it was before the pause.
    """
    collecting = gc.isenabled()
    if not _paused[0]:
        _paused[1] = collecting  # the state a forked child gets back
    _paused[0] += 1
    gc.disable()
    try:
        yield
    finally:
        _paused[0] -= 1
        if collecting:
            gc.collect(0)
            gc.enable()


# [pauses in progress, the collector was on before the first]. A child forked by another
# thread while the plugin decides never leaves the pause: it gets the collector back here.
_paused: list = [0, False]


def _collector_back_in_child() -> None:
    if _paused[0]:
        _paused[0] = 0
        if _paused[1]:
            gc.enable()


os.register_at_fork(after_in_child=_collector_back_in_child)
