"""course_utils: the measuring, estimating, plotting and quiz code shared by the Chapter 3 notebooks.

The spine:  Recipe -> build -> measure (fresh process) -> results store -> plots / tables.
Importing this package is cheap; torch and transformers load only when a function needs them.
"""

from __future__ import annotations

import logging as _logging
import os as _os
import sys as _sys
import urllib.parse as _urlparse
import warnings as _warnings

from course_utils.common import __version__
from course_utils.recipe import Recipe, RecipeError, ladder, source_chapter_recipe

# Library noise a learner cannot act on: transformers' pre-5 names, deprecated for v6, called from inside the
# libraries (peft before 0.22 called gradient_checkpointing_enable; with peft 0.22 a CPU run of the source recipe
# and of fused LoRA + reentrant warns no more, 2026-12-07), and bitsandbytes logs that an optional CPU kernel
# package is absent.
_warnings.filterwarnings("ignore", message=r".*deprecated and will be removed in v6.*", category=FutureWarning)
# Printed to stderr where it happens; as a warning it would also print the caller's file path.
_warnings.filterwarnings("ignore", category=UserWarning, message=r"Could not reach the Hugging Face hub.*")
_warnings.filterwarnings("ignore", message=r"'pin_memory' argument is set as true but no accelerator.*")
# build() records this one as a note on the measurement instead
_warnings.filterwarnings("ignore", message=r"Paged optimizers are not supported on CPU.*", category=UserWarning)
# trl 1.x deprecates use_liger_kernel in favour of Hub kernels, which need a download; offline,
# Liger is the maintained kernel library we can use (trl keeps only Liger's layer kernels)
_warnings.filterwarnings("ignore", message=r"`use_liger_kernel=True` is deprecated.*", category=FutureWarning)
_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)
# transformers >= 5.25 brings the `kernels` package, so bitsandbytes on a CPU with AVX512-BF16 looks for its
# CPU kernel on the hub; offline, `kernels` first logs that it skips the publisher check (then bitsandbytes
# falls back to its own CPU code, silenced above). Only that one line is dropped.
_logging.getLogger("kernels._internals.hf_hub").addFilter(
    lambda record: not str(record.msg).startswith("Skipping publisher trust check"))

__all__ = ["Recipe", "RecipeError", "ladder", "source_chapter_recipe", "measure", "ResultStore"]


def cli_main() -> int:
    """The `course` command's entry point: course_utils.cli.main, after the one check its imports need. A malformed
    HF_ENDPOINT (a port out of range) makes huggingface_hub fail while it is imported, before main() could say so."""
    endpoint = _os.environ.get("HF_ENDPOINT", "")
    try:
        _urlparse.urlparse(endpoint).port
    except ValueError as exc:
        print(f"course: error: HF_ENDPOINT={endpoint!r} is not a URL the hub client can use ({exc}); unset it, or set "
              "it to a URL such as https://huggingface.co.", file=_sys.stderr)
        return 2
    from course_utils.cli import main

    return main()


def __getattr__(name):  # lazy imports keep `import course_utils` fast
    if name == "measure":
        from course_utils.measure import measure

        return measure
    if name == "ResultStore":
        from course_utils.results import ResultStore

        return ResultStore
    raise AttributeError(name)
