"""Where metrics go: a JSONL file, TensorBoard, and the console (progress bar + per-domain table)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from curriculum.tables import cell_text


class MetricsLogger:
    def __init__(self, output_dir: Path, total_steps: int, table_every: int, enabled_bar: bool = True) -> None:
        output_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(output_dir / "metrics.jsonl", "a", encoding="utf-8")
        self.tensorboard = SummaryWriter(str(output_dir / "tensorboard"))
        self.table_every = table_every
        self.bar = tqdm(total=total_steps, desc="grpo", dynamic_ncols=True, disable=not enabled_bar)

    def log(self, step: int, metrics: dict[str, Any], phase: str = "train") -> None:
        record = {"phase": phase, "step": step, **metrics}
        self.jsonl.write(json.dumps(record, default=_plain) + "\n")
        self.jsonl.flush()
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.tensorboard.add_scalar(f"{phase}/{key}", value, step)

    def advance(self, step: int, metrics: dict[str, Any]) -> None:
        self.bar.update(1)
        self.bar.set_postfix(reward=f"{metrics.get('reward/mean', 0):.3f}", kl=f"{metrics.get('kl', 0):.4f}")
        if step % self.table_every == 0:
            self.write(domain_table(metrics))

    def write(self, text: str) -> None:
        self.bar.write(text)

    def close(self) -> None:
        self.bar.close()
        self.tensorboard.close()
        self.jsonl.close()


def domain_table(metrics: dict[str, Any]) -> str:
    """Rows of per-domain metrics found under keys like ``domain/<name>/<metric>``."""
    rows: dict[str, dict[str, Any]] = {}
    for key, value in metrics.items():
        if key.startswith("domain/"):
            _, name, metric = key.split("/", 2)
            rows.setdefault(name, {})[metric] = value
    columns = ["weight", "level", "prompts", "reward", "zero_var", "errors", "tool_calls"]
    width = max([len("domain"), *map(len, rows)]) + 2  # reasoning-gym names run long
    header = f"{'domain':<{width}}" + "".join(f" {c:>10}" for c in columns)
    lines = [f"step {metrics.get('step', '?')}", header]
    for name in sorted(rows):
        cells = "".join(f" {cell_text(rows[name].get(c)):>10}" for c in columns)
        lines.append(f"{name:<{width}}{cells}")
    return "\n".join(lines)



def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
