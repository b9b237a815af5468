"""Where a log's bytes come from: a file, gzip, standard input or a pipe, in which text encoding.

Format sniffing reads the first bytes before the reader starts, so an input that can be read only
once (`-` for standard input, `/dev/stdin`, a named pipe, bash process substitution) is first
spooled to a temporary file. The text encoding comes from a byte-order mark (UTF-8 or UTF-16), or
UTF-16 without a mark is recognised by its NUL bytes; anything else is read as UTF-8 with
undecodable bytes replaced (a bad byte spoils one cell, not the file).
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import IO

from aprilsim.workload.fitting.errors import LengthDataError

STDIN = "-"
HEAD_BYTES = 4096
BINARY_MAGIC = (b"PAR1", b"PK\x03\x04")  # Parquet, a zip (torch.save): binary by design


def binary_reason(head: bytes) -> str | None:
    """Why `head` (a file's first bytes, decompressed) is no text log, or None: NUL bytes and
    control characters past 5 % of them (and more than 16), where UTF-8 text has next to none
    (UTF-16, recognised by its NUL pattern, is text). Parquet and zip archives pass."""
    if not head or head.startswith(BINARY_MAGIC) or detect_encoding(head).startswith("utf-16"):
        return None
    nul = head.count(0)
    controls = sum(b < 32 and b not in (9, 10, 11, 12, 13, 27) for b in head)
    if controls > max(16, len(head) // 20):  # a stray NUL in a messy log spoils one cell only
        return (f"binary data ({nul:,} NUL bytes and {controls - nul:,} other control bytes in "
                f"its first {len(head):,}), not a text log")
    return None


MAX_LINE_CHARS = 64 * 2**20  # one log line: a verl dump line with a 100k-token answer is ~1 MB


def bounded_lines(f: IO[str], where: str, error: type[ValueError] = LengthDataError):
    """The lines of text file `f`, each read with a bound (a 1 GB file without a newline is
    refused after 64 MiB, not read into memory whole)."""
    n = 0
    while True:
        line = f.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        n += 1
        if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
            raise error(f"{where}:{n}: a line longer than {MAX_LINE_CHARS // 2**20} MiB: not a log "
                        "of lines")
        yield line


def refuse_binary(path: str | Path, what: str, error: type[ValueError] = LengthDataError) -> None:
    """`error` (one line) when the file at `path` starts with binary data (see binary_reason):
    refused from its first 4 KiB, before a reader spends minutes and gigabytes on it."""
    p = Path(path)
    if p.exists() and not p.is_file():
        raise error(f"{what}: {p} is not a regular file")
    with open(p, "rb") as f:
        head = f.read(HEAD_BYTES)
    if head[:2] == b"\x1f\x8b":
        try:
            with gzip.open(p, "rb") as g:
                head = g.read(HEAD_BYTES)
        except (OSError, EOFError):
            return  # a broken gzip: the reader says so
    reason = binary_reason(head)
    if reason is not None:
        raise error(f"{what}: {p} is {reason}")


class Source:
    """A readable log: `path` is a regular file (possibly a spooled copy), `name` is what messages
    call it. Use as a context manager so a spooled copy is removed."""

    def __init__(self, given: str | Path) -> None:
        given_s = str(given)
        self.name = "<stdin>" if given_s == STDIN else given_s
        self._tmp: Path | None = None
        if given_s == STDIN:
            self.path = self._spool(sys.stdin.buffer)
        else:
            path = Path(given_s)
            if not path.exists():
                raise LengthDataError(f"{self.name}: no such file")
            if path.is_dir():
                raise LengthDataError(f"{self.name}: is a directory")
            if stat.S_ISREG(path.stat().st_mode):
                self.path = path
            else:  # a pipe or a character device: readable once, so copy it first
                with open(path, "rb") as f:
                    self.path = self._spool(f)  # (its first bytes checked: /dev/zero ends)
        if self.path.stat().st_size == 0:
            self.close()
            raise LengthDataError(f"{self.name}: file is empty")
        with open(self.path, "rb") as f:
            self.gzip = f.read(2) == b"\x1f\x8b"
        self.encoding = detect_encoding(self.head())
        reason = binary_reason(self.head())
        if reason is not None:
            self.close()
            raise LengthDataError(f"{self.name} is {reason}")

    def _spool(self, stream: IO[bytes]) -> Path:
        """Copy a read-once stream to a temporary file; its first bytes are checked first, so
        binary data (`/dev/zero`, `/dev/urandom`, never ending) is refused at once."""
        head = stream.read(HEAD_BYTES)
        reason = binary_reason(head) if head[:2] != b"\x1f\x8b" else None
        if reason is not None:
            raise LengthDataError(f"{self.name} is {reason}")
        fd, name = tempfile.mkstemp(prefix="aprilsim-fit-", suffix=".spool")
        self._tmp = Path(name)
        with os.fdopen(fd, "wb") as out:
            out.write(head)
            shutil.copyfileobj(stream, out)
        return self._tmp

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None

    @property
    def suffixes(self) -> list[str]:
        """The name's suffixes, lower case, without a trailing `.gz`."""
        s = [x.lower() for x in Path(self.name).suffixes]
        return s[:-1] if s and s[-1] == ".gz" else s

    def open_binary(self) -> IO[bytes]:
        return gzip.open(self.path, "rb") if self.gzip else open(self.path, "rb")

    def head(self, n: int = HEAD_BYTES) -> bytes:
        """The first `n` (decompressed) bytes; a truncated gzip gives what could be read."""
        with self.open_binary() as f:
            try:
                return f.read(n)
            except EOFError:
                raise LengthDataError(
                    f"{self.name}: compressed data ends early (a truncated gzip file?)"
                ) from None

    def head_text(self) -> str:
        """The first bytes decoded, without a byte-order mark."""
        enc = "utf-16" if self.encoding.startswith("utf-16") else self.encoding
        return self.head().decode(enc, errors="replace").lstrip("\ufeff")

    def open_text(self) -> io.TextIOBase:
        """Text lines in the detected encoding (a byte-order mark is consumed)."""
        return io.TextIOWrapper(
            self.open_binary(), encoding=self.encoding, errors="replace", newline=""
        )


def detect_encoding(head: bytes) -> str:
    """UTF-8 unless a byte-order mark or a NUL pattern says UTF-16."""
    if head.startswith(b"\xef\xbb\xbf"):
        return "utf-8-sig"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"  # the codec reads the mark and consumes it
    sample = head[: len(head) - len(head) % 2]
    if len(sample) >= 4:
        odd_nul = sample[1::2].count(0) / (len(sample) // 2)
        even_nul = sample[0::2].count(0) / (len(sample) // 2)
        if odd_nul > 0.4 and even_nul < 0.05:
            return "utf-16-le"
        if even_nul > 0.4 and odd_nul < 0.05:
            return "utf-16-be"
    return "utf-8"
