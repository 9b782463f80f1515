#!/usr/bin/env python3
"""Compares two runs of the same Rust test binaries (libtest output): which tests pass in the
first run and not in the second. Used for Burn's backend suite without and with
`cudnn_burn::register()` (scripts/burn-0.22-backend-tests.sh).

    scripts/compare-test-runs.py BASELINE.log CANDIDATE.log

Each log is the concatenated output of the binaries (`test NAME ... ok|FAILED|ignored` lines;
a binary that crashed leaves its remaining tests unlisted, and they count as not passed).
Exits 1 when a test that passed in the baseline did not pass in the candidate, or when the
baseline ran no test.
"""
import re
import sys

LINE = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)")


def outcomes(path):
    found = {}
    with open(path, errors="replace") as log:
        for line in log:
            m = LINE.match(line.strip())
            if m:
                found[m.group(1)] = m.group(2)
    return found


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    base, cand = outcomes(sys.argv[1]), outcomes(sys.argv[2])
    passed = {t for t, o in base.items() if o == "ok"}
    lost = sorted(t for t in passed if cand.get(t) != "ok")
    gained = sorted(t for t, o in cand.items() if o == "ok" and base.get(t) != "ok")
    count = lambda runs, o: sum(1 for v in runs.values() if v == o)
    for name, runs in (("baseline", base), ("candidate", cand)):
        print(f"{name}: {len(runs)} tests, {count(runs, 'ok')} passed, {count(runs, 'FAILED')} failed, "
              f"{count(runs, 'ignored')} ignored")
    for t in lost:
        print(f"lost: {t} ({cand.get(t, 'not run')})")
    for t in gained:
        print(f"gained: {t}")
    print(f"{len(lost)} lost, {len(gained)} gained")
    return 1 if lost or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
