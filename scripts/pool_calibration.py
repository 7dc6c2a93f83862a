"""How hard each domain is for a model before training: the measurement behind a many-domain pool
of mixed difficulty (some domains at zero, some nearly solved).

    python scripts/pool_calibration.py --out docs/results/smollm2-rg-calibration.json \
        [--tasks 8] [--temperature 0.7] [--samples 1] [--only rg_*] [OVERRIDE ...]

The OVERRIDEs are ``palestra-train``'s (default: ``+experiment=smollm2 domains=[rg_*]
++domain_options={rg_*:{max_level:1}}``). It draws ``--tasks`` tasks a level with the held-out
evaluation's own draw (a seed apart from every run's held-out set) and decodes them as the run's
evaluation does, then prints one line a domain (success, seconds) and writes them all as JSON, so that the next run of the script can skip what it has
(``--out`` is read first and extended). Domains whose tasks cannot be drawn or decoded are written
with the error (for the batch of domains it came in) and skipped.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

DEFAULT = ["+experiment=smollm2", "domains=[rg_*]", "++domain_options={rg_*:{max_level:1}}"]
CONF = Path(__file__).resolve().parents[1] / "conf"
CALIBRATION_SEED = 4242  # not eval.seed: the run's own held-out tasks stay unseen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", default=DEFAULT)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tasks", type=int, default=8, help="tasks a level")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--domains-a-batch", type=int, default=2)
    args = parser.parse_args()

    from domains.registry import load_all
    from domains.verify.backend import make_pool
    from trainer.app import to_config
    from trainer.models.loading import load_policy, model_path
    from trainer.recipe.evaluate import evaluate, heldout_tasks

    with initialize_config_dir(str(CONF), version_base=None):
        # output_dir is Hydra's run folder in a launch; nothing is written there here
        cfg = to_config(compose("config", [*args.overrides, "output_dir=/tmp/palestra-calibration"]))
    torch.set_num_threads(args.threads)
    domains = load_all(cfg.domains, cfg.domain_options, shared=cfg.model.domain_options())
    done = json.loads(args.out.read_text()) if args.out.exists() else {}
    todo = [name for name in sorted(domains) if name not in done]
    print(f"{len(domains)} domains, {len(done)} measured already, {len(todo)} to go", flush=True)
    tokenizer, model = load_policy(model_path(cfg.model, Path(cfg.output_dir), cfg.seed), cfg.model,
                                   torch.device("cpu"))
    pool = make_pool(domains, cfg.verifier)
    sampling = cfg.trainer.sampling
    try:
        # a few domains a batch: a decode step costs about as much for 16 rows as for 4 on a CPU
        for first in range(0, len(todo), args.domains_a_batch):
            names = todo[first:first + args.domains_a_batch]
            start = time.perf_counter()
            try:
                tasks = heldout_tasks({name: domains[name] for name in names}, args.tasks, CALIBRATION_SEED)
                hits = evaluate(model, tokenizer, tasks, pool, max_new_tokens=sampling.max_new_tokens,
                                max_episode_tokens=sampling.max_episode_tokens, temperature=args.temperature,
                                batch_size=sampling.rollout_batch_size, seed=CALIBRATION_SEED, samples=args.samples)
                entries = {name: measured(name, hits) for name in names}
            except Exception as exc:  # a dataset's generator or scorer: note it, go on with the rest
                entries = {name: {"error": f"{type(exc).__name__}: {str(exc)[:200]}"} for name in names}
            seconds = round(time.perf_counter() - start, 1)
            for name, entry in entries.items():
                done[name] = {**entry, "seconds": seconds}
                shown = f"{entry['success']:.3f}" if "success" in entry else entry["error"]
                print(f"{name:<36} {shown}  ({seconds} s for {len(names)})", flush=True)
            args.out.write_text(json.dumps(done, indent=1, sort_keys=True) + "\n")
    finally:
        pool.close()


def measured(name: str, hits: dict) -> dict:
    """One domain's success over its tasks, and by level."""
    cells = {level: values for (domain, level), values in sorted(hits.items()) if domain == name}
    values = [v for cell in cells.values() for v in cell]
    return {"success": sum(values) / len(values), "tasks": len(values),
            "by_level": {str(level): sum(v) / len(v) for level, v in cells.items()}}


if __name__ == "__main__":
    main()
