"""Progress bars stay quiet off a terminal and with --quiet / ASCENDFUSE_QUIET."""

import io

from tvm_ascendfuse import progress


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
