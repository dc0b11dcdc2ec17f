#!/usr/bin/env bash
# Live suite on a host with 2 GPUs: Hugging Face transformers tensor parallelism under plain torchrun,
# watched by one hangd serve, each scenario recorded as a trace with truth. See scripts/hf_live.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
exec python3 scripts/hf_live.py "${1:-hf-live-out}"
