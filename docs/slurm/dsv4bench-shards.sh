#!/usr/bin/env bash
# A dsv4bench sweep as a Slurm array job: task I of N runs `--shard I/N` on its own GPU node
# slot; a job that depends on the array merges the shards into one run directory and reports.
#
#   jid=$(sbatch --parsable --array=1-4 docs/slurm/dsv4bench-shards.sh)
#   sbatch --dependency=afterany:$jid --export=ALL,MERGE=$jid docs/slurm/dsv4bench-shards.sh
#
# The array size is N: shards are split by expected cost, so the tasks end at about the same
# time. `afterany`: a shard whose cases failed exits 1, and its rows still belong in the merge.
# A task with several GPUs can add `--gpus all` to use each of them.
#SBATCH --job-name=dsv4bench
#SBATCH --gpus=1
#SBATCH --cpus-per-task=8
#SBATCH --time=01:00:00
#SBATCH --output=slurm-dsv4bench-%A_%a.log
set -uo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
SCENARIOS=${SCENARIOS:-scenarios/sm90/*.yaml}
RUNS=${RUNS:-runs}

if [[ -n ${MERGE:-} ]]; then # the merge job: every shard of array job $MERGE
  run="$RUNS/slurm-$MERGE"
  python3 -m dsv4bench.cli merge "$run"/shard-* --out "$run/merged" || exit
  python3 -m dsv4bench.cli report "$run/merged"
  exit
fi

: "${SLURM_ARRAY_TASK_ID:?submit with sbatch --array=1-N}"
first=${SLURM_ARRAY_TASK_MIN:-1}
index=$((SLURM_ARRAY_TASK_ID - first + 1))
count=$((SLURM_ARRAY_TASK_MAX - first + 1))
run="$RUNS/slurm-$SLURM_ARRAY_JOB_ID"
out="$run/shard-$index"
resume=()
[[ -f $out/results.jsonl ]] && resume=(--resume) # a requeued task goes on where it stopped
# shellcheck disable=SC2086  # $SCENARIOS is a glob
python3 -m dsv4bench.cli run $SCENARIOS --shard "$index/$count" --out "$out" "${resume[@]}"
