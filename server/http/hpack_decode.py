"""An HPACK decoder (RFC 7541) for request header blocks, with the caches a server's traffic rewards.

Written because a profile said so: the `hpack` package's Decoder cost ~10 us of a ~60 us HTTP/2 request
(a HeaderTuple and a str check per field). Clients send the same fields again and again, so
- a Huffman-coded string is decoded once (the `hpack` package's decode_huffman) and then looked up;
- a block that does not change the dynamic table (indexed fields and literals not indexed: what a
  client sends again once its fields are in the table) is kept whole, decoded, for as long as the table
  stays as it was (a generation count changes with every insertion, eviction or resize).
The static table is the `hpack` package's.
"""

from collections import deque

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

STATIC = HeaderTable.STATIC_TABLE
STATIC_LENGTH = len(STATIC)
ENTRY_OVERHEAD = 32  # RFC 7541 4.1
STRINGS_KEPT = 4096
BLOCKS_KEPT = 256
BLOCK_KEPT_BYTES = 1024  # a longer block is not kept: a connection's cache stays under 256 KiB


class HpackError(Exception):
    """A malformed block: the connection's HPACK state is lost (COMPRESSION_ERROR)."""


class HeaderListTooLarge(Exception):
    """The decoded list exceeds the limit; decoding stopped there, so the state is lost too."""


class Decoder:
    def __init__(self, max_header_list_size: int, max_table_size: int = 4096) -> None:
        self.max_header_list_size = max_header_list_size
        self.max_table_size = max_table_size  # our SETTINGS_HEADER_TABLE_SIZE
        self.table_size = max_table_size  # the encoder's current choice
        self.dynamic: deque[tuple[bytes, bytes]] = deque()
        self.dynamic_size = 0
        self.generation = 0
        self.strings: dict[bytes, bytes] = {}
        self.blocks: dict[bytes, tuple[int, list[tuple[bytes, bytes]]]] = {}

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        cached = self.blocks.get(block)
        if cached is not None and cached[0] == self.generation:
            return cached[1]
        fields: list[tuple[bytes, bytes]] = []
        size = 0
        pos, end = 0, len(block)
        kept = True  # nothing in it changes the table: its decoding may be kept
        while pos < end:
            byte = block[pos]
            if byte & 0x80:  # indexed field (6.1)
                index, pos = _integer(block, pos, 7)
                field = self._entry(index)
            elif byte & 0x40:  # literal with incremental indexing (6.2.1)
                kept = False
                field, pos = self._literal(block, pos, 6)
                self._add(field)
            elif byte & 0x20:  # dynamic table size update (6.3), only before the first field
                kept = False
                if fields:
                    raise HpackError("table size update after a field")
                new_size, pos = _integer(block, pos, 5)
                if new_size > self.max_table_size:
                    raise HpackError("table size update above SETTINGS_HEADER_TABLE_SIZE")
                self.table_size = new_size
                self._evict()
                self.generation += 1
                continue
            else:  # literal without indexing / never indexed (6.2.2, 6.2.3)
                field, pos = self._literal(block, pos, 4)
            size += ENTRY_OVERHEAD + len(field[0]) + len(field[1])
            if size > self.max_header_list_size:  # checked as it grows: an HPACK bomb ends here
                raise HeaderListTooLarge(f"header list exceeds {self.max_header_list_size} bytes")
            fields.append(field)
        if kept and len(block) <= BLOCK_KEPT_BYTES:
            if len(self.blocks) >= BLOCKS_KEPT:
                self.blocks.clear()
            self.blocks[block] = (self.generation, fields)
        return fields

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if index == 0:
            raise HpackError("index 0")
        if index <= STATIC_LENGTH:
            return STATIC[index - 1]
        dynamic = index - STATIC_LENGTH - 1
        if dynamic >= len(self.dynamic):
            raise HpackError(f"index {index} beyond the tables")
        return self.dynamic[dynamic]

    def _literal(self, block: bytes, pos: int, prefix: int) -> tuple[tuple[bytes, bytes], int]:
        index, pos = _integer(block, pos, prefix)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = self._string(block, pos)
        value, pos = self._string(block, pos)
        return (name, value), pos

    def _string(self, block: bytes, pos: int) -> tuple[bytes, int]:
        if pos >= len(block):
            raise HpackError("truncated string")
        huffman = block[pos] & 0x80
        length, pos = _integer(block, pos, 7)
        end = pos + length
        if end > len(block):
            raise HpackError("string beyond the block")
        raw = block[pos:end]
        if not huffman:
            return raw, end
        text = self.strings.get(raw)
        if text is None:
            try:
                text = decode_huffman(raw)
            except Exception as e:  # hpack raises its own HPACKDecodingError
                raise HpackError(f"bad Huffman string: {e}") from e
            if len(raw) <= 256:
                if len(self.strings) >= STRINGS_KEPT:
                    self.strings.clear()
                self.strings[raw] = text
        return text, end

    def _add(self, field: tuple[bytes, bytes]) -> None:
        self.dynamic.appendleft(field)
        self.dynamic_size += ENTRY_OVERHEAD + len(field[0]) + len(field[1])
        self._evict()
        self.generation += 1

    def _evict(self) -> None:
        while self.dynamic_size > self.table_size:
            name, value = self.dynamic.pop()
            self.dynamic_size -= ENTRY_OVERHEAD + len(name) + len(value)


def _integer(block: bytes, pos: int, prefix: int) -> tuple[int, int]:
    """RFC 7541 5.1: the integer at `pos` with a `prefix`-bit prefix, and the position after it."""
    limit = (1 << prefix) - 1
    value = block[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    while True:
        if pos >= len(block):
            raise HpackError("truncated integer")
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos
        if shift > 28:
            raise HpackError("integer too large")
