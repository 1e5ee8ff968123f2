#!/usr/bin/env bash
# Issue 18's GPU check, run on a lent GPU machine (no network, no hub; `run` tool of this workplace):
#   carry .whl (trl, datasets, pydantic, math-verify wheels for Python 3.12) and .gpu/tokenizer (SmolLM2's).
# Hone vs TRL on the `qwen05b` workload in bf16, 2 alternating rounds, and Hone's MFU against a measured
# bf16 matmul peak. Writes $OUT/vs_trl_bf16_cuda.json and $OUT/gpu_check.log.
set -o pipefail
OUT=${OUT:-bench/results}
wheels=$(ls .whl/*.whl | grep -v pyarrow)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels || exit 1
# datasets 5.2 wants pyarrow >= 24; carry it only where the machine's is older.
if ! python3 -c "import pyarrow, sys; sys.exit(int(pyarrow.__version__.split('.')[0]) < 24)"; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/pyarrow*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HONE_BENCH_TOKENIZER=$PWD/.gpu/tokenizer
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, trl, datasets, pyarrow; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__)"
  python3 bench/vs_trl.py --device cuda --workloads qwen05b --dtype bf16 --rounds "${ROUNDS:-2}" --out "$OUT"
} 2>&1 | tee "$OUT/gpu_check.log"
