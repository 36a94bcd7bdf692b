"""The GPU check's two scripts fit the device budget: one command runs 600 s at most, so the
caps of each script's steps (`timeout N`, times the items of a `for` loop around it) must add
up to less, and to what the script's header says."""

import re
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def caps(text: str) -> int:
    total, times = 0, 1
    for line in text.splitlines():
        loop = re.match(r"\s*for \w+ in ([^;]+); do", line)
        if loop:
            times = len(loop.group(1).split())
        elif line.strip() == "done":
            times = 1
        total += times * sum(int(n) for n in re.findall(r"\btimeout (\d+)", line))
    return total


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_simulate.sh"])
def test_a_gpu_scripts_caps_add_up_to_less_than_one_command(script):
    text = (BENCH / script).read_text()
    stated = int(re.search(r"add up to (\d+) s", text).group(1))
    assert caps(text) == stated < 600


def test_the_caps_count_a_loops_items():
    assert caps("timeout 5 a\nfor x in p q r; do\n  timeout 10 b\ndone\ntimeout 1 c\n") == 36
