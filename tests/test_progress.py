"""The progress bar shows only on a terminal and when not quiet; messages never tear it and reach a log
either way (not when quiet)."""

import io

from tvm_ascendfuse.progress import ProgressBar


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_bar_on_a_terminal():
    out = Terminal()
    with ProgressBar(4, "tuning", unit="trial", stream=out) as bar:
        assert bar.shown
        bar.update(2)
        bar.status("kernels done 0/2")
        bar.say("tuning k1")
        bar.set_total(6)
        bar.update(1)
    text = out.getvalue()
    assert "tuning k1\n" in text and "3/6" in text and "kernels done 0/2" in text and "trial" in text


def test_no_bar_in_a_log_or_when_quiet():
    log = io.StringIO()
    with ProgressBar(4, "tuning", stream=log) as bar:
        assert not bar.shown
        bar.update(4)
        bar.status("ignored")
        bar.say("tuning k1")
    assert log.getvalue() == "tuning k1\n"                       # messages only, no bar redraws
    quiet = Terminal()
    with ProgressBar(4, "tuning", stream=quiet, quiet=True) as bar:
        bar.update(4)
        bar.say("tuning k1")
    assert quiet.getvalue() == ""
