"""Read the command-line flags out of a launch script, without running it.

slime and verl runs are launched from bash scripts that build the command from arrays
(`ROLLOUT_ARGS=( --rollout-batch-size 32 ... )` then `python3 train.py ${ROLLOUT_ARGS[@]}`) or from
one long command with hydra overrides. This module understands exactly that much bash: comments,
line continuations, array definitions and `${NAME[@]}` expansions. Scalar variables such as
`${DATA_DIR}` are left as written: their values never matter to a scheduling scenario.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

_ARRAY_START = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)=\(\s*(.*)$")
_EXPANSION = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\[@\]\}?$")


@dataclass
class Command:
    """The argument list of the entry-point call found in a script, arrays expanded."""

    entry: str | None  # e.g. "train.py", "train_async.py", "verl.trainer.main_ppo"; None: bare args
    argv: list[str]
    unresolved: list[str] = field(default_factory=list)  # arrays used but not defined here


def _strip_comment(line: str) -> str:
    """Drop a `# ...` comment that is not inside quotes."""
    try:
        lex = shlex.shlex(line, posix=True, punctuation_chars=False)
        lex.whitespace_split = True
        lex.commenters = "#"
        toks = list(lex)
    except ValueError:  # unbalanced quotes: keep the line as it is
        return line
    return shlex.join(toks) if toks else ""


def _logical_lines(text: str) -> list[str]:
    """Physical lines joined at trailing backslashes, comments removed."""
    out: list[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        stripped = _strip_comment(buf) if "#" in buf else buf.strip()
        if stripped.strip():
            out.append(stripped.strip())
        buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out


def _split(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return line.split()


def parse_command(text: str, entries: tuple[str, ...]) -> Command:
    """Find the call of one of `entries` in `text` (a script or an argument string).

    `entries` are substrings that identify the entry point's token (e.g. "train.py"). When no line
    calls one of them, the whole text is taken as an argument string (what a user pastes).
    """
    arrays: dict[str, list[str]] = {}
    lines = _logical_lines(text)
    call: tuple[str, list[str]] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _ARRAY_START.match(line)
        if m and call is None:
            name, rest = m.group(1), m.group(2)
            body: list[str] = []
            while True:
                if rest.rstrip().endswith(")"):
                    body.append(rest.rstrip()[:-1])
                    break
                body.append(rest)
                i += 1
                if i >= len(lines):
                    break
                rest = lines[i]
            arrays[name] = _split(" ".join(body))
        elif call is None:
            call = _find_call(line, entries)
        i += 1
    if call is None:
        return Command(entry=None, argv=_expand(_split(" ".join(lines)), arrays, []), unresolved=[])
    unresolved: list[str] = []
    return Command(entry=call[0], argv=_expand(call[1], arrays, unresolved), unresolved=unresolved)


def _find_call(line: str, entries: tuple[str, ...]) -> tuple[str, list[str]] | None:
    """The entry token and its arguments, when `line` calls one of `entries`.

    Only the text from the entry on is tokenised, so an unbalanced quote before it (a multi-line
    `--runtime-env-json='{...}'` of `ray job submit`) does not matter.
    """
    for e in entries:
        for m in re.finditer(re.escape(e), line):
            end = m.end()
            if end < len(line) and not line[end].isspace():
                continue
            start = line.rfind(" ", 0, m.start()) + 1
            toks = _split(line[start:])
            return toks[0], toks[1:]
    return None


def _expand(tokens: list[str], arrays: dict[str, list[str]], unresolved: list[str]) -> list[str]:
    out: list[str] = []
    for tok in tokens:
        m = _EXPANSION.match(tok)
        if m is None:
            out.append(tok)
        elif m.group(1) in arrays:
            out += arrays[m.group(1)]
        elif m.group(1) not in unresolved:
            unresolved.append(m.group(1))
    return out


def flag_values(argv: list[str], booleans: frozenset[str] = frozenset()) -> dict[str, list[str]]:
    """`--flag v1 v2 --switch` -> {"--flag": ["v1", "v2"], "--switch": []}, in order.

    A flag takes the tokens up to the next flag, except the flags in `booleans`, which take none
    (so a stray positional after a switch is not swallowed). `--flag=value` is split. A repeated
    flag keeps its last values, as argparse does.
    """
    out: dict[str, list[str]] = {}
    current: str | None = None
    for tok in argv:
        if tok.startswith("--") and len(tok) > 2:
            name, eq, val = tok.partition("=")
            out.pop(name, None)
            out[name] = [val] if eq else []
            current = None if (eq or name in booleans) else name
        elif current is not None:
            out[current].append(tok)
    return out
