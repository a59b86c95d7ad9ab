"""Sample outputs in the docs, copied from real runs of the installed wheel.

A sample is a fenced block right after a marker line::

    <!-- sample NAME (tools/docs_samples.py) -->
    ```
    ...what the command printed...
    ```

``SAMPLES`` says, for each NAME, which command makes it and in which environment (the
installed-wheel environments of ``tests/installed``). ``tests/installed`` runs each command
and fails when the block no longer matches what the code prints (after
:func:`normalize`, which blanks what differs from run to run: paths, times, process ids).

To rewrite the blocks from fresh runs (after changing what a command prints), run those
tests with ``SGLANG_AMD_MOE_TEST_WRITE_SAMPLES=1`` (test-only)::

    SGLANG_AMD_MOE_TEST_WRITE_SAMPLES=1 .venv/bin/python -m pytest -p no:xdist \\
        tests/installed -k docs_samples
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- sample (?P<name>[\w.-]+) \(tools/docs_samples\.py\) -->\n```\n", re.M)

#: Run the real ``load_plugins()`` in a fresh interpreter, then import topk as a scheduler
#: does: the plugin's own log lines (stderr) are the sample.
LOAD_PLUGINS = """\
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.layers.moe.topk
"""


@dataclass(frozen=True)
class Sample:
    doc: str  # relative to the repository
    env: str  # an installed-wheel environment (tests/installed): bare or a release label
    argv: tuple[str, ...]  # after the environment's python
    stream: str  # "stdout", or "stderr" for log lines
    extra_env: tuple[tuple[str, str], ...] = ()
    keep: str = ""  # a regex: keep only the lines that match it (log lines)


SAMPLES = {
    "audit-0.5.13.post1": Sample(
        "docs/reference.md", "0.5.13.post1", ("-m", "sglang_amd_moe", "audit"), "stdout"
    ),
    "plugin-log-0.5.13.post1": Sample(
        "README.md",
        "0.5.13.post1",
        ("-c", LOAD_PLUGINS),
        "stderr",
        (("SGLANG_AMD_MOE_FORCE", "1"),),
        keep=r" sglang_amd_moe INFO: ",
    ),
}

_PATH = re.compile(r"(?:/[\w.+-]+)+/(?:view-\d+|site-packages)/")
_PYTHON = re.compile(r"(?:/[\w.+-]+)+/bin/python\S*")
_STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ \d+\]", re.M)
_TIME = re.compile(r"\b\d+(?:\.\d+)? ?(?:ms|s)\b")


def normalize(text: str) -> str:
    """What a sample must match exactly: paths into an environment become
    ``.../site-packages/``, interpreters ``.../bin/python``, and time stamps, process ids
    and durations are blanked."""
    text = _PATH.sub(".../site-packages/", text)
    text = _PYTHON.sub(".../bin/python", text)
    text = _STAMP.sub("[TIME PID]", text)
    return _TIME.sub("N s", text)


def select(sample: Sample, stdout: str, stderr: str) -> str:
    """The part of a run's output a sample shows."""
    text = stdout if sample.stream == "stdout" else stderr
    if sample.keep:
        text = "".join(ln for ln in text.splitlines(True) if re.search(sample.keep, ln))
    return text


def blocks(text: str) -> dict[str, tuple[int, int]]:
    """NAME -> (start, end) of each sample block's content in ``text``."""
    out = {}
    for m in MARKER.finditer(text):
        end = text.index("```\n", m.end())
        out[m["name"]] = (m.end(), end)
    return out


def shown(name: str) -> str:
    sample = SAMPLES[name]
    text = (REPO / sample.doc).read_text()
    start, end = blocks(text)[name]
    return text[start:end]


def write(name: str, output: str) -> None:
    sample = SAMPLES[name]
    path = REPO / sample.doc
    text = path.read_text()
    start, end = blocks(text)[name]
    path.write_text(text[:start] + _PATH.sub(".../site-packages/", output) + text[end:])
