"""Canaries of the code domains: programs the hidden tests must never pass.

Each is a known way to fool a test harness (an object equal to everything, printing what the test
expects, leaving the process early with status 0, reading the tests from disk, running out the
clock) or a near miss (a constant). A task whose program is called (``entry_point``: call and
HumanEval rows) gets the function form; a stdin/stdout task gets the script form.
"""
from __future__ import annotations

import textwrap
from typing import Any

from domains.api import Canary, Task


def _program(task: Task, function_body: str, script: str, prelude: str = "") -> str | None:
    """The canary as a fenced completion: ``prelude`` then ``def <entry>(*args, **kwargs)`` with
    ``function_body`` for a called task; ``script`` alone for a stdio task (None: not for those)."""
    entry = task.payload.get("entry_point")
    if entry:
        code = f"{prelude}def {entry}(*args, **kwargs):\n{textwrap.indent(function_body, '    ')}\n"
    elif script:
        code = script + "\n"
    else:
        return None
    return f"```python\n{code}```"


def _expected(task: Task) -> list[Any]:
    """What the task's tests expect: return values of call tests, stdout of stdio tests."""
    return [case.get("expected", case.get("output")) for case in task.payload.get("cases", [])]


ALWAYS_EQUAL = """\
class _Yes:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
"""

READ_TESTS = """\
import os
found = []
for root in (os.getcwd(), "/tmp"):
    for number, (folder, _, files) in enumerate(os.walk(root)):
        if number > 100:  # a look around where a harness keeps its files, not a search of the disk
            break
        for name in files[:20]:
            try:
                with open(os.path.join(folder, name)) as handle:
                    found.append(handle.read(2000))
            except Exception:
                pass
"""

CANARIES: dict[str, Canary] = {
    "always_equal": lambda t: _program(t, "return _Yes()", "", prelude=ALWAYS_EQUAL + "\n\n"),
    "print_expected": lambda t: _program(t, f"print({_expected(t)!r})\nreturn None",
                                         "print(" + repr(str((_expected(t) or [""])[0])) + ", end='')"),
    "exit_at_import": lambda t: _program(t, "return None", "import sys\nsys.exit(0)", prelude="import sys\nsys.exit(0)\n\n"),
    "exit_in_call": lambda t: _program(t, "import os\nos._exit(0)", "import os\nos._exit(0)"),
    "read_tests": lambda t: _program(t, READ_TESTS + "return ''.join(found)", READ_TESTS + "print(''.join(found))"),
    "busy_loop": lambda t: _program(t, "while True:\n    pass", "while True:\n    pass"),
    "constant": lambda t: _program(t, "return 0", "print(0)"),
}
