#!/usr/bin/env bash
# Every GPU-related check in one call (issue 16, "GPU"), for a lent GPU machine:
#
#   WHEELS=wheels bash bench/gpu_check.sh     # from the repository root; OUT defaults to ./gpu-out
#
# 1. the torch build: CUDA version, device, a matmul on it;
# 2. PPO and SAC learner throughput, GPU vs CPU, and the Pong CNN learner (bench/learner.py);
# 3. a short `rl_app train` with `learners.device: auto`, which must put the learner on the GPU;
# 4. five minutes of ppo_breakout with its learner on the GPU (ale-py's native env sampling on the
#    CPUs): env steps/s and the evaluation score reached, the start of the path to a full budget.
#
# Where Ray is missing (the lent machine has CUDA torch but no Ray), it is installed first from
# the wheels in $WHEELS (Ray and rl_app's other pins, cp312, carried with the tree). Each part
# reports and the script goes on, so one call gives every figure it can; the exit status says
# whether all passed. Results land in $OUT (learner-<date>.json and .md, train.txt).
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export RAY_USAGE_STATS_ENABLED=0 RL_APP_EXPERIMENTS_DIR="$PWD/experiments"
failed=0

if ! python -c "import ray" 2>/dev/null; then
    python -m pip install --quiet --no-index --find-links "${WHEELS:?no Ray here: set WHEELS}" \
        -r requirements.txt -e . || failed=1
fi
if ! python -c "import ale_py" 2>/dev/null; then  # Atari for the Breakout run, on its own: Ray must not wait on it
    python -m pip install --quiet --no-index --find-links "${WHEELS:-wheels}" -r requirements-envs.txt ||
        echo "no Atari wheels: the Breakout run will fail"
fi

echo "== torch build"
python - <<'EOF' || failed=1
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}")
assert torch.cuda.is_available(), "torch sees no GPU"
x = torch.randn(4096, 4096, device="cuda")
print(f"{torch.cuda.get_device_name(0)}: 4096^2 matmul sum {float((x @ x).sum()):.3e}")
EOF

echo "== learner throughput, GPU vs CPU"
python bench/learner.py --updates 5 --experiments ppo_cartpole sac_pendulum ppo_pong ppo_breakout || failed=1
cp bench/results/learner-*.json bench/results/learner-*.md "$OUT"/ 2>/dev/null

echo "== rl_app train, learners.device: auto"
python -m rl_app train ppo_cartpole --runs-dir "$OUT/runs" \
    --set learners.device=auto --set stop.iterations=3 | tee "$OUT/train.txt" || failed=1
grep -q "learner on GPU" "$OUT/train.txt" || { echo "the learner did not go to the GPU"; failed=1; }

echo "== ppo_breakout, GPU learner, 5 minutes"
python -m rl_app train ppo_breakout --runs-dir "$OUT/runs" \
    --set learners.device=auto --set stop.time_s=300 | tee "$OUT/breakout.txt" || failed=1
grep -q "learner on GPU" "$OUT/breakout.txt" || { echo "the Breakout learner did not go to the GPU"; failed=1; }
cp "$OUT"/runs/ppo_breakout/*/progress.csv "$OUT/breakout-progress.csv" 2>/dev/null

exit $failed
