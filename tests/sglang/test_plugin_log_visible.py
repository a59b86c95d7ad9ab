"""The plugin's one INFO line reaches stderr in a process whose logging is not configured
yet (as in every SGLang server process when ``load_plugins()`` runs), and each line once
only: not again through the root logger once SGLang configures logging."""

from __future__ import annotations

import os
import subprocess
import sys

CODE = """
import logging
from sglang_amd_moe.runtime import plugin
plugin.register()
plugin.register()  # idempotent: no second line
logging.basicConfig(level=logging.INFO)  # SGLang configuring logging afterwards
logging.getLogger("sglang_amd_moe").info("after basicConfig")
"""


def test_info_line_printed_once_without_logging_config() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_AMD_MOE_")}
    env["SGLANG_AMD_MOE_DISABLE"] = "1"  # the same entry, without importing SGLang
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stderr.splitlines() if "sglang_amd_moe" in x]
    assert sum("disabled by SGLANG_AMD_MOE_DISABLE=1" in x for x in lines) == 2, out.stderr
    assert sum("after basicConfig" in x for x in lines) == 1, out.stderr
