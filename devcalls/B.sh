# the engine side at 1/25/50/75 MoE layers, experts narrowed to 64: shared-all and grouped:4, 3 resident, with A's syncs
set -u
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/gpu_before_B.txt"
rm -rf /tmp/gvB; mkdir -p /tmp/gvB; tar xzf /tmp/gvA/results.tar.gz -C /tmp/gvB --wildcards 'ipc_full_bridge_stream*.json'
rm -f /tmp/gvB/ipc_full_bridge_stream_g64.json; ls /tmp/gvB
OUT=/tmp/gvB GPU_BUDGET_S=${CALL_BUDGET_S:-540} LOAD_LAYERS=1,25,50,75 LOAD_EXPERT_WIDTH=64 LOAD_MAX_LORAS=3 LOAD_LAYOUTS=shared-all,grouped:4 scripts/gpu-verify load
cp /tmp/gvB/results.tar.gz "$OUT/B_results.tar.gz"
echo "commit $(cat devcalls/commit)"
