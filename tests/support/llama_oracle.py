"""llama.cpp as the tests load it: at its best (repacked weights on), unless the installed
llama-cpp-python was built with AMX, whose path crashes on some CPUs: then without the repack
buffers, with a warning to build the fair baseline (benchmarks/llama_cpp_build.py)."""

from __future__ import annotations

import warnings
from typing import Any


def built_with_amx(lc: Any) -> bool:
    """Whether this llama.cpp build has AMX compiled in (its system info names it)."""
    return "AMX" in lc.llama_print_system_info().decode(errors="replace")


def model_params(lc: Any) -> Any:
    """llama_model_default_params(), with the repack buffers off for an AMX build."""
    mp = lc.llama_model_default_params()
    if built_with_amx(lc):
        warnings.warn("llama-cpp-python was built with AMX: loading without its repacked weights; "
                      "install the oracle with `python benchmarks/llama_cpp_build.py --install`", stacklevel=2)
        mp.use_extra_bufts = False
    return mp
