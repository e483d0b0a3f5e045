#!/usr/bin/env python3
"""kvslim installed as a user gets it: `cmake --install` of the build into a temporary prefix, then
  - the installed files: binary, libkvslim.so with its SONAME, libkvslim.a, every public header,
    the CMake package, kvslim.pc, the man page, the bundled model;
  - a C++ program (consumer.cpp) built against the prefix with find_package(kvslim), linked to the
    shared library and to the static one, and with pkg-config, each run on the bundled model;
  - the Python package installed by pip (pyproject.toml + setup.py, no build isolation, nothing
    downloaded) into a venv of the module's Python, imported and run from outside the repository;
  - the Debian package made by cpack: its name, dependencies (dpkg-shlibdeps) and contents;
  - configure's choice of Python: one with pytest, or an error when KVSLIM_PYTHON_TESTS=ON.
The build's objects are reused (the install copies them; pip's build_ext builds the module target
of the same build directory, up to date), so the test takes seconds, not a build.

Run by ctest (install_package, label `install`):
    test_install.py --build BUILD --source SRC --version V --libdir LIBDIR [--python PY] [--man]
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

A = None  # parsed arguments
TMP = None
PREFIX = None
EXPECTED_LINE = "kept "  # every consumer line starts so; they must all be equal


def run(cmd, **kw):
    """Runs cmd; on failure the command, its output and its exit status make the test's message."""
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def setUpModule():
    global TMP, PREFIX
    TMP = tempfile.mkdtemp(prefix="kvslim-install-")
    PREFIX = os.path.join(TMP, "prefix")
    run(["cmake", "--install", A.build, "--prefix", PREFIX])


def tearDownModule():
    shutil.rmtree(TMP, ignore_errors=True)


def libdir(*parts):
    return os.path.join(PREFIX, A.libdir, *parts)


def bundled_model():
    return os.path.join(PREFIX, "share", "kvslim", "models", "stories260K.gguf")


class InstalledFiles(unittest.TestCase):
    def test_binary_runs_and_names_the_version(self):
        out = run([os.path.join(PREFIX, "bin", "kvslim"), "--version"])
        # The first line is the version; the next names the BLAS it loads.
        self.assertEqual(out.strip().splitlines()[0], f"kvslim {A.version}")

    def test_shared_library_has_a_versioned_soname(self):
        major, minor = A.version.split(".")[:2]
        soversion = f"{major}.{minor}" if major == "0" else major
        real = libdir(f"libkvslim.so.{A.version}")
        self.assertTrue(os.path.isfile(real), real)
        self.assertEqual(os.readlink(libdir("libkvslim.so")), f"libkvslim.so.{soversion}")
        self.assertEqual(os.readlink(libdir(f"libkvslim.so.{soversion}")), f"libkvslim.so.{A.version}")
        dyn = run(["readelf", "-d", real])
        self.assertIn(f"Library soname: [libkvslim.so.{soversion}]", dyn)
        self.assertTrue(os.path.isfile(libdir("libkvslim.a")))

    def test_every_public_header_is_installed(self):
        src = sorted(os.path.basename(p) for p in glob.glob(os.path.join(A.source, "include", "kvslim", "*.h")))
        inst = sorted(os.path.basename(p) for p in glob.glob(os.path.join(PREFIX, "include", "kvslim", "*.h")))
        self.assertTrue(src)
        self.assertEqual(inst, src)

    def test_package_files(self):
        for f in [libdir("cmake", "kvslim", "kvslimConfig.cmake"), libdir("cmake", "kvslim", "kvslimConfigVersion.cmake"),
                  libdir("pkgconfig", "kvslim.pc"), bundled_model()]:
            self.assertTrue(os.path.isfile(f), f)

    def test_man_page(self):
        if not A.man:
            self.skipTest("built without help2man")
        page = os.path.join(PREFIX, "share", "man", "man1", "kvslim.1.gz")
        text = run(["sh", "-c", f"gzip -dc '{page}'"])
        self.assertIn(".TH KVSLIM", text.upper())
        self.assertIn(A.version, text)
        self.assertIn("generate", text)  # the subcommands of `kvslim --help`


class CppConsumer(unittest.TestCase):
    """consumer.cpp prints 'kept K of N entries: TEXT'; each way of linking must print the same."""

    @classmethod
    def setUpClass(cls):
        cls.src = os.path.join(TMP, "consumer")
        os.makedirs(cls.src)
        here = os.path.dirname(os.path.abspath(__file__))
        for f in ["CMakeLists.txt", "consumer.cpp"]:
            shutil.copy(os.path.join(here, f), cls.src)
        # Every installed header in one translation unit: each must compile from the install alone.
        with open(os.path.join(cls.src, "all_headers.cpp"), "w") as f:
            for h in sorted(glob.glob(os.path.join(PREFIX, "include", "kvslim", "*.h"))):
                f.write(f"#include <kvslim/{os.path.basename(h)}>\n")
        cls.lines = {}

    def check_line(self, how, line):
        self.assertTrue(line.startswith(EXPECTED_LINE), f"{how}: {line!r}")
        kept, total = int(line.split()[1]), int(line.split()[3])
        # snapkv at ratio 0.5 keeps about half of the context's entries (the question is not compressed).
        self.assertGreater(kept, 0.4 * total, line)
        self.assertLess(kept, 0.7 * total, line)
        self.lines[how] = line
        self.assertEqual(len(set(self.lines.values())), 1, self.lines)

    def test_find_package_shared_and_static(self):
        bld = os.path.join(TMP, "consumer-build")
        run(["cmake", "-S", self.src, "-B", bld, f"-DCMAKE_PREFIX_PATH={PREFIX}",
             f"-DKVSLIM_EXPECTED_VERSION={A.version}", "-DCMAKE_BUILD_TYPE=Release"])
        run(["cmake", "--build", bld, "-j2"])
        shared = os.path.join(bld, "consumer_shared")
        needed = run(["readelf", "-d", shared])
        self.assertIn("libkvslim.so.", needed)
        self.check_line("find_package shared", run([shared, bundled_model(), A.version]).strip())
        static = os.path.join(bld, "consumer_static")
        self.assertNotIn("libkvslim.so", run(["readelf", "-d", static]))
        self.check_line("find_package static", run([static, bundled_model(), A.version]).strip())

    def test_pkg_config(self):
        env = dict(os.environ, PKG_CONFIG_PATH=libdir("pkgconfig"))
        cflags = run(["pkg-config", "--cflags", "kvslim"], env=env).split()
        self.assertIn(os.path.join(PREFIX, "include"), [os.path.normpath(f[2:]) for f in cflags if f.startswith("-I")])
        run(["pkg-config", "--static", "--libs", "kvslim"], env=env)  # every private module resolves
        exe = os.path.join(TMP, "consumer_pc")
        # Through the shell, as a user writes it: the .pc quotes the version string for a shell.
        run(["sh", "-c", f"c++ -std=c++20 -O1 '{os.path.join(self.src, 'consumer.cpp')}' -o '{exe}' "
                         "$(pkg-config --cflags --libs kvslim)"], env=env)
        self.assertIn("libkvslim.so.", run(["readelf", "-d", exe]))
        line = run([exe, bundled_model(), A.version], env=dict(os.environ, LD_LIBRARY_PATH=libdir())).strip()
        self.check_line("pkg-config", line)


class PythonPackage(unittest.TestCase):
    def setUp(self):
        if not A.python:
            self.skipTest("the build has no Python module")

    def test_pip_install_into_a_venv_and_run_from_elsewhere(self):
        venv = os.path.join(TMP, "venv")
        run([A.python, "-m", "venv", "--system-site-packages", venv])
        # The files pip's build reads, copied so that the build leaves nothing in the checkout.
        src = os.path.join(TMP, "pysrc")
        for f in ["pyproject.toml", "setup.py", "CMakeLists.txt", "docs/python.md", "models/stories260K.gguf"]:
            os.makedirs(os.path.dirname(os.path.join(src, f)), exist_ok=True)
            shutil.copy(os.path.join(A.source, f), os.path.join(src, f))
        shutil.copytree(os.path.join(A.source, "python", "kvslim"), os.path.join(src, "python", "kvslim"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        py = os.path.join(venv, "bin", "python")
        run([py, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-index", "--no-deps", src],
            env=dict(os.environ, KVSLIM_CMAKE_BUILD_DIR=A.build, PIP_NO_CACHE_DIR="1"))
        script = """
import os, kvslim
site = os.path.realpath(os.path.dirname(kvslim.__file__))
assert site.startswith(os.path.realpath(os.environ["VENV"])), site
assert os.path.realpath(kvslim.bundled_model()).startswith(site), kvslim.bundled_model()
assert os.path.isfile(os.path.join(site, "presses.pyi")) and os.path.isfile(os.path.join(site, "py.typed")), site
assert kvslim.__version__ == os.environ["VERSION"], kvslim.__version__
out = kvslim.pipeline(threads=1)("Once upon a time, there was a little girl.", question=" Then", max_new_tokens=4)
assert out["answer"] and out["stats"]["context_tokens"] > 5, out
try:
    kvslim.pipeline(model="meta-llama/Llama-3.2-1B")
    raise SystemExit("a model id was accepted")
except FileNotFoundError as e:
    assert "GGUF" in str(e) and "meta-llama/Llama-3.2-1B" in str(e), e
print("ok")
"""
        env = dict(os.environ, VENV=venv, VERSION=A.version)
        env.pop("PYTHONPATH", None)
        out = run([py, "-c", script], cwd=TMP, env=env)  # not the repository: no models/ here
        self.assertEqual(out.strip(), "ok")


class ConfigurePicksAPythonWithPytest(unittest.TestCase):
    """A python3 first on PATH that cannot import pytest (pyenv, a virtualenv) must not make the Python
    tests vanish: configure takes /usr/bin/python3 instead, or with KVSLIM_PYTHON_TESTS=ON fails."""

    @classmethod
    def setUpClass(cls):
        if not os.access("/usr/bin/python3", os.X_OK):
            raise unittest.SkipTest("no /usr/bin/python3")
        r = subprocess.run(["/usr/bin/python3", "-c", "import pytest, pybind11"], capture_output=True)
        if r.returncode != 0:
            raise unittest.SkipTest("/usr/bin/python3 lacks pytest or pybind11")
        # python3 without site-packages: the interpreter and its headers, but no pytest.
        cls.bin = os.path.join(TMP, "fakebin")
        os.makedirs(cls.bin)
        cls.fake = os.path.join(cls.bin, "python3")
        with open(cls.fake, "w") as f:
            f.write('#!/bin/sh\nexec /usr/bin/python3 -S "$@"\n')
        os.chmod(cls.fake, 0o755)
        cls.env = dict(os.environ, PATH=cls.bin + os.pathsep + os.environ["PATH"])

    def configure(self, name, *args):
        return subprocess.run(["cmake", "-S", A.source, "-B", os.path.join(TMP, name), "-DCMAKE_BUILD_TYPE=Release",
                               "-DKVSLIM_PYTHON_TESTS=ON", *args], env=self.env, capture_output=True, text=True)

    def test_python3_on_path_without_pytest_is_passed_over(self):
        r = self.configure("cfg-path")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        with open(os.path.join(TMP, "cfg-path", "CMakeCache.txt")) as f:
            cache = f.read()
        chosen = [l for l in cache.splitlines() if l.startswith(("Python3_EXECUTABLE:", "_Python3_EXECUTABLE:"))]
        self.assertIn("Python3_EXECUTABLE:FILEPATH=/usr/bin/python3", chosen)
        listed = run(["ctest", "--test-dir", os.path.join(TMP, "cfg-path"), "-N", "-R", "^python_pytest$"])
        self.assertIn("Total Tests: 1", listed)

    def test_a_python_without_pytest_is_an_error_when_the_tests_are_required(self):
        r = self.configure("cfg-fake", f"-DPython3_EXECUTABLE={self.fake}")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("KVSLIM_PYTHON_TESTS=ON but", r.stderr)
        self.assertIn(f"Python3_EXECUTABLE={self.fake} cannot import", " ".join(r.stderr.split()))


class DebianPackage(unittest.TestCase):
    def test_cpack_deb(self):
        if not shutil.which("dpkg-shlibdeps"):
            self.skipTest("dpkg-shlibdeps not installed (Debian dpkg-dev)")
        out = os.path.join(TMP, "deb")
        run(["cpack", "-G", "DEB", "--config", os.path.join(A.build, "CPackConfig.cmake"), "-B", out])
        debs = glob.glob(os.path.join(out, f"kvslim_{A.version}_*.deb"))
        self.assertEqual(len(debs), 1, os.listdir(out))
        depends = run(["dpkg-deb", "--field", debs[0], "Depends"])
        for lib in ["libopenblas0-pthread", "libpcre2-8", "libfmt", "libhiredis", "libc6"]:
            self.assertIn(lib, depends)
        files = run(["dpkg-deb", "--contents", debs[0]])
        for f in ["./usr/bin/kvslim", "./usr/include/kvslim/model.h", "/pkgconfig/kvslim.pc",
                  "/cmake/kvslim/kvslimConfig.cmake", "./usr/share/kvslim/models/stories260K.gguf"]:
            self.assertIn(f, files)
        if A.man:
            self.assertIn("./usr/share/man/man1/kvslim.1.gz", files)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--libdir", required=True)
    ap.add_argument("--python", default="")
    ap.add_argument("--man", action="store_true")
    A, rest = ap.parse_known_args()
    A.build, A.source = os.path.abspath(A.build), os.path.abspath(A.source)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
