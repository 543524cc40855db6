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
# Another signal or lead time: SBATCH_SIGNAL (see STOP_SIGNAL below).
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
