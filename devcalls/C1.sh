# the second run's syncs: one-per-layer and grouped:4, kept in /tmp/gvC
set -u
rm -rf /tmp/gvC; mkdir -p /tmp/gvC
OUT=/tmp/gvC GPU_BUDGET_S=${CALL_BUDGET_S:-400} LOAD_LAYOUTS=shared-all,grouped:4 scripts/gpu-verify sync
cp /tmp/gvC/results.tar.gz "$OUT/C1_results.tar.gz"
echo "commit $(cat devcalls/commit)"
