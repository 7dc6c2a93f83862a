"""What decided the async pipeline's thread (trainer/recipe/pipeline.py): the trainer's sampler
(96 rows x 64 new tokens) beside an update (96 rows x 100 tokens, fwd + bwd + AdamW), a model of the
main job's tiny shape, every side on one torch thread: each alone, one after the other (serial),
the sampler on a thread beside the update, and the sampler in a second (spawned) process that takes
the weights through shared memory (its ``load_state_dict`` counted). Medians of 3 rounds; the ideal
overlap is the longer side alone.

    .venv/bin/python bench/overlap.py
"""
import statistics
import threading
import time

import torch
import torch.multiprocessing as mp
from transformers import Qwen2Config, Qwen2ForCausalLM

from trainer.sampling.rollout import generate

CFG = dict(vocab_size=128, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
           intermediate_size=384, pad_token_id=0)
PROMPTS = [[5 + (i // 8) % 50] * 24 for i in range(96)]  # 12 groups of 8 rows
ROUNDS = 3


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**CFG))


def sample(m: torch.nn.Module) -> None:
    with torch.no_grad():
        generate(m, PROMPTS, max_new_tokens=64, eos_id=1, pad_id=0, temperature=1.0,
                 generator=torch.Generator().manual_seed(0))


def update(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    x = torch.randint(2, 128, (96, 100))
    for mb in range(0, 96, 32):
        m(input_ids=x[mb:mb + 32]).logits.log_softmax(-1).mean().backward()
    opt.step()
    opt.zero_grad()


def child(conn, state: dict) -> None:
    """The second process: on each request, take the shared weights and sample."""
    torch.set_num_threads(1)
    m = model().eval()
    while conn.recv():
        m.load_state_dict(state)
        sample(m)
        conn.send(True)


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    torch.set_num_threads(1)
    policy, sampler = model(), model().eval()
    opt = torch.optim.AdamW(policy.parameters(), 1e-4)
    shared = {k: v.clone().share_memory_() for k, v in policy.state_dict().items()}
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    process = ctx.Process(target=child, args=(theirs, shared))
    process.start()
    mine.send(True)
    mine.recv()  # the child has built its model and sampled once
    sample(sampler)
    update(policy, opt)

    def beside_thread() -> None:
        thread = threading.Thread(target=sample, args=(sampler,))
        thread.start()
        update(policy, opt)
        thread.join()

    def to_shared() -> None:
        with torch.no_grad():
            for k, v in policy.state_dict().items():
                shared[k].copy_(v)

    def beside_process() -> None:
        mine.send(True)
        update(policy, opt)
        mine.recv()

    res: dict[str, list[float]] = {k: [] for k in ("sample", "update", "serial", "thread", "process", "copy_shared")}
    for _ in range(ROUNDS):
        res["sample"].append(timed(lambda: sample(sampler)))
        res["update"].append(timed(lambda: update(policy, opt)))
        res["serial"].append(res["sample"][-1] + res["update"][-1])
        res["thread"].append(timed(beside_thread))
        res["copy_shared"].append(timed(to_shared))
        res["process"].append(timed(beside_process))
    mine.send(False)
    process.join()
    print({k: round(statistics.median(v), 3) for k, v in res.items()})


if __name__ == "__main__":
    main()
