# Cython types for sequence.py, compiled in pure-Python mode (the .py stays the one source):
# a sequence's and a request's state as C fields, read by the compiled scheduler.
cdef class Sequence:
    cdef public long long seq_id
    cdef public object request
    cdef public long long sample_index
    cdef public object params
    cdef public list token_ids
    cdef public long long num_prompt_tokens
    cdef public long long num_computed_tokens
    cdef public long long prefill_target
    cdef public long long num_known
    cdef public object status
    cdef public object finish_reason
    cdef public list output_logprobs
    cdef public long long num_preemptions
    cdef public object token_times


cdef class Request:
    cdef public object request_id
    cdef public tuple prompt_token_ids
    cdef public object params
    cdef public double arrival_time
    cdef public long long order
    cdef public tuple sample_params
    cdef public list sequences
    cdef public object first_scheduled_time
    cdef public object first_token_time
    cdef public object finish_time
    cdef public object prompt_logits
