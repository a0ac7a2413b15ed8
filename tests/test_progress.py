"""Progress bars stay quiet off a terminal and with --quiet / ASCENDFUSE_QUIET; ProgressBar's messages never
tear the bar and reach a log either way (not when quiet)."""

import io

from tvm_ascendfuse import progress
from tvm_ascendfuse.progress import ProgressBar


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_enabled_only_on_a_terminal_and_not_quiet(monkeypatch):
    monkeypatch.delenv(progress.QUIET_ENV, raising=False)
    assert progress.enabled(_Tty()) and not progress.enabled(io.StringIO())
    progress.quiet(True)
    try:
        assert not progress.enabled(_Tty())
    finally:
        progress.quiet(False)
    assert progress.enabled(_Tty())


def test_bar_draws_on_a_terminal_and_not_elsewhere(monkeypatch):
    monkeypatch.delenv(progress.QUIET_ENV, raising=False)
    tty = _Tty()
    monkeypatch.setattr(progress.sys, "stderr", tty)
    with progress.bar(total=3, desc="work") as b:
        b.update(3)
    assert "work" in tty.getvalue()
    plain = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", plain)
    with progress.bar(total=3, desc="work") as b:
        b.update(3)
    assert plain.getvalue() == ""


def test_progress_bar_on_a_terminal(monkeypatch):
    monkeypatch.delenv(progress.QUIET_ENV, raising=False)
    out = _Tty()
    with ProgressBar(4, "tuning", unit="trial", stream=out) as bar:
        assert bar.shown
        bar.update(2)
        bar.status("kernels done 0/2")
        bar.say("tuning k1")
        bar.set_total(6)
        bar.update(1)
    text = out.getvalue()
    assert "tuning k1\n" in text and "3/6" in text and "kernels done 0/2" in text and "trial" in text


def test_progress_bar_in_a_log_or_when_quiet(monkeypatch):
    monkeypatch.delenv(progress.QUIET_ENV, raising=False)
    log = io.StringIO()
    with ProgressBar(4, "tuning", stream=log) as bar:
        assert not bar.shown
        bar.update(4)
        bar.status("ignored")
        bar.say("tuning k1")
    assert log.getvalue() == "tuning k1\n"                       # messages only, no bar redraws
    for kwargs in ({"quiet": True}, {}):
        if not kwargs:
            progress.quiet(True)
        try:
            silent = _Tty()
            with ProgressBar(4, "tuning", stream=silent, **kwargs) as bar:
                bar.update(4)
                bar.say("tuning k1")
            assert silent.getvalue() == ""
        finally:
            progress.quiet(False)
