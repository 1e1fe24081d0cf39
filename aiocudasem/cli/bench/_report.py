"""The report: versions, the Markdown page and the plot."""

from __future__ import annotations

import contextlib
import importlib.metadata
import platform
import statistics
from pathlib import Path
from typing import Any

import aiocudasem as acs

from ._common import pct

# ---------------------------------------------------------------- report


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in (
        "aiocudasem",
        "cuda-bindings",
        "anyio",
        "trio",
        "uvloop",
        "numpy",
        "cupy-cuda13x",
        "torch",
        "numba-cuda",
    ):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[dist] = importlib.metadata.version(dist)
    return out


def gpu_info(drv: acs.Driver) -> dict[str, str]:
    info = {"device": drv.device_name(0), "driver": drv.name}
    if not drv.simulated:
        with contextlib.suppress(Exception):
            import subprocess

            info["nvidia-smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
    return info


def fmt(x: float | None, spec: str = ".0f") -> str:
    return "n/a" if x is None else format(x, spec)


def markdown(results: dict[str, Any], meta: dict[str, Any], plotted: bool = True) -> str:
    sim = meta["simulated"]
    tag = " (SIMULATED device: not GPU figures)" if sim else ""
    sync_med = statistics.median(results["sync"]["latency_100us"])
    sync_empty = statistics.median(results["sync"]["latency_empty"])
    lines = [
        f"# Performance{tag}",
        "",
        f"Measured {meta['date']} on {meta['gpu'].get('nvidia-smi') or meta['gpu']['device']}, "
        f"host {meta['host']}. Packages: "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
        + ".",
        "",
        "One process, one run, the same streams and the same `%globaltimer` spin kernel for "
        "every approach (`aiocudasem bench`). Latency = from enqueuing the kernel to the "
        'coroutine resuming; "+" is the median above blocking sync.',
        "",
        "| approach | wake latency, 100 us kernel: median (+ over sync) / p99 | empty stream: "
        "median / p99 | CPU while 1,000 coroutines are parked on 3 s kernels (cores) | awaits/s, "
        "1 stream | awaits/s, 8 streams | work-stream GPU time, 100 x (50 us kernel + notify),"
        " loop busy |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, e in results.items():
        if name == "trio":
            continue
        if "error" in e:
            lines.append(f"| {e['label']} | fails: `{e['error'][:120]}` | | | | | |")
            continue
        lat, emp = e["latency_100us"], e["latency_empty"]
        med = statistics.median(lat)
        lines.append(
            f"| {e['label']} | {med:.1f} (+{med - sync_med:.1f}) / {pct(lat, 99):.0f} us "
            f"| {statistics.median(emp):.1f} (+{statistics.median(emp) - sync_empty:.1f}) / "
            f"{pct(emp, 99):.0f} us "
            f"| {fmt(e.get('cpu_parked'), '.3f')} | {fmt(e.get('awaits_per_s_1'))} "
            f"| {fmt(e.get('awaits_per_s_8'))} "
            f"| {fmt(e.get('stall_us') and e['stall_us'] / 1e3, '.2f')} ms |"
        )
    lines += [
        "",
        "## 10,000 awaiters on 64 streams (20 ms kernels)",
        "",
        "| approach | woke | extra fds (peak) | RSS growth | p50 | p99 |",
        "|---|---|---|---|---|---|",
    ]
    for e in results.values():
        m = e.get("many") if isinstance(e, dict) else None
        if m:
            lines.append(
                f"| {e['label']} | {m['woke']}/{m['waiters']} | {m['extra_fds_peak']} | "
                f"{m['rss_growth_mib']:.1f} MiB | {m['p50_us'] / 1e3:.1f} ms "
                f"| {m['p99_us'] / 1e3:.1f} ms |"
            )
    split = {
        n: e for n, e in results.items() if isinstance(e, dict) and "awaits_per_s_8_split" in e
    }
    if split:
        lines += [
            "",
            f"## Throughput on 8 streams dealt over {meta.get('devices', 2)} devices",
            "",
            "| approach | awaits/s, 8 streams of device 0 | awaits/s, 8 streams over the devices |",
            "|---|---|---|",
        ]
        for e in split.values():
            one, dealt = fmt(e.get("awaits_per_s_8")), fmt(e["awaits_per_s_8_split"])
            lines.append(f"| {e['label']} | {one} | {dealt} |")
    if "trio" in results:
        tsync = statistics.median(results["trio"]["sync"]["latency_100us"])
        lines += [
            "",
            "## Wake latency on trio (100 us kernel)",
            "",
            "| approach | median (+ over sync) | p99 |",
            "|---|---|---|",
        ]
        for e in results["trio"].values():
            med = statistics.median(e["latency_100us"])
            p99 = pct(e["latency_100us"], 99)
            lines.append(f"| {e['label']} | {med:.1f} (+{med - tsync:.1f}) us | {p99:.0f} us |")
    if plotted:
        lines += ["", "![latency distributions](latency.png)", ""]
    else:
        lines += ["", "(No latency plot: matplotlib was not installed for this run.)", ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path, sim: bool) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    names = [n for n, e in results.items() if n != "trio" and "latency_100us" in e]
    data = [results[n]["latency_100us"] for n in names]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(names) + 1.5))
    ax.boxplot(data, vert=False, showfliers=False, whis=(1, 99))
    ax.set_yticks(range(1, len(names) + 1), names)
    ax.set_xscale("log")
    ax.set_xlabel("wake latency for a 100 us kernel, us (box: quartiles, whiskers: p1-p99)")
    ax.set_title("Wake latency per approach" + (" (SIMULATED device)" if sim else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
