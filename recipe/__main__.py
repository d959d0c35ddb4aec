"""`python -m recipe build` retrains everything (corpus to assets/models/); `python -m recipe evaluate` measures it."""

from __future__ import annotations

import argparse
from pathlib import Path

from recipe.config import MODELS


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m recipe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="generate the corpus, train both models, export to assets/models/")
    build.add_argument("--quick", action="store_true", help="a few-minute smoke build (low accuracy)")
    build.add_argument("--device", default="cpu", help="torch device for training (default: cpu)")
    build.add_argument("--no-export", action="store_true", help="stop after training (checkpoints in recipe/work/hf)")
    dflash = sub.add_parser("build-dflash", help="train the DFlash block drafter for mini-target, export, measure")
    dflash.add_argument("--quick", action="store_true", help="a few-minute smoke build (low acceptance)")
    dflash.add_argument("--resume", type=int, nargs="?", const=1, default=0, metavar="N",
                        help="stage N (default 1) after the first: continue from assets/models/mini-dflash "
                        "on new conversations (DFLASH_MORE)")
    dflash.add_argument("--no-export", action="store_true", help="write it to recipe/work/hf/mini-dflash instead")
    dflash_eval = sub.add_parser("evaluate-dflash", help="accepted length per block: mini-dflash against mini-draft")
    dflash_eval.add_argument("--models", type=Path, default=MODELS, help="folder holding mini-target, mini-draft, "
                             "mini-dflash (default: assets/models/)")
    dflash_eval.add_argument("--prompts", type=int, default=120, help="held-out prompts (default: 120)")
    finetune = sub.add_parser("finetune", help="teach a trained pair tools, in rounds (checkpoints in recipe/work/hf)")
    finetune.add_argument("--base", type=Path, required=True,
                          help="folder holding the pair to start from (mini-target/, mini-draft/)")
    finetune.add_argument("--device", default="cpu", help="torch device for training (default: cpu)")
    finetune.add_argument("--start", type=int, default=1,
                          help="resume at this round, --base holding the pair the earlier rounds made (default: 1)")
    finetune.add_argument("--original", type=Path, default=None,
                          help="the pair round 1 started from, blended back in at the end (default: --base)")
    export = sub.add_parser("export", help="convert recipe/work/hf checkpoints into assets/models/")
    export.add_argument("--to", type=Path, default=MODELS, help="destination folder (default: assets/models/)")
    evaluate = sub.add_parser("evaluate", help="accuracy, tool use, draft acceptance, sizes and speeds")
    evaluate.add_argument("--tasks", type=int, default=400, help="held-out tasks to check (each thinking on and off)")
    evaluate.add_argument("--models", type=Path, default=MODELS, help="folder of the three models (default: assets/models/)")
    args = parser.parse_args()
    if args.command == "build":
        from recipe.build import build as run_build
        from recipe.config import FULL, QUICK

        run_build(QUICK if args.quick else FULL, args.device, not args.no_export)
    elif args.command == "build-dflash":
        from recipe.build import build_dflash
        from recipe.config import DFLASH_FULL, DFLASH_MORE, DFLASH_QUICK

        plan = DFLASH_QUICK if args.quick else DFLASH_MORE if args.resume else DFLASH_FULL
        build_dflash(plan, not args.no_export, prompts=40 if args.quick else 120, resume=args.resume)
    elif args.command == "evaluate-dflash":
        import json

        from recipe.dflash import load
        from recipe.dflash_eval import measure

        models = args.models.resolve()
        print(json.dumps(measure(load(models / "mini-dflash"), models, args.prompts), indent=2))
    elif args.command == "finetune":
        from recipe.finetune import finetune as run_finetune

        run_finetune(args.base.resolve(), args.device, args.start,
                     args.original.resolve() if args.original else None)
    elif args.command == "export":
        from recipe.build import export_all

        export_all(args.to.resolve())
    else:
        from recipe.evaluate import main as run_evaluate

        run_evaluate(args.tasks, args.models.resolve())


if __name__ == "__main__":
    main()
