#!/usr/bin/env bash
# The real-server run of record, on the lent GPU machine, in one call:
#   bash .carry-server/server/device.sh        (OUT is set by the device tool)
# It installs the carried wheels (this package built from the tree under test, SGLang
# 0.5.13.post1 and the rest of its closure; see bundle.py) into a fresh target folder,
# then runs harness.py: five servers, the correctness rounds, the overhead rounds.
# Results: $OUT/server-h200.json, $OUT/server-<run>.log, $OUT/harness.log.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)
bundle=$(dirname "$here")
site=/tmp/sglang-amd-moe-server-site
rm -rf "$site"
{
    echo "[device.sh $(date +%T)] installing $(ls "$bundle"/wheels/*.whl | wc -l) wheels into $site"
    # The largest wheels are stored with LZMA (bundle.py): pip unpacks them with zipfile.
    python3 -c "import lzma" || { echo "python3 has no lzma: cannot unpack the wheels"; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
        "$bundle"/wheels/*.whl || exit 1
    echo "[device.sh $(date +%T)] installed"
    # The servers' Python is the image's python3 with the carried site first on its path.
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONUNBUFFERED=1
    python3 "$here/harness.py" --out "$OUT" --python python3 --sitecustomize-dir "$here/site" \
        --manifest "$bundle/manifest.json" ${HARNESS_ARGS:-}
} 2>&1 | tee "$OUT/harness.log"
exit "${PIPESTATUS[0]}"
