"""A pure-Python model of gnomon's BlockAllocator: the same semantics and the same algorithm.

It keeps the same O(1) structures (a free queue threaded through per-block links with two
sentinels, a dict from key to block) so the benchmark compares like with like, and the stateful
test compares every observable with the C++ allocator after every step.
"""

from __future__ import annotations

from dataclasses import dataclass

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
NO_SERIAL, ROOT_SERIAL, FIRST_SERIAL = 0, 1, 2


def mix64(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def hash_block(parent_key: int, tokens, extra_key: int) -> int:
    h = mix64(mix64(parent_key ^ 0x9E3779B97F4A7C15) ^ extra_key)
    for t in tokens:
        h = ((h ^ (t & M32)) * 0x100000001B3) & M64
    return mix64(h)


NULL = -1


@dataclass
class Seq:
    tokens: list
    tables: list  # per group, one list of block ids (NULL where the window released one)
    released: list  # per group, the leading entries the window has released
    num_computed: int
    num_slots: int
    num_full_committed: int
    last_key: int
    last_serial: int
    extra_key: int


@dataclass
class CacheEntry:
    group: int
    key: int
    serial: int
    verify_serial: int
    extra_key: int
    tokens: tuple


@dataclass
class Stats:
    queries: int = 0
    hits: int = 0
    allocations: int = 0
    failed_allocations: int = 0
    evictions: int = 0


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _int_list(values, arg: str) -> list:
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    for i, v in enumerate(values):
        if not INT32_MIN <= v <= INT32_MAX:
            raise ValueError(f"{arg}: entry {i} = {v} is outside the int32 range")
    return values


class PyBlockAllocator:
    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True,
                 *, hash_bits: int = 64, groups=(None,)):
        if num_blocks < 1:
            raise ValueError(f"num_blocks: expected an integer >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size: expected an integer >= 1, got {block_size}")
        if not 1 <= hash_bits <= 64:
            raise ValueError(f"hash_bits: expected an integer in [1, 64], got {hash_bits}")
        if not groups or any(w is not None and w < 1 for w in groups):
            raise ValueError(f"groups: expected windows >= 1 or None, at least one, got {groups}")
        self.groups = tuple(groups)
        self._anchor = self.groups.index(None) if None in self.groups else 0
        self._owner = [0] * num_blocks  # the group whose table or cache holds each block
        self.group_counters = [{"blocks_in_use": 0, "evictions": 0, "released": 0}
                               for _ in self.groups]
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._mask = (1 << hash_bits) - 1
        self._ref = [0] * num_blocks
        self._entry: list[CacheEntry | None] = [None] * num_blocks
        self._head, self._tail = num_blocks, num_blocks + 1
        self._next = [-1] * (num_blocks + 2)
        self._prev = [-1] * (num_blocks + 2)
        last = self._head
        for b in range(num_blocks):
            self._next[last], self._prev[b] = b, last
            last = b
        self._next[last], self._prev[self._tail] = self._tail, last
        self.num_free_blocks = num_blocks
        self._caches: list[dict[int, int]] = [{} for _ in self.groups]
        self._serial = FIRST_SERIAL
        self._seqs: dict[int, Seq] = {}
        self._copies: list[tuple[int, int]] = []
        self._stats = Stats()
        self._failed = None  # (seq_id, tokens, extra_key) of the last admit that returned -1
        self.duplicates = self.collisions = 0  # observed by the tests only

    # -- the free queue ------------------------------------------------------------------------

    def _link_after(self, at: int, b: int) -> None:
        after = self._next[at]
        self._prev[b], self._next[b] = at, after
        self._next[at] = b
        self._prev[after] = b
        self.num_free_blocks += 1

    def _unlink(self, b: int) -> None:
        p, n = self._prev[b], self._next[b]
        self._next[p], self._prev[n] = n, p
        self._prev[b] = self._next[b] = -1
        self.num_free_blocks -= 1

    def _take_fresh(self, g: int) -> int:
        b = self._next[self._head]
        self._unlink(b)
        entry = self._entry[b]
        if entry is not None:
            del self._caches[entry.group][entry.key]
            self._entry[b] = None
            self._stats.evictions += 1
            self.group_counters[entry.group]["evictions"] += 1
        self._ref[b] = 1
        self._owner[b] = g
        self.group_counters[g]["blocks_in_use"] += 1
        return b

    def _claim(self, b: int) -> None:
        if self._ref[b] == 0:
            self._unlink(b)
            self.group_counters[self._owner[b]]["blocks_in_use"] += 1
        self._ref[b] += 1

    def _release(self, b: int) -> None:
        self._ref[b] -= 1
        if self._ref[b] == 0:
            self.group_counters[self._owner[b]]["blocks_in_use"] -= 1
            self._link_after(self._prev[self._tail] if self._entry[b] is not None else self._head, b)

    # -- the prefix cache ----------------------------------------------------------------------

    def _holds(self, b: int, verify_serial: int, extra_key: int, tokens: tuple) -> bool:
        e = self._entry[b]
        return e.verify_serial == verify_serial and e.extra_key == extra_key and e.tokens == tokens

    def _first_needed(self, g: int, num_tokens: int) -> int:
        window = self.groups[g]
        return 0 if window is None else max(0, num_tokens - window + 1) // self.block_size

    def _walk(self, tokens: list, extra_key: int):
        """(per group the hit's blocks, NULL where not needed; chain key; anchor serial)."""
        none = [[] for _ in self.groups], 0, ROOT_SERIAL
        if not self.enable_prefix_caching or not tokens:
            return none
        bs = self.block_size
        chunks, keys, serials, anchor_blocks = [], [], [], []
        key, serial = 0, ROOT_SERIAL
        for i in range((len(tokens) - 1) // bs):
            chunk = tuple(tokens[i * bs:(i + 1) * bs])
            key = hash_block(key, chunk, extra_key) & self._mask
            b = self._caches[self._anchor].get(key)
            if b is None or not self._holds(b, serial, extra_key, chunk):
                break
            serial = self._entry[b].serial
            chunks.append(chunk)
            keys.append(key)
            serials.append(serial)
            anchor_blocks.append(b)
        found = []
        for g in range(len(self.groups)):
            if g == self._anchor:
                found.append(anchor_blocks)
                continue
            row = []
            for chunk, k, s in zip(chunks, keys, serials):
                b = self._caches[g].get(k)
                row.append(b if b is not None and self._holds(b, s, extra_key, chunk) else NULL)
            found.append(row)

        def served(hit):
            return all(NULL not in row[self._first_needed(g, hit * bs):hit]
                       for g, row in enumerate(found))

        hit = next(h for h in range(len(keys), -1, -1) if h == 0 or served(h))
        if hit == 0:
            return none
        claims = [[NULL] * self._first_needed(g, hit * bs) + row[self._first_needed(g, hit * bs):hit]
                  for g, row in enumerate(found)]
        return claims, keys[hit - 1], serials[hit - 1]

    def lookup(self, token_ids, extra_key: int = 0) -> int:
        tokens = _int_list(token_ids, "token_ids")
        return len(self._walk(tokens, extra_key & M64)[0][0]) * self.block_size

    def _cache_block(self, g: int, b: int, key: int, verify: int, extra_key: int, chunk) -> int:
        """Caches block b of group g under key unless the key is taken; the key's block."""
        other = self._caches[g].get(key)
        if other is not None:
            if g == self._anchor or self._holds(other, verify, extra_key, chunk):
                return other
            self._entry[other] = None  # stale or colliding: the new block takes the key
        self._caches[g][key] = b
        self._entry[b] = CacheEntry(g, key, self._serial, verify, extra_key, chunk)
        self._serial += 1
        return b

    def _cache_next_full_block(self, s: Seq) -> None:
        i = s.num_full_committed
        s.num_full_committed += 1
        if s.last_serial == NO_SERIAL:
            return
        bs = self.block_size
        chunk = tuple(s.tokens[i * bs:(i + 1) * bs])
        key = hash_block(s.last_key, chunk, s.extra_key) & self._mask
        s.last_key = key
        b = s.tables[self._anchor][i]
        held = self._cache_block(self._anchor, b, key, s.last_serial, s.extra_key, chunk)
        if held != b:
            same = self._holds(held, s.last_serial, s.extra_key, chunk)
            self.duplicates += same
            self.collisions += not same
            if not same:
                s.last_serial = NO_SERIAL
                return
        s.last_serial = self._entry[held].serial
        for g in range(len(self.groups)):
            if g != self._anchor:
                self._cache_block(g, s.tables[g][i], key, s.last_serial, s.extra_key, chunk)

    def _release_outside_window(self, s: Seq) -> None:
        for g, window in enumerate(self.groups):
            if window is None:
                continue
            table, released = s.tables[g], self._first_needed(g, s.num_computed)
            for i in range(s.released[g], released):
                if table[i] != NULL:
                    self._release(table[i])
                    table[i] = NULL
                    self.group_counters[g]["released"] += 1
            s.released[g] = max(s.released[g], released)

    def reset_prefix_cache(self) -> bool:
        if self.num_free_blocks != self.num_blocks:
            return False
        for cache in self._caches:
            for b in cache.values():
                self._entry[b] = None
            cache.clear()
        return True

    # -- sequences -----------------------------------------------------------------------------

    def _seq(self, seq_id: int, arg: str) -> Seq:
        s = self._seqs.get(seq_id)
        if s is None:
            raise KeyError(f"{arg}: unknown sequence id {seq_id}")
        return s

    def allocate(self, seq_id: int, new_token_ids, num_new_tokens: int, extra_key: int = 0) -> bool:
        tokens = _int_list(new_token_ids, "new_token_ids")
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens: expected an integer >= 0, got {num_new_tokens}")
        s = self._seqs.get(seq_id)
        if s is not None:
            return self._extend(s, tokens, num_new_tokens)
        return self._admit(seq_id, tokens, num_new_tokens, extra_key & M64)

    def admit(self, seq_id: int, token_ids, target: int, max_new_tokens: int,
              extra_key: int = 0) -> int:
        """`lookup` then `allocate` of a new sequence, its new tokens ``min(target - cached,
        max_new_tokens)``: the cached tokens, or -1 where they do not fit. ``token_ids=None``
        repeats the last admit that returned -1 (of this ``seq_id``, with its ``extra_key``)
        with its token ids; an admit that fits forgets it."""
        if token_ids is None:
            if self._failed is None or self._failed[0] != seq_id:
                raise ValueError(f"token_ids: None retries the last admission that did not fit "
                                 f"({self._failed and self._failed[0]}), not {seq_id}")
            if extra_key != self._failed[2]:
                raise ValueError(f"extra_key: a retry keeps {self._failed[2]}, got {extra_key}")
            tokens = self._failed[1]
        else:
            tokens = _int_list(token_ids, "token_ids")
        if seq_id in self._seqs:
            raise ValueError(f"seq_id: sequence id {seq_id} is already present")
        if not 0 <= target <= len(tokens):
            raise ValueError(f"target: expected 0 <= target <= {len(tokens)}, got {target}")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens: expected an integer >= 0, got {max_new_tokens}")
        cached = self.lookup(tokens, extra_key)
        fits = self.allocate(seq_id, tokens, max(0, min(target - cached, max_new_tokens)),
                             extra_key)
        self._failed = None if fits else (seq_id, tokens, extra_key)
        return cached if fits else -1

    def _admit(self, seq_id: int, tokens: list, num_new: int, extra_key: int) -> bool:
        bs, groups = self.block_size, len(self.groups)
        claims, key, serial = self._walk(tokens, extra_key)
        hit = len(claims[0])
        claimed_free = sum(1 for row in claims for b in row if b != NULL and self._ref[b] == 0)
        computed = hit * bs
        want = _ceil_div(computed + num_new, bs)
        if num_new > self.num_blocks * bs or \
                groups * (want - hit) > self.num_free_blocks - claimed_free:
            self._stats.failed_allocations += 1
            return False
        for b in (b for row in claims for b in row if b != NULL):
            self._claim(b)
        tables = [row + [self._take_fresh(g) for _ in range(want - hit)]
                  for g, row in enumerate(claims)]
        released = [self._first_needed(g, computed) for g in range(groups)]
        self._seqs[seq_id] = Seq(tokens, tables, released, computed, computed + num_new, hit,
                                 key, serial, extra_key)
        self._stats.queries += len(tokens)
        self._stats.hits += computed
        self._stats.allocations += 1
        return True

    def _extend(self, s: Seq, tokens: list, num_new: int) -> bool:
        bs = self.block_size
        if num_new > self.num_blocks * bs:
            self._stats.failed_allocations += 1
            return False
        slots = s.num_computed + num_new
        have, want = len(s.tables[0]), _ceil_div(slots, bs)
        first_written = s.num_computed // bs
        written_shared = [[i for i in range(first_written, min(have, want))
                           if self._ref[table[i]] > 1] for table in s.tables]
        if len(self.groups) * max(want - have, 0) + sum(map(len, written_shared)) > \
                self.num_free_blocks:
            self._stats.failed_allocations += 1
            return False
        s.tokens.extend(tokens)
        for g, (table, shared) in enumerate(zip(s.tables, written_shared)):
            for i in shared:
                src = table[i]
                dst = self._take_fresh(g)
                self._ref[src] -= 1
                table[i] = dst
                if i * bs < s.num_computed:
                    self._copies.append((src, dst))
            table.extend(self._take_fresh(g) for _ in range(want - have))
        s.num_slots = max(s.num_slots, slots)
        self._stats.allocations += 1
        return True

    def _check_commit(self, s: Seq, n: int) -> None:
        if n < s.num_computed:
            raise ValueError(f"num_computed_tokens: {n} is below the sequence's {s.num_computed} "
                             "computed tokens; it may not decrease")
        if n > s.num_slots:
            raise ValueError(f"num_computed_tokens: {n} is beyond the {s.num_slots} tokens "
                             "allocated to the sequence")
        if n > len(s.tokens):
            raise ValueError(f"num_computed_tokens: {n} is beyond the {len(s.tokens)} token ids "
                             "the allocator was given for the sequence")

    def _apply_commit(self, s: Seq, n: int) -> None:
        s.num_computed = n
        if self.enable_prefix_caching:
            while (s.num_full_committed + 1) * self.block_size <= n:
                self._cache_next_full_block(s)
        self._release_outside_window(s)

    def commit(self, seq_id: int, num_computed_tokens: int) -> None:
        s = self._seq(seq_id, "seq_id")
        self._check_commit(s, num_computed_tokens)
        self._apply_commit(s, num_computed_tokens)

    def _batch(self, seq_ids: list) -> list:
        seqs = []
        for i, seq_id in enumerate(seq_ids):
            s = self._seqs.get(seq_id)
            if s is None:
                raise KeyError(f"seq_ids: unknown sequence id {seq_id} at index {i}")
            seqs.append(s)
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError("seq_ids: a sequence id appears more than once")
        return seqs

    def allocate_batch(self, seq_ids, new_token_ids, new_token_counts, num_new_tokens) -> int:
        ids, counts, nums = seq_ids.tolist(), new_token_counts.tolist(), num_new_tokens.tolist()
        tokens = _int_list(new_token_ids, "new_token_ids")
        if len(counts) != len(ids) or len(nums) != len(ids):
            raise ValueError("new_token_counts, num_new_tokens: expected one entry per seq_ids")
        seqs = self._batch(ids)
        if any(c < 0 for c in counts) or sum(counts) != len(tokens):
            raise ValueError("new_token_counts: must be >= 0 and sum to len(new_token_ids)")
        if any(n < 0 for n in nums):
            raise ValueError("num_new_tokens: expected integers >= 0")
        offset = 0
        for i, (s, c, n) in enumerate(zip(seqs, counts, nums)):
            if not self._extend(s, tokens[offset:offset + c], n):
                return i
            offset += c
        return len(ids)

    def commit_batch(self, seq_ids, num_computed_tokens) -> None:
        ids, nums = seq_ids.tolist(), num_computed_tokens.tolist()
        if len(nums) != len(ids):
            raise ValueError("num_computed_tokens: expected one entry per seq_ids")
        seqs = self._batch(ids)
        for s, n in zip(seqs, nums):
            self._check_commit(s, n)
        for s, n in zip(seqs, nums):
            self._apply_commit(s, n)

    def free(self, seq_id: int) -> None:
        s = self._seq(seq_id, "seq_id")
        order = [g for g in range(len(self.groups)) if g != self._anchor] + [self._anchor]
        for i in reversed(range(len(s.tables[0]))):
            for g in order:  # the anchor last
                if s.tables[g][i] != NULL:
                    self._release(s.tables[g][i])
        self._copies = [(src, dst) for src, dst in self._copies if self._ref[dst] > 0]
        del self._seqs[seq_id]

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        p = self._seq(parent_seq_id, "parent_seq_id")
        if child_seq_id in self._seqs:
            raise ValueError(f"child_seq_id: sequence id {child_seq_id} is already present")
        if p.num_slots != p.num_computed:
            raise ValueError(f"parent_seq_id: sequence {parent_seq_id} has allocated tokens "
                             "not yet committed; fork it after commit")
        self._seqs[child_seq_id] = Seq(list(p.tokens), [list(t) for t in p.tables],
                                       list(p.released), p.num_computed, p.num_slots,
                                       p.num_full_committed, p.last_key, p.last_serial,
                                       p.extra_key)
        for table in p.tables:
            for b in table:
                if b != NULL:
                    self._ref[b] += 1

    def pending_copies(self) -> list:
        copies, self._copies = self._copies, []
        return copies

    # -- inspection ----------------------------------------------------------------------------

    def block_table(self, seq_id: int, group: int = 0) -> list:
        if not 0 <= group < len(self.groups):
            raise ValueError(f"group: expected 0 <= group < {len(self.groups)}, got {group}")
        return list(self._seq(seq_id, "seq_id").tables[group])

    def num_computed_tokens(self, seq_id: int) -> int:
        return self._seq(seq_id, "seq_id").num_computed

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def __len__(self) -> int:
        return len(self._seqs)

    def ref_count(self, block_id: int) -> int:
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(f"block_id: expected 0 <= block_id < {self.num_blocks}")
        return self._ref[block_id]

    def free_queue(self) -> list:
        order, b = [], self._next[self._head]
        while b != self._tail:
            order.append(b)
            b = self._next[b]
        return order

    def cached_blocks(self) -> list:
        return sorted(b for cache in self._caches for b in cache.values())

    @property
    def num_cached_blocks(self) -> int:
        return sum(map(len, self._caches))

    def group_stats(self) -> list:
        return [{"window": window, "blocks_in_use": c["blocks_in_use"],
                 "cached_blocks": len(cache), "evictions": c["evictions"],
                 "released": c["released"]}
                for window, c, cache in zip(self.groups, self.group_counters, self._caches)]

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def stats(self) -> dict:
        st = self._stats
        return {"queries": st.queries, "hits": st.hits,
                "hit_rate": st.hits / st.queries if st.queries else 0.0,
                "allocations": st.allocations, "failed_allocations": st.failed_allocations,
                "evictions": st.evictions}
