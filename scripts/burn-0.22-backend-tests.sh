#!/usr/bin/env bash
# Builds Burn's own backend test suite (crates/burn-backend-tests of a Burn checkout) for the
# CUDA backend with fusion, twice: as Burn runs it, and with `cudnn_burn::register()` called
# at start (one line added to the suite's start-up hook), so the two runs can be compared test
# by test. The suite is not published on crates.io: it is read from a Burn git checkout at a
# 0.22 revision and built against the crates.io Burn 0.22 release that cudnn-burn uses (the
# versions pinned by backend/cudnn-burn/Cargo.lock). Nothing of it is kept in this repository.
#
# Usage: scripts/burn-0.22-backend-tests.sh BURN_CHECKOUT [REV]
#   REV: a tag or commit of the checkout (default: the newest v0.22 tag; the suite of a `-pre`
#   tag, or any with BBT_ADAPT=1, is adapted to the release by scripts/burn-backend-tests-adapt.py).
#   BBT_TESTS: the suite's test targets (default "tensor autodiff").
#   BURN_022_PROFILE: cargo profile (default release).
# Output: target/burn-0.22-backend-tests/{burn,registered}.txt, the executables of each build
# (built with scripts/burn-0.22-offline.sh, so no LLVM download is needed).
# Run: each executable with `--test-threads=1`; scripts/compare-test-runs.py compares the runs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
burn="$(realpath "${1:?a Burn git checkout}")"
rev="${2:-$(git -C "$burn" tag --list 'v0.22*' --sort=-v:refname | head -1)}"
[[ -n $rev ]] || { echo "no v0.22 tag in $burn: name a revision" >&2; exit 2; }
out="$root/target/burn-0.22-backend-tests"
suite="$out/suite"
rm -rf "$suite" && mkdir -p "$suite"
git -C "$burn" archive "$rev" crates/burn-backend-tests | tar -x -C "$suite" --strip-components=2
echo "burn-0.22-backend-tests: suite of $rev ($(git -C "$burn" rev-parse --short "$rev^{commit}"))"

# The manifest: the suite's own, with workspace inheritance resolved to the crates.io release
# (Burn crates at cudnn-burn's Burn version, the rest at the checkout's workspace versions),
# cubecl-cuda's `cpp` feature (see scripts/burn-0.22-offline.sh) and an optional dependency
# on cudnn-burn behind the feature `cudnn-burn`.
python3 - "$suite/Cargo.toml" "$burn" "$rev" "$root" <<'PY'
import subprocess, sys, tomllib

manifest, burn, rev, root = sys.argv[1:]
suite = tomllib.load(open(manifest, "rb"))
workspace = tomllib.loads(subprocess.run(
    ["git", "-C", burn, "show", f"{rev}:Cargo.toml"], check=True, capture_output=True, text=True).stdout)
lock = tomllib.load(open(f"{root}/backend/cudnn-burn/Cargo.lock", "rb"))
locked = {p["name"]: p["version"] for p in lock["package"]}
ws_deps = workspace["workspace"]["dependencies"]

def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f'{k} = {toml_value(x)}' for k, x in v.items()) + " }"
    raise TypeError(v)

def resolve(name, spec):
    spec = dict(spec) if isinstance(spec, dict) else {"version": spec}
    if spec.pop("workspace", False):
        base = ws_deps[name]
        base = dict(base) if isinstance(base, dict) else {"version": base}
        base.pop("path", None)
        feats = base.get("features", []) + spec.pop("features", [])
        base.update(spec)
        if feats:
            base["features"] = feats
        spec = base
    if name in locked and (name.startswith("burn-") or name.startswith("cubecl") or name.startswith("cubek")):
        # The release cudnn-burn is built against, so the registry is the same.
        spec["version"] = "=" + locked[name]
    return spec

lines = ["[package]", 'name = "burn-backend-tests"', 'version = "0.0.0"', 'edition = "2024"',
         'publish = false', 'build = "build.rs"', "", "[workspace]", "", "[lib]", "proc-macro = true", ""]
features = dict(suite.get("features", {}))
features["cudnn-burn"] = ["dep:cudnn-burn"]
lines.append("[features]")
lines += [f"{k} = {toml_value(v)}" for k, v in features.items()]
lines.append("")
lines.append("[dependencies]")
for name, spec in suite["dependencies"].items():
    lines.append(f"{name} = {toml_value(resolve(name, spec))}")
lines.append(f'cudnn-burn = {{ path = "{root}/backend/cudnn-burn", optional = true }}')
# NVRTC as the CUDA compiler in both builds (the offline build has no LLVM; cudnn-burn turns
# it on too, so the two builds differ only by the registration).
lines.append(f'cubecl-cuda = {{ version = "={locked["cubecl-cuda"]}", features = ["cpp"] }}')
lines.append("")
lines.append("[dev-dependencies]")
for name, spec in suite.get("dev-dependencies", {}).items():
    lines.append(f"{name} = {toml_value(resolve(name, spec))}")
open(manifest, "w").write("\n".join(lines) + "\n")
PY
rm -rf "$suite/benches" "$suite/.cargo"
cp "$root/backend/cudnn-burn/build.rs" "$suite/build.rs"
cp "$root/backend/cudnn-burn/Cargo.lock" "$suite/Cargo.lock"

# The one change to the suite: its start-up hook registers cudnn-burn when built with the
# feature (every test binary includes this file).
hook="$suite/tests/common/backend.rs"
grep -q '^fn init_device_settings() {$' "$hook" || { echo "no start-up hook in $hook" >&2; exit 1; }
sed -i 's/^fn init_device_settings() {$/fn init_device_settings() {\n    #[cfg(feature = "cudnn-burn")]\n    cudnn_burn::register().expect("cudnn_burn::register");/' "$hook"

# The suite of a pre-release (a `-pre` tag, or BBT_ADAPT=1 for another revision), adapted to
# the release's API (pooling options; modules of APIs the release lacks are emptied and listed).
if [[ $rev == *-pre* || ${BBT_ADAPT:-} == 1 ]]; then
  python3 "$root/scripts/burn-backend-tests-adapt.py" "$suite"
fi

tests=()
for t in ${BBT_TESTS:-tensor autodiff}; do tests+=(--test "$t"); done
export BURN_022_PROFILE="${BURN_022_PROFILE:-release}"
for variant in burn registered; do
  features=cuda,std,fusion
  [[ $variant == registered ]] && features+=,cudnn-burn
  "$root/scripts/burn-0.22-offline.sh" "$suite/Cargo.toml" --no-default-features --features "$features" "${tests[@]}" |
    sed -n 's/^built //p' >"$out/$variant.txt"
  echo "burn-0.22-backend-tests: $variant: $(tr '\n' ' ' <"$out/$variant.txt")"
done
