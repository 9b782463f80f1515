"""Joins an Nsight Compute CSV of per-kernel metrics with train_models' `--kernel-log` of the
same run: each fused kernel of the profiled steps (names `fused_elementwise`, `fused_reduce`)
gets the launch event that made it (program size, iteration shape, input strides, vector
width, split), then the kernels are grouped by launch signature, the groups with the most
time above the memory bound first. Used by scripts/profile-models.sh (PROFILE_KERNEL_LOG=1).

    python3 bench/kernel_table.py ncu.csv kernels.log [PEAK_TB_S]

The CSV needs gpu__time_duration.sum; with dram__bytes_read.sum and dram__bytes_write.sum
it adds achieved TB/s and the time above PEAK_TB_S (default 3.0, about an H100's HBM3).
"""
import collections
import csv
import re
import sys

SCALE_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
SCALE_B = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
FUSED = ("fused_elementwise", "fused_reduce")


def ncu_kernels(path):
    """Per-kernel metric dicts in launch order, with the kernel name under "name"."""
    rows = list(csv.reader(open(path, errors="replace")))
    head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    hdr = rows[head]
    col = {k: hdr.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")}
    kernels = collections.OrderedDict()
    for r in rows[head + 1:]:
        if len(r) < len(hdr):
            continue
        try:
            value = float(r[col["Metric Value"]].replace(",", ""))
        except ValueError:
            continue
        metric, unit = r[col["Metric Name"]], r[col["Metric Unit"]]
        if metric == "gpu__time_duration.sum":
            value *= SCALE_US.get(unit, 1.0)
        elif metric.startswith("dram__bytes"):
            value *= SCALE_B.get(unit, 1.0)
        k = kernels.setdefault(int(r[col["ID"]]), {"name": r[col["Kernel Name"]]})
        k[metric] = value
    return [kernels[i] for i in sorted(kernels)]


def fields(line):
    """The `key=value` fields of one event line (values may hold nested brackets)."""
    out, i, n = {}, 0, len(line)
    while i < n:
        eq = line.find("=", i)
        if eq < 0:
            break
        key = line[i:eq].strip().split(" ")[-1]
        j, depth, quoted = eq + 1, 0, False
        while j < n:
            c = line[j]
            if c == '"':
                quoted = not quoted
            elif not quoted and c in "[(":
                depth += 1
            elif not quoted and c in "])":
                depth -= 1
            elif not quoted and c == " " and depth == 0:
                break
            j += 1
        out[key] = line[eq + 1:j].strip('"')
        i = j + 1
    return out


def launch_events(path):
    """The launch events between the markers of the profiled steps, one per kernel launched."""
    events, inside = [], False
    for line in open(path, errors="replace"):
        f = fields(line.strip())
        if f.get("marker") == "profiled steps begin":
            inside, events = True, []
        elif f.get("marker") == "profiled steps end":
            inside = False
        elif inside and f.get("kernel") in FUSED:
            events.extend([f] * int(f.get("kernels", "1")))
    return events


def fused_name(name):
    """`fused_elementwise` or `fused_reduce` for a profiler's kernel name (`void fused_reduce<0>(ReduceArgs)`),
    else None."""
    m = re.search(r"\b(fused_elementwise|fused_reduce)\b", name)
    return m.group(1) if m else None


def signature(f):
    keep = ("kernel", "ops", "inputs", "outputs", "results", "small_outputs", "shape", "input_strides", "vec",
            "grid", "block", "chunks", "warp_rows", "epilogue")
    return " ".join(f"{k}={f[k]}" for k in keep if k in f)


def main():
    csv_path, log_path = sys.argv[1], sys.argv[2]
    peak = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
    kernels = [k for k in ncu_kernels(csv_path) if fused_name(k["name"])]
    events = launch_events(log_path)
    if len(events) != len(kernels):
        print(f"warning: {len(kernels)} fused kernels profiled, {len(events)} launch events logged; "
              f"matched in order up to the shorter")
    groups = collections.OrderedDict()
    for k, f in zip(kernels, events):
        if f["kernel"] != fused_name(k["name"]):
            print(f"warning: kernel {k['name']} matched to a {f['kernel']} event; stopping there")
            break
        t = k.get("gpu__time_duration.sum", 0.0)
        b = k.get("dram__bytes_read.sum", 0.0) + k.get("dram__bytes_write.sum", 0.0)
        g = groups.setdefault(signature(f), [0, 0.0, 0.0, 0.0, k.get("launch__registers_per_thread", 0)])
        g[0] += 1
        g[1] += t
        g[2] += b
        g[3] += max(0.0, t - b / (peak * 1e12) * 1e6)
    total = sum(g[1] for g in groups.values())
    print(f"{sum(g[0] for g in groups.values())} fused kernels, {total / 1e3:.2f} ms; groups by time above "
          f"{peak} TB/s (count, ms, GB, TB/s, ms above, registers | launch signature)")
    for sig, (n, t, b, above, regs) in sorted(groups.items(), key=lambda x: -x[1][3]):
        rate = b / (t * 1e-6) / 1e12 if t else 0.0
        print(f"{n:4d} {t / 1e3:7.3f} {b / 1e9:7.3f} {rate:5.2f} {above / 1e3:7.3f} {int(regs):4d} | {sig}")


if __name__ == "__main__":
    main()
