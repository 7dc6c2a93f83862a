"""A deliberately nondeterministic domain for the replay test: its verdict is a coin flip.

Its own module so spawned verifier workers can import it (the test puts this folder on sys.path)."""
import os

from domains.api import Domain, Status, Task, VerifyResult, user_prompt


class CoinFlip(Domain):
    name = "coin_flip"
    levels = (1,)

    def sample(self, level, n, rng):
        return [Task(self.name, level, user_prompt(f"flip {rng.randint(0, 10**9)}"), {}) for _ in range(n)]

    def verify(self, task, completion):
        heads = os.urandom(1)[0] % 2 == 0  # fresh entropy on every call: never the same twice in a row
        return VerifyResult(float(heads), heads, Status.OK if heads else Status.WRONG)

    def reference(self, task):
        return "heads"


COIN = CoinFlip()
