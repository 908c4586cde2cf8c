"""The package's .cu files and their `#include "x.cu"` lines, expanded in Python.

Kernel sources are written as .cu files (device code, and the host emulations' C++ stand-ins
for the device primitives); a renderer prepends a kernel's constexpr parameters to its entry
file expanded here. Expanding in Python (rather than through NVRTC's include path) keeps the
compile cache keyed by the whole source, and lets a caller supply files in place of the
package's: the rendered wgmma wrappers, or an emulation's host primitives.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib import resources

_INCLUDE = re.compile(r'^#include "([\w.]+)"[^\n]*\n', re.M)


@cache
def cu_file(name: str) -> str:
    """The text of a .cu file of this package."""
    return resources.files(__package__).joinpath(name).read_text()


def expand(name: str, supplied: Mapping[str, str] | None = None) -> str:
    """`name`'s text with its `#include "x.cu"` lines replaced by x's text (expanded the same
    way, each file once: later includes of it vanish); `supplied` gives files by name that the
    package does not have or that replace the package's. System includes (<...>) stay."""
    supplied = supplied or {}
    done: set[str] = set()

    def text(file: str) -> str:
        if file in done:
            return ""
        done.add(file)
        body = supplied[file] if file in supplied else cu_file(file)
        return _INCLUDE.sub(lambda m: text(m[1]), body)

    return text(name)
