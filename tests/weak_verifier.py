"""A deliberately weakened verifier, for the canary tests: arithmetic whose grader also pays for
the gold answer written anywhere in the completion, box or no box (the kind of fallback extraction
that a policy learns to game by scattering numbers). Importable by spawned verifier workers."""
from domains.api import Domain, Status, Task, VerifyResult, user_prompt
from domains.math.generated import Arithmetic


class WeakArithmetic(Arithmetic):
    name = "weak_arithmetic"
    levels = (1, 2)

    def verify(self, task: Task, completion: str) -> VerifyResult:
        if str(task.payload["answer"]) in completion:
            return VerifyResult(1.0, True, Status.OK, {"weak": "the gold answer appears somewhere"})
        return super().verify(task, completion)


WEAK_ARITHMETIC = WeakArithmetic()


class PlainDigits(Arithmetic):
    """A plugin that names no canaries."""

    name = "plain_digits"

    def canaries(self):
        return {}


NO_CANARIES = PlainDigits()


class DigitShare(Domain):
    """Rewards the share of distinct digits in a completion: an untrained model earns some."""

    name = "digit_share"
    levels = (1,)

    def sample(self, level, n, rng):
        return [Task(self.name, level, user_prompt(f"digits{rng.randint(0, 10**6)}"), {}) for _ in range(n)]

    def verify(self, task, completion):
        share = len(set(completion) & set("0123456789")) / 10
        return VerifyResult(share, share == 1.0, Status.OK if share == 1.0 else Status.WRONG)

    def reference(self, task):
        return "0123456789"


DIGIT_SHARE = DigitShare()


class BrokenCanary(Arithmetic):
    """A plugin whose canary raises: reported, never verified."""

    name = "broken_canary"
    levels = (1,)

    def canaries(self):
        return {"boom": lambda task: str(1 / 0)}


BROKEN_CANARY = BrokenCanary()
