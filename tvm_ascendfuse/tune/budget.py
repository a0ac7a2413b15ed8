"""A tuning run's time budget: ``--budget 30m`` bounds the wall time, spent where the model's time is.

Kernels are tuned in order of their share of the model's run time. When a kernel starts, it is given the
remaining time times its share of what the kernels still to come account for: time a kernel leaves unused
flows to the ones after it. The last batch of a kernel and its side-by-side check may run past its slice;
no further kernel is started once the budget left is less than the least any kernel of the run took for one
batch and its check (a later run with the same work dir resumes them).
"""

from __future__ import annotations

import re
import time

from ..errors import AscendFuseError

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str) -> float:
    """Seconds of ``90s``, ``30m``, ``1.5h``, ``1h30m``, ``2d``; a unit is required (a bare ``30`` could mean
    seconds or minutes)."""
    s = str(text).strip().lower().replace(" ", "")
    parts = _PART.findall(s)
    if not s or "".join(n + u for n, u in parts) != s:
        raise AscendFuseError(f"--budget must be a duration with units such as 90s, 30m, 2h or 1h30m, got '{text}'")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise AscendFuseError(f"--budget must be longer than zero, got '{text}'")
    return seconds


def format_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


class Budget:
    """The deadline of a run (None: unbounded) and the slice each kernel gets of what is left."""

    def __init__(self, seconds: float | None, clock=time.monotonic):
        self.seconds, self.clock = seconds, clock
        self.start = clock()
        self.deadline = None if seconds is None else self.start + seconds

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - self.clock()

    def expired(self) -> bool:
        return self.deadline is not None and self.clock() >= self.deadline

    def elapsed(self) -> float:
        return self.clock() - self.start

    def kernel_deadline(self, share: float | None, shares_to_come: list[float | None]) -> float | None:
        """When the kernel starting now should stop searching: ``share`` of the model's time over the shares
        of this and the later kernels (unknown shares count as the smallest known one, or all equal)."""
        if self.deadline is None:
            return None
        known = [s for s in shares_to_come if s]
        floor = min(known) if known else 1.0
        weights = [s if s else floor for s in shares_to_come]
        mine = share if share else floor
        return self.clock() + max(0.0, self.remaining()) * mine / sum(weights)
