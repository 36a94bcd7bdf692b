// The one Python module, gnomon._C. Arguments are converted and checked here; the C++ classes
// check their own invariants again, so no call from Python can corrupt their state.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <string>
#include <vector>

#include "allocator/block_allocator.h"
#include "core/build_info.h"
#include "core/errors.h"
#include "core/threads.h"
#include "cpu/vec.h"
#include "ops.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace gnomon {
namespace {
TensorView view_from_tuple(py::handle obj);
}
}  // namespace gnomon

// A TensorView crosses from Python as the tuple gnomon.ops.view builds: (data pointer, dtype
// code, shape, strides, device code, device index, stream). A tuple rather than a bound class
// because an op call builds one per tensor, and a bound class instance costs about 0.7 us to make.
namespace pybind11::detail {
template <>
struct type_caster<gnomon::TensorView> {
  PYBIND11_TYPE_CASTER(gnomon::TensorView,
                       const_name("tuple[data, dtype, shape, strides, device, device_index, "
                                  "stream]"));
  bool load(handle src, bool) {
    value = gnomon::view_from_tuple(src);
    return true;
  }
};
}  // namespace pybind11::detail

namespace gnomon {
namespace {

std::string type_name(py::handle obj) { return py::str(py::type::of(obj).attr("__name__")); }

// The value of an exact int of one internal digit (|value| < 2**30: every token id, and the
// sequence ids an engine numbers), read in place: a batch converts thousands of them per step,
// and PyLong_AsLongLongAndOverflow is a call per entry. False for any other object, which then
// takes that call. CPython 3.12 made this an API (PyUnstable_Long_IsCompact / CompactValue);
// 3.11's layout is the one Cython reads, the digit count signed by the value's sign.
inline bool compact_int(PyObject* item, long long& value) {
  if (!PyLong_CheckExact(item)) return false;
#if PY_VERSION_HEX >= 0x030C0000
  const auto* number = reinterpret_cast<PyLongObject*>(item);
  if (!PyUnstable_Long_IsCompact(number)) return false;
  value = PyUnstable_Long_CompactValue(number);
#else
  const Py_ssize_t digits = Py_SIZE(item);
  if (digits < -1 || digits > 1) return false;
  value = digits == 0 ? 0 : digits * static_cast<long long>(
                                          reinterpret_cast<PyLongObject*>(item)->ob_digit[0]);
#endif
  return true;
}

// Entry i of a sequence argument as an int64; a bool is not an int here.
int64_t int_entry(PyObject* item, const char* arg, size_t i, const char* range) {
  if (!PyLong_Check(item) || PyBool_Check(item)) {
    raise<TypeError>(arg, ": entry ", i, " is a ", type_name(item), "; expected int");
  }
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(item, &overflow);
  if (overflow != 0) {
    raise<ValueError>(arg, ": entry ", i, " = ", std::string(py::str(item)), " is outside the ",
                      range, " range");
  }
  return value;
}

// The Python ints of a list, tuple or other sequence, as int64.
std::vector<int64_t> python_ints(py::handle obj, const char* arg, const char* range) {
  const py::object fast = py::reinterpret_steal<py::object>(PySequence_Fast(obj.ptr(), arg));
  if (!fast) throw py::error_already_set();
  const size_t n = static_cast<size_t>(PySequence_Fast_GET_SIZE(fast.ptr()));
  PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
  std::vector<int64_t> values(n);
  for (size_t i = 0; i < n; ++i) {
    long long value = 0;
    values[i] = compact_int(items[i], value) ? value : int_entry(items[i], arg, i, range);
  }
  return values;
}

// A batch argument: a 1-D numpy int32/int64 array (borrowed) or a list or tuple of Python ints
// (copied into `storage`). It converts to the IntSpan the allocator takes; a temporary lives to
// the end of the call expression that uses it.
struct IntArg {
  std::vector<int64_t> storage;
  IntSpan span;
  operator IntSpan() const { return span; }
};

IntArg int_array(py::handle obj, const char* arg) {
  IntArg out;
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) {
    out.storage = python_ints(obj, arg, "int64");
    out.span = IntSpan{out.storage.data(), out.storage.size(), true};
    return out;
  }
  if (!py::isinstance<py::array>(obj)) {
    raise<TypeError>(arg, ": expected a 1-D numpy array of int32 or int64, or a list of ints, "
                     "got ", type_name(obj));
  }
  const auto array = py::reinterpret_borrow<py::array>(obj);
  const py::dtype dtype = array.dtype();
  if (dtype.kind() != 'i' || (dtype.itemsize() != 4 && dtype.itemsize() != 8) ||
      !dtype.attr("isnative").cast<bool>()) {
    raise<TypeError>(arg, ": expected dtype int32 or int64 in native byte order, got ",
                     std::string(py::str(dtype)));
  }
  if (array.ndim() != 1) {
    raise<ValueError>(arg, ": expected a 1-D array, got ", array.ndim(), " dimensions");
  }
  if (!(array.flags() & py::array::c_style)) {
    raise<ValueError>(arg, ": expected a C-contiguous array (use numpy.ascontiguousarray)");
  }
  out.span = IntSpan{array.data(), static_cast<size_t>(array.shape(0)), dtype.itemsize() == 8};
  return out;
}

// A batch argument of `n` entries that may also be one Python int, read as n equal entries.
IntArg int_array_or_int(py::handle obj, const char* arg, size_t n) {
  if (!PyLong_Check(obj.ptr()) || PyBool_Check(obj.ptr())) return int_array(obj, arg);
  IntArg out;
  out.storage = {int_entry(obj.ptr(), arg, 0, "int64")};
  out.span = IntSpan{out.storage.data(), n, true, true};
  return out;
}

// Token ids from a 1-D int array or any sequence of Python ints, checked to fit int32.
std::vector<int32_t> token_ids(py::handle obj, const char* arg) {
  IntArg converted;
  if (py::isinstance<py::array>(obj)) {
    converted = int_array(obj, arg);
  } else if (PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()) ||
             !PySequence_Check(obj.ptr())) {
    raise<TypeError>(arg, ": expected a sequence of ints or a 1-D int array, got ",
                     type_name(obj));
  } else {
    // One pass from the Python ints to int32: an admission converts a whole prompt.
    const py::object fast = py::reinterpret_steal<py::object>(PySequence_Fast(obj.ptr(), arg));
    if (!fast) throw py::error_already_set();
    const size_t n = static_cast<size_t>(PySequence_Fast_GET_SIZE(fast.ptr()));
    PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
    std::vector<int32_t> ids(n);
    for (size_t i = 0; i < n; ++i) {
      int overflow = 0;
      long long value = 0;
      if (!compact_int(items[i], value)) {
        value = PyLong_CheckExact(items[i]) ? PyLong_AsLongLongAndOverflow(items[i], &overflow)
                                            : int_entry(items[i], arg, i, "int32");
      }
      if (overflow != 0 || value < INT32_MIN || value > INT32_MAX) {
        raise<ValueError>(arg, ": entry ", i, " = ", std::string(py::str(items[i])),
                          " is outside the int32 range");
      }
      ids[i] = static_cast<int32_t>(value);
    }
    return ids;
  }
  const IntSpan& span = converted.span;
  std::vector<int32_t> ids(span.size);
  for (size_t i = 0; i < span.size; ++i) {
    if (span[i] < INT32_MIN || span[i] > INT32_MAX) {
      raise<ValueError>(arg, ": entry ", i, " = ", span[i], " is outside the int32 range");
    }
    ids[i] = static_cast<int32_t>(span[i]);
  }
  return ids;
}

// Any int in [-2**63, 2**64), taken modulo 2**64, so hash() of a salt works as it is.
uint64_t extra_key_arg(const py::int_& value) {
  const py::int_ wrapped = py::reinterpret_steal<py::int_>(
      PyNumber_And(value.ptr(), py::int_(~0ULL).ptr()));
  const bool in_range = value >= py::int_(LLONG_MIN) && value <= py::int_(~0ULL);
  if (!in_range) {
    raise<ValueError>("extra_key: expected an integer in [-2**63, 2**64), got ",
                      std::string(py::str(value)));
  }
  return wrapped.cast<uint64_t>();
}

TokenSpan span_of(const std::vector<int32_t>& ids) { return TokenSpan{ids.data(), ids.size()}; }

py::array_t<int32_t> int32_array(const std::vector<int32_t>& values) {
  return py::array_t<int32_t>(static_cast<py::ssize_t>(values.size()), values.data());
}

// take_block_updates' reports as Python tuples: (full, per group the appended ids, per group
// ((index, id), ...)). The report of a sequence whose tables did not change (most of a decode
// step's) is one shared tuple.
py::list block_updates(const std::vector<BlockUpdate>& updates) {
  py::list out(updates.size());
  py::object unchanged;
  for (size_t i = 0; i < updates.size(); ++i) {
    const BlockUpdate& u = updates[i];
    const bool same = !u.full && std::all_of(u.groups.begin(), u.groups.end(), [](const auto& g) {
      return g.num_appended == 0 && g.replaced.empty();
    });
    if (same && unchanged) {
      out[i] = unchanged;
      continue;
    }
    py::tuple appended(u.groups.size()), replaced(u.groups.size());
    for (size_t g = 0; g < u.groups.size(); ++g) {
      const GroupUpdate& group = u.groups[g];
      // The C API's own tuple filling: a whole table per new sequence, an int per block.
      auto ids = py::reinterpret_steal<py::tuple>(
          PyTuple_New(static_cast<py::ssize_t>(group.num_appended)));
      if (!ids) throw py::error_already_set();
      for (size_t j = 0; j < group.num_appended; ++j) {
        PyObject* id = PyLong_FromLong(group.appended[j]);
        if (id == nullptr) throw py::error_already_set();
        PyTuple_SET_ITEM(ids.ptr(), static_cast<py::ssize_t>(j), id);
      }
      py::tuple pairs(group.replaced.size());
      for (size_t j = 0; j < group.replaced.size(); ++j) {
        pairs[j] = py::make_tuple(group.replaced[j].first, group.replaced[j].second);
      }
      appended[g] = std::move(ids);
      replaced[g] = std::move(pairs);
    }
    out[i] = py::make_tuple(py::bool_(u.full), std::move(appended), std::move(replaced));
    if (same) unchanged = out[i];
  }
  return out;
}

// The `groups` argument: one entry per KV-cache group, None (full attention) or a window >= 1.
std::vector<int64_t> group_windows(py::handle groups) {
  if (!PyList_Check(groups.ptr()) && !PyTuple_Check(groups.ptr())) {
    raise<TypeError>("groups: expected a list or tuple with one entry per KV-cache group (None "
                     "for full attention, an int >= 1 for a sliding window), got ",
                     type_name(groups));
  }
  const auto items = py::reinterpret_borrow<py::sequence>(groups);
  std::vector<int64_t> windows;
  for (size_t g = 0; g < items.size(); ++g) {
    const py::object item = items[g];
    if (item.is_none()) {
      windows.push_back(BlockAllocator::kFullAttention);
      continue;
    }
    if (!PyLong_Check(item.ptr()) || PyBool_Check(item.ptr())) {
      raise<TypeError>("groups: entry ", g, " is ", type_name(item),
                       "; expected None (full attention) or an int >= 1 (a sliding window)");
    }
    int overflow = 0;
    const long long window = PyLong_AsLongLongAndOverflow(item.ptr(), &overflow);
    if (overflow > 0) raise<ValueError>("groups: entry ", g, " is a window beyond int64");
    if (overflow < 0 || window < 1) {
      raise<ValueError>("groups: entry ", g, " is a sliding window of ", window,
                        " tokens; a window must be >= 1 (None for full attention)");
    }
    windows.push_back(window);
  }
  if (windows.empty()) {
    raise<ValueError>("groups: expected at least one KV-cache group, got none");
  }
  return windows;
}

py::object window_of(const BlockAllocator& a, int64_t group) {
  const int64_t window = a.window(group);
  return window == BlockAllocator::kFullAttention ? py::object(py::none())
                                                   : py::object(py::int_(window));
}

constexpr const char* kAllocatorDoc = R"doc(
Paged KV-cache block allocator with prefix caching, in C++.

BlockAllocator(num_blocks, block_size=16, enable_prefix_caching=True, *, hash_bits=64,
               groups=(None,))

Blocks hold ``block_size`` token slots; a token's slot is ``block_id * block_size + offset``.
One allocator object is not thread-safe: call it from one thread (it keeps the GIL).

Structure
  Every block has a ref count: the number of sequences whose block table holds it. Blocks with
  ref count 0 sit in one free queue, doubly linked through the blocks themselves, so taking a
  block out of the middle is O(1). Fresh blocks are taken from the head.

KV-cache groups
  ``groups`` has one entry per group of layers that share a block table: None for full attention,
  or an int >= 1 for a sliding window of that many tokens. All groups share the one pool. Each
  sequence holds one table per group, all of the same length (one entry per ``block_size``
  positions), and every call below acts on all of a sequence's groups at once: an allocation
  gives each group its blocks or none of them.
  A sliding group releases a block once no token still to compute can attend to it. With ``c``
  tokens computed, the next token sits at position ``c`` and attends to ``c - window + 1 .. c``;
  block ``i`` holds positions ``i * block_size .. (i + 1) * block_size - 1``, so it is released
  when ``(i + 1) * block_size <= c - window + 1``. Its table entry then reads -1 (the null block),
  so positions and slots stay aligned. The default, one full group, is the plain allocator.

Prefix caching
  A full block's key is a 64-bit hash chained over the parent block's key, the block's token
  ids and ``extra_key`` (a namespace such as a LoRA id or cache salt; it enters every block's
  hash, the first one included). The hash is deterministic across processes. ``hash_bits``
  keeps only the low bits of each key, so tests can force collisions.
  A block enters the cache only once it is full and ``commit`` says its KV is computed.
  A hash match also compares the stored token ids, the extra key and the cache entry the block
  was computed on top of, so a collision is a miss and can never hand out wrong KV. A block
  whose parent's content is not in the cache (after a collision) is not cached either.
  With several groups each group caches its own blocks. The anchor group (the first full one,
  else the first) is verified as above, along an unbroken chain from the first block. Its
  entries' serials, never reused, each name one exact prefix. A block of another group is
  cached against the anchor entry for the same prefix, and a hit on it counts only when the
  lookup's anchor chain reaches that very entry; so a sliding group hits even when its older
  blocks are evicted, and a block whose anchor entry was evicted (and perhaps recached with other
  content, under a new serial) never matches again; the next block computed for its key in that
  group replaces it. A hit must be served by every group at once:
  a full group needs all its blocks of the prefix, a sliding group only those the window of the
  first new token sees. The hit is the longest such prefix, the minimum over the groups. When
  the anchor itself is a sliding group (no full group), it too hits only along an unbroken chain.

lookup(token_ids, extra_key=0) -> int
  How many leading tokens already have cached KV in every group: whole blocks only, and at least
  one token is left to compute, so a fully cached prompt recomputes its last block. Changes no
  state.

allocate(seq_id, new_token_ids, num_new_tokens, extra_key=0) -> bool
  Appends ``new_token_ids`` to what the allocator knows of the sequence: the whole prompt for a
  new sequence; for a running one only what was appended since its last call (usually the one
  sampled token, nothing during a prompt's later chunks). For a new sequence it first claims
  exactly the blocks ``lookup`` would count now (in a sliding group those its window needs; the
  entries before read -1): each claimed block's ref count goes up, a hit on a free block takes
  it out of the free queue, and the claimed tokens count as computed.
  The admitting call counts the prefix-cache ``queries`` (prompt tokens) and ``hits`` (claimed
  tokens). Then it makes sure the sequence has slots for its computed tokens plus
  ``num_new_tokens``. ``extra_key`` applies at admission; a running sequence keeps its own.
  When a write would land in a block another sequence also holds (after ``fork``), that block
  is first replaced by a private copy, and ``(src, dst)`` joins ``pending_copies()`` if the
  block held computed tokens.
  All or nothing: if the free blocks do not suffice it returns False and changes nothing but
  the ``failed_allocations`` counter.

admit(seq_id, token_ids, target, max_new_tokens, extra_key=0) -> int
  ``lookup`` and ``allocate`` of a new sequence in one pass over its prompt: it claims its
  cached prefix (``cached`` tokens, as ``lookup`` counts them) and allocates
  ``min(target - cached, max_new_tokens)`` (at least 0) new tokens, as an engine admits a
  prompt up to ``target`` (its prefill's end) within a step's token budget. Returns ``cached``,
  or -1 when the free blocks do not suffice (nothing changes but ``failed_allocations``).
  ``seq_id`` must be new, ``0 <= target <= len(token_ids)`` and ``max_new_tokens >= 0``.
  ``token_ids=None`` retries the last admit that returned -1, which must be of this
  ``seq_id``, with its token ids and ``extra_key``: the same answer as passing them, as an
  engine retries the head of its waiting queue each step. It neither converts nor hashes the
  prompt again, and while no block has entered a cache under a key of the prompt's chain it
  answers -1 at once when the fresh blocks its last hit would leave exceed the free ones (no
  hit can have grown). An admit that fits forgets the failed one.

commit(seq_id, num_computed_tokens)
  After a forward: records how many of the sequence's tokens now have KV. It may not decrease,
  nor exceed the tokens allocated or the token ids known. Blocks that became full enter the
  prefix cache, and then sliding groups release the blocks their window left behind; a newly full block whose content is already cached (a duplicate, as when a fully
  cached prompt recomputes its last block) stays out of the cache and is freed like any
  uncached block.

allocate_batch(seq_ids, new_token_ids, new_token_counts, num_new_tokens) -> int
  The per-step form of ``allocate`` for running sequences. Arguments are 1-D C-contiguous numpy
  arrays of int32 or int64, or lists or tuples of ints (the cheaper form for small batches);
  ``new_token_ids`` is the concatenation of each sequence's new tokens.
  All arguments are checked before anything changes. Sequences are processed in order, each all
  or nothing; it stops at the first that does not fit and returns how many succeeded.

commit_batch(seq_ids, num_computed_tokens)
  The per-step form of ``commit``, with the same array rules; checked whole, then applied.

step(commit_seq_ids, num_computed_tokens, free_seq_ids, seq_ids, new_token_ids,
     new_token_counts, num_new_tokens) -> (int, list)
  One engine step's allocator work in one call: ``commit_batch`` of the sequences just
  computed, ``free`` of the finished ones, then ``allocate_batch`` of the next step's running
  sequences (same array rules). ``num_computed_tokens`` None commits each sequence up to the
  tokens it has slots for (what a step computes); ``new_token_counts`` and ``num_new_tokens``
  may each be one int for every sequence (1 and 1 for a step of decodes). Everything is
  checked before anything changes; a sequence cannot be both freed and allocated. Returns how
  many leading ``seq_ids`` got their slots and their ``take_block_updates`` reports.

free(seq_id)
  Releases the sequence's blocks in reverse block-table order, so a chain's tail is evicted
  before its head; at each position every group, the anchor last, so an anchor entry outlives
  the blocks cached against it. A block reaching ref count 0 returns to the free queue: at the
  tail if it holds cached content (LRU), at the head if not. Taking a cached free block as a fresh block
  evicts it and removes its hash entry. Pending copies into blocks nobody holds are dropped.

fork(parent_seq_id, child_seq_id)
  The child shares every block of the parent in every group (ref count +1 each), for parallel
  sampling. The parent must have no allocated tokens left uncommitted.

pending_copies() -> list[tuple[int, int]]
  Returns and clears the copy-on-write ``(src, dst)`` block pairs to copy before the forward.

take_block_updates(seq_ids) -> list[tuple[bool, tuple[tuple[int, ...], ...],
                                       tuple[tuple[tuple[int, int], ...], ...]]]
  Per sequence (a 1-D int array of distinct known ids, as the batch forms take), what changed in
  its block tables since its previous report, as ``(full, appended, replaced)`` with one entry
  per group in ``appended`` and in ``replaced``, and marks it reported. The first report of a
  sequence (new, forked, or admitted again after ``free``) has ``full`` True and ``appended`` its
  whole tables. Later reports give the ids appended since, and ``replaced``: the
  ``(index, block_id)`` entries already reported that were replaced in place, by copy-on-write
  or by a window's release (block id -1). Applying the reports in order rebuilds
  ``block_table(seq_id, group)`` exactly, at a cost that grows with what changed, not with the
  table.

Inspection: block_table(seq_id, group=0) (a new int32 array), num_computed_tokens(seq_id),
ref_count(block_id), free_queue() (block ids in queue order), cached_blocks() (sorted ids),
the properties num_blocks, block_size, num_free_blocks, num_cached_blocks, usage (the used
fraction), and stats(), a dict with exactly the keys queries, hits (both in tokens), hit_rate,
allocations (successful allocate calls, per sequence in a batch), failed_allocations and
evictions (cached blocks reused as fresh ones). ``groups`` is the tuple of group windows (None for
full attention), and group_stats() a list with one dict per group: window, blocks_in_use,
cached_blocks, evictions and released (blocks its window released); blocks_in_use is the tuple
of those counts alone, cheap enough to read every step.

reset_prefix_cache() -> bool
  Drops every cache entry; refuses, returning False, while any block is in use.

Bad input (an unknown sequence id or group, a fork into a present id, a non-positive size or
window, an empty group list, a token id
outside int32, a negative num_new_tokens, a commit beyond what was allocated) raises KeyError
or ValueError naming the argument, and leaves the allocator unchanged.
)doc";

void bind_allocator(py::module_& m) {
  py::class_<BlockAllocator>(m, "BlockAllocator", kAllocatorDoc)
      .def(py::init([](int64_t num_blocks, int64_t block_size, bool enable_prefix_caching,
                       int hash_bits, py::handle groups) {
             return new BlockAllocator(num_blocks, block_size, enable_prefix_caching, hash_bits,
                                       group_windows(groups));
           }),
           "num_blocks"_a, "block_size"_a = 16, "enable_prefix_caching"_a = true, py::kw_only(),
           "hash_bits"_a = 64, "groups"_a = py::make_tuple(py::none()))
      .def(
          "lookup",
          [](const BlockAllocator& self, py::handle token_ids, const py::int_& extra_key) {
            const std::vector<int32_t> ids = gnomon::token_ids(token_ids, "token_ids");
            return self.lookup(span_of(ids), extra_key_arg(extra_key));
          },
          "token_ids"_a, "extra_key"_a = 0)
      .def(
          "allocate",
          [](BlockAllocator& self, int64_t seq_id, py::handle new_token_ids,
             int64_t num_new_tokens, const py::int_& extra_key) {
            const std::vector<int32_t> ids = token_ids(new_token_ids, "new_token_ids");
            return self.allocate(seq_id, span_of(ids), num_new_tokens, extra_key_arg(extra_key));
          },
          "seq_id"_a, "new_token_ids"_a, "num_new_tokens"_a, "extra_key"_a = 0)
      .def(
          "admit",
          [](BlockAllocator& self, int64_t seq_id, py::handle token_ids, int64_t target,
             int64_t max_new_tokens, const py::int_& extra_key) {
            if (token_ids.is_none()) {
              return self.retry_admission(seq_id, target, max_new_tokens,
                                          extra_key_arg(extra_key));
            }
            const std::vector<int32_t> ids = gnomon::token_ids(token_ids, "token_ids");
            return self.admit(seq_id, span_of(ids), target, max_new_tokens,
                              extra_key_arg(extra_key));
          },
          "seq_id"_a, "token_ids"_a, "target"_a, "max_new_tokens"_a, "extra_key"_a = 0)
      .def("commit", &BlockAllocator::commit, "seq_id"_a, "num_computed_tokens"_a)
      .def(
          "allocate_batch",
          [](BlockAllocator& self, py::handle seq_ids, py::handle new_token_ids,
             py::handle new_token_counts, py::handle num_new_tokens) {
            return self.allocate_batch(int_array(seq_ids, "seq_ids"),
                                       int_array(new_token_ids, "new_token_ids"),
                                       int_array(new_token_counts, "new_token_counts"),
                                       int_array(num_new_tokens, "num_new_tokens"));
          },
          "seq_ids"_a, "new_token_ids"_a, "new_token_counts"_a, "num_new_tokens"_a)
      .def(
          "commit_batch",
          [](BlockAllocator& self, py::handle seq_ids, py::handle num_computed_tokens) {
            self.commit_batch(int_array(seq_ids, "seq_ids"),
                              int_array(num_computed_tokens, "num_computed_tokens"));
          },
          "seq_ids"_a, "num_computed_tokens"_a)
      .def("free", &BlockAllocator::free, "seq_id"_a)
      .def("fork", &BlockAllocator::fork, "parent_seq_id"_a, "child_seq_id"_a)
      .def("pending_copies", &BlockAllocator::take_pending_copies)
      .def(
          "take_block_updates",
          [](BlockAllocator& self, py::handle seq_ids) {
            return block_updates(self.take_block_updates(int_array(seq_ids, "seq_ids")));
          },
          "seq_ids"_a)
      .def(
          "step",
          [](BlockAllocator& self, py::handle commit_seq_ids, py::handle num_computed_tokens,
             py::handle free_seq_ids, py::handle seq_ids, py::handle new_token_ids,
             py::handle new_token_counts, py::handle num_new_tokens) {
            const IntArg ids = int_array(seq_ids, "seq_ids");
            const IntArg commits = int_array(commit_seq_ids, "commit_seq_ids");
            const bool all_allocated = num_computed_tokens.is_none();
            const IntArg computed = all_allocated
                                        ? IntArg{}
                                        : int_array(num_computed_tokens, "num_computed_tokens");
            const int64_t fitted = self.step(
                commits, all_allocated ? nullptr : &computed.span,
                int_array(free_seq_ids, "free_seq_ids"), ids,
                int_array(new_token_ids, "new_token_ids"),
                int_array_or_int(new_token_counts, "new_token_counts", ids.span.size),
                int_array_or_int(num_new_tokens, "num_new_tokens", ids.span.size));
            return py::make_tuple(fitted, block_updates(self.take_step_updates(fitted)));
          },
          "commit_seq_ids"_a, "num_computed_tokens"_a, "free_seq_ids"_a, "seq_ids"_a,
          "new_token_ids"_a, "new_token_counts"_a, "num_new_tokens"_a)
      .def("reset_prefix_cache", &BlockAllocator::reset_prefix_cache)
      .def(
          "block_table",
          [](const BlockAllocator& self, int64_t seq_id, int64_t group) {
            return int32_array(self.block_table(seq_id, group));
          },
          "seq_id"_a, "group"_a = 0)
      .def("num_computed_tokens", &BlockAllocator::num_computed_tokens, "seq_id"_a)
      .def("__contains__", &BlockAllocator::contains, "seq_id"_a)
      .def("__len__", &BlockAllocator::num_sequences)
      .def("ref_count", &BlockAllocator::ref_count, "block_id"_a)
      .def("free_queue", [](const BlockAllocator& self) { return int32_array(self.free_queue()); })
      .def("cached_blocks",
           [](const BlockAllocator& self) { return int32_array(self.cached_blocks()); })
      .def("stats",
           [](const BlockAllocator& self) {
             const AllocatorStats& s = self.stats();
             const double hit_rate =
                 s.queries == 0 ? 0.0 : static_cast<double>(s.hits) / s.queries;
             return py::dict("queries"_a = s.queries, "hits"_a = s.hits, "hit_rate"_a = hit_rate,
                             "allocations"_a = s.allocations,
                             "failed_allocations"_a = s.failed_allocations,
                             "evictions"_a = s.evictions);
           })
      .def("group_stats",
           [](const BlockAllocator& self) {
             py::list out;
             for (int64_t g = 0; g < self.num_groups(); ++g) {
               const GroupStats& s = self.group_stats(g);
               out.append(py::dict("window"_a = window_of(self, g),
                                   "blocks_in_use"_a = s.blocks_in_use,
                                   "cached_blocks"_a = self.num_group_cached_blocks(g),
                                   "evictions"_a = s.evictions, "released"_a = s.released));
             }
             return out;
           })
      .def_property_readonly("blocks_in_use",
                             [](const BlockAllocator& self) {
                               py::tuple held(self.num_groups());
                               for (int64_t g = 0; g < self.num_groups(); ++g) {
                                 held[g] = self.group_stats(g).blocks_in_use;
                               }
                               return held;
                             })
      .def_property_readonly("groups",
                             [](const BlockAllocator& self) {
                               py::tuple windows(self.num_groups());
                               for (int64_t g = 0; g < self.num_groups(); ++g) {
                                 windows[g] = window_of(self, g);
                               }
                               return windows;
                             })
      .def_property_readonly("num_blocks", &BlockAllocator::num_blocks)
      .def_property_readonly("block_size", &BlockAllocator::block_size)
      .def_property_readonly("enable_prefix_caching", &BlockAllocator::prefix_caching)
      .def_property_readonly("hash_bits", &BlockAllocator::hash_bits)
      .def_property_readonly("num_free_blocks", &BlockAllocator::num_free_blocks)
      .def_property_readonly("num_cached_blocks", &BlockAllocator::num_cached_blocks)
      .def_property_readonly("usage", &BlockAllocator::usage)
      .def("__repr__", [](const BlockAllocator& self) {
        return concat("BlockAllocator(num_blocks=", self.num_blocks(),
                      ", block_size=", self.block_size(), ", enable_prefix_caching=",
                      self.prefix_caching() ? "True" : "False", ", free=", self.num_free_blocks(),
                      ", cached=", self.num_cached_blocks(), ", sequences=",
                      self.num_sequences(), ")");
      });
}

// A view's shape or strides: a tuple (torch.Size is one) of ints.
Dims dims_entry(PyObject* obj, const char* arg) {
  if (!PyTuple_Check(obj)) raise<TypeError>(arg, ": expected a tuple of ints, got ", type_name(obj));
  const Py_ssize_t n = PyTuple_GET_SIZE(obj);
  if (n > kMaxDims) raise<ValueError>(arg, ": a view takes at most ", kMaxDims, " dims, got ", n);
  Dims dims(n);
  for (Py_ssize_t i = 0; i < n; ++i) dims[i] = int_entry(PyTuple_GET_ITEM(obj, i), arg, i, "int64");
  return dims;
}

// An int field of a view tuple, within [lo, hi].
int64_t view_field(PyObject* obj, const char* field, int64_t lo, int64_t hi) {
  if (!PyLong_Check(obj) || PyBool_Check(obj)) {
    raise<TypeError>("TensorView ", field, ": expected int, got ", type_name(obj));
  }
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (overflow != 0 || value < lo || value > hi) {
    raise<ValueError>("TensorView ", field, ": ", std::string(py::str(obj)), " is outside [",
                      lo, ", ", hi, "]");
  }
  return value;
}

// A pointer or stream field: any value of uintptr_t.
uintptr_t address_field(PyObject* obj, const char* field) {
  if (!PyLong_Check(obj) || PyBool_Check(obj)) {
    raise<TypeError>("TensorView ", field, ": expected int, got ", type_name(obj));
  }
  const unsigned long long value = PyLong_AsUnsignedLongLong(obj);
  if (value == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    raise<ValueError>("TensorView ", field, ": ", std::string(py::str(obj)),
                      " is not an address (an int in [0, 2**64))");
  }
  return static_cast<uintptr_t>(value);
}

TensorView view_from_tuple(py::handle obj) {
  if (!PyTuple_Check(obj.ptr()) || PyTuple_GET_SIZE(obj.ptr()) != 7) {
    raise<TypeError>("TensorView: expected a tuple (data, dtype, shape, strides, device, "
                     "device_index, stream) as gnomon.ops._tensor.view builds, got ",
                     type_name(obj));
  }
  PyObject* const* f = &PyTuple_GET_ITEM(obj.ptr(), 0);
  TensorView view;
  view.data = reinterpret_cast<void*>(address_field(f[0], "data"));
  view.dtype = static_cast<DType>(view_field(f[1], "dtype", 0, static_cast<int>(DType::Int64)));
  view.shape = dims_entry(f[2], "TensorView shape");
  view.strides = dims_entry(f[3], "TensorView strides");
  view.device =
      static_cast<DeviceType>(view_field(f[4], "device", 0, static_cast<int>(DeviceType::HIP)));
  view.device_index = static_cast<int32_t>(view_field(f[5], "device_index", 0, INT32_MAX));
  view.stream = address_field(f[6], "stream");
  if (view.shape.size() != view.strides.size()) {
    raise<ValueError>("TensorView strides: expected one stride per dim (", view.shape.size(),
                      "), got ", view.strides.size());
  }
  for (const int64_t s : view.shape) {
    if (s < 0) raise<ValueError>("TensorView shape: sizes must be >= 0, got ", view.describe());
  }
  if (view.data == nullptr && view.numel() > 0) raise<ValueError>("TensorView data: null pointer");
  return view;
}

const TensorView* maybe(const std::optional<TensorView>& view) {
  return view.has_value() ? &*view : nullptr;
}

// The op entries. Arguments are converted with the GIL held; the kernels run without it.
void bind_ops(py::module_& m) {
  m.def("describe_view", &TensorView::describe, "view"_a,
        "The C++ reading of a view tuple, as its errors print it: 'bfloat16[4, 8] on cpu'.");

  using View = const TensorView&;
  using Optional = const std::optional<TensorView>&;
  const auto release = py::call_guard<py::gil_scoped_release>();

  m.def("reshape_and_cache", &gnomon::reshape_and_cache, "key"_a, "value"_a, "key_cache"_a,
        "value_cache"_a, "slot_mapping"_a, release);
  m.def(
      "paged_attention",
      [](View out, View query, View key_cache, View value_cache, View block_tables,
         View seq_lens, View query_start_loc, double scale, int64_t sliding_window,
         Optional sinks) {
        gnomon::paged_attention(out, query, key_cache, value_cache, block_tables, seq_lens,
                                query_start_loc, scale, sliding_window, maybe(sinks));
      },
      "out"_a, "query"_a, "key_cache"_a, "value_cache"_a, "block_tables"_a, "seq_lens"_a,
      "query_start_loc"_a, "scale"_a, "sliding_window"_a, "sinks"_a, release);
  m.def(
      "rms_norm",
      [](View out, View x, View weight, double eps, Optional residual) {
        gnomon::rms_norm(out, x, weight, eps, maybe(residual));
      },
      "out"_a, "x"_a, "weight"_a, "eps"_a, "residual"_a, release);
  m.def("rotary_embedding", &gnomon::rotary_embedding, "positions"_a, "query"_a, "key"_a,
        "cos_sin_cache"_a, "is_neox"_a, release);
  m.def(
      "topk_routing",
      [](View topk_weights, View topk_ids, View router_logits, int64_t top_k,
         const std::string& mode, bool renormalize) {
        gnomon::topk_routing(topk_weights, topk_ids, router_logits, top_k,
                             parse_routing_mode(mode, "mode"), renormalize);
      },
      "topk_weights"_a, "topk_ids"_a, "router_logits"_a, "top_k"_a, "mode"_a, "renormalize"_a,
      release);
  m.def(
      "fused_moe",
      [](View out, View hidden, View w13, View w2, View topk_weights, View topk_ids,
         const std::string& activation, const std::string& gate_up_layout, Optional w13_bias,
         Optional w2_bias, Optional w13_scales, Optional w2_scales) {
        gnomon::fused_moe(out, hidden, w13, w2, topk_weights, topk_ids,
                          parse_activation(activation, "activation"),
                          parse_gate_up_layout(gate_up_layout, "gate_up_layout"), maybe(w13_bias),
                          maybe(w2_bias), maybe(w13_scales), maybe(w2_scales));
      },
      "out"_a, "hidden"_a, "w13"_a, "w2"_a, "topk_weights"_a, "topk_ids"_a, "activation"_a,
      "gate_up_layout"_a, "w13_bias"_a, "w2_bias"_a, "w13_scales"_a, "w2_scales"_a, release);
  m.def(
      "mxfp4_quantize",
      [](View packed, View scales, View x, const std::string& scale_rule) {
        gnomon::mxfp4_quantize(packed, scales, x, parse_scale_rule(scale_rule, "scale_rule"));
      },
      "packed"_a, "scales"_a, "x"_a, "scale_rule"_a, release);
  m.def("mxfp4_dequantize", &gnomon::mxfp4_dequantize, "out"_a, "packed"_a, "scales"_a, release);
  m.def(
      "mxfp4_gemm",
      [](View out, View a, View w, View w_scales, Optional bias) {
        gnomon::mxfp4_gemm(out, a, w, w_scales, maybe(bias));
      },
      "out"_a, "a"_a, "w"_a, "w_scales"_a, "bias"_a, release);
}

}  // namespace
}  // namespace gnomon

PYBIND11_MODULE(_C, m) {
  m.doc() = "gnomon's C++ kernels and allocator";
  m.attr("__version__") = GNOMON_VERSION;

  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const gnomon::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const gnomon::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const gnomon::KeyError& e) {
      PyErr_SetString(PyExc_KeyError, e.what());
    }
  });

  m.def("build_info", [] {
    const gnomon::BuildInfo info = gnomon::build_info();
    return py::dict("version"_a = info.version, "compiler"_a = info.compiler,
                    "build_type"_a = info.build_type, "cxx_flags"_a = info.cxx_flags,
                    "sanitizers"_a = info.sanitizers, "simd_compiled"_a = info.simd_compiled,
                    "simd_cpu"_a = info.simd_cpu, "gpu_backends"_a = info.gpu_backends,
                    "gpu_architectures"_a = info.gpu_architectures);
  });
  m.def(
      "cpu_peak_gflops",
      [](const std::string& unit, double seconds) {
        if (unit != "fma" && unit != "bf16_dot") {
          gnomon::raise<gnomon::ValueError>("unit: expected 'fma' or 'bf16_dot', got '", unit,
                                            "'");
        }
        return gnomon::cpu::peak_gflops(unit == "bf16_dot", seconds);
      },
      "unit"_a, "seconds"_a = 0.2, py::call_guard<py::gil_scoped_release>(),
      "The vector units' peak GFLOP/s at num_threads() threads on the kernel family the ops run "
      "(GNOMON_CPU_KERNELS caps it): float32 FMAs, or bf16 dot products (0.0 where the family "
      "has none). The best of at least five register-only runs over `seconds`.");
  m.def("cpu_kernel_isa", [] { return gnomon::cpu::isa_name(gnomon::cpu::kernel_isa()); },
        "The CPU kernel family the ops run now: avx512-bf16, avx512, avx2 or portable.");
  m.def(
      "cpu_kernel_paths",
      [] {
        const char* family = gnomon::cpu::isa_name(gnomon::cpu::kernel_isa());
        const char* rows = gnomon::cpu::row_helpers_isa();
        return py::dict("paged_attention"_a = family, "fused_moe"_a = family,
                        "mxfp4_gemm"_a = family, "rms_norm"_a = rows, "rotary_embedding"_a = rows);
      },
      "The SIMD path each CPU op family runs on this CPU now: the kernel family (cpu_kernel_isa) "
      "for attention, MoE and MXFP4; the load-time clone of the row helpers for the norms.");
  m.def("num_threads", &gnomon::num_threads);
  m.def("set_num_threads", &gnomon::set_num_threads, "n"_a);

  gnomon::bind_allocator(m);
  gnomon::bind_ops(m);
}
