"""The Cython-compiled modules (cmake/cython.cmake, gnomon/_compiled.py): GNOMON_PURE_PYTHON=1 runs
their .py, a compiled install runs the extensions, a stale extension is refused before its code
runs, and one source behaves the same both ways.

Every check that imports a module runs in a subprocess, so that the choice made at import is the
one under test. On a build that compiled nothing (an uncompiled checkout, GNOMON_CYTHON=OFF, a
sanitizer build) the checks that need extensions skip and say so."""

import json
import os
import re
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

import gnomon
from gnomon import _compiled, cli

CMAKE = Path(__file__).resolve().parents[1] / "cmake" / "cython.cmake"
BUILT = list(_compiled.compiled_modules())  # the modules this build compiled (its manifest)
needs_compiled = pytest.mark.skipif(
    not BUILT, reason="this build of gnomon compiled no modules (an uncompiled checkout, "
                      "GNOMON_CYTHON=OFF or a sanitizer build): nothing runs compiled")


def listed_modules():
    """The dotted names that cmake/cython.cmake's GNOMON_CYTHON_MODULES lists."""
    text = CMAKE.read_text()
    body = re.search(r"set\(GNOMON_CYTHON_MODULES\s+([^)]*)\)", text).group(1)
    return [path[:-len(".py")].replace("/", ".") for path in body.split()]


def run(code, *args, pure):
    """Runs ``code`` in a fresh interpreter that imports this same gnomon; returns its JSON."""
    env = dict(os.environ)
    env.pop(_compiled.PURE_PYTHON_ENV, None)
    if pure:
        env[_compiled.PURE_PYTHON_ENV] = "1"
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, cwd=Path(gnomon.__file__).parents[1])
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out.pop("gnomon") == gnomon.__file__, "the subprocess imported another gnomon"
    return out


IMPORT_ALL = """
import importlib, json, pickle, sys
import gnomon
from gnomon import _compiled
files, names_ok = {}, {}
for name in json.loads(sys.argv[1]):
    module = importlib.import_module(name)
    files[name] = module.__file__
    # everything the module defines names it, so that pickling finds it again
    own = [v for v in vars(module).values()
           if callable(v) and getattr(v, "__module__", None) == name]
    names_ok[name] = bool(own) and all(pickle.loads(pickle.dumps(v)) is v for v in own)
print(json.dumps({"gnomon": gnomon.__file__, "files": files, "names_ok": names_ok,
                  "compiled": _compiled.compiled_modules()}))
"""


def test_the_build_compiled_what_cmake_lists():
    if not BUILT:
        pytest.skip("this build compiled no modules: no manifest to compare")
    if not CMAKE.exists():
        pytest.skip(f"{CMAKE} is not here (tests run outside a checkout)")
    assert BUILT == listed_modules()


def test_pure_python_mode_runs_every_py():
    names = BUILT or listed_modules()
    out = run(IMPORT_ALL, json.dumps(names), pure=True)
    for name in names:
        assert out["files"][name].endswith(".py"), (name, out["files"][name])
        assert out["names_ok"][name], name
    assert not any(out["compiled"].values())


@needs_compiled
def test_a_compiled_install_runs_the_extensions():
    out = run(IMPORT_ALL, json.dumps(BUILT), pure=False)
    for name in BUILT:
        assert out["files"][name].endswith(tuple(EXTENSION_SUFFIXES)), (name, out["files"][name])
        assert out["names_ok"][name], f"{name}: __module__ or pickling is wrong when compiled"
    assert out["compiled"] == {name: True for name in BUILT}


def extension_and_source(name):
    """The installed extension of ``name`` and the .py beside it (in an editable install they
    lie in different folders of the package's __path__)."""
    parts = name.split(".")[1:]
    folders = [Path(p, *parts[:-1]) for p in gnomon.__path__]
    extensions = [f / (parts[-1] + s) for f in folders for s in EXTENSION_SUFFIXES]
    sources = [f / (parts[-1] + ".py") for f in folders]
    return next(p for p in extensions if p.is_file()), next(p for p in sources if p.is_file())


REPLACED_PACKAGE = """
import importlib, json, sys
import gnomon
name, folder = sys.argv[1], sys.argv[2]
package = importlib.import_module(name.rpartition(".")[0])
package.__path__[:] = [folder]  # this process sees the copied package only
# An editable install's finder (scikit-build-core) maps each name to a fixed file, whatever
# __path__ says: leave the import to gnomon's finder and the path machinery.
sys.meta_path[:] = [f for f in sys.meta_path if not hasattr(f, "known_wheel_files")]
before = set(sys.modules)
try:
    module = importlib.import_module(name)
except ImportError as e:
    out = {"error": str(e), "error_name": e.name}
else:
    out = {"file": module.__file__}
out["imported_gnomon_modules"] = sorted(m for m in set(sys.modules) - before
                                        if m.startswith("gnomon.") and m != name)
print(json.dumps({"gnomon": gnomon.__file__, **out}))
"""


@needs_compiled
@pytest.mark.parametrize("change", ["none", "edit the .py", "change the .pxd", "remove the .py"])
def test_an_extension_is_refused_when_its_sources_changed(tmp_path, change):
    """A copy of the module's package (its .py files and the one extension) in tmp_path: the
    real install is never touched."""
    name = "gnomon.engine.sequence" if "gnomon.engine.sequence" in BUILT else BUILT[0]
    extension, source = extension_and_source(name)
    copy = tmp_path / "package"
    copy.mkdir()
    # the package's .py and .pxd files, the first on __path__ winning
    for folder in reversed([Path(p, *name.split(".")[1:-1]) for p in gnomon.__path__]):
        for f in (folder.iterdir() if folder.is_dir() else ()):
            if f.suffix in (".py", ".pxd"):
                shutil.copy(f, copy / f.name)
    shutil.copy(extension, copy / extension.name)
    py, pxd = copy / source.name, copy / (source.stem + ".pxd")
    if change == "edit the .py":
        py.write_text(py.read_text() + "\n# edited after the build\n")
    elif change == "change the .pxd":
        if pxd.exists():
            pxd.unlink()
        else:
            pxd.write_text("# a .pxd the build did not see\n")
    elif change == "remove the .py":
        py.unlink()

    out = run(REPLACED_PACKAGE, name, str(copy), pure=False)
    if change in ("none", "remove the .py"):  # fresh, or no source to compare: loads compiled
        assert out.get("file") == str(copy / extension.name), out
        # its body imports gnomon modules: what shows below that a refused one did not run
        assert out["imported_gnomon_modules"], out
        return
    assert "file" not in out, f"a stale {name} was loaded"
    assert out["error_name"] == name
    message = out["error"]
    assert name in message and "Rebuild" in message and "pip install ." in message
    assert "GNOMON_PURE_PYTHON=1" in message
    assert f"another version of {pxd if 'pxd' in change else py}" in message
    # refused before the module's body ran: it would have imported its gnomon dependencies
    assert out["imported_gnomon_modules"] == []


SEEDS = """
import json
import gnomon
from gnomon.engine.sequence import sample_seed
seeds = [None, 0, 1, 7, 12345, 2**31 - 1, 2**32 + 5, 2**63 - 1, 2**64 + 3, -1, -(2**40)]
print(json.dumps({"gnomon": gnomon.__file__,
                  "seeds": [[sample_seed(s, i) for i in range(6)] for s in seeds]}))
"""


@needs_compiled
def test_one_source_behaves_the_same_compiled_and_interpreted():
    if "gnomon.engine.sequence" not in BUILT:
        pytest.skip("gnomon.engine.sequence is not compiled in this build")
    compiled, interpreted = run(SEEDS, pure=False), run(SEEDS, pure=True)
    assert compiled == interpreted
    assert len(set(map(tuple, compiled["seeds"]))) == len(compiled["seeds"])  # not all alike


def test_info_says_what_runs_compiled(capsys):
    cli.main(["info", "--json"])
    info = json.loads(capsys.readouterr().out)
    assert info["compiled_modules"] == _compiled.compiled_modules()
    assert info["pure_python"] == _compiled.pure_python()
    cli.main(["info"])
    assert re.search(r"^cython: +\S", capsys.readouterr().out, re.M)


def test_pure_python_takes_only_0_or_1():
    env = {**os.environ, _compiled.PURE_PYTHON_ENV: "yes"}
    done = subprocess.run([sys.executable, "-c", "import gnomon"], env=env, capture_output=True,
                          text=True, cwd=Path(gnomon.__file__).parents[1])
    assert done.returncode != 0
    assert "GNOMON_PURE_PYTHON must be 1" in done.stderr and "'yes'" in done.stderr
