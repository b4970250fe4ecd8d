"""The Files API's upload form (`POST /v1/files`, multipart/form-data) read within its bounds, its file part
handed on as it arrives.

Read here rather than by the framework's form parser: that one spools a file part to a temporary file, reads it
whole before the size can be checked, and lets a text field that is not text in its part's charset (or names a
charset that does not exist) escape as a 500, with the file part it had spooled left open. Here the file part
goes to `write` a `chunk_bytes` piece at a time, and the body is read no faster than `write` takes them: an
upload holds about one piece in memory, whatever its size (a file held whole, a few at once of 100 MiB each,
would be what pushes a process out of memory). A file past `batches.max_file_bytes` stops the read at that
size (413), a text field is at most `FIELD_BYTES`, and bad form data is a 400.
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

import msgspec
from multipart import MultipartSegment, ParserError, ParserLimitReached, PushMultipartParser

from wire.errors import shown

# A text field (`purpose`, `expires_after[...]`): the longest legitimate value is a handful of characters.
FIELD_BYTES: Final = 4_096
# Parts in one form: the SDK sends four at most (file, purpose, the two `expires_after` fields).
PARTS: Final = 16


class BadForm(Exception):
    """The form cannot be read: a 400 naming what is wrong (`param`, where it is one field)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class FileTooLarge(Exception):
    """The file part is larger than the cap: a 413."""


class Upload(msgspec.Struct):
    fields: dict[str, str]  # each text field's first value
    filename: str | None  # the file part's, None when the form has none
    size: int  # the bytes of the file part, every one of them given to `write`


async def read_upload(
    boundary: str | None,
    body: AsyncIterator[bytes],
    max_file_bytes: int,
    write: Callable[[bytes], Awaitable[None]],
    chunk_bytes: int,
) -> Upload:
    """The form of an upload: its text fields, and the size of its file part (`file`, the first such part),
    up to `max_file_bytes`, given to `write` in pieces of `chunk_bytes` (the last one shorter)."""
    if not boundary:
        raise BadForm("Send the file as multipart/form-data with a boundary")
    fields: dict[str, str] = {}
    filename: str | None = None
    size = 0
    data = bytearray()  # the file's bytes not yet written: less than `chunk_bytes`, but for the last event
    part = bytearray()
    segment: MultipartSegment | None = None
    try:
        with PushMultipartParser(boundary, max_segment_count=PARTS) as parser:
            chunks = aiter(body)
            chunk = await anext(chunks, b"")
            while not parser.closed:
                for event in parser.parse(chunk):
                    if isinstance(event, MultipartSegment):
                        segment = event
                        part.clear()
                    elif event:
                        assert segment is not None
                        if segment.name == "file" and segment.filename is not None:
                            if filename is not None:
                                continue  # a second file part: only the first is the upload's
                            if size + len(event) > max_file_bytes:
                                raise FileTooLarge
                            size += len(event)
                            data += event
                            while len(data) >= chunk_bytes:
                                with memoryview(data) as view:  # one copy of the piece, not two
                                    piece = bytes(view[:chunk_bytes])
                                del data[:chunk_bytes]
                                await write(piece)
                        elif len(part) + len(event) > FIELD_BYTES:
                            raise BadForm(f"The form field is longer than {FIELD_BYTES} bytes", _name(segment))
                        else:
                            part += event
                    elif segment is not None:  # the end of a part
                        if segment.name == "file" and segment.filename is not None:
                            if filename is None:
                                if data:
                                    await write(bytes(data))
                                    data.clear()
                                filename = segment.filename
                        elif segment.name is not None and segment.name not in fields:
                            fields[segment.name] = _text(bytes(part), segment)
                        segment = None
                chunk = await anext(chunks, b"")
    except (ParserError, ParserLimitReached) as exc:
        raise BadForm(f"Invalid multipart/form-data: {exc}") from None
    return Upload(fields, filename, size)


def _text(value: bytes, segment: MultipartSegment) -> str:
    charset = segment.charset or "utf-8"
    try:
        # Only a text encoding (decode() refuses the others too, but that is its detail, not this rule).
        if not getattr(codecs.lookup(charset), "_is_text_encoding", True):
            raise LookupError(charset)
        return value.decode(charset)
    except (UnicodeError, LookupError):  # UnicodeError: what idna and punycode raise, not a decode error
        raise BadForm(f"The form field is not text in its charset ({shown(charset)})", _name(segment)) from None


def _name(segment: MultipartSegment) -> str | None:
    # A field's name as an error's `param` quotes it: the client's text, cut.
    return None if segment.name is None else shown(segment.name)


__all__ = ["FIELD_BYTES", "PARTS", "BadForm", "FileTooLarge", "Upload", "read_upload"]
