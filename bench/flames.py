"""Where a process spends its CPU: py-spy samples, summed by package and by function.

`Profile.start(pid, path)` runs `py-spy record` on a process of the run (it needs ptrace
rights on it: the benchmark's own children, as the same user) and `stop()` ends it, which
writes the collapsed stacks ("frame;frame;... count" per line). `summarize` turns them into
the few lines the report shows. When py-spy is not installed, `start` returns None and the
report says so.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# "function (path/to/file.py:123)" → ("function", "path/to/file.py")
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^():]+)(?::\d+)?\)$")
# Packages a frame's file may belong to, as they appear in its path.
_SITE = re.compile(r"site-packages/(?P<package>[A-Za-z0-9_]+)")
_OURS = ("api", "worker", "shared", "bench")


def _py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


@dataclass
class Profile:
    """One py-spy recording in flight."""

    proc: subprocess.Popen[bytes]
    path: Path

    @classmethod
    def start(cls, pid: int, path: Path, rate_hz: int = 250) -> Profile | None:
        binary = _py_spy()
        if binary is None:
            return None
        command = [binary, "record", "--pid", str(pid), "--rate", str(rate_hz)]
        command += ["--format", "raw", "--output", str(path), "--nonblocking"]
        command.append("--full-filenames")  # site-packages/<package>/... names the package
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return cls(proc, path)

    def stop(self) -> list[tuple[str, int]]:
        """End the recording; its stacks with their sample counts (empty if it failed)."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if not self.path.exists():
            return []
        stacks = []
        for line in self.path.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                stacks.append((stack, int(count)))
        return stacks


def package_of(file: str) -> str:
    """The package a frame's file belongs to: a site package, one of ours, or the stdlib
    module ("asyncio", "json"...)."""
    site = _SITE.search(file)
    if site:
        return site.group("package")
    parts = Path(file).parts
    for ours in _OURS:
        if ours in parts:
            return ours + "/"
    stem = parts[-2] if len(parts) > 1 and parts[-1] == "__init__.py" else Path(file).stem
    for part in reversed(parts[:-1]):
        if part.startswith("python3"):
            break
        stem = part
    return stem


def _frame(text: str) -> tuple[str, str]:
    match = _FRAME.match(text)
    if match is None:
        return text, ""
    return match.group("function"), match.group("file")


def summarize(stacks: list[tuple[str, int]], top: int = 8) -> tuple[list[str], list[str]]:
    """The packages that ran (self time, % of samples) and the busiest functions."""
    total = sum(count for _, count in stacks)
    if not total:
        return [], []
    packages: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    for stack, count in stacks:
        function, file = _frame(stack.rsplit(";", 1)[-1])
        package = package_of(file) if file else "(native)"
        packages[package] += count
        functions[f"{function} ({package})"] += count

    def share(counter: Counter[str]) -> list[str]:
        return [f"{name} {count / total:.0%}" for name, count in counter.most_common(top)]

    return share(packages), share(functions)
