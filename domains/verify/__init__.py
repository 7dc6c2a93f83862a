"""Verification infrastructure: the verifier pools (one contract, a local and a Ray implementation),
the backend factory and the code sandbox. Domains are verified through it; it knows nothing of any
one domain. Kept import-free so that importing one module here does not start the others (Ray in
particular is imported only when the Ray pool is)."""
