"""Progress bars for long commands (tuning; compiling large models): one tqdm bar on stderr.

The bar shows only on an interactive terminal and when not asked to be quiet: piped into a log or run by
CI, a bar redrawn with carriage returns is noise. ``ProgressBar.say`` prints a line above the bar (or plain
to stderr when the bar is hidden), so messages never tear it.
"""

from __future__ import annotations

import sys


class ProgressBar:
    """A tqdm bar, or nothing when hidden; use as a context manager so the bar is closed on errors too."""

    def __init__(self, total: int | None, desc: str, unit: str = "it", quiet: bool = False, stream=None):
        from tqdm import tqdm

        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        shown = not quiet and _is_terminal(self.stream)
        self.bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, disable=not shown,
                        dynamic_ncols=True, leave=True)
        self.shown = shown

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


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
