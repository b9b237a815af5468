"""Read the command-line flags out of a launch script, without running it.

slime and verl runs are launched from bash scripts that build the command from arrays
(`ROLLOUT_ARGS=( --rollout-batch-size 32 ... )` then `python3 train.py ${ROLLOUT_ARGS[@]}`) or from
one long command with hydra overrides. This module understands exactly that much bash: comments,
line continuations, array definitions and `${NAME[@]}` expansions, and scalar assignments
(`N=8`, `export N=${N:-8}`, `BS=$((N * 4))`) substituted as `$N`, `${N}`, `${N:-default}` and in
integer `$((...))` arithmetic. Anything else (command substitution, unknown variables such as
`${DATA_DIR}`) is left as written.
"""

from __future__ import annotations

import ast
import operator
import re
import shlex
from dataclasses import dataclass, field

_ARRAY_START = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)=\(\s*(.*)$")
_EXPANSION = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\[@\]\}?$")
_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_ARITH = re.compile(r"\$\(\((.*?)\)\)")
# `${N:-default}`: the default may hold `${M}` itself (`${MODEL_PATH:-${HOME}/models/${ID}}`)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-((?:[^{}]|\$\{[^{}]*\})*))?\}"
                  r"|\$([A-Za-z_][A-Za-z0-9_]*)")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.floordiv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


@dataclass
class Command:
    """The argument list of the entry-point call found in a script, arrays expanded."""

    entry: str | None  # e.g. "train.py", "train_async.py", "verl.trainer.main_ppo"; None: bare args
    argv: list[str]
    unresolved: list[str] = field(default_factory=list)  # arrays used but not defined here


def _strip_comment(line: str) -> str:
    """Drop a `# ...` comment: a `#` at a word start outside quotes (so `${#x}`, `a#b` stay)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


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
        stripped = _strip_comment(buf) if "#" in buf else buf
        if stripped.strip():
            out.append(stripped.strip())
        buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out


def _arith(expr: str) -> int | None:
    """The value of an integer expression (+ - * / %, parentheses), bash-style; None otherwise."""
    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError("not integer arithmetic")

    try:
        return ev(ast.parse(expr.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def substitute(text: str, variables: dict[str, str]) -> str:
    """Replace known `$N`, `${N}`, `${N:-default}` and `$((...))` in `text`; leave the rest."""
    def var(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name in variables:
            return variables[name]
        return _VAR.sub(var, m.group(2)) if m.group(2) is not None else m.group(0)

    def arith(m: re.Match[str]) -> str:
        expr = _VAR.sub(var, m.group(1))
        expr = re.sub(r"[A-Za-z_][A-Za-z0-9_]*", lambda v: variables.get(v.group(0), v.group(0)),
                      expr)
        value = _arith(expr)
        return m.group(0) if value is None else str(value)

    return _VAR.sub(var, _ARITH.sub(arith, text))


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
    variables: dict[str, str] = {}
    lines = _logical_lines(text)
    call: tuple[str, list[str]] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _ARRAY_START.match(line)
        if m and call is None:
            name, rest = m.group(1), m.group(2)
            body: list[str] = []
            depth = 1
            while True:
                depth, close = _close_paren(rest, depth)
                if close is not None:
                    body.append(rest[:close])
                    break
                body.append(rest)
                i += 1
                if i >= len(lines):
                    break
                rest = lines[i]
            arrays[name] = _split(substitute(" ".join(body), variables))
        elif call is None:
            call = _find_call(substitute(line, variables), entries)
            a = _ASSIGN.match(line) if call is None else None
            if a:
                toks = _split(substitute(a.group(2), variables))
                variables[a.group(1)] = " ".join(toks)
        i += 1
    if call is None:
        argv = _expand(_split(substitute(" ".join(lines), variables)), arrays, [])
        return Command(entry=None, argv=argv, unresolved=[])
    unresolved: list[str] = []
    argv = _expand(call[1], arrays, unresolved)
    return Command(entry=call[0], argv=argv, unresolved=unresolved)


def _close_paren(text: str, depth: int) -> tuple[int, int | None]:
    """Track parentheses outside quotes from `depth`; (new depth, index where it reaches 0)."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return 0, i
    return depth, None


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
