"""Builds the kvslim Python package with the project's CMake (pyproject.toml has the metadata).

    pip install --no-build-isolation .      # from the repository root, in a venv or for the user

build_ext configures the project with -DKVSLIM_BUILD_TESTS=OFF for the Python that runs pip in
build-python3.X/ of the source tree, builds only the module target (_kvslim) and puts it into the package; build_py adds the bundled model
(models/stories260K.gguf) as package data. Environment:
    KVSLIM_CMAKE_BUILD_DIR  an existing, configured build directory to build the module in instead
                            of a fresh one (e.g. build/: nothing is recompiled when it is up to date);
                            it must have been configured for the same Python version
    KVSLIM_CMAKE_ARGS       more arguments for the CMake configure (space-separated)
    CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: the CPU count)
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(ROOT, "models", "stories260K.gguf")


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(kvslim VERSION ([0-9.]+)", f.read())
    if not m:
        raise RuntimeError("CMakeLists.txt: no `project(kvslim VERSION x.y.z ...)` line")
    return m.group(1)


class CMakeExtension(Extension):
    def __init__(self, name, target):
        super().__init__(name, sources=[])
        self.target = target


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("KVSLIM_CMAKE_BUILD_DIR")
        if build_dir:
            build_dir = os.path.abspath(build_dir)
            if not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")):
                raise RuntimeError(f"KVSLIM_CMAKE_BUILD_DIR={build_dir} is not a configured CMake build directory")
        else:
            # Beside the usual build/, at the same depth, and kept: the next pip install rebuilds only
            # what changed, and a compiler cache shared with build/ finds the same relative paths.
            build_dir = os.path.join(ROOT, f"build-python{sys.version_info.major}.{sys.version_info.minor}")
            args = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DKVSLIM_BUILD_TESTS=OFF",
                    f"-DPython3_EXECUTABLE={sys.executable}"]
            args += shlex.split(os.environ.get("KVSLIM_CMAKE_ARGS", ""))
            subprocess.run(args, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.run(["cmake", "--build", build_dir, "--target", ext.target, "kvslim_press_stub", "-j", jobs],
                       check=True)
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(build_dir, "python", "kvslim", "_kvslim" + suffix)
        if not os.path.isfile(built):
            raise RuntimeError(f"{built} was not built: the build directory {build_dir} is configured for another "
                               f"Python than {sys.executable} (extension suffix {suffix}) or without pybind11 "
                               "(Debian python3-pybind11, python3-dev)")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built, dest)
        # The press classes' type stub, written by the build from the generated classes.
        shutil.copyfile(os.path.join(os.path.dirname(built), "presses.pyi"),
                        os.path.join(os.path.dirname(dest), "presses.pyi"))


class BuildPyWithModel(build_py):
    def run(self):
        super().run()
        if not os.path.isfile(MODEL):
            raise RuntimeError(f"{MODEL} is missing: the package ships it as the pipeline's default model")
        dest = os.path.join(self.build_lib, "kvslim", "models")
        os.makedirs(dest, exist_ok=True)
        shutil.copyfile(MODEL, os.path.join(dest, os.path.basename(MODEL)))


setup(version=project_version(),
      ext_modules=[CMakeExtension("kvslim._kvslim", target="_kvslim")],
      cmdclass={"build_ext": CMakeBuild, "build_py": BuildPyWithModel})
