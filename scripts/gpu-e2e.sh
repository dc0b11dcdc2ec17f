#!/usr/bin/env bash
# The live GPU run on a host with 2 GPUs: hangd serve watching real NCCL jobs. See scripts/gpu_e2e.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
exec python3 scripts/gpu_e2e.py "${1:-gpu-e2e-out}"
