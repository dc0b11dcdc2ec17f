#!/usr/bin/env bash
# Two nodes on a host with 2 GPUs, one GPU each, NCCL between them, their hangds sharing one PostgreSQL.
# See scripts/fleet_gpu.py. HANGD_PG_ROOT: where PostgreSQL's files were unpacked, if it is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
exec python3 scripts/fleet_gpu.py "${1:-fleet-gpu-out}"
