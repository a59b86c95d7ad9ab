"""``python -m sglang_amd_moe`` is the ``sglang-amd-moe`` command."""

import sys

from sglang_amd_moe.diagnostics.cli import main

sys.exit(main())
