"""Write the "In your own script" cells into notebooks 00-06, 08 and 09 (a markdown heading and one code cell,
right after each notebook's measurement), from build.library_objects of the recipe each cell names.

The cells are literal code: learners read and copy them. tests/test_own_script.py holds each equal to
library_objects, so the day build changes this script is run again (or the cell edited by hand):

    python scripts/notebooks/insert_own_script.py            # rewrite the cells in place (they keep their ids)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from course_utils.chapter import own_script  # noqa: E402
from course_utils.chapter.library_map import flat, show  # noqa: E402

# notebook: (kind, label, after, id of the cell the new cells follow, what the markdown says)
CELLS = {
    "00_where_memory_goes": ("ladder", "baseline (LoRA, fp32)", None, "00-11",
                             "The baseline you just measured, as your own training script writes it, with the lines "
                             "that read the GPU's peak memory around `trainer.train()`."),
    "01_gradient_checkpointing": ("ladder", "+ gradient checkpointing", "baseline (LoRA, fp32)", "01-07",
                                  "Checkpointing is two `SFTConfig` arguments. trl 1.16's `SFTConfig()` turns "
                                  "it **on** by default, so a recipe without it must say `activation_checkpointing=False`."),
    "02_gradient_accumulation": ("ladder", "+ accumulation (micro-batch 1)", "+ gradient checkpointing", "02-07",
                                 "Accumulation is `per_device_train_batch_size` and `gradient_accumulation_steps`."),
    "03_efficient_optimizers": ("ladder", "+ paged 8-bit AdamW", "+ accumulation (micro-batch 1)", "03-07",
                                "The optimizer is one string, `optim=`: `\"adamw_8bit\"` for 8-bit state, "
                                "`\"paged_adamw_8bit\"` for 8-bit state that can be paged out."),
    "04_mixed_precision": ("ladder", "+ mixed precision", "+ paged 8-bit AdamW", "04-09",
                           "Mixed precision is the weights' `dtype` and `bf16=True` (on a T4, which has no bf16: "
                           "`fp16=True`, with `dtype=torch.float16`)."),
    "05_qlora_4bit": ("ladder", "+ 4-bit QLoRA (NF4, double quant)", "+ mixed precision", "05-11",
                      "QLoRA is a `BitsAndBytesConfig` passed to `from_pretrained`, then "
                      "`prepare_model_for_kbit_training` (the fp32 upcast notebook 09 removes) before the "
                      "`LoraConfig`. On a T4: `bnb_4bit_compute_dtype=torch.float16` and `fp16=True`."),
    "06_sequence_length_and_batch": ("ladder", "+ shorter sequences", "+ 4-bit QLoRA (NF4, double quant)", "06-09",
                                     "The ladder's rung for this notebook: the sequence length is `max_length` (the "
                                     "source chapter's `max_seq_length` was renamed in trl), and the micro-batch "
                                     "`per_device_train_batch_size`."),
    "09_beyond_the_recipe": ("beyond", "+ no fp32 upcast", "source recipe (1x16)", "08-08",
                             "No fp32 upcast is a line *left out*: do not call `prepare_model_for_kbit_training`. "
                             "trl 1.16's `SFTTrainer(peft_config=lora_config)` never calls it either, so the usual "
                             "idiom has no upcast. (Embeddings on CPU are the course's own hooks, "
                             "`course_utils.build.offload_input_embeddings`; Liger is `SFTConfig(use_liger_kernel=True)`.)"),
    "11_more_than_one_gpu": ("multi", "per-GPU recipe", None, "09-18",
                             "The per-GPU recipe of the run above, Llama-3.1-8B in 4-bit; every process runs this "
                             "script, started by `accelerate launch`."),
}
ALWAYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "bf16", "fp16",
          "activation_checkpointing", "optim", "max_length", "packing", "packing_strategy")
HUB_ID = "meta-llama/Llama-3.1-8B"
INTRODUCES_NEXT = {"00_where_memory_goes"}  # the markdown after the measurement introduces the next cell


def args_text(call: str, exp: dict, changed: set, always=(), order=None, indent="    ") -> list[str]:
    """The argument lines of `call`: the ones that differ from the library's default, `always`, and the changed
    ones (each changed one on its own line with the marker)."""
    default = own_script.defaults()[call]
    names = [n for (c, n) in exp if c == call and n]
    if order:
        names = sorted(names, key=lambda n: order.index(n) if n in order else len(order))
    plain, marked = [], []
    for n in names:
        value = exp[(call, n)]
        if (call, n) in changed:
            marked.append(f"{indent}{n}={show(value)},  {own_script.NEW}")
        elif n in always or default.get(n, object()) != value:
            plain.append(f"{n}={show(value)}")
    lines, line = [], indent
    for part in plain:
        if len(line) + len(part) > 100:
            lines.append(line.rstrip())
            line = indent
        line += part + ", "
    if line.strip():
        lines.append(line.rstrip())
    return lines + marked


def render(kind: str, label: str, after: str | None) -> str:
    recipe = own_script.find(kind, label)
    o = own_script.objects(recipe)
    exp = own_script.expected(o)
    changed: set = set()
    if after is not None:
        before = own_script.expected(own_script.objects(own_script.find(kind, after)))
        changed = {k for k in exp if before.get(k, "absent") != exp[k]} | {k for k in before if k not in exp}
    new_calls = {c for (c, n) in changed if n == ""}
    four_bit = o.quantization_config is not None
    where = f'(after "{after}")' if after else ""
    out = [f"# In your own script: the libraries' lines that train this recipe ({HUB_ID} on a GPU)",
           f'# recipe: {kind} "{label}" {where}'.rstrip(),
           "import os" if kind == "multi" else None,
           "import torch",
           "from peft import LoraConfig, get_peft_model" + (", prepare_model_for_kbit_training"
                                                            if o.prepare_kbit_kwargs else ""),
           "from transformers import AutoModelForCausalLM, AutoTokenizer" + (", BitsAndBytesConfig" if four_bit else ""),
           "from trl import SFTConfig, SFTTrainer",
           "",
           "TRAIN_HERE = False  # True loads Llama-3.1-8B here and trains it (a GPU with room for it)"]
    if four_bit:
        mark = f"  {own_script.NEW}" if ("BitsAndBytesConfig", "") in changed else ""
        bnb_changed = changed if not mark else set()
        out += [f"bnb_config = BitsAndBytesConfig({mark}"]
        out += args_text("BitsAndBytesConfig", exp, bnb_changed, always=("bnb_4bit_compute_dtype",))
        out += [")  # on a T4 (no bf16): bnb_4bit_compute_dtype=torch.float16"]
    exp[("LoraConfig", "target_modules")] = list(recipe.lora_targets)  # in the recipe's order (peft keeps a set)
    out += ["lora_config = LoraConfig("]
    out += args_text("LoraConfig", exp, changed, always=("r", "lora_alpha", "lora_dropout", "target_modules"))
    out += [")", "args = SFTConfig(",
            '    output_dir="lora-out", report_to="none", use_cpu=not torch.cuda.is_available(),']
    out += args_text("SFTConfig", exp, changed, always=ALWAYS, order=ALWAYS)
    out += [")", "if TRAIN_HERE:"]
    device = '{"": int(os.environ.get("LOCAL_RANK", 0))}' if kind == "multi" else '{"": 0}'
    out += ["    model = AutoModelForCausalLM.from_pretrained(", f'        "{HUB_ID}", device_map={device},']
    out += args_text("from_pretrained", exp, changed, always=("dtype",), indent="        ")
    out += ["    )"]
    if o.prepare_kbit_kwargs:
        mark = f"  {own_script.NEW}" if "prepare_model_for_kbit_training" in new_calls else ""
        out += [f"    model = prepare_model_for_kbit_training(  {mark.strip()}".rstrip(), "        model,"]
        out += args_text("prepare_model_for_kbit_training", exp, changed if not mark else set(),
                         always=tuple(o.prepare_kbit_kwargs), indent="        ")
        out += ["    )"]
    elif four_bit:
        mark = f"  {own_script.NEW}" if ("prepare_model_for_kbit_training", "") in changed else ""
        out += [f"    # no prepare_model_for_kbit_training(model): no fp32 upcast{mark}"]
    world = ' * int(os.environ.get("WORLD_SIZE", 1))' if kind == "multi" else ""
    step = f"{recipe.micro_batch} * {recipe.grad_accum}{world}"
    out += ["    model = get_peft_model(model, lora_config)",
            f'    tokenizer = AutoTokenizer.from_pretrained("{HUB_ID}")',
            "    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token",
            "    from course_utils.data import load_instructions, to_text_dataset",
            '    dataset = to_text_dataset(load_instructions("dolly"))  # or your own: a "text" column',
            "    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)",
            '    full = trainer.train_dataset.filter(lambda row: len(row["input_ids"]) == args.max_length)  # whole blocks',
            f"    trainer.train_dataset = full.select(range(len(full) - len(full) % ({step})))  # whole steps",
            "    if torch.cuda.is_available():",
            "        torch.cuda.reset_peak_memory_stats()",
            "    trainer.train()",
            "    if torch.cuda.is_available():",
            '        print(f"max allocated {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, "',
            '              f"max reserved {torch.cuda.max_memory_reserved() / 2**30:.2f} GiB")']
    if kind == "multi":
        out += ["# run it as train.py on 2 GPUs: accelerate launch --config_file ddp.yaml --num_processes 2 train.py",
                "# (course_utils/accelerate_configs/); under FSDP also bnb_4bit_quant_storage=torch.bfloat16"]
    return "\n".join(line for line in out if line is not None)


def as_source(text: str) -> list[str]:
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + [lines[-1]]


def insert(stem: str) -> None:
    kind, label, after, follows, says = CELLS[stem]
    path = ROOT / "notebooks" / f"{stem}.ipynb"
    nb = json.loads(path.read_text())
    cells = nb["cells"]
    md_id, code_id = f"{stem[:2]}-own-script-md", f"{stem[:2]}-own-script"
    md = {"cell_type": "markdown", "id": md_id, "metadata": {},
          "source": as_source("### In your own script\n\n" + says + " Set `TRAIN_HERE = True` on a GPU to train it; "
                              "`tests/test_own_script.py` holds every argument equal to what the course's `build` "
                              "passes for this recipe (the README's field table).")}
    code = {"cell_type": "code", "execution_count": None, "id": code_id, "metadata": {}, "outputs": [],
            "source": as_source(render(kind, label, after))}
    ids = [c.get("id") for c in cells]
    if code_id in ids:
        cells[ids.index(md_id)]["source"] = md["source"]
        cells[ids.index(code_id)]["source"] = code["source"]
    else:
        at = ids.index(follows) + 1
        while (stem not in INTRODUCES_NEXT and at < len(cells) and cells[at]["cell_type"] == "markdown"
               and not "".join(cells[at]["source"]).startswith("#")):
            at += 1  # the measurement's own commentary stays with it
        cells[at:at] = [md, code]
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    for stem in sys.argv[1:] or CELLS:
        insert(stem)
        print("wrote", stem)
