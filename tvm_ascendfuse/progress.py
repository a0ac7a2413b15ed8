"""Progress bars (tqdm) for steps that can take more than a couple of seconds: the pipeline's phases and
the kernels' code generation on large models, tuning (trials, best time so far), verification, benchmarks.

A bar is drawn on stderr only when stderr is a terminal and quiet mode is off (``--quiet``, or
``ASCENDFUSE_QUIET=1`` in the environment, which the tuner's worker processes inherit); most bars also wait
``delay`` seconds before showing, so a fast compile prints nothing.
"""

from __future__ import annotations

import os
import sys

QUIET_ENV = "ASCENDFUSE_QUIET"


def quiet(on: bool = True) -> None:
    """Switch every bar of this process (and of processes it starts) off or back on."""
    if on:
        os.environ[QUIET_ENV] = "1"
    else:
        os.environ.pop(QUIET_ENV, None)


def enabled(stream=None) -> bool:
    stream = stream if stream is not None else sys.stderr
    if os.environ.get(QUIET_ENV, "") not in ("", "0"):
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def bar(total=None, desc: str | None = None, unit: str = "it", delay: float = 0.0, leave: bool = False, **kw):
    """A tqdm bar (disabled, and free, when bars are off)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=leave, disable=not enabled(),
                file=sys.stderr, dynamic_ncols=True, **kw)
