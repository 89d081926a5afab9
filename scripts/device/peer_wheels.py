"""The wheels of the Unsloth peer's own environment (scripts/gpu/peer_unsloth.py), for a GPU machine without
internet: downloaded from PyPI here, with Unsloth's unused folders stripped out.

    python scripts/device/peer_wheels.py                 # writes .whl-unsloth/ (git-ignored)
    python scripts/device/peer_wheels.py --check-only    # the sizes of what is there
    python scripts/device/peer_wheels.py --check-site /tmp/unsl-site   # what `import unsloth` would miss there

Unsloth 2026.10.9 pins transformers <= 5.17, trl <= 1.15 and datasets < 5, which the course's own pins
(pyproject.toml: transformers >= 5.24) exclude, so the peer cannot be an extra of this package: it gets
its own site directory, installed on the GPU machine with

    pip install --no-index --no-deps --target /tmp/unsl-site .whl-unsloth/*.whl \
        .whl/bitsandbytes-*.whl .whl/dill-*.whl .whl/multiprocess-*.whl

(torch, triton, accelerate, tokenizers, sentencepiece, protobuf and the rest come from the machine's image, as
scripts/gpu/logs/repeats-20261207/job.sh installs it).
Not carried: xformers (Unsloth falls back to PyTorch's SDPA when it is missing), cut_cross_entropy
(unsloth_zoo turns it off on torch >= 2.8), torchao (QAT and fp8 only), hf_transfer (downloads only),
tyro and Unsloth's Studio/CLI dependencies (never imported by `import unsloth`).
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The peer environment's versions: Unsloth, the unsloth_zoo it is released with, and the newest
# transformers, trl and datasets its pins allow; peft the 0.21.2 every shipped peer run used (the course moved to
# peft 0.22, whose activation_checkpointing_kwargs it passes, on 2026-12-07; Unsloth was never run with it).
PEER_PINS = ("unsloth==2026.10.9", "unsloth_zoo==2026.10.9", "transformers==5.17.0", "trl==1.15.0", "peft==0.21.2",
             "datasets==4.8.5")
# what `import unsloth` and a QLoRA run never touch: the Studio web app and the command-line tool
STRIP = ("studio/", "unsloth_cli/")
# wheels the course's own .whl/ already carries, installed into the peer's site directory too
SHARED = ("bitsandbytes", "dill", "multiprocess")
CARRY_LIMIT = 64 * 2**20  # what one device call carries: the working tree plus the carried folders
# What the GPU machine's image has (/work/.library/device/KINDS.md, "Python packages already there"), by import
# name, among what Unsloth's modules import: anything else must be in the peer's site directory.
IMAGE_MODULES = {"torch", "triton", "numpy", "packaging", "psutil", "tqdm", "accelerate", "huggingface_hub",
                 "safetensors", "regex", "requests", "filelock", "PIL", "yaml", "jinja2", "einops", "sentencepiece",
                 "google", "pyarrow", "pandas", "xxhash", "fsspec", "httpx", "typing_extensions", "typer", "rich",
                 "tokenizers",
                 "click", "torchvision", "scipy", "sympy", "networkx", "aiohttp", "certifi", "urllib3", "idna"}
OWN = ("unsloth", "unsloth_zoo", "unsloth_zoo_downloads")
APPLE_ONLY = ("unsloth_zoo.mlx",)  # imported under `if _IS_MLX:` (macOS on Apple silicon), never on the GPU machine


def download(dest: Path) -> None:
    """pip download --no-deps of PEER_PINS for the GPU machine's Python 3.12 on x86-64 Linux."""
    dest.mkdir(exist_ok=True)
    platforms = [arg for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                 for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(dest),
                    *PEER_PINS], check=True)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def strip_wheel(wheel: Path, prefixes=STRIP) -> int:
    """Rewrite `wheel` without the files under `prefixes`, its RECORD listing exactly what is left.
    Returns the bytes saved (0 when there was nothing to strip)."""
    with zipfile.ZipFile(wheel) as src:
        names = src.namelist()
        keep = [n for n in names if not n.startswith(prefixes)]
        if len(keep) == len(names):
            return 0
        record = next(n for n in keep if n.endswith(".dist-info/RECORD"))
        tmp = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
            lines = []
            for name in keep:
                if name == record:
                    continue
                data = src.read(name)
                out.writestr(src.getinfo(name), data, compress_type=zipfile.ZIP_DEFLATED)
                lines.append(_record_line(name, data))
            out.writestr(record, "\n".join(lines + [f"{record},,"]) + "\n")
    before = wheel.stat().st_size
    tmp.replace(wheel)
    return before - wheel.stat().st_size


def module_imports(site: Path, module: str) -> list[tuple[str, bool]]:
    """(imported module, unguarded?) for the imports `module` runs when it is imported: those at module level,
    not inside a function; unguarded = outside any try or if (an ImportError there stops the import)."""
    path = site.joinpath(*module.split("."))
    file = path / "__init__.py" if (path / "__init__.py").is_file() else path.with_suffix(".py")
    if not file.is_file():
        return []
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, bool]] = []

    def visit(node, guarded: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            inner = guarded or isinstance(child, (ast.Try, ast.If))
            if isinstance(child, ast.Import):
                out.extend((a.name, not inner) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([child.module] if child.module else []))
                out.append((base, not inner))
                out.extend((f"{base}.{a.name}", False) for a in child.names)  # a submodule, or just a name
            visit(child, inner)

    visit(ast.parse(file.read_text(encoding="utf-8", errors="replace")), False)
    return out


def missing_imports(site: Path, root: str = "unsloth") -> dict[str, str]:
    """{third-party module: the module of Unsloth's that imports it unguarded} for what `import unsloth` reaches
    that is neither in `site` nor in the GPU image (IMAGE_MODULES) nor in the standard library."""
    present = {p.name.split("-")[0].split(".")[0] for p in site.iterdir()} | IMAGE_MODULES | set(sys.stdlib_module_names)
    seen, todo, missing = set(), [root], {}
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)]  # its packages
        for name, unguarded in module_imports(site, module):
            top = name.split(".")[0]
            if top in OWN and not name.startswith(APPLE_ONLY):
                todo.append(name)
            elif unguarded and top not in present:
                missing.setdefault(top, module)
    return missing


def sizes(dest: Path) -> tuple[int, int]:
    """(bytes of dest's wheels, bytes of the course's .whl/ wheels)."""
    ours = ROOT / ".whl"
    return (sum(p.stat().st_size for p in dest.glob("*.whl")),
            sum(p.stat().st_size for p in ours.glob("*.whl")) if ours.is_dir() else 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", default=str(ROOT / ".whl-unsloth"))
    parser.add_argument("--check-only", action="store_true", help="download nothing; report what is there")
    parser.add_argument("--check-site", default=None, metavar="DIR",
                        help="a site directory installed from the wheels: list what `import unsloth` would miss")
    args = parser.parse_args(argv)
    if args.check_site:
        missing = missing_imports(Path(args.check_site))
        for top, where in sorted(missing.items()):
            print(f"missing: {top} (imported by {where})")
        print(f"{len(missing)} module(s) that `import unsloth` reaches are in neither {args.check_site} nor the image")
        return 1 if missing else 0
    dest = Path(args.dest)
    if not args.check_only:
        download(dest)
        for wheel in dest.glob("unsloth-*.whl"):
            print(f"{wheel.name}: stripped {strip_wheel(wheel) / 2**20:.1f} MiB ({', '.join(STRIP)})")
    missing = [name for name in SHARED if not list((ROOT / ".whl").glob(f"{name}-*.whl"))]
    if missing:
        print(f"the peer also installs {missing} from .whl/, which lacks them: add them there", file=sys.stderr)
        return 1
    peer, ours = sizes(dest)
    print(f"{dest.name}: {peer / 2**20:.1f} MiB; .whl: {ours / 2**20:.1f} MiB; together {(peer + ours) / 2**20:.1f} MiB "
          f"of the {CARRY_LIMIT / 2**20:.0f} MiB a device call carries (with the working tree)")
    return 0 if peer + ours < CARRY_LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
