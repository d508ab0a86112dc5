# after the install: the syncs of the one-per-layer adapter, grouped:4's and grouped:64's, kept in /tmp/gvA
set -u
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/gpu_before_A.txt"
rm -rf /tmp/gvA; mkdir -p /tmp/gvA
OUT=/tmp/gvA GPU_BUDGET_S=${CALL_BUDGET_S:-480} LOAD_LAYOUTS=shared-all,grouped:4,grouped:64 scripts/gpu-verify sync
cp /tmp/gvA/results.tar.gz "$OUT/A_results.tar.gz"
echo "commit $(cat devcalls/commit)"
