"""Walk a large JSON document one member / one array element at a time.

A PyTorch profiler trace is one JSON object whose "traceEvents" array can
hold millions of events (1 GB of text). json.load would hold the text and
every event dict at once; this reader keeps one chunk of text plus one
decoded element, using the C scanner of the json module on each element.

Text is decoded as latin-1 so that a character offset is a byte offset
(error messages can say where the file breaks); callers re-decode the few
strings they keep with `utf8()`.
"""

from __future__ import annotations

import json
import lzma
import re
import zlib
from typing import BinaryIO, Iterator

from ghsim.errors import GhsimError

CHUNK_BYTES = 1 << 22          # 4 MiB of text per read
MAX_VALUE_BYTES = 64 << 20     # one element larger than this is not a trace event
_LOW_WATER = 1 << 16           # refill when less text than this is left
_WS = " \t\n\r"
_SEPARATOR = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")


def utf8(text: str) -> str:
    """Undo the latin-1 decoding of a kept string (names with non-ASCII bytes)."""
    if text.isascii():
        return text
    try:
        return text.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return text


class JsonStream:
    """Iterate ("member", key, value) for a top-level object and
    ("element", key, value) for each element of the arrays named in
    `stream_keys` (key None when the document itself is an array)."""

    def __init__(self, raw: BinaryIO, source: str, stream_keys=("traceEvents",), chunk: int | None = None):
        self.raw, self.source, self.chunk = raw, source, chunk or CHUNK_BYTES
        self.stream_keys = set(stream_keys)
        self.buf, self.pos, self.base, self.eof = "", 0, 0, False
        # Floats stay text so the caller can convert microseconds to exact nanoseconds.
        decoder = json.JSONDecoder(parse_float=str, parse_constant=str)
        self._scan = json.scanner.make_scanner(decoder)

    @property
    def offset(self) -> int:
        """Byte offset (of the decompressed text) the reader has reached."""
        return self.base + self.pos

    # -- low level -------------------------------------------------------

    def _fill(self) -> bool:
        if self.eof:
            return False
        try:
            data = self.raw.read(self.chunk)
        except EOFError:
            raise GhsimError(f"{self.source}: truncated gzip or xz data (the compressed data ends at decompressed byte "
                             f"{self.base + len(self.buf)})") from None
        except (OSError, zlib.error, lzma.LZMAError) as e:
            raise GhsimError(f"{self.source}: corrupt compressed data ({e})") from None
        if not data:
            self.eof = True
            return False
        self.buf = self.buf[self.pos:] + data.decode("latin-1")
        self.base += self.pos
        self.pos = 0
        return True

    def _peek(self) -> str:
        """Next non-blank character, '' at end of input."""
        while True:
            buf, pos, n = self.buf, self.pos, len(self.buf)
            while pos < n and buf[pos] in _WS:
                pos += 1
            self.pos = pos
            if pos < n:
                return buf[pos]
            if not self._fill():
                return ""

    def _cut_off(self, where: str) -> GhsimError:
        return GhsimError(f"{self.source}: JSON cut off at byte {self.base + len(self.buf)} ({where}); "
                          f"the file is truncated")

    def _invalid(self, at: int, why: str) -> GhsimError:
        return GhsimError(f"{self.source}: invalid JSON at byte {self.base + at}: {why}")

    def _value(self):
        if self._peek() == "":
            raise self._cut_off("where a value should start")
        while True:
            try:
                value, end = self._scan(self.buf, self.pos)
            except StopIteration as stop:
                err_at, why = stop.value, "expecting a value"
            except json.JSONDecodeError as e:
                err_at, why = e.pos, e.msg
            except RecursionError:
                raise self._invalid(self.pos, "nested too deeply") from None
            except ValueError as e:  # e.g. an integer literal of thousands of digits
                raise self._invalid(self.pos, str(e).split(";")[0]) from None
            else:
                # A number that ends exactly at the end of the buffer may continue in the next chunk.
                if end < len(self.buf) or not self._fill():
                    self.pos = end
                    return value
                continue
            near_end = err_at >= len(self.buf) - 10 or why.startswith("Unterminated string")
            if near_end and len(self.buf) - self.pos > MAX_VALUE_BYTES:
                raise self._invalid(self.pos, f"a single value longer than {MAX_VALUE_BYTES} bytes")
            if near_end and self._fill():
                continue
            if near_end and self.eof:
                raise self._cut_off("inside a value") from None
            raise self._invalid(err_at, why) from None

    def _expect(self, char: str, where: str) -> None:
        got = self._peek()
        if got == "":
            raise self._cut_off(where)
        if got != char:
            raise self._invalid(self.pos, f"expected '{char}' {where}, found {got!r}")
        self.pos += 1

    # -- structure -------------------------------------------------------

    def _elements(self, key) -> Iterator[tuple[str, object, object]]:
        self.pos += 1  # the '['
        if self._peek() == "]":
            self.pos += 1
            return
        scan, sep = self._scan, _SEPARATOR.match
        while True:
            # Fast path: a whole element and the separator after it are in the buffer.
            if len(self.buf) - self.pos < _LOW_WATER and not self.eof:
                self._fill()  # top up before a chunk boundary can split an element
            buf, pos = self.buf, self.pos
            try:
                value, end = scan(buf, pos)
                m = sep(buf, end)
            except (StopIteration, ValueError, RecursionError):  # JSONDecodeError is a ValueError
                m = None
            if m is not None and m.end() < len(buf):
                self.pos = m.end()
                yield "element", key, value
                if m.group(1) == "]":
                    return
                continue
            # Slow path: refill the buffer, or report what is wrong and where.
            yield "element", key, self._value()
            got = self._peek()
            if got == ",":
                self.pos += 1
                self._peek()
            elif got == "]":
                self.pos += 1
                return
            elif got == "":
                raise self._cut_off(f"inside the {key or 'top-level'} array")
            else:
                raise self._invalid(self.pos, f"expected ',' or ']' in the {key or 'top-level'} array, found {got!r}")

    def _members(self) -> Iterator[tuple[str, object, object]]:
        self.pos += 1  # the '{'
        if self._peek() == "}":
            self.pos += 1
            return
        while True:
            if self._peek() != '"':
                if self._peek() == "":
                    raise self._cut_off("inside the top-level object")
                raise self._invalid(self.pos, "expected a quoted member name")
            key = self._value()
            self._expect(":", f"after member name {key!r}")
            if key in self.stream_keys and self._peek() == "[":
                yield from self._elements(key)
            else:
                yield "member", key, self._value()
            got = self._peek()
            if got == ",":
                self.pos += 1
            elif got == "}":
                self.pos += 1
                return
            elif got == "":
                raise self._cut_off("inside the top-level object")
            else:
                raise self._invalid(self.pos, f"expected ',' or '}}' after member {key!r}, found {got!r}")

    def __iter__(self) -> Iterator[tuple[str, object, object]]:
        first = self._peek()
        if first == "":
            raise GhsimError(f"{self.source}: empty file (no JSON)")
        if self.buf.startswith("\xef\xbb\xbf", self.pos):  # a UTF-8 byte-order mark, as latin-1
            self.pos += 3
            first = self._peek()
        if first == "{":
            yield from self._members()
        elif first == "[":
            yield from self._elements(None)
        else:
            raise self._invalid(self.pos, "a trace must be a JSON object or array")
        if self._peek() != "":
            raise self._invalid(self.pos, "extra data after the JSON document")
