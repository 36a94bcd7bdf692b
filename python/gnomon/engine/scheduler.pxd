# Cython types for scheduler.py, compiled in pure-Python mode (the .py stays the one source):
# the scheduler's state as C fields, and the per-step loops on C integers.
import cython
from gnomon.engine.sequence cimport Request, Sequence

cdef class Scheduler:
    cdef public object kv
    cdef public long long max_model_len
    cdef public long long max_num_seqs
    cdef public long long max_num_batched_tokens
    cdef public frozenset eos_token_ids
    cdef public dict _requests
    cdef public dict _live
    cdef public list _arrivals
    cdef public object _waiting
    cdef public list _running
    cdef public list _finished_since_batch
    cdef public object _outstanding
    cdef public double _outstanding_now
    cdef public long long _next_seq_id
    cdef public long long _order
    cdef public long long num_preemptions
    cdef public str capacity_policy
    cdef public object vocab_size
    cdef public dict _reservations
    cdef public long long _reserved
    cdef public long long batch_wait_timeout_iters
    cdef public double batch_wait_max_tokens_ratio
    cdef public long long _batch_wait_iters
    cdef public bint hold_prompts
    cdef public bint prefill_first
    cdef public long long num_speculative_tokens

    @cython.locals(seq=Sequence, req=Request, k=cython.longlong, c=cython.longlong,
                   budget=cython.longlong, start=cython.longlong, ok=cython.longlong,
                   slots=cython.longlong, num_prefill=cython.longlong,
                   num_decode=cython.longlong, cached=cython.longlong, i=cython.longlong,
                   need=cython.longlong, reserve=cython.bint, waits=cython.bint,
                   alone=cython.bint, per_decode=cython.longlong, drafts=cython.longlong)
    cpdef schedule(self, double now=*)

    @cython.locals(seq=Sequence, req=Request, i=cython.longlong, context_len=cython.longlong,
                   n=cython.longlong, kept=cython.longlong)
    cpdef update(self, batch, output, now=*)

    @cython.locals(start=cython.longlong, freed=cython.longlong, i=cython.longlong,
                   k=cython.longlong)
    cpdef long long _allocate_plan(self, list plan, dict reports)

    @cython.locals(seq=Sequence, budget=cython.longlong, tokens=cython.longlong,
                   slots=cython.longlong)
    cpdef bint _prompts_wait(self, long long decodes, list prefilling)

    @cython.locals(seq=Sequence, used=cython.longlong)
    cpdef long long _free_slots(self)

    @cython.locals(seq=Sequence, steps=cython.longlong, left=cython.longlong)
    cpdef long long plain_decode_steps(self, long long token)

    @cython.locals(seq=Sequence, n=cython.longlong)
    cpdef begin_decode(self, double now)

    cpdef bint decode_ready(self, double now)

    @cython.locals(seq=Sequence, decoding=cython.longlong)
    cpdef tuple pending_work(self, double now)

    @cython.locals(seq=Sequence)
    cpdef end_decode(self, long long token, double now)

    @cython.locals(seq=Sequence, k=cython.longlong, ok=cython.longlong)
    cpdef long long _allocate(self, list plan, dict reports=*)
