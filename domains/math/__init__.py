"""Math domains: the procedural generators (``generated``), the final-answer verifier (``answer``),
column-by-column worked solutions (``work``) and the JSONL/Parquet math dataset (``dataset``)."""
