"""Build the compiled twins of chaingate's hot-path modules.

Every ``native/<name>.pyx`` becomes ``chaingate._native.<name>``; its pure-Python twin lives in
``src/chaingate/_pure/<name>.py``.  ``chaingate.twins`` picks one or the other at run time.
The default config files (``config/*.toml``) are copied into the package so a non-editable
install still finds its method table.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent
NATIVE_MODULES = sorted(p.stem for p in (HERE / "native").glob("*.pyx"))


class BuildPyWithDefaults(build_py):
    """Ship config/*.toml as package data under chaingate/_defaults."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "chaingate" / "_defaults"
        target.mkdir(parents=True, exist_ok=True)
        for toml in (HERE / "config").glob("*.toml"):
            shutil.copy2(toml, target / toml.name)


extensions = [
    Extension(
        f"chaingate._native.{name}",
        [f"native/{name}.pyx"],
        extra_compile_args=["-O2"],
    )
    for name in NATIVE_MODULES
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        # native/chaingate/_native/*.pxd: the cdef classes one module cimports from another.
        include_path=[str(HERE / "native")],
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
        annotate=bool(os.environ.get("CHAINGATE_CYTHON_ANNOTATE")),
    ),
    cmdclass={"build_py": BuildPyWithDefaults},
    package_data={"chaingate": ["py.typed"]},
)
