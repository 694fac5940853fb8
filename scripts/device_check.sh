#!/usr/bin/env bash
# One prepared GPU session: NCCL/DDP + bf16 training check, model throughput, and the two
# reproduction reports on a real budget. Needs only python3 with torch (CUDA), tokenizers,
# pyarrow and pyyaml (no Ray, no MLflow), the repo as the working folder, and the corpora in
# $DYNLM_DATA (litbank/conll, wikitext-2). Logs and reports go to $OUT (default ./device_out).
set -uo pipefail
OUT=${OUT:-device_out}; mkdir -p "$OUT"
DATA=${DYNLM_DATA:-../shared/data}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
STEPS=${DEVICE_STEPS:-all}  # a comma list of step names to run (default: every step), to fit a short lease
run() {  # run NAME SECONDS CMD...: each step has its own time limit and log
  local name=$1 limit=$2; shift 2
  if [[ $STEPS != all && ,$STEPS, != *,$name,* ]]; then return 0; fi
  echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/summary.log"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "   rc=$rc in $((SECONDS - t0))s" | tee -a "$OUT/summary.log"
  tail -n 25 "$OUT/$name.log"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, tokenizers, pyarrow, yaml; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"
run ddp_nccl_bf16 75 python3 -m scripts.device_check --model dntm --epochs 3 --dim 256 --batch-size 32
# A/B of the bf16 divergence seen on the H200 (CPU bf16 autocast trains normally on this config)
run ddp_nccl_fp32 75 python3 -m scripts.device_check --model dntm --epochs 3 --dim 256 --batch-size 32 --precision fp32
run rnn_bf16 60 python3 -m scripts.device_check --model rnn --epochs 3 --dim 256 --batch-size 32
# issue 11: no host synchronisation inside a step (exit 1 names the op), then real LitBank documents
# at the report size (E 256, 2 x 512, 64 rows) in packed rows against the plain-stream loop
run sync_check 60 python3 -m scripts.sync_check --device cuda
run bench_litbank_gpu 120 python3 -m benchmarks.bench_models --device cuda --threads 0 --corpus litbank \
    --data-dir "$DATA/litbank/conll" --max-docs 80 --max-sentences 0 --embed-dim 256 --hidden-dim 512 --num-layers 2 \
    --batch-size 64 --stream-batch 64 --layouts packed --rounds 2
run bench_models 45 python3 -m benchmarks.bench_models --device cuda --threads 0 --embed-dim 256 --hidden-dim 256 --batch-size 32 --batches 4 --rounds 2
run reproduce_dntm ${DNTM_LIMIT:-190} python3 -m benchmarks.reproduce_dntm --device cuda --data-dir "$DATA/litbank/conll" \
    --epochs ${DNTM_EPOCHS:-5} --batch-size 16 --embed-dim 128 --hidden-dim 256 --output "$OUT/dntm_litbank.md"
run reproduce_dynamical ${DYN_LIMIT:-190} python3 -m benchmarks.reproduce_dynamical --device cuda ${DYN_ARGS:-} --out "$OUT/dynamical_wikitext2.md"
exit 0
