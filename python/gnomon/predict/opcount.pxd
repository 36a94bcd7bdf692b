# Cython types for opcount.py, compiled in pure-Python mode (the .py stays the one source).
import cython


@cython.locals(keys=cython.longlong, reads=cython.longlong, n=cython.longlong,
               c=cython.longlong, m=cython.longlong, t0=cython.longlong, t1=cython.longlong,
               union=cython.longlong)
cpdef tuple attention_sums(requests, long long window)
