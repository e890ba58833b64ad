"""Host facts for a profile: CPU, memory, this process's resident set, a host name and a description."""

from __future__ import annotations

import os
import platform
import re
import socket
from pathlib import Path

import onnxruntime as ort

__all__ = ["cpuinfo", "meminfo_mb", "rss_mb", "host_name", "describe", "all_cores"]


def cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return info
    for line in text.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            k, v = k.strip(), v.strip()
            if k and v and k not in info:
                info[k] = v
    physical = set()
    cur: dict[str, str] = {}
    for block in text.split("\n\n"):
        cur = {}
        for line in block.splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                cur[k.strip()] = v.strip()
        if "core id" in cur:
            physical.add((cur.get("physical id", "0"), cur["core id"]))
    if physical:
        info["_physical_cores"] = str(len(physical))
    return info


def meminfo_mb() -> tuple[float, float | None]:
    """(MemTotal, MemAvailable) in MB (MiB); MemAvailable None when unknown."""
    try:
        fields = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            k, _, v = line.partition(":")
            parts = v.split()
            if parts:
                fields[k] = float(parts[0]) / 1024.0  # kB -> MiB
        if "MemTotal" in fields:
            return fields["MemTotal"], fields.get("MemAvailable")
    except OSError:
        pass
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    try:
        avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") / 2**20
    except (ValueError, OSError):
        avail = None
    return total, avail


def rss_mb() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) / 1024.0
    except OSError:
        pass
    try:
        import resource

        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r / 1024.0 if platform.system() != "Darwin" else r / 2**20
    except Exception:
        return None


def host_name() -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", socket.gethostname()).strip("-.")
    return name or "host"


_ARM_PARTS = {
    "0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
    "0xd08": "Cortex-A72", "0xd09": "Cortex-A73", "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76",
    "0xd0c": "Neoverse-N1", "0xd0d": "Cortex-A77", "0xd40": "Neoverse-V1", "0xd41": "Cortex-A78",
    "0xd42": "Cortex-A78AE", "0xd44": "Cortex-X1", "0xd46": "Cortex-A510", "0xd47": "Cortex-A710",
    "0xd48": "Cortex-X2", "0xd49": "Neoverse-N2", "0xd4d": "Cortex-A715", "0xd4e": "Cortex-X3",
    "0xd80": "Cortex-A520", "0xd81": "Cortex-A720", "0xd82": "Cortex-X4",
}


def _cpu_summary() -> str | None:
    """"4x Cortex-A76 @ 2.4 GHz" from /proc/cpuinfo CPU part and cpufreq, on Arm; None elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    parts: dict[str, int] = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k.strip() == "CPU part":
            name = _ARM_PARTS.get(v.strip().lower(), f"Arm part {v.strip()}")
            parts[name] = parts.get(name, 0) + 1
    if not parts:
        return None
    freqs: dict[str, float] = {}
    try:
        for f in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/cpuinfo_max_freq"):
            freqs[f.parent.parent.name] = int(f.read_text().strip()) / 1e6
    except (OSError, ValueError):
        pass
    top = f" @ up to {max(freqs.values()):.2f} GHz" if freqs else ""
    return " + ".join(f"{n}x {p}" for p, n in parts.items()) + top


def _board_model(cpu: dict[str, str]) -> str | None:
    try:
        model = Path("/proc/device-tree/model").read_text(errors="replace").strip("\x00\n ")
        if model:
            return model
    except OSError:
        pass
    return cpu.get("Model")


def describe(cpu: dict[str, str], mem_mb: float, threads: list[int]) -> str:
    board = _board_model(cpu)
    arm = _cpu_summary()
    model = cpu.get("model name") or cpu.get("Hardware") or cpu.get("cpu model") or platform.processor()
    cpu_txt = arm or model or "unknown CPU"
    logical = os.cpu_count() or 0
    phys = cpu.get("_physical_cores")
    cores = f"{phys} cores / {logical} threads" if phys else f"{logical} CPUs"
    head = f"{board}, " if board else ""
    counts = ", ".join(map(str, threads))
    return (
        f"{head}{cpu_txt} ({platform.machine()}, {cores}), {mem_mb / 1024:.1f} GB RAM, {platform.system()}; "
        f"onnxruntime {ort.__version__} CPU EP fp32, measured at {counts} intra-op thread{'s' if threads != [1] else ''}"
    )


def all_cores(cpu: dict[str, str]) -> int:
    """onnxruntime's default intra-op thread count: one per physical core (logical CPUs where the core
    count is unknown), what a worker started with --threads 0 runs."""
    return int(cpu.get("_physical_cores") or os.cpu_count() or 1)
