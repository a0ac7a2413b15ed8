"""Progress bars (tqdm) for steps that can take more than a couple of seconds: the pipeline's phases and
the kernels' scheduling and code generation on large models, tuning (kernels, trials, best time so far),
verification, benchmarks.

A bar is drawn on stderr only when the stream is a terminal and quiet mode is off (``--quiet``, or
``ASCENDFUSE_QUIET=1`` in the environment, which worker processes inherit): piped into a log or run by CI, a
bar redrawn with carriage returns is noise. Most bars also wait ``delay`` seconds before showing, so a fast
compile prints nothing. ``ProgressBar`` adds lines printed above the bar (or plainly when it is hidden), for
commands such as ``tune`` that report as they go.
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


def is_quiet() -> bool:
    return os.environ.get(QUIET_ENV, "") not in ("", "0")


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def enabled(stream=None) -> bool:
    return not is_quiet() and _is_terminal(stream if stream is not None else sys.stderr)


def bar(total=None, desc: str | None = None, unit: str = "it", delay: float = 0.0, leave: bool = False, **kw):
    """A tqdm bar (disabled, and free, when bars are off)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=leave, disable=not enabled(),
                file=sys.stderr, dynamic_ncols=True, **kw)


class ProgressBar:
    """A bar that also prints messages without tearing it; use as a context manager so it is closed on
    errors too. ``quiet=True`` (or the process-wide quiet switch) hides the bar and the messages."""

    def __init__(self, total: int | None, desc: str, unit: str = "it", quiet: bool = False, stream=None):
        from tqdm import tqdm

        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet or is_quiet()
        self.shown = not self.quiet and _is_terminal(self.stream)
        self.bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, disable=not self.shown,
                        dynamic_ncols=True, leave=True)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def set_total(self, total: int) -> None:
        self.bar.total = total
        self.bar.refresh()

    def status(self, text: str) -> None:
        """The text after the counts (e.g. kernels done, best time so far)."""
        self.bar.set_postfix_str(text, refresh=True)

    def say(self, text: str) -> None:
        """A line of output that does not tear the bar; nothing when quiet."""
        if self.quiet:
            return
        if self.shown:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
