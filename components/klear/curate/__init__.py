"""Stage 1, curate: exact dedup and word n-gram decontamination of prompt sources against test sets."""
