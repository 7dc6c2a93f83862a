"""TRL's GRPOTrainer with Palestra's curriculum: three math domains, adaptive mixing and difficulty,
per-domain statistics in a SQLite store — on the CPU with the built-in tiny model (built locally,
nothing is downloaded).

    .venv/bin/pip install -e '.[bench]'          # TRL and datasets
    .venv/bin/python examples/trl_grpo.py [--steps 8] [--out outputs/trl-example]

The tiny model starts from random weights, so it solves almost nothing in a few steps: this shows
the wiring (plans in, per-domain results out), not learning.
"""
from __future__ import annotations

import argparse
from pathlib import Path

DOMAINS = ["arithmetic", "linear_equations", "fractions"]
PROMPTS, GROUP = 8, 4  # prompts per plan step (= one TRL generation batch), completions per prompt


def main() -> None:
    # Imported here, not at the top: the verifier pool's spawned workers re-import this script, and
    # they need none of this.
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from curriculum.store import default_store_url
    from trainer.integrations.trl import TRLCurriculum
    from trainer.models.loading import load_tokenizer
    from trainer.models.tiny_model import build_tiny_model

    opts = _options()
    out = Path(opts.out).resolve()
    model_dir = str(build_tiny_model(out / "tiny-model", seed=opts.seed))
    args = GRPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
        max_completion_length=16, beta=0.0, learning_rate=1e-4, max_steps=opts.steps, logging_steps=1,
        seed=opts.seed,
        shuffle_dataset=False,  # the curriculum decides what comes next; TRL must not reorder it
        use_cpu=True, bf16=False, report_to="none", save_strategy="no", disable_tqdm=True,
    )
    url = default_store_url(out)
    with TRLCurriculum.build(DOMAINS, args, policy={"type": "learnability"}, difficulty={"type": "threshold"},
                             store_url=url, verifier_workers=opts.workers) as curriculum:
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir), args=args,
            reward_funcs=curriculum.palestra_reward, train_dataset=curriculum.dataset(),
            processing_class=load_tokenizer(model_dir, tiny=True), callbacks=[curriculum.callback()],
        )
        trainer.train()
        _print_summary(curriculum)
    print(f"\nstore: {url}\nrun:   {curriculum.run_id}")
    print(f"per-domain statistics:  .venv/bin/palestra stats --db {url} --run {curriculum.run_id[:8]}")


def _print_summary(curriculum) -> None:
    print(f"\n{'domain':<18}{'attempts':>9}{'success':>9}{'weight':>8}{'level':>7}")
    for row in curriculum.store.domain_summary(curriculum.run_id):
        rate = "-" if row["success_rate"] is None else f"{row['success_rate']:.2f}"
        weight = "-" if row["weight"] is None else f"{row['weight']:.2f}"
        print(f"{row['domain']:<18}{row['attempts']:>9}{rate:>9}{weight:>8}{row['level'] or '-':>7}")


def _options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--steps", type=int, default=8, help="TRL optimizer steps (one plan step each)")
    parser.add_argument("--out", default="outputs/trl-example", help="folder for the model, TRL's output and the store")
    parser.add_argument("--workers", type=int, default=2, help="verifier worker processes")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


if __name__ == "__main__":
    main()
