#!/usr/bin/env bash
# Builds the release test binaries and examples and copies them, stripped, into .gpu/
# together with run-gpu.sh, so they can run on a CUDA machine that has no Rust toolchain.
# BUNDLE_BURN_CUDA=1 builds the examples with `--features burn-cuda` (train_burn and
# train_transformer take `--backend burn-cuda`: Burn's own CUDA backend, the burn-cuda variant
# of train-bench.sh); it compiles Burn's CUDA backend and CubeCL too, which takes a while.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
rm -rf .gpu && mkdir -p .gpu
example_features=()
if [[ ${BUNDLE_BURN_CUDA:-0} == 1 ]]; then
  example_features=(--features burn-cuda)
fi
cargo build --release --examples -p examples "${example_features[@]}"
# Copied now: the workspace test build below rebuilds the examples with the default features.
for ex in target/release/examples/*; do
  case "$ex" in *.d|*-*) continue ;; esac
  [ -x "$ex" ] && cp "$ex" ".gpu/$(basename "$ex")"
done
# train_burn with `--devices N` (examples feature `distributed`: Burn's distributed autodiff,
# which leaves out the ndarray CPU path), for multi-gpu.sh.
cargo build --release -p examples --features distributed --example train_burn
cp target/release/examples/train_burn .gpu/train_burn_distributed
cargo test --release --workspace --no-run --message-format=json \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do cp "$exe" ".gpu/test-$name"; done
# The conformance suite on CudnnFusion (integration-tests feature `fusion`; --workspace keeps the
# workspace's feature resolution, so only the test is rebuilt).
cargo test --release --workspace --features integration-tests/fusion --test burn_conformance --no-run --message-format=json \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])
' | while read -r exe; do cp "$exe" .gpu/test-burn_conformance_fusion; done
# Burn's data parallelism on two GPUs (cudnn-backend feature `distributed`).
cargo test --release -p cudnn-backend --features distributed --test burn_distributed --no-run --message-format=json \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])
' | while read -r exe; do cp "$exe" .gpu/test-burn_distributed; done
# The Burn program outside the workspace (uses the shared target dir).
cargo build --release --manifest-path external/burn-app/Cargo.toml --target-dir target
cp target/release/burn-app .gpu/burn-app
strip .gpu/* 2>/dev/null || true
cp scripts/run-gpu.sh scripts/sanitize-gpu.sh scripts/train-bench.sh scripts/profile-step.sh scripts/multi-gpu.sh \
  scripts/models-bench.sh scripts/profile-models.sh .gpu/
cp bench/compare_torch.py bench/train_torch.py bench/train_models_torch.py bench/ncu_summary.py bench/kernel_table.py .gpu/
du -sh .gpu && ls .gpu
