#!/usr/bin/env bash
# The wide live run on a GPU host: one hangd serve watching healthy 4- and 8-rank jobs sharing the GPU.
# See scripts/gpu_live_wide.py. Where hangd's dependencies are not installed, wheels in .whl/ are
# installed to /tmp/site first (pip install --no-index; no network needed).
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if ! python3 -c 'import fastapi, uvicorn, sqlalchemy, pydantic_settings' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
out="${1:-gpu-live-wide-out}"
shift || true
exec python3 scripts/gpu_live_wide.py "$out" "$@"
