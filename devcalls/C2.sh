# the second run's engine side, as B, with C1's syncs
set -u
rm -rf /tmp/gvC2; mkdir -p /tmp/gvC2; tar xzf /tmp/gvC/results.tar.gz -C /tmp/gvC2 --wildcards 'ipc_full_bridge_stream*.json'
OUT=/tmp/gvC2 GPU_BUDGET_S=${CALL_BUDGET_S:-540} LOAD_LAYERS=1,25,50,75 LOAD_EXPERT_WIDTH=64 LOAD_MAX_LORAS=3 LOAD_LAYOUTS=shared-all,grouped:4 scripts/gpu-verify load
cp /tmp/gvC2/results.tar.gz "$OUT/C2_results.tar.gz"
echo "commit $(cat devcalls/commit)"
