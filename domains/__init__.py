"""Domain plugins: the task families Palestra trains on and their verifiers."""
from domains.api import FAILURE_STATUSES, Canary, Domain, DomainConfig, Status, Task, TaskListDomain, VerifyResult, stable_hash, user_prompt
from domains.registry import DomainError, available, load, load_all

__all__ = [
    "FAILURE_STATUSES", "Canary", "Domain", "DomainConfig", "DomainError", "Status", "Task", "TaskListDomain", "VerifyResult",
    "available", "load", "load_all", "stable_hash", "user_prompt",
]
