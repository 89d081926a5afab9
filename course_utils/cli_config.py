"""`course estimate --config sft.yaml`: the estimate of a `trl sft --config` file (course_utils/from_library.py reads
it into a Recipe; the estimator needs only the model's config, so a preset's hub id estimates offline)."""

from __future__ import annotations

import argparse
import sys
from course_utils.checks import check_positions
from course_utils.cli_recipe import recipe_from_flags
from course_utils.estimate.distributed import estimate_distributed
from course_utils.estimate.peak import estimate
from course_utils.from_library import LibraryConfigError, read_trl_config
from course_utils.models import load_config

def config_estimate(args: argparse.Namespace) -> str:
    """What `course estimate --config FILE` prints: the recipe read from FILE (with the recipe flags given applied
    on top), then its estimate term by term. The settings the course reads but does not model are warned about
    on stderr, one line; the ones it refuses are an error (LibraryConfigError) naming each."""

    if args.model is not None or args.source:
        raise LibraryConfigError("--config gives the model and the recipe: drop --model and --source")
    read = read_trl_config(args.config)
    for text in read.warnings:
        print(f"course: warning: {args.config}: {text}", file=sys.stderr)
    recipe = recipe_from_flags(read.recipe, args, "estimate", label=read.recipe.label)
    check_positions(recipe.model, recipe.max_seq_length, load_config(recipe.model).max_position_embeddings)
    head = f"{args.config} (trl sft --config), as the course reads it: {recipe.describe()}"
    if args.gpus > 1:

        return head + "\n" + estimate_distributed(recipe, args.gpus, args.strategy or "ddp",
                                                  hardware=args.hardware).explain()
    return head + "\n" + estimate(recipe, hardware=args.hardware, padded=read.padded).explain()
