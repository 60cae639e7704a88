#!/bin/sh
# one_gpu_rank.sh: one rank of a group whose ranks all share one GPU, under
# cddprun or torchrun (--no-python):
#
#   cddprun --nproc_per_node=2 --no-python tests/gpu/one_gpu_rank.sh cddp-train ...
#   torchrun --nproc_per_node=2 --no-python tests/gpu/one_gpu_rank.sh python3 script.py
#
# NCCL refuses two ranks on one GPU ("Duplicate GPU detected") unless each
# rank says it is its own host: NCCL_HOSTID=cddp-$LOCAL_RANK, and then the
# ranks talk over sockets (the caller sets NCCL_SOCKET_IFNAME=lo,
# NCCL_IB_DISABLE=1 and whatever else tools/gpu-check found was needed).
# Every rank sees the one device (CUDA_VISIBLE_DEVICES=$CDDP_ONE_GPU_DEVICE,
# default 0) and is told LOCAL_RANK=0, since programs pick cuda:LOCAL_RANK
# (torch scripts, cddp-train: trainer/device.c refuses LOCAL_RANK beyond the
# visible devices); the launcher's own LOCAL_RANK stays in
# CDDP_ONE_GPU_LOCAL_RANK. CDDP_ONE_GPU_NO_HOSTID=1 leaves NCCL_HOSTID unset
# (to see NCCL's refusal). The environment is otherwise the launcher's, the
# library path included: tools/gpu-check gives every process the same one
# (the CUDA libraries), and the bundle's binaries find their own libraries
# by RUNPATH, so nothing here swaps it per program.
set -eu
if [ $# -lt 1 ]; then
    echo "one_gpu_rank.sh: usage: one_gpu_rank.sh PROGRAM [ARGS...] (under cddprun or torchrun)" >&2
    exit 2
fi
if [ -z "${LOCAL_RANK:-}" ]; then
    echo "one_gpu_rank.sh: LOCAL_RANK is not set: run it under cddprun or torchrun" >&2
    exit 2
fi
if [ "${CDDP_ONE_GPU_NO_HOSTID:-0}" != 1 ]; then
    export NCCL_HOSTID="cddp-$LOCAL_RANK"
fi
export CDDP_ONE_GPU_LOCAL_RANK="$LOCAL_RANK"
export LOCAL_RANK=0
export CUDA_VISIBLE_DEVICES="${CDDP_ONE_GPU_DEVICE:-0}"
exec "$@"
