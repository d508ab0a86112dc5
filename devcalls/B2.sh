# grouped:64 (3 resident) and per-expert (1 resident: its narrowed slots take ~23 GB an adapter) at 1/25/50/75, narrowed
set -u
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/gpu_before_B2.txt"
for d in gvB2 gvB3; do rm -rf /tmp/$d; mkdir -p /tmp/$d; tar xzf /tmp/gvA/results.tar.gz -C /tmp/$d --wildcards 'ipc_full_bridge_stream*.json'; done
OUT=/tmp/gvB2 GPU_BUDGET_S=${B2_S:-270} LOAD_LAYERS=1,25,50,75 LOAD_EXPERT_WIDTH=64 LOAD_MAX_LORAS=3 LOAD_LAYOUTS=grouped:64 scripts/gpu-verify load
cp /tmp/gvB2/results.tar.gz "$OUT/B2_results.tar.gz"
OUT=/tmp/gvB3 GPU_BUDGET_S=${B3_S:-270} LOAD_LAYERS=1,25,50,75 LOAD_EXPERT_WIDTH=64 LOAD_MAX_LORAS=1 LOAD_LAYOUTS=per-expert scripts/gpu-verify load
cp /tmp/gvB3/results.tar.gz "$OUT/B3_results.tar.gz"
echo "commit $(cat devcalls/commit)"
