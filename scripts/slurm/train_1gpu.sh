#!/bin/bash
# Train on one GPU under Slurm: `sbatch scripts/slurm/train_1gpu.sh [extra dlscale train flags]`, e.g.
#   CONFIG=short sbatch scripts/slurm/train_1gpu.sh --amp_mode bf16
#   PROFILE=1 CONFIG=short sbatch -t 20 scripts/slurm/train_1gpu.sh      # an Nsight Systems capture
# Submit from the repository root (relative paths below are resolved from the submission directory).
#
# One task, one GPU. The CPUs feed the data loader (loader.num_data_workers processes).
#SBATCH -N 1 -n 1 --gpus-per-task 1 --cpus-per-task 32
# Wall-clock limit; a longer run stops cleanly before it and continues in the requeued job.
#SBATCH -t 01:00:00
# Job name and log file (%x: job name, %j: job id, which a requeued job keeps).
#SBATCH -J dlscale -o %x-%j.out
# Two minutes before the time limit Slurm sends SIGUSR1 to dlscale, which finishes its step, saves a
# checkpoint and exits with status 0; --requeue allows the job to be put back in the queue (see the end).
#SBATCH --signal=USR1@120 --requeue
# A requeued job appends to the same log instead of truncating it.
#SBATCH --open-mode=append
# Site-specific lines: uncomment and fill in (Perlmutter: a GPU node of the shared queue).
##SBATCH -A <account>
##SBATCH -C gpu -q shared

set -euo pipefail

# ---- knobs (set them in the environment of sbatch, or edit the defaults) ----
YAML_CONFIG=${YAML_CONFIG:-configs/vit_era5.yaml}  # file of named configs
CONFIG=${CONFIG:-short}                            # config name in it
EXPDIR=${EXPDIR:-runs}                             # runs go to $EXPDIR/$CONFIG/$RUN_NUM/
PROFILE=${PROFILE:-0}                              # 1: record the capture window with nsys
# A profiling run gets its own run directory: in an existing one dlscale would resume from the checkpoint,
# possibly past the capture window.
if [[ "$PROFILE" == 1 ]]; then RUN_NUM=${RUN_NUM:-profile}; else RUN_NUM=${RUN_NUM:-00}; fi
# Where the data sets live: the shipped configs read data.root from DLSCALE_ERA5_DATA (vit_era5.yaml),
# DLSCALE_COSMO_DATA (unet_cosmo.yaml), DLSCALE_MNIST_DATA (cnn_mnist.yaml) or DLSCALE_CIFAR_DATA
# (resnet_cifar.yaml); export the one of your workload. The ERA5 default is the tutorial's download on $SCRATCH.
if [[ -n "${SCRATCH:-}" ]]; then export DLSCALE_ERA5_DATA=${DLSCALE_ERA5_DATA:-$SCRATCH/sc23_data}; fi
# HDF5's file locks fail or serialise reads on parallel file systems (Lustre); the data is only read.
export HDF5_USE_FILE_LOCKING=FALSE
# Make `dlscale` available here, e.g.:
# source /path/to/venv/bin/activate      or      module load <your python/pytorch module>

RUN_DIR="$EXPDIR/$CONFIG/$RUN_NUM"
PROFILE_PREFIX=()
PROFILE_FLAGS=()
if [[ "$PROFILE" == 1 ]]; then
    mkdir -p "$RUN_DIR/nsys"
    # -c cudaProfilerApi records only the window that --enable_manual_profiling opens (profile.* keys);
    # --capture-range-end=stop lets training go on after it. No --force-overwrite: an existing report is kept
    # and nsys refuses to start, rather than replacing it with an empty one.
    PROFILE_PREFIX=(nsys profile -c cudaProfilerApi --capture-range-end=stop
        -t cuda,nvtx,osrt,cudnn,cublas -o "$RUN_DIR/nsys/rank0")
    PROFILE_FLAGS=(--enable_manual_profiling)
fi

# srun makes a one-task step: dlscale sees SLURM_STEP_NUM_TASKS=1 and runs as a single process. Pass
# --expdir/--run_num through the knobs above, not as extra flags: the requeue check below reads that path.
status=0
srun "${PROFILE_PREFIX[@]}" dlscale train --yaml_config "$YAML_CONFIG" --config "$CONFIG" \
    --expdir "$EXPDIR" --run_num "$RUN_NUM" "${PROFILE_FLAGS[@]}" "$@" || status=$?

# dlscale exits with status 0 after a stop signal (time limit, preemption) and writes "outcome": "stopped"
# into summary.json: put the job back in the queue, where the same command continues from the checkpoint.
# Only after a clean exit, so a failing run is not requeued forever on a stale summary; and not when
# profiling, where a resumed run would be past the capture window.
if [[ "$status" == 0 && "$PROFILE" != 1 ]] && grep -q '"outcome": "stopped"' "$RUN_DIR/summary.json" 2>/dev/null; then
    echo "dlscale stopped before the end of the run; requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
