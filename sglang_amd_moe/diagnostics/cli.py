"""The ``sglang-amd-moe`` command: dispatches to ``audit``, ``check`` and ``demo``. A usage
error or a report that cannot be written is exit 2 with one line on stderr; Ctrl-C is 130."""

from __future__ import annotations

import importlib
import logging
import os
import sys

from sglang_amd_moe import __version__

PROG = "sglang-amd-moe"
SUBCOMMANDS = {  # name (its module under sglang_amd_moe.diagnostics) -> what it does
    "audit": "what is installed, what is broken, what the plugin changes",
    "check": "padded-batch end-to-end check on a small MoE model",
    "demo": "audit and check in each SGLang environment given, one table (`make demo`)",
}


#: Every ``SGLANG_AMD_MOE_*`` variable the package reads, as ``--help`` lists it (a test
#: compares this with the code, the README and docs/reference.md).
VARIABLES = {
    "SGLANG_AMD_MOE_DISABLE=1": "the plugin hooks nothing",
    "SGLANG_AMD_MOE_GUARD=0": "no guard at aiter's fused_moe entry (the other hooks stay)",
    "SGLANG_AMD_MOE_FORCE=1": "hook even where torch is not a ROCm build",
    "SGLANG_AMD_MOE_STRICT=1": "leave SGLang code the plugin does not know to upstream",
    "SGLANG_AMD_MOE_VERIFY=1": "check padded rows after every hooked call (debugging)",
    "SGLANG_AMD_MOE_DETERMINISTIC_SORT=1": "the MoE sort's deterministic path at every size",
    "SGLANG_AMD_MOE_PLAIN_LAUNCH=1": "launch kernels through Triton's own path",
    "SGLANG_AMD_MOE_STATS=0": "no counters of the entries the guard and the mask change",
    "SGLANG_AMD_MOE_CACHE_DIR=DIR": "where probe verdicts are cached (delete it to clear)",
    "SGLANG_AMD_MOE_PROBE_TIMEOUT=S": "seconds the probe's child process may take",
}

#: Where reports go when the wheel's metadata cannot be read (a source tree run directly).
TRACKER = "https://github.com/sglang-amd-moe/sglang-amd-moe/issues"


def tracker() -> str:
    """The issue tracker named in the installed wheel's metadata (``Project-URL: Issues``)."""
    try:
        from importlib.metadata import metadata

        for entry in metadata("sglang-amd-moe").get_all("Project-URL") or []:
            label, _, url = entry.partition(",")
            if label.strip().lower() == "issues" and url.strip():
                return url.strip()
    except Exception:  # no metadata (run from a source tree): the default below
        pass
    return TRACKER


def usage() -> str:
    commands = "\n".join(f"  {name:<6} {help_}" for name, help_ in SUBCOMMANDS.items())
    width = max(map(len, VARIABLES)) + 2
    variables = "\n".join(f"  {k:<{width}}{v}" for k, v in VARIABLES.items())
    return f"""\
usage: {PROG} [--version] [--help] {{{",".join(SUBCOMMANDS)}}} [options]

Correct padded-row MoE routing on AMD GPUs for SGLang and aiter. The plugin itself
needs no command (SGLang loads it); these commands show what it finds and does.

commands:
{commands}

Run `{PROG} COMMAND --help` for a command's options.

exit status:
  audit        0 nothing needs action, 1 something needs attention, 2 the audit failed
  check, demo  0 every row with the plugin matches, 1 a row does not match,
               2 cannot run (no SGLang, torch or Triton in this interpreter, bad
               arguments)
  every command: 2 for a usage error, a report that cannot be written, or a failure
               of the command itself (one line naming it); 130 on Ctrl-C

environment (read by the plugin in the server, and by these commands):
{variables}

report a problem: {tracker()}
(with `{PROG} --version` and `{PROG} audit --json`)
"""


class OutputError(Exception):
    """A report could not be written to stdout."""


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout and flush, or raise :class:`OutputError`; what the stream
    cannot encode (an ASCII locale) is written as backslash escapes, never lost."""
    out = sys.stdout
    if out is None:
        raise OutputError("stdout is closed")
    encoding = getattr(out, "encoding", None) or "utf-8"
    try:
        text = text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:
        text = text.encode("ascii", "backslashreplace").decode("ascii")
    try:
        out.write(text)
        out.flush()
    except (OSError, ValueError) as exc:  # EPIPE, EBADF, ENOSPC; ValueError: a closed file
        _silence_stdout()
        raise OutputError(_why(exc)) from exc


def _silence_stdout() -> None:
    """Point stdout at /dev/null after a failed write: the exit's own flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _where(exc: BaseException) -> str:
    """`` at FILE:LINE`` of the innermost frame of the traceback, for the report."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""


def _stderr(text: str) -> None:
    try:
        print(text, file=sys.stderr)
    except (OSError, ValueError, AttributeError):
        pass


def _output_failed(name: str, why: str) -> int:
    _silence_stdout()
    _stderr(f"{PROG}{' ' + name if name else ''}: error: cannot write to stdout: {why}")
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        _stderr(usage())
        return 2
    if argv[0] in {"-h", "--help", "--version"}:
        text = usage() if argv[0] != "--version" else f"{PROG} {__version__}\n"
        try:
            write_stdout(text)
        except OutputError as exc:
            return _output_failed("", str(exc))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        _stderr(f"{PROG}: unknown command {name!r}\n\n{usage()}")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        module = importlib.import_module(f"sglang_amd_moe.diagnostics.{name}")
        status = int(module.main(rest) or 0)
    except KeyboardInterrupt:
        _stderr(f"{PROG} {name}: interrupted")
        return 130
    except BrokenPipeError as exc:
        return _output_failed(name, _why(exc))
    except SystemExit:  # argparse's own usage errors (2) and --help (0)
        raise
    except Exception as exc:
        # A failure of the command itself, not a finding: one line, no traceback, and
        # "could not run" (2), never 1, which means "something needs attention".
        where = _where(exc)
        _stderr(
            f"{PROG} {name}: could not run: {type(exc).__name__}: {_why(exc)}{where} "
            f"({PROG} {__version__}; please report it at {tracker()})"
        )
        return 2
    try:  # what a command printed and did not flush is part of its report
        if sys.stdout is not None:
            sys.stdout.flush()
    except (OSError, ValueError) as exc:
        return _output_failed(name, _why(exc))
    return status
