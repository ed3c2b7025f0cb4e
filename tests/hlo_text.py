"""Reading XLA's optimised HLO text: its computations, the ones a computation calls, its copy instructions."""

import re

_HEAD = re.compile(r"^(?:ENTRY )?(%[\w.\-]+) .*\{$")
_CALLED = re.compile(r"(?:calls|to_apply|body|condition|branch_computations|true_computation|false_computation)="
                     r"\{?([%\w.\-, ]+)\}?")
_COPY = re.compile(r"= (\w+)\[([\d,]*)\]\{[\d,]*\} copy\(")


def computations(text: str) -> dict[str, list[str]]:
    """{computation name: its instruction lines}."""
    found, current = {}, None
    for line in text.splitlines():
        head = _HEAD.match(line)
        if head:
            current = found.setdefault(head.group(1), [])
        elif line.startswith("}"):
            current = None
        elif current is not None:
            current.append(line)
    return found


def while_bodies(comps: dict[str, list[str]]) -> list[str]:
    """The names of the computations used as while-loop bodies."""
    return sorted({m for lines in comps.values() for line in lines if " while(" in line
                   for m in re.findall(r"body=(%[\w.\-]+)", line)})


def reachable(comps: dict[str, list[str]], start: str, fused: bool = False) -> set[str]:
    """``start`` and every computation it calls, transitively (fusion bodies only with ``fused``: their copies
    are layout changes inside one kernel, not copies of a buffer)."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        for line in comps[name]:
            if " fusion(" in line and not fused:
                continue
            for group in _CALLED.findall(line):
                todo += [n.strip() for n in group.split(",")]
    return seen


def copies(comps: dict[str, list[str]], names) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, shape) of every copy instruction of the computations ``names``."""
    return [(m.group(1), tuple(int(d) for d in m.group(2).split(",") if d))
            for name in names for line in comps[name] for m in [_COPY.search(line)] if m]


def conditionals(comps: dict[str, list[str]], names) -> int:
    """How many conditional instructions the computations ``names`` hold."""
    return sum(" conditional(" in line for name in names for line in comps[name])
