"""Which verifier pool a run uses: the ``verifier`` config section and the factory behind it.

``local`` is ``domains.verify.pool.VerifierPool`` (worker processes on this machine); ``ray`` is
``domains.verify.ray_pool.RayVerifierPool`` (Ray actors on a local Ray or an existing cluster). Both
implement the one contract, ``domains.verify.pool.Pool`` — ``submit`` returns a Future of a Verdict,
a hung or crashing verifier becomes ``status=timeout`` or ``status=error`` — so the trainer never
knows which one it talks to. Dependencies run one way: this module imports the pools, never the
reverse (the Ray pool only here, only when it is asked for: Ray is an optional extra).
"""
from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import Field, model_validator

from domains.api import Domain
from domains.config import StrictModel
from domains.verify.pool import Pool, VerifierPool

RAY_INSTALL_HINT = "pip install 'palestra[ray]'"


class VerifierConfig(StrictModel):
    backend: Literal["local", "ray"] = "local"
    workers: int = Field(2, ge=1)  # worker processes (local) or Ray actors (ray)
    # An existing Ray cluster ("auto", "host:6379"); null starts a local Ray
    # for the run and stops it at the end. A cluster given here is left running.
    ray_address: str | None = None
    ray_num_cpus: int | None = Field(None, ge=1)  # CPUs of the local Ray; null: one per worker
    ray_cpus_per_worker: float = Field(1.0, ge=0)  # what each actor reserves on the cluster
    # Ray places actors when the cluster has room; a cluster that never does must not hang the run.
    ray_start_timeout_s: float = Field(120.0, gt=0)

    @model_validator(mode="after")
    def _coherent(self) -> "VerifierConfig":
        ray_options = ("ray_address", "ray_num_cpus")
        if self.backend == "local":
            stray = [key for key in ray_options if getattr(self, key) is not None]
            if stray:
                raise ValueError(f"verifier.{stray[0]} is set but verifier.backend is local (use backend: ray)")
            return self
        if importlib.util.find_spec("ray") is None:
            raise ValueError(f"verifier.backend=ray needs Ray, which is not installed: {RAY_INSTALL_HINT}")
        if self.ray_address is not None and self.ray_num_cpus is not None:
            raise ValueError("verifier.ray_num_cpus sizes a local Ray; it cannot apply to ray_address's cluster")
        return self


def make_pool(domains: dict[str, Domain], cfg: VerifierConfig) -> Pool:
    """Start the pool ``cfg`` asks for. Ray is imported only here, only when it is asked for."""
    if cfg.backend == "ray":
        from domains.verify.ray_pool import RayVerifierPool

        return RayVerifierPool(
            domains, workers=cfg.workers, address=cfg.ray_address, num_cpus=cfg.ray_num_cpus,
            cpus_per_worker=cfg.ray_cpus_per_worker, start_timeout_s=cfg.ray_start_timeout_s,
        )
    return VerifierPool(domains, workers=cfg.workers)
