"""The collector pause around plugin load: the plugin's own allocations must not be what
starts the full collection SGLang's imports made due (0.1-1 s on a large heap), and a child
forked while it is paused gets the collector back as it was."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

from sglang_amd_moe.runtime import collector_paused


def _passes(generation: int) -> int:
    return gc.get_stats()[generation]["collections"]


def test_allocations_inside_count_as_one_young_pass() -> None:
    assert gc.isenabled()
    gc.collect()
    young, middle, full = _passes(0), _passes(1), _passes(2)
    middle_count = gc.get_count()[1]
    with collector_paused():
        assert not gc.isenabled()
        kept = [{} for _ in range(20_000)]  # ~28 automatic young passes if left running
    assert gc.isenabled()
    assert (_passes(0), _passes(1), _passes(2)) == (young + 1, middle, full)
    assert gc.get_count()[0] < 50 and gc.get_count()[1] == middle_count + 1
    del kept


def test_a_collector_turned_off_stays_off_and_gets_no_pass() -> None:
    gc.disable()
    try:
        young = _passes(0)
        with collector_paused():
            [{} for _ in range(5_000)]
        assert not gc.isenabled() and _passes(0) == young
    finally:
        gc.enable()


def test_entry_point_import_leaves_the_rest_for_register() -> None:
    # load_plugins() imports the entry point's module before it calls register(): that
    # import runs with the collector on, so it must stay small.
    code = (
        "import sys, sglang_amd_moe.runtime.plugin as p; "
        "print(sorted(m for m in sys.modules if m.startswith('sglang_amd_moe')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(
        ["sglang_amd_moe", "sglang_amd_moe.runtime", "sglang_amd_moe.runtime.plugin"]
    )


def _fork_while_another_thread_pauses() -> bool:
    """Fork while another thread is inside the pause: whether the child's collector is on."""
    inside, leave = threading.Event(), threading.Event()

    def decide() -> None:
        with collector_paused():
            inside.set()
            leave.wait()

    t = threading.Thread(target=decide)
    t.start()
    inside.wait()
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the pausing thread does not exist here
            os.write(w, b"1" if gc.isenabled() else b"0")
            os._exit(0)
        os.close(w)
        seen = os.read(r, 1)
        os.close(r)
        os.waitpid(pid, 0)
        return seen == b"1"
    finally:
        leave.set()
        t.join()


def test_a_child_forked_during_the_pause_gets_the_collector_back() -> None:
    """On main a fork from another thread while the plugin decided left the child's
    collector off for good."""
    assert gc.isenabled()
    assert _fork_while_another_thread_pauses() is True
    assert gc.isenabled()


def test_a_child_forked_during_the_pause_of_a_host_without_collector_keeps_it_off() -> None:
    gc.disable()
    try:
        assert _fork_while_another_thread_pauses() is False
        assert not gc.isenabled()
    finally:
        gc.enable()
