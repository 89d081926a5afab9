"""Models: the embedded tiny default (offline), config-only presets of real architectures, hub ids.

Every model, tiny or 8B, is loaded by the same `AutoModelForCausalLM.from_pretrained` call in
`build.py`, quantization included. The tiny model and the presets are first written to a local
folder with `save_pretrained`, so "loading" means the same thing as for a hub model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from course_utils.common import SHIPPED_DATA, course_home  # noqa: F401  (models.course_home, models.SHIPPED_DATA)
from course_utils.common import corpus_text
from course_utils.common import LockTimeout, file_lock as _file_lock, lock_path as _lock_path
from course_utils.hub import (HUB_TIMEOUT_ENV, LAST_HUB_ANSWER, _in_hub_cache, _offline_mode, _quiet_hub, hub_address,
                              hub_reachable, hub_timeout)

TINY = "tiny"

# The tiny default: a Llama-architecture model small enough to train on 2 CPU cores in seconds,
# big enough that every technique's effect shows in the measured memory categories.
TINY_CONFIG = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,  # grouped-query attention, as in Llama 3
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    initializer_range=0.02,
)
TINY_VOCAB = 4096  # BPE merges trained on the shipped data (the model's vocab is rounded up to 64)
TINY_SEED = 0

# Published shapes of real architectures (from each model's config.json). Built with random weights
# on a GPU, with no download: memory and speed do not depend on the weight values.
_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
PRESETS: dict[str, dict] = {
    "llama-3.1-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         max_position_embeddings=131072, rms_norm_eps=1e-5, rope_parameters=_LLAMA3_ROPE,
                         tie_word_embeddings=False, hub_id="meta-llama/Llama-3.1-8B"),
    "llama-3.1-70b": dict(model_type="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                          num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
                          max_position_embeddings=131072, rms_norm_eps=1e-5, rope_parameters=_LLAMA3_ROPE,
                          tie_word_embeddings=False, hub_id="meta-llama/Llama-3.1-70B"),
    "llama-2-7b": dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                       max_position_embeddings=4096, rms_norm_eps=1e-5,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       tie_word_embeddings=False, hub_id="meta-llama/Llama-2-7b-hf"),
    "llama-2-13b": dict(model_type="llama", hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                        num_attention_heads=40, num_key_value_heads=40, vocab_size=32000,
                        max_position_embeddings=4096, rms_norm_eps=1e-5,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                        tie_word_embeddings=False, hub_id="meta-llama/Llama-2-13b-hf"),
    "mistral-7b": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=32768,
                       max_position_embeddings=32768, rms_norm_eps=1e-5,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                       sliding_window=None, tie_word_embeddings=False, hub_id="mistralai/Mistral-7B-v0.3"),
    # the small ungated model the GPU notebooks pick (notebook.SMALL_HUB_MODEL): its shape, with random
    # weights, stands in for the download where the hub cannot be reached
    "smollm2-360m": dict(model_type="llama", hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
                         num_attention_heads=15, num_key_value_heads=5, vocab_size=49152,
                         max_position_embeddings=8192, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                         tie_word_embeddings=True, hub_id="HuggingFaceTB/SmolLM2-360M"),
    "llama-3.2-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         max_position_embeddings=131072, rms_norm_eps=1e-5,
                         rope_parameters={**_LLAMA3_ROPE, "factor": 32.0},
                         tie_word_embeddings=True, hub_id="meta-llama/Llama-3.2-1B"),
}


class ModelUnavailableError(RuntimeError):
    """A model id cannot be loaded here; the message says how to use the embedded default instead."""


def preset_config(name: str):
    """A transformers config for a preset architecture (no weights, no download)."""
    from transformers import AutoConfig

    spec = dict(PRESETS[name.lower()])
    spec.pop("hub_id")
    model_type = spec.pop("model_type")
    rope = spec.pop("rope_parameters", None)
    config = AutoConfig.for_model(model_type, **spec)
    if rope is not None:
        config.rope_parameters = rope
    config.dtype = "bfloat16"
    return config


@contextlib.contextmanager
def no_progress_bars():
    """transformers' progress bars off inside the block, back to what they were after it."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def tiny_fingerprint() -> str:
    """Changes whenever the tiny model's recipe or the shipped data change, so the cache rebuilds."""
    h = hashlib.sha256(json.dumps([TINY_CONFIG, TINY_VOCAB, TINY_SEED, 2], sort_keys=True).encode())
    h.update(SHIPPED_DATA.read_bytes())
    return h.hexdigest()[:10]


def build_tokenizer(texts: list[str], vocab_size: int = TINY_VOCAB):
    """Train a byte-level BPE tokenizer on `texts`, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|bos|>", "<|eos|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", tok.token_to_id("<|bos|>"))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                   pad_token="<|pad|>", model_max_length=TINY_CONFIG["max_position_embeddings"])


def damage(folder: Path) -> str | None:
    """Why a built model folder cannot be loaded (a missing config, a JSON file (config, tokenizer) that does not
    parse, a weights file cut short or not safetensors), or None when it is whole. Reads each weights file's header
    and size only."""
    if not (folder / "config.json").is_file():
        return "config.json is missing"
    for part in sorted(folder.glob("*.json")):
        try:
            json.loads(part.read_bytes())
        except (OSError, ValueError) as exc:
            return f"{part.name} cannot be read ({type(exc).__name__}: {str(exc)[:80]})"
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        return "no weights file (*.safetensors)"
    for shard in shards:
        try:
            size = shard.stat().st_size
            with open(shard, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                if not 2 <= n <= min(size, 100 * 2**20):
                    return f"{shard.name} is not a whole safetensors file ({size:,} bytes)"
                header = json.loads(fh.read(n))
        except (OSError, ValueError) as exc:
            return f"{shard.name} cannot be read ({type(exc).__name__}: {exc})"
        ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)]
        want = 8 + n + max(ends, default=0)
        if size != want:
            return f"{shard.name} has {size:,} bytes where its header needs {want:,} (cut short: a full disk or a " \
                   "copy that stopped)"
    return None


def _rebuilding(target: Path, rebuild: bool) -> bool:
    """True when `target` must be (re)built: asked, missing, or damaged (then said in one line on stderr)."""
    if rebuild or not target.exists():
        return True
    why = damage(target)
    if why:
        import sys

        print(f"course: the built model {target} is damaged ({why}); rebuilding it.", file=sys.stderr)
    return why is not None


def _home_error(exc: OSError, target: Path) -> ModelUnavailableError:
    """One line for a model folder that cannot be written where COURSE_HOME points, or whose build another process
    held past the deadline (then the lock's words: who holds it, since when, what to do)."""
    if isinstance(exc, LockTimeout):
        return ModelUnavailableError(f"cannot build the model {target.name}: {exc}.")
    return ModelUnavailableError(
        f"cannot build the model in {target.parent} ({exc.filename or target}: {exc.strerror or exc}). "
        f"Set COURSE_HOME to a folder you can write (now {course_home()}).")


def tiny_model_path(rebuild: bool = False) -> Path:
    """Build the embedded tiny model once (tokenizer + random Llama weights), return its folder. A damaged
    build (weights cut short) is found and built again."""
    target = course_home() / "models" / f"tiny-llama-{tiny_fingerprint()}"
    if not _rebuilding(target, rebuild):
        return target
    try:
        return _build_tiny(target, rebuild)
    except OSError as exc:  # COURSE_HOME a file, a read-only folder, a full disk
        raise _home_error(exc, target) from None


def _build_tiny(target: Path, rebuild: bool) -> Path:
    """tiny_model_path's build, under the folder's lock."""
    with _file_lock(_lock_path(target)):
        if target.exists() and not rebuild and damage(target) is None:
            return target
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        tokenizer = build_tokenizer(corpus_text())
        vocab = -(-len(tokenizer) // 64) * 64
        config = LlamaConfig(vocab_size=vocab, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id, **TINY_CONFIG)
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
        with _building(target) as tmp:
            with no_progress_bars():  # one small shard: a bar would only clutter the output
                model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    return target


@contextlib.contextmanager
def _building(target: Path):
    """A temporary folder beside `target` that becomes `target` when the block ends, and is removed when
    it fails or is interrupted (Ctrl-C). Called with target's lock held, so leftovers of a build that was
    killed (kill -9 cannot clean up) are removed first: nobody else can be writing them."""
    prefix = f".{target.name}-"
    for stale in target.parent.glob(f"{prefix}*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)


def shipped_token_count() -> int:
    """Tokens in the shipped training data as the tiny tokenizer (shared by every preset) packs it: each
    record's tokens plus its end-of-sequence token. Counted once, then read from the tiny model's folder."""
    folder = tiny_model_path()
    cache = folder / "shipped_tokens.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        return int(json.loads(cache.read_text())["tokens"])
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(folder)(corpus_text())["input_ids"]
    tokens = sum(len(i) + 1 for i in ids)
    with contextlib.suppress(OSError):
        cache.write_text(json.dumps({"tokens": tokens}))
    return tokens


def preset_path(name: str, rebuild: bool = False) -> Path:
    """Write a preset architecture with random bf16 weights to disk once, shard by shard.

    The weights are drawn tensor by tensor and written in 2 GB shards, so an 8B checkpoint never
    needs 16 GB of memory at once: it builds on a free Colab (12 GB RAM, 15 GB T4) as well.
    """
    import torch

    name = name.lower()
    target = course_home() / "models" / f"random-{name}"
    if not _rebuilding(target, rebuild):
        return target
    try:
        return _build_preset(name, target, rebuild)
    except OSError as exc:  # COURSE_HOME a file, a read-only folder, a full disk
        raise _home_error(exc, target) from None


def _build_preset(name: str, target: Path, rebuild: bool) -> Path:
    """preset_path's build, under the folder's lock."""
    with _file_lock(_lock_path(target)):
        if target.exists() and not rebuild and damage(target) is None:
            return target
        from transformers import AutoTokenizer

        config = preset_config(name)
        tokenizer = tiny_model_path()  # before the build folder: ids fit any vocabulary
        with _building(target) as tmp:
            _write_random_shards(config, tmp)
            config.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(tokenizer).save_pretrained(tmp)
            (tmp / "RANDOM_WEIGHTS.txt").write_text(
                f"Random weights with the published shape of {PRESETS[name]['hub_id']}; built locally, no download.\n"
            )
    return target


def _write_random_shards(config, folder: Path, shard_bytes: int = 2 * 1024**3) -> None:
    """Random bf16 tensors for every weight of `config`'s model, saved as safetensors shards + index."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        shapes = AutoModelForCausalLM.from_config(config).state_dict()
    if getattr(config, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(0)
    std = getattr(config, "initializer_range", 0.02)
    weight_map: dict[str, str] = {}
    shard: dict = {}

    def flush() -> None:
        file = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file(shard, folder / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
        shard.clear()

    for key, meta in shapes.items():
        if "norm" in key:
            tensor = torch.ones(meta.shape, dtype=torch.bfloat16)
        else:
            tensor = (torch.randn(meta.shape, generator=generator, device=device) * std).to(torch.bfloat16).cpu()
        if shard and sum(t.nbytes for t in shard.values()) + tensor.nbytes > shard_bytes:
            flush()
        shard[key] = tensor
    flush()
    del tensor, generator
    if device == "cuda":  # the kernel that built a preset keeps none of the card for the measurements after it
        torch.cuda.empty_cache()
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def is_preset(model: str) -> bool:
    """True for a name in PRESETS (case-insensitive)."""
    return model.lower() in PRESETS


def uses_shipped_data(model: str) -> bool:
    """The embedded default and the presets train on the shipped data with the tiny model's tokenizer (checks,
    the measuring child's environment and build.training_dataset ask this one rule)."""
    return model == TINY or is_preset(model)


def resolve_model(model: str) -> str:
    """Turn a recipe's model into something `from_pretrained` can load: a local folder or a hub id.

    Raises ModelUnavailableError at once (not after a 46 s hub time-out) when a hub id cannot be
    reached, and says how to use the embedded default instead.
    """
    if model == TINY:
        return str(tiny_model_path())
    if is_preset(model):
        return str(preset_path(model))
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser())
    if _in_hub_cache(model) or hub_reachable():
        return model
    raise ModelUnavailableError(
        f"Model {model!r} is not a local folder and the Hugging Face hub cannot be reached "
        "(offline, or HF_HUB_OFFLINE is set). Use model='tiny' for the embedded default (no download), "
        f"or a preset with random weights and a real shape ({', '.join(PRESETS)}), "
        "or download the model first and pass its local folder."
    )


def hub_error(model: str, exc: BaseException) -> ModelUnavailableError:
    """The one-line error for a hub id that failed to load: gated, unknown, or unreachable."""
    chain, seen = [], exc
    while seen is not None:
        chain.append(type(seen).__name__)
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    if "GatedRepoError" in chain or "gated" in text.lower():
        return ModelUnavailableError(
            f"{model!r} is a gated model: accept its licence on https://huggingface.co/{model} (same account), "
            "then log in with `hf auth login`, or set HF_TOKEN (on Colab: the key icon > Secrets > HF_TOKEN). "
            "Or use a preset with the same shape and random weights, e.g. model='llama-3.1-8b'.")
    if "RepositoryNotFoundError" in chain or "is not a local folder and not a valid model identifier" in text:
        return ModelUnavailableError(
            f"There is no model {model!r} on the Hugging Face hub (or it is private: log in with `hf auth login`), "
            f"and no local folder of that name. Check the spelling; presets: {', '.join(PRESETS)}; or 'tiny'.")
    return ModelUnavailableError(
        f"Cannot read the config of {model!r}: it is not a local folder holding a config.json, not in the local "
        f"hub cache, and the hub did not give it ({chain[0]}: {text.splitlines()[0] if text else ''}). "
        f"Use model='tiny' or a preset with a real shape ({', '.join(PRESETS)}), or download the model and "
        "pass its folder.")


def _with_deadline(what: str, fn, seconds: float):
    """fn() in a thread, waited on for `seconds`: a hub that accepts connections but never answers makes
    an error, not a hang (the thread is left to finish on its own; it holds nothing we need)."""
    import threading

    box: dict = {}

    def call() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=call, daemon=True, name=f"hub: {what}")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise ModelUnavailableError(
            f"The Hugging Face hub accepted the connection but did not answer within {seconds:.0f} s ({what}). "
            f"Try again later, raise {HUB_TIMEOUT_ENV}, or set HF_HUB_OFFLINE=1 and use model='tiny' or a preset.")
    if "error" in box:
        raise box["error"]
    return box["value"]


def load_config(model: str):
    """The transformers config of a recipe's model: tiny, a preset, a local folder or a hub id. A hub id is
    read through one reachability probe and a deadline, so a missing, gated or silent hub gives a one-line
    ModelUnavailableError within $COURSE_HUB_TIMEOUT seconds; presets and 'tiny' never open a connection."""
    if is_preset(model):
        return preset_config(model)
    from transformers import AutoConfig

    if model == TINY:
        return AutoConfig.from_pretrained(tiny_model_path())
    if Path(model).expanduser().is_dir():
        try:
            return AutoConfig.from_pretrained(Path(model).expanduser())
        except (OSError, ValueError) as exc:
            raise ModelUnavailableError(f"The folder {model!r} holds no readable model config.json "
                                        f"({type(exc).__name__}): pass a model's folder.") from None
    if not _in_hub_cache(model):
        if not hub_reachable():
            host, port = hub_address()
            why = ("HF_HUB_OFFLINE is set" if _offline_mode() else
                   LAST_HUB_ANSWER[0] or f"{host}:{port} did not accept a connection within 2 s")
            raise hub_error(model, ConnectionError(why))
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(int(hub_timeout())))
    try:
        with _quiet_hub():
            return _with_deadline(f"the config of {model!r}", lambda: AutoConfig.from_pretrained(model),
                                  hub_timeout())
    except ModelUnavailableError:
        raise
    except Exception as exc:
        raise hub_error(model, exc) from None
