"""``--budget``: durations parse with units or fail with a message naming the form; the budget's slices follow
the kernels' shares of the run time, and time a kernel leaves unused goes to the ones after it."""

import pytest

from tvm_ascendfuse.errors import AscendFuseError
from tvm_ascendfuse.tune.budget import Budget, format_duration, parse_duration


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("1.5h", 5400), ("1h30m", 5400),
                                           ("2d", 172800), (" 45 S ", 45), ("1m30s", 90)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30", "", "m", "10x", "1h-5m", "0s", "-5m", "30 minutes"])
def test_bad_durations_name_the_form(text):
    with pytest.raises(AscendFuseError, match="--budget must be"):
        parse_duration(text)


def test_format():
    assert [format_duration(s) for s in (5, 119, 600, 9000)] == ["5s", "119s", "10.0m", "2.5h"]


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_slices_follow_the_shares_and_unused_time_flows_on():
    clock = Clock()
    budget = Budget(100.0, clock=clock)
    shares = [0.6, 0.3, 0.1]
    assert budget.kernel_deadline(shares[0], shares) == pytest.approx(1000 + 60)
    clock.t += 20                                   # the first kernel finished early: 80 s left
    assert budget.kernel_deadline(shares[1], shares[1:]) == pytest.approx(1020 + 80 * 0.75)
    clock.t += 60
    assert budget.kernel_deadline(shares[2], shares[2:]) == pytest.approx(1080 + 20)
    assert not budget.expired() and budget.remaining() == pytest.approx(20)
    clock.t += 25
    assert budget.expired() and budget.elapsed() == pytest.approx(105)
    assert budget.kernel_deadline(0.1, [0.1]) == pytest.approx(clock.t)      # nothing left: stop now


def test_unknown_shares_and_no_budget():
    clock = Clock()
    budget = Budget(90.0, clock=clock)
    # a kernel that could not be timed counts as the smallest known share
    assert budget.kernel_deadline(None, [None, 0.2, 0.4]) == pytest.approx(1000 + 90 * 0.2 / 0.8)
    assert budget.kernel_deadline(None, [None, None]) == pytest.approx(1045)      # none known: equal slices
    unbounded = Budget(None, clock=clock)
    assert unbounded.kernel_deadline(0.5, [0.5]) is None and not unbounded.expired()
    assert unbounded.remaining() is None
