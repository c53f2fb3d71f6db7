"""`Trace`: requests as block hash chains, flattened for fast replay; `TraceRequest`: one request before flattening.

A request's `hash_ids` are chained: hash i stands for the namespace and every token through block i, so equal hashes
mean an identical prefix, and a chain never repeats a hash. The trace keeps every chain in one flat tuple with
per-request offsets, so a replay touches plain integers and allocates nothing per block.

Re-blocking: chains recorded with block size B can be replayed with pages of P tokens when P is a multiple of B. The
hash of a page is the hash of its last block (that hash already covers the whole prefix through the page); a trailing
group of fewer than P/B blocks is not a full page and has no hash, as an engine with pages of P tokens would see it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter


class TraceError(ValueError):
    """A trace the simulator cannot replay: malformed lines, mixed block sizes, a page size that does not fit."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: when it arrived (seconds, any origin), its prompt length and its block hash chain."""

    timestamp_s: float
    input_length: int
    hash_ids: tuple[int, ...]
    block_size: int
    approximate: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """Requests in time order, their chains flattened: request r owns `hashes[offsets[r]:offsets[r + 1]]`.

    Build one with `Trace.from_requests`; every chain then has the same `block_size` (tokens per block).
    """

    block_size: int
    timestamps_s: tuple[float, ...]
    input_lengths: tuple[int, ...]
    offsets: tuple[int, ...]
    hashes: tuple[int, ...]
    num_approximate: int = 0

    @property
    def num_requests(self) -> int:
        return len(self.timestamps_s)

    @property
    def num_blocks(self) -> int:
        return len(self.hashes)

    @property
    def prompt_tokens(self) -> int:
        """The sum of the requests' input lengths: the denominator of the token hit rate."""
        return sum(self.input_lengths)

    def request(self, index: int) -> TraceRequest:
        """Request `index` (in time order) as a `TraceRequest`."""
        return TraceRequest(
            timestamp_s=self.timestamps_s[index],
            input_length=self.input_lengths[index],
            hash_ids=self.hashes[self.offsets[index] : self.offsets[index + 1]],
            block_size=self.block_size,
        )

    def requests(self) -> list[TraceRequest]:
        """Every request, in time order (the `approximate` flags are not kept per request, only counted)."""
        return [self.request(index) for index in range(self.num_requests)]

    def reblock(self, page_size: int) -> Trace:
        """The same requests replayed with pages of `page_size` tokens (a multiple of `block_size`)."""
        factor = _merge_factor(page_size, self.block_size)
        if factor == 1:
            return self
        hashes: list[int] = []
        offsets = [0]
        for index in range(self.num_requests):
            hashes.extend(self.hashes[self.offsets[index] + factor - 1 : self.offsets[index + 1] : factor])
            offsets.append(len(hashes))
        return Trace(
            page_size, self.timestamps_s, self.input_lengths, tuple(offsets), tuple(hashes), self.num_approximate
        )

    @classmethod
    def from_requests(cls, requests: Iterable[TraceRequest], page_size: int | None = None) -> Trace:
        """A trace of `requests`, sorted by time (stable: requests at the same time keep their order).

        Without `page_size` every request must have the same block size; with it, each request's chain is merged
        into pages of `page_size` tokens, which must be a multiple of that request's block size. Raises `TraceError`
        for a chain that repeats a hash, a negative input length, mixed block sizes or a page size that does not fit.
        """
        ordered = sorted(requests, key=attrgetter("timestamp_s"))
        sizes = sorted({request.block_size for request in ordered})
        if page_size is None:
            if len(sizes) > 1:
                listed = ", ".join(str(size) for size in sizes)
                raise TraceError(
                    f"the trace mixes block sizes {listed}; choose a page size that is a multiple of each "
                    "(chains of different block sizes never share a hash, so their hit rates only add up)"
                )
            page_size = sizes[0] if sizes else 1
        factors = {size: _merge_factor(page_size, size) for size in sizes}
        hashes: list[int] = []
        offsets = [0]
        for request in ordered:
            chain = request.hash_ids
            if len(set(chain)) != len(chain):
                raise TraceError(f"the chain of the request at {request.timestamp_s}s repeats a hash")
            if request.input_length < 0:
                raise TraceError(f"the request at {request.timestamp_s}s has a negative input length")
            factor = factors[request.block_size]
            hashes.extend(chain if factor == 1 else chain[factor - 1 :: factor])
            offsets.append(len(hashes))
        return cls(
            block_size=page_size,
            timestamps_s=tuple(float(request.timestamp_s) for request in ordered),
            input_lengths=tuple(request.input_length for request in ordered),
            offsets=tuple(offsets),
            hashes=tuple(hashes),
            num_approximate=sum(1 for request in ordered if request.approximate),
        )


def _merge_factor(page_size: int, block_size: int) -> int:
    """How many recorded blocks make one page; `TraceError` unless `page_size` is a positive multiple."""
    if block_size < 1:
        raise TraceError(f"a block size must be at least 1 token, got {block_size}")
    if page_size < 1 or page_size % block_size:
        raise TraceError(
            f"page size {page_size} is not a multiple of the recorded block size {block_size}: chains can only be "
            "merged into larger pages, never split (each hash covers a whole recorded block)"
        )
    return page_size // block_size
