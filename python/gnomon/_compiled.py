"""Which of gnomon's modules run compiled, and the import hook that decides it.

The build (cmake/cython.cmake) compiles a few pure-Python modules with Cython: the ``.py`` stays
the code, and its extension module is installed beside it, where Python's own import would
prefer it. The build also installs ``_compiled_modules.txt``, the dotted names it compiled.
`install` puts a finder for exactly those names at the front of ``sys.meta_path``:

- ``GNOMON_PURE_PYTHON=1``: each loads from its ``.py`` (the one that is first on its package's
  ``__path__``), although an extension is there.
- otherwise the extension loads, after a check that it was compiled from the ``.py`` (and the
  ``.pxd``) beside it now: each extension exports ``gnomon_source_sha256``, a C string
  ``"py=<sha256> pxd=<sha256 or none>"`` of the sources Cython read. The finder reads it through
  ctypes (which maps the library without calling its ``PyInit_``), so a stale module is refused
  with an ImportError before any of its code runs. Where no ``.py`` is there (a wheel shipped
  without sources) the extension loads unchecked.

The finder locates files by asking the rest of ``sys.meta_path`` (so scikit-build-core's editable
finder, which maps the build tree's extensions, keeps its say) and by the package's ``__path__``.
A checkout with no compiled modules has no ``_compiled_modules.txt``: nothing is routed.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES

PURE_PYTHON_ENV = "GNOMON_PURE_PYTHON"
MANIFEST = "_compiled_modules.txt"
SOURCE_HASH_SYMBOL = "gnomon_source_sha256"

_finder: _CompiledFinder | None = None


def pure_python() -> bool:
    """Whether ``GNOMON_PURE_PYTHON=1`` asks for every compiled module's ``.py``."""
    value = os.environ.get(PURE_PYTHON_ENV, "")
    if value not in ("", "0", "1"):
        raise ImportError(f"{PURE_PYTHON_ENV} must be 1 (run the .py of gnomon's compiled "
                          f"modules) or 0 or unset (run them compiled), got {value!r}")
    return value == "1"


def install(package_path) -> None:
    """Route the modules named in the manifest found on ``package_path`` (gnomon's ``__path__``).
    Called by ``gnomon/__init__.py`` before it imports any other submodule; calling it again
    (a reload of gnomon) replaces the finder."""
    global _finder
    pure = pure_python()
    names = ()
    for directory in package_path:
        try:
            with open(os.path.join(directory, MANIFEST), encoding="utf-8") as f:
                names = tuple(line.strip() for line in f if line.strip())
            break
        except FileNotFoundError:
            continue
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _CompiledFinder)]
    _finder = _CompiledFinder(names, pure, list(package_path))
    if names:
        sys.meta_path.insert(0, _finder)


def compiled_modules() -> dict:
    """``{dotted name: compiled}`` for each module this build compiled: for one imported, whether
    it was loaded compiled; for one not yet imported, whether it would be (False in pure mode and
    where the extension is stale). Empty for a build that compiled nothing."""
    if _finder is None:
        return {}
    out = {}
    for name in _finder.names:
        module = sys.modules.get(name)
        if module is not None:
            out[name] = _is_extension(getattr(module.__spec__, "origin", None))
        else:
            try:
                spec = _finder.find_spec(name, _finder.search_path(name))
            except ImportError:
                spec = None
            out[name] = spec is not None and _is_extension(spec.origin)
    return out


class _CompiledFinder:
    """A ``sys.meta_path`` finder for gnomon's compiled modules (see the module docstring)."""

    def __init__(self, names, pure: bool, package_path) -> None:
        self.names = tuple(names)  # the manifest's order
        self._routed = frozenset(names)  # every import in the process asks this finder first
        self.pure = pure
        self.package_path = package_path

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self._routed:
            return None
        source = _source_file(fullname, path)
        if self.pure:
            if source is None:
                raise ImportError(f"{fullname}: {PURE_PYTHON_ENV}=1 asks for its .py, and there "
                                  f"is none on {list(path or [])}", name=fullname)
            from importlib.machinery import SourceFileLoader
            from importlib.util import spec_from_file_location

            return spec_from_file_location(fullname, source,
                                           loader=SourceFileLoader(fullname, source))
        spec = self._others_spec(fullname, path, target)
        if spec is not None and _is_extension(spec.origin) and source is not None:
            _check_fresh(fullname, spec.origin, source)
        return spec

    def _others_spec(self, fullname, path, target):
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or isinstance(finder, _CompiledFinder) or find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def search_path(self, fullname):
        """The ``__path__`` of ``fullname``'s package: the imported one's, else gnomon's joined
        with the subpackage folders (what a plain install and skbuild's editable finder give)."""
        parent = fullname.rpartition(".")[0]
        package = sys.modules.get(parent)
        if package is not None and hasattr(package, "__path__"):
            return list(package.__path__)
        rest = parent.split(".")[1:]
        return [os.path.join(p, *rest) for p in self.package_path]


def _is_extension(origin) -> bool:
    return isinstance(origin, str) and origin.endswith(tuple(EXTENSION_SUFFIXES))


def _source_file(fullname, path):
    """The ``.py`` that the interpreter would run for ``fullname``: the first on ``path``."""
    stem = fullname.rpartition(".")[2] + ".py"
    for directory in path or ():
        candidate = os.path.join(directory, stem)
        if os.path.isfile(candidate):
            return candidate
    return None


def source_hash(source: str) -> str:
    """``"py=<sha256> pxd=<sha256 or none>"`` for ``source`` and the ``.pxd`` beside it, as the
    build embeds it (cmake/cython.cmake)."""
    import hashlib

    def sha256(path):
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()

    pxd = source[:-len(".py")] + ".pxd"
    return f"py={sha256(source)} pxd={sha256(pxd) if os.path.isfile(pxd) else 'none'}"


def embedded_hash(extension: str):
    """The source hash compiled into ``extension``, or None where it carries none. The library
    is mapped (as the import will map it) but its module init is not called; OSError where it
    cannot be mapped."""
    import ctypes

    library = ctypes.CDLL(extension, mode=getattr(os, "RTLD_LOCAL", 0))
    try:
        symbol = ctypes.c_char.in_dll(library, SOURCE_HASH_SYMBOL)
    except ValueError:
        return None
    return ctypes.string_at(ctypes.addressof(symbol)).decode("ascii", "replace")


def _check_fresh(fullname, extension, source) -> None:
    if not os.path.isfile(extension):  # an editable install maps it, but it is not there
        why = "is missing"
    else:
        try:
            compiled = embedded_hash(extension)
        except OSError:  # the import itself will say why it cannot be loaded
            return
        current = source_hash(source)
        if compiled == current:
            return
        if compiled is None:
            why = "carries no source hash (gnomon's build did not make it)"
        else:
            stem = source[:-len(".py")]
            changed = [stem + suffix for suffix, old, new in zip(
                (".py", ".pxd"), compiled.split(), current.split()) if old != new]
            why = f"was compiled from another version of {' and '.join(changed) or source}"
    raise ImportError(
        f"{fullname}: the compiled module {extension} {why}. Rebuild (`pip install .` again), "
        f"or set {PURE_PYTHON_ENV}=1 to run {source}.", name=fullname, path=extension)
