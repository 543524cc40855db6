#!/bin/bash
# Data-parallel training on N nodes x 4 GPUs (Perlmutter-style), one task per GPU:
#   sbatch -N 4 scripts/slurm/train_multinode.sh [extra dlscale train flags]
#   CONFIG=bs256_opt sbatch -N 4 scripts/slurm/train_multinode.sh
#   PROFILE=1 CONFIG=short sbatch -N 1 -t 20 scripts/slurm/train_multinode.sh
# Submit from the repository root. The global batch (config) is split over the N x 4 ranks.
#
# Node count; override on the command line (sbatch -N 8 ...).
#SBATCH -N 2
# Perlmutter GPU nodes (-C gpu) in the regular queue, which allows several whole nodes per job.
#SBATCH -C gpu -q regular
# One task per GPU, 4 GPUs per node, and the node's 128 cores split between the 4 tasks (data loaders).
# Every task sees the node's 4 GPUs and uses the one of its local rank (SLURM_LOCALID).
#SBATCH --ntasks-per-node 4 --gpus-per-node 4 --cpus-per-task 32
# Wall-clock limit; a longer run stops cleanly before it and continues in the requeued job.
#SBATCH -t 01:00:00
# Job name and log file (%x: job name, %j: job id, which a requeued job keeps).
#SBATCH -J dlscale-dp -o %x-%j.out
# Two minutes before the time limit Slurm sends SIGUSR1 to every task; dlscale finishes its step, saves a
# checkpoint and exits with status 0; --requeue allows the job to be put back in the queue (see the end).
# Another signal or lead time: SBATCH_SIGNAL (see STOP_SIGNAL below).
#SBATCH --signal=USR1@120 --requeue
# A requeued job appends to the same log instead of truncating it.
#SBATCH --open-mode=append
# Site-specific: your account.
##SBATCH -A <account>

set -euo pipefail

# ---- knobs (set them in the environment of sbatch, or edit the defaults) ----
YAML_CONFIG=${YAML_CONFIG:-configs/vit_era5.yaml}  # file of named configs
CONFIG=${CONFIG:-short}                            # config name in it
EXPDIR=${EXPDIR:-runs}                             # runs go to $EXPDIR/$CONFIG/$RUN_NUM/
PROFILE=${PROFILE:-0}                              # 1: record the capture window with nsys, one report per rank
# A profiling run gets its own run directory: in an existing one dlscale would resume from the checkpoint,
# possibly past the capture window.
if [[ "$PROFILE" == 1 ]]; then RUN_NUM=${RUN_NUM:-profile}; else RUN_NUM=${RUN_NUM:-00}; fi
# Where the data sets live: the shipped configs read data.root from DLSCALE_ERA5_DATA (vit_era5.yaml),
# DLSCALE_COSMO_DATA (unet_cosmo.yaml), DLSCALE_MNIST_DATA (cnn_mnist.yaml) or DLSCALE_CIFAR_DATA
# (resnet_cifar.yaml); export the one of your workload. The ERA5 default is the tutorial's download on $SCRATCH.
if [[ -n "${SCRATCH:-}" ]]; then export DLSCALE_ERA5_DATA=${DLSCALE_ERA5_DATA:-$SCRATCH/sc23_data}; fi
# HDF5's file locks fail or serialise reads on parallel file systems (Lustre); the data is only read.
export HDF5_USE_FILE_LOCKING=FALSE
# The stop signal: Slurm sends the --signal of the #SBATCH line above, or SBATCH_SIGNAL when it is set at
# submission (it overrides that line): `SBATCH_SIGNAL=USR2@300 sbatch ...` warns with SIGUSR2 five minutes
# before the limit. dlscale stops cleanly on TERM, USR1, INT and the signals DLSCALE_STOP_SIGNALS names; this
# passes SBATCH_SIGNAL's on. A signal given as `sbatch --signal=...` is not seen here: unless it is TERM or
# USR1, also set DLSCALE_STOP_SIGNALS (e.g. DLSCALE_STOP_SIGNALS=USR2). No B: prefix: it signals this script,
# not dlscale.
STOP_SIGNAL=${SBATCH_SIGNAL:-USR1@120}
if [[ "$STOP_SIGNAL" == *:* && "${STOP_SIGNAL%%:*}" == *B* ]]; then
    echo "SBATCH_SIGNAL=$STOP_SIGNAL: the B: prefix signals only this batch script, never dlscale, which" \
        "the time limit would then kill without a checkpoint; drop the B:" >&2
    exit 2
fi
STOP_SIGNAL=${STOP_SIGNAL#*:}
export DLSCALE_STOP_SIGNALS="${DLSCALE_STOP_SIGNALS:+$DLSCALE_STOP_SIGNALS,}${STOP_SIGNAL%@*}"
# Perlmutter: GPU i is closest to the CPU cores Slurm gives local task 3-i; reversing the order makes each
# rank's GPU its nearest one (as the NERSC tutorials do). Harmless elsewhere; delete it on other node layouts.
export CUDA_VISIBLE_DEVICES=3,2,1,0
# Communication knobs, off unless needed:
# export NCCL_DEBUG=INFO                  # NCCL prints its rings/trees and transports (WARN: only problems)
# export NCCL_DEBUG_SUBSYS=INIT,NET       # ...restricted to these subsystems
# export NCCL_NET_GDR_LEVEL=PHB           # GPUDirect RDMA when NIC and GPU share a PCIe host bridge (sc21 tutorial)
# export FI_MR_CACHE_MONITOR=userfaultfd  # libfabric memory-registration cache monitor (NERSC ViT tutorial)
# export MASTER_PORT=29512                # rendezvous port; default 20000 + job id % 10000 (see docs/many-gpus.md)
# export TORCH_NCCL_ASYNC_ERROR_HANDLING=1  # a failed collective aborts the job instead of hanging it
# Make `dlscale` available on every node, e.g.:
# source /path/to/venv/bin/activate      or      module load <your python/pytorch module>

RUN_DIR="$EXPDIR/$CONFIG/$RUN_NUM"
PROFILE_PREFIX=()
PROFILE_FLAGS=()
if [[ "$PROFILE" == 1 ]]; then
    mkdir -p "$RUN_DIR/nsys"
    # nsys runs inside each task (after srun) and writes one report per rank: %q{SLURM_PROCID} is expanded
    # by nsys in each task. -c cudaProfilerApi records only the window that --enable_manual_profiling opens
    # (on the ranks of profile.profile_ranks); --capture-range-end=stop lets training go on after it. No
    # --force-overwrite: an existing report is kept and nsys refuses to start.
    PROFILE_PREFIX=(nsys profile -c cudaProfilerApi --capture-range-end=stop
        -t cuda,nvtx,osrt,cudnn,cublas -o "$RUN_DIR/nsys/rank%q{SLURM_PROCID}")
    PROFILE_FLAGS=(--enable_manual_profiling)
fi

# One dlscale process per GPU; each reads its rank, local rank and the world size from srun's variables and
# takes the step's first node as the rendezvous host (no wrapper exporting RANK etc. is needed). Pass
# --expdir/--run_num through the knobs above, not as extra flags: the requeue check below reads that path.
SUMMARY="$RUN_DIR/summary.json"
summary_stamp() { stat -c '%i %y' "$SUMMARY" 2>/dev/null || echo none; }
before=$(summary_stamp)
status=0
srun "${PROFILE_PREFIX[@]}" dlscale train --yaml_config "$YAML_CONFIG" --config "$CONFIG" \
    --expdir "$EXPDIR" --run_num "$RUN_NUM" "${PROFILE_FLAGS[@]}" "$@" || status=$?

# Decide from the "outcome" in summary.json, not from the exit status: srun passes dlscale's own status
# through (0 finished or stopped, 2 bad input, 3 diverged, 74 a write failed, 75 the run directory is in use),
# but a launcher in between (torchrun) turns every failure, and even a clean stop after a signal, into 1. The
# summary counts only if this launch wrote it (dlscale replaces it atomically, so its inode changes): a launch
# that failed or was refused leaves the previous attempt's "stopped", which must not requeue the job again.
outcome=none
if [[ "$(summary_stamp)" != "$before" ]]; then
    outcome=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["outcome"])' "$SUMMARY" 2>/dev/null) ||
        outcome=unreadable
fi
case "$outcome" in
    stopped)  # a stop signal (time limit, preemption): the same command continues from the checkpoint
        if [[ "$PROFILE" == 1 ]]; then
            echo "dlscale stopped; not requeued when profiling (a resumed run would be past the capture window)"
        else
            echo "dlscale stopped before the end of the run; requeueing job $SLURM_JOB_ID"
            scontrol requeue "$SLURM_JOB_ID"
        fi
        exit 0 ;;
    finished) exit 0 ;;
    diverged) echo "dlscale: the training diverged (see $SUMMARY); not requeued" >&2; exit 3 ;;
    *) exit "$status" ;;  # no summary from this launch: it failed or was refused (dlscale says why above)
esac
