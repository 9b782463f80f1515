#!/usr/bin/env python3
"""Checks that Cargo.lock resolves the Burn and Candle crates to the lowest versions the
workspace's requirements allow, so CI (which builds and tests with this Cargo.lock) tests the
lowest versions users may get. A requirement "0.21" allows 0.21.0 and later 0.21 patches; the
lock file must hold 0.21.0 (or, for a crate without a 0.21.0 release, the version named).

Usage: scripts/check-lowest-versions.py [WORKSPACE_DIR]
"""
import pathlib
import sys
import tomllib

FAMILIES = ("burn", "candle")


def minimum(requirement: str) -> tuple[int, ...]:
    """The lowest version a caret requirement such as "0.21" or "0.21.1" allows."""
    req = requirement.strip().lstrip("^")
    if not req or req[0] in "=<>~*":
        raise ValueError(f"not a plain caret requirement: {requirement!r}")
    parts = [int(p) for p in req.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    manifest = tomllib.loads((root / "Cargo.toml").read_text())
    lock = tomllib.loads((root / "Cargo.lock").read_text())
    locked: dict[str, list[tuple[int, ...]]] = {}
    for package in lock.get("package", []):
        if not package["name"].startswith(FAMILIES):
            continue
        core = package["version"].split("+")[0].split("-")[0]
        locked.setdefault(package["name"], []).append(tuple(int(p) for p in core.split(".")[:3]))
    failures = []
    checked = 0
    for name, spec in manifest["workspace"]["dependencies"].items():
        if not name.startswith(FAMILIES):
            continue
        requirement = spec if isinstance(spec, str) else spec.get("version")
        if requirement is None:
            continue
        want = minimum(requirement)
        # The lock file may also hold other majors of the family through unrelated crates;
        # only the versions this requirement matches count.
        matching = [v for v in locked.get(name, []) if v[:2] == want[:2]]
        if not matching:
            failures.append(f"{name} {requirement}: not in Cargo.lock")
        elif min(matching) != want:
            got = ".".join(map(str, min(matching)))
            failures.append(f"{name} {requirement}: Cargo.lock has {got}, the lowest allowed is {'.'.join(map(str, want))}")
        checked += 1
    for f in failures:
        print(f"check-lowest-versions: {f}", file=sys.stderr)
    if failures:
        print(
            "check-lowest-versions: pin them with `cargo update -p NAME --precise VERSION`",
            file=sys.stderr,
        )
        return 1
    print(f"check-lowest-versions: {checked} Burn/Candle requirements resolve to their lowest versions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
