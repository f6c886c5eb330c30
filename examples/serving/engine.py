"""The scheduler: admission into pool rows, packed chunked prefill into one of a few prefill buckets, one decode
call for all running requests with speculative verification, a prefix cache whose checkpoints the prefill kernel
writes, aborts, and a progress line per step."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from .kernels import CHUNK, Buckets
from .model import PackedQwen3Next, RequestCache, Segment
from .pool import PoolExhaustedError, StatePool, check


@dataclass
class Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    arrival: int
    abort_at: int | None = None  # the step at which the client goes away
    output: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # the row each output token was the argmax of
    cache: RequestCache | None = None
    prefilled: int = 0
    state: str = "waiting"  # waiting, prefill, decode, done, aborted
    cached_tokens: int = 0


@dataclass
class CacheEntry:
    rows: dict[int, int]  # GDN layer -> pool row holding both GDN states after the prefix (written by the prefill)
    kv: dict
    owner: tuple
    hits: int = 0
    complete: bool = False  # its prefill launch has run (its rows hold the states)


@dataclass
class Config:
    buckets: Buckets = field(default_factory=Buckets)  # prefill / decode shapes; the prefix cache's block
    max_running: int = 6
    spec_tokens: int = 3  # T: tokens verified per request per decode step (1 = no speculation)
    cache_entries: int = 16

    @property
    def block(self) -> int:
        """Prefix-cache checkpoints sit on multiples of this many prompt tokens."""
        return self.buckets.block


class Engine:
    """Continuous batching over ``PackedQwen3Next``; ``step()`` until ``idle``."""

    def __init__(self, model: PackedQwen3Next, pool: StatePool, config: Config, log=print) -> None:
        self.model, self.pool, self.config, self.log = model, pool, config, log
        self.requests: dict[int, Request] = {}
        self.prefix: OrderedDict[tuple[int, ...], CacheEntry] = OrderedDict()
        self.step_no = 0
        self.stats = dict(prefill_tokens=0, cached_tokens=0, cache_hits=0, drafted=0, accepted_drafts=0,
                          decode_steps=0, prefill_calls=0, aborted=0)  # fmt: skip
        if config.max_running > max(config.buckets.decode):
            raise ValueError(f"max_running {config.max_running} exceeds the largest decode bucket "
                             f"{max(config.buckets.decode)}")  # fmt: skip

    def submit(self, request: Request) -> None:
        self.requests[request.rid] = request

    @property
    def idle(self) -> bool:
        return all(r.state in ("done", "aborted") for r in self.requests.values())

    def _in(self, *states: str) -> list[Request]:
        return [r for r in self.requests.values() if r.state in states and r.arrival <= self.step_no]

    # --- admission, prefix cache, release -------------------------------------------------------------------------

    def _admit(self, r: Request) -> bool:
        try:
            rows = self.pool.allocate(r.rid, len(self.model.gdn_layers) * self.config.spec_tokens)
        except PoolExhaustedError:
            return False
        width = self.config.spec_tokens
        r.cache = RequestCache(
            r.rid, {i: rows[j * width : (j + 1) * width] for j, i in enumerate(self.model.gdn_layers)}
        )
        r.state = "prefill"
        return True

    def _resume(self, r: Request, hit: tuple[int, ...]) -> tuple[object, dict[int, int]]:
        """Start ``r`` after the cached prefix ``hit``: its KV cache copied from the entry; its conv windows and GDN
        states are read from the entry's rows by the prefill kernels themselves (``Segment.read``), which write
        ``r``'s own rows."""
        entry = self.prefix[hit]
        self.prefix.move_to_end(hit)
        r.cache.kv = dict(entry.kv.items())
        r.cache.length = r.prefilled = r.cached_tokens = len(hit)
        entry.hits += 1
        self.stats["cache_hits"] += 1
        self.stats["cached_tokens"] += len(hit)
        return entry.owner, entry.rows

    def _longest_prefix(self, prompt: list[int]) -> tuple[int, ...] | None:
        """The longest cached block-aligned prefix shorter than the prompt (its last token must still run), among
        complete entries (not one a launch of this step is about to write)."""
        for end in range(((len(prompt) - 1) // self.config.block) * self.config.block, 0, -self.config.block):
            entry = self.prefix.get(tuple(prompt[:end]))
            if entry is not None and entry.complete:
                return tuple(prompt[:end])
        return None

    def _checkpoint_rows(self, r: Request, end: int, pinned: set[tuple[int, ...]]) -> dict[int, int] | None:
        """Pool rows for a checkpoint of ``r``'s prompt at ``end`` (a block boundary), or None. ``pinned``: entries
        this step's prefill reads, never evicted for it (their rows must not be handed out and written)."""
        key = tuple(r.prompt[:end])
        if end % self.config.block or end >= len(r.prompt) or key in self.prefix:
            return None
        if len(self.prefix) >= self.config.cache_entries:
            # Leaves first (as a radix cache): a prefix others extend is worth more than its longest extension.
            # Least recently used among complete leaves (not one being written or read this step).
            leaves = [k for k, e in self.prefix.items() if e.complete and k not in pinned and not any(
                len(other) > len(k) and other[: len(k)] == k for other in self.prefix)]  # fmt: skip
            if not leaves:
                return None
            self._evict(leaves[0])
        owner = ("cache", r.rid, end)
        try:
            rows = self.pool.allocate(owner, len(self.model.gdn_layers))
        except PoolExhaustedError:
            return None
        self.prefix[key] = CacheEntry(dict(zip(self.model.gdn_layers, rows, strict=True)), {}, owner)
        return self.prefix[key].rows

    def _evict(self, key: tuple[int, ...]) -> None:
        entry = self.prefix.pop(key)
        self.pool.release(entry.owner, list(entry.rows.values()))

    def _release(self, r: Request, state: str) -> None:
        self.pool.release(r.rid, self.pool.rows_of(r.rid))
        r.state, r.cache = state, None

    def abort(self, r: Request) -> None:
        """Free the request's rows and drop the checkpoints it wrote; no other row may change."""
        untouched = [row for row, o in enumerate(self.pool.owner) if not _belongs(o, r.rid)]
        before = self.pool.snapshot(untouched)
        for key in [k for k, e in self.prefix.items() if e.owner[1] == r.rid]:
            self._evict(key)
        if r.cache is not None:
            self._release(r, "aborted")
        r.state = "aborted"
        self.stats["aborted"] += 1
        check(not [o for o in self.pool.owner if _belongs(o, r.rid)], f"aborted request {r.rid} still owns rows")
        after = self.pool.snapshot(untouched)
        same = all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
        check(same, f"aborting {r.rid} changed others' rows")

    # --- one scheduler step ---------------------------------------------------------------------------------------

    def step(self) -> None:
        for r in self._in("waiting", "prefill", "decode"):
            if r.abort_at is not None and r.abort_at <= self.step_no:
                self.abort(r)
        decoding = self._in("decode")
        running = len(self._in("prefill", "decode"))
        for r in self._in("waiting"):
            if running < self.config.max_running and self._admit(r):
                running += 1
        launched = len(self.model.kernels.calls)
        tokens = self._prefill(self._in("prefill"))
        tokens += self._decode(decoding)
        self.pool.audit()
        shapes = {phase: "x".join(map(str, bucket)) for phase, bucket in self.model.kernels.calls[launched:]}
        self.log(f"step {self.step_no:3d}  running {len(self._in('prefill', 'decode')):2d}  waiting "
                 f"{len(self._in('waiting')):2d}  tokens {tokens:4d}  prefill bucket {shapes.get('prefill', '-'):>7}  "
                 f"decode bucket {shapes.get('decode', '-'):>4}  pool rows {self.pool.in_use:3d}/{len(self.pool.owner)}  "
                 f"cache hits {self.stats['cache_hits']}")  # fmt: skip
        self.step_no += 1

    def _prefill(self, candidates: list[Request]) -> int:
        """One prefill launch per GDN layer: the candidates' next chunks packed into the largest prefill bucket
        (the kernel seam runs the smallest that holds them). A chunk that does not finish its prompt ends on a
        block boundary, so every chunk starts on one and the kernel's checkpoints inside it land on the prefix
        cache's blocks; a request's first chunk resumes from the longest cached prefix of its prompt."""
        block = self.config.block
        tokens_left, slots_left = max(self.config.buckets.prefill)
        batch, segments, pinned = [], [], set()
        for r in candidates:
            hit = self._longest_prefix(r.prompt) if r.prefilled == 0 else None
            start = len(hit) if hit else r.prefilled
            remaining = len(r.prompt) - start
            take = remaining if _padded(remaining) <= tokens_left else tokens_left // block * block
            if not slots_left:
                break
            if not take:  # no room for this one's next block; a shorter prompt after it may still fit
                continue
            read = None
            if hit:
                read = self._resume(r, hit)
                pinned.add(hit)
            tokens_left, slots_left = tokens_left - _padded(take), slots_left - 1
            batch.append(r)
            segments.append(Segment(r.cache, r.prompt[start : start + take], read))
        if not batch:
            return 0
        for r, s in zip(batch, segments, strict=True):
            s.checkpoints = [self._checkpoint_rows(r, r.prefilled + (k + 1) * block, pinned)
                             for k in range(len(s.tokens) // block)]  # fmt: skip
        logits = self.model.forward(segments, decode=False)
        self.stats["prefill_calls"] += 1
        at = 0
        for r, s in zip(batch, segments, strict=True):
            for k, rows in enumerate(s.checkpoints):
                if rows:
                    entry = self.prefix[tuple(r.prompt[: r.prefilled + (k + 1) * block])]
                    entry.kv, entry.complete = self.model.kv_after(s, (k + 1) * block), True
            self.model.commit(s, len(s.tokens))
            at += len(s.tokens)
            r.prefilled += len(s.tokens)
            self.stats["prefill_tokens"] += len(s.tokens)
            if r.prefilled == len(r.prompt):
                self._emit(r, [logits[at - 1]])
                r.state = "decode" if r.state == "prefill" else r.state
        return sum(len(s.tokens) for s in segments)

    def _decode(self, batch: list[Request]) -> int:
        if not batch:
            return 0
        width = self.config.spec_tokens
        segments = [Segment(r.cache, [r.output[-1], *self._draft(r, width - 1)]) for r in batch]
        logits = self.model.forward(segments, decode=True).reshape(len(batch), width, -1)
        self.stats["decode_steps"] += 1
        for r, s, rows in zip(batch, segments, logits, strict=True):
            guesses = rows.argmax(-1).tolist()
            accepted = 1
            while accepted < width and s.tokens[accepted] == guesses[accepted - 1]:
                accepted += 1
            self.stats["drafted"] += width - 1
            self.stats["accepted_drafts"] += accepted - 1
            self.model.commit(s, accepted)
            r.cache.accepted = accepted
            self._emit(r, list(rows[:accepted]))
        return len(batch) * width

    def _draft(self, r: Request, count: int) -> list[int]:
        """Suffix-lookup draft (prompt lookup over every request's tokens, as vLLM's n-gram / suffix decoding):
        what followed the latest earlier occurrence of the request's last 3, 2 or 1 tokens, padded with the last."""
        own = r.prompt + r.output
        histories = [own] + [q.prompt + q.output for q in self.requests.values() if q is not r and q.output]
        for n in (3, 2, 1):
            suffix = own[-n:]
            for history in histories:
                stop = len(history) - n - (1 if history is own else 0)
                for at in range(stop, -1, -1):
                    if history[at : at + n] == suffix:
                        follow = history[at + n : at + n + count]
                        return follow + [own[-1]] * (count - len(follow))
        return [own[-1]] * count

    def _emit(self, r: Request, rows: list[torch.Tensor]) -> None:
        for row in rows:
            if len(r.output) < r.max_new_tokens:
                r.output.append(int(row.argmax()))
                r.logits.append(row.float().clone())
        if len(r.output) >= r.max_new_tokens:
            self._release(r, "done")


def _padded(tokens: int) -> int:
    """Tokens a sequence of ``tokens`` takes of a prefill bucket: its length rounded up to the kernel's chunk."""
    return -(-tokens // CHUNK) * CHUNK


def _belongs(owner: object, rid: int) -> bool:
    """A pool owner that is request ``rid`` or a prefix-cache entry it wrote."""
    return owner == rid or (isinstance(owner, tuple) and owner[1] == rid)
