"""Code domains: the hidden-test verifier (``verifier``), the procedural generators
(``generated``) and the JSONL-backed dataset domain (``dataset``)."""
